//! The rollout coordinator (`spec/rollout.md`): every controller runs it while Ready; a
//! pass every [`INTERVAL`] reads whether the staged rollout of machine agents has something
//! to write and, if so, writes the core's next record fenced on the coordinator lease
//! ([`crate::api::rollout::coordinate`]). Of several controllers the one holding the lease
//! writes; the others find it held and wait. A coordinator killed mid-rollout loses
//! nothing: its lease expires, and the next controller's pass reads the record and goes on.
//!
//! **Architecture Invariant:** no rollout decision here: the core's `rollout::advance` is
//! the one decision, called through `api::rollout`.

use std::sync::Arc;
use std::time::Duration;

use lockstep_core::Millis;
use lockstep_core::lifecycle::ControllerId;
use lockstep_store::Store;
use tokio::sync::watch;

use crate::api::rollout::{Pass, coordinate};
use crate::daemon::driver::AgentStatus;

/// How often the coordinator looks at the agents' reports.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Runs until aborted: a pass every [`INTERVAL`] while this controller is Ready.
pub async fn run(
    store: Arc<dyn Store>,
    holder: ControllerId,
    lease_ttl: Millis,
    mut status: watch::Receiver<AgentStatus>,
) {
    let mut last_bad_policy = None;
    // The lease this coordinator took and keeps while the rollout goes on.
    let mut held = None;
    loop {
        if status.borrow_and_update().is_ready() {
            let store = Arc::clone(&store);
            let mut token = held;
            let pass = tokio::task::spawn_blocking(move || {
                let pass = coordinate(&*store, holder, lease_ttl, &mut token);
                (pass, token)
            })
            .await
            .map(|(pass, token)| {
                held = token;
                pass
            });
            match pass {
                Ok(Ok(Pass::Written(record))) => {
                    tracing::info!(
                        target: "lockstep::rollout",
                        target_version = %record.target,
                        admitted = record.admitted.len(),
                        canaries = record.canaries.len(),
                        canaries_passed = record.canaries_passed,
                        failed = record.failed.len(),
                        halted = record.halted.is_some(),
                        "rollout record written"
                    );
                    if let Some(halt) = &record.halted {
                        for (machine, reason) in &halt.failed {
                            tracing::warn!(target: "lockstep::rollout", %machine, %reason, target_version = %record.target, "rollout halted: machine agent failed");
                        }
                    }
                    last_bad_policy = None;
                }
                Ok(Ok(Pass::BadPolicy(error))) => {
                    let text = error.to_string();
                    if last_bad_policy.as_ref() != Some(&text) {
                        tracing::warn!(target: "lockstep::rollout", error = %text, "no rollout pass: the model's rollout config is not valid; set it again");
                        last_bad_policy = Some(text);
                    }
                }
                Ok(Ok(Pass::Idle | Pass::NotCoordinator)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(target: "lockstep::rollout", %error, "rollout pass failed; trying again");
                }
                Err(error) => {
                    tracing::warn!(target: "lockstep::rollout", %error, "rollout pass panicked; trying again");
                }
            }
        }
        let _ = tokio::time::timeout(INTERVAL, status.changed()).await;
    }
}
