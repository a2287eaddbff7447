//! How the daemon runs the steps of [`crate::steps`]: database steps through the store
//! (their changes and checkpoint in one transaction), host steps on this machine.

use lockstep_core::lifecycle::{LeaseToken, StepOutcome};
use lockstep_core::steps::StepKey;
use lockstep_core::{Binary, Role};
use lockstep_store::{Abort, Store, StoreError};

use crate::datadir::DataDir;
use crate::steps::{PRUNE_AGENT_BINARIES, RECORD_AGENT_BINARIES};

/// Runs a database step through the store: its changes and its checkpoint in one
/// transaction, fenced on `fence`.
pub fn run_database_step(
    store: &dyn Store,
    key: &StepKey,
    fence: Option<LeaseToken>,
    running: &Binary,
) -> Result<StepOutcome, StoreError> {
    if let Some(outcome) = lockstep_store::seed004::run_step(store, *key, fence)? {
        return Ok(outcome);
    }
    if key.id.as_str() == RECORD_AGENT_BINARIES {
        #[cfg(feature = "failpoints")]
        let pause = crate::daemon::failpoints::database_step_pause();
        tracing::info!(target: "lockstep::agent", step = %key, fenced = fence.is_some(), "running database step");
        return store.run_database_step(*key, fence, &mut |tx| {
            #[cfg(feature = "failpoints")]
            if let Some(pause) = pause {
                tracing::warn!(target: "lockstep::agent", step = %key, pause_ms = pause.as_millis() as u64, "failpoint: pausing inside the step's transaction");
                std::thread::sleep(pause);
            }
            for mut machine in tx.machines()? {
                if machine.roles.contains(Role::Controller)
                    && machine.agent_binary.as_ref() != Some(running)
                {
                    machine.agent_binary = Some(running.clone());
                    tx.put_machine(&machine)?;
                }
            }
            Ok::<(), Abort>(())
        });
    }
    Ok(StepOutcome::Failed(format!(
        "database step {key} is not one this binary knows"
    )))
}

/// What a host step may touch.
#[derive(Clone, Debug)]
pub struct HostContext {
    pub data: DataDir,
    pub tag: String,
    pub running: Binary,
}

/// Runs a host step; `Err` names why it failed (the core retries, bounded).
pub fn run_host_step(context: &HostContext, key: &StepKey) -> Result<(), String> {
    #[cfg(feature = "failpoints")]
    if crate::daemon::failpoints::host_steps_fail() {
        return Err(format!(
            "host step {key} failed: failpoint {} is set",
            crate::daemon::failpoints::FAIL_HOST_STEPS
        ));
    }
    match key.id.as_str() {
        PRUNE_AGENT_BINARIES => prune_agent_binaries(context),
        other => Err(format!("host step {other} is not one this binary knows")),
    }
}

fn prune_agent_binaries(context: &HostContext) -> Result<(), String> {
    let conf = context
        .data
        .read_agent_conf()
        .map_err(|e| e.to_string())?
        .ok_or("agent.conf is missing")?;
    let mut keep = vec![context.running.to_string()];
    if let Some(previous) = conf.snapshot().previous {
        keep.push(previous.to_string());
    }
    if let Some(trial) = conf.snapshot().trial {
        keep.push(trial.binary.to_string());
    }
    if let Ok(Some(current)) = context.data.current_binary(&context.tag) {
        keep.push(current.to_string());
    }
    let tools = context.data.tools_dir();
    let entries =
        std::fs::read_dir(&tools).map_err(|e| format!("cannot list {}: {e}", tools.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", tools.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        // Only unpacked binaries: `<version>-<os>-<arch>` directories.
        if !is_dir || Binary::parse(&name).is_err() || keep.contains(&name) {
            continue;
        }
        std::fs::remove_dir_all(entry.path())
            .map_err(|e| format!("cannot remove {}: {e}", entry.path().display()))?;
        tracing::info!(target: "lockstep::agent", binary = %name, "removed an old agent binary");
    }
    Ok(())
}
