//! The embedded default engine: SQLite (bundled), WAL, `synchronous=FULL`.
//!
//! Opening checks the file before writing anything: it must be a database (not garbage,
//! `quick_check` ok), a lockstep store (a `schema_version` table, or empty), and not newer
//! than this binary (`quick_check` reads the whole file once per open). Only then are the pragmas set and older schemas migrated, each
//! migration in one transaction with the version it reaches.
//!
//! Writes take the database's write lock at `BEGIN IMMEDIATE`, so SQLite's single writer
//! orders commits, and revisions (a counter in `meta`) follow commit order: `WHERE rev > ?
//! ORDER BY rev` never skips. Two `SqliteStore`s on one file (two processes, or two
//! handles in one) share the store as controllers would. Handles on one file in one process
//! share a [`Notifier`]: a commit through any of them wakes the watchers of all of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lockstep_core::Timestamp;
use lockstep_core::lifecycle::{ControllerId, LeaseToken, Revision, UpgradeInfo};
use lockstep_core::steps::StepKey;
use lockstep_core::{Millis, Version};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, params};

use crate::error::{decode, encode};
use crate::lease::{self, Clock, Lease, SystemClock};
use crate::postcondition::{self, CommitOrder};
use crate::watch::Notifier;
use crate::{
    Abort, AgentStatus, ChangeKind, Changes, Checkpoint, Discovery, EntityKind, Event, Life,
    Machine, Model, Store, StoreError, Tx, TxOutcome, finish_body, machine_tag,
};

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = 5;

/// The upgrade-info record's id in the event log.
pub(crate) const RECORD_CURRENT: &str = "current";

/// `MIGRATIONS[v]` takes a store from schema `v` to `v + 1`.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    // 0 → 1: the first lockstep schema. Machines carry Juju's jobs; no capabilities.
    "CREATE TABLE schema_version (version INTEGER NOT NULL);
     INSERT INTO schema_version (version) VALUES (0);
     CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
     INSERT INTO meta (key, value) VALUES ('revision', 0), ('compacted', 0), ('next_token', 1);
     CREATE TABLE model (
         id INTEGER PRIMARY KEY CHECK (id = 0),
         uuid TEXT NOT NULL,
         name TEXT NOT NULL,
         agent_version TEXT NOT NULL,
         agent_stream TEXT,
         agent_metadata_url TEXT,
         policy TEXT NOT NULL,
         controllers TEXT NOT NULL,
         upgrade_available TEXT
     );
     CREATE TABLE machines (
         id TEXT PRIMARY KEY,
         jobs TEXT NOT NULL,
         agent_binary TEXT,
         life TEXT NOT NULL CHECK (life IN ('alive', 'dying', 'dead'))
     );
     CREATE TABLE applications (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
     CREATE TABLE units (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
     CREATE TABLE relations (key TEXT PRIMARY KEY, doc TEXT NOT NULL);
     CREATE TABLE upgrade_info (
         id INTEGER PRIMARY KEY CHECK (id = 0),
         record TEXT NOT NULL,
         revision INTEGER NOT NULL
     );
     CREATE TABLE upgrade_info_archive (
         seq INTEGER PRIMARY KEY AUTOINCREMENT,
         record TEXT NOT NULL,
         revision INTEGER NOT NULL
     );
     CREATE TABLE step_checkpoints (
         step_id TEXT NOT NULL,
         target_version TEXT NOT NULL,
         completed_at INTEGER NOT NULL,
         PRIMARY KEY (step_id, target_version)
     );
     CREATE TABLE operations (id TEXT PRIMARY KEY, result TEXT NOT NULL);
     CREATE TABLE events (
         rev INTEGER PRIMARY KEY,
         kind TEXT NOT NULL,
         entity_id TEXT NOT NULL,
         change TEXT NOT NULL CHECK (change IN ('change', 'remove')),
         entity TEXT NOT NULL
     );
     CREATE TABLE lease (
         id INTEGER PRIMARY KEY CHECK (id = 0),
         holder INTEGER NOT NULL,
         token INTEGER NOT NULL,
         ttl_ms INTEGER NOT NULL,
         expires_at_ms INTEGER NOT NULL
     );",
    // 1 → 2: seed 004. Machines get roles (empty: a legacy machine until the
    // `machine-jobs-to-roles` step migrates it); the model gets capabilities.
    "ALTER TABLE machines ADD COLUMN roles TEXT NOT NULL DEFAULT '[]';
     ALTER TABLE model ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]';
     ALTER TABLE model ADD COLUMN capabilities_discovered_at INTEGER;
     ALTER TABLE model ADD COLUMN capabilities_discovered_by TEXT;",
    // 2 → 3: the API's Juju facades. Settings documents (model config keys beyond the
    // model's own fields) and charms recorded from uploads (metadata only).
    "CREATE TABLE settings (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
     CREATE TABLE charms (url TEXT PRIMARY KEY, doc TEXT NOT NULL);",
    // 3 → 4: machine agents. Their credentials (argon2 PHC strings) and their last reported
    // status, by tag; neither logs events (a secret, and a heartbeat).
    "CREATE TABLE agent_passwords (tag TEXT PRIMARY KEY, hash TEXT NOT NULL);
     CREATE TABLE agent_status (
         tag TEXT PRIMARY KEY,
         status TEXT NOT NULL,
         info TEXT NOT NULL,
         phase TEXT NOT NULL,
         version TEXT,
         updated INTEGER NOT NULL
     );",
    // 4 → 5: the rate of an agent's last binary download, as it reports it (the staged
    // rollout admits slow links early); NULL when it did not say.
    "ALTER TABLE agent_status ADD COLUMN download_rate INTEGER;",
];

/// How to open a store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OpenMode {
    /// Create the file if missing, migrate an older schema.
    ReadWrite,
    /// `SQLITE_OPEN_READ_ONLY`: reads only; every write is refused with
    /// [`StoreError::ReadOnly`]. The schema must be current.
    ReadOnly,
}

/// The SQLite store. One connection per value; open the file again for another handle.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    mode: OpenMode,
    conn: Mutex<Connection>,
    clock: Arc<dyn Clock>,
    /// Shared by every handle on this file in this process: wakes their watchers after each
    /// commit made through any of them.
    notifier: Arc<Notifier>,
    /// The revisions this handle committed, checked under its connection's lock.
    order: CommitOrder,
}

/// One [`Notifier`] per database file in this process.
static NOTIFIERS: Mutex<BTreeMap<PathBuf, Weak<Notifier>>> = Mutex::new(BTreeMap::new());

fn notifier_for(path: &Path) -> Arc<Notifier> {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut notifiers = NOTIFIERS.lock().unwrap_or_else(|p| p.into_inner());
    notifiers.retain(|_, notifier| notifier.strong_count() > 0);
    if let Some(notifier) = notifiers.get(&key).and_then(Weak::upgrade) {
        return notifier;
    }
    let notifier = Arc::new(Notifier::new());
    notifiers.insert(key, Arc::downgrade(&notifier));
    notifier
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` on the system clock.
    pub fn open(path: impl AsRef<Path>, mode: OpenMode) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_clock(path, mode, Arc::new(SystemClock))
    }

    /// Opens the store at `path`, reading lease expiry from `clock`.
    pub fn open_with_clock(
        path: impl AsRef<Path>,
        mode: OpenMode,
        clock: Arc<dyn Clock>,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let flags = match mode {
            OpenMode::ReadWrite => {
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
            }
            OpenMode::ReadOnly => {
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
            }
        };
        let conn =
            Connection::open_with_flags(&path, flags).map_err(|error| map_error(&path, error))?;
        let notifier = notifier_for(&path);
        let store = SqliteStore {
            path,
            mode,
            conn: Mutex::new(conn),
            clock,
            notifier,
            order: CommitOrder::default(),
        };
        store.prepare()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // rusqlite rolls back a transaction dropped during a panic: the connection stays
        // usable.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn error(&self, error: rusqlite::Error) -> StoreError {
        map_error(&self.path, error)
    }

    /// Checks, then configures and migrates. Nothing is written before the checks pass.
    fn prepare(&self) -> Result<(), StoreError> {
        let conn = self.lock();
        conn.busy_timeout(std::time::Duration::from_millis(5000))
            .map_err(|error| self.error(error))?;
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(|error| self.error(error))?;
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |row| row.get(0))
            .map_err(|error| self.error(error))?;
        if check != "ok" {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("quick_check: {check}"),
            });
        }
        let found = schema_version(&conn, &tables).map_err(|error| match error {
            Found::NotAStore(detail) => StoreError::NotAStore {
                path: self.path.clone(),
                detail,
            },
            Found::Engine(error) => self.error(error),
        })?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if self.mode == OpenMode::ReadOnly {
            if found == 0 {
                return Err(StoreError::NotAStore {
                    path: self.path.clone(),
                    detail: "it is empty".to_owned(),
                });
            }
            if found < SCHEMA_VERSION {
                return Err(StoreError::MigrationNeeded {
                    path: self.path.clone(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            return Ok(());
        }
        let journal: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
            .map_err(|error| self.error(error))?;
        if !journal.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Engine {
                path: self.path.clone(),
                detail: format!("cannot switch to WAL (journal mode is {journal})"),
            });
        }
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
            .map_err(|error| self.error(error))?;
        drop(conn);
        self.migrate()
    }

    /// Brings an older schema up to [`SCHEMA_VERSION`], each step in one transaction.
    fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.lock();
        loop {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|error| self.error(error))?;
            let tables: Vec<String> = tx
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
                .and_then(|mut statement| {
                    statement
                        .query_map([], |row| row.get(0))?
                        .collect::<Result<_, _>>()
                })
                .map_err(|error| self.error(error))?;
            // Re-read under the write lock: another process may have migrated meanwhile.
            let found = schema_version(&tx, &tables).map_err(|error| match error {
                Found::NotAStore(detail) => StoreError::NotAStore {
                    path: self.path.clone(),
                    detail,
                },
                Found::Engine(error) => self.error(error),
            })?;
            if found > SCHEMA_VERSION {
                return Err(StoreError::SchemaTooNew {
                    path: self.path.clone(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            if found == SCHEMA_VERSION {
                return Ok(());
            }
            tx.execute_batch(MIGRATIONS[found as usize])
                .map_err(|error| self.error(error))?;
            tx.execute("UPDATE schema_version SET version = ?1", [found + 1])
                .map_err(|error| self.error(error))?;
            tx.commit().map_err(|error| self.error(error))?;
        }
    }

    /// Runs `f` in an immediate (write) transaction and commits it.
    fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(self.behavior())
            .map_err(|error| self.error(error))?;
        let answer = f(&tx).map_err(|error| self.error(error))?;
        tx.commit().map_err(|error| self.error(error))?;
        Ok(answer)
    }

    fn behavior(&self) -> rusqlite::TransactionBehavior {
        match self.mode {
            OpenMode::ReadWrite => rusqlite::TransactionBehavior::Immediate,
            OpenMode::ReadOnly => rusqlite::TransactionBehavior::Deferred,
        }
    }

    #[cfg(test)]
    pub(crate) fn connection(&self) -> MutexGuard<'_, Connection> {
        self.lock()
    }
}

enum Found {
    NotAStore(String),
    Engine(rusqlite::Error),
}

/// The schema version of a database whose tables are `tables`: 0 when it has none.
fn schema_version(conn: &Connection, tables: &[String]) -> Result<u32, Found> {
    if tables.iter().any(|table| table == "schema_version") {
        let version: i64 = conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .map_err(|error| match error {
                rusqlite::Error::QueryReturnedNoRows => {
                    Found::NotAStore("its schema_version table is empty".to_owned())
                }
                other => Found::Engine(other),
            })?;
        return u32::try_from(version)
            .map_err(|_| Found::NotAStore(format!("schema_version is {version}")));
    }
    let user: Vec<&String> = tables
        .iter()
        .filter(|table| !table.starts_with("sqlite_"))
        .collect();
    if user.is_empty() {
        Ok(0)
    } else {
        Err(Found::NotAStore(format!(
            "it has tables {user:?} but no schema_version"
        )))
    }
}

fn map_error(path: &Path, error: rusqlite::Error) -> StoreError {
    let path = path.to_path_buf();
    match error.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StoreError::Full { path },
        Some(ErrorCode::ReadOnly) => StoreError::ReadOnly { path },
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path,
            detail: error.to_string(),
        },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy { path },
        _ => StoreError::Engine {
            path,
            detail: error.to_string(),
        },
    }
}

/// The table of a document kind.
pub(crate) fn document_table(kind: EntityKind) -> Result<(&'static str, &'static str), StoreError> {
    match kind {
        EntityKind::Application => Ok(("applications", "name")),
        EntityKind::Unit => Ok(("units", "name")),
        EntityKind::Relation => Ok(("relations", "key")),
        EntityKind::Settings => Ok(("settings", "id")),
        EntityKind::Charm => Ok(("charms", "url")),
        _ => Err(StoreError::NotADocument { kind }),
    }
}

fn read_lease(tx: &Connection) -> rusqlite::Result<Option<Lease>> {
    tx.query_row(
        "SELECT holder, token, ttl_ms, expires_at_ms FROM lease WHERE id = 0",
        [],
        |row| {
            Ok(Lease {
                holder: ControllerId(row.get(0)?),
                token: LeaseToken(row.get::<_, i64>(1)? as u64),
                ttl: Millis(row.get::<_, i64>(2)? as u64),
                expires_at: Timestamp(row.get::<_, i64>(3)? as u64),
            })
        },
    )
    .optional()
}

fn write_lease(tx: &Connection, lease: Option<Lease>) -> rusqlite::Result<()> {
    match lease {
        None => tx.execute("DELETE FROM lease", []).map(drop),
        Some(lease) => tx
            .execute(
                "INSERT OR REPLACE INTO lease (id, holder, token, ttl_ms, expires_at_ms)
                 VALUES (0, ?1, ?2, ?3, ?4)",
                params![
                    lease.holder.0,
                    lease.token.0 as i64,
                    lease.ttl.0 as i64,
                    lease.expires_at.0 as i64
                ],
            )
            .map(drop),
    }
}

fn meta(tx: &Connection, key: &str) -> rusqlite::Result<u64> {
    tx.query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
        row.get::<_, i64>(0)
    })
    .map(|value| value as u64)
}

impl Store for SqliteStore {
    fn transaction(
        &self,
        fence: Option<LeaseToken>,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<TxOutcome, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(self.behavior())
            .map_err(|error| self.error(error))?;
        let now = self.clock.now();
        let current = read_lease(&tx).map_err(|error| self.error(error))?;
        if !lease::fence_holds(current, fence, now) {
            return Ok(TxOutcome::Fenced);
        }
        let base = meta(&tx, "revision").map_err(|error| self.error(error))?;
        let mut sqlite_tx = SqliteTx {
            tx: &tx,
            path: &self.path,
            now,
            failed: None,
            logged: 0,
        };
        let result = body(&mut sqlite_tx);
        let logged = sqlite_tx.logged;
        // A statement that failed inside a body that went on anyway must not commit.
        if let Some(error) = sqlite_tx.failed.take() {
            return Err(error);
        }
        if result.is_err() {
            return finish_body(result);
        }
        // The body may have outlived the lease: check the fence again at the commit point
        // (still under the write lock, so no other writer can take the lease meanwhile).
        let current = read_lease(&tx).map_err(|error| self.error(error))?;
        if !lease::fence_holds(current, fence, self.clock.now()) {
            return Ok(TxOutcome::Fenced);
        }
        let revision = meta(&tx, "revision").map_err(|error| self.error(error))?;
        postcondition::assert_commit("sqlite", Revision(base), logged, Revision(revision));
        tx.commit().map_err(|error| self.error(error))?;
        if logged > 0 {
            // Still under this handle's connection lock, after the commit succeeded.
            self.order.assert_after_last("sqlite", Revision(revision));
        }
        drop(conn);
        self.notifier.announce(Revision(revision));
        Ok(TxOutcome::Committed(Revision(revision)))
    }

    fn snapshot(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        // Deferred: a WAL reader sees one snapshot and never blocks writers. Dropped
        // without commit, so anything the body wrote is rolled back.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)
            .map_err(|error| self.error(error))?;
        let mut sqlite_tx = SqliteTx {
            tx: &tx,
            path: &self.path,
            now: self.clock.now(),
            failed: None,
            logged: 0,
        };
        body(&mut sqlite_tx)
    }

    fn acquire_lease(
        &self,
        holder: ControllerId,
        ttl: Millis,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let now = self.clock.now();
        self.write(|tx| {
            let next = meta(tx, "next_token")?;
            let (lease, answer) = lease::acquire(read_lease(tx)?, holder, ttl, now, next);
            if answer == Some(LeaseToken(next)) {
                tx.execute(
                    "UPDATE meta SET value = value + 1 WHERE key = 'next_token'",
                    [],
                )?;
            }
            write_lease(tx, lease)?;
            Ok(answer)
        })
    }

    fn keep_alive_lease(
        &self,
        holder: ControllerId,
        token: LeaseToken,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let now = self.clock.now();
        self.write(|tx| {
            let (lease, answer) = lease::keep_alive(read_lease(tx)?, holder, token, now);
            if answer.is_some() {
                write_lease(tx, lease)?;
            }
            Ok(answer)
        })
    }

    fn release_lease(&self, holder: ControllerId, token: LeaseToken) -> Result<bool, StoreError> {
        self.write(|tx| {
            let (lease, released) = lease::release(read_lease(tx)?, holder, token);
            if released {
                write_lease(tx, lease)?;
            }
            Ok(released)
        })
    }

    fn lease(&self) -> Result<Option<Lease>, StoreError> {
        read_lease(&self.lock()).map_err(|error| self.error(error))
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Changes, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)
            .map_err(|error| self.error(error))?;
        let (current, compacted) = (|| Ok((meta(&tx, "revision")?, meta(&tx, "compacted")?)))()
            .map_err(|error| self.error(error))?;
        if after.0 < compacted || after.0 > current {
            return Ok(Changes::ResyncNeeded {
                compacted: Revision(compacted),
                current: Revision(current),
            });
        }
        let rows: Vec<(i64, String, String, String, String)> = tx
            .prepare(
                "SELECT rev, kind, entity_id, change, entity FROM events
                 WHERE rev > ?1 ORDER BY rev LIMIT ?2",
            )
            .and_then(|mut statement| {
                statement
                    .query_map(
                        params![after.0 as i64, i64::try_from(limit).unwrap_or(i64::MAX)],
                        |row| {
                            Ok((
                                row.get(0)?,
                                row.get(1)?,
                                row.get(2)?,
                                row.get(3)?,
                                row.get(4)?,
                            ))
                        },
                    )?
                    .collect::<Result<_, _>>()
            })
            .map_err(|error| self.error(error))?;
        let mut events = Vec::with_capacity(rows.len());
        for (revision, kind, id, change, entity) in rows {
            let bad = |what: &str, text: &str| StoreError::Decode {
                what: format!("event {revision}"),
                detail: format!("unknown {what} {text:?}"),
            };
            events.push(Event {
                revision: Revision(revision as u64),
                kind: EntityKind::parse(&kind).ok_or_else(|| bad("kind", &kind))?,
                change: ChangeKind::parse(&change).ok_or_else(|| bad("change", &change))?,
                entity: decode(&format!("event {revision}"), &entity)?,
                id,
            });
        }
        Ok(Changes::Events {
            events,
            current: Revision(current),
        })
    }

    fn compact(&self, through: Revision) -> Result<(), StoreError> {
        self.write(|tx| {
            let through = through.0.min(meta(tx, "revision")?);
            if through > meta(tx, "compacted")? {
                tx.execute("DELETE FROM events WHERE rev <= ?1", [through as i64])?;
                tx.execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'compacted'",
                    [through as i64],
                )?;
            }
            Ok(())
        })
    }

    fn wait_for_change(&self, after: Revision, timeout: std::time::Duration) -> bool {
        self.notifier.wait_above(after, timeout)
    }
}

struct SqliteTx<'a> {
    tx: &'a Transaction<'a>,
    path: &'a Path,
    now: Timestamp,
    /// The first engine error: once set, the transaction rolls back whatever the body says.
    failed: Option<StoreError>,
    /// Events logged by this transaction (each took the next revision).
    logged: u64,
}

impl SqliteTx<'_> {
    fn check<T>(&mut self, result: rusqlite::Result<T>) -> Result<T, StoreError> {
        result.map_err(|error| {
            let error = map_error(self.path, error);
            self.failed.get_or_insert_with(|| error.clone());
            error
        })
    }

    fn log(
        &mut self,
        kind: EntityKind,
        id: &str,
        change: ChangeKind,
        entity: &serde_json::Value,
    ) -> Result<Revision, StoreError> {
        let tx = self.tx;
        let result = (|| {
            let revision: i64 = tx.query_row(
                "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value",
                [],
                |row| row.get(0),
            )?;
            tx.execute(
                "INSERT INTO events (rev, kind, entity_id, change, entity)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    revision,
                    kind.as_str(),
                    id,
                    change.as_str(),
                    entity.to_string()
                ],
            )?;
            Ok(Revision(revision as u64))
        })();
        if result.is_ok() {
            self.logged += 1;
        }
        self.check(result)
    }

    /// Deletes the agent's credential and status (no event).
    fn remove_agent(&mut self, tag: &str) -> Result<(), StoreError> {
        let result = self
            .tx
            .execute("DELETE FROM agent_passwords WHERE tag = ?1", [tag])
            .and_then(|_| {
                self.tx
                    .execute("DELETE FROM agent_status WHERE tag = ?1", [tag])
            });
        self.check(result).map(drop)
    }

    fn text_column<T: serde::de::DeserializeOwned>(
        what: &str,
        text: Option<String>,
    ) -> Result<Option<T>, StoreError> {
        text.map(|text| decode_text(what, text)).transpose()
    }
}

/// Decodes a value stored as plain text (a version, a binary, a stream).
fn decode_text<T: serde::de::DeserializeOwned>(what: &str, text: String) -> Result<T, StoreError> {
    serde_json::from_value(serde_json::Value::String(text.clone())).map_err(|error| {
        StoreError::Decode {
            what: what.to_owned(),
            detail: format!("{error} in {text:?}"),
        }
    })
}

type MachineRow = (String, String, String, Option<String>, String);

type AgentStatusRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<i64>,
    i64,
);

const AGENT_STATUS_COLUMNS: &str = "tag, status, info, phase, version, download_rate, updated";

fn agent_status_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<AgentStatusRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

fn agent_status_from_row(row: AgentStatusRow) -> Result<(String, AgentStatus), StoreError> {
    let (tag, status, info, phase, version, download_rate, updated) = row;
    let version = SqliteTx::text_column(&format!("agent status {tag:?}"), version)?;
    Ok((
        tag,
        AgentStatus {
            status,
            info,
            phase,
            version,
            // Written from a u64 as i64's bit pattern; read back the same way.
            download_rate: download_rate.map(|rate| rate as u64),
            updated: Timestamp(updated as u64),
        },
    ))
}

fn machine_from_row(row: MachineRow) -> Result<Machine, StoreError> {
    let (id, roles, jobs, agent_binary, life) = row;
    let what = format!("machine {id:?}");
    Ok(Machine {
        roles: decode(&what, &roles)?,
        legacy_jobs: decode(&what, &jobs)?,
        agent_binary: SqliteTx::text_column(&what, agent_binary)?,
        life: Life::parse(&life).ok_or_else(|| StoreError::Decode {
            what: what.clone(),
            detail: format!("unknown life {life:?}"),
        })?,
        id,
    })
}

impl Tx for SqliteTx<'_> {
    fn now(&self) -> Timestamp {
        self.now
    }

    fn revision(&mut self) -> Result<Revision, StoreError> {
        let result = meta(self.tx, "revision");
        self.check(result).map(Revision)
    }

    fn model(&mut self) -> Result<Option<Model>, StoreError> {
        type Row = (
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            String,
            String,
            Option<String>,
            String,
            Option<i64>,
            Option<String>,
        );
        let result = self
            .tx
            .query_row(
                "SELECT uuid, name, agent_version, agent_stream, agent_metadata_url, policy,
                        controllers, upgrade_available, capabilities,
                        capabilities_discovered_at, capabilities_discovered_by
                 FROM model WHERE id = 0",
                [],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                        row.get(6)?,
                        row.get(7)?,
                        row.get(8)?,
                        row.get(9)?,
                        row.get(10)?,
                    ))
                },
            )
            .optional();
        let Some(row): Option<Row> = self.check(result)? else {
            return Ok(None);
        };
        let (uuid, name, version, stream, url, policy, controllers, available, caps, at, by) = row;
        let what = "model";
        let discovered = match (at, SqliteTx::text_column::<Version>(what, by)?) {
            (Some(at), Some(by)) => Some(Discovery {
                at: Timestamp(at as u64),
                by,
            }),
            _ => None,
        };
        Ok(Some(Model {
            uuid,
            name,
            agent_version: decode_text(what, version)?,
            agent_stream: SqliteTx::text_column(what, stream)?,
            agent_metadata_url: url,
            policy: decode(what, &policy)?,
            controllers: decode(what, &controllers)?,
            capabilities: decode(what, &caps)?,
            capabilities_discovered: discovered,
            upgrade_available: SqliteTx::text_column(what, available)?,
        }))
    }

    fn put_model(&mut self, model: &Model) -> Result<Revision, StoreError> {
        let result = self.tx.execute(
            "INSERT OR REPLACE INTO model (id, uuid, name, agent_version, agent_stream,
                 agent_metadata_url, policy, controllers, upgrade_available, capabilities,
                 capabilities_discovered_at, capabilities_discovered_by)
             VALUES (0, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                model.uuid,
                model.name,
                model.agent_version.to_string(),
                model.agent_stream.map(|stream| stream.as_str()),
                model.agent_metadata_url,
                encode(&model.policy).to_string(),
                encode(&model.controllers).to_string(),
                model.upgrade_available.map(|version| version.to_string()),
                encode(&model.capabilities).to_string(),
                model.capabilities_discovered.map(|found| found.at.0 as i64),
                model
                    .capabilities_discovered
                    .map(|found| found.by.to_string()),
            ],
        );
        self.check(result)?;
        self.log(
            EntityKind::Model,
            &model.uuid,
            ChangeKind::Change,
            &encode(model),
        )
    }

    fn machine(&mut self, id: &str) -> Result<Option<Machine>, StoreError> {
        let result = self
            .tx
            .query_row(
                "SELECT id, roles, jobs, agent_binary, life FROM machines WHERE id = ?1",
                [id],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
            )
            .optional();
        self.check(result)?.map(machine_from_row).transpose()
    }

    fn machines(&mut self) -> Result<Vec<Machine>, StoreError> {
        let result = self
            .tx
            .prepare("SELECT id, roles, jobs, agent_binary, life FROM machines ORDER BY id")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                        ))
                    })?
                    .collect::<Result<Vec<MachineRow>, _>>()
            });
        self.check(result)?
            .into_iter()
            .map(machine_from_row)
            .collect()
    }

    fn put_machine(&mut self, machine: &Machine) -> Result<Revision, StoreError> {
        let result = self.tx.execute(
            "INSERT OR REPLACE INTO machines (id, roles, jobs, agent_binary, life)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                machine.id,
                encode(&machine.roles).to_string(),
                encode(&machine.legacy_jobs).to_string(),
                machine.agent_binary.as_ref().map(ToString::to_string),
                machine.life.as_str(),
            ],
        );
        self.check(result)?;
        self.log(
            EntityKind::Machine,
            &machine.id,
            ChangeKind::Change,
            &encode(machine),
        )
    }

    fn remove_machine(&mut self, id: &str) -> Result<Option<Revision>, StoreError> {
        let Some(machine) = self.machine(id)? else {
            self.remove_agent(&machine_tag(id))?;
            return Ok(None);
        };
        let result = self.tx.execute("DELETE FROM machines WHERE id = ?1", [id]);
        self.check(result)?;
        self.remove_agent(&machine_tag(id))?;
        self.log(
            EntityKind::Machine,
            id,
            ChangeKind::Remove,
            &encode(&machine),
        )
        .map(Some)
    }

    fn document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let (table, key) = document_table(kind)?;
        let result = self
            .tx
            .query_row(
                &format!("SELECT doc FROM {table} WHERE {key} = ?1"),
                [id],
                |row| row.get::<_, String>(0),
            )
            .optional();
        self.check(result)?
            .map(|text| decode(&format!("{kind} {id:?}"), &text))
            .transpose()
    }

    fn documents(
        &mut self,
        kind: EntityKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let (table, key) = document_table(kind)?;
        let rows = self
            .tx
            .prepare(&format!("SELECT {key}, doc FROM {table} ORDER BY {key}"))
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            });
        self.check(rows)?
            .into_iter()
            .map(|(id, text)| Ok((id.clone(), decode(&format!("{kind} {id:?}"), &text)?)))
            .collect()
    }

    fn put_document(
        &mut self,
        kind: EntityKind,
        id: &str,
        document: &serde_json::Value,
    ) -> Result<Revision, StoreError> {
        let (table, key) = document_table(kind)?;
        let result = self.tx.execute(
            &format!("INSERT OR REPLACE INTO {table} ({key}, doc) VALUES (?1, ?2)"),
            params![id, document.to_string()],
        );
        self.check(result)?;
        self.log(kind, id, ChangeKind::Change, document)
    }

    fn remove_document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<Revision>, StoreError> {
        let (table, key) = document_table(kind)?;
        let Some(document) = self.document(kind, id)? else {
            return Ok(None);
        };
        let result = self
            .tx
            .execute(&format!("DELETE FROM {table} WHERE {key} = ?1"), [id]);
        self.check(result)?;
        self.log(kind, id, ChangeKind::Remove, &document).map(Some)
    }

    fn checkpoint(&mut self, key: &StepKey) -> Result<Option<Checkpoint>, StoreError> {
        let result = self
            .tx
            .query_row(
                "SELECT completed_at FROM step_checkpoints
                 WHERE step_id = ?1 AND target_version = ?2",
                params![key.id.as_str(), key.target_version.to_string()],
                |row| row.get::<_, i64>(0),
            )
            .optional();
        Ok(self.check(result)?.map(|at| Checkpoint {
            key: *key,
            completed_at: Timestamp(at as u64),
        }))
    }

    fn put_checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<Revision, StoreError> {
        let result = self.tx.execute(
            "INSERT OR REPLACE INTO step_checkpoints (step_id, target_version, completed_at)
             VALUES (?1, ?2, ?3)",
            params![
                checkpoint.key.id.as_str(),
                checkpoint.key.target_version.to_string(),
                checkpoint.completed_at.0 as i64
            ],
        );
        self.check(result)?;
        self.log(
            EntityKind::Step,
            &checkpoint.key.to_string(),
            ChangeKind::Change,
            &encode(checkpoint),
        )
    }

    fn operation(&mut self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let result = self
            .tx
            .query_row("SELECT result FROM operations WHERE id = ?1", [id], |row| {
                row.get::<_, String>(0)
            })
            .optional();
        self.check(result)?
            .map(|text| decode(&format!("operation {id:?}"), &text))
            .transpose()
    }

    fn put_operation(&mut self, id: &str, result: &serde_json::Value) -> Result<(), StoreError> {
        let outcome = self.tx.execute(
            "INSERT INTO operations (id, result) VALUES (?1, ?2)",
            params![id, result.to_string()],
        );
        self.check(outcome).map(drop)
    }

    fn agent_password_hash(&mut self, tag: &str) -> Result<Option<String>, StoreError> {
        let result = self
            .tx
            .query_row(
                "SELECT hash FROM agent_passwords WHERE tag = ?1",
                [tag],
                |row| row.get::<_, String>(0),
            )
            .optional();
        self.check(result)
    }

    fn set_agent_password_hash(&mut self, tag: &str, phc: &str) -> Result<(), StoreError> {
        let result = self.tx.execute(
            "INSERT OR REPLACE INTO agent_passwords (tag, hash) VALUES (?1, ?2)",
            params![tag, phc],
        );
        self.check(result).map(drop)
    }

    fn agent_status(&mut self, tag: &str) -> Result<Option<AgentStatus>, StoreError> {
        let result = self
            .tx
            .query_row(
                &format!("SELECT {AGENT_STATUS_COLUMNS} FROM agent_status WHERE tag = ?1"),
                [tag],
                agent_status_row,
            )
            .optional();
        Ok(self
            .check(result)?
            .map(agent_status_from_row)
            .transpose()?
            .map(|(_, status)| status))
    }

    fn agent_statuses(&mut self) -> Result<Vec<(String, AgentStatus)>, StoreError> {
        let result = self
            .tx
            .prepare(&format!(
                "SELECT {AGENT_STATUS_COLUMNS} FROM agent_status ORDER BY tag"
            ))
            .and_then(|mut statement| {
                statement
                    .query_map([], agent_status_row)?
                    .collect::<Result<Vec<_>, _>>()
            });
        self.check(result)?
            .into_iter()
            .map(agent_status_from_row)
            .collect()
    }

    fn put_agent_status(&mut self, tag: &str, status: &AgentStatus) -> Result<(), StoreError> {
        let result = self.tx.execute(
            &format!(
                "INSERT OR REPLACE INTO agent_status ({AGENT_STATUS_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
            ),
            params![
                tag,
                status.status,
                status.info,
                status.phase,
                status.version.as_ref().map(ToString::to_string),
                status.download_rate.map(|rate| rate as i64),
                status.updated.0 as i64,
            ],
        );
        self.check(result).map(drop)
    }

    fn record(&mut self) -> Result<Option<(UpgradeInfo, Revision)>, StoreError> {
        let result = self
            .tx
            .query_row(
                "SELECT record, revision FROM upgrade_info WHERE id = 0",
                [],
                |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
            )
            .optional();
        match self.check(result)? {
            None => Ok(None),
            Some((text, revision)) => Ok(Some((
                decode("upgrade-info record", &text)?,
                Revision(revision as u64),
            ))),
        }
    }

    fn last_archived(&mut self) -> Result<Option<UpgradeInfo>, StoreError> {
        let result = self
            .tx
            .query_row(
                "SELECT record FROM upgrade_info_archive ORDER BY seq DESC LIMIT 1",
                [],
                |row| row.get::<_, String>(0),
            )
            .optional();
        self.check(result)?
            .map(|text| decode("archived upgrade-info record", &text))
            .transpose()
    }

    fn put_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        let entity = encode(record);
        let revision = self.log(
            EntityKind::UpgradeInfo,
            RECORD_CURRENT,
            ChangeKind::Change,
            &entity,
        )?;
        let result = self.tx.execute(
            "INSERT OR REPLACE INTO upgrade_info (id, record, revision) VALUES (0, ?1, ?2)",
            params![entity.to_string(), revision.0 as i64],
        );
        self.check(result)?;
        Ok(revision)
    }

    fn archive_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        let entity = encode(record);
        let revision = self.log(
            EntityKind::UpgradeInfo,
            RECORD_CURRENT,
            ChangeKind::Remove,
            &entity,
        )?;
        let result = self
            .tx
            .execute("DELETE FROM upgrade_info", [])
            .and_then(|_| {
                self.tx.execute(
                    "INSERT INTO upgrade_info_archive (record, revision) VALUES (?1, ?2)",
                    params![entity.to_string(), revision.0 as i64],
                )
            });
        self.check(result)?;
        Ok(revision)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lockstep_core::jobs::{Job, JobTable};
    use lockstep_core::lifecycle::StepOutcome;
    use lockstep_core::{Role, Roles};

    use super::*;
    use crate::suite::{START, model, v};
    use crate::{Application, ManualClock, seed004};

    fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_clock(path, OpenMode::ReadWrite, Arc::new(ManualClock::new(START)))
    }

    fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with_clock(path, OpenMode::ReadOnly, Arc::new(ManualClock::new(START)))
    }

    /// The database file's bytes, after a clean close (the WAL checkpointed into it).
    fn bytes(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read the database file")
    }

    fn populated(path: &Path) {
        let store = open(path).unwrap();
        store.create_model(&model()).unwrap();
        store
            .add_machine(&Machine::with_roles("0", Roles::of(&[Role::Controller])))
            .unwrap();
    }

    #[test]
    fn opens_with_the_pragmas_stores_require() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("state.db")).unwrap();
        let conn = store.connection();
        let text = |pragma: &str| -> String {
            conn.query_row(&format!("PRAGMA {pragma}"), [], |row| row.get(0))
                .unwrap()
        };
        let number = |pragma: &str| -> i64 {
            conn.query_row(&format!("PRAGMA {pragma}"), [], |row| row.get(0))
                .unwrap()
        };
        assert_eq!(text("journal_mode"), "wal");
        assert_eq!(number("synchronous"), 2, "FULL");
        assert_eq!(number("foreign_keys"), 1);
        assert_eq!(number("busy_timeout"), 5000);
        let version: i64 = conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, i64::from(SCHEMA_VERSION));
    }

    /// A store written by the schema before roles (version 1), with legacy machines, is
    /// migrated at open, reports its machines as the core says, and lockstep's step plan for
    /// the upgrade runs the migration to roles exactly once.
    #[test]
    fn older_schema_fixture_is_migrated_and_its_machines_moved_to_roles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch(
                "UPDATE schema_version SET version = 1;
                 INSERT INTO model (id, uuid, name, agent_version, policy, controllers)
                 VALUES (0, 'deadbeef-0000-4000-8000-000000000001', 'controller', '0.0.9',
                         '\"off\"', '[0]');
                 INSERT INTO machines (id, jobs, life) VALUES
                     ('0', '[\"JobManageEnviron\",\"JobHostUnits\"]', 'alive'),
                     ('1', '[\"JobHostUnits\"]', 'alive');
                 UPDATE meta SET value = 3 WHERE key = 'revision';",
            )
            .unwrap();
        }
        let store = open(&path).unwrap();
        let version: i64 = store
            .connection()
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, i64::from(SCHEMA_VERSION));
        let model = store.load_model().unwrap().unwrap();
        assert_eq!(model.agent_version, v("0.0.9"));
        assert!(model.capabilities.is_empty());
        let table = JobTable::lockstep();
        let reported = |store: &SqliteStore| -> Vec<Vec<String>> {
            store
                .reported_jobs(&table)
                .unwrap()
                .into_iter()
                .map(|(_, jobs)| jobs.iter().map(|job| job.as_str().to_owned()).collect())
                .collect()
        };
        assert_eq!(
            reported(&store),
            [
                vec!["JobManageEnviron", "JobHostUnits", "JobManageModel"],
                vec!["JobHostUnits"]
            ]
        );

        // The upgrade 0.0.9 -> 0.1.0 on the coordinator plans lockstep's database step.
        let registry = seed004::registry().unwrap();
        let plan = lockstep_core::steps::plan(
            &registry,
            v("0.0.9"),
            v("0.1.0"),
            Roles::of(&[Role::Controller]),
            true,
        );
        assert_eq!(plan.database().len(), 1);
        let token = store
            .acquire_lease(lockstep_core::lifecycle::ControllerId(0), Millis(2000))
            .unwrap();
        for &index in plan.database() {
            let key = registry.key(index);
            assert_eq!(
                seed004::run_step(&store, key, token).unwrap(),
                Some(StepOutcome::Applied)
            );
        }
        assert_eq!(
            reported(&store),
            [vec!["JobHostUnits", "JobManageModel"], vec!["JobHostUnits"]]
        );
        // Reopened (a restart), the step stays applied and revisions go on from the fixture's.
        drop(store);
        let store = open(&path).unwrap();
        let key = seed004::MACHINE_JOBS_TO_ROLES.key();
        assert_eq!(
            seed004::run_step(&store, key, None).unwrap(),
            Some(StepOutcome::AlreadyApplied)
        );
        match store.changes_since(Revision(3), 10).unwrap() {
            Changes::Events { events, .. } => {
                let ids: Vec<_> = events
                    .iter()
                    .map(|e| (e.revision.0, e.id.as_str()))
                    .collect();
                assert_eq!(
                    ids,
                    [(4, "0"), (5, "1"), (6, "machine-jobs-to-roles@0.1.0")]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// A store of the schema before machine agents (version 3) opens, migrates to the
    /// current one keeping its data and its revision, and then holds agents' credentials and
    /// status; read-only, it is refused until migrated.
    #[test]
    fn version_3_store_is_migrated_and_keeps_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = Connection::open(&path).unwrap();
            for migration in &MIGRATIONS[..3] {
                conn.execute_batch(migration).unwrap();
            }
            conn.execute_batch(
                "UPDATE schema_version SET version = 3;
                 INSERT INTO model (id, uuid, name, agent_version, policy, controllers,
                                    capabilities)
                 VALUES (0, 'deadbeef-0000-4000-8000-000000000001', 'controller', '2.9.42',
                         '\"off\"', '[0]', '[]');
                 INSERT INTO machines (id, jobs, roles, agent_binary, life) VALUES
                     ('0', '[]', '[\"controller\"]', '2.9.42-ubuntu-amd64', 'alive');
                 INSERT INTO settings (id, doc) VALUES ('model', '{\"logging-config\": \"x\"}');
                 INSERT INTO operations (id, result) VALUES ('op-1', '{\"ok\": true}');
                 INSERT INTO events (rev, kind, entity_id, change, entity) VALUES
                     (1, 'model', 'deadbeef-0000-4000-8000-000000000001', 'change', '{}'),
                     (2, 'machine', '0', 'change', '{}');
                 UPDATE meta SET value = 2 WHERE key = 'revision';",
            )
            .unwrap();
        }
        let error = open_read_only(&path).unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::MigrationNeeded {
                    found: 3,
                    supported: SCHEMA_VERSION,
                    ..
                }
            ),
            "{error}"
        );
        let store = open(&path).unwrap();
        let version: i64 = store
            .connection()
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, 5);
        assert_eq!(SCHEMA_VERSION, 5);
        let model = store.load_model().unwrap().unwrap();
        assert_eq!(model.agent_version, v("2.9.42"));
        let (machine, settings, operation) = store
            .read(|tx| {
                Ok((
                    tx.machine("0")?,
                    tx.document(EntityKind::Settings, "model")?,
                    tx.operation("op-1")?,
                ))
            })
            .unwrap();
        let machine = machine.unwrap();
        assert_eq!(machine.roles, Roles::of(&[Role::Controller]));
        assert_eq!(
            machine.agent_binary.map(|binary| binary.to_string()),
            Some("2.9.42-ubuntu-amd64".to_owned())
        );
        assert_eq!(settings, Some(serde_json::json!({"logging-config": "x"})));
        assert_eq!(operation, Some(serde_json::json!({"ok": true})));
        assert_eq!(store.revision().unwrap(), Revision(2));
        // The new tables are there and empty, and take writes without events.
        let status = crate::AgentStatus {
            status: "started".to_owned(),
            info: String::new(),
            phase: "ready".to_owned(),
            version: machine_binary(),
            download_rate: Some(117_000_000),
            updated: START,
        };
        let (hash, statuses) = store
            .read(|tx| Ok((tx.agent_password_hash("machine-0")?, tx.agent_statuses()?)))
            .unwrap();
        assert_eq!((hash, statuses), (None, Vec::new()));
        store
            .transaction(None, &mut |tx| {
                tx.set_agent_password_hash(
                    "machine-0",
                    "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
                )?;
                tx.put_agent_status("machine-0", &status)?;
                Ok(())
            })
            .unwrap();
        drop(store);
        let store = open(&path).unwrap();
        assert_eq!(store.revision().unwrap(), Revision(2));
        assert_eq!(
            store.read(|tx| tx.agent_status("machine-0")).unwrap(),
            Some(status)
        );
        assert!(
            store
                .read(|tx| tx.agent_password_hash("machine-0"))
                .unwrap()
                .is_some()
        );
        assert!(open_read_only(&path).is_ok(), "migrated: opens read-only");
    }

    fn machine_binary() -> Option<lockstep_core::Binary> {
        Some(lockstep_core::Binary::new(v("2.9.42"), "ubuntu", "amd64").unwrap())
    }

    #[test]
    fn newer_schema_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        populated(&path);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute("UPDATE schema_version SET version = 7", [])
                .unwrap();
        }
        let before = bytes(&path);
        for error in [open(&path).unwrap_err(), open_read_only(&path).unwrap_err()] {
            assert_eq!(
                error,
                StoreError::SchemaTooNew {
                    path: path.clone(),
                    found: 7,
                    supported: SCHEMA_VERSION
                }
            );
            let text = error.to_string();
            assert!(
                text.contains("schema version 7")
                    && text.contains(&format!("the {SCHEMA_VERSION} this")),
                "{text}"
            );
        }
        assert_eq!(bytes(&path), before, "the newer store was not touched");
    }

    #[test]
    fn corrupt_files_are_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        // Not a database at all.
        let garbage = dir.path().join("garbage.db");
        let noise: Vec<u8> = (0..16384u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&garbage, &noise).unwrap();
        let error = open(&garbage).unwrap_err();
        assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("garbage.db"), "{error}");
        assert_eq!(bytes(&garbage), noise);

        // A store whose pages were damaged after its header.
        let damaged = dir.path().join("damaged.db");
        {
            let store = open(&damaged).unwrap();
            store.create_model(&model()).unwrap();
            for index in 0..200 {
                store
                    .transaction(None, &mut |tx| {
                        (tx as &mut dyn Tx)
                            .put_application(&Application {
                                name: format!("app-{index}"),
                                charm: "x".repeat(200),
                                life: Life::Alive,
                            })
                            .map(drop)
                            .map_err(Abort::from)
                    })
                    .unwrap();
            }
        }
        let mut content = bytes(&damaged);
        assert!(content.len() > 8 * 4096, "{} bytes", content.len());
        for byte in &mut content[4096..8 * 4096] {
            *byte = 0x5a;
        }
        std::fs::write(&damaged, &content).unwrap();
        let error = open(&damaged).unwrap_err();
        assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
        assert_eq!(bytes(&damaged), content);
    }

    #[test]
    fn other_databases_are_not_taken_for_stores() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE customers (id INTEGER PRIMARY KEY);")
            .unwrap();
        let before = bytes(&path);
        let error = open(&path).unwrap_err();
        assert!(matches!(error, StoreError::NotAStore { .. }), "{error}");
        assert!(error.to_string().contains("customers"), "{error}");
        assert_eq!(bytes(&path), before);
    }

    #[test]
    fn read_only_store_reads_and_refuses_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        populated(&path);
        let before = bytes(&path);
        let store = open_read_only(&path).unwrap();
        assert_eq!(store.load_model().unwrap(), Some(model()));
        assert!(matches!(
            store.changes_since(Revision(0), 10).unwrap(),
            Changes::Events { .. }
        ));
        let read_only = StoreError::ReadOnly { path: path.clone() };
        assert_eq!(
            store.add_machine(&Machine::with_roles("9", Roles::of(&[Role::HostMachine]))),
            Err(read_only.clone())
        );
        assert_eq!(
            store.report_upgrade_available(Some(v("9.9.9"))),
            Err(read_only.clone())
        );
        assert_eq!(
            store.acquire_lease(lockstep_core::lifecycle::ControllerId(0), Millis(1000)),
            Err(read_only.clone())
        );
        assert_eq!(store.compact(Revision(1)), Err(read_only.clone()));
        assert!(read_only.to_string().contains("read-only"));
        assert_eq!(store.load_model().unwrap(), Some(model()), "still readable");
        drop(store);
        assert_eq!(bytes(&path), before);

        // An older schema cannot be migrated read-only.
        let old = dir.path().join("old.db");
        {
            let conn = Connection::open(&old).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch("UPDATE schema_version SET version = 1;")
                .unwrap();
        }
        let error = open_read_only(&old).unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::MigrationNeeded {
                    found: 1,
                    supported: SCHEMA_VERSION,
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn full_disk_rolls_back_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = open(&path).unwrap();
        store.create_model(&model()).unwrap();
        let pages: i64 = store
            .connection()
            .query_row("PRAGMA page_count", [], |row| row.get(0))
            .unwrap();
        let limited: i64 = store
            .connection()
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(limited, pages);
        let revision = store.revision().unwrap();
        let big = |name: &'static str| {
            move |tx: &mut dyn Tx| -> Result<(), Abort> {
                tx.put_application(&Application {
                    name: name.to_owned(),
                    charm: "c".repeat(64 * 1024),
                    life: Life::Alive,
                })?;
                Ok(())
            }
        };
        let error = store.transaction(None, &mut big("mysql")).unwrap_err();
        assert_eq!(error, StoreError::Full { path: path.clone() });
        assert!(error.to_string().contains("full"), "{error}");
        // A step that fills the disk commits neither its change nor its checkpoint.
        let key = lockstep_core::steps::StepKey {
            id: lockstep_core::steps::StepId::new("big-step"),
            target_version: v("2.9.43"),
        };
        let error = store
            .run_database_step(key, None, &mut big("postgres"))
            .unwrap_err();
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        // A body that ignores the engine's error still commits nothing.
        let error = store
            .transaction(None, &mut |tx| {
                let _ignored = big("ignored")(tx);
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(error, StoreError::Full { .. }), "{error}");
        assert_eq!(store.revision().unwrap(), revision);
        assert_eq!(store.load_model().unwrap(), Some(model()));
        assert!(
            store
                .read(|tx| tx.document(EntityKind::Application, "mysql"))
                .unwrap()
                .is_none()
        );
        // Space freed: the same step applies.
        store
            .connection()
            .query_row("PRAGMA max_page_count = 1000000", [], |row| {
                row.get::<_, i64>(0)
            })
            .unwrap();
        assert_eq!(
            store
                .run_database_step(key, None, &mut big("postgres"))
                .unwrap(),
            StepOutcome::Applied
        );
        let integrity: String = store
            .connection()
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
    }

    #[test]
    fn job_names_stored_by_hand_that_the_core_refuses_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        populated(&path);
        Connection::open(&path)
            .unwrap()
            .execute(
                "UPDATE machines SET roles = '[]', jobs = '[\"not a job\"]'",
                [],
            )
            .unwrap();
        let store = open(&path).unwrap();
        let error = store.reported_jobs(&JobTable::lockstep()).unwrap_err();
        assert!(error.to_string().contains("not a job"), "{error}");
        assert!(Job::new("JobHostUnits").is_ok());
    }
}
