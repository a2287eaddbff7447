//! Applications: `Application.Deploy`, `AddUnits`, `AddRelation` and `Expose`, each one
//! store transaction that honours `operation-id`.

use lockstep_store::{
    Abort, Application, EntityKind, Life, Machine, Relation, Store, StoreError, Tx, Unit,
};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::calls::{failed, list, mutate, text};
use super::machines::next_machine_id;

/// Units one `num-units` may ask for (a bound on one call's writes).
pub const UNITS_PER_CALL_MAX: u64 = 100;

/// The key of an application's store document that holds its exposure (`true` once
/// `Application.Expose` ran). The store's `Application` type has no such field: the flag
/// lives beside it in the same document, so the application's own event carries it to
/// watchers, and readers of the typed `Application` ignore it.
pub const EXPOSED_KEY: &str = "exposed";

/// True when an application document was exposed.
pub fn is_exposed(document: &Value) -> bool {
    document.get(EXPOSED_KEY).and_then(Value::as_bool) == Some(true)
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
