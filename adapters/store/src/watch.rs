//! A watcher's cursor over the event log: it first replays what happened after a revision,
//! then follows live changes. Both are the same read, [`Store::changes_since`] from the last
//! revision delivered, so there is no gap between replay and live and nothing is delivered
//! twice, across restarts of the watcher or of the store.
//!
//! Live changes are found by reading again: [`Watcher::wait`] polls at an interval the
//! caller chooses. That works for every engine and across processes (another controller's
//! SQLite handle commits without telling this one); an in-process wake-up after commit can
//! shorten the wait later without changing what is delivered.

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

    /// Like [`Watcher::next`], but waits (reading every `poll`) until there is at least one
    /// event or a resync, or `timeout` passed (then an empty batch).
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
            let empty = matches!(&changes, Changes::Events { events, .. } if events.is_empty());
            let now = Instant::now();
            if !empty || now >= deadline {
                return Ok(changes);
            }
            std::thread::sleep(poll.min(deadline - now));
        }
    }

    /// After a resync: the watcher re-read the whole state as of `current`.
    pub fn resynced(&mut self, current: Revision) {
        self.after = current;
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
