//! Juju's client store: `controllers.yaml`, `models.yaml` and `accounts.yaml` under
//! `$JUJU_DATA`, in the format of Juju's `jujuclient` package, which python-libjuju's
//! `FileJujuData` reads when a script calls `Model().connect()` with no arguments.
//!
//! `lockstep bootstrap` adds its controller and makes it current, as `juju bootstrap` does;
//! `lockstep kill-controller` removes it; `lockstep -c NAME` resolves a controller through
//! it. Every file is read whole, this controller's entries are added, replaced or removed,
//! and the file is written back atomically (mode 0600): other controllers' entries, and keys
//! lockstep does not know, are kept as read. Bootstrap also makes the controller's (empty)
//! cookie jar, `cookies/NAME.json`, which libjuju opens when it connects. A file that does not parse is an error naming
//! it and is never overwritten.
//!
//! The directory is the one Juju's `osenv.JujuXDGDataHomeDir` and libjuju's
//! `juju_config_dir` choose: `$JUJU_DATA`, else `$XDG_DATA_HOME/juju`, else
//! `$HOME/.local/share/juju`.

use std::io;
use std::path::{Path, PathBuf};

use lockstep_fs::AtomicWriteError;
use serde_json::{Map, Value, json};

use crate::cli::bootstrap::ControllerFile;

pub const CONTROLLERS_FILE: &str = "controllers.yaml";
pub const MODELS_FILE: &str = "models.yaml";
pub const ACCOUNTS_FILE: &str = "accounts.yaml";

/// The controller model's name in `models.yaml`, qualified by its owner as Juju writes it.
pub const CONTROLLER_MODEL: &str = "admin/controller";

/// Why the client store cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JujuDataError {
    #[error("no Juju client directory: set JUJU_DATA, XDG_DATA_HOME or HOME")]
    NoDirectory,
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("{} is not a Juju client file ({reason}); not touching it", path.display())]
    Malformed { path: PathBuf, reason: String },
    #[error("cannot create {}: {error}", path.display())]
    CreateDirectory {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("cannot remove {}: {error}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("cannot write {}: {error}", path.display())]
    Serialize {
        path: PathBuf,
        #[source]
        error: serde_saphyr::ser::Error,
    },
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    #[error("controller {name:?} not found in {} (known: {known})", path.display())]
    UnknownController {
        name: String,
        path: PathBuf,
        known: String,
    },
    #[error("{}: controller {name:?} has no {field}", path.display())]
    Incomplete {
        name: String,
        path: PathBuf,
        field: &'static str,
    },
}

/// What bootstrap records about a controller.
#[derive(Clone, Debug)]
pub struct Registration<'a> {
    pub controller: &'a ControllerFile,
    /// The agent version the controller runs.
    pub agent_version: &'a str,
}

/// The client store's directory.
#[derive(Clone, Debug)]
pub struct JujuData {
    dir: PathBuf,
}

impl JujuData {
    pub fn new(dir: impl Into<PathBuf>) -> JujuData {
        JujuData { dir: dir.into() }
    }

    /// `$JUJU_DATA`, else `$XDG_DATA_HOME/juju`, else `$HOME/.local/share/juju` (empty
    /// variables count as unset, as in Juju).
    pub fn from_env() -> Result<JujuData, JujuDataError> {
        let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        if let Some(dir) = var("JUJU_DATA") {
            return Ok(JujuData::new(dir));
        }
        if let Some(xdg) = var("XDG_DATA_HOME") {
            return Ok(JujuData::new(PathBuf::from(xdg).join("juju")));
        }
        match var("HOME") {
            Some(home) => Ok(JujuData::new(PathBuf::from(home).join(".local/share/juju"))),
            None => Err(JujuDataError::NoDirectory),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Reads the three files, so that bootstrap fails before it starts anything when one of
    /// them would not be writable later.
    pub fn check(&self) -> Result<(), JujuDataError> {
        for file in [CONTROLLERS_FILE, MODELS_FILE, ACCOUNTS_FILE] {
            self.read(file)?;
        }
        Ok(())
    }

    /// Adds (or replaces) the controller's entries in the three files and makes it, and its
    /// controller model, current.
    pub fn add_controller(&self, registration: &Registration<'_>) -> Result<(), JujuDataError> {
        let controller = registration.controller;
        let name = controller.name.as_str();
        // Read all three before writing any: a malformed one stops the whole change.
        let mut controllers = self.read(CONTROLLERS_FILE)?;
        let mut models = self.read(MODELS_FILE)?;
        let mut accounts = self.read(ACCOUNTS_FILE)?;

        let entries = section(&mut controllers, &self.path(CONTROLLERS_FILE))?;
        entries.insert(
            name.to_owned(),
            json!({
                "uuid": controller.uuid,
                "api-endpoints": controller.api_endpoints,
                "ca-cert": controller.ca_cert,
                "cloud": "localhost",
                "region": "localhost",
                "agent-version": registration.agent_version,
            }),
        );
        controllers.insert("current-controller".to_owned(), json!(name));

        let entries = section(&mut models, &self.path(MODELS_FILE))?;
        entries.insert(
            name.to_owned(),
            json!({
                "models": {
                    CONTROLLER_MODEL: {"uuid": controller.model_uuid, "type": "iaas"},
                },
                "current-model": CONTROLLER_MODEL,
            }),
        );

        let entries = section(&mut accounts, &self.path(ACCOUNTS_FILE))?;
        entries.insert(
            name.to_owned(),
            json!({
                "user": controller.user,
                "password": controller.password,
                "last-known-access": "superuser",
            }),
        );

        self.create_directory()?;
        self.write(CONTROLLERS_FILE, controllers)?;
        self.write(MODELS_FILE, models)?;
        self.write(ACCOUNTS_FILE, accounts)?;
        self.create_cookie_jar(name)
    }

    /// `cookies/<name>.json`: the controller's cookie jar (Go's persistent-cookiejar format,
    /// a JSON list). Password logins store no cookies, but libjuju opens the jar of the
    /// controller it connects to and fails when it is missing; an existing jar is kept.
    pub fn cookie_jar_path(&self, name: &str) -> PathBuf {
        self.dir.join("cookies").join(format!("{name}.json"))
    }

    fn create_cookie_jar(&self, name: &str) -> Result<(), JujuDataError> {
        let path = self.cookie_jar_path(name);
        if path.exists() {
            return Ok(());
        }
        let cookies = lockstep_fs::parent_directory(&path);
        if !cookies.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(cookies)
                .map_err(|error| JujuDataError::CreateDirectory {
                    path: cookies.to_path_buf(),
                    error,
                })?;
        }
        lockstep_fs::write_file_atomically(&path, b"[]", 0o600)?;
        Ok(())
    }

    /// Removes the controller's entries, if they are this controller's (same uuid), and
    /// `current-controller` if it named it. Returns whether anything was removed.
    pub fn remove_controller(&self, name: &str, uuid: &str) -> Result<bool, JujuDataError> {
        let path = self.path(CONTROLLERS_FILE);
        let mut controllers = self.read(CONTROLLERS_FILE)?;
        let entries = section(&mut controllers, &path)?;
        let ours = entries
            .get(name)
            .and_then(|entry| entry.get("uuid"))
            .and_then(Value::as_str)
            == Some(uuid);
        if !ours {
            return Ok(false);
        }
        let mut models = self.read(MODELS_FILE)?;
        let mut accounts = self.read(ACCOUNTS_FILE)?;
        section(&mut controllers, &path)?.remove(name);
        if controllers
            .get("current-controller")
            .and_then(Value::as_str)
            == Some(name)
        {
            controllers.remove("current-controller");
        }
        // A controller's current model lives inside its own models.yaml entry.
        section(&mut models, &self.path(MODELS_FILE))?.remove(name);
        section(&mut accounts, &self.path(ACCOUNTS_FILE))?.remove(name);
        self.write(CONTROLLERS_FILE, controllers)?;
        self.write(MODELS_FILE, models)?;
        self.write(ACCOUNTS_FILE, accounts)?;
        match std::fs::remove_file(self.cookie_jar_path(name)) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(JujuDataError::Remove {
                    path: self.cookie_jar_path(name),
                    error,
                });
            }
        }
        Ok(true)
    }

    /// The controller `name` as `lockstep`'s commands reach it: endpoints and CA from
    /// `controllers.yaml`, user and password from `accounts.yaml`, the controller model's
    /// uuid from `models.yaml`.
    pub fn controller(&self, name: &str) -> Result<ControllerFile, JujuDataError> {
        let path = self.path(CONTROLLERS_FILE);
        let mut controllers = self.read(CONTROLLERS_FILE)?;
        let entries = section(&mut controllers, &path)?;
        let Some(entry) = entries.get(name) else {
            let known: Vec<&str> = entries.keys().map(String::as_str).collect();
            return Err(JujuDataError::UnknownController {
                name: name.to_owned(),
                path,
                known: if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                },
            });
        };
        let incomplete = |path: &Path, field| JujuDataError::Incomplete {
            name: name.to_owned(),
            path: path.to_path_buf(),
            field,
        };
        let text =
            |entry: &Value, key: &str| entry.get(key).and_then(Value::as_str).map(str::to_owned);
        let uuid = text(entry, "uuid").ok_or_else(|| incomplete(&path, "uuid"))?;
        let ca_cert = text(entry, "ca-cert").ok_or_else(|| incomplete(&path, "ca-cert"))?;
        let api_endpoints: Vec<String> = entry
            .get("api-endpoints")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if api_endpoints.is_empty() {
            return Err(incomplete(&path, "api-endpoints"));
        }

        let accounts_path = self.path(ACCOUNTS_FILE);
        let mut accounts = self.read(ACCOUNTS_FILE)?;
        let account = section(&mut accounts, &accounts_path)?
            .get(name)
            .cloned()
            .ok_or_else(|| incomplete(&accounts_path, "account"))?;
        let user = text(&account, "user").ok_or_else(|| incomplete(&accounts_path, "user"))?;
        let password =
            text(&account, "password").ok_or_else(|| incomplete(&accounts_path, "password"))?;

        let models_path = self.path(MODELS_FILE);
        let mut models = self.read(MODELS_FILE)?;
        let model_uuid = section(&mut models, &models_path)?
            .get(name)
            .and_then(|entry| entry.get("models"))
            .and_then(|models| models.get(CONTROLLER_MODEL))
            .and_then(|model| text(model, "uuid"))
            .ok_or_else(|| incomplete(&models_path, "admin/controller model"))?;

        Ok(ControllerFile {
            name: name.to_owned(),
            uuid,
            model_uuid,
            api_endpoints,
            ca_cert,
            user,
            password,
        })
    }

    /// A file's top-level mapping; empty when the file does not exist or is empty.
    fn read(&self, file: &str) -> Result<Map<String, Value>, JujuDataError> {
        let path = self.path(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Map::new()),
            Err(error) => return Err(JujuDataError::Read { path, error }),
        };
        if text.trim().is_empty() {
            return Ok(Map::new());
        }
        let malformed = |reason: String| JujuDataError::Malformed {
            path: path.clone(),
            reason,
        };
        match serde_saphyr::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(Value::Null) => Ok(Map::new()),
            Ok(other) => Err(malformed(format!(
                "its top level is {other}, not a mapping"
            ))),
            Err(error) => Err(malformed(error.to_string())),
        }
    }

    fn create_directory(&self) -> Result<(), JujuDataError> {
        if self.dir.is_dir() {
            return Ok(());
        }
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|error| JujuDataError::CreateDirectory {
                path: self.dir.clone(),
                error,
            })
    }

    fn write(&self, file: &str, content: Map<String, Value>) -> Result<(), JujuDataError> {
        let path = self.path(file);
        let text = serde_saphyr::to_string(&Value::Object(content)).map_err(|error| {
            JujuDataError::Serialize {
                path: path.clone(),
                error,
            }
        })?;
        lockstep_fs::write_file_atomically(&path, text.as_bytes(), 0o600)?;
        Ok(())
    }
}

/// The `controllers:` mapping of a file, created when absent.
fn section<'a>(
    file: &'a mut Map<String, Value>,
    path: &Path,
) -> Result<&'a mut Map<String, Value>, JujuDataError> {
    let value = file
        .entry("controllers")
        .or_insert_with(|| Value::Object(Map::new()));
    if value.is_null() {
        *value = Value::Object(Map::new());
    }
    match value {
        Value::Object(map) => Ok(map),
        other => Err(JujuDataError::Malformed {
            path: path.to_path_buf(),
            reason: format!("its controllers key is {other}, not a mapping"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(name: &str, uuid: &str) -> ControllerFile {
        ControllerFile {
            name: name.to_owned(),
            uuid: uuid.to_owned(),
            model_uuid: format!("model-of-{uuid}"),
            api_endpoints: vec!["127.0.0.1:17070".to_owned()],
            ca_cert: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_owned(),
            user: "admin".to_owned(),
            password: format!("password-of-{uuid}"),
        }
    }

    fn add(store: &JujuData, file: &ControllerFile) {
        store
            .add_controller(&Registration {
                controller: file,
                agent_version: "0.1.0",
            })
            .unwrap();
    }

    fn yaml(store: &JujuData, file: &str) -> Value {
        serde_saphyr::from_str(&std::fs::read_to_string(store.path(file)).unwrap()).unwrap()
    }

    #[test]
    fn a_controller_added_reads_back_as_the_controller_file_it_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let store = JujuData::new(dir.path().join("juju"));
        let file = controller("one", "u1");
        add(&store, &file);
        let read = store.controller("one").unwrap();
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            serde_json::to_value(&file).unwrap()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn adding_keeps_other_controllers_and_unknown_keys_and_replaces_its_own_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = JujuData::new(dir.path());
        std::fs::write(
            store.path(CONTROLLERS_FILE),
            "controllers:\n  other:\n    uuid: u0\n    api-endpoints: [10.0.0.1:17070]\n    \
             ca-cert: x\n    cloud: aws\n    some-future-key: kept\ncurrent-controller: other\n",
        )
        .unwrap();
        add(&store, &controller("one", "u1"));
        add(&store, &controller("one", "u2"));
        let controllers = yaml(&store, CONTROLLERS_FILE);
        assert_eq!(
            controllers["controllers"]["other"]["some-future-key"],
            "kept"
        );
        assert_eq!(controllers["controllers"]["one"]["uuid"], "u2");
        assert_eq!(controllers["current-controller"], "one");
        let accounts = yaml(&store, ACCOUNTS_FILE);
        assert_eq!(accounts["controllers"]["one"]["password"], "password-of-u2");
    }

    #[test]
    fn removing_takes_only_the_entries_with_the_same_name_and_uuid() {
        let dir = tempfile::tempdir().unwrap();
        let store = JujuData::new(dir.path());
        add(&store, &controller("one", "u1"));
        add(&store, &controller("two", "u2"));
        // "one" was re-bootstrapped elsewhere: another uuid under the name is not ours.
        assert!(!store.remove_controller("one", "not-u1").unwrap());
        assert!(store.controller("one").is_ok());
        assert!(store.remove_controller("two", "u2").unwrap());
        assert!(matches!(
            store.controller("two"),
            Err(JujuDataError::UnknownController { .. })
        ));
        assert!(!store.cookie_jar_path("two").exists());
        assert!(store.cookie_jar_path("one").exists());
        // "two" was current: no current controller is left, as Juju leaves none.
        assert!(
            yaml(&store, CONTROLLERS_FILE)
                .get("current-controller")
                .is_none()
        );
        assert!(
            yaml(&store, MODELS_FILE)["controllers"]
                .get("two")
                .is_none()
        );
    }

    #[test]
    fn a_file_that_is_not_a_mapping_of_controllers_is_refused_and_left_as_it_was() {
        for text in [
            "- a list\n",
            "controllers: [a, b]\n",
            "controllers: {unclosed\n",
        ] {
            let dir = tempfile::tempdir().unwrap();
            let store = JujuData::new(dir.path());
            std::fs::write(store.path(ACCOUNTS_FILE), text).unwrap();
            let error = store
                .add_controller(&Registration {
                    controller: &controller("one", "u1"),
                    agent_version: "0.1.0",
                })
                .unwrap_err();
            assert!(
                matches!(&error, JujuDataError::Malformed { path, .. } if path == &store.path(ACCOUNTS_FILE)),
                "{text:?}: {error}"
            );
            assert_eq!(
                std::fs::read_to_string(store.path(ACCOUNTS_FILE)).unwrap(),
                text
            );
            assert!(!store.path(CONTROLLERS_FILE).exists(), "{text:?}");
        }
    }

    #[test]
    fn an_unknown_or_incomplete_controller_is_an_error_naming_the_file_and_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = JujuData::new(dir.path());
        add(&store, &controller("one", "u1"));
        let error = store.controller("absent").unwrap_err().to_string();
        assert!(
            error.contains("\"absent\"") && error.contains("controllers.yaml"),
            "{error}"
        );
        assert!(error.contains("known: one"), "{error}");
        std::fs::write(store.path(ACCOUNTS_FILE), "controllers: {}\n").unwrap();
        let error = store.controller("one").unwrap_err().to_string();
        assert!(
            error.contains("accounts.yaml") && error.contains("\"one\""),
            "{error}"
        );
    }
}
