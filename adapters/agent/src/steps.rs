//! lockstep's upgrade steps: the registry this build carries and the versions it plays.
//! How the daemon runs them is `daemon::step_runner`.
//!
//! The registry holds the store's own step for its schema
//! ([`lockstep_store::seed004::STEPS`]) and the agent's steps for the *next patch* of this
//! build. One build plays two versions through Juju's `FORCE-VERSION` file (the demo and
//! the end-to-end tests publish this binary as N and N+1), so N+1's steps must be in the
//! build for a real upgrade to run real steps:
//!
//! - `record-agent-binaries` (database): every controller machine records the binary its
//!   agent runs, in the same transaction as the step's checkpoint (exactly once).
//! - `prune-agent-binaries` (host, every machine): removes unpacked binaries under
//!   `tools/` other than the running one and the previous one kept for falling back;
//!   idempotent, so running it again after a crash is harmless (at least once).

use std::sync::Arc;

use lockstep_core::Version;
use lockstep_core::steps::{Step, StepRegistry, Target};

pub const RECORD_AGENT_BINARIES: &str = "record-agent-binaries";
pub const PRUNE_AGENT_BINARIES: &str = "prune-agent-binaries";

/// The version of this build (`CARGO_PKG_VERSION`).
pub fn build_version() -> Version {
    Version::parse(env!("CARGO_PKG_VERSION")).expect("the crate's version is a Juju version")
}

/// The patch after this build's version: the version whose steps this build carries.
pub fn next_patch() -> Version {
    let mut next = build_version();
    next.patch += 1;
    next
}

/// lockstep's steps.
pub fn steps() -> Vec<Step> {
    let mut steps = lockstep_store::seed004::STEPS.to_vec();
    steps.push(Step::database(
        RECORD_AGENT_BINARIES,
        next_patch(),
        "record each controller's agent binary on its machine",
    ));
    steps.push(Step::host(
        PRUNE_AGENT_BINARIES,
        next_patch(),
        &[Target::AllMachines],
        "remove unpacked agent binaries other than the running and previous ones",
    ));
    steps
}

pub fn registry() -> Arc<StepRegistry> {
    Arc::new(StepRegistry::new(&steps()).expect("lockstep's steps form a valid registry"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_valid_and_carries_the_next_patchs_steps() {
        let registry = registry();
        let next: Vec<_> = registry
            .steps()
            .iter()
            .filter(|step| step.target_version == next_patch())
            .map(|step| step.id.as_str().to_owned())
            .collect();
        assert_eq!(next, [RECORD_AGENT_BINARIES, PRUNE_AGENT_BINARIES]);
        assert!(next_patch() > build_version());
    }
}
