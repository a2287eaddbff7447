//! # lockstep-transport
//!
//! lockstep's API as existing Juju clients expect it: JSON-RPC over TLS websockets, with
//! the core's gate asked on every call, so a client is told `upgrade in progress` (Juju's
//! message and code, detail in `error-info`) until the agent is Ready, and a connection
//! opened early becomes full the moment it is.
//!
//! The transport holds no state of the controller and depends on no store: it reaches the
//! shared state through [`state::SharedState`] and the lifecycle through
//! [`backend::Backend`], two traits it defines and the agent implements.
//!
//! ## Layout
//!
//! The wire and lockstep's client:
//! - [`wire`]: both generations of Juju's framing, as pure decode/encode functions; the
//!   advertised API level ([`wire::SERVER_VERSION`]).
//! - [`tls`]: the controller's CA and server certificate; TLS 1.2 and 1.3 on ring.
//! - [`relay`]: the protocol by which the launcher hands the clients' connections to
//!   the current worker (`spec/relay.md`): messages, bounds, version negotiation, the
//!   operation-id stamp. Pure.
//! - [`front`]: the launcher's side of it: one client connection held across every
//!   restart of the worker, its unanswered calls sent again to the next one, and calls
//!   between two workers decided by the core's gate; plain HTTP requests relayed.
//! - [`relayed`]: the worker's side of it: connections the launcher holds, served over a
//!   unix socket, their logins and watchers carried over from the previous worker.
//! - [`pipes`]: relay version 2's hand-over of a connection's two pipes from the worker to
//!   the launcher (`SCM_RIGHTS` on the relay socket).
//! - [`client`]: lockstep's own client, which retries through upgrades, waits for Ready by
//!   subscription, reconnects and resumes watchers; its decisions are
//!   [`lockstep_core::client`]'s.
//!
//! What the server needs from others:
//! - [`state`]: [`state::SharedState`], the controller's shared state, one method per state
//!   call served (the agent implements it over the store).
//! - [`backend`]: [`backend::Backend`], the lifecycle's side (own version, catalogue,
//!   abort, status detail).
//!
//! The server, from the socket inwards:
//! - [`server`]: the axum router and the TLS accept loop.
//! - [`connection`]: one websocket connection, its requests served concurrently.
//! - [`route`]: one request: the gate, the login's facades, the call.
//! - [`served`]: the facades served and which a login may call.
//! - [`auth`]: logins and password hashing.
//! - [`admission`]: the connections held, their slots before and after login, what each
//!   may read before login and hold in unwritten replies; [`limits`] names every bound.
//! - [`logins`]: the login pool (password checks on threads of their own, in turn across
//!   source addresses) and the failed-login throttle.
//! - [`session`]: one connection's login and its watchers.
//! - [`facade`]: one module per facade (Admin, AllWatcher, Application, Charms, Client,
//!   Controller, MachineManager, ModelConfig, ModelManager, Pinger, Upgrade, Upgrader):
//!   parse, call the state or the backend, encode.
//! - [`probes`]: `/livez`, `/readyz`, `/metrics`.
//! - [`charm`], [`charms_endpoint`]: a local charm's metadata read from its uploaded zip
//!   archive, and `POST /model/<uuid>/charms`, which records it.
//! - [`tools`], [`tools_endpoint`]: the catalogue's search (`Client.FindTools`,
//!   `Upgrader.Tools`) and the endpoint that serves agent binaries from a cache, fetching
//!   each once however many agents ask at once.
//! - [`api`]: what every connection shares.
//! - [`hold`]: what an HTTP connection keeps until it ends (a machine agent's download
//!   slot past the last byte, the launcher's relay stream for it).
//!
//! A module uses only modules to its right in this chain (within parentheses, only those
//! after it), so there is no import circle: (`front`, `relayed`) → `server` →
//! `connection` → `route` → `facade` → (`charms_endpoint`, `auth` → `api` → `session`) →
//! (`logins`, `tools_endpoint` → (`tools`, `hold`), `probes`, `served`) → `admission` → `limits` →
//! (`state` → `charm`, `backend`) → `wire`; `client` uses `tls` and `wire` only; `relay`
//! uses `wire` only, `pipes` uses `relay` only, and only `front` and `relayed` use `relay`
//! and `pipes`.
//!
//! The transport makes no lifecycle decision: it reads the published [`GateView`] and asks
//! [`lockstep_core::gate::admit`].
//!
//! [`GateView`]: lockstep_core::gate::GateView

pub mod admission;
pub mod api;
pub mod auth;
pub mod backend;
pub mod charm;
pub mod charms_endpoint;
pub mod client;
pub mod connection;
pub mod facade;
pub mod front;
pub mod hold;
pub mod journal;
pub mod lease;
pub mod leased;
pub mod limits;
pub mod logins;
pub mod pipes;
pub mod probes;
pub mod records;
pub mod relay;
pub mod relayed;
pub mod route;
pub mod served;
pub mod server;
pub mod session;
pub mod state;
pub mod threads;
pub mod tls;
pub mod tools;
pub mod tools_endpoint;
pub mod wire;
