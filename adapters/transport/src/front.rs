//! The launcher's side of the relay (`spec/relay.md`): one client connection, held across
//! every restart of the worker.
//!
//! [`FrontDoor::serve`] reads the client's frames from a [`ClientFrames`] and gives what
//! the client gets to a [`ClientSink`] (the websocket itself, or channels in the tests), so
//! the websocket's TLS and its admission stay the caller's. For each
//! connection it keeps:
//!
//! - every call forwarded to the worker until its reply came (at most
//!   [`REQUESTS_IN_FLIGHT_MAX`], counting the calls held), each with the operation-id
//!   stamped on it when it arrived ([`relay::operation_id`]);
//! - the login and the watchers' positions the worker's replies reported.
//!
//! When the relay stream breaks (the worker exited, crashed, was killed), the connection
//! asks for the next worker every [`RETRY_INTERVAL`]; meanwhile each new call is decided by
//! [`gate::between_workers`]: a ping answered here, a login or read held (at most
//! [`FrontDoor::wait_max`], then `upgrade in progress`), anything else refused. Once a worker
//! takes the stream, it gets the login and the watchers with `open`, then every call still
//! unanswered, in the order the client sent them: a write under its stamp, so the store
//! applies it once whether or not the old worker committed it.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::future::Future;
use std::task::{Context, Poll};

use futures_util::{SinkExt, StreamExt};
use lockstep_core::gate::{self, BetweenWorkers, GateView, Login};
use lockstep_core::{Millis, Phase, Progress};
use serde_json::json;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use axum::http;

use std::sync::Arc;

use crate::admission::{Admitted, Connections};
use crate::connection::REQUESTS_IN_FLIGHT_MAX;
use crate::hold::ConnectionHold;
use crate::journal;
use crate::leased::FrameBounded;
use crate::relay::{self, Call, CarriedLogin, Hello, Message, Open, RelayError};
use crate::wire::{self, Framing, WireError};

/// How often a connection without a worker asks for one.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// How long what is queued for a client that closed its connection may take to be written.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the handshake with a worker (`hello` to `open`) may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the client gets.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ToClient {
    /// A text frame.
    Frame(String),
    /// Close the websocket with this code and reason; nothing follows.
    Close { code: u16, reason: String },
}

/// What a client sent: an API frame, or the end of its frames.
#[derive(Debug)]
pub enum FromClient {
    /// A text frame: one API call.
    Frame(String),
    /// The client is gone (it closed, sent what the API does not take, or its socket
    /// failed); `answer` is what it is told on the way out (a close frame), if anything.
    Gone { answer: Option<ToClient> },
}

/// Where [`FrontDoor::serve`] reads a client's frames: a channel (`mpsc::Receiver`, as the
/// tests drive it), or the websocket itself ([`FrontDoor::serve_websocket`]), read on the
/// serving loop so that a call costs no hand-over between futures.
pub trait ClientFrames: Send {
    /// The client's next frame, or its end. Must be cancel-safe: the serving loop drops it
    /// when a reply comes first.
    fn next_frame(&mut self) -> impl std::future::Future<Output = FromClient> + Send;
}

impl<T: ClientFrames> ClientFrames for &mut T {
    fn next_frame(&mut self) -> impl std::future::Future<Output = FromClient> + Send {
        (**self).next_frame()
    }
}

impl ClientFrames for mpsc::Receiver<String> {
    async fn next_frame(&mut self) -> FromClient {
        match self.recv().await {
            Some(frame) => FromClient::Frame(frame),
            None => FromClient::Gone { answer: None },
        }
    }
}

/// The client's connection is gone, or was closed for what it held.
#[derive(Debug)]
pub struct Gone;

/// Where [`FrontDoor::serve`] puts what the client gets: a channel (`mpsc::Sender`, as the
/// tests read it), or the websocket itself ([`FrontDoor::serve_websocket`]), written on the
/// serving loop.
pub trait ClientSink: Send {
    /// Queues `message` for the client, and writes what it can of the queue at once.
    /// `Err(Gone)`: the connection ends.
    fn send(
        &mut self,
        message: ToClient,
    ) -> impl std::future::Future<Output = Result<(), Gone>> + Send;

    /// Writes what is queued: `Ok` once it is all written, `Err(Gone)` when the connection
    /// ends (closed, or a write failed or took too long). Pending while nothing is queued.
    /// Must be cancel-safe: the serving loop drops it when something else comes first.
    fn write(&mut self) -> impl std::future::Future<Output = Result<(), Gone>> + Send;

    /// Nothing is queued or being written: what the client was sent is on its socket.
    /// A sink that cannot tell says `false`.
    fn idle(&self) -> bool {
        false
    }
}

impl ClientSink for mpsc::Sender<ToClient> {
    async fn send(&mut self, message: ToClient) -> Result<(), Gone> {
        mpsc::Sender::send(self, message).await.map_err(|_| Gone)
    }

    async fn write(&mut self) -> Result<(), Gone> {
        std::future::pending().await
    }
}

impl<T: ClientSink> ClientSink for &mut T {
    fn send(
        &mut self,
        message: ToClient,
    ) -> impl std::future::Future<Output = Result<(), Gone>> + Send {
        (**self).send(message)
    }

    fn write(&mut self) -> impl std::future::Future<Output = Result<(), Gone>> + Send {
        (**self).write()
    }

    fn idle(&self) -> bool {
        (**self).idle()
    }
}

type Ws = tokio_tungstenite::tungstenite::Message;

/// A client's websocket, read for its text frames: a binary frame or the client's close
/// is answered with a close (1003, 1000) and ends it; a frame over the size closes the
/// connection's slot (`frame-size`); pings and pongs are tungstenite's.
struct WebsocketFrames<S> {
    stream: futures_util::stream::SplitStream<tokio_tungstenite::WebSocketStream<S>>,
    admitted: Option<Arc<Admitted>>,
}

impl<S> ClientFrames for WebsocketFrames<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    async fn next_frame(&mut self) -> FromClient {
        loop {
            let Some(message) = self.stream.next().await else {
                return FromClient::Gone { answer: None };
            };
            let answer = match message {
                Ok(Ws::Text(text)) => return FromClient::Frame(text.as_str().to_owned()),
                Ok(Ws::Ping(_) | Ws::Pong(_) | Ws::Frame(_)) => continue,
                Ok(Ws::Binary(_)) => Some(ToClient::Close {
                    code: 1003,
                    reason: "binary frames are not part of the API".to_owned(),
                }),
                // Answered with a close frame, as RFC 6455 asks.
                Ok(Ws::Close(_)) => Some(ToClient::Close {
                    code: 1000,
                    reason: String::new(),
                }),
                Err(tokio_tungstenite::tungstenite::Error::Capacity(_)) => {
                    if let Some(admitted) = &self.admitted {
                        admitted.close(crate::limits::Refusal::FrameSize);
                    }
                    None
                }
                Err(_) => None,
            };
            return FromClient::Gone { answer };
        }
    }
}

/// A client's websocket, written on the serving loop: a reply is handed to the websocket
/// and flushed as soon as it is queued; one the socket does not take at once stays queued
/// and is written by [`ClientSink::write`]. For a connection the launcher admitted, a
/// reply's bytes are counted from the moment it is queued until it is written, as the
/// worker's own server does, so a client that does not read is closed for `reply-bytes`
/// or `write-timeout`, never buffered for without bound.
struct WebsocketSink<S> {
    sink: futures_util::stream::SplitSink<tokio_tungstenite::WebSocketStream<S>, Ws>,
    admitted: Option<Arc<Admitted>>,
    /// How long a write may wait for the client's socket (`--write-timeout-sec`).
    write_timeout: Duration,
    /// Queued, not yet handed to the websocket.
    queued: VecDeque<ToClient>,
    /// Bytes of replies handed to the websocket and not flushed yet.
    unflushed: usize,
    /// Armed while a flush waits for the client's socket.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The connection's slot closed (a deadline, a cap): waited on once for its life.
    closed: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// A close frame was handed over: once it is flushed, nothing more is written.
    closing: bool,
    /// The websocket refused the close (it answers the client's own close itself).
    close_refused: bool,
    /// Why the connection ended, once it has.
    ended: Option<SinkEnd>,
}

/// Why a [`WebsocketSink`] stopped writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SinkEnd {
    /// A close frame was sent.
    Closed,
    /// The launcher closed the connection's slot, or a write took too long.
    Refused,
    /// The socket failed.
    Failed,
}

impl<S> WebsocketSink<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    fn release(&mut self) {
        if let Some(admitted) = &self.admitted {
            admitted.release_reply(self.unflushed);
        }
        self.unflushed = 0;
    }

    fn end(&mut self, end: SinkEnd) -> Poll<Result<(), Gone>> {
        self.ended = Some(end);
        self.release();
        for message in self.queued.drain(..) {
            if let (ToClient::Frame(frame), Some(admitted)) = (message, &self.admitted) {
                admitted.release_reply(frame.len());
            }
        }
        Poll::Ready(Err(Gone))
    }

    /// Hands what is queued to the websocket and flushes it: `Ready(Ok)` when all is
    /// written, `Ready(Err)` when the connection ended, `Pending` while the socket
    /// does not take it or, with nothing queued, until the slot is closed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Gone>> {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
        if self.ended.is_some() {
            return Poll::Ready(Err(Gone));
        }
        if self.closed.as_mut().poll(cx).is_ready() {
            return self.end(SinkEnd::Refused);
        }
        if self.idle() {
            return Poll::Pending;
        }
        loop {
            while !self.queued.is_empty() && !self.closing {
                match self.sink.poll_ready_unpin(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return self.end(SinkEnd::Failed),
                    Poll::Pending => break,
                }
                let started = match self.queued.pop_front().expect("not empty") {
                    ToClient::Frame(frame) => {
                        self.unflushed += frame.len();
                        self.sink.start_send_unpin(Ws::Text(frame.into()))
                    }
                    ToClient::Close { code, reason } => {
                        self.closing = true;
                        let close = CloseFrame {
                            code: CloseCode::from(code),
                            reason: reason.into(),
                        };
                        // After the client's own close frame, tungstenite has queued its
                        // answer already and refuses another: flushing sends it.
                        let _ = self.sink.start_send_unpin(Ws::Close(Some(close)));
                        Ok(())
                    }
                };
                if started.is_err() {
                    return self.end(SinkEnd::Failed);
                }
            }
            match self.sink.poll_flush_unpin(cx) {
                Poll::Ready(result) => {
                    if self.closing && result.is_err() && !self.close_refused {
                        // The split sink's flush first hands it the close, which
                        // tungstenite refuses after the client's own; the next flush
                        // sends tungstenite's answer.
                        self.close_refused = true;
                        continue;
                    }
                    self.deadline = None;
                    if self.closing {
                        return self.end(SinkEnd::Closed);
                    }
                    if result.is_err() {
                        return self.end(SinkEnd::Failed);
                    }
                    self.release();
                    if self.queued.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    // Flushed, and the websocket takes more now: hand the rest over.
                }
                Poll::Pending => {
                    let timeout = self.write_timeout;
                    let deadline = self
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if deadline.as_mut().poll(cx).is_ready() {
                        if let Some(admitted) = &self.admitted {
                            admitted.close(crate::limits::Refusal::WriteTimeout);
                        }
                        return self.end(SinkEnd::Refused);
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Nothing queued, handed over or being flushed.
    fn idle(&self) -> bool {
        self.queued.is_empty() && self.unflushed == 0 && !self.closing && self.deadline.is_none()
    }

    /// After the serving loop: what is queued is written (the answer to the client's
    /// close, the worker's close) unless the connection was refused; then, if the launcher
    /// closed it (a deadline, a cap, a write that took too long), the client is told why,
    /// if its socket still takes it.
    async fn finish(mut self, peer: SocketAddr) {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
        if self.ended.is_none() {
            let _ = tokio::time::timeout(
                CLOSE_TIMEOUT,
                std::future::poll_fn(|cx| match self.poll_write(cx) {
                    // Nothing left to write: done, whatever the slot does later.
                    Poll::Pending if self.idle() => Poll::Ready(Ok(())),
                    other => other,
                }),
            )
            .await;
        }
        if matches!(self.ended, Some(SinkEnd::Closed | SinkEnd::Failed)) {
            return;
        }
        if let Some(reason) = self
            .admitted
            .as_ref()
            .and_then(|admitted| admitted.ticket.reason())
        {
            tracing::debug!(target: "lockstep::front", %peer, %reason, "connection closed by the launcher");
            let close = Ws::Close(Some(CloseFrame {
                code: CloseCode::Policy,
                reason: format!("closed by the controller: {reason}").into(),
            }));
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.send(close)).await;
        }
    }
}

impl<S> ClientSink for WebsocketSink<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    async fn send(&mut self, message: ToClient) -> Result<(), Gone> {
        if self.ended.is_some() {
            return Err(Gone);
        }
        if let (ToClient::Frame(frame), Some(admitted)) = (&message, &self.admitted)
            && !admitted.reserve_reply(frame.len())
        {
            admitted.release_reply(frame.len());
            return Err(Gone);
        }
        self.queued.push_back(message);
        // Written at once if the socket takes it; otherwise by `write`, unless the queue
        // is full, when this waits for it.
        let full = crate::connection::REPLIES_QUEUED_MAX;
        std::future::poll_fn(|cx| match self.poll_write(cx) {
            Poll::Pending if self.queued.len() < full => Poll::Ready(Ok(())),
            other => other,
        })
        .await
    }

    async fn write(&mut self) -> Result<(), Gone> {
        std::future::poll_fn(|cx| self.poll_write(cx)).await
    }

    fn idle(&self) -> bool {
        self.ended.is_none() && WebsocketSink::idle(self)
    }
}

/// The launcher's relay to the current worker, shared by its connections.
#[derive(Debug)]
pub struct FrontDoor {
    socket: PathBuf,
    boot: String,
    launcher: String,
    connections: AtomicU64,
    /// Bumped when a worker says it listens ([`FrontDoor::worker_listening`]): connections
    /// waiting for a worker try at once instead of at their next retry.
    listening: tokio::sync::watch::Sender<u64>,
    /// How long a login or read waits for a worker before it is refused as
    /// `upgrade in progress` (every Juju client retries that).
    pub wait_max: Duration,
    /// The relay versions offered in `hello`: [`relay::VERSIONS`], unless a test makes this
    /// launcher an older one ([`FrontDoor::speaking`]).
    versions: Vec<u32>,
    /// Whether quiet connections are leased to the worker ([`FrontDoor::leasing`]).
    leasing: bool,
    /// Connections leased to a worker, and leases over (taken back or ended), since start.
    leases: AtomicU64,
    leases_returned: AtomicU64,
}

/// How many connections a front door leased to a worker, and how many of those leases
/// are over, since it started ([`FrontDoor::lease_counts`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct LeaseCounts {
    pub leased: u64,
    pub returned: u64,
}

impl FrontDoor {
    /// A front door to the worker listening on `socket` (`<data-dir>/relay.sock`), for a
    /// launcher of version `launcher`.
    pub fn new(socket: PathBuf, launcher: &str, wait_max: Duration) -> FrontDoor {
        FrontDoor {
            socket,
            boot: relay::new_boot(),
            launcher: launcher.to_owned(),
            connections: AtomicU64::new(1),
            listening: tokio::sync::watch::Sender::new(0),
            wait_max,
            versions: relay::VERSIONS.to_vec(),
            leasing: true,
            leases: AtomicU64::new(0),
            leases_returned: AtomicU64::new(0),
        }
    }

    /// Whether this front door leases its quiet connections to the worker (the default),
    /// or relays every call (`lockstepd --front-door-lease=false`).
    #[must_use]
    pub fn leasing(mut self, leasing: bool) -> FrontDoor {
        self.leasing = leasing;
        self
    }

    /// Connections leased to a worker, and leases over, since this front door started.
    pub fn lease_counts(&self) -> LeaseCounts {
        LeaseCounts {
            leased: self.leases.load(Ordering::Relaxed),
            returned: self.leases_returned.load(Ordering::Relaxed),
        }
    }

    /// This front door offering only `versions` in its `hello`: a launcher of an older
    /// lockstep, for the tests of a newer worker under it.
    #[must_use]
    pub fn speaking(mut self, versions: &[u32]) -> FrontDoor {
        self.versions = versions.to_vec();
        self
    }

    /// A worker listens on the relay socket now (it said so to the launcher): every
    /// connection and HTTP request waiting for one tries it at once. Without this word they
    /// find it at their next try, [`RETRY_INTERVAL`] apart.
    pub fn worker_listening(&self) {
        self.listening.send_modify(|epoch| *epoch += 1);
    }

    /// This launcher's `boot`: the first part of every operation-id it stamps.
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// Serves one client connection until the client closes it (`from_client` ends), the
    /// worker closes it, or no worker speaks this launcher's relay version.
    ///
    /// `on_login` is called when the worker first reports the connection logged in (the
    /// launcher's admission moves it out of the strangers' slots); if it answers `false`
    /// (the slot was closed meanwhile), the connection ends.
    pub async fn serve(
        &self,
        peer: SocketAddr,
        reached: Option<SocketAddr>,
        path: String,
        from_client: impl ClientFrames,
        to_client: impl ClientSink,
        on_login: Option<Box<dyn FnOnce() -> bool + Send>>,
    ) {
        let connection = self.new_connection((peer, reached, path));
        let mut on_login = on_login;
        self.serve_connection(connection, from_client, to_client, &mut on_login, false)
            .await;
    }

    /// A new client connection's state, numbered.
    fn new_connection(
        &self,
        (peer, reached, path): (SocketAddr, Option<SocketAddr>, String),
    ) -> Connection {
        Connection {
            number: self.connections.fetch_add(1, Ordering::Relaxed),
            peer,
            reached,
            path,
            forwarded: VecDeque::new(),
            held: VecDeque::new(),
            login: None,
            watchers: BTreeMap::new(),
            relay: None,
        }
    }

    /// Serves a connection this launcher takes back from a worker that held it (a leased
    /// connection, `leased.rs`), numbered `number` as when it was leased: it carries on
    /// with the login and the watchers' positions `kept` holds, and every call `kept` holds
    /// taken and not answered is sent to the next worker as a call forwarded to a worker
    /// that died is, marked replayed and under the operation-id the holder stamped, so that
    /// the store applies it once.
    pub async fn serve_taken_back(
        &self,
        number: u64,
        (peer, reached, path): (SocketAddr, Option<SocketAddr>, String),
        kept: crate::leased::Kept,
        from_client: impl ClientFrames,
        to_client: impl ClientSink,
    ) {
        let connection = taken_back(number, (peer, reached, path), kept);
        self.serve_connection(connection, from_client, to_client, &mut None, false)
            .await;
    }

    async fn serve_connection(
        &self,
        mut connection: Connection,
        mut from_client: impl ClientFrames,
        mut to_client: impl ClientSink,
        on_login: &mut Option<Box<dyn FnOnce() -> bool + Send>>,
        lease: bool,
    ) -> Served {
        let mut next_attempt = Instant::now();
        let mut listening = self.listening.subscribe();
        // A reply came since the client's last frame: the connection may be quiet.
        let mut replied = false;
        loop {
            if lease && replied && connection.leasable() && to_client.idle() {
                return Served::Quiet(Box::new(connection));
            }
            if connection.relay.is_none() && Instant::now() >= next_attempt {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.open(&connection)).await {
                    Ok(Ok(relay)) => {
                        connection.relay = Some(relay);
                        if let Err(error) = connection.resend().await {
                            tracing::debug!(target: "lockstep::front", %error, "relay broke while resending");
                            for answer in connection.broke() {
                                if to_client.send(ToClient::Frame(answer)).await.is_err() {
                                    return Served::Over;
                                }
                            }
                        }
                    }
                    Ok(Err(Opened::Refused(reason))) => {
                        tracing::error!(target: "lockstep::front", %reason, "the worker refused this launcher's relay; closing the client's connection");
                        let close = ToClient::Close {
                            code: 1012,
                            reason: "the controller is restarting; reconnect".to_owned(),
                        };
                        let _ = to_client.send(close).await;
                        return Served::Over;
                    }
                    Ok(Err(Opened::NoWorker(why))) => {
                        tracing::trace!(target: "lockstep::front", %why, "no worker yet");
                    }
                    Err(_) => {}
                }
                next_attempt = Instant::now() + RETRY_INTERVAL;
            }
            let room = connection.forwarded.len() + connection.held.len() < REQUESTS_IN_FLIGHT_MAX;
            let no_worker = connection.relay.is_none();
            let expires = connection
                .held
                .front()
                .map(|held| held.arrived + self.wait_max);
            tokio::select! {
                frame = from_client.next_frame(), if room => match frame {
                    FromClient::Frame(frame) => {
                        replied = false;
                        for answer in self.client_sent(&mut connection, frame).await {
                            if to_client.send(ToClient::Frame(answer)).await.is_err() {
                                return Served::Over;
                            }
                        }
                    }
                    FromClient::Gone { answer } => {
                        if let Some(answer) = answer {
                            let _ = to_client.send(answer).await;
                        }
                        return Served::Over;
                    }
                },
                // What the client's socket did not take at once.
                written = to_client.write() => if written.is_err() { return Served::Over },
                message = next_message(&mut connection.relay) => match message {
                    Ok(Some(Message::Reply(reply))) => {
                        if reply.login.is_some()
                            && let Some(hook) = on_login.take()
                            && !hook()
                        {
                            return Served::Over;
                        }
                        let frame = connection.replied(reply);
                        if to_client.send(ToClient::Frame(frame)).await.is_err() {
                            return Served::Over;
                        }
                        replied = true;
                    }
                    Ok(Some(Message::Close(close))) => {
                        let _ = to_client.send(ToClient::Close { code: close.code, reason: close.reason }).await;
                        return Served::Over;
                    }
                    other => {
                        if let Err(error) = other {
                            tracing::debug!(target: "lockstep::front", %error, "relay stream broke");
                        }
                        for answer in connection.broke() {
                            if to_client.send(ToClient::Frame(answer)).await.is_err() {
                                return Served::Over;
                            }
                        }
                        next_attempt = Instant::now();
                    }
                },
                () = sleep_until_some(no_worker.then_some(next_attempt)) => {}
                changed = listening.changed(), if no_worker => {
                    if changed.is_ok() {
                        next_attempt = Instant::now();
                    }
                }
                () = sleep_until_some(expires) => {
                    let now = Instant::now();
                    while let Some(held) = connection.held.front() {
                        if held.arrived + self.wait_max > now {
                            break;
                        }
                        let held = connection.held.pop_front().expect("a front");
                        let refused = WireError::from(gate::Rejection::upgrade_in_progress(&restarting()));
                        let frame = wire::encode_error(held.request_id, held.framing, &refused);
                        if to_client.send(ToClient::Frame(frame)).await.is_err() {
                            return Served::Over;
                        }
                    }
                }
            }
        }
    }

    /// Serves one client's websocket (after its TLS and HTTP upgrade, which are the
    /// caller's) through [`FrontDoor::serve`]: text frames in, text frames and a close out.
    /// A binary frame closes the connection (1003), as the worker's own server does.
    ///
    /// `admitted` is the connection's slot in the launcher's admission, held until the
    /// websocket ends: it is told of the login, it counts the bytes queued for the client
    /// (from queued to written), and closing it (a deadline, a cap, a frame over the size, a write that
    /// took longer than the write timeout) closes the websocket with the reason (1008).
    pub async fn serve_websocket<S>(
        &self,
        socket: tokio_tungstenite::WebSocketStream<S>,
        peer: SocketAddr,
        reached: Option<SocketAddr>,
        path: String,
        admitted: Option<Arc<Admitted>>,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.websocket_served(socket, (peer, reached, path), None, admitted)
            .await;
    }

    /// Serves a client's websocket taken back from the worker it was leased to
    /// ([`crate::lease::take_back`]), as [`FrontDoor::serve_websocket`] serves a new one,
    /// carrying on from what the worker kept ([`FrontDoor::serve_taken_back`]).
    pub async fn serve_websocket_taken_back<S>(
        &self,
        socket: tokio_tungstenite::WebSocketStream<S>,
        number: u64,
        place: (SocketAddr, Option<SocketAddr>, String),
        kept: crate::leased::Kept,
        admitted: Option<Arc<Admitted>>,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.websocket_served(socket, place, Some((number, kept)), admitted)
            .await;
    }

    async fn websocket_served<S>(
        &self,
        socket: tokio_tungstenite::WebSocketStream<S>,
        place: (SocketAddr, Option<SocketAddr>, String),
        taken_back: Option<(u64, crate::leased::Kept)>,
        admitted: Option<Arc<Admitted>>,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (connection, mut on_login) = match taken_back {
            None => (self.new_connection(place), login_hook(admitted.as_ref())),
            Some((number, kept)) => (self::taken_back(number, place, kept), None),
        };
        // The slot is held (`admitted` kept) until the websocket ends: dropping it closes.
        self.websocket_round(socket, connection, &mut on_login, admitted.as_ref(), false)
            .await;
    }

    /// Serves `connection` on its websocket until it ends (`None`), or, with `lease`, until
    /// a worker's reply leaves it quiet: then the websocket is given back whole, with the
    /// connection's state, nothing queued in either.
    async fn websocket_round<S>(
        &self,
        socket: tokio_tungstenite::WebSocketStream<S>,
        connection: Connection,
        on_login: &mut Option<Box<dyn FnOnce() -> bool + Send>>,
        admitted: Option<&Arc<Admitted>>,
        lease: bool,
    ) -> Option<(tokio_tungstenite::WebSocketStream<S>, Connection)>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let closed = admitted.map_or_else(tokio_util::sync::CancellationToken::new, |admitted| {
            admitted.ticket.closed.clone()
        });
        let write_timeout = admitted.map_or_else(
            || crate::limits::ApiLimits::default().write_timeout,
            |admitted| admitted.limits().write_timeout,
        );
        let peer = connection.peer;
        let (sink, stream) = socket.split();
        let mut from_client = WebsocketFrames {
            stream,
            admitted: admitted.cloned(),
        };
        let mut to_client = WebsocketSink {
            sink,
            admitted: admitted.cloned(),
            write_timeout,
            queued: VecDeque::new(),
            unflushed: 0,
            deadline: None,
            closed: Box::pin(closed.cancelled_owned()),
            closing: false,
            close_refused: false,
            ended: None,
        };
        // The connection ends when the client goes (its frames end), the worker closes
        // it, or its socket fails or is closed by the launcher (the sink ends).
        let served = self
            .serve_connection(
                connection,
                &mut from_client,
                &mut to_client,
                on_login,
                lease,
            )
            .await;
        match served {
            Served::Quiet(connection) => match to_client.sink.reunite(from_client.stream) {
                Ok(socket) => Some((socket, *connection)),
                Err(_) => None,
            },
            Served::Over => {
                to_client.finish(peer).await;
                None
            }
        }
    }

    /// Serves a client's websocket on the launcher's own socket stack, leasing the
    /// connection to the worker (relay version 3) whenever a worker's reply leaves it quiet
    /// (logged in, nothing forwarded or held, everything sent to the client written, no
    /// byte of a next message read), and taking it back when the worker is done with it or
    /// dies; relayed meanwhile, as [`FrontDoor::serve_websocket`] relays a connection.
    async fn serve_leasing(
        &self,
        io: LauncherIo,
        prefix: tokio_util::bytes::Bytes,
        place: (SocketAddr, Option<SocketAddr>, String),
        admitted: Arc<Admitted>,
    ) {
        let mut websocket = leasable_websocket(prefix, io).await;
        let mut connection = self.new_connection(place.clone());
        let number = connection.number;
        let mut on_login = login_hook(Some(&admitted));
        loop {
            let Some((socket, quiet)) = self
                .websocket_round(websocket, connection, &mut on_login, Some(&admitted), true)
                .await
            else {
                return;
            };
            match self.lease_out(socket, quiet, &admitted).await {
                LeaseEnd::NotLeased(quiet) => {
                    (websocket, connection) = *quiet;
                }
                LeaseEnd::TakenBack(back) => {
                    let (io, kept) = *back;
                    websocket = leasable_websocket(tokio_util::bytes::Bytes::new(), io).await;
                    connection = taken_back(number, place.clone(), kept);
                    if !self
                        .sent_before(&mut websocket, &mut connection, &admitted)
                        .await
                    {
                        return;
                    }
                }
                LeaseEnd::Over => return,
            }
        }
    }

    /// A connection just taken back: the calls the client had sent by then (every whole
    /// message its socket holds now) were sent to a worker that went, as much as the calls
    /// it had taken: each waits for the next worker as a dead worker's forwarded calls do
    /// (a ping is answered here), after those it had taken, rather than being decided as a
    /// call made while no worker serves (a write would be refused, although the client
    /// sent it to a worker that served). `false`: the connection is over (the client closed
    /// it, or sent what the API does not take).
    async fn sent_before(
        &self,
        websocket: &mut LeasableWebsocket,
        connection: &mut Connection,
        admitted: &Admitted,
    ) -> bool {
        use futures_util::FutureExt;
        let write_timeout = admitted.limits().write_timeout;
        let mut answers = Vec::new();
        let kept: Vec<Pending> = connection.held.drain(..).collect();
        connection.forwarded.extend(kept);
        let mut over = false;
        while connection.forwarded.len() < REQUESTS_IN_FLIGHT_MAX {
            // What the socket holds now, never waiting for more.
            let Some(message) = websocket.next().now_or_never() else {
                break;
            };
            match message {
                Some(Ok(Ws::Text(text))) => {
                    match self.pending_call(connection, text.as_str().to_owned()) {
                        Ok(call) => connection.forwarded.push_back(call),
                        Err(answer) => answers.push(answer),
                    }
                }
                Some(Ok(Ws::Ping(_) | Ws::Pong(_) | Ws::Frame(_))) => {}
                Some(Ok(Ws::Binary(_))) => {
                    let close = tokio_tungstenite::tungstenite::protocol::CloseFrame {
                        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Unsupported,
                        reason: "binary frames are not part of the API".into(),
                    };
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, websocket.close(Some(close))).await;
                    return false;
                }
                Some(Ok(Ws::Close(_))) => {
                    over = true;
                    break;
                }
                Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(_))) => {
                    // As `WebsocketFrames` closes a frame over the size, told why.
                    admitted.close(crate::limits::Refusal::FrameSize);
                    let close = tokio_tungstenite::tungstenite::protocol::CloseFrame {
                        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Policy,
                        reason: format!("closed by the controller: {}", crate::limits::Refusal::FrameSize).into(),
                    };
                    let _ =
                        tokio::time::timeout(CLOSE_TIMEOUT, websocket.send(Ws::Close(Some(close))))
                            .await;
                    return false;
                }
                Some(Err(_)) | None => return false,
            }
        }
        answers.extend(connection.broke());
        for answer in answers {
            let sent = tokio::time::timeout(write_timeout, websocket.send(Ws::text(answer))).await;
            if !matches!(sent, Ok(Ok(()))) {
                return false;
            }
        }
        if over {
            // Its calls are not answered: the client closed its end (RFC 6455's answer).
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, websocket.close(None)).await;
            return false;
        }
        true
    }

    /// Leases a quiet connection to the worker, and takes it back when the worker is done
    /// with it; not leased if no worker takes leases or the connection is not quiet to the
    /// byte (tungstenite, hyper or the records hold something of it).
    async fn lease_out(
        &self,
        mut websocket: LeasableWebsocket,
        mut connection: Connection,
        admitted: &Arc<Admitted>,
    ) -> LeaseEnd {
        use std::os::fd::AsFd;
        let write_timeout = admitted.limits().write_timeout;
        let mut stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.lease_stream()).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(target: "lockstep::front", %error, "connection not leased");
                return LeaseEnd::NotLeased(Box::new((websocket, connection)));
            }
            Err(_) => return LeaseEnd::NotLeased(Box::new((websocket, connection))),
        };
        // What tungstenite queued (the pong to a ping) is written first.
        if !matches!(
            tokio::time::timeout(write_timeout, websocket.flush()).await,
            Ok(Ok(()))
        ) || !websocket.get_ref().between_messages()
        {
            return LeaseEnd::NotLeased(Box::new((websocket, connection)));
        }
        let Some(io) = websocket.get_mut().get_mut().take() else {
            return LeaseEnd::NotLeased(Box::new((websocket, connection)));
        };
        let handover = match io.into_handover() {
            Ok(handover) => handover,
            Err(io) => {
                websocket.get_mut().get_mut().inner = Some(*io);
                return LeaseEnd::NotLeased(Box::new((websocket, connection)));
            }
        };
        let crate::records::Handover {
            io,
            session,
            read_ahead,
            skip,
        } = handover;
        let socket = match io.into_inner().into_std() {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(target: "lockstep::front", peer = %connection.peer, %error, "a client's socket could not be leased");
                return LeaseEnd::Over;
            }
        };
        let prepared = journal::socket_counters(socket.as_fd()).and_then(|counters| {
            Ok((
                counters,
                crate::journal::Journal::create(journal::Shape::API, session.suite)?,
            ))
        });
        let (counters, mut journal) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(target: "lockstep::front", peer = %connection.peer, %error, "connection not leased");
                return match resumed(socket, &session, read_ahead, skip, admitted) {
                    Ok(io) => {
                        websocket.get_mut().get_mut().inner = Some(io);
                        LeaseEnd::NotLeased(Box::new((websocket, connection)))
                    }
                    Err(_) => LeaseEnd::Over,
                };
            }
        };
        drop(websocket);
        let open = relay::LeaseOpen {
            connection: connection.number,
            peer: connection.peer,
            reached: connection.reached,
            path: connection.path.clone(),
            shape: journal::Shape::API,
            session,
            counters,
            read_ahead,
            skip,
            kept: crate::leased::Kept {
                login: connection.login.take(),
                watchers: std::mem::take(&mut connection.watchers),
                pending: Vec::new(),
            },
        };
        // The worker's relayed session of this connection ends; the lease's carries on.
        drop(connection);
        let lease = open.lease();
        self.leases.fetch_add(1, Ordering::Relaxed);
        match crate::lease::lease(&mut stream, &open, &socket, &mut journal).await {
            Err(error) => {
                tracing::debug!(target: "lockstep::front", %error, "the lease was not sent");
            }
            Ok(()) => {
                let closed = admitted.ticket.closed.clone();
                tokio::select! {
                    () = crate::lease::returned(&mut stream) => {}
                    () = closed.cancelled() => {
                        // Closed by the launcher (a cap, a shutdown): the holder finds the
                        // socket shut and gives it back.
                        let _ = socket.shutdown(std::net::Shutdown::Both);
                        let _ = tokio::time::timeout(CLOSE_TIMEOUT, crate::lease::returned(&mut stream)).await;
                        self.leases_returned.fetch_add(1, Ordering::Relaxed);
                        return LeaseEnd::Over;
                    }
                }
            }
        }
        self.leases_returned.fetch_add(1, Ordering::Relaxed);
        let taking = crate::lease::take_back_into(&journal, &lease, socket, |socket| {
            crate::admission::Metered::new(socket, admitted)
        });
        match tokio::time::timeout(write_timeout, taking).await {
            Ok(Ok(back)) => LeaseEnd::TakenBack(Box::new((back.socket, back.kept))),
            Ok(Err(error)) => {
                tracing::debug!(target: "lockstep::front", peer = %open.peer, %error, "a leased connection not taken back");
                LeaseEnd::Over
            }
            Err(_) => {
                admitted.close(crate::limits::Refusal::WriteTimeout);
                LeaseEnd::Over
            }
        }
    }

    /// Serves the API's port through this front door as `lockstepd`'s launcher does:
    /// [`crate::server::serve_connections`] (each connection admitted within `limits`, its
    /// TLS session carried on by records, on one of `threads` if given) routed by
    /// [`FrontDoor::router`], which leases quiet websockets to the worker. Dropping the
    /// future closes every connection.
    pub fn serve_port(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
        limits: crate::limits::ApiLimits,
        threads: Option<Arc<crate::threads::ConnectionThreads>>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let connections = Arc::new(Connections::new(limits.clone()));
        let router = self.router(Arc::clone(&connections));
        crate::server::serve_connections(listener, tls, connections, limits, router, threads)
    }

    /// The launcher's routes: the API's websocket paths (`/`, `/api`,
    /// `/model/<uuid>/api`) served through [`FrontDoor::serve_websocket`] (and leased to
    /// the worker when quiet, on [`crate::server::serve_connections`]' socket stack),
    /// anything else relayed as plain HTTP ([`FrontDoor::http`]). Served by
    /// [`crate::server::serve_connections`], which admits each connection.
    pub fn router(self: &Arc<Self>, connections: Arc<Connections>) -> axum::Router {
        let websocket = {
            let door = Arc::clone(self);
            move |request: http::Request<axum::body::Body>| {
                let door = Arc::clone(&door);
                async move { door.upgrade(request) }
            }
        };
        let plain = {
            let door = Arc::clone(self);
            move |request: http::Request<axum::body::Body>| {
                let (door, connections) = (Arc::clone(&door), Arc::clone(&connections));
                async move {
                    let peer = request.extensions().get::<Arc<Admitted>>().map_or_else(
                        || "0.0.0.0:0".parse().expect("an address"),
                        |admitted| admitted.ticket.peer,
                    );
                    let reached = request
                        .extensions()
                        .get::<crate::server::ServerAddress>()
                        .map(|address| address.0);
                    let metrics =
                        request.method() == http::Method::GET && request.uri().path() == "/metrics";
                    let hold = request.extensions().get::<Arc<ConnectionHold>>().cloned();
                    let response = door.http(request, peer, reached, hold).await;
                    if metrics && response.status() == http::StatusCode::OK {
                        with_launcher_counts(response, &connections, door.lease_counts()).await
                    } else {
                        response
                    }
                }
            }
        };
        axum::Router::new()
            .route("/", axum::routing::get(websocket.clone()))
            .route("/api", axum::routing::get(websocket.clone()))
            .route("/model/{uuid}/api", axum::routing::get(websocket))
            .fallback(plain)
    }

    /// Answers a websocket upgrade (RFC 6455's handshake, as tungstenite computes it) and
    /// serves the upgraded connection in a task of its own.
    fn upgrade(
        self: Arc<Self>,
        mut request: http::Request<axum::body::Body>,
    ) -> axum::response::Response {
        use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
        use tokio_tungstenite::tungstenite::protocol::Role;
        let bad = |why: &str| {
            http::Response::builder()
                .status(http::StatusCode::BAD_REQUEST)
                .body(axum::body::Body::from(format!("lockstep: {why}\n")))
                .expect("a valid response")
        };
        let headers = request.headers();
        let upgrade = headers
            .get(http::header::UPGRADE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
        let Some(key) = headers.get(http::header::SEC_WEBSOCKET_KEY) else {
            return bad("the API is a websocket: Sec-WebSocket-Key is missing");
        };
        if !upgrade {
            return bad("the API is a websocket: Upgrade: websocket is missing");
        }
        let accept = derive_accept_key(key.as_bytes());
        let Some(on_upgrade) = request
            .extensions_mut()
            .remove::<hyper::upgrade::OnUpgrade>()
        else {
            return bad("this connection cannot be upgraded");
        };
        let peer = request.extensions().get::<Arc<Admitted>>().map_or_else(
            || "0.0.0.0:0".parse().expect("an address"),
            |admitted| admitted.ticket.peer,
        );
        let admitted = request.extensions().get::<Arc<Admitted>>().cloned();
        let reached = request
            .extensions()
            .get::<crate::server::ServerAddress>()
            .map(|address| address.0);
        let path = request.uri().path().to_owned();
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            // The launcher's own socket stack (`server::serve_connections`) can be leased.
            let upgraded = match &admitted {
                Some(slot) if self.leasing => {
                    match upgraded.downcast::<hyper_util::rt::TokioIo<LauncherIo>>() {
                        Ok(parts) => {
                            let slot = Arc::clone(slot);
                            self.serve_leasing(
                                parts.io.into_inner(),
                                parts.read_buf,
                                (peer, reached, path),
                                slot,
                            )
                            .await;
                            return;
                        }
                        Err(upgraded) => upgraded,
                    }
                }
                _ => upgraded,
            };
            let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(upgraded),
                Role::Server,
                Some(websocket_config()),
            )
            .await;
            self.serve_websocket(socket, peer, reached, path, admitted)
                .await;
        });
        http::Response::builder()
            .status(http::StatusCode::SWITCHING_PROTOCOLS)
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, "websocket")
            .header(http::header::SEC_WEBSOCKET_ACCEPT, accept)
            .body(axum::body::Body::empty())
            .expect("a valid response")
    }

    /// Relays one plain HTTP request (the tools and charms endpoints, the probes, the
    /// metrics) to the worker, and returns the worker's response, its body streamed. The
    /// stream to the worker is the client connection's: kept in its `hold` until the client
    /// hangs up (the worker frees a machine agent's download slot only then), and reused
    /// for its next `GET` or `HEAD`; any other request gets a stream of its own. A `GET` or
    /// `HEAD` whose response head did not come (no worker, or it went) is sent again to the
    /// next worker for up to [`FrontDoor::wait_max`]; any other request is answered
    /// `503 Service Unavailable` with `Retry-After`, since it may have been applied.
    pub async fn http(
        &self,
        request: http::Request<axum::body::Body>,
        peer: SocketAddr,
        reached: Option<SocketAddr>,
        hold: Option<Arc<ConnectionHold>>,
    ) -> axum::response::Response {
        let idempotent = matches!(*request.method(), http::Method::GET | http::Method::HEAD);
        let deadline = Instant::now() + self.wait_max;
        let (parts, body) = request.into_parts();
        let mut body = Some(body);
        loop {
            let mut again = http::Request::builder()
                .method(parts.method.clone())
                .uri(parts.uri.clone())
                .version(parts.version);
            if let Some(headers) = again.headers_mut() {
                headers.clone_from(&parts.headers);
            }
            let again = again
                .body(body.take().unwrap_or_else(axum::body::Body::empty))
                .expect("a request rebuilt from a valid one");
            match self
                .http_once(again, peer, reached, idempotent, hold.as_deref())
                .await
            {
                Ok(response) => return response,
                Err(error) if idempotent && Instant::now() < deadline => {
                    tracing::debug!(target: "lockstep::front", %error, "no worker for an HTTP request yet");
                    let mut listening = self.listening.subscribe();
                    let _ = tokio::time::timeout(RETRY_INTERVAL, listening.changed()).await;
                }
                Err(error) => {
                    tracing::debug!(target: "lockstep::front", %error, "HTTP request not relayed");
                    let body = "lockstep: the controller is restarting; retry\n";
                    return http::Response::builder()
                        .status(http::StatusCode::SERVICE_UNAVAILABLE)
                        .header(http::header::RETRY_AFTER, "1")
                        .header(http::header::CONTENT_TYPE, "text/plain")
                        .body(axum::body::Body::from(body))
                        .expect("a valid response");
                }
            }
        }
    }

    async fn http_once(
        &self,
        request: http::Request<axum::body::Body>,
        peer: SocketAddr,
        reached: Option<SocketAddr>,
        reuse: bool,
        hold: Option<&ConnectionHold>,
    ) -> Result<axum::response::Response, RelayError> {
        let mut kept = hold.and_then(ConnectionHold::take_relay).filter(|_| reuse);
        if let Some(sender) = &mut kept
            && sender.ready().await.is_err()
        {
            kept = None;
        }
        let mut sender = match kept {
            Some(sender) => sender,
            None => self.http_stream(peer, reached).await?,
        };
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| RelayError(format!("HTTP to the worker: {error}")))?;
        if let Some(hold) = hold {
            hold.keep_relay(sender);
        }
        Ok(response.map(axum::body::Body::new))
    }

    /// A new stream to the worker for plain HTTP, past its `http` message.
    async fn http_stream(
        &self,
        peer: SocketAddr,
        reached: Option<SocketAddr>,
    ) -> Result<hyper::client::conn::http1::SendRequest<axum::body::Body>, RelayError> {
        let mut handshake = self.welcomed().await.map_err(|opened| match opened {
            Opened::NoWorker(why) | Opened::Refused(why) => RelayError(why),
        })?;
        handshake
            .send(&Message::Http(relay::HttpOpen {
                connection: self.connections.fetch_add(1, Ordering::Relaxed),
                peer,
                reached,
            }))
            .await?;
        let stream = handshake.into_stream()?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|error| RelayError(format!("HTTP to the worker: {error}")))?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// A client's frame: forwarded, held, or answered here. Returns the answers for the
    /// client: this call's, or, when forwarding found the worker gone, those of the pings
    /// it had not answered.
    async fn client_sent(&self, connection: &mut Connection, frame: String) -> Vec<String> {
        let call = match self.pending_call(connection, frame) {
            Ok(call) => call,
            Err(answer) => return vec![answer],
        };
        if connection.relay.is_some() {
            let sent = connection.forward(&call).await;
            connection.forwarded.push_back(call);
            if sent.is_err() {
                // The worker went: the call is kept and sent again to the next one.
                return connection.broke();
            }
            return Vec::new();
        }
        match gate::between_workers(
            &restarting(),
            connection.login(),
            &call.facade,
            &call.method,
        ) {
            BetweenWorkers::Answer => vec![wire::encode_response(
                call.request_id,
                call.framing,
                json!({}),
            )],
            BetweenWorkers::Wait => {
                connection.held.push_back(call);
                Vec::new()
            }
            BetweenWorkers::Refuse(rejection) => vec![wire::encode_error(
                call.request_id,
                call.framing,
                &WireError::from(rejection),
            )],
        }
    }

    /// A client's frame as a call, stamped if it may change state; or, if it is not a
    /// request, the answer for the client.
    fn pending_call(&self, connection: &Connection, frame: String) -> Result<Pending, String> {
        // A read needs no stamp, so its head is all the launcher reads of it; anything
        // else is decoded whole (its params are in its stamp), and what is not a request
        // is answered here.
        let (head, operation_id) = match wire::peek(&frame) {
            Some(head) if gate::read_only(&head.facade, &head.method) => (head, None),
            _ => match wire::decode(&frame) {
                Ok(request) => {
                    let stamp = relay::operation_id(&self.boot, connection.number, &request);
                    let head = wire::Head {
                        request_id: request.request_id,
                        framing: request.framing,
                        facade: request.facade,
                        method: request.method,
                    };
                    (head, stamp)
                }
                Err(error) => {
                    return Err(wire::encode_error(
                        error.request_id.unwrap_or(0),
                        error.framing,
                        &WireError::new("bad request", error.message),
                    ));
                }
            },
        };
        Ok(Pending {
            operation_id,
            frame,
            request_id: head.request_id,
            framing: head.framing,
            facade: head.facade,
            method: head.method,
            arrived: Instant::now(),
        })
    }

    /// A stream to the worker past `hello`: the worker welcomed one of this launcher's
    /// versions.
    async fn welcomed(&self) -> Result<Handshake, Opened> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|error| Opened::NoWorker(format!("connecting to the worker: {error}")))?;
        let (reader, writer) = stream.into_split();
        let mut handshake = Handshake {
            version: 1,
            frames: FramedRead::new(reader, relay::framing_to_launcher()),
            sink: FramedWrite::new(writer, relay::framing_to_worker()),
        };
        let hello = Message::Hello(Hello {
            versions: self.versions.clone(),
            launcher: self.launcher.clone(),
            boot: self.boot.clone(),
        });
        handshake
            .send(&hello)
            .await
            .map_err(|error| Opened::NoWorker(error.0))?;
        let answer = match handshake.frames.next().await {
            None => Ok(None),
            Some(Err(error)) => Err(RelayError(format!("reading from the worker: {error}"))),
            Some(Ok(frame)) => relay::decode(&frame).map(Some),
        };
        match answer {
            Ok(Some(Message::Welcome(welcome))) if self.versions.contains(&welcome.version) => {
                handshake.version = welcome.version;
                Ok(handshake)
            }
            Ok(Some(Message::Refused(refused))) => Err(Opened::Refused(refused.reason)),
            other => Err(Opened::NoWorker(format!(
                "the worker answered hello with {other:?}"
            ))),
        }
    }

    /// A stream to the worker past `hello`, at a relay version that takes a `lease`
    /// ([`relay::LEASE_VERSION`]), for [`crate::lease::lease`].
    pub async fn lease_stream(&self) -> Result<UnixStream, RelayError> {
        let handshake = self.welcomed().await.map_err(|opened| match opened {
            Opened::NoWorker(why) | Opened::Refused(why) => RelayError(why),
        })?;
        if handshake.version < relay::LEASE_VERSION {
            return Err(RelayError(format!(
                "the worker speaks relay version {}, which takes no lease",
                handshake.version
            )));
        }
        handshake.into_stream()
    }

    /// A stream to the worker, past `hello` and `open` (and, from version 2, on the pipes
    /// the worker handed over).
    async fn open(&self, connection: &Connection) -> Result<Relay, Opened> {
        let mut handshake = self.welcomed().await?;
        let open = Message::Open(Open {
            connection: connection.number,
            peer: connection.peer,
            reached: connection.reached,
            path: connection.path.clone(),
            login: connection.login.clone(),
            watchers: relay::positions(&connection.watchers),
        });
        handshake
            .send(&open)
            .await
            .map_err(|error| Opened::NoWorker(error.0))?;
        let version = handshake.version;
        if version < relay::PIPES_VERSION {
            return Ok(Relay {
                version,
                frames: FramedRead::new(
                    Box::new(handshake.frames.into_inner()),
                    relay::framing_to_launcher(),
                ),
                sink: FramedWrite::new(
                    Box::new(handshake.sink.into_inner()),
                    relay::framing_to_worker(),
                ),
                first: None,
            });
        }
        let mut stream = handshake
            .into_stream()
            .map_err(|error| Opened::NoWorker(error.0))?;
        match crate::pipes::receive(&mut stream).await {
            Ok(Some(crate::pipes::AfterOpen::Pipes(ends))) => Ok(Relay {
                version,
                frames: FramedRead::new(Box::new(ends.replies), relay::framing_to_launcher()),
                sink: FramedWrite::new(Box::new(ends.calls), relay::framing_to_worker()),
                first: None,
            }),
            // A `close`: served as the stream's first message, as on version 1.
            Ok(Some(crate::pipes::AfterOpen::Message(message))) => {
                let (reader, writer) = stream.into_split();
                Ok(Relay {
                    version,
                    frames: FramedRead::new(Box::new(reader), relay::framing_to_launcher()),
                    sink: FramedWrite::new(Box::new(writer), relay::framing_to_worker()),
                    first: Some(message),
                })
            }
            Ok(None) => Err(Opened::NoWorker(
                "the worker closed the stream after open".to_owned(),
            )),
            Err(error) => Err(Opened::NoWorker(error.0)),
        }
    }
}

/// The websocket settings of a client connection the launcher serves: the worker's own
/// (its read buffer, [`crate::connection::READ_BUFFER_BYTES`], which tungstenite zeroes on
/// every read, and the API's frame bound).
pub fn websocket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    let mut config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    config.read_buffer_size = crate::connection::READ_BUFFER_BYTES;
    config.max_message_size = Some(crate::wire::FRAME_SIZE_BYTES_MAX);
    config.max_frame_size = Some(crate::wire::FRAME_SIZE_BYTES_MAX);
    config
}

/// The worker's `/metrics` with the launcher's connection counts added
/// ([`crate::probes::add_connection_counts`]): behind the front door the connections are
/// the launcher's; and the front door's leases.
async fn with_launcher_counts(
    response: axum::response::Response,
    connections: &Connections,
    leases: LeaseCounts,
) -> axum::response::Response {
    /// Far more than `/metrics` ever holds (its labels are bounded).
    const METRICS_BYTES_MAX: usize = 1 << 20;
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, METRICS_BYTES_MAX).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(error) => {
            tracing::debug!(target: "lockstep::front", %error, "reading the worker's /metrics");
            return http::Response::builder()
                .status(http::StatusCode::BAD_GATEWAY)
                .body(axum::body::Body::from(
                    "lockstep: the worker's /metrics could not be read\n",
                ))
                .expect("a valid response");
        }
    };
    let mut merged = crate::probes::add_connection_counts(&text, &connections.counts());
    crate::probes::add_lease_counts(&mut merged, leases.leased, leases.returned);
    let mut response = axum::response::Response::from_parts(parts, axum::body::Body::from(merged));
    response.headers_mut().remove(http::header::CONTENT_LENGTH);
    response
}

/// How a connection's serving loop ended.
enum Served {
    /// The connection is over.
    Over,
    /// A worker's reply left the connection quiet (it may be leased).
    Quiet(Box<Connection>),
}

/// What became of a quiet connection offered to the worker.
enum LeaseEnd {
    /// Not leased: served on as it was.
    NotLeased(Box<(LeasableWebsocket, Connection)>),
    /// Leased, and taken back once the worker was done with it.
    TakenBack(Box<(LauncherIo, crate::leased::Kept)>),
    /// Over (the client went, its socket failed, or the launcher closed it).
    Over,
}

/// A client's socket as the launcher serves it (`server::serve_connections`): its TLS
/// session carried on by records, its input metered until it logs in.
type LauncherIo = crate::records::RecordStream<crate::admission::Metered<tokio::net::TcpStream>>;

/// A client's websocket the launcher can take its socket out of.
type LeasableWebsocket = tokio_tungstenite::WebSocketStream<FrameBounded<Takeable<LauncherIo>>>;

/// A websocket over `io`, after `prefix` (what hyper read past the upgrade request).
async fn leasable_websocket(prefix: tokio_util::bytes::Bytes, io: LauncherIo) -> LeasableWebsocket {
    tokio_tungstenite::WebSocketStream::from_raw_socket(
        FrameBounded::new(Takeable {
            prefix,
            inner: Some(io),
        }),
        tokio_tungstenite::tungstenite::protocol::Role::Server,
        Some(websocket_config()),
    )
    .await
}

/// The connection's login hook for the launcher's admission: the connection leaves the
/// strangers' slots when it logs in.
fn login_hook(admitted: Option<&Arc<Admitted>>) -> Option<Box<dyn FnOnce() -> bool + Send>> {
    admitted.map(|admitted| {
        let admitted = Arc::clone(admitted);
        Box::new(move || admitted.logged_in()) as Box<dyn FnOnce() -> bool + Send>
    })
}

/// The launcher's records over a socket it handed over and did not lease after all.
fn resumed(
    socket: std::net::TcpStream,
    session: &crate::records::SessionState,
    read_ahead: Vec<u8>,
    skip: u64,
    admitted: &Admitted,
) -> std::io::Result<LauncherIo> {
    let socket = tokio::net::TcpStream::from_std(socket)?;
    let session = crate::records::Session::new(session).map_err(std::io::Error::from)?;
    Ok(crate::records::RecordStream::resume(
        crate::admission::Metered::new(socket, admitted),
        session,
        read_ahead,
        skip,
    ))
}

/// A stream whose inside can be taken out (tungstenite gives none back), read after what
/// was read of it before (`prefix`). Once taken, reads and writes fail.
struct Takeable<S> {
    prefix: tokio_util::bytes::Bytes,
    inner: Option<S>,
}

impl<S> Takeable<S> {
    /// The stream, unless some of `prefix` is still unread.
    fn take(&mut self) -> Option<S> {
        if self.prefix.is_empty() {
            self.inner.take()
        } else {
            None
        }
    }

    fn inner(&mut self) -> std::io::Result<&mut S> {
        self.inner.as_mut().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotConnected, "the socket was leased")
        })
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Takeable<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = buf.remaining().min(this.prefix.len());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(this.inner()?).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Takeable<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(self.get_mut().inner()?).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(self.get_mut().inner()?).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(self.get_mut().inner()?).poll_shutdown(cx)
    }
}

/// Why no stream was opened.
enum Opened {
    /// No worker listens, or it went during the handshake (why): try again.
    NoWorker(String),
    /// The worker speaks none of this launcher's versions.
    Refused(String),
}

/// The gate's view between two workers: its progress is not known here.
fn restarting() -> GateView {
    GateView {
        phase: Phase::Restarting,
        progress: Progress::default(),
        retry_after: Millis(1000),
    }
}

/// A call not answered yet.
struct Pending {
    frame: String,
    operation_id: Option<String>,
    request_id: u64,
    framing: Framing,
    facade: String,
    method: String,
    /// When it arrived, or when the worker it was sent to went: what its wait counts from.
    arrived: Instant,
}

/// A stream to the worker during its handshake, on the relay socket.
struct Handshake {
    /// The version agreed on (1 until `welcome`).
    version: u32,
    frames: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    sink: FramedWrite<OwnedWriteHalf, LengthDelimitedCodec>,
}

impl Handshake {
    async fn send(&mut self, message: &Message) -> Result<(), RelayError> {
        let bytes = relay::encode(message)?;
        self.sink
            .send(bytes.as_slice())
            .await
            .map_err(|error| RelayError(format!("writing to the worker: {error}")))
    }

    /// The socket itself, for what is not framed (plain HTTP, version 2's pipes): nothing
    /// may be left in the frame reader's buffer, since the worker sends nothing after
    /// `welcome` until the launcher's next message (`http`'s request, or `open`).
    fn into_stream(self) -> Result<UnixStream, RelayError> {
        let parts = self.frames.into_parts();
        if !parts.read_buf.is_empty() {
            return Err(RelayError(format!(
                "the worker sent {} bytes after welcome unasked",
                parts.read_buf.len()
            )));
        }
        parts
            .io
            .reunite(self.sink.into_inner())
            .map_err(|error| RelayError(format!("rejoining the stream: {error}")))
    }
}

/// What a connection's messages are read from and written to: the socket's halves
/// (version 1) or the pipes (version 2).
type RelayRead = Box<dyn tokio::io::AsyncRead + Send + Sync + Unpin>;
type RelayWrite = Box<dyn tokio::io::AsyncWrite + Send + Sync + Unpin>;

/// A connection's relay to the worker, past its handshake.
struct Relay {
    version: u32,
    frames: FramedRead<RelayRead, LengthDelimitedCodec>,
    sink: FramedWrite<RelayWrite, LengthDelimitedCodec>,
    /// A message the worker sent during the handshake, read before the rest.
    first: Option<Message>,
}

impl Relay {
    async fn send(&mut self, message: &Message) -> Result<(), RelayError> {
        let bytes = relay::encode_in(self.version, message)?;
        self.sink
            .send(bytes.as_slice())
            .await
            .map_err(|error| RelayError(format!("writing to the worker: {error}")))
    }
}

/// The next message from the worker; pending forever without a stream.
async fn next_message(relay: &mut Option<Relay>) -> Result<Option<Message>, RelayError> {
    let Some(relay) = relay else {
        return std::future::pending().await;
    };
    if let Some(first) = relay.first.take() {
        return Ok(Some(first));
    }
    match relay.frames.next().await {
        None => Ok(None),
        Some(Err(error)) => Err(RelayError(format!("reading from the worker: {error}"))),
        Some(Ok(frame)) => relay::decode_in(relay.version, &frame).map(Some),
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

struct Connection {
    number: u64,
    peer: SocketAddr,
    reached: Option<SocketAddr>,
    path: String,
    /// Sent to the worker, not answered yet, in the order the client sent them.
    forwarded: VecDeque<Pending>,
    /// Held while no worker serves, in arrival order.
    held: VecDeque<Pending>,
    login: Option<CarriedLogin>,
    /// Each watcher's last revision delivered (`None`: no `Next` answered yet).
    watchers: BTreeMap<String, Option<u64>>,
    relay: Option<Relay>,
}

impl Connection {
    /// Logged in, nothing forwarded or held, and relayed at a version that takes a lease.
    fn leasable(&self) -> bool {
        self.login.is_some()
            && self.forwarded.is_empty()
            && self.held.is_empty()
            && self
                .relay
                .as_ref()
                .is_some_and(|relay| relay.version >= relay::LEASE_VERSION)
    }

    fn login(&self) -> Login {
        self.login
            .as_ref()
            .map_or(Login::Anonymous, |login| login.kind)
    }

    /// The stream to the worker broke: the calls it had not answered wait for the next
    /// worker from now, as calls made now would, except that a ping is answered here (one
    /// never changes anything). A write among them may have been committed: it waits to be
    /// sent again under its stamp; past the wait it is refused, and the client's retry of
    /// the same frame carries the same stamp. Returns the answers for the client.
    fn broke(&mut self) -> Vec<String> {
        self.relay = None;
        let now = Instant::now();
        let login = self.login();
        let mut answers = Vec::new();
        let mut waiting: VecDeque<Pending> = VecDeque::new();
        for mut call in self.forwarded.drain(..) {
            if gate::between_workers(&restarting(), login, &call.facade, &call.method)
                == BetweenWorkers::Answer
            {
                answers.push(wire::encode_response(
                    call.request_id,
                    call.framing,
                    json!({}),
                ));
                continue;
            }
            call.arrived = now;
            waiting.push_back(call);
        }
        waiting.extend(self.held.drain(..));
        self.held = waiting;
        answers
    }

    async fn forward(&mut self, call: &Pending) -> Result<(), RelayError> {
        let relay = self.relay.as_mut().expect("forward needs a stream");
        relay
            .send(&Message::Call(Call {
                frame: call.frame.clone(),
                operation_id: call.operation_id.clone(),
                replayed: false,
            }))
            .await
    }

    /// After a new stream opened: every call forwarded and not answered, then every call
    /// held, in order.
    async fn resend(&mut self) -> Result<(), RelayError> {
        let held: Vec<Pending> = self.held.drain(..).collect();
        self.forwarded.extend(held);
        let pending: Vec<(String, Option<String>)> = self
            .forwarded
            .iter()
            .map(|call| (call.frame.clone(), call.operation_id.clone()))
            .collect();
        let relay = self.relay.as_mut().expect("resend needs a stream");
        for (frame, operation_id) in pending {
            relay
                .send(&Message::Call(Call {
                    frame,
                    operation_id,
                    replayed: true,
                }))
                .await?;
        }
        Ok(())
    }

    /// A reply from the worker: what it reports kept, its call no longer pending; the frame
    /// for the client.
    fn replied(&mut self, reply: relay::Reply) -> String {
        if let Some(login) = reply.login {
            self.login = Some(login);
        }
        if let Some(watcher) = reply.watcher {
            if watcher.stopped {
                self.watchers.remove(&watcher.id);
            } else {
                self.watchers.insert(watcher.id, watcher.revision);
            }
        }
        if let Some(id) = reply.request_id.or_else(|| request_id(&reply.frame))
            && let Some(index) = self.forwarded.iter().position(|call| call.request_id == id)
        {
            self.forwarded.remove(index);
        }
        reply.frame
    }
}

/// A reply frame's request id, in either framing, read without building the reply.
fn request_id(frame: &str) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Id {
        #[serde(rename = "request-id")]
        current: Option<u64>,
        #[serde(rename = "RequestId")]
        legacy: Option<u64>,
    }
    let id: Id = serde_json::from_str(frame).ok()?;
    id.current.or(id.legacy)
}

/// The state of a connection taken back from the worker that held it (numbered `number` as
/// when it was leased): the login and watchers `kept` holds, and every call it holds taken
/// and not answered waiting for the next worker, under the operation-id the holder stamped.
fn taken_back(
    number: u64,
    (peer, reached, path): (SocketAddr, Option<SocketAddr>, String),
    kept: crate::leased::Kept,
) -> Connection {
    let now = Instant::now();
    let held = kept
        .pending
        .into_iter()
        .filter_map(|call| {
            let Some(head) = wire::peek(&call.frame) else {
                tracing::warn!(target: "lockstep::front", request_id = call.request_id, "a kept call that is not a request: dropped");
                return None;
            };
            Some(Pending {
                frame: call.frame,
                operation_id: call.operation_id,
                request_id: head.request_id,
                framing: head.framing,
                facade: head.facade,
                method: head.method,
                arrived: now,
            })
        })
        .collect();
    Connection {
        number,
        peer,
        reached,
        path,
        forwarded: VecDeque::new(),
        held,
        login: kept.login,
        watchers: kept.watchers,
        relay: None,
    }
}
