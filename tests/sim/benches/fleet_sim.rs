//! The fleet bench (issue 21, part 4): 3 controllers and 10,000 machine agents upgrade in
//! the deterministic simulator with faults (crashes, lost, held back and duplicated
//! messages, slow and jittery links, "busy" answers from the controllers' download
//! admission), downloads taking time on the link model. It prints the simulator's wall
//! time, the downloads' median and p99, the busy answers and, last, the ratio of the
//! fleet's upgrade time (virtual) to the bandwidth bound, `agents × binary size / (sum of
//! the controllers' egress) + binary size / upstream`; the issue's target is 1.1×.
//!
//! ```text
//! cargo bench -p lockstep-sim --bench fleet_sim
//! LOCKSTEP_BENCH_QUICK=1 cargo test -p lockstep-sim --benches   # CI: 300 agents
//! LOCKSTEP_FLEET_AGENTS=2000 LOCKSTEP_FLEET_SEED=7 cargo bench -p lockstep-sim --bench fleet_sim
//! ```
//!
//! The run must pass (every agent Ready on the target, every checker quiet): a failure
//! exits non-zero after printing what it measured. The ratio is reported, not asserted.
#![allow(
    clippy::print_stdout,
    reason = "a bench reports on its standard output"
)]

use lockstep_sim::fleet::run_fleet;
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
    let seed = std::env::var("LOCKSTEP_FLEET_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1);
    let run = run_fleet(seed, agents, Fleet::default());
    println!("{}", run.scenario);
    println!("{}", run.summary());
    if run.report.failure.is_some() {
        std::process::exit(1);
    }
}
