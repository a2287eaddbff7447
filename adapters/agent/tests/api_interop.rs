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
//!
//! The controller says which phase it is in (`Upgrade.Status`, served in every phase) before
//! a client starts and after it has finished, while the mirror still holds it there; its
//! `/metrics` count the calls it refused.

use crate::common;
use crate::common::python;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// `lockstep_gate_rejections_total{facade="<facade>"}` of a `/metrics` text (0 if absent).
fn rejections(metrics: &str, facade: &str) -> u64 {
    let series = format!("lockstep_gate_rejections_total{{facade=\"{facade}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .map(|count| count.trim().parse().expect("a count"))
        .unwrap_or(0)
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
                .args(["--auto-upgrade", "--metadata-source", &served.tools_url()])
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
