//! Offending values quoted in messages: Rust string syntax, cut to a bounded length, so that
//! a hostile or huge value cannot flood a log line or a terminal.

/// The most characters of an offending value quoted in a message.
pub const QUOTE_LENGTH_MAX: usize = 100;

/// Quotes `text` for a message: Rust string syntax, cut to [`QUOTE_LENGTH_MAX`] characters.
pub fn quote(text: &str) -> String {
    let length = text.chars().count();
    if length <= QUOTE_LENGTH_MAX {
        format!("{text:?}")
    } else {
        let cut: String = text.chars().take(QUOTE_LENGTH_MAX).collect();
        format!("{cut:?}... ({length} characters)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_cut() {
        assert_eq!(quote("a"), "\"a\"");
        assert!(quote(&"x".repeat(500)).ends_with("... (500 characters)"));
    }
}
