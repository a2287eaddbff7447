//! The local provider's provisioner (Juju's provisioner worker), run by a controller whose
//! `agent.conf` says `provisioner: local`: every machine recorded without an agent (by
//! `lockstep add-machine`, python-libjuju's `Model.add_machine`, a bundle: any client's
//! `AddMachines`) gets one on this controller's host, while the controller is Ready.
//!
//! For each alive machine that is no controller and whose agent has no credential:
//!
//! 1. a fresh password is written into the agent's `agent.conf` (mode 0600) in
//!    `<data>/machines/machine-<id>/`, the same file `MachineManager.ProvisioningScript`'s
//!    script writes ([`crate::api::provisioning::agent_conf`]);
//! 2. the machine is claimed: one transaction stores the password's argon2 hash as its
//!    agent's credential only if it has none ([`crate::api::provisioning::claim`]). Of two
//!    controllers racing for a machine exactly one wins; the other removes its directory;
//! 3. the controller's current binary is installed and the agent started
//!    ([`crate::local_provider::start`]), as `lockstep add-machine` does.
//!
//! A crash between two of these loses nothing: a directory whose `agent.conf` was written
//! but whose agent never started (no `logs/lockstepd.log`) is finished on the next pass when
//! its password matches the stored credential (this controller won the claim), and removed
//! when it does not (another one did); a machine with no credential is claimed again with a
//! new password. A start that fails is logged and tried again after
//! [`RETRY_AFTER`]; the machine shows `pending` meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_core::Version;
use lockstep_store::{Life, Store, machine_tag};
use lockstep_transport::state::{Identity, Provisioning};
use tokio::sync::watch;

use crate::api::machines::is_controller;
use crate::api::provisioning::{agent_conf, claim, new_password};
use crate::daemon::driver::AgentStatus;
use crate::datadir::{DataDir, DataDirError};
use crate::local_provider::LocalAgentError;

/// How often the provisioner looks for machines without an agent (and at once when the
/// controller's status changes).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How long after a failed start the provisioner tries that machine again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What the provisioner needs of its controller.
#[derive(Clone, Debug)]
pub struct Provisioner {
    pub store: Arc<dyn Store>,
    /// The controller's data directory: the agents' go under its `machines/`.
    pub data: DataDir,
    /// The controller's tag: its current binary is the agents'.
    pub tag: String,
    pub identity: Identity,
    /// The API addresses an agent is given, this controller's first (it fails over in
    /// that order).
    pub api_addresses: Vec<String>,
    /// The controller's CA certificate (PEM), `agent.conf`'s `cacert`.
    pub ca_pem: String,
    /// This controller's running version, the agents' `upgradedToVersion`.
    pub version: Version,
}

/// Why a machine's agent was not started.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("cannot claim machine {id}: {message}")]
    Claim { id: String, message: String },
    #[error("cannot read the machines: {0}")]
    Store(#[from] lockstep_store::StoreError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    LocalAgent(#[from] LocalAgentError),
}

/// Runs until aborted: a pass every [`INTERVAL`] (and when the controller's status
/// changes) while the controller is Ready.
pub async fn run(provisioner: Provisioner, mut status: watch::Receiver<AgentStatus>) {
    tracing::info!(target: "lockstep::provisioner", machines = %provisioner.data.machine_agents_dir().display(), "local provisioner started: every machine recorded without an agent gets one on this host");
    let mut retry: HashMap<String, Instant> = HashMap::new();
    loop {
        if status.borrow_and_update().is_ready() {
            let this = provisioner.clone();
            let mut pending = std::mem::take(&mut retry);
            retry = tokio::task::spawn_blocking(move || {
                this.pass(&mut pending);
                pending
            })
            .await
            .unwrap_or_default();
        }
        let _ = tokio::time::timeout(INTERVAL, status.changed()).await;
    }
}

impl Provisioner {
    /// One pass over the machines. `retry` holds the machines whose start failed, with
    /// when to try them again.
    pub fn pass(&self, retry: &mut HashMap<String, Instant>) {
        let machines = match self.machines_without_agents() {
            Ok(machines) => machines,
            Err(error) => {
                tracing::warn!(target: "lockstep::provisioner", %error, "cannot read the machines");
                return;
            }
        };
        let now = Instant::now();
        retry.retain(|_, at| *at > now);
        for (id, credential) in machines {
            if retry.contains_key(&id) {
                continue;
            }
            match self.provision(&id, credential.as_deref()) {
                Ok(Some(pid)) => {
                    tracing::info!(target: "lockstep::provisioner", machine = %id, pid, dir = %self.data.machine_agent_dir(&id).root().display(), "started machine agent");
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(target: "lockstep::provisioner", machine = %id, %error, retry_in_s = RETRY_AFTER.as_secs(), "cannot start the machine's agent");
                    retry.insert(id, now + RETRY_AFTER);
                }
            }
        }
    }

    /// Every alive machine that is no controller, with its agent's credential (`None`: no
    /// agent yet), read in one snapshot; only those that may need work here: no
    /// credential, or an `agent.conf` under this controller's data dir for an agent that
    /// never started.
    fn machines_without_agents(&self) -> Result<Vec<(String, Option<String>)>, ProvisionerError> {
        let mut found = Vec::new();
        self.store.snapshot(&mut |tx| {
            found.clear();
            for machine in tx.machines()? {
                if is_controller(&machine) || machine.life != Life::Alive {
                    continue;
                }
                let credential = tx.agent_password_hash(&machine_tag(&machine.id))?;
                found.push((machine.id, credential));
            }
            Ok(())
        })?;
        found.retain(|(id, credential)| credential.is_none() || self.unstarted(id));
        Ok(found)
    }

    /// Whether this host holds an `agent.conf` for machine `id` whose agent never started.
    fn unstarted(&self, id: &str) -> bool {
        let dir = self.data.machine_agent_dir(id);
        dir.agent_conf_path().is_file() && !dir.logs_dir().join("lockstepd.log").exists()
    }

    /// Provisions machine `id` (`credential`: its agent's stored hash, if any). Returns the
    /// agent's pid when one was started here.
    fn provision(
        &self,
        id: &str,
        credential: Option<&str>,
    ) -> Result<Option<u32>, ProvisionerError> {
        let dir = self.data.machine_agent_dir(id);
        let tag = machine_tag(id);
        match credential {
            Some(hash) => {
                // An agent.conf written by an earlier pass that did not get to start it:
                // finish it if this controller's claim won, else it is a loser's leftover.
                let Some(conf) = dir.read_agent_conf()? else {
                    return Ok(None);
                };
                let ours = lockstep_transport::logins::Verifier::default()
                    .verify(conf.apipassword.as_str(), hash);
                if !ours {
                    tracing::info!(target: "lockstep::provisioner", machine = %id, dir = %dir.root().display(), "removing an agent directory another controller's claim made stale");
                    remove(&dir);
                    return Ok(None);
                }
            }
            None => {
                let password = new_password();
                let request = self.request(id, &dir);
                dir.create_layout()?;
                dir.write_agent_conf(&agent_conf(&request, &tag, &password))?;
                let hash = lockstep_transport::auth::hash_password(&password);
                let claimed = claim(self.store.as_ref(), id, &hash).map_err(|error| {
                    ProvisionerError::Claim {
                        id: id.to_owned(),
                        message: error.message,
                    }
                })?;
                if !claimed {
                    remove(&dir);
                    return Ok(None);
                }
            }
        }
        let started = crate::local_provider::start(&self.data, &self.tag, &dir, id)?;
        Ok(Some(started.pid))
    }

    /// What the provisioning script of machine `id` would be asked for.
    fn request(&self, id: &str, dir: &DataDir) -> Provisioning {
        Provisioning {
            machine_id: id.to_owned(),
            nonce: format!("lockstep-provisioner:{id}"),
            data_dir: dir.root().display().to_string(),
            disable_package_commands: true,
            identity: self.identity.clone(),
            api_addresses: self.api_addresses.clone(),
            ca_pem: self.ca_pem.clone(),
            server_version: self.version,
        }
    }
}

/// Removes an agent directory that never ran an agent; a failure is only logged (the next
/// pass looks again).
fn remove(dir: &DataDir) {
    if let Err(error) = std::fs::remove_dir_all(dir.root()) {
        tracing::warn!(target: "lockstep::provisioner", dir = %dir.root().display(), %error, "cannot remove an agent directory");
    }
}
