//! What the transport benches share: a backend with no lifecycle behind it, and a gate view.

use lockstep_core::gate::GateView;
use lockstep_core::{Millis, Phase, Progress};
use lockstep_transport::server::Backend;

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
}

pub fn view(phase: Phase) -> GateView {
    GateView {
        phase,
        progress: Progress::default(),
        retry_after: Millis(1000),
    }
}
