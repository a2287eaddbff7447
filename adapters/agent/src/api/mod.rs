//! The API's shared state over the store: [`StoreState`] implements the transport's
//! [`SharedState`] with `lockstep-store`, one module per facade's share of it.
//!
//! Each call is a blocking function of the store (the store is synchronous), run on tokio's
//! blocking pool. Mutating calls honour the optional `operation-id` of `CONTRACT.md`
//! ("Client operations"), our extension carried as a top-level key of `params`: the call's
//! writes and its result commit together, in one store transaction, and a repeat returns
//! the recorded result without applying anything again.
//!
//! - [`calls`]: what every call shares: the store's errors as the wire's, the model, and
//!   one mutating call under its `operation-id`.
//! - [`status`]: `Client.FullStatus`'s view of the state.
//! - [`model_config`]: the model's config (its fields and the stored keys), `ModelSet` and
//!   `ModelUnset` of stored keys, `agent-stream`, and the agent-version change.
//! - [`machines`]: `AddMachines` (Client's, MachineManager's and `lockstep add-machine`'s),
//!   `DestroyMachineWithParams`, and the machines agents log in for.
//! - [`applications`]: `Application.Deploy`, `AddUnits`, `AddRelation`, `Expose`, `Get`,
//!   `SetConfigs`, `UnsetApplicationsConfig`, `DestroyApplication`, `DestroyUnit`, and the
//!   charms endpoint's record of an uploaded charm.
//! - [`upgrader`]: the Upgrader facade's views (controllers first) and `SetTools`.
//! - [`machine_agents`]: machine agents' credentials (read at every login),
//!   `Agent.GetEntities` and `Machiner.SetStatus`.
//! - [`provisioning`]: `MachineManager.ProvisioningScript`: an agent's fresh password (the
//!   store keeps its hash) and the script that writes its `agent.conf`.
//! - [`rollout`]: the staged rollout of machine agents: the coordinator's pass (the core's
//!   `rollout::advance`, fenced on the coordinator lease), `upgrade-model --resume` and
//!   `--abort`, and the record as status shows it.
//! - [`deltas`]: the AllWatcher's deltas, from the store's event log.

pub mod applications;
pub mod calls;
pub mod deltas;
pub mod machine_agents;
pub mod machines;
pub mod model_config;
pub mod provisioning;
pub mod rollout;
pub mod status;
pub mod upgrader;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lockstep_core::jobs::JobTable;
use lockstep_core::lifecycle::Revision;
use lockstep_core::policy::{Catalogue, Stream};
use lockstep_core::{Roles, Version};
use lockstep_store::Store;
use lockstep_transport::charm::Charm;
use lockstep_transport::state::{
    AgentEntity, AgentStatusReport, AgentVersionChange, AgentViews, Changes, Identity, ModelConfig,
    Provisioning, SharedState, Snapshot, Status,
};
use lockstep_transport::wire::WireError;
use serde_json::Value;

/// How often a blocked `AllWatcher.Next` looks for changes made by other processes (changes
/// made through this API wake it at once).
pub const WATCH_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The shared state of the API, over a store.
#[derive(Debug)]
pub struct StoreState {
    store: Arc<dyn Store>,
    jobs: JobTable,
    /// Shared with the deferred removal of dying machines, which writes too.
    wake: Arc<Wake>,
    /// What this controller says of itself in `FullStatus`, beside the shared state.
    local: Option<LocalController>,
    /// The agents' desired versions' inputs, read once per store revision.
    desired: Arc<upgrader::DesiredCache>,
}

/// What a controller adds to its own machine's `FullStatus` entry, under `lockstep`: what
/// its `agent.conf` holds, which no other controller knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalController {
    /// Its machine's id (`0` for `machine-0`).
    pub machine: String,
    /// `metadata-verification`: which agent-binary metadata it accepts
    /// ([`MetadataTrust::describe`](crate::metadata::MetadataTrust::describe)).
    pub metadata_verification: String,
    /// `etcd`: how it reaches etcd, `--etcd-insecure` included
    /// ([`StoreSettings::access`](crate::store::StoreSettings::access)); absent on SQLite.
    pub etcd: Option<String>,
}

/// How blocked watchers hear of a write made through this API.
#[derive(Debug, Default)]
struct Wake {
    /// Woken after every write made through this API, so blocked watchers answer at once.
    changed: tokio::sync::Notify,
    /// The store's revision after the latest write made through this API (set before
    /// `changed` is woken, so a watcher that registers late still sees it).
    written: AtomicU64,
}

impl Wake {
    fn wrote(&self, revision: Option<Revision>) {
        if let Some(revision) = revision {
            self.written.fetch_max(revision.0, Ordering::SeqCst);
        }
        self.changed.notify_waiters();
    }
}

impl StoreState {
    /// The API's state over `store`, with lockstep's job table.
    pub fn new(store: Arc<dyn Store>) -> StoreState {
        let state = StoreState {
            store,
            jobs: JobTable::lockstep(),
            wake: Arc::new(Wake::default()),
            local: None,
            desired: Arc::default(),
        };
        // A machine a previous process made `dying` and could not remove before it ended
        // (a re-exec into a new binary within the delay) is removed by this one.
        if tokio::runtime::Handle::try_current().is_ok() {
            state.remove_dying_machines_later();
        }
        state
    }

    /// This state served by the controller of machine `machine`, whose `FullStatus` entry
    /// then shows its `metadata-verification` and, on etcd, how it reaches etcd (`etcd`),
    /// under `lockstep`.
    pub fn with_local_controller(
        mut self,
        machine: String,
        metadata_verification: String,
        etcd: Option<String>,
    ) -> StoreState {
        self.local = Some(LocalController {
            machine,
            metadata_verification,
            etcd,
        });
        self
    }

    /// Runs a read on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store, &JobTable) -> Result<T, WireError> + Send + 'static,
    ) -> Result<T, WireError> {
        let (store, jobs) = (Arc::clone(&self.store), self.jobs.clone());
        tokio::task::spawn_blocking(move || work(store.as_ref(), &jobs))
            .await
            .map_err(|error| WireError::new("", format!("internal error: {error}")))?
    }

    /// Runs a write on the blocking pool; once it succeeded, blocked watchers wake.
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store) -> Result<T, WireError> + Send + 'static,
    ) -> Result<T, WireError> {
        let store = Arc::clone(&self.store);
        let (result, revision) = tokio::task::spawn_blocking(move || {
            let result = work(store.as_ref());
            let revision = result.is_ok().then(|| store.revision().ok()).flatten();
            (result, revision)
        })
        .await
        .map_err(|error| WireError::new("", format!("internal error: {error}")))?;
        if result.is_ok() {
            self.wake.wrote(revision);
        }
        result
    }

    /// Removes the machines a `DestroyMachineWithParams` made `dying`,
    /// [`machines::MACHINE_REMOVAL_DELAY`] from now, in a task of its own (the provisioner's
    /// part in Juju). A failure is logged; the machines stay `dying` until the next destroy
    /// or the next start of the API.
    fn remove_dying_machines_later(&self) {
        let (store, wake) = (Arc::clone(&self.store), Arc::clone(&self.wake));
        tokio::spawn(async move {
            tokio::time::sleep(machines::MACHINE_REMOVAL_DELAY).await;
            let removal = tokio::task::spawn_blocking(move || {
                let removed = machines::remove_dying_machines(store.as_ref());
                (removed, store.revision().ok())
            })
            .await;
            match removal {
                Ok((Ok(removed), revision)) if !removed.is_empty() => {
                    tracing::info!(target: "lockstep::api", ?removed, "dying machines removed");
                    wake.wrote(revision);
                }
                Ok((Ok(_), _)) => {}
                Ok((Err(error), _)) => {
                    tracing::warn!(target: "lockstep::api", %error, "cannot remove dying machines");
                }
                Err(error) => {
                    tracing::warn!(target: "lockstep::api", %error, "the removal of dying machines failed");
                }
            }
        });
    }

    /// Runs a write that logs no event (agents' credentials and statuses) on the blocking
    /// pool: no watcher has anything to hear of it, so none is woken.
    async fn quiet_write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store) -> Result<T, WireError> + Send + 'static,
    ) -> Result<T, WireError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || work(store.as_ref()))
            .await
            .map_err(|error| WireError::new("", format!("internal error: {error}")))?
    }

    /// A mutating call with its params, which go to the blocking pool (only these calls
    /// copy them).
    async fn mutation(
        &self,
        params: &Value,
        call: fn(&dyn Store, &Value) -> Result<Value, WireError>,
    ) -> Result<Value, WireError> {
        let params = params.clone();
        self.write(move |store| call(store, &params)).await
    }
}

#[async_trait]
impl SharedState for StoreState {
    async fn status(&self) -> Result<Status, WireError> {
        let mut status = self.read(status::full_status).await?;
        if let Some(local) = &self.local
            && let Some(Value::Object(machine)) = status.machines.get_mut(&local.machine)
        {
            let mut lockstep =
                serde_json::json!({"metadata-verification": local.metadata_verification});
            if let Some(etcd) = &local.etcd {
                lockstep["etcd"] = Value::String(etcd.clone());
            }
            machine.insert("lockstep".to_owned(), lockstep);
        }
        Ok(status)
    }

    async fn model_config(&self) -> Result<ModelConfig, WireError> {
        self.read(|store, _| model_config::model_config(store))
            .await
    }

    async fn agent_stream(&self) -> Result<Option<Stream>, WireError> {
        self.read(|store, _| model_config::agent_stream(store))
            .await
    }

    async fn add_machines(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, machines::add_machines).await
    }

    async fn deploy(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::deploy).await
    }

    async fn add_units(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::add_units).await
    }

    async fn add_relation(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::add_relation).await
    }

    async fn expose(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::expose).await
    }

    async fn destroy_machines(&self, params: &Value) -> Result<Value, WireError> {
        let answer = self.mutation(params, machines::destroy_machines).await?;
        self.remove_dying_machines_later();
        Ok(answer)
    }

    async fn destroy_applications(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::destroy_applications)
            .await
    }

    async fn destroy_units(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::destroy_units).await
    }

    async fn set_application_config(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::set_config).await
    }

    async fn unset_application_config(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, applications::unset_config).await
    }

    async fn model_set(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, model_config::model_set).await
    }

    async fn model_unset(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, model_config::model_unset).await
    }

    async fn fleet(&self) -> Result<lockstep_transport::state::Fleet, WireError> {
        self.read(|store, _| rollout::fleet(store).map_err(calls::store_error))
            .await
    }

    async fn resume_rollout(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, rollout::resume).await
    }

    async fn abort_rollout(&self, params: &Value) -> Result<Value, WireError> {
        self.mutation(params, rollout::abort).await
    }

    async fn add_charm(&self, charm: &Charm, series: Option<&str>) -> Result<String, WireError> {
        let (charm, series) = (charm.clone(), series.map(str::to_owned));
        self.write(move |store| applications::add_charm(store, &charm, series.as_deref()))
            .await
    }

    async fn application_get(&self, application: &str) -> Result<Value, WireError> {
        let application = application.to_owned();
        self.read(move |store, _| applications::get(store, &application))
            .await
    }

    async fn agent_views(
        &self,
        owner: &str,
        server_version: Version,
        tags: &[String],
    ) -> Result<AgentViews, WireError> {
        let (owner, tags, cache) = (owner.to_owned(), tags.to_vec(), Arc::clone(&self.desired));
        self.read(move |store, _| {
            upgrader::agent_views(store, &cache, &owner, server_version, &tags)
        })
        .await
    }

    async fn set_tools(&self, owner: &str, params: &Value) -> Result<Value, WireError> {
        let (owner, params) = (owner.to_owned(), params.clone());
        self.write(move |store| upgrader::set_tools(store, &owner, &params))
            .await
    }

    async fn agent_version_change(
        &self,
        version: Version,
    ) -> Result<AgentVersionChange, WireError> {
        self.read(move |store, _| model_config::agent_version_change(store, version))
            .await
    }

    async fn set_agent_version(
        &self,
        version: Version,
        catalogue: &Catalogue,
        agents_current: bool,
    ) -> Result<(), WireError> {
        let catalogue = catalogue.clone();
        self.write(move |store| {
            model_config::set_agent_version(store, version, &catalogue, agents_current)
        })
        .await
    }

    async fn snapshot(&self, ids: &Identity) -> Result<Snapshot, WireError> {
        let ids = ids.clone();
        self.read(move |store, jobs| deltas::snapshot(store, jobs, &ids))
            .await
    }

    async fn changes_since(
        &self,
        ids: &Identity,
        after: Revision,
        limit: usize,
    ) -> Result<Changes, WireError> {
        let ids = ids.clone();
        self.read(move |store, jobs| deltas::changes_since(store, jobs, &ids, after, limit))
            .await
    }

    async fn wait_for_change(&self, after: Revision) {
        let notified = self.wake.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.wake.written.load(Ordering::SeqCst) > after.0 {
            return;
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(WATCH_POLL_INTERVAL) => {}
        }
    }

    async fn revision(&self) -> Result<Revision, WireError> {
        self.read(|store, _| store.revision().map_err(calls::store_error))
            .await
    }

    async fn machine_roles(&self, machine_id: &str) -> Result<Option<Roles>, WireError> {
        let id = machine_id.to_owned();
        self.read(move |store, _| machines::machine_roles(store, &id))
            .await
    }

    async fn agent_password_hash(&self, tag: &str) -> Result<Option<String>, WireError> {
        let tag = tag.to_owned();
        self.read(move |store, _| machine_agents::agent_password_hash(store, &tag))
            .await
    }

    async fn provisioning_script(&self, request: &Provisioning) -> Result<String, WireError> {
        let request = request.clone();
        // The argon2 hash is computed here, on the blocking pool: an admin's rare call, never
        // a login's check (those run on the login pool).
        self.quiet_write(move |store| provisioning::provisioning_script(store, &request))
            .await
    }

    async fn agent_entities(
        &self,
        machine_ids: &[String],
    ) -> Result<Vec<Result<AgentEntity, WireError>>, WireError> {
        let ids = machine_ids.to_vec();
        self.read(move |store, jobs| machine_agents::agent_entities(store, jobs, &ids))
            .await
    }

    async fn set_agent_statuses(
        &self,
        reports: &[AgentStatusReport],
    ) -> Result<Vec<Result<(), WireError>>, WireError> {
        let reports = reports.to_vec();
        self.quiet_write(move |store| machine_agents::set_agent_statuses(store, &reports))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_store::{Durability, MemoryStore};
    use serde_json::json;

    /// A machine left `dying` by a previous process (re-executed within the removal delay)
    /// is removed by the next one's API, and an alive machine is not.
    #[tokio::test]
    async fn a_machine_left_dying_is_removed_when_the_api_starts() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Durability::Full));
        let roles = lockstep_core::Roles::of(&[lockstep_core::Role::HostMachine]);
        let mut dying = lockstep_store::Machine::with_roles("1", roles);
        dying.life = lockstep_store::Life::Dying;
        store.add_machine(&dying).unwrap();
        store
            .add_machine(&lockstep_store::Machine::with_roles("2", roles))
            .unwrap();
        let _state = StoreState::new(Arc::clone(&store));
        let ids = || {
            let mut ids = Vec::new();
            store
                .snapshot(&mut |tx| {
                    ids = tx.machines()?.into_iter().map(|m| m.id).collect();
                    Ok(())
                })
                .unwrap();
            ids
        };
        let deadline = std::time::Instant::now() + machines::MACHINE_REMOVAL_DELAY * 10;
        while ids().len() > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "never removed: {:?}",
                ids()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(ids(), ["2"]);
    }

    /// A write made through the state between a watcher's read and its wait is not
    /// missed: the wait returns at once instead of after a poll interval; with nothing new
    /// it waits one interval (time is paused: the clock moves only when every task waits).
    #[tokio::test(start_paused = true)]
    async fn a_wait_after_a_write_above_the_watcher_returns_at_once() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Durability::Full));
        let state = StoreState::new(Arc::clone(&store));
        let before = store.revision().unwrap();
        state.add_machines(&json!({"params": [{}]})).await.unwrap();
        let started = tokio::time::Instant::now();
        state.wait_for_change(before).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        let after = store.revision().unwrap();
        assert!(after > before, "{after:?} after {before:?}");
        state.wait_for_change(after).await;
        assert_eq!(started.elapsed(), WATCH_POLL_INTERVAL);
    }
}
