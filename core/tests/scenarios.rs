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

// ------------------------------------------------------------------ regressions of the
// simulator's findings (tests/sim, `sweep::KNOWN_ISSUES`, since fixed)

use lockstep_core::lifecycle::{
    ControllerId, Input, OperatorAction, RecordView, Request, RequestId, Revision, Snapshot,
    StagePlan, StageSource, Trial, UpgradeInfo,
};
use lockstep_core::policy::Sha256;
use lockstep_core::steps::StepKind;
use lockstep_core::testkit::{Action, WorldSpec};

/// Runs `world` in order, letting `intervene` act first at each step (it returns true when
/// it did something), until nothing is left or `steps_max` steps were taken. Checks the
/// invariants after every step.
fn run_with(world: &mut World, steps_max: usize, mut intervene: impl FnMut(&mut World) -> bool) {
    for _ in 0..steps_max {
        if !intervene(world) && world.run_in_order(1) == 0 {
            world.check().expect("no invariant broken");
            return;
        }
        world.check().expect("no invariant broken");
    }
    panic!("the world did not settle in {steps_max} steps");
}

/// A snapshot of a controller that switched from `from` to `trial` and is on trial.
fn on_trial(from: lockstep_core::Version, trial: lockstep_core::Version, boots: u8) -> Snapshot {
    let mut snapshot = snapshot(from);
    snapshot.previous = Some(binary(from));
    snapshot.trial = Some(Trial {
        binary: binary(trial),
        boots,
        past_database_steps: false,
        switches: 0,
    });
    snapshot
}

fn process_phase(world: &World, host: usize) -> Option<Phase> {
    world.hosts[host]
        .process
        .as_ref()
        .map(|process| process.phase())
}

/// The key of the registry's database step for 2.9.43.
fn database_step_43(world: &World) -> lockstep_core::steps::StepKey {
    let plan = lockstep_core::steps::plan(
        &world.registry,
        V42,
        V43,
        lockstep_core::Roles::of(&[lockstep_core::Role::Controller]),
        true,
    );
    let index = *plan.database().first().expect("a database step for 2.9.43");
    world.registry.key(index)
}

/// `stale-upgrade-record` (seed 34): controller 1 cannot stage 2.9.43 and gives the
/// upgrade up while controller 0 (on trial) waits for it in the record. Before the fix, the
/// record stayed current, so the store refused controller 1's reset of agent-version for
/// ever (Juju's rule), and controller 0, falling back at its trial timeout, was refused too.
/// Now the controller that gives up archives the record (pending, not every controller
/// ready: no database step ran) before the reset; controller 0, held by the abort, falls
/// back at its trial deadline; both end Ready on 2.9.42, nothing current.
#[test]
fn a_controller_that_gives_up_archives_the_record_before_resetting_agent_version() {
    let mut spec = controllers_upgrading(2, V42, V43, registry());
    spec.hosts[1] = controller(1, V42);
    spec.snapshots = vec![Some(on_trial(V42, V43, 0)), Some(snapshot(V42))];
    let mut world = world(spec);
    let mut refusals = 0;
    run_with(&mut world, 20_000, |world| {
        // Staging 2.9.43 fails on controller 1, every time.
        let staging = world.hosts[1]
            .in_flight
            .iter()
            .position(|(_, request)| matches!(request, Request::StageBinary(_)));
        if let Some(index) = staging {
            let (id, _) = world.hosts[1].in_flight.remove(index);
            world.deliver(
                1,
                Input::Staged {
                    id,
                    result: Err("the agent-binary stream did not answer".into()),
                },
            );
            return true;
        }
        refusals += world
            .hosts
            .iter()
            .filter(|host| {
                matches!(
                    host.completions.first(),
                    Some(Input::AgentVersionRefused { .. })
                )
            })
            .count();
        false
    });
    assert_eq!(phases(&world), [Phase::Ready, Phase::Ready]);
    for host in &world.hosts {
        assert_eq!(host.config.running.number, V42, "back on 2.9.42");
        let durable = host.durable.as_ref().unwrap();
        assert_eq!(durable.upgraded_to_version, V42);
        assert!(durable.trial.is_none());
    }
    assert_eq!(world.store.model.agent_version, V42, "agent-version reset");
    assert!(world.store.record.is_none(), "no record left current");
    let archived = world.store.last_archived.expect("archived");
    assert_eq!(archived.status, UpgradeStatus::Aborted);
    assert!(world.store.database_runs.is_empty(), "no database step ran");
    assert_eq!(
        refusals, 0,
        "agent-version was reset once nothing stood in the way"
    );
}

/// `stale-upgrade-record`, the other way in: a `CreateRecord` the driver retried lands
/// after the upgrade was archived complete. The record it creates has nobody ready (records
/// are created empty and registered into by compare-and-set, so a late create counts no
/// controller as ready), and the Ready controllers, which finished that upgrade, join it as
/// ready and done: the last one archives it. Nothing is left current to block the next
/// change of agent-version.
#[test]
fn a_create_that_lands_after_the_upgrade_is_archived_does_not_stay_current() {
    let mut world = world(controllers_upgrading(2, V42, V43, registry()));
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready; 2]);
    assert_eq!(
        world.store.last_archived.map(|record| record.status),
        Some(UpgradeStatus::Complete)
    );
    // The driver's retry of controller 0's create, landing now.
    let late = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Pending,
        controllers_ready: ControllerSet::EMPTY,
        controllers_done: ControllerSet::EMPTY,
    };
    world.hosts[0]
        .in_flight
        .push((RequestId(9_999), Request::CreateRecord(late)));
    let index = world.hosts[0].in_flight.len() - 1;
    world.apply(Action::Execute { host: 0, index });
    assert!(world.store.record.is_some(), "the late create landed");
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready; 2]);
    assert!(world.store.record.is_none(), "the late record was archived");
    let archived = world.store.last_archived.expect("archived");
    assert_eq!(archived.controllers_done, ControllerSet::first(2));
    assert_eq!(
        world
            .store
            .database_runs
            .values()
            .copied()
            .collect::<Vec<_>>(),
        [1]
    );
}

/// `machine-agent-follows-agent-version-down` (seed 202): a machine agent that upgraded to
/// 2.9.43 (and ran its steps there) is told the desired binary is 2.9.42, after a controller
/// gave an upgrade up and reset agent-version. Before the fix it switched down and ended
/// held (older than upgradedToVersion). Now it stays on 2.9.43, in Ready and when checking
/// at start.
#[test]
fn a_machine_agent_does_not_follow_agent_version_below_its_steps() {
    let plan = |id| Input::DesiredBinary {
        id,
        plan: StagePlan {
            binary: binary(V42),
            size_bytes: 1024,
            sha256: Sha256([42; 32]),
            source: StageSource::Controller,
        },
    };
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    spec.hosts = vec![host_machine(V43)];
    spec.snapshots = vec![Some(snapshot(V43))];
    spec.model = ModelView {
        agent_version: V42,
        ..spec.model
    };
    // At start: CheckingAgentVersion asks its desired binary and hears 2.9.42.
    let mut world = world(spec);
    run_with(&mut world, 1_000, |world| {
        let asked = world.hosts[0]
            .in_flight
            .iter()
            .position(|(_, request)| matches!(request, Request::DesiredBinary));
        if let Some(index) = asked {
            let (id, _) = world.hosts[0].in_flight.remove(index);
            world.deliver(0, plan(id));
            return true;
        }
        false
    });
    assert_eq!(phases(&world), [Phase::Ready]);
    // While Ready: told agent-version changed to 2.9.42.
    world.deliver(0, Input::AgentVersionChanged(V42));
    let (id, request) = world.hosts[0].in_flight.pop().expect("asks the controller");
    assert_eq!(request, Request::DesiredBinary);
    world.deliver(0, plan(id));
    assert!(
        world.hosts[0].in_flight.is_empty(),
        "nothing staged: {:?}",
        world.hosts[0].in_flight
    );
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V43);
    let message = world.hosts[0].status_message.clone().unwrap_or_default();
    assert!(
        message.contains("older than upgradedToVersion 2.9.43"),
        "{message}"
    );
    world.check().expect("no invariant broken");
}

/// `fall-back-onto-migrated-store` (seed 574): a controller on trial saw db-complete, but a
/// crash lost its write of `past_database_steps`; it then ran out of boots. Before the fix
/// it fell back on its snapshot's word alone and served Ready on 2.9.42 over a store that
/// 2.9.43's database step had migrated (I8). Now it reads the record first: past pending
/// with every controller ready, database steps may have run, so it holds on 2.9.43 (and
/// remembers why).
#[test]
fn a_trial_out_of_boots_holds_when_the_record_says_database_steps_ran() {
    let mut spec = controllers_upgrading(2, V42, V43, registry());
    spec.snapshots = vec![Some(on_trial(V42, V43, 2)), Some(snapshot(V43))];
    spec.hosts[1] = controller(1, V43);
    let mut world = world(spec);
    let key = database_step_43(&world);
    // The store as the crash left it: 2.9.43's database step applied, the record running.
    world.store.database_checkpoints.insert(key);
    world.store.database_runs.insert(key, 1);
    let record = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Running,
        controllers_ready: ControllerSet::first(2),
        controllers_done: ControllerSet::EMPTY.with(ControllerId(1)),
    };
    world.store.record = Some((record, Revision(5)));
    world.store.revision = Revision(5);
    // Only controller 0 runs (controller 1 is done and down); were it to restart into
    // 2.9.42, that binary boots too, and the I8 check would see it Ready.
    world.apply(Action::Boot { host: 0 });
    for _ in 0..200 {
        let next = world.actions().into_iter().find(|action| {
            matches!(
                action,
                Action::Execute { host: 0, .. }
                    | Action::Deliver { host: 0 }
                    | Action::Boot { host: 0 }
            )
        });
        let Some(action) = next else { break };
        world.apply(action);
        world
            .check()
            .expect("no invariant broken: never Ready on 2.9.42");
    }
    assert_eq!(process_phase(&world, 0), Some(Phase::StepsFailed));
    assert_eq!(world.hosts[0].config.running.number, V43, "not rolled back");
    let durable = world.hosts[0].durable.as_ref().unwrap();
    assert!(
        durable
            .trial
            .as_ref()
            .is_some_and(|trial| trial.past_database_steps),
        "the store's word is remembered: {durable:?}"
    );
    let message = world.hosts[0].status_message.clone().unwrap_or_default();
    assert!(message.contains("may have run"), "{message}");
    // The operator's retry resumes the upgrade on 2.9.43, which then completes.
    world.deliver(0, Input::Operator(OperatorAction::Retry));
    run_with(&mut world, 2_000, |world| {
        world.hosts[1].process.is_none() && {
            // Controller 1 stays down: only controller 0's actions.
            let next = world.actions().into_iter().find(|action| {
                matches!(
                    action,
                    Action::Execute { host: 0, .. }
                        | Action::Deliver { host: 0 }
                        | Action::Fire { host: 0, .. }
                )
            });
            match next {
                Some(action) => {
                    world.apply(action);
                    true
                }
                None => {
                    world.apply(Action::Boot { host: 1 });
                    true
                }
            }
        }
    });
    assert_eq!(phases(&world), [Phase::Ready; 2]);
    assert_eq!(world.hosts[0].config.running.number, V43);
    assert_eq!(
        world.store.last_archived.map(|record| record.status),
        Some(UpgradeStatus::Complete)
    );
    assert_eq!(
        world.store.database_runs[&key], 1,
        "the database step ran once"
    );
}

/// The other side of the same rule: when the record shows that not every controller was
/// ready (no database step can have run), the trial that is out of boots archives it as
/// aborted, then falls back; the previous binary resets agent-version and is Ready.
#[test]
fn a_trial_out_of_boots_retires_a_pending_record_then_falls_back() {
    let mut spec = controllers_upgrading(2, V42, V43, registry());
    spec.snapshots = vec![Some(on_trial(V42, V43, 2)), Some(snapshot(V42))];
    spec.hosts[1] = controller(1, V42);
    spec.model = ModelView {
        agent_version: V43,
        ..spec.model
    };
    let mut world = world(spec);
    let record = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Pending,
        controllers_ready: ControllerSet::EMPTY.with(ControllerId(0)),
        controllers_done: ControllerSet::EMPTY,
    };
    world.store.record = Some((record, Revision(5)));
    world.store.revision = Revision(5);
    // Controller 0 only (controller 1 never came).
    world.apply(Action::Boot { host: 0 });
    for _ in 0..400 {
        let next = world.actions().into_iter().find(|action| {
            matches!(
                action,
                Action::Execute { host: 0, .. }
                    | Action::Deliver { host: 0 }
                    | Action::Boot { host: 0 }
            )
        });
        let Some(action) = next else { break };
        world.apply(action);
        world.check().expect("no invariant broken");
    }
    assert_eq!(process_phase(&world, 0), Some(Phase::Ready));
    assert_eq!(world.hosts[0].config.running.number, V42, "fell back");
    assert!(world.store.record.is_none());
    assert_eq!(
        world.store.last_archived.map(|record| record.status),
        Some(UpgradeStatus::Aborted)
    );
    assert_eq!(world.store.model.agent_version, V42, "agent-version reset");
}

/// Found by the simulator while fixing the above (seed 716 of the sweep): a controller held
/// while Bootstrapping before it had read the model, then retried by the operator, ran its
/// steps knowing no controllers, so "every controller done" was trivially true: it archived
/// the record complete without a controller that had not run its steps. A controller now
/// leaves Bootstrapping only with the model read, and never counts an unknown set of
/// controllers as all ready or all done.
#[test]
fn a_retried_controller_does_not_complete_the_record_without_the_others() {
    let mut spec = controllers_upgrading(3, V42, V43, registry());
    let mut held = on_trial(V42, V43, 2);
    held.trial.as_mut().unwrap().past_database_steps = true;
    spec.snapshots = vec![Some(snapshot(V43)), Some(held), Some(snapshot(V42))];
    spec.hosts[0] = controller(0, V43);
    let mut world = world(spec);
    let key = database_step_43(&world);
    world.store.database_checkpoints.insert(key);
    world.store.database_runs.insert(key, 1);
    let record = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Running,
        controllers_ready: ControllerSet::first(3),
        controllers_done: ControllerSet::EMPTY.with(ControllerId(0)),
    };
    world.store.record = Some((record, Revision(5)));
    world.store.revision = Revision(5);
    // Controller 1 boots: out of boots, its steps past the point of no return: held.
    world.apply(Action::Boot { host: 1 });
    let only_1 = |world: &mut World| {
        let next = world.actions().into_iter().find(|action| {
            matches!(
                action,
                Action::Execute { host: 1, .. } | Action::Deliver { host: 1 }
            )
        });
        next.map(|action| world.apply(action)).is_some()
    };
    while only_1(&mut world) {
        world.check().expect("no invariant broken");
    }
    assert_eq!(process_phase(&world, 1), Some(Phase::StepsFailed));
    assert!(
        world.hosts[1]
            .process
            .as_ref()
            .unwrap()
            .awaiting()
            .is_none(),
        "a held agent awaits nothing"
    );
    world.deliver(1, Input::Operator(OperatorAction::Retry));
    while only_1(&mut world) {
        world.check().expect("no invariant broken");
    }
    // Controller 1 ran its host step and added itself to done; controller 2 has not run
    // its steps: the record is not complete.
    let (record, _) = world.store.record.expect("still current");
    assert_eq!(record.status, UpgradeStatus::Running);
    assert_eq!(
        record.controllers_done,
        ControllerSet::EMPTY
            .with(ControllerId(0))
            .with(ControllerId(1))
    );
}

/// Found by the simulator while fixing the above (seeds 864, 924 of the old sweep, shown
/// then as `stale-upgrade-record`): the operator aborted a running upgrade after controller
/// 0 had finished (Ready on 2.9.43) but before controller 1 had run its host steps. Retried,
/// controller 1 creates a record for the same upgrade; a Ready controller never registers,
/// so that record could never complete, and timed out (or was archived) for ever. The Ready
/// controller, having finished that upgrade, now joins the record as ready and done, and
/// controller 1 completes it.
#[test]
fn a_straggler_completes_an_upgrade_the_others_finished() {
    let mut spec = controllers_upgrading(2, V42, V43, registry());
    let mut straggler = on_trial(V42, V43, 0);
    straggler.trial.as_mut().unwrap().past_database_steps = true;
    spec.snapshots = vec![Some(snapshot(V43)), Some(straggler)];
    let mut world = world(spec);
    let key = database_step_43(&world);
    world.store.database_checkpoints.insert(key);
    world.store.database_runs.insert(key, 1);
    world.store.last_archived = Some(UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Aborted,
        controllers_ready: ControllerSet::first(2),
        controllers_done: ControllerSet::EMPTY.with(ControllerId(0)),
    });
    world.store.revision = Revision(5);
    // Controller 0's host step of 2.9.43 ran (it finished the upgrade before the abort).
    let host_key = lockstep_core::steps::plan(
        &world.registry,
        V42,
        V43,
        lockstep_core::Roles::of(&[lockstep_core::Role::Controller]),
        false,
    )
    .iter()
    .find(|&index| world.registry.step(index).kind == StepKind::Host)
    .map(|index| world.registry.key(index))
    .expect("a host step for 2.9.43");
    world.hosts[0].host_runs.insert(host_key, 1);
    let mut retried = false;
    run_with(&mut world, 20_000, |world| {
        if !retried && process_phase(world, 1) == Some(Phase::StepsFailed) {
            retried = true;
            world.deliver(1, Input::Operator(OperatorAction::Retry));
            return true;
        }
        false
    });
    assert!(retried, "controller 1 was held by the abort first");
    assert_eq!(phases(&world), [Phase::Ready; 2]);
    assert_eq!(world.hosts[1].config.running.number, V43);
    assert!(world.store.record.is_none());
    let archived = world.store.last_archived.expect("archived");
    assert_eq!(archived.status, UpgradeStatus::Complete);
    assert_eq!(archived.controllers_done, ControllerSet::first(2));
    assert_eq!(
        world.store.database_runs[&key], 1,
        "the database step ran once"
    );
}

/// Found by the simulator while fixing the above (seed 1457 of the old sweep, shown then as
/// `stale-upgrade-record`): an operator's retry of an agent held after all its steps ran
/// (a trial that timed out while checking its version) sent it back to RunningSteps with
/// nothing to run, where a controller created a record of an "upgrade" from 2.9.43 to
/// 2.9.43. A retry now resumes where the agent is: the version check. (The binary on trial
/// is a bootstrap's implicit upgrade, whose boots are the bootstrap's until it is Ready: a
/// boot after bootstrap on the model's agent-version has no check to time out in.)
#[test]
fn a_retry_with_no_steps_left_checks_the_version_instead() {
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    let mut held = on_trial(V42, V43, 0);
    held.upgraded_to_version = V43;
    held.bootstrap_complete = false;
    held.trial.as_mut().unwrap().past_database_steps = true;
    spec.snapshots = vec![Some(held)];
    let mut world = world(spec);
    let mut fired = false;
    let mut retried = false;
    run_with(&mut world, 5_000, |world| {
        let phase = process_phase(world, 0);
        if !fired && phase == Some(Phase::CheckingAgentVersion) {
            // The trial's deadline passes while the version is being checked: held.
            fired = true;
            world.apply(Action::Fire {
                host: 0,
                timer: lockstep_core::lifecycle::Timer::TrialReady,
            });
            return true;
        }
        if fired && !retried && phase == Some(Phase::StepsFailed) {
            retried = true;
            world.deliver(0, Input::Operator(OperatorAction::Retry));
            return true;
        }
        false
    });
    assert!(fired && retried);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert!(world.store.record.is_none());
    assert!(
        world.store.last_archived.is_none(),
        "no record was ever created: {:?}",
        world.store.last_archived
    );
    let _unused: Option<RecordView> = None;
    let _spec: Option<WorldSpec> = None;
}

/// A controller that boots after bootstrap on the model's agent-version (a restart, or the
/// boot after its own upgrade) has a check that could only stay (the policy's periodic
/// occasion): it goes to Ready without CheckingAgentVersion, and its lookup, made from
/// Ready, reports `upgrade-available` there. A mirror that is slow or loses the lookup
/// does not hold it limited.
#[test]
fn a_controller_booting_on_the_models_version_is_ready_before_its_lookup() {
    for (from, steps) in [(V43, "a restart"), (V42, "its own upgrade's boot")] {
        let mut world = world(controllers_upgrading(1, from, V43, registry()));
        let mut phases_seen = Vec::new();
        let mut looked_up_in = None;
        run_with(&mut world, 5_000, |world| {
            let phase = process_phase(world, 0);
            if phase.is_some() && phases_seen.last() != Some(&phase) {
                phases_seen.push(phase);
            }
            let looking_up = world.hosts[0]
                .in_flight
                .iter()
                .any(|(_, request)| matches!(request, Request::LookupCatalogue { .. }));
            if looking_up && looked_up_in.is_none() {
                looked_up_in = phase;
            }
            false
        });
        assert_eq!(looked_up_in, Some(Phase::Ready), "{steps}");
        assert!(
            !phases_seen.contains(&Some(Phase::CheckingAgentVersion)),
            "{steps}: {phases_seen:?}"
        );
        assert_eq!(phases(&world), [Phase::Ready], "{steps}");
        assert_eq!(world.store.upgrade_available, Some(V44), "{steps}");
    }
}

/// The same controller at its first boot (bootstrap: `--auto-upgrade` may apply), or with
/// the model naming another version, checks the version before it is Ready.
#[test]
fn a_controller_that_may_move_checks_its_version_before_ready() {
    let mut first_boot = controllers_upgrading(1, V43, V43, registry());
    first_boot.snapshots = vec![None];
    let mut model_moved = controllers_upgrading(1, V43, V43, registry());
    model_moved.model.agent_version = V44;
    for (spec, case) in [(first_boot, "first boot"), (model_moved, "model on 2.9.44")] {
        let mut world = world(spec);
        let mut looked_up_in = None;
        run_with(&mut world, 5_000, |world| {
            let looking_up = world.hosts[0]
                .in_flight
                .iter()
                .any(|(_, request)| matches!(request, Request::LookupCatalogue { .. }));
            if looking_up && looked_up_in.is_none() {
                looked_up_in = process_phase(world, 0);
            }
            false
        });
        assert_eq!(looked_up_in, Some(Phase::CheckingAgentVersion), "{case}");
    }
}

/// Every controller hears the model's agent-version move, the one that moved it too. While
/// its own upgrade to that version is under way the news is not a second request (no new
/// lookup, no "already in progress" message), also while a failed staging waits to be tried
/// again. Once the attempt is over (staging failed every time: agent-version reset), news of
/// the version starts a new check: a controller must never conclude "the model says so, so
/// it is under way" (sweep seed 17).
#[test]
fn a_controller_acts_on_agent_version_news_unless_its_own_upgrade_is_under_way() {
    let mut world = world(controllers_upgrading(1, V42, V42, registry()));
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    world.deliver(0, Input::UpgradeRequested { version: Some(V43) });
    let mut heard = 0;
    let mut failed = 0;
    run_with(&mut world, 1_000, |world| {
        let staging = world.hosts[0]
            .in_flight
            .iter()
            .position(|(_, request)| matches!(request, Request::StageBinary(_)));
        let Some(index) = staging else {
            return false;
        };
        if heard == failed {
            // News of 2.9.43 while staging it (the first time, and at each retry).
            heard += 1;
            world.hosts[0].status_message = None;
            let before = world.hosts[0].in_flight.len();
            world.deliver(0, Input::AgentVersionChanged(V43));
            assert_eq!(world.hosts[0].in_flight.len(), before, "no second request");
            assert_eq!(world.hosts[0].status_message, None);
            return true;
        }
        failed += 1;
        let (id, _) = world.hosts[0].in_flight.remove(index);
        world.deliver(
            0,
            Input::Staged {
                id,
                result: Err("disk full".to_owned()),
            },
        );
        true
    });
    assert_eq!(failed, 3, "staged as often as in Upgrading, then given up");
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V42);
    assert_eq!(
        world.store.model.agent_version, V42,
        "the model does not name a version its controller could not install"
    );
    let message = world.hosts[0].status_message.clone().unwrap_or_default();
    assert_eq!(message, "agent-version reset to 2.9.42");
    // The operator sets 2.9.43 again. The news must start a new check.
    world.store.model.agent_version = V43;
    world.deliver(0, Input::AgentVersionChanged(V43));
    assert!(
        !world.hosts[0].in_flight.is_empty(),
        "a new check starts; status: {:?}",
        world.hosts[0].status_message
    );
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V43);
}

// ------------------------------------------------------------------ decisions moved into
// the core (issue 15): the lease's deadline, agent-version news in every phase, the
// refusal of an agent-version write, controllers first from reported binaries

use lockstep_core::lifecycle::{Limits, Timer};
use lockstep_core::{Millis, Timestamp};

/// Runs only `hosts`, in order (deliver, then execute, then boot; their timers, except the
/// periodic catalogue check, only when nothing else is left), until none of them has
/// anything left to do. Checks the invariants after every step.
fn run_only(world: &mut World, hosts: &[usize]) {
    for _ in 0..10_000 {
        let actions: Vec<Action> = world
            .actions()
            .into_iter()
            .filter(|action| match *action {
                Action::Boot { host } | Action::Deliver { host } | Action::Execute { host, .. } => {
                    hosts.contains(&host)
                }
                Action::Fire { host, timer } => {
                    hosts.contains(&host) && timer != Timer::CatalogueCheck
                }
                Action::Crash { .. } | Action::ExpireLease => false,
            })
            .collect();
        let first = |wanted: fn(&Action) -> bool| actions.iter().copied().find(wanted);
        let next = first(|action| matches!(action, Action::Deliver { .. }))
            .or_else(|| first(|action| matches!(action, Action::Execute { .. })))
            .or_else(|| first(|action| matches!(action, Action::Boot { .. })))
            .or_else(|| first(|action| matches!(action, Action::Fire { .. })));
        let Some(action) = next else {
            return;
        };
        world.apply(action);
        world.check().expect("no invariant broken");
    }
    panic!("hosts {hosts:?} did not settle");
}

fn timer_at(world: &World, host: usize, wanted: Timer) -> Option<Timestamp> {
    world.hosts[host]
        .process
        .as_ref()
        .expect("running")
        .timers()
        .find(|(timer, _)| *timer == wanted)
        .map(|(_, at)| at)
}

#[test]
fn the_lease_lives_five_keep_alives_and_is_given_up_one_interval_before_it_may_expire() {
    let limits = Limits::default();
    assert_eq!(limits.lease_keepalive_interval, Millis(1_000));
    assert_eq!(limits.lease_ttl(), Millis(5_000));
    assert_eq!(limits.lease_keepalive_deadline(), Millis(4_000));
    let fast = Limits {
        lease_keepalive_interval: Millis(200),
        ..limits
    };
    assert_eq!(fast.lease_ttl(), Millis(1_000));
    assert_eq!(fast.lease_keepalive_deadline(), Millis(800));
}

/// A coordinator's keep-alive that the store never answers: at the deadline (the lease's
/// TTL less one interval after it was sent) the core gives the lease up exactly as if the
/// store had said it was lost, and campaigns again after its delay; the answer that comes
/// late is ignored by its id. The upgrade then completes under a lease taken again.
#[test]
fn a_keep_alive_unanswered_by_its_deadline_gives_the_lease_up() {
    use lockstep_core::lifecycle::LeaseToken;
    let mut world = world(controllers_upgrading(1, V42, V43, registry()));
    // Run until the coordinator holds its lease: its keep-alive timer is armed (and its
    // first database step asked, which stays in flight meanwhile).
    let mut held = false;
    for _ in 0..1_000 {
        if world.hosts[0].process.is_some() && timer_at(&world, 0, Timer::LeaseKeepAlive).is_some()
        {
            held = true;
            break;
        }
        assert!(world.run_in_order(1) > 0, "the world settled first");
    }
    assert!(held, "the coordinator took its lease");
    let (_, token) = world.store.lease.expect("the lease is held");
    // The keep-alive is sent one interval later; the store never answers it.
    let interval = Limits::default().lease_keepalive_interval;
    world.advance(interval);
    world.apply(Action::Fire {
        host: 0,
        timer: Timer::LeaseKeepAlive,
    });
    let index = world.hosts[0]
        .in_flight
        .iter()
        .position(|(_, request)| matches!(request, Request::KeepAliveLease(_)))
        .expect("a keep-alive sent");
    let (keepalive, _) = world.hosts[0].in_flight.remove(index);
    let sent = world.now;
    assert_eq!(
        timer_at(&world, 0, Timer::LeaseDeadline),
        Some(sent + Limits::default().lease_keepalive_deadline()),
        "the deadline is armed when the keep-alive is sent"
    );
    // At the deadline, the lease is given up: no keep-alive, a campaign after the delay.
    world.advance(Limits::default().lease_keepalive_deadline());
    world.apply(Action::Fire {
        host: 0,
        timer: Timer::LeaseDeadline,
    });
    assert_eq!(timer_at(&world, 0, Timer::LeaseKeepAlive), None);
    assert_eq!(timer_at(&world, 0, Timer::LeaseDeadline), None);
    assert_eq!(
        timer_at(&world, 0, Timer::LeaseRetry),
        Some(world.now + Limits::default().lease_retry_delay),
        "it campaigns again after its delay"
    );
    // The answer arrives late: ignored by its id (no keep-alive timer re-armed).
    let before = world.hosts[0].in_flight.len();
    world.deliver(
        0,
        Input::LeaseAnswered {
            id: keepalive,
            lease: Some(LeaseToken(token.0)),
        },
    );
    assert_eq!(timer_at(&world, 0, Timer::LeaseKeepAlive), None);
    assert_eq!(world.hosts[0].in_flight.len(), before, "nothing asked");
    // The store still has the lease (nobody else wanted it): the campaign gets it back and
    // the upgrade completes, its database step once.
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(
        world.store.last_archived.map(|record| record.status),
        Some(UpgradeStatus::Complete)
    );
    assert!(world.store.database_runs.values().all(|&runs| runs == 1));
}

/// The model's agent-version moves while the controller is still running its steps: the
/// core keeps the news (no request, no phase change) and acts on it when it reaches Ready,
/// pre-staging there. Before, the news was dropped outside Ready and each driver kept its
/// own copy to send again.
#[test]
fn agent_version_news_before_ready_is_acted_on_at_ready() {
    let mut world = world(controllers_upgrading(1, V42, V43, registry()));
    let mut told = false;
    let mut staged_in = None;
    run_with(&mut world, 10_000, |world| {
        let phase = process_phase(world, 0);
        if !told && phase == Some(Phase::RunningSteps) {
            told = true;
            // An operator sets agent-version 2.9.44 while 2.9.43's steps run.
            world.store.model.agent_version = V44;
            let before = world.hosts[0].in_flight.len();
            world.deliver(0, Input::AgentVersionChanged(V44));
            let process = world.hosts[0].process.as_ref().unwrap();
            assert_eq!(process.phase(), Phase::RunningSteps, "no phase change");
            assert_eq!(process.agent_version_news(), Some(V44), "kept");
            assert_eq!(world.hosts[0].in_flight.len(), before, "nothing asked");
            return true;
        }
        if staged_in.is_none()
            && world.hosts[0].in_flight.iter().any(|(_, request)| {
                matches!(request, Request::StageBinary(plan) if plan.binary.number == V44)
            })
        {
            staged_in = phase;
        }
        false
    });
    assert!(told);
    assert_eq!(
        staged_in,
        Some(Phase::Ready),
        "acted on in Ready, pre-staging"
    );
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V44);
    assert_eq!(
        world.hosts[0].durable.as_ref().unwrap().upgraded_to_version,
        V44
    );
}

/// Juju accepts the current value of agent-version back. When the store refuses a write
/// although the model already holds the value asked for (another controller wrote it
/// first, a record is current), the core itself treats the write as done and goes on; a
/// refusal that found another value is a refusal.
#[test]
fn a_refused_agent_version_write_the_model_already_holds_is_done() {
    let record = UpgradeInfo {
        previous_version: V43,
        target_version: V44,
        status: UpgradeStatus::Pending,
        controllers_ready: ControllerSet::EMPTY,
        controllers_done: ControllerSet::EMPTY,
    };
    let view = RecordView {
        current: Some((record, Revision(9))),
        last_archived: None,
        revision: Revision(9),
    };
    for (model_holds, expected) in [(V44, true), (V43, false)] {
        let mut world = world(controllers_upgrading(1, V43, V43, registry()));
        run(&mut world);
        assert_eq!(phases(&world), [Phase::Ready]);
        world.deliver(0, Input::UpgradeRequested { version: Some(V44) });
        let write = loop {
            if let Some(index) = world.hosts[0]
                .in_flight
                .iter()
                .position(|(_, request)| matches!(request, Request::SetAgentVersion(_)))
            {
                break world.hosts[0].in_flight.remove(index);
            }
            assert!(world.run_in_order(1) > 0, "an agent-version write is asked");
        };
        assert_eq!(write.1, Request::SetAgentVersion(V44));
        world.hosts[0].status_message = None;
        world.deliver(
            0,
            Input::AgentVersionRefused {
                id: write.0,
                agent_version: model_holds,
                view,
            },
        );
        let staging = world.hosts[0]
            .in_flight
            .iter()
            .any(|(_, request)| matches!(request, Request::StageBinary(_)));
        assert_eq!(staging, expected, "model holds {model_holds}");
        let message = world.hosts[0].status_message.clone().unwrap_or_default();
        assert_eq!(
            message.contains("upgrade to 2.9.44 not started"),
            !expected,
            "model holds {model_holds}: {message}"
        );
        world.check().expect("no invariant broken");
    }
}

/// Juju's controllers-first rule, decided by the core from what the hosts *reported*:
/// controller 1 is configured to run 2.9.44 (its binary is switched) but last reported
/// 2.9.43, so a machine agent is told to stay on 2.9.43; a copy of the rule that read
/// configured versions would send it to 2.9.44 ahead of its controller. Once controller 1
/// starts on 2.9.44 and reports it, the machine agent follows.
#[test]
fn controllers_first_reads_reported_binaries_not_configured_ones() {
    let mut spec = controllers_upgrading(2, V44, V44, registry());
    spec.hosts.push(host_machine(V43));
    spec.snapshots.push(Some(snapshot(V43)));
    let mut world = world(spec);
    // Controller 1 reported 2.9.43 before it was switched; it has not started since.
    world.store.reported[1] = Some(binary(V43));
    run_only(&mut world, &[0]);
    assert_eq!(process_phase(&world, 0), Some(Phase::Ready));
    assert_eq!(world.store.reported[0], Some(binary(V44)));
    assert_eq!(
        world.hosts[1].config.running.number, V44,
        "configured 2.9.44"
    );
    // The machine agent asks: controller 1 has not reported 2.9.44, so it stays.
    run_only(&mut world, &[2]);
    assert_eq!(process_phase(&world, 2), Some(Phase::Ready));
    assert_eq!(
        world.hosts[2].config.running.number, V43,
        "waits for controller 1"
    );
    // Controller 1 starts on 2.9.44 and reports it; the model's news reaches the agent.
    run_only(&mut world, &[1]);
    assert_eq!(world.store.reported[1], Some(binary(V44)));
    world.deliver(2, Input::AgentVersionChanged(V44));
    run_only(&mut world, &[2]);
    assert_eq!(process_phase(&world, 2), Some(Phase::Ready));
    assert_eq!(
        world.hosts[2].config.running.number, V44,
        "follows its controllers"
    );
}

/// Found by the sweep once the simulator fed each agent-version change once (seed 20 of
/// `--seeds 0..2000`): an operator's upgrade pre-staged while Ready failed its one staging
/// (a corrupt download), and the controller gave it up there, leaving the model naming
/// 2.9.43 while it ran 2.9.42, and nothing would ever try again (the simulator had been
/// feeding the same news every minute, which no driver does). A failed pre-staging is now
/// tried again as in Upgrading: here the second attempt succeeds and the upgrade completes.
#[test]
fn a_failed_pre_staging_in_ready_is_tried_again() {
    let mut world = world(controllers_upgrading(1, V42, V42, registry()));
    run(&mut world);
    world.deliver(0, Input::UpgradeRequested { version: Some(V43) });
    let mut failed = false;
    run_with(&mut world, 1_000, |world| {
        if failed {
            return false;
        }
        let Some(index) = world.hosts[0]
            .in_flight
            .iter()
            .position(|(_, request)| matches!(request, Request::StageBinary(_)))
        else {
            return false;
        };
        failed = true;
        let (id, _) = world.hosts[0].in_flight.remove(index);
        world.deliver(
            0,
            Input::Staged {
                id,
                result: Err("sha256 mismatch".to_owned()),
            },
        );
        let message = world.hosts[0].status_message.clone().unwrap_or_default();
        assert!(
            message.contains("failed (will retry): sha256 mismatch"),
            "{message}"
        );
        assert_eq!(process_phase(world, 0), Some(Phase::Ready), "still serving");
        assert!(
            timer_at(world, 0, Timer::StageRetry).is_some(),
            "a retry is armed"
        );
        true
    });
    assert!(failed);
    assert_eq!(phases(&world), [Phase::Ready]);
    assert_eq!(world.hosts[0].config.running.number, V43);
    assert_eq!(world.store.model.agent_version, V43);
}

/// Found by the `lifecycle_inputs` fuzz target: the last archived record names this
/// controller done, but this host has no checkpoint of its host step (a damaged store, or
/// a restored disk). It runs the step before it finishes, instead of breaking I6.
#[test]
fn a_controller_named_done_by_an_archived_record_runs_its_missing_host_steps_first() {
    let spec = controllers_upgrading(1, V42, V43, registry());
    let mut world = World::new(spec);
    world.store.last_archived = Some(lockstep_core::lifecycle::UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Complete,
        controllers_ready: ControllerSet::first(1),
        controllers_done: ControllerSet::first(1),
    });
    world.store.revision = lockstep_core::lifecycle::Revision(2);
    // The upgrade's database step did run, once, as the complete record says.
    let database_step = lockstep_core::steps::StepKey::parse("add-machine-roles@2.9.43").unwrap();
    world.store.database_checkpoints.insert(database_step);
    world.store.database_runs.insert(database_step, 1);
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    let durable = world.hosts[0].durable.as_ref().unwrap();
    assert_eq!(durable.upgraded_to_version, V43);
    // The record was complete: the database step did not run again.
    assert_eq!(world.store.database_runs.get(&database_step), Some(&1));
}

/// Found by the `lifecycle_inputs` fuzz target: the previous binary, back after a failed
/// trial, finds `upgradedToVersion` below its own version (no history writes that; a
/// damaged agent.conf might). It runs its own steps and is Ready on its own version,
/// instead of serving as UpgradeFailed on steps not run (I7).
#[test]
fn a_previous_binary_back_below_its_own_version_runs_its_steps_before_serving() {
    let mut spec = controllers_upgrading(1, V42, V43, registry());
    let mut snapshot = snapshot(V42);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(lockstep_core::lifecycle::Trial {
        binary: binary(V44),
        boots: 1,
        past_database_steps: false,
        switches: 0,
    });
    spec.snapshots = vec![Some(snapshot)];
    let mut world = World::new(spec);
    run(&mut world);
    assert_eq!(phases(&world), [Phase::Ready]);
    let host = &world.hosts[0];
    assert_eq!(host.config.running.number, V43);
    assert_eq!(host.durable.as_ref().unwrap().upgraded_to_version, V43);
}

/// Answers the first `fail` catalogue lookups of host 0 with an error, as if each were lost
/// on its way (the driver's timeout), and runs the world until it settles; returns the
/// status messages host 0 showed meanwhile.
fn lose_lookups(world: &mut World, fail: usize) -> Vec<String> {
    let mut failed = 0;
    let mut messages = Vec::new();
    run_with(world, 5_000, |world| {
        if let Some(message) = world.hosts[0].status_message.take() {
            messages.push(message);
        }
        let lookup = world.hosts[0]
            .in_flight
            .iter()
            .position(|(_, request)| matches!(request, Request::LookupCatalogue { .. }));
        let Some(index) = lookup.filter(|_| failed < fail) else {
            return false;
        };
        failed += 1;
        let (id, _) = world.hosts[0].in_flight.remove(index);
        world.deliver(
            0,
            Input::CatalogueFound {
                id,
                result: Err("the agent-binary stream did not answer within 30s".to_owned()),
            },
        );
        true
    });
    if let Some(message) = world.hosts[0].status_message.take() {
        messages.push(message);
    }
    assert_eq!(failed, fail, "{messages:?}");
    messages
}

/// A lookup made while Ready for an operator's request, and one for the model's
/// agent-version news, that fails (lost on its way: the simulator's fleet seed 8 lost one
/// and nothing ever asked again) is tried again, up to the 3 lookups CheckingAgentVersion
/// allows, `catalogue_retry_delay` apart; the upgrade then goes on.
#[test]
fn a_lookup_lost_while_ready_is_tried_again_for_an_operators_request_and_for_news() {
    // The operator's request: two lookups lost, the third answers.
    let mut operator = world(controllers_upgrading(1, V42, V42, registry()));
    run(&mut operator);
    assert_eq!(phases(&operator), [Phase::Ready]);
    operator.deliver(0, Input::UpgradeRequested { version: Some(V43) });
    let messages = lose_lookups(&mut operator, 2);
    assert!(
        messages
            .iter()
            .any(|message| message.starts_with("agent binary lookup failed (will retry)")),
        "{messages:?}"
    );
    assert_eq!(phases(&operator), [Phase::Ready]);
    assert_eq!(operator.hosts[0].config.running.number, V43, "{messages:?}");
    assert_eq!(operator.store.model.agent_version, V43);

    // The model's news (another controller, or the operator through the store, moved it):
    // one lookup lost, the next answers.
    let mut news = world(controllers_upgrading(1, V42, V42, registry()));
    run(&mut news);
    news.store.model.agent_version = V43;
    news.deliver(0, Input::AgentVersionChanged(V43));
    lose_lookups(&mut news, 1);
    assert_eq!(phases(&news), [Phase::Ready]);
    assert_eq!(news.hosts[0].config.running.number, V43);
}

/// Three lookups lost in a row: the request is given up, said so, and nothing is left
/// waiting; the operator's next request starts afresh (three lookups again).
#[test]
fn a_lookup_lost_three_times_while_ready_gives_the_request_up_and_the_next_starts_afresh() {
    let mut world = world(controllers_upgrading(1, V42, V42, registry()));
    run(&mut world);
    world.deliver(0, Input::UpgradeRequested { version: Some(V43) });
    let messages = lose_lookups(&mut world, 3);
    assert_eq!(
        messages.last().map(String::as_str),
        Some(
            "agent binary lookup failed (giving up): the agent-binary stream did not answer within 30s"
        ),
        "{messages:?}"
    );
    assert!(world.hosts[0].in_flight.is_empty());
    assert_eq!(world.hosts[0].config.running.number, V42);
    world.deliver(0, Input::UpgradeRequested { version: Some(V43) });
    lose_lookups(&mut world, 2);
    assert_eq!(world.hosts[0].config.running.number, V43);
}
