//! `MachineManager.ProvisioningScript`'s share of the state: a fresh password for the
//! machine's agent, of which the shared store keeps only the hash, and the POSIX `sh`
//! script that writes the agent's `agent.conf` (with the password) on the machine.

use lockstep_core::lifecycle::Snapshot;
use lockstep_store::{Store, machine_tag};
use lockstep_transport::state::Provisioning;
use lockstep_transport::wire::WireError;
use serde_json::Value;

use super::calls::{failed, mutate};
use super::machines::is_controller;
use crate::datadir::AgentConf;
use crate::datadir::names::AGENT_CONF;
use crate::quote::shell_word;

/// Random bytes in an agent's password (shown as hex): 256 bits.
pub const AGENT_PASSWORD_BYTES: usize = 32;

/// The here-document delimiter of the script; `agent.conf`'s text never holds it as a line
/// (checked before the script is answered).
pub const HEREDOC_DELIMITER: &str = "LOCKSTEP_AGENT_CONF";

/// A fresh agent password: [`AGENT_PASSWORD_BYTES`] from the operating system, as hex.
pub fn new_password() -> String {
    use rand_core::RngCore;
    let mut bytes = [0_u8; AGENT_PASSWORD_BYTES];
    rand_core::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `MachineManager.ProvisioningScript`: checks the machine (it exists and is no
/// controller), stores the hash of a fresh password as its agent's credential (replacing
/// any earlier one) in one transaction, and renders the script. The hash is argon2id with
/// the parameters of users' passwords (`lockstep_transport::auth::hash_password`, as
/// bootstrap hashes the admin's), computed before the transaction.
pub fn provisioning_script(store: &dyn Store, request: &Provisioning) -> Result<String, WireError> {
    let id = request.machine_id.as_str();
    let tag = machine_tag(id);
    let password = new_password();
    let script = render(request, &tag, &password)?;
    let hash = lockstep_transport::auth::hash_password(&password);
    // No operation-id: the answer holds a secret, which the store must not record.
    mutate(store, &Value::Null, &mut |tx| {
        let Some(machine) = tx.machine(id)? else {
            return Err(failed(WireError::new(
                "not found",
                format!("machine {id} not found"),
            )));
        };
        if is_controller(&machine) {
            return Err(failed(WireError::new(
                "bad request",
                format!("machine {id} is a controller: its agent is the controller itself"),
            )));
        }
        tx.set_agent_password_hash(&tag, &hash)?;
        Ok(Value::Null)
    })?;
    Ok(script)
}

/// The `agent.conf` of machine `request.machine_id`'s agent, tagged `tag`, holding
/// `password`: what the provisioning script writes, and what a controller's local
/// provisioner writes itself ([`crate::daemon::provisioner`]).
pub fn agent_conf(request: &Provisioning, tag: &str, password: &str) -> AgentConf {
    let snapshot = Snapshot {
        format: Snapshot::FORMAT,
        upgraded_to_version: request.server_version,
        host_checkpoints: Vec::new(),
        previous: None,
        trial: None,
        bootstrap_complete: false,
    };
    let mut conf = AgentConf::new(tag, snapshot);
    conf.controller = request.identity.controller_uuid.clone();
    conf.model = request.identity.model_uuid.clone();
    conf.apiaddresses = request.api_addresses.clone();
    conf.cacert = request.ca_pem.clone();
    conf.apipassword = password.to_owned().into();
    conf
}

/// Claims machine `id` for a controller's local provisioner: in one transaction, if the
/// machine exists, is alive, is no controller and its agent has no credential yet, stores
/// `hash` as that credential. `Ok(false)`: nothing to claim (another controller claimed
/// it first, someone ran its provisioning script, or the machine is gone or going). Two
/// controllers racing for the same machine: the store serializes their transactions, so
/// exactly one sees no credential.
pub fn claim(store: &dyn Store, id: &str, hash: &str) -> Result<bool, WireError> {
    let tag = machine_tag(id);
    let mut claimed = false;
    mutate(store, &Value::Null, &mut |tx| {
        claimed = false;
        let Some(machine) = tx.machine(id)? else {
            return Ok(Value::Null);
        };
        if is_controller(&machine)
            || machine.life != lockstep_store::Life::Alive
            || tx.agent_password_hash(&tag)?.is_some()
        {
            return Ok(Value::Null);
        }
        tx.set_agent_password_hash(&tag, hash)?;
        claimed = true;
        Ok(Value::Null)
    })?;
    Ok(claimed)
}

/// The script: as root on the machine, it creates `data-dir` and writes `agent.conf` in it,
/// mode 0600 (under `umask 077`, `chmod` for a file left over), through a temporary file
/// renamed into place, from a here-document whose delimiter is quoted (nothing in it is
/// expanded).
pub fn render(request: &Provisioning, tag: &str, password: &str) -> Result<String, WireError> {
    let conf = agent_conf(request, tag, password);
    let mut text = conf
        .to_yaml()
        .map_err(|error| WireError::new("", format!("cannot write agent.conf: {error}")))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    if text.lines().any(|line| line == HEREDOC_DELIMITER) {
        return Err(WireError::new(
            "",
            format!("agent.conf would hold a line {HEREDOC_DELIMITER:?}, the script's delimiter"),
        ));
    }
    let data_dir = request.data_dir.trim_end_matches('/');
    let data_dir = if data_dir.is_empty() { "/" } else { data_dir };
    Ok(format!(
        "#!/bin/sh\n\
         # lockstep: provisions the agent of machine {id} for controller {controller}.\n\
         # The agent.conf below holds the agent's API password: keep this script secret.\n\
         set -eu\n\
         umask 077\n\
         data_dir={data_dir}\n\
         mkdir -p \"$data_dir\"\n\
         rm -f \"$data_dir/{AGENT_CONF}.provisioning\"\n\
         cat > \"$data_dir/{AGENT_CONF}.provisioning\" <<'{HEREDOC_DELIMITER}'\n\
         {text}\
         {HEREDOC_DELIMITER}\n\
         chmod 600 \"$data_dir/{AGENT_CONF}.provisioning\"\n\
         mv -f \"$data_dir/{AGENT_CONF}.provisioning\" \"$data_dir/{AGENT_CONF}\"\n",
        id = request.machine_id,
        controller = request.identity.controller_uuid,
        data_dir = shell_word(data_dir),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::{Role, Roles};
    use lockstep_store::{Durability, Life, Machine, MemoryStore};

    fn hash_of(store: &dyn Store, id: &str) -> Option<String> {
        let mut hash = None;
        store
            .snapshot(&mut |tx| {
                hash = tx.agent_password_hash(&machine_tag(id))?;
                Ok(())
            })
            .unwrap();
        hash
    }

    /// A machine is claimed once: the first claim stores its hash, a second (another
    /// controller's, or a provisioning script already run) changes nothing; controllers,
    /// machines going away and machines that are not there are never claimed.
    #[test]
    fn a_machine_is_claimed_once_and_only_an_alive_host_machine() {
        let store = MemoryStore::new(Durability::Full);
        let host = Roles::of(&[Role::HostMachine]);
        store
            .add_machine(&Machine::with_roles("0", Roles::of(&[Role::Controller])))
            .unwrap();
        store.add_machine(&Machine::with_roles("1", host)).unwrap();
        let mut dying = Machine::with_roles("2", host);
        dying.life = Life::Dying;
        store.add_machine(&dying).unwrap();

        assert!(claim(&store, "1", "first").unwrap());
        assert!(!claim(&store, "1", "second").unwrap());
        assert_eq!(hash_of(&store, "1").as_deref(), Some("first"));
        for id in ["0", "2", "3"] {
            assert!(!claim(&store, id, "any").unwrap(), "machine {id}");
            assert_eq!(hash_of(&store, id), None, "machine {id}");
        }
    }

    /// Controllers racing for the same machine through one SQLite file, each on a
    /// connection of its own (as two controllers' provisioners would): exactly one claim
    /// wins, and the stored credential is the winner's.
    #[test]
    fn of_controllers_racing_for_a_machine_exactly_one_claims_it() {
        use lockstep_store::{OpenMode, SqliteStore};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
        store
            .add_machine(&Machine::with_roles("1", Roles::of(&[Role::HostMachine])))
            .unwrap();
        let racers: Vec<_> = (0..4)
            .map(|racer| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let store = SqliteStore::open(&path, OpenMode::ReadWrite).unwrap();
                    let hash = format!("hash-of-racer-{racer}");
                    (claim(&store, "1", &hash).unwrap(), hash)
                })
            })
            .collect();
        let outcomes: Vec<(bool, String)> = racers
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .collect();
        let winners: Vec<&String> = outcomes
            .iter()
            .filter(|(won, _)| *won)
            .map(|(_, hash)| hash)
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        assert_eq!(hash_of(&store, "1").as_ref(), Some(winners[0]));
    }
}
