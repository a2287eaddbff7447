//! Processes as the daemon and the CLI see them: whether one still runs, and waiting for
//! the signals that end this one.

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
