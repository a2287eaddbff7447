//! Real Juju clients, unchanged, against real `lockstepd` processes started with `lockstep
//! bootstrap`: python-jujuclient 0.54.0 and python-libjuju (PyPI `juju`) 3.6.1.3, from the
//! interop tests' one virtualenv (`common/python.rs`). libjuju's everyday work on a Ready
//! controller found through Juju's client store is `juju_data.rs`'s.
//!
//! - libjuju while `lockstep bootstrap --auto-upgrade` holds the controller `upgrading` (the
//!   mirror holds the new binary's download until the test releases it): connect, status,
//!   the watcher's first batch, model config, all served; `set_config` and `add_machine`
//!   refused with Juju's code `upgrade in progress` and nothing written.
//! - jujuclient's deployer work by explicit endpoint on a Ready controller
//!   (`interop/jujuclient_everyday.py`): local charm uploads, deploy, add units, relate,
//!   status, application config.
//! - jujuclient started while the controller is held `checking-agent-version`: it reads, and
//!   resends a refused `AddMachines` about once a second until Ready, when it is applied
//!   exactly once.
//! - behind the front door (`LOCKSTEPD_FRONT_DOOR=true`): libjuju's model watcher and a raw
//!   websocket's watcher through three self-upgrades in a row while machines are added, each
//!   on its one connection, every delta once
//!   (`interop/libjuju_watch_through_upgrades.py`); and jujuclient deployers started while
//!   `bootstrap --auto-upgrade` holds the controller `upgrading`, as it releases the new
//!   binary, and once Ready, each deploying once (`interop/jujuclient_deployer.py`).
//!
//! The controller says which phase it is in (`Upgrade.Status`, served in every phase) before
//! a client starts and after it has finished, while the mirror still holds it there; its
//! `/metrics` count the calls it refused.

use crate::common;
use crate::common::python;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::hostile::loads::{Received, Socket, receive, request, send};
use common::http_mirror::{HoldBack, HttpMirror};
use common::{Controller, Mirror, Published, next, own, text};
use serde_json::{Value, json};

/// How long a client or a bootstrap may take before the test gives up on it.
const BOUND: Duration = Duration::from_secs(120);

/// A process the test started, killed by its id if the test ends before it does; its
/// standard output and error go to files (a full pipe cannot stall it).
struct Process {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Process {
    fn spawn(command: &mut Command, dir: &Path, name: &str) -> Process {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("create the stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("create the stderr file"))
            .spawn()
            .unwrap_or_else(|error| panic!("{command:?}: {error}"));
        Process {
            child,
            stdout,
            stderr,
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to exit (at most [`BOUND`]) and returns what it wrote.
    async fn finish(mut self) -> Output {
        let started = Instant::now();
        while self.running() {
            assert!(
                started.elapsed() < BOUND,
                "{:?} did not finish within {BOUND:?}",
                self.stdout
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Output {
            status: self.child.wait().expect("reaped"),
            stdout: std::fs::read(&self.stdout).unwrap_or_default(),
            stderr: std::fs::read(&self.stderr).unwrap_or_default(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A client script of `tests/interop/`, given the controller's port, CA file, model uuid
/// and admin password, as `controller.yaml` holds them.
fn start_client(script: &str, controller: &Controller, env: &[(&str, &Path)]) -> Process {
    let file = controller.controller_file();
    let endpoint = &file.api_endpoints[0];
    let port = endpoint.rsplit(':').next().expect("host:port");
    let ca = ca_file(controller);
    let script_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    Process::spawn(
        Command::new(python::python())
            .arg(script_path)
            .arg(port)
            .arg(&ca)
            .arg(&file.model_uuid)
            .arg(&file.password)
            .envs(env.iter().copied()),
        controller.dir.path(),
        script,
    )
}

/// The controller's CA in a file of the test's scratch directory.
fn ca_file(controller: &Controller) -> PathBuf {
    let ca = controller.dir.path().join("ca.pem");
    std::fs::write(&ca, controller.controller_file().ca_cert).expect("write the CA");
    ca
}

/// The one JSON line a client script prints on success.
fn json_line(output: &Output) -> Value {
    assert!(output.status.success(), "{}", text(output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|error| panic!("{error}: {}", text(output)))
}

/// `GET /metrics` of the controller (HTTPS, verified with its CA): the body.
async fn metrics(controller: &Controller) -> String {
    let (status, body) = controller.https_get("/metrics", None).await;
    let body = String::from_utf8(body).expect("UTF-8");
    assert_eq!(status, 200, "{body}");
    body
}

/// The sample named exactly `series` (`name` or `name{label="value"}`) of a `/metrics`
/// text (0 if absent).
fn counter(metrics: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|count| count.trim().parse().expect("a count"))
        .unwrap_or(0)
}

/// `lockstep_gate_rejections_total{facade="<facade>"}` of a `/metrics` text (0 if absent).
fn rejections(metrics: &str, facade: &str) -> u64 {
    counter(
        metrics,
        &format!("lockstep_gate_rejections_total{{facade=\"{facade}\"}}"),
    )
}

/// Every `lockstep_gate_rejections_total` series of a `/metrics` text, by facade.
fn all_rejections(metrics: &str) -> Value {
    let mut by_facade = serde_json::Map::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("lockstep_gate_rejections_total{facade=\"")
            && let Some((facade, count)) = rest.split_once("\"} ")
        {
            by_facade.insert(
                facade.to_owned(),
                json!(count.trim().parse::<u64>().unwrap()),
            );
        }
    }
    Value::Object(by_facade)
}

/// `lockstep bootstrap --auto-upgrade` from a mirror served over HTTP that holds back the
/// requests `back` names, still running: the controller it started waits in a limited
/// phase until the test calls [`HeldBootstrap::release`].
struct HeldBootstrap {
    // Dropped in this order: bootstrap killed, lockstepd stopped, the mirror released.
    bootstrap: Option<Process>,
    controller: Controller,
    served: HttpMirror,
    _mirror: Mirror,
}

impl HeldBootstrap {
    /// Juju's client store the bootstrap writes.
    fn juju_data(&self) -> PathBuf {
        common::juju_data_beside(&self.controller.data_dir)
    }

    fn start(mirror: Mirror, back: HoldBack) -> HeldBootstrap {
        HeldBootstrap::start_with(mirror, back, &[])
    }

    /// [`HeldBootstrap::start`], with `env` for bootstrap and the lockstepd it starts.
    fn start_with(mirror: Mirror, back: HoldBack, env: &[(&str, &str)]) -> HeldBootstrap {
        let served = HttpMirror::serve_holding(mirror.path(), Duration::ZERO, back);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data_dir = dir.path().join("controller");
        let bootstrap = Process::spawn(
            Command::new(common::LOCKSTEP)
                .arg("--data-dir")
                .arg(&data_dir)
                .env("JUJU_DATA", common::juju_data_beside(&data_dir))
                .args(["bootstrap", "--api-port", "0", "--timeout", "180"])
                // The controller downloads N+1 itself, through the mirror that holds it.
                .args(["--auto-upgrade", "--no-fetch-ahead"])
                .args(["--metadata-source", &served.tools_url()])
                .args(["--metadata-key", &mirror.key()])
                .envs(env.iter().copied()),
            dir.path(),
            "bootstrap",
        );
        HeldBootstrap {
            bootstrap: Some(bootstrap),
            controller: Controller {
                dir,
                data_dir,
                bootstrap: Command::new("true").output().expect("true runs"),
                children: std::sync::Mutex::default(),
            },
            served,
            _mirror: mirror,
        }
    }

    /// Waits until the mirror holds a request back and the controller reports `phase`.
    async fn wait_held_in(&mut self, phase: &str) {
        let started = Instant::now();
        while self.served.held() == 0 {
            let bootstrap = self.bootstrap.as_mut().expect("not finished");
            assert!(
                bootstrap.running(),
                "bootstrap exited before the mirror held anything back:\n{}",
                self.controller.log()
            );
            assert!(
                started.elapsed() < BOUND,
                "the mirror held nothing back within {BOUND:?}:\n{}",
                self.controller.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.controller.wait_phase(phase, BOUND).await;
    }

    /// The controller's phase, from `Upgrade.Status`.
    async fn phase(&self) -> Value {
        self.controller.status().await["phase"].clone()
    }

    /// Answers what the mirror held back, and waits for bootstrap to report the controller
    /// available.
    async fn release(&mut self) {
        self.served.release();
        let bootstrap = self.bootstrap.take().expect("not finished");
        self.controller.bootstrap = bootstrap.finish().await;
        self.controller.assert_bootstrapped();
    }
}

/// libjuju connects, reads status and config and gets the watcher's first batch while the
/// controller is `upgrading` during `bootstrap --auto-upgrade`; its two writes are refused
/// with Juju's code and leave nothing behind. libjuju connects with no arguments, through
/// Juju's client store, which bootstrap wrote when it started the controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libjuju_connects_reads_and_watches_while_bootstrap_auto_upgrades_and_its_writes_get_upgrade_in_progress()
 {
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mut held = HeldBootstrap::start(
        Mirror::n_and_next(Published::Lockstepd),
        HoldBack::Binary(lockstep_agent::datadir::host_binary(next()).to_string()),
    );
    held.wait_held_in("upgrading").await;
    let file = held.controller.controller_file();

    let seen = json_line(
        &start_client(
            "libjuju_limited.py",
            &held.controller,
            &[("JUJU_DATA", &held.juju_data())],
        )
        .finish()
        .await,
    );
    // The controller was upgrading all along: the mirror still holds its new binary back.
    assert_eq!(held.phase().await, "upgrading", "{seen}");
    let refused = all_rejections(&metrics(&held.controller).await);

    assert_eq!(
        (&seen["model_name"], &seen["model_uuid"]),
        (&json!("controller"), &json!(file.model_uuid)),
        "{seen}"
    );
    assert_eq!(seen["status_model"], "controller", "{seen}");
    assert_eq!(seen["status_machines"], json!(["0"]), "{seen}");
    // The model already names the version being downloaded.
    assert_eq!(seen["agent_version"], next().to_string(), "{seen}");
    assert_eq!(
        seen["first_deltas"],
        json!([["model", "add", file.model_uuid], ["machine", "add", "0"]]),
        "{seen}"
    );
    for write in ["set_config", "add_machine"] {
        assert_eq!(
            seen[write],
            json!({"code": "upgrade in progress", "message": "upgrade in progress", "phase": "upgrading"}),
            "{write}: {seen}"
        );
    }
    assert_eq!(seen["machines"], json!(["0"]), "{seen}");
    // Each write was refused once by the gate, and nothing else was.
    assert_eq!(
        refused,
        json!({"MachineManager": 1, "ModelConfig": 1}),
        "{seen}"
    );

    held.release().await;
    let status = held.controller.status().await;
    assert_eq!(
        (&status["phase"], &status["agent-version"]),
        (&json!("ready"), &json!(next().to_string())),
        "{status:#}"
    );
    // The refused writes left nothing behind.
    let full = held.controller.full_status().await;
    let machines: Vec<&String> = full["machines"].as_object().unwrap().keys().collect();
    assert_eq!(machines, ["0"], "{full:#}");
    let config = held
        .controller
        .client()
        .call("ModelConfig", 3, "ModelGet", json!({}), BOUND)
        .await
        .expect("ModelConfig.ModelGet");
    assert_ne!(
        config["config"]["logging-config"]["value"], "<root>=DEBUG",
        "{config:#}"
    );
}

/// The seed's deployer, behind the front door (`LOCKSTEPD_FRONT_DOOR=true`): jujuclient logs
/// in while `bootstrap --auto-upgrade` holds the controller `upgrading`, reads, and resends
/// its refused `AddMachines`; the test releases the new binary, the worker restarts into it
/// (a new process, the launcher the same), and jujuclient, which never reconnects, rides
/// through on its one connection: its write is applied exactly once on the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_front_door_jujuclient_rides_through_a_self_upgrade_and_its_write_lands_once() {
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mut held = HeldBootstrap::start_with(
        Mirror::n_and_next(Published::Lockstepd),
        HoldBack::Binary(lockstep_agent::datadir::host_binary(next()).to_string()),
        &[("LOCKSTEPD_FRONT_DOOR", "true")],
    );
    held.wait_held_in("upgrading").await;
    let old_worker = held.controller.worker_pid().expect("a worker runs");
    let launcher = held.controller.launcher_pid().expect("a launcher runs");

    let mut client = start_client("jujuclient_retries.py", &held.controller, &[]);
    let started = Instant::now();
    while rejections(&metrics(&held.controller).await, "Client") < 2 {
        assert!(
            client.running(),
            "jujuclient exited while the controller was upgrading"
        );
        assert!(
            started.elapsed() < BOUND,
            "jujuclient's write was not refused twice within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release().await;
    let seen = json_line(&client.finish().await);

    assert_eq!(seen["limited_status_model"], "controller", "{seen}");
    assert_eq!(seen["added_machine"], "1", "{seen}");
    assert_eq!(seen["machines"], json!(["0", "1"]), "{seen}");
    assert_eq!(seen["logging_config"], "<root>=DEBUG", "{seen}");
    // The worker was replaced by the new version's; the launcher, holding the connection,
    // was not.
    let status = held.controller.status().await;
    assert_eq!(
        (&status["phase"], &status["agent-version"]),
        (&json!("ready"), &json!(next().to_string())),
        "{status:#}"
    );
    assert_eq!(held.controller.launcher_pid(), Some(launcher));
    let exe = held
        .controller
        .serving_exe()
        .expect("the worker's executable");
    assert!(
        exe.starts_with(held.controller.binary_dir(next())),
        "the worker runs {}",
        exe.display()
    );
    // The worker re-executed itself (`--restart=exec`, the default: the same pid, the new
    // binary), so its relay streams closed under the launcher.
    assert_eq!(held.controller.worker_pid(), Some(old_worker));
    let log = held.controller.log();
    assert!(log.contains("re-executing"), "{log}");
    // Applied once: one machine added, however many times jujuclient sent it.
    let full = held.controller.full_status().await;
    let machines: Vec<&String> = full["machines"].as_object().unwrap().keys().collect();
    assert_eq!(machines, ["0", "1"], "{full:#}");
    assert!(seen["add_machines_sends"].as_u64().unwrap() >= 3, "{seen}");
}

/// python-jujuclient's deployer work by explicit endpoint against a Ready lockstepd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jujuclient_uploads_deploys_adds_units_relates_and_reads_status() {
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let ca = ca_file(&controller);
    // Its charm upload verifies the server with Python's default trust store.
    let seen = json_line(
        &start_client(
            "jujuclient_everyday.py",
            &controller,
            &[("SSL_CERT_FILE", ca.as_path())],
        )
        .finish()
        .await,
    );
    assert_eq!(seen["redirect"], Value::Null, "{seen}");
    assert_eq!(seen["upload_web"], "local:jammy/web-0", "{seen}");
    assert_eq!(seen["upload_db"], "local:jammy/db-0", "{seen}");
    assert_eq!(seen["added_units"], json!(["web/1", "web/2"]), "{seen}");
    assert_eq!(seen["relation"]["web"]["role"], "requirer", "{seen}");
    assert_eq!(seen["relation"]["db"]["interface"], "pgsql", "{seen}");
    assert_eq!(seen["status_model"], "controller", "{seen}");
    assert_eq!(seen["status_applications"], json!(["db", "web"]), "{seen}");
    assert_eq!(
        seen["web_units"],
        json!(["web/0", "web/1", "web/2"]),
        "{seen}"
    );
    assert_eq!(seen["status_relations"], json!(["db:db web:db"]), "{seen}");
    // Deployed with {"port": "81"}, typed by the charm's option.
    assert_eq!(seen["port"], 81, "{seen}");
    assert_eq!(seen["port_set"], 8080, "{seen}");

    // The controller's own account of it: one unit of db, three of web, one relation.
    let full = controller.full_status().await;
    let units = |application: &str| -> Vec<String> {
        full["applications"][application]["units"]
            .as_object()
            .map(|units| units.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(units("web"), ["web/0", "web/1", "web/2"], "{full:#}");
    assert_eq!(units("db"), ["db/0"], "{full:#}");
    assert_eq!(
        full["relations"].as_array().map(Vec::len),
        Some(1),
        "{full:#}"
    );
}

/// jujuclient started while `bootstrap --auto-upgrade` holds the controller
/// `checking-agent-version` (no newer binary: it will not restart, so jujuclient's one
/// connection lives on into Ready): reads served, `AddMachines` refused and resent by
/// jujuclient until the test lets the controller reach Ready, then applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jujuclient_resends_a_refused_add_machine_through_a_limited_phase_and_it_is_applied_once() {
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mut held = HeldBootstrap::start(
        Mirror::new(&[(own(), Published::Lockstepd)]),
        HoldBack::MetadataAfterABinary,
    );
    held.wait_held_in("checking-agent-version").await;

    let mut client = start_client("jujuclient_retries.py", &held.controller, &[]);
    // Release only once the controller has turned jujuclient's write away three times.
    let started = Instant::now();
    while rejections(&metrics(&held.controller).await, "Client") < 3 {
        assert!(
            client.running(),
            "jujuclient exited while the controller was limited"
        );
        assert!(
            started.elapsed() < BOUND,
            "jujuclient's write was not refused three times within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(client.running(), "jujuclient gave up while limited");
    assert_eq!(held.phase().await, "checking-agent-version");
    held.release().await;
    let seen = json_line(&client.finish().await);

    assert_eq!(seen["redirect"], Value::Null, "{seen}");
    assert_eq!(seen["limited_status_model"], "controller", "{seen}");
    assert_eq!(seen["limited_machines"], json!(["0"]), "{seen}");
    assert_eq!(seen["limited_agent_version"], own().to_string(), "{seen}");
    assert_eq!(seen["added_machine"], "1", "{seen}");
    assert_eq!(seen["logging_config"], "<root>=DEBUG", "{seen}");
    assert_eq!(seen["machines"], json!(["0", "1"]), "{seen}");
    // Every refusal was resent, and only the last send, once Ready, was applied. The
    // controller never restarted, so its counters cover the whole run.
    let refused = all_rejections(&metrics(&held.controller).await);
    let sends = seen["add_machines_sends"].as_u64().unwrap();
    assert_eq!(refused, json!({"Client": sends - 1}), "{seen}");
    let status = held.controller.status().await;
    assert_eq!(status["phase"], "ready", "{status:#}");
    let full = held.controller.full_status().await;
    let machines: Vec<&String> = full["machines"].as_object().unwrap().keys().collect();
    assert_eq!(machines, ["0", "1"], "{full:#}");
}

/// One AllWatcher delta as a watcher received it: the revision lockstep gives it
/// (`revisions`, beside `deltas`), its kind, `change` or `remove`, its entity's id, and for
/// the model its `agent-version`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SeenDelta {
    revision: u64,
    entity: String,
    change: String,
    id: String,
    agent_version: Option<String>,
}

impl SeenDelta {
    /// The deltas of an `AllWatcher.Next` answer.
    fn of_answer(response: &Value) -> Vec<SeenDelta> {
        let deltas = response["deltas"].as_array().cloned().unwrap_or_default();
        let revisions = response["revisions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(deltas.len(), revisions.len(), "{response}");
        deltas
            .iter()
            .zip(revisions)
            .map(|(delta, revision)| {
                let entity = delta[0].as_str().unwrap_or_default();
                let id_key = match entity {
                    "model" => "model-uuid",
                    "machine" => "id",
                    "relation" => "key",
                    _ => "name",
                };
                SeenDelta {
                    revision: revision.as_u64().expect("a revision"),
                    entity: entity.to_owned(),
                    change: delta[1].as_str().unwrap_or_default().to_owned(),
                    id: delta[2][id_key].as_str().unwrap_or_default().to_owned(),
                    agent_version: (entity == "model")
                        .then(|| delta[2]["agent-version"].as_str().map(str::to_owned))
                        .flatten(),
                }
            })
            .collect()
    }

    /// `[revision, entity, change, id, agent-version]`, as
    /// `interop/libjuju_watch_through_upgrades.py` prints each.
    fn of_printed(printed: &Value) -> SeenDelta {
        SeenDelta {
            revision: printed[0].as_u64().expect("a revision"),
            entity: printed[1].as_str().unwrap_or_default().to_owned(),
            change: printed[2].as_str().unwrap_or_default().to_owned(),
            id: printed[3].as_str().unwrap_or_default().to_owned(),
            agent_version: printed[4].as_str().map(str::to_owned),
        }
    }
}

/// A watcher's `AllWatcher.Next` answers, checked: the first is the whole model (one
/// revision, the model and machine 0 in it); every later one is not empty, its revisions
/// are above the first's and never go back, and no delta comes twice; each machine of
/// `added` is in exactly one delta of them all, a change after the first answer. Returns
/// the first answer's revision and every later delta, in order.
fn check_watched(who: &str, answers: &[Vec<SeenDelta>], added: &[String]) -> (u64, Vec<SeenDelta>) {
    let (first, later) = answers
        .split_first()
        .unwrap_or_else(|| panic!("{who}: no answer"));
    let start = first.first().map(|delta| delta.revision);
    let start = start.unwrap_or_else(|| panic!("{who}: an empty first answer"));
    assert!(
        first.iter().all(|delta| delta.revision == start),
        "{who}: the first answer is one snapshot: {first:?}"
    );
    assert!(
        first.iter().any(|delta| delta.entity == "model")
            && first
                .iter()
                .any(|delta| delta.entity == "machine" && delta.id == "0"),
        "{who}: the first answer is the whole model: {first:?}"
    );
    assert!(
        later.iter().all(|answer| !answer.is_empty()),
        "{who}: an empty answer: {answers:?}"
    );
    let later: Vec<SeenDelta> = later.iter().flatten().cloned().collect();
    assert!(
        later.iter().all(|delta| delta.revision > start),
        "{who}: a delta at or before the snapshot's revision {start} came again: {later:?}"
    );
    assert!(
        later
            .windows(2)
            .all(|pair| pair[0].revision <= pair[1].revision),
        "{who}: revisions went back: {later:?}"
    );
    let mut distinct = std::collections::BTreeSet::new();
    for delta in &later {
        assert!(distinct.insert(delta), "{who}: delivered twice: {delta:?}");
    }
    for id in added {
        let of_machine: Vec<&SeenDelta> = answers
            .iter()
            .flatten()
            .filter(|delta| delta.entity == "machine" && &delta.id == id)
            .collect();
        assert!(
            of_machine.len() == 1
                && of_machine[0].change == "change"
                && of_machine[0].revision > start,
            "{who}: machine {id} in {of_machine:?}"
        );
    }
    (start, later)
}

/// The model's agent-versions as a watcher's answers showed them, in order, each once.
fn agent_versions(answers: &[Vec<SeenDelta>]) -> Vec<String> {
    let mut versions: Vec<String> = answers
        .iter()
        .flatten()
        .filter_map(|delta| delta.agent_version.clone())
        .collect();
    versions.dedup();
    versions
}

/// A websocket of the test's own (no retry, no reconnect, unlike lockstep's client) to the
/// controller's model API, TLS verified with its CA, on which the admin logged in
/// (`Admin.Login`, request id 1): a test sees what happens to this one connection.
async fn logged_in(controller: &Controller) -> Socket {
    let file = controller.controller_file();
    let tls = controller.tls_connect("juju-apiserver").await;
    let url = format!(
        "wss://{}/model/{}/api",
        file.api_endpoints[0], file.model_uuid
    );
    let (mut socket, _) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("a websocket");
    let login = json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
                       "params": {"auth-tag": "user-admin", "credentials": file.password,
                                  "client-version": lockstep_transport::server::SERVER_VERSION}});
    let reply = request(&mut socket, login).await.expect("Admin.Login");
    assert!(reply.get("error").is_none(), "login refused: {reply}");
    socket
}

/// Watches over a [`Socket`] on which the admin logged in: `Client.WatchAll`, then
/// `AllWatcher.Next` after `Next`, each answer pushed to `answers`, until `stop` says so
/// (the `Next` then waiting is left unanswered). Returns the socket, or how the connection
/// ended or what the controller answered instead.
async fn watch_raw(
    mut socket: Socket,
    answers: std::sync::Arc<std::sync::Mutex<Vec<Vec<SeenDelta>>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Socket, String> {
    let watch_all = json!({"request-id": 2, "type": "Client", "version": 8, "request": "WatchAll", "params": {}});
    let reply = request(&mut socket, watch_all.clone()).await?;
    let id = reply["response"]["watcher-id"]
        .as_str()
        .ok_or_else(|| format!("WatchAll: {reply}"))?
        .to_owned();
    for request_id in 3.. {
        let next = json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id,
                          "request": "Next", "params": {}});
        send(&mut socket, &next).await?;
        let reply = tokio::select! {
            reply = receive(&mut socket) => match reply {
                Received::Reply(reply) => reply,
                Received::Closed(how) => return Err(how),
            },
            _ = stop.wait_for(|stop| *stop) => return Ok(socket),
        };
        if reply["request-id"] != request_id || reply.get("error").is_some() {
            return Err(format!("AllWatcher.Next: {reply}"));
        }
        answers
            .lock()
            .unwrap()
            .push(SeenDelta::of_answer(&reply["response"]));
    }
    unreachable!("request ids run out")
}

/// Adds one machine at a time (`Client.AddMachines` through lockstep's client, which
/// resends a call refused `upgrade in progress` under the same operation-id) until `stop`,
/// pushing each new machine's id to `added` with when its answer came; returns the client's
/// retries.
async fn add_machines_until(
    client: lockstep_transport::client::Client,
    added: std::sync::Arc<std::sync::Mutex<Vec<(String, Instant)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> lockstep_transport::client::ClientStats {
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let reply = client
            .mutate(
                "Client",
                8,
                "AddMachines",
                json!({"params": [{"jobs": ["JobHostUnits"]}]}),
                BOUND,
            )
            .await
            .expect("Client.AddMachines");
        let machine = reply["machines"][0]["machine"].as_str();
        let machine = machine.unwrap_or_else(|| panic!("AddMachines: {reply}"));
        added
            .lock()
            .unwrap()
            .push((machine.to_owned(), Instant::now()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.stats()
}

/// Waits until `condition` holds, at most [`BOUND`]; `what` names it when it does not.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < BOUND, "{what}: not within {BOUND:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Behind the front door (`LOCKSTEPD_FRONT_DOOR=true`), three watchers of the model stay on
/// their first connection while the controller upgrades itself three times (N to N+1, N+2,
/// N+3: `lockstep upgrade-controller --agent-version`; after each, Ready on the new version,
/// the worker re-executed into that version's binary, the launcher the same process), and
/// machines are added all along, one at a time through lockstep's client: at least one
/// between two upgrades, and at least one from each upgrade call to Ready on its version.
///
/// - python-libjuju's own model watcher (`Model()` from Juju's client store; its observer
///   and `model.machines`): told of every machine once, as an `add`, and of exactly the
///   deltas its `AllWatcher.Next` answers carried; it never reconnected (same websocket, one
///   login, one `WatchAll`);
/// - a raw websocket of the test's own, logged in once, one `WatchAll`, `Next` after `Next`:
///   never closed, and still answering (`FullStatus` as the same login) at the end;
/// - lockstep's own client's watcher: it never found its connection closed nor was refused
///   (its `disconnected` and `upgrade in progress` counts stay 0).
///
/// Each watcher's answers: the whole model first, then every delta once, in revision order,
/// each added machine in exactly one of them, the model's agent-version going N, N+1, N+2,
/// N+3; and all three saw the same deltas after their snapshots. Every machine added was applied
/// once (`FullStatus`).
#[allow(clippy::print_stderr, reason = "timings on stderr, for --nocapture")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_front_door_libjuju_lockstep_and_a_raw_websocket_watch_every_delta_once_on_one_connection_through_three_self_upgrades()
 {
    let begun = Instant::now();
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let versions = [1, 2, 3].map(common::later_patch);
    let mirror = Mirror::new(&[
        (own(), Published::Lockstepd),
        (versions[0], Published::Lockstepd),
        (versions[1], Published::Lockstepd),
        (versions[2], Published::Lockstepd),
    ]);
    let (source, key) = (mirror.source(), mirror.key());
    let controller = Controller::bootstrap(
        &["--metadata-source", &source, "--metadata-key", &key],
        &[("LOCKSTEPD_FRONT_DOOR", "true")],
    );
    controller.assert_bootstrapped();
    assert!(
        controller
            .log()
            .contains("front door: the launcher holds the clients' connections"),
        "{}",
        controller.log()
    );
    let launcher = controller.launcher_pid().expect("a launcher runs");
    let worker = controller.worker_pid().expect("a worker runs");
    let exe = controller.serving_exe().expect("the worker's executable");
    assert!(exe.starts_with(controller.binary_dir(own())), "{exe:?}");
    eprintln!("bootstrapped in {:?}", begun.elapsed());

    // The raw watcher, then libjuju's, both before the first write.
    let raw_answers = std::sync::Arc::default();
    let (stop_raw, stop) = tokio::sync::watch::channel(false);
    let raw = tokio::spawn(watch_raw(
        logged_in(&controller).await,
        std::sync::Arc::clone(&raw_answers),
        stop,
    ));
    wait_until("the raw watcher's first answer", || {
        !raw_answers.lock().unwrap().is_empty()
    })
    .await;
    // lockstep's own client's watcher, which would resume on a new connection if its own
    // closed: it must not need to (`disconnected` stays 0).
    let lockstep_answers: std::sync::Arc<std::sync::Mutex<Vec<Vec<SeenDelta>>>> =
        std::sync::Arc::default();
    let (stop_lockstep, mut lockstep_stop) = tokio::sync::watch::channel(false);
    let lockstep = {
        let (client, answers) = (
            controller.client(),
            std::sync::Arc::clone(&lockstep_answers),
        );
        tokio::spawn(async move {
            let mut watcher = client.watch();
            loop {
                let batch = tokio::select! {
                    batch = watcher.next(BOUND) => batch.map_err(|error| error.to_string())?,
                    _ = lockstep_stop.wait_for(|stop| *stop) => break,
                };
                let response = json!({
                    "deltas": batch.iter().map(|delta| delta.delta.clone()).collect::<Vec<_>>(),
                    "revisions": batch.iter().map(|delta| delta.revision.0).collect::<Vec<_>>(),
                });
                answers
                    .lock()
                    .unwrap()
                    .push(SeenDelta::of_answer(&response));
            }
            drop(watcher);
            Ok::<_, String>(client.stats())
        })
    };
    wait_until("lockstep's watcher's first answer", || {
        !lockstep_answers.lock().unwrap().is_empty()
    })
    .await;
    let expected_file = controller.dir.path().join("expected-machines.json");
    let juju_data = common::juju_data_beside(&controller.data_dir);
    let mut libjuju = start_client(
        "libjuju_watch_through_upgrades.py",
        &controller,
        &[
            ("JUJU_DATA", &juju_data),
            ("LOCKSTEP_EXPECTED_MACHINES", &expected_file),
        ],
    );
    let libjuju_stdout = libjuju.stdout.clone();
    let started = Instant::now();
    while !std::fs::read_to_string(&libjuju_stdout)
        .unwrap_or_default()
        .contains("watching")
    {
        assert!(libjuju.running(), "libjuju exited before it watched");
        assert!(
            started.elapsed() < BOUND,
            "libjuju did not connect within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("both watching after {:?}", begun.elapsed());

    let added = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop_writer = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(add_machines_until(
        controller.client(),
        std::sync::Arc::clone(&added),
        std::sync::Arc::clone(&stop_writer),
    ));
    let mut upgrading = Vec::new();
    for version in versions {
        // At least one machine added on the version running before the upgrade.
        let before = added.lock().unwrap().len();
        wait_until("a machine added between two upgrades", || {
            added.lock().unwrap().len() > before
        })
        .await;
        let upgrade_began = Instant::now();
        let upgrade = tokio::task::block_in_place(|| {
            controller.run(&[
                "upgrade-controller",
                "--agent-version",
                &version.to_string(),
            ])
        });
        assert!(upgrade.status.success(), "{}", text(&upgrade));
        controller.wait_running(version, BOUND).await;
        upgrading.push((version, upgrade_began, Instant::now()));
        assert_eq!(
            controller.launcher_pid(),
            Some(launcher),
            "the launcher stays"
        );
        assert_eq!(
            controller.worker_pid(),
            Some(worker),
            "re-executed in place"
        );
        let exe = controller.serving_exe().expect("the worker's executable");
        assert!(
            exe.starts_with(controller.binary_dir(version)),
            "on {version}, the worker runs {}",
            exe.display()
        );
        assert!(
            libjuju.running(),
            "libjuju exited during the upgrade to {version}"
        );
        if raw.is_finished() {
            panic!(
                "the raw watcher ended during the upgrade to {version}: {:?}",
                raw.await
            );
        }
        eprintln!("running {version} after {:?}", begun.elapsed());
    }
    let before = added.lock().unwrap().len();
    wait_until("a machine added after the last upgrade", || {
        added.lock().unwrap().len() > before
    })
    .await;
    stop_writer.store(true, std::sync::atomic::Ordering::SeqCst);
    let retries = writer.await.expect("the writer");
    let answered: Vec<(String, Instant)> = added.lock().unwrap().clone();
    for (version, began, ready) in upgrading {
        let during = answered
            .iter()
            .filter(|(_, at)| (began..ready).contains(at))
            .count();
        eprintln!(
            "to {version}: {:?} from the upgrade call to Ready, {during} machines added meanwhile",
            ready - began
        );
        assert!(
            during > 0,
            "no machine added from the upgrade call to Ready on {version}"
        );
    }
    let added: Vec<String> = answered.into_iter().map(|(id, _)| id).collect();
    let mut expected: Vec<String> = std::iter::once("0".to_owned())
        .chain(added.iter().cloned())
        .collect();
    expected.sort();
    // Whole or not at all: libjuju's script reads it as soon as it exists.
    let partial = expected_file.with_extension("partial");
    std::fs::write(&partial, json!(expected).to_string()).expect("write the ids");
    std::fs::rename(&partial, &expected_file).expect("rename the ids' file");

    let seen = json_line(&libjuju.finish().await);
    wait_until("the raw watcher told of every machine", || {
        let answers = raw_answers.lock().unwrap();
        added.iter().all(|id| {
            answers
                .iter()
                .flatten()
                .any(|delta| delta.entity == "machine" && &delta.id == id)
        })
    })
    .await;
    wait_until("lockstep's watcher told of every machine", || {
        let answers = lockstep_answers.lock().unwrap();
        added.iter().all(|id| {
            answers
                .iter()
                .flatten()
                .any(|delta| delta.entity == "machine" && &delta.id == id)
        })
    })
    .await;
    stop_lockstep
        .send(true)
        .expect("lockstep's watcher listens");
    let lockstep_stats = lockstep
        .await
        .expect("lockstep's watcher's task")
        .unwrap_or_else(|error| panic!("lockstep's watcher: {error}"));
    assert_eq!(
        (
            lockstep_stats.disconnected,
            lockstep_stats.upgrade_in_progress
        ),
        (0, 0),
        "lockstep's watcher never reconnected nor retried: {lockstep_stats:?}"
    );
    stop_raw.send(true).expect("the raw watcher listens");
    let mut socket = raw
        .await
        .expect("the raw watcher's task")
        .unwrap_or_else(|how| panic!("the raw watcher's connection: {how}"));
    let status = json!({"request-id": 1_000_000, "type": "Client", "version": 8,
                        "request": "FullStatus", "params": {}});
    let status = request(&mut socket, status.clone())
        .await
        .expect("FullStatus on the raw watcher's connection");
    assert_eq!(
        common::machine_ids(&status["response"]),
        expected,
        "{status}"
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
    eprintln!(
        "{} machines added, {} attempts refused upgrade in progress and resent, in {:?}",
        added.len(),
        retries.upgrade_in_progress,
        begun.elapsed()
    );

    // Each machine applied once.
    assert_eq!(
        common::machine_ids(&controller.full_status().await),
        expected
    );
    let distinct: std::collections::BTreeSet<&String> = added.iter().collect();
    assert_eq!(distinct.len(), added.len(), "{added:?}");
    assert_eq!(
        controller.log().matches("re-executing").count(),
        3,
        "{}",
        controller.log()
    );

    // libjuju: one connection, one login, one watcher, never reconnected.
    assert_eq!(seen["reconnects"], 0, "{seen}");
    assert_eq!(seen["same_websocket"], true, "{seen}");
    assert_eq!(seen["same_connection"], true, "{seen}");
    assert_eq!(seen["monitor_status"], "connected", "{seen}");
    assert_eq!(seen["watcher_running"], true, "{seen}");
    assert_eq!(seen["requests"]["Admin.Login"], 1, "{seen}");
    assert_eq!(seen["requests"]["Client.WatchAll"], 1, "{seen}");
    assert_eq!(seen["machines"], json!(expected), "{seen}");
    let libjuju_answers: Vec<Vec<SeenDelta>> = seen["next_batches"]
        .as_array()
        .expect("next_batches")
        .iter()
        .map(|answer| {
            answer
                .as_array()
                .expect("an answer")
                .iter()
                .map(SeenDelta::of_printed)
                .collect()
        })
        .collect();
    let (libjuju_start, libjuju_later) = check_watched("libjuju", &libjuju_answers, &added);
    // Its observer was told of exactly the deltas its answers carried, in order: each
    // entity's first as an `add`, as libjuju reports an entity new to its model.
    let mut known = std::collections::BTreeSet::new();
    let told: Vec<Value> = libjuju_answers
        .iter()
        .flatten()
        .map(|delta| {
            let new = known.insert((delta.entity.clone(), delta.id.clone()));
            let change = if new && delta.change == "change" {
                "add"
            } else {
                delta.change.as_str()
            };
            json!([delta.entity, change, delta.id])
        })
        .collect();
    assert_eq!(seen["observed"], json!(told), "{seen}");

    // The raw websocket; and both watchers saw the same deltas after their snapshots.
    let raw_answers = raw_answers.lock().unwrap().clone();
    let (raw_start, raw_later) = check_watched("the raw websocket", &raw_answers, &added);
    let common_start = libjuju_start.max(raw_start);
    let after = |later: &[SeenDelta]| -> Vec<SeenDelta> {
        later
            .iter()
            .filter(|delta| delta.revision > common_start)
            .cloned()
            .collect()
    };
    assert_eq!(after(&libjuju_later), after(&raw_later));
    let lockstep_answers = lockstep_answers.lock().unwrap().clone();
    let (lockstep_start, lockstep_later) =
        check_watched("lockstep's client", &lockstep_answers, &added);
    let common_start = common_start.max(lockstep_start);
    let after = |later: &[SeenDelta]| -> Vec<SeenDelta> {
        later
            .iter()
            .filter(|delta| delta.revision > common_start)
            .cloned()
            .collect()
    };
    assert_eq!(after(&lockstep_later), after(&raw_later));
    assert_eq!(after(&libjuju_later), after(&raw_later));
    // Each saw the model's agent-version move from N through the three upgrades, in order.
    let moved: Vec<String> = std::iter::once(own())
        .chain(versions)
        .map(|version| version.to_string())
        .collect();
    assert_eq!(agent_versions(&libjuju_answers), moved);
    assert_eq!(agent_versions(&raw_answers), moved);
    assert_eq!(agent_versions(&lockstep_answers), moved);
    // The watchers' connections were leased to the worker between its restarts: each
    // self-upgrade ended at least one lease, which the launcher took back.
    let metrics = metrics(&controller).await;
    let (leased, returned) = (
        counter(&metrics, "lockstep_front_door_leases_total"),
        counter(&metrics, "lockstep_front_door_leases_returned_total"),
    );
    assert!(
        returned >= 3 && leased >= returned,
        "leases {leased}, over {returned}: fewer than one per self-upgrade"
    );
    eprintln!(
        "libjuju: {} answers, {} deltas after its snapshot; raw: {} answers, {} deltas",
        libjuju_answers.len(),
        libjuju_later.len(),
        raw_answers.len(),
        raw_later.len()
    );
}

/// `interop/jujuclient_deployer.py` deploying applications named `<prefix>-...`, as
/// [`start_client`] starts a script, its output in files of its own (`deployer-<prefix>`).
fn start_deployer(controller: &Controller, prefix: &str) -> Process {
    let file = controller.controller_file();
    let port = file.api_endpoints[0].rsplit(':').next().expect("host:port");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/jujuclient_deployer.py");
    Process::spawn(
        Command::new(python::python())
            .arg(script)
            .arg(port)
            .arg(ca_file(controller))
            .arg(&file.model_uuid)
            .arg(&file.password)
            .env("LOCKSTEP_DEPLOYER_PREFIX", prefix),
        controller.dir.path(),
        &format!("deployer-{prefix}"),
    )
}

/// What a deployer that finished reported, checked: its three applications with their
/// units and two relations; returns how many times it sent each request.
fn check_deployed(prefix: &str, output: &Output) -> Value {
    let seen = json_line(output);
    let (web, db, lb) = (
        format!("{prefix}-web"),
        format!("{prefix}-db"),
        format!("{prefix}-lb"),
    );
    assert_eq!(seen["redirect"], Value::Null, "{prefix}: {seen}");
    assert_eq!(seen["first_status_model"], "controller", "{prefix}: {seen}");
    assert_eq!(
        seen["added_units"],
        json!([format!("{web}/1"), format!("{web}/2")]),
        "{prefix}: {seen}"
    );
    assert_eq!(
        seen["relations"],
        json!([[db, web], [lb, web]]),
        "{prefix}: {seen}"
    );
    assert_eq!(
        seen["applications"],
        json!([db, lb, web]),
        "{prefix}: {seen}"
    );
    assert_eq!(
        seen["units"],
        json!({db.clone(): [format!("{db}/0")], lb.clone(): [format!("{lb}/0")],
               web.clone(): [format!("{web}/0"), format!("{web}/1"), format!("{web}/2")]}),
        "{prefix}: {seen}"
    );
    assert_eq!(seen["same_connection"], true, "{prefix}: {seen}");
    seen["sends"].clone()
}

/// `FullStatus` after one deployer per prefix of `prefixes`: exactly their applications,
/// each with its units (web 3, db 1, lb 1), two relations each, and one machine per unit
/// beside the controller's: each deployment applied once.
fn assert_deployed_once(full: &Value, prefixes: &[&str]) {
    let mut applications = Vec::new();
    for prefix in prefixes {
        for (application, units) in [("web", 3), ("db", 1), ("lb", 1)] {
            let name = format!("{prefix}-{application}");
            let unit_count = full["applications"][&name]["units"]
                .as_object()
                .map(serde_json::Map::len);
            assert_eq!(unit_count, Some(units), "{name}: {full:#}");
            applications.push(name);
        }
    }
    applications.sort();
    let shown: Vec<&String> = full["applications"].as_object().unwrap().keys().collect();
    assert_eq!(shown, applications.iter().collect::<Vec<_>>(), "{full:#}");
    assert_eq!(
        full["relations"].as_array().map(Vec::len),
        Some(2 * prefixes.len()),
        "{full:#}"
    );
    assert_eq!(
        common::machine_ids(full).len(),
        1 + 5 * prefixes.len(),
        "{full:#}"
    );
}

/// The seed's deployer behind the front door (`LOCKSTEPD_FRONT_DOOR=true`), started at three
/// moments of `lockstep bootstrap --auto-upgrade`: one while the mirror holds the new binary
/// back (`upgrading`: its deploy refused and resent), one started as the test releases the
/// binary (the worker then runs it, under the same launcher), one once bootstrap
/// has reported the controller available. Each, with python-jujuclient on its one
/// connection, finishes without raising: three applications deployed, units added, two
/// relations, status. The controller's `FullStatus` afterwards shows each deployment
/// exactly once: nine applications with their units, six relations.
#[allow(clippy::print_stderr, reason = "timings on stderr, for --nocapture")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_front_door_jujuclient_deployers_started_while_upgrading_at_release_and_after_ready_each_finish_and_deploy_once()
 {
    let begun = Instant::now();
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mut held = HeldBootstrap::start_with(
        Mirror::n_and_next(Published::Lockstepd),
        HoldBack::Binary(lockstep_agent::datadir::host_binary(next()).to_string()),
        &[("LOCKSTEPD_FRONT_DOOR", "true")],
    );
    held.wait_held_in("upgrading").await;
    let launcher = held.controller.launcher_pid().expect("a launcher runs");
    eprintln!("held upgrading after {:?}", begun.elapsed());

    // Started while upgrading: released only once its first deploy was refused twice.
    let mut upgrading = start_deployer(&held.controller, "upgrading");
    let started = Instant::now();
    while rejections(&metrics(&held.controller).await, "Application") < 2 {
        assert!(
            upgrading.running(),
            "the deployer exited while the controller was upgrading"
        );
        assert!(
            started.elapsed() < BOUND,
            "the deployer's deploy was not refused twice within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held.phase().await, "upgrading");
    // Started as the binary is released.
    let releasing = start_deployer(&held.controller, "releasing");
    held.release().await;
    eprintln!("ready after {:?}", begun.elapsed());
    // Started once bootstrap has reported the controller available.
    let ready = start_deployer(&held.controller, "ready");

    let sends = [
        ("upgrading", upgrading.finish().await),
        ("releasing", releasing.finish().await),
        ("ready", ready.finish().await),
    ]
    .map(|(prefix, output)| (prefix, check_deployed(prefix, &output)));
    eprintln!("deployers done after {:?}: {sends:?}", begun.elapsed());
    // The first was refused and resent its deploy while upgrading.
    assert!(
        sends[0].1["Deploy"].as_u64().unwrap() >= 3 + 2,
        "{:?}",
        sends[0]
    );

    // The worker was replaced by the new version's, under the same launcher.
    let status = held.controller.status().await;
    assert_eq!(
        (&status["phase"], &status["agent-version"]),
        (&json!("ready"), &json!(next().to_string())),
        "{status:#}"
    );
    assert_eq!(held.controller.launcher_pid(), Some(launcher));
    let exe = held
        .controller
        .serving_exe()
        .expect("the worker's executable");
    assert!(
        exe.starts_with(held.controller.binary_dir(next())),
        "the worker runs {}",
        exe.display()
    );
    // Each deployment applied once.
    assert_deployed_once(
        &held.controller.full_status().await,
        &["upgrading", "releasing", "ready"],
    );
    eprintln!("in {:?}", begun.elapsed());
}

/// The seed's deployer behind the front door (the default) through `lockstep
/// upgrade-controller` of a Ready controller whose new version's database step is killed:
/// N+1's database step pauses inside its transaction (the test failpoint), and the worker is
/// killed -9 there, so the launcher starts N+1 again, which runs the step again. Three
/// python-jujuclient deployers on one connection each: one started while Ready on N, one
/// while N+1's step holds its transaction, one just after the kill. Each finishes without
/// raising (three applications, units, two relations, status) and `FullStatus` shows each
/// deployment exactly once; the controller ends Ready on N+1 under the same launcher, the
/// step checkpointed once.
#[allow(clippy::print_stderr, reason = "timings on stderr, for --nocapture")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jujuclient_deployers_ride_through_upgrade_controller_with_the_worker_killed_9_inside_the_new_versions_database_step()
 {
    const PAUSING: &str = "failpoint: pausing inside the step's transaction";
    let begun = Instant::now();
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (source, key) = (mirror.source(), mirror.key());
    let controller = Controller::bootstrap(
        &["--metadata-source", &source, "--metadata-key", &key],
        &[(
            lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
            "3000",
        )],
    );
    controller.assert_bootstrapped();
    let launcher = controller.launcher_pid().expect("a launcher runs");
    let pauses_on_n = controller.log().matches(PAUSING).count();

    let on_n = start_deployer(&controller, "on-n");
    let upgrade = {
        let data_dir = controller.data_dir.clone();
        tokio::task::spawn_blocking(move || {
            common::lockstep(&data_dir, &["upgrade-controller"], &[])
        })
    };
    // N+1's database step inside its transaction.
    let started = Instant::now();
    while controller.log().matches(PAUSING).count() == pauses_on_n {
        assert!(
            started.elapsed() < BOUND,
            "N+1's database step did not start within {BOUND:?}:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let in_step = start_deployer(&controller, "in-step");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let worker = controller.worker_pid().expect("a worker runs");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(worker as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    eprintln!(
        "worker killed -9 inside N+1's step after {:?}",
        begun.elapsed()
    );
    let after_kill = start_deployer(&controller, "after-kill");

    let outputs = [
        ("on-n", on_n.finish().await),
        ("in-step", in_step.finish().await),
        ("after-kill", after_kill.finish().await),
    ];
    for (prefix, output) in &outputs {
        check_deployed(prefix, output);
    }
    let upgrade = upgrade.await.unwrap();
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), BOUND).await;
    eprintln!(
        "deployers done and Ready on N+1 after {:?}",
        begun.elapsed()
    );
    assert_eq!(
        controller.launcher_pid(),
        Some(launcher),
        "the launcher stays"
    );
    assert_ne!(controller.worker_pid(), Some(worker), "a new worker serves");
    // The step ran again after the kill, and was checkpointed once.
    assert!(
        controller.log().matches(PAUSING).count() >= pauses_on_n + 2,
        "{}",
        controller.log()
    );
    let checkpoints = common::checkpoint_events(&controller.data());
    assert!(
        checkpoints.values().all(|count| *count == 1),
        "each database step checkpointed once: {checkpoints:?}"
    );

    // Each deployment applied once.
    assert_deployed_once(
        &controller.full_status().await,
        &outputs.each_ref().map(|(prefix, _)| *prefix),
    );
}

/// The seed's deployer started at the earliest moment of `bootstrap --auto-upgrade`: while
/// the controller, held `checking-agent-version` by the mirror, has not yet found N+1. Once
/// released, the controller finds N+1, downloads it, re-executes into it and runs its
/// steps; python-jujuclient, on its one connection, rides through every one of those
/// phases: refused `upgrade in progress` and resending until Ready, it finishes without
/// raising, and `FullStatus` shows its deployment once on N+1 under the same launcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jujuclient_deployer_started_while_checking_the_agent_version_rides_through_the_whole_upgrade_and_deploys_once()
 {
    tokio::task::spawn_blocking(python::python).await.unwrap();
    let mut held = HeldBootstrap::start(
        Mirror::n_and_next(Published::Lockstepd),
        HoldBack::MetadataAfterABinary,
    );
    held.wait_held_in("checking-agent-version").await;
    let launcher = held.controller.launcher_pid().expect("a launcher runs");
    let mut deployer = start_deployer(&held.controller, "checking");
    let started = Instant::now();
    while rejections(&metrics(&held.controller).await, "Application") < 1 {
        assert!(
            deployer.running(),
            "the deployer exited while the controller was checking the agent version"
        );
        assert!(
            started.elapsed() < BOUND,
            "the deployer's deploy was not refused within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held.phase().await, "checking-agent-version");
    held.release().await;
    let sends = check_deployed("checking", &deployer.finish().await);
    // Its three deploys, and at least one resent after a refusal.
    assert!(sends["Deploy"].as_u64().unwrap() > 3, "{sends}");

    let status = held.controller.status().await;
    assert_eq!(
        (&status["phase"], &status["agent-version"]),
        (&json!("ready"), &json!(next().to_string())),
        "{status:#}"
    );
    assert_eq!(held.controller.launcher_pid(), Some(launcher));
    let exe = held
        .controller
        .serving_exe()
        .expect("the worker's executable");
    assert!(
        exe.starts_with(held.controller.binary_dir(next())),
        "the worker runs {}",
        exe.display()
    );
    assert!(held.controller.log().contains("re-executing"));
    assert_deployed_once(&held.controller.full_status().await, &["checking"]);
}
