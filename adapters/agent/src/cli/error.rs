//! [`CliError`]: why a `lockstep` command failed, one variant per part of the CLI. The
//! binary's `main` prints it as text (`ERROR ...`) and exits 1; nothing before that edge
//! turns an error into a string.

use crate::cli::bootstrap::{BootstrapError, ControllerFileError};
use crate::cli::commands::CommandError;
use crate::cli::demo::DemoError;
use crate::cli::ha::HaError;
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
    Demo(#[from] DemoError),
}
