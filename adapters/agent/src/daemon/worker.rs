//! The worker: the process that serves the API and drives the lifecycle, started by the
//! launcher from `tools/<agent-tag>/lockstepd`.
//!
//! It takes its listening socket from the launcher (`LOCKSTEP_LISTEN_FD`), so the socket
//! outlives every worker: a client that connects while one worker ends and the next one
//! starts waits in the socket's backlog instead of being refused. When the core asks to
//! restart into a new binary the worker switches `tools/<agent-tag>`, closes its clients'
//! connections (they reconnect at once) and, by default, re-executes itself from the new
//! binary, handing the socket over (`--restart=exec`); with `--restart=exit` it exits with
//! [`EXIT_RESTART`] and the launcher (or another supervisor) starts the new binary.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use lockstep_core::lifecycle::{Config, ControllerId, Input, Limits, OperatorAction};
use lockstep_core::policy::{Catalogue, CatalogueEntry, Stream};
use lockstep_core::{Binary, Lifecycle, Role, Roles, Version};
use lockstep_store::Store;
use lockstep_transport::api::{Api, ApiConfig};
use lockstep_transport::backend::{Backend, StatusDetail};
use lockstep_transport::tls::Credentials;
use tokio::sync::{mpsc, watch};

use crate::api::StoreState;
use crate::daemon::catalogue::CatalogueCache;
use crate::daemon::driver::{self, AgentStatus, Driver, DriverConfig, Exit};
use crate::daemon::error::{DaemonError, ListenFdProblem};
use crate::datadir::{self, AgentConf, DataDir, DataDirError};
use crate::metadata::{MetadataSource, MetadataTrust};
use crate::notify::Notifier;
use crate::store::StoreSetupError;

use crate::daemon::restart::restart_into;
pub use crate::daemon::restart::{EXIT_FATAL, EXIT_RESTART, LISTEN_FD, RestartMode};

/// The environment variable carrying the launcher's pid, so that a worker whose launcher
/// died before the worker could ask for its death signal notices and ends.
pub const LAUNCHER_PID: &str = "LOCKSTEP_LAUNCHER_PID";

/// Set by a launcher that holds the clients' connections itself (`--front-door`): the
/// worker serves them over the relay socket at this path (`spec/relay.md`) instead of the
/// API's port, which the launcher keeps.
pub const RELAY_SOCKET: &str = "LOCKSTEP_RELAY_SOCKET";

/// The worker's settings.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub data_dir: PathBuf,
    pub restart: RestartMode,
    pub limits: Limits,
    /// Where the environment provider's capabilities come from.
    pub capabilities: crate::daemon::capabilities::CapabilitySource,
    /// `--store`, `--etcd-endpoints`, `--etcd-insecure`: override `agent.conf`'s store.
    pub store: crate::store::StoreOverrides,
    /// The API's limits (`--max-connections` and the rest).
    pub api_limits: lockstep_transport::limits::ApiLimits,
}

impl WorkerOptions {
    /// The store `conf` names, with this run's overrides, checked.
    pub fn store_settings(
        &self,
        conf: &AgentConf,
    ) -> Result<crate::store::StoreSettings, StoreSetupError> {
        self.store.settings(conf)
    }
}

/// The version this executable reports: its `FORCE-VERSION` file if there is one beside it
/// (Juju's mechanism, so that one build can play two versions), else the build's own.
pub fn running_version() -> Result<Version, DaemonError> {
    let dir = crate::paths::executable_dir()?;
    Ok(datadir::read_force_version(&dir)?.unwrap_or_else(crate::steps::build_version))
}

/// The binary this process runs.
pub fn running_binary() -> Result<Binary, DaemonError> {
    Ok(datadir::host_binary(running_version()?))
}

/// Takes the listening socket handed over in `LOCKSTEP_LISTEN_FD`.
#[allow(unsafe_code)]
fn inherited_listener(text: &str) -> Result<std::net::TcpListener, DaemonError> {
    let refused = |problem: ListenFdProblem| DaemonError::ListenFd {
        variable: LISTEN_FD,
        text: text.to_owned(),
        problem,
    };
    let fd: i32 = text
        .parse()
        .map_err(|_| refused(ListenFdProblem::NotANumber))?;
    if fd < 3 {
        return Err(refused(ListenFdProblem::StandardStream));
    }
    // SAFETY: the process that started this one opened descriptor `fd`, cleared its
    // close-on-exec flag for us, and named it in LOCKSTEP_LISTEN_FD; nothing else in this
    // process owns it. `fstat` below proves it is open before anything else uses it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::fs::fstat(&owned).map_err(|e| refused(ListenFdProblem::NotOpen(e.into())))?;
    // Not inherited further: a re-exec hands over a duplicate of its own.
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| refused(ListenFdProblem::CloseOnExec(e.into())))?;
    let listener = std::net::TcpListener::from(owned);
    listener
        .local_addr()
        .map_err(|e| refused(ListenFdProblem::NotListening(e)))?;
    Ok(listener)
}

/// The lifecycle's side of the API.
struct AgentBackend {
    inputs: mpsc::UnboundedSender<Input>,
    running: Binary,
    status: watch::Receiver<AgentStatus>,
    store: Arc<dyn Store>,
    data: DataDir,
    /// Which metadata the API's lookups accept (the driver's own, from `agent.conf`).
    metadata_trust: Arc<MetadataTrust>,
    /// The catalogue FindTools, ModelSet, Upgrader.Tools and the tools endpoint are
    /// answered from: read in the background, never waited on while one can be served.
    catalogue: CatalogueCache,
}

#[async_trait]
impl Backend for AgentBackend {
    /// The running version, the previous binary's (agent.conf) and the model's
    /// `agent-version`: what this controller and its agents run or may move to.
    async fn versions_to_keep(&self) -> Vec<Version> {
        let mut keep = vec![self.running.number];
        if let Ok(Some(conf)) = self.data.read_agent_conf()
            && let Some(previous) = conf.previous_binary
        {
            keep.push(previous.number);
        }
        let store = Arc::clone(&self.store);
        if let Ok(Ok(Some(model))) = tokio::task::spawn_blocking(move || store.load_model()).await {
            keep.push(model.agent_version);
        }
        keep
    }

    fn abort_current_upgrade(&self) -> Result<(), String> {
        self.inputs
            .send(Input::Operator(OperatorAction::Abort))
            .map_err(|_| "the agent is shutting down".to_owned())
    }

    fn agent_version(&self) -> String {
        self.running.number.to_string()
    }

    fn upgrade_available(&self) -> Option<String> {
        self.status
            .borrow()
            .upgrade_available
            .map(|version| version.to_string())
    }

    fn status_detail(&self) -> StatusDetail {
        let status = self.status.borrow();
        StatusDetail {
            message: status
                .report
                .as_ref()
                .map(|report| report.message.clone())
                .filter(|message| !message.is_empty()),
            download: status.download,
            last_failure: status.last_failure.clone(),
        }
    }

    fn agent_version_changed(&self, version: Version) {
        let _ = self.inputs.send(Input::AgentVersionChanged(version));
    }

    /// Through [`CatalogueCache`]: never waits on the mirror while a catalogue can be
    /// served, and at most [`crate::daemon::catalogue::WAIT_AT_MOST`] when none can.
    async fn catalogue(&self) -> Result<Catalogue, String> {
        let store = Arc::clone(&self.store);
        let url = tokio::task::spawn_blocking(move || driver::metadata_url(&*store))
            .await
            .map_err(|error| format!("reading the model's agent-metadata-url: {error}"))?
            .map_err(|error| error.to_string())?;
        let data = self.data.clone();
        let trust = Arc::clone(&self.metadata_trust);
        let reading = url.clone();
        self.catalogue
            .get(url, move || async move {
                match reading {
                    None => Ok(Catalogue::default()),
                    Some(url) => driver::look_up_at(&url, &data, &trust, &Stream::ALL)
                        .await
                        .map_err(|error| error.to_string()),
                }
            })
            .await
    }

    async fn fetch_binary(
        &self,
        entry: CatalogueEntry,
        destination: PathBuf,
    ) -> Result<(), String> {
        // The transport's trait carries a reason as text; the errors below name the model's
        // metadata url, the binary and the destination.
        let url = driver::metadata_url(&*self.store)
            .map_err(|error| error.to_string())?
            .ok_or_else(|| driver::CatalogueError::NoMetadataUrl.to_string())?;
        let source =
            MetadataSource::open(&url, &self.metadata_trust).map_err(|error| error.to_string())?;
        source
            .download(&entry, &destination, &mut |_| {})
            .await
            .map_err(|error| error.to_string())
    }
}

/// Says at every start which metadata this controller accepts: a warning when the operator
/// allowed unsigned metadata (`--allow-unsigned-metadata`) or the pinned keys cannot be used.
fn log_metadata_trust(trust: &MetadataTrust) {
    let verification = trust.describe();
    if let Some(problem) = &trust.problem {
        tracing::error!(target: "lockstep::agent", %problem, "metadata keys unusable: every agent-binary lookup is refused");
    } else if trust.allows_unsigned() {
        tracing::warn!(target: "lockstep::agent", metadata_verification = %verification, "unsigned agent-binary metadata is accepted (bootstrapped with --allow-unsigned-metadata): whoever can change the mirror, or the network to it, can choose the binary this controller runs");
    } else {
        tracing::info!(target: "lockstep::agent", metadata_verification = %verification, "agent-binary metadata verification");
    }
    if trust.redirects_to_other_hosts {
        tracing::warn!(target: "lockstep::agent", "an https agent-metadata-url's redirects are followed to other hosts (bootstrapped with --allow-metadata-redirects): those hosts' certificates are checked, but they, not only the mirror, serve what this controller reads");
    }
}

/// Says at every start how etcd is reached: a warning when the operator accepted plain http
/// off loopback (`--etcd-insecure`).
fn log_store_access(settings: &crate::store::StoreSettings) {
    let Some(access) = settings.access() else {
        return;
    };
    if settings.etcd_insecure {
        tracing::warn!(target: "lockstep::agent", etcd = %access, "etcd is reached with --etcd-insecure: plain http to endpoints that are not loopback is accepted, and whoever is on the network between can read the controllers' state and change it, agent-metadata-url included");
    } else {
        tracing::info!(target: "lockstep::agent", etcd = %access, "etcd access");
    }
}

/// Reads the PEM files bootstrap wrote.
/// Where a worker's clients come in.
enum Entrance {
    /// The API's own port, and a duplicate of it kept for a re-exec.
    Port(tokio::net::TcpListener, std::os::fd::OwnedFd),
    /// The launcher's relay: the socket, and the launcher's pid (the only peer accepted).
    Relay(tokio::net::UnixListener, u32),
}

fn launcher_pid() -> Option<u32> {
    std::env::var(LAUNCHER_PID).ok()?.parse().ok()
}

/// Binds the relay socket at `path`, removing one a previous worker left (the launcher
/// holds the data dir's lock: no other worker of it runs).
fn relay_listener(path: &Path) -> Result<tokio::net::UnixListener, DaemonError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(DataDirError::io(path, "remove the stale relay socket")(error).into());
        }
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(DaemonError::system("bind the relay socket"))?;
    // The owner's alone, as every file of the data dir (the peer check is the guard; the
    // mode says so to whoever lists the directory).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
        DataDirError::io(path, "restrict the relay socket to its owner"),
    )?;
    Ok(listener)
}

pub(crate) fn credentials(data: &DataDir) -> Result<Credentials, DataDirError> {
    let read =
        |path: PathBuf| std::fs::read_to_string(&path).map_err(DataDirError::io(&path, "read"));
    Ok(Credentials {
        ca_pem: read(data.ca_cert_path())?,
        certificate_pem: read(data.server_cert_path())?,
        key_pem: read(data.server_key_path())?,
    })
}

/// The API's users: `(name, argon2 hash)`, from the file bootstrap wrote.
fn users(data: &DataDir) -> Result<Vec<(String, String)>, DataDirError> {
    Ok(data
        .read_users()?
        .into_iter()
        .map(|user| (user.name, user.password_hash))
        .collect())
}

/// Writes this controller's own agent status to the shared store whenever its lifecycle's
/// status changes and every [`crate::daemon::machine_agent::STATUS_INTERVAL`] regardless,
/// as machine agents report theirs through `Machiner.SetStatus`: its `updated` time is the
/// heartbeat by which `lockstep status` shows a controller that stopped as down. Once
/// Ready, it also records the binary it runs on its machine (when the machine says
/// otherwise), which the Upgrader's controllers-first rule reads.
async fn report_own_status(
    store: Arc<dyn Store>,
    tag: String,
    running: Binary,
    mut status: watch::Receiver<AgentStatus>,
) {
    loop {
        let (phase, info) = {
            let current = status.borrow_and_update();
            match &current.report {
                Some(report) => (report.phase, report.message.clone()),
                None => (lockstep_core::Phase::Bootstrapping, String::new()),
            }
        };
        let (word, info) = crate::daemon::machine_agent::status_of(phase, &info);
        let store = Arc::clone(&store);
        let tag_now = tag.clone();
        let version = running.clone();
        let written = tokio::task::spawn_blocking(move || {
            store.transaction(None, &mut |tx| {
                let reported = lockstep_store::AgentStatus {
                    status: word.to_owned(),
                    info: info.clone(),
                    phase: phase.as_str().to_owned(),
                    version: Some(version.clone()),
                    download_rate: None,
                    updated: tx.now(),
                };
                tx.put_agent_status(&tag_now, &reported)?;
                // Ready on its binary, a controller reports it on its machine, as a machine
                // agent does with Upgrader.SetTools: the controllers-first rule lets the
                // agents follow once every controller's machine names the new version.
                if phase == lockstep_core::Phase::Ready
                    && let Some(id) = tag_now.strip_prefix("machine-")
                    && let Some(mut machine) = tx.machine(id)?
                    && machine.agent_binary.as_ref() != Some(&version)
                {
                    machine.agent_binary = Some(version.clone());
                    tx.put_machine(&machine)?;
                }
                Ok(())
            })
        })
        .await;
        if let Ok(Err(error)) = written {
            tracing::debug!(target: "lockstep::agent", %error, "own status not written");
        }
        let _ = tokio::time::timeout(
            crate::daemon::machine_agent::STATUS_INTERVAL,
            status.changed(),
        )
        .await;
    }
}

/// Runs the worker until shutdown or a restart. Returns the process's exit status (a
/// successful `--restart=exec` does not return).
pub async fn run(options: WorkerOptions, notifier: Notifier) -> Result<i32, DaemonError> {
    let data = DataDir::new(&options.data_dir);
    let running = running_binary()?;
    let conf: AgentConf = data
        .read_agent_conf()?
        .ok_or_else(|| DaemonError::NotBootstrapped {
            agent_conf: data.agent_conf_path(),
            data_dir: options.data_dir.clone(),
        })?;
    // A machine agent reaches everything through the API: it opens no store and serves no
    // port.
    if crate::daemon::machine_agent::is_machine_agent(&conf) {
        let agent = crate::daemon::machine_agent::MachineAgent {
            limits: options.limits,
            restart: options.restart,
            data,
            conf,
            running,
        };
        return crate::daemon::machine_agent::run(agent, notifier).await;
    }
    let settings = options.store_settings(&conf)?;
    tracing::info!(target: "lockstep::agent", %running, tag = %conf.tag, pid = std::process::id(), store = %settings.describe(&data), "worker starting");
    log_store_access(&settings);
    let metadata_trust = Arc::new(MetadataTrust::of(&data, &conf));
    log_metadata_trust(&metadata_trust);
    let store: Arc<dyn Store> = crate::store::open(&data, &settings)?;
    let tls = credentials(&data)?
        .server_config()
        .map_err(|error| DaemonError::Tls {
            data_dir: options.data_dir.clone(),
            error,
        })?;
    let relay_socket = std::env::var_os(RELAY_SOCKET).map(PathBuf::from);
    if std::env::var_os(LISTEN_FD).is_some() || relay_socket.is_some() {
        // Started by the launcher: never outlive it (a launcher killed with -9 must not
        // leave a worker holding the port). Kept across a re-exec.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| DaemonError::system("ask for the parent's death signal")(e.into()))?;
        // The launcher may have died before the line above took effect: then no signal
        // will come, and this worker must not serve from a socket nobody supervises.
        if let Some(launcher) = launcher_pid()
            && rustix::process::getppid().map(|pid| pid.as_raw_nonzero().get())
                != Some(launcher as i32)
        {
            return Err(DaemonError::LauncherGone {
                pid: launcher as i32,
            });
        }
    }
    // Where clients come in: the launcher's relay socket, or the API's own port.
    let entrance = match &relay_socket {
        Some(path) => {
            let launcher = launcher_pid().ok_or(DaemonError::LauncherEnvironment {
                variable: LAUNCHER_PID,
                what: "the launcher's pid",
            })?;
            let listener = relay_listener(path)?;
            tracing::info!(target: "lockstep::agent", socket = %path.display(), launcher, "serving the connections the launcher holds, over its relay");
            // The launcher's connections waiting for a worker need not wait for their
            // next retry: a stream opened now waits in the backlog until it is served.
            notifier.send("RELAY=1");
            Entrance::Relay(listener, launcher)
        }
        None => {
            let std_listener = match std::env::var(LISTEN_FD) {
                Ok(text) => inherited_listener(&text)?,
                Err(_) => std::net::TcpListener::bind(&conf.api_listen).map_err(|error| {
                    DaemonError::Listen {
                        address: conf.api_listen.clone(),
                        error,
                    }
                })?,
            };
            std_listener
                .set_nonblocking(true)
                .map_err(DaemonError::system(
                    "make the listening socket non-blocking",
                ))?;
            // Kept for a re-exec: the API's listener is closed when the API stops.
            let handover = std_listener
                .as_fd()
                .try_clone_to_owned()
                .map_err(DaemonError::system("duplicate the listening socket"))?;
            let listener = tokio::net::TcpListener::from_std(std_listener).map_err(
                DaemonError::system("register the listening socket with tokio"),
            )?;
            Entrance::Port(listener, handover)
        }
    };

    let core = Lifecycle::new(
        Config {
            controller: Some(ControllerId(conf.controller_id)),
            roles: Roles::of(&[Role::Controller]),
            running: running.clone(),
            limits: options.limits,
        },
        crate::steps::registry(),
        Some(conf.snapshot()),
    )
    .map_err(|error| DaemonError::Lifecycle {
        agent_conf: data.agent_conf_path(),
        error,
    })?;
    let (driver, handles) = Driver::new(
        core,
        DriverConfig {
            data: data.clone(),
            tag: conf.tag.clone(),
            controller: Some(ControllerId(conf.controller_id)),
            capabilities: options.capabilities.clone(),
            metadata_trust: Arc::clone(&metadata_trust),
        },
        crate::steps::registry(),
        Arc::clone(&store),
        notifier,
    );
    let backend = Arc::new(AgentBackend {
        inputs: handles.inputs.clone(),
        running: running.clone(),
        status: handles.status.clone(),
        store: Arc::clone(&store),
        data: data.clone(),
        metadata_trust: Arc::clone(&metadata_trust),
        catalogue: CatalogueCache::new(),
    });
    let api = Api::new(
        ApiConfig {
            model_uuid: conf.model.clone(),
            controller_uuid: conf.controller.clone(),
            users: users(&data)?,
            tools_cache: Some(data.tools_cache_dir()),
            limits: options.api_limits.clone(),
        },
        handles.gate.clone(),
        Arc::new(StoreState::new(Arc::clone(&store)).with_local_controller(
            conf.controller_id.to_string(),
            metadata_trust.describe(),
            settings.access(),
        )),
        backend,
    );
    let (server, handover) = match entrance {
        Entrance::Port(listener, handover) => (
            tokio::spawn(Arc::clone(&api).serve(listener, tls)),
            Some(handover),
        ),
        Entrance::Relay(listener, launcher) => {
            let address = conf.api_listen.parse().ok();
            let launcher = lockstep_transport::relayed::Launcher {
                pid: launcher,
                uid: rustix::process::geteuid().as_raw(),
            };
            let ca_pem = credentials(&data)?.ca_pem;
            (
                tokio::spawn(Arc::clone(&api).serve_relayed(listener, launcher, address, ca_pem)),
                None,
            )
        }
    };

    let (shutdown_tx, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        crate::process::wait_for_termination().await;
        let _ = shutdown_tx.send(true);
    });

    let heartbeat = tokio::spawn(report_own_status(
        Arc::clone(&store),
        conf.tag.clone(),
        running.clone(),
        handles.status.clone(),
    ));
    let provisioner = match conf.provisioner {
        crate::datadir::Provisioner::Manual => None,
        crate::datadir::Provisioner::Local => Some(tokio::spawn(crate::daemon::provisioner::run(
            crate::daemon::provisioner::Provisioner {
                store: Arc::clone(&store),
                data: data.clone(),
                tag: conf.tag.clone(),
                identity: lockstep_transport::state::Identity {
                    model_uuid: conf.model.clone(),
                    controller_uuid: conf.controller.clone(),
                },
                api_addresses: std::iter::once(conf.api_listen.clone())
                    .chain(
                        conf.apiaddresses
                            .iter()
                            .filter(|address| **address != conf.api_listen)
                            .cloned(),
                    )
                    .collect(),
                ca_pem: credentials(&data)?.ca_pem,
                version: running.number,
            },
            handles.status.clone(),
        ))),
    };
    let coordinator = tokio::spawn(crate::daemon::rollout::run(
        Arc::clone(&store),
        ControllerId(conf.controller_id),
        options.limits.lease_ttl(),
        handles.status.clone(),
    ));
    let exit = driver.run(shutdown).await;
    heartbeat.abort();
    coordinator.abort();
    if let Some(provisioner) = provisioner {
        provisioner.abort();
    }
    // Closes the listener's copy and every client connection; the socket itself stays open
    // through `handover` (and the launcher's copy), so new clients wait in its backlog.
    server.abort();
    let _ = server.await;
    drop(api);
    drop(store);
    match exit {
        Exit::Shutdown => {
            tracing::info!(target: "lockstep::agent", "worker stopped");
            Ok(0)
        }
        Exit::Fatal(reason) => {
            tracing::error!(target: "lockstep::agent", %reason, "worker cannot go on");
            Ok(EXIT_FATAL)
        }
        Exit::RestartInto(binary) => restart_into(
            options.restart,
            &data,
            &conf.tag,
            &binary,
            handover.as_ref(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the launcher hands its worker is never passed on to a daemon the worker starts
    /// (the local provisioner's machine agents have launchers of their own).
    #[test]
    fn a_detached_daemon_gets_none_of_the_launcher_s_environment() {
        for name in [
            LAUNCHER_PID,
            RELAY_SOCKET,
            LISTEN_FD,
            crate::notify::NOTIFY_SOCKET,
        ] {
            assert!(
                crate::process::SUPERVISION_ENVIRONMENT.contains(&name),
                "{name}"
            );
        }
    }
}
