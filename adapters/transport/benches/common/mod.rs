//! What the transport benches share: a backend with no lifecycle behind it, and a gate view.

use lockstep_core::Version;
use lockstep_core::gate::GateView;
use lockstep_core::policy::{Catalogue, CatalogueEntry};
use lockstep_core::{Millis, Phase, Progress};
use lockstep_transport::server::{Backend, BackendFuture};

/// A backend whose lifecycle never upgrades.
pub struct Idle;

impl Backend for Idle {
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
    fn catalogue(&self) -> BackendFuture<'_, Result<Catalogue, String>> {
        Box::pin(async { Ok(Catalogue::default()) })
    }
    fn fetch_binary(
        &self,
        entry: CatalogueEntry,
        _destination: std::path::PathBuf,
    ) -> BackendFuture<'_, Result<(), String>> {
        Box::pin(async move { Err(format!("the bench backend has no {}", entry.binary)) })
    }
}

pub fn view(phase: Phase) -> GateView {
    GateView {
        phase,
        progress: Progress::default(),
        retry_after: Millis(1000),
    }
}
