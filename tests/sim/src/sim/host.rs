//! The hosts: controllers and machine agents, each a real `Lifecycle` in a process that
//! boots, crashes and restarts into another binary; a disk that loses a snapshot write in
//! progress when the process dies; host steps run locally; and a clock of its own.
//! What the process asks for is carried out by its driver (`driver.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use lockstep_core::gate::GateView;
use lockstep_core::lifecycle::{
    Config, ControllerId, Input, Lifecycle, Limits, Mutations, Output, RequestId, Revision,
    Snapshot, StagePlan, StepOutcome,
};
use lockstep_core::policy::HighWaterMark;
use lockstep_core::steps::StepKey;
use lockstep_core::time::Millis;
use lockstep_core::{Phase, Progress, Role, Roles, Timestamp, Version};

use super::driver::Awaiting;
use super::queue::HostClock;
use super::stream::binary;
use super::{Event, FailureKind, Sim};
use crate::checkers::Observation;
use crate::rng::Rng;
use crate::scenario::{Scenario, Start};

/// One machine: its process (if running), what is durable on its disk, and its driver's
/// state.
#[derive(Debug)]
pub(super) struct Host {
    pub(super) name: String,
    pub(super) config: Config,
    pub(super) process: Option<Lifecycle>,
    /// Counts the processes that ran here: events and messages of an earlier one are void.
    pub(super) incarnation: u64,
    pub(super) durable: Option<Snapshot>,
    /// Published by the process; what the API server reads.
    pub(super) gate: GateView,
    pub(super) awaiting: BTreeMap<RequestId, Awaiting>,
    pub(super) watching: bool,
    pub(super) record_delivered: Option<Revision>,
    pub(super) wake_at: Option<u64>,
    pub(super) clock: HostClock,
    /// The version it ran at the start.
    pub(super) origin: Version,
    pub(super) high_water: HighWaterMark,
    /// The agent-version last fed to the process (`None`: nothing yet this incarnation).
    pub(super) fed: Option<Version>,
    /// The process has reported the binary it runs (or its report is on its way).
    pub(super) reported: bool,
    /// The last phase drawn in the timeline.
    drawn: Option<Phase>,
    /// A fleet run: this controller's last coordinator pass wrote a record.
    pub(super) rollout_wrote: bool,
    /// A fleet run: the desired version the driver will hand its core after the start
    /// spread.
    pub(super) pending_feed: Option<Version>,
    /// A fleet run: the phase this process last reported on its own (a status change).
    pub(super) status_phase: Option<Phase>,
    /// Crashes since the process last published Ready: the launcher's count, from which
    /// it takes its restart delay (`lockstep_core::restart`).
    pub(super) restart_failures: u32,
    /// When the current (or last) process started, virtual time.
    pub(super) booted_at: u64,
    /// A fleet run: the binary this machine agent fetched ahead of its admission and keeps
    /// on disk (it survives the process).
    pub(super) prestaged: Option<Version>,
    /// A fleet run: the binary its driver is fetching ahead (after the start spread, then
    /// as the awaited request [`super::driver::PRESTAGE`]).
    pub(super) prestaging: Option<StagePlan>,
    /// A fleet run: the core's own staging of the binary being fetched ahead, which waits
    /// for that fetch (as the agent's staging lock makes it).
    pub(super) stage_waiter: Option<(RequestId, StagePlan)>,
}

impl Host {
    /// Host `index` of `scenario` (controllers first); a skewed clock is drawn from `rng`.
    pub(super) fn new(scenario: &Scenario, index: usize, limits: Limits, rng: &mut Rng) -> Host {
        let controller = index < usize::from(scenario.controllers);
        let config = Config {
            controller: controller.then_some(ControllerId(index as u8)),
            roles: if controller {
                Roles::of(&[Role::Controller])
            } else {
                Roles::of(&[Role::HostMachine])
            },
            running: binary(scenario.from),
            limits,
        };
        let durable = match scenario.start {
            Start::Upgrade => {
                let mut snapshot = Snapshot::bootstrapped(&binary(scenario.from));
                snapshot.bootstrap_complete = true;
                Some(snapshot)
            }
            Start::Bootstrap => None,
        };
        let clock = if scenario.faults.clock_skew {
            HostClock {
                offset_ms: rng.range(0, 3_600_000),
                rate_per_mille: rng.range(950, 1050),
            }
        } else {
            HostClock::TRUE
        };
        Host {
            name: if controller {
                format!("controller-{index}")
            } else {
                format!("machine-{}", index - usize::from(scenario.controllers))
            },
            config,
            process: None,
            incarnation: 0,
            durable,
            gate: GateView {
                phase: Phase::Bootstrapping,
                progress: Progress::default(),
                retry_after: lockstep_core::Millis(1000),
            },
            awaiting: BTreeMap::new(),
            watching: false,
            record_delivered: None,
            wake_at: None,
            clock,
            origin: scenario.from,
            high_water: HighWaterMark::default(),
            fed: None,
            reported: false,
            drawn: None,
            rollout_wrote: false,
            pending_feed: None,
            status_phase: None,
            restart_failures: 0,
            booted_at: 0,
            prestaged: None,
            prestaging: None,
            stage_waiter: None,
        }
    }

    pub(super) fn is_controller(&self) -> bool {
        self.config.controller.is_some()
    }
}

impl Sim {
    /// Whether `incarnation` is the process running on `host` now.
    pub(super) fn current(&self, host: usize, incarnation: u64) -> bool {
        let state = &self.hosts[host];
        state.incarnation == incarnation && state.process.is_some()
    }

    /// `host`'s clock reading now.
    pub(super) fn local(&self, host: usize) -> Timestamp {
        self.hosts[host].clock.local(self.queue.now)
    }

    /// [`Event::Boot`]: a process starts on the host's binary, from its durable snapshot.
    pub(super) fn boot(&mut self, host: usize, incarnation: u64) {
        let state = &mut self.hosts[host];
        if state.incarnation != incarnation || state.process.is_some() {
            return;
        }
        let mut process = match Lifecycle::new(
            state.config.clone(),
            Arc::clone(&self.registry),
            state.durable.clone(),
        ) {
            Ok(process) => process,
            Err(error) => {
                let message = format!("{} refused to start: {error}", state.name);
                self.fail(
                    FailureKind::Crash,
                    "boot",
                    "a process starts from any snapshot it persisted",
                    message,
                );
                return;
            }
        };
        if self.options.mutations != Mutations::default() {
            process.set_mutations(self.options.mutations);
        }
        state.process = Some(process);
        state.booted_at = self.queue.now;
        state.awaiting.clear();
        state.watching = false;
        state.record_delivered = None;
        state.wake_at = None;
        state.fed = None;
        state.reported = false;
        state.pending_feed = None;
        state.status_phase = None;
        let running = state.config.running.clone();
        let controller = state.is_controller();
        self.schedule_driver_tick(host, incarnation);
        if controller && self.scenario.fleet.is_some() {
            self.schedule_rollout_pass(host, incarnation);
        }
        if !controller
            && self
                .links
                .as_ref()
                .is_some_and(|links| links.measured[host].is_none())
        {
            // No rate known for its link: it probes it after the core's start spread.
            let delay = lockstep_core::upgrader::agent_upgrade_delay(self.rng.next_u64());
            self.queue.schedule(
                self.queue.now + delay.0,
                Event::LinkProbe { host, incarnation },
            );
        }
        let listed = self.streams.listed.clone();
        self.observe(Observation::Booted {
            host,
            binary: &running,
            listed: &listed,
        });
        self.draw(host, Some(Phase::Bootstrapping));
        self.input(host, Input::Start);
    }

    /// [`Event::Crash`]: the crash fault strikes a host at random; the next is scheduled.
    pub(super) fn crash_fault(&mut self) {
        if self.in_safety() {
            let host = self.rng.index(self.hosts.len());
            self.crash(host, "crash");
            if let Some(interval) = self.scenario.faults.crash_interval_ms {
                let next = self.queue.now + self.rng.range(1, interval * 2);
                self.queue.schedule(next, Event::Crash);
            }
        }
    }

    /// The process dies: what was in flight is lost; its launcher starts it again after
    /// the launcher's delay (`lockstep_core::restart::restart_delay`: 0.5 s, doubling with
    /// each crash before the process is Ready again, up to 30 s).
    pub(super) fn crash(&mut self, host: usize, why: &str) {
        if self.hosts[host].process.is_none() {
            return;
        }
        self.mark_fault(Some(host), why);
        self.fleet.crashes += 1;
        self.stop(host);
        let state = &mut self.hosts[host];
        state.restart_failures += 1;
        let ran = Millis(self.queue.now.saturating_sub(state.booted_at));
        let delay = lockstep_core::restart::restart_delay(state.restart_failures, ran);
        let incarnation = state.incarnation;
        let at = self.queue.now + delay.0;
        self.queue.schedule(at, Event::Boot { host, incarnation });
    }

    /// The process ends (a crash, or a restart into another binary).
    pub(super) fn stop(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        if state.is_controller() && self.scenario.fleet.is_some() && state.process.is_some() {
            // Its API server and its status writer stop: reports not yet written are lost.
            self.pending_statuses
                .retain(|_, (controller, _, _, _)| *controller != host);
        }
        let state = &mut self.hosts[host];
        state.process = None;
        state.incarnation += 1;
        state.awaiting.clear();
        state.watching = false;
        state.wake_at = None;
        state.gate.phase = Phase::Bootstrapping;
        state.pending_feed = None;
        state.rollout_wrote = false;
        state.prestaging = None;
        state.stage_waiter = None;
        self.executor.unsubscribe(host);
        self.cut_downloads(host);
        self.draw(host, None);
    }

    /// [`Event::Wake`]: the process's earliest timer is due.
    pub(super) fn wake(&mut self, host: usize, incarnation: u64) {
        if self.current(host, incarnation) {
            self.hosts[host].wake_at = None;
            let local = self.local(host);
            if let Some(process) = &mut self.hosts[host].process {
                process.handle_timeout(local);
            }
            self.drain(host);
        }
    }

    /// Feeds one input to a host's process (if it runs) and drains its outputs.
    pub(super) fn input(&mut self, host: usize, input: Input) {
        let local = self.local(host);
        if let Input::Staged {
            id: super::driver::PRESTAGE,
            result,
        } = &input
        {
            // The driver's own fetch ahead, not the core's request.
            let done = result.is_ok();
            self.prestage_done(host, done);
            return;
        }
        let Some(process) = &mut self.hosts[host].process else {
            return;
        };
        self.trace.input(self.queue.now, host, &input);
        process.handle(local, input);
        self.drain(host);
    }

    /// Takes every output of the process: requests to its driver, gate views to its API
    /// server, status to the trace; then arms its earliest timer.
    pub(super) fn drain(&mut self, host: usize) {
        let incarnation = self.hosts[host].incarnation;
        loop {
            let Some(process) = &mut self.hosts[host].process else {
                return;
            };
            let Some(output) = process.poll_output() else {
                break;
            };
            let phase = process.phase();
            match output {
                Output::Request { id, request } => {
                    self.trace.request(self.queue.now, host, id, &request);
                    self.dispatch(host, incarnation, id, request);
                }
                Output::Gate(view) => {
                    self.hosts[host].gate = view;
                    if view.phase == Phase::Ready {
                        // The worker told its launcher it is ready: the failure count
                        // starts over (`lockstep-agent`'s `daemon/launcher.rs`).
                        self.hosts[host].restart_failures = 0;
                    }
                    self.observe(Observation::GatePublished {
                        host,
                        view: view.phase,
                        process: phase,
                    });
                    self.draw(host, Some(view.phase));
                }
                Output::Status(report) => {
                    self.status_changed(host, incarnation, &report);
                    if !report.message.is_empty() {
                        self.trace.note(
                            self.queue.now,
                            &format!("{} status: {}", self.hosts[host].name, report.message),
                        );
                    }
                }
                // `Output` is `#[non_exhaustive]`: the simulator must learn a new one first.
                other => unreachable!("an output the simulator does not handle: {other:?}"),
            }
            if self.hosts[host].incarnation != incarnation {
                return; // it restarted into another binary
            }
        }
        let state = &self.hosts[host];
        let Some(process) = &state.process else {
            return;
        };
        if process.phase() == Phase::Ready {
            let running = state.config.running.number;
            let observation = Observation::Ready {
                host,
                running: state.config.running.number,
                upgraded_to: process.snapshot().upgraded_to_version,
                durable_upgraded_to: state.durable.as_ref().map(|s| s.upgraded_to_version),
                controller: state.is_controller(),
            };
            let report = state.is_controller() && !state.reported;
            self.observe(observation);
            if report {
                self.report_binary(host);
            }
            self.fleet_ready(host, running);
        }
        // Timers: wake at the earliest deadline, on this host's clock.
        let now = self.queue.now;
        if let Some(deadline) = self.hosts[host]
            .process
            .as_ref()
            .and_then(Lifecycle::poll_timeout)
        {
            let at = self.hosts[host].clock.global(deadline).max(now);
            if self.hosts[host]
                .wake_at
                .is_none_or(|wake| at < wake || wake < now)
            {
                self.hosts[host].wake_at = Some(at);
                self.queue.schedule(at, Event::Wake { host, incarnation });
            }
        }
    }

    /// [`Event::DiskWrite`]: a snapshot write lands, unless the process died first; the
    /// persist-crash fault may strike just before or just after it.
    pub(super) fn disk_write(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        snapshot: Snapshot,
    ) {
        if !self.current(host, incarnation) {
            return; // the process died before the rename: nothing written
        }
        let persist_crash = self.scenario.faults.persist_crash_per_million;
        if self.in_safety() && self.rng.chance(persist_crash) {
            self.crash(host, "crash before a snapshot write");
            return;
        }
        self.hosts[host].durable = Some(snapshot.clone());
        self.observe(Observation::SnapshotDurable {
            host,
            snapshot: &snapshot,
        });
        if self.in_safety() && self.rng.chance(persist_crash) {
            self.crash(host, "crash after a snapshot write");
            return;
        }
        self.input(host, Input::Done { id });
    }

    /// [`Event::HostStep`]: a host step ran on the host.
    pub(super) fn host_step(&mut self, host: usize, incarnation: u64, id: RequestId, key: StepKey) {
        if self.current(host, incarnation) {
            self.observe(Observation::HostStepRan { host, key });
            self.input(
                host,
                Input::StepFinished {
                    id,
                    outcome: StepOutcome::Applied,
                },
            );
        }
    }

    /// Draws the host's phase in the swimlane when it changed (`None`: down).
    pub(super) fn draw(&mut self, host: usize, phase: Option<Phase>) {
        if self.hosts[host].drawn == phase && phase.is_some() {
            return;
        }
        self.hosts[host].drawn = phase;
        if let Some(timeline) = &mut self.timeline {
            let name = self.hosts[host].name.clone();
            let version = self.hosts[host].config.running.number;
            timeline.phase(self.queue.now, host, &name, phase, version);
        }
    }
}
