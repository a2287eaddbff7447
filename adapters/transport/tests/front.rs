//! The launcher's side of the relay against the worker's, on a real unix socket: one client
//! connection rides through worker restarts. A "worker" here is an API over the tests'
//! in-memory state serving the relay socket; killing it drops its task, and with it every
//! stream and call it held, as a worker's death closes its sockets. The next worker is a
//! new API over the same state. (Real processes and real clients: the agent's tests.)

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockstep_core::Phase;
use lockstep_core::Role;
use lockstep_core::Roles;
use lockstep_transport::front::{FrontDoor, ToClient};
use lockstep_transport::relay;
use lockstep_transport::relayed::{self, Launcher};
use lockstep_transport::tls::Credentials;
use serde_json::{Value, json};
use support::*;
use tokio::sync::mpsc;

/// The controller's state, which outlives every worker, and the worker serving it now.
struct Controller {
    state: Arc<FakeState>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    worker: Option<(Fixture, tokio::task::JoinHandle<()>)>,
}

impl Controller {
    async fn new() -> Controller {
        let dir = tempfile::tempdir().unwrap();
        let mut controller = Controller {
            state: fresh_state(),
            socket: dir.path().join(relay::SOCKET_NAME),
            _dir: dir,
            worker: None,
        };
        controller.start_worker().await;
        controller
    }

    async fn start_worker(&mut self) {
        self.start_worker_in(Phase::Ready).await;
    }

    /// A worker whose lifecycle is in `phase` (the test moves it on through its gate).
    async fn start_worker_in(&mut self, phase: Phase) {
        assert!(self.worker.is_none());
        let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
        let fixture = start_with(phase, Arc::clone(&self.state), 0, credentials).await;
        // As a worker does: a socket file left by the previous one goes first.
        let _ = std::fs::remove_file(&self.socket);
        let listener = tokio::net::UnixListener::bind(&self.socket).unwrap();
        let launcher = Launcher {
            pid: std::process::id(),
            uid: rustix::process::geteuid().as_raw(),
        };
        let relay = tokio::spawn(relayed::serve(Arc::clone(&fixture.api), listener, launcher));
        self.worker = Some((fixture, relay));
    }

    async fn kill_worker(&mut self) {
        let (fixture, relay) = self.worker.take().expect("a worker runs");
        relay.abort();
        let _ = relay.await;
        drop(fixture);
    }
}

/// A client connection through the front door: its frames in, what it gets out.
struct Client {
    frames: mpsc::Sender<String>,
    gets: mpsc::Receiver<ToClient>,
    _served: tokio::task::JoinHandle<()>,
}

impl Client {
    fn connect(door: &Arc<FrontDoor>) -> Client {
        Client::connect_from(door, "127.0.0.1:40000")
    }

    /// A connection from the client address `peer`.
    fn connect_from(door: &Arc<FrontDoor>, peer: &str) -> Client {
        let (frames, from_client) = mpsc::channel(64);
        let (to_client, gets) = mpsc::channel(64);
        let door = Arc::clone(door);
        let peer = peer.parse().unwrap();
        let served = tokio::spawn(async move {
            door.serve(
                peer,
                Some("127.0.0.1:17070".parse().unwrap()),
                "/api".to_owned(),
                from_client,
                to_client,
                None,
            )
            .await;
        });
        Client {
            frames,
            gets,
            _served: served,
        }
    }

    async fn send(&self, request: Value) {
        self.frames.send(request.to_string()).await.unwrap();
    }

    /// The next frame the client gets; a close fails the test.
    async fn receive(&mut self) -> Value {
        match tokio::time::timeout(Duration::from_secs(10), self.gets.recv()).await {
            Ok(Some(ToClient::Frame(frame))) => serde_json::from_str(&frame).unwrap(),
            Ok(other) => panic!("the connection was closed: {other:?}"),
            Err(_) => panic!("no reply within 10 s"),
        }
    }

    /// Nothing arrives for `quiet`.
    async fn nothing_for(&mut self, quiet: Duration) {
        if let Ok(got) = tokio::time::timeout(quiet, self.gets.recv()).await {
            panic!("expected nothing, got {got:?}");
        }
    }

    async fn call(&mut self, request: Value) -> Value {
        let id = request["request-id"].clone();
        self.send(request).await;
        let reply = self.receive().await;
        assert_eq!(reply["request-id"], id, "{reply}");
        reply
    }

    async fn login(&mut self) {
        let reply = self
            .call(json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
                "params": {"auth-tag": "user-admin", "credentials": PASSWORD, "client-version": "3.6.1"}}))
            .await;
        assert!(reply.get("error").is_none(), "{reply}");
    }
}

fn door(controller: &Controller, wait_max: Duration) -> Arc<FrontDoor> {
    Arc::new(FrontDoor::new(controller.socket.clone(), "0.1.0", wait_max))
}

/// The launchers a worker of this build must serve: one of an older lockstep, which speaks
/// relay version 1 only (a self-upgrade replaces the worker, never the launcher), and one
/// of this build.
const LAUNCHERS: [&[u32]; 2] = [&[1], relay::VERSIONS];

fn door_speaking(controller: &Controller, wait_max: Duration, versions: &[u32]) -> Arc<FrontDoor> {
    Arc::new(FrontDoor::new(controller.socket.clone(), "0.1.0", wait_max).speaking(versions))
}

fn full_status(request_id: u64) -> Value {
    json!({"request-id": request_id, "type": "Client", "version": 8, "request": "FullStatus", "params": {}})
}

fn add_machine(request_id: u64) -> Value {
    json!({"request-id": request_id, "type": "Client", "version": 8, "request": "AddMachines",
           "params": {"params": [{"jobs": ["JobHostUnits"]}]}})
}

fn assert_served(reply: &Value) {
    assert!(reply.get("error").is_none(), "{reply}");
    assert!(reply["response"].is_object(), "{reply}");
}

#[tokio::test]
async fn a_client_rides_through_worker_restarts_logged_in_on_the_same_connection() {
    for versions in LAUNCHERS {
        rides_through_restarts(versions).await;
    }
}

async fn rides_through_restarts(versions: &[u32]) {
    let mut controller = Controller::new().await;
    let door = door_speaking(&controller, Duration::from_secs(10), versions);
    let mut client = Client::connect(&door);
    client.login().await;
    assert_served(&client.call(full_status(2)).await);
    for round in 0..3 {
        controller.kill_worker().await;
        controller.start_worker().await;
        // No login again: the connection's login went to the new worker with `open`.
        assert_served(&client.call(full_status(10 + round)).await);
    }
}

#[tokio::test]
async fn between_workers_a_ping_is_answered_a_write_refused_and_a_read_held_for_the_next_worker() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(30));
    let mut client = Client::connect(&door);
    client.login().await;
    controller.kill_worker().await;

    let ping = client
        .call(json!({"request-id": 2, "type": "Pinger", "version": 1, "request": "Ping", "params": {}}))
        .await;
    assert_eq!(ping["response"], json!({}), "{ping}");
    assert!(ping.get("error").is_none(), "{ping}");

    let before = controller.state.revision();
    let refused = client.call(add_machine(3)).await;
    assert_eq!(refused["error"], "upgrade in progress", "{refused}");
    assert_eq!(refused["error-code"], "upgrade in progress", "{refused}");
    assert_eq!(refused["error-info"]["phase"], "restarting", "{refused}");
    assert_eq!(
        controller.state.revision(),
        before,
        "the write was not applied"
    );

    client.send(full_status(4)).await;
    client.nothing_for(Duration::from_millis(300)).await;
    controller.start_worker().await;
    let reply = client.receive().await;
    assert_eq!(reply["request-id"], 4, "{reply}");
    assert_served(&reply);
}

#[tokio::test]
async fn a_read_held_past_the_wait_bound_is_refused_as_upgrade_in_progress() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_millis(200));
    let mut client = Client::connect(&door);
    client.login().await;
    controller.kill_worker().await;
    let refused = client.call(full_status(2)).await;
    assert_eq!(refused["error"], "upgrade in progress", "{refused}");
    assert_eq!(refused["error-info"]["phase"], "restarting", "{refused}");
    assert_eq!(refused["error-info"]["retry-after-ms"], 1000, "{refused}");
}

/// Sends `AddMachines` (request `request_id`) on `client`; the worker commits it and dies
/// between its commit and its reply. Returns the state's revision after the commit; no
/// worker runs.
async fn commit_and_die(
    controller: &mut Controller,
    client: &Client,
    request_id: u64,
) -> lockstep_core::lifecycle::Revision {
    let before = controller.state.revision();
    controller
        .state
        .stall_after_commit
        .store(true, Ordering::SeqCst);
    client.send(add_machine(request_id)).await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while controller.state.revision() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the worker commits the write");
    let committed = controller.state.revision();
    controller.kill_worker().await;
    controller
        .state
        .stall_after_commit
        .store(false, Ordering::SeqCst);
    committed
}

/// The next worker starts limited (as every worker does: bootstrapping, running steps): the
/// replayed write, which the worker that died had committed, waits for it to be Ready and
/// is then answered by what it did, rather than refused `upgrade in progress`.
#[tokio::test]
async fn a_write_replayed_on_a_worker_not_ready_yet_waits_for_ready_and_is_answered_once() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let mut client = Client::connect(&door);
    client.login().await;
    let committed = commit_and_die(&mut controller, &client, 2).await;
    controller.start_worker_in(Phase::Bootstrapping).await;

    // A read is served by the limited worker meanwhile; the replayed write waits.
    let status = client.call(full_status(3)).await;
    assert_served(&status);
    client.nothing_for(Duration::from_millis(300)).await;
    let (fixture, _) = controller.worker.as_ref().expect("a worker runs");
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let reply = client.receive().await;
    assert_eq!(reply["request-id"], 2, "{reply}");
    assert_eq!(
        reply["response"]["machines"].as_array().map(Vec::len),
        Some(1),
        "{reply}"
    );
    assert_eq!(controller.state.revision(), committed, "applied once");
}

#[tokio::test]
async fn a_write_the_worker_committed_and_died_on_is_answered_from_the_next_and_applied_once() {
    for versions in LAUNCHERS {
        committed_write_answered_once(versions).await;
    }
}

async fn committed_write_answered_once(versions: &[u32]) {
    let mut controller = Controller::new().await;
    let door = door_speaking(&controller, Duration::from_secs(10), versions);
    let mut client = Client::connect(&door);
    client.login().await;
    let committed = commit_and_die(&mut controller, &client, 2).await;
    controller.start_worker().await;

    let reply = client.receive().await;
    assert_eq!(reply["request-id"], 2, "{reply}");
    assert_eq!(
        reply["response"]["machines"].as_array().map(Vec::len),
        Some(1),
        "{reply}"
    );
    assert_eq!(controller.state.revision(), committed, "applied once");
    client.nothing_for(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_next_in_flight_continues_on_the_next_worker_with_no_delta_lost_or_repeated() {
    for versions in LAUNCHERS {
        next_continues(versions).await;
    }
}

async fn next_continues(versions: &[u32]) {
    let mut controller = Controller::new().await;
    let door = door_speaking(&controller, Duration::from_secs(10), versions);
    let mut client = Client::connect(&door);
    client.login().await;
    let watch = client
        .call(json!({"request-id": 2, "type": "Client", "version": 8, "request": "WatchAll", "params": {}}))
        .await;
    let id = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"});
    let snapshot = client.call(next(3)).await;
    let delivered = snapshot["response"]["revision"].as_u64().unwrap();

    // A Next waits for a change on the first worker; the worker dies; the change is made
    // while no worker serves.
    client.send(next(4)).await;
    client.nothing_for(Duration::from_millis(200)).await;
    controller.kill_worker().await;
    let machine = controller
        .state
        .add_machine(Roles::of(&[Role::HostMachine]));
    controller.start_worker().await;

    let deltas = client.receive().await;
    assert_eq!(deltas["request-id"], 4, "{deltas}");
    let revisions: Vec<u64> = deltas["response"]["revisions"]
        .as_array()
        .unwrap_or_else(|| panic!("{deltas}"))
        .iter()
        .map(|revision| revision.as_u64().unwrap())
        .collect();
    assert!(
        !revisions.is_empty() && revisions.iter().all(|r| *r > delivered),
        "{deltas}"
    );
    let text = deltas["response"]["deltas"].to_string();
    assert!(
        text.contains(&format!("\"{machine}\"")),
        "machine {machine} in {deltas}"
    );
    let reached = deltas["response"]["revision"].as_u64().unwrap();

    // The next Next, on the second worker, starts after what was delivered: only new changes.
    client.send(next(5)).await;
    client.nothing_for(Duration::from_millis(200)).await;
    controller
        .state
        .add_machine(Roles::of(&[Role::HostMachine]));
    let more = client.receive().await;
    let revisions: Vec<u64> = more["response"]["revisions"]
        .as_array()
        .unwrap_or_else(|| panic!("{more}"))
        .iter()
        .map(|revision| revision.as_u64().unwrap())
        .collect();
    assert!(
        !revisions.is_empty() && revisions.iter().all(|r| *r > reached),
        "{more}"
    );
}

#[tokio::test]
async fn a_tls_websocket_client_rides_through_a_worker_restart_on_the_same_socket() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = front.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(credentials.server_config().unwrap());
    let accepting = tokio::spawn(async move {
        let (tcp, peer) = front.accept().await.unwrap();
        let reached = tcp.local_addr().ok();
        let tls = acceptor.accept(tcp).await.unwrap();
        let socket = tokio_tungstenite::accept_async(tls).await.unwrap();
        door.serve_websocket(socket, peer, reached, "/api".to_owned(), None)
            .await;
    });
    let connector = tokio_rustls::TlsConnector::from(
        lockstep_transport::tls::client_config(&credentials.ca_pem, &[&rustls::version::TLS13])
            .unwrap(),
    );
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    let url = format!("wss://localhost:{port}/api");
    let (mut socket, _) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    let logged_in = login(&mut socket).await;
    assert!(logged_in.get("error").is_none(), "{logged_in}");

    controller.kill_worker().await;
    let ping = call(&mut socket, 2, "Pinger", 1, "Ping", json!({})).await;
    assert_eq!(ping["response"], json!({}), "{ping}");
    controller.start_worker().await;
    let status = call(&mut socket, 3, "Client", 8, "FullStatus", json!({})).await;
    assert_served(&status);

    // The client closes: the front door answers its close frame (RFC 6455), then ends.
    use futures_util::{SinkExt, StreamExt};
    socket.close(None).await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match socket.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_))) => break true,
                Some(Ok(_)) => continue,
                None | Some(Err(_)) => break false,
            }
        }
    })
    .await
    .expect("the connection ends within 5 s");
    assert!(answered, "the close frame was answered");
    let _ = socket.flush().await;
    accepting.await.unwrap();
}

async fn http_get(door: &FrontDoor, path: &str) -> (u16, String) {
    let request = axum::http::Request::get(path)
        .header("host", "localhost")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = door
        .http(request, "127.0.0.1:40000".parse().unwrap(), None, None)
        .await;
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn plain_http_is_relayed_a_get_waits_for_the_next_worker_and_a_post_is_refused_between() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let (status, body) = http_get(&door, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get(&door, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("lockstep_phase{phase=\"ready\"} 1"), "{body}");

    controller.kill_worker().await;
    let post = axum::http::Request::post(format!("/model/{MODEL_UUID}/charms?series=jammy"))
        .header("host", "localhost")
        .body(axum::body::Body::from("not a zip"))
        .unwrap();
    let refused = door
        .http(post, "127.0.0.1:40000".parse().unwrap(), None, None)
        .await;
    assert_eq!(refused.status().as_u16(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");

    let waiting = {
        let door = Arc::clone(&door);
        tokio::spawn(async move { http_get(&door, "/livez").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a GET waits for the next worker");
    controller.start_worker().await;
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
}

/// A tools request relayed from `peer` with the admin's `password`: its status.
async fn tools_from(door: &FrontDoor, peer: &str, password: &str) -> u16 {
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user-admin:{password}"));
    let request = axum::http::Request::get(format!("/model/{MODEL_UUID}/tools/9.9.9-ubuntu-amd64"))
        .header("host", "localhost")
        .header("authorization", format!("Basic {basic}"))
        .body(axum::body::Body::empty())
        .unwrap();
    door.http(request, peer.parse().unwrap(), None, None)
        .await
        .status()
        .as_u16()
}

#[tokio::test]
async fn relayed_http_logins_are_throttled_by_the_clients_address_not_as_one_source() {
    let controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let limits = lockstep_transport::limits::ApiLimits::default();
    for _ in 0..limits.login_failures_before_throttle {
        assert_eq!(tools_from(&door, "10.0.0.1:5000", "wrong").await, 401);
    }
    assert_eq!(
        tools_from(&door, "10.0.0.1:5001", "wrong").await,
        429,
        "the guesser is throttled"
    );
    // Another client, with the right password, is not: past its login, the binary is
    // simply not in the catalogue.
    let other = tools_from(&door, "10.0.0.2:5000", PASSWORD).await;
    assert_ne!(other, 429, "another address is not throttled");
    assert_ne!(other, 401);
}

/// An `Admin.Login` of the admin with `password` on a fresh connection from `peer`: the
/// reply's error code (`""` when it logged in).
async fn login_from(door: &Arc<FrontDoor>, peer: &str, password: &str) -> String {
    let mut client = Client::connect_from(door, peer);
    let reply = client
        .call(json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
            "params": {"auth-tag": "user-admin", "credentials": password, "client-version": "3.6.1"}}))
        .await;
    reply["error-code"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn relayed_websocket_logins_are_throttled_by_the_clients_address_not_as_one_source() {
    let controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let limits = lockstep_transport::limits::ApiLimits::default();
    for _ in 0..limits.login_failures_before_throttle {
        assert_eq!(
            login_from(&door, "10.0.0.1:5000", "wrong").await,
            "unauthorized access"
        );
    }
    assert_eq!(
        login_from(&door, "10.0.0.1:5001", "wrong").await,
        "try again",
        "the guesser is throttled"
    );
    assert_eq!(
        login_from(&door, "10.0.0.2:5000", PASSWORD).await,
        "",
        "another address logs in"
    );
}

/// A connection taken back from the worker that held it (`FrontDoor::serve_taken_back`,
/// with what the holder's journal kept): served from `kept`.
fn taken_back(
    door: &Arc<FrontDoor>,
    number: u64,
    kept: lockstep_transport::leased::Kept,
) -> Client {
    let (frames, from_client) = mpsc::channel(64);
    let (to_client, gets) = mpsc::channel(64);
    let door = Arc::clone(door);
    let served = tokio::spawn(async move {
        let place = ("127.0.0.1:40001".parse().unwrap(), None, "/api".to_owned());
        door.serve_taken_back(number, place, kept, from_client, to_client)
            .await;
    });
    Client {
        frames,
        gets,
        _served: served,
    }
}

#[tokio::test]
async fn a_connection_taken_back_from_its_holder_has_its_kept_call_answered_and_applied_once() {
    use lockstep_transport::leased::{Kept, KeptCall};
    let controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    // The holder took an AddMachines under the stamp the launcher would have put on it.
    let frame = add_machine(7).to_string();
    let request = lockstep_transport::wire::decode(&frame).unwrap();
    let operation_id = relay::operation_id(door.boot(), 42, &request);
    assert!(operation_id.is_some(), "a write is stamped");
    let kept = Kept {
        login: Some(relay::CarriedLogin {
            tag: "user-admin".to_owned(),
            kind: lockstep_core::gate::Login::User,
        }),
        watchers: Default::default(),
        pending: vec![KeptCall {
            request_id: 7,
            frame,
            operation_id,
        }],
    };
    // Taken back: the next worker answers it, replayed; the login carried on.
    let mut first = taken_back(&door, 42, kept.clone());
    let reply = first.receive().await;
    assert_eq!(reply["request-id"], 7, "{reply}");
    assert_served(&reply);
    let status = first.call(full_status(8)).await;
    assert_served(&status);
    let machines = status["response"]["machines"].as_object().unwrap().len();
    // Taken back again from the same journal (its holder had applied the call and died
    // before committing the reply): the store does not apply it twice.
    let mut again = taken_back(&door, 42, kept);
    let reply = again.receive().await;
    assert_eq!(reply["request-id"], 7, "{reply}");
    assert_served(&reply);
    let status = again.call(full_status(9)).await;
    assert_eq!(
        status["response"]["machines"].as_object().unwrap().len(),
        machines,
        "the kept AddMachines was applied twice: {status}"
    );
}

/// A connection leased to the worker (relay version 3: the client's own TLS socket and a
/// journal handed over with `SCM_RIGHTS`): the worker answers the client's calls on the
/// client's session; it dies with a `Next` waiting, which it had committed to the journal;
/// the launcher takes the connection back from the journal and carries it on: a ping
/// answered while no worker runs, the waiting `Next` answered by the next worker with the
/// change made meanwhile, and a call served without a new login.
#[tokio::test]
async fn a_leased_connection_taken_back_when_its_worker_dies_keeps_its_login_and_its_waiting_next()
{
    use futures_util::{SinkExt, StreamExt};
    use lockstep_transport::journal::{self, Journal, Shape};
    use lockstep_transport::lease;
    use lockstep_transport::leased::Kept;
    use lockstep_transport::records;
    use std::os::fd::AsFd;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role as WsRole;

    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let server_config = credentials.server_config().unwrap();
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = front.local_addr().unwrap();
    let client_tls =
        lockstep_transport::tls::client_config(&credentials.ca_pem, &[&rustls::version::TLS13])
            .unwrap();
    let connecting = tokio::spawn(async move {
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(client_tls)
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap();
        WebSocketStream::from_raw_socket(tls, WsRole::Client, None).await
    });

    // The launcher: the handshake by rustls, then the connection leased as it stands.
    let (tcp, peer) = front.accept().await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (tcp, session) = records::accept(&server_config, tcp).await.unwrap();
    let socket = tcp.into_std().unwrap();
    let mut journal = Journal::create(Shape::API, session.suite).unwrap();
    let mut stream = door.lease_stream().await.unwrap();
    let open = relay::LeaseOpen {
        connection: 42,
        peer,
        reached: None,
        path: "/api".to_owned(),
        shape: Shape::API,
        counters: journal::socket_counters(socket.as_fd()).unwrap(),
        session,
        read_ahead: Vec::new(),
        skip: 0,
        kept: Kept::default(),
    };
    let lease = open.lease();
    lease::lease(&mut stream, &open, &socket, &mut journal)
        .await
        .unwrap();
    let (took_back, taken) = tokio::sync::oneshot::channel();
    let launcher = {
        let door = Arc::clone(&door);
        tokio::spawn(async move {
            lease::returned(&mut stream).await;
            let back = lease::take_back(&journal, &lease, socket).await.unwrap();
            let _ = took_back.send(back.kept.clone());
            let websocket = WebSocketStream::from_raw_socket(
                back.socket,
                WsRole::Server,
                Some(lockstep_transport::front::websocket_config()),
            )
            .await;
            door.serve_websocket_taken_back(
                websocket,
                42,
                (peer, None, "/api".to_owned()),
                back.kept,
                None,
            )
            .await;
        })
    };

    // The worker serves the client on its own socket.
    let mut client = connecting.await.unwrap();
    let logged_in = login(&mut client).await;
    assert!(logged_in.get("error").is_none(), "{logged_in}");
    let watch = call(&mut client, 2, "Client", 8, "WatchAll", json!({})).await;
    let id = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"});
    send(&mut client, next(3)).await;
    let snapshot = receive(&mut client).await;
    assert_eq!(snapshot["request-id"], 3, "{snapshot}");
    let delivered = snapshot["response"]["revision"].as_u64().unwrap();
    // A Next that waits; the pong to a ping comes after a commit, which keeps the Next.
    send(&mut client, next(4)).await;
    client
        .send(Message::Ping("keepalive".into()))
        .await
        .unwrap();
    loop {
        if let Message::Pong(_) = client.next().await.unwrap().unwrap() {
            break;
        }
    }

    controller.kill_worker().await;
    let kept = tokio::time::timeout(Duration::from_secs(10), taken)
        .await
        .expect("the launcher takes the connection back")
        .unwrap();
    assert_eq!(
        kept.login.as_ref().map(|login| login.tag.as_str()),
        Some("user-admin")
    );
    assert_eq!(kept.watchers.get(&id), Some(&Some(delivered)), "{kept:?}");
    assert_eq!(
        kept.pending
            .iter()
            .map(|call| call.request_id)
            .collect::<Vec<_>>(),
        [4],
        "the waiting Next was kept"
    );
    // No worker: the launcher answers a ping itself, on the client's same connection.
    the_next_worker_answers_the_waiting_next(&mut controller, &mut client, 5, 4).await;
    let status = call(&mut client, 6, "Client", 8, "FullStatus", json!({})).await;
    assert_served(&status);
    launcher.abort();
}

/// While no worker runs: a ping on `client`'s connection answered by the launcher (request
/// `ping`); then a machine added and the next worker started, which answers the `Next`
/// waiting on the connection (request `next`) with that machine, once.
async fn the_next_worker_answers_the_waiting_next(
    controller: &mut Controller,
    client: &mut Socket,
    ping: u64,
    next: u64,
) {
    let pong = call(client, ping, "Pinger", 1, "Ping", json!({})).await;
    assert_eq!(pong["response"], json!({}), "{pong}");
    let machine = controller
        .state
        .add_machine(Roles::of(&[Role::HostMachine]));
    controller.start_worker().await;
    let deltas = tokio::time::timeout(Duration::from_secs(10), receive(client))
        .await
        .expect("the waiting Next answered");
    assert_eq!(deltas["request-id"], next, "{deltas}");
    let delivered = deltas["response"]["deltas"].to_string();
    assert_eq!(
        delivered.matches(&format!("\"{machine}\"")).count(),
        1,
        "machine {machine} once in {delivered}"
    );
}

/// The launcher's port as `lockstepd` serves it (`server::serve_connections`: TLS carried
/// on by records, each connection admitted, websockets served by `door`), on 127.0.0.1;
/// stopped when the handle is dropped.
struct LauncherPort {
    port: u16,
    ca_pem: String,
    served: tokio::task::JoinHandle<()>,
}

impl Drop for LauncherPort {
    fn drop(&mut self) {
        self.served.abort();
    }
}

async fn launcher_port(door: &Arc<FrontDoor>) -> LauncherPort {
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(door.serve_port(
        listener,
        credentials.server_config().unwrap(),
        lockstep_transport::limits::ApiLimits::default(),
        None,
    ));
    LauncherPort {
        port,
        ca_pem: credentials.ca_pem,
        served,
    }
}

/// A websocket client of the launcher's port, over TLS 1.3.
async fn connect_to(port: &LauncherPort) -> Socket {
    let connector = tokio_rustls::TlsConnector::from(
        lockstep_transport::tls::client_config(&port.ca_pem, &[&rustls::version::TLS13]).unwrap(),
    );
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port.port))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    let url = format!("wss://localhost:{}/api", port.port);
    tokio_tungstenite::client_async(url, stream)
        .await
        .unwrap()
        .0
}

/// Waits (10 s at most) until the front door's lease counts are `leased` and `returned`.
async fn leases_reach(door: &FrontDoor, leased: u64, returned: u64) {
    let wanted = lockstep_transport::front::LeaseCounts { leased, returned };
    let reached = tokio::time::timeout(Duration::from_secs(10), async {
        while door.lease_counts() != wanted {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "lease counts {:?}, waited for {wanted:?}",
        door.lease_counts()
    );
}

/// A client of the launcher's port is leased to the worker once its login's reply leaves
/// it quiet, and served by it; the worker dies with a `Next` waiting; the launcher takes
/// the connection back, answers a ping itself, and the next worker answers the `Next` with
/// the change made meanwhile; the connection, still the same socket, is leased to that
/// worker in turn.
#[tokio::test]
async fn the_launchers_port_leases_a_quiet_connection_and_takes_it_back_with_its_waiting_next() {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let port = launcher_port(&door).await;
    let mut client = connect_to(&port).await;
    let logged_in = login(&mut client).await;
    assert!(logged_in.get("error").is_none(), "{logged_in}");
    leases_reach(&door, 1, 0).await;

    let watch = call(&mut client, 2, "Client", 8, "WatchAll", json!({})).await;
    let id = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"});
    send(&mut client, next(3)).await;
    let snapshot = receive(&mut client).await;
    assert_eq!(snapshot["request-id"], 3, "{snapshot}");
    send(&mut client, next(4)).await;
    // A call answered after the Next was taken: its reply's commit keeps the Next.
    let ping = call(&mut client, 5, "Pinger", 1, "Ping", json!({})).await;
    assert_eq!(ping["response"], json!({}), "{ping}");
    assert_eq!(door.lease_counts().leased, 1, "served on the lease");

    controller.kill_worker().await;
    leases_reach(&door, 1, 1).await;
    the_next_worker_answers_the_waiting_next(&mut controller, &mut client, 6, 4).await;
    let status = call(&mut client, 7, "Client", 8, "FullStatus", json!({})).await;
    assert_served(&status);
    leases_reach(&door, 2, 1).await;
    let status = call(&mut client, 8, "Client", 8, "FullStatus", json!({})).await;
    assert_served(&status);
}

/// Writes sent on a leased connection whose worker dies with them in flight: two it took
/// (committed to the store, never answered), one it held (too large to keep beside them)
/// and three it never read (some of them still in the socket). The launcher takes the
/// connection back and reads all six from the journal and the socket as sent before it
/// came back: all six wait for the next worker, are answered once each, and are applied
/// once each.
#[tokio::test]
async fn writes_in_flight_on_a_leased_connection_when_its_worker_dies_are_answered_once_and_applied_once()
 {
    let mut controller = Controller::new().await;
    let door = door(&controller, Duration::from_secs(10));
    let port = launcher_port(&door).await;
    let mut client = connect_to(&port).await;
    let logged_in = login(&mut client).await;
    assert!(logged_in.get("error").is_none(), "{logged_in}");
    leases_reach(&door, 1, 0).await;

    let before = controller.state.revision().0;
    controller
        .state
        .stall_after_commit
        .store(true, Ordering::SeqCst);
    // 900 KB each: the worker's journal keeps two such calls, not three.
    let large = |request_id: u64| {
        let mut call = add_machine(request_id);
        call["params"]["pad"] = json!("x".repeat(900_000));
        call
    };
    for request_id in 2..=4 {
        send(&mut client, large(request_id)).await;
    }
    // 400 KB each: more than the worker's journal has room for beside the call it holds,
    // so most stay in the socket.
    let padded = |request_id: u64| {
        let mut call = add_machine(request_id);
        call["params"]["pad"] = json!("y".repeat(400_000));
        call
    };
    for request_id in 5..=7 {
        send(&mut client, padded(request_id)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while controller.state.revision().0 < before + 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the worker commits the two writes it took");
    // Nothing more is taken while those two wait: the third does not fit beside them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(controller.state.revision().0, before + 2);
    controller.kill_worker().await;
    controller
        .state
        .stall_after_commit
        .store(false, Ordering::SeqCst);
    leases_reach(&door, 1, 1).await;
    // No worker for a while: the calls wait for the next one.
    tokio::time::sleep(Duration::from_millis(200)).await;
    controller.start_worker().await;

    let mut answered = std::collections::BTreeSet::new();
    for _ in 2..=7 {
        let reply = tokio::time::timeout(Duration::from_secs(10), receive(&mut client))
            .await
            .expect("every write answered");
        assert!(reply.get("error").is_none(), "{reply}");
        assert_eq!(
            reply["response"]["machines"].as_array().map(Vec::len),
            Some(1),
            "{reply}"
        );
        assert!(
            answered.insert(reply["request-id"].as_u64().unwrap()),
            "answered twice: {reply}"
        );
    }
    assert_eq!(answered, (2..=7).collect());
    assert_eq!(
        controller.state.revision().0,
        before + 6,
        "each write applied once"
    );
    let status = call(&mut client, 8, "Client", 8, "FullStatus", json!({})).await;
    assert_served(&status);
}
