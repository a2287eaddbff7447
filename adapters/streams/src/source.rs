//! Where metadata and binaries come from: the [`Source`] trait and the directory source.
//!
//! This trait is synchronous; the agent drives the async [`crate::AsyncSource`] (see
//! [`crate::fetch`] for why both exist). Whatever the transport, a source resolves only safe
//! relative paths ([`check_relative_path`]) and never hands out more bytes than the cap the
//! caller gives each fetch.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use lockstep_core::policy::PATH_LENGTH_MAX;

use crate::error::{SourceError, quote};

/// Checks that `path` is a relative path that stays inside the source root: 1 to
/// [`PATH_LENGTH_MAX`] bytes of `/`-separated components, none empty, `.` or `..`, no
/// leading `/`, no `\` and no NUL. Returns the problem otherwise.
pub fn check_relative_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.len() > PATH_LENGTH_MAX {
        return Err("path longer than 1024 bytes");
    }
    if path.starts_with('/') {
        return Err("absolute path: escapes the mirror root");
    }
    if path.contains('\\') || path.contains('\0') {
        return Err("path contains a backslash or NUL");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("path has an empty component (`//` or a trailing `/`)"),
            "." => return Err("path has a `.` component"),
            ".." => return Err("path has a `..` component: escapes the mirror root"),
            _ => {}
        }
    }
    Ok(())
}

/// Where simplestreams metadata and agent binaries are read from.
///
/// Synchronous; [`crate::AsyncSource`] is its async counterpart with the same contract:
/// paths are relative to the source root and checked with
/// [`check_relative_path`]; a fetch never yields more than `size_bytes_max` bytes, and
/// reading past it fails with an error that [`is_too_large`] recognises.
pub trait Source: fmt::Debug {
    /// Where this source reads, for messages: `file:///srv/mirror/tools`.
    fn location(&self) -> String;

    /// Opens `path`, relative to the source root, for reading at most `size_bytes_max`
    /// bytes.
    fn open(&self, path: &str, size_bytes_max: u64) -> Result<Box<dyn Read + Send>, SourceError>;
}

/// Reads a whole (small) document from `source`, at most `size_bytes_max` bytes.
pub fn read_document(
    source: &dyn Source,
    path: &str,
    size_bytes_max: u64,
) -> Result<Vec<u8>, SourceError> {
    let mut reader = source.open(path, size_bytes_max)?;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).map_err(|error| {
        if is_too_large(&error) {
            SourceError::TooLarge {
                location: source.location(),
                path: quote(path),
                size_bytes_max,
                announced_size_bytes: None,
            }
        } else {
            io_error(&source.location(), path, &error)
        }
    })?;
    assert!(bytes.len() as u64 <= size_bytes_max);
    Ok(bytes)
}

pub(crate) fn io_error(location: &str, path: &str, error: &io::Error) -> SourceError {
    SourceError::Io {
        location: location.to_owned(),
        path: quote(path),
        kind: error.kind(),
        message: error.to_string(),
    }
}

/// The error payload of a [`CappedReader`] read past its cap.
#[derive(Debug)]
struct CapExceeded {
    size_bytes_max: u64,
}

impl fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than the {} bytes allowed", self.size_bytes_max)
    }
}

impl std::error::Error for CapExceeded {}

/// True when a read failed because the fetch's size cap was exceeded.
pub fn is_too_large(error: &io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.downcast_ref::<CapExceeded>().is_some())
}

/// A reader that yields at most `size_bytes_max` bytes of `inner` and fails, rather than
/// stopping quietly, when `inner` has more: a too-long answer is an error, not a prefix.
#[derive(Debug)]
pub struct CappedReader<R> {
    inner: R,
    size_bytes_max: u64,
    remaining_bytes: u64,
}

impl<R: Read> CappedReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, size_bytes_max: u64) -> CappedReader<R> {
        CappedReader {
            inner,
            size_bytes_max,
            remaining_bytes: size_bytes_max,
        }
    }
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        if self.remaining_bytes == 0 {
            // At the cap: one more byte means the source is longer than allowed.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(CapExceeded {
                    size_bytes_max: self.size_bytes_max,
                })),
            };
        }
        let length = buffer
            .len()
            .min(usize::try_from(self.remaining_bytes).unwrap_or(usize::MAX));
        let count = self.inner.read(&mut buffer[..length])?;
        assert!(count <= length);
        self.remaining_bytes -= count as u64;
        Ok(count)
    }
}

/// A mirror on the local file system (`file://` in `agent-metadata-url`), e.g. a USB disk
/// or NFS export at an air-gapped site.
#[derive(Clone, Debug)]
pub struct DirectorySource {
    root: PathBuf,
}

impl DirectorySource {
    /// A source rooted at `root` (the directory that holds `streams/v1/`).
    pub fn new(root: impl AsRef<Path>) -> Result<DirectorySource, SourceError> {
        let given = root.as_ref();
        let location = format!("file://{}", given.display());
        let root = given
            .canonicalize()
            .map_err(|error| io_error(&location, "", &error))?;
        if !root.is_dir() {
            return Err(SourceError::Io {
                location,
                path: String::new(),
                kind: io::ErrorKind::NotADirectory,
                message: "not a directory".to_owned(),
            });
        }
        Ok(DirectorySource { root })
    }

    /// A source from `agent-metadata-url`: `file:///srv/mirror/tools` or a plain path.
    pub fn from_url(url: &str) -> Result<DirectorySource, SourceError> {
        let path = url.strip_prefix("file://").unwrap_or(url);
        DirectorySource::new(path)
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Source for DirectorySource {
    fn location(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn open(&self, path: &str, size_bytes_max: u64) -> Result<Box<dyn Read + Send>, SourceError> {
        let location = self.location();
        check_relative_path(path).map_err(|problem| SourceError::InvalidPath {
            location: location.clone(),
            path: quote(path),
            problem,
        })?;
        let joined = self.root.join(path);
        let resolved = joined.canonicalize().map_err(|error| {
            if error.kind() == io::ErrorKind::NotFound {
                SourceError::NotFound {
                    location: location.clone(),
                    path: quote(path),
                }
            } else {
                io_error(&location, path, &error)
            }
        })?;
        // A symbolic link inside the mirror must not lead outside it.
        if !resolved.starts_with(&self.root) {
            return Err(SourceError::InvalidPath {
                location,
                path: quote(path),
                problem: "resolves (through a symbolic link) outside the mirror root",
            });
        }
        let file = File::open(&resolved).map_err(|error| io_error(&location, path, &error))?;
        let metadata = file
            .metadata()
            .map_err(|error| io_error(&location, path, &error))?;
        if !metadata.is_file() {
            return Err(SourceError::Io {
                location,
                path: quote(path),
                kind: io::ErrorKind::InvalidInput,
                message: "not a regular file".to_owned(),
            });
        }
        if metadata.len() > size_bytes_max {
            return Err(SourceError::TooLarge {
                location,
                path: quote(path),
                size_bytes_max,
                announced_size_bytes: Some(metadata.len()),
            });
        }
        Ok(Box::new(CappedReader::new(file, size_bytes_max)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside_the_root() {
        let cases: &[(&str, Result<(), &str>)] = &[
            ("agent/2.9.43/juju-2.9.43-ubuntu-amd64.tgz", Ok(())),
            ("released/juju-3.6.0-ubuntu-amd64.tgz", Ok(())),
            ("streams/v1/com.ubuntu.juju:released:tools.json", Ok(())),
            ("..x/y", Ok(())),
            (
                "../x",
                Err("path has a `..` component: escapes the mirror root"),
            ),
            (
                "a/../../x",
                Err("path has a `..` component: escapes the mirror root"),
            ),
            ("/abs", Err("absolute path: escapes the mirror root")),
            (
                "/var/lib/juju/agents/juju-3.6-rc2-ubuntu-riscv64.tgz",
                Err("absolute path: escapes the mirror root"),
            ),
            (
                "a//b",
                Err("path has an empty component (`//` or a trailing `/`)"),
            ),
            (
                "http://evil/x",
                Err("path has an empty component (`//` or a trailing `/`)"),
            ),
            ("./a", Err("path has a `.` component")),
            ("a\\..\\b", Err("path contains a backslash or NUL")),
            ("", Err("empty path")),
        ];
        for &(path, expected) in cases {
            assert_eq!(check_relative_path(path), expected, "{path:?}");
        }
        assert!(check_relative_path(&"a".repeat(1025)).is_err());
        assert!(check_relative_path(&"a".repeat(1024)).is_ok());
    }

    #[test]
    fn capped_reader_refuses_one_byte_more() {
        let mut exact = Vec::new();
        CappedReader::new(&b"12345"[..], 5)
            .read_to_end(&mut exact)
            .unwrap();
        assert_eq!(exact, b"12345");

        let mut longer = Vec::new();
        let error = CappedReader::new(&b"123456"[..], 5)
            .read_to_end(&mut longer)
            .unwrap_err();
        assert!(is_too_large(&error), "{error}");
        assert_eq!(longer, b"12345");
        assert!(!is_too_large(&io::Error::other("unrelated")));
    }
}
