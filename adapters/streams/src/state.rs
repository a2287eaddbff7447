//! The persisted [`HighWaterMark`]: the newest metadata `updated` time and the highest
//! version accepted, remembered across restarts so that a mirror cannot roll them back.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lockstep_core::policy::HighWaterMark;

use crate::error::StateError;

/// The most bytes a mark file may have; a real one is under 100 bytes.
const MARK_SIZE_BYTES_MAX: u64 = 4096;
/// The mark file's mode: private to the agent's user, as everything in its data directory.
const MARK_MODE: u32 = 0o600;

/// A high-water mark kept in one JSON file (`{"updated_unix_seconds":…,"version":"…"}`),
/// replaced atomically.
#[derive(Clone, Debug)]
pub struct HighWaterMarkFile {
    path: PathBuf,
}

impl HighWaterMarkFile {
    /// The mark stored at `path` (its directory must exist).
    pub fn new(path: impl Into<PathBuf>) -> HighWaterMarkFile {
        HighWaterMarkFile { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the mark; an absent file is the empty mark (nothing accepted yet). A file
    /// that exists but cannot be parsed is an error, never an empty mark: forgetting the
    /// mark would re-open the door to a rollback.
    pub fn load(&self) -> Result<HighWaterMark, StateError> {
        let problem = |problem: String| StateError {
            path: self.path.display().to_string(),
            problem,
        };
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(HighWaterMark::default());
            }
            Err(error) => return Err(problem(format!("cannot read: {error}"))),
        };
        if bytes.len() as u64 > MARK_SIZE_BYTES_MAX {
            return Err(problem(format!(
                "{} bytes, more than the {MARK_SIZE_BYTES_MAX} a mark has; restore it from \
                 a backup or remove it deliberately to trust the next metadata seen",
                bytes.len()
            )));
        }
        serde_json::from_slice(&bytes).map_err(|error| {
            problem(format!(
                "corrupt ({error}); restore it from a backup or remove it deliberately to \
                 trust the next metadata seen"
            ))
        })
    }

    /// The mark's one writer: under an exclusive lock on `<mark>.lock` (`flock(2)`, held
    /// by one open file at a time, whether the other holder is a thread of this process or
    /// another process), loads the mark as stored now, lets `decide` admit
    /// and advance it, and stores what it returns when that differs. A lookup that read the
    /// mark, fetched for a while, and meanwhile lost a race to a lookup that accepted newer
    /// metadata is refused by `decide` instead of moving the mark backwards.
    ///
    /// The lock is held only for the local read and write, never across network I/O.
    /// `Ok(Err(_))` is `decide`'s refusal; nothing was stored.
    pub fn admit_and_advance<E>(
        &self,
        decide: impl FnOnce(&HighWaterMark) -> Result<HighWaterMark, E>,
    ) -> Result<Result<HighWaterMark, E>, StateError> {
        let lock_path = self.lock_path();
        let problem = |problem: String| StateError {
            path: lock_path.display().to_string(),
            problem,
        };
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(MARK_MODE)
            .open(&lock_path)
            .map_err(|error| problem(format!("cannot open the mark's lock: {error}")))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|error| problem(format!("cannot lock: {error}")))?;
        let stored = self.load()?;
        let decided = match decide(&stored) {
            Ok(advanced) => advanced,
            Err(refusal) => return Ok(Err(refusal)),
        };
        if decided != stored {
            self.store(&decided)?;
        }
        // Dropping the file releases the lock.
        drop(lock);
        Ok(Ok(decided))
    }

    /// `<mark>.lock`, beside the mark.
    fn lock_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_owned();
        name.push(".lock");
        self.path.with_file_name(name)
    }

    /// Replaces the mark atomically (`lockstep_fs`: temporary file, fsync, rename, fsync of
    /// the directory), mode 0600. Only [`HighWaterMarkFile::admit_and_advance`] writes the
    /// mark of a running lookup; this is for tools and tests that set a mark.
    pub fn store(&self, mark: &HighWaterMark) -> Result<(), StateError> {
        let bytes = serde_json::to_vec(mark).expect("a high-water mark always serialises");
        lockstep_fs::write_file_atomically(&self.path, &bytes, MARK_MODE).map_err(|error| {
            StateError {
                path: self.path.display().to_string(),
                problem: error.to_string(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use lockstep_core::Version;

    use super::*;

    #[test]
    fn mark_round_trips_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = HighWaterMarkFile::new(dir.path().join("mark.json"));
        assert_eq!(file.load().unwrap(), HighWaterMark::default());
        let mark = HighWaterMark {
            updated_unix_seconds: Some(1_700_000_000),
            version: Some(Version::parse("2.9.44").unwrap()),
        };
        file.store(&mark).unwrap();
        assert_eq!(file.load().unwrap(), mark);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["mark.json"]);
        assert_eq!(
            fs::read_to_string(file.path()).unwrap(),
            "{\"updated_unix_seconds\":1700000000,\"version\":\"2.9.44\"}"
        );
    }
}
