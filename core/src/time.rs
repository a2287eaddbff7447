//! Time as data. The core never reads a clock: every input carries the driver's `now`.

use std::fmt;
use std::ops::{Add, Sub};

/// A point in time, in milliseconds since an epoch the driver chooses (a monotonic clock's
/// start in a daemon, zero in a simulator). Only differences are meaningful.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The driver's epoch itself.
    pub const ZERO: Timestamp = Timestamp(0);

    /// The instant `ms` milliseconds after the driver's epoch.
    pub fn from_millis(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    /// Milliseconds since the driver's epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// Milliseconds from `earlier` to `self`, 0 if `earlier` is later (spurious timers and
    /// reordered inputs must never underflow).
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A span of time in milliseconds.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Millis(pub u64);

impl Add<Millis> for Timestamp {
    type Output = Timestamp;
    fn add(self, span: Millis) -> Timestamp {
        Timestamp(self.0.saturating_add(span.0))
    }
}

impl Sub<Timestamp> for Timestamp {
    type Output = Millis;
    fn sub(self, earlier: Timestamp) -> Millis {
        Millis(self.millis_since(earlier))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}ms", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}ms", self.0)
    }
}

impl fmt::Debug for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
