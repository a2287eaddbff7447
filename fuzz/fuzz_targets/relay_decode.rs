//! Relay frames come from the other process of the controller, which may be a different
//! version of lockstep (a newer worker under an older launcher): decoding, in either relay
//! version, must never panic,
//! a decoded message that encodes within the bound must read back the same, and the operation-id stamped on
//! any call it carries must be bounded and a function of the call alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_transport::relay::{self, Message};
use lockstep_transport::wire;

fuzz_target!(|data: &[u8]| {
    // Version 2's framing (an envelope, a newline, the raw frame) reads back the same too.
    if let Ok(message) = relay::decode_in(2, data)
        && let Ok(encoded) = relay::encode_in(2, &message)
    {
        assert_eq!(relay::decode_in(2, &encoded).as_ref(), Ok(&message));
    }
    let Ok(message) = relay::decode(data) else {
        return;
    };
    if let Ok(encoded) = relay::encode(&message) {
        assert_eq!(relay::decode(&encoded).as_ref(), Ok(&message));
    }
    match &message {
        Message::Call(call) => {
            if let Ok(request) = wire::decode(&call.frame) {
                let boot = "0123456789abcdef";
                let stamp = relay::operation_id(boot, u64::MAX, &request);
                assert_eq!(stamp, relay::operation_id(boot, u64::MAX, &request));
                if let Some(id) = stamp {
                    assert!(id.len() <= relay::NAME_BYTES_MAX, "{id}");
                    assert!(id.is_ascii());
                }
            }
        }
        Message::Hello(hello) => {
            let _ = relay::choose(&hello.versions);
        }
        _ => {}
    }
});
