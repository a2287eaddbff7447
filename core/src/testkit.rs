//! A deterministic, in-memory world that drives real [`Lifecycle`]s: the shared store
//! (model, upgrade-info record with revisions, coordinator lease with fencing, database-step
//! checkpoints), a catalogue, and hosts whose processes crash, restart and switch binaries.
//!
//! It models exactly the store operations of `CONTRACT.md` — create-if-absent,
//! compare-and-set on a revision, a lease with keep-alive and expiry, fenced writes, watch
//! from a revision, and Juju's rule that `agent-version` does not change while an
//! upgrade-info record is current (refused with `AgentVersionRefused`) — and counts the
//! effects the invariants speak of (how often each
//! database step was applied, under which lease; how often each host step ran on each
//! host). The exhaustive explorer, the property tests, the benchmark and the example all
//! drive lifecycles through it, so they check one model.
//!
//! Like the rest of the crate it performs no I/O and reads no clock: time is the world's
//! own counter. Compiled only with the `testkit` feature.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use crate::lifecycle::{
    Config, ControllerId, ControllerSet, Input, LeaseToken, Lifecycle, ModelView, Mutations,
    Output, RecordView, RecordWrite, Request, RequestId, Revision, Snapshot, StagePlan,
    StageSource, StepOutcome, Timer, UpgradeInfo,
};
use crate::phase::Phase;
use crate::policy::Catalogue;
use crate::role::Role;
use crate::steps::{StepKey, StepKind, StepRegistry};
use crate::time::{Millis, Timestamp};
use crate::upgrader::{self, AgentVersionCheck, AgentVersionRefusal, AskingAgent};
use crate::version::{Binary, Version};

/// Host steps and database steps counted per key saturate here: any value above 1 is
/// already a violation of exactly-once, and small counts keep the state space finite.
const RUNS_SATURATE: u8 = 3;

/// The shared store.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Store {
    /// The model, as `LoadModel` reads it.
    pub model: ModelView,
    /// The current upgrade-info record and its revision.
    pub record: Option<(UpgradeInfo, Revision)>,
    /// The record archived last.
    pub last_archived: Option<UpgradeInfo>,
    /// The store's revision: bumped by every change.
    pub revision: Revision,
    /// The coordinator lease: its holder and fencing token.
    pub lease: Option<(ControllerId, LeaseToken)>,
    next_token: u64,
    /// Database steps checkpointed (their effects committed with them).
    pub database_checkpoints: BTreeSet<StepKey>,
    /// Times each database step's effects were committed.
    pub database_runs: BTreeMap<StepKey, u8>,
    /// Database-step commits made by a controller that did not hold the current lease.
    pub unfenced_database_runs: u8,
    /// Record writes that were not valid successors of the record they replaced.
    pub invalid_record_writes: u8,
    /// Times a controller rediscovered capabilities (`RefreshCapabilities`).
    pub capability_refreshes: u8,
    /// The model's `upgrade-available`, as last reported.
    pub upgrade_available: Option<Version>,
    /// The binary each host's agent last reported running (Juju's `Upgrader.SetTools`),
    /// by host index: a process reports the binary it runs when it starts. `None`: never
    /// reported. The Upgrader's controllers-first rule reads these, never a host's config.
    pub reported: Vec<Option<Binary>>,
}

impl Store {
    fn view(&self) -> RecordView {
        RecordView {
            current: self.record,
            last_archived: self.last_archived,
            revision: self.revision,
        }
    }

    fn bump(&mut self) -> Revision {
        self.revision = Revision(self.revision.0 + 1);
        self.revision
    }

    fn fence_holds(&self, fence: Option<LeaseToken>) -> bool {
        match fence {
            None => true,
            Some(token) => self.lease.map(|(_, held)| held) == Some(token),
        }
    }
}

/// One machine: its process (if running), what it has on disk, and what is in flight.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Host {
    /// The agent's configuration; fixed across restarts except the running binary.
    pub config: Config,
    /// The running process, if any.
    pub process: Option<Lifecycle>,
    /// The snapshot on disk (`agent.conf`), as last persisted.
    pub durable: Option<Snapshot>,
    /// Requests made and not yet executed.
    pub in_flight: Vec<(RequestId, Request)>,
    /// Results of executed requests, not yet delivered (delivered in order).
    pub completions: Vec<Input>,
    /// The process subscribed to the upgrade-info record.
    pub watching: bool,
    /// Times each host step ran here.
    pub host_runs: BTreeMap<StepKey, u8>,
    /// The gate as the API server would serve it: the last view the core published.
    pub gate_phase: Phase,
    /// The process ended to restart into this binary.
    pub restarting: bool,
    /// `upgradedToVersion` when the world began: where this host's upgrade starts.
    pub origin: Version,
    /// The phase the process was in when it published a gate view opening the full API
    /// outside Ready. Sticky, like the store's effect counters: the API server serves every
    /// view it is given, even one the same drain replaces, so a breach is recorded the
    /// moment the view is published rather than read off the last view at the end.
    pub gate_breach: Option<Phase>,
    /// The phase and progress the gate last published (for I9).
    pub published: Option<(Phase, u32)>,
    /// The first published output that broke I9, described.
    pub publication_fault: Option<String>,
    /// The last non-empty status message the process published (`None` after a crash).
    /// Not part of the host's hash: it only repeats what the process's state holds (a held
    /// process's reason), and hashing every progress message would split equal states.
    pub status_message: Option<String>,
    /// The phase that status message was marked with (not hashed, likewise).
    pub status_phase: Option<Phase>,
}

impl std::hash::Hash for Host {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        self.config.hash(hasher);
        match &self.process {
            Some(process) => {
                1u8.hash(hasher);
                process.hash_state(hasher);
            }
            None => 0u8.hash(hasher),
        }
        self.durable.hash(hasher);
        self.in_flight.hash(hasher);
        self.completions.len().hash(hasher);
        for input in &self.completions {
            hash_input(input, hasher);
        }
        self.watching.hash(hasher);
        self.host_runs.hash(hasher);
        self.gate_phase.hash(hasher);
        self.restarting.hash(hasher);
        self.origin.hash(hasher);
        self.gate_breach.hash(hasher);
        self.published.hash(hasher);
        self.publication_fault.hash(hasher);
    }
}

/// Hashes a completion (`Input` is not `Hash`: a catalogue is compared, not hashed).
fn hash_input<H: std::hash::Hasher>(input: &Input, hasher: &mut H) {
    use std::hash::Hash;
    std::mem::discriminant(input).hash(hasher);
    match input {
        Input::Start => {}
        Input::Done { id } => id.hash(hasher),
        Input::ModelLoaded { id, model } => (id, model).hash(hasher),
        Input::RecordChanged(view) => view.hash(hasher),
        Input::RecordWritten { id, write } => (id, write).hash(hasher),
        Input::LeaseAnswered { id, lease } => (id, lease).hash(hasher),
        Input::StepFinished { id, outcome } => (id, outcome).hash(hasher),
        Input::CatalogueFound { id, result } => {
            id.hash(hasher);
            match result {
                Ok(catalogue) => catalogue.entries().hash(hasher),
                Err(reason) => reason.hash(hasher),
            }
        }
        Input::DesiredBinary { id, plan } => (id, plan).hash(hasher),
        Input::Staged { id, result } => (id, result).hash(hasher),
        Input::AgentVersionRefused {
            id,
            agent_version,
            view,
        } => (id, agent_version, view).hash(hasher),
        Input::AgentVersionChanged(version) => version.hash(hasher),
        Input::UpgradeRequested { version } => version.hash(hasher),
        Input::Operator(action) => action.hash(hasher),
    }
}

/// The timers that say "something took too long": early fires are a budgeted fault.
fn is_timeout(timer: Timer) -> bool {
    matches!(
        timer,
        Timer::ControllersWait | Timer::TrialReady | Timer::LeaseDeadline
    )
}

/// One thing that can happen next in a world.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Action {
    /// Host `host` starts its process (first boot, after a crash, or into a new binary).
    Boot {
        /// The host, by index.
        host: usize,
    },
    /// The store (or provider, or disk) executes the `index`-th request in flight.
    Execute {
        /// The host, by index.
        host: usize,
        /// The request, by its place among the host's requests in flight.
        index: usize,
    },
    /// The oldest completion reaches the process.
    Deliver {
        /// The host, by index.
        host: usize,
    },
    /// An armed timer fires.
    Fire {
        /// The host, by index.
        host: usize,
        /// The timer.
        timer: Timer,
    },
    /// The process dies; what was not durable is lost.
    Crash {
        /// The host, by index.
        host: usize,
    },
    /// The coordinator lease expires (its holder stopped keeping it alive, or was cut off).
    ExpireLease,
}

/// A broken invariant, named as in `spec/invariants.md`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Violation {
    /// I1: the gate served the full API outside Ready.
    GateOpenOutsideReady {
        /// The host, by index.
        host: usize,
        /// The phase its process was in.
        phase: Phase,
    },
    /// I2: a database step's effects were committed more than once.
    DatabaseStepTwice {
        /// The step's checkpoint key.
        key: StepKey,
    },
    /// I3: a database step was committed by a controller not holding the current lease.
    UnfencedCoordinatorWrite,
    /// I4: the upgrade-info record took an invalid transition.
    InvalidRecordTransition,
    /// I5: a host checkpoint is durable for a step that never ran on that host.
    CheckpointWithoutEffects {
        /// The host, by index.
        host: usize,
        /// The step's checkpoint key.
        key: StepKey,
    },
    /// I6: `upgradedToVersion` advanced while a planned step had not run.
    UpgradedToAheadOfSteps {
        /// The host, by index.
        host: usize,
        /// The key of the step that had not run.
        key: StepKey,
    },
    /// I7: a process is Ready while its own steps are not recorded as done.
    ReadyBeforeSteps {
        /// The host, by index.
        host: usize,
    },
    /// I8: a controller serves (is Ready on) a binary older than a database step already
    /// applied to the shared store: a rollback onto migrated state.
    OldBinaryOnMigratedStore {
        /// The host, by index.
        host: usize,
        /// The newer database step applied.
        key: StepKey,
    },
    /// I9: published progress ran backwards within a phase, or a status was marked with
    /// another phase than the gate's.
    PublishedOutOfStep {
        /// The host, by index.
        host: usize,
        /// What was out of step.
        fault: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The whole world.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct World {
    /// The steps every host runs.
    pub registry: Arc<StepRegistry>,
    /// The agent binaries the catalogue offers.
    pub catalogue: Catalogue,
    /// The shared store.
    pub store: Store,
    /// The machines, controllers first.
    pub hosts: Vec<Host>,
    /// The world's clock.
    pub now: Timestamp,
    /// Planted defects switched on in every process this world boots.
    pub mutations: Mutations,
    /// Remaining crashes the explorer may inject.
    pub crashes_left: u8,
    /// Remaining lease expiries the explorer may inject.
    pub expiries_left: u8,
    /// Remaining fires of the timers that say "something took too long"
    /// ([`Timer::ControllersWait`], [`Timer::TrialReady`], [`Timer::LeaseDeadline`]). Time
    /// is abstract in the explorer, so such a timer may fire at any moment: a timing fault,
    /// budgeted like the others. Unbounded (255) unless an explorer narrows it.
    pub timeouts_left: u8,
    /// Remaining fires of the periodic [`Timer::CatalogueCheck`]. Each fire repeats the same
    /// lookup with a fresh request id, so an unbounded budget means an unbounded state
    /// space. Unbounded (255) unless an explorer narrows it.
    pub catalogue_checks_left: u8,
}

impl std::hash::Hash for World {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        self.store.hash(hasher);
        self.hosts.hash(hasher);
        self.crashes_left.hash(hasher);
        self.expiries_left.hash(hasher);
        self.timeouts_left.hash(hasher);
        self.catalogue_checks_left.hash(hasher);
    }
}

/// What a world is built from.
#[derive(Clone, Debug)]
pub struct WorldSpec {
    /// The steps every host runs.
    pub registry: Arc<StepRegistry>,
    /// The agent binaries the catalogue offers.
    pub catalogue: Catalogue,
    /// The model in the store at the start.
    pub model: ModelView,
    /// One config per host; controllers first.
    pub hosts: Vec<Config>,
    /// Each host's snapshot on disk at the start (`None`: first boot after bootstrap).
    pub snapshots: Vec<Option<Snapshot>>,
    /// Crashes the explorer may inject.
    pub crashes: u8,
    /// Lease expiries the explorer may inject.
    pub expiries: u8,
}

impl World {
    /// The world `spec` describes, every process down.
    pub fn new(spec: WorldSpec) -> World {
        assert_eq!(
            spec.hosts.len(),
            spec.snapshots.len(),
            "one snapshot per host"
        );
        let hosts: Vec<Host> = spec
            .hosts
            .into_iter()
            .zip(spec.snapshots)
            .map(|(config, durable)| Host {
                origin: durable.as_ref().map_or(config.running.number, |snapshot| {
                    snapshot.upgraded_to_version
                }),
                config,
                process: None,
                durable,
                in_flight: Vec::new(),
                completions: Vec::new(),
                watching: false,
                host_runs: BTreeMap::new(),
                gate_phase: Phase::Bootstrapping,
                restarting: false,
                gate_breach: None,
                published: None,
                publication_fault: None,
                status_message: None,
                status_phase: None,
            })
            .collect();
        World {
            registry: spec.registry,
            catalogue: spec.catalogue,
            store: Store {
                model: spec.model,
                record: None,
                last_archived: None,
                revision: Revision(1),
                lease: None,
                next_token: 1,
                database_checkpoints: BTreeSet::new(),
                database_runs: BTreeMap::new(),
                unfenced_database_runs: 0,
                invalid_record_writes: 0,
                capability_refreshes: 0,
                upgrade_available: None,
                reported: vec![None; hosts.len()],
            },
            hosts,
            now: Timestamp::ZERO,
            mutations: Mutations::default(),
            crashes_left: spec.crashes,
            expiries_left: spec.expiries,
            timeouts_left: u8::MAX,
            catalogue_checks_left: u8::MAX,
        }
    }

    /// Every action enabled now, in a fixed order.
    ///
    /// A timer is offered only when firing it can change more than request ids (see
    /// [`World::may_fire`]); faults only while their budgets last.
    pub fn actions(&self) -> Vec<Action> {
        let mut actions = Vec::new();
        for (host, state) in self.hosts.iter().enumerate() {
            match &state.process {
                None => actions.push(Action::Boot { host }),
                Some(process) => {
                    for index in 0..state.in_flight.len() {
                        actions.push(Action::Execute { host, index });
                    }
                    if !state.completions.is_empty() {
                        actions.push(Action::Deliver { host });
                    }
                    for (timer, _) in process.timers() {
                        if self.may_fire(host, timer) {
                            actions.push(Action::Fire { host, timer });
                        }
                    }
                    if self.crashes_left > 0 {
                        actions.push(Action::Crash { host });
                    }
                }
            }
        }
        let idle = actions
            .iter()
            .all(|action| matches!(action, Action::Crash { .. }));
        if idle {
            // Time passes when nothing else can happen: a timeout that fires now is not
            // early, so its budget does not hold it back.
            for (host, state) in self.hosts.iter().enumerate() {
                let timers = state.process.iter().flat_map(|process| process.timers());
                for (timer, _) in timers {
                    if is_timeout(timer) && !self.may_fire(host, timer) {
                        actions.push(Action::Fire { host, timer });
                    }
                }
            }
        }
        if self.expiries_left > 0 && self.store.lease.is_some() {
            actions.push(Action::ExpireLease);
        }
        actions
    }

    /// Whether [`World::actions`] offers firing `timer` on `host` now.
    ///
    /// Every request carries a fresh id and the lifecycle's hash includes its id counter, so
    /// a timer that only makes the process ask the store a question it would answer as
    /// before leads to a state equal in all but ids: a new state each round, forever. Such
    /// fires are held back until the answer could differ, which loses no behaviour, since
    /// the timer stays armed and may fire at any later point:
    /// - a lease keep-alive succeeds (changes nothing) while the store says this controller
    ///   holds the lease; it is offered once the lease expired or passed to another;
    /// - a lease retry fails (changes nothing) while another controller holds the lease; it
    ///   is offered once the lease is free (or is this controller's own, left by a crash).
    ///
    /// A timeout ([`Timer::ControllersWait`], [`Timer::TrialReady`], [`Timer::LeaseDeadline`])
    /// is offered early, while other things can still happen, only while
    /// [`World::timeouts_left`] lasts; once nothing but a fault can happen it is offered
    /// whatever the budget (it is then late, not early). The periodic catalogue check is
    /// offered while its budget lasts.
    pub fn may_fire(&self, host: usize, timer: Timer) -> bool {
        let holder = self.store.lease.map(|(holder, _)| holder);
        let mine = holder.is_some() && holder == self.hosts[host].config.controller;
        match timer {
            Timer::LeaseKeepAlive => !mine,
            Timer::LeaseRetry => holder.is_none() || mine,
            Timer::ControllersWait | Timer::TrialReady | Timer::LeaseDeadline => {
                self.timeouts_left > 0
            }
            Timer::CatalogueCheck => self.catalogue_checks_left > 0,
            Timer::StepRetry | Timer::CatalogueRetry | Timer::StageRetry => true,
        }
    }

    /// Applies one action.
    pub fn apply(&mut self, action: Action) {
        match action {
            Action::Boot { host } => self.boot(host),
            Action::Execute { host, index } => {
                let (id, request) = self.hosts[host].in_flight.remove(index);
                self.execute(host, id, request);
            }
            Action::Deliver { host } => {
                let input = self.hosts[host].completions.remove(0);
                self.deliver(host, input);
            }
            Action::Fire { host, timer } => {
                match timer {
                    Timer::ControllersWait | Timer::TrialReady | Timer::LeaseDeadline => {
                        // A late fire (budget spent) costs nothing.
                        self.timeouts_left = self.timeouts_left.saturating_sub(1);
                    }
                    Timer::CatalogueCheck => {
                        self.catalogue_checks_left = self.catalogue_checks_left.saturating_sub(1);
                    }
                    _ => {}
                }
                let now = self.now;
                if let Some(process) = &mut self.hosts[host].process {
                    process.handle_timer(now, timer);
                }
                self.drain(host);
            }
            Action::Crash { host } => {
                self.crashes_left -= 1;
                self.stop(host);
            }
            Action::ExpireLease => {
                self.expiries_left -= 1;
                self.store.lease = None;
            }
        }
    }

    fn boot(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        assert!(state.process.is_none(), "host {host} is already running");
        state.restarting = false;
        let mut process = Lifecycle::new(
            state.config.clone(),
            Arc::clone(&self.registry),
            state.durable.clone(),
        )
        .expect("a valid host config");
        apply_mutations(&mut process, self.mutations);
        process.handle(self.now, Input::Start);
        state.process = Some(process);
        // Its agent reports the binary it runs as it starts (Juju's upgrader worker calls
        // `SetTools` first thing).
        self.store.reported[host] = Some(state.config.running.clone());
        self.drain(host);
    }

    fn stop(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        state.process = None;
        state.in_flight.clear();
        state.completions.clear();
        state.watching = false;
        state.gate_phase = Phase::Bootstrapping;
        state.status_message = None;
        state.status_phase = None;
        state.published = None;
    }

    /// Feeds an input to a host's process (dropped if it is down) and drains its outputs.
    pub fn deliver(&mut self, host: usize, input: Input) {
        let now = self.now;
        if let Some(process) = &mut self.hosts[host].process {
            process.handle(now, input);
        }
        self.drain(host);
    }

    fn drain(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        let Some(process) = &mut state.process else {
            return;
        };
        while let Some(output) = process.poll_output() {
            match output {
                Output::Request { id, request } => state.in_flight.push((id, request)),
                Output::Gate(view) => {
                    // One input makes at most one transition (statig), and the phase read
                    // here is the one after it: a Ready view in a drain whose process is
                    // not Ready was published outside Ready.
                    let phase = process.phase();
                    if view.phase == Phase::Ready && phase != Phase::Ready {
                        state.gate_breach.get_or_insert(phase);
                    }
                    state.gate_phase = view.phase;
                    let done = view.progress.done;
                    if let Some((phase, before)) = state.published
                        && phase == view.phase
                        && done < before
                    {
                        state.publication_fault.get_or_insert(format!(
                            "progress went back from {before} to {done} in {phase}"
                        ));
                    }
                    state.published = Some((view.phase, done));
                }
                Output::Status(report) => {
                    if let Some((phase, _)) = state.published
                        && phase != report.phase
                    {
                        state.publication_fault.get_or_insert(format!(
                            "status {:?} marked {} while the gate says {phase}",
                            report.message, report.phase
                        ));
                    }
                    if !report.message.is_empty() {
                        state.status_message = Some(report.message);
                        state.status_phase = Some(report.phase);
                    }
                }
            }
        }
    }

    fn controller_of(&self, host: usize) -> ControllerId {
        self.hosts[host]
            .config
            .controller
            .expect("store writes come from controllers")
    }

    fn execute(&mut self, host: usize, id: RequestId, request: Request) {
        let completion = match request {
            Request::PersistSnapshot(snapshot) => {
                self.hosts[host].durable = Some(snapshot);
                Some(Input::Done { id })
            }
            Request::LoadModel => Some(Input::ModelLoaded {
                id,
                model: self.store.model.clone(),
            }),
            Request::RefreshCapabilities => {
                self.store.capability_refreshes = self
                    .store
                    .capability_refreshes
                    .saturating_add(1)
                    .min(RUNS_SATURATE);
                Some(Input::Done { id })
            }
            Request::WatchRecord { .. } => {
                self.hosts[host].watching = true;
                Some(Input::RecordChanged(self.store.view()))
            }
            Request::CreateRecord(record) => {
                if self.store.record.is_some() {
                    Some(Input::RecordWritten {
                        id,
                        write: RecordWrite::Conflict(self.store.view()),
                    })
                } else {
                    let revision = self.store.bump();
                    self.store.record = Some((record, revision));
                    self.notify_watchers(host);
                    Some(Input::RecordWritten {
                        id,
                        write: RecordWrite::Written(self.store.view()),
                    })
                }
            }
            Request::UpdateRecord {
                expected,
                record,
                fence,
            } => {
                if !self.store.fence_holds(fence) {
                    Some(Input::RecordWritten {
                        id,
                        write: RecordWrite::Fenced,
                    })
                } else {
                    match self.store.record {
                        Some((current, revision)) if revision == expected => {
                            if !current.may_become(&record) {
                                self.store.invalid_record_writes = self
                                    .store
                                    .invalid_record_writes
                                    .saturating_add(1)
                                    .min(RUNS_SATURATE);
                            }
                            let revision = self.store.bump();
                            if record.status.is_final() {
                                self.store.record = None;
                                self.store.last_archived = Some(record);
                            } else {
                                self.store.record = Some((record, revision));
                            }
                            self.notify_watchers(host);
                            Some(Input::RecordWritten {
                                id,
                                write: RecordWrite::Written(self.store.view()),
                            })
                        }
                        _ => Some(Input::RecordWritten {
                            id,
                            write: RecordWrite::Conflict(self.store.view()),
                        }),
                    }
                }
            }
            Request::AcquireLease => {
                let me = self.controller_of(host);
                let lease = match self.store.lease {
                    None => {
                        let token = LeaseToken(self.store.next_token);
                        self.store.next_token += 1;
                        self.store.lease = Some((me, token));
                        Some(token)
                    }
                    Some((holder, token)) if holder == me => Some(token),
                    Some(_) => None,
                };
                Some(Input::LeaseAnswered { id, lease })
            }
            Request::KeepAliveLease(token) => {
                let me = self.controller_of(host);
                let lease = (self.store.lease == Some((me, token))).then_some(token);
                Some(Input::LeaseAnswered { id, lease })
            }
            Request::ReleaseLease(token) => {
                let me = self.controller_of(host);
                if self.store.lease == Some((me, token)) {
                    self.store.lease = None;
                }
                None
            }
            Request::RunStep { step, key, fence } => {
                let outcome = match self.registry.step(step).kind {
                    StepKind::Database => self.run_database_step(host, key, fence),
                    StepKind::Host => {
                        let runs = self.hosts[host].host_runs.entry(key).or_insert(0);
                        *runs = runs.saturating_add(1).min(RUNS_SATURATE);
                        StepOutcome::Applied
                    }
                };
                Some(Input::StepFinished { id, outcome })
            }
            Request::LookupCatalogue { .. } => Some(Input::CatalogueFound {
                id,
                result: Ok(self.catalogue.clone()),
            }),
            Request::DesiredBinary => {
                let running = &self.hosts[host].config.running;
                let desired = self.desired_version(host);
                let wanted = Binary {
                    number: desired,
                    release: running.release.clone(),
                    arch: running.arch.clone(),
                };
                let entry = self
                    .catalogue
                    .entry_for(&wanted, self.store.model.stream)
                    .cloned();
                entry.map(|entry| Input::DesiredBinary {
                    id,
                    plan: StagePlan {
                        binary: entry.binary,
                        size_bytes: entry.size_bytes,
                        sha256: entry.sha256,
                        source: StageSource::Controller,
                    },
                })
            }
            Request::SetAgentVersion(version) => {
                // The store adapter's rule, the core's one implementation: agent-version does
                // not change while an upgrade-info record is current (Juju's rule); the value
                // the model already holds is accepted back.
                let record = self.store.record.map(|(record, _)| record);
                match AgentVersionCheck::LIFECYCLE.check(
                    self.store.model.agent_version,
                    self.store.model.stream,
                    record.as_ref(),
                    version,
                    &[],
                ) {
                    Ok(_) => {
                        self.store.model.agent_version = version;
                        Some(Input::Done { id })
                    }
                    Err(AgentVersionRefusal::UpgradeInProgress { .. }) => {
                        Some(Input::AgentVersionRefused {
                            id,
                            agent_version: self.store.model.agent_version,
                            view: self.store.view(),
                        })
                    }
                    Err(refusal) => {
                        unreachable!("the lifecycle's write is refused only by a record: {refusal}")
                    }
                }
            }
            Request::ReportUpgradeAvailable(version) => {
                self.store.upgrade_available = version;
                Some(Input::Done { id })
            }
            Request::StageBinary(_) => Some(Input::Staged { id, result: Ok(()) }),
            Request::RestartInto(binary) => {
                self.stop(host);
                let state = &mut self.hosts[host];
                state.config.running = binary;
                state.restarting = true;
                None
            }
        };
        if let Some(input) = completion
            && self.hosts[host].process.is_some()
        {
            self.hosts[host].completions.push(input);
        }
    }

    /// The Upgrader's answer to `host`'s `DesiredBinary` (the core's controllers-first
    /// rule), from what the hosts reported ([`Store::reported`]). The API server answering
    /// is the first controller host (hosts list controllers first); a world without one
    /// serves from a server running the model's agent-version.
    fn desired_version(&self, host: usize) -> Version {
        let is_controller = |state: &Host| state.config.roles.contains(Role::Controller);
        let server_version = self
            .hosts
            .iter()
            .find(|state| is_controller(state))
            .map_or(self.store.model.agent_version, |state| {
                state.config.running.number
            });
        let controllers = self
            .hosts
            .iter()
            .zip(&self.store.reported)
            .filter(|(state, _)| is_controller(state))
            .map(|(_, reported)| reported.as_ref());
        upgrader::desired_version(
            self.store.model.agent_version,
            AskingAgent {
                roles: self.hosts[host].config.roles,
                reported: self.store.reported[host].as_ref(),
            },
            controllers,
            server_version,
        )
    }

    fn run_database_step(
        &mut self,
        host: usize,
        key: StepKey,
        fence: Option<LeaseToken>,
    ) -> StepOutcome {
        if !self.store.fence_holds(fence) {
            return StepOutcome::Fenced;
        }
        if self.store.database_checkpoints.contains(&key) {
            return StepOutcome::AlreadyApplied;
        }
        // The step's changes and its checkpoint commit in one transaction.
        let me = self.controller_of(host);
        if self.store.lease.map(|(holder, _)| holder) != Some(me) {
            self.store.unfenced_database_runs = self
                .store
                .unfenced_database_runs
                .saturating_add(1)
                .min(RUNS_SATURATE);
        }
        let runs = self.store.database_runs.entry(key).or_insert(0);
        *runs = runs.saturating_add(1).min(RUNS_SATURATE);
        self.store.database_checkpoints.insert(key);
        StepOutcome::Applied
    }

    fn notify_watchers(&mut self, _writer: usize) {
        let view = self.store.view();
        for state in &mut self.hosts {
            if state.watching && state.process.is_some() {
                state.completions.push(Input::RecordChanged(view));
            }
        }
    }

    /// Checks every safety invariant in the world as it is now.
    pub fn check(&self) -> Result<(), Violation> {
        if let Some((&key, _)) = self.store.database_runs.iter().find(|&(_, &runs)| runs > 1) {
            return Err(Violation::DatabaseStepTwice { key });
        }
        if self.store.unfenced_database_runs > 0 {
            return Err(Violation::UnfencedCoordinatorWrite);
        }
        if self.store.invalid_record_writes > 0 {
            return Err(Violation::InvalidRecordTransition);
        }
        for (index, host) in self.hosts.iter().enumerate() {
            if let Some(process) = &host.process
                && host.config.controller.is_some()
                && process.phase() == Phase::Ready
                && let Some(key) = self
                    .store
                    .database_checkpoints
                    .iter()
                    .find(|key| key.target_version > host.config.running.number)
            {
                return Err(Violation::OldBinaryOnMigratedStore {
                    host: index,
                    key: *key,
                });
            }
            if let Some(fault) = &host.publication_fault {
                return Err(Violation::PublishedOutOfStep {
                    host: index,
                    fault: fault.clone(),
                });
            }
            if let Some(phase) = host.gate_breach {
                return Err(Violation::GateOpenOutsideReady { host: index, phase });
            }
            if let Some(process) = &host.process
                && host.gate_phase == Phase::Ready
                && process.phase() != Phase::Ready
            {
                return Err(Violation::GateOpenOutsideReady {
                    host: index,
                    phase: process.phase(),
                });
            }
            let Some(durable) = &host.durable else {
                continue;
            };
            if let Some(key) = durable
                .host_checkpoints
                .iter()
                .find(|key| host.host_runs.get(key).copied().unwrap_or(0) == 0)
            {
                return Err(Violation::CheckpointWithoutEffects {
                    host: index,
                    key: *key,
                });
            }
            if let Some(key) = self.missing_step(index, durable.upgraded_to_version) {
                return Err(Violation::UpgradedToAheadOfSteps { host: index, key });
            }
            if let Some(process) = &host.process
                && process.phase() == Phase::Ready
                && durable.upgraded_to_version != host.config.running.number
                && process.snapshot().upgraded_to_version != host.config.running.number
            {
                return Err(Violation::ReadyBeforeSteps { host: index });
            }
        }
        Ok(())
    }

    /// A step planned for `host` up to `upgraded_to` that has not taken effect.
    fn missing_step(&self, host: usize, upgraded_to: Version) -> Option<StepKey> {
        let config = &self.hosts[host].config;
        let origin = self.hosts[host].origin;
        let plan = crate::steps::plan(
            &self.registry,
            origin,
            upgraded_to,
            config.roles,
            config.controller.is_some(),
        );
        plan.iter().find_map(|index| {
            let key = self.registry.key(index);
            let missing = match self.registry.step(index).kind {
                StepKind::Database => !self.store.database_checkpoints.contains(&key),
                StepKind::Host => self.hosts[host].host_runs.get(&key).copied().unwrap_or(0) == 0,
            };
            missing.then_some(key)
        })
    }

    /// An enabled action that an exhaustive search may take alone, ignoring every other
    /// action enabled now, without missing any reachable broken invariant, quiescent state or
    /// stuck state (a partial-order reduction: the action is a persistent set by itself).
    ///
    /// It is an action of a host `h` whose armed timers cannot fire before `h` itself acts
    /// (see [`World::timer_stays_unfired`]), and one of:
    /// 1. **Deliver to `h` when no request of `h` in flight touches `h`'s own state** (a
    ///    snapshot write, a host step, a restart). Delivering touches only `h`'s process,
    ///    queues and gate. Another host's action, or one of `h`'s store requests, can only
    ///    change the store and append to `h`'s queues, which commutes with taking the oldest
    ///    completion and feeding it to the process; a crash of `h` leaves the same state
    ///    whether or not the delivery came first (process, queues and gate are discarded;
    ///    the disk and the store were not touched; a gate breach the delivery records is
    ///    reported at once). A state skipped by delivering first, `s·w` for a path `w` of
    ///    such actions, agrees with `s` on everything of `h` that a check reads (process,
    ///    gate, disk, runs) and with the visited `s·deliver·w` on everything else, and every
    ///    invariant reads one host's own state plus the store; it is never quiescent or
    ///    stuck, since the delivery is still pending.
    /// 2. **Execute `h`'s only request when `h` has nothing else to do and does not watch
    ///    the record**, for requests whose execution reads nothing another host writes and
    ///    writes nothing any check reads: a catalogue lookup and a staging. Nobody else can
    ///    append to `h`'s completions (it does not watch) and `h` cannot act otherwise, so the
    ///    execution commutes with everything; a crash discards its effect.
    /// 3. The same for **persisting `h`'s snapshot**, when no crash is left (a crash before
    ///    the write is a different outcome than after it). The write is visible only to the
    ///    invariants of `h` (I5, I6, I7): on a skipped state `s·w`, `h`'s disk and runs are
    ///    as in `s`, except that the store's database checkpoints may have grown, and they
    ///    only grow, which can only satisfy I6 further.
    ///
    /// Acyclicity, which such reductions need, holds: every action consumes a fault budget,
    /// a request, a completion or an armed timer, or issues a request with a fresh id.
    pub fn local_action(&self) -> Option<Action> {
        for (host, state) in self.hosts.iter().enumerate() {
            let Some(process) = &state.process else {
                continue;
            };
            if !process
                .timers()
                .all(|(timer, _)| self.timer_stays_unfired(host, timer))
            {
                continue;
            }
            let touches_host = |request: &Request| match request {
                Request::PersistSnapshot(_) | Request::RestartInto(_) => true,
                Request::RunStep { step, .. } => self.registry.step(*step).kind == StepKind::Host,
                _ => false,
            };
            if !state.completions.is_empty()
                && !state
                    .in_flight
                    .iter()
                    .any(|(_, request)| touches_host(request))
            {
                return Some(Action::Deliver { host });
            }
            if !state.completions.is_empty() || state.watching {
                continue;
            }
            if let [(_, request)] = state.in_flight.as_slice() {
                let alone = match request {
                    Request::LookupCatalogue { .. } | Request::StageBinary(_) => true,
                    Request::PersistSnapshot(_) => self.crashes_left == 0,
                    _ => false,
                };
                if alone {
                    return Some(Action::Execute { host, index: 0 });
                }
            }
        }
        None
    }

    /// True when firing `timer` on `host` is not offered now and no other host's action,
    /// nor any fault, can make it offered while `host` has something else to do: only
    /// `host`'s own process could. (A spent timeout is offered late only when nothing but
    /// faults can happen anywhere, so never while `host` has an action of its own.)
    pub fn timer_stays_unfired(&self, host: usize, timer: Timer) -> bool {
        let holder = self.store.lease.map(|(holder, _)| holder);
        let mine = holder.is_some() && holder == self.hosts[host].config.controller;
        match timer {
            Timer::ControllersWait | Timer::TrialReady | Timer::LeaseDeadline => {
                self.timeouts_left == 0
            }
            Timer::CatalogueCheck => self.catalogue_checks_left == 0,
            // Nobody else can take a lease this controller holds; only expiry frees it.
            Timer::LeaseKeepAlive => mine && self.expiries_left == 0,
            Timer::LeaseRetry | Timer::StepRetry | Timer::CatalogueRetry | Timer::StageRetry => {
                false
            }
        }
    }

    /// True when nothing but faults could happen: no request, completion or timer is left
    /// (timers of a Ready agent's periodic check excepted).
    pub fn is_quiescent(&self) -> bool {
        self.hosts.iter().all(|host| match &host.process {
            None => false,
            Some(process) => {
                host.in_flight.is_empty()
                    && host.completions.is_empty()
                    && process
                        .timers()
                        .all(|(timer, _)| timer == Timer::CatalogueCheck)
            }
        })
    }

    /// Runs the world with a fixed schedule (boot, execute, deliver in order; timers only
    /// when nothing else is left) until quiescent or `steps_max` actions were taken.
    /// Returns the number of actions taken.
    pub fn run_in_order(&mut self, steps_max: usize) -> usize {
        for taken in 0..steps_max {
            let action = self.next_in_order();
            match action {
                Some(action) => self.apply(action),
                None => return taken,
            }
        }
        steps_max
    }

    fn next_in_order(&mut self) -> Option<Action> {
        for (host, state) in self.hosts.iter().enumerate() {
            if state.process.is_none() {
                return Some(Action::Boot { host });
            }
            if !state.completions.is_empty() {
                return Some(Action::Deliver { host });
            }
            if !state.in_flight.is_empty() {
                return Some(Action::Execute { host, index: 0 });
            }
        }
        // Nothing but timers: advance time to the earliest non-periodic deadline.
        let earliest = self
            .hosts
            .iter()
            .enumerate()
            .filter_map(|(host, state)| {
                let process = state.process.as_ref()?;
                process
                    .timers()
                    .filter(|(timer, _)| *timer != Timer::CatalogueCheck)
                    .map(|(timer, at)| (at, host, timer))
                    .min()
            })
            .min()?;
        let (at, host, timer) = earliest;
        self.now = self.now.max(at);
        Some(Action::Fire { host, timer })
    }

    /// Advances the world's clock.
    pub fn advance(&mut self, by: Millis) {
        self.now = self.now + by;
    }
}

#[cfg(feature = "mutations")]
fn apply_mutations(process: &mut Lifecycle, mutations: Mutations) {
    if mutations != Mutations::default() {
        process.set_mutations(mutations);
    }
}

#[cfg(not(feature = "mutations"))]
fn apply_mutations(_process: &mut Lifecycle, mutations: Mutations) {
    assert_eq!(
        mutations,
        Mutations::default(),
        "planted defects need the `mutations` feature"
    );
}

/// Controllers `0..count` as a set.
pub fn controllers(count: u8) -> ControllerSet {
    ControllerSet::first(count)
}
