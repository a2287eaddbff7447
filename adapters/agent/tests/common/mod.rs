//! Harness for the end-to-end tests: real `lockstep` and `lockstepd` processes on
//! 127.0.0.1 with free ports, in temporary directories; every process started is stopped
//! by its pid when the test ends, pass or fail.
#![allow(dead_code, clippy::print_stderr)]

pub mod http_mirror;
pub mod proxy;
pub mod python;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use lockstep_agent::cli::bootstrap::ControllerFile;
use lockstep_agent::datadir::{self, DataDir};
use lockstep_core::Version;
use lockstep_core::client::RetryPolicy;
use lockstep_streams::SigningKey;
use lockstep_transport::client::Client;
use serde_json::{Value, json};

pub const LOCKSTEP: &str = env!("CARGO_BIN_EXE_lockstep");
pub const LOCKSTEPD: &str = env!("CARGO_BIN_EXE_lockstepd");

pub fn own() -> Version {
    lockstep_agent::steps::build_version()
}

pub fn next() -> Version {
    lockstep_agent::steps::next_patch()
}

/// What a published version holds.
pub enum Published {
    /// This build's lockstepd, forced to the version when it is not the build's own.
    Lockstepd,
    /// A shell script in place of lockstepd (a binary that exits at once or hangs).
    Script(&'static str),
    /// This build's lockstepd, with the tarball's bytes changed after the metadata was
    /// generated (a tampered mirror).
    Tampered,
}

/// A mirror directory with simplestreams metadata, signed (`.sjson` beside every `.json`)
/// by a key made for it unless made [`Mirror::unsigned`].
pub struct Mirror {
    pub dir: tempfile::TempDir,
    /// The key that signed the metadata; `None` for an unsigned mirror.
    pub key: Option<SigningKey>,
    /// The public key, as `--metadata-key` takes it (`<dir>/metadata-public-key.asc`, beside
    /// `tools/`); written for an unsigned mirror too, so a test can show it refused.
    pub public_key: PathBuf,
}

impl Mirror {
    /// A mirror publishing `versions`, its metadata signed by a new key.
    pub fn new(versions: &[(Version, Published)]) -> Mirror {
        Mirror::made(versions, true)
    }

    /// A mirror publishing `versions` with unsigned metadata only (`.json`), as
    /// `generate-agent-binaries` without `--sign-key` writes it.
    pub fn unsigned(versions: &[(Version, Published)]) -> Mirror {
        Mirror::made(versions, false)
    }

    fn made(versions: &[(Version, Published)], signed: bool) -> Mirror {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let public_key = dir.path().join("metadata-public-key.asc");
        let key = lockstep_agent::cli::demo::signing_key(&public_key).expect("a signing key");
        let key = signed.then_some(key);
        let mut tamper = Vec::new();
        for (version, published) in versions {
            match published {
                Published::Lockstepd | Published::Tampered => {
                    let tarball = lockstep_agent::cli::demo::publish(
                        dir.path(),
                        *version,
                        Path::new(LOCKSTEPD),
                        *version != own(),
                    )
                    .expect("publish");
                    if matches!(published, Published::Tampered) {
                        tamper.push(tarball);
                    }
                }
                Published::Script(script) => {
                    let scratch = tempfile::tempdir().unwrap();
                    let path = scratch.path().join("lockstepd");
                    std::fs::write(&path, script).unwrap();
                    let binary = datadir::host_binary(*version);
                    let released = dir.path().join("tools/released");
                    std::fs::create_dir_all(&released).unwrap();
                    lockstep_agent::unpack::pack_tgz(
                        &[("lockstepd", path.as_path(), 0o755)],
                        &released.join(format!("juju-{binary}.tgz")),
                    )
                    .unwrap();
                }
            }
        }
        lockstep_agent::cli::demo::generate(dir.path(), key.as_ref()).expect("generate metadata");
        for tarball in tamper {
            let mut bytes = std::fs::read(&tarball).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xff;
            std::fs::write(&tarball, bytes).unwrap();
        }
        Mirror {
            dir,
            key,
            public_key,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// This build published as itself (N) and as the next patch (N+1, FORCE-VERSION).
    pub fn n_and_next(next_as: Published) -> Mirror {
        Mirror::new(&[(own(), Published::Lockstepd), (next(), next_as)])
    }

    /// The mirror as `--metadata-source` takes it.
    pub fn source(&self) -> String {
        self.path().to_str().expect("a UTF-8 path").to_owned()
    }

    /// The public key file, as `--metadata-key` takes it.
    pub fn key(&self) -> String {
        self.public_key.to_str().expect("a UTF-8 path").to_owned()
    }
}

/// The pid a `lockstepd.pid` file holds.
pub fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A controller bootstrapped by `lockstep bootstrap` in a temporary data dir.
pub struct Controller {
    pub dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub bootstrap: Output,
    /// `lockstepd`s this test started itself (reaped when stopped).
    pub children: std::sync::Mutex<Vec<std::process::Child>>,
}

/// Juju's client store for a controller in `<tmp>/controller`: `<tmp>/juju`, beside it, so
/// that no test's bootstrap or kill-controller ever touches the real `~/.local/share/juju`.
pub fn juju_data_beside(data_dir: &Path) -> PathBuf {
    data_dir.with_file_name("juju")
}

/// Runs `lockstep` with `--data-dir` (and `JUJU_DATA` beside it, unless `env` sets it) and
/// returns its output.
pub fn lockstep(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(LOCKSTEP);
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("JUJU_DATA", juju_data_beside(data_dir));
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("lockstep runs")
}

pub fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

impl Controller {
    /// A controller bootstrapped as the README says, from a signed mirror that publishes
    /// this build as N and N+1 (asserted bootstrapped); the mirror with it.
    pub fn from_signed_mirror() -> (Mirror, Controller) {
        let mirror = Mirror::n_and_next(Published::Lockstepd);
        let controller = Controller::bootstrap(
            &[
                "--metadata-source",
                &mirror.source(),
                "--metadata-key",
                &mirror.key(),
            ],
            &[],
        );
        controller.assert_bootstrapped();
        (mirror, controller)
    }

    /// A controller bootstrapped from a signed mirror of this build as N and N+1 served over
    /// HTTP, which holds back what `back` says (asserted bootstrapped); the mirror and its
    /// server with it.
    pub fn from_held_http_mirror(
        back: http_mirror::HoldBack,
    ) -> (Mirror, http_mirror::HttpMirror, Controller) {
        let mirror = Mirror::n_and_next(Published::Lockstepd);
        let served = http_mirror::HttpMirror::serve_holding(mirror.path(), Duration::ZERO, back);
        let controller = Controller::bootstrap(
            &[
                "--metadata-source",
                &served.tools_url(),
                "--metadata-key",
                &mirror.key(),
            ],
            &[],
        );
        controller.assert_bootstrapped();
        (mirror, served, controller)
    }

    /// `lockstep bootstrap --api-port 0 <args>`; the controller is left running even if
    /// bootstrap failed (the caller asserts).
    pub fn bootstrap(args: &[&str], env: &[(&str, &str)]) -> Controller {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data_dir = dir.path().join("controller");
        let mut all = vec!["bootstrap", "--api-port", "0"];
        if !args.contains(&"--timeout") {
            all.extend_from_slice(&["--timeout", "180"]);
        }
        all.extend_from_slice(args);
        let bootstrap = lockstep(&data_dir, &all, env);
        Controller {
            dir,
            data_dir,
            bootstrap,
            children: std::sync::Mutex::default(),
        }
    }

    /// [`Controller::bootstrap`], with `alongside` called with the data dir as soon as
    /// `controller.yaml` exists: the daemon is starting then, far from Ready, so clients
    /// started by `alongside` overlap every limited phase. `None` if bootstrap exited first.
    pub fn bootstrap_alongside<T>(
        args: &[&str],
        env: &[(&str, &str)],
        alongside: impl FnOnce(&Path) -> T,
    ) -> (Controller, Option<T>) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data_dir = dir.path().join("controller");
        let mut command = Command::new(LOCKSTEP);
        command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["bootstrap", "--api-port", "0"])
            .env("JUJU_DATA", juju_data_beside(&data_dir));
        if !args.contains(&"--timeout") {
            command.args(["--timeout", "180"]);
        }
        command
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("lockstep runs");
        let controller_file = DataDir::new(&data_dir).controller_config_path();
        let started = loop {
            if controller_file.exists() {
                break Some(alongside(&data_dir));
            }
            if matches!(child.try_wait(), Ok(Some(_))) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let bootstrap = child.wait_with_output().expect("lockstep bootstrap ends");
        (
            Controller {
                dir,
                data_dir,
                bootstrap,
                children: std::sync::Mutex::default(),
            },
            started,
        )
    }

    /// A view of a controller someone else set up in `data_dir` (such as one `lockstep
    /// enable-ha` added); `dir` is scratch space for this view's own files.
    pub fn attach(data_dir: PathBuf) -> Controller {
        Controller {
            dir: tempfile::tempdir().expect("a temporary directory"),
            data_dir,
            bootstrap: Command::new("true").output().expect("true runs"),
            children: std::sync::Mutex::default(),
        }
    }

    /// The agent's tag from its `agent.conf` (`machine-0` for the first controller).
    pub fn tag(&self) -> String {
        self.data()
            .read_agent_conf()
            .expect("agent.conf reads")
            .expect("agent.conf exists")
            .tag
    }

    pub fn assert_bootstrapped(&self) {
        assert!(
            self.bootstrap.status.success()
                && String::from_utf8_lossy(&self.bootstrap.stdout).contains("is now available"),
            "bootstrap failed: {}\nlog:\n{}",
            text(&self.bootstrap),
            self.log()
        );
    }

    pub fn data(&self) -> DataDir {
        DataDir::new(&self.data_dir)
    }

    /// `logs/lockstepd.log`, without the terminal colours tracing writes around fields, so
    /// that `key=value` can be matched.
    pub fn log(&self) -> String {
        let log =
            std::fs::read_to_string(self.data_dir.join("logs/lockstepd.log")).unwrap_or_default();
        strip_ansi(&log)
    }

    pub fn controller_file(&self) -> ControllerFile {
        ControllerFile::read(&self.data()).expect("controller.yaml")
    }

    /// A client of this controller alone (never another controller of an HA set: the tests
    /// ask each about itself).
    pub fn client(&self) -> Client {
        self.controller_file().direct_client(RetryPolicy::default())
    }

    pub fn run(&self, args: &[&str]) -> Output {
        lockstep(&self.data_dir, args, &[])
    }

    /// [`Controller::run`] with `env` set for the command (and for any process it starts:
    /// `add-machine`'s machine agents).
    pub fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        lockstep(&self.data_dir, args, env)
    }

    pub fn launcher_pid(&self) -> Option<u32> {
        pid_in(&self.data().pid_path())
    }

    pub fn worker_pid(&self) -> Option<u32> {
        lockstep_agent::cli::demo::worker_pid(self.launcher_pid()?)
    }

    /// `/proc/<worker>/exe`.
    pub fn serving_exe(&self) -> Option<PathBuf> {
        lockstep_agent::cli::demo::exe_of(self.worker_pid()?)
    }

    pub fn binary_dir(&self, version: Version) -> PathBuf {
        self.data().binary_dir(&datadir::host_binary(version))
    }

    pub async fn status(&self) -> Value {
        self.client()
            .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(60))
            .await
            .expect("Upgrade.Status")
    }

    pub async fn full_status(&self) -> Value {
        self.client()
            .call(
                "Client",
                8,
                "FullStatus",
                json!({}),
                Duration::from_secs(120),
            )
            .await
            .expect("FullStatus")
    }

    /// A TLS connection to the controller's API address, verified with its CA for the
    /// server name `name`.
    pub async fn tls_connect(
        &self,
        name: &'static str,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let file = self.controller_file();
        let config = lockstep_transport::tls::client_config(
            &file.ca_cert,
            &[&rustls::version::TLS13, &rustls::version::TLS12],
        )
        .expect("a TLS client configuration");
        let tcp = tokio::net::TcpStream::connect(&file.api_endpoints[0])
            .await
            .expect("the controller listens");
        let name = rustls::pki_types::ServerName::try_from(name).unwrap();
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .expect("a TLS connection")
    }

    /// `GET path` on the controller over TLS (its CA), with an `Authorization` header when
    /// given; the status and the body.
    pub async fn https_get(&self, path: &str, authorization: Option<String>) -> (u16, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = self.tls_connect("localhost").await;
        let authorization =
            authorization.map_or_else(String::new, |value| format!("Authorization: {value}\r\n"));
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
        let mut answer = Vec::new();
        // A server may close a TLS connection without close_notify once it has answered.
        let _ = stream.read_to_end(&mut answer).await;
        let split = answer
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .expect("a complete head");
        let status = String::from_utf8_lossy(&answer[9..12]).parse().unwrap();
        (status, answer[split + 4..].to_vec())
    }

    /// Waits for Ready (through restarts), up to `deadline`.
    pub async fn wait_ready(&self, deadline: Duration) {
        let client = self.client();
        let started = Instant::now();
        loop {
            if let Ok(status) = client
                .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(5))
                .await
                && status["phase"] == "ready"
            {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "not ready within {deadline:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the controller reports `phase`, up to `deadline`.
    pub async fn wait_phase(&self, phase: &str, deadline: Duration) {
        let client = self.client();
        let started = Instant::now();
        loop {
            if let Ok(status) = client
                .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(5))
                .await
                && status["phase"] == phase
            {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "not {phase} within {deadline:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the controller is Ready running `version`, up to `deadline`.
    pub async fn wait_running(&self, version: Version, deadline: Duration) {
        let client = self.client();
        let started = Instant::now();
        loop {
            if let Ok(status) = client
                .call("Upgrade", 1, "Status", json!({}), Duration::from_secs(5))
                .await
                && status["phase"] == "ready"
                && status["agent-version"] == version.to_string()
            {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "not ready on {version} within {deadline:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sets the model's agent-version straight in the store, as an operator's earlier
    /// `upgrade-controller` would have left it (the controller must be stopped).
    pub fn set_agent_version_in_store(&self, version: Version) {
        use lockstep_store::Store;
        let store = lockstep_store::SqliteStore::open(
            self.data().store_path(),
            lockstep_store::OpenMode::ReadWrite,
        )
        .expect("open the store");
        // Straight in: only a current upgrade-info record could refuse it.
        let set = store
            .set_agent_version(version, &lockstep_store::AgentVersionCheck::LIFECYCLE)
            .expect("set agent-version");
        assert!(
            matches!(set, lockstep_store::AgentVersionSet::Set { .. }),
            "{set:?}"
        );
    }

    /// Kills the launcher and its worker with SIGKILL and waits until both are gone.
    pub fn kill_9(&self) {
        let worker = self.worker_pid();
        for pid in self.launcher_pid().into_iter().chain(worker) {
            if let Some(target) = rustix::process::Pid::from_raw(pid as i32) {
                // The launcher leads its own process group, which its worker shares: one
                // signal to the group reaches a worker being spawned right now too.
                let _ = rustix::process::kill_process_group(target, rustix::process::Signal::KILL);
                let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
            }
        }
        for pid in self.launcher_pid().into_iter().chain(worker) {
            let started = Instant::now();
            while lockstep_agent::process::alive(pid) && started.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.reap();
    }

    /// Waits for the children this test started that have exited.
    fn reap(&self) {
        self.children
            .lock()
            .unwrap()
            .retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_))));
    }

    /// Starts `lockstepd` again on the same data dir (and so the same port), detached, as
    /// `lockstep bootstrap` does. Returns the launcher's pid.
    pub fn start(&self, env: &[(&str, &str)]) -> u32 {
        self.start_through(&[], env)
    }

    /// [`Controller::start`] as user `uid` and group `gid` (no supplementary groups, no new
    /// privileges), through `setpriv(1)`, which execs `lockstepd` in its own process: as
    /// systemd runs the shipped unit's `User=`.
    pub fn start_as(&self, uid: u32, gid: u32, env: &[(&str, &str)]) -> u32 {
        let (reuid, regid) = (format!("--reuid={uid}"), format!("--regid={gid}"));
        let prefix = [
            "setpriv",
            &reuid,
            &regid,
            "--clear-groups",
            "--no-new-privs",
        ];
        self.start_through(&prefix, env)
    }

    /// `lockstepd` started by `prefix` (a program that execs the rest of its arguments), or
    /// directly if `prefix` is empty.
    #[allow(
        clippy::zombie_processes,
        reason = "children are kept and reaped by `reap`"
    )]
    fn start_through(&self, prefix: &[&str], env: &[(&str, &str)]) -> u32 {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.join("logs/lockstepd.log"))
            .unwrap();
        let lockstepd = self.data().agent_link(&self.tag()).join("lockstepd");
        let mut command = match prefix.split_first() {
            None => Command::new(lockstepd),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(lockstepd);
                command
            }
        };
        command
            .arg("--data-dir")
            .arg(&self.data_dir)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        for (key, value) in env {
            command.env(key, value);
        }
        // Kept in `self.children` and reaped by `reap` once stopped.
        let mut child = command.spawn().expect("lockstepd starts");
        let pid = child.id();
        // The launcher writes its pid file once it holds the data dir's lock.
        let started = Instant::now();
        while self.launcher_pid() != Some(pid) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("lockstepd exited at start ({status}); log:\n{}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "lockstepd did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.children.lock().unwrap().push(child);
        pid
    }

    /// Stops the launcher (and its worker) by pid.
    pub fn stop(&self) {
        // The machine agents `lockstep add-machine` started under this data dir first: each
        // is a launcher and its worker, stopped by their ids.
        for agent in self.data().machine_agent_dirs() {
            let Some(launcher) = pid_in(&agent.pid_path()) else {
                continue;
            };
            let worker = lockstep_agent::cli::demo::worker_pid(launcher);
            lockstep_agent::cli::demo::stop_daemon(launcher);
            if let Some(worker) = worker {
                lockstep_agent::cli::demo::stop_daemon(worker);
            }
        }
        let worker = self.worker_pid();
        if let Some(pid) = self.launcher_pid() {
            lockstep_agent::cli::demo::stop_daemon(pid);
        }
        if let Some(worker) = worker {
            lockstep_agent::cli::demo::stop_daemon(worker);
        }
        self.reap();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("lockstepd log:\n{}", self.log());
        }
    }
}

/// Counts the checkpoints recorded for each database step, from the SQLite store's event
/// log.
pub fn checkpoint_events(data: &DataDir) -> std::collections::BTreeMap<String, usize> {
    let store =
        lockstep_store::SqliteStore::open(data.store_path(), lockstep_store::OpenMode::ReadOnly)
            .expect("open the store read-only");
    checkpoint_events_in(&store)
}

/// Counts the checkpoints recorded for each database step, from any store's event log.
pub fn checkpoint_events_in(
    store: &dyn lockstep_store::Store,
) -> std::collections::BTreeMap<String, usize> {
    let lockstep_store::Changes::Events { events, .. } = store
        .changes_since(lockstep_core::lifecycle::Revision(0), 1_000_000)
        .expect("the event log")
    else {
        panic!("the event log was compacted");
    };
    let mut counts = std::collections::BTreeMap::new();
    for event in events {
        if event.kind == lockstep_store::EntityKind::Step {
            *counts.entry(event.id.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// The demo bundle written to `dir/bundle.yaml`.
pub fn bundle_file(dir: &Path) -> PathBuf {
    let path = dir.join("bundle.yaml");
    std::fs::write(&path, lockstep_agent::cli::demo::DEMO_BUNDLE).unwrap();
    path
}

/// Every application of the demo bundle has exactly its units in `status` (FullStatus or
/// `lockstep status --format json`): a deploy applied twice, or half, shows here.
pub fn assert_bundle_deployed_once(status: &Value) {
    let expected =
        lockstep_agent::cli::bundle::Bundle::parse(lockstep_agent::cli::demo::DEMO_BUNDLE).unwrap();
    for change in expected.plan() {
        if let lockstep_agent::cli::bundle::BundleChange::Deploy {
            application,
            num_units,
            ..
        } = change
        {
            let units = status["applications"][&application]["units"]
                .as_object()
                .map(|units| units.len())
                .unwrap_or(0);
            assert_eq!(units, num_units as usize, "{application}: {status:#}");
        }
    }
}

/// The store's event log (SQLite, read-only): each database step's checkpoints, each
/// application's and unit's first revision.
pub fn store_log(data: &DataDir) -> lockstep_agent::cli::demo::StoreLog {
    let store =
        lockstep_store::SqliteStore::open(data.store_path(), lockstep_store::OpenMode::ReadOnly)
            .expect("open the store read-only");
    lockstep_agent::cli::demo::StoreLog::read(&store).expect("the event log")
}

/// When the controller first opened its full API, from its text log (`gate phase="ready"
/// limited=false`), in microseconds since the Unix epoch.
pub fn ready_unix_micros(log: &str) -> Option<u64> {
    log.lines().map(strip_ansi).find_map(|line| {
        (line.contains(" gate ") && line.contains("limited=false"))
            .then(|| {
                line.split_whitespace()
                    .next()
                    .and_then(lockstep_agent::cli::demo::parse_rfc3339_micros)
            })
            .flatten()
    })
}

/// `line` without its terminal colour codes (`ESC [ ... m`).
pub fn strip_ansi(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// An HTTP Basic `Authorization` value.
pub fn basic(tag: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{tag}:{password}"))
    )
}

/// The patch `k` after this build's version: `later_patch(1)` is [`next()`].
pub fn later_patch(k: u32) -> Version {
    let mut version = own();
    version.patch += k;
    version
}

/// The machine ids of a `Client.FullStatus` answer, sorted as strings.
pub fn machine_ids(full_status: &Value) -> Vec<String> {
    let mut ids: Vec<String> = full_status["machines"]
        .as_object()
        .map(|machines| machines.keys().cloned().collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// The remote addresses of the TCP connections process `pid` holds open (its descriptors'
/// sockets, looked up in `/proc/net/tcp` and `tcp6`), established or not. Loopback only
/// is what the tests start, so IPv4 and IPv4-mapped IPv6 are read; other IPv6 peers are
/// returned as `[::]` with their port.
pub fn tcp_peers(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let text = target.to_string_lossy().into_owned();
            text.strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    let mut peers = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            if fields.len() < 10 || !inodes.contains(fields[9]) || fields[3] == "0A" {
                continue; // not this process's, or a listening socket
            }
            let Some((address, port)) = fields[2].split_once(':') else {
                continue;
            };
            let port = u16::from_str_radix(port, 16).unwrap_or(0);
            let ip = match address.len() {
                8 => u32::from_str_radix(address, 16)
                    .map(|raw| std::net::IpAddr::from(raw.to_le_bytes()))
                    .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
                32 if address.starts_with("0000000000000000FFFF0000") => {
                    u32::from_str_radix(&address[24..], 16)
                        .map(|raw| std::net::IpAddr::from(raw.to_le_bytes()))
                        .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]))
                }
                _ => std::net::IpAddr::from([0u16; 8]),
            };
            peers.push(std::net::SocketAddr::new(ip, port));
        }
    }
    peers
}

/// The `monotonic_ns` of a log line, if it has one.
pub fn monotonic_ns(line: &str) -> Option<u64> {
    let rest = line.split("monotonic_ns=").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The windows (first byte, last byte) in which a machine agent received a whole binary,
/// from its log (`download receiving` then `download received`, each with
/// `monotonic_ns`), in order; downloads that broke off are left out.
pub fn download_windows(log: &str, agent: &str) -> Vec<(u64, u64)> {
    receiving_windows(log, agent)
        .into_iter()
        .filter(|window| window.whole)
        .map(|window| (window.first, window.last))
        .collect()
}

/// One window in which an agent received bytes of a binary.
#[derive(Debug, Clone, Copy)]
pub struct ReceivingWindow {
    pub first: u64,
    pub last: u64,
    /// Ended at the last byte (`download received`), not broken off.
    pub whole: bool,
}

/// Every window in which a machine agent received bytes of a binary, from its log:
/// `download receiving`, then `download received` or `download broke off` (the controller
/// it came from restarted, the link broke), each with `monotonic_ns`. Every window must be
/// closed, one at a time.
pub fn receiving_windows(log: &str, agent: &str) -> Vec<ReceivingWindow> {
    let mut windows = Vec::new();
    let mut open = None;
    for line in log.lines() {
        let line = &strip_ansi(line);
        let whole = line.contains("download received");
        if line.contains("download receiving") {
            assert!(
                open.is_none(),
                "{agent}: a download began before the last ended:\n{log}"
            );
            open = Some(monotonic_ns(line).expect("monotonic_ns"));
        } else if whole || line.contains("download broke off") {
            let first = open
                .take()
                .unwrap_or_else(|| panic!("{agent}: received, never receiving:\n{log}"));
            windows.push(ReceivingWindow {
                first,
                last: monotonic_ns(line).expect("monotonic_ns"),
                whole,
            });
        }
    }
    assert!(open.is_none(), "{agent}: a download never ended:\n{log}");
    windows
}

/// The windows of every machine agent under `data` (a controller's data dir), from their
/// logs: when each received bytes of a binary, first byte to the last or to where the
/// download broke off.
pub fn agents_download_windows(data: &DataDir) -> Vec<(u64, u64)> {
    agents_receiving_windows(data)
        .into_iter()
        .map(|(_, window)| (window.first, window.last))
        .collect()
}

/// [`receiving_windows`] of every machine agent under `data`, each with its agent's data
/// dir.
pub fn agents_receiving_windows(data: &DataDir) -> Vec<(String, ReceivingWindow)> {
    data.machine_agent_dirs()
        .iter()
        .flat_map(|dir| {
            let agent = dir.root().display().to_string();
            let log =
                std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default();
            receiving_windows(&log, &agent)
                .into_iter()
                .map(move |window| (agent.clone(), window))
        })
        .collect()
}

/// The host's monotonic clock in nanoseconds, the clock of the agents' `monotonic_ns`.
pub fn monotonic_now_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(now.tv_sec).expect("positive") * 1_000_000_000
        + u64::try_from(now.tv_nsec).expect("positive")
}

/// The most windows open at one moment (one ending as another begins counts once).
pub fn most_at_once(windows: &[(u64, u64)]) -> usize {
    let mut edges: Vec<(u64, i32)> = windows
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, edge) in edges {
        open += edge;
        most = most.max(open);
    }
    most as usize
}

#[test]
fn a_download_that_broke_off_closes_its_window_and_is_not_a_whole_one() {
    let log = "\
download attempt\n\
download receiving monotonic_ns=100 received_bytes=8074\n\
WARN the fetch ahead failed\n\
download broke off monotonic_ns=150\n\
download attempt\n\
download receiving monotonic_ns=300 received_bytes=8074\n\
download received monotonic_ns=400 received_bytes=21183164\n";
    let windows: Vec<(u64, u64, bool)> = receiving_windows(log, "machine-2")
        .into_iter()
        .map(|window| (window.first, window.last, window.whole))
        .collect();
    assert_eq!(windows, [(100, 150, false), (300, 400, true)]);
    assert_eq!(download_windows(log, "machine-2"), [(300, 400)]);
}
