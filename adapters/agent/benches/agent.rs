//! Whole-process timings of the agent, as medians of alternating rounds (each round takes
//! one sample of every measurement, so a noisy minute weighs on each alike):
//! - `lockstepd` start to Ready without an upgrade: `lockstepd` started on a bootstrapped
//!   data dir until a client (connecting, completing TLS and logging in meanwhile: one
//!   argon2 verification) is answered `ready` by `Upgrade.Status`; and, in the same runs,
//!   until the launcher sends `READY=1` to `NOTIFY_SOCKET`, as systemd sees it. No Juju
//!   figure is compared: seed 000's 17 s was a whole cloud bootstrap (a machine
//!   provisioned), not an agent starting on loopback;
//! - bootstrap to Ready without an upgrade: `lockstep bootstrap` from start to exit, with
//!   this build's own binary (copied and hashed, no mirror);
//! - bootstrap from the mirror to Ready without an upgrade: the same against a mirror
//!   holding this build as N: bootstrap downloads, verifies and unpacks N;
//! - bootstrap to Ready through an upgrade: `lockstep bootstrap --auto-upgrade` against a
//!   mirror holding this build as N and N+1, from start to exit (which it does once the
//!   API is fully available on N+1): bootstrap installs N from the mirror and, at the same
//!   time, fetches N+1 ahead (downloads, verifies and unpacks it); the controller starts
//!   on N, finds N+1 staged, re-executes it and runs N+1's steps;
//! - the same with `--no-fetch-ahead`: bootstrap installs N only, and the controller
//!   downloads, verifies and unpacks N+1 itself before re-executing it;
//! - the gap a client sees during a self-upgrade: `lockstep upgrade-controller` from N to
//!   N+1 on a Ready controller (behind the front door, the default), while a client calls
//!   `Upgrade.Status` in a loop on one connection: from the last reply of N's worker to the
//!   first of N+1's (the call in between is held by the launcher); the connection must
//!   never close;
//! - download, verify and unpack the binary: N+1's tarball through the agent's own code
//!   (`MetadataSource::download`, then `DataDir::install_tarball`: sha256 and size checked,
//!   unpacked, fsynced, renamed into place) into a fresh data dir, in this process.
//!
//! Every sample is checked: each controller answers Ready on the version it should run
//! (N+1 only through the upgrade), and each unpacked binary is byte for byte this build's
//! `lockstepd`.
//!
//! Run: `cargo bench -p lockstep-agent --bench agent` (`RUNS=N` rounds, 7 by default).
//! `LOCKSTEP_BENCH_QUICK=1` takes one round (same code paths, same checks): CI runs it so
//! that a broken bench fails.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lockstep_agent::cli::bootstrap::ControllerFile;
use lockstep_agent::datadir::{self, DataDir, DownloadedTools};
use lockstep_agent::metadata::MetadataSource;
use lockstep_core::Version;
use lockstep_core::client::RetryPolicy;
use lockstep_core::policy::CatalogueEntry;
use serde_json::json;
use sha2::Digest;

const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");
const LOCKSTEPD: &str = env!("CARGO_BIN_EXE_lockstepd");

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn sha256_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn bootstrap(data_dir: &Path, args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new(LOCKSTEP)
        .arg("--data-dir")
        .arg(data_dir)
        // Juju's client store beside the temporary data dir, never the real one.
        .env("JUJU_DATA", data_dir.with_file_name("juju"))
        .args(["bootstrap", "--api-port", "0"])
        .args(args)
        .output()
        .expect("lockstep runs");
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "bootstrap failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    elapsed
}

fn client(data: &DataDir) -> lockstep_transport::client::Client {
    ControllerFile::read(data)
        .expect("controller.yaml")
        .client(RetryPolicy {
            initial: lockstep_core::Millis(1),
            maximum: lockstep_core::Millis(5),
            attempts_max: 100_000,
        })
}

/// Checks that the controller of `data` is Ready on `version`; stops it first, so that a
/// failed check leaves no daemon behind.
async fn check_and_stop(data: &DataDir, version: Version, what: &str) {
    let status = client(data)
        .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(30))
        .await;
    stop(data);
    let status = status.unwrap_or_else(|error| panic!("{what}: Upgrade.Status: {error}"));
    assert_eq!(status["phase"], "ready", "{what}: {status}");
    assert_eq!(
        status["agent-version"],
        version.to_string(),
        "{what}: {status}"
    );
}

fn launcher_pid(data: &DataDir) -> Option<u32> {
    std::fs::read_to_string(data.pid_path())
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn stop(data: &DataDir) {
    if let Some(pid) = launcher_pid(data) {
        lockstep_agent::cli::demo::stop_daemon(pid);
    }
}

/// The gap a client sees during a self-upgrade behind the front door: a client calls
/// `Upgrade.Status` in a loop on one connection while `lockstep upgrade-controller` takes a
/// Ready controller from N to N+1; the gap runs from the last reply of the old worker
/// (phase `upgrading`) to the first reply of the new one (any later phase), the call in
/// between held by the launcher. Checked: the connection never closed, and the controller
/// ends Ready on N+1.
async fn self_upgrade_gap(data: &DataDir, next: Version) -> Duration {
    let watching = client(data);
    let upgrade = Command::new(LOCKSTEP)
        .arg("--data-dir")
        .arg(data.root())
        .env("JUJU_DATA", data.root().with_file_name("juju"))
        .arg("upgrade-controller")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lockstep runs");
    let started = Instant::now();
    let mut last_old: Option<Instant> = None;
    let gap = loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no upgrade within 120 s"
        );
        let status = watching
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(60))
            .await
            .unwrap_or_else(|error| panic!("Upgrade.Status during the upgrade: {error}"));
        let replied = Instant::now();
        match (status["phase"].as_str(), last_old) {
            (Some("upgrading"), _) => last_old = Some(replied),
            (Some(_), Some(old)) => break replied - old,
            (Some(_), None) => {}
            (None, _) => panic!("Upgrade.Status without a phase: {status}"),
        }
    };
    let output = upgrade.wait_with_output().expect("upgrade-controller ends");
    assert!(
        output.status.success(),
        "upgrade-controller: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = watching
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(60))
            .await
            .expect("Upgrade.Status after the upgrade");
        if status["phase"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "not Ready on N+1: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = watching.stats();
    assert_eq!(
        stats.disconnected, 0,
        "the client's connection closed during the upgrade: {stats:?}"
    );
    check_and_stop(data, next, "upgrade-controller").await;
    gap
}

/// One start of `lockstepd` on a bootstrapped data dir: how long until the launcher
/// reports `READY=1` on `NOTIFY_SOCKET` (what systemd waits for with `Type=notify`), and
/// until a client, which connects and logs in meanwhile, is answered `ready` by
/// `Upgrade.Status`.
struct Started {
    notified: Duration,
    answered: Duration,
}

async fn start_to_ready(data: &DataDir, version: Version) -> Started {
    let client = client(data);
    let socket_dir = tempfile::tempdir().unwrap();
    let socket_path = socket_dir.path().join("notify");
    let notify = tokio::net::UnixDatagram::bind(&socket_path).unwrap();
    let started = Instant::now();
    let mut child = Command::new(data.agent_link("machine-0").join("lockstepd"))
        .arg("--data-dir")
        .arg(data.root())
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lockstepd starts");
    let notified = tokio::spawn(async move {
        let mut buffer = [0u8; 4096];
        loop {
            let length = notify.recv(&mut buffer).await.unwrap();
            if lockstep_agent::notify::Notification::parse(&buffer[..length]).ready {
                return started.elapsed();
            }
        }
    });
    let status = loop {
        if let Ok(status) = client
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(30))
            .await
            && status["phase"] == "ready"
        {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let answered = started.elapsed();
    let notified = tokio::time::timeout(Duration::from_secs(30), notified).await;
    lockstep_agent::cli::demo::stop_daemon(child.id());
    let _ = child.wait();
    let notified = notified
        .expect("the launcher sends READY=1 once the worker is Ready")
        .unwrap();
    assert_eq!(status["agent-version"], version.to_string(), "{status}");
    Started { notified, answered }
}

/// What a controller does to stage N+1 once the catalogue names it: download the tarball
/// (size and sha256 checked while it streams), then install it (checked again, unpacked,
/// fsynced, renamed into place), into a fresh data dir. Checks the unpacked binary.
async fn download_verify_unpack(
    source: &MetadataSource,
    url: &str,
    entry: &CatalogueEntry,
    version: Version,
) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::new(dir.path().join("controller"));
    std::fs::create_dir_all(data.tools_cache_dir()).unwrap();
    let tarball = data
        .tools_cache_dir()
        .join(format!("juju-{}.tgz", entry.binary));
    let tools = DownloadedTools {
        version: entry.binary.clone(),
        url: format!("{url}/{}", entry.path),
        sha256: entry.sha256,
        size_bytes: entry.size_bytes,
        download_rate: None,
    };
    let started = Instant::now();
    source
        .download(entry, &tarball, &mut |_| {})
        .await
        .expect("the download verifies");
    let binary = entry.binary.clone();
    let installer = data.clone();
    let installed =
        tokio::task::spawn_blocking(move || installer.install_tarball(&binary, &tarball, &tools))
            .await
            .unwrap()
            .expect("the tarball installs");
    let elapsed = started.elapsed();
    assert_eq!(sha256_of(&installed), sha256_of(Path::new(LOCKSTEPD)));
    assert_eq!(
        datadir::read_force_version(&data.binary_dir(&entry.binary)).unwrap(),
        Some(version)
    );
    elapsed
}

fn show(name: &str, samples: &[Duration]) -> Duration {
    let median = median(samples);
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    println!(
        "{name:<48} median {:>8.1} ms  (min {:.1}, max {:.1}, {} runs)",
        ms(median),
        ms(*samples.iter().min().unwrap()),
        ms(*samples.iter().max().unwrap()),
        samples.len()
    );
    median
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(if quick { 1 } else { 7 });
    let own = lockstep_agent::steps::build_version();
    let next = lockstep_agent::steps::next_patch();
    // Two mirrors, their metadata signed by one key as an operator's would be: N alone
    // (bootstrap from the mirror, no upgrade), and N with N+1.
    let keys = tempfile::tempdir().unwrap();
    let public_key = keys.path().join("metadata-public-key.asc");
    let key = lockstep_agent::cli::demo::signing_key(&public_key).unwrap();
    let public_key = public_key.to_str().unwrap().to_owned();
    let own_mirror = tempfile::tempdir().unwrap();
    lockstep_agent::cli::demo::publish(own_mirror.path(), own, Path::new(LOCKSTEPD), false)
        .unwrap();
    lockstep_agent::cli::demo::generate(own_mirror.path(), Some(&key)).unwrap();
    let mirror = tempfile::tempdir().unwrap();
    lockstep_agent::cli::demo::publish(mirror.path(), own, Path::new(LOCKSTEPD), false).unwrap();
    let next_tarball =
        lockstep_agent::cli::demo::publish(mirror.path(), next, Path::new(LOCKSTEPD), true)
            .unwrap();
    lockstep_agent::cli::demo::generate(mirror.path(), Some(&key)).unwrap();
    let own_source = own_mirror.path().to_str().unwrap().to_owned();
    let source = mirror.path().to_str().unwrap().to_owned();

    // N+1's catalogue entry, looked up (and its signature verified) as the controller does.
    let tools_url = mirror.path().join("tools").display().to_string();
    let keyring = lockstep_agent::datadir::read_keyring(Path::new(&public_key)).unwrap();
    let trust = lockstep_agent::metadata::MetadataTrust::new(keyring, false);
    let metadata = MetadataSource::open(&tools_url, &trust).unwrap();
    let mark_dir = tempfile::tempdir().unwrap();
    let mark = lockstep_streams::HighWaterMarkFile::new(mark_dir.path().join("mark.json"));
    let lookup = metadata
        .look_up(
            &mark,
            &trust.lookup_config(&tools_url).unwrap(),
            lockstep_agent::metadata::unix_now(),
        )
        .await
        .unwrap();
    let entry = lookup
        .catalogue
        .entries()
        .iter()
        .find(|entry| entry.binary == datadir::host_binary(next))
        .cloned()
        .expect("the mirror holds N+1");

    // Start to Ready without an upgrade: one bootstrapped data dir, started every round.
    let dir = tempfile::tempdir().unwrap();
    let started_data = DataDir::new(dir.path().join("controller"));
    bootstrap(started_data.root(), &[]);
    check_and_stop(&started_data, own, "bootstrap").await;

    let (mut notified, mut answered) = (Vec::new(), Vec::new());
    let (mut plain, mut from_mirror, mut through, mut staging) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut through_not_ahead = Vec::new();
    let mut gaps = Vec::new();
    for _ in 0..runs {
        let started = start_to_ready(&started_data, own).await;
        notified.push(started.notified);
        answered.push(started.answered);

        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        plain.push(bootstrap(data.root(), &[]));
        check_and_stop(&data, own, "bootstrap, no upgrade").await;

        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        from_mirror.push(bootstrap(
            data.root(),
            &[
                "--metadata-source",
                &own_source,
                "--metadata-key",
                &public_key,
            ],
        ));
        check_and_stop(&data, own, "bootstrap from the mirror").await;

        for (samples, fetch_ahead) in [
            (&mut through, None),
            (&mut through_not_ahead, Some("--no-fetch-ahead")),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let data = DataDir::new(dir.path().join("controller"));
            let mut args = vec!["--auto-upgrade", "--metadata-source", &source];
            args.extend(["--metadata-key", &public_key]);
            args.extend(fetch_ahead);
            samples.push(bootstrap(data.root(), &args));
            let what = format!("bootstrap through an upgrade {args:?}");
            check_and_stop(&data, next, &what).await;
        }

        staging.push(download_verify_unpack(&metadata, &tools_url, &entry, next).await);

        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        bootstrap(
            data.root(),
            &["--metadata-source", &source, "--metadata-key", &public_key],
        );
        gaps.push(self_upgrade_gap(&data, next).await);
    }

    let binary_bytes = std::fs::metadata(LOCKSTEPD).unwrap().len();
    let tarball_bytes = std::fs::metadata(&next_tarball).unwrap().len();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!(
        "lockstepd {:.1} MB, its agent tarball {:.1} MB ({runs} rounds{})",
        mb(binary_bytes),
        mb(tarball_bytes),
        if quick { ", quick" } else { "" }
    );
    show("lockstepd start to READY=1 (sd_notify)", &notified);
    show("lockstepd start to Ready, no upgrade", &answered);
    let plain = show("bootstrap to Ready, no upgrade", &plain);
    let from_mirror = show(
        "bootstrap from the mirror to Ready, no upgrade",
        &from_mirror,
    );
    let through = show("bootstrap to Ready through an upgrade", &through);
    let through_not_ahead = show("through an upgrade, --no-fetch-ahead", &through_not_ahead);
    let staging = show("download, verify and unpack the binary", &staging);
    show("self-upgrade gap on one connection (front door)", &gaps);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratio through an upgrade / no upgrade:           {:.2}",
        ratio(through, plain)
    );
    // Bootstrap from the mirror already downloads, verifies and unpacks N: what the
    // upgrade adds is N+1's staging, the re-exec and N+1's steps.
    println!(
        "ratio (through - from the mirror) / download, verify and unpack: {:.2}",
        ratio(through.saturating_sub(from_mirror), staging)
    );
    println!(
        "ratio through an upgrade, --no-fetch-ahead / download, verify and unpack: {:.2}",
        ratio(through_not_ahead, staging)
    );
    println!(
        "ratio through an upgrade / download, verify and unpack: {:.2}",
        ratio(through, staging)
    );
}
