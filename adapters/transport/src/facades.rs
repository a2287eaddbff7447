//! The facades that read and write the controller's state, over the store adapter. Each is
//! a blocking function (the store is synchronous); the server runs them on tokio's blocking
//! pool.
//!
//! Mutating calls honour the optional `operation-id` of `CONTRACT.md` ("Client
//! operations"), our extension carried as a top-level key of `params`: the call's writes and
//! its result commit together, and a repeat returns the recorded result without applying
//! anything again.

use lockstep_core::gate::GateView;
use lockstep_core::jobs::{Job, JobTable};
use lockstep_core::lifecycle::UpgradeInfo;
use lockstep_core::policy::Stream;
use lockstep_core::{Binary, Role, Version};
use lockstep_store::{
    Abort, Application, ChangeKind, EntityKind, Event, Life, Machine, Model, OperationOutcome,
    Relation, Store, StoreError, Tx, Unit,
};
use serde_json::{Map, Value, json};

use crate::wire::WireError;

/// Units one `num-units` may ask for (a bound on one call's writes).
pub const UNITS_PER_CALL_MAX: u64 = 100;

/// Machines one `AddMachines` may add.
pub const MACHINES_PER_CALL_MAX: usize = 100;

/// The key of an application's store document that holds its exposure (`true` once
/// `Application.Expose` ran). The store's `Application` type has no such field: the flag
/// lives beside it in the same document, so the application's own event carries it to
/// watchers, and readers of the typed `Application` ignore it.
pub const EXPOSED_KEY: &str = "exposed";

/// True when an application document was exposed.
pub fn is_exposed(document: &Value) -> bool {
    document.get(EXPOSED_KEY).and_then(Value::as_bool) == Some(true)
}

/// The lifecycle's side of status: what the store does not hold.
#[derive(Clone, Debug)]
pub struct LifecycleStatus {
    pub gate: GateView,
    pub agent_version: String,
    pub upgrade_available: Option<String>,
}

fn store_error(error: StoreError) -> WireError {
    WireError::new("", format!("controller state unavailable: {error}"))
}

fn model(store: &dyn Store) -> Result<Model, WireError> {
    store
        .load_model()
        .map_err(store_error)?
        .ok_or_else(|| WireError::new("not found", "the controller has no model yet"))
}

/// `Client.FullStatus`: a correctly typed subset of Juju's reply, with lockstep's lifecycle
/// detail under `model.lockstep`.
pub fn full_status(
    store: &dyn Store,
    table: &JobTable,
    lifecycle: &LifecycleStatus,
    now_unix_seconds: u64,
) -> Result<Value, WireError> {
    let model = model(store)?;
    let state = read_state(store)?;
    let mut machines = Map::new();
    for machine in &state.machines {
        machines.insert(machine.id.clone(), machine_status(machine, table, &model));
    }
    let mut applications = Map::new();
    for application in &state.applications {
        let mut units = Map::new();
        for unit in state
            .units
            .iter()
            .filter(|unit| unit.application == application.name)
        {
            units.insert(
                unit.name.clone(),
                json!({"machine": unit.machine.clone().unwrap_or_default(),
                       "workload-status": {"status": "unknown"},
                       "agent-status": {"status": "idle"}}),
            );
        }
        applications.insert(
            application.name.clone(),
            json!({"charm": application.charm, "life": life(application.life),
                   "exposed": state.exposed.contains(&application.name),
                   "units": units, "status": {"status": "unknown"}}),
        );
    }
    let relations: Vec<Value> = state
        .relations
        .iter()
        .enumerate()
        .map(|(index, relation)| {
            json!({"id": index, "key": relation.key, "interface": "",
                   "endpoints": relation.endpoints.iter().map(|endpoint| endpoint_json(endpoint)).collect::<Vec<_>>()})
        })
        .collect();
    let view = lifecycle.gate;
    Ok(json!({
        "model": {
            "name": model.name,
            "type": "iaas",
            "cloud-tag": "cloud-localhost",
            "version": lifecycle.agent_version,
            "available-version": lifecycle.upgrade_available.clone().unwrap_or_default(),
            "model-status": {"status": if view.phase.is_ready() { "available" } else { "busy" },
                             "info": if view.phase.is_ready() { String::new() } else { format!("upgrade in progress: {}", view.phase) }},
            "lockstep": {
                "phase": view.phase.as_str(),
                "step": view.progress.done,
                "steps": view.progress.total,
                "target-version": view.progress.target.map(|version| version.to_string()),
                "upgrade-available": lifecycle.upgrade_available,
                "capabilities": model.capabilities.iter().map(|capability| capability.as_str().to_owned()).collect::<Vec<_>>(),
            },
        },
        "machines": machines,
        "applications": applications,
        "relations": relations,
        "controller-timestamp": rfc3339(now_unix_seconds),
    }))
}

fn endpoint_json(endpoint: &str) -> Value {
    let (application, name) = endpoint.split_once(':').unwrap_or((endpoint, ""));
    json!({"application": application, "name": name, "role": "", "subordinate": false})
}

fn machine_status(machine: &Machine, table: &JobTable, model: &Model) -> Value {
    let jobs: Vec<String> = machine
        .reported_jobs(table, &model.capabilities)
        .map(|jobs| jobs.iter().map(|job| job.as_str().to_owned()).collect())
        .unwrap_or_default();
    json!({
        "id": machine.id,
        "jobs": jobs,
        "life": life(machine.life),
        "agent-status": {"status": "started", "version": machine.agent_binary.as_ref().map(|binary| binary.number.to_string()).unwrap_or_default()},
        "instance-status": {"status": "running"},
        "series": "",
        "base": {"name": "ubuntu", "channel": "22.04"},
        "containers": {},
    })
}

fn life(life: Life) -> &'static str {
    life.as_str()
}

/// Everything a status or a watcher's first snapshot shows, read at one revision.
#[derive(Debug)]
pub struct State {
    pub revision: lockstep_core::lifecycle::Revision,
    pub model: Option<Model>,
    pub machines: Vec<Machine>,
    pub applications: Vec<Application>,
    /// The applications `Application.Expose` exposed, by name.
    pub exposed: std::collections::BTreeSet<String>,
    pub units: Vec<Unit>,
    pub relations: Vec<Relation>,
}

/// Reads the whole state in one snapshot.
pub fn read_state(store: &dyn Store) -> Result<State, WireError> {
    let mut state = None;
    store
        .snapshot(&mut |tx| {
            let revision = tx.revision()?;
            let model = tx.model()?;
            let machines = tx.machines()?;
            let exposed = tx
                .documents(EntityKind::Application)?
                .into_iter()
                .filter(|(_, document)| is_exposed(document))
                .map(|(name, _)| name)
                .collect();
            let applications = documents::<Application>(tx, EntityKind::Application)?;
            let units = documents::<Unit>(tx, EntityKind::Unit)?;
            let relations = documents::<Relation>(tx, EntityKind::Relation)?;
            state = Some(State {
                revision,
                model,
                machines,
                applications,
                exposed,
                units,
                relations,
            });
            Ok(())
        })
        .map_err(store_error)?;
    Ok(state.expect("the snapshot body ran"))
}

fn documents<T: serde::de::DeserializeOwned>(
    tx: &mut dyn Tx,
    kind: EntityKind,
) -> Result<Vec<T>, StoreError> {
    tx.documents(kind)?
        .into_iter()
        .map(|(id, value)| {
            serde_json::from_value(value).map_err(|error| StoreError::Corrupt {
                path: std::path::PathBuf::from(format!("{kind} {id:?}")),
                detail: error.to_string(),
            })
        })
        .collect()
}

/// One machine, by id.
pub fn machine(store: &dyn Store, id: &str) -> Result<Option<Machine>, WireError> {
    let mut machine = None;
    store
        .snapshot(&mut |tx| {
            machine = tx.machine(id)?;
            Ok(())
        })
        .map_err(store_error)?;
    Ok(machine)
}

/// The model's `agent-stream` (`None`: the default, also before bootstrap created the
/// model).
pub fn model_stream(store: &dyn Store) -> Result<Option<Stream>, WireError> {
    Ok(store
        .load_model()
        .map_err(store_error)?
        .and_then(|model| model.agent_stream))
}

/// `ModelConfig.ModelGet` (and Juju 2.0's `Client.ModelGet`).
pub fn model_get(store: &dyn Store) -> Result<Value, WireError> {
    let model = model(store)?;
    let entry = |value: Value| json!({"value": value, "source": "model"});
    let mut config = Map::new();
    config.insert("name".into(), entry(json!(model.name)));
    config.insert("uuid".into(), entry(json!(model.uuid)));
    config.insert(
        "agent-version".into(),
        entry(json!(model.agent_version.to_string())),
    );
    config.insert(
        "agent-stream".into(),
        entry(json!(
            model
                .agent_stream
                .map(|stream| stream.as_str())
                .unwrap_or("released")
        )),
    );
    if let Some(url) = &model.agent_metadata_url {
        config.insert("agent-metadata-url".into(), entry(json!(url)));
    }
    Ok(json!({"config": config}))
}

/// `ModelManager.ModelInfo`.
pub fn model_info(store: &dyn Store, lifecycle: &LifecycleStatus) -> Result<Value, WireError> {
    let model = model(store)?;
    Ok(json!({"results": [{"result": {
        "name": model.name,
        "uuid": model.uuid,
        "type": "iaas",
        "controller-uuid": "",
        "cloud-tag": "cloud-localhost",
        "owner-tag": "user-admin",
        "life": "alive",
        "status": {"status": if lifecycle.gate.phase.is_ready() { "available" } else { "busy" }},
        "agent-version": lifecycle.agent_version,
    }}]}))
}

/// Runs a mutating call once: through `apply_operation` when the client sent an
/// `operation-id`, else in a plain transaction.
fn mutate(
    store: &dyn Store,
    params: &Value,
    body: &mut dyn FnMut(&mut dyn Tx) -> Result<Value, Abort>,
) -> Result<Value, WireError> {
    match params.get("operation-id").and_then(Value::as_str) {
        Some(operation_id) => match store
            .apply_operation(operation_id, body)
            .map_err(store_error)?
        {
            OperationOutcome::Applied(result) | OperationOutcome::Replayed(result) => Ok(result),
            OperationOutcome::Failed(message) => Err(WireError::new("", message)),
        },
        None => {
            let mut result = None;
            let outcome = store
                .transaction(None, &mut |tx| {
                    result = Some(body(tx)?);
                    Ok(())
                })
                .map_err(store_error)?;
            match outcome {
                lockstep_store::TxOutcome::Committed(_) | lockstep_store::TxOutcome::Unchanged => {
                    Ok(result.unwrap_or(Value::Null))
                }
                lockstep_store::TxOutcome::Failed(message) => Err(WireError::new("", message)),
                lockstep_store::TxOutcome::Fenced => unreachable!("client calls are not fenced"),
            }
        }
    }
}

fn list<'a>(params: &'a Value, key: &str) -> Result<&'a Vec<Value>, WireError> {
    params
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::new("bad request", format!("params.{key} must be a list")))
}

fn text<'a>(value: &'a Value, key: &str) -> Result<&'a str, WireError> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .ok_or_else(|| WireError::new("bad request", format!("{key} must be a non-empty string")))
}

fn failed(error: WireError) -> Abort {
    Abort::Failed(error.message)
}

/// `Client.AddMachines {"params": [{"jobs": [...]}, ...]}`: machines added by an older
/// client with jobs are stored with the equivalent roles (seed 004).
pub fn add_machines(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "params")?.clone();
    if requested.len() > MACHINES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} machines asked for; at most {MACHINES_PER_CALL_MAX} per call",
                requested.len()
            ),
        ));
    }
    let mut parsed = Vec::new();
    for (index, machine) in requested.iter().enumerate() {
        let jobs = machine
            .get("jobs")
            .and_then(Value::as_array)
            .map(|jobs| {
                jobs.iter()
                    .filter_map(Value::as_str)
                    .map(|job| Job::new(job.to_owned()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|error| {
                WireError::new("bad request", format!("params[{index}].jobs: {error}"))
            })?
            .unwrap_or_else(|| vec![Job::HOST_UNITS]);
        parsed.push(jobs);
    }
    mutate(store, params, &mut |tx| {
        let first = next_machine_id(tx)?;
        let mut results = Vec::new();
        for (id, jobs) in (first..).zip(&parsed) {
            let machine = Machine::from_client_jobs(id.to_string(), jobs.clone());
            tx.put_machine(&machine)?;
            results.push(json!({"machine": machine.id}));
        }
        Ok(json!({"machines": results}))
    })
}

fn next_machine_id(tx: &mut dyn Tx) -> Result<u64, StoreError> {
    Ok(tx
        .machines()?
        .iter()
        .filter_map(|machine| machine.id.parse::<u64>().ok())
        .max()
        .map_or(0, |highest| highest + 1))
}

/// `Application.Deploy {"applications": [{"application", "charm-url", "num-units"}]}`:
/// each application with its units, each unit on a new machine (as Juju places them).
pub fn deploy(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "applications")?.clone();
    let mut plans = Vec::new();
    for (index, application) in requested.iter().enumerate() {
        let name = text(application, "application")
            .map_err(|error| at(index, error))?
            .to_owned();
        let charm = text(application, "charm-url")
            .map_err(|error| at(index, error))?
            .to_owned();
        let units = application
            .get("num-units")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        if units > UNITS_PER_CALL_MAX {
            return Err(at(
                index,
                WireError::new(
                    "bad request",
                    format!("num-units {units} is over {UNITS_PER_CALL_MAX}"),
                ),
            ));
        }
        plans.push((name, charm, units));
    }
    mutate(store, params, &mut |tx| {
        let mut results = Vec::new();
        for (name, charm, units) in &plans {
            if tx.application(name)?.is_some() {
                results.push(json!({"error": {"message": format!("application {name:?} already exists"), "code": "already exists"}}));
                continue;
            }
            tx.put_application(&Application {
                name: name.clone(),
                charm: charm.clone(),
                life: Life::Alive,
            })?;
            add_units_in(tx, name, *units)?;
            results.push(json!({}));
        }
        Ok(json!({"results": results}))
    })
}

fn at(index: usize, error: WireError) -> WireError {
    WireError {
        message: format!("applications[{index}]: {}", error.message),
        ..error
    }
}

fn add_units_in(tx: &mut dyn Tx, application: &str, count: u64) -> Result<Vec<String>, Abort> {
    let mut names = Vec::new();
    let mut number = 0u64;
    let mut machine = next_machine_id(tx)?;
    while (names.len() as u64) < count {
        let name = format!("{application}/{number}");
        number += 1;
        if tx.unit(&name)?.is_some() {
            continue;
        }
        let host = Machine::with_roles(
            machine.to_string(),
            lockstep_core::Roles::of(&[lockstep_core::Role::HostMachine]),
        );
        tx.put_machine(&host)?;
        tx.put_unit(&Unit {
            name: name.clone(),
            application: application.to_owned(),
            machine: Some(host.id),
            life: Life::Alive,
        })?;
        machine += 1;
        names.push(name);
    }
    Ok(names)
}

/// `Application.AddUnits {"application", "num-units"}`.
pub fn add_units(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let application = text(params, "application")?.to_owned();
    let count = params.get("num-units").and_then(Value::as_u64).unwrap_or(1);
    if count > UNITS_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!("num-units {count} is over {UNITS_PER_CALL_MAX}"),
        ));
    }
    mutate(store, params, &mut |tx| {
        if tx.application(&application)?.is_none() {
            return Err(failed(WireError::new(
                "not found",
                format!("application {application:?} not found"),
            )));
        }
        let names = add_units_in(tx, &application, count)?;
        Ok(json!({"units": names}))
    })
}

/// `Application.AddRelation {"endpoints": ["wordpress:db", "mysql:server"]}`.
pub fn add_relation(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let endpoints: Vec<String> = list(params, "endpoints")?
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if endpoints.len() != 2 {
        return Err(WireError::new(
            "bad request",
            format!("a relation joins two endpoints, got {endpoints:?}"),
        ));
    }
    let mut sorted = endpoints.clone();
    sorted.sort();
    let key = sorted.join(" ");
    mutate(store, params, &mut |tx| {
        for endpoint in &endpoints {
            let application = endpoint.split(':').next().unwrap_or_default();
            if tx.application(application)?.is_none() {
                return Err(failed(WireError::new(
                    "not found",
                    format!("application {application:?} not found"),
                )));
            }
        }
        if tx.relation(&key)?.is_some() {
            return Err(failed(WireError::new(
                "already exists",
                format!("relation {key:?} already exists"),
            )));
        }
        tx.put_relation(&Relation {
            key: key.clone(),
            endpoints: endpoints.clone(),
            life: Life::Alive,
        })?;
        let mut result = Map::new();
        for endpoint in &endpoints {
            let (application, name) = endpoint.split_once(':').unwrap_or((endpoint, ""));
            result.insert(
                application.to_owned(),
                json!({"name": name, "role": "", "interface": ""}),
            );
        }
        Ok(json!({"endpoints": result}))
    })
}

/// `Application.Expose {"application": name}` (Juju's params; `exposed-endpoints` of newer
/// facade versions is accepted and ignored: every endpoint is exposed). Exposing an exposed
/// application changes nothing.
pub fn expose(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let application = text(params, "application")?.to_owned();
    mutate(store, params, &mut |tx| {
        let Some(mut document) = tx.document(EntityKind::Application, &application)? else {
            return Err(failed(WireError::new(
                "not found",
                format!("application {application:?} not found"),
            )));
        };
        if is_exposed(&document) {
            return Ok(json!({}));
        }
        let Some(fields) = document.as_object_mut() else {
            return Err(Abort::Store(StoreError::Decode {
                what: format!("application {application:?}"),
                detail: "the document is not a JSON object".to_owned(),
            }));
        };
        fields.insert(EXPOSED_KEY.to_owned(), Value::Bool(true));
        tx.put_document(EntityKind::Application, &application, &document)?;
        Ok(json!({}))
    })
}

/// One AllWatcher delta, `[kind, "change"|"remove", entity]`, for an event of the log;
/// `None` for kinds clients do not watch (the upgrade-info record, step checkpoints).
pub fn delta(
    event: &Event,
    model_uuid: &str,
    table: &JobTable,
    model: Option<&Model>,
) -> Option<Value> {
    let change = match event.change {
        ChangeKind::Change => "change",
        ChangeKind::Remove => "remove",
    };
    let entity = &event.entity;
    let (kind, value) = match event.kind {
        EntityKind::Machine => {
            let machine: Machine = serde_json::from_value(entity.clone()).ok()?;
            let jobs: Vec<String> = model
                .and_then(|model| machine.reported_jobs(table, &model.capabilities).ok())
                .map(|jobs| jobs.iter().map(|job| job.as_str().to_owned()).collect())
                .unwrap_or_default();
            (
                "machine",
                json!({"model-uuid": model_uuid, "id": machine.id, "jobs": jobs, "life": life(machine.life)}),
            )
        }
        EntityKind::Application => {
            let application: Application = serde_json::from_value(entity.clone()).ok()?;
            (
                "application",
                json!({"model-uuid": model_uuid, "name": application.name, "charm-url": application.charm, "life": life(application.life), "exposed": is_exposed(entity)}),
            )
        }
        EntityKind::Unit => {
            let unit: Unit = serde_json::from_value(entity.clone()).ok()?;
            (
                "unit",
                json!({"model-uuid": model_uuid, "name": unit.name, "application": unit.application, "machine-id": unit.machine.unwrap_or_default(), "life": life(unit.life)}),
            )
        }
        EntityKind::Relation => {
            let relation: Relation = serde_json::from_value(entity.clone()).ok()?;
            (
                "relation",
                json!({"model-uuid": model_uuid, "key": relation.key, "endpoints": relation.endpoints.iter().map(|endpoint| endpoint_json(endpoint)).collect::<Vec<_>>()}),
            )
        }
        EntityKind::Model => {
            let model: Model = serde_json::from_value(entity.clone()).ok()?;
            (
                "model",
                json!({"model-uuid": model.uuid, "name": model.name, "life": "alive", "agent-version": model.agent_version.to_string()}),
            )
        }
        EntityKind::UpgradeInfo | EntityKind::Step => return None,
    };
    Some(json!([kind, change, value]))
}

/// The whole state as `change` deltas, in Juju's order (model, machines, applications,
/// units, relations): a watcher's first answer.
pub fn snapshot_deltas(state: &State, model_uuid: &str, table: &JobTable) -> Vec<Value> {
    fn entity<T: serde::Serialize>(kind: EntityKind, value: &T) -> (EntityKind, Value) {
        (
            kind,
            serde_json::to_value(value).expect("store entities serialise"),
        )
    }
    let entities = state
        .model
        .iter()
        .map(|model| entity(EntityKind::Model, model))
        .chain(
            state
                .machines
                .iter()
                .map(|machine| entity(EntityKind::Machine, machine)),
        )
        .chain(state.applications.iter().map(|application| {
            let (kind, mut document) = entity(EntityKind::Application, application);
            if state.exposed.contains(&application.name) {
                document[EXPOSED_KEY] = Value::Bool(true);
            }
            (kind, document)
        }))
        .chain(
            state
                .units
                .iter()
                .map(|unit| entity(EntityKind::Unit, unit)),
        )
        .chain(
            state
                .relations
                .iter()
                .map(|relation| entity(EntityKind::Relation, relation)),
        );
    entities
        .filter_map(|(kind, entity)| {
            let event = Event {
                revision: state.revision,
                kind,
                id: String::new(),
                change: ChangeKind::Change,
                entity,
            };
            delta(&event, model_uuid, table, state.model.as_ref())
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a UNIX time (civil-from-days, proleptic Gregorian).
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let seconds = unix_seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_793_730_125), "2026-11-03T18:22:05Z");
    }
}

// ---------------------------------------------------------------------------------------
// Agents: the Upgrader facade and the agent-version
// ---------------------------------------------------------------------------------------

/// Entities one `Upgrader` call may name.
pub const ENTITIES_PER_CALL_MAX: usize = 100;

/// Juju's `state.UpgradeInProgressError`, the refusal of an agent-version change while an
/// upgrade-info record is current.
pub const AGENT_VERSION_UPGRADE_IN_PROGRESS: &str =
    "an upgrade is already in progress or the last upgrade did not complete";

/// The refusal of an agent-version change while `record` is current: Juju's message and
/// code (`upgrade in progress`, as Juju's `ServerError` maps it), with the record in
/// `error-info` (`previous-version`, `target-version`, `status`).
pub fn agent_version_refused(record: &UpgradeInfo) -> WireError {
    WireError {
        message: AGENT_VERSION_UPGRADE_IN_PROGRESS.to_owned(),
        code: lockstep_core::gate::UPGRADE_IN_PROGRESS.to_owned(),
        info: Some(json!({
            "previous-version": record.previous_version.to_string(),
            "target-version": record.target_version.to_string(),
            "status": record.status.to_string(),
        })),
    }
}

/// The machine id an agent tag names: `machine-1` → `1`, `machine-0-lxd-1` → `0/lxd/1`
/// (Juju's tag grammar); `None` for anything else.
pub fn machine_id(tag: &str) -> Option<String> {
    let id = tag.strip_prefix("machine-")?;
    let valid = !id.is_empty()
        && id
            .split('-')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric()));
    valid.then(|| id.replace('-', "/"))
}

/// True for a controller machine: its roles say so, or, for a legacy machine, its jobs
/// (`JobManageModel` and its older names) do.
pub fn is_controller(machine: &Machine) -> bool {
    let roles = if machine.roles.is_empty() {
        lockstep_core::jobs::roles_for_legacy_jobs(&machine.legacy_jobs)
    } else {
        machine.roles
    };
    roles.contains(Role::Controller)
}

/// The agent-version an agent should run, Juju's controllers-first rule
/// (`apiserver/facades/agent/upgrader`, `DesiredVersion`): a controller is told the model's
/// agent-version; any other agent only once every controller runs it (this API server,
/// `server_version`, and every controller machine by the binary it last reported), and
/// until then the version it runs itself (this server's when it has not reported one), so
/// it stays where it is while the controllers go first.
pub fn desired_version(
    model: &Model,
    machines: &[Machine],
    machine: &Machine,
    server_version: Version,
) -> Version {
    let wanted = model.agent_version;
    if is_controller(machine) {
        return wanted;
    }
    let controllers_run_it = server_version >= wanted
        && machines
            .iter()
            .filter(|other| is_controller(other))
            .all(|controller| {
                controller
                    .agent_binary
                    .as_ref()
                    .is_some_and(|binary| binary.number >= wanted)
            });
    if controllers_run_it {
        wanted
    } else {
        machine
            .agent_binary
            .as_ref()
            .map_or(server_version, |binary| binary.number)
    }
}

/// One entity of an `Upgrader.DesiredVersion` or `Upgrader.Tools` call, as the store
/// answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentView {
    /// The version the agent should run ([`desired_version`]).
    pub desired: Version,
    /// The binary the agent last reported running (`Upgrader.SetTools`), if any.
    pub running: Option<Binary>,
}

/// What the Upgrader facade reads for a call: the model's `agent-stream` and, per entity in
/// the order asked, its view or the error Juju answers for it.
#[derive(Clone, Debug)]
pub struct AgentViews {
    pub model_stream: Option<Stream>,
    pub entities: Vec<Result<AgentView, WireError>>,
}

/// Juju's `ErrPerm`: an agent asking about an entity other than itself.
pub fn permission_denied() -> WireError {
    WireError::new("unauthorized access", "permission denied")
}

/// A per-entity error as Juju's result lists carry it: `{"message", "code"}`.
pub fn error_json(error: &WireError) -> Value {
    if error.code.is_empty() {
        json!({"message": error.message})
    } else {
        json!({"message": error.message, "code": error.code})
    }
}

fn entity_tags(params: &Value, key: &str, field: &str) -> Result<Vec<String>, WireError> {
    let entities = list(params, key)?;
    if entities.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} entities asked for; at most {ENTITIES_PER_CALL_MAX} per call",
                entities.len()
            ),
        ));
    }
    Ok(entities
        .iter()
        .map(|entity| {
            entity
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect())
}

/// The machine of `tag` if `owner` (the logged-in agent's tag) may ask about it.
fn owned_machine(machines: &[Machine], owner: &str, tag: &str) -> Result<Machine, WireError> {
    if tag != owner {
        return Err(permission_denied());
    }
    let id = machine_id(tag).ok_or_else(permission_denied)?;
    machines
        .iter()
        .find(|machine| machine.id == id)
        .cloned()
        .ok_or_else(|| WireError::new("not found", format!("machine {id} not found")))
}

/// `Upgrader.DesiredVersion` and `Upgrader.Tools` params `{"entities": [{"tag"}]}`: each
/// entity's desired version and running binary, read in one snapshot. An agent may ask
/// about itself only (`owner` is its tag); others get `permission denied`.
pub fn agent_views(
    store: &dyn Store,
    owner: &str,
    server_version: Version,
    params: &Value,
) -> Result<AgentViews, WireError> {
    let tags = entity_tags(params, "entities", "tag")?;
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            read = Some((tx.model()?, tx.machines()?));
            Ok(())
        })
        .map_err(store_error)?;
    let (model, machines) = read.expect("the snapshot body ran");
    let model =
        model.ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    let entities = tags
        .iter()
        .map(|tag| {
            let machine = owned_machine(&machines, owner, tag)?;
            Ok(AgentView {
                desired: desired_version(&model, &machines, &machine, server_version),
                running: machine.agent_binary.clone(),
            })
        })
        .collect();
    Ok(AgentViews {
        model_stream: model.agent_stream,
        entities,
    })
}

/// `Upgrader.SetTools` (Juju's wire name; its Go client calls it `SetVersion`) params
/// `{"agent-tools": [{"tag", "tools": {"version": "2.9.44-ubuntu-amd64"}}]}`: records the
/// binary each agent runs on its machine. An agent may set its own only. Answers
/// `{"results": [{} | {"error"}]}`; honours `operation-id`.
pub fn set_tools(store: &dyn Store, owner: &str, params: &Value) -> Result<Value, WireError> {
    let tags = entity_tags(params, "agent-tools", "tag")?;
    let binaries: Vec<Result<Binary, WireError>> = list(params, "agent-tools")?
        .iter()
        .map(|entry| {
            let text = entry
                .get("tools")
                .and_then(|tools| tools.get("version"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            Binary::parse(text)
                .map_err(|error| WireError::new("bad request", format!("tools.version: {error}")))
        })
        .collect();
    mutate(store, params, &mut |tx| {
        let machines = tx.machines()?;
        let mut results = Vec::new();
        for (tag, binary) in tags.iter().zip(&binaries) {
            let outcome = owned_machine(&machines, owner, tag)
                .and_then(|machine| Ok((machine, binary.clone()?)));
            match outcome {
                Ok((mut machine, binary)) => {
                    if machine.agent_binary.as_ref() != Some(&binary) {
                        machine.agent_binary = Some(binary);
                        tx.put_machine(&machine)?;
                    }
                    results.push(json!({}));
                }
                Err(error) => results.push(json!({"error": error_json(&error)})),
            }
        }
        Ok(json!({"results": results}))
    })
}

/// The agent-version a `ModelConfig.ModelSet` may move to, checked against the store
/// before the catalogue is asked: `Ok(None)` when it is the current one already (nothing
/// to do, as Juju accepts the current value back), `Ok(Some(stream))` with the model's
/// `agent-stream` when it may change, refused while an upgrade-info record is current
/// (Juju's rule) and for a lower version.
pub fn agent_version_change(
    store: &dyn Store,
    version: Version,
) -> Result<Option<Option<Stream>>, WireError> {
    let current_model = model(store)?;
    let current = current_model.agent_version;
    if version == current {
        return Ok(None);
    }
    if let Some((record, _)) = store.record_view().map_err(store_error)?.current {
        return Err(agent_version_refused(&record));
    }
    if version < current {
        return Err(WireError::new(
            "not supported",
            format!(
                "cannot change agent-version from {current} to the lower version {version}: \
                 downgrades are not supported"
            ),
        ));
    }
    Ok(Some(current_model.agent_stream))
}

/// Writes the model's agent-version as an operator's change (the store checks the core's
/// rule, `lockstep_core::upgrader`, atomically with the write).
pub fn set_agent_version(store: &dyn Store, version: Version) -> Result<(), WireError> {
    use lockstep_store::{AgentVersionCheck, AgentVersionRefusal, AgentVersionSet};
    let check = AgentVersionCheck {
        requester: lockstep_core::upgrader::AgentVersionRequester::Operator,
        catalogue: None,
    };
    match store
        .set_agent_version(version, &check)
        .map_err(store_error)?
    {
        AgentVersionSet::Set { model, .. } => {
            assert_eq!(model.agent_version, version);
            Ok(())
        }
        AgentVersionSet::Refused {
            refusal: AgentVersionRefusal::UpgradeInProgress { record },
            ..
        } => Err(agent_version_refused(&record)),
        AgentVersionSet::Refused { refusal, .. } => {
            Err(WireError::new(refusal.code(), refusal.to_string()))
        }
    }
}
