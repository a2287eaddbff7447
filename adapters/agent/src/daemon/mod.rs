//! `lockstepd`: the daemon. Two processes make a controller: the launcher (stable pid, owns
//! the API's listening socket, supervises) and the worker (serves the API and drives the
//! lifecycle core), restarted into each new binary.
//!
//! - [`launcher`]: the long-lived supervisor: binds the socket once, runs the worker from
//!   `tools/<tag>/lockstepd`, watches it over sd_notify, hands a failed trial back.
//! - [`worker`]: opens the store, TLS and the inherited socket, builds the core from
//!   `agent.conf`, serves the API, re-executes itself on `RestartInto`.
//! - [`machine_agent`]: the worker of a machine agent (`agent.conf` with an `apipassword`
//!   and no `api-listen`): the same lifecycle in the host-machine role, its requests
//!   answered through the controllers' API; it never opens the store.
//! - [`rollout`]: the rollout coordinator every controller runs while Ready: the staged
//!   rollout of machine agents advanced by the core, written fenced on the coordinator
//!   lease by whichever controller holds it.
//! - [`memory`]: glibc's mmap threshold fixed at start, so that large transient buffers
//!   (argon2's) go back to the system.
//! - [`descriptors`]: the soft limit on open files raised to the hard one at start (a
//!   relayed connection holds three descriptors in the launcher).
//! - [`driver`]: one task owns the lifecycle core and executes its requests with the
//!   store, streams and data-dir adapters.
//! - [`restart`]: how a worker restarts into a new binary (re-exec or exit 3), and the exit
//!   statuses the launcher reads.
//! - [`step_runner`]: how this daemon runs the database and host steps of
//!   [`crate::steps`].
//! - [`capabilities`]: the environment provider a controller asks at bootstrap and at the
//!   end of every upgrade: this host interrogated, `--capabilities` as an override, or
//!   `--capabilities-file` (tests).
//! - [`catalogue`]: the API's catalogue, read in the background so that a stalled mirror
//!   never stalls a call.
//! - [`api_limits`]: the flags for the API's limits on connections, logins, replies and
//!   watchers.
//! - [`error`]: [`DaemonError`](error::DaemonError), why `lockstepd` cannot start or go on.
//! - `failpoints` (feature `failpoints`, test builds only): `LOCKSTEPD_FAILPOINT_*`.
//!
//! **Architecture Invariant:** nothing here imports [`crate::cli`]: the daemon is the same
//! whichever command line started it. What both need (the data directory, the store
//! settings, the metadata source, the step registry) is in the crate's shared modules.

pub mod api_limits;
pub mod capabilities;
pub mod catalogue;
pub mod descriptors;
pub mod driver;
pub mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod gate_hold;
pub mod launcher;
pub mod machine_agent;
pub mod memory;
pub mod provisioner;
pub mod restart;
pub mod rollout;
pub mod step_runner;
pub mod worker;
