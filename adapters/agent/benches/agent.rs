//! Whole-process timings of the agent, as medians of repeated runs:
//! - process start to Ready without an upgrade: `lockstepd` started on a bootstrapped data
//!   dir until `Upgrade.Status` answers `ready` (Juju took 17 s in seed 000);
//! - bootstrap to Ready through an upgrade: `lockstep bootstrap --auto-upgrade` against a
//!   mirror holding this build as N and N+1, from start to exit (which it does once the
//!   API is fully available on N+1).
//!
//! Run: `cargo bench -p lockstep-agent --bench agent` (`RUNS=N` to change the count).
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lockstep_agent::bootstrap::ControllerFile;
use lockstep_agent::datadir::DataDir;
use lockstep_core::client::RetryPolicy;
use serde_json::json;

const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");
const LOCKSTEPD: &str = env!("CARGO_BIN_EXE_lockstepd");

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn bootstrap(data_dir: &Path, args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new(LOCKSTEP)
        .arg("--data-dir")
        .arg(data_dir)
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

fn launcher_pid(data: &DataDir) -> Option<u32> {
    std::fs::read_to_string(lockstep_agent::paths::pid_path(data))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn stop(data: &DataDir) {
    if let Some(pid) = launcher_pid(data) {
        lockstep_agent::demo::stop_daemon(pid);
    }
}

async fn start_to_ready(data: &DataDir) -> Duration {
    let controller = ControllerFile::read(data).expect("controller.yaml");
    let client = controller.client(RetryPolicy {
        initial: lockstep_core::Millis(1),
        maximum: lockstep_core::Millis(5),
        attempts_max: 100_000,
    });
    let started = Instant::now();
    let mut child = Command::new(data.agent_link("machine-0").join("lockstepd"))
        .arg("--data-dir")
        .arg(data.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lockstepd starts");
    loop {
        if let Ok(status) = client
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(30))
            .await
            && status["phase"] == "ready"
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    lockstep_agent::demo::stop_daemon(child.id());
    let _ = child.wait();
    elapsed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(7);
    let own = lockstep_agent::steps::build_version();
    let next = lockstep_agent::steps::next_patch();
    let mirror = tempfile::tempdir().unwrap();
    lockstep_agent::demo::publish(mirror.path(), own, Path::new(LOCKSTEPD), false).unwrap();
    lockstep_agent::demo::publish(mirror.path(), next, Path::new(LOCKSTEPD), true).unwrap();
    lockstep_agent::demo::generate(mirror.path()).unwrap();
    let source = mirror.path().to_str().unwrap().to_owned();

    // Start to Ready without an upgrade, on one bootstrapped data dir.
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::new(dir.path().join("controller"));
    bootstrap(data.root(), &[]);
    stop(&data);
    let mut start = Vec::new();
    for _ in 0..runs {
        start.push(start_to_ready(&data).await);
    }
    stop(&data);

    // Bootstrap through an upgrade, each run on a fresh data dir.
    let mut through = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        through.push(bootstrap(
            data.root(),
            &["--auto-upgrade", "--metadata-source", &source],
        ));
        stop(&data);
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        plain.push(bootstrap(data.root(), &[]));
        stop(&data);
    }
    let fmt = |samples: &mut Vec<Duration>| {
        let min = *samples.iter().min().unwrap();
        let max = *samples.iter().max().unwrap();
        format!(
            "median {:>8.1} ms  (min {:.1}, max {:.1}, {} runs)",
            median(samples).as_secs_f64() * 1e3,
            min.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            samples.len()
        )
    };
    println!(
        "lockstepd start to Ready, no upgrade:        {}",
        fmt(&mut start)
    );
    println!(
        "bootstrap to Ready, no upgrade:              {}",
        fmt(&mut plain)
    );
    println!(
        "bootstrap to Ready through an upgrade:       {}",
        fmt(&mut through)
    );
    println!(
        "ratio (through an upgrade / no upgrade):     {:.2}",
        median(&mut through).as_secs_f64() / median(&mut plain).as_secs_f64()
    );
}
