//! Which engine holds the controllers' shared state: embedded SQLite in the data dir (one
//! controller, the default) or etcd (several controllers, built with the `etcd` feature).
//!
//! The choice is written into `agent.conf` at bootstrap (`store`, `etcd-endpoints`,
//! `etcd-prefix`, and for TLS `etcd-cacert`, `etcd-cert`, `etcd-key`, as etcdctl names
//! them); `lockstepd --store etcd --etcd-endpoints a,b,c` overrides it for one run.

use std::path::PathBuf;
use std::sync::Arc;

use lockstep_store::Store;

pub use crate::datadir::StoreEngine;
use crate::datadir::{AgentConf, DataDir};

/// Where the shared state lives, as `agent.conf` holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreSettings {
    pub engine: StoreEngine,
    /// etcd's client URLs (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// Every key of this controller's state starts with it (`lockstep/<controller-uuid>/`).
    pub etcd_prefix: String,
    /// TLS to etcd, when the endpoints are `https://`.
    pub etcd_tls: EtcdTlsFiles,
}

/// The PEM files of TLS to etcd, as etcdctl's `--cacert`, `--cert` and `--key`: the CA that
/// signed the members' certificates, and this controller's client certificate and key for
/// a cluster that asks for one (`--client-cert-auth`). Paths, read at each start, so that a
/// certificate renewed in place is used from the next start on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl EtcdTlsFiles {
    /// Checks the combination and makes the paths absolute (the daemon runs elsewhere):
    /// a client certificate needs its key and the CA; the key needs the certificate.
    pub fn checked(self) -> Result<EtcdTlsFiles, String> {
        match (&self.cacert, &self.cert, &self.key) {
            (None, None, None) => return Ok(self),
            (None, _, _) => {
                return Err(
                    "--etcd-cert and --etcd-key need --etcd-cacert (the CA of etcd's members)"
                        .to_owned(),
                );
            }
            (Some(_), Some(_), None) => {
                return Err("--etcd-cert needs --etcd-key (its private key)".to_owned());
            }
            (Some(_), None, Some(_)) => {
                return Err("--etcd-key needs --etcd-cert (its certificate)".to_owned());
            }
            _ => {}
        }
        let absolute = |path: Option<PathBuf>| -> Result<Option<PathBuf>, String> {
            path.map(|path| {
                std::path::absolute(&path).map_err(|e| format!("{}: {e}", path.display()))
            })
            .transpose()
        };
        Ok(EtcdTlsFiles {
            cacert: absolute(self.cacert)?,
            cert: absolute(self.cert)?,
            key: absolute(self.key)?,
        })
    }

    pub fn is_tls(&self) -> bool {
        self.cacert.is_some()
    }
}

impl StoreSettings {
    /// The settings `conf` holds.
    pub fn of(conf: &AgentConf) -> StoreSettings {
        StoreSettings {
            engine: conf.store,
            etcd_endpoints: conf.etcd_endpoints.clone(),
            etcd_prefix: conf.etcd_prefix.clone(),
            etcd_tls: EtcdTlsFiles {
                cacert: conf.etcd_cacert.clone(),
                cert: conf.etcd_cert.clone(),
                key: conf.etcd_key.clone(),
            },
        }
    }

    /// etcd for controller `controller_uuid` at `endpoints` (as given on a command line:
    /// comma-separated, with or without a scheme), over TLS when `tls` names a CA.
    pub fn etcd(
        endpoints: &[String],
        tls: EtcdTlsFiles,
        controller_uuid: &str,
    ) -> Result<StoreSettings, String> {
        let tls = tls.checked()?;
        Ok(StoreSettings {
            engine: StoreEngine::Etcd,
            etcd_endpoints: parse_endpoints(endpoints, tls.is_tls())?,
            etcd_prefix: etcd_prefix(controller_uuid),
            etcd_tls: tls,
        })
    }

    /// Writes the settings into `conf`.
    pub fn apply(&self, conf: &mut AgentConf) {
        conf.store = self.engine;
        conf.etcd_endpoints = self.etcd_endpoints.clone();
        conf.etcd_prefix = self.etcd_prefix.clone();
        conf.etcd_cacert = self.etcd_tls.cacert.clone();
        conf.etcd_cert = self.etcd_tls.cert.clone();
        conf.etcd_key = self.etcd_tls.key.clone();
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

/// Splits comma-separated endpoints, adds the scheme where none is given (`https://` with
/// TLS, else `http://`), and refuses an empty list, an endpoint that is not `host:port`, and
/// a scheme that does not match (`http://` with TLS files, `https://` without a CA).
pub fn parse_endpoints(given: &[String], tls: bool) -> Result<Vec<String>, String> {
    let scheme = if tls { "https://" } else { "http://" };
    let mut endpoints = Vec::new();
    for part in given.iter().flat_map(|text| text.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let url = if part.contains("://") {
            part.to_owned()
        } else {
            format!("{scheme}{part}")
        };
        let rest = url.strip_prefix(scheme).ok_or_else(|| {
            if tls {
                format!(
                    "etcd endpoint {part:?}: with --etcd-cacert the endpoints are https:// \
                     (TLS), not plain"
                )
            } else if url.starts_with("https://") {
                format!(
                    "etcd endpoint {part:?} is https://: give --etcd-cacert (the CA of \
                     etcd's members), and --etcd-cert/--etcd-key if it asks for a client \
                     certificate"
                )
            } else {
                format!("etcd endpoint {part:?}: only http:// and https:// are supported")
            }
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
    let mut config = lockstep_store::EtcdConfig::new(settings.etcd_endpoints.iter().cloned())
        .with_prefix(settings.etcd_prefix.clone());
    config.tls = etcd_tls(&settings.etcd_tls)?;
    let store = lockstep_store::EtcdStore::connect(config).map_err(|e| {
        format!(
            "cannot reach etcd at {}: {e}",
            settings.etcd_endpoints.join(",")
        )
    })?;
    Ok(Arc::new(store))
}

/// Reads the PEM files of TLS to etcd; an error names the file.
#[cfg(feature = "etcd")]
fn etcd_tls(files: &EtcdTlsFiles) -> Result<Option<lockstep_store::EtcdTls>, String> {
    let Some(cacert) = &files.cacert else {
        return Ok(None);
    };
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read etcd's {what} {}: {e}", path.display()))
    };
    let identity = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some(lockstep_store::EtcdIdentity {
            cert_pem: read(cert, "client certificate (etcd-cert)")?,
            key_pem: read(key, "client key (etcd-key)")?,
        }),
        _ => None,
    };
    Ok(Some(lockstep_store::EtcdTls {
        ca_pem: read(cacert, "CA certificate (etcd-cacert)")?,
        identity,
    }))
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
            parse_endpoints(&given, false).unwrap(),
            ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        let error = parse_endpoints(&["127.0.0.1".to_owned()], false).unwrap_err();
        assert!(error.contains("\"127.0.0.1\" is not host:port"), "{error}");
        let error = parse_endpoints(&["https://e:2379".to_owned()], false).unwrap_err();
        assert!(error.contains("give --etcd-cacert"), "{error}");
        let error = parse_endpoints(&["ftp://e:2379".to_owned()], false).unwrap_err();
        assert!(error.contains("only http:// and https://"), "{error}");
        let error = parse_endpoints(&[" , ".to_owned()], false).unwrap_err();
        assert!(error.contains("needs --etcd-endpoints"), "{error}");
    }

    #[test]
    fn with_tls_endpoints_are_https_and_the_files_go_together() {
        let given = vec!["127.0.0.1:2379,https://127.0.0.1:2380".to_owned()];
        assert_eq!(
            parse_endpoints(&given, true).unwrap(),
            ["https://127.0.0.1:2379", "https://127.0.0.1:2380"]
        );
        let error = parse_endpoints(&["http://e:2379".to_owned()], true).unwrap_err();
        assert!(
            error.contains("\"http://e:2379\"") && error.contains("https://"),
            "{error}"
        );

        let file = |name: &str| Some(PathBuf::from(name));
        let error = EtcdTlsFiles {
            cacert: None,
            cert: file("c.pem"),
            key: file("k.pem"),
        }
        .checked()
        .unwrap_err();
        assert!(error.contains("need --etcd-cacert"), "{error}");
        let error = EtcdTlsFiles {
            cacert: file("ca.pem"),
            cert: file("c.pem"),
            key: None,
        }
        .checked()
        .unwrap_err();
        assert!(error.contains("--etcd-cert needs --etcd-key"), "{error}");
        let error = EtcdTlsFiles {
            cacert: file("ca.pem"),
            cert: None,
            key: file("k.pem"),
        }
        .checked()
        .unwrap_err();
        assert!(error.contains("--etcd-key needs --etcd-cert"), "{error}");
        let checked = EtcdTlsFiles {
            cacert: file("ca.pem"),
            cert: None,
            key: None,
        }
        .checked()
        .unwrap();
        assert!(checked.cacert.unwrap().is_absolute());
        let settings = StoreSettings::etcd(
            &["127.0.0.1:2379".to_owned()],
            EtcdTlsFiles {
                cacert: file("/etc/etcd/ca.pem"),
                cert: None,
                key: None,
            },
            "uuid",
        )
        .unwrap();
        assert_eq!(settings.etcd_endpoints, ["https://127.0.0.1:2379"]);
    }
}
