//! `agent.conf`: the agent's identity, how it reaches the API and the store, and the
//! lifecycle [`Snapshot`] (CONTRACT.md, "Where state lives"). The format (YAML, Juju's keys
//! where Juju has them), reading it (capped, the format checked first), writing it
//! (atomically, mode [`AGENT_CONF_MODE`]).

use std::fs;
use std::path::{Path, PathBuf};

use lockstep_core::lifecycle::{Snapshot, Trial};
use lockstep_core::steps::StepKey;
use lockstep_core::version::{Binary, Version};
use serde::{Deserialize, Serialize};

use super::error::DataDirError;
use super::files::read_capped;
use super::layout::{DataDir, check_tag};
use super::names::{AGENT_CONF_BYTES_MAX, SECRET_FILE_MODE};

/// `agent.conf`'s mode: it names the store and the API, and may name TLS key files.
pub const AGENT_CONF_MODE: u32 = SECRET_FILE_MODE;

/// The engine holding the controllers' shared state, `agent.conf`'s `store` key (and
/// `--store` on the command lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    /// `<data>/store.db`, embedded SQLite: one controller.
    #[default]
    Sqlite,
    /// An etcd cluster shared by every controller of the model.
    Etcd,
}

impl StoreEngine {
    pub fn is_sqlite(&self) -> bool {
        *self == StoreEngine::Sqlite
    }
}

/// Who starts the agents of the machines a controller records, `agent.conf`'s
/// `provisioner` key (and `lockstep bootstrap --provisioner`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Provisioner {
    /// Juju's manual provider: a machine recorded by `AddMachines` waits until something
    /// runs its `MachineManager.ProvisioningScript`; `lockstep add-machine` does that on
    /// this host for the machines it records.
    #[default]
    Manual,
    /// The local provider's provisioner: the controller itself starts a machine agent on
    /// its host for every machine recorded without one, whichever client recorded it
    /// (`lockstep add-machine`, python-libjuju's `Model.add_machine`, a bundle).
    Local,
}

impl Provisioner {
    pub fn is_manual(&self) -> bool {
        *self == Provisioner::Manual
    }
}

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
    #[serde(default, skip_serializing_if = "StoreEngine::is_sqlite")]
    pub store: StoreEngine,
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
    /// etcd's user authentication: the user (`--etcd-user`), as etcdctl's `--user`.
    #[serde(rename = "etcd-user", default, skip_serializing_if = "Option::is_none")]
    pub etcd_user: Option<String>,
    /// The file holding that user's password (`--etcd-password-file`, mode 0600, owned by
    /// the user running lockstep), read at every start; the password is never written here.
    #[serde(
        rename = "etcd-password-file",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub etcd_password_file: Option<PathBuf>,
    /// `--etcd-insecure`: the operator accepted plain http to etcd endpoints that are not
    /// loopback (warned about at every start, shown by `lockstep status`).
    #[serde(
        rename = "etcd-insecure",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub etcd_insecure: bool,
    /// The OpenPGP public keys that must sign the metadata of `agent-metadata-url`: the
    /// data dir's `metadata-keys.asc`, copied there by `lockstep bootstrap --metadata-key`.
    /// Only this file is trusted, never anything from the shared store or the API.
    #[serde(
        rename = "metadata-keyring",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata_keyring: Option<PathBuf>,
    /// The fingerprints of those keys, pinned: the file must hold exactly these.
    #[serde(
        rename = "metadata-key-fingerprints",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub metadata_key_fingerprints: Vec<String>,
    /// `lockstep bootstrap --allow-unsigned-metadata`: the operator accepted unsigned
    /// metadata (and, with keys, signed metadata must still verify).
    #[serde(
        rename = "allow-unsigned-metadata",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub allow_unsigned_metadata: bool,
    /// The certificate authorities trusted for an `https://` `agent-metadata-url` besides
    /// the system's: the data dir's `metadata-ca.pem`, copied there by `lockstep bootstrap
    /// --metadata-ca`. As the keys, never taken from the shared store or the API.
    #[serde(
        rename = "metadata-ca",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata_ca: Option<PathBuf>,
    /// `lockstep bootstrap --allow-metadata-redirects`: an `https://` `agent-metadata-url`'s
    /// redirects are followed to other hosts too (still https only, at most 5).
    #[serde(
        rename = "allow-metadata-redirects",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub allow_metadata_redirects: bool,
    /// Juju's `apipassword`: a machine agent's password for the API (its hash is in the
    /// shared store; the controllers never keep the plaintext). Empty for a controller,
    /// which reaches the store itself. The file is mode [`AGENT_CONF_MODE`].
    #[serde(default, skip_serializing_if = "ApiPassword::is_empty")]
    pub apipassword: ApiPassword,
    /// A controller's provisioner (`manual` unless bootstrap was given `--provisioner`).
    #[serde(default, skip_serializing_if = "Provisioner::is_manual")]
    pub provisioner: Provisioner,
}

/// A machine agent's API password: its text is the file's and the login's, never a log's
/// (`Debug` shows `(hidden)`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApiPassword(String);

impl ApiPassword {
    /// True when there is none (a controller's `agent.conf`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The password itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for ApiPassword {
    fn from(password: String) -> ApiPassword {
        ApiPassword(password)
    }
}

impl std::ops::Deref for ApiPassword {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "(none)"
        } else {
            "(hidden)"
        })
    }
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
            store: StoreEngine::Sqlite,
            etcd_endpoints: Vec::new(),
            etcd_prefix: String::new(),
            etcd_cacert: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            apipassword: ApiPassword::default(),
            etcd_password_file: None,
            etcd_insecure: false,
            metadata_keyring: None,
            metadata_key_fingerprints: Vec::new(),
            allow_unsigned_metadata: false,
            metadata_ca: None,
            allow_metadata_redirects: false,
            provisioner: Provisioner::Manual,
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
            path: PathBuf::from(super::names::AGENT_CONF),
            detail: format!("cannot serialise: {error}"),
        })
    }
}

/// A multi-line string as a YAML literal block (`|`), readable as the PEM it is, when a
/// literal block reads back as exactly `text`: some text before exactly one final line
/// break, no leading space, printable characters only. Anything else (found by the
/// `agent_conf_parse` fuzz target: `"\n"` written as an empty block read back as `""`) is
/// written as a quoted string, which always reads back unchanged.
fn literal_block<S: serde::Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
    let body = text.strip_suffix('\n').unwrap_or("");
    let faithful = !body.is_empty()
        && !body.ends_with('\n')
        && !body.starts_with([' ', '\t'])
        && body
            .chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{feff}'));
    if faithful {
        serde_saphyr::LitStr(text).serialize(serializer)
    } else {
        serializer.serialize_str(text)
    }
}

impl DataDir {
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

    /// Replaces `agent.conf` atomically ([`lockstep_fs::write_file_atomically`]), mode
    /// [`AGENT_CONF_MODE`].
    pub fn write_agent_conf(&self, conf: &AgentConf) -> Result<(), DataDirError> {
        let path = self.agent_conf_path();
        check_tag(&conf.tag).map_err(|error| DataDirError::Malformed {
            path: path.clone(),
            detail: format!("refusing to write: {error}"),
        })?;
        let text = conf.to_yaml()?;
        fs::create_dir_all(self.root()).map_err(DataDirError::io(self.root(), "create"))?;
        lockstep_fs::write_file_atomically(&path, text.as_bytes(), AGENT_CONF_MODE)
            .map_err(DataDirError::Write)
    }
}
