//! A daemon-shaped embedding of lockstep-core: one controller bootstrapped on 2.9.43 with
//! `--auto-upgrade`, a catalogue that offers 2.9.44, the embedder's own upgrade steps and
//! capability→jobs table. The driver here plays store, provider, downloader and process
//! manager in memory, and prints every phase change, gate change and request as the core
//! makes it, through the restart into 2.9.44 until the API is fully available.
//!
//! Run: `cargo run -p lockstep-core --example controller`
#![allow(clippy::print_stdout)]

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use lockstep_core::gate::{self, Login};
use lockstep_core::jobs::{Capabilities, Capability, JobTable, StoredMachine, reported_jobs};
use lockstep_core::lifecycle::{
    Config, ControllerId, ControllerSet, Input, Limits, ModelView, Output, RecordView, RecordWrite,
    Request, Revision, Snapshot, StepOutcome,
};
use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream, UpgradePolicy};
use lockstep_core::steps::{Step, StepRegistry, Target};
use lockstep_core::upgrader::AgentVersionCheck;
use lockstep_core::{Binary, Lifecycle, Millis, Role, Roles, Timestamp, Version};

/// The embedder's steps: lockstep-core runs those whose target is in (upgraded-to, running].
fn registry() -> StepRegistry {
    StepRegistry::new(&[
        Step::database(
            "add-machine-roles",
            Version::new(2, 9, 44),
            "store roles beside legacy jobs",
        ),
        Step::host(
            "rewrite-agent-conf",
            Version::new(2, 9, 44),
            &[Target::AllMachines],
            "agent.conf keys",
        ),
    ])
    .expect("a valid registry")
}

fn binary(version: Version) -> Binary {
    Binary::new(version, "ubuntu", "amd64").expect("valid binary")
}

/// What this example's in-memory "world" holds: the parts a real agent keeps on disk, in
/// its store and in its environment.
struct Host {
    running: Binary,
    snapshot: Option<Snapshot>,
    model: ModelView,
    record: RecordView,
    checkpoints: BTreeSet<String>,
    capabilities: Capabilities,
    catalogue: Catalogue,
}

fn main() {
    let registry = Arc::new(registry());
    let catalogue = Catalogue::new(
        [43, 44]
            .into_iter()
            .map(|patch| CatalogueEntry {
                binary: binary(Version::new(2, 9, patch)),
                stream: Stream::Released,
                size_bytes: 52_428_800,
                sha256: Sha256([patch as u8; 32]),
                path: format!("agents/juju-2.9.{patch}-ubuntu-amd64.tgz"),
            })
            .collect(),
    )
    .expect("a valid catalogue");
    let mut host = Host {
        running: binary(Version::new(2, 9, 43)),
        snapshot: None,
        model: ModelView {
            agent_version: Version::new(2, 9, 43),
            policy: UpgradePolicy::AutoPatch,
            stream: None,
            controllers: ControllerSet::first(1),
        },
        record: RecordView {
            revision: Revision(1),
            ..RecordView::default()
        },
        checkpoints: BTreeSet::new(),
        capabilities: Capabilities::new(),
        catalogue,
    };
    let mut now = Timestamp::ZERO;
    let tick = Millis(5);

    // Each loop is one process: it ends when the core asks to restart into a new binary.
    for boot in 1..=3 {
        println!("\n== process {boot}: running {}", host.running);
        let config = Config {
            controller: Some(ControllerId(0)),
            roles: Roles::of(&[Role::Controller]),
            running: host.running.clone(),
            limits: Limits::default(),
        };
        let mut core = Lifecycle::new(config, Arc::clone(&registry), host.snapshot.clone())
            .expect("valid configuration");
        let mut inbox = VecDeque::from([Input::Start]);
        let mut restart_into = None;
        while let Some(input) = inbox.pop_front() {
            now = now + tick;
            core.handle(now, input);
            // After every input, drain every output.
            while let Some(output) = core.poll_output() {
                match output {
                    Output::Gate(view) => {
                        let deploy = gate::admit(&view, Login::User, "Application", "Deploy");
                        let verdict = match deploy {
                            Ok(()) => "full API".to_owned(),
                            Err(rejection) => format!("limited: Deploy -> {:?}", rejection.message),
                        };
                        println!("  {now}  gate   {:<24} {verdict}", view.phase.to_string());
                    }
                    Output::Status(status) if !status.message.is_empty() => {
                        println!("  {now}  status {}", status.message);
                    }
                    Output::Status(_) => {}
                    Output::Request { id, request } => {
                        println!("  {now}  {id:<5}  {}", describe(&request));
                        if let Request::RestartInto(binary) = &request {
                            restart_into = Some(binary.clone());
                        }
                        inbox.extend(execute(&mut host, id, request, &registry));
                    }
                    // `Output` is `#[non_exhaustive]`: a later lockstep-core may add one.
                    other => println!("  {now}  (not acted on: {other:?})"),
                }
            }
        }
        let Some(binary) = restart_into else {
            let jobs = reported_jobs(
                &JobTable::lockstep(),
                StoredMachine::Roles(Roles::of(&[Role::Controller])),
                &host.capabilities,
            );
            println!(
                "\ncontroller is {} on {}: machine 0 reports jobs {:?}; upgradedToVersion {}",
                core.phase(),
                host.running,
                jobs.iter().map(|job| job.as_str()).collect::<Vec<_>>(),
                core.snapshot().upgraded_to_version
            );
            assert_eq!(core.phase(), lockstep_core::Phase::Ready);
            return;
        };
        host.running = binary;
    }
    panic!("the controller did not become ready");
}

/// Runs one request against the in-memory host and returns its completion.
fn execute(
    host: &mut Host,
    id: lockstep_core::lifecycle::RequestId,
    request: Request,
    registry: &StepRegistry,
) -> Option<Input> {
    Some(match request {
        Request::PersistSnapshot(snapshot) => {
            host.snapshot = Some(snapshot);
            Input::Done { id }
        }
        Request::LoadModel => Input::ModelLoaded {
            id,
            model: host.model.clone(),
        },
        Request::RefreshCapabilities => {
            host.capabilities =
                Capabilities::from_capabilities([
                    Capability::new("manage-firewall").expect("valid")
                ])
                .expect("one capability");
            Input::Done { id }
        }
        Request::WatchRecord { .. } => Input::RecordChanged(host.record),
        Request::CreateRecord(record) => {
            host.record.revision = Revision(host.record.revision.0 + 1);
            host.record.current = Some((record, host.record.revision));
            Input::RecordWritten {
                id,
                write: RecordWrite::Written(host.record),
            }
        }
        Request::UpdateRecord { record, .. } => {
            host.record.revision = Revision(host.record.revision.0 + 1);
            if record.status.is_final() {
                host.record.current = None;
                host.record.last_archived = Some(record);
            } else {
                host.record.current = Some((record, host.record.revision));
            }
            Input::RecordWritten {
                id,
                write: RecordWrite::Written(host.record),
            }
        }
        Request::AcquireLease => Input::LeaseAnswered {
            id,
            lease: Some(lockstep_core::lifecycle::LeaseToken(1)),
        },
        Request::KeepAliveLease(token) => Input::LeaseAnswered {
            id,
            lease: Some(token),
        },
        Request::RunStep { key, .. } => {
            let fresh = host.checkpoints.insert(key.to_string());
            let outcome = if fresh {
                StepOutcome::Applied
            } else {
                StepOutcome::AlreadyApplied
            };
            println!(
                "             step {key}: {}",
                registry.step(registry.index_of(&key.id)?).description
            );
            Input::StepFinished { id, outcome }
        }
        Request::LookupCatalogue { .. } => Input::CatalogueFound {
            id,
            result: Ok(host.catalogue.clone()),
        },
        Request::SetAgentVersion(version) => {
            // The store's rule, decided with the write: a current upgrade-info record refuses.
            let record = host.record.current.map(|(record, _)| record);
            let (current, stream) = (host.model.agent_version, host.model.stream);
            match AgentVersionCheck::LIFECYCLE.check(current, stream, record.as_ref(), version, &[])
            {
                Ok(_) => {
                    host.model.agent_version = version;
                    Input::Done { id }
                }
                Err(_) => Input::AgentVersionRefused {
                    id,
                    agent_version: current,
                    view: host.record,
                },
            }
        }
        Request::ReportUpgradeAvailable(_) => Input::Done { id },
        Request::StageBinary(_) => Input::Staged { id, result: Ok(()) },
        Request::ReleaseLease(_) | Request::RestartInto(_) | Request::DesiredBinary => return None,
        // `Request` is `#[non_exhaustive]`: one this example does not know stays unanswered.
        other => panic!("a request this example does not know: {other:?}"),
    })
}

fn describe(request: &Request) -> String {
    match request {
        Request::PersistSnapshot(snapshot) => format!(
            "persist agent.conf (upgradedToVersion {}, trial {:?})",
            snapshot.upgraded_to_version,
            snapshot
                .trial
                .as_ref()
                .map(|trial| trial.binary.to_string())
        ),
        Request::CreateRecord(record) | Request::UpdateRecord { record, .. } => format!(
            "upgrade-info {} -> {}: {}, ready {:?}, done {:?}",
            record.previous_version,
            record.target_version,
            record.status,
            record.controllers_ready,
            record.controllers_done
        ),
        Request::StageBinary(plan) => format!(
            "stage {} ({} bytes, sha256 {})",
            plan.binary, plan.size_bytes, plan.sha256
        ),
        Request::RestartInto(binary) => format!("restart into {binary}"),
        Request::SetAgentVersion(version) => format!("set agent-version {version}"),
        other => lockstep_core::lifecycle::request_name(other).to_owned(),
    }
}
