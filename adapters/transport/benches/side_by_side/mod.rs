//! What the two benches of calls through the front door against a direct connection share
//! (`lockstep-transport`'s `relay`, in one process, and `lockstep-agent`'s `front_door`,
//! against a real controller): a round's figures and the report, so that both print the
//! same lines. Included by path (`#[path]`) from both.

use std::future::Future;
use std::time::Duration;

/// Waits for every client of a round: all their calls' durations, and the longest a
/// client took for its calls together (the clients call concurrently, so the round's calls
/// took that long).
pub async fn gather(
    clients: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
) -> (Vec<Duration>, Duration) {
    let mut all = Vec::new();
    let mut slowest = Duration::ZERO;
    for handle in clients {
        let durations = handle.await.expect("a client of the bench");
        slowest = slowest.max(durations.iter().sum());
        all.extend(durations);
    }
    (all, slowest)
}

/// How many rounds of how many calls per client a run makes.
pub struct Plan {
    pub quick: bool,
    pub rounds: usize,
    pub calls: usize,
}

impl Plan {
    /// `rounds` of `calls`, or with `LOCKSTEP_BENCH_QUICK=1` (CI's quick mode) one round of
    /// a tenth of the calls.
    pub fn from_env(rounds: usize, calls: usize) -> Plan {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        if quick {
            Plan {
                quick,
                rounds: 1,
                calls: calls / 10,
            }
        } else {
            Plan {
                quick,
                rounds,
                calls,
            }
        }
    }

    /// What the title says of quick mode.
    pub fn note(&self) -> &'static str {
        if self.quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        }
    }
}

/// The rounds of a run, the direct path then the front door's in each: prints the
/// header, every round's line and, when both paths ran, the [`summary`]. `measure` runs
/// one round of the path it is given (`"direct"` or `"front"`), or answers `None` for a
/// path left out.
pub async fn alternate<F, Fut>(rounds: usize, mut measure: F)
where
    F: FnMut(&'static str) -> Option<Fut>,
    Fut: Future<Output = Round>,
{
    header();
    let (mut direct, mut front) = (Vec::new(), Vec::new());
    for number in 1..=rounds {
        for (path, results) in [("direct", &mut direct), ("front", &mut front)] {
            if let Some(round) = measure(path) {
                let measured = round.await;
                row(number, path, &measured);
                results.push(measured);
            }
        }
    }
    if !direct.is_empty() && !front.is_empty() {
        summary(&direct, &front);
    }
}

/// One round of one path: every client's sequential calls.
pub struct Round {
    pub calls_per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU time per call of every process involved, from the moment every client had
    /// logged in to the last reply.
    pub cpu_per_call: Duration,
}

impl Round {
    /// The round of `calls` (each call's duration, every client's). Throughput counts the
    /// calls only: the clients call concurrently, so the calls took as long as the slowest
    /// client's round trips together.
    pub fn new(mut calls: Vec<Duration>, slowest: Duration, cpu: Duration) -> Round {
        calls.sort();
        Round {
            calls_per_second: calls.len() as f64 / slowest.as_secs_f64(),
            p50: percentile(&calls, 0.5),
            p99: percentile(&calls, 0.99),
            cpu_per_call: cpu / u32::try_from(calls.len()).expect("few calls"),
        }
    }
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

/// This process's CPU time, user and system, every thread.
pub fn own_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).expect("positive"),
        u32::try_from(now.tv_nsec).expect("under a second"),
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The columns [`row`] prints.
fn header() {
    println!("round  path      calls/s      p50 µs    p99 µs   CPU µs/call");
}

/// One round's line.
fn row(number: usize, path: &str, round: &Round) {
    println!(
        "{number:>5}  {path:<7} {:>9.0} {:>11.1} {:>9.1} {:>13.1}",
        round.calls_per_second,
        round.p50.as_secs_f64() * 1e6,
        round.p99.as_secs_f64() * 1e6,
        round.cpu_per_call.as_secs_f64() * 1e6
    );
}

/// The medians of each path over its rounds, the CPU per call the front door adds, its
/// throughput as a ratio of the direct one and its added p50 (issue 19's targets: at
/// least 0.8, at most 30 µs).
fn summary(direct: &[Round], front: &[Round]) {
    let medians = |rounds: &[Round]| {
        (
            median(rounds.iter().map(|r| r.calls_per_second).collect()),
            median(rounds.iter().map(|r| r.p50.as_secs_f64() * 1e6).collect()),
            median(rounds.iter().map(|r| r.p99.as_secs_f64() * 1e6).collect()),
            median(
                rounds
                    .iter()
                    .map(|r| r.cpu_per_call.as_secs_f64() * 1e6)
                    .collect(),
            ),
        )
    };
    let (direct_rate, direct_p50, direct_p99, direct_cpu) = medians(direct);
    let (front_rate, front_p50, front_p99, front_cpu) = medians(front);
    println!(
        "median direct {direct_rate:.0} calls/s, p50 {direct_p50:.1} µs, p99 {direct_p99:.1} µs, \
         CPU {direct_cpu:.1} µs/call"
    );
    println!(
        "median front  {front_rate:.0} calls/s, p50 {front_p50:.1} µs, p99 {front_p99:.1} µs, \
         CPU {front_cpu:.1} µs/call"
    );
    println!(
        "CPU per call added by the front door: {:.1} µs (the clients' share included in both)",
        front_cpu - direct_cpu
    );
    println!(
        "ratio front door / direct throughput: {:.2}; p50 added: {:.1} µs",
        front_rate / direct_rate,
        front_p50 - direct_p50
    );
}
