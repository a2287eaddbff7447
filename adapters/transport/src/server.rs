//! The API server: the axum router (the JSON-RPC websocket on `/model/<uuid>/api`, `/api`
//! and `/`; the probes; the tools endpoint) and the TLS accept loop.
//!
//! Users (`ApiConfig::users`) and machine agents (their hashed credentials, read from the
//! shared state through `SharedState`) log in; the core's gate decides about every call and
//! every agent login ([`crate::route`]), and each login may call its own facades only
//! ([`crate::served`]).
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
pub use crate::limits::{ApiLimits, REFUSAL_TIMEOUT, REFUSALS_IN_PROGRESS_MAX, Refusal};
pub use crate::served::{AGENT_FACADES, FACADES};
pub use crate::state::SharedState;
pub use crate::wire::SERVER_VERSION;

use crate::admission::{Admitted, Connections, Metered};
use crate::hold::ConnectionHold;
use crate::records;
use crate::threads::ConnectionThreads;
use crate::tools_endpoint::Downloader;
use crate::{auth, charms_endpoint, connection, probes};
use lockstep_core::gate::Login;

/// The address a connection reached this server on: where the URLs of agent binaries
/// handed to that client point.
#[derive(Clone, Copy, Debug)]
pub struct ServerAddress(pub SocketAddr);

impl Api {
    /// The HTTP routes: the websocket endpoints, the tools endpoint and the probes.
    pub fn router(self: &Arc<Api>) -> Router {
        Router::new()
            .route("/", get(websocket))
            .route("/api", get(websocket))
            .route("/model/{uuid}/api", get(websocket))
            .route("/model/{uuid}/tools/{binary}", get(tools))
            .route("/model/{uuid}/link-probe", get(link_probe))
            .route("/model/{uuid}/charms", post(charms))
            .route("/livez", get(probes::livez))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(self))
    }

    /// Serves TLS connections from `listener` until this future is dropped, which also ends
    /// every connection it accepted (they belong to it, not to the runtime). A failed
    /// handshake or a broken connection ends that connection only.
    ///
    /// Each connection first takes a slot ([`Connections::admit`]); over a cap it is
    /// refused with an HTTP 503 naming the limit (at most [`REFUSALS_IN_PROGRESS_MAX`] at
    /// once, each within [`REFUSAL_TIMEOUT`]; beyond those it is closed at once). Its input
    /// is metered until it logs in, its TLS handshake and its login have deadlines.
    pub async fn serve(self: Arc<Api>, listener: TcpListener, tls: Arc<rustls::ServerConfig>) {
        let local = listener.local_addr().ok();
        *self.address.lock().expect("not poisoned") = local;
        let tls = recording_ca(&self, tls);
        let router = self.router();
        serve_connections(
            listener,
            tls,
            Arc::clone(&self.connections),
            self.config.limits.clone(),
            router,
            None,
        )
        .await;
    }
}

/// The accept loop of [`Api::serve`], for any router: TLS connections from `listener`,
/// each admitted by `connections` (a slot, metered input until login, the TLS handshake's
/// and the login's deadlines; over a cap, an HTTP 503 naming the limit), then HTTP/1.1 with
/// upgrades, served by `router`, which finds the connection's slot as an
/// `Extension<Arc<Admitted>>`, what it keeps until it ends as an
/// `Extension<Arc<ConnectionHold>>`, and the address it reached as an
/// `Extension<ServerAddress>`.
/// Serves until dropped, which ends every connection it accepted.
///
/// With `threads`, each connection is served on one of those threads for its whole life
/// ([`ConnectionThreads`]); without, on the caller's runtime.
pub async fn serve_connections(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    connections_held: Arc<Connections>,
    limits: ApiLimits,
    router: Router,
    threads: Option<Arc<ConnectionThreads>>,
) {
    // Refusals are answered by rustls's own stream: one response, then the end.
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls));
    let limits = Arc::new(limits);
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS_IN_PROGRESS_MAX));
    let mut connections = tokio::task::JoinSet::new();
    let _closes_all = CloseAllOnDrop(Arc::clone(&connections_held));
    let mut refusal_log = RefusalLog::default();
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
        let admitted = match connections_held.admit(peer) {
            Ok(admitted) => Arc::new(admitted),
            Err(refusal) => {
                refusal_log.refused(peer, refusal);
                if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                    let (limits, acceptor) = (Arc::clone(&limits), acceptor.clone());
                    connections.spawn(async move {
                        refuse(&limits, acceptor, tcp, peer, refusal).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        admitted.enforce_login_deadline();
        let tls = Arc::clone(&tls);
        let mut router = router
            .clone()
            .layer(axum::Extension(Arc::clone(&admitted)))
            .layer(axum::Extension(Arc::new(ConnectionHold::default())));
        if let Ok(address) = tcp.local_addr() {
            router = router.layer(axum::Extension(ServerAddress(address)));
        }
        let handshake_timeout = limits.tls_handshake_timeout;
        // On a thread of its own, the socket moves to that thread's runtime.
        let tcp = match &threads {
            None => Accepted::Here(tcp),
            Some(_) => match tcp.into_std() {
                Ok(tcp) => Accepted::Moving(tcp),
                Err(error) => {
                    tracing::warn!(target: "lockstep::api", %peer, %error, "cannot move the connection to a connection thread");
                    continue;
                }
            },
        };
        let serve = async move {
            let tcp = match tcp.register() {
                Ok(tcp) => tcp,
                Err(error) => {
                    tracing::warn!(target: "lockstep::api", %peer, %error, "cannot register the connection with its thread");
                    return;
                }
            };
            let closed = admitted.ticket.closed.clone();
            // The session is taken from rustls once the handshake is done and carried on by
            // `records`, so that it can move to another process with its socket.
            let handshake = tokio::time::timeout(
                handshake_timeout,
                records::accept(&tls, Metered::new(tcp, &admitted)),
            );
            let stream = tokio::select! {
                handshake = handshake => match handshake {
                    Ok(Ok((io, state))) => match records::Session::new(&state) {
                        Ok(session) => records::RecordStream::new(io, session),
                        Err(error) => {
                            tracing::warn!(target: "lockstep::api", %peer, %error, "TLS session not carried on");
                            return;
                        }
                    },
                    Ok(Err(error)) => {
                        tracing::debug!(target: "lockstep::api", %peer, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        admitted.close(Refusal::TlsHandshakeTimeout);
                        return;
                    }
                },
                () = closed.cancelled() => return,
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            // An upgraded connection is the websocket's from here (it holds the slot).
            drop(admitted);
            tokio::select! {
                served = connection => {
                    if let Err(error) = served {
                        tracing::debug!(target: "lockstep::api", %peer, %error, "connection ended");
                    }
                }
                () = closed.cancelled() => {}
            }
        };
        match &threads {
            None => {
                connections.spawn(serve);
            }
            Some(threads) => threads.spawn(&mut connections, serve),
        }
    }
}

/// An accepted socket: registered with the accepting runtime, or on its way to a
/// connection thread's.
enum Accepted {
    Here(tokio::net::TcpStream),
    Moving(std::net::TcpStream),
}

impl Accepted {
    /// The socket, registered with the runtime this is called on.
    fn register(self) -> std::io::Result<tokio::net::TcpStream> {
        match self {
            Accepted::Here(tcp) => Ok(tcp),
            // `into_std` leaves it non-blocking, as `from_std` needs.
            Accepted::Moving(tcp) => tokio::net::TcpStream::from_std(tcp),
        }
    }
}

/// Closes every connection when the server's future is dropped: websockets run in tasks
/// of their own once upgraded, and end when their slot's token is cancelled.
struct CloseAllOnDrop(Arc<Connections>);

impl Drop for CloseAllOnDrop {
    fn drop(&mut self) {
        self.0.close_all();
    }
}

/// Refusals are logged as a warning at most once per [`REFUSAL_LOG_INTERVAL`], with how
/// many there were since: a flood must not become a flood of log lines.
#[derive(Default)]
struct RefusalLog {
    last: Option<tokio::time::Instant>,
    suppressed: u64,
}

const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl RefusalLog {
    fn refused(&mut self, peer: SocketAddr, refusal: Refusal) {
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL)
        {
            self.suppressed += 1;
            tracing::debug!(target: "lockstep::api", %peer, %refusal, "connection refused");
            return;
        }
        tracing::warn!(
            target: "lockstep::api",
            %peer,
            %refusal,
            refused_since_last_warning = self.suppressed,
            "connection refused: over a limit (see /metrics, lockstep_api_refusals_total)"
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// Tells a connection over a cap why, as HTTP over TLS (a websocket client shows the
/// status and body): `503 Service Unavailable`, `Retry-After`, the limit and its flag.
async fn refuse(
    limits: &ApiLimits,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    refusal: Refusal,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = match refusal {
        Refusal::MaxConnections => format!(
            "lockstep: the controller holds {} connections, its limit (--max-connections)\n",
            limits.connections_max
        ),
        Refusal::MaxPendingConnectionsPerSource => format!(
            "lockstep: {} connections from {} are not logged in yet, the limit per source address (--max-pending-connections-per-source)\n",
            limits.pending_connections_per_source_max,
            peer.ip()
        ),
        _ => format!(
            "lockstep: the controller holds {} connections not logged in yet, its limit (--max-pending-connections)\n",
            limits.pending_connections_max
        ),
    };
    let told = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        let mut tls = acceptor.accept(tcp).await?;
        // Read the request's head first: closing with it unread would reset the
        // connection, and the client might never see the answer.
        let mut head = [0_u8; 4096];
        let mut read = 0;
        while read < head.len() {
            let more = tls.read(&mut head[read..]).await?;
            read += more;
            if more == 0 || head[..read].windows(4).any(|end| end == b"\r\n\r\n") {
                break;
            }
        }
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(response.as_bytes()).await?;
        tls.shutdown().await
    })
    .await;
    if let Ok(Err(error)) = told {
        tracing::debug!(target: "lockstep::api", %peer, %error, "refusal not delivered");
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

/// The client's address of a request relayed by the launcher (`spec/relay.md`), which
/// admitted the connection: the source its HTTP logins are throttled by.
#[derive(Clone, Copy, Debug)]
pub struct RelayedPeer(pub SocketAddr);

/// Where a request came from: its connection's slot, else the launcher's word, else
/// nobody known (the router served without an accept loop).
fn source_of(
    ticket: Option<&crate::admission::Ticket>,
    relayed: Option<RelayedPeer>,
) -> std::net::IpAddr {
    ticket
        .map(|ticket| ticket.peer.ip())
        .or(relayed.map(|RelayedPeer(peer)| peer.ip()))
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

async fn charms(
    State(api): State<Arc<Api>>,
    admitted: Option<axum::Extension<Arc<Admitted>>>,
    relayed: Option<axum::Extension<RelayedPeer>>,
    Path(uuid): Path<String>,
    query: axum::extract::RawQuery,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    let ticket = admitted
        .as_ref()
        .map(|axum::Extension(admitted)| &*admitted.ticket);
    let source = source_of(ticket, relayed.map(|axum::Extension(peer)| peer));
    charms_endpoint::post(
        &api,
        source,
        ticket,
        &uuid,
        query.0.as_deref(),
        &headers,
        body,
    )
    .await
}

async fn websocket(
    State(api): State<Arc<Api>>,
    reached: Option<axum::Extension<ServerAddress>>,
    admitted: Option<axum::Extension<Arc<Admitted>>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let reached = reached.map(|axum::Extension(ServerAddress(address))| address);
    let admitted = admitted.map(|axum::Extension(admitted)| admitted);
    connection::upgrade(api, upgrade, reached, admitted)
}

/// Agent binaries need a login (a user's, or an agent's tag and password), stricter than
/// Juju's anonymous endpoint: see `spec/wire.md`.
async fn tools(
    State(api): State<Arc<Api>>,
    admitted: Option<axum::Extension<Arc<Admitted>>>,
    relayed: Option<axum::Extension<RelayedPeer>>,
    hold: Option<axum::Extension<Arc<ConnectionHold>>>,
    Path((uuid, binary)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Response {
    let (login, tag) = match agents_or_users(&api, admitted, relayed, &headers).await {
        Ok(login) => login,
        Err(refused) => return refused,
    };
    let downloader = match login {
        Login::MachineAgent if fetches_ahead(&api, &tag, &binary).await => Downloader::AgentAhead,
        Login::MachineAgent => Downloader::Agent,
        _ => Downloader::Other,
    };
    api.tools
        .get(
            &api.backend,
            &*api.state,
            &uuid,
            &binary,
            downloader,
            hold.map(|axum::Extension(hold)| hold),
        )
        .await
}

/// A machine agent measures its link (`spec/wire.md`, `GET /model/<uuid>/link-probe`): a
/// login as for the tools endpoint.
async fn link_probe(
    State(api): State<Arc<Api>>,
    admitted: Option<axum::Extension<Arc<Admitted>>>,
    relayed: Option<axum::Extension<RelayedPeer>>,
    Path(uuid): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Err(refused) = agents_or_users(&api, admitted, relayed, &headers).await {
        return refused;
    }
    api.tools.link_probe(&uuid)
}

/// The login of a request to the tools or link-probe endpoint: a user's, or an agent's
/// (`auth::http_login`), from the peer the connection (or the launcher's relay) names.
async fn agents_or_users(
    api: &Api,
    admitted: Option<axum::Extension<Arc<Admitted>>>,
    relayed: Option<axum::Extension<RelayedPeer>>,
    headers: &axum::http::HeaderMap,
) -> Result<(Login, String), Response> {
    let ticket = admitted
        .as_ref()
        .map(|axum::Extension(admitted)| &*admitted.ticket);
    let source = source_of(ticket, relayed.map(|axum::Extension(peer)| peer));
    let who = [Login::User, Login::ControllerAgent, Login::MachineAgent];
    auth::http_login(api, source, ticket, headers, &who).await
}

/// Whether machine agent `tag` asks for `binary` ahead of its admission: a version other
/// than the one `Upgrader.DesiredVersion` tells it to run (a staged rollout's
/// `stage-version`). When that cannot be read, it is not: served as an admitted agent's.
async fn fetches_ahead(api: &Api, tag: &str, binary: &str) -> bool {
    let Ok(binary) = lockstep_core::Binary::parse(binary) else {
        return false;
    };
    let Ok(server_version) = crate::facade::upgrader::server_version(api) else {
        return false;
    };
    let views = api
        .state
        .agent_views(tag, server_version, &[tag.to_owned()])
        .await;
    match views
        .ok()
        .and_then(|views| views.entities.into_iter().next())
    {
        Some(Ok(view)) => view.desired != binary.number,
        _ => false,
    }
}

async fn readyz(State(api): State<Arc<Api>>) -> Response {
    probes::readyz(api.view())
}

/// How long `/metrics` waits for the fleet's gauges (a store read); past it, or when the
/// read fails, they are left out of that scrape rather than holding it.
pub const FLEET_READ_MAX: std::time::Duration = std::time::Duration::from_secs(2);

async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let fleet = match tokio::time::timeout(FLEET_READ_MAX, api.state.fleet()).await {
        Ok(Ok(fleet)) => Some(fleet),
        Ok(Err(error)) => {
            tracing::debug!(target: "lockstep::api", error = %error.message, "/metrics without the fleet's gauges");
            None
        }
        Err(_) => None,
    };
    let view = api.view();
    let counts = api.connections.counts();
    let logins = api.checks.in_progress();
    let downloads = api.tools.agent_downloads_in_flight();
    let waiting = api.tools.agent_downloads_waiting();
    let metrics = api.metrics.lock().expect("not poisoned");
    probes::metrics(
        view,
        &metrics,
        &counts,
        logins,
        probes::FleetGauges {
            fleet: fleet.as_ref(),
            downloads_in_flight: downloads,
            downloads_waiting: waiting,
        },
    )
}
