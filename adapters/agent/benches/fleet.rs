//! A fleet of machine agents upgrading together (issue 20): one controller bootstrapped from
//! a mirror holding this build as N and N+1, `lockstep add-machine -n AGENTS` (each agent a
//! real `lockstepd` on loopback, its own data dir), then `lockstep upgrade-controller`.
//! Measured per round:
//! - the fleet's upgrade: from `upgrade-controller`'s start until every agent reports
//!   `started` on N+1 (`lockstep status`, polled every 100 ms): the controller's own
//!   upgrade, then each agent's (controllers first), at most `max-agent-downloads` (the
//!   default, 4) downloading at once;
//! - the baseline, in the same round once the fleet is done: N+1's tarball downloaded
//!   AGENTS times in a row from the same controller's tools endpoint over loopback (TLS,
//!   HTTP Basic, the whole body read), the time the downloads alone would take;
//! - the controller's peak memory: the largest sum of the launcher's and the worker's
//!   resident sets (`/proc/<pid>/status` `VmRSS`, sampled every 100 ms through the round).
//!
//! The ratio printed last is the median fleet upgrade over the median baseline. Every round
//! checks that each agent ends on N+1 with a binary downloaded from its controller.
//!
//! Run: `cargo bench -p lockstep-agent --bench fleet` (`AGENTS=50` and `RUNS=3` by
//! default). `LOCKSTEP_BENCH_QUICK=1`: 5 agents, one round, the same checks (CI runs it).
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockstep_agent::cli::bootstrap::ControllerFile;
use lockstep_agent::datadir::{self, DataDir};
use lockstep_core::policy::{CatalogueEntry, Sha256, Stream};
use lockstep_core::{Binary, Version};
use serde_json::Value;
use sha2::Digest;

const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");
const LOCKSTEPD: &str = env!("CARGO_BIN_EXE_lockstepd");

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn lockstep(data: &DataDir, args: &[&str]) -> Output {
    let output = Command::new(LOCKSTEP)
        .arg("--data-dir")
        .arg(data.root())
        // Juju's client store beside the temporary data dir, never the real one.
        .env("JUJU_DATA", data.root().with_file_name("juju"))
        .args(args)
        .output()
        .expect("lockstep runs");
    assert!(
        output.status.success(),
        "lockstep {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// How many host machines report `started` on `version`.
fn agents_on(data: &DataDir, version: Version) -> usize {
    let output = lockstep(data, &["status", "--format", "json"]);
    let status: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    status["machines"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, machine)| {
            machine["jobs"]
                .as_array()
                .is_some_and(|jobs| !jobs.iter().any(|job| job == "JobManageModel"))
                && machine["agent-status"]["status"] == "started"
                && machine["agent-status"]["version"] == version.to_string()
        })
        .count()
}

fn wait_for_agents(data: &DataDir, count: usize, version: Version, within: Duration) {
    let deadline = Instant::now() + within;
    while agents_on(data, version) < count {
        assert!(
            Instant::now() < deadline,
            "{count} agents not on {version} within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Resident memory of a process, bytes.
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kilobytes = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
                kilobytes.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kilobytes| kilobytes * 1024)
}

/// The controller's peak resident memory: the launcher's, the worker's, and their sum.
#[derive(Default)]
struct Peaks {
    launcher: AtomicU64,
    worker: AtomicU64,
    total: AtomicU64,
}

/// Samples the controller's launcher and worker every 100 ms until `stop`.
fn sample_memory(data: DataDir, stop: Arc<AtomicBool>, peaks: Arc<Peaks>) {
    while !stop.load(Ordering::SeqCst) {
        if let Some(launcher) = pid_in(&data.pid_path()) {
            let worker = lockstep_agent::cli::demo::worker_pid(launcher).map_or(0, rss_bytes);
            let launcher = rss_bytes(launcher);
            peaks.launcher.fetch_max(launcher, Ordering::SeqCst);
            peaks.worker.fetch_max(worker, Ordering::SeqCst);
            peaks.total.fetch_max(launcher + worker, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the agents, then the controller, by their pids.
fn stop_all(data: &DataDir) {
    for agent in data.machine_agent_dirs() {
        if let Some(pid) = pid_in(&agent.pid_path()) {
            lockstep_agent::cli::demo::stop_daemon(pid);
        }
    }
    if let Some(pid) = pid_in(&data.pid_path()) {
        lockstep_agent::cli::demo::stop_daemon(pid);
    }
}

/// Downloads `binary` from the controller's tools endpoint `count` times in a row, as the
/// admin, as an agent does it (the streams crate's HTTPS source: TLS checked against the
/// controller's CA, HTTP Basic, size and sha256 verified while the body is written to a
/// file).
async fn downloads(data: &DataDir, binary: &Binary, tarball: &Path, count: usize) -> Duration {
    let file = ControllerFile::read(data).expect("controller.yaml");
    let mut config = lockstep_streams::HttpConfig {
        system_roots: false,
        basic_auth: Some(lockstep_streams::BasicAuth {
            user: format!("user-{}", file.user),
            password: file.password.clone(),
        }),
        ..lockstep_streams::HttpConfig::default()
    };
    config.trust_pem(file.ca_cert.as_bytes()).expect("the CA");
    let base = format!(
        "https://{}/model/{}/tools/",
        file.api_endpoints[0], file.model_uuid
    );
    let source = lockstep_streams::HttpSource::new(&base, config).expect("an HTTPS source");
    let bytes = std::fs::read(tarball).expect("the controller's cached tarball");
    let digest: [u8; 32] = sha2::Sha256::digest(&bytes).into();
    let entry = CatalogueEntry {
        binary: binary.clone(),
        stream: Stream::Released,
        size_bytes: bytes.len() as u64,
        sha256: Sha256(digest),
        path: binary.to_string(),
    };
    let scratch = tempfile::tempdir().unwrap();
    let destination = scratch.path().join("download.tgz");
    let started = Instant::now();
    for _ in 0..count {
        source
            .download(&entry, &destination, &mut |_| {})
            .await
            .expect("the download verifies");
    }
    started.elapsed()
}

struct Round {
    fleet: Duration,
    baseline: Duration,
    /// Peak resident bytes: launcher, worker, both.
    peaks: (u64, u64, u64),
}

async fn round(source: &str, key: &str, agents: usize, own: Version, next: Version) -> Round {
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::new(dir.path().join("controller"));
    lockstep(
        &data,
        &[
            "bootstrap",
            "--api-port",
            "0",
            "--metadata-source",
            source,
            "--metadata-key",
            key,
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let peaks = Arc::new(Peaks::default());
    let sampler = {
        let (data, stop, peaks) = (data.clone(), Arc::clone(&stop), Arc::clone(&peaks));
        std::thread::spawn(move || sample_memory(data, stop, peaks))
    };
    let result = std::panic::AssertUnwindSafe(async {
        lockstep(&data, &["add-machine", "-n", &agents.to_string()]);
        wait_for_agents(&data, agents, own, Duration::from_secs(300));
        let started = Instant::now();
        lockstep(&data, &["upgrade-controller"]);
        wait_for_agents(&data, agents, next, Duration::from_secs(600));
        let fleet = started.elapsed();
        let binary = datadir::host_binary(next);
        for agent in data.machine_agent_dirs() {
            let downloaded = agent
                .read_downloaded_tools(&binary)
                .unwrap()
                .expect("each agent downloaded N+1");
            assert!(
                downloaded.url.starts_with("https://127.0.0.1:"),
                "{}",
                downloaded.url
            );
        }
        let tarball = data.cached_tarball_path(&binary);
        let baseline = downloads(&data, &binary, &tarball, agents).await;
        (fleet, baseline)
    });
    let outcome = futures_util::FutureExt::catch_unwind(result).await;
    stop.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    stop_all(&data);
    let (fleet, baseline) = outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    Round {
        fleet,
        baseline,
        peaks: (
            peaks.launcher.load(Ordering::SeqCst),
            peaks.worker.load(Ordering::SeqCst),
            peaks.total.load(Ordering::SeqCst),
        ),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    let number = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let agents = number("AGENTS", if quick { 5 } else { 50 });
    let runs = number("RUNS", if quick { 1 } else { 3 });
    let own = lockstep_agent::steps::build_version();
    let next = lockstep_agent::steps::next_patch();
    let keys = tempfile::tempdir().unwrap();
    let public_key = keys.path().join("metadata-public-key.asc");
    let key = lockstep_agent::cli::demo::signing_key(&public_key).unwrap();
    let mirror = tempfile::tempdir().unwrap();
    lockstep_agent::cli::demo::publish(mirror.path(), own, Path::new(LOCKSTEPD), false).unwrap();
    let tarball =
        lockstep_agent::cli::demo::publish(mirror.path(), next, Path::new(LOCKSTEPD), true)
            .unwrap();
    lockstep_agent::cli::demo::generate(mirror.path(), Some(&key)).unwrap();
    let source = mirror.path().to_str().unwrap().to_owned();
    let public_key = public_key.to_str().unwrap().to_owned();

    let mut rounds = Vec::new();
    for _ in 0..runs {
        rounds.push(round(&source, &public_key, agents, own, next).await);
    }
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    println!(
        "{agents} machine agents, {runs} rounds{}; lockstepd {:.1} MB, its tarball {:.1} MB",
        if quick { ", quick" } else { "" },
        mb(std::fs::metadata(LOCKSTEPD).unwrap().len()),
        mb(std::fs::metadata(&tarball).unwrap().len()),
    );
    for (index, round) in rounds.iter().enumerate() {
        println!(
            "round {}: fleet upgrade {:>9.1} ms  {agents} downloads {:>9.1} ms  controller peak RSS {:.1} MB (launcher {:.1}, worker {:.1})",
            index + 1,
            ms(round.fleet),
            ms(round.baseline),
            mb(round.peaks.2),
            mb(round.peaks.0),
            mb(round.peaks.1)
        );
    }
    let fleet = median(&rounds.iter().map(|round| round.fleet).collect::<Vec<_>>());
    let baseline = median(
        &rounds
            .iter()
            .map(|round| round.baseline)
            .collect::<Vec<_>>(),
    );
    let peak = rounds.iter().map(|round| round.peaks.2).max().unwrap_or(0);
    println!(
        "median fleet upgrade {:.1} ms, median {agents} downloads {:.1} ms, peak controller RSS {:.1} MB",
        ms(fleet),
        ms(baseline),
        mb(peak)
    );
    println!(
        "ratio fleet upgrade / {agents} downloads: {:.2}",
        fleet.as_secs_f64() / baseline.as_secs_f64()
    );
}
