//! Time from Ready to the first successful call, real clients against a real controller
//! going through a real upgrade.
//!
//! Each round bootstraps a controller with `lockstep bootstrap --auto-upgrade
//! --no-fetch-ahead` from a mirror holding this build as N and N+1, so that it downloads
//! N+1 itself, re-executes into it
//! (closing every connection), runs N+1's steps and only then opens its full API. Three
//! clients are waiting for it before it starts, each setting a model config key with
//! `ModelConfig.ModelSet` (a write: answered `upgrade in progress` until Ready, while reads
//! are served in every phase):
//!
//! - python-jujuclient 0.54.0, unchanged (`jujuclient_first_call.py`, in a virtualenv made
//!   under the target directory from PyPI): it resends a refused call once a second; the
//!   script connects and logs in again 10 ms after a connection closes, which jujuclient
//!   does not do by itself;
//! - lockstep's client waiting by subscription (`Client::wait_ready`, `Upgrade.WatchProgress`)
//!   and then calling;
//! - lockstep's client calling straight away (`Client::call`: capped, jittered backoff
//!   from 100 ms to 3 s between refused attempts, as `mutate` and the demo's deployer do).
//!
//! Ready is the moment the controller logged that it opened its full API (`gate ...
//! limited=false`, logged just before the gate view is published); each client's time is
//! the wall clock when its first successful answer arrived. A round counts only if every
//! client was already waiting before Ready (asserted). Prints the median of each, and the
//! ratios (jujuclient / lockstep) last.
//!
//! Run: `cargo bench -p lockstep-agent --bench jujuclient` (`RUNS=N` rounds, default 11;
//! needs `python3` with `venv` and PyPI the first time). `LOCKSTEP_BENCH_QUICK=1` takes one
//! round (same code paths, same checks), so that `LOCKSTEP_BENCH_QUICK=1 cargo test -p
//! lockstep-agent --bench jujuclient` runs it briefly and fails if it is broken.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

#[path = "../tests/common/python.rs"]
mod python;

use lockstep_agent::cli::bootstrap::ControllerFile;
use lockstep_agent::datadir::DataDir;
use lockstep_core::client::RetryPolicy;
use serde_json::{Value, json};

const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");
const LOCKSTEPD: &str = env!("CARGO_BIN_EXE_lockstepd");
const ROUND_DEADLINE: Duration = Duration::from_secs(120);

fn unix_micros(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// When the controller first logged a line with every one of `words`, from its text log.
fn logged_unix_micros(log: &str, words: &[&str]) -> Option<i64> {
    log.lines().find_map(|line| {
        let plain = strip_ansi(line);
        if !words.iter().all(|word| plain.contains(word)) {
            return None;
        }
        let stamp = plain.split_whitespace().next()?;
        lockstep_agent::cli::demo::parse_rfc3339_micros(stamp).map(|micros| micros as i64)
    })
}

fn strip_ansi(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// A child process, killed by its pid if the round ends before it does.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One of lockstep's clients: waits for `controller.yaml`, then (after `wait_ready` when
/// `subscribe`) calls `ModelConfig.ModelSet` until it succeeds. Returns when it first
/// tried and when it succeeded, in µs since the Unix epoch.
async fn lockstep_first_call(data_dir: PathBuf, subscribe: bool) -> (i64, i64) {
    let data = DataDir::new(&data_dir);
    let started = Instant::now();
    let controller = loop {
        if let Ok(controller) = ControllerFile::read(&data) {
            break controller;
        }
        assert!(started.elapsed() < ROUND_DEADLINE, "no controller.yaml");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let client = controller.client(RetryPolicy::default());
    let tried = unix_micros(SystemTime::now());
    if subscribe {
        client
            .wait_ready(ROUND_DEADLINE)
            .await
            .expect("lockstep's client saw Ready");
    }
    client
        .call(
            "ModelConfig",
            3,
            "ModelSet",
            json!({"config": {"logging-config": "<root>=INFO"}}),
            ROUND_DEADLINE,
        )
        .await
        .expect("ModelConfig.ModelSet succeeds");
    (tried, unix_micros(SystemTime::now()))
}

/// Milliseconds from Ready to each client's first successful call, in one round.
struct Round {
    /// The re-exec into N+1, before Ready (negative).
    re_exec_ms: f64,
    jujuclient_ms: f64,
    subscribed_ms: f64,
    retrying_ms: f64,
    jujuclient_sends: u64,
    jujuclient_connections: u64,
}

async fn round(source: &str, public_key: &str, python: &Path, script: &Path) -> Round {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data_dir = dir.path().join("controller");
    let data = DataDir::new(&data_dir);

    let mut jujuclient = Reaped(
        Command::new(python)
            .arg(script)
            .arg(data.controller_config_path())
            .arg(ROUND_DEADLINE.as_secs().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python starts"),
    );
    let mut stdout = BufReader::new(jujuclient.0.stdout.take().expect("piped"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("the script's first line");
    assert_eq!(line.trim(), "waiting", "the script did not start");

    let subscribed = tokio::spawn(lockstep_first_call(data_dir.clone(), true));
    let retrying = tokio::spawn(lockstep_first_call(data_dir.clone(), false));
    let bootstrap = tokio::task::spawn_blocking({
        let data_dir = data_dir.clone();
        let source = source.to_owned();
        let public_key = public_key.to_owned();
        move || {
            Command::new(LOCKSTEP)
                .arg("--data-dir")
                .arg(&data_dir)
                // Juju's client store beside the temporary data dir, never the real one.
                .env("JUJU_DATA", data_dir.with_file_name("juju"))
                .args([
                    "bootstrap",
                    "--api-port",
                    "0",
                    "--auto-upgrade",
                    "--no-fetch-ahead",
                ])
                .args(["--metadata-source", &source, "--metadata-key", &public_key])
                .output()
                .expect("lockstep runs")
        }
    })
    .await
    .expect("bootstrap joined");
    let subscribed = subscribed.await.expect("joined");
    let retrying = retrying.await.expect("joined");
    let reported = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        stdout
            .read_to_string(&mut rest)
            .expect("the script's output");
        let status = jujuclient.0.wait().expect("python ends");
        let mut stderr = String::new();
        if let Some(mut pipe) = jujuclient.0.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        assert!(
            status.success(),
            "jujuclient failed ({status}): {rest}\n{stderr}"
        );
        serde_json::from_str::<Value>(rest.trim()).expect("one JSON line")
    })
    .await
    .expect("joined");

    let log = std::fs::read_to_string(data.logs_dir().join("lockstepd.log")).unwrap_or_default();
    if let Ok(pid) = std::fs::read_to_string(data.pid_path()) {
        lockstep_agent::cli::demo::stop_daemon(pid.trim().parse().expect("a pid"));
    }
    assert!(
        bootstrap.status.success() && log.contains("re-executing"),
        "bootstrap through an upgrade failed: {}\n{log}",
        String::from_utf8_lossy(&bootstrap.stderr)
    );
    // Ready: the gate opened to the full API; the re-exec into N+1 closed every connection.
    let ready =
        logged_unix_micros(&log, &[" gate ", "limited=false"]).expect("a gate-ready log line");
    let re_exec = logged_unix_micros(&log, &[" re-executing "]).expect("a re-exec log line");
    let seconds = |key: &str| (reported[key].as_f64().expect(key) * 1e6) as i64;
    let first_sent = seconds("first_sent_unix");
    assert!(
        first_sent < ready && reported["model_set_sends"].as_u64() >= Some(2),
        "jujuclient was not waiting before Ready (first ModelSet at {first_sent} µs, Ready at \
         {ready} µs): {reported}"
    );
    assert!(
        subscribed.0 < ready && retrying.0 < ready,
        "lockstep's clients were not waiting before Ready"
    );
    let ms = |at: i64| (at - ready) as f64 / 1e3;
    Round {
        re_exec_ms: ms(re_exec),
        jujuclient_ms: ms(seconds("success_unix")),
        subscribed_ms: ms(subscribed.1),
        retrying_ms: ms(retrying.1),
        jujuclient_sends: reported["model_set_sends"].as_u64().unwrap_or(0),
        jujuclient_connections: reported["connections"].as_u64().unwrap_or(0),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(if quick { 1 } else { 11 });
    let python = tokio::task::spawn_blocking(python::python)
        .await
        .expect("venv");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jujuclient_first_call.py");
    let own = lockstep_agent::steps::build_version();
    let next = lockstep_agent::steps::next_patch();
    let mirror = tempfile::tempdir().expect("a temporary directory");
    lockstep_agent::cli::demo::publish(mirror.path(), own, Path::new(LOCKSTEPD), false).unwrap();
    lockstep_agent::cli::demo::publish(mirror.path(), next, Path::new(LOCKSTEPD), true).unwrap();
    let public_key = mirror.path().join("metadata-public-key.asc");
    let key = lockstep_agent::cli::demo::signing_key(&public_key).unwrap();
    lockstep_agent::cli::demo::generate(mirror.path(), Some(&key)).unwrap();
    let source = mirror.path().to_str().expect("UTF-8").to_owned();
    let public_key = public_key.to_str().expect("UTF-8").to_owned();

    let mut rounds = Vec::new();
    for index in 0..runs {
        let round = round(&source, &public_key, &python, &script).await;
        println!(
            "round {index:>2}: re-exec {:>6.1} ms before Ready; from Ready to the first \
             successful ModelSet: jujuclient {:>6.1} ms ({} ModelSet sent, {} connections), \
             lockstep subscribed {:>6.1} ms, lockstep retrying {:>6.1} ms",
            -round.re_exec_ms,
            round.jujuclient_ms,
            round.jujuclient_sends,
            round.jujuclient_connections,
            round.subscribed_ms,
            round.retrying_ms
        );
        rounds.push(round);
    }
    let jujuclient = median(rounds.iter().map(|r| r.jujuclient_ms).collect());
    let subscribed = median(rounds.iter().map(|r| r.subscribed_ms).collect());
    let retrying = median(rounds.iter().map(|r| r.retrying_ms).collect());
    let re_exec = median(rounds.iter().map(|r| -r.re_exec_ms).collect());
    println!(
        "median of {runs} rounds{} (the re-exec into N+1, which closes every connection, \
         {re_exec:.1} ms before Ready), from Ready to the first successful ModelSet:",
        if quick { ", quick" } else { "" }
    );
    println!("  python-jujuclient 0.54.0 (resends every 1 s)     {jujuclient:>8.1} ms");
    println!("  lockstep client, wait_ready (WatchProgress)      {subscribed:>8.1} ms");
    println!("  lockstep client, call (backoff 100 ms to 3 s)    {retrying:>8.1} ms");
    println!(
        "ratio jujuclient / lockstep wait_ready: {:.2}x; jujuclient / lockstep call: {:.2}x",
        jujuclient / subscribed,
        jujuclient / retrying
    );
}
