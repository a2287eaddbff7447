//! The store executor: controllers' requests executed against one real
//! `lockstep_store::MemoryStore` (durability Full, as the contract asks) whose clock is the
//! virtual time, so leases expire in virtual time. Requests in flight from a process that
//! has died still land, as they would. Each write's trace in the store's log is read back
//! ([`Sim::scan_store`]) for the checkers, and record changes are pushed to the controllers
//! that watch the record.

use std::collections::BTreeMap;
use std::sync::Arc;

use lockstep_core::jobs::Capabilities;
use lockstep_core::lifecycle::{
    ControllerId, ControllerSet, Input, LeaseToken, Request, RequestId, Revision, StepOutcome,
};
use lockstep_core::rollout::Rollout;
use lockstep_core::steps::StepKey;
use lockstep_core::upgrader::AgentVersionChange;
use lockstep_core::{Binary, Timestamp};
use lockstep_store::{
    AgentVersionCheck, AgentVersionSet, ChangeKind, Changes, Durability, EntityKind, MemoryStore,
    Model, ROLLOUT_SETTINGS, Store, StoreError,
};

use super::network::{Message, Party};
use super::queue::VirtualClock;
use super::{Event, Sim};
use crate::checkers::Observation;
use crate::scenario::Scenario;

/// The store and what the simulator has read of its log.
#[derive(Debug)]
pub(super) struct StoreExecutor {
    pub(super) store: MemoryStore,
    /// The store's clock; the run loop moves it with the virtual time.
    pub(super) clock: VirtualClock,
    /// Processes watching the record, with their incarnation.
    subscribers: Vec<(usize, u64)>,
    /// The last revision of the log read.
    pub(super) scanned: Revision,
    model_cache: Option<(Revision, Model)>,
    /// Revisions of every event in the store's log, ascending.
    pub(super) revisions: Vec<Revision>,
    /// Each database step's effect writes and checkpoints found in the log.
    pub(super) step_effects: BTreeMap<StepKey, (u32, u32)>,
    /// Each client operation's effect writes found in the log.
    pub(super) operation_effects: BTreeMap<String, u32>,
    /// `SetAgentVersion` requests the store refused (Juju's rule: not while a record is
    /// current).
    pub(super) agent_version_refusals: u64,
    /// Each host's machine document's `agent-binary`: the binary its agent last reported
    /// running (`Upgrader.SetTools`), with the incarnation of the process that reported it.
    /// Kept beside the `MemoryStore` rather than in it, so that its log holds only what the
    /// checkers count; the Upgrader's answers read it as the facades read the machines.
    pub(super) reported: Vec<Option<(u64, Binary)>>,
    /// The rollout record as last written to the store's log (what the API servers read).
    pub(super) rollout: Option<Rollout>,
}

impl StoreExecutor {
    /// A store whose machine documents hold `reported` (one item per host).
    pub(super) fn new(reported: Vec<Option<Binary>>) -> StoreExecutor {
        let clock = VirtualClock::default();
        StoreExecutor {
            store: MemoryStore::with_clock(Durability::Full, Arc::new(clock.clone())),
            clock,
            subscribers: Vec::new(),
            scanned: Revision(0),
            model_cache: None,
            revisions: Vec::new(),
            step_effects: BTreeMap::new(),
            operation_effects: BTreeMap::new(),
            agent_version_refusals: 0,
            reported: reported
                .into_iter()
                .map(|binary| binary.map(|binary| (0, binary)))
                .collect(),
            rollout: None,
        }
    }

    /// The binary `host`'s agent last reported running, if it has.
    pub(super) fn reported(&self, host: usize) -> Option<&Binary> {
        self.reported[host].as_ref().map(|(_, binary)| binary)
    }

    /// The model a scenario starts with.
    pub(super) fn create_model(&self, scenario: &Scenario) {
        let model = Model {
            uuid: "c0ffee00-0000-4000-8000-000000000000".to_owned(),
            name: "controller".to_owned(),
            agent_version: scenario.agent_version,
            agent_stream: None,
            agent_metadata_url: None,
            policy: scenario.policy.clone(),
            controllers: ControllerSet::first(scenario.controllers),
            capabilities: Capabilities::new(),
            capabilities_discovered: None,
            upgrade_available: None,
        };
        self.store.create_model(&model).expect("a fresh store");
    }

    /// A process stopped: its record subscription ends with it.
    pub(super) fn unsubscribe(&mut self, host: usize) {
        self.subscribers
            .retain(|&(subscriber, _)| subscriber != host);
    }
}

impl Sim {
    /// Executes a controller's store request and sends the answer back (the store answers
    /// over the network, so an answer may be lost after the write committed).
    pub(super) fn store_execute(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    ) {
        let me = self.hosts[host].config.controller;
        let running = self.hosts[host].config.running.number;
        let store = self.executor.store.clone();
        let reply = |input: Input| Message::Reply {
            host,
            incarnation,
            id: Some(id),
            input,
        };
        let message = match request {
            Request::LoadModel => {
                let model = store
                    .load_model()
                    .expect("the store reads")
                    .expect("a model");
                Some(reply(Input::ModelLoaded {
                    id,
                    model: model.view(),
                }))
            }
            Request::RefreshCapabilities => {
                store
                    .set_capabilities(&Capabilities::new(), running)
                    .expect("the model exists");
                Some(reply(Input::Done { id }))
            }
            Request::WatchRecord { .. } => {
                self.executor.unsubscribe(host);
                self.executor.subscribers.push((host, incarnation));
                let view = store.record_view().expect("the store reads");
                Some(Message::Reply {
                    host,
                    incarnation,
                    id: None,
                    input: Input::RecordChanged(view),
                })
            }
            Request::CreateRecord(record) => match store.create_record(record) {
                Ok(write) => Some(reply(Input::RecordWritten { id, write })),
                Err(error) => {
                    self.store_refused(host, &error);
                    None
                }
            },
            Request::UpdateRecord {
                expected,
                record,
                fence,
            } => match store.update_record(expected, record, fence) {
                Ok(write) => Some(reply(Input::RecordWritten { id, write })),
                Err(error) => {
                    self.store_refused(host, &error);
                    None
                }
            },
            Request::AcquireLease => {
                let holder = me.expect("only controllers take the lease");
                let ttl = self.hosts[host].config.limits.lease_ttl();
                let lease = store.acquire_lease(holder, ttl).expect("the store answers");
                self.maybe_expire(holder, lease);
                Some(reply(Input::LeaseAnswered { id, lease }))
            }
            Request::KeepAliveLease(token) => {
                let holder = me.expect("only controllers keep the lease");
                let lease = store
                    .keep_alive_lease(holder, token)
                    .expect("the store answers");
                self.maybe_expire(holder, lease);
                Some(reply(Input::LeaseAnswered { id, lease }))
            }
            Request::ReleaseLease(token) => {
                let holder = me.expect("only controllers release the lease");
                store
                    .release_lease(holder, token)
                    .expect("the store answers");
                None
            }
            Request::RunStep { key, fence, .. } => {
                let lease = store.lease().expect("the store answers");
                let now = Timestamp(self.queue.now);
                let lease_current =
                    lease.is_some_and(|lease| Some(lease.holder) == me && lease.is_live(now));
                let effect = format!("effect:{key}");
                let outcome = store
                    .run_database_step(key, fence, &mut |tx| {
                        tx.put_document(
                            EntityKind::Relation,
                            &effect,
                            &serde_json::json!({ "step": effect }),
                        )?;
                        Ok(())
                    })
                    .expect("the store answers");
                if outcome == StepOutcome::Applied {
                    self.observe(Observation::DatabaseStepCommitted {
                        host,
                        key,
                        lease_current,
                    });
                }
                Some(reply(Input::StepFinished { id, outcome }))
            }
            Request::SetAgentVersion(version) => {
                // The store checks the core's rule in its write and answers a refusal with
                // what it saw; the driver hands that to the core as it is.
                match store
                    .set_agent_version(version, &AgentVersionCheck::LIFECYCLE)
                    .expect("the store answers")
                {
                    AgentVersionSet::Set { change, .. } => {
                        if let AgentVersionChange::Changed { to, .. } = change
                            && self.intended() == Some(to)
                        {
                            self.fleet.version_set_at.get_or_insert(self.queue.now);
                        }
                        Some(reply(Input::Done { id }))
                    }
                    AgentVersionSet::Refused {
                        refusal,
                        agent_version,
                        view,
                    } => {
                        self.executor.agent_version_refusals += 1;
                        self.trace.note(
                            self.queue.now,
                            &format!("store refused agent-version {version}: {refusal}"),
                        );
                        Some(reply(Input::AgentVersionRefused {
                            id,
                            agent_version,
                            view,
                        }))
                    }
                }
            }
            Request::ReportUpgradeAvailable(version) => {
                store
                    .report_upgrade_available(version)
                    .expect("the model exists");
                Some(reply(Input::Done { id }))
            }
            other => panic!("{other:?} is not a store request"),
        };
        self.scan_store();
        if let Some(message) = message {
            self.send(Party::Store, Party::Host(host), message);
        }
    }

    /// The lease-expiry fault: a lease just granted or kept alive is lost shortly after,
    /// while its holder may still be writing under it.
    fn maybe_expire(&mut self, holder: ControllerId, lease: Option<LeaseToken>) {
        let rate = self.scenario.faults.lease_expiry_per_million;
        if let Some(token) = lease
            && self.in_safety()
            && self.rng.chance(rate)
        {
            let at = self.queue.now + self.rng.range(0, 50);
            self.queue
                .schedule(at, Event::ExpireLease { holder, token });
        }
    }

    /// [`Event::ExpireLease`]: the lease granted with `token` is gone, if it still stands.
    pub(super) fn expire_lease(&mut self, holder: ControllerId, token: LeaseToken) {
        if self.in_safety()
            && self
                .executor
                .store
                .release_lease(holder, token)
                .expect("the store answers")
        {
            self.mark_fault(Some(usize::from(holder.0)), "lease expires");
        }
    }

    /// `Upgrader.SetTools`: the store records the binary the process `incarnation` of
    /// `host` runs. A report of a process that has died may still land, but never over one
    /// of its successors'.
    pub(super) fn record_binary(&mut self, host: usize, incarnation: u64, binary: &Binary) {
        let recorded = &self.executor.reported[host];
        if recorded.as_ref().is_some_and(|(by, _)| *by > incarnation) {
            return;
        }
        let changed = recorded
            .as_ref()
            .is_none_or(|(_, previous)| previous != binary);
        self.executor.reported[host] = Some((incarnation, binary.clone()));
        if changed {
            self.trace.note(
                self.queue.now,
                &format!("{} reports running {binary}", self.hosts[host].name),
            );
            self.observe(Observation::BinaryReported { host, binary });
        }
    }

    fn store_refused(&mut self, host: usize, error: &StoreError) {
        let what = format!(
            "{} asked for an invalid write: {error}",
            self.hosts[host].name
        );
        self.observe(Observation::StoreRefused { what });
    }

    /// Reads what the store's log gained since the last scan: record writes for the
    /// checkers, effect counts, and record notifications for the watching controllers.
    pub(super) fn scan_store(&mut self) {
        let scanned = self.executor.scanned;
        let Ok(Changes::Events { events, .. }) =
            self.executor.store.changes_since(scanned, usize::MAX)
        else {
            panic!("the store's log cannot be read after {}", scanned.0);
        };
        if events.is_empty() {
            return;
        }
        let mut record_changed = false;
        let mut rollouts = Vec::new();
        for event in events {
            self.executor.scanned = event.revision;
            self.executor.revisions.push(event.revision);
            match event.kind {
                EntityKind::UpgradeInfo => {
                    record_changed = true;
                    let record = serde_json::from_value(event.entity.clone())
                        .expect("the store logs records it can read");
                    self.observe(Observation::RecordWritten {
                        record,
                        archived: event.change == ChangeKind::Remove,
                    });
                }
                EntityKind::Step => {
                    let key = event.id.trim_start_matches("effect:").to_owned();
                    let key = StepKey::parse(&key).expect("a step key");
                    self.executor.step_effects.entry(key).or_insert((0, 0)).1 += 1;
                }
                EntityKind::Relation => {
                    let key = event.id.trim_start_matches("effect:");
                    let key = StepKey::parse(key).expect("a step key");
                    self.executor.step_effects.entry(key).or_insert((0, 0)).0 += 1;
                }
                EntityKind::Settings if event.id == ROLLOUT_SETTINGS => {
                    let record: Rollout = serde_json::from_value(event.entity)
                        .expect("the store logs rollout records it can read");
                    rollouts.push(record);
                }
                EntityKind::Application => {
                    *self
                        .executor
                        .operation_effects
                        .entry(event.id.clone())
                        .or_insert(0) += 1;
                }
                _ => {}
            }
        }
        if self.scenario.fleet.is_some() {
            // A fleet run's log is read by the simulator alone: compacted once read, so
            // that a commit does not copy the end of a long log of large records.
            self.executor
                .store
                .compact(self.executor.scanned)
                .expect("the store compacts");
        }
        if !rollouts.is_empty() {
            // What the record says against what the agents had reported when it was
            // written (statuses log no event: they are the same until the next report).
            let agents = self.agent_views_now();
            for record in &rollouts {
                self.fleet.rollout_records_seen += 1;
                if record.canaries_passed {
                    self.fleet.canaries_passed_at.get_or_insert(self.queue.now);
                }
                self.observe(Observation::RolloutWritten {
                    record,
                    agents: &agents,
                });
            }
            self.executor.rollout = rollouts.pop();
        }
        if record_changed {
            let view = self.executor.store.record_view().expect("the store reads");
            for (host, incarnation) in self.executor.subscribers.clone() {
                let message = Message::Reply {
                    host,
                    incarnation,
                    id: None,
                    input: Input::RecordChanged(view),
                };
                self.send(Party::Store, Party::Host(host), message);
            }
        }
    }

    /// The model as the store holds it now (read again only when the log moved on).
    pub(super) fn model(&mut self) -> Model {
        let revision = self.executor.scanned;
        match &self.executor.model_cache {
            Some((cached, model)) if *cached == revision => model.clone(),
            _ => {
                let model = self
                    .executor
                    .store
                    .load_model()
                    .expect("the store reads")
                    .expect("a model");
                self.executor.model_cache = Some((revision, model.clone()));
                model
            }
        }
    }
}
