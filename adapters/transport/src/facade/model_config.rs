//! `ModelConfig`: `ModelGet`, and `ModelSet` of `agent-version` with Juju's refusals.

use lockstep_core::Version;
use serde_json::{Map, Value, json};

use crate::api::Api;
use crate::state::{AgentVersionChange, ModelConfig};
use crate::tools;
use crate::wire::WireError;

/// `ModelConfig.ModelGet` (and Juju 2.0's `Client.ModelGet`).
pub async fn model_get(api: &Api) -> Result<Value, WireError> {
    Ok(model_get_reply(&api.state.model_config().await?))
}

/// `ModelGet`'s reply: each key as `{"value", "source": "model"}`.
pub fn model_get_reply(model: &ModelConfig) -> Value {
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
    json!({"config": config})
}

/// `ModelConfig.ModelSet {"config": {"agent-version": "2.9.44"}}`: the only key lockstep
/// sets this way. Refused for any other key (naming it), while an upgrade-info record is
/// current (Juju's message), for a lower version, and for a version the catalogue has no
/// binary of in the model's streams (Juju's `no agent binaries found for version`). The
/// current version back is accepted and changes nothing. On success the shared state
/// holds the new version and the backend is told
/// ([`crate::backend::Backend::agent_version_changed`]).
pub async fn model_set(api: &Api, params: &Value) -> Result<Value, WireError> {
    let config = params
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            WireError::new(
                "bad request",
                "params.config must be an object of model config keys",
            )
        })?;
    let mut version = None;
    for (key, value) in config {
        if key != "agent-version" {
            return Err(WireError::new(
                "not supported",
                format!(
                    "model config key {key:?} cannot be set: lockstep's ModelConfig.ModelSet \
                     sets agent-version only"
                ),
            ));
        }
        let text = value.as_str().ok_or_else(|| {
            WireError::new(
                "bad request",
                format!("agent-version must be a string, got {value}"),
            )
        })?;
        version = Some(
            Version::parse(text)
                .map_err(|error| WireError::new("bad request", error.to_string()))?,
        );
    }
    let Some(version) = version else {
        return Ok(json!({}));
    };
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
    api.state.set_agent_version(version, &catalogue).await?;
    tracing::info!(target: "lockstep::api", %version, "agent-version changed by ModelConfig.ModelSet");
    api.backend.agent_version_changed(version);
    Ok(json!({}))
}
