//! `metadata-keys.asc`: the OpenPGP public keys the operator named at bootstrap
//! (`--metadata-key`), which must sign the metadata of the model's `agent-metadata-url`.
//! Written once by bootstrap (and copied by `enable-ha`), read by the worker at each start
//! and checked against the fingerprints `agent.conf` pins. Never taken from the shared
//! store or the API: whoever can change `agent-metadata-url` cannot change these keys.

use std::path::{Path, PathBuf};

use lockstep_streams::Keyring;
use rustls::pki_types::CertificateDer;

use super::error::DataDirError;
use super::files::read_capped;
use super::layout::DataDir;
use super::names::{
    METADATA_CA, METADATA_CA_BYTES_MAX, METADATA_CA_MODE, METADATA_KEYS, METADATA_KEYS_BYTES_MAX,
    METADATA_KEYS_MODE,
};

impl DataDir {
    /// `<root>/metadata-keys.asc`
    pub fn metadata_keys_path(&self) -> PathBuf {
        self.root().join(METADATA_KEYS)
    }

    /// Replaces `metadata-keys.asc` with `keyring`, ASCII-armored, atomically, mode
    /// [`METADATA_KEYS_MODE`]; returns its path.
    pub fn write_metadata_keys(&self, keyring: &Keyring) -> Result<PathBuf, DataDirError> {
        let path = self.metadata_keys_path();
        let armored = keyring
            .to_armored()
            .map_err(|error| DataDirError::Malformed {
                path: path.clone(),
                detail: format!("refusing to write: {error}"),
            })?;
        lockstep_fs::write_file_atomically(&path, armored.as_bytes(), METADATA_KEYS_MODE)
            .map_err(DataDirError::Write)?;
        Ok(path)
    }
}

impl DataDir {
    /// `<root>/metadata-ca.pem`
    pub fn metadata_ca_path(&self) -> PathBuf {
        self.root().join(METADATA_CA)
    }

    /// Replaces `metadata-ca.pem` with `pem` (checked by [`read_metadata_ca`] first),
    /// atomically, mode [`METADATA_CA_MODE`]; returns its path.
    pub fn write_metadata_ca(&self, pem: &[u8]) -> Result<PathBuf, DataDirError> {
        let path = self.metadata_ca_path();
        lockstep_fs::write_file_atomically(&path, pem, METADATA_CA_MODE)
            .map_err(DataDirError::Write)?;
        Ok(path)
    }
}

/// Reads the PEM bundle at `path` (`--metadata-ca FILE`, or the data dir's copy): at most
/// [`METADATA_CA_BYTES_MAX`] bytes holding at least one certificate, every one valid PEM.
/// Returns the bytes, to be copied, and the certificates.
pub fn read_metadata_ca(
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), DataDirError> {
    let bytes = read_capped(path, METADATA_CA_BYTES_MAX)?.ok_or_else(|| DataDirError::Missing {
        path: path.to_path_buf(),
        hint: "it holds the certificate authorities trusted for the https:// mirror".into(),
    })?;
    let mut config = lockstep_streams::HttpConfig::default();
    config
        .trust_pem(&bytes)
        .map_err(|error| DataDirError::Malformed {
            path: path.to_path_buf(),
            detail: format!("not a PEM bundle of certificates: {error}"),
        })?;
    Ok((bytes, config.trusted_certificates))
}

/// Reads the keyring at `path` (a file `agent.conf` names, or one given to `--metadata-key`):
/// OpenPGP public keys, armored or binary, at most [`METADATA_KEYS_BYTES_MAX`] bytes.
pub fn read_keyring(path: &Path) -> Result<Keyring, DataDirError> {
    let bytes =
        read_capped(path, METADATA_KEYS_BYTES_MAX)?.ok_or_else(|| DataDirError::Missing {
            path: path.to_path_buf(),
            hint: "it holds the public keys that sign the mirror's metadata".into(),
        })?;
    Keyring::from_bytes(&bytes).map_err(|error| DataDirError::Malformed {
        path: path.to_path_buf(),
        detail: error.to_string(),
    })
}
