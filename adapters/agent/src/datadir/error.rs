//! [`DataDirError`]: something in the data directory that cannot be read, written or
//! trusted. Every variant names the file, and the offending value where there is one.

use std::io;
use std::path::{Path, PathBuf};

use lockstep_core::version::ParseVersionError;

use crate::quote::quote;
use crate::unpack::UnpackError;

use super::names::{ELF_HEADER_READ_BYTES, TAG_LENGTH_MAX};

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
    /// A local agent binary whose identity cannot be read, or that this host cannot run.
    #[error("{}: {problem}", path.display())]
    Identity {
        path: PathBuf,
        #[source]
        problem: IdentityProblem,
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

/// Byte order of an ELF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endianness {
    Little,
    Big,
}

impl std::fmt::Display for Endianness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Endianness::Little => "little-endian",
            Endianness::Big => "big-endian",
        })
    }
}

/// Why a file's identity cannot be read, or is not one this host can run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityProblem {
    /// Shorter than the part of the ELF header that is read.
    #[error(
        "it is {size_bytes} bytes long, shorter than an ELF header ({ELF_HEADER_READ_BYTES} \
         bytes are read): not an agent binary"
    )]
    Truncated { size_bytes: u64 },
    /// Not an ELF file, or an ELF version this reader does not know.
    #[error("it is not an ELF executable: it starts with {first_bytes}")]
    NotElf {
        /// The first bytes, escaped.
        first_bytes: String,
    },
    /// An ELF file that is not an executable (an object file, a core dump).
    #[error("it is an ELF file of type {e_type}, not an executable (2 or 3)")]
    NotExecutable { e_type: u16 },
    /// An ELF executable for an architecture lockstep does not install.
    #[error(
        "it is a {class_bits}-bit {endianness} ELF executable for {machine_name} \
         (e_machine {machine}): lockstep agents are 64-bit builds for amd64, arm64, ppc64el \
         (little-endian), s390x (big-endian) or riscv64"
    )]
    UnsupportedArch {
        class_bits: u8,
        endianness: Endianness,
        machine: u16,
        machine_name: &'static str,
    },
    /// An executable for another architecture than this host's.
    #[error(
        "it is built for {arch}, but this host is {host_arch}: build lockstepd for \
         {host_arch}, or name one built for it"
    )]
    ForeignArch { arch: String, host_arch: String },
    /// No marker: not a `lockstepd` build (or one from before markers). The message never
    /// spells a marker out: a literal one in the reader's code would be found in every
    /// binary holding it (`lockstep`, `lockstepd`).
    #[error("it holds no lockstep agent identity marker: it is not a lockstepd build")]
    NoMarker,
    /// A marker whose body does not parse.
    #[error("its identity marker at byte {offset} is malformed: {detail}")]
    BadMarker { offset: u64, detail: String },
    /// Two markers that disagree: which one is true cannot be told.
    #[error(
        "it holds two different identity markers, {} at byte {first_offset} and {} at byte \
         {second_offset}: which one it is cannot be told",
        quote(first),
        quote(second)
    )]
    TwoMarkers {
        first: String,
        first_offset: u64,
        second: String,
        second_offset: u64,
    },
}
