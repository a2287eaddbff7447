//! The facades python-libjuju and python-jujuclient use for everyday work, over the real
//! shared state (`StoreState` on a SQLite store in a temporary directory): their params and result shapes as Juju's, the
//! all-watcher's deltas in Juju's shape, and the rules lockstep adds (what it refuses, what
//! it says of the units it runs no charms for).

use crate::api_support;

use api_support::*;
use lockstep_agent::api::applications;
use lockstep_core::{Binary, Phase, Role, Roles};

use lockstep_agent::api::machines::MACHINE_REMOVAL_DELAY;
use lockstep_store::{EntityKind, Life, Machine, Store};
use lockstep_transport::charm::{Charm, Endpoint};
use serde_json::{Map, Value, json};

/// The server over a fresh SQLite store (its directory removed with the returned guard).
async fn start(phase: Phase) -> (Fixture, tempfile::TempDir) {
    start_on_sqlite(phase).await
}

/// A read of the store, in one snapshot.
fn read<T>(
    store: &dyn lockstep_store::Store,
    mut body: impl FnMut(&mut dyn lockstep_store::Tx) -> Result<T, lockstep_store::StoreError>,
) -> Result<T, lockstep_store::StoreError> {
    let mut answer = None;
    store.snapshot(&mut |tx| {
        answer = Some(body(tx)?);
        Ok(())
    })?;
    Ok(answer.expect("the snapshot body ran"))
}

async fn logged_in(fixture: &Fixture, path: &str) -> Socket {
    let mut socket = connect(fixture, path).await;
    login(&mut socket).await;
    socket
}

async fn next(socket: &mut Socket, request_id: u64, watcher: &str) -> Vec<Value> {
    send(socket, json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "Id": watcher, "request": "Next", "params": {}})).await;
    let reply = receive(socket).await;
    assert_eq!(reply["request-id"], request_id, "{reply}");
    reply["response"]["deltas"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("{reply}"))
}

/// The controller machine as bootstrap records it.
fn add_controller_machine(fixture: &Fixture) {
    let mut machine = Machine::with_roles("0", Roles::of(&[Role::Controller]));
    machine.agent_binary = Some(Binary::parse("2.9.43-ubuntu-amd64").unwrap());
    fixture.store.add_machine(&machine).unwrap();
}

fn endpoint(name: &str, role: &str, interface: &str) -> Endpoint {
    Endpoint {
        name: name.into(),
        role: role.into(),
        interface: interface.into(),
        optional: false,
        limit: u64::from(role != "provider"),
        scope: "global".into(),
    }
}

/// A charm as the charms endpoint reads it from an upload.
fn charm(name: &str, endpoints: Vec<Endpoint>, options: Value) -> Charm {
    Charm {
        name: name.into(),
        summary: String::new(),
        subordinate: false,
        series: vec!["jammy".into()],
        endpoints,
        options: options.as_object().cloned().unwrap_or_default(),
        sha256: format!("{name:0>64}"),
        size_bytes: 100,
    }
}

/// `web` (requires `db: pgsql`, option `port` int 80) and `db` (provides `db: pgsql`),
/// recorded as uploads.
fn record_charms(fixture: &Fixture) -> (String, String) {
    let web = charm(
        "web",
        vec![endpoint("db", "requirer", "pgsql")],
        json!({"port": {"type": "int", "default": 80, "description": "port"}}),
    );
    let db = charm("db", vec![endpoint("db", "provider", "pgsql")], json!({}));
    (
        applications::add_charm(fixture.store.as_ref(), &web, None).unwrap(),
        applications::add_charm(fixture.store.as_ref(), &db, Some("focal")).unwrap(),
    )
}

#[tokio::test]
async fn login_advertises_the_facades_libjuju_and_jujuclient_negotiate() {
    let (fixture, _directory) = start(Phase::Ready).await;
    let mut socket = connect(&fixture, "/api").await;
    let reply = login(&mut socket).await;
    let facades: Map<String, Value> = reply["response"]["facades"]
        .as_array()
        .unwrap()
        .iter()
        .map(|facade| {
            (
                facade["name"].as_str().unwrap().to_owned(),
                facade["versions"].clone(),
            )
        })
        .collect();
    for (name, versions) in [
        ("Admin", json!([3])),
        ("AllWatcher", json!([1, 3])),
        ("Application", json!([1, 20])),
        ("Charms", json!([6])),
        ("Client", json!([1, 8])),
        ("Controller", json!([11, 12])),
        ("MachineManager", json!([10])),
        ("ModelConfig", json!([3])),
        ("ModelManager", json!([9, 10])),
        ("Pinger", json!([1])),
    ] {
        assert_eq!(facades.get(name), Some(&versions), "{name}: {reply}");
    }
    // The agents' own facades are not advertised to users.
    for name in ["Agent", "Machiner", "NotifyWatcher", "Upgrader"] {
        assert_eq!(facades.get(name), None, "{name}: {reply}");
    }
    assert_eq!(reply["response"]["user-info"]["model-access"], "admin");
    // A method not served on a new facade: Juju's words and code, a `response` object.
    let reply = call(
        &mut socket,
        2,
        "MachineManager",
        10,
        "UpgradeSeriesPrepare",
        json!({}),
    )
    .await;
    assert_eq!(
        reply,
        json!({"request-id": 2, "error-code": "not implemented", "response": {},
               "error": "no such request - method MachineManager(10).UpgradeSeriesPrepare is not implemented"})
    );
}

#[tokio::test]
async fn model_and_controller_calls_answer_juju_s_shapes() {
    let (fixture, _directory) = start(Phase::Ready).await;
    add_controller_machine(&fixture);
    let mut socket = logged_in(&fixture, "/api").await;
    let tag = format!("model-{MODEL_UUID}");
    let info = call(
        &mut socket,
        2,
        "ModelManager",
        10,
        "ModelInfo",
        json!({"entities": [{"tag": tag}, {"tag": "model-other"}]}),
    )
    .await;
    let result = &info["response"]["results"][0]["result"];
    assert_eq!(
        (
            &result["name"],
            &result["uuid"],
            &result["type"],
            &result["is-controller"]
        ),
        (
            &json!("controller"),
            &json!(MODEL_UUID),
            &json!("iaas"),
            &json!(true)
        ),
        "{info}"
    );
    assert_eq!(
        result["controller-uuid"],
        "deadbeef-0000-4000-8000-000000000002"
    );
    assert_eq!(result["agent-version"], "2.9.43");
    assert_eq!(result["status"]["status"], "available");
    assert_eq!(
        result["machines"],
        json!([{"id": "0", "status": "started", "message": "",
                                           "has-vote": false, "wants-vote": false}])
    );
    assert!(
        info["response"]["results"][0].get("error").is_none(),
        "{info}"
    );
    assert_eq!(info["response"]["results"][1]["error"]["code"], "not found");

    let summaries = call(
        &mut socket,
        3,
        "ModelManager",
        10,
        "ListModelSummaries",
        json!({"user-tag": "user-admin", "all": false}),
    )
    .await;
    let summary = &summaries["response"]["results"][0]["result"];
    assert_eq!(
        (&summary["name"], &summary["uuid"]),
        (&json!("controller"), &json!(MODEL_UUID))
    );
    assert_eq!(
        summary["counts"],
        json!([{"entity": "machines", "count": 1}])
    );
    assert_eq!(summary["user-access"], "admin");

    let models = call(&mut socket, 4, "Controller", 12, "AllModels", json!({})).await;
    assert_eq!(
        models["response"],
        json!({"user-models": [{"model": {"name": "controller", "uuid": MODEL_UUID,
                                          "type": "iaas", "owner-tag": "user-admin"}}]})
    );
    let api_info = call(
        &mut socket,
        5,
        "Controller",
        12,
        "ControllerAPIInfoForModels",
        json!({"entities": [{"tag": tag}]}),
    )
    .await;
    assert_eq!(
        api_info["response"]["results"][0],
        json!({"addresses": [format!("127.0.0.1:{}", fixture.port)], "cacert": fixture.ca_pem})
    );
    let constraints = call(
        &mut socket,
        6,
        "ModelConfig",
        3,
        "GetModelConstraints",
        json!({}),
    )
    .await;
    assert_eq!(constraints["response"], json!({"constraints": {}}));
}

#[tokio::test]
async fn deltas_and_status_have_juju_s_fields_and_say_lockstep_runs_no_charms() {
    let (fixture, _directory) = start(Phase::Ready).await;
    add_controller_machine(&fixture);
    let (web, db) = record_charms(&fixture);
    assert_eq!(
        (web.as_str(), db.as_str()),
        ("local:jammy/web-0", "local:focal/db-0")
    );
    let mut socket = logged_in(&fixture, &format!("/model/{MODEL_UUID}/api")).await;
    let deployed = call(&mut socket, 2, "Application", 20, "Deploy", json!({"applications": [
        {"application": "web", "charm-url": web, "num-units": 1, "config-yaml": "web:\n  port: \"8080\"\n",
         "charm-origin": {"base": {"name": "ubuntu", "channel": "22.04"}, "source": "local"},
         "Force": false, "placement": []},
        {"application": "db", "charm-url": db, "num-units": 1, "config": null},
    ]})).await;
    assert_eq!(
        deployed["response"],
        json!({"results": [{}, {}]}),
        "{deployed}"
    );
    let related = call(
        &mut socket,
        3,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["web", "db"], "via-cidrs": null}),
    )
    .await;
    assert_eq!(
        related["response"]["endpoints"]["db"],
        json!({"name": "db", "role": "provider", "interface": "pgsql", "optional": false, "limit": 0, "scope": "global"}),
        "{related}"
    );

    let watch = call(&mut socket, 4, "Client", 8, "WatchAll", json!({})).await;
    let watcher = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let deltas = next(&mut socket, 5, &watcher).await;
    let of = |kind: &str| -> Vec<Value> {
        deltas
            .iter()
            .filter(|delta| delta[0] == kind)
            .map(|delta| delta[2].clone())
            .collect()
    };
    let model = &of("model")[0];
    assert_eq!(model["model-uuid"], MODEL_UUID);
    assert_eq!(model["config"]["name"], "controller");
    assert_eq!(model["config"]["agent-version"], "2.9.43");
    assert_eq!(model["status"]["current"], "available");
    let machines = of("machine");
    assert_eq!(machines[0]["id"], "0");
    assert_eq!(machines[0]["agent-status"]["current"], "started");
    assert_eq!(machines[0]["agent-status"]["version"], "2.9.43");
    assert_eq!(machines[1]["agent-status"]["current"], "pending");
    assert_eq!(machines[1]["instance-status"]["current"], "pending");
    let application = of("application")
        .into_iter()
        .find(|a| a["name"] == "web")
        .unwrap();
    assert_eq!(application["charm-url"], "local:jammy/web-0");
    assert_eq!(
        application["config"],
        json!({"port": 8080}),
        "typed by the charm's option"
    );
    assert_eq!(application["status"]["current"], "unknown");
    assert_eq!(application["status"]["message"], "lockstep runs no charms");
    let unit = of("unit")
        .into_iter()
        .find(|u| u["name"] == "web/0")
        .unwrap();
    assert_eq!(unit["application"], "web");
    assert_eq!(unit["machine-id"], "1");
    assert_eq!(unit["agent-status"]["current"], "allocating");
    assert_eq!(
        unit["agent-status"]["message"],
        "lockstep runs no unit agents"
    );
    assert_eq!(unit["workload-status"]["current"], "unknown");
    assert!(unit["workload-status"]["since"].is_string(), "{unit}");
    let relation = &of("relation")[0];
    assert_eq!(relation["id"], 0);
    assert_eq!(relation["key"], "db:db web:db");
    assert_eq!(
        relation["endpoints"][1],
        json!({"application-name": "db", "relation": {"name": "db", "role": "provider",
               "interface": "pgsql", "optional": false, "limit": 0, "scope": "global"}})
    );

    let status = call(
        &mut socket,
        6,
        "Client",
        8,
        "FullStatus",
        json!({"include-storage": null, "patterns": null}),
    )
    .await;
    let status = &status["response"];
    let unit = &status["applications"]["web"]["units"]["web/0"];
    assert_eq!(
        (
            &unit["workload-status"]["status"],
            &unit["workload-status"]["info"]
        ),
        (&json!("unknown"), &json!("lockstep runs no charms"))
    );
    assert_eq!(
        (
            &unit["agent-status"]["status"],
            &unit["agent-status"]["info"]
        ),
        (&json!("allocating"), &json!("lockstep runs no unit agents"))
    );
    assert_eq!(unit["leader"], false);
    assert_eq!(
        status["applications"]["web"]["relations"],
        json!({"db": ["db"]})
    );
    assert_eq!(
        status["applications"]["web"]["base"],
        json!({"name": "ubuntu", "channel": "22.04"})
    );
    assert_eq!(status["applications"]["web"]["charm-rev"], 0);
    assert_eq!(status["relations"][0]["id"], 0);
    assert_eq!(status["relations"][0]["interface"], "pgsql");
    assert_eq!(status["relations"][0]["status"]["status"], "joining");
    assert_eq!(
        status["machines"]["0"]["instance-status"]["status"],
        "running"
    );
    assert_eq!(status["machines"]["1"]["agent-status"]["status"], "pending");
    assert_eq!(status["model"]["model-status"]["status"], "available");
    for key in ["remote-applications", "offers", "branches"] {
        assert_eq!(status[key], json!({}), "{key}");
    }
    // Nothing says `"error": null` anywhere in a reply.
    assert!(!status.to_string().contains("\"error\":null"));
}

#[tokio::test]
async fn machines_are_added_as_add_machine_does_and_destroyed_with_juju_s_refusals() {
    let (fixture, _directory) = start(Phase::Ready).await;
    add_controller_machine(&fixture);
    let mut socket = logged_in(&fixture, "/api").await;
    let added = call(&mut socket, 2, "MachineManager", 10, "AddMachines", json!({"params": [
        {"addresses": [], "base": null, "constraints": null, "container-type": null, "disks": [],
         "hardware-characteristics": null, "instance-id": null, "jobs": ["JobHostUnits"],
         "nonce": null, "parent-id": null, "placement": null},
        {"jobs": ["JobHostUnits"], "container-type": "lxd", "parent-id": "0"},
    ]})).await;
    assert_eq!(
        added["response"]["machines"][0],
        json!({"machine": "1"}),
        "{added}"
    );
    assert_eq!(
        added["response"]["machines"][1]["error"]["code"],
        "not supported"
    );
    // The same record as Client.AddMachines makes (lockstep add-machine's call).
    let client = call(
        &mut socket,
        3,
        "Client",
        1,
        "AddMachines",
        json!({"params": [{"jobs": ["JobHostUnits"]}]}),
    )
    .await;
    assert_eq!(client["response"]["machines"][0], json!({"machine": "2"}));
    let stored: Vec<Machine> = read(fixture.store.as_ref(), |tx| {
        Ok(vec![tx.machine("1")?.unwrap(), tx.machine("2")?.unwrap()])
    })
    .unwrap();
    assert_eq!(
        (stored[0].roles, &stored[0].legacy_jobs),
        (stored[1].roles, &stored[1].legacy_jobs)
    );

    call(&mut socket, 4, "Application", 20, "Deploy", json!({"applications": [
        {"application": "web", "charm-url": "ch:web", "num-units": 1, "placement": [{"scope": "#", "directive": "2"}]}]})).await;
    let destroy = |tags: Value, force: bool| json!({"machine-tags": tags, "force": force, "keep": null, "dry-run": null, "max-wait": null});
    let refused = call(
        &mut socket,
        5,
        "MachineManager",
        10,
        "DestroyMachineWithParams",
        destroy(json!(["machine-0", "machine-2", "machine-9"]), false),
    )
    .await;
    let results = &refused["response"]["results"];
    assert_eq!(
        results[0]["error"]["message"],
        "machine 0 is a controller and cannot be destroyed"
    );
    assert_eq!(
        results[1]["error"]["message"],
        "machine 2 has unit \"web/0\" assigned"
    );
    assert_eq!(
        results[2]["error"],
        json!({"message": "machine 9 not found", "code": "not found"})
    );
    let forced = call(
        &mut socket,
        6,
        "MachineManager",
        10,
        "DestroyMachineWithParams",
        destroy(json!(["machine-1", "machine-2"]), true),
    )
    .await;
    assert_eq!(
        forced["response"]["results"][1]["info"]["destroyed-units"],
        json!([{"tag": "unit-web-0"}])
    );
    assert_eq!(forced["response"]["results"][0]["info"]["machine-id"], "1");
    // As in Juju, a destroyed machine is `dying` when the call answers (its units are gone
    // already), and removed a moment later, so a client that waits for its `remove` delta
    // after the answer (python-libjuju's `Machine.destroy`) sees it.
    let lives = |fixture: &Fixture| {
        read(fixture.store.as_ref(), |tx| {
            Ok(tx
                .machines()?
                .into_iter()
                .map(|machine| (machine.id, machine.life))
                .collect::<Vec<_>>())
        })
        .unwrap()
    };
    assert_eq!(
        lives(&fixture),
        [
            ("0".to_owned(), Life::Alive),
            ("1".to_owned(), Life::Dying),
            ("2".to_owned(), Life::Dying)
        ]
    );
    let unit = read(fixture.store.as_ref(), |tx| tx.unit("web/0")).unwrap();
    assert_eq!(unit, None);
    let deadline = std::time::Instant::now() + MACHINE_REMOVAL_DELAY * 10;
    while lives(&fixture).len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "dying machines never removed: {:?}",
            lives(&fixture)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(lives(&fixture), [("0".to_owned(), Life::Alive)]);
}

#[tokio::test]
async fn model_config_stores_keys_keeps_lockstep_s_own_and_watchers_see_it() {
    let (fixture, _directory) = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture, "/api").await;
    let watch = call(&mut socket, 2, "Client", 8, "WatchAll", json!({})).await;
    let watcher = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    next(&mut socket, 3, &watcher).await;

    let set = call(
        &mut socket,
        4,
        "ModelConfig",
        3,
        "ModelSet",
        json!({"config": {"logging-config": "<root>=DEBUG", "default-series": "jammy"}}),
    )
    .await;
    assert_eq!(set["response"], json!({}), "{set}");
    let deltas = next(&mut socket, 5, &watcher).await;
    assert_eq!(deltas.len(), 1, "one write, one model delta: {deltas:?}");
    assert_eq!(deltas[0][0], "model");
    assert_eq!(deltas[0][2]["config"]["logging-config"], "<root>=DEBUG");

    let config = call(&mut socket, 6, "ModelConfig", 3, "ModelGet", json!({})).await;
    assert_eq!(
        config["response"]["config"]["default-series"],
        json!({"value": "jammy", "source": "model"})
    );
    for (key, value) in [
        ("agent-stream", "devel"),
        ("agent-metadata-url", "https://elsewhere"),
        ("uuid", "x"),
    ] {
        let refused = call(
            &mut socket,
            7,
            "ModelConfig",
            3,
            "ModelSet",
            json!({"config": {key: value}}),
        )
        .await;
        assert_eq!(refused["error-code"], "not supported", "{key}: {refused}");
    }
    let unset_own = call(
        &mut socket,
        8,
        "ModelConfig",
        3,
        "ModelUnset",
        json!({"keys": ["agent-version"]}),
    )
    .await;
    assert_eq!(unset_own["error-code"], "not supported", "{unset_own}");
    let unset = call(
        &mut socket,
        9,
        "ModelConfig",
        3,
        "ModelUnset",
        json!({"keys": ["logging-config", "never-set"]}),
    )
    .await;
    assert_eq!(unset["response"], json!({}), "{unset}");
    let deltas = next(&mut socket, 10, &watcher).await;
    assert!(
        deltas[0][2]["config"].get("logging-config").is_none(),
        "{deltas:?}"
    );
    assert_eq!(deltas[0][2]["config"]["default-series"], "jammy");
    let stored = read(fixture.store.as_ref(), |tx| {
        tx.document(EntityKind::Settings, "model")
    })
    .unwrap();
    assert_eq!(stored, Some(json!({"default-series": "jammy"})));
    // python-jujuclient's Client v1 spelling reads the same.
    let client = call(&mut socket, 11, "Client", 1, "ModelGet", json!({})).await;
    assert_eq!(
        client["response"],
        config["response"].clone().tap_unset("logging-config")
    );
}

trait TapUnset {
    fn tap_unset(self, key: &str) -> Value;
}

impl TapUnset for Value {
    /// The `ModelGet` reply without `key`.
    fn tap_unset(mut self, key: &str) -> Value {
        self["config"].as_object_mut().unwrap().remove(key);
        self
    }
}

#[tokio::test]
async fn application_config_relations_and_removals_follow_juju() {
    let (fixture, _directory) = start(Phase::Ready).await;
    let (web, db) = record_charms(&fixture);
    let mut socket = logged_in(&fixture, "/api").await;
    let unknown = call(
        &mut socket,
        2,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "ghost", "charm-url": "local:jammy/ghost-0", "num-units": 1}]}),
    )
    .await;
    assert_eq!(
        unknown["response"]["results"][0]["error"]["message"],
        "charm \"local:jammy/ghost-0\" not found: upload it first"
    );
    call(
        &mut socket,
        3,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "web", "charm-url": web, "num-units": 2},
        {"application": "db", "charm-url": db, "num-units": 1}]}),
    )
    .await;

    let get = call(
        &mut socket,
        4,
        "Application",
        20,
        "Get",
        json!({"application": "web", "branch": null}),
    )
    .await;
    assert_eq!(get["response"]["charm"], "web");
    assert_eq!(
        get["response"]["config"]["port"],
        json!({"type": "int", "description": "port", "default": 80, "value": 80, "source": "default"})
    );
    let set = call(
        &mut socket,
        5,
        "Application",
        20,
        "SetConfigs",
        json!({"Args": [
        {"application": "web", "config": {"port": "8080"}},
        {"application": "web", "config": {"port": "many"}},
        {"application": "web", "config": {"colour": "red"}},
        {"application": "nope", "config": {}}]}),
    )
    .await;
    let results = &set["response"]["results"];
    assert_eq!(results[0], json!({}));
    assert_eq!(
        results[1]["error"]["message"],
        "option \"port\" expected int, got \"many\""
    );
    assert_eq!(results[2]["error"]["message"], "unknown option \"colour\"");
    assert_eq!(results[3]["error"]["code"], "not found");
    let get = call(
        &mut socket,
        6,
        "Application",
        1,
        "Get",
        json!({"application": "web"}),
    )
    .await;
    assert_eq!(get["response"]["config"]["port"]["value"], 8080);
    assert_eq!(get["response"]["config"]["port"]["source"], "user");
    // python-jujuclient's v1 Set: the same write, its error the call's.
    let v1 = call(
        &mut socket,
        7,
        "Application",
        1,
        "Set",
        json!({"application": "web", "options": {"port": "x"}}),
    )
    .await;
    assert_eq!(
        v1["error"], "option \"port\" expected int, got \"x\"",
        "{v1}"
    );
    let reset = call(
        &mut socket,
        8,
        "Application",
        20,
        "UnsetApplicationsConfig",
        json!({"Args": [{"application": "web", "options": ["port"]}]}),
    )
    .await;
    assert_eq!(reset["response"], json!({"results": [{}]}));

    // Ambiguity and absence, in Juju's words; then the one pair.
    let none = call(
        &mut socket,
        9,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["web", "web"]}),
    )
    .await;
    assert_eq!(
        none["error"], "no relations found between \"web\" and \"web\"",
        "{none}"
    );
    let related = call(
        &mut socket,
        10,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["web:db", "db"]}),
    )
    .await;
    assert_eq!(
        related["response"]["endpoints"]["web"]["role"], "requirer",
        "{related}"
    );
    let again = call(
        &mut socket,
        11,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["db", "web"]}),
    )
    .await;
    assert_eq!(again["error-code"], "already exists", "{again}");

    let destroyed = call(&mut socket, 12, "Application", 20, "DestroyUnit", json!({"units": [
        {"unit-tag": "unit-web-1", "destroy-storage": false, "force": false, "max-wait": null, "dry-run": false},
        {"unit-tag": "unit-web-7"}]})).await;
    assert_eq!(
        destroyed["response"]["results"][0],
        json!({"info": {"destroyed-storage": [], "detached-storage": []}})
    );
    assert_eq!(
        destroyed["response"]["results"][1]["error"]["code"],
        "not found"
    );
    let gone = call(&mut socket, 13, "Application", 20, "DestroyApplication", json!({"applications": [
        {"application-tag": "application-web", "destroy-storage": false, "dry-run": null, "force": false, "max-wait": null}]})).await;
    assert_eq!(
        gone["response"]["results"][0]["info"]["destroyed-units"],
        json!([{"tag": "unit-web-0"}])
    );
    let left = read(fixture.store.as_ref(), |tx| {
        Ok((
            tx.documents(EntityKind::Application)?.len(),
            tx.documents(EntityKind::Unit)?.len(),
            tx.documents(EntityKind::Relation)?.len(),
            tx.machines()?.len(),
        ))
    })
    .unwrap();
    assert_eq!(
        left,
        (1, 1, 0, 3),
        "db and its unit stay; relations go; machines stay"
    );
    // A relation made later gets a new id: ids are never handed out twice.
    call(
        &mut socket,
        14,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "web", "charm-url": web, "num-units": 1}]}),
    )
    .await;
    call(
        &mut socket,
        15,
        "Application",
        20,
        "AddRelation",
        json!({"endpoints": ["web", "db"]}),
    )
    .await;
    let ids: Vec<Value> = read(fixture.store.as_ref(), |tx| {
        Ok(tx
            .documents(EntityKind::Relation)?
            .into_iter()
            .map(|(_, r)| r["id"].clone())
            .collect())
    })
    .unwrap();
    assert_eq!(ids, [json!(1)]);
}

#[tokio::test]
async fn a_destroy_with_an_operation_id_is_applied_once() {
    let (fixture, _directory) = start(Phase::Ready).await;
    let mut socket = logged_in(&fixture, "/api").await;
    call(
        &mut socket,
        2,
        "Application",
        20,
        "Deploy",
        json!({"applications": [
        {"application": "web", "charm-url": "ch:web", "num-units": 2}]}),
    )
    .await;
    let params = json!({"units": [{"unit-tag": "unit-web-0"}], "operation-id": "destroy-web-0"});
    let first = call(
        &mut socket,
        3,
        "Application",
        20,
        "DestroyUnit",
        params.clone(),
    )
    .await;
    let revision = fixture.store.revision().unwrap();
    let again = call(&mut socket, 4, "Application", 20, "DestroyUnit", params).await;
    assert_eq!(first["response"], again["response"]);
    assert!(
        first["response"]["results"][0].get("info").is_some(),
        "{first}"
    );
    assert_eq!(
        fixture.store.revision().unwrap(),
        revision,
        "the repeat wrote nothing"
    );
}

#[test]
fn an_upload_of_the_same_archive_is_the_same_charm_and_another_gets_the_next_revision() {
    let store = lockstep_store::MemoryStore::new(lockstep_store::Durability::Full);
    store.create_model(&model()).unwrap();
    let web = charm("web", Vec::new(), json!({}));
    let url = applications::add_charm(&store, &web, Some("jammy")).unwrap();
    assert_eq!(url, "local:jammy/web-0");
    let revision = store.revision().unwrap();
    assert_eq!(
        applications::add_charm(&store, &web, Some("jammy")).unwrap(),
        url
    );
    assert_eq!(store.revision().unwrap(), revision, "nothing written");
    let changed = Charm {
        sha256: "f".repeat(64),
        ..web
    };
    assert_eq!(
        applications::add_charm(&store, &changed, None).unwrap(),
        "local:jammy/web-1"
    );
    let bare = Charm {
        series: Vec::new(),
        name: "bare".into(),
        ..changed
    };
    assert_eq!(
        applications::add_charm(&store, &bare, None).unwrap(),
        "local:bare-0"
    );
}
