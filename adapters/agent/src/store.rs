//! Which engine holds the controllers' shared state: embedded SQLite in the data dir (one
//! controller, the default) or etcd (several controllers, built with the `etcd` feature).
//!
//! The choice is written into `agent.conf` at bootstrap (`store`, `etcd-endpoints`,
//! `etcd-prefix`); `lockstepd --store etcd --etcd-endpoints a,b,c` overrides it for one run.

use std::sync::Arc;

use lockstep_store::Store;
use serde::{Deserialize, Serialize};

use crate::datadir::{AgentConf, DataDir};

/// The store engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    /// `<data>/store.db`, embedded SQLite: one controller.
    #[default]
    Sqlite,
    /// An etcd cluster shared by every controller of the model.
    Etcd,
}

impl StoreEngine {
    pub fn is_sqlite(&self) -> bool {
        *self == StoreEngine::Sqlite
    }
}

/// Where the shared state lives, as `agent.conf` holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreSettings {
    pub engine: StoreEngine,
    /// etcd's client URLs (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// Every key of this controller's state starts with it (`lockstep/<controller-uuid>/`).
    pub etcd_prefix: String,
}

impl StoreSettings {
    /// The settings `conf` holds.
    pub fn of(conf: &AgentConf) -> StoreSettings {
        StoreSettings {
            engine: conf.store,
            etcd_endpoints: conf.etcd_endpoints.clone(),
            etcd_prefix: conf.etcd_prefix.clone(),
        }
    }

    /// etcd for controller `controller_uuid` at `endpoints` (as given on a command line:
    /// comma-separated, with or without `http://`).
    pub fn etcd(endpoints: &[String], controller_uuid: &str) -> Result<StoreSettings, String> {
        Ok(StoreSettings {
            engine: StoreEngine::Etcd,
            etcd_endpoints: parse_endpoints(endpoints)?,
            etcd_prefix: etcd_prefix(controller_uuid),
        })
    }

    /// Writes the settings into `conf`.
    pub fn apply(&self, conf: &mut AgentConf) {
        conf.store = self.engine;
        conf.etcd_endpoints = self.etcd_endpoints.clone();
        conf.etcd_prefix = self.etcd_prefix.clone();
    }

    /// Where the state is, for messages.
    pub fn describe(&self, data: &DataDir) -> String {
        match self.engine {
            StoreEngine::Sqlite => data.store_path().display().to_string(),
            StoreEngine::Etcd => format!(
                "etcd {} under {}",
                self.etcd_endpoints.join(","),
                self.etcd_prefix
            ),
        }
    }
}

/// The prefix of controller `controller_uuid`'s keys in etcd.
pub fn etcd_prefix(controller_uuid: &str) -> String {
    format!("lockstep/{controller_uuid}/")
}

/// Splits comma-separated endpoints, adds `http://` where no scheme is given, and refuses
/// an empty list or an endpoint that is not `host:port`.
pub fn parse_endpoints(given: &[String]) -> Result<Vec<String>, String> {
    let mut endpoints = Vec::new();
    for part in given.iter().flat_map(|text| text.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let url = if part.contains("://") {
            part.to_owned()
        } else {
            format!("http://{part}")
        };
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("etcd endpoint {part:?}: only http:// endpoints are supported")
        })?;
        let port = rest
            .trim_end_matches('/')
            .rsplit_once(':')
            .map(|(_, port)| port);
        if port.and_then(|port| port.parse::<u16>().ok()).is_none() {
            return Err(format!(
                "etcd endpoint {part:?} is not host:port (e.g. 127.0.0.1:2379)"
            ));
        }
        endpoints.push(url.trim_end_matches('/').to_owned());
    }
    if endpoints.is_empty() {
        return Err("--store etcd needs --etcd-endpoints (e.g. 127.0.0.1:2379)".to_owned());
    }
    Ok(endpoints)
}

/// Opens the store the settings name.
pub fn open(data: &DataDir, settings: &StoreSettings) -> Result<Arc<dyn Store>, String> {
    match settings.engine {
        StoreEngine::Sqlite => Ok(Arc::new(
            lockstep_store::SqliteStore::open(
                data.store_path(),
                lockstep_store::OpenMode::ReadWrite,
            )
            .map_err(|e| e.to_string())?,
        )),
        StoreEngine::Etcd => open_etcd(settings),
    }
}

#[cfg(feature = "etcd")]
fn open_etcd(settings: &StoreSettings) -> Result<Arc<dyn Store>, String> {
    if settings.etcd_prefix.is_empty() {
        return Err("agent.conf names store etcd but no etcd-prefix".to_owned());
    }
    let config = lockstep_store::EtcdConfig::new(settings.etcd_endpoints.iter().cloned())
        .with_prefix(settings.etcd_prefix.clone());
    let store = lockstep_store::EtcdStore::connect(config).map_err(|e| {
        format!(
            "cannot reach etcd at {}: {e}",
            settings.etcd_endpoints.join(",")
        )
    })?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "etcd"))]
fn open_etcd(settings: &StoreSettings) -> Result<Arc<dyn Store>, String> {
    Err(format!(
        "the store is etcd ({}), but this lockstep was built without etcd support: \
         build it with `cargo build --release -p lockstep-agent --features etcd` \
         (after .ci/install-etcd, for protoc)",
        settings.etcd_endpoints.join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme_and_are_checked() {
        let given = vec!["127.0.0.1:2379, http://127.0.0.1:2380/".to_owned()];
        assert_eq!(
            parse_endpoints(&given).unwrap(),
            ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        let error = parse_endpoints(&["127.0.0.1".to_owned()]).unwrap_err();
        assert!(error.contains("\"127.0.0.1\" is not host:port"), "{error}");
        let error = parse_endpoints(&["https://e:2379".to_owned()]).unwrap_err();
        assert!(error.contains("only http://"), "{error}");
        let error = parse_endpoints(&[" , ".to_owned()]).unwrap_err();
        assert!(error.contains("needs --etcd-endpoints"), "{error}");
    }
}
