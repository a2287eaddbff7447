//! A thousand clients at once, logged in and each making a call, while one more client
//! never reads its replies: the server stops reading that one connection (its replies
//! queue is bounded by `REPLIES_QUEUED_MAX`, its requests in flight by
//! `REQUESTS_IN_FLIGHT_MAX`) and keeps answering everyone else.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use lockstep_core::Phase;
use lockstep_transport::tls::Credentials;
use serde_json::json;
use support::*;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

const CONNECTIONS: usize = 1000;

/// File descriptors the test needs: both ends of every connection, and some slack for the
/// runtime, the listener and the test harness.
const DESCRIPTORS_NEEDED: u64 = 2 * CONNECTIONS as u64 + 256;

/// Handshakes in progress at once while the connections open (all of them stay open):
/// below the listener's accept backlog, so no SYN waits for a retransmission.
const HANDSHAKES_AT_ONCE: usize = 100;

/// The length of the method name the non-reading client sends: every reply to it quotes the
/// name (`no such request - method Pinger(1).xxx… is not implemented`), so replies are big
/// and the socket buffers between the two fill after a few hundred.
const METHOD_LENGTH_BYTES: usize = 120 * 1024;

/// Raises the soft limit on open files to the hard limit (as the issue asks of this test);
/// `Err` says why the test cannot run here.
fn raise_descriptor_limit() -> Result<(), String> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum
        && hard < DESCRIPTORS_NEEDED
    {
        return Err(format!(
            "the hard limit on open files is {hard}, and {CONNECTIONS} connections need \
             {DESCRIPTORS_NEEDED}; raise it (ulimit -Hn) to run this test"
        ));
    }
    // An unlimited hard limit is not a valid soft limit for open files (the kernel caps it
    // at `nr_open`): ask for what is needed then.
    let soft = limit
        .maximum
        .or_else(|| Some(DESCRIPTORS_NEEDED.max(limit.current.unwrap_or(0))));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: soft,
            maximum: limit.maximum,
        },
    )
    .map_err(|error| format!("cannot raise the soft limit on open files: {error}"))?;
    let raised = getrlimit(Resource::Nofile).current;
    match raised {
        Some(soft) if soft < DESCRIPTORS_NEEDED => Err(format!(
            "the soft limit on open files stayed at {soft}, below the {DESCRIPTORS_NEEDED} needed"
        )),
        _ => Ok(()),
    }
}

/// An argon2id hash with the smallest parameters: a thousand logins in a test must not
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

#[allow(clippy::print_stderr)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_are_served_while_one_never_reads_its_replies() {
    if let Err(reason) = raise_descriptor_limit() {
        eprintln!(
            "SKIPPED a_thousand_clients_are_served_while_one_never_reads_its_replies: {reason}"
        );
        return;
    }
    let started = Instant::now();
    let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
    let fixture = Arc::new(
        start_configured(Phase::Ready, fresh_state(), 0, credentials, |config| {
            config.users = vec![("admin".into(), cheap_hash(PASSWORD))];
        })
        .await,
    );

    // The client that never reads: it sends requests with big replies until the server
    // stops reading from it (a send that cannot finish within a second).
    let mut stuck = connect(&fixture, "/api").await;
    login(&mut stuck).await;
    let method = "X".repeat(METHOD_LENGTH_BYTES);
    let mut sent = 0usize;
    let blocked = loop {
        let frame = json!({"request-id": sent, "type": "Pinger", "version": 1, "request": method})
            .to_string();
        let send = stuck.send(Message::Text(frame.into()));
        match tokio::time::timeout(Duration::from_secs(1), send).await {
            Ok(result) => result.unwrap(),
            Err(_) => break true,
        }
        sent += 1;
        if sent == 2000 {
            break false;
        }
    };
    assert!(
        blocked,
        "the server read 2000 requests of a client that reads no replies: its queue is unbounded"
    );

    // A thousand connections, all open at once, all logged in.
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_AT_ONCE));
    let opening: Vec<_> = (0..CONNECTIONS)
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
    let mut sockets = Vec::with_capacity(CONNECTIONS);
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
    let mut sockets = Vec::with_capacity(CONNECTIONS);
    for answered in calls {
        sockets.push(answered.await.unwrap());
    }
    assert_eq!(sockets.len(), CONNECTIONS);

    // The stuck client's connection was paused, not dropped: once it reads, its replies
    // come, in order of completion, each quoting its request.
    let reply = tokio::time::timeout(Duration::from_secs(10), receive(&mut stuck))
        .await
        .expect("the paused connection answers once read");
    assert_eq!(reply["error-code"], "not implemented");
    assert!(reply["request-id"].as_u64().unwrap() < sent as u64);
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(30),
        "{CONNECTIONS} connections took {elapsed:?} (opened after {opened_after:?})"
    );
}
