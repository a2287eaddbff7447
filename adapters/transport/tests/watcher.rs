//! The AllWatcher's plumbing over the tests' in-memory state: the first `Next` sends the
//! whole state, a later one blocks until a change and answers with each delta's revision,
//! a watcher resumed after a revision replays exactly what came after it, `Stop` fails a
//! pending `Next`, compacted revisions ask for a resync, and a connection's watchers are
//! bounded. (The same over the real store: the agent's `tests/api_state.rs`.)

mod support;

use std::time::Duration;

use lockstep_core::Phase;
use lockstep_core::lifecycle::Revision;
use lockstep_transport::limits::ApiLimits;
use serde_json::{Value, json};
use support::*;

async fn logged_in(fixture: &Fixture) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    login(&mut socket).await;
    socket
}

async fn watch_all(socket: &mut Socket, request_id: u64, params: Value) -> String {
    let reply = call(socket, request_id, "Client", 8, "WatchAll", params).await;
    reply["response"]["watcher-id"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned()
}

fn next_request(request_id: u64, watcher: &str) -> Value {
    json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": watcher, "request": "Next"})
}

fn kinds(reply: &Value) -> Vec<String> {
    reply["response"]["deltas"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|delta| {
            format!(
                "{}:{}",
                delta[0].as_str().unwrap(),
                delta[1].as_str().unwrap()
            )
        })
        .collect()
}

fn revisions(reply: &Value) -> Vec<u64> {
    reply["response"]["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|revision| revision.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn next_sends_the_whole_state_then_blocks_until_a_change_and_resumes_after_a_revision() {
    let fixture = start(Phase::Ready).await;
    let mut watching = logged_in(&fixture).await;
    let mut deployer = logged_in(&fixture).await;
    let id = watch_all(&mut watching, 2, json!({})).await;
    send(&mut watching, next_request(3, &id)).await;
    let first = receive(&mut watching).await;
    assert_eq!(kinds(&first), ["model:change"], "{first}");
    let start_revision = first["response"]["revision"].as_u64().unwrap();
    assert_eq!(revisions(&first), [start_revision]);

    send(&mut watching, next_request(4, &id)).await;
    let early = tokio::time::timeout(Duration::from_millis(300), receive(&mut watching)).await;
    assert!(
        early.is_err(),
        "Next answered with nothing to say: {early:?}"
    );
    let deployed = call(
        &mut deployer,
        2,
        "Application",
        20,
        "Deploy",
        json!({"applications": [{"application": "a", "charm-url": "ch:a", "num-units": 1}]}),
    )
    .await;
    assert_eq!(deployed["response"], json!({"results": [{}]}), "{deployed}");
    let changed = receive(&mut watching).await;
    assert_eq!(changed["request-id"], 4);
    assert_eq!(
        kinds(&changed),
        ["application:change", "machine:change", "unit:change"]
    );
    let changed_revisions = revisions(&changed);
    assert!(changed_revisions.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(changed_revisions[0] > start_revision);
    assert_eq!(
        changed["response"]["revision"].as_u64(),
        changed_revisions.last().copied()
    );

    // Resumed after the first answer's revision: the same deltas, the same revisions.
    let resumed = watch_all(&mut watching, 5, json!({"after-revision": start_revision})).await;
    send(&mut watching, next_request(6, &resumed)).await;
    let replay = receive(&mut watching).await;
    assert_eq!(replay["response"]["deltas"], changed["response"]["deltas"]);
    assert_eq!(
        replay["response"]["revisions"],
        changed["response"]["revisions"]
    );
}

#[tokio::test]
async fn stop_fails_a_pending_next_and_compacted_revisions_ask_for_a_resync() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let id = watch_all(&mut socket, 2, json!({})).await;
    send(&mut socket, next_request(3, &id)).await;
    receive(&mut socket).await;
    send(&mut socket, next_request(4, &id)).await;
    send(
        &mut socket,
        json!({"request-id": 5, "type": "AllWatcher", "version": 3, "id": id, "request": "Stop"}),
    )
    .await;
    let mut replies = [receive(&mut socket).await, receive(&mut socket).await];
    replies.sort_by_key(|reply| reply["request-id"].as_u64());
    assert_eq!(
        replies[0],
        json!({"request-id": 4, "error": "watcher was stopped", "error-code": "stopped", "response": {}})
    );
    assert_eq!(replies[1], json!({"request-id": 5, "response": {}}));
    send(&mut socket, next_request(6, &id)).await;
    let gone = receive(&mut socket).await;
    assert_eq!(gone["error-code"], "not found", "{gone}");

    fixture.state.add_machine(lockstep_core::Roles::of(&[
        lockstep_core::Role::HostMachine,
    ]));
    let current = fixture.state.revision();
    fixture.state.compact(Revision(current.0 - 1));
    let id = watch_all(&mut socket, 7, json!({"after-revision": 0})).await;
    send(&mut socket, next_request(8, &id)).await;
    let refused = receive(&mut socket).await;
    assert_eq!(
        refused,
        json!({"request-id": 8,
               "error": format!("watcher cannot resume after revision 0: events up to {} were compacted; \
                                 start a new watcher (its first Next sends the whole state)", current.0 - 1),
               "error-code": "resync needed",
               "error-info": {"compacted-revision": current.0 - 1, "current-revision": current.0},
               "response": {}})
    );
}

#[tokio::test]
async fn a_connection_holds_a_bounded_number_of_watchers() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    for request_id in 0..ApiLimits::default().watchers_per_connection_max as u64 {
        watch_all(&mut socket, 10 + request_id, json!({})).await;
    }
    let refused = call(&mut socket, 2, "Client", 8, "WatchAll", json!({})).await;
    assert_eq!(refused["error-code"], "quota limit exceeded", "{refused}");
    // Another connection has its own.
    let mut other = logged_in(&fixture).await;
    watch_all(&mut other, 2, json!({})).await;
}
