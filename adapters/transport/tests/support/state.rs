//! A small in-memory [`SharedState`] for the transport's tests: a model, machines with
//! roles and binaries, applications with units, an event log of deltas with revisions,
//! and `operation-id`s remembered with their results. It keeps no lifecycle rule of the
//! real state (the agent's tests run the server over the real store): its desired version
//! is the model's for everyone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use lockstep_core::lifecycle::Revision;
use lockstep_core::policy::{Catalogue, Stream};
use lockstep_core::upgrader;
use lockstep_core::{Binary, Role, Roles, Version};
use lockstep_transport::charm::Charm;
use lockstep_transport::state::{
    AgentEntity, AgentStatusReport, AgentVersionChange, AgentView, AgentViews, Changes, Identity,
    ModelConfig, Provisioning, SharedState, Snapshot, Status,
};
use lockstep_transport::wire::{Delta, WireError};
use serde_json::{Map, Value, json};

#[derive(Debug, Default)]
struct Application {
    charm: String,
    exposed: bool,
    config: Map<String, Value>,
    /// Unit name and the machine it is on.
    units: Vec<(String, String)>,
}

#[derive(Debug)]
struct Inner {
    model: ModelConfig,
    /// Machines by id: roles and the binary last reported.
    machines: BTreeMap<String, (Roles, Option<Binary>)>,
    applications: BTreeMap<String, Application>,
    relations: Vec<String>,
    /// Every delta, in order; revision 1 is the model's creation.
    log: Vec<Delta>,
    /// Deltas at or below this revision were compacted away.
    compacted: u64,
    operations: HashMap<String, Value>,
    /// Charms recorded from uploads, by URL.
    charms: BTreeMap<String, Charm>,
    /// Agents' password hashes by tag.
    credentials: HashMap<String, String>,
    /// Agents' last status reports by tag.
    statuses: BTreeMap<String, AgentStatusReport>,
    /// Every `ProvisioningScript` asked, with the password issued.
    provisioned: Vec<(Provisioning, String)>,
}

impl Inner {
    fn revision(&self) -> u64 {
        self.log.last().map_or(0, |delta| delta.revision.0)
    }

    fn record(&mut self, kind: &str, entity: Value) {
        let revision = Revision(self.revision() + 1);
        self.log.push(Delta {
            revision,
            delta: json!([kind, "change", entity]),
        });
    }

    fn model_delta(&mut self) {
        let model = json!({"model-uuid": self.model.uuid, "name": self.model.name,
                           "life": "alive", "config": self.model.values(),
                           "agent-version": self.model.agent_version.to_string()});
        self.record("model", model);
    }

    fn remove(&mut self, kind: &str, entity: Value) {
        let revision = Revision(self.revision() + 1);
        self.log.push(Delta {
            revision,
            delta: json!([kind, "remove", entity]),
        });
    }

    fn add_machine(&mut self, roles: Roles) -> String {
        let id = self.machines.len().to_string();
        self.machines.insert(id.clone(), (roles, None));
        self.record("machine", json!({"id": id, "life": "alive"}));
        id
    }

    fn add_units(&mut self, application: &str, count: u64) -> Vec<String> {
        let mut names = Vec::new();
        for _ in 0..count {
            let machine = self.add_machine(Roles::of(&[Role::HostMachine]));
            let units = &mut self
                .applications
                .get_mut(application)
                .expect("exists")
                .units;
            let name = format!("{application}/{}", units.len());
            units.push((name.clone(), machine.clone()));
            self.record(
                "unit",
                json!({"name": name, "application": application, "machine-id": machine, "life": "alive"}),
            );
            names.push(name);
        }
        names
    }

    fn application_delta(&mut self, name: &str) {
        let application = &self.applications[name];
        let entity = json!({"name": name, "charm-url": application.charm, "life": "alive",
                            "exposed": application.exposed, "config": application.config});
        self.record("application", entity);
    }
}

/// The test state; see the module doc.
#[derive(Debug)]
pub struct FakeState {
    inner: Mutex<Inner>,
    changed: tokio::sync::Notify,
    /// While set, `AddMachines` commits and then never answers: a worker that dies between
    /// its commit and its reply.
    pub stall_after_commit: std::sync::atomic::AtomicBool,
    /// How long each read of an agent's password hash takes (blocking its thread).
    pub hash_read_delay: Mutex<std::time::Duration>,
    /// Reads of agents' password hashes: in flight now, at most at once, and in all.
    pub hash_reads: Mutex<(usize, usize, usize)>,
}

fn bad(message: String) -> WireError {
    WireError::new("bad request", message)
}

fn list(params: &Value, key: &str) -> Result<Vec<Value>, WireError> {
    params
        .get(key)
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| bad(format!("params.{key} must be a list")))
}

fn text<'a>(value: &'a Value, key: &str) -> Result<&'a str, WireError> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .ok_or_else(|| bad(format!("{key} must be a non-empty string")))
}

impl FakeState {
    /// A state holding `model` only.
    pub fn new(model: ModelConfig) -> FakeState {
        let mut inner = Inner {
            model,
            machines: BTreeMap::new(),
            applications: BTreeMap::new(),
            relations: Vec::new(),
            log: Vec::new(),
            compacted: 0,
            operations: HashMap::new(),
            charms: BTreeMap::new(),
            credentials: HashMap::new(),
            statuses: BTreeMap::new(),
            provisioned: Vec::new(),
        };
        inner.model_delta();
        FakeState {
            inner: Mutex::new(inner),
            changed: tokio::sync::Notify::new(),
            stall_after_commit: std::sync::atomic::AtomicBool::new(false),
            hash_read_delay: Mutex::new(std::time::Duration::ZERO),
            hash_reads: Mutex::new((0, 0, 0)),
        }
    }

    /// The model's config now.
    pub fn model(&self) -> ModelConfig {
        self.inner.lock().unwrap().model.clone()
    }

    /// The revision of the last change.
    pub fn revision(&self) -> Revision {
        Revision(self.inner.lock().unwrap().revision())
    }

    /// Adds a machine with `roles` (as a provisioner would); its id.
    pub fn add_machine(&self, roles: Roles) -> String {
        let id = self.inner.lock().unwrap().add_machine(roles);
        self.changed.notify_waiters();
        id
    }

    /// Stores agent `tag`'s password hash, as `ProvisioningScript` does.
    pub fn set_agent_password_hash(&self, tag: &str, hash: &str) {
        self.inner
            .lock()
            .unwrap()
            .credentials
            .insert(tag.to_owned(), hash.to_owned());
    }

    /// Agent `tag`'s last status report.
    pub fn agent_status(&self, tag: &str) -> Option<AgentStatusReport> {
        self.inner.lock().unwrap().statuses.get(tag).cloned()
    }

    /// Every `ProvisioningScript` asked of the state, with the password it issued.
    pub fn provisioned(&self) -> Vec<(Provisioning, String)> {
        self.inner.lock().unwrap().provisioned.clone()
    }

    /// Sets the model's agent-version as a committed change (a model delta).
    pub fn set_model_agent_version(&self, version: Version) {
        let mut inner = self.inner.lock().unwrap();
        inner.model.agent_version = version;
        inner.model_delta();
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Drops the deltas at or below `through`.
    pub fn compact(&self, through: Revision) {
        self.inner.lock().unwrap().compacted = through.0;
    }

    /// A write: once, under `operation-id` when the params carry one.
    fn mutate(
        &self,
        params: &Value,
        body: impl FnOnce(&mut Inner) -> Result<Value, WireError>,
    ) -> Result<Value, WireError> {
        let mut inner = self.inner.lock().unwrap();
        let operation = params.get("operation-id").and_then(Value::as_str);
        if let Some(result) = operation.and_then(|id| inner.operations.get(id)) {
            return Ok(result.clone());
        }
        let result = body(&mut inner)?;
        if let Some(id) = operation {
            inner.operations.insert(id.to_owned(), result.clone());
        }
        drop(inner);
        self.changed.notify_waiters();
        Ok(result)
    }
}

#[async_trait]
impl SharedState for FakeState {
    async fn status(&self) -> Result<Status, WireError> {
        let inner = self.inner.lock().unwrap();
        let machines: Map<String, Value> = inner
            .machines
            .iter()
            .map(|(id, (_, binary))| {
                let version = binary.as_ref().map(|binary| binary.number.to_string());
                (
                    id.clone(),
                    json!({"id": id, "agent-status": {"version": version.unwrap_or_default()}}),
                )
            })
            .collect();
        let applications: Map<String, Value> = inner
            .applications
            .iter()
            .map(|(name, application)| {
                let units: Map<String, Value> = application
                    .units
                    .iter()
                    .map(|(unit, machine)| (unit.clone(), json!({"machine": machine})))
                    .collect();
                (name.clone(), json!({"charm": application.charm, "exposed": application.exposed, "units": units}))
            })
            .collect();
        Ok(Status {
            model_name: inner.model.name.clone(),
            capabilities: Vec::new(),
            machines,
            rollout: None,
            applications,
            relations: inner
                .relations
                .iter()
                .map(|key| json!({"key": key}))
                .collect(),
        })
    }

    async fn model_config(&self) -> Result<ModelConfig, WireError> {
        Ok(self.model())
    }

    async fn agent_stream(&self) -> Result<Option<Stream>, WireError> {
        Ok(self.model().agent_stream)
    }

    async fn add_machines(&self, params: &Value) -> Result<Value, WireError> {
        let count = params
            .get("params")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("params.params must be a list".into()))?
            .len();
        let result = self.mutate(params, |inner| {
            let machines: Vec<Value> = (0..count)
                .map(|_| json!({"machine": inner.add_machine(Roles::of(&[Role::HostMachine]))}))
                .collect();
            Ok(json!({"machines": machines}))
        });
        if self
            .stall_after_commit
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return std::future::pending().await;
        }
        result
    }

    async fn deploy(&self, params: &Value) -> Result<Value, WireError> {
        let requested = params
            .get("applications")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("params.applications must be a list".into()))?;
        let mut plans = Vec::new();
        for application in requested {
            let name = text(application, "application")?.to_owned();
            let charm = text(application, "charm-url")?.to_owned();
            let units = application
                .get("num-units")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            plans.push((name, charm, units));
        }
        self.mutate(params, |inner| {
            let mut results = Vec::new();
            for (name, charm, units) in plans {
                if inner.applications.contains_key(&name) {
                    let error = WireError::new(
                        "already exists",
                        format!("application {name:?} already exists"),
                    );
                    results.push(json!({"error": error.result_json()}));
                    continue;
                }
                inner.applications.insert(
                    name.clone(),
                    Application {
                        charm,
                        ..Application::default()
                    },
                );
                inner.application_delta(&name);
                inner.add_units(&name, units);
                results.push(json!({}));
            }
            Ok(json!({"results": results}))
        })
    }

    async fn add_units(&self, params: &Value) -> Result<Value, WireError> {
        let application = text(params, "application")?.to_owned();
        let count = params.get("num-units").and_then(Value::as_u64).unwrap_or(1);
        self.mutate(params, |inner| {
            if !inner.applications.contains_key(&application) {
                return Err(WireError::new(
                    "not found",
                    format!("application {application:?} not found"),
                ));
            }
            Ok(json!({"units": inner.add_units(&application, count)}))
        })
    }

    async fn add_relation(&self, params: &Value) -> Result<Value, WireError> {
        let mut endpoints: Vec<String> = params
            .get("endpoints")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("params.endpoints must be a list".into()))?
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        endpoints.sort();
        let key = endpoints.join(" ");
        self.mutate(params, |inner| {
            inner.relations.push(key.clone());
            inner.record("relation", json!({"key": key, "endpoints": endpoints}));
            Ok(json!({"endpoints": {}}))
        })
    }

    async fn expose(&self, params: &Value) -> Result<Value, WireError> {
        let name = text(params, "application")?.to_owned();
        self.mutate(params, |inner| {
            let application = inner.applications.get_mut(&name).ok_or_else(|| {
                WireError::new("not found", format!("application {name:?} not found"))
            })?;
            if !application.exposed {
                application.exposed = true;
                inner.application_delta(&name);
            }
            Ok(json!({}))
        })
    }

    async fn destroy_machines(&self, params: &Value) -> Result<Value, WireError> {
        let tags = list(params, "machine-tags")?;
        self.mutate(params, |inner| {
            let results = tags
                .iter()
                .map(|tag| {
                    let id = tag.as_str().and_then(|tag| tag.strip_prefix("machine-"));
                    match id.filter(|id| inner.machines.contains_key(*id)) {
                        Some(id) => {
                            inner.machines.remove(id);
                            inner.remove("machine", json!({"id": id}));
                            json!({"info": {"machine-id": id, "destroyed-units": []}})
                        }
                        None => json!({"error": {"message": format!("{tag} not found"), "code": "not found"}}),
                    }
                })
                .collect::<Vec<_>>();
            Ok(json!({"results": results}))
        })
    }

    async fn destroy_applications(&self, params: &Value) -> Result<Value, WireError> {
        let entries = list(params, "applications")?;
        self.mutate(params, |inner| {
            let mut results = Vec::new();
            for entry in entries {
                let tag = entry["application-tag"].as_str().unwrap_or_default();
                let name = tag.trim_start_matches("application-");
                let Some(application) = inner.applications.remove(name) else {
                    results.push(json!({"error": {"message": format!("application {name:?} not found"), "code": "not found"}}));
                    continue;
                };
                let mut destroyed = Vec::new();
                for (unit, _) in &application.units {
                    inner.remove("unit", json!({"name": unit}));
                    destroyed.push(json!({"tag": format!("unit-{}", unit.replace('/', "-"))}));
                }
                inner.remove("application", json!({"name": name}));
                results.push(json!({"info": {"destroyed-units": destroyed}}));
            }
            Ok(json!({"results": results}))
        })
    }

    async fn destroy_units(&self, params: &Value) -> Result<Value, WireError> {
        let entries = list(params, "units")?;
        self.mutate(params, |inner| {
            let mut results = Vec::new();
            for entry in entries {
                let tag = entry["unit-tag"].as_str().unwrap_or_default();
                let name = tag
                    .trim_start_matches("unit-")
                    .rsplit_once('-')
                    .map(|(application, number)| format!("{application}/{number}"))
                    .unwrap_or_default();
                let found = inner.applications.values_mut().any(|application| {
                    let before = application.units.len();
                    application.units.retain(|(unit, _)| *unit != name);
                    application.units.len() != before
                });
                if found {
                    inner.remove("unit", json!({"name": name}));
                    results.push(json!({"info": {}}));
                } else {
                    results.push(json!({"error": {"message": format!("unit {name:?} not found"), "code": "not found"}}));
                }
            }
            Ok(json!({"results": results}))
        })
    }

    async fn set_application_config(&self, params: &Value) -> Result<Value, WireError> {
        let args = list(params, "Args")?;
        self.mutate(params, |inner| {
            let mut results = Vec::new();
            for arg in args {
                let name = arg["application"].as_str().unwrap_or_default();
                let Some(application) = inner.applications.get_mut(name) else {
                    results.push(json!({"error": {"message": format!("application {name:?} not found"), "code": "not found"}}));
                    continue;
                };
                if let Some(config) = arg["config"].as_object() {
                    application.config.extend(config.clone());
                }
                inner.application_delta(name);
                results.push(json!({}));
            }
            Ok(json!({"results": results}))
        })
    }

    async fn unset_application_config(&self, params: &Value) -> Result<Value, WireError> {
        let args = list(params, "Args")?;
        self.mutate(params, |inner| {
            let mut results = Vec::new();
            for arg in args {
                let name = arg["application"].as_str().unwrap_or_default();
                let Some(application) = inner.applications.get_mut(name) else {
                    results.push(json!({"error": {"message": format!("application {name:?} not found"), "code": "not found"}}));
                    continue;
                };
                for key in arg["options"].as_array().into_iter().flatten() {
                    application.config.remove(key.as_str().unwrap_or_default());
                }
                inner.application_delta(name);
                results.push(json!({}));
            }
            Ok(json!({"results": results}))
        })
    }

    async fn model_set(&self, params: &Value) -> Result<Value, WireError> {
        let config = params
            .get("config")
            .and_then(Value::as_object)
            .cloned()
            .ok_or_else(|| bad("params.config must be an object".into()))?;
        self.mutate(params, |inner| {
            inner.model.settings.extend(config);
            inner.model_delta();
            Ok(json!({}))
        })
    }

    async fn fleet(&self) -> Result<lockstep_transport::state::Fleet, WireError> {
        Ok(lockstep_transport::state::Fleet::default())
    }

    async fn resume_rollout(&self, _params: &Value) -> Result<Value, WireError> {
        Err(bad("the fake state keeps no rollout".into()))
    }

    async fn abort_rollout(&self, _params: &Value) -> Result<Value, WireError> {
        Err(bad("the fake state keeps no rollout".into()))
    }

    async fn model_unset(&self, params: &Value) -> Result<Value, WireError> {
        let keys = list(params, "keys")?;
        self.mutate(params, |inner| {
            for key in keys {
                inner
                    .model
                    .settings
                    .remove(key.as_str().unwrap_or_default());
            }
            inner.model_delta();
            Ok(json!({}))
        })
    }

    async fn add_charm(&self, charm: &Charm, series: Option<&str>) -> Result<String, WireError> {
        let mut inner = self.inner.lock().unwrap();
        if let Some((url, _)) = inner
            .charms
            .iter()
            .find(|(_, known)| known.name == charm.name && known.sha256 == charm.sha256)
        {
            return Ok(url.clone());
        }
        let revision = inner
            .charms
            .values()
            .filter(|known| known.name == charm.name)
            .count();
        let url = match series {
            Some(series) => format!("local:{series}/{}-{revision}", charm.name),
            None => format!("local:{}-{revision}", charm.name),
        };
        inner.charms.insert(url.clone(), charm.clone());
        Ok(url)
    }

    async fn application_get(&self, application: &str) -> Result<Value, WireError> {
        let inner = self.inner.lock().unwrap();
        let found = inner.applications.get(application).ok_or_else(|| {
            WireError::new(
                "not found",
                format!("application {application:?} not found"),
            )
        })?;
        let config: Map<String, Value> = found
            .config
            .iter()
            .map(|(key, value)| (key.clone(), json!({"value": value, "source": "user"})))
            .collect();
        Ok(json!({"application": application, "charm": found.charm, "config": config}))
    }

    async fn agent_views(
        &self,
        owner: &str,
        _server_version: Version,
        tags: &[String],
    ) -> Result<AgentViews, WireError> {
        let inner = self.inner.lock().unwrap();
        let entities = tags
            .iter()
            .map(|tag| {
                let id = tag.strip_prefix("machine-").filter(|_| tag == owner);
                let (_, running) = id
                    .and_then(|id| inner.machines.get(id))
                    .ok_or_else(WireError::permission_denied)?;
                Ok(AgentView {
                    desired: inner.model.agent_version,
                    running: running.clone(),
                    stage: None,
                })
            })
            .collect();
        Ok(AgentViews {
            model_stream: inner.model.agent_stream,
            entities,
        })
    }

    async fn set_tools(&self, owner: &str, params: &Value) -> Result<Value, WireError> {
        let entries = params
            .get("agent-tools")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("params.agent-tools must be a list".into()))?
            .clone();
        self.mutate(params, |inner| {
            let results = entries
                .iter()
                .map(|entry| {
                    let tag = entry.get("tag").and_then(Value::as_str).unwrap_or_default();
                    let version = entry["tools"]["version"].as_str().unwrap_or_default();
                    let machine = tag
                        .strip_prefix("machine-")
                        .filter(|_| tag == owner)
                        .and_then(|id| inner.machines.get_mut(id));
                    match (machine, Binary::parse(version)) {
                        (None, _) => json!({"error": WireError::permission_denied().result_json()}),
                        (Some(_), Err(error)) => {
                            json!({"error": bad(error.to_string()).result_json()})
                        }
                        (Some((_, running)), Ok(binary)) => {
                            *running = Some(binary);
                            json!({})
                        }
                    }
                })
                .collect::<Vec<_>>();
            Ok(json!({"results": results}))
        })
    }

    async fn agent_version_change(
        &self,
        version: Version,
    ) -> Result<AgentVersionChange, WireError> {
        // The core's rule, as the agent's implementation asks it (no upgrade-info record
        // in this fake).
        let model = self.model();
        match upgrader::agent_version_change(
            model.agent_version,
            None,
            version,
            upgrader::AgentVersionRequester::Operator,
        ) {
            Ok(upgrader::AgentVersionChange::Unchanged) => Ok(AgentVersionChange::Unchanged),
            Ok(upgrader::AgentVersionChange::Changed { .. }) => Ok(AgentVersionChange::Allowed),
            Err(refusal) => Err(WireError::new(refusal.code(), refusal.to_string())),
        }
    }

    async fn set_agent_version(
        &self,
        version: Version,
        catalogue: &Catalogue,
        agents_current: bool,
    ) -> Result<(), WireError> {
        let model = self.model();
        let mut check = upgrader::AgentVersionCheck::operator(catalogue);
        if agents_current {
            check = check.with_agents_current();
        }
        let agents: Vec<(String, Option<Version>)> = self
            .inner
            .lock()
            .unwrap()
            .machines
            .iter()
            .map(|(id, (_, running))| {
                (
                    format!("machine-{id}"),
                    running.as_ref().map(|binary| binary.number),
                )
            })
            .collect();
        let agents: Vec<upgrader::AgentRunning<'_>> = agents
            .iter()
            .map(|(tag, running)| upgrader::AgentRunning {
                tag,
                running: *running,
            })
            .collect();
        check
            .check(
                model.agent_version,
                model.agent_stream,
                None,
                version,
                &agents,
            )
            .map_err(|refusal| WireError::new(refusal.code(), refusal.to_string()))?;
        self.mutate(&Value::Null, |inner| {
            inner.model.agent_version = version;
            inner.model_delta();
            Ok(Value::Null)
        })
        .map(|_| ())
    }

    async fn snapshot(&self, _ids: &Identity) -> Result<Snapshot, WireError> {
        let inner = self.inner.lock().unwrap();
        // The latest delta of each entity, in the order entities first appeared.
        let mut latest: Vec<(String, Value)> = Vec::new();
        for delta in &inner.log {
            let entity = &delta.delta[2];
            let key = format!(
                "{}:{}",
                delta.delta[0],
                entity
                    .get("name")
                    .or(entity.get("id"))
                    .or(entity.get("key"))
                    .unwrap_or(&Value::Null)
            );
            match latest.iter_mut().find(|(seen, _)| *seen == key) {
                Some((_, value)) => *value = delta.delta.clone(),
                None => latest.push((key, delta.delta.clone())),
            }
        }
        Ok(Snapshot {
            revision: Revision(inner.revision()),
            deltas: latest.into_iter().map(|(_, delta)| delta).collect(),
        })
    }

    async fn changes_since(
        &self,
        _ids: &Identity,
        after: Revision,
        limit: usize,
    ) -> Result<Changes, WireError> {
        let inner = self.inner.lock().unwrap();
        let current = Revision(inner.revision());
        if after.0 < inner.compacted {
            return Ok(Changes::ResyncNeeded {
                compacted: Revision(inner.compacted),
                current,
            });
        }
        let deltas: Vec<Delta> = inner
            .log
            .iter()
            .filter(|delta| delta.revision > after)
            .take(limit)
            .cloned()
            .collect();
        let reached = if deltas.len() == limit {
            deltas.last().map_or(current, |delta| delta.revision)
        } else {
            current
        };
        Ok(Changes::Deltas { deltas, reached })
    }

    async fn wait_for_change(&self, after: Revision) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.revision() > after {
            return;
        }
        notified.await;
    }

    async fn revision(&self) -> Result<Revision, WireError> {
        Ok(FakeState::revision(self))
    }

    async fn agent_password_hash(&self, tag: &str) -> Result<Option<String>, WireError> {
        {
            let mut reads = self.hash_reads.lock().unwrap();
            reads.0 += 1;
            reads.1 = reads.1.max(reads.0);
            reads.2 += 1;
        }
        let delay = *self.hash_read_delay.lock().unwrap();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.hash_reads.lock().unwrap().0 -= 1;
        Ok(self.inner.lock().unwrap().credentials.get(tag).cloned())
    }

    async fn provisioning_script(&self, request: &Provisioning) -> Result<String, WireError> {
        let id = &request.machine_id;
        let roles = match self.inner.lock().unwrap().machines.get(id) {
            None => {
                return Err(WireError::new(
                    "not found",
                    format!("machine {id} not found"),
                ));
            }
            Some((roles, _)) => *roles,
        };
        if roles.contains(Role::Controller) {
            return Err(WireError::new(
                "bad request",
                format!("machine {id} is a controller"),
            ));
        }
        let mut inner = self.inner.lock().unwrap();
        let password = format!("password-{}-{}", id, inner.provisioned.len());
        let hash = lockstep_transport::auth::hash_password(&password);
        inner.credentials.insert(format!("machine-{id}"), hash);
        inner.provisioned.push((request.clone(), password.clone()));
        Ok(format!("#!/bin/sh\n# machine {id}: {password}\n"))
    }

    async fn agent_entities(
        &self,
        machine_ids: &[String],
    ) -> Result<Vec<Result<AgentEntity, WireError>>, WireError> {
        let inner = self.inner.lock().unwrap();
        let table = lockstep_core::jobs::JobTable::lockstep();
        Ok(machine_ids
            .iter()
            .map(|id| {
                let (roles, _) = inner.machines.get(id).ok_or_else(|| {
                    WireError::new("not found", format!("machine {id} not found"))
                })?;
                let stored = lockstep_core::jobs::StoredMachine::from_fields(*roles, &[])
                    .map_err(|error| WireError::new("", error.to_string()))?;
                let jobs = lockstep_core::jobs::reported_jobs(
                    &table,
                    stored,
                    &lockstep_core::jobs::Capabilities::new(),
                );
                Ok(AgentEntity {
                    life: "alive".into(),
                    jobs: jobs.iter().map(|job| job.as_str().to_owned()).collect(),
                    container_type: String::new(),
                })
            })
            .collect())
    }

    async fn set_agent_statuses(
        &self,
        reports: &[AgentStatusReport],
    ) -> Result<Vec<Result<(), WireError>>, WireError> {
        let mut inner = self.inner.lock().unwrap();
        Ok(reports
            .iter()
            .map(|report| {
                let id = report.tag.strip_prefix("machine-").unwrap_or_default();
                if !inner.machines.contains_key(id) {
                    return Err(WireError::new(
                        "not found",
                        format!("machine {id} not found"),
                    ));
                }
                inner.statuses.insert(report.tag.clone(), report.clone());
                Ok(())
            })
            .collect())
    }

    async fn machine_roles(&self, machine_id: &str) -> Result<Option<Roles>, WireError> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .machines
            .get(machine_id)
            .map(|(roles, _)| *roles))
    }
}
