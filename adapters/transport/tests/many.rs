//! As many clients at once as the file-descriptor limit allows (at most
//! [`CONNECTIONS_MAX`], and at least [`CONNECTIONS_MIN`] or the test fails), all from one
//! address as from behind a NAT, logged in and each making a call, while one more client
//! never reads its replies: the server stops reading that one connection (its requests in
//! flight are bounded by `REQUESTS_IN_FLIGHT_MAX`) and, once its unwritten replies pass
//! `ApiLimits::reply_bytes_per_connection_max`, closes it; it keeps answering everyone
//! else.
//!
//! The test raises its soft limit on open files to the hard limit, then sizes itself to the
//! descriptors left: two per connection (the client's end and the server's), after those
//! already open and [`DESCRIPTORS_RESERVED`]. It writes the number it reached to stderr,
//! where the test output shows it even when the test passes.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use futures_util::StreamExt;
use lockstep_core::Phase;
use lockstep_transport::limits::Refusal;
use lockstep_transport::tls::Credentials;
use serde_json::json;
use support::*;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

/// The most connections the test opens: enough to show the server does not serve them one
/// by one, few enough that a debug build on two cores finishes in seconds.
const CONNECTIONS_MAX: u64 = 1000;

/// The fewest connections that still test something: several times
/// [`HANDSHAKES_AT_ONCE`], so handshakes queue behind each other and all the connections
/// are open at once, long after the first ones logged in. A soft limit of 1024 (a common
/// default that a process cannot raise when the hard limit is the same) leaves room for
/// about 480.
const CONNECTIONS_MIN: u64 = 400;

/// Descriptors kept for everything but the connections, beyond those open when the test
/// starts: the listener, both ends of the client that never reads, the runtime's poller and
/// waker, and slack for what the harness or a library opens meanwhile.
const DESCRIPTORS_RESERVED: u64 = 64;

/// Descriptors each connection takes in this one process: the client's socket and the
/// server's accepted socket.
const DESCRIPTORS_PER_CONNECTION: u64 = 2;

/// Handshakes in progress at once while the connections open (all of them stay open):
/// below the listener's accept backlog, so no SYN waits for a retransmission.
const HANDSHAKES_AT_ONCE: usize = 100;

/// The length of the method name the non-reading client sends: every reply to it quotes the
/// name (`no such request - method Pinger(1).xxx… is not implemented`), so replies are big,
/// the socket buffers between the two fill after a few dozen, and the replies computed
/// behind them pass the connection's bound on unwritten reply bytes.
const METHOD_LENGTH_BYTES: usize = 120 * 1024;

/// What the descriptor limit lets the test do.
#[derive(Debug)]
struct Descriptors {
    /// The soft limit on open files after raising it.
    limit_soft: u64,
    /// The hard limit (`None`: unlimited).
    limit_hard: Option<u64>,
    /// Descriptors open when the test started.
    open: u64,
    /// Why the soft limit could not be raised to the hard one, if it could not.
    raise_error: Option<String>,
}

impl Descriptors {
    /// The connections that fit: two descriptors each, after those open and the reserve.
    fn connections(&self) -> u64 {
        let available = self
            .limit_soft
            .saturating_sub(self.open)
            .saturating_sub(DESCRIPTORS_RESERVED);
        (available / DESCRIPTORS_PER_CONNECTION).min(CONNECTIONS_MAX)
    }
}

/// Descriptors this process has open, counted in `/proc/self/fd` (Linux) or `/dev/fd`
/// (macOS, the BSDs); the directory's own descriptor is counted too, which errs on the safe
/// side.
fn descriptors_open() -> Result<u64, String> {
    ["/proc/self/fd", "/dev/fd"]
        .iter()
        .find_map(|directory| std::fs::read_dir(directory).ok())
        .map(|entries| entries.count() as u64)
        .ok_or_else(|| "neither /proc/self/fd nor /dev/fd lists this process's descriptors".into())
}

/// Raises the soft limit on open files to the hard limit (an unlimited hard limit is not a
/// valid soft limit for open files, so then to what [`CONNECTIONS_MAX`] needs), and reports
/// what the test has to work with. A failed raise is reported, not fatal: the test sizes
/// itself to the soft limit it has.
fn raise_descriptor_limit() -> Result<Descriptors, String> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let open = descriptors_open()?;
    let limit = getrlimit(Resource::Nofile);
    let wanted = limit
        .maximum
        .unwrap_or(open + DESCRIPTORS_RESERVED + DESCRIPTORS_PER_CONNECTION * CONNECTIONS_MAX);
    // `None` is unlimited: a soft limit that needs no raising.
    let raise_error = if limit.current.is_some_and(|current| current < wanted) {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(wanted),
                maximum: limit.maximum,
            },
        )
        .err()
        .map(|error| format!("raising the soft limit to {wanted} failed: {error}"))
    } else {
        None
    };
    let raised = getrlimit(Resource::Nofile);
    Ok(Descriptors {
        // An unlimited soft limit (possible only where the kernel allows it) is no bound.
        limit_soft: raised.current.unwrap_or(u64::MAX),
        limit_hard: raised.maximum,
        open,
        raise_error,
    })
}

/// An argon2id hash with the smallest parameters: up to a thousand logins in a test must not
/// spend a minute of CPU on password hashing (the server reads the parameters from the
/// hash, so production hashes stay as strong as `hash_password` makes them).
fn cheap_hash(password: &str) -> String {
    use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
    let params = argon2::Params::new(8, 1, 1, None).unwrap();
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password(password.as_bytes(), &SaltString::generate(&mut OsRng))
        .unwrap()
        .to_string()
}

/// Writes `line` to the process's stderr itself, past the harness's capture of `eprintln!`,
/// so that the output of a passing test shows it too.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Between [`CONNECTIONS_MIN`] and [`CONNECTIONS_MAX`] clients, as many as the descriptor
/// limit allows, connected and logged in at once, each answered a `FullStatus`; meanwhile
/// the server stopped reading the one client that reads no replies (within 2000 requests)
/// and closed it for the reply bytes it left unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_clients_at_once_are_served_while_one_that_never_reads_is_closed() {
    let descriptors = raise_descriptor_limit().unwrap_or_else(|reason| panic!("{reason}"));
    let connections = descriptors.connections();
    assert!(
        connections >= CONNECTIONS_MIN,
        "the limit on open files leaves room for {connections} connections, below the \
         {CONNECTIONS_MIN} this test needs ({descriptors:?}): raise the hard limit \
         (`ulimit -Hn`) to at least {}",
        descriptors.open + DESCRIPTORS_RESERVED + DESCRIPTORS_PER_CONNECTION * CONNECTIONS_MIN
    );
    let connections = connections as usize;
    let started = Instant::now();
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let fixture = Arc::new(
        start_configured(Phase::Ready, fresh_state(), 0, credentials, |config| {
            config.users = vec![("admin".into(), cheap_hash(PASSWORD))];
            // Every client here comes from 127.0.0.1, as from behind one NAT: the limits
            // per source address are an operator's to raise for that.
            config.limits.pending_connections_per_source_max = HANDSHAKES_AT_ONCE + 1;
            config.limits.queued_logins_per_source_max = HANDSHAKES_AT_ONCE;
        })
        .await,
    );

    // The client that never reads: it sends requests with big replies until the server
    // stops reading from it (a send that cannot finish within a second).
    let mut stuck = connect(&fixture, "/api").await;
    login(&mut stuck).await;
    let method = "X".repeat(METHOD_LENGTH_BYTES);
    let mut sent = 0usize;
    let stopped = loop {
        let frame = json!({"request-id": sent, "type": "Pinger", "version": 1, "request": method})
            .to_string();
        let send = stuck.send(Message::Text(frame.into()));
        match tokio::time::timeout(Duration::from_secs(1), send).await {
            Ok(Ok(())) => {}
            // Blocked: the server stopped reading; or closed by it.
            Ok(Err(_)) | Err(_) => break true,
        }
        sent += 1;
        if sent == 2000 {
            break false;
        }
    };
    assert!(
        stopped,
        "the server read 2000 requests of a client that reads no replies: its queue is unbounded"
    );

    // The connections, all open at once, all logged in.
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_AT_ONCE));
    let opening: Vec<_> = (0..connections)
        .map(|_| {
            let (fixture, handshakes) = (Arc::clone(&fixture), Arc::clone(&handshakes));
            tokio::spawn(async move {
                let permit = handshakes.acquire_owned().await.unwrap();
                let mut socket = connect(&fixture, "/api").await;
                let reply = login(&mut socket).await;
                assert_eq!(reply["response"]["server-version"], "3.6.1", "{reply}");
                drop(permit);
                socket
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(connections);
    for opened in opening {
        sockets.push(opened.await.unwrap());
    }
    let opened_after = started.elapsed();

    // Each makes a call, all at the same moment, and is answered.
    let calls: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(index, mut socket)| {
            tokio::spawn(async move {
                let id = 10 + index as u64;
                let reply = call(&mut socket, id, "Client", 8, "FullStatus", json!({})).await;
                assert_eq!(reply["response"]["model"]["name"], "controller", "{reply}");
                socket
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(connections);
    for answered in calls {
        sockets.push(answered.await.unwrap());
    }
    assert_eq!(sockets.len(), connections);
    // Both ends of every connection are open now, at once: none was closed after its call.
    let open_at_peak = descriptors_open().unwrap();
    assert!(
        open_at_peak >= descriptors.open + DESCRIPTORS_PER_CONNECTION * connections as u64,
        "{open_at_peak} descriptors open with {connections} connections answered, from {} at \
         the start: some connection was closed",
        descriptors.open
    );

    // The stuck client was closed for the replies it left unwritten: what it reads now is
    // what its socket buffers held, then the end of the connection.
    let mut replies_read = 0;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stuck.next().await {
                Some(Ok(Message::Text(_))) => replies_read += 1,
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the non-reading client's connection was not closed"
    );
    assert!(
        replies_read < sent,
        "{replies_read} replies of {sent} requests"
    );
    let counts = fixture.api.connection_counts();
    assert_eq!(
        counts.refusals[Refusal::ReplyBytes.index()],
        1,
        "closed for its unwritten replies"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(30),
        "{connections} connections took {elapsed:?} (opened after {opened_after:?})"
    );
    report(&format!(
        "many.rs: {connections} connections at once (at least {CONNECTIONS_MIN}, at most \
         {CONNECTIONS_MAX}), all answered while one more never read; {open_at_peak} descriptors \
         open at the peak of a soft limit of {} (hard {}){}; {elapsed:?}",
        descriptors.limit_soft,
        descriptors
            .limit_hard
            .map_or_else(|| "unlimited".to_owned(), |hard| hard.to_string()),
        descriptors
            .raise_error
            .as_deref()
            .map_or_else(String::new, |error| format!(", {error}")),
    ));
}
