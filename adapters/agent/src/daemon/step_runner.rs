//! How the daemon runs the steps of [`crate::steps`]: database steps through the store
//! (their changes and checkpoint in one transaction), host steps on this machine.

use lockstep_core::lifecycle::{LeaseToken, StepOutcome};
use lockstep_core::steps::StepKey;
use lockstep_core::{Binary, Role};
use lockstep_store::{Abort, Store, StoreError};

use crate::datadir::{DataDir, DataDirError};
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

/// Why a host step failed. The core is told (`StepOutcome::Failed`, its text) and retries,
/// bounded.
#[derive(Debug, thiserror::Error)]
pub enum HostStepError {
    /// A step id this build does not carry.
    #[error("host step {key} is not one this binary knows")]
    Unknown { key: StepKey },
    /// The data directory could not be read or changed.
    #[error("host step {key}: {error}")]
    DataDir {
        key: StepKey,
        #[source]
        error: Box<DataDirError>,
    },
    /// The failpoint `LOCKSTEPD_FAILPOINT_HOST_STEPS` is set (test builds only).
    #[cfg(feature = "failpoints")]
    #[error("host step {key} failed: failpoint {variable} is set")]
    Failpoint {
        key: StepKey,
        variable: &'static str,
    },
}

/// Runs a host step; `Err` names why it failed (the core retries, bounded).
pub fn run_host_step(context: &HostContext, key: &StepKey) -> Result<(), HostStepError> {
    #[cfg(feature = "failpoints")]
    if crate::daemon::failpoints::host_steps_fail() {
        return Err(HostStepError::Failpoint {
            key: *key,
            variable: crate::daemon::failpoints::FAIL_HOST_STEPS,
        });
    }
    match key.id.as_str() {
        PRUNE_AGENT_BINARIES => {
            prune_agent_binaries(context).map_err(|error| HostStepError::DataDir {
                key: *key,
                error: Box::new(error),
            })
        }
        _ => Err(HostStepError::Unknown { key: *key }),
    }
}

fn prune_agent_binaries(context: &HostContext) -> Result<(), DataDirError> {
    let conf = context
        .data
        .read_agent_conf()?
        .ok_or_else(|| DataDirError::Missing {
            path: context.data.agent_conf_path(),
            hint: "the agent cannot run without it; restore it from a backup".into(),
        })?;
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
    let entries = std::fs::read_dir(&tools).map_err(DataDirError::io(&tools, "list"))?;
    for entry in entries {
        let entry = entry.map_err(DataDirError::io(&tools, "list"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        // Only unpacked binaries: `<version>-<os>-<arch>` directories.
        if !is_dir || Binary::parse(&name).is_err() || keep.contains(&name) {
            continue;
        }
        let path = entry.path();
        std::fs::remove_dir_all(&path).map_err(DataDirError::io(&path, "remove"))?;
        tracing::info!(target: "lockstep::agent", binary = %name, "removed an old agent binary");
    }
    Ok(())
}
