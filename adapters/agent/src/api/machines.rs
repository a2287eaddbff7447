//! Machines: `Client.AddMachines`, and what agent authentication reads of a machine (that
//! it exists, and its roles).

use lockstep_core::jobs::Job;
use lockstep_core::{Role, Roles};
use lockstep_store::{Machine, Store, StoreError, Tx};
use lockstep_transport::wire::WireError;
use serde_json::{Value, json};

use super::calls::{list, mutate, store_error};

/// Machines one `AddMachines` may add.
pub const MACHINES_PER_CALL_MAX: usize = 100;

/// `Client.AddMachines {"params": [{"jobs": [...]}, ...]}`: machines added by an older
/// client with jobs are stored with the equivalent roles (seed 004).
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
        parsed.push(jobs);
    }
    mutate(store, params, &mut |tx| {
        let first = next_machine_id(tx)?;
        let mut results = Vec::new();
        for (id, jobs) in (first..).zip(&parsed) {
            let machine = Machine::from_client_jobs(id.to_string(), jobs.clone());
            tx.put_machine(&machine)?;
            results.push(json!({"machine": machine.id}));
        }
        Ok(json!({"machines": results}))
    })
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
