//! A new binary on trial: Upgrading stages it, persists the switch and restarts into it;
//! each boot of it is counted; if it does not reach Ready in time, the agent falls back to
//! the previous binary, but only while no database step of the new version can have run.
//!
//! spec/lifecycle.md, "Rules the machine keeps": "A trial binary falls back to the
//! previous one only while no step of its version is recorded (no database step ran or was
//! observed as run, `upgradedToVersion` not advanced). After that it is held: rolling back
//! after database steps is unsafe." JUJU-REFERENCE.md, "HA", bugs to avoid: "rolling the
//! version back after database steps already ran is unsafe."

use statig::Outcome::{self, Handled, Transition};

use crate::lifecycle::Timer;
use crate::lifecycle::record::{RecordView, UpgradeStatus};
use crate::lifecycle::types::{Request, StagePlan, Trial};

use super::held::{Failure, Held};
use super::io::{Io, Pending, PersistFor};
use super::machine::{Machine, State};

/// Why a binary on trial gives up.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum FallBackCause {
    /// It did not reach Ready within [`Limits::trial_ready_timeout`](crate::lifecycle::Limits).
    TimedOut,
    /// It booted more than [`Limits::trial_boots_max`](crate::lifecycle::Limits) times.
    BootsExhausted,
    /// The operator aborted the upgrade while it was held.
    Operator,
}

/// Progress of Upgrading.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Upgrade {
    pub(super) plan: StagePlan,
    pub(super) staged: bool,
    pub(super) attempts: u8,
    pub(super) retry_wait: bool,
    pub(super) restarting: bool,
}

impl Upgrade {
    /// Upgrading to `plan`'s binary; `staged` when Ready already staged it.
    pub(super) fn new(plan: StagePlan, staged: bool) -> Upgrade {
        Upgrade {
            plan,
            staged,
            attempts: 0,
            retry_wait: false,
            restarting: false,
        }
    }
}

impl Machine {
    // ---------------------------------------------------------------- Upgrading

    /// Stages the binary if it is not yet, then persists the switch (`previous` and the
    /// trial) before restarting into it.
    ///
    /// JUJU-REFERENCE.md, "Agent binary upgrade": the agent "checks the sha256 of the
    /// tarball (...), unpacks into a temp dir, renames into place", then "exits with
    /// \"must restart: an agent upgrade is available\"".
    pub(super) fn advance_upgrade(&mut self, io: &mut Io, upgrade: &mut Upgrade) {
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
        self.persist(io, PersistFor::Switch);
    }

    /// A staging answered. spec/lifecycle.md, "Rules": "3 stagings" at most, then
    /// upgrade-failed ("staging failed 3 times").
    pub(super) fn staged(
        &mut self,
        io: &mut Io,
        upgrade: &mut Upgrade,
        result: &Result<(), String>,
    ) -> Outcome<State> {
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
                Transition(State::UpgradeFailed {
                    failure: Box::new(Failure::new(reason)),
                })
            }
        }
    }

    /// The switch is durable: restart into the new binary.
    pub(super) fn switch_persisted(&mut self, io: &mut Io, upgrade: &mut Upgrade) {
        upgrade.restarting = true;
        let binary = upgrade.plan.binary.clone();
        io.exit_into(binary);
    }

    // ---------------------------------------------------------------- trial accounting

    /// Counts a boot of a binary on trial, or notices that the trial was abandoned.
    ///
    /// spec/lifecycle.md: "A switch that was persisted but whose binary never counted a
    /// boot (...) is resumed by the previous binary, at most `trial_boots_max` times
    /// (`Trial::switches`); then given up."
    pub(super) fn start_trial_accounting(&mut self, io: &mut Io) {
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

    /// spec/lifecycle.md, "Rules": "2 boots of a trial binary" at most.
    pub(super) fn trial_exhausted(&mut self, io: &mut Io) -> Option<Outcome<State>> {
        let trial = self.snapshot.trial.as_ref()?;
        if trial.binary != self.config.running || trial.boots <= self.config.limits.trial_boots_max
        {
            return None;
        }
        self.trial_over_while_booting(io, FallBackCause::BootsExhausted)
    }

    /// What a cause of giving up a trial says, for status and held reasons.
    pub(super) fn fall_back_reason(&self, cause: FallBackCause) -> String {
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
    pub(super) fn trial_over_while_booting(
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

    /// spec/lifecycle.md, "Rules": "10 minutes for a trial binary to reach Ready".
    pub(super) fn trial_timed_out(&mut self, io: &mut Io) -> Outcome<State> {
        let reason = self.fall_back_reason(FallBackCause::TimedOut);
        self.fall_back(io, reason)
    }

    // ---------------------------------------------------------------- the fall back

    /// True when the local snapshot allows falling back: a trial whose version's database
    /// steps this agent never ran or observed as run (as far as it persisted), whose steps
    /// are not recorded as done, with a previous binary to return to. A controller also
    /// needs the store's word (see [`Machine::database_steps_evidence`]).
    pub(super) fn fall_back_locally_safe(&self) -> bool {
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
    /// fall back goes through the record first (`AbortReason::FallBack` in RunningSteps,
    /// `HeldIntent::FallBack` in StepsFailed); one that reaches here anyway is held.
    pub(super) fn fall_back(&mut self, io: &mut Io, reason: String) -> Outcome<State> {
        // Safe only while the previous binary would find the state it left: no database
        // step of the new version ran, and the new version's steps are not recorded as done.
        if !self.fall_back_locally_safe() {
            return Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{reason}; the new version's steps already ran, so it is held here \
                     rather than rolled back"
                    ),
                    RecordView::default(),
                )),
            });
        }
        if self.is_controller() {
            return Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{reason}; held: a controller falls back only once the upgrade-info \
                     record says no database step of the new version ran"
                    ),
                    RecordView::default(),
                )),
            });
        }
        // spec/lifecycle.md: "A fall back waits for a store write in flight (a record
        // write, a step) to complete, so none of its effects is left behind; a read in
        // flight is abandoned."
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
    pub(super) fn fall_back_now(&mut self, io: &mut Io, reason: String) {
        self.status_message(io, format!("{reason}; falling back"));
        // A read awaited no longer matters (a hung store is a reason to fall back): its
        // completion, if it ever comes, is stale.
        self.pending = None;
        self.persist(io, PersistFor::FallBack);
    }

    /// Whether the store says database steps of the trial version may have run: the
    /// record of this upgrade (`upgradedToVersion` → the trial's version) current and all
    /// controllers ready or past pending (the coordinator runs database steps once every
    /// controller is ready), or archived complete, or archived aborted with every
    /// controller ready. A record archived aborted while some controller was not ready
    /// proves that no database step ran under it: `controllers-ready` only grows, and every
    /// change, the abort included, is a compare-and-set.
    ///
    /// spec/lifecycle.md: "A controller's snapshot is not enough for that (a crash can lose
    /// the write of `past_database_steps`): before a fall back is honoured it reads the
    /// upgrade-info record."
    pub(super) fn database_steps_evidence(&self, view: &RecordView) -> Option<String> {
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
    pub(super) fn remember_database_steps(&mut self, io: &mut Io) {
        let Some(trial) = &mut self.snapshot.trial else {
            return;
        };
        if trial.past_database_steps {
            return;
        }
        trial.past_database_steps = true;
        if self.pending.is_none() {
            self.persist(io, PersistFor::PastDatabaseSteps);
        }
    }

    /// The last word of a controller's fall back, given a fresh view of the record of its
    /// upgrade (no longer current, or not abortable): hold if the store says database steps
    /// of the trial version may have run, otherwise fall back.
    pub(super) fn fall_back_after_store_check(
        &mut self,
        io: &mut Io,
        cause: FallBackCause,
        view: &RecordView,
    ) -> Option<State> {
        let reason = self.fall_back_reason(cause);
        if let Some(evidence) = self.database_steps_evidence(view) {
            self.remember_database_steps(io);
            return Some(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{reason}; {evidence}: database steps of {} may have run, so it is held \
                     here rather than rolled back",
                        self.config.running.number
                    ),
                    *view,
                )),
            });
        }
        self.assert_fall_back_safe(view);
        self.fall_back_now(io, reason);
        None
    }

    /// The fall back is durable: restart into the previous binary.
    pub(super) fn restart_into_previous(&mut self, io: &mut Io) {
        if let Some(previous) = self.snapshot.previous.clone() {
            io.exit_into(previous);
        }
    }

    /// Why a held agent does not fall back, for its held reason.
    pub(super) fn why_no_fall_back(&self) -> &'static str {
        match &self.snapshot.trial {
            Some(trial) if trial.binary == self.config.running => {
                "the new version's steps already ran, so it is held here rather than rolled back"
            }
            _ => "held: no binary on trial here to fall back from",
        }
    }
}
