//! Verified download: stream a binary into a temporary file beside its destination while
//! hashing and counting, and rename it into place only when size and sha256 match.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use lockstep_core::policy::{CatalogueEntry, Sha256};
use sha2::Digest;

use crate::error::{DownloadError, quote};
use crate::source::{Source, io_error, is_too_large};

/// A downloaded tarball's mode: private to the agent's user, as everything in its data
/// directory (it serves the tarball to agents itself, after a login).
const DOWNLOAD_MODE: u32 = 0o600;

/// Bytes read per step: large enough for throughput, small enough to never matter in
/// memory. The whole binary is never held in memory.
const CHUNK_BYTES: usize = 256 * 1024;

/// How far a download has got, reported after every chunk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DownloadProgress {
    /// Bytes received and written so far.
    pub received_bytes: u64,
    /// Bytes the catalogue declared.
    pub total_bytes: u64,
}

/// Fetches `entry` from `source` into the file `destination`, verified.
///
/// The bytes go to a temporary file in `destination`'s directory while their sha256 is
/// computed and counted; the source is read with a cap of the declared size, so a longer
/// file is refused after one byte more. Only when size and sha256 match is the file
/// fsynced, renamed over `destination` and the directory fsynced. On any failure the
/// temporary file is deleted, `destination` is untouched, and the error reports expected
/// against actual.
pub fn download(
    source: &dyn Source,
    entry: &CatalogueEntry,
    destination: &Path,
    progress: &mut dyn FnMut(DownloadProgress),
) -> Result<(), DownloadError> {
    let expected_size_bytes = entry.size_bytes;
    let too_long = |actual_size_bytes_min| DownloadError::TooLong {
        path: quote(&entry.path),
        expected_size_bytes,
        actual_size_bytes_min,
    };
    let mut reader = match source.open(&entry.path, expected_size_bytes) {
        Ok(reader) => reader,
        Err(crate::error::SourceError::TooLarge {
            announced_size_bytes,
            ..
        }) => {
            return Err(too_long(
                announced_size_bytes.unwrap_or(expected_size_bytes + 1),
            ));
        }
        Err(error) => return Err(error.into()),
    };
    let mut staged = Staged::new(entry, destination)?;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        let count = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) if is_too_large(&error) => {
                return Err(too_long(staged.received_bytes() + 1));
            }
            Err(error) => {
                return Err(io_error(&source.location(), &entry.path, &error).into());
            }
        };
        staged.write(&buffer[..count])?;
        progress(staged.progress());
    }
    staged.install()
}

/// A download in progress: a temporary file beside the destination, the running sha256 of
/// what was written to it, and the byte count. Every source writes through it, so the
/// checks before installing are the same whatever the transport.
///
/// The digest is updated with exactly the bytes written, in order, so a download resumed
/// after an interruption (HTTP `Range`) continues the same digest: the prefix already
/// written is hashed once, when it arrived, and never read back.
#[derive(Debug)]
pub(crate) struct Staged<'a> {
    entry: &'a CatalogueEntry,
    destination: &'a Path,
    /// Deleted when dropped, on every early return; committed only after the checks.
    temporary: lockstep_fs::AtomicFile,
    hasher: sha2::Sha256,
    received_bytes: u64,
}

impl<'a> Staged<'a> {
    /// Creates the temporary file in `destination`'s directory.
    pub(crate) fn new(
        entry: &'a CatalogueEntry,
        destination: &'a Path,
    ) -> Result<Staged<'a>, DownloadError> {
        let temporary = lockstep_fs::AtomicFile::create(destination, DOWNLOAD_MODE)
            .map_err(|error| destination_error(destination, &error))?;
        Ok(Staged {
            entry,
            destination,
            temporary,
            hasher: sha2::Sha256::new(),
            received_bytes: 0,
        })
    }

    /// Bytes written so far.
    pub(crate) fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// The progress to report now.
    pub(crate) fn progress(&self) -> DownloadProgress {
        DownloadProgress {
            received_bytes: self.received_bytes,
            total_bytes: self.entry.size_bytes,
        }
    }

    /// Appends `bytes`, which must not take the total past the declared size (callers cap
    /// their reads at it and report [`DownloadError::TooLong`] themselves).
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), DownloadError> {
        assert!(self.received_bytes + bytes.len() as u64 <= self.entry.size_bytes);
        self.temporary
            .file_mut()
            .write_all(bytes)
            .map_err(|error| destination_error(self.destination, &error))?;
        self.hasher.update(bytes);
        self.received_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Forgets everything written: the source cannot resume (it ignored a `Range`).
    pub(crate) fn restart(&mut self) -> Result<(), DownloadError> {
        let file = self.temporary.file_mut();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
            .map_err(|error| destination_error(self.destination, &error))?;
        self.hasher = sha2::Sha256::new();
        self.received_bytes = 0;
        Ok(())
    }

    /// Checks size and sha256 against the catalogue entry; only when both match, fsyncs
    /// the file, renames it over the destination and fsyncs the directory. On failure the
    /// temporary file is deleted and the error reports expected against actual.
    pub(crate) fn install(self) -> Result<(), DownloadError> {
        let Staged {
            entry,
            destination,
            temporary,
            hasher,
            received_bytes,
        } = self;
        let expected_size_bytes = entry.size_bytes;
        if received_bytes < expected_size_bytes {
            return Err(DownloadError::Truncated {
                path: quote(&entry.path),
                expected_size_bytes,
                actual_size_bytes: received_bytes,
            });
        }
        let actual_sha256 = Sha256(hasher.finalize().into());
        if actual_sha256 != entry.sha256 {
            return Err(DownloadError::HashMismatch {
                path: quote(&entry.path),
                expected_sha256: entry.sha256,
                actual_sha256,
            });
        }
        assert_eq!(received_bytes, expected_size_bytes);
        temporary
            .commit()
            .map_err(|error| destination_error(destination, &error))?;
        tracing::info!(
            binary = %entry.binary,
            stream = %entry.stream,
            size_bytes = received_bytes,
            sha256 = %actual_sha256,
            destination = %destination.display(),
            "downloaded and verified agent binary"
        );
        Ok(())
    }
}

fn destination_error(destination: &Path, error: &dyn std::fmt::Display) -> DownloadError {
    DownloadError::Destination {
        path: destination.display().to_string(),
        problem: error.to_string(),
    }
}

/// Size and sha256 of a reader's content, read in chunks.
pub(crate) fn measure(reader: &mut dyn Read) -> std::io::Result<(u64, Sha256)> {
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut size_bytes: u64 = 0;
    loop {
        let count = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..count]);
        size_bytes += count as u64;
    }
    Ok((size_bytes, Sha256(hasher.finalize().into())))
}
