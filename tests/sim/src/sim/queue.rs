//! The event queue and virtual time: events ordered by virtual time, then by the order
//! they were scheduled; the store's clock, which reads the queue's time; and each host's
//! own clock, offset and drifting from it.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use lockstep_core::Timestamp;
use lockstep_store::Clock;

/// The queue of one run: what happens next, and the virtual time now.
#[derive(Debug)]
pub(super) struct EventQueue<E> {
    /// Virtual milliseconds since the run began: the time of the event taken last.
    pub(super) now: u64,
    seq: u64,
    heap: BinaryHeap<Scheduled<E>>,
}

impl<E> EventQueue<E> {
    pub(super) fn new() -> EventQueue<E> {
        EventQueue {
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
        }
    }

    /// Schedules `event` at virtual time `at` (never in the past: at the earliest, now).
    pub(super) fn schedule(&mut self, at: u64, event: E) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            event,
        });
    }

    /// Takes the earliest event and moves the time to it.
    pub(super) fn pop(&mut self) -> Option<E> {
        let item = self.heap.pop()?;
        assert!(item.at >= self.now, "virtual time never runs backwards");
        self.now = item.at;
        Some(item.event)
    }
}

#[derive(Debug)]
struct Scheduled<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Scheduled<E>) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Scheduled<E>) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Scheduled<E>) -> Ordering {
        // The heap is a max-heap: the earliest event is the greatest.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The store's clock: the simulator's virtual time.
#[derive(Clone, Debug, Default)]
pub(super) struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    pub(super) fn set(&self, now: u64) {
        self.0.store(now, AtomicOrdering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(AtomicOrdering::SeqCst))
    }
}

/// A host's clock: `local = offset + global × rate / 1000`.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostClock {
    pub(super) offset_ms: u64,
    pub(super) rate_per_mille: u64,
}

impl HostClock {
    /// A clock that reads the virtual time itself.
    pub(super) const TRUE: HostClock = HostClock {
        offset_ms: 0,
        rate_per_mille: 1000,
    };

    /// The host's reading at virtual time `global`.
    pub(super) fn local(&self, global: u64) -> Timestamp {
        Timestamp(self.offset_ms + global * self.rate_per_mille / 1000)
    }

    /// The virtual time at which the host reads `local` (the earliest, rounded up).
    pub(super) fn global(&self, local: Timestamp) -> u64 {
        let since = local.0.saturating_sub(self.offset_ms);
        (since * 1000).div_ceil(self.rate_per_mille)
    }

    /// The virtual time the host takes to see `local_ms` pass.
    pub(super) fn global_after(&self, local_ms: u64) -> u64 {
        (local_ms * 1000).div_ceil(self.rate_per_mille)
    }
}
