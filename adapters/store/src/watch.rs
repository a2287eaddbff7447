//! A watcher's cursor over the event log: it first replays what happened after a revision,
//! then follows live changes. Both are the same read, [`Store::changes_since`] from the last
//! revision delivered, so there is no gap between replay and live and nothing is delivered
//! twice, across restarts of the watcher or of the store.
//!
//! Live changes: [`Watcher::wait`] reads, and when there is nothing new, blocks in
//! [`Store::wait_for_change`] until a commit above the revision it just read is announced in
//! this process ([`Notifier`]: every [`crate::MemoryStore`] handle of one store, every
//! [`crate::SqliteStore`] on one file in this process), or until `poll` passed. The wait is
//! for a revision *above the one read*, and engines announce a commit only once it is
//! visible, so a commit between the read and the wait ends the wait at once: nothing is
//! missed. Polling remains the fallback for writers this process cannot hear (another
//! controller's process writing to the same SQLite file, a remote engine); it decides how
//! late those are seen, never what is delivered.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use lockstep_core::lifecycle::Revision;

use crate::{Changes, Store, StoreError};

/// Where a watcher is: every event up to `after` was delivered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Watcher {
    after: Revision,
}

impl Watcher {
    /// A watcher that has seen everything up to `after` (0: nothing yet).
    pub fn after(after: Revision) -> Watcher {
        Watcher { after }
    }

    /// The last revision delivered: persist it to resume after a restart.
    pub fn position(&self) -> Revision {
        self.after
    }

    /// The next events (at most `limit`), advancing past them; or `ResyncNeeded`, which
    /// leaves the position alone until [`Watcher::resynced`].
    pub fn next(&mut self, store: &dyn Store, limit: usize) -> Result<Changes, StoreError> {
        let changes = store.changes_since(self.after, limit)?;
        if let Changes::Events { events, .. } = &changes
            && let Some(last) = events.last()
        {
            self.after = last.revision;
        }
        Ok(changes)
    }

    /// Like [`Watcher::next`], but waits until there is at least one event or a resync, or
    /// `timeout` passed (then an empty batch). Commits announced in this process wake it at
    /// once; others are found by reading again every `poll`.
    pub fn wait(
        &mut self,
        store: &dyn Store,
        limit: usize,
        timeout: Duration,
        poll: Duration,
    ) -> Result<Changes, StoreError> {
        let deadline = Instant::now() + timeout;
        loop {
            let changes = self.next(store, limit)?;
            let seen = match &changes {
                Changes::Events { events, current } if events.is_empty() => *current,
                _ => return Ok(changes),
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(changes);
            }
            // Above what this read saw (and at least our position): a commit made since the
            // read is already announced and returns at once.
            store.wait_for_change(seen.max(self.after), poll.min(deadline - now));
        }
    }

    /// After a resync: the watcher re-read the whole state as of `current`.
    pub fn resynced(&mut self, current: Revision) {
        self.after = current;
    }
}

/// The latest revision committed in this process, and a condition variable to wait for a
/// newer one: what wakes live watchers right after a commit. Engines call
/// [`Notifier::announce`] after a commit is visible to readers.
#[derive(Debug, Default)]
pub struct Notifier {
    latest: Mutex<u64>,
    changed: Condvar,
}

impl Notifier {
    pub fn new() -> Notifier {
        Notifier::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A commit reached `revision` (and is visible): wake every waiter.
    pub fn announce(&self, revision: Revision) {
        let mut latest = self.lock();
        if revision.0 > *latest {
            *latest = revision.0;
        }
        drop(latest);
        self.changed.notify_all();
    }

    /// The store went back to `revision` (the in-memory engine's crash).
    pub(crate) fn reset(&self, revision: Revision) {
        *self.lock() = revision.0;
        self.changed.notify_all();
    }

    /// The latest revision announced.
    pub fn latest(&self) -> Revision {
        Revision(*self.lock())
    }

    /// Blocks until a revision above `after` is announced (`true`) or `timeout` passed.
    pub fn wait_above(&self, after: Revision, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut latest = self.lock();
        loop {
            if *latest > after.0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            latest = self
                .changed
                .wait_timeout(latest, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::suite::START;
    use crate::{Application, Event, Life, ManualClock, MemoryStore, OpenMode, SqliteStore, Tx};

    fn add(store: &dyn Store, name: &str) {
        store
            .transaction(None, &mut |tx| {
                (tx as &mut dyn Tx).put_application(&Application {
                    name: name.to_owned(),
                    charm: "ch:x".to_owned(),
                    life: Life::Alive,
                })?;
                Ok(())
            })
            .unwrap();
    }

    /// Replays what happened before it started, then follows a writer on another handle
    /// (another connection, for SQLite) with no gap and no repeat.
    fn replay_then_live(writer: Box<dyn Store>, reader: &dyn Store) {
        for index in 0..5 {
            add(writer.as_ref(), &format!("before-{index}"));
        }
        let mut watcher = Watcher::after(Revision(2));
        let thread = std::thread::spawn(move || {
            for index in 0..30 {
                add(writer.as_ref(), &format!("live-{index}"));
                if index % 7 == 0 {
                    std::thread::sleep(Duration::from_millis(3));
                }
            }
        });
        let mut seen: Vec<Event> = Vec::new();
        while seen.len() < 33 {
            match watcher
                .wait(reader, 4, Duration::from_secs(10), Duration::from_millis(1))
                .unwrap()
            {
                Changes::Events { events, .. } => {
                    assert!(!events.is_empty(), "timed out after {} events", seen.len());
                    seen.extend(events);
                }
                other => panic!("{other:?}"),
            }
        }
        thread.join().unwrap();
        let revisions: Vec<u64> = seen.iter().map(|event| event.revision.0).collect();
        assert_eq!(revisions, (3..=35).collect::<Vec<_>>());
        assert_eq!(seen[0].id, "before-2");
        assert_eq!(seen[3].id, "live-0");
        assert_eq!(watcher.position(), Revision(35));
        // Nothing more: an empty batch once the timeout passes.
        assert_eq!(
            watcher
                .wait(
                    reader,
                    4,
                    Duration::from_millis(5),
                    Duration::from_millis(1)
                )
                .unwrap(),
            Changes::Events {
                events: Vec::new(),
                current: Revision(35)
            }
        );
        // Compacted past the watcher: told to resync, position kept until it has.
        reader.compact(Revision(34)).unwrap();
        let mut behind = Watcher::after(Revision(20));
        assert_eq!(
            behind.next(reader, 10).unwrap(),
            Changes::ResyncNeeded {
                compacted: Revision(34),
                current: Revision(35)
            }
        );
        assert_eq!(behind.position(), Revision(20));
        behind.resynced(Revision(35));
        assert!(matches!(
            behind.next(reader, 10).unwrap(),
            Changes::Events { events, .. } if events.is_empty()
        ));
    }

    /// A live watcher hears a commit made in this process at once, with a poll interval far
    /// longer than the test: without the wake-up it would sleep the whole interval.
    fn woken_after_commit(writer: Box<dyn Store>, reader: &dyn Store) {
        add(writer.as_ref(), "before");
        let mut watcher = Watcher::after(Revision(0));
        // Replay first: what was committed before the watcher started.
        match watcher
            .wait(reader, 10, Duration::from_secs(1), Duration::from_secs(1))
            .unwrap()
        {
            Changes::Events { events, .. } => assert_eq!(events.len(), 1),
            other => panic!("{other:?}"),
        }
        let long = Duration::from_secs(30);
        for round in 0..3 {
            let started = Instant::now();
            std::thread::scope(|scope| {
                let writer = writer.as_ref();
                let thread = scope.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    add(writer, &format!("live-{round}"));
                });
                let changes = watcher.wait(reader, 10, long, long).unwrap();
                let elapsed = started.elapsed();
                match changes {
                    Changes::Events { events, .. } => {
                        assert_eq!(events.len(), 1, "{events:?}");
                        assert_eq!(events[0].id, format!("live-{round}"));
                    }
                    other => panic!("{other:?}"),
                }
                assert!(
                    elapsed < Duration::from_secs(5),
                    "the watcher saw the commit only after {elapsed:?}: not woken"
                );
                thread.join().unwrap();
            });
        }
        assert_eq!(watcher.position(), Revision(4));
    }

    #[test]
    fn memory_watchers_are_woken_right_after_a_commit() {
        let store =
            MemoryStore::with_clock(crate::Durability::Full, Arc::new(ManualClock::new(START)));
        woken_after_commit(Box::new(store.clone()), &store);
    }

    #[test]
    fn sqlite_watchers_are_woken_right_after_a_commit_on_another_handle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
        let reader = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
        woken_after_commit(Box::new(writer), &reader);
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_watchers_replay_then_follow_live_changes_from_another_client() {
        use crate::suite::Harness;
        let h = crate::suite::EtcdHarness::new();
        replay_then_live(Box::new(h.second()), h.store());
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_watchers_are_woken_by_etcds_watch_right_after_a_commit() {
        use crate::suite::Harness;
        let h = crate::suite::EtcdHarness::new();
        woken_after_commit(Box::new(h.second()), h.store());
    }

    #[test]
    fn notifier_wait_ends_at_once_for_a_revision_already_announced() {
        let notifier = Notifier::new();
        notifier.announce(Revision(7));
        let started = Instant::now();
        assert!(notifier.wait_above(Revision(6), Duration::from_secs(30)));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!notifier.wait_above(Revision(7), Duration::from_millis(20)));
        notifier.announce(Revision(3));
        assert_eq!(
            notifier.latest(),
            Revision(7),
            "never goes back on announce"
        );
    }

    #[test]
    fn memory_watchers_replay_then_follow_live_changes() {
        let store =
            MemoryStore::with_clock(crate::Durability::Full, Arc::new(ManualClock::new(START)));
        replay_then_live(Box::new(store.clone()), &store);
    }

    #[test]
    fn sqlite_watchers_replay_then_follow_live_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
        let reader = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
        replay_then_live(Box::new(writer), &reader);
    }
}
