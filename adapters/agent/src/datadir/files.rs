//! File primitives of the data directory: capped reads, new files, hashing copies. Every
//! replacement of an existing file goes through [`lockstep_fs`] instead.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use lockstep_core::policy::Sha256;
use sha2::Digest;

use super::error::DataDirError;
use super::names::EXECUTABLE_MODE;

/// Creates `path` (which must not exist) with `bytes` and `mode`, fsynced: for files of a
/// staging directory, which becomes visible only when the whole directory is renamed.
pub(super) fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DataDirError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(DataDirError::io(path, "create"))?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(DataDirError::io(path, "set the permissions of"))?;
    file.write_all(bytes)
        .map_err(DataDirError::io(path, "write"))?;
    file.sync_all().map_err(DataDirError::io(path, "fsync"))
}

/// Makes renames and creations in `directory` durable.
pub(super) fn sync_directory(directory: &Path) -> Result<(), DataDirError> {
    lockstep_fs::sync_directory(directory).map_err(DataDirError::Write)
}

/// Reads a whole file of at most `size_bytes_max` bytes; `None` when it does not exist.
pub(super) fn read_capped(
    path: &Path,
    size_bytes_max: u64,
) -> Result<Option<Vec<u8>>, DataDirError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(DataDirError::io(path, "open")(error)),
    };
    let mut bytes = Vec::new();
    file.take(size_bytes_max + 1)
        .read_to_end(&mut bytes)
        .map_err(DataDirError::io(path, "read"))?;
    if bytes.len() as u64 > size_bytes_max {
        return Err(DataDirError::TooLarge {
            path: path.to_path_buf(),
            size_bytes_max,
        });
    }
    Ok(Some(bytes))
}

/// A JSON file of at most `size_bytes_max` bytes; `None` when it does not exist. A malformed
/// one is refused naming the file and what is wrong.
pub(super) fn read_json_capped<T: serde::de::DeserializeOwned>(
    path: &Path,
    size_bytes_max: u64,
) -> Result<Option<T>, DataDirError> {
    let Some(bytes) = read_capped(path, size_bytes_max)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|error| DataDirError::Malformed {
            path: path.to_path_buf(),
            detail: error.to_string(),
        })
}

/// The sha256 and size in bytes of a file, reading at most `size_bytes_max` bytes.
pub(super) fn sha256_of_file(
    path: &Path,
    size_bytes_max: u64,
) -> Result<(Sha256, u64), DataDirError> {
    let file = File::open(path).map_err(DataDirError::io(path, "open"))?;
    let mut hasher = sha2::Sha256::new();
    let mut size: u64 = 0;
    let mut reader = file.take(size_bytes_max);
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let count = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(DataDirError::io(path, "read")(error)),
        };
        hasher.update(&buffer[..count]);
        size += count as u64;
    }
    Ok((Sha256(hasher.finalize().into()), size))
}

/// Copies `source` to the new file `target` (mode 0755, fsynced) while hashing it; returns
/// its sha256 and size in bytes.
pub(super) fn copy_hashed(
    source: &Path,
    target: &Path,
    size_bytes_max: u64,
) -> Result<(Sha256, u64), DataDirError> {
    let input = File::open(source).map_err(DataDirError::io(source, "open"))?;
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(EXECUTABLE_MODE)
        .open(target)
        .map_err(DataDirError::io(target, "create"))?;
    let mut hasher = sha2::Sha256::new();
    let mut size: u64 = 0;
    let mut reader = input.take(size_bytes_max + 1);
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let count = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(DataDirError::io(source, "read")(error)),
        };
        size += count as u64;
        if size > size_bytes_max {
            return Err(DataDirError::TooLarge {
                path: source.to_path_buf(),
                size_bytes_max,
            });
        }
        hasher.update(&buffer[..count]);
        output
            .write_all(&buffer[..count])
            .map_err(DataDirError::io(target, "write"))?;
    }
    output
        .set_permissions(fs::Permissions::from_mode(EXECUTABLE_MODE))
        .map_err(DataDirError::io(target, "set the permissions of"))?;
    output
        .sync_all()
        .map_err(DataDirError::io(target, "fsync"))?;
    Ok((Sha256(hasher.finalize().into()), size))
}

/// A random name part for temporary entries.
pub(super) fn random_u64() -> u64 {
    use rand_core::RngCore;
    rand_core::OsRng.next_u64()
}
