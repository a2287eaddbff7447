//! Fleet upgrades (issue 21, part 4): 3 controllers and thousands of machine agents
//! upgrade with faults, downloads taking time on the link model (`sim::links`), a staged
//! rollout run by the coordinator (`sim::rollout`), and the figure that says how close the
//! fleet came to its bandwidth bound: the fleet's upgrade time in virtual time (from the
//! model's `agent-version` set to the last agent Ready on it) over
//! `agents × binary size / (sum of the controllers' egress) + binary size / upstream`.
//!
//! Shared by `lockstep-sim --fleet`, the `fleet_sim` bench and the fleet test.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::scenario::{Fleet, Scenario};
use crate::sim::{Report, RunOptions, run};

/// What the issue asks of the ratio.
pub const RATIO_TARGET: f64 = 1.1;

/// One fleet run and what it measured.
#[derive(Clone, Debug)]
pub struct FleetRun {
    pub scenario: Scenario,
    pub report: Report,
    /// The simulator's wall time for the run.
    pub wall: Duration,
}

/// Runs `agents` machine agents and 3 controllers through the fleet upgrade of `seed`.
pub fn run_fleet(seed: u64, agents: u32, fleet: Fleet) -> FleetRun {
    run_fleet_with(seed, agents, fleet, RunOptions::default())
}

/// [`run_fleet`] with `options` (`record_timeline` for `lockstep-sim --fleet --timeline`).
pub fn run_fleet_with(seed: u64, agents: u32, fleet: Fleet, options: RunOptions) -> FleetRun {
    run_fleet_scenario(Scenario::fleet(seed, agents, fleet), options)
}

/// Runs a fleet `scenario` ([`Scenario::fleet`], perhaps with some faults turned off).
pub fn run_fleet_scenario(scenario: Scenario, options: RunOptions) -> FleetRun {
    let started = Instant::now();
    let report = run(scenario.clone(), options);
    FleetRun {
        scenario,
        report,
        wall: started.elapsed(),
    }
}

/// The `percent`th percentile of `values` (nearest rank), in ms.
pub fn percentile(values: &[u64], percent: u64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (percent * sorted.len() as u64).div_ceil(100).max(1) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn seconds(ms: u64) -> String {
    format!("{:.3} s", ms as f64 / 1000.0)
}

impl FleetRun {
    fn fleet(&self) -> Fleet {
        self.scenario.fleet.expect("a fleet scenario")
    }

    /// The fleet's upgrade time: `agent-version` set to the last agent Ready on it.
    pub fn upgrade_ms(&self) -> Option<u64> {
        let fleet = self.report.fleet.as_ref()?;
        Some(fleet.last_ready_at?.saturating_sub(fleet.version_set_at?))
    }

    /// The bandwidth bound: every agent's binary through the controllers' egress, after
    /// one upstream fetch per controller (in parallel).
    pub fn bound_ms(&self) -> u64 {
        let fleet = self.fleet();
        let egress = fleet.egress_bytes_per_second * u64::from(self.scenario.controllers);
        let agents = u128::from(self.scenario.agents) * u128::from(fleet.binary_bytes) * 1000;
        let upstream = u128::from(fleet.binary_bytes) * 1000;
        (agents.div_ceil(u128::from(egress.max(1)))
            + upstream.div_ceil(u128::from(fleet.upstream_bytes_per_second.max(1)))) as u64
    }

    /// The upgrade time over the bound.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.upgrade_ms()? as f64 / self.bound_ms().max(1) as f64)
    }

    /// The report: the figures, the ratio line last.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let report = &self.report;
        let fleet = self.fleet();
        let figures = report.fleet.clone().unwrap_or_default();
        let links = &figures.links;
        let outcome = match &report.failure {
            None => "passed".to_owned(),
            Some(failure) => format!(
                "FAILED: {:?} ({}): {}",
                failure.kind, failure.checker, failure.message
            ),
        };
        let _ = writeln!(
            out,
            "fleet: seed {}, {} controllers, {} machine agents: {outcome}",
            self.scenario.seed, self.scenario.controllers, self.scenario.agents
        );
        let _ = writeln!(
            out,
            "simulator: {} events, simulated {}, wall {:.2} s, trace {:016x}",
            report.events,
            crate::format_ms(report.simulated_ms),
            self.wall.as_secs_f64(),
            report.trace_hash
        );
        let _ = writeln!(
            out,
            "downloads: {} agents staged; per agent (asked to staged, busy waits included) median {}, p99 {}; transfer median {}, p99 {}",
            links.downloads_ms.len(),
            seconds(percentile(&links.downloads_ms, 50)),
            seconds(percentile(&links.downloads_ms, 99)),
            seconds(percentile(&links.transfers_ms, 50)),
            seconds(percentile(&links.transfers_ms, 99)),
        );
        let transferred = links.transfers_ms.len() as u64 * fleet.binary_bytes;
        let utilisation = self.upgrade_ms().map_or(0.0, |ms| {
            transferred as f64
                / (fleet.egress_bytes_per_second as f64
                    * f64::from(self.scenario.controllers)
                    * ms.max(1) as f64
                    / 1000.0)
        });
        let _ = writeln!(
            out,
            "queued requests: {} (most waiting on one controller: {}); busy answers: {} ({} downloads given up after {} s of them); downloads cut by a crash: {}; most at once on one controller: {} (max-agent-downloads {}); link probes served (agents that knew no rate): {} ({} answered busy); controllers' egress used {:.0}% of the upgrade time",
            links.queued,
            links.most_waiting,
            links.busy,
            links.busy_gave_up,
            crate::sim::BUSY_WAIT_MAX_MS / 1000,
            links.cut,
            links.most_at_once,
            crate::sim::agent_downloads_max(&fleet),
            links.probes,
            links.probes_busy,
            utilisation * 100.0
        );
        // The egress used in each 10 s from agent-version set to the end of the upgrade.
        if let (Some(set), Some(end)) = (figures.version_set_at, figures.last_ready_at) {
            let capacity = fleet.egress_bytes_per_second * u64::from(self.scenario.controllers);
            let windows: Vec<String> = (set / 1000..=end / 1000)
                .step_by(10)
                .map(|start| {
                    let start = start as usize;
                    let sent: u64 = links.sent_by_second.iter().skip(start).take(10).sum();
                    // `sent` is in bytes × 1000.
                    format!("{:.0}", sent as f64 / 10.0 / (capacity * 10) as f64)
                })
                .collect();
            let _ = writeln!(
                out,
                "egress used in each 10 s from agent-version set, %: {}",
                windows.join(" ")
            );
            let last: Vec<String> = links
                .last_downloads
                .iter()
                .map(|(ended, admitted, link)| {
                    format!(
                        "admitted {} ended {} on {} Mbit/s",
                        crate::format_ms(*admitted),
                        crate::format_ms(*ended),
                        link * 8 / 1_000_000
                    )
                })
                .collect();
            let _ = writeln!(out, "the last downloads: {}", last.join("; "));
        }
        let at = |ms: Option<u64>| ms.map_or("never".to_owned(), crate::format_ms);
        let _ = writeln!(
            out,
            "rollout: {} records written, {} read by the checker; {} agents admitted{}, {} failed and held (tolerated: {}); {} crashes; first agent download admitted at {}, canaries passed at {}; {} fetches ahead of admission started, {} completed",
            figures.rollout_writes,
            figures.rollout_records_seen,
            figures.admitted,
            if figures.halted { ", HALTED" } else { "" },
            figures.failed,
            fleet.rollout.failures_tolerated,
            figures.crashes,
            at(figures.first_download_at),
            at(figures.canaries_passed_at),
            figures.prestages,
            figures.prestaged
        );
        let _ = writeln!(
            out,
            "bound: {} agents x {} MB / ({} x {} Mbit/s) + {} MB / {} Mbit/s upstream = {}",
            self.scenario.agents,
            fleet.binary_bytes / 1_000_000,
            self.scenario.controllers,
            fleet.egress_bytes_per_second * 8 / 1_000_000,
            fleet.binary_bytes / 1_000_000,
            fleet.upstream_bytes_per_second * 8 / 1_000_000,
            crate::format_ms(self.bound_ms())
        );
        match (self.upgrade_ms(), self.ratio()) {
            (Some(upgrade), Some(ratio)) => {
                let _ = write!(
                    out,
                    "ratio: fleet upgrade {} (agent-version set at {}, every agent Ready on it or failed at {}) / bound {} = {ratio:.2}x (target <= {RATIO_TARGET}x)",
                    crate::format_ms(upgrade),
                    crate::format_ms(figures.version_set_at.unwrap_or(0)),
                    crate::format_ms(figures.last_ready_at.unwrap_or(0)),
                    crate::format_ms(self.bound_ms()),
                );
            }
            _ => {
                let _ = write!(
                    out,
                    "ratio: none (the fleet did not finish its upgrade) / bound {}",
                    crate::format_ms(self.bound_ms())
                );
            }
        }
        out
    }
}
