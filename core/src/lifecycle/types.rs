//! The lifecycle's vocabulary: what goes in, what comes out, what is persisted.

use std::fmt;

use crate::lifecycle::record::{ControllerId, ControllerSet, LeaseToken, RecordView};
use crate::phase::Phase;
use crate::policy::{Catalogue, Sha256, Stream, UpgradePolicy};
use crate::role::Roles;
pub use crate::steps::StepIndex;
use crate::steps::StepKey;
use crate::time::Millis;
use crate::version::{Binary, Version};

/// Identifies a request the core made; its completion carries the same id.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct RequestId(pub u64);

/// Every bound the lifecycle keeps, with Juju's values as defaults.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Limits {
    /// Attempts at a failing step batch before holding in StepsFailed (Juju: 5).
    pub step_attempts_max: u8,
    /// Delay between step attempts (Juju: 2 minutes).
    pub step_retry_delay: Millis,
    /// How long controllers wait for each other to register (Juju: 15 minutes).
    pub controllers_wait: Millis,
    /// Interval between lease keep-alives. The lease's TTL is
    /// [`Limits::LEASE_TTL_KEEPALIVES`] times this ([`Limits::lease_ttl`]), and a keep-alive
    /// unanswered by [`Limits::lease_keepalive_deadline`] gives the lease up.
    pub lease_keepalive_interval: Millis,
    /// Delay before trying again for a lease someone else holds.
    pub lease_retry_delay: Millis,
    /// Attempts at a catalogue lookup before giving up on this check.
    pub catalogue_attempts_max: u8,
    /// Delay between catalogue lookups.
    pub catalogue_retry_delay: Millis,
    /// Interval of the background check for newer patches while Ready (Juju: 6 hours).
    pub catalogue_check_interval: Millis,
    /// Attempts at staging (download and verify) a binary before the upgrade fails.
    pub stage_attempts_max: u8,
    /// Delay between stagings.
    pub stage_retry_delay: Millis,
    /// Boots a new binary may take without reaching Ready before the agent falls back.
    pub trial_boots_max: u8,
    /// How long a new binary may take from start to Ready before the agent falls back.
    pub trial_ready_timeout: Millis,
    /// The retry-after hint given to clients the gate turns away.
    pub retry_after: Millis,
}

impl Limits {
    /// Keep-alive intervals a coordinator lease lives: its TTL is this many times
    /// [`Limits::lease_keepalive_interval`] (etcd's election recipe keeps a lease alive at a
    /// third of its TTL or faster). A holder that misses a few keep-alives (a paused
    /// process, a slow store) keeps its lease; one that is gone loses it within the TTL.
    pub const LEASE_TTL_KEEPALIVES: u64 = 5;

    /// The TTL a controller asks the store for when it takes the coordinator lease
    /// (`Request::AcquireLease`): [`Limits::LEASE_TTL_KEEPALIVES`] keep-alive intervals.
    pub fn lease_ttl(&self) -> Millis {
        const { assert!(Limits::LEASE_TTL_KEEPALIVES >= 2) };
        let interval = self.lease_keepalive_interval;
        let ttl = Millis(interval.0.saturating_mul(Limits::LEASE_TTL_KEEPALIVES));
        assert!(
            ttl.0 > interval.0,
            "the lease's TTL {ttl} outlasts a keep-alive interval {interval}"
        );
        ttl
    }

    /// How long a `KeepAliveLease` may go unanswered before the core treats the lease as
    /// lost, counted from when it was sent: the TTL less one interval. The lease was last
    /// extended when the previous keep-alive (or the acquire) was answered, one interval
    /// before this keep-alive was sent; so once this much more time has passed unanswered,
    /// the lease may have expired, and a coordinator stops acting on it at once (the
    /// store's fence refuses its writes anyway; this spares them).
    pub fn lease_keepalive_deadline(&self) -> Millis {
        let deadline = Millis(self.lease_ttl().0 - self.lease_keepalive_interval.0);
        assert!(deadline.0 > 0 && deadline.0 < self.lease_ttl().0);
        deadline
    }

    /// Refuses limits that cannot describe a working agent, naming the limit.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_keepalive_interval.0 == 0 {
            return Err("lease_keepalive_interval must be at least 1 ms".to_owned());
        }
        if self.lease_keepalive_interval.0 > u64::MAX / Limits::LEASE_TTL_KEEPALIVES {
            return Err(format!(
                "lease_keepalive_interval {} is too long for a lease TTL of {} intervals",
                self.lease_keepalive_interval,
                Limits::LEASE_TTL_KEEPALIVES
            ));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            step_attempts_max: 5,
            step_retry_delay: Millis(2 * 60 * 1000),
            controllers_wait: Millis(15 * 60 * 1000),
            lease_keepalive_interval: Millis(1000),
            lease_retry_delay: Millis(1000),
            catalogue_attempts_max: 3,
            catalogue_retry_delay: Millis(5000),
            catalogue_check_interval: Millis(6 * 60 * 60 * 1000),
            stage_attempts_max: 3,
            stage_retry_delay: Millis(5000),
            trial_boots_max: 2,
            trial_ready_timeout: Millis(10 * 60 * 1000),
            retry_after: Millis(1000),
        }
    }
}

/// What the embedder tells the core about this agent; fixed for the life of the process.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Config {
    /// Set for a controller: its index among the model's controllers.
    pub controller: Option<ControllerId>,
    /// This machine's roles; a controller has [`crate::Role::Controller`].
    pub roles: Roles,
    /// The binary this process runs.
    pub running: Binary,
    /// Every bound the lifecycle keeps.
    pub limits: Limits,
}

/// A new binary on trial: switched to, not yet proven to reach Ready.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Trial {
    /// The binary on trial.
    pub binary: Binary,
    /// Boots of that binary so far.
    pub boots: u8,
    /// Set (and persisted) before this agent runs or observes database steps of the new
    /// version (a controller: once it saw every controller ready, or the store said they
    /// may have run): from then on, falling back to the previous binary is unsafe (Juju's
    /// lesson). A crash can lose this write, so a controller also reads the upgrade-info
    /// record before it falls back.
    pub past_database_steps: bool,
    /// Times the previous binary found the switch persisted but the new binary never
    /// booted (a crash between persisting the switch and restarting, or a binary that dies
    /// before it can count a boot) and restarted into it again. Bounded by
    /// [`Limits::trial_boots_max`]; then the switch is given up.
    #[serde(default)]
    pub switches: u8,
}

/// The agent's own persisted state (its part of `agent.conf`), written atomically by the
/// driver whenever the core asks. Restarting from any persisted snapshot resumes correctly.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Snapshot {
    /// Format of this snapshot; a newer one is refused by [`Snapshot::check_format`].
    pub format: u32,
    /// Juju's `upgradedToVersion`: written only after every planned step is checkpointed.
    pub upgraded_to_version: Version,
    /// Host steps of the current upgrade already run (at least once) on this machine.
    pub host_checkpoints: Vec<StepKey>,
    /// The binary that ran before the current one, kept for falling back.
    pub previous: Option<Binary>,
    /// A switch to a new binary not yet proven.
    pub trial: Option<Trial>,
    /// Set once the agent first reached Ready. Until then every boot is part of the
    /// bootstrap: capabilities are discovered and `--auto-upgrade` applies, so a crash
    /// during bootstrap cannot turn it into an ordinary restart.
    #[serde(default)]
    pub bootstrap_complete: bool,
}

impl Snapshot {
    /// The format this binary writes, and the newest it reads.
    pub const FORMAT: u32 = 1;

    /// The snapshot of a freshly bootstrapped agent: it records the *binary's* version as
    /// upgraded-to, not the client's (Juju's historic bug ran steps for nothing).
    pub fn bootstrapped(running: &Binary) -> Snapshot {
        Snapshot {
            format: Snapshot::FORMAT,
            upgraded_to_version: running.number,
            host_checkpoints: Vec::new(),
            previous: None,
            trial: None,
            bootstrap_complete: false,
        }
    }

    /// Refuses a snapshot written by a newer lockstep, naming both formats.
    pub fn check_format(&self) -> Result<(), String> {
        if self.format > Snapshot::FORMAT {
            return Err(format!(
                "agent snapshot format {} is newer than this binary understands ({}); \
                 run a newer lockstep",
                self.format,
                Snapshot::FORMAT
            ));
        }
        Ok(())
    }
}

/// What the shared store says about the model, read at start.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ModelView {
    /// The model's `agent-version`: the version its agents should run.
    pub agent_version: Version,
    /// The model's upgrade policy.
    pub policy: UpgradePolicy,
    /// The model's `agent-stream`, when set explicitly.
    pub stream: Option<Stream>,
    /// The provisioned controllers.
    pub controllers: ControllerSet,
}

/// A binary the core asks the driver to stage: download (or copy), verify size and sha256,
/// unpack, ready to switch to.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct StagePlan {
    /// The binary to stage.
    pub binary: Binary,
    /// Its tarball's size, verified while it is read.
    pub size_bytes: u64,
    /// Its tarball's digest, verified before it is unpacked.
    pub sha256: Sha256,
    /// Where it comes from.
    pub source: StageSource,
}

/// Where a staged binary comes from.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum StageSource {
    /// A catalogue item, at `path`.
    Catalogue {
        /// The item's path, relative to the metadata source.
        path: String,
    },
    /// The operator's own file (`--build-agent`).
    Local,
    /// The controller's tools endpoint (agents other than controllers).
    Controller,
}

/// How a step attempt ended.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum StepOutcome {
    /// The step ran and its checkpoint is recorded.
    Applied,
    /// Its checkpoint already existed: nothing was done (exactly-once).
    AlreadyApplied,
    /// The coordinator's lease is no longer current: nothing was done.
    Fenced,
    /// The step failed; nothing of it was committed.
    Failed(String),
}

/// How a write of the upgrade-info record ended.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RecordWrite {
    /// Written; the view after the write.
    Written(RecordView),
    /// The revision (or absence) expected did not hold; the current view.
    Conflict(RecordView),
    /// A fenced write whose lease is no longer current.
    Fenced,
}

/// An operator's action on a held or running upgrade.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OperatorAction {
    /// Run the held steps again (`upgrade-controller --reset-previous-upgrade`, or a restart).
    Retry,
    /// Give up the upgrade (`abort-upgrade`, `Client.AbortCurrentUpgrade`).
    Abort,
}

/// Everything the driver feeds the core. Completions echo the [`RequestId`] of the request.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Input {
    /// The process started: begin Bootstrapping.
    Start,
    /// A request without a result completed (persist, refresh capabilities, report, ...).
    Done {
        /// The request's id.
        id: RequestId,
    },
    /// `LoadModel` answered.
    ModelLoaded {
        /// The request's id.
        id: RequestId,
        /// The model as read.
        model: ModelView,
    },
    /// The upgrade-info record as it now is: the first delivery of a watch (read after
    /// subscribing, so nothing is missed), then one per change.
    RecordChanged(RecordView),
    /// `CreateRecord` or `UpdateRecord` answered.
    RecordWritten {
        /// The request's id.
        id: RequestId,
        /// How the write ended.
        write: RecordWrite,
    },
    /// A lease request answered: `Some` while held, `None` when busy or lost.
    LeaseAnswered {
        /// The request's id (`AcquireLease` or `KeepAliveLease`).
        id: RequestId,
        /// The lease's fencing token while this controller holds it.
        lease: Option<LeaseToken>,
    },
    /// `RunStep` answered.
    StepFinished {
        /// The request's id.
        id: RequestId,
        /// How the step attempt ended.
        outcome: StepOutcome,
    },
    /// `LookupCatalogue` answered.
    CatalogueFound {
        /// The request's id.
        id: RequestId,
        /// The agent binaries found, or why the lookup failed.
        result: Result<Catalogue, String>,
    },
    /// An agent other than a controller learnt its desired binary from the controller.
    DesiredBinary {
        /// The request's id.
        id: RequestId,
        /// The binary its controller wants it to run, and where to fetch it.
        plan: StagePlan,
    },
    /// `StageBinary` answered.
    Staged {
        /// The request's id.
        id: RequestId,
        /// Staged and verified, or why not.
        result: Result<(), String>,
    },
    /// The store refused `SetAgentVersion` (Juju's rule: no `agent-version` change while an
    /// upgrade-info record is current), with what it saw in the transaction that refused:
    /// the model's `agent-version` and the record. The driver only translates the store's
    /// answer; the core decides: a refusal whose `agent_version` is the value asked for is
    /// a write already done (the model holds it), anything else is a refusal, and the core
    /// decides what to do about the record (archive it as aborted when no controller can
    /// ever proceed with it, or wait). A driver must not retry the write by itself.
    AgentVersionRefused {
        /// The request's id.
        id: RequestId,
        /// The model's `agent-version` when the store refused.
        agent_version: Version,
        /// The upgrade-info record when the store refused.
        view: RecordView,
    },
    /// The model's `agent-version` changed (an operator ran `upgrade-controller`, or
    /// another controller moved it). Accepted in every phase: the core keeps the latest
    /// value (one; a newer one replaces it) and acts on it in Ready, where a version other
    /// than the running one starts a check, unless its own upgrade to that version is
    /// already under way. A driver sends each change it reads once, in any phase: a
    /// controller's driver the model's `agent-version`; the driver of an agent other than a
    /// controller the version its controller's `Upgrader.DesiredVersion` names for it
    /// (controllers first: it moves when every controller has reported running the model's).
    AgentVersionChanged(Version),
    /// The operator asked for an upgrade now, to a version or to the newest patch.
    UpgradeRequested {
        /// The version asked for; `None` for the newest patch.
        version: Option<Version>,
    },
    /// An operator's action on a held or running upgrade.
    Operator(OperatorAction),
}

/// Discriminant of [`Input`], as named in `spec/transitions.json`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InputKind {
    /// [`Input::Start`].
    Start,
    /// [`Input::Done`].
    Done,
    /// [`Input::ModelLoaded`].
    ModelLoaded,
    /// [`Input::RecordChanged`].
    RecordChanged,
    /// [`Input::RecordWritten`].
    RecordWritten,
    /// [`Input::LeaseAnswered`].
    LeaseAnswered,
    /// [`Input::StepFinished`].
    StepFinished,
    /// [`Input::CatalogueFound`].
    CatalogueFound,
    /// [`Input::DesiredBinary`].
    DesiredBinary,
    /// [`Input::Staged`].
    Staged,
    /// [`Input::AgentVersionRefused`].
    AgentVersionRefused,
    /// [`Input::AgentVersionChanged`].
    AgentVersionChanged,
    /// [`Input::UpgradeRequested`].
    UpgradeRequested,
    /// [`Input::Operator`].
    Operator,
    /// A timer fired ([`crate::lifecycle::Lifecycle::handle_timeout`]); not an [`Input`].
    Timer,
}

impl Input {
    /// This input's kind, as `spec/transitions.json` names it.
    pub fn kind(&self) -> InputKind {
        match self {
            Input::Start => InputKind::Start,
            Input::Done { .. } => InputKind::Done,
            Input::ModelLoaded { .. } => InputKind::ModelLoaded,
            Input::RecordChanged(_) => InputKind::RecordChanged,
            Input::RecordWritten { .. } => InputKind::RecordWritten,
            Input::LeaseAnswered { .. } => InputKind::LeaseAnswered,
            Input::StepFinished { .. } => InputKind::StepFinished,
            Input::CatalogueFound { .. } => InputKind::CatalogueFound,
            Input::DesiredBinary { .. } => InputKind::DesiredBinary,
            Input::Staged { .. } => InputKind::Staged,
            Input::AgentVersionRefused { .. } => InputKind::AgentVersionRefused,
            Input::AgentVersionChanged(_) => InputKind::AgentVersionChanged,
            Input::UpgradeRequested { .. } => InputKind::UpgradeRequested,
            Input::Operator(_) => InputKind::Operator,
        }
    }
}

/// What the core asks the driver to do. Each is answered by the input named.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Request {
    /// Write the snapshot atomically to the agent's data dir. → `Done`
    PersistSnapshot(Snapshot),
    /// Read the model from the shared store. → `ModelLoaded`
    LoadModel,
    /// Ask the environment provider for its capabilities and write them to the model
    /// (at bootstrap and at the end of every upgrade). → `Done`
    RefreshCapabilities,
    /// Subscribe to the upgrade-info record from the revision given; deliver the current
    /// view first. → `RecordChanged`, repeatedly
    WatchRecord {
        /// Changes after this revision; `Revision(0)` for all.
        after: crate::lifecycle::record::Revision,
    },
    /// Create the record if none is current. The core creates it with no controller ready
    /// and then registers by compare-and-set, so a create that lands late (a driver's retry, a
    /// duplicate) never registers anyone. → `RecordWritten`
    CreateRecord(crate::lifecycle::record::UpgradeInfo),
    /// Compare-and-set on the record's revision, fenced on a lease when given. A final
    /// status archives the record. → `RecordWritten`
    UpdateRecord {
        /// The revision the record must still be at.
        expected: crate::lifecycle::record::Revision,
        /// The record to write.
        record: crate::lifecycle::record::UpgradeInfo,
        /// The lease the write is fenced on: it succeeds only while that grant is current.
        fence: Option<LeaseToken>,
    },
    /// Take the upgrade lease if it is free, for [`Limits::lease_ttl`]. → `LeaseAnswered`
    AcquireLease,
    /// Keep the lease alive. → `LeaseAnswered` (`None`: it was lost). The core gives the
    /// lease up by itself if no answer comes within [`Limits::lease_keepalive_deadline`]
    /// (`Timer::LeaseDeadline`): a driver need not bound the call.
    KeepAliveLease(LeaseToken),
    /// Give the lease up. Not awaited: a lease that is not released expires by itself.
    ReleaseLease(LeaseToken),
    /// Run one step unless its checkpoint exists. A database step's changes and checkpoint
    /// commit in one transaction, fenced on the lease; a host step is run by the agent
    /// itself. → `StepFinished`
    RunStep {
        /// The step, in the embedder's registry.
        step: StepIndex,
        /// Its checkpoint's key: (step id, target version).
        key: StepKey,
        /// For a database step, the coordinator's lease.
        fence: Option<LeaseToken>,
    },
    /// Look the agent binaries up in these streams. → `CatalogueFound`
    LookupCatalogue {
        /// The streams, preferred first.
        streams: &'static [Stream],
    },
    /// Ask the controller for this agent's desired binary. → `DesiredBinary`
    DesiredBinary,
    /// Set the model's `agent-version`, checked in the store's write transaction by
    /// [`crate::upgrader::AgentVersionCheck::LIFECYCLE`]. → `Done`, or `AgentVersionRefused`
    /// (with the model's agent-version and the record the refusing transaction read) while
    /// an upgrade-info record is current
    SetAgentVersion(Version),
    /// Record (or clear) the model's `upgrade-available`. → `Done`
    ReportUpgradeAvailable(Option<Version>),
    /// Download or copy, verify and unpack a binary. → `Staged`
    StageBinary(StagePlan),
    /// Switch `tools/<agent-tag>` to this binary and restart into it. No completion: the
    /// process ends.
    RestartInto(Binary),
}

/// The gate's inputs, published whenever they change.
pub use crate::gate::GateView;

/// Status for operators and clients (`Upgrade.Status`, `FullStatus`, logs).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct StatusReport {
    /// The phase the gate last published.
    pub phase: Phase,
    /// How far it has got.
    pub progress: crate::phase::Progress,
    /// Human text, Juju's wording where it has one, e.g.
    /// `upgrade to 2.9.43 failed (will retry): <reason>`.
    pub message: String,
}

/// Everything the core emits. Drain with [`crate::lifecycle::Lifecycle::poll_output`] after
/// every input.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Output {
    /// Do this, and answer with the input the request names, echoing `id`.
    Request {
        /// The request's id.
        id: RequestId,
        /// What to do.
        request: Request,
    },
    /// The gate changed: serve calls by this view from now on.
    Gate(GateView),
    /// Progress or status text changed.
    Status(StatusReport),
}

/// Discriminant of [`Request`], as named in `spec/transitions.json`.
pub fn request_name(request: &Request) -> &'static str {
    match request {
        Request::PersistSnapshot(_) => "PersistSnapshot",
        Request::LoadModel => "LoadModel",
        Request::RefreshCapabilities => "RefreshCapabilities",
        Request::WatchRecord { .. } => "WatchRecord",
        Request::CreateRecord(_) => "CreateRecord",
        Request::UpdateRecord { .. } => "UpdateRecord",
        Request::AcquireLease => "AcquireLease",
        Request::KeepAliveLease(_) => "KeepAliveLease",
        Request::ReleaseLease(_) => "ReleaseLease",
        Request::RunStep { .. } => "RunStep",
        Request::LookupCatalogue { .. } => "LookupCatalogue",
        Request::DesiredBinary => "DesiredBinary",
        Request::SetAgentVersion(_) => "SetAgentVersion",
        Request::ReportUpgradeAvailable(_) => "ReportUpgradeAvailable",
        Request::StageBinary(_) => "StageBinary",
        Request::RestartInto(_) => "RestartInto",
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
