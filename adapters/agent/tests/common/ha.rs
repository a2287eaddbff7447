//! The harness of the HA tests and benchmarks: a 3-member etcd cluster and controllers on
//! it (`lockstep bootstrap --store etcd`, then `lockstep enable-ha`), with the store view a
//! test needs to see who coordinates and what was checkpointed. Included by `tests/ha.rs`
//! and `benches/ha.rs` beside `common` and `etcd_cluster`.
#![allow(dead_code, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, Controller, Mirror, Published, lockstep, next, text};
use crate::etcd_cluster::EtcdCluster;
use lockstep_agent::store::StoreSettings;
use lockstep_core::Version;
use lockstep_core::lifecycle::{Limits, UpgradeInfo, UpgradeStatus};
use lockstep_store::Store;

/// Bootstrap, enable-ha, and each restart of a controller on a busy 2-core machine.
pub const READY_WITHIN: Duration = Duration::from_secs(180);
/// A whole coordinated upgrade of three controllers, database step pauses included.
pub const UPGRADED_WITHIN: Duration = Duration::from_secs(300);
/// The lease's TTL the agent asks etcd for (five keep-alive intervals, 5 s): a dead or
/// cut-off coordinator's lease lapses within it.
pub fn lease_ttl() -> Duration {
    Duration::from_millis(Limits::default().lease_ttl().0)
}

/// The delay before a controller campaigns again (1 s): another one asks within it.
pub fn lease_retry() -> Duration {
    Duration::from_millis(Limits::default().lease_retry_delay.0)
}
/// Scheduling and etcd round trips on a loaded machine, on top of the lease bound.
pub const TAKEOVER_SLACK: Duration = Duration::from_secs(5);
/// How long the database step pauses inside its transaction (the failpoint), long enough
/// for a test to kill or cut off the coordinator while it is under way, and longer than a
/// lease's TTL so that a cut-off coordinator's lease lapses before its commit is tried.
pub const DB_STEP_PAUSE_MS: &str = "8000";

/// The log line of a database step starting (`steps.rs`).
pub const DB_STEP_LINE: &str = "running database step";
/// The log line of a keep-alive unanswered within the lease's remaining TTL (`driver.rs`).
pub const LEASE_GIVEN_UP_LINE: &str = "lease keep-alive unanswered; giving the lease up";

/// Three controllers on a 3-member etcd cluster. Fields drop in order: the controllers are
/// stopped (by pid) before etcd is.
pub struct Ha {
    /// By controller id: `controllers[0]` is the one bootstrapped, 1 and 2 `enable-ha` added.
    pub controllers: Vec<Controller>,
    pub store: Arc<dyn Store>,
    env: Vec<(String, String)>,
    _mirror: Mirror,
    pub etcd: EtcdCluster,
}

impl Drop for Ha {
    /// Stops the added controllers before the first one: their data dirs (and pid files)
    /// live in the first one's temporary directory, which its own drop removes.
    fn drop(&mut self) {
        for controller in self.controllers.iter().rev() {
            controller.stop();
        }
    }
}

impl Ha {
    /// Starts etcd, bootstraps controller 0 on it with a mirror holding this build (N) and
    /// the next patch (N+1), then `lockstep enable-ha -n 3`. `env` reaches every controller
    /// (`lockstep` passes its environment to the daemons it starts) and every restart.
    pub fn start(env: &[(&str, &str)]) -> Ha {
        Ha::start_n(3, env)
    }

    /// As [`Ha::start`] with `count` controllers: 1 (no enable-ha, one controller on etcd)
    /// or 3.
    pub fn start_n(count: u8, env: &[(&str, &str)]) -> Ha {
        Ha::start_on(EtcdCluster::start(3, &[]), count, env)
    }

    /// As [`Ha::start_n`] on `etcd`; over TLS (`--etcd-cacert`, `--etcd-cert`, `--etcd-key`)
    /// when the cluster was started with it.
    pub fn start_on(etcd: EtcdCluster, count: u8, env: &[(&str, &str)]) -> Ha {
        let mirror = Mirror::n_and_next(Published::Lockstepd);
        let source = mirror.source();
        let endpoints = etcd.endpoints().join(",");
        let mut args = vec![
            "--metadata-source".to_owned(),
            source,
            "--metadata-key".to_owned(),
            mirror.key(),
            "--store".to_owned(),
            "etcd".to_owned(),
            "--etcd-endpoints".to_owned(),
            endpoints,
        ];
        if let Some(tls) = etcd.tls() {
            for (flag, path) in [
                ("--etcd-cacert", &tls.ca),
                ("--etcd-cert", &tls.cert),
                ("--etcd-key", &tls.key),
            ] {
                args.push(flag.to_owned());
                args.push(path.to_str().expect("a UTF-8 path").to_owned());
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let primary = Controller::bootstrap(&args, env);
        primary.assert_bootstrapped();
        if count > 1 {
            let count = count.to_string();
            let enable = lockstep(&primary.data_dir, &["enable-ha", "-n", &count], env);
            assert!(
                enable.status.success(),
                "enable-ha: {}\nlog:\n{}",
                text(&enable),
                primary.log()
            );
        }
        let conf = primary.data().read_agent_conf().unwrap().unwrap();
        let store = lockstep_agent::store::open(&primary.data(), &StoreSettings::of(&conf))
            .expect("the test reaches the controllers' store");
        let members: Vec<Controller> = (1..count)
            .map(|id| Controller::attach(primary.data().ha_member_dir(id)))
            .collect();
        let controllers: Vec<Controller> = std::iter::once(primary).chain(members).collect();
        for (id, controller) in controllers.iter().enumerate() {
            assert_eq!(controller.tag(), format!("machine-{id}"));
            // Every controller pins the operator's metadata key in its own agent.conf, from
            // its own copy of the keyring (enable-ha copies it; the store never holds it).
            let pinned = controller.data().read_agent_conf().unwrap().unwrap();
            assert_eq!(
                pinned.metadata_key_fingerprints,
                vec![mirror.key.as_ref().unwrap().fingerprint()],
                "controller {id}"
            );
            assert_eq!(
                pinned.metadata_keyring.as_deref(),
                Some(controller.data().metadata_keys_path().as_path()),
                "controller {id}"
            );
        }
        Ha {
            controllers,
            store,
            env: env
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
            _mirror: mirror,
            etcd,
        }
    }

    pub fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect()
    }

    /// Starts controller `id` again on its data dir (its current binary), with the scenario's
    /// environment and `extra`.
    pub fn restart(&self, id: usize, extra: &[(&str, &str)]) {
        let mut env = self.env();
        env.extend_from_slice(extra);
        self.controllers[id].start(&env);
    }

    /// The controller holding the coordinator's lease now, if any.
    pub fn coordinator(&self) -> Option<usize> {
        self.store
            .lease()
            .ok()
            .flatten()
            .map(|lease| usize::from(lease.holder.0))
    }

    /// `lockstep upgrade-controller --agent-version N+1` through controller 0.
    pub fn upgrade(&self) {
        let upgrade = self.controllers[0].run(&[
            "upgrade-controller",
            "--agent-version",
            &next().to_string(),
        ]);
        assert!(upgrade.status.success(), "{}", text(&upgrade));
    }

    pub fn log_lines(&self, id: usize, needle: &str) -> usize {
        self.controllers[id].log().matches(needle).count()
    }

    pub fn db_step_lines(&self) -> Vec<usize> {
        (0..self.controllers.len())
            .map(|id| self.log_lines(id, DB_STEP_LINE))
            .collect()
    }

    /// Waits until a controller starts a database step it had not started when `before` was
    /// counted and holds the lease; returns its id.
    pub async fn wait_database_step(&self, before: &[usize]) -> usize {
        let started = Instant::now();
        loop {
            let now = self.db_step_lines();
            let running: Vec<usize> = (0..now.len()).filter(|&id| now[id] > before[id]).collect();
            if let Some(coordinator) = self.coordinator()
                && running.contains(&coordinator)
            {
                return coordinator;
            }
            assert!(
                started.elapsed() < UPGRADED_WITHIN,
                "no controller started a database step (started: {running:?}, lease: {:?})\n{}",
                self.coordinator(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `lockstep deploy <the demo bundle>` through controller `id`, on a thread: a client
    /// whose calls wait through whatever the controllers go through. [`Ha::assert_deployed_once`]
    /// joins it.
    pub fn deploy_in_background(&self, id: usize) -> std::thread::JoinHandle<Output> {
        let bundle = common::bundle_file(self.controllers[id].dir.path());
        let data_dir = self.controllers[id].data_dir.clone();
        std::thread::spawn(move || {
            lockstep(
                &data_dir,
                &["deploy", bundle.to_str().expect("a UTF-8 path")],
                &[],
            )
        })
    }

    /// The deploy succeeded, and every controller shows each of its operations applied once.
    pub async fn assert_deployed_once(&self, deploy: std::thread::JoinHandle<Output>) {
        let deploy = deploy.join().expect("the deploy thread");
        assert!(
            deploy.status.success(),
            "deploy: {}\n{}",
            text(&deploy),
            self.logs()
        );
        for controller in &self.controllers {
            let status = controller.full_status().await;
            common::assert_bundle_deployed_once(&status);
        }
    }

    /// Upgrades to N+1, kills -9 the coordinator once it is inside its database step (run
    /// with the step's pause failpoint), and waits until another controller holds the lease:
    /// returns the killed one, its successor, and the time from the kill to the takeover.
    pub async fn kill_coordinator_in_database_step(&self) -> (usize, usize, Duration) {
        let before = self.db_step_lines();
        self.upgrade();
        let coordinator = self.wait_database_step(&before).await;
        // Mid-transaction: nothing of the step is committed yet.
        self.controllers[coordinator].kill_9();
        let (successor, takeover) = self.wait_takeover(coordinator, Instant::now()).await;
        (coordinator, successor, takeover)
    }

    /// Waits until another controller than `deposed` holds the lease; returns it and how
    /// long that took from `since`.
    pub async fn wait_takeover(&self, deposed: usize, since: Instant) -> (usize, Duration) {
        loop {
            if let Some(holder) = self.coordinator()
                && holder != deposed
            {
                return (holder, since.elapsed());
            }
            assert!(
                since.elapsed() < UPGRADED_WITHIN,
                "nobody took the lease over from controller {deposed}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait_all_running(&self, version: Version) {
        for controller in &self.controllers {
            controller.wait_running(version, UPGRADED_WITHIN).await;
        }
    }

    /// The upgrade record to `version`, current or archived.
    pub fn record_to(&self, version: Version) -> Option<UpgradeInfo> {
        let view = self.store.record_view().expect("the record view");
        view.current
            .map(|(record, _)| record)
            .into_iter()
            .chain(view.last_archived)
            .find(|record| record.target_version == version)
    }

    /// The outcome every scenario that completes asserts: all three Ready on N+1 and serving
    /// its binary, the record to N+1 complete with all three done, each database step
    /// checkpointed exactly once, and the new version's database step among them.
    pub async fn assert_upgraded_once(&self) {
        self.wait_all_running(next()).await;
        for controller in &self.controllers {
            let exe = controller.serving_exe().expect("a worker runs");
            assert!(
                exe.starts_with(controller.binary_dir(next())),
                "{}: {exe:?}",
                controller.tag()
            );
        }
        let record = self.record_to(next()).expect("a record of the upgrade");
        assert_eq!(record.status, UpgradeStatus::Complete, "{record:?}");
        let done: BTreeSet<u8> = record.controllers_done.iter().map(|c| c.0).collect();
        let all: BTreeSet<u8> = (0..self.controllers.len() as u8).collect();
        assert_eq!(done, all, "{record:?}");
        self.assert_database_steps_once();
        let checkpoints = common::checkpoint_events_in(&*self.store);
        assert!(
            checkpoints.contains_key(&next_database_step()),
            "{checkpoints:?}"
        );
    }

    pub fn assert_database_steps_once(&self) {
        let checkpoints = common::checkpoint_events_in(&*self.store);
        for (step, count) in &checkpoints {
            assert_eq!(
                *count,
                1,
                "{step} checkpointed {count} times\n{}",
                self.logs()
            );
        }
    }

    /// The last lines of every controller's log, for failure messages.
    pub fn logs(&self) -> String {
        self.controllers
            .iter()
            .map(|controller| {
                let log = controller.log();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- {} ---\n{}",
                    controller.tag(),
                    lines[lines.len().saturating_sub(25)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The key of N+1's database step, as checkpoint events name it.
pub fn next_database_step() -> String {
    format!(
        "{}@{}",
        lockstep_agent::steps::RECORD_AGENT_BINARIES,
        next()
    )
}

/// Whether N+1's database step has been checkpointed.
pub fn next_step_checkpointed(store: &dyn Store) -> bool {
    common::checkpoint_events_in(store).contains_key(&next_database_step())
}
