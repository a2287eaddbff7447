//! [`CliError`]: why a `lockstep` command failed, one variant per part of the CLI. The
//! binary's `main` prints it as text (`ERROR ...`) and exits 1; nothing before that edge
//! turns an error into a string.

use crate::cli::bootstrap::{BootstrapError, ControllerFileError};
use crate::cli::commands::CommandError;
use crate::cli::demo::DemoError;
use crate::cli::ha::HaError;
use crate::cli::juju_data::JujuDataError;
use crate::paths::ExecutableError;

/// Why a `lockstep` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `lockstepd` is not beside `lockstep`.
    #[error(transparent)]
    Executable(#[from] ExecutableError),
    /// `controller.yaml` cannot be read: no controller to talk to.
    #[error(transparent)]
    ControllerFile(#[from] ControllerFileError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Ha(#[from] HaError),
    #[error(transparent)]
    AddMachine(#[from] crate::cli::machines::ProvisionError),
    #[error(transparent)]
    Demo(#[from] DemoError),
    /// `-c NAME` given to a command that works on a data directory.
    #[error(
        "-c {name:?}: this command works on a controller's data directory (--data-dir); -c names a controller only for commands that talk to it (status, deploy, add-machine, watch, upgrade-controller, abort-upgrade)"
    )]
    ControllerFlag { name: String },
    /// Juju's client store (`$JUJU_DATA`) cannot be read or written.
    #[error(transparent)]
    JujuData(#[from] JujuDataError),
}
