//! Machine agents on the API: their logins (Juju's rule: only controllers' while the agent
//! is limited), what they may call, the `Upgrader` facade with the controllers-first
//! rule of `DesiredVersion` (and `WatchAPIVersion` waking on it), and, on SQLite, a machine
//! provisioned with `MachineManager.ProvisioningScript` (the script run with `sh`) that logs
//! in with the password it wrote, reads its jobs and reports its status, which `FullStatus`
//! shows (`down` once it falls silent).

use crate::api_support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use api_support::*;
use lockstep_agent::datadir::DataDir;
use lockstep_core::{Binary, Phase, Role, Roles, Timestamp};
use lockstep_store::{AgentStatus, Machine, Store};
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
    assert_eq!(
        facades,
        [
            "Admin",
            "Agent",
            "Machiner",
            "NotifyWatcher",
            "Pinger",
            "Upgrade",
            "Upgrader"
        ]
    );
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

fn stored_status(store: &dyn Store, tag: &str) -> Option<AgentStatus> {
    let mut status = None;
    store
        .snapshot(&mut |tx| {
            status = tx.agent_status(tag)?;
            Ok(())
        })
        .unwrap();
    status
}

fn stored_hash(store: &dyn Store, tag: &str) -> Option<String> {
    let mut hash = None;
    store
        .snapshot(&mut |tx| {
            hash = tx.agent_password_hash(tag)?;
            Ok(())
        })
        .unwrap();
    hash
}

/// Runs `script` with `sh`; panics with its output unless it succeeds.
fn run_script(script: &str, directory: &std::path::Path) {
    let path = directory.join("provision.sh");
    std::fs::write(&path, script).unwrap();
    let output = std::process::Command::new("sh")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}\n{}\n{script}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn provisioning_script(socket: &mut Socket, id: u64, machine: &str, data_dir: &str) -> Value {
    call(
        socket,
        id,
        "MachineManager",
        10,
        "ProvisioningScript",
        json!({"machine-id": machine, "nonce": "machine-0:abc", "data-dir": data_dir,
               "disable-package-commands": true}),
    )
    .await
}

async fn machine_status(user: &mut Socket, id: u64, machine: &str) -> Value {
    let status = call(user, id, "Client", 8, "FullStatus", json!({})).await;
    status["response"]["machines"][machine].clone()
}

/// The whole path of a machine agent on the real state over SQLite: the admin provisions
/// machine 3, the script (run with `sh`) writes an `agent.conf` mode 0600 that
/// `DataDir::read_agent_conf` reads back with the password, the store holds only the
/// password's hash, and the agent logs in with it, reads its jobs, and reports its status,
/// which FullStatus shows with lockstep's phase, and as `down` once older than
/// `AGENT_DOWN_AFTER` on the store's clock. Provisioning again replaces the password.
#[tokio::test]
async fn a_provisioned_agent_logs_in_with_the_script_s_password_and_reports_its_status() {
    let (fixture, directory) = start_on_sqlite(Phase::Ready).await;
    let store = fixture.store.as_ref();
    add_machines(store);
    store
        .add_machine(&Machine::with_roles("3", Roles::of(&[Role::HostMachine])))
        .unwrap();
    let mut user = connect(&fixture, "/api").await;
    login(&mut user).await;
    let data_dir = directory.path().join("machine 3's data $HOME");
    let data_dir_text = data_dir.to_str().unwrap();

    // Refused: a controller machine, one that does not exist; no credential changes.
    let controller_hash = stored_hash(store, "machine-0");
    let controller = provisioning_script(&mut user, 2, "0", data_dir_text).await;
    assert_eq!(controller["error-code"], "bad request", "{controller}");
    assert!(
        controller["error"]
            .as_str()
            .unwrap()
            .contains("machine 0 is a controller"),
        "{controller}"
    );
    let missing = provisioning_script(&mut user, 3, "9", data_dir_text).await;
    assert_eq!(
        (missing["error"].as_str(), missing["error-code"].as_str()),
        (Some("machine 9 not found"), Some("not found")),
        "{missing}"
    );
    assert_eq!(stored_hash(store, "machine-0"), controller_hash);
    assert_eq!(stored_hash(store, "machine-9"), None);
    assert!(!data_dir.exists());

    let reply = provisioning_script(&mut user, 4, "3", data_dir_text).await;
    let script = reply["response"]["script"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"));
    run_script(script, directory.path());
    let conf_path = data_dir.join("agent.conf");
    let mode = std::fs::metadata(&conf_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "agent.conf is mode {mode:o}");
    let conf = DataDir::new(&data_dir).read_agent_conf().unwrap().unwrap();
    assert_eq!(conf.tag, "machine-3");
    assert_eq!(conf.model, MODEL_UUID);
    assert_eq!(conf.controller, "deadbeef-0000-4000-8000-000000000002");
    assert_eq!(conf.apiaddresses, [format!("127.0.0.1:{}", fixture.port)]);
    assert_eq!(conf.cacert.trim(), fixture.api.ca_pem().unwrap().trim());
    assert_eq!(conf.upgraded_to_version.to_string(), "2.9.43");
    assert!(!conf.bootstrap_complete);
    let password = conf.apipassword.as_str().to_owned();
    assert!(password.len() >= 32, "{password}");
    let hash = stored_hash(store, "machine-3").unwrap();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(!hash.contains(&password));

    // The agent logs in with it and reads its jobs.
    let mut machine = connect(&fixture, "/api").await;
    let login_reply = agent_login(&mut machine, "machine-3", &password).await;
    assert!(login_reply.get("error").is_none(), "{login_reply}");
    let entities = call(
        &mut machine,
        2,
        "Agent",
        3,
        "GetEntities",
        json!({"entities": [{"tag": "machine-3"}, {"tag": "machine-1"}]}),
    )
    .await;
    assert_eq!(
        entities["response"],
        json!({"entities": [
            {"life": "alive", "jobs": ["JobHostUnits"], "container-type": ""},
            {"error": {"message": "permission denied", "code": "unauthorized access"}},
        ]})
    );

    // Before any report: pending, as before.
    let before = machine_status(&mut user, 5, "3").await;
    assert_eq!(before["agent-status"]["status"], "pending", "{before}");
    assert_eq!(before["jobs"], json!(["JobHostUnits"]));

    // Its status, stamped with the store's clock, shown by FullStatus.
    let set = call(
        &mut machine,
        3,
        "Machiner",
        5,
        "SetStatus",
        json!({"entities": [{"tag": "machine-3", "status": "started", "info": "",
                             "data": {"phase": "ready", "version": "2.9.44-ubuntu-amd64"}}]}),
    )
    .await;
    assert_eq!(set["response"], json!({"results": [{}]}), "{set}");
    let reported = stored_status(store, "machine-3").unwrap();
    assert_eq!(
        (reported.status.as_str(), reported.phase.as_str()),
        ("started", "ready")
    );
    let shown = machine_status(&mut user, 6, "3").await;
    let agent_status = &shown["agent-status"];
    assert_eq!(agent_status["status"], "started", "{shown}");
    assert_eq!(agent_status["info"], "");
    assert_eq!(agent_status["version"], "2.9.44");
    assert_eq!(agent_status["data"], json!({"phase": "ready"}));
    assert_eq!(
        agent_status["since"],
        lockstep_transport::facade::client::rfc3339(reported.updated.0 / 1000)
    );
    assert_eq!(shown["instance-status"]["status"], "running");
    assert_eq!(shown["jobs"], json!(["JobHostUnits"]));

    // Reports go on while the controller upgrades.
    fixture.gate.send(view(Phase::Upgrading)).unwrap();
    let limited = call(
        &mut machine,
        4,
        "Machiner",
        5,
        "SetStatus",
        json!({"entities": [{"tag": "machine-3", "status": "started", "info": "still here",
                             "data": {"phase": "ready"}}]}),
    )
    .await;
    assert_eq!(limited["response"], json!({"results": [{}]}), "{limited}");
    fixture.gate.send(view(Phase::Ready)).unwrap();

    // A report older than AGENT_DOWN_AFTER on the store's clock: down, in Juju's words.
    let down_after = lockstep_transport::facade::machiner::AGENT_DOWN_AFTER;
    assert_eq!(down_after, Duration::from_secs(30));
    let mut stale_at = Timestamp(0);
    store
        .transaction(None, &mut |tx| {
            stale_at = Timestamp(tx.now().0 - down_after.as_millis() as u64 - 1000);
            tx.put_agent_status(
                "machine-3",
                &AgentStatus {
                    updated: stale_at,
                    ..reported.clone()
                },
            )?;
            Ok(())
        })
        .unwrap();
    let silent = machine_status(&mut user, 7, "3").await;
    assert_eq!(silent["agent-status"]["status"], "down", "{silent}");
    assert_eq!(
        silent["agent-status"]["info"],
        "agent is not communicating with the server"
    );
    assert_eq!(
        silent["agent-status"]["since"],
        lockstep_transport::facade::client::rfc3339(stale_at.0 / 1000)
    );

    // Provisioning again issues another password: the one written first stops working.
    let again = provisioning_script(&mut user, 8, "3", data_dir_text).await;
    run_script(
        again["response"]["script"].as_str().unwrap(),
        directory.path(),
    );
    let rotated = DataDir::new(&data_dir).read_agent_conf().unwrap().unwrap();
    assert_ne!(rotated.apipassword.as_str(), password);
    let mut stale = connect(&fixture, "/api").await;
    let refused = agent_login(&mut stale, "machine-3", &password).await;
    assert_eq!(refused["error-code"], "unauthorized access", "{refused}");
    let mut fresh = connect(&fixture, "/api").await;
    let admitted = agent_login(&mut fresh, "machine-3", &rotated.apipassword).await;
    assert!(admitted.get("error").is_none(), "{admitted}");
}

/// `Upgrader.WatchAPIVersion` over the real state: the first `Next` answers at once; a later
/// one waits through the model's agent-version moving (a machine agent's desired version
/// moves only once every controller runs it) and answers when the controller reports it.
#[tokio::test]
async fn watch_api_version_answers_when_the_agent_s_desired_version_moves() {
    let fixture = start(Phase::Ready).await;
    add_machines(fixture.store.as_ref());
    *fixture.backend.own_version.lock().unwrap() = "2.9.44".into();
    let mut controller = agent(&fixture, "machine-0").await;
    let mut machine = agent(&fixture, "machine-1").await;
    let mut user = connect(&fixture, "/api").await;
    login(&mut user).await;
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

    // Machine 1 runs 2.9.43: until every controller runs the model's version, it is told
    // the version it runs.
    assert_eq!(
        set_tools(
            &mut machine,
            2,
            "SetTools",
            "machine-1",
            "2.9.43-ubuntu-amd64"
        )
        .await,
        ok
    );
    let watch = call(
        &mut machine,
        3,
        "Upgrader",
        1,
        "WatchAPIVersion",
        json!({"entities": [{"tag": "machine-1"}]}),
    )
    .await;
    let id = watch["response"]["results"][0]["NotifyWatcherId"]
        .as_str()
        .unwrap_or_else(|| panic!("{watch}"))
        .to_owned();
    let next = |request: u64| {
        json!({"request-id": request, "type": "NotifyWatcher", "version": 1,
               "request": "Next", "id": id, "params": {}})
    };
    send(&mut machine, next(4)).await;
    assert_eq!(
        receive(&mut machine).await,
        json!({"request-id": 4, "response": {}})
    );

    send(&mut machine, next(5)).await;
    // The model moves to 2.9.44: machine 1 is still told 2.9.43 (machine 0 runs 2.9.43).
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
    let early = tokio::time::timeout(Duration::from_millis(500), receive(&mut machine)).await;
    assert!(
        early.is_err(),
        "Next answered before the desired version moved: {early:?}"
    );
    // The controller reports 2.9.44: machine 1's desired version moves, and Next answers.
    assert_eq!(
        set_tools(
            &mut controller,
            3,
            "SetTools",
            "machine-0",
            "2.9.44-ubuntu-amd64"
        )
        .await,
        ok
    );
    let woken = tokio::time::timeout(Duration::from_secs(5), receive(&mut machine))
        .await
        .expect("Next answers once the desired version moved");
    assert_eq!(woken, json!({"request-id": 5, "response": {}}));
    assert_eq!(
        desired(&mut machine, 6, "machine-1").await,
        json!({"version": "2.9.44"})
    );
}
