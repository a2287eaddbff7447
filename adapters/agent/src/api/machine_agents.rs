//! What machine agents read and write of the shared state through the API: their
//! credentials (checked at every login, issued by `MachineManager.ProvisioningScript`, see
//! [`super::provisioning`]), their entity (`Agent.GetEntities`) and their status
//! (`Machiner.SetStatus`). Credentials and statuses write no event: a secret never reaches
//! a delta, and a heartbeat every few seconds per agent would flood the log.

use lockstep_core::jobs::JobTable;
use lockstep_store::{AgentStatus, Store};
use lockstep_transport::auth::machine_id;
use lockstep_transport::state::{AgentEntity, AgentStatusReport};
use lockstep_transport::wire::WireError;

use super::calls::store_error;
use super::machines::reported_jobs;
use super::status::life;

/// Agent `tag`'s password hash (argon2 PHC), `None` when no controller issued it one.
pub fn agent_password_hash(store: &dyn Store, tag: &str) -> Result<Option<String>, WireError> {
    let mut hash = None;
    store
        .snapshot(&mut |tx| {
            hash = tx.agent_password_hash(tag)?;
            Ok(())
        })
        .map_err(store_error)?;
    Ok(hash)
}

/// `Agent.GetEntities`: each machine's life, jobs (the core's rule over its roles and the
/// model's capabilities, as `FullStatus` reports them) and container type, read in one
/// snapshot; `machine 1 not found` for a machine that is not there.
pub fn agent_entities(
    store: &dyn Store,
    table: &JobTable,
    machine_ids: &[String],
) -> Result<Vec<Result<AgentEntity, WireError>>, WireError> {
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            read = Some((tx.model()?, tx.machines()?));
            Ok(())
        })
        .map_err(store_error)?;
    let (model, machines) = read.expect("the snapshot body ran");
    let model =
        model.ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    Ok(machine_ids
        .iter()
        .map(|id| {
            let machine = machines
                .iter()
                .find(|machine| machine.id == *id)
                .ok_or_else(|| WireError::new("not found", format!("machine {id} not found")))?;
            Ok(AgentEntity {
                life: life(machine.life).to_owned(),
                jobs: reported_jobs(machine, table, &model.capabilities),
                container_type: container_type(id),
            })
        })
        .collect())
}

/// The container type of machine `id`, Juju's grammar: `lxd` for `0/lxd/1`, empty for a
/// machine that is no container.
pub fn container_type(id: &str) -> String {
    let parts: Vec<&str> = id.split('/').collect();
    match parts.len() {
        0 | 1 => String::new(),
        n => parts[n - 2].to_owned(),
    }
}

/// `Machiner.SetStatus`: each report as its agent's status, stamped with the store's clock
/// (`tx.now()`, which every controller shares), in one transaction; `machine 1 not found`
/// for a machine that is not there (its result only).
pub fn set_agent_statuses(
    store: &dyn Store,
    reports: &[AgentStatusReport],
) -> Result<Vec<Result<(), WireError>>, WireError> {
    let mut results = Vec::new();
    store
        .transaction(None, &mut |tx| {
            results.clear();
            let now = tx.now();
            for report in reports {
                let id = machine_id(&report.tag).unwrap_or_default();
                if tx.machine(&id)?.is_none() {
                    results.push(Err(WireError::new(
                        "not found",
                        format!("machine {id} not found"),
                    )));
                    continue;
                }
                tx.put_agent_status(
                    &report.tag,
                    &AgentStatus {
                        status: report.status.clone(),
                        info: report.info.clone(),
                        phase: report.phase.clone(),
                        version: report.version.clone(),
                        download_rate: report.download_rate,
                        updated: now,
                    },
                )?;
                results.push(Ok(()));
            }
            Ok(())
        })
        .map_err(store_error)?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_types_follow_juju_s_machine_ids() {
        assert_eq!(container_type("1"), "");
        assert_eq!(container_type("0/lxd/1"), "lxd");
        assert_eq!(container_type("0/lxd/1/kvm/2"), "kvm");
    }
}
