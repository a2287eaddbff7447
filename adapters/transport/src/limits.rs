//! The API's limits on what clients may hold: connections before and after login, the time
//! to shake hands and to log in, password checks, failed logins, unwritten replies and
//! watchers. `spec/wire.md` lists each with its default and its `lockstepd` flag.
//!
//! The rule behind them: no client, logged in or not, can make the controller hold more
//! than a bounded amount of memory or delay another client's login by more than a few
//! password checks. Before login a connection is a stranger's, so it gets little (a slot
//! among a few hundred shared fairly across source addresses, 64 KiB of input, 30 s); a
//! password check costs argon2's 19 MiB, so only a few run at once, on threads of their
//! own, taken in turn across source addresses.

use std::time::Duration;

/// Every limit of the API. `ApiLimits::default()` is what `lockstepd` runs with unless a
/// flag says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections open at once, logged in or not (`--max-connections`).
    pub connections_max: usize,
    /// Connections not logged in yet, from all sources (`--max-pending-connections`).
    /// When full, a newcomer takes the slot of the oldest connection of the source holding
    /// most, if that source would still hold at least as many as the newcomer's.
    pub pending_connections_max: usize,
    /// Connections not logged in yet from one source address
    /// (`--max-pending-connections-per-source`).
    pub pending_connections_per_source_max: usize,
    /// Time a TLS handshake may take (`--tls-handshake-timeout-sec`).
    pub tls_handshake_timeout: Duration,
    /// Time from accepting a connection to its successful login (`--login-timeout-sec`).
    /// A connection used for HTTP only (probes, agent binaries) is closed after it too.
    pub login_timeout: Duration,
    /// Bytes a connection may send before it logs in, TLS handshake and HTTP request
    /// included (`--max-pre-login-bytes`).
    pub pre_login_bytes_max: usize,
    /// Password checks running at once, each on a thread of the login pool
    /// (`--login-concurrency`).
    pub login_concurrency: usize,
    /// Password checks waiting for a thread, per source address
    /// (`--max-queued-logins-per-source`); beyond it a login is told to try again.
    pub queued_logins_per_source_max: usize,
    /// Failed logins from one source address, or for one user, before the next is
    /// refused without a check for a while (`--login-failures-before-throttle`).
    pub login_failures_before_throttle: u32,
    /// Longest a throttled login is told to wait; the wait starts at 1 s and doubles with
    /// each further failure (`--login-throttle-max-sec`).
    pub login_throttle_max: Duration,
    /// Bytes of replies one connection may have computed and not yet written
    /// (`--max-reply-bytes-per-connection`); beyond it the connection is closed.
    pub reply_bytes_per_connection_max: usize,
    /// Bytes of replies all connections together may have computed and not yet written
    /// (`--max-reply-bytes`); beyond it the connection holding most is closed.
    pub reply_bytes_max: usize,
    /// Time a reply may take to be written to a client's socket (`--write-timeout-sec`).
    pub write_timeout: Duration,
    /// AllWatchers one connection may hold (`--max-watchers-per-connection`).
    pub watchers_per_connection_max: usize,
    /// AllWatchers all connections together may hold (`--max-watchers`).
    pub watchers_max: usize,
}

/// Refusals in progress at once (a TLS handshake and an HTTP 503 each); a connection over
/// a cap beyond these is closed without a word.
pub const REFUSALS_IN_PROGRESS_MAX: usize = 16;

/// Time a refusal may take, handshake included.
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// The first wait of a throttled login; it doubles with each further failure.
pub const LOGIN_THROTTLE_FIRST: Duration = Duration::from_secs(1);

/// Source addresses and users the failed-login table remembers at once; beyond it the
/// records least recently failed are forgotten first.
pub const LOGIN_RECORDS_MAX: usize = 4096;

impl Default for ApiLimits {
    fn default() -> ApiLimits {
        ApiLimits {
            connections_max: 4096,
            pending_connections_max: 512,
            pending_connections_per_source_max: 32,
            tls_handshake_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(30),
            pre_login_bytes_max: 64 << 10,
            login_concurrency: std::thread::available_parallelism().map_or(2, usize::from),
            queued_logins_per_source_max: 16,
            login_failures_before_throttle: 5,
            login_throttle_max: Duration::from_secs(60),
            reply_bytes_per_connection_max: 4 << 20,
            reply_bytes_max: 64 << 20,
            write_timeout: Duration::from_secs(30),
            watchers_per_connection_max: 16,
            watchers_max: 1024,
        }
    }
}

/// Why the API closed or refused a connection, or refused a login: the `reason` label of
/// `lockstep_api_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    MaxConnections,
    MaxPendingConnections,
    MaxPendingConnectionsPerSource,
    Evicted,
    TlsHandshakeTimeout,
    LoginTimeout,
    PreLoginBytes,
    LoginQueueFull,
    LoginThrottled,
    ReplyBytes,
    WriteTimeout,
    FrameSize,
    Watchers,
}

impl Refusal {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Refusal; 13] = [
        Refusal::MaxConnections,
        Refusal::MaxPendingConnections,
        Refusal::MaxPendingConnectionsPerSource,
        Refusal::Evicted,
        Refusal::TlsHandshakeTimeout,
        Refusal::LoginTimeout,
        Refusal::PreLoginBytes,
        Refusal::LoginQueueFull,
        Refusal::LoginThrottled,
        Refusal::ReplyBytes,
        Refusal::WriteTimeout,
        Refusal::FrameSize,
        Refusal::Watchers,
    ];

    /// The metric label, also the name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max-connections",
            Refusal::MaxPendingConnections => "max-pending-connections",
            Refusal::MaxPendingConnectionsPerSource => "max-pending-connections-per-source",
            Refusal::Evicted => "evicted",
            Refusal::TlsHandshakeTimeout => "tls-handshake-timeout",
            Refusal::LoginTimeout => "login-timeout",
            Refusal::PreLoginBytes => "pre-login-bytes",
            Refusal::LoginQueueFull => "login-queue-full",
            Refusal::LoginThrottled => "login-throttled",
            Refusal::ReplyBytes => "reply-bytes",
            Refusal::WriteTimeout => "write-timeout",
            Refusal::FrameSize => "frame-size",
            Refusal::Watchers => "watchers",
        }
    }

    /// Its index in [`Refusal::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_listed_once_at_its_index() {
        for (index, refusal) in Refusal::ALL.iter().enumerate() {
            assert_eq!(refusal.index(), index, "{refusal}");
        }
        let mut labels: Vec<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::ALL.len());
    }
}
