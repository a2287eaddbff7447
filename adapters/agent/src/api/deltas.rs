//! The AllWatcher's deltas, from the store's event log: the whole state as `change`
//! deltas for a watcher's first answer, and each event after a revision as its delta.

use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{
    Application, ChangeKind, Changes as StoreChanges, EntityKind, Event, Machine, Model, Relation,
    Store, Unit,
};
use lockstep_transport::state::{Changes, Snapshot};
use lockstep_transport::wire::{Delta, WireError};
use serde_json::{Value, json};

use super::applications::{EXPOSED_KEY, is_exposed};
use super::calls::store_error;
use super::status::{State, endpoint_json, life, read_state};

/// The whole state as deltas, read in one snapshot: a watcher's first answer.
pub fn snapshot(
    store: &dyn Store,
    jobs: &JobTable,
    model_uuid: &str,
) -> Result<Snapshot, WireError> {
    let state = read_state(store)?;
    let deltas = snapshot_deltas(&state, model_uuid, jobs);
    Ok(Snapshot {
        revision: state.revision,
        deltas,
    })
}

/// The deltas of the events after `after` (at most `limit` events read), with their
/// revisions and the revision the answer is up to date with.
pub fn changes_since(
    store: &dyn Store,
    jobs: &JobTable,
    model_uuid: &str,
    after: Revision,
    limit: usize,
) -> Result<Changes, WireError> {
    match store.changes_since(after, limit).map_err(store_error)? {
        StoreChanges::Events { events, current } => {
            let model = store.load_model().ok().flatten();
            // A full page stops at its last event; a short one is up to date with `current`.
            let reached = if events.len() == limit {
                events.last().map_or(current, |event| event.revision)
            } else {
                current
            };
            let deltas = events
                .iter()
                .filter_map(|event| {
                    delta(event, model_uuid, jobs, model.as_ref()).map(|delta| Delta {
                        revision: event.revision,
                        delta,
                    })
                })
                .collect();
            Ok(Changes::Deltas { deltas, reached })
        }
        StoreChanges::ResyncNeeded { compacted, current } => {
            Ok(Changes::ResyncNeeded { compacted, current })
        }
    }
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
