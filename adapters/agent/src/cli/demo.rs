//! `lockstep demo`: the seed's scenario, end to end, on this machine.
//!
//! In a temporary directory: a mirror publishing this build as version N and as N+1 (one
//! patch newer, through a `FORCE-VERSION` file in its tarball), its metadata signed by a key
//! made for the run; a controller bootstrapped on N with `--auto-upgrade` and that key
//! (`--metadata-key`); and, started at the same moment, a deployer that deploys a
//! bundle and a watcher that follows every change. It prints a timeline and the claims,
//! each computed by [`claims`] from what was observed ([`Observed`]): the clients' own
//! records (calls, answers, retry counters sampled every millisecond), the controller's
//! JSON log, `/proc`, and the store's event log read after the controller stopped. It exits
//! non-zero if any claim does not hold, and stops every process it started.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_core::Version;
use lockstep_core::client::RetryPolicy;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{Changes, EntityKind, Store, StoreError};
use lockstep_streams::signature::KeyError;
use lockstep_streams::{GenerateError, SigningKey};
use lockstep_transport::client::{Client, ClientError, ClientStats};
use serde_json::{Value, json};

use crate::cli::bootstrap::{
    self, BootstrapError, BootstrapOptions, ControllerFile, Progress, WaitError,
};
use crate::cli::bundle::{Bundle, BundleChange, BundleError};
use crate::cli::commands::{self, CallError};
use crate::datadir::{self, DataDir, DataDirError};
use crate::logging::say;
use crate::paths::ExecutableError;
use crate::unpack::UnpackError;

/// Why the demo could not run, or did not hold.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: io::Error,
    },
    #[error("cannot create a temporary directory: {0}")]
    TempDir(#[source] io::Error),
    #[error("--timeline: {error}")]
    Timeline {
        #[source]
        error: lockstep_fs::AtomicWriteError,
    },
    #[error(transparent)]
    Executable(#[from] ExecutableError),
    #[error(transparent)]
    Pack(#[from] UnpackError),
    #[error("cannot generate the metadata of the mirror {}: {error}", mirror.display())]
    Generate {
        mirror: PathBuf,
        #[source]
        error: GenerateError,
    },
    #[error("the mirror's signing key: {0}")]
    Key(#[source] KeyError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("the {party} task panicked: {error}")]
    Panicked {
        party: &'static str,
        #[source]
        error: tokio::task::JoinError,
    },
    #[error("interrupted; the demo's controller was stopped")]
    Interrupted,
    #[error("{failed} of {total} claims did not hold")]
    ClaimsFailed { failed: usize, total: usize },
}

impl DemoError {
    /// A mapper from the `io::Error` of `action` on `path`.
    fn io(path: &Path, action: &'static str) -> impl FnOnce(io::Error) -> DemoError + use<> {
        let path = path.to_path_buf();
        move |error| DemoError::Io {
            path,
            action,
            error,
        }
    }
}

/// Why the watcher stopped before it saw what it waited for.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WatchError {
    #[error("the watcher did not see the deployed state within {}s", waited.as_secs())]
    TimedOut { waited: Duration },
    #[error("the watcher's client: {0}")]
    Client(#[source] Box<ClientError>),
}

/// Why the store's event log could not be read whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreLogError {
    #[error("cannot open the store {}: {error}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        error: StoreError,
    },
    #[error("cannot read the event log: {0}")]
    Read(#[source] StoreError),
    #[error(
        "the event log cannot be read whole: the events up to revision {compacted} were \
         compacted"
    )]
    Compacted { compacted: u64 },
}

/// The bundle the demo deploys.
pub const DEMO_BUNDLE: &str = include_str!("../../bundles/demo.yaml");

/// One timeline entry: when (since the demo started), who, what.
pub type Event = (Duration, &'static str, String);

/// Events in order, with the time since the demo started.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    events: Arc<Mutex<Vec<Event>>>,
    started: Option<Instant>,
    /// The same moment on the wall clock, to place the daemon's log lines.
    started_unix_micros: u64,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            events: Arc::default(),
            started: Some(Instant::now()),
            started_unix_micros: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0),
        }
    }

    /// The time since the demo started.
    pub fn elapsed(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// `unix_micros` on the wall clock as the time since the demo started.
    pub fn since_start(&self, unix_micros: u64) -> Duration {
        Duration::from_micros(unix_micros.saturating_sub(self.started_unix_micros))
    }

    /// Adds an event that happened `at` since the demo started.
    pub fn add_at(&self, at: Duration, party: &'static str, text: impl Into<String>) {
        self.events
            .lock()
            .expect("not poisoned")
            .push((at, party, text.into()));
    }

    /// Adds the controller's own events (from [`parse_controller_log`]).
    pub fn add_controller(&self, events: &[(Duration, ControllerEvent)]) {
        for (at, event) in events {
            self.add_at(*at, "controller", event.describe());
        }
    }

    pub fn add(&self, party: &'static str, text: impl Into<String>) {
        self.add_at(self.elapsed(), party, text);
    }

    /// Every event so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.events.lock().expect("not poisoned").clone();
        events.sort_by_key(|(at, _, _)| *at);
        events
    }

    pub fn render(&self) -> String {
        let mut events = self.events.lock().expect("not poisoned").clone();
        events.sort_by_key(|(at, _, _)| *at);
        events
            .iter()
            .map(|(at, party, text)| format!("{:>8.3}s  {party:<10} {text}", at.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One event of the controller, from its JSON log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerEvent {
    /// The launcher started a worker.
    LauncherStartedWorker { pid: u64 },
    /// A worker starts on `running` (a binary such as `0.1.1-ubuntu-amd64`).
    WorkerStarting { pid: u64, running: String },
    /// The gate changed: limited in every phase but Ready.
    Gate { phase: String, limited: bool },
    /// An upgrade step began.
    Step {
        kind: String,
        key: String,
        message: String,
    },
    /// The worker re-executes into `binary`.
    ReExecuting { binary: String },
}

impl ControllerEvent {
    pub fn describe(&self) -> String {
        match self {
            ControllerEvent::LauncherStartedWorker { pid } => {
                format!("launcher starts a worker (pid {pid})")
            }
            ControllerEvent::WorkerStarting { pid, running } => {
                format!("worker (pid {pid}) starts on {running}")
            }
            ControllerEvent::Gate { phase, limited } => format!(
                "phase {phase} ({})",
                if *limited {
                    "gate: limited"
                } else {
                    "gate: full API"
                }
            ),
            ControllerEvent::Step { kind, key, message } => {
                format!("{kind} step {key}: {message}")
            }
            ControllerEvent::ReExecuting { binary } => {
                format!("restart: re-executes into {binary}")
            }
        }
    }
}

/// The controller's events in its JSON log (`--log-format json`), each with its time since
/// `started_unix_micros` (earlier ones at zero). Lines that are not such events are skipped.
pub fn parse_controller_log(
    log: &str,
    started_unix_micros: u64,
) -> Vec<(Duration, ControllerEvent)> {
    let mut events = Vec::new();
    for line in log.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(at) = entry["timestamp"].as_str().and_then(parse_rfc3339_micros) else {
            continue;
        };
        let text = |field: &str| entry[field].as_str().unwrap_or("").to_owned();
        let message = entry["message"].as_str().unwrap_or("");
        let event = match (entry["target"].as_str().unwrap_or(""), message) {
            ("lockstep::agent", "gate") => ControllerEvent::Gate {
                phase: text("phase"),
                limited: entry["limited"] != false,
            },
            ("lockstep::agent", "worker starting") => ControllerEvent::WorkerStarting {
                pid: entry["pid"].as_u64().unwrap_or(0),
                running: text("running"),
            },
            ("lockstep::agent", "re-executing") => ControllerEvent::ReExecuting {
                binary: text("binary"),
            },
            ("lockstep::agent", _) if entry["key"].is_string() => ControllerEvent::Step {
                kind: text("kind"),
                key: text("key"),
                message: message.to_owned(),
            },
            ("lockstep::launcher", "worker started") => ControllerEvent::LauncherStartedWorker {
                pid: entry["pid"].as_u64().unwrap_or(0),
            },
            _ => continue,
        };
        events.push((
            Duration::from_micros(at.saturating_sub(started_unix_micros)),
            event,
        ));
    }
    events
}

/// `2026-12-02T16:17:50.114428Z` → microseconds since the Unix epoch.
pub fn parse_rfc3339_micros(text: &str) -> Option<u64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut date = date.split('-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.split(':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    let micros: i64 = format!("{fraction:0<6}").get(..6)?.parse().ok()?;
    // Days from civil (proleptic Gregorian), after Howard Hinnant.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds * 1_000_000 + micros).ok()
}

/// Kills the launcher (and so its worker) when dropped.
#[derive(Debug)]
pub struct DaemonGuard {
    pub pid: u32,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        stop_daemon(self.pid);
    }
}

/// SIGTERM, then SIGKILL after 30 s; waits until the process is gone.
pub fn stop_daemon(pid: u32) {
    let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(target, rustix::process::Signal::TERM);
    let started = Instant::now();
    while crate::process::alive(pid) {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Publishes `lockstepd` as `version` into `<mirror>/tools/released/`, with a
/// FORCE-VERSION file when `force`.
pub fn publish(
    mirror: &Path,
    version: Version,
    lockstepd: &Path,
    force: bool,
) -> Result<PathBuf, DemoError> {
    let binary = datadir::host_binary(version);
    let dir = mirror.join("tools").join("released");
    std::fs::create_dir_all(&dir).map_err(DemoError::io(&dir, "create the directory"))?;
    let scratch = tempfile::tempdir().map_err(DemoError::TempDir)?;
    let force_file = scratch.path().join("FORCE-VERSION");
    std::fs::write(&force_file, format!("{version}\n"))
        .map_err(DemoError::io(&force_file, "write"))?;
    let mut entries = vec![("lockstepd", lockstepd, 0o755)];
    if force {
        entries.push(("FORCE-VERSION", force_file.as_path(), 0o644));
    }
    let tarball = dir.join(format!("juju-{binary}.tgz"));
    crate::unpack::pack_tgz(&entries, &tarball)?;
    Ok(tarball)
}

/// Regenerates the mirror's simplestreams metadata, also clear-signed (`.sjson`) with `key`
/// when given (`generate-agent-binaries --sign-key`).
pub fn generate(mirror: &Path, key: Option<&SigningKey>) -> Result<(), DemoError> {
    let failed = |error| DemoError::Generate {
        mirror: mirror.to_path_buf(),
        error,
    };
    let generated = lockstep_streams::generate_agent_binaries(
        mirror,
        &lockstep_streams::GenerateOptions {
            now_unix_seconds: crate::metadata::unix_now(),
        },
    )
    .map_err(failed)?;
    if let Some(key) = key {
        lockstep_streams::sign_generated_metadata(mirror, &generated, key).map_err(failed)?;
    }
    Ok(())
}

/// A new signing key for a mirror (`metadata generate-key`), its public key written to
/// `public_key` for `bootstrap --metadata-key`.
pub fn signing_key(public_key: &Path) -> Result<SigningKey, DemoError> {
    let key = SigningKey::generate("lockstep demo mirror").map_err(DemoError::Key)?;
    let armored = key.public_key_armored().map_err(DemoError::Key)?;
    std::fs::write(public_key, armored).map_err(DemoError::io(public_key, "write"))?;
    Ok(key)
}

/// The pid of the launcher's worker (its only child).
pub fn worker_pid(launcher: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// What `/proc/<pid>/exe` resolves to.
pub fn exe_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// A client's retry counters each time they changed, with the time since the demo started
/// at which the change was seen (sampled every millisecond, so at most about a millisecond
/// after it happened).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTrace {
    pub changes: Vec<(Duration, ClientStats)>,
}

impl ClientTrace {
    /// When the first `upgrade in progress` answer was seen.
    pub fn first_refused(&self) -> Option<Duration> {
        self.changes
            .iter()
            .find(|(_, stats)| stats.upgrade_in_progress > 0)
            .map(|(at, _)| *at)
    }

    /// When each attempt that found its connection closed (or could not connect) was seen.
    /// A connection the client noticed closed while idle is reopened without counting.
    pub fn disconnects(&self) -> Vec<Duration> {
        let mut before = 0;
        let mut seen = Vec::new();
        for (at, stats) in &self.changes {
            if stats.disconnected > before {
                seen.push(*at);
                before = stats.disconnected;
            }
        }
        seen
    }

    /// The counters at the end.
    pub fn last(&self) -> ClientStats {
        self.changes
            .last()
            .map(|(_, stats)| *stats)
            .unwrap_or_default()
    }
}

/// Runs `work` while sampling `client`'s retry counters every millisecond.
async fn traced<T>(
    client: &Client,
    timeline: &Timeline,
    work: impl Future<Output = T>,
) -> (T, ClientTrace) {
    let mut trace = ClientTrace::default();
    let mut last = ClientStats::default();
    let mut sample = |trace: &mut ClientTrace| {
        let now = client.stats();
        if now != last {
            trace.changes.push((timeline.elapsed(), now));
            last = now;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(work);
    loop {
        tokio::select! {
            output = &mut work => {
                sample(&mut trace);
                return (output, trace);
            }
            _ = tick.tick() => sample(&mut trace),
        }
    }
}

/// One call of the deployer, as it saw it.
#[derive(Clone, Debug)]
pub struct DeployCall {
    pub change: BundleChange,
    /// When the call was first sent, and when its last answer came.
    pub sent: Duration,
    pub answered: Duration,
    /// `upgrade in progress` answers, and closed connections, retried within this call.
    pub refused: u64,
    pub reconnected: u64,
    pub result: Result<Value, CallError>,
}

/// A deployer: applies every change of the bundle through its own client, each with one
/// `operation-id` for all its retries. Started before the controller is ready.
pub async fn deployer(
    controller: ControllerFile,
    bundle: Bundle,
    timeline: Timeline,
    deadline: Duration,
) -> Vec<DeployCall> {
    let client = controller.client(RetryPolicy::default());
    let mut calls = Vec::new();
    for change in bundle.plan() {
        let (facade, version, method, params) = commands::call_for(&change);
        let before = client.stats();
        let sent = timeline.elapsed();
        let result = client
            .mutate(facade, version, method, params, deadline)
            .await
            .map_err(|error| CallError::Client {
                facade,
                method,
                error: Box::new(error),
            })
            .and_then(|reply| {
                commands::check_results(&reply, &commands::describe_change(&change)).map(|()| reply)
            });
        let answered = timeline.elapsed();
        let after = client.stats();
        let refused = after.upgrade_in_progress - before.upgrade_in_progress;
        let reconnected = after.disconnected - before.disconnected;
        if refused + reconnected > 0 {
            timeline.add_at(
                sent,
                "deployer",
                format!("{}: sent", commands::describe_change(&change)),
            );
        }
        timeline.add_at(
            answered,
            "deployer",
            match &result {
                Ok(_) if refused + reconnected > 0 => format!(
                    "{} done after {refused} answers `upgrade in progress` and {reconnected} \
                     connections closed or refused, each retried with the same operation-id",
                    commands::describe_change(&change),
                ),
                Ok(_) => format!("{} done", commands::describe_change(&change)),
                Err(error) => format!("{} FAILED: {error}", commands::describe_change(&change)),
            },
        );
        calls.push(DeployCall {
            change,
            sent,
            answered,
            refused,
            reconnected,
            result,
        });
    }
    calls
}

/// What a watcher reconstructed: every entity's last delta, and the revisions it saw.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    pub entities: BTreeMap<(String, String), Value>,
    pub revisions: Vec<u64>,
    pub deltas: usize,
    /// Deltas delivered again: the same entity at the same revision.
    pub repeated: Vec<(u64, String, String)>,
    delivered: BTreeSet<(u64, String, String)>,
}

fn entity_key(delta: &Value) -> Option<(String, String)> {
    let kind = delta[0].as_str()?.to_owned();
    let entity = &delta[2];
    let id = ["name", "key", "id"]
        .iter()
        .find_map(|field| entity[field].as_str())
        .unwrap_or("")
        .to_owned();
    Some((kind, id))
}

/// A watcher's run, as it saw it.
#[derive(Clone, Debug)]
pub struct WatcherRun {
    /// When it asked for its first changes, when the first ones came, and the last.
    pub started: Duration,
    pub first_delivery: Option<Duration>,
    pub last_delivery: Option<Duration>,
    pub result: Result<Watched, WatchError>,
    /// Its client's retry counters over the run.
    pub trace: ClientTrace,
}

/// A watcher: follows every change until `done` says it has seen enough. Started before
/// the controller is ready.
pub async fn watcher(
    controller: ControllerFile,
    timeline: Timeline,
    deadline: Duration,
    done: impl Fn(&Watched) -> bool,
) -> WatcherRun {
    let client = controller.client(RetryPolicy::default());
    let started = timeline.elapsed();
    let mut first_delivery = None;
    let mut last_delivery = None;
    let work = async {
        let mut watcher = client.watch();
        let mut watched = Watched::default();
        while !done(&watched) {
            let left = deadline.saturating_sub(timeline.elapsed().saturating_sub(started));
            if left.is_zero() {
                return Err(WatchError::TimedOut { waited: deadline });
            }
            let deltas = watcher
                .next(left)
                .await
                .map_err(|error| WatchError::Client(Box::new(error)))?;
            if !deltas.is_empty() {
                first_delivery.get_or_insert(timeline.elapsed());
                last_delivery = Some(timeline.elapsed());
            }
            for delta in &deltas {
                watched.deltas += 1;
                watched.revisions.push(delta.revision.0);
                if let Some((kind, id)) = entity_key(&delta.delta) {
                    let delivery = (delta.revision.0, kind.clone(), id.clone());
                    if !watched.delivered.insert(delivery.clone()) {
                        watched.repeated.push(delivery);
                    }
                    let key = (kind, id);
                    if delta.delta[1] == "remove" {
                        watched.entities.remove(&key);
                    } else {
                        watched.entities.insert(key, delta.delta[2].clone());
                    }
                }
            }
            if !deltas.is_empty() {
                timeline.add(
                    "watcher",
                    format!(
                        "{} deltas up to revision {}",
                        deltas.len(),
                        deltas.last().map(|d| d.revision.0).unwrap_or(0)
                    ),
                );
            }
        }
        Ok(watched)
    };
    let (result, trace) = traced(&client, &timeline, work).await;
    if let Some(at) = trace.first_refused() {
        timeline.add_at(at, "watcher", "first answer `upgrade in progress`; retries");
    }
    for at in trace.disconnects() {
        timeline.add_at(
            at,
            "watcher",
            "an attempt found its connection closed or refused; reconnects and resumes",
        );
    }
    WatcherRun {
        started,
        first_delivery,
        last_delivery,
        result,
        trace,
    }
}

/// What the store's event log says, read after the controller stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreLog {
    /// The revisions of each database step's checkpoints (`<step>@<version>`).
    pub checkpoints: BTreeMap<String, Vec<u64>>,
    /// Each application's units in the log, each with the revision of its first event.
    pub units: BTreeMap<String, BTreeMap<String, u64>>,
    /// Each application with the revision of its first event.
    pub applications: BTreeMap<String, u64>,
}

impl StoreLog {
    /// Reads the whole event log.
    pub fn read(store: &dyn Store) -> Result<StoreLog, StoreLogError> {
        let mut log = StoreLog::default();
        let mut after = Revision(0);
        loop {
            let events = match store
                .changes_since(after, 10_000)
                .map_err(StoreLogError::Read)?
            {
                Changes::Events { events, .. } => events,
                Changes::ResyncNeeded { compacted, .. } => {
                    return Err(StoreLogError::Compacted {
                        compacted: compacted.0,
                    });
                }
            };
            let Some(last) = events.last() else {
                return Ok(log);
            };
            after = last.revision;
            for event in events {
                let revision = event.revision.0;
                match event.kind {
                    EntityKind::Step => log
                        .checkpoints
                        .entry(event.id.clone())
                        .or_default()
                        .push(revision),
                    EntityKind::Application => {
                        log.applications.entry(event.id.clone()).or_insert(revision);
                    }
                    EntityKind::Unit => {
                        let application = event.entity["application"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned();
                        log.units
                            .entry(application)
                            .or_default()
                            .entry(event.id.clone())
                            .or_insert(revision);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Everything the demo observed; [`claims`] computes each claim from it.
#[derive(Clone, Debug)]
pub struct Observed {
    pub bundle: Bundle,
    /// N+1's binary (`0.1.1-ubuntu-amd64`), which the controller must restart into, and its
    /// directory under `tools/`.
    pub next_binary: String,
    pub next_dir: PathBuf,
    /// N+1's version and its database steps (`<step>@<version>`), which must each be
    /// checkpointed exactly once.
    pub next_version: String,
    pub next_database_steps: Vec<String>,
    /// `/proc/<worker>/exe` at the end.
    pub serving: Option<PathBuf>,
    /// The controller's events, from its JSON log.
    pub controller: Vec<(Duration, ControllerEvent)>,
    /// What bootstrap's wait for Ready returned.
    pub bootstrap: Result<(), WaitError>,
    pub deployer: Vec<DeployCall>,
    pub watcher: WatcherRun,
    /// `Client.FullStatus` at the end.
    pub status: Result<Value, CallError>,
    pub store: Result<StoreLog, StoreLogError>,
}

impl Observed {
    /// When the controller first opened its full API.
    pub fn ready_at(&self) -> Option<Duration> {
        self.controller.iter().find_map(|(at, event)| {
            matches!(event, ControllerEvent::Gate { limited: false, .. }).then_some(*at)
        })
    }

    /// When the worker re-executed into N+1.
    pub fn re_exec_at(&self) -> Option<Duration> {
        self.controller.iter().find_map(|(at, event)| match event {
            ControllerEvent::ReExecuting { binary } if *binary == self.next_binary => Some(*at),
            _ => None,
        })
    }
}

/// One claim: a name for tests, whether it holds, and what was observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub name: &'static str,
    pub holds: bool,
    pub text: String,
}

fn claim(name: &'static str, holds: bool, text: String) -> Claim {
    Claim { name, holds, text }
}

fn seconds(at: Option<Duration>) -> String {
    at.map_or_else(
        || "never".to_owned(),
        |at| format!("{:.3}s", at.as_secs_f64()),
    )
}

/// Every claim, computed from what was observed.
pub fn claims(observed: &Observed) -> Vec<Claim> {
    let mut claims = Vec::new();
    let ready_at = observed.ready_at();
    let re_exec_at = observed.re_exec_at();

    claims.push(claim(
        "bootstrap",
        observed.bootstrap.is_ok() && ready_at.is_some(),
        match &observed.bootstrap {
            Ok(()) => format!(
                "bootstrap waited until Ready; the controller opened its full API at {}",
                seconds(ready_at)
            ),
            Err(error) => format!("bootstrap: {error}"),
        },
    ));

    // The switch was real: the log shows the re-exec into N+1 and a worker starting on it,
    // and the serving process runs the N+1 binary.
    let started_on_next = re_exec_at.and_then(|re_exec| {
        observed
            .controller
            .iter()
            .find_map(|(at, event)| match event {
                ControllerEvent::WorkerStarting { running, .. }
                    if *at >= re_exec && *running == observed.next_binary =>
                {
                    Some(*at)
                }
                _ => None,
            })
    });
    let serving_next = observed
        .serving
        .as_ref()
        .is_some_and(|exe| exe.starts_with(&observed.next_dir));
    claims.push(claim(
        "restarted into N+1",
        serving_next && started_on_next.is_some(),
        format!(
            "re-executed into {} at {}, a worker started on it at {}; the serving process runs \
             {} (expected under {})",
            observed.next_binary,
            seconds(re_exec_at),
            seconds(started_on_next),
            observed
                .serving
                .as_ref()
                .map_or_else(|| "nothing".to_owned(), |exe| exe.display().to_string()),
            observed.next_dir.display()
        ),
    ));

    // The clients overlapped the upgrade: the deployer's first call went out while the API
    // was limited and was refused, then applied after Ready.
    let first = observed.deployer.first();
    let deployer_overlapped = match (first, ready_at) {
        (Some(first), Some(ready)) => {
            first.sent < ready
                && first.refused > 0
                && first.answered >= ready
                && first.result.is_ok()
        }
        _ => false,
    };
    claims.push(claim(
        "deployer overlapped the limited phases",
        deployer_overlapped,
        match first {
            Some(first) => format!(
                "the deployer's first call ({}) was sent at {}, Ready came at {}; it was \
                 answered `upgrade in progress` {} times and {} at {}",
                commands::describe_change(&first.change),
                seconds(Some(first.sent)),
                seconds(ready_at),
                first.refused,
                if first.result.is_ok() {
                    "applied"
                } else {
                    "failed"
                },
                seconds(Some(first.answered)),
            ),
            None => "the deployer made no call".to_owned(),
        },
    ));
    // The watcher's session spanned the restart: reads are served in every phase, so N's
    // worker delivered the state to it while limited, before the re-exec; N+1's delivered
    // the deployed state to it after Ready (behind the front door on the same connection;
    // with `--front-door=false` on a new one, the re-exec closing every connection). Its
    // client counts an attempt that found its connection closed or could not connect (one
    // made before the launcher listens), not a connection it notices closed while idle, so
    // that count is shown, not required.
    let watcher = &observed.watcher;
    let watcher_spanned = match (re_exec_at, ready_at) {
        (Some(re_exec), Some(ready)) => {
            watcher.started < re_exec
                && watcher.first_delivery.is_some_and(|at| at < re_exec)
                && watcher.last_delivery.is_some_and(|at| at >= ready)
                && watcher.result.is_ok()
        }
        _ => false,
    };
    claims.push(claim(
        "watcher spanned the restart",
        watcher_spanned,
        format!(
            "the watcher started at {}, was first delivered the state (by {}'s worker, \
             limited) at {}, the controller re-executed at {}, Ready at {}, the watcher's \
             last changes delivered at {} ({} attempts found the connection closed or refused, {} \
             answers `upgrade in progress`)",
            seconds(Some(watcher.started)),
            observed
                .controller
                .iter()
                .find_map(|(_, event)| match event {
                    ControllerEvent::WorkerStarting { running, .. } => Some(running.as_str()),
                    _ => None,
                })
                .unwrap_or("the first"),
            seconds(watcher.first_delivery),
            seconds(re_exec_at),
            seconds(ready_at),
            seconds(watcher.last_delivery),
            watcher.trace.last().disconnected,
            watcher.trace.last().upgrade_in_progress,
        ),
    ));

    // No client saw an error: every deploy call, the watcher, and the final status.
    let mut errors: Vec<String> = observed
        .deployer
        .iter()
        .filter_map(|call| {
            call.result
                .as_ref()
                .err()
                .map(|e| format!("deployer: {}: {e}", commands::describe_change(&call.change)))
        })
        .collect();
    if let Err(error) = &watcher.result {
        errors.push(format!("watcher: {error}"));
    }
    if let Err(error) = &observed.status {
        errors.push(format!("status: {error}"));
    }
    let retried = |pick: fn(&DeployCall) -> u64| observed.deployer.iter().map(pick).sum::<u64>();
    claims.push(claim(
        "no client error",
        errors.is_empty() && !observed.deployer.is_empty(),
        if errors.is_empty() {
            format!(
                "no client error: the deployer's {} calls succeeded (after retrying {} \
                 `upgrade in progress` answers and {} connections closed or refused), the watcher \
                 (after {} and {}) and the final status too",
                observed.deployer.len(),
                retried(|call| call.refused),
                retried(|call| call.reconnected),
                watcher.trace.last().upgrade_in_progress,
                watcher.trace.last().disconnected,
            )
        } else {
            format!("client errors: {}", errors.join("; "))
        },
    ));

    let status = observed.status.as_ref().ok();
    let version = status
        .and_then(|status| status["model"]["version"].as_str())
        .unwrap_or("");
    claims.push(claim(
        "model agent-version",
        version == observed.next_version,
        format!(
            "the model's agent-version is {version:?} (expected {})",
            observed.next_version
        ),
    ));

    // Each deploy applied once, after the restart: its units in status and in the store's
    // log, every one written after N+1's database steps were checkpointed.
    let store = observed.store.as_ref().ok();
    let after_steps = store.and_then(|store| {
        observed
            .next_database_steps
            .iter()
            .filter_map(|step| store.checkpoints.get(step).and_then(|r| r.first()))
            .max()
            .copied()
    });
    for change in observed.bundle.plan() {
        let BundleChange::Deploy {
            application,
            num_units,
            ..
        } = change
        else {
            continue;
        };
        let in_status = status
            .and_then(|status| status["applications"][&application]["units"].as_object())
            .map_or(0, |units| units.len());
        let logged = store.and_then(|store| store.units.get(&application));
        let in_log = logged.map_or(0, BTreeMap::len);
        let first_revision = store
            .and_then(|store| store.applications.get(&application).copied())
            .into_iter()
            .chain(logged.into_iter().flat_map(|units| units.values().copied()))
            .min();
        let after_restart =
            matches!((first_revision, after_steps), (Some(first), Some(steps)) if first > steps);
        let wanted = num_units as usize;
        claims.push(claim(
            "deployed once, after the restart",
            in_status == wanted && in_log == wanted && after_restart,
            format!(
                "{application}: {in_status} units in status and {in_log} in the store's log \
                 (expected {wanted}), first written at revision {} (N+1's database steps \
                 checkpointed at revision {})",
                first_revision.map_or_else(|| "none".to_owned(), |r| r.to_string()),
                after_steps.map_or_else(|| "none".to_owned(), |r| r.to_string()),
            ),
        ));
    }

    claims.push(match &observed.store {
        Ok(store) => {
            let missing: Vec<&String> = observed
                .next_database_steps
                .iter()
                .filter(|step| !store.checkpoints.contains_key(*step))
                .collect();
            let repeated: Vec<String> = store
                .checkpoints
                .iter()
                .filter(|(_, revisions)| revisions.len() != 1)
                .map(|(step, revisions)| format!("{step} at revisions {revisions:?}"))
                .collect();
            claim(
                "database steps once",
                missing.is_empty()
                    && repeated.is_empty()
                    && !observed.next_database_steps.is_empty(),
                if missing.is_empty() && repeated.is_empty() {
                    format!(
                        "each database step checkpointed exactly once: {}",
                        store
                            .checkpoints
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    format!(
                        "database steps not checkpointed: {missing:?}; more than once: {repeated:?}"
                    )
                },
            )
        }
        Err(error) => claim("database steps once", false, format!("the store: {error}")),
    });

    claims.extend(check_watcher(&observed.watcher.result, status));
    claims
}

/// Checks the watcher saw each change once, in order, and ended at the controller's state.
fn check_watcher(watched: &Result<Watched, WatchError>, status: Option<&Value>) -> Vec<Claim> {
    let Ok(watched) = watched else {
        return vec![claim(
            "watcher once, in order",
            false,
            "the watcher failed (see above)".to_owned(),
        )];
    };
    let mut claims = Vec::new();
    let ordered = watched.revisions.windows(2).all(|pair| pair[0] <= pair[1]);
    let distinct: BTreeSet<_> = watched.revisions.iter().collect();
    claims.push(claim(
        "watcher once, in order",
        ordered && watched.repeated.is_empty() && watched.deltas > 0,
        if !ordered {
            format!("deltas out of order: {:?}", watched.revisions)
        } else if !watched.repeated.is_empty() {
            format!("deltas delivered twice: {:?}", watched.repeated)
        } else {
            format!(
                "the watcher's {} deltas came once each, in revision order ({} revisions)",
                watched.deltas,
                distinct.len()
            )
        },
    ));
    let expected: BTreeSet<(String, String)> = status
        .and_then(|status| status["applications"].as_object())
        .into_iter()
        .flatten()
        .flat_map(|(name, application)| {
            let units = application["units"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(unit, _)| ("unit".to_owned(), unit.clone()));
            std::iter::once(("application".to_owned(), name.clone())).chain(units)
        })
        .collect();
    let seen: BTreeSet<(String, String)> = watched
        .entities
        .keys()
        .filter(|(kind, _)| kind == "application" || kind == "unit")
        .cloned()
        .collect();
    claims.push(claim(
        "watcher saw everything",
        seen == expected && !expected.is_empty(),
        if seen == expected {
            format!(
                "the watcher saw every application and unit the controller has ({})",
                seen.len()
            )
        } else {
            format!("the watcher saw {seen:?}, the controller has {expected:?}")
        },
    ));
    claims
}

/// Runs the demo. See the module documentation. SIGINT or SIGTERM stops it, and every
/// process it started.
/// The run as `lockstep-sim --timeline` draws a simulated one (`lockstep-timeline`): the
/// controller's lane, its phase from its log's gate changes and its version from the binary
/// each worker starts on (a re-exec is `restarting` until the next worker's first phase),
/// and a lane per client (deployer, watcher, bootstrap) with a tick for each of its events.
pub fn picture(
    controller: &[(Duration, ControllerEvent)],
    events: &[Event],
    end: Duration,
) -> lockstep_timeline::Picture {
    use lockstep_timeline::{Lane, Mark, MarkKind, Picture, Span};
    let ms = |at: &Duration| at.as_millis() as u64;
    let mut lane = Lane {
        name: "controller".to_owned(),
        pinned: true,
        spans: Vec::new(),
    };
    let mut version: Option<String> = None;
    for (at, event) in controller {
        match event {
            ControllerEvent::WorkerStarting { running, .. } => {
                version = Some(
                    running
                        .split_once('-')
                        .map_or(running.as_str(), |(number, _)| number)
                        .to_owned(),
                );
            }
            ControllerEvent::Gate { phase, .. } => {
                let phase = lockstep_core::Phase::ALL
                    .into_iter()
                    .find(|known| known.as_str() == phase);
                if lane
                    .spans
                    .last()
                    .is_none_or(|span: &Span| span.phase != phase || span.version != version)
                {
                    lane.spans.push(Span {
                        from_ms: ms(at),
                        phase,
                        version: version.clone(),
                    });
                }
            }
            ControllerEvent::ReExecuting { .. } => lane.spans.push(Span {
                from_ms: ms(at),
                phase: Some(lockstep_core::Phase::Restarting),
                version: version.clone(),
            }),
            ControllerEvent::LauncherStartedWorker { .. } | ControllerEvent::Step { .. } => {}
        }
    }
    let mut lanes = vec![lane];
    let mut marks = Vec::new();
    for (at, party, text) in events {
        if matches!(*party, "controller" | "mirror" | "operator") {
            continue;
        }
        let index = match lanes.iter().position(|lane| lane.name == *party) {
            Some(index) => index,
            None => {
                lanes.push(Lane {
                    name: (*party).to_owned(),
                    pinned: true,
                    spans: Vec::new(),
                });
                lanes.len() - 1
            }
        };
        let kind = if text.contains("retr") || text.contains("upgrade in progress") {
            MarkKind::Retry
        } else {
            MarkKind::Event
        };
        marks.push(Mark {
            at_ms: ms(at),
            lane: Some(index),
            kind,
            text: text.clone(),
        });
    }
    Picture {
        title: "lockstep demo: bootstrap --auto-upgrade while a deployer and a watcher run"
            .to_owned(),
        lanes,
        marks,
        end_ms: ms(&end),
    }
}

pub async fn run(
    keep: bool,
    timeout: Duration,
    timeline_svg: Option<PathBuf>,
) -> Result<(), DemoError> {
    tokio::select! {
        result = run_demo(keep, timeout, timeline_svg) => result,
        () = crate::process::wait_for_termination() => {
            // Dropping `run_demo` dropped its daemon guard: the controller is stopped.
            Err(DemoError::Interrupted)
        }
    }
}

/// Returns once `address` accepts a TCP connection (closed at once), or after `timeout`:
/// the clients started then retry on their own.
async fn listening(address: &str, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn run_demo(
    keep: bool,
    timeout: Duration,
    timeline_svg: Option<PathBuf>,
) -> Result<(), DemoError> {
    let timeline = Timeline::new();
    let temp = tempfile::Builder::new()
        .prefix("lockstep-demo-")
        .tempdir()
        .map_err(DemoError::TempDir)?;
    let root = if keep {
        temp.keep()
    } else {
        temp.path().to_path_buf()
    };
    let lockstepd = crate::paths::sibling_executable("lockstepd")?;
    let own = crate::steps::build_version();
    let next = crate::steps::next_patch();
    let mirror = root.join("mirror");
    publish(&mirror, own, &lockstepd, false)?;
    publish(&mirror, next, &lockstepd, true)?;
    let public_key = root.join("metadata-public-key.asc");
    let key = signing_key(&public_key)?;
    generate(&mirror, Some(&key))?;
    timeline.add(
        "mirror",
        format!(
            "published {own} and {next} (FORCE-VERSION) in {}, metadata signed by key {}",
            mirror.display(),
            key.fingerprint()
        ),
    );

    let options = BootstrapOptions {
        data_dir: root.join("controller"),
        name: "demo".to_owned(),
        auto_upgrade: true,
        // The controller downloads N+1 itself, so that the clients ride through the whole
        // upgrade the timeline shows, download included.
        fetch_ahead: false,
        agent_version: None,
        agent_stream: None,
        build_agent: false,
        metadata_source: Some(mirror.display().to_string()),
        api_port: 0,
        local_agent: lockstepd.clone(),
        store: crate::store::StoreEngine::Sqlite,
        etcd_endpoints: Vec::new(),
        etcd_tls: Default::default(),
        etcd_auth: Default::default(),
        etcd_insecure: false,
        metadata_key: Some(public_key),
        allow_unsigned_metadata: false,
        metadata_ca: None,
        allow_metadata_redirects: false,
        provisioner: crate::datadir::Provisioner::Manual,
    };
    let prepared = bootstrap::prepare(&options).await?;
    let pid = bootstrap::spawn_daemon(
        &prepared.data,
        &["--log-format".to_owned(), "json".to_owned()],
    )?;
    let guard = DaemonGuard { pid };
    timeline.add(
        "operator",
        format!(
            "bootstrap --auto-upgrade: lockstepd started (pid {pid}) on {}",
            prepared.binary
        ),
    );

    // The deployer and the watcher start once the launcher listens, while the controller is
    // still limited: an attempt before that is refused, and the client's next one comes
    // 100 ms later (`RetryPolicy::default`), which can be after the whole limited window
    // (about 150 ms from start to Ready on a 2-core VM).
    if let Some(address) = prepared.controller.api_endpoints.first() {
        listening(address, timeout).await;
    }

    let bundle = Bundle::parse(DEMO_BUNDLE)?;
    let (applications, units, relations) =
        bundle
            .plan()
            .iter()
            .fold((0, 0, 0), |(a, u, r), change| match change {
                BundleChange::Deploy { num_units, .. } => (a + 1, u + *num_units as usize, r),
                BundleChange::AddRelation { .. } => (a, u, r + 1),
                BundleChange::Expose { .. } => (a, u, r),
            });
    let deploy = tokio::spawn(deployer(
        prepared.controller.clone(),
        bundle.clone(),
        timeline.clone(),
        timeout,
    ));
    let watch = tokio::spawn(watcher(
        prepared.controller.clone(),
        timeline.clone(),
        timeout,
        move |watched| {
            let count = |wanted: &str| {
                watched
                    .entities
                    .keys()
                    .filter(|(kind, _)| kind == wanted)
                    .count()
            };
            count("application") >= applications
                && count("unit") >= units
                && count("relation") >= relations
        },
    ));

    let client = prepared.controller.client(RetryPolicy::default());
    let mut last_phase = String::new();
    let ready = bootstrap::wait_until_ready(&client, Some(pid), timeout, |progress: &Progress| {
        if progress.phase != last_phase {
            timeline.add("bootstrap", format!("sees {}", progress.describe()));
            last_phase = progress.phase.clone();
        }
    })
    .await;
    if ready.is_ok() {
        timeline.add(
            "bootstrap",
            "Bootstrap complete, controller \"demo\" is now available",
        );
    }
    let deployed = deploy.await.map_err(|error| DemoError::Panicked {
        party: "deployer",
        error,
    })?;
    let status = client
        .call(
            "Client",
            commands::CLIENT_VERSION,
            "FullStatus",
            json!({}),
            Duration::from_secs(30),
        )
        .await
        .map_err(|error| CallError::Client {
            facade: "Client",
            method: "FullStatus",
            error: Box::new(error),
        });
    let watched = watch.await.map_err(|error| DemoError::Panicked {
        party: "watcher",
        error,
    })?;

    let data = DataDir::new(root.join("controller"));
    let next_binary = datadir::host_binary(next);
    let serving = worker_pid(pid).and_then(exe_of);
    drop(guard);
    timeline.add("operator", "controller stopped");
    let log = std::fs::read_to_string(data.logs_dir().join("lockstepd.log")).unwrap_or_default();
    let controller = parse_controller_log(&log, timeline.started_unix_micros);
    timeline.add_controller(&controller);
    let store_path = data.store_path();
    let store = lockstep_store::SqliteStore::open(&store_path, lockstep_store::OpenMode::ReadOnly)
        .map_err(|error| StoreLogError::Open {
            path: store_path.clone(),
            error,
        })
        .and_then(|store| StoreLog::read(&store));

    let observed = Observed {
        bundle,
        next_dir: data.binary_dir(&next_binary),
        next_binary: next_binary.to_string(),
        next_version: next.to_string(),
        next_database_steps: crate::steps::steps()
            .iter()
            .filter(|step| {
                step.target_version == next && step.kind == lockstep_core::steps::StepKind::Database
            })
            .map(|step| format!("{}@{next}", step.id.as_str()))
            .collect(),
        serving,
        controller,
        bootstrap: ready.map(|_| ()),
        deployer: deployed,
        watcher: watched,
        status,
        store,
    };
    let claims = claims(&observed);

    say("Timeline:");
    say(&timeline.render());
    if let Some(path) = &timeline_svg {
        let drawn = picture(&observed.controller, &timeline.events(), timeline.elapsed());
        let svg = lockstep_timeline::render(&drawn, &lockstep_timeline::Options::default());
        lockstep_fs::write_file_atomically(path, svg.as_bytes(), 0o644)
            .map_err(|error| DemoError::Timeline { error })?;
        say(&format!("timeline drawn in {}", path.display()));
    }
    say("\nResult:");
    let mut failures = 0;
    for claim in &claims {
        if claim.holds {
            say(&format!("  ok    {}", claim.text));
        } else {
            failures += 1;
            say(&format!("  FAIL  {}", claim.text));
        }
    }
    if keep {
        say(&format!("\nkept {}", root.display()));
    }
    if failures > 0 {
        return Err(DemoError::ClaimsFailed {
            failed: failures,
            total: claims.len(),
        });
    }
    say(&format!("\nall {} claims hold", claims.len()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_timestamps_parse_to_unix_microseconds() {
        assert_eq!(parse_rfc3339_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_micros("2000-02-29T00:00:01.5Z"),
            Some(951_782_401_500_000)
        );
        assert_eq!(
            parse_rfc3339_micros("2026-11-03T18:22:05.000001Z"),
            Some(1_793_730_125_000_001)
        );
        assert_eq!(parse_rfc3339_micros("yesterday"), None);
    }

    fn at(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    fn stats(upgrade_in_progress: u64, disconnected: u64) -> ClientStats {
        ClientStats {
            upgrade_in_progress,
            disconnected,
        }
    }

    /// A run in which every claim holds: the controller upgrades at 2 s and is Ready at
    /// 2.1 s; the deployer's first call goes out at 1.1 s and is refused twice; N delivers
    /// the state to the watcher at 1.2 s (limited: reads are served), and N+1 delivers the
    /// deployed state to it at 2.6 s.
    fn observed() -> Observed {
        let bundle = Bundle::parse(DEMO_BUNDLE).unwrap();
        let gate = |phase: &str, limited| ControllerEvent::Gate {
            phase: phase.to_owned(),
            limited,
        };
        let controller = vec![
            (at(1.0), ControllerEvent::LauncherStartedWorker { pid: 7 }),
            (
                at(1.0),
                ControllerEvent::WorkerStarting {
                    pid: 7,
                    running: "0.1.0-ubuntu-amd64".to_owned(),
                },
            ),
            (at(1.02), gate("checking-agent-version", true)),
            (at(1.03), gate("upgrading", true)),
            (
                at(2.0),
                ControllerEvent::ReExecuting {
                    binary: "0.1.1-ubuntu-amd64".to_owned(),
                },
            ),
            (
                at(2.01),
                ControllerEvent::WorkerStarting {
                    pid: 7,
                    running: "0.1.1-ubuntu-amd64".to_owned(),
                },
            ),
            (at(2.02), gate("running-steps", true)),
            (at(2.1), gate("ready", false)),
        ];
        let mut deployer = Vec::new();
        let mut status = json!({"model": {"version": "0.1.1"}, "applications": {}});
        let mut store = StoreLog::default();
        store
            .checkpoints
            .insert("record-agent-binaries@0.1.1".to_owned(), vec![20]);
        let mut watched = Watched::default();
        let mut revision = 20;
        for (index, change) in bundle.plan().into_iter().enumerate() {
            let first = index == 0;
            if let BundleChange::Deploy {
                application,
                num_units,
                ..
            } = &change
            {
                revision += 1;
                store.applications.insert(application.clone(), revision);
                watched
                    .entities
                    .insert(("application".to_owned(), application.clone()), json!({}));
                let mut units = serde_json::Map::new();
                for unit in 0..*num_units {
                    revision += 1;
                    let name = format!("{application}/{unit}");
                    store
                        .units
                        .entry(application.clone())
                        .or_default()
                        .insert(name.clone(), revision);
                    watched
                        .entities
                        .insert(("unit".to_owned(), name.clone()), json!({}));
                    units.insert(name, json!({}));
                }
                status["applications"][application] = json!({"units": units});
            }
            deployer.push(DeployCall {
                change,
                sent: if first { at(1.1) } else { at(2.5) },
                answered: at(2.5),
                refused: if first { 2 } else { 0 },
                reconnected: u64::from(first),
                result: Ok(json!({})),
            });
        }
        watched.revisions = (21..=revision).collect();
        watched.deltas = watched.revisions.len();
        Observed {
            bundle,
            next_binary: "0.1.1-ubuntu-amd64".to_owned(),
            next_dir: PathBuf::from("/c/tools/0.1.1-ubuntu-amd64"),
            next_version: "0.1.1".to_owned(),
            next_database_steps: vec!["record-agent-binaries@0.1.1".to_owned()],
            serving: Some(PathBuf::from("/c/tools/0.1.1-ubuntu-amd64/lockstepd")),
            controller,
            bootstrap: Ok(()),
            deployer,
            watcher: WatcherRun {
                started: at(1.1),
                first_delivery: Some(at(1.2)),
                last_delivery: Some(at(2.6)),
                result: Ok(watched),
                trace: ClientTrace {
                    changes: vec![(at(2.001), stats(0, 1))],
                },
            },
            status: Ok(status),
            store: Ok(store),
        }
    }

    fn failed(observed: &Observed) -> BTreeSet<&'static str> {
        claims(observed)
            .into_iter()
            .filter(|claim| !claim.holds)
            .map(|claim| claim.name)
            .collect()
    }

    #[test]
    fn every_claim_holds_for_a_run_that_overlapped_the_upgrade() {
        let claims = claims(&observed());
        assert!(claims.iter().all(|claim| claim.holds), "{claims:#?}");
        // Nine, and one per deployed application (four).
        assert_eq!(claims.len(), 9 + 4, "{claims:#?}");
    }

    /// Each claim fails when what it claims was not observed, and only that claim (or the
    /// claims that read the same observation).
    #[test]
    fn each_claim_fails_when_its_observation_says_otherwise() {
        type Change = fn(&mut Observed);
        let cases: Vec<(&str, Change, &[&str])> = vec![
            (
                "bootstrap gave up",
                |o| {
                    o.bootstrap = Err(WaitError::Timeout {
                        deadline: Duration::from_secs(180),
                        last: Box::default(),
                    })
                },
                &["bootstrap"],
            ),
            (
                "the serving process still runs N",
                |o| o.serving = Some(PathBuf::from("/c/tools/0.1.0-ubuntu-amd64/lockstepd")),
                &["restarted into N+1"],
            ),
            (
                "no re-exec in the controller's log",
                |o| {
                    o.controller
                        .retain(|(_, event)| !matches!(event, ControllerEvent::ReExecuting { .. }))
                },
                &["restarted into N+1", "watcher spanned the restart"],
            ),
            (
                "the controller never opened its full API",
                |o| {
                    o.controller.retain(|(_, event)| {
                        !matches!(event, ControllerEvent::Gate { limited: false, .. })
                    })
                },
                &[
                    "bootstrap",
                    "deployer overlapped the limited phases",
                    "watcher spanned the restart",
                ],
            ),
            (
                "the deployer started after Ready",
                |o| o.deployer[0].sent = at(2.2),
                &["deployer overlapped the limited phases"],
            ),
            (
                "the deployer was never refused",
                |o| o.deployer[0].refused = 0,
                &["deployer overlapped the limited phases"],
            ),
            (
                "the watcher was first delivered to after the re-exec",
                |o| o.watcher.first_delivery = Some(at(2.0005)),
                &["watcher spanned the restart"],
            ),
            (
                "the watcher was never delivered to",
                |o| {
                    o.watcher.first_delivery = None;
                    o.watcher.last_delivery = None;
                },
                &["watcher spanned the restart"],
            ),
            (
                "the watcher started after the re-exec",
                |o| o.watcher.started = at(2.05),
                &["watcher spanned the restart"],
            ),
            (
                "the watcher saw nothing after Ready",
                |o| o.watcher.last_delivery = Some(at(2.09)),
                &["watcher spanned the restart"],
            ),
            (
                "a deploy call failed",
                |o| {
                    o.deployer[8].result = Err(CallError::Refused {
                        what: "relate".to_owned(),
                        message: "connection refused".to_owned(),
                    })
                },
                &["no client error"],
            ),
            (
                "the final status failed",
                |o| {
                    o.status = Err(CallError::Client {
                        facade: "Client",
                        method: "FullStatus",
                        error: Box::new(ClientError::GaveUp(lockstep_core::client::GiveUp {
                            phase: None,
                            disconnected: true,
                            attempts: 3,
                            waited: lockstep_core::Millis(30_000),
                        })),
                    })
                },
                &[
                    "no client error",
                    "model agent-version",
                    "deployed once, after the restart",
                    "watcher saw everything",
                ],
            ),
            (
                "the model stayed on N",
                |o| o.status.as_mut().unwrap()["model"]["version"] = json!("0.1.0"),
                &["model agent-version"],
            ),
            (
                "a deploy applied twice (status)",
                |o| {
                    o.status.as_mut().unwrap()["applications"]["haproxy"]["units"]["haproxy/1"] =
                        json!({})
                },
                &["deployed once, after the restart", "watcher saw everything"],
            ),
            (
                "a deploy applied twice (store)",
                |o| {
                    o.store
                        .as_mut()
                        .unwrap()
                        .units
                        .get_mut("haproxy")
                        .unwrap()
                        .insert("haproxy/1".to_owned(), 99);
                },
                &["deployed once, after the restart"],
            ),
            (
                "a deploy applied before N+1's steps",
                |o| {
                    o.store
                        .as_mut()
                        .unwrap()
                        .applications
                        .insert("haproxy".to_owned(), 3);
                },
                &["deployed once, after the restart"],
            ),
            (
                "a database step checkpointed twice",
                |o| {
                    o.store
                        .as_mut()
                        .unwrap()
                        .checkpoints
                        .insert("record-agent-binaries@0.1.1".to_owned(), vec![20, 21]);
                },
                &["database steps once"],
            ),
            (
                "N+1's database step never ran",
                |o| {
                    o.store.as_mut().unwrap().checkpoints.clear();
                },
                &["deployed once, after the restart", "database steps once"],
            ),
            (
                "the watcher's deltas came out of order",
                |o| o.watcher.result.as_mut().unwrap().revisions.swap(0, 1),
                &["watcher once, in order"],
            ),
            (
                "the watcher got a delta twice",
                |o| {
                    o.watcher.result.as_mut().unwrap().repeated =
                        vec![(21, "application".to_owned(), "postgresql".to_owned())]
                },
                &["watcher once, in order"],
            ),
            (
                "the watcher missed a unit",
                |o| {
                    o.watcher
                        .result
                        .as_mut()
                        .unwrap()
                        .entities
                        .remove(&("unit".to_owned(), "wordpress/1".to_owned()));
                },
                &["watcher saw everything"],
            ),
        ];
        for (what, change, expected) in cases {
            let mut observed = observed();
            change(&mut observed);
            let expected: BTreeSet<&str> = expected.iter().copied().collect();
            assert_eq!(failed(&observed), expected, "{what}");
        }
    }

    #[test]
    fn the_controllers_json_log_gives_its_events_in_time() {
        let log = concat!(
            r#"{"timestamp":"1970-01-01T00:00:02.5Z","message":"gate","phase":"upgrading","limited":true,"target":"lockstep::agent"}"#,
            "\n",
            "not json\n",
            r#"{"timestamp":"1970-01-01T00:00:03Z","message":"re-executing","binary":"0.1.1-ubuntu-amd64","target":"lockstep::agent"}"#,
            "\n",
            r#"{"timestamp":"1970-01-01T00:00:04Z","message":"gate","phase":"ready","limited":false,"target":"lockstep::agent"}"#,
        );
        let events = parse_controller_log(log, 2_000_000);
        assert_eq!(
            events,
            vec![
                (
                    at(0.5),
                    ControllerEvent::Gate {
                        phase: "upgrading".to_owned(),
                        limited: true
                    }
                ),
                (
                    at(1.0),
                    ControllerEvent::ReExecuting {
                        binary: "0.1.1-ubuntu-amd64".to_owned()
                    }
                ),
                (
                    at(2.0),
                    ControllerEvent::Gate {
                        phase: "ready".to_owned(),
                        limited: false
                    }
                ),
            ]
        );
    }

    #[test]
    fn a_trace_says_when_a_client_was_first_refused_and_when_it_lost_its_connection() {
        let trace = ClientTrace {
            changes: vec![
                (at(1.0), stats(0, 1)),
                (at(2.0), stats(1, 1)),
                (at(3.0), stats(1, 3)),
            ],
        };
        assert_eq!(trace.first_refused(), Some(at(2.0)));
        assert_eq!(trace.disconnects(), vec![at(1.0), at(3.0)]);
        assert_eq!(trace.last(), stats(1, 3));
    }
}
