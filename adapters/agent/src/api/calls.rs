//! What every call of the API's shared state shares: the store's errors as the wire's, the
//! model, the params' common shapes, and one mutating call under its `operation-id`.

use lockstep_store::{
    Abort, EntityKind, Model, OperationOutcome, Store, StoreError, Tx, TxOutcome,
};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value};

/// A store failure as the wire reports it.
pub fn store_error(error: StoreError) -> WireError {
    WireError::new("", format!("controller state unavailable: {error}"))
}

/// The model, `not found` before bootstrap created it.
pub fn model(store: &dyn Store) -> Result<Model, WireError> {
    store
        .load_model()
        .map_err(store_error)?
        .ok_or_else(|| WireError::new("not found", "the controller has no model yet"))
}

/// Runs a mutating call once: through `apply_operation` when the client sent an
/// `operation-id`, else in a plain transaction.
pub fn mutate(
    store: &dyn Store,
    params: &Value,
    body: &mut dyn FnMut(&mut dyn Tx) -> Result<Value, Abort>,
) -> Result<Value, WireError> {
    match params.get("operation-id").and_then(Value::as_str) {
        Some(operation_id) => match store
            .apply_operation(operation_id, body)
            .map_err(store_error)?
        {
            OperationOutcome::Applied(result) | OperationOutcome::Replayed(result) => Ok(result),
            OperationOutcome::Failed(message) => Err(refusal(message)),
        },
        None => {
            let mut result = None;
            let outcome = store
                .transaction(None, &mut |tx| {
                    result = Some(body(tx)?);
                    Ok(())
                })
                .map_err(store_error)?;
            match outcome {
                TxOutcome::Committed(_) | TxOutcome::Unchanged => Ok(result.unwrap_or(Value::Null)),
                TxOutcome::Failed(message) => Err(refusal(message)),
                TxOutcome::Fenced => unreachable!("client calls are not fenced"),
            }
        }
    }
}

/// The list `params.<key>`.
pub fn list<'a>(params: &'a Value, key: &str) -> Result<&'a Vec<Value>, WireError> {
    params
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::new("bad request", format!("params.{key} must be a list")))
}

/// The non-empty string `value.<key>`.
pub fn text<'a>(value: &'a Value, key: &str) -> Result<&'a str, WireError> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .ok_or_else(|| WireError::new("bad request", format!("{key} must be a non-empty string")))
}

/// Ends a mutating call with `error`, writing nothing. The store carries a failure as text
/// only, so the error travels as its JSON (`{"message", "code"}`) and [`mutate`] reads its
/// code back.
pub fn failed(error: WireError) -> Abort {
    Abort::Failed(error.result_json().to_string())
}

/// The error a body ended with ([`failed`]); a failure of other text has no code.
fn refusal(message: String) -> WireError {
    match serde_json::from_str::<Value>(&message) {
        Ok(Value::Object(error)) if error.get("message").is_some_and(Value::is_string) => {
            WireError::new(
                error
                    .get("code")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                error["message"].as_str().unwrap_or_default(),
            )
        }
        _ => WireError::new("", message),
    }
}

/// The store's clock when the transaction began, as Juju's statuses show a time
/// (`since`): RFC 3339 in UTC, to the second.
pub fn now_rfc3339(tx: &dyn Tx) -> String {
    lockstep_transport::facade::client::rfc3339(tx.now().0 / 1000)
}

/// The id of the settings document that holds the model config's stored keys.
pub const MODEL_SETTINGS: &str = "model";

/// The id of the settings document that holds the API's sequences (relation ids, local
/// charm revisions): numbers never handed out twice, even after what had them is gone.
pub const SEQUENCES: &str = "sequences";

/// The next number of sequence `name` (0 first), written in the same transaction.
pub fn next_sequence(tx: &mut dyn Tx, name: &str) -> Result<u64, StoreError> {
    let mut sequences = tx
        .document(EntityKind::Settings, SEQUENCES)?
        .unwrap_or_else(|| Value::Object(Map::new()));
    let next = sequences.get(name).and_then(Value::as_u64).unwrap_or(0);
    sequences[name] = Value::from(next + 1);
    tx.put_document(EntityKind::Settings, SEQUENCES, &sequences)?;
    Ok(next)
}

/// A document as a JSON object, or the store's decode error naming it.
pub fn object<'a>(
    document: &'a mut Value,
    what: &str,
) -> Result<&'a mut Map<String, Value>, StoreError> {
    document.as_object_mut().ok_or_else(|| StoreError::Decode {
        what: what.to_owned(),
        detail: "the document is not a JSON object".to_owned(),
    })
}

/// An entity tag's id: `machine-1` → `1`, `unit-pg-0` → `pg/0`, `application-pg` → `pg`
/// (Juju's tag grammar; a unit's last hyphen is its number's `/`).
pub fn tag_id(tag: &str, kind: &str) -> Option<String> {
    let id = tag.strip_prefix(kind)?.strip_prefix('-')?;
    if id.is_empty() {
        return None;
    }
    match kind {
        "machine" => lockstep_transport::auth::machine_id(tag),
        "unit" => {
            let (application, number) = id.rsplit_once('-')?;
            (!application.is_empty()
                && number.bytes().all(|b| b.is_ascii_digit())
                && !number.is_empty())
            .then(|| format!("{application}/{number}"))
        }
        _ => Some(id.to_owned()),
    }
}
