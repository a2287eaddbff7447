//! Crash safety, proven (issue 5, item 4): a real writer process is killed with SIGKILL at
//! every durable write of a bootstrap followed by an upgrade, and the store it left behind is
//! reopened, checked and resumed.
//!
//! - **The scenario** ([`scenario`]) is what a lone controller does: bootstrap at `FROM`
//!   (create the model, capabilities, machines, client operations, its local snapshot),
//!   then the upgrade to `TO` (agent-version, the coordinator lease and its keep-alives,
//!   the upgrade-info record through pending → db-complete → running → complete and its
//!   archive, two database steps with their checkpoints, a host step with its local
//!   checkpoint, `upgradedToVersion`, capabilities re-discovered), then client operations
//!   after it. Every action is decided from the state it finds, so running the scenario
//!   again from the start on whatever a crash left resumes it.
//! - **Crash points.** Every SQLite commit is two points: *before* (inside SQLite's commit
//!   hook: the transaction is complete but not committed) and *after* (the store call
//!   returned: acknowledged). Every atomic write of the local snapshot is two points: before
//!   and after its rename. At point `N` the child prints `crash-point N` and parks; the
//!   parent reads the line and SIGKILLs it.
//! - **The reference.** The parent first runs the scenario in-process, recording at every
//!   commit a dump of the whole store (entities, checkpoints, record, event log) and the
//!   local snapshot at every point. A crash at point `N` must leave exactly the dump of the
//!   last commit acknowledged before `N`: nothing half-applied, nothing lost, nothing from
//!   the killed transaction. Resumed, the run must end in exactly the reference's final
//!   state: every database step applied once, every change in the log once, in order.
//!
//! The child is this test binary, re-run on the ignored test `crash::crash_child` with the
//! directory and the point in the environment; run by hand without them, it runs the whole
//! scenario once and checks its end state.

#![allow(clippy::print_stderr)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_core::jobs::Job;
use lockstep_core::lifecycle::{
    ControllerId, ControllerSet, LeaseToken, RecordWrite, Revision, StepOutcome, UpgradeInfo,
    UpgradeStatus,
};
use lockstep_core::steps::{self, Step, StepKey, StepRegistry, Target};
use lockstep_core::{Millis, Role, Roles, Version};
use serde::{Deserialize, Serialize};

use crate::lease::Lease;
use crate::seed004::{self, LocalProvider};
use crate::suite::{START, model};
use crate::{
    Abort, Application, Changes, Life, Machine, ManualClock, OpenMode, Relation, SqliteStore,
    Store, StoreError, Tx, TxOutcome, Unit,
};

const DIR_ENV: &str = "LOCKSTEP_STORE_CRASH_DIR";
const POINT_ENV: &str = "LOCKSTEP_STORE_CRASH_POINT";
const LINE: &str = "crash-point ";

const FROM: Version = Version::new(0, 0, 9);
const TO: Version = Version::new(0, 1, 0);
const C0: ControllerId = ControllerId(0);
/// Long enough never to expire: every process reads the same manual clock.
const TTL: Millis = Millis(3_600_000);

/// A database step that is not idempotent: applied twice, the charm revision would be 3.
const BUMP_MYSQL: Step = Step::database(
    "bump-mysql-charm",
    TO,
    "move mysql to charm revision 2 and relate it to wordpress",
);
/// A host step: at least once, idempotent, checkpointed in the local snapshot.
const HOST_CONFIG: Step = Step::host(
    "rewrite-agent-config",
    TO,
    &[Target::AllMachines],
    "rewrite the agent's config file",
);
const STEPS: [Step; 3] = [seed004::MACHINE_JOBS_TO_ROLES, BUMP_MYSQL, HOST_CONFIG];
const MYSQL_CHARM_1: &str = "ch:amd64/jammy/mysql-1";
const MYSQL_CHARM_2: &str = "ch:amd64/jammy/mysql-2";
const RELATION: &str = "wordpress:db mysql:server";

fn registry() -> StepRegistry {
    StepRegistry::new(&STEPS).expect("the crash scenario's registry")
}

// ---------------------------------------------------------------------------------------
// Crash points.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    BeforeCommit,
    AfterCommit,
    BeforeRename,
    AfterRename,
}

/// What the reference run expects a crash at one point to leave.
#[derive(Clone, Debug)]
struct Expected {
    kind: Kind,
    /// Index into `State::dumps`: the last acknowledged commit.
    dump: usize,
    /// The local snapshot file's content.
    local: Option<String>,
}

#[derive(Default, Debug)]
struct State {
    count: u64,
    /// Reference only: the store after each commit (`dumps[0]`: before the first).
    dumps: Vec<String>,
    expected: Vec<Expected>,
    local: Option<String>,
}

/// The crash-point counter shared by the commit hook, the store wrapper and the local
/// snapshot writer. `target`: park at that point (the child); `record`: keep what a crash
/// at each point must leave (the reference run).
#[derive(Debug)]
struct Points {
    target: Option<u64>,
    record: bool,
    state: Mutex<State>,
}

impl Points {
    fn new(target: Option<u64>, record: bool) -> Arc<Points> {
        Arc::new(Points {
            target,
            record,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hit(&self, kind: Kind) {
        let mut state = self.lock();
        state.count += 1;
        if self.record {
            let expected = Expected {
                kind,
                dump: state.dumps.len() - 1,
                local: state.local.clone(),
            };
            state.expected.push(expected);
        }
        if self.target == Some(state.count) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{LINE}{} {kind:?}", state.count);
            let _ = out.flush();
            // Parked, holding whatever it holds (the write lock, before a commit), until the
            // parent's SIGKILL.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    fn committed(&self, store: &SqliteStore) {
        if self.record {
            let dump = dump(store);
            self.lock().dumps.push(dump);
        }
        self.hit(Kind::AfterCommit);
    }
}

/// The SQLite store with a crash point after every acknowledged commit (the one before is
/// SQLite's commit hook, installed by [`open`]).
#[derive(Debug)]
struct Probed {
    inner: SqliteStore,
    points: Arc<Points>,
}

impl Store for Probed {
    fn transaction(
        &self,
        fence: Option<LeaseToken>,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<TxOutcome, StoreError> {
        let outcome = self.inner.transaction(fence, body)?;
        if matches!(outcome, TxOutcome::Committed(_)) {
            self.points.committed(&self.inner);
        }
        Ok(outcome)
    }

    fn snapshot(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.inner.snapshot(body)
    }

    fn acquire_lease(
        &self,
        holder: ControllerId,
        ttl: Millis,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let answer = self.inner.acquire_lease(holder, ttl)?;
        self.points.committed(&self.inner);
        Ok(answer)
    }

    fn keep_alive_lease(
        &self,
        holder: ControllerId,
        token: LeaseToken,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let answer = self.inner.keep_alive_lease(holder, token)?;
        self.points.committed(&self.inner);
        Ok(answer)
    }

    fn release_lease(&self, holder: ControllerId, token: LeaseToken) -> Result<bool, StoreError> {
        let answer = self.inner.release_lease(holder, token)?;
        self.points.committed(&self.inner);
        Ok(answer)
    }

    fn lease(&self) -> Result<Option<Lease>, StoreError> {
        self.inner.lease()
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Changes, StoreError> {
        self.inner.changes_since(after, limit)
    }

    fn compact(&self, through: Revision) -> Result<(), StoreError> {
        self.inner.compact(through)?;
        self.points.committed(&self.inner);
        Ok(())
    }
}

fn open(dir: &Path, points: &Arc<Points>) -> Probed {
    let inner = SqliteStore::open_with_clock(
        dir.join("state.db"),
        OpenMode::ReadWrite,
        Arc::new(ManualClock::new(START)),
    )
    .expect("open the store");
    let hook = Arc::clone(points);
    inner.connection().commit_hook(Some(move || {
        hook.hit(Kind::BeforeCommit);
        false
    }));
    if points.record {
        let first = dump(&inner);
        points.lock().dumps.push(first);
    }
    Probed {
        inner,
        points: Arc::clone(points),
    }
}

// ---------------------------------------------------------------------------------------
// The agent's local snapshot (a stand-in for `agent.conf`), written atomically.
// ---------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Local {
    upgraded_to_version: Version,
    host_checkpoints: Vec<StepKey>,
}

fn local_path(dir: &Path) -> PathBuf {
    dir.join("agent.json")
}

fn read_local(dir: &Path) -> Option<Local> {
    let text = std::fs::read_to_string(local_path(dir)).ok()?;
    Some(serde_json::from_str(&text).expect("the local snapshot parses"))
}

/// Temporary file, fsync, rename, fsync of the directory (`CONTRACT.md`).
fn write_local(dir: &Path, local: &Local, points: &Points) {
    let text = serde_json::to_string(local).expect("encode");
    let temporary = dir.join("agent.json.tmp");
    let mut file = std::fs::File::create(&temporary).expect("create");
    file.write_all(text.as_bytes()).expect("write");
    file.sync_all().expect("fsync");
    drop(file);
    points.hit(Kind::BeforeRename);
    std::fs::rename(&temporary, local_path(dir)).expect("rename");
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("fsync the directory");
    points.lock().local = Some(text);
    points.hit(Kind::AfterRename);
}

// ---------------------------------------------------------------------------------------
// The scenario.
// ---------------------------------------------------------------------------------------

fn bump_mysql(tx: &mut dyn Tx) -> Result<(), Abort> {
    let mut mysql = tx
        .application("mysql")?
        .ok_or_else(|| Abort::Failed("no mysql".to_owned()))?;
    let revision: u32 = mysql
        .charm
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Abort::Failed(format!("charm {}", mysql.charm)))?;
    mysql.charm = format!("ch:amd64/jammy/mysql-{}", revision + 1);
    tx.put_application(&mysql)?;
    tx.put_relation(&Relation {
        key: RELATION.to_owned(),
        endpoints: vec!["wordpress:db".to_owned(), "mysql:server".to_owned()],
        life: Life::Alive,
    })?;
    Ok(())
}

fn deploy(tx: &mut dyn Tx, app: &str, unit: &str, machine: &str, charm: &str) -> Result<(), Abort> {
    if tx.application(app)?.is_none() {
        tx.put_application(&Application {
            name: app.to_owned(),
            charm: charm.to_owned(),
            life: Life::Alive,
        })?;
    }
    tx.put_unit(&Unit {
        name: unit.to_owned(),
        application: app.to_owned(),
        machine: Some(machine.to_owned()),
        life: Life::Alive,
    })?;
    Ok(())
}

fn operation(store: &dyn Store, id: &str, body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>) {
    let outcome = store
        .apply_operation(id, &mut |tx| {
            body(tx)?;
            Ok(serde_json::json!({ "operation": id }))
        })
        .expect("client operation");
    assert!(
        !matches!(outcome, crate::OperationOutcome::Failed(_)),
        "{id}: {outcome:?}"
    );
}

fn updated(write: RecordWrite) {
    assert!(
        matches!(write, RecordWrite::Written(_) | RecordWrite::Conflict(_)),
        "{write:?}"
    );
}

/// One controller's bootstrap at `FROM` and upgrade to `TO`; resumes from whatever it finds.
fn scenario(store: &dyn Store, dir: &Path, points: &Points) {
    // --- Bootstrap.
    store
        .create_model(&crate::Model {
            agent_version: FROM,
            controllers: ControllerSet::first(1),
            ..model()
        })
        .expect("create the model");
    if store
        .load_model()
        .unwrap()
        .unwrap()
        .capabilities_discovered
        .is_none()
    {
        let provider = LocalProvider::from_config("manage-networking").unwrap();
        seed004::refresh_capabilities(store, &provider, FROM).expect("capabilities");
    }
    store
        .add_machine(&Machine::with_roles(
            "0",
            Roles::of(&[Role::Controller, Role::HostMachine]),
        ))
        .unwrap();
    seed004::add_machine_from_client(store, "1", vec![Job::HOST_UNITS]).unwrap();
    // A machine restored from a backup of the schema before roles: jobs only.
    operation(store, "op-restore-machine-2", &mut |tx| {
        if tx.machine("2")?.is_none() {
            tx.put_machine(&Machine {
                roles: Roles::NONE,
                legacy_jobs: vec![Job::HOST_UNITS],
                ..Machine::with_roles("2", Roles::NONE)
            })?;
        }
        Ok(())
    });
    operation(store, "op-deploy-mysql", &mut |tx| {
        deploy(tx, "mysql", "mysql/0", "1", MYSQL_CHARM_1)
    });
    operation(store, "op-deploy-wordpress", &mut |tx| {
        deploy(
            tx,
            "wordpress",
            "wordpress/0",
            "2",
            "ch:amd64/jammy/wordpress-7",
        )
    });
    if read_local(dir).is_none() {
        let local = Local {
            upgraded_to_version: FROM,
            host_checkpoints: Vec::new(),
        };
        write_local(dir, &local, points);
    }

    // --- The upgrade (auto-upgrade at bootstrap), this controller coordinating.
    let registry = registry();
    let done = |store: &dyn Store| {
        let view = store.record_view().unwrap();
        view.current.is_none()
            && view
                .last_archived
                .is_some_and(|r| r.describes(FROM, TO) && r.status == UpgradeStatus::Complete)
    };
    if !done(store) {
        if store.load_model().unwrap().unwrap().agent_version != TO {
            let set = store
                .set_agent_version(TO, &crate::AgentVersionCheck::LIFECYCLE)
                .expect("agent-version");
            assert!(matches!(set, crate::AgentVersionSet::Set { .. }), "{set:?}");
        }
        let token = store
            .acquire_lease(C0, TTL)
            .unwrap()
            .expect("the sole controller gets the lease");
        let roles = Roles::of(&[Role::Controller, Role::HostMachine]);
        loop {
            let view = store.record_view().unwrap();
            let Some((record, revision)) = view.current else {
                if done(store) {
                    break;
                }
                updated(
                    store
                        .create_record(UpgradeInfo {
                            previous_version: FROM,
                            target_version: TO,
                            status: UpgradeStatus::Pending,
                            controllers_ready: ControllerSet::EMPTY,
                            controllers_done: ControllerSet::EMPTY,
                        })
                        .unwrap(),
                );
                continue;
            };
            assert!(record.describes(FROM, TO), "{record:?}");
            let local = read_local(dir).expect("bootstrap wrote the local snapshot");
            let plan = steps::plan(&registry, local.upgraded_to_version, TO, roles, true);
            match record.status {
                UpgradeStatus::Pending if !record.controllers_ready.contains(C0) => {
                    let ready = UpgradeInfo {
                        controllers_ready: record.controllers_ready.with(C0),
                        ..record
                    };
                    updated(store.update_record(revision, ready, None).unwrap());
                }
                UpgradeStatus::Pending => {
                    for &index in plan.database() {
                        assert!(store.keep_alive_lease(C0, token).unwrap().is_some());
                        let key = registry.key(index);
                        let outcome = if key == BUMP_MYSQL.key() {
                            store.run_database_step(key, Some(token), &mut bump_mysql)
                        } else {
                            seed004::run_step(store, key, Some(token)).map(Option::unwrap)
                        }
                        .unwrap();
                        assert!(
                            matches!(outcome, StepOutcome::Applied | StepOutcome::AlreadyApplied),
                            "{key}: {outcome:?}"
                        );
                    }
                    let next = UpgradeInfo {
                        status: UpgradeStatus::DbComplete,
                        ..record
                    };
                    updated(store.update_record(revision, next, Some(token)).unwrap());
                }
                UpgradeStatus::DbComplete => {
                    let next = UpgradeInfo {
                        status: UpgradeStatus::Running,
                        ..record
                    };
                    updated(store.update_record(revision, next, Some(token)).unwrap());
                }
                UpgradeStatus::Running => {
                    let mut local = local;
                    for &index in plan.host() {
                        let key = registry.key(index);
                        if local.host_checkpoints.contains(&key) {
                            continue;
                        }
                        // The host step itself: idempotent, at least once.
                        std::fs::write(dir.join("agent.extra.conf"), "rewritten\n").unwrap();
                        local.host_checkpoints.push(key);
                        write_local(dir, &local, points);
                    }
                    if local.upgraded_to_version != TO {
                        // Only once every planned step is checkpointed.
                        for &index in plan.database() {
                            let key = registry.key(index);
                            assert!(checkpointed(store, &key));
                        }
                        local.upgraded_to_version = TO;
                        write_local(dir, &local, points);
                    }
                    let complete = UpgradeInfo {
                        status: UpgradeStatus::Complete,
                        controllers_done: record.controllers_done.with(C0),
                        ..record
                    };
                    updated(
                        store
                            .update_record(revision, complete, Some(token))
                            .unwrap(),
                    );
                }
                other => panic!("unexpected status {other}"),
            }
        }
    }
    if store
        .load_model()
        .unwrap()
        .unwrap()
        .capabilities_discovered
        .is_some_and(|found| found.by != TO)
    {
        let provider = LocalProvider::from_config("manage-networking, manage-firewall").unwrap();
        seed004::refresh_capabilities(store, &provider, TO).expect("capabilities");
    }
    if let Some(lease) = store.lease().unwrap() {
        assert!(store.release_lease(lease.holder, lease.token).unwrap());
    }

    // --- After the upgrade.
    operation(store, "op-add-unit-mysql-1", &mut |tx| {
        deploy(tx, "mysql", "mysql/1", "2", MYSQL_CHARM_1)
    });
    store
        .report_upgrade_available(Some(Version::new(0, 1, 1)))
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------------------

fn checkpointed(store: &dyn Store, key: &StepKey) -> bool {
    let mut found = false;
    store
        .snapshot(&mut |tx| {
            found = tx.checkpoint(key)?.is_some();
            Ok(())
        })
        .unwrap();
    found
}

fn events(store: &dyn Store) -> Vec<crate::Event> {
    match store.changes_since(Revision(0), usize::MAX).unwrap() {
        Changes::Events { events, .. } => events,
        other => panic!("{other:?}"),
    }
}

/// Everything the scenario can have written, and the event log, in one string.
fn dump(store: &SqliteStore) -> String {
    let mut text = String::new();
    store
        .snapshot(&mut |tx| {
            text = format!(
                "revision {:?}\nmodel {:?}\nmachines {:?}\n",
                tx.revision()?,
                tx.model()?,
                tx.machines()?
            );
            for app in ["mysql", "wordpress"] {
                text += &format!("application {:?}\n", tx.application(app)?);
            }
            for unit in ["mysql/0", "mysql/1", "wordpress/0"] {
                text += &format!("unit {:?}\n", tx.unit(unit)?);
            }
            text += &format!("relation {:?}\n", tx.relation(RELATION)?);
            for step in &STEPS {
                text += &format!("checkpoint {:?}\n", tx.checkpoint(&step.key())?);
            }
            for id in [
                "op-restore-machine-2",
                "op-deploy-mysql",
                "op-deploy-wordpress",
                "op-add-unit-mysql-1",
            ] {
                text += &format!("operation {id} {:?}\n", tx.operation(id)?);
            }
            text += &format!(
                "record {:?}\narchived {:?}\n",
                tx.record()?,
                tx.last_archived()?
            );
            Ok(())
        })
        .unwrap();
    for event in events(store) {
        text += &format!("event {event:?}\n");
    }
    text
}

fn integrity(store: &SqliteStore) {
    let check: String = store
        .connection()
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// The local snapshot never claims `upgradedToVersion` before the checkpoints it implies.
fn local_consistent(store: &dyn Store, dir: &Path) {
    let Some(local) = read_local(dir) else {
        return;
    };
    if local.upgraded_to_version == TO {
        for step in &STEPS {
            match step.kind {
                steps::StepKind::Database => assert!(
                    checkpointed(store, &step.key()),
                    "upgradedToVersion {TO} without the checkpoint of {}",
                    step.id
                ),
                steps::StepKind::Host => assert!(local.host_checkpoints.contains(&step.key())),
            }
        }
    }
}

/// The end state of a complete run, from first principles.
fn check_end(store: &SqliteStore, dir: &Path) {
    integrity(store);
    let log = events(store);
    assert!(
        log.windows(2)
            .all(|pair| pair[0].revision < pair[1].revision),
        "revisions strictly increase"
    );
    assert_eq!(store.revision().unwrap(), log.last().unwrap().revision);
    for step in STEPS.iter().filter(|s| s.kind == steps::StepKind::Database) {
        let id = step.key().to_string();
        let count = log.iter().filter(|e| e.id == id).count();
        assert_eq!(count, 1, "checkpoint events of {id}");
    }
    let mysql = store.read(|tx| tx.application("mysql")).unwrap().unwrap();
    assert_eq!(mysql.charm, MYSQL_CHARM_2, "bump-mysql-charm applied once");
    let view = store.record_view().unwrap();
    assert_eq!(view.current, None);
    assert_eq!(
        view.last_archived,
        Some(UpgradeInfo {
            previous_version: FROM,
            target_version: TO,
            status: UpgradeStatus::Complete,
            controllers_ready: ControllerSet::EMPTY.with(C0),
            controllers_done: ControllerSet::EMPTY.with(C0),
        })
    );
    let model = store.load_model().unwrap().unwrap();
    assert_eq!(model.agent_version, TO);
    assert_eq!(model.capabilities_discovered.map(|d| d.by), Some(TO));
    assert!(
        store
            .read(|tx| tx.machines())
            .unwrap()
            .iter()
            .all(|m| !m.roles.is_empty() && m.legacy_jobs.is_empty())
    );
    assert_eq!(store.lease().unwrap(), None);
    assert_eq!(
        read_local(dir),
        Some(Local {
            upgraded_to_version: TO,
            host_checkpoints: vec![HOST_CONFIG.key()],
        })
    );
    local_consistent(store, dir);
}

fn plain(dir: &Path) -> SqliteStore {
    SqliteStore::open_with_clock(
        dir.join("state.db"),
        OpenMode::ReadWrite,
        Arc::new(ManualClock::new(START)),
    )
    .expect("reopen the store")
}

/// The child process, stopped by its id (SIGKILL) and reaped however the parent leaves.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the child to point `point`, reads its line and SIGKILLs it. Returns the kind it named.
fn crash_child_at(dir: &Path, point: u64) -> String {
    let mut child = Running(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "crash::crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir)
            .env(POINT_ENV, point.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the child"),
    );
    // Lines arrive through a thread, so that a child that never reaches its point cannot
    // hang the test: after the deadline it is killed like the others.
    let stdout = child.0.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reached = None;
    while let Ok(line) = received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        // libtest may have written `test crash::crash_child ... ` on the same line.
        if let Some((_, rest)) = line.split_once(LINE) {
            reached = Some(rest.to_owned());
            break;
        }
    }
    // Stopped by its id, whatever happened; then reaped.
    let _ = child.0.kill();
    let status = child.0.wait().unwrap();
    let _ = reader.join();
    let mut stderr = String::new();
    let _ = child.0.stderr.take().unwrap().read_to_string(&mut stderr);
    let Some(rest) = reached else {
        panic!("the child ended or hung ({status}) before crash point {point}:\n{stderr}");
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL");
    let (number, kind) = rest.split_once(' ').unwrap();
    assert_eq!(number.parse::<u64>().unwrap(), point);
    kind.to_owned()
}

/// The child's role; run by hand (no environment), one whole run and its end state.
#[test]
#[ignore = "the crash test's child process; runs the whole scenario when run by hand"]
fn crash_child() {
    match (std::env::var_os(DIR_ENV), std::env::var(POINT_ENV)) {
        (Some(dir), Ok(point)) => {
            let dir = PathBuf::from(dir);
            let points = Points::new(Some(point.parse().unwrap()), false);
            let store = open(&dir, &points);
            scenario(&store, &dir, &points);
            panic!("the scenario ended before crash point {point}");
        }
        _ => {
            let dir = tempfile::tempdir().unwrap();
            let points = Points::new(None, false);
            let store = open(dir.path(), &points);
            scenario(&store, dir.path(), &points);
            check_end(&store.inner, dir.path());
        }
    }
}

#[test]
fn killed_at_every_durable_write_the_store_recovers_and_resumes_exactly_once() {
    let started = Instant::now();
    // The reference: one uninterrupted run, recording what each crash point must leave.
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = Points::new(None, true);
    let (final_dump, expected) = {
        let store = open(reference_dir.path(), &reference);
        scenario(&store, reference_dir.path(), &reference);
        check_end(&store.inner, reference_dir.path());
        let expected = reference.lock().expected.clone();
        // Run again on the finished store: resuming a complete run writes nothing.
        let revision = store.revision().unwrap();
        scenario(&store, reference_dir.path(), &reference);
        assert_eq!(store.revision().unwrap(), revision);
        assert_eq!(reference.lock().expected.len(), expected.len(), "no commit");
        (dump(&store.inner), expected)
    };
    let dumps = reference.lock().dumps.clone();
    let commits = expected
        .iter()
        .filter(|e| e.kind == Kind::BeforeCommit)
        .count();
    assert!(commits >= 20, "{commits} commits");

    let mut tried = 0;
    for (index, want) in expected.iter().enumerate() {
        let point = index as u64 + 1;
        let dir = tempfile::tempdir().unwrap();
        let kind = crash_child_at(dir.path(), point);
        assert_eq!(kind, format!("{:?}", want.kind), "point {point}");
        tried += 1;

        // Reopened: exactly what was acknowledged before the crash.
        let store = plain(dir.path());
        integrity(&store);
        assert_eq!(
            dump(&store),
            dumps[want.dump],
            "crash at point {point} ({:?}) left a state no acknowledged commit had",
            want.kind
        );
        let local = std::fs::read_to_string(local_path(dir.path())).ok();
        assert_eq!(local, want.local, "local snapshot after point {point}");
        local_consistent(&store, dir.path());
        if let Some((record, _)) = store.record_view().unwrap().current {
            assert!(record.describes(FROM, TO));
            assert!(record.controllers_ready.covers(record.controllers_done));
        }

        // Resumed to completion: the reference's end state, every change once.
        let points = Points::new(None, false);
        let resumed = Probed {
            inner: store,
            points,
        };
        scenario(&resumed, dir.path(), &resumed.points);
        check_end(&resumed.inner, dir.path());
        assert_eq!(
            dump(&resumed.inner),
            final_dump,
            "resumed after point {point}"
        );
    }
    eprintln!(
        "crash test: {tried} crash points tried ({commits} commits before and after, {} local \
         snapshot writes), each killed with SIGKILL, reopened, checked and resumed, in {:.1} s",
        (tried - 2 * commits) / 2,
        started.elapsed().as_secs_f64()
    );
}
