//! Issue 21, part 4: the fleet at scale in the simulator. 3 controllers and 10,000 machine
//! agents (real `Lifecycle`s, one thread) upgrade with faults: crashes, lost, held back and
//! duplicated messages, slow and jittery links, "busy" answers from the controllers'
//! download admission; downloads take time on the link model and a staged rollout admits
//! the agents, each told of its admission by its `WatchAPIVersion` watcher. The run must
//! reach its goal (every agent Ready on the target, or recorded failed by the rollout within
//! the failures it tolerates: the crash faults can exhaust a trial's boots after its steps
//! ran, which holds that agent for its operator) with every checker quiet, the rollout's
//! included, and replay to the same trace.

use std::sync::Arc;

use lockstep_core::Version;
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::rollout::{AgentView, Health, Rollout, RolloutPolicy};
use lockstep_core::{Role, Roles, Timestamp};
use lockstep_sim::checkers::{self, Checker, Observation, Setup};
use lockstep_sim::fleet::run_fleet;
use lockstep_sim::scenario::{Fleet, V42, V43};

/// The fleet test's seed.
const SEED: u64 = 21;

#[test]
#[expect(
    clippy::print_stdout,
    reason = "the figures are shown with --nocapture"
)]
fn ten_thousand_machine_agents_upgrade_with_faults_and_replay_exactly() {
    const AGENTS: u32 = 10_000;
    let first = run_fleet(SEED, AGENTS, Fleet::default());
    let summary = first.summary();
    println!("{summary}");
    assert_eq!(first.report.failure, None, "{summary}");
    let figures = first.report.fleet.clone().expect("a fleet run's figures");
    assert!(figures.last_ready_at.is_some(), "{summary}");
    assert!(
        figures.links.downloads_ms.len() >= AGENTS as usize,
        "every agent downloaded its binary from a controller: {summary}"
    );
    assert!(figures.links.busy > 0, "the admission said busy: {summary}");
    assert!(figures.crashes > 0, "processes crashed: {summary}");
    assert!(
        figures.rollout_records_seen > 0 && !figures.halted,
        "{summary}"
    );
    assert_eq!(figures.admitted, AGENTS as usize, "{summary}");
    assert!(
        figures.failed <= Fleet::default().rollout.failures_tolerated as usize,
        "{summary}"
    );

    let second = run_fleet(SEED, AGENTS, Fleet::default());
    assert_eq!(
        (
            second.report.trace_hash,
            second.report.events,
            second.report.simulated_ms
        ),
        (
            first.report.trace_hash,
            first.report.events,
            first.report.simulated_ms
        ),
        "seed {SEED} replays to the same trace"
    );
}

#[test]
fn a_small_fleet_upgrades_under_juju_s_policy_and_under_a_tight_rollout_with_and_without_rates() {
    let juju = Fleet {
        rollout: RolloutPolicy::default(),
        ..Fleet::default()
    };
    let tight = Fleet {
        max_agent_downloads: Some(2),
        slow_agents_per_million: 300_000,
        rollout: RolloutPolicy {
            canaries: 3,
            max_at_once: 10,
            failures_tolerated: 5,
            ..RolloutPolicy::default()
        },
        ..Fleet::default()
    };
    // A fleet's first rollout knows no agent's download rate when it starts: the agents
    // probe their links.
    let first_rollout = Fleet {
        rates_known: false,
        ..tight
    };
    for (name, fleet) in [
        ("juju", juju),
        ("tight", tight),
        ("tight, first rollout", first_rollout),
    ] {
        let run = run_fleet(SEED, 120, fleet);
        let summary = run.summary();
        assert_eq!(run.report.failure, None, "{name}: {summary}");
        let figures = run.report.fleet.clone().expect("figures");
        assert!(figures.last_ready_at.is_some(), "{name}: {summary}");
        // Juju's policy writes no record: every agent is told the target at once.
        assert_eq!(
            figures.rollout_records_seen == 0,
            name == "juju",
            "{summary}"
        );
        assert!(run.ratio().is_some_and(|ratio| ratio >= 1.0), "{summary}");
        // Only agents that know no rate for their link probe it.
        assert_eq!(
            figures.links.probes > 0,
            name == "tight, first rollout",
            "{summary}"
        );
    }
}

fn agent(id: &str, running: Version, health: Health) -> AgentView {
    AgentView {
        id: id.to_owned(),
        running: Some(running),
        health,
        download_rate: None,
    }
}

fn rollout_checker(policy: RolloutPolicy) -> Box<dyn Checker> {
    let setup = Setup {
        registry: Arc::new(lockstep_sim::sim::registry_for([false; 4])),
        policy: UpgradePolicy::Off,
        rollout: policy,
        from: V42,
        hosts: vec![(Roles::of(&[Role::HostMachine]), false); 4],
    };
    checkers::all(&setup)
        .into_iter()
        .find(|checker| checker.name() == "rollout")
        .expect("the rollout checker")
}

/// The rollout checker finds what it is for: a record that takes the agents in flight past
/// max-at-once, and one that admits a non-canary before the canaries are healthy.
#[test]
fn the_rollout_checker_finds_too_many_in_flight_and_an_early_non_canary() {
    let policy = RolloutPolicy {
        canaries: 1,
        max_at_once: 2,
        ..RolloutPolicy::default()
    };
    let agents = [
        agent("0", V42, Health::Ready),
        agent("1", V42, Health::Ready),
        agent("2", V42, Health::Ready),
        agent("3", V42, Health::Ready),
    ];
    let mut record = Rollout::new(V43);
    record.canaries.insert("0".to_owned());
    record.admitted.insert("0".to_owned(), Timestamp(0));
    let mut checker = rollout_checker(policy);
    let observe = |checker: &mut Box<dyn Checker>, record: &Rollout, agents: &[AgentView]| {
        checker.observe(&Observation::RolloutWritten { record, agents })
    };
    observe(&mut checker, &record, &agents).expect("the canary alone");

    let mut early = record.clone();
    early.admitted.insert("1".to_owned(), Timestamp(1));
    let error = observe(&mut checker, &early, &agents).expect_err("a non-canary too early");
    assert!(error.contains("before the canaries"), "{error}");

    let mut checker = rollout_checker(policy);
    observe(&mut checker, &record, &agents).expect("the canary alone");
    let healthy = [
        agent("0", V43, Health::Ready),
        agent("1", V42, Health::Ready),
        agent("2", V42, Health::Ready),
        agent("3", V42, Health::Ready),
    ];
    let mut wave = record.clone();
    wave.canaries_passed = true;
    for id in ["1", "2", "3"] {
        wave.admitted.insert(id.to_owned(), Timestamp(2));
    }
    let error = observe(&mut checker, &wave, &healthy).expect_err("three in flight, bound 2");
    assert!(error.contains("max-at-once is 2"), "{error}");
}
