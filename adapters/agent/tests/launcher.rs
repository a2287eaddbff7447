//! The launcher's own defenses (issue 18, item 7), against a real `lockstepd`:
//!
//! - its notification socket is abstract, so any local process can send to it, and it must
//!   act only on what its own worker sends; otherwise a hung worker (here: stopped with
//!   SIGSTOP) could be kept alive from outside with `WATCHDOG=1`;
//! - at start, holding the data dir's lock, it removes the temporary files an interrupted
//!   write left behind;
//! - the shipped systemd unit runs it as a dedicated unprivileged user: systemd's own checks
//!   accept the unit and its sysusers.d file, and a controller handed to such a user, as the
//!   unit's `StateDirectory=` does, serves and upgrades itself.

use crate::common;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use common::{Controller, Mirror, Published, next, text};

/// The launcher's `NOTIFY_SOCKET` (`@name`), read from its worker's environment.
fn notify_socket(worker: u32) -> String {
    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    environ
        .split(|byte| *byte == 0)
        .find_map(|entry| entry.strip_prefix(b"NOTIFY_SOCKET="))
        .map(|value| String::from_utf8(value.to_vec()).unwrap())
        .expect("the worker has a NOTIFY_SOCKET")
}

/// A controller bootstrapped from a signed mirror publishing N and N+1 (returned too: it
/// must outlive the controller, which may upgrade from it), Ready, then stopped, for the
/// test to start again its own way.
async fn bootstrapped_then_stopped() -> (Mirror, Controller) {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (source, key) = (mirror.source(), mirror.key());
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    controller.wait_ready(Duration::from_secs(120)).await;
    controller.stop();
    (mirror, controller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_kept_pinging_by_another_process_is_still_killed_as_hung() {
    let (_mirror, controller) = bootstrapped_then_stopped().await;
    // Again with a 2 s watchdog.
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
    let (_mirror, controller) = bootstrapped_then_stopped().await;
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

/// The unit and the sysusers.d file as shipped, beside this crate's manifest.
fn shipped(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// What `systemd-analyze verify` says of `unit` (written to a scratch directory under its
/// own name), with `ExecStart=` pointed at a program that exists on this host: it checks
/// that the executable exists, and `/var/lib/lockstep` is not set up here.
fn systemd_verify(unit: &str) -> std::process::Output {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("lockstepd.service");
    let unit: String = unit
        .lines()
        .map(|line| match line.starts_with("ExecStart=") {
            true => "ExecStart=/bin/true".to_owned(),
            false => line.to_owned(),
        })
        .map(|line| line + "\n")
        .collect();
    std::fs::write(&path, unit).unwrap();
    std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze runs (Debian's systemd package)")
}

#[test]
fn the_shipped_unit_runs_as_the_dedicated_user_its_sysusers_file_declares_and_systemd_accepts_both()
{
    let unit = std::fs::read_to_string(shipped("lockstepd.service")).unwrap();
    let settings: Vec<&str> = unit
        .lines()
        .filter(|line| !line.starts_with('#') && line.contains('='))
        .collect();
    for wanted in [
        "User=lockstep",
        "Group=lockstep",
        "StateDirectory=lockstep",
        "StateDirectoryMode=0700",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "UMask=0077",
        "Type=notify",
    ] {
        assert!(
            settings.contains(&wanted),
            "the unit lacks {wanted}:\n{unit}"
        );
    }
    let verified = systemd_verify(&unit);
    assert!(
        verified.status.success() && verified.stderr.is_empty() && verified.stdout.is_empty(),
        "systemd-analyze verify objects to the unit:\n{}",
        text(&verified)
    );
    // The check sees a mistake: the same unit with a misspelt setting is reported.
    let misspelt = unit.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes");
    let objected = systemd_verify(&misspelt);
    assert!(
        String::from_utf8_lossy(&objected.stderr).contains("Unknown key 'NoNewPrivilege'"),
        "{}",
        text(&objected)
    );

    // sysusers.d: parsed by systemd-sysusers itself, without writing /etc (--dry-run).
    let sysusers = std::process::Command::new("systemd-sysusers")
        .arg("--dry-run")
        .arg(shipped("lockstep.sysusers"))
        .output()
        .expect("systemd-sysusers runs");
    let said = text(&sysusers);
    assert!(sysusers.status.success(), "{said}");
    assert!(
        said.contains("user 'lockstep'") || said.contains("User lockstep"),
        "systemd-sysusers would not make the user lockstep:\n{said}"
    );
}

/// Hands `path` and everything under it to `uid`:`gid`, not following symlinks: what
/// systemd's `StateDirectory=` does when the directory's owner is not the unit's `User=`.
fn chown_tree(path: &std::path::Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid, gid);
        }
    }
}

/// Every file under `path` whose owner is not `uid`.
fn not_owned_by(path: &std::path::Path, uid: u32) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::symlink_metadata(path).unwrap();
    let mut found = Vec::new();
    if metadata.uid() != uid {
        found.push(path.to_path_buf());
    }
    if metadata.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            found.extend(not_owned_by(&entry.unwrap().path(), uid));
        }
    }
    found
}

/// The real user id of process `pid`, from `/proc/<pid>/status`.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_handed_to_an_unprivileged_user_as_the_unit_does_serves_and_upgrades_itself() {
    // `nobody`: a user with no rights to anything here but what is handed to it.
    const UID: u32 = 65534;
    const GID: u32 = 65534;
    assert_eq!(
        rustix::process::geteuid().as_raw(),
        0,
        "this test hands files to another user: it runs as root, as CI does"
    );
    let (mirror, controller) = bootstrapped_then_stopped().await;
    // Bootstrapped as root; then, as `StateDirectory=` does before the first start, the data
    // directory (and here its parent and the mirror, both private temporary directories)
    // handed to the service's user.
    chown_tree(controller.dir.path(), UID, GID);
    chown_tree(mirror.path(), UID, GID);

    let launcher = controller.start_as(UID, GID, &[]);
    controller.wait_ready(Duration::from_secs(120)).await;
    let worker = controller.worker_pid().expect("a worker");
    assert_eq!((uid_of(launcher), uid_of(worker)), (UID, UID));

    // A self-upgrade: download, unpack into tools/, switch, re-exec, all as that user.
    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller
        .wait_running(next(), Duration::from_secs(180))
        .await;
    let exe = controller.serving_exe().expect("a serving worker");
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
    let worker = controller.worker_pid().expect("a worker");
    assert_eq!(uid_of(worker), UID);
    // Nothing the controller made since belongs to anyone else.
    let strays = not_owned_by(&controller.data_dir, UID);
    assert!(strays.is_empty(), "not owned by uid {UID}: {strays:?}");
}
