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

/// The rounds of a run, each of `paths` in turn in each round (the first is the baseline,
/// `"direct"`): prints the header, every round's line and, when more than one path ran,
/// the [`summary`]. `measure` runs one round of the path it is given, or answers `None`
/// for a path left out.
pub async fn alternate<F, Fut>(rounds: usize, paths: &[&'static str], mut measure: F)
where
    F: FnMut(&'static str) -> Option<Fut>,
    Fut: Future<Output = Round>,
{
    header();
    let mut results: Vec<(&'static str, Vec<Round>)> =
        paths.iter().map(|&path| (path, Vec::new())).collect();
    for number in 1..=rounds {
        for (path, rounds) in &mut results {
            if let Some(round) = measure(path) {
                let measured = round.await;
                row(number, path, &measured);
                rounds.push(measured);
            }
        }
    }
    results.retain(|(_, rounds)| !rounds.is_empty());
    if results.len() > 1 {
        summary(&results);
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

/// The medians of each path over its rounds and, for each path after the first (the
/// baseline), the CPU per call it adds, its throughput as a ratio of the baseline's and its
/// added p50 (issue 19's targets for the front door: at least 0.8, at most 30 µs).
fn summary(paths: &[(&'static str, Vec<Round>)]) {
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
    let all: Vec<_> = paths
        .iter()
        .map(|(path, rounds)| (*path, medians(rounds)))
        .collect();
    for (path, (rate, p50, p99, cpu)) in &all {
        println!(
            "median {path:<6} {rate:.0} calls/s, p50 {p50:.1} µs, p99 {p99:.1} µs, CPU {cpu:.1} µs/call"
        );
    }
    let (baseline, (base_rate, base_p50, _, base_cpu)) = all[0];
    for (path, (rate, p50, _, cpu)) in &all[1..] {
        println!(
            "{path} / {baseline}: throughput ratio {:.2}, p50 added {:.1} µs, CPU per call added \
             {:.1} µs (the clients' share included in both)",
            rate / base_rate,
            p50 - base_p50,
            cpu - base_cpu
        );
    }
}
