//! `ModelManager`: `ModelInfo` and `ListModelSummaries` of the one model lockstep serves
//! (named `controller`: it is the controller's model, as Juju's is).

use lockstep_core::gate::GateView;
use serde_json::{Value, json};

use crate::api::Api;
use crate::backend::LifecycleStatus;
use crate::state::{MODEL_PROVIDER_TYPE, ModelConfig, Status};
use crate::wire::WireError;

/// `ModelManager.ModelInfo {"entities": [{"tag": "model-<uuid>"}]}`, with the gate's `view`
/// as the call was admitted: one result per entity, in order; another model's tag gets
/// `model "<uuid>" not found` (code `not found`) in its result. Without entities, the one
/// model (older clients send none).
pub async fn model_info(api: &Api, view: GateView, params: &Value) -> Result<Value, WireError> {
    let lifecycle = LifecycleStatus::of(&*api.backend, view);
    let model = api.state.model_config().await?;
    let status = api.state.status().await?;
    let info = model_info_result(&model, &status, &lifecycle, &api.config.controller_uuid);
    let tags: Vec<&str> = params
        .get("entities")
        .and_then(Value::as_array)
        .map(|entities| {
            entities
                .iter()
                .map(|entity| {
                    entity
                        .get("tag")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    if tags.is_empty() {
        return Ok(json!({"results": [{"result": info}]}));
    }
    let results: Vec<Value> = tags
        .iter()
        .map(|tag| {
            let uuid = tag.strip_prefix("model-").unwrap_or(tag);
            if uuid == model.uuid {
                json!({"result": info})
            } else {
                json!({"error": {"message": format!("model {uuid:?} not found"), "code": "not found"}})
            }
        })
        .collect();
    Ok(json!({"results": results}))
}

/// The model's status: `available` when Ready, else `busy` with the phase.
fn model_status(lifecycle: &LifecycleStatus) -> Value {
    if lifecycle.gate.phase.is_ready() {
        json!({"status": "available", "info": ""})
    } else {
        json!({"status": "busy", "info": format!("upgrade in progress: {}", lifecycle.gate.phase)})
    }
}

/// Juju's `params.ModelInfo` of the model: `machines` lists each machine with its agent's
/// status (`status.machines`); lockstep has no users besides the admin, no SLA and no
/// cloud credential.
pub fn model_info_result(
    model: &ModelConfig,
    status: &Status,
    lifecycle: &LifecycleStatus,
    controller_uuid: &str,
) -> Value {
    let machines: Vec<Value> = status
        .machines
        .iter()
        .map(|(id, machine)| {
            json!({"id": id,
                   "status": machine["agent-status"]["status"],
                   "message": machine["agent-status"]["info"],
                   "has-vote": false, "wants-vote": false})
        })
        .collect();
    json!({
        "name": model.name,
        "uuid": model.uuid,
        "type": "iaas",
        "controller-uuid": controller_uuid,
        "is-controller": true,
        "provider-type": MODEL_PROVIDER_TYPE,
        "cloud-tag": "cloud-localhost",
        "cloud-region": "localhost",
        "owner-tag": "user-admin",
        "life": "alive",
        "status": model_status(lifecycle),
        "users": [{"user": "admin", "display-name": "admin", "access": "admin"}],
        "machines": machines,
        "sla": {"level": "unsupported", "owner": "admin"},
        "agent-version": lifecycle.agent_version,
    })
}

/// `ModelManager.ListModelSummaries {"user-tag", "all"}`: the one model, Juju's
/// `ModelSummary`, with its machine count.
pub async fn list_model_summaries(api: &Api, view: GateView) -> Result<Value, WireError> {
    let lifecycle = LifecycleStatus::of(&*api.backend, view);
    let model = api.state.model_config().await?;
    let status = api.state.status().await?;
    Ok(json!({"results": [{"result": {
        "name": model.name,
        "uuid": model.uuid,
        "type": "iaas",
        "controller-uuid": api.config.controller_uuid,
        "is-controller": true,
        "provider-type": MODEL_PROVIDER_TYPE,
        "cloud-tag": "cloud-localhost",
        "cloud-region": "localhost",
        "owner-tag": "user-admin",
        "life": "alive",
        "status": model_status(&lifecycle),
        "user-access": "admin",
        "counts": [{"entity": "machines", "count": status.machines.len()}],
        "sla": {"level": "unsupported", "owner": "admin"},
        "agent-version": lifecycle.agent_version,
    }}]}))
}
