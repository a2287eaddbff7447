//! The local provider's machine agents: a `lockstepd` per machine on the controller's own
//! host, in `<controller data dir>/machines/machine-<id>/`, running the controller's current
//! binary. Started by `lockstep add-machine` (manual provisioning, [`crate::cli::machines`])
//! or by the controller's own provisioner ([`crate::daemon::provisioner`]); both end here,
//! once the agent's `agent.conf` is written.

use lockstep_core::Binary;

use crate::datadir::{self, DataDir, DataDirError};

/// Why a machine agent could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalAgentError {
    #[error("the controller in {} runs no binary (tools/{tag} is missing)", data_dir.display())]
    NoCurrentBinary {
        data_dir: std::path::PathBuf,
        tag: String,
    },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
}

/// A machine agent started.
#[derive(Debug)]
pub struct StartedAgent {
    /// The binary it runs: the controller's current one.
    pub binary: Binary,
    /// Its launcher's pid.
    pub pid: u32,
}

/// Starts the agent of machine `id` on `agent` (its `agent.conf` written): the binary the
/// controller tagged `controller_tag` in `primary` runs now is installed in the agent's
/// `tools/` (a build forced to a version keeps its force file), linked as
/// `tools/machine-<id>`, and `lockstepd` started detached on the agent's data dir.
pub fn start(
    primary: &DataDir,
    controller_tag: &str,
    agent: &DataDir,
    id: &str,
) -> Result<StartedAgent, LocalAgentError> {
    let binary = primary.current_binary(controller_tag)?.ok_or_else(|| {
        LocalAgentError::NoCurrentBinary {
            data_dir: primary.root().to_path_buf(),
            tag: controller_tag.to_owned(),
        }
    })?;
    let binary_dir = primary.binary_dir(&binary);
    let forced = datadir::read_force_version(&binary_dir)?.is_some();
    agent.create_layout()?;
    agent.install_local_binary(&binary, &binary_dir.join("lockstepd"), forced)?;
    agent.switch_to(&lockstep_store::machine_tag(id), &binary)?;
    let pid = crate::process::spawn_daemon(agent, &[])?;
    Ok(StartedAgent { binary, pid })
}
