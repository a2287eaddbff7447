//! [`DaemonError`]: why `lockstepd` (the launcher or a worker) cannot start or go on. Each
//! names the file, the flag or environment variable, or the value, and what to do.

use std::io;
use std::path::PathBuf;

use lockstep_core::lifecycle::LifecycleError;
use lockstep_transport::tls::TlsError;

use crate::datadir::DataDirError;
use crate::paths::ExecutableError;
use crate::quote::quote;
use crate::store::StoreSetupError;

/// Why `lockstepd` cannot start or go on.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No `agent.conf`: the data dir holds no controller.
    #[error(
        "{} does not exist: bootstrap a controller first (lockstep bootstrap --data-dir {})",
        agent_conf.display(),
        data_dir.display()
    )]
    NotBootstrapped {
        agent_conf: PathBuf,
        data_dir: PathBuf,
    },
    /// A machine agent's `agent.conf` names no controller address.
    #[error("{} names no API address (apiaddresses): the machine agent cannot reach a controller; provision it again (lockstep add-machine)", agent_conf.display())]
    NoApiAddress { agent_conf: PathBuf },
    /// A machine agent's machine is a controller's (`Agent.GetEntities` answered
    /// `JobManageModel`): its agent is the controller lockstepd, not a machine agent.
    #[error("{tag} is a controller machine (JobManageModel), so {} must not run a machine agent", agent_conf.display())]
    MachineAgentOfController { agent_conf: PathBuf, tag: String },
    /// The data directory cannot be read or written.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// The store's settings are wrong or the store cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreSetupError),
    /// This executable cannot be found.
    #[error(transparent)]
    Executable(#[from] ExecutableError),
    /// The TLS material bootstrap wrote cannot be used.
    #[error("the API's TLS material in {}: {error}", data_dir.display())]
    Tls {
        data_dir: PathBuf,
        #[source]
        error: TlsError,
    },
    /// The lifecycle core refused its configuration or `agent.conf`'s snapshot.
    #[error("cannot start the lifecycle from {}: {error}", agent_conf.display())]
    Lifecycle {
        agent_conf: PathBuf,
        #[source]
        error: LifecycleError,
    },
    /// `LOCKSTEP_LISTEN_FD` does not name a usable listening socket.
    #[error("{variable}={}: {problem}", quote(text))]
    ListenFd {
        variable: &'static str,
        text: String,
        #[source]
        problem: ListenFdProblem,
    },
    /// The API's address cannot be listened on.
    #[error("cannot listen on {address}: {error}; is another process using the port?")]
    Listen {
        address: String,
        #[source]
        error: io::Error,
    },
    /// A system call on a socket, a signal or a process failed.
    #[error("cannot {action}: {error}")]
    System {
        action: &'static str,
        #[source]
        error: io::Error,
    },
    /// A variable the launcher sets for its worker is missing or not a number.
    #[error("{variable} must name {what}; is this worker started by its launcher?")]
    LauncherEnvironment {
        variable: &'static str,
        what: &'static str,
    },
    /// The launcher that started this worker is gone.
    #[error("the launcher (pid {pid}) is gone; not starting")]
    LauncherGone { pid: i32 },
    /// Another launcher holds the data dir.
    #[error(
        "another lockstepd (pid {pid}) runs on {}; stop it first (lockstep kill-controller)",
        data_dir.display()
    )]
    Locked { pid: String, data_dir: PathBuf },
    /// A worker executable cannot be started or re-executed.
    #[error("cannot execute {}: {error}", path.display())]
    Execute {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
}

/// What is wrong with the descriptor `LOCKSTEP_LISTEN_FD` names.
#[derive(Debug, thiserror::Error)]
pub enum ListenFdProblem {
    #[error("not a descriptor number")]
    NotANumber,
    #[error("names a standard stream (0, 1 or 2)")]
    StandardStream,
    #[error("not an open descriptor: {0}")]
    NotOpen(#[source] io::Error),
    #[error("cannot set its close-on-exec flag: {0}")]
    CloseOnExec(#[source] io::Error),
    #[error("not a listening TCP socket: {0}")]
    NotListening(#[source] io::Error),
}

impl DaemonError {
    /// A mapper from the `io::Error` of `action`.
    pub(crate) fn system(action: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
        move |error| DaemonError::System { action, error }
    }
}
