//! One client connection: the websocket upgrade, a reader that spawns a task per request
//! (at most [`REQUESTS_IN_FLIGHT_MAX`] at once: python-libjuju keeps a watcher's `Next`
//! blocked while it pings) and a writer that sends replies in completion order, each
//! carrying its request's id.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{Semaphore, mpsc};

use crate::api::Api;
use crate::route;
use crate::session::Session;
use crate::wire::FRAME_SIZE_BYTES_MAX;

/// Requests one connection may have in flight; the next waits for one to finish.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Replies queued for a connection that is slow to read them.
pub const REPLIES_QUEUED_MAX: usize = 64;

/// Upgrades an HTTP request to the API's websocket; `reached` is the address the client
/// reached this server on.
pub fn upgrade(api: Arc<Api>, upgrade: WebSocketUpgrade, reached: Option<SocketAddr>) -> Response {
    upgrade
        .max_message_size(FRAME_SIZE_BYTES_MAX)
        .max_frame_size(FRAME_SIZE_BYTES_MAX)
        .on_upgrade(move |socket| connection(api, socket, reached))
}

async fn connection(api: Arc<Api>, socket: WebSocket, reached: Option<SocketAddr>) {
    let (mut sink, mut stream) = socket.split();
    let (replies, mut queued) = mpsc::channel::<Message>(REPLIES_QUEUED_MAX);
    let writer = tokio::spawn(async move {
        while let Some(message) = queued.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    let session = Arc::new(Session::new(reached));
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    // Requests in flight belong to the connection: they end with it (a long-poll must not
    // keep a closed connection's socket open), and with the server.
    let mut requests = tokio::task::JoinSet::new();
    while let Some(Ok(message)) = stream.next().await {
        while requests.try_join_next().is_some() {}
        let text = match message {
            Message::Text(text) => text,
            Message::Binary(_) => {
                // Juju's API is text frames only: close rather than guess.
                let _ = replies
                    .send(Message::Close(Some(axum::extract::ws::CloseFrame {
                        code: 1003,
                        reason: "binary frames are not part of the API".into(),
                    })))
                    .await;
                break;
            }
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let (api, session, replies) = (Arc::clone(&api), Arc::clone(&session), replies.clone());
        requests.spawn(async move {
            let reply = route::answer(&api, &session, text.as_str()).await;
            let _ = replies.send(Message::Text(reply.into())).await;
            drop(permit);
        });
    }
    requests.shutdown().await;
    // The writer ends once every sender is gone, after flushing what was queued (a close
    // frame included).
    drop(replies);
    let _ = writer.await;
}
