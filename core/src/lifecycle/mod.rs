//! The lifecycle: a sans-IO state machine from "just started" to "fit for work".
//!
//! ```text
//! Bootstrapping ─► RunningSteps ─► CheckingAgentVersion ─► Upgrading ─► (restart) ─► ...
//!       │               │                 │                    │
//!       │               ▼                 ▼                    ▼
//!       │          StepsFailed       UpgradeFailed ───────────► Ready ◄──┘ (no upgrade)
//!       └──────────────────────────────────────────────────────► Ready
//! ```
//!
//! [`Lifecycle`] follows the shape of quinn-proto's `Connection`; its methods fall in four
//! classes:
//! - **getters**: [`Lifecycle::phase`], [`Lifecycle::gate`], [`Lifecycle::snapshot`], ...
//! - **input**: [`Lifecycle::handle`] for completions and events, [`Lifecycle::handle_timeout`]
//!   for time; each carries the driver's `now`.
//! - **output**: [`Lifecycle::poll_output`] returns requests (with ids the completions echo),
//!   gate changes and status, in the order they were made; [`Lifecycle::poll_timeout`]
//!   returns the earliest deadline. After every input, drain every output (str0m's rule).
//!   Spurious timeouts are harmless.
//!
//! The phases, inputs and outputs are specified in `spec/lifecycle.md` and, as data, in
//! `spec/transitions.json`.

// The machine, with its decisions one concern a file (see `machine.rs`).
mod boot;
mod coordination;
mod held;
mod invariants;
mod io;
mod machine;
mod ready;
mod trial;
mod version_check;

pub mod record;
mod types;

use std::sync::Arc;

use statig::blocking::{IntoStateMachineExt, StateMachine};

pub use io::OUTPUTS_MAX;
pub use record::{
    ControllerId, ControllerSet, LeaseToken, RecordView, Revision, UpgradeInfo, UpgradeStatus,
};
pub use types::*;

use crate::phase::Phase;
use crate::steps::StepRegistry;
use crate::time::Timestamp;
use io::Io;
use machine::{Event, Machine};

/// The lifecycle's timers. Timers are data: [`Lifecycle::poll_timeout`] returns the earliest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Timer {
    /// A failed step batch is tried again.
    StepRetry,
    /// Controllers gave up waiting for each other.
    ControllersWait,
    /// The coordinator keeps its lease alive.
    LeaseKeepAlive,
    /// A keep-alive sent is still unanswered after [`Limits::lease_keepalive_deadline`]:
    /// the lease may have expired, and it is treated as lost (as a `LeaseAnswered` with no
    /// lease); a late answer is then ignored by its id.
    LeaseDeadline,
    /// A controller tries again for a lease another holds (the holder may have died).
    LeaseRetry,
    /// A failed catalogue lookup is tried again.
    CatalogueRetry,
    /// A failed staging is tried again.
    StageRetry,
    /// A binary on trial has not reached Ready in time.
    TrialReady,
    /// The periodic check for newer patches while Ready.
    CatalogueCheck,
}

impl Timer {
    /// How many timers there are.
    pub const COUNT: usize = 9;
    /// Every timer, in the order `handle_timeout` fires those due.
    pub const ALL: [Timer; Timer::COUNT] = [
        Timer::StepRetry,
        Timer::ControllersWait,
        Timer::LeaseKeepAlive,
        Timer::LeaseDeadline,
        Timer::LeaseRetry,
        Timer::CatalogueRetry,
        Timer::StageRetry,
        Timer::TrialReady,
        Timer::CatalogueCheck,
    ];
}

/// Planted defects, each off by default, for proving that the checks can fail. Only the
/// `mutations` feature lets a caller switch them on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Mutations {
    /// The gate opens when the version check starts, before its outcome is known.
    pub gate_before_version_check: bool,
    /// A host step's checkpoint is made durable before the step runs.
    pub checkpoint_before_effects: bool,
    /// The coordinator runs database steps and marks db-complete without its fence.
    pub unfenced_coordinator: bool,
    /// `upgradedToVersion` advances while the last host step is still missing.
    pub upgraded_to_with_step_missing: bool,
}

/// A refused start: the arguments cannot describe a working agent.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LifecycleError(pub String);

impl std::fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LifecycleError {}

/// One agent's lifecycle. See the module documentation.
#[derive(Clone, PartialEq, Eq)]
pub struct Lifecycle {
    machine: StateMachine<Machine>,
    io: Io,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("phase", &self.phase())
            .field("state", self.machine.state())
            .field("pending", &self.machine.inner().pending)
            .finish_non_exhaustive()
    }
}

impl Lifecycle {
    /// A lifecycle for an agent configured by `config`, with the embedder's step registry,
    /// resuming from `snapshot` (`None` on the first boot after bootstrap). Nothing happens
    /// until [`Input::Start`].
    pub fn new(
        config: Config,
        registry: Arc<StepRegistry>,
        snapshot: Option<Snapshot>,
    ) -> Result<Lifecycle, LifecycleError> {
        if let Some(snapshot) = &snapshot {
            snapshot.check_format().map_err(LifecycleError)?;
        }
        config.limits.check().map_err(LifecycleError)?;
        if config.controller.is_some() != config.roles.contains(crate::Role::Controller) {
            return Err(LifecycleError(format!(
                "a controller needs both a controller id and the controller role \
                 (controller id {:?}, roles {:?})",
                config.controller, config.roles
            )));
        }
        if let Some(id) = config.controller
            && id.0 >= ControllerId::COUNT_MAX
        {
            return Err(LifecycleError(format!(
                "controller id {} is above the maximum {}",
                id.0,
                ControllerId::COUNT_MAX - 1
            )));
        }
        let mut io = Io::new();
        let machine = Machine::new(config, registry, snapshot)
            .uninitialized_state_machine()
            .init_with_context(&mut io)
            .into();
        // Entering Bootstrapping does nothing until Start.
        assert!(io.outputs.is_empty());
        Ok(Lifecycle { machine, io })
    }

    // ------------------------------------------------------------------ getters

    /// The current phase.
    pub fn phase(&self) -> Phase {
        machine::phase_of(self.machine.state())
    }

    /// What the gate reads on every API call.
    pub fn gate(&self) -> &crate::gate::GateView {
        &self.machine.inner().gate
    }

    /// The snapshot as last asked to be persisted.
    pub fn snapshot(&self) -> &Snapshot {
        &self.machine.inner().snapshot
    }

    /// The configuration given at start.
    pub fn config(&self) -> &Config {
        &self.machine.inner().config
    }

    /// The newest patch known to be available, as last reported.
    pub fn upgrade_available(&self) -> Option<crate::version::Version> {
        self.machine.inner().upgrade_available
    }

    /// Deadlines of the armed timers.
    pub fn timers(&self) -> impl Iterator<Item = (Timer, Timestamp)> + '_ {
        Timer::ALL
            .into_iter()
            .filter_map(|timer| self.io.timers[timer as usize].map(|at| (timer, at)))
    }

    /// The model's `agent-version` as last told ([`Input::AgentVersionChanged`]) and not yet
    /// acted on: kept in every phase, acted on in Ready.
    pub fn agent_version_news(&self) -> Option<crate::version::Version> {
        self.machine.inner().agent_version_news
    }

    /// The id of the main request in flight, if any.
    pub fn awaiting(&self) -> Option<RequestId> {
        self.machine.inner().pending.map(|(id, _)| id)
    }

    // ------------------------------------------------------------------ input

    /// Feeds one input. Drain [`Lifecycle::poll_output`] afterwards.
    // Inlined into the driver, so that the input is dispatched where it lies: it is passed
    // on by reference, never copied (`Input` is a few hundred bytes).
    #[inline]
    pub fn handle(&mut self, now: Timestamp, input: Input) {
        self.handle_input(now, &input);
    }

    fn handle_input(&mut self, now: Timestamp, input: &Input) {
        self.set_now(now);
        tracing::trace!(target: "lockstep::lifecycle", ?input, "input");
        match self.machine.inner().settle(input) {
            Some(id) => self.dispatch_settled(id),
            None => self.dispatch(&Event::Input(input)),
        }
    }

    /// A refused `agent-version` write that `settle` reads as done, dispatched as its
    /// `Done` (rare: out of line, so the input path keeps a small frame).
    #[cold]
    #[inline(never)]
    fn dispatch_settled(&mut self, id: RequestId) {
        self.dispatch(&Event::Input(&Input::Done { id }));
    }

    /// Fires every timer whose deadline is at or before `now`.
    // Inlined into the driver: spurious wake-ups are common (a driver's tick), and with the
    // earliest deadline kept they cost one comparison.
    #[inline]
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.set_now(now);
        if self.io.any_due(now) {
            self.fire_due(now);
        }
    }

    fn fire_due(&mut self, now: Timestamp) {
        for timer in Timer::ALL {
            let due = self.io.timers[timer as usize].is_some_and(|at| at <= now);
            if due {
                self.fire(timer);
            }
        }
    }

    /// Fires one armed timer as if its deadline had passed, whatever `now` is. Model
    /// checkers use this to treat time as "a timer fired"; [`Lifecycle::handle_timeout`]
    /// calls the same path. A timer that is not armed is ignored.
    pub fn handle_timer(&mut self, now: Timestamp, timer: Timer) {
        self.set_now(now);
        if self.io.timers[timer as usize].is_some() {
            self.fire(timer);
        }
    }

    fn fire(&mut self, timer: Timer) {
        self.io.cancel_timer(timer);
        tracing::debug!(target: "lockstep::lifecycle", ?timer, "timer fired");
        self.dispatch(&Event::Timer(timer));
    }

    /// One dispatch into the machine, then the read-path checks of what it published
    /// (`invariants.rs`: I1, I7, I9).
    ///
    /// The checks run when the dispatch published something: every gate change, phase
    /// change and snapshot write is an output, so a dispatch that made none left what the
    /// driver reads back as it was when last checked (most inputs of a Ready agent: a timer
    /// not yet due, a stale completion, a record view kept).
    #[inline]
    fn dispatch(&mut self, event: &Event<'_>) {
        let start = self.io.outputs.len();
        self.machine.handle_with_context(event, &mut self.io);
        if self.io.outputs.len() != start {
            self.machine.inner().assert_after_dispatch(
                machine::phase_of(self.machine.state()),
                &mut self.io.published,
                &self.io.outputs,
            );
        }
    }

    #[inline]
    fn set_now(&mut self, now: Timestamp) {
        // Time never runs backwards for the core, even if the driver's clock does.
        self.io.now = self.io.now.max(now);
    }

    // ------------------------------------------------------------------ output

    /// The next output, in the order made.
    #[inline]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.io.outputs.pop_front()
    }

    /// The earliest armed deadline.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.io.earliest
    }

    /// Switches planted defects on (tests that prove the checks can fail).
    ///
    /// The switches live in the machine's shared storage, which statig only lets us reach
    /// mutably through a dispatch: they are applied by a dispatch of their own.
    #[cfg(feature = "mutations")]
    pub fn set_mutations(&mut self, mutations: Mutations) {
        self.machine
            .handle_with_context(&Event::SetMutations(mutations), &mut self.io);
    }

    /// Hashes the whole state (for explorers' visited sets).
    pub fn hash_state<H: std::hash::Hasher>(&self, hasher: &mut H) {
        use std::hash::Hash;
        self.machine.inner().hash(hasher);
        self.machine.state().hash(hasher);
        self.io.hash(hasher);
    }
}
