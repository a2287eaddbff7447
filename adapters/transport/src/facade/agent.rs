//! `Agent` (v3): `GetEntities`, by which a machine agent learns its life and jobs. An agent
//! may ask about itself only.

use serde_json::{Value, json};

use crate::api::Api;
use crate::auth::machine_id;
use crate::facade::upgrader::entity_tags;
use crate::session::Session;
use crate::wire::WireError;

/// `Agent.GetEntities {"entities": [{"tag": "machine-1"}]}` → `{"entities": [{"life",
/// "jobs", "container-type"} | {"error"}]}` (Juju's `AgentGetEntitiesResults`), in order. A
/// tag other than the agent's own gets `permission denied`; the jobs are the core's rule
/// over the machine's roles and the model's capabilities, as status reports them.
pub async fn get_entities(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    let owner = session.agent();
    let tags = entity_tags(params, "entities", "tag")?;
    let asked: Vec<Result<String, WireError>> = tags
        .iter()
        .map(|tag| {
            if *tag == owner {
                machine_id(tag).ok_or_else(WireError::permission_denied)
            } else {
                Err(WireError::permission_denied())
            }
        })
        .collect();
    let ids: Vec<String> = asked
        .iter()
        .filter_map(|id| id.as_ref().ok().cloned())
        .collect();
    let mut found = if ids.is_empty() {
        Vec::new()
    } else {
        api.state.agent_entities(&ids).await?
    }
    .into_iter();
    let entities: Vec<Value> = asked
        .into_iter()
        .map(|id| {
            let entity = id.and_then(|_| {
                found
                    .next()
                    .unwrap_or_else(|| Err(WireError::new("", "the state answered no entity")))
            });
            match entity {
                Ok(entity) => json!({"life": entity.life, "jobs": entity.jobs,
                                     "container-type": entity.container_type}),
                Err(error) => json!({"error": error.result_json()}),
            }
        })
        .collect();
    Ok(json!({"entities": entities}))
}
