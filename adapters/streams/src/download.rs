//! Verified download: stream a binary into a temporary file beside its destination while
//! hashing and counting, and rename it into place only when size and sha256 match.

use std::io::{Read, Write};
use std::path::Path;

use lockstep_core::policy::{CatalogueEntry, Sha256};
use sha2::Digest;

use crate::error::{DownloadError, quote};
use crate::source::{Source, io_error, is_too_large};
use crate::state::{parent_directory, sync_directory};

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
    let destination_error = |error: std::io::Error| DownloadError::Destination {
        path: destination.display().to_string(),
        problem: error.to_string(),
    };
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
    let directory = parent_directory(destination);
    // Deleted when dropped, on every early return below.
    let mut temporary = tempfile::Builder::new()
        .prefix(".download-")
        .suffix(".partial")
        .tempfile_in(directory)
        .map_err(destination_error)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut received_bytes: u64 = 0;
    loop {
        let count = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) if is_too_large(&error) => return Err(too_long(received_bytes + 1)),
            Err(error) => {
                return Err(io_error(&source.location(), &entry.path, &error).into());
            }
        };
        hasher.update(&buffer[..count]);
        temporary
            .as_file_mut()
            .write_all(&buffer[..count])
            .map_err(destination_error)?;
        received_bytes += count as u64;
        // The source is capped at the declared size.
        assert!(received_bytes <= expected_size_bytes);
        progress(DownloadProgress {
            received_bytes,
            total_bytes: expected_size_bytes,
        });
    }
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
    temporary.as_file().sync_all().map_err(destination_error)?;
    temporary
        .persist(destination)
        .map_err(|error| destination_error(error.error))?;
    sync_directory(directory).map_err(destination_error)?;
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
