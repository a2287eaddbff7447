//! The in-memory engine: for tests and the simulator.
//!
//! It keeps two copies of the state: what every handle sees (*visible*) and what would
//! survive a crash (*durable*). With [`Durability::Full`] (SQLite's `synchronous=FULL`,
//! etcd's fsync before acknowledging) every commit is durable as it is acknowledged; with
//! [`Durability::Deferred`] commits become durable only at [`MemoryStore::sync`], as with
//! `synchronous=NORMAL` on power loss. [`MemoryStore::crash`] throws the visible state away
//! and goes back to the durable one; a transaction open during the crash commits nothing.
//!
//! Transactions are optimistic: the body runs on a private copy, and the commit succeeds
//! only if nobody committed in between (otherwise the body runs again, as etcd's STM
//! does). "In between" is counted in commits, not revisions: a commit that logs no event
//! (an operation, an agent's credential or status) leaves the revision alone but still
//! conflicts. Every handle cloned from one store shares it, like controllers sharing a database.
//!
//! Copies are cheap: the state's maps and logs are persistent collections (`imbl`'s B-tree
//! [`OrdMap`], ordered like a `BTreeMap`, and RRB-tree [`Vector`]) that share their nodes
//! between copies, so taking a transaction's private copy, or a durable one, costs O(1) and a
//! write copies only the O(log n) nodes on its path. A commit's cost does not grow with the
//! state.

use std::sync::{Arc, Mutex, MutexGuard};

use imbl::{OrdMap, Vector};

use lockstep_core::lifecycle::{ControllerId, LeaseToken, Revision, UpgradeInfo};
use lockstep_core::steps::StepKey;
use lockstep_core::{Millis, Timestamp};

use crate::error::encode;
use crate::lease::{self, Clock, Lease, SystemClock};
use crate::postcondition::{self, CommitOrder};
use crate::watch::Notifier;
use crate::{
    Abort, AgentStatus, ChangeKind, Changes, Checkpoint, EntityKind, Event, Machine, Model, Store,
    StoreError, Tx, TxOutcome, finish_body, machine_tag,
};

/// How many times a transaction runs again after conflicting with another writer.
const ATTEMPTS_MAX: u32 = 1000;

/// When a commit becomes durable.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Durability {
    /// Every acknowledged commit survives a crash.
    Full,
    /// Commits survive a crash only once [`MemoryStore::sync`] ran.
    Deferred,
}

/// Everything the store holds. Cloning it is O(1): see the module's doc.
#[derive(Clone, Debug)]
struct State {
    revision: u64,
    compacted: u64,
    model: Option<Model>,
    machines: OrdMap<String, Machine>,
    documents: OrdMap<(EntityKind, String), serde_json::Value>,
    checkpoints: OrdMap<StepKey, Checkpoint>,
    operations: OrdMap<String, serde_json::Value>,
    /// Agents' credentials (argon2 PHC strings) by tag: no events.
    agent_passwords: OrdMap<String, String>,
    /// Agents' last reports by tag: no events.
    agent_statuses: OrdMap<String, AgentStatus>,
    /// Commits so far: what optimistic transactions compare (see the module's doc).
    commits: u64,
    record: Option<(UpgradeInfo, Revision)>,
    archived: Vector<UpgradeInfo>,
    /// The log, in revision order (each event logged with the next revision).
    events: Vector<Event>,
    lease: Option<Lease>,
    next_token: u64,
}

impl Default for State {
    fn default() -> State {
        State {
            revision: 0,
            compacted: 0,
            model: None,
            machines: OrdMap::new(),
            documents: OrdMap::new(),
            checkpoints: OrdMap::new(),
            operations: OrdMap::new(),
            agent_passwords: OrdMap::new(),
            agent_statuses: OrdMap::new(),
            commits: 0,
            record: None,
            archived: Vector::new(),
            events: Vector::new(),
            lease: None,
            next_token: 1,
        }
    }
}

#[derive(Debug)]
struct Shared {
    visible: State,
    durable: State,
    durability: Durability,
    /// Bumped by every crash: a transaction begun in an earlier generation is lost.
    generation: u64,
    /// The revisions committed, checked under this lock (`postcondition`).
    order: CommitOrder,
}

impl Shared {
    fn acknowledge(&mut self) {
        if self.durability == Durability::Full {
            self.durable = self.visible.clone();
        }
    }
}

/// The in-memory store. Clones are handles on the same store.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
    clock: Arc<dyn Clock>,
    /// Wakes watchers on every handle after each commit.
    notifier: Arc<Notifier>,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new(durability: Durability) -> MemoryStore {
        MemoryStore::with_clock(durability, Arc::new(SystemClock))
    }

    /// An empty store reading lease expiry from `clock`.
    pub fn with_clock(durability: Durability, clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            shared: Arc::new(Mutex::new(Shared {
                visible: State::default(),
                durable: State::default(),
                durability,
                generation: 0,
                order: CommitOrder::default(),
            })),
            clock,
            notifier: Arc::new(Notifier::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock leaves the state as it was before the panicking
        // commit (a commit replaces the whole state at once, with one assignment of a state
        // built beforehand), so a poisoned lock is still consistent.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes every acknowledged commit durable.
    pub fn sync(&self) {
        let mut shared = self.lock();
        shared.durable = shared.visible.clone();
    }

    /// The process holding the store dies: what was not durable is lost, and transactions
    /// open now commit nothing.
    pub fn crash(&self) {
        let mut shared = self.lock();
        shared.visible = shared.durable.clone();
        shared.generation += 1;
        shared.order.reset(Revision(shared.visible.revision));
        self.notifier.reset(Revision(shared.visible.revision));
    }
}

impl Store for MemoryStore {
    fn transaction(
        &self,
        fence: Option<LeaseToken>,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<TxOutcome, StoreError> {
        for _ in 0..ATTEMPTS_MAX {
            let (mut state, generation) = {
                let shared = self.lock();
                (shared.visible.clone(), shared.generation)
            };
            let base = state.revision;
            let base_commits = state.commits;
            let now = self.clock.now();
            if !lease::fence_holds(state.lease, fence, now) {
                return Ok(TxOutcome::Fenced);
            }
            let mut tx = MemoryTx {
                state: &mut state,
                now,
                logged: 0,
            };
            let result = body(&mut tx);
            let logged = tx.logged;
            if result.is_err() {
                return finish_body(result);
            }
            let mut shared = self.lock();
            if shared.generation != generation {
                return Err(StoreError::Crashed);
            }
            if shared.visible.commits != base_commits {
                continue;
            }
            debug_assert_eq!(shared.visible.revision, base, "no commit, no new revision");
            state.commits += 1;
            // The lease is not the body's: keep the one committed meanwhile, and check the
            // fence against it at the commit point.
            state.lease = shared.visible.lease;
            state.next_token = shared.visible.next_token;
            if !lease::fence_holds(state.lease, fence, self.clock.now()) {
                return Ok(TxOutcome::Fenced);
            }
            let revision = Revision(state.revision);
            postcondition::assert_commit("memory", Revision(base), logged, revision);
            if logged > 0 {
                shared.order.assert_after_last("memory", revision);
            }
            shared.visible = state;
            shared.acknowledge();
            drop(shared);
            self.notifier.announce(revision);
            return Ok(TxOutcome::Committed(revision));
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    fn snapshot(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock().visible.clone();
        body(&mut MemoryTx {
            state: &mut state,
            logged: 0,
            now: self.clock.now(),
        })
    }

    fn acquire_lease(
        &self,
        holder: ControllerId,
        ttl: Millis,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let mut shared = self.lock();
        let now = self.clock.now();
        let state = &mut shared.visible;
        let (lease, answer) = lease::acquire(state.lease, holder, ttl, now, state.next_token);
        if answer == Some(LeaseToken(state.next_token)) {
            state.next_token += 1;
        }
        state.lease = lease;
        shared.acknowledge();
        Ok(answer)
    }

    fn keep_alive_lease(
        &self,
        holder: ControllerId,
        token: LeaseToken,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let mut shared = self.lock();
        let now = self.clock.now();
        let (lease, answer) = lease::keep_alive(shared.visible.lease, holder, token, now);
        shared.visible.lease = lease;
        shared.acknowledge();
        Ok(answer)
    }

    fn release_lease(&self, holder: ControllerId, token: LeaseToken) -> Result<bool, StoreError> {
        let mut shared = self.lock();
        let (lease, released) = lease::release(shared.visible.lease, holder, token);
        shared.visible.lease = lease;
        shared.acknowledge();
        Ok(released)
    }

    fn lease(&self) -> Result<Option<Lease>, StoreError> {
        Ok(self.lock().visible.lease)
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Changes, StoreError> {
        let shared = self.lock();
        let state = &shared.visible;
        if after.0 < state.compacted || after.0 > state.revision {
            return Ok(Changes::ResyncNeeded {
                compacted: Revision(state.compacted),
                current: Revision(state.revision),
            });
        }
        let start = events_through(&state.events, after);
        let events = state
            .events
            .focus()
            .narrow(start..)
            .into_iter()
            .take(limit)
            .cloned()
            .collect();
        Ok(Changes::Events {
            events,
            current: Revision(state.revision),
        })
    }

    fn compact(&self, through: Revision) -> Result<(), StoreError> {
        let mut shared = self.lock();
        let state = &mut shared.visible;
        let through = through.0.min(state.revision);
        if through > state.compacted {
            // The events are in revision order: dropping those through `through` drops a
            // prefix, O(log n).
            let dropped = events_through(&state.events, Revision(through));
            state.events = state.events.skip(dropped);
            state.compacted = through;
            // A transaction begun before must not put the dropped events back.
            state.commits += 1;
            shared.acknowledge();
        }
        Ok(())
    }

    fn wait_for_change(&self, after: Revision, timeout: std::time::Duration) -> bool {
        self.notifier.wait_above(after, timeout)
    }
}

/// How many of `events` (in revision order) have a revision at most `through`: where the
/// events after `through` start.
fn events_through(events: &Vector<Event>, through: Revision) -> usize {
    // A comparator that never answers `Equal` finds the partition point (`Err`).
    match events.binary_search_by(|event| {
        if event.revision <= through {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    }) {
        Ok(index) | Err(index) => index,
    }
}

struct MemoryTx<'a> {
    state: &'a mut State,
    now: Timestamp,
    /// Events logged by this transaction.
    logged: u64,
}

impl MemoryTx<'_> {
    fn log(
        &mut self,
        kind: EntityKind,
        id: &str,
        change: ChangeKind,
        entity: serde_json::Value,
    ) -> Revision {
        self.state.revision += 1;
        self.logged += 1;
        let revision = Revision(self.state.revision);
        self.state.events.push_back(Event {
            revision,
            kind,
            id: id.to_owned(),
            change,
            entity,
        });
        revision
    }
}

impl Tx for MemoryTx<'_> {
    fn now(&self) -> Timestamp {
        self.now
    }

    fn revision(&mut self) -> Result<Revision, StoreError> {
        Ok(Revision(self.state.revision))
    }

    fn model(&mut self) -> Result<Option<Model>, StoreError> {
        Ok(self.state.model.clone())
    }

    fn put_model(&mut self, model: &Model) -> Result<Revision, StoreError> {
        self.state.model = Some(model.clone());
        Ok(self.log(
            EntityKind::Model,
            &model.uuid,
            ChangeKind::Change,
            encode(model),
        ))
    }

    fn machine(&mut self, id: &str) -> Result<Option<Machine>, StoreError> {
        Ok(self.state.machines.get(id).cloned())
    }

    fn machines(&mut self) -> Result<Vec<Machine>, StoreError> {
        Ok(self.state.machines.values().cloned().collect())
    }

    fn put_machine(&mut self, machine: &Machine) -> Result<Revision, StoreError> {
        self.state
            .machines
            .insert(machine.id.clone(), machine.clone());
        Ok(self.log(
            EntityKind::Machine,
            &machine.id,
            ChangeKind::Change,
            encode(machine),
        ))
    }

    fn remove_machine(&mut self, id: &str) -> Result<Option<Revision>, StoreError> {
        let tag = machine_tag(id);
        self.state.agent_passwords.remove(&tag);
        self.state.agent_statuses.remove(&tag);
        Ok(self.state.machines.remove(id).map(|machine| {
            self.log(
                EntityKind::Machine,
                id,
                ChangeKind::Remove,
                encode(&machine),
            )
        }))
    }

    fn document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self.state.documents.get(&(kind, id.to_owned())).cloned())
    }

    fn documents(
        &mut self,
        kind: EntityKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        crate::sqlite::document_table(kind)?;
        // The documents of one kind are adjacent, from `(kind, "")` on.
        Ok(self
            .state
            .documents
            .range((kind, String::new())..)
            .take_while(|((document_kind, _), _)| *document_kind == kind)
            .map(|((_, id), document)| (id.clone(), document.clone()))
            .collect())
    }

    fn put_document(
        &mut self,
        kind: EntityKind,
        id: &str,
        document: &serde_json::Value,
    ) -> Result<Revision, StoreError> {
        crate::sqlite::document_table(kind)?;
        self.state
            .documents
            .insert((kind, id.to_owned()), document.clone());
        Ok(self.log(kind, id, ChangeKind::Change, document.clone()))
    }

    fn remove_document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<Revision>, StoreError> {
        crate::sqlite::document_table(kind)?;
        Ok(self
            .state
            .documents
            .remove(&(kind, id.to_owned()))
            .map(|document| self.log(kind, id, ChangeKind::Remove, document)))
    }

    fn checkpoint(&mut self, key: &StepKey) -> Result<Option<Checkpoint>, StoreError> {
        Ok(self.state.checkpoints.get(key).copied())
    }

    fn put_checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<Revision, StoreError> {
        self.state.checkpoints.insert(checkpoint.key, *checkpoint);
        Ok(self.log(
            EntityKind::Step,
            &checkpoint.key.to_string(),
            ChangeKind::Change,
            encode(checkpoint),
        ))
    }

    fn operation(&mut self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self.state.operations.get(id).cloned())
    }

    fn put_operation(&mut self, id: &str, result: &serde_json::Value) -> Result<(), StoreError> {
        self.state.operations.insert(id.to_owned(), result.clone());
        Ok(())
    }

    fn agent_password_hash(&mut self, tag: &str) -> Result<Option<String>, StoreError> {
        Ok(self.state.agent_passwords.get(tag).cloned())
    }

    fn set_agent_password_hash(&mut self, tag: &str, phc: &str) -> Result<(), StoreError> {
        self.state
            .agent_passwords
            .insert(tag.to_owned(), phc.to_owned());
        Ok(())
    }

    fn agent_status(&mut self, tag: &str) -> Result<Option<AgentStatus>, StoreError> {
        Ok(self.state.agent_statuses.get(tag).cloned())
    }

    fn agent_statuses(&mut self) -> Result<Vec<(String, AgentStatus)>, StoreError> {
        Ok(self
            .state
            .agent_statuses
            .iter()
            .map(|(tag, status)| (tag.clone(), status.clone()))
            .collect())
    }

    fn put_agent_status(&mut self, tag: &str, status: &AgentStatus) -> Result<(), StoreError> {
        self.state
            .agent_statuses
            .insert(tag.to_owned(), status.clone());
        Ok(())
    }

    fn record(&mut self) -> Result<Option<(UpgradeInfo, Revision)>, StoreError> {
        Ok(self.state.record)
    }

    fn last_archived(&mut self) -> Result<Option<UpgradeInfo>, StoreError> {
        Ok(self.state.archived.last().copied())
    }

    fn put_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        let revision = self.log(
            EntityKind::UpgradeInfo,
            crate::sqlite::RECORD_CURRENT,
            ChangeKind::Change,
            encode(record),
        );
        self.state.record = Some((*record, revision));
        Ok(revision)
    }

    fn archive_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        self.state.record = None;
        self.state.archived.push_back(*record);
        Ok(self.log(
            EntityKind::UpgradeInfo,
            crate::sqlite::RECORD_CURRENT,
            ChangeKind::Remove,
            encode(record),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{START, model};
    use crate::{Application, Life, ManualClock};

    fn store(durability: Durability) -> MemoryStore {
        MemoryStore::with_clock(durability, Arc::new(ManualClock::new(START)))
    }

    fn add(tx: &mut dyn Tx, name: &str) -> Result<(), Abort> {
        tx.put_application(&Application {
            name: name.to_owned(),
            charm: "ch:mysql".to_owned(),
            life: Life::Alive,
        })?;
        Ok(())
    }

    fn has(store: &MemoryStore, name: &str) -> bool {
        store
            .read(|tx| tx.document(EntityKind::Application, name))
            .unwrap()
            .is_some()
    }

    #[test]
    fn deferred_commits_are_lost_by_a_crash_until_synced() {
        let store = store(Durability::Deferred);
        store.create_model(&model()).unwrap();
        store.sync();
        store.transaction(None, &mut |tx| add(tx, "lost")).unwrap();
        assert!(has(&store, "lost"), "visible before the crash");
        store.crash();
        assert!(!has(&store, "lost"), "not durable: lost");
        assert_eq!(store.load_model().unwrap(), Some(model()), "synced: kept");
        assert_eq!(store.revision().unwrap(), Revision(1));
        store.transaction(None, &mut |tx| add(tx, "kept")).unwrap();
        store.sync();
        store.crash();
        assert!(has(&store, "kept"));
    }

    #[test]
    fn full_durability_keeps_every_acknowledged_commit() {
        let store = store(Durability::Full);
        store.transaction(None, &mut |tx| add(tx, "kept")).unwrap();
        let token = store.acquire_lease(ControllerId(0), Millis(1000)).unwrap();
        store.crash();
        assert!(has(&store, "kept"));
        assert_eq!(store.lease().unwrap().map(|lease| lease.token), token);
    }

    #[test]
    fn a_transaction_open_during_a_crash_commits_nothing() {
        let store = store(Durability::Full);
        let handle = store.clone();
        let error = store
            .transaction(None, &mut |tx| {
                add(tx, "half")?;
                handle.crash();
                add(tx, "other-half")
            })
            .unwrap_err();
        assert_eq!(error, StoreError::Crashed);
        assert!(!has(&store, "half") && !has(&store, "other-half"));
        assert_eq!(store.revision().unwrap(), Revision(0));
    }

    #[test]
    fn a_watcher_ahead_of_a_crashed_store_is_told_to_resync() {
        let store = store(Durability::Deferred);
        store.transaction(None, &mut |tx| add(tx, "a")).unwrap();
        store.sync();
        store.transaction(None, &mut |tx| add(tx, "b")).unwrap();
        // A watcher saw revision 2; the crash loses it.
        store.crash();
        assert_eq!(
            store.changes_since(Revision(2), 10).unwrap(),
            Changes::ResyncNeeded {
                compacted: Revision(0),
                current: Revision(1)
            }
        );
    }

    #[test]
    fn conflicting_transactions_run_again_on_the_new_state() {
        let store = store(Durability::Full);
        let other = store.clone();
        let mut runs = 0;
        let mut seen_other = false;
        store
            .transaction(None, &mut |tx| {
                runs += 1;
                if runs == 1 {
                    // Another controller commits while this body runs.
                    other
                        .transaction(None, &mut |tx| add(tx, "theirs"))
                        .unwrap();
                }
                seen_other = tx.document(EntityKind::Application, "theirs")?.is_some();
                add(tx, "mine")
            })
            .unwrap();
        assert_eq!(runs, 2);
        assert!(seen_other, "the second run saw the other commit");
        let revisions: Vec<u64> = match store.changes_since(Revision(0), 10).unwrap() {
            Changes::Events { events, .. } => events.iter().map(|e| e.revision.0).collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(revisions, [1, 2]);
    }

    /// Writes that log no event still conflict: two controllers recording heartbeats at
    /// once both keep theirs (a revision compare would let the later copy drop the other).
    #[test]
    fn writes_without_events_conflict_and_run_again() {
        let store = store(Durability::Full);
        let other = store.clone();
        let status = |phase: &str| AgentStatus {
            status: "started".to_owned(),
            info: String::new(),
            phase: phase.to_owned(),
            version: None,
            download_rate: None,
            updated: START,
        };
        let mut runs = 0;
        store
            .transaction(None, &mut |tx| {
                runs += 1;
                if runs == 1 {
                    other
                        .transaction(None, &mut |tx| {
                            tx.put_agent_status("machine-1", &status("ready"))?;
                            Ok(())
                        })
                        .unwrap();
                }
                tx.put_agent_status("machine-0", &status("upgrading"))?;
                Ok(())
            })
            .unwrap();
        assert_eq!(runs, 2);
        let tags: Vec<String> = store
            .read(|tx| tx.agent_statuses())
            .unwrap()
            .into_iter()
            .map(|(tag, _)| tag)
            .collect();
        assert_eq!(tags, ["machine-0", "machine-1"]);
        assert_eq!(store.revision().unwrap(), Revision(0));
    }

    /// `documents(kind)` reads one kind's range of the map: only that kind, sorted by id,
    /// whatever the other kinds hold around it.
    #[test]
    fn documents_of_one_kind_come_alone_and_sorted_by_id() {
        let store = store(Durability::Full);
        let kinds = [
            EntityKind::Application,
            EntityKind::Unit,
            EntityKind::Relation,
            EntityKind::Settings,
            EntityKind::Charm,
        ];
        store
            .transaction(None, &mut |tx| {
                for index in [7, 0, 30, 12, 5, 100] {
                    for kind in kinds {
                        let id = format!("{kind:?}-{index}");
                        tx.put_document(kind, &id, &serde_json::json!({ "index": index }))?;
                    }
                }
                Ok(())
            })
            .unwrap();
        for kind in kinds {
            let ids: Vec<String> = store
                .read(|tx| tx.documents(kind))
                .unwrap()
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let mut expected: Vec<String> = [7, 0, 30, 12, 5, 100]
                .iter()
                .map(|index| format!("{kind:?}-{index}"))
                .collect();
            expected.sort();
            assert_eq!(ids, expected, "{kind:?}");
        }
    }

    /// A log longer than one node of the persistent vector: paging and compaction cut it in
    /// the middle of nodes, and a durable copy taken before the compaction keeps its events.
    #[test]
    fn a_long_log_pages_and_compacts_at_any_revision() {
        let store = store(Durability::Deferred);
        for index in 0..300 {
            store
                .transaction(None, &mut |tx| add(tx, &format!("app-{index}")))
                .unwrap();
        }
        store.sync();
        let revisions = |after: u64, limit: usize| -> Vec<u64> {
            match store.changes_since(Revision(after), limit).unwrap() {
                Changes::Events { events, .. } => events.iter().map(|e| e.revision.0).collect(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(revisions(0, 1000), (1..=300).collect::<Vec<_>>());
        assert_eq!(revisions(63, 70), (64..=133).collect::<Vec<_>>());
        store.compact(Revision(130)).unwrap();
        assert_eq!(revisions(130, 1000), (131..=300).collect::<Vec<_>>());
        assert_eq!(revisions(200, 50), (201..=250).collect::<Vec<_>>());
        assert_eq!(revisions(300, 50), Vec::<u64>::new());
        assert!(matches!(
            store.changes_since(Revision(129), 10).unwrap(),
            Changes::ResyncNeeded { .. }
        ));
        // The compaction was not synced: the crash brings back the durable log, whole.
        store.crash();
        assert_eq!(revisions(0, 1000), (1..=300).collect::<Vec<_>>());
    }

    #[test]
    fn documents_are_only_applications_units_relations_settings_and_charms() {
        let store = store(Durability::Full);
        let error = store
            .transaction(None, &mut |tx| {
                tx.put_document(EntityKind::Machine, "0", &serde_json::json!({}))?;
                Ok(())
            })
            .unwrap_err();
        assert_eq!(
            error,
            StoreError::NotADocument {
                kind: EntityKind::Machine
            }
        );
    }
}
