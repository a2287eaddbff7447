//! The coordinator lease and the store's clock, shared by every implementation so that they
//! agree on expiry and fencing exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_core::lifecycle::{ControllerId, LeaseToken};
use lockstep_core::{Millis, Timestamp};

/// Where a store reads time for lease expiry and checkpoint times.
///
/// The core's `Timestamp`s come from each process's own monotonic clock, so two controllers'
/// timestamps cannot be compared: a lease shared between processes cannot expire on them.
/// The store therefore reads its own clock, one that every process sharing the store
/// agrees on: the wall clock for SQLite (one host), the server's TTL for etcd. Tests inject a
/// [`ManualClock`].
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// Milliseconds since the UNIX epoch: agreed on by every process on one host.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock tests move by hand; clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(start.0)))
    }

    pub fn advance(&self, by: Millis) {
        self.0.fetch_add(by.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// The lease as stored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Lease {
    pub holder: ControllerId,
    pub token: LeaseToken,
    /// Each grant and keep-alive extends the lease to `now + ttl`.
    pub ttl: Millis,
    pub expires_at: Timestamp,
}

impl Lease {
    /// Current: granted and not expired at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }
}

/// True when a write fenced on `fence` may commit: unfenced, or `fence` is the token of the
/// live lease.
pub(crate) fn fence_holds(lease: Option<Lease>, fence: Option<LeaseToken>, now: Timestamp) -> bool {
    match fence {
        None => true,
        Some(token) => lease.is_some_and(|lease| lease.token == token && lease.is_live(now)),
    }
}

/// The lease after an acquire by `holder`, and the answer. A free or expired lease is granted
/// with a fresh token (`next_token`, which the caller then advances); the live holder gets
/// its own token again, extended; anyone else gets `None`.
pub(crate) fn acquire(
    lease: Option<Lease>,
    holder: ControllerId,
    ttl: Millis,
    now: Timestamp,
    next_token: u64,
) -> (Option<Lease>, Option<LeaseToken>) {
    match lease {
        Some(live) if live.is_live(now) && live.holder == holder => {
            let extended = Lease {
                ttl,
                expires_at: now + ttl,
                ..live
            };
            (Some(extended), Some(live.token))
        }
        Some(live) if live.is_live(now) => (Some(live), None),
        _ => {
            let token = LeaseToken(next_token);
            let granted = Lease {
                holder,
                token,
                ttl,
                expires_at: now + ttl,
            };
            (Some(granted), Some(token))
        }
    }
}

/// The lease after a keep-alive, and the answer (`None`: lost).
pub(crate) fn keep_alive(
    lease: Option<Lease>,
    holder: ControllerId,
    token: LeaseToken,
    now: Timestamp,
) -> (Option<Lease>, Option<LeaseToken>) {
    match lease {
        Some(live) if live.is_live(now) && live.holder == holder && live.token == token => {
            let extended = Lease {
                expires_at: now + live.ttl,
                ..live
            };
            (Some(extended), Some(token))
        }
        other => (other, None),
    }
}

/// The lease after a release, and whether it was released.
pub(crate) fn release(
    lease: Option<Lease>,
    holder: ControllerId,
    token: LeaseToken,
) -> (Option<Lease>, bool) {
    match lease {
        Some(held) if held.holder == holder && held.token == token => (None, true),
        other => (other, false),
    }
}
