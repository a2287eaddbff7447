//! Model checking with stateright (issue 9, part 3), over the real core.
//!
//! - [`HaUpgrade`]: the HA upgrade coordination of 2 or 3 controllers through the
//!   upgrade-info record, with the coordinator lease's expiry and fenced writes, crashes
//!   and restarts, and lost messages. Its states are `lockstep_core::testkit::World`s, which
//!   drive real `Lifecycle`s against the testkit's model of the store's operations
//!   (create-if-absent, compare-and-set, lease with expiry, fenced writes, watch from a
//!   revision), so every path stateright explores is a run of the real core, and every
//!   counterexample is replayed through it ([`replay`], [`check_ha`]).
//!
//!   A lost message ([`HaAction`]) is one message between a controller's core and the
//!   store, handled as lockstep-agent's driver handles it:
//!   - a store request whose **answer** is lost has taken effect; the driver's call times
//!     out and the driver sends the same request again (`Driver::blocking` retries every
//!     store operation with capped backoff; the etcd adapter first retries within its
//!     `retry_for` and recognises a commit of its own that landed). The repeat executes
//!     against the store as it then is, so its answer may differ (`Conflict` for a record
//!     write that landed, `AlreadyApplied` for a database step, the holder's own token for
//!     an acquire). A lost **request** that the driver repeats is only a delay, which the
//!     interleavings already hold;
//!   - a lost `ReleaseLease` is not repeated (the driver sends it once): the lease stays
//!     until its TTL runs out ([`HaAction::LeaseTtlEnds`], time rather than a fault);
//!   - a lost record-watch notification is found again by the watch reading the record
//!     once more ([`HaAction::Reread`]).
//!
//!   The core has no timer for the answer of its main request: without the driver's repeat
//!   it would wait forever. The `always` property [`NO_WAIT_FOREVER`] says no process does,
//!   and the planted driver defect [`HaUpgrade::driver_retries`]` = false` shows it can fail.
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
    Config, ControllerId, ControllerSet, Input, LeaseToken, Limits, ModelView, Mutations,
    RecordView, Request, RequestId, Revision, Snapshot, Timer, UpgradeStatus, request_name,
};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::steps::{Step, StepKind, StepRegistry, Target};
use lockstep_core::testkit::{Action, World, WorldSpec};
use lockstep_core::{Phase, Role, Roles, Version};
use stateright::{Checker, Model, Property};

use crate::scenario::{V42, V43};

/// A configuration of the HA model.
#[derive(Clone, Debug)]
pub struct HaUpgrade {
    pub name: &'static str,
    world: World,
    /// Messages between a controller's core and the store the network may lose.
    losses: u8,
    /// The driver sends a store request whose answer never came again (lockstep-agent's
    /// `Driver::blocking`, and its etcd adapter's retry before it). `false` is a planted
    /// defect of the driver, not of the core: a driver that waits for a lost answer forever.
    pub driver_retries: bool,
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
    /// database step, and a host step when `host_step`), with at most `crashes` crashes,
    /// `expiries` lease expiries and `losses` lost messages (see [`HaAction`]).
    pub fn new(
        name: &'static str,
        controllers: u8,
        host_step: bool,
        faults: Faults,
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
            crashes: faults.crashes,
            expiries: faults.expiries,
        });
        // Time is abstract: timeouts never fire early, the periodic check never.
        world.timeouts_left = 0;
        world.catalogue_checks_left = 0;
        world.mutations = mutations;
        HaUpgrade {
            name,
            world,
            losses: faults.losses,
            driver_retries: true,
        }
    }

    /// The same upgrade as a bootstrap's implicit one (`--auto-upgrade`): no controller has
    /// been Ready yet, so each checks its version once its steps are done. (After
    /// bootstrap, a controller on the model's agent-version goes from its steps to Ready:
    /// its check could only stay.)
    pub fn during_bootstrap(mut self) -> HaUpgrade {
        for host in &mut self.world.hosts {
            if let Some(snapshot) = &mut host.durable {
                snapshot.bootstrap_complete = false;
            }
        }
        self
    }

    /// The state the model starts from.
    pub fn start(&self) -> HaState {
        HaState {
            world: self.world.clone(),
            losses_left: self.losses,
            rereads: Vec::new(),
            unreleased: None,
            lost: None,
        }
    }
}

/// Fault budgets of an [`HaUpgrade`] run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub crashes: u8,
    pub expiries: u8,
    pub losses: u8,
}

/// A state of [`HaUpgrade`]: the testkit's world of real lifecycles, and what the network
/// and the drivers do about messages it lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaState {
    pub world: World,
    /// Messages the network may still lose.
    pub losses_left: u8,
    /// Hosts whose record watch lost a notification: the watch reads the record again
    /// (lockstep-agent's watch thread re-reads after a failed read; the simulator's driver
    /// tick resubscribes after the last revision seen).
    pub rereads: Vec<usize>,
    /// A lease whose `ReleaseLease` was lost: nobody keeps it alive, so it lives until its
    /// TTL runs out (lockstep-agent sends the release once: "an unreleased lease expires by
    /// itself").
    pub unreleased: Option<LeaseToken>,
    /// What was lost, for reports: the request's name. Not hashed: states that differ only
    /// in it are one state.
    pub lost: Option<&'static str>,
}

impl std::hash::Hash for HaState {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        self.world.hash(hasher);
        self.losses_left.hash(hasher);
        self.rereads.hash(hasher);
        self.unreleased.hash(hasher);
    }
}

/// One thing that can happen next in [`HaUpgrade`]: a testkit action, or a message loss and
/// what the drivers do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HaAction {
    World(Action),
    /// The store executes the `index`-th request in flight of `host`, and its answer is lost
    /// on the way back. The driver's call times out and the driver sends the same request
    /// again (same id): it stays in flight and is executed again later, against the store as
    /// it then is (a repeated `CreateRecord` meets its own record: `Conflict`; a repeated
    /// database step: `AlreadyApplied`; a repeated acquire: the holder's own token). A lost
    /// *request* that the driver repeats is only a delay, which the interleavings already
    /// cover; it is not a separate action.
    LoseAnswer {
        host: usize,
        index: usize,
    },
    /// A `ReleaseLease` is lost: the lease stays until its TTL runs out.
    LoseRelease {
        host: usize,
        index: usize,
    },
    /// A record-watch notification (the `index`-th completion) is lost.
    LoseNotification {
        host: usize,
        index: usize,
    },
    /// The watch of `host` reads the record again after losing a notification.
    Reread {
        host: usize,
    },
    /// The TTL of a lease nobody keeps alive runs out (time, not a fault).
    LeaseTtlEnds,
}

/// Requests that travel from a controller's core to the store and have an answer.
fn is_store_request(world: &World, request: &Request) -> bool {
    match request {
        Request::LoadModel
        | Request::RefreshCapabilities
        | Request::WatchRecord { .. }
        | Request::CreateRecord(_)
        | Request::UpdateRecord { .. }
        | Request::AcquireLease
        | Request::KeepAliveLease(_)
        | Request::SetAgentVersion(_)
        | Request::ReportUpgradeAvailable(_) => true,
        Request::RunStep { step, .. } => world.registry.step(*step).kind == StepKind::Database,
        // Local (the disk, a host step, the restart), the stream, or another controller.
        Request::PersistSnapshot(_)
        | Request::ReleaseLease(_)
        | Request::LookupCatalogue { .. }
        | Request::DesiredBinary
        | Request::StageBinary(_)
        | Request::RestartInto(_) => false,
        // `Request` is `#[non_exhaustive]`: a new one must be classified here first.
        other => unreachable!("a request the model does not classify: {other:?}"),
    }
}

/// The request id an answer echoes (`None` for notifications and events).
fn answer_id(input: &Input) -> Option<RequestId> {
    match input {
        Input::Done { id }
        | Input::ModelLoaded { id, .. }
        | Input::RecordWritten { id, .. }
        | Input::LeaseAnswered { id, .. }
        | Input::StepFinished { id, .. }
        | Input::CatalogueFound { id, .. }
        | Input::DesiredBinary { id, .. }
        | Input::Staged { id, .. }
        | Input::AgentVersionRefused { id, .. } => Some(*id),
        Input::Start
        | Input::RecordChanged(_)
        | Input::AgentVersionChanged(_)
        | Input::UpgradeRequested { .. }
        | Input::Operator(_) => None,
        // `Input` is `#[non_exhaustive]`: a new one must be classified here first.
        other => unreachable!("an input the model does not classify: {other:?}"),
    }
}

/// A process waiting for the answer to a request nobody will execute or answer: it would
/// wait forever (the core has no timer for a main request's answer; the driver must bring
/// one). Returns the host and the request id.
pub fn awaiting_forever(world: &World) -> Option<(usize, RequestId)> {
    world.hosts.iter().enumerate().find_map(|(index, host)| {
        let id = host.process.as_ref()?.awaiting()?;
        let in_flight = host.in_flight.iter().any(|(sent, _)| *sent == id);
        let answered = host
            .completions
            .iter()
            .any(|input| answer_id(input) == Some(id));
        (!in_flight && !answered).then_some((index, id))
    })
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

fn watching(world: &World, host: usize) -> bool {
    let state = &world.hosts[host];
    state.process.is_some() && state.watching
}

impl HaUpgrade {
    /// Applies one action to a state, through the real core.
    pub fn step(&self, state: &mut HaState, action: HaAction) {
        let world = &mut state.world;
        match action {
            HaAction::World(action) => world.apply(action),
            HaAction::LoseAnswer { host, index } => {
                let (id, request) = world.hosts[host].in_flight[index].clone();
                state.lost = Some(request_name(&request));
                state.losses_left -= 1;
                let before = world.hosts[host].completions.len();
                world.apply(Action::Execute { host, index });
                // The answer is the last completion the execution queued (notifications
                // of the write, to every watcher, come before it).
                let completions = &mut world.hosts[host].completions;
                if completions.len() > before {
                    let answer = completions.pop().expect("an answer");
                    debug_assert!(
                        answer_id(&answer).is_none_or(|answered| answered == id),
                        "{answer:?} answers {id}"
                    );
                }
                if self.driver_retries && world.hosts[host].process.is_some() {
                    world.hosts[host].in_flight.insert(index, (id, request));
                }
            }
            HaAction::LoseRelease { host, index } => {
                let (_, request) = world.hosts[host].in_flight.remove(index);
                state.lost = Some(request_name(&request));
                state.losses_left -= 1;
                if let Request::ReleaseLease(token) = request
                    && world.store.lease.is_some_and(|(_, held)| held == token)
                {
                    state.unreleased = Some(token);
                }
            }
            HaAction::LoseNotification { host, index } => {
                world.hosts[host].completions.remove(index);
                state.lost = Some("RecordChanged");
                state.losses_left -= 1;
                state.rereads.push(host);
            }
            HaAction::Reread { host } => {
                let view = RecordView {
                    current: world.store.record,
                    last_archived: world.store.last_archived,
                    revision: world.store.revision,
                };
                world.hosts[host]
                    .completions
                    .push(Input::RecordChanged(view));
                state.rereads.retain(|&waiting| waiting != host);
            }
            HaAction::LeaseTtlEnds => {
                world.store.lease = None;
                state.unreleased = None;
            }
        }
        // A process that died stops its watch; a lease taken again (the holder's own
        // token) or gone is no longer left to its TTL.
        let world = &state.world;
        state.rereads.retain(|&host| watching(world, host));
        if state.unreleased != world.store.lease.map(|(_, token)| token) {
            state.unreleased = None;
        } else if let Some((holder, _)) = world.store.lease
            && world.hosts.iter().any(|host| {
                host.config.controller == Some(holder)
                    && host.process.as_ref().is_some_and(|process| {
                        process
                            .timers()
                            .any(|(timer, _)| timer == Timer::LeaseKeepAlive)
                    })
            })
        {
            // Its holder keeps it alive again.
            state.unreleased = None;
        }
    }
}

impl Model for HaUpgrade {
    type State = HaState;
    type Action = HaAction;

    fn init_states(&self) -> Vec<HaState> {
        vec![self.start()]
    }

    fn actions(&self, state: &HaState, actions: &mut Vec<HaAction>) {
        let world = &state.world;
        if world.check().is_err() || awaiting_forever(world).is_some() {
            return; // a violation ends the path: it is reported, not extended
        }
        // The testkit's partial-order reduction: an action that may be explored alone. A
        // loss commutes with it as the testkit's own actions do (a lost answer is an
        // execution that appends nothing to its host's queue and leaves the request in
        // flight; a re-read appends), except the loss of the very notification a delivery
        // would take, which is offered beside it. A lease left to its TTL turns the
        // reduction off: it may expire under a holder's timers.
        if state.unreleased.is_none()
            && let Some(action) = world.local_action()
        {
            actions.push(HaAction::World(action));
            if let Action::Deliver { host } = action
                && state.losses_left > 0
                && matches!(
                    world.hosts[host].completions.first(),
                    Some(Input::RecordChanged(_))
                )
            {
                actions.push(HaAction::LoseNotification { host, index: 0 });
            }
            return;
        }
        // While a re-read or a TTL is pending, time has not run out: a timeout firing now
        // would be early, and this model gives early fires no budget.
        let pending = !state.rereads.is_empty() || state.unreleased.is_some();
        for action in world.actions() {
            let late_timeout = matches!(
                action,
                Action::Fire {
                    timer: Timer::ControllersWait | Timer::TrialReady,
                    ..
                }
            ) && world.timeouts_left == 0;
            if !(pending && late_timeout) {
                actions.push(HaAction::World(action));
            }
        }
        if state.losses_left > 0 {
            for (host, state) in world.hosts.iter().enumerate() {
                if state.process.is_none() {
                    continue;
                }
                for (index, (_, request)) in state.in_flight.iter().enumerate() {
                    if is_store_request(world, request) {
                        actions.push(HaAction::LoseAnswer { host, index });
                    } else if matches!(request, Request::ReleaseLease(_)) {
                        actions.push(HaAction::LoseRelease { host, index });
                    }
                }
                for (index, input) in state.completions.iter().enumerate() {
                    if matches!(input, Input::RecordChanged(_)) {
                        actions.push(HaAction::LoseNotification { host, index });
                    }
                }
            }
        }
        for &host in &state.rereads {
            actions.push(HaAction::Reread { host });
        }
        if state.unreleased.is_some() {
            actions.push(HaAction::LeaseTtlEnds);
        }
    }

    fn next_state(&self, state: &HaState, action: HaAction) -> Option<HaState> {
        let mut next = state.clone();
        self.step(&mut next, action);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAFETY, |_, state: &HaState| state.world.check().is_ok()),
            Property::always(NO_WAIT_FOREVER, |_, state: &HaState| {
                awaiting_forever(&state.world).is_none()
            }),
            Property::sometimes(UPGRADED, |_, state: &HaState| upgraded(&state.world)),
            Property::sometimes(UPGRADED_AFTER_LOSS, |model: &HaUpgrade, state: &HaState| {
                model.losses > 0 && state.losses_left == 0 && upgraded(&state.world)
            }),
        ]
    }
}

/// The `always` property: every invariant of `spec/invariants.md` the world checks.
pub const SAFETY: &str = "I1-I9 hold (World::check)";
/// The `always` property: no process waits forever for an answer.
pub const NO_WAIT_FOREVER: &str = "no process awaits an answer that never comes";
/// The `sometimes` property: the upgrade can complete.
pub const UPGRADED: &str = "every controller upgraded, record complete";
/// The `sometimes` property: the upgrade can complete after a message was lost.
pub const UPGRADED_AFTER_LOSS: &str = "every controller upgraded after a lost message";

/// What replaying a path through the real core shows at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replayed {
    Violation(lockstep_core::testkit::Violation),
    /// A process awaits an answer that never comes: its host, the request's id, and the
    /// message the run lost (the request's name).
    AwaitingForever {
        host: usize,
        id: RequestId,
        lost: Option<&'static str>,
    },
}

/// Replays a path's actions through the real core from the configuration's start (fresh
/// lifecycles, not the checker's states), and returns what the last state breaks.
pub fn replay(model: &HaUpgrade, actions: &[HaAction]) -> Option<Replayed> {
    let mut state = model.start();
    for &action in actions {
        model.step(&mut state, action);
    }
    if let Err(violation) = state.world.check() {
        return Some(Replayed::Violation(violation));
    }
    awaiting_forever(&state.world).map(|(host, id)| Replayed::AwaitingForever {
        host,
        id,
        lost: state.lost,
    })
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
    /// The whole reachable space was explored (neither the state cap nor the time cap
    /// stopped the search).
    pub exhausted: bool,
    /// Which cap stopped the search, when one did.
    pub capped_by: Option<&'static str>,
    pub wall: Duration,
    /// Properties with a discovery: a counterexample for `always`, an example for
    /// `sometimes`, with the path's length.
    pub discoveries: Vec<(&'static str, usize)>,
    /// Each `always` counterexample replayed through the real core from the start: the
    /// property, and what the replay's last state breaks (`None`: the replay did not
    /// break it, which would be a bug of the model).
    pub replays: Vec<(&'static str, Option<Replayed>)>,
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
            "{}: {} states explored ({} unique) in {:.2}s, {:.0} states/s, {}; discoveries {:?}",
            self.name,
            self.states,
            self.unique_states,
            self.wall.as_secs_f64(),
            self.states_per_second(),
            match self.capped_by {
                None => "space exhausted".to_owned(),
                Some(cap) => format!("NOT exhausted ({cap} cap reached)"),
            },
            self.discoveries
        )?;
        for (property, replayed) in &self.replays {
            write!(
                f,
                "\n  counterexample of {property:?} replayed through the real core: {replayed:?}"
            )?;
        }
        Ok(())
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
    let (report, _) = run(name, model.clone(), states_max, depth_first, time_max);
    (report, model)
}

/// [`check`] for the HA model: every `always` counterexample found is replayed through the
/// real core from the start ([`replay`]) and the report says what the replay broke.
pub fn check_ha(
    name: &str,
    model: HaUpgrade,
    states_max: usize,
    depth_first: bool,
    time_max: Duration,
) -> (CheckReport, HaUpgrade) {
    let (mut report, paths) = run(name, model.clone(), states_max, depth_first, time_max);
    for (property, path) in paths {
        if property == SAFETY || property == NO_WAIT_FOREVER {
            report.replays.push((property, replay(&model, &path)));
        }
    }
    (report, model)
}

type Paths<A> = Vec<(&'static str, Vec<A>)>;

fn run<M>(
    name: &str,
    model: M,
    states_max: usize,
    depth_first: bool,
    time_max: Duration,
) -> (CheckReport, Paths<M::Action>)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + Send + Sync + PartialEq,
    M::Action: std::fmt::Debug + Clone + Send + Sync + PartialEq,
{
    let started = Instant::now();
    let builder = model
        .checker()
        .target_state_count(states_max)
        .timeout(time_max);
    if depth_first {
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
    }
}

fn summarize<M: Model, C: Checker<M>>(
    name: &str,
    checker: C,
    started: Instant,
    states_max: usize,
    time_max: Duration,
) -> (CheckReport, Paths<M::Action>)
where
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let wall = started.elapsed();
    let mut paths: Paths<M::Action> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, path.into_actions()))
        .collect();
    paths.sort_by_key(|(name, _)| *name);
    let discoveries = paths
        .iter()
        .map(|(name, path)| (*name, path.len()))
        .collect();
    let states = checker.state_count();
    let every_property_found = paths.len() == checker.model().properties().len();
    // The checker also stops early once every property has a discovery; that is not a cap.
    let capped_by = if states >= states_max {
        Some("state")
    } else if wall >= time_max {
        Some("time")
    } else {
        None
    };
    let report = CheckReport {
        name: name.to_owned(),
        states,
        unique_states: checker.unique_state_count(),
        exhausted: capped_by.is_none() && !every_property_found,
        capped_by,
        wall,
        discoveries,
        replays: Vec::new(),
    };
    (report, paths)
}

/// The counterexample path of `property` in an HA model, as actions.
pub fn counterexample(
    model: &HaUpgrade,
    property: &'static str,
    states_max: usize,
    time_max: Duration,
) -> Option<Vec<HaAction>> {
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
