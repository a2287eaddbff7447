//! The facades that read and write the controller's state, over the in-memory store:
//! deploys through `operation-id`, watchers that send the whole state, block for changes,
//! resume after a revision, and stop; seed 004's jobs for machines added with jobs.

use crate::api_support;

use std::time::Duration;

use api_support::*;
use lockstep_core::Phase;
use lockstep_core::lifecycle::Revision;
use serde_json::{Value, json};

fn machines(store: &dyn lockstep_store::Store) -> Vec<lockstep_store::Machine> {
    let mut machines = Vec::new();
    store
        .snapshot(&mut |tx| {
            machines = tx.machines()?;
            Ok(())
        })
        .unwrap();
    machines
}

async fn logged_in(fixture: &Fixture) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    login(&mut socket).await;
    socket
}

async fn next(socket: &mut Socket, request_id: u64, watcher: &str) -> Value {
    send(socket, json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": watcher, "request": "Next"})).await;
    let reply = receive(socket).await;
    assert_eq!(reply["request-id"], request_id, "{reply}");
    reply
}

fn deploy_params(operation_id: Option<&str>) -> Value {
    let mut params = json!({"applications": [
        {"application": "wordpress", "charm-url": "ch:amd64/jammy/wordpress-7", "num-units": 2},
        {"application": "mysql", "charm-url": "ch:amd64/jammy/mysql-42", "num-units": 1},
    ]});
    if let Some(id) = operation_id {
        params["operation-id"] = json!(id);
    }
    params
}

fn delta_names(reply: &Value) -> Vec<String> {
    reply["response"]["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|delta| {
            let entity = &delta[2];
            let name = entity
                .get("name")
                .or_else(|| entity.get("id"))
                .or_else(|| entity.get("key"))
                .unwrap();
            format!(
                "{}:{}:{}",
                delta[0].as_str().unwrap(),
                delta[1].as_str().unwrap(),
                name.as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_deploy_is_applied_once_and_every_watcher_sees_it_once_in_order() {
    let fixture = start(Phase::Ready).await;
    let mut deployer = logged_in(&fixture).await;
    let mut watching = logged_in(&fixture).await;

    let watcher = call(&mut watching, 2, "Client", 8, "WatchAll", json!({})).await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = next(&mut watching, 3, &id).await;
    let start_revision = first["response"]["revision"].as_u64().unwrap();
    assert_eq!(delta_names(&first), ["model:change:controller"], "{first}");

    // A Next blocks until something changes: send it, then deploy.
    send(
        &mut watching,
        json!({"request-id": 4, "type": "AllWatcher", "version": 3, "Id": id, "request": "Next"}),
    )
    .await;
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
        deploy_params(Some("deploy-1")),
    )
    .await;
    assert_eq!(
        deployed["response"],
        json!({"results": [{}, {}]}),
        "{deployed}"
    );
    let changed = receive(&mut watching).await;
    assert_eq!(changed["request-id"], 4);
    let names = delta_names(&changed);
    assert_eq!(
        names,
        [
            "application:change:wordpress",
            "machine:change:0",
            "unit:change:wordpress/0",
            "machine:change:1",
            "unit:change:wordpress/1",
            "application:change:mysql",
            "machine:change:2",
            "unit:change:mysql/0",
        ],
        "{changed}"
    );
    let revisions: Vec<u64> = changed["response"]["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "{revisions:?}"
    );
    assert!(revisions[0] > start_revision);
    assert_eq!(
        changed["response"]["revision"].as_u64(),
        revisions.last().copied()
    );

    // The same operation again: the recorded result, nothing applied.
    let before = fixture.store.revision().unwrap();
    let again = call(
        &mut deployer,
        3,
        "Application",
        20,
        "Deploy",
        deploy_params(Some("deploy-1")),
    )
    .await;
    assert_eq!(again["response"], deployed["response"]);
    assert_eq!(
        fixture.store.revision().unwrap(),
        before,
        "a repeated operation wrote nothing"
    );
    // Without an operation-id, a second deploy is refused per application, as Juju does.
    let twice = call(
        &mut deployer,
        4,
        "Application",
        20,
        "Deploy",
        deploy_params(None),
    )
    .await;
    assert_eq!(
        twice["response"]["results"][0]["error"]["code"], "already exists",
        "{twice}"
    );

    // A watcher resumed after the first snapshot's revision sees exactly the same deltas.
    let mut resumed = logged_in(&fixture).await;
    let watcher = call(
        &mut resumed,
        2,
        "Client",
        8,
        "WatchAll",
        json!({"after-revision": start_revision}),
    )
    .await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    send(
        &mut resumed,
        json!({"request-id": 3, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"}),
    )
    .await;
    let replay = receive(&mut resumed).await;
    assert_eq!(delta_names(&replay), names);
    assert_eq!(
        replay["response"]["revisions"],
        changed["response"]["revisions"]
    );
}

#[tokio::test]
async fn stop_fails_a_pending_next_and_compacted_revisions_ask_for_a_resync() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let watcher = call(&mut socket, 2, "Client", 8, "WatchAll", json!({})).await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    next(&mut socket, 3, &id).await;
    send(
        &mut socket,
        json!({"request-id": 4, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"}),
    )
    .await;
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

    // Compact away the model's creation, then ask to resume from before it.
    call(
        &mut socket,
        6,
        "Application",
        20,
        "Deploy",
        json!({"applications": [{"application": "a", "charm-url": "ch:a", "num-units": 0}]}),
    )
    .await;
    let current = fixture.store.revision().unwrap();
    fixture.store.compact(Revision(current.0 - 1)).unwrap();
    let watcher = call(
        &mut socket,
        7,
        "Client",
        8,
        "WatchAll",
        json!({"after-revision": 0}),
    )
    .await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = next(&mut socket, 8, &id).await;
    assert_eq!(refused["error-code"], "resync needed", "{refused}");
    assert_eq!(refused["error-info"]["current-revision"], current.0);
}

#[tokio::test]
async fn machines_added_with_legacy_jobs_are_stored_with_roles_and_report_jobs() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let added = call(
        &mut socket,
        2,
        "Client",
        1,
        "AddMachines",
        json!({"params": [
        {"jobs": ["JobHostUnits"]}, {"jobs": ["JobManageEnviron"]}, {}
    ], "operation-id": "machines-1"}),
    )
    .await;
    assert_eq!(
        added["response"],
        json!({"machines": [{"machine": "0"}, {"machine": "1"}, {"machine": "2"}]}),
        "{added}"
    );
    let machine = machines(fixture.store.as_ref())
        .into_iter()
        .find(|machine| machine.id == "1")
        .unwrap();
    assert_eq!(
        machine.roles,
        lockstep_core::Roles::of(&[lockstep_core::Role::Controller])
    );
    assert!(
        machine.legacy_jobs.is_empty(),
        "stored with roles, not jobs"
    );

    call(
        &mut socket,
        3,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "wordpress", "charm-url": "ch:wordpress", "num-units": 1},
        {"application": "mysql", "charm-url": "ch:mysql", "num-units": 1}]}),
    )
    .await;
    let units = call(
        &mut socket,
        4,
        "Application",
        20,
        "AddUnits",
        json!({"application": "mysql", "num-units": 2}),
    )
    .await;
    assert_eq!(units["response"], json!({"units": ["mysql/1", "mysql/2"]}));
    let related = call(
        &mut socket,
        5,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["wordpress:db", "mysql:server"]}),
    )
    .await;
    assert_eq!(
        related["response"]["endpoints"]["mysql"]["name"], "server",
        "{related}"
    );
    let missing = call(
        &mut socket,
        6,
        "Application",
        20,
        "AddUnits",
        json!({"application": "nope"}),
    )
    .await;
    assert!(
        missing["error"]
            .as_str()
            .unwrap()
            .contains("application \"nope\" not found"),
        "{missing}"
    );

    let status = call(
        &mut socket,
        7,
        "Client",
        8,
        "FullStatus",
        json!({"patterns": []}),
    )
    .await;
    let status = &status["response"];
    assert_eq!(status["machines"]["0"]["jobs"], json!(["JobHostUnits"]));
    assert_eq!(status["machines"]["1"]["jobs"], json!(["JobManageModel"]));
    assert_eq!(
        status["applications"]["mysql"]["units"]
            .as_object()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(status["relations"][0]["key"], "mysql:server wordpress:db");
    assert!(
        status["controller-timestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let info = call(
        &mut socket,
        8,
        "ModelManager",
        10,
        "ModelInfo",
        json!({"entities": []}),
    )
    .await;
    assert_eq!(
        info["response"]["results"][0]["result"]["name"],
        "controller"
    );
}

#[tokio::test]
async fn writes_wait_for_ready_and_watchers_do_not() {
    let fixture = start(Phase::RunningSteps).await;
    let mut socket = logged_in(&fixture).await;
    // A watcher is a read: served while limited (every database step commits atomically,
    // so it sees one revision or the next, never half a step).
    let watch = call(&mut socket, 3, "Client", 8, "WatchAll", json!({})).await;
    assert!(watch["response"]["watcher-id"].is_string(), "{watch}");
    for (id, facade, method, params) in [
        (2, "Application", "Deploy", deploy_params(Some("d"))),
        (4, "Client", "AddMachines", json!({"params": [{}]})),
    ] {
        let reply = call(
            &mut socket,
            id,
            facade,
            if facade == "Client" { 8 } else { 20 },
            method,
            params,
        )
        .await;
        assert_eq!(
            reply["error-code"], "upgrade in progress",
            "{facade}.{method}: {reply}"
        );
    }
    assert!(
        machines(fixture.store.as_ref()).is_empty(),
        "nothing was applied"
    );
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let reply = call(
        &mut socket,
        5,
        "Application",
        20,
        "Deploy",
        deploy_params(Some("d")),
    )
    .await;
    assert_eq!(reply["response"], json!({"results": [{}, {}]}));
}

#[tokio::test]
async fn expose_is_applied_once_and_shows_in_status_and_in_every_watcher() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let deployed = call(
        &mut socket,
        2,
        "Application",
        20,
        "Deploy",
        deploy_params(None),
    )
    .await;
    assert_eq!(
        deployed["response"],
        json!({"results": [{}, {}]}),
        "{deployed}"
    );

    // A watcher that already sent the whole state, waiting for the next change.
    let watcher = call(&mut socket, 3, "Client", 8, "WatchAll", json!({})).await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = next(&mut socket, 4, &id).await;
    let application = |reply: &Value, name: &str| -> Value {
        reply["response"]["deltas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|delta| delta[0] == "application" && delta[2]["name"] == name)
            .map(|delta| delta[2].clone())
            .unwrap_or_else(|| panic!("no application {name} in {reply}"))
    };
    assert_eq!(application(&first, "wordpress")["exposed"], false);

    let params = json!({"application": "wordpress", "operation-id": "expose-1"});
    let exposed = call(&mut socket, 5, "Application", 20, "Expose", params.clone()).await;
    assert_eq!(exposed, json!({"request-id": 5, "response": {}}));
    let changed = next(&mut socket, 6, &id).await;
    assert_eq!(
        delta_names(&changed),
        ["application:change:wordpress"],
        "{changed}"
    );
    assert_eq!(application(&changed, "wordpress")["exposed"], true);
    assert_eq!(
        application(&changed, "wordpress")["charm-url"],
        "ch:amd64/jammy/wordpress-7"
    );

    // A repeat with the same operation-id, and an Expose of an exposed application, write
    // nothing: no event, the store's revision stays.
    let revision = fixture.store.revision().unwrap();
    let again = call(&mut socket, 7, "Application", 20, "Expose", params).await;
    assert_eq!(again["response"], json!({}), "{again}");
    let plain = call(
        &mut socket,
        8,
        "Application",
        1,
        "Expose",
        json!({"application": "wordpress"}),
    )
    .await;
    assert_eq!(plain["response"], json!({}), "{plain}");
    assert_eq!(fixture.store.revision().unwrap(), revision);

    // FullStatus and a new watcher's whole state carry the flag; the typed application
    // stored beside it still reads.
    let status = call(
        &mut socket,
        9,
        "Client",
        8,
        "FullStatus",
        json!({"patterns": []}),
    )
    .await;
    let applications = &status["response"]["applications"];
    assert_eq!(applications["wordpress"]["exposed"], true, "{status}");
    assert_eq!(applications["mysql"]["exposed"], false, "{status}");
    let fresh = call(&mut socket, 10, "Client", 8, "WatchAll", json!({})).await;
    let fresh_id = fresh["response"]["watcher-id"].as_str().unwrap().to_owned();
    let whole = next(&mut socket, 11, &fresh_id).await;
    assert_eq!(application(&whole, "wordpress")["exposed"], true);
    assert_eq!(application(&whole, "mysql")["exposed"], false);

    // An unknown application, and missing params.
    let missing = call(
        &mut socket,
        12,
        "Application",
        20,
        "Expose",
        json!({"application": "nope"}),
    )
    .await;
    assert_eq!(
        missing["error"], "application \"nope\" not found",
        "{missing}"
    );
    let bad = call(&mut socket, 13, "Application", 20, "Expose", json!({})).await;
    assert_eq!(bad["error-code"], "bad request", "{bad}");
    assert_eq!(fixture.store.revision().unwrap(), revision);
}
