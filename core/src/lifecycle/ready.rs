//! Ready: the full API. While serving, the agent acts on news of the model's
//! `agent-version`, pre-stages a chosen binary before the gate closes, and (controllers)
//! tends the upgrade-info record, which nobody else may be able to move on.
//!
//! spec/lifecycle.md, "Phases", ready: "controllers watch the upgrade-info record: they join
//! one of an upgrade to the version they run as ready and done (a straggler can then
//! complete it), and archive as aborted a pending one nobody can ever proceed with".

use statig::Outcome::{self, Handled, Transition};

use crate::lifecycle::Timer;
use crate::lifecycle::record::{Revision, UpgradeInfo, UpgradeStatus};
use crate::lifecycle::types::Request;

use super::io::{Io, Pending, PersistFor};
use super::machine::{Machine, State};
use super::trial::Upgrade;
use super::version_check::{Check, OccasionKey};

impl Machine {
    /// Entering Ready: a binary on trial proved itself and bootstrap is over (persisted);
    /// controllers arm the periodic check and watch the record; news kept from earlier
    /// phases is acted on.
    pub(super) fn arrive_in_ready(&mut self, io: &mut Io, check: &mut Check) {
        self.assert_ready_on_own_steps();
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
            self.persist(io, PersistFor::ClearTrial);
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
        self.make_owed_report_lookup(io, check);
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
    pub(super) fn act_on_agent_version_news(&mut self, io: &mut Io, check: &mut Check) {
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
            self.begin_check_in_ready(io, check, OccasionKey::Operator(Some(version)));
        }
    }

    // ---------------------------------------------------------------- pre-staging

    /// spec/lifecycle.md: "A binary pre-staged while Ready that fails to stage is tried
    /// again with Upgrading's bounds (`stage_attempts_max` attempts, `stage_retry_delay`
    /// apart) while the agent keeps serving".
    pub(super) fn retry_pre_staging(&mut self, io: &mut Io, check: &mut Check) {
        match (&check.chosen, self.pending) {
            (Some(plan), None) => {
                check.stage_retry_wait = false;
                let plan = crate::lifecycle::StagePlan::clone(plan);
                self.request(io, Pending::Stage, Request::StageBinary(plan));
            }
            // Another request first (a record to retire): try again after it.
            (Some(_), Some(_)) => {
                io.set_timer(Timer::StageRetry, self.config.limits.stage_retry_delay);
            }
            (None, _) => check.stage_retry_wait = false,
        }
    }

    /// A pre-staging answered: staged, the agent upgrades (spec/lifecycle.md: "Ready -->
    /// Upgrading: operator upgrade, binary pre-staged while Ready").
    pub(super) fn pre_staged(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        result: &Result<(), String>,
    ) -> Outcome<State> {
        match result {
            Ok(()) => match check.chosen.take() {
                Some(plan) => Transition(State::Upgrading {
                    upgrade: Box::new(Upgrade::new(*plan, true)),
                }),
                None => Handled,
            },
            Err(reason) => {
                self.pre_staging_failed(io, check, reason);
                Handled
            }
        }
    }

    /// A staging of the binary chosen while Ready failed: tried again after
    /// [`Limits::stage_retry_delay`](crate::lifecycle::Limits),
    /// [`Limits::stage_attempts_max`](crate::lifecycle::Limits) times in all (the bounds of
    /// Upgrading); then the upgrade is given up. A controller that had the model name that
    /// version then resets `agent-version` to the version it runs (Juju's fix: the model
    /// must not name a version its controller cannot install, or nothing ever tries again),
    /// unless the store refuses because an upgrade-info record is current (that record's
    /// upgrade then decides). An agent other than a controller reports it.
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

    // ---------------------------------------------------------------- the record

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
    ///
    /// spec/invariants.md, L2: "No upgrade-info record stays current once no controller can
    /// proceed with it".
    pub(super) fn retire_doomed_record(&mut self, io: &mut Io, check: &mut Check) {
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
    pub(super) fn join_finished_upgrade(
        &mut self,
        io: &mut Io,
        record: UpgradeInfo,
        revision: Revision,
    ) {
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
        self.write_record(io, revision, &record, joined, None);
    }
}
