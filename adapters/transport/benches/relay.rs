//! What the front door adds to a call: the same clients, side by side in one process,
//! against a worker's API directly and through the launcher's port, relaying every call
//! (TLS and the websocket in the launcher, then the relay over a unix socket to the same
//! API) and leasing the connection (relay version 3: the worker serves it on the client's
//! own socket, once the login's reply left it quiet).
//!
//! Run: `cargo bench -p lockstep-transport --bench relay`. Each round runs `CONNECTIONS`
//! clients of `CALLS` sequential `Pinger.Ping` (logged in, each reply checked) against the
//! direct port, then the relaying front door's, then the leasing one's; rounds alternate
//! so that a noisy neighbour hits all three. Prints per round calls per second (of the calls alone: connecting and the
//! login's argon2 check are left out), p50/p99 and the process's CPU time per call (from
//! the moment every client had logged in; the in-process clients' share is in both paths),
//! then the medians over rounds, the CPU per call each front door adds and, last, each
//! front door's throughput as a ratio of the direct one and its added p50.
//! Issue 19's targets: ratio at least 0.8, at most 30 µs added at p50.
//!
//! Each front door is served as `lockstepd`'s launcher serves its port
//! (`server::serve_connections`: its admission, TLS carried on by records, the router); the
//! direct port is `Api::serve`, with its own admission. `LOCKSTEP_BENCH_QUICK=1`: one round
//! of a tenth of the calls, the same paths and checks (CI runs it); the leasing path asserts
//! that every client was leased. `LOCKSTEP_RELAY_BENCH_ONLY=direct` (or `relayed`, `leased`)
//! runs one path alone, to profile it.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

mod common;
#[path = "side_by_side/mod.rs"]
mod side_by_side;

use std::sync::Arc;
use std::time::Duration;

use lockstep_core::Phase;
use lockstep_transport::front::FrontDoor;
use lockstep_transport::relay;
use lockstep_transport::relayed::{self, Launcher};
use lockstep_transport::tls::Credentials;
use side_by_side::{Plan, Round, own_cpu_time};
use tokio::net::TcpListener;

const CONNECTIONS: usize = 4;
const CALLS: usize = 2_000;
const ROUNDS: usize = 5;

/// One round. Throughput counts the calls only: the clients call concurrently, so the
/// calls took as long as the slowest client's round trips together (its connection and
/// login, an argon2 check, are left out; so is the CPU they take).
async fn round(port: u16, ca: &str, calls: usize) -> Round {
    let logged_in = std::sync::Arc::new(tokio::sync::Barrier::new(CONNECTIONS + 1));
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let ca = ca.to_owned();
            let logged_in = std::sync::Arc::clone(&logged_in);
            tokio::spawn(async move {
                common::ping_client_after(port, &ca, calls, Some(logged_in)).await
            })
        })
        .collect();
    logged_in.wait().await;
    let cpu_before = own_cpu_time();
    let (all, slowest) = side_by_side::gather(clients).await;
    let cpu = own_cpu_time() - cpu_before;
    assert_eq!(all.len(), CONNECTIONS * calls);
    Round::new(all, slowest, cpu)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let only = std::env::var("LOCKSTEP_RELAY_BENCH_ONLY").ok();
    let plan = Plan::from_env(ROUNDS, CALLS);
    let (rounds, calls) = (plan.rounds, plan.calls);
    let credentials = Credentials::generate("bench", &[]).unwrap();
    let (_gate, gate_view) = tokio::sync::watch::channel(common::view(Phase::Ready));
    let api = common::api(gate_view);

    // The worker: its own port, and the relay socket.
    let direct = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let direct_port = direct.local_addr().unwrap().port();
    let server = tokio::spawn(Arc::clone(&api).serve(direct, credentials.server_config().unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(relay::SOCKET_NAME);
    let launcher = Launcher {
        pid: std::process::id(),
        uid: rustix::process::geteuid().as_raw(),
    };
    let relay_server = tokio::spawn(relayed::serve(
        Arc::clone(&api),
        tokio::net::UnixListener::bind(&socket).unwrap(),
        launcher,
    ));

    // The front doors, one relaying every call, one leasing its connections.
    let relaying =
        Arc::new(FrontDoor::new(socket.clone(), "bench", Duration::from_secs(30)).leasing(false));
    let leasing = Arc::new(FrontDoor::new(socket, "bench", Duration::from_secs(30)));
    let (relayed_port, relayed_server) = launcher_port(&relaying, &credentials).await;
    let (leased_port, leased_server) = launcher_port(&leasing, &credentials).await;

    println!(
        "lockstep-transport relay bench{}: {CONNECTIONS} connections x {calls} sequential \
         Pinger.Ping over TLS 1.3, direct to the API and through the front door relaying and \
         leasing, {rounds} rounds alternating",
        plan.note(),
    );
    // One path only (LOCKSTEP_RELAY_BENCH_ONLY, for a profile of it): no ratio.
    let mut leased_rounds = 0;
    side_by_side::alternate(rounds, &["direct", "relayed", "leased"], |path| {
        if only.as_deref().is_some_and(|only| only != path) {
            return None;
        }
        let port = match path {
            "direct" => direct_port,
            "relayed" => relayed_port,
            _ => {
                leased_rounds += 1;
                leased_port
            }
        };
        Some(round(port, &credentials.ca_pem, calls))
    })
    .await;
    // Every client of the leasing front door was leased (and its lease over when it went).
    let expected = (leased_rounds * CONNECTIONS) as u64;
    assert_eq!(
        leasing.lease_counts().leased,
        expected,
        "every connection leased"
    );
    assert_eq!(
        relaying.lease_counts().leased,
        0,
        "the relaying front door leases none"
    );
    server.abort();
    relay_server.abort();
    relayed_server.abort();
    leased_server.abort();
}

/// A launcher's port for `door`, served as `lockstepd` serves it.
async fn launcher_port(
    door: &Arc<FrontDoor>,
    credentials: &Credentials,
) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(door.serve_port(
        listener,
        credentials.server_config().unwrap(),
        lockstep_transport::limits::ApiLimits::default(),
        None,
    ));
    (port, served)
}
