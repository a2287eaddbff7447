//! `lockstep`: the operator's command line, Juju's verbs and flags where they exist. It
//! prepares data directories and starts `lockstepd`, then talks to controllers only through
//! their API (lockstep-transport's client), as Juju's client does.
//!
//! - [`bootstrap`]: prepare a controller's data dir, start `lockstepd`, wait for Ready.
//! - [`commands`]: the commands against a running controller (`status`, `deploy`,
//!   `add-machine`, `watch`, `upgrade-controller`, `abort-upgrade`, `kill-controller`,
//!   `metadata generate-agent-binaries [--sign-key]`, `metadata generate-key`) and the
//!   session they share.
//! - [`ha`]: `enable-ha`, more controllers beside the first sharing its etcd store.
//! - [`bundle`]: Juju bundles (parse, validate, plan).
//! - [`status`]: `FullStatus` rendered as Juju renders it (tabular, YAML, JSON).
//! - [`demo`]: `lockstep demo`, the seed's scenario with its claims computed.
//! - [`juju_data`]: Juju's client store (`controllers.yaml`, `models.yaml`, `accounts.yaml`
//!   under `$JUJU_DATA`), written by bootstrap and read by `-c NAME`.
//! - [`error`]: [`CliError`](error::CliError), every command's failure, typed until the
//!   binary prints it.
//!
//! **Architecture Invariant:** nothing here imports [`crate::daemon`]: the CLI reaches a
//! controller's state through its API, and its data directory through the shared
//! [`crate::datadir`] and [`crate::store`] (at bootstrap, before the daemon runs).

pub mod bootstrap;
pub mod bundle;
pub mod commands;
pub mod demo;
pub mod error;
pub mod ha;
pub mod juju_data;
pub mod machines;
pub mod status;
