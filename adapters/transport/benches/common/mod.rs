//! What the transport benches share: a backend with no lifecycle behind it, the tests'
//! in-memory shared state, and a gate view.

#[allow(dead_code)]
#[path = "../../tests/support/state.rs"]
mod state;

use std::sync::Arc;

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
