//! The driver: one task owns the lifecycle core; adapters run its requests and feed their
//! completions back; the core's deadlines become tokio timers.
//!
//! **Architecture Invariant:** no lifecycle decision is made here. The driver executes a
//! request exactly as asked and reports what happened; which request comes next, and what
//! a failure means, is the core's business. The one thing the driver does on its own is
//! to repeat an I/O operation that failed for a reason the core has no input for (the
//! store's file could not be written, say): it retries with capped backoff, logging and
//! publishing each failure, because the core is waiting for that completion.
//!
//! Requests run on tasks (blocking store calls on tokio's blocking pool); the core allows
//! at most one main request in flight besides the lease keep-alive, the record watch and
//! the lease release, so there is no queue to bound.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lockstep_core::gate::GateView;
use lockstep_core::lifecycle::{
    ControllerId, Input, ModelView, Output, Request, RequestId, StageSource, StatusReport,
    StepOutcome, request_name,
};
use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream};
use lockstep_core::steps::{StepKind, StepRegistry};
use lockstep_core::{Binary, Lifecycle, Phase, Timestamp, Version};
use lockstep_store::seed004::RefreshError;
use lockstep_store::{Store, StoreError};
use lockstep_streams::{DownloadError, LookupError, SourceError};
use tokio::sync::{mpsc, watch};

use crate::daemon::capabilities::CapabilitySource;
use crate::daemon::gate_hold::GateHold;
use crate::daemon::step_runner::{self, HostContext};
use crate::datadir::{DataDir, DataDirError, DownloadedTools};
use crate::metadata::{MetadataSource, MetadataTrust, unix_now};
use crate::notify::Notifier;
use crate::quote::quote;

/// What the lifecycle shows the API and the operator, besides the gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// The core's last status report.
    pub report: Option<StatusReport>,
    /// The newest patch known to be available.
    pub upgrade_available: Option<Version>,
    /// Bytes of a binary being staged: (received, total).
    pub download: Option<(u64, u64)>,
    /// The last message of a failure phase (StepsFailed, UpgradeFailed): what went wrong
    /// last and what was done about it, kept after the agent moved on.
    pub last_failure: Option<String>,
}

impl AgentStatus {
    /// Whether the core last reported Ready: the workers that act for a controller (the
    /// provisioner, the rollout coordinator) make their passes only then.
    pub fn is_ready(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|report| report.phase == Phase::Ready)
    }
}

/// Why a store or file operation the driver runs for the core did not complete.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{} vanished while the agent ran; restore it from a backup", path.display())]
    AgentConfVanished { path: PathBuf },
    #[error("the store holds no model: bootstrap did not finish; bootstrap again")]
    NoModel,
    #[error("cannot refresh the model's capabilities: {0}")]
    Refresh(#[source] RefreshError),
    #[error("the lifecycle asked for an invalid upgrade-info transition: {0}")]
    InvalidTransition(#[source] StoreError),
    #[error("panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
}

/// Why the driver ended on its own: a condition no retry fixes (a bug); the process
/// restarts and the core re-plans from what is stored.
#[derive(Debug, thiserror::Error)]
pub enum FatalError {
    #[error("cannot {what}: {error}")]
    Operation {
        what: &'static str,
        #[source]
        error: OperationError,
    },
    #[error("a request's task panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
    #[error("cannot switch to {binary}: {error}")]
    Switch {
        binary: Binary,
        #[source]
        error: DataDirError,
    },
}

/// Why an operation run by the driver did not complete.
#[derive(Debug)]
enum Failed {
    /// An I/O failure the core has no input for: tried again with backoff.
    Retry(OperationError),
    /// A condition no retry fixes (a bug): the driver ends, and the process restarts.
    Fatal(OperationError),
}

impl From<OperationError> for Failed {
    fn from(error: OperationError) -> Failed {
        Failed::Retry(error)
    }
}

impl From<DataDirError> for Failed {
    fn from(error: DataDirError) -> Failed {
        Failed::Retry(error.into())
    }
}

impl From<StoreError> for Failed {
    fn from(error: StoreError) -> Failed {
        Failed::Retry(error.into())
    }
}

/// How a driver run ended.
#[derive(Debug)]
pub enum Exit {
    /// The core asked to restart into this binary; the symlink already points at it.
    RestartInto(Binary),
    /// Shutdown was asked for (SIGTERM).
    Shutdown,
    /// A request failed in a way the core cannot be told about (a bug, not a condition).
    Fatal(FatalError),
}

/// The adapters' view of the world the driver needs.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub data: DataDir,
    /// `machine-0`.
    pub tag: String,
    pub controller: Option<ControllerId>,
    /// Where the environment provider's capabilities come from (`--capabilities`,
    /// `--capabilities-file`, or this host interrogated).
    pub capabilities: CapabilitySource,
    /// Which metadata the catalogue lookups accept, as `agent.conf` pins it.
    pub metadata_trust: Arc<MetadataTrust>,
}

/// The handles the rest of the agent keeps: gate and status to read, inputs to send.
#[derive(Clone, Debug)]
pub struct Handles {
    pub gate: watch::Receiver<GateView>,
    pub status: watch::Receiver<AgentStatus>,
    /// Operator inputs (abort, upgrade requests, agent-version changes).
    pub inputs: mpsc::UnboundedSender<Input>,
}

/// The driver of one process's lifecycle.
pub struct Driver {
    core: Lifecycle,
    config: DriverConfig,
    registry: Arc<StepRegistry>,
    store: Arc<dyn Store>,
    started: Instant,
    inputs_tx: mpsc::UnboundedSender<Input>,
    inputs: mpsc::UnboundedReceiver<Input>,
    fatal_tx: mpsc::UnboundedSender<FatalError>,
    fatal: mpsc::UnboundedReceiver<FatalError>,
    gate: watch::Sender<GateView>,
    status: watch::Sender<AgentStatus>,
    notifier: Notifier,
    /// Cancels the record watch's thread.
    watch_cancel: Option<Arc<AtomicBool>>,
    /// Requests running (each completes by sending an input).
    tasks: tokio::task::JoinSet<()>,
    /// Set when the driver ends: operations being retried give up.
    stopping: Arc<AtomicBool>,
    /// An opening gate waits for the `agent.conf` writes asked for before it.
    hold: GateHold,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Driver {
    pub fn new(
        core: Lifecycle,
        config: DriverConfig,
        registry: Arc<StepRegistry>,
        store: Arc<dyn Store>,
        notifier: Notifier,
    ) -> (Driver, Handles) {
        let (inputs_tx, inputs) = mpsc::unbounded_channel();
        let (fatal_tx, fatal) = mpsc::unbounded_channel();
        let (gate, gate_rx) = watch::channel(*core.gate());
        let (status, status_rx) = watch::channel(AgentStatus::default());
        let handles = Handles {
            gate: gate_rx,
            status: status_rx,
            inputs: inputs_tx.clone(),
        };
        let driver = Driver {
            core,
            config,
            registry,
            store,
            started: Instant::now(),
            inputs_tx,
            inputs,
            fatal_tx,
            fatal,
            gate,
            status,
            notifier,
            watch_cancel: None,
            tasks: tokio::task::JoinSet::new(),
            stopping: Arc::new(AtomicBool::new(false)),
            hold: GateHold::default(),
        };
        (driver, handles)
    }

    /// The core's clock: milliseconds since this process started (monotonic).
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.started.elapsed().as_millis() as u64)
    }

    fn instant_of(&self, at: Timestamp) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.started + Duration::from_millis(at.as_millis()))
    }

    /// Runs the lifecycle from `Start` until it asks to restart, or `shutdown` fires.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Exit {
        let capabilities = &self.config.capabilities;
        if matches!(capabilities, CapabilitySource::Override(_)) {
            tracing::warn!(target: "lockstep::agent", "capabilities: {}", capabilities.describe());
        } else {
            tracing::info!(target: "lockstep::agent", "capabilities: {}", capabilities.describe());
        }
        self.watch_model();
        // The supervisor hears the phase from the start (`systemctl status` shows it while
        // the agent boots), not only from its first change: a restart that goes straight to
        // Ready has no other phase on the way.
        self.notifier.status(self.core.phase().as_str());
        let now = self.now();
        self.core.handle(now, Input::Start);
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(exit) = self.drain() {
                self.stop().await;
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
                Some(reason) = self.fatal.recv() => {
                    self.stop().await;
                    return Exit::Fatal(reason);
                }
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        self.stop().await;
                        return Exit::Shutdown;
                    }
                }
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(error) = joined && error.is_panic() {
                        self.stop().await;
                        return Exit::Fatal(FatalError::Panicked(error));
                    }
                }
            }
        }
    }

    /// Stops the record watch and waits for requests in flight, so nothing of this process
    /// touches the store after it returns.
    async fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(cancel) = self.watch_cancel.take() {
            cancel.store(true, Ordering::SeqCst);
        }
        while self.tasks.join_next().await.is_some() {}
    }

    /// Drains every output of the last input. `Some` when the process must end.
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
                Output::Status(report) => {
                    if !report.message.is_empty() {
                        tracing::info!(
                            target: "lockstep::agent",
                            phase = report.phase.as_str(),
                            done = report.progress.done,
                            total = report.progress.total,
                            "{}", report.message
                        );
                    }
                    self.notifier.status(&crate::notify::status_line(&report));
                    let upgrade_available = self.core.upgrade_available();
                    let failure = matches!(report.phase, Phase::StepsFailed | Phase::UpgradeFailed)
                        && !report.message.is_empty();
                    self.status.send_modify(|status| {
                        if failure {
                            status.last_failure = Some(report.message.clone());
                        }
                        status.report = Some(report);
                        status.upgrade_available = upgrade_available;
                    });
                }
                Output::Request { id, request } => {
                    tracing::debug!(
                        target: "lockstep::agent",
                        %id,
                        request = request_name(&request),
                        "request"
                    );
                    if let Request::RestartInto(binary) = request {
                        exit = Some(self.switch(binary));
                    } else if exit.is_none() {
                        self.execute(id, request);
                    }
                }
                // `Output` is `#[non_exhaustive]`; this driver is built with the core it
                // drives, so a new output is met here by its tests first.
                other => unreachable!("an output this driver does not handle: {other:?}"),
            }
        }
        if let Some(view) = self.hold.release() {
            self.publish_gate(view);
        }
        exit
    }

    /// Publishes a gate the core set, once [`GateHold`] lets it: to the API and to the
    /// supervisor (`READY=1`, which `lockstep bootstrap` waits for before it says the
    /// controller is available).
    fn publish_gate(&mut self, view: GateView) {
        tracing::info!(
            target: "lockstep::agent",
            phase = view.phase.as_str(),
            limited = view.is_limited(),
            "gate"
        );
        self.gate.send_replace(view);
        if view.phase == Phase::Ready {
            self.notifier.ready();
        }
    }

    /// `RestartInto`: point `tools/<tag>` at the binary; the caller restarts the process.
    fn switch(&mut self, binary: Binary) -> Exit {
        match self.config.data.switch_to(&self.config.tag, &binary) {
            Ok(()) => {
                tracing::info!(target: "lockstep::agent", %binary, "switched; restarting");
                self.notifier
                    .reloading(&format!("restarting into {binary}"));
                Exit::RestartInto(binary)
            }
            Err(error) => Exit::Fatal(FatalError::Switch { binary, error }),
        }
    }

    fn execute(&mut self, id: RequestId, request: Request) {
        let store = Arc::clone(&self.store);
        let inputs = self.inputs_tx.clone();
        let config = self.config.clone();
        let running = self.core.config().running.clone();
        match request {
            Request::PersistSnapshot(snapshot) => {
                let data = config.data.clone();
                #[cfg(feature = "failpoints")]
                let pause = crate::daemon::failpoints::persist_pause();
                self.blocking(id, "persist agent.conf", move || {
                    #[cfg(feature = "failpoints")]
                    if let Some(pause) = pause {
                        tracing::warn!(target: "lockstep::agent", pause_ms = pause.as_millis() as u64, "failpoint: pausing before the snapshot is written");
                        std::thread::sleep(pause);
                    }
                    let mut conf = data.read_agent_conf()?.ok_or_else(|| {
                        OperationError::AgentConfVanished {
                            path: data.agent_conf_path(),
                        }
                    })?;
                    conf.set_snapshot(snapshot.clone());
                    data.write_agent_conf(&conf)?;
                    Ok(Input::Done { id })
                });
            }
            Request::LoadModel => {
                self.blocking(id, "load the model", move || {
                    let model = store.load_model()?.ok_or(OperationError::NoModel)?;
                    Ok(Input::ModelLoaded {
                        id,
                        model: ModelView {
                            agent_version: model.agent_version,
                            policy: model.policy,
                            stream: model.agent_stream,
                            controllers: model.controllers,
                        },
                    })
                });
            }
            Request::RefreshCapabilities => {
                // The provider is asked afresh each time: the host (or the file) as it is now.
                self.blocking(id, "refresh capabilities", move || {
                    let provider = config.capabilities.provider();
                    let refreshed = lockstep_store::seed004::refresh_capabilities(
                        &*store,
                        &*provider,
                        running.number,
                    )
                    .map_err(OperationError::Refresh)?;
                    tracing::info!(
                        target: "lockstep::agent",
                        capabilities = %crate::daemon::capabilities::list(&refreshed.report.capabilities),
                        by = %running.number,
                        reason = %refreshed.report.reason,
                        "capabilities reported"
                    );
                    Ok(Input::Done { id })
                });
            }
            Request::WatchRecord { after } => self.watch_record(after),
            Request::CreateRecord(record) => {
                self.blocking_fatal(id, "create the upgrade-info record", move || {
                    store
                        .create_record(record)
                        .map(|write| Input::RecordWritten { id, write })
                });
            }
            Request::UpdateRecord {
                expected,
                record,
                fence,
            } => {
                self.blocking_fatal(id, "update the upgrade-info record", move || {
                    store
                        .update_record(expected, record, fence)
                        .map(|write| Input::RecordWritten { id, write })
                });
            }
            Request::AcquireLease => {
                let holder = self.controller();
                let ttl = self.core.config().limits.lease_ttl();
                self.blocking(id, "acquire the lease", move || {
                    let lease = store.acquire_lease(holder, ttl)?;
                    Ok(Input::LeaseAnswered { id, lease })
                });
            }
            Request::KeepAliveLease(token) => {
                // Unlike other requests, a keep-alive is not retried until it gets through:
                // a store error answers "not held" at once. One that never returns needs no
                // bound here: the core gives the lease up at its own deadline
                // (`Limits::lease_keepalive_deadline`) and ignores this answer if it comes.
                let holder = self.controller();
                self.tasks.spawn_blocking(move || {
                    let lease = match store.keep_alive_lease(holder, token) {
                        Ok(lease) => lease,
                        Err(error) => {
                            tracing::warn!(target: "lockstep::agent", %error, "lease keep-alive failed");
                            None
                        }
                    };
                    let _ = inputs.send(Input::LeaseAnswered { id, lease });
                });
            }
            Request::ReleaseLease(token) => {
                let holder = self.controller();
                self.tasks.spawn_blocking(move || {
                    if let Err(error) = store.release_lease(holder, token) {
                        // Not awaited: an unreleased lease expires by itself.
                        tracing::warn!(target: "lockstep::agent", %error, "lease release failed");
                    }
                });
            }
            Request::RunStep { step, key, fence } => {
                let kind = self.registry.step(step).kind;
                let description = self.registry.step(step).description;
                tracing::info!(target: "lockstep::agent", %key, kind = kind.as_str(), "{description}");
                match kind {
                    StepKind::Database => {
                        self.blocking(id, "run a database step", move || {
                            let outcome =
                                step_runner::run_database_step(&*store, &key, fence, &running)?;
                            Ok(Input::StepFinished { id, outcome })
                        });
                    }
                    StepKind::Host => {
                        let context = HostContext {
                            data: config.data.clone(),
                            tag: config.tag.clone(),
                            running: running.clone(),
                        };
                        self.tasks.spawn_blocking(move || {
                            let outcome = match step_runner::run_host_step(&context, &key) {
                                Ok(()) => StepOutcome::Applied,
                                Err(error) => StepOutcome::Failed(error.to_string()),
                            };
                            let _ = inputs.send(Input::StepFinished { id, outcome });
                        });
                    }
                }
            }
            Request::LookupCatalogue { streams } => {
                let status = self.status.clone();
                self.tasks.spawn(async move {
                    let result =
                        look_up(&*store, &config.data, &config.metadata_trust, streams).await;
                    if let Err(error) = &result {
                        tracing::warn!(target: "lockstep::agent", %error, "catalogue lookup failed");
                        // Metadata that does not verify is an attack or a misconfigured
                        // mirror, not a passing outage: kept for `Upgrade.Status` until
                        // something else goes wrong.
                        if error.is_refused_as_unverified() {
                            let failure = format!("agent binary metadata refused: {error}");
                            status.send_modify(|status| status.last_failure = Some(failure));
                        }
                    }
                    // The core's input carries the reason as text (it shows it in status).
                    let result = result.map_err(|error| error.to_string());
                    let _ = inputs.send(Input::CatalogueFound { id, result });
                });
            }
            Request::DesiredBinary => {
                // Only agents other than controllers ask; this process is a controller.
                tracing::error!(target: "lockstep::agent", %id, "DesiredBinary asked of a controller");
            }
            Request::SetAgentVersion(version) => {
                // The store checks the core's rule inside its write and answers a refusal
                // with what it saw; the core decides what that means. Only I/O failures are
                // retried here.
                self.blocking(id, "set agent-version", move || {
                    let check = lockstep_store::AgentVersionCheck::LIFECYCLE;
                    match store.set_agent_version(version, &check)? {
                        lockstep_store::AgentVersionSet::Set { .. } => Ok(Input::Done { id }),
                        lockstep_store::AgentVersionSet::Refused {
                            agent_version,
                            view,
                            ..
                        } => Ok(Input::AgentVersionRefused {
                            id,
                            agent_version,
                            view,
                        }),
                    }
                });
            }
            Request::ReportUpgradeAvailable(version) => {
                // `Upgrade.Status` shows it at once: a check made from Ready (the periodic
                // one, or the lookup a restarted controller owes) changes no phase, so no
                // status report follows it.
                self.status
                    .send_modify(|status| status.upgrade_available = version);
                self.blocking(id, "report upgrade-available", move || {
                    store.report_upgrade_available(version)?;
                    Ok(Input::Done { id })
                });
            }
            Request::StageBinary(plan) => {
                let status = self.status.clone();
                self.tasks.spawn(async move {
                    let result = stage(
                        &*store,
                        &config.data,
                        &config.metadata_trust,
                        &plan,
                        &status,
                    )
                    .await;
                    status.send_modify(|status| status.download = None);
                    if let Err(error) = &result {
                        tracing::warn!(target: "lockstep::agent", binary = %plan.binary, %error, "staging failed");
                    }
                    let result = result.map_err(|error| error.to_string());
                    let _ = inputs.send(Input::Staged { id, result });
                });
            }
            Request::RestartInto(_) => unreachable!("handled by drain"),
            // `Request` is `#[non_exhaustive]`: unanswered, the core would wait forever.
            other => unreachable!("a request this driver does not execute: {other:?}"),
        }
    }

    fn controller(&self) -> ControllerId {
        self.config
            .controller
            .expect("lease requests come only from controllers")
    }

    /// Runs a store or file operation on the blocking pool, retrying it with capped backoff
    /// while it fails (see the module documentation), and sends its completion.
    fn blocking(
        &mut self,
        id: RequestId,
        what: &'static str,
        operation: impl Fn() -> Result<Input, Failed> + Send + Sync + 'static,
    ) {
        let inputs = self.inputs_tx.clone();
        let fatal = self.fatal_tx.clone();
        let status = self.status.clone();
        let stopping = Arc::clone(&self.stopping);
        self.tasks.spawn(async move {
            let operation = Arc::new(operation);
            let mut delay = Duration::from_millis(100);
            while !stopping.load(Ordering::SeqCst) {
                let attempt = Arc::clone(&operation);
                let result = tokio::task::spawn_blocking(move || attempt())
                    .await
                    .unwrap_or_else(|error| Err(Failed::Retry(OperationError::Panicked(error))));
                match result {
                    Ok(input) => {
                        let _ = inputs.send(input);
                        return;
                    }
                    Err(Failed::Fatal(error)) => {
                        // The driver ends on this message; the core re-plans after restart.
                        let _ = fatal.send(FatalError::Operation { what, error });
                        return;
                    }
                    Err(Failed::Retry(error)) => {
                        tracing::warn!(
                            target: "lockstep::agent",
                            %id,
                            %error,
                            retry_in_ms = delay.as_millis() as u64,
                            "cannot {what}; retrying"
                        );
                        status.send_modify(|status| {
                            if let Some(report) = &mut status.report {
                                report.message = format!("cannot {what} (retrying): {error}");
                            }
                        });
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
    }

    /// A record write: a store error other than I/O would mean the core asked for an
    /// invalid transition, which no retry fixes: the process ends and restarts (the core
    /// re-plans from what is stored).
    fn blocking_fatal(
        &mut self,
        id: RequestId,
        what: &'static str,
        operation: impl Fn() -> Result<Input, lockstep_store::StoreError> + Send + Sync + 'static,
    ) {
        self.blocking(id, what, move || match operation() {
            Ok(input) => Ok(input),
            Err(error @ StoreError::InvalidTransition { .. }) => {
                Err(Failed::Fatal(OperationError::InvalidTransition(error)))
            }
            Err(error) => Err(error.into()),
        });
    }

    /// Watches the model's agent-version, as Juju's upgrader does: every controller, not
    /// only the one an operator asked, hears that the model moved to a new version. Each
    /// change read (from the version this process runs) is sent once as
    /// `AgentVersionChanged`, in whatever phase the core is: the core keeps the latest and
    /// acts on it in Ready.
    fn watch_model(&mut self) {
        let store = Arc::clone(&self.store);
        let inputs = self.inputs_tx.clone();
        let stopping = Arc::clone(&self.stopping);
        let mut sent = self.core.config().running.number;
        std::thread::Builder::new()
            .name("model-watch".into())
            .spawn(move || {
                let mut seen = None;
                while !stopping.load(Ordering::SeqCst) {
                    // The model is read again only when the store moved on since the last
                    // read (a timeout of `wait_for_change` wakes this loop too).
                    let read = store.revision().and_then(|revision| {
                        if seen == Some(revision) {
                            return Ok((revision, None));
                        }
                        Ok((revision, store.load_model()?))
                    });
                    match read {
                        Ok((revision, model)) => {
                            seen = Some(revision);
                            if let Some(model) = model
                                && model.agent_version != sent
                            {
                                sent = model.agent_version;
                                tracing::info!(target: "lockstep::agent", version = %sent, "the model's agent-version changed");
                                if inputs.send(Input::AgentVersionChanged(sent)).is_err() {
                                    return;
                                }
                            }
                        }
                        Err(error) => {
                            tracing::warn!(target: "lockstep::agent", %error, "model watch read failed");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                    store.wait_for_change(
                        seen.unwrap_or(lockstep_core::lifecycle::Revision(0)),
                        Duration::from_secs(1),
                    );
                }
            })
            .expect("a thread can be started");
    }

    /// Subscribes to the upgrade-info record: the current view first, then one per change.
    fn watch_record(&mut self, after: lockstep_core::lifecycle::Revision) {
        if let Some(previous) = self.watch_cancel.take() {
            previous.store(true, Ordering::SeqCst);
        }
        let cancel = Arc::new(AtomicBool::new(false));
        self.watch_cancel = Some(Arc::clone(&cancel));
        let store = Arc::clone(&self.store);
        let inputs = self.inputs_tx.clone();
        std::thread::Builder::new()
            .name("record-watch".into())
            .spawn(move || {
                let mut delivered = None;
                let mut seen = after;
                while !cancel.load(Ordering::SeqCst) {
                    match store.record_view() {
                        Ok(view) => {
                            if delivered != Some(view) {
                                delivered = Some(view);
                                if inputs.send(Input::RecordChanged(view)).is_err() {
                                    return;
                                }
                            }
                            seen = seen.max(store.revision().unwrap_or(seen));
                        }
                        Err(error) => {
                            tracing::warn!(target: "lockstep::agent", %error, "record watch read failed");
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                    store.wait_for_change(seen, Duration::from_millis(250));
                }
            })
            .expect("a thread can be started");
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Why the catalogue at the model's metadata source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the store holds no model: bootstrap did not finish; bootstrap again")]
    NoModel,
    #[error(
        "the model has no agent-metadata-url: set one (ModelConfig.ModelSet agent-metadata-url, \
         or bootstrap with --metadata-source)"
    )]
    NoMetadataUrl,
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
        /// What the operator chose at bootstrap, when the metadata's signature is the
        /// problem (see [`MetadataTrust::hint`]).
        hint: String,
    },
    #[error("looking up agent binaries at {url}: refused: {problem}")]
    Untrusted { url: String, problem: String },
}

impl CatalogueError {
    /// True when the metadata was refused for its signature (unsigned, altered, signed by
    /// another key) or the pinned keys could not be used: not an outage, a refusal.
    pub fn is_refused_as_unverified(&self) -> bool {
        match self {
            CatalogueError::Untrusted { .. } => true,
            CatalogueError::Lookup { error, .. } => {
                matches!(&**error, LookupError::Metadata(error) if error.field == "(signature)")
            }
            _ => false,
        }
    }
}

/// Why a binary could not be staged (downloaded, verified, unpacked into `tools/`).
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("{} holds no installed binary", dir.display())]
    NotInstalled { dir: PathBuf },
    #[error(
        "{} holds sha256 {installed_sha256} ({installed_size_bytes} bytes), expected \
         {expected_sha256} ({expected_size_bytes} bytes)",
        dir.display()
    )]
    Mismatch {
        dir: PathBuf,
        installed_sha256: Sha256,
        installed_size_bytes: u64,
        expected_sha256: Sha256,
        expected_size_bytes: u64,
    },
    #[error("a controller does not fetch binaries from a controller")]
    FromController,
    #[error(transparent)]
    Catalogue(#[from] CatalogueError),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error("installing {binary} panicked: {error}")]
    Panicked {
        binary: Binary,
        #[source]
        error: tokio::task::JoinError,
    },
}

/// The model's `agent-metadata-url`, or `None` when the controller has no stream source
/// (a controller bootstrapped from its local binary).
pub(crate) fn metadata_url(store: &dyn Store) -> Result<Option<String>, CatalogueError> {
    let model = store.load_model()?.ok_or(CatalogueError::NoModel)?;
    Ok(model.agent_metadata_url)
}

fn open_source(url: &str, trust: &MetadataTrust) -> Result<MetadataSource, CatalogueError> {
    MetadataSource::open(url, trust).map_err(|error| CatalogueError::Source {
        url: url.to_owned(),
        error,
    })
}

/// `LookupCatalogue`: the catalogue at the model's metadata source, guarded by the
/// high-water mark. A controller without a source has an empty catalogue.
///
/// The metadata must verify as `trust` says ([`MetadataTrust`], pinned in `agent.conf` at
/// bootstrap): the url comes from the shared store, the keys never do.
pub async fn look_up(
    store: &dyn Store,
    data: &DataDir,
    trust: &MetadataTrust,
    streams: &'static [Stream],
) -> Result<Catalogue, CatalogueError> {
    let Some(url) = metadata_url(store)? else {
        return Ok(Catalogue::default());
    };
    look_up_at(&url, data, trust, streams).await
}

/// `LookupCatalogue` at `url` (the model's `agent-metadata-url`, read by the caller).
pub async fn look_up_at(
    url: &str,
    data: &DataDir,
    trust: &MetadataTrust,
    streams: &'static [Stream],
) -> Result<Catalogue, CatalogueError> {
    let url = url.to_owned();
    let config = trust
        .lookup_config(&url)
        .map_err(|problem| CatalogueError::Untrusted {
            url: url.clone(),
            problem,
        })?;
    let source = open_source(&url, trust)?;
    let mark = lockstep_streams::HighWaterMarkFile::new(data.streams_mark_path());
    let lookup = source
        .look_up(&mark, &config, unix_now())
        .await
        .map_err(|error| CatalogueError::Lookup {
            url: url.clone(),
            hint: trust.hint(&error),
            error: Box::new(error),
        })?;
    for rejected in &lookup.rejected {
        tracing::warn!(target: "lockstep::agent", %rejected, "metadata item rejected");
    }
    tracing::debug!(
        target: "lockstep::agent",
        entries = lookup.catalogue.entries().len(),
        ?streams,
        "catalogue"
    );
    Ok(lookup.catalogue)
}

/// `StageBinary`: download (or find) the binary, verify size and sha256, unpack it into
/// `tools/<binary>/`.
async fn stage(
    store: &dyn Store,
    data: &DataDir,
    trust: &MetadataTrust,
    plan: &lockstep_core::lifecycle::StagePlan,
    status: &watch::Sender<AgentStatus>,
) -> Result<(), StageError> {
    match &plan.source {
        StageSource::Local => {
            // The operator's file was installed at bootstrap; check it is what was recorded.
            let installed = data.read_downloaded_tools(&plan.binary)?.ok_or_else(|| {
                StageError::NotInstalled {
                    dir: data.binary_dir(&plan.binary),
                }
            })?;
            if installed.sha256 != plan.sha256 || installed.size_bytes != plan.size_bytes {
                return Err(StageError::Mismatch {
                    dir: data.binary_dir(&plan.binary),
                    installed_sha256: installed.sha256,
                    installed_size_bytes: installed.size_bytes,
                    expected_sha256: plan.sha256,
                    expected_size_bytes: plan.size_bytes,
                });
            }
            Ok(())
        }
        StageSource::Controller => Err(StageError::FromController),
        StageSource::Catalogue { path } => {
            if let Ok(Some(installed)) = data.read_downloaded_tools(&plan.binary)
                && installed.sha256 == plan.sha256
                && data.binary_path(&plan.binary).is_file()
            {
                return Ok(());
            }
            let url = metadata_url(store)?.ok_or(CatalogueError::NoMetadataUrl)?;
            let source = open_source(&url, trust)?;
            let entry = CatalogueEntry {
                binary: plan.binary.clone(),
                stream: Stream::Released,
                size_bytes: plan.size_bytes,
                sha256: plan.sha256,
                path: path.clone(),
            };
            let cache = data.tools_cache_dir();
            std::fs::create_dir_all(&cache)
                .map_err(DataDirError::io(&cache, "create the directory"))?;
            let tarball = cache.join(format!("juju-{}.tgz", plan.binary));
            let mut progress = |progress: lockstep_streams::DownloadProgress| {
                status.send_modify(|status| {
                    status.download = Some((progress.received_bytes, progress.total_bytes));
                });
            };
            source.download(&entry, &tarball, &mut progress).await?;
            let meta = DownloadedTools {
                version: plan.binary.clone(),
                url: format!("{}/{}", url.trim_end_matches('/'), path),
                sha256: plan.sha256,
                size_bytes: plan.size_bytes,
                download_rate: None,
            };
            let data = data.clone();
            let binary = plan.binary.clone();
            tokio::task::spawn_blocking(move || data.install_tarball(&binary, &tarball, &meta))
                .await
                .map_err(|error| StageError::Panicked {
                    binary: plan.binary.clone(),
                    error,
                })??;
            Ok(())
        }
    }
}
