//! The code against `spec/transitions.json`: for every phase and input kind, the core does
//! what the table says, the table has no gaps, and every entry the table does not mark
//! "ignored" (and every next phase it lists) is exercised.
//!
//! Worlds of one to three controllers are driven by seeded schedules that mix the world's
//! own actions (boot, execute, deliver, timers, crashes, lease expiry) with what a world
//! alone never produces: failed steps, failed staging, failed catalogue lookups, operator
//! retries and aborts, upgrade requests, and stale completions.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use lockstep_core::Phase;
use lockstep_core::Version;
use lockstep_core::lifecycle::{
    ControllerId, ControllerSet, Input, InputKind, ModelView, OperatorAction, RecordView,
    RecordWrite, Request, RequestId, Revision, StagePlan, StageSource, StepOutcome, Timer, Trial,
    UpgradeInfo, UpgradeStatus, request_name,
};
use lockstep_core::policy::Sha256;
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::testkit::{Action, World, WorldSpec};
use serde_json::Value;
use support::*;

const TABLE: &str = include_str!("../../spec/transitions.json");

#[derive(Debug)]
enum Entry {
    Ignored,
    /// The phase stays and no request is made, but the input's value is kept for later
    /// (the model's agent-version news, acted on in Ready).
    Remembered,
    Allowed {
        next: BTreeSet<String>,
        requests: BTreeSet<String>,
    },
}

fn table() -> BTreeMap<(String, String), Entry> {
    let json: Value = serde_json::from_str(TABLE).expect("spec/transitions.json parses");
    let phases: Vec<String> = serde_json::from_value(json["phases"].clone()).unwrap();
    let inputs: Vec<String> = serde_json::from_value(json["inputs"].clone()).unwrap();
    let mut table = BTreeMap::new();
    for phase in &phases {
        for input in &inputs {
            let cell = &json["transitions"][phase][input];
            let entry = match cell {
                Value::String(text) if text == "ignored" => Entry::Ignored,
                Value::String(text) if text == "remembered" => Entry::Remembered,
                Value::Object(_) => {
                    let list = |field: &str| -> BTreeSet<String> {
                        serde_json::from_value(cell[field].clone())
                            .unwrap_or_else(|_| panic!("{phase} × {input}: `{field}` is a list"))
                    };
                    Entry::Allowed {
                        next: list("next"),
                        requests: list("requests"),
                    }
                }
                other => {
                    panic!("spec/transitions.json has no entry for {phase} × {input}: {other}")
                }
            };
            table.insert((phase.clone(), input.clone()), entry);
        }
    }
    table
}

fn input_name(kind: InputKind) -> String {
    format!("{kind:?}")
}

#[test]
fn the_table_names_every_phase_and_input_kind() {
    let table = table();
    let phases: BTreeSet<&str> = table.keys().map(|(phase, _)| phase.as_str()).collect();
    let code: BTreeSet<&str> = Phase::LIFECYCLE
        .iter()
        .map(|phase| phase.as_str())
        .collect();
    assert_eq!(phases, code, "phases of the table and the code");
    assert_eq!(
        table.len(),
        Phase::LIFECYCLE.len() * 15,
        "15 input kinds per phase"
    );
    for ((phase, input), entry) in &table {
        if let Entry::Allowed { next, .. } = entry {
            assert!(
                next.contains(phase),
                "{phase} × {input}: a stale completion keeps the phase, so next must list it"
            );
        }
    }
}

/// One observation: a phase, an input kind, the phase after, the requests made.
type Seen = BTreeMap<(String, String), BTreeSet<String>>;

/// How a driver chooses its next step.
#[derive(Clone, Copy)]
enum Schedule {
    /// Seeded choices among everything enabled, with perturbations.
    Random,
    /// Deliver, then execute, then boot, then timers; requests of the named kind fail
    /// whenever they are executed; the named timer fires as soon as the host is in the
    /// named phase; with `retry`, an operator retries a held agent once nothing else is
    /// enabled.
    Directed {
        fail: Option<&'static str>,
        fire: Option<(Phase, Timer)>,
        retry: bool,
    },
}

struct Driver {
    world: World,
    schedule: Schedule,
    seed: u64,
    table: BTreeMap<(String, String), Entry>,
    seen: Seen,
}

impl Driver {
    fn next(&mut self) -> u64 {
        // A fixed LCG: the schedule depends only on the seed.
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.seed >> 33
    }

    fn phase(&self, host: usize) -> Option<Phase> {
        self.world.hosts[host]
            .process
            .as_ref()
            .map(|process| process.phase())
    }

    /// Runs `deliver` (which feeds one input to `host`) and checks it against the table.
    /// `news` is the version an `AgentVersionChanged` input carries.
    fn observe(
        &mut self,
        host: usize,
        before: Phase,
        kind: InputKind,
        news: Option<Version>,
        deliver: impl FnOnce(&mut World),
    ) {
        let ids_before: BTreeSet<RequestId> = self.world.hosts[host]
            .in_flight
            .iter()
            .map(|(id, _)| *id)
            .collect();
        deliver(&mut self.world);
        let Some(after) = self.phase(host) else {
            return;
        };
        let requests: BTreeSet<String> = self.world.hosts[host]
            .in_flight
            .iter()
            .filter(|(id, _)| !ids_before.contains(id))
            .map(|(_, request)| request_name(request).to_owned())
            .collect();
        let key = (before.as_str().to_owned(), input_name(kind));
        match &self.table[&key] {
            Entry::Ignored => assert!(
                after == before && requests.is_empty(),
                "{} × {}: the table says ignored, but it went to {after} and asked {requests:?}",
                key.0,
                key.1
            ),
            Entry::Remembered => {
                assert!(
                    after == before && requests.is_empty(),
                    "{} × {}: the table says remembered, but it went to {after} and asked \
                     {requests:?}",
                    key.0,
                    key.1
                );
                let kept = self.world.hosts[host]
                    .process
                    .as_ref()
                    .and_then(|process| process.agent_version_news());
                assert!(
                    news.is_some() && kept == news,
                    "{} × {}: the table says remembered, but the core keeps {kept:?} of {news:?}",
                    key.0,
                    key.1
                );
            }
            Entry::Allowed {
                next,
                requests: allowed,
            } => {
                assert!(
                    next.contains(after.as_str()),
                    "{} × {}: went to {after}, table allows {next:?}",
                    key.0,
                    key.1
                );
                let extra: Vec<_> = requests.difference(allowed).collect();
                assert!(
                    extra.is_empty(),
                    "{} × {}: asked {extra:?}, table allows {allowed:?}",
                    key.0,
                    key.1
                );
                self.seen
                    .entry(key)
                    .or_default()
                    .insert(after.as_str().to_owned());
            }
        }
    }

    fn step(&mut self) -> bool {
        if let Schedule::Directed { fail, fire, retry } = self.schedule {
            return self.directed(fail, fire, retry);
        }
        let actions = self.world.actions();
        if actions.is_empty() {
            return false;
        }
        let choice = self.next();
        let host = (choice as usize / 7) % self.world.hosts.len();
        // One step in eight is something only an operator, a failing dependency or a late
        // message would do.
        if choice.is_multiple_of(8) && self.world.hosts[host].process.is_some() {
            self.perturb(host);
            return true;
        }
        self.apply(actions[(choice as usize) % actions.len()]);
        true
    }

    /// Applies a world action, observing it against the table when it feeds the core.
    fn apply(&mut self, action: Action) {
        match action {
            Action::Boot { host } => self.observe(
                host,
                Phase::Bootstrapping,
                InputKind::Start,
                None,
                |world| world.apply(action),
            ),
            Action::Deliver { host } => {
                let input = &self.world.hosts[host].completions[0];
                let (kind, news) = (input.kind(), news_of(input));
                let before = self.phase(host).expect("running");
                self.observe(host, before, kind, news, |world| world.apply(action));
            }
            Action::Fire { host, .. } => {
                let before = self.phase(host).expect("running");
                self.observe(host, before, InputKind::Timer, None, |world| {
                    world.apply(action)
                });
            }
            _ => self.world.apply(action),
        }
    }

    fn directed(
        &mut self,
        fail: Option<&'static str>,
        fire: Option<(Phase, Timer)>,
        retry: bool,
    ) -> bool {
        let actions = self.world.actions();
        if let Some((phase, timer)) = fire {
            let due = actions.iter().find(|action| {
                matches!(action, Action::Fire { host, timer: armed }
                    if *armed == timer && self.phase(*host) == Some(phase))
            });
            if let Some(&Action::Fire { host, .. }) = due {
                let before = self.phase(host).expect("running");
                self.observe(host, before, InputKind::Timer, None, |world| {
                    world.apply(Action::Fire { host, timer })
                });
                return true;
            }
        }
        let pick = |wanted: fn(&Action) -> bool| actions.iter().copied().find(&wanted);
        let action = pick(|action| matches!(action, Action::Deliver { .. }))
            .or_else(|| pick(|action| matches!(action, Action::Execute { .. })))
            .or_else(|| pick(|action| matches!(action, Action::Boot { .. })))
            .or_else(|| pick(|action| matches!(action, Action::Fire { timer, .. } if *timer != Timer::CatalogueCheck)));
        let Some(action) = action else {
            return retry && self.retry_held();
        };
        match action {
            Action::Execute { host, index }
                if fail.is_some_and(|name| {
                    request_name(&self.world.hosts[host].in_flight[index].1) == name
                }) =>
            {
                let before = self.phase(host).expect("running");
                let (id, request) = self.world.hosts[host].in_flight.remove(index);
                let input = failure(id, &request, false);
                let kind = input.kind();
                self.observe(host, before, kind, None, |world| world.deliver(host, input));
            }
            action => self.apply(action),
        }
        true
    }

    /// An operator's retry of the first held agent; false when none is held.
    fn retry_held(&mut self) -> bool {
        let held =
            (0..self.world.hosts.len()).find(|&host| self.phase(host) == Some(Phase::StepsFailed));
        let Some(host) = held else { return false };
        let input = Input::Operator(OperatorAction::Retry);
        self.observe(host, Phase::StepsFailed, input.kind(), None, |world| {
            world.deliver(host, input)
        });
        true
    }

    fn perturb(&mut self, host: usize) {
        let before = self.phase(host).expect("running");
        let failing = self.world.hosts[host]
            .in_flight
            .iter()
            .position(|(_, request)| {
                matches!(
                    request,
                    Request::RunStep { .. }
                        | Request::StageBinary(_)
                        | Request::LookupCatalogue { .. }
                        | Request::SetAgentVersion(_)
                )
            });
        let choice = self.next();
        if let (Some(index), true) = (failing, choice.is_multiple_of(2)) {
            let (id, request) = self.world.hosts[host].in_flight.remove(index);
            // Half the refused agent-version writes find the model holding the value.
            let input = failure(id, &request, choice.is_multiple_of(4));
            let kind = input.kind();
            self.observe(host, before, kind, None, |world| world.deliver(host, input));
            return;
        }
        let stale = RequestId(1_000_000 + choice);
        let input = match self.next() % 16 {
            0 => Input::Operator(OperatorAction::Retry),
            1 => Input::Operator(OperatorAction::Abort),
            2 => Input::UpgradeRequested { version: None },
            3 => Input::UpgradeRequested { version: Some(V44) },
            4 => Input::AgentVersionChanged(V44),
            5 => Input::Done { id: stale },
            6 => Input::StepFinished {
                id: stale,
                outcome: StepOutcome::Applied,
            },
            7 => Input::RecordChanged(RecordView::default()),
            8 => Input::Staged {
                id: stale,
                result: Ok(()),
            },
            9 => Input::CatalogueFound {
                id: stale,
                result: Ok(catalogue(&[V44])),
            },
            10 => Input::Start,
            11 => Input::DesiredBinary {
                id: stale,
                plan: StagePlan {
                    binary: binary(V44),
                    size_bytes: 1024,
                    sha256: Sha256([44; 32]),
                    source: StageSource::Controller,
                },
            },
            12 => Input::AgentVersionRefused {
                id: stale,
                agent_version: self.world.store.model.agent_version,
                view: RecordView::default(),
            },
            13 => Input::RecordWritten {
                id: stale,
                write: RecordWrite::Fenced,
            },
            14 => Input::ModelLoaded {
                id: stale,
                model: self.world.store.model.clone(),
            },
            _ => Input::LeaseAnswered {
                id: stale,
                lease: None,
            },
        };
        let (kind, news) = (input.kind(), news_of(&input));
        self.observe(host, before, kind, news, |world| world.deliver(host, input));
    }
}

/// The version an `AgentVersionChanged` input carries.
fn news_of(input: &Input) -> Option<Version> {
    match input {
        Input::AgentVersionChanged(version) => Some(*version),
        _ => None,
    }
}

/// A record that has moved on past pending, every controller ready: what a compare-and-set
/// or an `agent-version` write may find when another controller got there first.
fn moved_on(previous: Version, target: Version, revision: u64) -> RecordView {
    let record = UpgradeInfo {
        previous_version: previous,
        target_version: target,
        status: UpgradeStatus::DbComplete,
        controllers_ready: ControllerSet::first(ControllerId::COUNT_MAX),
        controllers_done: ControllerSet::EMPTY,
    };
    RecordView {
        current: Some((record, Revision(revision))),
        last_archived: None,
        revision: Revision(revision),
    }
}

/// The failed completion of a request. A refused `agent-version` write finds the model
/// holding the value asked for when `holds` (a write another controller made first), and
/// the version before it otherwise.
fn failure(id: RequestId, request: &Request, holds: bool) -> Input {
    match request {
        // Another upgrade got there first: past pending, every controller ready.
        Request::UpdateRecord {
            expected, record, ..
        } => Input::RecordWritten {
            id,
            write: RecordWrite::Conflict(moved_on(
                record.previous_version,
                record.target_version,
                expected.0 + 1,
            )),
        },
        Request::SetAgentVersion(version) => Input::AgentVersionRefused {
            id,
            agent_version: if holds {
                *version
            } else {
                Version::new(
                    version.major,
                    version.minor,
                    version.patch.saturating_sub(1),
                )
            },
            view: moved_on(
                *version,
                Version::new(version.major, version.minor, version.patch + 1),
                1_000,
            ),
        },
        Request::RunStep { .. } => Input::StepFinished {
            id,
            outcome: StepOutcome::Failed("disk full".into()),
        },
        Request::StageBinary(_) => Input::Staged {
            id,
            result: Err("sha256 mismatch".into()),
        },
        _ => Input::CatalogueFound {
            id,
            result: Err("connection refused".into()),
        },
    }
}

/// A controller that switched to 2.9.44 (from 2.9.43) and is on trial.
fn on_trial(
    boots: u8,
    past_database_steps: bool,
    upgraded_to: lockstep_core::Version,
) -> WorldSpec {
    let mut spec = controllers_upgrading(1, V43, V44, registry());
    let mut snapshot = snapshot(upgraded_to);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(Trial {
        binary: binary(V44),
        boots,
        past_database_steps,
        switches: 0,
    });
    spec.snapshots = vec![Some(snapshot)];
    spec.model = ModelView {
        agent_version: V44,
        ..spec.model
    };
    spec
}

/// A machine agent that switched to 2.9.44 and already ran its steps there (falling back is
/// unsafe), on trial.
fn machine_on_trial(boots: u8) -> WorldSpec {
    let mut spec = controllers_upgrading(1, V44, V44, registry());
    let mut snapshot = snapshot(V44);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(Trial {
        binary: binary(V44),
        boots,
        past_database_steps: false,
        switches: 0,
    });
    spec.hosts = vec![host_machine(V44)];
    spec.snapshots = vec![Some(snapshot)];
    spec
}

/// Directed schedules for paths a random schedule rarely takes.
fn directed() -> Vec<(WorldSpec, Schedule)> {
    let plain = Schedule::Directed {
        fail: None,
        fire: None,
        retry: false,
    };
    let mut older_binary = controllers_upgrading(1, V44, V43, registry());
    older_binary.model = ModelView {
        agent_version: V43,
        ..older_binary.model
    };
    let mut operator_set = controllers_upgrading(1, V43, V43, registry());
    operator_set.model = ModelView {
        agent_version: V44,
        ..operator_set.model
    };
    let mut first_boot_off = controllers_upgrading(1, V43, V43, registry());
    first_boot_off.snapshots = vec![None];
    vec![
        // An agent other than a controller decides while Bootstrapping (a controller waits
        // for the model): booted too often, or out of time, after its steps ran: held.
        (machine_on_trial(2), plain),
        (
            machine_on_trial(0),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::Bootstrapping, Timer::TrialReady)),
                retry: false,
            },
        ),
        // Booted too often: falls back (safe) or holds (database steps ran).
        (on_trial(2, true, V43), plain),
        (on_trial(2, false, V43), plain),
        // Trial timer while bootstrapping and while checking the version.
        (
            on_trial(0, false, V43),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::Bootstrapping, Timer::TrialReady)),
                retry: false,
            },
        ),
        (
            on_trial(0, true, V43),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::Bootstrapping, Timer::TrialReady)),
                retry: false,
            },
        ),
        // (Checking the version on trial: the new binary of an implicit upgrade at
        // bootstrap, whose boots are still the bootstrap's. A boot after bootstrap on the
        // model's agent-version goes to Ready without the check.)
        (
            bootstrap_on_trial(true, V44),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::CheckingAgentVersion, Timer::TrialReady)),
                retry: false,
            },
        ),
        (
            bootstrap_on_trial(false, V44),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::CheckingAgentVersion, Timer::TrialReady)),
                retry: false,
            },
        ),
        // ...and its steps to run first: checked once they are done.
        (bootstrap_on_trial(false, V43), plain),
        // Out of boots after its steps ran (held); the operator retries, no step left: on
        // the model's agent-version, Ready.
        (
            on_trial(2, true, V44),
            Schedule::Directed {
                fail: None,
                fire: None,
                retry: true,
            },
        ),
        // A binary older than upgradedToVersion.
        (older_binary, plain),
        // The operator set agent-version; staging keeps failing.
        (operator_set.clone(), plain),
        (
            operator_set,
            Schedule::Directed {
                fail: Some("StageBinary"),
                fire: None,
                retry: false,
            },
        ),
        // Steps keep failing; catalogue lookups keep failing.
        (
            controllers_upgrading(1, V42, V43, registry()),
            Schedule::Directed {
                fail: Some("RunStep"),
                fire: None,
                retry: false,
            },
        ),
        // (At a first boot: a boot after bootstrap on the model's agent-version makes its
        // lookup from Ready.)
        (
            first_boot_off,
            Schedule::Directed {
                fail: Some("LookupCatalogue"),
                fire: None,
                retry: false,
            },
        ),
    ]
}

/// The new binary of an implicit upgrade at bootstrap (2.9.43 to 2.9.44), on trial, its
/// steps done up to `upgraded_to`: bootstrap is not complete until it is Ready, so it
/// checks the version once its steps are done.
fn bootstrap_on_trial(past_database_steps: bool, upgraded_to: lockstep_core::Version) -> WorldSpec {
    let mut spec = on_trial(0, past_database_steps, upgraded_to);
    for snapshot in spec.snapshots.iter_mut().flatten() {
        snapshot.bootstrap_complete = false;
    }
    spec
}

/// A controller that fell back from 2.9.44 (booted once on trial) and runs 2.9.43 again.
fn fell_back() -> WorldSpec {
    let mut spec = controllers_upgrading(1, V43, V43, registry());
    let mut snapshot = snapshot(V43);
    snapshot.previous = Some(binary(V43));
    snapshot.trial = Some(Trial {
        binary: binary(V44),
        boots: 1,
        past_database_steps: false,
        switches: 0,
    });
    spec.snapshots = vec![Some(snapshot)];
    spec.model = ModelView {
        agent_version: V44,
        ..spec.model
    };
    spec
}

/// The upgrade 2.9.43 -> 2.9.44 as a record with `status`, nobody ready.
fn record_43_44(status: UpgradeStatus) -> UpgradeInfo {
    UpgradeInfo {
        previous_version: V43,
        target_version: V44,
        status,
        controllers_ready: ControllerSet::EMPTY,
        controllers_done: ControllerSet::EMPTY,
    }
}

/// Directed schedules over worlds whose store already holds a record: the paths where a
/// controller that gives an upgrade up retires the record, or holds because the store says
/// database steps of the newer version may have run.
fn directed_worlds() -> Vec<(World, Schedule)> {
    let plain = Schedule::Directed {
        fail: None,
        fire: None,
        retry: false,
    };
    let with_record = |spec: WorldSpec, current: Option<UpgradeInfo>, archived| {
        let mut world = World::new(spec);
        world.store.record = current.map(|record| (record, Revision(2)));
        world.store.last_archived = archived;
        world.store.revision = Revision(2);
        world
    };
    let pending = record_43_44(UpgradeStatus::Pending);
    let complete = UpgradeInfo {
        controllers_ready: ControllerSet::first(1),
        controllers_done: ControllerSet::first(1),
        ..record_43_44(UpgradeStatus::Complete)
    };
    let aborted = record_43_44(UpgradeStatus::Aborted);
    let mut first_boot_auto = controllers_upgrading(1, V43, V43, registry());
    first_boot_auto.snapshots = vec![None];
    first_boot_auto.model = ModelView {
        policy: UpgradePolicy::AutoPatch,
        ..first_boot_auto.model
    };
    let stale_42_43 = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        ..pending
    };
    vec![
        // Fell back; the store archived the upgrade complete: held, never Ready on 2.9.43.
        (with_record(fell_back(), None, Some(complete)), plain),
        // Fell back; a pending record nobody is ready for: archived aborted, then the reset.
        (with_record(fell_back(), Some(pending), None), plain),
        // ...and its abort meets a record that moved on meanwhile: held.
        (
            with_record(fell_back(), Some(pending), None),
            Schedule::Directed {
                fail: Some("UpdateRecord"),
                fire: None,
                retry: false,
            },
        ),
        // Fell back; the reset of agent-version is refused for a record past pending: held.
        (
            with_record(fell_back(), None, None),
            Schedule::Directed {
                fail: Some("SetAgentVersion"),
                fire: None,
                retry: false,
            },
        ),
        // Bootstrap auto-upgrade refused while a stale record is current: Ready, which
        // archives that record.
        (with_record(first_boot_auto, Some(stale_42_43), None), plain),
        // On trial, the upgrade was aborted: held, until the trial's deadline, when the
        // record (aborted while not every controller was ready) lets it fall back.
        (
            with_record(on_trial(0, false, V43), None, Some(aborted)),
            Schedule::Directed {
                fail: None,
                fire: Some((Phase::StepsFailed, Timer::TrialReady)),
                retry: false,
            },
        ),
    ]
}

fn specs() -> Vec<WorldSpec> {
    let mut first_boot_auto = controllers_upgrading(1, V43, V43, registry());
    first_boot_auto.snapshots = vec![None];
    first_boot_auto.model = ModelView {
        policy: UpgradePolicy::AutoPatch,
        ..first_boot_auto.model
    };
    let mut first_boot_off = controllers_upgrading(1, V43, V43, registry());
    first_boot_off.snapshots = vec![None];
    let mut pinned_missing = first_boot_off.clone();
    pinned_missing.model = ModelView {
        policy: UpgradePolicy::Pinned(lockstep_core::Version::new(2, 9, 99)),
        ..pinned_missing.model
    };
    let with_faults = |mut spec: WorldSpec| {
        spec.crashes = 2;
        spec.expiries = 2;
        spec
    };
    let mut operator_set = controllers_upgrading(1, V43, V43, registry());
    operator_set.model = ModelView {
        agent_version: V44,
        ..operator_set.model
    };
    let mut machine_agent = controllers_upgrading(1, V43, V43, registry());
    machine_agent.hosts.push(host_machine(V43));
    machine_agent.snapshots.push(Some(snapshot(V43)));
    let mut machine_agent_behind = machine_agent.clone();
    machine_agent_behind.model = ModelView {
        agent_version: V44,
        ..machine_agent_behind.model
    };
    vec![
        with_faults(operator_set),
        with_faults(machine_agent),
        with_faults(machine_agent_behind),
        with_faults(controllers_upgrading(1, V42, V43, registry())),
        with_faults(controllers_upgrading(2, V42, V44, registry())),
        with_faults(controllers_upgrading(3, V42, V43, registry())),
        with_faults(first_boot_auto),
        with_faults(first_boot_off),
        with_faults(pinned_missing),
    ]
}

#[test]
fn the_code_does_what_the_table_says_and_exercises_all_of_it() {
    let mut seen = Seen::new();
    let mut observations = 0u64;
    let random = specs()
        .into_iter()
        .map(|spec| (World::new(spec), Schedule::Random, 150u64));
    let directed = directed()
        .into_iter()
        .map(|(spec, schedule)| (World::new(spec), schedule, 1u64))
        .chain(
            directed_worlds()
                .into_iter()
                .map(|(world, schedule)| (world, schedule, 1u64)),
        );
    for (index, (world, schedule, seeds)) in random.chain(directed).enumerate() {
        for seed in 0..seeds {
            let mut driver = Driver {
                world: world.clone(),
                schedule,
                seed: seed * 1000 + index as u64,
                table: table(),
                seen: std::mem::take(&mut seen),
            };
            for _ in 0..600 {
                if !driver.step() {
                    break;
                }
                observations += 1;
                driver.world.check().unwrap_or_else(|violation| {
                    let hosts: Vec<String> = driver
                        .world
                        .hosts
                        .iter()
                        .map(|host| {
                            format!(
                                "running {} durable {:?} process {:?}",
                                host.config.running, host.durable, host.process
                            )
                        })
                        .collect();
                    panic!(
                        "seed {seed} of spec {index}: {violation}\n{}",
                        hosts.join("\n")
                    )
                });
            }
            seen = driver.seen;
        }
    }
    let table = table();
    let mut missing = Vec::new();
    for (key, entry) in &table {
        if let Entry::Allowed { next, .. } = entry {
            let observed = seen.get(key).cloned().unwrap_or_default();
            for phase in next.difference(&observed) {
                missing.push(format!("{} × {} → {phase}", key.0, key.1));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the table's transitions were never exercised in {observations} steps:\n{}",
        missing.len(),
        missing.join("\n")
    );
}
