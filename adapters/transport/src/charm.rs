//! A local charm as lockstep records it: what `POST /model/<uuid>/charms` reads from the
//! uploaded zip archive (`metadata.yaml`, `config.yaml`), never the archive itself, since
//! lockstep runs no charms. Pure functions of the bytes, each input bounded.

use std::io::{Cursor, Read};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// Uploads read at once (each holds up to [`ARCHIVE_SIZE_BYTES_MAX`] in memory); the next
/// waits.
pub const UPLOADS_IN_FLIGHT_MAX: usize = 2;

/// Largest archive accepted, in bytes (the upload is refused past it before it is read).
pub const ARCHIVE_SIZE_BYTES_MAX: usize = 32 << 20;

/// Largest `metadata.yaml` or `config.yaml` read out of an archive, uncompressed.
pub const YAML_SIZE_BYTES_MAX: u64 = 1 << 20;

/// Entries an archive may have (a charm with its wheelhouse has a few thousand).
pub const ARCHIVE_ENTRIES_MAX: usize = 50_000;

/// Relation endpoints one charm may declare, and config options it may have.
pub const ENDPOINTS_MAX: usize = 256;
pub const OPTIONS_MAX: usize = 1024;

/// A relation endpoint a charm declares, Juju's `charm.Relation`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Endpoint {
    pub name: String,
    /// `provider` (metadata `provides`), `requirer` (`requires`) or `peer` (`peers`).
    pub role: String,
    pub interface: String,
    pub optional: bool,
    pub limit: u64,
    /// `global` or `container`.
    pub scope: String,
}

impl Endpoint {
    /// The endpoint as Juju's relation deltas and `AddRelation` show it:
    /// `{name, role, interface, optional, limit, scope}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({"name": self.name, "role": self.role, "interface": self.interface,
                           "optional": self.optional, "limit": self.limit, "scope": self.scope})
    }
}

/// What lockstep records of an uploaded charm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Charm {
    /// `metadata.yaml`'s `name`.
    pub name: String,
    pub summary: String,
    pub subordinate: bool,
    /// `metadata.yaml`'s `series`, if any (the first is the charm's default).
    pub series: Vec<String>,
    pub endpoints: Vec<Endpoint>,
    /// `config.yaml`'s `options`: `{name: {type, default?, description}}`.
    pub options: Map<String, Value>,
    /// The archive's SHA-256, hex, and its size: an upload of the same archive is the same
    /// charm.
    pub sha256: String,
    pub size_bytes: u64,
}

/// Why an archive is not a charm; the message names what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharmError(pub String);

impl std::fmt::Display for CharmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Charm {
    /// Reads a charm from a zip archive: `metadata.yaml` (required, with a valid `name`)
    /// and `config.yaml` (optional), at the archive's root.
    pub fn from_archive(bytes: &[u8]) -> Result<Charm, CharmError> {
        let error = |message: String| CharmError(message);
        if bytes.len() > ARCHIVE_SIZE_BYTES_MAX {
            return Err(error(format!(
                "the charm archive has {} bytes, over the limit of {ARCHIVE_SIZE_BYTES_MAX}",
                bytes.len()
            )));
        }
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| error(format!("the upload is not a zip archive: {e}")))?;
        if archive.len() > ARCHIVE_ENTRIES_MAX {
            return Err(error(format!(
                "the charm archive has {} entries, over the limit of {ARCHIVE_ENTRIES_MAX}",
                archive.len()
            )));
        }
        let metadata = read_entry(&mut archive, "metadata.yaml")?
            .ok_or_else(|| error("the charm archive has no metadata.yaml".to_owned()))?;
        let config = read_entry(&mut archive, "config.yaml")?;
        let metadata = yaml(&metadata, "metadata.yaml")?;
        let name = metadata["name"]
            .as_str()
            .ok_or_else(|| error("metadata.yaml has no name".to_owned()))?
            .to_owned();
        if !valid_name(&name) {
            return Err(error(format!(
                "invalid charm name {name:?} in metadata.yaml"
            )));
        }
        let mut endpoints = Vec::new();
        for (key, role) in [
            ("provides", "provider"),
            ("requires", "requirer"),
            ("peers", "peer"),
        ] {
            let Some(declared) = metadata[key].as_hash() else {
                continue;
            };
            for (endpoint, detail) in declared {
                let endpoint = endpoint
                    .as_str()
                    .ok_or_else(|| error(format!("metadata.yaml {key}: a non-string name")))?;
                let interface = match detail {
                    Yaml::String(interface) => Some(interface.as_str()),
                    _ => detail["interface"].as_str(),
                }
                .ok_or_else(|| error(format!("metadata.yaml {key}.{endpoint} has no interface")))?;
                let limit = detail["limit"]
                    .as_i64()
                    .and_then(|limit| u64::try_from(limit).ok());
                endpoints.push(Endpoint {
                    name: endpoint.to_owned(),
                    role: role.to_owned(),
                    interface: interface.to_owned(),
                    optional: detail["optional"].as_bool().unwrap_or(false),
                    // Juju's default: a requirer or peer relates once, a provider to any.
                    limit: limit.unwrap_or(u64::from(role != "provider")),
                    scope: detail["scope"].as_str().unwrap_or("global").to_owned(),
                });
            }
        }
        if endpoints.len() > ENDPOINTS_MAX {
            return Err(error(format!(
                "metadata.yaml declares {} endpoints, over the limit of {ENDPOINTS_MAX}",
                endpoints.len()
            )));
        }
        let series = metadata["series"]
            .as_vec()
            .map(|series| {
                series
                    .iter()
                    .filter_map(Yaml::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let mut options = Map::new();
        if let Some(config) = config {
            let config = yaml(&config, "config.yaml")?;
            if let Some(declared) = config["options"].as_hash() {
                if declared.len() > OPTIONS_MAX {
                    return Err(error(format!(
                        "config.yaml declares {} options, over the limit of {OPTIONS_MAX}",
                        declared.len()
                    )));
                }
                for (option, detail) in declared {
                    let Some(option) = option.as_str() else {
                        continue;
                    };
                    let mut entry = Map::new();
                    entry.insert(
                        "type".into(),
                        Value::from(detail["type"].as_str().unwrap_or("string")),
                    );
                    entry.insert(
                        "description".into(),
                        Value::from(detail["description"].as_str().unwrap_or_default()),
                    );
                    let default = to_json(&detail["default"]);
                    if !default.is_null() {
                        entry.insert("default".into(), default);
                    }
                    options.insert(option.to_owned(), Value::Object(entry));
                }
            }
        }
        Ok(Charm {
            name,
            summary: metadata["summary"].as_str().unwrap_or_default().to_owned(),
            subordinate: metadata["subordinate"].as_bool().unwrap_or(false),
            series,
            endpoints,
            options,
            sha256: sha256_hex(bytes),
            size_bytes: bytes.len() as u64,
        })
    }
}

/// Juju's charm name rule (`charm.IsValidName`): lowercase letters, digits and single
/// hyphens, starting with a letter, not ending with a hyphen or a hyphen-number.
pub fn valid_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    !name.is_empty()
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_lowercase()
        && parts.iter().all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
        && parts
            .last()
            .is_some_and(|last| !last.bytes().all(|b| b.is_ascii_digit()) || parts.len() == 1)
}

/// The text of the archive's entry `name` (at its root), at most [`YAML_SIZE_BYTES_MAX`].
fn read_entry(
    archive: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
) -> Result<Option<String>, CharmError> {
    let mut entry = match archive.by_name(name) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(error) => return Err(CharmError(format!("cannot read {name}: {error}"))),
    };
    let mut text = String::new();
    (&mut entry)
        .take(YAML_SIZE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|error| CharmError(format!("cannot read {name}: {error}")))?;
    if text.len() as u64 > YAML_SIZE_BYTES_MAX {
        return Err(CharmError(format!(
            "{name} is over the limit of {YAML_SIZE_BYTES_MAX} bytes"
        )));
    }
    Ok(Some(text))
}

fn yaml(text: &str, name: &str) -> Result<Yaml, CharmError> {
    let mut documents = YamlLoader::load_from_str(text)
        .map_err(|error| CharmError(format!("{name} is not YAML: {error}")))?;
    if documents.is_empty() {
        return Ok(Yaml::Null);
    }
    Ok(documents.swap_remove(0))
}

/// The first YAML document of `text` as JSON (null when empty).
pub fn yaml_to_json(text: &str) -> Result<Value, CharmError> {
    Ok(to_json(&yaml(text, "the YAML")?))
}

/// A YAML scalar or collection as JSON (aliases and unreadable values as null).
fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Yaml::Integer(number) => Value::from(*number),
        Yaml::String(text) => Value::from(text.as_str()),
        Yaml::Boolean(flag) => Value::Bool(*flag),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(entries) => Value::Object(
            entries
                .iter()
                .filter_map(|(key, value)| Some((key.as_str()?.to_owned(), to_json(value))))
                .collect(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// The SHA-256 of `bytes` in hex (ring, the workspace's one crypto provider).
fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest
        .as_ref()
        .iter()
        .fold(String::new(), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn archive(files: &[(&str, &str)]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, text) in files {
            writer
                .start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            writer.write_all(text.as_bytes()).unwrap();
        }
        writer.finish().unwrap().into_inner()
    }

    #[test]
    fn reads_name_endpoints_and_options() {
        let bytes = archive(&[
            (
                "metadata.yaml",
                "name: web\nsummary: a web server\nseries: [jammy]\nprovides:\n  website: http\n\
                 requires:\n  db:\n    interface: pgsql\n    limit: 1\npeers:\n  cluster:\n    interface: web-peers\n",
            ),
            (
                "config.yaml",
                "options:\n  port:\n    type: int\n    default: 80\n    description: listen port\n",
            ),
        ]);
        let charm = Charm::from_archive(&bytes).unwrap();
        assert_eq!(charm.name, "web");
        assert_eq!(charm.series, ["jammy"]);
        let roles: Vec<(&str, &str, &str)> = charm
            .endpoints
            .iter()
            .map(|e| (e.name.as_str(), e.role.as_str(), e.interface.as_str()))
            .collect();
        assert_eq!(
            roles,
            [
                ("website", "provider", "http"),
                ("db", "requirer", "pgsql"),
                ("cluster", "peer", "web-peers")
            ]
        );
        assert_eq!(
            charm.options["port"],
            serde_json::json!({"type": "int", "default": 80, "description": "listen port"})
        );
        assert_eq!(charm.size_bytes, bytes.len() as u64);
        assert_eq!(charm.sha256.len(), 64);
    }

    #[test]
    fn refuses_what_is_not_a_charm_naming_why() {
        let cases = [
            (b"not a zip".to_vec(), "not a zip archive"),
            (archive(&[("README", "hi")]), "no metadata.yaml"),
            (archive(&[("metadata.yaml", "summary: x\n")]), "has no name"),
            (
                archive(&[("metadata.yaml", "name: Bad_Name\n")]),
                "invalid charm name",
            ),
            (
                archive(&[("metadata.yaml", "name: [unclosed\n")]),
                "is not YAML",
            ),
            (
                archive(&[("metadata.yaml", "name: web\nrequires:\n  db: {}\n")]),
                "has no interface",
            ),
        ];
        for (bytes, expected) in cases {
            let error = Charm::from_archive(&bytes).unwrap_err();
            assert!(error.0.contains(expected), "{expected}: {error}");
        }
        let huge = format!("name: web\nsummary: {}\n", "x".repeat(1 << 20));
        let error = Charm::from_archive(&archive(&[("metadata.yaml", &huge)])).unwrap_err();
        assert!(error.0.contains("over the limit"), "{error}");
    }

    #[test]
    fn charm_names_follow_juju() {
        for name in ["web", "mysql-router", "a1", "k8s-operator"] {
            assert!(valid_name(name), "{name}");
        }
        for name in ["", "Web", "1web", "web-", "web--db", "web-1", "web_db"] {
            assert!(!valid_name(name), "{name}");
        }
    }
}
