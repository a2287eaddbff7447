//! `Charms` (v6): `ResolveCharms`, refused per charm. lockstep has no charm store: it
//! records local charms uploaded to its charms endpoint only. The facade is advertised so
//! that python-libjuju, which compares the negotiated `Charms` version with a number before
//! any non-local deploy, reaches this call and raises its own error instead of a
//! `TypeError`.

use serde_json::{Value, json};

use crate::wire::WireError;

/// `Charms.ResolveCharms {"resolve": [{"reference": "ch:ubuntu", "charm-origin"}]}` →
/// `{"Results": [{"error": {"message", "code"}}]}`, one per reference, in order (Juju's
/// `ResolveCharmWithChannelResults`, whose list key has no JSON tag): a `ch:` reference
/// (or a bare name, which is one) is refused because this controller has no charm store,
/// any other schema as Juju refuses it (`unknown schema for charm URL`).
pub fn resolve_charms(params: &Value) -> Result<Value, WireError> {
    let references = params
        .get("resolve")
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::new("bad request", "params.resolve must be a list"))?;
    let results: Vec<Value> = references
        .iter()
        .map(|reference| {
            let url = reference
                .get("reference")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let error = match url.split_once(':') {
                None | Some(("ch", _)) => WireError::new(
                    "not supported",
                    format!(
                        "cannot resolve charm {url:?}: this controller has no charm store \
                         (lockstep deploys local charms: deploy a charm directory)"
                    ),
                ),
                Some(_) => WireError::new("", format!("unknown schema for charm URL {url:?}")),
            };
            json!({"error": error.result_json()})
        })
        .collect();
    Ok(json!({"Results": results}))
}
