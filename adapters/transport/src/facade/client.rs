//! `Client`: `FullStatus`, `FindTools`, `AbortCurrentUpgrade`, `SetModelAgentVersion`,
//! `ModelGet`, `ModelSet` and `ModelUnset` (Juju 2.0's, for python-jujuclient; the same as
//! `ModelConfig`'s), `AddMachines` and `WatchAll`.

use lockstep_core::gate::GateView;
use lockstep_core::lifecycle::Revision;
use serde_json::{Value, json};

use lockstep_core::policy::Stream;

use crate::api::Api;
use crate::backend::LifecycleStatus;
use crate::facade::model_config;
use crate::limits::Refusal;
use crate::session::Session;
use crate::state::{Status, detailed_status};
use crate::tools::{self, FindTools};
use crate::wire::WireError;

/// `Client.FullStatus`: the state's status with the lifecycle's detail under
/// `model.lockstep` (the gate's `view` as the call was admitted), at the time the server
/// reads now.
pub async fn full_status(api: &Api, view: GateView) -> Result<Value, WireError> {
    let lifecycle = LifecycleStatus::of(&*api.backend, view);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let status = api.state.status().await?;
    Ok(full_status_reply(status, &lifecycle, now))
}

/// `Client.FullStatus`'s reply: a correctly typed subset of Juju's, with lockstep's
/// lifecycle detail under `model.lockstep`.
pub fn full_status_reply(
    status: Status,
    lifecycle: &LifecycleStatus,
    now_unix_seconds: u64,
) -> Value {
    let view = lifecycle.gate;
    let ready = view.phase.is_ready();
    let model_status = if ready {
        detailed_status("available", "", None, "")
    } else {
        detailed_status(
            "busy",
            &format!("upgrade in progress: {}", view.phase),
            None,
            "",
        )
    };
    json!({
        "model": {
            "name": status.model_name,
            "type": "iaas",
            "cloud-tag": "cloud-localhost",
            "region": "localhost",
            "version": lifecycle.agent_version,
            "available-version": lifecycle.upgrade_available.clone().unwrap_or_default(),
            "model-status": model_status,
            "meter-status": {"color": "", "message": ""},
            "sla": "unsupported",
            "lockstep": {
                "phase": view.phase.as_str(),
                "step": view.progress.done,
                "steps": view.progress.total,
                "target-version": view.progress.target.map(|version| version.to_string()),
                "upgrade-available": lifecycle.upgrade_available,
                "capabilities": status.capabilities,
                "rollout": status.rollout,
            },
        },
        "machines": status.machines,
        "applications": status.applications,
        "remote-applications": {},
        "offers": {},
        "relations": status.relations,
        "controller-timestamp": rfc3339(now_unix_seconds),
        "branches": {},
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a UNIX time (civil-from-days, proleptic Gregorian).
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let seconds = unix_seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

/// `Client.FindTools`: the catalogue's binaries that match (see [`FindTools`]), as
/// `{"list": [{"version", "url", "size", "sha256"}]}` with URLs on the tools endpoint. As in
/// Juju, finding nothing is `{"list": [], "error": {"message": "no matching agent binaries
/// available", "code": "not found"}}`, and an unreadable catalogue an `error` too.
pub async fn find_tools(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let search = FindTools::parse(params)?;
    let model_stream = api.state.agent_stream().await?;
    let root = api.model_root(session);
    Ok(match api.backend.catalogue().await {
        Err(reason) => {
            json!({"list": [], "error": {"message": tools::catalogue_unreadable(&reason)}})
        }
        Ok(catalogue) => {
            let found = search.search(&catalogue, model_stream);
            if found.is_empty() {
                json!({"list": [], "error": {"message": tools::NO_MATCHES, "code": "not found"}})
            } else {
                let list: Vec<Value> = found
                    .iter()
                    .map(|entry| tools::tools_json(entry, &root))
                    .collect();
                json!({"list": list})
            }
        }
    })
}

/// `Client.AbortCurrentUpgrade`: an operator's abort, handed to the lifecycle.
pub fn abort_current_upgrade(api: &Api) -> Result<Value, WireError> {
    api.backend
        .abort_current_upgrade()
        .map(|()| json!({}))
        .map_err(|message| WireError::new("", message))
}

/// `Client.SetModelAgentVersion {"version", "agent-stream"?, "force"?}`, Juju's
/// `params.SetModelAgentVersion` (`force` is its `IgnoreAgentVersions`, the CLI's
/// `--ignore-agent-versions`): the model's agent-version changed as `ModelConfig.ModelSet`
/// changes it, and, as in Juju, unless `force`, refused while an agent runs another version
/// than the model's. `agent-stream`, when given, must be the model's (lockstep chooses it
/// at bootstrap). An admin's write, like `agent-version` in `ModelSet`.
pub async fn set_model_agent_version(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    model_config::check_writer(session.model_access(), "agent-version")?;
    let version = model_config::agent_version_param(
        "params.version",
        params.get("version").unwrap_or(&Value::Null),
    )?;
    let force = match params.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(force)) => *force,
        Some(other) => {
            return Err(WireError::new(
                "bad request",
                format!("params.force must be a boolean, got {other}"),
            ));
        }
    };
    match params.get("agent-stream") {
        None | Some(Value::Null) => {}
        Some(Value::String(stream)) if stream.is_empty() => {}
        Some(Value::String(stream)) => {
            let model = api.state.agent_stream().await?.unwrap_or(Stream::Released);
            if stream != model.as_str() {
                return Err(WireError::new(
                    "not supported",
                    format!(
                        "agent-stream {stream:?} is not the model's ({model}): lockstep \
                         chooses it at bootstrap (lockstep bootstrap --agent-stream)"
                    ),
                ));
            }
        }
        Some(other) => {
            return Err(WireError::new(
                "bad request",
                format!("params.agent-stream must be a string, got {other}"),
            ));
        }
    }
    model_config::change_agent_version(api, version, !force, "Client.SetModelAgentVersion").await
}

/// `Client.WatchAll {"after-revision"?: R}`: a new watcher on this connection. Without
/// `after-revision` its first `Next` sends the whole state, as Juju's does; with it (our
/// extension) it resumes after revision R, so a client that reconnects loses nothing.
/// Watchers are bounded per connection and over all connections; over either, Juju's
/// `quota limit exceeded`.
pub fn watch_all(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let position = params
        .get("after-revision")
        .and_then(Value::as_u64)
        .map(Revision);
    let limits = &api.config.limits;
    let refused = |error| {
        api.connections.count(Refusal::Watchers);
        error
    };
    let slot = api.connections.watcher_slot().ok_or_else(|| {
        refused(WireError::new(
            "quota limit exceeded",
            format!(
                "the controller holds {} watchers, its limit (--max-watchers); stop one first",
                limits.watchers_max
            ),
        ))
    })?;
    let id = session
        .add_watcher(position, limits.watchers_per_connection_max, slot)
        .map_err(refused)?;
    Ok(json!({"watcher-id": id.to_string()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_793_730_125), "2026-11-03T18:22:05Z");
    }
}
