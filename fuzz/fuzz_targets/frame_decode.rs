//! Frames come from any client on the network: decoding must never panic, whatever it is
//! given, and a decoded request's reply must always be well-formed JSON carrying its id and
//! the empty `response` python-libjuju needs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_transport::wire::{self, WireError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
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
