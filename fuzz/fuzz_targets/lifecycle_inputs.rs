//! Whatever a driver feeds the lifecycle — completions with any request id (stale, future,
//! duplicated), any record view, lease answer, step outcome, catalogue, staging result or
//! operator action, timers at any moment, `now` jumping forwards or backwards — it must not
//! panic, and after every input the gate it publishes must match its phase.
//!
//! The one documented driver obligation is kept: drain every output after every input
//! (`Lifecycle::handle`; the output queue asserts `OUTPUTS_MAX`). Nothing else is filtered.
//!
//! Bytes are read through `arbitrary::Unstructured`: the first choose the agent (controller
//! or host machine, running version, snapshot on disk, limits), the rest one call each.
//! Random inputs alone rarely line up (the right id, a record describing this upgrade), so
//! half the calls *answer* a request the lifecycle made with an input of the matching kind
//! and an arbitrary payload, the way a driver would (sometimes wrongly: a conflict, a
//! failure, an unrelated record); the other half are anything at all, with ids drawn mostly
//! from those issued. A `RestartInto` (or a crash) starts a new lifecycle from the snapshot
//! last asked to be persisted, as the agent would after a restart.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use lockstep_core::lifecycle::{
    Config, ControllerId, ControllerSet, Input, LeaseToken, Lifecycle, Limits, ModelView,
    OperatorAction, Output, RecordView, RecordWrite, Request, RequestId, Revision, Snapshot,
    StagePlan, StageSource, StepOutcome, Timer, Trial, UpgradeInfo, UpgradeStatus,
};
use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream, UpgradePolicy};
use lockstep_core::steps::{Step, StepRegistry, Target};
use lockstep_core::{Binary, Millis, Role, Roles, Timestamp, Version};

/// Calls per run at most (a run of libFuzzer's default 4 KiB input is ~1000 calls).
const CALLS_MAX: usize = 2_000;
/// Issued request ids remembered for completions.
const ISSUED_MAX: usize = 16;

const VERSIONS: [Version; 5] = [
    Version::new(2, 9, 41),
    Version::new(2, 9, 42),
    Version::new(2, 9, 43),
    Version::new(2, 9, 44),
    Version::new(3, 0, 0),
];

fn registry() -> Arc<StepRegistry> {
    let v43 = Version::new(2, 9, 43);
    let v44 = Version::new(2, 9, 44);
    let steps = [
        Step::database("add-machine-roles", v43, "store roles beside legacy jobs"),
        Step::host(
            "rewrite-agent-conf",
            v43,
            &[Target::AllMachines],
            "new agent.conf keys",
        ),
        Step::database("index-event-log", v44, "index the event log"),
        Step::host(
            "move-tools-dir",
            v44,
            &[Target::Controller],
            "tools/ layout",
        ),
    ];
    Arc::new(StepRegistry::new(&steps).expect("a valid registry"))
}

fn version(u: &mut Unstructured<'_>) -> Result<Version> {
    u.choose(&VERSIONS).copied()
}

/// Versions as they appear in this agent's upgrade: mostly its own `from` and `to`.
fn version_near(u: &mut Unstructured<'_>, agent: &Agent) -> Result<Version> {
    match u.int_in_range(0..=3u8)? {
        0 => Ok(agent.from),
        1 | 2 => Ok(agent.to),
        _ => version(u),
    }
}

fn binary(u: &mut Unstructured<'_>) -> Result<Binary> {
    let release = *u.choose(&["ubuntu", "centos"])?;
    let arch = *u.choose(&["amd64", "arm64"])?;
    Ok(Binary::new(version(u)?, release, arch).expect("a valid binary"))
}

/// Controller sets: mostly `0..count`, sometimes any bits.
/// Binaries: mostly of this agent's release and arch, at a version near its own.
fn binary_near(u: &mut Unstructured<'_>, agent: &Agent) -> Result<Binary> {
    if u.ratio(1u8, 4u8)? {
        return binary(u);
    }
    let number = match u.int_in_range(0..=2u8)? {
        0 => agent.to,
        1 => agent.running.number,
        _ => version(u)?,
    };
    Ok(Binary::new(number, &agent.running.release, &agent.running.arch).expect("valid"))
}

fn controllers(u: &mut Unstructured<'_>) -> Result<ControllerSet> {
    if u.ratio(3u8, 4u8)? {
        return Ok(ControllerSet::first(u.int_in_range(1..=3)?));
    }
    let bits: u8 = u.arbitrary()?;
    Ok((0..ControllerId::COUNT_MAX)
        .filter(|id| bits & (1 << id) != 0)
        .fold(ControllerSet::EMPTY, |set, id| set.with(ControllerId(id))))
}

fn stream(u: &mut Unstructured<'_>) -> Result<Option<Stream>> {
    Ok(if u.arbitrary()? {
        Some(*u.choose(&Stream::ALL)?)
    } else {
        None
    })
}

fn model(u: &mut Unstructured<'_>, agent: &Agent) -> Result<ModelView> {
    let policy = match u.int_in_range(0..=3u8)? {
        0 => UpgradePolicy::Off,
        1 => UpgradePolicy::AutoPatch,
        2 => UpgradePolicy::Pinned(version(u)?),
        _ => UpgradePolicy::LocalBinary {
            binary: binary(u)?,
            sha256: Sha256([u.arbitrary()?; 32]),
            size_bytes: u.int_in_range(1..=4096)?,
        },
    };
    Ok(ModelView {
        agent_version: version_near(u, agent)?,
        policy,
        stream: stream(u)?,
        controllers: controllers(u)?,
    })
}

fn record(u: &mut Unstructured<'_>, agent: &Agent) -> Result<UpgradeInfo> {
    Ok(UpgradeInfo {
        previous_version: if u.ratio(3u8, 4u8)? {
            agent.from
        } else {
            version(u)?
        },
        target_version: if u.ratio(3u8, 4u8)? {
            agent.to
        } else {
            version(u)?
        },
        status: *u.choose(&[
            UpgradeStatus::Pending,
            UpgradeStatus::DbComplete,
            UpgradeStatus::Running,
            UpgradeStatus::Complete,
            UpgradeStatus::Aborted,
        ])?,
        controllers_ready: controllers(u)?,
        controllers_done: controllers(u)?,
    })
}

fn view(u: &mut Unstructured<'_>, agent: &Agent) -> Result<RecordView> {
    let current = if u.arbitrary()? {
        Some((record(u, agent)?, Revision(u.int_in_range(0..=16)?)))
    } else {
        None
    };
    let last_archived = if u.arbitrary()? {
        Some(record(u, agent)?)
    } else {
        None
    };
    Ok(RecordView {
        current,
        last_archived,
        revision: Revision(u.int_in_range(0..=16)?),
    })
}

fn catalogue(u: &mut Unstructured<'_>, agent: &Agent) -> Result<Catalogue> {
    let count = u.int_in_range(0..=4usize)?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let binary = binary_near(u, agent)?;
        entries.push(CatalogueEntry {
            path: format!("agents/juju-{binary}.tgz"),
            binary,
            stream: *u.choose(&Stream::ALL)?,
            size_bytes: u.int_in_range(1..=4096)?,
            sha256: Sha256([u.arbitrary()?; 32]),
        });
    }
    // A contradictory catalogue is refused by `Catalogue::new`, before the core sees it.
    Ok(Catalogue::new(entries).unwrap_or_default())
}

fn stage_plan(u: &mut Unstructured<'_>, agent: &Agent) -> Result<StagePlan> {
    Ok(StagePlan {
        binary: binary_near(u, agent)?,
        size_bytes: u.int_in_range(1..=4096)?,
        sha256: Sha256([u.arbitrary()?; 32]),
        source: match u.int_in_range(0..=2u8)? {
            0 => StageSource::Catalogue {
                path: "agents/x.tgz".to_owned(),
            },
            1 => StageSource::Local,
            _ => StageSource::Controller,
        },
    })
}

fn failure(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(u.choose(&["", "connection refused", "sha256 mismatch"])?
        .to_string())
}

/// The agent: a controller or a host machine, with any snapshot on disk.
fn agent(u: &mut Unstructured<'_>, registry: &StepRegistry) -> Result<(Config, Option<Snapshot>)> {
    let controller = if u.arbitrary()? {
        Some(ControllerId(
            u.int_in_range(0..=ControllerId::COUNT_MAX - 1)?,
        ))
    } else {
        None
    };
    let mut roles = Roles::NONE;
    if controller.is_some() {
        roles = roles.with(Role::Controller);
    }
    if controller.is_none() || u.arbitrary()? {
        roles = roles.with(Role::HostMachine);
    }
    let mut limits = Limits::default();
    if u.arbitrary()? {
        // Tight limits reach the give-up paths in a few inputs.
        limits.step_attempts_max = u.int_in_range(1..=2)?;
        limits.catalogue_attempts_max = u.int_in_range(1..=2)?;
        limits.stage_attempts_max = u.int_in_range(1..=2)?;
        limits.trial_boots_max = u.int_in_range(0..=1)?;
    }
    let running = binary(u)?;
    let snapshot = if u.arbitrary()? {
        let steps = registry.steps();
        let mut host_checkpoints = Vec::new();
        for step in steps {
            if u.arbitrary()? {
                host_checkpoints.push(step.key());
            }
        }
        Some(Snapshot {
            format: Snapshot::FORMAT,
            upgraded_to_version: version(u)?,
            host_checkpoints,
            previous: if u.arbitrary()? {
                Some(binary(u)?)
            } else {
                None
            },
            trial: if u.arbitrary()? {
                Some(Trial {
                    binary: if u.arbitrary()? {
                        running.clone()
                    } else {
                        binary(u)?
                    },
                    boots: u.int_in_range(0..=3)?,
                    past_database_steps: u.arbitrary()?,
                    switches: u.int_in_range(0..=3)?,
                })
            } else {
                None
            },
            bootstrap_complete: u.arbitrary()?,
        })
    } else {
        None
    };
    let config = Config {
        controller,
        roles,
        running,
        limits,
    };
    Ok((config, snapshot))
}

/// What the payload generators need to know of the agent, read off the live process.
struct Agent {
    running: Binary,
    /// `upgradedToVersion` as last persisted: where this agent's upgrade starts.
    from: Version,
    /// The running version: where its upgrade ends.
    to: Version,
}

impl Agent {
    fn of(process: &Lifecycle) -> Agent {
        Agent {
            running: process.config().running.clone(),
            from: process.snapshot().upgraded_to_version,
            to: process.config().running.number,
        }
    }
}

/// The driver's side: the process, the requests it made and not yet answered.
struct Driver {
    registry: Arc<StepRegistry>,
    process: Lifecycle,
    outstanding: Vec<(RequestId, Request)>,
    issued: Vec<RequestId>,
    restarts: u32,
}

/// Restarts per run at most (each builds a new lifecycle).
const RESTARTS_MAX: u32 = 8;

impl Driver {
    fn start(&mut self, now: Timestamp) {
        self.process.handle(now, Input::Start);
        self.drain();
    }

    /// The process ends; a new one starts on `binary` from the snapshot last asked to be
    /// persisted (the driver may have written it or not; either is a state the agent must
    /// resume from).
    fn restart(&mut self, now: Timestamp, binary: Option<Binary>) {
        if self.restarts >= RESTARTS_MAX {
            return;
        }
        self.restarts += 1;
        let mut config = self.process.config().clone();
        if let Some(binary) = binary {
            config.running = binary;
        }
        let snapshot = self.process.snapshot().clone();
        self.process = Lifecycle::new(config, Arc::clone(&self.registry), Some(snapshot))
            .expect("a config and snapshot the previous process accepted");
        self.outstanding.clear();
        self.issued.clear();
        self.start(now);
    }

    /// Drains every output (the driver's one obligation) and checks what it published.
    fn drain(&mut self) {
        let mut gate = None;
        while let Some(output) = self.process.poll_output() {
            match output {
                Output::Request { id, request } => {
                    if self.issued.len() == ISSUED_MAX {
                        self.issued.remove(0);
                    }
                    self.issued.push(id);
                    if self.outstanding.len() == ISSUED_MAX {
                        self.outstanding.remove(0);
                    }
                    self.outstanding.push((id, request));
                }
                Output::Gate(view) => gate = Some(view.phase),
                Output::Status(_) => {}
                // `Output` is `#[non_exhaustive]`: a new one must be handled here first.
                other => unreachable!("an output the fuzz driver does not handle: {other:?}"),
            }
        }
        let phase = self.process.phase();
        assert_eq!(
            self.process.gate().phase,
            phase,
            "the gate getter follows the phase"
        );
        if let Some(published) = gate {
            assert_eq!(
                published, phase,
                "the last gate view published is the phase's"
            );
        }
    }

    /// A request id: mostly the awaited one or one issued, sometimes any.
    fn id(&self, u: &mut Unstructured<'_>) -> Result<RequestId> {
        if let Some(awaited) = self.process.awaiting()
            && u.ratio(1u8, 2u8)?
        {
            return Ok(awaited);
        }
        if !self.issued.is_empty() && u.ratio(3u8, 4u8)? {
            return u.choose(&self.issued).copied();
        }
        Ok(RequestId(u.arbitrary()?))
    }

    /// An answer of the right kind to an outstanding request (most often the oldest).
    fn answer(&mut self, u: &mut Unstructured<'_>, now: Timestamp) -> Result<Option<Input>> {
        if self.outstanding.is_empty() {
            return Ok(None);
        }
        let index = if u.ratio(3u8, 4u8)? {
            0
        } else {
            u.choose_index(self.outstanding.len())?
        };
        let (id, request) = self.outstanding.remove(index);
        let agent = Agent::of(&self.process);
        let u = &mut *u;
        let input = match request {
            Request::PersistSnapshot(_)
            | Request::RefreshCapabilities
            | Request::SetAgentVersion(_)
            | Request::ReportUpgradeAvailable(_)
            | Request::ReleaseLease(_) => Input::Done { id },
            Request::LoadModel => Input::ModelLoaded {
                id,
                model: model(u, &agent)?,
            },
            Request::WatchRecord { .. } => {
                // A watch answers again and again: keep it outstanding.
                self.outstanding.push((id, request));
                Input::RecordChanged(view(u, &agent)?)
            }
            Request::CreateRecord(record) | Request::UpdateRecord { record, .. } => {
                let revision = Revision(u.int_in_range(1..=16)?);
                let written = if record.status.is_final() {
                    RecordView {
                        current: None,
                        last_archived: Some(record),
                        revision,
                    }
                } else {
                    RecordView {
                        current: Some((record, revision)),
                        last_archived: None,
                        revision,
                    }
                };
                Input::RecordWritten {
                    id,
                    write: match u.int_in_range(0..=3u8)? {
                        0 | 1 => RecordWrite::Written(written),
                        2 => RecordWrite::Conflict(view(u, &agent)?),
                        _ => RecordWrite::Fenced,
                    },
                }
            }
            Request::AcquireLease | Request::KeepAliveLease(_) => Input::LeaseAnswered {
                id,
                lease: match request {
                    Request::KeepAliveLease(token) if u.ratio(3u8, 4u8)? => Some(token),
                    _ if u.arbitrary()? => Some(LeaseToken(u.int_in_range(1..=4)?)),
                    _ => None,
                },
            },
            Request::RunStep { .. } => Input::StepFinished {
                id,
                outcome: match u.int_in_range(0..=5u8)? {
                    0..=2 => StepOutcome::Applied,
                    3 => StepOutcome::AlreadyApplied,
                    4 => StepOutcome::Fenced,
                    _ => StepOutcome::Failed(failure(u)?),
                },
            },
            Request::LookupCatalogue { .. } => Input::CatalogueFound {
                id,
                result: if u.ratio(3u8, 4u8)? {
                    Ok(catalogue(u, &agent)?)
                } else {
                    Err(failure(u)?)
                },
            },
            Request::DesiredBinary => Input::DesiredBinary {
                id,
                plan: stage_plan(u, &agent)?,
            },
            Request::StageBinary(_) => Input::Staged {
                id,
                result: if u.ratio(3u8, 4u8)? {
                    Ok(())
                } else {
                    Err(failure(u)?)
                },
            },
            Request::RestartInto(binary) => {
                self.restart(now, Some(binary));
                return Ok(None);
            }
            // `Request` is `#[non_exhaustive]`: a new one must be answered here first.
            other => unreachable!("a request the fuzz driver does not answer: {other:?}"),
        };
        Ok(Some(input))
    }

    /// Any input at all.
    fn anything(&mut self, u: &mut Unstructured<'_>, now: Timestamp) -> Result<Option<Input>> {
        let agent = Agent::of(&self.process);
        let input = match u.int_in_range(0..=15u8)? {
            0 => Input::Start,
            1 => Input::Done { id: self.id(u)? },
            2 => Input::ModelLoaded {
                id: self.id(u)?,
                model: model(u, &agent)?,
            },
            3 => Input::RecordChanged(view(u, &agent)?),
            4 => Input::RecordWritten {
                id: self.id(u)?,
                write: match u.int_in_range(0..=2u8)? {
                    0 => RecordWrite::Written(view(u, &agent)?),
                    1 => RecordWrite::Conflict(view(u, &agent)?),
                    _ => RecordWrite::Fenced,
                },
            },
            5 => Input::LeaseAnswered {
                id: self.id(u)?,
                lease: if u.arbitrary()? {
                    Some(LeaseToken(u.arbitrary()?))
                } else {
                    None
                },
            },
            6 => Input::StepFinished {
                id: self.id(u)?,
                outcome: match u.int_in_range(0..=3u8)? {
                    0 => StepOutcome::Applied,
                    1 => StepOutcome::AlreadyApplied,
                    2 => StepOutcome::Fenced,
                    _ => StepOutcome::Failed(failure(u)?),
                },
            },
            7 => Input::CatalogueFound {
                id: self.id(u)?,
                result: if u.arbitrary()? {
                    Ok(catalogue(u, &agent)?)
                } else {
                    Err(failure(u)?)
                },
            },
            8 => Input::DesiredBinary {
                id: self.id(u)?,
                plan: stage_plan(u, &agent)?,
            },
            9 => Input::Staged {
                id: self.id(u)?,
                result: if u.arbitrary()? {
                    Ok(())
                } else {
                    Err(failure(u)?)
                },
            },
            10 => Input::AgentVersionChanged(version_near(u, &agent)?),
            11 => Input::UpgradeRequested {
                version: if u.arbitrary()? {
                    Some(version_near(u, &agent)?)
                } else {
                    None
                },
            },
            12 => Input::Operator(*u.choose(&[OperatorAction::Retry, OperatorAction::Abort])?),
            13 => {
                self.process.handle_timer(now, *u.choose(&Timer::ALL)?);
                self.drain();
                return Ok(None);
            }
            14 => {
                // A crash: what was not answered is lost.
                self.restart(now, None);
                return Ok(None);
            }
            _ => {
                // `handle_timeout` at `now`, or at the earliest deadline.
                let at = match self.process.poll_timeout() {
                    Some(deadline) if u.arbitrary()? => deadline,
                    _ => now,
                };
                self.process.handle_timeout(at);
                self.drain();
                return Ok(None);
            }
        };
        Ok(Some(input))
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

fn run(data: &[u8]) -> Result<()> {
    let registry = registry();
    let mut u = Unstructured::new(data);
    let (config, snapshot) = agent(&mut u, &registry)?;
    let process = Lifecycle::new(config, Arc::clone(&registry), snapshot).expect("a valid config");
    let mut driver = Driver {
        registry,
        process,
        outstanding: Vec::with_capacity(ISSUED_MAX),
        issued: Vec::with_capacity(ISSUED_MAX),
        restarts: 0,
    };
    let mut now = Timestamp::ZERO;
    if u.ratio(7u8, 8u8)? {
        driver.start(now);
    }
    let mut calls = 0;
    while !u.is_empty() && calls < CALLS_MAX {
        calls += 1;
        // Mostly forwards, by up to ~18 hours (past every timer); sometimes anywhere.
        now = if u.ratio(15u8, 16u8)? {
            now + Millis(u64::from(u.arbitrary::<u16>()?) * 1_000)
        } else {
            Timestamp(u.arbitrary()?)
        };
        let input = if u.arbitrary()? {
            driver.answer(&mut u, now)?
        } else {
            driver.anything(&mut u, now)?
        };
        if let Some(input) = input {
            driver.process.handle(now, input);
            driver.drain();
        }
    }
    Ok(())
}
