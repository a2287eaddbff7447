//! The engines' postcondition on every commit, asserted where each engine commits, in every
//! build: a commit's revision is the revision it read plus the events it logged, so
//! revisions strictly increase with every commit that changes anything, and a commit that
//! logs nothing leaves the revision where it was. A watcher resuming `after` a revision
//! relies on it (CONTRACT: "revisions"); a broken engine must stop, not hand out a revision
//! twice.

use crate::Revision;

/// Asserts the postcondition of one commit of `engine`: it read `base`, logged `events`
/// events, and committed at `committed`.
pub(crate) fn assert_commit(engine: &str, base: Revision, events: u64, committed: Revision) {
    assert!(
        committed.0 == base.0 + events,
        "{engine} store: a commit that read revision {} and logged {events} events committed \
         at revision {}; each event must take the next revision (postcondition: revisions \
         strictly increase per commit)",
        base.0,
        committed.0
    );
}

/// The revisions one store handle committed, in commit order, for the engines whose
/// commits are serialised in this process (SQLite's connection lock, the memory store's
/// lock): each commit that logged events must come after every earlier one.
#[derive(Debug, Default)]
pub(crate) struct CommitOrder {
    last: std::sync::atomic::AtomicU64,
}

impl CommitOrder {
    /// Asserts, under the engine's commit lock, that `committed` (a commit that logged
    /// events) is past every revision committed before it through this handle.
    pub(crate) fn assert_after_last(&self, engine: &str, committed: Revision) {
        use std::sync::atomic::Ordering;
        let last = self.last.swap(committed.0, Ordering::Relaxed);
        assert!(
            committed.0 > last,
            "{engine} store: a commit at revision {} after one at revision {last}; revisions \
             must strictly increase per commit",
            committed.0
        );
    }

    /// Forgets the order (the memory store's simulated crash rolls revisions back to the
    /// durable ones).
    pub(crate) fn reset(&self, revision: Revision) {
        self.last
            .store(revision.0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_that_logged_events_takes_the_next_revisions() {
        assert_commit("test", Revision(7), 2, Revision(9));
        assert_commit("test", Revision(7), 0, Revision(7));
    }

    #[test]
    #[should_panic(expected = "each event must take the next revision")]
    fn a_commit_that_skips_or_reuses_a_revision_panics() {
        assert_commit("test", Revision(7), 1, Revision(7));
    }

    #[test]
    #[should_panic(expected = "revisions must strictly increase per commit")]
    fn a_commit_at_or_before_an_earlier_one_panics() {
        let order = CommitOrder::default();
        order.assert_after_last("test", Revision(3));
        order.assert_after_last("test", Revision(3));
    }
}
