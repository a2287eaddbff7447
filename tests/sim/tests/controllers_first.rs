//! Juju's controllers-first rule over what machines *reported*: the scenario in which a
//! controller runs, and is configured with, the new version but has not reported it yet
//! (`Upgrader.SetTools`, late with the report-lag fault). The rule that ships
//! (`lockstep_core::upgrader::desired_version`, which the simulator's API calls) keeps the
//! machine agents where they are until the report lands; a rule that read configured
//! versions would move them at once, and the `controllers-first` checker would fail the
//! run.

use lockstep_core::policy::UpgradePolicy;
use lockstep_sim::scenario::{Caps, Faults, OperatorRequest, Scenario, Start, V42, V43};
use lockstep_sim::{RunOptions, run};

/// Seed `seed`'s world narrowed to the case: an upgrade from 2.9.42 to 2.9.43 asked of
/// `controllers` controllers with four machine agents, no clients, and no fault but a
/// controller's binary report landing up to ten minutes late (within a safety phase long
/// enough for it).
fn unreported_controller(seed: u64, controllers: u8) -> Scenario {
    let mut scenario = Scenario::generate(seed, Caps::CI);
    scenario.start = Start::Upgrade;
    scenario.controllers = controllers;
    scenario.agents = 4;
    scenario.deployers = 0;
    scenario.watchers = 0;
    scenario.pollers = 0;
    scenario.policy = UpgradePolicy::Off;
    scenario.from = V42;
    scenario.agent_version = V42;
    scenario.catalogue = vec![V42, V43];
    scenario.newer_patch = None;
    scenario.request = Some(OperatorRequest {
        at_ms: 1_000,
        controller: 0,
        version: Some(V43),
    });
    scenario.faults = Faults {
        report_lag_max_ms: Some(10 * 60 * 1000),
        ..Faults::default()
    };
    scenario.safety_ms = 20 * 60 * 1000;
    scenario
}

#[test]
fn machine_agents_wait_for_a_controller_that_runs_the_new_version_but_has_not_reported_it() {
    for controllers in [1, 3] {
        let mut answers_before_a_report = 0;
        for seed in 0..8 {
            let scenario = unreported_controller(seed, controllers);
            let report = run(scenario.clone(), RunOptions::default());
            assert_eq!(report.failure, None, "{scenario}");
            answers_before_a_report += report.answers_before_a_report;
        }
        // The case arose: machine agents asked while a controller ran 2.9.43 and the store
        // still held its report of 2.9.42.
        assert!(
            answers_before_a_report > 0,
            "{controllers} controllers: no machine agent asked before a controller's report"
        );
    }
}
