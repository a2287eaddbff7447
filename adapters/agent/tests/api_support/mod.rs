//! The transport's server on 127.0.0.1 with a free port over the agent's shared state
//! ([`StoreState`] on a real store), its gate driven by the test, and an in-memory
//! backend. Stopped when the fixture is dropped.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use lockstep_agent::api::StoreState;
use lockstep_core::gate::GateView;
use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream};
use lockstep_core::{Binary, Millis, Phase, Progress, Version};
use lockstep_store::{Durability, MemoryStore, Model, Store};
use lockstep_transport::api::{Api, ApiConfig};
use lockstep_transport::auth::hash_password;
use lockstep_transport::backend::Backend;
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
    /// What `agent_version()` answers: the controller's own version.
    pub own_version: Mutex<String>,
    /// What `catalogue()` answers.
    pub catalogue: Mutex<Result<Catalogue, String>>,
    /// Every version `agent_version_changed` was told of, in order.
    pub versions_changed: Mutex<Vec<Version>>,
    /// `fetch_binary` calls so far.
    pub fetches: AtomicUsize,
    /// How long each `fetch_binary` takes.
    pub fetch_delay: Mutex<Duration>,
    /// The next this many `fetch_binary` calls fail.
    pub fetch_failures: AtomicUsize,
    /// `catalogue` calls so far (every tools download asks it first).
    pub catalogue_calls: AtomicUsize,
    /// A fetch starts only once `catalogue` was called this often (at most 10 s), so a
    /// test knows every download it started is waiting for the fetch; 0: at once.
    pub fetch_after_catalogue_calls: AtomicUsize,
    /// What `versions_to_keep` answers: the versions the tools cache keeps.
    pub keep: Mutex<Vec<Version>>,
}

impl Default for TestBackend {
    fn default() -> TestBackend {
        TestBackend {
            aborts: AtomicUsize::new(0),
            own_version: Mutex::new("2.9.43".into()),
            catalogue: Mutex::new(Ok(catalogue())),
            versions_changed: Mutex::new(Vec::new()),
            fetches: AtomicUsize::new(0),
            fetch_delay: Mutex::new(Duration::ZERO),
            fetch_failures: AtomicUsize::new(0),
            catalogue_calls: AtomicUsize::new(0),
            fetch_after_catalogue_calls: AtomicUsize::new(0),
            keep: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Backend for TestBackend {
    async fn versions_to_keep(&self) -> Vec<Version> {
        self.keep.lock().unwrap().clone()
    }
    fn abort_current_upgrade(&self) -> Result<(), String> {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn agent_version(&self) -> String {
        self.own_version.lock().unwrap().clone()
    }
    fn upgrade_available(&self) -> Option<String> {
        Some("2.9.44".into())
    }
    fn agent_version_changed(&self, version: Version) {
        self.versions_changed.lock().unwrap().push(version);
    }
    async fn catalogue(&self) -> Result<Catalogue, String> {
        self.catalogue_calls.fetch_add(1, Ordering::SeqCst);
        self.catalogue.lock().unwrap().clone()
    }
    async fn fetch_binary(
        &self,
        entry: CatalogueEntry,
        destination: PathBuf,
    ) -> Result<(), String> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let wanted = self.fetch_after_catalogue_calls.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.catalogue_calls.load(Ordering::SeqCst) < wanted
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let delay = *self.fetch_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let failing = self
            .fetch_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            return Err(format!("the mirror is down for {}", entry.binary));
        }
        std::fs::write(&destination, tarball(&entry)).map_err(|error| error.to_string())
    }
}

/// A catalogue entry of the test catalogue.
pub fn entry(binary: &str, stream: Stream) -> CatalogueEntry {
    let binary = Binary::parse(binary).unwrap();
    CatalogueEntry {
        path: format!("agent/{}/juju-{binary}.tgz", binary.number),
        size_bytes: 1000 + u64::from(binary.number.patch),
        sha256: Sha256([binary.number.patch as u8; 32]),
        binary,
        stream,
    }
}

/// 2.9.43 and 2.9.44 for ubuntu/amd64, 2.9.44 for ubuntu/arm64 (released), 2.9.45 for
/// ubuntu/amd64 (proposed only).
pub fn catalogue() -> Catalogue {
    Catalogue::new(vec![
        entry("2.9.43-ubuntu-amd64", Stream::Released),
        entry("2.9.44-ubuntu-amd64", Stream::Released),
        entry("2.9.44-ubuntu-arm64", Stream::Released),
        entry("2.9.45-ubuntu-amd64", Stream::Proposed),
    ])
    .unwrap()
}

/// The bytes the test backend "fetches" for an entry: its name, repeated to its size.
pub fn tarball(entry: &CatalogueEntry) -> Vec<u8> {
    entry
        .binary
        .to_string()
        .into_bytes()
        .into_iter()
        .cycle()
        .take(entry.size_bytes as usize)
        .collect()
}

/// The password of every agent in [`AGENTS`].
pub const AGENT_PASSWORD: &str = "agent-s3cret";

/// The agents the fixture's config lets log in.
pub const AGENTS: [&str; 3] = ["machine-0", "machine-1", "machine-2"];

pub struct Fixture {
    pub port: u16,
    pub ca_pem: String,
    pub gate: watch::Sender<GateView>,
    pub backend: Arc<TestBackend>,
    pub api: Arc<Api>,
    pub store: Arc<dyn Store>,
    pub server: tokio::task::JoinHandle<()>,
    /// The tools endpoint's cache directory, removed with the fixture.
    pub tools_cache: Option<PathBuf>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(cache) = &self.tools_cache {
            let _ = std::fs::remove_dir_all(cache);
        }
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

/// Stores the hash of `password` as the credential of each agent of `tags`, as
/// `MachineManager.ProvisioningScript` does (without its checks of the machine).
pub fn store_agent_password(store: &dyn Store, tags: &[&str], password: &str) {
    let hash = hash_password(password);
    store
        .transaction(None, &mut |tx| {
            for tag in tags {
                tx.set_agent_password_hash(tag, &hash)?;
            }
            Ok(())
        })
        .unwrap();
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

/// A server on any free port over a fresh SQLite store in a temporary directory under the
/// target directory (removed with the returned guard), creating the model.
pub async fn start_on_sqlite(phase: Phase) -> (Fixture, tempfile::TempDir) {
    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        lockstep_store::SqliteStore::open(
            directory.path().join("state.db"),
            lockstep_store::OpenMode::ReadWrite,
        )
        .unwrap(),
    );
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    (start_with(phase, store, 0, credentials).await, directory)
}

/// A server on `port` (0: any free one) over `store`, creating the model if it has none:
/// restarting on the same port and store is how tests play an agent restart.
pub async fn start_with(
    phase: Phase,
    store: Arc<dyn Store>,
    port: u16,
    credentials: Credentials,
) -> Fixture {
    start_configured(phase, store, port, credentials, |_| {}).await
}

/// [`start_with`], with the test's own changes to the config (which has one user `admin`
/// and a fresh tools cache under the target directory); the agents of [`AGENTS`] get their
/// credentials in the store, as `ProvisioningScript` would give them.
pub async fn start_configured(
    phase: Phase,
    store: Arc<dyn Store>,
    port: u16,
    credentials: Credentials,
    configure: impl FnOnce(&mut ApiConfig),
) -> Fixture {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (gate, gate_view) = watch::channel(view(phase));
    store.create_model(&model()).unwrap();
    let backend = Arc::new(TestBackend::default());
    let tools_cache =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tools-cache-{port}"));
    let _ = std::fs::remove_dir_all(&tools_cache);
    store_agent_password(store.as_ref(), &AGENTS, AGENT_PASSWORD);
    let mut config = ApiConfig {
        model_uuid: MODEL_UUID.into(),
        controller_uuid: "deadbeef-0000-4000-8000-000000000002".into(),
        users: vec![("admin".into(), hash_password(PASSWORD))],
        tools_cache: Some(tools_cache),
        limits: Default::default(),
    };
    configure(&mut config);
    let tools_cache = config.tools_cache.clone();
    let api = Api::new(
        config,
        gate_view,
        Arc::new(StoreState::new(Arc::clone(&store))),
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
        tools_cache,
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
