//! Real Juju clients against lockstep's API, unchanged: python-jujuclient 0.54.0 and
//! python-libjuju (PyPI `juju`) 3.6.1.3, installed into a throwaway virtualenv under the
//! target directory with their dependencies pinned by `tests/interop/constraints.txt`.
//!
//! - jujuclient logs in and reads status and model config while the agent is limited
//!   (reads are served in every phase); a write (`ModelSet`) is refused with `upgrade in
//!   progress` and jujuclient retries it (about once a second) until the test turns the
//!   agent Ready, then it succeeds.
//! - libjuju connects, reads status into its typed objects and the model config, and sees
//!   error code `upgrade in progress` on a write (it does not retry).
//! - libjuju's everyday work (`interop/libjuju_everyday.py`): `Model.connect` with an
//!   observer, status, machines, model config, local charm deploys, relations, application
//!   config, removals, a refused charm-store deploy, `Controller.connect` and `list_models`.
//! - jujuclient's deployer work (`interop/jujuclient_everyday.py`): local charm uploads,
//!   deploy, add units, relate, status, application config.
//!
//! `LOCKSTEP_INTEROP_PYTHON` may name a Python that has both clients at these versions
//! installed already; otherwise the virtualenv is built.

mod api_support;
#[path = "common/python.rs"]
mod python;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api_support::*;
use lockstep_core::Phase;
use python::python;
use serde_json::{Value, json};

/// Where a client finds the fixture's CA (written when a client starts).
fn ca_path(fixture: &Fixture) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-ca-{}.pem", fixture.port))
}

/// A client process, killed by its id if the test ends before it does.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Client {
    fn start(script: &str, fixture: &Fixture) -> Client {
        Client::start_with(script, fixture, &[])
    }

    /// Starts `script` with `environment` added to the test's.
    fn start_with(script: &str, fixture: &Fixture, environment: &[(&str, &Path)]) -> Client {
        let ca = ca_path(fixture);
        std::fs::write(&ca, &fixture.ca_pem).expect("write the CA");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/interop")
            .join(script);
        let child = Command::new(python())
            .envs(environment.iter().copied())
            .arg(script)
            .arg(fixture.port.to_string())
            .arg(&ca)
            .arg(MODEL_UUID)
            .arg(PASSWORD)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the client");
        Client(child)
    }

    fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits for the client to exit (at most `bound`) and returns its JSON line.
    async fn finish(mut self, bound: Duration) -> Value {
        let deadline = Instant::now() + bound;
        while self.running() {
            assert!(
                Instant::now() < deadline,
                "the client did not finish within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = self.0.wait().expect("reaped");
        let (mut stdout, mut stderr) = (String::new(), String::new());
        self.0
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut stdout)
            .unwrap();
        self.0
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(
            status.success(),
            "client failed ({status}):\n{stdout}\n{stderr}"
        );
        serde_json::from_str(stdout.trim())
            .unwrap_or_else(|error| panic!("{error}: {stdout:?}\n{stderr}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jujuclient_retries_upgrade_in_progress_until_the_agent_is_ready() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::RunningSteps).await;
    let mut client = Client::start("jujuclient_check.py", &fixture);
    // Wait until jujuclient has been turned away three times, then open the API.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fixture.api.gate_rejections() < 3 {
        assert!(
            client.running(),
            "jujuclient exited while the agent was limited"
        );
        assert!(Instant::now() < deadline, "jujuclient never retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let seen = client.finish(Duration::from_secs(60)).await;
    assert_eq!(seen["redirect"], Value::Null, "{seen}");
    assert_eq!(seen["status_model"], "controller");
    assert_eq!(
        seen["limited_agent_version"], "2.9.43",
        "read while limited"
    );
    assert_eq!(seen["agent_version"], "2.9.43");
    assert_eq!(
        seen["logging_config"], "<root>=DEBUG",
        "the write landed once Ready"
    );
    let sends = seen["model_set_sends"].as_u64().unwrap();
    assert!(
        sends >= 4,
        "three refusals and a success, got {sends} sends"
    );
    assert_eq!(
        sends,
        fixture.api.gate_rejections() + 1,
        "every refusal was retried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn libjuju_reads_status_and_config_while_limited_and_a_write_gets_the_upgrade_error_code() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::CheckingAgentVersion).await;
    let client = Client::start("libjuju_check.py", &fixture);
    let seen = client.finish(Duration::from_secs(60)).await;
    assert_eq!(seen["status_model"], "controller", "{seen}");
    assert_eq!(seen["agent_version"], "2.9.43", "{seen}");
    assert_eq!(seen["error_code"], "upgrade in progress");
    assert_eq!(fixture.api.gate_rejections(), 1);
}

/// The controller machine as bootstrap records it: its agent runs a known binary.
fn add_controller_machine(fixture: &Fixture) {
    let mut machine = lockstep_store::Machine::with_roles(
        "0",
        lockstep_core::Roles::of(&[lockstep_core::Role::Controller]),
    );
    machine.agent_binary = Some(lockstep_core::Binary::parse("2.9.43-ubuntu-amd64").unwrap());
    fixture.store.add_machine(&machine).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn libjuju_connects_watches_adds_machines_configures_deploys_and_lists_models() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::Ready).await;
    add_controller_machine(&fixture);
    let client = Client::start("libjuju_everyday.py", &fixture);
    let seen = client.finish(Duration::from_secs(120)).await;

    assert_eq!(
        (&seen["model_name"], &seen["model_uuid"]),
        (&json!("controller"), &json!(MODEL_UUID)),
        "{seen}"
    );
    assert_eq!(seen["status_model"], "controller");
    assert_eq!(seen["status_machines"], json!(["0"]));
    // add_machine returned once the machine's delta arrived; destroy once its removal did.
    assert_eq!(seen["added_machine"], "1");
    assert_eq!(seen["machine_agent_status"], "pending");
    assert_eq!(seen["machines_after_destroy"], json!(["0"]));
    assert_eq!(seen["config_before"], "2.9.43");
    assert_eq!(
        (&seen["logging_config"], &seen["logging_config_source"]),
        (&json!("<root>=DEBUG"), &json!("model"))
    );
    // Two local charm directories uploaded and deployed, one unit each.
    assert_eq!(seen["deployed"], json!(["db", "web"]));
    assert_eq!(seen["web_charm_url"], "local:jammy/web-0");
    assert_eq!(seen["web_units"], json!(["web/0"]));
    // integrate("web", "db") found the one pgsql pair from the charms' metadata.
    assert_eq!(seen["relation_key"], "db:db web:db");
    assert_eq!(seen["relation_id"], 0);
    assert_eq!(
        seen["relation_endpoints"],
        json!(["db:db:provider:pgsql", "web:db:requirer:pgsql"])
    );
    assert_eq!(seen["port_default"], 80);
    assert_eq!(seen["port_set"], 8080);
    assert_eq!(seen["added_units"], json!(["web/1"]));
    // What lockstep knows of a unit, in Juju's words.
    assert_eq!(
        seen["unit_workload"],
        json!(["unknown", "lockstep runs no charms"])
    );
    assert_eq!(
        seen["unit_agent"],
        json!(["allocating", "lockstep runs no unit agents"])
    );
    assert_eq!(seen["web_exposed"], true);
    assert_eq!(seen["status_applications"], json!(["web"]));
    let refused = seen["store_deploy"].as_str().unwrap();
    assert!(
        refused.contains("this controller has no charm store"),
        "{refused}"
    );
    // The observer saw every entity arrive, and the removals.
    let deltas: Vec<(String, String, String)> =
        serde_json::from_value(seen["deltas"].clone()).unwrap();
    for expected in [
        ("model", "add", MODEL_UUID),
        ("machine", "add", "0"),
        ("machine", "add", "1"),
        ("machine", "change", "1"),
        ("machine", "remove", "1"),
        ("application", "add", "web"),
        ("unit", "add", "web/0"),
        ("relation", "add", "0"),
        ("unit", "remove", "web/1"),
        ("application", "remove", "db"),
    ] {
        assert!(
            deltas
                .iter()
                .any(|(kind, verb, id)| (kind.as_str(), verb.as_str(), id.as_str()) == expected),
            "{expected:?} not in {deltas:?}"
        );
    }
    assert_eq!(seen["models"], json!(["controller"]));
    assert_eq!(
        seen["controller_endpoints"],
        json!([format!("127.0.0.1:{}", fixture.port)])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jujuclient_uploads_deploys_adds_units_relates_and_reads_status() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::Ready).await;
    add_controller_machine(&fixture);
    let ca = ca_path(&fixture);
    let client = Client::start_with(
        "jujuclient_everyday.py",
        &fixture,
        &[("SSL_CERT_FILE", ca.as_path())],
    );
    let seen = client.finish(Duration::from_secs(120)).await;
    assert_eq!(seen["redirect"], Value::Null, "{seen}");
    assert_eq!(seen["upload_web"], "local:jammy/web-0");
    assert_eq!(seen["upload_db"], "local:jammy/db-0");
    assert_eq!(seen["added_units"], json!(["web/1", "web/2"]));
    assert_eq!(seen["relation"]["web"]["role"], "requirer");
    assert_eq!(seen["relation"]["db"]["interface"], "pgsql");
    assert_eq!(seen["status_model"], "controller");
    assert_eq!(seen["status_applications"], json!(["db", "web"]));
    assert_eq!(seen["web_units"], json!(["web/0", "web/1", "web/2"]));
    assert_eq!(seen["status_relations"], json!(["db:db web:db"]));
    // Deployed with {"port": "81"}, typed by the charm's option.
    assert_eq!(seen["port"], 81);
    assert_eq!(seen["port_set"], 8080);
}
