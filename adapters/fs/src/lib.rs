//! Atomic file replacement, the one implementation every lockstep adapter uses
//! (CONTRACT.md, "Where state lives": temporary file, fsync, rename, fsync of the
//! directory).
//!
//! A crash at any moment leaves the destination with its old content or its new content,
//! never a mix, never a truncated file, never nothing where something was:
//!
//! 1. a temporary file is created in the destination's own directory (a rename is atomic
//!    only within one file system), with an unpredictable name that starts with `.`;
//! 2. its mode is set exactly to the one asked for (the umask may have narrowed it);
//! 3. the content is written and the file fsynced: the bytes are on disk before the name;
//! 4. it is renamed over the destination;
//! 5. the directory is fsynced: the rename itself is on disk.
//!
//! On any failure before step 4 the temporary file is removed and the destination is
//! untouched.
//!
//! - [`write_file_atomically`]: replace a file with bytes held in memory;
//! - [`AtomicFile`]: the same for content streamed in (a download, a tarball being
//!   packed): write through [`AtomicFile::file_mut`], then [`AtomicFile::commit`];
//! - [`rename_durably`]: put a complete file that something else wrote into place;
//! - [`sync_directory`], [`parent_directory`]: the building blocks, for callers that
//!   rename whole directories (the agent's binary installs).
//!
//! Every error names the path it concerns and the step that failed ([`AtomicWriteError`]).
//!
//! **Architecture Invariant:** this crate depends on no other lockstep crate, so that every
//! adapter can use it without depending on another adapter.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A step of an atomic write, as named in error messages.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Step {
    /// Creating the temporary file in the destination's directory.
    CreateTemporary,
    /// Setting the temporary file's mode.
    SetMode,
    /// Writing the content.
    Write,
    /// Fsyncing the file.
    SyncFile,
    /// Renaming the file over the destination.
    Rename,
    /// Fsyncing the directory that holds the destination.
    SyncDirectory,
}

impl Step {
    /// The action, as in "cannot <action> <path>".
    pub fn action(self) -> &'static str {
        match self {
            Step::CreateTemporary => "create a temporary file in",
            Step::SetMode => "set the permissions of",
            Step::Write => "write",
            Step::SyncFile => "fsync",
            Step::Rename => "rename into",
            Step::SyncDirectory => "fsync the directory",
        }
    }
}

/// Why an atomic write failed: the step, the path it concerned (the directory for
/// [`Step::CreateTemporary`] and [`Step::SyncDirectory`], else the destination) and the
/// system's error.
#[derive(Debug)]
pub struct AtomicWriteError {
    /// The step that failed.
    pub step: Step,
    /// The path the step concerned.
    pub path: PathBuf,
    /// The system's error.
    pub source: io::Error,
}

impl AtomicWriteError {
    fn at(step: Step, path: &Path) -> impl FnOnce(io::Error) -> AtomicWriteError + use<> {
        let path = path.to_path_buf();
        move |source| AtomicWriteError { step, path, source }
    }
}

impl fmt::Display for AtomicWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot {} {}: {}",
            self.step.action(),
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for AtomicWriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Replaces `path` with `bytes`, mode `mode` (e.g. `0o600`), so that a crash leaves the old
/// or the new content and nothing else. The directory must exist.
pub fn write_file_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let mut file = AtomicFile::create(path, mode)?;
    file.file_mut()
        .write_all(bytes)
        .map_err(AtomicWriteError::at(Step::Write, path))?;
    file.commit()
}

/// A file being written that replaces its destination only when committed: a temporary
/// file in the destination's directory, removed when dropped uncommitted.
#[derive(Debug)]
pub struct AtomicFile {
    temporary: tempfile::NamedTempFile,
    destination: PathBuf,
}

impl AtomicFile {
    /// Creates the temporary file for `destination` with exactly `mode`. The destination is
    /// not touched until [`AtomicFile::commit`].
    pub fn create(destination: &Path, mode: u32) -> Result<AtomicFile, AtomicWriteError> {
        let directory = parent_directory(destination);
        let name = destination
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(fs::Permissions::from_mode(mode))
            .tempfile_in(directory)
            .map_err(AtomicWriteError::at(Step::CreateTemporary, directory))?;
        // The umask may have narrowed the mode at creation: set it exactly.
        temporary
            .as_file()
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(AtomicWriteError::at(Step::SetMode, temporary.path()))?;
        Ok(AtomicFile {
            temporary,
            destination: destination.to_path_buf(),
        })
    }

    /// The file to write the content to (it may be truncated and rewritten).
    pub fn file_mut(&mut self) -> &mut File {
        self.temporary.as_file_mut()
    }

    /// The file to write the content to, shared (`&File` implements `Write`).
    pub fn file(&self) -> &File {
        self.temporary.as_file()
    }

    /// The destination this file will replace.
    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Fsyncs the content, renames it over the destination, and fsyncs the directory.
    pub fn commit(self) -> Result<(), AtomicWriteError> {
        let AtomicFile {
            temporary,
            destination,
        } = self;
        temporary
            .as_file()
            .sync_all()
            .map_err(AtomicWriteError::at(Step::SyncFile, &destination))?;
        temporary
            .persist(&destination)
            .map_err(|error| AtomicWriteError::at(Step::Rename, &destination)(error.error))?;
        sync_directory(parent_directory(&destination))
    }
}

/// Puts the complete file `from` (written by something else, e.g. a fetch into a partial
/// file) at `to` durably: fsyncs it, renames it over `to` (both must be in one directory's
/// file system), and fsyncs `to`'s directory.
pub fn rename_durably(from: &Path, to: &Path) -> Result<(), AtomicWriteError> {
    File::open(from)
        .and_then(|file| file.sync_all())
        .map_err(AtomicWriteError::at(Step::SyncFile, from))?;
    fs::rename(from, to).map_err(AtomicWriteError::at(Step::Rename, to))?;
    sync_directory(parent_directory(to))
}

/// Makes renames and creations in `directory` durable.
pub fn sync_directory(directory: &Path) -> Result<(), AtomicWriteError> {
    File::open(directory)
        .and_then(|file| file.sync_all())
        .map_err(AtomicWriteError::at(Step::SyncDirectory, directory))
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_directory(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom};

    use super::*;

    fn listing(directory: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(directory)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_write_replaces_the_content_sets_the_mode_exactly_and_leaves_no_temporary() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("server-key.pem");
        write_file_atomically(&path, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(mode(&path), 0o600);
        write_file_atomically(&path, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o644);
        assert_eq!(listing(directory.path()), ["server-key.pem"]);
    }

    #[test]
    fn an_error_names_the_step_and_the_path() {
        let directory = tempfile::tempdir().unwrap();
        let missing = directory.path().join("no/such/dir");
        let error = write_file_atomically(&missing.join("file"), b"x", 0o600).unwrap_err();
        assert_eq!(error.step, Step::CreateTemporary);
        assert_eq!(error.path, missing);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "cannot create a temporary file in {}: ",
                missing.display()
            )),
            "{message}"
        );
        // A destination that is a directory: the rename fails, the old one stays, nothing
        // is left behind.
        let occupied = directory.path().join("occupied");
        fs::create_dir(&occupied).unwrap();
        fs::write(occupied.join("inside"), b"kept").unwrap();
        let error = write_file_atomically(&occupied, b"x", 0o644).unwrap_err();
        assert_eq!(error.step, Step::Rename);
        assert!(error.to_string().contains("occupied"), "{error}");
        assert_eq!(fs::read(occupied.join("inside")).unwrap(), b"kept");
        assert_eq!(listing(directory.path()), ["occupied"]);
    }

    #[test]
    fn a_streamed_file_replaces_the_destination_only_when_committed() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("juju-2.9.44-ubuntu-amd64.tgz");
        fs::write(&path, b"old").unwrap();

        let mut file = AtomicFile::create(&path, 0o644).unwrap();
        file.file_mut().write_all(b"partial").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"old");
        drop(file);
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(listing(directory.path()), ["juju-2.9.44-ubuntu-amd64.tgz"]);

        let mut file = AtomicFile::create(&path, 0o644).unwrap();
        assert_eq!(file.destination(), path);
        file.file_mut().write_all(b"discarded").unwrap();
        // Rewritten from the start (a download whose source ignored a Range).
        file.file_mut().set_len(0).unwrap();
        file.file_mut().seek(SeekFrom::Start(0)).unwrap();
        file.file().write_all(b"new").unwrap();
        assert!(
            listing(directory.path())
                .iter()
                .any(|name| name.starts_with(".juju-2.9.44-ubuntu-amd64.tgz.")
                    && name.ends_with(".tmp")),
            "{:?}",
            listing(directory.path())
        );
        file.commit().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), 0o644);
        assert_eq!(listing(directory.path()), ["juju-2.9.44-ubuntu-amd64.tgz"]);
    }

    #[test]
    fn a_finished_file_is_renamed_into_place() {
        let directory = tempfile::tempdir().unwrap();
        let partial = directory.path().join(".x.tgz.partial");
        let path = directory.path().join("x.tgz");
        fs::write(&partial, b"whole").unwrap();
        rename_durably(&partial, &path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"whole");
        assert_eq!(listing(directory.path()), ["x.tgz"]);
        let error = rename_durably(&partial, &path).unwrap_err();
        assert_eq!(error.step, Step::SyncFile);
        assert!(error.to_string().contains(".x.tgz.partial"), "{error}");
    }

    #[test]
    fn a_bare_name_is_in_the_current_directory() {
        assert_eq!(parent_directory(Path::new("agent.conf")), Path::new("."));
        assert_eq!(parent_directory(Path::new("/a/b")), Path::new("/a"));
    }
}
