//! `lockstepd`: the daemon. Two processes make a controller: the launcher (stable pid, owns
//! the API's listening socket, supervises) and the worker (serves the API and drives the
//! lifecycle core), restarted into each new binary.
//!
//! - [`launcher`]: the long-lived supervisor: binds the socket once, runs the worker from
//!   `tools/<tag>/lockstepd`, watches it over sd_notify, hands a failed trial back.
//! - [`worker`]: opens the store, TLS and the inherited socket, builds the core from
//!   `agent.conf`, serves the API, re-executes itself on `RestartInto`.
//! - [`driver`]: one task owns the lifecycle core and executes its requests with the
//!   store, streams and data-dir adapters.
//! - [`step_runner`]: how this daemon runs the database and host steps of
//!   [`crate::steps`].
//! - [`catalogue`]: the API's catalogue, read in the background so that a stalled mirror
//!   never stalls a call.
//! - [`api_limits`]: the flags for the API's limits on connections, logins, replies and
//!   watchers.
//! - [`error`]: [`DaemonError`](error::DaemonError), why `lockstepd` cannot start or go on.
//! - [`notify`]: both ends of systemd's notification protocol.
//! - `failpoints` (feature `failpoints`, test builds only): `LOCKSTEPD_FAILPOINT_*`.
//!
//! **Architecture Invariant:** nothing here imports [`crate::cli`]: the daemon is the same
//! whichever command line started it. What both need (the data directory, the store
//! settings, the metadata source, the step registry) is in the crate's shared modules.

pub mod api_limits;
pub mod catalogue;
pub mod driver;
pub mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod launcher;
pub mod notify;
pub mod step_runner;
pub mod worker;
