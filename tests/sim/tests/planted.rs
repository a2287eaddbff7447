//! Planted-bug checks (issue 9): with a deliberate defect switched on, the simulator must
//! find it within a bounded number of seeds. Without these, a green simulator proves
//! nothing.

use lockstep_core::lifecycle::Mutations;
use lockstep_sim::scenario::{Caps, Scenario};
use lockstep_sim::{Failure, RunOptions, run};

/// The first seed below `seeds_max` whose run fails with `checker`.
fn first_found(
    mutations: Mutations,
    without_checkers: &'static [&'static str],
    checker: &str,
    seeds_max: u64,
) -> Option<(u64, Failure)> {
    (0..seeds_max).find_map(|seed| {
        let options = RunOptions {
            mutations,
            without_checkers,
            ..RunOptions::default()
        };
        let report = run(Scenario::generate(seed, Caps::CI), options);
        report
            .failure
            .filter(|failure| failure.checker == checker)
            .map(|failure| (seed, failure))
    })
}

#[test]
fn the_gate_opened_before_the_version_check_is_found() {
    let mutations = Mutations {
        gate_before_version_check: true,
        ..Mutations::default()
    };
    // At once, where the view is published...
    let (seed, failure) =
        first_found(mutations, &[], "gate-publication", 5).expect("found within 5 seeds");
    assert!(
        failure.message.contains("checking-agent-version"),
        "seed {seed}: {failure:?}"
    );
    // ...and by a client's call admitted in that window, as a user would meet it.
    let (seed, failure) = first_found(mutations, &["gate-publication"], "gate", 150)
        .expect("a full-API call admitted outside Ready within 150 seeds");
    assert!(
        failure.message.contains("admitted"),
        "seed {seed}: {failure:?}"
    );
}

#[test]
fn a_checkpoint_before_its_step_is_found() {
    let mutations = Mutations {
        checkpoint_before_effects: true,
        ..Mutations::default()
    };
    first_found(mutations, &[], "host-steps", 10).expect("found within 10 seeds");
}

#[test]
fn upgraded_to_ahead_of_a_step_is_found() {
    let mutations = Mutations {
        upgraded_to_with_step_missing: true,
        ..Mutations::default()
    };
    first_found(mutations, &[], "upgraded-to", 10).expect("found within 10 seeds");
}

#[test]
fn an_unfenced_coordinator_is_found() {
    let mutations = Mutations {
        unfenced_coordinator: true,
        ..Mutations::default()
    };
    first_found(mutations, &[], "database-steps", 40).expect("found within 40 seeds");
}
