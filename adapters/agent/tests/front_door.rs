//! The front door with real processes (issue 19, `spec/relay.md`): `lockstep bootstrap` as
//! the README runs it (the front door is the default), so that the launcher holds the clients'
//! connections and relays them to the worker. A websocket logged in before the worker is killed with -9 stays open:
//! a ping between two workers is answered by the launcher, a read waits for the next worker
//! and is served on the same connection without a new login; new connections, and plain
//! HTTP (`/metrics`), are served through the launcher too.

#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::hostile::loads::{LEGIT_SOURCE, Received, Target, receive, request, send};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn behind_the_front_door_a_logged_in_connection_rides_through_a_worker_killed_9() {
    let target = Target::bootstrap(&[]);
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
    // Logged in and quiet, the connection was leased to the worker, which served the read.
    assert_eq!(leases_reach(&target, 1, 0).await, (1, 0));

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
    // Taken back when its worker died, then leased to the next one after its read.
    assert_eq!(leases_reach(&target, 2, 1).await, (2, 1));

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

/// Writes the client sent before the worker was killed -9, some perhaps committed by it and
/// some not, are all answered on the same connection and each applied once: the front door
/// sends every unanswered call again to the next worker under the operation-id it stamped
/// when the call arrived. Checked in the store file itself: one recorded operation per write,
/// one machine per write, one application with its one unit per `Deploy`.
#[tokio::test(flavor = "multi_thread")]
async fn writes_in_flight_when_the_worker_is_killed_9_are_each_answered_once_and_applied_once() {
    const WRITES: u64 = 32;
    let target = Target::bootstrap(&[]);
    let mut socket = target.logged_in_from(LEGIT_SOURCE).await.unwrap();
    let write = |id: u64| {
        if id.is_multiple_of(2) {
            json!({"request-id": id, "type": "MachineManager", "version": 10, "request": "AddMachines",
                   "params": {"params": [{"jobs": ["JobHostUnits"]}]}})
        } else {
            json!({"request-id": id, "type": "Application", "version": 20, "request": "Deploy",
                   "params": {"applications": [{"application": format!("in-flight-{id}"), "charm-url": "ubuntu", "num-units": 1}]}})
        }
    };
    // The login's reply left the connection quiet: leased to the worker.
    assert_eq!(leases_reach(&target, 1, 0).await, (1, 0));
    for id in 1..=WRITES {
        send(&mut socket, &write(id)).await.unwrap();
    }
    // The worker is working through them: one is answered, the others are in flight.
    let mut replies = vec![receive(&mut socket).await];
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(target.worker as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let killed = Instant::now();
    while (replies.len() as u64) < WRITES {
        replies.push(receive(&mut socket).await);
    }
    eprintln!(
        "front door: {} writes answered after the worker was killed -9, the last {} ms later",
        WRITES - 1,
        killed.elapsed().as_millis()
    );
    let mut answered = std::collections::BTreeSet::new();
    for reply in &replies {
        let Received::Reply(reply) = reply else {
            panic!("the connection ended: {reply:?}")
        };
        assert!(reply.get("error").is_none(), "{reply}");
        // `Deploy` answers `results`, `AddMachines` `machines`: one entry each, no error.
        let results = reply["response"]["results"]
            .as_array()
            .or(reply["response"]["machines"].as_array())
            .unwrap_or_else(|| panic!("{reply}"));
        assert_eq!(results.len(), 1, "{reply}");
        assert!(
            results
                .iter()
                .all(|result| result.get("error").is_none_or(Value::is_null)),
            "{reply}"
        );
        assert!(
            answered.insert(reply["request-id"].as_u64().unwrap()),
            "answered twice: {reply}"
        );
    }
    assert_eq!(
        answered,
        (1..=WRITES).collect(),
        "every write answered once"
    );
    let worker = target.controller.worker_pid().expect("a new worker runs");
    assert_ne!(worker, target.worker, "a new worker serves");
    let (_, returned) = leases_reach(&target, 1, 1).await;
    assert_eq!(returned, 1, "the lease ended when its worker was killed");

    // The store: each write recorded and applied once.
    let store = rusqlite::Connection::open_with_flags(
        target.controller.data().store_path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let count = |sql: &str| -> u64 { store.query_row(sql, [], |row| row.get(0)).unwrap() };
    assert_eq!(
        count("SELECT COUNT(*) FROM operations WHERE id LIKE 'fd-%'"),
        WRITES
    );
    // Each write adds one machine: an `AddMachines` its own, a `Deploy` its unit's.
    assert_eq!(count("SELECT COUNT(*) FROM machines"), 1 + WRITES);
    assert_eq!(
        count("SELECT COUNT(*) FROM applications WHERE name LIKE 'in-flight-%'"),
        WRITES / 2
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM units WHERE name LIKE 'in-flight-%'"),
        WRITES / 2
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
}

/// The front door's lease counts from `/metrics` (`lockstep_front_door_leases_total`,
/// `_returned_total`), once they are at least `leased` and `returned` (10 s at most).
async fn leases_reach(target: &Target, leased: u64, returned: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = target.metrics().await;
        let counts = (
            metrics.value("lockstep_front_door_leases_total") as u64,
            metrics.value("lockstep_front_door_leases_returned_total") as u64,
        );
        if (counts.0 >= leased && counts.1 >= returned) || Instant::now() > deadline {
            return counts;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The launcher's threads named `front-door-<n>`, and the nanoseconds each has run
/// (`/proc/<pid>/task/<tid>/schedstat`'s first field).
fn front_threads(launcher: u32) -> BTreeMap<String, u64> {
    let mut threads = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{launcher}/task")).unwrap() {
        let task = task.unwrap().path();
        let Ok(name) = std::fs::read_to_string(task.join("comm")) else {
            continue;
        };
        let name = name.trim().to_owned();
        if !name.starts_with("front-door-") {
            continue;
        }
        let ran = std::fs::read_to_string(task.join("schedstat"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        threads.insert(name, ran);
    }
    threads
}

/// `--front-door-threads` (here `LOCKSTEPD_FRONT_DOOR_THREADS=2`, as a unit file would set
/// it) starts that many connection threads in the launcher, and the connections are spread
/// over them: two logged-in connections, each making calls, make both threads run. With 0
/// the launcher starts none (its runtime serves the connections), and the calls are served
/// all the same.
#[tokio::test(flavor = "multi_thread")]
async fn the_front_doors_connections_are_spread_over_its_connection_threads() {
    let target = Target::bootstrap(&[("LOCKSTEPD_FRONT_DOOR_THREADS", "2")]);
    assert!(
        target.controller.log().contains("threads=2"),
        "{}",
        target.controller.log()
    );
    let before = front_threads(target.launcher);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["front-door-0", "front-door-1"],
        "the launcher's connection threads"
    );
    let mut first = target.logged_in_from(LEGIT_SOURCE).await.unwrap();
    let mut second = target.logged_in_from(LEGIT_SOURCE).await.unwrap();
    for id in 2..200 {
        for socket in [&mut first, &mut second] {
            let ping = json!({"request-id": id, "type": "Pinger", "version": 1, "request": "Ping", "params": {}});
            let pong = request(socket, ping).await.unwrap();
            assert_eq!(pong["response"], json!({}), "{pong}");
        }
    }
    let after = front_threads(target.launcher);
    for (name, ran) in &after {
        assert!(
            *ran > before[name],
            "{name} never ran: the connections were not spread over the threads \
             ({before:?} then {after:?})"
        );
    }
    for socket in [&mut first, &mut second] {
        let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
    }
    drop(target);

    let shared = Target::bootstrap(&[("LOCKSTEPD_FRONT_DOOR_THREADS", "0")]);
    assert!(
        shared.controller.log().contains("threads=0"),
        "{}",
        shared.controller.log()
    );
    assert_eq!(front_threads(shared.launcher), BTreeMap::new());
    let mut socket = shared.logged_in_from(LEGIT_SOURCE).await.unwrap();
    let ping =
        json!({"request-id": 2, "type": "Pinger", "version": 1, "request": "Ping", "params": {}});
    let pong = request(&mut socket, ping).await.unwrap();
    assert_eq!(pong["response"], json!({}), "{pong}");
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
}

/// A number of threads out of range is refused before anything starts, naming the flag.
#[test]
fn a_front_door_thread_count_out_of_range_is_refused_naming_the_flag() {
    let output = std::process::Command::new(crate::common::LOCKSTEPD)
        .args(["--front-door-threads", "1025", "--data-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--front-door-threads") && stderr.contains("1025"),
        "{stderr}"
    );
}
