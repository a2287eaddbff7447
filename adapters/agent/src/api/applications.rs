//! Applications, units, relations and charms: `Application.Deploy`, `AddUnits`,
//! `AddRelation`, `Expose`, `Get`, `SetConfigs`, `UnsetApplicationsConfig`,
//! `DestroyApplication`, `DestroyUnit`, and the charms endpoint's record of an upload. Each
//! write is one store transaction that honours `operation-id`.
//!
//! The store's typed `Application`, `Unit` and `Relation` hold what the lifecycle reads;
//! what the facades add lives beside those fields in the same documents, so each entity's
//! own event carries it to watchers: an application's `exposed`, `config`, `constraints`,
//! `base` and `since`; a unit's `since`; a relation's `id` and `endpoint-details`.

use lockstep_store::{
    Abort, Application, EntityKind, Life, Machine, Relation, Store, StoreError, Tx, Unit,
};
use lockstep_transport::charm::{Charm, Endpoint};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::calls::{failed, list, mutate, next_sequence, now_rfc3339, object, tag_id, text};
use super::machines::next_machine_id;

/// Units one `num-units` may ask for (a bound on one call's writes).
pub const UNITS_PER_CALL_MAX: u64 = 100;

/// Entities one destroy or config call may name.
pub const ENTITIES_PER_CALL_MAX: usize = 100;

/// Config keys one application may hold, and the size of one value.
pub const CONFIG_KEYS_MAX: usize = 1024;
pub const CONFIG_VALUE_SIZE_BYTES_MAX: usize = 64 * 1024;

/// The key of an application's store document that holds its exposure (`true` once
/// `Application.Expose` ran). The store's `Application` type has no such field: the flag
/// lives beside it in the same document, so the application's own event carries it to
/// watchers, and readers of the typed `Application` ignore it.
pub const EXPOSED_KEY: &str = "exposed";

/// True when an application document was exposed.
pub fn is_exposed(document: &Value) -> bool {
    document.get(EXPOSED_KEY).and_then(Value::as_bool) == Some(true)
}

/// A field of a document that is an object (an empty one when absent).
pub fn object_field(document: &Value, key: &str) -> Map<String, Value> {
    document
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The charm recorded under `url`, if any (only uploaded local charms are).
pub fn charm(tx: &mut dyn Tx, url: &str) -> Result<Option<Charm>, StoreError> {
    Ok(tx
        .document(EntityKind::Charm, url)?
        .and_then(|document| serde_json::from_value(document).ok()))
}

/// One application of a `Deploy`.
struct DeployPlan {
    name: String,
    charm: String,
    units: u64,
    config: Map<String, Value>,
    constraints: Value,
    base: Value,
    placement: Vec<Option<String>>,
}

/// `Application.Deploy {"applications": [{"application", "charm-url", "num-units",
/// "config", "constraints", "placement", "charm-origin"}]}` (the transport folded
/// `config-yaml` into `config`): each application with its units, each unit on the machine
/// its placement names or on a new machine (as Juju places them). A `local:` charm must
/// have been uploaded (`charm "local:..." not found` otherwise); other charm URLs are
/// recorded as given (lockstep runs no charms). Config values are checked against the
/// charm's options when it has them.
pub fn deploy(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "applications")?.clone();
    if requested.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} applications; at most {ENTITIES_PER_CALL_MAX} per call",
                requested.len()
            ),
        ));
    }
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
        plans.push(DeployPlan {
            name,
            charm,
            units,
            config: object_field(application, "config"),
            constraints: application
                .get("constraints")
                .filter(|value| value.is_object())
                .cloned()
                .unwrap_or_else(|| json!({})),
            base: application
                .get("charm-origin")
                .and_then(|origin| origin.get("base"))
                .filter(|base| base.is_object())
                .cloned()
                .unwrap_or(Value::Null),
            placement: placements(application).map_err(|error| at(index, error))?,
        });
    }
    mutate(store, params, &mut |tx| {
        let since = now_rfc3339(tx);
        let mut results = Vec::new();
        for plan in &plans {
            match deploy_one(tx, plan, &since)? {
                Ok(()) => results.push(json!({})),
                Err(error) => results.push(json!({"error": error.result_json()})),
            }
        }
        Ok(json!({"results": results}))
    })
}

fn deploy_one(
    tx: &mut dyn Tx,
    plan: &DeployPlan,
    since: &str,
) -> Result<Result<(), WireError>, Abort> {
    let name = &plan.name;
    if tx.application(name)?.is_some() {
        return Ok(Err(WireError::new(
            "already exists",
            format!("application {name:?} already exists"),
        )));
    }
    let charm = charm(tx, &plan.charm)?;
    if charm.is_none() && plan.charm.starts_with("local:") {
        return Ok(Err(WireError::new(
            "not found",
            format!("charm {:?} not found: upload it first", plan.charm),
        )));
    }
    let config = match checked_config(charm.as_ref(), &plan.config) {
        Ok(config) => config,
        Err(error) => return Ok(Err(error)),
    };
    let mut document = serde_json::to_value(Application {
        name: name.clone(),
        charm: plan.charm.clone(),
        life: Life::Alive,
    })
    .expect("applications serialise");
    document["config"] = Value::Object(config);
    document["constraints"] = plan.constraints.clone();
    document["base"] = plan.base.clone();
    document["since"] = Value::from(since);
    tx.put_document(EntityKind::Application, name, &document)?;
    if let Err(error) = add_units_in(tx, name, plan.units, &plan.placement, since)? {
        return Err(failed(error));
    }
    Ok(Ok(()))
}

fn at(index: usize, error: WireError) -> WireError {
    WireError {
        message: format!("applications[{index}]: {}", error.message),
        ..error
    }
}

/// The machine each unit goes to, in order, from `placement` (`[{"scope": "#",
/// "directive": "0"}]`, Juju's "on machine 0"); `None` for a new machine. Other scopes
/// (`lxd`, a provider's zone) are refused: lockstep makes no containers and no instances.
fn placements(params: &Value) -> Result<Vec<Option<String>>, WireError> {
    let Some(placements) = params.get("placement").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    placements
        .iter()
        .map(|placement| {
            let scope = placement.get("scope").and_then(Value::as_str).unwrap_or("");
            let directive = placement
                .get("directive")
                .and_then(Value::as_str)
                .unwrap_or("");
            match scope {
                "#" if !directive.is_empty() => Ok(Some(directive.to_owned())),
                "" if directive.is_empty() => Ok(None),
                _ => Err(WireError::new(
                    "not supported",
                    format!(
                        "lockstep places units on existing machines only (scope \"#\"), \
                         not {scope:?}:{directive:?}"
                    ),
                )),
            }
        })
        .collect()
}

/// Adds `count` units of `application`, the i-th on the machine `placement[i]` names (it
/// must exist) or on a new host machine; their names, or why they cannot be placed.
fn add_units_in(
    tx: &mut dyn Tx,
    application: &str,
    count: u64,
    placement: &[Option<String>],
    since: &str,
) -> Result<Result<Vec<String>, WireError>, Abort> {
    let mut names = Vec::new();
    let mut number = 0u64;
    let mut machine = next_machine_id(tx)?;
    while (names.len() as u64) < count {
        let name = format!("{application}/{number}");
        number += 1;
        if tx.unit(&name)?.is_some() {
            continue;
        }
        let host = match placement.get(names.len()).cloned().flatten() {
            Some(id) => {
                if tx.machine(&id)?.is_none() {
                    return Ok(Err(WireError::new(
                        "not found",
                        format!("cannot place unit {name:?}: machine {id} not found"),
                    )));
                }
                id
            }
            None => {
                let host = Machine::with_roles(
                    machine.to_string(),
                    lockstep_core::Roles::of(&[lockstep_core::Role::HostMachine]),
                );
                tx.put_machine(&host)?;
                machine += 1;
                host.id
            }
        };
        let mut document = serde_json::to_value(Unit {
            name: name.clone(),
            application: application.to_owned(),
            machine: Some(host),
            life: Life::Alive,
        })
        .expect("units serialise");
        document["since"] = Value::from(since);
        tx.put_document(EntityKind::Unit, &name, &document)?;
        names.push(name);
    }
    Ok(Ok(names))
}

/// `Application.AddUnits {"application", "num-units", "placement"}` → `{"units": [...]}`.
pub fn add_units(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let application = text(params, "application")?.to_owned();
    let count = params.get("num-units").and_then(Value::as_u64).unwrap_or(1);
    if count > UNITS_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!("num-units {count} is over {UNITS_PER_CALL_MAX}"),
        ));
    }
    let placement = placements(params)?;
    mutate(store, params, &mut |tx| {
        if tx.application(&application)?.is_none() {
            return Err(failed(WireError::new(
                "not found",
                format!("application {application:?} not found"),
            )));
        }
        let since = now_rfc3339(tx);
        let names = add_units_in(tx, &application, count, &placement, &since)?.map_err(failed)?;
        Ok(json!({"units": names}))
    })
}

/// An endpoint of a relation as stored and shown: the application and the charm's
/// endpoint (its role and interface empty when the charm's metadata is not known).
pub fn endpoint_detail(application: &str, endpoint: &Endpoint) -> Value {
    json!({"application-name": application, "relation": endpoint.to_json()})
}

/// The endpoints `spec` (`app` or `app:endpoint`) may mean: the charm's endpoints of that
/// name (all but peers when no name is given), or, without the charm's metadata, the
/// endpoint as named with its role and interface unknown.
fn candidates(
    tx: &mut dyn Tx,
    spec: &str,
) -> Result<Result<(String, Vec<Endpoint>), WireError>, StoreError> {
    let (application, name) = match spec.split_once(':') {
        Some((application, name)) => (application, Some(name)),
        None => (spec, None),
    };
    let Some(found) = tx.application(application)? else {
        return Ok(Err(WireError::new(
            "not found",
            format!("application {application:?} not found"),
        )));
    };
    let endpoints = match charm(tx, &found.charm)? {
        Some(charm) => charm
            .endpoints
            .into_iter()
            .filter(|endpoint| match name {
                Some(name) => endpoint.name == name,
                None => endpoint.role != "peer",
            })
            .collect(),
        // Without the charm's metadata the endpoint is what the caller named (nothing, for
        // a bare application name, as bundles of older deployers relate them), its role
        // and interface unknown.
        None => vec![Endpoint {
            name: name.unwrap_or_default().to_owned(),
            role: String::new(),
            interface: String::new(),
            optional: false,
            limit: 0,
            scope: "global".to_owned(),
        }],
    };
    Ok(Ok((application.to_owned(), endpoints)))
}

/// True when two endpoints can relate: a provider and a requirer of one interface (either
/// unknown, when a charm's metadata is not known).
fn compatible(a: &Endpoint, b: &Endpoint) -> bool {
    let unknown = a.role.is_empty() || b.role.is_empty();
    unknown
        || (a.interface == b.interface
            && matches!(
                (a.role.as_str(), b.role.as_str()),
                ("provider", "requirer") | ("requirer", "provider")
            ))
}

/// `Application.AddRelation {"endpoints": ["wordpress:db", "mysql"]}`: the endpoints are
/// matched as Juju matches them (a provider and a requirer of one interface; a bare
/// application name means its one endpoint that fits), from the charms' metadata when lockstep
/// has it. The relation gets the next relation id. Answers Juju's `AddRelationResults`,
/// `{"endpoints": {application: {name, role, interface, optional, limit, scope}}}`.
pub fn add_relation(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let specs: Vec<String> = list(params, "endpoints")?
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if specs.len() != 2 {
        return Err(WireError::new(
            "bad request",
            format!("a relation joins two endpoints, got {specs:?}"),
        ));
    }
    mutate(store, params, &mut |tx| {
        let (first, firsts) = candidates(tx, &specs[0])?.map_err(failed)?;
        let (second, seconds) = candidates(tx, &specs[1])?.map_err(failed)?;
        let mut pairs = Vec::new();
        for a in &firsts {
            for b in &seconds {
                if compatible(a, b) {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
        let (a, b) = match pairs.as_slice() {
            [pair] => pair.clone(),
            [] => {
                return Err(failed(WireError::new(
                    "",
                    format!(
                        "no relations found between {:?} and {:?}",
                        specs[0], specs[1]
                    ),
                )));
            }
            _ => {
                let options: Vec<String> = pairs
                    .iter()
                    .map(|(a, b)| format!("\"{first}:{} {second}:{}\"", a.name, b.name))
                    .collect();
                return Err(failed(WireError::new(
                    "",
                    format!(
                        "ambiguous relation: \"{} {}\" could refer to {}",
                        specs[0],
                        specs[1],
                        options.join("; ")
                    ),
                )));
            }
        };
        let spec = |application: &str, endpoint: &Endpoint| {
            if endpoint.name.is_empty() {
                application.to_owned()
            } else {
                format!("{application}:{}", endpoint.name)
            }
        };
        let named = [spec(&first, &a), spec(&second, &b)];
        let mut sorted = named.clone();
        sorted.sort();
        let key = sorted.join(" ");
        if tx.relation(&key)?.is_some() {
            // python-libjuju's integrate() finds the relation when the message says this.
            return Err(failed(WireError::new(
                "already exists",
                format!("cannot add relation \"{key}\": relation already exists"),
            )));
        }
        let id = next_sequence(tx, "relation")?;
        let mut document = serde_json::to_value(Relation {
            key: key.clone(),
            endpoints: named.to_vec(),
            life: Life::Alive,
        })
        .expect("relations serialise");
        document["id"] = Value::from(id);
        document["endpoint-details"] =
            json!([endpoint_detail(&first, &a), endpoint_detail(&second, &b)]);
        document["since"] = Value::from(now_rfc3339(tx));
        tx.put_document(EntityKind::Relation, &key, &document)?;
        let mut result = Map::new();
        result.insert(first.clone(), a.to_json());
        result.insert(second.clone(), b.to_json());
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
            return Err(failed(not_found(&application)));
        };
        if is_exposed(&document) {
            return Ok(json!({}));
        }
        object(&mut document, &format!("application {application:?}"))?
            .insert(EXPOSED_KEY.to_owned(), Value::Bool(true));
        tx.put_document(EntityKind::Application, &application, &document)?;
        Ok(json!({}))
    })
}

fn not_found(application: &str) -> WireError {
    WireError::new(
        "not found",
        format!("application {application:?} not found"),
    )
}

/// A config value as the charm's option `kind` wants it (`int`, `float`, `boolean`,
/// `string`, `secret`): python-libjuju and python-jujuclient send every value as a string.
fn typed_value(option: &str, kind: &str, value: &Value) -> Result<Value, WireError> {
    let wrong = || {
        WireError::new(
            "bad request",
            format!("option {option:?} expected {kind}, got {value}"),
        )
    };
    let text = value.as_str();
    Ok(match kind {
        "int" => match value {
            Value::Number(number) if number.is_i64() => value.clone(),
            _ => Value::from(
                text.and_then(|t| t.trim().parse::<i64>().ok())
                    .ok_or_else(wrong)?,
            ),
        },
        "float" => match value {
            Value::Number(_) => value.clone(),
            _ => text
                .and_then(|t| t.trim().parse::<f64>().ok())
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(wrong)?,
        },
        "boolean" => match (value, text) {
            (Value::Bool(_), _) => value.clone(),
            (_, Some("true")) => Value::Bool(true),
            (_, Some("false")) => Value::Bool(false),
            _ => return Err(wrong()),
        },
        _ => match value {
            Value::String(_) => value.clone(),
            Value::Number(_) | Value::Bool(_) => Value::from(value.to_string()),
            _ => return Err(wrong()),
        },
    })
}

/// `config` checked against the charm's options, when lockstep has the charm: every key an
/// option (Juju's `unknown option "x"`), each value of its type. Without the charm's
/// metadata, values are kept as given. Bounded in keys and value size either way.
fn checked_config(
    charm: Option<&Charm>,
    config: &Map<String, Value>,
) -> Result<Map<String, Value>, WireError> {
    if config.len() > CONFIG_KEYS_MAX {
        return Err(WireError::new(
            "bad request",
            format!("{} config keys; at most {CONFIG_KEYS_MAX}", config.len()),
        ));
    }
    let mut checked = Map::new();
    for (key, value) in config {
        if value.to_string().len() > CONFIG_VALUE_SIZE_BYTES_MAX {
            return Err(WireError::new(
                "bad request",
                format!("option {key:?}: value over {CONFIG_VALUE_SIZE_BYTES_MAX} bytes"),
            ));
        }
        let value = match charm {
            Some(charm) => {
                let option = charm
                    .options
                    .get(key)
                    .ok_or_else(|| WireError::new("", format!("unknown option {key:?}")))?;
                typed_value(key, option["type"].as_str().unwrap_or("string"), value)?
            }
            None => value.clone(),
        };
        checked.insert(key.clone(), value);
    }
    Ok(checked)
}

/// The `Args` of an application config call, bounded.
fn args(params: &Value) -> Result<Vec<Value>, WireError> {
    let args = list(params, "Args")?;
    if args.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} entries; at most {ENTITIES_PER_CALL_MAX} per call",
                args.len()
            ),
        ));
    }
    Ok(args.clone())
}

/// `Application.SetConfigs {"Args": [{"application", "config": {key: value}}]}`: each
/// application's config keys set (checked as [`checked_config`] checks them), in its own
/// result; one transaction for the call.
pub fn set_config(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let args = args(params)?;
    mutate(store, params, &mut |tx| {
        let mut results = Vec::new();
        for arg in &args {
            let outcome = change_config(tx, arg, |charm, config| {
                let set = checked_config(charm, &object_field(arg, "config"))?;
                config.extend(set);
                Ok(())
            })?;
            results.push(result_of(outcome));
        }
        Ok(json!({"results": results}))
    })
}

/// `Application.UnsetApplicationsConfig {"Args": [{"application", "options": [key]}]}`:
/// the keys go back to the charm's defaults.
pub fn unset_config(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let args = args(params)?;
    mutate(store, params, &mut |tx| {
        let mut results = Vec::new();
        for arg in &args {
            let outcome = change_config(tx, arg, |_, config| {
                for key in arg
                    .get("options")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                {
                    if let Some(key) = key.as_str() {
                        config.remove(key);
                    }
                }
                Ok(())
            })?;
            results.push(result_of(outcome));
        }
        Ok(json!({"results": results}))
    })
}

fn result_of(outcome: Result<(), WireError>) -> Value {
    match outcome {
        Ok(()) => json!({}),
        Err(error) => json!({"error": error.result_json()}),
    }
}

/// Changes the config of the application `arg` names, writing it only when it changed.
fn change_config(
    tx: &mut dyn Tx,
    arg: &Value,
    change: impl FnOnce(Option<&Charm>, &mut Map<String, Value>) -> Result<(), WireError>,
) -> Result<Result<(), WireError>, StoreError> {
    let Some(name) = arg.get("application").and_then(Value::as_str) else {
        return Ok(Err(WireError::new(
            "bad request",
            "application must be a string",
        )));
    };
    let Some(mut document) = tx.document(EntityKind::Application, name)? else {
        return Ok(Err(not_found(name)));
    };
    let url = document["charm"].as_str().unwrap_or_default().to_owned();
    let charm = charm(tx, &url)?;
    let before = object_field(&document, "config");
    let mut config = before.clone();
    if let Err(error) = change(charm.as_ref(), &mut config) {
        return Ok(Err(error));
    }
    if config.len() > CONFIG_KEYS_MAX {
        return Ok(Err(WireError::new(
            "bad request",
            format!("{} config keys; at most {CONFIG_KEYS_MAX}", config.len()),
        )));
    }
    if config != before {
        document["config"] = Value::Object(config);
        tx.put_document(EntityKind::Application, name, &document)?;
    }
    Ok(Ok(()))
}

/// `Application.Get {"application"}`: Juju's `ApplicationGetResults`. Each option of the
/// charm (when lockstep has its metadata) with its `default`, the `value` set (source
/// `user`) or its default (source `default`); without the metadata, each key set, of type
/// `string`.
pub fn get(store: &dyn Store, name: &str) -> Result<Value, WireError> {
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            let document = tx.document(EntityKind::Application, name)?;
            let charm = match &document {
                Some(document) => charm(tx, document["charm"].as_str().unwrap_or_default())?,
                None => None,
            };
            read = Some((document, charm));
            Ok(())
        })
        .map_err(super::calls::store_error)?;
    let (document, charm) = read.expect("the snapshot body ran");
    let document = document.ok_or_else(|| not_found(name))?;
    let set = object_field(&document, "config");
    let mut config = Map::new();
    match &charm {
        Some(charm) => {
            for (key, option) in &charm.options {
                let mut entry = option.clone();
                match set.get(key) {
                    Some(value) => {
                        entry["value"] = value.clone();
                        entry["source"] = Value::from("user");
                    }
                    None => {
                        if let Some(default) = option.get("default") {
                            entry["value"] = default.clone();
                        }
                        entry["source"] = Value::from("default");
                    }
                }
                config.insert(key.clone(), entry);
            }
        }
        None => {
            for (key, value) in &set {
                config.insert(
                    key.clone(),
                    json!({"value": value, "source": "user", "type": "string", "description": ""}),
                );
            }
        }
    }
    let charm_url = document["charm"].as_str().unwrap_or_default();
    Ok(json!({
        "application": name,
        "charm": charm.as_ref().map_or_else(|| charm_name(charm_url), |charm| charm.name.clone()),
        "base": base(&document),
        "channel": "",
        "constraints": object_field(&document, "constraints"),
        "endpoint-bindings": {},
        "config": config,
        "application-config": {},
    }))
}

/// The charm name in a charm URL: `ch:amd64/jammy/mysql-42` → `mysql`.
pub fn charm_name(url: &str) -> String {
    let path = url.split_once(':').map_or(url, |(_, path)| path);
    let last = path.rsplit('/').next().unwrap_or(path);
    match last.rsplit_once('-') {
        Some((name, revision)) if revision.bytes().all(|b| b.is_ascii_digit()) => name.to_owned(),
        _ => last.to_owned(),
    }
}

/// An application's base as deployed (`{"name", "channel"}`), else one with empty fields:
/// lockstep knows no other.
pub fn base(document: &Value) -> Value {
    match document.get("base") {
        Some(base) if base.is_object() => json!({
            "name": base["name"].as_str().unwrap_or_default(),
            "channel": base["channel"].as_str().unwrap_or_default(),
        }),
        _ => json!({"name": "", "channel": ""}),
    }
}

/// `Application.DestroyApplication {"applications": [{"application-tag", "dry-run", ...}]}`:
/// each application removed with its units and its relations (lockstep runs no agents to
/// take them through `dying`); the machines stay. Per application, in its result:
/// `{"info": {"destroyed-units": [{"tag"}], ...}}` or its error.
pub fn destroy_applications(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "applications")?.clone();
    if requested.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} applications; at most {ENTITIES_PER_CALL_MAX} per call",
                requested.len()
            ),
        ));
    }
    mutate(store, params, &mut |tx| {
        let mut results = Vec::new();
        for entry in &requested {
            let tag = entry
                .get("application-tag")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let dry_run = entry.get("dry-run").and_then(Value::as_bool) == Some(true);
            let Some(name) = tag_id(tag, "application") else {
                results.push(json!({"error": WireError::new("bad request", format!("{tag:?} is not an application tag")).result_json()}));
                continue;
            };
            if tx.application(&name)?.is_none() {
                results.push(json!({"error": not_found(&name).result_json()}));
                continue;
            }
            let units: Vec<String> = tx
                .documents(EntityKind::Unit)?
                .into_iter()
                .filter(|(_, unit)| unit["application"].as_str() == Some(name.as_str()))
                .map(|(unit, _)| unit)
                .collect();
            let relations: Vec<String> = tx
                .documents(EntityKind::Relation)?
                .into_iter()
                .filter(|(_, relation)| {
                    relation["endpoints"].as_array().is_some_and(|endpoints| {
                        endpoints.iter().any(|endpoint| {
                            endpoint
                                .as_str()
                                .is_some_and(|e| e.split(':').next() == Some(name.as_str()))
                        })
                    })
                })
                .map(|(key, _)| key)
                .collect();
            if !dry_run {
                for key in &relations {
                    tx.remove_document(EntityKind::Relation, key)?;
                }
                for unit in &units {
                    tx.remove_document(EntityKind::Unit, unit)?;
                }
                tx.remove_document(EntityKind::Application, &name)?;
            }
            let destroyed: Vec<Value> = units
                .iter()
                .map(|unit| json!({"tag": format!("unit-{}", unit.replace('/', "-"))}))
                .collect();
            results.push(json!({"info": {"destroyed-units": destroyed,
                                         "destroyed-storage": [], "detached-storage": []}}));
        }
        Ok(json!({"results": results}))
    })
}

/// `Application.DestroyUnit {"units": [{"unit-tag", "dry-run", ...}]}`: each unit removed at
/// once (no agent takes it through `dying`); its machine stays. Per unit, in its result:
/// `{"info": {"destroyed-storage": [], "detached-storage": []}}` or its error.
pub fn destroy_units(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "units")?.clone();
    if requested.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} units; at most {ENTITIES_PER_CALL_MAX} per call",
                requested.len()
            ),
        ));
    }
    mutate(store, params, &mut |tx| {
        let mut results = Vec::new();
        for entry in &requested {
            let tag = entry
                .get("unit-tag")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let dry_run = entry.get("dry-run").and_then(Value::as_bool) == Some(true);
            let Some(name) = tag_id(tag, "unit") else {
                results.push(json!({"error": WireError::new("bad request", format!("{tag:?} is not a unit tag")).result_json()}));
                continue;
            };
            if tx.unit(&name)?.is_none() {
                results.push(json!({"error": WireError::new("not found", format!("unit {name:?} not found")).result_json()}));
                continue;
            }
            if !dry_run {
                tx.remove_document(EntityKind::Unit, &name)?;
            }
            results.push(json!({"info": {"destroyed-storage": [], "detached-storage": []}}));
        }
        Ok(json!({"results": results}))
    })
}

/// Records an uploaded charm (the charms endpoint): the same archive of a name recorded
/// already is that charm (its URL, nothing written); otherwise the next revision of the
/// charm's local sequence, `local:<series>/<name>-<revision>` (`local:<name>-<revision>`
/// without a series: the query's, else the charm's first).
pub fn add_charm(
    store: &dyn Store,
    charm: &Charm,
    series: Option<&str>,
) -> Result<String, WireError> {
    let charm = charm.clone();
    let series = series
        .map(str::to_owned)
        .or_else(|| charm.series.first().cloned())
        .filter(|series| lockstep_transport::charms_endpoint::valid_series(series));
    let result = mutate(store, &Value::Null, &mut |tx| {
        for (url, document) in tx.documents(EntityKind::Charm)? {
            if document["name"] == charm.name.as_str()
                && document["sha256"] == charm.sha256.as_str()
            {
                return Ok(Value::from(url));
            }
        }
        let revision = next_sequence(tx, &format!("charm:{}", charm.name))?;
        let url = match &series {
            Some(series) => format!("local:{series}/{}-{revision}", charm.name),
            None => format!("local:{}-{revision}", charm.name),
        };
        let mut document = serde_json::to_value(&charm).expect("charms serialise");
        document["url"] = Value::from(url.as_str());
        tx.put_document(EntityKind::Charm, &url, &document)?;
        Ok(Value::from(url))
    })?;
    Ok(result.as_str().unwrap_or_default().to_owned())
}
