//! The API server: the axum router (the JSON-RPC websocket on `/model/<uuid>/api`, `/api`
//! and `/`; the probes; the tools endpoint) and the TLS accept loop.
//!
//! Users and machine agents log in ([`ApiConfig::users`], [`ApiConfig::agents`]); the
//! core's gate decides about every call and every agent login ([`crate::route`]), and each
//! login may call its own facades only ([`crate::served`]).
//!
//! The names embedders use are re-exported here: [`Api`], [`ApiConfig`], [`Backend`],
//! [`SharedState`], [`hash_password`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::net::TcpListener;

pub use crate::api::{Api, ApiConfig};
pub use crate::auth::{LOGIN_FAILURE_DELAY, hash_password};
pub use crate::backend::{Backend, LifecycleStatus, StatusDetail};
pub use crate::connection::{REPLIES_QUEUED_MAX, REQUESTS_IN_FLIGHT_MAX};
pub use crate::served::{AGENT_FACADES, FACADES};
pub use crate::session::WATCHERS_PER_CONNECTION_MAX;
pub use crate::state::SharedState;
pub use crate::wire::SERVER_VERSION;

use crate::{charms_endpoint, connection, probes};

/// The address a connection reached this server on: where the URLs of agent binaries
/// handed to that client point.
#[derive(Clone, Copy, Debug)]
struct ServerAddress(SocketAddr);

impl Api {
    /// The HTTP routes: the websocket endpoints, the tools endpoint and the probes.
    pub fn router(self: &Arc<Api>) -> Router {
        Router::new()
            .route("/", get(websocket))
            .route("/api", get(websocket))
            .route("/model/{uuid}/api", get(websocket))
            .route("/model/{uuid}/tools/{binary}", get(tools))
            .route("/model/{uuid}/charms", post(charms))
            .route("/livez", get(probes::livez))
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
        let acceptor = tokio_rustls::TlsAcceptor::from(recording_ca(&self, tls));
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

/// `tls` with its certificate resolver wrapped so that the first handshake records the CA
/// at the end of the chain it presents ([`Api::ca_pem`]): the controller's CA, which
/// `Controller.ControllerAPIInfoForModels` hands out, is known to the server without
/// another input.
fn recording_ca(api: &Arc<Api>, tls: Arc<rustls::ServerConfig>) -> Arc<rustls::ServerConfig> {
    let mut config = (*tls).clone();
    config.cert_resolver = Arc::new(RecordingResolver {
        inner: Arc::clone(&tls.cert_resolver),
        api: Arc::downgrade(api),
    });
    Arc::new(config)
}

#[derive(Debug)]
struct RecordingResolver {
    inner: Arc<dyn rustls::server::ResolvesServerCert>,
    api: std::sync::Weak<Api>,
}

impl rustls::server::ResolvesServerCert for RecordingResolver {
    fn resolve(
        &self,
        client_hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let key = self.inner.resolve(client_hello)?;
        if let (Some(api), [_, .., ca]) = (self.api.upgrade(), key.cert.as_slice()) {
            api.ca.get_or_init(|| pem("CERTIFICATE", ca.as_ref()));
        }
        Some(key)
    }
}

/// DER as PEM: base64 in lines of 64 characters between the label's markers.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

async fn charms(
    State(api): State<Arc<Api>>,
    Path(uuid): Path<String>,
    query: axum::extract::RawQuery,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    charms_endpoint::post(&api, &uuid, query.0.as_deref(), &headers, body).await
}

async fn websocket(
    State(api): State<Arc<Api>>,
    reached: Option<axum::Extension<ServerAddress>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let reached = reached.map(|axum::Extension(ServerAddress(address))| address);
    connection::upgrade(api, upgrade, reached)
}

async fn tools(
    State(api): State<Arc<Api>>,
    Path((uuid, binary)): Path<(String, String)>,
) -> Response {
    api.tools
        .get(&api.backend, &*api.state, &uuid, &binary)
        .await
}

async fn readyz(State(api): State<Arc<Api>>) -> Response {
    probes::readyz(api.view())
}

async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let view = api.view();
    let metrics = api.metrics.lock().expect("not poisoned");
    probes::metrics(view, &metrics)
}
