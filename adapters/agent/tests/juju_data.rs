//! Juju's client store, as `juju bootstrap` leaves it: real `lockstep bootstrap` runs with
//! `JUJU_DATA` pointed at a temporary directory (never the real home) that already holds
//! another controller, and the test reads `controllers.yaml`, `models.yaml` and
//! `accounts.yaml` back; `lockstep -c NAME` reaches the controller through them; and
//! `kill-controller` takes this controller's entries out and leaves the other's.
//! python-libjuju 3.6.1.3 then connects with no arguments (`Controller().connect()`,
//! `Model().connect()`), as its users do.

use crate::common;
use crate::common::python;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Controller, lockstep, text};
use serde_json::{Value, json};

const OTHER_CONTROLLERS: &str = "\
controllers:
  other:
    uuid: 00000000-0000-4000-8000-000000000001
    api-endpoints: [10.0.0.1:17070]
    ca-cert: |
      -----BEGIN CERTIFICATE-----
      MIIB
      -----END CERTIFICATE-----
    cloud: aws
    region: us-east-1
    agent-version: 3.6.1
current-controller: other
";
const OTHER_MODELS: &str = "\
controllers:
  other:
    models:
      admin/controller:
        uuid: 00000000-0000-4000-8000-000000000002
        type: iaas
      admin/default:
        uuid: 00000000-0000-4000-8000-000000000003
        type: iaas
    current-model: admin/default
";
const OTHER_ACCOUNTS: &str = "\
controllers:
  other:
    user: admin
    password: other-password
    last-known-access: superuser
";

fn read_yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn write_other_controller(juju_data: &Path) {
    std::fs::create_dir_all(juju_data).unwrap();
    std::fs::write(juju_data.join("controllers.yaml"), OTHER_CONTROLLERS).unwrap();
    std::fs::write(juju_data.join("models.yaml"), OTHER_MODELS).unwrap();
    std::fs::write(juju_data.join("accounts.yaml"), OTHER_ACCOUNTS).unwrap();
}

fn assert_other_controller_kept(juju_data: &Path) {
    let controllers = read_yaml(&juju_data.join("controllers.yaml"));
    let expected: Value = serde_saphyr::from_str(OTHER_CONTROLLERS).unwrap();
    assert_eq!(
        controllers["controllers"]["other"],
        expected["controllers"]["other"]
    );
    let models = read_yaml(&juju_data.join("models.yaml"));
    let expected: Value = serde_saphyr::from_str(OTHER_MODELS).unwrap();
    assert_eq!(
        models["controllers"]["other"],
        expected["controllers"]["other"]
    );
    let accounts = read_yaml(&juju_data.join("accounts.yaml"));
    let expected: Value = serde_saphyr::from_str(OTHER_ACCOUNTS).unwrap();
    assert_eq!(
        accounts["controllers"]["other"],
        expected["controllers"]["other"]
    );
}

#[test]
fn bootstrap_adds_a_current_controller_beside_others_c_reaches_it_kill_controller_removes_it() {
    let scratch = tempfile::tempdir().unwrap();
    let juju_data = scratch.path().join("juju");
    write_other_controller(&juju_data);
    let env = [("JUJU_DATA", juju_data.to_str().unwrap())];
    let controller = Controller::bootstrap(&["--name", "mine"], &env);
    controller.assert_bootstrapped();
    let file = controller.controller_file();

    let controllers = read_yaml(&juju_data.join("controllers.yaml"));
    assert_eq!(controllers["current-controller"], "mine", "{controllers:#}");
    assert_eq!(
        controllers["controllers"]["mine"],
        json!({
            "uuid": file.uuid,
            "api-endpoints": file.api_endpoints,
            "ca-cert": file.ca_cert,
            "cloud": "localhost",
            "region": "localhost",
            "agent-version": common::own().to_string(),
        })
    );
    let models = read_yaml(&juju_data.join("models.yaml"));
    assert_eq!(
        models["controllers"]["mine"],
        json!({
            "models": {"admin/controller": {"uuid": file.model_uuid, "type": "iaas"}},
            "current-model": "admin/controller",
        })
    );
    let accounts = read_yaml(&juju_data.join("accounts.yaml"));
    assert_eq!(
        accounts["controllers"]["mine"],
        json!({"user": "admin", "password": file.password, "last-known-access": "superuser"})
    );
    assert_other_controller_kept(&juju_data);
    for name in [
        "controllers.yaml",
        "models.yaml",
        "accounts.yaml",
        "cookies/mine.json",
    ] {
        assert_eq!(mode(&juju_data.join(name)), 0o600, "{name}");
    }
    assert_eq!(
        std::fs::read_to_string(juju_data.join("cookies/mine.json")).unwrap(),
        "[]"
    );

    // -c resolves through the store alone: the data dir given is one that does not exist.
    let nowhere = scratch.path().join("nowhere");
    let status = lockstep(
        &nowhere,
        &["-c", "mine", "status", "--format", "json"],
        &env,
    );
    assert!(status.status.success(), "{}", text(&status));
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["model"]["name"], "controller", "{status:#}");
    assert_eq!(
        status["machines"]["0"]["jobs"][0], "JobManageModel",
        "{status:#}"
    );
    // The tabular header names the controller as the store does.
    let tabular = lockstep(&nowhere, &["-c", "mine", "status"], &env);
    assert!(tabular.status.success(), "{}", text(&tabular));
    let header = String::from_utf8_lossy(&tabular.stdout);
    let row = header.lines().nth(1).unwrap_or("");
    assert_eq!(
        row.split_whitespace().take(2).collect::<Vec<_>>(),
        ["controller", "mine"],
        "{}",
        text(&tabular)
    );

    let unknown = lockstep(&nowhere, &["-c", "absent", "status"], &env);
    assert!(!unknown.status.success(), "{}", text(&unknown));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    let controllers_path = juju_data.join("controllers.yaml");
    assert!(
        stderr.contains("\"absent\"") && stderr.contains(&*controllers_path.to_string_lossy()),
        "{}",
        text(&unknown)
    );

    let kill = lockstep(&controller.data_dir, &["kill-controller"], &env);
    assert!(kill.status.success(), "{}", text(&kill));
    let controllers = read_yaml(&juju_data.join("controllers.yaml"));
    assert!(
        controllers["controllers"].get("mine").is_none(),
        "{controllers:#}"
    );
    // It was current; Juju leaves no current controller then.
    assert!(
        controllers.get("current-controller").is_none(),
        "{controllers:#}"
    );
    let models = read_yaml(&juju_data.join("models.yaml"));
    assert!(models["controllers"].get("mine").is_none(), "{models:#}");
    let accounts = read_yaml(&juju_data.join("accounts.yaml"));
    assert!(
        accounts["controllers"].get("mine").is_none(),
        "{accounts:#}"
    );
    assert!(!juju_data.join("cookies/mine.json").exists());
    assert_other_controller_kept(&juju_data);
}

#[test]
fn a_malformed_client_file_stops_bootstrap_before_it_starts_and_is_left_as_it_was() {
    let scratch = tempfile::tempdir().unwrap();
    let juju_data = scratch.path().join("juju");
    write_other_controller(&juju_data);
    let malformed = "controllers: [not, a, mapping\n";
    std::fs::write(juju_data.join("models.yaml"), malformed).unwrap();
    let env = [("JUJU_DATA", juju_data.to_str().unwrap())];
    let controller = Controller::bootstrap(&["--name", "mine"], &env);
    assert!(
        !controller.bootstrap.status.success(),
        "{}",
        text(&controller.bootstrap)
    );
    let stderr = String::from_utf8_lossy(&controller.bootstrap.stderr);
    assert!(
        stderr.contains(&*juju_data.join("models.yaml").to_string_lossy()),
        "{}",
        text(&controller.bootstrap)
    );
    assert_eq!(
        std::fs::read_to_string(juju_data.join("models.yaml")).unwrap(),
        malformed
    );
    assert_eq!(
        std::fs::read_to_string(juju_data.join("controllers.yaml")).unwrap(),
        OTHER_CONTROLLERS
    );
    assert!(
        controller.launcher_pid().is_none(),
        "no lockstepd was started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libjuju_connects_a_controller_and_a_model_with_no_arguments() {
    let python = tokio::task::spawn_blocking(python::python).await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let juju_data = scratch.path().join("juju");
    write_other_controller(&juju_data);
    let env = [("JUJU_DATA", juju_data.to_str().unwrap())];
    let controller = Controller::bootstrap(&["--name", "mine"], &env);
    controller.assert_bootstrapped();
    let file = controller.controller_file();

    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/libjuju_no_arguments.py");
    let output = tokio::task::spawn_blocking({
        let juju_data = juju_data.clone();
        let home = scratch.path().to_path_buf();
        move || {
            Command::new(python)
                .arg(script)
                .env("JUJU_DATA", juju_data)
                // libjuju falls back to files under $HOME; none of the real ones.
                .env("HOME", home)
                .env_remove("XDG_DATA_HOME")
                .output()
                .expect("python runs")
        }
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));
    assert_eq!(
        result,
        json!({
            "controller": "mine",
            "controller-uuid": file.uuid,
            "models": ["controller"],
            "model": "controller",
            "model-uuid": file.model_uuid,
            "status-model": "controller",
            "machines": ["0"],
        })
    );
}

#[test]
fn c_is_refused_by_commands_that_work_on_a_data_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let juju_data = scratch.path().join("juju");
    write_other_controller(&juju_data);
    let env = [("JUJU_DATA", juju_data.to_str().unwrap())];
    let data_dir = scratch.path().join("controller");
    for args in [
        &["-c", "other", "kill-controller"][..],
        &["-c", "other", "bootstrap", "--api-port", "0"][..],
    ] {
        let output = lockstep(&data_dir, args, &env);
        assert!(!output.status.success(), "{args:?}: {}", text(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("-c \"other\""),
            "{args:?}: {}",
            text(&output)
        );
        assert!(!data_dir.exists(), "{args:?} wrote {}", data_dir.display());
    }
    assert_eq!(
        std::fs::read_to_string(juju_data.join("controllers.yaml")).unwrap(),
        OTHER_CONTROLLERS
    );
}

/// `interop/libjuju_everyday.py` against a real lockstepd: libjuju's everyday work after
/// connecting with no arguments, what its typed objects read of machines, relations,
/// application config and units (lockstep runs no charms and says so in Juju's words), and
/// an observer that sees every delta once, in the order the calls made them. `Machine.destroy` waits for the machine's `remove` delta
/// after the call answers: lockstepd answers with the machine `dying` and removes it a
/// moment later (`MACHINE_REMOVAL_DELAY`), as Juju's provisioner does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libjuju_everyday_work_against_lockstepd_found_through_the_client_store() {
    let python = tokio::task::spawn_blocking(python::python).await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let juju_data = scratch.path().join("juju");
    let env = [("JUJU_DATA", juju_data.to_str().unwrap())];
    let controller = Controller::bootstrap(&["--name", "everyday"], &env);
    controller.assert_bootstrapped();
    let file = controller.controller_file();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/libjuju_everyday.py");
    let output = tokio::task::spawn_blocking({
        let home = scratch.path().to_path_buf();
        move || {
            Command::new(python)
                .arg(script)
                .env("JUJU_DATA", juju_data)
                .env("HOME", home)
                .env_remove("XDG_DATA_HOME")
                .output()
                .expect("python runs")
        }
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));

    assert_eq!(
        (&seen["model_name"], &seen["model_uuid"]),
        (&json!("controller"), &json!(file.model_uuid)),
        "{seen}"
    );
    assert_eq!(seen["status_model"], "controller", "{seen}");
    assert_eq!(seen["status_machines"], json!(["0"]), "{seen}");
    // add_machine returned once the machine's delta arrived; destroy once its removal did.
    assert_eq!(seen["added_machine"], "1", "{seen}");
    assert_eq!(seen["machine_agent_status"], "pending", "{seen}");
    assert_eq!(seen["machines_after_destroy"], json!(["0"]), "{seen}");
    assert_eq!(seen["config_before"], common::own().to_string(), "{seen}");
    assert_eq!(
        (&seen["logging_config"], &seen["logging_config_source"]),
        (&json!("<root>=DEBUG"), &json!("model")),
        "{seen}"
    );
    // Two local charm directories uploaded and deployed, one unit each.
    assert_eq!(seen["deployed"], json!(["db", "web"]), "{seen}");
    assert_eq!(seen["web_charm_url"], "local:jammy/web-0", "{seen}");
    assert_eq!(seen["web_units"], json!(["web/0"]), "{seen}");
    // integrate("web", "db") found the one pgsql pair from the charms' metadata.
    assert_eq!(seen["relation_key"], "db:db web:db", "{seen}");
    assert_eq!(seen["relation_id"], 0, "{seen}");
    assert_eq!(
        seen["relation_endpoints"],
        json!(["db:db:provider:pgsql", "web:db:requirer:pgsql"]),
        "{seen}"
    );
    assert_eq!(seen["port_default"], 80, "{seen}");
    assert_eq!(seen["port_set"], 8080, "{seen}");
    assert_eq!(seen["added_units"], json!(["web/1"]), "{seen}");
    // What lockstep knows of a unit, in Juju's words.
    assert_eq!(
        seen["unit_workload"],
        json!(["unknown", "lockstep runs no charms"]),
        "{seen}"
    );
    assert_eq!(
        seen["unit_agent"],
        json!(["allocating", "lockstep runs no unit agents"]),
        "{seen}"
    );
    assert_eq!(seen["web_exposed"], true, "{seen}");
    assert_eq!(seen["status_applications"], json!(["web"]), "{seen}");
    let refused = seen["store_deploy"].as_str().unwrap_or("");
    assert!(
        refused.contains("this controller has no charm store"),
        "{seen}"
    );
    assert_eq!(seen["models"], json!(["controller"]), "{seen}");
    assert_eq!(
        seen["controller_endpoints"],
        json!(file.api_endpoints),
        "{seen}"
    );

    // Every delta once, in the order the script's calls committed them.
    let model = file.model_uuid.as_str();
    let expected = json!([
        ["model", "add", model],
        ["machine", "add", "0"],
        ["machine", "add", "1"],
        // Destroyed: dying when the call answers, removed a moment later.
        ["machine", "change", "1"],
        ["machine", "remove", "1"],
        ["model", "change", model],
        ["application", "add", "web"],
        ["machine", "add", "1"],
        ["unit", "add", "web/0"],
        ["application", "add", "db"],
        ["machine", "add", "2"],
        ["unit", "add", "db/0"],
        ["relation", "add", "0"],
        ["application", "change", "web"],
        ["application", "change", "web"],
        ["machine", "add", "3"],
        ["unit", "add", "web/1"],
        ["unit", "remove", "web/1"],
        ["relation", "remove", "0"],
        ["unit", "remove", "db/0"],
        ["application", "remove", "db"],
    ]);
    assert_eq!(seen["deltas"], expected, "{seen}");
}
