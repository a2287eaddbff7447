//! Fixtures shared by the core's integration tests: a small Juju-like step registry, a
//! catalogue, and worlds of controllers at a chosen version.
#![allow(dead_code)]

use std::sync::Arc;

use lockstep_core::lifecycle::{Config, ControllerId, ControllerSet, Limits, ModelView, Snapshot};
use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream, UpgradePolicy};
use lockstep_core::steps::{Step, StepRegistry, Target};
use lockstep_core::testkit::{World, WorldSpec};
use lockstep_core::{Binary, Role, Roles, Version};

pub const V42: Version = Version::new(2, 9, 42);
pub const V43: Version = Version::new(2, 9, 43);
pub const V44: Version = Version::new(2, 9, 44);

/// One database step and one host step for 2.9.43, one more of each for 2.9.44.
pub fn registry() -> Arc<StepRegistry> {
    Arc::new(registry_of(&[
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
    ]))
}

/// A registry with the first `count` steps of [`registry`] (for smaller state spaces).
pub fn registry_of(steps: &[Step]) -> StepRegistry {
    StepRegistry::new(steps).expect("a valid registry")
}

pub fn binary(version: Version) -> Binary {
    Binary::new(version, "ubuntu", "amd64").expect("valid binary")
}

pub fn catalogue(versions: &[Version]) -> Catalogue {
    let entries = versions
        .iter()
        .map(|&version| CatalogueEntry {
            binary: binary(version),
            stream: Stream::Released,
            size_bytes: 1024,
            sha256: Sha256([version.patch as u8; 32]),
            path: format!("agents/juju-{version}-ubuntu-amd64.tgz"),
        })
        .collect();
    Catalogue::new(entries).expect("a valid catalogue")
}

pub fn controller(id: u8, running: Version) -> Config {
    Config {
        controller: Some(ControllerId(id)),
        roles: Roles::of(&[Role::Controller]),
        running: binary(running),
        limits: Limits::default(),
    }
}

/// An agent with only the host-machine role: it takes its version from the controller.
pub fn host_machine(running: Version) -> Config {
    Config {
        controller: None,
        roles: Roles::of(&[Role::HostMachine]),
        running: binary(running),
        limits: Limits::default(),
    }
}

pub fn snapshot(upgraded_to: Version) -> Snapshot {
    let mut snapshot = Snapshot::bootstrapped(&binary(upgraded_to));
    snapshot.upgraded_to_version = upgraded_to;
    // An agent that is upgrading was bootstrapped long ago.
    snapshot.bootstrap_complete = true;
    snapshot
}

/// `count` controllers that were upgraded-to `from` and now run `running`.
pub fn controllers_upgrading(
    count: u8,
    from: Version,
    running: Version,
    registry: Arc<StepRegistry>,
) -> WorldSpec {
    WorldSpec {
        registry,
        catalogue: catalogue(&[V42, V43, V44]),
        model: ModelView {
            agent_version: running,
            policy: UpgradePolicy::Off,
            stream: None,
            controllers: ControllerSet::first(count),
        },
        hosts: (0..count).map(|id| controller(id, running)).collect(),
        snapshots: (0..count).map(|_| Some(snapshot(from))).collect(),
        crashes: 0,
        expiries: 0,
    }
}

pub fn world(spec: WorldSpec) -> World {
    World::new(spec)
}
