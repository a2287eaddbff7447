//! `Upgrader`, the machine agents' facade: `SetTools` (and `SetVersion`), `DesiredVersion`,
//! `Tools` and `WatchAPIVersion` (whose watchers `NotifyWatcher` serves). An agent may ask
//! about, and report for, itself only.

use lockstep_core::{Binary, Version};
use serde_json::{Value, json};

use crate::api::Api;
use crate::limits::Refusal;
use crate::session::Session;
use crate::state::AgentViews;
use crate::tools;
use crate::wire::WireError;

/// Entities one `Upgrader` call may name.
pub const ENTITIES_PER_CALL_MAX: usize = 100;

/// The `field` of each entity of the list `params.<key>`, in order (empty when missing);
/// refused beyond [`ENTITIES_PER_CALL_MAX`].
pub fn entity_tags(params: &Value, key: &str, field: &str) -> Result<Vec<String>, WireError> {
    let entities = params
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::new("bad request", format!("params.{key} must be a list")))?;
    if entities.len() > ENTITIES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} entities asked for; at most {ENTITIES_PER_CALL_MAX} per call",
                entities.len()
            ),
        ));
    }
    Ok(entities
        .iter()
        .map(|entity| {
            entity
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect())
}

/// `Upgrader.SetTools` (Juju's wire name; its Go client calls it `SetVersion`, which is
/// served too) params `{"agent-tools": [{"tag", "tools": {"version": "2.9.44-ubuntu-amd64"}}]}`:
/// records the binary each agent runs on its machine. Answers
/// `{"results": [{} | {"error"}]}`; honours `operation-id`.
pub async fn set_tools(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    api.state.set_tools(&session.agent(), params).await
}

/// This API server's own version, as the lifecycle reports it.
pub(crate) fn server_version(api: &Api) -> Result<Version, WireError> {
    let own = api.backend.agent_version();
    Version::parse(&own).map_err(|error| {
        WireError::new(
            "",
            format!("this controller's own version is unreadable: {error}"),
        )
    })
}

/// The views of the entities `params` names (`{"entities": [{"tag"}]}`), for the agent
/// logged in on `session`, with this server's own version.
async fn agent_views(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<AgentViews, WireError> {
    let server_version = server_version(api)?;
    let tags = entity_tags(params, "entities", "tag")?;
    api.state
        .agent_views(&session.agent(), server_version, &tags)
        .await
}

/// `Upgrader.WatchAPIVersion {"entities": [{"tag"}]}`: for each, a NotifyWatcher of that
/// agent's desired version on this connection, `{"results": [{"NotifyWatcherId": "<n>"} |
/// {"error"}]}` (Juju's key, without a JSON tag). The agent may watch itself only; its
/// machine must exist. Watchers count against the connection's and the controller's
/// watcher limits, as AllWatchers do (over either, Juju's `quota limit exceeded`).
pub async fn watch_api_version(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    let views = agent_views(api, session, params).await?;
    let tags = entity_tags(params, "entities", "tag")?;
    let limits = &api.config.limits;
    let results: Vec<Value> = tags
        .iter()
        .zip(views.entities)
        .map(|(tag, view)| {
            let watcher = view.and_then(|_| {
                let slot = api.connections.watcher_slot().ok_or_else(|| {
                    WireError::new(
                        "quota limit exceeded",
                        format!(
                            "the controller holds {} watchers, its limit (--max-watchers); stop one first",
                            limits.watchers_max
                        ),
                    )
                })?;
                session.add_notify_watcher(tag, limits.watchers_per_connection_max, slot)
            });
            match watcher {
                Ok(id) => json!({"NotifyWatcherId": id.to_string()}),
                Err(error) => {
                    if error.code == "quota limit exceeded" {
                        api.connections.count(Refusal::Watchers);
                    }
                    json!({"error": error.result_json()})
                }
            }
        })
        .collect();
    Ok(json!({"results": results}))
}

/// `Upgrader.DesiredVersion {"entities": [{"tag"}]}`: for each, the version it should run
/// (Juju's controllers-first rule): `{"results": [{"version"} | {"error"}]}`; lockstep adds
/// `stage-version` while a staged rollout tells the agent to fetch that version ahead of
/// its admission (Juju's agents ignore the key).
pub async fn desired_version(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    let views = agent_views(api, session, params).await?;
    let results: Vec<Value> = views
        .entities
        .iter()
        .map(|entity| match entity {
            Ok(view) => match view.stage {
                Some(stage) => json!({
                    "version": view.desired.to_string(),
                    "stage-version": stage.to_string(),
                }),
                None => json!({"version": view.desired.to_string()}),
            },
            Err(error) => json!({"error": error.result_json()}),
        })
        .collect();
    Ok(json!({"results": results}))
}

/// `Upgrader.Tools {"entities": [{"tag"}]}`: for each, the catalogue's binary of its
/// desired version for the release and architecture it runs, with a URL on the tools
/// endpoint: `{"results": [{"tools": [{"version", "url", "size", "sha256"}],
/// "disable-ssl-hostname-verification": false} | {"error"}]}`; lockstep adds `stage-tools`,
/// the same for the version to fetch ahead (`stage-version`), when the catalogue has it.
pub async fn tools(api: &Api, session: &Session, params: &Value) -> Result<Value, WireError> {
    let views = agent_views(api, session, params).await?;
    let catalogue = api.backend.catalogue().await;
    let root = api.model_root(session);
    let results: Vec<Value> = views
        .entities
        .iter()
        .map(|entity| {
            let ahead = entity.as_ref().ok().and_then(|view| {
                let running = view.running.clone()?;
                let catalogue = catalogue.as_ref().ok()?;
                let wanted = Binary {
                    number: view.stage?,
                    ..running
                };
                let entry = catalogue.entry_for(&wanted, views.model_stream)?;
                Some(tools::tools_json(entry, &root))
            });
            let found = entity.clone().and_then(|view| {
                let running = view.running.ok_or_else(|| {
                    WireError::new(
                        "not found",
                        "the agent has not reported the binary it runs (Upgrader.SetTools)",
                    )
                })?;
                let catalogue = catalogue
                    .as_ref()
                    .map_err(|reason| WireError::new("", tools::catalogue_unreadable(reason)))?;
                let wanted = Binary {
                    number: view.desired,
                    ..running
                };
                catalogue
                    .entry_for(&wanted, views.model_stream)
                    .map(|entry| tools::tools_json(entry, &root))
                    .ok_or_else(|| {
                        WireError::new("not found", format!("{} for {wanted}", tools::NO_MATCHES))
                    })
            });
            match found {
                Ok(tools) => match ahead {
                    Some(ahead) => json!({
                        "tools": [tools],
                        "stage-tools": [ahead],
                        "disable-ssl-hostname-verification": false,
                    }),
                    None => {
                        json!({"tools": [tools], "disable-ssl-hostname-verification": false})
                    }
                },
                Err(error) => json!({"error": error.result_json()}),
            }
        })
        .collect();
    Ok(json!({"results": results}))
}
