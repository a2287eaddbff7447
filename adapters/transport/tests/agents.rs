//! Machine agents on the API over the tests' in-memory state: their logins (Juju's rule:
//! only controllers' while the agent is limited), what they may call, and how the
//! `Upgrader` facade encodes its answers. (The same over the real store, with the
//! controllers-first rule of `DesiredVersion`: the agent's `tests/api_agents.rs`.)

mod support;

use lockstep_core::{Phase, Role, Roles};
use serde_json::{Value, json};
use support::*;

/// Machine 0 is a controller, machine 1 hosts units; machine 2 has credentials but no
/// machine.
fn add_machines(state: &FakeState) {
    assert_eq!(state.add_machine(Roles::of(&[Role::Controller])), "0");
    assert_eq!(state.add_machine(Roles::of(&[Role::HostMachine])), "1");
}

async fn agent_login(socket: &mut Socket, tag: &str, password: &str) -> Value {
    call(
        socket,
        1,
        "Admin",
        3,
        "Login",
        json!({"auth-tag": tag, "credentials": password, "nonce": "fake-nonce"}),
    )
    .await
}

#[tokio::test]
async fn only_controller_agents_log_in_while_limited_and_agents_call_agent_facades_only() {
    let fixture = start(Phase::Upgrading).await;
    add_machines(&fixture.state);
    let mut socket = connect(&fixture, "/api").await;

    // Wrong password, unknown agent, an agent whose machine does not exist, a tag that is
    // not a machine's: the same answer as a user's failed login.
    let unauthorized = json!({"request-id": 1, "error": "invalid entity name or password", "error-code": "unauthorized access", "response": {}});
    for (tag, password) in [
        ("machine-1", "wrong"),
        ("machine-9", AGENT_PASSWORD),
        ("machine-2", AGENT_PASSWORD),
        ("unit-mysql-0", AGENT_PASSWORD),
    ] {
        assert_eq!(
            agent_login(&mut socket, tag, password).await,
            unauthorized,
            "{tag}"
        );
    }

    // A non-controller agent is turned away while upgrading, in Juju's words.
    let blocked = agent_login(&mut socket, "machine-1", AGENT_PASSWORD).await;
    assert_eq!(
        blocked,
        json!({"request-id": 1,
               "error": "login for machine 1 blocked because upgrade is in progress",
               "error-code": "upgrade in progress",
               "error-info": {"phase": "upgrading", "step": 1, "steps": 3, "target-version": "2.9.44", "retry-after-ms": 1000},
               "response": {}})
    );
    // The controller's agent logs in and gets the allow-list and the agent facades.
    let admitted = agent_login(&mut socket, "machine-0", AGENT_PASSWORD).await;
    let reply = &admitted["response"];
    assert!(reply.get("user-info").is_none(), "{admitted}");
    let facades: Vec<&str> = reply["facades"]
        .as_array()
        .unwrap()
        .iter()
        .map(|facade| facade["name"].as_str().unwrap())
        .collect();
    assert_eq!(facades, ["Admin", "Pinger", "Upgrade", "Upgrader"]);
    let refused = call(
        &mut socket,
        3,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": "machine-0"}]}),
    )
    .await;
    assert_eq!(refused["error"], "upgrade in progress", "{refused}");

    // Ready: the machine agent logs in; client facades are not for agents, Upgrader is not
    // for users.
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let mut machine = connect(&fixture, "/api").await;
    let reply = agent_login(&mut machine, "machine-1", AGENT_PASSWORD).await;
    assert!(reply.get("error").is_none(), "{reply}");
    let denied = |id: u64| json!({"request-id": id, "error": "permission denied", "error-code": "unauthorized access", "response": {}});
    assert_eq!(
        call(&mut machine, 2, "Client", 8, "FullStatus", json!({})).await,
        denied(2)
    );
    let mut user = connect(&fixture, "/api").await;
    login(&mut user).await;
    let upgrader = call(
        &mut user,
        2,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": "machine-1"}]}),
    )
    .await;
    assert_eq!(upgrader, denied(2));
}

#[tokio::test]
async fn upgrader_answers_per_entity_with_tools_on_the_tools_endpoint() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    let mut machine = connect(&fixture, "/api").await;
    agent_login(&mut machine, "machine-1", AGENT_PASSWORD).await;

    let set = call(
        &mut machine,
        2,
        "Upgrader",
        1,
        "SetTools",
        json!({"agent-tools": [{"tag": "machine-1", "tools": {"version": "2.9.43-ubuntu-amd64"}}]}),
    )
    .await;
    assert_eq!(set["response"], json!({"results": [{}]}), "{set}");
    let both = call(
        &mut machine,
        3,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": "machine-1"}, {"tag": "machine-0"}]}),
    )
    .await;
    assert_eq!(
        both["response"],
        json!({"results": [{"version": "2.9.43"},
                           {"error": {"message": "permission denied", "code": "unauthorized access"}}]})
    );
    let tools = call(
        &mut machine,
        4,
        "Upgrader",
        1,
        "Tools",
        json!({"entities": [{"tag": "machine-1"}]}),
    )
    .await;
    let url = format!(
        "https://127.0.0.1:{}/model/{MODEL_UUID}/tools/2.9.43-ubuntu-amd64",
        fixture.port
    );
    assert_eq!(
        tools["response"],
        json!({"results": [{"tools": [{"version": "2.9.43-ubuntu-amd64", "url": url,
                                       "size": 1043, "sha256": "2b".repeat(32)}],
                            "disable-ssl-hostname-verification": false}]})
    );
    // Too many entities in one call: refused before the state is asked.
    let many: Vec<Value> = (0..101).map(|_| json!({"tag": "machine-1"})).collect();
    let refused = call(
        &mut machine,
        5,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": many}),
    )
    .await;
    assert_eq!(refused["error-code"], "bad request", "{refused}");
    // The catalogue cannot be read: a per-entity error naming why.
    *fixture.backend.catalogue.lock().unwrap() = Err("the mirror answered 500".into());
    let unreadable = call(
        &mut machine,
        6,
        "Upgrader",
        1,
        "Tools",
        json!({"entities": [{"tag": "machine-1"}]}),
    )
    .await;
    assert_eq!(
        unreadable["response"],
        json!({"results": [{"error": {"message": "cannot read the agent-binary catalogue: the mirror answered 500"}}]})
    );
}
