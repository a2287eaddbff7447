//! `ModelManager.ModelInfo`: the one model, with the lifecycle's status.

use lockstep_core::gate::GateView;
use serde_json::{Value, json};

use crate::api::Api;
use crate::backend::LifecycleStatus;
use crate::state::ModelConfig;
use crate::wire::WireError;

/// `ModelManager.ModelInfo`, with the gate's `view` as the call was admitted.
pub async fn model_info(api: &Api, view: GateView) -> Result<Value, WireError> {
    let lifecycle = LifecycleStatus::of(&*api.backend, view);
    let model = api.state.model_config().await?;
    Ok(model_info_reply(&model, &lifecycle))
}

/// `ModelInfo`'s reply for `model`.
pub fn model_info_reply(model: &ModelConfig, lifecycle: &LifecycleStatus) -> Value {
    json!({"results": [{"result": {
        "name": model.name,
        "uuid": model.uuid,
        "type": "iaas",
        "controller-uuid": "",
        "cloud-tag": "cloud-localhost",
        "owner-tag": "user-admin",
        "life": "alive",
        "status": {"status": if lifecycle.gate.phase.is_ready() { "available" } else { "busy" }},
        "agent-version": lifecycle.agent_version,
    }}]})
}
