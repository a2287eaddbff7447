//! The statig machine: one state per phase, the phase's own progress as state-local data,
//! and the shared storage every phase reads (config, registry, snapshot, model, queues).
//!
//! Rules every handler keeps:
//! - At most one "main" request is in flight (`Machine::pending`); the lease's own requests
//!   and the record watch run beside it. A completion whose id is not the one awaited is
//!   stale (from before a retry or a phase change) and ignored.
//! - Every retry has a bound in [`Limits`]; every wait has a timer.
//! - Nothing here reads a clock: `now` is the driver's, stored before each dispatch.

use std::collections::VecDeque;
use std::sync::Arc;

use statig::blocking::*;

use crate::gate::GateView;
use crate::lifecycle::record::{
    ControllerId, ControllerSet, LeaseToken, RecordView, Revision, UpgradeInfo, UpgradeStatus,
};
use crate::lifecycle::types::*;
use crate::lifecycle::{Mutations, Timer};
use crate::phase::{Phase, Progress};
use crate::policy::{self, Decision, Occasion, SelectionRequest, Stream};
use crate::role::Role;
use crate::steps::{self, StepRegistry};
use crate::time::Timestamp;
use crate::version::Version;

/// Outputs held at most between two drains; the driver drains after every input.
pub const OUTPUTS_MAX: usize = 32;

/// What the main in-flight request is for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Pending {
    Persist(PersistFor),
    LoadModel,
    Capabilities,
    RecordWrite,
    DatabaseStep(StepIndex),
    HostStep(StepIndex),
    Catalogue,
    DesiredBinary,
    /// The model's `agent-version` asked to become this version.
    SetAgentVersion(Version),
    Report,
    Stage,
}

impl Pending {
    /// Requests whose effect outlives this process if they complete after it gave up on
    /// them: store writes and steps. Reads and local persists are safe to abandon.
    fn writes_shared_state(self) -> bool {
        matches!(
            self,
            Pending::RecordWrite
                | Pending::DatabaseStep(_)
                | Pending::HostStep(_)
                | Pending::SetAgentVersion(_)
                | Pending::Report
        )
    }
}

/// Why a snapshot is being persisted: what to do once it is durable.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PersistFor {
    Boot,
    HostCheckpoint(StepIndex),
    PastDatabaseSteps,
    UpgradedTo,
    Switch,
    FallBack,
    ClearTrial,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) enum LeaseState {
    #[default]
    Free,
    Asking(RequestId),
    Held(LeaseToken),
}

/// Progress of Bootstrapping.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) enum BootStage {
    #[default]
    NotStarted,
    Persisting,
    LoadingModel,
    Capabilities,
}

/// Progress of RunningSteps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct Steps {
    record: RecordView,
    watching: bool,
    seen_record: bool,
    lease: LeaseState,
    keepalive: Option<RequestId>,
    lease_wait: bool,
    database_next: u16,
    attempts: u8,
    retry_wait: bool,
    finishing: bool,
    abort: Option<AbortReason>,
    /// An operator asked to retry after an abort: the archived aborted record for this
    /// upgrade no longer stops us (until this upgrade has a record again).
    retrying: bool,
}

impl Steps {
    /// Asks for the record to be archived as aborted, unless a trial's fall back (which
    /// archives it too, when it may) is already under way.
    fn ask_abort(&mut self, reason: AbortReason) {
        if !matches!(self.abort, Some(AbortReason::FallBack(_))) {
            self.abort = Some(reason);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum AbortReason {
    WaitTimedOut,
    Operator,
    /// The binary on trial gives up: retire the record (archive it aborted while no
    /// database step can have run under it), then fall back; or hold if the store says
    /// database steps of the trial version may have run.
    FallBack(FallBackCause),
}

/// Why a binary on trial gives up.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum FallBackCause {
    /// It did not reach Ready within [`Limits::trial_ready_timeout`].
    TimedOut,
    /// It booted more than [`Limits::trial_boots_max`] times.
    BootsExhausted,
    /// The operator aborted the upgrade while it was held.
    Operator,
}

/// Progress of CheckingAgentVersion and of Ready's background checks.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct Check {
    attempts: u8,
    occasion: Option<OccasionKey>,
    retry_wait: bool,
    /// A binary decided on, waiting for `agent-version` to be written or to be staged.
    chosen: Option<StagePlan>,
    /// Ready controllers: the record revision for which the model was read again, to
    /// learn whether `agent-version` still names the record's target.
    model_read_for: Option<Revision>,
    /// Ready: failed stagings of the chosen binary so far (bounded by
    /// [`Limits::stage_attempts_max`], as in Upgrading).
    stage_attempts: u8,
    /// Ready: a staging of the chosen binary is to be tried again at `StageRetry`.
    stage_retry_wait: bool,
    /// Ready: `agent-version` is being reset to the running version, after the chosen
    /// binary could not be staged.
    resetting: bool,
}

/// [`Occasion`] without borrowed data, kept in state.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum OccasionKey {
    Bootstrap,
    Periodic,
    Operator(Option<Version>),
}

impl OccasionKey {
    fn occasion(self) -> Occasion {
        match self {
            OccasionKey::Bootstrap => Occasion::Bootstrap,
            OccasionKey::Periodic => Occasion::Periodic,
            OccasionKey::Operator(version) => Occasion::OperatorRequest { version },
        }
    }
}

/// Progress of Upgrading.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Upgrade {
    plan: StagePlan,
    staged: bool,
    attempts: u8,
    retry_wait: bool,
    restarting: bool,
}

/// Why steps are held.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Held {
    reason: String,
    record: RecordView,
    /// A view of the record arrived in this phase: `record` is no older than the phase.
    seen: bool,
    /// A watch was asked for in this phase.
    watching: bool,
    /// What the held agent is doing about its upgrade, if anything.
    intent: Option<HeldIntent>,
}

impl Held {
    fn new(reason: String, record: RecordView) -> Held {
        Held {
            reason,
            record,
            seen: false,
            watching: false,
            intent: None,
        }
    }
}

/// What a held agent is doing about its upgrade.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum HeldIntent {
    /// The operator aborted: archive the current record as aborted, then fall back when
    /// that is safe.
    OperatorAbort,
    /// The trial is given up: retire the record, then fall back when that is safe.
    FallBack(FallBackCause),
}

/// Why an upgrade failed, while the agent falls back.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Failure {
    reason: String,
    reset_done: bool,
    /// Controllers: the upgrade-info record, watched before `agent-version` is reset (the
    /// store refuses the reset while a record is current).
    record: RecordView,
    seen: bool,
    watching: bool,
}

impl Failure {
    fn new(reason: String) -> Failure {
        Failure {
            reason,
            reset_done: false,
            record: RecordView::default(),
            seen: false,
            watching: false,
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "built on the stack for one dispatch and never stored; boxing would allocate \
              on every input of the steady path"
)]
pub(crate) enum Event {
    Input(Input),
    Timer(Timer),
    /// Applied by `before_dispatch`; no state sees it.
    #[cfg_attr(not(feature = "mutations"), allow(dead_code))]
    SetMutations(Mutations),
}

/// What the machine shares with its driver between dispatches: the clock reading, the
/// output queue, the timer table and the request counter. Passed to statig as context, so
/// the wrapper can drain outputs without reaching into the machine.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Io {
    pub(crate) now: Timestamp,
    pub(crate) outputs: VecDeque<Output>,
    pub(crate) timers: [Option<Timestamp>; Timer::COUNT],
    next_request: u64,
    /// Set once the process asked to restart into another binary: it makes no further
    /// request, whatever it is told, so nothing of it runs beside its successor.
    exiting: bool,
}

impl Io {
    pub(crate) fn new() -> Io {
        Io {
            now: Timestamp::ZERO,
            outputs: VecDeque::with_capacity(OUTPUTS_MAX),
            timers: [None; Timer::COUNT],
            next_request: 1,
            exiting: false,
        }
    }

    /// Asks the driver to switch to `binary` and restart; the last request this process
    /// makes.
    fn exit_into(&mut self, binary: crate::version::Binary) {
        if !self.exiting {
            let id = self.next_id();
            self.emit_request(id, Request::RestartInto(binary));
            self.exiting = true;
        }
    }

    fn next_id(&mut self) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        id
    }

    /// Issues a request that runs beside the main one (lease keep-alive, watch, release).
    fn request_aside(&mut self, request: Request) -> RequestId {
        let id = self.next_id();
        self.emit_request(id, request);
        id
    }

    fn emit_request(&mut self, id: RequestId, request: Request) {
        if self.exiting {
            tracing::debug!(target: "lockstep::lifecycle", request = request_name(&request), "not sent: restarting");
            return;
        }
        tracing::debug!(target: "lockstep::lifecycle", id = id.0, request = request_name(&request), "request");
        self.push(Output::Request { id, request });
    }

    pub(crate) fn push(&mut self, output: Output) {
        assert!(
            self.outputs.len() < OUTPUTS_MAX,
            "more than {OUTPUTS_MAX} outputs undrained: the driver must drain after every input"
        );
        self.outputs.push_back(output);
    }

    fn set_timer(&mut self, timer: Timer, after: crate::time::Millis) {
        self.timers[timer as usize] = Some(self.now + after);
    }

    fn cancel_timer(&mut self, timer: Timer) {
        self.timers[timer as usize] = None;
    }
}

/// The shared storage of the machine.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Machine {
    pub(crate) config: Config,
    pub(crate) registry: Arc<StepRegistry>,
    pub(crate) snapshot: Snapshot,
    pub(crate) model: Option<ModelView>,
    pub(crate) pending: Option<(RequestId, Pending)>,
    pub(crate) gate: GateView,
    pub(crate) upgrade_available: Option<Version>,
    pub(crate) mutations: Mutations,
    /// Set by Bootstrapping when the snapshot shows a trial that did not succeed.
    fell_back: Option<String>,
    /// Set by Bootstrapping when the snapshot shows a switch that never happened.
    resume_switch: Option<crate::version::Binary>,
    /// Set by Bootstrapping when a controller's trial is over (timed out, or out of boots)
    /// and falling back looks safe locally: the fall back waits for the store's word, which
    /// RunningSteps reads (see [`AbortReason::FallBack`]).
    fall_back_due: Option<FallBackCause>,
    /// This process subscribed to the upgrade-info record. A subscription lasts as long as
    /// the process (a later `WatchRecord` replaces it, delivering the current view first).
    watching: bool,
    /// The newest view of the record this process was given, in any phase (by the watch, a
    /// record write or a refused `agent-version` write). Ready works from it.
    record_seen: RecordView,
    /// The model's `agent-version` as last told (`Input::AgentVersionChanged`, in any
    /// phase) and not yet acted on: one value, a newer one replaces it. Ready acts on it
    /// (see [`Machine::act_on_agent_version_news`]).
    pub(crate) agent_version_news: Option<Version>,
}

#[state_machine(
    initial = "State::bootstrapping(BootStage::NotStarted)",
    state(derive(Clone, PartialEq, Eq, Hash, Debug)),
    context_identifier = "io",
    before_dispatch = "Self::before_dispatch",
    before_transition = "Self::before_transition",
    after_transition = "Self::after_transition"
)]
impl Machine {
    // ---------------------------------------------------------------- Bootstrapping

    #[state]
    fn bootstrapping(
        &mut self,
        io: &mut Io,
        stage: &mut BootStage,
        event: &Event,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::Start) if *stage == BootStage::NotStarted => {
                self.start_trial_accounting(io);
                *stage = BootStage::Persisting;
                let snapshot = self.snapshot.clone();
                self.request(
                    io,
                    Pending::Persist(PersistFor::Boot),
                    Request::PersistSnapshot(snapshot),
                );
                Handled
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::Boot)) =>
            {
                if let Some(outcome) = self.trial_exhausted(io) {
                    return outcome;
                }
                if let Some(binary) = self.resume_switch.take() {
                    self.status_message(
                        io,
                        format!("resuming the switch to agent binary {binary}"),
                    );
                    io.exit_into(binary);
                    return Handled;
                }
                *stage = BootStage::LoadingModel;
                self.request(io, Pending::LoadModel, Request::LoadModel);
                Handled
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::FallBack)) =>
            {
                self.restart_into_previous(io);
                Handled
            }
            Event::Input(Input::ModelLoaded { id, model })
                if self.completes(*id, Pending::LoadModel) =>
            {
                self.model = Some(model.clone());
                if !self.snapshot.bootstrap_complete && self.is_controller() {
                    *stage = BootStage::Capabilities;
                    self.request(io, Pending::Capabilities, Request::RefreshCapabilities);
                    return Handled;
                }
                self.leave_bootstrapping()
            }
            Event::Input(Input::Done { id }) if self.completes(*id, Pending::Capabilities) => {
                self.leave_bootstrapping()
            }
            Event::Timer(Timer::TrialReady) => self
                .trial_over_while_booting(io, FallBackCause::TimedOut)
                .unwrap_or(Handled),
            _ => Super,
        }
    }

    // ---------------------------------------------------------------- RunningSteps

    #[action]
    fn enter_running_steps(&mut self, io: &mut Io, steps: &mut Steps) {
        let next = self.reconcile_steps(io, steps);
        // An entry action cannot transition: the first reconcile only ever asks.
        assert!(next.is_none(), "RunningSteps decided {next:?} on entry");
    }

    #[state(
        entry_action = "enter_running_steps",
        exit_action = "exit_running_steps"
    )]
    fn running_steps(&mut self, io: &mut Io, steps: &mut Steps, event: &Event) -> Outcome<State> {
        let outcome = match event {
            Event::Input(Input::RecordChanged(view)) => {
                if view.revision >= steps.record.revision {
                    steps.record = view.normalized();
                    steps.seen_record = true;
                }
                None
            }
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                match write {
                    RecordWrite::Written(view) | RecordWrite::Conflict(view) => {
                        if view.revision >= steps.record.revision {
                            steps.record = view.normalized();
                            steps.seen_record = true;
                        }
                        // A trial's fall back decides on the view just written (reconcile).
                        if let (Some(reason), RecordWrite::Written(_)) = (steps.abort, write)
                            && !matches!(reason, AbortReason::FallBack(_))
                        {
                            return Transition(self.held_after_abort(reason, steps));
                        }
                    }
                    RecordWrite::Fenced => self.lose_lease(io, steps),
                }
                None
            }
            Event::Input(Input::LeaseAnswered { id, lease }) => {
                self.lease_answered(io, steps, *id, *lease);
                None
            }
            Event::Input(Input::StepFinished { id, outcome }) => {
                self.step_finished(io, steps, *id, outcome)
            }
            Event::Input(Input::Done { id }) => self.steps_done(io, *id),
            Event::Input(Input::Operator(OperatorAction::Abort)) => {
                steps.ask_abort(AbortReason::Operator);
                None
            }
            Event::Timer(Timer::StepRetry) => {
                steps.retry_wait = false;
                None
            }
            Event::Timer(Timer::LeaseRetry) => {
                steps.lease_wait = false;
                None
            }
            Event::Timer(Timer::LeaseKeepAlive) => {
                if let (LeaseState::Held(token), None) = (steps.lease, steps.keepalive) {
                    steps.keepalive = Some(io.request_aside(Request::KeepAliveLease(token)));
                    io.set_timer(
                        Timer::LeaseDeadline,
                        self.config.limits.lease_keepalive_deadline(),
                    );
                }
                None
            }
            Event::Timer(Timer::LeaseDeadline) => {
                // The keep-alive is unanswered: the lease may have expired by now. Lost, as
                // if the store had said so; its answer, if it ever comes, is stale.
                if let Some(id) = steps.keepalive {
                    tracing::warn!(
                        target: "lockstep::lifecycle",
                        id = id.0,
                        deadline_ms = self.config.limits.lease_keepalive_deadline().0,
                        "lease keep-alive unanswered; giving the lease up"
                    );
                    self.lose_lease(io, steps);
                }
                None
            }
            Event::Timer(Timer::ControllersWait) => {
                if !self.all_ready(&steps.record) {
                    steps.ask_abort(AbortReason::WaitTimedOut);
                }
                None
            }
            Event::Timer(Timer::TrialReady) => {
                if !self.is_controller() || !self.fall_back_locally_safe() {
                    return self.trial_timed_out(io);
                }
                // The record decides (reconcile): retired, then a fall back; or a hold.
                let cause = FallBackCause::TimedOut;
                let reason = self.fall_back_reason(cause);
                self.status_message(
                    io,
                    format!("{reason}; retiring the upgrade-info record before falling back"),
                );
                steps.abort = Some(AbortReason::FallBack(cause));
                None
            }
            _ => return Super,
        };
        if let Some(state) = outcome {
            return Transition(state);
        }
        match self.reconcile_steps(io, steps) {
            Some(state) => Transition(state),
            None => Handled,
        }
    }

    #[action]
    fn exit_running_steps(&mut self, io: &mut Io, steps: &mut Steps) {
        for timer in [
            Timer::StepRetry,
            Timer::LeaseRetry,
            Timer::LeaseKeepAlive,
            Timer::LeaseDeadline,
            Timer::ControllersWait,
        ] {
            io.cancel_timer(timer);
        }
        if let LeaseState::Held(token) = steps.lease {
            // Not awaited: the lease expires by itself if this is lost.
            io.request_aside(Request::ReleaseLease(token));
        }
    }

    // ---------------------------------------------------------------- CheckingAgentVersion

    #[action]
    fn enter_checking_agent_version(&mut self, io: &mut Io, check: &mut Check) {
        if self.mutations.gate_before_version_check {
            // Planted defect: the gate opens before the version is known.
            io.push(Output::Gate(self.view(Phase::Ready)));
        }
        if check.occasion.is_none() {
            check.occasion = Some(self.occasion());
        }
        self.start_check(io);
    }

    #[state(entry_action = "enter_checking_agent_version")]
    fn checking_agent_version(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        event: &Event,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::CatalogueFound { id, result })
                if self.completes(*id, Pending::Catalogue) =>
            {
                match result {
                    Ok(catalogue) => self.decide(io, check, catalogue),
                    Err(reason) => {
                        check.attempts += 1;
                        if check.attempts < self.config.limits.catalogue_attempts_max {
                            check.retry_wait = true;
                            self.status_message(
                                io,
                                format!("agent binary lookup failed (will retry): {reason}"),
                            );
                            io.set_timer(
                                Timer::CatalogueRetry,
                                self.config.limits.catalogue_retry_delay,
                            );
                            return Handled;
                        }
                        if self.must_upgrade() {
                            let reason = format!("agent binaries could not be looked up: {reason}");
                            return Transition(State::upgrade_failed(Failure::new(reason)));
                        }
                        self.status_message(
                            io,
                            format!("agent binary lookup failed (giving up): {reason}"),
                        );
                        Transition(State::ready(Check::default()))
                    }
                }
            }
            Event::Input(Input::DesiredBinary { id, plan })
                if self.completes(*id, Pending::DesiredBinary) =>
            {
                if let Some(reason) = self.refuse_downgrade(plan) {
                    self.status_message(io, reason);
                    Transition(State::ready(Check::default()))
                } else if plan.binary.number == self.config.running.number {
                    Transition(State::ready(Check::default()))
                } else {
                    Transition(State::upgrading(Upgrade::new(plan.clone(), false)))
                }
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                // Another upgrade is recorded as in progress: stay on this version; Ready
                // archives the record if no controller can ever proceed with it.
                if let Some(plan) = check.chosen.take() {
                    self.status_message(
                        io,
                        upgrade_refused_message(plan.binary.number, &view.normalized()),
                    );
                }
                Transition(State::ready(Check::default()))
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                match check.chosen.take() {
                    Some(plan) => {
                        // The model holds the chosen version now.
                        if let Some(model) = &mut self.model {
                            model.agent_version = plan.binary.number;
                        }
                        Transition(State::upgrading(Upgrade::new(plan, false)))
                    }
                    None => Transition(State::ready(Check::default())),
                }
            }
            Event::Input(Input::Done { id }) if self.completes(*id, Pending::Report) => {
                Transition(State::ready(Check::default()))
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::FallBack)) =>
            {
                self.restart_into_previous(io);
                Handled
            }
            Event::Timer(Timer::CatalogueRetry) if check.retry_wait => {
                check.retry_wait = false;
                self.start_check(io);
                Handled
            }
            Event::Timer(Timer::TrialReady) => self.trial_timed_out(io),
            _ => Super,
        }
    }

    // ---------------------------------------------------------------- Upgrading

    #[action]
    fn enter_upgrading(&mut self, io: &mut Io, upgrade: &mut Upgrade) {
        self.advance_upgrade(io, upgrade);
    }

    #[state(entry_action = "enter_upgrading")]
    fn upgrading(&mut self, io: &mut Io, upgrade: &mut Upgrade, event: &Event) -> Outcome<State> {
        match event {
            Event::Input(Input::Staged { id, result }) if self.completes(*id, Pending::Stage) => {
                match result {
                    Ok(()) => {
                        upgrade.staged = true;
                        self.advance_upgrade(io, upgrade);
                        Handled
                    }
                    Err(reason) => {
                        upgrade.attempts += 1;
                        if upgrade.attempts < self.config.limits.stage_attempts_max {
                            upgrade.retry_wait = true;
                            self.status_message(
                                io,
                                format!(
                                    "staging agent binary {} failed (will retry): {reason}",
                                    upgrade.plan.binary
                                ),
                            );
                            io.set_timer(Timer::StageRetry, self.config.limits.stage_retry_delay);
                            return Handled;
                        }
                        let reason = format!(
                            "agent binary {} could not be staged after {} attempts: {reason}",
                            upgrade.plan.binary, upgrade.attempts
                        );
                        Transition(State::upgrade_failed(Failure::new(reason)))
                    }
                }
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::Switch)) =>
            {
                upgrade.restarting = true;
                let binary = upgrade.plan.binary.clone();
                io.exit_into(binary);
                Handled
            }
            Event::Timer(Timer::StageRetry) if upgrade.retry_wait => {
                upgrade.retry_wait = false;
                self.advance_upgrade(io, upgrade);
                Handled
            }
            _ => Super,
        }
    }

    // ---------------------------------------------------------------- Ready

    #[action]
    fn enter_ready(&mut self, io: &mut Io, check: &mut Check) {
        let proven = self
            .snapshot
            .trial
            .as_ref()
            .is_some_and(|trial| trial.binary == self.config.running);
        if proven || !self.snapshot.bootstrap_complete {
            // The new binary proved itself (forget the trial), and bootstrap is over.
            io.cancel_timer(Timer::TrialReady);
            if proven {
                self.snapshot.trial = None;
            }
            self.snapshot.bootstrap_complete = true;
            let snapshot = self.snapshot.clone();
            self.request(
                io,
                Pending::Persist(PersistFor::ClearTrial),
                Request::PersistSnapshot(snapshot),
            );
        }
        if self.is_controller() {
            io.set_timer(
                Timer::CatalogueCheck,
                self.config.limits.catalogue_check_interval,
            );
            // A Ready controller watches the upgrade-info record: one that can never
            // proceed (a create that landed late, an upgrade every controller gave up) would
            // otherwise stay current and block every later change of agent-version. The
            // subscription of an earlier phase goes on; a process without one subscribes.
            if !self.watching {
                self.watch_record(io);
            }
            self.retire_doomed_record(io, check);
        }
        self.act_on_agent_version_news(io, check);
    }

    #[state(entry_action = "enter_ready")]
    fn ready(&mut self, io: &mut Io, check: &mut Check, event: &Event) -> Outcome<State> {
        let outcome = self.ready_event(io, check, event);
        if matches!(outcome, Handled) {
            self.retire_doomed_record(io, check);
            self.act_on_agent_version_news(io, check);
        }
        outcome
    }

    // ---------------------------------------------------------------- StepsFailed

    #[action]
    fn enter_steps_failed(&mut self) {
        // A held agent awaits nothing: whatever was in flight completes as stale, and the
        // operator's retry or abort is taken at once. (Its reason went out with the phase
        // change, from `before_transition`.)
        self.pending = None;
    }

    #[state(entry_action = "enter_steps_failed")]
    fn steps_failed(&mut self, io: &mut Io, held: &mut Held, event: &Event) -> Outcome<State> {
        match event {
            Event::Input(Input::Operator(OperatorAction::Retry)) if self.pending.is_none() => {
                // Resume where the agent is: its steps, if some are left; the version check,
                // if they are all recorded (held after them, e.g. a trial that timed out);
                // nothing, if this binary is older than the steps recorded.
                let upgraded_to = self.snapshot.upgraded_to_version;
                let running = self.config.running.number;
                if upgraded_to < running {
                    Transition(State::running_steps(Steps {
                        retrying: true,
                        ..Steps::default()
                    }))
                } else if upgraded_to == running {
                    Transition(State::checking_agent_version(Check::default()))
                } else {
                    let message = held.reason.clone();
                    self.status_message(io, message);
                    Handled
                }
            }
            Event::Input(Input::Operator(OperatorAction::Abort)) if self.pending.is_none() => {
                held.intent = Some(HeldIntent::OperatorAbort);
                self.advance_held(io, held)
            }
            Event::Timer(Timer::TrialReady) if self.is_controller() => {
                // A held trial controller gives up at its deadline, like any other trial
                // (agents other than controllers stay held: their fall back leaves
                // `agent-version` as it is, so they would only try again).
                if held.intent.is_none() {
                    held.intent = Some(HeldIntent::FallBack(FallBackCause::TimedOut));
                }
                self.advance_held(io, held)
            }
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                match write {
                    RecordWrite::Written(view) => {
                        held.record = view.normalized();
                        held.seen = true;
                    }
                    RecordWrite::Conflict(view) => {
                        held.record = view.normalized();
                        held.seen = true;
                        if held.intent == Some(HeldIntent::OperatorAbort) {
                            // Someone changed it first; the operator may abort again.
                            held.intent = None;
                            self.status_message(
                                io,
                                "abort not done: the upgrade-info record changed meanwhile; \
                                 abort again"
                                    .to_owned(),
                            );
                        }
                    }
                    RecordWrite::Fenced => {}
                }
                if held.intent == Some(HeldIntent::OperatorAbort) {
                    held.intent = Some(HeldIntent::FallBack(FallBackCause::Operator));
                }
                self.advance_held(io, held)
            }
            Event::Input(Input::RecordChanged(view)) => {
                if view.revision >= held.record.revision {
                    held.record = view.normalized();
                }
                held.seen = true;
                self.advance_held(io, held)
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::PastDatabaseSteps)) =>
            {
                self.advance_held(io, held)
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::FallBack)) =>
            {
                self.restart_into_previous(io);
                Handled
            }
            _ => Super,
        }
    }

    // ---------------------------------------------------------------- UpgradeFailed

    #[action]
    fn enter_upgrade_failed(&mut self, io: &mut Io, failure: &mut Failure) {
        // The reason went out with the phase change.
        self.advance_failure(io, failure);
    }

    #[state(entry_action = "enter_upgrade_failed")]
    fn upgrade_failed(
        &mut self,
        io: &mut Io,
        failure: &mut Failure,
        event: &Event,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::RecordChanged(view)) if failure.watching => {
                if view.revision >= failure.record.revision {
                    failure.record = view.normalized();
                }
                failure.seen = true;
                self.advance_failure(io, failure)
            }
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                if let RecordWrite::Written(view) | RecordWrite::Conflict(view) = write
                    && view.revision >= failure.record.revision
                {
                    failure.record = view.normalized();
                }
                self.advance_failure(io, failure)
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                if view.revision >= failure.record.revision {
                    failure.record = view.normalized();
                }
                failure.seen = true;
                self.advance_failure(io, failure)
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                failure.reset_done = true;
                let running = self.config.running.number;
                let given_up = self.model.as_ref().map(|model| model.agent_version);
                if let Some(model) = &mut self.model {
                    model.agent_version = running;
                }
                // News of the version given up (or an older one) is answered by this reset;
                // only a newer version, asked for meanwhile, is still to be acted on.
                if let (Some(news), Some(given_up)) = (self.agent_version_news, given_up)
                    && news <= given_up.max(running)
                {
                    self.agent_version_news = None;
                }
                self.advance_failure(io, failure)
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::ClearTrial)) =>
            {
                Transition(State::ready(Check::default()))
            }
            _ => Super,
        }
    }
}

impl std::hash::Hash for Machine {
    /// Everything but the registry, which is fixed for the life of the process.
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        self.config.hash(hasher);
        self.snapshot.hash(hasher);
        self.model.hash(hasher);
        self.pending.hash(hasher);
        self.gate.hash(hasher);
        self.upgrade_available.hash(hasher);
        self.mutations.hash(hasher);
        self.fell_back.hash(hasher);
        self.resume_switch.hash(hasher);
        self.fall_back_due.hash(hasher);
        self.watching.hash(hasher);
        self.record_seen.hash(hasher);
        self.agent_version_news.hash(hasher);
    }
}

impl Machine {
    pub(crate) fn new(
        config: Config,
        registry: Arc<StepRegistry>,
        snapshot: Option<Snapshot>,
    ) -> Machine {
        let snapshot = snapshot.unwrap_or_else(|| Snapshot::bootstrapped(&config.running));
        let retry_after = config.limits.retry_after;
        Machine {
            config,
            registry,
            snapshot,
            model: None,
            pending: None,
            gate: GateView {
                phase: Phase::Bootstrapping,
                progress: Progress::default(),
                retry_after,
            },
            upgrade_available: None,
            mutations: Mutations::default(),
            fell_back: None,
            resume_switch: None,
            fall_back_due: None,
            watching: false,
            record_seen: RecordView::default(),
            agent_version_news: None,
        }
    }

    fn before_dispatch(&mut self, _state: StateOrSuperstate<'_, State, Superstate>, event: &Event) {
        let view = match event {
            Event::SetMutations(mutations) => {
                self.mutations = *mutations;
                None
            }
            Event::Input(Input::AgentVersionChanged(version)) => {
                // Kept in every phase; Ready acts on it.
                self.agent_version_news = Some(*version);
                None
            }
            Event::Input(Input::RecordChanged(view))
            | Event::Input(Input::AgentVersionRefused { view, .. })
            | Event::Input(Input::RecordWritten {
                write: RecordWrite::Written(view) | RecordWrite::Conflict(view),
                ..
            }) => Some(view),
            _ => None,
        };
        if let Some(view) = view
            && view.revision >= self.record_seen.revision
        {
            self.record_seen = view.normalized();
        }
    }

    /// Publishes the new phase's gate and status *before* its entry actions run, so every
    /// request and status an entry makes is already marked with the phase it belongs to.
    ///
    /// statig 0.4.1 calls this hook with the target first and the source second (the
    /// trait's parameter names say otherwise); the names here say what is passed.
    fn before_transition(&mut self, target: &State, source: &State, io: &mut Io) {
        let (from, to) = (phase_of(source), phase_of(target));
        if from == to {
            return;
        }
        let progress = match target {
            State::RunningSteps { .. } => Progress {
                done: 0,
                total: self.current_plan(true).len() as u32,
                target: Some(self.config.running.number),
            },
            State::Upgrading { upgrade } => Progress {
                done: 0,
                total: 1,
                target: Some(upgrade.plan.binary.number),
            },
            _ => Progress::default(),
        };
        let message = match target {
            State::StepsFailed { held } => held.reason.clone(),
            State::UpgradeFailed { failure } => format!(
                "upgrade failed, staying on {}: {}",
                self.config.running.number, failure.reason
            ),
            _ => String::new(),
        };
        self.gate = self.view(to);
        self.gate.progress = progress;
        io.push(Output::Gate(self.gate));
        io.push(Output::Status(StatusReport {
            phase: to,
            progress,
            message,
        }));
    }

    /// Traces every phase change once it is complete (statig passes source, then target).
    fn after_transition(&mut self, source: &State, target: &State, _io: &mut Io) {
        let (from, to) = (phase_of(source), phase_of(target));
        if from != to {
            tracing::info!(target: "lockstep::lifecycle", from = %from, to = %to, "phase changed");
        }
    }

    // ---------------------------------------------------------------- requests and timers

    /// Subscribes to the upgrade-info record (the current view first, then every change).
    fn watch_record(&mut self, io: &mut Io) {
        self.watching = true;
        io.request_aside(Request::WatchRecord { after: Revision(0) });
    }

    /// Issues the main request; asserts none is in flight.
    fn request(&mut self, io: &mut Io, pending: Pending, request: Request) -> RequestId {
        assert!(
            self.pending.is_none(),
            "request {pending:?} while {:?} is in flight",
            self.pending
        );
        let id = io.next_id();
        if !io.exiting {
            self.pending = Some((id, pending));
        }
        io.emit_request(id, request);
        id
    }

    /// True (and clears it) when `id` completes the main request of this kind.
    fn completes(&mut self, id: RequestId, kind: Pending) -> bool {
        if self.pending == Some((id, kind)) {
            self.pending = None;
            true
        } else {
            false
        }
    }

    /// True (and clears it) when `id` completes the `agent-version` write in flight.
    fn completes_agent_version_write(&mut self, id: RequestId) -> bool {
        match self.pending {
            Some((pending_id, Pending::SetAgentVersion(_))) if pending_id == id => {
                self.pending = None;
                true
            }
            _ => false,
        }
    }

    /// Reads an input as what it means before any phase sees it: a refused `agent-version`
    /// write whose refusal found the model already holding the value asked for is a write
    /// done (Juju accepts the current value back; a store that refused it anyway, or a
    /// write another controller made first, leaves nothing to do). Every other input is
    /// itself.
    pub(crate) fn settle(&self, input: Input) -> Input {
        match input {
            Input::AgentVersionRefused {
                id, agent_version, ..
            } if self.pending == Some((id, Pending::SetAgentVersion(agent_version))) => {
                tracing::debug!(target: "lockstep::lifecycle", id = id.0, version = %agent_version, "agent-version write refused, but the model holds the value: done");
                Input::Done { id }
            }
            input => input,
        }
    }

    fn view(&self, phase: Phase) -> GateView {
        GateView {
            phase,
            progress: self.gate.progress,
            retry_after: self.config.limits.retry_after,
        }
    }

    fn status_message(&mut self, io: &mut Io, message: String) {
        tracing::info!(target: "lockstep::lifecycle", phase = %self.gate.phase, message = %message, "status");
        io.push(Output::Status(StatusReport {
            phase: self.gate.phase,
            progress: self.gate.progress,
            message,
        }));
    }

    fn set_progress(&mut self, io: &mut Io, done: u32) {
        if self.gate.progress.done != done {
            self.gate.progress.done = done;
            io.push(Output::Gate(self.gate));
        }
    }

    fn is_controller(&self) -> bool {
        self.config.controller.is_some() && self.config.roles.contains(Role::Controller)
    }

    fn me(&self) -> ControllerId {
        self.config.controller.expect("only controllers coordinate")
    }

    fn controllers(&self) -> ControllerSet {
        self.model
            .as_ref()
            .map(|model| model.controllers)
            .unwrap_or(ControllerSet::EMPTY)
    }

    /// True when the current record has every controller ready. Never true while the
    /// controllers are unknown (no model loaded): an empty set is covered by anything.
    fn all_ready(&self, view: &RecordView) -> bool {
        let all = self.controllers();
        match view.current {
            Some((record, _)) => !all.is_empty() && record.controllers_ready.covers(all),
            None => false,
        }
    }

    /// True when the current record is known not to have every controller ready: the
    /// condition under which archiving it as aborted proves no database step ran under it.
    /// False while the controllers are unknown.
    fn known_not_all_ready(&self, view: &RecordView) -> bool {
        let all = self.controllers();
        match view.current {
            Some((record, _)) => !all.is_empty() && !record.controllers_ready.covers(all),
            None => false,
        }
    }

    // ---------------------------------------------------------------- Bootstrapping

    /// Counts a boot of a binary on trial, or notices that the trial was abandoned.
    fn start_trial_accounting(&mut self, io: &mut Io) {
        let Some(trial) = &mut self.snapshot.trial else {
            return;
        };
        if trial.binary == self.config.running {
            trial.boots = trial.boots.saturating_add(1);
            io.set_timer(Timer::TrialReady, self.config.limits.trial_ready_timeout);
        } else if trial.boots == 0 && trial.switches < self.config.limits.trial_boots_max {
            // The switch was persisted but the new binary never counted a boot: the process
            // died before restarting (or the binary before starting). Try the switch again.
            trial.switches += 1;
            self.resume_switch = Some(trial.binary.clone());
        } else {
            self.fell_back = Some(format!(
                "agent binary {} did not come up; running {} again",
                trial.binary, self.config.running
            ));
        }
    }

    fn trial_exhausted(&mut self, io: &mut Io) -> Option<Outcome<State>> {
        let trial = self.snapshot.trial.as_ref()?;
        if trial.binary != self.config.running || trial.boots <= self.config.limits.trial_boots_max
        {
            return None;
        }
        self.trial_over_while_booting(io, FallBackCause::BootsExhausted)
    }

    /// What a cause of giving up a trial says, for status and held reasons.
    fn fall_back_reason(&self, cause: FallBackCause) -> String {
        let running = &self.config.running;
        match cause {
            FallBackCause::TimedOut => format!(
                "agent binary {running} did not reach Ready within {}",
                self.config.limits.trial_ready_timeout
            ),
            FallBackCause::BootsExhausted => {
                let boots = self.snapshot.trial.as_ref().map_or(0, |trial| trial.boots);
                format!("agent binary {running} booted {boots} times without reaching Ready")
            }
            FallBackCause::Operator => {
                format!("upgrade to {} aborted by the operator", running.number)
            }
        }
    }

    /// The trial is over while Bootstrapping. An agent that is not a controller decides
    /// now. A controller decides once the model is loaded (it must know the controllers to
    /// read the record, and never leaves Bootstrapping without them): held then if its
    /// snapshot says falling back is unsafe, otherwise RunningSteps reads the upgrade-info
    /// record and retires it before falling back. `None`: bootstrapping goes on.
    fn trial_over_while_booting(
        &mut self,
        io: &mut Io,
        cause: FallBackCause,
    ) -> Option<Outcome<State>> {
        let reason = self.fall_back_reason(cause);
        if !self.is_controller() {
            return Some(self.fall_back(io, reason));
        }
        if self.fall_back_due.is_none() {
            self.fall_back_due = Some(cause);
            self.status_message(
                io,
                format!("{reason}; deciding once the model and the upgrade-info record are read"),
            );
        }
        None
    }

    fn trial_timed_out(&mut self, io: &mut Io) -> Outcome<State> {
        let reason = self.fall_back_reason(FallBackCause::TimedOut);
        self.fall_back(io, reason)
    }

    /// True when the local snapshot allows falling back: a trial whose version's database
    /// steps this agent never ran or observed as run (as far as it persisted), whose steps
    /// are not recorded as done, with a previous binary to return to. A controller also
    /// needs the store's word (see [`Machine::database_steps_evidence`]).
    fn fall_back_locally_safe(&self) -> bool {
        let upgraded_to = self.snapshot.upgraded_to_version;
        self.snapshot
            .trial
            .as_ref()
            .is_some_and(|trial| !trial.past_database_steps && upgraded_to < trial.binary.number)
            && self.snapshot.previous.is_some()
    }

    /// Falls back to the previous binary if no step of the new version has run; otherwise
    /// holds (rolling back after database steps is unsafe).
    ///
    /// Only for agents whose fall back needs no store check: agents other than controllers,
    /// and controllers whose snapshot already says it is unsafe. A controller that could
    /// fall back goes through the record first ([`AbortReason::FallBack`] in RunningSteps,
    /// [`HeldIntent::FallBack`] in StepsFailed); one that reaches here anyway is held.
    fn fall_back(&mut self, io: &mut Io, reason: String) -> Outcome<State> {
        // Safe only while the previous binary would find the state it left: no database
        // step of the new version ran, and the new version's steps are not recorded as done.
        if !self.fall_back_locally_safe() {
            return Transition(State::steps_failed(Held::new(
                format!(
                    "{reason}; the new version's steps already ran, so it is held here \
                     rather than rolled back"
                ),
                RecordView::default(),
            )));
        }
        if self.is_controller() {
            return Transition(State::steps_failed(Held::new(
                format!(
                    "{reason}; held: a controller falls back only once the upgrade-info \
                     record says no database step of the new version ran"
                ),
                RecordView::default(),
            )));
        }
        if let Some((_, pending)) = self.pending
            && pending.writes_shared_state()
        {
            // A write in flight may still land: falling back now could leave its effect
            // behind (a record re-created after it was archived). Decide again shortly.
            self.status_message(
                io,
                format!("{reason}; falling back once {pending:?} completes"),
            );
            io.set_timer(Timer::TrialReady, self.config.limits.retry_after);
            return Handled;
        }
        self.fall_back_now(io, reason);
        Handled
    }

    /// Persists the snapshot and, once it is durable, restarts into the previous binary.
    /// The caller has decided that falling back is safe and that no write is in flight.
    fn fall_back_now(&mut self, io: &mut Io, reason: String) {
        self.status_message(io, format!("{reason}; falling back"));
        // A read awaited no longer matters (a hung store is a reason to fall back): its
        // completion, if it ever comes, is stale.
        self.pending = None;
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(PersistFor::FallBack),
            Request::PersistSnapshot(snapshot),
        );
    }

    /// Whether the store says database steps of the trial version may have run: the
    /// record of this upgrade (`upgradedToVersion` → the trial's version) current and all
    /// controllers ready or past pending (the coordinator runs database steps once every
    /// controller is ready), or archived complete, or archived aborted with every
    /// controller ready. A record archived aborted while some controller was not ready
    /// proves that no database step ran under it: `controllers-ready` only grows, and every
    /// change, the abort included, is a compare-and-set.
    fn database_steps_evidence(&self, view: &RecordView) -> Option<String> {
        let trial = self.snapshot.trial.as_ref()?;
        let (from, to) = (self.snapshot.upgraded_to_version, trial.binary.number);
        let all = self.controllers();
        if let Some((record, _)) = view.current
            && record.describes(from, to)
            && (record.status != UpgradeStatus::Pending || record.controllers_ready.covers(all))
        {
            return Some(format!(
                "the upgrade-info record {from} -> {to} is {} with controllers ready {:?} of \
                 {all:?}",
                record.status, record.controllers_ready
            ));
        }
        if let Some(last) = view.last_archived
            && last.describes(from, to)
            && (last.status == UpgradeStatus::Complete
                || (last.status == UpgradeStatus::Aborted && last.controllers_ready.covers(all)))
        {
            return Some(format!(
                "the upgrade-info record {from} -> {to} was archived {} with controllers ready \
                 {:?} of {all:?}",
                last.status, last.controllers_ready
            ));
        }
        None
    }

    /// Records in the snapshot that database steps of the trial version may have run, so
    /// that no later decision falls back on a view that no longer shows it (the store keeps
    /// only the last archived record). Persisted when nothing else is in flight; otherwise
    /// the next persisted snapshot carries it.
    fn remember_database_steps(&mut self, io: &mut Io) {
        let Some(trial) = &mut self.snapshot.trial else {
            return;
        };
        if trial.past_database_steps {
            return;
        }
        trial.past_database_steps = true;
        if self.pending.is_none() {
            let snapshot = self.snapshot.clone();
            self.request(
                io,
                Pending::Persist(PersistFor::PastDatabaseSteps),
                Request::PersistSnapshot(snapshot),
            );
        }
    }

    /// The last word of a controller's fall back, given a fresh view of the record of its
    /// upgrade (no longer current, or not abortable): hold if the store says database steps
    /// of the trial version may have run, otherwise fall back.
    fn fall_back_after_store_check(
        &mut self,
        io: &mut Io,
        cause: FallBackCause,
        view: &RecordView,
    ) -> Option<State> {
        let reason = self.fall_back_reason(cause);
        if let Some(evidence) = self.database_steps_evidence(view) {
            self.remember_database_steps(io);
            return Some(State::steps_failed(Held::new(
                format!(
                    "{reason}; {evidence}: database steps of {} may have run, so it is held \
                     here rather than rolled back",
                    self.config.running.number
                ),
                *view,
            )));
        }
        self.fall_back_now(io, reason);
        None
    }

    fn restart_into_previous(&mut self, io: &mut Io) {
        if let Some(previous) = self.snapshot.previous.clone() {
            io.exit_into(previous);
        }
    }

    fn leave_bootstrapping(&mut self) -> Outcome<State> {
        let fall_back_due = self.fall_back_due.take();
        let upgraded_to = self.snapshot.upgraded_to_version;
        let running = self.config.running.number;
        // Checked before a fall back is honoured: an older binary must never serve state
        // that a newer one already migrated.
        if let Some(reason) = &self.fell_back
            && self
                .snapshot
                .trial
                .as_ref()
                .is_some_and(|trial| trial.past_database_steps)
        {
            return Transition(State::steps_failed(Held::new(
                format!(
                    "{reason}, but database steps of the new version already ran: {running} \
                     must not serve the migrated store; install the new version again"
                ),
                RecordView::default(),
            )));
        }
        if upgraded_to <= running
            && let Some(reason) = self.fell_back.take()
        {
            return Transition(State::upgrade_failed(Failure::new(reason)));
        }
        if upgraded_to > running {
            return Transition(State::steps_failed(Held::new(
                format!(
                    "agent binary {running} is older than upgradedToVersion {upgraded_to}; \
                     install {upgraded_to} or newer"
                ),
                RecordView::default(),
            )));
        }
        if let Some(cause) = fall_back_due
            && !self.fall_back_locally_safe()
        {
            return Transition(State::steps_failed(Held::new(
                format!(
                    "{}; the new version's steps already ran, so it is held here rather \
                     than rolled back",
                    self.fall_back_reason(cause)
                ),
                RecordView::default(),
            )));
        }
        if upgraded_to < running {
            // A trial that is over goes through RunningSteps all the same: that is where
            // the record is read and retired before the fall back (or held, if the store
            // says database steps of this version may have run).
            return Transition(State::running_steps(Steps {
                abort: fall_back_due.map(AbortReason::FallBack),
                ..Steps::default()
            }));
        }
        Transition(State::checking_agent_version(Check::default()))
    }

    // ---------------------------------------------------------------- RunningSteps

    fn current_plan(&self, coordinator: bool) -> steps::Plan {
        steps::plan(
            &self.registry,
            self.snapshot.upgraded_to_version,
            self.config.running.number,
            self.config.roles,
            coordinator && self.is_controller(),
        )
    }

    fn lease_answered(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        id: RequestId,
        lease: Option<LeaseToken>,
    ) {
        if steps.keepalive == Some(id) {
            steps.keepalive = None;
            io.cancel_timer(Timer::LeaseDeadline);
            match lease {
                Some(token) if steps.lease == LeaseState::Held(token) => {
                    io.set_timer(
                        Timer::LeaseKeepAlive,
                        self.config.limits.lease_keepalive_interval,
                    );
                }
                _ => self.lose_lease(io, steps),
            }
            return;
        }
        if steps.lease != LeaseState::Asking(id) {
            return;
        }
        match lease {
            Some(token) => {
                tracing::info!(target: "lockstep::lifecycle", token = token.0, "coordinator lease acquired");
                steps.lease = LeaseState::Held(token);
                io.set_timer(
                    Timer::LeaseKeepAlive,
                    self.config.limits.lease_keepalive_interval,
                );
            }
            None => {
                steps.lease = LeaseState::Free;
                steps.lease_wait = true;
                io.set_timer(Timer::LeaseRetry, self.config.limits.lease_retry_delay);
            }
        }
    }

    fn lose_lease(&mut self, io: &mut Io, steps: &mut Steps) {
        if matches!(steps.lease, LeaseState::Held(_)) {
            tracing::warn!(target: "lockstep::lifecycle", "coordinator lease lost; no longer coordinating");
        }
        steps.lease = LeaseState::Free;
        steps.keepalive = None;
        steps.lease_wait = true;
        io.cancel_timer(Timer::LeaseKeepAlive);
        io.cancel_timer(Timer::LeaseDeadline);
        io.set_timer(Timer::LeaseRetry, self.config.limits.lease_retry_delay);
    }

    fn step_finished(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        id: RequestId,
        outcome: &StepOutcome,
    ) -> Option<State> {
        let kind = match self.pending {
            Some((pending_id, kind @ (Pending::DatabaseStep(_) | Pending::HostStep(_))))
                if pending_id == id =>
            {
                kind
            }
            _ => return None,
        };
        self.pending = None;
        match (kind, outcome) {
            (Pending::DatabaseStep(_), StepOutcome::Applied | StepOutcome::AlreadyApplied) => {
                steps.database_next += 1;
                steps.attempts = 0;
                None
            }
            (Pending::HostStep(index), StepOutcome::Applied | StepOutcome::AlreadyApplied) => {
                steps.attempts = 0;
                if self.mutations.checkpoint_before_effects {
                    return None; // planted defect: the checkpoint was already written
                }
                self.persist_host_checkpoint(io, index);
                None
            }
            (_, StepOutcome::Fenced) => {
                self.lose_lease(io, steps);
                None
            }
            (_, StepOutcome::Failed(reason)) => {
                steps.attempts += 1;
                let target = self.config.running.number;
                if steps.attempts >= self.config.limits.step_attempts_max {
                    return Some(State::steps_failed(Held::new(
                        format!("upgrade to {target} failed (giving up): {reason}"),
                        steps.record,
                    )));
                }
                self.status_message(
                    io,
                    format!("upgrade to {target} failed (will retry): {reason}"),
                );
                steps.retry_wait = true;
                io.set_timer(Timer::StepRetry, self.config.limits.step_retry_delay);
                None
            }
            _ => None,
        }
    }

    fn steps_done(&mut self, io: &mut Io, id: RequestId) -> Option<State> {
        let (pending_id, kind) = self.pending?;
        if pending_id != id {
            return None;
        }
        self.pending = None;
        match kind {
            Pending::Persist(PersistFor::UpgradedTo) => {
                Some(State::checking_agent_version(Check::default()))
            }
            Pending::Capabilities => {
                self.persist_upgraded_to(io);
                None
            }
            Pending::Persist(PersistFor::FallBack) => {
                self.restart_into_previous(io);
                None
            }
            Pending::Persist(PersistFor::HostCheckpoint(index))
                if self.mutations.checkpoint_before_effects =>
            {
                // Planted defect: the step runs only after its checkpoint is durable.
                let key = self.registry.key(index);
                self.request(
                    io,
                    Pending::HostStep(index),
                    Request::RunStep {
                        step: index,
                        key,
                        fence: None,
                    },
                );
                None
            }
            // Persisted checkpoints and markers: the reconcile that follows goes on.
            _ => None,
        }
    }

    /// Archives `record` (current at `revision`) as aborted, by compare-and-set.
    fn abort_record(&mut self, io: &mut Io, record: UpgradeInfo, revision: Revision) {
        let aborted = UpgradeInfo {
            status: UpgradeStatus::Aborted,
            ..record
        };
        self.write_record(io, revision, aborted, None);
    }

    /// Compare-and-set of the upgrade-info record on `expected`, fenced when `fence` is set.
    fn write_record(
        &mut self,
        io: &mut Io,
        expected: Revision,
        record: UpgradeInfo,
        fence: Option<LeaseToken>,
    ) {
        self.request(
            io,
            Pending::RecordWrite,
            Request::UpdateRecord {
                expected,
                record,
                fence,
            },
        );
    }

    fn persist_host_checkpoint(&mut self, io: &mut Io, index: StepIndex) {
        let key = self.registry.key(index);
        if !self.snapshot.host_checkpoints.contains(&key) {
            self.snapshot.host_checkpoints.push(key);
        }
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(PersistFor::HostCheckpoint(index)),
            Request::PersistSnapshot(snapshot),
        );
    }

    fn persist_upgraded_to(&mut self, io: &mut Io) {
        self.snapshot.upgraded_to_version = self.config.running.number;
        self.snapshot.host_checkpoints.clear();
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(PersistFor::UpgradedTo),
            Request::PersistSnapshot(snapshot),
        );
    }

    /// Issues the next request RunningSteps needs, or returns the phase to go to. Called
    /// after every event of the phase: the decision depends only on what is known now.
    fn reconcile_steps(&mut self, io: &mut Io, steps: &mut Steps) -> Option<State> {
        if self.pending.is_some() || steps.finishing {
            return None;
        }
        if !self.is_controller() {
            return self.next_host_step(io, steps, None);
        }
        let me = self.me();
        let (from, to) = (
            self.snapshot.upgraded_to_version,
            self.config.running.number,
        );
        if !steps.watching {
            steps.watching = true;
            self.watch_record(io);
            return None;
        }
        if !steps.seen_record {
            return None;
        }
        let fall_back = match steps.abort {
            Some(AbortReason::FallBack(cause)) => Some(cause),
            _ => None,
        };
        let Some((record, revision)) = steps.record.current else {
            if let Some(last) = steps.record.last_archived
                && last.describes(from, to)
            {
                if last.controllers_done.contains(me) {
                    // Finished here already, whatever became of the record afterwards (a
                    // trial that is over included): go on to Ready.
                    return self.finish_steps(io, steps);
                }
                if last.status == UpgradeStatus::Aborted && !steps.retrying && fall_back.is_none() {
                    if self.database_steps_evidence(&steps.record).is_some() {
                        self.remember_database_steps(io);
                    }
                    return Some(State::steps_failed(Held::new(
                        format!("upgrade from {from} to {to} was aborted"),
                        steps.record,
                    )));
                }
            }
            if let Some(cause) = fall_back {
                return self.fall_back_after_store_check(io, cause, &steps.record);
            }
            if let Some(reason) = steps.abort {
                return Some(self.held_after_abort(reason, steps));
            }
            // Created with nobody ready: every controller, this one included, registers by
            // compare-and-set, so a create that lands late (a driver's retry, a duplicate)
            // can never count a controller as ready that is not.
            let record = UpgradeInfo {
                previous_version: from,
                target_version: to,
                status: UpgradeStatus::Pending,
                controllers_ready: ControllerSet::EMPTY,
                controllers_done: ControllerSet::EMPTY,
            };
            self.request(io, Pending::RecordWrite, Request::CreateRecord(record));
            return None;
        };
        if !record.describes(from, to) {
            if let Some(cause) = fall_back {
                // Not this trial's record: the store check reads the archived one.
                return self.fall_back_after_store_check(io, cause, &steps.record);
            }
            if record.status == UpgradeStatus::Pending
                && !record.controllers_ready.contains(me)
                && self.known_not_all_ready(&steps.record)
            {
                // Doomed: this controller never registers in another upgrade's record, so
                // it can never have every controller ready, and no database step ran under
                // it. Archive it (compare-and-set), then create this upgrade's own.
                self.status_message(
                    io,
                    format!(
                        "archiving a stale upgrade-info record {} -> {} (pending, ready {:?} \
                         of {:?}) as aborted",
                        record.previous_version,
                        record.target_version,
                        record.controllers_ready,
                        self.controllers()
                    ),
                );
                self.abort_record(io, record, revision);
                return None;
            }
            return Some(State::steps_failed(Held::new(
                format!(
                    "current upgrade info mismatch: expected {from} -> {to}, found {} -> {} \
                     ({}); abort it or finish it first",
                    record.previous_version, record.target_version, record.status
                ),
                steps.record,
            )));
        }
        // A retry overrides the abort archived before it; once this upgrade has a record
        // again, a later abort stops it like any other.
        steps.retrying = false;
        if let Some(cause) = fall_back {
            if record.status == UpgradeStatus::Pending && self.known_not_all_ready(&steps.record) {
                // Not every controller is ready, so no database step ran: archive the record
                // as aborted. The compare-and-set succeeding proves it stayed so; a conflict
                // brings a newer view, and the decision is taken again.
                self.abort_record(io, record, revision);
                return None;
            }
            return self.fall_back_after_store_check(io, cause, &steps.record);
        }
        if let Some(reason) = steps.abort {
            if reason == AbortReason::WaitTimedOut && self.all_ready(&steps.record) {
                // Every controller registered after all (the timer fired on an older view).
                steps.abort = None;
            } else {
                self.abort_record(io, record, revision);
                return None;
            }
        }
        if !record.controllers_ready.contains(me) {
            let registered = UpgradeInfo {
                controllers_ready: record.controllers_ready.with(me),
                ..record
            };
            self.write_record(io, revision, registered, None);
            return None;
        }
        if !self.all_ready(&steps.record) {
            if io.timers[Timer::ControllersWait as usize].is_none() {
                io.set_timer(Timer::ControllersWait, self.config.limits.controllers_wait);
                self.status_message(
                    io,
                    format!(
                        "waiting for controllers: ready {:?} of {:?}",
                        record.controllers_ready,
                        self.controllers()
                    ),
                );
            }
            return None;
        }
        io.cancel_timer(Timer::ControllersWait);
        // Every controller is ready: the coordinator may run database steps from now on, so
        // falling back is no longer safe for a binary on trial. Persisted before anything
        // else happens here.
        if self.mark_past_database_steps(io) {
            return None;
        }
        if steps.retry_wait {
            return None;
        }
        match record.status {
            UpgradeStatus::Pending => {
                let token = match steps.lease {
                    LeaseState::Held(token) => token,
                    LeaseState::Free if !steps.lease_wait => {
                        let id = io.request_aside(Request::AcquireLease);
                        steps.lease = LeaseState::Asking(id);
                        return None;
                    }
                    _ => return None,
                };
                let plan = self.current_plan(true);
                self.set_progress(io, u32::from(steps.database_next));
                let fence = if self.mutations.unfenced_coordinator {
                    None
                } else {
                    Some(token)
                };
                if let Some(&index) = plan.database().get(usize::from(steps.database_next)) {
                    let key = self.registry.key(index);
                    self.request(
                        io,
                        Pending::DatabaseStep(index),
                        Request::RunStep {
                            step: index,
                            key,
                            fence,
                        },
                    );
                    return None;
                }
                let complete = UpgradeInfo {
                    status: UpgradeStatus::DbComplete,
                    ..record
                };
                self.write_record(io, revision, complete, fence);
                None
            }
            UpgradeStatus::DbComplete => {
                let running = UpgradeInfo {
                    status: UpgradeStatus::Running,
                    ..record
                };
                self.write_record(io, revision, running, None);
                None
            }
            UpgradeStatus::Running => {
                if let Some(state) = self.next_host_step(io, steps, Some((record, revision))) {
                    return Some(state);
                }
                None
            }
            UpgradeStatus::Complete | UpgradeStatus::Aborted => {
                unreachable!("views are normalized on receipt: a final record is never current")
            }
        }
    }

    /// Before this agent runs (or relies on) database steps of a trial binary, or once it
    /// saw every controller ready (the coordinator may then run them), persist that falling
    /// back is no longer safe. True while that write is in flight.
    fn mark_past_database_steps(&mut self, io: &mut Io) -> bool {
        match &mut self.snapshot.trial {
            Some(trial) if trial.binary == self.config.running && !trial.past_database_steps => {
                trial.past_database_steps = true;
                let snapshot = self.snapshot.clone();
                self.request(
                    io,
                    Pending::Persist(PersistFor::PastDatabaseSteps),
                    Request::PersistSnapshot(snapshot),
                );
                true
            }
            _ => false,
        }
    }

    /// Runs the next host step not yet checkpointed; when none is left, marks this
    /// controller done in the record (archiving it if last) or finishes.
    fn next_host_step(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        record: Option<(UpgradeInfo, Revision)>,
    ) -> Option<State> {
        let plan = self.current_plan(false);
        // Progress counts the upgrade's database steps too, whoever runs them.
        let database_total = self.current_plan(true).database().len();
        let remaining: Vec<StepIndex> = plan
            .host()
            .iter()
            .copied()
            .filter(|&index| {
                !self
                    .snapshot
                    .host_checkpoints
                    .contains(&self.registry.key(index))
            })
            .collect();
        let done = plan.host().len() - remaining.len();
        self.set_progress(io, (database_total + done) as u32);
        let skip_last = self.mutations.upgraded_to_with_step_missing && remaining.len() == 1;
        if let (Some(&index), false) = (remaining.first(), skip_last) {
            let key = self.registry.key(index);
            if self.mutations.checkpoint_before_effects {
                // Planted defect: the checkpoint is made durable before the step ran.
                self.snapshot.host_checkpoints.push(key);
                let snapshot = self.snapshot.clone();
                self.request(
                    io,
                    Pending::Persist(PersistFor::HostCheckpoint(index)),
                    Request::PersistSnapshot(snapshot),
                );
                return None;
            }
            self.request(
                io,
                Pending::HostStep(index),
                Request::RunStep {
                    step: index,
                    key,
                    fence: None,
                },
            );
            return None;
        }
        if let Some((record, revision)) = record {
            let me = self.me();
            if !record.controllers_done.contains(me) {
                let done = record.controllers_done.with(me);
                let all = self.controllers();
                let status = if !all.is_empty() && done.covers(all) {
                    UpgradeStatus::Complete
                } else {
                    record.status
                };
                let next = UpgradeInfo {
                    controllers_done: done,
                    status,
                    ..record
                };
                self.write_record(io, revision, next, None);
                return None;
            }
        }
        self.finish_steps(io, steps)
    }

    /// The end of an upgrade's steps: rediscover capabilities (controllers), then advance
    /// `upgradedToVersion`.
    fn finish_steps(&mut self, io: &mut Io, steps: &mut Steps) -> Option<State> {
        steps.finishing = true;
        if let LeaseState::Held(token) = steps.lease {
            steps.lease = LeaseState::Free;
            steps.keepalive = None;
            io.cancel_timer(Timer::LeaseKeepAlive);
            io.cancel_timer(Timer::LeaseDeadline);
            io.request_aside(Request::ReleaseLease(token));
        }
        if self.is_controller() {
            self.request(io, Pending::Capabilities, Request::RefreshCapabilities);
        } else {
            self.persist_upgraded_to(io);
        }
        None
    }

    fn held_after_abort(&mut self, reason: AbortReason, steps: &Steps) -> State {
        let text = match reason {
            AbortReason::WaitTimedOut => format!(
                "upgrade to {} aborted: timed out after {} waiting for controllers (ready {:?} of {:?})",
                self.config.running.number,
                self.config.limits.controllers_wait,
                // The record as this controller last saw it: the abort may have archived it.
                steps
                    .record
                    .current
                    .map(|(record, _)| record)
                    .or(steps.record.last_archived)
                    .map(|record| record.controllers_ready)
                    .unwrap_or_default(),
                self.controllers()
            ),
            AbortReason::Operator => format!(
                "upgrade to {} aborted by the operator",
                self.config.running.number
            ),
            AbortReason::FallBack(cause) => self.fall_back_reason(cause),
        };
        State::steps_failed(Held::new(text, steps.record))
    }

    /// Works on what a held agent intends: for a controller, first a fresh view of the
    /// record, then the operator's abort (archive the current record), then the fall back
    /// (retire this upgrade's record while no database step can have run under it, and
    /// fall back unless the store says database steps of this version may have run).
    fn advance_held(&mut self, io: &mut Io, held: &mut Held) -> Outcome<State> {
        let Some(intent) = held.intent else {
            return Handled;
        };
        if self.pending.is_some() {
            return Handled;
        }
        if !self.is_controller() {
            // No record to consult: the snapshot decides.
            held.intent = None;
            return self.abort_held(io, held);
        }
        let fall_back_possible = self.fall_back_locally_safe()
            && self
                .snapshot
                .trial
                .as_ref()
                .is_some_and(|trial| trial.binary == self.config.running);
        if let HeldIntent::FallBack(cause) = intent
            && !fall_back_possible
        {
            held.intent = None;
            held.reason = format!(
                "{}; {}",
                self.fall_back_reason(cause),
                self.why_no_fall_back()
            );

            let message = held.reason.clone();
            self.status_message(io, message);
            return Handled;
        }
        if !held.seen {
            if !held.watching {
                held.watching = true;
                self.watch_record(io);
            }
            return Handled;
        }
        let cause = match intent {
            HeldIntent::OperatorAbort => {
                if let Some((record, revision)) = held.record.current {
                    // The operator's word: archived as aborted whatever its status.
                    self.abort_record(io, record, revision);
                    return Handled;
                }
                held.intent = Some(HeldIntent::FallBack(FallBackCause::Operator));
                held.reason = self.fall_back_reason(FallBackCause::Operator);
                if !fall_back_possible {
                    held.intent = None;
                    held.reason = format!("{}; {}", held.reason, self.why_no_fall_back());
                    let message = held.reason.clone();
                    self.status_message(io, message);
                    return Handled;
                }
                FallBackCause::Operator
            }
            HeldIntent::FallBack(cause) => cause,
        };
        let from = self.snapshot.upgraded_to_version;
        let to = self.config.running.number;
        if let Some((record, revision)) = held.record.current
            && record.describes(from, to)
            && record.status == UpgradeStatus::Pending
            && self.known_not_all_ready(&held.record)
        {
            // Retire it first: the compare-and-set proves no database step ran under it.
            self.abort_record(io, record, revision);
            return Handled;
        }
        held.intent = None;
        let view = held.record;
        match self.fall_back_after_store_check(io, cause, &view) {
            Some(State::StepsFailed { held: hold }) => {
                held.reason = hold.reason;
                let message = held.reason.clone();
                self.status_message(io, message);
                Handled
            }
            Some(other) => Transition(other),
            None => Handled,
        }
    }

    fn why_no_fall_back(&self) -> &'static str {
        match &self.snapshot.trial {
            Some(trial) if trial.binary == self.config.running => {
                "the new version's steps already ran, so it is held here rather than rolled back"
            }
            _ => "held: no binary on trial here to fall back from",
        }
    }

    /// Abort while held, for an agent with no record to consult: fall back to the previous
    /// binary when the snapshot says it is safe, else stay held.
    fn abort_held(&mut self, io: &mut Io, held: &mut Held) -> Outcome<State> {
        held.reason = format!(
            "upgrade to {} aborted by the operator",
            self.config.running.number
        );
        let rollback_safe =
            self.snapshot.trial.as_ref().is_some_and(|trial| {
                !trial.past_database_steps && trial.binary == self.config.running
            });
        if rollback_safe {
            let reason = held.reason.clone();
            return self.fall_back(io, reason);
        }
        let message = held.reason.clone();
        self.status_message(io, message);
        Handled
    }

    // ---------------------------------------------------------------- agent version

    fn occasion(&self) -> OccasionKey {
        let desired = self.model.as_ref().map(|model| model.agent_version);
        match desired {
            _ if !self.snapshot.bootstrap_complete => OccasionKey::Bootstrap,
            Some(version) if version != self.config.running.number => {
                OccasionKey::Operator(Some(version))
            }
            _ => OccasionKey::Periodic,
        }
    }

    /// True when staying on the running version would disobey the model.
    fn must_upgrade(&self) -> bool {
        match &self.model {
            Some(model) => {
                model.agent_version != self.config.running.number
                    || matches!(model.policy, policy::UpgradePolicy::Pinned(version) if version != self.config.running.number)
            }
            None => false,
        }
    }

    fn start_check(&mut self, io: &mut Io) {
        if self.is_controller() {
            let stream = self.model.as_ref().and_then(|model| model.stream);
            let streams = Stream::preferred(stream, &self.config.running.number);
            self.request(io, Pending::Catalogue, Request::LookupCatalogue { streams });
        } else {
            self.request(io, Pending::DesiredBinary, Request::DesiredBinary);
        }
    }

    #[expect(
        clippy::result_large_err,
        reason = "policy errors carry the binaries they name; built once per check"
    )]
    fn select(
        &self,
        occasion: OccasionKey,
        catalogue: &policy::Catalogue,
    ) -> Result<Decision, policy::PolicyError> {
        let default_model;
        let model = match &self.model {
            Some(model) => model,
            None => {
                default_model = ModelView {
                    agent_version: self.config.running.number,
                    policy: policy::UpgradePolicy::Off,
                    stream: None,
                    controllers: ControllerSet::EMPTY,
                };
                &default_model
            }
        };
        policy::select(
            &SelectionRequest {
                running: &self.config.running,
                policy: &model.policy,
                stream: model.stream,
                occasion: occasion.occasion(),
            },
            catalogue,
        )
    }

    fn decide(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        catalogue: &policy::Catalogue,
    ) -> Outcome<State> {
        let occasion = check.occasion.unwrap_or(OccasionKey::Periodic);
        match self.select(occasion, catalogue) {
            Ok(Decision::Stay { upgrade_available }) => {
                if self.must_upgrade() {
                    let reason = format!(
                        "agent-version {} cannot be installed: no matching agent binary",
                        self.model
                            .as_ref()
                            .map(|model| model.agent_version)
                            .unwrap_or(self.config.running.number)
                    );
                    return Transition(State::upgrade_failed(Failure::new(reason)));
                }
                if upgrade_available != self.upgrade_available {
                    self.upgrade_available = upgrade_available;
                    self.request(
                        io,
                        Pending::Report,
                        Request::ReportUpgradeAvailable(upgrade_available),
                    );
                    return Handled;
                }
                Transition(State::ready(Check::default()))
            }
            Ok(decision) => {
                let plan = stage_plan(decision);
                let version = plan.binary.number;
                check.chosen = Some(plan);
                if self.model.as_ref().map(|model| model.agent_version) != Some(version) {
                    self.request(
                        io,
                        Pending::SetAgentVersion(version),
                        Request::SetAgentVersion(version),
                    );
                    return Handled;
                }
                let plan = check.chosen.take().expect("just chosen");
                Transition(State::upgrading(Upgrade::new(plan, false)))
            }
            Err(error) => {
                let reason = error.to_string();
                Transition(State::upgrade_failed(Failure::new(reason)))
            }
        }
    }

    fn request_upgrade(&mut self, io: &mut Io, check: &mut Check, version: Option<Version>) {
        if self.pending.is_some() || check.chosen.is_some() {
            self.status_message(io, "an upgrade check is already in progress".to_owned());
            return;
        }
        check.occasion = Some(OccasionKey::Operator(version));
        self.start_check(io);
    }

    fn decide_in_ready(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        catalogue: &policy::Catalogue,
    ) -> Outcome<State> {
        let occasion = check.occasion.take().unwrap_or(OccasionKey::Periodic);
        match self.select(occasion, catalogue) {
            Ok(Decision::Stay { upgrade_available }) => {
                if upgrade_available != self.upgrade_available {
                    self.upgrade_available = upgrade_available;
                    self.request(
                        io,
                        Pending::Report,
                        Request::ReportUpgradeAvailable(upgrade_available),
                    );
                }
                Handled
            }
            Ok(decision) => {
                let plan = stage_plan(decision);
                let version = plan.binary.number;
                check.chosen = Some(plan.clone());
                if self.model.as_ref().map(|model| model.agent_version) != Some(version) {
                    self.request(
                        io,
                        Pending::SetAgentVersion(version),
                        Request::SetAgentVersion(version),
                    );
                } else {
                    self.request(io, Pending::Stage, Request::StageBinary(plan));
                }
                Handled
            }
            Err(error) => {
                self.status_message(io, format!("upgrade not started: {error}"));
                Handled
            }
        }
    }

    /// Ready's own handling of an event; [`Machine::ready`] then retires a doomed record.
    fn ready_event(&mut self, io: &mut Io, check: &mut Check, event: &Event) -> Outcome<State> {
        match event {
            Event::Timer(Timer::CatalogueCheck) => {
                io.set_timer(
                    Timer::CatalogueCheck,
                    self.config.limits.catalogue_check_interval,
                );
                // Not while an upgrade is chosen: its staging (or its retry) comes first.
                if self.pending.is_none() && check.chosen.is_none() {
                    check.occasion = Some(OccasionKey::Periodic);
                    self.start_check(io);
                }
                Handled
            }
            Event::Timer(Timer::StageRetry) if check.stage_retry_wait => {
                match (&check.chosen, self.pending) {
                    (Some(plan), None) => {
                        check.stage_retry_wait = false;
                        let plan = plan.clone();
                        self.request(io, Pending::Stage, Request::StageBinary(plan));
                    }
                    // Another request first (a record to retire): try again after it.
                    (Some(_), Some(_)) => {
                        io.set_timer(Timer::StageRetry, self.config.limits.stage_retry_delay);
                    }
                    (None, _) => check.stage_retry_wait = false,
                }
                Handled
            }
            Event::Input(Input::UpgradeRequested { version }) => {
                self.request_upgrade(io, check, *version);
                Handled
            }
            // Kept by `before_dispatch`; `act_on_agent_version_news` acts on it.
            Event::Input(Input::AgentVersionChanged(_)) => Handled,
            Event::Input(Input::CatalogueFound { id, result })
                if self.completes(*id, Pending::Catalogue) =>
            {
                match result {
                    Ok(catalogue) => self.decide_in_ready(io, check, catalogue),
                    Err(reason) => {
                        self.status_message(io, format!("agent binary lookup failed: {reason}"));
                        Handled
                    }
                }
            }
            Event::Input(Input::DesiredBinary { id, plan })
                if self.completes(*id, Pending::DesiredBinary) =>
            {
                if let Some(reason) = self.refuse_downgrade(plan) {
                    self.status_message(io, reason);
                } else if plan.binary.number != self.config.running.number {
                    check.chosen = Some(plan.clone());
                    self.request(io, Pending::Stage, Request::StageBinary(plan.clone()));
                }
                Handled
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                if check.resetting {
                    check.resetting = false;
                    let running = self.config.running.number;
                    if let Some(model) = &mut self.model {
                        model.agent_version = running;
                    }
                    self.status_message(io, format!("agent-version reset to {running}"));
                    return Handled;
                }
                // Pre-stage while still Ready: the gate closes only once the binary is verified.
                if let Some(plan) = check.chosen.clone() {
                    if let Some(model) = &mut self.model {
                        model.agent_version = plan.binary.number;
                    }
                    self.request(io, Pending::Stage, Request::StageBinary(plan));
                }
                Handled
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                if check.resetting {
                    check.resetting = false;
                    self.status_message(
                        io,
                        format!(
                            "agent-version not reset to {}: {}",
                            self.config.running.number,
                            refusal_reason(&view.normalized())
                        ),
                    );
                } else if let Some(plan) = check.chosen.take() {
                    self.status_message(
                        io,
                        upgrade_refused_message(plan.binary.number, &view.normalized()),
                    );
                }
                Handled
            }
            // The view itself is kept by `before_dispatch` (`record_seen`).
            Event::Input(Input::RecordChanged(_)) if self.is_controller() => Handled,
            Event::Input(Input::RecordWritten { id, .. })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                Handled
            }
            Event::Input(Input::ModelLoaded { id, model })
                if self.completes(*id, Pending::LoadModel) =>
            {
                self.model = Some(model.clone());
                Handled
            }
            Event::Input(Input::Staged { id, result }) if self.completes(*id, Pending::Stage) => {
                match result {
                    Ok(()) => match check.chosen.take() {
                        Some(plan) => Transition(State::upgrading(Upgrade::new(plan, true))),
                        None => Handled,
                    },
                    Err(reason) => {
                        self.pre_staging_failed(io, check, reason);
                        Handled
                    }
                }
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Report)
                    || self.completes(*id, Pending::Persist(PersistFor::ClearTrial)) =>
            {
                Handled
            }
            _ => Super,
        }
    }

    /// Ready acts on the model's `agent-version` news (kept from any phase) once nothing
    /// else is under way, and consumes it:
    /// - an upgrade to that very version already chosen here (being written or staged) is
    ///   under way: the news is not a second request. Every controller hears the model move,
    ///   the one that moved it too. The model's own agent-version says nothing of that (a
    ///   restarted controller, or one whose staging failed, still has to act on it);
    /// - another upgrade chosen, or a request in flight: the news waits;
    /// - the running version: nothing to do;
    /// - any other version: a check, as an operator's request for that version (Juju's
    ///   upgrader reacts to the model's agent-version; the policy and the catalogue decide).
    fn act_on_agent_version_news(&mut self, io: &mut Io, check: &mut Check) {
        let Some(version) = self.agent_version_news else {
            return;
        };
        if let Some(plan) = &check.chosen {
            if plan.binary.number == version {
                self.agent_version_news = None;
            }
            return;
        }
        if self.pending.is_some() {
            return;
        }
        self.agent_version_news = None;
        if version != self.config.running.number {
            check.occasion = Some(OccasionKey::Operator(Some(version)));
            self.start_check(io);
        }
    }

    /// A staging of the binary chosen while Ready failed: tried again after
    /// [`Limits::stage_retry_delay`], [`Limits::stage_attempts_max`] times in all (the
    /// bounds of Upgrading); then the upgrade is given up. A controller that had the model
    /// name that version then resets `agent-version` to the version it runs (Juju's fix:
    /// the model must not name a version its controller cannot install, or nothing ever
    /// tries again), unless the store refuses because an upgrade-info record is current
    /// (that record's upgrade then decides). An agent other than a controller reports it.
    fn pre_staging_failed(&mut self, io: &mut Io, check: &mut Check, reason: &str) {
        let Some(plan) = check.chosen.clone() else {
            return;
        };
        check.stage_attempts += 1;
        if check.stage_attempts < self.config.limits.stage_attempts_max {
            self.status_message(
                io,
                format!(
                    "staging agent binary {} failed (will retry): {reason}",
                    plan.binary
                ),
            );
            check.stage_retry_wait = true;
            io.set_timer(Timer::StageRetry, self.config.limits.stage_retry_delay);
            return;
        }
        let version = plan.binary.number;
        let attempts = check.stage_attempts;
        check.chosen = None;
        check.stage_attempts = 0;
        let running = self.config.running.number;
        let model_names_it = self
            .model
            .as_ref()
            .is_some_and(|model| model.agent_version == version);
        if self.is_controller() && model_names_it && version != running {
            self.status_message(
                io,
                format!(
                    "upgrade to {version} failed: agent binary {} could not be staged after \
                     {attempts} attempts: {reason}; resetting agent-version to {running}",
                    plan.binary
                ),
            );
            check.resetting = true;
            self.request(
                io,
                Pending::SetAgentVersion(running),
                Request::SetAgentVersion(running),
            );
            return;
        }
        self.status_message(
            io,
            format!(
                "upgrade not started: agent binary {} could not be staged after {attempts} \
                 attempts: {reason}",
                plan.binary
            ),
        );
    }

    /// A Ready controller tends the current upgrade-info record, which nobody else may be
    /// able to move on:
    /// - a record of an upgrade to the version it runs: it finished that upgrade (its steps
    ///   ran, the database steps of that version are applied), so it joins the record as
    ///   ready and done. A controller that must still finish the upgrade (a straggler, whose
    ///   earlier record was aborted) can then complete it; a record everybody is done with is
    ///   archived (see [`Machine::join_finished_upgrade`]).
    /// - a pending record that not every controller is ready for, of an upgrade this
    ///   controller will never register in, can never proceed: it is archived as aborted. A
    ///   Ready controller registers only after upgrading from its version to the model's
    ///   `agent-version`; so a record of an upgrade from another version is doomed, and one
    ///   from its version is doomed when `agent-version` (read again, after the record was
    ///   seen) names another target: the store freezes `agent-version` while a record is
    ///   current, so that record was created after its upgrade was given up (a create that
    ///   landed late). The compare-and-set on the revision seen proves the record stayed
    ///   not-all-ready: no database step ran under it.
    fn retire_doomed_record(&mut self, io: &mut Io, check: &mut Check) {
        if !self.is_controller() || self.pending.is_some() || check.chosen.is_some() {
            return;
        }
        let view = self.record_seen;
        let Some((record, revision)) = view.current else {
            return;
        };
        let me = self.me();
        let running = self.config.running.number;
        if record.target_version == running {
            if !record.controllers_done.contains(me) && self.snapshot.upgraded_to_version == running
            {
                self.join_finished_upgrade(io, record, revision);
            }
            return;
        }
        if record.status != UpgradeStatus::Pending || !self.known_not_all_ready(&view) {
            return;
        }
        let agent_version = self.model.as_ref().map(|model| model.agent_version);
        let doomed = record.previous_version != running
            || (check.model_read_for == Some(revision)
                && agent_version != Some(record.target_version));
        if doomed {
            self.status_message(
                io,
                format!(
                    "archiving a stale upgrade-info record {} -> {} (pending, ready {:?} of {:?}) \
                     as aborted: no controller can proceed with it",
                    record.previous_version,
                    record.target_version,
                    record.controllers_ready,
                    self.controllers()
                ),
            );
            self.abort_record(io, record, revision);
            return;
        }
        if check.model_read_for != Some(revision) {
            check.model_read_for = Some(revision);
            self.request(io, Pending::LoadModel, Request::LoadModel);
        }
    }

    /// Joins the record of an upgrade to the version this controller runs and finished (its
    /// `upgradedToVersion` is that version), as ready and done: it has nothing left to do for
    /// that upgrade, and the database steps of that version are applied. When that makes
    /// every controller done, the record is archived: complete if running, otherwise aborted
    /// (nobody was left to move it on).
    fn join_finished_upgrade(&mut self, io: &mut Io, record: UpgradeInfo, revision: Revision) {
        let me = self.me();
        let all = self.controllers();
        let ready = record.controllers_ready.with(me);
        let done = record.controllers_done.with(me);
        let status = if !all.is_empty() && done.covers(all) {
            match record.status {
                UpgradeStatus::Running => UpgradeStatus::Complete,
                _ => UpgradeStatus::Aborted,
            }
        } else {
            record.status
        };
        self.status_message(
            io,
            format!(
                "joining the upgrade-info record {} -> {} ({}) as ready and done: this \
                 controller already runs {}",
                record.previous_version,
                record.target_version,
                record.status,
                record.target_version
            ),
        );
        let joined = UpgradeInfo {
            controllers_ready: ready,
            controllers_done: done,
            status,
            ..record
        };
        self.write_record(io, revision, joined, None);
    }

    /// A machine agent never switches to a binary older than its `upgradedToVersion`: that
    /// binary would find state a newer one migrated and hold (as `policy::select` refuses an
    /// implicit downgrade for controllers). `agent-version` goes down when a controller gives
    /// an upgrade up, after this agent already upgraded.
    fn refuse_downgrade(&self, plan: &StagePlan) -> Option<String> {
        let upgraded_to = self.snapshot.upgraded_to_version;
        (plan.binary.number < upgraded_to).then(|| {
            format!(
                "not switching to agent binary {}: it is older than upgradedToVersion \
                 {upgraded_to} (agent-version went down after this agent upgraded)",
                plan.binary
            )
        })
    }

    // ---------------------------------------------------------------- Upgrading and failure

    fn advance_upgrade(&mut self, io: &mut Io, upgrade: &mut Upgrade) {
        if self.pending.is_some() || upgrade.restarting {
            return;
        }
        if !upgrade.staged {
            self.request(
                io,
                Pending::Stage,
                Request::StageBinary(upgrade.plan.clone()),
            );
            return;
        }
        self.snapshot.previous = Some(self.config.running.clone());
        self.snapshot.trial = Some(Trial {
            binary: upgrade.plan.binary.clone(),
            boots: 0,
            past_database_steps: false,
            switches: 0,
        });
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(PersistFor::Switch),
            Request::PersistSnapshot(snapshot),
        );
    }

    fn advance_failure(&mut self, io: &mut Io, failure: &mut Failure) -> Outcome<State> {
        if self.pending.is_some() {
            return Handled;
        }
        if self.is_controller() && !failure.reset_done {
            // Juju's fix for a controller that restarted forever: agent-version back to ours.
            // The store refuses that while an upgrade-info record is current, and this
            // controller is giving its upgrade up: it first retires what stands in the way.
            if !failure.seen {
                if !failure.watching {
                    failure.watching = true;
                    self.watch_record(io);
                }
                return Handled;
            }
            if let Some(outcome) = self.retire_before_reset(io, failure) {
                return outcome;
            }
            self.request(
                io,
                Pending::SetAgentVersion(self.config.running.number),
                Request::SetAgentVersion(self.config.running.number),
            );
            return Handled;
        }
        // Always persist, even with no trial to clear: an entry action cannot transition,
        // so UpgradeFailed leaves on this write's completion.
        self.snapshot.trial = None;
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(PersistFor::ClearTrial),
            Request::PersistSnapshot(snapshot),
        );
        Handled
    }

    /// Before a controller that gave its upgrade up resets `agent-version`: `None` when
    /// nothing stands in the way. A pending record that not every controller is ready for
    /// can never proceed (this controller will not register in it) and no database step ran
    /// under it: it is archived as aborted, by compare-and-set. A record that may have had
    /// database steps run for a newer version than this binary, current or (for the trial
    /// this controller fell back from) archived, means this binary must not serve: held.
    /// Any other record (someone's upgrade to this version, past pending) is waited out.
    fn retire_before_reset(
        &mut self,
        io: &mut Io,
        failure: &mut Failure,
    ) -> Option<Outcome<State>> {
        let running = self.config.running.number;
        if let Some((record, revision)) = failure.record.current {
            if record.target_version == running {
                // An upgrade to the version this controller runs and finished: it joins it
                // as ready and done (a straggler can then complete it), then waits it out.
                if !record.controllers_done.contains(self.me())
                    && self.snapshot.upgraded_to_version == running
                {
                    self.join_finished_upgrade(io, record, revision);
                    return Some(Handled);
                }
            } else if record.status == UpgradeStatus::Pending
                && self.known_not_all_ready(&failure.record)
            {
                self.status_message(
                    io,
                    format!(
                        "archiving the upgrade-info record {} -> {} (pending, ready {:?} of \
                         {:?}) as aborted before resetting agent-version to {running}",
                        record.previous_version,
                        record.target_version,
                        record.controllers_ready,
                        self.controllers()
                    ),
                );
                self.abort_record(io, record, revision);
                return Some(Handled);
            }
            if record.target_version > running {
                self.remember_database_steps(io);
                return Some(Transition(State::steps_failed(Held::new(
                    format!(
                        "{}; but the upgrade-info record {} -> {} is {} with controllers \
                         ready {:?} of {:?}: database steps of {} may have run, and {running} \
                         must not serve that store; install {} again",
                        failure.reason,
                        record.previous_version,
                        record.target_version,
                        record.status,
                        record.controllers_ready,
                        self.controllers(),
                        record.target_version,
                        record.target_version
                    ),
                    failure.record,
                ))));
            }
            self.status_message(
                io,
                format!(
                    "waiting for the upgrade {} -> {} ({}) to end before resetting \
                     agent-version to {running}",
                    record.previous_version, record.target_version, record.status
                ),
            );
            return Some(Handled);
        }
        if let Some(evidence) = self.database_steps_evidence(&failure.record) {
            self.remember_database_steps(io);
            return Some(Transition(State::steps_failed(Held::new(
                format!(
                    "{}; but {evidence}: database steps of the new version may have run, and \
                     {running} must not serve that store; install the new version again",
                    failure.reason
                ),
                failure.record,
            ))));
        }
        None
    }
}

impl Upgrade {
    fn new(plan: StagePlan, staged: bool) -> Upgrade {
        Upgrade {
            plan,
            staged,
            attempts: 0,
            retry_wait: false,
            restarting: false,
        }
    }
}

/// Why an upgrade did not start: the store refused to change `agent-version`.
fn upgrade_refused_message(version: Version, view: &RecordView) -> String {
    format!("upgrade to {version} not started: {}", refusal_reason(view))
}

/// Why the store refused to change `agent-version`, from the record the refusal found.
fn refusal_reason(view: &RecordView) -> String {
    match view.current {
        Some((record, _)) => format!(
            "agent-version cannot change while the upgrade {} -> {} is recorded as {} \
             (controllers ready {:?})",
            record.previous_version, record.target_version, record.status, record.controllers_ready
        ),
        None => "agent-version cannot change while an upgrade is in progress".to_owned(),
    }
}

fn stage_plan(decision: Decision) -> StagePlan {
    match decision {
        Decision::Upgrade { entry } => StagePlan {
            binary: entry.binary,
            size_bytes: entry.size_bytes,
            sha256: entry.sha256,
            source: StageSource::Catalogue { path: entry.path },
        },
        Decision::UseLocal {
            binary,
            sha256,
            size_bytes,
        } => StagePlan {
            binary,
            size_bytes,
            sha256,
            source: StageSource::Local,
        },
        Decision::Stay { .. } => unreachable!("a stay decision stages nothing"),
    }
}

pub(crate) fn phase_of(state: &State) -> Phase {
    match state {
        State::Bootstrapping { .. } => Phase::Bootstrapping,
        State::RunningSteps { .. } => Phase::RunningSteps,
        State::CheckingAgentVersion { .. } => Phase::CheckingAgentVersion,
        State::Upgrading { .. } => Phase::Upgrading,
        State::Ready { .. } => Phase::Ready,
        State::StepsFailed { .. } => Phase::StepsFailed,
        State::UpgradeFailed { .. } => Phase::UpgradeFailed,
    }
}
