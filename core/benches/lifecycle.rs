//! Nanoseconds per input of the lifecycle, beside a hand-written `match` machine that makes
//! the same outputs from the same inputs.
//!
//! The input sequence is recorded once from the in-memory world: one controller upgraded-to
//! 2.9.42 starts on 2.9.44 and goes Bootstrapping → RunningSteps (two database steps under
//! the lease, two host steps, each checkpointed) → Ready, its catalogue lookup made from
//! there (on the model's agent-version the version check could only stay) ("boot"),
//! then a steady Ready mix ("steady"): `handle_timeout` with nothing due, stale completions,
//! record-watch events, `AgentVersionChanged` to the running version, and every 1000th input
//! the 6-hourly catalogue check with its answer.
//!
//! The baseline (`Baseline`) is what one would write by hand for that path: an enum of
//! phases, a pending-request id checked on every completion, the plan computed once, the
//! same `Output` values pushed into a preallocated `VecDeque`, the same policy function for
//! the catalogue decision. Before timing, both are run over the sequence and their outputs
//! compared: they must be equal, output for output, so both do the same work.
//!
//! Each round replays the boot into 2000 fresh machines and the steady mix into 50 clones
//! of a Ready machine; for each mix the two machines are timed back to back, lockstep and
//! baseline alternating first. Machines and input copies are prepared outside the timed
//! region, in batches small enough that the inputs are in cache when replayed (as a
//! driver's freshly decoded inputs would be); dropping inputs and outputs is timed, for
//! both. The report gives each machine's median over the rounds and their ratio, then the
//! median of the rounds' own ratios (each lockstep time over the baseline time measured
//! beside it) and their range: on a shared machine the load changes between rounds, which
//! moves the medians apart more than a round's pair.
//! Run: `cargo bench -p lockstep-core --bench lifecycle`.
//!
//! `LOCKSTEP_BENCH_QUICK=1` (anything but `0`) runs one short round (a tenth of the boots,
//! five Ready copies): the same recording, the same output comparison, the same code paths,
//! in seconds. CI runs it so that a bench whose baseline no longer matches the lifecycle
//! fails.
#![allow(
    clippy::print_stdout,
    reason = "a bench binary reports its figures on stdout"
)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use lockstep_core::gate::GateView;
use lockstep_core::lifecycle::{
    Config, Input, LeaseToken, Lifecycle, ModelView, OUTPUTS_MAX, Output, RecordView, RecordWrite,
    Request, RequestId, Revision, Snapshot, StatusReport, StepOutcome, Timer, UpgradeInfo,
    UpgradeStatus,
};
use lockstep_core::policy::{self, Decision, Occasion, SelectionRequest, Stream};
use lockstep_core::steps::{self, StepIndex, StepRegistry};
use lockstep_core::testkit::Action;
use lockstep_core::{Millis, Phase, Progress, Timestamp};
use support::*;

/// Boot sequences replayed per round (a boot is short: its time is summed over these).
const BOOTS_PER_ROUND: usize = 2_000;
/// Boots timed together (their inputs, ~450 KiB, stay in cache).
const BOOTS_PER_BATCH: usize = 100;
/// Inputs of the recorded steady Ready mix (~2 MiB of inputs: they stay in cache).
const STEADY_INPUTS: u64 = 10_000;
/// Ready machines, each replaying the steady mix, per round.
const STEADY_COPIES: usize = 50;
/// The catalogue check runs every this many steady inputs.
const CHECK_EVERY: u64 = 1_000;
const ROUNDS: usize = 31;

/// How much work a run does: the full run, or `LOCKSTEP_BENCH_QUICK=1`'s one short round.
#[derive(Clone, Copy, Debug)]
struct Size {
    quick: bool,
    rounds: usize,
    boots_per_round: usize,
    steady_copies: usize,
}

impl Size {
    fn from_environment() -> Size {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        if quick {
            Size {
                quick,
                rounds: 1,
                boots_per_round: BOOTS_PER_ROUND / 10,
                steady_copies: 5,
            }
        } else {
            Size {
                quick,
                rounds: ROUNDS,
                boots_per_round: BOOTS_PER_ROUND,
                steady_copies: STEADY_COPIES,
            }
        }
    }
}

/// One call into a machine.
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "the recorded inputs are replayed as they are; boxing would measure allocations"
)]
enum Call {
    Handle(Timestamp, Input),
    Timeout(Timestamp),
}

/// What both machines offer the replay loop.
trait Machine {
    fn call(&mut self, call: Call);
    fn poll_output(&mut self) -> Option<Output>;
}

impl Machine for Lifecycle {
    fn call(&mut self, call: Call) {
        match call {
            Call::Handle(now, input) => self.handle(now, input),
            Call::Timeout(now) => self.handle_timeout(now),
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        Lifecycle::poll_output(self)
    }
}

/// The mixes, as a `replay` parameter.
const BOOT: usize = 0;
const STEADY: usize = 1;

/// The timed work. Never inlined, and one instance per machine and mix, so that a profiler
/// counts each apart: `valgrind --tool=callgrind --demangle=no` with
/// `LOCKSTEP_BENCH_QUICK=1`, then `callgrind_annotate --inclusive=yes` lists four
/// `lifecycle6replay` symbols (the boot ones called 200 times, the steady ones 5 times).
#[inline(never)]
fn replay<M: Machine, const MIX: usize>(machine: &mut M, calls: Vec<Call>) {
    // Keeps the instances apart: identical bodies would be folded into one symbol.
    black_box(MIX);
    for call in calls {
        machine.call(call);
        while let Some(output) = machine.poll_output() {
            black_box(output);
        }
    }
}

fn collect<M: Machine>(machine: &mut M, calls: &[Call]) -> Vec<Output> {
    let mut outputs = Vec::new();
    for call in calls {
        machine.call(call.clone());
        while let Some(output) = machine.poll_output() {
            outputs.push(output);
        }
    }
    outputs
}

// ------------------------------------------------------------------------- recording

struct Recording {
    config: Config,
    registry: Arc<StepRegistry>,
    snapshot: Snapshot,
    boot: Vec<Call>,
    steady: Vec<Call>,
}

fn record() -> Recording {
    let registry = registry();
    let spec = controllers_upgrading(1, V42, V44, Arc::clone(&registry));
    let config = spec.hosts[0].clone();
    let snapshot = spec.snapshots[0].clone().expect("upgrading from 2.9.42");
    let mut world = world(spec);
    // The world's in-order schedule, with host 0's inputs written down as they go in.
    let mut boot = Vec::new();
    loop {
        let state = &world.hosts[0];
        let action = match &state.process {
            None => {
                assert!(boot.is_empty(), "one process lifetime");
                boot.push(Call::Handle(world.now, Input::Start));
                Action::Boot { host: 0 }
            }
            Some(_) if !state.completions.is_empty() => {
                boot.push(Call::Handle(world.now, state.completions[0].clone()));
                Action::Deliver { host: 0 }
            }
            Some(_) if !state.in_flight.is_empty() => Action::Execute { host: 0, index: 0 },
            Some(process) => {
                let timers: Vec<_> = process.timers().map(|(timer, _)| timer).collect();
                assert_eq!(
                    timers,
                    [Timer::CatalogueCheck],
                    "only the periodic check left"
                );
                break;
            }
        };
        world.apply(action);
    }
    world.check().expect("no invariant broken");
    let mut live = world.hosts[0].process.take().expect("running");
    assert_eq!(live.phase(), Phase::Ready);

    // The steady mix, generated against the live process so the check's ids are real.
    let running = config.running.number;
    let stale = RequestId(999_999);
    let archived = RecordView {
        current: None,
        last_archived: Some(UpgradeInfo {
            previous_version: V42,
            target_version: V44,
            status: UpgradeStatus::Complete,
            controllers_ready: lockstep_core::lifecycle::ControllerSet::first(1),
            controllers_done: lockstep_core::lifecycle::ControllerSet::first(1),
        }),
        revision: Revision(5),
    };
    let answer = catalogue(&[V42, V43, V44]);
    let mut steady = Vec::new();
    let mut now = world.now;
    let push = |live: &mut Lifecycle, call: Call, steady: &mut Vec<Call>| {
        live.call(call.clone());
        steady.push(call);
        let mut asked = None;
        while let Some(output) = live.poll_output() {
            match output {
                Output::Request {
                    id,
                    request: Request::LookupCatalogue { .. },
                } => asked = Some(id),
                other => panic!("a steady input made {other:?}"),
            }
        }
        asked
    };
    for index in 0..STEADY_INPUTS / 2 {
        let due = live.poll_timeout().expect("the check is armed");
        now = if index % (CHECK_EVERY / 2) == CHECK_EVERY / 2 - 1 {
            due
        } else {
            now + Millis(1)
        };
        if let Some(id) = push(&mut live, Call::Timeout(now), &mut steady) {
            let found = Input::CatalogueFound {
                id,
                result: Ok(answer.clone()),
            };
            push(&mut live, Call::Handle(now, found), &mut steady);
            continue;
        }
        let input = match index % 6 {
            0 => Input::Done { id: stale },
            1 => Input::StepFinished {
                id: stale,
                outcome: StepOutcome::Applied,
            },
            2 => Input::RecordChanged(archived),
            3 => Input::AgentVersionChanged(running),
            4 => Input::RecordWritten {
                id: stale,
                write: RecordWrite::Fenced,
            },
            _ => Input::LeaseAnswered {
                id: stale,
                lease: None,
            },
        };
        push(&mut live, Call::Handle(now, input), &mut steady);
    }
    assert_eq!(live.phase(), Phase::Ready);
    Recording {
        config,
        registry,
        snapshot,
        boot,
        steady,
    }
}

// ------------------------------------------------------------------------- baseline

/// The phases of the recorded path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BasePhase {
    Bootstrapping,
    RunningSteps,
    Ready,
}

/// What the one main request in flight is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BasePending {
    PersistBoot,
    LoadModel,
    RecordWrite,
    DatabaseStep,
    HostStep(StepIndex),
    PersistCheckpoint,
    Capabilities,
    PersistUpgradedTo,
    Catalogue,
}

/// A hand-written machine for one controller's upgrade path and its Ready state.
#[derive(Clone, Debug)]
struct Baseline {
    phase: BasePhase,
    config: Config,
    registry: Arc<StepRegistry>,
    snapshot: Snapshot,
    model: Option<ModelView>,
    pending: Option<(RequestId, BasePending)>,
    next_request: u64,
    now: Timestamp,
    outputs: VecDeque<Output>,
    gate: GateView,
    // RunningSteps
    database: Vec<StepIndex>,
    host: Vec<StepIndex>,
    database_next: usize,
    host_next: usize,
    record: RecordView,
    watching: bool,
    lease_asking: Option<RequestId>,
    lease: Option<LeaseToken>,
    keepalive_at: Option<Timestamp>,
    finishing: bool,
    // Ready
    check_at: Option<Timestamp>,
    upgrade_available: Option<lockstep_core::Version>,
}

impl Baseline {
    fn new(config: Config, registry: Arc<StepRegistry>, snapshot: Snapshot) -> Baseline {
        let retry_after = config.limits.retry_after;
        Baseline {
            phase: BasePhase::Bootstrapping,
            config,
            registry,
            snapshot,
            model: None,
            pending: None,
            next_request: 1,
            now: Timestamp::ZERO,
            outputs: VecDeque::with_capacity(OUTPUTS_MAX),
            gate: GateView {
                phase: Phase::Bootstrapping,
                progress: Progress::default(),
                retry_after,
            },
            database: Vec::new(),
            host: Vec::new(),
            database_next: 0,
            host_next: 0,
            record: RecordView::default(),
            watching: false,
            lease_asking: None,
            lease: None,
            keepalive_at: None,
            finishing: false,
            check_at: None,
            upgrade_available: None,
        }
    }

    fn next_id(&mut self) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        id
    }

    fn request(&mut self, pending: BasePending, request: Request) {
        assert!(self.pending.is_none());
        let id = self.next_id();
        self.pending = Some((id, pending));
        self.outputs.push_back(Output::Request { id, request });
    }

    fn request_aside(&mut self, request: Request) -> RequestId {
        let id = self.next_id();
        self.outputs.push_back(Output::Request { id, request });
        id
    }

    /// True (and clears it) when `id` completes the request of this kind.
    fn completes(&mut self, id: RequestId, kind: BasePending) -> bool {
        if self.pending == Some((id, kind)) {
            self.pending = None;
            return true;
        }
        false
    }

    fn enter(&mut self, phase: BasePhase, public: Phase, progress: Progress) {
        self.phase = phase;
        self.gate.phase = public;
        self.gate.progress = progress;
        self.outputs.push_back(Output::Gate(self.gate));
        self.outputs.push_back(Output::Status(StatusReport {
            phase: public,
            progress,
            message: String::new(),
        }));
    }

    fn set_progress(&mut self, done: u32) {
        if self.gate.progress.done != done {
            self.gate.progress.done = done;
            self.outputs.push_back(Output::Gate(self.gate));
        }
    }

    fn me(&self) -> lockstep_core::lifecycle::ControllerId {
        self.config.controller.expect("a controller")
    }

    fn handle(&mut self, now: Timestamp, input: Input) {
        self.now = self.now.max(now);
        match (self.phase, input) {
            (BasePhase::Bootstrapping, Input::Start) if self.pending.is_none() => {
                let snapshot = self.snapshot.clone();
                self.request(BasePending::PersistBoot, Request::PersistSnapshot(snapshot));
            }
            (BasePhase::Bootstrapping, Input::Done { id })
                if self.completes(id, BasePending::PersistBoot) =>
            {
                self.request(BasePending::LoadModel, Request::LoadModel);
            }
            (BasePhase::Bootstrapping, Input::ModelLoaded { id, model })
                if self.completes(id, BasePending::LoadModel) =>
            {
                self.model = Some(model);
                let (from, to, roles) = (
                    self.snapshot.upgraded_to_version,
                    self.config.running.number,
                    self.config.roles,
                );
                let plan = steps::plan(&self.registry, from, to, roles, true);
                self.database = plan.database().to_vec();
                self.host = plan.host().to_vec();
                // The lifecycle publishes a phase's gate before its entry makes requests.
                let progress = Progress {
                    done: 0,
                    total: (self.database.len() + self.host.len()) as u32,
                    target: Some(to),
                };
                self.enter(BasePhase::RunningSteps, Phase::RunningSteps, progress);
                self.watching = true;
                self.request_aside(Request::WatchRecord { after: Revision(0) });
            }
            (BasePhase::RunningSteps, Input::RecordChanged(view)) => {
                if view.revision >= self.record.revision {
                    self.record = view;
                }
                self.reconcile();
            }
            (BasePhase::RunningSteps, Input::RecordWritten { id, write })
                if self.completes(id, BasePending::RecordWrite) =>
            {
                if let RecordWrite::Written(view) | RecordWrite::Conflict(view) = write
                    && view.revision >= self.record.revision
                {
                    self.record = view;
                }
                self.reconcile();
            }
            (BasePhase::RunningSteps, Input::LeaseAnswered { id, lease })
                if self.lease_asking == Some(id) =>
            {
                self.lease_asking = None;
                self.lease = lease;
                let interval = self.config.limits.lease_keepalive_interval;
                self.keepalive_at = lease.map(|_| self.now + interval);
                self.reconcile();
            }
            (BasePhase::RunningSteps, Input::StepFinished { id, outcome }) => {
                match (self.pending, outcome) {
                    (
                        Some((pending, BasePending::DatabaseStep)),
                        StepOutcome::Applied | StepOutcome::AlreadyApplied,
                    ) if pending == id => {
                        self.pending = None;
                        self.database_next += 1;
                    }
                    (
                        Some((pending, BasePending::HostStep(index))),
                        StepOutcome::Applied | StepOutcome::AlreadyApplied,
                    ) if pending == id => {
                        self.pending = None;
                        self.snapshot
                            .host_checkpoints
                            .push(self.registry.key(index));
                        self.host_next += 1;
                        let snapshot = self.snapshot.clone();
                        self.request(
                            BasePending::PersistCheckpoint,
                            Request::PersistSnapshot(snapshot),
                        );
                    }
                    _ => return, // stale, or a failure this path does not take
                }
                self.reconcile();
            }
            (BasePhase::RunningSteps, Input::Done { id }) => {
                if self.completes(id, BasePending::PersistCheckpoint) {
                    self.reconcile();
                } else if self.completes(id, BasePending::Capabilities) {
                    self.snapshot.upgraded_to_version = self.config.running.number;
                    self.snapshot.host_checkpoints.clear();
                    let snapshot = self.snapshot.clone();
                    self.request(
                        BasePending::PersistUpgradedTo,
                        Request::PersistSnapshot(snapshot),
                    );
                } else if self.completes(id, BasePending::PersistUpgradedTo) {
                    // On the model's agent-version after bootstrap, the version check could
                    // only stay: Ready at once, and the lookup it owes made from there.
                    self.keepalive_at = None;
                    let stream = self.model.as_ref().and_then(|model| model.stream);
                    let streams = Stream::preferred(stream, &self.config.running.number);
                    let interval = self.config.limits.catalogue_check_interval;
                    self.check_at = Some(self.now + interval);
                    self.enter(BasePhase::Ready, Phase::Ready, Progress::default());
                    self.request(BasePending::Catalogue, Request::LookupCatalogue { streams });
                }
            }
            (BasePhase::Ready, Input::CatalogueFound { id, result })
                if self.completes(id, BasePending::Catalogue) =>
            {
                let Ok(catalogue) = result else {
                    return; // not on the recorded path
                };
                let model = self.model.as_ref().expect("loaded");
                let decision = policy::select(
                    &SelectionRequest {
                        running: &self.config.running,
                        policy: &model.policy,
                        stream: model.stream,
                        occasion: Occasion::Periodic,
                    },
                    &catalogue,
                );
                let Ok(Decision::Stay { upgrade_available }) = decision else {
                    panic!("the recorded path stays: {decision:?}");
                };
                assert_eq!(upgrade_available, self.upgrade_available, "recorded path");
            }
            (BasePhase::Ready, Input::AgentVersionChanged(version))
                if version != self.config.running.number =>
            {
                unreachable!("the recorded path keeps its version")
            }
            _ => {} // stale completions and events this phase ignores
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.now = self.now.max(now);
        if self.keepalive_at.is_some_and(|at| at <= now) {
            unreachable!("the recorded path never fires the keep-alive");
        }
        if self.phase == BasePhase::Ready && self.check_at.is_some_and(|at| at <= now) {
            let interval = self.config.limits.catalogue_check_interval;
            self.check_at = Some(self.now + interval);
            if self.pending.is_none() {
                let stream = self.model.as_ref().and_then(|model| model.stream);
                let streams = Stream::preferred(stream, &self.config.running.number);
                self.request(BasePending::Catalogue, Request::LookupCatalogue { streams });
            }
        }
    }

    /// The next RunningSteps request, from what is known now.
    fn reconcile(&mut self) {
        if self.pending.is_some() || self.finishing || !self.watching {
            return;
        }
        let me = self.me();
        let (from, to) = (
            self.snapshot.upgraded_to_version,
            self.config.running.number,
        );
        let Some((record, revision)) = self.record.current else {
            let done = self.record.last_archived.is_some_and(|last| {
                last.describes(from, to)
                    && last.status == UpgradeStatus::Complete
                    && last.controllers_done.contains(me)
            });
            if done {
                self.finishing = true;
                if let Some(token) = self.lease.take() {
                    self.keepalive_at = None;
                    self.request_aside(Request::ReleaseLease(token));
                }
                self.request(BasePending::Capabilities, Request::RefreshCapabilities);
                return;
            }
            // Created with nobody ready; this controller registers by compare-and-set.
            let created = UpgradeInfo {
                previous_version: from,
                target_version: to,
                status: UpgradeStatus::Pending,
                controllers_ready: lockstep_core::lifecycle::ControllerSet::EMPTY,
                controllers_done: lockstep_core::lifecycle::ControllerSet::EMPTY,
            };
            self.request(BasePending::RecordWrite, Request::CreateRecord(created));
            return;
        };
        match record.status {
            UpgradeStatus::Pending if !record.controllers_ready.contains(me) => {
                let next = UpgradeInfo {
                    controllers_ready: record.controllers_ready.with(me),
                    ..record
                };
                self.update(revision, next, None);
            }
            UpgradeStatus::Pending => {
                let Some(token) = self.lease else {
                    if self.lease_asking.is_none() {
                        self.lease_asking = Some(self.request_aside(Request::AcquireLease));
                    }
                    return;
                };
                self.set_progress(self.database_next as u32);
                if let Some(&index) = self.database.get(self.database_next) {
                    let key = self.registry.key(index);
                    let step = Request::RunStep {
                        step: index,
                        key,
                        fence: Some(token),
                    };
                    self.request(BasePending::DatabaseStep, step);
                    return;
                }
                let next = UpgradeInfo {
                    status: UpgradeStatus::DbComplete,
                    ..record
                };
                self.update(revision, next, Some(token));
            }
            UpgradeStatus::DbComplete => {
                let next = UpgradeInfo {
                    status: UpgradeStatus::Running,
                    ..record
                };
                self.update(revision, next, None);
            }
            UpgradeStatus::Running => {
                self.set_progress((self.database.len() + self.host_next) as u32);
                if let Some(&index) = self.host.get(self.host_next) {
                    let key = self.registry.key(index);
                    let step = Request::RunStep {
                        step: index,
                        key,
                        fence: None,
                    };
                    self.request(BasePending::HostStep(index), step);
                    return;
                }
                let next = UpgradeInfo {
                    controllers_done: record.controllers_done.with(me),
                    status: UpgradeStatus::Complete,
                    ..record
                };
                self.update(revision, next, None);
            }
            UpgradeStatus::Complete | UpgradeStatus::Aborted => {
                unreachable!("a final record is archived")
            }
        }
    }

    fn update(&mut self, expected: Revision, record: UpgradeInfo, fence: Option<LeaseToken>) {
        let request = Request::UpdateRecord {
            expected,
            record,
            fence,
        };
        self.request(BasePending::RecordWrite, request);
    }
}

impl Machine for Baseline {
    fn call(&mut self, call: Call) {
        match call {
            Call::Handle(now, input) => self.handle(now, input),
            Call::Timeout(now) => self.handle_timeout(now),
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }
}

// ------------------------------------------------------------------------- timing

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Nanoseconds per call of replaying `calls` into `copies` machines made by `make`, timed
/// in batches of `batch`: each batch's machines and input copies are prepared just before
/// it runs, so the inputs are in cache, as a driver's freshly decoded inputs would be.
fn time_replays<M: Machine, const MIX: usize>(
    make: impl Fn() -> M,
    calls: &[Call],
    copies: usize,
    batch: usize,
) -> f64 {
    let mut elapsed = std::time::Duration::ZERO;
    for _ in 0..copies / batch {
        let mut prepared: Vec<(M, Vec<Call>)> =
            (0..batch).map(|_| (make(), calls.to_vec())).collect();
        let start = Instant::now();
        for (machine, calls) in &mut prepared {
            replay::<M, MIX>(machine, std::mem::take(calls));
        }
        elapsed += start.elapsed();
        black_box(&prepared);
    }
    elapsed.as_nanos() as f64 / ((copies / batch * batch) * calls.len()) as f64
}

fn main() {
    let recording = record();
    let Recording {
        config,
        registry,
        snapshot,
        boot,
        steady,
    } = &recording;
    let new_lifecycle = || {
        Lifecycle::new(config.clone(), Arc::clone(registry), Some(snapshot.clone())).expect("valid")
    };
    let new_baseline = || Baseline::new(config.clone(), Arc::clone(registry), snapshot.clone());

    // Both machines must make the same outputs from the same inputs.
    let mut lifecycle = new_lifecycle();
    let mut baseline = new_baseline();
    let lifecycle_boot = collect(&mut lifecycle, boot);
    let baseline_boot = collect(&mut baseline, boot);
    assert_eq!(lifecycle_boot, baseline_boot, "boot outputs differ");
    assert_eq!(lifecycle.phase(), Phase::Ready);
    let (ready_lifecycle, ready_baseline) = (lifecycle.clone(), baseline.clone());
    assert_eq!(
        collect(&mut lifecycle, steady),
        collect(&mut baseline, steady),
        "steady outputs differ"
    );

    let size = Size::from_environment();
    // samples[mix][machine][round]; each mix's two machines are timed back to back, the
    // order alternating by round, so a round's pair saw the same machine load.
    let mut samples = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for round in 0..size.rounds {
        let (boots, copies) = (size.boots_per_round, size.steady_copies);
        for which in [round % 2, 1 - round % 2] {
            samples[0][which].push(if which == 0 {
                time_replays::<_, BOOT>(new_lifecycle, boot, boots, BOOTS_PER_BATCH)
            } else {
                time_replays::<_, BOOT>(new_baseline, boot, boots, BOOTS_PER_BATCH)
            });
        }
        for which in [round % 2, 1 - round % 2] {
            samples[1][which].push(if which == 0 {
                time_replays::<_, STEADY>(|| ready_lifecycle.clone(), steady, copies, 1)
            } else {
                time_replays::<_, STEADY>(|| ready_baseline.clone(), steady, copies, 1)
            });
        }
    }

    println!(
        "lockstep-core lifecycle bench{}: {} rounds, median ns per input (boot: {} inputs x {} per round; steady: {} inputs x {} per round)",
        if size.quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        },
        size.rounds,
        boot.len(),
        size.boots_per_round,
        steady.len(),
        size.steady_copies
    );
    println!(
        "{:<8} {:>14} {:>14} {:>8} {:>14} {:>14}",
        "mix", "lockstep ns", "baseline ns", "ratio", "round ratio", "rounds' range"
    );
    for (name, [lockstep, baseline]) in ["boot", "steady"].into_iter().zip(samples) {
        // The ratio of the medians, and the median of each round's ratio (lockstep over
        // the baseline timed beside it), which a load that changes between rounds moves
        // less.
        let mut ratios: Vec<f64> = lockstep.iter().zip(&baseline).map(|(l, b)| l / b).collect();
        ratios.sort_by(f64::total_cmp);
        let range = format!("{:.2}-{:.2}", ratios[0], ratios[ratios.len() - 1]);
        let round_ratio = median(ratios);
        let (lockstep, baseline) = (median(lockstep), median(baseline));
        println!(
            "{name:<8} {lockstep:>14.1} {baseline:>14.1} {:>8.2} {round_ratio:>14.2} {range:>14}",
            lockstep / baseline
        );
    }
}
