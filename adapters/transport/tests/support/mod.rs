//! A server on 127.0.0.1 with a free port, its gate driven by the test, and an in-memory
//! backend. Stopped when the fixture is dropped.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockstep_core::gate::GateView;
use lockstep_core::{Millis, Phase, Progress, Version};
use lockstep_transport::server::{Api, ApiConfig, Backend, hash_password};
use lockstep_transport::tls::Credentials;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub const MODEL_UUID: &str = "deadbeef-0000-4000-8000-000000000001";
pub const PASSWORD: &str = "s3cret";

pub struct TestBackend {
    pub aborts: AtomicUsize,
}

impl Backend for TestBackend {
    fn full_status(&self, gate: &GateView) -> Value {
        json!({"model": {"name": "controller", "type": "iaas", "cloud-tag": "cloud-localhost",
                         "version": "2.9.43", "model-status": {"status": "available"},
                         "lockstep": {"phase": gate.phase.as_str()}},
               "machines": {}, "applications": {}, "relations": [], "controller-timestamp": "2026-12-02T00:00:00Z"})
    }
    fn model_config(&self) -> Value {
        json!({"config": {"agent-version": {"value": "2.9.43", "source": "model"}}})
    }
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
    pub server: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
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
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (gate, gate_view) = watch::channel(view(phase));
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
        server,
    }
}
