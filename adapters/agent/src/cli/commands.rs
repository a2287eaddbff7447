//! The `lockstep` commands against a running controller: Juju's verbs and flags where they
//! exist. Every command against a controller that is upgrading waits through it, with a
//! note on stderr, up to `--timeout`, rather than failing.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockstep_core::Version;
use lockstep_core::client::RetryPolicy;
use lockstep_streams::signature::{KEY_FILE_BYTES_MAX, KeyError};
use lockstep_streams::{GenerateError, SigningKey};
use lockstep_transport::client::{Client, ClientError};
use serde_json::{Map, Value, json};

use crate::cli::bootstrap::{
    ControllerFile, ControllerFileError, Progress, WaitError, wait_until_ready,
};
use crate::cli::bundle::{Bundle, BundleChange, BundleError};
use crate::cli::juju_data::{JujuData, JujuDataError};
use crate::cli::status::{self, Format, StatusError};
use crate::datadir::DataDir;
use crate::logging::{complain, say};
use crate::quote::quote;

/// A call to a controller's facade that did not succeed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The client gave up, or the server answered with an error.
    #[error("{facade}.{method}: {error}")]
    Client {
        facade: &'static str,
        method: &'static str,
        #[source]
        error: Box<ClientError>,
    },
    /// A bulk call succeeded, but the server refused one of its entries.
    #[error("{what}: {message}")]
    Refused { what: String, message: String },
}

/// Why a command against a controller failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    ControllerFile(#[from] ControllerFileError),
    #[error(transparent)]
    JujuData(#[from] JujuDataError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Wait(#[from] WaitError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Status(#[from] StatusError),

    #[error("watching the model: {0}")]
    Watch(#[source] ClientError),
    #[error("Upgrade.Status did not report the controller's agent version: {}", quote(&reply.to_string()))]
    NoAgentVersion { reply: Value },
    #[error("no lockstepd runs on {} ({}: {error})", data_dir.display(), path.display())]
    NotRunning {
        data_dir: PathBuf,
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("{} holds {}, not a pid", path.display(), quote(text))]
    NotAPid { path: PathBuf, text: String },
    #[error("cannot signal lockstepd (pid {pid}): {error}")]
    Signal {
        pid: i32,
        #[source]
        error: io::Error,
    },
    #[error("lockstepd (pid {pid}) did not stop in {}s; killed", timeout.as_secs())]
    DidNotStop { pid: i32, timeout: Duration },
    #[error("metadata generate-agent-binaries -d {}: {error}", dir.display())]
    Generate {
        dir: PathBuf,
        #[source]
        error: GenerateError,
    },
    #[error("--sign-key {}: {problem}", path.display())]
    SignKey { path: PathBuf, problem: String },
    #[error("metadata generate-key: {0}")]
    GenerateKey(#[source] KeyError),
    #[error(
        "metadata generate-key: {} exists; not replacing a signing key (move it away first)",
        path.display()
    )]
    KeyExists { path: PathBuf },
    #[error("cannot {action} {}: {error}", path.display())]
    KeyFile {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: io::Error,
    },
    #[error(transparent)]
    Write(#[from] lockstep_fs::AtomicWriteError),
    #[error("Client.FindTools: {message}")]
    FindTools { message: String },
    #[error("model-config {}: expected KEY=VALUE", quote(argument))]
    NotASetting { argument: String },
}

/// API facade versions the CLI speaks.
pub const CLIENT_VERSION: u32 = 8;
pub const APPLICATION_VERSION: u32 = 20;
pub const MODEL_CONFIG_VERSION: u32 = 3;

/// A connected controller and the command's deadline.
#[derive(Debug)]
pub struct Session {
    pub controller: ControllerFile,
    pub client: Client,
    pub deadline: Instant,
}

impl Session {
    pub fn open(data_dir: &Path, timeout: Duration) -> Result<Session, ControllerFileError> {
        let controller = ControllerFile::read(&DataDir::new(data_dir))?;
        Ok(Session::of(controller, timeout))
    }

    /// A session with the controller `-c NAME` names in Juju's client store, or else with
    /// the one whose data directory is `data_dir`.
    pub fn resolve(
        name: Option<&str>,
        data_dir: &Path,
        timeout: Duration,
    ) -> Result<Session, CommandError> {
        match name {
            Some(name) => Ok(Session::of(
                JujuData::from_env()?.controller(name)?,
                timeout,
            )),
            None => Ok(Session::open(data_dir, timeout)?),
        }
    }

    /// A session with a controller found elsewhere (`-c NAME`, through Juju's client store).
    pub fn of(controller: ControllerFile, timeout: Duration) -> Session {
        let client = controller.client(RetryPolicy::default());
        Session {
            controller,
            client,
            deadline: Instant::now() + timeout,
        }
    }

    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Waits until the controller is Ready, with a note if it is not already.
    pub async fn wait_ready(&self) -> Result<(), CommandError> {
        let status = self.call("Upgrade", 1, "Status", json!({})).await?;
        let progress = Progress::from_json(&status);
        if progress.phase == "ready" {
            return Ok(());
        }
        complain(&format!(
            "controller {:?} is {}; waiting up to {}s for it to finish",
            self.controller.name,
            progress.describe(),
            self.left().as_secs()
        ));
        wait_until_ready(&self.client, None, self.left(), |progress| {
            complain(&format!("  {}", progress.describe()));
        })
        .await?;
        Ok(())
    }

    pub async fn call(
        &self,
        facade: &'static str,
        version: u32,
        method: &'static str,
        params: Value,
    ) -> Result<Value, CallError> {
        self.client
            .call(facade, version, method, params, self.left())
            .await
            .map_err(|error| CallError::Client {
                facade,
                method,
                error: Box::new(error),
            })
    }

    pub async fn mutate(
        &self,
        facade: &'static str,
        version: u32,
        method: &'static str,
        params: Value,
    ) -> Result<Value, CallError> {
        self.client
            .mutate(facade, version, method, params, self.left())
            .await
            .map_err(|error| CallError::Client {
                facade,
                method,
                error: Box::new(error),
            })
    }
}

/// Fails on the first `error` entry of a bulk reply (`results[i].error`).
pub fn check_results(reply: &Value, what: &str) -> Result<(), CallError> {
    if let Some(results) = reply["results"].as_array() {
        for result in results {
            if let Some(error) = result.get("error").filter(|e| !e.is_null()) {
                return Err(CallError::Refused {
                    what: what.to_owned(),
                    message: error["message"].as_str().unwrap_or("failed").to_owned(),
                });
            }
        }
    }
    Ok(())
}

pub async fn status(session: &Session, format: Format) -> Result<(), CommandError> {
    let reply = session
        .call(
            "Client",
            CLIENT_VERSION,
            "FullStatus",
            json!({"patterns": []}),
        )
        .await?;
    let text = match format {
        Format::Tabular => status::render_tabular(&reply, Some(&session.controller.name)),
        other => status::render(&reply, other),
    }?;
    say(text.trim_end());
    Ok(())
}

/// One bundle change as an API call: (facade, version, method, params).
pub fn call_for(change: &BundleChange) -> (&'static str, u32, &'static str, Value) {
    match change {
        BundleChange::Deploy {
            application,
            charm,
            num_units,
        } => (
            "Application",
            APPLICATION_VERSION,
            "Deploy",
            json!({"applications": [{
                "application": application,
                "charm-url": charm,
                "num-units": num_units,
            }]}),
        ),
        BundleChange::Expose { application } => (
            "Application",
            APPLICATION_VERSION,
            "Expose",
            json!({"application": application}),
        ),
        BundleChange::AddRelation { endpoints } => (
            "Application",
            APPLICATION_VERSION,
            "AddRelation",
            json!({"endpoints": endpoints}),
        ),
    }
}

pub fn describe_change(change: &BundleChange) -> String {
    match change {
        BundleChange::Deploy {
            application,
            charm,
            num_units,
        } => format!("deploy {application} ({charm}, {num_units} units)"),
        BundleChange::Expose { application } => format!("expose {application}"),
        BundleChange::AddRelation { endpoints } => {
            format!("relate {} {}", endpoints[0], endpoints[1])
        }
    }
}

pub async fn deploy(session: &Session, bundle: &Path) -> Result<(), CommandError> {
    let bundle = Bundle::from_file(bundle)?;
    session.wait_ready().await?;
    for change in bundle.plan() {
        let (facade, version, method, params) = call_for(&change);
        let reply = session.mutate(facade, version, method, params).await?;
        check_results(&reply, &describe_change(&change))?;
        say(&format!("- {}", describe_change(&change)));
    }
    say("Deploy of bundle completed.");
    Ok(())
}

/// Streams deltas as JSON lines until interrupted, resuming across controller restarts.
pub async fn watch(session: &Session, limit: Option<usize>) -> Result<(), CommandError> {
    let mut watcher = session.client.watch();
    let mut seen = 0usize;
    loop {
        let deltas = watcher
            .next(session.left())
            .await
            .map_err(CommandError::Watch)?;
        for delta in deltas {
            say(&json!({"revision": delta.revision.0, "delta": delta.delta}).to_string());
            seen += 1;
            if limit.is_some_and(|limit| seen >= limit) {
                return Ok(());
            }
        }
    }
}

pub async fn abort_upgrade(session: &Session) -> Result<(), CommandError> {
    session
        .call("Client", CLIENT_VERSION, "AbortCurrentUpgrade", json!({}))
        .await?;
    let status = session.call("Upgrade", 1, "Status", json!({})).await?;
    let progress = Progress::from_json(&status);
    match progress.phase.as_str() {
        // As Juju's: the abort applies to the current upgrade-info record (an upgrade's
        // steps). Staging a binary gives up by itself after its bounded attempts.
        "upgrading" => say(&format!(
            "abort requested; the controller is staging its new binary ({}), which \
             is not aborted: staging gives up by itself after its attempts",
            progress.describe()
        )),
        _ => say(&format!(
            "abort requested; the controller is {}",
            progress.describe()
        )),
    }
    Ok(())
}

/// `upgrade-model --resume` and `--abort`: the operator's verbs on the staged rollout of
/// machine agents (`spec/rollout.md`); without either, the model's agent-version is set as
/// `upgrade-controller` sets it (one model: the controllers go first, then the machine
/// agents as the model's `rollout-*` config stages them).
pub async fn upgrade_model(
    session: &Session,
    version: Option<Version>,
    resume: bool,
    abort: bool,
    dry_run: bool,
    check_agent_versions: bool,
) -> Result<(), CommandError> {
    let method = match (resume, abort) {
        (true, _) => "ResumeRollout",
        (_, true) => "AbortRollout",
        _ => {
            return upgrade_controller(session, version, dry_run, false, check_agent_versions)
                .await;
        }
    };
    session.wait_ready().await?;
    let rollout = session.mutate("Upgrade", 1, method, json!({})).await?;
    let failed = rollout["failed"].as_object().map_or(0, Map::len);
    let held = rollout["held"].as_object().map_or(0, Map::len);
    say(&format!(
        "rollout of {}: {} ({} of {} machine agents admitted, {} on the target, {} failed, {} held)",
        rollout["target"].as_str().unwrap_or("?"),
        rollout["state"].as_str().unwrap_or("?"),
        rollout["admitted"],
        rollout["agents"],
        rollout["on-target"],
        failed,
        held,
    ));
    Ok(())
}

/// `model-config`: with no argument, the model's config, one `key: value` per line
/// (`ModelConfig.ModelGet`); with `KEY=VALUE` arguments, sets them together
/// (`ModelConfig.ModelSet`; values as text, as `juju model-config` sends them).
pub async fn model_config(session: &Session, settings: &[String]) -> Result<(), CommandError> {
    if settings.is_empty() {
        let reply = session
            .call("ModelConfig", MODEL_CONFIG_VERSION, "ModelGet", json!({}))
            .await?;
        let empty = Map::new();
        let config = reply["config"].as_object().unwrap_or(&empty);
        let mut keys: Vec<&String> = config.keys().collect();
        keys.sort();
        for key in keys {
            let value = &config[key]["value"];
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            say(&format!("{key}: {text}"));
        }
        return Ok(());
    }
    let mut config = Map::new();
    for argument in settings {
        let Some((key, value)) = argument.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            return Err(CommandError::NotASetting {
                argument: argument.clone(),
            });
        };
        config.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    session.wait_ready().await?;
    session
        .mutate(
            "ModelConfig",
            MODEL_CONFIG_VERSION,
            "ModelSet",
            json!({"config": config}),
        )
        .await?;
    Ok(())
}

/// `upgrade-controller`: sets the model's agent-version to `version`, or to the newest
/// published patch of the running major.minor. With `check_agent_versions` the write is
/// Juju's `Client.SetModelAgentVersion` without `force`, which the controller refuses while
/// an agent runs another version than the model's (in the transaction that would write
/// it); otherwise `ModelConfig.ModelSet`, which every lockstep controller serves.
pub async fn upgrade_controller(
    session: &Session,
    version: Option<Version>,
    dry_run: bool,
    reset_previous: bool,
    check_agent_versions: bool,
) -> Result<(), CommandError> {
    if reset_previous {
        // As Juju does: the previous (incomplete) upgrade is aborted, then the upgrade is
        // asked for again.
        session
            .call("Client", CLIENT_VERSION, "AbortCurrentUpgrade", json!({}))
            .await?;
        say("previous upgrade reset");
    }
    session.wait_ready().await?;
    let status = session.call("Upgrade", 1, "Status", json!({})).await?;
    let Some(running) = status["agent-version"]
        .as_str()
        .and_then(|text| Version::parse(text).ok())
    else {
        return Err(CommandError::NoAgentVersion { reply: status });
    };
    let target = match version {
        Some(version) => version,
        None => {
            let tools = session
                .call(
                    "Client",
                    CLIENT_VERSION,
                    "FindTools",
                    json!({"major": running.major, "minor": running.minor}),
                )
                .await?;
            // An unreadable catalogue is not "no upgrades": say why (a mirror whose
            // metadata does not verify, one that cannot be reached).
            if let Some(message) = tools["error"]["message"].as_str()
                && tools["error"]["code"] != "not found"
            {
                return Err(CommandError::FindTools {
                    message: message.to_owned(),
                });
            }
            let newest = tools["list"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|tool| tool["version"].as_str())
                .filter_map(|text| lockstep_core::Binary::parse(text).ok())
                .map(|binary| binary.number)
                .filter(|number| number.same_minor(&running) && number.is_release())
                .max()
                .filter(|newest| *newest > running);
            match newest {
                Some(newest) => newest,
                None => {
                    // As Juju: being up to date is not an error.
                    say(&format!(
                        "no upgrades available: {running} is the newest patch"
                    ));
                    return Ok(());
                }
            }
        }
    };
    if dry_run {
        say(&format!(
            "upgrade to {target} available (dry run: nothing changed)"
        ));
        return Ok(());
    }
    if check_agent_versions {
        session
            .call(
                "Client",
                CLIENT_VERSION,
                "SetModelAgentVersion",
                json!({"version": target.to_string(), "force": false}),
            )
            .await?;
    } else {
        session
            .call(
                "ModelConfig",
                MODEL_CONFIG_VERSION,
                "ModelSet",
                json!({"config": {"agent-version": target.to_string()}}),
            )
            .await?;
    }
    say(&format!("started upgrade to {target}"));
    Ok(())
}

/// `kill-controller`: SIGTERM to the launcher of the controller in `data_dir` and of every
/// controller `enable-ha` added beside it, then waits for them to exit.
pub fn kill_controller(
    data_dir: &Path,
    juju_data: &JujuData,
    timeout: Duration,
) -> Result<(), CommandError> {
    let data = DataDir::new(data_dir);
    // Read before stopping: the entries to remove from Juju's client store are the ones
    // with this controller's name and uuid.
    let controller = ControllerFile::read(&data).ok();
    // The machine agents the local provider started, then the controllers. One that cannot
    // be stopped (a pid file that holds no pid, a process that ignores SIGTERM) is named
    // and the others are stopped all the same; the first failure is the command's.
    // With the local provisioner, any controller may have started an agent, under its own
    // data dir.
    let mut failures = Vec::new();
    let members: Vec<DataDir> = crate::cli::ha::members(&data)
        .into_iter()
        .map(|(_, member)| member)
        .collect();
    let agents: Vec<DataDir> = std::iter::once(&data)
        .chain(&members)
        .flat_map(DataDir::machine_agent_dirs)
        .collect();
    for dir in agents.into_iter().chain(members) {
        if dir.pid_path().exists()
            && let Err(error) = stop_daemon(&dir, timeout)
        {
            failures.push(error);
        }
    }
    if let Err(error) = stop_daemon(&data, timeout) {
        failures.push(error);
    }
    let mut failures = failures.into_iter();
    if let Some(first) = failures.next() {
        for other in failures {
            complain(&format!("{other}"));
        }
        return Err(first);
    }
    if let Some(controller) = controller
        && juju_data.remove_controller(&controller.name, &controller.uuid)?
    {
        say(&format!(
            "Removed controller {:?} from {}",
            controller.name,
            juju_data.dir().display()
        ));
    }
    Ok(())
}

fn stop_daemon(data: &DataDir, timeout: Duration) -> Result<(), CommandError> {
    let path = data.pid_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => {
            return Err(CommandError::NotRunning {
                data_dir: data.root().to_path_buf(),
                path,
                error,
            });
        }
    };
    let not_a_pid = || CommandError::NotAPid {
        path: path.clone(),
        text: text.trim().to_owned(),
    };
    let pid: i32 = text.trim().parse().map_err(|_| not_a_pid())?;
    let target = rustix::process::Pid::from_raw(pid).ok_or_else(not_a_pid)?;
    if !crate::process::alive(pid as u32) {
        say(&format!(
            "lockstepd in {} is not running",
            data.root().display()
        ));
        return Ok(());
    }
    rustix::process::kill_process(target, rustix::process::Signal::TERM).map_err(|error| {
        CommandError::Signal {
            pid,
            error: error.into(),
        }
    })?;
    let started = Instant::now();
    while crate::process::alive(pid as u32) {
        if started.elapsed() > timeout {
            let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
            return Err(CommandError::DidNotStop { pid, timeout });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    say(&format!("lockstepd in {} stopped", data.root().display()));
    Ok(())
}

/// The file names `metadata generate-key` writes in its `--output` directory.
pub const SIGNING_KEY_FILE: &str = "metadata-signing-key.asc";
pub const PUBLIC_KEY_FILE: &str = "metadata-public-key.asc";

/// `metadata generate-key --output DIR`: a new Ed25519 OpenPGP key pair, without a
/// passphrase, for signing a mirror's metadata: `DIR/metadata-signing-key.asc` (the secret
/// key, mode 0600, for `generate-agent-binaries --sign-key`) and
/// `DIR/metadata-public-key.asc` (mode 0644, for `bootstrap --metadata-key`). Never replaces
/// an existing key. Returns the key.
pub fn generate_key(output: &Path, user_id: &str) -> Result<SigningKey, CommandError> {
    let secret_path = output.join(SIGNING_KEY_FILE);
    let public_path = output.join(PUBLIC_KEY_FILE);
    for path in [&secret_path, &public_path] {
        if path.exists() {
            return Err(CommandError::KeyExists { path: path.clone() });
        }
    }
    let key = SigningKey::generate(user_id).map_err(CommandError::GenerateKey)?;
    let secret = key.to_armored().map_err(CommandError::GenerateKey)?;
    let public = key
        .public_key_armored()
        .map_err(CommandError::GenerateKey)?;
    std::fs::create_dir_all(output).map_err(|error| CommandError::KeyFile {
        path: output.to_path_buf(),
        action: "create the directory",
        error,
    })?;
    lockstep_fs::write_file_atomically(&secret_path, secret.as_bytes(), 0o600)?;
    lockstep_fs::write_file_atomically(&public_path, public.as_bytes(), 0o644)?;
    Ok(key)
}

/// Reads the secret key of `--sign-key`: armored or binary, without a passphrase.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, CommandError> {
    let refused = |problem: String| CommandError::SignKey {
        path: path.to_path_buf(),
        problem,
    };
    let file = std::fs::File::open(path).map_err(|error| refused(error.to_string()))?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(
        &mut io::Read::take(file, KEY_FILE_BYTES_MAX + 1),
        &mut bytes,
    )
    .map_err(|error| refused(error.to_string()))?;
    if bytes.len() as u64 > KEY_FILE_BYTES_MAX {
        return Err(refused(format!(
            "larger than {KEY_FILE_BYTES_MAX} bytes: not a key"
        )));
    }
    SigningKey::from_bytes(&bytes).map_err(|error| refused(error.to_string()))
}

/// `metadata generate-agent-binaries -d DIR [--sign-key FILE]`: Juju's command, from the
/// streams adapter; with a key, every document is also written clear-signed (`.sjson`).
/// Without one, signed documents an earlier run left are removed: they would describe the
/// mirror as it was.
pub fn generate_agent_binaries(dir: &Path, sign_key: Option<&Path>) -> Result<(), CommandError> {
    let key = sign_key.map(read_signing_key).transpose()?;
    let generated = lockstep_streams::generate_agent_binaries(
        dir,
        &lockstep_streams::GenerateOptions {
            now_unix_seconds: crate::metadata::unix_now(),
        },
    )
    .map_err(|error| CommandError::Generate {
        dir: dir.to_path_buf(),
        error,
    })?;
    for entry in &generated.entries {
        say(&format!(
            "{} {} ({} bytes, sha256 {})",
            entry.stream, entry.binary, entry.size_bytes, entry.sha256
        ));
    }
    for (file, reason) in &generated.skipped {
        complain(&format!("skipped {file}: {reason}"));
    }
    for file in &generated.files_written {
        say(&format!("wrote tools/{file}"));
    }
    match key {
        Some(key) => {
            let signed = lockstep_streams::sign_generated_metadata(dir, &generated, &key).map_err(
                |error| CommandError::Generate {
                    dir: dir.to_path_buf(),
                    error,
                },
            )?;
            for file in &signed {
                say(&format!(
                    "wrote tools/{file} (signed by key {})",
                    key.fingerprint()
                ));
            }
        }
        None => {
            for file in &generated.files_written {
                let Some(signed) = lockstep_streams::signature::signed_path(file) else {
                    continue;
                };
                let path = dir.join("tools").join(&signed);
                if path.exists() {
                    std::fs::remove_file(&path).map_err(|error| CommandError::KeyFile {
                        path: path.clone(),
                        action: "remove the stale signed document",
                        error,
                    })?;
                    complain(&format!(
                        "removed tools/{signed}: signed by an earlier run, it no longer \
                         describes the mirror"
                    ));
                }
            }
            complain(
                "the metadata is unsigned: controllers accept it only when bootstrapped with \
                 --allow-unsigned-metadata (sign it with --sign-key FILE)",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_without_a_controller_is_named_in_the_error() {
        let root = tempfile::tempdir().unwrap();
        let error = Session::open(root.path(), Duration::from_secs(1)).unwrap_err();
        let ControllerFileError::Read { path, data_dir, .. } = &error else {
            panic!("expected Read, got {error:?}");
        };
        assert_eq!(path, &root.path().join("controller.yaml"));
        assert_eq!(data_dir, root.path());
        assert!(
            error.to_string().contains("--data-dir"),
            "says what to do: {error}"
        );
    }

    #[test]
    fn kill_controller_names_the_pid_file_and_its_text() {
        let root = tempfile::tempdir().unwrap();
        let error = kill_controller(
            root.path(),
            &JujuData::new(root.path().join("juju")),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            matches!(&error, CommandError::NotRunning { data_dir, .. } if data_dir == root.path()),
            "{error:?}"
        );
        let data = DataDir::new(root.path());
        std::fs::write(data.pid_path(), "12ab\n").unwrap();
        let error = kill_controller(
            root.path(),
            &JujuData::new(root.path().join("juju")),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            matches!(&error, CommandError::NotAPid { path, text } if *path == data.pid_path() && text == "12ab"),
            "{error:?}"
        );
        assert!(error.to_string().contains("\"12ab\""), "{error}");
    }

    /// A machine agent whose pid file holds no pid keeps kill-controller from neither
    /// stopping the controller nor naming the file: the controller (here a stand-in
    /// process) is stopped, and the command fails with the agent's pid file.
    #[test]
    fn kill_controller_stops_the_controller_when_an_agent_s_pid_file_is_garbage() {
        let root = tempfile::tempdir().unwrap();
        let data = DataDir::new(root.path());
        let agent = data.machine_agent_dir("1");
        std::fs::create_dir_all(agent.root()).unwrap();
        std::fs::write(agent.agent_conf_path(), "tag: machine-1\n").unwrap();
        std::fs::write(agent.pid_path(), "not a pid\n").unwrap();
        let mut controller = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        std::fs::write(data.pid_path(), format!("{}\n", controller.id())).unwrap();
        let error = kill_controller(
            root.path(),
            &JujuData::new(root.path().join("juju")),
            Duration::from_secs(10),
        )
        .unwrap_err();
        let stopped =
            controller.try_wait().unwrap().is_some() || !crate::process::alive(controller.id());
        let _ = controller.kill();
        let _ = controller.wait();
        assert!(stopped, "the controller was left running");
        assert!(
            matches!(&error, CommandError::NotAPid { path, .. } if *path == agent.pid_path()),
            "{error:?}"
        );
    }
}
