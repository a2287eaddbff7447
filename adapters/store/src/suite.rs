//! One test suite, run against every engine (`suite!` below instantiates it per engine).

use std::sync::Arc;

use lockstep_core::jobs::{Capabilities, Capability, Job, JobTable};
use lockstep_core::lifecycle::{
    ControllerId, ControllerSet, RecordWrite, Revision, StepOutcome, UpgradeInfo, UpgradeStatus,
};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::steps::{StepId, StepKey};
use lockstep_core::{Millis, Role, Roles, Timestamp, Version};

use lockstep_core::policy::{Catalogue, CatalogueEntry, Sha256, Stream};

use crate::{
    Abort, AgentStatus, AgentVersionChange, AgentVersionCheck, AgentVersionRefusal,
    AgentVersionSet, Application, ChangeKind, Changes, Clock, EntityKind, Life, Machine,
    ManualClock, Model, OperationOutcome, Store, StoreError, Tx, TxOutcome, Unit, seed004,
};

/// An engine under test: a store, a second handle on the same store (another controller),
/// the clock both read, and a restart that keeps only what is durable.
pub(crate) trait Harness {
    type S: Store;
    fn new() -> Self;
    fn store(&self) -> &Self::S;
    fn second(&self) -> Self::S;
    fn clock(&self) -> &ManualClock;
    fn restart(&mut self);
}

pub(crate) const START: Timestamp = Timestamp(1_700_000_000_000);
const TTL: Millis = Millis(2000);

pub(crate) struct MemoryHarness {
    store: crate::MemoryStore,
    clock: ManualClock,
}

impl Harness for MemoryHarness {
    type S = crate::MemoryStore;
    fn new() -> Self {
        let clock = ManualClock::new(START);
        let store =
            crate::MemoryStore::with_clock(crate::Durability::Full, Arc::new(clock.clone()));
        MemoryHarness { store, clock }
    }
    fn store(&self) -> &Self::S {
        &self.store
    }
    fn second(&self) -> Self::S {
        self.store.clone()
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn restart(&mut self) {
        self.store.crash();
    }
}

pub(crate) struct SqliteHarness {
    dir: tempfile::TempDir,
    store: Option<crate::SqliteStore>,
    clock: ManualClock,
}

impl SqliteHarness {
    fn open(&self) -> crate::SqliteStore {
        crate::SqliteStore::open_with_clock(
            self.dir.path().join("state.db"),
            crate::OpenMode::ReadWrite,
            Arc::new(self.clock.clone()),
        )
        .expect("open the store")
    }
}

impl Harness for SqliteHarness {
    type S = crate::SqliteStore;
    fn new() -> Self {
        let mut harness = SqliteHarness {
            dir: tempfile::tempdir().expect("a temp dir"),
            store: None,
            clock: ManualClock::new(START),
        };
        harness.store = Some(harness.open());
        harness
    }
    fn store(&self) -> &Self::S {
        self.store.as_ref().expect("open")
    }
    fn second(&self) -> Self::S {
        self.open()
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn restart(&mut self) {
        self.store = None;
        self.store = Some(self.open());
    }
}

/// The test process's etcd: one member shared by every etcd harness alive at a time (each
/// on its own key prefix, so revisions start at 0 for each), killed by pid when the last
/// harness using it is dropped.
#[cfg(feature = "etcd")]
#[path = "../tests/support/etcd_cluster.rs"]
pub(crate) mod etcd_cluster;

#[cfg(feature = "etcd")]
fn shared_etcd() -> Arc<etcd_cluster::EtcdCluster> {
    use std::sync::{Mutex, Weak};
    static SHARED: Mutex<Weak<etcd_cluster::EtcdCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(etcd_cluster::EtcdCluster::start(1, &[]));
    *shared = Arc::downgrade(&cluster);
    cluster
}

/// The etcd engine on a fresh prefix of the shared member. Leases are granted for two
/// minutes on the server, so that the manual clock alone decides expiry, as it does for the
/// other engines (`tests/etcd.rs` checks the server's TTL on the system clock).
#[cfg(feature = "etcd")]
pub(crate) struct EtcdHarness {
    cluster: Arc<etcd_cluster::EtcdCluster>,
    prefix: String,
    store: Option<crate::EtcdStore>,
    clock: ManualClock,
}

#[cfg(feature = "etcd")]
impl EtcdHarness {
    fn open(&self) -> crate::EtcdStore {
        let mut config =
            crate::EtcdConfig::new(self.cluster.endpoints()).with_prefix(self.prefix.clone());
        config.server_ttl_min = std::time::Duration::from_secs(120);
        crate::EtcdStore::connect_with_clock(config, Arc::new(self.clock.clone()))
            .expect("connect to etcd")
    }
}

#[cfg(feature = "etcd")]
impl Harness for EtcdHarness {
    type S = crate::EtcdStore;
    fn new() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut harness = EtcdHarness {
            cluster: shared_etcd(),
            prefix: format!(
                "suite-{}-{}/",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            store: None,
            clock: ManualClock::new(START),
        };
        harness.store = Some(harness.open());
        harness
    }
    fn store(&self) -> &Self::S {
        self.store.as_ref().expect("open")
    }
    fn second(&self) -> Self::S {
        self.open()
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn restart(&mut self) {
        self.store = None;
        self.store = Some(self.open());
    }
}

pub(crate) fn v(text: &str) -> Version {
    Version::parse(text).expect("a version")
}

pub(crate) fn model() -> Model {
    Model {
        uuid: "deadbeef-0000-4000-8000-000000000001".to_owned(),
        name: "controller".to_owned(),
        agent_version: v("2.9.42"),
        agent_stream: None,
        agent_metadata_url: None,
        policy: UpgradePolicy::Off,
        controllers: ControllerSet::first(3),
        capabilities: Capabilities::new(),
        capabilities_discovered: None,
        upgrade_available: None,
    }
}

fn record(status: UpgradeStatus, ready: &[u8], done: &[u8]) -> UpgradeInfo {
    let set = |ids: &[u8]| {
        ids.iter()
            .fold(ControllerSet::EMPTY, |set, &id| set.with(ControllerId(id)))
    };
    UpgradeInfo {
        previous_version: v("2.9.42"),
        target_version: v("2.9.43"),
        status,
        controllers_ready: set(ready),
        controllers_done: set(done),
    }
}

fn key(id: &'static str, version: &str) -> StepKey {
    StepKey {
        id: StepId::new(id),
        target_version: v(version),
    }
}

fn written(write: RecordWrite) -> lockstep_core::lifecycle::RecordView {
    match write {
        RecordWrite::Written(view) => view,
        other => panic!("expected a write, got {other:?}"),
    }
}

fn all_events(store: &dyn Store) -> Vec<crate::Event> {
    match store
        .changes_since(Revision(0), usize::MAX)
        .expect("changes")
    {
        Changes::Events { events, .. } => events,
        other => panic!("expected events, got {other:?}"),
    }
}

fn add_application(tx: &mut dyn Tx, name: &str) -> Result<(), Abort> {
    tx.put_application(&Application {
        name: name.to_owned(),
        charm: format!("ch:amd64/jammy/{name}-1"),
        life: Life::Alive,
    })?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The upgrade-info record: create-if-absent, compare-and-set, archiving.
// ---------------------------------------------------------------------------------------

pub(crate) fn record_create_if_absent_and_compare_and_set<H: Harness>() {
    let h = H::new();
    let store = h.store();
    assert_eq!(store.record_view().unwrap().current, None);

    let first = written(
        store
            .create_record(record(UpgradeStatus::Pending, &[0], &[]))
            .unwrap(),
    );
    let (created, revision) = first.current.expect("created");
    assert_eq!(created, record(UpgradeStatus::Pending, &[0], &[]));
    assert_eq!(revision, first.revision);

    // Create-if-absent: a second create conflicts and shows the current record.
    let other = h.second();
    match other
        .create_record(record(UpgradeStatus::Pending, &[1], &[]))
        .unwrap()
    {
        RecordWrite::Conflict(view) => assert_eq!(view.current, Some((created, revision))),
        write => panic!("a second create must conflict, got {write:?}"),
    }

    // Compare-and-set: a stale revision conflicts, nothing changes.
    let ready = record(UpgradeStatus::Pending, &[0, 1], &[]);
    let stale = Revision(revision.0 - 1);
    assert!(matches!(
        other.update_record(stale, ready, None).unwrap(),
        RecordWrite::Conflict(_)
    ));
    assert_eq!(
        store.record_view().unwrap().current,
        Some((created, revision))
    );
    let after = written(other.update_record(revision, ready, None).unwrap());
    let (_, ready_revision) = after.current.unwrap();
    assert!(ready_revision > revision);
    // The old revision is stale now.
    assert!(matches!(
        store.update_record(revision, ready, None).unwrap(),
        RecordWrite::Conflict(_)
    ));

    // An invalid transition (ready shrinks) is refused, and nothing is written.
    let before = store.revision().unwrap();
    let error = store
        .update_record(
            ready_revision,
            record(UpgradeStatus::DbComplete, &[0], &[]),
            None,
        )
        .unwrap_err();
    assert!(
        matches!(error, StoreError::InvalidTransition { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("pending"), "{error}");
    assert_eq!(store.revision().unwrap(), before);

    // A new record must start pending.
    let error = store
        .create_record(record(UpgradeStatus::Running, &[0], &[]))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::InvalidNewRecord { .. }),
        "{error}"
    );

    // pending -> db-complete -> running -> complete archives it.
    let mut revision = ready_revision;
    for next in [
        record(UpgradeStatus::DbComplete, &[0, 1], &[]),
        record(UpgradeStatus::Running, &[0, 1], &[]),
        record(UpgradeStatus::Running, &[0, 1], &[0]),
    ] {
        let view = written(store.update_record(revision, next, None).unwrap());
        revision = view.current.unwrap().1;
    }
    let complete = record(UpgradeStatus::Complete, &[0, 1], &[0, 1]);
    let view = written(store.update_record(revision, complete, None).unwrap());
    assert_eq!(view.current, None);
    assert_eq!(view.last_archived, Some(complete));
    // A new upgrade may start once the last one is archived.
    let next = written(
        store
            .create_record(record(UpgradeStatus::Pending, &[2], &[]))
            .unwrap(),
    );
    assert_eq!(next.last_archived, Some(complete));

    // The event log shows the record's life: changes, then a removal carrying the final
    // record, then the new one.
    let record_events: Vec<_> = all_events(store)
        .into_iter()
        .filter(|event| event.kind == EntityKind::UpgradeInfo)
        .collect();
    assert_eq!(record_events.len(), 7);
    assert_eq!(record_events[5].change, ChangeKind::Remove);
    assert_eq!(record_events[5].entity["status"], "complete");
    assert_eq!(record_events[6].change, ChangeKind::Change);
}

pub(crate) fn aborted_record_is_archived<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let view = written(
        store
            .create_record(record(UpgradeStatus::Pending, &[0], &[]))
            .unwrap(),
    );
    let revision = view.current.unwrap().1;
    let aborted = record(UpgradeStatus::Aborted, &[0], &[]);
    let view = written(store.update_record(revision, aborted, None).unwrap());
    assert_eq!((view.current, view.last_archived), (None, Some(aborted)));
    // Archived records are final: a CAS on the old revision conflicts.
    assert!(matches!(
        store
            .update_record(revision, record(UpgradeStatus::DbComplete, &[0], &[]), None)
            .unwrap(),
        RecordWrite::Conflict(_)
    ));
}

// ---------------------------------------------------------------------------------------
// The lease: grant, keep-alive, expiry, fencing.
// ---------------------------------------------------------------------------------------

pub(crate) fn lease_keep_alive_expiry_and_fencing<H: Harness>() {
    let h = H::new();
    let (a, b) = (h.store(), h.second());
    let (c0, c1) = (ControllerId(0), ControllerId(1));

    let t1 = a
        .acquire_lease(c0, TTL)
        .unwrap()
        .expect("a free lease is granted");
    assert_eq!(
        b.acquire_lease(c1, TTL).unwrap(),
        None,
        "held by controller 0"
    );
    assert_eq!(
        a.acquire_lease(c0, TTL).unwrap(),
        Some(t1),
        "the holder keeps its token"
    );
    assert_eq!(
        b.keep_alive_lease(c1, t1).unwrap(),
        None,
        "not controller 1's lease"
    );

    // Keep-alives extend the lease past its first TTL.
    for _ in 0..4 {
        h.clock().advance(Millis(TTL.0 / 2));
        assert_eq!(a.keep_alive_lease(c0, t1).unwrap(), Some(t1));
    }
    assert_eq!(b.acquire_lease(c1, TTL).unwrap(), None);

    // A fenced write on the live lease commits.
    let view = written(
        a.create_record(record(UpgradeStatus::Pending, &[0], &[]))
            .unwrap(),
    );
    let revision = view.current.unwrap().1;
    let view = written(
        a.update_record(
            revision,
            record(UpgradeStatus::Pending, &[0, 1], &[]),
            Some(t1),
        )
        .unwrap(),
    );
    let revision = view.current.unwrap().1;

    // Keep-alives stop; the lease expires at exactly now + TTL.
    h.clock().advance(Millis(TTL.0 - 1));
    assert!(a.lease().unwrap().unwrap().is_live(h.clock().now()));
    h.clock().advance(Millis(1));
    assert_eq!(a.keep_alive_lease(c0, t1).unwrap(), None, "expired: lost");
    let before = a.revision().unwrap();
    assert_eq!(
        a.update_record(
            revision,
            record(UpgradeStatus::DbComplete, &[0, 1], &[]),
            Some(t1)
        )
        .unwrap(),
        RecordWrite::Fenced
    );
    assert_eq!(
        a.revision().unwrap(),
        before,
        "a fenced write wrote nothing"
    );

    // Controller 1 takes over with a newer token; the old one stays fenced even if its
    // holder asks again later.
    let t2 = b
        .acquire_lease(c1, TTL)
        .unwrap()
        .expect("expired lease is free");
    assert!(t2 > t1, "tokens only grow: {t2:?} after {t1:?}");
    assert_eq!(a.keep_alive_lease(c0, t1).unwrap(), None);
    assert_eq!(
        a.update_record(
            revision,
            record(UpgradeStatus::DbComplete, &[0, 1], &[]),
            Some(t1)
        )
        .unwrap(),
        RecordWrite::Fenced
    );
    written(
        b.update_record(
            revision,
            record(UpgradeStatus::DbComplete, &[0, 1], &[]),
            Some(t2),
        )
        .unwrap(),
    );

    // Release: only the holder's token releases it.
    assert!(!a.release_lease(c0, t1).unwrap());
    assert!(
        !a.release_lease(c0, t2).unwrap(),
        "right token, wrong holder"
    );
    assert!(b.release_lease(c1, t2).unwrap());
    assert_eq!(a.lease().unwrap(), None);
    let t3 = a.acquire_lease(c0, TTL).unwrap().unwrap();
    assert!(t3 > t2, "a released token is never granted again");
}

// ---------------------------------------------------------------------------------------
// Exactly-once database steps.
// ---------------------------------------------------------------------------------------

pub(crate) fn database_step_runs_exactly_once<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let step = key("add-mysql", "2.9.43");
    let mut runs = 0;
    let mut body = |tx: &mut dyn Tx| {
        runs += 1;
        add_application(tx, "mysql")
    };
    assert_eq!(
        store.run_database_step(step, None, &mut body).unwrap(),
        StepOutcome::Applied
    );
    let after_first = store.revision().unwrap();
    assert_eq!(
        h.second().run_database_step(step, None, &mut body).unwrap(),
        StepOutcome::AlreadyApplied
    );
    assert_eq!(runs, 1, "a checkpointed step is not run again");
    assert_eq!(store.revision().unwrap(), after_first);

    // The step's change and its checkpoint are in the log exactly once, in order.
    let events = all_events(store);
    let kinds: Vec<_> = events.iter().map(|e| (e.kind, e.id.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (EntityKind::Application, "mysql"),
            (EntityKind::Step, "add-mysql@2.9.43")
        ]
    );
    assert_eq!(events[1].entity["completed-at"], START.0);
    // Survives a restart, and stays applied.
    let mut h = h;
    h.restart();
    assert_eq!(
        h.store()
            .run_database_step(step, None, &mut |_| panic!("ran twice"))
            .unwrap(),
        StepOutcome::AlreadyApplied
    );
    assert!(
        h.store()
            .read(|tx| (tx as &mut dyn Tx).application("mysql"))
            .unwrap()
            .is_some()
    );
}

pub(crate) fn failed_step_commits_nothing<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let step = key("half-done", "2.9.43");
    let before = store.revision().unwrap();
    let outcome = store
        .run_database_step(step, None, &mut |tx| {
            add_application(tx, "wordpress")?;
            Err(Abort::Failed("charm store unreachable".to_owned()))
        })
        .unwrap();
    assert_eq!(
        outcome,
        StepOutcome::Failed("charm store unreachable".to_owned())
    );
    assert_eq!(store.revision().unwrap(), before);
    assert!(all_events(store).is_empty());
    assert!(
        store
            .read(|tx| (tx as &mut dyn Tx).application("wordpress"))
            .unwrap()
            .is_none()
    );
    // Retried, it applies once.
    assert_eq!(
        store
            .run_database_step(step, None, &mut |tx| add_application(tx, "wordpress"))
            .unwrap(),
        StepOutcome::Applied
    );
}

pub(crate) fn fenced_step_commits_nothing_once_the_lease_is_gone<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let c0 = ControllerId(0);
    let token = store.acquire_lease(c0, TTL).unwrap().unwrap();
    let first = key("first", "2.9.43");
    assert_eq!(
        store
            .run_database_step(first, Some(token), &mut |tx| add_application(tx, "a"))
            .unwrap(),
        StepOutcome::Applied
    );
    h.clock().advance(TTL);
    let second = key("second", "2.9.43");
    let before = store.revision().unwrap();
    let mut ran = false;
    assert_eq!(
        store
            .run_database_step(second, Some(token), &mut |tx| {
                ran = true;
                add_application(tx, "b")
            })
            .unwrap(),
        StepOutcome::Fenced
    );
    assert!(!ran, "the fence is checked before the step runs");
    assert_eq!(store.revision().unwrap(), before);
    // The fence comes first, as in the core's model: a checkpointed step under a stale
    // lease answers Fenced.
    assert_eq!(
        store
            .run_database_step(first, Some(token), &mut |_| Ok(()))
            .unwrap(),
        StepOutcome::Fenced
    );
    // The next coordinator runs it.
    let next = h
        .second()
        .acquire_lease(ControllerId(1), TTL)
        .unwrap()
        .unwrap();
    assert_eq!(
        h.second()
            .run_database_step(second, Some(next), &mut |tx| add_application(tx, "b"))
            .unwrap(),
        StepOutcome::Applied
    );
}

// ---------------------------------------------------------------------------------------
// Revisions and watching.
// ---------------------------------------------------------------------------------------

pub(crate) fn revisions_increase_across_handles_and_restarts<H: Harness>() {
    let mut h = H::new();
    let other = h.second();
    for index in 0..6 {
        let store: &dyn Store = if index % 2 == 0 { h.store() } else { &other };
        store
            .transaction(None, &mut |tx| add_application(tx, &format!("app-{index}")))
            .unwrap();
    }
    drop(other);
    h.restart();
    h.store()
        .transaction(None, &mut |tx| {
            add_application(tx, "after-restart")?;
            add_application(tx, "same-transaction")
        })
        .unwrap();
    let revisions: Vec<u64> = all_events(h.store()).iter().map(|e| e.revision.0).collect();
    assert_eq!(revisions, (1..=8).collect::<Vec<_>>());
    assert_eq!(h.store().revision().unwrap(), Revision(8));
}

pub(crate) fn changes_since_pages_without_gaps_and_compaction_asks_for_resync<H: Harness>() {
    let h = H::new();
    let store = h.store();
    for index in 0..10 {
        store
            .transaction(None, &mut |tx| add_application(tx, &format!("app-{index}")))
            .unwrap();
    }
    store
        .transaction(None, &mut |tx| {
            tx.remove_document(EntityKind::Application, "app-3")?;
            Ok(())
        })
        .unwrap();
    // Page through with a limit of 3: every event once, in order.
    let mut seen = Vec::new();
    let mut after = Revision(0);
    loop {
        match store.changes_since(after, 3).unwrap() {
            Changes::Events { events, current } => {
                assert_eq!(current, Revision(11));
                assert!(events.len() <= 3);
                if events.is_empty() {
                    break;
                }
                after = events.last().unwrap().revision;
                seen.extend(events);
            }
            other => panic!("{other:?}"),
        }
    }
    let revisions: Vec<u64> = seen.iter().map(|e| e.revision.0).collect();
    assert_eq!(revisions, (1..=11).collect::<Vec<_>>());
    assert_eq!(seen[10].change, ChangeKind::Remove);
    assert_eq!(seen[10].id, "app-3");
    assert_eq!(seen[10].entity["charm"], "ch:amd64/jammy/app-3-1");

    store.compact(Revision(4)).unwrap();
    let resync = Changes::ResyncNeeded {
        compacted: Revision(4),
        current: Revision(11),
    };
    assert_eq!(store.changes_since(Revision(0), 100).unwrap(), resync);
    assert_eq!(store.changes_since(Revision(3), 100).unwrap(), resync);
    match store.changes_since(Revision(4), 100).unwrap() {
        Changes::Events { events, .. } => assert_eq!(events.first().unwrap().revision, Revision(5)),
        other => panic!("{other:?}"),
    }
    // A revision the store never reached is not silently answered with nothing.
    assert_eq!(store.changes_since(Revision(12), 100).unwrap(), resync);
    // Compaction never goes back and is clamped to the current revision.
    store.compact(Revision(2)).unwrap();
    assert_eq!(store.changes_since(Revision(3), 1).unwrap(), resync);
    store.compact(Revision(1000)).unwrap();
    assert_eq!(
        store.changes_since(Revision(11), 100).unwrap(),
        Changes::Events {
            events: Vec::new(),
            current: Revision(11)
        }
    );
    // Revisions are not reused after compaction.
    store
        .transaction(None, &mut |tx| add_application(tx, "late"))
        .unwrap();
    match store.changes_since(Revision(11), 100).unwrap() {
        Changes::Events { events, .. } => assert_eq!(events[0].revision, Revision(12)),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Client operations and the model.
// ---------------------------------------------------------------------------------------

pub(crate) fn client_operations_apply_exactly_once<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let mut runs = 0;
    let mut deploy = |tx: &mut dyn Tx| {
        runs += 1;
        add_application(tx, "mysql")?;
        tx.put_unit(&Unit {
            name: "mysql/0".to_owned(),
            application: "mysql".to_owned(),
            machine: Some("1".to_owned()),
            life: Life::Alive,
        })?;
        Ok(serde_json::json!({"units": ["mysql/0"]}))
    };
    let applied = store.apply_operation("op-1", &mut deploy).unwrap();
    assert_eq!(
        applied,
        OperationOutcome::Applied(serde_json::json!({"units": ["mysql/0"]}))
    );
    let revision = store.revision().unwrap();
    let replayed = h.second().apply_operation("op-1", &mut deploy).unwrap();
    assert_eq!(
        replayed,
        OperationOutcome::Replayed(serde_json::json!({"units": ["mysql/0"]}))
    );
    assert_eq!(runs, 1);
    assert_eq!(store.revision().unwrap(), revision);

    // A failed operation records nothing; its retry applies.
    let mut fail = |tx: &mut dyn Tx| {
        add_application(tx, "broken")?;
        Err(Abort::Failed("no such charm".to_owned()))
    };
    assert_eq!(
        store.apply_operation("op-2", &mut fail).unwrap(),
        OperationOutcome::Failed("no such charm".to_owned())
    );
    assert_eq!(store.revision().unwrap(), revision);
    assert!(matches!(
        store
            .apply_operation("op-2", &mut |_| Ok(serde_json::json!(null)))
            .unwrap(),
        OperationOutcome::Applied(_)
    ));
    let unit = store
        .read(|tx| (tx as &mut dyn Tx).unit("mysql/0"))
        .unwrap()
        .unwrap();
    assert_eq!(unit.application, "mysql");
}

pub(crate) fn model_requests_of_the_core<H: Harness>() {
    let h = H::new();
    let store = h.store();
    assert_eq!(store.load_model().unwrap(), None);
    assert_eq!(
        store
            .set_agent_version(v("2.9.43"), &AgentVersionCheck::LIFECYCLE)
            .unwrap_err(),
        StoreError::NoModel
    );
    assert!(store.create_model(&model()).unwrap());
    assert!(
        !h.second()
            .create_model(&Model {
                name: "other".to_owned(),
                ..model()
            })
            .unwrap()
    );
    let loaded = store.load_model().unwrap().unwrap();
    assert_eq!(loaded, model());
    assert_eq!(loaded.view().agent_version, v("2.9.42"));
    assert_eq!(loaded.view().controllers, ControllerSet::first(3));

    let set = store
        .set_agent_version(v("2.9.43"), &AgentVersionCheck::LIFECYCLE)
        .unwrap();
    assert!(
        matches!(
            set,
            AgentVersionSet::Set {
                change: AgentVersionChange::Changed { .. },
                ..
            }
        ),
        "{set:?}"
    );
    store.report_upgrade_available(Some(v("2.9.44"))).unwrap();
    let model_after = store.load_model().unwrap().unwrap();
    assert_eq!(model_after.agent_version, v("2.9.43"));
    assert_eq!(model_after.upgrade_available, Some(v("2.9.44")));
    // An unchanged value writes nothing.
    let revision = store.revision().unwrap();
    store.report_upgrade_available(Some(v("2.9.44"))).unwrap();
    assert_eq!(store.revision().unwrap(), revision);

    // Juju's rule: no agent-version change while an upgrade record is current.
    store
        .create_record(record(UpgradeStatus::Pending, &[0], &[]))
        .unwrap();
    // The refusal carries what the refusing transaction read, and writes nothing.
    let revision = store.revision().unwrap();
    let refused = store
        .set_agent_version(v("2.9.44"), &AgentVersionCheck::LIFECYCLE)
        .unwrap();
    let AgentVersionSet::Refused {
        refusal,
        agent_version,
        view,
    } = refused
    else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert!(
        matches!(refusal, AgentVersionRefusal::UpgradeInProgress { .. }),
        "{refusal}"
    );
    assert!(
        refusal.to_string().contains("already in progress"),
        "{refusal}"
    );
    assert_eq!(agent_version, v("2.9.43"));
    assert_eq!(
        view.current.map(|(record, _)| record),
        Some(record(UpgradeStatus::Pending, &[0], &[]))
    );
    assert_eq!(view.revision, revision);
    assert_eq!(store.revision().unwrap(), revision, "nothing written");
    assert_eq!(
        store.load_model().unwrap().unwrap().agent_version,
        v("2.9.43")
    );
    // The value the model holds is accepted back, record or not, and writes nothing.
    assert!(matches!(
        store
            .set_agent_version(v("2.9.43"), &AgentVersionCheck::LIFECYCLE)
            .unwrap(),
        AgentVersionSet::Set {
            change: AgentVersionChange::Unchanged,
            ..
        }
    ));
    assert_eq!(store.revision().unwrap(), revision, "nothing written");

    // Capabilities record when and by which version they were discovered.
    h.clock().advance(Millis(500));
    let capabilities = Capabilities::from_capabilities([Capability::MANAGE_FIREWALL]).unwrap();
    store.set_capabilities(&capabilities, v("2.9.43")).unwrap();
    let mut h = h;
    h.restart();
    let stored = h.store().load_model().unwrap().unwrap();
    assert_eq!(stored.capabilities, capabilities);
    let discovered = stored.capabilities_discovered.unwrap();
    assert_eq!(
        (discovered.at, discovered.by),
        (Timestamp(START.0 + 500), v("2.9.43"))
    );
}

// ---------------------------------------------------------------------------------------
// Seed 004.
// ---------------------------------------------------------------------------------------

fn jobs_of(store: &dyn Store, id: &str) -> Vec<String> {
    let reported = store.reported_jobs(&JobTable::lockstep()).unwrap();
    let (_, jobs) = reported
        .into_iter()
        .find(|(machine, _)| machine == id)
        .unwrap_or_else(|| panic!("machine {id} not reported"));
    jobs.iter().map(|job| job.as_str().to_owned()).collect()
}

pub(crate) fn new_capability_changes_every_machine_without_machine_writes<H: Harness>() {
    let h = H::new();
    let store = h.store();
    store.create_model(&model()).unwrap();
    let controller = Roles::of(&[Role::Controller]);
    let host = Roles::of(&[Role::HostMachine]);
    store
        .add_machine(&Machine::with_roles("0", controller))
        .unwrap();
    store.add_machine(&Machine::with_roles("1", host)).unwrap();
    store.add_machine(&Machine::with_roles("2", host)).unwrap();
    assert_eq!(jobs_of(store, "0"), ["JobManageModel"]);
    assert_eq!(jobs_of(store, "1"), ["JobHostUnits"]);

    // A newer version's provider reports two new capabilities at the end of its upgrade.
    let before = store.revision().unwrap();
    let provider =
        seed004::LocalProvider::from_config("manage-firewall, manage-networking").unwrap();
    seed004::refresh_capabilities(store, &provider, v("2.9.43")).unwrap();
    assert_eq!(jobs_of(store, "0"), ["JobManageModel", "JobManageFirewall"]);
    assert_eq!(jobs_of(store, "1"), ["JobHostUnits", "JobManageNetworking"]);
    assert_eq!(jobs_of(store, "2"), ["JobHostUnits", "JobManageNetworking"]);
    // One write, to the model; no machine was touched.
    match store.changes_since(before, 100).unwrap() {
        Changes::Events { events, .. } => {
            let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
            assert_eq!(kinds, [EntityKind::Model]);
        }
        other => panic!("{other:?}"),
    }
    let error = seed004::LocalProvider::from_config("manage-firewall, Bad_Name").unwrap_err();
    assert!(error.to_string().contains("Bad_Name"), "{error}");
}

pub(crate) fn legacy_machines_report_as_the_core_says_until_migrated<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let capabilities = Capabilities::from_capabilities([Capability::MANAGE_NETWORKING]).unwrap();
    store
        .create_model(&Model {
            capabilities,
            ..model()
        })
        .unwrap();
    let legacy = |id: &str, jobs: &[Job]| Machine {
        id: id.to_owned(),
        roles: Roles::NONE,
        legacy_jobs: jobs.to_vec(),
        agent_binary: None,
        life: Life::Alive,
    };
    let unknown = Job::new("JobRunSomethingOld").unwrap();
    store
        .transaction(None, &mut |tx| {
            tx.put_machine(&legacy("0", &[Job::MANAGE_STATE, Job::HOST_UNITS]))?;
            tx.put_machine(&legacy("1", &[Job::HOST_UNITS]))?;
            tx.put_machine(&legacy("2", std::slice::from_ref(&unknown)))?;
            Ok(())
        })
        .unwrap();
    // As stored, then what the equivalent roles imply (the core's rule).
    assert_eq!(
        jobs_of(store, "0"),
        [
            "JobManageState",
            "JobHostUnits",
            "JobManageModel",
            "JobManageNetworking"
        ]
    );
    assert_eq!(jobs_of(store, "1"), ["JobHostUnits", "JobManageNetworking"]);
    assert_eq!(jobs_of(store, "2"), ["JobRunSomethingOld"]);

    // lockstep's step migrates them, exactly once.
    let step = seed004::MACHINE_JOBS_TO_ROLES.key();
    assert_eq!(
        seed004::run_step(store, step, None).unwrap(),
        Some(StepOutcome::Applied)
    );
    assert_eq!(
        seed004::run_step(&h.second(), step, None).unwrap(),
        Some(StepOutcome::AlreadyApplied)
    );
    let machines = store.read(|tx| tx.machines()).unwrap();
    assert_eq!(
        machines[0].roles,
        Roles::of(&[Role::Controller, Role::HostMachine])
    );
    assert!(machines[0].legacy_jobs.is_empty());
    assert_eq!(machines[1].roles, Roles::of(&[Role::HostMachine]));
    assert_eq!(
        machines[2].roles,
        Roles::NONE,
        "jobs implying no role stay as stored"
    );
    assert_eq!(
        jobs_of(store, "0"),
        ["JobHostUnits", "JobManageModel", "JobManageNetworking"]
    );
    assert_eq!(jobs_of(store, "2"), ["JobRunSomethingOld"]);
    assert_eq!(
        seed004::run_step(store, key("not-ours", "0.1.0"), None).unwrap(),
        None
    );
}

pub(crate) fn machines_from_older_clients_are_stored_with_roles<H: Harness>() {
    let h = H::new();
    let store = h.store();
    store.create_model(&model()).unwrap();
    assert!(seed004::add_machine_from_client(store, "4", vec![Job::HOST_UNITS]).unwrap());
    assert!(!seed004::add_machine_from_client(store, "4", vec![Job::MANAGE_MODEL]).unwrap());
    let machine = store.read(|tx| tx.machine("4")).unwrap().unwrap();
    assert_eq!(machine.roles, Roles::of(&[Role::HostMachine]));
    assert!(machine.legacy_jobs.is_empty());
}

pub(crate) fn a_step_that_outlives_its_lease_commits_nothing<H: Harness>() {
    let h = H::new();
    let store = h.store();
    let token = store.acquire_lease(ControllerId(0), TTL).unwrap();
    let before = store.revision().unwrap();
    let outcome = store
        .run_database_step(key("slow", "2.9.43"), token, &mut |tx| {
            add_application(tx, "slow")?;
            // The step takes longer than the lease: another controller may own it by now.
            h.clock().advance(TTL);
            Ok(())
        })
        .unwrap();
    assert_eq!(outcome, StepOutcome::Fenced);
    assert_eq!(store.revision().unwrap(), before);
}

pub(crate) fn snapshots_discard_writes<H: Harness>() {
    let h = H::new();
    let store = h.store();
    store
        .snapshot(&mut |tx| {
            (tx as &mut dyn Tx).put_application(&Application {
                name: "ghost".to_owned(),
                charm: "ch:ghost".to_owned(),
                life: Life::Alive,
            })?;
            Ok(())
        })
        .unwrap();
    assert_eq!(store.revision().unwrap(), Revision(0));
    assert!(all_events(store).is_empty());
}

/// Settings and charm documents are stored, listed by id, logged as their own kinds and
/// survive a restart, as applications are; another kind's documents are not among them.
pub(crate) fn settings_and_charm_documents_round_trip<H: Harness>() {
    let mut h = H::new();
    let config = serde_json::json!({"logging-config": "<root>=DEBUG"});
    let charm = serde_json::json!({"url": "local:jammy/web-0", "name": "web"});
    let after = h.store().revision().unwrap();
    h.store()
        .transaction(None, &mut |tx| {
            tx.put_document(EntityKind::Settings, "model", &config)?;
            tx.put_document(EntityKind::Charm, "local:jammy/web-0", &charm)?;
            Ok(())
        })
        .unwrap();
    h.restart();
    let store = h.store();
    let (settings, charms) = store
        .read(|tx| {
            Ok((
                tx.documents(EntityKind::Settings)?,
                tx.documents(EntityKind::Charm)?,
            ))
        })
        .unwrap();
    assert_eq!(settings, vec![("model".to_owned(), config.clone())]);
    assert_eq!(charms, vec![("local:jammy/web-0".to_owned(), charm)]);
    let Changes::Events { events, .. } = store.changes_since(after, 10).unwrap() else {
        panic!("no resync expected");
    };
    let logged: Vec<(EntityKind, &str)> = events
        .iter()
        .map(|event| (event.kind, event.id.as_str()))
        .collect();
    assert_eq!(
        logged,
        [
            (EntityKind::Settings, "model"),
            (EntityKind::Charm, "local:jammy/web-0")
        ]
    );
    let removed = store
        .transaction(None, &mut |tx| {
            tx.remove_document(EntityKind::Settings, "model")?;
            Ok(())
        })
        .unwrap();
    assert!(
        matches!(removed, crate::TxOutcome::Committed(_)),
        "{removed:?}"
    );
    assert!(
        store
            .read(|tx| tx.document(EntityKind::Settings, "model"))
            .unwrap()
            .is_none()
    );
}

/// The rollout record round-trips through a restart, its write moves the revision (which
/// wakes agents' desired-version watchers), and a write fenced on a lease that expired
/// commits nothing, so a coordinator that lost its lease cannot overwrite its successor's.
pub(crate) fn the_rollout_record_is_kept_and_fenced<H: Harness>() {
    use lockstep_core::rollout::Rollout;
    let mut h = H::new();
    let mut record = Rollout::new(Version::parse("2.9.44").unwrap());
    record.admitted.insert("1".to_owned(), Timestamp(5));
    record.canaries.insert("1".to_owned());
    let before = h.store().revision().unwrap();
    let token = h
        .store()
        .acquire_lease(ControllerId(0), TTL)
        .unwrap()
        .unwrap();
    let outcome = h
        .store()
        .transaction(Some(token), &mut |tx| {
            tx.put_rollout(&record)?;
            Ok(())
        })
        .unwrap();
    assert!(
        matches!(outcome, crate::TxOutcome::Committed(_)),
        "{outcome:?}"
    );
    assert!(h.store().revision().unwrap() > before);
    h.restart();
    let read = h.store().read(|tx| tx.rollout()).unwrap();
    assert_eq!(read.as_ref(), Some(&record));
    // The lease expires; the old coordinator's write is fenced and writes nothing.
    h.clock().advance(TTL);
    let mut later = record.clone();
    later.admitted.insert("2".to_owned(), Timestamp(9));
    let outcome = h
        .store()
        .transaction(Some(token), &mut |tx| {
            tx.put_rollout(&later)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(outcome, crate::TxOutcome::Fenced);
    assert_eq!(h.store().read(|tx| tx.rollout()).unwrap(), Some(record));
}

// ---------------------------------------------------------------------------------------
// Machine agents: their credentials and their reported status, written without events.
// ---------------------------------------------------------------------------------------

const PHC_FIRST: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$Zmlyc3Qtc2FsdA$Zmlyc3QtaGFzaC1vZi1wYXNzd29yZA";
const PHC_SECOND: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c2Vjb25kLXNhbHQ$c2Vjb25kLWhhc2gtb2YtcGFzc3dvcmQ";

fn agent_status(status: &str, info: &str, phase: &str, version: Option<&str>) -> AgentStatus {
    AgentStatus {
        status: status.to_owned(),
        info: info.to_owned(),
        phase: phase.to_owned(),
        version: version
            .map(|text| lockstep_core::Binary::new(v(text), "ubuntu", "amd64").expect("a binary")),
        download_rate: None,
        updated: START,
    }
}

fn credential(store: &dyn Store, tag: &str) -> Option<String> {
    let mut hash = None;
    store
        .snapshot(&mut |tx| {
            hash = tx.agent_password_hash(tag)?;
            Ok(())
        })
        .unwrap();
    hash
}

fn status_of(store: &dyn Store, tag: &str) -> Option<AgentStatus> {
    let mut status = None;
    store
        .snapshot(&mut |tx| {
            status = tx.agent_status(tag)?;
            Ok(())
        })
        .unwrap();
    status
}

/// Whether `write`, run on the harness's store while another handle waits in
/// [`Store::wait_for_change`] above the current revision, wakes that waiter within `timeout`.
fn wakes_a_waiter<H: Harness>(
    h: &H,
    timeout: std::time::Duration,
    write: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
) -> bool
where
    H::S: 'static,
{
    let waiter = h.second();
    let after = h.store().revision().unwrap();
    let thread = std::thread::spawn(move || waiter.wait_for_change(after, timeout));
    // Let the waiter start waiting (for etcd: open its watch) before the writes.
    std::thread::sleep(std::time::Duration::from_millis(200));
    for _ in 0..3 {
        h.store().transaction(None, write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    thread.join().expect("the waiter")
}

/// An agent's credential is set, read from another handle, overwritten and kept across a
/// restart, and never shows: no revision, no event (not even beside an entity written in
/// the same transaction), no waiter woken.
pub(crate) fn agent_credentials_are_kept_and_never_logged<H: Harness>()
where
    H::S: 'static,
{
    let mut h = H::new();
    let before = h.store().revision().unwrap();
    assert_eq!(credential(h.store(), "machine-0"), None);
    let outcome = h
        .store()
        .transaction(None, &mut |tx| {
            tx.set_agent_password_hash("machine-0", PHC_FIRST)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(outcome, TxOutcome::Committed(before), "no revision");
    assert_eq!(
        credential(&h.second(), "machine-0").as_deref(),
        Some(PHC_FIRST)
    );
    // Overwritten, beside an entity's write in the same transaction.
    h.store()
        .transaction(None, &mut |tx| {
            tx.set_agent_password_hash("machine-0", PHC_SECOND)?;
            tx.set_agent_password_hash("machine-1", PHC_FIRST)?;
            add_application(tx, "mysql")
        })
        .unwrap();
    h.restart();
    let store = h.store();
    assert_eq!(credential(store, "machine-0").as_deref(), Some(PHC_SECOND));
    assert_eq!(credential(store, "machine-1").as_deref(), Some(PHC_FIRST));
    assert_eq!(credential(store, "machine-2"), None);
    let events = all_events(store);
    assert_eq!(
        events
            .iter()
            .map(|event| (event.kind, event.id.as_str()))
            .collect::<Vec<_>>(),
        [(EntityKind::Application, "mysql")],
        "only the entity is logged"
    );
    let logged = serde_json::to_string(&events).unwrap();
    assert!(!logged.contains("argon2"), "{logged}");
    assert_eq!(store.revision().unwrap(), Revision(before.0 + 1));
    assert!(
        !wakes_a_waiter(&h, std::time::Duration::from_millis(1500), &mut |tx| {
            tx.set_agent_password_hash("machine-0", PHC_FIRST)?;
            Ok(())
        }),
        "a credential wakes no watcher"
    );
    assert_eq!(
        credential(h.store(), "machine-0").as_deref(),
        Some(PHC_FIRST)
    );
    assert_eq!(all_events(h.store()).len(), 1);
}

/// Agents' reports round-trip every field, are listed by tag, are replaced by the next
/// heartbeat, survive a restart, and are never logged nor wake a watcher (while an entity's
/// write does, so the check is not vacuous).
pub(crate) fn agent_status_round_trips_and_is_never_logged<H: Harness>()
where
    H::S: 'static,
{
    let mut h = H::new();
    let before = h.store().revision().unwrap();
    // The download rate is kept, up to the largest u64 (SQLite's column is signed).
    let started = AgentStatus {
        download_rate: Some(u64::MAX),
        ..agent_status("started", "", "ready", Some("2.9.43"))
    };
    let failed = agent_status(
        "error",
        "hook failed: \"install\" (exit 1)\nsecond line é",
        "upgrading",
        None,
    );
    let outcome = h
        .store()
        .transaction(None, &mut |tx| {
            let now = tx.now();
            for (tag, status) in [
                ("machine-10", &started),
                ("machine-1", &started),
                ("machine-0-lxd-1", &failed),
            ] {
                tx.put_agent_status(
                    tag,
                    &AgentStatus {
                        updated: now,
                        ..status.clone()
                    },
                )?;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(outcome, TxOutcome::Committed(before), "no revision");
    let listed = h.second().read(|tx| tx.agent_statuses()).unwrap();
    assert_eq!(
        listed,
        [
            ("machine-0-lxd-1".to_owned(), failed.clone()),
            ("machine-1".to_owned(), started.clone()),
            ("machine-10".to_owned(), started.clone()),
        ],
        "every field, ordered by tag"
    );
    // The next heartbeat replaces the report, with the store's clock.
    h.clock().advance(Millis(5000));
    h.store()
        .transaction(None, &mut |tx| {
            let updated = tx.now();
            tx.put_agent_status(
                "machine-1",
                &AgentStatus {
                    updated,
                    ..agent_status("started", "", "upgrading", Some("2.9.44"))
                },
            )?;
            Ok(())
        })
        .unwrap();
    h.restart();
    let store = h.store();
    let replaced = AgentStatus {
        updated: Timestamp(START.0 + 5000),
        ..agent_status("started", "", "upgrading", Some("2.9.44"))
    };
    assert_eq!(status_of(store, "machine-1"), Some(replaced));
    assert_eq!(status_of(store, "machine-0-lxd-1"), Some(failed));
    assert_eq!(status_of(store, "machine-2"), None);
    assert_eq!(store.read(|tx| tx.agent_statuses()).unwrap().len(), 3);
    assert_eq!(store.revision().unwrap(), before);
    assert!(all_events(store).is_empty(), "no event");
    assert!(
        !wakes_a_waiter(&h, std::time::Duration::from_millis(1500), &mut |tx| {
            let updated = tx.now();
            tx.put_agent_status(
                "machine-1",
                &AgentStatus {
                    updated,
                    ..started.clone()
                },
            )?;
            Ok(())
        }),
        "heartbeats wake no watcher"
    );
    assert!(all_events(h.store()).is_empty(), "no event");
    let mut index = 0;
    assert!(
        wakes_a_waiter(&h, std::time::Duration::from_secs(20), &mut |tx| {
            index += 1;
            add_application(tx, &format!("app-{index}"))
        }),
        "an entity's write wakes the waiter"
    );
}

/// Removing a machine deletes its agent's credential and status with it (one event: the
/// machine's), and leaves other agents' alone; removing a machine the store does not have
/// still deletes its agent's.
pub(crate) fn removing_a_machine_removes_its_agents_credential_and_status<H: Harness>() {
    let h = H::new();
    let store = h.store();
    store.create_model(&model()).unwrap();
    for id in ["0", "1/lxd/0"] {
        assert!(
            store
                .add_machine(&Machine::with_roles(id, Roles::of(&[Role::HostMachine])))
                .unwrap()
        );
    }
    let status = agent_status("started", "", "ready", Some("2.9.42"));
    store
        .transaction(None, &mut |tx| {
            for tag in ["machine-0", "machine-1-lxd-0", "machine-7"] {
                tx.set_agent_password_hash(tag, PHC_FIRST)?;
                tx.put_agent_status(tag, &status)?;
            }
            Ok(())
        })
        .unwrap();
    let before = store.revision().unwrap();
    let mut removed = None;
    store
        .transaction(None, &mut |tx| {
            removed = tx.remove_machine("1/lxd/0")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(removed, Some(Revision(before.0 + 1)));
    let Changes::Events { events, .. } = store.changes_since(before, 10).unwrap() else {
        panic!("no resync expected");
    };
    assert_eq!(
        events
            .iter()
            .map(|event| (event.kind, event.id.as_str(), event.change))
            .collect::<Vec<_>>(),
        [(EntityKind::Machine, "1/lxd/0", ChangeKind::Remove)]
    );
    assert_eq!(credential(store, "machine-1-lxd-0"), None);
    assert_eq!(status_of(store, "machine-1-lxd-0"), None);
    assert_eq!(credential(store, "machine-0").as_deref(), Some(PHC_FIRST));
    assert_eq!(status_of(store, "machine-0"), Some(status.clone()));
    // No machine 7: nothing logged, and its agent's credential and status go all the same.
    let revision = store.revision().unwrap();
    store
        .transaction(None, &mut |tx| {
            removed = tx.remove_machine("7")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(removed, None);
    assert_eq!(store.revision().unwrap(), revision);
    assert_eq!(credential(store, "machine-7"), None);
    assert_eq!(status_of(store, "machine-7"), None);
    let tags: Vec<String> = store
        .read(|tx| tx.agent_statuses())
        .unwrap()
        .into_iter()
        .map(|(tag, _)| tag)
        .collect();
    assert_eq!(tags, ["machine-0"]);
}

/// A transaction whose body runs while an agent's heartbeat commits (a long database step
/// and a fleet reporting every few seconds) runs once: agents' statuses never make another
/// transaction run again. Not the memory engine's promise: it swaps whole states, so a
/// status committed meanwhile sends the body round again (it serves tests and the
/// simulator, whose agents do not report statuses).
pub(crate) fn a_transaction_runs_once_while_an_agent_reports<H: Harness>()
where
    H::S: 'static,
{
    let h = H::new();
    // Another controller's handle, opened before the transaction takes the write lock.
    let mut second = Some(h.second());
    let mut runs = 0;
    let mut beat = None;
    let outcome = h
        .store()
        .transaction(None, &mut |tx| {
            runs += 1;
            let _ = tx.machines()?;
            if let Some(store) = second.take() {
                beat = Some(std::thread::spawn(move || {
                    store
                        .transaction(None, &mut |tx| {
                            tx.put_agent_status(
                                "machine-1",
                                &agent_status("started", "", "ready", None),
                            )?;
                            Ok(())
                        })
                        .unwrap()
                }));
                // SQLite's heartbeat waits for this transaction's write lock; etcd's lands
                // now.
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            tx.put_machine(&Machine::with_roles("7", Roles::of(&[Role::HostMachine])))?;
            Ok(())
        })
        .unwrap();
    assert!(matches!(outcome, TxOutcome::Committed(_)), "{outcome:?}");
    beat.expect("the heartbeat ran")
        .join()
        .expect("the heartbeat");
    assert_eq!(runs, 1, "the body ran again because an agent reported");
    let statuses = h.store().read(|tx| tx.agent_statuses()).unwrap();
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert!(h.store().read(|tx| tx.machine("7")).unwrap().is_some());
}

/// Agents reporting at once through several controllers: every report lands, although none
/// logs an event (writes without a revision still conflict).
pub(crate) fn concurrent_heartbeats_lose_nothing<H: Harness>()
where
    H::S: 'static,
{
    const BEATS: usize = 8;
    let h = H::new();
    let threads: Vec<_> = (0..4)
        .map(|writer| {
            let store = h.second();
            std::thread::spawn(move || {
                for beat in 1..=BEATS {
                    store
                        .transaction(None, &mut |tx| {
                            tx.put_agent_status(
                                &format!("machine-{writer}"),
                                &agent_status("started", &beat.to_string(), "ready", None),
                            )?;
                            tx.set_agent_password_hash(&format!("machine-{writer}"), PHC_FIRST)?;
                            Ok(())
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a writer");
    }
    let statuses = h.store().read(|tx| tx.agent_statuses()).unwrap();
    assert_eq!(
        statuses,
        (0..4)
            .map(|writer| (
                format!("machine-{writer}"),
                agent_status("started", &BEATS.to_string(), "ready", None)
            ))
            .collect::<Vec<_>>()
    );
    for writer in 0..4 {
        assert!(credential(h.store(), &format!("machine-{writer}")).is_some());
    }
    assert_eq!(h.store().revision().unwrap(), Revision(0));
}

/// A tiny deterministic generator (xorshift64*), so the suite needs no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

/// The core testkit's store, transcribed operation by operation
/// (`lockstep_core::testkit::World::execute`): the model the lifecycle is checked against.
#[derive(Default)]
struct Reference {
    record: Option<(UpgradeInfo, u64)>,
    last_archived: Option<UpgradeInfo>,
    revision: u64,
    lease: Option<(ControllerId, lockstep_core::lifecycle::LeaseToken)>,
    next_token: u64,
    checkpoints: std::collections::BTreeSet<StepKey>,
}

impl Reference {
    fn fence_holds(&self, fence: Option<lockstep_core::lifecycle::LeaseToken>) -> bool {
        fence.is_none_or(|token| self.lease.map(|(_, held)| held) == Some(token))
    }
}

/// What a record write answered, without revisions (the store also counts other writes).
fn shape(write: &RecordWrite) -> (u8, Option<UpgradeInfo>, Option<UpgradeInfo>) {
    match write {
        RecordWrite::Written(view) => (0, view.current.map(|(r, _)| r), view.last_archived),
        RecordWrite::Conflict(view) => (1, view.current.map(|(r, _)| r), view.last_archived),
        RecordWrite::Fenced => (2, None, None),
    }
}

/// Random sequences of the core's store requests give the same answers from the engine as
/// from the core's own model of the store, lease expiry included.
pub(crate) fn agrees_with_the_core_testkit_store<H: Harness>() {
    use lockstep_core::lifecycle::LeaseToken;
    for seed in 1..=8u64 {
        let h = H::new();
        let handles = [h.second(), h.second(), h.second()];
        let mut model = Reference {
            next_token: 1,
            ..Reference::default()
        };
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let statuses = [
            UpgradeStatus::Pending,
            UpgradeStatus::DbComplete,
            UpgradeStatus::Running,
            UpgradeStatus::Complete,
            UpgradeStatus::Aborted,
        ];
        for step in 0..400 {
            let who = rng.below(3) as usize;
            let me = ControllerId(who as u8);
            let store = &handles[who];
            let fence = match rng.below(3) {
                0 => None,
                _ if model.next_token == 1 => None,
                _ => Some(LeaseToken(1 + rng.below(model.next_token - 1))),
            };
            let context = format!("seed {seed} step {step}");
            match rng.below(7) {
                0 => {
                    let answer = store.acquire_lease(me, TTL).unwrap();
                    let expected = match model.lease {
                        None => {
                            let token = LeaseToken(model.next_token);
                            model.next_token += 1;
                            model.lease = Some((me, token));
                            Some(token)
                        }
                        Some((holder, token)) if holder == me => Some(token),
                        Some(_) => None,
                    };
                    assert_eq!(answer, expected, "acquire, {context}");
                }
                1 => {
                    let token = fence.unwrap_or(LeaseToken(1));
                    let answer = store.keep_alive_lease(me, token).unwrap();
                    let expected = (model.lease == Some((me, token))).then_some(token);
                    assert_eq!(answer, expected, "keep-alive, {context}");
                }
                2 => {
                    let token = fence.unwrap_or(LeaseToken(1));
                    store.release_lease(me, token).unwrap();
                    if model.lease == Some((me, token)) {
                        model.lease = None;
                    }
                }
                3 => {
                    // The lease expires: time passes beyond any keep-alive.
                    h.clock().advance(TTL);
                    model.lease = None;
                }
                4 => {
                    let record = UpgradeInfo {
                        previous_version: v("2.9.42"),
                        target_version: v("2.9.43"),
                        status: UpgradeStatus::Pending,
                        controllers_ready: ControllerSet::EMPTY.with(me),
                        controllers_done: ControllerSet::EMPTY,
                    };
                    let answer = store.create_record(record).unwrap();
                    let expected = if model.record.is_some() {
                        1
                    } else {
                        model.revision += 1;
                        model.record = Some((record, model.revision));
                        0
                    };
                    assert_eq!(shape(&answer).0, expected, "create, {context}");
                    assert_eq!(shape(&answer).1, model.record.map(|(r, _)| r), "{context}");
                }
                5 => {
                    // A valid successor of the current record (or of a made-up one), at the
                    // current revision or a stale one.
                    let base = model.record.map(|(r, _)| r).unwrap_or(UpgradeInfo {
                        previous_version: v("2.9.42"),
                        target_version: v("2.9.43"),
                        status: UpgradeStatus::Pending,
                        controllers_ready: ControllerSet::EMPTY,
                        controllers_done: ControllerSet::EMPTY,
                    });
                    let mut next = base;
                    next.status = statuses[rng.below(5) as usize];
                    next.controllers_ready = base.controllers_ready.with(me);
                    if rng.below(2) == 0 {
                        next.controllers_done = base.controllers_done.with(me);
                    }
                    if !base.may_become(&next) {
                        next = base;
                    }
                    let stale = rng.below(4) == 0;
                    let current = h.store().record_view().unwrap().current.map(|(_, r)| r);
                    let expected_revision = match (current, stale) {
                        (Some(revision), false) => revision,
                        (Some(revision), true) => Revision(revision.0 - 1),
                        (None, _) => Revision(0),
                    };
                    let answer = store.update_record(expected_revision, next, fence).unwrap();
                    let expected = if !model.fence_holds(fence) {
                        2
                    } else {
                        match model.record {
                            Some(_) if !stale => {
                                model.revision += 1;
                                if next.status.is_final() {
                                    model.record = None;
                                    model.last_archived = Some(next);
                                } else {
                                    model.record = Some((next, model.revision));
                                }
                                0
                            }
                            _ => 1,
                        }
                    };
                    let (kind, current, archived) = shape(&answer);
                    assert_eq!(kind, expected, "update, {context}");
                    if kind != 2 {
                        assert_eq!(current, model.record.map(|(r, _)| r), "{context}");
                        assert_eq!(archived, model.last_archived, "{context}");
                    }
                }
                _ => {
                    let step = [key("a", "2.9.43"), key("b", "2.9.43"), key("c", "2.9.44")]
                        [rng.below(3) as usize];
                    let answer = store
                        .run_database_step(step, fence, &mut |_| Ok(()))
                        .unwrap();
                    let expected = if !model.fence_holds(fence) {
                        StepOutcome::Fenced
                    } else if model.checkpoints.contains(&step) {
                        StepOutcome::AlreadyApplied
                    } else {
                        model.checkpoints.insert(step);
                        StepOutcome::Applied
                    };
                    assert_eq!(answer, expected, "run step, {context}");
                }
            }
            let live = h
                .store()
                .lease()
                .unwrap()
                .filter(|lease| lease.is_live(h.clock().now()))
                .map(|lease| (lease.holder, lease.token));
            assert_eq!(live, model.lease, "lease after {context}");
        }
    }
}

/// Several handles (controllers) writing at once: every commit lands once, revisions stay
/// strictly increasing with no gap, and create-if-absent lets exactly one writer win.
pub(crate) fn concurrent_writers_lose_nothing<H: Harness>()
where
    H::S: 'static,
{
    let h = H::new();
    let writers: Vec<H::S> = (0..4).map(|_| h.second()).collect();
    let threads: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(writer, store)| {
            std::thread::spawn(move || {
                let mut won = 0;
                for index in 0..25 {
                    let id = format!("op-{writer}-{index}");
                    let outcome = store
                        .apply_operation(&id, &mut |tx| {
                            add_application(tx, &format!("app-{writer}-{index}"))?;
                            Ok(serde_json::json!(writer))
                        })
                        .unwrap();
                    assert!(matches!(outcome, OperationOutcome::Applied(_)));
                    let record = UpgradeInfo {
                        previous_version: v("2.9.42"),
                        target_version: v("2.9.43"),
                        status: UpgradeStatus::Pending,
                        controllers_ready: ControllerSet::EMPTY.with(ControllerId(writer as u8)),
                        controllers_done: ControllerSet::EMPTY,
                    };
                    if matches!(
                        store.create_record(record).unwrap(),
                        RecordWrite::Written(_)
                    ) {
                        won += 1;
                    }
                }
                won
            })
        })
        .collect();
    let won: u32 = threads
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .sum();
    assert_eq!(
        won, 1,
        "create-if-absent: exactly one writer created the record"
    );
    let events = all_events(h.store());
    assert_eq!(events.len(), 101);
    let revisions: Vec<u64> = events.iter().map(|e| e.revision.0).collect();
    assert_eq!(revisions, (1..=101).collect::<Vec<_>>());
    let mut names: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EntityKind::Application)
        .map(|e| e.id.clone())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 100, "every application once");
}

// ---------------------------------------------------------------------------------------
// The model's agent-version: the core's rule, inside the write transaction.
// ---------------------------------------------------------------------------------------

pub(crate) fn an_operators_agent_version_is_checked_in_the_write<H: Harness>() {
    let h = H::new();
    let store = h.store();
    assert!(store.create_model(&model()).unwrap());
    let binary = |version: &str| lockstep_core::Binary::new(v(version), "ubuntu", "amd64");
    let entry = |version: &str, stream| CatalogueEntry {
        binary: binary(version).unwrap(),
        stream,
        size_bytes: 1024,
        sha256: Sha256([7; 32]),
        path: format!("agent/juju-{version}-ubuntu-amd64.tgz"),
    };
    let catalogue = Catalogue::new(vec![
        entry("2.9.41", Stream::Released),
        entry("2.9.43", Stream::Released),
        entry("2.9.44", Stream::Proposed),
    ])
    .unwrap();
    let operator = AgentVersionCheck::operator(&catalogue);
    let refused = |answer: AgentVersionSet| match answer {
        AgentVersionSet::Refused {
            refusal,
            agent_version,
            ..
        } => {
            assert_eq!(
                agent_version,
                v("2.9.42"),
                "read in the refusing transaction"
            );
            refusal.to_string()
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    let revision = store.revision().unwrap();
    assert_eq!(
        refused(store.set_agent_version(v("2.9.41"), &operator).unwrap()),
        "cannot change agent-version from 2.9.42 to the lower version 2.9.41: downgrades \
         are not supported"
    );
    // Listed only in proposed, and the model searches released.
    assert_eq!(
        refused(store.set_agent_version(v("2.9.44"), &operator).unwrap()),
        "no agent binaries found for version 2.9.44"
    );
    assert_eq!(
        store.revision().unwrap(),
        revision,
        "refusals write nothing"
    );
    assert!(matches!(
        store.set_agent_version(v("2.9.43"), &operator).unwrap(),
        AgentVersionSet::Set {
            change: AgentVersionChange::Changed { .. },
            ..
        }
    ));
    // The lifecycle's reset after a failed upgrade may go lower.
    let reset = store
        .set_agent_version(v("2.9.42"), &AgentVersionCheck::LIFECYCLE)
        .unwrap();
    let AgentVersionSet::Set { model, change } = reset else {
        panic!("expected the reset, got {reset:?}");
    };
    assert_eq!(model.agent_version, v("2.9.42"));
    assert_eq!(
        change,
        AgentVersionChange::Changed {
            from: v("2.9.43"),
            to: v("2.9.42")
        }
    );
}

/// Agents that lag refuse an operator's change only when the check asks for them, read in
/// the write's own transaction: the version each alive machine's agent last reported
/// (status first, else its binary), containers by their tag, dead machines skipped.
pub(crate) fn agents_behind_refuse_an_agent_version_change_only_when_asked<H: Harness>() {
    let h = H::new();
    let store = h.store();
    assert!(store.create_model(&model()).unwrap());
    let binary = |version: &str| lockstep_core::Binary::new(v(version), "ubuntu", "amd64");
    let catalogue = Catalogue::new(vec![CatalogueEntry {
        binary: binary("2.9.43").unwrap(),
        stream: Stream::Released,
        size_bytes: 1024,
        sha256: Sha256([7; 32]),
        path: "agent/juju-2.9.43-ubuntu-amd64.tgz".into(),
    }])
    .unwrap();
    let machine = |id: &str, role: Role, running: Option<&str>, life: Life| Machine {
        agent_binary: running.map(|version| binary(version).unwrap()),
        life,
        ..Machine::with_roles(id, Roles::of(&[role]))
    };
    let put = |machines: &[Machine], statuses: &[(&str, &str)]| {
        h.store()
            .transaction(None, &mut |tx| {
                for machine in machines {
                    tx.put_machine(machine)?;
                }
                let now = tx.now();
                for (tag, version) in statuses {
                    tx.put_agent_status(
                        tag,
                        &AgentStatus {
                            status: "started".into(),
                            info: String::new(),
                            phase: "ready".into(),
                            version: Some(binary(version).unwrap()),
                            download_rate: None,
                            updated: now,
                        },
                    )?;
                }
                Ok(())
            })
            .unwrap();
    };
    put(
        &[
            machine("0", Role::Controller, Some("2.9.42"), Life::Alive),
            // Its SetTools is older than the status it reported since.
            machine("1", Role::HostMachine, Some("2.9.41"), Life::Alive),
            machine("2", Role::HostMachine, Some("2.9.41"), Life::Alive),
            machine("2/lxd/0", Role::HostMachine, None, Life::Alive),
            machine("3", Role::HostMachine, Some("2.9.40"), Life::Dead),
        ],
        &[("machine-1", "2.9.42")],
    );
    let asked = AgentVersionCheck::operator(&catalogue).with_agents_current();
    let revision = store.revision().unwrap();
    match store.set_agent_version(v("2.9.43"), &asked).unwrap() {
        AgentVersionSet::Refused { refusal, .. } => assert_eq!(
            refusal.to_string(),
            "some agents have not upgraded to the current model version 2.9.42: \
             machine-2, machine-2-lxd-0"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        store.revision().unwrap(),
        revision,
        "a refusal writes nothing"
    );
    // Once they report the model's version, the same check lets the change through.
    put(
        &[],
        &[("machine-2", "2.9.42"), ("machine-2-lxd-0", "2.9.42")],
    );
    assert!(matches!(
        store.set_agent_version(v("2.9.43"), &asked).unwrap(),
        AgentVersionSet::Set {
            change: AgentVersionChange::Changed { .. },
            ..
        }
    ));
    // By default they do not block: now every agent lags behind 2.9.43, and a change
    // without the check (to the same version back, then the lifecycle's) goes through.
    assert!(matches!(
        store
            .set_agent_version(v("2.9.42"), &AgentVersionCheck::LIFECYCLE)
            .unwrap(),
        AgentVersionSet::Set { .. }
    ));
    assert!(matches!(
        store
            .set_agent_version(v("2.9.43"), &AgentVersionCheck::operator(&catalogue))
            .unwrap(),
        AgentVersionSet::Set {
            change: AgentVersionChange::Changed { .. },
            ..
        }
    ));
}

/// The rule and the write are one transaction: with one handle creating and archiving
/// upgrade-info records and another changing agent-version as fast as they can, the event
/// log (the commit order) never shows the model written while a record is current. A
/// check made before its transaction would let a write land between a create and its
/// archive.
pub(crate) fn agent_version_is_never_written_while_a_record_is_current<H: Harness>()
where
    H::S: 'static,
{
    const ROUNDS: usize = 50;
    let h = H::new();
    assert!(h.store().create_model(&model()).unwrap());
    let start = h.store().revision().unwrap();
    let (recorder, setter) = (h.second(), h.second());
    let records = std::thread::spawn(move || {
        for _ in 0..ROUNDS {
            let view = written(
                recorder
                    .create_record(record(UpgradeStatus::Pending, &[], &[]))
                    .unwrap(),
            );
            let revision = view.current.expect("created").1;
            written(
                recorder
                    .update_record(revision, record(UpgradeStatus::Aborted, &[], &[]), None)
                    .unwrap(),
            );
        }
    });
    let versions = std::thread::spawn(move || {
        let mut changed = 0;
        for index in 0..ROUNDS * 2 {
            let version = if index % 2 == 0 {
                v("2.9.43")
            } else {
                v("2.9.42")
            };
            match setter
                .set_agent_version(version, &AgentVersionCheck::LIFECYCLE)
                .unwrap()
            {
                AgentVersionSet::Set {
                    change: AgentVersionChange::Changed { .. },
                    ..
                } => changed += 1,
                AgentVersionSet::Set { .. } => {}
                AgentVersionSet::Refused {
                    refusal: AgentVersionRefusal::UpgradeInProgress { .. },
                    agent_version,
                    view,
                } => {
                    assert!(view.current.is_some(), "refused with a record current");
                    assert_ne!(agent_version, version);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        changed
    });
    records.join().expect("the record writer");
    let changed = versions.join().expect("the agent-version writer");
    let mut current = false;
    let mut model_writes = 0;
    for event in all_events(h.store()) {
        if event.revision <= start {
            continue;
        }
        match (event.kind, event.change) {
            (EntityKind::UpgradeInfo, ChangeKind::Change) => current = true,
            (EntityKind::UpgradeInfo, ChangeKind::Remove) => current = false,
            (EntityKind::Model, _) => {
                model_writes += 1;
                assert!(
                    !current,
                    "agent-version written at revision {:?} while a record was current",
                    event.revision
                );
            }
            _ => {}
        }
    }
    assert_eq!(model_writes, changed, "every change committed once");
}

/// Instantiates every suite test for one engine.
macro_rules! suite {
    ($module:ident, $harness:ty) => {
        mod $module {
            use super::*;

            #[test]
            fn record_create_if_absent_and_compare_and_set() {
                super::record_create_if_absent_and_compare_and_set::<$harness>();
            }
            #[test]
            fn aborted_record_is_archived() {
                super::aborted_record_is_archived::<$harness>();
            }
            #[test]
            fn lease_keep_alive_expiry_and_fencing() {
                super::lease_keep_alive_expiry_and_fencing::<$harness>();
            }
            #[test]
            fn database_step_runs_exactly_once() {
                super::database_step_runs_exactly_once::<$harness>();
            }
            #[test]
            fn failed_step_commits_nothing() {
                super::failed_step_commits_nothing::<$harness>();
            }
            #[test]
            fn fenced_step_commits_nothing_once_the_lease_is_gone() {
                super::fenced_step_commits_nothing_once_the_lease_is_gone::<$harness>();
            }
            #[test]
            fn revisions_increase_across_handles_and_restarts() {
                super::revisions_increase_across_handles_and_restarts::<$harness>();
            }
            #[test]
            fn changes_since_pages_without_gaps_and_compaction_asks_for_resync() {
                super::changes_since_pages_without_gaps_and_compaction_asks_for_resync::<$harness>(
                );
            }
            #[test]
            fn client_operations_apply_exactly_once() {
                super::client_operations_apply_exactly_once::<$harness>();
            }
            #[test]
            fn model_requests_of_the_core() {
                super::model_requests_of_the_core::<$harness>();
            }
            #[test]
            fn an_operators_agent_version_is_checked_in_the_write() {
                super::an_operators_agent_version_is_checked_in_the_write::<$harness>();
            }
            #[test]
            fn agents_behind_refuse_an_agent_version_change_only_when_asked() {
                super::agents_behind_refuse_an_agent_version_change_only_when_asked::<$harness>();
            }
            #[test]
            fn agent_version_is_never_written_while_a_record_is_current() {
                super::agent_version_is_never_written_while_a_record_is_current::<$harness>();
            }
            #[test]
            fn new_capability_changes_every_machine_without_machine_writes() {
                super::new_capability_changes_every_machine_without_machine_writes::<$harness>();
            }
            #[test]
            fn legacy_machines_report_as_the_core_says_until_migrated() {
                super::legacy_machines_report_as_the_core_says_until_migrated::<$harness>();
            }
            #[test]
            fn a_step_that_outlives_its_lease_commits_nothing() {
                super::a_step_that_outlives_its_lease_commits_nothing::<$harness>();
            }
            #[test]
            fn concurrent_writers_lose_nothing() {
                super::concurrent_writers_lose_nothing::<$harness>();
            }
            #[test]
            fn snapshots_discard_writes() {
                super::snapshots_discard_writes::<$harness>();
            }
            #[test]
            fn agrees_with_the_core_testkit_store() {
                super::agrees_with_the_core_testkit_store::<$harness>();
            }
            #[test]
            fn settings_and_charm_documents_round_trip() {
                super::settings_and_charm_documents_round_trip::<$harness>();
            }
            #[test]
            fn the_rollout_record_is_kept_and_fenced() {
                super::the_rollout_record_is_kept_and_fenced::<$harness>();
            }
            #[test]
            fn machines_from_older_clients_are_stored_with_roles() {
                super::machines_from_older_clients_are_stored_with_roles::<$harness>();
            }
            #[test]
            fn agent_credentials_are_kept_and_never_logged() {
                super::agent_credentials_are_kept_and_never_logged::<$harness>();
            }
            #[test]
            fn agent_status_round_trips_and_is_never_logged() {
                super::agent_status_round_trips_and_is_never_logged::<$harness>();
            }
            #[test]
            fn removing_a_machine_removes_its_agents_credential_and_status() {
                super::removing_a_machine_removes_its_agents_credential_and_status::<$harness>();
            }
            #[test]
            fn concurrent_heartbeats_lose_nothing() {
                super::concurrent_heartbeats_lose_nothing::<$harness>();
            }
        }
    };
}

#[test]
fn sqlite_a_transaction_runs_once_while_an_agent_reports() {
    a_transaction_runs_once_while_an_agent_reports::<SqliteHarness>();
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_a_transaction_runs_once_while_an_agent_reports() {
    a_transaction_runs_once_while_an_agent_reports::<EtcdHarness>();
}

suite!(memory, MemoryHarness);
suite!(sqlite, SqliteHarness);
#[cfg(feature = "etcd")]
suite!(etcd, EtcdHarness);
