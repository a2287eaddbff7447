//! The lifecycle's side of the API: what the shared state does not hold (the agent's own
//! version, the catalogue of agent binaries, an operator's abort, the lifecycle's status).
//! The agent implements [`Backend`] over its driver; tests implement it in memory.

use std::path::PathBuf;

use async_trait::async_trait;
use lockstep_core::Version;
use lockstep_core::gate::GateView;
use lockstep_core::policy::{Catalogue, CatalogueEntry};

/// The lifecycle's side of the API. Object-safe: the server holds an `Arc<dyn Backend>`.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `Client.AbortCurrentUpgrade`: an operator's abort, fed to the lifecycle.
    fn abort_current_upgrade(&self) -> Result<(), String>;
    /// The agent's own version, for status and `Upgrade.Status`.
    fn agent_version(&self) -> String;
    /// The newest patch available (`upgrade-available`), if any.
    fn upgrade_available(&self) -> Option<String>;
    /// `ModelConfig.ModelSet` changed the model's agent-version (already written to the
    /// shared state).
    fn agent_version_changed(&self, version: Version);
    /// The agent binaries the controller knows of (for `Client.FindTools`, `ModelSet`'s
    /// check, `Upgrader.Tools` and the tools endpoint); `Err` names why none could be read.
    /// Asked on every such call and download, so it should answer from what the agent
    /// already holds rather than go to the streams each time.
    async fn catalogue(&self) -> Result<Catalogue, String>;
    /// Fetches one binary of the catalogue into `destination` (verified: size and sha256),
    /// for the tools endpoint. The server hands a temporary path in its cache directory and
    /// renames it into place only after `Ok`; it asks at most once at a time per binary.
    async fn fetch_binary(&self, entry: CatalogueEntry, destination: PathBuf)
    -> Result<(), String>;
    /// The versions whose binaries the tools endpoint's cache keeps: the one this agent
    /// runs, the one it would fall back to, and the model's target. The cache drops the
    /// others before it fetches a new binary.
    async fn versions_to_keep(&self) -> Vec<Version>;
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

/// The lifecycle's side of `Client.FullStatus` and `ModelManager.ModelInfo`: the phase as
/// the gate sees it, the agent's own version and the newest patch available.
#[derive(Clone, Debug)]
pub struct LifecycleStatus {
    pub gate: GateView,
    pub agent_version: String,
    pub upgrade_available: Option<String>,
}

impl LifecycleStatus {
    /// The lifecycle's status now: `gate` as published, the rest from `backend`.
    pub fn of(backend: &dyn Backend, gate: GateView) -> LifecycleStatus {
        LifecycleStatus {
            gate,
            agent_version: backend.agent_version(),
            upgrade_available: backend.upgrade_available(),
        }
    }
}
