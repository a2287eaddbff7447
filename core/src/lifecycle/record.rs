//! The upgrade-info record that several controllers coordinate one upgrade through
//! (Juju's `upgradeInfo` document, `_id: current`), and the rules for changing it.
//!
//! Statuses move pending → db-complete → running → complete, or to aborted from any
//! unfinished status (Juju ≥ 2.9.5). Every change is a compare-and-set on the record's
//! revision; the coordinator's changes are also fenced on its lease.

use std::fmt;

use crate::version::Version;

/// A controller's index among the model's controllers (Juju's machine id of a controller).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct ControllerId(pub u8);

impl ControllerId {
    /// Controllers a model may have: Juju runs 1, 3, 5 or 7.
    pub const COUNT_MAX: u8 = 7;
}

impl fmt::Display for ControllerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "controller-{}", self.0)
    }
}

/// A set of controllers, as a bit set: `Copy`, allocation-free, ordered.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ControllerSet(u8);

impl ControllerSet {
    /// No controller.
    pub const EMPTY: ControllerSet = ControllerSet(0);

    /// Controllers `0..count`.
    pub fn first(count: u8) -> ControllerSet {
        assert!(
            (1..=ControllerId::COUNT_MAX).contains(&count),
            "controller count {count}"
        );
        ControllerSet(((1u16 << count) - 1) as u8)
    }

    /// This set and `id`.
    #[inline]
    pub fn with(self, id: ControllerId) -> ControllerSet {
        assert!(id.0 < ControllerId::COUNT_MAX, "{id} out of range");
        ControllerSet(self.0 | (1 << id.0))
    }

    /// True when `id` is in the set.
    #[inline]
    pub fn contains(self, id: ControllerId) -> bool {
        id.0 < ControllerId::COUNT_MAX && self.0 & (1 << id.0) != 0
    }

    /// True when every member of `other` is in `self`.
    #[inline]
    pub fn covers(self, other: ControllerSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// The controllers in both sets.
    #[inline]
    pub fn intersection(self, other: ControllerSet) -> ControllerSet {
        ControllerSet(self.0 & other.0)
    }

    /// How many controllers are in the set.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// True when no controller is in the set.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The controllers in the set, in id order.
    pub fn iter(self) -> impl Iterator<Item = ControllerId> {
        (0..ControllerId::COUNT_MAX)
            .map(ControllerId)
            .filter(move |&id| self.contains(id))
    }
}

impl fmt::Debug for ControllerSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|id| id.0)).finish()
    }
}

impl serde::Serialize for ControllerSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for ControllerSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ids = Vec::<ControllerId>::deserialize(deserializer)?;
        ids.into_iter().try_fold(ControllerSet::EMPTY, |set, id| {
            if id.0 < ControllerId::COUNT_MAX {
                Ok(set.with(id))
            } else {
                Err(serde::de::Error::custom(format!(
                    "controller id {} is above the maximum {}",
                    id.0,
                    ControllerId::COUNT_MAX - 1
                )))
            }
        })
    }
}

/// Juju's upgrade statuses (≥ 2.9.5).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeStatus {
    /// Controllers are registering in `controllers-ready`.
    Pending,
    /// The coordinator ran every database step.
    DbComplete,
    /// Controllers run their own steps.
    Running,
    /// Every controller is done; the record is archived.
    Complete,
    /// Given up; the record is archived.
    Aborted,
}

impl UpgradeStatus {
    /// The transitions the record may take (Juju's `SetStatus` checks the same).
    #[inline]
    pub fn may_become(self, next: UpgradeStatus) -> bool {
        use UpgradeStatus::*;
        matches!(
            (self, next),
            (Pending, Pending)
                | (Pending, DbComplete)
                | (DbComplete, DbComplete)
                | (DbComplete, Running)
                | (Running, Running)
                | (Running, Complete)
                | (Pending | DbComplete | Running, Aborted)
        )
    }

    /// Complete and aborted records are archived: no longer current.
    #[inline]
    pub fn is_final(self) -> bool {
        matches!(self, UpgradeStatus::Complete | UpgradeStatus::Aborted)
    }

    /// The stored name, Juju's: `pending`, `db-complete`, `running`, `complete`, `aborted`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeStatus::Pending => "pending",
            UpgradeStatus::DbComplete => "db-complete",
            UpgradeStatus::Running => "running",
            UpgradeStatus::Complete => "complete",
            UpgradeStatus::Aborted => "aborted",
        }
    }
}

impl fmt::Display for UpgradeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct UpgradeInfo {
    /// The version upgraded from: the controllers' `upgradedToVersion`.
    pub previous_version: Version,
    /// The version upgraded to.
    pub target_version: Version,
    /// Where the upgrade is.
    pub status: UpgradeStatus,
    /// Controllers registered for this upgrade (Juju's `controllersReady`).
    pub controllers_ready: ControllerSet,
    /// Controllers that ran their own steps (Juju's `controllersDone`).
    pub controllers_done: ControllerSet,
}

impl UpgradeInfo {
    /// True when this record describes the upgrade `previous → target`.
    #[inline]
    pub fn describes(&self, previous: Version, target: Version) -> bool {
        self.previous_version == previous && self.target_version == target
    }

    /// This record with its done set cut to its ready set (see
    /// [`RecordView::normalized`]).
    #[inline]
    pub fn repaired(self) -> UpgradeInfo {
        UpgradeInfo {
            controllers_done: self.controllers_done.intersection(self.controllers_ready),
            ..self
        }
    }

    /// Whether `next` is a valid successor of `self` (same upgrade, allowed status move,
    /// ready and done only grow, done only by ready controllers).
    #[inline]
    pub fn may_become(&self, next: &UpgradeInfo) -> bool {
        self.describes(next.previous_version, next.target_version)
            && self.status.may_become(next.status)
            && next.controllers_ready.covers(self.controllers_ready)
            && next.controllers_done.covers(self.controllers_done)
            && next.controllers_ready.covers(next.controllers_done)
    }
}

/// A store revision: strictly increasing across all changes of shared state, not
/// necessarily consecutive.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Revision(pub u64);

/// What a read or watch of the upgrade-info record returns: the current record with its
/// revision, and the last archived one (so a controller that restarts after the upgrade
/// was completed or aborted without it learns which).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct RecordView {
    /// The current record and the revision it was last written at, if one is current.
    pub current: Option<(UpgradeInfo, Revision)>,
    /// The record archived last (complete or aborted), if any.
    pub last_archived: Option<UpgradeInfo>,
    /// The revision of the store when this view was read.
    pub revision: Revision,
}

impl RecordView {
    /// The view with a final record moved from current to archived, and a current record's
    /// done set cut to its ready set. Stores archive final records, but a view comes from
    /// outside the core: one that names a complete or aborted record as current means the
    /// same as one that archived it; and a current record whose done set names a
    /// controller that is not ready (no lockstep writes one; a damaged store or another
    /// writer might) is read as if done held only ready controllers, so every successor
    /// the core writes of it is a valid one (I4) and repairs it.
    pub fn normalized(self) -> RecordView {
        match self.current {
            Some((record, _)) if record.status.is_final() => RecordView {
                current: None,
                last_archived: Some(record),
                revision: self.revision,
            },
            Some((record, revision)) => RecordView {
                current: Some((record.repaired(), revision)),
                ..self
            },
            None => self,
        }
    }
}

/// A lease's fencing token: the store's proof of which lease grant is current (etcd: the
/// leader key's create revision). A write fenced on a token succeeds only while that grant
/// is still the current one.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct LeaseToken(pub u64);

#[cfg(test)]
mod tests {
    use super::*;
    use UpgradeStatus::*;

    #[test]
    fn statuses_move_only_forward() {
        let all = [Pending, DbComplete, Running, Complete, Aborted];
        let allowed = [
            (Pending, Pending),
            (Pending, DbComplete),
            (DbComplete, DbComplete),
            (DbComplete, Running),
            (Running, Running),
            (Running, Complete),
            (Pending, Aborted),
            (DbComplete, Aborted),
            (Running, Aborted),
        ];
        for from in all {
            for to in all {
                assert_eq!(
                    from.may_become(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    /// Found by the `lifecycle_inputs` fuzz target: a view naming a current record done by a
    /// controller that is not ready made the next registration an invalid successor (I4).
    #[test]
    fn a_current_record_done_by_a_controller_not_ready_is_read_with_done_cut_to_ready() {
        let set = |ids: &[u8]| {
            ids.iter()
                .fold(ControllerSet::EMPTY, |set, &id| set.with(ControllerId(id)))
        };
        let version = |minor| Version::new(3, minor, 0);
        let damaged = UpgradeInfo {
            previous_version: version(0),
            target_version: version(1),
            status: DbComplete,
            controllers_ready: set(&[0]),
            controllers_done: set(&[6]),
        };
        let view = RecordView {
            current: Some((damaged, Revision(4))),
            last_archived: None,
            revision: Revision(4),
        }
        .normalized();
        let (read, _) = view.current.unwrap();
        assert_eq!(read.controllers_done, ControllerSet::EMPTY);
        assert_eq!(read.controllers_ready, set(&[0]));
        let registered = UpgradeInfo {
            controllers_ready: set(&[0, 1]),
            controllers_done: set(&[1]),
            ..read
        };
        assert!(read.may_become(&registered));
        assert!(!damaged.may_become(&registered));
    }

    #[test]
    fn controller_sets() {
        let set = ControllerSet::first(3);
        assert_eq!(set.len(), 3);
        assert!(set.contains(ControllerId(2)) && !set.contains(ControllerId(3)));
        assert!(set.covers(ControllerSet::EMPTY.with(ControllerId(1))));
        assert_eq!(serde_json::to_string(&set).unwrap(), "[0,1,2]");
        let error = serde_json::from_str::<ControllerSet>("[9]").unwrap_err();
        assert!(error.to_string().contains("controller id 9"), "{error}");
    }

    #[test]
    fn records_only_grow() {
        let base = UpgradeInfo {
            previous_version: Version::new(2, 9, 42),
            target_version: Version::new(2, 9, 43),
            status: Pending,
            controllers_ready: ControllerSet::EMPTY.with(ControllerId(0)),
            controllers_done: ControllerSet::EMPTY,
        };
        let mut next = base;
        next.controllers_ready = base.controllers_ready.with(ControllerId(1));
        assert!(base.may_become(&next));
        assert!(!next.may_become(&base), "ready shrank");
        let mut other = next;
        other.target_version = Version::new(2, 9, 44);
        assert!(!next.may_become(&other), "another upgrade");
        let mut done_not_ready = next;
        done_not_ready.controllers_done = ControllerSet::EMPTY.with(ControllerId(2));
        assert!(!next.may_become(&done_not_ready));
    }
}
