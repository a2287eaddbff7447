//! lockstep's own API client: it rides through upgrades instead of failing.
//!
//! Every decision (retry or not, how long to wait, reconnect, where a watcher resumes,
//! which `operation-id` a call carries) is made by [`lockstep_core::client`], the same code
//! the simulator runs; this module does the I/O: TLS websockets, replies matched to
//! requests by id, reconnecting and logging in again.
//!
//! - [`Client::call`] retries `upgrade in progress` (honouring the server's retry-after)
//!   and disconnects until the caller's deadline, then fails naming the phase it was stuck
//!   in.
//! - [`Client::wait_ready`] waits for Ready by `Upgrade.WatchProgress` (no polling delay
//!   of its own), falling back to retrying a call outside the allow-list on a server
//!   without that facade.
//! - [`Client::mutate`] gives each mutating call one `operation-id` for all its retries,
//!   so it is applied exactly once even across a restart of the agent.
//! - [`Watcher`] resumes from the last revision it delivered after a reconnect: every
//!   change once, in order.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lockstep_core::client::{
    Attempt, Call, Connect, Decision, Failover, GiveUp, OperationIds, RetryPolicy, WatchPosition,
};
use lockstep_core::lifecycle::Revision;
use lockstep_core::{Millis, Phase, Timestamp};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Where and as whom to connect.
#[derive(Clone)]
pub struct ClientConfig {
    /// `host:port` of the controller's API.
    pub address: String,
    /// The other controllers' API addresses (highly available controllers serve one model):
    /// when a connection to one cannot be made, the next connect tries the next, in turn.
    pub fallback_addresses: Vec<String>,
    /// The controller's CA, as handed out at bootstrap.
    pub ca_pem: String,
    pub model_uuid: Option<String>,
    /// A user's name (`admin`), or a machine agent's tag (`machine-1`): see [`auth_tag`].
    pub user: String,
    pub password: String,
    pub retry: RetryPolicy,
    /// A name unique to this client (e.g. 128 random bits in hex): the prefix of its
    /// `operation-id`s and the seed of its jitter.
    pub client_id: String,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("address", &self.address)
            .field("fallback_addresses", &self.fallback_addresses)
            .field("user", &self.user)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// The `auth-tag` a client logs in with: an agent's tag (`machine-1`) as it is, a user's
/// name (`admin`) as Juju's user tag (`user-admin`).
pub fn auth_tag(user: &str) -> String {
    let is_agent = user
        .strip_prefix("machine-")
        .is_some_and(|id| !id.is_empty());
    if is_agent || user.starts_with("user-") {
        user.to_owned()
    } else {
        format!("user-{user}")
    }
}

/// The read buffer of the client's websocket: one TLS record's plaintext. tungstenite zeroes
/// its whole read buffer before every read, so its default (128 KiB) costs a few
/// microseconds per reply; a larger reply takes more reads, not a larger buffer.
pub const READ_BUFFER_BYTES: usize = 16 << 10;

/// The client's websocket settings: tungstenite's defaults, but a read buffer of
/// [`READ_BUFFER_BYTES`].
pub fn websocket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    let mut config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    config.read_buffer_size = READ_BUFFER_BYTES;
    config
}

/// A call that did not succeed.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientError {
    /// The server answered with an error that retrying cannot fix.
    Api {
        code: String,
        message: String,
        info: Option<Value>,
    },
    /// The deadline passed (or the attempt bound) while the agent was upgrading or
    /// unreachable; says which.
    GaveUp(GiveUp),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Api { code, message, .. } if code.is_empty() => f.write_str(message),
            ClientError::Api { code, message, .. } => write!(f, "{message} (code {code})"),
            ClientError::GaveUp(give_up) => give_up.fmt(f),
        }
    }
}

impl std::error::Error for ClientError {}

/// One websocket connection: a writer, a reader that hands each reply to its caller.
struct Connection {
    outgoing: mpsc::Sender<Message>,
    /// Cleared by the reader when the socket closes.
    alive: Arc<std::sync::atomic::AtomicBool>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    generation: u64,
    /// The reader and writer: owned here so they end when the connection is dropped.
    _tasks: tokio::task::JoinSet<()>,
}

impl Connection {
    async fn open(
        config: &ClientConfig,
        address: &str,
        generation: u64,
    ) -> Result<Connection, String> {
        let tls = crate::tls::client_config(
            &config.ca_pem,
            &[&rustls::version::TLS13, &rustls::version::TLS12],
        )
        .map_err(|error| error.to_string())?;
        let tcp = TcpStream::connect(address)
            .await
            .map_err(|error| format!("connecting to {address}: {error}"))?;
        let _ = tcp.set_nodelay(true);
        let name = rustls::pki_types::ServerName::try_from("juju-apiserver").expect("a valid name");
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|error| format!("TLS with {address}: {error}"))?;
        let path = match &config.model_uuid {
            Some(uuid) => format!("/model/{uuid}/api"),
            None => "/api".to_owned(),
        };
        let (socket, _) = tokio_tungstenite::client_async_with_config(
            format!("wss://{address}{path}"),
            stream,
            Some(websocket_config()),
        )
        .await
        .map_err(|error| format!("websocket with {address}: {error}"))?;
        let (mut sink, mut stream) = socket.split();
        let (outgoing, mut queued) = mpsc::channel::<Message>(64);
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            while let Some(message) = queued.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        });
        let replies = Arc::clone(&pending);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let reader_alive = Arc::clone(&alive);
        tasks.spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let Ok(reply) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let Some(id) = reply["request-id"].as_u64() else {
                    continue;
                };
                if let Some(waiter) = replies.lock().expect("not poisoned").remove(&id) {
                    let _ = waiter.send(reply);
                }
            }
            // Closed: every caller still waiting learns it was disconnected, and so does any
            // caller that registers from now on (it checks `alive` after registering).
            reader_alive.store(false, Ordering::SeqCst);
            replies.lock().expect("not poisoned").clear();
        });
        Ok(Connection {
            outgoing,
            alive,
            pending,
            generation,
            _tasks: tasks,
        })
    }

    /// Sends one request and waits for its reply; `Err` when the connection went away.
    async fn request(
        &self,
        id: u64,
        facade: &str,
        version: u32,
        object: &str,
        method: &str,
        params: &Value,
    ) -> Result<Value, ()> {
        let (sender, receiver) = oneshot::channel();
        self.pending
            .lock()
            .expect("not poisoned")
            .insert(id, sender);
        if !self.alive.load(Ordering::SeqCst) {
            self.pending.lock().expect("not poisoned").remove(&id);
            return Err(());
        }
        let frame = json!({"request-id": id, "type": facade, "version": version, "id": object,
                           "request": method, "params": params});
        if self
            .outgoing
            .send(Message::Text(frame.to_string().into()))
            .await
            .is_err()
        {
            return Err(());
        }
        receiver.await.map_err(|_| ())
    }
}

/// The client. Cheap to share: calls may run concurrently over its one connection.
pub struct Client {
    config: ClientConfig,
    /// Which of `address` and then `fallback_addresses` the next connect tries: the core's
    /// decision ([`Failover`]: it moves on only when a connect fails or times out, so a
    /// client stays with a controller that answers).
    failover: Mutex<Failover>,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    generations: AtomicU64,
    request_ids: AtomicU64,
    operations: Mutex<OperationIds>,
    jitter: Mutex<u64>,
    stats: ClientStatsCounters,
}

/// What a client went through: attempts the gate turned away and attempts that found the
/// connection gone, each retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Attempts answered `upgrade in progress`, then retried.
    pub upgrade_in_progress: u64,
    /// Attempts that found the connection closed (or could not connect), then retried.
    pub disconnected: u64,
}

#[derive(Debug, Default)]
struct ClientStatsCounters {
    upgrade_in_progress: AtomicU64,
    disconnected: AtomicU64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A call's outcome before the decision: the reply, or a disconnect.
enum Sent {
    Reply(Value),
    Disconnected,
}

impl Client {
    /// A client; it connects on its first call.
    pub fn new(config: ClientConfig) -> Client {
        let seed = config
            .client_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
            });
        Client {
            operations: Mutex::new(OperationIds::new(config.client_id.clone())),
            failover: Mutex::new(Failover::new(1 + config.fallback_addresses.len())),
            config,
            connection: tokio::sync::Mutex::new(None),
            generations: AtomicU64::new(1),
            request_ids: AtomicU64::new(1),
            jitter: Mutex::new(seed | 1),
            stats: ClientStatsCounters::default(),
        }
    }

    /// A draw in `0..=1000` for the decisions' jitter (xorshift; not for secrets).
    fn jitter(&self) -> u16 {
        let mut state = self.jitter.lock().expect("not poisoned");
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state % 1001) as u16
    }

    /// The current connection, opening one (and logging in) if there is none.
    async fn connected(&self) -> Result<Arc<Connection>, ()> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = &*slot
            && connection.alive.load(Ordering::SeqCst)
        {
            return Ok(Arc::clone(connection));
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let address = self.address();
        let connect_timeout = Duration::from_millis(Failover::CONNECT_TIMEOUT.0);
        let (opened, ended) = match tokio::time::timeout(
            connect_timeout,
            Connection::open(&self.config, address, generation),
        )
        .await
        {
            Ok(Ok(connection)) => (Ok(connection), Connect::Opened),
            Ok(Err(error)) => (Err(error), Connect::Failed),
            Err(_) => (
                Err(format!(
                    "connecting to {address}: no answer in {connect_timeout:?}"
                )),
                Connect::TimedOut,
            ),
        };
        self.failover
            .lock()
            .expect("not poisoned")
            .connect_ended(ended);
        let connection = Arc::new(opened.map_err(|error| {
            tracing::debug!(target: "lockstep::client", %error, "connect failed");
        })?);
        let login = json!({"auth-tag": auth_tag(&self.config.user), "credentials": self.config.password,
                           "client-version": crate::wire::SERVER_VERSION});
        let id = self.request_ids.fetch_add(1, Ordering::Relaxed);
        let reply = connection
            .request(id, "Admin", 3, "", "Login", &login)
            .await?;
        if reply.get("error").is_some() {
            tracing::warn!(target: "lockstep::client", reply = %reply, "login refused");
            return Err(());
        }
        *slot = Some(Arc::clone(&connection));
        Ok(connection)
    }

    async fn forget(&self, generation: u64) {
        let mut slot = self.connection.lock().await;
        if slot
            .as_ref()
            .is_some_and(|connection| connection.generation == generation)
        {
            *slot = None;
        }
    }

    async fn send(
        &self,
        facade: &str,
        version: u32,
        object: &str,
        method: &str,
        params: &Value,
    ) -> (Sent, u64) {
        let Ok(connection) = self.connected().await else {
            return (Sent::Disconnected, 0);
        };
        let id = self.request_ids.fetch_add(1, Ordering::Relaxed);
        match connection
            .request(id, facade, version, object, method, params)
            .await
        {
            Ok(reply) => (Sent::Reply(reply), connection.generation),
            Err(()) => {
                self.forget(connection.generation).await;
                (Sent::Disconnected, connection.generation)
            }
        }
    }

    /// A call, retried through upgrades and disconnects until `deadline` from now.
    pub async fn call(
        &self,
        facade: &str,
        version: u32,
        method: &str,
        params: Value,
        deadline: Duration,
    ) -> Result<Value, ClientError> {
        self.call_on(facade, version, "", method, params, deadline)
            .await
            .map(|(response, _)| response)
    }

    /// A mutating call: it carries one `operation-id` for all its retries, so the store
    /// applies it exactly once, even if the agent restarted between an attempt and its
    /// answer.
    pub async fn mutate(
        &self,
        facade: &str,
        version: u32,
        method: &str,
        mut params: Value,
        deadline: Duration,
    ) -> Result<Value, ClientError> {
        let id = self.operations.lock().expect("not poisoned").next_id();
        params["operation-id"] = json!(id);
        self.call(facade, version, method, params, deadline).await
    }

    /// A call on an object the server made (a watcher: `NotifyWatcher.Next` with the
    /// watcher's id as the request's `id`), retried like [`Client::call`]. The id is the
    /// server's: after a reconnect the server may no longer know it and answers `not found`.
    pub async fn call_object(
        &self,
        facade: &str,
        version: u32,
        object: &str,
        method: &str,
        params: Value,
        deadline: Duration,
    ) -> Result<Value, ClientError> {
        self.call_on(facade, version, object, method, params, deadline)
            .await
            .map(|(response, _)| response)
    }

    async fn call_on(
        &self,
        facade: &str,
        version: u32,
        object: &str,
        method: &str,
        params: Value,
        deadline: Duration,
    ) -> Result<(Value, u64), ClientError> {
        let started = Instant::now();
        let elapsed = || Timestamp(started.elapsed().as_millis() as u64);
        let mut call = Call::new(Timestamp(0), Timestamp(deadline.as_millis() as u64));
        loop {
            // An attempt never outlives the call's deadline, even if the server never answers.
            let left = deadline.saturating_sub(started.elapsed());
            let Ok((sent, generation)) =
                tokio::time::timeout(left, self.send(facade, version, object, method, &params))
                    .await
            else {
                return Err(ClientError::GaveUp(GiveUp {
                    phase: None,
                    disconnected: false,
                    attempts: call.attempts() + 1,
                    waited: Millis(started.elapsed().as_millis() as u64),
                }));
            };
            let (attempt, reply) = match sent {
                Sent::Disconnected => (Attempt::Disconnected, None),
                Sent::Reply(reply) if reply["error-code"] == "upgrade in progress" => {
                    let info = &reply["error-info"];
                    let phase = info["phase"]
                        .as_str()
                        .and_then(|text| serde_json::from_value(json!(text)).ok());
                    let retry_after = info["retry-after-ms"].as_u64().map(Millis);
                    (
                        Attempt::UpgradeInProgress { phase, retry_after },
                        Some(reply),
                    )
                }
                Sent::Reply(reply) => (Attempt::Answered, Some(reply)),
            };
            match call.decide(&self.config.retry, elapsed(), attempt, self.jitter()) {
                Decision::Finish => {
                    let reply = reply.expect("answered");
                    if let Some(message) = reply.get("error").and_then(Value::as_str) {
                        return Err(ClientError::Api {
                            code: reply["error-code"].as_str().unwrap_or_default().to_owned(),
                            message: message.to_owned(),
                            info: reply.get("error-info").cloned(),
                        });
                    }
                    return Ok((reply["response"].clone(), generation));
                }
                Decision::Retry { wait } | Decision::Reconnect { wait } => {
                    let counter = match attempt {
                        Attempt::UpgradeInProgress { .. } => &self.stats.upgrade_in_progress,
                        _ => &self.stats.disconnected,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(target: "lockstep::client", facade, method, wait_ms = wait.0, "retrying");
                    tokio::time::sleep(Duration::from_millis(wait.0)).await;
                }
                Decision::GiveUp(give_up) => return Err(ClientError::GaveUp(give_up)),
            }
        }
    }

    /// The controller address this client is connected to, or tries next: `address`, or
    /// the fallback the core's [`Failover`] moved to after a connect failed.
    pub fn address(&self) -> &str {
        let index = self.failover.lock().expect("not poisoned").address();
        match index {
            0 => &self.config.address,
            n => &self.config.fallback_addresses[n - 1],
        }
    }

    /// Retries so far, by cause.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            upgrade_in_progress: self.stats.upgrade_in_progress.load(Ordering::Relaxed),
            disconnected: self.stats.disconnected.load(Ordering::Relaxed),
        }
    }

    /// Waits until the agent is Ready, by `Upgrade.WatchProgress`: each call answers as
    /// soon as the phase changes, so the client proceeds within a round trip of Ready.
    /// Returns the phases it saw on the way.
    pub async fn wait_ready(&self, deadline: Duration) -> Result<Vec<Phase>, ClientError> {
        let started = Instant::now();
        let mut seen: Vec<Phase> = Vec::new();
        let mut last = json!({});
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            match self
                .call("Upgrade", 1, "WatchProgress", last.clone(), left)
                .await
            {
                Ok(progress) => {
                    if let Some(phase) = progress["phase"]
                        .as_str()
                        .and_then(|text| serde_json::from_value::<Phase>(json!(text)).ok())
                        && seen.last() != Some(&phase)
                    {
                        seen.push(phase);
                    }
                    if progress["ready"] == true {
                        return Ok(seen);
                    }
                    last = json!({"phase": progress["phase"], "step": progress["step"]});
                    if started.elapsed() >= deadline {
                        let phase = seen.last().copied();
                        return Err(ClientError::GaveUp(GiveUp {
                            phase,
                            disconnected: false,
                            attempts: seen.len() as u32,
                            waited: Millis(started.elapsed().as_millis() as u64),
                        }));
                    }
                }
                // A server without the Upgrade facade (Juju): a call outside the
                // allow-list is refused until Ready, and `call` retries it.
                Err(ClientError::Api { code, .. }) if code == "not implemented" => {
                    self.call("ModelConfig", 3, "ModelGet", json!({}), left)
                        .await?;
                    return Ok(seen);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// A watcher of every change in the model, resuming across reconnects.
    pub fn watch(&self) -> Watcher<'_> {
        Watcher {
            client: self,
            position: WatchPosition::new(),
            watcher: None,
        }
    }
}

pub use crate::wire::Delta;

/// An AllWatcher that survives the agent restarting.
#[derive(Debug)]
pub struct Watcher<'a> {
    client: &'a Client,
    position: WatchPosition,
    /// The server-side watcher id and the connection it belongs to.
    watcher: Option<(String, u64)>,
}

impl Watcher<'_> {
    /// The next changes, each delivered once and in order. The first call returns the whole
    /// state (as Juju's first `Next` does); after a reconnect the watcher resumes after the
    /// last revision it delivered. Waits at most `deadline` in all.
    pub async fn next(&mut self, deadline: Duration) -> Result<Vec<Delta>, ClientError> {
        let started = Instant::now();
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            let (id, generation) = match self.watcher.clone() {
                Some(watcher) => watcher,
                None => {
                    let params = match self.position.resume_after() {
                        Some(revision) => json!({"after-revision": revision.0}),
                        None => json!({}),
                    };
                    let (response, generation) = self
                        .client
                        .call_on("Client", 8, "", "WatchAll", params, left)
                        .await?;
                    let id = response["watcher-id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    self.watcher = Some((id.clone(), generation));
                    (id, generation)
                }
            };
            let fresh = self.position.resume_after().is_none();
            match self
                .client
                .call_on("AllWatcher", 3, &id, "Next", json!({}), left)
                .await
            {
                Ok((response, answered_on)) if answered_on == generation => {
                    let deltas = response["deltas"].as_array().cloned().unwrap_or_default();
                    let revisions = response["revisions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let mut delivered = Vec::new();
                    for (delta, revision) in deltas.into_iter().zip(revisions) {
                        let revision = Revision(revision.as_u64().unwrap_or_default());
                        // The whole-state snapshot shares one revision: deliver all of it.
                        if fresh || self.position.accept(revision) {
                            delivered.push(Delta { revision, delta });
                        }
                    }
                    if let Some(reached) = response["revision"].as_u64() {
                        self.position.reached(Revision(reached));
                    }
                    if !delivered.is_empty() {
                        return Ok(delivered);
                    }
                }
                // Answered on a newer connection: the watcher id belonged to the old one.
                Ok(_) => self.watcher = None,
                Err(ClientError::Api { code, .. }) if code == "not found" || code == "stopped" => {
                    self.watcher = None
                }
                Err(ClientError::Api { code, .. }) if code == "resync needed" => {
                    self.position.resync();
                    self.watcher = None;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The revision to resume after (what has been delivered).
    pub fn position(&self) -> Option<Revision> {
        self.position.resume_after()
    }
}

#[cfg(test)]
mod tests {
    use super::auth_tag;

    #[test]
    fn a_machine_agents_tag_logs_in_as_it_is_and_a_user_name_as_a_user_tag() {
        assert_eq!(auth_tag("machine-1"), "machine-1");
        assert_eq!(auth_tag("admin"), "user-admin");
        assert_eq!(auth_tag("user-admin"), "user-admin");
        // Not a tag: a user may be called so.
        assert_eq!(auth_tag("machine-"), "user-machine-");
    }
}
