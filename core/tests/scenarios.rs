//! Whole lifecycles driven through the in-memory world, one fixed schedule each.

mod support;

use lockstep_core::Phase;
use lockstep_core::lifecycle::{ControllerSet, ModelView, UpgradeStatus};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::testkit::World;
use support::*;

fn run(world: &mut World) {
    let taken = world.run_in_order(10_000);
    assert!(taken < 10_000, "the world did not settle");
    world.check().expect("no invariant broken");
}

fn phases(world: &World) -> Vec<Phase> {
    world
        .hosts
        .iter()
        .map(|host| host.process.as_ref().expect("running").phase())
        .collect()
}

#[test]
fn one_controller_runs_its_steps_once_then_opens() {
    let mut world = world(controllers_upgrading(1, V42, V43, registry()));
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].gate_phase, Phase::Ready);
    let durable = world.hosts[0].durable.as_ref().unwrap();
    assert_eq!(durable.upgraded_to_version, V43);
    assert!(durable.host_checkpoints.is_empty());
    assert_eq!(
        world
            .store
            .database_runs
            .values()
            .copied()
            .collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(
        world.hosts[0]
            .host_runs
            .values()
            .copied()
            .collect::<Vec<_>>(),
        [1]
    );
    let archived = world.store.last_archived.expect("archived");
    assert_eq!(archived.status, UpgradeStatus::Complete);
    assert!(world.store.record.is_none());
    assert_eq!(
        world.store.capability_refreshes, 1,
        "rediscovered at the end of the upgrade"
    );
}

#[test]
fn three_controllers_coordinate_one_upgrade() {
    let mut world = world(controllers_upgrading(3, V42, V44, registry()));
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready; 3]);
    assert_eq!(
        world.store.database_runs.len(),
        2,
        "both database steps ran"
    );
    assert!(world.store.database_runs.values().all(|&runs| runs == 1));
    for host in &world.hosts {
        assert_eq!(host.durable.as_ref().unwrap().upgraded_to_version, V44);
        assert_eq!(
            host.host_runs.len(),
            2,
            "each controller ran both host steps"
        );
    }
    let archived = world.store.last_archived.expect("archived");
    assert_eq!(archived.status, UpgradeStatus::Complete);
    assert_eq!(archived.controllers_done, ControllerSet::first(3));
}

#[test]
fn default_policy_reports_upgrade_available_and_stays() {
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    spec.snapshots = vec![None];
    let mut world = world(spec);
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V43);
    assert_eq!(world.store.upgrade_available, Some(V44));
    assert_eq!(world.store.model.agent_version, V43);
}

#[test]
fn auto_upgrade_at_bootstrap_restarts_into_the_newest_patch() {
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    spec.snapshots = vec![None];
    spec.model = ModelView {
        policy: UpgradePolicy::AutoPatch,
        ..spec.model
    };
    let mut world = world(spec);
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    let host = &world.hosts[0];
    assert_eq!(host.config.running.number, V44, "restarted into 2.9.44");
    assert_eq!(world.store.model.agent_version, V44);
    let durable = host.durable.as_ref().unwrap();
    assert_eq!(durable.upgraded_to_version, V44);
    assert_eq!(
        durable.previous.as_ref().map(|binary| binary.number),
        Some(V43)
    );
    assert!(durable.trial.is_none(), "the trial ended at Ready");
    // 2.9.44's steps ran once; 2.9.43's did not (the controller was bootstrapped on it).
    let ran: Vec<String> = world
        .store
        .database_runs
        .keys()
        .map(|key| key.to_string())
        .collect();
    assert_eq!(ran, ["index-event-log@2.9.44"]);
}

#[test]
fn pinned_version_missing_from_catalogue_resets_agent_version() {
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    spec.snapshots = vec![None];
    let pinned = lockstep_core::Version::new(2, 9, 99);
    spec.model = ModelView {
        policy: UpgradePolicy::Pinned(pinned),
        agent_version: pinned,
        ..spec.model
    };
    let mut world = world(spec);
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V43);
    assert_eq!(
        world.store.model.agent_version, V43,
        "agent-version reset to the running version"
    );
}

#[test]
fn a_held_agent_says_why_in_a_status_of_its_held_phase() {
    use lockstep_core::lifecycle::{Input, Request, StepOutcome};
    use lockstep_core::steps::StepKind;
    // One controller whose host step keeps failing; everything else runs in order.
    let mut world = world(controllers_upgrading(1, V42, V43, registry()));
    let mut retries_seen = 0;
    for _ in 0..10_000 {
        let failing = world.hosts[0].in_flight.iter().position(|(_, request)| {
            matches!(request, Request::RunStep { step, .. } if world.registry.step(*step).kind == StepKind::Host)
        });
        if let Some(index) = failing {
            let (id, _) = world.hosts[0].in_flight.remove(index);
            world.deliver(
                0,
                Input::StepFinished {
                    id,
                    outcome: StepOutcome::Failed("disk full".into()),
                },
            );
            let message = world.hosts[0].status_message.clone().unwrap_or_default();
            if message.contains("failed (will retry): disk full") {
                assert_eq!(world.hosts[0].status_phase, Some(Phase::RunningSteps));
                retries_seen += 1;
            }
            continue;
        }
        if world.run_in_order(1) == 0 {
            break;
        }
    }
    world.check().expect("no invariant broken");
    assert_eq!(phases(&world), [Phase::StepsFailed]);
    assert_eq!(
        retries_seen, 4,
        "5 attempts: 4 announced retries, then giving up"
    );
    let message = world.hosts[0].status_message.clone().unwrap();
    assert!(
        message.contains("upgrade to 2.9.43 failed (giving up): disk full"),
        "{message}"
    );
    assert_eq!(
        world.hosts[0].status_phase,
        Some(Phase::StepsFailed),
        "the reason is marked with the held phase"
    );
}
