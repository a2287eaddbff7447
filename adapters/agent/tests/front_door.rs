//! The front door with real processes (issue 19, `spec/relay.md`): `lockstep bootstrap` with
//! `LOCKSTEPD_FRONT_DOOR=true`, so that the launcher holds the clients' connections and relays
//! them to the worker. A websocket logged in before the worker is killed with -9 stays open:
//! a ping between two workers is answered by the launcher, a read waits for the next worker
//! and is served on the same connection without a new login; new connections, and plain
//! HTTP (`/metrics`), are served through the launcher too.

#![allow(clippy::print_stderr)]

use std::time::{Duration, Instant};

use crate::hostile::loads::{LEGIT_SOURCE, Target, request};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn behind_the_front_door_a_logged_in_connection_rides_through_a_worker_killed_9() {
    let target = Target::bootstrap(&[("LOCKSTEPD_FRONT_DOOR", "true")]);
    assert!(
        target
            .controller
            .log()
            .contains("front door: the launcher holds the clients' connections"),
        "{}",
        target.controller.log()
    );
    let relay = target.controller.data_dir.join("relay.sock");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&relay).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", relay.display());
    let mut socket = target.logged_in_from(LEGIT_SOURCE).await.unwrap();
    let status = json!({"request-id": 2, "type": "Client", "version": 8, "request": "FullStatus", "params": {}});
    let served = request(&mut socket, status).await.unwrap();
    assert!(served["response"]["model"].is_object(), "{served}");

    // The worker dies; the launcher, and the client's connection with it, stay.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(target.worker as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let ping =
        json!({"request-id": 3, "type": "Pinger", "version": 1, "request": "Ping", "params": {}});
    let pong = request(&mut socket, ping).await.unwrap();
    assert_eq!(pong["response"], json!({}), "{pong}");
    assert!(pong.get("error").is_none(), "{pong}");

    // A read waits for the next worker and is served there, as the same login.
    let killed = Instant::now();
    let status = json!({"request-id": 4, "type": "Client", "version": 8, "request": "FullStatus", "params": {}});
    let served = request(&mut socket, status).await.unwrap();
    assert!(served["response"]["model"].is_object(), "{served}");
    eprintln!(
        "front door: a read after the worker was killed -9 was served in {} ms",
        killed.elapsed().as_millis()
    );
    let worker = target.controller.worker_pid().expect("a new worker runs");
    assert_ne!(worker, target.worker, "a new worker serves");

    // New connections and plain HTTP go through the launcher as well.
    target.legit_call().await.unwrap();
    let metrics = target.metrics().await;
    assert!(
        metrics.0.contains("lockstep_phase{phase=\"ready\"} 1"),
        "{}",
        metrics.0
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
}
