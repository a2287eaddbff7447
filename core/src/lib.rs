//! # lockstep-core
//!
//! The agent lifecycle of lockstep as pure, deterministic logic: the phases an agent passes
//! from "just started" to "fit for work" (Bootstrapping → RunningSteps →
//! CheckingAgentVersion → Upgrading → Ready), the API gate that answers
//! `upgrade in progress` until Ready, and the domain rules those phases apply.
//!
//! **This crate performs no I/O.** It never reads a clock (time arrives as a [`Timestamp`]
//! on every input), never touches the file system or the network, never spawns a thread,
//! never awaits, and never draws a random number (jitter arrives as data). Every counter,
//! queue and retry it keeps is bounded, so its whole reachable state space can be explored
//! by a model checker. Drivers (the lockstep agent, a simulator, an embedding daemon) do
//! the I/O that the core asks for and feed the results back.
//!
//! ## Layout
//!
//! - [`version`]: Juju's version grammar and ordering: `2.9.43`, `1.25-beta1`,
//!   `2.9.43.1`, binaries `2.9.43-ubuntu-amd64`.
//! - [`client`]: what an API client decides: retries with capped, jittered backoff until
//!   a deadline, reconnects, which controller address to connect to next, where a watcher
//!   resumes, `operation-id`s. Driven by the tokio
//!   client and by the simulator alike.
//! - [`phase`]: the observable phases and progress.
//! - [`role`]: machine roles (controller, host-machine).
//! - [`policy`]: the upgrade policy (off, auto-patch at bootstrap, pinned, local binary),
//!   agent streams and their fallbacks, selection from a catalogue, the catalogue entry
//!   that serves a binary, and the rollback high-water mark.
//! - [`steps`]: the upgrade-step registry an embedder supplies, and the plan for
//!   upgraded-to → running version and this agent's roles.
//! - [`gate`]: which API calls are admitted in which phase, and the exact rejection.
//! - [`jobs`]: roles × environment capabilities → the jobs the API reports.
//! - [`upgrader`]: the Upgrader facade's decisions: the version an agent should run
//!   (controllers first, from the binaries they reported) and whether the model's
//!   `agent-version` may change (checked by the store inside its write transaction).
//! - [`rollout`]: staged rollouts of machine agents: canaries first, at most so many at
//!   once, halted past so many failures; resume and abort.
//! - [`lifecycle`]: the statig machine that takes an agent through the phases, driven by
//!   `handle` / `handle_timeout` / `poll_output` / `poll_timeout`.
//! - [`time`]: [`Timestamp`] and [`Millis`].
//! - `testkit` (feature `testkit`): a deterministic in-memory world of stores, catalogues
//!   and crashing hosts that drives real lifecycles; shared by the explorer, the property
//!   tests, the benchmark and the example.
//!
//! ## What an embedder relies on
//!
//! Every public item is documented (`missing_docs` is denied). The API names no type of
//! lockstep's adapters: an embedder brings its own store, transport and binaries, and
//! answers the [`Request`]s of [`Lifecycle::poll_output`] with [`Input`]s; a completion
//! whose id is not awaited is ignored. The lifecycle asserts its invariants
//! (`spec/invariants.md`) where it makes each transition, in every build: a failed
//! assertion is a panic naming the invariant, never a silent corruption of the upgrade. A
//! driver that leaves more than [`lifecycle::OUTPUTS_MAX`] outputs undrained meets one too.
//! `examples/controller.rs` is the full driver; `examples/embedded.rs` embeds the core in a
//! small daemon with its own upgrade step and capability table.

#![deny(missing_docs)]

pub mod client;
pub mod gate;
pub mod jobs;
pub mod lifecycle;
pub mod phase;
pub mod policy;
pub mod restart;
pub mod role;
pub mod rollout;
pub mod steps;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod time;
pub mod upgrader;
pub mod version;

pub use lifecycle::{Input, Lifecycle, Output, Request};
pub use phase::{Phase, Progress};
pub use role::{Role, Roles};
pub use time::{Millis, Timestamp};
pub use version::{Binary, ParseVersionError, Version};
