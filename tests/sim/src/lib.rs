//! # lockstep-sim
//!
//! Deterministic simulation of lockstep controllers, machine agents and clients together
//! (issue 9), after FoundationDB's simulation and TigerBeetle's VOPR: one `u64` seed
//! chooses a whole scenario, which runs on virtual time in one thread against real
//! `lockstep_core::Lifecycle`s and a real `lockstep_store::MemoryStore`, with faults,
//! while independent checkers watch every invariant.
//!
//! ## Layout
//!
//! - [`rng`]: the seeded generator (xoshiro256**), the run's only randomness.
//! - [`scenario`]: seed → [`Scenario`] (swarm testing), and the [`Overrides`] that narrow
//!   it for shrinking and reproduce commands.
//! - [`sim`]: one run ([`run`]): the [`sim::Sim`] that ties the parties together, each
//!   party a module of its own:
//!   - `sim::queue`: the event queue and virtual time (host clocks, the store's clock);
//!   - `sim::network`: parties, messages, latency, loss, duplication, delay, partitions;
//!   - `sim::host`: controllers and machine agents, each a real `Lifecycle` in a process
//!     that boots, crashes and restarts into another binary, with its disk and timers;
//!   - `sim::driver`: what a process's driver does with its core's requests (store,
//!     stream, a controller's API), retried with `lockstep_core::client::Call`;
//!   - `sim::store`: the store executor, requests run against a real
//!     `lockstep_store::MemoryStore`, and its log read back for the checkers;
//!   - `sim::stream`: the agent-binary stream and the streams adapter's guard;
//!   - `sim::api`: each controller's API server, agent and client calls through the
//!     core's gate, answered with the core's decisions;
//!   - `sim::client`: deployers, watchers and pollers driven by `lockstep_core::client`;
//!   - `sim::operator`: `upgrade-controller`, abort, and the healing rounds;
//!   - `sim::outcome`: checkers fed, the first failure, the liveness goal.
//!   - `sim::links`: a fleet run's link model: controllers' egress shared among the
//!     downloads they serve, each agent's own link, the upstream fetch, the core's
//!     download admission and busy backoff;
//!   - `sim::rollout`: a fleet run's staged rollout: the coordinator's `advance` on the
//!     store's record under its lease, the agents' health from their status reports.
//! - [`fleet`]: fleet upgrades (issue 21): 3 controllers and thousands of agents, and the
//!   ratio of the upgrade time to the bandwidth bound.
//! - [`checkers`]: one object per invariant, fed every observation.
//! - [`trace`]: the trace hash, the readable trace, the SVG swimlane.
//! - [`sweep`]: many seeds, the determinism self-check, shrinking, failure reports.
//! - [`model`]: stateright models of the HA coordination (over the real core, through
//!   `lockstep_core::testkit`) and of the client's watch-resume protocol.
//!
//! Like the core, the simulator reads no clock and draws no random number of the system:
//! wall time is measured only by [`sweep`] for its summary.

pub mod checkers;
pub mod fleet;
pub mod model;
pub mod rng;
pub mod scenario;
pub mod sim;
pub mod sweep;
pub mod trace;

pub use scenario::{Caps, FaultKind, Overrides, Scenario};
pub use sim::{Failure, FailureKind, Report, RunOptions, run};

/// `1h02m03.004s`-style virtual time (the timeline's format).
pub use lockstep_timeline::format_ms;
