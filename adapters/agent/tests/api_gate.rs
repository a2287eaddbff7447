//! The gate's allow-list against the real shared state (`StoreState` on a SQLite store in a
//! temporary directory), while the agent is limited: every call the core's gate lists as a
//! read (`gate::read_only`) is served and leaves the store's revision where it was, and
//! every other call the server serves, but the abort of the upgrade, is refused with
//! `upgrade in progress` and changes nothing. So "no write admitted before Ready" is checked
//! against what the calls really do, not against the list itself.

use crate::api_support;

use api_support::*;
use lockstep_agent::api::applications;
use lockstep_core::gate;
use lockstep_core::{Binary, Phase, Role, Roles};
use lockstep_store::Machine;
use lockstep_transport::charm::Charm;
use lockstep_transport::served::FACADES;
use serde_json::{Value, json};

/// The server over a fresh SQLite store holding a controller machine and a deployed
/// application `web` (so that reads have something to read), then limited in `phase`.
async fn limited(phase: Phase) -> (Fixture, tempfile::TempDir) {
    let (fixture, directory) = start_on_sqlite(Phase::Ready).await;
    let mut machine = Machine::with_roles("0", Roles::of(&[Role::Controller]));
    machine.agent_binary = Some(Binary::parse("2.9.43-ubuntu-amd64").unwrap());
    fixture.store.add_machine(&machine).unwrap();
    let web = Charm {
        name: "web".into(),
        summary: String::new(),
        subordinate: false,
        series: vec!["jammy".into()],
        endpoints: Vec::new(),
        options: json!({"port": {"type": "int", "default": 80, "description": "port"}})
            .as_object()
            .cloned()
            .unwrap(),
        sha256: format!("{:0>64}", "web"),
        size_bytes: 100,
    };
    let url = applications::add_charm(fixture.store.as_ref(), &web, None).unwrap();
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    let deployed = call(
        &mut socket,
        2,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "web", "charm-url": url, "num-units": 1}]}),
    )
    .await;
    assert_eq!(
        deployed["response"]["results"][0].get("error"),
        None,
        "{deployed}"
    );
    fixture.gate.send(view(phase)).unwrap();
    (fixture, directory)
}

/// A served version of `facade` (the newest).
fn version(facade: &str) -> u32 {
    let (_, versions, _) = FACADES
        .iter()
        .find(|(name, _, _)| *name == facade)
        .unwrap_or_else(|| panic!("{facade} is not served"));
    *versions.last().unwrap()
}

/// The params a client sends with each read of the allow-list. A read added to the gate's
/// list without an entry here fails the test, so every read is exercised.
fn read_params(facade: &str, method: &str, watcher: &str) -> Value {
    let model = format!("model-{MODEL_UUID}");
    match (facade, method) {
        ("Admin", "RedirectInfo") => json!({}),
        ("Pinger", "Ping") => json!({}),
        ("Client", "FullStatus") => json!({"patterns": []}),
        ("Client", "FindTools") => json!({"major": 2, "minor": 9, "arch": "amd64"}),
        ("Upgrade", "WatchProgress") => json!({}),
        ("Upgrade", "Status") => json!({}),
        ("Client" | "ModelConfig", "ModelGet") => json!({}),
        ("Client", "WatchAll") => json!({}),
        ("AllWatcher", "Next" | "Stop") => json!({"watcher": watcher}),
        ("ModelConfig", "GetModelConstraints") => json!({}),
        ("ModelManager", "ModelInfo") => json!({"entities": [{"tag": model}]}),
        ("ModelManager", "ListModelSummaries") => json!({"user-tag": "user-admin"}),
        ("Controller", "AllModels") => json!({}),
        ("Controller", "ControllerAPIInfoForModels") => json!({"entities": [{"tag": model}]}),
        ("Charms", "ResolveCharms") => json!({"resolve": [{"reference": "ch:ubuntu"}]}),
        ("Application", "Get") => json!({"application": "web"}),
        other => panic!("no params for the read {other:?}: add them here"),
    }
}

#[tokio::test]
async fn every_read_on_the_allow_list_is_served_while_limited_and_changes_nothing() {
    let (fixture, _directory) = limited(Phase::RunningSteps).await;
    let before = fixture.store.revision().unwrap();
    let mut socket = connect(&fixture, "/api").await;
    let logged_in = login(&mut socket).await;
    assert_eq!(logged_in.get("error"), None, "{logged_in}");
    let mut watcher = String::new();
    let mut id = 10;
    let mut served = 0;
    for &(facade, method) in gate::LIMITED_ALLOW_LIST {
        if !gate::read_only(facade, method) || (facade, method) == ("Admin", "Login") {
            continue; // Login was made above, while limited.
        }
        id += 1;
        let params = read_params(facade, method, &watcher);
        let reply = if facade == "AllWatcher" {
            send(
                &mut socket,
                json!({"request-id": id, "type": facade, "version": version(facade),
                                     "Id": watcher, "request": method, "params": {}}),
            )
            .await;
            receive(&mut socket).await
        } else {
            call(&mut socket, id, facade, version(facade), method, params).await
        };
        assert_ne!(
            reply["error-code"], "upgrade in progress",
            "{facade}.{method} is a read but was refused while limited: {reply}"
        );
        match (facade, method) {
            // Juju's answer when the controller does not redirect.
            ("Admin", "RedirectInfo") => assert_eq!(reply["error"], "not redirected"),
            // It may answer that no binary matches.
            ("Client", "FindTools") => {}
            _ => assert_eq!(reply.get("error"), None, "{facade}.{method}: {reply}"),
        }
        if (facade, method) == ("Client", "WatchAll") {
            watcher = reply["response"]["watcher-id"].as_str().unwrap().to_owned();
        }
        if (facade, method) == ("AllWatcher", "Next") {
            let deltas = reply["response"]["deltas"].as_array().unwrap();
            assert!(
                deltas.iter().any(|delta| delta[0] == "application"),
                "the watcher read the deployed state while limited: {reply}"
            );
        }
        assert_eq!(
            fixture.store.revision().unwrap(),
            before,
            "{facade}.{method} changed the store while limited: {reply}"
        );
        served += 1;
    }
    let reads = gate::LIMITED_ALLOW_LIST
        .iter()
        .filter(|(facade, method)| gate::read_only(facade, method))
        .count();
    assert_eq!(served, reads - 1, "every read but Login was called");
    assert_eq!(
        fixture.store.revision().unwrap(),
        before,
        "after every read"
    );
    assert!(!watcher.is_empty(), "WatchAll came before Next on the list");
}

#[tokio::test]
async fn every_served_call_off_the_allow_list_is_refused_while_limited_and_changes_nothing() {
    let (fixture, _directory) = limited(Phase::Upgrading).await;
    let mut socket = connect(&fixture, "/api").await;
    login(&mut socket).await;
    let before = fixture.store.revision().unwrap();
    let mut id = 10;
    let mut refused = 0;
    for &(facade, versions, methods) in FACADES {
        for &method in methods {
            if gate::allowed_when_limited(facade, method) || facade == "Upgrader" {
                // Upgrader is an agent's facade, refused to users whatever the phase.
                continue;
            }
            id += 1;
            // Params a client would send to change something: the gate answers first.
            let params = json!({"applications": [{"application": "web2", "num-units": 1}],
                                "config": {"logging-config": "<root>=DEBUG"}});
            let version = *versions.last().unwrap();
            let reply = call(&mut socket, id, facade, version, method, params).await;
            assert_eq!(
                reply["error-code"], "upgrade in progress",
                "{facade}.{method} is not on the allow-list but was admitted: {reply}"
            );
            refused += 1;
        }
    }
    assert!(refused >= 15, "only {refused} writes were tried");
    assert_eq!(
        fixture.store.revision().unwrap(),
        before,
        "a refused call changed the store"
    );
    assert_eq!(fixture.api.gate_rejections(), refused);
}
