//! The agent-version on the API over the real store: `ModelConfig.ModelSet` of
//! `agent-version` with Juju's refusals (moved from the transport's `tests/tools.rs`, whose
//! `FindTools` and tools-endpoint tests stay there).

use crate::api_support;

use api_support::*;
use lockstep_core::lifecycle::{ControllerSet, UpgradeInfo, UpgradeStatus};
use lockstep_core::{Phase, Version};
use lockstep_store::Store;
use serde_json::json;

async fn logged_in(fixture: &Fixture) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    login(&mut socket).await;
    socket
}

fn agent_version(store: &dyn Store) -> Version {
    store.load_model().unwrap().unwrap().agent_version
}

#[tokio::test]
async fn model_set_changes_the_agent_version_only_when_juju_would() {
    let fixture = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture).await;
    let set = |version: &str| json!({"config": {"agent-version": version}});

    // Limited phases: the gate turns it away before anything is looked at.
    fixture.gate.send(view(Phase::Upgrading)).unwrap();
    let gated = call(&mut socket, 2, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert_eq!(gated["error-code"], "upgrade in progress", "{gated}");
    fixture.gate.send(view(Phase::Ready)).unwrap();

    // agent-version is set alone: with another key, nothing changes.
    let other = call(
        &mut socket,
        3,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"agent-version": "2.9.44", "logging-config": "<root>=DEBUG"}}),
    )
    .await;
    assert_eq!(other["error-code"], "bad request", "{other}");
    assert!(
        other["error"]
            .as_str()
            .unwrap()
            .contains("agent-version is set alone"),
        "{other}"
    );
    let malformed = call(&mut socket, 4, "ModelConfig", 3, "ModelSet", set("2.9")).await;
    assert_eq!(malformed["error-code"], "bad request", "{malformed}");

    // No binaries of that version in the model's streams (2.9.45 is proposed only).
    let missing = call(&mut socket, 5, "ModelConfig", 3, "ModelSet", set("2.9.45")).await;
    assert_eq!(
        (missing["error"].as_str(), missing["error-code"].as_str()),
        (
            Some("no agent binaries found for version 2.9.45"),
            Some("not found")
        ),
        "{missing}"
    );
    // A catalogue that cannot be read refuses too.
    *fixture.backend.catalogue.lock().unwrap() = Err("no route to the mirror".into());
    let unreadable = call(&mut socket, 6, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert!(
        unreadable["error"]
            .as_str()
            .unwrap()
            .ends_with("no route to the mirror"),
        "{unreadable}"
    );
    *fixture.backend.catalogue.lock().unwrap() = Ok(catalogue());
    assert_eq!(
        agent_version(fixture.store.as_ref()),
        Version::new(2, 9, 43)
    );
    assert!(fixture.backend.versions_changed.lock().unwrap().is_empty());

    // The change: stored, the backend told, ModelGet shows it, a watcher sees it.
    let watcher = call(&mut socket, 7, "Client", 8, "WatchAll", json!({})).await;
    let id = watcher["response"]["watcher-id"]
        .as_str()
        .unwrap()
        .to_owned();
    send(
        &mut socket,
        json!({"request-id": 8, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"}),
    )
    .await;
    assert_eq!(receive(&mut socket).await["request-id"], 8);
    send(
        &mut socket,
        json!({"request-id": 9, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"}),
    )
    .await;
    let changed = call(&mut socket, 10, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert_eq!(changed, json!({"request-id": 10, "response": {}}));
    assert_eq!(
        agent_version(fixture.store.as_ref()),
        Version::new(2, 9, 44)
    );
    assert_eq!(
        *fixture.backend.versions_changed.lock().unwrap(),
        [Version::new(2, 9, 44)]
    );
    let delta = receive(&mut socket).await;
    assert_eq!(delta["request-id"], 9, "{delta}");
    let deltas = delta["response"]["deltas"].as_array().unwrap();
    assert_eq!(deltas.len(), 1, "{delta}");
    assert_eq!(
        (&deltas[0][0], &deltas[0][1]),
        (&json!("model"), &json!("change"))
    );
    let model = &deltas[0][2];
    assert_eq!(
        (&model["model-uuid"], &model["name"], &model["life"]),
        (&json!(MODEL_UUID), &json!("controller"), &json!("alive"))
    );
    assert_eq!(model["config"]["agent-version"], "2.9.44", "{model}");
    assert_eq!(model["agent-version"], "2.9.44", "{model}");
    let config = call(&mut socket, 11, "ModelConfig", 3, "ModelGet", json!({})).await;
    assert_eq!(
        config["response"]["config"]["agent-version"]["value"],
        "2.9.44"
    );

    // The current version back changes nothing; a lower one is refused.
    let same = call(&mut socket, 12, "ModelConfig", 3, "ModelSet", set("2.9.44")).await;
    assert_eq!(same["response"], json!({}), "{same}");
    let lower = call(&mut socket, 13, "ModelConfig", 3, "ModelSet", set("2.9.43")).await;
    assert_eq!(lower["error-code"], "not supported", "{lower}");
    assert_eq!(fixture.backend.versions_changed.lock().unwrap().len(), 1);

    // While an upgrade-info record is current: Juju's refusal, whatever the catalogue says.
    fixture
        .store
        .create_record(UpgradeInfo {
            previous_version: Version::new(2, 9, 44),
            target_version: Version::new(2, 9, 45),
            status: UpgradeStatus::Pending,
            controllers_ready: ControllerSet::EMPTY,
            controllers_done: ControllerSet::EMPTY,
        })
        .unwrap();
    let refused = call(&mut socket, 14, "ModelConfig", 3, "ModelSet", set("2.9.45")).await;
    assert_eq!(
        refused,
        json!({"request-id": 14,
               "error": "an upgrade is already in progress or the last upgrade did not complete",
               "error-code": "upgrade in progress",
               "error-info": {"previous-version": "2.9.44", "target-version": "2.9.45", "status": "pending"},
               "response": {}})
    );
    assert_eq!(
        agent_version(fixture.store.as_ref()),
        Version::new(2, 9, 44)
    );
    assert_eq!(fixture.backend.versions_changed.lock().unwrap().len(), 1);
}
