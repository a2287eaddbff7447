//! What a run concludes: every observation fed to the checkers, the first failure kept,
//! the liveness goal checked once healed (with the end-of-run halves of the checkers), and
//! faults marked in the trace and the swimlane.

use std::fmt::Write as _;

use lockstep_core::lifecycle::{Lifecycle, RecordView};
use lockstep_core::{Phase, Version};
use lockstep_store::Store;

use super::{Event, Sim};
use crate::checkers::{End, EndHost, EndWatcher, Observation};
use crate::trace::Timeline;

/// How a run failed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FailureKind {
    /// A process (or the simulator) panicked: an assertion of the core failed.
    Crash,
    /// Healed, the system did not reach its goal within the bound.
    Liveness,
    /// A checker saw an invariant broken.
    Correctness,
}

/// A failed run.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Failure {
    pub kind: FailureKind,
    /// The checker that failed (`crash` and `liveness` for the other kinds).
    pub checker: &'static str,
    pub invariant: &'static str,
    pub message: String,
    pub at_ms: u64,
}

/// What one run did.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub events: u64,
    pub simulated_ms: u64,
    pub trace_hash: u64,
    /// Answers of the Upgrader (`DesiredVersion`, `Tools`) to a machine agent given while
    /// some controller ran, or was about to boot, another binary than the one it had
    /// reported: the moments where only the reported binaries give the right answer.
    pub answers_before_a_report: u64,
    pub failure: Option<Failure>,
    /// Recorded only when asked for.
    pub trace: Option<Vec<String>>,
    pub timeline: Option<Timeline>,
    /// A fleet run's figures (`None` for other runs).
    pub fleet: Option<FleetReport>,
}

/// What a fleet run measured (virtual milliseconds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetReport {
    /// When the model's `agent-version` was set to the target.
    pub version_set_at: Option<u64>,
    /// When every agent had been Ready on the target, or was recorded failed by the
    /// rollout (held after its trial, or fallen back): the fleet's upgrade is done (faults
    /// stop then, and the run goes on to its goal).
    pub last_ready_at: Option<u64>,
    /// Agents the rollout recorded failed and that never were Ready on the target then
    /// (the crash faults can exhaust a trial's boots after its steps ran, which holds the
    /// agent for its operator, by design).
    pub failed: usize,
    /// The downloads.
    pub links: super::LinkStats,
    /// Rollout records the coordinators wrote.
    pub rollout_writes: u64,
    /// Rollout records the checkers read from the store's log.
    pub rollout_records_seen: u64,
    /// Agents the last rollout record admitted, and whether it halted.
    pub admitted: usize,
    pub halted: bool,
    /// Process crashes (the crash and persist-crash faults).
    pub crashes: u64,
    /// When the first machine agent's download was admitted.
    pub first_download_at: Option<u64>,
    /// When the store's record first said the canaries passed.
    pub canaries_passed_at: Option<u64>,
    /// Fetches ahead of admission the agents started, and those that completed.
    pub prestages: u64,
    pub prestaged: u64,
}

impl Sim {
    /// A fleet run: `host` is Ready on `running`. Once every host has been Ready on the
    /// operator's version, the fleet's upgrade is done: faults stop (the liveness phase).
    pub(super) fn fleet_ready(&mut self, host: usize, running: Version) {
        if self.scenario.fleet.is_none()
            || self.scenario.request.and_then(|request| request.version) != Some(running)
            || self.upgraded[host]
        {
            return;
        }
        self.upgraded[host] = true;
        self.upgraded_count += 1;
        self.fleet_settled();
    }

    /// A fleet run: the upgrade is done once every host has been Ready on the operator's
    /// version or is one the rollout recorded failed (a failure the policy tolerates; past
    /// them the rollout halts, which never settles). Called on every first Ready and after
    /// every rollout record written.
    pub(super) fn fleet_settled(&mut self) {
        if self.scenario.fleet.is_none() || self.fleet.last_ready_at.is_some() {
            return;
        }
        let failed = self.failed_short_of_the_target();
        if self.upgraded_count + failed == self.hosts.len() {
            self.fleet.failed = failed;
            self.fleet.last_ready_at = Some(self.queue.now);
            self.heal();
        }
    }

    /// Machine agents the rollout record lists as failed that never were Ready on the
    /// operator's version.
    fn failed_short_of_the_target(&self) -> usize {
        self.rollout_record().map_or(0, |record| {
            record
                .failed
                .keys()
                .filter_map(|id| self.host_of_machine(id))
                .filter(|host| !self.upgraded[*host])
                .count()
        })
    }

    /// Whether `host` is a machine agent the rollout recorded failed that stays where its
    /// failure left it: held in `steps-failed` or `upgrade-failed` after its trial, or
    /// Ready on the binary it fell back to; nothing in flight.
    fn settled_as_failed(&self, host: usize) -> bool {
        let state = &self.hosts[host];
        if state.is_controller() || !state.awaiting.is_empty() {
            return false;
        }
        let failed = self
            .rollout_record()
            .is_some_and(|record| record.failed.contains_key(&self.machine_id(host)));
        failed
            && state.process.as_ref().is_some_and(|process| {
                process.awaiting().is_none()
                    && matches!(
                        process.phase(),
                        Phase::StepsFailed | Phase::UpgradeFailed | Phase::Ready
                    )
            })
    }

    /// Shows `observation` to every checker; the first that objects fails the run.
    pub(super) fn observe(&mut self, observation: Observation<'_>) {
        if self.failure.is_some() {
            return;
        }
        for index in 0..self.checkers.len() {
            if let Err(message) = self.checkers[index].observe(&observation) {
                let (name, invariant) = (
                    self.checkers[index].name(),
                    self.checkers[index].invariant(),
                );
                self.fail(FailureKind::Correctness, name, invariant, message);
                return;
            }
        }
    }

    /// Records the run's failure (the first one only).
    pub(super) fn fail(
        &mut self,
        kind: FailureKind,
        checker: &'static str,
        invariant: &'static str,
        message: String,
    ) {
        if self.failure.is_none() {
            let now = self.queue.now;
            self.trace
                .note(now, &format!("FAILED {checker}: {message}"));
            self.failure = Some(Failure {
                kind,
                checker,
                invariant,
                message,
                at_ms: now,
            });
        }
    }

    /// A liveness failure, with where every party stands.
    pub(super) fn fail_liveness(&mut self, why: &str) {
        let mut message = why.to_owned();
        // A large fleet names the hosts short of the goal (not Ready on the model's
        // version), at most a dozen, with how many there are.
        let target = self.model().agent_version;
        let short: Vec<_> = self
            .hosts
            .iter()
            .filter(|host| {
                self.hosts.len() <= 12
                    || host.process.as_ref().map(Lifecycle::phase) != Some(Phase::Ready)
                    || host.config.running.number != target
            })
            .collect();
        if self.hosts.len() > 12 {
            let _ = write!(message, "; {} hosts short of the goal", short.len());
        }
        for host in short.iter().take(12) {
            let phase = host.process.as_ref().map(Lifecycle::phase);
            let _ = write!(
                message,
                "; {} {:?} on {}",
                host.name, phase, host.config.running.number
            );
        }
        let model = self.model();
        let _ = write!(message, "; agent-version {}", model.agent_version);
        if let Some(target) = self.intended() {
            let _ = write!(message, " (operator wants {target})");
        }
        if let Ok(view) = self.executor.store.record_view()
            && let Some((record, _)) = view.current
        {
            let _ = write!(message, "; record current: {record:?}");
        }
        if self.executor.agent_version_refusals > 0 {
            let _ = write!(
                message,
                "; agent-version refused {} times while a record was current",
                self.executor.agent_version_refusals
            );
        }
        let scanned = self.executor.scanned;
        for (index, client) in self.clients.iter().enumerate() {
            if client.unfinished(scanned) {
                let _ = write!(
                    message,
                    "; client {index} unfinished ({:?}, gave up: {:?})",
                    client.role, client.gave_up
                );
            }
        }
        self.fail(
            FailureKind::Liveness,
            "liveness",
            "healed, every agent reaches Ready on the desired version and every client finishes",
            message,
        );
    }

    /// [`Event::LivenessCheck`]: checks the goal, and again a second later until it holds.
    pub(super) fn liveness_check(&mut self) {
        self.check_live();
        if !self.live {
            let now = self.queue.now;
            self.queue.schedule(now + 1_000, Event::LivenessCheck);
        }
    }

    /// The goal: every agent Ready on the model's agent-version (at least the operator's)
    /// or, in a fleet run, recorded failed by the rollout and settled where its failure left
    /// it, no record current, every client finished; then the checkers' end-of-run halves.
    fn check_live(&mut self) {
        let model = self.model();
        let version = model.agent_version;
        if self.intended().is_some_and(|target| version < target) {
            return;
        }
        let hosts_done = self.hosts.iter().enumerate().all(|(index, host)| {
            (host.process.as_ref().is_some_and(|process| {
                process.phase() == Phase::Ready && process.awaiting().is_none()
            }) && host.config.running.number == version
                && host.awaiting.is_empty())
                || (self.scenario.fleet.is_some() && self.settled_as_failed(index))
        });
        if !hosts_done {
            return;
        }
        let scanned = self.executor.scanned;
        if !self.clients.iter().all(|client| client.done(scanned)) {
            return;
        }
        if let Some((index, client)) = self
            .clients
            .iter()
            .enumerate()
            .find(|(_, client)| client.gave_up.is_some())
        {
            let message = format!(
                "client {index} gave up: {}",
                client.gave_up.clone().unwrap_or_default()
            );
            self.fail(
                FailureKind::Liveness,
                "liveness",
                "every client finishes",
                message,
            );
            return;
        }
        let view: RecordView = self.executor.store.record_view().expect("the store reads");
        if view.current.is_some() {
            return;
        }
        // Live: the end-of-run halves of the checkers.
        let hosts: Vec<EndHost> = self
            .hosts
            .iter()
            .map(|host| EndHost {
                roles: host.config.roles,
                controller: host.is_controller(),
                origin: host.origin,
                running: host.config.running.number,
                durable: host.durable.clone(),
            })
            .collect();
        let watchers: Vec<EndWatcher> = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(index, client)| client.end_watcher(index))
            .collect();
        let end = End {
            hosts: &hosts,
            agent_version: version,
            revisions: &self.executor.revisions,
            step_effects: &self.executor.step_effects,
            operation_effects: &self.executor.operation_effects,
            answered_operations: &self.answered_operations,
            watchers: &watchers,
        };
        let mut failed = None;
        for checker in &mut self.checkers {
            if let Err(message) = checker.finish(&end) {
                failed = Some((checker.name(), checker.invariant(), message));
                break;
            }
        }
        if let Some((name, invariant, message)) = failed {
            self.fail(FailureKind::Correctness, name, invariant, message);
            return;
        }
        self.trace.note(
            self.queue.now,
            &format!("live: every agent Ready on {version}"),
        );
        self.live = true;
        if let Some((admitted, halted)) = self
            .rollout_record()
            .map(|record| (record.admitted.len(), record.halted.is_some()))
        {
            self.fleet.admitted = admitted;
            self.fleet.halted = halted;
        }
    }

    /// Marks a fault (or an operator's action) in the trace and the swimlane.
    pub(super) fn mark_fault(&mut self, host: Option<usize>, what: &str) {
        let now = self.queue.now;
        self.trace.note(now, &format!("fault: {what}"));
        if let Some(timeline) = &mut self.timeline {
            timeline.fault(now, host, what);
        }
    }
}

/// The message of a caught panic.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
