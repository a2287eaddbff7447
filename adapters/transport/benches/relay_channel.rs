//! Why relay version 2 carries a connection's messages over pipes: the CPU a round trip of
//! one small message costs between two tasks, over the channels the relay could use.
//!
//! Run: `cargo bench -p lockstep-transport --bench relay_channel`. `CLIENTS` pairs of tasks
//! each make `ROUND_TRIPS` sequential round trips of a 200-byte message (a relayed ping's
//! size), on the same 2-thread runtime, over:
//! - `socket`: a unix socket pair per client (relay version 1: a stream per connection);
//! - `pipes`: two pipes per client (relay version 2);
//! - `shared socket`: one socket for every client, each client's writes under a lock, one
//!   task on the far side answering all of them with one write per read, and one task here
//!   handing each answer to its client (a multiplexed relay, which batches under load).
//!
//! Prints, per channel and round, the process's CPU time (user + system, its
//! `CLOCK_PROCESS_CPUTIME_ID`) per round trip, then the medians over rounds and, last, each channel's
//! median as a ratio of the socket's. `LOCKSTEP_BENCH_QUICK=1`: one round of a tenth of
//! the round trips.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::sync::{Mutex, mpsc};

const CLIENTS: usize = 4;
const ROUND_TRIPS: usize = 20_000;
const ROUNDS: usize = 5;
const MESSAGE_BYTES: usize = 200;

/// This process's CPU time, user and system, every thread.
fn cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).expect("positive"),
        u32::try_from(now.tv_nsec).expect("under a second"),
    )
}

/// `round_trips` sequential round trips on each of the clients' channels: a client writes
/// a message on its first writer and reads the answer on its first reader; an echo task
/// reads it on the second reader and answers on the second writer.
async fn echo_pairs<R, W>(channels: Vec<((W, R), (W, R))>, round_trips: usize)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut clients = Vec::new();
    for ((mut calls, mut answers), (mut answer, mut called)) in channels {
        tokio::spawn(async move {
            let mut message = [0_u8; MESSAGE_BYTES];
            while called.read_exact(&mut message).await.is_ok() {
                answer.write_all(&message).await.unwrap();
            }
        });
        clients.push(tokio::spawn(async move {
            let mut message = [0_u8; MESSAGE_BYTES];
            for _ in 0..round_trips {
                calls.write_all(&message).await.unwrap();
                answers.read_exact(&mut message).await.unwrap();
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
}

/// A unix socket pair per client, each end split into its halves.
async fn socket_pairs(round_trips: usize) {
    let channels = (0..CLIENTS)
        .map(|_| {
            let (near, far) = UnixStream::pair().unwrap();
            let (near_read, near_write) = near.into_split();
            let (far_read, far_write) = far.into_split();
            ((near_write, near_read), (far_write, far_read))
        })
        .collect();
    echo_pairs(channels, round_trips).await;
}

/// Two pipes per client: one for its messages, one for the answers.
async fn pipe_pairs(round_trips: usize) {
    let channels = (0..CLIENTS)
        .map(|_| {
            let (calls, called) = pipe::pipe().unwrap();
            let (answer, answers) = pipe::pipe().unwrap();
            ((calls, answers), (answer, called))
        })
        .collect();
    echo_pairs(channels, round_trips).await;
}

async fn shared_socket(round_trips: usize) {
    let (near, mut far) = UnixStream::pair().unwrap();
    // The far side: whole messages echoed, every read's worth in one write.
    let echo = tokio::spawn(async move {
        let mut buffer = vec![0_u8; 64 << 10];
        let mut held = 0;
        loop {
            let read = match far.read(&mut buffer[held..]).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            held += read;
            let whole = held / MESSAGE_BYTES * MESSAGE_BYTES;
            if far.write_all(&buffer[..whole]).await.is_err() {
                return;
            }
            buffer.copy_within(whole..held, 0);
            held -= whole;
        }
    });
    let (mut reader, writer) = near.into_split();
    let writer = Arc::new(Mutex::new(writer));
    let mut routes = Vec::new();
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (route, mut answers) = mpsc::channel::<()>(4);
        routes.push(route);
        let writer = Arc::clone(&writer);
        clients.push(tokio::spawn(async move {
            let mut message = [0_u8; MESSAGE_BYTES];
            message[0] = u8::try_from(client).unwrap();
            for _ in 0..round_trips {
                writer.lock().await.write_all(&message).await.unwrap();
                answers.recv().await.unwrap();
            }
        }));
    }
    // Here: each answer handed to its client by the first byte.
    let router = tokio::spawn(async move {
        let mut buffer = vec![0_u8; 64 << 10];
        let mut held = 0;
        loop {
            let read = match reader.read(&mut buffer[held..]).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            held += read;
            let mut at = 0;
            while held - at >= MESSAGE_BYTES {
                let _ = routes[usize::from(buffer[at])].send(()).await;
                at += MESSAGE_BYTES;
            }
            buffer.copy_within(at..held, 0);
            held -= at;
        }
    });
    for client in clients {
        client.await.unwrap();
    }
    router.abort();
    echo.abort();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "lockstep-transport relay channel bench{}: {CLIENTS} clients x {round_trips} \
         sequential round trips of {MESSAGE_BYTES} bytes, 2 runtime threads, {rounds} rounds",
        if quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        },
    );
    println!("round  channel         CPU µs per round trip");
    let names = ["socket", "pipes", "shared socket"];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for number in 1..=rounds {
        for (index, name) in names.iter().enumerate() {
            let before = cpu_time();
            runtime.block_on(async {
                match index {
                    0 => socket_pairs(round_trips).await,
                    1 => pipe_pairs(round_trips).await,
                    _ => shared_socket(round_trips).await,
                }
            });
            let per = (cpu_time() - before).as_secs_f64() * 1e6 / (CLIENTS * round_trips) as f64;
            println!("{number:>5}  {name:<15} {per:>8.2}");
            results[index].push(per);
        }
    }
    let medians: Vec<f64> = results.into_iter().map(median).collect();
    for (name, value) in names.iter().zip(&medians) {
        println!("median {name:<15} {value:.2} µs");
    }
    println!(
        "ratio to a socket per connection: pipes {:.2}, shared socket {:.2}",
        medians[1] / medians[0],
        medians[2] / medians[0]
    );
}
