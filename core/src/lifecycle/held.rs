//! The two phases where an upgrade stopped: StepsFailed (held with a reason until an
//! operator acts, or a trial gives up) and UpgradeFailed (the previous binary, or a binary
//! that could not upgrade, resets `agent-version` and returns to Ready).
//!
//! JUJU-REFERENCE.md, "Upgrade steps": after the last attempt "the agent then stays up,
//! limited, until an operator acts."

use statig::Outcome::{self, Handled, Transition};

use crate::lifecycle::record::{RecordView, UpgradeStatus};
use crate::lifecycle::types::{RecordWrite, Request};

use super::coordination::Steps;
use super::io::{Io, Pending, PersistFor};
use super::machine::{Machine, State};
use super::trial::FallBackCause;

/// Why steps are held.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Held {
    pub(super) reason: String,
    pub(super) record: RecordView,
    /// A view of the record arrived in this phase: `record` is no older than the phase.
    pub(super) seen: bool,
    /// A watch was asked for in this phase.
    pub(super) watching: bool,
    /// What the held agent is doing about its upgrade, if anything.
    pub(super) intent: Option<HeldIntent>,
}

impl Held {
    pub(super) fn new(reason: String, record: RecordView) -> Held {
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
    pub(super) reason: String,
    pub(super) reset_done: bool,
    /// Controllers: the upgrade-info record, watched before `agent-version` is reset (the
    /// store refuses the reset while a record is current).
    pub(super) record: RecordView,
    pub(super) seen: bool,
    pub(super) watching: bool,
}

impl Failure {
    pub(super) fn new(reason: String) -> Failure {
        Failure {
            reason,
            reset_done: false,
            record: RecordView::default(),
            seen: false,
            watching: false,
        }
    }
}

impl Machine {
    // ---------------------------------------------------------------- StepsFailed

    /// The operator's retry. spec/lifecycle.md, "Choices made": "An operator's retry of a
    /// held agent resumes where the agent is: its steps if some are left, the version check
    /// if `upgradedToVersion` is its running version, nothing (held) if it is older than the
    /// steps recorded."
    pub(super) fn retry_held(&mut self, io: &mut Io, held: &mut Held) -> Outcome<State> {
        let upgraded_to = self.snapshot.upgraded_to_version;
        let running = self.config.running.number;
        if upgraded_to < running {
            Transition(State::RunningSteps {
                steps: Box::new(Steps {
                    retrying: true,
                    ..Steps::default()
                }),
            })
        } else if upgraded_to == running {
            Transition(self.after_own_steps())
        } else {
            let message = held.reason.clone();
            self.status_message(io, message);
            Handled
        }
    }

    /// A held agent on trial gives up at its deadline, like any other trial: a controller
    /// once the record says no database step of the new version ran, an agent that is no
    /// controller at once (it runs no database step). An agent other than a controller that
    /// falls back is not sent to the same binary again when its controllers run a staged
    /// rollout: it is recorded failed, and told the version it runs (`spec/rollout.md`).
    pub(super) fn trial_over_while_held(&mut self, io: &mut Io, held: &mut Held) -> Outcome<State> {
        if held.intent.is_none() {
            held.intent = Some(HeldIntent::FallBack(FallBackCause::TimedOut));
        }
        self.advance_held(io, held)
    }

    /// A record write of a held controller answered (an abort, or a trial's retirement).
    pub(super) fn held_record_written(
        &mut self,
        io: &mut Io,
        held: &mut Held,
        write: &RecordWrite,
    ) -> Outcome<State> {
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

    /// Works on what a held agent intends: for a controller, first a fresh view of the
    /// record, then the operator's abort (archive the current record), then the fall back
    /// (retire this upgrade's record while no database step can have run under it, and
    /// fall back unless the store says database steps of this version may have run).
    pub(super) fn advance_held(&mut self, io: &mut Io, held: &mut Held) -> Outcome<State> {
        let Some(intent) = held.intent else {
            return Handled;
        };
        if self.pending.is_some() {
            return Handled;
        }
        if !self.is_controller() {
            // No record to consult: the snapshot decides.
            held.intent = None;
            let cause = match intent {
                HeldIntent::OperatorAbort => FallBackCause::Operator,
                HeldIntent::FallBack(cause) => cause,
            };
            return self.give_up_held(io, held, cause);
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
        // spec/lifecycle.md: "A current pending record that not every controller is ready
        // for is archived as aborted first; the compare-and-set succeeding proves no
        // database step ran under it".
        if let Some((record, revision)) = held.record.current
            && record.describes(from, to)
            && record.status == UpgradeStatus::Pending
            && self.known_not_all_ready(&held.record)
        {
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

    /// An operator's abort or the trial's end while held, for an agent with no record to
    /// consult: fall back to the previous binary when the snapshot says it is safe, else
    /// stay held.
    fn give_up_held(
        &mut self,
        io: &mut Io,
        held: &mut Held,
        cause: FallBackCause,
    ) -> Outcome<State> {
        held.reason = self.fall_back_reason(cause);
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

    // ---------------------------------------------------------------- UpgradeFailed

    /// Works towards Ready: a controller first watches the record, retires what stands in
    /// the way of the reset (or holds), resets `agent-version` to the version it runs; then
    /// the trial is cleared, and the agent is Ready once that is durable.
    pub(super) fn advance_failure(&mut self, io: &mut Io, failure: &mut Failure) -> Outcome<State> {
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
            self.assert_serving_again_safe(&failure.record);
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
        self.persist(io, PersistFor::ClearTrial);
        Handled
    }

    /// `agent-version` is reset to the version this controller runs.
    ///
    /// spec/lifecycle.md: "A reset of `agent-version` after a failed upgrade answers the
    /// news of the version given up."
    pub(super) fn agent_version_reset(
        &mut self,
        io: &mut Io,
        failure: &mut Failure,
    ) -> Outcome<State> {
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

    /// Before a controller that gave its upgrade up resets `agent-version`: `None` when
    /// nothing stands in the way. A pending record that not every controller is ready for
    /// can never proceed (this controller will not register in it) and no database step ran
    /// under it: it is archived as aborted, by compare-and-set. A record that may have had
    /// database steps run for a newer version than this binary, current or (for the trial
    /// this controller fell back from) archived, means this binary must not serve: held.
    /// Any other record (someone's upgrade to this version, past pending) is waited out.
    ///
    /// spec/lifecycle.md: "The previous binary checks again in UpgradeFailed before it
    /// serves" (invariant I8).
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
                return Some(Transition(State::StepsFailed {
                    held: Box::new(Held::new(
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
                    )),
                }));
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
            return Some(Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{}; but {evidence}: database steps of the new version may have run, and \
                     {running} must not serve that store; install the new version again",
                        failure.reason
                    ),
                    failure.record,
                )),
            }));
        }
        None
    }
}
