//! # lockstep-transport
//!
//! lockstep's API as existing Juju clients expect it: JSON-RPC over TLS websockets, with
//! the core's gate asked on every call, so a client is told `upgrade in progress` (Juju's
//! message and code, detail in `error-info`) until the agent is Ready, and a connection
//! opened early becomes full the moment it is.
//!
//! ## Layout
//!
//! - [`wire`]: both generations of Juju's framing, as pure decode/encode functions.
//! - [`tls`]: the controller's CA and server certificate; TLS 1.2 and 1.3 on ring.
//! - [`client`]: lockstep's own client, which retries through upgrades, waits for Ready by
//!   subscription, reconnects and resumes watchers; its decisions are
//!   [`lockstep_core::client`]'s.
//! - [`facades`]: the facades over the store adapter (status, model config, machines,
//!   applications, units, relations, watcher deltas), each honouring `operation-id`.
//! - [`tools`]: agent binaries: `Client.FindTools`'s search of the catalogue and the tools
//!   endpoint's cache, which fetches each binary once however many agents ask at once.
//! - [`server`]: the axum router (websocket endpoints, `/livez`, `/readyz`, `/metrics`, the
//!   tools endpoint), the TLS accept loop, per-connection concurrency, agent logins, and the
//!   facades served.
//!
//! The transport makes no lifecycle decision: it reads the published [`GateView`] and asks
//! [`lockstep_core::gate::admit`].
//!
//! [`GateView`]: lockstep_core::gate::GateView

pub mod client;
pub mod facades;
pub mod server;
pub mod tls;
pub mod tools;
pub mod wire;
