//! `lockstep status`: the reply of `Client.FullStatus` as `juju status` shows it, or as
//! JSON or YAML.
//!
//! The tabular form has a model header (with lockstep's lifecycle: phase, progress of an
//! upgrade, `upgrade-available`), then the applications, units, machines (and, for the
//! controller that answered, which agent-binary metadata it accepts:
//! `machines.<id>.lockstep.metadata-verification`) and integrations, each table's columns
//! aligned to their widest cell:
//!
//! ```text
//! Model       Controller  Version  Phase  Upgrade-available  Progress  Status     Timestamp  Message
//! controller  lockstep    2.9.43   ready  2.9.44             -         available  12:00:00Z  -
//!
//! App        Version  Status   Scale  Charm      Exposed
//! wordpress  -        unknown  2      wordpress  yes
//! ```
//!
//! The reply comes from a server that may be older or newer than this client, so a field
//! that is missing or of another type is shown as `-`; only a reply that is not a JSON
//! object at all is an error. JSON and YAML print the reply itself.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// How `lockstep status` prints.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Format {
    /// Aligned tables, as `juju status`.
    #[default]
    Tabular,
    /// The `FullStatus` reply, pretty-printed JSON.
    Json,
    /// The `FullStatus` reply as YAML.
    Yaml,
}

impl Format {
    /// Every format, in the order help lists them.
    pub const ALL: [Format; 3] = [Format::Tabular, Format::Json, Format::Yaml];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Tabular => "tabular",
            Format::Json => "json",
            Format::Yaml => "yaml",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--format` value that is not one of [`Format::ALL`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ParseFormatError {
    pub text: String,
}

impl fmt::Display for ParseFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown status format {}: expected one of tabular, json, yaml",
            crate::quote::quote(&self.text)
        )
    }
}

impl std::error::Error for ParseFormatError {}

impl FromStr for Format {
    type Err = ParseFormatError;

    fn from_str(text: &str) -> Result<Format, ParseFormatError> {
        Format::ALL
            .into_iter()
            .find(|format| format.as_str().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| ParseFormatError {
                text: text.to_owned(),
            })
    }
}

/// A status reply that cannot be rendered.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StatusError {
    /// The reply is not a JSON object; `found` names what it is.
    NotAnObject { found: &'static str, text: String },
    /// The serialiser refused the reply.
    Serialize { format: Format, detail: String },
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusError::NotAnObject { found, text } => write!(
                f,
                "malformed FullStatus reply: expected a JSON object, got {found} {text}"
            ),
            StatusError::Serialize { format, detail } => {
                write!(f, "cannot print the status as {format}: {detail}")
            }
        }
    }
}

impl std::error::Error for StatusError {}

/// Renders a `Client.FullStatus` reply in `format`; the text ends with a newline.
pub fn render(status: &Value, format: Format) -> Result<String, StatusError> {
    match format {
        Format::Tabular => render_tabular(status, None),
        Format::Json => {
            object(status)?;
            serde_json::to_string_pretty(status)
                .map(|text| text + "\n")
                .map_err(|error| StatusError::Serialize {
                    format,
                    detail: error.to_string(),
                })
        }
        Format::Yaml => {
            object(status)?;
            serde_saphyr::to_string(status)
                .map(|text| {
                    if text.ends_with('\n') {
                        text
                    } else {
                        text + "\n"
                    }
                })
                .map_err(|error| StatusError::Serialize {
                    format,
                    detail: error.to_string(),
                })
        }
    }
}

/// The tabular form, with the controller's name (which the reply does not carry: the CLI
/// knows it) in the model header; `None` shows `-`.
pub fn render_tabular(status: &Value, controller: Option<&str>) -> Result<String, StatusError> {
    let reply = object(status)?;
    let empty = Map::new();
    let model = reply
        .get("model")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let lockstep = model
        .get("lockstep")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let phase = cell(lockstep.get("phase"));
    let upgrade_available = match lockstep.get("upgrade-available") {
        Some(Value::String(version)) if !version.is_empty() => version.clone(),
        _ => cell(model.get("available-version")),
    };
    let mut out = String::new();
    table(
        &mut out,
        &[
            "Model",
            "Controller",
            "Version",
            "Phase",
            "Upgrade-available",
            "Progress",
            "Status",
            "Timestamp",
            "Message",
        ],
        vec![vec![
            cell(model.get("name")),
            controller.map_or_else(|| DASH.to_owned(), clean),
            cell(model.get("version")),
            phase.clone(),
            upgrade_available,
            progress(&phase, lockstep),
            cell(
                model
                    .get("model-status")
                    .and_then(|status| status.get("status")),
            ),
            timestamp(reply.get("controller-timestamp")),
            cell(
                model
                    .get("model-status")
                    .and_then(|status| status.get("info")),
            ),
        ]],
    );

    if let Some(rollout) = lockstep.get("rollout").and_then(Value::as_object) {
        rollout_tables(&mut out, rollout);
    }

    let applications = entries(reply.get("applications"));
    let machines = entries(reply.get("machines"));
    if applications.is_empty() && machines.is_empty() {
        out.push('\n');
        out.push_str(&format!("Model {} is empty.\n", quoted(model.get("name"))));
        return Ok(out);
    }

    if !applications.is_empty() {
        let rows = applications
            .iter()
            .map(|(name, application)| {
                vec![
                    clean(name),
                    cell(application.get("workload-version")),
                    cell(
                        application
                            .get("status")
                            .and_then(|status| status.get("status")),
                    ),
                    application
                        .get("units")
                        .and_then(Value::as_object)
                        .map_or_else(|| DASH.to_owned(), |units| units.len().to_string()),
                    charm_name(application.get("charm")),
                    match application.get("exposed") {
                        Some(Value::Bool(true)) => "yes".to_owned(),
                        Some(Value::Bool(false)) => "no".to_owned(),
                        _ => DASH.to_owned(),
                    },
                ]
            })
            .collect();
        out.push('\n');
        table(
            &mut out,
            &["App", "Version", "Status", "Scale", "Charm", "Exposed"],
            rows,
        );

        let mut units: Vec<(&String, &Value)> = applications
            .iter()
            .flat_map(|(_, application)| entries(application.get("units")))
            .collect();
        units.sort_by(|a, b| natural_key(a.0).cmp(&natural_key(b.0)));
        if !units.is_empty() {
            let rows = units
                .iter()
                .map(|(name, unit)| {
                    vec![
                        clean(name),
                        cell(
                            unit.get("workload-status")
                                .and_then(|status| status.get("status")),
                        ),
                        cell(
                            unit.get("agent-status")
                                .and_then(|status| status.get("status")),
                        ),
                        cell(unit.get("machine")),
                    ]
                })
                .collect();
            out.push('\n');
            table(&mut out, &["Unit", "Workload", "Agent", "Machine"], rows);
        }
    }

    if !machines.is_empty() {
        let rows = machines
            .iter()
            .map(|(id, machine)| {
                let jobs = machine
                    .get("jobs")
                    .and_then(Value::as_array)
                    .map(|jobs| {
                        jobs.iter()
                            .filter_map(Value::as_str)
                            .map(clean)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .filter(|jobs| !jobs.is_empty())
                    .unwrap_or_else(|| DASH.to_owned());
                vec![
                    clean(id),
                    cell(
                        machine
                            .get("agent-status")
                            .and_then(|status| status.get("status")),
                    ),
                    cell(
                        machine
                            .get("agent-status")
                            .and_then(|status| status.get("version")),
                    ),
                    cell(
                        machine
                            .get("agent-status")
                            .and_then(|status| status.get("data"))
                            .and_then(|data| data.get("phase")),
                    ),
                    machine
                        .get("agent-status")
                        .and_then(|status| status.get("data"))
                        .and_then(|data| data.get("download-rate"))
                        .and_then(Value::as_u64)
                        .map_or_else(|| DASH.to_owned(), bytes_per_second),
                    base(machine.get("base")),
                    jobs,
                ]
            })
            .collect();
        out.push('\n');
        table(
            &mut out,
            &[
                "Machine", "State", "Version", "Phase", "Download", "Base", "Jobs",
            ],
            rows,
        );
        // What the controller that answered says of itself: which agent-binary metadata
        // it accepts (its `agent.conf`, pinned at bootstrap), and on etcd how it reaches
        // etcd (`--etcd-insecure` included).
        let verifications: Vec<Vec<String>> = machines
            .iter()
            .filter_map(|(id, machine)| {
                let verification = machine.get("lockstep")?.get("metadata-verification")?;
                Some(vec![clean(id), cell(Some(verification))])
            })
            .collect();
        if !verifications.is_empty() {
            out.push('\n');
            table(
                &mut out,
                &["Machine", "Metadata-verification"],
                verifications,
            );
        }
        let etcd: Vec<Vec<String>> = machines
            .iter()
            .filter_map(|(id, machine)| {
                let access = machine.get("lockstep")?.get("etcd")?;
                Some(vec![clean(id), cell(Some(access))])
            })
            .collect();
        if !etcd.is_empty() {
            out.push('\n');
            table(&mut out, &["Machine", "Etcd"], etcd);
        }
    }

    let relations = reply
        .get("relations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !relations.is_empty() {
        let mut rows: Vec<Vec<String>> = relations
            .iter()
            .map(|relation| {
                let endpoint = |index: usize| {
                    relation
                        .get("endpoints")
                        .and_then(|endpoints| endpoints.get(index))
                        .map(|endpoint| {
                            let application = cell(endpoint.get("application"));
                            match endpoint.get("name").and_then(Value::as_str) {
                                Some(name) if !name.is_empty() => {
                                    format!("{application}:{}", clean(name))
                                }
                                _ => application,
                            }
                        })
                        .unwrap_or_else(|| DASH.to_owned())
                };
                vec![endpoint(0), endpoint(1), cell(relation.get("interface"))]
            })
            .collect();
        rows.sort();
        out.push('\n');
        table(
            &mut out,
            &["Integration provider", "Requirer", "Interface"],
            rows,
        );
    }
    Ok(out)
}

/// What a missing or empty field shows.
const DASH: &str = "-";

/// The staged rollout of machine agents (`model.lockstep.rollout`): its state, and when
/// agents failed, each with its reason; what an abort holds; and how to go on.
fn rollout_tables(out: &mut String, rollout: &Map<String, Value>) {
    let count = |key: &str| rollout.get(key).and_then(Value::as_u64).unwrap_or(0);
    let canaries = rollout
        .get("canaries")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(Value::as_str)
                .map(clean)
                .collect::<Vec<_>>()
                .join(",")
        })
        .filter(|ids| !ids.is_empty())
        .unwrap_or_else(|| DASH.to_owned());
    let passed = match rollout.get("canaries-passed") {
        Some(Value::Bool(true)) => "passed",
        _ if canaries == DASH => DASH,
        _ => "not yet",
    };
    out.push('\n');
    table(
        out,
        &[
            "Rollout",
            "State",
            "Agents",
            "Admitted",
            "On-target",
            "Canaries",
            "Canaries-passed",
        ],
        vec![vec![
            cell(rollout.get("target")),
            cell(rollout.get("state")),
            count("agents").to_string(),
            count("admitted").to_string(),
            count("on-target").to_string(),
            canaries,
            passed.to_owned(),
        ]],
    );
    let failed = entries(rollout.get("failed"));
    if !failed.is_empty() {
        out.push('\n');
        let rows = failed
            .iter()
            .map(|(machine, reason)| vec![clean(machine), cell(Some(reason))])
            .collect();
        table(out, &["Failed-machine", "Reason"], rows);
    }
    let held = entries(rollout.get("held"));
    if !held.is_empty() {
        out.push('\n');
        let rows = held
            .iter()
            .map(|(machine, version)| vec![clean(machine), cell(Some(version))])
            .collect();
        table(out, &["Held-machine", "Held-on"], rows);
    }
    if rollout.get("state").and_then(Value::as_str) == Some("halted") {
        out.push_str(
            "\nThe rollout is halted: no machine agent is upgraded until `lockstep upgrade-model \
             --resume`.\n",
        );
    }
}

fn object(status: &Value) -> Result<&Map<String, Value>, StatusError> {
    status.as_object().ok_or_else(|| {
        let found = match status {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        let mut text = status.to_string();
        if text.chars().count() > crate::quote::QUOTE_LENGTH_MAX {
            text = text
                .chars()
                .take(crate::quote::QUOTE_LENGTH_MAX)
                .collect::<String>()
                + "...";
        }
        StatusError::NotAnObject { found, text }
    })
}

/// A map's entries sorted naturally by key (`wordpress/2` before `wordpress/10`); empty
/// when the value is missing or not a map.
fn entries(value: Option<&Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<(&String, &Value)> = value
        .and_then(Value::as_object)
        .map(|map| map.iter().collect())
        .unwrap_or_default();
    entries.sort_by(|a, b| natural_key(a.0).cmp(&natural_key(b.0)));
    entries
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Chunk<'a> {
    Number(u64),
    Text(&'a str),
}

/// Splits `text` into runs of digits (compared as numbers) and other characters.
fn natural_key(text: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let mut rest = text;
    while let Some(first) = rest.chars().next() {
        let digits = first.is_ascii_digit();
        let end = rest
            .find(|c: char| c.is_ascii_digit() != digits)
            .unwrap_or(rest.len());
        let (run, tail) = rest.split_at(end);
        chunks.push(match run.parse::<u64>() {
            Ok(number) if digits => Chunk::Number(number),
            _ => Chunk::Text(run),
        });
        rest = tail;
    }
    chunks
}

/// A scalar as table text; missing, null, empty or structured values show `-`.
fn cell(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) if !text.trim().is_empty() => clean(text),
        Some(Value::Number(number)) => number.to_string(),
        Some(Value::Bool(flag)) => flag.to_string(),
        _ => DASH.to_owned(),
    }
}

fn quoted(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => format!("{:?}", clean(text)),
        _ => DASH.to_owned(),
    }
}

/// Text safe in one table cell: control characters (a newline would break the table, an
/// escape sequence would reach the terminal) become spaces.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// `k/n to V` while the lifecycle is not Ready and has progress to show.
fn progress(phase: &str, lockstep: &Map<String, Value>) -> String {
    if phase == "ready" || phase == DASH {
        return DASH.to_owned();
    }
    let step = lockstep.get("step").and_then(Value::as_u64);
    let steps = lockstep.get("steps").and_then(Value::as_u64);
    let target = match lockstep.get("target-version") {
        Some(Value::String(version)) if !version.is_empty() => Some(clean(version)),
        _ => None,
    };
    match (step, steps, target) {
        (Some(step), Some(steps), Some(target)) if steps > 0 => {
            format!("{step}/{steps} to {target}")
        }
        (Some(step), Some(steps), None) if steps > 0 => format!("{step}/{steps}"),
        (_, _, Some(target)) => format!("to {target}"),
        _ => DASH.to_owned(),
    }
}

/// The time of an RFC 3339 timestamp, as `juju status` shows it (`12:00:00Z`).
fn timestamp(value: Option<&Value>) -> String {
    let text = cell(value);
    match text.split_once('T') {
        Some((_, time)) if !time.is_empty() => time.to_owned(),
        _ => text,
    }
}

/// `ubuntu@22.04`, as Juju 3 shows a base.
fn base(value: Option<&Value>) -> String {
    let name = value.and_then(|base| base.get("name"));
    let channel = value.and_then(|base| base.get("channel"));
    match (cell(name), cell(channel)) {
        (name, _) if name == DASH => DASH.to_owned(),
        (name, channel) if channel == DASH => name,
        (name, channel) => format!("{name}@{channel}"),
    }
}

/// The charm's name, as `juju status` shows it: `ch:amd64/jammy/wordpress-7` is
/// `wordpress`, `postgresql` is `postgresql`.
fn charm_name(value: Option<&Value>) -> String {
    let text = cell(value);
    if text == DASH {
        return text;
    }
    let without_schema = text.split_once(':').map_or(text.as_str(), |(_, rest)| rest);
    let last = without_schema.rsplit('/').next().unwrap_or(without_schema);
    let name = match last.rsplit_once('-') {
        Some((name, revision))
            if !name.is_empty()
                && !revision.is_empty()
                && revision.bytes().all(|b| b.is_ascii_digit()) =>
        {
            name
        }
        _ => last,
    };
    if name.is_empty() {
        text
    } else {
        name.to_owned()
    }
}

/// Appends a table: a header and rows, each column as wide as its widest cell, two spaces
/// between columns, no trailing spaces.
/// A rate as `lockstep status` shows it: `117.0MB/s` (decimal units, as download tools
/// show them).
fn bytes_per_second(rate: u64) -> String {
    let rate = rate as f64;
    match rate {
        r if r >= 1e9 => format!("{:.1}GB/s", r / 1e9),
        r if r >= 1e6 => format!("{:.1}MB/s", r / 1e6),
        r if r >= 1e3 => format!("{:.1}kB/s", r / 1e3),
        r => format!("{r:.0}B/s"),
    }
}

fn table(out: &mut String, header: &[&str], rows: Vec<Vec<String>>) {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|title| title.chars().count()).collect();
    for row in &rows {
        debug_assert_eq!(row.len(), columns, "every row has a cell per column");
        for (width, text) in widths.iter_mut().zip(row) {
            *width = (*width).max(text.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (index, (cell, width)) in cells.zip(&widths).enumerate() {
            if index > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            let padding = width.saturating_sub(cell.chars().count());
            text.extend(std::iter::repeat_n(' ', padding));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_parse_and_an_unknown_one_lists_the_accepted() {
        assert_eq!("tabular".parse::<Format>(), Ok(Format::Tabular));
        assert_eq!("JSON".parse::<Format>(), Ok(Format::Json));
        assert_eq!("yaml".parse::<Format>(), Ok(Format::Yaml));
        let error = "xml".parse::<Format>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown status format \"xml\": expected one of tabular, json, yaml"
        );
        for format in Format::ALL {
            assert_eq!(format.to_string().parse::<Format>(), Ok(format));
        }
    }

    #[test]
    fn a_reply_that_is_not_an_object_is_an_error_in_every_format() {
        for format in Format::ALL {
            let error = render(&json!(["not", "status"]), format).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("expected a JSON object, got an array"),
                "{error}"
            );
        }
    }

    #[test]
    fn each_machine_shows_its_agents_state_version_phase_download_rate_and_jobs() {
        let status = json!({
            "machines": {
                "0": {"jobs": ["JobManageModel"],
                      "agent-status": {"status": "started", "version": "2.9.44",
                                       "data": {"phase": "ready"}}},
                "1": {"jobs": ["JobHostUnits", "JobManageFirewall"],
                      "agent-status": {"status": "down", "version": "2.9.43",
                                       "data": {"phase": "upgrading",
                                                "download-rate": 117_049_000u64}}},
            },
        });
        let tabular = render(&status, Format::Tabular).unwrap();
        let lines: Vec<Vec<&str>> = tabular
            .lines()
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert!(
            lines.contains(&vec![
                "Machine", "State", "Version", "Phase", "Download", "Base", "Jobs"
            ]),
            "{tabular}"
        );
        assert!(
            lines.contains(&vec![
                "0",
                "started",
                "2.9.44",
                "ready",
                "-",
                "-",
                "JobManageModel"
            ]),
            "{tabular}"
        );
        assert!(
            lines.contains(&vec![
                "1",
                "down",
                "2.9.43",
                "upgrading",
                "117.0MB/s",
                "-",
                "JobHostUnits,JobManageFirewall"
            ]),
            "{tabular}"
        );
        assert_eq!(bytes_per_second(999), "999B/s");
        assert_eq!(bytes_per_second(1_250), "1.2kB/s");
        assert_eq!(bytes_per_second(2_500_000_000), "2.5GB/s");
    }

    #[test]
    fn the_controllers_metadata_verification_is_shown_in_every_format() {
        let status = json!({
            "model": {"name": "controller"},
            "machines": {
                "0": {"lockstep": {"metadata-verification": "signed (key 0A1B)"}},
                "1": {},
            },
        });
        let tabular = render(&status, Format::Tabular).unwrap();
        assert!(
            tabular.contains("\nMachine  Metadata-verification\n0        signed (key 0A1B)\n"),
            "{tabular}"
        );
        for format in [Format::Json, Format::Yaml] {
            let text = render(&status, format).unwrap();
            assert!(text.contains("metadata-verification"), "{text}");
            assert!(text.contains("signed (key 0A1B)"), "{text}");
        }
        // A controller that does not say shows no such table.
        let tabular = render(&json!({"machines": {"0": {}}}), Format::Tabular).unwrap();
        assert!(!tabular.contains("Metadata-verification"), "{tabular}");
    }

    #[test]
    fn how_the_controller_reaches_etcd_is_shown_in_every_format() {
        let access = "INSECURE: plain http to http://192.0.2.1:2379, not loopback, accepted by --etcd-insecure, no user";
        let status = json!({
            "machines": {
                "0": {"lockstep": {"metadata-verification": "unsigned-allowed", "etcd": access}},
                "1": {},
            },
        });
        let tabular = render(&status, Format::Tabular).unwrap();
        assert!(
            tabular.contains(&format!("\nMachine  Etcd\n0        {access}\n")),
            "{tabular}"
        );
        for format in [Format::Json, Format::Yaml] {
            let text = render(&status, format).unwrap();
            assert!(text.contains("etcd"), "{text}");
            assert!(text.contains("--etcd-insecure"), "{text}");
        }
        // A controller on SQLite says nothing of etcd.
        let tabular = render(
            &json!({"machines": {"0": {"lockstep": {"metadata-verification": "unsigned-allowed"}}}}),
            Format::Tabular,
        )
        .unwrap();
        assert!(!tabular.contains("Etcd"), "{tabular}");
    }

    #[test]
    fn missing_and_mistyped_fields_show_a_dash() {
        let text = render(
            &json!({"model": {"name": 7, "lockstep": "?"}}),
            Format::Tabular,
        )
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "7      -           -        -      -                  -         -       -          -"
        );
        assert_eq!(lines[3], "Model - is empty.");
        let text = render(
            &json!({"applications": {"a": {"units": {"a/0": {}}}}, "machines": {"0": 5}}),
            Format::Tabular,
        )
        .unwrap();
        assert!(
            text.contains("\na    -        -       1      -      -\n"),
            "{text}"
        );
        assert!(text.contains("\na/0   -         -      -\n"), "{text}");
        assert!(
            text.contains("\n0        -      -        -      -         -     -\n"),
            "{text}"
        );
    }

    #[test]
    fn names_sort_naturally_and_charms_show_their_names() {
        let mut names = vec!["a/10", "a/2", "b/0", "a/1"];
        names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
        assert_eq!(names, ["a/1", "a/2", "a/10", "b/0"]);
        for (charm, name) in [
            ("ch:amd64/jammy/wordpress-7", "wordpress"),
            ("cs:trusty/mysql-42", "mysql"),
            ("postgresql", "postgresql"),
            ("local:my-charm", "my-charm"),
            ("haproxy-k8s", "haproxy-k8s"),
        ] {
            assert_eq!(charm_name(Some(&json!(charm))), name, "{charm}");
        }
    }

    #[test]
    fn control_characters_cannot_break_a_table() {
        let text = render(
            &json!({"model": {"name": "m\n\u{1b}[31mred", "version": "1.0.0"}}),
            Format::Tabular,
        )
        .unwrap();
        assert!(!text.contains('\u{1b}'));
        assert_eq!(text.lines().count(), 4, "{text}");
    }
}
