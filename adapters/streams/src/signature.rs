//! OpenPGP clear-signed metadata (`.sjson`), as Juju publishes it: the JSON document inside
//! a `-----BEGIN PGP SIGNED MESSAGE-----` block, verified with rPGP (`pgp`, pure Rust)
//! against the keys the operator configured.
//!
//! Which file is read: for a metadata path `x.json`, when keys are configured, `x.sjson`
//! is read and must verify; `x.json` is read only when `allow_unsigned` is set and
//! `x.sjson` does not exist. A path that already ends in `.sjson` (a signed index names
//! signed products files) must verify whenever keys are configured. With no key
//! configured, only `allow_unsigned` lets metadata in at all.

use std::fmt;

use pgp::composed::{
    ArmorOptions, CleartextSignedMessage, Deserializable, KeyType, SecretKeyParamsBuilder,
    SignedPublicKey, SignedSecretKey,
};
use pgp::types::{KeyDetails, Password};

/// The largest key or keyring file read (`--metadata-key`, `--sign-key`): a keyring of a
/// few dozen keys is a few hundred KiB.
pub const KEY_FILE_BYTES_MAX: u64 = 1 << 20;

use crate::error::{MetadataError, quote};

/// The suffix of unsigned simplestreams documents.
pub const UNSIGNED_SUFFIX: &str = ".json";
/// The suffix of clear-signed simplestreams documents.
pub const SIGNED_SUFFIX: &str = ".sjson";

/// The signed sibling of an unsigned document path: `streams/v1/index2.json` →
/// `streams/v1/index2.sjson`; `None` when `path` does not end in `.json`.
pub fn signed_path(path: &str) -> Option<String> {
    path.strip_suffix(UNSIGNED_SUFFIX)
        .map(|stem| format!("{stem}{SIGNED_SUFFIX}"))
}

/// A problem with a key or a signing operation (not with metadata).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KeyError(pub String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

/// The OpenPGP public keys trusted to sign metadata.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Vec<SignedPublicKey>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|key| key.fingerprint().to_string()))
            .finish()
    }
}

impl PartialEq for Keyring {
    fn eq(&self, other: &Keyring) -> bool {
        self.fingerprints() == other.fingerprints()
    }
}

impl Eq for Keyring {}

impl Keyring {
    /// No key: signed metadata cannot be verified.
    pub const fn empty() -> Keyring {
        Keyring { keys: Vec::new() }
    }

    /// Adds an ASCII-armored public key (`-----BEGIN PGP PUBLIC KEY BLOCK-----`), after
    /// checking its self-signatures.
    pub fn add_armored(&mut self, armored: &str) -> Result<(), KeyError> {
        let (key, _headers) = SignedPublicKey::from_string(armored)
            .map_err(|error| KeyError(format!("not an armored OpenPGP public key: {error}")))?;
        self.add(key)
    }

    /// Reads OpenPGP public keys as `gpg --export` writes them: one key or a keyring,
    /// ASCII-armored (`-----BEGIN PGP PUBLIC KEY BLOCK-----`) or binary. Every key's
    /// self-signatures must verify. A secret key is refused (give its public key), as is
    /// input holding no key at all.
    pub fn from_bytes(bytes: &[u8]) -> Result<Keyring, KeyError> {
        let mut keyring = Keyring::empty();
        let parsed = SignedPublicKey::from_reader_many(bytes)
            .map(|(keys, _headers)| keys.collect::<Result<Vec<SignedPublicKey>, _>>());
        match parsed {
            Ok(Ok(keys)) if !keys.is_empty() => {
                for key in keys {
                    keyring.add(key)?;
                }
                Ok(keyring)
            }
            parsed => {
                if SigningKey::from_bytes(bytes).is_ok() {
                    return Err(KeyError(
                        "this is an OpenPGP secret key: give its public key instead (`lockstep \
                         metadata generate-key` writes both; `gpg --export --armor <id>` \
                         exports one)"
                            .to_owned(),
                    ));
                }
                let problem = match parsed {
                    Ok(Ok(_)) => "no key in it".to_owned(),
                    Ok(Err(error)) | Err(error) => error.to_string(),
                };
                Err(KeyError(format!(
                    "not an OpenPGP public key or keyring (armored or binary): {problem}"
                )))
            }
        }
    }

    /// Adds `key` after checking its self-signatures.
    fn add(&mut self, key: SignedPublicKey) -> Result<(), KeyError> {
        key.verify().map_err(|error| {
            KeyError(format!(
                "public key {} has invalid self-signatures: {error}",
                key.fingerprint()
            ))
        })?;
        self.keys.push(key);
        Ok(())
    }

    /// Every key, ASCII-armored in one `PGP PUBLIC KEY BLOCK` (a keyring
    /// [`Keyring::from_bytes`] reads back).
    pub fn to_armored(&self) -> Result<String, KeyError> {
        let mut armored = Vec::new();
        pgp::armor::write(
            &self.keys,
            pgp::armor::BlockType::PublicKey,
            &mut armored,
            None,
            true,
        )
        .map_err(|error| KeyError(format!("cannot armor the keyring: {error}")))?;
        String::from_utf8(armored)
            .map_err(|error| KeyError(format!("cannot armor the keyring: {error}")))
    }

    /// True when no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The fingerprints of the keys, in hex.
    pub fn fingerprints(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|key| key.fingerprint().to_string())
            .collect()
    }

    /// Verifies the clear-signed document `bytes` (read from `file`) against every key and
    /// signing subkey; returns the signed text (the JSON, with CRLF line ends as signed).
    pub fn verify(&self, file: &str, bytes: &[u8]) -> Result<Vec<u8>, MetadataError> {
        let refused = |value: String, problem: String| MetadataError {
            file: file.to_owned(),
            field: "(signature)".to_owned(),
            value,
            problem,
        };
        let text = std::str::from_utf8(bytes).map_err(|error| {
            refused(
                "(not UTF-8)".to_owned(),
                format!("a clear-signed document is text: {error}"),
            )
        })?;
        let (message, _headers) = CleartextSignedMessage::from_string(text).map_err(|error| {
            refused(
                quote(text.lines().next().unwrap_or("")),
                format!(
                    "not an OpenPGP clear-signed message ({}); regenerate the mirror's \
                     metadata with --sign-key",
                    // The parser's error quotes its whole input: cut it (found by fuzzing).
                    quote(&error.to_string())
                ),
            )
        })?;
        let verified = self.keys.iter().any(|key| {
            message.verify(key).is_ok()
                || key
                    .public_subkeys
                    .iter()
                    .any(|subkey| message.verify(subkey).is_ok())
        });
        if !verified {
            return Err(refused(
                format!("{} signature(s)", message.signatures().len()),
                format!(
                    "no signature verifies against the configured keys {:?}: the metadata \
                     was altered or signed by another key; refused, nothing was accepted",
                    self.fingerprints()
                ),
            ));
        }
        Ok(message.signed_text().into_bytes())
    }
}

/// An OpenPGP secret key that signs generated metadata (`--sign-key <file>`), without a
/// passphrase.
#[derive(Clone)]
pub struct SigningKey {
    key: SignedSecretKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("fingerprint", &self.key.fingerprint().to_string())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Reads an ASCII-armored secret key (`-----BEGIN PGP PRIVATE KEY BLOCK-----`).
    pub fn from_armored(armored: &str) -> Result<SigningKey, KeyError> {
        let (key, _headers) = SignedSecretKey::from_string(armored)
            .map_err(|error| KeyError(format!("not an armored OpenPGP secret key: {error}")))?;
        SigningKey::checked(key)
    }

    /// Reads a secret key, ASCII-armored or binary (`gpg --export-secret-keys`). Signing
    /// needs no passphrase: a key protected by one signs nothing (the error says so).
    pub fn from_bytes(bytes: &[u8]) -> Result<SigningKey, KeyError> {
        let (key, _headers) = SignedSecretKey::from_reader_single(bytes).map_err(|error| {
            KeyError(format!(
                "not an OpenPGP secret key (armored or binary): {error}"
            ))
        })?;
        SigningKey::checked(key)
    }

    /// Checks the self-signatures, and that the key signs without a passphrase (one
    /// signature of an empty text), so a protected key is refused when read, not halfway
    /// through signing a mirror.
    fn checked(key: SignedSecretKey) -> Result<SigningKey, KeyError> {
        key.verify().map_err(|error| {
            KeyError(format!("secret key has invalid self-signatures: {error}"))
        })?;
        let key = SigningKey { key };
        key.clear_sign("").map_err(|error| {
            KeyError(format!(
                "secret key {} cannot sign without a passphrase ({error}): lockstep signs \
                 with passphrase-less keys (`lockstep metadata generate-key` makes one)",
                key.fingerprint()
            ))
        })?;
        Ok(key)
    }

    /// The key's fingerprint, in hex.
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint().to_string()
    }

    /// Generates a new Ed25519 signing key for `user_id` (`"Mirror <ops@example.com>"`).
    pub fn generate(user_id: &str) -> Result<SigningKey, KeyError> {
        let failed = |error: &dyn fmt::Display| KeyError(format!("cannot generate a key: {error}"));
        let params = SecretKeyParamsBuilder::default()
            .key_type(KeyType::Ed25519Legacy)
            .can_certify(true)
            .can_sign(true)
            .primary_user_id(user_id.to_owned())
            .build()
            .map_err(|error| failed(&error))?;
        let key = params
            .generate(rand_core::OsRng)
            .map_err(|error| failed(&error))?
            .sign(rand_core::OsRng, &Password::empty())
            .map_err(|error| failed(&error))?;
        Ok(SigningKey { key })
    }

    /// The secret key, ASCII-armored.
    pub fn to_armored(&self) -> Result<String, KeyError> {
        self.key
            .to_armored_string(ArmorOptions::default())
            .map_err(|error| KeyError(format!("cannot armor the secret key: {error}")))
    }

    /// The public key to configure on agents, ASCII-armored.
    pub fn public_key_armored(&self) -> Result<String, KeyError> {
        self.key
            .signed_public_key()
            .to_armored_string(ArmorOptions::default())
            .map_err(|error| KeyError(format!("cannot armor the public key: {error}")))
    }

    /// Clear-signs `text`.
    pub fn clear_sign(&self, text: &str) -> Result<String, KeyError> {
        CleartextSignedMessage::sign(
            rand_core::OsRng,
            text,
            &self.key.primary_key,
            &Password::empty(),
        )
        .and_then(|message| message.to_armored_string(ArmorOptions::default()))
        .map_err(|error| KeyError(format!("cannot sign: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_paths() {
        assert_eq!(
            signed_path("streams/v1/index2.json").as_deref(),
            Some("streams/v1/index2.sjson")
        );
        assert_eq!(signed_path("streams/v1/index2.sjson"), None);
    }

    #[test]
    fn sign_then_verify_and_refuse_changes() {
        let key = SigningKey::generate("test <test@example.invalid>").unwrap();
        let mut keyring = Keyring::empty();
        keyring
            .add_armored(&key.public_key_armored().unwrap())
            .unwrap();
        let signed = key.clear_sign("{\"a\": 1}\n").unwrap();
        let text = keyring.verify("x.sjson", signed.as_bytes()).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(value["a"], 1);
        let altered = signed.replace("\"a\": 1", "\"a\": 2");
        assert_ne!(altered, signed);
        let error = keyring.verify("x.sjson", altered.as_bytes()).unwrap_err();
        assert_eq!(error.field, "(signature)");
        // A round trip through armor keeps the key.
        let again = SigningKey::from_armored(&key.to_armored().unwrap()).unwrap();
        let signed = again.clear_sign("{}").unwrap();
        keyring.verify("y.sjson", signed.as_bytes()).unwrap();
    }

    #[test]
    fn keyrings_read_armored_binary_and_several_keys_and_refuse_secret_keys() {
        use pgp::ser::Serialize;

        let first = SigningKey::generate("first <first@example.invalid>").unwrap();
        let second = SigningKey::generate("second <second@example.invalid>").unwrap();
        let armored = first.public_key_armored().unwrap();
        let keyring = Keyring::from_bytes(armored.as_bytes()).unwrap();
        assert_eq!(keyring.fingerprints(), vec![first.fingerprint()]);

        // Binary, as `gpg --export` writes it, two keys in one file.
        let mut binary = first.key.signed_public_key().to_bytes().unwrap();
        binary.extend(second.key.signed_public_key().to_bytes().unwrap());
        let both = Keyring::from_bytes(&binary).unwrap();
        assert_eq!(
            both.fingerprints(),
            vec![first.fingerprint(), second.fingerprint()]
        );
        // Armored back and read again: the same keys, and each verifies its signatures.
        let again = Keyring::from_bytes(both.to_armored().unwrap().as_bytes()).unwrap();
        assert_eq!(again, both);
        let signed = second.clear_sign("{}").unwrap();
        again.verify("x.sjson", signed.as_bytes()).unwrap();

        // A secret key is named as one; anything else is not a key.
        let secret = first.to_armored().unwrap();
        let error = Keyring::from_bytes(secret.as_bytes()).unwrap_err();
        assert!(error.0.contains("secret key"), "{error}");
        for garbage in [&b"hello"[..], &b"\x99\x00"[..], b""] {
            let error = Keyring::from_bytes(garbage).unwrap_err();
            assert!(error.0.contains("not an OpenPGP public key"), "{error}");
        }
        // The secret key reads back binary too.
        let binary_secret = first.key.to_bytes().unwrap();
        assert_eq!(
            SigningKey::from_bytes(&binary_secret)
                .unwrap()
                .fingerprint(),
            first.fingerprint()
        );
    }
}
