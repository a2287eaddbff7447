//! The etcd engine against SQLite, on real etcd processes started here (feature `etcd`):
//!
//! - step-checkpoint commit latency (one database step: one write and its checkpoint, one
//!   transaction each) on SQLite (WAL, `synchronous=FULL`), a 1-member and a 3-member etcd;
//! - watch replay (`changes_since` paging through 10k events);
//! - lease takeover: how long after the holder's last keep-alive (a coordinator killed with
//!   SIGKILL sends none) another controller holds the lease, TTL 2 s;
//! - the longest write stall when the raft leader of 3 members is killed with SIGKILL.
//!
//! Run: `cargo bench -p lockstep-store --features etcd --bench etcd`. Disk-bound figures
//! swing 2-5× while something else writes to the same disk. `LOCKSTEP_BENCH_QUICK=1` runs a
//! tenth of the commits and events and one takeover per cluster (same code paths, same
//! checks): CI runs it so that a broken bench fails.

#![allow(clippy::print_stdout)]

#[path = "../tests/support/etcd_cluster.rs"]
mod etcd_cluster;

use std::time::{Duration, Instant};

use etcd_cluster::EtcdCluster;
use lockstep_core::lifecycle::{ControllerId, Revision, StepOutcome};
use lockstep_core::steps::{StepId, StepKey};
use lockstep_core::{Millis, Version};
use lockstep_store::{
    Application, Changes, EtcdConfig, EtcdStore, Life, OpenMode, SqliteStore, Store, Tx,
};

const COMMITS: usize = 400;
const EVENTS: usize = 10_000;
const PAGE: usize = 1000;
const TAKEOVERS: usize = 3;

/// How much work a run does: the full run, or `LOCKSTEP_BENCH_QUICK=1`'s (anything but `0`)
/// tenth of the commits and events and one takeover, for CI.
#[derive(Clone, Copy)]
struct Size {
    commits: usize,
    events: usize,
    takeovers: usize,
}

impl Size {
    fn from_env() -> Size {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        let divisor = if quick { 10 } else { 1 };
        Size {
            commits: COMMITS / divisor,
            events: EVENTS / divisor,
            takeovers: if quick { 1 } else { TAKEOVERS },
        }
    }
}

fn key(index: usize) -> StepKey {
    StepKey {
        id: StepId::parse(&format!("step-{index}")).expect("a step id"),
        target_version: Version::new(0, 1, 0),
    }
}

fn add(tx: &mut dyn Tx, name: String) -> Result<(), lockstep_store::Abort> {
    tx.put_application(&Application {
        name,
        charm: "ch:amd64/jammy/mysql-1".to_owned(),
        life: Life::Alive,
    })?;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Latencies of `commits` database steps, each its own transaction.
fn step_commits(name: &str, store: &dyn Store, commits: usize) {
    let mut latencies = Vec::with_capacity(commits);
    let started = Instant::now();
    for index in 0..commits {
        let begun = Instant::now();
        let outcome = store
            .run_database_step(key(index), None, &mut |tx| add(tx, format!("app-{index}")))
            .expect("step");
        assert_eq!(outcome, StepOutcome::Applied);
        latencies.push(begun.elapsed());
    }
    let rate = commits as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "step commit, {name:<16} p50 {:>8.2?}  p99 {:>8.2?}  {rate:>7.0} steps/s",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    );
}

/// Events per second replayed by `changes_since` in pages of `PAGE`.
fn replay(name: &str, store: &dyn Store, events: usize) {
    for batch in 0..events / 100 {
        store
            .transaction(None, &mut |tx| {
                for index in 0..100 {
                    add(tx, format!("replay-{batch}-{index}"))?;
                }
                Ok(())
            })
            .expect("fill");
    }
    let started = Instant::now();
    let mut after = Revision(0);
    let mut seen = 0;
    loop {
        match store.changes_since(after, PAGE).expect("changes") {
            Changes::Events { events, .. } if events.is_empty() => break,
            Changes::Events { events, .. } => {
                seen += events.len();
                after = events.last().expect("an event").revision;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(seen >= events, "{seen}");
    println!(
        "watch replay, {name:<15} {:>9.0} events/s ({seen} events, pages of {PAGE})",
        seen as f64 / started.elapsed().as_secs_f64()
    );
}

fn connect(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    EtcdStore::connect(EtcdConfig::new(cluster.all_endpoints()).with_prefix(prefix))
        .expect("connect")
}

/// The holder stops keeping the lease alive (as a SIGKILLed coordinator does); another
/// controller polls every 50 ms.
fn takeover(name: &str, cluster: &EtcdCluster, rounds: usize) {
    let mut times = Vec::new();
    for round in 0..rounds {
        let prefix = format!("takeover-{round}");
        let (old, new) = (connect(cluster, &prefix), connect(cluster, &prefix));
        let token = old
            .acquire_lease(ControllerId(0), Millis(2000))
            .expect("acquire")
            .expect("free");
        assert_eq!(
            old.keep_alive_lease(ControllerId(0), token).unwrap(),
            Some(token)
        );
        let stopped = Instant::now();
        drop(old);
        loop {
            if new
                .acquire_lease(ControllerId(1), Millis(2000))
                .expect("acquire")
                .is_some()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        times.push(stopped.elapsed());
    }
    times.sort();
    println!(
        "lease takeover, {name:<13} median {:>8.2?} after the last keep-alive (TTL 2 s, {rounds} rounds)",
        times[times.len() / 2]
    );
}

/// `commits` steps; the leader is killed after a quarter of them.
fn leader_kill_stall(mut cluster: EtcdCluster, commits: usize) {
    let store = connect(&cluster, "stall");
    let mut slowest = Duration::ZERO;
    let mut killed = None;
    for index in 0..commits {
        if index == commits / 4 {
            let leader = cluster.leader().expect("a leader");
            cluster.kill(leader);
            killed = Some(Instant::now());
        }
        let begun = Instant::now();
        store
            .run_database_step(key(index), None, &mut |tx| add(tx, format!("app-{index}")))
            .expect("step");
        if killed.is_some() {
            slowest = slowest.max(begun.elapsed());
        }
    }
    assert!(killed.is_some(), "the leader was killed");
    println!(
        "leader SIGKILL, 3 members: longest step commit {slowest:.2?} (all {commits} applied)"
    );
}

fn main() {
    let size = Size::from_env();
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite =
        SqliteStore::open(dir.path().join("bench.db"), OpenMode::ReadWrite).expect("open sqlite");
    step_commits("sqlite", &sqlite, size.commits);
    replay("sqlite", &sqlite, size.events);

    let one = EtcdCluster::start(1, &[]);
    step_commits("etcd, 1 member", &connect(&one, "steps"), size.commits);
    replay("etcd, 1 member", &connect(&one, "replay"), size.events);
    takeover("etcd, 1 member", &one, size.takeovers);
    drop(one);

    let three = EtcdCluster::start(3, &[]);
    step_commits("etcd, 3 members", &connect(&three, "steps"), size.commits);
    replay("etcd, 3 members", &connect(&three, "replay"), size.events);
    takeover("etcd, 3 members", &three, size.takeovers);
    leader_kill_stall(three, size.commits);
}
