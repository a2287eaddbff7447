//! `Client.FullStatus`'s view of the state, and the whole state read at one revision
//! (which a watcher's first answer shows too).

use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{Application, EntityKind, Life, Machine, Model, Store, StoreError, Unit};
use lockstep_transport::state::{Status, detailed_status};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::applications::{base, charm_name, is_exposed};
use super::calls::{model, store_error};
use super::model_config::settings;

/// What a unit's agent status says: lockstep runs no unit agents, so none has started
/// (Juju's `allocating`: the unit's agent is not running yet).
pub const UNIT_AGENT_STATUS: (&str, &str) = ("allocating", "lockstep runs no unit agents");

/// What a unit's and an application's workload status says: lockstep runs no charms, so
/// no charm ever set one (Juju's `unknown`: the charm has not reported a status).
pub const WORKLOAD_STATUS: (&str, &str) = ("unknown", "lockstep runs no charms");

/// What a relation's status says: no unit ever joins it (Juju's `joining`).
pub const RELATION_STATUS: (&str, &str) = ("joining", "lockstep runs no charms");

/// A machine's agent and instance status: `started`/`running` once its agent reported the
/// binary it runs (`Upgrader.SetTools`, or bootstrap for the controller), with that
/// version; else `pending`, nothing having started on it yet.
pub fn machine_statuses(
    machine: &Machine,
) -> (
    (&'static str, &'static str, String),
    (&'static str, &'static str),
) {
    match &machine.agent_binary {
        Some(binary) => (("started", "", binary.number.to_string()), ("running", "")),
        None => (
            (
                "pending",
                "no lockstep agent has started on this machine",
                String::new(),
            ),
            ("pending", "lockstep has not provisioned this machine"),
        ),
    }
}

/// `Client.FullStatus`: the state's part of the reply (the transport adds the lifecycle's),
/// each entity as Juju's status shows it.
pub fn full_status(store: &dyn Store, table: &JobTable) -> Result<Status, WireError> {
    let model = model(store)?;
    let state = read_state(store)?;
    let mut machines = Map::new();
    for machine in &state.machines {
        machines.insert(machine.id.clone(), machine_status(machine, table, &model));
    }
    let mut applications = Map::new();
    for (name, document) in &state.applications {
        let application: Application = match serde_json::from_value(document.clone()) {
            Ok(application) => application,
            Err(_) => continue,
        };
        let since = document["since"].as_str();
        let mut units = Map::new();
        for (unit, unit_document) in state
            .units
            .iter()
            .filter(|(unit, _)| unit.application == *name)
        {
            let unit_since = unit_document["since"].as_str();
            units.insert(
                unit.name.clone(),
                json!({"machine": unit.machine.clone().unwrap_or_default(),
                       "workload-status": detailed_status(WORKLOAD_STATUS.0, WORKLOAD_STATUS.1, unit_since, ""),
                       "agent-status": detailed_status(UNIT_AGENT_STATUS.0, UNIT_AGENT_STATUS.1, unit_since, ""),
                       "workload-version": "", "opened-ports": [], "public-address": "",
                       "charm": "", "subordinates": {}, "leader": false}),
            );
        }
        let mut relations: Map<String, Value> = Map::new();
        for relation in &state.relations {
            let endpoints: Vec<(String, String)> = relation_endpoints(relation)
                .iter()
                .map(|detail| {
                    (
                        detail["application-name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        detail["relation"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect();
            for (_, endpoint) in endpoints.iter().filter(|(own, _)| own == name) {
                let others = relations
                    .entry(endpoint.clone())
                    .or_insert_with(|| json!([]));
                for (other, _) in endpoints.iter().filter(|(other, _)| other != name) {
                    others
                        .as_array_mut()
                        .expect("a list")
                        .push(Value::from(other.as_str()));
                }
            }
        }
        let charm = &application.charm;
        applications.insert(
            name.clone(),
            json!({"charm": charm, "charm-name": charm_name(charm),
                   "charm-rev": charm_revision(charm),
                   "charm-version": "", "charm-profile": "", "charm-channel": "",
                   "base": base(document), "life": life(application.life),
                   "exposed": is_exposed(document),
                   "relations": relations, "can-upgrade-to": "", "subordinate-to": [],
                   "units": units, "meter-statuses": {},
                   "status": detailed_status(WORKLOAD_STATUS.0, WORKLOAD_STATUS.1, since, ""),
                   "workload-version": "", "endpoint-bindings": {}, "public-address": ""}),
        );
    }
    let relations: Vec<Value> = state
        .relations
        .iter()
        .map(|relation| {
            let details = relation_endpoints(relation);
            let interface = details
                .first()
                .and_then(|detail| detail["relation"]["interface"].as_str())
                .unwrap_or_default();
            let scope = details
                .first()
                .and_then(|detail| detail["relation"]["scope"].as_str())
                .unwrap_or("global");
            json!({"id": relation_id(relation), "key": relation["key"], "interface": interface,
                   "scope": scope,
                   "endpoints": details.iter().map(|detail| json!({
                       "application": detail["application-name"],
                       "name": detail["relation"]["name"],
                       "role": detail["relation"]["role"],
                       "subordinate": false,
                   })).collect::<Vec<_>>(),
                   "status": detailed_status(RELATION_STATUS.0, RELATION_STATUS.1, relation["since"].as_str(), "")})
        })
        .collect();
    Ok(Status {
        model_name: model.name,
        capabilities: model
            .capabilities
            .iter()
            .map(|capability| capability.as_str().to_owned())
            .collect(),
        machines,
        applications,
        relations,
    })
}

/// A relation document's id (Juju's integer relation id); `-1` for a relation stored before
/// relations had ids.
pub fn relation_id(relation: &Value) -> i64 {
    relation["id"].as_i64().unwrap_or(-1)
}

/// A relation document's endpoints as Juju's deltas show them, `{application-name,
/// relation: {name, role, interface, optional, limit, scope}}`: as recorded when it was
/// made, else (a relation stored before they were) from its `app:endpoint` names, role and
/// interface unknown.
pub fn relation_endpoints(relation: &Value) -> Vec<Value> {
    if let Some(details) = relation["endpoint-details"].as_array() {
        return details.clone();
    }
    relation["endpoints"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
        .map(|endpoint| {
            let (application, name) = endpoint.split_once(':').unwrap_or((endpoint, ""));
            json!({"application-name": application,
                   "relation": {"name": name, "role": "", "interface": "", "optional": false,
                                "limit": 0, "scope": "global"}})
        })
        .collect()
}

/// The revision in a charm URL (`local:jammy/web-3` → 3), else -1.
pub fn charm_revision(url: &str) -> i64 {
    url.rsplit_once('-')
        .and_then(|(_, revision)| revision.parse().ok())
        .unwrap_or(-1)
}

fn machine_status(machine: &Machine, table: &JobTable, model: &Model) -> Value {
    let jobs: Vec<String> = machine
        .reported_jobs(table, &model.capabilities)
        .map(|jobs| jobs.iter().map(|job| job.as_str().to_owned()).collect())
        .unwrap_or_default();
    let ((agent, agent_info, version), (instance, instance_info)) = machine_statuses(machine);
    json!({
        "id": machine.id,
        "jobs": jobs,
        "life": life(machine.life),
        "agent-status": detailed_status(agent, agent_info, None, &version),
        "instance-status": detailed_status(instance, instance_info, None, ""),
        "modification-status": detailed_status("idle", "", None, ""),
        "dns-name": "",
        "ip-addresses": [],
        "instance-id": if machine.agent_binary.is_some() { machine.id.as_str() } else { "" },
        "display-name": "",
        "series": "",
        "base": {"name": machine.agent_binary.as_ref().map(|binary| binary.release.as_str()).unwrap_or_default(), "channel": ""},
        "containers": {},
        "constraints": "",
        "hardware": "",
        "has-vote": false,
        "wants-vote": false,
    })
}

/// Juju's name of a life.
pub fn life(life: Life) -> &'static str {
    life.as_str()
}

/// Everything a status or a watcher's first snapshot shows, read at one revision. The
/// application, unit and relation documents are kept whole: the facades' fields live
/// beside the store's typed ones.
#[derive(Debug)]
pub struct State {
    pub revision: Revision,
    pub model: Option<Model>,
    /// The model config's stored keys.
    pub settings: Map<String, Value>,
    pub machines: Vec<Machine>,
    /// Application documents by name.
    pub applications: Vec<(String, Value)>,
    /// Units with their documents.
    pub units: Vec<(Unit, Value)>,
    /// Relation documents.
    pub relations: Vec<Value>,
}

/// Reads the whole state in one snapshot.
pub fn read_state(store: &dyn Store) -> Result<State, WireError> {
    let mut state = None;
    store
        .snapshot(&mut |tx| {
            let revision = tx.revision()?;
            let model = tx.model()?;
            let settings = settings(tx)?;
            let machines = tx.machines()?;
            let applications = tx.documents(EntityKind::Application)?;
            let units = tx
                .documents(EntityKind::Unit)?
                .into_iter()
                .map(|(id, document)| {
                    serde_json::from_value::<Unit>(document.clone())
                        .map(|unit| (unit, document))
                        .map_err(|error| decode(EntityKind::Unit, &id, &error))
                })
                .collect::<Result<_, _>>()?;
            let relations = tx
                .documents(EntityKind::Relation)?
                .into_iter()
                .map(|(_, document)| document)
                .collect();
            state = Some(State {
                revision,
                model,
                settings,
                machines,
                applications,
                units,
                relations,
            });
            Ok(())
        })
        .map_err(store_error)?;
    Ok(state.expect("the snapshot body ran"))
}

fn decode(kind: EntityKind, id: &str, error: &serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        path: std::path::PathBuf::from(format!("{kind} {id:?}")),
        detail: error.to_string(),
    }
}
