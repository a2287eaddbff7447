//! `ModelConfig`: `ModelGet`, `ModelSet`, `ModelUnset` and `GetModelConstraints`.
//!
//! The model's config is two kinds of key:
//! - **lockstep's own** ([`LOCKSTEP_KEYS`]): `agent-version`, `agent-stream`,
//!   `agent-metadata-url`, fields of the model with their own rules, written only by a
//!   user with `admin` access to the model. `agent-version` moves through the core's
//!   `AgentVersionCheck` inside the store's write; `agent-stream` and `agent-metadata-url`
//!   are chosen at bootstrap (the catalogue and its pinned key follow them), so `ModelSet`
//!   accepts their current value back and refuses a change; none can be unset.
//! - **stored keys**: any other key (`logging-config`, `default-series`, ...), stored as
//!   given and returned by `ModelGet` with source `model`; written by `write` access.
//!   `name`, `uuid` and `type` are the model's identity and cannot be set or unset.

use lockstep_core::Version;
use serde_json::{Map, Value, json};

use crate::api::Api;
use crate::auth::ModelAccess;
use crate::session::Session;
use crate::state::{AgentVersionChange, ModelConfig};
use crate::tools;
use crate::wire::WireError;

/// The keys with lockstep's semantics, written by an admin only.
pub const LOCKSTEP_KEYS: &[&str] = &["agent-version", "agent-stream", "agent-metadata-url"];

/// The model's identity: shown by `ModelGet`, never set or unset.
pub const IDENTITY_KEYS: &[&str] = &["name", "uuid", "type"];

/// Stored keys one model may hold, one `ModelSet` may name, and the size of one value.
pub const STORED_KEYS_MAX: usize = 256;
pub const KEY_SIZE_BYTES_MAX: usize = 128;
pub const VALUE_SIZE_BYTES_MAX: usize = 16 * 1024;

/// `ModelConfig.ModelGet` (and Juju 2.0's `Client.ModelGet`).
pub async fn model_get(api: &Api) -> Result<Value, WireError> {
    Ok(model_get_reply(&api.state.model_config().await?))
}

/// `ModelGet`'s reply, Juju's `ModelConfigResults`: each key as `{"value", "source"}`,
/// source `default` for `agent-stream` when it was never chosen, else `model`.
pub fn model_get_reply(model: &ModelConfig) -> Value {
    let config: Map<String, Value> = model
        .values()
        .into_iter()
        .map(|(key, value)| {
            let source = if key == "agent-stream" && model.agent_stream.is_none() {
                "default"
            } else {
                "model"
            };
            (key, json!({"value": value, "source": source}))
        })
        .collect();
    json!({"config": config})
}

/// `ModelConfig.GetModelConstraints`: lockstep stores no model constraints (none can be
/// set: `SetModelConstraints` is not served), so `{"constraints": {}}`.
pub fn get_model_constraints() -> Result<Value, WireError> {
    Ok(json!({"constraints": {}}))
}

/// Who may write `key`: lockstep's keys need `admin` access, stored keys `write`; the
/// identity keys nobody.
pub fn check_writer(access: ModelAccess, key: &str) -> Result<(), WireError> {
    if IDENTITY_KEYS.contains(&key) {
        return Err(WireError::new(
            "not supported",
            format!("model config key {key:?} is the model's identity and cannot be changed"),
        ));
    }
    let needed = if LOCKSTEP_KEYS.contains(&key) {
        ModelAccess::Admin
    } else {
        ModelAccess::Write
    };
    if access < needed {
        return Err(WireError {
            message: format!(
                "permission denied: model config key {key:?} needs {} access to the model, \
                 the user has {}",
                needed.as_str(),
                access.as_str()
            ),
            code: "unauthorized access".to_owned(),
            info: None,
        });
    }
    Ok(())
}

/// A model config value as the core's checks read it: a string's content, a number's
/// digits, anything else as JSON.
pub fn setting_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A stored key's name and value within bounds (and, for `max-agent-downloads` and the
/// `rollout-*` keys, a value the core accepts).
pub fn check_stored(key: &str, value: &Value) -> Result<(), WireError> {
    if key.is_empty() || key.len() > KEY_SIZE_BYTES_MAX {
        return Err(WireError::new(
            "bad request",
            format!("model config key {key:?} must have 1 to {KEY_SIZE_BYTES_MAX} bytes"),
        ));
    }
    if key == lockstep_core::upgrader::AGENT_DOWNLOADS_MAX_KEY {
        let number = value
            .as_u64()
            .or_else(|| value.as_str().and_then(|text| text.trim().parse().ok()));
        let limit = u64::from(lockstep_core::upgrader::AGENT_DOWNLOADS_MAX_LIMIT);
        if !number.is_some_and(|number| (1..=limit).contains(&number)) {
            return Err(WireError::new(
                "bad request",
                format!(
                    "model config key {key:?}: {value} is not a whole number from 1 to {limit}"
                ),
            ));
        }
    }
    if let Err(error) = lockstep_core::rollout::check_setting(key, &setting_text(value)) {
        return Err(WireError::new("bad request", error.to_string()));
    }
    let size_bytes = value.to_string().len();
    if size_bytes > VALUE_SIZE_BYTES_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "model config key {key:?}: a value of {size_bytes} bytes is over the limit of \
                 {VALUE_SIZE_BYTES_MAX}"
            ),
        ));
    }
    Ok(())
}

/// `ModelConfig.ModelSet {"config": {key: value}}` (and Juju 2.0's `Client.ModelSet`).
/// Every key is checked before anything is written ([`check_writer`]); then lockstep's
/// keys follow their rules and the stored keys are written in one store transaction.
/// `agent-version` is set alone (its write is the lifecycle's, with its own check):
/// together with another key it is refused.
pub async fn model_set(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let config = params
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            WireError::new(
                "bad request",
                "params.config must be an object of model config keys",
            )
        })?;
    let access = session.model_access();
    for (key, value) in config {
        check_writer(access, key)?;
        if !LOCKSTEP_KEYS.contains(&key.as_str()) {
            check_stored(key, value)?;
        }
    }
    if config.len() > STORED_KEYS_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} keys in one ModelSet; at most {STORED_KEYS_MAX}",
                config.len()
            ),
        ));
    }
    if let Some(version) = config.get("agent-version") {
        if config.len() > 1 {
            return Err(WireError::new(
                "bad request",
                "agent-version is set alone: set the other keys in another ModelSet",
            ));
        }
        return set_agent_version(api, version).await;
    }
    let current = api.state.model_config().await?;
    let mut stored = Map::new();
    for (key, value) in config {
        match key.as_str() {
            "agent-stream" | "agent-metadata-url" => {
                let now = current.values().get(key).cloned().unwrap_or(Value::Null);
                if *value != now {
                    return Err(WireError::new(
                        "not supported",
                        format!(
                            "model config key {key:?} is chosen at bootstrap (lockstep \
                             bootstrap --{key}) and cannot be changed to {value}: it is {now}"
                        ),
                    ));
                }
            }
            _ => {
                stored.insert(key.clone(), value.clone());
            }
        }
    }
    if stored.is_empty() {
        return Ok(json!({}));
    }
    let mut request = json!({"config": stored});
    if let Some(operation) = params.get("operation-id") {
        request["operation-id"] = operation.clone();
    }
    api.state.model_set(&request).await
}

/// `ModelConfig.ModelUnset {"keys": [key]}` (and Juju 2.0's `Client.ModelUnset`): stored
/// keys go back to unset (a key never set is no error, as in Juju); lockstep's keys cannot
/// be unset.
pub async fn model_unset(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let keys = params
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::new("bad request", "params.keys must be a list"))?;
    if keys.len() > STORED_KEYS_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} keys in one ModelUnset; at most {STORED_KEYS_MAX}",
                keys.len()
            ),
        ));
    }
    let access = session.model_access();
    for key in keys {
        let key = key.as_str().ok_or_else(|| {
            WireError::new("bad request", format!("a key must be a string, got {key}"))
        })?;
        check_writer(access, key)?;
        if LOCKSTEP_KEYS.contains(&key) {
            return Err(WireError::new(
                "not supported",
                format!("model config key {key:?} has lockstep's semantics and cannot be unset"),
            ));
        }
    }
    api.state.model_unset(params).await
}

/// `ModelSet` of `agent-version`: [`change_agent_version`] without the agents check.
async fn set_agent_version(api: &Api, value: &Value) -> Result<Value, WireError> {
    let version = agent_version_param("agent-version", value)?;
    change_agent_version(api, version, false, "ModelConfig.ModelSet").await
}

/// The version an operator's `name` param holds: a string in Juju's grammar.
pub(crate) fn agent_version_param(name: &str, value: &Value) -> Result<Version, WireError> {
    let text = value.as_str().ok_or_else(|| {
        WireError::new(
            "bad request",
            format!("{name} must be a string, got {value}"),
        )
    })?;
    Version::parse(text).map_err(|error| WireError::new("bad request", error.to_string()))
}

/// An operator's change of the model's `agent-version` (by `via`, for the log). Refused
/// while an upgrade-info record is current (Juju's message), for a lower version, with
/// `agents_current` while an agent runs another version than the model's (Juju's
/// `some agents have not upgraded to the current model version`), and for a version the
/// catalogue has no binary of in the model's streams (Juju's `no agent binaries found for
/// version`). The current version back is accepted and changes nothing. On success the
/// shared state holds the new version and the backend is told
/// ([`crate::backend::Backend::agent_version_changed`]).
pub(crate) async fn change_agent_version(
    api: &Api,
    version: Version,
    agents_current: bool,
    via: &'static str,
) -> Result<Value, WireError> {
    match api.state.agent_version_change(version).await? {
        AgentVersionChange::Unchanged => return Ok(json!({})),
        AgentVersionChange::Allowed => {}
    }
    let catalogue = api.backend.catalogue().await.map_err(|reason| {
        WireError::new(
            "",
            format!(
                "cannot check for agent binaries of version {version}: {}",
                tools::catalogue_unreadable(&reason)
            ),
        )
    })?;
    api.state
        .set_agent_version(version, &catalogue, agents_current)
        .await?;
    tracing::info!(target: "lockstep::api", %version, via, agents_current, "agent-version changed");
    api.backend.agent_version_changed(version);
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lockstep's keys need an admin, stored keys write access, the identity nobody: a user
    /// with less is refused even though every user is an admin today.
    #[test]
    fn writers_need_the_access_each_key_asks_for() {
        for key in LOCKSTEP_KEYS {
            assert!(check_writer(ModelAccess::Admin, key).is_ok(), "{key}");
            let refused = check_writer(ModelAccess::Write, key).unwrap_err();
            assert_eq!(refused.code, "unauthorized access", "{key}");
            assert!(
                refused.message.contains("needs admin access"),
                "{refused:?}"
            );
        }
        assert!(check_writer(ModelAccess::Write, "logging-config").is_ok());
        let refused = check_writer(ModelAccess::Read, "logging-config").unwrap_err();
        assert!(
            refused.message.contains("needs write access"),
            "{refused:?}"
        );
        for key in IDENTITY_KEYS {
            assert_eq!(
                check_writer(ModelAccess::Admin, key).unwrap_err().code,
                "not supported"
            );
        }
    }

    #[test]
    fn stored_keys_and_values_are_bounded() {
        assert!(check_stored("logging-config", &json!("<root>=INFO")).is_ok());
        assert_eq!(
            check_stored("", &json!("x")).unwrap_err().code,
            "bad request"
        );
        let long = "k".repeat(KEY_SIZE_BYTES_MAX + 1);
        assert_eq!(
            check_stored(&long, &json!("x")).unwrap_err().code,
            "bad request"
        );
        let large = json!("v".repeat(VALUE_SIZE_BYTES_MAX));
        assert!(
            check_stored("key", &large)
                .unwrap_err()
                .message
                .contains("over the limit")
        );
    }
}
