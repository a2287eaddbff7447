//! Processes as the daemon and the CLI see them: whether one still runs, waiting for the
//! signals that end this one, and starting a `lockstepd` detached (bootstrap, `enable-ha`,
//! and the local provider's machine agents, started by the CLI or by a controller).

use crate::datadir::{DataDir, DataDirError};

/// The environment by which a process's own supervisor reaches it (systemd's or a
/// launcher's notification socket, watchdog and socket activation, the launcher's relay
/// and pid): never passed to a daemon started detached, which has a launcher of its own. A
/// machine agent started by a controller's worker would otherwise notify, and relay for,
/// the controller's launcher.
pub const SUPERVISION_ENVIRONMENT: &[&str] = &[
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "LOCKSTEP_LISTEN_FD",
    "LOCKSTEP_LAUNCHER_PID",
    "LOCKSTEP_RELAY_SOCKET",
];

/// Starts `lockstepd` on `data` detached: its own process group, the caller's supervision
/// environment ([`SUPERVISION_ENVIRONMENT`]) removed, standard input empty, its output
/// appended to `<data>/logs/lockstepd.log`. It runs the binary `tools/<tag>` links to, the
/// tag read from `agent.conf` (`machine-0` before there is one). Returns its pid; a thread
/// waits for it, so it leaves no zombie however long the caller runs.
pub fn spawn_daemon(data: &DataDir, extra_args: &[String]) -> Result<u32, DataDirError> {
    spawn_daemon_notifying(data, extra_args, None)
}

/// [`spawn_daemon`], with `NOTIFY_SOCKET` set to `notify` (a [`crate::notify::Listener`]'s
/// address) when given: the launcher forwards its worker's `READY=1` and `STATUS=` there,
/// as it would to systemd.
pub fn spawn_daemon_notifying(
    data: &DataDir,
    extra_args: &[String],
    notify: Option<&str>,
) -> Result<u32, DataDirError> {
    use std::os::unix::process::CommandExt;
    let logs = data.logs_dir();
    std::fs::create_dir_all(&logs).map_err(DataDirError::io(&logs, "create the directory"))?;
    let log_path = logs.join("lockstepd.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(DataDirError::io(&log_path, "open"))?;
    let tag = data
        .read_agent_conf()?
        .map_or_else(|| "machine-0".to_owned(), |conf| conf.tag);
    let exe = data.agent_link(&tag).join("lockstepd");
    let mut command = std::process::Command::new(&exe);
    command
        .arg("--data-dir")
        .arg(data.root())
        .args(extra_args)
        .stdin(std::process::Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(DataDirError::io(&log_path, "duplicate the descriptor of"))?,
        )
        .stderr(log)
        .process_group(0);
    for name in SUPERVISION_ENVIRONMENT {
        command.env_remove(name);
    }
    if let Some(notify) = notify {
        command.env(crate::notify::NOTIFY_SOCKET, notify);
    }
    let mut child = command.spawn().map_err(DataDirError::io(&exe, "start"))?;
    let pid = child.id();
    // The launcher daemonizes nothing: it runs until stopped, so its exit is reaped here.
    let _ = std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || child.wait());
    Ok(pid)
}

/// Whether process `pid` still runs: some thread of it is not a zombie. (The main thread
/// of a multi-threaded process may be a zombie while other threads still exit and the
/// process still holds its files and sockets.)
pub fn alive(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().any(|thread| {
        std::fs::read_to_string(thread.path().join("stat"))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                !(state.starts_with('Z') || state.starts_with('X'))
            })
            .unwrap_or(false)
    })
}

/// Resolves on SIGTERM or SIGINT.
pub async fn wait_for_termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler can be installed");
    let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler can be installed");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
