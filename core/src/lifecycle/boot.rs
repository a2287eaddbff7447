//! Bootstrapping: every process starts here, persists its snapshot (counting a boot of a
//! binary on trial), reads the model and decides where the agent resumes.
//!
//! CONTRACT.md, "Where state lives": "Correctness comes from idempotence: on start an agent
//! plans its steps again; steps whose checkpoints exist are skipped".

use statig::Outcome::{self, Handled, Transition};

use crate::lifecycle::record::RecordView;
use crate::lifecycle::types::{ModelView, Request};

use super::coordination::{AbortReason, Steps};
use super::held::{Failure, Held};
use super::io::{Io, Pending, PersistFor};
use super::machine::{Machine, State};

/// Progress of Bootstrapping.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) enum BootStage {
    #[default]
    NotStarted,
    Persisting,
    LoadingModel,
    Capabilities,
}

impl Machine {
    /// `Start`: count the boot, and make that durable before anything else.
    pub(super) fn start_boot(&mut self, io: &mut Io, stage: &mut BootStage) {
        self.start_trial_accounting(io);
        *stage = BootStage::Persisting;
        self.persist(io, PersistFor::Boot);
    }

    /// The boot is durable: a trial out of boots gives up, a switch that never happened is
    /// resumed, otherwise the model is read.
    pub(super) fn boot_persisted(&mut self, io: &mut Io, stage: &mut BootStage) -> Outcome<State> {
        if let Some(outcome) = self.trial_exhausted(io) {
            return outcome;
        }
        if let Some(binary) = self.resume_switch.take() {
            self.status_message(io, format!("resuming the switch to agent binary {binary}"));
            io.exit_into(binary);
            return Handled;
        }
        *stage = BootStage::LoadingModel;
        self.request(io, Pending::LoadModel, Request::LoadModel);
        Handled
    }

    /// spec/lifecycle.md: "Until the agent first reaches Ready, every boot is part of the
    /// bootstrap (`Snapshot::bootstrap_complete`): capabilities are discovered and
    /// `--auto-upgrade` applies". And: "A controller leaves Bootstrapping only with the
    /// model read: it needs the set of controllers to read the record."
    pub(super) fn model_loaded_at_boot(
        &mut self,
        io: &mut Io,
        stage: &mut BootStage,
        model: &ModelView,
    ) -> Outcome<State> {
        self.model = Some(model.clone());
        if !self.snapshot.bootstrap_complete && self.is_controller() {
            *stage = BootStage::Capabilities;
            self.request(io, Pending::Capabilities, Request::RefreshCapabilities);
            return Handled;
        }
        self.leave_bootstrapping()
    }

    /// Where the agent resumes, from its snapshot and the binary it runs.
    ///
    /// spec/lifecycle.md, transitions out of Bootstrapping: "RunningSteps: upgradedToVersion
    /// < running", "CheckingAgentVersion: upgradedToVersion = running", "UpgradeFailed: the
    /// trial binary did not come up (we are the previous one)", "StepsFailed: binary older
    /// than upgradedToVersion, or trial failed after its steps".
    pub(super) fn leave_bootstrapping(&mut self) -> Outcome<State> {
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
            return Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{reason}, but database steps of the new version already ran: {running} \
                     must not serve the migrated store; install the new version again"
                    ),
                    RecordView::default(),
                )),
            });
        }
        // The previous binary serves again on the state it left: its own steps done. One
        // whose upgradedToVersion is below its version (no history writes that; a damaged
        // agent.conf might, found by fuzzing) runs its own steps first, in RunningSteps.
        if let Some(reason) = self.fell_back.take()
            && upgraded_to == running
        {
            return Transition(State::UpgradeFailed {
                failure: Box::new(Failure::new(reason)),
            });
        }
        // spec/lifecycle.md: "An older binary never starts work on state a newer one
        // migrated: it is held."
        if upgraded_to > running {
            return Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "agent binary {running} is older than upgradedToVersion {upgraded_to}; \
                     install {upgraded_to} or newer"
                    ),
                    RecordView::default(),
                )),
            });
        }
        if let Some(cause) = fall_back_due
            && !self.fall_back_locally_safe()
        {
            return Transition(State::StepsFailed {
                held: Box::new(Held::new(
                    format!(
                        "{}; the new version's steps already ran, so it is held here rather \
                     than rolled back",
                        self.fall_back_reason(cause)
                    ),
                    RecordView::default(),
                )),
            });
        }
        if upgraded_to < running {
            // A trial that is over goes through RunningSteps all the same: that is where
            // the record is read and retired before the fall back (or held, if the store
            // says database steps of this version may have run).
            return Transition(State::RunningSteps {
                steps: Box::new(Steps {
                    abort: fall_back_due.map(AbortReason::FallBack),
                    ..Steps::default()
                }),
            });
        }
        Transition(self.after_own_steps())
    }
}
