//! `Controller`: `AllModels` (python-libjuju's `Model.connect(name)` for a model its
//! client store lacks) and `ControllerAPIInfoForModels` (`Controller.connect()` learns the
//! controller's addresses and CA from it).

use serde_json::{Value, json};

use crate::api::Api;
use crate::session::Session;
use crate::wire::WireError;

/// `Controller.AllModels {}`: the one model, Juju's `UserModelList`.
pub async fn all_models(api: &Api) -> Result<Value, WireError> {
    let model = api.state.model_config().await?;
    Ok(json!({"user-models": [{"model": {
        "name": model.name,
        "uuid": model.uuid,
        "type": "iaas",
        "owner-tag": "user-admin",
    }}]}))
}

/// `Controller.ControllerAPIInfoForModels {"entities": [{"tag": "model-<uuid>"}]}`: for each,
/// the API's address (the one the client reached) and the controller's CA, Juju's
/// `ControllerAPIInfoResults`; another model's tag gets `not found` in its result. The CA is
/// the last certificate of the chain the server presents ([`Api::ca_pem`]); a server whose
/// chain has none says so in the result rather than hand out an empty CA.
pub async fn api_info_for_models(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    let model = api.state.model_config().await?;
    let addresses: Vec<String> = api
        .address_for(session)
        .map(|address| address.to_string())
        .into_iter()
        .collect();
    let ca = api.ca_pem();
    let results: Vec<Value> = params
        .get("entities")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|entity| {
            let tag = entity
                .get("tag")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let uuid = tag.strip_prefix("model-").unwrap_or(tag);
            match &ca {
                _ if uuid != model.uuid => json!({"error": {
                    "message": format!("model {uuid:?} not found"), "code": "not found"}}),
                Some(ca) => json!({"addresses": addresses, "cacert": ca}),
                None => json!({"error": {
                    "message": "this controller's certificate chain has no CA certificate"}}),
            }
        })
        .collect();
    Ok(json!({"results": results}))
}
