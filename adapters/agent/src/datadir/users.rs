//! `users.json`: the API's users and their argon2 password hashes, written by bootstrap
//! (and copied by `enable-ha`), read by the worker at each start.

use serde::{Deserialize, Serialize};

use super::error::DataDirError;
use super::files::read_capped;
use super::layout::DataDir;
use super::names::{SECRET_FILE_MODE, USERS_BYTES_MAX};

/// An API user, as `users.json` lists them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    #[serde(rename = "password-hash")]
    pub password_hash: String,
}

impl DataDir {
    /// Reads `users.json`; a missing file is an error (bootstrap writes it).
    pub fn read_users(&self) -> Result<Vec<User>, DataDirError> {
        let path = self.users_path();
        let bytes = read_capped(&path, USERS_BYTES_MAX)?.ok_or_else(|| DataDirError::Missing {
            path: path.clone(),
            hint: "bootstrap writes it; restore it from a backup or bootstrap again".into(),
        })?;
        serde_json::from_slice(&bytes).map_err(|error| DataDirError::Malformed {
            path,
            detail: format!("not a list of users: {error}"),
        })
    }

    /// Replaces `users.json` atomically, mode 0600.
    pub fn write_users(&self, users: &[User]) -> Result<(), DataDirError> {
        let text = serde_json::to_string_pretty(users).expect("users serialise");
        lockstep_fs::write_file_atomically(&self.users_path(), text.as_bytes(), SECRET_FILE_MODE)
            .map_err(DataDirError::Write)
    }
}
