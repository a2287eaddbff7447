//! The relay protocol between the launcher, which will own the clients' connections, and the
//! worker that serves them (`spec/relay.md`): its messages, their framing and bounds, the
//! version negotiation, and the operation-id the launcher stamps on a call that changes
//! state so that its replay on the next worker is applied once.
//!
//! Pure: no socket here. A stream is framed with [`framing_to_worker`] one way and
//! [`framing_to_launcher`] the other (tokio-util's length-delimited codec, each direction
//! bounded) and each frame read with [`decode`], which refuses, naming the bad value,
//! anything that is not one of the messages.

use std::net::SocketAddr;

use lockstep_core::gate::{self, Login};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::codec::LengthDelimitedCodec;

use crate::journal::{Shape, SocketCounters};
use crate::leased::Kept;
use crate::records::SessionState;
use crate::wire::{self, FRAME_SIZE_BYTES_MAX};

/// The relay versions this build speaks, oldest first. A newer worker keeps speaking the
/// version of the launcher it finds: a self-upgrade replaces the worker, never the launcher.
///
/// - 1: each connection's messages on its own stream of the socket, an API frame carried as
///   a JSON string in `call` and `reply`.
/// - 2: after `open`, the worker hands the launcher two pipes ([`Message::Pipes`]) and the
///   connection's messages go over them (a pipe's round trip costs about half a unix
///   socket's); `call` and `reply` carry their API frame raw after their envelope
///   ([`encode_in`]), so it is neither escaped nor parsed on the way.
/// - 3: version 2, and `lease` ([`Message::Lease`]): the launcher may hand the worker a
///   connection's socket itself, with a journal to take it back from
///   ([`crate::lease`]).
pub const VERSIONS: &[u32] = &[1, 2, 3];

/// The first version in which a connection's messages go over pipes, their frames raw.
pub const PIPES_VERSION: u32 = 2;

/// The first version in which the launcher may lease a connection to the worker; the
/// message after `welcome` is read with the descriptors riding on it.
pub const LEASE_VERSION: u32 = 3;

/// The largest API reply a `reply` carries: the API's default bound on the reply bytes all
/// connections may hold unwritten (`--max-reply-bytes`). A worker answers a call whose reply
/// is larger with an error instead.
pub const REPLY_FRAME_BYTES_MAX: usize = 64 << 20;

/// The largest relay frame from launcher to worker: a `call` carries a client's frame (at
/// most the API's [`FRAME_SIZE_BYTES_MAX`]) as a JSON string, whose escaping at most doubles
/// it, plus room for the envelope.
pub const TO_WORKER_FRAME_BYTES_MAX: usize = 2 * FRAME_SIZE_BYTES_MAX + (64 << 10);

/// The largest relay frame from worker to launcher: a `reply` of at most
/// [`REPLY_FRAME_BYTES_MAX`], escaped, plus room for the envelope.
pub const TO_LAUNCHER_FRAME_BYTES_MAX: usize = 2 * REPLY_FRAME_BYTES_MAX + (64 << 10);

/// The worker's relay socket, in the data directory.
pub const SOCKET_NAME: &str = "relay.sock";

/// The most versions a `hello` or `refused` may list.
pub const VERSIONS_LISTED_MAX: usize = 16;

/// The most watchers an `open` may carry over.
pub const WATCHERS_CARRIED_MAX: usize = 1024;

/// The longest text field of an envelope that is not a frame (a tag, a path, a reason).
pub const NAME_BYTES_MAX: usize = 1024;

/// One relay message: a JSON object with one key, the message's name.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Message {
    /// Launcher → worker, first on every stream: the versions the launcher speaks.
    Hello(Hello),
    /// Worker → launcher: the version chosen.
    Welcome(Welcome),
    /// Worker → launcher: no version in common; the worker closes the stream.
    Refused(Refused),
    /// Launcher → worker: the stream serves this websocket connection.
    Open(Open),
    /// Launcher → worker: the stream carries plain HTTP/1.1 from here on.
    Http(HttpOpen),
    /// Launcher → worker: one of the client's requests.
    Call(Call),
    /// Worker → launcher: one reply for the client, with what the launcher keeps.
    Reply(Reply),
    /// Worker → launcher: close the client's connection so.
    Close(Close),
    /// Worker → launcher, version 2, answering `open`: two pipes ride with this frame as
    /// `SCM_RIGHTS`, the write end of the launcher's calls and the read end of the worker's
    /// replies; the connection's messages go over them from here on, and the stream ends.
    Pipes(Pipes),
    /// Launcher → worker, version 3, instead of `open`: the client connection's socket and
    /// its journal's memory file ride with this frame as `SCM_RIGHTS`; the worker serves
    /// the connection on them until it closes the stream, and the launcher then takes the
    /// connection back from the journal.
    Lease(Box<LeaseOpen>),
}

/// `lease`: the connection, as `open` names it, where its session and its socket stand
/// (the fields of a [`crate::journal::Lease`]), and what the launcher keeps of it
/// ([`Kept`]: the login and the watchers' positions; a connection is leased with no call
/// pending).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LeaseOpen {
    pub connection: u64,
    pub peer: SocketAddr,
    pub reached: Option<SocketAddr>,
    pub path: String,
    pub shape: Shape,
    pub session: SessionState,
    pub counters: SocketCounters,
    /// Ciphertext read from the socket and not opened, in base64.
    #[serde(with = "base64_bytes")]
    pub read_ahead: Vec<u8>,
    pub skip: u64,
    pub kept: Kept,
}

impl LeaseOpen {
    /// The journal's lease: this message's, with `kept` as its application state.
    pub fn lease(&self) -> crate::journal::Lease {
        crate::journal::Lease {
            shape: self.shape,
            session: self.session.clone(),
            counters: self.counters,
            read_ahead: self.read_ahead.clone(),
            skip: self.skip,
            app: self.kept.encode(),
        }
    }
}

/// Bytes as a base64 string (standard alphabet, padded).
mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// The largest ring a lease may name: a journal the worker maps is at most about twice this.
pub const LEASE_RING_BYTES_MAX: usize = 16 << 20;

/// `pipes`: nothing but the two descriptors that ride with it.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Pipes {}

/// `hello`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Every relay version the launcher speaks.
    pub versions: Vec<u32>,
    /// The launcher's agent version (for logs).
    pub launcher: String,
    /// Random per launcher start, 16 lowercase hex digits: the first part of every
    /// operation-id the launcher stamps.
    pub boot: String,
}

/// `welcome`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Welcome {
    pub version: u32,
    /// The worker's agent version (for logs).
    pub worker: String,
}

/// `refused`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Refused {
    pub reason: String,
    /// The versions the worker speaks.
    pub versions: Vec<u32>,
}

/// `open`: a websocket connection, new or carried over from the previous worker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Open {
    /// The launcher's number for the client connection, unique per `boot`.
    pub connection: u64,
    /// The client's address.
    pub peer: SocketAddr,
    /// The address the client reached (agent binaries' URLs point there).
    pub reached: Option<SocketAddr>,
    /// The websocket's request path.
    pub path: String,
    /// The login the previous worker reported; `None` on a new connection.
    pub login: Option<CarriedLogin>,
    /// The client's watchers and the last revision each delivered.
    #[serde(default)]
    pub watchers: Vec<WatcherPosition>,
}

/// `http`: a plain HTTP connection (tools, charms, probes, metrics).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct HttpOpen {
    pub connection: u64,
    pub peer: SocketAddr,
    pub reached: Option<SocketAddr>,
}

/// A connection's login as a worker reported it: never a password.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CarriedLogin {
    /// The auth tag (`user-admin`, `machine-0`).
    pub tag: String,
    /// Never [`Login::Anonymous`].
    pub kind: Login,
}

/// A watcher and the last revision delivered to the client: `None` while no `Next` has
/// answered (the first sends the whole state).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct WatcherPosition {
    pub id: String,
    pub revision: Option<u64>,
    /// Set on the reply to `AllWatcher.Stop`: the watcher is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// The watchers as `open` carries them, from a connection's watchers and each one's last
/// revision delivered.
pub fn positions(
    watchers: &std::collections::BTreeMap<String, Option<u64>>,
) -> Vec<WatcherPosition> {
    watchers
        .iter()
        .map(|(id, revision)| WatcherPosition {
            id: id.clone(),
            revision: *revision,
            stopped: false,
        })
        .collect()
}

/// `call`: the client's frame as it came, and the operation-id the launcher stamped on it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Call {
    pub frame: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// Sent before to a worker that went without answering it: a call this worker's gate
    /// refuses while it is not Ready waits for Ready (at most [`REPLAY_WAIT_MAX`]) rather
    /// than be refused, since the worker that went may have committed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
}

/// How long a `replayed` call waits for the worker to be Ready before its gate answers it.
pub const REPLAY_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// `reply`: the frame the client gets, unchanged, and what the launcher keeps of it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Reply {
    pub frame: String,
    /// The request id the frame answers, so that the launcher need not parse the frame for
    /// it (a worker before this field left it out: the launcher reads the frame then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    /// On the reply to a successful `Admin.Login`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<CarriedLogin>,
    /// On a reply that creates, advances or stops a watcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watcher: Option<WatcherPosition>,
}

/// `close`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Close {
    /// A websocket close code (1000-4999).
    pub code: u16,
    pub reason: String,
}

/// A frame that is not a relay message; the receiver closes the stream.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("relay frame refused: {0}")]
pub struct RelayError(pub String);

/// The framing of what the launcher sends: a 4-byte big-endian length, then the frame; a
/// length over [`TO_WORKER_FRAME_BYTES_MAX`] fails the stream before any of the frame is
/// buffered.
pub fn framing_to_worker() -> LengthDelimitedCodec {
    codec(TO_WORKER_FRAME_BYTES_MAX)
}

/// The framing of what the worker sends, bounded at [`TO_LAUNCHER_FRAME_BYTES_MAX`].
pub fn framing_to_launcher() -> LengthDelimitedCodec {
    codec(TO_LAUNCHER_FRAME_BYTES_MAX)
}

fn codec(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(max)
        .new_codec()
}

/// True for the messages a worker sends.
pub fn to_launcher(message: &Message) -> bool {
    matches!(
        message,
        Message::Welcome(_)
            | Message::Refused(_)
            | Message::Reply(_)
            | Message::Close(_)
            | Message::Pipes(_)
    )
}

/// The bytes of one frame in relay version `version`: as [`encode`], except that from
/// version 2 a `call` or a `reply` is its envelope without `frame`, a newline (`\n`, which
/// compact JSON never holds outside a string), then the API frame's own bytes.
pub fn encode_in(version: u32, message: &Message) -> Result<Vec<u8>, RelayError> {
    if version < PIPES_VERSION {
        return encode(message);
    }
    let (head, frame) = match message {
        Message::Call(call) => (
            serde_json::to_vec(&HeadRef::Call(CallHeadRef {
                operation_id: call.operation_id.as_deref(),
                replayed: call.replayed,
            })),
            call.frame.as_str(),
        ),
        Message::Reply(reply) => (
            serde_json::to_vec(&HeadRef::Reply(ReplyHeadRef {
                request_id: reply.request_id,
                login: reply.login.as_ref(),
                watcher: reply.watcher.as_ref(),
            })),
            reply.frame.as_str(),
        ),
        other => return encode(other),
    };
    let head = head.expect("relay envelopes serialize");
    let mut bytes = Vec::with_capacity(head.len() + 1 + frame.len());
    bytes.extend_from_slice(&head);
    bytes.push(b'\n');
    bytes.extend_from_slice(frame.as_bytes());
    within_bound(message, bytes)
}

/// Reads one frame of relay version `version` ([`encode_in`]): one of the messages, within
/// every bound; a raw API frame must be UTF-8 (it is checked as JSON where it is served).
pub fn decode_in(version: u32, frame: &[u8]) -> Result<Message, RelayError> {
    if version < PIPES_VERSION {
        return decode(frame);
    }
    let Some(newline) = frame.iter().position(|&byte| byte == b'\n') else {
        return match decode(frame)? {
            message @ (Message::Call(_) | Message::Reply(_)) => Err(RelayError(format!(
                "a {} in version {version} carries its frame after a newline",
                if matches!(message, Message::Call(_)) {
                    "call"
                } else {
                    "reply"
                }
            ))),
            message => Ok(message),
        };
    };
    if frame.len() > TO_LAUNCHER_FRAME_BYTES_MAX {
        return Err(RelayError(format!(
            "{} bytes, over the limit of {TO_LAUNCHER_FRAME_BYTES_MAX}",
            frame.len()
        )));
    }
    let (head, tail) = (&frame[..newline], &frame[newline + 1..]);
    let head: Head = serde_json::from_slice(head)
        .map_err(|error| RelayError(format!("not a relay envelope: {error}")))?;
    let tail = std::str::from_utf8(tail)
        .map_err(|error| RelayError(format!("an API frame that is not UTF-8: {error}")))?
        .to_owned();
    let message = match head {
        Head::Call(head) => Message::Call(Call {
            frame: tail,
            operation_id: head.operation_id,
            replayed: head.replayed,
        }),
        Head::Reply(head) => Message::Reply(Reply {
            frame: tail,
            request_id: head.request_id,
            login: head.login,
            watcher: head.watcher,
        }),
    };
    validate(&message)?;
    Ok(message)
}

/// A version 2 envelope, as written.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
enum HeadRef<'a> {
    Call(CallHeadRef<'a>),
    Reply(ReplyHeadRef<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct CallHeadRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    operation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    replayed: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ReplyHeadRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    login: Option<&'a CarriedLogin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watcher: Option<&'a WatcherPosition>,
}

/// A version 2 envelope, as read.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Head {
    Call(CallHead),
    Reply(ReplyHead),
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct CallHead {
    #[serde(default)]
    operation_id: Option<String>,
    #[serde(default)]
    replayed: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ReplyHead {
    #[serde(default)]
    request_id: Option<u64>,
    #[serde(default)]
    login: Option<CarriedLogin>,
    #[serde(default)]
    watcher: Option<WatcherPosition>,
}

/// The bytes of one frame (without the length prefix); refused over the bound of its
/// direction (an API frame that is JSON text within its own bound never gets there: its
/// escaping at most doubles it).
pub fn encode(message: &Message) -> Result<Vec<u8>, RelayError> {
    let bytes = serde_json::to_vec(message).expect("relay messages serialize");
    within_bound(message, bytes)
}

/// `bytes`, the encoding of `message`, unless over the bound of its direction.
fn within_bound(message: &Message, bytes: Vec<u8>) -> Result<Vec<u8>, RelayError> {
    let max = if to_launcher(message) {
        TO_LAUNCHER_FRAME_BYTES_MAX
    } else {
        TO_WORKER_FRAME_BYTES_MAX
    };
    if bytes.len() > max {
        return Err(RelayError(format!(
            "{} bytes encoded, over the limit of {max}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads one frame: one of the messages, within every bound.
pub fn decode(frame: &[u8]) -> Result<Message, RelayError> {
    if frame.len() > TO_LAUNCHER_FRAME_BYTES_MAX {
        return Err(RelayError(format!(
            "{} bytes, over the limit of {TO_LAUNCHER_FRAME_BYTES_MAX}",
            frame.len()
        )));
    }
    let message: Message = serde_json::from_slice(frame)
        .map_err(|error| RelayError(format!("not a relay message: {error}")))?;
    validate(&message)?;
    Ok(message)
}

fn validate(message: &Message) -> Result<(), RelayError> {
    let name = |field: &str, text: &str| {
        if text.len() > NAME_BYTES_MAX {
            Err(RelayError(format!(
                "{field} of {} bytes, over the limit of {NAME_BYTES_MAX}",
                text.len()
            )))
        } else {
            Ok(())
        }
    };
    let versions = |versions: &[u32]| {
        if versions.is_empty() || versions.len() > VERSIONS_LISTED_MAX {
            Err(RelayError(format!(
                "{} versions listed; 1 to {VERSIONS_LISTED_MAX} expected",
                versions.len()
            )))
        } else {
            Ok(())
        }
    };
    let frame = |frame: &str, max: usize| {
        if frame.len() > max {
            Err(RelayError(format!(
                "an API frame of {} bytes, over the limit of {max}",
                frame.len()
            )))
        } else {
            Ok(())
        }
    };
    let login = |login: &CarriedLogin| {
        name("login tag", &login.tag)?;
        if login.kind == Login::Anonymous || login.tag.is_empty() {
            return Err(RelayError(format!(
                "login {:?} as {}: a carried login names a tag and is never anonymous",
                login.tag, login.kind
            )));
        }
        Ok(())
    };
    let watcher = |watcher: &WatcherPosition| name("watcher id", &watcher.id);
    match message {
        Message::Hello(hello) => {
            versions(&hello.versions)?;
            name("launcher version", &hello.launcher)?;
            if !is_boot(&hello.boot) {
                return Err(RelayError(format!(
                    "boot {:?}: 16 lowercase hex digits expected",
                    cut(&hello.boot)
                )));
            }
        }
        Message::Welcome(welcome) => name("worker version", &welcome.worker)?,
        Message::Refused(refused) => {
            versions(&refused.versions)?;
            name("reason", &refused.reason)?;
        }
        Message::Open(open) => {
            name("path", &open.path)?;
            if let Some(carried) = &open.login {
                login(carried)?;
            }
            if open.watchers.len() > WATCHERS_CARRIED_MAX {
                return Err(RelayError(format!(
                    "{} watchers carried, over the limit of {WATCHERS_CARRIED_MAX}",
                    open.watchers.len()
                )));
            }
            open.watchers.iter().try_for_each(watcher)?;
        }
        Message::Http(_) | Message::Pipes(_) => {}
        Message::Lease(open) => {
            name("path", &open.path)?;
            for (ring, bytes) in [
                ("read", open.shape.read_ring),
                ("write", open.shape.write_ring),
            ] {
                if bytes > LEASE_RING_BYTES_MAX {
                    return Err(RelayError(format!(
                        "a {ring} ring of {bytes} bytes, over the limit of {LEASE_RING_BYTES_MAX}"
                    )));
                }
            }
            if open.read_ahead.len() > open.shape.read_ring {
                return Err(RelayError(format!(
                    "{} bytes of read-ahead for a read ring of {}",
                    open.read_ahead.len(),
                    open.shape.read_ring
                )));
            }
            if let Some(carried) = &open.kept.login {
                login(carried)?;
            }
            if open.kept.watchers.len() > WATCHERS_CARRIED_MAX {
                return Err(RelayError(format!(
                    "{} watchers carried, over the limit of {WATCHERS_CARRIED_MAX}",
                    open.kept.watchers.len()
                )));
            }
            for id in open.kept.watchers.keys() {
                name("watcher id", id)?;
            }
            if !open.kept.pending.is_empty() {
                return Err(RelayError(format!(
                    "a lease with calls pending ({}): a connection is leased with none",
                    open.kept.pending.len()
                )));
            }
        }
        Message::Call(call) => {
            frame(&call.frame, FRAME_SIZE_BYTES_MAX)?;
            if let Some(id) = &call.operation_id {
                name("operation-id", id)?;
            }
        }
        Message::Reply(reply) => {
            frame(&reply.frame, REPLY_FRAME_BYTES_MAX)?;
            if let Some(carried) = &reply.login {
                login(carried)?;
            }
            if let Some(position) = &reply.watcher {
                watcher(position)?;
            }
        }
        Message::Close(close) => {
            name("reason", &close.reason)?;
            if !(1000..=4999).contains(&close.code) {
                return Err(RelayError(format!(
                    "close code {}: 1000 to 4999 expected",
                    close.code
                )));
            }
        }
    }
    Ok(())
}

/// The version a worker speaking [`VERSIONS`] chooses from a launcher's `hello`: the highest
/// both speak; `refused` when there is none.
pub fn choose(offered: &[u32]) -> Result<u32, Refused> {
    VERSIONS
        .iter()
        .rev()
        .find(|version| offered.contains(version))
        .copied()
        .ok_or_else(|| Refused {
            reason: format!(
                "the launcher speaks relay versions {offered:?}, this worker {VERSIONS:?}"
            ),
            versions: VERSIONS.to_vec(),
        })
}

/// The operation-id the launcher stamps on `request` (a client's call on its connection
/// number `connection`), or `None`: a call the gate lists as a read changes nothing and
/// needs none, and a call that carries its own `operation-id` keeps it.
///
/// `fd-<boot>-<connection>-<request-id>-<digest>`, `digest` the first 16 hex digits of the
/// SHA-256 of `[type, version, request, params]`: a call resent with the same request id
/// and content (python-jujuclient's retry) gets the same id, so the store applies it once;
/// a different call that reuses a request id gets another.
pub fn operation_id(boot: &str, connection: u64, request: &wire::Request) -> Option<String> {
    if gate::read_only(&request.facade, &request.method)
        || request.params.get("operation-id").is_some()
    {
        return None;
    }
    let content = serde_json::to_vec(&Value::Array(vec![
        Value::from(request.facade.as_str()),
        Value::from(request.version),
        Value::from(request.method.as_str()),
        request.params.clone(),
    ]))
    .expect("JSON values serialize");
    let digest = ring::digest::digest(&ring::digest::SHA256, &content);
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Some(format!(
        "fd-{boot}-{connection}-{}-{hex}",
        request.request_id
    ))
}

/// A random `boot`: 16 lowercase hex digits.
pub fn new_boot() -> String {
    let mut bytes = [0_u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn is_boot(boot: &str) -> bool {
    boot.len() == 16 && boot.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn cut(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use serde_json::json;

    const SPEC: &str = include_str!("../../../spec/relay.md");

    fn request(text: &str) -> wire::Request {
        wire::decode(text).unwrap()
    }

    /// Every JSON example in spec/relay.md, in order.
    fn spec_examples() -> Vec<Value> {
        SPEC.split("```json\n")
            .skip(1)
            .filter_map(|block| block.split("\n```").next())
            .flat_map(|block| {
                serde_json::Deserializer::from_str(block)
                    .into_iter::<Value>()
                    .map(|value| value.unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn every_example_of_the_spec_is_a_message_and_reads_back_the_same() {
        let examples = spec_examples();
        assert!(examples.len() >= 9, "{} examples", examples.len());
        for example in examples {
            let message = decode(example.to_string().as_bytes())
                .unwrap_or_else(|error| panic!("{example}: {error}"));
            let again: Value = serde_json::from_slice(&encode(&message).unwrap()).unwrap();
            assert_eq!(again, example, "{message:?}");
        }
    }

    #[test]
    fn the_spec_examples_stamp_is_the_one_the_launcher_computes() {
        let call = spec_examples()
            .into_iter()
            .find_map(|example| match decode(example.to_string().as_bytes()) {
                Ok(Message::Call(call)) => Some(call),
                _ => None,
            })
            .expect("a call example");
        let boot = "9f1c04e2a7b35d68";
        assert_eq!(
            call.operation_id,
            operation_id(boot, 17, &request(&call.frame)),
            "spec/relay.md's call example"
        );
    }

    #[test]
    fn the_spec_names_this_builds_versions_and_bounds() {
        assert!(SPEC.contains("This document is version **3**."));
        assert_eq!(VERSIONS, &[1, 2, 3]);
        for bound in [
            "`TO_WORKER_FRAME_BYTES_MAX`",
            "`TO_LAUNCHER_FRAME_BYTES_MAX`",
            "`REPLY_FRAME_BYTES_MAX`",
            "`LEASE_RING_BYTES_MAX` = 16 MiB",
        ] {
            assert!(SPEC.contains(bound), "spec/relay.md lacks {bound}");
        }
        assert_eq!(
            REPLY_FRAME_BYTES_MAX,
            crate::limits::ApiLimits::default().reply_bytes_max
        );
        assert!(SPEC.contains(&format!("`<data-dir>/{SOCKET_NAME}`")));
    }

    #[test]
    fn a_lease_over_a_bound_is_refused_naming_the_bad_value() {
        let lease = spec_examples()
            .into_iter()
            .find(|example| example.get("lease").is_some())
            .expect("a lease example");
        assert!(decode(lease.to_string().as_bytes()).is_ok());
        let refused = |change: &dyn Fn(&mut Value)| {
            let mut bad = lease.clone();
            change(&mut bad["lease"]);
            decode(bad.to_string().as_bytes()).unwrap_err().0
        };
        let ring = refused(&|lease| lease["shape"]["read_ring"] = json!(LEASE_RING_BYTES_MAX + 1));
        assert!(ring.contains("a read ring of 16777217 bytes"), "{ring}");
        let ahead = refused(&|lease| {
            lease["shape"]["read_ring"] = json!(4);
            lease["read-ahead"] = json!("AAAAAAA=");
        });
        assert!(
            ahead.contains("5 bytes of read-ahead for a read ring of 4"),
            "{ahead}"
        );
        let pending = refused(&|lease| {
            lease["kept"]["pending"] =
                json!([{"request-id": 9, "frame": "{}", "operation-id": null}]);
        });
        assert!(pending.contains("calls pending (1)"), "{pending}");
        let anonymous =
            refused(&|lease| lease["kept"]["login"] = json!({"tag": "", "kind": "user"}));
        assert!(
            anonymous.contains("a carried login names a tag"),
            "{anonymous}"
        );
        let base64 = refused(&|lease| lease["read-ahead"] = json!("not base64!"));
        assert!(base64.contains("not a relay message"), "{base64}");
    }

    #[test]
    fn a_worker_chooses_the_highest_common_version_or_refuses_naming_both() {
        assert_eq!(choose(&[1]), Ok(1));
        assert_eq!(choose(&[0, 1, 7]), Ok(1));
        assert_eq!(choose(&[1, 2]), Ok(2));
        assert_eq!(choose(&[2, 3]), Ok(3));
        assert_eq!(choose(&[2, 3, 4]), Ok(3));
        let refused = choose(&[4, 5]).unwrap_err();
        assert_eq!(refused.versions, VERSIONS);
        assert_eq!(
            refused.reason,
            "the launcher speaks relay versions [4, 5], this worker [1, 2, 3]"
        );
    }

    /// Every version 2 example of spec/relay.md (its `relay-v2` blocks, one frame a line,
    /// the newline between envelope and frame written `⏎`).
    fn spec_v2_examples() -> Vec<Vec<u8>> {
        SPEC.split("```relay-v2\n")
            .skip(1)
            .filter_map(|block| block.split("\n```").next())
            .flat_map(|block| {
                block
                    .lines()
                    .map(|line| line.replacen('⏎', "\n", 1).into_bytes())
            })
            .collect()
    }

    #[test]
    fn version_2_carries_frames_raw_after_the_envelope_and_reads_back_the_same() {
        let examples = spec_v2_examples();
        assert!(examples.len() >= 3, "{} examples", examples.len());
        for example in examples {
            let message = decode_in(2, &example)
                .unwrap_or_else(|error| panic!("{}: {error}", String::from_utf8_lossy(&example)));
            assert_eq!(encode_in(2, &message).unwrap(), example);
        }
        let reply = Message::Reply(Reply {
            frame: r#"{"request-id":8,"response":{"name":"a \"quoted\" name"}}"#.to_owned(),
            request_id: Some(8),
            login: None,
            watcher: Some(WatcherPosition {
                id: "3".to_owned(),
                revision: Some(1057),
                stopped: false,
            }),
        });
        let bytes = encode_in(2, &reply).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(
            text,
            "{\"reply\":{\"request-id\":8,\"watcher\":{\"id\":\"3\",\"revision\":1057}}}\n\
             {\"request-id\":8,\"response\":{\"name\":\"a \\\"quoted\\\" name\"}}",
            "the frame follows the newline as it is, unescaped"
        );
        assert_eq!(decode_in(2, &bytes).unwrap(), reply);
        // Version 1 is unchanged: the frame a JSON string.
        assert_eq!(encode_in(1, &reply).unwrap(), encode(&reply).unwrap());
        assert_eq!(decode_in(1, &encode(&reply).unwrap()).unwrap(), reply);
        // Other messages are as in version 1.
        let close = Message::Close(Close {
            code: 1008,
            reason: "over a limit".to_owned(),
        });
        assert_eq!(encode_in(2, &close).unwrap(), encode(&close).unwrap());
        assert_eq!(decode_in(2, &encode(&close).unwrap()).unwrap(), close);
    }

    #[test]
    fn a_version_2_frame_that_is_not_an_envelope_and_a_frame_is_refused() {
        let cases: Vec<(&[u8], &str)> = vec![
            (
                br#"{"call":{"frame":"{}"}}"#,
                "a call in version 2 carries its frame after a newline",
            ),
            (b"{\"open\":{}}\n{}", "not a relay envelope"),
            (b"{\"call\":{}}\n\xff\xfe", "an API frame that is not UTF-8"),
            (b"not json\n{}", "not a relay envelope"),
        ];
        for (frame, expected) in cases {
            let error = decode_in(2, frame).unwrap_err();
            assert!(
                error.0.contains(expected),
                "{}: {error}",
                String::from_utf8_lossy(frame)
            );
        }
        let oversized = format!(
            "{{\"call\":{{}}}}\n{}",
            "x".repeat(FRAME_SIZE_BYTES_MAX + 1)
        );
        let error = decode_in(2, oversized.as_bytes()).unwrap_err();
        assert!(error.0.contains("an API frame of 1048577 bytes"), "{error}");
    }

    #[test]
    fn what_is_not_a_message_is_refused_naming_the_bad_value() {
        let boot = "9f1c04e2a7b35d68";
        let cases: Vec<(Value, &str)> = vec![
            (json!([1, 2]), "not a relay message"),
            (
                json!({"hello": {"versions": [1]}}),
                "missing field `launcher`",
            ),
            (json!({"goodbye": {}}), "unknown variant `goodbye`"),
            (
                json!({"hello": {"versions": [], "launcher": "0.1.0", "boot": boot}}),
                "0 versions listed",
            ),
            (
                json!({"hello": {"versions": [1], "launcher": "0.1.0", "boot": "XYZ"}}),
                "boot \"XYZ\": 16 lowercase hex digits expected",
            ),
            (
                json!({"open": {"connection": 1, "peer": "127.0.0.1:1", "reached": null,
                    "path": "/api", "login": {"tag": "user-admin", "kind": "anonymous"}}}),
                "never anonymous",
            ),
            (
                json!({"open": {"connection": 1, "peer": "not an address", "reached": null,
                    "path": "/api", "login": null}}),
                "invalid socket address",
            ),
            (json!({"close": {"code": 7, "reason": ""}}), "close code 7"),
            (
                json!({"call": {"frame": "x".repeat(FRAME_SIZE_BYTES_MAX + 1)}}),
                "an API frame of 1048577 bytes",
            ),
        ];
        for (frame, expected) in cases {
            let error = decode(frame.to_string().as_bytes()).unwrap_err();
            assert!(error.0.contains(expected), "{frame:.80}: {error}");
        }
        let watchers: Vec<Value> = (0..=WATCHERS_CARRIED_MAX)
            .map(|id| json!({"id": id.to_string(), "revision": 1}))
            .collect();
        let open = json!({"open": {"connection": 1, "peer": "127.0.0.1:1", "reached": null,
            "path": "/api", "login": null, "watchers": watchers}});
        let error = decode(open.to_string().as_bytes()).unwrap_err();
        assert!(error.0.contains("1025 watchers carried"), "{error}");
    }

    #[test]
    fn a_write_is_stamped_once_per_content_a_read_or_a_stamped_call_is_not() {
        let boot = "9f1c04e2a7b35d68";
        let deploy = r#"{"request-id": 8, "type": "Application", "version": 19,
            "request": "Deploy", "params": {"applications": [{"application": "mysql"}]}}"#;
        let stamped = operation_id(boot, 17, &request(deploy)).unwrap();
        assert!(
            stamped.starts_with("fd-9f1c04e2a7b35d68-17-8-"),
            "{stamped}"
        );
        assert_eq!(stamped.len(), "fd-9f1c04e2a7b35d68-17-8-".len() + 16);
        // python-jujuclient's retry: the same frame, the same id.
        assert_eq!(
            operation_id(boot, 17, &request(deploy)),
            Some(stamped.clone())
        );
        // The legacy framing of the same call is the same call.
        let legacy = r#"{"RequestId": 8, "Type": "Application", "Version": 19,
            "Request": "Deploy", "Params": {"applications": [{"application": "mysql"}]}}"#;
        assert_eq!(
            operation_id(boot, 17, &request(legacy)),
            Some(stamped.clone())
        );
        // Another connection, another launcher, or another call under the same request id.
        assert_ne!(
            operation_id(boot, 18, &request(deploy)),
            Some(stamped.clone())
        );
        assert_ne!(
            operation_id("0000000000000000", 17, &request(deploy)),
            Some(stamped.clone())
        );
        let other = deploy.replace("mysql", "wordpress");
        assert_ne!(operation_id(boot, 17, &request(&other)), Some(stamped));
        // Reads, logins and pings change nothing.
        for read in [
            r#"{"request-id": 1, "type": "Admin", "version": 3, "request": "Login", "params": {}}"#,
            r#"{"request-id": 2, "type": "Client", "version": 6, "request": "FullStatus"}"#,
            r#"{"request-id": 3, "type": "Pinger", "version": 1, "request": "Ping"}"#,
            r#"{"request-id": 4, "type": "AllWatcher", "version": 3, "id": "1", "request": "Next"}"#,
        ] {
            assert_eq!(operation_id(boot, 17, &request(read)), None, "{read}");
        }
        // A client's own operation-id is kept.
        let own = r#"{"request-id": 9, "type": "Client", "version": 6, "request": "AddMachines",
            "params": {"params": [], "operation-id": "mine"}}"#;
        assert_eq!(operation_id(boot, 17, &request(own)), None);
    }

    #[test]
    fn new_boots_are_well_formed_and_differ() {
        let (a, b) = (new_boot(), new_boot());
        assert!(is_boot(&a) && is_boot(&b), "{a} {b}");
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn frames_cross_a_stream_and_an_oversized_length_is_refused_unbuffered() {
        use tokio_util::codec::{FramedRead, FramedWrite};
        let (near, far) = tokio::io::duplex(1 << 16);
        let (far_read, _far_write) = tokio::io::split(far);
        let (_near_read, near_write) = tokio::io::split(near);
        let mut sink = FramedWrite::new(near_write, framing_to_worker());
        let mut stream = FramedRead::new(far_read, framing_to_worker());
        let hello = Message::Hello(Hello {
            versions: VERSIONS.to_vec(),
            launcher: "0.1.0".to_owned(),
            boot: new_boot(),
        });
        let bytes = encode(&hello).unwrap();
        sink.send(bytes.as_slice()).await.unwrap();
        let frame = stream.next().await.unwrap().unwrap();
        assert_eq!(decode(&frame).unwrap(), hello);

        // A length over the limit fails the stream at once.
        let (mut writer, reader) = tokio::io::duplex(64);
        let mut stream = FramedRead::new(reader, framing_to_worker());
        let length = u32::try_from(TO_WORKER_FRAME_BYTES_MAX + 1).unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut writer, &length.to_be_bytes())
            .await
            .unwrap();
        let error = stream.next().await.unwrap().unwrap_err();
        assert!(error.to_string().contains("frame size too big"), "{error}");
    }
}
