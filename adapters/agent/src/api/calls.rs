//! What every call of the API's shared state shares: the store's errors as the wire's, the
//! model, the params' common shapes, and one mutating call under its `operation-id`.

use lockstep_store::{Abort, Model, OperationOutcome, Store, StoreError, Tx, TxOutcome};
use lockstep_transport::wire::WireError;
use serde_json::Value;

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
            OperationOutcome::Failed(message) => Err(WireError::new("", message)),
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
                TxOutcome::Failed(message) => Err(WireError::new("", message)),
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

/// Ends a mutating call with `error`'s message, writing nothing.
pub fn failed(error: WireError) -> Abort {
    Abort::Failed(error.message)
}
