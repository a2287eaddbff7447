//! Machine agents on the API: their logins (Juju's rule: only controllers' while the agent
//! is limited), what they may call, and the `Upgrader` facade with the controllers-first
//! rule of `DesiredVersion`.

use crate::api_support;

use api_support::*;
use lockstep_core::{Binary, Phase, Role, Roles};
use lockstep_store::{Machine, Store};
use serde_json::{Value, json};

/// Machine 0 is a controller, machines 1 and 2 host units; machine 2 has credentials but
/// never reports its binary.
fn add_machines(store: &dyn Store) {
    store
        .add_machine(&Machine::with_roles("0", Roles::of(&[Role::Controller])))
        .unwrap();
    for id in ["1", "2"] {
        store
            .add_machine(&Machine::with_roles(id, Roles::of(&[Role::HostMachine])))
            .unwrap();
    }
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

async fn agent(fixture: &Fixture, tag: &str) -> Socket {
    let mut socket = connect(fixture, &format!("/model/{MODEL_UUID}/api")).await;
    let reply = agent_login(&mut socket, tag, AGENT_PASSWORD).await;
    assert!(
        reply.get("response").is_some() && reply.get("error").is_none(),
        "{reply}"
    );
    socket
}

fn stored_binary(store: &dyn Store, id: &str) -> Option<Binary> {
    let mut binary = None;
    store
        .snapshot(&mut |tx| {
            binary = tx.machine(id)?.and_then(|machine| machine.agent_binary);
            Ok(())
        })
        .unwrap();
    binary
}

#[tokio::test]
async fn only_controller_agents_log_in_while_limited_and_agents_call_agent_facades_only() {
    let fixture = start(Phase::Upgrading).await;
    add_machines(fixture.store.as_ref());
    let mut socket = connect(&fixture, "/api").await;

    // Wrong password, unknown agent, an agent whose machine is not in the store: the same
    // answer as a user's failed login.
    let unauthorized = json!({"request-id": 1, "error": "invalid entity name or password", "error-code": "unauthorized access", "response": {}});
    assert_eq!(
        agent_login(&mut socket, "machine-1", "wrong").await,
        unauthorized
    );
    assert_eq!(
        agent_login(&mut socket, "machine-9", AGENT_PASSWORD).await,
        unauthorized
    );
    fixture
        .store
        .transaction(None, &mut |tx| {
            tx.remove_machine("2")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        agent_login(&mut socket, "machine-2", AGENT_PASSWORD).await,
        unauthorized
    );
    assert_eq!(
        agent_login(&mut socket, "unit-mysql-0", AGENT_PASSWORD).await,
        unauthorized
    );

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
    assert_eq!(
        call(&mut socket, 2, "Pinger", 1, "Ping", json!({})).await["response"],
        json!({})
    );
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
    let desired = call(
        &mut socket,
        4,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": "machine-0"}]}),
    )
    .await;
    assert_eq!(
        desired["response"],
        json!({"results": [{"version": "2.9.43"}]})
    );
    let mut machine = agent(&fixture, "machine-1").await;
    let denied = |id: u64| json!({"request-id": id, "error": "permission denied", "error-code": "unauthorized access", "response": {}});
    let status = call(&mut machine, 2, "Client", 8, "FullStatus", json!({})).await;
    assert_eq!(status, denied(2));
    let deploy = call(
        &mut machine,
        3,
        "Application",
        20,
        "Deploy",
        json!({"applications": []}),
    )
    .await;
    assert_eq!(deploy, denied(3));
    let mut user = connect(&fixture, "/api").await;
    let facades = login(&mut user).await["response"]["facades"].clone();
    assert!(
        !facades
            .as_array()
            .unwrap()
            .iter()
            .any(|facade| facade["name"] == "Upgrader"),
        "{facades}"
    );
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

async fn desired(socket: &mut Socket, id: u64, tag: &str) -> Value {
    let reply = call(
        socket,
        id,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": tag}]}),
    )
    .await;
    reply["response"]["results"][0].clone()
}

async fn tools(socket: &mut Socket, id: u64, tag: &str) -> Value {
    let reply = call(
        socket,
        id,
        "Upgrader",
        1,
        "Tools",
        json!({"entities": [{"tag": tag}]}),
    )
    .await;
    reply["response"]["results"][0].clone()
}

async fn set_tools(socket: &mut Socket, id: u64, method: &str, tag: &str, binary: &str) -> Value {
    let reply = call(
        socket,
        id,
        "Upgrader",
        1,
        method,
        json!({"agent-tools": [{"tag": tag, "tools": {"version": binary}}]}),
    )
    .await;
    reply["response"].clone()
}

#[tokio::test]
async fn desired_version_moves_controllers_first_and_tools_points_at_the_tools_endpoint() {
    let fixture = start(Phase::Ready).await;
    add_machines(fixture.store.as_ref());
    let mut controller = agent(&fixture, "machine-0").await;
    let mut machine = agent(&fixture, "machine-1").await;
    let mut idle = agent(&fixture, "machine-2").await;
    let mut user = connect(&fixture, "/api").await;
    login(&mut user).await;

    // Each agent reports its binary (Juju's wire name SetTools, and SetVersion); only its own.
    let ok = json!({"results": [{}]});
    assert_eq!(
        set_tools(
            &mut controller,
            2,
            "SetTools",
            "machine-0",
            "2.9.43-ubuntu-amd64"
        )
        .await,
        ok
    );
    assert_eq!(
        set_tools(
            &mut machine,
            2,
            "SetVersion",
            "machine-1",
            "2.9.43-ubuntu-amd64"
        )
        .await,
        ok
    );
    assert_eq!(
        set_tools(
            &mut machine,
            3,
            "SetTools",
            "machine-0",
            "1.0.0-ubuntu-amd64"
        )
        .await,
        json!({"results": [{"error": {"message": "permission denied", "code": "unauthorized access"}}]})
    );
    let malformed = set_tools(&mut machine, 4, "SetTools", "machine-1", "2.9.43").await;
    assert_eq!(
        malformed["results"][0]["error"]["code"], "bad request",
        "{malformed}"
    );
    assert_eq!(
        stored_binary(fixture.store.as_ref(), "0"),
        Some(Binary::parse("2.9.43-ubuntu-amd64").unwrap())
    );
    assert_eq!(
        stored_binary(fixture.store.as_ref(), "1"),
        Some(Binary::parse("2.9.43-ubuntu-amd64").unwrap())
    );

    let version = |text: &str| json!({"version": text});
    assert_eq!(
        desired(&mut controller, 3, "machine-0").await,
        version("2.9.43")
    );
    assert_eq!(
        desired(&mut machine, 5, "machine-1").await,
        version("2.9.43")
    );

    // The operator moves the model to 2.9.44: the controller is told at once; the other
    // agent keeps its own version while any controller does not run 2.9.44 yet.
    let set = call(
        &mut user,
        2,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"agent-version": "2.9.44"}}),
    )
    .await;
    assert_eq!(set["response"], json!({}), "{set}");
    assert_eq!(
        desired(&mut controller, 4, "machine-0").await,
        version("2.9.44")
    );
    assert_eq!(
        desired(&mut machine, 6, "machine-1").await,
        version("2.9.43")
    );
    let url = |binary: &str| {
        format!(
            "https://127.0.0.1:{}/model/{MODEL_UUID}/tools/{binary}",
            fixture.port
        )
    };
    let controller_tools = tools(&mut controller, 5, "machine-0").await;
    assert_eq!(
        controller_tools,
        json!({"tools": [{"version": "2.9.44-ubuntu-amd64", "url": url("2.9.44-ubuntu-amd64"),
                          "size": 1044, "sha256": "2c".repeat(32)}],
               "disable-ssl-hostname-verification": false})
    );
    assert_eq!(
        tools(&mut machine, 7, "machine-1").await["tools"][0]["version"],
        "2.9.43-ubuntu-amd64"
    );

    // The controller machine restarts on 2.9.44 and reports it; this API server still
    // runs 2.9.43, so the others still wait.
    assert_eq!(
        set_tools(
            &mut controller,
            6,
            "SetTools",
            "machine-0",
            "2.9.44-ubuntu-amd64"
        )
        .await,
        ok
    );
    assert_eq!(
        desired(&mut machine, 8, "machine-1").await,
        version("2.9.43")
    );
    // Every controller runs it: now the others are told.
    *fixture.backend.own_version.lock().unwrap() = "2.9.44".into();
    assert_eq!(
        desired(&mut machine, 9, "machine-1").await,
        version("2.9.44")
    );
    assert_eq!(
        tools(&mut machine, 10, "machine-1").await["tools"][0]["url"],
        url("2.9.44-ubuntu-amd64")
    );

    // Per-entity errors: another agent's tag, an agent that never reported its binary, a
    // binary the catalogue lacks for its architecture.
    let both = call(
        &mut machine,
        11,
        "Upgrader",
        1,
        "DesiredVersion",
        json!({"entities": [{"tag": "machine-1"}, {"tag": "machine-0"}]}),
    )
    .await;
    assert_eq!(
        both["response"],
        json!({"results": [{"version": "2.9.44"},
                           {"error": {"message": "permission denied", "code": "unauthorized access"}}]})
    );
    let unknown = tools(&mut idle, 2, "machine-2").await;
    assert_eq!(unknown["error"]["code"], "not found", "{unknown}");
    assert_eq!(
        set_tools(
            &mut machine,
            12,
            "SetTools",
            "machine-1",
            "2.9.44-ubuntu-s390x"
        )
        .await,
        ok
    );
    assert_eq!(
        tools(&mut machine, 13, "machine-1").await,
        json!({"error": {"message": "no matching agent binaries available for 2.9.44-ubuntu-s390x", "code": "not found"}})
    );
}
