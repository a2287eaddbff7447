//! Clear-signed metadata (`.sjson`) comes from a mirror, untrusted, and is the first thing
//! read from it: parsing and verifying any bytes against the operator's keyring must never
//! panic, a refusal must quote the input briefly, and a document that verifies must verify
//! the same way again (the verdict depends on the bytes only).
//!
//! The keyring holds `keys/fuzz-public.asc`, whose secret half signed the seeds in
//! `corpus/signature_verify/` (gpg, ed25519), so mutations of genuinely signed documents
//! reach the signature check, not only the armour parser.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lockstep_streams::Keyring;

fn keyring() -> &'static Keyring {
    static KEYRING: OnceLock<Keyring> = OnceLock::new();
    KEYRING.get_or_init(|| {
        let mut keyring = Keyring::empty();
        keyring
            .add_armored(include_str!("../keys/fuzz-public.asc"))
            .expect("the fuzz key parses");
        keyring
    })
}

fuzz_target!(|data: &[u8]| {
    match keyring().verify("streams/v1/index.sjson", data) {
        Ok(text) => {
            let again = keyring()
                .verify("streams/v1/index.sjson", data)
                .expect("what verified once verifies again");
            assert_eq!(again, text);
        }
        Err(error) => {
            // Quotes are cut at 100 characters, plus the length note.
            assert!(error.value.chars().count() <= 140, "{error}");
            let _ = error.to_string();
        }
    }
});
