//! `lockstep demo`: the seed's scenario, end to end, on this machine.
//!
//! In a temporary directory: a mirror publishing this build as version N and as N+1 (one
//! patch newer, through a `FORCE-VERSION` file in its tarball); a controller bootstrapped on
//! N with `--auto-upgrade`; and, started at the same moment, a deployer that deploys a
//! bundle and a watcher that follows every change. It prints a timeline and checks the
//! claims: the controller restarted into N+1 (its serving process's executable is under
//! `tools/<N+1>`), every deploy operation was applied exactly once, no client saw an
//! error, and the watcher saw every change once, in order. It exits non-zero if any claim
//! does not hold, and stops every process it started.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_core::Version;
use lockstep_core::client::RetryPolicy;
use serde_json::{Value, json};

use crate::bootstrap::{self, BootstrapOptions, ControllerFile, Progress};
use crate::bundle::{Bundle, BundleChange};
use crate::cli;
use crate::datadir::{self, DataDir};
use crate::logging::say;

/// The bundle the demo deploys.
pub const DEMO_BUNDLE: &str = include_str!("../bundles/demo.yaml");

/// One timeline entry: when (since the demo started), who, what.
pub type Event = (Duration, &'static str, String);

/// Events in order, with the time since the demo started.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    events: Arc<Mutex<Vec<Event>>>,
    started: Option<Instant>,
    /// The same moment on the wall clock, to place the daemon's log lines.
    started_unix_micros: u64,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            events: Arc::default(),
            started: Some(Instant::now()),
            started_unix_micros: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0),
        }
    }

    /// Adds an event that happened at `unix_micros` on the wall clock.
    pub fn add_at(&self, unix_micros: u64, party: &'static str, text: impl Into<String>) {
        let at = Duration::from_micros(unix_micros.saturating_sub(self.started_unix_micros));
        self.events
            .lock()
            .expect("not poisoned")
            .push((at, party, text.into()));
    }

    /// Adds the controller's own events from its JSON log: phase and gate changes, steps,
    /// restarts.
    pub fn add_daemon_log(&self, log: &str) {
        for line in log.lines() {
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(at) = entry["timestamp"].as_str().and_then(parse_rfc3339_micros) else {
                continue;
            };
            let message = entry["message"].as_str().unwrap_or("");
            let text = match (entry["target"].as_str().unwrap_or(""), message) {
                ("lockstep::agent", "gate") => format!(
                    "phase {} ({})",
                    entry["phase"].as_str().unwrap_or("?"),
                    if entry["limited"] == true {
                        "gate: limited"
                    } else {
                        "gate: full API"
                    }
                ),
                ("lockstep::agent", "worker starting") => format!(
                    "worker (pid {}) starts on {}",
                    entry["pid"],
                    entry["running"].as_str().unwrap_or("?")
                ),
                ("lockstep::agent", "re-executing") => format!(
                    "restart: re-executes into {} (listening socket handed over)",
                    entry["binary"].as_str().unwrap_or("?")
                ),
                ("lockstep::agent", _) if entry["key"].is_string() => format!(
                    "{} step {}: {message}",
                    entry["kind"].as_str().unwrap_or(""),
                    entry["key"].as_str().unwrap_or("")
                ),
                ("lockstep::launcher", "worker started") => {
                    format!("launcher starts a worker (pid {})", entry["pid"])
                }
                _ => continue,
            };
            self.add_at(at, "controller", text);
        }
    }

    pub fn add(&self, party: &'static str, text: impl Into<String>) {
        let at = self.started.map(|s| s.elapsed()).unwrap_or_default();
        self.events
            .lock()
            .expect("not poisoned")
            .push((at, party, text.into()));
    }

    pub fn render(&self) -> String {
        let mut events = self.events.lock().expect("not poisoned").clone();
        events.sort_by_key(|(at, _, _)| *at);
        events
            .iter()
            .map(|(at, party, text)| format!("{:>8.3}s  {party:<10} {text}", at.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `2026-12-02T16:17:50.114428Z` → microseconds since the Unix epoch.
pub fn parse_rfc3339_micros(text: &str) -> Option<u64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut date = date.split('-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.split(':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    let micros: i64 = format!("{fraction:0<6}").get(..6)?.parse().ok()?;
    // Days from civil (proleptic Gregorian), after Howard Hinnant.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds * 1_000_000 + micros).ok()
}

/// Kills the launcher (and so its worker) when dropped.
#[derive(Debug)]
pub struct DaemonGuard {
    pub pid: u32,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        stop_daemon(self.pid);
    }
}

/// SIGTERM, then SIGKILL after 30 s; waits until the process is gone.
pub fn stop_daemon(pid: u32) {
    let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(target, rustix::process::Signal::TERM);
    let started = Instant::now();
    while bootstrap::alive(pid) {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = rustix::process::kill_process(target, rustix::process::Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Publishes `lockstepd` as `version` into `<mirror>/tools/released/`, with a
/// FORCE-VERSION file when `force`.
pub fn publish(
    mirror: &Path,
    version: Version,
    lockstepd: &Path,
    force: bool,
) -> Result<PathBuf, String> {
    let binary = datadir::host_binary(version);
    let dir = mirror.join("tools").join("released");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let force_file = scratch.path().join("FORCE-VERSION");
    std::fs::write(&force_file, format!("{version}\n")).map_err(|e| e.to_string())?;
    let mut entries = vec![("lockstepd", lockstepd, 0o755)];
    if force {
        entries.push(("FORCE-VERSION", force_file.as_path(), 0o644));
    }
    let tarball = dir.join(format!("juju-{binary}.tgz"));
    crate::unpack::pack_tgz(&entries, &tarball).map_err(|e| e.to_string())?;
    Ok(tarball)
}

/// Regenerates the mirror's simplestreams metadata.
pub fn generate(mirror: &Path) -> Result<(), String> {
    lockstep_streams::generate_agent_binaries(
        mirror,
        &lockstep_streams::GenerateOptions {
            now_unix_seconds: crate::driver::unix_now(),
        },
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// The pid of the launcher's worker (its only child).
pub fn worker_pid(launcher: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// What `/proc/<pid>/exe` resolves to.
pub fn exe_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// A deployer: applies every change of the bundle through its own client, started before
/// the controller is ready. Returns (change, outcome) per change.
pub async fn deployer(
    controller: ControllerFile,
    bundle: Bundle,
    timeline: Timeline,
    deadline: Duration,
) -> (
    Vec<(BundleChange, Result<Value, String>)>,
    lockstep_transport::client::ClientStats,
) {
    let client = controller.client(RetryPolicy::default());
    let mut outcomes = Vec::new();
    for change in bundle.plan() {
        let (facade, version, method, params) = cli::call_for(&change);
        let started = Instant::now();
        let before = client.stats();
        let result = client
            .mutate(facade, version, method, params, deadline)
            .await
            .map_err(|e| cli::describe(&e))
            .and_then(|reply| {
                cli::check_results(&reply, &cli::describe_change(&change)).map(|()| reply)
            });
        let waited = started.elapsed();
        let after = client.stats();
        let retries = after.upgrade_in_progress - before.upgrade_in_progress;
        let reconnects = after.disconnected - before.disconnected;
        if retries + reconnects > 0 {
            timeline.add(
                "deployer",
                format!(
                    "{}: {retries} answers `upgrade in progress` and {reconnects} closed \
                     connections, each retried with the same operation-id",
                    cli::describe_change(&change)
                ),
            );
        }
        timeline.add(
            "deployer",
            match &result {
                Ok(_) if waited > Duration::from_millis(500) => format!(
                    "{} done (waited {:.1}s through the upgrade)",
                    cli::describe_change(&change),
                    waited.as_secs_f64()
                ),
                Ok(_) => format!("{} done", cli::describe_change(&change)),
                Err(error) => format!("{} FAILED: {error}", cli::describe_change(&change)),
            },
        );
        outcomes.push((change, result));
    }
    (outcomes, client.stats())
}

/// What a watcher reconstructed: every entity's last delta, and the revisions it saw.
#[derive(Debug, Default)]
pub struct Watched {
    pub entities: BTreeMap<(String, String), Value>,
    pub revisions: Vec<u64>,
    pub deltas: usize,
    /// Deltas delivered again: the same entity at the same revision.
    pub repeated: Vec<(u64, String, String)>,
    delivered: BTreeSet<(u64, String, String)>,
}

fn entity_key(delta: &Value) -> Option<(String, String)> {
    let kind = delta[0].as_str()?.to_owned();
    let entity = &delta[2];
    let id = ["name", "key", "id"]
        .iter()
        .find_map(|field| entity[field].as_str())
        .unwrap_or("")
        .to_owned();
    Some((kind, id))
}

/// A watcher: follows every change until `done` says it has seen enough.
pub async fn watcher(
    controller: ControllerFile,
    timeline: Timeline,
    deadline: Duration,
    done: impl Fn(&Watched) -> bool,
) -> Result<Watched, String> {
    let client = controller.client(RetryPolicy::default());
    let mut watcher = client.watch();
    let mut watched = Watched::default();
    let started = Instant::now();
    while !done(&watched) {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err("the watcher did not see the deployed state in time".to_owned());
        }
        let deltas = watcher.next(left).await.map_err(|e| cli::describe(&e))?;
        for delta in &deltas {
            watched.deltas += 1;
            watched.revisions.push(delta.revision.0);
            if let Some((kind, id)) = entity_key(&delta.delta) {
                let delivery = (delta.revision.0, kind.clone(), id.clone());
                if !watched.delivered.insert(delivery.clone()) {
                    watched.repeated.push(delivery);
                }
                let key = (kind, id);
                if delta.delta[1] == "remove" {
                    watched.entities.remove(&key);
                } else {
                    watched.entities.insert(key, delta.delta[2].clone());
                }
            }
        }
        if !deltas.is_empty() {
            timeline.add(
                "watcher",
                format!(
                    "{} deltas up to revision {}",
                    deltas.len(),
                    deltas.last().map(|d| d.revision.0).unwrap_or(0)
                ),
            );
        }
    }
    Ok(watched)
}

/// The claims checked at the end; each `Err` says what did not hold.
pub fn check_deploys(
    bundle: &Bundle,
    outcomes: &[(BundleChange, Result<Value, String>)],
    status: &Value,
) -> Vec<Result<String, String>> {
    let mut claims = Vec::new();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|(change, result)| {
            result
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", cli::describe_change(change)))
        })
        .collect();
    claims.push(if failed.is_empty() {
        Ok(format!(
            "the deployer's {} calls all succeeded",
            outcomes.len()
        ))
    } else {
        Err(format!("deployer errors: {}", failed.join("; ")))
    });
    for change in bundle.plan() {
        if let BundleChange::Deploy {
            application,
            num_units,
            ..
        } = change
        {
            let units = status["applications"][&application]["units"]
                .as_object()
                .map(|units| units.len())
                .unwrap_or(0);
            claims.push(if units == num_units as usize {
                Ok(format!("{application}: deployed once, {units} units"))
            } else {
                Err(format!(
                    "{application}: {units} units, expected {num_units} (applied {} times?)",
                    if num_units == 0 {
                        0
                    } else {
                        units / num_units as usize
                    }
                ))
            });
        }
    }
    claims
}

/// Checks the watcher saw each change once, in order, and ended at the controller's state.
pub fn check_watcher(watched: &Watched, status: &Value) -> Vec<Result<String, String>> {
    let mut claims = Vec::new();
    let ordered = watched.revisions.windows(2).all(|pair| pair[0] <= pair[1]);
    let distinct: BTreeSet<_> = watched.revisions.iter().collect();
    claims.push(if !ordered {
        Err(format!("deltas out of order: {:?}", watched.revisions))
    } else if !watched.repeated.is_empty() {
        Err(format!("deltas delivered twice: {:?}", watched.repeated))
    } else {
        Ok(format!(
            "the watcher's {} deltas came once each, in revision order ({} revisions)",
            watched.deltas,
            distinct.len()
        ))
    });
    let applications = status["applications"].as_object();
    let expected: BTreeSet<(String, String)> = applications
        .into_iter()
        .flatten()
        .flat_map(|(name, application)| {
            let units = application["units"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(unit, _)| ("unit".to_owned(), unit.clone()));
            std::iter::once(("application".to_owned(), name.clone())).chain(units)
        })
        .collect();
    let seen: BTreeSet<(String, String)> = watched
        .entities
        .keys()
        .filter(|(kind, _)| kind == "application" || kind == "unit")
        .cloned()
        .collect();
    claims.push(if seen == expected {
        Ok(format!(
            "the watcher saw every application and unit the controller has ({})",
            seen.len()
        ))
    } else {
        Err(format!(
            "the watcher saw {seen:?}, the controller has {expected:?}"
        ))
    });
    claims
}

/// Runs the demo. See the module documentation. SIGINT or SIGTERM stops it, and every
/// process it started.
pub async fn run(keep: bool, timeout: Duration) -> Result<(), String> {
    tokio::select! {
        result = run_demo(keep, timeout) => result,
        () = crate::worker::wait_for_termination() => {
            // Dropping `run_demo` dropped its daemon guard: the controller is stopped.
            Err("interrupted; the demo's controller was stopped".to_owned())
        }
    }
}

async fn run_demo(keep: bool, timeout: Duration) -> Result<(), String> {
    let timeline = Timeline::new();
    let temp = tempfile::Builder::new()
        .prefix("lockstep-demo-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let root = if keep {
        temp.keep()
    } else {
        temp.path().to_path_buf()
    };
    let lockstepd = crate::paths::sibling_executable("lockstepd")?;
    let own = crate::steps::build_version();
    let next = crate::steps::next_patch();
    let mirror = root.join("mirror");
    publish(&mirror, own, &lockstepd, false)?;
    publish(&mirror, next, &lockstepd, true)?;
    generate(&mirror)?;
    timeline.add(
        "mirror",
        format!(
            "published {own} and {next} (FORCE-VERSION) in {}",
            mirror.display()
        ),
    );

    let options = BootstrapOptions {
        data_dir: root.join("controller"),
        name: "demo".to_owned(),
        auto_upgrade: true,
        agent_version: None,
        agent_stream: None,
        build_agent: false,
        metadata_source: Some(mirror.display().to_string()),
        api_port: 0,
        local_agent: lockstepd.clone(),
        store: crate::store::StoreEngine::Sqlite,
        etcd_endpoints: Vec::new(),
        etcd_tls: Default::default(),
    };
    let prepared = bootstrap::prepare(&options).await?;
    let pid = bootstrap::spawn_daemon(
        &prepared.data,
        &["--log-format".to_owned(), "json".to_owned()],
    )?;
    let guard = DaemonGuard { pid };
    timeline.add(
        "operator",
        format!(
            "bootstrap --auto-upgrade: lockstepd started (pid {pid}) on {}",
            prepared.binary
        ),
    );

    let bundle = Bundle::parse(DEMO_BUNDLE).map_err(|e| e.to_string())?;
    let (applications, units, relations) =
        bundle
            .plan()
            .iter()
            .fold((0, 0, 0), |(a, u, r), change| match change {
                BundleChange::Deploy { num_units, .. } => (a + 1, u + *num_units as usize, r),
                BundleChange::AddRelation { .. } => (a, u, r + 1),
                BundleChange::Expose { .. } => (a, u, r),
            });
    let deploy = tokio::spawn(deployer(
        prepared.controller.clone(),
        bundle.clone(),
        timeline.clone(),
        timeout,
    ));
    let watch = tokio::spawn(watcher(
        prepared.controller.clone(),
        timeline.clone(),
        timeout,
        move |watched| {
            let count = |wanted: &str| {
                watched
                    .entities
                    .keys()
                    .filter(|(kind, _)| kind == wanted)
                    .count()
            };
            count("application") >= applications
                && count("unit") >= units
                && count("relation") >= relations
        },
    ));

    let client = prepared.controller.client(RetryPolicy::default());
    let mut last_phase = String::new();
    let ready = bootstrap::wait_until_ready(&client, Some(pid), timeout, |progress: &Progress| {
        if progress.phase != last_phase {
            let gate = if progress.phase == "ready" {
                "gate: full API"
            } else {
                "gate: limited"
            };
            timeline.add(
                "bootstrap",
                format!("sees {} ({gate})", progress.describe()),
            );
            last_phase = progress.phase.clone();
        }
    })
    .await;
    let mut claims: Vec<Result<String, String>> = Vec::new();
    match &ready {
        Ok(_) => timeline.add(
            "controller",
            "Bootstrap complete, controller \"demo\" is now available",
        ),
        Err(error) => claims.push(Err(format!("bootstrap: {error}"))),
    }
    let (outcomes, deployer_stats) = deploy.await.map_err(|e| e.to_string())?;
    let status = client
        .call(
            "Client",
            cli::CLIENT_VERSION,
            "FullStatus",
            json!({}),
            Duration::from_secs(30),
        )
        .await
        .map_err(|e| cli::describe(&e))?;
    let watched = watch.await.map_err(|e| e.to_string())?;

    // The switch was real: the serving process runs the N+1 binary.
    let data = DataDir::new(root.join("controller"));
    let expected_dir = data.binary_dir(&datadir::host_binary(next));
    let serving = worker_pid(pid).and_then(exe_of);
    claims.push(match &serving {
        Some(exe) if exe.starts_with(&expected_dir) => Ok(format!(
            "the serving process runs {} (restarted into {next})",
            exe.display()
        )),
        other => Err(format!(
            "the serving process runs {other:?}, expected a binary under {}",
            expected_dir.display()
        )),
    });
    let agent_version = status["model"]["version"].as_str().unwrap_or("").to_owned();
    timeline.add("controller", format!("model agent-version {agent_version}"));
    claims.extend(check_deploys(&bundle, &outcomes, &status));
    match &watched {
        Ok(watched) => claims.extend(check_watcher(watched, &status)),
        Err(error) => claims.push(Err(format!("watcher: {error}"))),
    }
    drop(guard);
    timeline.add("operator", "controller stopped");
    timeline.add_daemon_log(&bootstrap::log_tail(&data, usize::MAX));
    claims.push(Ok(format!(
        "no client error; the deployer retried {} `upgrade in progress` answers and {} \
         closed connections",
        deployer_stats.upgrade_in_progress, deployer_stats.disconnected
    )));

    say("Timeline:");
    say(&timeline.render());
    say("\nResult:");
    let mut failures = 0;
    for claim in &claims {
        match claim {
            Ok(text) => say(&format!("  ok    {text}")),
            Err(text) => {
                failures += 1;
                say(&format!("  FAIL  {text}"));
            }
        }
    }
    if keep {
        say(&format!("\nkept {}", root.display()));
    }
    if failures > 0 {
        return Err(format!(
            "{failures} of {} claims did not hold",
            claims.len()
        ));
    }
    say(&format!("\nall {} claims hold", claims.len()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_timestamps_parse_to_unix_microseconds() {
        assert_eq!(parse_rfc3339_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_micros("2000-02-29T00:00:01.5Z"),
            Some(951_782_401_500_000)
        );
        assert_eq!(
            parse_rfc3339_micros("2026-11-03T18:22:05.000001Z"),
            Some(1_793_730_125_000_001)
        );
        assert_eq!(parse_rfc3339_micros("yesterday"), None);
    }
}
