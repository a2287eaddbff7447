//! `MachineManager` (v10, python-libjuju's only version): `AddMachines` and
//! `DestroyMachineWithParams`. `AddMachines` is the same call of the shared state as
//! `Client.AddMachines` and `lockstep add-machine`: one way to record a machine.

use serde_json::Value;

use crate::api::Api;
use crate::wire::WireError;

/// `MachineManager.AddMachines {"params": [{"jobs", "base", "constraints", "placement",
/// "container-type", ...}]}` → `{"machines": [{"machine": "1"} | {"error"}]}`.
pub async fn add_machines(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.add_machines(params).await
}

/// `MachineManager.DestroyMachineWithParams {"machine-tags", "force", "keep", "dry-run",
/// "max-wait"}` → `{"results": [{"info": {"machine-id", "destroyed-units", ...}} |
/// {"error"}]}`.
pub async fn destroy_machines(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.destroy_machines(params).await
}
