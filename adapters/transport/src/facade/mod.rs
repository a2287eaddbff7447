//! The facades served, one module each as Juju names them: each method parses its params,
//! calls the [`SharedState`](crate::state::SharedState) or the
//! [`Backend`](crate::backend::Backend), and encodes Juju's answer. The router
//! ([`crate::route`]) asks the gate first and calls them.

pub mod admin;
pub mod agent;
pub mod all_watcher;
pub mod application;
pub mod charms;
pub mod client;
pub mod controller;
pub mod machine_manager;
pub mod machiner;
pub mod model_config;
pub mod model_manager;
pub mod notify_watcher;
pub mod pinger;
pub mod upgrade;
pub mod upgrader;
