//! Hostile load against a real controller (issue 17): each test bootstraps one with `lockstep
//! bootstrap`, records its worker's pid, and runs attackers from their own loopback addresses
//! (127.0.0.2 and up) while a legitimate client on 127.0.0.1 opens a new connection, logs in
//! as admin and calls `Client.FullStatus`, in a loop. Each test asserts that the legitimate
//! client succeeded on every call, that the same worker still serves (never restarted, never
//! killed), that the peak resident memory of launcher and worker together stayed under
//! 256 MiB, and what the attackers got (their replies, and the refusal counters of
//! `/metrics`). Each prints `hostile <name>: legit median <ms> worst <ms> over <n> calls;
//! peak rss <MiB>` for BENCHMARKS.md.
//!
//! The tests take turns ([`loads::ONE_LOAD_AT_A_TIME`]): each load's figures are its own.
#![allow(clippy::print_stderr)]

#[path = "common/hostile.rs"]
pub(crate) mod loads;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loads::{
    Attack, Metrics, ONE_LOAD_AT_A_TIME, Received, Socket, Target, loopback, receive, request,
    send, tcp_from,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The pending-connection cap of all sources together (`--max-pending-connections`'s
/// default).
const PENDING_CONNECTIONS_MAX: f64 = 512.0;

/// The number of the `lockstep_api_connections{state="pending"}` gauge.
fn pending(metrics: &Metrics) -> f64 {
    metrics.value("lockstep_api_connections{state=\"pending\"}")
}

// 1. Login flood -----------------------------------------------------------------------------

const FLOOD_SOURCES: [u8; 2] = [2, 3];
const FLOOD_CONNECTIONS_PER_SOURCE: usize = 20;
const FLOOD_LOGINS_AT_A_TIME: u64 = 64;
const FLOOD_ROUNDS: u64 = 3;

/// What one flooding connection got.
#[derive(Debug, Default)]
struct FloodRecord {
    /// Replies by error code ("" for a login that succeeded).
    codes: BTreeMap<String, usize>,
    /// `try again` replies without `error-info.retry-after-ms`.
    try_again_without_retry_after: Vec<Value>,
    /// How the connection ended before its three rounds were answered, if it did.
    ended: Option<String>,
}

impl FloodRecord {
    fn add(&mut self, other: FloodRecord) {
        for (code, count) in other.codes {
            *self.codes.entry(code).or_default() += count;
        }
        self.try_again_without_retry_after
            .extend(other.try_again_without_retry_after);
    }
}

/// One connection from `source`: three rounds of 64 `Admin.Login` as `user-admin` with wrong
/// passwords sent at once, then their 64 replies read.
async fn flood_logins(target: Arc<Target>, source: Ipv4Addr, connection: usize) -> FloodRecord {
    let mut record = FloodRecord::default();
    let mut socket = match target.websocket_from(source).await {
        Ok(socket) => socket,
        Err(error) => {
            record.ended = Some(error);
            return record;
        }
    };
    for round in 0..FLOOD_ROUNDS {
        for login in 0..FLOOD_LOGINS_AT_A_TIME {
            let id = round * FLOOD_LOGINS_AT_A_TIME + login + 1;
            let wrong = format!("wrong-{source}-{connection}-{id}");
            if let Err(error) = send(&mut socket, &Target::login_request(id, &wrong)).await {
                record.ended = Some(error);
                return record;
            }
        }
        for _ in 0..FLOOD_LOGINS_AT_A_TIME {
            match receive(&mut socket).await {
                Received::Reply(reply) => {
                    let code = match reply.get("error") {
                        Some(_) => reply["error-code"].as_str().unwrap_or("?").to_owned(),
                        None => String::new(),
                    };
                    if code == "try again"
                        && reply["error-info"]["retry-after-ms"].as_u64().is_none()
                    {
                        record.try_again_without_retry_after.push(reply.clone());
                    }
                    *record.codes.entry(code).or_default() += 1;
                }
                Received::Closed(how) => {
                    record.ended = Some(how);
                    return record;
                }
            }
        }
    }
    record
}

/// Twenty connections from 127.0.0.2 and twenty from 127.0.0.3, each sending 64 logins with
/// wrong passwords at a time, three rounds (7,680 logins): the attackers get `unauthorized
/// access` or `try again` with a retry-after, the controller counts throttled logins, and the
/// admin logging in from 127.0.0.1 with the right password is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_flood_from_two_addresses_leaves_the_admin_served_and_memory_bounded() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let target = Arc::new(Target::bootstrap(&[]));
    let legit = target.start_legit();
    let began = Instant::now();
    let mut floods = tokio::task::JoinSet::new();
    for last in FLOOD_SOURCES {
        for connection in 0..FLOOD_CONNECTIONS_PER_SOURCE {
            floods.spawn(flood_logins(
                Arc::clone(&target),
                loopback(last),
                connection,
            ));
        }
    }
    let mut attackers = FloodRecord::default();
    let mut ended = Vec::new();
    while let Some(record) = floods.join_next().await {
        let mut record = record.expect("a flooding connection");
        if let Some(how) = record.ended.take() {
            ended.push(how);
        }
        attackers.add(record);
    }
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    let metrics = target.metrics().await;
    eprintln!(
        "hostile login-flood: attackers got {:?}; {} of {} connections ended early{}\n{}",
        attackers.codes,
        ended.len(),
        FLOOD_SOURCES.len() * FLOOD_CONNECTIONS_PER_SOURCE,
        ended
            .first()
            .map(|how| format!(" (first: {how})"))
            .unwrap_or_default(),
        metrics.limits()
    );
    target.finish("login-flood", &legit, &attack);

    assert!(
        !attackers.codes.contains_key(""),
        "a wrong password logged in: {:?}",
        attackers.codes
    );
    let unexpected: Vec<_> = attackers
        .codes
        .keys()
        .filter(|code| *code != "unauthorized access" && *code != "try again")
        .collect();
    assert!(
        unexpected.is_empty(),
        "attackers got codes other than `unauthorized access` and `try again`: {:?}",
        attackers.codes
    );
    assert!(
        attackers.codes.get("try again").copied().unwrap_or(0) > 0,
        "no attacker login was throttled: {:?}",
        attackers.codes
    );
    assert!(
        attackers.try_again_without_retry_after.is_empty(),
        "`try again` without error-info.retry-after-ms: {:?}",
        &attackers.try_again_without_retry_after
            [..attackers.try_again_without_retry_after.len().min(3)]
    );
    assert!(
        metrics.value("lockstep_api_logins_throttled_total") > 0.0,
        "/metrics counts no throttled login:\n{}",
        metrics.0
    );
}

// 2. Idle TCP connections -------------------------------------------------------------------

const IDLE_CONNECTIONS: usize = 10_000;
const IDLE_SOURCES: std::ops::RangeInclusive<u8> = 2..=11;
/// Descriptors this process keeps for everything else (the runtime, the legitimate client,
/// the child processes' pipes).
const IDLE_DESCRIPTOR_MARGIN: u64 = 512;
const IDLE_CONNECTS_AT_ONCE: usize = 256;
const IDLE_CONNECT_GUARD: Duration = Duration::from_secs(5);
/// How long the attackers hold their connections open once all are made.
const IDLE_HOLD: Duration = Duration::from_secs(5);

fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| entries.count() as u64)
        .unwrap_or(0)
}

/// Whether the server closed `stream` (its end of stream, or a reset, is readable).
fn closed_by_server(stream: &tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// 10,000 TCP connections from 127.0.0.2..=127.0.0.11 (1,000 each) that never send a byte,
/// held while the admin logs in and calls from 127.0.0.1: the controller refuses a source's
/// connections beyond its pending cap and never holds more pending connections than its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_tcp_connections_leave_the_admin_served_and_memory_bounded() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let limit = loads::raise_open_files_limit();
    let target = Arc::new(Target::bootstrap(&[]));
    let room = limit.saturating_sub(open_descriptors() + IDLE_DESCRIPTOR_MARGIN);
    let wanted = IDLE_CONNECTIONS.min(usize::try_from(room).unwrap_or(usize::MAX));
    if wanted < IDLE_CONNECTIONS {
        eprintln!(
            "hostile idle-tcp: RLIMIT_NOFILE is {limit}: {wanted} idle connections instead of \
             {IDLE_CONNECTIONS}"
        );
    }
    let legit = target.start_legit();
    let began = Instant::now();
    let sources: Vec<Ipv4Addr> = IDLE_SOURCES.map(loopback).collect();
    let at_once = Arc::new(tokio::sync::Semaphore::new(IDLE_CONNECTS_AT_ONCE));
    let mut connects = tokio::task::JoinSet::new();
    for index in 0..wanted {
        let (source, address) = (sources[index % sources.len()], target.address);
        let at_once = Arc::clone(&at_once);
        connects.spawn(async move {
            let _permit = at_once.acquire_owned().await.expect("open");
            match tokio::time::timeout(IDLE_CONNECT_GUARD, tcp_from(source, address)).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err(format!("no connection within {IDLE_CONNECT_GUARD:?}")),
            }
        });
    }
    let mut held = Vec::with_capacity(wanted);
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(connected) = connects.join_next().await {
        match connected.expect("a connect") {
            Ok(stream) => held.push(stream),
            Err(error) => *failed.entry(error).or_default() += 1,
        }
    }
    tokio::time::sleep(IDLE_HOLD / 2).await;
    let middle = target.metrics().await;
    tokio::time::sleep(IDLE_HOLD / 2).await;
    let closed = held
        .iter()
        .filter(|stream| closed_by_server(stream))
        .count();
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    drop(held);
    let metrics = target.metrics().await;
    eprintln!(
        "hostile idle-tcp: {} of {wanted} idle connections made ({failed:?} failed), {closed} \
         of them closed by the server; {} pending halfway\n{}",
        wanted - failed.values().sum::<usize>(),
        pending(&middle),
        metrics.limits()
    );
    target.finish("idle-tcp", &legit, &attack);

    assert!(
        pending(&middle) <= PENDING_CONNECTIONS_MAX,
        "{} connections pending halfway, over the cap of {PENDING_CONNECTIONS_MAX}:\n{}",
        pending(&middle),
        middle.0
    );
    assert!(
        metrics.refusals("max-pending-connections-per-source") > 0.0,
        "no connection refused for its source's pending cap:\n{}",
        metrics.0
    );
}

// 3. TLS handshakes never finished ----------------------------------------------------------

const HANDSHAKES: usize = 1000;
/// 127.0.0.2 to 127.0.0.33: about 31 each, under the per-source pending cap (32), so it is
/// the cap of all sources (512) and the handshake deadline that hold them.
const HANDSHAKE_SOURCES: u8 = 32;
const HANDSHAKE_TIMEOUT_SEC: u64 = 2;
const HANDSHAKE_HOLD: Duration = Duration::from_secs(3 * HANDSHAKE_TIMEOUT_SEC);
/// How long an attacker waits after the server closed its connection before the next.
const HANDSHAKE_RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// The first bytes of a TLS ClientHello: a handshake record announcing 512 bytes, of which
/// only the start of the hello follows.
const PARTIAL_CLIENT_HELLO: [u8; 11] = [
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
];

#[derive(Debug, Default)]
struct HandshakeRecord {
    opened: usize,
    closed_by_server: usize,
    connect_failures: BTreeMap<String, usize>,
}

/// One attacker slot until `until`: connects, sends nothing or the start of a ClientHello,
/// holds the connection until the server closes it, then (after a pause) the next.
async fn unfinished_handshakes(
    address: SocketAddr,
    source: Ipv4Addr,
    hello: bool,
    until: tokio::time::Instant,
) -> HandshakeRecord {
    let mut record = HandshakeRecord::default();
    while tokio::time::Instant::now() < until {
        let mut stream = match tokio::time::timeout_at(until, tcp_from(source, address)).await {
            Err(_) => break,
            Ok(Err(error)) => {
                *record
                    .connect_failures
                    .entry(error.to_string())
                    .or_default() += 1;
                tokio::time::sleep(HANDSHAKE_RECONNECT_PAUSE).await;
                continue;
            }
            Ok(Ok(stream)) => stream,
        };
        record.opened += 1;
        if hello {
            let _ = stream.write_all(&PARTIAL_CLIENT_HELLO).await;
        }
        let mut buffer = [0u8; 256];
        loop {
            match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
                Err(_) => return record,
                Ok(Ok(0) | Err(_)) => {
                    record.closed_by_server += 1;
                    break;
                }
                // An alert before the close.
                Ok(Ok(_)) => continue,
            }
        }
        tokio::time::sleep(HANDSHAKE_RECONNECT_PAUSE).await;
    }
    record
}

/// 1,000 connections from 32 addresses that start a TLS handshake (half send nothing, half
/// the first bytes of a ClientHello) and never finish it, each made again when the server
/// closes it: with a 2 s handshake deadline, the controller closes them at the deadline and
/// never holds more pending connections than its cap, and the admin is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_unfinished_tls_handshakes_leave_the_admin_served_and_memory_bounded() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let timeout = HANDSHAKE_TIMEOUT_SEC.to_string();
    let target = Arc::new(Target::bootstrap(&[(
        "LOCKSTEPD_TLS_HANDSHAKE_TIMEOUT_SEC",
        &timeout,
    )]));
    let legit = target.start_legit();
    let began = Instant::now();
    let until = tokio::time::Instant::now() + HANDSHAKE_HOLD;
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..HANDSHAKES {
        let source = loopback(2 + (slot % usize::from(HANDSHAKE_SOURCES)) as u8);
        slots.spawn(unfinished_handshakes(
            target.address,
            source,
            slot % 2 == 1,
            until,
        ));
    }
    tokio::time::sleep(HANDSHAKE_HOLD / 2).await;
    let middle = target.metrics().await;
    let mut attackers = HandshakeRecord::default();
    while let Some(record) = slots.join_next().await {
        let record = record.expect("an attacker slot");
        attackers.opened += record.opened;
        attackers.closed_by_server += record.closed_by_server;
        for (error, count) in record.connect_failures {
            *attackers.connect_failures.entry(error).or_default() += count;
        }
    }
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    let metrics = target.metrics().await;
    eprintln!(
        "hostile tls-handshakes: {} handshakes started, {} closed by the server, connects \
         failed {:?}; {} pending halfway\n{}",
        attackers.opened,
        attackers.closed_by_server,
        attackers.connect_failures,
        pending(&middle),
        metrics.limits()
    );
    target.finish("tls-handshakes", &legit, &attack);

    assert!(
        pending(&middle) <= PENDING_CONNECTIONS_MAX,
        "{} connections pending halfway, over the cap of {PENDING_CONNECTIONS_MAX}:\n{}",
        pending(&middle),
        middle.0
    );
    assert!(
        metrics.refusals("tls-handshake-timeout") > 0.0,
        "no connection closed at the TLS handshake deadline:\n{}",
        metrics.0
    );
}

// 4. Frames over the limit ------------------------------------------------------------------

const FRAME_CONNECTIONS: usize = 4;
/// How long each attacker keeps sending over-limit frames, a new connection for each.
const FRAME_ATTACK_FOR: Duration = Duration::from_secs(5);
/// Twice the pre-login budget (`--max-pre-login-bytes`, 65536).
const PRE_LOGIN_FRAME_BYTES: usize = 2 * 65536;
/// Twice the frame limit after login (1 MiB).
const LOGGED_IN_FRAME_BYTES: usize = 2 << 20;

/// What became of one over-limit frame.
#[derive(Debug)]
enum FrameOutcome {
    /// The connection was closed (how).
    Closed(String),
    /// The server answered the frame instead.
    Answered(Value),
    /// The attacker could not get as far as sending it.
    Setup(String),
}

/// One connection from `source` sending one frame of `bytes` (an `Admin.Login` with a huge
/// password before login; a `Client.FullStatus` with a huge parameter after logging in as
/// admin), then reading what comes back.
async fn over_limit_frame(
    target: Arc<Target>,
    source: Ipv4Addr,
    logged_in: bool,
    bytes: usize,
) -> FrameOutcome {
    let opened = if logged_in {
        target.logged_in_from(source).await
    } else {
        target.websocket_from(source).await
    };
    let mut socket = match opened {
        Ok(socket) => socket,
        Err(error) => return FrameOutcome::Setup(error),
    };
    let padding = "x".repeat(bytes);
    let frame = if logged_in {
        json!({"request-id": 2, "type": "Client", "version": 8, "request": "FullStatus",
               "params": {"padding": padding}})
    } else {
        Target::login_request(1, &padding)
    };
    if let Err(error) = send(&mut socket, &frame).await {
        return FrameOutcome::Closed(error);
    }
    match receive(&mut socket).await {
        Received::Reply(reply) => FrameOutcome::Answered(reply),
        Received::Closed(how) => FrameOutcome::Closed(how),
    }
}

/// For 5 s, four attackers on 127.0.0.2 each send, on one new connection after another, a
/// 128 KiB frame before logging in (twice the pre-login budget); four on 127.0.0.3 log in
/// as admin and send a 2 MiB frame (twice the frame limit): every such connection is closed,
/// the controller counts `pre-login-bytes` and `frame-size` refusals, and the admin is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_over_the_limit_before_and_after_login_close_their_connections_only() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let target = Arc::new(Target::bootstrap(&[]));
    let legit = target.start_legit();
    let began = Instant::now();
    let mut attackers = tokio::task::JoinSet::new();
    for connection in 0..FRAME_CONNECTIONS {
        for (source, logged_in, bytes) in [
            (loopback(2), false, PRE_LOGIN_FRAME_BYTES),
            (loopback(3), true, LOGGED_IN_FRAME_BYTES),
        ] {
            let target = Arc::clone(&target);
            attackers.spawn(async move {
                let mut outcomes = Vec::new();
                while outcomes.is_empty() || began.elapsed() < FRAME_ATTACK_FOR {
                    let outcome =
                        over_limit_frame(Arc::clone(&target), source, logged_in, bytes).await;
                    outcomes.push((logged_in, connection, outcomes.len(), outcome));
                }
                outcomes
            });
        }
    }
    let mut outcomes = Vec::new();
    while let Some(some) = attackers.join_next().await {
        outcomes.extend(some.expect("an attacker"));
    }
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    let metrics = target.metrics().await;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (logged_in, _, _, outcome) in &outcomes {
        let when = if *logged_in {
            "after login"
        } else {
            "before login"
        };
        let what = match outcome {
            FrameOutcome::Closed(how) => format!("closed: {how}"),
            FrameOutcome::Answered(reply) => format!("answered: {}", reply["error-code"]),
            FrameOutcome::Setup(error) => format!("no frame sent: {error}"),
        };
        *seen.entry(format!("{when}, {what}")).or_default() += 1;
    }
    eprintln!(
        "hostile frames: attackers saw {seen:?}\n{}",
        metrics.limits()
    );
    target.finish("frames", &legit, &attack);

    let not_closed: Vec<_> = outcomes
        .iter()
        .filter(|(_, _, _, outcome)| !matches!(outcome, FrameOutcome::Closed(_)))
        .collect();
    assert!(
        not_closed.is_empty(),
        "over-limit frames that did not end their connection (logged in, attacker, attempt, \
         outcome): {not_closed:?}"
    );
    assert!(
        metrics.refusals("pre-login-bytes") > 0.0,
        "no connection closed for its pre-login bytes:\n{}",
        metrics.0
    );
    assert!(
        metrics.refusals("frame-size") > 0.0,
        "no connection closed for its frame size:\n{}",
        metrics.0
    );
}

// 5. A client that never reads --------------------------------------------------------------

const NEVER_READING_SOURCES: std::ops::RangeInclusive<u8> = 2..=5;
const WRITE_TIMEOUT_SEC: u64 = 5;
/// How long the attackers keep sending: six write timeouts.
const NEVER_READING_FOR: Duration = Duration::from_secs(6 * WRITE_TIMEOUT_SEC);
const WATCHERS_PER_CONNECTION: usize = 16;

#[derive(Debug, Default)]
struct NeverReadingRecord {
    watchers: usize,
    requests: usize,
    /// How the server ended the connection, seen as a failed write; `None`: still open
    /// when the attacker stopped.
    closed: Option<String>,
}

/// A connection from `source` that logs in as admin, opens its watchers (reading those
/// replies), then never reads again: one `AllWatcher.Next` per watcher (each answered with
/// the whole state) and `Client.FullStatus` after `Client.FullStatus` until a write fails or
/// `until`.
async fn never_reading(
    target: Arc<Target>,
    source: Ipv4Addr,
    until: tokio::time::Instant,
) -> Result<NeverReadingRecord, String> {
    let mut socket: Socket = target.logged_in_from(source).await?;
    let mut record = NeverReadingRecord::default();
    let mut watchers = Vec::new();
    for id in 0..WATCHERS_PER_CONNECTION as u64 {
        let reply = request(
            &mut socket,
            json!({"request-id": 10 + id, "type": "Client", "version": 8, "request": "WatchAll",
                   "params": {}}),
        )
        .await?;
        match reply["response"]["watcher-id"].as_str() {
            Some(watcher) => watchers.push(watcher.to_owned()),
            None => return Err(format!("WatchAll from {source}: {reply}")),
        }
    }
    record.watchers = watchers.len();
    let frames = watchers
        .iter()
        .map(|watcher| {
            json!({"type": "AllWatcher", "version": 3, "id": watcher, "request": "Next",
                   "params": {}})
        })
        .chain(std::iter::repeat_with(
            || json!({"type": "Client", "version": 8, "request": "FullStatus", "params": {}}),
        ));
    let mut id = 100u64;
    for mut frame in frames {
        id += 1;
        frame["request-id"] = json!(id);
        let text = frame.to_string();
        match tokio::time::timeout_at(
            until,
            futures_util::SinkExt::send(
                &mut socket,
                tokio_tungstenite::tungstenite::Message::Text(text.into()),
            ),
        )
        .await
        {
            Err(_) => break,
            Ok(Ok(())) => record.requests += 1,
            Ok(Err(error)) => {
                record.closed = Some(error.to_string());
                break;
            }
        }
    }
    Ok(record)
}

/// Four connections (127.0.0.2..=127.0.0.5) log in as admin, open 16 watchers each, then
/// send `AllWatcher.Next` and `Client.FullStatus` requests and never read: with a 5 s write
/// timeout, the controller closes each of them (for its unwritten reply bytes or the write
/// timeout), and the admin is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_are_closed_and_leave_the_admin_served() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let timeout = WRITE_TIMEOUT_SEC.to_string();
    let target = Arc::new(Target::bootstrap(&[(
        "LOCKSTEPD_WRITE_TIMEOUT_SEC",
        &timeout,
    )]));
    let legit = target.start_legit();
    let began = Instant::now();
    let until = tokio::time::Instant::now() + NEVER_READING_FOR;
    let mut attackers = tokio::task::JoinSet::new();
    for last in NEVER_READING_SOURCES {
        attackers.spawn(never_reading(Arc::clone(&target), loopback(last), until));
    }
    let mut records = Vec::new();
    while let Some(record) = attackers.join_next().await {
        records.push(record.expect("an attacker"));
    }
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    let metrics = target.metrics().await;
    eprintln!(
        "hostile never-reads: attackers {records:?}\n{}",
        metrics.limits()
    );
    target.finish("never-reads", &legit, &attack);

    let connections = NEVER_READING_SOURCES.count();
    for record in &records {
        let record = record
            .as_ref()
            .unwrap_or_else(|error| panic!("an attacker could not log in and watch: {error}"));
        assert!(
            record.closed.is_some(),
            "a connection that never read was still open after {NEVER_READING_FOR:?} and {} \
             requests:\n{}",
            record.requests,
            metrics.0
        );
    }
    let refused = metrics.refusals("reply-bytes") + metrics.refusals("write-timeout");
    assert!(
        refused >= connections as f64,
        "{refused} connections closed for reply bytes or the write timeout, of {connections} \
         that never read:\n{}",
        metrics.0
    );
}

// 6. Watchers until refused -----------------------------------------------------------------

const MAX_WATCHERS: usize = 64;
/// Connections beyond those the cap of all connections needs, before the test gives up.
const WATCHER_CONNECTIONS_SPARE: usize = 4;
/// How long the attackers hold every watcher once refused, the legitimate client calling.
const WATCHERS_HOLD: Duration = Duration::from_secs(3);

/// Connections from 127.0.0.2 log in as admin and call `Client.WatchAll` until refused, each
/// kept open, until a new connection's first call is refused, then hold them all for 3 s:
/// every refusal is `quota limit exceeded`, a connection holds 16, all together exactly the
/// cap (64 here), the controller counts `watchers` refusals, and the admin is served
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_opened_until_refused_stop_at_both_caps_and_leave_the_admin_served() {
    let _one = ONE_LOAD_AT_A_TIME.lock().await;
    let cap = MAX_WATCHERS.to_string();
    let target = Arc::new(Target::bootstrap(&[("LOCKSTEPD_MAX_WATCHERS", &cap)]));
    let legit = target.start_legit();
    let began = Instant::now();
    let source = loopback(2);
    let mut held = Vec::new();
    let mut granted = Vec::new();
    let mut refusals = Vec::new();
    let mut setup_failures = Vec::new();
    for _ in 0..MAX_WATCHERS / WATCHERS_PER_CONNECTION + WATCHER_CONNECTIONS_SPARE {
        let mut socket = match target.logged_in_from(source).await {
            Ok(socket) => socket,
            Err(error) => {
                setup_failures.push(error);
                continue;
            }
        };
        let mut opened = 0;
        for id in 0..(WATCHERS_PER_CONNECTION + WATCHER_CONNECTIONS_SPARE) as u64 {
            let frame = json!({"request-id": 10 + id, "type": "Client", "version": 8,
                               "request": "WatchAll", "params": {}});
            match request(&mut socket, frame).await {
                Ok(reply) if reply.get("error").is_none() => opened += 1,
                Ok(reply) => {
                    refusals.push(reply);
                    break;
                }
                Err(error) => {
                    setup_failures.push(error);
                    break;
                }
            }
        }
        granted.push(opened);
        held.push(socket);
        if opened == 0 {
            break;
        }
    }
    tokio::time::sleep(WATCHERS_HOLD).await;
    let attack = Attack {
        began,
        ended: Instant::now(),
    };
    let legit = legit.stop().await;
    let metrics = target.metrics().await;
    drop(held);
    eprintln!(
        "hostile watchers: granted per connection {granted:?}; refusals {:?}\n{}",
        refusals
            .iter()
            .map(|reply| reply["error"].clone())
            .collect::<Vec<_>>(),
        metrics.limits()
    );
    target.finish("watchers", &legit, &attack);

    assert!(
        setup_failures.is_empty(),
        "attackers with the admin's password could not log in or call: {setup_failures:?}"
    );
    let not_quota: Vec<_> = refusals
        .iter()
        .filter(|reply| reply["error-code"] != "quota limit exceeded")
        .collect();
    assert!(
        not_quota.is_empty(),
        "WatchAll refused with another code: {not_quota:?}"
    );
    assert_eq!(
        granted.first().copied(),
        Some(WATCHERS_PER_CONNECTION),
        "watchers the first connection got (the per-connection cap is \
         {WATCHERS_PER_CONNECTION}): {granted:?}"
    );
    assert_eq!(
        granted.last().copied(),
        Some(0),
        "no connection was refused its first watcher: the cap of all connections was never \
         reached: {granted:?}"
    );
    assert_eq!(
        granted.iter().sum::<usize>(),
        MAX_WATCHERS,
        "watchers held by all connections together, against LOCKSTEPD_MAX_WATCHERS: \
         {granted:?}"
    );
    assert!(
        metrics.refusals("watchers") > 0.0,
        "/metrics counts no watcher refusal:\n{}",
        metrics.0
    );
}
