//! `Pinger.Ping`: answers at once, in every phase (python-libjuju pings while a watcher's
//! `Next` is blocked).

use serde_json::{Value, json};

use crate::wire::WireError;

/// `Pinger.Ping`.
pub fn ping() -> Result<Value, WireError> {
    Ok(json!({}))
}
