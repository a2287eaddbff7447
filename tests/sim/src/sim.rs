//! The simulator: real `Lifecycle`s, a real `MemoryStore`, and simulated network, disks,
//! streams, clocks, operators and clients, on virtual time in one thread.
//!
//! Every party acts only when an event of the queue reaches it; events are ordered by
//! virtual time, then by the order they were scheduled, and every random draw comes from
//! one generator seeded by the scenario's seed, so a seed replays exactly. A run has two
//! phases: **safety** (faults on; checkers see every observation as it happens) and
//! **liveness** (faults healed, crashed processes restarted, held agents retried by the
//! operator; every agent must be Ready on one version, the model's, at least the one the
//! operator asked for, and every client finished, within the scenario's bound).
//!
//! ## What each party is
//!
//! - **Controllers and machine agents**: a `Lifecycle` each, and the driver that executes
//!   its requests. Controllers reach the store and the stream over the network; machine
//!   agents reach a controller's API (machine-agent logins, refused while that controller
//!   is not Ready, retried with `lockstep_core::client`'s decisions). Snapshot writes and
//!   host steps are local, on a disk that loses a write in progress when the process dies.
//! - **The store**: one `lockstep_store::MemoryStore` (durability Full, as the contract
//!   asks) whose clock is the simulator's virtual time, so leases expire in virtual time.
//!   Requests in flight from a process that has died still land, as they would.
//! - **The stream**: serves the catalogue as published so far; it may stall, serve corrupt
//!   bytes, or roll its metadata back, which each controller's `HighWaterMark` refuses.
//! - **Clients**: deployers (mutating calls with `operation-id`s), watchers
//!   (`AllWatcher.Next` resuming with `WatchPosition`) and status pollers, each retrying
//!   with `lockstep_core::client::Call`.
//!
//! Request retries of the drivers (a store request whose answer was lost) also use
//! `Call`: a lost answer is a disconnect, answered by reconnecting after its backoff.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use lockstep_core::client::{self, Attempt, Call, OperationIds, RetryPolicy, WatchPosition};
use lockstep_core::gate::{self, GateView, Login};
use lockstep_core::jobs::Capabilities;
use lockstep_core::lifecycle::{
    Config, ControllerId, ControllerSet, Input, Lifecycle, Limits, Mutations, OperatorAction,
    Output, RecordView, Request, RequestId, Revision, Snapshot, StagePlan, StageSource,
    StepOutcome,
};
use lockstep_core::policy::{Catalogue, CatalogueEntry, HighWaterMark, Sha256, Stream};
use lockstep_core::steps::{Step, StepKey, StepKind, StepRegistry, Target};
use lockstep_core::{Binary, Phase, Progress, Role, Roles, Timestamp, Version};
use lockstep_store::{
    AgentVersionCheck, AgentVersionSet, ChangeKind, Changes, Clock, Durability, EntityKind,
    MemoryStore, Model, OperationOutcome, Store, StoreError,
};

use crate::checkers::{self, Checker, End, EndHost, EndWatcher, Observation};
use crate::rng::Rng;
use crate::scenario::{Scenario, Start, V43, V44};
use crate::trace::{Timeline, Trace};

/// Virtual milliseconds a store request waits for its answer before it counts as lost.
const STORE_TIMEOUT_MS: u64 = 2_000;
/// Virtual milliseconds an API call to a controller waits for its answer.
const API_TIMEOUT_MS: u64 = 3_000;
/// Virtual milliseconds a stream request waits before the driver reports it failed.
const STREAM_TIMEOUT_MS: u64 = 30_000;
/// Controllers' driver tick (record watch resync, agent-version watch).
const CONTROLLER_TICK_MS: u64 = 2_000;
/// Machine agents poll their controller's `Upgrader.DesiredVersion` this often.
const AGENT_POLL_MS: u64 = 10_000;
/// The operator's healing round during liveness.
const OPERATOR_TICK_MS: u64 = 60_000;
/// Events a run may take at most: a bound on a run that would never end.
const EVENTS_MAX: u64 = 20_000_000;
/// Unix seconds of the simulated epoch (the stream's `updated` times count from here).
const EPOCH_UNIX_SECONDS: u64 = 1_760_000_000;
/// Metadata older than this is frozen (TUF); long enough never to trigger here.
const FREEZE_AFTER_SECONDS: u64 = 30 * 24 * 3600;
/// Client calls wait at most this long for one call to succeed.
const CLIENT_DEADLINE_MS: u64 = 6 * 60 * 60 * 1000;

/// The store's clock: the simulator's virtual time.
#[derive(Clone, Debug, Default)]
struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    fn set(&self, now: u64) {
        self.0.store(now, AtomicOrdering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(AtomicOrdering::SeqCst))
    }
}

/// How a run failed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FailureKind {
    /// A process (or the simulator) panicked: an assertion of the core failed.
    Crash,
    /// Healed, the system did not reach its goal within the bound.
    Liveness,
    /// A checker saw an invariant broken.
    Correctness,
}

/// A failed run.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Failure {
    pub kind: FailureKind,
    /// The checker that failed (`crash` and `liveness` for the other kinds).
    pub checker: &'static str,
    pub invariant: &'static str,
    pub message: String,
    pub at_ms: u64,
}

/// What one run did.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub events: u64,
    pub simulated_ms: u64,
    pub trace_hash: u64,
    pub failure: Option<Failure>,
    /// Recorded only when asked for.
    pub trace: Option<Vec<String>>,
    pub timeline: Option<Timeline>,
}

/// Options of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    pub mutations: Mutations,
    /// Keep every event's description (for failure reports).
    pub record_trace: bool,
    /// Keep the swimlane's data.
    pub record_timeline: bool,
    /// Checkers (by name) left out of this run: a planted-bug test uses it to show that a
    /// defect is found by another checker too.
    pub without_checkers: &'static [&'static str],
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Party {
    Store,
    Streams,
    Host(usize),
    Client(usize),
}

/// Where a host's request went.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    Store,
    Streams,
    Controller,
}

#[derive(Clone, Debug)]
struct Awaiting {
    request: Request,
    route: Route,
    call: Call,
    attempt: u32,
    controller: usize,
}

#[derive(Clone, Debug)]
enum AgentCall {
    Request(Box<Request>),
    Poll,
}

#[derive(Clone, Debug)]
enum ClientOp {
    Deploy { operation: String },
    Next { after: Option<Revision> },
    Status,
}

#[derive(Clone, Debug)]
enum ClientAnswer {
    Deployed,
    Snapshot(Revision),
    Events(Vec<Revision>),
    Status,
    Refused { phase: Phase, retry_after: u64 },
}

#[derive(Clone, Debug)]
enum Message {
    StoreRequest {
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    },
    Reply {
        host: usize,
        incarnation: u64,
        id: Option<RequestId>,
        input: Input,
    },
    Refused {
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        phase: Phase,
        retry_after: u64,
    },
    AgentCall {
        host: usize,
        incarnation: u64,
        controller: usize,
        id: RequestId,
        attempt: u32,
        call: AgentCall,
    },
    PollReply {
        host: usize,
        incarnation: u64,
        agent_version: Version,
    },
    StreamRequest {
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    },
    StreamReply {
        host: usize,
        incarnation: u64,
        id: RequestId,
        reply: Result<(Catalogue, u64), String>,
    },
    ClientCall {
        client: usize,
        controller: usize,
        attempt: u64,
        op: ClientOp,
    },
    ClientReply {
        client: usize,
        attempt: u64,
        answer: ClientAnswer,
    },
}

#[derive(Clone, Debug)]
enum Event {
    Boot {
        host: usize,
        incarnation: u64,
    },
    Wake {
        host: usize,
        incarnation: u64,
    },
    DiskWrite {
        host: usize,
        incarnation: u64,
        id: RequestId,
        snapshot: Box<Snapshot>,
    },
    HostStep {
        host: usize,
        incarnation: u64,
        id: RequestId,
        key: StepKey,
    },
    Deliver {
        from: Party,
        to: Party,
        message: Box<Message>,
    },
    RequestTimeout {
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
    },
    Resend {
        host: usize,
        incarnation: u64,
        id: RequestId,
    },
    DriverTick {
        host: usize,
        incarnation: u64,
    },
    ClientWake {
        client: usize,
        attempt: u64,
    },
    ClientTimeout {
        client: usize,
        attempt: u64,
    },
    Crash,
    Partition,
    HealPartition {
        index: usize,
    },
    Publish,
    OperatorRequest,
    Abort,
    Rerequest,
    /// The lease granted with this token expires (keep-alives lost).
    ExpireLease {
        holder: ControllerId,
        token: lockstep_core::lifecycle::LeaseToken,
    },
    Heal,
    OperatorTick,
    LivenessCheck,
}

#[derive(Debug)]
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Scheduled) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Scheduled) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Scheduled) -> Ordering {
        // The heap is a max-heap: the earliest event is the greatest.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A host's clock: `local = offset + global × rate / 1000`.
#[derive(Clone, Copy, Debug)]
struct HostClock {
    offset_ms: u64,
    rate_per_mille: u64,
}

impl HostClock {
    fn local(&self, global: u64) -> Timestamp {
        Timestamp(self.offset_ms + global * self.rate_per_mille / 1000)
    }
    fn global(&self, local: Timestamp) -> u64 {
        let since = local.0.saturating_sub(self.offset_ms);
        (since * 1000).div_ceil(self.rate_per_mille)
    }
    fn global_after(&self, local_ms: u64) -> u64 {
        (local_ms * 1000).div_ceil(self.rate_per_mille)
    }
}

#[derive(Debug)]
struct Host {
    name: String,
    config: Config,
    process: Option<Lifecycle>,
    incarnation: u64,
    durable: Option<Snapshot>,
    /// Published by the process; what the API server reads.
    gate: GateView,
    awaiting: BTreeMap<RequestId, Awaiting>,
    watching: bool,
    record_delivered: Option<Revision>,
    wake_at: Option<u64>,
    clock: HostClock,
    origin: Version,
    high_water: HighWaterMark,
    /// The agent-version last fed to the process (`None`: nothing yet this incarnation).
    fed: Option<Version>,
    /// The last phase drawn in the timeline.
    drawn: Option<Phase>,
}

impl Host {
    fn is_controller(&self) -> bool {
        self.config.controller.is_some()
    }
}

#[derive(Debug)]
enum ClientRole {
    Deployer {
        ids: OperationIds,
        left: u32,
        current: Option<String>,
    },
    Watcher {
        position: WatchPosition,
        baseline: Option<Revision>,
    },
    Poller {
        left: u32,
    },
}

#[derive(Debug)]
struct Client {
    role: ClientRole,
    controller: Option<usize>,
    call: Option<Call>,
    attempt: u64,
    in_flight: bool,
    finished: bool,
    gave_up: Option<String>,
}

#[derive(Clone, Copy, Debug)]
struct PartitionRule {
    a: Party,
    b: Option<Party>,
    healed: bool,
}

/// One simulation run.
pub struct Sim {
    scenario: Scenario,
    options: RunOptions,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    clock: VirtualClock,
    store: MemoryStore,
    subscribers: Vec<(usize, u64)>,
    scanned: Revision,
    registry: Arc<StepRegistry>,
    catalogue_before: Catalogue,
    catalogue_after: Option<(Catalogue, u64)>,
    published: bool,
    listed: BTreeSet<Version>,
    hosts: Vec<Host>,
    clients: Vec<Client>,
    partitions: Vec<PartitionRule>,
    healed: bool,
    heal_at: u64,
    checkers: Vec<Box<dyn Checker>>,
    model_cache: Option<(Revision, Model)>,
    /// Revisions of every event in the store's log, ascending.
    revisions: Vec<Revision>,
    step_effects: BTreeMap<StepKey, (u32, u32)>,
    operation_effects: BTreeMap<String, u32>,
    answered_operations: Vec<String>,
    retry_policy: RetryPolicy,
    /// `SetAgentVersion` requests the store refused (Juju's rule: not while a record is
    /// current).
    agent_version_refusals: u64,
    events: u64,
    trace: Trace,
    timeline: Option<Timeline>,
    failure: Option<Failure>,
    live: bool,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.scenario.seed)
            .field("now", &self.now)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

fn binary(version: Version) -> Binary {
    Binary::new(version, "ubuntu", "amd64").expect("a valid binary")
}

fn artifact_sha(version: Version) -> Sha256 {
    Sha256([version.patch as u8; 32])
}

fn catalogue_of(versions: &[Version]) -> Catalogue {
    let entries = versions
        .iter()
        .map(|&version| CatalogueEntry {
            binary: binary(version),
            stream: Stream::Released,
            size_bytes: 4096,
            sha256: artifact_sha(version),
            path: format!("agent/{version}/juju-{version}-ubuntu-amd64.tgz"),
        })
        .collect();
    Catalogue::new(entries).expect("a valid catalogue")
}

/// The steps a scenario chose.
pub fn registry_for(chosen: [bool; 4]) -> StepRegistry {
    let all = [
        Step::database("add-machine-roles", V43, "store roles beside legacy jobs"),
        Step::host(
            "rewrite-agent-conf",
            V43,
            &[Target::AllMachines],
            "new agent.conf keys",
        ),
        Step::database("index-event-log", V44, "index the event log by revision"),
        Step::host(
            "move-tools-dir",
            V44,
            &[Target::Controller],
            "tools/ layout",
        ),
    ];
    let steps: Vec<Step> = all
        .into_iter()
        .zip(chosen)
        .filter_map(|(step, keep)| keep.then_some(step))
        .collect();
    StepRegistry::new(&steps).expect("a valid registry")
}

impl Sim {
    pub fn new(scenario: Scenario, options: RunOptions) -> Sim {
        let mut rng = Rng::new(scenario.seed, 0x5EED_0F12);
        let clock = VirtualClock::default();
        let store = MemoryStore::with_clock(Durability::Full, Arc::new(clock.clone()));
        let registry = Arc::new(registry_for(scenario.steps));
        let catalogue_before = catalogue_of(&scenario.catalogue);
        let catalogue_after = scenario.newer_patch.map(|(version, at)| {
            let mut versions = scenario.catalogue.clone();
            versions.push(version);
            (catalogue_of(&versions), at)
        });
        let limits = Limits {
            catalogue_check_interval: lockstep_core::Millis(scenario.catalogue_check_ms),
            ..Limits::default()
        };
        let mut hosts = Vec::new();
        let total = usize::from(scenario.controllers) + scenario.agents as usize;
        for index in 0..total {
            let controller = index < usize::from(scenario.controllers);
            let config = Config {
                controller: controller.then_some(ControllerId(index as u8)),
                roles: if controller {
                    Roles::of(&[Role::Controller])
                } else {
                    Roles::of(&[Role::HostMachine])
                },
                running: binary(scenario.from),
                limits,
            };
            let durable = match scenario.start {
                Start::Upgrade => {
                    let mut snapshot = Snapshot::bootstrapped(&binary(scenario.from));
                    snapshot.bootstrap_complete = true;
                    Some(snapshot)
                }
                Start::Bootstrap => None,
            };
            let clock = if scenario.faults.clock_skew {
                HostClock {
                    offset_ms: rng.range(0, 3_600_000),
                    rate_per_mille: rng.range(950, 1050),
                }
            } else {
                HostClock {
                    offset_ms: 0,
                    rate_per_mille: 1000,
                }
            };
            hosts.push(Host {
                name: if controller {
                    format!("controller-{index}")
                } else {
                    format!("machine-{}", index - usize::from(scenario.controllers))
                },
                config,
                process: None,
                incarnation: 0,
                durable,
                gate: GateView {
                    phase: Phase::Bootstrapping,
                    progress: Progress::default(),
                    retry_after: lockstep_core::Millis(1000),
                },
                awaiting: BTreeMap::new(),
                watching: false,
                record_delivered: None,
                wake_at: None,
                clock,
                origin: scenario.from,
                high_water: HighWaterMark::default(),
                fed: None,
                drawn: None,
            });
        }
        let mut clients = Vec::new();
        for index in 0..scenario.deployers {
            clients.push(ClientRole::Deployer {
                ids: OperationIds::new(format!("deployer{index}")),
                left: scenario.operations_per_deployer,
                current: None,
            });
        }
        for _ in 0..scenario.watchers {
            clients.push(ClientRole::Watcher {
                position: WatchPosition::new(),
                baseline: None,
            });
        }
        for _ in 0..scenario.pollers {
            clients.push(ClientRole::Poller { left: 20 });
        }
        let clients = clients
            .into_iter()
            .map(|role| Client {
                role,
                controller: None,
                call: None,
                attempt: 0,
                in_flight: false,
                finished: false,
                gave_up: None,
            })
            .collect();
        let setup = checkers::Setup {
            registry: Arc::clone(&registry),
            policy: scenario.policy.clone(),
            from: scenario.from,
            hosts: hosts
                .iter()
                .map(|host| (host.config.roles, host.is_controller()))
                .collect(),
        };
        let listed = scenario.catalogue.iter().copied().collect();
        let heal_at = scenario.safety_ms;
        Sim {
            checkers: checkers::all(&setup)
                .into_iter()
                .filter(|checker| !options.without_checkers.contains(&checker.name()))
                .collect(),
            scenario,
            options,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            clock,
            store,
            subscribers: Vec::new(),
            scanned: Revision(0),
            registry,
            catalogue_before,
            catalogue_after,
            published: false,
            listed,
            hosts,
            clients,
            partitions: Vec::new(),
            healed: false,
            heal_at,
            model_cache: None,
            revisions: Vec::new(),
            step_effects: BTreeMap::new(),
            operation_effects: BTreeMap::new(),
            answered_operations: Vec::new(),
            retry_policy: RetryPolicy::default(),
            agent_version_refusals: 0,
            events: 0,
            trace: Trace::new(options.record_trace),
            timeline: options.record_timeline.then(Timeline::default),
            failure: None,
            live: false,
        }
    }

    // ------------------------------------------------------------------ the loop

    /// Runs to the end: success, or the first failure.
    pub fn run(mut self) -> Report {
        self.setup();
        let end_at = self.heal_at + self.scenario.liveness_ms;
        while let Some(item) = self.queue.pop() {
            self.now = item.at;
            self.clock.set(self.now);
            if self.now > end_at {
                self.fail_liveness(
                    "the bound passed before every agent was Ready and every client finished",
                );
                break;
            }
            self.events += 1;
            if self.events > EVENTS_MAX {
                self.fail_liveness("the event budget ran out");
                break;
            }
            self.trace.event(self.now, &item.event);
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.handle(item.event);
            }));
            if let Err(panic) = handled {
                let message = panic_message(panic.as_ref());
                self.fail(
                    FailureKind::Crash,
                    "crash",
                    "no process asserts or panics",
                    message,
                );
                break;
            }
            if self.failure.is_some() || self.live {
                break;
            }
        }
        if self.failure.is_none() && !self.live {
            self.fail_liveness("nothing was left to happen before the goal was reached");
        }
        Report {
            seed: self.scenario.seed,
            events: self.events,
            simulated_ms: self.now,
            trace_hash: self.trace.hash(),
            failure: self.failure,
            trace: self.trace.into_lines(),
            timeline: self.timeline,
        }
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            event,
        });
    }

    fn in_safety(&self) -> bool {
        !self.healed
    }

    fn setup(&mut self) {
        let model = Model {
            uuid: "c0ffee00-0000-4000-8000-000000000000".to_owned(),
            name: "controller".to_owned(),
            agent_version: self.scenario.agent_version,
            agent_stream: None,
            agent_metadata_url: None,
            policy: self.scenario.policy.clone(),
            controllers: ControllerSet::first(self.scenario.controllers),
            capabilities: Capabilities::new(),
            capabilities_discovered: None,
            upgrade_available: None,
        };
        self.store.create_model(&model).expect("a fresh store");
        self.scan_store();
        for host in 0..self.hosts.len() {
            let delay = if self.hosts[host].is_controller() || self.scenario.start == Start::Upgrade
            {
                self.rng.range(0, 2_000)
            } else {
                // Machines are provisioned once bootstrap is under way.
                self.rng.range(10_000, 300_000)
            };
            self.schedule(
                delay,
                Event::Boot {
                    host,
                    incarnation: 0,
                },
            );
        }
        for client in 0..self.clients.len() {
            let delay = match self.clients[client].role {
                ClientRole::Deployer { .. } => 0,
                _ => self.rng.range(0, 60_000),
            };
            self.schedule(delay, Event::ClientWake { client, attempt: 0 });
        }
        if let Some(interval) = self.scenario.faults.crash_interval_ms {
            let at = self.rng.range(0, interval * 2);
            self.schedule(at, Event::Crash);
        }
        if let Some(interval) = self.scenario.faults.partition_interval_ms {
            let at = self.rng.range(0, interval * 2);
            self.schedule(at, Event::Partition);
        }
        if let Some((_, at)) = self.scenario.newer_patch {
            self.schedule(at, Event::Publish);
        }
        if let Some(request) = self.scenario.request {
            self.schedule(request.at_ms, Event::OperatorRequest);
        }
        if let Some(at) = self.scenario.faults.abort_at_ms {
            self.schedule(at, Event::Abort);
        }
        if let Some(at) = self.scenario.faults.rerequest_at_ms {
            self.schedule(at, Event::Rerequest);
        }
        self.schedule(self.heal_at, Event::Heal);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Boot { host, incarnation } => self.boot(host, incarnation),
            Event::Wake { host, incarnation } => {
                if self.current(host, incarnation) {
                    self.hosts[host].wake_at = None;
                    let local = self.local(host);
                    if let Some(process) = &mut self.hosts[host].process {
                        process.handle_timeout(local);
                    }
                    self.drain(host);
                }
            }
            Event::DiskWrite {
                host,
                incarnation,
                id,
                snapshot,
            } => self.disk_write(host, incarnation, id, *snapshot),
            Event::HostStep {
                host,
                incarnation,
                id,
                key,
            } => {
                if self.current(host, incarnation) {
                    self.observe(Observation::HostStepRan { host, key });
                    self.input(
                        host,
                        Input::StepFinished {
                            id,
                            outcome: StepOutcome::Applied,
                        },
                    );
                }
            }
            Event::Deliver { from, to, message } => {
                if self.blocked(from, to) {
                    self.trace.note(self.now, "dropped by a partition");
                    return;
                }
                self.deliver(*message);
            }
            Event::RequestTimeout {
                host,
                incarnation,
                id,
                attempt,
            } => self.request_timeout(host, incarnation, id, attempt),
            Event::Resend {
                host,
                incarnation,
                id,
            } => {
                if self.current(host, incarnation) && self.hosts[host].awaiting.contains_key(&id) {
                    self.send_request(host, id);
                }
            }
            Event::DriverTick { host, incarnation } => self.driver_tick(host, incarnation),
            Event::ClientWake { client, attempt } => {
                if self.clients[client].attempt == attempt && !self.clients[client].finished {
                    self.client_send(client);
                }
            }
            Event::ClientTimeout { client, attempt } => {
                if self.clients[client].attempt == attempt && self.clients[client].in_flight {
                    self.clients[client].in_flight = false;
                    self.client_decide(client, Attempt::Disconnected);
                }
            }
            Event::Crash => {
                if self.in_safety() {
                    let host = self.rng.index(self.hosts.len());
                    self.crash(host, "crash");
                    if let Some(interval) = self.scenario.faults.crash_interval_ms {
                        let next = self.now + self.rng.range(1, interval * 2);
                        self.schedule(next, Event::Crash);
                    }
                }
            }
            Event::Partition => {
                if self.in_safety() {
                    self.partition();
                }
            }
            Event::HealPartition { index } => {
                self.partitions[index].healed = true;
            }
            Event::Publish => {
                self.published = true;
                if let Some((version, _)) = self.scenario.newer_patch {
                    self.listed.insert(version);
                    self.mark_fault(None, &format!("stream publishes {version}"));
                }
            }
            Event::OperatorRequest => {
                if let Some(request) = self.scenario.request {
                    let host = usize::from(request.controller);
                    self.mark_fault(Some(host), "operator: upgrade-controller");
                    self.input(
                        host,
                        Input::UpgradeRequested {
                            version: request.version,
                        },
                    );
                }
            }
            Event::Abort => {
                if self.in_safety() {
                    let host = self.rng.index(usize::from(self.scenario.controllers));
                    self.mark_fault(Some(host), "operator: abort-upgrade");
                    self.input(host, Input::Operator(OperatorAction::Abort));
                }
            }
            Event::Rerequest => {
                if self.in_safety() {
                    let host = self.rng.index(usize::from(self.scenario.controllers));
                    self.mark_fault(Some(host), "operator: upgrade-controller again");
                    let version = self
                        .intended()
                        .or(self.scenario.request.and_then(|r| r.version));
                    self.input(host, Input::UpgradeRequested { version });
                }
            }
            Event::ExpireLease { holder, token } => {
                if self.in_safety()
                    && self
                        .store
                        .release_lease(holder, token)
                        .expect("the store answers")
                {
                    self.mark_fault(Some(usize::from(holder.0)), "lease expires");
                }
            }
            Event::Heal => self.heal(),
            Event::OperatorTick => self.operator_tick(),
            Event::LivenessCheck => {
                self.check_live();
                if !self.live {
                    self.schedule(self.now + 1_000, Event::LivenessCheck);
                }
            }
        }
    }

    fn current(&self, host: usize, incarnation: u64) -> bool {
        let state = &self.hosts[host];
        state.incarnation == incarnation && state.process.is_some()
    }

    fn local(&self, host: usize) -> Timestamp {
        self.hosts[host].clock.local(self.now)
    }

    // ------------------------------------------------------------------ processes

    fn boot(&mut self, host: usize, incarnation: u64) {
        let state = &mut self.hosts[host];
        if state.incarnation != incarnation || state.process.is_some() {
            return;
        }
        let mut process = match Lifecycle::new(
            state.config.clone(),
            Arc::clone(&self.registry),
            state.durable.clone(),
        ) {
            Ok(process) => process,
            Err(error) => {
                let message = format!("{} refused to start: {error}", state.name);
                self.fail(
                    FailureKind::Crash,
                    "boot",
                    "a process starts from any snapshot it persisted",
                    message,
                );
                return;
            }
        };
        if self.options.mutations != Mutations::default() {
            process.set_mutations(self.options.mutations);
        }
        state.process = Some(process);
        state.awaiting.clear();
        state.watching = false;
        state.record_delivered = None;
        state.wake_at = None;
        state.fed = None;
        let running = state.config.running.clone();
        let tick = if state.is_controller() {
            CONTROLLER_TICK_MS
        } else {
            AGENT_POLL_MS
        };
        let tick_at = self.now + state.clock.global_after(tick);
        self.schedule(tick_at, Event::DriverTick { host, incarnation });
        let listed = self.listed.clone();
        self.observe(Observation::Booted {
            host,
            binary: &running,
            listed: &listed,
        });
        self.draw(host, Some(Phase::Bootstrapping));
        self.input(host, Input::Start);
    }

    /// The process dies: what was in flight is lost; it restarts after a while.
    fn crash(&mut self, host: usize, why: &str) {
        if self.hosts[host].process.is_none() {
            return;
        }
        self.mark_fault(Some(host), why);
        self.stop(host);
        let incarnation = self.hosts[host].incarnation;
        let at = self.now + self.rng.range(100, 30_000);
        self.schedule(at, Event::Boot { host, incarnation });
    }

    fn stop(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        state.process = None;
        state.incarnation += 1;
        state.awaiting.clear();
        state.watching = false;
        state.wake_at = None;
        state.gate.phase = Phase::Bootstrapping;
        self.subscribers
            .retain(|&(subscriber, _)| subscriber != host);
        self.draw(host, None);
    }

    /// Feeds one input to a host's process (if it runs) and drains its outputs.
    fn input(&mut self, host: usize, input: Input) {
        let local = self.local(host);
        let Some(process) = &mut self.hosts[host].process else {
            return;
        };
        self.trace.input(self.now, host, &input);
        process.handle(local, input);
        self.drain(host);
    }

    fn drain(&mut self, host: usize) {
        let incarnation = self.hosts[host].incarnation;
        loop {
            let Some(process) = &mut self.hosts[host].process else {
                return;
            };
            let Some(output) = process.poll_output() else {
                break;
            };
            let phase = process.phase();
            match output {
                Output::Request { id, request } => {
                    self.trace.request(self.now, host, id, &request);
                    self.dispatch(host, incarnation, id, request);
                }
                Output::Gate(view) => {
                    self.hosts[host].gate = view;
                    self.observe(Observation::GatePublished {
                        host,
                        view: view.phase,
                        process: phase,
                    });
                    self.draw(host, Some(view.phase));
                }
                Output::Status(report) => {
                    if !report.message.is_empty() {
                        self.trace.note(
                            self.now,
                            &format!("{} status: {}", self.hosts[host].name, report.message),
                        );
                    }
                }
            }
            if self.hosts[host].incarnation != incarnation {
                return; // it restarted into another binary
            }
        }
        let state = &self.hosts[host];
        let Some(process) = &state.process else {
            return;
        };
        if process.phase() == Phase::Ready {
            let observation = Observation::Ready {
                host,
                running: state.config.running.number,
                upgraded_to: process.snapshot().upgraded_to_version,
                durable_upgraded_to: state.durable.as_ref().map(|s| s.upgraded_to_version),
                controller: state.is_controller(),
            };
            self.observe(observation);
        }
        // Timers: wake at the earliest deadline, on this host's clock.
        if let Some(deadline) = self.hosts[host]
            .process
            .as_ref()
            .and_then(Lifecycle::poll_timeout)
        {
            let at = self.hosts[host].clock.global(deadline).max(self.now);
            if self.hosts[host]
                .wake_at
                .is_none_or(|wake| at < wake || wake < self.now)
            {
                self.hosts[host].wake_at = Some(at);
                self.schedule(at, Event::Wake { host, incarnation });
            }
        }
    }

    fn dispatch(&mut self, host: usize, incarnation: u64, id: RequestId, request: Request) {
        let controller = self.hosts[host].is_controller();
        match request {
            Request::PersistSnapshot(snapshot) => {
                let at = self.now + self.rng.range(1, 20);
                self.schedule(
                    at,
                    Event::DiskWrite {
                        host,
                        incarnation,
                        id,
                        snapshot: Box::new(snapshot),
                    },
                );
            }
            Request::RunStep { step, key, .. }
                if self.registry.step(step).kind == StepKind::Host =>
            {
                let at = self.now + self.rng.range(1, 200);
                self.schedule(
                    at,
                    Event::HostStep {
                        host,
                        incarnation,
                        id,
                        key,
                    },
                );
            }
            Request::RestartInto(target) => {
                let state = &self.hosts[host];
                let from = state.config.running.clone();
                let durable = state.durable.clone();
                self.observe(Observation::Restart {
                    host,
                    from: &from,
                    to: &target,
                    durable: durable.as_ref(),
                });
                self.trace.note(
                    self.now,
                    &format!("{} restarts into {target}", self.hosts[host].name),
                );
                self.stop(host);
                self.hosts[host].config.running = target;
                let incarnation = self.hosts[host].incarnation;
                let at = self.now + self.rng.range(100, 1_000);
                self.schedule(at, Event::Boot { host, incarnation });
            }
            Request::ReleaseLease(_) => {
                // Not awaited.
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            Request::WatchRecord { .. } => {
                // A new subscription: its first delivery is the current view, whatever an
                // earlier subscription of this process delivered.
                self.hosts[host].watching = true;
                self.hosts[host].record_delivered = None;
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            Request::LookupCatalogue { .. } | Request::StageBinary(_) if controller => {
                self.await_request(host, id, request, Route::Streams);
            }
            _ if controller => self.await_request(host, id, request, Route::Store),
            _ => self.await_request(host, id, request, Route::Controller),
        }
    }

    fn await_request(&mut self, host: usize, id: RequestId, request: Request, route: Route) {
        let deadline = Timestamp(self.now + CLIENT_DEADLINE_MS);
        let controller = self.pick_controller();
        self.hosts[host].awaiting.insert(
            id,
            Awaiting {
                request,
                route,
                call: Call::new(Timestamp(self.now), deadline),
                attempt: 0,
                controller,
            },
        );
        self.send_request(host, id);
    }

    fn pick_controller(&mut self) -> usize {
        self.rng.index(usize::from(self.scenario.controllers))
    }

    fn send_request(&mut self, host: usize, id: RequestId) {
        let incarnation = self.hosts[host].incarnation;
        let Some(awaiting) = self.hosts[host].awaiting.get_mut(&id) else {
            return;
        };
        awaiting.attempt += 1;
        let attempt = awaiting.attempt;
        let request = awaiting.request.clone();
        let (to, message, timeout) = match awaiting.route {
            Route::Store => (
                Party::Store,
                Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                },
                STORE_TIMEOUT_MS,
            ),
            Route::Streams => (
                Party::Streams,
                Message::StreamRequest {
                    host,
                    incarnation,
                    id,
                    request,
                },
                STREAM_TIMEOUT_MS,
            ),
            Route::Controller => {
                let controller = awaiting.controller;
                (
                    Party::Host(controller),
                    Message::AgentCall {
                        host,
                        incarnation,
                        controller,
                        id,
                        attempt,
                        call: AgentCall::Request(Box::new(request)),
                    },
                    API_TIMEOUT_MS,
                )
            }
        };
        self.send(Party::Host(host), to, message);
        let at = self.now + timeout;
        self.schedule(
            at,
            Event::RequestTimeout {
                host,
                incarnation,
                id,
                attempt,
            },
        );
    }

    fn request_timeout(&mut self, host: usize, incarnation: u64, id: RequestId, attempt: u32) {
        if !self.current(host, incarnation) {
            return;
        }
        let Some(awaiting) = self.hosts[host].awaiting.get(&id) else {
            return;
        };
        if awaiting.attempt != attempt {
            return;
        }
        if awaiting.route == Route::Streams {
            // The stream stalled: the driver reports the failure; the core retries.
            let request = awaiting.request.clone();
            self.hosts[host].awaiting.remove(&id);
            let reason = "the agent-binary stream did not answer within 30s".to_owned();
            let input = match request {
                Request::StageBinary(_) => Input::Staged {
                    id,
                    result: Err(reason),
                },
                _ => Input::CatalogueFound {
                    id,
                    result: Err(reason),
                },
            };
            self.input(host, input);
            return;
        }
        self.retry(host, id, Attempt::Disconnected);
    }

    /// Asks the shared client logic what to do after an attempt failed.
    fn retry(&mut self, host: usize, id: RequestId, attempt: Attempt) {
        let jitter = self.rng.range(0, 1000) as u16;
        let now = Timestamp(self.now);
        let policy = self.retry_policy;
        let incarnation = self.hosts[host].incarnation;
        let controllers = usize::from(self.scenario.controllers);
        let pick = self.rng.index(controllers);
        let name = self.hosts[host].name.clone();
        let Some(awaiting) = self.hosts[host].awaiting.get_mut(&id) else {
            return;
        };
        let wait = match awaiting.call.decide(&policy, now, attempt, jitter) {
            client::Decision::Finish => return,
            client::Decision::Retry { wait } => wait.0,
            client::Decision::Reconnect { wait } => {
                awaiting.controller = pick;
                wait.0
            }
            client::Decision::GiveUp(give_up) => {
                // The core awaits an answer: the driver starts the call over.
                self.trace
                    .note(self.now, &format!("{name} gave up a call: {give_up}"));
                awaiting.call = Call::new(now, Timestamp(self.now + CLIENT_DEADLINE_MS));
                5_000
            }
        };
        let at = self.now + wait;
        self.schedule(
            at,
            Event::Resend {
                host,
                incarnation,
                id,
            },
        );
    }

    fn disk_write(&mut self, host: usize, incarnation: u64, id: RequestId, snapshot: Snapshot) {
        if !self.current(host, incarnation) {
            return; // the process died before the rename: nothing written
        }
        let persist_crash = self.scenario.faults.persist_crash_per_million;
        if self.in_safety() && self.rng.chance(persist_crash) {
            self.crash(host, "crash before a snapshot write");
            return;
        }
        self.hosts[host].durable = Some(snapshot.clone());
        self.observe(Observation::SnapshotDurable {
            host,
            snapshot: &snapshot,
        });
        if self.in_safety() && self.rng.chance(persist_crash) {
            self.crash(host, "crash after a snapshot write");
            return;
        }
        self.input(host, Input::Done { id });
    }

    // ------------------------------------------------------------------ the network

    fn blocked(&self, from: Party, to: Party) -> bool {
        self.partitions.iter().any(|rule| {
            !rule.healed
                && match rule.b {
                    None => rule.a == from || rule.a == to,
                    Some(b) => (rule.a == from && b == to) || (rule.a == to && b == from),
                }
        })
    }

    fn send(&mut self, from: Party, to: Party, message: Message) {
        let faults = &self.scenario.faults;
        let (drop, delay, duplicate) = if self.in_safety() {
            (
                faults.drop_per_million,
                faults.delay_per_million,
                faults.duplicate_per_million,
            )
        } else {
            (0, 0, 0)
        };
        if self.rng.chance(drop) {
            self.trace.note(self.now, "message dropped");
            return;
        }
        let mut latency = self.rng.range(1, 10);
        if self.rng.chance(delay) {
            latency += self.rng.range(100, 10_000);
        }
        let twice = self.rng.chance(duplicate);
        if twice {
            let at = self.now + latency + self.rng.range(0, 2_000);
            self.schedule(
                at,
                Event::Deliver {
                    from,
                    to,
                    message: Box::new(message.clone()),
                },
            );
        }
        let at = self.now + latency;
        self.schedule(
            at,
            Event::Deliver {
                from,
                to,
                message: Box::new(message),
            },
        );
    }

    fn partition(&mut self) {
        let parties = self.hosts.len() + 2 + self.clients.len();
        let pick = |rng: &mut Rng, hosts: usize| -> Party {
            let index = rng.index(parties);
            match index {
                0 => Party::Store,
                1 => Party::Streams,
                index if index - 2 < hosts => Party::Host(index - 2),
                index => Party::Client(index - 2 - hosts),
            }
        };
        let hosts = self.hosts.len();
        let a = pick(&mut self.rng, hosts);
        let b = if self.rng.coin() {
            None
        } else {
            Some(pick(&mut self.rng, hosts))
        };
        let lasting = self.rng.range(1_000, 120_000);
        let index = self.partitions.len();
        self.partitions.push(PartitionRule {
            a,
            b,
            healed: false,
        });
        let host = match a {
            Party::Host(host) => Some(host),
            _ => None,
        };
        self.mark_fault(host, &format!("partition {a:?} from {b:?}"));
        self.schedule(self.now + lasting, Event::HealPartition { index });
        if let Some(interval) = self.scenario.faults.partition_interval_ms {
            let next = self.now + self.rng.range(1, interval * 2);
            self.schedule(next, Event::Partition);
        }
    }

    fn deliver(&mut self, message: Message) {
        match message {
            Message::StoreRequest {
                host,
                incarnation,
                id,
                request,
            } => self.store_execute(host, incarnation, id, request),
            Message::Reply {
                host,
                incarnation,
                id,
                input,
            } => {
                if !self.current(host, incarnation) {
                    return;
                }
                match id {
                    Some(id) => {
                        if self.hosts[host].awaiting.remove(&id).is_some() {
                            self.input(host, input);
                        }
                    }
                    None => {
                        // A record watch delivery: newer views only, in order.
                        if let Input::RecordChanged(view) = &input {
                            let state = &mut self.hosts[host];
                            if state
                                .record_delivered
                                .is_none_or(|seen| view.revision > seen)
                            {
                                state.record_delivered = Some(view.revision);
                                self.input(host, input);
                            }
                        }
                    }
                }
            }
            Message::Refused {
                host,
                incarnation,
                id,
                attempt,
                phase,
                retry_after,
            } => {
                if self.current(host, incarnation)
                    && self.hosts[host]
                        .awaiting
                        .get(&id)
                        .is_some_and(|awaiting| awaiting.attempt == attempt)
                {
                    let refused = Attempt::UpgradeInProgress {
                        phase: Some(phase),
                        retry_after: Some(lockstep_core::Millis(retry_after)),
                    };
                    self.retry(host, id, refused);
                }
            }
            Message::AgentCall {
                host,
                incarnation,
                controller,
                id,
                attempt,
                call,
            } => self.api_agent_call(host, incarnation, controller, id, attempt, call),
            Message::PollReply {
                host,
                incarnation,
                agent_version,
            } => {
                if self.current(host, incarnation) {
                    self.feed_agent_version(host, agent_version);
                }
            }
            Message::StreamRequest {
                host,
                incarnation,
                id,
                request,
            } => self.stream_serve(host, incarnation, id, request),
            Message::StreamReply {
                host,
                incarnation,
                id,
                reply,
            } => self.stream_reply(host, incarnation, id, reply),
            Message::ClientCall {
                client,
                controller,
                attempt,
                op,
            } => self.api_client_call(client, controller, attempt, op),
            Message::ClientReply {
                client,
                attempt,
                answer,
            } => self.client_reply(client, attempt, answer),
        }
    }

    // ------------------------------------------------------------------ the store

    fn store_execute(&mut self, host: usize, incarnation: u64, id: RequestId, request: Request) {
        let me = self.hosts[host].config.controller;
        let running = self.hosts[host].config.running.number;
        let store = self.store.clone();
        let reply = |input: Input| Message::Reply {
            host,
            incarnation,
            id: Some(id),
            input,
        };
        let message = match request {
            Request::LoadModel => {
                let model = store
                    .load_model()
                    .expect("the store reads")
                    .expect("a model");
                Some(reply(Input::ModelLoaded {
                    id,
                    model: model.view(),
                }))
            }
            Request::RefreshCapabilities => {
                store
                    .set_capabilities(&Capabilities::new(), running)
                    .expect("the model exists");
                Some(reply(Input::Done { id }))
            }
            Request::WatchRecord { .. } => {
                self.subscribers
                    .retain(|&(subscriber, _)| subscriber != host);
                self.subscribers.push((host, incarnation));
                let view = store.record_view().expect("the store reads");
                Some(Message::Reply {
                    host,
                    incarnation,
                    id: None,
                    input: Input::RecordChanged(view),
                })
            }
            Request::CreateRecord(record) => match store.create_record(record) {
                Ok(write) => Some(reply(Input::RecordWritten { id, write })),
                Err(error) => {
                    self.refused(host, &error);
                    None
                }
            },
            Request::UpdateRecord {
                expected,
                record,
                fence,
            } => match store.update_record(expected, record, fence) {
                Ok(write) => Some(reply(Input::RecordWritten { id, write })),
                Err(error) => {
                    self.refused(host, &error);
                    None
                }
            },
            Request::AcquireLease => {
                let holder = me.expect("only controllers take the lease");
                let ttl = self.hosts[host].config.limits.lease_ttl();
                let lease = store.acquire_lease(holder, ttl).expect("the store answers");
                self.maybe_expire(holder, lease);
                Some(reply(Input::LeaseAnswered { id, lease }))
            }
            Request::KeepAliveLease(token) => {
                let holder = me.expect("only controllers keep the lease");
                let lease = store
                    .keep_alive_lease(holder, token)
                    .expect("the store answers");
                self.maybe_expire(holder, lease);
                Some(reply(Input::LeaseAnswered { id, lease }))
            }
            Request::ReleaseLease(token) => {
                let holder = me.expect("only controllers release the lease");
                store
                    .release_lease(holder, token)
                    .expect("the store answers");
                None
            }
            Request::RunStep { key, fence, .. } => {
                let lease = store.lease().expect("the store answers");
                let lease_current = lease.is_some_and(|lease| {
                    Some(lease.holder) == me && lease.is_live(Timestamp(self.now))
                });
                let effect = format!("effect:{key}");
                let outcome = store
                    .run_database_step(key, fence, &mut |tx| {
                        tx.put_document(
                            EntityKind::Relation,
                            &effect,
                            &serde_json::json!({ "step": effect }),
                        )?;
                        Ok(())
                    })
                    .expect("the store answers");
                if outcome == StepOutcome::Applied {
                    self.observe(Observation::DatabaseStepCommitted {
                        host,
                        key,
                        lease_current,
                    });
                }
                Some(reply(Input::StepFinished { id, outcome }))
            }
            Request::SetAgentVersion(version) => {
                // The store checks the core's rule in its write and answers a refusal with
                // what it saw; the driver hands that to the core as it is.
                match store
                    .set_agent_version(version, &AgentVersionCheck::LIFECYCLE)
                    .expect("the store answers")
                {
                    AgentVersionSet::Set { .. } => Some(reply(Input::Done { id })),
                    AgentVersionSet::Refused {
                        refusal,
                        agent_version,
                        view,
                    } => {
                        self.agent_version_refusals += 1;
                        self.trace.note(
                            self.now,
                            &format!("store refused agent-version {version}: {refusal}"),
                        );
                        Some(reply(Input::AgentVersionRefused {
                            id,
                            agent_version,
                            view,
                        }))
                    }
                }
            }
            Request::ReportUpgradeAvailable(version) => {
                store
                    .report_upgrade_available(version)
                    .expect("the model exists");
                Some(reply(Input::Done { id }))
            }
            other => panic!("{other:?} is not a store request"),
        };
        self.scan_store();
        if let Some(message) = message {
            self.send(Party::Store, Party::Host(host), message);
        }
    }

    /// The lease-expiry fault: a lease just granted or kept alive is lost shortly after,
    /// while its holder may still be writing under it.
    fn maybe_expire(
        &mut self,
        holder: ControllerId,
        lease: Option<lockstep_core::lifecycle::LeaseToken>,
    ) {
        let rate = self.scenario.faults.lease_expiry_per_million;
        if let Some(token) = lease
            && self.in_safety()
            && self.rng.chance(rate)
        {
            let at = self.now + self.rng.range(0, 50);
            self.schedule(at, Event::ExpireLease { holder, token });
        }
    }

    fn refused(&mut self, host: usize, error: &StoreError) {
        let what = format!(
            "{} asked for an invalid write: {error}",
            self.hosts[host].name
        );
        self.observe(Observation::StoreRefused { what });
    }

    /// Reads what the store's log gained since the last scan: record writes for the
    /// checkers, effect counts, and record notifications for the watching controllers.
    fn scan_store(&mut self) {
        let Ok(Changes::Events { events, .. }) = self.store.changes_since(self.scanned, usize::MAX)
        else {
            panic!("the store's log cannot be read after {}", self.scanned.0);
        };
        if events.is_empty() {
            return;
        }
        let mut record_changed = false;
        for event in events {
            self.scanned = event.revision;
            self.revisions.push(event.revision);
            match event.kind {
                EntityKind::UpgradeInfo => {
                    record_changed = true;
                    let record = serde_json::from_value(event.entity.clone())
                        .expect("the store logs records it can read");
                    self.observe(Observation::RecordWritten {
                        record,
                        archived: event.change == ChangeKind::Remove,
                    });
                }
                EntityKind::Step => {
                    let key = event.id.trim_start_matches("effect:").to_owned();
                    let key = StepKey::parse(&key).expect("a step key");
                    self.step_effects.entry(key).or_insert((0, 0)).1 += 1;
                }
                EntityKind::Relation => {
                    let key = event.id.trim_start_matches("effect:");
                    let key = StepKey::parse(key).expect("a step key");
                    self.step_effects.entry(key).or_insert((0, 0)).0 += 1;
                }
                EntityKind::Application => {
                    *self.operation_effects.entry(event.id.clone()).or_insert(0) += 1;
                }
                _ => {}
            }
        }
        if record_changed {
            let view = self.store.record_view().expect("the store reads");
            for (host, incarnation) in self.subscribers.clone() {
                let message = Message::Reply {
                    host,
                    incarnation,
                    id: None,
                    input: Input::RecordChanged(view),
                };
                self.send(Party::Store, Party::Host(host), message);
            }
        }
    }

    fn model(&mut self) -> Model {
        let revision = self.scanned;
        match &self.model_cache {
            Some((cached, model)) if *cached == revision => model.clone(),
            _ => {
                let model = self
                    .store
                    .load_model()
                    .expect("the store reads")
                    .expect("a model");
                self.model_cache = Some((revision, model.clone()));
                model
            }
        }
    }

    // ------------------------------------------------------------------ the stream

    fn stream_serve(&mut self, host: usize, incarnation: u64, id: RequestId, request: Request) {
        let faults = &self.scenario.faults;
        let (stall, corrupt, rollback) = if self.in_safety() {
            (
                faults.stream_stall_per_million,
                faults.stream_corrupt_per_million,
                faults.stream_rollback_per_million,
            )
        } else {
            (0, 0, 0)
        };
        if self.rng.chance(stall) {
            self.mark_fault(Some(host), "stream stalls");
            return;
        }
        let corrupted = self.rng.chance(corrupt);
        let rolled_back = self.rng.chance(rollback);
        let reply = match request {
            Request::LookupCatalogue { .. } => {
                if corrupted {
                    self.mark_fault(Some(host), "stream serves corrupt metadata");
                    Err("index.sjson: signature verification failed (corrupt bytes)".to_owned())
                } else if rolled_back || !self.published {
                    if rolled_back {
                        self.mark_fault(Some(host), "stream rolls its metadata back");
                    }
                    Ok((self.catalogue_before.clone(), EPOCH_UNIX_SECONDS))
                } else {
                    let (catalogue, at) = self.catalogue_after.clone().expect("published");
                    Ok((catalogue, EPOCH_UNIX_SECONDS + at / 1000 + 1))
                }
            }
            Request::StageBinary(plan) => {
                let listed = self.listed.contains(&plan.binary.number);
                let verified =
                    !corrupted && listed && plan.sha256 == artifact_sha(plan.binary.number);
                if corrupted {
                    self.mark_fault(Some(host), "stream serves a corrupt binary");
                }
                if verified {
                    Ok((Catalogue::default(), 0))
                } else {
                    Err(format!(
                        "sha256 mismatch for {}: the download does not match the catalogue",
                        plan.binary
                    ))
                }
            }
            other => panic!("{other:?} is not a stream request"),
        };
        let message = Message::StreamReply {
            host,
            incarnation,
            id,
            reply,
        };
        self.send(Party::Streams, Party::Host(host), message);
    }

    fn stream_reply(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        reply: Result<(Catalogue, u64), String>,
    ) {
        if !self.current(host, incarnation) {
            return;
        }
        let Some(awaiting) = self.hosts[host].awaiting.remove(&id) else {
            return;
        };
        let input = match awaiting.request {
            Request::StageBinary(_) => Input::Staged {
                id,
                result: reply.map(|_| ()),
            },
            _ => {
                // The streams adapter's guards: nothing reaches the core unless admitted by
                // the high-water mark, which then advances (durably, with the host's disk).
                let now_unix = EPOCH_UNIX_SECONDS + self.now / 1000;
                let result = reply.and_then(|(catalogue, updated)| {
                    let mark = &mut self.hosts[host].high_water;
                    let highest = catalogue.highest_version();
                    mark.admit(updated, now_unix, FREEZE_AFTER_SECONDS)
                        .map_err(|error| error.to_string())?;
                    mark.admit_version(highest)
                        .map_err(|error| error.to_string())?;
                    mark.advance(updated, highest);
                    Ok(catalogue)
                });
                Input::CatalogueFound { id, result }
            }
        };
        self.input(host, input);
    }

    // ------------------------------------------------------------------ the API server

    fn api_agent_call(
        &mut self,
        host: usize,
        incarnation: u64,
        controller: usize,
        id: RequestId,
        attempt: u32,
        call: AgentCall,
    ) {
        let Some(process) = &self.hosts[controller].process else {
            return; // nobody listens: the caller times out
        };
        let phase = process.phase();
        let view = self.hosts[controller].gate;
        let tag = self.hosts[host].name.clone();
        if let AgentCall::Request(request) = &call
            && let Request::StageBinary(_) = **request
        {
            // The tools endpoint is plain HTTP, not behind the API gate.
        } else {
            let admitted = gate::admit_login(&view, Login::MachineAgent, &tag).is_ok();
            self.observe(Observation::GateDecision {
                host: controller,
                process: phase,
                login: Login::MachineAgent,
                facade: "Admin",
                method: "Login",
                admitted,
            });
            if !admitted {
                let message = Message::Refused {
                    host,
                    incarnation,
                    id,
                    attempt,
                    phase: view.phase,
                    retry_after: view.retry_after.0,
                };
                self.send(Party::Host(controller), Party::Host(host), message);
                return;
            }
        }
        let model = self.model();
        let reply = |input: Input| Message::Reply {
            host,
            incarnation,
            id: Some(id),
            input,
        };
        let call = match call {
            AgentCall::Poll => None,
            AgentCall::Request(request) => Some(*request),
        };
        let message = match call {
            // `Upgrader.DesiredVersion`: the version the agent should run, controllers first.
            None => Message::PollReply {
                host,
                incarnation,
                agent_version: self.desired_version(host, controller),
            },
            Some(Request::LoadModel) => reply(Input::ModelLoaded {
                id,
                model: model.view(),
            }),
            Some(Request::DesiredBinary) => {
                let desired = self.desired_version(host, controller);
                let running = &self.hosts[host].config.running;
                let catalogue = if self.published {
                    &self.catalogue_after.as_ref().expect("published").0
                } else {
                    &self.catalogue_before
                };
                let Some(entry) = catalogue
                    .find(
                        desired,
                        &running.release,
                        &running.arch,
                        Stream::preferred(None, &running.number),
                    )
                    .cloned()
                else {
                    return; // no binary to offer yet: the agent asks again
                };
                reply(Input::DesiredBinary {
                    id,
                    plan: StagePlan {
                        binary: entry.binary,
                        size_bytes: entry.size_bytes,
                        sha256: entry.sha256,
                        source: StageSource::Controller,
                    },
                })
            }
            Some(Request::StageBinary(_)) => reply(Input::Staged { id, result: Ok(()) }),
            Some(other) => panic!("{other:?} is not an agent API call"),
        };
        self.send(Party::Host(controller), Party::Host(host), message);
    }

    /// What `controller`'s `Upgrader.DesiredVersion` answers `host` (the poll and the
    /// desired binary alike). Juju's controllers-first rule, as lockstep-transport's
    /// `desired_version` keeps it: an agent other than a controller is offered agent-version
    /// only once every controller runs it (this API server included); until then, the
    /// version it runs.
    fn desired_version(&mut self, host: usize, controller: usize) -> Version {
        let wanted = self.model().agent_version;
        let controllers_run_it = (0..usize::from(self.scenario.controllers))
            .chain([controller])
            .all(|index| self.hosts[index].config.running.number >= wanted);
        if controllers_run_it {
            wanted
        } else {
            self.hosts[host].config.running.number
        }
    }

    fn api_client_call(&mut self, client: usize, controller: usize, attempt: u64, op: ClientOp) {
        let Some(process) = &self.hosts[controller].process else {
            return;
        };
        let phase = process.phase();
        let view = self.hosts[controller].gate;
        let (facade, method) = match &op {
            ClientOp::Deploy { .. } => ("Application", "Deploy"),
            ClientOp::Next { .. } => ("AllWatcher", "Next"),
            ClientOp::Status => ("Client", "FullStatus"),
        };
        let admitted = gate::admit(&view, Login::User, facade, method).is_ok();
        self.observe(Observation::GateDecision {
            host: controller,
            process: phase,
            login: Login::User,
            facade,
            method,
            admitted,
        });
        let answer = if !admitted {
            ClientAnswer::Refused {
                phase: view.phase,
                retry_after: view.retry_after.0,
            }
        } else {
            match op {
                ClientOp::Deploy { operation } => {
                    let outcome = self
                        .store
                        .apply_operation(&operation, &mut |tx| {
                            tx.put_application(&lockstep_store::Application {
                                name: operation.clone(),
                                charm: "ch:amd64/jammy/mysql-42".to_owned(),
                                life: lockstep_store::Life::Alive,
                            })?;
                            Ok(serde_json::json!({ "deployed": operation }))
                        })
                        .expect("the store answers");
                    if let OperationOutcome::Applied(_) = outcome {
                        self.observe(Observation::OperationApplied {
                            operation: &operation,
                        });
                    }
                    self.scan_store();
                    ClientAnswer::Deployed
                }
                ClientOp::Next { after: None } => ClientAnswer::Snapshot(self.scanned),
                ClientOp::Next { after: Some(after) } => {
                    match self
                        .store
                        .changes_since(after, 20)
                        .expect("the store answers")
                    {
                        Changes::Events { events, .. } => ClientAnswer::Events(
                            events.iter().map(|event| event.revision).collect(),
                        ),
                        Changes::ResyncNeeded { current, .. } => ClientAnswer::Snapshot(current),
                    }
                }
                ClientOp::Status => ClientAnswer::Status,
            }
        };
        let message = Message::ClientReply {
            client,
            attempt,
            answer,
        };
        self.send(Party::Host(controller), Party::Client(client), message);
    }

    // ------------------------------------------------------------------ drivers

    fn driver_tick(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation) {
            return;
        }
        let controller = self.hosts[host].is_controller();
        let phase = self.hosts[host].process.as_ref().map(Lifecycle::phase);
        if controller {
            // Resume the record watch after the last revision seen (a lost notification
            // is found again), in every phase: a subscription lasts as long as the process,
            // and lockstep-agent's watch thread reads the record again by itself.
            if self.hosts[host].watching {
                let after = self.hosts[host].record_delivered.unwrap_or(Revision(0));
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id: RequestId(u64::MAX),
                    request: Request::WatchRecord { after },
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            let version = self.model().agent_version;
            self.feed_agent_version(host, version);
        } else if phase == Some(Phase::Ready) {
            let controller = self.pick_controller();
            let message = Message::AgentCall {
                host,
                incarnation,
                controller,
                id: RequestId(u64::MAX),
                attempt: 0,
                call: AgentCall::Poll,
            };
            self.send(Party::Host(host), Party::Host(controller), message);
        }
        let tick = if controller {
            CONTROLLER_TICK_MS
        } else {
            AGENT_POLL_MS
        };
        let at = self.now + self.hosts[host].clock.global_after(tick);
        self.schedule(at, Event::DriverTick { host, incarnation });
    }

    /// Tells a process each change of the model's agent-version once, in any phase, as
    /// lockstep-agent's model watch does (counting from the version the process runs): the
    /// core keeps the latest and decides when to act on it.
    fn feed_agent_version(&mut self, host: usize, version: Version) {
        let state = &self.hosts[host];
        if state.process.is_none() {
            return;
        }
        if version == state.fed.unwrap_or(state.config.running.number) {
            return;
        }
        self.hosts[host].fed = Some(version);
        self.input(host, Input::AgentVersionChanged(version));
    }

    // ------------------------------------------------------------------ clients

    fn client_send(&mut self, client: usize) {
        let scanned = self.scanned;
        let controllers = usize::from(self.scenario.controllers);
        let pick = self.rng.index(controllers);
        let now = self.now;
        let state = &mut self.clients[client];
        if state.in_flight || state.finished {
            return;
        }
        let op = match &mut state.role {
            ClientRole::Deployer { ids, left, current } => {
                if current.is_none() {
                    if *left == 0 {
                        state.finished = true;
                        return;
                    }
                    *left -= 1;
                    *current = Some(ids.next_id());
                }
                ClientOp::Deploy {
                    operation: current.clone().expect("set above"),
                }
            }
            ClientRole::Watcher { position, .. } => {
                let _ = scanned;
                ClientOp::Next {
                    after: position.resume_after(),
                }
            }
            ClientRole::Poller { left } => {
                if *left == 0 {
                    state.finished = true;
                    return;
                }
                ClientOp::Status
            }
        };
        if state.call.is_none() {
            state.call = Some(Call::new(
                Timestamp(now),
                Timestamp(now + CLIENT_DEADLINE_MS),
            ));
        }
        let controller = *state.controller.get_or_insert(pick);
        state.attempt += 1;
        state.in_flight = true;
        let attempt = state.attempt;
        let message = Message::ClientCall {
            client,
            controller,
            attempt,
            op,
        };
        self.send(Party::Client(client), Party::Host(controller), message);
        self.schedule(
            now + API_TIMEOUT_MS,
            Event::ClientTimeout { client, attempt },
        );
    }

    fn client_reply(&mut self, client: usize, attempt: u64, answer: ClientAnswer) {
        let state = &mut self.clients[client];
        if state.attempt != attempt || !state.in_flight {
            return; // an answer to an attempt given up on
        }
        state.in_flight = false;
        match answer {
            ClientAnswer::Refused { phase, retry_after } => {
                if let Some(timeline) = &mut self.timeline {
                    timeline.retry(self.now, client);
                }
                self.client_decide(
                    client,
                    Attempt::UpgradeInProgress {
                        phase: Some(phase),
                        retry_after: Some(lockstep_core::Millis(retry_after)),
                    },
                );
            }
            answer => {
                let mut delivered = Vec::new();
                let state = &mut self.clients[client];
                match (&mut state.role, answer) {
                    (ClientRole::Deployer { current, .. }, ClientAnswer::Deployed) => {
                        let operation = current.take().expect("a call in flight");
                        self.answered_operations.push(operation);
                    }
                    (
                        ClientRole::Watcher { position, baseline },
                        ClientAnswer::Snapshot(revision),
                    ) => {
                        if position.resume_after().is_none() {
                            position.reached(revision);
                            baseline.get_or_insert(revision);
                        }
                    }
                    (ClientRole::Watcher { position, .. }, ClientAnswer::Events(revisions)) => {
                        for revision in revisions {
                            if position.accept(revision) {
                                delivered.push(revision);
                            }
                        }
                    }
                    (ClientRole::Poller { left }, ClientAnswer::Status) => {
                        *left = left.saturating_sub(1);
                    }
                    (role, answer) => panic!("{answer:?} answers no call of {role:?}"),
                }
                for revision in delivered {
                    self.observe(Observation::WatcherDelivered { client, revision });
                }
                self.client_decide(client, Attempt::Answered);
            }
        }
    }

    fn client_decide(&mut self, client: usize, attempt: Attempt) {
        let jitter = self.rng.range(0, 1000) as u16;
        let now = Timestamp(self.now);
        let policy = self.retry_policy;
        let idle = self.rng.range(500, 3_000);
        let state = &mut self.clients[client];
        let Some(call) = &mut state.call else {
            return;
        };
        let wait = match call.decide(&policy, now, attempt, jitter) {
            client::Decision::Finish => {
                state.call = None;
                idle
            }
            client::Decision::Retry { wait } => wait.0,
            client::Decision::Reconnect { wait } => {
                state.controller = None;
                wait.0
            }
            client::Decision::GiveUp(give_up) => {
                state.gave_up = Some(give_up.to_string());
                state.finished = true;
                return;
            }
        };
        state.attempt += 1;
        let attempt = state.attempt;
        self.schedule(self.now + wait, Event::ClientWake { client, attempt });
    }

    // ------------------------------------------------------------------ the operator

    /// The version the operator wants, if one is known now.
    fn intended(&self) -> Option<Version> {
        match (&self.scenario.policy, self.scenario.request) {
            (lockstep_core::policy::UpgradePolicy::Pinned(pinned), _) => Some(*pinned),
            (_, Some(request)) => match request.version {
                Some(version) => Some(version),
                None => self
                    .listed
                    .iter()
                    .copied()
                    .filter(|version| {
                        version.same_minor(&self.scenario.from) && *version > self.scenario.from
                    })
                    .max(),
            },
            _ => None,
        }
        .filter(|version| self.listed.contains(version))
    }

    fn heal(&mut self) {
        self.healed = true;
        for rule in &mut self.partitions {
            rule.healed = true;
        }
        self.mark_fault(None, "healed: liveness phase");
        self.schedule(self.now + 1_000, Event::LivenessCheck);
        self.schedule(self.now + OPERATOR_TICK_MS, Event::OperatorTick);
    }

    fn operator_tick(&mut self) {
        if self.live {
            return;
        }
        for host in 0..self.hosts.len() {
            let held = self.hosts[host]
                .process
                .as_ref()
                .is_some_and(|process| process.phase() == Phase::StepsFailed);
            if held {
                self.mark_fault(Some(host), "operator: retry");
                self.input(host, Input::Operator(OperatorAction::Retry));
            }
        }
        // Upgrade the stragglers to the operator's version, or to the newest version a
        // controller already runs (held there, or Ready), whichever is higher.
        let running = (0..usize::from(self.scenario.controllers))
            .map(|host| self.hosts[host].config.running.number)
            .max();
        let target = self.intended().max(running);
        if let Some(target) = target
            && self.model().agent_version < target
        {
            let ready = (0..usize::from(self.scenario.controllers)).find(|&host| {
                self.hosts[host].process.as_ref().is_some_and(|process| {
                    process.phase() == Phase::Ready && process.awaiting().is_none()
                })
            });
            if let Some(host) = ready {
                self.mark_fault(Some(host), "operator: upgrade-controller (healing)");
                self.input(
                    host,
                    Input::UpgradeRequested {
                        version: Some(target),
                    },
                );
            }
        }
        self.schedule(self.now + OPERATOR_TICK_MS, Event::OperatorTick);
    }

    // ------------------------------------------------------------------ liveness

    fn check_live(&mut self) {
        let model = self.model();
        let version = model.agent_version;
        if self.intended().is_some_and(|target| version < target) {
            return;
        }
        let hosts_done = self.hosts.iter().all(|host| {
            host.process.as_ref().is_some_and(|process| {
                process.phase() == Phase::Ready && process.awaiting().is_none()
            }) && host.config.running.number == version
                && host.awaiting.is_empty()
        });
        if !hosts_done {
            return;
        }
        let scanned = self.scanned;
        let clients_done = self.clients.iter().all(|client| match &client.role {
            ClientRole::Watcher { position, .. } => {
                position.resume_after().is_some_and(|at| at >= scanned)
            }
            _ => client.finished,
        });
        if !clients_done {
            return;
        }
        if let Some((index, client)) = self
            .clients
            .iter()
            .enumerate()
            .find(|(_, client)| client.gave_up.is_some())
        {
            let message = format!(
                "client {index} gave up: {}",
                client.gave_up.clone().unwrap_or_default()
            );
            self.fail(
                FailureKind::Liveness,
                "liveness",
                "every client finishes",
                message,
            );
            return;
        }
        let view: RecordView = self.store.record_view().expect("the store reads");
        if view.current.is_some() {
            return;
        }
        // Live: the end-of-run halves of the checkers.
        let hosts: Vec<EndHost> = self
            .hosts
            .iter()
            .map(|host| EndHost {
                roles: host.config.roles,
                controller: host.is_controller(),
                origin: host.origin,
                running: host.config.running.number,
                durable: host.durable.clone(),
            })
            .collect();
        let watchers: Vec<EndWatcher> = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(index, client)| match &client.role {
                ClientRole::Watcher { position, baseline } => Some(EndWatcher {
                    client: index,
                    baseline: *baseline,
                    position: position.resume_after(),
                }),
                _ => None,
            })
            .collect();
        let end = End {
            hosts: &hosts,
            agent_version: version,
            revisions: &self.revisions,
            step_effects: &self.step_effects,
            operation_effects: &self.operation_effects,
            answered_operations: &self.answered_operations,
            watchers: &watchers,
        };
        let mut failed = None;
        for checker in &mut self.checkers {
            if let Err(message) = checker.finish(&end) {
                failed = Some((checker.name(), checker.invariant(), message));
                break;
            }
        }
        if let Some((name, invariant, message)) = failed {
            self.fail(FailureKind::Correctness, name, invariant, message);
            return;
        }
        self.trace
            .note(self.now, &format!("live: every agent Ready on {version}"));
        self.live = true;
    }

    // ------------------------------------------------------------------ checks and records

    fn observe(&mut self, observation: Observation<'_>) {
        if self.failure.is_some() {
            return;
        }
        for index in 0..self.checkers.len() {
            if let Err(message) = self.checkers[index].observe(&observation) {
                let (name, invariant) = (
                    self.checkers[index].name(),
                    self.checkers[index].invariant(),
                );
                self.fail(FailureKind::Correctness, name, invariant, message);
                return;
            }
        }
    }

    fn fail(
        &mut self,
        kind: FailureKind,
        checker: &'static str,
        invariant: &'static str,
        message: String,
    ) {
        if self.failure.is_none() {
            self.trace
                .note(self.now, &format!("FAILED {checker}: {message}"));
            self.failure = Some(Failure {
                kind,
                checker,
                invariant,
                message,
                at_ms: self.now,
            });
        }
    }

    fn fail_liveness(&mut self, why: &str) {
        let mut message = why.to_owned();
        for host in &self.hosts {
            let phase = host.process.as_ref().map(Lifecycle::phase);
            let _ = write!(
                message,
                "; {} {:?} on {}",
                host.name, phase, host.config.running.number
            );
            if self.hosts.len() > 12 {
                message.push_str("; ...");
                break;
            }
        }
        let model = self.model();
        let _ = write!(message, "; agent-version {}", model.agent_version);
        if let Some(target) = self.intended() {
            let _ = write!(message, " (operator wants {target})");
        }
        if let Ok(view) = self.store.record_view()
            && let Some((record, _)) = view.current
        {
            let _ = write!(message, "; record current: {record:?}");
        }
        if self.agent_version_refusals > 0 {
            let _ = write!(
                message,
                "; agent-version refused {} times while a record was current",
                self.agent_version_refusals
            );
        }
        let scanned = self.scanned;
        for (index, client) in self.clients.iter().enumerate() {
            let waiting = match &client.role {
                ClientRole::Watcher { position, .. } => {
                    position.resume_after().is_none_or(|at| at < scanned)
                }
                _ => !client.finished || client.gave_up.is_some(),
            };
            if waiting {
                let _ = write!(
                    message,
                    "; client {index} unfinished ({:?}, gave up: {:?})",
                    client.role, client.gave_up
                );
            }
        }
        self.fail(
            FailureKind::Liveness,
            "liveness",
            "healed, every agent reaches Ready on the desired version and every client finishes",
            message,
        );
    }

    fn mark_fault(&mut self, host: Option<usize>, what: &str) {
        self.trace.note(self.now, &format!("fault: {what}"));
        if let Some(timeline) = &mut self.timeline {
            timeline.fault(self.now, host, what);
        }
    }

    fn draw(&mut self, host: usize, phase: Option<Phase>) {
        if self.hosts[host].drawn == phase && phase.is_some() {
            return;
        }
        self.hosts[host].drawn = phase;
        if let Some(timeline) = &mut self.timeline {
            let name = self.hosts[host].name.clone();
            let version = self.hosts[host].config.running.number;
            timeline.phase(self.now, host, &name, phase, version);
        }
    }
}

/// Runs one scenario, catching a panic of the core or the simulator as a crash failure.
pub fn run(scenario: Scenario, options: RunOptions) -> Report {
    let seed = scenario.seed;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Sim::new(scenario, options).run()
    })) {
        Ok(report) => report,
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            Report {
                seed,
                events: 0,
                simulated_ms: 0,
                trace_hash: 0,
                failure: Some(Failure {
                    kind: FailureKind::Crash,
                    checker: "crash",
                    invariant: "no process asserts or panics",
                    message,
                    at_ms: 0,
                }),
                trace: None,
                timeline: None,
            }
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
