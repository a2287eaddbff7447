//! `cachepot`: a small daemon embedding lockstep-core with its own upgrade step and its own
//! roles × capabilities → jobs table, started on 1.1.0 where 1.0.0 ran. It drives the core
//! with its poll loop and prints what it did. `cargo run -p lockstep-core --example embedded`
#![allow(clippy::print_stdout)]

use std::collections::VecDeque;

use lockstep_core::jobs::{Capabilities, Capability, Job, JobRule, JobTable};
use lockstep_core::lifecycle::request_name;
use lockstep_core::lifecycle::{Config, ControllerSet, Input, Limits, ModelView, Output, Request};
use lockstep_core::lifecycle::{RequestId, Snapshot, StagePlan, StageSource, StepOutcome};
use lockstep_core::policy::{Sha256, UpgradePolicy};
use lockstep_core::steps::{Step, StepRegistry, Target};
use lockstep_core::{Binary, Lifecycle, Millis, Role, Roles, Timestamp, Version};

const V1_1: Version = Version::new(1, 1, 0);
/// The daemon's own upgrade step: 1.1.0 keeps its cache elsewhere.
const STEP: Step = Step::host("move-cache", V1_1, &[Target::HostMachine], "move the cache");

fn main() {
    // The daemon's own table: every host serves the cache; a host with a GPU also transcodes.
    let rule = |capability: Option<&'static str>, job| JobRule {
        role: Role::HostMachine,
        capability: capability.map(|name| Capability::new(name).expect("a capability name")),
        job: Job::new(job).expect("a job name"),
    };
    let transcode = rule(Some("gpu"), "JobTranscode");
    let table = JobTable::new(vec![rule(None, "JobServeCache"), transcode.clone()]).expect("ok");
    // The host's environment has a GPU (a real daemon asks its provider).
    let capabilities = Capabilities::from_capabilities(transcode.capability).expect("one");
    let config = Config {
        controller: None,
        roles: Roles::of(&[Role::HostMachine]),
        running: Binary::new(V1_1, "ubuntu", "amd64").expect("a valid binary"),
        limits: Limits::default(),
    };
    let previous = Binary::new(Version::new(1, 0, 0), "ubuntu", "amd64").expect("a binary");
    let mut snapshot = Snapshot::bootstrapped(&previous);
    snapshot.bootstrap_complete = true; // 1.0.0 reached Ready before this restart.
    let registry = std::sync::Arc::new(StepRegistry::new(&[STEP]).expect("a valid registry"));
    let mut core = Lifecycle::new(config, registry, Some(snapshot)).expect("a valid config");
    let (mut now, mut inbox) = (Timestamp::ZERO, VecDeque::from([Input::Start]));
    // The poll loop: one input (or the deadlines passed), then drain every output.
    loop {
        match (inbox.pop_front(), core.poll_timeout()) {
            (Some(input), _) => core.handle(now, input),
            (None, Some(deadline)) => core.handle_timeout(deadline.max(now)),
            (None, None) => break, // Idle: a real daemon waits for its next event here.
        }
        while let Some(output) = core.poll_output() {
            match output {
                Output::Gate(view) => println!("{now}  gate {}", view.phase),
                Output::Status(report) if report.message.is_empty() => {}
                Output::Status(report) => println!("{now}  status {}", report.message),
                Output::Request { id, request } => inbox.push_back(execute(id, request)),
                _ => {} // An output a later lockstep-core adds: nothing this daemon acts on.
            }
        }
        now = now + Millis(1);
    }
    let jobs = table.jobs_for(core.config().roles, &capabilities);
    let (phase, upgraded_to) = (core.phase(), core.snapshot().upgraded_to_version);
    println!("cachepot {V1_1} is {phase}: upgradedToVersion {upgraded_to}, jobs {jobs:?}");
}

/// One request's I/O (in memory here; a real daemon writes agent.conf atomically), answered.
fn execute(id: RequestId, request: Request) -> Input {
    println!("        {id} {}", request_name(&request));
    match request {
        Request::PersistSnapshot(snapshot) => {
            println!("        upgradedToVersion {}", snapshot.upgraded_to_version);
            Input::Done { id }
        }
        Request::LoadModel => {
            let model = ModelView {
                agent_version: V1_1,
                policy: UpgradePolicy::Off,
                stream: None,
                controllers: ControllerSet::first(1),
            };
            Input::ModelLoaded { id, model }
        }
        Request::RunStep { key, .. } => {
            println!("        ran {key}: {}", STEP.description);
            let outcome = StepOutcome::Applied;
            Input::StepFinished { id, outcome }
        }
        Request::DesiredBinary => {
            let plan = StagePlan {
                binary: Binary::new(V1_1, "ubuntu", "amd64").expect("a valid binary"),
                size_bytes: 1,
                sha256: Sha256([0; 32]),
                source: StageSource::Controller,
            };
            Input::DesiredBinary { id, plan }
        }
        // Its controller wants it on the binary it runs: nothing to stage, no other request.
        other => panic!("a host agent on its desired version never asks {other:?}"),
    }
}
