//! What every connection of the API shares: its fixed configuration, the published gate
//! view, the lifecycle's [`Backend`], the [`SharedState`], the counters `/metrics` shows and
//! the tools endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use lockstep_core::gate::GateView;
use tokio::sync::watch;

use crate::admission::Connections;
use crate::backend::Backend;
use crate::limits::ApiLimits;
use crate::logins::{PasswordChecks, Throttle};
use crate::probes::Metrics;
use crate::session::Session;
use crate::state::SharedState;
use crate::tools_endpoint::ToolsEndpoint;

/// The API's fixed configuration. `ApiConfig { model_uuid, controller_uuid, users,
/// ..ApiConfig::default() }` leaves the tools endpoint off and the limits at their defaults.
/// Machine agents are not configured here: their password hashes are in the shared state
/// (`SharedState::agent_password_hash`), so every controller admits the same agents.
#[derive(Clone, Debug, Default)]
pub struct ApiConfig {
    pub model_uuid: String,
    pub controller_uuid: String,
    /// `(user name, argon2 password hash in PHC form)`.
    pub users: Vec<(String, String)>,
    /// Where `GET /model/<uuid>/tools/<binary>` keeps the binaries it fetched
    /// (`<binary>.tgz`); `None` turns the endpoint off (404).
    pub tools_cache: Option<PathBuf>,
    /// What clients may hold: connections, logins, unwritten replies, watchers.
    pub limits: ApiLimits,
}

/// Everything a connection needs, shared.
pub struct Api {
    pub(crate) config: ApiConfig,
    pub(crate) gate: watch::Receiver<GateView>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) state: Arc<dyn SharedState>,
    /// The address the server listens on, once it serves.
    pub(crate) address: Mutex<Option<SocketAddr>>,
    pub(crate) metrics: Mutex<Metrics>,
    pub(crate) tools: ToolsEndpoint,
    /// The CA certificate (PEM) at the end of the chain the server presents, learnt at the
    /// first TLS handshake (see `server.rs`).
    pub(crate) ca: std::sync::OnceLock<String>,
    /// Charm uploads being read at once (each holds its archive in memory).
    pub(crate) uploads: tokio::sync::Semaphore,
    /// Every connection, and what each holds.
    pub(crate) connections: Arc<Connections>,
    /// The login pool.
    pub(crate) checks: PasswordChecks,
    /// Failed logins by source and by user.
    pub(crate) throttle: Throttle,
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
    /// An API over `state`, reading the lifecycle's gate from `gate`.
    pub fn new(
        config: ApiConfig,
        gate: watch::Receiver<GateView>,
        state: Arc<dyn SharedState>,
        backend: Arc<dyn Backend>,
    ) -> Arc<Api> {
        let tools = ToolsEndpoint::new(config.model_uuid.clone(), config.tools_cache.clone());
        let connections = Arc::new(Connections::new(config.limits.clone()));
        let checks = PasswordChecks::new(&config.limits);
        let throttle = Throttle::new(&config.limits);
        Arc::new(Api {
            config,
            gate,
            backend,
            state,
            address: Mutex::new(None),
            metrics: Mutex::new(Metrics::default()),
            tools,
            ca: std::sync::OnceLock::new(),
            uploads: tokio::sync::Semaphore::new(crate::charm::UPLOADS_IN_FLIGHT_MAX),
            connections,
            checks,
            throttle,
        })
    }

    /// The model and controller this API serves.
    pub(crate) fn identity(&self) -> crate::state::Identity {
        crate::state::Identity {
            model_uuid: self.config.model_uuid.clone(),
            controller_uuid: self.config.controller_uuid.clone(),
        }
    }

    /// The controller's CA certificate (PEM), once a client completed a TLS handshake.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca.get().cloned()
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

    /// Connections held and refused now, as `/metrics` shows them.
    pub fn connection_counts(&self) -> crate::admission::ConnectionCounts {
        self.connections.counts()
    }

    /// The gate view published now.
    pub(crate) fn view(&self) -> GateView {
        *self.gate.borrow()
    }

    /// The address `session`'s client reached this server on, else the one it listens on.
    pub(crate) fn address_for(&self, session: &Session) -> Option<SocketAddr> {
        session
            .reached
            .or(*self.address.lock().expect("not poisoned"))
    }

    /// `https://<address>/model/<uuid>`: where the URLs of agent binaries handed to this
    /// session's client point (the address it reached this server on).
    pub(crate) fn model_root(&self, session: &Session) -> String {
        let address = self.address_for(session).map_or_else(
            || "localhost:17070".to_owned(),
            |address| address.to_string(),
        );
        format!("https://{address}/model/{}", self.config.model_uuid)
    }
}
