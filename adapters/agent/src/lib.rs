//! lockstep's agent: the `lockstepd` daemon and the `lockstep` CLI, two parts of one crate
//! that share what describes a controller on disk.
//!
//! - [`daemon`]: `lockstepd` (launcher, worker, driver, step runner).
//! - [`cli`]: `lockstep` (bootstrap, the commands, enable-ha, bundles, status, demo).
//! - [`api`]: the API's shared state over the store (the transport's `SharedState`), one
//!   module per facade's share of it; the daemon serves it.
//!
//! Shared by both:
//!
//! - [`datadir`]: the data directory laid out as Juju's, `agent.conf` and the other files,
//!   installed binaries; every file replaced atomically ([`lockstep_fs`]).
//! - [`store`]: which engine holds the shared state (SQLite, or etcd with feature `etcd`),
//!   from `agent.conf` and the flags; `open`.
//! - [`metadata`]: the model's agent-binary metadata source (directory or HTTP mirror).
//! - [`notify`]: both ends of systemd's notification protocol: the worker tells the
//!   launcher, the launcher tells systemd, or `lockstep bootstrap`, which waits on it.
//! - [`local_provider`]: machine agents started on the controller's host (by `add-machine`
//!   or by the controller's provisioner).
//! - [`steps`]: the steps this build carries and the versions it plays (N, N+1).
//! - [`unpack`]: flat, regular-file-only agent tarballs, packed and unpacked.
//! - [`paths`], [`logging`], [`process`], [`quote`]: default locations, log formats and
//!   output lines, processes and signals, quoting offending values.
//!
//! **Architecture Invariant:** no import circles: no module `use`s one that `use`s it
//! back, and neither `daemon` nor `cli` imports the other (`tests/architecture.rs`).

pub mod api;
pub mod cli;
pub mod daemon;
pub mod datadir;
pub mod local_provider;
pub mod logging;
pub mod metadata;
pub mod notify;
pub mod paths;
pub mod process;
pub mod quote;
pub mod steps;
pub mod store;
pub mod unpack;
