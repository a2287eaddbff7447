//! The store's errors: each names what it found and what to do.

use std::fmt;
use std::path::PathBuf;

use lockstep_core::lifecycle::UpgradeInfo;

/// Everything a store can refuse or fail with.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreError {
    /// The database was written by a newer lockstep: refused, never overwritten.
    SchemaTooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// A read-only store whose schema is older than this binary's: it cannot be migrated.
    MigrationNeeded {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// The file is a database, but not a lockstep store.
    NotAStore { path: PathBuf, detail: String },
    /// The file is not a database, or its pages are damaged.
    Corrupt { path: PathBuf, detail: String },
    /// A write to a store opened read-only (or on a read-only file system).
    ReadOnly { path: PathBuf },
    /// The disk (or the database's page limit) is full: the write was not committed.
    Full { path: PathBuf },
    /// Another writer held the database longer than the busy timeout.
    Busy { path: PathBuf },
    /// Any other engine error.
    Engine { path: PathBuf, detail: String },
    /// The engine refused this client's credentials or their permissions (etcd with
    /// authentication): no retry helps until the user, its password or its role change.
    /// `detail` names the user, never the password.
    Denied { path: PathBuf, detail: String },
    /// The in-memory store crashed while this transaction was open: nothing was committed.
    Crashed,
    /// Optimistic transactions kept conflicting with concurrent writers.
    Contention { attempts: u32 },
    /// A compare-and-set that matched the revision asked for a transition the record may
    /// not take (`UpgradeInfo::may_become`).
    InvalidTransition {
        from: Box<UpgradeInfo>,
        to: Box<UpgradeInfo>,
    },
    /// A new upgrade-info record must start pending.
    InvalidNewRecord { record: Box<UpgradeInfo> },
    /// An operation that needs the model, before it was created.
    NoModel,
    /// Stored data this binary cannot read.
    Decode { what: String, detail: String },
    /// A document write for a kind that is not stored as a document.
    NotADocument { kind: crate::EntityKind },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::SchemaTooNew {
                path,
                found,
                supported,
            } => write!(
                f,
                "store {} has schema version {found}, newer than the {supported} this binary \
                 understands; it was left untouched: run a lockstep that supports schema \
                 {found}",
                path.display()
            ),
            StoreError::MigrationNeeded {
                path,
                found,
                supported,
            } => write!(
                f,
                "store {} has schema version {found} and needs migrating to {supported}, \
                 which a read-only store cannot do; open it read-write once",
                path.display()
            ),
            StoreError::NotAStore { path, detail } => write!(
                f,
                "{} is a database but not a lockstep store ({detail}); it was left untouched",
                path.display()
            ),
            StoreError::Corrupt { path, detail } => write!(
                f,
                "store {} is corrupt or not a database ({detail}); it was left untouched: \
                 restore it from a backup",
                path.display()
            ),
            StoreError::ReadOnly { path } => write!(
                f,
                "store {} is read-only: the write was refused and nothing changed",
                path.display()
            ),
            StoreError::Full { path } => write!(
                f,
                "store {}: database or disk is full; the write was rolled back and nothing \
                 changed: free space and retry",
                path.display()
            ),
            StoreError::Busy { path } => write!(
                f,
                "store {} stayed locked by another writer past the busy timeout; retry",
                path.display()
            ),
            StoreError::Engine { path, detail } => {
                write!(f, "store {}: {detail}", path.display())
            }
            StoreError::Denied { path, detail } => {
                write!(f, "store {} refused access: {detail}", path.display())
            }
            StoreError::Crashed => {
                f.write_str("the store crashed during the transaction; nothing was committed")
            }
            StoreError::Contention { attempts } => write!(
                f,
                "transaction conflicted with concurrent writers {attempts} times; retry"
            ),
            StoreError::InvalidTransition { from, to } => write!(
                f,
                "upgrade-info record may not go from {} ({} -> {}, ready {:?}, done {:?}) to {} \
                 ({} -> {}, ready {:?}, done {:?})",
                from.status,
                from.previous_version,
                from.target_version,
                from.controllers_ready,
                from.controllers_done,
                to.status,
                to.previous_version,
                to.target_version,
                to.controllers_ready,
                to.controllers_done
            ),
            StoreError::InvalidNewRecord { record } => write!(
                f,
                "a new upgrade-info record must be pending, not {} ({} -> {})",
                record.status, record.previous_version, record.target_version
            ),
            StoreError::NoModel => f.write_str("the store has no model yet: bootstrap first"),
            StoreError::Decode { what, detail } => {
                write!(f, "cannot read stored {what}: {detail}")
            }
            StoreError::NotADocument { kind } => write!(
                f,
                "{kind} is not stored as a document: only applications, units, relations, settings and charms are"
            ),
        }
    }
}

impl std::error::Error for StoreError {}

/// Decoding a stored JSON value.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::Decode {
        what: what.to_owned(),
        detail: format!("{error} in {text:?}"),
    })
}

/// Encoding a value as JSON (our own types always encode).
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("store types encode as JSON")
}
