//! Download-and-verify throughput from a directory source against `sha256sum` of the same
//! file, side by side in one run: `cargo bench -p lockstep-streams --bench download`.
//!
//! The verified download reads the file once, hashing and writing a copy as it goes, then
//! fsyncs and renames the copy; `sha256sum` only reads and hashes. Each round alternates
//! the two; medians are printed with their ratio. Set `LOCKSTEP_BENCH_MIB` to change the
//! file size (default 256). `LOCKSTEP_BENCH_QUICK=1` runs one round on 8 MiB (same code
//! paths, same checks): CI runs it so that a broken bench fails.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::fs;
use std::process::Command;
use std::time::Instant;

use lockstep_core::policy::Stream;
use lockstep_streams::{
    DirectorySource, GenerateOptions, HighWaterMarkFile, LookupConfig, download,
    generate_agent_binaries, look_up,
};

const ROUNDS: usize = 5;

/// `LOCKSTEP_BENCH_QUICK=1` (anything but `0`): one short round, for CI.
fn quick() -> bool {
    std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let size_mib: usize = std::env::var("LOCKSTEP_BENCH_MIB")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(if quick() { 8 } else { 256 });
    let rounds = if quick() { 1 } else { ROUNDS };
    let site = tempfile::tempdir().unwrap();
    let stream_dir = site.path().join("tools").join(Stream::Released.as_str());
    fs::create_dir_all(&stream_dir).unwrap();
    let tarball = stream_dir.join("juju-2.9.44-ubuntu-amd64.tgz");
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let bytes: Vec<u8> = (0..size_mib << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    fs::write(&tarball, &bytes).unwrap();
    drop(bytes);
    generate_agent_binaries(
        site.path(),
        &GenerateOptions {
            now_unix_seconds: 0,
        },
    )
    .unwrap();
    let source = DirectorySource::new(site.path().join("tools")).unwrap();
    let mark = HighWaterMarkFile::new(site.path().join("mark.json"));
    let config = LookupConfig {
        freeze_after_seconds: u64::MAX,
        future_skew_seconds: u64::MAX,
        ..LookupConfig::allowing_unsigned()
    };
    let lookup = look_up(&source, &mark, &config, 0).unwrap();
    let entry = &lookup.catalogue.entries()[0];
    let destination = site.path().join("agent.tgz");

    let mut ours = Vec::new();
    let mut sha256sum = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        download(&source, entry, &destination, &mut |_| {}).unwrap();
        ours.push(started.elapsed().as_secs_f64());
        assert_eq!(fs::metadata(&destination).unwrap().len(), entry.size_bytes);
        fs::remove_file(&destination).unwrap();

        let started = Instant::now();
        let output = Command::new("sha256sum").arg(&tarball).output().unwrap();
        sha256sum.push(started.elapsed().as_secs_f64());
        assert!(output.status.success());
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(printed.starts_with(&entry.sha256.to_string()), "{printed}");
    }
    let mib = size_mib as f64;
    let ours = median(ours);
    let sha256sum = median(sha256sum);
    println!("file: {size_mib} MiB, {rounds} rounds, medians");
    println!(
        "lockstep download+verify: {:.3} s, {:.0} MiB/s",
        ours,
        mib / ours
    );
    println!(
        "sha256sum:                {:.3} s, {:.0} MiB/s",
        sha256sum,
        mib / sha256sum
    );
    println!(
        "ratio (lockstep throughput / sha256sum): {:.2}",
        sha256sum / ours
    );
}
