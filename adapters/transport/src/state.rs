//! The controller's shared state as the facades need it: [`SharedState`], one method per
//! state call the server serves. The transport defines it and never implements it over a
//! store: the agent does (over `lockstep-store`), tests do in memory. Errors are already
//! the wire's ([`WireError`]): the implementation names what went wrong as Juju would.
//!
//! Mutating calls take their params as the wire has them and answer the wire's result,
//! because a call with an `operation-id` (CONTRACT.md, "Client operations") must commit
//! its writes and its recorded result together, and replay that result byte for byte.

use async_trait::async_trait;
use lockstep_core::lifecycle::Revision;
use lockstep_core::policy::{Catalogue, Stream};
use lockstep_core::{Binary, Roles, Version};
use serde_json::{Map, Value};

use crate::charm::Charm;
use crate::wire::{Delta, WireError};

/// The shared state behind the facades. Object-safe: the server holds an
/// `Arc<dyn SharedState>`.
#[async_trait]
pub trait SharedState: Send + Sync + 'static {
    // --- Client, ModelConfig, ModelManager: reads ---------------------------------------

    /// `Client.FullStatus`'s view of the state (the server adds the lifecycle's part).
    async fn status(&self) -> Result<Status, WireError>;
    /// The model's config: `ModelConfig.ModelGet` (and `Client.ModelGet`) and
    /// `ModelManager.ModelInfo`. `not found` before bootstrap created the model.
    async fn model_config(&self) -> Result<ModelConfig, WireError>;
    /// The model's `agent-stream` (`None`: the default, also before the model exists), for
    /// `Client.FindTools` and the tools endpoint.
    async fn agent_stream(&self) -> Result<Option<Stream>, WireError>;

    // --- Client and Application: writes, each honouring `operation-id` ------------------

    /// `Client.AddMachines {"params": [{"jobs": [...]}, ...]}`.
    async fn add_machines(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.Deploy {"applications": [{"application", "charm-url", "num-units"}]}`.
    async fn deploy(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.AddUnits {"application", "num-units"}`.
    async fn add_units(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.AddRelation {"endpoints": [a, b]}`.
    async fn add_relation(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.Expose {"application"}`.
    async fn expose(&self, params: &Value) -> Result<Value, WireError>;
    /// `MachineManager.DestroyMachineWithParams {"machine-tags", "force", "keep",
    /// "dry-run"}` → `{"results": [{"info": {"machine-id", "destroyed-units", ...}} |
    /// {"error"}]}`.
    async fn destroy_machines(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.DestroyApplication {"applications": [{"application-tag", "force",
    /// "dry-run"}]}` → `{"results": [{"info": {"destroyed-units": [{"tag"}], ...}} |
    /// {"error"}]}`: the application, its units and its relations.
    async fn destroy_applications(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.DestroyUnit {"units": [{"unit-tag", "force", "dry-run"}]}` →
    /// `{"results": [{"info": {...}} | {"error"}]}`.
    async fn destroy_units(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.SetConfigs {"Args": [{"application", "config": {key: value}}]}` (the
    /// transport puts v1's `Set` in this shape) → `{"results": [{} | {"error"}]}`.
    async fn set_application_config(&self, params: &Value) -> Result<Value, WireError>;
    /// `Application.UnsetApplicationsConfig {"Args": [{"application", "options": [key]}]}`
    /// → `{"results": [{} | {"error"}]}`.
    async fn unset_application_config(&self, params: &Value) -> Result<Value, WireError>;
    /// `ModelConfig.ModelSet {"config": {key: value}}` of stored keys only (the transport
    /// keeps lockstep's own keys apart, [`crate::facade::model_config`]) → `{}`.
    async fn model_set(&self, params: &Value) -> Result<Value, WireError>;
    /// `ModelConfig.ModelUnset {"keys": [key]}` of stored keys only → `{}`.
    async fn model_unset(&self, params: &Value) -> Result<Value, WireError>;
    /// `Upgrade.ResumeRollout {}` (`lockstep upgrade-model --resume`): lifts the halt of
    /// the staged rollout of machine agents (`spec/rollout.md`) → the rollout as
    /// `model.lockstep.rollout` shows it; refused when it is not halted.
    async fn resume_rollout(&self, params: &Value) -> Result<Value, WireError>;
    /// `Upgrade.AbortRollout {}` (`lockstep upgrade-model --abort`): holds every machine
    /// agent that has not switched on the version it runs, and halts → the rollout.
    async fn abort_rollout(&self, params: &Value) -> Result<Value, WireError>;
    /// Records a charm uploaded to the charms endpoint; its URL
    /// (`local:<series>/<name>-<revision>`, or `local:<name>-<revision>` without a
    /// series). The same archive uploaded again is the same charm (its URL, nothing
    /// written); another archive of the same name gets the next revision.
    async fn add_charm(&self, charm: &Charm, series: Option<&str>) -> Result<String, WireError>;

    // --- Application: reads --------------------------------------------------------------

    /// `Application.Get {"application"}` → Juju's `ApplicationGetResults`: `application`,
    /// `charm`, `base`, `channel`, `constraints`, `endpoint-bindings`, `config` (each
    /// option `{value?, default?, source, type, description}`), `application-config`.
    async fn application_get(&self, application: &str) -> Result<Value, WireError>;

    // --- Upgrader ----------------------------------------------------------------------

    /// `Upgrader.DesiredVersion` and `Upgrader.Tools`: for each of `tags` (in order) the
    /// version that agent should run and the binary it runs, read in one snapshot. `owner`
    /// is the logged-in agent's tag: it may ask about itself only (others get
    /// [`WireError::permission_denied`]); `server_version` is this API server's own.
    async fn agent_views(
        &self,
        owner: &str,
        server_version: Version,
        tags: &[String],
    ) -> Result<AgentViews, WireError>;
    /// `Upgrader.SetTools {"agent-tools": [{"tag", "tools": {"version"}}]}`: records the
    /// binary each agent (`owner` only) runs; honours `operation-id`.
    async fn set_tools(&self, owner: &str, params: &Value) -> Result<Value, WireError>;

    // --- ModelConfig.ModelSet: the agent-version ----------------------------------------

    /// Whether the model's agent-version may move to `version`, checked before the
    /// catalogue is asked: unchanged, allowed (with the model's `agent-stream`), or
    /// refused (an upgrade-info record is current, or a downgrade) as Juju refuses it.
    async fn agent_version_change(&self, version: Version)
    -> Result<AgentVersionChange, WireError>;
    /// Writes the model's agent-version as an operator's change, decided by the core's rule
    /// (`lockstep_core::upgrader::AgentVersionCheck::operator(catalogue)`: no upgrade-info
    /// record current, no downgrade, a binary of `version` in `catalogue` for the model's
    /// streams; with `agents_current`, also every agent on the model's version, read in the
    /// same transaction) atomically with the write; a refusal carries the rule's message and
    /// code.
    async fn set_agent_version(
        &self,
        version: Version,
        catalogue: &Catalogue,
        agents_current: bool,
    ) -> Result<(), WireError>;

    // --- AllWatcher --------------------------------------------------------------------

    /// The whole state as `change` deltas, in Juju's order (model, machines, applications,
    /// units, relations), at one revision: a watcher's first answer.
    async fn snapshot(&self, ids: &Identity) -> Result<Snapshot, WireError>;
    /// The deltas of the events after `after`, at most `limit` events read, each with its
    /// revision; or "resync needed" when events after `after` were compacted away.
    async fn changes_since(
        &self,
        ids: &Identity,
        after: Revision,
        limit: usize,
    ) -> Result<Changes, WireError>;
    /// Returns once the state may have changed after `after`: at once when a write made
    /// through this implementation is above it, else on the next such write or after the
    /// implementation's poll interval (for writers it does not hear). Spurious returns are
    /// harmless: the caller reads [`SharedState::changes_since`] again.
    async fn wait_for_change(&self, after: Revision);

    /// The state's revision now: the last change any controller committed. A
    /// `NotifyWatcher.Next` reads it after each wake-up ([`SharedState::wait_for_change`]) and
    /// reads its agent's view again only when it moved.
    async fn revision(&self) -> Result<Revision, WireError>;

    // --- Authentication ----------------------------------------------------------------

    /// The roles of machine `machine_id` (a legacy machine's jobs read as roles), `None`
    /// when there is no such machine: an agent logs in only for a machine that exists, as a
    /// controller agent when it has [`lockstep_core::Role::Controller`].
    async fn machine_roles(&self, machine_id: &str) -> Result<Option<Roles>, WireError>;
    /// The argon2id hash (PHC form) of agent `tag`'s password (`machine-1`), `None` when no
    /// controller issued it one. Read from the shared state at every login, so that any
    /// controller admits an agent whose password any controller issued
    /// ([`SharedState::provisioning_script`]).
    async fn agent_password_hash(&self, tag: &str) -> Result<Option<String>, WireError>;

    // --- Machine agents ----------------------------------------------------------------

    /// `MachineManager.ProvisioningScript`: issues machine `request.machine_id`'s agent a
    /// fresh random password, stores only its hash (replacing any earlier one, which stops
    /// working), and answers the POSIX `sh` script that writes the agent's `agent.conf`
    /// (with that password) under `request.data_dir`. Refused for a machine that does not
    /// exist (`not found`) or is a controller (`bad request`), naming it. Not recorded under
    /// an `operation-id`: its answer holds a secret, which no store keeps.
    async fn provisioning_script(&self, request: &Provisioning) -> Result<String, WireError>;
    /// `Agent.GetEntities`: for each machine id (in order; the transport has checked that the
    /// agent asks about itself), its life, its jobs (the core's rule over its roles and the
    /// model's capabilities) and container type, or the error Juju answers for it
    /// (`machine 1 not found`, code `not found`).
    async fn agent_entities(
        &self,
        machine_ids: &[String],
    ) -> Result<Vec<Result<AgentEntity, WireError>>, WireError>;
    /// `Machiner.SetStatus`: records each report (in order; the transport has checked them
    /// and that each agent reports on itself) as its agent's status, stamped with the
    /// store's clock, replacing the previous one. A status is no change clients watch: no
    /// delta, no wake-up of watchers. An unknown machine gets `not found` in its result.
    async fn set_agent_statuses(
        &self,
        reports: &[AgentStatusReport],
    ) -> Result<Vec<Result<(), WireError>>, WireError>;

    // --- The fleet, for /metrics -----------------------------------------------------

    /// The machine agents (no controllers) by the version and phase they last reported
    /// (`down` for one silent past `AGENT_DOWN_AFTER`), and the staged rollout's counts.
    async fn fleet(&self) -> Result<Fleet, WireError>;
}

/// The most distinct versions [`Fleet::agents`] names; more are counted under `other`, so
/// that `/metrics`' label cardinality stays bounded.
pub const FLEET_VERSIONS_MAX: usize = 16;

/// What `/metrics` shows of the machine agents (`lockstep_machine_agents`,
/// `lockstep_rollout_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Agents by (version, phase): at most [`FLEET_VERSIONS_MAX`] versions and `other`.
    pub agents: std::collections::BTreeMap<(String, String), u64>,
    /// The rollout of the model's agent-version (or a halted one), if one is recorded.
    pub rollout: Option<RolloutGauges>,
}

/// A rollout's counts for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutGauges {
    /// Its target version.
    pub target: String,
    /// `rolling-out`, `halted` or `done`.
    pub state: String,
    pub agents: u64,
    pub admitted: u64,
    pub on_target: u64,
    pub failed: u64,
    pub held: u64,
    /// Agents told to fetch the target ahead of their admission (`stage-version`).
    pub fetching_ahead: u64,
}

/// What `MachineManager.ProvisioningScript` asks of the state: Juju's params and what only
/// the transport knows of the controller (its identity, the address the caller reached, its
/// CA and its own version), which go into the agent's `agent.conf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provisioning {
    /// `machine-id`: the machine whose agent is provisioned (`1`).
    pub machine_id: String,
    /// `nonce`: Juju's provisioning nonce; accepted, not recorded (logins do not check it).
    pub nonce: String,
    /// `data-dir`: the agent's data directory on the machine, an absolute path.
    pub data_dir: String,
    /// `disable-package-commands`: accepted; the script runs no package commands anyway.
    pub disable_package_commands: bool,
    /// The model and controller, `agent.conf`'s `model` and `controller`.
    pub identity: Identity,
    /// `agent.conf`'s `apiaddresses`: the `host:port` the caller reached this API at.
    pub api_addresses: Vec<String>,
    /// `agent.conf`'s `cacert`: the controller's CA certificate (PEM).
    pub ca_pem: String,
    /// `agent.conf`'s `upgradedToVersion`: this controller's running version.
    pub server_version: Version,
}

/// One entity of `Agent.GetEntities`, Juju's `AgentGetEntitiesResult` without its error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEntity {
    /// `alive`, `dying` or `dead`.
    pub life: String,
    /// Juju's job names (`JobHostUnits`, `JobManageModel`, ...).
    pub jobs: Vec<String>,
    /// `lxd` for machine `0/lxd/1`; empty for a machine that is no container.
    pub container_type: String,
}

/// One entry of `Machiner.SetStatus`, checked by the transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatusReport {
    /// The agent's tag (`machine-1`): its own.
    pub tag: String,
    /// Juju's machine agent status: `started`, `stopped`, `error` or `pending`.
    pub status: String,
    /// Its message.
    pub info: String,
    /// lockstep's `data.phase`: the agent's lifecycle phase (`ready`, `upgrading`, ...);
    /// empty when not sent.
    pub phase: String,
    /// lockstep's `data.version`: the binary the agent runs, when sent.
    pub version: Option<Binary>,
    /// lockstep's `data.download-rate`: bytes per second of the agent's last binary
    /// download, first byte to last, when sent.
    pub download_rate: Option<u64>,
}

/// What `Client.FullStatus` shows of the state, each entity already as Juju's status
/// shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub model_name: String,
    /// The model's capabilities, by name (under `model.lockstep.capabilities`).
    pub capabilities: Vec<String>,
    /// Machine statuses by machine id.
    pub machines: Map<String, Value>,
    /// The staged rollout of machine agents (under `model.lockstep.rollout`), if one is
    /// recorded for the model's agent-version.
    pub rollout: Option<Value>,
    /// Application statuses (with their units) by application name.
    pub applications: Map<String, Value>,
    pub relations: Vec<Value>,
}

/// The model's config as `ModelGet` and `ModelInfo` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    pub name: String,
    pub uuid: String,
    pub agent_version: Version,
    /// `None`: the default stream (`released`).
    pub agent_stream: Option<Stream>,
    pub agent_metadata_url: Option<String>,
    /// The keys set with `ModelConfig.ModelSet` that are not the model's own fields
    /// (`logging-config`, ...), with their values as set.
    pub settings: Map<String, Value>,
}

impl ModelConfig {
    /// The whole config as values: the model's own keys (`name`, `uuid`, `type`,
    /// `agent-version`, `agent-stream`, `agent-metadata-url` when set) and the stored
    /// settings. Model deltas carry this as `config`; `ModelGet` adds each key's source.
    pub fn values(&self) -> Map<String, Value> {
        let mut config = self.settings.clone();
        config.insert("name".into(), Value::from(self.name.as_str()));
        config.insert("uuid".into(), Value::from(self.uuid.as_str()));
        config.insert("type".into(), Value::from(MODEL_PROVIDER_TYPE));
        config.insert(
            "agent-version".into(),
            Value::from(self.agent_version.to_string()),
        );
        config.insert(
            "agent-stream".into(),
            Value::from(
                self.agent_stream
                    .map_or("released", |stream| stream.as_str()),
            ),
        );
        if let Some(url) = &self.agent_metadata_url {
            config.insert("agent-metadata-url".into(), Value::from(url.as_str()));
        }
        config
    }
}

/// The model config's `type` and `ModelInfo`'s `provider-type`: lockstep's own provider.
pub const MODEL_PROVIDER_TYPE: &str = "lockstep";

/// The model and controller the API serves, as deltas and replies name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub model_uuid: String,
    pub controller_uuid: String,
}

/// One entity of an `Upgrader.DesiredVersion` or `Upgrader.Tools` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentView {
    /// The version the agent should run (Juju's controllers-first rule).
    pub desired: Version,
    /// The binary the agent last reported running (`Upgrader.SetTools`), if any.
    pub running: Option<Binary>,
    /// The version a staged rollout tells the agent to fetch ahead of its admission
    /// (`lockstep_core::rollout::told_stage`): `stage-version` in `DesiredVersion`,
    /// `stage-tools` in `Tools`. It downloads and keeps that binary and runs `desired`.
    pub stage: Option<Version>,
}

/// What the Upgrader facade reads for a call: the model's `agent-stream` and, per entity in
/// the order asked, its view or the error Juju answers for it.
#[derive(Clone, Debug)]
pub struct AgentViews {
    pub model_stream: Option<Stream>,
    pub entities: Vec<Result<AgentView, WireError>>,
}

/// The answer to [`SharedState::agent_version_change`] when the change is not refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentVersionChange {
    /// The version is the current one already: nothing to do (Juju accepts it back).
    Unchanged,
    /// The version may be set once the catalogue has a binary of it
    /// ([`SharedState::set_agent_version`] checks that, and the rest again, as it writes).
    Allowed,
}

/// The whole state as deltas, read at `revision`.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub revision: Revision,
    pub deltas: Vec<Value>,
}

/// The answer to [`SharedState::changes_since`].
#[derive(Clone, Debug, PartialEq)]
pub enum Changes {
    /// The deltas in order (events clients do not watch left out), and the revision the
    /// answer is up to date with: the last event read when the page was full, else the
    /// state's current revision.
    Deltas {
        deltas: Vec<Delta>,
        reached: Revision,
    },
    /// Events after the asked revision were compacted through `compacted`: the watcher must
    /// start again from the whole state.
    ResyncNeeded {
        compacted: Revision,
        current: Revision,
    },
}

/// A status as `Client.FullStatus` shows it, Juju's `DetailedStatus`: `{status, info, data,
/// since?, kind, version, life}` (`since` left out when not known, as Go's `omitempty` does).
pub fn detailed_status(status: &str, info: &str, since: Option<&str>, version: &str) -> Value {
    let mut detail = serde_json::json!({"status": status, "info": info, "data": {},
                                        "kind": "", "version": version, "life": ""});
    if let Some(since) = since {
        detail["since"] = Value::from(since);
    }
    detail
}

/// A status as `AllWatcher.Next`'s deltas show it, Juju's `StatusInfo`: `{current,
/// message, since?, version}`.
pub fn status_info(current: &str, message: &str, since: Option<&str>, version: &str) -> Value {
    let mut info = serde_json::json!({"current": current, "message": message, "version": version});
    if let Some(since) = since {
        info["since"] = Value::from(since);
    }
    info
}
