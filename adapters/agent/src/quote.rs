//! Offending values quoted in messages: Rust string syntax, cut to a bounded length, so that
//! a hostile or huge value cannot flood a log line or a terminal. And values quoted as one
//! word of a POSIX shell command ([`shell_word`]), for the scripts lockstep writes.

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

/// `text` as one word of a POSIX `sh` command, whatever it holds: in single quotes, each
/// `'` written `'\''`. Nothing in it is expanded. (A NUL byte cannot be passed to a command
/// at all: callers refuse it first.)
pub fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_taken_literally_by_sh() {
        for text in [
            "plain",
            "",
            "it's",
            "$(rm -rf /) `x` $HOME \\ \" *",
            "a\nb",
            "''",
        ] {
            let output = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(text)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(output.stdout).unwrap(), text, "{text:?}");
        }
    }

    #[test]
    fn quotes_are_cut() {
        assert_eq!(quote("a"), "\"a\"");
        assert!(quote(&"x".repeat(500)).ends_with("... (500 characters)"));
    }
}
