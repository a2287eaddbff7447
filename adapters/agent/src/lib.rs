//! lockstep's agent: the `lockstepd` daemon and the `lockstep` CLI.
//!
//! - [`api`]: the API's shared state over the store (the transport's `SharedState`), one
//!   module per facade's share of it.
//! - [`driver`]: one task owns the lifecycle core and runs its requests with the store,
//!   streams and data-dir adapters.
//! - [`worker`]: the process that serves the API and runs the driver; restarts into a new
//!   binary by re-executing itself with the listening socket handed over.
//! - [`launcher`]: `lockstepd`'s long-lived supervisor: owns the socket, runs the worker,
//!   watches it (systemd's notification protocol), hands a failed trial back.
//! - [`store`]: which engine holds the shared state (SQLite, or etcd with feature `etcd`).
//! - [`datadir`], [`unpack`]: the data directory laid out as Juju's, and safe unpacking.
//! - [`ha`]: `enable-ha`, more controllers on one machine sharing an etcd store.
//! - [`bootstrap`], [`cli`], [`demo`], [`bundle`], [`status`]: the `lockstep` commands.

pub mod api;
pub mod bootstrap;
pub mod bundle;
pub mod cli;
pub mod datadir;
pub mod demo;
pub mod driver;
pub mod ha;
pub mod launcher;
pub mod logging;
pub mod notify;
pub mod paths;
pub mod quote;
pub mod status;
pub mod steps;
pub mod store;
pub mod unpack;
pub mod worker;
