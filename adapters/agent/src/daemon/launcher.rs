//! The launcher: `lockstepd`'s long-lived process, a small supervisor in the manner of
//! systemd, that owns the API's listening socket and runs the worker from
//! `tools/<agent-tag>/lockstepd`.
//!
//! - It binds the socket once and hands it to every worker (`LOCKSTEP_LISTEN_FD`), so the
//!   port is never closed while the controller runs: between two workers a client waits in
//!   the backlog instead of being refused.
//! - It gives each worker a notification socket (`NOTIFY_SOCKET`, systemd's protocol) and
//!   learns from it when the worker is ready, reloading (restarting into a new binary) and
//!   alive (`WATCHDOG=1` every second from the driver's loop). `READY=1` and `STATUS=` are
//!   forwarded to systemd when the launcher runs under it.
//! - A worker that sends no watchdog ping for `--watchdog-sec` is hung: it is killed.
//! - A worker that exits with status 3 (`--restart=exit`) is replaced at once; one that
//!   crashes, or is killed as hung, is restarted with capped backoff.
//! - **A binary on trial that never counted a boot** (it died or hung before its lifecycle
//!   could persist one) cannot decide anything about itself. The launcher points
//!   `tools/<agent-tag>` back at the previous binary and starts that; the previous
//!   binary's lifecycle then decides, with its bounded counters, whether to try the switch
//!   again or to fall back and report why. This is the only place the launcher reads
//!   `agent.conf` for the lifecycle; every other decision is the lifecycle's. (At start it
//!   also checks the store's settings as the worker would, so that settings no restart can
//!   fix are one error, not a worker restarted forever.)
//! - SIGTERM or SIGINT: the worker gets SIGTERM, then SIGKILL after `--stop-timeout`.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::daemon::error::DaemonError;
use crate::daemon::worker::{EXIT_RESTART, LAUNCHER_PID, LISTEN_FD, RELAY_SOCKET};
use crate::datadir::{DataDir, DataDirError};
use crate::notify::{self, NOTIFY_SOCKET, Notification, Notifier};

/// The launcher's settings.
#[derive(Clone, Debug)]
pub struct LauncherOptions {
    pub data_dir: PathBuf,
    /// A worker silent this long is killed as hung.
    pub watchdog: Duration,
    /// How long a worker may take to stop after SIGTERM.
    pub stop_timeout: Duration,
    /// This run's overrides of `agent.conf`'s store, checked before any worker starts.
    pub store: crate::store::StoreOverrides,
    /// Arguments the worker is started with, before `worker`.
    pub worker_args: Vec<String>,
    /// `--front-door`: the launcher holds the clients' connections itself (TLS, the
    /// websocket, admission within these limits) and relays them to the current worker
    /// (`spec/relay.md`), so that a worker's restart closes none of them.
    pub front_door: Option<lockstep_transport::limits::ApiLimits>,
    /// `--front-door-threads`: how many threads serve the front door's connections
    /// ([`lockstep_transport::threads::ConnectionThreads`]); 0: the launcher's own runtime
    /// serves them.
    pub front_door_threads: usize,
    /// `--front-door-lease`: quiet connections are leased to the worker
    /// ([`lockstep_transport::front::FrontDoor::leasing`]).
    pub front_door_lease: bool,
}

/// How long a login or read that reaches the front door between two workers waits for the
/// next one before it is refused `upgrade in progress` (python-jujuclient retries that for a
/// minute).
pub const FRONT_DOOR_WAIT: Duration = Duration::from_secs(30);

/// Why a worker ended.
#[derive(Debug)]
enum Ended {
    Exited(ExitStatus),
    Hung,
}

/// Holds the data dir's lock for the life of the launcher: one launcher per data dir.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
    pid_path: PathBuf,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pid_path);
    }
}

/// Locks `<data>/lockstepd.pid` and writes this process's id into it.
pub fn lock_data_dir(data: &DataDir) -> Result<DirLock, DaemonError> {
    use std::io::Write;
    let path = data.pid_path();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(DataDirError::io(&path, "open"))?;
    if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(DaemonError::Locked {
            pid: holder.trim().to_owned(),
            data_dir: data.root().to_path_buf(),
        });
    }
    file.set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .and_then(|()| file.sync_all())
        .map_err(DataDirError::io(&path, "write"))?;
    Ok(DirLock {
        _file: file,
        pid_path: path,
    })
}

/// Runs the launcher until SIGTERM or SIGINT. Returns the exit status.
pub async fn run(options: LauncherOptions) -> Result<i32, DaemonError> {
    let data = DataDir::new(&options.data_dir);
    let conf = data
        .read_agent_conf()?
        .ok_or_else(|| DaemonError::NotBootstrapped {
            agent_conf: data.agent_conf_path(),
            data_dir: options.data_dir.clone(),
        })?;
    // What every worker would refuse at start (a plain etcd endpoint off loopback without
    // --etcd-insecure, a password file others can read) is refused once, here, before
    // anything connects: restarting a worker cannot fix it.
    options.store.settings(&conf)?;
    let _lock = lock_data_dir(&data)?;
    // Holding the lock, no other lockstepd writes here: what a crash left half-written goes.
    match data.sweep_temporaries() {
        Ok(swept) => {
            for path in swept.files {
                tracing::info!(target: "lockstep::launcher", path = %path.display(), "removed a temporary file left by an interrupted write");
            }
            if swept.staging_entries > 0 {
                tracing::info!(target: "lockstep::launcher", tools = %data.tools_dir().display(), entries = swept.staging_entries, "removed staging entries left by an interrupted install");
            }
        }
        Err(error) => {
            tracing::warn!(target: "lockstep::launcher", %error, "cannot sweep leftover temporary files");
        }
    }
    let relay_socket = data.root().join(lockstep_transport::relay::SOCKET_NAME);
    // A machine agent serves no port: the launcher only supervises its worker. A controller's
    // launcher either serves the port (behind the front door) or every worker inherits it.
    let machine_agent = crate::daemon::machine_agent::is_machine_agent(&conf);
    let (door, _served, listen_fd) = match &options.front_door {
        _ if machine_agent => (None, None, None),
        Some(limits) => {
            let listener = bind(&conf.api_listen).await?;
            let (door, served) = front_door(
                &data,
                &options.data_dir,
                listener,
                limits.clone(),
                (options.front_door_threads, options.front_door_lease),
                &relay_socket,
            )?;
            (Some(door), Some(served), None)
        }
        None => {
            let listener = bind(&conf.api_listen).await?;
            tracing::warn!(target: "lockstep::launcher", "no front door (--front-door=false): each worker serves the API's port itself, and its restart closes every client's connection");
            rustix::io::fcntl_setfd(&listener, rustix::io::FdFlags::empty()).map_err(|e| {
                DaemonError::system("let workers inherit the listening socket")(e.into())
            })?;
            let fd = listener.as_raw_fd();
            (None, None, Some((listener, fd)))
        }
    };
    let notify = notify::Listener::bind("lockstepd")
        .map_err(DaemonError::system("open the notification socket"))?;
    let systemd = Notifier::from_env();
    #[cfg(feature = "failpoints")]
    let systemd = if crate::daemon::failpoints::launcher_silent() {
        tracing::warn!(target: "lockstep::launcher", variable = crate::daemon::failpoints::SILENT_LAUNCHER, "failpoint: forwarding no notifications");
        Notifier::none()
    } else {
        systemd
    };
    tracing::info!(
        target: "lockstep::launcher",
        pid = std::process::id(),
        listen = %conf.api_listen,
        machine_agent,
        data_dir = %options.data_dir.display(),
        "launcher started"
    );

    let mut terminate = Box::pin(crate::process::wait_for_termination());
    let mut failures = 0u32;
    loop {
        let exe = data.agent_link(&conf.tag).join("lockstepd");
        let mut command = Command::new(&exe);
        command
            .args(&options.worker_args)
            .arg("worker")
            .env(NOTIFY_SOCKET, notify.address())
            .env(LAUNCHER_PID, std::process::id().to_string())
            .kill_on_drop(true);
        match &listen_fd {
            Some((_, fd)) => {
                command.env(LISTEN_FD, fd.to_string());
            }
            None if door.is_some() => {
                command.env(RELAY_SOCKET, &relay_socket);
            }
            None => {}
        }
        let mut child = command.spawn().map_err(|error| DaemonError::Execute {
            path: exe.clone(),
            error,
        })?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(target: "lockstep::launcher", pid, exe = %exe.display(), "worker started");
        let started = Instant::now();
        let mut ready = false;
        let mut last_ping = Instant::now();
        let mut buffer = vec![0u8; 4096];
        let mut ignored = 0u64;
        let ended = loop {
            let hung_at = last_ping + options.watchdog;
            tokio::select! {
                status = child.wait() => break Ended::Exited(status.map_err(DaemonError::system("wait for the worker"))?),
                received = notify.receive(&mut buffer) => {
                    let Ok((length, sender)) = received else { continue };
                    if sender != Some(pid) {
                        // Another local process (the socket is abstract): ignored, so that
                        // a hung worker cannot be kept alive or declared Ready from outside.
                        ignored += 1;
                        if ignored.is_power_of_two() {
                            tracing::warn!(
                                target: "lockstep::launcher",
                                sender = %sender.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string()),
                                worker = pid,
                                ignored,
                                "ignored a notification not sent by the worker"
                            );
                        }
                        continue;
                    }
                    let notification = Notification::parse(&buffer[..length]);
                    last_ping = Instant::now();
                    if notification.relay && let Some(door) = &door {
                        door.worker_listening();
                    }
                    if notification.reloading {
                        ready = false;
                    }
                    if notification.ready && !ready {
                        ready = true;
                        failures = 0;
                        systemd.ready();
                    }
                    if let Some(status) = &notification.status {
                        systemd.status(status);
                    }
                }
                () = tokio::time::sleep_until(hung_at) => {
                    tracing::error!(
                        target: "lockstep::launcher",
                        pid,
                        silent_s = options.watchdog.as_secs(),
                        "worker sent no watchdog ping; killing it as hung"
                    );
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    break Ended::Hung;
                }
                () = &mut terminate => {
                    systemd.stopping();
                    stop(&mut child, options.stop_timeout).await;
                    tracing::info!(target: "lockstep::launcher", "launcher stopped");
                    return Ok(0);
                }
            }
        };
        match &ended {
            Ended::Exited(status) if status.code() == Some(EXIT_RESTART) => {
                tracing::info!(target: "lockstep::launcher", pid, "worker restarts into a new binary");
                continue;
            }
            Ended::Exited(status) => {
                tracing::warn!(target: "lockstep::launcher", pid, %status, ready, "worker ended");
            }
            Ended::Hung => {}
        }
        if !ready && let Some(reason) = hand_back_trial(&data, &conf.tag, &ended) {
            tracing::warn!(target: "lockstep::launcher", "{reason}");
            systemd.status(&reason);
            continue;
        }
        failures += 1;
        let delay = backoff(failures, started.elapsed());
        tracing::info!(target: "lockstep::launcher", delay_ms = delay.as_millis() as u64, "restarting the worker");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = &mut terminate => return Ok(0),
        }
    }
}

/// Serves the API's port behind the front door: TLS with the controller's certificate,
/// each connection admitted within `limits`, websockets and HTTP relayed to the worker on
/// `relay_socket`. Ends, closing every connection, when the returned handle is dropped.
fn front_door(
    data: &DataDir,
    data_dir: &std::path::Path,
    listener: std::net::TcpListener,
    limits: lockstep_transport::limits::ApiLimits,
    (threads, lease): (usize, bool),
    relay_socket: &std::path::Path,
) -> Result<(Arc<lockstep_transport::front::FrontDoor>, AbortOnDrop), DaemonError> {
    use lockstep_transport::front::FrontDoor;
    let tls = crate::daemon::worker::credentials(data)?
        .server_config()
        .map_err(|error| DaemonError::Tls {
            data_dir: data_dir.to_path_buf(),
            error,
        })?;
    listener.set_nonblocking(true).map_err(DaemonError::system(
        "make the listening socket non-blocking",
    ))?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(DaemonError::system(
        "register the listening socket with tokio",
    ))?;
    let door = Arc::new(
        FrontDoor::new(
            relay_socket.to_path_buf(),
            &crate::steps::build_version().to_string(),
            FRONT_DOOR_WAIT,
        )
        .leasing(lease),
    );
    tracing::info!(target: "lockstep::launcher", relay = %relay_socket.display(), boot = door.boot(), threads, lease, "front door: the launcher holds the clients' connections and relays them to the worker, leasing quiet ones to it if lease=true");
    // Each connection is read, relayed and written on one of `threads` threads: a call then
    // wakes the launcher only for the client's frame and the worker's reply, never one of
    // its threads for another. With 0, on the launcher's own runtime, whose threads share
    // every connection's tasks.
    let threads = match threads {
        0 => None,
        count => Some(Arc::new(
            lockstep_transport::threads::ConnectionThreads::start("front-door", count).map_err(
                DaemonError::system("start the front door's connection threads"),
            )?,
        )),
    };
    let served = AbortOnDrop(tokio::spawn(
        door.serve_port(listener, tls, limits, threads),
    ));
    Ok((door, served))
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Binds the API's address. A previous launcher or worker that was just killed may still
/// be exiting with the socket open: an address in use is tried again for up to
/// [`BIND_WAIT`] before giving up.
async fn bind(address: &str) -> Result<std::net::TcpListener, DaemonError> {
    let started = Instant::now();
    loop {
        match std::net::TcpListener::bind(address) {
            Ok(listener) => return Ok(listener),
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && started.elapsed() < BIND_WAIT =>
            {
                tracing::warn!(target: "lockstep::launcher", %address, "address in use; waiting for it");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => {
                return Err(DaemonError::Listen {
                    address: address.to_owned(),
                    error,
                });
            }
        }
    }
}

/// How long the launcher waits for its address to be free.
pub const BIND_WAIT: Duration = Duration::from_secs(10);

/// A trial binary that died or hung before counting a boot: switch back to the previous
/// binary, whose lifecycle decides what happens next. `Some` names what was done.
fn hand_back_trial(data: &DataDir, tag: &str, ended: &Ended) -> Option<String> {
    let conf = data.read_agent_conf().ok()??;
    let snapshot = conf.snapshot();
    let trial = snapshot.trial?;
    let previous = snapshot.previous?;
    if trial.boots > 0 || data.current_binary(tag).ok()?? != trial.binary {
        return None;
    }
    let how = match ended {
        Ended::Exited(status) => format!("exited ({status})"),
        Ended::Hung => "hung".to_owned(),
    };
    match data.switch_to(tag, &previous) {
        Ok(()) => Some(format!(
            "agent binary {} on trial {how} before it could start; handing back to {previous}",
            trial.binary
        )),
        Err(error) => {
            tracing::error!(target: "lockstep::launcher", %error, "cannot switch back to {previous}");
            None
        }
    }
}

/// Restart delay after `failures` consecutive failures (the core's rule, which the
/// simulator's crash fault follows too): 0.5 s doubling to 30 s; a worker that ran for a
/// minute resets the count's effect.
fn backoff(failures: u32, ran: Duration) -> Duration {
    let ran = lockstep_core::time::Millis(ran.as_millis().min(u128::from(u64::MAX)) as u64);
    Duration::from_millis(lockstep_core::restart::restart_delay(failures, ran).0)
}

async fn stop(child: &mut Child, timeout: Duration) {
    if let Some(pid) = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(timeout, child.wait()).await.is_err() {
        tracing::warn!(target: "lockstep::launcher", "worker did not stop in time; killing it");
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_and_resets_after_a_long_run() {
        assert_eq!(backoff(1, Duration::ZERO), Duration::from_millis(500));
        assert_eq!(backoff(2, Duration::ZERO), Duration::from_secs(1));
        assert_eq!(backoff(20, Duration::ZERO), Duration::from_secs(30));
        assert_eq!(
            backoff(20, Duration::from_secs(120)),
            Duration::from_millis(500)
        );
    }
}
