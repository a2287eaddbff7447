//! The API server over real TLS websockets on 127.0.0.1, with the gate driven by the test.

mod support;

use support::*;

use std::sync::atomic::Ordering;

use futures_util::{SinkExt, StreamExt};
use lockstep_core::Phase;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn the_gate_is_asked_on_every_call_and_a_limited_connection_becomes_full() {
    let fixture = start(Phase::RunningSteps).await;
    let mut socket = connect(&fixture, "/model/deadbeef-0000-4000-8000-000000000001/api").await;

    // Before login: python-jujuclient's RedirectInfo, and nothing else.
    let reply = call(&mut socket, 1, "Admin", 3, "RedirectInfo", json!({})).await;
    assert_eq!(
        reply,
        json!({"request-id": 1, "error": "not redirected", "response": {}})
    );
    let reply = call(&mut socket, 2, "Client", 8, "FullStatus", json!({})).await;
    assert_eq!(reply["error-code"], "not implemented", "{reply}");
    assert_eq!(reply["error"], "unknown object type \"Client\"");

    let reply = call(
        &mut socket,
        3,
        "Admin",
        3,
        "Login",
        json!({"auth-tag": "user-admin", "credentials": "wrong"}),
    )
    .await;
    assert_eq!(reply["error-code"], "unauthorized access", "{reply}");
    let reply = login(&mut socket).await;
    assert_eq!(reply["response"]["server-version"], "3.6.1", "{reply}");
    assert_eq!(
        reply["response"]["model-tag"],
        "model-deadbeef-0000-4000-8000-000000000001"
    );
    let facades = reply["response"]["facades"].as_array().unwrap();
    assert!(facades.contains(&json!({"name": "Client", "versions": [1, 8]})));
    assert!(facades.contains(&json!({"name": "Pinger", "versions": [1]})));

    // Limited: the allow-list (Juju's calls during upgrades and every read) is served; a
    // call that changes the model is turned away, retryably.
    assert_eq!(
        call(&mut socket, 4, "Pinger", 1, "Ping", Value::Null).await["response"],
        json!({})
    );
    let status = call(
        &mut socket,
        5,
        "Client",
        8,
        "FullStatus",
        json!({"patterns": []}),
    )
    .await;
    assert_eq!(
        status["response"]["model"]["lockstep"]["phase"],
        "running-steps"
    );
    let read = call(&mut socket, 14, "ModelConfig", 3, "ModelGet", json!({})).await;
    assert_eq!(
        read["response"]["config"]["agent-version"]["value"], "2.9.43",
        "{read}"
    );
    let set = json!({"config": {"logging-config": "<root>=DEBUG"}});
    let refused = call(&mut socket, 6, "ModelConfig", 3, "ModelSet", set.clone()).await;
    assert_eq!(
        refused,
        json!({"request-id": 6, "error": "upgrade in progress", "error-code": "upgrade in progress",
               "error-info": {"phase": "running-steps", "step": 1, "steps": 3, "target-version": "2.9.44",
                              "retry-after-ms": 1000},
               "response": {}})
    );
    let upgrade = call(&mut socket, 7, "Upgrade", 1, "Status", json!({})).await;
    assert_eq!(upgrade["response"]["upgrade-available"], "2.9.44");
    assert_eq!(
        call(
            &mut socket,
            8,
            "Client",
            1,
            "AbortCurrentUpgrade",
            json!({})
        )
        .await["response"],
        json!({})
    );
    assert_eq!(fixture.backend.aborts.load(Ordering::SeqCst), 1);

    // Ready: the same connection is now full, without logging in again.
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let written = call(&mut socket, 9, "ModelConfig", 3, "ModelSet", set).await;
    assert_eq!(written.get("error"), None, "{written}");
    let config = call(&mut socket, 15, "ModelConfig", 3, "ModelGet", json!({})).await;
    assert_eq!(
        config["response"]["config"]["logging-config"]["value"], "<root>=DEBUG",
        "{config}"
    );

    // Unknown facade, version or method: `not implemented`, never retried; an unknown
    // facade at a version is named as Juju names it.
    let reply = call(&mut socket, 10, "Bundle", 1, "GetChanges", json!({})).await;
    assert_eq!(
        (reply["error-code"].as_str(), reply["error"].as_str()),
        (
            Some("not implemented"),
            Some("unknown version (1) of interface \"Bundle\"")
        )
    );
    let reply = call(&mut socket, 13, "Bundle", 0, "GetChanges", json!({})).await;
    assert_eq!(reply["error"], "unknown object type \"Bundle\"", "{reply}");
    let reply = call(&mut socket, 11, "Client", 2, "FullStatus", json!({})).await;
    assert_eq!(
        reply["error"],
        "unknown version (2) of interface \"Client\""
    );
    let reply = call(&mut socket, 12, "Pinger", 1, "Pong", json!({})).await;
    assert_eq!(
        reply["error"],
        "no such request - method Pinger(1).Pong is not implemented"
    );
}

#[tokio::test]
async fn legacy_framing_is_answered_in_kind_and_bad_frames_do_not_end_the_connection() {
    let fixture = start(Phase::Ready).await;
    let mut socket = connect(&fixture, "/").await;
    send(&mut socket, json!({"RequestId": 5, "Type": "Admin", "Version": 3, "Request": "RedirectInfo", "Params": {}})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"RequestId": 5, "Error": "not redirected", "Response": {}})
    );

    socket
        .send(Message::Text("{not json".into()))
        .await
        .unwrap();
    let reply = receive(&mut socket).await;
    assert_eq!(reply["error-code"], "bad request", "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("malformed JSON"));
    send(
        &mut socket,
        json!({"request-id": 6, "type": "Pinger", "version": 1}),
    )
    .await;
    let reply = receive(&mut socket).await;
    assert_eq!(
        (reply["request-id"].as_u64(), reply["error"].as_str()),
        (Some(6), Some("request must be a string, got nothing"))
    );

    // The connection still serves, and libjuju's "Id" and a null params are accepted.
    login(&mut socket).await;
    send(&mut socket, json!({"request-id": 7, "type": "Pinger", "version": 1, "Id": "", "request": "Ping", "params": null})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"request-id": 7, "response": {}})
    );
}

#[tokio::test]
async fn requests_on_one_connection_are_served_concurrently_and_ids_are_echoed_not_checked() {
    let fixture = start(Phase::Ready).await;
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    // A failed login waits LOGIN_FAILURE_DELAY; a ping sent after it must not wait behind it.
    send(
        &mut socket,
        json!({"request-id": 20, "type": "Admin", "version": 3, "request": "Login",
                             "params": {"auth-tag": "user-nobody", "credentials": "x"}}),
    )
    .await;
    send(
        &mut socket,
        json!({"request-id": 21, "type": "Pinger", "version": 1, "request": "Ping"}),
    )
    .await;
    send(
        &mut socket,
        json!({"request-id": 21, "type": "Pinger", "version": 1, "request": "Ping"}),
    )
    .await;
    let order: Vec<u64> = vec![
        receive(&mut socket).await["request-id"].as_u64().unwrap(),
        receive(&mut socket).await["request-id"].as_u64().unwrap(),
        receive(&mut socket).await["request-id"].as_u64().unwrap(),
    ];
    assert_eq!(
        order,
        [21, 21, 20],
        "the pings overtook the slow failed login; a repeated id is answered twice"
    );
}

#[tokio::test]
async fn tls_1_2_clients_are_served() {
    let fixture = start(Phase::Ready).await;
    let stream = tls(&fixture, &[&rustls::version::TLS12]).await;
    assert_eq!(
        stream.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    let url = format!("wss://localhost:{}/api", fixture.port);
    let mut socket = tokio_tungstenite::client_async(url, stream)
        .await
        .unwrap()
        .0;
    assert_eq!(
        login(&mut socket).await["response"]["server-version"],
        "3.6.1"
    );
}

async fn http_get(fixture: &Fixture, path: &str) -> (u16, String) {
    let mut stream = tls(fixture, &[&rustls::version::TLS13]).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    let status = response[9..12].parse().unwrap();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

#[tokio::test]
async fn probes_answer_in_every_phase_and_readyz_only_when_ready() {
    let fixture = start(Phase::CheckingAgentVersion).await;
    assert_eq!(http_get(&fixture, "/livez").await.0, 200);
    let (status, body) = http_get(&fixture, "/readyz").await;
    assert_eq!(status, 503);
    assert!(
        body.contains("\"phase\":\"checking-agent-version\""),
        "{body}"
    );
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let (status, body) = http_get(&fixture, "/readyz").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"phase\":\"ready\""), "{body}");
}

#[tokio::test]
async fn a_binary_frame_closes_that_connection_and_dropped_connections_hurt_no_one() {
    let fixture = start(Phase::Ready).await;
    let mut bad = connect(&fixture, "/api").await;
    bad.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    match bad.next().await {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(u16::from(frame.code), 1003),
        other => panic!("expected a close frame, got {other:?}"),
    }
    // Connections opened and dropped at every stage: before TLS, after TLS, after the
    // websocket handshake.
    for round in 0..300 {
        match round % 3 {
            0 => drop(
                TcpStream::connect(("127.0.0.1", fixture.port))
                    .await
                    .unwrap(),
            ),
            1 => drop(tls(&fixture, &[&rustls::version::TLS13]).await),
            _ => drop(connect(&fixture, "/api").await),
        }
    }
    let mut good = connect(&fixture, "/api").await;
    assert_eq!(
        login(&mut good).await["response"]["server-version"],
        "3.6.1"
    );
}

#[tokio::test]
async fn watch_progress_answers_at_once_then_only_when_the_phase_changes() {
    let fixture = start(Phase::RunningSteps).await;
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    let first = call(&mut socket, 2, "Upgrade", 1, "WatchProgress", json!({})).await;
    assert_eq!(
        first["response"],
        json!({"phase": "running-steps", "step": 1, "steps": 3, "target-version": "2.9.44", "ready": false})
    );
    send(
        &mut socket,
        json!({"request-id": 3, "type": "Upgrade", "version": 1, "request": "WatchProgress",
                             "params": {"phase": "running-steps", "step": 1}}),
    )
    .await;
    // Nothing changed, so nothing is answered (a reply now would be a busy poll).
    let early =
        tokio::time::timeout(std::time::Duration::from_millis(300), receive(&mut socket)).await;
    assert!(early.is_err(), "answered before any change: {early:?}");
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let reply = receive(&mut socket).await;
    assert_eq!(reply["request-id"], 3);
    assert_eq!(reply["response"]["phase"], "ready");
    assert_eq!(reply["response"]["ready"], true);
}

#[tokio::test]
async fn metrics_count_gate_rejections_by_facade_and_show_the_phase() {
    let fixture = start(Phase::Upgrading).await;
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    for id in 2..5 {
        let set = json!({"config": {"logging-config": "<root>=DEBUG"}});
        let reply = call(&mut socket, id, "ModelConfig", 3, "ModelSet", set).await;
        assert_eq!(reply["error-code"], "upgrade in progress");
    }
    call(&mut socket, 5, "Pinger", 1, "Ping", json!({})).await;
    let (status, body) = http_get(&fixture, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "lockstep_phase{phase=\"upgrading\"} 1",
        "lockstep_phase{phase=\"ready\"} 0",
        "lockstep_gate_rejections_total{facade=\"ModelConfig\"} 3",
        "lockstep_api_calls_total{facade=\"Pinger\"} 1",
        "lockstep_api_calls_total{facade=\"Admin\"} 1",
    ] {
        assert!(
            body.lines().any(|candidate| candidate == line),
            "{line} missing from\n{body}"
        );
    }
    assert!(
        !body.contains("lockstep_gate_rejections_total{facade=\"Pinger\"}"),
        "{body}"
    );
}
