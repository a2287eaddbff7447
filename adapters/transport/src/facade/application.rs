//! `Application`: `Deploy`, `AddUnits`, `AddRelation`, `Expose`, `SetConfigs` (and v1's
//! `Set`), `UnsetApplicationsConfig`, `DestroyApplication` and `DestroyUnit`, each a write
//! of the shared state that honours `operation-id` (the state parses the params and records
//! the result with the writes); and `Get`, a read.

use serde_json::{Value, json};

use crate::api::Api;
use crate::wire::WireError;

/// `Application.Deploy {"applications": [{"application", "charm-url", "num-units",
/// "config", "config-yaml", "constraints", "placement", "charm-origin"}]}`: each application
/// with its units. python-libjuju sends the config only as `config-yaml` (`{application:
/// {key: value}}`), which is folded into `config` here (a key in both: `config`'s value).
pub async fn deploy(api: &Api, params: &Value) -> Result<Value, WireError> {
    let mut params = params.clone();
    if let Some(applications) = params.get_mut("applications").and_then(Value::as_array_mut) {
        for (index, application) in applications.iter_mut().enumerate() {
            fold_config_yaml(application).map_err(|message| {
                WireError::new("bad request", format!("applications[{index}]: {message}"))
            })?;
        }
    }
    api.state.deploy(&params).await
}

/// Moves `config-yaml`'s settings of the application into its `config`.
fn fold_config_yaml(application: &mut Value) -> Result<(), String> {
    let Some(text) = application.get("config-yaml").and_then(Value::as_str) else {
        return Ok(());
    };
    if text.len() > crate::charm::YAML_SIZE_BYTES_MAX as usize {
        return Err(format!(
            "config-yaml is over the limit of {} bytes",
            crate::charm::YAML_SIZE_BYTES_MAX
        ));
    }
    let name = application["application"].as_str().unwrap_or_default();
    let parsed =
        crate::charm::yaml_to_json(text).map_err(|error| format!("config-yaml: {error}"))?;
    let mut config = match application.get("config") {
        Some(Value::Object(config)) => config.clone(),
        _ => serde_json::Map::new(),
    };
    if let Some(settings) = parsed.get(name).and_then(Value::as_object) {
        for (key, value) in settings {
            config.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    application["config"] = Value::Object(config);
    Ok(())
}

/// `Application.AddUnits {"application", "num-units"}`.
pub async fn add_units(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.add_units(params).await
}

/// `Application.AddRelation {"endpoints": ["wordpress:db", "mysql:server"]}`.
pub async fn add_relation(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.add_relation(params).await
}

/// `Application.Expose {"application": name}` (Juju's params; `exposed-endpoints` of newer
/// facade versions is accepted and ignored: every endpoint is exposed).
pub async fn expose(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.expose(params).await
}

/// `Application.Get {"application", "branch"}`: Juju's `ApplicationGetResults` (branches are
/// not served: `branch` is ignored).
pub async fn get(api: &Api, params: &Value) -> Result<Value, WireError> {
    let application = params
        .get("application")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| WireError::new("bad request", "application must be a non-empty string"))?;
    api.state.application_get(application).await
}

/// `Application.SetConfigs {"Args": [{"application", "config": {key: value}}]}` →
/// `{"results": [{} | {"error"}]}`.
pub async fn set_configs(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.set_application_config(params).await
}

/// `Application.Set {"application", "options": {key: value}}` (Juju 2.0's, python-jujuclient's
/// `env.service.set`): `SetConfigs` of one application; its result's error is the call's.
pub async fn set(api: &Api, params: &Value) -> Result<Value, WireError> {
    let mut request = json!({"Args": [{
        "application": params.get("application").cloned().unwrap_or(Value::Null),
        "config": params.get("options").cloned().unwrap_or(Value::Null),
    }]});
    if let Some(operation) = params.get("operation-id") {
        request["operation-id"] = operation.clone();
    }
    let reply = api.state.set_application_config(&request).await?;
    match reply["results"][0].get("error") {
        Some(error) => Err(WireError::new(
            error["code"].as_str().unwrap_or_default(),
            error["message"].as_str().unwrap_or_default(),
        )),
        None => Ok(json!({})),
    }
}

/// `Application.UnsetApplicationsConfig {"Args": [{"application", "options": [key]}]}`.
pub async fn unset_config(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.unset_application_config(params).await
}

/// `Application.DestroyApplication {"applications": [{"application-tag", ...}]}`.
pub async fn destroy_application(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.destroy_applications(params).await
}

/// `Application.DestroyUnit {"units": [{"unit-tag", ...}]}`.
pub async fn destroy_unit(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.destroy_units(params).await
}
