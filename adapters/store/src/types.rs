//! What the store keeps: the model, machines, applications, units, relations, settings,
//! charms, step checkpoints, agents' reported status, and the event log's entries.

use std::fmt;

use lockstep_core::jobs::{Capabilities, Job, JobTable, Jobs, JobsError, StoredMachine};
use lockstep_core::lifecycle::{ControllerSet, ModelView, Revision};
use lockstep_core::policy::{Stream, UpgradePolicy};
use lockstep_core::{Binary, Roles, Timestamp, Version};
use serde::{Deserialize, Serialize};

/// When, and by which agent version, the environment's capabilities were discovered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Discovery {
    /// The store's clock when they were written (milliseconds since the UNIX epoch with
    /// [`crate::SystemClock`]).
    pub at: Timestamp,
    /// The agent version whose environment provider reported them.
    pub by: Version,
}

/// The model: one per store.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Model {
    pub uuid: String,
    pub name: String,
    /// `agent-version`: the version the model's agents should run.
    pub agent_version: Version,
    /// `agent-stream`, when set explicitly.
    pub agent_stream: Option<Stream>,
    /// `agent-metadata-url`, when set.
    pub agent_metadata_url: Option<String>,
    pub policy: UpgradePolicy,
    /// The provisioned controllers.
    pub controllers: ControllerSet,
    /// The environment's capabilities (seed 004), never stored on machines.
    pub capabilities: Capabilities,
    /// `None` until the provider was first asked (bootstrap).
    pub capabilities_discovered: Option<Discovery>,
    /// `upgrade-available`: a newer patch the operator may upgrade to.
    pub upgrade_available: Option<Version>,
}

impl Model {
    /// What the lifecycle core reads at start (`Request::LoadModel`).
    pub fn view(&self) -> ModelView {
        ModelView {
            agent_version: self.agent_version,
            policy: self.policy.clone(),
            stream: self.agent_stream,
            controllers: self.controllers,
        }
    }
}

/// Juju's life of an entity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Life {
    Alive,
    Dying,
    Dead,
}

impl Life {
    pub fn as_str(self) -> &'static str {
        match self {
            Life::Alive => "alive",
            Life::Dying => "dying",
            Life::Dead => "dead",
        }
    }

    pub fn parse(text: &str) -> Option<Life> {
        [Life::Alive, Life::Dying, Life::Dead]
            .into_iter()
            .find(|life| life.as_str() == text)
    }
}

/// A machine document. Written by this version with roles; documents written by an older
/// version (or read from an older schema) carry legacy jobs only.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Machine {
    /// Juju's machine id, e.g. `0`, `1/lxd/0`.
    pub id: String,
    /// What the machine is for; empty for a legacy document.
    pub roles: Roles,
    /// Jobs as an older version stored them; ignored once `roles` is not empty.
    pub legacy_jobs: Vec<Job>,
    /// The agent binary the machine's agent last reported running.
    pub agent_binary: Option<Binary>,
    pub life: Life,
}

impl Machine {
    /// A machine written by this version.
    pub fn with_roles(id: impl Into<String>, roles: Roles) -> Machine {
        Machine {
            id: id.into(),
            roles,
            legacy_jobs: Vec::new(),
            agent_binary: None,
            life: Life::Alive,
        }
    }

    /// A machine added by an older client that sends jobs: stored with the equivalent roles
    /// (`roles_for_legacy_jobs`). Jobs that imply no role are kept as legacy jobs only when
    /// no role follows from the others, so the machine is still reported as stored.
    pub fn from_client_jobs(id: impl Into<String>, jobs: Vec<Job>) -> Machine {
        let roles = lockstep_core::jobs::roles_for_legacy_jobs(&jobs);
        Machine {
            id: id.into(),
            roles,
            legacy_jobs: if roles.is_empty() { jobs } else { Vec::new() },
            agent_binary: None,
            life: Life::Alive,
        }
    }

    /// The jobs the API reports for this machine (the core's rule, never stored).
    pub fn reported_jobs(
        &self,
        table: &JobTable,
        capabilities: &Capabilities,
    ) -> Result<Jobs, JobsError> {
        let stored = StoredMachine::from_fields(self.roles, &self.legacy_jobs)?;
        Ok(lockstep_core::jobs::reported_jobs(
            table,
            stored,
            capabilities,
        ))
    }
}

/// Juju's tag of machine `id`: `machine-` and the id with `/` as `-` (`1/lxd/0` →
/// `machine-1-lxd-0`). The key of a machine agent's credential and status.
pub fn machine_tag(id: &str) -> String {
    format!("machine-{}", id.replace('/', "-"))
}

/// What an agent last reported about itself through the API ([`crate::Tx::put_agent_status`]).
/// Agents write it every few seconds, so `updated` doubles as a heartbeat: a status whose
/// `updated` is old on the store's clock is an agent that is down.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AgentStatus {
    /// Juju's agent status word: `started`, `error`, ...
    pub status: String,
    /// Juju's status message (empty when there is none).
    pub info: String,
    /// lockstep's phase, e.g. `ready`, `upgrading`.
    pub phase: String,
    /// The agent binary it says it runs.
    pub version: Option<Binary>,
    /// Bytes per second its last agent-binary download ran at (first byte to last), as it
    /// says; `None` when it did not say. The staged rollout admits slow links early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_rate: Option<u64>,
    /// The store's clock (`tx.now()`) when written.
    pub updated: Timestamp,
}

/// An application, as a deployer creates it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Application {
    pub name: String,
    /// The charm URL, e.g. `ch:amd64/jammy/mysql-42`.
    pub charm: String,
    pub life: Life,
}

/// A unit of an application, placed on a machine.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Unit {
    /// e.g. `mysql/0`.
    pub name: String,
    pub application: String,
    pub machine: Option<String>,
    pub life: Life,
}

/// A relation between application endpoints.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Relation {
    /// Juju's relation key, e.g. `wordpress:db mysql:server`.
    pub key: String,
    pub endpoints: Vec<String>,
    pub life: Life,
}

/// A database step's checkpoint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Checkpoint {
    pub key: lockstep_core::steps::StepKey,
    /// The store's clock when the step committed.
    pub completed_at: Timestamp,
}

/// The kinds of entity the event log names (Juju's AllWatcher kinds where it has them).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntityKind {
    Model,
    Machine,
    Application,
    Unit,
    Relation,
    /// The upgrade-info record (id `current`, or `archived` when a final record is archived).
    UpgradeInfo,
    /// A database step's checkpoint (id `<step>@<version>`).
    Step,
    /// Settings stored as a document (Juju's settings collection): id `model` holds the
    /// model config keys that are not the model's own fields (`logging-config`, ...).
    Settings,
    /// A charm the controller recorded (an upload of a local charm), id its URL
    /// (`local:jammy/mycharm-0`): its metadata, never its archive.
    Charm,
}

impl EntityKind {
    pub const ALL: [EntityKind; 9] = [
        EntityKind::Model,
        EntityKind::Machine,
        EntityKind::Application,
        EntityKind::Unit,
        EntityKind::Relation,
        EntityKind::UpgradeInfo,
        EntityKind::Step,
        EntityKind::Settings,
        EntityKind::Charm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Model => "model",
            EntityKind::Machine => "machine",
            EntityKind::Application => "application",
            EntityKind::Unit => "unit",
            EntityKind::Relation => "relation",
            EntityKind::UpgradeInfo => "upgrade-info",
            EntityKind::Step => "step",
            EntityKind::Settings => "settings",
            EntityKind::Charm => "charm",
        }
    }

    pub fn parse(text: &str) -> Option<EntityKind> {
        EntityKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Juju's delta verbs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    Change,
    Remove,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Change => "change",
            ChangeKind::Remove => "remove",
        }
    }

    pub fn parse(text: &str) -> Option<ChangeKind> {
        match text {
            "change" => Some(ChangeKind::Change),
            "remove" => Some(ChangeKind::Remove),
            _ => None,
        }
    }
}

/// One entry of the event log: `[kind, change|remove, entity]` with its revision.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Event {
    pub revision: Revision,
    pub kind: EntityKind,
    pub id: String,
    pub change: ChangeKind,
    /// The entity after the change; for a removal, the entity as it was.
    pub entity: serde_json::Value,
}

/// The answer to [`crate::Store::changes_since`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Changes {
    /// Every change after the revision asked for, in order, at most `limit` of them. When
    /// fewer than `limit` came back, the watcher is up to date with `current`.
    Events {
        events: Vec<Event>,
        /// The store's revision when read.
        current: Revision,
    },
    /// The revision asked for is gone: events at or below `compacted` were dropped (or the
    /// store is behind the watcher, which saw a revision it no longer has). Re-read the
    /// whole state and resume after `current`.
    ResyncNeeded {
        compacted: Revision,
        current: Revision,
    },
}

/// How a client operation with an `operation-id` ended.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum OperationOutcome {
    /// Applied now; its result is recorded with it.
    Applied(serde_json::Value),
    /// Applied before: the recorded result, nothing applied again.
    Replayed(serde_json::Value),
    /// The operation failed: nothing committed, nothing recorded (a retry may apply it).
    Failed(String),
}
