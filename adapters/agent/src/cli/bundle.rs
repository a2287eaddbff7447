//! Juju bundles: the YAML `juju deploy <bundle>` reads, and the changes that deploy one.
//!
//! ```yaml
//! description: A blog.                  # ignored, as `series`, `default-base`, `name`...
//! applications:                         # Juju 1.x called it `services:`; both accepted
//!   wordpress:
//!     charm: wordpress                  # required, non-empty
//!     num_units: 2                      # default 0 (a subordinate); at most 1000
//!     expose: true                      # default false
//!     to: ["0", "lxd:1"]                # optional placements, kept but not applied
//!     options: {tuning: optimized}      # ignored
//!   mysql:
//!     charm: ch:mysql
//!     num_units: 1
//! relations:
//!   - ["wordpress:db", "mysql:server"]  # or "wordpress" without an endpoint
//! ```
//!
//! Parsing is panic-free and bounded: the text is at most [`BUNDLE_BYTES_MAX`], the YAML
//! parser runs under serde-saphyr's budget (depth, nodes, aliases), and duplicate keys are
//! refused. The whole bundle is then validated at once and every problem is reported with
//! its key path (`applications.my-app.num_units`), as `juju deploy` reports a bundle's
//! verification errors all together.
//!
//! Keys Juju knows that lockstep does not apply (`constraints`, `bindings`, `machines`,
//! `options`...) are accepted and ignored; keys Juju does not know are refused, as Juju's
//! strict unmarshalling does, so a typo such as `num-units` is not silently dropped.

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::quote::quote;

/// The largest bundle accepted, in bytes.
pub const BUNDLE_BYTES_MAX: u64 = 1024 * 1024;
/// The most units one application may ask for.
pub const NUM_UNITS_MAX: u32 = 1000;
/// The most problems one error lists (the count of the rest is given).
pub const PROBLEMS_MAX: usize = 100;
/// YAML documents parsed, to tell an overlay apart (which is then refused).
const DOCUMENTS_MAX: usize = 16;
/// The deepest nesting the YAML parser accepts: a bundle needs five levels.
const DEPTH_MAX: usize = 32;

/// Top-level keys Juju knows and lockstep ignores.
const IGNORED_TOP_LEVEL: &[&str] = &[
    "series",
    "default-base",
    "description",
    "name",
    "tags",
    "bundle",
    "type",
    "machines",
    "saas",
    "variables",
];

/// Application keys Juju knows and lockstep ignores.
const IGNORED_APPLICATION: &[&str] = &[
    "options",
    "series",
    "base",
    "channel",
    "revision",
    "constraints",
    "storage",
    "devices",
    "annotations",
    "bindings",
    "endpoint-bindings",
    "trust",
    "resources",
    "plan",
    "offers",
    "exposed-endpoints",
    "requires",
    "placement",
];

/// A validated bundle.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Bundle {
    /// In the order the bundle lists them.
    pub applications: Vec<BundleApplication>,
    /// Each a pair of endpoints, `application` or `application:endpoint`, in bundle order.
    pub relations: Vec<[String; 2]>,
}

/// One application of a bundle.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BundleApplication {
    pub name: String,
    pub charm: String,
    pub num_units: u32,
    pub expose: bool,
    /// Placement directives, as written (numbers as their decimal text).
    pub to: Vec<String>,
}

/// One change that deploying a bundle makes, in the order [`Bundle::plan`] gives.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum BundleChange {
    Deploy {
        application: String,
        charm: String,
        num_units: u32,
    },
    Expose {
        application: String,
    },
    AddRelation {
        endpoints: [String; 2],
    },
}

/// One thing wrong with a bundle, at a key path such as `applications.my-app.num_units`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BundleProblem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for BundleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A bundle that cannot be read or deployed. `origin` is the file, or `<input>`.
#[derive(Debug)]
pub enum BundleError {
    Read {
        origin: String,
        error: std::io::Error,
    },
    TooLarge {
        origin: String,
        size_bytes_max: u64,
    },
    /// Not YAML (or over the parser's budget), with the parser's location.
    Yaml {
        origin: String,
        detail: String,
    },
    /// YAML, but not a valid bundle: every problem found.
    Invalid {
        origin: String,
        problems: Vec<BundleProblem>,
        /// Problems found beyond the [`PROBLEMS_MAX`] listed.
        unlisted: usize,
    },
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BundleError::Read { origin, error } => {
                write!(f, "cannot read bundle {origin}: {error}")
            }
            BundleError::TooLarge {
                origin,
                size_bytes_max,
            } => write!(
                f,
                "bundle {origin} is larger than {size_bytes_max} bytes; a bundle is a few \
                 kilobytes"
            ),
            BundleError::Yaml { origin, detail } => {
                write!(f, "bundle {origin} is not valid YAML: {detail}")
            }
            BundleError::Invalid {
                origin,
                problems,
                unlisted,
            } => {
                let count = problems.len() + unlisted;
                write!(
                    f,
                    "bundle {origin} is invalid ({count} problem{}):",
                    if count == 1 { "" } else { "s" }
                )?;
                for problem in problems {
                    write!(f, "\n  {problem}")?;
                }
                if *unlisted > 0 {
                    write!(f, "\n  ... and {unlisted} more")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for BundleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BundleError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

const TEXT_ORIGIN: &str = "<input>";

impl Bundle {
    /// Parses and validates bundle YAML.
    pub fn parse(text: &str) -> Result<Bundle, BundleError> {
        Bundle::parse_from(text, TEXT_ORIGIN)
    }

    /// Reads, parses and validates a bundle file.
    pub fn from_file(path: &Path) -> Result<Bundle, BundleError> {
        let origin = path.display().to_string();
        let read_error = |error| BundleError::Read {
            origin: origin.clone(),
            error,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mut bytes = Vec::new();
        file.take(BUNDLE_BYTES_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > BUNDLE_BYTES_MAX {
            return Err(BundleError::TooLarge {
                origin,
                size_bytes_max: BUNDLE_BYTES_MAX,
            });
        }
        let text = String::from_utf8(bytes).map_err(|error| BundleError::Yaml {
            origin: origin.clone(),
            detail: format!("not UTF-8 (byte {})", error.utf8_error().valid_up_to()),
        })?;
        Bundle::parse_from(&text, &origin)
    }

    fn parse_from(text: &str, origin: &str) -> Result<Bundle, BundleError> {
        if text.len() as u64 > BUNDLE_BYTES_MAX {
            return Err(BundleError::TooLarge {
                origin: origin.to_owned(),
                size_bytes_max: BUNDLE_BYTES_MAX,
            });
        }
        let options = serde_saphyr::Options {
            budget: Some(serde_saphyr::Budget {
                max_depth: DEPTH_MAX,
                max_documents: DOCUMENTS_MAX,
                ..serde_saphyr::Budget::default()
            }),
            duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
            ..serde_saphyr::Options::default()
        };
        let yaml_error = |detail: String| BundleError::Yaml {
            origin: origin.to_owned(),
            detail,
        };
        let mut documents: Vec<Node> = serde_saphyr::from_multiple_with_options(text, options)
            .map_err(|error| yaml_error(error.to_string()))?;
        // Juju reads further documents as overlays; lockstep does not apply overlays, and
        // must not silently deploy only the first document.
        if documents.len() > 1 {
            return Err(yaml_error(format!(
                "{} YAML documents: bundle overlays are not supported, give one document",
                documents.len()
            )));
        }
        let node = documents.pop().unwrap_or(Node::Null);
        let mut problems = Problems::default();
        let bundle = validate(&node, &mut problems);
        if problems.listed.is_empty() && problems.unlisted == 0 {
            Ok(bundle)
        } else {
            Err(BundleError::Invalid {
                origin: origin.to_owned(),
                problems: problems.listed,
                unlisted: problems.unlisted,
            })
        }
    }

    /// The changes that deploy this bundle: every deploy in bundle order, then every
    /// expose, then every relation. Deterministic: the same bundle gives the same plan.
    pub fn plan(&self) -> Vec<BundleChange> {
        let deploys = self
            .applications
            .iter()
            .map(|application| BundleChange::Deploy {
                application: application.name.clone(),
                charm: application.charm.clone(),
                num_units: application.num_units,
            });
        let exposes = self
            .applications
            .iter()
            .filter(|application| application.expose)
            .map(|application| BundleChange::Expose {
                application: application.name.clone(),
            });
        let relations = self
            .relations
            .iter()
            .map(|endpoints| BundleChange::AddRelation {
                endpoints: endpoints.clone(),
            });
        deploys.chain(exposes).chain(relations).collect()
    }
}

/// Checks an application name as Juju does: lowercase letters and digits in segments
/// separated by single hyphens, starting with a letter, every segment holding a letter
/// (so no trailing hyphen and no `-<digits>` segment, which would read as a unit number).
pub fn is_valid_application_name(name: &str) -> bool {
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return false;
    }
    name.split('-').all(|segment| {
        !segment.is_empty()
            && segment
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && segment.bytes().any(|b| b.is_ascii_lowercase())
    })
}

/// Checks a relation endpoint name as Juju does: lowercase letters and digits, starting
/// with a letter, with single `-` or `_` between them.
fn is_valid_endpoint_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.split(['-', '_']).all(|segment| {
            !segment.is_empty()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

#[derive(Default)]
struct Problems {
    listed: Vec<BundleProblem>,
    unlisted: usize,
}

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        if self.listed.len() < PROBLEMS_MAX {
            self.listed.push(BundleProblem {
                path: path.into(),
                message: message.into(),
            });
        } else {
            self.unlisted += 1;
        }
    }
}

fn validate(node: &Node, problems: &mut Problems) -> Bundle {
    let mut bundle = Bundle {
        applications: Vec::new(),
        relations: Vec::new(),
    };
    let entries = match node {
        Node::Mapping(entries) => entries,
        Node::Null => {
            problems.add("", "the bundle is empty: expected an `applications:` map");
            return bundle;
        }
        other => {
            problems.add(
                "",
                format!(
                    "expected a map with `applications:` at the top, found {}",
                    other.kind()
                ),
            );
            return bundle;
        }
    };
    let mut applications: Option<(&str, &Node)> = None;
    // Every name the bundle declares, valid or not: a relation to an application with a
    // problem of its own is not a second problem.
    let mut declared: Vec<String> = Vec::new();
    let mut relations = None;
    for (key, value) in entries {
        let Some(key) = key.as_key() else {
            problems.add(
                "",
                format!("top-level key {} is not a string", key.describe()),
            );
            continue;
        };
        match key.as_str() {
            "applications" | "services" => {
                if let Some((first, _)) = applications {
                    problems.add(
                        key.as_str(),
                        format!("both `{first}` and `{key}` given; use `applications` only"),
                    );
                } else {
                    applications = Some((
                        if key == "services" {
                            "services"
                        } else {
                            "applications"
                        },
                        value,
                    ));
                }
            }
            "relations" => relations = Some(value),
            ignored if IGNORED_TOP_LEVEL.contains(&ignored) => {}
            unknown => problems.add(
                unknown,
                format!(
                    "unknown top-level key {}; expected applications, relations{}",
                    quote(unknown),
                    IGNORED_TOP_LEVEL
                        .iter()
                        .fold(String::new(), |text, key| text + ", " + key)
                ),
            ),
        }
    }
    match applications {
        Some((section, Node::Mapping(entries))) => {
            if entries.is_empty() {
                problems.add(section, "no applications");
            }
            for (key, value) in entries {
                let Some(name) = key.as_key() else {
                    problems.add(
                        section,
                        format!("application name {} is not a string", key.describe()),
                    );
                    continue;
                };
                let path = format!("{section}.{name}");
                declared.push(name.clone());
                if let Some(application) = validate_application(&name, value, &path, problems) {
                    bundle.applications.push(application);
                }
            }
        }
        Some((section, Node::Null)) => problems.add(section, "no applications"),
        Some((section, other)) => problems.add(
            section,
            format!(
                "expected a map of application name to application, found {}",
                other.kind()
            ),
        ),
        None => problems.add("", "no `applications:` key: a bundle deploys applications"),
    }
    if let Some(relations) = relations {
        bundle.relations = validate_relations(relations, &declared, problems);
    }
    bundle
}

fn validate_application(
    name: &str,
    node: &Node,
    path: &str,
    problems: &mut Problems,
) -> Option<BundleApplication> {
    let before = problems.listed.len() + problems.unlisted;
    if !is_valid_application_name(name) {
        problems.add(
            path,
            format!(
                "invalid application name {}: lowercase letters, digits and single hyphens, \
                 starting with a letter, each hyphenated part holding a letter (e.g. my-app2)",
                quote(name)
            ),
        );
    }
    let entries = match node {
        Node::Mapping(entries) => entries.as_slice(),
        Node::Null => &[],
        other => {
            problems.add(
                path,
                format!(
                    "expected a map with at least `charm:`, found {}",
                    other.kind()
                ),
            );
            return None;
        }
    };
    let mut charm = None;
    let mut num_units = None;
    let mut scale = None;
    let mut expose = false;
    let mut to = Vec::new();
    for (key, value) in entries {
        let Some(key) = key.as_key() else {
            problems.add(path, format!("key {} is not a string", key.describe()));
            continue;
        };
        let field = format!("{path}.{key}");
        match key.as_str() {
            "charm" => match value.as_text() {
                Some(text) if !text.trim().is_empty() => charm = Some(text.trim().to_owned()),
                Some(_) => problems.add(field, "the charm is empty"),
                None => problems.add(
                    field,
                    format!("expected the charm's name or URL, found {}", value.kind()),
                ),
            },
            "num_units" => num_units = units(value, &field, problems),
            "scale" => scale = units(value, &field, problems),
            "num-units" => problems.add(
                field,
                "unknown key \"num-units\"; Juju spells it num_units".to_owned(),
            ),
            "expose" => match value {
                Node::Bool(flag) => expose = *flag,
                Node::Null => {}
                other => problems.add(
                    field,
                    format!("expected true or false, found {}", other.kind()),
                ),
            },
            "to" => match value {
                Node::Sequence(items) => {
                    for (index, item) in items.iter().enumerate() {
                        match item.as_text() {
                            Some(text) if !text.trim().is_empty() => {
                                to.push(text.trim().to_owned())
                            }
                            _ => problems.add(
                                format!("{field}[{index}]"),
                                format!(
                                    "expected a placement such as \"0\" or \"lxd:1\", found {}",
                                    item.describe()
                                ),
                            ),
                        }
                    }
                }
                Node::Null => {}
                other => problems.add(
                    field,
                    format!(
                        "expected a list of placements (e.g. [\"0\"]), found {}",
                        other.kind()
                    ),
                ),
            },
            "options" => {
                if !matches!(value, Node::Mapping(_) | Node::Null) {
                    problems.add(
                        field,
                        format!("expected a map of option values, found {}", value.kind()),
                    );
                }
            }
            ignored if IGNORED_APPLICATION.contains(&ignored) => {}
            unknown => problems.add(field, format!("unknown key {}", quote(unknown))),
        }
    }
    if num_units.is_some() && scale.is_some() {
        problems.add(
            format!("{path}.scale"),
            "cannot give both num_units and scale",
        );
    }
    if charm.is_none()
        && !entries
            .iter()
            .any(|(key, _)| key.as_key().as_deref() == Some("charm"))
    {
        problems.add(
            format!("{path}.charm"),
            "missing: every application needs a charm",
        );
    }
    if problems.listed.len() + problems.unlisted > before {
        return None;
    }
    Some(BundleApplication {
        name: name.to_owned(),
        charm: charm?,
        num_units: num_units.or(scale).unwrap_or(0),
        expose,
        to,
    })
}

fn units(value: &Node, field: &str, problems: &mut Problems) -> Option<u32> {
    match value {
        Node::Unsigned(count) if *count <= u64::from(NUM_UNITS_MAX) => Some(*count as u32),
        Node::Unsigned(count) => {
            problems.add(
                field,
                format!("{count} units is over the limit of {NUM_UNITS_MAX}"),
            );
            None
        }
        other => {
            problems.add(
                field,
                format!(
                    "expected a number of units from 0 to {NUM_UNITS_MAX}, found {}",
                    other.describe()
                ),
            );
            None
        }
    }
}

fn validate_relations(
    node: &Node,
    declared: &[String],
    problems: &mut Problems,
) -> Vec<[String; 2]> {
    let items = match node {
        Node::Sequence(items) => items.as_slice(),
        Node::Null => &[],
        other => {
            problems.add(
                "relations",
                format!(
                    "expected a list of endpoint pairs (e.g. - [\"wordpress:db\", \"mysql:server\"]), found {}",
                    other.kind()
                ),
            );
            return Vec::new();
        }
    };
    let mut relations: Vec<[String; 2]> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = format!("relations[{index}]");
        let pair = match item {
            Node::Sequence(pair) if pair.len() == 2 => pair,
            other => {
                problems.add(
                    path,
                    format!("expected a pair of endpoints, found {}", other.describe()),
                );
                continue;
            }
        };
        let mut endpoints = Vec::with_capacity(2);
        for (side, endpoint) in pair.iter().enumerate() {
            let endpoint_path = format!("{path}[{side}]");
            let Some(text) = endpoint.as_text() else {
                problems.add(
                    endpoint_path,
                    format!(
                        "expected \"application\" or \"application:endpoint\", found {}",
                        endpoint.describe()
                    ),
                );
                continue;
            };
            let (application, name) = match text.split_once(':') {
                Some((application, name)) => (application, Some(name)),
                None => (text.as_str(), None),
            };
            let mut valid = true;
            if !declared.iter().any(|known| known == application) {
                problems.add(
                    &endpoint_path,
                    format!(
                        "{} refers to application {}, which the bundle does not define",
                        quote(&text),
                        quote(application)
                    ),
                );
                valid = false;
            }
            if let Some(name) = name
                && !is_valid_endpoint_name(name)
            {
                problems.add(
                    &endpoint_path,
                    format!(
                        "invalid endpoint name {} in {}: lowercase letters, digits, '-' and '_', \
                         starting with a letter",
                        quote(name),
                        quote(&text)
                    ),
                );
                valid = false;
            }
            if valid {
                endpoints.push(text);
            }
        }
        let Ok(endpoints) = <[String; 2]>::try_from(endpoints) else {
            continue;
        };
        let application =
            |endpoint: &str| endpoint.split(':').next().unwrap_or_default().to_owned();
        if application(&endpoints[0]) == application(&endpoints[1]) {
            problems.add(
                path,
                format!(
                    "relates application {} to itself",
                    quote(&application(&endpoints[0]))
                ),
            );
            continue;
        }
        let duplicate = relations.iter().any(|known| {
            (known[0] == endpoints[0] && known[1] == endpoints[1])
                || (known[0] == endpoints[1] && known[1] == endpoints[0])
        });
        if duplicate {
            problems.add(
                path,
                format!(
                    "relation [{}, {}] is listed more than once",
                    quote(&endpoints[0]),
                    quote(&endpoints[1])
                ),
            );
            continue;
        }
        relations.push(endpoints);
    }
    relations
}

// ---------------------------------------------------------------------------------------
// An order-preserving YAML tree
// ---------------------------------------------------------------------------------------

/// YAML as parsed, with maps kept in document order (deploys follow the bundle's order).
#[derive(Clone, PartialEq, Debug)]
enum Node {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    String(String),
    Sequence(Vec<Node>),
    Mapping(Vec<(Node, Node)>),
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "nothing",
            Node::Bool(_) => "a boolean",
            Node::Unsigned(_) | Node::Signed(_) => "an integer",
            Node::Float(_) => "a number",
            Node::String(_) => "a string",
            Node::Sequence(_) => "a list",
            Node::Mapping(_) => "a map",
        }
    }

    /// The kind, with the value for a scalar.
    fn describe(&self) -> String {
        match self {
            Node::Bool(flag) => format!("the boolean {flag}"),
            Node::Unsigned(number) => format!("the integer {number}"),
            Node::Signed(number) => format!("the integer {number}"),
            Node::Float(number) => format!("the number {number}"),
            Node::String(text) => format!("the string {}", quote(text)),
            other => other.kind().to_owned(),
        }
    }

    /// A string, or an integer as its decimal text (YAML `to: [0]`, a key `0:`).
    fn as_text(&self) -> Option<String> {
        match self {
            Node::String(text) => Some(text.clone()),
            Node::Unsigned(number) => Some(number.to_string()),
            Node::Signed(number) => Some(number.to_string()),
            _ => None,
        }
    }

    fn as_key(&self) -> Option<String> {
        self.as_text()
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        Ok(match u64::try_from(value) {
            Ok(unsigned) => Node::Unsigned(unsigned),
            Err(_) => Node::Signed(value),
        })
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        Ok(Node::Unsigned(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
        Ok(Node::Float(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Node, E> {
        Ok(Node::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Node, E> {
        Ok(Node::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = access.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Sequence(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = access.next_entry::<Node, Node>()? {
            entries.push((key, value));
        }
        Ok(Node::Mapping(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_names_follow_juju() {
        for name in ["wordpress", "my-app", "my-app2", "a", "app-2b", "x1-y2"] {
            assert!(is_valid_application_name(name), "{name}");
        }
        for name in [
            "", "2app", "My-app", "my_app", "app-", "app-2", "a--b", "-a", "app/0", "app-1-x",
        ] {
            assert!(!is_valid_application_name(name), "{name}");
        }
    }

    #[test]
    fn endpoint_names_follow_juju() {
        for name in ["db", "db-admin", "website", "shared_db", "a1"] {
            assert!(is_valid_endpoint_name(name), "{name}");
        }
        for name in ["", "1db", "Db", "db-", "db--x", "db:x"] {
            assert!(!is_valid_endpoint_name(name), "{name}");
        }
    }
}
