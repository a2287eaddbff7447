//! `Client.FullStatus`'s view of the state, and the whole state read at one revision
//! (which a watcher's first answer shows too).

use lockstep_core::Timestamp;
use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{
    AgentStatus, Application, EntityKind, Life, Machine, Model, Store, StoreError, Unit,
    machine_tag,
};
use lockstep_transport::facade::client::rfc3339;
use lockstep_transport::facade::machiner::{AGENT_DOWN, AGENT_DOWN_AFTER};
use lockstep_transport::state::{Status, detailed_status};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::applications::{base, charm_name, is_exposed};
use super::calls::{model, store_error};
use super::machines::reported_jobs;
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

/// A machine's agent status as `FullStatus` shows it, Juju's `DetailedStatus`, from what
/// its agent last reported (`Machiner.SetStatus`) at the store's clock `now`: the status,
/// message and time it reported, with lockstep's `data.phase` (and `data.download-rate`,
/// bytes per second of the download that brought its binary, when it said) and the version it reported
/// (else the one of [`machine_statuses`]); `down` (Juju's words) once the report is older
/// than [`AGENT_DOWN_AFTER`]. `None` when its agent never reported a status.
pub fn reported_agent_status(
    machine: &Machine,
    reported: Option<&AgentStatus>,
    now: Timestamp,
) -> Option<Value> {
    let reported = reported?;
    let version = reported
        .version
        .as_ref()
        .or(machine.agent_binary.as_ref())
        .map(|binary| binary.number.to_string())
        .unwrap_or_default();
    let since = rfc3339(reported.updated.0 / 1000);
    let silent = now.0.saturating_sub(reported.updated.0) > AGENT_DOWN_AFTER.as_millis() as u64;
    let (status, info) = if silent {
        AGENT_DOWN
    } else {
        (reported.status.as_str(), reported.info.as_str())
    };
    let mut detail = detailed_status(status, info, Some(&since), &version);
    if !reported.phase.is_empty() {
        detail["data"] = json!({"phase": reported.phase});
    }
    if let Some(rate) = reported.download_rate {
        detail["data"]["download-rate"] = json!(rate);
    }
    Some(detail)
}

/// `Client.FullStatus`: the state's part of the reply (the transport adds the lifecycle's),
/// each entity as Juju's status shows it.
pub fn full_status(store: &dyn Store, table: &JobTable) -> Result<Status, WireError> {
    let model = model(store)?;
    let state = read_state(store)?;
    let reports: std::collections::HashMap<&str, &AgentStatus> = state
        .agent_statuses
        .iter()
        .map(|(tag, status)| (tag.as_str(), status))
        .collect();
    let mut machines = Map::new();
    for machine in &state.machines {
        let reported = reports.get(machine_tag(&machine.id).as_str()).copied();
        machines.insert(
            machine.id.clone(),
            machine_status(machine, table, &model, reported, state.now),
        );
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
    // The record of the model's target, or a halted one (a halt holds across targets).
    let rollout = state
        .rollout
        .as_ref()
        .filter(|record| record.target == model.agent_version || record.halted.is_some())
        .map(|record| {
            let agents =
                super::rollout::agent_views(&state.machines, &state.agent_statuses, state.now);
            super::rollout::status(record, &agents)
        });
    Ok(Status {
        model_name: model.name,
        rollout,
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

fn machine_status(
    machine: &Machine,
    table: &JobTable,
    model: &Model,
    reported: Option<&AgentStatus>,
    now: Timestamp,
) -> Value {
    let jobs = reported_jobs(machine, table, &model.capabilities);
    let ((agent, agent_info, version), (instance, instance_info)) = machine_statuses(machine);
    let agent_status = reported_agent_status(machine, reported, now)
        .unwrap_or_else(|| detailed_status(agent, agent_info, None, &version));
    // An agent that reported anything runs on the machine.
    let (instance, instance_info) = if reported.is_some() {
        ("running", "")
    } else {
        (instance, instance_info)
    };
    let started = machine.agent_binary.is_some() || reported.is_some();
    let release = machine
        .agent_binary
        .as_ref()
        .or(reported.and_then(|status| status.version.as_ref()))
        .map(|binary| binary.release.as_str())
        .unwrap_or_default();
    json!({
        "id": machine.id,
        "jobs": jobs,
        "life": life(machine.life),
        "agent-status": agent_status,
        "instance-status": detailed_status(instance, instance_info, None, ""),
        "modification-status": detailed_status("idle", "", None, ""),
        "dns-name": "",
        "ip-addresses": [],
        "instance-id": if started { machine.id.as_str() } else { "" },
        "display-name": "",
        "series": "",
        "base": {"name": release, "channel": ""},
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
    /// The store's clock when the snapshot was read: "now" for agents' statuses, the same
    /// on every controller.
    pub now: Timestamp,
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
    /// Each agent's last status report, by tag.
    pub agent_statuses: Vec<(String, AgentStatus)>,
    /// The staged rollout's record, if one was written.
    pub rollout: Option<lockstep_core::rollout::Rollout>,
}

/// Reads the whole state in one snapshot.
pub fn read_state(store: &dyn Store) -> Result<State, WireError> {
    let mut state = None;
    store
        .snapshot(&mut |tx| {
            let revision = tx.revision()?;
            let now = tx.now();
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
            let agent_statuses = tx.agent_statuses()?;
            let rollout = tx.rollout()?;
            state = Some(State {
                revision,
                now,
                model,
                settings,
                machines,
                applications,
                units,
                relations,
                agent_statuses,
                rollout,
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

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::{Binary, Role, Roles};

    #[test]
    fn an_agent_is_down_once_its_report_is_older_than_agent_down_after() {
        let mut machine = Machine::with_roles("1", Roles::of(&[Role::HostMachine]));
        machine.agent_binary = Some(Binary::parse("2.9.43-ubuntu-amd64").unwrap());
        let reported = AgentStatus {
            status: "started".into(),
            info: "".into(),
            phase: "upgrading".into(),
            version: None,
            download_rate: None,
            updated: Timestamp(1_000_000),
        };
        let at = |after_ms: u64| {
            reported_agent_status(&machine, Some(&reported), Timestamp(1_000_000 + after_ms))
                .unwrap()
        };
        let limit = AGENT_DOWN_AFTER.as_millis() as u64;
        let fresh = at(limit);
        assert_eq!(fresh["status"], "started");
        assert_eq!(fresh["version"], "2.9.43");
        assert_eq!(fresh["data"], json!({"phase": "upgrading"}));
        assert_eq!(fresh["since"], "1970-01-01T00:16:40Z");
        let silent = at(limit + 1);
        assert_eq!(silent["status"], "down");
        assert_eq!(silent["info"], "agent is not communicating with the server");
        assert_eq!(silent["since"], "1970-01-01T00:16:40Z");
        assert_eq!(reported_agent_status(&machine, None, Timestamp(0)), None);
        let measured = AgentStatus {
            download_rate: Some(117_000_000),
            ..reported
        };
        let shown = reported_agent_status(&machine, Some(&measured), Timestamp(1_000_000)).unwrap();
        assert_eq!(
            shown["data"],
            json!({"phase": "upgrading", "download-rate": 117_000_000})
        );
    }
}
