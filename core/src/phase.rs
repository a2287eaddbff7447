//! The lifecycle's observable phases and progress: what status shows, what the gate reads.

use std::fmt;

use crate::version::Version;

/// Where an agent is on its way from "just started" to "fit for work".
///
/// The names are what status, logs, metrics and `error-info` show (kebab-case on the wire).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Loading the snapshot, opening the store, discovering capabilities, registering.
    Bootstrapping,
    /// Running the upgrade steps planned for upgraded-to → running version.
    RunningSteps,
    /// Deciding the desired agent version from policy and catalogue (or the controller).
    CheckingAgentVersion,
    /// Staging, verifying and installing a binary, then restarting into it.
    Upgrading,
    /// Fit for work: the full API is open.
    Ready,
    /// Steps failed after bounded retries; held, limited, until an operator retries or aborts.
    StepsFailed,
    /// The new binary could not be staged or did not come up; fell back to the running
    /// version and reset `agent-version`.
    UpgradeFailed,
    /// No worker serves: the launcher holds the clients' connections while the worker
    /// restarts (into a new binary, or after a crash). Never a state of the lifecycle, which
    /// runs inside the worker: the view the launcher asks the gate with
    /// ([`crate::gate::between_workers`]) until the next worker takes the connections over.
    Restarting,
}

impl Phase {
    /// Every phase a gate view can show: the lifecycle's, then [`Phase::Restarting`].
    pub const ALL: [Phase; 8] = [
        Phase::Bootstrapping,
        Phase::RunningSteps,
        Phase::CheckingAgentVersion,
        Phase::Upgrading,
        Phase::Ready,
        Phase::StepsFailed,
        Phase::UpgradeFailed,
        Phase::Restarting,
    ];

    /// Every phase the lifecycle can be in, in lifecycle order (failure phases last): the
    /// rows of `spec/transitions.json`.
    pub const LIFECYCLE: [Phase; 7] = [
        Phase::Bootstrapping,
        Phase::RunningSteps,
        Phase::CheckingAgentVersion,
        Phase::Upgrading,
        Phase::Ready,
        Phase::StepsFailed,
        Phase::UpgradeFailed,
    ];

    /// The wire and log name: `bootstrapping`, `running-steps`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Bootstrapping => "bootstrapping",
            Phase::RunningSteps => "running-steps",
            Phase::CheckingAgentVersion => "checking-agent-version",
            Phase::Upgrading => "upgrading",
            Phase::Ready => "ready",
            Phase::StepsFailed => "steps-failed",
            Phase::UpgradeFailed => "upgrade-failed",
            Phase::Restarting => "restarting",
        }
    }

    /// Only Ready opens the full API.
    pub fn is_ready(self) -> bool {
        self == Phase::Ready
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far the current phase has got: what status and the gate's rejection detail report.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Progress {
    /// Steps (or, while upgrading, stages) completed so far.
    pub done: u32,
    /// Steps (or stages) planned in all; 0 when not known yet.
    pub total: u32,
    /// The version being moved to, once known.
    pub target: Option<Version>,
}
