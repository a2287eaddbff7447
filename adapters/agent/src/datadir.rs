//! The agent's data directory, laid out as Juju's `/var/lib/juju`.
//!
//! ```text
//! <root>/                              e.g. /var/lib/lockstep
//! ├── agent.conf                       AgentConf, YAML, 0600: identity, API, the snapshot
//! ├── controller.yaml                  the controller's bootstrap configuration (controllers)
//! ├── store.db                         the controllers' shared state, SQLite (controllers)
//! ├── ca.pem                           the controller's CA certificate
//! ├── server.pem                       the API server's certificate
//! ├── server-key.pem                   its private key, 0600
//! ├── streams-mark.json                simplestreams high-water mark (never moves back)
//! ├── logs/                            the daemon's logs
//! ├── cache/
//! │   └── tools/
//! │       └── juju-2.9.43-ubuntu-amd64.tgz   tarballs a controller serves to its agents
//! └── tools/
//!     ├── 2.9.43-ubuntu-amd64/         one directory per installed binary
//!     │   ├── lockstepd                the executable
//!     │   ├── downloaded-tools.txt     DownloadedTools, JSON: version, url, sha256, size
//!     │   └── FORCE-VERSION            optional: the version this binary reports
//!     ├── 2.9.44-ubuntu-amd64/
//!     └── machine-0 -> 2.9.43-ubuntu-amd64   the agent's current binary, switched atomically
//! ```
//!
//! As in Juju, an agent runs `tools/<tag>/lockstepd` and an upgrade installs the new
//! binary beside the old one, then points `tools/<tag>` at it with one `rename`, so a crash
//! leaves the old or the new link and never none. Every file the agent itself writes is
//! replaced atomically ([`lockstep_fs`]: temporary file in the same directory,
//! fsync, rename, fsync of the directory; CONTRACT.md, "Where state lives"), and every
//! binary directory is assembled under a temporary name in `tools/` and renamed into place
//! only when complete.
//!
//! Every error names the file and the offending value.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lockstep_core::lifecycle::{Snapshot, Trial};
use lockstep_core::policy::Sha256;
use lockstep_core::steps::StepKey;
use lockstep_core::version::{Binary, ParseVersionError, Version};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::unpack::{UnpackError, UnpackLimits, unpack_tgz};

/// The agent's configuration and snapshot.
pub const AGENT_CONF: &str = "agent.conf";
/// The controller's bootstrap configuration.
pub const CONTROLLER_CONFIG: &str = "controller.yaml";
/// The SQLite store.
pub const STORE: &str = "store.db";
/// The controller's CA certificate (PEM).
pub const CA_CERT: &str = "ca.pem";
/// The API server's certificate (PEM).
pub const SERVER_CERT: &str = "server.pem";
/// The API server's private key (PEM).
pub const SERVER_KEY: &str = "server-key.pem";
/// The simplestreams high-water mark.
pub const STREAMS_MARK: &str = "streams-mark.json";
/// Logs.
pub const LOGS: &str = "logs";
/// Installed binaries and the agents' links.
pub const TOOLS: &str = "tools";
/// The executable in a binary directory (Juju's `jujud`).
pub const EXECUTABLE: &str = "lockstepd";
/// A binary's provenance, in its directory (Juju's name).
pub const DOWNLOADED_TOOLS: &str = "downloaded-tools.txt";
/// The version a binary reports, beside its executable (Juju's name).
pub const FORCE_VERSION: &str = "FORCE-VERSION";

/// Largest `agent.conf` read: a few kilobytes in practice (a CA certificate is the bulk).
pub const AGENT_CONF_BYTES_MAX: u64 = 1024 * 1024;
/// Largest `downloaded-tools.txt` read.
pub const DOWNLOADED_TOOLS_BYTES_MAX: u64 = 64 * 1024;
/// Largest `FORCE-VERSION` read.
pub const FORCE_VERSION_BYTES_MAX: u64 = 1024;
/// Largest local executable installed by [`DataDir::install_local_binary`].
pub const LOCAL_BINARY_BYTES_MAX: u64 = UnpackLimits::TOTAL_BYTES_MAX_DEFAULT;
/// Longest agent tag.
pub const TAG_LENGTH_MAX: usize = 64;

/// Prefixes of the temporary entries made in `tools/`; none is a valid tag or binary.
const STAGING_PREFIX: &str = ".install-";
const REPLACED_PREFIX: &str = ".replaced-";
const SWITCH_PREFIX: &str = ".switch-";
/// Attempts at a fresh random name for a temporary symlink.
const SWITCH_NAME_ATTEMPTS_MAX: usize = 8;

/// The most characters of an offending value quoted in a message.
pub(crate) const QUOTE_LENGTH_MAX: usize = 100;

/// Quotes `text` for a message: Rust string syntax, cut to [`QUOTE_LENGTH_MAX`] characters.
pub(crate) fn quote(text: &str) -> String {
    let length = text.chars().count();
    if length <= QUOTE_LENGTH_MAX {
        format!("{text:?}")
    } else {
        let cut: String = text.chars().take(QUOTE_LENGTH_MAX).collect();
        format!("{cut:?}... ({length} characters)")
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Something in the data directory that cannot be read, written or trusted.
#[derive(Debug)]
pub enum DataDirError {
    /// A system call failed on `path`.
    Io {
        path: PathBuf,
        action: &'static str,
        error: io::Error,
    },
    /// A file whose content cannot be parsed or is not valid.
    Malformed { path: PathBuf, detail: String },
    /// An `agent.conf` written by a newer lockstep.
    NewerFormat { path: PathBuf, detail: String },
    /// A file larger than lockstep ever writes.
    TooLarge { path: PathBuf, size_bytes_max: u64 },
    /// An agent tag that is not `[a-z][a-z0-9-]*`.
    BadTag { tag: String },
    /// A binary whose release or arch would not be a plain directory name.
    BadBinary { binary: String },
    /// An agent link (`tools/<tag>`) that is not a symlink to a binary directory.
    BadLink {
        path: PathBuf,
        target: String,
        detail: String,
    },
    /// A `FORCE-VERSION` file whose text is not a version.
    ForceVersion {
        path: PathBuf,
        text: String,
        error: Box<ParseVersionError>,
    },
    /// A binary directory without a usable executable.
    NotInstalled { path: PathBuf, detail: String },
    /// A file that is not what its description says (size, sha256, version).
    Mismatch {
        path: PathBuf,
        what: &'static str,
        expected: String,
        actual: String,
    },
    /// The tarball could not be unpacked.
    Unpack(UnpackError),
    /// A file could not be replaced atomically, or a directory fsynced.
    Write(lockstep_fs::AtomicWriteError),
}

impl DataDirError {
    fn io(path: &Path, action: &'static str) -> impl FnOnce(io::Error) -> DataDirError + use<> {
        let path = path.to_path_buf();
        move |error| DataDirError::Io {
            path,
            action,
            error,
        }
    }
}

impl fmt::Display for DataDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataDirError::Io {
                path,
                action,
                error,
            } => write!(f, "cannot {action} {}: {error}", path.display()),
            DataDirError::Malformed { path, detail } => {
                write!(f, "{} is malformed: {detail}", path.display())
            }
            DataDirError::NewerFormat { path, detail } => write!(f, "{}: {detail}", path.display()),
            DataDirError::TooLarge {
                path,
                size_bytes_max,
            } => write!(
                f,
                "{} is larger than {size_bytes_max} bytes; lockstep never writes one so large",
                path.display()
            ),
            DataDirError::BadTag { tag } => write!(
                f,
                "invalid agent tag {}: expected 1 to {TAG_LENGTH_MAX} characters of a-z, 0-9 \
                 and '-', starting with a letter and not ending with '-' (e.g. machine-0)",
                quote(tag)
            ),
            DataDirError::BadBinary { binary } => write!(
                f,
                "invalid binary {}: not a plain <version>-<release>-<arch> name",
                quote(binary)
            ),
            DataDirError::BadLink {
                path,
                target,
                detail,
            } => write!(
                f,
                "agent link {} -> {}: {detail}",
                path.display(),
                quote(target)
            ),
            DataDirError::ForceVersion { path, text, error } => write!(
                f,
                "{} holds {}, which is not a version: {error}",
                path.display(),
                quote(text)
            ),
            DataDirError::NotInstalled { path, detail } => {
                write!(f, "no usable agent binary at {}: {detail}", path.display())
            }
            DataDirError::Mismatch {
                path,
                what,
                expected,
                actual,
            } => write!(
                f,
                "{}: {what} is {actual}, expected {expected}",
                path.display()
            ),
            DataDirError::Unpack(error) => error.fmt(f),
            DataDirError::Write(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for DataDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DataDirError::Io { error, .. } => Some(error),
            DataDirError::ForceVersion { error, .. } => Some(error.as_ref()),
            DataDirError::Unpack(error) => Some(error),
            DataDirError::Write(error) => Some(error),
            _ => None,
        }
    }
}

impl From<UnpackError> for DataDirError {
    fn from(error: UnpackError) -> DataDirError {
        DataDirError::Unpack(error)
    }
}

// ---------------------------------------------------------------------------------------
// agent.conf
// ---------------------------------------------------------------------------------------

/// What `agent.conf` holds: the agent's identity, how to reach the API, and the lifecycle
/// [`Snapshot`]. Keys are Juju's where Juju has them (`tag`, `controller`, `model`,
/// `upgradedToVersion`, `apiaddresses`, `cacert`); the rest are lockstep's, kebab-case.
///
/// `upgradedToVersion` is the snapshot's `upgraded_to_version`; no other key holds it.
/// Keys this version does not know are ignored, not refused: after a failed upgrade the
/// previous binary must read what the new one wrote in the same format. A newer format is
/// refused (see [`Snapshot::check_format`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct AgentConf {
    /// The snapshot's format (`Snapshot::FORMAT` when written by this version).
    pub format: u32,
    /// Juju's agent tag, e.g. `machine-0`.
    pub tag: String,
    /// The controller's uuid.
    pub controller: String,
    /// The model's uuid.
    pub model: String,
    /// This controller's index among the model's controllers.
    #[serde(rename = "controller-id", default)]
    pub controller_id: u8,
    /// The `host:port` the daemon's API listens on.
    #[serde(rename = "api-listen", default)]
    pub api_listen: String,
    /// The controllers' API addresses, `host:port`.
    #[serde(default)]
    pub apiaddresses: Vec<String>,
    /// The controller's CA certificate, PEM (written as a `|` block, as Juju does).
    #[serde(default, serialize_with = "literal_block")]
    pub cacert: String,
    /// Juju's `upgradedToVersion`: the snapshot's `upgraded_to_version`.
    #[serde(rename = "upgradedToVersion")]
    pub upgraded_to_version: Version,
    /// The binary that ran before the current one, kept for falling back.
    #[serde(rename = "previous-binary", default)]
    pub previous_binary: Option<Binary>,
    /// A switch to a new binary not yet proven.
    #[serde(default)]
    pub trial: Option<Trial>,
    /// Host steps of the current upgrade already run on this machine.
    #[serde(rename = "host-checkpoints", default)]
    pub host_checkpoints: Vec<StepKey>,
    /// Set once the agent first reached Ready.
    #[serde(rename = "bootstrap-complete", default)]
    pub bootstrap_complete: bool,
    /// The engine holding the controllers' shared state (`sqlite`, the default, or `etcd`).
    #[serde(default, skip_serializing_if = "crate::store::StoreEngine::is_sqlite")]
    pub store: crate::store::StoreEngine,
    /// etcd's client URLs, when `store` is `etcd`.
    #[serde(
        rename = "etcd-endpoints",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub etcd_endpoints: Vec<String>,
    /// The prefix of every key of this controller's state in etcd.
    #[serde(
        rename = "etcd-prefix",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub etcd_prefix: String,
    /// TLS to etcd: the CA of its members (PEM file), as etcdctl's `--cacert`.
    #[serde(
        rename = "etcd-cacert",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub etcd_cacert: Option<PathBuf>,
    /// This controller's client certificate for etcd (PEM file), as etcdctl's `--cert`.
    #[serde(rename = "etcd-cert", default, skip_serializing_if = "Option::is_none")]
    pub etcd_cert: Option<PathBuf>,
    /// Its private key (PEM file), as etcdctl's `--key`.
    #[serde(rename = "etcd-key", default, skip_serializing_if = "Option::is_none")]
    pub etcd_key: Option<PathBuf>,
}

impl AgentConf {
    /// A configuration for `tag` holding `snapshot`; the other fields empty, to be set.
    pub fn new(tag: &str, snapshot: Snapshot) -> AgentConf {
        let mut conf = AgentConf {
            format: snapshot.format,
            tag: tag.to_owned(),
            controller: String::new(),
            model: String::new(),
            controller_id: 0,
            api_listen: String::new(),
            apiaddresses: Vec::new(),
            cacert: String::new(),
            upgraded_to_version: Version::ZERO,
            previous_binary: None,
            trial: None,
            host_checkpoints: Vec::new(),
            bootstrap_complete: false,
            store: crate::store::StoreEngine::Sqlite,
            etcd_endpoints: Vec::new(),
            etcd_prefix: String::new(),
            etcd_cacert: None,
            etcd_cert: None,
            etcd_key: None,
        };
        conf.set_snapshot(snapshot);
        conf
    }

    /// The lifecycle snapshot held.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            format: self.format,
            upgraded_to_version: self.upgraded_to_version,
            host_checkpoints: self.host_checkpoints.clone(),
            previous: self.previous_binary.clone(),
            trial: self.trial.clone(),
            bootstrap_complete: self.bootstrap_complete,
        }
    }

    /// Replaces the lifecycle snapshot held; identity and API fields are kept.
    pub fn set_snapshot(&mut self, snapshot: Snapshot) {
        let Snapshot {
            format,
            upgraded_to_version,
            host_checkpoints,
            previous,
            trial,
            bootstrap_complete,
        } = snapshot;
        self.format = format;
        self.upgraded_to_version = upgraded_to_version;
        self.host_checkpoints = host_checkpoints;
        self.previous_binary = previous;
        self.trial = trial;
        self.bootstrap_complete = bootstrap_complete;
    }

    /// Parses `agent.conf` text; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<AgentConf, DataDirError> {
        let malformed = |detail: String| DataDirError::Malformed {
            path: path.to_path_buf(),
            detail,
        };
        // The format first, alone: a newer format is refused with its own message rather
        // than with whatever its new shape fails to parse as.
        #[derive(Deserialize)]
        struct FormatOnly {
            format: Option<u32>,
        }
        // Errors without a source snippet: one line in the log, which names the file.
        let options = || serde_saphyr::Options {
            with_snippet: false,
            ..serde_saphyr::Options::default()
        };
        let format = serde_saphyr::from_str_with_options::<FormatOnly>(text, options())
            .map_err(|error| malformed(error.to_string()))?
            .format
            .ok_or_else(|| malformed("no `format` key".into()))?;
        let probe = Snapshot {
            format,
            upgraded_to_version: Version::ZERO,
            host_checkpoints: Vec::new(),
            previous: None,
            trial: None,
            bootstrap_complete: false,
        };
        probe
            .check_format()
            .map_err(|detail| DataDirError::NewerFormat {
                path: path.to_path_buf(),
                detail,
            })?;
        let conf: AgentConf = serde_saphyr::from_str_with_options(text, options())
            .map_err(|error| malformed(error.to_string()))?;
        check_tag(&conf.tag).map_err(|error| malformed(error.to_string()))?;
        Ok(conf)
    }

    /// The YAML text written to `agent.conf`.
    pub fn to_yaml(&self) -> Result<String, DataDirError> {
        serde_saphyr::to_string(self).map_err(|error| DataDirError::Malformed {
            path: PathBuf::from(AGENT_CONF),
            detail: format!("cannot serialise: {error}"),
        })
    }
}

/// A multi-line string as a YAML literal block (`|`), readable as the PEM it is.
fn literal_block<S: serde::Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
    if text.contains('\n') {
        serde_saphyr::LitStr(text).serialize(serializer)
    } else {
        serializer.serialize_str(text)
    }
}

// ---------------------------------------------------------------------------------------
// downloaded-tools.txt
// ---------------------------------------------------------------------------------------

/// A binary's provenance, `downloaded-tools.txt` in its directory, JSON with Juju's keys.
/// `sha256` and `size` describe what was fetched: the tarball, or the executable itself for
/// a local binary.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DownloadedTools {
    pub version: Binary,
    pub url: String,
    /// 64 hexadecimal digits.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
}

impl DownloadedTools {
    /// Reads `dir/downloaded-tools.txt`; `None` when there is none.
    pub fn read(dir: &Path) -> Result<Option<DownloadedTools>, DataDirError> {
        let path = dir.join(DOWNLOADED_TOOLS);
        let Some(bytes) = read_capped(&path, DOWNLOADED_TOOLS_BYTES_MAX)? else {
            return Ok(None);
        };
        let tools: DownloadedTools =
            serde_json::from_slice(&bytes).map_err(|error| DataDirError::Malformed {
                path: path.clone(),
                detail: error.to_string(),
            })?;
        tools.check(&path)?;
        Ok(Some(tools))
    }

    fn check(&self, path: &Path) -> Result<(), DataDirError> {
        Sha256::parse(&self.sha256).map_err(|error| DataDirError::Malformed {
            path: path.to_path_buf(),
            detail: format!("sha256: {error}"),
        })?;
        Ok(())
    }

    fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("downloaded tools always serialise")
    }

    fn same_digest(&self, sha256: &str) -> bool {
        self.sha256.eq_ignore_ascii_case(sha256)
    }
}

// ---------------------------------------------------------------------------------------
// The data directory
// ---------------------------------------------------------------------------------------

/// The agent's data directory; see the module documentation for its layout.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/agent.conf`
    pub fn agent_conf_path(&self) -> PathBuf {
        self.root.join(AGENT_CONF)
    }

    /// `<root>/controller.yaml`
    pub fn controller_config_path(&self) -> PathBuf {
        self.root.join(CONTROLLER_CONFIG)
    }

    /// `<root>/store.db`
    pub fn store_path(&self) -> PathBuf {
        self.root.join(STORE)
    }

    /// `<root>/ca.pem`
    pub fn ca_cert_path(&self) -> PathBuf {
        self.root.join(CA_CERT)
    }

    /// `<root>/server.pem`
    pub fn server_cert_path(&self) -> PathBuf {
        self.root.join(SERVER_CERT)
    }

    /// `<root>/server-key.pem`
    pub fn server_key_path(&self) -> PathBuf {
        self.root.join(SERVER_KEY)
    }

    /// `<root>/streams-mark.json`
    pub fn streams_mark_path(&self) -> PathBuf {
        self.root.join(STREAMS_MARK)
    }

    /// `<root>/logs`
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join(LOGS)
    }

    /// `<root>/cache/tools`
    pub fn tools_cache_dir(&self) -> PathBuf {
        self.root.join("cache").join(TOOLS)
    }

    /// `<root>/cache/tools/juju-<version>-<os>-<arch>.tgz`: Juju's tarball name.
    pub fn cached_tarball_path(&self, binary: &Binary) -> PathBuf {
        self.tools_cache_dir().join(format!("juju-{binary}.tgz"))
    }

    /// `<root>/tools`
    pub fn tools_dir(&self) -> PathBuf {
        self.root.join(TOOLS)
    }

    /// `<root>/tools/<version>-<os>-<arch>`
    pub fn binary_dir(&self, binary: &Binary) -> PathBuf {
        self.tools_dir().join(binary.to_string())
    }

    /// `<root>/tools/<version>-<os>-<arch>/lockstepd`
    pub fn binary_path(&self, binary: &Binary) -> PathBuf {
        self.binary_dir(binary).join(EXECUTABLE)
    }

    /// `<root>/tools/<tag>`, e.g. `tools/machine-0`. The tag must pass [`check_tag`]; the
    /// methods that use the link check it.
    pub fn agent_link(&self, tag: &str) -> PathBuf {
        self.tools_dir().join(tag)
    }

    /// Creates the root, `tools/`, `logs/` and `cache/tools/` if missing.
    pub fn create_layout(&self) -> Result<(), DataDirError> {
        for dir in [
            self.root.clone(),
            self.tools_dir(),
            self.logs_dir(),
            self.tools_cache_dir(),
        ] {
            fs::create_dir_all(&dir).map_err(DataDirError::io(&dir, "create the directory"))?;
        }
        Ok(())
    }

    /// Reads `agent.conf`; `None` when there is none (a fresh data directory).
    pub fn read_agent_conf(&self) -> Result<Option<AgentConf>, DataDirError> {
        let path = self.agent_conf_path();
        let Some(bytes) = read_capped(&path, AGENT_CONF_BYTES_MAX)? else {
            return Ok(None);
        };
        let text = String::from_utf8(bytes).map_err(|error| DataDirError::Malformed {
            path: path.clone(),
            detail: format!("not UTF-8: {error}"),
        })?;
        AgentConf::parse(&text, &path).map(Some)
    }

    /// Replaces `agent.conf` atomically, mode 0600.
    pub fn write_agent_conf(&self, conf: &AgentConf) -> Result<(), DataDirError> {
        let path = self.agent_conf_path();
        check_tag(&conf.tag).map_err(|error| DataDirError::Malformed {
            path: path.clone(),
            detail: format!("refusing to write: {error}"),
        })?;
        let text = conf.to_yaml()?;
        fs::create_dir_all(&self.root).map_err(DataDirError::io(&self.root, "create"))?;
        lockstep_fs::write_file_atomically(&path, text.as_bytes(), 0o600)
            .map_err(DataDirError::Write)
    }

    /// The binary `tools/<tag>` points at; `None` when the link does not exist.
    pub fn current_binary(&self, tag: &str) -> Result<Option<Binary>, DataDirError> {
        check_tag(tag)?;
        let link = self.agent_link(tag);
        let target = match fs::read_link(&link) {
            Ok(target) => target,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) if error.kind() == io::ErrorKind::InvalidInput => {
                return Err(DataDirError::BadLink {
                    path: link,
                    target: String::new(),
                    detail: "not a symlink; remove it and switch again".into(),
                });
            }
            Err(error) => return Err(DataDirError::io(&link, "read the link")(error)),
        };
        let text = target.to_string_lossy().into_owned();
        let bad = |detail: String| DataDirError::BadLink {
            path: link.clone(),
            target: text.clone(),
            detail,
        };
        if target.is_absolute() || text.contains('/') {
            return Err(bad(
                "expected a relative <version>-<os>-<arch> name in the same directory".into(),
            ));
        }
        Binary::parse(&text)
            .map(Some)
            .map_err(|error| bad(error.to_string()))
    }

    /// Points `tools/<tag>` at `binary`'s directory atomically: a symlink made under a
    /// temporary name in `tools/` is renamed over the link, then `tools/` is fsynced.
    /// Refuses unless `tools/<binary>/lockstepd` is an executable regular file.
    pub fn switch_to(&self, tag: &str, binary: &Binary) -> Result<(), DataDirError> {
        check_tag(tag)?;
        check_binary(binary)?;
        let executable = self.binary_path(binary);
        check_executable(&executable)?;
        let tools = self.tools_dir();
        let link = self.agent_link(tag);
        let target = binary.to_string();
        let mut attempt = 0;
        let temporary = loop {
            let candidate = tools.join(format!("{SWITCH_PREFIX}{tag}-{:016x}", random_u64()));
            match std::os::unix::fs::symlink(&target, &candidate) {
                Ok(()) => break candidate,
                Err(error)
                    if error.kind() == io::ErrorKind::AlreadyExists
                        && attempt + 1 < SWITCH_NAME_ATTEMPTS_MAX =>
                {
                    attempt += 1;
                }
                Err(error) => {
                    return Err(DataDirError::io(&candidate, "create the symlink")(error));
                }
            }
        };
        if let Err(error) = fs::rename(&temporary, &link) {
            let _ = fs::remove_file(&temporary);
            return Err(DataDirError::io(&link, "replace the agent link")(error));
        }
        sync_directory(&tools)?;
        tracing::info!(tag, binary = %binary, link = %link.display(), "agent link switched");
        Ok(())
    }

    /// The binaries installed in `tools/` (directories named as a binary), sorted.
    pub fn installed_binaries(&self) -> Result<Vec<Binary>, DataDirError> {
        let tools = self.tools_dir();
        let entries = match fs::read_dir(&tools) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(DataDirError::io(&tools, "list")(error)),
        };
        let mut binaries = Vec::new();
        for entry in entries {
            let entry = entry.map_err(DataDirError::io(&tools, "list"))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            if let (true, Ok(binary)) = (is_dir, Binary::parse(&name)) {
                binaries.push(binary);
            }
        }
        binaries.sort();
        Ok(binaries)
    }

    /// The provenance of an installed binary; `None` when it has none.
    pub fn read_downloaded_tools(
        &self,
        binary: &Binary,
    ) -> Result<Option<DownloadedTools>, DataDirError> {
        check_binary(binary)?;
        DownloadedTools::read(&self.binary_dir(binary))
    }

    /// Installs an agent tarball as `tools/<binary>/`; returns the executable's path.
    ///
    /// The tarball must match `tools` (its version, size and sha256: checked again here
    /// even though the download checked them, because it is cheap and the file may have
    /// been replaced since). It is unpacked with [`unpack_tgz`] into a temporary directory
    /// in `tools/`, which must then hold an executable regular `lockstepd`;
    /// `downloaded-tools.txt` is written, everything fsynced, and the directory renamed
    /// into place. Idempotent: a directory already installed with the same sha256 is kept;
    /// one with another sha256 (or a broken one) is replaced atomically.
    pub fn install_tarball(
        &self,
        binary: &Binary,
        tarball: &Path,
        tools: &DownloadedTools,
    ) -> Result<PathBuf, DataDirError> {
        check_binary(binary)?;
        if tools.version != *binary {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the version its metadata names",
                expected: binary.to_string(),
                actual: tools.version.to_string(),
            });
        }
        tools.check(tarball)?;
        let (sha256, size) = sha256_of_file(tarball, tools.size.saturating_add(1))?;
        if size != tools.size {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the size in bytes",
                expected: tools.size.to_string(),
                actual: if size > tools.size {
                    format!("over {}", tools.size)
                } else {
                    size.to_string()
                },
            });
        }
        if !tools.same_digest(&sha256) {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the sha256",
                expected: tools.sha256.to_ascii_lowercase(),
                actual: sha256,
            });
        }
        let target = self.binary_dir(binary);
        if self.is_installed(&target, &sha256, None)? {
            tracing::debug!(binary = %binary, "agent binary already installed");
            return Ok(target.join(EXECUTABLE));
        }
        let staging = self.staging_dir(binary)?;
        unpack_tgz(tarball, staging.path(), &UnpackLimits::default())?;
        check_executable(&staging.path().join(EXECUTABLE))?;
        write_new_file(
            &staging.path().join(DOWNLOADED_TOOLS),
            &tools.to_json(),
            0o644,
        )?;
        sync_directory(staging.path())?;
        self.place(binary, staging, &sha256, None)
    }

    /// Installs the executable `exe` (the operator's own build, `--build-agent`) as
    /// `tools/<binary>/lockstepd`; returns its path. Its sha256 and size go into
    /// `downloaded-tools.txt` with the url `file://<exe>`. With `force_version`, a
    /// `FORCE-VERSION` file makes the binary report `binary`'s version whatever it was
    /// built as (Juju's mechanism). Same temporary-directory discipline and idempotence as
    /// [`DataDir::install_tarball`].
    pub fn install_local_binary(
        &self,
        binary: &Binary,
        exe: &Path,
        force_version: bool,
    ) -> Result<PathBuf, DataDirError> {
        check_binary(binary)?;
        let metadata = fs::metadata(exe).map_err(DataDirError::io(exe, "read the metadata of"))?;
        if !metadata.is_file() {
            return Err(DataDirError::NotInstalled {
                path: exe.to_path_buf(),
                detail: "not a regular file".into(),
            });
        }
        let staging = self.staging_dir(binary)?;
        let staged = staging.path().join(EXECUTABLE);
        let (sha256, size) = copy_hashed(exe, &staged, LOCAL_BINARY_BYTES_MAX)?;
        let forced = force_version.then_some(binary.number);
        let target = self.binary_dir(binary);
        if self.is_installed(&target, &sha256, Some(forced))? {
            tracing::debug!(binary = %binary, "local agent binary already installed");
            return Ok(target.join(EXECUTABLE));
        }
        if let Some(version) = forced {
            write_new_file(
                &staging.path().join(FORCE_VERSION),
                format!("{version}\n").as_bytes(),
                0o644,
            )?;
        }
        let absolute = fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        let tools = DownloadedTools {
            version: binary.clone(),
            url: format!("file://{}", absolute.display()),
            sha256: sha256.clone(),
            size,
        };
        write_new_file(
            &staging.path().join(DOWNLOADED_TOOLS),
            &tools.to_json(),
            0o644,
        )?;
        sync_directory(staging.path())?;
        self.place(binary, staging, &sha256, Some(forced))
    }

    /// Removes what an interrupted install or switch left in `tools/` (temporary
    /// directories and symlinks). Call it at start, before anything installs; returns how
    /// many entries were removed.
    pub fn remove_stale_temporaries(&self) -> Result<usize, DataDirError> {
        let tools = self.tools_dir();
        let entries = match fs::read_dir(&tools) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(error) => return Err(DataDirError::io(&tools, "list")(error)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(DataDirError::io(&tools, "list"))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let stale = [STAGING_PREFIX, REPLACED_PREFIX, SWITCH_PREFIX]
                .iter()
                .any(|prefix| name.starts_with(prefix));
            if !stale {
                continue;
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            let result = if is_dir {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            result.map_err(DataDirError::io(&path, "remove"))?;
            removed += 1;
        }
        if removed > 0 {
            sync_directory(&tools)?;
        }
        Ok(removed)
    }

    /// True when `target` holds an executable whose provenance records `sha256` (and, when
    /// `forced` is given, exactly that `FORCE-VERSION`).
    fn is_installed(
        &self,
        target: &Path,
        sha256: &str,
        forced: Option<Option<Version>>,
    ) -> Result<bool, DataDirError> {
        match fs::symlink_metadata(target) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(DataDirError::io(target, "inspect")(error)),
        }
        // A directory whose metadata is unreadable or malformed is broken: replace it.
        let recorded = match DownloadedTools::read(target) {
            Ok(Some(recorded)) => recorded,
            Ok(None) | Err(_) => return Ok(false),
        };
        if !recorded.same_digest(sha256) || check_executable(&target.join(EXECUTABLE)).is_err() {
            return Ok(false);
        }
        match forced {
            None => Ok(true),
            Some(expected) => Ok(read_force_version(target).ok() == Some(expected)),
        }
    }

    /// A fresh temporary directory in `tools/`, removed when dropped.
    fn staging_dir(&self, binary: &Binary) -> Result<tempfile::TempDir, DataDirError> {
        let tools = self.tools_dir();
        fs::create_dir_all(&tools).map_err(DataDirError::io(&tools, "create"))?;
        tempfile::Builder::new()
            .prefix(&format!("{STAGING_PREFIX}{binary}-"))
            .permissions(fs::Permissions::from_mode(0o755))
            .tempdir_in(&tools)
            .map_err(DataDirError::io(&tools, "create a temporary directory in"))
    }

    /// Renames the complete `staging` directory to `tools/<binary>`, replacing whatever is
    /// there atomically, and fsyncs `tools/`.
    fn place(
        &self,
        binary: &Binary,
        staging: tempfile::TempDir,
        sha256: &str,
        forced: Option<Option<Version>>,
    ) -> Result<PathBuf, DataDirError> {
        let tools = self.tools_dir();
        let target = self.binary_dir(binary);
        match fs::rename(staging.path(), &target) {
            Ok(()) => {
                // The staging path no longer exists; nothing to clean up.
                let _ = staging.keep();
            }
            Err(error) if is_occupied(&error) => {
                // Someone installed it meanwhile (a concurrent agent): keep theirs if it is
                // the same binary; otherwise replace it.
                if self.is_installed(&target, sha256, forced)? {
                    return Ok(target.join(EXECUTABLE));
                }
                replace_directory(&tools, staging, &target)?;
            }
            Err(error) => {
                return Err(DataDirError::io(&target, "rename the new binary into")(
                    error,
                ));
            }
        }
        sync_directory(&tools)?;
        tracing::info!(binary = %binary, dir = %target.display(), "agent binary installed");
        Ok(target.join(EXECUTABLE))
    }
}

/// True when a rename failed because the destination is a non-empty directory or exists.
fn is_occupied(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::AlreadyExists
            | io::ErrorKind::DirectoryNotEmpty
            | io::ErrorKind::IsADirectory
    ) || error.kind() == io::ErrorKind::NotADirectory
}

/// Puts `staging` at `target`, where something already is. On Linux the two are exchanged
/// in one `renameat2(RENAME_EXCHANGE)`, so `target` always exists; elsewhere (or when the
/// file system cannot exchange) the old one is renamed aside first. The old one is removed.
fn replace_directory(
    tools: &Path,
    staging: tempfile::TempDir,
    target: &Path,
) -> Result<(), DataDirError> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let exchanged = rustix::fs::renameat_with(
            rustix::fs::CWD,
            staging.path(),
            rustix::fs::CWD,
            target,
            rustix::fs::RenameFlags::EXCHANGE,
        );
        match exchanged {
            Ok(()) => {
                // `staging` now holds the old directory: fsync the exchange, then drop it.
                sync_directory(tools)?;
                let old = staging.path().to_path_buf();
                if let Err(error) = staging.close() {
                    tracing::warn!(path = %old.display(), %error,
                        "cannot remove a replaced agent binary");
                }
                return Ok(());
            }
            Err(error)
                if error == rustix::io::Errno::INVAL || error == rustix::io::Errno::NOSYS =>
            {
                // The file system cannot exchange: fall back to renaming aside.
            }
            Err(error) => {
                return Err(DataDirError::io(target, "exchange the new binary with")(
                    io::Error::from(error),
                ));
            }
        }
    }
    let aside = tools.join(format!(
        "{REPLACED_PREFIX}{}-{:016x}",
        target
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        random_u64()
    ));
    fs::rename(target, &aside).map_err(DataDirError::io(target, "rename aside"))?;
    if let Err(error) = fs::rename(staging.path(), target) {
        // Put the old one back rather than leave no binary at all.
        let _ = fs::rename(&aside, target);
        return Err(DataDirError::io(target, "rename the new binary into")(
            error,
        ));
    }
    let _ = staging.keep();
    sync_directory(tools)?;
    if let Err(error) = fs::remove_dir_all(&aside) {
        tracing::warn!(path = %aside.display(), %error, "cannot remove a replaced agent binary");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Free functions
// ---------------------------------------------------------------------------------------

/// Checks an agent tag: 1 to [`TAG_LENGTH_MAX`] characters of `a-z`, `0-9`, `-`, starting
/// with a letter and not ending with `-` (`machine-0`, `unit-wordpress-0`). Such a name is
/// never a binary's (those start with a digit) nor a temporary entry's (those start with
/// `.`), and never leaves `tools/`.
pub fn check_tag(tag: &str) -> Result<(), DataDirError> {
    let valid = !tag.is_empty()
        && tag.len() <= TAG_LENGTH_MAX
        && tag.starts_with(|c: char| c.is_ascii_lowercase())
        && !tag.ends_with('-')
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(DataDirError::BadTag {
            tag: tag.to_owned(),
        })
    }
}

/// A binary built by hand (its fields are public) must still name a plain directory.
fn check_binary(binary: &Binary) -> Result<(), DataDirError> {
    let text = binary.to_string();
    match Binary::parse(&text) {
        Ok(parsed) if parsed == *binary => Ok(()),
        _ => Err(DataDirError::BadBinary { binary: text }),
    }
}

fn check_executable(path: &Path) -> Result<(), DataDirError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(DataDirError::NotInstalled {
                path: path.to_path_buf(),
                detail: "no such file".into(),
            });
        }
        Err(error) => return Err(DataDirError::io(path, "inspect")(error)),
    };
    if !metadata.is_file() {
        return Err(DataDirError::NotInstalled {
            path: path.to_path_buf(),
            detail: "not a regular file".into(),
        });
    }
    if metadata.permissions().mode() & 0o111 == 0 {
        return Err(DataDirError::NotInstalled {
            path: path.to_path_buf(),
            detail: format!(
                "not executable (mode {:#o})",
                metadata.permissions().mode() & 0o7777
            ),
        });
    }
    Ok(())
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

/// This host's binary for `version`: release `ubuntu`, arch by Juju's name.
pub fn host_binary(version: Version) -> Binary {
    let arch = if std::env::consts::ARCH == "powerpc64" && cfg!(target_endian = "little") {
        "ppc64el"
    } else {
        juju_arch(std::env::consts::ARCH)
    };
    Binary {
        number: version,
        release: "ubuntu".to_owned(),
        arch: arch.to_owned(),
    }
}

/// Juju's name for a Rust architecture (`std::env::consts::ARCH`); others unchanged.
pub fn juju_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64le" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "x86" => "i386",
        "arm" => "armhf",
        other => other,
    }
}

/// Creates `path` (which must not exist) with `bytes` and `mode`, fsynced.
fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DataDirError> {
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
fn sync_directory(directory: &Path) -> Result<(), DataDirError> {
    lockstep_fs::sync_directory(directory).map_err(DataDirError::Write)
}

/// Reads a whole file of at most `size_bytes_max` bytes; `None` when it does not exist.
fn read_capped(path: &Path, size_bytes_max: u64) -> Result<Option<Vec<u8>>, DataDirError> {
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

/// The sha256 (lowercase hex) and size of a file, reading at most `size_bytes_max` bytes.
fn sha256_of_file(path: &Path, size_bytes_max: u64) -> Result<(String, u64), DataDirError> {
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
    Ok((hex(&hasher.finalize()), size))
}

/// Copies `source` to the new file `target` (mode 0755, fsynced) while hashing it.
fn copy_hashed(
    source: &Path,
    target: &Path,
    size_bytes_max: u64,
) -> Result<(String, u64), DataDirError> {
    let input = File::open(source).map_err(DataDirError::io(source, "open"))?;
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
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
        .set_permissions(fs::Permissions::from_mode(0o755))
        .map_err(DataDirError::io(target, "set the permissions of"))?;
    output
        .sync_all()
        .map_err(DataDirError::io(target, "fsync"))?;
    Ok((hex(&hasher.finalize()), size))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn random_u64() -> u64 {
    use rand_core::RngCore;
    rand_core::OsRng.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_plain_lowercase_names_that_cannot_be_binaries_or_temporaries() {
        for tag in [
            "machine-0",
            "controller-0",
            "unit-wordpress-0",
            "machine-0-lxd-1",
        ] {
            assert!(check_tag(tag).is_ok(), "{tag}");
        }
        for tag in [
            "",
            "0",
            "2.9.43-ubuntu-amd64",
            ".switch-x",
            "../x",
            "machine/0",
            "Machine-0",
            "machine-",
            &"m".repeat(65),
        ] {
            let error = check_tag(tag).unwrap_err();
            assert!(
                error.to_string().contains(&format!("{tag:?}")) || tag.len() > 64,
                "{error}"
            );
        }
    }

    #[test]
    fn juju_names_the_architectures() {
        assert_eq!(juju_arch("x86_64"), "amd64");
        assert_eq!(juju_arch("aarch64"), "arm64");
        assert_eq!(juju_arch("powerpc64le"), "ppc64el");
        assert_eq!(juju_arch("s390x"), "s390x");
        assert_eq!(juju_arch("riscv64"), "riscv64");
        let host = host_binary(Version::new(2, 9, 43));
        assert_eq!(host.release, "ubuntu");
        assert!(Binary::parse(&host.to_string()).is_ok(), "{host}");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(host.to_string(), "2.9.43-ubuntu-amd64");
        }
    }

    #[test]
    fn quotes_are_cut() {
        assert_eq!(quote("a"), "\"a\"");
        assert!(quote(&"x".repeat(500)).ends_with("... (500 characters)"));
    }
}
