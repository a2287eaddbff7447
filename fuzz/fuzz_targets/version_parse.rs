//! Juju version and binary strings come from operators, catalogues and the wire: the parsers
//! must never panic, and whatever they accept must print back to something that parses to
//! the same value and orders consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_core::{Binary, Version};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(version) = Version::parse(text) {
        let printed = version.to_string();
        let again = Version::parse(&printed).expect("a printed version parses");
        assert_eq!(again, version);
        assert_eq!(again.cmp(&version), std::cmp::Ordering::Equal);
        assert!(version.without_tag_and_build() >= Version::new(version.major, version.minor, 0));
    }
    if let Ok(binary) = Binary::parse(text) {
        let printed = binary.to_string();
        assert_eq!(
            Binary::parse(&printed).expect("a printed binary parses"),
            binary
        );
        assert!(!binary.release.contains(['/', '\\']) && !binary.arch.contains(['/', '\\']));
    }
    let _ = Version::parse(text).map_err(|error| error.to_string());
});
