//! A client connection leased to the worker (ARCHITECTURE.md, "Handing each connection's
//! socket to the worker"): the worker serves the client's websocket on the client's own
//! socket, its session carried on by [`crate::records`] and kept in a
//! [`crate::journal`] with what the launcher keeps of a relayed connection ([`Kept`]), so
//! that the launcher can take the connection back when the worker dies.
//!
//! A journal ([`crate::journal`]) takes back, after its holder's death, everything the
//! holder had read and not *absorbed*. The holder absorbs a client's message once what it
//! did with it is in the journal's commit, so the absorbed point must fall on a message's
//! end. tungstenite reads ahead into a buffer of its own, which would put it anywhere:
//! [`FrameBounded`] hands tungstenite the stream's bytes one websocket frame at a time (it
//! reads each frame's header itself), so that when tungstenite returns a message it holds
//! no byte past it, and every byte handed on is the message's or an earlier one's.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::api::Api;
use crate::connection::REQUESTS_IN_FLIGHT_MAX;
use crate::journal::{APP_BYTES_MAX, JournaledStream};
use crate::relay::{self, CarriedLogin};
use crate::session::Session;
use crate::wire::{self, WireError};

/// What a leased connection's journal commits with its records: what the launcher keeps
/// of a relayed connection (its login, its watchers' positions, the calls taken and not
/// answered, each with the operation-id the launcher would have stamped on it), so that
/// the launcher can carry the connection on as its own when the worker dies.
#[derive(Clone, Default, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Kept {
    /// The login the connection made.
    pub login: Option<CarriedLogin>,
    /// Each watcher's last revision delivered (`None`: no `Next` answered yet).
    pub watchers: BTreeMap<String, Option<u64>>,
    /// Calls taken and not answered, in the order they came.
    pub pending: Vec<KeptCall>,
}

/// A call taken and not answered.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct KeptCall {
    /// Its request id.
    pub request_id: u64,
    /// The client's frame as it came.
    pub frame: String,
    /// The stamp the launcher would have put on it ([`relay::operation_id`]).
    pub operation_id: Option<String>,
}

impl Kept {
    /// The journal's application state: a length, the state without the calls' frames as
    /// JSON, then each frame as it came (no escaping, so that a large frame costs its size).
    pub fn encode(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Head<'a> {
            login: &'a Option<CarriedLogin>,
            watchers: &'a BTreeMap<String, Option<u64>>,
            pending: Vec<CallHead<'a>>,
        }
        #[derive(Serialize)]
        struct CallHead<'a> {
            request_id: u64,
            operation_id: &'a Option<String>,
            len: usize,
        }
        let head = serde_json::to_vec(&Head {
            login: &self.login,
            watchers: &self.watchers,
            pending: self
                .pending
                .iter()
                .map(|call| CallHead {
                    request_id: call.request_id,
                    operation_id: &call.operation_id,
                    len: call.frame.len(),
                })
                .collect(),
        })
        .expect("kept state serializes");
        let frames: usize = self.pending.iter().map(|call| call.frame.len()).sum();
        let mut out = Vec::with_capacity(4 + head.len() + frames);
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        for call in &self.pending {
            out.extend_from_slice(call.frame.as_bytes());
        }
        out
    }

    /// Read back from a journal's application state.
    pub fn decode(bytes: &[u8]) -> Result<Kept, String> {
        #[derive(Deserialize)]
        struct Head {
            login: Option<CarriedLogin>,
            watchers: BTreeMap<String, Option<u64>>,
            pending: Vec<CallHead>,
        }
        #[derive(Deserialize)]
        struct CallHead {
            request_id: u64,
            operation_id: Option<String>,
            len: usize,
        }
        if bytes.is_empty() {
            return Ok(Kept::default());
        }
        let bad = |why: String| format!("a leased connection's kept state: {why}");
        let head_len = bytes
            .get(..4)
            .map(|len| u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| bad(format!("{} bytes, no length", bytes.len())))?;
        let head: Head = bytes
            .get(4..4 + head_len)
            .ok_or_else(|| bad(format!("a head of {head_len} bytes in {}", bytes.len())))
            .and_then(|head| serde_json::from_slice(head).map_err(|e| bad(e.to_string())))?;
        let mut at = 4 + head_len;
        let mut pending = Vec::with_capacity(head.pending.len());
        for call in head.pending {
            let frame = bytes
                .get(at..at + call.len)
                .ok_or_else(|| bad(format!("call {} past the end", call.request_id)))?;
            let frame = String::from_utf8(frame.to_vec())
                .map_err(|_| bad(format!("call {}'s frame is not UTF-8", call.request_id)))?;
            at += call.len;
            pending.push(KeptCall {
                request_id: call.request_id,
                frame,
                operation_id: call.operation_id,
            });
        }
        Ok(Kept {
            login: head.login,
            watchers: head.watchers,
            pending,
        })
    }
}

/// Who the connection is to the launcher: what an operation-id is derived from.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Stamps {
    /// The launcher's boot.
    pub boot: String,
    /// The launcher's number for the connection.
    pub connection: u64,
}

/// Why a leased connection ended.
#[derive(Debug, thiserror::Error)]
pub enum LeasedError {
    /// The socket, its session or its journal failed.
    #[error("the leased connection's socket: {0}")]
    Io(#[from] io::Error),
    /// The websocket failed.
    #[error("the leased connection's websocket: {0}")]
    Websocket(#[from] tokio_tungstenite::tungstenite::Error),
    /// The client's socket took nothing for the API's write timeout (`--write-timeout-sec`).
    #[error("the client took none of its replies for {0:?} (--write-timeout-sec)")]
    WriteTimeout(std::time::Duration),
}

/// `write` (a send, a flush, a close), given up past `timeout`, as the worker's own server
/// gives up on a client that does not read.
async fn within<T>(
    timeout: std::time::Duration,
    write: impl std::future::Future<Output = Result<T, tokio_tungstenite::tungstenite::Error>>,
) -> Result<T, LeasedError> {
    match tokio::time::timeout(timeout, write).await {
        Ok(written) => Ok(written?),
        Err(_) => Err(LeasedError::WriteTimeout(timeout)),
    }
}

type Leased<S> = WebSocketStream<FrameBounded<JournaledStream<S>>>;

/// Serves a leased connection's websocket until the client goes: each call answered as a
/// relayed call is ([`crate::relayed`]), and what the launcher would keep committed to the
/// journal with the bytes it concerns. A client's message is absorbed (the journal's reads
/// move past it) once it is in `kept`, and both are committed with the next write; a reply
/// is committed with the call taken off `kept`. Until a commit a message stays in the
/// read ring, and the launcher that takes the connection back reads it again and forwards
/// it under the same operation-id, so that a write is applied once.
pub async fn serve<S>(
    api: &Api,
    session: &Session,
    stamps: &Stamps,
    mut kept: Kept,
    mut socket: Leased<S>,
) -> Result<(), LeasedError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let write_timeout = api.config.limits.write_timeout;
    let mut absorbed = socket.get_ref().handed();
    let mut answers = FuturesUnordered::new();
    // A call whose frame does not fit in what the journal keeps until others are answered:
    // neither absorbed nor kept, and nothing read after it, until it fits.
    let mut held: Option<relay::Call> = None;
    loop {
        let room = answers.len() < REQUESTS_IN_FLIGHT_MAX && held.is_none();
        tokio::select! {
            message = socket.next(), if room => {
                let Some(message) = message else { return Ok(()) };
                let frame = match message? {
                    WsMessage::Text(text) => text.as_str().to_owned(),
                    WsMessage::Binary(_) => {
                        let close = CloseFrame {
                            code: CloseCode::Unsupported,
                            reason: "the API takes text frames".into(),
                        };
                        let _ = within(write_timeout, socket.close(Some(close))).await;
                        return Ok(());
                    }
                    WsMessage::Close(_) => {
                        let _ = within(write_timeout, socket.close(None)).await;
                        return Ok(());
                    }
                    // tungstenite queues a ping's pong; the flush commits and writes it
                    // (a client's keepalive waits for it).
                    WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_) => {
                        absorb(&mut socket, &mut absorbed);
                        set_kept(&mut socket, &kept.encode())?;
                        within(write_timeout, socket.flush()).await?;
                        continue;
                    }
                };
                let call = match wire::decode(&frame) {
                    Ok(request) => relay::Call {
                        operation_id: relay::operation_id(&stamps.boot, stamps.connection, &request),
                        frame,
                        replayed: false,
                    },
                    Err(error) => {
                        let answer = wire::encode_error(
                            error.request_id.unwrap_or(0),
                            error.framing,
                            &WireError::new("bad request", error.message),
                        );
                        absorb(&mut socket, &mut absorbed);
                        set_kept(&mut socket, &kept.encode())?;
                        within(write_timeout, socket.send(WsMessage::text(answer))).await?;
                        continue;
                    }
                };
                if let Some(call) = take(&mut socket, &mut absorbed, &mut kept, call)? {
                    held = Some(call);
                    continue;
                }
                let call = kept.pending.last().expect("just taken");
                answers.push(crate::relayed::answer(api, session, relay::Call {
                    frame: call.frame.clone(),
                    operation_id: call.operation_id.clone(),
                    replayed: false,
                }));
            }
            Some(reply) = answers.next() => {
                if let Some(login) = reply.login {
                    kept.login = Some(login);
                }
                if let Some(watcher) = reply.watcher {
                    if watcher.stopped {
                        kept.watchers.remove(&watcher.id);
                    } else {
                        kept.watchers.insert(watcher.id, watcher.revision);
                    }
                }
                if let Some(id) = reply.request_id
                    && let Some(index) = kept.pending.iter().position(|call| call.request_id == id)
                {
                    kept.pending.remove(index);
                }
                set_kept(&mut socket, &kept.encode())?;
                // Sent and flushed: the commit (the reply's bytes with the call off `kept`),
                // then the write.
                within(write_timeout, socket.send(WsMessage::text(reply.frame))).await?;
                if let Some(call) = held.take() {
                    match take(&mut socket, &mut absorbed, &mut kept, call)? {
                        Some(call) => held = Some(call),
                        None => {
                            let call = kept.pending.last().expect("just taken");
                            answers.push(crate::relayed::answer(api, session, relay::Call {
                                frame: call.frame.clone(),
                                operation_id: call.operation_id.clone(),
                                replayed: false,
                            }));
                        }
                    }
                }
            }
        }
    }
}

/// Takes `call` into `kept` and absorbs the reads to its end, if the kept state with it
/// fits in the journal; else gives it back, neither kept nor absorbed.
fn take<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut Leased<S>,
    absorbed: &mut u64,
    kept: &mut Kept,
    call: relay::Call,
) -> io::Result<Option<relay::Call>> {
    let request_id = wire::peek(&call.frame).map_or(0, |head| head.request_id);
    kept.pending.push(KeptCall {
        request_id,
        frame: call.frame,
        operation_id: call.operation_id,
    });
    let encoded = kept.encode();
    if encoded.len() > APP_BYTES_MAX {
        let call = kept.pending.pop().expect("just pushed");
        if kept.pending.is_empty() {
            return Err(io::Error::other(format!(
                "a call of {} bytes does not fit in the journal's {APP_BYTES_MAX} alone",
                call.frame.len()
            )));
        }
        return Ok(Some(relay::Call {
            frame: call.frame,
            operation_id: call.operation_id,
            replayed: false,
        }));
    }
    absorb(socket, absorbed);
    set_kept(socket, &encoded)?;
    Ok(None)
}

/// The reads up to the last message's end are taken: they go into the next commit, with
/// the kept state as it is then.
fn absorb<S: AsyncRead + AsyncWrite + Unpin>(socket: &mut Leased<S>, absorbed: &mut u64) {
    let bounded = socket.get_mut();
    let to = bounded.at_boundary();
    bounded.get_mut().absorb(to - *absorbed);
    *absorbed = to;
}

fn set_kept<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut Leased<S>,
    encoded: &[u8],
) -> io::Result<()> {
    socket.get_mut().get_mut().set_app(encoded)
}

/// The longest websocket frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const HEADER_BYTES_MAX: usize = 14;

/// How much of the stream is read at once.
const STAGED_BYTES: usize = 16 << 10;

/// A stream whose reads end at every websocket frame's end (client frames, as a server
/// reads them). Writes pass through.
#[derive(Debug)]
pub struct FrameBounded<S> {
    inner: S,
    /// Bytes read from `inner` and not handed on: `staged[staged_at..staged_end]`.
    staged: Vec<u8>,
    staged_at: usize,
    staged_end: usize,
    /// Bytes of the current frame (header included) not handed on yet; 0 between frames.
    frame_left: u64,
    /// Every byte handed on, since the start.
    handed: u64,
    /// Bytes handed on up to the last frame's end.
    at_boundary: u64,
    /// The last data frame read was not its message's last (FIN clear).
    message_open: bool,
}

impl<S> FrameBounded<S> {
    /// Reads `inner` a frame at a time.
    pub fn new(inner: S) -> FrameBounded<S> {
        FrameBounded {
            inner,
            staged: vec![0; STAGED_BYTES],
            staged_at: 0,
            staged_end: 0,
            frame_left: 0,
            handed: 0,
            at_boundary: 0,
            message_open: false,
        }
    }

    /// Every byte read from the stream was handed on, and it ends with a whole message:
    /// a reader that returned that message holds nothing of the stream's.
    pub fn between_messages(&self) -> bool {
        self.staged() == 0
            && self.frame_left == 0
            && self.handed == self.at_boundary
            && !self.message_open
    }

    /// The stream read.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream read, to absorb through.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Bytes handed on since the start.
    pub fn handed(&self) -> u64 {
        self.handed
    }

    /// Bytes handed on up to the end of the last whole frame handed on: all of them once
    /// the reader has taken every frame it was given.
    pub fn at_boundary(&self) -> u64 {
        self.at_boundary
    }

    /// Bytes read from the stream and not handed on (they are the stream's, unabsorbed).
    pub fn staged(&self) -> usize {
        self.staged_end - self.staged_at
    }

    /// The length of the frame starting at `staged[staged_at..]`, header included, once
    /// its header is all there (RFC 6455 §5.2).
    fn frame_len(&self) -> io::Result<Option<u64>> {
        let header = &self.staged[self.staged_at..self.staged_end];
        if header.len() < 2 {
            return Ok(None);
        }
        let masked = header[1] & 0x80 != 0;
        let (extended, len) = match header[1] & 0x7f {
            126 => (2, None),
            127 => (8, None),
            len => (0, Some(u64::from(len))),
        };
        let header_len = 2 + extended + if masked { 4 } else { 0 };
        if header.len() < header_len {
            return Ok(None);
        }
        let len = match len {
            Some(len) => len,
            None if extended == 2 => u64::from(u16::from_be_bytes([header[2], header[3]])),
            None => {
                let len = u64::from_be_bytes(header[2..10].try_into().expect("8 bytes"));
                if len >> 63 != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a websocket frame length with its top bit set",
                    ));
                }
                len
            }
        };
        Ok(Some(header_len as u64 + len))
    }

    fn hand_on(&mut self, buf: &mut ReadBuf<'_>, limit: u64) -> usize {
        let n = buf
            .remaining()
            .min(self.staged())
            .min(usize::try_from(limit).unwrap_or(usize::MAX));
        buf.put_slice(&self.staged[self.staged_at..self.staged_at + n]);
        self.staged_at += n;
        self.handed += n as u64;
        if self.staged_at == self.staged_end {
            self.staged_at = 0;
            self.staged_end = 0;
        }
        n
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameBounded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.frame_left == 0
                && let Some(len) = this.frame_len()?
            {
                this.frame_left = len;
                // A data frame (continuation, text, binary) opens or closes its message;
                // a control frame may come between a message's frames.
                let first = this.staged[this.staged_at];
                if first & 0x08 == 0 {
                    this.message_open = first & 0x80 == 0;
                }
            }
            if this.frame_left > 0 && this.staged() > 0 {
                let n = this.hand_on(buf, this.frame_left);
                this.frame_left -= n as u64;
                if this.frame_left == 0 {
                    this.at_boundary = this.handed;
                }
                return Poll::Ready(Ok(()));
            }
            // More of the stream, after what is staged (a header's part at most, or the
            // frame's rest).
            if this.staged_at > 0 {
                this.staged.copy_within(this.staged_at..this.staged_end, 0);
                this.staged_end -= this.staged_at;
                this.staged_at = 0;
            }
            debug_assert!(this.staged_end < HEADER_BYTES_MAX || this.frame_left > 0);
            let mut read = ReadBuf::new(&mut this.staged[this.staged_end..]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                // The stream ended inside a header: the reader finds what there is.
                this.hand_on(buf, u64::MAX);
                return Poll::Ready(Ok(()));
            }
            this.staged_end += n;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameBounded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
    use tokio_tungstenite::tungstenite::{Bytes, Message};

    /// Counts what the client writes, so the test knows where each of its frames ends.
    struct Counted<S> {
        inner: S,
        written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
            this.written
                .fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    fn fragment(opcode: OpCode, fin: bool, payload: &str) -> Message {
        let header = FrameHeader {
            is_final: fin,
            opcode,
            ..FrameHeader::default()
        };
        Message::Frame(Frame::from_payload(header, Bytes::from(payload.to_owned())))
    }

    #[tokio::test]
    async fn tungstenite_holds_no_byte_past_the_message_it_returns() {
        // The client writes everything first, so the server's reads could run far ahead.
        let (client_io, server_io) = tokio::io::duplex(1 << 22);
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut client = WebSocketStream::from_raw_socket(
            Counted {
                inner: client_io,
                written: std::sync::Arc::clone(&written),
            },
            Role::Client,
            None,
        )
        .await;
        let sizes = [0usize, 1, 125, 126, 127, 65_535, 65_536, 300_000, 7];
        let mut ends = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            client.send(Message::text("x".repeat(*size))).await.unwrap();
            ends.push(written.load(std::sync::atomic::Ordering::SeqCst));
            if i == 3 {
                client
                    .send(Message::Ping(Bytes::from_static(b"are you there")))
                    .await
                    .unwrap();
                ends.push(written.load(std::sync::atomic::Ordering::SeqCst));
                // A message in three fragments, a ping between two of them.
                client
                    .send(fragment(OpCode::Data(Data::Text), false, "frag"))
                    .await
                    .unwrap();
                client
                    .send(fragment(OpCode::Data(Data::Continue), false, "men"))
                    .await
                    .unwrap();
                client
                    .send(Message::Ping(Bytes::from_static(b"mid")))
                    .await
                    .unwrap();
                ends.push(written.load(std::sync::atomic::Ordering::SeqCst));
                client
                    .send(fragment(OpCode::Data(Data::Continue), true, "ted"))
                    .await
                    .unwrap();
                ends.push(written.load(std::sync::atomic::Ordering::SeqCst));
            }
        }
        let mut config = WebSocketConfig::default();
        config.max_message_size = Some(1 << 20);
        let mut server = WebSocketStream::from_raw_socket(
            FrameBounded::new(server_io),
            Role::Server,
            Some(config),
        )
        .await;
        let mut received = Vec::new();
        for end in &ends {
            let message = server.next().await.unwrap().unwrap();
            let bounded = server.get_ref();
            assert_eq!(
                (bounded.handed(), bounded.at_boundary()),
                (*end, *end),
                "after {message:?} tungstenite was handed bytes past it"
            );
            received.push(message);
        }
        assert_eq!(received[5], Message::Ping(Bytes::from_static(b"mid")));
        assert_eq!(received[6], Message::text("fragmented"));
        assert_eq!(received.len(), sizes.len() + 3);
    }

    #[tokio::test]
    async fn between_messages_is_false_inside_a_fragmented_message_and_with_bytes_staged() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        let mut server =
            WebSocketStream::from_raw_socket(FrameBounded::new(server_io), Role::Server, None)
                .await;
        client.send(Message::text("whole")).await.unwrap();
        assert_eq!(
            server.next().await.unwrap().unwrap(),
            Message::text("whole")
        );
        assert!(server.get_ref().between_messages());
        // A message's first fragment, then a ping: tungstenite returns the ping and holds
        // the fragment.
        client
            .send(fragment(OpCode::Data(Data::Text), false, "frag"))
            .await
            .unwrap();
        client
            .send(Message::Ping(Bytes::from_static(b"mid")))
            .await
            .unwrap();
        assert_eq!(
            server.next().await.unwrap().unwrap(),
            Message::Ping(Bytes::from_static(b"mid"))
        );
        assert!(!server.get_ref().between_messages(), "a fragment is held");
        client
            .send(fragment(OpCode::Data(Data::Continue), true, "ment"))
            .await
            .unwrap();
        assert_eq!(
            server.next().await.unwrap().unwrap(),
            Message::text("fragment")
        );
        assert!(server.get_ref().between_messages());
        // Two messages in one read: after the first, the second is staged.
        client.feed(Message::text("one")).await.unwrap();
        client.feed(Message::text("two")).await.unwrap();
        client.flush().await.unwrap();
        assert_eq!(server.next().await.unwrap().unwrap(), Message::text("one"));
        assert!(
            !server.get_ref().between_messages(),
            "the next message is staged"
        );
        assert_eq!(server.next().await.unwrap().unwrap(), Message::text("two"));
        assert!(server.get_ref().between_messages());
    }

    #[tokio::test]
    async fn a_frame_length_with_its_top_bit_set_is_refused() {
        let (mut client_io, server_io) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(
            &mut client_io,
            &[0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4],
        )
        .await
        .unwrap();
        let mut bounded = FrameBounded::new(server_io);
        let mut buf = [0u8; 16];
        let error = tokio::io::AsyncReadExt::read(&mut bounded, &mut buf)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "a websocket frame length with its top bit set"
        );
    }
}

#[cfg(test)]
mod kept_tests {
    use super::*;

    #[test]
    fn kept_state_reads_back_the_same_with_large_frames_carried_as_they_came() {
        let big = format!(
            r#"{{"request-id":9,"type":"Application","version":19,"request":"Deploy","params":{{"pad":"{}","q":"\"ü\""}}}}"#,
            "x".repeat(300_000)
        );
        let kept = Kept {
            login: Some(CarriedLogin {
                tag: "user-admin".to_owned(),
                kind: lockstep_core::gate::Login::User,
            }),
            watchers: [("1".to_owned(), Some(4)), ("2".to_owned(), None)].into(),
            pending: vec![
                KeptCall {
                    request_id: 9,
                    frame: big.clone(),
                    operation_id: Some("fd-0123-7-9-abcd".to_owned()),
                },
                KeptCall {
                    request_id: 10,
                    frame: "{}".to_owned(),
                    operation_id: None,
                },
            ],
        };
        let encoded = kept.encode();
        assert!(
            encoded.len() < big.len() + 512,
            "the frame is not escaped: {}",
            encoded.len()
        );
        assert_eq!(Kept::decode(&encoded).unwrap(), kept);
        assert_eq!(Kept::decode(&[]).unwrap(), Kept::default());
        let cut = Kept::decode(&encoded[..encoded.len() - 1]).unwrap_err();
        assert!(cut.contains("call 10 past the end"), "{cut}");
    }
}
