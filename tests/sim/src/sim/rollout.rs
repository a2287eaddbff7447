//! The staged rollout of a fleet run (`spec/rollout.md`), as lockstep-agent runs it
//! (`api::rollout`, `daemon::rollout`): every Ready controller makes a coordinator pass
//! every second; a pass that has something to write takes the coordinator lease (the live
//! holder gets its own token again; it is not given back) and writes the core's next record
//! (`lockstep_core::rollout::advance`) to the real `MemoryStore` (`tx.rollout()` /
//! `tx.put_rollout()`) in a transaction fenced on its token. The API servers answer machine
//! agents with `lockstep_core::rollout::told` over the record as the store's log last
//! showed it (`api.rs`).
//!
//! An agent's health, for `advance`, is read from the status it reported to the store
//! (`Machiner.SetStatus`: on every change of phase and every driver tick): down once it
//! has not reported for [`DOWN_AFTER_MS`], failed when it reports `error` (a failure
//! phase), Ready in phase `ready`, else busy. Its running version is the binary it
//! reported (`Upgrader.SetTools`), as the Upgrader reads it. The coordinator writes nothing
//! before every controller reported running the model's `agent-version` (controllers
//! first). It reaches the store directly, not over the simulated network.

use lockstep_core::lifecycle::{ControllerId, StatusReport};
use lockstep_core::rollout::{self, AgentView, Health, Rollout, RolloutPolicy};
use lockstep_core::{Phase, Timestamp, Version};
use lockstep_store::{Abort, AgentStatus, Store, TxOutcome};

use super::network::{AgentCall, Message, Party};
use super::{Event, Sim};

/// An agent that has not reported for this long is down (lockstep-transport's
/// `AGENT_DOWN_AFTER`: three status intervals).
const DOWN_AFTER_MS: u64 = 30_000;
/// How often a controller's coordinator makes a pass (lockstep-agent's
/// `daemon::rollout::INTERVAL`).
const PASS_INTERVAL_MS: u64 = 1_000;
/// How often the controllers write the status reports they received (one transaction).
const STATUS_FLUSH_MS: u64 = 1_000;

/// The health `advance` reads from an agent's last status report at `now` (the core's
/// reading, `Health::of_report`, as lockstep-agent's coordinator reads it).
fn health(status: Option<&AgentStatus>, now: Timestamp) -> Health {
    match status {
        None => Health::Down,
        Some(status) => Health::of_report(
            &status.status,
            &status.info,
            &status.phase,
            now.millis_since(status.updated) > DOWN_AFTER_MS,
        ),
    }
}

impl Sim {
    /// The rollout policy of this run (the default, Juju's, outside a fleet run).
    pub(super) fn rollout_policy(&self) -> RolloutPolicy {
        self.scenario
            .fleet
            .map_or_else(RolloutPolicy::default, |fleet| fleet.rollout)
    }

    /// A machine agent's id (`7` for `machine-7`).
    pub(super) fn machine_id(&self, host: usize) -> String {
        (host - usize::from(self.scenario.controllers)).to_string()
    }

    /// The host of the machine agent with id `id` ([`Sim::machine_id`]'s inverse), if there
    /// is one.
    pub(super) fn host_of_machine(&self, id: &str) -> Option<usize> {
        id.parse::<usize>()
            .ok()
            .map(|id| id + usize::from(self.scenario.controllers))
            .filter(|host| *host < self.hosts.len())
    }

    /// Every machine agent as the rollout reads it, from the agents' `statuses` in the store
    /// at `now` and the binaries they reported.
    fn agent_views(&self, statuses: &[(String, AgentStatus)], now: Timestamp) -> Vec<AgentView> {
        // Machine agents' tags are `machine-<id>`.
        let controllers = usize::from(self.scenario.controllers);
        let mut by_host: Vec<Option<&AgentStatus>> = vec![None; self.hosts.len()];
        for (tag, status) in statuses {
            let host = tag
                .strip_prefix("machine-")
                .and_then(|id| self.host_of_machine(id));
            if let Some(host) = host {
                by_host[host] = Some(status);
            }
        }
        (controllers..self.hosts.len())
            .map(|host| AgentView {
                id: self.machine_id(host),
                running: self.executor.reported(host).map(|binary| binary.number),
                health: health(by_host[host], now),
                download_rate: by_host[host].and_then(|status| status.download_rate),
            })
            .collect()
    }

    /// Every agent's last report, as the store holds them, and the store's clock.
    fn statuses(&self) -> (Vec<(String, AgentStatus)>, Timestamp) {
        let mut statuses = Vec::new();
        let mut now = Timestamp(0);
        self.executor
            .store
            .snapshot(&mut |tx| {
                now = tx.now();
                statuses = tx.agent_statuses()?;
                Ok(())
            })
            .expect("the store reads");
        (statuses, now)
    }

    /// Every agent as the store holds them now (for the checkers): as the transaction that
    /// wrote the rollout record just read them, or read again.
    pub(super) fn agent_views_now(&mut self) -> Vec<AgentView> {
        let (statuses, now) = self.rollout_read.take().unwrap_or_else(|| self.statuses());
        self.agent_views(&statuses, now)
    }

    /// Whether every controller reported running `version` (or newer).
    fn controllers_run(&self, version: Version) -> bool {
        lockstep_core::upgrader::controllers_run(
            version,
            (0..usize::from(self.scenario.controllers)).map(|host| self.executor.reported(host)),
        )
    }

    /// `controller`'s API server receives `host`'s status report (`Machiner.SetStatus`):
    /// the controllers write the reports they received to the store in one transaction
    /// every [`STATUS_FLUSH_MS`] (no event: heartbeats).
    pub(super) fn record_status(
        &mut self,
        controller: usize,
        host: usize,
        phase: Phase,
        info: String,
    ) {
        let binary = self.hosts[host].config.running.clone();
        self.pending_statuses
            .insert(host, (controller, phase, info, binary));
        if !self.status_flush_scheduled {
            self.status_flush_scheduled = true;
            let at = self.queue.now + STATUS_FLUSH_MS;
            self.queue.schedule(at, Event::StatusFlush);
        }
    }

    /// [`Event::StatusFlush`]: the reports received are written, stamped with the store's
    /// clock.
    pub(super) fn flush_statuses(&mut self) {
        self.status_flush_scheduled = false;
        let pending = std::mem::take(&mut self.pending_statuses);
        if pending.is_empty() {
            return;
        }
        let hosts = &self.hosts;
        let measured = self.links.as_ref().map(|links| &links.measured);
        self.executor
            .store
            .transaction(None, &mut |tx| {
                let now = tx.now();
                for (&host, (_, phase, info, binary)) in &pending {
                    let failed = matches!(phase, Phase::StepsFailed | Phase::UpgradeFailed);
                    let status = AgentStatus {
                        status: if failed { "error" } else { "started" }.to_owned(),
                        info: info.clone(),
                        phase: phase.as_str().to_owned(),
                        version: Some(binary.clone()),
                        download_rate: measured.and_then(|measured| measured[host]),
                        updated: now,
                    };
                    tx.put_agent_status(&hosts[host].name, &status)?;
                }
                Ok(())
            })
            .expect("the store answers");
    }

    /// A fleet run's machine agent reports a change of its phase at once (its status
    /// watch), besides its heartbeat every driver tick.
    pub(super) fn status_changed(&mut self, host: usize, incarnation: u64, report: &StatusReport) {
        if self.scenario.fleet.is_none()
            || self.hosts[host].is_controller()
            || self.hosts[host].status_phase == Some(report.phase)
        {
            return;
        }
        self.hosts[host].status_phase = Some(report.phase);
        let controller = self.rng.index(usize::from(self.scenario.controllers));
        let call = AgentCall::Report {
            phase: report.phase,
            info: report.message.clone(),
            poll: false,
        };
        self.send_agent_call(host, incarnation, controller, call);
    }

    /// Schedules a controller's next coordinator pass.
    pub(super) fn schedule_rollout_pass(&mut self, host: usize, incarnation: u64) {
        let at = self.queue.now + PASS_INTERVAL_MS;
        self.queue
            .schedule(at, Event::RolloutPass { host, incarnation });
    }

    /// [`Event::RolloutPass`]: one coordinator pass of a Ready controller, as
    /// lockstep-agent's `api::rollout::coordinate`: whether the rollout has something to
    /// write (read without the lease); if so the coordinator lease and the core's next
    /// record written in a transaction fenced on it, read again inside.
    pub(super) fn rollout_pass(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation) {
            return;
        }
        self.schedule_rollout_pass(host, incarnation);
        let ready = self.hosts[host]
            .process
            .as_ref()
            .is_some_and(|process| process.phase() == Phase::Ready);
        if !ready {
            return;
        }
        let holder = ControllerId(host as u8);
        let store = self.executor.store.clone();
        let now = Timestamp(self.queue.now);
        // Another controller holds the lease: the acquire below would fail (the simulator
        // skips the read before it, which changes nothing).
        if store
            .lease()
            .expect("the store reads")
            .is_some_and(|lease| lease.is_live(now) && lease.holder != holder)
        {
            return;
        }
        let policy = self.rollout_policy();
        let target = self.model().agent_version;
        // The read without the lease, from the record as the store's log last showed it;
        // skipped by the holder whose last pass wrote (the rollout is under way: it would
        // find something to write again, or extend its lease once more for nothing).
        let holds = store
            .lease()
            .expect("the store reads")
            .is_some_and(|lease| lease.is_live(now) && lease.holder == holder);
        if !(holds && self.hosts[host].rollout_wrote) {
            let (statuses, read_at) = self.statuses();
            let record = self.executor.rollout.as_ref();
            if self
                .next_record(&policy, target, record, &statuses, read_at)
                .is_none()
            {
                self.hosts[host].rollout_wrote = false;
                return;
            }
        }
        let ttl = self.hosts[host].config.limits.lease_ttl();
        let Some(token) = store.acquire_lease(holder, ttl).expect("the store answers") else {
            return;
        };
        let told_before = self.told_agents(target);
        let mut written = false;
        let mut read = None;
        let sim = &*self;
        let outcome = store
            .transaction(Some(token), &mut |tx| {
                written = false;
                let record = tx.rollout()?;
                let statuses = tx.agent_statuses()?;
                let next = sim.next_record(&policy, target, record.as_ref(), &statuses, tx.now());
                read = Some((statuses, tx.now()));
                match next {
                    Some(next) => {
                        tx.put_rollout(&next)?;
                        written = true;
                        Ok(())
                    }
                    None => Err(Abort::Unchanged),
                }
            })
            .expect("the store answers");
        // What the agents had reported when the record was written, for the checker (the
        // statuses log no event, and nothing runs between the commit and the scan below).
        self.rollout_read = read;
        let wrote = written && matches!(outcome, TxOutcome::Committed(_));
        self.hosts[host].rollout_wrote = wrote;
        if wrote {
            self.fleet.rollout_writes += 1;
        }
        self.scan_store();
        let prepared = self
            .executor
            .rollout
            .as_ref()
            .is_some_and(|record| record.admitted.is_empty());
        if wrote && prepared {
            // A prepared record (nobody admitted) gives the lease back at once, as
            // lockstep-agent's `coordinate` does: the controllers' own upgrade needs it.
            store
                .release_lease(holder, token)
                .expect("the store answers");
            self.hosts[host].rollout_wrote = false;
        }
        if wrote {
            self.notify_admitted(host, incarnation, target, &told_before);
            self.fleet_settled();
        }
    }

    /// The agents the rollout record (as the store's log last showed it) told `target`:
    /// admitted, or told to fetch it ahead (`Rollout::fetching_ahead`).
    /// Each with whether it was admitted (`true`) or told to fetch ahead: the watcher fires
    /// when either changes.
    fn told_agents(&self, target: Version) -> std::collections::BTreeSet<(String, bool)> {
        let Some(record) = self
            .executor
            .rollout
            .as_ref()
            .filter(|record| record.target == target)
        else {
            return Default::default();
        };
        let ahead = record
            .fetching_ahead()
            .into_iter()
            .map(|id| (id.to_owned(), false));
        record
            .admitted
            .keys()
            .map(|id| (id.clone(), true))
            .chain(ahead)
            .collect()
    }

    /// The `WatchAPIVersion` watchers of the agents the record just written admitted or
    /// told to fetch ahead fire: their desired version (or `stage-version`) changed. Each
    /// event crosses the network from the controller that wrote the record (the agents'
    /// connections are spread over the controllers; the watcher fires on whichever holds
    /// it, which the simulator does not track), and may be lost or delayed like any
    /// message; the agent's poll finds what a lost one said.
    fn notify_admitted(
        &mut self,
        controller: usize,
        incarnation: u64,
        target: Version,
        before: &std::collections::BTreeSet<(String, bool)>,
    ) {
        if !self.current(controller, incarnation) {
            return;
        }
        let admitted: Vec<usize> = self
            .told_agents(target)
            .difference(before)
            .filter_map(|(id, _)| self.host_of_machine(id))
            .collect();
        for host in admitted {
            let message = Message::VersionChanged {
                host,
                incarnation: self.hosts[host].incarnation,
            };
            self.send(Party::Host(controller), Party::Host(host), message);
        }
    }

    /// The record the coordinator writes next (`None`: nothing to write), as
    /// lockstep-agent's `api::rollout::next_record` decides it: before every controller
    /// runs the model's agent-version, the core's `prepare` when it chose someone, else
    /// nothing; no record for Juju's default policy
    /// (unless a halted one stands) nor for a fleet already on the target; else the core's
    /// `advance` over the record of that target (a new one after the last: `retarget`).
    fn next_record(
        &self,
        policy: &RolloutPolicy,
        target: Version,
        record: Option<&Rollout>,
        statuses: &[(String, AgentStatus)],
        now: Timestamp,
    ) -> Option<Rollout> {
        let controllers_run = self.controllers_run(target);
        let views = self.agent_views(statuses, now);
        let current = record.filter(|record| record.target == target);
        let halted_before = record.is_some_and(|record| record.halted.is_some());
        let all_there = views.iter().all(|agent| agent.running == Some(target));
        if current.is_none() && ((policy.is_default() && !halted_before) || all_there) {
            return None;
        }
        let base = match current {
            Some(current) => current.clone(),
            None => rollout::retarget(record, target),
        };
        let next = if controllers_run {
            rollout::advance(policy, &base, &views, now)
        } else {
            // Controllers first: the core's `prepare`, written only when it chose someone.
            let next = rollout::prepare(policy, &base, &views);
            if next == base {
                return None;
            }
            next
        };
        (record != Some(&next)).then_some(next)
    }

    /// The rollout record the API server reads (as last seen in the store's log).
    pub(super) fn rollout_record(&self) -> Option<&Rollout> {
        self.executor.rollout.as_ref()
    }
}
