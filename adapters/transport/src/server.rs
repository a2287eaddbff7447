//! The API server: TLS, HTTP probes, the tools endpoint (`/model/<uuid>/tools/<binary>`,
//! see [`crate::tools`]), and the JSON-RPC websocket on `/model/<uuid>/api`, `/api` and `/`.
//!
//! Users and machine agents log in ([`ApiConfig::users`], [`ApiConfig::agents`]); the
//! core's gate decides about every call and every agent login, and each login may call its
//! own facades only (users every facade but `Upgrader`, agents [`AGENT_FACADES`]).
//!
//! Every call asks the core's gate with the phase published at that moment, not at login,
//! so a connection opened while the agent was limited becomes full the moment it is Ready.
//! Requests on one connection are served concurrently (python-libjuju keeps a watcher's
//! `Next` blocked while it pings) and each reply carries its request's id.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use lockstep_core::gate::{self, GateView, Login};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::facades::{self, LifecycleStatus};
use crate::tools;
use crate::wire::{self, FRAME_SIZE_BYTES_MAX, WireError};
use lockstep_core::jobs::JobTable;
use lockstep_core::policy::{Catalogue, CatalogueEntry};
use lockstep_core::{Phase, Version};
use lockstep_store::{Changes, Store};

/// The Juju API level advertised in Login's `server-version`: python-libjuju accepts only
/// major 3 (CONTRACT.md, "Versions"). The agent's own version is reported by status.
pub const SERVER_VERSION: &str = "3.6.1";

/// Requests one connection may have in flight; the next waits for one to finish.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Replies queued for a connection that is slow to read them.
pub const REPLIES_QUEUED_MAX: usize = 64;

/// How long a failed login waits before it answers, whatever was wrong (a user that does
/// not exist and a wrong password take the same time).
pub const LOGIN_FAILURE_DELAY: Duration = Duration::from_millis(250);

/// Longest a `Upgrade.WatchProgress` call waits for a change before it answers with the
/// current view anyway (the client simply calls again).
pub const WATCH_PROGRESS_WAIT_MAX: Duration = Duration::from_secs(30);

/// The facades served: name, versions (as advertised in Login's reply) and methods. The
/// same table is in `spec/wire.md`, and a test keeps the two equal.
pub const FACADES: &[(&str, &[u32], &[&str])] = &[
    ("Admin", &[3], &["Login", "RedirectInfo"]),
    ("AllWatcher", &[1, 3], &["Next", "Stop"]),
    (
        "Application",
        &[1, 20],
        &["Deploy", "AddUnits", "AddRelation", "Expose"],
    ),
    (
        "Client",
        &[1, 8],
        &[
            "FullStatus",
            "FindTools",
            "AbortCurrentUpgrade",
            "ModelGet",
            "AddMachines",
            "WatchAll",
        ],
    ),
    ("ModelConfig", &[3], &["ModelGet", "ModelSet"]),
    ("ModelManager", &[9, 10], &["ModelInfo"]),
    ("Pinger", &[1], &["Ping"]),
    ("Upgrade", &[1], &["Status", "WatchProgress"]),
    (
        "Upgrader",
        &[1],
        &["SetTools", "SetVersion", "DesiredVersion", "Tools"],
    ),
];

/// The facades an agent login may call; a user may call every facade but `Upgrader`
/// (Juju's agent and client facades are apart in the same way). Anything else is
/// `permission denied`, code `unauthorized access` (Juju's `ErrPerm`).
pub const AGENT_FACADES: &[&str] = &["Admin", "Pinger", "Upgrade", "Upgrader"];

/// AllWatchers one connection may hold at once.
pub const WATCHERS_PER_CONNECTION_MAX: usize = 16;

/// Deltas one `AllWatcher.Next` returns at most; the rest come with the next call.
pub const DELTAS_PER_NEXT_MAX: usize = 1000;

/// How often a blocked `AllWatcher.Next` looks for changes made by other processes (changes
/// made through this API wake it at once).
pub const WATCH_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// A boxed future a [`Backend`] returns: `Send`, borrowing the backend (object-safe, so the
/// server holds an `Arc<dyn Backend>`).
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The lifecycle's side of the API: what the store does not hold. The agent implements it
/// over the core; tests implement it in memory.
pub trait Backend: Send + Sync + 'static {
    /// `Client.AbortCurrentUpgrade`: an operator's abort, fed to the lifecycle.
    fn abort_current_upgrade(&self) -> Result<(), String>;
    /// The agent's own version, for status and `Upgrade.Status`.
    fn agent_version(&self) -> String;
    /// The newest patch available (`upgrade-available`), if any.
    fn upgrade_available(&self) -> Option<String>;
    /// `ModelConfig.ModelSet` changed the model's agent-version (already written to the
    /// store).
    fn agent_version_changed(&self, version: Version);
    /// The agent binaries the controller knows of (for `Client.FindTools`, `ModelSet`'s
    /// check, `Upgrader.Tools` and the tools endpoint); `Err` names why none could be read.
    /// Asked on every such call and download, so it should answer from what the agent
    /// already holds rather than go to the streams each time.
    fn catalogue(&self) -> BackendFuture<'_, Result<Catalogue, String>>;
    /// Fetches one binary of the catalogue into `destination` (verified: size and sha256),
    /// for the tools endpoint. The server hands a temporary path in its cache directory and
    /// renames it into place only after `Ok`; it asks at most once at a time per binary.
    fn fetch_binary(
        &self,
        entry: CatalogueEntry,
        destination: PathBuf,
    ) -> BackendFuture<'_, Result<(), String>>;
    /// What `Upgrade.Status` shows beyond the gate: the lifecycle's last status message and
    /// the bytes of a binary being staged. A backend without them shows neither.
    fn status_detail(&self) -> StatusDetail {
        StatusDetail::default()
    }
}

/// The lifecycle's status beyond the gate, for `Upgrade.Status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusDetail {
    /// e.g. `upgrade to 2.9.44 failed (will retry): ...`; `None` when there is nothing to say.
    pub message: Option<String>,
    /// `(received, total)` bytes of a binary being downloaded.
    pub download: Option<(u64, u64)>,
    /// The last failure's message (an upgrade given up, steps held), kept after the agent
    /// moved on, so an operator learns why it runs what it runs.
    pub last_failure: Option<String>,
}

/// The API's fixed configuration. `ApiConfig { model_uuid, controller_uuid, users,
/// ..ApiConfig::default() }` leaves agents out and the tools endpoint off.
#[derive(Clone, Debug, Default)]
pub struct ApiConfig {
    pub model_uuid: String,
    pub controller_uuid: String,
    /// `(user name, argon2 password hash in PHC form)`.
    pub users: Vec<(String, String)>,
    /// Machine agents that may log in: `(tag, argon2 password hash in PHC form)`, the tag
    /// as the agent sends it in `auth-tag` (`machine-1`). The machine must also exist in
    /// the store; whether it is a controller agent is read from its roles there.
    pub agents: Vec<(String, String)>,
    /// Where `GET /model/<uuid>/tools/<binary>` keeps the binaries it fetched
    /// (`<binary>.tgz`); `None` turns the endpoint off (404).
    pub tools_cache: Option<PathBuf>,
}

/// Everything a connection needs, shared.
pub struct Api {
    config: ApiConfig,
    gate: watch::Receiver<GateView>,
    backend: Arc<dyn Backend>,
    store: Arc<dyn Store>,
    jobs: JobTable,
    /// Woken after every write made through this API, so blocked watchers answer at once.
    changed: tokio::sync::Notify,
    address: Mutex<Option<SocketAddr>>,
    metrics: Mutex<Metrics>,
    /// The tools endpoint's fetches in flight.
    fetches: tools::Fetches,
}

/// The address a connection reached this server on: where the URLs of agent binaries
/// handed to that client point.
#[derive(Clone, Copy, Debug)]
struct ServerAddress(SocketAddr);

/// Counters for `/metrics`. Keys are served facade names (or `other`), so the label
/// cardinality is bounded by [`FACADES`].
#[derive(Debug, Default)]
struct Metrics {
    calls: std::collections::BTreeMap<&'static str, u64>,
    rejections: std::collections::BTreeMap<&'static str, u64>,
}

fn facade_label(facade: &str) -> &'static str {
    FACADES
        .iter()
        .map(|(name, _, _)| *name)
        .chain(
            lockstep_core::gate::LIMITED_ALLOW_LIST
                .iter()
                .map(|(name, _)| *name),
        )
        .find(|name| *name == facade)
        .unwrap_or("other")
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("model_uuid", &self.config.model_uuid)
            .field("gate", &*self.gate.borrow())
            .finish_non_exhaustive()
    }
}

impl Api {
    /// An API over `store`, reading the lifecycle's gate from `gate`.
    pub fn new(
        config: ApiConfig,
        gate: watch::Receiver<GateView>,
        store: Arc<dyn Store>,
        backend: Arc<dyn Backend>,
    ) -> Arc<Api> {
        Arc::new(Api {
            config,
            gate,
            backend,
            store,
            jobs: JobTable::lockstep(),
            changed: tokio::sync::Notify::new(),
            address: Mutex::new(None),
            metrics: Mutex::new(Metrics::default()),
            fetches: tools::Fetches::default(),
        })
    }

    /// Calls the gate has turned away with `upgrade in progress` since start.
    pub fn gate_rejections(&self) -> u64 {
        self.metrics
            .lock()
            .expect("not poisoned")
            .rejections
            .values()
            .sum()
    }

    /// The HTTP routes: the websocket endpoints and the probes.
    pub fn router(self: &Arc<Api>) -> Router {
        Router::new()
            .route("/", get(websocket))
            .route("/api", get(websocket))
            .route("/model/{uuid}/api", get(websocket))
            .route("/model/{uuid}/tools/{binary}", get(tools_endpoint))
            .route("/livez", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(self))
    }

    /// Serves TLS connections from `listener` until this future is dropped, which also ends
    /// every connection it accepted (they belong to it, not to the runtime). A failed
    /// handshake or a broken connection ends that connection only.
    pub async fn serve(self: Arc<Api>, listener: TcpListener, tls: Arc<rustls::ServerConfig>) {
        let local = listener.local_addr().ok();
        *self.address.lock().expect("not poisoned") = local;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let router = self.router();
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: keep serving the others.
                    tracing::warn!(target: "lockstep::api", %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // A new connection gets small writes in a row (the TLS session tickets, the
            // websocket handshake, replies): with Nagle's algorithm each waits for the
            // client's ACK of the one before, which Linux delays by 40 ms.
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(target: "lockstep::api", %peer, %error, "cannot set TCP_NODELAY");
            }
            let acceptor = acceptor.clone();
            let router = match tcp.local_addr() {
                Ok(address) => router
                    .clone()
                    .layer(axum::Extension(ServerAddress(address))),
                Err(_) => router.clone(),
            };
            connections.spawn(async move {
                let stream = match acceptor.accept(tcp).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(target: "lockstep::api", %peer, %error, "TLS handshake failed");
                        return;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .with_upgrades();
                if let Err(error) = connection.await {
                    tracing::debug!(target: "lockstep::api", %peer, %error, "connection ended");
                }
            });
        }
    }
}

async fn readyz(State(api): State<Arc<Api>>) -> Response {
    let view = *api.gate.borrow();
    let body = json!({
        "phase": view.phase.as_str(),
        "step": view.progress.done,
        "steps": view.progress.total,
        "target-version": view.progress.target.map(|version| version.to_string()),
    });
    let status = if view.phase == Phase::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Prometheus text format: the phase as a labelled gauge, calls and gate rejections by
/// facade.
async fn metrics(State(api): State<Arc<Api>>) -> Response {
    use std::fmt::Write;
    let view = *api.gate.borrow();
    let mut text = String::new();
    text.push_str("# HELP lockstep_phase The agent's lifecycle phase (1 for the current one).\n");
    text.push_str("# TYPE lockstep_phase gauge\n");
    for phase in Phase::ALL {
        let value = u8::from(phase == view.phase);
        let _ = writeln!(text, "lockstep_phase{{phase=\"{phase}\"}} {value}");
    }
    text.push_str("# HELP lockstep_upgrade_steps Steps of the current phase done and planned.\n");
    text.push_str("# TYPE lockstep_upgrade_steps gauge\n");
    let _ = writeln!(
        text,
        "lockstep_upgrade_steps{{state=\"done\"}} {}",
        view.progress.done
    );
    let _ = writeln!(
        text,
        "lockstep_upgrade_steps{{state=\"planned\"}} {}",
        view.progress.total
    );
    let metrics = api.metrics.lock().expect("not poisoned");
    text.push_str("# HELP lockstep_api_calls_total API calls received, by facade.\n");
    text.push_str("# TYPE lockstep_api_calls_total counter\n");
    for (facade, count) in &metrics.calls {
        let _ = writeln!(
            text,
            "lockstep_api_calls_total{{facade=\"{facade}\"}} {count}"
        );
    }
    text.push_str("# HELP lockstep_gate_rejections_total Calls the gate turned away, by facade.\n");
    text.push_str("# TYPE lockstep_gate_rejections_total counter\n");
    for (facade, count) in &metrics.rejections {
        let _ = writeln!(
            text,
            "lockstep_gate_rejections_total{{facade=\"{facade}\"}} {count}"
        );
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

async fn websocket(
    State(api): State<Arc<Api>>,
    reached: Option<axum::Extension<ServerAddress>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let reached = reached.map(|axum::Extension(ServerAddress(address))| address);
    upgrade
        .max_message_size(FRAME_SIZE_BYTES_MAX)
        .max_frame_size(FRAME_SIZE_BYTES_MAX)
        .on_upgrade(move |socket| connection(api, socket, reached))
}

/// One client connection: a reader that spawns a task per request (at most
/// [`REQUESTS_IN_FLIGHT_MAX`] at once) and a writer that sends replies in completion order.
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
    let login = Arc::new(Session::new(reached));
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
        let (api, login, replies) = (Arc::clone(&api), Arc::clone(&login), replies.clone());
        requests.spawn(async move {
            let reply = answer(&api, &login, text.as_str()).await;
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

/// One connection's state: who logged in, and its watchers (which belong to it, as in Juju).
struct Session {
    login: Mutex<Login>,
    /// The agent's tag (`machine-1`) once an agent logged in; empty for users.
    agent: Mutex<String>,
    /// The address the client reached this server on.
    reached: Option<SocketAddr>,
    watchers: Mutex<std::collections::BTreeMap<u64, Arc<AllWatcher>>>,
    next_watcher: std::sync::atomic::AtomicU64,
}

impl Session {
    fn new(reached: Option<SocketAddr>) -> Session {
        Session {
            login: Mutex::new(Login::Anonymous),
            agent: Mutex::new(String::new()),
            reached,
            watchers: Mutex::new(std::collections::BTreeMap::new()),
            next_watcher: std::sync::atomic::AtomicU64::new(1),
        }
    }

    fn agent(&self) -> String {
        self.agent.lock().expect("not poisoned").clone()
    }
}

/// An AllWatcher: its position in the event log (`None` until the first `Next` sent the
/// whole state) and whether it was stopped.
struct AllWatcher {
    position: tokio::sync::Mutex<Option<lockstep_core::lifecycle::Revision>>,
    stopped: tokio::sync::watch::Sender<bool>,
}

/// The reply to one frame.
async fn answer(api: &Api, login: &Session, text: &str) -> String {
    let request = match wire::decode(text) {
        Ok(request) => request,
        Err(error) => {
            return wire::encode_error(
                error.request_id.unwrap_or(0),
                error.framing,
                &WireError::new("bad request", error.message),
            );
        }
    };
    let (id, framing) = (request.request_id, request.framing);
    match call(api, login, &request).await {
        Ok(response) => wire::encode_response(id, framing, response),
        Err(error) => wire::encode_error(id, framing, &error),
    }
}

async fn call(api: &Api, session: &Session, request: &wire::Request) -> Result<Value, WireError> {
    let (facade, method) = (request.facade.as_str(), request.method.as_str());
    let who = *session.login.lock().expect("not poisoned");
    let label = facade_label(facade);
    *api.metrics
        .lock()
        .expect("not poisoned")
        .calls
        .entry(label)
        .or_default() += 1;
    // The gate reads the phase as it is now, for every call.
    let view = *api.gate.borrow();
    if who != Login::Anonymous {
        served(facade, request.version, method)?;
    }
    if let Err(refused) = gate::admit(&view, who, facade, method) {
        if refused.code == gate::UPGRADE_IN_PROGRESS {
            *api.metrics
                .lock()
                .expect("not poisoned")
                .rejections
                .entry(label)
                .or_default() += 1;
        }
        return Err(rejection(refused));
    }
    if !permitted(who, facade) {
        return Err(facades::permission_denied());
    }
    match (facade, method) {
        ("Admin", "Login") => admin_login(api, session, request).await,
        ("Admin", "RedirectInfo") => Err(WireError::new("", "not redirected")),
        ("Pinger", "Ping") => Ok(json!({})),
        ("Client", "FullStatus") => {
            let lifecycle = lifecycle_status(api, view);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs());
            blocking(api, false, move |store, jobs| {
                facades::full_status(store, jobs, &lifecycle, now)
            })
            .await
        }
        ("Client", "AbortCurrentUpgrade") => api
            .backend
            .abort_current_upgrade()
            .map(|()| json!({}))
            .map_err(|message| WireError::new("", message)),
        // Juju 2.0's Client v1 still had ModelGet; python-jujuclient's get_env_config uses it.
        ("ModelConfig" | "Client", "ModelGet") => {
            blocking(api, false, |store, _| facades::model_get(store)).await
        }
        ("ModelManager", "ModelInfo") => {
            let lifecycle = lifecycle_status(api, view);
            blocking(api, false, move |store, _| {
                facades::model_info(store, &lifecycle)
            })
            .await
        }
        ("Client", "AddMachines") => mutation(api, request, facades::add_machines).await,
        ("Application", "Deploy") => mutation(api, request, facades::deploy).await,
        ("Application", "AddUnits") => mutation(api, request, facades::add_units).await,
        ("Application", "AddRelation") => mutation(api, request, facades::add_relation).await,
        ("Application", "Expose") => mutation(api, request, facades::expose).await,
        ("Client", "FindTools") => find_tools(api, session, &request.params).await,
        ("ModelConfig", "ModelSet") => model_set(api, &request.params).await,
        ("Upgrader", "SetTools" | "SetVersion") => {
            let (owner, params) = (session.agent(), request.params.clone());
            blocking(api, true, move |store, _| {
                facades::set_tools(store, &owner, &params)
            })
            .await
        }
        ("Upgrader", "DesiredVersion") => {
            let views = agent_views(api, session, &request.params).await?;
            let results: Vec<Value> = views
                .entities
                .iter()
                .map(|entity| match entity {
                    Ok(view) => json!({"version": view.desired.to_string()}),
                    Err(error) => json!({"error": facades::error_json(error)}),
                })
                .collect();
            Ok(json!({"results": results}))
        }
        ("Upgrader", "Tools") => upgrader_tools(api, session, &request.params).await,
        ("Client", "WatchAll") => watch_all(session, &request.params),
        ("AllWatcher", "Next") => all_watcher_next(api, session, &request.id).await,
        ("AllWatcher", "Stop") => all_watcher_stop(session, &request.id),
        ("Upgrade", "WatchProgress") => Ok(watch_progress(api, &request.params).await),
        ("Upgrade", "Status") => {
            let detail = api.backend.status_detail();
            Ok(json!({
                "phase": view.phase.as_str(),
                "step": view.progress.done,
                "steps": view.progress.total,
                "target-version": view.progress.target.map(|version| version.to_string()),
                "agent-version": api.backend.agent_version(),
                "upgrade-available": api.backend.upgrade_available(),
                "message": detail.message,
                "download": detail.download.map(|(received, total)| {
                    json!({"received": received, "total": total})
                }),
                "last-failure": detail.last_failure,
            }))
        }
        _ => Err(not_implemented(facade, request.version, method)),
    }
}

fn lifecycle_status(api: &Api, gate: GateView) -> LifecycleStatus {
    LifecycleStatus {
        gate,
        agent_version: api.backend.agent_version(),
        upgrade_available: api.backend.upgrade_available(),
    }
}

/// A mutating facade: its params go to the blocking pool (only these calls copy them).
async fn mutation(
    api: &Api,
    request: &wire::Request,
    facade: fn(&dyn Store, &Value) -> Result<Value, WireError>,
) -> Result<Value, WireError> {
    let params = request.params.clone();
    blocking(api, true, move |store, _| facade(store, &params)).await
}

/// Runs a store-backed facade on the blocking pool; a write wakes blocked watchers.
async fn blocking<T: Send + 'static>(
    api: &Api,
    writes: bool,
    work: impl FnOnce(&dyn Store, &JobTable) -> Result<T, WireError> + Send + 'static,
) -> Result<T, WireError> {
    let (store, jobs) = (Arc::clone(&api.store), api.jobs.clone());
    let result = tokio::task::spawn_blocking(move || work(store.as_ref(), &jobs))
        .await
        .map_err(|error| WireError::new("", format!("internal error: {error}")))?;
    if writes && result.is_ok() {
        api.changed.notify_waiters();
    }
    result
}

/// `Client.WatchAll {"after-revision"?: R}`: a new watcher on this connection. Without
/// `after-revision` its first `Next` sends the whole state, as Juju's does; with it (our
/// extension) it resumes after revision R, so a client that reconnects loses nothing.
fn watch_all(session: &Session, params: &Value) -> Result<Value, WireError> {
    let position = params
        .get("after-revision")
        .and_then(Value::as_u64)
        .map(lockstep_core::lifecycle::Revision);
    let mut watchers = session.watchers.lock().expect("not poisoned");
    if watchers.len() >= WATCHERS_PER_CONNECTION_MAX {
        return Err(WireError::new(
            "quota limit exceeded",
            format!(
                "a connection may hold at most {WATCHERS_PER_CONNECTION_MAX} watchers; stop one first"
            ),
        ));
    }
    let id = session
        .next_watcher
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (stopped, _) = tokio::sync::watch::channel(false);
    watchers.insert(
        id,
        Arc::new(AllWatcher {
            position: tokio::sync::Mutex::new(position),
            stopped,
        }),
    );
    Ok(json!({"watcher-id": id.to_string()}))
}

fn watcher(session: &Session, id: &str) -> Result<Arc<AllWatcher>, WireError> {
    id.parse::<u64>()
        .ok()
        .and_then(|id| {
            session
                .watchers
                .lock()
                .expect("not poisoned")
                .get(&id)
                .cloned()
        })
        .ok_or_else(|| WireError::new("not found", format!("unknown watcher id {id:?}")))
}

/// `AllWatcher.Next`: the first call sends the whole state; later calls block until there
/// is a change (never an empty answer). Every answer carries the revision it reaches
/// (`revision`) and each delta's own revision (`revisions`), our extension for resuming.
async fn all_watcher_next(api: &Api, session: &Session, id: &str) -> Result<Value, WireError> {
    let watcher = watcher(session, id)?;
    let mut stopped = watcher.stopped.subscribe();
    // One Next at a time per watcher: a second waits for the first.
    let mut position = watcher.position.lock().await;
    loop {
        if *stopped.borrow_and_update() {
            return Err(WireError::new("stopped", "watcher was stopped"));
        }
        let after = *position;
        let uuid = api.config.model_uuid.clone();
        let notified = api.changed.notified();
        let answer = blocking(api, false, move |store, jobs| {
            next_deltas(store, jobs, &uuid, after)
        })
        .await?;
        *position = answer["revision"]
            .as_u64()
            .map(lockstep_core::lifecycle::Revision)
            .or(*position);
        let empty = answer["deltas"].as_array().is_some_and(Vec::is_empty);
        if !empty || after.is_none() {
            return Ok(answer);
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(WATCH_POLL_INTERVAL) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// The deltas after `after` (the whole state when `None`), with their revisions.
fn next_deltas(
    store: &dyn Store,
    jobs: &JobTable,
    model_uuid: &str,
    after: Option<lockstep_core::lifecycle::Revision>,
) -> Result<Value, WireError> {
    let Some(after) = after else {
        let state = facades::read_state(store)?;
        let deltas = facades::snapshot_deltas(&state, model_uuid, jobs);
        let revisions = vec![state.revision.0; deltas.len()];
        return Ok(json!({"deltas": deltas, "revisions": revisions, "revision": state.revision.0}));
    };
    let changes = store
        .changes_since(after, DELTAS_PER_NEXT_MAX)
        .map_err(|error| WireError::new("", format!("controller state unavailable: {error}")))?;
    match changes {
        Changes::Events { events, current } => {
            let model = store.load_model().ok().flatten();
            // A full page stops at its last event; a short one is up to date with `current`.
            let reached = if events.len() == DELTAS_PER_NEXT_MAX {
                events.last().map_or(current, |event| event.revision)
            } else {
                current
            };
            let (mut deltas, mut revisions) = (Vec::new(), Vec::new());
            for event in &events {
                if let Some(delta) = facades::delta(event, model_uuid, jobs, model.as_ref()) {
                    deltas.push(delta);
                    revisions.push(event.revision.0);
                }
            }
            Ok(json!({"deltas": deltas, "revisions": revisions, "revision": reached.max(after).0}))
        }
        Changes::ResyncNeeded { compacted, current } => Err(WireError {
            message: format!(
                "watcher cannot resume after revision {}: events up to {} were compacted; \
                 start a new watcher (its first Next sends the whole state)",
                after.0, compacted.0
            ),
            code: "resync needed".to_owned(),
            info: Some(json!({"compacted-revision": compacted.0, "current-revision": current.0})),
        }),
    }
}

/// `AllWatcher.Stop`: ends the watcher; a pending `Next` fails with `watcher was stopped`.
fn all_watcher_stop(session: &Session, id: &str) -> Result<Value, WireError> {
    let watcher = watcher(session, id)?;
    watcher.stopped.send_replace(true);
    if let Ok(id) = id.parse::<u64>() {
        session.watchers.lock().expect("not poisoned").remove(&id);
    }
    Ok(json!({}))
}

/// The progress a client has seen, as it sends it back: phase and step.
fn progress_of(view: &GateView) -> Value {
    json!({
        "phase": view.phase.as_str(),
        "step": view.progress.done,
        "steps": view.progress.total,
        "target-version": view.progress.target.map(|version| version.to_string()),
        "ready": view.phase == Phase::Ready,
    })
}

/// `Upgrade.WatchProgress {"phase": p, "step": s}`: answers as soon as the phase or step
/// differs from what the client last saw (at once when it saw nothing, or at most after
/// [`WATCH_PROGRESS_WAIT_MAX`]), so a client waits for Ready by calling it in a loop with
/// no polling delay of its own. It is a call, not a server push, so that it stays on the
/// gate's allow-list in every phase.
async fn watch_progress(api: &Api, params: &Value) -> Value {
    let seen_phase = params
        .get("phase")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let seen_step = params.get("step").and_then(Value::as_u64);
    let differs = |view: &GateView| {
        seen_phase.as_deref() != Some(view.phase.as_str())
            || seen_step != Some(u64::from(view.progress.done))
    };
    let mut changes = api.gate.clone();
    let deadline = tokio::time::Instant::now() + WATCH_PROGRESS_WAIT_MAX;
    loop {
        let view = *changes.borrow_and_update();
        if differs(&view) {
            return progress_of(&view);
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return progress_of(&view);
                }
            }
            () = tokio::time::sleep_until(deadline) => return progress_of(&view),
        }
    }
}

/// `not implemented` unless the facade, version and method are served (Juju's wording).
fn served(facade: &str, version: u32, method: &str) -> Result<(), WireError> {
    let Some((_, versions, methods)) = FACADES.iter().find(|(name, _, _)| *name == facade) else {
        return Err(WireError::new(
            "not implemented",
            format!("unknown object type {facade:?}"),
        ));
    };
    if !versions.contains(&version) {
        return Err(WireError::new(
            "not implemented",
            format!("unknown version ({version}) of interface {facade:?}"),
        ));
    }
    if methods.contains(&method) {
        Ok(())
    } else {
        Err(not_implemented(facade, version, method))
    }
}

fn not_implemented(facade: &str, version: u32, method: &str) -> WireError {
    WireError::new(
        "not implemented",
        format!("no such request - method {facade}({version}).{method} is not implemented"),
    )
}

fn rejection(rejection: gate::Rejection) -> WireError {
    WireError {
        message: rejection.message.into_owned(),
        code: rejection.code.to_owned(),
        info: rejection
            .detail
            .map(|detail| serde_json::to_value(detail).expect("error-info serialises")),
    }
}

/// Who `auth-tag` and `credentials` authenticate, if anyone: a user of
/// [`ApiConfig::users`], or an agent of [`ApiConfig::agents`] whose machine exists in the
/// store (a controller agent when the machine is a controller). Runs on the blocking pool:
/// a password hash costs milliseconds of CPU.
async fn authenticate(api: &Api, tag: &str, password: &str) -> Option<Login> {
    let (tag, password) = (tag.to_owned(), password.to_owned());
    let user = tag.strip_prefix("user-").map(str::to_owned);
    let hash = match &user {
        Some(user) => api.config.users.iter().find(|(name, _)| name == user),
        None => api.config.agents.iter().find(|(agent, _)| *agent == tag),
    }
    .map(|(_, hash)| hash.clone());
    let Some(hash) = hash else {
        // Someone unknown costs a hash too, so the time taken does not tell.
        let _ = blocking(api, false, move |_, _| {
            Ok(verify_password(&password, unknown_entity_hash()))
        })
        .await;
        return None;
    };
    if user.is_some() {
        let verified = blocking(api, false, move |_, _| {
            Ok(verify_password(&password, &hash))
        });
        return verified.await.ok()?.then_some(Login::User);
    }
    let id = facades::machine_id(&tag)?;
    blocking(api, false, move |store, _| {
        if !verify_password(&password, &hash) {
            return Ok(None);
        }
        Ok(facades::machine(store, &id)?.map(|machine| {
            if facades::is_controller(&machine) {
                Login::ControllerAgent
            } else {
                Login::MachineAgent
            }
        }))
    })
    .await
    .ok()
    .flatten()
}

/// True when `login` may call `facade` at all (the gate decides about the phase): users
/// every facade but `Upgrader`, agents [`AGENT_FACADES`]. Before login the gate admits
/// `Admin` only.
fn permitted(login: Login, facade: &str) -> bool {
    match login {
        Login::Anonymous => true,
        Login::User => facade != "Upgrader",
        Login::ControllerAgent | Login::MachineAgent => AGENT_FACADES.contains(&facade),
    }
}

/// `Admin.Login` v3: a user (`user-admin`, `credentials` its password) or a machine agent
/// (`machine-1`, `credentials` its password; Juju's `nonce` is accepted and not checked).
/// Every failure answers the same after the same delay. An authenticated agent other than
/// a controller's is then refused while the agent is not Ready, as Juju refuses it.
async fn admin_login(
    api: &Api,
    session: &Session,
    request: &wire::Request,
) -> Result<Value, WireError> {
    if request.version != 3 {
        return Err(WireError::new(
            "not implemented",
            format!(
                "unknown version ({}) of interface \"Admin\"",
                request.version
            ),
        ));
    }
    let tag = request
        .params
        .get("auth-tag")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let password = request
        .params
        .get("credentials")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(who) = authenticate(api, tag, password).await else {
        tokio::time::sleep(LOGIN_FAILURE_DELAY).await;
        return Err(WireError::new(
            "unauthorized access",
            "invalid entity name or password",
        ));
    };
    // Juju's rule: agents other than controllers' wait until the upgrade is over.
    let view = *api.gate.borrow();
    gate::admit_login(&view, who, tag).map_err(rejection)?;
    *session.login.lock().expect("not poisoned") = who;
    *session.agent.lock().expect("not poisoned") = match who {
        Login::ControllerAgent | Login::MachineAgent => tag.to_owned(),
        Login::Anonymous | Login::User => String::new(),
    };
    let address = *api.address.lock().expect("not poisoned");
    let servers: Vec<Value> = session
        .reached
        .or(address)
        .map(|address| {
            json!([{"value": address.ip().to_string(), "port": address.port(), "type": "ipv4", "scope": "local-machine"}])
        })
        .into_iter()
        .collect();
    let facades: Vec<Value> = FACADES
        .iter()
        .filter(|(name, _, _)| permitted(who, name))
        .map(|(name, versions, _)| json!({"name": name, "versions": versions}))
        .collect();
    let mut reply = json!({
        "servers": servers,
        "model-tag": format!("model-{}", api.config.model_uuid),
        "controller-tag": format!("controller-{}", api.config.controller_uuid),
        "facades": facades,
        "server-version": SERVER_VERSION,
    });
    if who == Login::User {
        let user = tag.strip_prefix("user-").unwrap_or_default();
        reply["user-info"] = json!({
            "display-name": user,
            "identity": tag,
            "controller-access": "superuser",
            "model-access": "admin",
        });
    }
    Ok(reply)
}

/// `https://<address>/model/<uuid>`: where the URLs of agent binaries handed to this
/// connection's client point (the address it reached this server on).
fn model_root(api: &Api, session: &Session) -> String {
    let address = session
        .reached
        .or(*api.address.lock().expect("not poisoned"))
        .map_or_else(
            || "localhost:17070".to_owned(),
            |address| address.to_string(),
        );
    format!("https://{address}/model/{}", api.config.model_uuid)
}

fn catalogue_unreadable(reason: &str) -> String {
    format!("cannot read the agent-binary catalogue: {reason}")
}

/// `Client.FindTools`: the catalogue's binaries that match (see [`tools::FindTools`]), as
/// `{"list": [{"version", "url", "size", "sha256"}]}` with URLs on the tools endpoint. As in
/// Juju, finding nothing is `{"list": [], "error": {"message": "no matching agent binaries
/// available", "code": "not found"}}`, and an unreadable catalogue an `error` too.
async fn find_tools(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let search = tools::FindTools::parse(params)?;
    let model_stream = blocking(api, false, |store, _| facades::model_stream(store)).await?;
    let root = model_root(api, session);
    Ok(match api.backend.catalogue().await {
        Err(reason) => json!({"list": [], "error": {"message": catalogue_unreadable(&reason)}}),
        Ok(catalogue) => {
            let found = search.search(&catalogue, model_stream);
            if found.is_empty() {
                json!({"list": [], "error": {"message": tools::NO_MATCHES, "code": "not found"}})
            } else {
                let list: Vec<Value> = found
                    .iter()
                    .map(|entry| tools::tools_json(entry, &root))
                    .collect();
                json!({"list": list})
            }
        }
    })
}

/// `ModelConfig.ModelSet {"config": {"agent-version": "2.9.44"}}`: the only key lockstep
/// sets this way. Refused for any other key (naming it), while an upgrade-info record is
/// current (Juju's message), for a lower version, and for a version the catalogue has no
/// binary of in the model's streams (Juju's `no agent binaries found for version`). The
/// current version back is accepted and changes nothing. On success the store holds the
/// new version and the backend is told ([`Backend::agent_version_changed`]).
async fn model_set(api: &Api, params: &Value) -> Result<Value, WireError> {
    let config = params
        .get("config")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            WireError::new(
                "bad request",
                "params.config must be an object of model config keys",
            )
        })?;
    let mut version = None;
    for (key, value) in config {
        if key != "agent-version" {
            return Err(WireError::new(
                "not supported",
                format!(
                    "model config key {key:?} cannot be set: lockstep's ModelConfig.ModelSet \
                     sets agent-version only"
                ),
            ));
        }
        let text = value.as_str().ok_or_else(|| {
            WireError::new(
                "bad request",
                format!("agent-version must be a string, got {value}"),
            )
        })?;
        version = Some(
            Version::parse(text)
                .map_err(|error| WireError::new("bad request", error.to_string()))?,
        );
    }
    let Some(version) = version else {
        return Ok(json!({}));
    };
    let Some(model_stream) = blocking(api, false, move |store, _| {
        facades::agent_version_change(store, version)
    })
    .await?
    else {
        return Ok(json!({}));
    };
    let catalogue = api.backend.catalogue().await.map_err(|reason| {
        WireError::new(
            "",
            format!(
                "cannot check for agent binaries of version {version}: {}",
                catalogue_unreadable(&reason)
            ),
        )
    })?;
    let search = tools::FindTools {
        number: Some(version),
        ..tools::FindTools::default()
    };
    if search.search(&catalogue, model_stream).is_empty() {
        return Err(WireError::new(
            "not found",
            format!("no agent binaries found for version {version}"),
        ));
    }
    blocking(api, true, move |store, _| {
        facades::set_agent_version(store, version)
    })
    .await?;
    tracing::info!(target: "lockstep::api", %version, "agent-version changed by ModelConfig.ModelSet");
    api.backend.agent_version_changed(version);
    Ok(json!({}))
}

/// The Upgrader facade's view of the entities a call names (see
/// [`facades::agent_views`]).
async fn agent_views(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<facades::AgentViews, WireError> {
    let own = api.backend.agent_version();
    let server_version = Version::parse(&own).map_err(|error| {
        WireError::new(
            "",
            format!("this controller's own version is unreadable: {error}"),
        )
    })?;
    let (owner, params) = (session.agent(), params.clone());
    blocking(api, false, move |store, _| {
        facades::agent_views(store, &owner, server_version, &params)
    })
    .await
}

/// `Upgrader.Tools {"entities": [{"tag"}]}`: for each, the catalogue's binary of its
/// desired version for the release and architecture it runs, with a URL on the tools
/// endpoint: `{"results": [{"tools": [{"version", "url", "size", "sha256"}],
/// "disable-ssl-hostname-verification": false} | {"error"}]}`.
async fn upgrader_tools(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let views = agent_views(api, session, params).await?;
    let catalogue = api.backend.catalogue().await;
    let root = model_root(api, session);
    let results: Vec<Value> = views
        .entities
        .iter()
        .map(|entity| {
            let found = entity.clone().and_then(|view| {
                let running = view.running.ok_or_else(|| {
                    WireError::new(
                        "not found",
                        "the agent has not reported the binary it runs (Upgrader.SetTools)",
                    )
                })?;
                let catalogue = catalogue
                    .as_ref()
                    .map_err(|reason| WireError::new("", catalogue_unreadable(reason)))?;
                let wanted = lockstep_core::Binary {
                    number: view.desired,
                    ..running
                };
                tools::entry_for(catalogue, &wanted, views.model_stream)
                    .map(|entry| tools::tools_json(entry, &root))
                    .ok_or_else(|| {
                        WireError::new("not found", format!("{} for {wanted}", tools::NO_MATCHES))
                    })
            });
            match found {
                Ok(tools) => {
                    json!({"tools": [tools], "disable-ssl-hostname-verification": false})
                }
                Err(error) => json!({"error": facades::error_json(&error)}),
            }
        })
        .collect();
    Ok(json!({"results": results}))
}

/// `GET /model/<uuid>/tools/<version>-<os>-<arch>`: the binary's tarball from the cache,
/// fetched through the backend first if the cache lacks it (once, whoever else asks at
/// the same moment). Errors are JSON, `{"error": {"message", "code"}}`: 404 for another
/// model, no cache configured, or a binary the catalogue lacks; 400 for a malformed name;
/// 502 when the fetch failed (the next request tries again); 503 when the catalogue
/// cannot be read. Served in every phase, without login, as Juju serves it.
async fn tools_endpoint(
    State(api): State<Arc<Api>>,
    axum::extract::Path((uuid, binary)): axum::extract::Path<(String, String)>,
) -> Response {
    if uuid != api.config.model_uuid {
        return tools::http_error(
            StatusCode::NOT_FOUND,
            "not found",
            format!("unknown model {uuid:?}"),
        );
    }
    let Some(cache) = api.config.tools_cache.clone() else {
        return tools::http_error(
            StatusCode::NOT_FOUND,
            "not found",
            "this controller serves no agent binaries: it has no tools cache configured",
        );
    };
    let binary = match lockstep_core::Binary::parse(&binary) {
        Ok(binary) => binary,
        Err(error) => {
            return tools::http_error(StatusCode::BAD_REQUEST, "bad request", error.to_string());
        }
    };
    let catalogue = match api.backend.catalogue().await {
        Ok(catalogue) => catalogue,
        Err(reason) => {
            return tools::http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "",
                catalogue_unreadable(&reason),
            );
        }
    };
    let model_stream = blocking(&api, false, |store, _| facades::model_stream(store))
        .await
        .ok()
        .flatten();
    let Some(entry) = tools::entry_for(&catalogue, &binary, model_stream).cloned() else {
        return tools::http_error(
            StatusCode::NOT_FOUND,
            "not found",
            format!("no agent binaries found for {binary}"),
        );
    };
    match api.fetches.ensure(&api.backend, &cache, &entry).await {
        Ok(path) => tools::serve_file(&path).await,
        Err((status, message)) => tools::http_error(status, "", message),
    }
}

/// Hashes a password for [`ApiConfig::users`] (argon2id, random salt, PHC string).
pub fn hash_password(password: &str) -> String {
    use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
    let salt = SaltString::generate(&mut OsRng);
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters hashes any password")
        .to_string()
}

/// A hash no password is known for, verified against when a login names no one known.
fn unknown_entity_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| hash_password("no one logs in with this"))
}

fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spec/wire.md's table of served facades and the code's are the same: names,
    /// versions and methods.
    #[test]
    fn the_spec_lists_the_facades_served() {
        let spec = include_str!("../../../spec/wire.md");
        let start = spec
            .find("| facade | versions | methods |")
            .expect("facade table");
        let mut rows: Vec<(String, Vec<u32>, Vec<String>)> = spec[start..]
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let versions = cells[2].split(", ").map(|v| v.parse().unwrap()).collect();
                let methods = cells[3].split(", ").map(str::to_owned).collect();
                (cells[1].to_owned(), versions, methods)
            })
            .collect();
        rows.sort();
        let code: Vec<(String, Vec<u32>, Vec<String>)> = FACADES
            .iter()
            .map(|(name, versions, methods)| {
                let methods = methods.iter().map(|method| (*method).to_owned()).collect();
                ((*name).to_owned(), versions.to_vec(), methods)
            })
            .collect();
        assert_eq!(rows, code, "FACADES is sorted by name");
    }
}
