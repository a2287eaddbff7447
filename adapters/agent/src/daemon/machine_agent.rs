//! The machine agent: `lockstepd` in the host-machine role (Juju's machine agent). It never
//! opens the store: everything goes through its controllers' API, logged in as its tag with
//! the password of its `agent.conf` (issued by `MachineManager.ProvisioningScript`).
//!
//! At start it reads its jobs (`Agent.GetEntities`) and turns them into roles, reports the
//! binary it runs (`Upgrader.SetTools`), and runs the same lifecycle as a controller with
//! those roles and no controller id: the core decides; this driver only answers its
//! requests through the API:
//!
//! | request | answered by |
//! |---|---|
//! | `PersistSnapshot` | `agent.conf`, atomically |
//! | `LoadModel` | `Upgrader.DesiredVersion`: the version the controllers want this agent on (controllers first) |
//! | `RunStep` (host steps only) | the step runner, on this host |
//! | `DesiredBinary` | `Upgrader.Tools`: the catalogue's binary and its URL on the tools endpoint |
//! | `StageBinary` (from the controller) | a verified download from that URL (HTTP Basic, the controller's CA), unpacked |
//! | `RestartInto` | the `tools/<tag>` link switched, then a re-exec (or exit 3) |
//!
//! The desired version is followed through `Upgrader.WatchAPIVersion` and
//! `NotifyWatcher.Next`, each change fed to the core as `AgentVersionChanged` (acted on in
//! Ready). Its status, phase and binary go to `Machiner.SetStatus` whenever they change and
//! every [`STATUS_INTERVAL`] (a heartbeat: the controllers show an agent silent for three
//! intervals as down). When no controller answers, the agent keeps running what it runs
//! and its calls retry with backoff through every address of `agent.conf`.
//!
//! **Architecture Invariant:** no lifecycle decision here, as in the controller's driver;
//! and no store: this module holds no `Store`.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_core::gate::GateView;
use lockstep_core::jobs::{Job, JobsError};
use lockstep_core::lifecycle::{
    Config, ControllerSet, Input, ModelView, Output, Request, RequestId, StagePlan, StageSource,
    StatusReport, StepOutcome,
};
use lockstep_core::policy::{PolicyError, Sha256, UpgradePolicy};
use lockstep_core::steps::{StepKey, StepKind};
use lockstep_core::{Binary, Lifecycle, ParseVersionError, Phase, Role, Roles, Timestamp, Version};
use lockstep_transport::client::{Client, ClientConfig, ClientError};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::{mpsc, watch};

use crate::daemon::error::DaemonError;
use crate::daemon::gate_hold::GateHold;
use crate::daemon::restart::{self, RestartMode};
use crate::daemon::step_runner::{self, HostContext};
use crate::datadir::{AgentConf, DataDir, DataDirError, DownloadedTools, LinkProbe};
use crate::notify::Notifier;
use crate::quote::{QUOTE_LENGTH_MAX, quote};

/// How often the agent reports its status even when nothing changed (its heartbeat): the
/// interval the controllers' "down" rule counts in.
pub const STATUS_INTERVAL: Duration = lockstep_transport::facade::machiner::AGENT_STATUS_INTERVAL;

/// The longest one API call is retried (through upgrades, restarts and unreachable
/// controllers) before the agent logs it and tries again after [`RETRY_PAUSE`].
const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// The pause between two rounds of a call that gave up.
const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// The longest an agent keeps asking a busy controller for its download before it hands
/// the failure to the core (which retries the staging later).
const BUSY_WAIT_MAX: Duration = Duration::from_secs(600);

/// A random draw, for the jitter the core's rules take as data.
fn random() -> u64 {
    use rand_core::RngCore;
    rand_core::OsRng.next_u64()
}

/// The longest a `NotifyWatcher.Next` waits for the server's answer before it is asked again.
const NEXT_DEADLINE: Duration = Duration::from_secs(300);

/// True when `conf` is a machine agent's: no API of its own to serve, a password to log in.
pub fn is_machine_agent(conf: &AgentConf) -> bool {
    conf.api_listen.is_empty() && !conf.apipassword.is_empty()
}

/// Why the machine agent ended.
enum Exit {
    RestartInto(Binary),
    Shutdown,
    Fatal(MachineAgentError),
}

/// Why one of the machine agent's requests, calls or downloads failed, or why it cannot go
/// on. Each names the API call, file, URL or value that was bad. (Where the core takes a
/// `String`, a staging failure or a step's, its text is this error's message.)
#[derive(Debug, thiserror::Error)]
pub enum MachineAgentError {
    /// An API call failed: the server refused it, or it gave up (controllers unreachable or
    /// upgrading past its deadline).
    #[error("{call}: {error}")]
    Api {
        call: ApiCall,
        #[source]
        error: Box<ClientError>,
    },
    /// A bulk call's reply has no `results` (or `entities`) to take the first of.
    #[error("{call}: the reply has no {key}: {reply}")]
    NoResults {
        call: ApiCall,
        key: &'static str,
        /// The reply, shortened.
        reply: String,
    },
    /// The server answered this agent's entity with an error.
    #[error("{call}: {message} (code {code})")]
    Refused {
        call: ApiCall,
        message: String,
        code: String,
    },
    /// A reply lacks what the call answers.
    #[error("{call} answered no {what}: {reply}")]
    Missing {
        call: ApiCall,
        /// What is missing (`tools`, `jobs for machine-1`, ...).
        what: String,
        /// The part of the reply that lacks it, shortened.
        reply: String,
    },
    /// A reply's field holds a value lockstep refuses.
    #[error("{call}: {field}: {error}")]
    Malformed {
        call: ApiCall,
        field: &'static str,
        #[source]
        error: Box<BadValue>,
    },
    /// `Upgrader.Tools` named a URL that is not on a tools endpoint (`https://host/model/...`).
    #[error("Upgrader.Tools: {} is not a tools endpoint URL", quote(url))]
    NotToolsUrl { url: String },
    /// The core asked to stage a binary no `Upgrader.Tools` answer named a URL for.
    #[error("no tools endpoint URL known for {binary}: Upgrader.Tools did not name it")]
    NoToolsUrl { binary: Binary },
    /// The controller's CA in `agent.conf` cannot be trusted for the download.
    #[error("{}'s cacert: {error}", agent_conf.display())]
    CaCert {
        agent_conf: PathBuf,
        #[source]
        error: lockstep_streams::SourceError,
    },
    /// The tools endpoint cannot be made a download source.
    #[error("cannot download from the tools endpoint: {error}")]
    ToolsSource {
        #[source]
        error: lockstep_streams::SourceError,
    },
    /// The download failed (other than the controller being busy, which is waited out).
    #[error("cannot download {binary} from the controller: {error}")]
    Download {
        binary: Binary,
        #[source]
        error: Box<lockstep_streams::DownloadError>,
    },
    /// The link probe failed (the controller down or restarting, busy with other probes,
    /// the connection cut): tried again after `LINK_PROBE_RETRY`.
    #[error("cannot probe the link to the controller at {url}: {error}")]
    LinkProbe {
        url: String,
        #[source]
        error: Box<lockstep_streams::DownloadError>,
    },
    /// The download cache cannot be created.
    #[error("cannot create {}: {error}", path.display())]
    CreateCache {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    /// `agent.conf` cannot be read or written, or the binary cannot be unpacked and installed.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// `agent.conf` was deleted under the running agent.
    #[error("{} vanished while the agent ran", path.display())]
    AgentConfVanished { path: PathBuf },
    /// `tools/<tag>` cannot be pointed at the binary to restart into.
    #[error("cannot switch to {binary}: {error}")]
    Switch {
        binary: Binary,
        #[source]
        error: Box<DataDirError>,
    },
    /// The core planned a database step, which only controllers run.
    #[error("{key} is a database step; a machine agent runs host steps only")]
    DatabaseStep { key: StepKey },
    /// The core asked for what only controllers answer (the record, the lease, the
    /// catalogue, the model's agent-version).
    #[error("the lifecycle asked a machine agent for {request:?}, which only controllers do")]
    ControllerRequest { request: Box<Request> },
    /// A task (a request's, the unpacking, a step) panicked.
    #[error("{what} panicked: {error}")]
    Panicked {
        what: &'static str,
        #[source]
        error: tokio::task::JoinError,
    },
}

/// A value in a reply that lockstep refuses.
#[derive(Debug, thiserror::Error)]
pub enum BadValue {
    #[error(transparent)]
    Job(#[from] JobsError),
    #[error(transparent)]
    Version(#[from] ParseVersionError),
    #[error(transparent)]
    Sha256(#[from] PolicyError),
}

/// An API call of the machine agent: its facade, the facade's version, its method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiCall {
    pub facade: &'static str,
    pub version: u32,
    pub method: &'static str,
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.facade, self.method)
    }
}

const GET_ENTITIES: ApiCall = ApiCall {
    facade: "Agent",
    version: 3,
    method: "GetEntities",
};
const SET_TOOLS: ApiCall = ApiCall {
    facade: "Upgrader",
    version: 1,
    method: "SetTools",
};
const DESIRED_VERSION: ApiCall = ApiCall {
    facade: "Upgrader",
    version: 1,
    method: "DesiredVersion",
};
const TOOLS: ApiCall = ApiCall {
    facade: "Upgrader",
    version: 1,
    method: "Tools",
};
const WATCH_API_VERSION: ApiCall = ApiCall {
    facade: "Upgrader",
    version: 1,
    method: "WatchAPIVersion",
};
const SET_STATUS: ApiCall = ApiCall {
    facade: "Machiner",
    version: 5,
    method: "SetStatus",
};

impl ApiCall {
    /// Makes the call ([`Client::call`]: retried through upgrades and disconnects until
    /// `deadline`).
    async fn call(
        self,
        api: &Client,
        params: Value,
        deadline: Duration,
    ) -> Result<Value, MachineAgentError> {
        api.call(self.facade, self.version, self.method, params, deadline)
            .await
            .map_err(|error| MachineAgentError::Api {
                call: self,
                error: Box::new(error),
            })
    }

    /// Makes the call as a mutation ([`Client::mutate`]: one operation id for all its
    /// retries, so it is applied once).
    async fn mutate(
        self,
        api: &Client,
        params: Value,
        deadline: Duration,
    ) -> Result<Value, MachineAgentError> {
        api.mutate(self.facade, self.version, self.method, params, deadline)
            .await
            .map_err(|error| MachineAgentError::Api {
                call: self,
                error: Box::new(error),
            })
    }

    /// The first result of its bulk reply's `key` (`results` or `entities`), or its error.
    fn first_result(self, reply: &Value, key: &'static str) -> Result<Value, MachineAgentError> {
        let result = reply
            .get(key)
            .and_then(Value::as_array)
            .and_then(|results| results.first())
            .cloned()
            .ok_or_else(|| MachineAgentError::NoResults {
                call: self,
                key,
                reply: shortened(reply),
            })?;
        match result.get("error") {
            Some(error) if !error.is_null() => {
                let text = |key: &str| error.get(key).and_then(Value::as_str).unwrap_or_default();
                Err(MachineAgentError::Refused {
                    call: self,
                    message: text("message").to_owned(),
                    code: text("code").to_owned(),
                })
            }
            _ => Ok(result),
        }
    }

    /// A [`MachineAgentError::Missing`] of this call: `reply` lacks `what`.
    fn missing(self, what: impl Into<String>, reply: &Value) -> MachineAgentError {
        MachineAgentError::Missing {
            call: self,
            what: what.into(),
            reply: shortened(reply),
        }
    }

    /// A mapper to [`MachineAgentError::Malformed`] of this call's `field`.
    fn malformed<E: Into<BadValue>>(
        self,
        field: &'static str,
    ) -> impl FnOnce(E) -> MachineAgentError {
        move |error| MachineAgentError::Malformed {
            call: self,
            field,
            error: Box::new(error.into()),
        }
    }
}

/// A reply (or part of one) as shown in a message: its JSON, cut to [`QUOTE_LENGTH_MAX`]
/// characters.
fn shortened(value: &Value) -> String {
    let text = value.to_string();
    let length = text.chars().count();
    if length <= QUOTE_LENGTH_MAX {
        text
    } else {
        let cut: String = text.chars().take(QUOTE_LENGTH_MAX).collect();
        format!("{cut}... ({length} characters)")
    }
}

/// What a machine agent runs with.
#[derive(Debug)]
pub struct MachineAgent {
    /// The lifecycle's limits (`--trial-ready-timeout-sec` and the rest).
    pub limits: lockstep_core::lifecycle::Limits,
    /// How it restarts into a new binary.
    pub restart: RestartMode,
    pub data: DataDir,
    pub conf: AgentConf,
    /// The binary this process runs.
    pub running: Binary,
}

/// Runs the machine agent until shutdown or a restart into a new binary. Returns the
/// process's exit status (a successful `--restart=exec` does not return).
pub async fn run(agent: MachineAgent, notifier: Notifier) -> Result<i32, DaemonError> {
    let MachineAgent {
        limits,
        restart,
        data,
        conf,
        running,
    } = agent;
    let Some((address, fallback)) = conf.apiaddresses.split_first() else {
        return Err(DaemonError::NoApiAddress {
            agent_conf: data.agent_conf_path(),
        });
    };
    let api = Arc::new(Client::new(ClientConfig {
        address: address.clone(),
        fallback_addresses: fallback.to_vec(),
        ca_pem: conf.cacert.clone(),
        model_uuid: Some(conf.model.clone()),
        user: conf.tag.clone(),
        password: conf.apipassword.as_str().to_owned(),
        retry: Default::default(),
        // Unique to this start: a re-exec keeps the pid, and an id reused would make the
        // store take the new binary's `SetTools` for the old one's, already applied.
        client_id: format!("{}-{:016x}", conf.tag, random()),
    }));
    let notifier = Arc::new(notifier);
    tracing::info!(target: "lockstep::agent", tag = %conf.tag, %running, controller = %address, "machine agent started");
    let (shutdown_tx, mut shutdown) = watch::channel(false);
    tokio::spawn(async move {
        crate::process::wait_for_termination().await;
        let _ = shutdown_tx.send(true);
    });

    // Until the lifecycle's loop runs (and pings the launcher's watchdog itself), a task
    // does: waiting for an unreachable controller is no hang.
    let waiting = {
        let notifier = Arc::clone(&notifier);
        tokio::spawn(async move {
            loop {
                notifier.watchdog();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let prepared = prepare(&api, &conf, &data, &running, &notifier, &mut shutdown).await;
    waiting.abort();
    let Some(roles) = prepared? else {
        return Ok(0);
    };

    let core = Lifecycle::new(
        Config {
            controller: None,
            roles,
            running: running.clone(),
            limits,
        },
        crate::steps::registry(),
        Some(conf.snapshot()),
    )
    .map_err(|error| DaemonError::Lifecycle {
        agent_conf: data.agent_conf_path(),
        error,
    })?;
    let (inputs_tx, inputs) = mpsc::unbounded_channel();
    let (status_tx, status_rx) = watch::channel(Reported {
        phase: Phase::Bootstrapping,
        message: String::new(),
    });
    // The rate of the download that brought this binary, reported in every status so the
    // staged rollout can admit slow links early next time; for an agent that downloaded
    // none (provisioned from the controller's disk), its link probe's, made now if it has
    // none yet.
    let link_rate = Arc::new(AtomicU64::new(known_link_rate(&data, &running)));
    let link_probed = Arc::new(tokio::sync::Notify::new());
    let probe_task = (link_rate.load(Ordering::SeqCst) == 0).then(|| {
        tokio::spawn(probe_link(
            Arc::clone(&api),
            data.clone(),
            conf.clone(),
            Arc::clone(&link_rate),
            Arc::clone(&link_probed),
        ))
    });
    let status_task = tokio::spawn(report_status(
        Arc::clone(&api),
        conf.tag.clone(),
        running.clone(),
        Arc::clone(&link_rate),
        link_probed,
        status_rx,
    ));
    let ahead = Ahead {
        data: data.clone(),
        conf: conf.clone(),
        fetch: Arc::default(),
        staging: Arc::default(),
    };
    let watch_task = tokio::spawn(follow_desired_version(
        Arc::clone(&api),
        conf.tag.clone(),
        running.number,
        inputs_tx.clone(),
        ahead.clone(),
    ));
    let mut driver = MachineDriver {
        core,
        api,
        data: data.clone(),
        conf: conf.clone(),
        started: Instant::now(),
        inputs_tx,
        inputs,
        status: status_tx,
        notifier,
        tasks: tokio::task::JoinSet::new(),
        tools_url: ToolsUrl::default(),
        ahead: ahead.clone(),
        hold: GateHold::default(),
    };
    let exit = driver.run(&mut shutdown).await;
    driver.tasks.shutdown().await;
    watch_task.abort();
    ahead.stop();
    status_task.abort();
    if let Some(task) = probe_task {
        task.abort();
    }
    match exit {
        Exit::Shutdown => {
            tracing::info!(target: "lockstep::agent", "machine agent stopped");
            Ok(0)
        }
        Exit::Fatal(reason) => {
            tracing::error!(target: "lockstep::agent", %reason, "machine agent cannot go on");
            Ok(restart::EXIT_FATAL)
        }
        Exit::RestartInto(binary) => {
            restart::restart_into(restart, &data, &conf.tag, &binary, None)
        }
    }
}

/// What the agent does before its lifecycle starts: reads its jobs (`Agent.GetEntities`),
/// refusing a controller's machine, and reports the binary it runs (`Upgrader.SetTools`).
/// Returns its roles, or `None` when shutdown came first.
async fn prepare(
    api: &Client,
    conf: &AgentConf,
    data: &DataDir,
    running: &Binary,
    notifier: &Notifier,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Roles>, DaemonError> {
    // Its jobs first: a controller's machine has no machine agent.
    let jobs = tokio::select! {
        jobs = retrying(notifier, "read its jobs", || get_jobs(api, &conf.tag)) => jobs,
        _ = shutdown.changed() => return Ok(None),
    };
    if jobs.contains(&Job::MANAGE_MODEL) {
        return Err(DaemonError::MachineAgentOfController {
            agent_conf: data.agent_conf_path(),
            tag: conf.tag.clone(),
        });
    }
    // A machine agent is the host-machine role's (a controller's agent is the controller
    // lockstepd); its jobs tell what else it may do, and are reread at every start.
    let roles = Roles::of(&[Role::HostMachine]);
    tracing::info!(target: "lockstep::agent", jobs = ?jobs.iter().map(Job::as_str).collect::<Vec<_>>(), roles = ?roles, "jobs read");
    tokio::select! {
        () = retrying(notifier, "report its binary", || set_tools(api, &conf.tag, running)) => {}
        _ = shutdown.changed() => return Ok(None),
    }
    Ok(Some(roles))
}

/// Runs `attempt` until it succeeds, pausing [`RETRY_PAUSE`] after each failure (each
/// attempt's calls already retried for [`CALL_DEADLINE`]), each failure logged and shown
/// in the launcher's status.
async fn retrying<T, F, Fut>(notifier: &Notifier, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, MachineAgentError>>,
{
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) => {
                tracing::warn!(target: "lockstep::agent", %error, "cannot {what}; retrying");
                notifier.status(&format!("cannot {what}: {error}"));
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

fn entities(tag: &str) -> Value {
    json!({"entities": [{"tag": tag}]})
}

/// `Agent.GetEntities`: this machine's jobs, as the controllers compute them from its roles
/// and the model's capabilities.
async fn get_jobs(api: &Client, tag: &str) -> Result<Vec<Job>, MachineAgentError> {
    let reply = GET_ENTITIES.call(api, entities(tag), CALL_DEADLINE).await?;
    let entity = GET_ENTITIES.first_result(&reply, "entities")?;
    entity
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or_else(|| GET_ENTITIES.missing(format!("jobs for {tag}"), &entity))?
        .iter()
        .map(|job| {
            let name = job.as_str().unwrap_or_default().to_owned();
            Job::new(name).map_err(GET_ENTITIES.malformed("jobs"))
        })
        .collect()
}

/// `Upgrader.SetTools`: the binary this agent runs.
async fn set_tools(api: &Client, tag: &str, running: &Binary) -> Result<(), MachineAgentError> {
    let params = json!({"agent-tools": [{"tag": tag, "tools": {"version": running.to_string()}}]});
    let reply = SET_TOOLS.mutate(api, params, CALL_DEADLINE).await?;
    SET_TOOLS.first_result(&reply, "results").map(|_| ())
}

/// `Upgrader.DesiredVersion`: the version the controllers want this agent on.
async fn desired_version(api: &Client, tag: &str) -> Result<Version, MachineAgentError> {
    Ok(desired_and_ahead(api, tag).await?.0)
}

/// `Upgrader.DesiredVersion`: the version the controllers want this agent on, and the one
/// a staged rollout tells it to fetch ahead of its admission (`stage-version`, lockstep's;
/// absent from Juju's answers).
async fn desired_and_ahead(
    api: &Client,
    tag: &str,
) -> Result<(Version, Option<Version>), MachineAgentError> {
    let reply = DESIRED_VERSION
        .call(api, entities(tag), CALL_DEADLINE)
        .await?;
    let result = DESIRED_VERSION.first_result(&reply, "results")?;
    let text = result
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let desired = Version::parse(text).map_err(DESIRED_VERSION.malformed("version"))?;
    let ahead = match result.get("stage-version").and_then(Value::as_str) {
        Some(text) => {
            Some(Version::parse(text).map_err(DESIRED_VERSION.malformed("stage-version"))?)
        }
        None => None,
    };
    Ok((desired, ahead))
}

/// `Upgrader.Tools`: the binary of the desired version and the URL the controller serves
/// it at.
async fn desired_tools(api: &Client, tag: &str) -> Result<(StagePlan, String), MachineAgentError> {
    tools_of(api, tag, "tools").await
}

/// `Upgrader.Tools`' `key` (`tools`, or lockstep's `stage-tools`: the binary to fetch
/// ahead of admission): the binary and the URL the controller serves it at.
async fn tools_of(
    api: &Client,
    tag: &str,
    key: &str,
) -> Result<(StagePlan, String), MachineAgentError> {
    let reply = TOOLS.call(api, entities(tag), CALL_DEADLINE).await?;
    let result = TOOLS.first_result(&reply, "results")?;
    let tools = result
        .get(key)
        .and_then(Value::as_array)
        .and_then(|tools| tools.first())
        .ok_or_else(|| TOOLS.missing(key.to_owned(), &result))?;
    let text = |key: &str| tools.get(key).and_then(Value::as_str).unwrap_or_default();
    let binary = Binary::parse(text("version")).map_err(TOOLS.malformed("version"))?;
    let sha256 = Sha256::parse(text("sha256")).map_err(TOOLS.malformed("sha256"))?;
    let size_bytes = tools
        .get("size")
        .and_then(Value::as_u64)
        .ok_or_else(|| TOOLS.missing(format!("size for {binary}"), tools))?;
    // The path is the controller's; the host is the one this agent reaches it at (the
    // controller names the address it listens on, which a proxy or a NAT between may hide).
    let url = text("url");
    let path = url
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|at| &rest[at..]))
        .filter(|path| path.starts_with("/model/"))
        .ok_or_else(|| MachineAgentError::NotToolsUrl {
            url: url.to_owned(),
        })?;
    let url = format!("https://{}{path}", api.address());
    let plan = StagePlan {
        binary,
        size_bytes,
        sha256,
        source: StageSource::Controller,
    };
    Ok((plan, url))
}

/// The tools endpoint's URL of the binary `Upgrader.Tools` last named, for the download
/// that follows: the core's plan carries no URL (`StageSource::Controller` means "the
/// controller's tools endpoint").
type ToolsUrl = Arc<std::sync::Mutex<Option<(Binary, String)>>>;

/// What the agent last told the controllers about itself.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Reported {
    phase: Phase,
    message: String,
}

/// Sends `Machiner.SetStatus` whenever the reported status changes, and every
/// [`STATUS_INTERVAL`] regardless; `data` carries the phase, the binary it runs and, when
/// known (`link_rate` not 0), `download-rate`: bytes per second of the download that
/// brought that binary, or of the agent's link probe (reported as soon as `link_probed`
/// says the probe ended).
async fn report_status(
    api: Arc<Client>,
    tag: String,
    running: Binary,
    link_rate: Arc<AtomicU64>,
    link_probed: Arc<tokio::sync::Notify>,
    mut status: watch::Receiver<Reported>,
) {
    loop {
        let current = status.borrow_and_update().clone();
        let (word, info) = status_of(current.phase, &current.message);
        let mut data = json!({"phase": current.phase.as_str(), "version": running.to_string()});
        let rate = link_rate.load(Ordering::SeqCst);
        if rate > 0 {
            data["download-rate"] = json!(rate);
        }
        let params = json!({"entities": [{
            "tag": tag,
            "status": word,
            "info": info,
            "data": data,
        }]});
        match SET_STATUS
            .call(&api, params, STATUS_INTERVAL)
            .await
            .and_then(|reply| SET_STATUS.first_result(&reply, "results"))
        {
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(target: "lockstep::agent", %error, "status not reported");
            }
        }
        // A change of status, or a link probe that ended (its rate is news for a rollout
        // about to choose its canaries), is reported at once.
        let _ = tokio::time::timeout(STATUS_INTERVAL, async {
            tokio::select! {
                _ = status.changed() => {}
                _ = link_probed.notified() => {}
            }
        })
        .await;
    }
}

/// The status word and message an agent in `phase` reports (a machine agent through
/// `Machiner.SetStatus`, a controller into the store): `error` in a failure phase, with a
/// message (Juju's rule: an error says what it is), else `started`; the message at most
/// `STATUS_INFO_BYTES_MAX` bytes.
pub(crate) fn status_of(phase: Phase, message: &str) -> (&'static str, String) {
    let (word, info) = match phase {
        Phase::StepsFailed | Phase::UpgradeFailed if message.is_empty() => {
            ("error", format!("{} (no message)", phase.as_str()))
        }
        Phase::StepsFailed | Phase::UpgradeFailed => ("error", message.to_owned()),
        _ => ("started", message.to_owned()),
    };
    (
        word,
        truncated(
            info,
            lockstep_transport::facade::machiner::STATUS_INFO_BYTES_MAX,
        ),
    )
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Follows the desired version through `Upgrader.WatchAPIVersion`: after each event, asks
/// `Upgrader.DesiredVersion` and tells the core every change (counting from the version
/// this process runs). A watcher the server forgot (its worker restarted) is made again.
async fn follow_desired_version(
    api: Arc<Client>,
    tag: String,
    running: Version,
    inputs: mpsc::UnboundedSender<Input>,
    ahead: Ahead,
) {
    let mut fed = running;
    loop {
        let watcher = match WATCH_API_VERSION
            .call(&api, entities(&tag), CALL_DEADLINE)
            .await
            .and_then(|reply| WATCH_API_VERSION.first_result(&reply, "results"))
        {
            Ok(result) => result
                .get("NotifyWatcherId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            Err(error) => {
                tracing::warn!(target: "lockstep::agent", %error, "cannot watch the desired version; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        loop {
            match api
                .call_object(
                    "NotifyWatcher",
                    1,
                    &watcher,
                    "Next",
                    json!({}),
                    NEXT_DEADLINE,
                )
                .await
            {
                Ok(_) => {}
                Err(ClientError::GaveUp(give_up)) => {
                    tracing::debug!(target: "lockstep::agent", %give_up, "NotifyWatcher.Next gave up; asking again");
                    continue;
                }
                Err(error) => {
                    tracing::info!(target: "lockstep::agent", %error, "the desired-version watcher ended; making another");
                    break;
                }
            }
            let desired = desired_and_ahead(&api, &tag).await;
            if let Ok((version, Some(stage))) = &desired
                && *stage != running
                && stage != version
            {
                ahead.start(&api, &tag, *stage);
            }
            match desired.map(|(version, _)| version) {
                Ok(version) if version != fed => {
                    // Not the whole fleet at once: each agent starts after a random part of
                    // the core's spread.
                    let delay = lockstep_core::upgrader::agent_upgrade_delay(random());
                    tracing::info!(target: "lockstep::agent", %version, delay_ms = delay.0, "desired version changed");
                    tokio::time::sleep(Duration::from_millis(delay.0)).await;
                    fed = version;
                    if inputs.send(Input::AgentVersionChanged(version)).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(target: "lockstep::agent", %error, "cannot read the desired version");
                }
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

struct MachineDriver {
    core: Lifecycle,
    api: Arc<Client>,
    data: DataDir,
    conf: AgentConf,
    started: Instant,
    inputs_tx: mpsc::UnboundedSender<Input>,
    inputs: mpsc::UnboundedReceiver<Input>,
    status: watch::Sender<Reported>,
    notifier: Arc<Notifier>,
    tasks: tokio::task::JoinSet<()>,
    tools_url: ToolsUrl,
    ahead: Ahead,
    /// An opening gate waits for the `agent.conf` writes asked for before it.
    hold: GateHold,
}

/// The fetch of a binary ahead of this agent's admission (a staged rollout's
/// `stage-version`, spec/rollout.md): downloaded, verified and installed like any staging,
/// but not switched to. One at a time. The core's own staging of the same binary waits for
/// it while its bytes arrive (and then finds the binary installed), and stops it otherwise
/// (queued at a busy controller, or waiting out a busy answer): an admitted agent's own
/// download goes before fetches ahead at the controller.
#[derive(Clone)]
struct Ahead {
    data: DataDir,
    conf: AgentConf,
    fetch: Arc<std::sync::Mutex<Option<AheadFetch>>>,
    /// Held by whichever downloads into the tools cache: the core's staging or the fetch
    /// ahead.
    staging: Arc<tokio::sync::Mutex<()>>,
}

struct AheadFetch {
    version: Version,
    /// Set at its first byte.
    receiving: Arc<AtomicBool>,
    /// Set once the binary is installed.
    fetched: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Ahead {
    /// Starts fetching `version` ahead, unless that fetch runs or is done already (one
    /// that failed starts again); a fetch of another version is stopped.
    fn start(&self, api: &Arc<Client>, tag: &str, version: Version) {
        let mut slot = self.fetch.lock().expect("not poisoned");
        if let Some(fetch) = slot.as_ref()
            && fetch.version == version
            && (!fetch.task.is_finished() || fetch.fetched.load(Ordering::SeqCst))
        {
            return;
        }
        if let Some(old) = slot.take() {
            old.task.abort();
        }
        let receiving = Arc::new(AtomicBool::new(false));
        let fetched = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(fetch_ahead(
            Arc::clone(api),
            tag.to_owned(),
            version,
            self.clone(),
            Arc::clone(&receiving),
            Arc::clone(&fetched),
        ));
        *slot = Some(AheadFetch {
            version,
            receiving,
            fetched,
            task,
        });
    }

    /// For the core's staging of `binary`: the fetch ahead of it to wait for, if its bytes
    /// are arriving; any other is stopped.
    fn take_for(&self, binary: &Binary) -> Option<tokio::task::JoinHandle<()>> {
        let fetch = self.fetch.lock().expect("not poisoned").take()?;
        if fetch.version == binary.number
            && fetch.receiving.load(Ordering::SeqCst)
            && !fetch.task.is_finished()
        {
            Some(fetch.task)
        } else {
            fetch.task.abort();
            None
        }
    }

    fn stop(&self) {
        if let Some(fetch) = self.fetch.lock().expect("not poisoned").take() {
            fetch.task.abort();
        }
    }
}

/// Fetches `version` ahead of admission: after the core's start spread (a fleet told
/// together does not arrive together), unless the core stages meanwhile, `Upgrader.Tools`'
/// `stage-tools` names the binary and URL, and it is downloaded as the core's staging
/// does, through the controller's busy answers.
async fn fetch_ahead(
    api: Arc<Client>,
    tag: String,
    version: Version,
    ahead: Ahead,
    receiving: Arc<AtomicBool>,
    fetched: Arc<AtomicBool>,
) {
    let delay = lockstep_core::upgrader::agent_upgrade_delay(random());
    tracing::info!(target: "lockstep::agent", %version, delay_ms = delay.0, "fetching a binary ahead of this agent's admission (the rollout's stage-version)");
    tokio::time::sleep(Duration::from_millis(delay.0)).await;
    let Ok(_staging) = ahead.staging.try_lock() else {
        return; // the core stages a binary itself: it was admitted
    };
    let (plan, url) = match tools_of(&api, &tag, "stage-tools").await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(target: "lockstep::agent", %version, %error, "cannot learn the binary to fetch ahead");
            return;
        }
    };
    if plan.binary.number != version {
        return; // the rollout moved on since
    }
    match stage_from_controller(&ahead.data, &ahead.conf, &plan, url, Some(&receiving)).await {
        Ok(()) => {
            fetched.store(true, Ordering::SeqCst);
            tracing::info!(target: "lockstep::agent", binary = %plan.binary, "fetched ahead of admission; kept, not switched to");
        }
        Err(error) => {
            tracing::warn!(target: "lockstep::agent", binary = %plan.binary, %error, "the fetch ahead failed; the staging at admission downloads it");
        }
    }
}

impl MachineDriver {
    /// The core's clock: milliseconds since this process started (monotonic).
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.started.elapsed().as_millis() as u64)
    }

    fn instant_of(&self, at: Timestamp) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.started + Duration::from_millis(at.as_millis()))
    }

    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> Exit {
        let now = self.now();
        self.core.handle(now, Input::Start);
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(exit) = self.drain() {
                return exit;
            }
            let deadline = self.core.poll_timeout().map(|at| self.instant_of(at));
            tokio::select! {
                input = self.inputs.recv() => {
                    let input = input.expect("the driver holds a sender");
                    self.hold.input(&input);
                    let now = self.now();
                    self.core.handle(now, input);
                }
                () = sleep_until(deadline) => {
                    let now = self.now();
                    self.core.handle_timeout(now);
                }
                _ = watchdog.tick() => self.notifier.watchdog(),
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return Exit::Shutdown;
                    }
                }
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(error) = joined && error.is_panic() {
                        return Exit::Fatal(MachineAgentError::Panicked {
                            what: "a request's task",
                            error,
                        });
                    }
                }
            }
        }
    }

    fn drain(&mut self) -> Option<Exit> {
        let mut exit = None;
        let outputs: Vec<Output> = std::iter::from_fn(|| self.core.poll_output()).collect();
        self.hold.outputs(&outputs);
        for output in outputs {
            match output {
                Output::Gate(view) => {
                    if let Some(view) = self.hold.gate(view) {
                        self.publish_gate(view);
                    }
                }
                Output::Status(report) => self.status_report(&report),
                Output::Request { id, request } => match request {
                    Request::RestartInto(binary) => exit = Some(self.switch(binary)),
                    Request::PersistSnapshot(_)
                    | Request::LoadModel
                    | Request::DesiredBinary
                    | Request::StageBinary(_)
                    | Request::RunStep { .. } => {
                        if exit.is_none() {
                            self.execute(id, request);
                        }
                    }
                    // The record, the lease, the catalogue, the model's agent-version: the
                    // core asks them of controllers only. Unanswered it would wait forever.
                    other => {
                        exit = Some(Exit::Fatal(MachineAgentError::ControllerRequest {
                            request: Box::new(other),
                        }));
                    }
                },
                other => unreachable!("an output this driver does not handle: {other:?}"),
            }
        }
        if let Some(view) = self.hold.release() {
            self.publish_gate(view);
        }
        exit
    }

    /// The phase a gate the core set, once [`GateHold`] lets it: to the supervisor
    /// (`READY=1`) and to the controller, whose rollouts go on when an agent says Ready.
    fn publish_gate(&mut self, view: GateView) {
        tracing::info!(target: "lockstep::agent", phase = view.phase.as_str(), "phase");
        if view.phase == Phase::Ready {
            self.notifier.ready();
        }
        self.status
            .send_modify(|reported| reported.phase = view.phase);
    }

    fn status_report(&mut self, report: &StatusReport) {
        if !report.message.is_empty() {
            tracing::info!(target: "lockstep::agent", phase = report.phase.as_str(), "{}", report.message);
        }
        self.notifier.status(&crate::notify::status_line(report));
        // While an opening gate is held, the phase reported stays the one published.
        let holding = self.hold.holding();
        self.status.send_modify(|reported| {
            if !holding {
                reported.phase = report.phase;
            }
            reported.message = report.message.clone();
        });
    }

    /// `RestartInto`: point `tools/<tag>` at the binary; the caller restarts the process.
    fn switch(&mut self, binary: Binary) -> Exit {
        match self.data.switch_to(&self.conf.tag, &binary) {
            Ok(()) => {
                tracing::info!(target: "lockstep::agent", %binary, "switched; restarting");
                self.notifier
                    .reloading(&format!("restarting into {binary}"));
                Exit::RestartInto(binary)
            }
            Err(error) => Exit::Fatal(MachineAgentError::Switch {
                binary,
                error: Box::new(error),
            }),
        }
    }

    /// Runs `attempt` on a task until it succeeds (pausing between failures), then feeds
    /// its input to the core.
    fn spawn_retrying<F, Fut>(&mut self, what: &'static str, attempt: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Input, MachineAgentError>> + Send,
    {
        let inputs = self.inputs_tx.clone();
        let notifier = Arc::clone(&self.notifier);
        self.tasks.spawn(async move {
            let input = retrying(&notifier, what, attempt).await;
            let _ = inputs.send(input);
        });
    }

    fn execute(&mut self, id: RequestId, request: Request) {
        let running = self.core.config().running.clone();
        let api = Arc::clone(&self.api);
        let tag = self.conf.tag.clone();
        match request {
            Request::PersistSnapshot(snapshot) => {
                let data = self.data.clone();
                self.spawn_retrying("persist agent.conf", move || {
                    let data = data.clone();
                    let snapshot = snapshot.clone();
                    async move {
                        tokio::task::spawn_blocking(move || {
                            let mut conf = data.read_agent_conf()?.ok_or_else(|| {
                                MachineAgentError::AgentConfVanished {
                                    path: data.agent_conf_path(),
                                }
                            })?;
                            conf.set_snapshot(snapshot);
                            data.write_agent_conf(&conf)?;
                            Ok(Input::Done { id })
                        })
                        .await
                        .map_err(|error| MachineAgentError::Panicked {
                            what: "persisting agent.conf",
                            error,
                        })?
                    }
                });
            }
            Request::LoadModel => {
                // A machine agent's view of the model: the version its controllers want it
                // on (controllers first); the policy and the stream are the controllers'.
                self.spawn_retrying("read the desired version", move || {
                    let api = Arc::clone(&api);
                    let tag = tag.clone();
                    async move {
                        let version = desired_version(&api, &tag).await?;
                        Ok(Input::ModelLoaded {
                            id,
                            model: ModelView {
                                agent_version: version,
                                policy: UpgradePolicy::Off,
                                stream: None,
                                controllers: ControllerSet::EMPTY,
                            },
                        })
                    }
                });
            }
            Request::DesiredBinary => {
                let tools_url = Arc::clone(&self.tools_url);
                self.spawn_retrying("learn the desired binary", move || {
                    let tools_url = Arc::clone(&tools_url);
                    let api = Arc::clone(&api);
                    let tag = tag.clone();
                    let running = running.clone();
                    async move {
                        let version = desired_version(&api, &tag).await?;
                        if version == running.number {
                            // Staying: the core needs no binary, only the version.
                            return Ok(Input::DesiredBinary {
                                id,
                                plan: StagePlan {
                                    binary: running,
                                    size_bytes: 0,
                                    sha256: Sha256([0; 32]),
                                    source: StageSource::Controller,
                                },
                            });
                        }
                        let (plan, url) = desired_tools(&api, &tag).await?;
                        *tools_url.lock().expect("not poisoned") = Some((plan.binary.clone(), url));
                        Ok(Input::DesiredBinary { id, plan })
                    }
                });
            }
            Request::StageBinary(plan) => {
                let data = self.data.clone();
                let conf = self.conf.clone();
                let inputs = self.inputs_tx.clone();
                let url = self
                    .tools_url
                    .lock()
                    .expect("not poisoned")
                    .clone()
                    .filter(|(binary, _)| *binary == plan.binary)
                    .map(|(_, url)| url);
                let ahead_fetch = self.ahead.take_for(&plan.binary);
                let staging = Arc::clone(&self.ahead.staging);
                self.tasks.spawn(async move {
                    let result = match url {
                        Some(url) => {
                            if let Some(fetch) = ahead_fetch {
                                tracing::info!(target: "lockstep::agent", binary = %plan.binary, "waiting for the fetch ahead of this binary, whose bytes are arriving");
                                let _ = fetch.await;
                            }
                            // One download into the tools cache at a time; a fetch ahead
                            // that finished left the binary installed, found at once.
                            let _staging = staging.lock().await;
                            stage_from_controller(&data, &conf, &plan, url, None).await
                        }
                        None => Err(MachineAgentError::NoToolsUrl {
                            binary: plan.binary.clone(),
                        }),
                    };
                    if let Err(error) = &result {
                        tracing::warn!(target: "lockstep::agent", binary = %plan.binary, %error, "staging failed");
                    }
                    // The core takes the reason as text.
                    let result = result.map_err(|error| error.to_string());
                    let _ = inputs.send(Input::Staged { id, result });
                });
            }
            Request::RunStep { step, key, .. } => {
                let registry = crate::steps::registry();
                let definition = registry.step(step);
                tracing::info!(target: "lockstep::agent", %key, "{}", definition.description);
                let inputs = self.inputs_tx.clone();
                if definition.kind != StepKind::Host {
                    // The core plans database steps for controllers only.
                    let reason = MachineAgentError::DatabaseStep { key };
                    let _ = inputs.send(Input::StepFinished {
                        id,
                        outcome: StepOutcome::Failed(reason.to_string()),
                    });
                    return;
                }
                #[cfg(feature = "failpoints")]
                if crate::daemon::failpoints::machine_host_steps_fail(running.number) {
                    let reason = step_runner::HostStepError::Failpoint {
                        key,
                        variable: crate::daemon::failpoints::FAIL_MACHINE_HOST_STEPS,
                    };
                    let _ = inputs.send(Input::StepFinished {
                        id,
                        outcome: StepOutcome::Failed(reason.to_string()),
                    });
                    return;
                }
                #[cfg(feature = "failpoints")]
                let pause = crate::daemon::failpoints::machine_host_step_pause(running.number);
                let context = HostContext {
                    data: self.data.clone(),
                    tag,
                    running,
                };
                self.tasks.spawn(async move {
                    #[cfg(feature = "failpoints")]
                    if let Some(pause) = pause {
                        tracing::warn!(target: "lockstep::agent", pause_ms = pause.as_millis() as u64, "failpoint: the host step pauses");
                        tokio::time::sleep(pause).await;
                    }
                    let outcome = tokio::task::spawn_blocking(move || {
                        match step_runner::run_host_step(&context, &key) {
                            Ok(()) => StepOutcome::Applied,
                            Err(error) => StepOutcome::Failed(error.to_string()),
                        }
                    })
                    .await
                    .unwrap_or_else(|error| {
                        let reason = MachineAgentError::Panicked {
                            what: "the step",
                            error,
                        };
                        StepOutcome::Failed(reason.to_string())
                    });
                    let _ = inputs.send(Input::StepFinished { id, outcome });
                });
            }
            other => unreachable!("drain passes only what execute runs: {other:?}"),
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the same clock in every process of the host.
fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000) + now.tv_nsec as u64
}

/// Bytes per second of a download of `size_bytes`: from its first byte (`first`: when, and
/// how many bytes that first read brought) to its last (`last`), so that the wait for a
/// slot in the controller's queue does not count; from `started` (the request) when the
/// bytes came in one read. At least 1.
fn download_rate(
    started: Instant,
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
    size_bytes: u64,
) -> u64 {
    let (from, bytes) = match (first, last) {
        (Some((at, first_bytes)), Some((end, total))) if total > first_bytes && end > at => {
            (at, total - first_bytes)
        }
        _ => (started, size_bytes),
    };
    let end = last.map_or_else(Instant::now, |(end, _)| end);
    let nanos = end.saturating_duration_since(from).as_nanos().max(1);
    (u128::from(bytes) * 1_000_000_000 / nanos).clamp(1, u128::from(u64::MAX)) as u64
}

/// `StageBinary` from the controller: the tarball from the tools endpoint's URL that
/// `Upgrader.Tools` gave, over TLS checked against the controller's CA, with this agent's
/// credentials; size and sha256 verified while it is read, then unpacked into
/// `tools/<binary>/`.
async fn stage_from_controller(
    data: &DataDir,
    conf: &AgentConf,
    plan: &StagePlan,
    url: String,
    receiving: Option<&AtomicBool>,
) -> Result<(), MachineAgentError> {
    if let Ok(Some(installed)) = data.read_downloaded_tools(&plan.binary)
        && installed.sha256 == plan.sha256
        && data.binary_path(&plan.binary).is_file()
    {
        return Ok(());
    }
    let (base, file) = url
        .rsplit_once('/')
        .ok_or_else(|| MachineAgentError::NotToolsUrl { url: url.clone() })?;
    let source = controller_source(data, conf, base)?;
    let entry = lockstep_core::policy::CatalogueEntry {
        binary: plan.binary.clone(),
        stream: lockstep_core::policy::Stream::Released,
        size_bytes: plan.size_bytes,
        sha256: plan.sha256,
        path: file.to_owned(),
    };
    let cache = data.tools_cache_dir();
    std::fs::create_dir_all(&cache).map_err(|error| MachineAgentError::CreateCache {
        path: cache.clone(),
        error,
    })?;
    let tarball: PathBuf = data.cached_tarball_path(&plan.binary);
    // Past its bound of agent downloads a controller holds the request in its queue (up to
    // the core's DOWNLOAD_QUEUE_WAIT) and, with the queue full or no slot freed by then,
    // answers 503 ("busy"): wait as the core's backoff says, with jitter, and ask again,
    // for as long as BUSY_WAIT_MAX.
    let waiting_since = Instant::now();
    let mut busy = 0u32;
    let download_rate_seen: u64;
    loop {
        let attempt_started = Instant::now();
        tracing::info!(target: "lockstep::agent", binary = %plan.binary, %url, "download attempt");
        // The window in which this agent receives the binary, on the host's monotonic clock
        // (one clock for every process, so the agents' windows can be compared): from its
        // first byte to its last, both logged before the connection is closed.
        let mut first: Option<(Instant, u64)> = None;
        let mut last: Option<(Instant, u64)> = None;
        let mut window = |progress: lockstep_streams::DownloadProgress| {
            if first.is_none() && progress.received_bytes > 0 {
                if let Some(receiving) = receiving {
                    receiving.store(true, Ordering::SeqCst);
                }
                first = Some((Instant::now(), progress.received_bytes));
                tracing::info!(target: "lockstep::agent", monotonic_ns = monotonic_ns(), received_bytes = progress.received_bytes, "download receiving");
            }
            if progress.received_bytes == progress.total_bytes {
                last = Some((Instant::now(), progress.received_bytes));
                tracing::info!(target: "lockstep::agent", monotonic_ns = monotonic_ns(), received_bytes = progress.received_bytes, "download received");
            }
        };
        match source.download(&entry, &tarball, &mut window).await {
            Ok(()) => {
                let rate = download_rate(attempt_started, first, last, plan.size_bytes);
                tracing::info!(
                    target: "lockstep::agent",
                    binary = %plan.binary,
                    elapsed_ms = attempt_started.elapsed().as_millis() as u64,
                    busy_answers = busy,
                    bytes_per_second = rate,
                    "downloaded from the controller"
                );
                download_rate_seen = rate;
                break;
            }
            Err(lockstep_streams::DownloadError::Source(
                lockstep_streams::SourceError::Status {
                    status,
                    retry_after_seconds,
                    ..
                },
            )) if (status == 503 || status == 429) && waiting_since.elapsed() < BUSY_WAIT_MAX => {
                busy += 1;
                // The controller's Retry-After: when its queue has room, by its estimate.
                let asked = retry_after_seconds
                    .map(|seconds| lockstep_core::Millis(seconds.saturating_mul(1000)));
                let wait = lockstep_core::upgrader::busy_download_backoff(busy, asked, random());
                tracing::info!(target: "lockstep::agent", binary = %plan.binary, status, wait_ms = wait.0, "the controller is busy serving other agents; waiting");
                tokio::time::sleep(Duration::from_millis(wait.0)).await;
            }
            Err(error) => {
                if first.is_some() && last.is_none() {
                    // The bytes stopped before the last (the controller restarted, the
                    // link broke): the window closes here, on the same clock.
                    tracing::info!(target: "lockstep::agent", monotonic_ns = monotonic_ns(), "download broke off");
                }
                return Err(MachineAgentError::Download {
                    binary: plan.binary.clone(),
                    error: Box::new(error),
                });
            }
        }
    }
    // Hang up: the controller frees this download's slot.
    drop(source);
    let meta = DownloadedTools {
        version: plan.binary.clone(),
        url,
        sha256: plan.sha256,
        size_bytes: plan.size_bytes,
        download_rate: Some(download_rate_seen),
    };
    let data = data.clone();
    let binary = plan.binary.clone();
    tokio::task::spawn_blocking(move || data.install_tarball(&binary, &tarball, &meta))
        .await
        .map_err(|error| MachineAgentError::Panicked {
            what: "unpacking",
            error,
        })??;
    Ok(())
}

/// A download source on the controller's HTTPS endpoints under `base` (`https://<address>/model/<uuid>`):
/// TLS checked against the controller's CA in `agent.conf`, this agent's credentials.
fn controller_source(
    data: &DataDir,
    conf: &AgentConf,
    base: &str,
) -> Result<lockstep_streams::HttpSource, MachineAgentError> {
    let mut config = lockstep_streams::HttpConfig {
        system_roots: false,
        // One attempt per call: the callers retry ("busy" on the core's backoff; any other
        // failure of a staging goes back to the core, which retries it itself).
        retry: lockstep_streams::RetryPolicy {
            attempts_max: 1,
            ..lockstep_streams::RetryPolicy::default()
        },
        basic_auth: Some(lockstep_streams::BasicAuth {
            user: conf.tag.clone(),
            password: conf.apipassword.as_str().to_owned(),
        }),
        // The connection stays open (idle in `source`'s pool) after the last byte until
        // `source` is dropped, right after a download is logged and verified: the
        // controller holds this download's slot until the agent hangs up, so the agent's
        // logged window (first byte to last) lies inside its slot. Hung up by hyper as the
        // last byte arrives instead, a next agent could start before this one logged it.
        ..lockstep_streams::HttpConfig::default()
    };
    config
        .trust_pem(conf.cacert.as_bytes())
        .map_err(|error| MachineAgentError::CaCert {
            agent_conf: data.agent_conf_path(),
            error,
        })?;
    lockstep_streams::HttpSource::new(&format!("{base}/"), config)
        .map_err(|error| MachineAgentError::ToolsSource { error })
}

/// The link this agent reports (`download-rate` in its status), bytes per second: from the
/// download that brought the binary it runs, else from its last link probe; 0 while
/// neither is known.
fn known_link_rate(data: &DataDir, running: &Binary) -> u64 {
    data.read_downloaded_tools(running)
        .ok()
        .flatten()
        .and_then(|tools| tools.download_rate)
        .or_else(|| {
            data.read_link_probe()
                .ok()
                .flatten()
                .map(|probe| probe.bytes_per_second)
        })
        .unwrap_or(0)
}

/// An agent that knows no rate for its link (it never downloaded a binary: provisioned from
/// the controller's own disk, as the local provider does) measures one, so that a fleet's
/// first rollout can admit its slow links early as a later one does
/// (`rollout::admission_order`): after the core's start spread, `LINK_PROBE_BYTES` from
/// the controller's probe endpoint (`GET /model/<uuid>/link-probe`, with this agent's login
/// and the controller's CA), timed from its first byte to its last. Kept in
/// `link-probe.json` and put in `rate`, which the status reports at once (`probed`) and
/// from then on; a probe that failed is made again after `LINK_PROBE_RETRY`, until one
/// succeeds.
async fn probe_link(
    api: Arc<Client>,
    data: DataDir,
    conf: AgentConf,
    rate: Arc<AtomicU64>,
    probed: Arc<tokio::sync::Notify>,
) {
    let spread = lockstep_core::upgrader::agent_upgrade_delay(random());
    tokio::time::sleep(Duration::from_millis(spread.0)).await;
    loop {
        let base = format!("https://{}/model/{}", api.address(), conf.model);
        match probe_once(&data, &conf, &base).await {
            Ok(probe) => {
                tracing::info!(target: "lockstep::agent", bytes = probe.bytes, bytes_per_second = probe.bytes_per_second, "link probed (no download measured it yet)");
                if let Err(error) = data.write_link_probe(&probe) {
                    tracing::warn!(target: "lockstep::agent", %error, "the link probe is reported but not kept: the next start probes again");
                }
                rate.store(probe.bytes_per_second, Ordering::SeqCst);
                // A permit if the reporter is mid-call: it reports again right after.
                probed.notify_one();
                return;
            }
            Err(error) => {
                let retry = lockstep_core::upgrader::LINK_PROBE_RETRY;
                tracing::info!(target: "lockstep::agent", %error, retry_s = retry.0 / 1000, "link probe failed; probing again later");
                tokio::time::sleep(Duration::from_millis(retry.0)).await;
            }
        }
    }
}

/// One link probe from the controller at `base`: the bytes checked (size and sha256: zeros)
/// and timed; the file they went to removed.
async fn probe_once(
    data: &DataDir,
    conf: &AgentConf,
    base: &str,
) -> Result<LinkProbe, MachineAgentError> {
    let size_bytes = lockstep_core::upgrader::LINK_PROBE_BYTES;
    let zeros = vec![0u8; size_bytes as usize];
    let entry = lockstep_core::policy::CatalogueEntry {
        // The source names a download by its binary; a probe is none (its errors are
        // wrapped in `LinkProbe`, which names the URL).
        binary: Binary::parse("0.0.0-ubuntu-amd64").expect("a binary"),
        stream: lockstep_core::policy::Stream::Released,
        size_bytes,
        sha256: Sha256(<sha2::Sha256 as sha2::Digest>::digest(&zeros).into()),
        path: "link-probe".to_owned(),
    };
    let source = controller_source(data, conf, base)?;
    let cache = data.tools_cache_dir();
    std::fs::create_dir_all(&cache).map_err(|error| MachineAgentError::CreateCache {
        path: cache.clone(),
        error,
    })?;
    let destination = cache.join("link-probe");
    let started = Instant::now();
    let mut first: Option<(Instant, u64)> = None;
    let mut last: Option<(Instant, u64)> = None;
    let mut window = |progress: lockstep_streams::DownloadProgress| {
        if first.is_none() && progress.received_bytes > 0 {
            first = Some((Instant::now(), progress.received_bytes));
        }
        if progress.received_bytes == progress.total_bytes {
            last = Some((Instant::now(), progress.received_bytes));
        }
    };
    let result = source.download(&entry, &destination, &mut window).await;
    let _ = std::fs::remove_file(&destination);
    result.map_err(|error| MachineAgentError::LinkProbe {
        url: format!("{base}/link-probe"),
        error: Box::new(error),
    })?;
    Ok(LinkProbe {
        bytes_per_second: download_rate(started, first, last, size_bytes),
        bytes: size_bytes,
        unix_seconds: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_download_rate_runs_from_the_first_byte_to_the_last() {
        let started = Instant::now();
        let first = started + Duration::from_secs(5);
        let last = first + Duration::from_secs(2);
        // 5 s in the controller's queue do not count: 2,000,000 bytes after the first read
        // in 2 s.
        assert_eq!(
            download_rate(
                started,
                Some((first, 65_536)),
                Some((last, 2_065_536)),
                2_065_536
            ),
            1_000_000
        );
        // Everything in one read: from the request.
        assert_eq!(
            download_rate(started, Some((last, 4_000)), Some((last, 4_000)), 4_000),
            571
        );
        // However quick, at least 1 byte per second and no division by zero.
        assert!(download_rate(last, Some((last, 1)), Some((last, 1)), 1) >= 1);
    }

    #[test]
    fn errors_name_the_call_and_show_the_reply_shortened() {
        let reply = json!({"results": [], "padding": "x".repeat(500)});
        let error = TOOLS.first_result(&reply, "entities").unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("Upgrader.Tools: the reply has no entities: {"),
            "{message}"
        );
        assert!(message.ends_with(" characters)"), "{message}");
        assert!(message.len() < 200, "{message}");

        let reply = json!({"results": [{"error": {"message": "permission denied", "code": "unauthorized"}}]});
        let error = SET_STATUS.first_result(&reply, "results").unwrap_err();
        assert_eq!(
            error.to_string(),
            "Machiner.SetStatus: permission denied (code unauthorized)"
        );

        let error = Sha256::parse("nope")
            .map_err(TOOLS.malformed("sha256"))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("Upgrader.Tools: sha256: invalid sha256 \"nope\""),
            "{error}"
        );
        assert!(std::error::Error::source(&error).is_some());
    }
}
