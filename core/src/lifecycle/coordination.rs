//! RunningSteps: how controllers coordinate one upgrade through the upgrade-info record and
//! the coordinator lease, and how every agent runs its steps and advances
//! `upgradedToVersion`.
//!
//! CONTRACT.md, "Coordination": "Each controller adds itself to `controllersReady`; none
//! runs its own steps before `db-complete` and all ready; each adds itself to
//! `controllersDone`; the last archives the record as complete." Juju's
//! `worker/upgradesteps` does the same with its `upgradeInfo` document.

use statig::Outcome;

use crate::lifecycle::Timer;
use crate::lifecycle::record::{
    ControllerSet, LeaseToken, RecordView, Revision, UpgradeInfo, UpgradeStatus,
};
use crate::lifecycle::types::{RecordWrite, Request, RequestId, StepIndex, StepOutcome};
use crate::steps;

use super::held::Held;
use super::io::{Io, Pending, PersistFor};
use super::machine::{Machine, State};
use super::trial::FallBackCause;

/// The coordinator lease, as this controller knows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) enum LeaseState {
    #[default]
    Free,
    Asking(RequestId),
    Held(LeaseToken),
}

/// Progress of RunningSteps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct Steps {
    pub(super) record: RecordView,
    pub(super) watching: bool,
    pub(super) seen_record: bool,
    pub(super) lease: LeaseState,
    pub(super) keepalive: Option<RequestId>,
    pub(super) lease_wait: bool,
    pub(super) database_next: u16,
    pub(super) attempts: u8,
    pub(super) retry_wait: bool,
    pub(super) finishing: bool,
    pub(super) abort: Option<AbortReason>,
    /// An operator asked to retry after an abort: the archived aborted record for this
    /// upgrade no longer stops us (until this upgrade has a record again).
    pub(super) retrying: bool,
}

impl Steps {
    /// Asks for the record to be archived as aborted, unless a trial's fall back (which
    /// archives it too, when it may) is already under way.
    pub(super) fn ask_abort(&mut self, reason: AbortReason) {
        if !matches!(self.abort, Some(AbortReason::FallBack(_))) {
            self.abort = Some(reason);
        }
    }

    /// Keeps `view` if it is no older than the view kept.
    pub(super) fn observe_record(&mut self, view: &RecordView) {
        if keep_newer(&mut self.record, view) {
            self.seen_record = true;
        }
    }
}

/// Why RunningSteps archives the record as aborted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum AbortReason {
    WaitTimedOut,
    Operator,
    /// The binary on trial gives up: retire the record (archive it aborted while no
    /// database step can have run under it), then fall back; or hold if the store says
    /// database steps of the trial version may have run.
    FallBack(FallBackCause),
}

/// Keeps `view`, normalized, in `kept` when it is no older; true when it did.
///
/// CONTRACT.md, "Revisions and watchers": "Every change to shared state has a revision,
/// strictly increasing". A view from an older revision (a late completion) says nothing
/// new.
pub(super) fn keep_newer(kept: &mut RecordView, view: &RecordView) -> bool {
    if view.revision < kept.revision {
        return false;
    }
    // Normalized as it is copied, field by field: `normalized` takes and returns the view
    // (176 bytes) by value, three copies where one will do. Each field is small enough to
    // be moved in line (the view whole is copied by a call to `memcpy`), and what
    // normalizing needs is read from `view`: a record read back out of `kept` just after
    // it was copied there stalls on store forwarding.
    match &view.current {
        Some((record, _)) if record.status.is_final() => {
            kept.current = None;
            kept.last_archived = Some(*record);
        }
        Some((record, _)) => {
            // Copied as it is, then its done set cut to its ready set in place: a record
            // rebuilt field by field (`UpgradeInfo { controllers_done, ..*record }`) is
            // assembled on the stack and read back across the stores that wrote it, which
            // stalls on store forwarding.
            let done = record
                .controllers_done
                .intersection(record.controllers_ready);
            kept.current = view.current;
            if let Some((kept_record, _)) = &mut kept.current {
                kept_record.controllers_done = done;
            }
            kept.last_archived = view.last_archived;
        }
        None => {
            kept.current = None;
            kept.last_archived = view.last_archived;
        }
    }
    kept.revision = view.revision;
    debug_assert_eq!(*kept, view.normalized());
    true
}

impl Machine {
    /// Plans the steps from `upgradedToVersion` to the running version for this agent's
    /// roles: a controller's plan includes the database steps (which only the coordinator
    /// runs), every agent's its host steps.
    ///
    /// JUJU-REFERENCE.md, "Upgrade steps": "every step whose target version `v` satisfies
    /// `from < v <= to`, where `from` is the recorded `upgradedToVersion` and `to` the
    /// running binary's version".
    pub(super) fn compute_plan(&self) -> steps::Plan {
        steps::plan(
            &self.registry,
            self.snapshot.upgraded_to_version,
            self.config.running.number,
            self.config.roles,
            self.is_controller(),
        )
    }

    /// The plan of the upgrade under way: planned once on entering RunningSteps (the
    /// registry, the running binary and the roles are fixed for the process, and
    /// `upgradedToVersion` changes only as RunningSteps ends), and dropped on leaving it.
    #[inline]
    pub(super) fn plan(&self) -> &steps::Plan {
        let plan = self
            .plan
            .as_ref()
            .expect("a plan is made on entering RunningSteps");
        assert!(
            plan.from() == self.snapshot.upgraded_to_version,
            "the plan from {} is used after upgradedToVersion became {}",
            plan.from(),
            self.snapshot.upgraded_to_version
        );
        plan
    }

    /// True when `record` describes the upgrade under way, `upgradedToVersion -> running`.
    #[inline]
    fn describes_this_upgrade(&self, record: &UpgradeInfo) -> bool {
        record.describes(
            self.snapshot.upgraded_to_version,
            self.config.running.number,
        )
    }

    /// True when host step `index` has its checkpoint in the snapshot.
    pub(super) fn checkpointed(&self, index: StepIndex) -> bool {
        let step = self.registry.step(index);
        self.snapshot
            .host_checkpoints
            .iter()
            .any(|key| key.id == step.id && key.target_version == step.target_version)
    }

    /// True when the current record has every controller ready. Never true while the
    /// controllers are unknown (no model loaded): an empty set is covered by anything.
    pub(super) fn all_ready(&self, view: &RecordView) -> bool {
        let all = self.controllers();
        match view.current {
            Some((record, _)) => !all.is_empty() && record.controllers_ready.covers(all),
            None => false,
        }
    }

    /// True when the current record is known not to have every controller ready: the
    /// condition under which archiving it as aborted proves no database step ran under it.
    /// False while the controllers are unknown.
    pub(super) fn known_not_all_ready(&self, view: &RecordView) -> bool {
        let all = self.controllers();
        match view.current {
            Some((record, _)) => !all.is_empty() && !record.controllers_ready.covers(all),
            None => false,
        }
    }

    // ---------------------------------------------------------------- events

    /// A write of the record answered: the view it brings is kept; an abort asked for is
    /// done once written (a trial's fall back decides on the view in the reconcile); a
    /// fenced write means the lease is gone.
    pub(super) fn steps_record_written(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        write: &RecordWrite,
    ) -> Option<State> {
        match write {
            RecordWrite::Written(view) | RecordWrite::Conflict(view) => {
                steps.observe_record(view);
                if let (Some(reason), RecordWrite::Written(_)) = (steps.abort, write)
                    && !matches!(reason, AbortReason::FallBack(_))
                {
                    return Some(self.held_after_abort(reason, steps));
                }
            }
            RecordWrite::Fenced => self.lose_lease(io, steps),
        }
        None
    }

    /// spec/lifecycle.md: "The coordinator's lease lives `Limits::lease_ttl()`, five
    /// keep-alive intervals (...). Each `KeepAliveLease` arms `LeaseDeadline`,
    /// `Limits::lease_keepalive_deadline()` (...) after it was sent".
    pub(super) fn keep_lease_alive(&mut self, io: &mut Io, steps: &mut Steps) {
        if let (LeaseState::Held(token), None) = (steps.lease, steps.keepalive) {
            steps.keepalive = Some(io.request_aside(Request::KeepAliveLease(token)));
            io.set_timer(
                Timer::LeaseDeadline,
                self.config.limits.lease_keepalive_deadline(),
            );
        }
    }

    /// spec/lifecycle.md: "unanswered by then, the lease is lost exactly as a
    /// `LeaseAnswered` with no lease says, and a late answer is ignored by its id."
    pub(super) fn lease_deadline_passed(&mut self, io: &mut Io, steps: &mut Steps) {
        if let Some(id) = steps.keepalive {
            tracing::warn!(
                target: "lockstep::lifecycle",
                id = id.0,
                deadline_ms = self.config.limits.lease_keepalive_deadline().0,
                "lease keep-alive unanswered; giving the lease up"
            );
            self.lose_lease(io, steps);
        }
    }

    /// JUJU-REFERENCE.md, "HA": "every controller waits (15 min) for all provisioned
    /// controllers to be ready"; then the upgrade is aborted.
    pub(super) fn controllers_wait_over(&mut self, steps: &mut Steps) {
        if !self.all_ready(&steps.record) {
            steps.ask_abort(AbortReason::WaitTimedOut);
        }
    }

    pub(super) fn lease_answered(
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

    pub(super) fn lose_lease(&mut self, io: &mut Io, steps: &mut Steps) {
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

    /// A step answered. JUJU-REFERENCE.md, "Upgrade steps": "A failure stops the batch; the
    /// whole batch is retried (5 attempts, 2 minutes apart); status says `upgrade to X
    /// failed (will retry): ...` then `(giving up)`".
    pub(super) fn step_finished(
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
            (Pending::DatabaseStep(index), StepOutcome::Applied | StepOutcome::AlreadyApplied) => {
                self.assert_database_step_completed(steps, index);
                steps.database_next += 1;
                steps.attempts = 0;
                None
            }
            (Pending::HostStep(index), StepOutcome::Applied | StepOutcome::AlreadyApplied) => {
                steps.attempts = 0;
                if self.mutations.checkpoint_before_effects {
                    return None; // planted defect: the checkpoint was already written
                }
                self.persist_host_checkpoint(io, index, Some(outcome));
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
                    return Some(State::StepsFailed {
                        held: Box::new(Held::new(
                            format!("upgrade to {target} failed (giving up): {reason}"),
                            steps.record,
                        )),
                    });
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

    /// A request without a result completed in RunningSteps.
    pub(super) fn steps_done(&mut self, io: &mut Io, id: RequestId) -> Option<State> {
        let (pending_id, kind) = self.pending?;
        if pending_id != id {
            return None;
        }
        self.pending = None;
        match kind {
            Pending::Persist(PersistFor::UpgradedTo) => {
                self.assert_upgraded_to_durable();
                Some(self.after_own_steps())
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

    /// Leaving RunningSteps: its timers go, and a lease still held is given up.
    pub(super) fn leave_running_steps(&mut self, io: &mut Io, steps: &mut Steps) {
        self.plan = None;
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

    // ---------------------------------------------------------------- record writes

    /// Archives `record` (current at `revision`) as aborted, by compare-and-set.
    pub(super) fn abort_record(&mut self, io: &mut Io, record: UpgradeInfo, revision: Revision) {
        let aborted = UpgradeInfo {
            status: UpgradeStatus::Aborted,
            ..record
        };
        self.write_record(io, revision, &record, aborted, None);
    }

    /// Compare-and-set of the upgrade-info record on `expected`, where it is `current`, to
    /// `record`; fenced when `fence` is set.
    pub(super) fn write_record(
        &mut self,
        io: &mut Io,
        expected: Revision,
        current: &UpgradeInfo,
        record: UpgradeInfo,
        fence: Option<LeaseToken>,
    ) {
        self.assert_record_transition(current, &record);
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

    /// spec/lifecycle.md: "Records are created with nobody ready; every controller, the
    /// creator included, registers by compare-and-set. A create that lands late (a driver's
    /// retry, a duplicate) then never counts a controller as ready that is not running the
    /// record's target."
    fn create_record(&mut self, io: &mut Io) {
        let record = UpgradeInfo {
            previous_version: self.snapshot.upgraded_to_version,
            target_version: self.config.running.number,
            status: UpgradeStatus::Pending,
            controllers_ready: ControllerSet::EMPTY,
            controllers_done: ControllerSet::EMPTY,
        };
        self.assert_record_created(&record);
        self.request(io, Pending::RecordWrite, Request::CreateRecord(record));
    }

    // ---------------------------------------------------------------- snapshot writes

    /// CONTRACT.md, "Steps": host steps "run at least once and must be idempotent; their
    /// checkpoint is written to the local snapshot after the step succeeded."
    ///
    /// `outcome` is the step's completion; the planted defect `checkpoint_before_effects`
    /// persists without one.
    fn persist_host_checkpoint(
        &mut self,
        io: &mut Io,
        index: StepIndex,
        outcome: Option<&StepOutcome>,
    ) {
        self.assert_host_step_ran(index, outcome);
        if !self.checkpointed(index) {
            self.snapshot
                .host_checkpoints
                .push(self.registry.key(index));
        }
        self.persist(io, PersistFor::HostCheckpoint(index));
    }

    /// CONTRACT.md, "Where state lives": "`upgradedToVersion` is written only after every
    /// planned step is checkpointed."
    fn persist_upgraded_to(&mut self, io: &mut Io) {
        self.assert_steps_took_effect(None);
        self.snapshot.upgraded_to_version = self.config.running.number;
        self.snapshot.host_checkpoints.clear();
        self.persist(io, PersistFor::UpgradedTo);
    }

    /// Before this agent runs (or relies on) database steps of a trial binary, or once it
    /// saw every controller ready (the coordinator may then run them), persist that falling
    /// back is no longer safe. True while that write is in flight.
    ///
    /// JUJU-REFERENCE.md, "HA", bugs to avoid: "rolling the version back after database
    /// steps already ran is unsafe."
    ///
    /// Without a trial there is nothing to mark, which is known in line, without a call.
    #[inline]
    fn mark_past_database_steps(&mut self, io: &mut Io) -> bool {
        if self.snapshot.trial.is_none() {
            return false;
        }
        self.mark_trial_past_database_steps(io)
    }

    /// [`Machine::mark_past_database_steps`] with a trial.
    #[inline(never)]
    fn mark_trial_past_database_steps(&mut self, io: &mut Io) -> bool {
        match &mut self.snapshot.trial {
            Some(trial) if trial.binary == self.config.running && !trial.past_database_steps => {
                trial.past_database_steps = true;
                self.persist(io, PersistFor::PastDatabaseSteps);
                true
            }
            _ => false,
        }
    }

    // ---------------------------------------------------------------- the reconcile

    /// Issues the next request RunningSteps needs, or returns the phase to go to. Called
    /// after every event of the phase: the decision depends only on what is known now.
    ///
    /// Most events of the phase arrive while a request is in flight (a record-watch event,
    /// the echo of this controller's own write), and then there is nothing to decide: that
    /// test is inlined into the handler, the decision itself is not.
    #[inline]
    pub(super) fn reconcile_steps(&mut self, io: &mut Io, steps: &mut Steps) -> Option<State> {
        if self.pending.is_some() || steps.finishing {
            return None;
        }
        self.reconcile_steps_now(io, steps)
    }

    /// [`Machine::reconcile_steps`] with nothing in flight and the steps not finishing.
    #[inline(never)]
    fn reconcile_steps_now(&mut self, io: &mut Io, steps: &mut Steps) -> Option<State> {
        if !self.is_controller() {
            return self.next_host_step(io, steps, None);
        }
        let me = self.me();
        // The upgrade under way is `upgradedToVersion -> running`, read where it is needed
        // (`describes_this_upgrade`, the messages) rather than copied out up front: the two
        // versions would be kept on the stack across every call below.
        // JUJU-REFERENCE.md, "HA", bugs to avoid: "a waiting controller that starts its
        // watcher after the primary finished waits forever (re-read the record after
        // subscribing)". The watch delivers the current view first; nothing is decided
        // before it arrived.
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
        // The record is read where it lies, not copied out at once: the view was written
        // into `steps` by this very event, and a copy read back in other pieces than it was
        // written in stalls on store forwarding. Copied only to be handed on.
        let Some((record, revision)) = &steps.record.current else {
            if let Some(last) = steps.record.last_archived
                && self.describes_this_upgrade(&last)
            {
                if last.controllers_done.contains(me) {
                    // Finished here already, whatever became of the record afterwards (a
                    // trial that is over included): go on to Ready. A host step this host
                    // has no checkpoint of is run first: the record is the store's word,
                    // the checkpoints this host's (found by fuzzing: a damaged archived
                    // record naming this controller done made it finish without its host
                    // steps, I6).
                    return self.next_host_step(io, steps, None);
                }
                if last.status == UpgradeStatus::Aborted && !steps.retrying && fall_back.is_none() {
                    if self.database_steps_evidence(&steps.record).is_some() {
                        self.remember_database_steps(io);
                    }
                    let (from, to) = (
                        self.snapshot.upgraded_to_version,
                        self.config.running.number,
                    );
                    return Some(State::StepsFailed {
                        held: Box::new(Held::new(
                            format!("upgrade from {from} to {to} was aborted"),
                            steps.record,
                        )),
                    });
                }
            }
            if let Some(cause) = fall_back {
                return self.fall_back_after_store_check(io, cause, &steps.record);
            }
            if let Some(reason) = steps.abort {
                return Some(self.held_after_abort(reason, steps));
            }
            self.create_record(io);
            return None;
        };
        let revision = *revision;
        if !self.describes_this_upgrade(record) {
            if let Some(cause) = fall_back {
                // Not this trial's record: the store check reads the archived one.
                return self.fall_back_after_store_check(io, cause, &steps.record);
            }
            // spec/lifecycle.md: "A pending record of another upgrade, not every controller
            // ready, is archived as aborted by a controller that will never register in it
            // (RunningSteps of another upgrade, UpgradeFailed, Ready)".
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
                self.abort_record(io, *record, revision);
                return None;
            }
            let (from, to) = (
                self.snapshot.upgraded_to_version,
                self.config.running.number,
            );
            return Some(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "current upgrade info mismatch: expected {from} -> {to}, found {} -> {} \
                     ({}); abort it or finish it first",
                        record.previous_version, record.target_version, record.status
                    ),
                    steps.record,
                )),
            });
        }
        // spec/lifecycle.md, "Choices made": "A retry overrides the abort archived before
        // it, not a later one: once the upgrade has a record again, an abort stops it like
        // any other."
        steps.retrying = false;
        if let Some(cause) = fall_back {
            if record.status == UpgradeStatus::Pending && self.known_not_all_ready(&steps.record) {
                // Not every controller is ready, so no database step ran: archive the record
                // as aborted. The compare-and-set succeeding proves it stayed so; a conflict
                // brings a newer view, and the decision is taken again.
                self.abort_record(io, *record, revision);
                return None;
            }
            return self.fall_back_after_store_check(io, cause, &steps.record);
        }
        if let Some(reason) = steps.abort {
            if reason == AbortReason::WaitTimedOut && self.all_ready(&steps.record) {
                // Every controller registered after all (the timer fired on an older view).
                steps.abort = None;
            } else {
                self.abort_record(io, *record, revision);
                return None;
            }
        }
        if !record.controllers_ready.contains(me) {
            let registered = UpgradeInfo {
                controllers_ready: record.controllers_ready.with(me),
                ..*record
            };
            self.write_record(io, revision, record, registered, None);
            return None;
        }
        if !self.all_ready(&steps.record) {
            if !io.timer_armed(Timer::ControllersWait) {
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
                let record = *record;
                self.coordinate(io, steps, record, revision);
                None
            }
            UpgradeStatus::DbComplete => {
                let running = UpgradeInfo {
                    status: UpgradeStatus::Running,
                    ..*record
                };
                self.write_record(io, revision, record, running, None);
                None
            }
            UpgradeStatus::Running => {
                let current = Some((*record, revision));
                self.next_host_step(io, steps, current)
            }
            UpgradeStatus::Complete | UpgradeStatus::Aborted => {
                unreachable!("views are normalized on receipt: a final record is never current")
            }
        }
    }

    /// Every controller is ready and the record is pending: the lease holder runs the
    /// database steps, fenced, then sets db-complete, fenced; the others wait for it.
    ///
    /// CONTRACT.md, "Coordination": "The coordinator is the controller holding the upgrade
    /// lease; it plays Juju's `database-master` target and runs the database steps. Every
    /// coordinator write is a fenced compare-and-set: it succeeds only while its lease is
    /// still the current one."
    fn coordinate(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        record: UpgradeInfo,
        revision: Revision,
    ) {
        let token = match steps.lease {
            LeaseState::Held(token) => token,
            LeaseState::Free if !steps.lease_wait => {
                let id = io.request_aside(Request::AcquireLease);
                steps.lease = LeaseState::Asking(id);
                return;
            }
            _ => return,
        };
        let next = self
            .plan()
            .database()
            .get(usize::from(steps.database_next))
            .copied();
        self.set_progress(io, u32::from(steps.database_next));
        let fence = if self.mutations.unfenced_coordinator {
            None
        } else {
            Some(token)
        };
        if let Some(index) = next {
            self.assert_coordinator_write(steps, Some(index), fence);
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
            return;
        }
        let complete = UpgradeInfo {
            status: UpgradeStatus::DbComplete,
            ..record
        };
        self.assert_coordinator_write(steps, None, fence);
        self.write_record(io, revision, &record, complete, fence);
    }

    /// Runs the next host step not yet checkpointed; when none is left, marks this
    /// controller done in the record (archiving it if last) or finishes.
    fn next_host_step(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
        record: Option<(UpgradeInfo, Revision)>,
    ) -> Option<State> {
        let plan = self.plan();
        // Progress counts the upgrade's database steps too, whoever runs them.
        let database_total = plan.database().len();
        let host = plan.host();
        let mut remaining = host
            .iter()
            .copied()
            .filter(|&index| !self.checkpointed(index));
        let first = remaining.next();
        let remaining_count = first.map_or(0, |_| 1 + remaining.count());
        let done = host.len() - remaining_count;
        self.set_progress(io, (database_total + done) as u32);
        let skip_last = self.mutations.upgraded_to_with_step_missing && remaining_count == 1;
        if let (Some(index), false) = (first, skip_last) {
            let key = self.registry.key(index);
            if self.mutations.checkpoint_before_effects {
                // Planted defect: the checkpoint is made durable before the step ran.
                self.persist_host_checkpoint(io, index, None);
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
                self.write_record(io, revision, &record, next, None);
                return None;
            }
        }
        self.finish_steps(io, steps)
    }

    /// The end of an upgrade's steps: rediscover capabilities (controllers), then advance
    /// `upgradedToVersion`.
    ///
    /// CONTRACT.md, "Roles, capabilities, jobs": "Capabilities are written at bootstrap and
    /// re-discovered at the end of every upgrade".
    fn finish_steps(&mut self, io: &mut Io, steps: &mut Steps) -> Option<State> {
        self.assert_steps_took_effect(self.is_controller().then_some(&steps.record));
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

    /// The hold after this controller's abort was written.
    pub(super) fn held_after_abort(&mut self, reason: AbortReason, steps: &Steps) -> State {
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
        State::StepsFailed {
            held: Box::new(Held::new(text, steps.record)),
        }
    }

    /// A controller's trial deadline passed in RunningSteps: an agent that is not a
    /// controller, or whose snapshot already forbids the fall back, decides now
    /// (`Some`); otherwise the record decides, in the reconcile that follows (`None`):
    /// retired, then a fall back; or a hold.
    pub(super) fn trial_over_while_running_steps(
        &mut self,
        io: &mut Io,
        steps: &mut Steps,
    ) -> Option<Outcome<State>> {
        if !self.is_controller() || !self.fall_back_locally_safe() {
            return Some(self.trial_timed_out(io));
        }
        let cause = FallBackCause::TimedOut;
        let reason = self.fall_back_reason(cause);
        self.status_message(
            io,
            format!("{reason}; retiring the upgrade-info record before falling back"),
        );
        steps.abort = Some(AbortReason::FallBack(cause));
        None
    }
}
