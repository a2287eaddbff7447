//! Which engine holds the controllers' shared state: embedded SQLite in the data dir (one
//! controller, the default) or etcd (several controllers, built with the `etcd` feature).
//!
//! The choice is written into `agent.conf` at bootstrap (`store`, `etcd-endpoints`,
//! `etcd-prefix`, for TLS `etcd-cacert`, `etcd-cert`, `etcd-key`, as etcdctl names them,
//! for etcd's user authentication `etcd-user` and `etcd-password-file`, and
//! `etcd-insecure`); `lockstepd --store etcd --etcd-endpoints a,b,c [--etcd-insecure]`
//! overrides it for one run.
//!
//! **Plain http stays on this machine.** Whoever can write the store can change the
//! model's `agent-metadata-url`. An endpoint spoken to in plain http whose host is not
//! loopback (`127.0.0.0/8`, `::1`, `localhost`; [`lockstep_store::endpoint`]'s rule) is
//! refused, naming it and `--etcd-insecure`, before anything connects: by bootstrap, by the
//! launcher and the worker at every start, and by every open ([`StoreSettings::check`]).
//! `--etcd-insecure` accepts it; it is recorded in `agent.conf`, warned about at every
//! start and shown by `lockstep status` ([`StoreSettings::access`]).
//!
//! **The password stays in the operator's file.** `agent.conf` holds the user's name and
//! the path of its password file, never the password; the file is read at every open, and
//! refused unless it is a regular file owned by the user running lockstep with no access
//! for group or others (0600 or stricter), so that a password rotated in place is used
//! from the next start on, as the TLS files are.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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
    #[error("--etcd-user needs --etcd-password-file (a file holding its password, mode 0600)")]
    UserWithoutPasswordFile,
    #[error("--etcd-password-file needs --etcd-user (the etcd user whose password it holds)")]
    PasswordFileWithoutUser,
    #[error(
        "etcd user {}: a user name is not empty and holds no control characters",
        quote(user)
    )]
    BadUserName { user: String },
    #[error(
        "etcd endpoint {} is plain http to a host that is not loopback: whoever is on the \
         network between can read the controllers' state and change it, agent-metadata-url \
         included. Use https:// with --etcd-cacert, or accept the risk with --etcd-insecure",
        quote(endpoint)
    )]
    PlainEndpointOffLoopback { endpoint: String },
    #[error("cannot read etcd's password file {}: {error}", path.display())]
    PasswordFileUnreadable {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error(
        "etcd's password file {} has mode {mode:04o}: it must be readable by its owner only \
         (0600 or stricter); run chmod 600 {}",
        path.display(),
        path.display()
    )]
    PasswordFileMode { path: PathBuf, mode: u32 },
    #[error(
        "etcd's password file {} (mode {mode:04o}) is owned by uid {owner}, not by uid \
         {running} that runs lockstep",
        path.display()
    )]
    PasswordFileOwner {
        path: PathBuf,
        mode: u32,
        owner: u32,
        running: u32,
    },
    #[error("etcd's password file {} is not a regular file", path.display())]
    PasswordFileNotRegular { path: PathBuf },
    #[error(
        "etcd's password file {} is empty, or larger than {PASSWORD_BYTES_MAX} bytes, or not UTF-8",
        path.display()
    )]
    PasswordFileContent { path: PathBuf },
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
    #[error("etcd at {endpoints}: {error}; {}", denied_hint(user.as_deref(), password_file.as_deref()))]
    EtcdDenied {
        endpoints: String,
        user: Option<String>,
        password_file: Option<PathBuf>,
        #[source]
        error: Box<StoreError>,
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

/// The largest password file read.
pub const PASSWORD_BYTES_MAX: u64 = 4096;

/// What to do about a refusal of etcd's authentication, naming the flags.
fn denied_hint(user: Option<&str>, password_file: Option<&Path>) -> String {
    match (user, password_file) {
        (Some(user), Some(file)) => format!(
            "check the user (--etcd-user, agent.conf etcd-user: {}), its password in {} \
             (--etcd-password-file) and its role",
            quote(user),
            file.display()
        ),
        _ => "give --etcd-user NAME and --etcd-password-file FILE (mode 0600) for a user whose \
              role has readwrite on the controller's prefix"
            .to_owned(),
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
    /// TLS to etcd, when the endpoints are `https://`.
    pub etcd_tls: EtcdTlsFiles,
    /// etcd's user authentication: the user and the file holding its password.
    pub etcd_auth: EtcdAuthFiles,
    /// `--etcd-insecure`: plain http to endpoints that are not loopback is accepted.
    pub etcd_insecure: bool,
}

/// etcd's user authentication as `agent.conf` holds it: the user's name and the path of
/// the file holding its password (never the password).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAuthFiles {
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

impl EtcdAuthFiles {
    /// Checks the combination and the name and makes the path absolute: a user needs its
    /// password file and the file its user.
    pub fn checked(self) -> Result<EtcdAuthFiles, StoreSetupError> {
        match (self.user, self.password_file) {
            (None, None) => Ok(EtcdAuthFiles::default()),
            (Some(_), None) => Err(StoreSetupError::UserWithoutPasswordFile),
            (None, Some(_)) => Err(StoreSetupError::PasswordFileWithoutUser),
            (Some(user), Some(path)) => {
                if user.is_empty() || user.chars().any(char::is_control) {
                    return Err(StoreSetupError::BadUserName { user });
                }
                let path = std::path::absolute(&path)
                    .map_err(|error| StoreSetupError::Absolute { path, error })?;
                Ok(EtcdAuthFiles {
                    user: Some(user),
                    password_file: Some(path),
                })
            }
        }
    }
}

/// Reads etcd's password from `path`: a regular file owned by the user running this
/// process, with no access for group or others, holding at most [`PASSWORD_BYTES_MAX`]
/// bytes of UTF-8; one trailing newline (`echo` writes one) is not part of it. The checks
/// are made on the opened file, so a file swapped in between is not read unchecked.
pub fn read_password_file(path: &Path) -> Result<String, StoreSetupError> {
    let unreadable = |error| StoreSetupError::PasswordFileUnreadable {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let metadata = file.metadata().map_err(unreadable)?;
    if !metadata.is_file() {
        return Err(StoreSetupError::PasswordFileNotRegular {
            path: path.to_path_buf(),
        });
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(StoreSetupError::PasswordFileMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    let running = rustix::process::geteuid().as_raw();
    if metadata.uid() != running {
        return Err(StoreSetupError::PasswordFileOwner {
            path: path.to_path_buf(),
            mode,
            owner: metadata.uid(),
            running,
        });
    }
    let mut bytes = Vec::new();
    file.take(PASSWORD_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    let content = || StoreSetupError::PasswordFileContent {
        path: path.to_path_buf(),
    };
    if bytes.len() as u64 > PASSWORD_BYTES_MAX {
        return Err(content());
    }
    let text = String::from_utf8(bytes).map_err(|_| content())?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(content());
    }
    Ok(password.to_owned())
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
            etcd_auth: EtcdAuthFiles {
                user: conf.etcd_user.clone(),
                password_file: conf.etcd_password_file.clone(),
            },
            etcd_insecure: conf.etcd_insecure,
        }
    }

    /// etcd for controller `controller_uuid` at `endpoints` (as given on a command line:
    /// comma-separated, with or without a scheme), over TLS when `tls` names a CA, as
    /// `auth`'s user if any; refused as [`StoreSettings::check`] refuses.
    pub fn etcd(
        endpoints: &[String],
        tls: EtcdTlsFiles,
        auth: EtcdAuthFiles,
        insecure: bool,
        controller_uuid: &str,
    ) -> Result<StoreSettings, StoreSetupError> {
        let tls = tls.checked()?;
        let settings = StoreSettings {
            engine: StoreEngine::Etcd,
            etcd_endpoints: parse_endpoints(endpoints, tls.is_tls())?,
            etcd_prefix: etcd_prefix(controller_uuid),
            etcd_tls: tls,
            etcd_auth: auth.checked()?,
            etcd_insecure: insecure,
        };
        settings.check()?;
        Ok(settings)
    }

    /// Refuses, before anything connects, what must not be used: an endpoint spoken to in
    /// plain http off loopback without `--etcd-insecure`, a user without its password file
    /// (or the reverse), a password file readable by others or owned by another user.
    /// SQLite settings pass.
    pub fn check(&self) -> Result<(), StoreSetupError> {
        if self.engine != StoreEngine::Etcd {
            return Ok(());
        }
        if !self.etcd_insecure
            && let Some(endpoint) = lockstep_store::endpoint::plain_off_loopback(
                self.etcd_endpoints.iter().map(String::as_str),
                self.etcd_tls.is_tls(),
            )
        {
            return Err(StoreSetupError::PlainEndpointOffLoopback {
                endpoint: endpoint.to_owned(),
            });
        }
        let auth = self.etcd_auth.clone().checked()?;
        if let Some(path) = &auth.password_file {
            read_password_file(path)?;
        }
        Ok(())
    }

    /// Writes the settings into `conf`.
    pub fn apply(&self, conf: &mut AgentConf) {
        conf.store = self.engine;
        conf.etcd_endpoints = self.etcd_endpoints.clone();
        conf.etcd_prefix = self.etcd_prefix.clone();
        conf.etcd_cacert = self.etcd_tls.cacert.clone();
        conf.etcd_cert = self.etcd_tls.cert.clone();
        conf.etcd_key = self.etcd_tls.key.clone();
        conf.etcd_user = self.etcd_auth.user.clone();
        conf.etcd_password_file = self.etcd_auth.password_file.clone();
        conf.etcd_insecure = self.etcd_insecure;
    }

    /// Where the state is, for messages (never a password).
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

    /// How etcd is reached, as the worker logs it at every start and `lockstep status`
    /// shows it (`lockstep: {etcd: ...}`): the transport (TLS, or plain http on loopback,
    /// or plain http off loopback accepted by `--etcd-insecure`) and the user. `None` for
    /// SQLite.
    pub fn access(&self) -> Option<String> {
        if self.engine != StoreEngine::Etcd {
            return None;
        }
        let tls = self.etcd_tls.is_tls();
        let transport = if tls {
            let mut text = "https".to_owned();
            if self.etcd_tls.cert.is_some() {
                text.push_str(" with a client certificate");
            }
            if self
                .etcd_endpoints
                .iter()
                .any(|endpoint| lockstep_store::endpoint::is_plain(endpoint, tls))
            {
                text.push_str(" (some endpoints plain http)");
            }
            text
        } else {
            "plain http".to_owned()
        };
        let off_loopback = lockstep_store::endpoint::plain_off_loopback(
            self.etcd_endpoints.iter().map(String::as_str),
            tls,
        );
        let mut text = match (off_loopback, self.etcd_insecure) {
            (Some(endpoint), _) => format!(
                "INSECURE: {transport} to {endpoint}, not loopback, accepted by --etcd-insecure"
            ),
            (None, true) => format!("{transport}, loopback only (--etcd-insecure)"),
            (None, false) if tls => transport,
            (None, false) => format!("{transport}, loopback only"),
        };
        match &self.etcd_auth.user {
            Some(user) => text.push_str(&format!(", user {}", quote(user))),
            None => text.push_str(", no user"),
        }
        Some(text)
    }
}

/// What `lockstepd`'s flags change of `agent.conf`'s store for one run (`--store`,
/// `--etcd-endpoints`, `--etcd-insecure`). The launcher and the worker both apply them, so
/// that what the worker would refuse, the launcher refuses at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOverrides {
    pub engine: Option<StoreEngine>,
    pub etcd_endpoints: Vec<String>,
    pub etcd_insecure: bool,
}

impl StoreOverrides {
    /// The store `conf` names, with these overrides, checked ([`StoreSettings::check`]).
    pub fn settings(&self, conf: &AgentConf) -> Result<StoreSettings, StoreSetupError> {
        let mut settings = StoreSettings::of(conf);
        if let Some(engine) = self.engine {
            settings.engine = engine;
        }
        if !self.etcd_endpoints.is_empty() {
            settings.etcd_endpoints =
                parse_endpoints(&self.etcd_endpoints, settings.etcd_tls.is_tls())?;
        }
        settings.etcd_insecure |= self.etcd_insecure;
        if settings.engine == StoreEngine::Etcd {
            if settings.etcd_endpoints.is_empty() {
                return Err(StoreSetupError::NoEndpoints);
            }
            if settings.etcd_prefix.is_empty() {
                // A controller bootstrapped on SQLite and pointed at etcd: its state is
                // under its controller's uuid, as bootstrap would have put it.
                settings.etcd_prefix = etcd_prefix(&conf.controller);
            }
        }
        settings.check()?;
        Ok(settings)
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
    settings.check()?;
    let mut config = lockstep_store::EtcdConfig::new(settings.etcd_endpoints.iter().cloned())
        .with_prefix(settings.etcd_prefix.clone());
    config.tls = etcd_tls(&settings.etcd_tls)?;
    config.insecure = settings.etcd_insecure;
    if let (Some(user), Some(file)) = (&settings.etcd_auth.user, &settings.etcd_auth.password_file)
    {
        config = config.with_user(user.clone(), read_password_file(file)?);
    }
    let store =
        lockstep_store::EtcdStore::connect(config).map_err(|error| settings.setup_error(error))?;
    Ok(Arc::new(store))
}

impl StoreSettings {
    /// The setup error for a store error met while opening or first reading etcd: a
    /// refusal of the user or its permissions names the user and the flags
    /// ([`StoreSetupError::EtcdDenied`]); anything else is etcd unreachable.
    pub fn setup_error(&self, error: StoreError) -> StoreSetupError {
        let endpoints = self.etcd_endpoints.join(",");
        match error {
            StoreError::Denied { .. } => StoreSetupError::EtcdDenied {
                endpoints,
                user: self.etcd_auth.user.clone(),
                password_file: self.etcd_auth.password_file.clone(),
                error: Box::new(error),
            },
            error => StoreSetupError::EtcdUnreachable { endpoints, error },
        }
    }
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
            EtcdAuthFiles::default(),
            false,
            "uuid",
        )
        .unwrap();
        assert_eq!(settings.etcd_endpoints, ["https://127.0.0.1:2379"]);
    }

    /// Plain etcd settings at `endpoint`, `insecure` or not.
    fn plain(endpoint: &str, insecure: bool) -> Result<StoreSettings, StoreSetupError> {
        StoreSettings::etcd(
            &[endpoint.to_owned()],
            EtcdTlsFiles::default(),
            EtcdAuthFiles::default(),
            insecure,
            "uuid",
        )
    }

    #[test]
    fn a_plain_endpoint_off_loopback_is_refused_naming_it_and_the_flag_unless_insecure() {
        for endpoint in [
            "192.0.2.1:2379",
            "http://192.0.2.1:2379",
            "http://[2001:db8::1]:2379",
            "etcd.example:2379",
        ] {
            let error = plain(endpoint, false).unwrap_err();
            assert!(
                matches!(&error, StoreSetupError::PlainEndpointOffLoopback { endpoint: refused }
                    if refused.ends_with(endpoint.trim_start_matches("http://"))),
                "{endpoint}: {error:?}"
            );
            let message = error.to_string();
            assert!(
                message.contains(endpoint.trim_start_matches("http://"))
                    && message.contains("not loopback")
                    && message.contains("--etcd-insecure"),
                "{message}"
            );
            // Accepted with the flag, and said so.
            let settings = plain(endpoint, true).unwrap();
            assert!(settings.etcd_insecure);
            let access = settings.access().unwrap();
            assert!(
                access.starts_with("INSECURE: plain http to ")
                    && access.contains("--etcd-insecure"),
                "{access}"
            );
        }
        for endpoint in [
            "127.0.0.1:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
        ] {
            let settings = plain(endpoint, false).unwrap();
            assert_eq!(
                settings.access().unwrap(),
                "plain http, loopback only, no user"
            );
        }
        assert_eq!(
            plain("127.0.0.1:2379", true).unwrap().access().unwrap(),
            "plain http, loopback only (--etcd-insecure), no user"
        );
        // TLS to any host is fine.
        let settings = StoreSettings::etcd(
            &["192.0.2.1:2379".to_owned()],
            EtcdTlsFiles {
                cacert: Some(PathBuf::from("/etc/etcd/ca.pem")),
                cert: None,
                key: None,
            },
            EtcdAuthFiles::default(),
            false,
            "uuid",
        )
        .unwrap();
        assert_eq!(settings.access().unwrap(), "https, no user");
        // Settings read from agent.conf are checked the same way, and SQLite is left alone.
        let mut settings = plain("127.0.0.1:2379", false).unwrap();
        settings.etcd_endpoints = vec!["http://192.0.2.1:2379".to_owned()];
        assert!(
            matches!(
                settings.check(),
                Err(StoreSetupError::PlainEndpointOffLoopback { .. })
            ),
            "{:?}",
            settings.check()
        );
        assert!(StoreSettings::default().check().is_ok());
        assert_eq!(StoreSettings::default().access(), None);
    }

    /// A password file with `text` and `mode` in a new temporary directory.
    fn password_file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.password");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn the_password_file_must_be_private_to_its_owner_and_is_named_with_its_mode() {
        let (_dir, path) = password_file("s3cret\n", 0o600);
        assert_eq!(read_password_file(&path).unwrap(), "s3cret");
        let (_dir, path) = password_file("s3cret\r\n", 0o400);
        assert_eq!(read_password_file(&path).unwrap(), "s3cret");
        for mode in [0o640, 0o604, 0o644, 0o660, 0o666] {
            let (_dir, path) = password_file("s3cret", mode);
            let error = read_password_file(&path).unwrap_err();
            assert!(
                matches!(&error, StoreSetupError::PasswordFileMode { path: named, mode: found }
                    if *named == path && *found == mode),
                "{error:?}"
            );
            let message = error.to_string();
            assert!(
                message.contains(&path.display().to_string())
                    && message.contains(&format!("mode {mode:04o}"))
                    && !message.contains("s3cret"),
                "{message}"
            );
        }
        let (_dir, path) = password_file("\n", 0o600);
        assert!(
            matches!(
                read_password_file(&path),
                Err(StoreSetupError::PasswordFileContent { .. })
            ),
            "{:?}",
            read_password_file(&path)
        );
        let (dir, _path) = password_file("s3cret", 0o600);
        assert!(
            matches!(
                read_password_file(dir.path()),
                Err(StoreSetupError::PasswordFileNotRegular { .. })
            ),
            "{:?}",
            read_password_file(dir.path())
        );
        let missing = dir.path().join("missing");
        let error = read_password_file(&missing).unwrap_err();
        assert!(
            error.to_string().contains(&missing.display().to_string()),
            "{error}"
        );
    }

    #[test]
    fn a_user_needs_its_password_file_and_the_file_its_user() {
        let (_dir, path) = password_file("s3cret", 0o600);
        let auth = |user: Option<&str>, file: Option<&Path>| EtcdAuthFiles {
            user: user.map(str::to_owned),
            password_file: file.map(Path::to_path_buf),
        };
        assert!(matches!(
            auth(Some("lockstep"), None).checked(),
            Err(StoreSetupError::UserWithoutPasswordFile)
        ));
        assert!(matches!(
            auth(None, Some(&path)).checked(),
            Err(StoreSetupError::PasswordFileWithoutUser)
        ));
        assert!(matches!(
            auth(Some(""), Some(&path)).checked(),
            Err(StoreSetupError::BadUserName { .. })
        ));
        let settings = StoreSettings::etcd(
            &["127.0.0.1:2379".to_owned()],
            EtcdTlsFiles::default(),
            auth(Some("lockstep"), Some(&path)),
            false,
            "uuid",
        )
        .unwrap();
        assert_eq!(
            settings.access().unwrap(),
            "plain http, loopback only, user \"lockstep\""
        );
        let mut conf = AgentConf::new(
            "machine-0",
            lockstep_core::lifecycle::Snapshot::bootstrapped(
                &lockstep_core::version::Binary::parse("2.9.43-ubuntu-amd64").unwrap(),
            ),
        );
        settings.apply(&mut conf);
        assert_eq!(StoreSettings::of(&conf), settings);
        let text = conf.to_yaml().unwrap();
        assert!(
            text.contains("etcd-user: lockstep")
                && text.contains(&format!("etcd-password-file: {}", path.display()))
                && !text.contains("s3cret"),
            "{text}"
        );
    }
}
