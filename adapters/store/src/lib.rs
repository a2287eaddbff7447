//! # lockstep-store
//!
//! Persistent state shared by a model's controllers (`CONTRACT.md`, "Where state lives"):
//! the model, machines, applications, units, relations, the upgrade-info record,
//! database-step checkpoints, applied client operation ids and the event log, plus the
//! coordinator lease. The agent's own snapshot is not here: it lives in its data dir.
//!
//! ## Layout
//!
//! - [`Store`]: the trait every engine implements, and on top of it, once for all engines,
//!   the operations the lifecycle core requests (create and compare-and-set of the
//!   upgrade-info record, exactly-once database steps, the model's agent version,
//!   `upgrade-available` and capabilities) and client operations with an `operation-id`.
//! - [`Tx`]: what a transaction body may read and write. Every write of an entity appends
//!   an [`Event`]; client operations, agents' credentials and agents' status do not.
//! - [`MemoryStore`]: the in-memory engine for tests and the simulator. It keeps what was
//!   durably committed apart from what a crash would lose ([`MemoryStore::crash`]).
//! - [`SqliteStore`]: the embedded default (rusqlite, bundled SQLite; WAL,
//!   `synchronous=FULL`), with its schema migrated by version at open.
//! - `EtcdStore` (feature `etcd`): the engine for several controllers, on etcd's
//!   transactions, leases and watches (`etcd.rs` says how each method maps to etcd).
//! - [`endpoint`]: which etcd endpoints may be spoken to in plain http (loopback only,
//!   unless the operator accepted the risk); compiled without the feature too.
//! - [`seed004`]: roles, capabilities and reported jobs at the store level, and lockstep's
//!   own database step that migrates legacy machines (jobs only) to roles.
//! - [`Watcher`]: a watcher's cursor: replay after a revision, then follow live changes,
//!   woken in process right after each commit ([`Notifier`], [`Store::wait_for_change`]).
//! - [`Clock`], [`SystemClock`], [`ManualClock`], [`Lease`]: lease expiry.
//!
//! ## The trait's guarantees (for every engine, etcd next)
//!
//! - **Transactions are atomic and serializable.** [`Store::transaction`] runs a body that
//!   reads and writes through [`Tx`]; either all of its writes commit, with their events, or
//!   none. A body may run more than once (an optimistic engine such as the in-memory one, or
//!   etcd's STM, retries on conflict): it must act only through `tx` and reset anything it
//!   captures at its start. Nothing assumes one process: SQLite stores opened twice on one
//!   file, or two handles of one [`MemoryStore`], behave as two controllers.
//! - **Create-if-absent** ([`Store::create_record`], [`Store::create_model`],
//!   [`Store::add_machine`]) and **compare-and-set on a record's revision**
//!   ([`Store::update_record`]) are transactions that read, then write only if the read
//!   still holds.
//! - **Lease with keep-alive and expiry.** [`Store::acquire_lease`] grants a free or
//!   expired lease with a fresh, strictly increasing [`LeaseToken`] (the fencing token);
//!   the live holder gets its own token back, extended; anyone else `None`.
//!   [`Store::keep_alive_lease`] extends a live lease by its TTL or answers `None` (lost).
//!   Expiry is read from the store's [`Clock`], not passed in: the core's timestamps come
//!   from each process's own monotonic clock and cannot be compared across controllers.
//! - **Fenced writes.** A transaction fenced on a token commits only if, inside the same
//!   transaction, that token is the live lease's; otherwise nothing is written and the
//!   answer is `Fenced`. The fence is checked before anything else (as the core's testkit
//!   does): a fenced step whose checkpoint exists answers `Fenced`, not `AlreadyApplied`.
//! - **Revisions.** Every write gets its own revision, strictly increasing, never reused,
//!   also across compaction; the writes of one transaction get consecutive revisions. A
//!   record's revision is that of its last write.
//! - **Watch from a revision.** [`Store::changes_since`] returns every event after `R` in
//!   order, at most `limit` (a page may end inside a transaction; ask again after the last
//!   revision). After [`Store::compact`] dropped events at or below `C`, a request from
//!   `R < C` answers [`Changes::ResyncNeeded`] with the current revision, never a silent
//!   gap; so does a request from a revision the store never reached.
//! - **Exactly-once database steps.** [`Store::run_database_step`] commits the step's
//!   writes and its checkpoint in one transaction; a checkpointed step is a no-op
//!   (`AlreadyApplied`); a failed step commits nothing; a fenced step whose lease is gone
//!   commits nothing.
//!
//! ## Crash safety
//!
//! `crash.rs` (a test) kills a real writer process with SIGKILL at every durable write of a
//! bootstrap followed by an upgrade (before and after each SQLite commit, before and after
//! each rename of the local snapshot), reopens, checks that the store holds exactly what was
//! acknowledged, and resumes to the same end state: each database step once, each change
//! once in the event log, `upgradedToVersion` never ahead of the checkpoints.
//!
//! ## The event log
//!
//! Every write appends `[kind, change|remove, entity]` with its revision (Juju's delta
//! shape): kinds `model`, `machine`, `application`, `unit`, `relation`, `upgrade-info` (id
//! `current`; archiving a final record is a `remove` carrying the final record), `step`
//! (a database step's checkpoint, id `<step>@<version>`), `settings` (id `model`: model
//! config keys beyond the model's fields) and `charm` (id the charm URL). Leases and client operation ids
//! are not entities and write no events (keep-alives would flood the log); neither do
//! agents' credentials (secrets: never in a delta) nor agents' status (a heartbeat every
//! few seconds per agent), which are read when needed.
//!
//! ## Decisions where the issue was silent
//!
//! - Lease expiry reads the store's [`Clock`] (the wall clock for SQLite, whose writers
//!   share one host; the server's TTL for etcd); the TTL is given at acquire and reused by
//!   keep-alives. The fence is checked when the transaction begins and again at its commit,
//!   so a step that outlives its lease commits nothing.
//! - A compare-and-set that matches the revision but asks for a transition
//!   `UpgradeInfo::may_become` refuses is an error ([`StoreError::InvalidTransition`]),
//!   not a write: the core's testkit writes it (and counts a violation); a real store must
//!   not. A new record must be pending.
//! - [`Store::set_agent_version`] decides with the core's rule
//!   ([`AgentVersionCheck`]: no change while an upgrade-info record is current, Juju's
//!   rule; an operator's lower version or a version without binaries refused) inside its
//!   write transaction, and answers a refusal as [`AgentVersionSet::Refused`] with what
//!   the transaction saw, not as an error.
//! - A model update that changes nothing writes nothing (no event).
//! - [`seed004::MACHINE_JOBS_TO_ROLES`] clears a migrated machine's legacy jobs; a machine
//!   whose jobs imply no role is left as stored.
//! - Reads ([`Store::snapshot`]) never take the write lock; a body's writes in a snapshot
//!   are discarded.
//! - The SQLite schema is versioned in its own `schema_version` table (not `user_version`,
//!   so that a stray tool cannot reset it silently); version 1 is the schema before seed 004
//!   (machines with jobs only), version 2 adds roles and capabilities, version 3 settings
//!   and charms, version 4 agents' credentials and status, version 5 the rate of an
//!   agent's last binary download in its status.
//!
//! ## Sync, not async
//!
//! The methods are blocking. SQLite is a blocking library and every call is a short local
//! transaction; an async trait would only move the blocking into each implementation. The
//! agent calls the store from a blocking task (`tokio::task::spawn_blocking` or a dedicated
//! store thread that executes the core's store requests in order). The trait is
//! dyn-compatible (`&dyn Store`), which native `async fn` in traits is not. An etcd engine
//! can implement it by blocking on its client's futures inside its own runtime.

pub mod endpoint;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod lease;
pub mod memory;
mod postcondition;
pub mod seed004;
pub mod sqlite;
mod types;
pub mod watch;

#[cfg(test)]
mod crash;
#[cfg(test)]
mod suite;

pub use error::StoreError;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdIdentity, EtcdStore, EtcdTls, EtcdUser};
pub use lease::{Clock, Lease, ManualClock, SystemClock};
pub use memory::{Durability, MemoryStore};
pub use sqlite::{OpenMode, SqliteStore};
pub use types::{
    AgentStatus, Application, ChangeKind, Changes, Checkpoint, Discovery, EntityKind, Event, Life,
    Machine, Model, OperationOutcome, Relation, Unit, machine_tag,
};
pub use watch::{Notifier, Watcher};

use lockstep_core::Millis;
use lockstep_core::Version;
use lockstep_core::jobs::{Capabilities, JobTable, Jobs};
use lockstep_core::lifecycle::{
    ControllerId, LeaseToken, RecordView, RecordWrite, Revision, StepOutcome, UpgradeInfo,
    UpgradeStatus,
};
use lockstep_core::rollout::Rollout;
use lockstep_core::steps::StepKey;
pub use lockstep_core::upgrader::{
    AgentRunning, AgentVersionChange, AgentVersionCheck, AgentVersionRefusal,
};

use crate::error::encode;

/// The id of the settings document that holds the rollout record ([`Tx::rollout`]).
pub const ROLLOUT_SETTINGS: &str = "rollout";

/// Why a transaction body stopped without committing.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Abort {
    /// The body failed: roll back and report this.
    Failed(String),
    /// Nothing to do (e.g. the checkpoint already exists): roll back quietly.
    Unchanged,
    /// The engine failed.
    Store(StoreError),
}

impl From<StoreError> for Abort {
    fn from(error: StoreError) -> Abort {
        Abort::Store(error)
    }
}

/// How [`Store::set_agent_version`] ended (engine failures are its `Err`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum AgentVersionSet {
    /// The model holds the version asked for: written now
    /// ([`AgentVersionChange::Changed`]) or already ([`AgentVersionChange::Unchanged`]).
    Set {
        /// The model after the write.
        model: Model,
        /// What was written.
        change: AgentVersionChange,
    },
    /// Refused by the check; nothing was written. With what the refusing transaction read:
    /// the model's agent-version and the upgrade-info record, which a driver hands to the
    /// core as `Input::AgentVersionRefused` as they are.
    Refused {
        /// Why.
        refusal: AgentVersionRefusal,
        /// The model's agent-version in the refusing transaction.
        agent_version: Version,
        /// The upgrade-info record in the refusing transaction.
        view: RecordView,
    },
}

/// How a transaction ended (engine failures are the `Err` of [`Store::transaction`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TxOutcome {
    /// Committed; the store's revision after the commit.
    Committed(Revision),
    /// Fenced on a lease that is not live: nothing written.
    Fenced,
    /// The body returned [`Abort::Unchanged`]: nothing written.
    Unchanged,
    /// The body returned [`Abort::Failed`]: nothing written.
    Failed(String),
}

/// What a transaction body reads and writes. Every `put_*` and `remove_*` of an entity
/// appends one event with the next revision and returns it; the writes that return `()`
/// (client operations, agents' credentials and status) append none.
pub trait Tx {
    /// The store's clock, read once when the transaction began.
    fn now(&self) -> lockstep_core::Timestamp;
    /// The revision of the last write, this transaction's included.
    fn revision(&mut self) -> Result<Revision, StoreError>;

    fn model(&mut self) -> Result<Option<Model>, StoreError>;
    fn put_model(&mut self, model: &Model) -> Result<Revision, StoreError>;

    fn machine(&mut self, id: &str) -> Result<Option<Machine>, StoreError>;
    /// Every machine, by id.
    fn machines(&mut self) -> Result<Vec<Machine>, StoreError>;
    fn put_machine(&mut self, machine: &Machine) -> Result<Revision, StoreError>;
    /// `None` when there was no such machine (and no event). Also deletes the credential and
    /// the status of its agent (tag [`machine_tag`]`(id)`), whether or not the machine was
    /// there: a removed machine's agent can no longer log in.
    fn remove_machine(&mut self, id: &str) -> Result<Option<Revision>, StoreError>;

    /// An application, unit, relation, settings or charm document, by kind and id.
    fn document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<serde_json::Value>, StoreError>;
    /// Every document of one kind, ordered by id.
    fn documents(
        &mut self,
        kind: EntityKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError>;
    /// Writes an application, unit, relation, settings or charm document.
    fn put_document(
        &mut self,
        kind: EntityKind,
        id: &str,
        document: &serde_json::Value,
    ) -> Result<Revision, StoreError>;
    fn remove_document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<Revision>, StoreError>;

    fn checkpoint(&mut self, key: &StepKey) -> Result<Option<Checkpoint>, StoreError>;
    fn put_checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<Revision, StoreError>;

    /// The recorded result of a client operation.
    fn operation(&mut self, id: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// Records a client operation's result (no event: it is not an entity).
    fn put_operation(&mut self, id: &str, result: &serde_json::Value) -> Result<(), StoreError>;

    /// The argon2 PHC string of the agent with `tag` (e.g. `machine-0`), if it has one.
    fn agent_password_hash(&mut self, tag: &str) -> Result<Option<String>, StoreError>;
    /// Sets (or replaces) the agent's argon2 PHC string. A secret: no event, so it is never
    /// in [`Store::changes_since`] nor in a watcher's delta, and it wakes no watcher.
    fn set_agent_password_hash(&mut self, tag: &str, phc: &str) -> Result<(), StoreError>;

    /// What the agent with `tag` last reported.
    fn agent_status(&mut self, tag: &str) -> Result<Option<AgentStatus>, StoreError>;
    /// Every agent's last report, ordered by tag.
    fn agent_statuses(&mut self) -> Result<Vec<(String, AgentStatus)>, StoreError>;
    /// Records (or replaces) the agent's report; the caller sets `updated` (`tx.now()`).
    /// Durable, but no event: agents write it every few seconds as a heartbeat, and an
    /// event each time would flood the log and wake every watcher. Readers (`status`) read
    /// it when asked instead of watching it.
    fn put_agent_status(&mut self, tag: &str, status: &AgentStatus) -> Result<(), StoreError>;

    /// The current upgrade-info record and its revision.
    fn record(&mut self) -> Result<Option<(UpgradeInfo, Revision)>, StoreError>;
    /// The most recently archived record.
    fn last_archived(&mut self) -> Result<Option<UpgradeInfo>, StoreError>;
    /// Writes the current record.
    fn put_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError>;
    /// Removes the current record and appends `record` to the archive.
    fn archive_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError>;
}

impl dyn Tx + '_ {
    pub fn application(&mut self, name: &str) -> Result<Option<Application>, StoreError> {
        self.typed(EntityKind::Application, name)
    }

    pub fn put_application(&mut self, application: &Application) -> Result<Revision, StoreError> {
        self.put_document(
            EntityKind::Application,
            &application.name,
            &encode(application),
        )
    }

    pub fn unit(&mut self, name: &str) -> Result<Option<Unit>, StoreError> {
        self.typed(EntityKind::Unit, name)
    }

    pub fn put_unit(&mut self, unit: &Unit) -> Result<Revision, StoreError> {
        self.put_document(EntityKind::Unit, &unit.name, &encode(unit))
    }

    pub fn relation(&mut self, key: &str) -> Result<Option<Relation>, StoreError> {
        self.typed(EntityKind::Relation, key)
    }

    pub fn put_relation(&mut self, relation: &Relation) -> Result<Revision, StoreError> {
        self.put_document(EntityKind::Relation, &relation.key, &encode(relation))
    }

    /// The staged rollout of machine agents (`lockstep_core::rollout`), if one was
    /// recorded: one record, of the newest target, kept as the settings document
    /// [`ROLLOUT_SETTINGS`] (no schema change; no client watches it, but its event moves
    /// the revision, which wakes agents' `NotifyWatcher`s to read their desired version).
    pub fn rollout(&mut self) -> Result<Option<Rollout>, StoreError> {
        self.typed(EntityKind::Settings, ROLLOUT_SETTINGS)
    }

    /// Writes the rollout record (replacing the one of an older target). The coordinator
    /// writes it in a transaction fenced on its lease.
    pub fn put_rollout(&mut self, rollout: &Rollout) -> Result<Revision, StoreError> {
        self.put_document(EntityKind::Settings, ROLLOUT_SETTINGS, &encode(rollout))
    }

    fn typed<T: serde::de::DeserializeOwned>(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.document(kind, id)? {
            None => Ok(None),
            Some(value) => {
                serde_json::from_value(value)
                    .map(Some)
                    .map_err(|error| StoreError::Decode {
                        what: format!("{kind} {id:?}"),
                        detail: error.to_string(),
                    })
            }
        }
    }
}

/// The shared store. See the crate documentation for the guarantees.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Runs `body` as one atomic transaction, fenced on `fence` when given (checked inside
    /// the transaction, before the body runs).
    fn transaction(
        &self,
        fence: Option<LeaseToken>,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<TxOutcome, StoreError>;

    /// Runs a read-only `body` on a consistent snapshot. Anything it writes is discarded.
    /// Readers do not block writers (SQLite WAL readers, etcd serialisable reads).
    fn snapshot(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;

    /// Takes the coordinator lease for `holder` if it is free or expired; extends it if
    /// `holder` holds it. `None`: another controller holds a live lease.
    fn acquire_lease(
        &self,
        holder: ControllerId,
        ttl: Millis,
    ) -> Result<Option<LeaseToken>, StoreError>;

    /// Extends the lease by its TTL if `token` is `holder`'s live lease; `None`: lost.
    fn keep_alive_lease(
        &self,
        holder: ControllerId,
        token: LeaseToken,
    ) -> Result<Option<LeaseToken>, StoreError>;

    /// Gives the lease up; `false` if `token` was not `holder`'s lease (nothing changes).
    fn release_lease(&self, holder: ControllerId, token: LeaseToken) -> Result<bool, StoreError>;

    /// The lease as stored (live or expired), for status and tests.
    fn lease(&self) -> Result<Option<Lease>, StoreError>;

    /// Events after `after`, in order, at most `limit`.
    fn changes_since(&self, after: Revision, limit: usize) -> Result<Changes, StoreError>;

    /// Drops events at or below `through` (clamped to the current revision).
    fn compact(&self, through: Revision) -> Result<(), StoreError>;

    /// Blocks until a commit above `after` is announced in this process, or `timeout`
    /// passed; `true` when woken by a commit. It may return `true` for a commit a reader
    /// already saw, and never hears writers in other processes: callers read again
    /// ([`Store::changes_since`]) either way. The default, for an engine without an
    /// in-process signal, sleeps `timeout` (polling).
    fn wait_for_change(&self, after: Revision, timeout: std::time::Duration) -> bool {
        let _ = after;
        std::thread::sleep(timeout);
        false
    }

    /// The store's current revision.
    fn revision(&self) -> Result<Revision, StoreError> {
        let mut revision = Revision(0);
        self.snapshot(&mut |tx| {
            revision = tx.revision()?;
            Ok(())
        })?;
        Ok(revision)
    }

    /// Runs a read-only body (it commits nothing: it is rolled back).
    fn read<T>(
        &self,
        mut body: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>
    where
        Self: Sized,
    {
        let mut answer = None;
        self.transaction(None, &mut |tx| {
            answer = Some(body(tx)?);
            Err(Abort::Unchanged)
        })?;
        Ok(answer.expect("a read body that returned Ok set the answer"))
    }

    /// `Request::WatchRecord`'s first delivery, and any re-read: the current record with its
    /// revision, the last archived one, and the store's revision.
    fn record_view(&self) -> Result<RecordView, StoreError> {
        let mut view = RecordView::default();
        self.snapshot(&mut |tx| {
            view = record_view_in(tx)?;
            Ok(())
        })?;
        Ok(view)
    }

    /// `Request::CreateRecord`: create the record if none is current; `Conflict` otherwise.
    fn create_record(&self, record: UpgradeInfo) -> Result<RecordWrite, StoreError> {
        if record.status != UpgradeStatus::Pending {
            return Err(StoreError::InvalidNewRecord {
                record: Box::new(record),
            });
        }
        let mut conflict = false;
        let mut view = RecordView::default();
        let outcome = self.transaction(None, &mut |tx| {
            conflict = tx.record()?.is_some();
            if !conflict {
                tx.put_record(&record)?;
            }
            // The view as of this write (or of the conflict), in the same transaction.
            view = record_view_in(tx)?;
            if conflict {
                return Err(Abort::Unchanged);
            }
            Ok(())
        })?;
        debug_assert!(matches!(
            outcome,
            TxOutcome::Committed(_) | TxOutcome::Unchanged
        ));
        Ok(if conflict {
            RecordWrite::Conflict(view)
        } else {
            RecordWrite::Written(view)
        })
    }

    /// `Request::UpdateRecord`: compare-and-set on the record's revision, fenced when asked.
    /// A final status archives the record. A transition `UpgradeInfo::may_become` refuses is
    /// an error (nothing is written), not a conflict: the caller's record is wrong.
    fn update_record(
        &self,
        expected: Revision,
        record: UpgradeInfo,
        fence: Option<LeaseToken>,
    ) -> Result<RecordWrite, StoreError> {
        let mut conflict = false;
        let mut invalid = None;
        let mut view = RecordView::default();
        let outcome = self.transaction(fence, &mut |tx| {
            conflict = false;
            invalid = None;
            match tx.record()? {
                Some((current, revision)) if revision == expected => {
                    if !current.may_become(&record) {
                        invalid = Some(current);
                        return Err(Abort::Unchanged);
                    }
                    if record.status.is_final() {
                        tx.archive_record(&record)?;
                    } else {
                        tx.put_record(&record)?;
                    }
                    view = record_view_in(tx)?;
                    Ok(())
                }
                _ => {
                    conflict = true;
                    view = record_view_in(tx)?;
                    Err(Abort::Unchanged)
                }
            }
        })?;
        if outcome == TxOutcome::Fenced {
            return Ok(RecordWrite::Fenced);
        }
        if let Some(current) = invalid {
            return Err(StoreError::InvalidTransition {
                from: Box::new(current),
                to: Box::new(record),
            });
        }
        Ok(if conflict {
            RecordWrite::Conflict(view)
        } else {
            RecordWrite::Written(view)
        })
    }

    /// `Request::RunStep` for a database step: `step`'s writes and the checkpoint of `key`
    /// commit in one transaction, fenced on `fence`. A checkpointed step is a no-op.
    fn run_database_step(
        &self,
        key: StepKey,
        fence: Option<LeaseToken>,
        step: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<StepOutcome, StoreError> {
        let outcome = self.transaction(fence, &mut |tx| {
            if tx.checkpoint(&key)?.is_some() {
                return Err(Abort::Unchanged);
            }
            step(tx)?;
            let completed_at = tx.now();
            tx.put_checkpoint(&Checkpoint { key, completed_at })?;
            Ok(())
        })?;
        Ok(match outcome {
            TxOutcome::Committed(_) => StepOutcome::Applied,
            TxOutcome::Unchanged => StepOutcome::AlreadyApplied,
            TxOutcome::Fenced => StepOutcome::Fenced,
            TxOutcome::Failed(reason) => StepOutcome::Failed(reason),
        })
    }

    /// A mutating client call with an `operation-id`: its writes and its recorded result
    /// commit together; a repeat returns the recorded result and applies nothing.
    fn apply_operation(
        &self,
        operation_id: &str,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<serde_json::Value, Abort>,
    ) -> Result<OperationOutcome, StoreError> {
        let mut recorded = None;
        let mut applied = None;
        let outcome = self.transaction(None, &mut |tx| {
            applied = None;
            recorded = tx.operation(operation_id)?;
            if recorded.is_some() {
                return Err(Abort::Unchanged);
            }
            let result = body(tx)?;
            tx.put_operation(operation_id, &result)?;
            applied = Some(result);
            Ok(())
        })?;
        Ok(match outcome {
            TxOutcome::Committed(_) => {
                OperationOutcome::Applied(applied.expect("a committed body recorded its result"))
            }
            TxOutcome::Unchanged => OperationOutcome::Replayed(
                recorded.expect("an unchanged operation was recorded before"),
            ),
            TxOutcome::Failed(reason) => OperationOutcome::Failed(reason),
            TxOutcome::Fenced => unreachable!("operations are not fenced"),
        })
    }

    /// Bootstrap: create the model if the store has none. `false`: it existed (unchanged).
    fn create_model(&self, model: &Model) -> Result<bool, StoreError> {
        let outcome = self.transaction(None, &mut |tx| {
            if tx.model()?.is_some() {
                return Err(Abort::Unchanged);
            }
            tx.put_model(model)?;
            Ok(())
        })?;
        Ok(matches!(outcome, TxOutcome::Committed(_)))
    }

    /// `Request::LoadModel`.
    fn load_model(&self) -> Result<Option<Model>, StoreError> {
        let mut model = None;
        self.snapshot(&mut |tx| {
            model = tx.model()?;
            Ok(())
        })?;
        Ok(model)
    }

    /// Changes the model in one transaction; `NoModel` before bootstrap.
    fn update_model(
        &self,
        change: &mut dyn FnMut(&mut dyn Tx, &mut Model) -> Result<(), StoreError>,
    ) -> Result<Model, StoreError> {
        let mut after = None;
        let outcome = self.transaction(None, &mut |tx| {
            let mut model = tx.model()?.ok_or(StoreError::NoModel)?;
            change(tx, &mut model)?;
            if tx.model()?.as_ref() == Some(&model) {
                after = Some(model);
                return Err(Abort::Unchanged);
            }
            tx.put_model(&model)?;
            after = Some(model);
            Ok(())
        })?;
        debug_assert!(matches!(
            outcome,
            TxOutcome::Committed(_) | TxOutcome::Unchanged
        ));
        Ok(after.expect("the model was read"))
    }

    /// `Request::SetAgentVersion` (with [`AgentVersionCheck::LIFECYCLE`]) and an operator's
    /// `ModelConfig.ModelSet` (with [`AgentVersionCheck::operator`]): sets the model's
    /// agent-version to `version` if `check` allows it. The check is the core's one rule,
    /// run inside this write transaction on the model and the upgrade-info record the
    /// transaction reads: decision and write are atomic (a record created, or the version
    /// changed, by another writer meanwhile is seen, or the transaction retried). A
    /// refusal writes nothing and carries what the transaction saw. `NoModel` before
    /// bootstrap.
    fn set_agent_version(
        &self,
        version: Version,
        check: &AgentVersionCheck<'_>,
    ) -> Result<AgentVersionSet, StoreError> {
        let mut answer = None;
        let outcome = self.transaction(None, &mut |tx| {
            answer = None;
            let mut model = tx.model()?.ok_or(StoreError::NoModel)?;
            let record = tx.record()?;
            // Read only when the operator asked for the agents check: what the agent of
            // each machine that is not dead last reported running, as the rollout reads it.
            let agents = if check.agents_current {
                agents_running(tx)?
            } else {
                Vec::new()
            };
            let agents: Vec<AgentRunning<'_>> = agents
                .iter()
                .map(|(tag, running)| AgentRunning {
                    tag,
                    running: *running,
                })
                .collect();
            let decision = check.check(
                model.agent_version,
                model.agent_stream,
                record.as_ref().map(|(record, _)| record),
                version,
                &agents,
            );
            match decision {
                Ok(AgentVersionChange::Unchanged) => {
                    answer = Some(AgentVersionSet::Set {
                        model,
                        change: AgentVersionChange::Unchanged,
                    });
                    Err(Abort::Unchanged)
                }
                Ok(change @ AgentVersionChange::Changed { .. }) => {
                    model.agent_version = version;
                    tx.put_model(&model)?;
                    answer = Some(AgentVersionSet::Set { model, change });
                    Ok(())
                }
                Err(refusal) => {
                    answer = Some(AgentVersionSet::Refused {
                        refusal,
                        agent_version: model.agent_version,
                        view: record_view_in(tx)?,
                    });
                    Err(Abort::Unchanged)
                }
            }
        })?;
        let answer = answer.expect("the body ran to a decision");
        // Postconditions: a change commits, anything else writes nothing; the model
        // answered holds the version exactly when it was set.
        match &answer {
            AgentVersionSet::Set { model, change } => {
                assert_eq!(model.agent_version, version);
                assert_eq!(
                    matches!(outcome, TxOutcome::Committed(_)),
                    matches!(change, AgentVersionChange::Changed { .. })
                );
            }
            AgentVersionSet::Refused { agent_version, .. } => {
                assert_ne!(
                    *agent_version, version,
                    "the current value is never refused"
                );
                assert_eq!(outcome, TxOutcome::Unchanged);
            }
        }
        Ok(answer)
    }

    /// `Request::ReportUpgradeAvailable`.
    fn report_upgrade_available(&self, version: Option<Version>) -> Result<Model, StoreError> {
        self.update_model(&mut |_, model| {
            model.upgrade_available = version;
            Ok(())
        })
    }

    /// `Request::RefreshCapabilities`: the provider's answer, discovered by `by`. One write
    /// to the model: every machine's reported jobs follow from it.
    fn set_capabilities(
        &self,
        capabilities: &Capabilities,
        by: Version,
    ) -> Result<Model, StoreError> {
        self.update_model(&mut |tx, model| {
            model.capabilities = capabilities.clone();
            model.capabilities_discovered = Some(Discovery { at: tx.now(), by });
            Ok(())
        })
    }

    /// Adds a machine unless one with its id exists. `false`: it existed (unchanged).
    fn add_machine(&self, machine: &Machine) -> Result<bool, StoreError> {
        let outcome = self.transaction(None, &mut |tx| {
            if tx.machine(&machine.id)?.is_some() {
                return Err(Abort::Unchanged);
            }
            tx.put_machine(machine)?;
            Ok(())
        })?;
        Ok(matches!(outcome, TxOutcome::Committed(_)))
    }

    /// Every machine with the jobs the API reports for it, from one consistent read of the
    /// machines and the model's capabilities.
    fn reported_jobs(&self, table: &JobTable) -> Result<Vec<(String, Jobs)>, StoreError> {
        let mut reported = Vec::new();
        self.snapshot(&mut |tx| {
            reported.clear();
            let model = tx.model()?.ok_or(StoreError::NoModel)?;
            for machine in tx.machines()? {
                let jobs = machine
                    .reported_jobs(table, &model.capabilities)
                    .map_err(|error| StoreError::Decode {
                        what: format!("machine {:?}", machine.id),
                        detail: error.to_string(),
                    })?;
                reported.push((machine.id, jobs));
            }
            Ok(())
        })?;
        Ok(reported)
    }
}

/// Every machine agent that is not dead, controllers included, by tag (`machine-<id>`),
/// with the version it last reported running: its last status's, else the binary it set
/// with `Upgrader.SetTools` (how the rollout reads it too). For the agents check an operator
/// may ask of an `agent-version` change ([`AgentVersionCheck::agents_current`]).
fn agents_running(tx: &mut dyn Tx) -> Result<Vec<(String, Option<Version>)>, StoreError> {
    let statuses: std::collections::HashMap<String, AgentStatus> =
        tx.agent_statuses()?.into_iter().collect();
    Ok(tx
        .machines()?
        .into_iter()
        .filter(|machine| machine.life != Life::Dead)
        .map(|machine| {
            let tag = machine_tag(&machine.id);
            let running = statuses
                .get(&tag)
                .and_then(|status| status.version.as_ref())
                .or(machine.agent_binary.as_ref())
                .map(|binary| binary.number);
            (tag, running)
        })
        .collect())
}

/// The upgrade-info record as `tx` sees it.
fn record_view_in(tx: &mut dyn Tx) -> Result<RecordView, StoreError> {
    Ok(RecordView {
        current: tx.record()?,
        last_archived: tx.last_archived()?,
        revision: tx.revision()?,
    })
}

/// Maps a transaction's outcome for the read helpers: `Unchanged` is how a read ends.
pub(crate) fn finish_body(result: Result<(), Abort>) -> Result<TxOutcome, StoreError> {
    match result {
        Ok(()) => unreachable!("committed bodies are finished by the engine"),
        Err(Abort::Unchanged) => Ok(TxOutcome::Unchanged),
        Err(Abort::Failed(reason)) => Ok(TxOutcome::Failed(reason)),
        Err(Abort::Store(error)) => Err(error),
    }
}
