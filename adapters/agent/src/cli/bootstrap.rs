//! `lockstep bootstrap`: prepares a controller's data directory, starts `lockstepd` on it,
//! and waits until its API is fully available.
//!
//! Juju's client prepares the agent binary and the controller's configuration and the new
//! machine installs them; here both sides are one machine, so bootstrap writes the data dir
//! the daemon reads: the store with the model and machine 0, `agent.conf`, the TLS
//! material, the API's users, the client's `controller.yaml`, the keys that must sign the
//! mirror's metadata (`--metadata-key`, pinned in `agent.conf`), and the first binary under
//! `tools/`. A `--metadata-source` needs `--metadata-key` or `--allow-unsigned-metadata`;
//! without either, nothing is written.

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockstep_core::jobs::Capabilities;
use lockstep_core::lifecycle::{ControllerSet, Snapshot};
use lockstep_core::policy::{self, CatalogueEntry, Stream, UpgradePolicy};
use lockstep_core::{Binary, Role, Roles, Version};
use lockstep_fs::AtomicWriteError;
use lockstep_store::{Machine, Model, StoreError};
use lockstep_streams::{DownloadError, Keyring, LookupError, SourceError};
use lockstep_transport::client::{Client, ClientConfig, ClientError};
use lockstep_transport::tls::{Credentials, TlsError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::datadir::{
    self, AgentConf, BinaryIdentity, DATA_DIR_MODE, DataDir, DataDirError, DownloadedTools, User,
    private_umask,
};
use crate::metadata::{MetadataSource, MetadataTrust, unix_now};
use crate::quote::quote;
use crate::store::StoreSetupError;

/// The agent's tag: a controller is machine 0, as in Juju.
pub const AGENT_TAG: &str = "machine-0";

/// What a client needs to reach the controller: `<data>/controller.yaml` (mode 0600), the
/// equivalent of Juju's `controllers.yaml` and `accounts.yaml` entries.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ControllerFile {
    pub name: String,
    pub uuid: String,
    pub model_uuid: String,
    pub api_endpoints: Vec<String>,
    pub ca_cert: String,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for ControllerFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerFile")
            .field("name", &self.name)
            .field("api_endpoints", &self.api_endpoints)
            .finish_non_exhaustive()
    }
}

/// Why `controller.yaml` cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ControllerFileError {
    #[error(
        "cannot read {}: {error} (is a controller bootstrapped with --data-dir {}?)",
        path.display(),
        data_dir.display()
    )]
    Read {
        path: PathBuf,
        data_dir: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("{}: {error}", path.display())]
    Malformed {
        path: PathBuf,
        #[source]
        error: Box<serde_saphyr::Error>,
    },
    #[error(
        "{}: api-endpoints is empty: no controller address to connect to",
        path.display()
    )]
    NoEndpoints { path: PathBuf },
    #[error("cannot write {}: {error}", path.display())]
    Serialize {
        path: PathBuf,
        #[source]
        error: serde_saphyr::ser::Error,
    },
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
}

impl ControllerFile {
    pub fn read(data: &DataDir) -> Result<ControllerFile, ControllerFileError> {
        let path = data.controller_config_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) => {
                return Err(ControllerFileError::Read {
                    path,
                    data_dir: data.root().to_path_buf(),
                    error,
                });
            }
        };
        let file: ControllerFile = match serde_saphyr::from_str(&text) {
            Ok(file) => file,
            Err(error) => {
                return Err(ControllerFileError::Malformed {
                    path,
                    error: Box::new(error),
                });
            }
        };
        if file.api_endpoints.is_empty() {
            return Err(ControllerFileError::NoEndpoints { path });
        }
        Ok(file)
    }

    /// Writes `<data>/controller.yaml` (mode 0600).
    pub fn write(&self, data: &DataDir) -> Result<(), ControllerFileError> {
        let path = data.controller_config_path();
        let text =
            serde_saphyr::to_string(self).map_err(|error| ControllerFileError::Serialize {
                path: path.clone(),
                error,
            })?;
        lockstep_fs::write_file_atomically(&path, text.as_bytes(), 0o600)?;
        Ok(())
    }

    /// A client of this controller, with a fresh client id. With several controllers
    /// (`enable-ha`) it connects to the first endpoint and, when that cannot be reached, to
    /// the others in turn: they serve one model, so calls, waits and watchers carry on.
    pub fn client(&self, retry: lockstep_core::client::RetryPolicy) -> Client {
        self.client_of(self.api_endpoints.clone(), retry)
    }

    /// A client of the first endpoint only, the controller this data dir belongs to: for
    /// asking one controller about itself (its phase, its version), where another
    /// controller's answer would mislead.
    pub fn direct_client(&self, retry: lockstep_core::client::RetryPolicy) -> Client {
        self.client_of(self.api_endpoints[..1].to_vec(), retry)
    }

    fn client_of(
        &self,
        mut endpoints: Vec<String>,
        retry: lockstep_core::client::RetryPolicy,
    ) -> Client {
        let first = endpoints.remove(0);
        Client::new(ClientConfig {
            address: first,
            fallback_addresses: endpoints,
            ca_pem: self.ca_cert.clone(),
            model_uuid: Some(self.model_uuid.clone()),
            user: self.user.clone(),
            password: self.password.clone(),
            retry,
            client_id: random_hex(16),
        })
    }
}

/// Why `lockstep bootstrap` failed. Each names the flag, file or value, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "a controller is already bootstrapped in {} ({} exists); use another --data-dir, or \
         kill-controller and remove it first",
        data_dir.display(),
        agent_conf.display()
    )]
    AlreadyBootstrapped {
        data_dir: PathBuf,
        agent_conf: PathBuf,
    },
    #[error("cannot find a free port on 127.0.0.1: {0}")]
    NoFreePort(#[source] io::Error),
    #[error("cannot use --api-port {port} on 127.0.0.1: {error}")]
    ApiPort {
        port: u16,
        #[source]
        error: io::Error,
    },
    #[error("--metadata-source {}: {error}", quote(given))]
    MetadataSource {
        given: String,
        #[source]
        error: io::Error,
    },
    #[error("agent-metadata-url {}: {error}", quote(url))]
    Source {
        url: String,
        #[source]
        error: SourceError,
    },
    #[error("looking up agent binaries at {url}: {error}{hint}")]
    Lookup {
        url: String,
        #[source]
        error: Box<LookupError>,
        /// The flags that choose what is accepted, when the signature is the problem.
        hint: String,
    },
    #[error(
        "--metadata-source {}: say how its metadata is verified: --metadata-key FILE (the \
         OpenPGP public key that signs the mirror's metadata; `lockstep metadata \
         generate-key` makes a key pair, `metadata generate-agent-binaries --sign-key` \
         signs) or --allow-unsigned-metadata (accept unsigned metadata: whoever can change \
         the mirror, or the network to it, then chooses what this controller runs); nothing \
         was written or started",
        quote(given)
    )]
    MetadataTrustNotChosen { given: String },
    #[error("--metadata-source {url}: refused: {problem}")]
    Untrusted { url: String, problem: String },
    #[error("--metadata-ca {}: {error}", path.display())]
    MetadataCa {
        path: PathBuf,
        #[source]
        error: Box<DataDirError>,
    },
    #[error("--metadata-key {}: {error}", path.display())]
    MetadataKey {
        path: PathBuf,
        #[source]
        error: DataDirError,
    },
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error("adding the controller to the client store: {0}")]
    ClientStore(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("no agent binaries for {version} found at {url}")]
    NotPublished { version: Version, url: String },
    #[error(
        "--agent-version {version} needs published binaries (--metadata-source): the local \
         lockstepd {} is {own}",
        path.display()
    )]
    NeedsPublished {
        version: Version,
        own: Version,
        path: PathBuf,
    },
    /// The local binary's identity cannot be read, or it cannot run on this host.
    #[error("local agent binary {0}")]
    LocalAgent(#[source] DataDirError),
    #[error(transparent)]
    StoreSetup(#[from] StoreSetupError),
    #[error("cannot use {store}: {error}")]
    Store {
        store: String,
        #[source]
        error: StoreError,
    },
    #[error("{store} already holds a model; not bootstrapping over it")]
    ModelExists { store: String },
    #[error("cannot make the API's TLS material: {0}")]
    Credentials(#[source] TlsError),
    #[error("{what} did not finish: {error}")]
    Task {
        what: &'static str,
        #[source]
        error: tokio::task::JoinError,
    },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    #[error(transparent)]
    ControllerFile(#[from] ControllerFileError),
    #[error("bootstrap failed: {error}\nlast lines of {}:\n{tail}", log.display())]
    NotReady {
        #[source]
        error: WaitError,
        log: PathBuf,
        tail: String,
    },
    #[error("the controller is ready, but Upgrade.Status failed: {0}")]
    Status(#[source] Box<ClientError>),
}

/// Why the controller did not become Ready.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error(
        "the controller did not become available within {}s; it is {}",
        deadline.as_secs(),
        last.describe()
    )]
    Timeout {
        deadline: Duration,
        last: Box<Progress>,
    },
    #[error("lockstepd (pid {pid}) exited while {}", last.describe_or("starting"))]
    Exited { pid: u32, last: Box<Progress> },
}

/// `lockstep bootstrap`'s options.
#[derive(Clone, Debug)]
pub struct BootstrapOptions {
    pub data_dir: PathBuf,
    pub name: String,
    pub auto_upgrade: bool,
    /// With `auto_upgrade`: fetch the binary the controller will upgrade to beside the
    /// first one (`--no-fetch-ahead` turns it off; the controller then downloads it).
    pub fetch_ahead: bool,
    pub agent_version: Option<Version>,
    pub agent_stream: Option<Stream>,
    pub build_agent: bool,
    pub metadata_source: Option<String>,
    /// 0: a free port.
    pub api_port: u16,
    /// The `lockstepd` executable to install when no published binary is used.
    pub local_agent: PathBuf,
    /// Where the shared state lives: SQLite in the data dir, or etcd.
    pub store: crate::store::StoreEngine,
    /// etcd's client endpoints, with `store` etcd.
    pub etcd_endpoints: Vec<String>,
    /// TLS to etcd (its CA; a client certificate and key if it asks for one).
    pub etcd_tls: crate::store::EtcdTlsFiles,
    /// etcd's user authentication (`--etcd-user`, `--etcd-password-file`).
    pub etcd_auth: crate::store::EtcdAuthFiles,
    /// `--etcd-insecure`: accept plain http to etcd endpoints that are not loopback.
    pub etcd_insecure: bool,
    /// `--metadata-key`: the OpenPGP public key (or keyring) that must sign the metadata
    /// source's metadata; copied into the data dir and pinned in `agent.conf`.
    pub metadata_key: Option<PathBuf>,
    /// `--allow-unsigned-metadata`: accept unsigned metadata (recorded in `agent.conf`,
    /// warned about at every start, shown by `lockstep status`).
    pub allow_unsigned_metadata: bool,
    /// `--metadata-ca`: certificate authorities (PEM) an `https://` metadata source may
    /// chain to besides the system's; copied into the data dir and pinned in `agent.conf`.
    pub metadata_ca: Option<PathBuf>,
    /// `--allow-metadata-redirects`: follow an `https://` metadata source's redirects to other
    /// hosts (recorded in `agent.conf`, shown by `lockstep status`).
    pub allow_metadata_redirects: bool,
    /// `--provisioner`: who starts the agents of the machines the controller records.
    pub provisioner: crate::datadir::Provisioner,
}

/// What `prepare` made.
#[derive(Debug)]
pub struct Prepared {
    pub data: DataDir,
    pub binary: Binary,
    pub controller: ControllerFile,
    /// The local binary installed, as read from its file; `None` when a published one was.
    pub local: Option<BinaryIdentity>,
    /// With `--auto-upgrade`, the binary the controller will upgrade to at its first start,
    /// fetched and installed beside the first one (or why that failed: the controller then
    /// downloads it itself).
    pub ahead: Option<Result<Binary, BootstrapError>>,
}

pub fn random_hex(bytes: usize) -> String {
    use rand_core::RngCore;
    let mut buffer = vec![0u8; bytes];
    rand_core::OsRng.fill_bytes(&mut buffer);
    buffer.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn uuid() -> String {
    let hex = random_hex(16).into_bytes();
    let mut text = String::from_utf8(hex).expect("hex is ASCII");
    // Version 4, variant 1.
    text.replace_range(12..13, "4");
    let variant = ["8", "9", "a", "b"][usize::from(text.as_bytes()[16]) % 4];
    text.replace_range(16..17, variant);
    format!(
        "{}-{}-{}-{}-{}",
        &text[0..8],
        &text[8..12],
        &text[12..16],
        &text[16..20],
        &text[20..32]
    )
}

/// A free port on 127.0.0.1 (bound, then released for the daemon to bind).
pub(crate) fn free_port() -> io::Result<u16> {
    let socket = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(socket.local_addr()?.port())
}

/// Writes the data dir. Refuses one that already holds a controller, touching nothing.
pub async fn prepare(options: &BootstrapOptions) -> Result<Prepared, BootstrapError> {
    let data = DataDir::new(&options.data_dir);
    if data.agent_conf_path().exists() {
        return Err(BootstrapError::AlreadyBootstrapped {
            data_dir: data.root().to_path_buf(),
            agent_conf: data.agent_conf_path(),
        });
    }
    // Before anything is written: how the metadata is verified. A controller bootstrapped
    // from its local binary looks nothing up, so it needs neither flag; one given a
    // metadata source must be told which key signs it, or that it is trusted unsigned.
    let trust = metadata_trust(options)?;
    // Before anything is written: a source the trust cannot read at all (plain http with
    // no key pinned: over plain http only signed metadata is accepted).
    if let Some(source) = &options.metadata_source
        && let Err(problem) = trust.lookup_config(source)
    {
        return Err(BootstrapError::Untrusted {
            url: source.clone(),
            problem,
        });
    }
    // Before anything is written: which binary the local file is, when it will be installed
    // (read from the file, never guessed from the host), and that this host can run it.
    let local = if options.build_agent || options.metadata_source.is_none() {
        Some(identify_local(options)?)
    } else {
        None
    };
    // Before anything is written: a port in use would leave a data dir that cannot serve.
    let port = match options.api_port {
        0 => free_port().map_err(BootstrapError::NoFreePort)?,
        port => {
            std::net::TcpListener::bind(("127.0.0.1", port))
                .map_err(|error| BootstrapError::ApiPort { port, error })?;
            port
        }
    };
    // Also before anything is written: an unreachable etcd or a bad endpoint.
    let controller_uuid = uuid();
    let model_uuid = uuid();
    let settings = match options.store {
        crate::store::StoreEngine::Sqlite => crate::store::StoreSettings::default(),
        crate::store::StoreEngine::Etcd => crate::store::StoreSettings::etcd(
            &options.etcd_endpoints,
            options.etcd_tls.clone(),
            options.etcd_auth.clone(),
            options.etcd_insecure,
            &controller_uuid,
        )?,
    };
    let shared = if settings.engine == crate::store::StoreEngine::Etcd {
        let store = crate::store::open(&data, &settings)?;
        // The first read: etcd refusing the user (or the want of one) is named here.
        store.revision().map_err(|error| match error {
            lockstep_store::StoreError::Denied { .. } => {
                BootstrapError::StoreSetup(settings.setup_error(error))
            }
            error => BootstrapError::Store {
                store: settings.describe(&data),
                error,
            },
        })?;
        Some(store)
    } else {
        None
    };
    private_umask();
    std::fs::create_dir_all(data.root())
        .map_err(DataDirError::io(data.root(), "create the directory"))?;
    // One made beforehand (by an operator, or a package) becomes private too.
    std::fs::set_permissions(data.root(), std::fs::Permissions::from_mode(DATA_DIR_MODE))
        .map_err(DataDirError::io(data.root(), "make private (0700)"))?;
    std::fs::create_dir_all(data.tools_dir())
        .map_err(DataDirError::io(&data.tools_dir(), "create the directory"))?;

    let metadata_source = match &options.metadata_source {
        Some(source) if !source.starts_with("http://") && !source.starts_with("https://") => {
            let mut path =
                Path::new(source.strip_prefix("file://").unwrap_or(source)).to_path_buf();
            // Juju's --metadata-source names the directory holding `tools/`.
            if path.join("tools/streams/v1").is_dir() {
                path = path.join("tools");
            }
            Some(
                path.canonicalize()
                    .map_err(|error| BootstrapError::MetadataSource {
                        given: source.clone(),
                        error,
                    })?
                    .display()
                    .to_string(),
            )
        }
        other => other.clone(),
    };
    let own = crate::steps::build_version();
    let wanted = options.agent_version.unwrap_or(own);
    let keyring_path = if trust.keyring.is_empty() {
        None
    } else {
        Some(data.write_metadata_keys(&trust.keyring)?)
    };
    let ca_path = match &options.metadata_ca {
        Some(given) => {
            let (pem, _) =
                datadir::read_metadata_ca(given).map_err(|error| BootstrapError::MetadataCa {
                    path: given.clone(),
                    error: Box::new(error),
                })?;
            Some(data.write_metadata_ca(&pem)?)
        }
        None => None,
    };
    // The admin's password hash (argon2: tens of milliseconds of CPU by design) is made on
    // another core while the binary downloads and unpacks.
    let password = random_hex(16);
    let hashing = {
        let password = password.clone();
        tokio::task::spawn_blocking(move || lockstep_transport::server::hash_password(&password))
    };
    // With --auto-upgrade the controller upgrades at its first start: the binary it will
    // choose is fetched now, beside the first.
    let ahead_stream =
        (options.auto_upgrade && options.fetch_ahead && options.agent_version.is_none())
            .then_some(options.agent_stream);
    let mut ahead = None;
    let (binary, local) = match (&metadata_source, local) {
        (Some(url), None) => {
            match install_published(&data, url, wanted, &trust, ahead_stream).await? {
                Some((binary, fetched)) => {
                    ahead = fetched;
                    (binary, None)
                }
                None if options.agent_version.is_some() => {
                    return Err(BootstrapError::NotPublished {
                        version: wanted,
                        url: url.clone(),
                    });
                }
                None => {
                    let identity = identify_local(options)?;
                    (install_local(&data, &identity, None)?, Some(identity))
                }
            }
        }
        (_, Some(identity)) => (
            install_local(&data, &identity, options.agent_version)?,
            Some(identity),
        ),
        (None, None) => unreachable!("without a metadata source the local binary is identified"),
    };
    data.switch_to(AGENT_TAG, &binary)?;

    let policy = if let Some(version) = options.agent_version {
        UpgradePolicy::Pinned(version)
    } else if options.build_agent {
        let identity = local
            .as_ref()
            .expect("--build-agent installs the local binary");
        UpgradePolicy::LocalBinary {
            binary: binary.clone(),
            sha256: identity.sha256,
            size_bytes: identity.size_bytes,
        }
    } else if options.auto_upgrade {
        UpgradePolicy::AutoPatch
    } else {
        UpgradePolicy::Off
    };

    let address = format!("127.0.0.1:{port}");
    let credentials = Credentials::generate(&options.name, &[IpAddr::from([127, 0, 0, 1])])
        .map_err(BootstrapError::Credentials)?;
    lockstep_fs::write_file_atomically(&data.ca_cert_path(), credentials.ca_pem.as_bytes(), 0o644)?;
    lockstep_fs::write_file_atomically(
        &data.server_cert_path(),
        credentials.certificate_pem.as_bytes(),
        0o600,
    )?;
    lockstep_fs::write_file_atomically(
        &data.server_key_path(),
        credentials.key_pem.as_bytes(),
        0o600,
    )?;
    let users = vec![User {
        name: "admin".to_owned(),
        password_hash: hashing.await.map_err(|error| BootstrapError::Task {
            what: "hashing the admin password",
            error,
        })?,
    }];
    data.write_users(&users)?;

    let store = match shared {
        Some(store) => store,
        None => crate::store::open(&data, &settings)?,
    };
    let store_error = |error| BootstrapError::Store {
        store: settings.describe(&data),
        error,
    };
    let created = store
        .create_model(&Model {
            uuid: model_uuid.clone(),
            name: "controller".to_owned(),
            agent_version: binary.number,
            agent_stream: options.agent_stream,
            agent_metadata_url: metadata_source.clone(),
            policy,
            controllers: ControllerSet::first(1),
            capabilities: Capabilities::default(),
            capabilities_discovered: None,
            upgrade_available: None,
        })
        .map_err(store_error)?;
    if !created {
        return Err(BootstrapError::ModelExists {
            store: settings.describe(&data),
        });
    }
    let mut machine = Machine::with_roles("0", Roles::of(&[Role::Controller]));
    machine.agent_binary = Some(binary.clone());
    store.add_machine(&machine).map_err(store_error)?;
    drop(store);

    let controller = ControllerFile {
        name: options.name.clone(),
        uuid: controller_uuid.clone(),
        model_uuid: model_uuid.clone(),
        api_endpoints: vec![address.clone()],
        ca_cert: credentials.ca_pem.clone(),
        user: "admin".to_owned(),
        password,
    };
    controller.write(&data)?;
    // agent.conf last: its presence marks a bootstrapped data dir.
    let mut conf = AgentConf::new(AGENT_TAG, Snapshot::bootstrapped(&binary));
    conf.controller = controller_uuid.clone();
    conf.model = model_uuid.clone();
    conf.controller_id = 0;
    conf.api_listen = address.clone();
    conf.apiaddresses = vec![address.clone()];
    conf.cacert = credentials.ca_pem.clone();
    conf.provisioner = options.provisioner;
    settings.apply(&mut conf);
    trust.pin(&mut conf, keyring_path, ca_path);
    data.write_agent_conf(&conf)?;
    Ok(Prepared {
        data,
        binary,
        controller,
        local,
        ahead,
    })
}

/// The metadata trust `options` ask for: the key file read (armored or binary public keys)
/// and the flag. Refuses a metadata source with neither.
fn metadata_trust(options: &BootstrapOptions) -> Result<MetadataTrust, BootstrapError> {
    let keyring = match &options.metadata_key {
        Some(path) => datadir::read_keyring(path).map_err(|error| BootstrapError::MetadataKey {
            path: path.clone(),
            error,
        })?,
        None => Keyring::empty(),
    };
    if let Some(source) = &options.metadata_source
        && keyring.is_empty()
        && !options.allow_unsigned_metadata
    {
        return Err(BootstrapError::MetadataTrustNotChosen {
            given: source.clone(),
        });
    }
    let mirror_cas = match &options.metadata_ca {
        Some(path) => {
            datadir::read_metadata_ca(path)
                .map_err(|error| BootstrapError::MetadataCa {
                    path: path.clone(),
                    error: Box::new(error),
                })?
                .1
        }
        None => Vec::new(),
    };
    Ok(MetadataTrust::new(keyring, options.allow_unsigned_metadata)
        .with_mirror_cas(mirror_cas)
        .with_redirects_to_other_hosts(options.allow_metadata_redirects))
}

/// Installs `version` from the metadata source, if published there for this host; the
/// metadata must verify as `trust` says.
///
/// With `ahead` (`--auto-upgrade`, and the model's agent-stream), also fetches and installs,
/// at the same time, the binary the controller will upgrade to at its first start: the
/// core's choice ([`policy::select`] for [`policy::Occasion::Bootstrap`] under
/// [`UpgradePolicy::AutoPatch`]) from the same verified catalogue. The controller stages a
/// binary already installed with the catalogue's sha256 without downloading it again, so
/// the upgrade's download overlaps bootstrap's own instead of following it.
async fn install_published(
    data: &DataDir,
    url: &str,
    version: Version,
    trust: &MetadataTrust,
    ahead: Option<Option<Stream>>,
) -> Result<Option<Installed>, BootstrapError> {
    let source = MetadataSource::open(url, trust).map_err(|error| BootstrapError::Source {
        url: url.to_owned(),
        error,
    })?;
    let mark = lockstep_streams::HighWaterMarkFile::new(data.streams_mark_path());
    let config = trust
        .lookup_config(url)
        .map_err(|problem| BootstrapError::Untrusted {
            url: url.to_owned(),
            problem,
        })?;
    let lookup = source
        .look_up(&mark, &config, unix_now())
        .await
        .map_err(|error| BootstrapError::Lookup {
            url: url.to_owned(),
            hint: trust.hint(&error),
            error: Box::new(error),
        })?;
    let host = datadir::host_binary(version);
    let Some(entry) = lookup
        .catalogue
        .entries()
        .iter()
        .find(|entry| entry.binary == host)
        .cloned()
    else {
        return Ok(None);
    };
    let next = ahead.and_then(|stream| {
        let request = policy::SelectionRequest {
            running: &entry.binary,
            policy: &UpgradePolicy::AutoPatch,
            stream,
            occasion: policy::Occasion::Bootstrap,
        };
        match policy::select(&request, &lookup.catalogue) {
            Ok(policy::Decision::Upgrade { entry }) => Some(entry),
            _ => None,
        }
    });
    let cache = data.tools_cache_dir();
    std::fs::create_dir_all(&cache).map_err(DataDirError::io(&cache, "create the directory"))?;
    let first = fetch_and_install(&source, data, url, entry);
    let Some(next) = next else {
        return Ok(Some((first.await?, None)));
    };
    let (first, next) = tokio::join!(first, fetch_and_install(&source, data, url, next));
    Ok(Some((first?, Some(next))))
}

/// The binary installed from the metadata source, and the one fetched ahead for the
/// controller's first upgrade (or why that failed).
type Installed = (Binary, Option<Result<Binary, BootstrapError>>);

/// Downloads `entry` into the tools cache (size and sha256 checked as it streams) and
/// installs it (checked again, unpacked, renamed into place) on a blocking thread.
async fn fetch_and_install(
    source: &MetadataSource,
    data: &DataDir,
    url: &str,
    entry: CatalogueEntry,
) -> Result<Binary, BootstrapError> {
    let tarball = data
        .tools_cache_dir()
        .join(format!("juju-{}.tgz", entry.binary));
    source.download(&entry, &tarball, &mut |_| {}).await?;
    let tools = DownloadedTools {
        version: entry.binary.clone(),
        url: format!("{}/{}", url.trim_end_matches('/'), entry.path),
        sha256: entry.sha256,
        size_bytes: entry.size_bytes,
        download_rate: None,
    };
    let data = data.clone();
    let binary = entry.binary;
    tokio::task::spawn_blocking(move || {
        data.install_tarball(&binary, &tarball, &tools)?;
        Ok(binary)
    })
    .await
    .map_err(|error| BootstrapError::Task {
        what: "installing the agent binary",
        error,
    })?
}

/// Reads which binary the local `lockstepd` is (`options.local_agent`: its marker, its ELF
/// header, a `FORCE-VERSION` beside it) and refuses one this host cannot run.
fn identify_local(options: &BootstrapOptions) -> Result<BinaryIdentity, BootstrapError> {
    let identity =
        datadir::read_binary_identity(&options.local_agent).map_err(BootstrapError::LocalAgent)?;
    identity
        .require_arch(datadir::host_arch())
        .map_err(BootstrapError::LocalAgent)?;
    tracing::info!(
        target: "lockstep::bootstrap",
        path = %identity.path.display(),
        binary = %identity.binary,
        sha256 = %identity.sha256,
        size_bytes = identity.size_bytes,
        "local agent binary identified"
    );
    Ok(identity)
}

/// Installs the identified local binary; with `requested` (`--agent-version`), only when it
/// is that version.
fn install_local(
    data: &DataDir,
    identity: &BinaryIdentity,
    requested: Option<Version>,
) -> Result<Binary, BootstrapError> {
    if let Some(version) = requested
        && version != identity.binary.number
    {
        return Err(BootstrapError::NeedsPublished {
            version,
            own: identity.binary.number,
            path: identity.path.clone(),
        });
    }
    // A copy that does not hash as the file read is refused naming the file.
    let dir = data.install_identified_binary(identity)?;
    tracing::debug!(target: "lockstep::bootstrap", dir = %dir.display(), "local agent installed");
    Ok(identity.binary.clone())
}

pub use crate::process::spawn_daemon;

/// The last lines of the daemon's log, for failure messages.
pub fn log_tail(data: &DataDir, lines: usize) -> String {
    let text = std::fs::read_to_string(data.logs_dir().join("lockstepd.log")).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// How far the controller has got, from `Upgrade.WatchProgress`/`Status`, or from the
/// launcher's `STATUS=` lines ([`Progress::from_status`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub phase: String,
    pub step: u64,
    pub steps: u64,
    pub target: Option<String>,
    pub message: Option<String>,
    pub download: Option<(u64, u64)>,
    /// What went wrong last (an upgrade given up, steps held), even after moving on.
    pub last_failure: Option<String>,
}

impl Progress {
    pub fn from_json(value: &serde_json::Value) -> Progress {
        Progress {
            phase: value["phase"].as_str().unwrap_or("unknown").to_owned(),
            step: value["step"].as_u64().unwrap_or(0),
            steps: value["steps"].as_u64().unwrap_or(0),
            target: value["target-version"].as_str().map(str::to_owned),
            message: value["message"]
                .as_str()
                .filter(|m| !m.is_empty())
                .map(str::to_owned),
            download: value["download"]["received"]
                .as_u64()
                .zip(value["download"]["total"].as_u64()),
            last_failure: value["last-failure"]
                .as_str()
                .filter(|m| !m.is_empty())
                .map(str::to_owned),
        }
    }

    /// The progress a launcher's `STATUS=` line gives (the same facts as `Upgrade.Status`
    /// but the download's bytes); `last_failure` is carried from `before` unless the line
    /// reports a failure itself, as the controller keeps it.
    pub fn from_status(line: &crate::notify::StatusLine, before: &Progress) -> Progress {
        let failed = [
            lockstep_core::Phase::StepsFailed.as_str(),
            lockstep_core::Phase::UpgradeFailed.as_str(),
        ]
        .contains(&line.phase.as_str());
        let (step, steps) = line.steps.unwrap_or((0, 0));
        Progress {
            phase: line.phase.clone(),
            step,
            steps,
            target: line.target.clone(),
            message: line.message.clone(),
            download: None,
            last_failure: match &line.message {
                Some(message) if failed => Some(message.clone()),
                _ => before.last_failure.clone(),
            },
        }
    }

    /// What the controller is doing, or `nothing` when it has not said yet.
    pub fn describe_or(&self, nothing: &str) -> String {
        if self.phase.is_empty() {
            nothing.to_owned()
        } else {
            self.describe()
        }
    }

    pub fn describe(&self) -> String {
        let mut line = self.phase.clone();
        if self.steps > 0 {
            line.push_str(&format!(" step {}/{}", self.step, self.steps));
        }
        if let Some(target) = &self.target {
            line.push_str(&format!(" to {target}"));
        }
        if let Some((received, total)) = self.download {
            line.push_str(&format!(
                " (download {:.1}/{:.1} MiB)",
                received as f64 / 1_048_576.0,
                total as f64 / 1_048_576.0
            ));
        }
        if let Some(message) = &self.message {
            line.push_str(&format!(": {message}"));
        }
        line
    }
}

/// How long bootstrap listens for the launcher's first notification before it waits
/// through the API instead (for a launcher that forwards none). A launcher that forwards
/// them does so within milliseconds of its worker's start; the margin is for a loaded
/// machine, where falling back early would put the login's argon2 check back in the way.
pub const NOTIFY_GRACE: Duration = Duration::from_secs(10);

/// Waits for `READY=1` from the launcher `pid` on `listener` (its `NOTIFY_SOCKET`), calling
/// `on_change` with each new progress its `STATUS=` lines give. Datagrams from any other
/// process are ignored. `Ok(None)` when nothing came from the launcher within `grace`.
/// Fails when `pid` dies, or at `deadline`, naming the phase it was in.
pub async fn wait_notified(
    listener: &crate::notify::Listener,
    pid: u32,
    deadline: Duration,
    grace: Duration,
    mut on_change: impl FnMut(&Progress),
) -> Result<Option<Progress>, WaitError> {
    let started = Instant::now();
    let mut last = Progress::default();
    let mut heard = false;
    let mut buffer = [0u8; 4096];
    loop {
        let waited = started.elapsed();
        if waited >= deadline {
            return Err(WaitError::Timeout {
                deadline,
                last: Box::new(last),
            });
        }
        if !heard && waited >= grace {
            return Ok(None);
        }
        if !crate::process::alive(pid) {
            return Err(WaitError::Exited {
                pid,
                last: Box::new(last),
            });
        }
        // Woken at least every 100 ms to look at the launcher and the clock.
        let received =
            tokio::time::timeout(Duration::from_millis(100), listener.receive(&mut buffer)).await;
        let (length, sender) = match received {
            Ok(Ok(received)) => received,
            Ok(Err(error)) => {
                tracing::debug!(%error, "reading the launcher's notifications");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => continue,
        };
        if sender != Some(pid) {
            continue;
        }
        heard = true;
        let notification = crate::notify::Notification::parse(&buffer[..length]);
        if let Some(status) = &notification.status {
            let now = Progress::from_status(&crate::notify::StatusLine::parse(status), &last);
            if now != last {
                on_change(&now);
                last = now;
            }
        }
        if notification.ready {
            return Ok(Some(last));
        }
    }
}

/// Waits until the controller is Ready, calling `on_change` with each new progress.
/// Fails when `pid` dies, or at `deadline`, naming the phase it was in.
pub async fn wait_until_ready(
    client: &Client,
    pid: Option<u32>,
    deadline: Duration,
    mut on_change: impl FnMut(&Progress),
) -> Result<Progress, WaitError> {
    let started = Instant::now();
    let mut last = Progress::default();
    let mut seen = json!({});
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(WaitError::Timeout {
                deadline,
                last: Box::new(last),
            });
        }
        if let Some(pid) = pid
            && !crate::process::alive(pid)
        {
            return Err(WaitError::Exited {
                pid,
                last: Box::new(last),
            });
        }
        let poll = left.min(Duration::from_secs(2));
        let answer = tokio::time::timeout(
            poll,
            client.call("Upgrade", 1, "WatchProgress", seen.clone(), poll),
        )
        .await;
        let Ok(Ok(progress)) = answer else {
            continue;
        };
        seen = json!({"phase": progress["phase"], "step": progress["step"]});
        let mut now = Progress::from_json(&progress);
        if let Ok(status) = client
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(5))
            .await
        {
            let detail = Progress::from_json(&status);
            now.message = detail.message;
            now.download = detail.download;
            now.last_failure = detail.last_failure;
        }
        if now != last {
            on_change(&now);
            last = now;
        }
        if progress["ready"].as_bool() == Some(true) {
            return Ok(last);
        }
    }
}

/// What a successful bootstrap did.
#[derive(Debug)]
pub struct Outcome {
    /// The launcher's pid.
    pub pid: u32,
    pub data: DataDir,
    pub controller: ControllerFile,
    /// The versions before and after, when bootstrap upgraded.
    pub upgraded: Option<(String, String)>,
    /// The agent version the controller runs when bootstrap returns.
    pub agent_version: String,
    /// Every progress seen, in order.
    pub progress: Vec<Progress>,
}

/// Stops the daemon bootstrap started (SIGTERM to the launcher).
fn stop_daemon(pid: u32) {
    if let Some(target) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(target, rustix::process::Signal::TERM);
    }
}

/// `lockstep bootstrap`: prepares the data dir, starts `lockstepd`, calls `on_started` with
/// the controller and the version it starts on (the CLI adds it to Juju's client store
/// there), and waits until its API is fully available, drawing progress on stderr. On
/// failure the daemon is stopped and the error names the phase, the reason and the end of
/// the daemon's log.
pub async fn bootstrap<E: std::error::Error + Send + Sync + 'static>(
    options: &BootstrapOptions,
    timeout: Duration,
    mut on_line: impl FnMut(&str),
    on_started: impl FnOnce(&ControllerFile, &str) -> Result<(), E>,
) -> Result<Outcome, BootstrapError> {
    let prepared = prepare(options).await?;
    on_line(&format!(
        "Installed agent binary {} in {}",
        prepared.binary,
        prepared.data.binary_dir(&prepared.binary).display()
    ));
    if let Some(identity) = &prepared.local
        && let Some(forced) = identity.forced_version
    {
        on_line(&format!(
            "Its version {forced} is from the FORCE-VERSION beside {} (built as {})",
            identity.path.display(),
            identity.built_version
        ));
    }
    match &prepared.ahead {
        Some(Ok(next)) => on_line(&format!(
            "Fetched agent binary {next} ahead: the controller upgrades to it at its first start"
        )),
        Some(Err(error)) => on_line(&format!(
            "Note: could not fetch the upgrade's binary ahead ({error}); the controller will \
             download it itself"
        )),
        None => {}
    }
    // The launcher tells bootstrap, as it would tell systemd, what its worker's lifecycle
    // does (`STATUS=`) and when it is Ready (`READY=1`). Bootstrap waits on that without
    // logging in, so no password check (argon2: tens of milliseconds of CPU by design,
    // done again on the new worker when a login is in flight across its restart) stands
    // between the controller's Ready and the end of bootstrap. The API is the fallback.
    let listener = crate::notify::Listener::bind("lockstep-bootstrap")
        .inspect_err(|error| {
            tracing::debug!(%error, "no notification socket; waiting through the API");
        })
        .ok();
    let pid = crate::process::spawn_daemon_notifying(
        &prepared.data,
        &[],
        listener
            .as_ref()
            .map(crate::notify::Listener::address)
            .as_deref(),
    )?;
    on_line(&format!(
        "Started lockstepd (pid {pid}) on {}; waiting until it is ready",
        prepared.controller.api_endpoints[0]
    ));
    // Clients may connect from now on (and are served reads while it is limited), as
    // `juju bootstrap` adds the controller to the client store before it is ready.
    if let Err(error) = on_started(&prepared.controller, &prepared.binary.number.to_string()) {
        stop_daemon(pid);
        return Err(BootstrapError::ClientStore(Box::new(error)));
    }
    // The daemon was started a moment ago and opens its port within milliseconds: the
    // first connect usually comes too early, and the default first wait (100 ms, for
    // clients of a controller that is restarting) would be most of a bootstrap's time.
    let client = prepared
        .controller
        .client(lockstep_core::client::RetryPolicy {
            initial: lockstep_core::Millis(5),
            ..lockstep_core::client::RetryPolicy::default()
        });
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    let terminal = !bar.is_hidden();
    let mut seen = Vec::new();
    let mut show = |progress: &Progress| {
        bar.set_message(progress.describe());
        let line = format!(" - {}", progress.describe());
        let new_phase = seen.last().map(|last: &Progress| &last.phase) != Some(&progress.phase);
        if terminal && new_phase {
            bar.println(line);
        } else if !terminal {
            // Not a terminal (a log, CI): every change on its own line.
            crate::logging::complain(&line);
        }
        seen.push(progress.clone());
    };
    let started = Instant::now();
    let notified = match &listener {
        Some(listener) => wait_notified(listener, pid, timeout, NOTIFY_GRACE, &mut show).await,
        None => Ok(None),
    };
    let result = match notified {
        Ok(Some(last)) => Ok(Some(last)),
        Ok(None) => {
            if listener.is_some() {
                let line = format!(
                    "Note: lockstepd sent no notification within {}s; waiting through its API",
                    NOTIFY_GRACE.as_secs()
                );
                bar.suspend(|| on_line(&line));
            }
            let left = timeout.saturating_sub(started.elapsed());
            wait_until_ready(&client, Some(pid), left, &mut show)
                .await
                .map(|_| None)
        }
        Err(error) => Err(error),
    };
    bar.finish_and_clear();
    match result {
        Ok(Some(last)) => {
            // Ready as the launcher said: the binary it runs is the one its link names.
            let initial = prepared.binary.number.to_string();
            let running = match prepared.data.current_binary(AGENT_TAG)? {
                Some(binary) => binary.number.to_string(),
                None => initial.clone(),
            };
            if let Some(failure) = last.last_failure {
                on_line(&format!("Note: {failure}"));
            }
            Ok(Outcome {
                pid,
                data: prepared.data,
                controller: prepared.controller,
                upgraded: (running != initial).then(|| (initial, running.clone())),
                agent_version: running,
                progress: seen,
            })
        }
        Ok(None) => {
            let status = client
                .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(10))
                .await
                .map_err(|error| BootstrapError::Status(Box::new(error)))?;
            let running = status["agent-version"].as_str().unwrap_or("").to_owned();
            let initial = prepared.binary.number.to_string();
            if let Some(failure) = Progress::from_json(&status).last_failure {
                on_line(&format!("Note: {failure}"));
            }
            Ok(Outcome {
                pid,
                data: prepared.data,
                controller: prepared.controller,
                agent_version: if running.is_empty() {
                    initial.clone()
                } else {
                    running.clone()
                },
                upgraded: (running != initial && !running.is_empty()).then_some((initial, running)),
                progress: seen,
            })
        }
        Err(error) => {
            stop_daemon(pid);
            Err(BootstrapError::NotReady {
                error,
                log: prepared.data.logs_dir().join("lockstepd.log"),
                tail: log_tail(&prepared.data, 15),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{Listener, Notifier};

    /// A notifier that reaches `listener`, as the launcher's does once bootstrap sets its
    /// `NOTIFY_SOCKET`.
    fn notifier_of(listener: &Listener) -> Notifier {
        Notifier::to(&listener.address()).unwrap()
    }

    #[tokio::test]
    async fn the_launchers_status_lines_are_shown_and_ready_ends_the_wait() {
        let listener = Listener::bind("lockstep-test-bootstrap").unwrap();
        let launcher = notifier_of(&listener);
        launcher.status("checking-agent-version");
        launcher.status("upgrade-failed 0/1 to 2.9.43: the download failed");
        launcher.status("running-steps 1/2 to 2.9.43: record agent binaries");
        launcher.ready();
        let mut shown = Vec::new();
        let last = wait_notified(
            &listener,
            std::process::id(),
            Duration::from_secs(10),
            NOTIFY_GRACE,
            |progress| shown.push(progress.describe()),
        )
        .await
        .unwrap()
        .expect("the launcher was heard");
        assert_eq!(
            shown,
            [
                "checking-agent-version",
                "upgrade-failed step 0/1 to 2.9.43: the download failed",
                "running-steps step 1/2 to 2.9.43: record agent binaries",
                "ready",
            ]
        );
        assert_eq!(last.phase, "ready");
        // What went wrong last is kept after moving on, as `Upgrade.Status` keeps it.
        assert_eq!(last.last_failure.as_deref(), Some("the download failed"));
    }

    #[tokio::test]
    async fn a_notification_from_another_process_is_ignored_and_silence_past_the_grace_is_none() {
        let mut launcher = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let listener = Listener::bind("lockstep-test-bootstrap").unwrap();
        // Sent by this process, not the launcher: ignored, as anyone's would be.
        notifier_of(&listener).ready();
        let started = Instant::now();
        let waited = wait_notified(
            &listener,
            launcher.id(),
            Duration::from_secs(10),
            Duration::from_millis(300),
            |_| {},
        )
        .await;
        launcher.kill().unwrap();
        launcher.wait().unwrap();
        assert!(matches!(waited, Ok(None)), "{waited:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_launcher_that_exits_ends_the_wait_naming_its_pid() {
        let mut launcher = std::process::Command::new("true").spawn().unwrap();
        let pid = launcher.id();
        launcher.wait().unwrap();
        let listener = Listener::bind("lockstep-test-bootstrap").unwrap();
        let waited = wait_notified(
            &listener,
            pid,
            Duration::from_secs(10),
            NOTIFY_GRACE,
            |_| {},
        )
        .await;
        assert!(
            matches!(waited, Err(WaitError::Exited { pid: exited, .. }) if exited == pid),
            "{waited:?}"
        );
    }
}
