//! `Machiner` (v5): `SetStatus`, by which a machine agent reports its status. An agent
//! reports on itself only. The gate admits it to agents in every phase
//! (`lockstep_core::gate::AGENT_REPORTS`): a report refused during an upgrade would show
//! the agent `down`.

use std::time::Duration;

use lockstep_core::Binary;
use serde_json::{Value, json};

use crate::api::Api;
use crate::facade::upgrader::entity_tags;
use crate::session::Session;
use crate::state::AgentStatusReport;
use crate::wire::WireError;

/// How often a machine agent sends `Machiner.SetStatus` while it runs (lockstep's agents
/// send it again even when nothing changed, so that a silent agent shows).
pub const AGENT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// How long after an agent's last status a machine shows its agent `down`
/// ([`AGENT_DOWN`]): three status intervals, so one lost or late report does not.
pub const AGENT_DOWN_AFTER: Duration = Duration::from_secs(3 * AGENT_STATUS_INTERVAL.as_secs());

/// The status and message of an agent that has not reported within [`AGENT_DOWN_AFTER`]
/// (Juju's words).
pub const AGENT_DOWN: (&str, &str) = ("down", "agent is not communicating with the server");

/// The statuses a machine agent may set (Juju's `state.Machine.SetStatus`): `error` with a
/// message only.
pub const AGENT_STATUSES: &[&str] = &["started", "stopped", "error", "pending"];

/// The longest `info` kept, in bytes.
pub const STATUS_INFO_BYTES_MAX: usize = 4096;

/// The longest `data.phase`, in bytes.
pub const STATUS_PHASE_BYTES_MAX: usize = 64;

/// `Machiner.SetStatus {"entities": [{"tag", "status", "info", "data": {"phase",
/// "version"}}]}` → `{"results": [{} | {"error"}]}`, in order. Each entry is checked here
/// (its own tag, a status Juju lets a machine agent set, lockstep's `data`), then the
/// state records those that passed.
pub async fn set_status(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let owner = session.agent();
    let tags = entity_tags(params, "entities", "tag")?;
    let entries = params
        .get("entities")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let checked: Vec<Result<AgentStatusReport, WireError>> = tags
        .iter()
        .zip(entries)
        .map(|(tag, entry)| {
            if *tag != owner {
                return Err(WireError::permission_denied());
            }
            report(tag, entry)
        })
        .collect();
    let reports: Vec<AgentStatusReport> = checked
        .iter()
        .filter_map(|report| report.as_ref().ok().cloned())
        .collect();
    let mut recorded = if reports.is_empty() {
        Vec::new()
    } else {
        api.state.set_agent_statuses(&reports).await?
    }
    .into_iter();
    let results: Vec<Value> = checked
        .into_iter()
        .map(|report| {
            let outcome = report.and_then(|_| {
                recorded
                    .next()
                    .unwrap_or_else(|| Err(WireError::new("", "the state answered no result")))
            });
            match outcome {
                Ok(()) => json!({}),
                Err(error) => json!({"error": error.result_json()}),
            }
        })
        .collect();
    Ok(json!({"results": results}))
}

/// One entry of `SetStatus`, checked.
fn report(tag: &str, entry: &Value) -> Result<AgentStatusReport, WireError> {
    let bad = |message: String| WireError::new("bad request", message);
    let text = |value: Option<&Value>, what: &str| -> Result<String, WireError> {
        match value {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(bad(format!("{what} must be a string"))),
        }
    };
    let status = text(entry.get("status"), "status")?;
    let info = text(entry.get("info"), "info")?;
    let data = entry.get("data").filter(|data| !data.is_null());
    if let Some(data) = data
        && !data.is_object()
    {
        return Err(bad("data must be an object".into()));
    }
    let phase = text(data.and_then(|data| data.get("phase")), "data.phase")?;
    let version = text(data.and_then(|data| data.get("version")), "data.version")?;
    let download_rate = match data.and_then(|data| data.get("download-rate")) {
        None | Some(Value::Null) => None,
        Some(rate) => Some(rate.as_u64().filter(|rate| *rate > 0).ok_or_else(|| {
            bad(format!(
                "data.download-rate must be a whole number of bytes per second above 0, not {rate}"
            ))
        })?),
    };
    match status.as_str() {
        "down" => return Err(bad(format!("cannot set status {status:?}"))),
        "error" if info.is_empty() => {
            return Err(bad(format!("cannot set status {status:?} without info")));
        }
        known if AGENT_STATUSES.contains(&known) => {}
        _ => {
            let shown: String = status.chars().take(64).collect();
            return Err(bad(format!("cannot set invalid status {shown:?}")));
        }
    }
    if info.len() > STATUS_INFO_BYTES_MAX {
        return Err(bad(format!(
            "info of {} bytes; at most {STATUS_INFO_BYTES_MAX}",
            info.len()
        )));
    }
    if phase.len() > STATUS_PHASE_BYTES_MAX
        || !phase.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
    {
        return Err(bad(format!(
            "data.phase must be a phase name (lowercase letters and '-', at most {STATUS_PHASE_BYTES_MAX} bytes)"
        )));
    }
    let version = if version.is_empty() {
        None
    } else {
        Some(Binary::parse(&version).map_err(|error| bad(format!("data.version: {error}")))?)
    };
    Ok(AgentStatusReport {
        tag: tag.to_owned(),
        status,
        info,
        phase,
        version,
        download_rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_is_down_after_three_missed_reports() {
        assert_eq!(AGENT_DOWN_AFTER, Duration::from_secs(30));
        assert_eq!(AGENT_DOWN_AFTER, AGENT_STATUS_INTERVAL * 3);
    }

    #[test]
    fn entries_are_checked_as_juju_checks_a_machine_s_status() {
        let ok = report(
            "machine-1",
            &json!({"status": "started", "info": "", "data": {"phase": "ready", "version": "2.9.44-ubuntu-amd64", "download-rate": 117_000_000u64}}),
        )
        .unwrap();
        assert_eq!(ok.phase, "ready");
        assert_eq!(ok.version.unwrap().to_string(), "2.9.44-ubuntu-amd64");
        assert_eq!(ok.download_rate, Some(117_000_000));
        let plain = report("machine-1", &json!({"status": "stopped"})).unwrap();
        assert_eq!(
            (plain.phase.as_str(), plain.version, plain.download_rate),
            ("", None, None)
        );
        for (entry, message) in [
            (json!({"status": "down"}), "cannot set status \"down\""),
            (
                json!({"status": "error"}),
                "cannot set status \"error\" without info",
            ),
            (
                json!({"status": "running"}),
                "cannot set invalid status \"running\"",
            ),
            (json!({"status": 3}), "status must be a string"),
            (
                json!({"status": "started", "data": {"version": "2.9"}}),
                "data.version: ",
            ),
            (
                json!({"status": "started", "data": {"phase": "Ready!"}}),
                "data.phase must be a phase name",
            ),
            (
                json!({"status": "started", "data": []}),
                "data must be an object",
            ),
            (
                json!({"status": "started", "data": {"download-rate": -5}}),
                "data.download-rate must be a whole number of bytes per second above 0, not -5",
            ),
            (
                json!({"status": "started", "data": {"download-rate": 0}}),
                "data.download-rate must be",
            ),
            (
                json!({"status": "started", "data": {"download-rate": "fast"}}),
                "data.download-rate must be",
            ),
        ] {
            let error = report("machine-1", &entry).unwrap_err();
            assert_eq!(error.code, "bad request", "{entry}");
            assert!(
                error.message.starts_with(message),
                "{entry}: {}",
                error.message
            );
        }
    }
}
