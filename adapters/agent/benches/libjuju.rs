//! python-libjuju against a real controller, as its users call it: `Model().connect()` with
//! no arguments (the controller found through Juju's client store, which `lockstep
//! bootstrap` wrote) then `get_status()`, wall time.
//!
//! One controller is bootstrapped (`lockstep bootstrap`, `JUJU_DATA` in a temporary
//! directory); then one Python process (`libjuju_connect_status.py`, python-libjuju 3.6.1.3
//! in the interop tests' virtualenv) connects, reads status and disconnects `RUNS` times
//! (default 21), each time a new `Model`, and reports each round's seconds. The first round
//! pays Python's first imports of the connection code, so it is reported apart and left out
//! of the median. Prints the median and range of connect, of `get_status`, and of both.
//!
//! Run: `cargo bench -p lockstep-agent --bench libjuju` (the first run makes the virtualenv
//! from PyPI). `LOCKSTEP_BENCH_QUICK=1` runs three rounds (same code paths, same checks), so
//! that `LOCKSTEP_BENCH_QUICK=1 cargo test -p lockstep-agent --bench libjuju` fails if it is
//! broken.
#![allow(clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;
use common::python;

use std::path::Path;
use std::process::Command;

use common::Controller;
use serde_json::Value;

fn rounds() -> usize {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    if quick {
        return 3;
    }
    std::env::var("RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(21)
}

/// Median, minimum and maximum of `samples` (seconds), in milliseconds.
fn summary(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted: Vec<f64> = samples.iter().map(|s| s * 1000.0).collect();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    )
}

fn main() {
    let rounds = rounds();
    let python = python::python();
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let juju_data = scratch.path().join("juju");
    let juju_data_text = juju_data.to_str().expect("a UTF-8 path");
    let env = [("JUJU_DATA", juju_data_text)];
    let controller = Controller::bootstrap(&["--name", "bench"], &env);
    controller.assert_bootstrapped();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/libjuju_connect_status.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg((rounds + 1).to_string())
        .arg("--store")
        .env("JUJU_DATA", &juju_data)
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "libjuju failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(
        output
            .stdout
            .rsplit(|&b| b == b'\n')
            .find(|line| !line.is_empty())
            .expect("one JSON line"),
    )
    .expect("JSON");
    let series = |key: &str| -> Vec<f64> {
        seen[key]
            .as_array()
            .expect("a list")
            .iter()
            .map(|value| value.as_f64().expect("seconds"))
            .collect()
    };
    let (connect, status, total) = (series("connect"), series("status"), series("total"));
    assert_eq!(total.len(), rounds + 1, "{seen}");
    println!(
        "python-libjuju 3.6.1.3 against lockstepd, Model().connect() from the client store, \
         then get_status(); {rounds} rounds after a first one ({:.1} ms, imports included):",
        total[0] * 1000.0
    );
    for (name, samples) in [
        ("connect", &connect[1..]),
        ("get_status", &status[1..]),
        ("connect + get_status", &total[1..]),
    ] {
        let (median, min, max) = summary(samples);
        println!("  {name:<22} median {median:>7.1} ms  (min {min:.1}, max {max:.1})");
    }
    drop(controller);
}
