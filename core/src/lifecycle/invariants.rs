//! The invariants of `spec/invariants.md`, asserted where the machine makes the transition
//! each one guards, not only by the testkit's `World::check` after the fact. Where the
//! machine also reads back what it wrote, the read path asserts the same property
//! (TigerBeetle's pairing): the gate and progress it published are checked after every
//! dispatch that published something, `upgradedToVersion` once it is durable, Ready's
//! `upgradedToVersion` after every dispatch that ends in Ready and published something.
//!
//! The read-path checks run after a dispatch that made outputs, not after every input:
//! every gate change, phase change and snapshot write is an output, so a dispatch that made
//! none (most of a Ready agent's inputs: a tick with nothing due, a stale completion, a
//! record view kept) left what the driver reads back as it was when last checked. The
//! gates and statuses are noted as they are published (`Io::push_gate`,
//! `Io::push_status`), so the checks read a few fields instead of walking the outputs.
//!
//! | # | write path (the transition) | read path |
//! |---|---|---|
//! | I1 | `before_transition`: a Ready gate only on entering Ready | after every dispatch that published something: each gate published names Ready only if the machine is Ready, and the gate the API reads names the machine's phase |
//! | I2 | a database step is asked for by its key, in plan order | its completion is the step in flight, at `database_next` |
//! | I3 | a database step and `db-complete` carry the fence of the lease held, with every controller ready and the record pending | (the store's fenced transaction) |
//! | I4 | every record write is a valid successor of the record it replaces; a record is created pending with nobody ready | (the store's transaction refuses an invalid transition) |
//! | I5 | a host checkpoint is persisted only with its step's completion in hand | — |
//! | I6 | `upgradedToVersion` is advanced only with every planned host step checkpointed and, on a controller, itself done in the record of this upgrade | once durable: it names the running version, checkpoints cleared |
//! | I7 | entering Ready: `upgradedToVersion` is the running version | after every dispatch that ends in Ready and published something |
//! | I8 | a controller falls back, or serves after UpgradeFailed, only on a record view that shows no database step of a newer version | — |
//! | I9 | progress never runs backwards in a phase, nor past its total | after every dispatch that published something: every status is marked with the phase the gate last published, and progress never runs backwards |
//!
//! **Planted defects.** Each assertion is skipped only while the planted defect that breaks
//! its invariant is switched on ([`Mutations`](crate::lifecycle::Mutations), which only the
//! `mutations` feature lets a caller set); every other assertion stays on. A
//! `cfg(not(feature = "mutations"))` gate would switch every assertion off wherever the
//! feature is on: the crate's own tests, the simulator, and (cargo unifies features across a
//! workspace build) any binary built beside them; the checks would then never run where
//! they are exercised most. Skipping only the broken invariant's assertion lets the
//! explorer and the simulator report the planted violation through their own checkers, as
//! their tests require, while the defect cannot hide behind a panic of another assertion.

use crate::gate::GateView;
use crate::lifecycle::record::{RecordView, UpgradeInfo, UpgradeStatus};
use std::collections::VecDeque;

use crate::lifecycle::types::{Output, StepIndex, StepOutcome};
use crate::phase::Phase;
use crate::steps::StepKind;

use super::coordination::{LeaseState, Steps};
use super::io::Published;
use super::machine::Machine;

impl Machine {
    // ---------------------------------------------------------------- I1 and I9

    /// I1, write path: "The gate serves the full API, the only one that admits calls
    /// changing the model, only while the agent is Ready." A phase change publishes a Ready
    /// gate exactly when it enters Ready.
    pub(super) fn assert_gate_for_phase(&self, gate: &GateView, entering: Phase) {
        assert_eq!(
            gate.phase, entering,
            "I1: the gate published on entering {entering} names {}",
            gate.phase
        );
    }

    /// I9, write path: "Published progress never runs backwards within a phase". Progress
    /// within a phase only moves forward, and never past the steps planned.
    pub(super) fn assert_progress_forward(&self, done: u32) {
        let progress = self.gate.progress;
        assert!(
            done >= progress.done,
            "I9: progress in {} ran back from {} to {done}",
            self.gate.phase,
            progress.done
        );
        assert!(
            done <= progress.total,
            "I9: progress in {} is {done} of {} planned",
            self.gate.phase,
            progress.total
        );
    }

    /// I1, I7 and I9, read path, after every dispatch that published something: what the
    /// driver will read back is what the machine is. `published` is what `Io` noted of the
    /// gates and statuses as they were published ([`Published`]), `outputs` the output
    /// queue, `phase` the phase the dispatch ended in. The dispatch's notes are cleared here.
    ///
    /// Inlined into the dispatch: most dispatches end outside Ready with the gate naming
    /// their phase and nothing noted, which passes every check below (the notes, already
    /// clear, stay so) in a few comparisons; any other goes through the checks one by one.
    #[inline]
    pub(crate) fn assert_after_dispatch(
        &self,
        phase: Phase,
        published: &mut Published,
        outputs: &VecDeque<Output>,
    ) {
        let noted = &published.dispatch;
        if self.gate.phase == phase
            && phase != Phase::Ready
            && !noted.ready_gate
            && noted.regressed.is_none()
            && noted.mismarked.is_none()
        {
            return;
        }
        self.assert_after_dispatch_in_full(phase, published, outputs);
    }

    /// [`Machine::assert_after_dispatch`], every check spelled out.
    #[inline(never)]
    fn assert_after_dispatch_in_full(
        &self,
        phase: Phase,
        published: &mut Published,
        outputs: &VecDeque<Output>,
    ) {
        let noted = std::mem::take(&mut published.dispatch);
        // I1: "The gate serves the full API, the only one that admits calls changing the
        // model, only while the agent is Ready": the gate the API reads names the machine's
        // phase.
        assert_eq!(
            self.gate.phase, phase,
            "I1: the gate names {} while the agent is {phase}",
            self.gate.phase
        );
        // I7: "An agent is Ready only when its `upgradedToVersion` equals its running
        // version."
        if phase == Phase::Ready {
            self.assert_ready_on_own_steps();
        }
        if self.mutations.gate_before_version_check {
            // The planted defect publishes a Ready gate outside Ready, breaking I1 and
            // the bookkeeping of I9: the explorer's and the simulator's checkers report it.
            return;
        }
        // I1: one dispatch makes at most one transition, so a Ready gate published in it
        // means the dispatch ended in Ready.
        assert!(
            !noted.ready_gate || phase == Phase::Ready,
            "I1: a Ready gate was published by a dispatch that ended in {phase}"
        );
        // I9: "Published progress never runs backwards within a phase".
        if let Some((gate_phase, from, to)) = noted.regressed {
            panic!("I9: progress in {gate_phase} ran back from {from} to {to}");
        }
        // I9: "every status is marked with the phase the gate last published".
        if let Some((status_phase, gate_phase, position)) = noted.mismarked {
            panic!(
                "I9: status {:?} marked {status_phase} while the gate says {gate_phase}",
                outputs.get(position)
            );
        }
    }

    // ---------------------------------------------------------------- I2 and I3

    /// I2 and I3, write path: the coordinator asks for database step `index` (or, past
    /// the last, for `db-complete`) with `fence`.
    ///
    /// I2: "Each database step's effects commit at most once per (step id, target
    /// version)": the store commits a step's effects with its checkpoint, keyed by the
    /// step's key, so the machine names every database step by its key and asks for them
    /// in plan order. I3: "Database steps commit only under the current coordinator lease
    /// (fenced writes)": every coordinator write carries the fence of the lease held, and
    /// is made only with every controller ready and the record pending.
    pub(super) fn assert_coordinator_write(
        &self,
        steps: &Steps,
        step: Option<StepIndex>,
        fence: Option<crate::lifecycle::record::LeaseToken>,
    ) {
        if let Some(index) = step {
            assert_eq!(
                self.registry.step(index).kind,
                StepKind::Database,
                "I2: step {index:?} asked for as a database step is a host step"
            );
        }
        if self.mutations.unfenced_coordinator {
            return; // The planted defect drops the fence: the checkers report I3.
        }
        let held = match steps.lease {
            LeaseState::Held(token) => Some(token),
            _ => None,
        };
        assert!(
            fence.is_some() && fence == held,
            "I3: a coordinator write fenced on {fence:?} while the lease is {:?}",
            steps.lease
        );
        assert!(
            self.all_ready(&steps.record),
            "I3: a coordinator write before every controller is ready: {:?}",
            steps.record
        );
        assert!(
            matches!(steps.record.current, Some((record, _)) if record.status == UpgradeStatus::Pending),
            "I3: a coordinator write on a record that is not pending: {:?}",
            steps.record
        );
    }

    /// I2, read path: a database step that completed is the one asked for, at
    /// `database_next` of the plan; only then does the coordinator move past it.
    pub(super) fn assert_database_step_completed(&self, steps: &Steps, index: StepIndex) {
        let plan = self.plan();
        assert_eq!(
            plan.database().get(usize::from(steps.database_next)),
            Some(&index),
            "I2: database step {index:?} completed, but the plan's next is at {}",
            steps.database_next
        );
    }

    // ---------------------------------------------------------------- I4

    /// I4, write path: "The upgrade-info record only takes valid transitions (pending →
    /// db-complete → running → complete, or → aborted; ready and done only grow; done ⊆
    /// ready)." Every compare-and-set the machine asks for replaces `current` (the record
    /// at the revision expected) by a valid successor.
    pub(super) fn assert_record_transition(&self, current: &UpgradeInfo, next: &UpgradeInfo) {
        assert!(
            current.may_become(next),
            "I4: the upgrade-info record {current:?} may not become {next:?}"
        );
    }

    /// I4, write path: a record is created pending, with nobody ready or done (everybody
    /// registers by compare-and-set), for an upgrade that moves forward.
    pub(super) fn assert_record_created(&self, record: &UpgradeInfo) {
        assert!(
            record.status == UpgradeStatus::Pending
                && record.controllers_ready.is_empty()
                && record.controllers_done.is_empty()
                && record.previous_version < record.target_version,
            "I4: a record created as {record:?}"
        );
    }

    // ---------------------------------------------------------------- I5 and I6

    /// I5, write path: "A host step's checkpoint is durable only after the step ran on that
    /// host (at least once)." The checkpoint of host step `index` is persisted only with
    /// that step's completion in hand.
    pub(super) fn assert_host_step_ran(&self, index: StepIndex, outcome: Option<&StepOutcome>) {
        if self.mutations.checkpoint_before_effects {
            return; // The planted defect persists first: the checkers report I5.
        }
        assert!(
            matches!(
                outcome,
                Some(StepOutcome::Applied | StepOutcome::AlreadyApplied)
            ),
            "I5: the checkpoint of host step {index:?} persisted with outcome {outcome:?}"
        );
    }

    /// I6, write path: "`upgradedToVersion` is written only after every planned step took
    /// effect." Every host step planned has its checkpoint; a controller finishes only
    /// once it is done in the record of this upgrade, which it marks only while the record
    /// is running, past `db-complete`, which the coordinator sets after the last database
    /// step.
    pub(super) fn assert_steps_took_effect(&self, record: Option<&RecordView>) {
        if self.mutations.upgraded_to_with_step_missing {
            return; // The planted defect skips the last host step: the checkers report I6.
        }
        if let Some(&missing) = self
            .plan()
            .host()
            .iter()
            .find(|&&index| !self.checkpointed(index))
        {
            panic!(
                "I6: upgradedToVersion advances to {} with host step {:?} not checkpointed",
                self.config.running.number,
                self.registry.key(missing)
            );
        }
        if let Some(view) = record {
            let (from, to) = (
                self.snapshot.upgraded_to_version,
                self.config.running.number,
            );
            let me = self.me();
            let done = |record: &UpgradeInfo| {
                record.describes(from, to) && record.controllers_done.contains(me)
            };
            assert!(
                view.current.is_some_and(|(record, _)| done(&record))
                    || view.last_archived.as_ref().is_some_and(done),
                "I6: {me} finishes the upgrade {from} -> {to} without being done in its record \
                 {view:?}"
            );
        }
    }

    /// I6, read path: once durable, `upgradedToVersion` names the running version and the
    /// checkpoints of the upgrade are cleared.
    pub(super) fn assert_upgraded_to_durable(&self) {
        assert!(
            self.snapshot.upgraded_to_version == self.config.running.number
                && self.snapshot.host_checkpoints.is_empty(),
            "I6: upgradedToVersion persisted as {} with checkpoints {:?}, running {}",
            self.snapshot.upgraded_to_version,
            self.snapshot.host_checkpoints,
            self.config.running.number
        );
    }

    // ---------------------------------------------------------------- I7 and I8

    /// I7: "An agent is Ready only when its `upgradedToVersion` equals its running
    /// version." Asserted on entering Ready (write path) and after every dispatch that
    /// ends in Ready and published something (read path).
    pub(super) fn assert_ready_on_own_steps(&self) {
        assert_eq!(
            self.snapshot.upgraded_to_version, self.config.running.number,
            "I7: Ready on {} with upgradedToVersion {}",
            self.config.running, self.snapshot.upgraded_to_version
        );
    }

    /// I8: "A controller is never Ready on a binary older than a database step already
    /// applied to the store (no rollback onto migrated state)." A controller falls back
    /// only on a view of the record that shows no database step of its trial's version.
    pub(super) fn assert_fall_back_safe(&self, view: &RecordView) {
        assert!(
            self.database_steps_evidence(view).is_none(),
            "I8: {} falls back on a record {view:?} that says database steps of it may \
             have run",
            self.config.running
        );
    }

    /// I8, as above: a controller that gave its upgrade up resets `agent-version` and
    /// serves again only on a view with no record current (none to wait out, none of a
    /// newer version) and no evidence that database steps of its trial ran.
    pub(super) fn assert_serving_again_safe(&self, view: &RecordView) {
        assert!(
            view.current.is_none(),
            "I8: {} serves again while the record {view:?} is current",
            self.config.running
        );
        self.assert_fall_back_safe(view);
    }
}
