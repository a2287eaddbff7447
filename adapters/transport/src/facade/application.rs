//! `Application`: `Deploy`, `AddUnits`, `AddRelation` and `Expose`, each a write of the
//! shared state that honours `operation-id` (the state parses the params and records the
//! result with the writes).

use serde_json::Value;

use crate::api::Api;
use crate::wire::WireError;

/// `Application.Deploy {"applications": [{"application", "charm-url", "num-units"}]}`:
/// each application with its units, each unit on a new machine (as Juju places them).
pub async fn deploy(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.deploy(params).await
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
