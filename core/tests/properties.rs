//! Random schedules through the in-memory world (swarm testing, after TigerBeetle's VOPR).
//!
//! Each case is one configuration, a fault budget (crashes, lease expiries) and a vector of
//! choices; the choices pick, step by step, one of the world's enabled actions
//! (`world.actions()[choice % len]`), so shrinking a failure shrinks the schedule.
//!
//! - **Safety phase**: after every action, `world.check()` holds (the invariants of
//!   `spec/invariants.md`), nothing panicked, and the gate the driver serves is open only
//!   while its process is Ready (closed while the host is down).
//! - **Liveness phase**: faults healed (budgets emptied), the world runs in order until it
//!   settles; every host must end Ready, or held in StepsFailed for a reason this file names
//!   (`held_for_a_known_reason`), and the invariants must still hold.
//!
//! A failure prints the configuration, the budgets and the exact action trace; proptest
//! saves the failing seed in `properties.proptest-regressions` and replays it first next time.

mod support;

use lockstep_core::Phase;
use lockstep_core::lifecycle::{Limits, ModelView, Timer, UpgradeStatus};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::testkit::{Action, World, WorldSpec};
use proptest::prelude::*;
use support::*;

/// Actions a random prefix takes at most; the choice vector is at most this long.
const PREFIX_ACTIONS_MAX: usize = 400;
/// Actions the liveness phase may take before the world counts as stuck.
const LIVENESS_ACTIONS_MAX: usize = 10_000;

/// The configurations under test.
#[derive(Clone, Copy, Debug)]
enum Setup {
    /// `count` controllers upgraded-to 2.9.42, now running `running`.
    Upgrading { count: u8, running_patch: u32 },
    /// One controller's first boot on 2.9.43 with the auto-patch policy: it restarts into
    /// 2.9.44 (a binary on trial) and runs 2.9.44's steps there.
    FirstBootAutoPatch,
}

impl Setup {
    fn spec(self, crashes: u8, expiries: u8) -> WorldSpec {
        let mut spec = match self {
            Setup::Upgrading {
                count,
                running_patch,
            } => controllers_upgrading(
                count,
                V42,
                lockstep_core::Version::new(2, 9, running_patch),
                registry(),
            ),
            Setup::FirstBootAutoPatch => {
                let mut spec = controllers_upgrading(1, V43, V43, registry());
                spec.snapshots = vec![None];
                spec.model = ModelView {
                    policy: UpgradePolicy::AutoPatch,
                    ..spec.model
                };
                spec.catalogue = catalogue(&[V42, V43, V44]);
                spec
            }
        };
        spec.crashes = crashes;
        spec.expiries = expiries;
        spec
    }
}

/// Safety after one action: the invariants, and the driver's gate against the process.
fn check_safety(world: &World) -> Result<(), String> {
    world.check().map_err(|violation| violation.to_string())?;
    for (index, host) in world.hosts.iter().enumerate() {
        match &host.process {
            Some(process) => {
                if host.gate_phase == Phase::Ready && process.phase() != Phase::Ready {
                    return Err(format!(
                        "host {index}: gate served Ready while the process is {}",
                        process.phase()
                    ));
                }
            }
            None => {
                if host.gate_phase != Phase::Bootstrapping {
                    return Err(format!(
                        "host {index}: down, yet its gate reads {}",
                        host.gate_phase
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Holding in StepsFailed at the end is correct only for these reasons:
/// - the upgrade was aborted: a random schedule may fire `ControllersWait` at any time (the
///   world treats time as "a timer fired"), and controllers that give up waiting archive
///   the record as aborted; every controller of that upgrade then holds until an operator
///   retries (Juju does the same);
/// - a binary on trial timed out (`TrialReady` fired) after database steps of its version
///   ran, so falling back is unsafe and the agent holds (the rollback rule).
fn held_for_a_known_reason(world: &World, host: usize) -> Option<&'static str> {
    let aborted = world
        .store
        .last_archived
        .is_some_and(|record| record.status == UpgradeStatus::Aborted);
    if aborted {
        return Some("upgrade aborted (controllers wait timed out)");
    }
    let durable = world.hosts[host].durable.as_ref()?;
    let trial = durable.trial.as_ref()?;
    if trial.past_database_steps {
        return Some("trial binary past its database steps: no safe rollback");
    }
    None
}

fn run_case(setup: Setup, faults: Faults, choices: &[u16]) -> Result<(), String> {
    let Faults {
        crashes,
        expiries,
        patient,
    } = faults;
    let mut world = World::new(setup.spec(crashes, expiries));
    let mut trace: Vec<Action> = Vec::new();
    let context = |trace: &[Action], world: &World, what: String| {
        format!(
            "{what}\nsetup {setup:?}, {faults:?}\ntrace ({} actions): {:?}\nhosts: {:#?}\nstore: {:#?}",
            trace.len(),
            trace,
            world
                .hosts
                .iter()
                .map(|host| (
                    host.process.as_ref().map(|p| p.phase()),
                    host.gate_phase,
                    &host.durable
                ))
                .collect::<Vec<_>>(),
            world.store
        )
    };

    // Safety phase: a random prefix with faults.
    for &choice in choices {
        let mut actions = world.actions();
        if patient {
            actions.retain(|action| !is_long_timer(action));
        }
        if actions.is_empty() {
            break;
        }
        let action = actions[usize::from(choice) % actions.len()];
        trace.push(action);
        world.apply(action);
        if let Err(what) = check_safety(&world) {
            return Err(context(&trace, &world, format!("safety: {what}")));
        }
    }

    // Liveness phase: faults healed, the world runs in order until it settles.
    world.crashes_left = 0;
    world.expiries_left = 0;
    let taken = world.run_in_order(LIVENESS_ACTIONS_MAX);
    if taken >= LIVENESS_ACTIONS_MAX {
        return Err(context(
            &trace,
            &world,
            format!("liveness: not settled after {LIVENESS_ACTIONS_MAX} actions"),
        ));
    }
    if let Err(what) = check_safety(&world) {
        return Err(context(
            &trace,
            &world,
            format!("safety after liveness: {what}"),
        ));
    }
    for (index, host) in world.hosts.iter().enumerate() {
        let phase = host.process.as_ref().map(|process| process.phase());
        match phase {
            Some(Phase::Ready) => {
                if host.gate_phase != Phase::Ready {
                    return Err(context(
                        &trace,
                        &world,
                        format!("liveness: host {index} is Ready but its gate is closed"),
                    ));
                }
            }
            Some(Phase::StepsFailed) if held_for_a_known_reason(&world, index).is_some() => {}
            _ => {
                return Err(context(
                    &trace,
                    &world,
                    format!("liveness: host {index} ended in {phase:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// One case's faults (swarm testing: the case chooses its own fault rates, and some cases
/// see none).
#[derive(Clone, Copy, Debug)]
struct Faults {
    /// Crashes the schedule may inject.
    crashes: u8,
    /// Lease expiries the schedule may inject.
    expiries: u8,
    /// Long timers (`ControllersWait`, 15 minutes; `TrialReady`, 10 minutes) stay out of the
    /// random choices while anything else can happen: without this, a uniform choice fires
    /// them within a few actions and most multi-controller cases end aborted before the
    /// coordinator ever runs a database step.
    patient: bool,
}

/// Timers that stand for a long wait; `patient` cases keep them out of the prefix.
fn is_long_timer(action: &Action) -> bool {
    matches!(
        action,
        Action::Fire {
            timer: Timer::ControllersWait | Timer::TrialReady,
            ..
        }
    )
}

fn faults() -> impl Strategy<Value = Faults> {
    (0u8..=3, 0u8..=3, any::<bool>()).prop_map(|(crashes, expiries, patient)| Faults {
        crashes,
        expiries,
        patient,
    })
}

fn choices() -> impl Strategy<Value = Vec<u16>> {
    proptest::collection::vec(any::<u16>(), 0..=PREFIX_ACTIONS_MAX)
}

fn upgrading() -> impl Strategy<Value = Setup> {
    (1u8..=3, prop_oneof![Just(43u32), Just(44u32)]).prop_map(|(count, running_patch)| {
        Setup::Upgrading {
            count,
            running_patch,
        }
    })
}

proptest! {
    // 2 × 5000 cases with up to 400 actions each: about 3 s in a debug build on 2 cores.
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn controllers_upgrading_stay_safe_and_settle(
        setup in upgrading(),
        faults in faults(),
        choices in choices(),
    ) {
        if let Err(report) = run_case(setup, faults, &choices) {
            prop_assert!(false, "{}", report);
        }
    }

    #[test]
    fn first_boot_auto_patch_stays_safe_and_settles(
        faults in faults(),
        choices in choices(),
    ) {
        if let Err(report) = run_case(Setup::FirstBootAutoPatch, faults, &choices) {
            prop_assert!(false, "{}", report);
        }
    }
}

/// The per-action check can fail: it notices a gate left open on a host whose process is
/// gone.
#[test]
fn safety_check_notices_an_open_gate_on_a_down_host() {
    let mut world = World::new(Setup::FirstBootAutoPatch.spec(0, 0));
    world.run_in_order(LIVENESS_ACTIONS_MAX);
    assert!(check_safety(&world).is_ok());
    world.hosts[0].process = None;
    assert!(check_safety(&world).is_err());
}

/// Found by `first_boot_auto_patch_stays_safe_and_settles` at commit 60f52d2: a binary on
/// trial whose `TrialReady` timer fired while a request was in flight (here the boot
/// snapshot's persist) was held in StepsFailed ("database steps already ran", though none
/// had), and the in-flight completion was never consumed, so `Operator(Retry)` and
/// `Operator(Abort)` (both guarded on no request in flight) were ignored for ever. Expected,
/// and pinned here: the agent falls back to the previous binary. Being a controller, it
/// first reads the upgrade-info record (issue: `fall-back-onto-migrated-store`): the fall
/// back waits for the model and the record, and happens once the store shows no database
/// step of 2.9.44 can have run.
#[test]
fn trial_timeout_with_a_request_in_flight_falls_back() {
    use lockstep_core::lifecycle::{Input, Lifecycle, Output, RecordView, Request, Trial};
    use lockstep_core::{Millis, Timestamp};

    let mut snapshot = snapshot(V43);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(Trial {
        binary: binary(V44),
        boots: 0,
        past_database_steps: false,
        switches: 0,
    });
    let mut process =
        Lifecycle::new(controller(0, V44), registry(), Some(snapshot)).expect("valid");
    let drain = |process: &mut Lifecycle| {
        let mut requests = Vec::new();
        while let Some(output) = process.poll_output() {
            if let Output::Request { id, request } = output {
                requests.push((id, request));
            }
        }
        requests
    };
    // 1. Start: the boot snapshot (trial boots 1) is to be persisted; TrialReady is armed.
    process.handle(Timestamp::ZERO, Input::Start);
    let requests = drain(&mut process);
    assert!(matches!(requests[..], [(_, Request::PersistSnapshot(_))]));
    let boot_persist = requests[0].0;
    // 2. TrialReady fires before that persist completes (a disk stalled for 10 minutes):
    //    not held; the fall back waits for the store's word.
    let later = Timestamp::ZERO + Millis(10 * 60 * 1000);
    process.handle_timer(later, Timer::TrialReady);
    assert!(
        drain(&mut process).is_empty(),
        "nothing asked before the store"
    );
    assert_ne!(
        process.phase(),
        Phase::StepsFailed,
        "held, not falling back"
    );
    // 3. The boot persist completes: the model is read, then the record is.
    process.handle(later, Input::Done { id: boot_persist });
    let [(load, Request::LoadModel)] = drain(&mut process)[..] else {
        panic!("expected the model to be read");
    };
    let model = ModelView {
        agent_version: V44,
        policy: UpgradePolicy::Off,
        stream: None,
        controllers: lockstep_core::lifecycle::ControllerSet::first(1),
    };
    process.handle(later, Input::ModelLoaded { id: load, model });
    let requests = drain(&mut process);
    assert!(
        matches!(requests[..], [(_, Request::WatchRecord { .. })]),
        "{requests:?}"
    );
    // 4. No record of 2.9.43 -> 2.9.44 exists: no database step of 2.9.44 ran. The
    //    fall-back snapshot is persisted, then the process restarts into 2.9.43.
    process.handle(later, Input::RecordChanged(RecordView::default()));
    let requests = drain(&mut process);
    let [(fall_back_persist, Request::PersistSnapshot(_))] = requests[..] else {
        panic!("expected the fall-back snapshot to be persisted, got {requests:?}");
    };
    process.handle(
        later,
        Input::Done {
            id: fall_back_persist,
        },
    );
    let requests = drain(&mut process);
    assert!(
        matches!(&requests[..], [(_, Request::RestartInto(previous))] if *previous == binary(V43)),
        "{requests:?}"
    );
}

/// Regression (found by the `lifecycle_inputs` fuzz target, since fixed).
/// A record view whose *current* record has a final status (complete or aborted) reaches
/// `unreachable!("a final record is archived, never current")` in `reconcile_steps`. A
/// store that archives final records never sends one, but the view comes from outside the
/// core, and an agent must not crash on it. Expected: no panic (hold with a reason, or
/// treat the record as archived).
#[test]
fn a_final_record_as_current_does_not_panic() {
    use lockstep_core::Timestamp;
    use lockstep_core::lifecycle::{
        ControllerSet, Input, Lifecycle, Output, RecordView, Revision, UpgradeInfo,
    };

    let mut process =
        Lifecycle::new(controller(0, V43), registry(), Some(snapshot(V42))).expect("valid");
    let now = Timestamp::ZERO;
    let mut ids = Vec::new();
    let mut call = |process: &mut Lifecycle, input: Option<Input>| {
        if let Some(input) = input {
            process.handle(now, input);
        }
        while let Some(output) = process.poll_output() {
            if let Output::Request { id, .. } = output {
                ids.push(id);
            }
        }
        ids.clone()
    };
    let ids = call(&mut process, Some(Input::Start));
    let ids = call(&mut process, Some(Input::Done { id: ids[0] }));
    let model = ModelView {
        agent_version: V43,
        policy: UpgradePolicy::Off,
        stream: None,
        controllers: ControllerSet::first(1),
    };
    call(&mut process, Some(Input::ModelLoaded { id: ids[1], model }));
    assert_eq!(process.phase(), Phase::RunningSteps);
    let complete = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Complete,
        controllers_ready: ControllerSet::first(1),
        controllers_done: ControllerSet::EMPTY,
    };
    let view = RecordView {
        current: Some((complete, Revision(2))),
        last_archived: None,
        revision: Revision(2),
    };
    call(&mut process, Some(Input::RecordChanged(view))); // panics today
}

/// Regression (since fixed). A binary on trial whose `TrialReady` fires
/// while a request is in flight, once its version's database steps ran, is held in
/// StepsFailed, correctly; but the in-flight request stays awaited (StepsFailed does not
/// consume its completion), and `Operator(Retry)` / `Operator(Abort)` are guarded on no
/// request in flight, so the operator cannot act until the process restarts. Expected:
/// a held agent awaits nothing and takes the operator's retry.
#[test]
fn held_trial_takes_the_operators_retry() {
    use lockstep_core::Timestamp;
    use lockstep_core::lifecycle::{Input, Lifecycle, OperatorAction, Output, Trial};

    let mut snapshot = snapshot(V43);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(Trial {
        binary: binary(V44),
        boots: 0,
        past_database_steps: true,
        switches: 0,
    });
    let mut process =
        Lifecycle::new(controller(0, V44), registry(), Some(snapshot)).expect("valid");
    let now = Timestamp::ZERO;
    let drain = |process: &mut Lifecycle| {
        let mut ids = Vec::new();
        while let Some(output) = process.poll_output() {
            if let Output::Request { id, .. } = output {
                ids.push(id);
            }
        }
        ids
    };
    process.handle(now, Input::Start); // persist the boot snapshot: request 1
    let boot_persist = drain(&mut process)[0];
    // The trial is over; rolling back is unsafe. A controller decides once it knows the
    // model (the controllers), so bootstrapping goes on: boot persist, then the model.
    process.handle_timer(now, Timer::TrialReady);
    drain(&mut process);
    process.handle(now, Input::Done { id: boot_persist });
    let load = drain(&mut process)[0];
    let model = ModelView {
        agent_version: V44,
        policy: UpgradePolicy::Off,
        stream: None,
        controllers: lockstep_core::lifecycle::ControllerSet::first(1),
    };
    process.handle(now, Input::ModelLoaded { id: load, model });
    drain(&mut process);
    assert_eq!(
        process.phase(),
        Phase::StepsFailed,
        "held: rolling back is unsafe"
    );
    assert_eq!(process.awaiting(), None, "a held agent awaits nothing");
    process.handle(now, Input::Operator(OperatorAction::Retry));
    drain(&mut process);
    assert_ne!(
        process.phase(),
        Phase::StepsFailed,
        "the operator's retry is taken"
    );
}

/// A machine agent (no controller) on trial of a binary whose host steps fail is held in
/// StepsFailed; at its trial deadline it falls back to the binary it ran before, as a
/// controller does once the record allows it (a machine agent runs no database step, so
/// nothing stands in the way), rather than staying held until an operator acts.
#[test]
fn a_machine_agent_held_on_trial_falls_back_at_its_deadline() {
    use lockstep_core::Timestamp;
    use lockstep_core::lifecycle::{
        ControllerSet, Input, Lifecycle, Output, Request, StepOutcome, Trial,
    };

    let mut snapshot = snapshot(V42);
    snapshot.previous = Some(binary(V42));
    snapshot.trial = Some(Trial {
        binary: binary(V43),
        boots: 0,
        past_database_steps: false,
        switches: 1,
    });
    let mut process = Lifecycle::new(host_machine(V43), registry(), Some(snapshot)).expect("valid");
    let mut now = Timestamp::ZERO;
    let mut restarted_into = None;
    process.handle(now, Input::Start);
    let deadline = Limits::default().trial_ready_timeout;
    let mut requests = Vec::new();
    for _ in 0..10_000 {
        while let Some(output) = process.poll_output() {
            if let Output::Request { id, request } = output {
                requests.push((id, request));
            }
        }
        let answered = !requests.is_empty();
        for (id, request) in std::mem::take(&mut requests) {
            match request {
                Request::PersistSnapshot(_) => process.handle(now, Input::Done { id }),
                Request::LoadModel => process.handle(
                    now,
                    Input::ModelLoaded {
                        id,
                        model: ModelView {
                            agent_version: V43,
                            policy: UpgradePolicy::Off,
                            stream: None,
                            controllers: ControllerSet::first(1),
                        },
                    },
                ),
                Request::RunStep { .. } => process.handle(
                    now,
                    Input::StepFinished {
                        id,
                        outcome: StepOutcome::Failed("host step failed".to_owned()),
                    },
                ),
                Request::RestartInto(binary) => restarted_into = Some(binary),
                _ => {}
            }
        }
        if restarted_into.is_some() {
            break;
        }
        if answered {
            continue;
        }
        match process.poll_timeout() {
            Some(at) => {
                now = at.max(now);
                process.handle_timeout(now);
            }
            None => break,
        }
    }
    assert_eq!(
        restarted_into,
        Some(binary(V42)),
        "phase {:?}",
        process.phase()
    );
    assert!(
        now.0 >= deadline.0,
        "fell back at {now:?}, before the trial deadline {deadline:?}"
    );
}
