//! API throughput and latency over TLS websockets on 127.0.0.1, and the gate's share of it.
//!
//! Run: `cargo bench -p lockstep-transport --bench api`. Starts the server in-process on a
//! free port, opens `CONNECTIONS` clients that each make `CALLS` sequential `Pinger.Ping`
//! calls (every one asks the gate), and prints calls per second and the p50/p99 round
//! trip; then times `gate::admit` alone, in the same process, and prints its median cost
//! as a fraction of the median round trip. Every login and every reply is checked (a bench
//! of error replies measures nothing). `LOCKSTEP_BENCH_QUICK=1` runs one round of a tenth
//! of the calls and of the gate's samples (same code paths, same checks): CI runs it so that
//! a broken bench fails.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

mod common;

use std::time::Instant;

use lockstep_core::Phase;
use lockstep_core::gate::{self, Login};
use lockstep_transport::tls::Credentials;
use tokio::net::TcpListener;

const CONNECTIONS: usize = 4;
const CALLS: usize = 2_000;
const ROUNDS: usize = 3;
/// `gate::admit` is timed in samples of this many calls; the median sample is reported.
const GATE_SAMPLES: usize = 31;
const GATE_CALLS_PER_SAMPLE: usize = 100_000;

/// How much work a run does: the full run, or `LOCKSTEP_BENCH_QUICK=1`'s (anything but `0`)
/// one round of a tenth, for CI.
#[derive(Clone, Copy, Debug)]
struct Size {
    quick: bool,
    rounds: usize,
    calls: usize,
    gate_samples: usize,
    gate_calls_per_sample: usize,
}

impl Size {
    fn from_env() -> Size {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        let divisor = if quick { 10 } else { 1 };
        Size {
            quick,
            rounds: if quick { 1 } else { ROUNDS },
            calls: CALLS / divisor,
            gate_samples: if quick { 5 } else { GATE_SAMPLES },
            gate_calls_per_sample: GATE_CALLS_PER_SAMPLE / divisor,
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let size = Size::from_env();
    let credentials = Credentials::generate("bench", &[]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_gate, gate_view) = tokio::sync::watch::channel(common::view(Phase::Ready));
    let api = common::api(gate_view);
    let server = tokio::spawn(api.serve(listener, credentials.server_config().unwrap()));

    println!(
        "lockstep-transport API bench{}: {CONNECTIONS} connections x {} sequential Pinger.Ping over TLS 1.3, {} rounds",
        if size.quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        },
        size.calls,
        size.rounds
    );
    println!("round   calls/s      p50 µs    p99 µs");
    let mut medians = Vec::new();
    for round in 1..=size.rounds {
        let started = Instant::now();
        let clients: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let ca = credentials.ca_pem.clone();
                tokio::spawn(async move { common::ping_client(port, &ca, size.calls).await })
            })
            .collect();
        let mut all = Vec::new();
        for handle in clients {
            all.extend(handle.await.unwrap());
        }
        assert_eq!(all.len(), CONNECTIONS * size.calls);
        let elapsed = started.elapsed();
        all.sort();
        let (p50, p99) = (
            common::percentile(&all, 0.5),
            common::percentile(&all, 0.99),
        );
        medians.push(p50);
        println!(
            "{round:>5} {:>9.0} {:>11.1} {:>9.1}",
            all.len() as f64 / elapsed.as_secs_f64(),
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
    server.abort();

    // The gate alone, as each call asks it (Ready, a logged-in user, an admitted call).
    let view = common::view(Phase::Ready);
    let mut samples = Vec::new();
    for _ in 0..size.gate_samples {
        let started = Instant::now();
        for _ in 0..size.gate_calls_per_sample {
            let admitted = gate::admit(
                std::hint::black_box(&view),
                Login::User,
                std::hint::black_box("Pinger"),
                "Ping",
            );
            assert!(admitted.is_ok());
        }
        samples.push(started.elapsed().as_secs_f64() * 1e9 / size.gate_calls_per_sample as f64);
    }
    samples.sort_by(f64::total_cmp);
    let gate_ns = samples[samples.len() / 2];
    medians.sort();
    let round_trip_ns = medians[medians.len() / 2].as_secs_f64() * 1e9;
    println!(
        "gate::admit median {gate_ns:.1} ns per call = {:.4} % of the median round trip ({:.1} µs)",
        gate_ns / round_trip_ns * 100.0,
        round_trip_ns / 1e3
    );
}
