//! What carrying a TLS session on after rustls's handshake costs (`records.rs`), and
//! keeping it in a journal another process can take it back from (`journal.rs`): the CPU a
//! round trip of a small message costs when the server's side of the session is rustls's
//! own stream (`tokio_rustls`), against the same session taken from rustls after the
//! handshake and carried on by `RecordStream`, and by `JournaledStream` (each message
//! absorbed once echoed, each echo committed before it is written).
//!
//! Run: `cargo bench -p lockstep-transport --bench records`. `CLIENTS` rustls clients, each
//! on its own loopback TCP connection (TLS 1.3, the default suite), each make
//! `ROUND_TRIPS` sequential round trips of a 200-byte message to an echo server on the same
//! 2-thread runtime; the three servers alternate, `ROUNDS` rounds each. Prints the
//! process's CPU time (user + system) per round trip and the round trips per second, then
//! the medians and each server's CPU as a ratio of rustls's. `LOCKSTEP_BENCH_QUICK=1`: one round
//! of a tenth of the round trips.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_transport::journal::{self, Journal, JournaledStream, Lease, Shape};
use lockstep_transport::records::{self, RecordStream, Session};
use lockstep_transport::tls::{Credentials, client_config};
use std::os::fd::AsFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CLIENTS: usize = 4;
const ROUND_TRIPS: usize = 20_000;
const ROUNDS: usize = 5;
const MESSAGE_BYTES: usize = 200;

fn cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).expect("positive"),
        u32::try_from(now.tv_nsec).expect("under a second"),
    )
}

/// The servers a round can run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    Rustls,
    Records,
    Journaled,
}

/// An echo that absorbs each message into the journal once its echo is sealed.
async fn echo_journaled(mut stream: JournaledStream<TcpStream>) {
    let mut message = [0_u8; MESSAGE_BYTES];
    while stream.read_exact(&mut message).await.is_ok() {
        if stream.write_all(&message).await.is_err() {
            return;
        }
        stream.absorb(MESSAGE_BYTES as u64);
        if stream.flush().await.is_err() {
            return;
        }
    }
}

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut message = [0_u8; MESSAGE_BYTES];
    while stream.read_exact(&mut message).await.is_ok() {
        if stream.write_all(&message).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// One round: the clients connect (handshakes not counted), then make their round trips.
/// Returns CPU per round trip and round trips per second.
async fn round(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    kind: Server,
    round_trips: usize,
) -> (f64, f64) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let acceptor = tokio::spawn(async move {
        for _ in 0..CLIENTS {
            let (socket, _) = listener.accept().await.unwrap();
            socket.set_nodelay(true).unwrap();
            let server = Arc::clone(&server);
            tokio::spawn(async move {
                match kind {
                    Server::Rustls => {
                        let tls = tokio_rustls::TlsAcceptor::from(server);
                        echo(tls.accept(socket).await.unwrap()).await;
                    }
                    Server::Records => {
                        let (socket, state) = records::accept(&server, socket).await.unwrap();
                        echo(RecordStream::new(socket, Session::new(&state).unwrap())).await;
                    }
                    Server::Journaled => {
                        let (socket, session) = records::accept(&server, socket).await.unwrap();
                        let shape = Shape {
                            read_ring: 64 << 10,
                            write_ring: 64 << 10,
                        };
                        let journal = Journal::create(shape, session.suite).unwrap();
                        let lease = Lease {
                            shape,
                            counters: journal::socket_counters(socket.as_fd()).unwrap(),
                            session,
                            read_ahead: Vec::new(),
                            skip: 0,
                            app: Vec::new(),
                        };
                        echo_journaled(JournaledStream::new(socket, journal, &lease).unwrap())
                            .await;
                    }
                }
            });
        }
    });
    let mut streams = Vec::new();
    for _ in 0..CLIENTS {
        let socket = TcpStream::connect(address).await.unwrap();
        socket.set_nodelay(true).unwrap();
        let mut stream = tokio_rustls::TlsConnector::from(Arc::clone(&client))
            .connect("localhost".try_into().unwrap(), socket)
            .await
            .unwrap();
        // One round trip first, so that every handshake is done before the clock starts.
        let mut message = [7_u8; MESSAGE_BYTES];
        stream.write_all(&message).await.unwrap();
        stream.read_exact(&mut message).await.unwrap();
        streams.push(stream);
    }
    acceptor.await.unwrap();
    let cpu = cpu_time();
    let started = Instant::now();
    let clients: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut message = [7_u8; MESSAGE_BYTES];
                for _ in 0..round_trips {
                    stream.write_all(&message).await.unwrap();
                    stream.read_exact(&mut message).await.unwrap();
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let total = (CLIENTS * round_trips) as f64;
    let per = (cpu_time() - cpu).as_secs_f64() * 1e6 / total;
    (per, total / started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
    let (rounds, round_trips) = if quick {
        (1, ROUND_TRIPS / 10)
    } else {
        (ROUNDS, ROUND_TRIPS)
    };
    let credentials = Credentials::generate("bench", &[]).unwrap();
    let server = credentials.server_config().unwrap();
    let client = client_config(&credentials.ca_pem, &[&rustls::version::TLS13]).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "lockstep-transport records bench{}: {CLIENTS} clients x {round_trips} sequential \
         round trips of {MESSAGE_BYTES} bytes over TLS 1.3, 2 runtime threads, {rounds} rounds",
        if quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        },
    );
    println!("round  server      CPU µs per round trip   round trips/s");
    let names = ["rustls", "records", "journaled"];
    let kinds = [Server::Rustls, Server::Records, Server::Journaled];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for number in 1..=rounds {
        for (index, name) in names.iter().enumerate() {
            let (per, per_second) = runtime.block_on(round(
                Arc::clone(&server),
                Arc::clone(&client),
                kinds[index],
                round_trips,
            ));
            println!("{number:>5}  {name:<10} {per:>12.2} {per_second:>22.0}");
            cpu[index].push(per);
            rate[index].push(per_second);
        }
    }
    let cpu: Vec<f64> = cpu.into_iter().map(median).collect();
    let rate: Vec<f64> = rate.into_iter().map(median).collect();
    for ((name, per), per_second) in names.iter().zip(&cpu).zip(&rate) {
        println!("median {name:<10} {per:.2} µs per round trip, {per_second:.0} round trips/s");
    }
    for index in 1..names.len() {
        println!(
            "{} / rustls: CPU per round trip {:.2}, round trips per second {:.2}",
            names[index],
            cpu[index] / cpu[0],
            rate[index] / rate[0]
        );
    }
}
