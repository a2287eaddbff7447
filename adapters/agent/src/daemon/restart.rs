//! How a worker restarts into a new binary, and the exit statuses the launcher reads:
//! shared by the controller's worker and the machine agent.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use lockstep_core::Binary;

use crate::daemon::error::DaemonError;
use crate::datadir::DataDir;

/// The environment variable carrying the listening socket's descriptor number.
pub const LISTEN_FD: &str = "LOCKSTEP_LISTEN_FD";

/// Exit status of a worker that switched binaries and wants its supervisor to start the new
/// one (`--restart=exit`): Juju's "must restart: an agent upgrade is available".
pub const EXIT_RESTART: i32 = 3;

/// Exit status of a worker that hit a condition no retry fixes (a bug); the launcher
/// restarts it with backoff and the core re-plans from what is stored.
pub const EXIT_FATAL: i32 = 70;

/// How the worker restarts into a new binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartMode {
    /// Re-execute the new binary in this process, handing the listening socket over.
    Exec,
    /// Exit with status 3 for a supervisor to start the new binary.
    Exit,
}

/// Restarts into `binary`, which `tools/<tag>` already points at: exits with
/// [`EXIT_RESTART`] for the launcher (`--restart=exit`), or re-executes the new binary in
/// this process with the same arguments (`--restart=exec`), handing `handover` (the API's
/// listening socket, when this worker serves the port itself) over. Returns only to exit.
pub(crate) fn restart_into(
    restart: RestartMode,
    data: &DataDir,
    tag: &str,
    binary: &Binary,
    handover: Option<&OwnedFd>,
) -> Result<i32, DaemonError> {
    match restart {
        RestartMode::Exit => {
            tracing::info!(target: "lockstep::agent", %binary, "must restart: an agent upgrade is available");
            Ok(EXIT_RESTART)
        }
        RestartMode::Exec => {
            let path = data.agent_link(tag).join("lockstepd");
            let mut command = std::process::Command::new(&path);
            command.args(std::env::args_os().skip(1));
            // Behind a front door the launcher keeps the port: only the relay socket's
            // path (in the environment already) goes on.
            if let Some(handover) = handover {
                rustix::io::fcntl_setfd(handover, rustix::io::FdFlags::empty())
                    .map_err(|e| DaemonError::system("hand the listening socket over")(e.into()))?;
                command.env(LISTEN_FD, handover.as_raw_fd().to_string());
            }
            tracing::info!(target: "lockstep::agent", %binary, exe = %path.display(), "re-executing");
            let error = command.exec();
            // Only reached when exec failed: the binary on trial cannot even start.
            Err(DaemonError::Execute { path, error })
        }
    }
}
