//! The AllWatcher's deltas, from the store's event log: the whole state as `change`
//! deltas for a watcher's first answer, and each event after a revision as its delta, each
//! in Juju's shape (`rpc/params/multiwatcher.go`) with the fields python-libjuju's typed
//! objects read.
//!
//! | kind | id key | fields |
//! | --- | --- | --- |
//! | `model` | `model-uuid` | `name`, `life`, `owner`, `controller-uuid`, `is-controller`, `config` (always an object), `status`, `constraints`, `sla` |
//! | `machine` | `id` | `instance-id`, `agent-status`, `instance-status`, `life`, `base`, `jobs`, `addresses`, `has-vote`, `wants-vote` |
//! | `application` | `name` | `exposed`, `charm-url`, `owner-tag`, `life`, `min-units`, `constraints`, `config`, `subordinate`, `status`, `workload-version` |
//! | `unit` | `name` | `application`, `base`, `charm-url`, `life`, `public-address`, `private-address`, `machine-id`, `ports`, `port-ranges`, `principal`, `subordinate`, `workload-status`, `agent-status` |
//! | `relation` | `key` (and the integer `id`) | `endpoints`: `[{application-name, relation: {name, role, interface, optional, limit, scope}}]` |
//!
//! Statuses are Juju's `StatusInfo` (`current`, `message`, `since` when known, `version`).
//! A change of the model config's stored keys (a `settings` event) is a `model` delta;
//! charms and the API's sequences make none.

use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_store::{
    Application, ChangeKind, Changes as StoreChanges, EntityKind, Event, Machine, Model, Store,
    Unit,
};
use lockstep_transport::state::{Changes, Identity, Snapshot, status_info};
use lockstep_transport::wire::{Delta, WireError};
use serde_json::{Map, Value, json};

use super::applications::{is_exposed, object_field};
use super::calls::{MODEL_SETTINGS, store_error};
use super::machines::reported_jobs;
use super::model_config::config_of;
use super::status::{
    State, UNIT_AGENT_STATUS, WORKLOAD_STATUS, life, machine_statuses, read_state,
    relation_endpoints, relation_id,
};

/// What a delta shows besides its event: the model (for machines' jobs and the model's
/// own delta), the model config's stored keys, and who the model and controller are.
#[derive(Debug)]
pub struct Context<'a> {
    pub ids: &'a Identity,
    pub table: &'a JobTable,
    pub model: Option<&'a Model>,
    pub settings: &'a Map<String, Value>,
}

/// The whole state as deltas, read in one snapshot: a watcher's first answer.
pub fn snapshot(
    store: &dyn Store,
    table: &JobTable,
    ids: &Identity,
) -> Result<Snapshot, WireError> {
    let state = read_state(store)?;
    let deltas = snapshot_deltas(&state, ids, table);
    Ok(Snapshot {
        revision: state.revision,
        deltas,
    })
}

/// The deltas of the events after `after` (at most `limit` events read), with their
/// revisions and the revision the answer is up to date with. A `model` delta for a model
/// event shows the config's stored keys as read with the page.
pub fn changes_since(
    store: &dyn Store,
    table: &JobTable,
    ids: &Identity,
    after: Revision,
    limit: usize,
) -> Result<Changes, WireError> {
    match store.changes_since(after, limit).map_err(store_error)? {
        StoreChanges::Events { events, current } => {
            let mut read = None;
            store
                .snapshot(&mut |tx| {
                    read = Some((tx.model()?, super::model_config::settings(tx)?));
                    Ok(())
                })
                .map_err(store_error)?;
            let (model, settings) = read.expect("the snapshot body ran");
            let context = Context {
                ids,
                table,
                model: model.as_ref(),
                settings: &settings,
            };
            // A full page stops at its last event; a short one is up to date with `current`.
            let reached = if events.len() == limit {
                events.last().map_or(current, |event| event.revision)
            } else {
                current
            };
            let deltas = events
                .iter()
                .filter_map(|event| {
                    delta(event, &context).map(|delta| Delta {
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

/// The model's delta: its config is always an object (python-libjuju reads
/// `config["mode"]` from it at once).
fn model_delta(model: &Model, settings: &Map<String, Value>, ids: &Identity) -> Value {
    let config = config_of(model.clone(), settings.clone()).values();
    json!({"model-uuid": model.uuid, "name": model.name, "life": "alive", "owner": "admin",
           "controller-uuid": ids.controller_uuid, "is-controller": true,
           "config": config,
           "status": status_info("available", "", None, ""),
           "constraints": {}, "sla": {"level": "unsupported", "owner": "admin"},
           "agent-version": model.agent_version.to_string()})
}

/// One AllWatcher delta, `[kind, "change"|"remove", entity]`, for an event of the log;
/// `None` for kinds clients do not watch (the upgrade-info record, step checkpoints,
/// charms, sequences).
pub fn delta(event: &Event, context: &Context<'_>) -> Option<Value> {
    let change = match event.change {
        ChangeKind::Change => "change",
        ChangeKind::Remove => "remove",
    };
    let entity = &event.entity;
    let model_uuid = context.ids.model_uuid.as_str();
    let (kind, value) = match event.kind {
        EntityKind::Machine => {
            let machine: Machine = serde_json::from_value(entity.clone()).ok()?;
            let jobs: Vec<String> = context
                .model
                .map(|model| reported_jobs(&machine, context.table, &model.capabilities))
                .unwrap_or_default();
            let ((agent, agent_info, version), (instance, instance_info)) =
                machine_statuses(&machine);
            let instance_id = if machine.agent_binary.is_some() {
                machine.id.clone()
            } else {
                String::new()
            };
            (
                "machine",
                json!({"model-uuid": model_uuid, "id": machine.id, "instance-id": instance_id,
                       "agent-status": status_info(agent, agent_info, None, &version),
                       "instance-status": status_info(instance, instance_info, None, ""),
                       "life": life(machine.life), "base": "", "series": "",
                       "container-type": "", "supported-containers": null,
                       "supported-containers-known": false, "hardware-characteristics": {},
                       "jobs": jobs, "addresses": [], "has-vote": false, "wants-vote": false}),
            )
        }
        EntityKind::Application => {
            let application: Application = serde_json::from_value(entity.clone()).ok()?;
            let since = entity["since"].as_str();
            (
                "application",
                json!({"model-uuid": model_uuid, "name": application.name,
                       "exposed": is_exposed(entity), "charm-url": application.charm,
                       "owner-tag": "", "life": life(application.life), "min-units": 0,
                       "constraints": object_field(entity, "constraints"),
                       "config": object_field(entity, "config"), "subordinate": false,
                       "status": status_info(WORKLOAD_STATUS.0, WORKLOAD_STATUS.1, since, ""),
                       "workload-version": ""}),
            )
        }
        EntityKind::Unit => {
            let unit: Unit = serde_json::from_value(entity.clone()).ok()?;
            let since = entity["since"].as_str();
            (
                "unit",
                json!({"model-uuid": model_uuid, "name": unit.name, "application": unit.application,
                       "base": "", "series": "", "charm-url": "", "life": life(unit.life),
                       "public-address": "", "private-address": "",
                       "machine-id": unit.machine.unwrap_or_default(), "ports": [], "port-ranges": [],
                       "principal": "", "subordinate": false,
                       "workload-status": status_info(WORKLOAD_STATUS.0, WORKLOAD_STATUS.1, since, ""),
                       "agent-status": status_info(UNIT_AGENT_STATUS.0, UNIT_AGENT_STATUS.1, since, "")}),
            )
        }
        EntityKind::Relation => (
            "relation",
            json!({"model-uuid": model_uuid, "key": entity["key"], "id": relation_id(entity),
                   "endpoints": relation_endpoints(entity)}),
        ),
        EntityKind::Model => {
            let model: Model = serde_json::from_value(entity.clone()).ok()?;
            ("model", model_delta(&model, context.settings, context.ids))
        }
        EntityKind::Settings if event.id == MODEL_SETTINGS => {
            let model = context.model?;
            let settings = match (event.change, entity) {
                (ChangeKind::Change, Value::Object(settings)) => settings.clone(),
                _ => Map::new(),
            };
            ("model", model_delta(model, &settings, context.ids))
        }
        EntityKind::Settings | EntityKind::Charm | EntityKind::UpgradeInfo | EntityKind::Step => {
            return None;
        }
    };
    // A model's settings are never removed with it: its delta is always a change.
    let change = if kind == "model" { "change" } else { change };
    Some(json!([kind, change, value]))
}

/// The whole state as `change` deltas, in Juju's order (model, machines, applications,
/// units, relations): a watcher's first answer.
pub fn snapshot_deltas(state: &State, ids: &Identity, table: &JobTable) -> Vec<Value> {
    let context = Context {
        ids,
        table,
        model: state.model.as_ref(),
        settings: &state.settings,
    };
    let entities = state
        .model
        .iter()
        .map(|model| {
            (
                EntityKind::Model,
                serde_json::to_value(model).expect("models serialise"),
            )
        })
        .chain(state.machines.iter().map(|machine| {
            (
                EntityKind::Machine,
                serde_json::to_value(machine).expect("machines serialise"),
            )
        }))
        .chain(
            state
                .applications
                .iter()
                .map(|(_, document)| (EntityKind::Application, document.clone())),
        )
        .chain(
            state
                .units
                .iter()
                .map(|(_, document)| (EntityKind::Unit, document.clone())),
        )
        .chain(
            state
                .relations
                .iter()
                .map(|document| (EntityKind::Relation, document.clone())),
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
            delta(&event, &context)
        })
        .collect()
}
