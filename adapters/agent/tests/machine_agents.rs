//! Machine agents as real processes (issue 20): `lockstep add-machine` starts a `lockstepd`
//! machine agent per machine on this host, each with its own data directory, reaching the
//! controller only through its API; `lockstep upgrade-controller` moves the controller
//! first and then every agent, each downloading the new binary from its controller.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use lockstep_agent::datadir::DataDir;
use lockstep_core::Version;
use serde_json::Value;

use crate::common::{
    self, Controller, Mirror, Published, agents_download_windows, most_at_once, next, own, text,
};

/// How long a controller may take to reach Ready (through an upgrade included).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The machines of a status that run units (not controllers): `(id, entry)`.
pub(crate) fn host_machines(status: &Value) -> Vec<(String, Value)> {
    status["machines"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, machine)| {
            let jobs = machine["jobs"].as_array().cloned().unwrap_or_default();
            jobs.iter().any(|job| job == "JobHostUnits")
                && !jobs.iter().any(|job| job == "JobManageModel")
        })
        .map(|(id, machine)| (id.clone(), machine.clone()))
        .collect()
}

/// Each machine agent's log, for a failure's message.
pub(crate) fn agent_logs(controller: &Controller) -> String {
    controller
        .data()
        .machine_agent_dirs()
        .iter()
        .map(|dir| {
            let log =
                std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            format!(
                "--- {}:\n{}",
                dir.root().display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `count` host machines report their agent `started` on `version`, and returns
/// that status (`lockstep status --format json`, as an operator reads it).
pub(crate) async fn wait_for_agents(
    controller: &Controller,
    count: usize,
    version: Version,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let output = controller.run(&["status", "--format", "json"]);
        let status: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        let machines = host_machines(&status);
        let on_version = machines
            .iter()
            .filter(|(_, machine)| {
                machine["agent-status"]["status"] == "started"
                    && machine["agent-status"]["version"] == version.to_string()
            })
            .count();
        if machines.len() == count && on_version == count {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{on_version} of {count} machine agents started on {version} within {within:?}:\n{status:#}\n{}\nagents:\n{}",
            text(&output),
            agent_logs(controller)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A controller bootstrapped from the mirror at `source` (signed by `key`), with `count`
/// machine agents added by `lockstep add-machine` and started on N. Returns it and the
/// status that shows them started.
async fn with_agents(source: &str, key: &str, count: usize) -> (Controller, Value) {
    let controller =
        Controller::bootstrap(&["--metadata-source", source, "--metadata-key", key], &[]);
    controller.assert_bootstrapped();
    let add = controller.run(&["add-machine", "-n", &count.to_string()]);
    assert!(add.status.success(), "{}", text(&add));
    let status = wait_for_agents(&controller, count, own(), Duration::from_secs(120)).await;
    (controller, status)
}

/// The binary directory the worker of the machine agent in `dir` runs from.
fn serving_exe(dir: &DataDir) -> Option<std::path::PathBuf> {
    let launcher = common::pid_in(&dir.pid_path())?;
    let worker = lockstep_agent::cli::demo::worker_pid(launcher)?;
    lockstep_agent::cli::demo::exe_of(worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_machine_starts_agents_that_follow_upgrade_controller_to_the_new_version() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (controller, status) = with_agents(&mirror.source(), &mirror.key(), 5).await;
    // Jobs from the machine's role (host-machine) and the model's capabilities (whatever
    // this host's provider reported, as stored), by the core's table.
    let store = lockstep_store::SqliteStore::open(
        controller.data().store_path(),
        lockstep_store::OpenMode::ReadOnly,
    )
    .unwrap();
    let model = (&store as &dyn lockstep_store::Store)
        .load_model()
        .unwrap()
        .expect("a model");
    let expected: Vec<String> = lockstep_store::Machine::with_roles(
        "any",
        lockstep_core::Roles::of(&[lockstep_core::Role::HostMachine]),
    )
    .reported_jobs(
        &lockstep_core::jobs::JobTable::lockstep(),
        &model.capabilities,
    )
    .unwrap()
    .iter()
    .map(|job| job.as_str().to_owned())
    .collect();
    assert!(
        expected.contains(&"JobHostUnits".to_owned()),
        "{expected:?}"
    );
    for (id, machine) in host_machines(&status) {
        assert_eq!(
            machine["jobs"],
            serde_json::json!(expected),
            "machine {id}: {machine:#}"
        );
    }
    let dirs = controller.data().machine_agent_dirs();
    assert_eq!(dirs.len(), 5, "{dirs:?}");
    let store_file = controller.data().store_path();
    for dir in &dirs {
        // Its own agent.conf, private, with the password the controllers keep only hashed.
        let mode = std::fs::metadata(dir.agent_conf_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{}", dir.agent_conf_path().display());
        let conf = dir.read_agent_conf().unwrap().unwrap();
        assert!(!conf.apipassword.is_empty());
        assert!(conf.api_listen.is_empty(), "a machine agent serves no API");
        let store = std::fs::read(&store_file).unwrap();
        assert!(
            !store
                .windows(conf.apipassword.len())
                .any(|window| window == conf.apipassword.as_bytes()),
            "the store file holds machine agent {}'s password in plain text",
            conf.tag
        );
        // Everything through the API: no store of its own, none of the controller's files
        // open in its processes, and no connection but to the controller's API.
        assert!(!dir.store_path().exists(), "{}", dir.root().display());
        let launcher = common::pid_in(&dir.pid_path()).expect("a launcher pid");
        let worker = lockstep_agent::cli::demo::worker_pid(launcher).expect("a worker");
        let api: std::net::SocketAddr = controller.controller_file().api_endpoints[0]
            .parse()
            .unwrap();
        let peers: Vec<std::net::SocketAddr> = [launcher, worker]
            .into_iter()
            .flat_map(common::tcp_peers)
            .collect();
        assert!(
            peers.iter().all(|peer| *peer == api),
            "machine agent {} connects to {peers:?}; the controller's API is {api}",
            conf.tag
        );
        assert!(peers.contains(&api), "{}: no connection to {api}", conf.tag);
        for pid in [launcher, worker] {
            for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .flatten()
            {
                if let Ok(target) = std::fs::read_link(fd.path()) {
                    assert!(
                        !target.starts_with(store_file.parent().unwrap())
                            || target.starts_with(dir.root()),
                        "machine agent {} (pid {pid}) has {} open",
                        conf.tag,
                        target.display()
                    );
                }
            }
        }
    }

    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), READY_WITHIN).await;
    let status = wait_for_agents(&controller, 5, next(), Duration::from_secs(120)).await;
    assert_eq!(
        controller.status().await["agent-version"],
        next().to_string(),
        "{status:#}"
    );
    // Each agent reported its new binary (`Upgrader.SetTools`) once back, on the machine the
    // controllers-first rule reads: read from the store file itself.
    let store = lockstep_store::SqliteStore::open(
        controller.data().store_path(),
        lockstep_store::OpenMode::ReadOnly,
    )
    .unwrap();
    let mut machines = Vec::new();
    lockstep_store::Store::snapshot(&store, &mut |tx| {
        machines = tx.machines()?;
        Ok(())
    })
    .unwrap();
    let next_binary = lockstep_agent::datadir::host_binary(next());
    assert_eq!(machines.len(), 6, "{machines:#?}");
    for machine in &machines {
        assert_eq!(
            machine.agent_binary.as_ref(),
            Some(&next_binary),
            "{machines:#?}"
        );
    }
    for dir in &dirs {
        let exe = serving_exe(dir).expect("the machine agent's worker runs");
        assert!(
            exe.starts_with(dir.binary_dir(&lockstep_agent::datadir::host_binary(next()))),
            "{} runs {}",
            dir.root().display(),
            exe.display()
        );
        // Downloaded from its controller's tools endpoint, verified.
        let downloaded = dir
            .read_downloaded_tools(&lockstep_agent::datadir::host_binary(next()))
            .unwrap()
            .expect("downloaded-tools.txt");
        assert!(
            downloaded.url.contains("/tools/"),
            "downloaded from {}",
            downloaded.url
        );
        assert!(
            downloaded.url.starts_with("https://127.0.0.1:"),
            "downloaded from {}",
            downloaded.url
        );
    }
}

/// Kills a machine agent's launcher and worker with SIGKILL.
fn kill_9(dir: &DataDir) {
    let launcher = common::pid_in(&dir.pid_path()).expect("a launcher pid");
    let worker = lockstep_agent::cli::demo::worker_pid(launcher);
    for pid in std::iter::once(launcher).chain(worker) {
        let target = rustix::process::Pid::from_raw(pid as i32).unwrap();
        let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
    }
}

/// The agent status `lockstep status` shows for machine `id`.
fn agent_status_of(controller: &Controller, id: &str) -> Value {
    let output = controller.run(&["status", "--format", "json"]);
    let status: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    status["machines"][id]["agent-status"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_agent_killed_9_shows_down_and_agents_away_during_an_upgrade_catch_up_when_started()
 {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (controller, _) = with_agents(&mirror.source(), &mirror.key(), 2).await;
    let dirs = controller.data().machine_agent_dirs();
    let (killed, stopped) = (&dirs[0], &dirs[1]);
    let killed_id = killed
        .read_agent_conf()
        .unwrap()
        .unwrap()
        .tag
        .trim_start_matches("machine-")
        .to_owned();

    // Killed -9: it says nothing more, and within AGENT_DOWN_AFTER of its last report
    // (which was at most one interval before the kill) the controllers show it down.
    kill_9(killed);
    let killed_at = Instant::now();
    let bound = lockstep_transport::facade::machiner::AGENT_DOWN_AFTER;
    loop {
        let status = agent_status_of(&controller, &killed_id);
        if status["status"] == "down" {
            assert_eq!(
                status["info"], "agent is not communicating with the server",
                "{status:#}"
            );
            break;
        }
        // The bound, and time for one `lockstep status` on a busy machine.
        assert!(
            killed_at.elapsed() < bound + Duration::from_secs(15),
            "machine {killed_id} not shown down {:?} after its agent was killed: {status:#}",
            killed_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The other one is stopped cleanly; neither runs during the upgrade.
    let launcher = common::pid_in(&stopped.pid_path()).expect("a launcher pid");
    lockstep_agent::cli::demo::stop_daemon(launcher);

    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), READY_WITHIN).await;
    for dir in [killed, stopped] {
        assert_eq!(
            dir.current_binary(&dir.read_agent_conf().unwrap().unwrap().tag)
                .unwrap(),
            Some(lockstep_agent::datadir::host_binary(own())),
            "{} moved while it was not running",
            dir.root().display()
        );
    }
    // Started again, each learns the new version from its controller and catches up.
    for dir in [killed, stopped] {
        lockstep_agent::cli::bootstrap::spawn_daemon(dir, &[]).unwrap();
    }
    wait_for_agents(&controller, 2, next(), Duration::from_secs(120)).await;
}

/// The fleet the issue asks `.ci/run` to upgrade together (the benchmark runs fifty).
const FLEET: usize = 20;

/// At most this many agents' downloads at once (`max-agent-downloads`), well below the
/// fleet, so that most agents wait in the controller's queue (or are told "busy").
const DOWNLOADS_AT_ONCE: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_machine_agents_upgrade_after_their_controller_which_fetches_the_binary_once() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let served = common::http_mirror::HttpMirror::serve(mirror.path(), Duration::ZERO);
    let (controller, _) = with_agents(&served.tools_url(), &mirror.key(), FLEET).await;
    let set = controller
        .client()
        .call(
            "ModelConfig",
            3,
            "ModelSet",
            serde_json::json!({"config": {"max-agent-downloads": DOWNLOADS_AT_ONCE}}),
            Duration::from_secs(60),
        )
        .await;
    assert!(set.is_ok(), "{set:?}");

    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), READY_WITHIN).await;
    wait_for_agents(&controller, FLEET, next(), Duration::from_secs(300)).await;

    // One fetch from the mirror for the controller and its twenty agents: the controller's
    // own staging and its tools endpoint share one cache entry.
    let next_binary = lockstep_agent::datadir::host_binary(next()).to_string();
    assert_eq!(
        served.tarball_requests(&next_binary),
        1,
        "the mirror served {next_binary} more than once"
    );
    // Each agent downloaded from its controller. (Past the bound a request waits in the
    // controller's queue, or is told busy once the queue is full: `tests/tools.rs` of the
    // transport shows both; here what counts is the bound, below.)
    for dir in controller.data().machine_agent_dirs() {
        let downloaded = dir
            .read_downloaded_tools(&lockstep_agent::datadir::host_binary(next()))
            .unwrap()
            .expect("downloaded-tools.txt");
        assert!(
            downloaded.url.starts_with("https://127.0.0.1:"),
            "{}: downloaded from {}",
            dir.root().display(),
            downloaded.url
        );
    }
    // Counted at the agents, not by the controller's gauge: each agent logged when it
    // received its first and its last byte (the host's monotonic clock, shared by every
    // process), and at no moment were more than DOWNLOADS_AT_ONCE agents between the two.
    // Sound, not lucky: an agent hangs up only after it logged its last byte, and the
    // controller frees a slot only once the agent hung up, so an agent's window lies
    // inside its slot.
    let windows = agents_download_windows(&controller.data());
    assert_eq!(windows.len(), FLEET, "{windows:?}");
    let most = most_at_once(&windows);
    assert!(
        (1..=DOWNLOADS_AT_ONCE as usize).contains(&most),
        "{most} agents were receiving the binary at once, with max-agent-downloads \
         {DOWNLOADS_AT_ONCE}: {windows:?}"
    );
}

#[test]
fn most_at_once_counts_overlapping_windows() {
    assert_eq!(most_at_once(&[]), 0);
    assert_eq!(most_at_once(&[(1, 5), (6, 9)]), 1);
    assert_eq!(most_at_once(&[(1, 5), (5, 9)]), 1);
    assert_eq!(most_at_once(&[(1, 5), (2, 9), (3, 4)]), 3);
    assert_eq!(most_at_once(&[(1, 5), (2, 3), (4, 9)]), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_agent_killed_9_in_the_middle_of_a_slow_download_converges_when_started() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let (controller, _) = with_agents(&mirror.source(), &mirror.key(), 1).await;

    // The agent reaches its controller through a slow link: stopped, pointed at a proxy,
    // started again.
    let dir = controller.data().machine_agent_dirs().remove(0);
    let launcher = common::pid_in(&dir.pid_path()).expect("a launcher pid");
    lockstep_agent::cli::demo::stop_daemon(launcher);
    let mut conf = dir.read_agent_conf().unwrap().unwrap();
    let api: std::net::SocketAddr = conf.apiaddresses[0].parse().unwrap();
    let proxy = common::proxy::Proxy::start(api);
    conf.apiaddresses = vec![proxy.addr().to_string()];
    dir.write_agent_conf(&conf).unwrap();
    lockstep_agent::cli::bootstrap::spawn_daemon(&dir, &[]).unwrap();
    wait_for_agents(&controller, 1, own(), Duration::from_secs(60)).await;
    // 1 MB/s: the test binary's tarball takes many seconds.
    proxy.throttle(1_000_000);

    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), READY_WITHIN).await;
    // Killed once the download of N+1 is under way: its attempt logged and 2 MB more
    // through the link since.
    let log_path = dir.logs_dir().join("lockstepd.log");
    let next_binary = lockstep_agent::datadir::host_binary(next());
    let deadline = Instant::now() + Duration::from_secs(120);
    let before = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("download attempt") && log.contains(&next_binary.to_string()) {
            break proxy.forwarded_bytes();
        }
        assert!(
            Instant::now() < deadline,
            "the agent never started downloading {next_binary}:\n{}",
            agent_logs(&controller)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    while proxy.forwarded_bytes() < before + 2_000_000 {
        assert!(
            Instant::now() < deadline,
            "the download made no progress:\n{}",
            agent_logs(&controller)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill_9(&dir);
    assert!(
        dir.read_downloaded_tools(&next_binary).unwrap().is_none(),
        "N+1 installed although its download was cut short"
    );
    assert_eq!(
        dir.current_binary(&conf.tag).unwrap(),
        Some(lockstep_agent::datadir::host_binary(own()))
    );

    // Started again on a fast link: it downloads N+1 whole, verified, and switches.
    proxy.throttle(0);
    lockstep_agent::cli::bootstrap::spawn_daemon(&dir, &[]).unwrap();
    wait_for_agents(&controller, 1, next(), Duration::from_secs(120)).await;
    let downloaded = dir
        .read_downloaded_tools(&next_binary)
        .unwrap()
        .expect("downloaded-tools.txt");
    assert!(
        downloaded.url.contains(&proxy.addr().to_string()),
        "{}",
        downloaded.url
    );
    assert_eq!(
        dir.current_binary(&conf.tag).unwrap(),
        Some(next_binary.clone())
    );
}

/// A controller bootstrapped with `--provisioner local` starts an agent itself for every
/// machine any client records: two added by python-libjuju's `Model.add_machine()`
/// (`MachineManager.AddMachines`) and one by `lockstep add-machine`, which only records it
/// and waits. Each agent runs under the controller's data dir with its own credential
/// (claimed once: its `agent.conf`'s password is the stored hash's), reports `started` on
/// N, and follows `upgrade-controller` to N+1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_provisioner_starts_agents_for_machines_any_client_adds_and_they_follow_the_upgrade()
 {
    let python = tokio::task::spawn_blocking(common::python::python)
        .await
        .unwrap();
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let controller = Controller::bootstrap(
        &[
            "--metadata-source",
            &mirror.source(),
            "--metadata-key",
            &mirror.key(),
            "--provisioner",
            "local",
        ],
        &[],
    );
    controller.assert_bootstrapped();
    let conf = controller.data().read_agent_conf().unwrap().unwrap();
    assert_eq!(
        conf.provisioner,
        lockstep_agent::datadir::Provisioner::Local
    );

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop/libjuju_add_machine.py");
    let juju_data = common::juju_data_beside(&controller.data_dir);
    let home = controller.data_dir.with_file_name("home");
    std::fs::create_dir_all(&home).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .arg("2")
            .env("JUJU_DATA", juju_data)
            .env("HOME", home)
            .env_remove("XDG_DATA_HOME")
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let added: Value = serde_json::from_str(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or(""),
    )
    .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));
    assert_eq!(added["added"].as_array().map(Vec::len), Some(2), "{added}");

    let add = controller.run(&["add-machine"]);
    assert!(add.status.success(), "{}", text(&add));
    assert!(
        String::from_utf8_lossy(&add.stdout).contains("started by the controller's provisioner"),
        "{}",
        text(&add)
    );
    wait_for_agents(&controller, 3, own(), Duration::from_secs(120)).await;

    // One agent per machine, each started by the controller's worker, and each machine's
    // stored credential is the hash of the password in its agent's agent.conf.
    let dirs = controller.data().machine_agent_dirs();
    assert_eq!(dirs.len(), 3, "{dirs:?}");
    let log = controller.log();
    assert_eq!(
        log.matches("started machine agent").count(),
        3,
        "the controller's log:\n{log}"
    );
    let store = lockstep_store::SqliteStore::open(
        controller.data().store_path(),
        lockstep_store::OpenMode::ReadOnly,
    )
    .unwrap();
    for dir in &dirs {
        let conf = dir.read_agent_conf().unwrap().unwrap();
        let mut hash = None;
        lockstep_store::Store::snapshot(&store, &mut |tx| {
            hash = tx.agent_password_hash(&conf.tag)?;
            Ok(())
        })
        .unwrap();
        let hash = hash.unwrap_or_else(|| panic!("{} has no credential", conf.tag));
        assert!(
            lockstep_transport::logins::Verifier::default()
                .verify(conf.apipassword.as_str(), &hash),
            "{}'s agent.conf does not hold the password of its stored credential",
            conf.tag
        );
        assert!(common::pid_in(&dir.pid_path()).is_some_and(lockstep_agent::process::alive));
    }

    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(next(), READY_WITHIN).await;
    wait_for_agents(&controller, 3, next(), Duration::from_secs(120)).await;
    // Provisioned once each: the upgrade started no further agent.
    assert_eq!(controller.data().machine_agent_dirs().len(), 3);
    assert_eq!(controller.log().matches("started machine agent").count(), 3);
}
