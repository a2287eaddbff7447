//! The worker's side of the relay (`spec/relay.md`): client connections the launcher holds,
//! served over `<data-dir>/relay.sock` one stream each.
//!
//! A stream is accepted from the launcher only (its pid, the worker's uid), then: `hello`,
//! answered `welcome` or `refused`; `open`, which makes a [`Session`] for the connection
//! (its login and watchers carried over from the previous worker, if any); then `call`s,
//! served concurrently exactly as a websocket's requests are ([`route`]), each answered by
//! a `reply` with what the launcher keeps: the login after `Admin.Login`, a watcher's
//! position after `Client.WatchAll`, `AllWatcher.Next` and `AllWatcher.Stop`.
//!
//! After `http` instead of `open`, the stream carries plain HTTP/1.1 from the launcher's
//! client (the tools and charms endpoints, the probes, the metrics), served by the API's
//! router as on its own port.
//!
//! Admission (slots, metering, deadlines) is the launcher's, which owns the client's socket;
//! a relayed session holds no slot here.

use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use lockstep_core::gate::Login;
use lockstep_core::lifecycle::Revision;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use crate::api::Api;
use crate::auth;
use crate::connection::REQUESTS_IN_FLIGHT_MAX;
use crate::relay::{
    self, CarriedLogin, Close, Message, Open, RelayError, Reply, WatcherPosition, Welcome,
};
use crate::route;
use crate::session::Session;
use crate::wire::{self, WireError};

/// Who may open relay streams: the launcher's pid, and this process's uid.
#[derive(Clone, Copy, Debug)]
pub struct Launcher {
    pub pid: u32,
    pub uid: u32,
}

/// Serves relay streams from `listener` until this future is dropped, which ends every
/// stream it accepted. A stream from any other process than `launcher` is closed unread.
pub async fn serve(api: Arc<Api>, listener: tokio::net::UnixListener, launcher: Launcher) {
    let mut streams = tokio::task::JoinSet::new();
    loop {
        while streams.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(target: "lockstep::relay", %error, "relay accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        match stream.peer_cred() {
            Ok(cred) if cred.pid() == Some(launcher.pid as i32) && cred.uid() == launcher.uid => {}
            Ok(cred) => {
                tracing::warn!(
                    target: "lockstep::relay",
                    pid = cred.pid().unwrap_or(0),
                    uid = cred.uid(),
                    launcher = launcher.pid,
                    "refused a relay stream not opened by the launcher"
                );
                continue;
            }
            Err(error) => {
                tracing::warn!(target: "lockstep::relay", %error, "cannot read a relay peer's credentials");
                continue;
            }
        }
        let api = Arc::clone(&api);
        streams.spawn(async move {
            if let Err(error) = stream_served(api, stream).await {
                tracing::debug!(target: "lockstep::relay", %error, "relay stream ended");
            }
        });
    }
}

impl Api {
    /// Serves the connections the launcher relays ([`serve`]) instead of a port of its own.
    /// `address` is where clients reach the controller (the URLs of agent binaries point
    /// there) and `ca_pem` the controller's CA, which `Controller.ControllerAPIInfoForModels`
    /// hands out: on its own port the API learns both from its socket and its first TLS
    /// handshake.
    pub async fn serve_relayed(
        self: Arc<Api>,
        listener: tokio::net::UnixListener,
        launcher: Launcher,
        address: Option<std::net::SocketAddr>,
        ca_pem: String,
    ) {
        *self.address.lock().expect("not poisoned") = address;
        let _ = self.ca.set(ca_pem);
        serve(self, listener, launcher).await;
    }
}

type Frames<R = OwnedReadHalf> = FramedRead<R, LengthDelimitedCodec>;
type Sink = FramedWrite<OwnedWriteHalf, LengthDelimitedCodec>;

async fn read<R: AsyncRead + Unpin>(
    frames: &mut Frames<R>,
    version: u32,
) -> Result<Option<Message>, RelayError> {
    match frames.next().await {
        None => Ok(None),
        Some(Err(error)) => Err(RelayError(format!("reading the stream: {error}"))),
        Some(Ok(frame)) => relay::decode_in(version, &frame).map(Some),
    }
}

async fn write(sink: &mut Sink, message: &Message) -> Result<(), RelayError> {
    let bytes = relay::encode(message)?;
    sink.send(bytes.as_slice())
        .await
        .map_err(|error| RelayError(format!("writing the stream: {error}")))
}

async fn stream_served(api: Arc<Api>, stream: UnixStream) -> Result<(), RelayError> {
    let (reader, writer) = stream.into_split();
    let mut frames = FramedRead::new(reader, relay::framing_to_worker());
    let mut sink = FramedWrite::new(writer, relay::framing_to_launcher());
    let Some(Message::Hello(hello)) = read(&mut frames, 1).await? else {
        return Err(RelayError("the first message is not hello".to_owned()));
    };
    let version = match relay::choose(&hello.versions) {
        Ok(version) => version,
        Err(refused) => {
            tracing::warn!(target: "lockstep::relay", launcher = %hello.launcher, reason = %refused.reason, "refused a launcher's relay");
            write(&mut sink, &Message::Refused(refused)).await?;
            return Ok(());
        }
    };
    let welcome = Welcome {
        version,
        worker: env!("CARGO_PKG_VERSION").to_owned(),
    };
    write(&mut sink, &Message::Welcome(welcome)).await?;
    let next = if version < relay::LEASE_VERSION {
        read(&mut frames, 1).await?
    } else {
        // A `lease` carries descriptors, which a plain read would lose: the frame after
        // `welcome` is read with them (the launcher sent nothing after `hello` until it
        // had `welcome`, so nothing of it is buffered).
        let parts = frames.into_parts();
        if !parts.read_buf.is_empty() {
            return Err(RelayError(
                "the launcher sent more than hello before welcome".to_owned(),
            ));
        }
        let mut stream = parts
            .io
            .reunite(sink.into_inner())
            .map_err(|error| RelayError(format!("rejoining the stream: {error}")))?;
        let Some((frame, fds)) =
            crate::pipes::receive_with(&mut stream, relay::TO_WORKER_FRAME_BYTES_MAX).await?
        else {
            return Ok(());
        };
        let message = relay::decode_in(version, &frame)?;
        if let Message::Lease(open) = message {
            return crate::lease::serve(&api, &hello.boot, *open, fds, stream).await;
        }
        drop(fds);
        let (reader, writer) = stream.into_split();
        frames = FramedRead::new(reader, relay::framing_to_worker());
        sink = FramedWrite::new(writer, relay::framing_to_launcher());
        Some(message)
    };
    let open = match next {
        Some(Message::Open(open)) => open,
        Some(Message::Http(open)) => return http(api, open, frames, sink).await,
        Some(other) => {
            return Err(RelayError(format!(
                "expected open or http after welcome, got {}",
                name(&other)
            )));
        }
        None => return Ok(()),
    };
    let session = match restored(&api, &open).await {
        Ok(session) => session,
        Err(reason) => {
            let close = Close {
                code: 1008,
                reason: format!("the connection cannot continue on this worker: {reason}"),
            };
            return write(&mut sink, &Message::Close(close)).await;
        }
    };
    if version < relay::PIPES_VERSION {
        return connection(&api, &session, version, frames, sink.into_inner()).await;
    }
    // Version 2: the launcher sends nothing after `open` until it has its pipes.
    let parts = frames.into_parts();
    if !parts.read_buf.is_empty() {
        return Err(RelayError(
            "the launcher sent more than open before its pipes".to_owned(),
        ));
    }
    let mut stream = parts
        .io
        .reunite(sink.into_inner())
        .map_err(|error| RelayError(format!("rejoining the stream: {error}")))?;
    let ends = crate::pipes::hand_over(&mut stream).await?;
    drop(stream);
    let calls = FramedRead::new(ends.calls, relay::framing_to_worker());
    connection(&api, &session, version, calls, ends.replies).await
}

/// Serves HTTP/1.1 on the rest of the stream: what the launcher sent after `http` may be
/// in the frame reader's buffer already, so it is read first.
async fn http(
    api: Arc<Api>,
    open: relay::HttpOpen,
    frames: Frames,
    sink: Sink,
) -> Result<(), RelayError> {
    let parts = frames.into_parts();
    let stream = parts
        .io
        .reunite(sink.into_inner())
        .map_err(|error| RelayError(format!("rejoining the stream: {error}")))?;
    let io = Prefixed {
        prefix: parts.read_buf.freeze(),
        io: stream,
    };
    // The client's address, for the failed-login throttle of HTTP logins.
    // What the stream keeps until the launcher ends it, which it does when the client's
    // connection ends (a machine agent's download slot past the last byte).
    let router = api
        .router()
        .layer(axum::Extension(crate::server::RelayedPeer(open.peer)))
        .layer(axum::Extension(std::sync::Arc::new(
            crate::hold::ConnectionHold::default(),
        )));
    let service = hyper_util::service::TowerToHyperService::new(router);
    hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await
        .map_err(|error| RelayError(format!("serving HTTP: {error}")))
}

/// A stream whose first bytes were already read into `prefix`.
struct Prefixed {
    prefix: tokio_util::bytes::Bytes,
    io: UnixStream,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

fn name(message: &Message) -> &'static str {
    match message {
        Message::Hello(_) => "hello",
        Message::Welcome(_) => "welcome",
        Message::Refused(_) => "refused",
        Message::Open(_) => "open",
        Message::Http(_) => "http",
        Message::Call(_) => "call",
        Message::Reply(_) => "reply",
        Message::Close(_) => "close",
        Message::Pipes(_) => "pipes",
        Message::Lease(_) => "lease",
    }
}

/// Why a carried-over connection cannot go on here; the launcher closes the client's.
pub(crate) async fn restored(api: &Api, open: &Open) -> Result<Session, String> {
    let session = Session::relayed(open.reached, open.peer);
    if let Some(carried) = &open.login {
        let who = auth::carried(api, &carried.tag)
            .await
            .ok_or_else(|| format!("{} may no longer log in", carried.tag))?;
        session.logged_in(who, &carried.tag);
        if who == Login::User {
            let user = carried.tag.strip_prefix("user-").unwrap_or_default();
            session.grant(auth::model_access(user));
        }
    }
    let limits = &api.config.limits;
    for watcher in &open.watchers {
        let id = watcher
            .id
            .parse::<u64>()
            .map_err(|_| format!("watcher id {:?} is not one this API gives", watcher.id))?;
        let slot = api.connections.watcher_slot().ok_or_else(|| {
            format!(
                "the controller holds {} watchers, its limit (--max-watchers)",
                limits.watchers_max
            )
        })?;
        session
            .restore_watcher(
                id,
                watcher.revision.map(Revision),
                limits.watchers_per_connection_max,
                slot,
            )
            .map_err(|error| error.message)?;
    }
    Ok(session)
}

/// Bytes of encoded replies buffered for the launcher past which no more answers are taken
/// until some are written (an answer is taken whole: one large reply goes over it).
const REPLIES_BUFFERED_BYTES_MAX: usize = 256 << 10;

/// Serves one connection's calls on this task: each call's answer is a future polled here
/// (no task spawned per call), and each reply is written as soon as it is encoded if the
/// pipe takes it; what the pipe does not take waits in a buffer, written together by the
/// loop's write branch. Reading, answering and writing never wait on each other:
/// a reply the launcher is slow to take does not stop calls from being read, so neither
/// side can block the other (the launcher never has more than [`REQUESTS_IN_FLIGHT_MAX`]
/// calls unanswered, and so many are always read).
async fn connection<R, W>(
    api: &Api,
    session: &Session,
    version: u32,
    mut frames: Frames<R>,
    mut writer: W,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = tokio_util::bytes::BytesMut::new();
    let mut answers = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            written = writer.write_buf(&mut out), if !out.is_empty() => match written {
                Ok(0) => return Err(RelayError("writing the stream: closed".to_owned())),
                Ok(_) => {
                    // A large reply's room is not kept for the connection's life.
                    if out.is_empty() && out.capacity() > REPLIES_BUFFERED_BYTES_MAX {
                        out = tokio_util::bytes::BytesMut::new();
                    }
                }
                Err(error) => return Err(RelayError(format!("writing the stream: {error}"))),
            },
            Some(reply) = answers.next(), if out.len() < REPLIES_BUFFERED_BYTES_MAX => {
                let bytes = relay::encode_in(version, &Message::Reply(reply))?;
                let length = u32::try_from(bytes.len()).expect("bounded by encode");
                out.reserve(4 + bytes.len());
                out.extend_from_slice(&length.to_be_bytes());
                out.extend_from_slice(&bytes);
                // Written now if the pipe takes it (it nearly always does); otherwise by
                // the write branch, which registers for the pipe's room.
                if let Some(Err(error)) = writer.write_buf(&mut out).now_or_never() {
                    return Err(RelayError(format!("writing the stream: {error}")));
                }
            }
            call = read(&mut frames, version), if answers.len() < REQUESTS_IN_FLIGHT_MAX => match call {
                Ok(Some(Message::Call(call))) => answers.push(answer(api, session, call)),
                Ok(Some(other)) => {
                    return Err(RelayError(format!("expected a call, got {}", name(&other))));
                }
                // The launcher went: what is in flight ends with the stream.
                Ok(None) => return Ok(()),
                Err(error) => return Err(error),
            },
        }
    }
}

/// Waits, at most [`relay::REPLAY_WAIT_MAX`], while this worker is not Ready and its gate
/// would refuse `facade.method` to `login`: a replayed call, which the worker that went may
/// have committed, is answered by what it did rather than refused. (Reads are served in
/// every phase and never wait.)
async fn ready_for(api: &Api, login: Login, facade: &str, method: &str) {
    let mut changes = api.gate.clone();
    let deadline = tokio::time::Instant::now() + relay::REPLAY_WAIT_MAX;
    loop {
        let view = *changes.borrow_and_update();
        if !view.is_limited() || lockstep_core::gate::admit(&view, login, facade, method).is_ok() {
            return;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// Serves one relayed call: the frame decoded, the launcher's operation-id put in its
/// params, a replayed call held until the worker may answer it, the call routed as a
/// websocket's is, and the reply annotated.
pub(crate) async fn answer(api: &Api, session: &Session, call: relay::Call) -> Reply {
    let mut request = match wire::decode(&call.frame) {
        Ok(request) => request,
        Err(error) => {
            let frame = wire::encode_error(
                error.request_id.unwrap_or(0),
                error.framing,
                &WireError::new("bad request", error.message),
            );
            return Reply {
                frame,
                request_id: error.request_id,
                login: None,
                watcher: None,
            };
        }
    };
    if let Some(operation_id) = call.operation_id
        && request.params.get("operation-id").is_none()
    {
        if !request.params.is_object() {
            request.params = Value::Object(serde_json::Map::new());
        }
        request.params["operation-id"] = Value::String(operation_id);
    }
    if call.replayed {
        ready_for(api, session.login(), &request.facade, &request.method).await;
    }
    let (id, framing) = (request.request_id, request.framing);
    let outcome = route::call(api, session, &request).await;
    let mut reply = Reply {
        frame: String::new(),
        request_id: Some(id),
        login: None,
        watcher: None,
    };
    if let Ok(response) = &outcome {
        match (request.facade.as_str(), request.method.as_str()) {
            ("Admin", "Login") if session.login() != Login::Anonymous => {
                reply.login = Some(CarriedLogin {
                    tag: session.tag(),
                    kind: session.login(),
                });
            }
            ("Client", "WatchAll") => {
                if let Some(id) = response.get("watcher-id").and_then(Value::as_str) {
                    let revision = request.params.get("after-revision").and_then(Value::as_u64);
                    reply.watcher = Some(WatcherPosition {
                        id: id.to_owned(),
                        revision,
                        stopped: false,
                    });
                }
            }
            ("AllWatcher", "Next") => {
                reply.watcher = Some(WatcherPosition {
                    id: request.id.clone(),
                    revision: response.get("revision").and_then(Value::as_u64),
                    stopped: false,
                });
            }
            ("AllWatcher", "Stop") => {
                reply.watcher = Some(WatcherPosition {
                    id: request.id.clone(),
                    revision: None,
                    stopped: true,
                });
            }
            _ => {}
        }
    }
    reply.frame = match outcome {
        Ok(response) => wire::encode_response(id, framing, response),
        Err(error) => wire::encode_error(id, framing, &error),
    };
    if reply.frame.len() > relay::REPLY_FRAME_BYTES_MAX {
        let error = WireError::new(
            "",
            format!(
                "the reply of {} bytes is over the relay's limit of {}",
                reply.frame.len(),
                relay::REPLY_FRAME_BYTES_MAX
            ),
        );
        reply = Reply {
            frame: wire::encode_error(id, framing, &error),
            request_id: Some(id),
            login: None,
            watcher: None,
        };
    }
    reply
}
