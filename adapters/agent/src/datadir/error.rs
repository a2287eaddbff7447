//! [`DataDirError`]: something in the data directory that cannot be read, written or
//! trusted. Every variant names the file, and the offending value where there is one.

use std::io;
use std::path::{Path, PathBuf};

use lockstep_core::version::ParseVersionError;

use crate::quote::quote;
use crate::unpack::UnpackError;

use super::names::TAG_LENGTH_MAX;

/// Something in the data directory that cannot be read, written or trusted.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// A system call failed on `path`.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: io::Error,
    },
    /// A file that must exist and does not; `hint` says what to do.
    #[error("{} does not exist: {hint}", path.display())]
    Missing { path: PathBuf, hint: String },
    /// A file whose content cannot be parsed or is not valid.
    #[error("{} is malformed: {detail}", path.display())]
    Malformed { path: PathBuf, detail: String },
    /// An `agent.conf` written by a newer lockstep.
    #[error("{}: {detail}", path.display())]
    NewerFormat { path: PathBuf, detail: String },
    /// A file larger than lockstep ever writes.
    #[error(
        "{} is larger than {size_bytes_max} bytes; lockstep never writes one so large",
        path.display()
    )]
    TooLarge { path: PathBuf, size_bytes_max: u64 },
    /// An agent tag that is not `[a-z][a-z0-9-]*`.
    #[error(
        "invalid agent tag {}: expected 1 to {TAG_LENGTH_MAX} characters of a-z, 0-9 and \
         '-', starting with a letter and not ending with '-' (e.g. machine-0)",
        quote(tag)
    )]
    BadTag { tag: String },
    /// A binary whose release or arch would not be a plain directory name.
    #[error(
        "invalid binary {}: not a plain <version>-<release>-<arch> name",
        quote(binary)
    )]
    BadBinary { binary: String },
    /// An agent link (`tools/<tag>`) that is not a symlink to a binary directory.
    #[error("agent link {} -> {}: {detail}", path.display(), quote(target))]
    BadLink {
        path: PathBuf,
        target: String,
        detail: String,
    },
    /// A `FORCE-VERSION` file whose text is not a version.
    #[error("{} holds {}, which is not a version: {error}", path.display(), quote(text))]
    ForceVersion {
        path: PathBuf,
        text: String,
        #[source]
        error: Box<ParseVersionError>,
    },
    /// A binary directory without a usable executable.
    #[error("no usable agent binary at {}: {detail}", path.display())]
    NotInstalled { path: PathBuf, detail: String },
    /// A file that is not what its description says (size, sha256, version).
    #[error("{}: {what} is {actual}, expected {expected}", path.display())]
    Mismatch {
        path: PathBuf,
        what: &'static str,
        expected: String,
        actual: String,
    },
    /// The tarball could not be unpacked.
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    /// A file could not be replaced atomically, or a directory fsynced.
    #[error(transparent)]
    Write(#[from] lockstep_fs::AtomicWriteError),
}

impl DataDirError {
    /// A mapper from the `io::Error` of `action` on `path`.
    pub(crate) fn io(
        path: &Path,
        action: &'static str,
    ) -> impl FnOnce(io::Error) -> DataDirError + use<> {
        let path = path.to_path_buf();
        move |error| DataDirError::Io {
            path,
            action,
            error,
        }
    }
}
