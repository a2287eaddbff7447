//! What the transport benches share: a backend with no lifecycle behind it, the tests'
//! in-memory shared state, and a gate view.

#[allow(dead_code)]
#[path = "../../tests/support/state.rs"]
mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lockstep_transport::tls::client_config;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use async_trait::async_trait;
use lockstep_core::Version;
use lockstep_core::gate::GateView;
use lockstep_core::policy::{Catalogue, CatalogueEntry};
use lockstep_core::{Millis, Phase, Progress};
use lockstep_transport::backend::Backend;
use lockstep_transport::state::ModelConfig;
pub use state::FakeState;

/// A backend whose lifecycle never upgrades.
pub struct Idle;

#[async_trait]
impl Backend for Idle {
    async fn versions_to_keep(&self) -> Vec<Version> {
        Vec::new()
    }
    fn abort_current_upgrade(&self) -> Result<(), String> {
        Ok(())
    }
    fn agent_version(&self) -> String {
        "0.1.0".into()
    }
    fn upgrade_available(&self) -> Option<String> {
        None
    }
    fn agent_version_changed(&self, _version: Version) {}
    async fn catalogue(&self) -> Result<Catalogue, String> {
        Ok(Catalogue::default())
    }
    async fn fetch_binary(
        &self,
        entry: CatalogueEntry,
        _destination: std::path::PathBuf,
    ) -> Result<(), String> {
        Err(format!("the bench backend has no {}", entry.binary))
    }
}

pub fn view(phase: Phase) -> GateView {
    GateView {
        phase,
        progress: Progress::default(),
        retry_after: Millis(1000),
    }
}

/// A controller's state holding its model `bench` only.
pub fn state() -> Arc<FakeState> {
    Arc::new(FakeState::new(ModelConfig {
        name: "bench".into(),
        uuid: "bench".into(),
        agent_version: Version::new(0, 1, 0),
        agent_stream: None,
        agent_metadata_url: None,
        settings: serde_json::Map::new(),
    }))
}

/// One client on 127.0.0.1:`port`: TLS 1.3, the websocket at `/api`, a login as `admin`
/// (password `bench`), then `calls` sequential `Pinger.Ping`, each reply checked after its
/// round trip was timed. The round trips.
#[allow(dead_code)]
pub async fn ping_client(port: u16, ca: &str, calls: usize) -> Vec<Duration> {
    ping_client_after(port, ca, calls, None).await
}

/// [`ping_client`], whose calls start once every client holding `logged_in` has logged in
/// (so that what is measured around the calls leaves the logins' argon2 checks out).
#[allow(dead_code)]
pub async fn ping_client_after(
    port: u16,
    ca: &str,
    calls: usize,
    logged_in_barrier: Option<std::sync::Arc<tokio::sync::Barrier>>,
) -> Vec<Duration> {
    let connector =
        tokio_rustls::TlsConnector::from(client_config(ca, &[&rustls::version::TLS13]).unwrap());
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    let url = format!("wss://localhost:{port}/api");
    // lockstep's own client's settings.
    let config = lockstep_transport::client::websocket_config();
    let (mut socket, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(config))
        .await
        .unwrap();
    let login = json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
                       "params": {"auth-tag": "user-admin", "credentials": "bench"}});
    socket
        .send(Message::Text(login.to_string().into()))
        .await
        .unwrap();
    let logged_in: Value = loop {
        if let Message::Text(text) = socket.next().await.unwrap().unwrap() {
            break serde_json::from_str(&text).unwrap();
        }
    };
    assert!(
        logged_in["response"]["server-version"].is_string(),
        "{logged_in}"
    );
    if let Some(everyone) = logged_in_barrier {
        everyone.wait().await;
    }
    let mut durations = Vec::with_capacity(calls);
    for id in 2..calls + 2 {
        let ping = json!({"request-id": id, "type": "Pinger", "version": 1, "request": "Ping"});
        let started = Instant::now();
        socket
            .send(Message::Text(ping.to_string().into()))
            .await
            .unwrap();
        let (text, elapsed) = loop {
            if let Message::Text(text) = socket.next().await.unwrap().unwrap() {
                break (text, started.elapsed());
            }
        };
        durations.push(elapsed);
        // Checked after the clock stopped: the check is not the server's time.
        let reply: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reply["request-id"], id, "{reply}");
        assert!(reply.get("error").is_none(), "{reply}");
    }
    durations
}

#[allow(dead_code)]
pub fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

/// The benches' API: model and controller `bench`, one user `admin` (password `bench`),
/// the default limits, over [`state`] and [`Idle`], its gate read from `gate`.
#[allow(dead_code)]
pub fn api(gate: tokio::sync::watch::Receiver<GateView>) -> Arc<lockstep_transport::server::Api> {
    use lockstep_transport::server::{Api, ApiConfig, hash_password};
    Api::new(
        ApiConfig {
            model_uuid: "bench".into(),
            controller_uuid: "bench".into(),
            users: vec![("admin".into(), hash_password("bench"))],
            ..ApiConfig::default()
        },
        gate,
        state(),
        Arc::new(Idle),
    )
}
