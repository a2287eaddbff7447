//! A server on 127.0.0.1 with a free port, its gate driven by the test, and an in-memory
//! backend. Stopped when the fixture is dropped.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::{SinkExt, StreamExt};
use lockstep_core::gate::GateView;
use lockstep_core::{Millis, Phase, Progress, Version};
use lockstep_store::{Durability, MemoryStore, Model, Store};
use lockstep_transport::server::{Api, ApiConfig, Backend, hash_password};
use lockstep_transport::tls::Credentials;
use lockstep_transport::tls::client_config;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

pub const MODEL_UUID: &str = "deadbeef-0000-4000-8000-000000000001";
pub const PASSWORD: &str = "s3cret";

pub struct TestBackend {
    pub aborts: AtomicUsize,
}

impl Backend for TestBackend {
    fn abort_current_upgrade(&self) -> Result<(), String> {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn agent_version(&self) -> String {
        "2.9.43".into()
    }
    fn upgrade_available(&self) -> Option<String> {
        Some("2.9.44".into())
    }
}

pub struct Fixture {
    pub port: u16,
    pub ca_pem: String,
    pub gate: watch::Sender<GateView>,
    pub backend: Arc<TestBackend>,
    pub api: Arc<Api>,
    pub store: Arc<dyn Store>,
    pub server: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The model a fresh controller's store holds.
pub fn model() -> Model {
    Model {
        uuid: MODEL_UUID.into(),
        name: "controller".into(),
        agent_version: Version::new(2, 9, 43),
        agent_stream: None,
        agent_metadata_url: None,
        policy: lockstep_core::policy::UpgradePolicy::Off,
        controllers: lockstep_core::lifecycle::ControllerSet::first(1),
        capabilities: lockstep_core::jobs::Capabilities::new(),
        capabilities_discovered: None,
        upgrade_available: None,
    }
}

pub fn view(phase: Phase) -> GateView {
    GateView {
        phase,
        progress: Progress {
            done: 1,
            total: 3,
            target: Some(Version::new(2, 9, 44)),
        },
        retry_after: Millis(1000),
    }
}

pub async fn start(phase: Phase) -> Fixture {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Durability::Full));
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    start_with(phase, store, 0, credentials).await
}

/// A server on `port` (0: any free one) over `store`, creating the model if it has none:
/// restarting on the same port and store is how tests play an agent restart.
pub async fn start_with(
    phase: Phase,
    store: Arc<dyn Store>,
    port: u16,
    credentials: Credentials,
) -> Fixture {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (gate, gate_view) = watch::channel(view(phase));
    store.create_model(&model()).unwrap();
    let backend = Arc::new(TestBackend {
        aborts: AtomicUsize::new(0),
    });
    let api = Api::new(
        ApiConfig {
            model_uuid: MODEL_UUID.into(),
            controller_uuid: "deadbeef-0000-4000-8000-000000000002".into(),
            users: vec![("admin".into(), hash_password(PASSWORD))],
        },
        gate_view,
        Arc::clone(&store),
        backend.clone(),
    );
    let server =
        tokio::spawn(Arc::clone(&api).serve(listener, credentials.server_config().unwrap()));
    Fixture {
        port,
        ca_pem: credentials.ca_pem,
        gate,
        backend,
        api,
        store,
        server,
    }
}

pub type Socket = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

pub async fn tls(
    fixture: &Fixture,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let connector =
        tokio_rustls::TlsConnector::from(client_config(&fixture.ca_pem, versions).unwrap());
    let tcp = TcpStream::connect(("127.0.0.1", fixture.port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

pub async fn connect(fixture: &Fixture, path: &str) -> Socket {
    let stream = tls(fixture, &[&rustls::version::TLS13, &rustls::version::TLS12]).await;
    let url = format!("wss://localhost:{}{path}", fixture.port);
    tokio_tungstenite::client_async(url, stream)
        .await
        .unwrap()
        .0
}

pub async fn send(socket: &mut Socket, request: Value) {
    socket
        .send(Message::Text(request.to_string().into()))
        .await
        .unwrap();
}

pub async fn receive(socket: &mut Socket) -> Value {
    loop {
        match socket.next().await.expect("a reply").unwrap() {
            Message::Text(text) => return serde_json::from_str(&text).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

pub async fn call(
    socket: &mut Socket,
    id: u64,
    facade: &str,
    version: u32,
    method: &str,
    params: Value,
) -> Value {
    send(socket, json!({"request-id": id, "type": facade, "version": version, "request": method, "params": params})).await;
    let reply = receive(socket).await;
    assert_eq!(reply["request-id"], id, "{reply}");
    reply
}

pub async fn login(socket: &mut Socket) -> Value {
    call(
        socket,
        1,
        "Admin",
        3,
        "Login",
        json!({"auth-tag": "user-admin", "credentials": "s3cret", "client-version": "3.6.1"}),
    )
    .await
}
