//! The API's limits, one at a time, against a server in process with small limits: what a
//! client over each gets (the HTTP 503 naming the flag, Juju's `try again` with its wait, a
//! closed connection) and that the clients within them are unaffected. The same loads at
//! scale against a real `lockstepd` are the agent's `tests/hostile.rs`.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt;
use lockstep_core::Phase;
use lockstep_transport::limits::{ApiLimits, Refusal};
use lockstep_transport::tls::Credentials;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// How long a test waits for something the server does within a second or two.
const BOUND: Duration = Duration::from_secs(10);

async fn start_limited(limits: ApiLimits) -> Fixture {
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    start_configured(Phase::Ready, fresh_state(), 0, credentials, |config| {
        config.limits = limits;
    })
    .await
}

/// A TCP connection to the server from `127.0.0.<last>`.
async fn tcp_from(fixture: &Fixture, last: u8) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))
        .unwrap();
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], fixture.port)))
        .await
        .unwrap()
}

/// The websocket handshake from `127.0.0.<last>`: the socket, or the HTTP status and body
/// that refused it.
async fn websocket_from(fixture: &Fixture, last: u8) -> Result<Socket, (u16, String)> {
    let connector = tokio_rustls::TlsConnector::from(
        lockstep_transport::tls::client_config(&fixture.ca_pem, &[&rustls::version::TLS13])
            .unwrap(),
    );
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector
        .connect(name, tcp_from(fixture, last).await)
        .await
        .unwrap();
    let url = format!("wss://localhost:{}/api", fixture.port);
    match tokio_tungstenite::client_async(url, stream).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(other) => panic!("neither a websocket nor an HTTP refusal: {other}"),
    }
}

async fn login_as(socket: &mut Socket, id: u64, password: &str) -> Value {
    call(
        socket,
        id,
        "Admin",
        3,
        "Login",
        json!({"auth-tag": "user-admin", "credentials": password}),
    )
    .await
}

fn refusals(fixture: &Fixture, refusal: Refusal) -> u64 {
    fixture.api.connection_counts().refusals[refusal.index()]
}

/// Whether the server ended `socket`'s connection within [`BOUND`].
async fn ended(socket: &mut Socket) -> bool {
    tokio::time::timeout(BOUND, async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_cap_a_client_gets_a_503_naming_the_flag_and_a_logged_in_one_is_served()
{
    let fixture = start_limited(ApiLimits {
        connections_max: 2,
        ..ApiLimits::default()
    })
    .await;
    let mut admin = websocket_from(&fixture, 1).await.expect("under the cap");
    assert!(
        login_as(&mut admin, 1, PASSWORD)
            .await
            .get("error")
            .is_none()
    );
    let _idle = tcp_from(&fixture, 2).await;
    // The idle one is admitted when the server accepts it: wait until it holds its slot.
    tokio::time::timeout(BOUND, async {
        while fixture.api.connection_counts().pending < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the idle connection admitted");

    let (status, body) = websocket_from(&fixture, 3).await.expect_err("over the cap");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("2 connections") && body.contains("--max-connections"),
        "{body}"
    );
    assert_eq!(refusals(&fixture, Refusal::MaxConnections), 1);
    let reply = call(&mut admin, 2, "Client", 8, "FullStatus", json!({})).await;
    assert_eq!(reply["response"]["model"]["name"], "controller", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_strangers_slots_are_full_a_newcomer_takes_the_flooding_source_s_oldest() {
    let fixture = start_limited(ApiLimits {
        pending_connections_max: 4,
        pending_connections_per_source_max: 4,
        ..ApiLimits::default()
    })
    .await;
    let mut flood = Vec::new();
    for _ in 0..4 {
        flood.push(tcp_from(&fixture, 2).await);
    }
    tokio::time::timeout(BOUND, async {
        while fixture.api.connection_counts().pending < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the flood admitted");
    let mut admin = websocket_from(&fixture, 1)
        .await
        .expect("takes a flood's slot");
    assert!(
        login_as(&mut admin, 1, PASSWORD)
            .await
            .get("error")
            .is_none()
    );
    assert_eq!(refusals(&fixture, Refusal::Evicted), 1);
    // The oldest of the flood was the one closed: it reads the end of its connection.
    let mut byte = [0_u8; 1];
    let read = tokio::time::timeout(BOUND, flood[0].read(&mut byte))
        .await
        .expect("closed within the bound");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_does_not_log_in_in_time_is_closed_and_one_that_did_is_kept() {
    let fixture = start_limited(ApiLimits {
        login_timeout: Duration::from_secs(1),
        ..ApiLimits::default()
    })
    .await;
    let mut admin = websocket_from(&fixture, 1).await.unwrap();
    assert!(
        login_as(&mut admin, 1, PASSWORD)
            .await
            .get("error")
            .is_none()
    );
    let mut stranger = websocket_from(&fixture, 2).await.unwrap();
    assert!(ended(&mut stranger).await, "the stranger was not closed");
    assert_eq!(refusals(&fixture, Refusal::LoginTimeout), 1);
    // Past the deadline, the logged-in connection is served.
    let reply = call(&mut admin, 2, "Client", 8, "FullStatus", json!({})).await;
    assert_eq!(reply["response"]["model"]["name"], "controller", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_sending_more_than_its_pre_login_bytes_is_closed() {
    let fixture = start_limited(ApiLimits {
        pre_login_bytes_max: 8 << 10,
        ..ApiLimits::default()
    })
    .await;
    let mut stranger = websocket_from(&fixture, 2).await.unwrap();
    let big = json!({"request-id": 1, "type": "Pinger", "version": 1, "request": "Ping",
                     "params": {"padding": "x".repeat(16 << 10)}});
    // The send may already fail: the server stops reading mid-frame.
    let _ = futures_util::SinkExt::send(&mut stranger, Message::Text(big.to_string().into())).await;
    assert!(ended(&mut stranger).await, "the stranger was not closed");
    assert_eq!(refusals(&fixture, Refusal::PreLoginBytes), 1);
    // A logged-in client may send that frame.
    let mut admin = websocket_from(&fixture, 1).await.unwrap();
    assert!(
        login_as(&mut admin, 1, PASSWORD)
            .await
            .get("error")
            .is_none()
    );
    send(&mut admin, big).await;
    let reply = receive(&mut admin).await;
    assert_eq!(reply["request-id"], 1, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_past_its_failures_is_told_to_try_again_and_another_source_logs_in() {
    let fixture = start_limited(ApiLimits {
        login_failures_before_throttle: 2,
        ..ApiLimits::default()
    })
    .await;
    let mut guesser = websocket_from(&fixture, 2).await.unwrap();
    for id in 1..=2 {
        let reply = login_as(&mut guesser, id, "wrong").await;
        assert_eq!(reply["error-code"], "unauthorized access", "{reply}");
    }
    // Throttled now, even with the right password: no check is made.
    let reply = login_as(&mut guesser, 3, PASSWORD).await;
    assert_eq!(reply["error-code"], "try again", "{reply}");
    assert_eq!(
        reply["error"], "too many failed logins from 127.0.0.2: retry after 1s",
        "{reply}"
    );
    let wait = reply["error-info"]["retry-after-ms"].as_u64().unwrap();
    assert!(wait > 0 && wait <= 1000, "{reply}");
    // The user is under attack, but a source that never failed is checked.
    let mut admin = websocket_from(&fixture, 1).await.unwrap();
    assert!(
        login_as(&mut admin, 1, PASSWORD)
            .await
            .get("error")
            .is_none()
    );
    assert_eq!(refusals(&fixture, Refusal::LoginThrottled), 1);
    // After the wait, the guesser is checked again; another failure doubles it.
    tokio::time::sleep(Duration::from_millis(wait + 50)).await;
    let reply = login_as(&mut guesser, 4, "wrong").await;
    assert_eq!(reply["error-code"], "unauthorized access", "{reply}");
    let reply = login_as(&mut guesser, 5, "wrong").await;
    assert_eq!(
        reply["error"],
        "too many failed logins from 127.0.0.2: retry after 2s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_charm_upload_gets_429_with_retry_after() {
    let fixture = start_limited(ApiLimits {
        login_failures_before_throttle: 1,
        ..ApiLimits::default()
    })
    .await;
    let upload = |password: &'static str| {
        let fixture = &fixture;
        async move {
            use base64::Engine;
            let credentials =
                base64::engine::general_purpose::STANDARD.encode(format!("user-admin:{password}"));
            let request = format!(
                "POST /model/{MODEL_UUID}/charms?series=jammy HTTP/1.1\r\nHost: localhost\r\n\
                 Authorization: Basic {credentials}\r\nContent-Type: application/zip\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let mut stream = tls(fixture, &[&rustls::version::TLS13]).await;
            stream.write_all(request.as_bytes()).await.unwrap();
            stream.flush().await.unwrap();
            let mut response = Vec::new();
            let _ = stream.read_to_end(&mut response).await;
            String::from_utf8_lossy(&response).into_owned()
        }
    };
    let first = upload("wrong").await;
    assert!(first.starts_with("HTTP/1.1 401"), "{first}");
    let second = upload("wrong").await;
    assert!(second.starts_with("HTTP/1.1 429"), "{second}");
    assert!(
        second.to_ascii_lowercase().contains("retry-after: 1"),
        "{second}"
    );
    assert!(second.contains("\"code\":\"try again\""), "{second}");
}
