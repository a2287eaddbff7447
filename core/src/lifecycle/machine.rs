//! The statig machine: one state per phase, each phase's own progress as state-local data,
//! and the shared storage every phase reads (config, registry, snapshot, model, queues).
//!
//! This file is the transition table in code: which event each phase takes, under which
//! guard, and where it goes. The decisions themselves live beside it, one concern a file,
//! as further `impl Machine` blocks (statig allows one `#[state_machine]` per module):
//!
//! - `io.rs`: the driver's side (clock, outputs, timers, request ids), the main request in
//!   flight, the one snapshot write, publishing gate and status.
//! - `boot.rs`: Bootstrapping, and where a boot resumes.
//! - `coordination.rs`: RunningSteps: the upgrade-info record, the coordinator lease,
//!   database and host steps, `upgradedToVersion`.
//! - `trial.rs`: Upgrading (stage, switch, restart), trial accounting, the fall back to the
//!   previous binary and the store check before it.
//! - `version_check.rs`: CheckingAgentVersion and Ready's checks: policy, catalogue,
//!   `agent-version` writes.
//! - `held.rs`: StepsFailed and UpgradeFailed.
//! - `ready.rs`: Ready: news of `agent-version`, pre-staging, records nobody else moves on.
//!
//! Every handler returns an `Outcome<State>`, copied on every input, so the state is kept
//! small: the large data of RunningSteps, StepsFailed, UpgradeFailed and Upgrading is boxed
//! (a phase change allocates once), and `Check` (CheckingAgentVersion and Ready, the boot's
//! last phases and the agent's steady state) stays inline with its rare chosen binary
//! boxed. With the data inline the copy was some 220 bytes per input.
//!
//! Rules every handler keeps:
//! - At most one "main" request is in flight (`Machine::pending`); the lease's own requests
//!   and the record watch run beside it. A completion whose id is not the one awaited is
//!   stale (from before a retry or a phase change) and ignored.
//! - Every retry has a bound in [`Limits`](crate::lifecycle::Limits); every wait has a timer.
//! - Nothing here reads a clock: `now` is the driver's, stored before each dispatch.

use std::sync::Arc;

use statig::blocking::*;

use crate::gate::GateView;
use crate::lifecycle::record::RecordView;
use crate::lifecycle::types::*;
use crate::lifecycle::{Mutations, Timer};
use crate::phase::{Phase, Progress};
use crate::role::Role;
use crate::steps::{Plan, StepRegistry};
use crate::version::{Binary, Version};

use super::boot::BootStage;
use super::coordination::{AbortReason, Steps, keep_newer};
use super::held::{Failure, Held, HeldIntent};
use super::io::{Io, Pending, PersistFor};
use super::trial::{FallBackCause, Upgrade};
use super::version_check::Check;

/// What one dispatch carries: the input borrowed from the caller (an input is a few hundred
/// bytes; moving it into the event would copy it on every dispatch), or a timer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Event<'input> {
    Input(&'input Input),
    Timer(Timer),
    /// Applied by `before_dispatch`; no state sees it.
    #[cfg_attr(not(feature = "mutations"), allow(dead_code))]
    SetMutations(Mutations),
}

/// The shared storage of the machine.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Machine {
    pub(crate) config: Config,
    pub(crate) registry: Arc<StepRegistry>,
    pub(crate) snapshot: Snapshot,
    /// RunningSteps: the steps of the upgrade under way (see [`Machine::plan`]).
    pub(super) plan: Option<Plan>,
    pub(crate) model: Option<ModelView>,
    pub(crate) pending: Option<(RequestId, Pending)>,
    pub(crate) gate: GateView,
    pub(crate) upgrade_available: Option<Version>,
    pub(crate) mutations: Mutations,
    /// Set by Bootstrapping when the snapshot shows a trial that did not succeed.
    pub(super) fell_back: Option<String>,
    /// Set by Bootstrapping when the snapshot shows a switch that never happened.
    pub(super) resume_switch: Option<Binary>,
    /// Set by Bootstrapping when a controller's trial is over (timed out, or out of boots)
    /// and falling back looks safe locally: the fall back waits for the store's word, which
    /// RunningSteps reads (see [`AbortReason::FallBack`]).
    pub(super) fall_back_due: Option<FallBackCause>,
    /// This process subscribed to the upgrade-info record. A subscription lasts as long as
    /// the process (a later `WatchRecord` replaces it, delivering the current view first).
    pub(super) watching: bool,
    /// The newest view of the record this process was given, in any phase (by the watch, a
    /// record write or a refused `agent-version` write). Ready works from it.
    pub(super) record_seen: RecordView,
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

    /// spec/lifecycle.md, "Phases", bootstrapping: "persist the snapshot (counting a trial
    /// boot), load the model, on the first boot discover capabilities".
    #[state]
    fn bootstrapping(
        &mut self,
        io: &mut Io,
        stage: &mut BootStage,
        event: &Event<'_>,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::Start) if *stage == BootStage::NotStarted => {
                self.start_boot(io, stage);
                Handled
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::Boot)) =>
            {
                self.boot_persisted(io, stage)
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
                self.model_loaded_at_boot(io, stage, model)
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
        if self.plan.is_none() {
            // Planned by `before_transition` on a phase change.
            self.plan = Some(self.compute_plan());
        }
        let next = self.reconcile_steps(io, steps);
        // An entry action cannot transition: the first reconcile only ever asks.
        assert!(next.is_none(), "RunningSteps decided {next:?} on entry");
    }

    /// spec/lifecycle.md, "Phases", running-steps: "plan `from < target <= to` for this
    /// agent's roles; controllers register in the upgrade-info record, wait for all, the
    /// lease holder (coordinator) runs database steps fenced and sets db-complete, every
    /// controller sets running, runs its host steps (checkpoint persisted after each), adds
    /// itself to done (the last archives complete); capabilities rediscovered;
    /// `upgradedToVersion` written".
    ///
    /// Every event updates what is known; then [`Machine::reconcile_steps`] asks for the
    /// next thing or decides the next phase from that alone.
    #[state(
        entry_action = "enter_running_steps",
        exit_action = "exit_running_steps"
    )]
    fn running_steps(
        &mut self,
        io: &mut Io,
        steps: &mut Box<Steps>,
        event: &Event<'_>,
    ) -> Outcome<State> {
        let decided = match event {
            Event::Input(Input::RecordChanged(view)) => {
                steps.observe_record(view);
                None
            }
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                self.steps_record_written(io, steps, write)
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
                self.keep_lease_alive(io, steps);
                None
            }
            Event::Timer(Timer::LeaseDeadline) => {
                self.lease_deadline_passed(io, steps);
                None
            }
            Event::Timer(Timer::ControllersWait) => {
                self.controllers_wait_over(steps);
                None
            }
            Event::Timer(Timer::TrialReady) => {
                if let Some(outcome) = self.trial_over_while_running_steps(io, steps) {
                    return outcome;
                }
                None
            }
            _ => return Super,
        };
        if let Some(state) = decided {
            return Transition(state);
        }
        match self.reconcile_steps(io, steps) {
            Some(state) => Transition(state),
            None => Handled,
        }
    }

    #[action]
    fn exit_running_steps(&mut self, io: &mut Io, steps: &mut Steps) {
        self.leave_running_steps(io, steps);
    }

    // ---------------------------------------------------------------- CheckingAgentVersion

    #[action]
    fn enter_checking_agent_version(&mut self, io: &mut Io, check: &mut Check) {
        self.begin_version_check(io, check);
    }

    /// spec/lifecycle.md, "Phases", checking-agent-version: "controllers: catalogue lookup
    /// in the preferred streams, then the policy (`policy.rs`) decides; other agents ask
    /// the controller".
    #[state(entry_action = "enter_checking_agent_version")]
    fn checking_agent_version(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        event: &Event<'_>,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::CatalogueFound { id, result })
                if self.completes(*id, Pending::Catalogue) =>
            {
                match result {
                    Ok(catalogue) => self.decide(io, check, catalogue),
                    Err(reason) => self.catalogue_lookup_failed(io, check, reason),
                }
            }
            Event::Input(Input::DesiredBinary { id, plan })
                if self.completes(*id, Pending::DesiredBinary) =>
            {
                self.desired_binary_while_checking(io, plan)
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                self.agent_version_refused_while_checking(io, check, view)
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                self.agent_version_written_while_checking(check)
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

    /// spec/lifecycle.md, "Phases", upgrading: "stage (download, verify size and sha256),
    /// persist `previous` and the trial, restart into the new binary".
    #[state(entry_action = "enter_upgrading")]
    fn upgrading(
        &mut self,
        io: &mut Io,
        upgrade: &mut Box<Upgrade>,
        event: &Event<'_>,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::Staged { id, result }) if self.completes(*id, Pending::Stage) => {
                self.staged(io, upgrade, result)
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Persist(PersistFor::Switch)) =>
            {
                self.switch_persisted(io, upgrade);
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
        self.arrive_in_ready(io, check);
    }

    /// spec/lifecycle.md, "Phases", ready: "full API; a periodic check reports
    /// `upgrade-available`; an operator upgrade pre-stages while Ready; the model's
    /// `agent-version` news (kept from any phase) starts a check once nothing else is under
    /// way; controllers watch the upgrade-info record".
    ///
    /// After every event it handles, Ready tends the record and the news (see
    /// [`Machine::retire_doomed_record`], [`Machine::act_on_agent_version_news`]).
    #[state(entry_action = "enter_ready")]
    fn ready(&mut self, io: &mut Io, check: &mut Check, event: &Event<'_>) -> Outcome<State> {
        let outcome = match event {
            Event::Timer(Timer::CatalogueCheck) => {
                self.periodic_check(io, check);
                Handled
            }
            Event::Timer(Timer::StageRetry) if check.stage_retry_wait => {
                self.retry_pre_staging(io, check);
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
                        self.lookup_failed_in_ready(io, check, reason);
                        Handled
                    }
                }
            }
            Event::Timer(Timer::CatalogueRetry) if check.retry_wait => {
                self.retry_lookup_in_ready(io, check);
                Handled
            }
            Event::Input(Input::DesiredBinary { id, plan })
                if self.completes(*id, Pending::DesiredBinary) =>
            {
                self.desired_binary_in_ready(io, check, plan);
                Handled
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                self.agent_version_written_in_ready(io, check);
                Handled
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                self.agent_version_refused_in_ready(io, check, view);
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
                self.pre_staged(io, check, result)
            }
            Event::Input(Input::Done { id })
                if self.completes(*id, Pending::Report)
                    || self.completes(*id, Pending::Persist(PersistFor::ClearTrial)) =>
            {
                Handled
            }
            _ => Super,
        };
        if matches!(outcome, Handled) {
            self.retire_doomed_record(io, check);
            self.act_on_agent_version_news(io, check);
            self.make_owed_report_lookup(io, check);
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

    /// spec/lifecycle.md, "Phases", steps-failed: "held with a reason until an operator
    /// retries (back to running-steps, or to checking-agent-version when no step is left)
    /// or aborts (record archived aborted; falls back when safe); a controller on trial
    /// also gives up at its trial deadline (falls back when safe)".
    #[state(entry_action = "enter_steps_failed")]
    fn steps_failed(
        &mut self,
        io: &mut Io,
        held: &mut Box<Held>,
        event: &Event<'_>,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::Operator(OperatorAction::Retry)) if self.pending.is_none() => {
                self.retry_held(io, held)
            }
            Event::Input(Input::Operator(OperatorAction::Abort)) if self.pending.is_none() => {
                held.intent = Some(HeldIntent::OperatorAbort);
                self.advance_held(io, held)
            }
            Event::Timer(Timer::TrialReady) => self.trial_over_while_held(io, held),
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                self.held_record_written(io, held, write)
            }
            Event::Input(Input::RecordChanged(view)) => {
                keep_newer(&mut held.record, view);
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

    /// spec/lifecycle.md, "Phases", upgrade-failed: "controllers first retire what stands
    /// in the way of the reset (...) or hold, if the record says database steps of a newer
    /// version may have run; then `agent-version` reset to the running version (Juju's fix
    /// for a controller that restarted forever), trial cleared, then Ready".
    #[state(entry_action = "enter_upgrade_failed")]
    fn upgrade_failed(
        &mut self,
        io: &mut Io,
        failure: &mut Box<Failure>,
        event: &Event<'_>,
    ) -> Outcome<State> {
        match event {
            Event::Input(Input::RecordChanged(view)) if failure.watching => {
                keep_newer(&mut failure.record, view);
                failure.seen = true;
                self.advance_failure(io, failure)
            }
            Event::Input(Input::RecordWritten { id, write })
                if self.completes(*id, Pending::RecordWrite) =>
            {
                if let RecordWrite::Written(view) | RecordWrite::Conflict(view) = write {
                    keep_newer(&mut failure.record, view);
                }
                self.advance_failure(io, failure)
            }
            Event::Input(Input::AgentVersionRefused { id, view, .. })
                if self.completes_agent_version_write(*id) =>
            {
                keep_newer(&mut failure.record, view);
                failure.seen = true;
                self.advance_failure(io, failure)
            }
            Event::Input(Input::Done { id }) if self.completes_agent_version_write(*id) => {
                self.agent_version_reset(io, failure)
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
    /// Everything but the registry, which is fixed for the life of the process, and the
    /// plan, which follows from the phase, the snapshot and the configuration.
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
            plan: None,
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

    /// What every phase keeps before its handler runs: planted defects, the model's
    /// `agent-version` news, and the newest view of the record.
    #[inline(never)]
    fn before_dispatch(
        &mut self,
        _state: StateOrSuperstate<'_, State, Superstate>,
        event: &Event<'_>,
    ) {
        let view = match event {
            Event::SetMutations(mutations) => {
                self.mutations = *mutations;
                None
            }
            Event::Input(Input::AgentVersionChanged(version)) => {
                // spec/lifecycle.md: "The model's `agent-version` news (`AgentVersionChanged`)
                // is accepted in every phase: the core keeps the latest value (one; a newer
                // one replaces it) and acts on it in Ready".
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
        if let Some(view) = view {
            keep_newer(&mut self.record_seen, view);
        }
    }

    /// Publishes the new phase's gate and status *before* its entry actions run, so every
    /// request and status an entry makes is already marked with the phase it belongs to.
    ///
    /// spec/lifecycle.md, "Choices made": "A new phase's gate and first status (with the
    /// held or failure reason) are published from statig's `before_transition`, before the
    /// phase's entry actions make requests, so every output is marked with the phase it
    /// belongs to (invariant I9)."
    ///
    /// statig 0.4.1 calls this hook with the target first and the source second (the
    /// trait's parameter names say otherwise); the names here say what is passed.
    fn before_transition(&mut self, target: &State, source: &State, io: &mut Io) {
        let (from, to) = (phase_of(source), phase_of(target));
        if from == to {
            return;
        }
        let progress = match target {
            State::RunningSteps { .. } => {
                let plan = self.plan.insert(self.compute_plan());
                Progress {
                    done: 0,
                    total: plan.len() as u32,
                    target: Some(self.config.running.number),
                }
            }
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
        let gate = GateView {
            progress,
            ..self.view(to)
        };
        self.assert_gate_for_phase(&gate, to);
        self.publish_phase(io, gate, message);
    }

    /// Traces every phase change once it is complete (statig passes source, then target).
    fn after_transition(&mut self, source: &State, target: &State, _io: &mut Io) {
        let (from, to) = (phase_of(source), phase_of(target));
        if from != to {
            tracing::info!(target: "lockstep::lifecycle", from = %from, to = %to, "phase changed");
        }
    }

    // ---------------------------------------------------------------- who this agent is

    pub(super) fn is_controller(&self) -> bool {
        self.config.controller.is_some() && self.config.roles.contains(Role::Controller)
    }

    pub(super) fn me(&self) -> crate::lifecycle::record::ControllerId {
        self.config.controller.expect("only controllers coordinate")
    }

    pub(super) fn controllers(&self) -> crate::lifecycle::record::ControllerSet {
        self.model
            .as_ref()
            .map(|model| model.controllers)
            .unwrap_or(crate::lifecycle::record::ControllerSet::EMPTY)
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
