//! `link-probe.json`: what a machine agent that never downloaded a binary measured of its
//! link to the controllers (`lockstep_core::upgrader::LINK_PROBE_BYTES` from the probe
//! endpoint), kept so that a restart does not probe again.

use serde::{Deserialize, Serialize};

use super::error::DataDirError;
use super::files::read_json_capped;
use super::layout::DataDir;
use super::names::{LINK_PROBE, LINK_PROBE_BYTES_MAX, PRIVATE_FILE_MODE};

/// One link probe's result.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LinkProbe {
    /// Bytes per second, first byte to last (as a download's `download-rate`).
    #[serde(rename = "bytes-per-second")]
    pub bytes_per_second: u64,
    /// The probe's size.
    pub bytes: u64,
    /// When it was measured, seconds since the Unix epoch.
    #[serde(rename = "unix-seconds")]
    pub unix_seconds: u64,
}

impl DataDir {
    /// `<root>/link-probe.json`
    pub fn link_probe_path(&self) -> std::path::PathBuf {
        self.root().join(LINK_PROBE)
    }

    /// The last link probe's result; `None` when the agent never probed. A malformed file
    /// is refused naming it.
    pub fn read_link_probe(&self) -> Result<Option<LinkProbe>, DataDirError> {
        read_json_capped(&self.link_probe_path(), LINK_PROBE_BYTES_MAX)
    }

    /// Replaces `link-probe.json` atomically.
    pub fn write_link_probe(&self, probe: &LinkProbe) -> Result<(), DataDirError> {
        let bytes = serde_json::to_vec(probe).expect("a link probe always serialises");
        lockstep_fs::write_file_atomically(&self.link_probe_path(), &bytes, PRIVATE_FILE_MODE)
            .map_err(DataDirError::Write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_written_is_read_back_and_a_malformed_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert_eq!(data.read_link_probe().unwrap(), None);
        let probe = LinkProbe {
            bytes_per_second: 12_500_000,
            bytes: 1 << 20,
            unix_seconds: 1_796_512_866,
        };
        data.write_link_probe(&probe).unwrap();
        assert_eq!(data.read_link_probe().unwrap(), Some(probe));
        std::fs::write(data.link_probe_path(), b"{\"bytes-per-second\": \"fast\"}").unwrap();
        let error = data.read_link_probe().unwrap_err().to_string();
        assert!(error.contains("link-probe.json"), "{error}");
    }
}
