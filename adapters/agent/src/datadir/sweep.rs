//! Sweeping the temporary files a crash left behind, at the launcher's start.
//!
//! Every file lockstep replaces is written under a temporary name in its own directory and
//! renamed into place (`lockstep_fs`: `.<name>.<random>.tmp`); the tools endpoint fetches
//! into `.<binary>.tgz.partial`; binaries are staged in `tools/.install-*` directories. A
//! process killed mid-write leaves these behind. The launcher, holding the data dir's lock
//! (no other `lockstepd` can be writing), removes them before its first worker starts.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::files::sync_directory;

use super::error::DataDirError;
use super::layout::DataDir;

/// True for a name only a write in progress has: `lockstep_fs`'s `.<name>.<random>.tmp`, or
/// the tools endpoint's `.<binary>.tgz.partial`.
pub fn is_temporary_name(name: &str) -> bool {
    name.starts_with('.') && (name.ends_with(".tmp") || name.ends_with(".partial"))
}

impl DataDir {
    /// Removes every leftover temporary file of the data dir (its root, the tools cache, and
    /// each installed binary's directory) and the staging directories under `tools/`, and
    /// fsyncs each directory it changed. Returns the files it removed and how many staging
    /// entries.
    ///
    /// Only for a process that holds the data dir's lock: a write in progress would lose its
    /// temporary file.
    pub fn sweep_temporaries(&self) -> Result<Swept, DataDirError> {
        let mut removed = Vec::new();
        let mut directories = vec![self.root().to_path_buf(), self.tools_cache_dir()];
        if let Some(entries) = list(&self.tools_dir())? {
            for entry in entries {
                let entry = entry.map_err(DataDirError::io(&self.tools_dir(), "list"))?;
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    directories.push(entry.path());
                }
            }
        }
        for directory in directories {
            sweep_directory(&directory, &mut removed)?;
        }
        Ok(Swept {
            files: removed,
            // Staging and replaced directories, and half-made links, under `tools/`.
            staging_entries: self.remove_stale_temporaries()?,
        })
    }
}

/// What [`DataDir::sweep_temporaries`] removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// Temporary files.
    pub files: Vec<PathBuf>,
    /// Staging directories (and half-made links) under `tools/`.
    pub staging_entries: usize,
}

fn list(directory: &Path) -> Result<Option<fs::ReadDir>, DataDirError> {
    match fs::read_dir(directory) {
        Ok(entries) => Ok(Some(entries)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(DataDirError::io(directory, "list")(error)),
    }
}

fn sweep_directory(directory: &Path, removed: &mut Vec<PathBuf>) -> Result<(), DataDirError> {
    let Some(entries) = list(directory)? else {
        return Ok(());
    };
    let before = removed.len();
    for entry in entries {
        let entry = entry.map_err(DataDirError::io(directory, "list"))?;
        let is_file = entry.file_type().is_ok_and(|kind| kind.is_file());
        if !is_file || !is_temporary_name(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        fs::remove_file(&path).map_err(DataDirError::io(&path, "remove"))?;
        removed.push(path);
    }
    if removed.len() > before {
        sync_directory(directory)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_of_writes_in_progress_are_temporary() {
        for name in [
            ".agent.conf.a1B2c3.tmp",
            ".juju-2.9.44-ubuntu-amd64.tgz.partial",
        ] {
            assert!(is_temporary_name(name), "{name}");
        }
        for name in [
            "agent.conf",
            "store.db-wal",
            "streams-mark.json.lock",
            "notes.tmp",
            ".hidden",
            "juju-2.9.44-ubuntu-amd64.tgz",
        ] {
            assert!(!is_temporary_name(name), "{name}");
        }
    }
}
