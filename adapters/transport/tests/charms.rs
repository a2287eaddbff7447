//! Local charms: `POST /model/<uuid>/charms` as python-libjuju and python-jujuclient send it
//! (a zip, HTTP Basic authentication as a user), its refusals, and `Charms.ResolveCharms`,
//! refused per charm because lockstep has no charm store. Over the transport's in-memory
//! state.

mod support;

use std::io::{Cursor, Write};

use base64::Engine;
use lockstep_core::Phase;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn archive(files: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, text) in files {
        writer
            .start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        writer.write_all(text.as_bytes()).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn web_charm() -> Vec<u8> {
    archive(&[
        (
            "metadata.yaml",
            "name: web\nsummary: a web server\nrequires:\n  db: pgsql\n",
        ),
        (
            "config.yaml",
            "options:\n  port:\n    type: int\n    default: 80\n",
        ),
        ("src/charm.py", "print('never run')\n"),
    ])
}

/// `POST path` over TLS with `headers` and `body`: status, headers and JSON body.
async fn post(
    fixture: &Fixture,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String, Value) {
    let mut stream = tls(fixture, &[&rustls::version::TLS12]).await;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    // tokio-rustls's write can return before the last records reach the socket: without
    // the flush, the tail of a large body stays in the client's buffer while it waits for
    // the reply, and the server waits for the tail (a hang seen in CI).
    stream.flush().await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8(response[..split].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    let body = serde_json::from_slice(&response[split + 4..]).unwrap_or(Value::Null);
    (status, head, body)
}

fn basic(tag: &str, password: &str) -> (&'static str, String) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{tag}:{password}"));
    ("Authorization", format!("Basic {encoded}"))
}

fn zip_type() -> (&'static str, String) {
    ("Content-Type", "application/zip".to_owned())
}

#[tokio::test]
async fn an_upload_is_recorded_under_its_local_url_once() {
    let fixture = start(Phase::Ready).await;
    let path = format!("/model/{MODEL_UUID}/charms?series=jammy");
    let headers = [basic("user-admin", PASSWORD), zip_type()];
    let (status, head, body) = post(&fixture, &path, &headers, &web_charm()).await;
    assert_eq!(status, 200, "{head}\n{body}");
    assert_eq!(body, json!({"charm-url": "local:jammy/web-0"}));
    assert!(
        head.to_ascii_lowercase()
            .contains("juju-curl: local:jammy/web-0"),
        "{head}"
    );
    // The same archive again is the same charm; libjuju's `series=None` names no series.
    let (_, _, again) = post(&fixture, &path, &headers, &web_charm()).await;
    assert_eq!(again, body);
    let other = archive(&[("metadata.yaml", "name: web\nsummary: changed\n")]);
    let unnamed = format!("/model/{MODEL_UUID}/charms?series=None");
    let (status, _, body) = post(&fixture, &unnamed, &headers, &other).await;
    assert_eq!((status, body), (200, json!({"charm-url": "local:web-1"})));
}

/// Headers, path, body, and the status and message expected.
type Refusal = (
    Vec<(&'static str, String)>,
    String,
    Vec<u8>,
    u16,
    &'static str,
);

#[tokio::test]
async fn uploads_are_refused_as_juju_refuses_them() {
    let fixture = start(Phase::Ready).await;
    let path = format!("/model/{MODEL_UUID}/charms");
    let cases: Vec<Refusal> = vec![
        (
            vec![zip_type()],
            path.clone(),
            web_charm(),
            401,
            "no credentials provided",
        ),
        (
            vec![basic("user-admin", "wrong"), zip_type()],
            path.clone(),
            web_charm(),
            401,
            "invalid entity name or password",
        ),
        (
            vec![basic("machine-0", AGENT_PASSWORD), zip_type()],
            path.clone(),
            web_charm(),
            401,
            "invalid entity name or password",
        ),
        (
            vec![
                basic("user-admin", PASSWORD),
                ("Content-Type", "text/plain".into()),
            ],
            path.clone(),
            web_charm(),
            400,
            "expected Content-Type: application/zip, got: text/plain",
        ),
        (
            vec![basic("user-admin", PASSWORD), zip_type()],
            path.clone(),
            b"not a zip".to_vec(),
            400,
            "not a zip archive",
        ),
        (
            vec![basic("user-admin", PASSWORD), zip_type()],
            "/model/other/charms".into(),
            web_charm(),
            404,
            "unknown model \"other\"",
        ),
        (
            vec![basic("user-admin", PASSWORD), zip_type()],
            format!("{path}?schema=ch"),
            web_charm(),
            400,
            "unsupported schema",
        ),
    ];
    for (headers, path, body, expected_status, expected) in cases {
        let (status, _, reply) = post(&fixture, &path, &headers, &body).await;
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, expected_status, "{expected}: {reply}");
        assert!(message.contains(expected), "{expected}: {reply}");
    }
    // Over the size limit: refused before the archive is read.
    let huge = vec![0u8; lockstep_transport::charm::ARCHIVE_SIZE_BYTES_MAX + 1];
    let headers = [basic("user-admin", PASSWORD), zip_type()];
    let (status, _, _) = post(&fixture, &path, &headers, &huge).await;
    assert_eq!(status, 413);
    // While the controller is limited: Juju's code, with the gate's detail.
    fixture.gate.send(view(Phase::RunningSteps)).unwrap();
    let (status, _, reply) = post(&fixture, &path, &headers, &web_charm()).await;
    assert_eq!(status, 503);
    assert_eq!(reply["error"]["code"], "upgrade in progress", "{reply}");
}

#[tokio::test]
async fn charm_store_references_are_refused_per_charm() {
    let fixture = start(Phase::Ready).await;
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    let origin = json!({"source": "charm-hub", "architecture": "amd64", "risk": "stable"});
    let reply = call(
        &mut socket,
        2,
        "Charms",
        6,
        "ResolveCharms",
        json!({"macaroon": null, "resolve": [
            {"reference": "ch:ubuntu", "charm-origin": origin},
            {"reference": "cs:ubuntu", "charm-origin": origin},
        ]}),
    )
    .await;
    assert_eq!(
        reply["response"],
        json!({"Results": [
            {"error": {"message": "cannot resolve charm \"ch:ubuntu\": this controller has no charm store (lockstep deploys local charms: deploy a charm directory)", "code": "not supported"}},
            {"error": {"message": "unknown schema for charm URL \"cs:ubuntu\""}},
        ]})
    );
}
