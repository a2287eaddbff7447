//! lockstep-agent's integration tests, one binary: each file of this directory is a module.
//! Most start real `lockstep` and `lockstepd` processes on 127.0.0.1 (`common`), or the API
//! over a real store in process (`api_support`). One binary rather than one per file: each
//! of those linked the whole agent and compiled the harness again, which was a large share
//! of CI's time. Run one file's tests with a filter: `cargo test -p lockstep-agent --test
//! integration e2e::`.
//!
//! `etcd_security` is compiled with the feature `etcd` only, and needs etcd installed
//! (`.ci/install-etcd`). The HA scenarios (`ha.rs`: three etcd members and three controllers
//! each, taking turns) are a binary of their own, so that nothing else runs beside them.

mod api_support;
mod common;
#[cfg(feature = "etcd")]
#[path = "../../store/tests/support/etcd_cluster.rs"]
mod etcd_cluster;

mod api_agents;
mod api_client;
mod api_gate;
mod api_interop;
mod api_juju_facades;
mod api_state;
mod api_tools;
mod architecture;
mod bundle_status;
mod capabilities;
mod client_restarts;
mod datadir;
mod e2e;
#[cfg(feature = "etcd")]
mod etcd_security;
mod front_door;
mod hostile;
mod juju_data;
mod launcher;
mod machine_agents;
mod mirrors;
mod rollouts;
mod signed_metadata;
mod tools_endpoint;
mod unpack_real_tools;
