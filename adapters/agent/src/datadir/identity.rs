//! Which agent binary a local file is, read from the file without running it: the operator
//! names the binary (`lockstep bootstrap --build-agent [--agent-binary FILE]`), and lockstep
//! reads what it is instead of guessing it from the host (seed 001: `--upload-tools` chose
//! binaries by the client machine's arch, series and `$PATH`, and upgrades failed).
//!
//! - The version and the OS come from the identity marker every `lockstepd` build embeds
//!   ([`AGENT_IDENTITY_MARKER`]): `LOCKSTEP-AGENT-IDENTITY:v1:version=<version>;os=<os>`
//!   and a NUL byte, found by scanning the file's bytes.
//! - The architecture comes from the ELF header (`e_machine`, with the class and the byte
//!   order it must have), by Juju's names: amd64, arm64, ppc64el, s390x, riscv64. Anything
//!   else (32-bit, the wrong byte order, another machine, not ELF) is refused.
//! - A `FORCE-VERSION` file beside the binary sets its version (Juju's mechanism), and its
//!   use is logged.
//! - The size and sha256 are of the bytes read, which the install checks again on its copy.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use lockstep_core::policy::Sha256;
use lockstep_core::version::{Binary, Version};
use sha2::Digest;

use super::error::{DataDirError, Endianness, IdentityProblem};
use super::files::read_capped;
use super::names::{
    ELF_HEADER_READ_BYTES, FORCE_VERSION, FORCE_VERSION_BYTES_MAX, LOCAL_BINARY_BYTES_MAX,
};
use crate::quote::quote;

/// The identity marker of this build, which `lockstepd` embeds (`src/bin/lockstepd.rs`, a
/// `#[used]` static it also reads at start): the prefix, `version=` the crate's version (the
/// build's own, [`crate::steps::build_version`]), `;os=`
/// [`AGENT_OS`](super::layout::AGENT_OS), and a NUL byte that
/// ends it. Only `lockstepd` holds it: a constant is emitted where it is used, and nothing
/// else uses it, so the `lockstep` CLI (or any other file) is refused as an agent binary.
pub const AGENT_IDENTITY_MARKER: &str = concat!(
    "LOCKSTEP-AGENT-IDENTITY:v1:version=",
    env!("CARGO_PKG_VERSION"),
    ";os=ubuntu\0"
);

/// What precedes every marker. An occurrence is a marker only when `version=` follows: the
/// prefix alone (as the reader's own code holds it) is not one.
const MARKER_PREFIX: &[u8] = b"LOCKSTEP-AGENT-IDENTITY:v1:";
/// What follows the prefix in a marker, first.
const VERSION_KEY: &[u8] = b"version=";
/// The key of the second field.
const OS_KEY: &str = "os=";
/// Longest marker body (after the prefix, before the NUL): a version and an OS name fit in
/// far less; a body without a NUL within this many bytes is malformed.
const MARKER_BODY_BYTES_MAX: usize = 128;
/// Bytes read from the file at a time.
const READ_CHUNK_BYTES: usize = 256 * 1024;

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELF_CLASS_64: u8 = 2;
const ELF_DATA_LITTLE: u8 = 1;
const ELF_DATA_BIG: u8 = 2;
const ELF_VERSION_CURRENT: u8 = 1;
/// `e_type`: an executable (`ET_EXEC`) or a position-independent one (`ET_DYN`).
const ELF_TYPES_EXECUTABLE: [u16; 2] = [2, 3];

/// The agents lockstep installs, as (`e_machine`, byte order, Juju's arch); all 64-bit.
/// Juju's agent architectures (`arch.AllSupportedArches`).
const ELF_ARCHES: [(u16, Endianness, &str); 5] = [
    (62, Endianness::Little, "amd64"),    // EM_X86_64
    (183, Endianness::Little, "arm64"),   // EM_AARCH64
    (21, Endianness::Little, "ppc64el"),  // EM_PPC64, little-endian
    (22, Endianness::Big, "s390x"),       // EM_S390, 64-bit
    (243, Endianness::Little, "riscv64"), // EM_RISCV, 64-bit
];

/// ELF's name of a machine, for messages.
fn elf_machine_name(machine: u16) -> &'static str {
    match machine {
        3 => "i386",
        8 => "mips",
        20 => "ppc",
        21 => "ppc64",
        22 => "s390",
        40 => "arm",
        62 => "x86_64",
        183 => "aarch64",
        243 => "riscv",
        _ => "unknown",
    }
}

/// What a marker says: the version the binary was built as and the OS it was built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkedIdentity {
    pub version: Version,
    pub os: String,
}

/// A local agent binary, identified: what it is installed as, and the digest of the bytes
/// read. `binary` is `<version>-<os>-<arch>` with the version of `FORCE-VERSION` when there
/// is one beside it, else the marker's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryIdentity {
    /// The file read.
    pub path: PathBuf,
    /// What it is installed as.
    pub binary: Binary,
    /// The version its marker says it was built as.
    pub built_version: Version,
    /// The version of a `FORCE-VERSION` beside it, which `binary` carries.
    pub forced_version: Option<Version>,
    pub sha256: Sha256,
    pub size_bytes: u64,
}

impl BinaryIdentity {
    /// Refuses a binary built for another architecture than `host_arch` (Juju's name),
    /// naming both and the file.
    pub fn require_arch(&self, host_arch: &str) -> Result<(), DataDirError> {
        if self.binary.arch == host_arch {
            return Ok(());
        }
        Err(DataDirError::Identity {
            path: self.path.clone(),
            problem: IdentityProblem::ForeignArch {
                arch: self.binary.arch.clone(),
                host_arch: host_arch.to_owned(),
            },
        })
    }
}

/// Reads the identity of the agent binary at `path` without running it: the ELF header's
/// architecture, the embedded marker's version and OS, a `FORCE-VERSION` beside it, the
/// size and sha256 (at most [`LOCAL_BINARY_BYTES_MAX`] bytes are read). Every refusal names
/// the file and the offending value.
pub fn read_binary_identity(path: &Path) -> Result<BinaryIdentity, DataDirError> {
    let refused = |problem| DataDirError::Identity {
        path: path.to_path_buf(),
        problem,
    };
    let scan = scan_file(path)?;
    let arch = elf_arch(&scan.header, scan.size_bytes).map_err(refused)?;
    let (marked, marker_offset) = match scan.markers {
        Markers::None => return Err(refused(IdentityProblem::NoMarker)),
        Markers::One { body, offset } => {
            (parse_marker_body(&body, offset).map_err(refused)?, offset)
        }
        Markers::Bad { offset, detail } => {
            return Err(refused(IdentityProblem::BadMarker { offset, detail }));
        }
        Markers::Two {
            first,
            first_offset,
            second,
            second_offset,
        } => {
            return Err(refused(IdentityProblem::TwoMarkers {
                first,
                first_offset,
                second,
                second_offset,
            }));
        }
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let forced_version = read_force_version(directory)?;
    if let Some(forced) = forced_version {
        tracing::info!(
            target: "lockstep::identity",
            path = %path.display(),
            force_version = %directory.join(FORCE_VERSION).display(),
            built = %marked.version,
            version = %forced,
            "FORCE-VERSION beside the agent binary sets its version"
        );
    }
    let version = forced_version.unwrap_or(marked.version);
    let binary = Binary::new(version, &marked.os, arch).map_err(|error| {
        refused(IdentityProblem::BadMarker {
            offset: marker_offset,
            detail: error.to_string(),
        })
    })?;
    Ok(BinaryIdentity {
        path: path.to_path_buf(),
        binary,
        built_version: marked.version,
        forced_version,
        sha256: scan.sha256,
        size_bytes: scan.size_bytes,
    })
}

/// Parses a whole marker (prefix, body, NUL), as [`AGENT_IDENTITY_MARKER`]: `lockstepd`
/// checks its own at start.
pub fn parse_identity_marker(marker: &str) -> Result<MarkedIdentity, IdentityProblem> {
    let bad = |detail: String| IdentityProblem::BadMarker { offset: 0, detail };
    let Some(rest) = marker.as_bytes().strip_prefix(MARKER_PREFIX) else {
        return Err(bad(format!("{} lacks the prefix", quote(marker))));
    };
    let Some(body) = rest.strip_suffix(b"\0") else {
        return Err(bad(format!("{} lacks the final NUL", quote(marker))));
    };
    parse_marker_body(body, 0)
}

/// Juju's FORCE-VERSION: `dir/FORCE-VERSION`, beside the executable, sets the version the
/// binary reports. `None` when there is no such file; its text is trimmed and parsed with
/// [`Version::parse`].
pub fn read_force_version(dir: &Path) -> Result<Option<Version>, DataDirError> {
    let path = dir.join(FORCE_VERSION);
    let Some(bytes) = read_capped(&path, FORCE_VERSION_BYTES_MAX)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes);
    let trimmed = text.trim();
    Version::parse(trimmed)
        .map(Some)
        .map_err(|error| DataDirError::ForceVersion {
            path,
            text: trimmed.to_owned(),
            error: Box::new(error),
        })
}

/// The markers found in a file, up to the second distinct one.
#[derive(Debug, PartialEq, Eq)]
enum Markers {
    None,
    /// One marker body (perhaps repeated identically), and where it was first found.
    One {
        body: Vec<u8>,
        offset: u64,
    },
    /// The first malformed marker: no NUL within [`MARKER_BODY_BYTES_MAX`] bytes.
    Bad {
        offset: u64,
        detail: String,
    },
    /// Two different ones: the scan stops there.
    Two {
        first: String,
        first_offset: u64,
        second: String,
        second_offset: u64,
    },
}

/// One pass over a file: its first bytes, the markers, the sha256 and size.
struct Scan {
    header: Vec<u8>,
    markers: Markers,
    sha256: Sha256,
    size_bytes: u64,
}

fn scan_file(path: &Path) -> Result<Scan, DataDirError> {
    let file = File::open(path).map_err(DataDirError::io(path, "open"))?;
    let metadata = file
        .metadata()
        .map_err(DataDirError::io(path, "read the metadata of"))?;
    if !metadata.is_file() {
        return Err(DataDirError::NotInstalled {
            path: path.to_path_buf(),
            detail: "not a regular file".into(),
        });
    }
    let mut reader = file.take(LOCAL_BINARY_BYTES_MAX + 1);
    let mut hasher = sha2::Sha256::new();
    let mut size_bytes: u64 = 0;
    let mut header = Vec::with_capacity(ELF_HEADER_READ_BYTES);
    let mut finder = MarkerFinder::default();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let count = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(DataDirError::io(path, "read")(error)),
        };
        size_bytes += count as u64;
        if size_bytes > LOCAL_BINARY_BYTES_MAX {
            return Err(DataDirError::TooLarge {
                path: path.to_path_buf(),
                size_bytes_max: LOCAL_BINARY_BYTES_MAX,
            });
        }
        let bytes = &chunk[..count];
        hasher.update(bytes);
        let wanted = ELF_HEADER_READ_BYTES - header.len();
        header.extend_from_slice(&bytes[..wanted.min(count)]);
        finder.feed(bytes, false);
    }
    finder.feed(&[], true);
    Ok(Scan {
        header,
        markers: finder.markers,
        sha256: Sha256(hasher.finalize().into()),
        size_bytes,
    })
}

/// Finds markers in a file fed in chunks: a window keeps the bytes a marker starting in
/// one chunk may need from the next.
#[derive(Debug)]
struct MarkerFinder {
    window: Vec<u8>,
    /// The file offset of `window[0]`.
    window_offset: u64,
    markers: Markers,
}

impl Default for MarkerFinder {
    fn default() -> Self {
        MarkerFinder {
            window: Vec::new(),
            window_offset: 0,
            markers: Markers::None,
        }
    }
}

impl MarkerFinder {
    /// Examines `bytes` after what came before; `at_end` when the file has no more.
    fn feed(&mut self, bytes: &[u8], at_end: bool) {
        if matches!(self.markers, Markers::Two { .. } | Markers::Bad { .. }) {
            return;
        }
        self.window.extend_from_slice(bytes);
        let marker_bytes_max = MARKER_PREFIX.len() + MARKER_BODY_BYTES_MAX + 1;
        let mut search_from = 0;
        // Bytes before this index are examined and need not be kept.
        let examined = loop {
            let Some(found) = memchr::memmem::find(&self.window[search_from..], MARKER_PREFIX)
            else {
                let keep = MARKER_PREFIX.len() - 1;
                break self.window.len().saturating_sub(keep).max(search_from);
            };
            let start = search_from + found;
            if !at_end && self.window.len() < start + marker_bytes_max {
                // The body may continue in the next chunk.
                break start;
            }
            let end = self.window.len().min(start + marker_bytes_max);
            let after = &self.window[start + MARKER_PREFIX.len()..end];
            search_from = start + 1;
            if !after.starts_with(VERSION_KEY) {
                continue;
            }
            let offset = self.window_offset + start as u64;
            let Some(length) = after.iter().position(|&byte| byte == 0) else {
                self.markers = Markers::Bad {
                    offset,
                    detail: format!(
                        "no NUL ends it within {MARKER_BODY_BYTES_MAX} bytes: {}",
                        quote(&String::from_utf8_lossy(after))
                    ),
                };
                return;
            };
            let body = after[..length].to_vec();
            match &self.markers {
                Markers::None => self.markers = Markers::One { body, offset },
                Markers::One {
                    body: first,
                    offset: first_offset,
                } if *first != body => {
                    self.markers = Markers::Two {
                        first: String::from_utf8_lossy(first).into_owned(),
                        first_offset: *first_offset,
                        second: String::from_utf8_lossy(&body).into_owned(),
                        second_offset: offset,
                    };
                    return;
                }
                _ => {}
            }
        };
        self.window.drain(..examined);
        self.window_offset += examined as u64;
    }
}

/// Parses `version=<version>;os=<os>`.
fn parse_marker_body(body: &[u8], offset: u64) -> Result<MarkedIdentity, IdentityProblem> {
    let text = String::from_utf8_lossy(body);
    let bad = |detail: String| IdentityProblem::BadMarker { offset, detail };
    let expected = || format!("{} is not \"version=<version>;os=<os>\"", quote(&text));
    let Some(rest) = text.strip_prefix("version=") else {
        return Err(bad(expected()));
    };
    let Some((version_text, os_field)) = rest.split_once(';') else {
        return Err(bad(expected()));
    };
    let Some(os) = os_field.strip_prefix(OS_KEY) else {
        return Err(bad(expected()));
    };
    let version = Version::parse(version_text).map_err(|error| bad(error.to_string()))?;
    // The OS must make a valid binary name (no separators, bounded).
    Binary::new(version, os, "amd64").map_err(|error| bad(error.to_string()))?;
    Ok(MarkedIdentity {
        version,
        os: os.to_owned(),
    })
}

/// The architecture an ELF header names, by Juju's name; `size_bytes` is the file's.
fn elf_arch(header: &[u8], size_bytes: u64) -> Result<&'static str, IdentityProblem> {
    if header.len() < ELF_HEADER_READ_BYTES {
        if !header.starts_with(ELF_MAGIC) && !ELF_MAGIC.starts_with(header) {
            return Err(IdentityProblem::NotElf {
                first_bytes: escaped(header),
            });
        }
        return Err(IdentityProblem::Truncated { size_bytes });
    }
    if !header.starts_with(ELF_MAGIC) || header[6] != ELF_VERSION_CURRENT {
        return Err(IdentityProblem::NotElf {
            first_bytes: escaped(&header[..16]),
        });
    }
    let endianness = match header[5] {
        ELF_DATA_LITTLE => Endianness::Little,
        ELF_DATA_BIG => Endianness::Big,
        _ => {
            return Err(IdentityProblem::NotElf {
                first_bytes: escaped(&header[..16]),
            });
        }
    };
    let field = |at: usize| {
        let bytes = [header[at], header[at + 1]];
        match endianness {
            Endianness::Little => u16::from_le_bytes(bytes),
            Endianness::Big => u16::from_be_bytes(bytes),
        }
    };
    let e_type = field(16);
    if !ELF_TYPES_EXECUTABLE.contains(&e_type) {
        return Err(IdentityProblem::NotExecutable { e_type });
    }
    let machine = field(18);
    let class_bits = if header[4] == ELF_CLASS_64 { 64 } else { 32 };
    ELF_ARCHES
        .iter()
        .find(|(known, order, _)| {
            *known == machine && *order == endianness && header[4] == ELF_CLASS_64
        })
        .map(|(_, _, arch)| *arch)
        .ok_or(IdentityProblem::UnsupportedArch {
            class_bits,
            endianness,
            machine,
            machine_name: elf_machine_name(machine),
        })
}

/// Bytes for a message: printable ASCII as is, the rest as `\xNN`, in quotes.
fn escaped(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

#[cfg(test)]
mod tests {
    use super::super::layout::AGENT_OS;
    use super::*;

    /// An ELF header: 64-bit unless `class` says otherwise, `e_type` 3 (PIE).
    fn elf_header(class: u8, endianness: Endianness, machine: u16) -> Vec<u8> {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(ELF_MAGIC);
        header[4] = class;
        header[5] = match endianness {
            Endianness::Little => ELF_DATA_LITTLE,
            Endianness::Big => ELF_DATA_BIG,
        };
        header[6] = ELF_VERSION_CURRENT;
        let (e_type, e_machine) = match endianness {
            Endianness::Little => (3u16.to_le_bytes(), machine.to_le_bytes()),
            Endianness::Big => (3u16.to_be_bytes(), machine.to_be_bytes()),
        };
        header[16..18].copy_from_slice(&e_type);
        header[18..20].copy_from_slice(&e_machine);
        header
    }

    /// A file in a fresh directory: an ELF header, padding, then `tail`.
    fn binary_file(header: &[u8], tail: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("lockstepd");
        let mut bytes = header.to_vec();
        bytes.extend_from_slice(&[0u8; 1000]);
        bytes.extend_from_slice(tail);
        bytes.extend_from_slice(&[0u8; 100]);
        std::fs::write(&path, bytes).unwrap();
        (directory, path)
    }

    fn problem(error: DataDirError, path: &Path) -> IdentityProblem {
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()),
            "the refusal names the file: {message}"
        );
        match error {
            DataDirError::Identity { problem, .. } => problem,
            other => panic!("not an identity refusal: {other}"),
        }
    }

    const MARKER: &[u8] = b"LOCKSTEP-AGENT-IDENTITY:v1:version=2.9.43;os=ubuntu\0";

    #[test]
    fn this_builds_marker_names_the_crates_version_and_the_agents_os() {
        let marked = parse_identity_marker(AGENT_IDENTITY_MARKER).unwrap();
        assert_eq!(marked.version, crate::steps::build_version());
        assert_eq!(marked.os, AGENT_OS);
    }

    #[test]
    fn an_aarch64_elf_header_is_arm64_with_the_markers_version_and_os() {
        let (_directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 183), MARKER);
        let identity = read_binary_identity(&path).unwrap();
        assert_eq!(identity.binary.to_string(), "2.9.43-ubuntu-arm64");
        assert_eq!(identity.built_version, Version::new(2, 9, 43));
        assert_eq!(identity.forced_version, None);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(identity.size_bytes, bytes.len() as u64);
        assert_eq!(
            identity.sha256.0,
            <[u8; 32]>::from(sha2::Sha256::digest(&bytes))
        );
    }

    #[test]
    fn each_supported_elf_machine_has_its_juju_arch() {
        for (machine, endianness, arch) in ELF_ARCHES {
            let header = elf_header(ELF_CLASS_64, endianness, machine);
            assert_eq!(elf_arch(&header, 64), Ok(arch), "e_machine {machine}");
        }
    }

    #[test]
    fn a_32_bit_or_wrongly_ordered_executable_is_refused_naming_class_order_and_machine() {
        let cases = [
            (
                1,
                Endianness::Little,
                3,
                "32-bit little-endian ELF executable for i386",
            ),
            (
                1,
                Endianness::Little,
                40,
                "32-bit little-endian ELF executable for arm",
            ),
            (
                1,
                Endianness::Little,
                62,
                "32-bit little-endian ELF executable for x86_64",
            ),
            (
                ELF_CLASS_64,
                Endianness::Big,
                21,
                "64-bit big-endian ELF executable for ppc64",
            ),
            (
                ELF_CLASS_64,
                Endianness::Little,
                22,
                "64-bit little-endian ELF executable for s390",
            ),
            (
                ELF_CLASS_64,
                Endianness::Little,
                8,
                "for mips (e_machine 8)",
            ),
        ];
        for (class, endianness, machine, expected) in cases {
            let (_directory, path) = binary_file(&elf_header(class, endianness, machine), MARKER);
            let error = read_binary_identity(&path).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(
                    problem(error, &path),
                    IdentityProblem::UnsupportedArch { machine: m, .. } if m == machine
                ),
                "{message}"
            );
            assert!(message.contains(expected), "{expected}: {message}");
        }
    }

    #[test]
    fn force_version_beside_the_binary_sets_its_version() {
        let (directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 62), MARKER);
        std::fs::write(directory.path().join("FORCE-VERSION"), " 2.9.44\n").unwrap();
        let identity = read_binary_identity(&path).unwrap();
        assert_eq!(identity.binary.to_string(), "2.9.44-ubuntu-amd64");
        assert_eq!(identity.built_version, Version::new(2, 9, 43));
        assert_eq!(identity.forced_version, Some(Version::new(2, 9, 44)));
    }

    #[test]
    fn a_force_version_that_is_not_a_version_is_refused_naming_its_file_and_text() {
        let (directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 62), MARKER);
        let force = directory.path().join("FORCE-VERSION");
        std::fs::write(&force, "latest\n").unwrap();
        let message = read_binary_identity(&path).unwrap_err().to_string();
        assert!(message.contains(&force.display().to_string()), "{message}");
        assert!(message.contains("\"latest\""), "{message}");
    }

    #[test]
    fn a_file_without_a_marker_is_refused_naming_the_file() {
        let (_directory, path) = binary_file(
            &elf_header(ELF_CLASS_64, Endianness::Little, 62),
            // The prefix alone, as the reader's own code holds it, is no marker.
            b"LOCKSTEP-AGENT-IDENTITY:v1:something else",
        );
        let error = read_binary_identity(&path).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("no lockstep agent identity marker")
        );
        assert_eq!(problem(error, &path), IdentityProblem::NoMarker);
    }

    #[test]
    fn two_different_markers_are_refused_quoting_both() {
        let mut tail = MARKER.to_vec();
        tail.extend_from_slice(b"padding");
        tail.extend_from_slice(MARKER);
        tail.extend_from_slice(b"LOCKSTEP-AGENT-IDENTITY:v1:version=2.9.44;os=ubuntu\0");
        let (_directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 62), &tail);
        let error = read_binary_identity(&path).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(problem(error, &path), IdentityProblem::TwoMarkers { .. }),
            "{message}"
        );
        assert!(
            message.contains("\"version=2.9.43;os=ubuntu\"")
                && message.contains("\"version=2.9.44;os=ubuntu\""),
            "{message}"
        );
    }

    #[test]
    fn a_malformed_marker_is_refused_quoting_it() {
        for (tail, expected) in [
            (
                &b"LOCKSTEP-AGENT-IDENTITY:v1:version=2.9.x;os=ubuntu\0"[..],
                "\"2.9.x\"",
            ),
            (
                b"LOCKSTEP-AGENT-IDENTITY:v1:version=2.9.43\0",
                "\"version=2.9.43\" is not",
            ),
            (
                b"LOCKSTEP-AGENT-IDENTITY:v1:version=2.9.43;os=ubu/ntu\0",
                "ubu/ntu",
            ),
        ] {
            let (_directory, path) =
                binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 62), tail);
            let error = read_binary_identity(&path).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(problem(error, &path), IdentityProblem::BadMarker { .. }),
                "{message}"
            );
            assert!(message.contains(expected), "{expected}: {message}");
        }
        let mut endless = b"LOCKSTEP-AGENT-IDENTITY:v1:version=".to_vec();
        endless.extend_from_slice(&[b'1'; 200]);
        let (_directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 62), &endless);
        let message = read_binary_identity(&path).unwrap_err().to_string();
        assert!(
            message.contains("no NUL ends it within 128 bytes"),
            "{message}"
        );
    }

    #[test]
    fn a_truncated_or_non_elf_file_is_refused_naming_the_file() {
        let directory = tempfile::tempdir().unwrap();
        let script = directory.path().join("script");
        let mut bytes = b"#!/bin/sh\necho hello\n".to_vec();
        bytes.extend_from_slice(MARKER);
        std::fs::write(&script, &bytes).unwrap();
        let error = read_binary_identity(&script).unwrap_err();
        let message = error.to_string();
        assert_eq!(
            problem(error, &script),
            IdentityProblem::NotElf {
                first_bytes: "\"#!/bin/sh\\necho h\"".into()
            },
            "{message}"
        );

        let truncated = directory.path().join("truncated");
        std::fs::write(
            &truncated,
            &elf_header(ELF_CLASS_64, Endianness::Little, 62)[..12],
        )
        .unwrap();
        let error = read_binary_identity(&truncated).unwrap_err();
        assert_eq!(
            problem(error, &truncated),
            IdentityProblem::Truncated { size_bytes: 12 }
        );

        let empty = directory.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let error = read_binary_identity(&empty).unwrap_err();
        assert_eq!(
            problem(error, &empty),
            IdentityProblem::Truncated { size_bytes: 0 }
        );

        let error = read_binary_identity(directory.path()).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }

    #[test]
    fn an_object_file_is_refused_as_not_an_executable() {
        let mut header = elf_header(ELF_CLASS_64, Endianness::Little, 62);
        header[16..18].copy_from_slice(&1u16.to_le_bytes());
        let (_directory, path) = binary_file(&header, MARKER);
        let error = read_binary_identity(&path).unwrap_err();
        assert_eq!(
            problem(error, &path),
            IdentityProblem::NotExecutable { e_type: 1 }
        );
    }

    #[test]
    fn a_marker_across_two_chunks_is_found_once() {
        // Every split of a marker between two chunks, and a repeat of it, is one marker.
        let mut file = vec![b'x'; 10];
        file.extend_from_slice(MARKER);
        file.extend_from_slice(b"yy");
        file.extend_from_slice(MARKER);
        for split in 0..file.len() {
            let mut finder = MarkerFinder::default();
            finder.feed(&file[..split], false);
            finder.feed(&file[split..], false);
            finder.feed(&[], true);
            assert_eq!(
                finder.markers,
                Markers::One {
                    body: b"version=2.9.43;os=ubuntu".to_vec(),
                    offset: 10
                },
                "split at {split}"
            );
        }
    }

    #[test]
    fn a_binary_for_another_arch_is_refused_naming_both_arches_and_the_file() {
        let (_directory, path) =
            binary_file(&elf_header(ELF_CLASS_64, Endianness::Little, 183), MARKER);
        let identity = read_binary_identity(&path).unwrap();
        assert!(identity.require_arch("arm64").is_ok());
        let error = identity.require_arch("amd64").unwrap_err();
        let message = error.to_string();
        assert_eq!(
            problem(error, &path),
            IdentityProblem::ForeignArch {
                arch: "arm64".into(),
                host_arch: "amd64".into()
            }
        );
        assert!(
            message.contains("built for arm64, but this host is amd64"),
            "{message}"
        );
    }
}
