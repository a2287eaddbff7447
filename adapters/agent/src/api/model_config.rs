//! The model's config (`ModelGet`, `ModelInfo`), its `agent-stream`, and the agent-version
//! `ModelConfig.ModelSet` changes.

use lockstep_core::Version;
use lockstep_core::policy::{Catalogue, Stream};
use lockstep_core::upgrader as core;
use lockstep_core::upgrader::{
    self, AgentVersionCheck, AgentVersionRefusal, AgentVersionRequester,
};
use lockstep_store::{AgentVersionSet, EntityKind, Model, Store, Tx};
use lockstep_transport::facade::model_config::{
    IDENTITY_KEYS, LOCKSTEP_KEYS, STORED_KEYS_MAX, check_stored,
};
use lockstep_transport::state::{AgentVersionChange, ModelConfig};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::calls::{MODEL_SETTINGS, failed, list, mutate, object, store_error};

/// The model's config: its own fields and the stored keys, read in one snapshot.
pub fn model_config(store: &dyn Store) -> Result<ModelConfig, WireError> {
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            read = Some((tx.model()?, settings(tx)?));
            Ok(())
        })
        .map_err(store_error)?;
    let (model, settings) = read.expect("the snapshot body ran");
    let model =
        model.ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    Ok(config_of(model, settings))
}

/// The config of `model` with its stored keys `settings`.
pub fn config_of(model: Model, settings: Map<String, Value>) -> ModelConfig {
    ModelConfig {
        name: model.name,
        uuid: model.uuid,
        agent_version: model.agent_version,
        agent_stream: model.agent_stream,
        agent_metadata_url: model.agent_metadata_url,
        settings,
    }
}

/// The model config's stored keys as `tx` sees them.
pub fn settings(tx: &mut dyn Tx) -> Result<Map<String, Value>, lockstep_store::StoreError> {
    Ok(tx
        .document(EntityKind::Settings, MODEL_SETTINGS)?
        .and_then(|document| match document {
            Value::Object(map) => Some(map),
            _ => None,
        })
        .unwrap_or_default())
}

/// A stored key, never one of lockstep's or the model's identity (the transport keeps
/// those apart; this is the store side's own check).
fn stored_key(key: &str) -> Result<(), WireError> {
    if LOCKSTEP_KEYS.contains(&key) || IDENTITY_KEYS.contains(&key) {
        return Err(WireError::new(
            "not supported",
            format!("model config key {key:?} is not a stored key"),
        ));
    }
    Ok(())
}

/// `ModelConfig.ModelSet {"config": {key: value}}` of stored keys: written together in one
/// transaction (one `settings` event, so watchers get one `model` delta); at most
/// [`STORED_KEYS_MAX`] keys in all. Honours `operation-id`.
pub fn model_set(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let config = params
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| WireError::new("bad request", "params.config must be an object"))?
        .clone();
    for (key, value) in &config {
        stored_key(key)?;
        check_stored(key, value)?;
    }
    mutate(store, params, &mut |tx| {
        let mut document = tx
            .document(EntityKind::Settings, MODEL_SETTINGS)?
            .unwrap_or_else(|| json!({}));
        let fields = object(&mut document, "model settings")?;
        let before = fields.clone();
        for (key, value) in &config {
            fields.insert(key.clone(), value.clone());
        }
        if fields.len() > STORED_KEYS_MAX {
            return Err(failed(WireError::new(
                "bad request",
                format!(
                    "the model would hold {} config keys; at most {STORED_KEYS_MAX}",
                    fields.len()
                ),
            )));
        }
        if *fields != before {
            tx.put_document(EntityKind::Settings, MODEL_SETTINGS, &document)?;
        }
        Ok(json!({}))
    })
}

/// `ModelConfig.ModelUnset {"keys": [key]}` of stored keys (a key not set is no error).
/// Honours `operation-id`.
pub fn model_unset(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let keys: Vec<String> = list(params, "keys")?
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    for key in &keys {
        stored_key(key)?;
    }
    mutate(store, params, &mut |tx| {
        let Some(mut document) = tx.document(EntityKind::Settings, MODEL_SETTINGS)? else {
            return Ok(json!({}));
        };
        let fields = object(&mut document, "model settings")?;
        let before = fields.len();
        for key in &keys {
            fields.remove(key);
        }
        if fields.len() != before {
            tx.put_document(EntityKind::Settings, MODEL_SETTINGS, &document)?;
        }
        Ok(json!({}))
    })
}

/// The model's `agent-stream` (`None`: the default, also before bootstrap created the
/// model).
pub fn agent_stream(store: &dyn Store) -> Result<Option<Stream>, WireError> {
    Ok(store
        .load_model()
        .map_err(store_error)?
        .and_then(|model| model.agent_stream))
}

/// An agent-version refusal as the wire carries it: the core's message and code
/// ([`AgentVersionRefusal`]), and for Juju's `state.UpgradeInProgressError` the record in
/// `error-info` (`previous-version`, `target-version`, `status`).
pub fn refusal_error(refusal: &AgentVersionRefusal) -> WireError {
    let info = match refusal {
        AgentVersionRefusal::UpgradeInProgress { record } => Some(json!({
            "previous-version": record.previous_version.to_string(),
            "target-version": record.target_version.to_string(),
            "status": record.status.to_string(),
        })),
        AgentVersionRefusal::Downgrade { .. }
        | AgentVersionRefusal::AgentsBehind { .. }
        | AgentVersionRefusal::NoBinaries { .. } => None,
    };
    WireError {
        message: refusal.to_string(),
        code: refusal.code().to_owned(),
        info,
    }
}

/// The agent-version a `ModelConfig.ModelSet` may move to, checked against the store
/// before the catalogue is asked (the core's rule, [`upgrader::agent_version_change`], for
/// an operator): unchanged when it is the current one already, allowed, refused while an upgrade-info record is current and for a lower
/// version. [`set_agent_version`] checks again, with the catalogue, inside its write.
pub fn agent_version_change(
    store: &dyn Store,
    version: Version,
) -> Result<AgentVersionChange, WireError> {
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            read = Some((tx.model()?, tx.record()?));
            Ok(())
        })
        .map_err(store_error)?;
    let (model, record) = read.expect("the snapshot body ran");
    let model =
        model.ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    let record = record.map(|(record, _)| record);
    match upgrader::agent_version_change(
        model.agent_version,
        record.as_ref(),
        version,
        AgentVersionRequester::Operator,
    ) {
        Ok(core::AgentVersionChange::Unchanged) => Ok(AgentVersionChange::Unchanged),
        Ok(core::AgentVersionChange::Changed { .. }) => Ok(AgentVersionChange::Allowed),
        Err(refusal) => Err(refusal_error(&refusal)),
    }
}

/// Writes the model's agent-version as an operator's change: the store decides by the
/// core's rule ([`AgentVersionCheck::operator`]: no current record, no downgrade, a binary
/// of `version` in `catalogue`; with `agents_current`, every agent on the model's version,
/// [`AgentVersionCheck::with_agents_current`]) inside the transaction that writes it.
pub fn set_agent_version(
    store: &dyn Store,
    version: Version,
    catalogue: &Catalogue,
    agents_current: bool,
) -> Result<(), WireError> {
    let mut check = AgentVersionCheck::operator(catalogue);
    if agents_current {
        check = check.with_agents_current();
    }
    match store
        .set_agent_version(version, &check)
        .map_err(store_error)?
    {
        AgentVersionSet::Set { model, .. } => {
            assert_eq!(model.agent_version, version);
            Ok(())
        }
        AgentVersionSet::Refused { refusal, .. } => Err(refusal_error(&refusal)),
    }
}
