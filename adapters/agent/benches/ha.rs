//! Highly available controllers on a real 3-member etcd cluster, as medians of repeated
//! rounds (each round sets everything up afresh, on 127.0.0.1):
//! - coordinated upgrade time: from `lockstep upgrade-controller --agent-version N+1` until
//!   every controller answers Ready on N+1, for one controller on etcd (the baseline, run in
//!   the same process) and for three (`enable-ha -n 3`); the ratio is three over one;
//! - coordinator takeover after kill -9: the coordinator is killed inside its database step
//!   (the failpoint pauses it there), until another controller holds the lease. The bound
//!   is etcd's lease TTL (5 s) plus one campaign retry (1 s).
//!
//! Run: `cargo bench -p lockstep-agent --features etcd --bench ha` (`RUNS=N` rounds, 3 by
//! default; needs etcd, `.ci/install-etcd`). `LOCKSTEP_BENCH_QUICK=1` takes one round (same
//! code paths, same checks): CI runs it so that a broken bench fails.
#![allow(clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../../store/tests/support/etcd_cluster.rs"]
mod etcd_cluster;
#[path = "../tests/common/ha.rs"]
mod ha_harness;

use std::time::{Duration, Instant};

use common::next;
use ha_harness::{DB_STEP_PAUSE_MS, Ha};

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn upgrade_time(count: u8) -> Duration {
    let ha = Ha::start_n(count, &[]);
    let started = Instant::now();
    ha.upgrade();
    ha.wait_all_running(next()).await;
    started.elapsed()
}

async fn takeover_time() -> Duration {
    let ha = Ha::start(&[(
        lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
        DB_STEP_PAUSE_MS,
    )]);
    let (_, _, takeover) = ha.kill_coordinator_in_database_step().await;
    takeover
}

fn show(name: &str, samples: &mut [Duration]) -> Duration {
    let median = median(samples);
    println!(
        "{name:<44} median {:>8.2?}  min {:>8.2?}  max {:>8.2?}  ({} runs)",
        median,
        samples[0],
        samples[samples.len() - 1],
        samples.len()
    );
    median
}

fn main() {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let (mut one, mut three, mut takeover) = (Vec::new(), Vec::new(), Vec::new());
        // Interleaved, so that a noisy minute weighs on every kind alike.
        for _ in 0..runs {
            one.push(upgrade_time(1).await);
            three.push(upgrade_time(3).await);
            takeover.push(takeover_time().await);
        }
        let one = show("upgrade, 1 controller on etcd (baseline)", &mut one);
        let three = show("upgrade, 3 controllers on etcd", &mut three);
        println!(
            "{:<44} {:.2}x",
            "ratio 3 controllers / 1",
            three.as_secs_f64() / one.as_secs_f64()
        );
        show("coordinator takeover after kill -9", &mut takeover);
    });
}
