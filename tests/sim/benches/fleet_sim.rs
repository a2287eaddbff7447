//! The fleet bench (issue 21, part 4): 3 controllers and 10,000 machine agents upgrade in
//! the deterministic simulator with faults (crashes, lost, held back and duplicated
//! messages, slow and jittery links, "busy" answers from the controllers' download
//! admission), downloads taking time on the link model. It prints the simulator's wall
//! time, the downloads' median and p99, the busy answers and, last, the ratio of the
//! fleet's upgrade time (virtual) to the bandwidth bound, `agents × binary size / (sum of
//! the controllers' egress) + binary size / upstream`; the issue's target is 1.1×.
//!
//! Each seed runs twice: as a fleet's first rollout (no agent's download rate known at the
//! start: each probes its link after its start spread, as the real agent does) and as a later one (each agent's rate from its last download known, so
//! slow links are admitted early and canaries are the fastest); the later one prints last.
//!
//! ```text
//! cargo bench -p lockstep-sim --bench fleet_sim
//! LOCKSTEP_BENCH_QUICK=1 cargo test -p lockstep-sim --benches   # CI: 300 agents
//! LOCKSTEP_FLEET_AGENTS=2000 LOCKSTEP_FLEET_SEED=7 cargo bench -p lockstep-sim --bench fleet_sim
//! LOCKSTEP_FLEET_SEEDS=1..11 cargo bench -p lockstep-sim --bench fleet_sim  # one line a seed, medians
//! ```
//!
//! Every run must pass (every agent Ready on the target, every checker quiet): a failure
//! exits non-zero after printing what was measured. The ratio is reported, not asserted.
#![allow(
    clippy::print_stdout,
    reason = "a bench reports on its standard output"
)]

use lockstep_sim::fleet::{FleetRun, run_fleet};
use lockstep_sim::scenario::Fleet;

/// Agents of the quick mode (`LOCKSTEP_BENCH_QUICK=1`): the same code paths and checks.
const QUICK_AGENTS: u32 = 300;
/// Agents of the full bench.
const AGENTS: u32 = 10_000;

fn main() {
    let quick = std::env::var("LOCKSTEP_BENCH_QUICK").is_ok_and(|value| value == "1");
    let agents = std::env::var("LOCKSTEP_FLEET_AGENTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(if quick { QUICK_AGENTS } else { AGENTS });
    let first_rollout = Fleet {
        rates_known: false,
        ..Fleet::default()
    };
    if let Some(seeds) = std::env::var("LOCKSTEP_FLEET_SEEDS")
        .ok()
        .and_then(|value| parse_range(&value))
    {
        std::process::exit(seeds_table(seeds, agents, first_rollout));
    }
    let seed = std::env::var("LOCKSTEP_FLEET_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1);
    let mut failed = false;
    for (name, fleet) in [
        ("a first rollout", first_rollout),
        ("a later rollout", Fleet::default()),
    ] {
        let run = run_fleet(seed, agents, fleet);
        println!("-- {name}:");
        println!("{}", run.scenario);
        println!("{}", run.summary());
        failed |= run.report.failure.is_some();
    }
    if failed {
        std::process::exit(1);
    }
}

/// `a..b` (b excluded).
fn parse_range(text: &str) -> Option<std::ops::Range<u64>> {
    let (from, to) = text.split_once("..")?;
    Some(from.trim().parse().ok()?..to.trim().parse().ok()?)
}

/// One line a seed (the first rollout's ratio, the later one's), then the medians, the
/// later rollout's last; the exit code: 1 if any run failed.
fn seeds_table(seeds: std::ops::Range<u64>, agents: u32, first_rollout: Fleet) -> i32 {
    let shown = |run: &FleetRun| match (run.report.failure.is_some(), run.ratio()) {
        (false, Some(ratio)) => format!("{ratio:.2}x"),
        _ => "FAILED".to_owned(),
    };
    let (mut first, mut later, mut failed) = (Vec::new(), Vec::new(), false);
    for seed in seeds {
        let a = run_fleet(seed, agents, first_rollout);
        let b = run_fleet(seed, agents, Fleet::default());
        println!(
            "seed {seed}: first rollout {} (wall {:.1} s), later rollout {} (wall {:.1} s)",
            shown(&a),
            a.wall.as_secs_f64(),
            shown(&b),
            b.wall.as_secs_f64()
        );
        for (run, ratios) in [(&a, &mut first), (&b, &mut later)] {
            match run.ratio().filter(|_| run.report.failure.is_none()) {
                Some(ratio) => ratios.push(ratio),
                None => {
                    failed = true;
                    println!("  seed {seed} failed: {:?}", run.report.failure);
                }
            }
        }
    }
    let median = |ratios: &mut Vec<f64>| {
        ratios.sort_by(f64::total_cmp);
        match ratios.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => ratios[n / 2],
            n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
        }
    };
    println!(
        "median ratio, first rollout: {:.2}x over {} runs",
        median(&mut first),
        first.len()
    );
    println!(
        "median ratio, later rollout: {:.2}x over {} runs (target <= 1.1x)",
        median(&mut later),
        later.len()
    );
    i32::from(failed)
}
