//! Which engine holds the controllers' shared state: embedded SQLite in the data dir (one
//! controller, the default) or etcd (several controllers, built with the `etcd` feature).
//!
//! The choice is written into `agent.conf` at bootstrap (`store`, `etcd-endpoints`,
//! `etcd-prefix`, and for TLS `etcd-cacert`, `etcd-cert`, `etcd-key`, as etcdctl names
//! them); `lockstepd --store etcd --etcd-endpoints a,b,c` overrides it for one run.

use std::path::PathBuf;
use std::sync::Arc;

use lockstep_store::StoreError;

use lockstep_store::Store;

pub use crate::datadir::StoreEngine;
use crate::datadir::{AgentConf, DataDir};
use crate::quote::quote;

/// Why the store's settings are refused or the store cannot be opened. Each names the flag
/// (or `agent.conf` key), the value, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreSetupError {
    #[error("--etcd-cert and --etcd-key need --etcd-cacert (the CA of etcd's members)")]
    CertificateWithoutCa,
    #[error("--etcd-cert needs --etcd-key (its private key)")]
    CertificateWithoutKey,
    #[error("--etcd-key needs --etcd-cert (its certificate)")]
    KeyWithoutCertificate,
    #[error("{}: {error}", path.display())]
    Absolute {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error(
        "etcd endpoint {}: with --etcd-cacert the endpoints are https:// (TLS), not plain",
        quote(endpoint)
    )]
    PlainEndpointWithTls { endpoint: String },
    #[error(
        "etcd endpoint {} is https://: give --etcd-cacert (the CA of etcd's members), and \
         --etcd-cert/--etcd-key if it asks for a client certificate",
        quote(endpoint)
    )]
    TlsEndpointWithoutCa { endpoint: String },
    #[error(
        "etcd endpoint {}: only http:// and https:// are supported",
        quote(endpoint)
    )]
    UnsupportedScheme { endpoint: String },
    #[error(
        "etcd endpoint {} is not host:port (e.g. 127.0.0.1:2379)",
        quote(endpoint)
    )]
    NotHostPort { endpoint: String },
    #[error("--store etcd needs --etcd-endpoints (e.g. 127.0.0.1:2379)")]
    NoEndpoints,
    #[error(
        "agent.conf names store etcd but no etcd-prefix; set etcd-prefix: lockstep/<controller-uuid>/"
    )]
    NoPrefix,
    #[error("cannot open the SQLite store {}: {error}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        error: StoreError,
    },
    #[error("cannot reach etcd at {endpoints}: {error}")]
    EtcdUnreachable {
        endpoints: String,
        #[source]
        error: StoreError,
    },
    #[error("cannot read etcd's {what} {}: {error}", path.display())]
    EtcdTlsFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error(
        "the store is etcd ({endpoints}), but this lockstep was built without etcd support: \
         build it with `cargo build --release -p lockstep-agent --features etcd` (after \
         .ci/install-etcd, for protoc)"
    )]
    EtcdNotBuilt { endpoints: String },
}

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
    pub fn checked(self) -> Result<EtcdTlsFiles, StoreSetupError> {
        match (&self.cacert, &self.cert, &self.key) {
            (None, None, None) => return Ok(self),
            (None, _, _) => return Err(StoreSetupError::CertificateWithoutCa),
            (Some(_), Some(_), None) => return Err(StoreSetupError::CertificateWithoutKey),
            (Some(_), None, Some(_)) => return Err(StoreSetupError::KeyWithoutCertificate),
            _ => {}
        }
        let absolute = |path: Option<PathBuf>| -> Result<Option<PathBuf>, StoreSetupError> {
            path.map(|path| {
                std::path::absolute(&path)
                    .map_err(|error| StoreSetupError::Absolute { path, error })
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
    ) -> Result<StoreSettings, StoreSetupError> {
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
pub fn parse_endpoints(given: &[String], tls: bool) -> Result<Vec<String>, StoreSetupError> {
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
            let endpoint = part.to_owned();
            if tls {
                StoreSetupError::PlainEndpointWithTls { endpoint }
            } else if url.starts_with("https://") {
                StoreSetupError::TlsEndpointWithoutCa { endpoint }
            } else {
                StoreSetupError::UnsupportedScheme { endpoint }
            }
        })?;
        let port = rest
            .trim_end_matches('/')
            .rsplit_once(':')
            .map(|(_, port)| port);
        if port.and_then(|port| port.parse::<u16>().ok()).is_none() {
            return Err(StoreSetupError::NotHostPort {
                endpoint: part.to_owned(),
            });
        }
        endpoints.push(url.trim_end_matches('/').to_owned());
    }
    if endpoints.is_empty() {
        return Err(StoreSetupError::NoEndpoints);
    }
    Ok(endpoints)
}

/// Opens the store the settings name.
pub fn open(data: &DataDir, settings: &StoreSettings) -> Result<Arc<dyn Store>, StoreSetupError> {
    match settings.engine {
        StoreEngine::Sqlite => {
            let path = data.store_path();
            let store =
                lockstep_store::SqliteStore::open(&path, lockstep_store::OpenMode::ReadWrite)
                    .map_err(|error| StoreSetupError::Sqlite { path, error })?;
            Ok(Arc::new(store))
        }
        StoreEngine::Etcd => open_etcd(settings),
    }
}

#[cfg(feature = "etcd")]
fn open_etcd(settings: &StoreSettings) -> Result<Arc<dyn Store>, StoreSetupError> {
    if settings.etcd_prefix.is_empty() {
        return Err(StoreSetupError::NoPrefix);
    }
    let mut config = lockstep_store::EtcdConfig::new(settings.etcd_endpoints.iter().cloned())
        .with_prefix(settings.etcd_prefix.clone());
    config.tls = etcd_tls(&settings.etcd_tls)?;
    let store = lockstep_store::EtcdStore::connect(config).map_err(|error| {
        StoreSetupError::EtcdUnreachable {
            endpoints: settings.etcd_endpoints.join(","),
            error,
        }
    })?;
    Ok(Arc::new(store))
}

/// Reads the PEM files of TLS to etcd; an error names the file.
#[cfg(feature = "etcd")]
fn etcd_tls(files: &EtcdTlsFiles) -> Result<Option<lockstep_store::EtcdTls>, StoreSetupError> {
    let Some(cacert) = &files.cacert else {
        return Ok(None);
    };
    let read = |path: &std::path::Path, what: &'static str| {
        std::fs::read_to_string(path).map_err(|error| StoreSetupError::EtcdTlsFile {
            what,
            path: path.to_path_buf(),
            error,
        })
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
fn open_etcd(settings: &StoreSettings) -> Result<Arc<dyn Store>, StoreSetupError> {
    Err(StoreSetupError::EtcdNotBuilt {
        endpoints: settings.etcd_endpoints.join(","),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error `parse_endpoints` gives for one endpoint, and its message.
    fn refused(endpoint: &str, tls: bool) -> (StoreSetupError, String) {
        let error = parse_endpoints(&[endpoint.to_owned()], tls).unwrap_err();
        let message = error.to_string();
        (error, message)
    }

    #[test]
    fn endpoints_get_a_scheme_and_are_checked() {
        let given = vec!["127.0.0.1:2379, http://127.0.0.1:2380/".to_owned()];
        assert_eq!(
            parse_endpoints(&given, false).unwrap(),
            ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]
        );
        let (error, message) = refused("127.0.0.1", false);
        assert!(
            matches!(&error, StoreSetupError::NotHostPort { endpoint } if endpoint == "127.0.0.1"),
            "{error:?}"
        );
        assert!(
            message.contains("\"127.0.0.1\" is not host:port"),
            "{message}"
        );
        let (error, message) = refused("https://e:2379", false);
        assert!(
            matches!(&error, StoreSetupError::TlsEndpointWithoutCa { endpoint } if endpoint == "https://e:2379"),
            "{error:?}"
        );
        assert!(message.contains("give --etcd-cacert"), "{message}");
        let (error, message) = refused("ftp://e:2379", false);
        assert!(
            matches!(&error, StoreSetupError::UnsupportedScheme { endpoint } if endpoint == "ftp://e:2379"),
            "{error:?}"
        );
        assert!(message.contains("only http:// and https://"), "{message}");
        let (error, message) = refused(" , ", false);
        assert!(matches!(error, StoreSetupError::NoEndpoints), "{error:?}");
        assert!(message.contains("needs --etcd-endpoints"), "{message}");
    }

    #[test]
    fn with_tls_endpoints_are_https_and_the_files_go_together() {
        let given = vec!["127.0.0.1:2379,https://127.0.0.1:2380".to_owned()];
        assert_eq!(
            parse_endpoints(&given, true).unwrap(),
            ["https://127.0.0.1:2379", "https://127.0.0.1:2380"]
        );
        let (error, message) = refused("http://e:2379", true);
        assert!(
            matches!(&error, StoreSetupError::PlainEndpointWithTls { endpoint } if endpoint == "http://e:2379"),
            "{error:?}"
        );
        assert!(
            message.contains("\"http://e:2379\"") && message.contains("https://"),
            "{message}"
        );

        let file = |name: &str| Some(PathBuf::from(name));
        let error = EtcdTlsFiles {
            cacert: None,
            cert: file("c.pem"),
            key: file("k.pem"),
        }
        .checked()
        .unwrap_err();
        assert!(
            matches!(error, StoreSetupError::CertificateWithoutCa),
            "{error:?}"
        );
        assert!(error.to_string().contains("need --etcd-cacert"), "{error}");
        let error = EtcdTlsFiles {
            cacert: file("ca.pem"),
            cert: file("c.pem"),
            key: None,
        }
        .checked()
        .unwrap_err();
        assert!(
            matches!(error, StoreSetupError::CertificateWithoutKey),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("--etcd-cert needs --etcd-key"),
            "{error}"
        );
        let error = EtcdTlsFiles {
            cacert: file("ca.pem"),
            cert: None,
            key: file("k.pem"),
        }
        .checked()
        .unwrap_err();
        assert!(
            matches!(error, StoreSetupError::KeyWithoutCertificate),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("--etcd-key needs --etcd-cert"),
            "{error}"
        );
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
