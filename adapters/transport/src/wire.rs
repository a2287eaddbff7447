//! The JSON-RPC framing of Juju's API, both generations, as pure functions.
//!
//! A request is one JSON object per websocket text frame:
//! `{"request-id": N, "type": F, "version": V, "id": I, "request": M, "params": {...}}`.
//! python-libjuju sends `Id` instead of `id`; `params` may be missing or null. Juju 1.x
//! clients use `RequestId, Type, Version, Id, Request, Params`: a message without
//! `request-id` is parsed that way and answered in the same style. Request ids are not
//! unique on a connection (python-jujuclient resends a frame with the same id on retry):
//! they are echoed, never checked.
//!
//! A reply is `{"request-id": N, "response": {...}}` or, for an error,
//! `{"request-id": N, "error": M, "error-code": C, "error-info": {...}, "response": {}}`:
//! the empty `response` is required by python-libjuju.

use lockstep_core::gate;
use lockstep_core::lifecycle::Revision;
use serde_json::{Map, Value, json};

/// The Juju API level lockstep speaks, advertised in Login's `server-version` and sent as
/// lockstep's client's `client-version`: python-libjuju accepts only major 3 (CONTRACT.md,
/// "Versions"). The agent's own version is reported by status.
pub const SERVER_VERSION: &str = "3.6.1";

/// Largest frame accepted, in bytes. Juju's own requests are a few KiB; a bundle deploy
/// stays well under this.
pub const FRAME_SIZE_BYTES_MAX: usize = 1 << 20;

/// Which generation of the framing a request used; its reply uses the same.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Framing {
    /// Juju 2.x and later: kebab-case keys.
    Current,
    /// Juju 1.x: CamelCase keys.
    Legacy,
}

/// One decoded request.
#[derive(Clone, PartialEq, Debug)]
pub struct Request {
    pub request_id: u64,
    pub facade: String,
    pub version: u32,
    /// The object id (watcher ids); empty when absent.
    pub id: String,
    pub method: String,
    /// The params object; `Value::Null` when absent.
    pub params: Value,
    pub framing: Framing,
}

/// A frame that is not a request; answered with code `bad request` where possible.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DecodeError {
    /// The request id, if the frame had a readable one.
    pub request_id: Option<u64>,
    pub framing: Framing,
    pub message: String,
}

/// Decodes one text frame.
pub fn decode(text: &str) -> Result<Request, DecodeError> {
    let error = |request_id, framing, message: String| DecodeError {
        request_id,
        framing,
        message,
    };
    if text.len() > FRAME_SIZE_BYTES_MAX {
        return Err(error(
            None,
            Framing::Current,
            format!(
                "frame of {} bytes is over the limit of {FRAME_SIZE_BYTES_MAX}",
                text.len()
            ),
        ));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| error(None, Framing::Current, format!("malformed JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(error(
            None,
            Framing::Current,
            "a request must be a JSON object".to_owned(),
        ));
    };
    let framing = if object.contains_key("request-id") {
        Framing::Current
    } else {
        Framing::Legacy
    };
    let keys = match framing {
        Framing::Current => ["request-id", "type", "version", "id", "request", "params"],
        Framing::Legacy => ["RequestId", "Type", "Version", "Id", "Request", "Params"],
    };
    let request_id = object.get(keys[0]).and_then(Value::as_u64).ok_or_else(|| {
        error(
            None,
            framing,
            format!("{} must be a non-negative integer", keys[0]),
        )
    })?;
    let text_field = |key: &str, required: bool| -> Result<String, DecodeError> {
        match object.get(key) {
            Some(Value::String(text)) => Ok(text.clone()),
            None | Some(Value::Null) if !required => Ok(String::new()),
            other => Err(error(
                Some(request_id),
                framing,
                format!("{key} must be a string, got {}", describe(other)),
            )),
        }
    };
    let facade = text_field(keys[1], true)?;
    let method = text_field(keys[4], true)?;
    // python-libjuju sends "Id" even in the current framing.
    let id = match (object.get(keys[3]), object.get("Id")) {
        (Some(_), _) => text_field(keys[3], false)?,
        (None, Some(_)) => text_field("Id", false)?,
        (None, None) => String::new(),
    };
    let version = match object.get(keys[2]) {
        None | Some(Value::Null) => 0,
        Some(value) => value
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| {
                error(
                    Some(request_id),
                    framing,
                    format!("{} must be a small integer, got {value}", keys[2]),
                )
            })?,
    };
    let params = object.get(keys[5]).cloned().unwrap_or(Value::Null);
    Ok(Request {
        request_id,
        facade,
        version,
        id,
        method,
        params,
        framing,
    })
}

/// What the launcher needs of a request to relay it ([`peek`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Head {
    pub request_id: u64,
    pub framing: Framing,
    pub facade: String,
    pub method: String,
}

/// A request's [`Head`], read without building its params or its other fields: for a
/// frame [`decode`] accepts, the same id, framing, facade and method, or `None`; `None`
/// for anything that is not plainly a request (text that is not JSON or not an object, a
/// duplicate key, a head field of another type), which [`decode`] then names. A frame
/// `decode` refuses may still have a head, when what is wrong is in a field the peek skips
/// (a `version` that is not a number, params nested deeper than `decode` reads): the
/// worker's `decode` answers such a frame `bad request`.
pub fn peek(text: &str) -> Option<Head> {
    /// Present, even as `null` (which `decode` refuses): absent and null differ here.
    fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<Option<Value>, D::Error> {
        <Value as serde::Deserialize>::deserialize(value).map(Some)
    }
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(rename = "request-id", default, deserialize_with = "present")]
        current_id: Option<Value>,
        #[serde(rename = "type", borrow, default)]
        current_type: Option<std::borrow::Cow<'a, str>>,
        #[serde(rename = "request", borrow, default)]
        current_request: Option<std::borrow::Cow<'a, str>>,
        #[serde(rename = "RequestId", default, deserialize_with = "present")]
        legacy_id: Option<Value>,
        #[serde(rename = "Type", borrow, default)]
        legacy_type: Option<std::borrow::Cow<'a, str>>,
        #[serde(rename = "Request", borrow, default)]
        legacy_request: Option<std::borrow::Cow<'a, str>>,
    }
    // A struct reads from a JSON array too, positionally; a request is an object.
    if text.len() > FRAME_SIZE_BYTES_MAX || !text.trim_start().starts_with('{') {
        return None;
    }
    let peek: Peek<'_> = serde_json::from_str(text).ok()?;
    let (id, facade, method, framing) = match peek.current_id {
        Some(id) => (
            id,
            peek.current_type?,
            peek.current_request?,
            Framing::Current,
        ),
        None => (
            peek.legacy_id?,
            peek.legacy_type?,
            peek.legacy_request?,
            Framing::Legacy,
        ),
    };
    Some(Head {
        request_id: id.as_u64()?,
        framing,
        facade: facade.into_owned(),
        method: method.into_owned(),
    })
}

fn describe(value: Option<&Value>) -> String {
    match value {
        None => "nothing".to_owned(),
        Some(value) => value.to_string(),
    }
}

/// An error to put on the wire.
#[derive(Clone, PartialEq, Debug)]
pub struct WireError {
    pub message: String,
    /// Empty for errors Juju sends without a code (e.g. `not redirected`).
    pub code: String,
    /// Machine-readable detail (`error-info`); `None` to leave it out.
    pub info: Option<Value>,
}

impl WireError {
    pub fn new(code: &str, message: impl Into<String>) -> WireError {
        WireError {
            message: message.into(),
            code: code.to_owned(),
            info: None,
        }
    }

    /// Juju's `ErrPerm`: a login calling a facade it may not, or an agent asking about an
    /// entity other than itself.
    pub fn permission_denied() -> WireError {
        WireError::new("unauthorized access", "permission denied")
    }

    /// The error as Juju's per-entity result lists carry it: `{"message", "code"}`, the
    /// code left out when empty.
    pub fn result_json(&self) -> Value {
        if self.code.is_empty() {
            json!({"message": self.message})
        } else {
            json!({"message": self.message, "code": self.code})
        }
    }
}

/// The gate's refusal as Juju sends it: its message and code, its detail in `error-info`.
impl From<gate::Rejection> for WireError {
    fn from(rejection: gate::Rejection) -> WireError {
        WireError {
            message: rejection.message.into_owned(),
            code: rejection.code.to_owned(),
            info: rejection
                .detail
                .map(|detail| serde_json::to_value(detail).expect("error-info serialises")),
        }
    }
}

/// One AllWatcher delta as delivered: `[kind, "change"|"remove", entity]` and the revision
/// of the event it reports (`revisions` in `AllWatcher.Next`'s answer, our extension).
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub revision: Revision,
    pub delta: Value,
}

/// Encodes a successful reply.
pub fn encode_response(request_id: u64, framing: Framing, response: Value) -> String {
    let mut reply = Map::new();
    match framing {
        Framing::Current => {
            reply.insert("request-id".into(), json!(request_id));
            reply.insert("response".into(), response);
        }
        Framing::Legacy => {
            reply.insert("RequestId".into(), json!(request_id));
            reply.insert("Response".into(), response);
        }
    }
    Value::Object(reply).to_string()
}

/// Encodes an error reply, with the empty `response` python-libjuju needs.
pub fn encode_error(request_id: u64, framing: Framing, error: &WireError) -> String {
    let mut reply = Map::new();
    let keys = match framing {
        Framing::Current => [
            "request-id",
            "error",
            "error-code",
            "error-info",
            "response",
        ],
        Framing::Legacy => ["RequestId", "Error", "ErrorCode", "ErrorInfo", "Response"],
    };
    reply.insert(keys[0].into(), json!(request_id));
    reply.insert(keys[1].into(), json!(error.message));
    if !error.code.is_empty() {
        reply.insert(keys[2].into(), json!(error.code));
    }
    if let Some(info) = &error.info {
        reply.insert(keys[3].into(), info.clone());
    }
    reply.insert(keys[4].into(), json!({}));
    Value::Object(reply).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_framings_and_libjujus_capital_id() {
        let current = decode(
            r#"{"request-id": 7, "type": "AllWatcher", "version": 1, "Id": "3", "request": "Next", "params": null}"#,
        )
        .unwrap();
        assert_eq!(
            (current.request_id, current.facade.as_str(), current.version),
            (7, "AllWatcher", 1)
        );
        assert_eq!(
            (current.id.as_str(), current.method.as_str()),
            ("3", "Next")
        );
        assert_eq!(current.framing, Framing::Current);
        assert_eq!(current.params, Value::Null);
        let legacy = decode(
            r#"{"RequestId": 1, "Type": "Client", "Version": 0, "Request": "FullStatus", "Params": {"patterns": []}}"#,
        )
        .unwrap();
        assert_eq!(legacy.framing, Framing::Legacy);
        assert_eq!(
            (legacy.facade.as_str(), legacy.method.as_str()),
            ("Client", "FullStatus")
        );
        assert_eq!(legacy.params, json!({"patterns": []}));
    }

    /// [`peek`] is [`decode`]'s head or nothing, on frames of every shape.
    #[test]
    fn a_peek_agrees_with_the_decode_or_declines() {
        let frames = [
            r#"{"request-id": 3, "type": "Pinger", "version": 1, "request": "Ping"}"#,
            r#"{"RequestId": 3, "Type": "Client", "Version": 1, "Request": "FullStatus", "Params": {}}"#,
            r#"{"request-id": 4, "type": "AllWatcher", "Id": "7", "request": "Next"}"#,
            r#"{"request-id": 5, "type": "Pin\u0067er", "request": "Ping"}"#,
            r#"{"request-id": null, "RequestId": 5, "Type": "Pinger", "Request": "Ping"}"#,
            r#"{"request-id": 5, "Type": "Pinger", "Request": "Ping"}"#,
            r#"{"request-id": 5, "request-id": 6, "type": "Pinger", "request": "Ping"}"#,
            r#"{"request-id": -1, "type": "Pinger", "request": "Ping"}"#,
            r#"{"request-id": 1.0, "type": "Pinger", "request": "Ping"}"#,
            r#"{"request-id": 1, "type": 7, "request": "Ping"}"#,
            r#"{"request-id": 1, "type": "Pinger", "request": null}"#,
            r#"{"request-id": 1, "type": "Pinger", "request": "Ping", "version": "x"}"#,
            r#"[1, "Pinger", "Ping"]"#,
            r#"{"request-id": 1, "type": "Pinger", "request": "Ping"} trailing"#,
            r#"not json"#,
            "",
        ];
        for frame in frames {
            match (peek(frame), decode(frame)) {
                (Some(head), Ok(request)) => {
                    assert_eq!(
                        head,
                        Head {
                            request_id: request.request_id,
                            framing: request.framing,
                            facade: request.facade,
                            method: request.method,
                        },
                        "{frame}"
                    );
                }
                (Some(head), Err(error)) => {
                    // Only a field the launcher does not read may be wrong: the worker's
                    // decode answers it, under the same id and framing.
                    assert_eq!(error.request_id, Some(head.request_id), "{frame}");
                    assert_eq!(error.framing, head.framing, "{frame}");
                }
                (None, _) => {}
            }
        }
        assert_eq!(
            peek(frames[0]).map(|head| head.method),
            Some("Ping".to_owned())
        );
        assert_eq!(
            peek(frames[1]).map(|head| head.framing),
            Some(Framing::Legacy)
        );
        assert_eq!(
            peek(frames[3]).map(|head| head.facade),
            Some("Pinger".to_owned())
        );
        for declined in [4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15] {
            assert_eq!(peek(frames[declined]), None, "{}", frames[declined]);
        }
    }

    #[test]
    fn refuses_bad_frames_naming_the_problem() {
        let cases = [
            ("{", "malformed JSON", None),
            ("[1]", "must be a JSON object", None),
            (r#"{"request-id": -1}"#, "request-id must be", None),
            (
                r#"{"request-id": 4, "type": 5, "request": "Ping"}"#,
                "type must be a string, got 5",
                Some(4),
            ),
            (
                r#"{"request-id": 4, "type": "Pinger", "version": "x", "request": "Ping"}"#,
                "version must be a small integer",
                Some(4),
            ),
            (
                r#"{"request-id": 4, "type": "Pinger"}"#,
                "request must be a string, got nothing",
                Some(4),
            ),
        ];
        for (text, expected, request_id) in cases {
            let error = decode(text).unwrap_err();
            assert!(
                error.message.contains(expected),
                "{text}: {}",
                error.message
            );
            assert_eq!(error.request_id, request_id, "{text}");
        }
        let huge = format!("\"{}\"", "x".repeat(FRAME_SIZE_BYTES_MAX));
        assert!(
            decode(&huge)
                .unwrap_err()
                .message
                .contains("over the limit")
        );
    }

    #[test]
    fn error_replies_carry_an_empty_response() {
        let error = WireError {
            message: "upgrade in progress".into(),
            code: "upgrade in progress".into(),
            info: Some(json!({"phase": "running-steps"})),
        };
        let reply: Value =
            serde_json::from_str(&encode_error(9, Framing::Current, &error)).unwrap();
        assert_eq!(
            reply,
            json!({"request-id": 9, "error": "upgrade in progress", "error-code": "upgrade in progress",
                   "error-info": {"phase": "running-steps"}, "response": {}})
        );
        let plain = WireError::new("", "not redirected");
        let reply: Value = serde_json::from_str(&encode_error(2, Framing::Legacy, &plain)).unwrap();
        assert_eq!(
            reply,
            json!({"RequestId": 2, "Error": "not redirected", "Response": {}})
        );
    }
}
