//! Agent binaries on the API: `Client.FindTools` over the backend's catalogue (in every
//! phase), and the tools endpoint, which fetches each binary once however many agents ask
//! at the same moment. (`ModelConfig.ModelSet` over the real store is tested in the agent's
//! `tests/api_tools.rs`.)

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_core::policy::Stream;
use lockstep_core::{Phase, Role, Roles, Version};
use lockstep_transport::state::SharedState;
use lockstep_transport::tls::Credentials;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn logged_in(fixture: &Fixture) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    login(&mut socket).await;
    socket
}

fn tools_url(fixture: &Fixture, binary: &str) -> String {
    format!(
        "https://127.0.0.1:{}/model/{MODEL_UUID}/tools/{binary}",
        fixture.port
    )
}

/// `GET path` over TLS: status, content type and body.
/// `GET path` logged in as the admin.
async fn get(fixture: &Fixture, path: &str) -> (u16, String, Vec<u8>) {
    get_as(fixture, path, Some(("user-admin", PASSWORD))).await
}

/// `GET path` with HTTP Basic credentials `(tag, password)`, or none.
async fn get_as(
    fixture: &Fixture,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> (u16, String, Vec<u8>) {
    use base64::Engine;
    let mut stream = tls(fixture, &[&rustls::version::TLS13]).await;
    let authorization = credentials.map_or_else(String::new, |(tag, password)| {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{tag}:{password}"));
        format!("Authorization: Basic {encoded}\r\n")
    });
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8(response[..split].to_vec()).unwrap();
    let body = response[split + 4..].to_vec();
    let status = head[9..12].parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, body)
}

fn json_body(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|error| panic!("{error}: {:?}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn find_tools_lists_the_catalogue_in_every_phase_with_urls_on_the_tools_endpoint() {
    let fixture = start(Phase::RunningSteps).await;
    let mut socket = logged_in(&fixture).await;
    let all = call(&mut socket, 2, "Client", 1, "FindTools", json!({})).await;
    let versions: Vec<&str> = all["response"]["list"]
        .as_array()
        .unwrap_or_else(|| panic!("{all}"))
        .iter()
        .map(|tools| tools["version"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        [
            "2.9.43-ubuntu-amd64",
            "2.9.44-ubuntu-amd64",
            "2.9.44-ubuntu-arm64"
        ],
        "released only (the model has no agent-stream): {all}"
    );

    let exact = call(
        &mut socket,
        3,
        "Client",
        8,
        "FindTools",
        json!({"number": "2.9.44", "major": 0, "minor": 0, "arch": "amd64", "os-type": "ubuntu", "agentstream": ""}),
    )
    .await;
    let entry = entry("2.9.44-ubuntu-amd64", Stream::Released);
    assert_eq!(
        exact["response"],
        json!({"list": [{
            "version": "2.9.44-ubuntu-amd64",
            "url": tools_url(&fixture, "2.9.44-ubuntu-amd64"),
            "size": entry.size_bytes,
            "sha256": entry.sha256.to_string(),
        }]}),
        "{exact}"
    );

    let proposed = call(
        &mut socket,
        4,
        "Client",
        8,
        "FindTools",
        json!({"major": 2, "minor": 9, "agentstream": "proposed", "arch": "amd64"}),
    )
    .await;
    let versions: Vec<&str> = proposed["response"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tools| tools["version"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        [
            "2.9.43-ubuntu-amd64",
            "2.9.44-ubuntu-amd64",
            "2.9.45-ubuntu-amd64"
        ]
    );

    // Nothing found, and an unreadable catalogue: Juju's result error, not a call error.
    let none = call(
        &mut socket,
        5,
        "Client",
        8,
        "FindTools",
        json!({"number": "9.9.9"}),
    )
    .await;
    assert_eq!(
        none["response"],
        json!({"list": [], "error": {"message": "no matching agent binaries available", "code": "not found"}})
    );
    *fixture.backend.catalogue.lock().unwrap() = Err("the mirror answered 500".into());
    let broken = call(&mut socket, 6, "Client", 8, "FindTools", json!({})).await;
    assert_eq!(
        broken["response"]["error"]["message"],
        "cannot read the agent-binary catalogue: the mirror answered 500"
    );
    let bad = call(
        &mut socket,
        7,
        "Client",
        8,
        "FindTools",
        json!({"agentstream": "nightly"}),
    )
    .await;
    assert_eq!(bad["error-code"], "bad request", "{bad}");
}

#[tokio::test]
async fn the_tools_endpoint_fetches_a_binary_once_for_fifty_agents_asking_at_once() {
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let fixture = start_configured(Phase::Upgrading, fresh_state(), 0, credentials, |config| {
        // The fifty agents all come from 127.0.0.1 here, each on a connection of its own
        // logging in at once: more than one source's default share of connections not
        // logged in yet, and of password checks waiting.
        config.limits.pending_connections_per_source_max = 64;
        config.limits.queued_logins_per_source_max = 64;
    })
    .await;
    // The fetch waits until all fifty asked the catalogue (which each does just before it
    // joins or starts the fetch), then takes 300 ms more.
    fixture
        .backend
        .fetch_after_catalogue_calls
        .store(50, Ordering::SeqCst);
    *fixture.backend.fetch_delay.lock().unwrap() = Duration::from_millis(300);
    let binary = "2.9.44-ubuntu-amd64";
    let expected = tarball(&entry(binary, Stream::Released));
    let path = format!("/model/{MODEL_UUID}/tools/{binary}");
    let fixture = Arc::new(fixture);
    let started = Instant::now();
    let downloads: Vec<_> = (0..50)
        .map(|_| {
            let (fixture, path) = (Arc::clone(&fixture), path.clone());
            tokio::spawn(async move { get(&fixture, &path).await })
        })
        .collect();
    for download in downloads {
        let (status, content_type, body) = download.await.unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(content_type, "application/x-tar-gz");
        assert!(body == expected, "the body is not the tarball");
    }
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 1);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Later requests are served from the cache.
    let (status, _, body) = get(&fixture, &path).await;
    assert_eq!((status, body == expected), (200, true));
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 1);

    // Another binary is fetched on its own.
    let arm = "2.9.44-ubuntu-arm64";
    let (status, _, body) = get(&fixture, &format!("/model/{MODEL_UUID}/tools/{arm}")).await;
    assert_eq!(status, 200);
    assert!(body == tarball(&entry(arm, Stream::Released)));
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failed_fetch_is_reported_to_every_waiter_and_tried_again_by_the_next_request() {
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let fixture = start_configured(Phase::Ready, fresh_state(), 0, credentials, |config| {
        // Twenty agents from 127.0.0.1, logging in at once: more password checks waiting
        // than one source's default share.
        config.limits.queued_logins_per_source_max = 32;
    })
    .await;
    let fixture = Arc::new(fixture);
    fixture
        .backend
        .fetch_after_catalogue_calls
        .store(20, Ordering::SeqCst);
    *fixture.backend.fetch_delay.lock().unwrap() = Duration::from_millis(300);
    fixture.backend.fetch_failures.store(1, Ordering::SeqCst);
    let path = format!("/model/{MODEL_UUID}/tools/2.9.43-ubuntu-amd64");
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (fixture, path) = (Arc::clone(&fixture), path.clone());
            tokio::spawn(async move { get(&fixture, &path).await })
        })
        .collect();
    for waiter in waiters {
        let (status, content_type, body) = waiter.await.unwrap();
        assert_eq!(status, 502);
        assert_eq!(content_type, "application/json");
        assert_eq!(
            json_body(&body),
            json!({"error": {"message": "cannot fetch agent binary 2.9.43-ubuntu-amd64: the mirror is down for 2.9.43-ubuntu-amd64"}})
        );
    }
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 1);
    // Nothing half-fetched is left to be served.
    let cache = std::fs::read_dir(fixture.tools_cache.as_ref().unwrap())
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert_eq!(cache, 0);

    let (status, _, body) = get(&fixture, &path).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body == tarball(&entry("2.9.43-ubuntu-amd64", Stream::Released)));
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_tools_endpoint_answers_json_errors_for_what_it_cannot_serve() {
    let fixture = start(Phase::Ready).await;
    let cases = [
        (
            format!("/model/{MODEL_UUID}/tools/9.9.9-ubuntu-amd64"),
            404,
            json!({"error": {"message": "no agent binaries found for 9.9.9-ubuntu-amd64", "code": "not found"}}),
        ),
        (
            format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-s390x"),
            404,
            json!({"error": {"message": "no agent binaries found for 2.9.44-ubuntu-s390x", "code": "not found"}}),
        ),
        (
            "/model/another-model/tools/2.9.44-ubuntu-amd64".to_owned(),
            404,
            json!({"error": {"message": "unknown model \"another-model\"", "code": "not found"}}),
        ),
    ];
    for (path, status, body) in cases {
        let (got, content_type, got_body) = get(&fixture, &path).await;
        assert_eq!(
            (got, content_type.as_str()),
            (status, "application/json"),
            "{path}"
        );
        assert_eq!(json_body(&got_body), body, "{path}");
    }
    let (status, _, body) = get(&fixture, &format!("/model/{MODEL_UUID}/tools/latest")).await;
    assert_eq!(status, 400);
    assert_eq!(json_body(&body)["error"]["code"], "bad request");
    *fixture.backend.catalogue.lock().unwrap() = Err("stale metadata".into());
    let (status, _, body) = get(
        &fixture,
        &format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64"),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        json_body(&body)["error"]["message"],
        "cannot read the agent-binary catalogue: stale metadata"
    );
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 0);

    // A controller without a tools cache serves none.
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let uncached = start_configured(Phase::Ready, fresh_state(), 0, credentials, |config| {
        config.tools_cache = None;
    })
    .await;
    let (status, _, body) = get(
        &uncached,
        &format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64"),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        json_body(&body),
        json!({"error": {"message": "this controller serves no agent binaries: it has no tools cache configured", "code": "not found"}})
    );
    assert_eq!(uncached.backend.fetches.load(Ordering::SeqCst), 0);
}

/// `ModelSet`'s own checks, made by the transport before and after asking the state: the
/// keys (lockstep's apart from stored ones), the version's form, the catalogue (the state's
/// refusals over the real store are tested in the agent's `tests/api_tools.rs`).
#[tokio::test]
async fn model_set_checks_its_keys_and_the_catalogue_then_tells_the_backend() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let set = |version: &str| json!({"config": {"agent-version": version}});
    let mixed = call(
        &mut socket,
        2,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"agent-version": "2.9.44", "logging-config": "<root>=DEBUG"}}),
    )
    .await;
    assert_eq!(mixed["error-code"], "bad request", "{mixed}");
    let stream = call(
        &mut socket,
        20,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"agent-stream": "proposed"}}),
    )
    .await;
    assert_eq!(stream["error-code"], "not supported", "{stream}");
    let name = call(
        &mut socket,
        21,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"name": "other"}}),
    )
    .await;
    assert_eq!(name["error-code"], "not supported", "{name}");
    let stored = call(
        &mut socket,
        22,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"logging-config": "<root>=DEBUG", "agent-stream": "released"}}),
    )
    .await;
    assert_eq!(stored["response"], json!({}), "{stored}");
    let malformed = call(&mut socket, 3, "ModelConfig", 3, "ModelSet", set("2.9")).await;
    assert_eq!(malformed["error-code"], "bad request", "{malformed}");
    let missing = call(&mut socket, 4, "ModelConfig", 3, "ModelSet", set("2.9.45")).await;
    assert_eq!(
        missing["error"], "no agent binaries found for version 2.9.45",
        "{missing}"
    );
    *fixture.backend.catalogue.lock().unwrap() = Err("no route to the mirror".into());
    let unreadable = call(&mut socket, 5, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert_eq!(
        unreadable["error"],
        "cannot check for agent binaries of version 2.9.44: cannot read the agent-binary \
         catalogue: no route to the mirror"
    );
    // The current version back asks no catalogue and changes nothing.
    let same = call(&mut socket, 6, "ModelConfig", 3, "ModelSet", set("2.9.43")).await;
    assert_eq!(same["response"], json!({}), "{same}");
    assert!(fixture.backend.versions_changed.lock().unwrap().is_empty());

    *fixture.backend.catalogue.lock().unwrap() = Ok(catalogue());
    let changed = call(&mut socket, 7, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert_eq!(changed, json!({"request-id": 7, "response": {}}));
    assert_eq!(
        *fixture.backend.versions_changed.lock().unwrap(),
        [lockstep_core::Version::new(2, 9, 44)]
    );
    let config = call(&mut socket, 8, "ModelConfig", 3, "ModelGet", json!({})).await;
    assert_eq!(
        config["response"]["config"],
        json!({"name": {"value": "controller", "source": "model"},
               "uuid": {"value": MODEL_UUID, "source": "model"},
               "type": {"value": "lockstep", "source": "model"},
               "agent-version": {"value": "2.9.44", "source": "model"},
               "agent-stream": {"value": "released", "source": "default"},
               "logging-config": {"value": "<root>=DEBUG", "source": "model"}})
    );
}

/// Juju's `Client.SetModelAgentVersion`: without `force` (Juju's `IgnoreAgentVersions`)
/// an agent on another version than the model's refuses the change in Juju's words and
/// nothing changes; with `force` it goes through as `ModelSet` would; its params are checked
/// naming the bad value, and `agent-stream` must be the model's; the gate refuses it while
/// the controller is limited.
#[tokio::test]
async fn set_model_agent_version_checks_the_agents_unless_forced() {
    let fixture = start(Phase::Ready).await;
    let machine = fixture.state.add_machine(Roles::of(&[Role::HostMachine]));
    let mut socket = logged_in(&fixture).await;
    let mut calls = 1..;
    let mut set = async |params: Value| {
        let id = calls.next().unwrap();
        call(&mut socket, id, "Client", 1, "SetModelAgentVersion", params).await
    };
    let behind = set(json!({"version": "2.9.44"})).await;
    assert_eq!(
        behind["error"],
        format!(
            "some agents have not upgraded to the current model version 2.9.43: machine-{machine}"
        ),
        "{behind}"
    );
    let also = set(json!({"version": "2.9.44", "force": false, "agent-stream": ""})).await;
    assert_eq!(also["error"], behind["error"], "{also}");
    assert!(fixture.backend.versions_changed.lock().unwrap().is_empty());
    for (params, expected) in [
        (
            json!({"version": 2}),
            "params.version must be a string, got 2",
        ),
        (
            json!({"version": "2.9.44", "force": "yes"}),
            "params.force must be a boolean, got \"yes\"",
        ),
        (
            json!({"version": "2.9.44", "agent-stream": 1}),
            "params.agent-stream must be a string, got 1",
        ),
    ] {
        let refused = set(params).await;
        assert_eq!(refused["error"], expected, "{refused}");
        assert_eq!(refused["error-code"], "bad request", "{refused}");
    }
    let stream = set(json!({"version": "2.9.44", "force": true, "agent-stream": "proposed"})).await;
    assert_eq!(stream["error-code"], "not supported", "{stream}");
    assert!(
        stream["error"]
            .as_str()
            .unwrap()
            .contains("\"proposed\" is not the model's (released)"),
        "{stream}"
    );
    let forced = set(json!({"version": "2.9.44", "force": true, "agent-stream": "released"})).await;
    assert_eq!(forced["response"], json!({}), "{forced}");
    assert_eq!(
        *fixture.backend.versions_changed.lock().unwrap(),
        [Version::new(2, 9, 44)]
    );
    assert_eq!(fixture.state.model().agent_version, Version::new(2, 9, 44));
    // A write: refused by the gate while the controller is limited, forced or not.
    fixture.gate.send(view(Phase::RunningSteps)).unwrap();
    let limited = set(json!({"version": "2.9.45", "force": true})).await;
    assert_eq!(limited["error-code"], "upgrade in progress", "{limited}");
    assert_eq!(fixture.state.model().agent_version, Version::new(2, 9, 44));
}

#[tokio::test]
async fn an_anonymous_or_wrong_download_is_refused_and_fetches_nothing() {
    let fixture = start(Phase::Ready).await;
    let path = format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64");
    for credentials in [
        None,
        Some(("machine-1", "wrong")),
        Some(("user-nobody", PASSWORD)),
    ] {
        let (status, _, body) = get_as(&fixture, &path, credentials).await;
        assert_eq!(
            status,
            401,
            "{credentials:?}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(json_body(&body)["error"]["code"], "unauthorized access");
    }
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 0);
    // A machine agent whose machine exists downloads with its own credentials.
    let tag = format!(
        "machine-{}",
        fixture.state.add_machine(Roles::of(&[Role::HostMachine]))
    );
    let (status, _, body) = get_as(&fixture, &path, Some((&tag, AGENT_PASSWORD))).await;
    assert_eq!(status, 200, "{tag}: {}", String::from_utf8_lossy(&body));
}

#[tokio::test]
async fn a_fetch_whose_requesters_all_left_finishes_and_frees_its_slot() {
    let fixture = Arc::new(start(Phase::Ready).await);
    *fixture.backend.fetch_delay.lock().unwrap() = Duration::from_millis(300);
    let binary = "2.9.44-ubuntu-amd64";
    let path = format!("/model/{MODEL_UUID}/tools/{binary}");
    let leaving = {
        let (fixture, path) = (Arc::clone(&fixture), path.clone());
        tokio::spawn(async move { get(&fixture, &path).await })
    };
    // The request is in: its fetch started. Then the requester leaves.
    tokio::time::timeout(Duration::from_secs(10), async {
        while fixture.backend.fetches.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the fetch started");
    leaving.abort();
    let _ = leaving.await;
    // The fetch goes on without anyone waiting, puts the binary in the cache and leaves
    // the map: the next request is served from the cache, with no second fetch.
    let cached = fixture
        .tools_cache
        .as_ref()
        .unwrap()
        .join(format!("juju-{binary}.tgz"));
    tokio::time::timeout(Duration::from_secs(10), async {
        while !cached.is_file() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the abandoned fetch finished");
    let (status, _, _) = get(&fixture, &path).await;
    assert_eq!(status, 200);
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn before_a_fetch_the_cache_drops_binaries_of_versions_not_kept() {
    let fixture = start(Phase::Ready).await;
    let cache = fixture.tools_cache.clone().unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    for name in [
        "2.9.42-ubuntu-amd64.tgz",
        "juju-2.9.42-ubuntu-arm64.tgz",
        "2.9.43-ubuntu-amd64.tgz",
        "juju-2.9.43-ubuntu-arm64.tgz",
        "notes.txt",
    ] {
        std::fs::write(cache.join(name), b"old").unwrap();
    }
    *fixture.backend.keep.lock().unwrap() = vec![Version::new(2, 9, 43)];
    let (status, _, _) = get(
        &fixture,
        &format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64"),
    )
    .await;
    assert_eq!(status, 200);
    let mut left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "2.9.43-ubuntu-amd64.tgz",
            "juju-2.9.43-ubuntu-arm64.tgz",
            "juju-2.9.44-ubuntu-amd64.tgz",
            "notes.txt"
        ]
    );
}

/// `lockstep_agent_downloads_{in_flight,waiting}` from `/metrics`.
async fn download_gauges(fixture: &Fixture) -> (u64, u64) {
    let (status, _, body) = get_as(fixture, "/metrics", None).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let gauge = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} not in:\n{text}"))
            .parse()
            .unwrap()
    };
    (
        gauge("lockstep_agent_downloads_in_flight"),
        gauge("lockstep_agent_downloads_waiting"),
    )
}

/// A Ready fixture whose model allows one agent download at a time, and whose upstream
/// fetch takes `fetch_delay`.
async fn one_download_at_a_time(fetch_delay: Duration) -> Arc<Fixture> {
    let fixture = Arc::new(start(Phase::Ready).await);
    fixture
        .state
        .model_set(&json!({"config": {"max-agent-downloads": 1}}))
        .await
        .unwrap();
    *fixture.backend.fetch_delay.lock().unwrap() = fetch_delay;
    fixture
}

/// Machine agents (by their tags) that may download: each a machine, with
/// [`AGENT_PASSWORD`] as its agent's password.
fn agents(fixture: &Fixture, count: usize) -> Vec<String> {
    let hash = lockstep_transport::server::hash_password(AGENT_PASSWORD);
    (0..count)
        .map(|_| {
            let id = fixture.state.add_machine(Roles::of(&[Role::HostMachine]));
            let tag = format!("machine-{id}");
            fixture.state.set_agent_password_hash(&tag, &hash);
            tag
        })
        .collect()
}

/// Under `max-agent-downloads` 1: the first agent holds the slot through a slow upstream
/// fetch; the next four wait in the queue (four per slot) and are served one at a time in
/// the order they came; a sixth finds the queue full and is answered busy; a user's
/// download is served beside them all, uncounted.
#[tokio::test]
async fn machine_agents_past_max_agent_downloads_wait_in_order_past_the_queue_are_busy_and_users_are_not_counted()
 {
    let fixture = one_download_at_a_time(Duration::from_secs(6)).await;
    let binary = "2.9.44-ubuntu-amd64";
    let path = format!("/model/{MODEL_UUID}/tools/{binary}");
    let expected = tarball(&entry(binary, Stream::Released));
    let agents = agents(&fixture, 6);
    let mut downloads = Vec::new();
    for (index, agent) in agents[..5].iter().enumerate() {
        let (serving, path, agent) = (Arc::clone(&fixture), path.clone(), agent.clone());
        downloads.push(tokio::spawn(async move {
            let answer = get_as(&serving, &path, Some((&agent, AGENT_PASSWORD))).await;
            (answer, Instant::now())
        }));
        // Each in its place before the next comes: the first admitted, then one more
        // waiting each time.
        let wanted = (1, index as u64);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let gauges = download_gauges(&fixture).await;
            if gauges == wanted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "agent {index} never took its place: (in flight, waiting) {gauges:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let (status, _, body) = get_as(&fixture, &path, Some((&agents[5], AGENT_PASSWORD))).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    let refusal = json_body(&body);
    assert_eq!(refusal["error"]["code"], "try again", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("4 waiting") && message.contains("max-agent-downloads is 1"),
        "{refusal}"
    );
    // A user's download is not an agent's: it is served beside them, uncounted.
    let (status, _, body) = get(&fixture, &path).await;
    assert_eq!((status, body == expected), (200, true));
    let mut finished = Vec::new();
    for download in downloads {
        let ((status, _, body), at) = download.await.unwrap();
        assert_eq!((status, body == expected), (200, true));
        finished.push(at);
    }
    assert!(
        finished.windows(2).all(|pair| pair[0] <= pair[1]),
        "served out of order: {finished:?}"
    );
    assert_eq!(download_gauges(&fixture).await, (0, 0));
    // The queue is empty again: the sixth agent is served now.
    let (status, _, body) = get_as(&fixture, &path, Some((&agents[5], AGENT_PASSWORD))).await;
    assert_eq!((status, body == expected), (200, true));
    assert_eq!(fixture.backend.fetches.load(Ordering::SeqCst), 1);
}

/// A request that waits in the queue for `DOWNLOAD_QUEUE_WAIT` without a slot freed is
/// answered busy, no sooner, and leaves the queue.
#[tokio::test]
async fn a_queued_download_without_a_slot_within_the_queues_wait_is_answered_busy() {
    let queue_wait = Duration::from_millis(lockstep_core::upgrader::DOWNLOAD_QUEUE_WAIT.0);
    let fixture = one_download_at_a_time(queue_wait + Duration::from_secs(5)).await;
    let path = format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64");
    let agents = agents(&fixture, 2);
    let holding = {
        let (fixture, path, agent) = (Arc::clone(&fixture), path.clone(), agents[0].clone());
        tokio::spawn(async move { get_as(&fixture, &path, Some((&agent, AGENT_PASSWORD))).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while download_gauges(&fixture).await != (1, 0) {
        assert!(
            Instant::now() < deadline,
            "the first download never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    let (status, _, body) = get_as(&fixture, &path, Some((&agents[1], AGENT_PASSWORD))).await;
    let waited = asked.elapsed();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(waited >= queue_wait, "answered after {waited:?}");
    let refusal = json_body(&body);
    assert_eq!(refusal["error"]["code"], "try again", "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no download slot freed within 10 s"),
        "{refusal}"
    );
    assert_eq!(download_gauges(&fixture).await, (1, 0));
    let (status, _, _) = holding.await.unwrap();
    assert_eq!(status, 200);
}

/// A machine agent's download of the version it is told to run (`Upgrader.DesiredVersion`:
/// here the model's 2.9.43) goes before the fetches ahead of admission that wait (any other
/// version, 2.9.44): under `max-agent-downloads` 1, with one fetch ahead holding the slot
/// and another waiting, an admitted agent that comes last is served second.
#[tokio::test]
async fn an_admitted_agents_download_goes_before_fetches_ahead_that_wait() {
    let fixture = one_download_at_a_time(Duration::from_secs(2)).await;
    let ahead = format!("/model/{MODEL_UUID}/tools/2.9.44-ubuntu-amd64");
    let told = format!("/model/{MODEL_UUID}/tools/2.9.43-ubuntu-amd64");
    let agents = agents(&fixture, 3);
    let mut downloads = Vec::new();
    for (index, (agent, path)) in [
        (&agents[0], &ahead),
        (&agents[1], &ahead),
        (&agents[2], &told),
    ]
    .into_iter()
    .enumerate()
    {
        let (serving, path, agent) = (Arc::clone(&fixture), path.clone(), agent.clone());
        downloads.push(tokio::spawn(async move {
            let (status, _, _) = get_as(&serving, &path, Some((&agent, AGENT_PASSWORD))).await;
            (status, Instant::now())
        }));
        let wanted = (1, index as u64);
        let deadline = Instant::now() + Duration::from_secs(10);
        while download_gauges(&fixture).await != wanted {
            assert!(
                Instant::now() < deadline,
                "request {index} never took its place"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut finished = Vec::new();
    for download in downloads {
        let (status, at) = download.await.unwrap();
        assert_eq!(status, 200);
        finished.push(at);
    }
    assert!(
        finished[0] < finished[2] && finished[2] < finished[1],
        "the admitted agent's download (third asked) was not served second: {finished:?}"
    );
}
