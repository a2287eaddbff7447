//! End to end: real `lockstep` and `lockstepd` processes, real SQLite files, real TLS on
//! 127.0.0.1, real self-upgrades through re-exec. Each test asserts outcomes (versions
//! running, `/proc/<pid>/exe`, store contents, what clients saw), not just exit codes.

use crate::common;

use std::time::Duration;

use common::{Controller, Mirror, Published, bundle_file, lockstep, next, own, text};
use serde_json::json;

const READY_WITHIN: Duration = Duration::from_secs(120);

fn unix_micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_bootstrap_returns_once_ready_then_deploys() {
    let controller = Controller::bootstrap(&[], &[]);
    let returned = unix_micros_now();
    // Before anything else: the controller is Ready the moment bootstrap has returned.
    let phase = controller
        .client()
        .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(30))
        .await
        .map(|status| status["phase"].clone());
    controller.assert_bootstrapped();
    assert_eq!(
        phase.expect("Upgrade.Status answers"),
        "ready",
        "bootstrap returned before Ready"
    );
    // And it opened its full API before bootstrap returned, not in the moment since.
    let ready = common::ready_unix_micros(&controller.log()).expect("a gate-ready log line");
    assert!(
        ready <= returned,
        "Ready at {ready} µs, after bootstrap returned at {returned} µs"
    );
    let exe = controller.serving_exe().expect("a worker runs");
    assert!(exe.starts_with(controller.binary_dir(own())), "{exe:?}");

    let bundle = bundle_file(controller.dir.path());
    let deploy = controller.run(&["deploy", bundle.to_str().unwrap()]);
    assert!(deploy.status.success(), "{}", text(&deploy));

    let status = controller.run(&["status", "--format", "json"]);
    assert!(status.status.success(), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    common::assert_bundle_deployed_once(&status);
    let machines_before = status["machines"].as_object().map(|m| m.len()).unwrap_or(0);
    let add = controller.run(&["add-machine", "-n", "2"]);
    assert!(add.status.success(), "{}", text(&add));
    let status = controller.run(&["status", "--format", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let machines = status["machines"].as_object().unwrap();
    assert_eq!(machines.len(), machines_before + 2, "{status:#}");
    assert!(
        machines
            .values()
            .filter(|machine| machine["jobs"] == json!(["JobHostUnits"]))
            .count()
            >= 2,
        "{status:#}"
    );
    let yaml = controller.run(&["status", "--format", "yaml"]);
    assert!(
        String::from_utf8_lossy(&yaml.stdout).contains("applications:"),
        "{}",
        text(&yaml)
    );
    let tabular = controller.run(&["status"]);
    assert!(
        String::from_utf8_lossy(&tabular.stdout).contains("ready"),
        "{}",
        text(&tabular)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_bootstrap_on_the_same_data_dir_is_refused() {
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let again = lockstep(&controller.data_dir, &["bootstrap", "--api-port", "0"], &[]);
    assert!(!again.status.success(), "{}", text(&again));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("already bootstrapped"), "{}", text(&again));
    // The running controller is untouched.
    controller.wait_ready(READY_WITHIN).await;
}

/// `lockstep demo --timeline FILE` holds its claims and draws the run: the controller's
/// lane on N, then on N+1 after its restart, each version named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_holds_its_claims_and_draws_its_timeline() {
    let scratch = tempfile::tempdir().unwrap();
    let svg_path = scratch.path().join("demo.svg");
    let output = std::process::Command::new(common::LOCKSTEP)
        .args(["demo", "--timeout", "180", "--timeline"])
        .arg(&svg_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", text(&output));
    assert!(stdout.contains("claims hold"), "{}", text(&output));
    assert!(!stdout.contains("FAIL"), "{}", text(&output));
    let svg = std::fs::read_to_string(&svg_path).expect("the timeline was drawn");
    assert!(
        svg.starts_with("<svg") && svg.ends_with("</svg>\n"),
        "{svg}"
    );
    for expected in [
        ">controller</text>".to_owned(),
        ">deployer</text>".to_owned(),
        format!("controller upgrading on {}", common::own()),
        format!("controller ready on {}", common::next()),
        format!("controller restarting on {}", common::own()),
    ] {
        assert!(svg.contains(&expected), "{expected:?} not in:\n{svg}");
    }
}

/// A `lockstep deploy` started before Ready (as soon as bootstrap wrote `controller.yaml`)
/// waits through the limited phases and the restart, and its deploy is applied exactly
/// once, after N+1's database steps ran in the new binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_upgrade_restarts_into_the_new_binary_with_a_deployer_started_before_ready() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let scratch = tempfile::tempdir().unwrap();
    let bundle = bundle_file(scratch.path());
    let (controller, deploy) = Controller::bootstrap_alongside(
        &[
            "--auto-upgrade",
            // The controller downloads N+1 itself, so the limited phases last long enough
            // for a deployer process to meet them.
            "--no-fetch-ahead",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
        |data_dir| {
            std::process::Command::new(common::LOCKSTEP)
                .arg("--data-dir")
                .arg(data_dir)
                .args(["deploy", bundle.to_str().unwrap(), "--timeout", "180"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("lockstep deploy starts")
        },
    );
    let deploy = deploy
        .expect("bootstrap wrote controller.yaml")
        .wait_with_output()
        .unwrap();
    controller.assert_bootstrapped();
    assert!(deploy.status.success(), "{}", text(&deploy));
    // It found the controller limited and waited (the CLI's note names the phase).
    let note = String::from_utf8_lossy(&deploy.stderr)
        .lines()
        .find(|line| line.contains("waiting up to"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("the deploy did not wait for Ready: {}", text(&deploy)));
    assert!(
        [
            "bootstrapping",
            "running-steps",
            "checking-agent-version",
            "upgrading"
        ]
        .iter()
        .any(|phase| note.contains(&format!(" is {phase}"))),
        "{note}"
    );

    let exe = controller.serving_exe().expect("a worker runs");
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
    let status = controller.status().await;
    assert_eq!(status["agent-version"], next().to_string());
    common::assert_bundle_deployed_once(&controller.full_status().await);

    // The store: N+1's database step ran exactly once, and every application and unit of
    // the bundle was written once, after it (by the new binary).
    let log = common::store_log(&controller.data());
    let step = format!(
        "{}@{}",
        lockstep_agent::steps::RECORD_AGENT_BINARIES,
        next()
    );
    let checkpointed = match log.checkpoints.get(&step).map(Vec::as_slice) {
        Some([revision]) => *revision,
        other => panic!("{step} checkpointed at {other:?}"),
    };
    let bundle =
        lockstep_agent::cli::bundle::Bundle::parse(lockstep_agent::cli::demo::DEMO_BUNDLE).unwrap();
    for application in &bundle.applications {
        let first = log.applications[&application.name];
        assert!(
            first > checkpointed,
            "{} written at revision {first}, before {step} at {checkpointed}",
            application.name
        );
        let units = &log.units[&application.name];
        assert_eq!(units.len(), application.num_units as usize, "{units:?}");
        assert!(
            units.values().all(|revision| *revision > checkpointed),
            "{units:?}"
        );
    }
}

/// `bootstrap --auto-upgrade` fetches N+1 (the core's choice from the same signed
/// catalogue) beside N before it starts the controller, and the controller upgrades to it
/// without asking the mirror for it again; with `--no-fetch-ahead` bootstrap fetches only N
/// and the controller downloads N+1 itself. Each time the mirror serves N+1's tarball once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_upgrade_fetches_the_new_binary_ahead_unless_told_not_to() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let next_binary = lockstep_agent::datadir::host_binary(next()).to_string();
    let fetched_ahead = format!("Fetched agent binary {next_binary} ahead");
    for ahead in [true, false] {
        let served = common::http_mirror::HttpMirror::serve(mirror.path(), Duration::ZERO);
        let source = served.tools_url();
        let key = mirror.key();
        let mut args = vec!["--auto-upgrade", "--metadata-source", &source];
        args.extend(["--metadata-key", &key]);
        if !ahead {
            args.push("--no-fetch-ahead");
        }
        let controller = Controller::bootstrap(&args, &[]);
        controller.assert_bootstrapped();
        let said = text(&controller.bootstrap);
        assert_eq!(
            said.contains(&fetched_ahead),
            ahead,
            "ahead {ahead}: {said}"
        );
        controller.wait_running(next(), READY_WITHIN).await;
        let exe = controller.serving_exe().expect("a worker runs");
        assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
        // Fetched by bootstrap, the controller did not ask for it: once in all.
        assert_eq!(
            served.tarball_requests(&next_binary),
            1,
            "ahead {ahead}:\n{}",
            controller.log()
        );
    }
}

/// `lockstep bootstrap` says the controller is available only once `agent.conf` records
/// that bootstrap is over, whether it hears Ready from the launcher's `READY=1` or through
/// the API (the silent-launcher failpoint). Every snapshot write is held back 1.5 s by a
/// failpoint, so a gate opened before its write would let bootstrap return first. A
/// controller killed as bootstrap returned would otherwise restart still bootstrapping,
/// where `--auto-upgrade` applies and an `agent-version` set since is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_says_available_only_once_agent_conf_records_bootstrap_complete() {
    for silent in [false, true] {
        let mut env = vec![("LOCKSTEPD_FAILPOINT_PERSIST_PAUSE_MS", "1500")];
        if silent {
            env.push(("LOCKSTEPD_FAILPOINT_SILENT_LAUNCHER", "1"));
        }
        let controller = Controller::bootstrap(&[], &env);
        let conf = controller
            .data()
            .read_agent_conf()
            .expect("agent.conf reads")
            .expect("agent.conf exists");
        controller.assert_bootstrapped();
        assert!(
            controller
                .log()
                .contains("failpoint: pausing before the snapshot is written"),
            "silent {silent}: the snapshot writes were held back:\n{}",
            controller.log()
        );
        assert!(
            conf.bootstrap_complete,
            "silent {silent}: bootstrap said {:?} before agent.conf said bootstrap-complete",
            text(&controller.bootstrap)
        );
    }
}

/// Bootstrap waits for the `READY=1` its launcher forwards to bootstrap's own notification
/// socket, showing the launcher's status lines; a launcher that forwards nothing (the
/// failpoint: as one from before it forwarded them) is waited for through the API. Both
/// end on N+1, Ready, with bootstrap saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_waits_for_the_launchers_ready_and_through_the_api_when_it_says_nothing() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let upgraded = format!("upgraded {} -> {}", common::own(), next());
    for silent in [false, true] {
        let env: &[(&str, &str)] = if silent {
            &[("LOCKSTEPD_FAILPOINT_SILENT_LAUNCHER", "1")]
        } else {
            &[]
        };
        let args = [
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ];
        let controller = Controller::bootstrap(&args, env);
        controller.assert_bootstrapped();
        let said = text(&controller.bootstrap);
        assert_eq!(
            said.contains(
                "Note: lockstepd sent no notification within 10s; waiting through its API"
            ),
            silent,
            "silent {silent}: {said}"
        );
        assert!(said.contains(&upgraded), "silent {silent}: {said}");
        // Through the notifications, the launcher's status lines: N's switch, N+1's steps.
        if !silent {
            assert!(said.contains(" - restarting"), "{said}");
            assert!(
                said.contains(&format!(" - running-steps step 0/2 to {}", next())),
                "{said}"
            );
        }
        controller.wait_running(next(), READY_WITHIN).await;
    }
}

/// `--restart=exit`: the worker exits with status 3 and the launcher starts the new binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_by_exit_for_a_supervisor_also_lands_on_the_new_binary() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[("LOCKSTEPD_RESTART", "exit")],
    );
    controller.assert_bootstrapped();
    let exe = controller.serving_exe().expect("a worker runs");
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
    let log = controller.log();
    assert!(
        log.contains("must restart: an agent upgrade is available"),
        "{log}"
    );
    assert!(log.contains("worker restarts into a new binary"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_reports_upgrade_available_and_stays() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    let status = controller.status().await;
    assert_eq!(status["agent-version"], own().to_string());
    assert_eq!(
        status["upgrade-available"],
        next().to_string(),
        "{status:#}"
    );
    assert!(
        controller
            .serving_exe()
            .unwrap()
            .starts_with(controller.binary_dir(own()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_version_is_run_even_when_newer_ones_exist() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let pinned = own().to_string();
    let controller = Controller::bootstrap(
        &[
            "--agent-version",
            &pinned,
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
    );
    controller.assert_bootstrapped();
    let status = controller.status().await;
    assert_eq!(status["agent-version"], pinned);
    assert!(
        controller
            .serving_exe()
            .unwrap()
            .starts_with(controller.binary_dir(own()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_binary_is_run_as_built() {
    let controller = Controller::bootstrap(&["--build-agent"], &[]);
    controller.assert_bootstrapped();
    let exe = controller.serving_exe().unwrap();
    assert!(exe.starts_with(controller.binary_dir(own())), "{exe:?}");
    let installed = std::fs::read(exe).unwrap();
    assert_eq!(installed, std::fs::read(common::LOCKSTEPD).unwrap());
}

/// A copy of this build's lockstepd in a fresh directory, as an operator's build would be.
fn copy_of_lockstepd() -> (tempfile::TempDir, std::path::PathBuf) {
    let build = tempfile::tempdir().unwrap();
    let copy = build.path().join("lockstepd");
    std::fs::copy(common::LOCKSTEPD, &copy).unwrap();
    (build, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_binary_built_for_another_arch_is_refused_naming_both_arches_and_the_file() {
    let (_build, copy) = copy_of_lockstepd();
    let host = lockstep_agent::datadir::host_arch();
    // The ELF header's e_machine (bytes 18 and 19, little-endian on both hosts) says aarch64
    // on an amd64 host, x86_64 on any other.
    let (machine, foreign): (u16, &str) = if host == "amd64" {
        (183, "arm64")
    } else {
        (62, "amd64")
    };
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[18..20].copy_from_slice(&machine.to_le_bytes());
    std::fs::write(&copy, bytes).unwrap();
    let copy_text = copy.to_str().unwrap();

    let controller = Controller::bootstrap(&["--build-agent", "--agent-binary", copy_text], &[]);
    let said = text(&controller.bootstrap);
    assert!(!controller.bootstrap.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "local agent binary {copy_text}: it is built for {foreign}, but this host is {host}"
        )),
        "the refusal names the file and both arches: {said}"
    );
    // Refused before anything was written or started.
    assert!(!controller.data_dir.exists(), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_version_beside_a_local_binary_is_the_version_the_controller_runs_and_reports() {
    let (build, copy) = copy_of_lockstepd();
    std::fs::write(build.path().join("FORCE-VERSION"), format!("{}\n", next())).unwrap();
    let controller = Controller::bootstrap(
        &["--build-agent", "--agent-binary", copy.to_str().unwrap()],
        &[],
    );
    controller.assert_bootstrapped();
    let status = controller.status().await;
    assert_eq!(status["agent-version"], next().to_string(), "{status:#}");
    let full = controller.full_status().await;
    assert_eq!(full["model"]["version"], next().to_string(), "{full:#}");
    let exe = controller.serving_exe().unwrap();
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
    // What was recorded: the identity, and the size and sha256 of the operator's file.
    let binary = lockstep_agent::datadir::host_binary(next());
    let recorded = controller
        .data()
        .read_downloaded_tools(&binary)
        .unwrap()
        .unwrap();
    let bytes = std::fs::read(&copy).unwrap();
    assert_eq!(recorded.version, binary);
    assert_eq!(recorded.size_bytes, bytes.len() as u64);
    use sha2::Digest;
    assert_eq!(
        recorded.sha256.0,
        <[u8; 32]>::from(sha2::Sha256::digest(&bytes))
    );
    let said = String::from_utf8_lossy(&controller.bootstrap.stdout).into_owned();
    assert!(
        said.contains(&format!(
            "Its version {} is from the FORCE-VERSION beside {}",
            next(),
            copy.display()
        )),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_binary_is_refused_reported_and_agent_version_reset() {
    let mirror = Mirror::n_and_next(Published::Tampered);
    let source = mirror.source();
    let key = mirror.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[("LOCKSTEPD_STAGE_RETRY_SEC", "1")],
    );
    controller.assert_bootstrapped();
    let status = controller.status().await;
    assert_eq!(status["agent-version"], own().to_string());
    let full = controller.full_status().await;
    assert_eq!(
        full["model"]["version"],
        own().to_string(),
        "agent-version reset: {full:#}"
    );
    let said = String::from_utf8_lossy(&controller.bootstrap.stdout).into_owned();
    assert!(
        said.contains("upgrade failed") && said.contains("sha256"),
        "bootstrap reports the refusal and names the digest:\n{said}"
    );
    let failure = status["last-failure"].as_str().unwrap_or("");
    assert!(failure.contains("sha256"), "{status:#}");
}

async fn trial_falls_back(script: &'static str) {
    let mirror = Mirror::n_and_next(Published::Script(script));
    let source = mirror.source();
    let key = mirror.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[("LOCKSTEPD_WATCHDOG_SEC", "2")],
    );
    controller.assert_bootstrapped();
    let status = controller.status().await;
    assert_eq!(status["agent-version"], own().to_string());
    let exe = controller.serving_exe().unwrap();
    assert!(exe.starts_with(controller.binary_dir(own())), "{exe:?}");
    let full = controller.full_status().await;
    assert_eq!(full["model"]["version"], own().to_string(), "{full:#}");
    let said = String::from_utf8_lossy(&controller.bootstrap.stdout).into_owned();
    assert!(
        said.contains("did not come up"),
        "bootstrap reports why:\n{said}"
    );
    let failure = status["last-failure"].as_str().unwrap_or("");
    assert!(failure.contains("did not come up"), "{status:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_binary_that_exits_at_once_falls_back_to_the_previous_one() {
    trial_falls_back("#!/bin/sh\nexit 1\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_binary_that_hangs_falls_back_to_the_previous_one() {
    trial_falls_back("#!/bin/sh\nexec sleep 600\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_controller_from_ready_with_a_watcher_that_loses_nothing() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    let client = controller.client();
    let mut watcher = client.watch();
    let first = watcher.next(Duration::from_secs(30)).await.unwrap();
    let mut revisions: Vec<u64> = first.iter().map(|d| d.revision.0).collect();

    let dry_run = controller.run(&["upgrade-controller", "--dry-run"]);
    assert!(
        String::from_utf8_lossy(&dry_run.stdout).contains(&next().to_string()),
        "{}",
        text(&dry_run)
    );
    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    // Deploy through the restart: the deploy waits through the upgrade.
    let bundle = bundle_file(controller.dir.path());
    let deploy = std::process::Command::new(common::LOCKSTEP)
        .arg("--data-dir")
        .arg(&controller.data_dir)
        .args(["deploy", bundle.to_str().unwrap()])
        .output();
    controller.wait_running(next(), READY_WITHIN).await;
    let deploy = deploy.unwrap();
    assert!(deploy.status.success(), "{}", text(&deploy));
    let exe = controller.serving_exe().unwrap();
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");

    let mut applications = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    while applications.len() < 4 {
        for delta in watcher.next(Duration::from_secs(60)).await.unwrap() {
            revisions.push(delta.revision.0);
            let entity = &delta.delta[2];
            let id = entity["name"]
                .as_str()
                .or(entity["key"].as_str())
                .or(entity["id"].as_str());
            assert!(
                seen.insert((
                    delta.revision.0,
                    delta.delta[0].to_string(),
                    id.map(str::to_owned)
                )),
                "delivered twice: {delta:?}"
            );
            if delta.delta[0] == "application" {
                applications.insert(delta.delta[2]["name"].as_str().unwrap().to_owned());
            }
        }
    }
    assert!(
        revisions.windows(2).all(|pair| pair[0] <= pair[1]),
        "in order: {revisions:?}"
    );
    let status = controller.status().await;
    assert_eq!(status["agent-version"], next().to_string());
}

/// The phases the kill test kills the serving process in, each held long enough to be seen
/// and acted on: `checking-agent-version` by a mirror whose metadata answers are slow,
/// `upgrading` by the download, verification and unpacking of a debug binary, and
/// `running-steps` (N+1's) by a pause inside the database step's transaction.
const KILLED_IN: [&str; 3] = ["checking-agent-version", "upgrading", "running-steps"];

/// Kill -9 of the serving process once in each phase of [`KILLED_IN`], N+1's database step
/// killed inside its transaction: bootstrap still completes, the controller converges Ready
/// on N+1, and each database step is checkpointed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_checking_upgrading_and_running_steps_converges_ready_with_database_steps_once()
 {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let served = common::http_mirror::HttpMirror::serve(mirror.path(), Duration::from_millis(400));
    let source = served.tools_url();
    let key = mirror.key();
    // Bootstrap without waiting: the test kills while it goes.
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("controller");
    let mut bootstrap = std::process::Command::new(common::LOCKSTEP)
        .arg("--data-dir")
        .arg(&data_dir)
        .env("JUJU_DATA", common::juju_data_beside(&data_dir))
        .args([
            "bootstrap",
            "--api-port",
            "0",
            "--timeout",
            "240",
            "--auto-upgrade",
            // `upgrading` is held by the controller's own download of N+1.
            "--no-fetch-ahead",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ])
        .env(
            lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
            "1500",
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let controller = Controller {
        dir,
        data_dir,
        bootstrap: std::process::Command::new("true").output().unwrap(),
        children: std::sync::Mutex::default(),
    };
    const PAUSING: &str = "failpoint: pausing inside the step's transaction";
    let mut killed = std::collections::BTreeSet::new();
    let mut client = None;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(200) {
        if let Ok(Some(_)) = bootstrap.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let Some(worker) = controller.worker_pid() else {
            continue;
        };
        if !controller.data_dir.join("controller.yaml").exists() {
            continue;
        }
        // The phase the serving process is in now (Upgrade.Status is served in every phase).
        let Ok(Ok(status)) = tokio::time::timeout(
            Duration::from_millis(500),
            client.get_or_insert_with(|| controller.client()).call(
                "Upgrade",
                1,
                "Status",
                json!({}),
                Duration::from_millis(500),
            ),
        )
        .await
        else {
            continue;
        };
        let phase = status["phase"].as_str().unwrap_or("").to_owned();
        if !KILLED_IN.contains(&phase.as_str()) || killed.contains(&phase) {
            continue;
        }
        // In running-steps, only once the database step is inside its transaction (its
        // pause logged, its checkpoint not yet counted).
        if phase == "running-steps" && (status["step"] != 0 || !controller.log().contains(PAUSING))
        {
            continue;
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(worker as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        killed.insert(phase);
    }
    let output = bootstrap.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}\nkilled in {killed:?}\nlog:\n{}",
        text(&output),
        controller.log()
    );
    let wanted: std::collections::BTreeSet<String> =
        KILLED_IN.iter().map(|phase| phase.to_string()).collect();
    assert_eq!(killed, wanted, "a kill in every phase named");
    controller.wait_ready(READY_WITHIN).await;
    let status = controller.status().await;
    assert_eq!(status["phase"], "ready", "{status:#}");
    assert_eq!(
        status["agent-version"],
        next().to_string(),
        "killed in {killed:?}"
    );
    let exe = controller.serving_exe().expect("a worker runs");
    assert!(exe.starts_with(controller.binary_dir(next())), "{exe:?}");
    let checkpoints = common::checkpoint_events(&controller.data());
    for (step, count) in &checkpoints {
        assert_eq!(
            *count, 1,
            "{step} checkpointed {count} times (killed in {killed:?})"
        );
    }
    let step = format!(
        "{}@{}",
        lockstep_agent::steps::RECORD_AGENT_BINARIES,
        next()
    );
    assert!(checkpoints.contains_key(&step), "{checkpoints:?}");
    // The kill in running-steps landed inside the step's transaction, which then ran again:
    // paused at least twice, committed once.
    let pauses = controller.log().matches(PAUSING).count();
    assert!(
        pauses >= 2,
        "{step} paused {pauses} times:\n{}",
        controller.log()
    );
}

/// Under systemd: READY=1 once the API is fully available, STATUS= lines on the way; and a
/// clean stop on SIGTERM (`kill-controller`) that leaves no process behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_notify_ready_and_status_then_a_clean_sigterm_stop() {
    use std::os::linux::net::SocketAddrExt;
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let stop = controller.run(&["kill-controller"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(
        controller.launcher_pid().is_none(),
        "the pid file is removed on a clean stop"
    );

    let name = format!("lockstep-e2e-notify-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = std::os::unix::net::UnixDatagram::bind_addr(&address).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let notify = format!("@{name}");
    let launcher = controller.start(&[("NOTIFY_SOCKET", notify.as_str())]);
    let worker = controller.worker_pid();
    let mut messages = Vec::new();
    let mut buffer = [0u8; 4096];
    while !messages.iter().any(|m: &String| m.contains("READY=1")) {
        let length = socket
            .recv(&mut buffer)
            .expect("a notification within 60 s");
        messages.push(String::from_utf8_lossy(&buffer[..length]).into_owned());
    }
    assert!(
        messages.iter().any(|m| m.starts_with("STATUS=")),
        "status lines before READY: {messages:?}"
    );
    let stop = controller.run(&["kill-controller"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(
        !lockstep_agent::process::alive(launcher),
        "launcher {launcher} stopped"
    );
    if let Some(worker) = worker {
        assert!(
            !lockstep_agent::process::alive(worker),
            "worker {worker} stopped"
        );
    }
    assert!(
        controller.log().contains("worker stopped"),
        "the worker stopped cleanly, not killed:\n{}",
        controller.log()
    );
}

/// A port in use is refused before anything is written, so bootstrap can be run again.
#[test]
fn bootstrap_refuses_a_port_in_use_and_writes_nothing() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("controller");
    let output = lockstep(&data_dir, &["bootstrap", "--api-port", &port], &[]);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&format!("--api-port {port}")),
        "{}",
        text(&output)
    );
    assert!(!data_dir.exists(), "nothing was written");
}

/// A new binary that ran its database steps and then cannot reach Ready is held, not rolled
/// back (rolling back after database steps is unsafe), and bootstrap says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_binary_failing_after_its_database_steps_is_held_not_rolled_back() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
            "--timeout",
            "20",
        ],
        &[
            (lockstep_agent::daemon::failpoints::FAIL_HOST_STEPS, "1"),
            ("LOCKSTEPD_TRIAL_READY_TIMEOUT_SEC", "3"),
        ],
    );
    let said = text(&controller.bootstrap);
    assert!(!controller.bootstrap.status.success(), "{said}");
    assert!(
        said.contains("steps-failed"),
        "bootstrap names the phase: {said}"
    );
    assert!(said.contains("held"), "and says it is held: {said}");
    // The switch stands: the new binary's database step ran once, and tools/machine-0
    // still names the new binary.
    let data = controller.data();
    assert_eq!(
        data.current_binary("machine-0").unwrap(),
        Some(lockstep_agent::datadir::host_binary(next()))
    );
    let conf = data.read_agent_conf().unwrap().unwrap();
    assert!(
        conf.trial
            .as_ref()
            .is_some_and(|trial| trial.past_database_steps),
        "{conf:?}"
    );
    let checkpoints = common::checkpoint_events(&data);
    let step = format!(
        "{}@{}",
        lockstep_agent::steps::RECORD_AGENT_BINARIES,
        next()
    );
    assert_eq!(checkpoints.get(&step), Some(&1), "{checkpoints:?}");
}

/// `lockstep watch` streams deltas as JSON lines; `lockstep metadata generate-key` makes a
/// key pair and `lockstep metadata generate-agent-binaries --sign-key` a mirror's signed
/// metadata, which bootstrap then reads with `--metadata-key`, as the README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_json_lines_and_the_metadata_commands_make_a_usable_signed_mirror() {
    let mirror = tempfile::tempdir().unwrap();
    let released = mirror.path().join("tools/released");
    std::fs::create_dir_all(&released).unwrap();
    let binary = lockstep_agent::datadir::host_binary(own());
    lockstep_agent::unpack::pack_tgz(
        &[("lockstepd", std::path::Path::new(common::LOCKSTEPD), 0o755)],
        &released.join(format!("juju-{binary}.tgz")),
    )
    .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let keys_dir = keys.path().join("keys");
    let made = lockstep(
        mirror.path(),
        &[
            "metadata",
            "generate-key",
            "--output",
            keys_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(made.status.success(), "{}", text(&made));
    let secret = keys_dir.join("metadata-signing-key.asc");
    let public = keys_dir.join("metadata-public-key.asc");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the secret key is the operator's alone");
    // Never over an existing key.
    let again = lockstep(
        mirror.path(),
        &[
            "metadata",
            "generate-key",
            "--output",
            keys_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not replacing a signing key"),
        "{}",
        text(&again)
    );
    let generate = lockstep(
        mirror.path(),
        &[
            "metadata",
            "generate-agent-binaries",
            "-d",
            mirror.path().to_str().unwrap(),
            "--sign-key",
            secret.to_str().unwrap(),
        ],
        &[],
    );
    assert!(generate.status.success(), "{}", text(&generate));
    assert!(mirror.path().join("tools/streams/v1/index2.json").is_file());
    assert!(
        mirror
            .path()
            .join("tools/streams/v1/index2.sjson")
            .is_file()
    );
    let key = public.to_str().unwrap().to_owned();

    let source = mirror.path().to_str().unwrap().to_owned();
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    let said = String::from_utf8_lossy(&controller.bootstrap.stdout).into_owned();
    assert!(
        said.contains(&controller.binary_dir(own()).display().to_string()),
        "{said}"
    );

    // The first batch is the whole state: the model and machine 0.
    let watch = controller.run(&["watch", "--limit", "2"]);
    assert!(watch.status.success(), "{}", text(&watch));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&watch.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", text(&watch));
    assert!(
        lines
            .iter()
            .all(|line| line["revision"].is_u64() && line["delta"].is_array())
    );
}

/// Every file of `root` that is not private to the agent's user, with its mode: the CA
/// certificate may be read by anyone (0644), executables under `tools/` keep their
/// execute bits; everything else has no group or other bits, and no directory is writable
/// by others.
fn not_private(root: &std::path::Path) -> Vec<(String, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            let mode = metadata.mode() & 0o7777;
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            let allowed = if metadata.is_dir() {
                pending.push(path.clone());
                mode & 0o022 == 0
            } else if metadata.file_type().is_symlink() {
                true
            } else if relative == "ca.pem" {
                mode == 0o644
            } else if relative.starts_with("tools/") && mode & 0o100 != 0 {
                mode & 0o022 == 0
            } else {
                mode & 0o077 == 0
            };
            if !allowed {
                found.push((relative, mode));
            }
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_is_private_after_bootstrap_and_after_an_upgrade() {
    use std::os::unix::fs::MetadataExt;
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (source, key) = (mirror.source(), mirror.key());
    // Bootstrapped on this build, with the next patch published but not taken.
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    let root = controller.data_dir.clone();
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().mode() & 0o7777;
    assert_eq!(mode(&root), 0o700, "the data directory");
    assert_eq!(not_private(&root), [], "after bootstrap");
    // The upgrade downloads, unpacks and installs the next binary, re-executes into it
    // and writes the store and logs on the way.
    let output = controller.run(&["upgrade-controller", "--agent-version", &next().to_string()]);
    assert!(output.status.success(), "{}", text(&output));
    controller
        .wait_running(next(), Duration::from_secs(120))
        .await;
    controller.wait_ready(Duration::from_secs(60)).await;
    assert_eq!(mode(&root), 0o700, "the data directory");
    assert_eq!(not_private(&root), [], "after the upgrade");
    assert!(
        controller.binary_dir(next()).join("lockstepd").is_file(),
        "the upgrade installed the next binary"
    );
}
