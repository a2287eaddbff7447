//! Frames come from any client on the network: decoding (and the launcher's peek, which
//! must agree with it) must never panic, whatever it is given, and a decoded request's
//! reply must always be well-formed JSON carrying its id and the empty `response`
//! python-libjuju needs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_transport::wire::{self, WireError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The launcher's peek is the head of every request the decode accepts, or nothing.
    // (Where the decode refuses a frame the peek read, a field the peek skips is bad, or
    // nests deeper than the decode allows: the worker's decode answers it.)
    if let (Some(head), Ok(request)) = (wire::peek(text), wire::decode(text)) {
        assert_eq!(head.request_id, request.request_id);
        assert_eq!(head.framing, request.framing);
        assert_eq!(head.facade, request.facade);
        assert_eq!(head.method, request.method);
    }
    match wire::decode(text) {
        Ok(request) => {
            let reply = wire::encode_error(
                request.request_id,
                request.framing,
                &WireError::new("not implemented", request.method.clone()),
            );
            let value: serde_json::Value = serde_json::from_str(&reply).expect("replies are JSON");
            let id_key = match request.framing {
                wire::Framing::Current => "request-id",
                wire::Framing::Legacy => "RequestId",
            };
            assert_eq!(value[id_key], request.request_id);
            let ok = wire::encode_response(request.request_id, request.framing, request.params);
            serde_json::from_str::<serde_json::Value>(&ok).expect("replies are JSON");
        }
        Err(error) => {
            let reply = wire::encode_error(
                error.request_id.unwrap_or(0),
                error.framing,
                &WireError::new("bad request", error.message),
            );
            serde_json::from_str::<serde_json::Value>(&reply).expect("replies are JSON");
        }
    }
});
