//! The launcher's own defenses (issue 18, item 7), against a real `lockstepd`:
//!
//! - its notification socket is abstract, so any local process can send to it, and it must
//!   act only on what its own worker sends; otherwise a hung worker (here: stopped with
//!   SIGSTOP) could be kept alive from outside with `WATCHDOG=1`;
//! - at start, holding the data dir's lock, it removes the temporary files an interrupted
//!   write left behind.

mod common;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use common::{Controller, Mirror, Published};

/// The launcher's `NOTIFY_SOCKET` (`@name`), read from its worker's environment.
fn notify_socket(worker: u32) -> String {
    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    environ
        .split(|byte| *byte == 0)
        .find_map(|entry| entry.strip_prefix(b"NOTIFY_SOCKET="))
        .map(|value| String::from_utf8(value.to_vec()).unwrap())
        .expect("the worker has a NOTIFY_SOCKET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_kept_pinging_by_another_process_is_still_killed_as_hung() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (source, key) = (mirror.source(), mirror.key());
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    controller.wait_ready(Duration::from_secs(120)).await;
    // Again with a 2 s watchdog.
    controller.stop();
    controller.start(&[("LOCKSTEPD_WATCHDOG_SEC", "2")]);
    controller.wait_ready(Duration::from_secs(120)).await;
    let hung = controller.worker_pid().expect("a worker");
    let name = notify_socket(hung);
    let address = SocketAddr::from_abstract_name(name.strip_prefix('@').unwrap().as_bytes())
        .expect("an abstract socket name");

    // The worker stops (it can send nothing); this test process pings for it, as an
    // attacker on the host could, every 100 ms for 8 s: four watchdog periods.
    let stopped = rustix::process::Pid::from_raw(hung as i32).unwrap();
    rustix::process::kill_process(stopped, rustix::process::Signal::STOP).unwrap();
    let outsider = UnixDatagram::unbound().unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) && lockstep_agent::process::alive(hung) {
        // A killed worker's socket may be gone for a moment while the launcher restarts it.
        let _ = outsider.send_to_addr(b"WATCHDOG=1\nREADY=1\nSTATUS=kept alive", &address);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = controller.log();
    assert!(
        !lockstep_agent::process::alive(hung),
        "the stopped worker {hung} was kept alive by another process's pings; log:\n{log}"
    );
    let me = std::process::id();
    assert!(
        log.contains("ignored a notification not sent by the worker")
            && log.contains(&format!("sender={me}"))
            && log.contains(&format!("worker={hung}")),
        "the launcher did not report ignoring pid {me}; log:\n{log}"
    );
    assert!(
        log.contains("worker sent no watchdog ping; killing it as hung"),
        "{log}"
    );
    // The launcher started a new worker, which serves.
    controller.wait_ready(Duration::from_secs(120)).await;
    assert_ne!(controller.worker_pid(), Some(hung));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_files_left_by_interrupted_writes_are_removed_at_start() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (source, key) = (mirror.source(), mirror.key());
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    controller.wait_ready(Duration::from_secs(120)).await;
    controller.stop();
    let data = controller.data();
    let agent_conf = std::fs::read(data.agent_conf_path()).unwrap();
    // What a process killed mid-write leaves: lockstep_fs's temporary files (in the root,
    // in a binary's directory), a tools-endpoint fetch, a binary's staging directory.
    let binary_dir = controller.binary_dir(common::own());
    let cache = data.tools_cache_dir();
    std::fs::create_dir_all(&cache).unwrap();
    let leftovers = [
        data.root().join(".agent.conf.Xy12ab.tmp"),
        binary_dir.join(".downloaded-tools.txt.Qr34cd.tmp"),
        cache.join(".2.9.99-ubuntu-amd64.tgz.partial"),
    ];
    for path in &leftovers {
        std::fs::write(path, b"half written").unwrap();
    }
    let staging = data.tools_dir().join(".install-2.9.99-ubuntu-amd64-abc123");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("lockstepd"), b"half unpacked").unwrap();
    // Files that only look alike stay.
    let kept = data.root().join("notes.tmp");
    std::fs::write(&kept, b"the operator's").unwrap();

    controller.start(&[]);
    controller.wait_ready(Duration::from_secs(120)).await;
    let log = controller.log();
    for path in &leftovers {
        assert!(!path.exists(), "{} was not removed", path.display());
        assert!(
            log.contains(&format!(
                "removed a temporary file left by an interrupted write path={}",
                path.display()
            )),
            "{} not reported; log:\n{log}",
            path.display()
        );
    }
    assert!(!staging.exists(), "the staging directory was not removed");
    assert!(
        log.contains("removed staging entries left by an interrupted install")
            && log.contains("entries=1"),
        "{log}"
    );
    assert!(kept.exists());
    assert_eq!(std::fs::read(data.agent_conf_path()).unwrap(), agent_conf);
}
