//! What the front door costs a real controller: the same clients, side by side, against a
//! `lockstepd` bootstrapped the way the README says (behind the front door, the default: the
//! launcher owns the port and relays each connection to the worker) and one bootstrapped
//! with `LOCKSTEPD_FRONT_DOOR=false` (the worker serves the API port itself).
//!
//! Run: `cargo bench -p lockstep-agent --bench front_door`. Each round runs `CONNECTIONS`
//! (4; `LOCKSTEP_BENCH_CONNECTIONS` for another number: 1 shows the latency of an idle
//! machine, 4 one whose two cores are busy) lockstep clients, each on its own connection,
//! of `CALLS` sequential `Pinger.Ping` on each of four paths in turn (rounds alternate, so a
//! noisy neighbour hits them all):
//!
//! - `direct`: the controller whose worker serves the port (the baseline);
//! - `hop`: the same controller through a process that only copies bytes between the
//!   client's loopback connection and the worker's ([`Forwarder`]: this bench run again, one
//!   thread, TLS end to end): what a process in the path costs by itself;
//! - `relayed`: a controller behind its front door with `LOCKSTEPD_FRONT_DOOR_LEASE=false`,
//!   the launcher relaying every call to the worker;
//! - `leased`: a controller behind its front door, as bootstrapped by default: each
//!   connection leased to the worker once its login's reply left it quiet, the worker
//!   serving it on the client's own socket (`spec/relay.md`, "Version 3: leases").
//!
//! Prints per round calls per second (of the calls alone: each client's connection and
//! login are made before the clock starts), p50/p99, and the CPU per call of every process
//! involved (this one, with the clients, the daemon's launcher and worker, read from
//! `/proc`, and the forwarder), then the medians and, for each path against `direct`, its
//! throughput ratio, the p50 and the CPU per call it adds. Issue 19's targets for the front
//! door: ratio at least 0.8, at most 30 µs added at p50. `benches/relay.rs` in
//! lockstep-transport measures the front door in one process.
//! `LOCKSTEP_BENCH_QUICK=1`: one round of a tenth of the calls (CI runs it).
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_agent::cli::bootstrap::ControllerFile;
use lockstep_agent::datadir::DataDir;
use lockstep_core::client::RetryPolicy;
use serde_json::json;
use side_by_side::{Plan, Round, own_cpu_time};

#[path = "../../transport/benches/side_by_side/mod.rs"]
mod side_by_side;

const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");

const CONNECTIONS: usize = 4;

/// `LOCKSTEP_BENCH_CONNECTIONS`, or [`CONNECTIONS`].
fn connections() -> usize {
    match std::env::var("LOCKSTEP_BENCH_CONNECTIONS") {
        Ok(text) => match text.parse::<usize>() {
            Ok(count) if count > 0 => count,
            _ => panic!("LOCKSTEP_BENCH_CONNECTIONS={text:?} is not a positive number"),
        },
        Err(_) => CONNECTIONS,
    }
}
const CALLS: usize = 5_000;
const ROUNDS: usize = 5;
const DEADLINE: Duration = Duration::from_secs(30);

/// A controller bootstrapped for the bench, stopped (by its launcher's pid) when dropped.
struct Controller {
    _dir: tempfile::TempDir,
    data: DataDir,
}

impl Controller {
    /// A controller behind its front door or not, leasing its connections or not.
    fn bootstrap(front_door: bool, lease: bool) -> Controller {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path().join("controller"));
        let mut command = Command::new(LOCKSTEP);
        command.env("LOCKSTEPD_FRONT_DOOR_LEASE", lease.to_string());
        let output = command
            .arg("--data-dir")
            .arg(data.root())
            // Juju's client store beside the temporary data dir, never the real one.
            .env("JUJU_DATA", dir.path().join("juju"))
            .env("LOCKSTEPD_FRONT_DOOR", front_door.to_string())
            .args(["bootstrap", "--api-port", "0"])
            .output()
            .expect("lockstep runs");
        let controller = Controller { _dir: dir, data };
        assert!(
            output.status.success(),
            "bootstrap failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        controller
    }

    /// A client of this controller, reaching it at `address` instead of its own (through
    /// the [`Forwarder`]) when given.
    fn client_at(&self, address: Option<&str>) -> lockstep_transport::client::Client {
        let mut file = ControllerFile::read(&self.data).expect("controller.yaml");
        if let Some(address) = address {
            file.api_endpoints = vec![address.to_owned()];
        }
        file.client(RetryPolicy {
            initial: lockstep_core::Millis(10),
            maximum: lockstep_core::Millis(100),
            attempts_max: 100,
        })
    }

    fn launcher_pid(&self) -> u32 {
        std::fs::read_to_string(self.data.pid_path())
            .expect("the launcher's pid file")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// CPU time, user and system, of the launcher and every process it started (the worker).
    fn cpu_time(&self) -> Duration {
        let launcher = self.launcher_pid();
        let mut total = process_cpu(launcher).unwrap_or_default();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse().ok())
            else {
                continue;
            };
            if parent(pid) == Some(launcher) {
                total += process_cpu(pid).unwrap_or_default();
            }
        }
        total
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.data.pid_path())
            && let Ok(pid) = pid.trim().parse()
        {
            lockstep_agent::cli::demo::stop_daemon(pid);
        }
    }
}

/// `/proc/<pid>/stat`'s fields after the command (which is in parentheses and may hold
/// spaces): state, ppid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    Some(after.split(' ').map(str::to_owned).collect())
}

fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// utime + stime of `pid`, its threads included.
fn process_cpu(pid: u32) -> Option<Duration> {
    let fields = stat_fields(pid)?;
    // Fields 14 and 15 of stat(5), counted from 1 with the pid and the command first.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second();
    Some(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// The floor of any relay: a process of its own (this bench, run again with
/// [`FORWARD_TO`]) that copies each connection's bytes to the direct controller's port and
/// back, on one thread, and does nothing else (TLS stays end to end). What the front door
/// costs beyond it is its own work: TLS, the websocket, the relay protocol. Killed by its
/// pid when dropped.
struct Forwarder {
    child: std::process::Child,
    address: String,
}

/// Set in the forwarder's environment: the address it copies connections to.
const FORWARD_TO: &str = "LOCKSTEP_BENCH_FORWARD_TO";

impl Forwarder {
    fn start(to: &str) -> Forwarder {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe().expect("this bench's path"))
            .env(FORWARD_TO, to)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the forwarder starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("its stdout"))
            .read_line(&mut line)
            .expect("the forwarder prints its address");
        Forwarder {
            child,
            address: line.trim().to_owned(),
        }
    }

    /// The forwarder's own life: listens on a free loopback port, prints it, and copies.
    fn serve(to: String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("{}", listener.local_addr().unwrap());
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                let to = to.clone();
                tokio::spawn(async move {
                    let mut server = tokio::net::TcpStream::connect(&to).await.unwrap();
                    client.set_nodelay(true).unwrap();
                    server.set_nodelay(true).unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
    }

    fn cpu_time(&self) -> Duration {
        process_cpu(self.child.id()).unwrap_or_default()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn round(
    controller: &Controller,
    through: Option<&Forwarder>,
    connections: usize,
    calls: usize,
) -> Round {
    let logged_in = Arc::new(tokio::sync::Barrier::new(connections + 1));
    let clients: Vec<_> = (0..connections)
        .map(|_| {
            let client = controller.client_at(through.map(|forwarder| forwarder.address.as_str()));
            let logged_in = Arc::clone(&logged_in);
            tokio::spawn(async move {
                // Connects and logs in before the clock starts.
                let ping = client
                    .call("Pinger", 1, "Ping", json!({}), DEADLINE)
                    .await
                    .expect("the first ping");
                assert_eq!(ping, json!({}));
                logged_in.wait().await;
                let mut durations = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let started = Instant::now();
                    let ping = client
                        .call("Pinger", 1, "Ping", json!({}), DEADLINE)
                        .await
                        .expect("a ping");
                    durations.push(started.elapsed());
                    assert_eq!(ping, json!({}));
                }
                let stats = client.stats();
                assert_eq!(stats.disconnected, 0, "a connection closed: {stats:?}");
                durations
            })
        })
        .collect();
    logged_in.wait().await;
    let forwarder_cpu = || through.map(Forwarder::cpu_time).unwrap_or_default();
    let cpu_before = own_cpu_time() + controller.cpu_time() + forwarder_cpu();
    let (all, slowest) = side_by_side::gather(clients).await;
    let cpu = own_cpu_time() + controller.cpu_time() + forwarder_cpu() - cpu_before;
    assert_eq!(all.len(), connections * calls);
    Round::new(all, slowest, cpu)
}

fn main() {
    if let Ok(to) = std::env::var(FORWARD_TO) {
        Forwarder::serve(to);
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bench());
}

async fn bench() {
    let plan = Plan::from_env(ROUNDS, CALLS);
    let (rounds, calls) = (plan.rounds, plan.calls);
    let connections = connections();
    assert!(
        Path::new("/proc/self/stat").exists(),
        "the bench reads /proc"
    );
    let direct = Controller::bootstrap(false, false);
    let relayed = Controller::bootstrap(true, false);
    let leased = Controller::bootstrap(true, true);
    let direct_address = ControllerFile::read(&direct.data)
        .expect("controller.yaml")
        .api_endpoints[0]
        .clone();
    let forwarder = Forwarder::start(&direct_address);
    println!(
        "lockstep-agent front door bench{}: {connections} lockstep clients x {calls} sequential \
         Pinger.Ping over TLS 1.3, against lockstepd with LOCKSTEPD_FRONT_DOOR=false (direct), \
         the same through a process that only copies bytes (hop), lockstepd behind its \
         front door relaying every call (relayed: LOCKSTEPD_FRONT_DOOR_LEASE=false) and \
         leasing its connections to the worker (leased, the default), {rounds} rounds \
         alternating",
        plan.note(),
    );
    side_by_side::alternate(rounds, &["direct", "hop", "relayed", "leased"], |path| {
        Some(match path {
            "direct" => round(&direct, None, connections, calls),
            "hop" => round(&direct, Some(&forwarder), connections, calls),
            "relayed" => round(&relayed, None, connections, calls),
            _ => round(&leased, None, connections, calls),
        })
    })
    .await;
}
