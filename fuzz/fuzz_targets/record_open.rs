//! TLS records come from any client once its handshake is done (`records.rs` carries every
//! connection's session after rustls's handshake): opening whatever bytes a client sends
//! must never panic, and what one end seals the other must open to the same bytes, in every
//! suite, whatever the chunks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_transport::records::{Opened, Session, SessionState};

const SUITES: [&str; 6] = [
    "TLS13_AES128_GCM_SHA256",
    "TLS13_AES256_GCM_SHA384",
    "TLS13_CHACHA20_POLY1305_SHA256",
    "TLS12_AES128_GCM",
    "TLS12_AES256_GCM",
    "TLS12_CHACHA20_POLY1305",
];

/// A session of `suite` with fixed secrets of the length the suite needs.
fn state(suite: usize) -> SessionState {
    let len = match suite {
        1 => 48,
        0 | 2 => 32,
        3 => 16 + 12,
        _ => 32 + 12,
    };
    let secret = |seed: u8| (0..len).map(|i| seed.wrapping_add(i as u8)).collect::<Vec<u8>>();
    serde_json::from_value(serde_json::json!({
        "suite": SUITES[suite],
        "rx": { "seq": 0, "secret": secret(1) },
        "tx": { "seq": 0, "secret": secret(2) },
    }))
    .expect("a session state")
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let suite = usize::from(first) % SUITES.len();
    let state = state(suite);

    // Whatever a client sends, opened record by record until an error or the end.
    let mut session = Session::new(&state).expect("a session");
    let mut input = rest.to_vec();
    let mut at = 0;
    let mut answers = Vec::new();
    while let Ok(Some((len, _))) = session.open(&mut input[at..], &mut answers) {
        at += len;
    }

    // Sealed by the peer in chunks the input chooses, opened to the same bytes.
    let mut peer = Session::new(&state.peer()).expect("the peer's session");
    let mut session = Session::new(&state).expect("a session");
    let chunk = usize::from(first / 6).max(1) * 97;
    for plain in rest.chunks(chunk) {
        let mut sealed = Vec::new();
        peer.seal(plain, &mut sealed).expect("sealed");
        let mut opened = Vec::new();
        let mut at = 0;
        while at < sealed.len() {
            let (len, what) = session
                .open(&mut sealed[at..], &mut answers)
                .expect("a record the peer sealed opens")
                .expect("whole");
            let Opened::Data(range) = what else {
                panic!("{what:?} where data was sealed");
            };
            opened.extend_from_slice(&sealed[at..][range]);
            at += len;
        }
        assert_eq!(opened, plain, "what was sealed opens the same");
    }
});
