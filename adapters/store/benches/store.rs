//! Durable step-checkpoint commits per second (SQLite WAL + `synchronous=FULL`, and the
//! in-memory engine with full durability, on a fresh store and on one already holding
//! 10,000 applications and their events), and watch replay throughput (`changes_since`
//! paging through 100k events). Plain `std::time`; medians over several rounds.
//!
//! Run: `cargo bench -p lockstep-store --bench store`. Disk-bound figures swing 2-5× while
//! something else writes to the same disk: compare within one run. `LOCKSTEP_BENCH_QUICK=1`
//! runs one round of a tenth of the work (same code paths, same checks): CI runs it so that
//! a broken bench fails.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use lockstep_core::Version;
use lockstep_core::lifecycle::{Revision, StepOutcome};
use lockstep_core::steps::{StepId, StepKey};
use lockstep_store::{
    Application, Changes, Durability, Life, MemoryStore, OpenMode, SqliteStore, Store, Tx,
};

const ROUNDS: usize = 7;
const SQLITE_COMMITS: usize = 400;
const MEMORY_COMMITS: usize = 2_000;
/// Applications (and as many events) in the in-memory store before its second commit run:
/// a commit's cost must not grow with the state.
const LARGE_STATE: usize = 10_000;
const EVENTS: usize = 100_000;
const PAGE: usize = 1000;

/// How much work a run does: the full run, or `LOCKSTEP_BENCH_QUICK=1`'s (anything but `0`)
/// one round of a tenth, for CI.
#[derive(Clone, Copy)]
struct Size {
    rounds: usize,
    sqlite_commits: usize,
    memory_commits: usize,
    large_state: usize,
    events: usize,
}

impl Size {
    fn from_env() -> Size {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        let divisor = if quick { 10 } else { 1 };
        Size {
            rounds: if quick { 1 } else { ROUNDS },
            sqlite_commits: SQLITE_COMMITS / divisor,
            memory_commits: MEMORY_COMMITS / divisor,
            large_state: LARGE_STATE / divisor,
            events: EVENTS / divisor,
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Step ids `s0`..: checkpoints of distinct steps for one target version.
fn key(round: usize, index: usize) -> StepKey {
    StepKey {
        id: StepId::parse(&format!("step-{round}-{index}")).expect("a step id"),
        target_version: Version::new(0, 1, 0),
    }
}

/// Commits per second of `count` database steps, each its own durable transaction (one
/// small write and its checkpoint).
fn step_commits(store: &dyn Store, round: usize, count: usize) -> f64 {
    let started = Instant::now();
    for index in 0..count {
        let outcome = store
            .run_database_step(key(round, index), None, &mut |tx| {
                tx.put_application(&Application {
                    name: format!("app-{round}-{index}"),
                    charm: "ch:amd64/jammy/mysql-1".to_owned(),
                    life: Life::Alive,
                })?;
                Ok(())
            })
            .expect("step");
        assert_eq!(outcome, StepOutcome::Applied);
    }
    count as f64 / started.elapsed().as_secs_f64()
}

fn fill(store: &dyn Store, events: usize) {
    for batch in 0..events / 1000 {
        store
            .transaction(None, &mut |tx| {
                for index in 0..1000 {
                    (tx as &mut dyn Tx).put_application(&Application {
                        name: format!("fill-{batch}-{index}"),
                        charm: "ch:amd64/jammy/wordpress-7".to_owned(),
                        life: Life::Alive,
                    })?;
                }
                Ok(())
            })
            .expect("fill");
    }
}

/// Events per second replayed from revision 0, `PAGE` at a time.
fn replay(store: &dyn Store, events: usize) -> f64 {
    let started = Instant::now();
    let mut after = Revision(0);
    let mut seen = 0;
    loop {
        match store.changes_since(after, PAGE).expect("changes") {
            Changes::Events { events, .. } => {
                let Some(last) = events.last() else { break };
                after = last.revision;
                seen += events.len();
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(seen >= events, "{seen}");
    seen as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let size = Size::from_env();
    let rounds = size.rounds;
    let dir = tempfile::tempdir().expect("a temp dir");
    let sqlite = SqliteStore::open(dir.path().join("bench.db"), OpenMode::ReadWrite).expect("open");
    let mut sqlite_rates = Vec::new();
    let mut memory_rates = Vec::new();
    let mut large_rates = Vec::new();
    for round in 0..rounds {
        sqlite_rates.push(step_commits(&sqlite, round, size.sqlite_commits));
        // A fresh store each round, and one already holding `large_state` applications:
        // the two rates should match (a commit's cost does not grow with the state).
        let memory = MemoryStore::new(Durability::Full);
        memory_rates.push(step_commits(&memory, round, size.memory_commits));
        let large = MemoryStore::new(Durability::Full);
        fill(&large, size.large_state);
        large_rates.push(step_commits(&large, round, size.memory_commits));
    }
    println!(
        "step checkpoints, durable commits/s (median of {rounds} rounds): sqlite WAL+FULL {:.0} \
         ({} per round), memory Full {:.0} ({} per round, fresh store), memory Full {:.0} \
         ({} per round, store holding {} applications)",
        median(sqlite_rates.clone()),
        size.sqlite_commits,
        median(memory_rates.clone()),
        size.memory_commits,
        median(large_rates.clone()),
        size.memory_commits,
        size.large_state,
    );
    println!("  sqlite rounds: {sqlite_rates:.0?}");
    println!("  memory rounds: {memory_rates:.0?}");
    println!("  memory {} rounds: {large_rates:.0?}", size.large_state);

    let replay_dir = tempfile::tempdir().expect("a temp dir");
    let sqlite =
        SqliteStore::open(replay_dir.path().join("replay.db"), OpenMode::ReadWrite).expect("open");
    let memory = MemoryStore::new(Durability::Full);
    fill(&sqlite, size.events);
    fill(&memory, size.events);
    let sqlite_replays: Vec<f64> = (0..rounds).map(|_| replay(&sqlite, size.events)).collect();
    let memory_replays: Vec<f64> = (0..rounds).map(|_| replay(&memory, size.events)).collect();
    println!(
        "watch replay of {} events, pages of {PAGE}, events/s (median of {rounds}): \
         sqlite {:.0}, memory {:.0}",
        size.events,
        median(sqlite_replays.clone()),
        median(memory_replays.clone())
    );
    println!("  sqlite rounds: {sqlite_replays:.0?}");
    println!("  memory rounds: {memory_replays:.0?}");
}
