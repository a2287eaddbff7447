//! Machine agents on the API over the tests' in-memory state: their logins (Juju's rule:
//! only controllers' while the agent is limited; credentials from the shared state, issued
//! by any controller), what they may call, how the `Upgrader`, `Agent`, `Machiner` and
//! `NotifyWatcher` facades encode their answers, and `MachineManager.ProvisioningScript`'s
//! routing. (The same over the real store, with the controllers-first rule of
//! `DesiredVersion` and the script run: the agent's `tests/api_agents.rs` and
//! `tests/api_machine_agents.rs`.)

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

async fn agent(fixture: &Fixture, tag: &str, password: &str) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    let reply = agent_login(&mut socket, tag, password).await;
    assert!(reply.get("error").is_none(), "{tag}: {reply}");
    socket
}

async fn user(fixture: &Fixture) -> Socket {
    let mut socket = connect(fixture, "/api").await;
    let reply = login(&mut socket).await;
    assert!(reply.get("error").is_none(), "{reply}");
    socket
}

fn provisioning(machine: &str) -> Value {
    json!({"machine-id": machine, "nonce": "n-1", "data-dir": "/var/lib/lockstep",
           "disable-package-commands": true})
}

/// A password issued through one controller logs the agent in on another over the same
/// shared state; issuing another replaces it. Unknown agents and wrong passwords still
/// answer alike, after a check.
#[tokio::test]
async fn an_agent_issued_credentials_by_one_controller_logs_in_on_another() {
    let state = fresh_state();
    add_machines(&state);
    assert_eq!(state.add_machine(Roles::of(&[Role::HostMachine])), "2");
    assert_eq!(state.add_machine(Roles::of(&[Role::HostMachine])), "3");
    let first = start_with(
        Phase::Ready,
        state.clone(),
        0,
        lockstep_transport::tls::Credentials::generate("test", &["127.0.0.1".parse().unwrap()])
            .unwrap(),
    )
    .await;
    let second = start_with(
        Phase::Ready,
        state.clone(),
        0,
        lockstep_transport::tls::Credentials::generate("test", &["127.0.0.1".parse().unwrap()])
            .unwrap(),
    )
    .await;
    // machine-3 has no credentials yet: refused as any unknown login.
    let mut socket = connect(&second, "/api").await;
    let refused = agent_login(&mut socket, "machine-3", "anything").await;
    assert_eq!(refused["error-code"], "unauthorized access", "{refused}");

    let mut admin = user(&first).await;
    let script = call(
        &mut admin,
        2,
        "MachineManager",
        10,
        "ProvisioningScript",
        provisioning("3"),
    )
    .await;
    assert!(script["response"]["script"].is_string(), "{script}");
    let (request, password) = state.provisioned().pop().unwrap();
    // The transport hands the state what only it knows.
    assert_eq!(request.machine_id, "3");
    assert_eq!(request.nonce, "n-1");
    assert_eq!(request.data_dir, "/var/lib/lockstep");
    assert!(request.disable_package_commands);
    assert_eq!(request.api_addresses, [format!("127.0.0.1:{}", first.port)]);
    assert_eq!(Some(request.ca_pem.clone()), first.api.ca_pem());
    assert!(
        request.ca_pem.contains("BEGIN CERTIFICATE"),
        "{}",
        request.ca_pem
    );
    assert_eq!(request.server_version.to_string(), "2.9.43");
    assert_eq!(request.identity.model_uuid, MODEL_UUID);
    assert_eq!(
        request.identity.controller_uuid,
        "deadbeef-0000-4000-8000-000000000002"
    );

    // The other controller admits it.
    let mut on_second = connect(&second, "/api").await;
    let admitted = agent_login(&mut on_second, "machine-3", &password).await;
    assert!(admitted.get("error").is_none(), "{admitted}");
    // Provisioning again issues another password: the first stops working.
    call(
        &mut admin,
        3,
        "MachineManager",
        10,
        "ProvisioningScript",
        provisioning("3"),
    )
    .await;
    let (_, again) = state.provisioned().pop().unwrap();
    assert_ne!(again, password);
    let mut stale = connect(&second, "/api").await;
    let refused = agent_login(&mut stale, "machine-3", &password).await;
    assert_eq!(refused["error-code"], "unauthorized access", "{refused}");
    let mut fresh = connect(&second, "/api").await;
    let admitted = agent_login(&mut fresh, "machine-3", &again).await;
    assert!(admitted.get("error").is_none(), "{admitted}");
}

/// `ProvisioningScript` is a user's (with admin access) and a write: agents are refused it,
/// the gate refuses it while limited, and the state's refusals (an unknown or controller
/// machine) and malformed params are answered as the call's error.
#[tokio::test]
async fn provisioning_script_is_an_admin_s_write_and_names_what_it_refuses() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    let mut admin = user(&fixture).await;
    let cases = [
        (provisioning("9"), "not found", "machine 9 not found"),
        (
            provisioning("0"),
            "bad request",
            "machine 0 is a controller",
        ),
        (
            json!({"machine-id": "1", "data-dir": "relative/dir"}),
            "bad request",
            "data-dir must be an absolute path",
        ),
        (
            json!({"machine-id": "1", "data-dir": "/a\nb"}),
            "bad request",
            "data-dir must be an absolute path",
        ),
        (
            json!({"machine-id": "one two", "data-dir": "/d"}),
            "bad request",
            "machine-id \"one two\" is not a machine id",
        ),
        (
            json!({"machine-id": "1", "data-dir": "/d", "disable-package-commands": "yes"}),
            "bad request",
            "disable-package-commands must be a boolean",
        ),
    ];
    for (index, (params, code, message)) in cases.iter().enumerate() {
        let reply = call(
            &mut admin,
            2 + index as u64,
            "MachineManager",
            10,
            "ProvisioningScript",
            params.clone(),
        )
        .await;
        assert_eq!(reply["error-code"], *code, "{params}: {reply}");
        assert!(
            reply["error"].as_str().unwrap().starts_with(message),
            "{params}: {reply}"
        );
    }
    assert!(fixture.state.provisioned().is_empty());

    let mut machine = agent(&fixture, "machine-1", AGENT_PASSWORD).await;
    let denied = call(
        &mut machine,
        2,
        "MachineManager",
        10,
        "ProvisioningScript",
        provisioning("1"),
    )
    .await;
    assert_eq!(denied["error"], "permission denied", "{denied}");

    fixture.gate.send(view(Phase::RunningSteps)).unwrap();
    let limited = call(
        &mut admin,
        20,
        "MachineManager",
        10,
        "ProvisioningScript",
        provisioning("1"),
    )
    .await;
    assert_eq!(limited["error-code"], "upgrade in progress", "{limited}");
    assert!(fixture.state.provisioned().is_empty());
}

/// `Agent.GetEntities` and `Machiner.SetStatus`: an agent asks about and reports on itself
/// only; users may call neither.
#[tokio::test]
async fn an_agent_reads_its_jobs_and_reports_its_status_about_itself_only() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    let mut machine = agent(&fixture, "machine-1", AGENT_PASSWORD).await;
    let denied = json!({"error": {"message": "permission denied", "code": "unauthorized access"}});
    let entities = call(
        &mut machine,
        2,
        "Agent",
        3,
        "GetEntities",
        json!({"entities": [{"tag": "machine-1"}, {"tag": "machine-0"}, {"tag": "user-admin"}]}),
    )
    .await;
    assert_eq!(
        entities["response"],
        json!({"entities": [{"life": "alive", "jobs": ["JobHostUnits"], "container-type": ""},
                            denied, denied]}),
        "{entities}"
    );
    let mut controller = agent(&fixture, "machine-0", AGENT_PASSWORD).await;
    let jobs = call(
        &mut controller,
        2,
        "Agent",
        3,
        "GetEntities",
        json!({"entities": [{"tag": "machine-0"}]}),
    )
    .await;
    assert_eq!(
        jobs["response"]["entities"][0]["jobs"],
        json!(["JobManageModel"]),
        "{jobs}"
    );

    let set = call(
        &mut machine,
        3,
        "Machiner",
        5,
        "SetStatus",
        json!({"entities": [
            {"tag": "machine-1", "status": "started", "info": "",
             "data": {"phase": "ready", "version": "2.9.44-ubuntu-amd64"}},
            {"tag": "machine-0", "status": "started", "info": ""},
            {"tag": "machine-1", "status": "running", "info": ""},
            {"tag": "machine-1", "status": "error", "info": ""},
        ]}),
    )
    .await;
    assert_eq!(
        set["response"],
        json!({"results": [
            {},
            denied,
            {"error": {"message": "cannot set invalid status \"running\"", "code": "bad request"}},
            {"error": {"message": "cannot set status \"error\" without info", "code": "bad request"}},
        ]}),
        "{set}"
    );
    let stored = fixture.state.agent_status("machine-1").unwrap();
    assert_eq!(
        (stored.status.as_str(), stored.phase.as_str()),
        ("started", "ready")
    );
    assert_eq!(stored.version.unwrap().to_string(), "2.9.44-ubuntu-amd64");
    assert!(fixture.state.agent_status("machine-0").is_none());

    let mut admin = user(&fixture).await;
    for (id, facade, version, method) in [
        (2, "Agent", 3, "GetEntities"),
        (3, "Machiner", 5, "SetStatus"),
        (4, "NotifyWatcher", 1, "Next"),
    ] {
        let reply = call(
            &mut admin,
            id,
            facade,
            version,
            method,
            json!({"entities": []}),
        )
        .await;
        assert_eq!(reply["error"], "permission denied", "{facade}: {reply}");
    }
}

/// An agent that logged in while Ready keeps reporting its status through every limited
/// phase (the gate admits agents' reports in every phase); its other calls wait for Ready.
#[tokio::test]
async fn a_machine_agent_s_status_reports_are_admitted_while_the_controller_upgrades() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    let mut machine = agent(&fixture, "machine-1", AGENT_PASSWORD).await;
    let report = |info: &str| {
        json!({"entities": [{"tag": "machine-1", "status": "started", "info": info,
                             "data": {"phase": "ready"}}]})
    };
    let mut id = 2;
    for phase in Phase::LIFECYCLE
        .into_iter()
        .filter(|phase| !phase.is_ready())
    {
        fixture.gate.send(view(phase)).unwrap();
        let set = call(
            &mut machine,
            id,
            "Machiner",
            5,
            "SetStatus",
            report(phase.as_str()),
        )
        .await;
        assert_eq!(set["response"], json!({"results": [{}]}), "{phase}: {set}");
        assert_eq!(
            fixture.state.agent_status("machine-1").unwrap().info,
            phase.as_str()
        );
        let other = call(
            &mut machine,
            id + 1,
            "Agent",
            3,
            "GetEntities",
            json!({"entities": [{"tag": "machine-1"}]}),
        )
        .await;
        assert_eq!(
            other["error-code"], "upgrade in progress",
            "{phase}: {other}"
        );
        id += 2;
    }
}

/// `Upgrader.WatchAPIVersion` and `NotifyWatcher`: the first `Next` answers at once, the
/// next when the desired version changed; `Stop` ends a pending `Next`; an unknown id is
/// `not found`; watchers are bounded per connection.
#[tokio::test]
async fn watch_api_version_notifies_when_the_desired_version_changes() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    let mut machine = agent(&fixture, "machine-1", AGENT_PASSWORD).await;
    let watch = call(
        &mut machine,
        2,
        "Upgrader",
        1,
        "WatchAPIVersion",
        json!({"entities": [{"tag": "machine-1"}, {"tag": "machine-0"}]}),
    )
    .await;
    let id = watch["response"]["results"][0]["NotifyWatcherId"]
        .as_str()
        .unwrap_or_else(|| panic!("{watch}"))
        .to_owned();
    assert_eq!(
        watch["response"]["results"][1],
        json!({"error": {"message": "permission denied", "code": "unauthorized access"}})
    );
    let next = |request: u64, id: &str| {
        json!({"request-id": request, "type": "NotifyWatcher", "version": 1,
               "request": "Next", "id": id, "params": {}})
    };
    // The initial event, at once.
    send(&mut machine, next(3, &id)).await;
    assert_eq!(
        receive(&mut machine).await,
        json!({"request-id": 3, "response": {}})
    );
    // Nothing changed: the next blocks, through changes that do not move the version.
    send(&mut machine, next(4, &id)).await;
    fixture.state.add_machine(Roles::of(&[Role::HostMachine]));
    let early =
        tokio::time::timeout(std::time::Duration::from_millis(300), receive(&mut machine)).await;
    assert!(early.is_err(), "answered without a change: {early:?}");
    fixture
        .state
        .set_model_agent_version(lockstep_core::Version::new(2, 9, 44));
    let woken = tokio::time::timeout(std::time::Duration::from_secs(5), receive(&mut machine))
        .await
        .expect("Next answers once the desired version changed");
    assert_eq!(woken, json!({"request-id": 4, "response": {}}));

    // Stop ends a pending Next; the id is then unknown.
    send(&mut machine, next(5, &id)).await;
    let stop = call(&mut machine, 6, "NotifyWatcher", 1, "Stop", json!({})).await;
    // `call` sends no id: Stop of no watcher is `not found`; stop it by id instead.
    assert_eq!(stop["error-code"], "not found", "{stop}");
    send(
        &mut machine,
        json!({"request-id": 7, "type": "NotifyWatcher", "version": 1, "request": "Stop",
               "id": id, "params": {}}),
    )
    .await;
    let mut replies = vec![receive(&mut machine).await, receive(&mut machine).await];
    replies.sort_by_key(|reply| reply["request-id"].as_u64());
    assert_eq!(
        replies,
        [
            json!({"request-id": 5, "error": "watcher was stopped", "error-code": "stopped", "response": {}}),
            json!({"request-id": 7, "response": {}}),
        ]
    );
    send(&mut machine, next(8, &id)).await;
    assert_eq!(
        receive(&mut machine).await,
        json!({"request-id": 8, "error": format!("unknown watcher id {id:?}"),
               "error-code": "not found", "response": {}})
    );

    // Bounded per connection, as AllWatchers.
    let many: Vec<Value> = (0..17).map(|_| json!({"tag": "machine-1"})).collect();
    let watched = call(
        &mut machine,
        9,
        "Upgrader",
        1,
        "WatchAPIVersion",
        json!({"entities": many}),
    )
    .await;
    let results = watched["response"]["results"].as_array().unwrap();
    assert!(
        results[..16]
            .iter()
            .all(|result| result["NotifyWatcherId"].is_string()),
        "{watched}"
    );
    assert_eq!(
        results[16]["error"]["code"], "quota limit exceeded",
        "{watched}"
    );
}

/// An agent's password hash is read from the state by the login pool, in the source's turn:
/// a flood of agent logins reads it no more often at once than the pool has threads, and
/// every login, known or not, still costs its check.
#[tokio::test]
async fn a_flood_of_agent_logins_reads_credentials_no_more_often_at_once_than_the_pool_checks() {
    let fixture = start(Phase::Ready).await;
    add_machines(&fixture.state);
    *fixture.state.hash_read_delay.lock().unwrap() = std::time::Duration::from_millis(20);
    let mut socket = connect(&fixture, "/api").await;
    let logins = 12;
    for id in 0..logins {
        send(
            &mut socket,
            json!({"request-id": id + 1, "type": "Admin", "version": 3, "request": "Login",
                   "params": {"auth-tag": format!("machine-{}", id % 4), "credentials": "wrong"}}),
        )
        .await;
    }
    for _ in 0..logins {
        let reply = receive(&mut socket).await;
        assert_eq!(reply["error-code"], "unauthorized access", "{reply}");
    }
    let (in_flight, most, all) = *fixture.state.hash_reads.lock().unwrap();
    let threads = lockstep_transport::limits::ApiLimits::default()
        .login_concurrency
        .max(1);
    assert_eq!(in_flight, 0);
    assert_eq!(all, logins as usize);
    assert!(
        (1..=threads).contains(&most),
        "{most} reads at once with {threads} login threads"
    );
}
