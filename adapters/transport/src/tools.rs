//! Agent binaries in the catalogue: `Client.FindTools`'s search, the entry that serves one
//! binary, and the tool entries `FindTools` and `Upgrader.Tools` answer with (their URLs on
//! the tools endpoint, [`crate::tools_endpoint`]). Pure functions of the catalogue.

use lockstep_core::policy::{Catalogue, CatalogueEntry, Stream};
use lockstep_core::{Binary, Version};
use serde_json::{Value, json};

use crate::wire::WireError;

/// Juju's `coretools.ErrNoMatches`, the answer when no binary matches a search.
pub const NO_MATCHES: &str = "no matching agent binaries available";

/// The message for a catalogue that could not be read, naming why.
pub fn catalogue_unreadable(reason: &str) -> String {
    format!("cannot read the agent-binary catalogue: {reason}")
}

/// What `Client.FindTools` asks for, Juju's `params.FindToolsParams` in both generations
/// (2.9's `series` and `minor`, 3.x's `os-type`), plus `os`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FindTools {
    /// An exact version; `None` for any (Juju's zero version).
    pub number: Option<Version>,
    /// A major version; `None` (absent, zero or negative) for any.
    pub major: Option<u32>,
    /// A minor version within `major`; only with `major` and without `number`.
    pub minor: Option<u32>,
    /// An architecture (`amd64`); `None` for any.
    pub arch: Option<String>,
    /// A release, OS or series (`ubuntu`, `jammy`); `None` for any.
    pub release: Option<String>,
    /// The stream to search first, with its fallbacks; `None`: the model's `agent-stream`.
    pub stream: Option<Stream>,
}

impl FindTools {
    /// Reads Juju's params. `number` is a version string (`"2.9.44"`, as Juju sends it) or a
    /// `{"Major", "Minor", "Patch", "Tag", "Build"}` object (python-libjuju's schema), the
    /// zero version meaning any; `os-type`, `os` and `series` all name the release.
    pub fn parse(params: &Value) -> Result<FindTools, WireError> {
        let bad = |message: String| WireError::new("bad request", message);
        let number = match params.get("number") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) if text.is_empty() => None,
            Some(Value::String(text)) => {
                Some(Version::parse(text).map_err(|error| bad(format!("params.number: {error}")))?)
            }
            Some(Value::Object(fields)) => {
                let field = |name: &str| {
                    fields
                        .iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case(name))
                        .map(|(_, value)| value)
                };
                let part = |name: &str| -> Result<u32, WireError> {
                    match field(name) {
                        None | Some(Value::Null) => Ok(0),
                        Some(value) => value
                            .as_u64()
                            .and_then(|number| u32::try_from(number).ok())
                            .ok_or_else(|| {
                                bad(format!(
                                    "params.number.{name}: {value} is not a version part"
                                ))
                            }),
                    }
                };
                let tag = field("tag").and_then(Value::as_str).unwrap_or_default();
                let (major, minor, patch, build) = (
                    part("major")?,
                    part("minor")?,
                    part("patch")?,
                    part("build")?,
                );
                let mut text = if tag.is_empty() {
                    format!("{major}.{minor}.{patch}")
                } else {
                    format!("{major}.{minor}-{tag}{patch}")
                };
                if build > 0 {
                    text.push_str(&format!(".{build}"));
                }
                Some(
                    Version::parse(&text)
                        .map_err(|error| bad(format!("params.number: {error}")))?,
                )
            }
            Some(other) => return Err(bad(format!("params.number: {other} is not a version"))),
        }
        .filter(|number| *number != Version::ZERO);
        let count = |name: &str| -> Result<Option<u32>, WireError> {
            match params.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => match value.as_i64() {
                    Some(number) if number < 0 => Ok(None),
                    Some(number) => u32::try_from(number)
                        .map(Some)
                        .map_err(|_| bad(format!("params.{name}: {number} is too large"))),
                    None => Err(bad(format!("params.{name}: {value} is not an integer"))),
                },
            }
        };
        let major = count("major")?.filter(|major| *major > 0);
        let minor = count("minor")?.filter(|_| major.is_some() && number.is_none());
        let name = |keys: &[&str]| {
            keys.iter()
                .find_map(|key| params.get(*key).and_then(Value::as_str))
                .filter(|text| !text.is_empty())
                .map(str::to_owned)
        };
        let stream = name(&["agentstream"])
            .map(|text| {
                Stream::parse(&text).map_err(|error| bad(format!("params.agentstream: {error}")))
            })
            .transpose()?;
        Ok(FindTools {
            number,
            major,
            minor,
            arch: name(&["arch"]),
            release: name(&["os-type", "os", "series"]),
            stream,
        })
    }

    /// The matching binaries, one entry per binary taken from the first stream of the
    /// search order that lists it (Juju's `PreferredStreams` for `number`, with the explicit
    /// stream, else `model_stream`), sorted by binary.
    pub fn search<'a>(
        &self,
        catalogue: &'a Catalogue,
        model_stream: Option<Stream>,
    ) -> Vec<&'a CatalogueEntry> {
        let streams = Stream::preferred(
            self.stream.or(model_stream),
            &self.number.unwrap_or(Version::ZERO),
        );
        catalogue
            .entries()
            .chunk_by(|a, b| a.binary == b.binary)
            .filter_map(|group| {
                streams
                    .iter()
                    .find_map(|stream| group.iter().find(|entry| entry.stream == *stream))
            })
            .filter(|entry| self.matches(&entry.binary))
            .collect()
    }

    fn matches(&self, binary: &Binary) -> bool {
        let number = binary.number;
        self.number.is_none_or(|wanted| number == wanted)
            && self.major.is_none_or(|major| number.major == major)
            && self.minor.is_none_or(|minor| number.minor == minor)
            && self.arch.as_deref().is_none_or(|arch| binary.arch == arch)
            && self
                .release
                .as_deref()
                .is_none_or(|release| binary.release == release)
    }
}

/// Juju's `tools.Tools` for an entry: `{"version", "url", "size", "sha256"}`, the URL on
/// the tools endpoint under `model_root` (`https://<address>/model/<uuid>`).
pub fn tools_json(entry: &CatalogueEntry, model_root: &str) -> Value {
    json!({
        "version": entry.binary.to_string(),
        "url": format!("{model_root}/tools/{}", entry.binary),
        "size": entry.size_bytes,
        "sha256": entry.sha256.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::policy::Sha256;

    fn entry(binary: &str, stream: Stream) -> CatalogueEntry {
        CatalogueEntry {
            binary: Binary::parse(binary).unwrap(),
            stream,
            size_bytes: 10,
            sha256: Sha256([1; 32]),
            path: format!("agent/{binary}.tgz"),
        }
    }

    fn catalogue() -> Catalogue {
        Catalogue::new(vec![
            entry("2.9.43-ubuntu-amd64", Stream::Released),
            entry("2.9.44-ubuntu-amd64", Stream::Released),
            entry("2.9.44-ubuntu-arm64", Stream::Released),
            entry("2.9.45-ubuntu-amd64", Stream::Proposed),
            entry("3.0.0-ubuntu-amd64", Stream::Released),
            entry("2.9.44-centos-amd64", Stream::Released),
        ])
        .unwrap()
    }

    fn found(params: Value, model_stream: Option<Stream>) -> Vec<String> {
        let catalogue = catalogue();
        FindTools::parse(&params)
            .unwrap()
            .search(&catalogue, model_stream)
            .iter()
            .map(|entry| entry.binary.to_string())
            .collect()
    }

    #[test]
    fn find_tools_filters_as_juju_does() {
        let released = [
            "2.9.43-ubuntu-amd64",
            "2.9.44-centos-amd64",
            "2.9.44-ubuntu-amd64",
            "2.9.44-ubuntu-arm64",
            "3.0.0-ubuntu-amd64",
        ];
        assert_eq!(found(json!({}), None), released);
        // Juju 2.9's "nothing asked" form: zero number, -1 major and minor.
        assert_eq!(
            found(json!({"number": "0.0.0", "major": -1, "minor": -1}), None),
            released
        );
        assert_eq!(
            found(
                json!({"number": "2.9.44", "arch": "amd64", "os-type": "ubuntu"}),
                None
            ),
            ["2.9.44-ubuntu-amd64"]
        );
        assert_eq!(
            found(
                json!({"number": {"Major": 2, "Minor": 9, "Patch": 44}, "os": "centos"}),
                None
            ),
            ["2.9.44-centos-amd64"]
        );
        assert_eq!(found(json!({"major": 3}), None), ["3.0.0-ubuntu-amd64"]);
        assert_eq!(
            found(
                json!({"major": 2, "minor": 9, "arch": "arm64", "series": "ubuntu"}),
                None
            ),
            ["2.9.44-ubuntu-arm64"]
        );
        // Proposed binaries only when a stream that falls back through proposed is asked
        // for, explicitly or by the model.
        assert!(found(json!({"number": "2.9.45"}), None).is_empty());
        assert_eq!(
            found(json!({"number": "2.9.45", "agentstream": "proposed"}), None),
            ["2.9.45-ubuntu-amd64"]
        );
        assert_eq!(
            found(json!({"number": "2.9.45"}), Some(Stream::Devel)),
            ["2.9.45-ubuntu-amd64"]
        );
    }

    #[test]
    fn find_tools_names_what_is_wrong_with_its_params() {
        for (params, expected) in [
            (json!({"number": "2.9"}), "params.number"),
            (json!({"number": 7}), "params.number: 7 is not a version"),
            (
                json!({"major": "two"}),
                "params.major: \"two\" is not an integer",
            ),
            (json!({"agentstream": "nightly"}), "params.agentstream"),
        ] {
            let error = FindTools::parse(&params).unwrap_err();
            assert_eq!(error.code, "bad request");
            assert!(
                error.message.contains(expected),
                "{params}: {}",
                error.message
            );
        }
    }

    #[test]
    fn tools_entries_point_at_the_tools_endpoint() {
        let entry = entry("2.9.44-ubuntu-amd64", Stream::Released);
        assert_eq!(
            tools_json(&entry, "https://127.0.0.1:17070/model/u"),
            json!({
                "version": "2.9.44-ubuntu-amd64",
                "url": "https://127.0.0.1:17070/model/u/tools/2.9.44-ubuntu-amd64",
                "size": 10,
                "sha256": "0101010101010101010101010101010101010101010101010101010101010101",
            })
        );
    }
}
