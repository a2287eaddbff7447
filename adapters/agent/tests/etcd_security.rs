//! Who may reach a controller's etcd store, with real `lockstep` and `lockstepd` processes
//! (feature `etcd`; `cargo test -p lockstep-agent --features etcd --test integration
//! etcd_security::`):
//!
//! - a plain http endpoint off loopback is refused by `lockstep bootstrap`, by `lockstepd`
//!   (its flags and `agent.conf`) and by `enable-ha`, naming the endpoint and
//!   `--etcd-insecure`, before anything connects (the endpoints are TEST-NET addresses:
//!   nothing is ever sent to them);
//! - `--etcd-insecure` is recorded in `agent.conf`, warned about at every start and shown by
//!   `lockstep status`;
//! - etcd's user authentication against a real etcd with it enabled: the right user
//!   bootstraps a controller that reaches Ready and writes its password nowhere, and the
//!   controllers `enable-ha` adds log in as the same user; a wrong
//!   password is refused naming the user and never the password, at bootstrap and at a
//!   daemon's start; no user is refused naming the flags; a password file others can read,
//!   or another user owns, is refused naming the file and its mode.
//!
//! Every process started here is stopped by its pid.

#![allow(clippy::print_stderr)]

use crate::common;
use crate::etcd_cluster;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Controller, lockstep, text};
use etcd_cluster::EtcdCluster;
use serde_json::Value;

/// Addresses of TEST-NET-1 and the IPv6 documentation range, and a name under `.example`:
/// refused before any connection, so nothing is ever sent there.
const OFF_LOOPBACK: [&str; 3] = [
    "http://192.0.2.1:2379",
    "192.0.2.1:2379",
    "http://[2001:db8::1]:2379",
];

const USER: &str = "lockstep";
const PASSWORD: &str = "the-right-password-7f3a";
const WRONG: &str = "a-wrong-password-91c2";

/// How long a refused command may run before the test kills it (a refusal takes well under
/// a second; this only keeps a broken build from hanging the suite).
const REFUSED_WITHIN: Duration = Duration::from_secs(60);

/// Runs `command` to its end, or kills it by pid after `within` and fails.
fn run_bounded(command: &mut Command, within: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let pid = child.id();
    let started = Instant::now();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    loop {
        if let Ok(output) = receiver.try_recv() {
            return output.expect("the command's output");
        }
        if started.elapsed() > within {
            if let Some(target) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
            }
            panic!("{command:?} still ran after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lockstep bootstrap` in a new temporary directory: the output and the data dir (which
/// a refused bootstrap must not have created).
fn bootstrap_refused(args: &[&str]) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("controller");
    let mut command = Command::new(common::LOCKSTEP);
    command
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["bootstrap", "--api-port", "0", "--timeout", "60"])
        .args(args)
        .env("JUJU_DATA", common::juju_data_beside(&data_dir));
    let output = run_bounded(&mut command, REFUSED_WITHIN);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        !data_dir.exists(),
        "a refused bootstrap wrote {}",
        data_dir.display()
    );
    (dir, data_dir, text(&output))
}

/// The message a refused endpoint gets, naming it and the flag.
fn assert_names_endpoint_and_flag(output: &str, endpoint: &str) {
    assert!(
        output.contains(&format!(
            "etcd endpoint \"{endpoint}\" is plain http to a host that is not loopback"
        )) && output.contains("--etcd-insecure"),
        "{output}"
    );
}

/// A 1-member etcd with authentication on: user `lockstep` may read and write `lockstep/`
/// (every controller's prefix is `lockstep/<controller-uuid>/`).
fn etcd_with_auth() -> EtcdCluster {
    let cluster = EtcdCluster::start(1, &[]);
    cluster.enable_auth("root-password-e4d1", &[(USER, PASSWORD, "lockstep/")]);
    cluster
}

/// `text` in a file of `mode` in `dir`.
fn password_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// Every regular file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file()
                && std::fs::read(&path)
                    .unwrap()
                    .windows(needle.len())
                    .any(|window| window == needle.as_bytes())
            {
                found.push(path);
            }
        }
    }
    found
}

/// `lockstep status --format json` of `controller`: its own machine's `lockstep` entry.
fn own_status_entry(controller: &Controller) -> Value {
    let output = controller.run(&["status", "--format", "json"]);
    assert!(output.status.success(), "{}", text(&output));
    let status: Value = serde_json::from_slice(&output.stdout).expect("status is JSON");
    status["machines"]["0"]["lockstep"].clone()
}

#[test]
fn bootstrap_refuses_a_plain_etcd_endpoint_off_loopback_naming_it_and_the_flag() {
    for endpoint in OFF_LOOPBACK {
        let (_dir, _data_dir, output) =
            bootstrap_refused(&["--store", "etcd", "--etcd-endpoints", endpoint]);
        let named = if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        };
        assert_names_endpoint_and_flag(&output, &named);
    }
    // One bad endpoint among loopback ones is enough.
    let (_dir, _data_dir, output) = bootstrap_refused(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        "127.0.0.1:2379,http://192.0.2.1:2379",
    ]);
    assert_names_endpoint_and_flag(&output, "http://192.0.2.1:2379");
}

#[test]
fn lockstepd_and_enable_ha_refuse_a_plain_etcd_endpoint_off_loopback_from_flags_and_agent_conf() {
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    controller.stop();
    let data = controller.data();
    let exe = data.agent_link(&controller.tag()).join("lockstepd");
    let lockstepd = |args: &[&str]| {
        let mut command = Command::new(&exe);
        command
            .arg("--data-dir")
            .arg(&controller.data_dir)
            .args(args);
        let output = run_bounded(&mut command, REFUSED_WITHIN);
        assert_eq!(output.status.code(), Some(1), "{}", text(&output));
        text(&output)
    };

    // From its flags: the launcher refuses before it starts a worker.
    let output = lockstepd(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        "http://192.0.2.1:2379",
    ]);
    assert_names_endpoint_and_flag(&output, "http://192.0.2.1:2379");
    assert!(!output.contains("worker started"), "{output}");
    assert_eq!(
        controller.launcher_pid(),
        None,
        "no launcher kept the data dir"
    );

    // From agent.conf (written by hand, or by an older lockstep).
    let mut conf = data.read_agent_conf().unwrap().unwrap();
    conf.store = lockstep_agent::store::StoreEngine::Etcd;
    conf.etcd_endpoints = vec!["http://192.0.2.1:2379".to_owned()];
    conf.etcd_prefix = lockstep_agent::store::etcd_prefix(&conf.controller);
    data.write_agent_conf(&conf).unwrap();
    let output = lockstepd(&[]);
    assert_names_endpoint_and_flag(&output, "http://192.0.2.1:2379");
    let enable = lockstep(&controller.data_dir, &["enable-ha", "-n", "3"], &[]);
    assert!(!enable.status.success(), "{}", text(&enable));
    assert_names_endpoint_and_flag(&text(&enable), "http://192.0.2.1:2379");
    assert!(
        !data.ha_member_dir(1).exists(),
        "a refused enable-ha prepared a controller"
    );
}

#[test]
fn etcd_insecure_is_recorded_in_agent_conf_warned_at_every_start_and_shown_by_status() {
    let etcd = EtcdCluster::start(1, &[]);
    let endpoints = etcd.endpoints().join(",");
    let controller = Controller::bootstrap(
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-insecure",
        ],
        &[],
    );
    controller.assert_bootstrapped();
    let conf = controller.data().read_agent_conf().unwrap().unwrap();
    assert!(conf.etcd_insecure);
    let agent_conf = std::fs::read_to_string(controller.data().agent_conf_path()).unwrap();
    assert!(agent_conf.contains("etcd-insecure: true"), "{agent_conf}");

    let warning = "etcd is reached with --etcd-insecure";
    let warnings = |log: &str| {
        log.lines()
            .filter(|line| line.contains(warning) && line.contains("WARN"))
            .count()
    };
    assert_eq!(warnings(&controller.log()), 1, "{}", controller.log());

    let entry = own_status_entry(&controller);
    let access = entry["etcd"].as_str().unwrap_or_default();
    assert_eq!(
        access, "plain http, loopback only (--etcd-insecure), no user",
        "{entry}"
    );
    let tabular = controller.run(&["status"]);
    let tabular = String::from_utf8_lossy(&tabular.stdout).into_owned();
    assert!(
        tabular.contains("Etcd") && tabular.contains(access),
        "{tabular}"
    );

    // Every start says it again.
    controller.stop();
    controller.start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(controller.wait_ready(Duration::from_secs(120)));
    assert_eq!(warnings(&controller.log()), 2, "{}", controller.log());
    controller.stop();
}

#[test]
fn bootstrap_as_the_right_etcd_user_reaches_ready_and_writes_the_password_nowhere() {
    let etcd = etcd_with_auth();
    let secrets = tempfile::tempdir().unwrap();
    let file = password_file(
        secrets.path(),
        "etcd.password",
        &format!("{PASSWORD}\n"),
        0o600,
    );
    let file_arg = file.to_str().unwrap();
    let endpoints = etcd.endpoints().join(",");
    let controller = Controller::bootstrap(
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-user",
            USER,
            "--etcd-password-file",
            file_arg,
        ],
        &[],
    );
    // Bootstrap waits for Ready: the daemon it started logged in too.
    controller.assert_bootstrapped();
    let conf = controller.data().read_agent_conf().unwrap().unwrap();
    assert_eq!(conf.etcd_user.as_deref(), Some(USER));
    assert_eq!(conf.etcd_password_file.as_deref(), Some(file.as_path()));
    assert_eq!(
        own_status_entry(&controller)["etcd"],
        format!("plain http, loopback only, user \"{USER}\"")
    );
    assert_eq!(
        files_containing(&controller.data_dir, PASSWORD),
        Vec::<PathBuf>::new(),
        "the password is written only in the operator's file"
    );
    assert!(!text(&controller.bootstrap).contains(PASSWORD));
}

#[test]
fn enable_ha_controllers_log_in_as_the_bootstrap_etcd_user() {
    let etcd = etcd_with_auth();
    let secrets = tempfile::tempdir().unwrap();
    let file = password_file(secrets.path(), "etcd.password", PASSWORD, 0o600);
    let endpoints = etcd.endpoints().join(",");
    let primary = Controller::bootstrap(
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-user",
            USER,
            "--etcd-password-file",
            file.to_str().unwrap(),
        ],
        &[],
    );
    primary.assert_bootstrapped();
    // enable-ha waits until every new controller is Ready: each logged in to etcd.
    let enable = lockstep(&primary.data_dir, &["enable-ha", "-n", "3"], &[]);
    let members: Vec<Controller> = (1..3)
        .map(|id| Controller::attach(primary.data().ha_member_dir(id)))
        .collect();
    assert!(
        enable.status.success(),
        "enable-ha: {}\nlog:\n{}",
        text(&enable),
        primary.log()
    );
    for member in &members {
        let conf = member.data().read_agent_conf().unwrap().unwrap();
        assert_eq!(conf.etcd_user.as_deref(), Some(USER));
        assert_eq!(conf.etcd_password_file.as_deref(), Some(file.as_path()));
        assert_eq!(
            files_containing(&member.data_dir, PASSWORD),
            Vec::<PathBuf>::new()
        );
    }
    for member in members.iter().rev() {
        member.stop();
    }
    primary.stop();
}

#[test]
fn a_wrong_etcd_password_is_refused_naming_the_user_never_the_password() {
    let etcd = etcd_with_auth();
    let secrets = tempfile::tempdir().unwrap();
    let wrong = password_file(secrets.path(), "wrong.password", WRONG, 0o600);
    let endpoints = etcd.endpoints().join(",");
    let (_dir, _data_dir, output) = bootstrap_refused(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-user",
        USER,
        "--etcd-password-file",
        wrong.to_str().unwrap(),
    ]);
    assert!(
        output.contains(&format!(
            "etcd refused user \"{USER}\": wrong user name or password"
        )) && output.contains(&wrong.display().to_string())
            && output.contains("--etcd-password-file"),
        "{output}"
    );
    assert!(!output.contains(WRONG), "{output}");

    // A running controller whose password file went wrong: each worker start is refused,
    // saying why, and the launcher keeps trying until the file is right again (it is read
    // at every start).
    let good = password_file(secrets.path(), "etcd.password", PASSWORD, 0o600);
    let controller = Controller::bootstrap(
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-user",
            USER,
            "--etcd-password-file",
            good.to_str().unwrap(),
        ],
        &[],
    );
    controller.assert_bootstrapped();
    controller.stop();
    password_file(secrets.path(), "etcd.password", WRONG, 0o600);
    controller.start(&[]);
    let refusal = format!("etcd refused user \\\"{USER}\\\": wrong user name or password");
    let plain_refusal = format!("etcd refused user \"{USER}\": wrong user name or password");
    let started = Instant::now();
    while !(controller.log().contains(&refusal) || controller.log().contains(&plain_refusal)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no refusal logged:\n{}",
            controller.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!controller.log().contains(WRONG), "{}", controller.log());
    password_file(secrets.path(), "etcd.password", PASSWORD, 0o600);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(controller.wait_ready(Duration::from_secs(120)));
    controller.stop();
}

#[test]
fn no_etcd_user_against_etcd_with_authentication_is_refused_naming_the_flags() {
    let etcd = etcd_with_auth();
    let endpoints = etcd.endpoints().join(",");
    let (_dir, _data_dir, output) =
        bootstrap_refused(&["--store", "etcd", "--etcd-endpoints", &endpoints]);
    assert!(
        output.contains("etcd has authentication enabled and this client gave no user")
            && output.contains("give --etcd-user NAME and --etcd-password-file FILE"),
        "{output}"
    );
}

/// No etcd is needed: the file is refused before anything connects (nothing listens on
/// the endpoint's port).
#[test]
fn an_etcd_password_file_others_can_read_or_another_user_owns_is_refused_naming_it_and_its_mode() {
    let secrets = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let refused = |file: &Path| {
        bootstrap_refused(&[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
            "--etcd-user",
            USER,
            "--etcd-password-file",
            file.to_str().unwrap(),
        ])
        .2
    };
    for mode in [0o644, 0o640, 0o604] {
        let file = password_file(
            secrets.path(),
            &format!("{mode:o}.password"),
            PASSWORD,
            mode,
        );
        let output = refused(&file);
        assert!(
            output.contains(&format!(
                "etcd's password file {} has mode {mode:04o}: it must be readable by its owner only",
                file.display()
            )),
            "{output}"
        );
        assert!(!output.contains(PASSWORD), "{output}");
    }
    // Private, but someone else's (the tests run as root in CI; elsewhere chown fails and
    // this part is skipped, saying so on stderr).
    let file = password_file(secrets.path(), "theirs.password", PASSWORD, 0o600);
    let nobody = 65534;
    if std::os::unix::fs::chown(&file, Some(nobody), Some(nobody)).is_ok() {
        let output = refused(&file);
        assert!(
            output.contains(&format!(
                "etcd's password file {} (mode 0600) is owned by uid {nobody}",
                file.display()
            )),
            "{output}"
        );
    } else {
        eprintln!("not root: the password file's owner check is not exercised by this run");
    }
}
