//! The Upgrader facade's share of the state: each agent's desired version (Juju's
//! controllers-first rule) and the binary it runs, and `SetTools`, which records it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lockstep_core::lifecycle::Revision;
use lockstep_core::rollout::{self, Rollout, RolloutPolicy};
use lockstep_core::upgrader::{self, AskingAgent};
use lockstep_core::{Binary, Version};
use lockstep_store::{Machine, Model, Store};
use lockstep_transport::auth::machine_id;
use lockstep_transport::facade::upgrader::entity_tags;
use lockstep_transport::state::{AgentView, AgentViews};
use lockstep_transport::wire::WireError;
use serde_json::{Value, json};

use super::calls::{list, mutate, store_error};
use super::machines::{is_controller, roles};
use super::model_config::settings;

/// The agent-version `machine`'s agent should run: the core's controllers-first rule
/// ([`upgrader::desired_version`]) over what the store holds: the model's agent-version,
/// each controller machine's reported binary, and `server_version`, this API server's own;
/// then, for an agent that is no controller, the staged rollout's word on when it goes
/// ([`rollout::told`], with the model's `rollout-*` policy and the rollout record).
pub fn desired_version(
    model: &Model,
    machines: &[Machine],
    machine: &Machine,
    server_version: Version,
    staged: (&RolloutPolicy, Option<&Rollout>),
) -> Version {
    desired_and_ahead(model, machines, machine, server_version, staged).0
}

/// [`desired_version`], and the version the staged rollout tells the agent to fetch ahead
/// of its admission ([`rollout::told_stage`]; never a controller's).
pub fn desired_and_ahead(
    model: &Model,
    machines: &[Machine],
    machine: &Machine,
    server_version: Version,
    staged: (&RolloutPolicy, Option<&Rollout>),
) -> (Version, Option<Version>) {
    let controllers_first = upgrader::desired_version(
        model.agent_version,
        AskingAgent {
            roles: roles(machine),
            reported: machine.agent_binary.as_ref(),
        },
        machines
            .iter()
            .filter(|other| is_controller(other))
            .map(|controller| controller.agent_binary.as_ref()),
        server_version,
    );
    if is_controller(machine) {
        return (controllers_first, None);
    }
    let (policy, record) = staged;
    let running = machine.agent_binary.as_ref().map(|binary| binary.number);
    (
        rollout::told(policy, record, &machine.id, running, controllers_first),
        rollout::told_stage(record, &machine.id, running, model.agent_version),
    )
}

/// The machine of `tag` if `owner` (the logged-in agent's tag) may ask about it.
fn owned_machine(machines: &[Machine], owner: &str, tag: &str) -> Result<Machine, WireError> {
    if tag != owner {
        return Err(WireError::permission_denied());
    }
    let id = machine_id(tag).ok_or_else(WireError::permission_denied)?;
    machines
        .iter()
        .find(|machine| machine.id == id)
        .cloned()
        .ok_or_else(|| WireError::new("not found", format!("machine {id} not found")))
}

/// What every agent's desired version is computed from, read in one snapshot at
/// `revision`: the model, every machine (indexed by id), the rollout policy and record.
#[derive(Debug)]
pub struct DesiredInputs {
    revision: Revision,
    model: Option<Model>,
    machines: Vec<Machine>,
    by_id: HashMap<String, usize>,
    /// The controller machines, which the controllers-first rule reads for every agent.
    controllers: Vec<Machine>,
    policy: RolloutPolicy,
    record: Option<Rollout>,
}

/// The last [`DesiredInputs`] read, shared by every `DesiredVersion`, `Tools` and
/// `NotifyWatcher.Next` of this API while the store's revision stays where it was. Every
/// write that can change a desired version (the model, a machine, the model's settings,
/// the rollout record) moves the revision; agents' status reports do not, and are not
/// read. Without it each of a fleet's N watchers, woken by one commit, read every machine:
/// N x N machines per commit; with it, one read of N per revision.
#[derive(Debug, Default)]
pub struct DesiredCache(Mutex<Option<Arc<DesiredInputs>>>);

impl DesiredCache {
    /// The inputs at the store's current revision: the cached ones when the revision has
    /// not moved, else read afresh (and cached).
    pub fn inputs(&self, store: &dyn Store) -> Result<Arc<DesiredInputs>, WireError> {
        let revision = store.revision().map_err(store_error)?;
        if let Some(cached) = self.0.lock().expect("not poisoned").as_ref()
            && cached.revision == revision
        {
            return Ok(Arc::clone(cached));
        }
        let mut read = None;
        store
            .snapshot(&mut |tx| {
                read = Some((
                    tx.revision()?,
                    tx.model()?,
                    tx.machines()?,
                    settings(tx)?,
                    tx.rollout()?,
                ));
                Ok(())
            })
            .map_err(store_error)?;
        let (revision, model, machines, settings, record) = read.expect("the snapshot body ran");
        let by_id = machines
            .iter()
            .enumerate()
            .map(|(index, machine)| (machine.id.clone(), index))
            .collect();
        let controllers = machines
            .iter()
            .filter(|machine| is_controller(machine))
            .cloned()
            .collect();
        let inputs = Arc::new(DesiredInputs {
            revision,
            model,
            machines,
            by_id,
            controllers,
            // Checked when set; a value stored before the check existed reads as Juju's
            // behaviour.
            policy: super::rollout::policy(&settings).unwrap_or_default(),
            record,
        });
        let mut cached = self.0.lock().expect("not poisoned");
        if cached
            .as_ref()
            .is_none_or(|cached| cached.revision <= inputs.revision)
        {
            *cached = Some(Arc::clone(&inputs));
        }
        Ok(inputs)
    }
}

/// `Upgrader.DesiredVersion` and `Upgrader.Tools`: each entity's desired version and
/// running binary, from the inputs at the store's current revision (`cache`). An agent may
/// ask about itself only (`owner` is its tag); others get `permission denied`.
pub fn agent_views(
    store: &dyn Store,
    cache: &DesiredCache,
    owner: &str,
    server_version: Version,
    tags: &[String],
) -> Result<AgentViews, WireError> {
    let inputs = cache.inputs(store)?;
    let model = inputs
        .model
        .as_ref()
        .ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    let entities = tags
        .iter()
        .map(|tag| {
            if tag != owner {
                return Err(WireError::permission_denied());
            }
            let id = machine_id(tag).ok_or_else(WireError::permission_denied)?;
            let machine = inputs
                .by_id
                .get(&id)
                .map(|index| &inputs.machines[*index])
                .ok_or_else(|| WireError::new("not found", format!("machine {id} not found")))?;
            let (desired, stage) = desired_and_ahead(
                model,
                &inputs.controllers,
                machine,
                server_version,
                (&inputs.policy, inputs.record.as_ref()),
            );
            Ok(AgentView {
                desired,
                running: machine.agent_binary.clone(),
                stage,
            })
        })
        .collect();
    Ok(AgentViews {
        model_stream: model.agent_stream,
        entities,
    })
}

/// `Upgrader.SetTools` (Juju's wire name; its Go client calls it `SetVersion`) params
/// `{"agent-tools": [{"tag", "tools": {"version": "2.9.44-ubuntu-amd64"}}]}`: records the
/// binary each agent runs on its machine. An agent may set its own only. Answers
/// `{"results": [{} | {"error"}]}`; honours `operation-id`.
pub fn set_tools(store: &dyn Store, owner: &str, params: &Value) -> Result<Value, WireError> {
    let tags = entity_tags(params, "agent-tools", "tag")?;
    let binaries: Vec<Result<Binary, WireError>> = list(params, "agent-tools")?
        .iter()
        .map(|entry| {
            let text = entry
                .get("tools")
                .and_then(|tools| tools.get("version"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            Binary::parse(text)
                .map_err(|error| WireError::new("bad request", format!("tools.version: {error}")))
        })
        .collect();
    mutate(store, params, &mut |tx| {
        let machines = tx.machines()?;
        let mut results = Vec::new();
        for (tag, binary) in tags.iter().zip(&binaries) {
            let outcome = owned_machine(&machines, owner, tag)
                .and_then(|machine| Ok((machine, binary.clone()?)));
            match outcome {
                Ok((mut machine, binary)) => {
                    if machine.agent_binary.as_ref() != Some(&binary) {
                        machine.agent_binary = Some(binary);
                        tx.put_machine(&machine)?;
                    }
                    results.push(json!({}));
                }
                Err(error) => results.push(json!({"error": error.result_json()})),
            }
        }
        Ok(json!({"results": results}))
    })
}
