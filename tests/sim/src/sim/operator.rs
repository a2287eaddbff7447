//! The operator: `upgrade-controller` when the scenario asks for it, an abort or a second
//! request as faults, and, once healed, the rounds that bring the system to its goal:
//! held agents retried, stragglers upgraded to the operator's version.

use lockstep_core::lifecycle::{Input, OperatorAction};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::{Phase, Version};

use super::{Event, Sim};

/// The operator's healing round during liveness.
const OPERATOR_TICK_MS: u64 = 60_000;

impl Sim {
    /// The version the operator wants, if one is known now.
    pub(super) fn intended(&self) -> Option<Version> {
        match (&self.scenario.policy, self.scenario.request) {
            (UpgradePolicy::Pinned(pinned), _) => Some(*pinned),
            (_, Some(request)) => match request.version {
                Some(version) => Some(version),
                None => self
                    .streams
                    .listed
                    .iter()
                    .copied()
                    .filter(|version| {
                        version.same_minor(&self.scenario.from) && *version > self.scenario.from
                    })
                    .max(),
            },
            _ => None,
        }
        .filter(|version| self.streams.listed.contains(version))
    }

    /// [`Event::OperatorRequest`]: `juju upgrade-controller` on the scenario's controller.
    pub(super) fn operator_request(&mut self) {
        if let Some(request) = self.scenario.request {
            let host = usize::from(request.controller);
            let fleet = self.scenario.fleet.is_some();
            if fleet
                && self
                    .intended()
                    .is_some_and(|wanted| self.model().agent_version >= wanted)
            {
                return; // the model names what the operator asked for: done
            }
            let ready = self.hosts[host]
                .process
                .as_ref()
                .is_some_and(|process| process.phase() == Phase::Ready);
            if fleet && !ready {
                // A fleet run's operator asks again until the controller answers.
                let at = self.queue.now + 1_000;
                self.queue.schedule(at, Event::OperatorRequest);
                return;
            }
            self.mark_fault(Some(host), "operator: upgrade-controller");
            self.input(
                host,
                Input::UpgradeRequested {
                    version: request.version,
                },
            );
            if fleet {
                // As the real command does until its change is made (its client retries
                // through a lost connection): the request can be lost with a controller
                // that crashed before it wrote agent-version, so a fleet run's operator
                // looks again after a while and asks again if the model still lags.
                let at = self.queue.now + OPERATOR_TICK_MS;
                self.queue.schedule(at, Event::OperatorRequest);
            }
        }
    }

    /// [`Event::Abort`]: the operator aborts the upgrade on a controller.
    pub(super) fn abort(&mut self) {
        if self.in_safety() {
            let host = self.rng.index(usize::from(self.scenario.controllers));
            self.mark_fault(Some(host), "operator: abort-upgrade");
            self.input(host, Input::Operator(OperatorAction::Abort));
        }
    }

    /// [`Event::Rerequest`]: the operator asks for the upgrade again.
    pub(super) fn rerequest(&mut self) {
        if self.in_safety() {
            let host = self.rng.index(usize::from(self.scenario.controllers));
            self.mark_fault(Some(host), "operator: upgrade-controller again");
            let version = self
                .intended()
                .or(self.scenario.request.and_then(|r| r.version));
            self.input(host, Input::UpgradeRequested { version });
        }
    }

    /// [`Event::Heal`]: faults stop; the liveness phase begins.
    pub(super) fn heal(&mut self) {
        if self.healed {
            return; // a fleet run healed once its upgrade was done
        }
        self.healed = true;
        self.network.heal_all();
        self.mark_fault(None, "healed: liveness phase");
        let now = self.queue.now;
        self.queue.schedule(now + 1_000, Event::LivenessCheck);
        self.queue
            .schedule(now + OPERATOR_TICK_MS, Event::OperatorTick);
    }

    /// [`Event::OperatorTick`]: one healing round.
    pub(super) fn operator_tick(&mut self) {
        if self.live {
            return;
        }
        for host in 0..self.hosts.len() {
            let held = self.hosts[host]
                .process
                .as_ref()
                .is_some_and(|process| process.phase() == Phase::StepsFailed);
            if held {
                self.mark_fault(Some(host), "operator: retry");
                self.input(host, Input::Operator(OperatorAction::Retry));
            }
        }
        // Upgrade the stragglers to the operator's version, or to the newest version a
        // controller already runs (held there, or Ready), whichever is higher.
        let running = (0..usize::from(self.scenario.controllers))
            .map(|host| self.hosts[host].config.running.number)
            .max();
        let target = self.intended().max(running);
        if let Some(target) = target
            && self.model().agent_version < target
        {
            let ready = (0..usize::from(self.scenario.controllers)).find(|&host| {
                self.hosts[host].process.as_ref().is_some_and(|process| {
                    process.phase() == Phase::Ready && process.awaiting().is_none()
                })
            });
            if let Some(host) = ready {
                self.mark_fault(Some(host), "operator: upgrade-controller (healing)");
                self.input(
                    host,
                    Input::UpgradeRequested {
                        version: Some(target),
                    },
                );
            }
        }
        let now = self.queue.now;
        self.queue
            .schedule(now + OPERATOR_TICK_MS, Event::OperatorTick);
    }
}
