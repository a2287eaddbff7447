//! Errors. Each names the file (or mirror path), the field and the offending value, and
//! says what to do next.

use std::fmt;
use std::io;

use lockstep_core::policy::{PolicyError, Sha256};

/// The most characters of an offending value quoted in a message: a multi-megabyte bad
/// field must not become a multi-megabyte log line.
pub const QUOTE_LENGTH_MAX: usize = 100;

/// Quotes `text` for a message: Rust string syntax, cut so that at most
/// [`QUOTE_LENGTH_MAX`] characters of its escaped form are shown (a control character
/// escapes to several, so counting the input's would let 100 NULs make 200).
pub(crate) fn quote(text: &str) -> String {
    let mut shown = String::new();
    let mut cut = false;
    for c in text.chars() {
        let escaped: String = c.escape_debug().collect();
        if shown.chars().count() + escaped.chars().count() > QUOTE_LENGTH_MAX {
            cut = true;
            break;
        }
        shown.push_str(&escaped);
    }
    if cut {
        format!("\"{shown}\"... ({} characters)", text.chars().count())
    } else {
        format!("\"{shown}\"")
    }
}

/// Quotes a JSON value: its JSON text, cut to [`QUOTE_LENGTH_MAX`] characters.
pub(crate) fn quote_json(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => quote(text),
        other => {
            let text = other.to_string();
            if text.chars().count() <= QUOTE_LENGTH_MAX {
                text
            } else {
                let cut: String = text.chars().take(QUOTE_LENGTH_MAX).collect();
                format!("{cut}... ({} characters)", text.chars().count())
            }
        }
    }
}

/// A simplestreams document, or one item in it, that cannot be used.
///
/// Whole documents that are refused (malformed JSON, a wrong `format`, a products file that
/// another index named) are returned as errors; single items that cannot be verified are
/// reported in [`crate::Lookup::rejected`] with the same type while the rest of the
/// catalogue stays usable.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MetadataError {
    /// The document, as a path relative to the metadata source
    /// (`streams/v1/index2.json`).
    pub file: String,
    /// Where in the document, as a JSON path
    /// (`products["com.ubuntu.juju:ubuntu:amd64"].versions["20240101"].items["a"].sha256`);
    /// `(document)` for the document as a whole.
    pub field: String,
    /// The offending value, quoted (at most [`QUOTE_LENGTH_MAX`] characters), or
    /// `(missing)`.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for MetadataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} {}: {}",
            self.file, self.field, self.value, self.problem
        )
    }
}

impl std::error::Error for MetadataError {}

/// Which rule of an HTTP source refused a redirect.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RedirectRule {
    /// Redirects are followed only to `https://`.
    HttpsOnly,
    /// Redirects are followed only on the mirror's own host, unless
    /// [`crate::HttpConfig::redirect_to_other_hosts`].
    SameHost,
    /// At most five redirects per fetch.
    TooMany,
}

/// A fetch from a [`crate::Source`] failed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SourceError {
    /// The path is not a safe relative path inside the source (`../x`, `/abs`, ...).
    InvalidPath {
        /// The source, e.g. `file:///srv/mirror/tools`.
        location: String,
        /// The path asked for (quoted).
        path: String,
        /// Why it was refused.
        problem: &'static str,
    },
    /// Nothing at that path.
    NotFound {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
    },
    /// More bytes than the fetch allows.
    TooLarge {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// The cap of this fetch.
        size_bytes_max: u64,
        /// The size the source announced, when it did (a file's length).
        announced_size_bytes: Option<u64>,
    },
    /// The source sent less than the fetch's minimum throughput over one measuring
    /// window: a stalled or deliberately slow mirror (TUF's slow-retrieval attack).
    TooSlow {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// Bytes received in the window.
        window_bytes: u64,
        /// The window, in milliseconds.
        window_milliseconds: u64,
        /// The minimum throughput configured.
        throughput_min_bytes_per_second: u64,
    },
    /// The fetch, all attempts included, did not finish before its deadline.
    DeadlineExceeded {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// The deadline, in milliseconds from the start of the fetch.
        deadline_milliseconds: u64,
        /// Bytes received when it passed.
        received_bytes: u64,
    },
    /// The server answered with an HTTP status that is not a success.
    Status {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// The HTTP status code.
        status: u16,
        /// The wait the server asked for (`Retry-After` in seconds, on a 429 or 503), if
        /// it did.
        retry_after_seconds: Option<u64>,
    },
    /// The server's answer breaks HTTP in a way that matters here (a `Content-Range` that
    /// does not match the range asked for).
    Protocol {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// What was wrong, with the offending value.
        problem: String,
    },
    /// The server redirected the fetch where this source does not follow: to plain http,
    /// to another host (unless configured), or too many times.
    RedirectRefused {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// The rule that refused it.
        rule: RedirectRule,
        /// Where the redirect pointed and why it was refused.
        problem: String,
    },
    /// Any other I/O failure.
    Io {
        /// The source.
        location: String,
        /// The path asked for.
        path: String,
        /// The kind of failure.
        kind: io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::InvalidPath {
                location,
                path,
                problem,
            } => write!(
                f,
                "refused to fetch {path} from {location}: {problem}; the metadata names a \
                 path outside the mirror: regenerate the mirror's metadata"
            ),
            SourceError::NotFound { location, path } => write!(
                f,
                "{path} not found at {location}; check agent-metadata-url and that the \
                 mirror is complete"
            ),
            SourceError::TooLarge {
                location,
                path,
                size_bytes_max,
                announced_size_bytes,
            } => {
                write!(
                    f,
                    "{path} at {location} is larger than the {size_bytes_max} bytes allowed"
                )?;
                if let Some(size) = announced_size_bytes {
                    write!(f, " ({size} bytes)")?;
                }
                f.write_str(
                    "; refused; check the mirror, or raise the limit if the file is genuine",
                )
            }
            SourceError::TooSlow {
                location,
                path,
                window_bytes,
                window_milliseconds,
                throughput_min_bytes_per_second,
            } => write!(
                f,
                "{path} from {location}: only {window_bytes} bytes in {window_milliseconds} ms, \
                 below the minimum of {throughput_min_bytes_per_second} bytes/s; the mirror \
                 stalls or is too slow (slow-retrieval attack?): use another mirror or lower \
                 the minimum throughput"
            ),
            SourceError::DeadlineExceeded {
                location,
                path,
                deadline_milliseconds,
                received_bytes,
            } => write!(
                f,
                "{path} from {location}: not done within the deadline of \
                 {deadline_milliseconds} ms ({received_bytes} bytes received); use a faster \
                 mirror or raise the deadline"
            ),
            SourceError::Status {
                location,
                path,
                status,
                ..
            } => write!(
                f,
                "{path} from {location}: the server answered HTTP {status}; check \
                 agent-metadata-url and the mirror"
            ),
            SourceError::Protocol {
                location,
                path,
                problem,
            } => write!(f, "{path} from {location}: {problem}"),
            SourceError::RedirectRefused {
                location,
                path,
                problem,
                ..
            } => write!(f, "{path} from {location}: {problem}"),
            SourceError::Io {
                location,
                path,
                kind,
                message,
            } => write!(
                f,
                "cannot read {path} from {location}: {message} ({kind:?})"
            ),
        }
    }
}

impl std::error::Error for SourceError {}

/// The persisted high-water mark cannot be read or written.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StateError {
    /// The mark file.
    pub path: String,
    /// What went wrong.
    pub problem: String,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "streams high-water mark {}: {}", self.path, self.problem)
    }
}

impl std::error::Error for StateError {}

/// Why a catalogue lookup failed. Nothing is remembered when it fails.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum LookupError {
    /// A metadata file could not be fetched.
    Source(SourceError),
    /// A metadata document was refused as a whole.
    Metadata(MetadataError),
    /// A freshness guard refused the metadata (rollback, freeze) or the catalogue could not
    /// be built.
    Policy {
        /// The document the guard refused.
        file: String,
        /// The core's verdict, which names the values and the attack (boxed: it is large
        /// and cold).
        error: Box<PolicyError>,
    },
    /// The index lists no agent-binary content (`com.ubuntu.juju:<stream>:agents` or
    /// `...:tools`).
    NoAgentMetadata {
        /// The index read.
        file: String,
    },
    /// The high-water mark could not be read or written.
    State(StateError),
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::Source(error) => error.fmt(f),
            LookupError::Metadata(error) => error.fmt(f),
            LookupError::Policy { file, error } => write!(f, "{file}: {error}"),
            LookupError::NoAgentMetadata { file } => write!(
                f,
                "{file} lists no agent binaries (no content id com.ubuntu.juju:<stream>:agents \
                 or com.ubuntu.juju:<stream>:tools of datatype content-download); point \
                 agent-metadata-url at an agent-binary mirror"
            ),
            LookupError::State(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LookupError {}

impl From<SourceError> for LookupError {
    fn from(error: SourceError) -> LookupError {
        LookupError::Source(error)
    }
}

impl From<MetadataError> for LookupError {
    fn from(error: MetadataError) -> LookupError {
        LookupError::Metadata(error)
    }
}

impl From<StateError> for LookupError {
    fn from(error: StateError) -> LookupError {
        LookupError::State(error)
    }
}

/// Why a verified download failed. In every case the temporary file is deleted and nothing
/// is installed at the destination.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DownloadError {
    /// The binary could not be fetched.
    Source(SourceError),
    /// The source sent more bytes than the catalogue declared.
    TooLong {
        /// The binary's path in the source.
        path: String,
        /// Size declared by the catalogue.
        expected_size_bytes: u64,
        /// The source had at least this many bytes.
        actual_size_bytes_min: u64,
    },
    /// The source sent fewer bytes than the catalogue declared.
    Truncated {
        /// The binary's path in the source.
        path: String,
        /// Size declared by the catalogue.
        expected_size_bytes: u64,
        /// Bytes received.
        actual_size_bytes: u64,
    },
    /// The right number of bytes with the wrong digest.
    HashMismatch {
        /// The binary's path in the source.
        path: String,
        /// Digest declared by the catalogue.
        expected_sha256: Sha256,
        /// Digest of the bytes received.
        actual_sha256: Sha256,
    },
    /// The destination could not be written.
    Destination {
        /// The destination file.
        path: String,
        /// What went wrong.
        problem: String,
    },
}

impl fmt::Display for DownloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownloadError::Source(error) => write!(f, "{error}; nothing was installed"),
            DownloadError::TooLong {
                path,
                expected_size_bytes,
                actual_size_bytes_min,
            } => write!(
                f,
                "{path}: expected {expected_size_bytes} bytes, the mirror sent at least \
                 {actual_size_bytes_min}; refused, nothing was installed; the mirror's \
                 binary and its metadata disagree: regenerate the metadata or restore the file"
            ),
            DownloadError::Truncated {
                path,
                expected_size_bytes,
                actual_size_bytes,
            } => write!(
                f,
                "{path}: expected {expected_size_bytes} bytes, the mirror sent \
                 {actual_size_bytes}; refused, nothing was installed; the file on the mirror \
                 is truncated or the transfer was cut: retry, or restore the file"
            ),
            DownloadError::HashMismatch {
                path,
                expected_sha256,
                actual_sha256,
            } => write!(
                f,
                "{path}: expected sha256 {expected_sha256}, got {actual_sha256}; refused, \
                 nothing was installed; the binary was altered or corrupted: restore it from \
                 a trusted copy"
            ),
            DownloadError::Destination { path, problem } => {
                write!(f, "cannot write {path}: {problem}; nothing was installed")
            }
        }
    }
}

impl std::error::Error for DownloadError {}

impl From<SourceError> for DownloadError {
    fn from(error: SourceError) -> DownloadError {
        DownloadError::Source(error)
    }
}

/// Why the mirror generator failed. Metadata files already written stay consistent: each
/// is replaced atomically.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GenerateError {
    /// The file or directory concerned.
    pub path: String,
    /// What went wrong, and what to do.
    pub problem: String,
}

impl fmt::Display for GenerateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

impl std::error::Error for GenerateError {}
