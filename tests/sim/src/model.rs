//! Model checking with stateright (issue 9, part 3), over the real core.
//!
//! - [`HaUpgrade`]: the HA upgrade coordination of 2 or 3 controllers through the
//!   upgrade-info record, with the coordinator lease's expiry and fenced writes, crashes
//!   and restarts. Its states are `lockstep_core::testkit::World`s, which drive real
//!   `Lifecycle`s against the testkit's model of the store's operations (create-if-absent,
//!   compare-and-set, lease with expiry, fenced writes, watch from a revision), so every
//!   path stateright explores is a run of the real core, and every counterexample is
//!   replayed through it ([`replay`]). Lost messages appear as lost lease keep-alives
//!   (an expiry) and crashes; generic message loss is the simulator's.
//! - [`WatchProtocol`]: the client's resume protocol: a watcher using the real
//!   `lockstep_core::client::WatchPosition` against a log that grows, with replies lost,
//!   duplicated and reordered (bounded), must deliver every change once, in order.
//!
//! Both are checked with `always` and `sometimes` properties, breadth first, under a state
//! and time cap; the report says whether the space was exhausted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_core::client::WatchPosition;
use lockstep_core::lifecycle::{
    Config, ControllerId, ControllerSet, Limits, ModelView, Mutations, Revision, Snapshot,
    UpgradeStatus,
};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::steps::{Step, StepRegistry, Target};
use lockstep_core::testkit::{Action, World, WorldSpec};
use lockstep_core::{Phase, Role, Roles, Version};
use stateright::{Checker, Model, Property};

use crate::scenario::{V42, V43};

/// A configuration of the HA model.
#[derive(Clone, Debug)]
pub struct HaUpgrade {
    pub name: &'static str,
    world: World,
}

fn controller(id: u8) -> Config {
    Config {
        controller: Some(ControllerId(id)),
        roles: Roles::of(&[Role::Controller]),
        running: lockstep_core::Binary::new(V43, "ubuntu", "amd64").expect("a binary"),
        limits: Limits::default(),
    }
}

impl HaUpgrade {
    /// `controllers` upgraded-to 2.9.42 restart on 2.9.43 and coordinate its steps (a
    /// database step, and a host step when `host_step`), with at most `crashes` crashes
    /// and `expiries` lease expiries.
    pub fn new(
        name: &'static str,
        controllers: u8,
        host_step: bool,
        crashes: u8,
        expiries: u8,
        mutations: Mutations,
    ) -> HaUpgrade {
        let mut steps = vec![Step::database(
            "add-machine-roles",
            V43,
            "store roles beside legacy jobs",
        )];
        if host_step {
            steps.push(Step::host(
                "rewrite-agent-conf",
                V43,
                &[Target::AllMachines],
                "new agent.conf keys",
            ));
        }
        let registry = Arc::new(StepRegistry::new(&steps).expect("a valid registry"));
        let mut snapshot = Snapshot::bootstrapped(&controller(0).running);
        snapshot.upgraded_to_version = V42;
        snapshot.bootstrap_complete = true;
        let mut world = World::new(WorldSpec {
            registry,
            catalogue: lockstep_core::policy::Catalogue::default(),
            model: ModelView {
                agent_version: V43,
                policy: UpgradePolicy::Off,
                stream: None,
                controllers: ControllerSet::first(controllers),
            },
            hosts: (0..controllers).map(controller).collect(),
            snapshots: (0..controllers).map(|_| Some(snapshot.clone())).collect(),
            crashes,
            expiries,
        });
        // Time is abstract: timeouts never fire early, the periodic check never.
        world.timeouts_left = 0;
        world.catalogue_checks_left = 0;
        world.mutations = mutations;
        HaUpgrade { name, world }
    }
}

fn upgraded(world: &World) -> bool {
    world.store.record.is_none()
        && world
            .store
            .last_archived
            .is_some_and(|record| record.status == UpgradeStatus::Complete)
        && world.hosts.iter().all(|host| {
            host.process
                .as_ref()
                .is_some_and(|process| process.phase() == Phase::Ready)
                && host.config.running.number == V43
        })
}

impl Model for HaUpgrade {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![self.world.clone()]
    }

    fn actions(&self, state: &World, actions: &mut Vec<Action>) {
        if state.check().is_err() {
            return; // a violation ends the path: it is reported, not extended
        }
        // The testkit's partial-order reduction: an action that may be explored alone.
        match state.local_action() {
            Some(action) => actions.push(action),
            None => actions.extend(state.actions()),
        }
    }

    fn next_state(&self, state: &World, action: Action) -> Option<World> {
        let mut next = state.clone();
        next.apply(action);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("I1-I9 hold (World::check)", |_, world: &World| {
                world.check().is_ok()
            }),
            Property::sometimes(
                "every controller upgraded, record complete",
                |_, world: &World| upgraded(world),
            ),
        ]
    }
}

/// Replays a path's actions through the real core from the configuration's start, and
/// returns the violation the last state shows (if any).
pub fn replay(model: &HaUpgrade, actions: &[Action]) -> Option<lockstep_core::testkit::Violation> {
    let mut world = model.world.clone();
    for &action in actions {
        world.apply(action);
    }
    world.check().err()
}

/// A watcher resuming through lost, duplicated and reordered replies.
#[derive(Clone, Debug)]
pub struct WatchProtocol {
    /// Changes the server's log will reach.
    pub changes: u64,
    /// Replies the network may lose, duplicate.
    pub losses: u8,
    pub duplicates: u8,
    /// Planted defect: deliver every event of a reply, without `WatchPosition::accept`.
    pub deliver_without_position: bool,
}

/// The state of [`WatchProtocol`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WatchState {
    /// The server's log: revisions 1..=log.
    log: u64,
    position: WatchPosition,
    /// Replies in flight: the events after `after` the server had when it answered.
    in_flight: Vec<(Option<Revision>, u64)>,
    /// What the watcher delivered to its caller.
    delivered: Vec<u64>,
    losses: u8,
    duplicates: u8,
}

/// What can happen next in [`WatchProtocol`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchAction {
    /// The store commits one more change.
    Commit,
    /// The watcher asks `Next` (again) from where it stands.
    Ask,
    /// The reply at this index arrives.
    Receive(usize),
    Lose(usize),
    Duplicate(usize),
}

impl Model for WatchProtocol {
    type State = WatchState;
    type Action = WatchAction;

    fn init_states(&self) -> Vec<WatchState> {
        let mut position = WatchPosition::new();
        position.reached(Revision(0)); // a whole-state snapshot at revision 0
        vec![WatchState {
            log: 0,
            position,
            in_flight: Vec::new(),
            delivered: Vec::new(),
            losses: self.losses,
            duplicates: self.duplicates,
        }]
    }

    fn actions(&self, state: &WatchState, actions: &mut Vec<WatchAction>) {
        if state.log < self.changes {
            actions.push(WatchAction::Commit);
        }
        if state.in_flight.len() < 2 {
            actions.push(WatchAction::Ask);
        }
        for index in 0..state.in_flight.len() {
            actions.push(WatchAction::Receive(index));
            if state.losses > 0 {
                actions.push(WatchAction::Lose(index));
            }
            if state.duplicates > 0 {
                actions.push(WatchAction::Duplicate(index));
            }
        }
    }

    fn next_state(&self, state: &WatchState, action: WatchAction) -> Option<WatchState> {
        let mut next = state.clone();
        match action {
            WatchAction::Commit => next.log += 1,
            WatchAction::Ask => {
                // The server answers at once with what it has; the reply travels.
                next.in_flight
                    .push((next.position.resume_after(), next.log));
            }
            WatchAction::Receive(index) => {
                let (after, log) = next.in_flight.remove(index);
                let from = after.map_or(1, |revision| revision.0 + 1);
                for revision in from..=log {
                    if self.deliver_without_position || next.position.accept(Revision(revision)) {
                        next.delivered.push(revision);
                    }
                }
            }
            WatchAction::Lose(index) => {
                next.in_flight.remove(index);
                next.losses -= 1;
            }
            WatchAction::Duplicate(index) => {
                let reply = next.in_flight[index];
                next.in_flight.push(reply);
                next.duplicates -= 1;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "each change delivered once, in order",
                |_, state: &WatchState| {
                    state
                        .delivered
                        .iter()
                        .enumerate()
                        .all(|(index, &revision)| revision == index as u64 + 1)
                },
            ),
            Property::sometimes(
                "every change delivered",
                |model: &WatchProtocol, state: &WatchState| {
                    state.delivered.len() as u64 == model.changes
                },
            ),
        ]
    }
}

/// What one model check found.
#[derive(Clone, Debug)]
pub struct CheckReport {
    pub name: String,
    pub states: usize,
    pub unique_states: usize,
    pub exhausted: bool,
    pub wall: Duration,
    /// Properties with a discovery: a counterexample for `always`, an example for
    /// `sometimes`, with the path's length.
    pub discoveries: Vec<(&'static str, usize)>,
}

impl CheckReport {
    pub fn states_per_second(&self) -> f64 {
        self.unique_states as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn found(&self, property: &str) -> bool {
        self.discoveries.iter().any(|(name, _)| *name == property)
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} states ({} unique) in {:.2}s, {:.0} states/s, {}; discoveries {:?}",
            self.name,
            self.states,
            self.unique_states,
            self.wall.as_secs_f64(),
            self.states_per_second(),
            if self.exhausted {
                "exhausted"
            } else {
                "NOT exhausted (cap reached)"
            },
            self.discoveries
        )
    }
}

/// Checks `model` on one thread, breadth first (or depth first, which reaches deep
/// `sometimes` examples sooner), within `states_max` states and `time_max`.
pub fn check<M>(
    name: &str,
    model: M,
    states_max: usize,
    depth_first: bool,
    time_max: Duration,
) -> (CheckReport, M)
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + Send + Sync + PartialEq,
    M::Action: std::fmt::Debug + Clone + Send + Sync + PartialEq,
{
    let started = Instant::now();
    let builder = model
        .clone()
        .checker()
        .target_state_count(states_max)
        .timeout(time_max);
    let report = if depth_first {
        summarize(
            name,
            builder.spawn_dfs().join(),
            started,
            states_max,
            time_max,
        )
    } else {
        summarize(
            name,
            builder.spawn_bfs().join(),
            started,
            states_max,
            time_max,
        )
    };
    (report, model)
}

fn summarize<M: Model, C: Checker<M>>(
    name: &str,
    checker: C,
    started: Instant,
    states_max: usize,
    time_max: Duration,
) -> CheckReport
where
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let wall = started.elapsed();
    let mut discoveries: Vec<(&'static str, usize)> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, path.into_actions().len()))
        .collect();
    discoveries.sort();
    let states = checker.state_count();
    CheckReport {
        name: name.to_owned(),
        states,
        unique_states: checker.unique_state_count(),
        exhausted: states < states_max && wall < time_max,
        wall,
        discoveries,
    }
}

/// The counterexample path of `property` in an HA model, as actions.
pub fn counterexample(
    model: &HaUpgrade,
    property: &'static str,
    states_max: usize,
    time_max: Duration,
) -> Option<Vec<Action>> {
    let checker = model
        .clone()
        .checker()
        .target_state_count(states_max)
        .timeout(time_max)
        .spawn_bfs()
        .join();
    checker.discovery(property).map(|path| path.into_actions())
}

/// The versions the models use, for reports.
pub const FROM: Version = V42;
