//! One client connection: the websocket upgrade, a reader that spawns a task per request
//! (at most [`REQUESTS_IN_FLIGHT_MAX`] at once: python-libjuju keeps a watcher's `Next`
//! blocked while it pings) and a writer that sends replies in completion order, each
//! carrying its request's id.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::CloseFrame;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::admission::Admitted;
use crate::limits::Refusal;

use crate::api::Api;
use crate::route;
use crate::session::Session;
use crate::wire::FRAME_SIZE_BYTES_MAX;

/// Requests one connection may have in flight; the next waits for one to finish.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Replies queued for a connection that is slow to read them (their bytes are bounded too:
/// [`crate::limits::ApiLimits::reply_bytes_per_connection_max`]).
pub const REPLIES_QUEUED_MAX: usize = 64;

/// Time the close frame of a connection closed by the API may take to be written.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The websocket's read buffer: tungstenite's default (128 KiB) per connection would be
/// most of what a stranger's connection may hold; it grows for larger frames after login.
pub(crate) const READ_BUFFER_BYTES: usize = 8 << 10;

/// Upgrades an HTTP request to the API's websocket; `reached` is the address the client
/// reached this server on, `admitted` the connection's slot (`None` when the router is
/// served without the API's accept loop), held until the websocket ends.
pub fn upgrade(
    api: Arc<Api>,
    upgrade: WebSocketUpgrade,
    reached: Option<SocketAddr>,
    admitted: Option<Arc<Admitted>>,
) -> Response {
    upgrade
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(FRAME_SIZE_BYTES_MAX)
        .max_frame_size(FRAME_SIZE_BYTES_MAX)
        .on_upgrade(move |socket| connection(api, socket, reached, admitted))
}

async fn connection(
    api: Arc<Api>,
    socket: WebSocket,
    reached: Option<SocketAddr>,
    admitted: Option<Arc<Admitted>>,
) {
    let ticket = admitted
        .as_ref()
        .map(|admitted| Arc::clone(&admitted.ticket));
    let closed = ticket
        .as_ref()
        .map_or_else(CancellationToken::new, |ticket| ticket.closed.clone());
    let (mut sink, mut stream) = socket.split();
    let (replies, mut queued) = mpsc::channel::<(Message, usize)>(REPLIES_QUEUED_MAX);
    let writer = {
        let (api, ticket, closed) = (Arc::clone(&api), ticket.clone(), closed.clone());
        tokio::spawn(async move {
            let write_timeout = api.config.limits.write_timeout;
            while let Some((message, bytes)) = queued.recv().await {
                let written = tokio::select! {
                    written = tokio::time::timeout(write_timeout, sink.send(message)) => written,
                    () = closed.cancelled() => break,
                };
                if let Some(ticket) = &ticket {
                    api.connections.release_reply(ticket, bytes);
                }
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break,
                    Err(_) => {
                        if let Some(ticket) = &ticket {
                            ticket.close(&api.connections, Refusal::WriteTimeout);
                        }
                        break;
                    }
                }
            }
            // Tell a client closed for holding too much why, if its socket still takes it.
            if let Some(reason) = ticket.as_ref().and_then(|ticket| ticket.reason()) {
                let close = Message::Close(Some(CloseFrame {
                    code: 1008,
                    reason: format!("closed by the controller: {reason}").into(),
                }));
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.send(close)).await;
            }
        })
    };
    let session = Arc::new(Session::new(reached, admitted));
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    // Requests in flight belong to the connection: they end with it (a long-poll must not
    // keep a closed connection's socket open), and with the server.
    let mut requests = tokio::task::JoinSet::new();
    loop {
        let message = tokio::select! {
            message = stream.next() => message,
            () = closed.cancelled() => break,
        };
        while requests.try_join_next().is_some() {}
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                // Juju's API is text frames only: close rather than guess.
                let _ = replies
                    .send((
                        Message::Close(Some(CloseFrame {
                            code: 1003,
                            reason: "binary frames are not part of the API".into(),
                        })),
                        0,
                    ))
                    .await;
                break;
            }
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Err(error)) => {
                // axum hides tungstenite's error type; its text names a frame over the size.
                let text = error.to_string();
                if let Some(ticket) = &ticket
                    && (text.contains("too long") || text.contains("too big"))
                {
                    ticket.close(&api.connections, Refusal::FrameSize);
                }
                break;
            }
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let (api, session, replies) = (Arc::clone(&api), Arc::clone(&session), replies.clone());
        let ticket = ticket.clone();
        requests.spawn(async move {
            let reply = route::answer(&api, &session, text.as_str()).await;
            let bytes = reply.len();
            // Counted from the moment it exists until it is written.
            if let Some(ticket) = &ticket
                && !api.connections.reserve_reply(ticket, bytes)
            {
                api.connections.release_reply(ticket, bytes);
                return;
            }
            let _ = replies.send((Message::Text(reply.into()), bytes)).await;
            drop(permit);
        });
    }
    requests.shutdown().await;
    // The writer ends once every sender is gone, after flushing what was queued (a close
    // frame included).
    drop(replies);
    let _ = writer.await;
    // The slot is freed once the session (which holds it) is dropped.
    closed.cancel();
}
