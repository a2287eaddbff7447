//! `Client.FullStatus`'s view of the state, and the whole state read at one revision
//! (which a watcher's first answer shows too).

use std::collections::BTreeSet;

use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{
    Application, EntityKind, Life, Machine, Model, Relation, Store, StoreError, Tx, Unit,
};
use lockstep_transport::state::Status;
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::applications::is_exposed;
use super::calls::{model, store_error};

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

/// A relation endpoint (`application:name`) as Juju shows it.
pub fn endpoint_json(endpoint: &str) -> Value {
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

/// Juju's name of a life.
pub fn life(life: Life) -> &'static str {
    life.as_str()
}

/// Everything a status or a watcher's first snapshot shows, read at one revision.
#[derive(Debug)]
pub struct State {
    pub revision: Revision,
    pub model: Option<Model>,
    pub machines: Vec<Machine>,
    pub applications: Vec<Application>,
    /// The applications `Application.Expose` exposed, by name.
    pub exposed: BTreeSet<String>,
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
