//! Machines: `Client.AddMachines`, `MachineManager.AddMachines` and `lockstep add-machine`
//! (one call: [`add_machines`]), `MachineManager.DestroyMachineWithParams`, and what agent
//! authentication reads of a machine (that it exists, and its roles).

use lockstep_core::jobs::{Capabilities, Job, JobTable};
use lockstep_core::{Role, Roles};
use lockstep_store::{EntityKind, Life, Machine, Store, StoreError, Tx, Unit};
use lockstep_transport::wire::WireError;
use serde_json::{Value, json};

use super::calls::{list, mutate, store_error, tag_id};

/// Machines one `AddMachines` may add.
pub const MACHINES_PER_CALL_MAX: usize = 100;

/// `Client.AddMachines` and `MachineManager.AddMachines` `{"params": [{"jobs": [...],
/// "container-type", "parent-id", "placement", ...}, ...]}`: each machine recorded with the
/// roles its jobs stand for (seed 004; `JobHostUnits` when none are given), as `lockstep
/// add-machine` records one. lockstep makes no containers and places no machines: an entry
/// with a `container-type`, `parent-id` or `placement` gets `not supported` in its result
/// (python-libjuju raises it as `Error adding machine: ...`). `base`, `constraints` and the
/// rest are accepted and not recorded.
pub fn add_machines(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let requested = list(params, "params")?.clone();
    if requested.len() > MACHINES_PER_CALL_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} machines asked for; at most {MACHINES_PER_CALL_MAX} per call",
                requested.len()
            ),
        ));
    }
    let mut parsed = Vec::new();
    for (index, machine) in requested.iter().enumerate() {
        let jobs = machine
            .get("jobs")
            .and_then(Value::as_array)
            .map(|jobs| {
                jobs.iter()
                    .filter_map(Value::as_str)
                    .map(|job| Job::new(job.to_owned()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .map_err(|error| {
                WireError::new("bad request", format!("params[{index}].jobs: {error}"))
            })?
            .unwrap_or_else(|| vec![Job::HOST_UNITS]);
        let text = |key: &str| {
            machine
                .get(key)
                .and_then(Value::as_str)
                .filter(|text| !text.is_empty())
        };
        let placed = machine
            .get("placement")
            .is_some_and(|placement| !placement.is_null());
        parsed.push(
            match (text("container-type").or(text("parent-id")), placed) {
                (Some(container), _) => Err(WireError::new(
                    "not supported",
                    format!("lockstep makes no containers (asked for {container:?})"),
                )),
                (None, true) => Err(WireError::new(
                    "not supported",
                    format!(
                        "lockstep places no machines (asked for placement {})",
                        machine["placement"]
                    ),
                )),
                (None, false) => Ok(jobs),
            },
        );
    }
    mutate(store, params, &mut |tx| {
        let mut next = next_machine_id(tx)?;
        let mut results = Vec::new();
        for jobs in &parsed {
            match jobs {
                Ok(jobs) => {
                    let machine = Machine::from_client_jobs(next.to_string(), jobs.clone());
                    tx.put_machine(&machine)?;
                    results.push(json!({"machine": machine.id}));
                    next += 1;
                }
                Err(error) => results.push(json!({"error": error.result_json()})),
            }
        }
        Ok(json!({"machines": results}))
    })
}

/// Machines one `DestroyMachineWithParams` may name.
pub const MACHINES_PER_DESTROY_MAX: usize = 100;

/// How long a destroyed machine stays `dying` before it is removed. Juju's provisioner
/// removes a dying machine on a later pass, seconds after the call that destroyed it, and
/// python-libjuju's `Machine.destroy` relies on that: it waits for the machine's `remove`
/// delta with a watch it registers only once the call has answered, so a removal in the
/// call's own commit can race past it and leave the client waiting forever. lockstep has
/// no provisioner: the API removes the machine this long after the answer.
pub const MACHINE_REMOVAL_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// `MachineManager.DestroyMachineWithParams {"machine-tags": ["machine-1"], "force",
/// "dry-run", "keep", "max-wait"}`: each machine marked `dying` (watchers get a `change`
/// delta), its units destroyed with it, and the machine removed [`MACHINE_REMOVAL_DELAY`]
/// later by [`remove_dying_machines`] (watchers get its `remove` delta then). Refused per machine, in its result: an unknown machine (`machine 1 not
/// found`, code `not found`), a controller machine, and without `force` a machine that
/// hosts units (Juju's `machine 1 has unit "pg/0" assigned`); with `force` its units are
/// destroyed with it. `dry-run` answers the same and writes nothing.
pub fn destroy_machines(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    let tags: Vec<String> = list(params, "machine-tags")?
        .iter()
        .map(|tag| tag.as_str().unwrap_or_default().to_owned())
        .collect();
    if tags.len() > MACHINES_PER_DESTROY_MAX {
        return Err(WireError::new(
            "bad request",
            format!(
                "{} machines named; at most {MACHINES_PER_DESTROY_MAX} per call",
                tags.len()
            ),
        ));
    }
    let force = params.get("force").and_then(Value::as_bool) == Some(true);
    let dry_run = params.get("dry-run").and_then(Value::as_bool) == Some(true);
    mutate(store, params, &mut |tx| {
        let units: Vec<Unit> = tx
            .documents(EntityKind::Unit)?
            .into_iter()
            .filter_map(|(_, document)| serde_json::from_value(document).ok())
            .collect();
        let mut results = Vec::new();
        for tag in &tags {
            let outcome = destroy_machine(tx, tag, &units, force, dry_run)?;
            results.push(match outcome {
                Ok(info) => json!({"info": info}),
                Err(error) => json!({"error": error.result_json()}),
            });
        }
        Ok(json!({"results": results}))
    })
}

/// One machine of [`destroy_machines`]: its result's `info`, or why it stays.
fn destroy_machine(
    tx: &mut dyn Tx,
    tag: &str,
    units: &[Unit],
    force: bool,
    dry_run: bool,
) -> Result<Result<Value, WireError>, StoreError> {
    let Some(id) = tag_id(tag, "machine") else {
        return Ok(Err(WireError::new(
            "bad request",
            format!("{tag:?} is not a machine tag"),
        )));
    };
    let Some(machine) = tx.machine(&id)? else {
        return Ok(Err(WireError::new(
            "not found",
            format!("machine {id} not found"),
        )));
    };
    if is_controller(&machine) {
        return Ok(Err(WireError::new(
            "",
            format!("machine {id} is a controller and cannot be destroyed"),
        )));
    }
    let hosted: Vec<&Unit> = units
        .iter()
        .filter(|unit| unit.machine.as_deref() == Some(id.as_str()))
        .collect();
    if let (Some(unit), false) = (hosted.first(), force) {
        return Ok(Err(WireError::new(
            "",
            format!("machine {id} has unit {:?} assigned", unit.name),
        )));
    }
    let destroyed: Vec<Value> = hosted
        .iter()
        .map(|unit| json!({"tag": format!("unit-{}", unit.name.replace('/', "-"))}))
        .collect();
    if !dry_run {
        for unit in &hosted {
            tx.remove_document(EntityKind::Unit, &unit.name)?;
        }
        if machine.life == Life::Alive {
            tx.put_machine(&Machine {
                life: Life::Dying,
                ..machine
            })?;
        }
    }
    Ok(Ok(json!({"machine-id": id, "destroyed-units": destroyed,
                 "destroyed-containers": [], "destroyed-storage": [], "detached-storage": []})))
}

/// Removes every `dying` machine, in one transaction, and returns their ids: the
/// provisioner's part of a machine's removal (see [`MACHINE_REMOVAL_DELAY`]).
pub fn remove_dying_machines(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    let mut removed = Vec::new();
    store.transaction(None, &mut |tx| {
        removed.clear();
        for machine in tx.machines()? {
            if machine.life == Life::Dying {
                tx.remove_machine(&machine.id)?;
                removed.push(machine.id);
            }
        }
        Ok(())
    })?;
    Ok(removed)
}

/// The id after the highest numeric machine id (`0` for none).
pub fn next_machine_id(tx: &mut dyn Tx) -> Result<u64, StoreError> {
    Ok(tx
        .machines()?
        .iter()
        .filter_map(|machine| machine.id.parse::<u64>().ok())
        .max()
        .map_or(0, |highest| highest + 1))
}

/// A machine's roles: its own, or, for a legacy machine, those its jobs (`JobManageModel`
/// and its older names) stand for.
pub fn roles(machine: &Machine) -> Roles {
    lockstep_core::upgrader::machine_roles(machine.roles, &machine.legacy_jobs)
}

/// The jobs the API reports for `machine` (`FullStatus`, the deltas, `Agent.GetEntities`):
/// the core's rule ([`lockstep_core::jobs::reported_jobs`], through
/// [`Machine::reported_jobs`]) over its roles (or legacy jobs) and the model's
/// `capabilities`, by Juju's names; none for a document the rule cannot read.
pub fn reported_jobs(
    machine: &Machine,
    table: &JobTable,
    capabilities: &Capabilities,
) -> Vec<String> {
    machine
        .reported_jobs(table, capabilities)
        .map(|jobs| jobs.iter().map(|job| job.as_str().to_owned()).collect())
        .unwrap_or_default()
}

/// True for a controller machine: its roles say so, or, for a legacy machine, its jobs
/// do.
pub fn is_controller(machine: &Machine) -> bool {
    roles(machine).contains(Role::Controller)
}

/// The roles of machine `id`, `None` when there is no such machine.
pub fn machine_roles(store: &dyn Store, id: &str) -> Result<Option<Roles>, WireError> {
    let mut machine = None;
    store
        .snapshot(&mut |tx| {
            machine = tx.machine(id)?;
            Ok(())
        })
        .map_err(store_error)?;
    Ok(machine.as_ref().map(roles))
}
