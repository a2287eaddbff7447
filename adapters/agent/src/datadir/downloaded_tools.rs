//! `downloaded-tools.txt`: a binary's provenance in its directory, Juju's JSON
//! (`{"version":"2.9.43-ubuntu-amd64","url":"...","sha256":"<64 hex digits>","size":123}`).

use std::path::Path;

use lockstep_core::policy::Sha256;
use lockstep_core::version::Binary;
use serde::{Deserialize, Serialize};

use super::error::DataDirError;
use super::files::read_json_capped;
use super::names::{DOWNLOADED_TOOLS, DOWNLOADED_TOOLS_BYTES_MAX};

/// A binary's provenance, `downloaded-tools.txt` in its directory, JSON with Juju's keys.
/// `sha256` and `size_bytes` describe what was fetched: the tarball, or the executable
/// itself for a local binary.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DownloadedTools {
    pub version: Binary,
    pub url: String,
    /// Written as 64 lowercase hexadecimal digits; either case is read.
    pub sha256: Sha256,
    /// Juju's key is `size`.
    #[serde(rename = "size")]
    pub size_bytes: u64,
    /// lockstep's: bytes per second the download ran at, its first byte to its last, when
    /// it was downloaded from a controller (a machine agent reports it in its status, and
    /// the staged rollout admits slow links early). Absent otherwise, and in Juju's files.
    #[serde(
        rename = "download-rate",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub download_rate: Option<u64>,
}

impl DownloadedTools {
    /// Reads `dir/downloaded-tools.txt`; `None` when there is none. A malformed file is
    /// refused naming the file and the offending value (a sha256 that is not 64 hex digits,
    /// a version that is not a binary).
    pub fn read(dir: &Path) -> Result<Option<DownloadedTools>, DataDirError> {
        read_json_capped(&dir.join(DOWNLOADED_TOOLS), DOWNLOADED_TOOLS_BYTES_MAX)
    }

    /// The file's content.
    pub(super) fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("downloaded tools always serialise")
    }
}
