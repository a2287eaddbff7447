//! Many seeds: the sweep, its summary, the determinism self-check, shrinking a failure to
//! a smaller scenario that fails the same way, and the failure report with the exact
//! command that reproduces it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lockstep_core::lifecycle::Mutations;

use crate::scenario::{Caps, FaultKind, Overrides, Scenario};
use crate::sim::{Failure, Report, RunOptions, run};

/// Runs (shrinks) at most this many scenarios while shrinking one failure.
const SHRINK_RUNS_MAX: usize = 80;
/// Trace lines a failure report shows (the end of the trace).
const REPORT_LINES_MAX: usize = 60;

/// A planted defect by its command-line name.
pub fn mutation(name: &str) -> Option<Mutations> {
    let mut mutations = Mutations::default();
    match name {
        "gate-before-version-check" => mutations.gate_before_version_check = true,
        "checkpoint-before-effects" => mutations.checkpoint_before_effects = true,
        "unfenced-coordinator" => mutations.unfenced_coordinator = true,
        "upgraded-to-with-step-missing" => mutations.upgraded_to_with_step_missing = true,
        _ => return None,
    }
    Some(mutations)
}

/// The command-line name of a set of planted defects (the first switched on).
pub fn mutation_flag(mutations: Mutations) -> String {
    let names = [
        (
            mutations.gate_before_version_check,
            "gate-before-version-check",
        ),
        (
            mutations.checkpoint_before_effects,
            "checkpoint-before-effects",
        ),
        (mutations.unfenced_coordinator, "unfenced-coordinator"),
        (
            mutations.upgraded_to_with_step_missing,
            "upgraded-to-with-step-missing",
        ),
    ];
    names
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| format!(" --mutation {name}"))
        .collect()
}

/// What a sweep did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub seeds: u64,
    pub events: u64,
    pub simulated_ms: u64,
    pub wall: Duration,
    pub failures: Vec<(Scenario, Failure)>,
}

impl Summary {
    pub fn seeds_per_second(&self) -> f64 {
        self.seeds as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    /// Simulated time over wall time.
    pub fn speed_up(&self) -> f64 {
        self.simulated_ms as f64 / 1000.0 / self.wall.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} seeds, {} failed; {} events; simulated {}; wall {:.2}s; {:.1} seeds/s, {:.0} events/s, speed-up {:.0}x over real time",
            self.seeds,
            self.failures.len(),
            self.events,
            crate::format_ms(self.simulated_ms),
            self.wall.as_secs_f64(),
            self.seeds_per_second(),
            self.events_per_second(),
            self.speed_up()
        )
    }
}

/// Runs every seed of `seeds`, each narrowed by `overrides`, calling `each` after each.
pub fn sweep(
    seeds: std::ops::Range<u64>,
    caps: Caps,
    overrides: &Overrides,
    mutations: Mutations,
    mut each: impl FnMut(&Scenario, &Report),
) -> Summary {
    let started = Instant::now();
    let mut summary = Summary::default();
    for seed in seeds {
        let scenario = Scenario::with_overrides(seed, caps, overrides);
        let options = RunOptions {
            mutations,
            ..RunOptions::default()
        };
        let report = run(scenario.clone(), options);
        summary.seeds += 1;
        summary.events += report.events;
        summary.simulated_ms += report.simulated_ms;
        each(&scenario, &report);
        if let Some(failure) = &report.failure {
            summary.failures.push((scenario, failure.clone()));
        }
    }
    summary.wall = started.elapsed();
    summary
}

/// Runs a scenario twice and compares the traces: a seed must replay exactly.
pub fn check_determinism(scenario: &Scenario, mutations: Mutations) -> Result<u64, String> {
    let options = RunOptions {
        mutations,
        ..RunOptions::default()
    };
    let first = run(scenario.clone(), options);
    let second = run(scenario.clone(), options);
    if (first.trace_hash, first.events, first.simulated_ms)
        != (second.trace_hash, second.events, second.simulated_ms)
    {
        return Err(format!(
            "seed {} is not deterministic: trace {:016x} after {} events, then {:016x} after {} events",
            scenario.seed, first.trace_hash, first.events, second.trace_hash, second.events
        ));
    }
    Ok(first.trace_hash)
}

/// Smaller scenarios to try in place of `overrides`, smallest change first.
fn candidates(scenario: &Scenario) -> Vec<Overrides> {
    let base = scenario.overrides.clone();
    let mut out = Vec::new();
    if scenario.agents > 0 {
        out.push(Overrides {
            agents: Some(0),
            ..base.clone()
        });
        if scenario.agents > 1 {
            out.push(Overrides {
                agents: Some(scenario.agents / 2),
                ..base.clone()
            });
        }
    }
    for (count, set) in [
        (scenario.deployers, 0),
        (scenario.watchers, 1),
        (scenario.pollers, 2),
    ] {
        if count > 0 {
            let mut smaller = base.clone();
            match set {
                0 => smaller.deployers = Some(0),
                1 => smaller.watchers = Some(0),
                _ => smaller.pollers = Some(0),
            }
            out.push(smaller);
        }
    }
    if scenario.controllers > 1 {
        out.push(Overrides {
            controllers: Some(1),
            ..base.clone()
        });
        out.push(Overrides {
            controllers: Some(scenario.controllers - 1),
            ..base.clone()
        });
    }
    for kind in scenario.faults.kinds() {
        if kind == FaultKind::ClockSkew && scenario.faults.kinds().len() > 1 {
            // Skew changes every host's clock: try it last.
            continue;
        }
        let mut without = base.clone();
        without.without.push(kind);
        out.push(without);
    }
    if scenario.faults.clock_skew {
        let mut without = base.clone();
        without.without.push(FaultKind::ClockSkew);
        out.push(without);
    }
    if scenario.safety_ms > 10_000 {
        out.push(Overrides {
            safety_ms: Some(scenario.safety_ms / 2),
            ..base
        });
    }
    out
}

/// Shrinks a failing scenario: keeps any smaller scenario that fails the same way
/// (same kind, same checker), until no candidate does or the run budget is spent.
pub fn shrink(
    scenario: &Scenario,
    failure: &Failure,
    caps: Caps,
    mutations: Mutations,
) -> (Scenario, Report) {
    let options = RunOptions {
        mutations,
        record_trace: true,
        ..RunOptions::default()
    };
    let same = |report: &Report| {
        report
            .failure
            .as_ref()
            .is_some_and(|found| found.kind == failure.kind && found.checker == failure.checker)
    };
    let mut best = scenario.clone();
    let mut best_report = run(best.clone(), options);
    let mut runs = 1;
    'progress: while runs < SHRINK_RUNS_MAX {
        for overrides in candidates(&best) {
            if runs >= SHRINK_RUNS_MAX {
                break 'progress;
            }
            let candidate = Scenario::with_overrides(best.seed, caps, &overrides);
            runs += 1;
            let report = run(candidate.clone(), options);
            if same(&report) {
                best = candidate;
                best_report = report;
                continue 'progress;
            }
        }
        break;
    }
    (best, best_report)
}

/// The caps flag that reproduces a scenario chosen within `caps`.
pub fn caps_flag(caps: Caps) -> &'static str {
    if caps == Caps::FULL { " --full" } else { "" }
}

/// The failure report: kind, invariant, what broke, the shrunk scenario, the end of its
/// trace, and the exact command that reproduces it.
pub fn failure_report(
    original: &Scenario,
    failure: &Failure,
    shrunk: &Scenario,
    shrunk_report: &Report,
    caps: Caps,
    mutations: Mutations,
) -> String {
    let extra = format!("{}{}", caps_flag(caps), mutation_flag(mutations));
    let mut text = String::new();
    let _ = writeln!(
        text,
        "FAILED seed {}: {:?} failure, checker `{}` ({})",
        original.seed, failure.kind, failure.checker, failure.invariant
    );
    let _ = writeln!(
        text,
        "  at {}: {}",
        crate::format_ms(failure.at_ms),
        failure.message
    );
    let _ = writeln!(text, "  reproduce: {}", original.reproduce_command(&extra));
    match &shrunk_report.failure {
        Some(found) if shrunk != original => {
            let _ = writeln!(text, "shrunk to:\n{shrunk}");
            let _ = writeln!(
                text,
                "  fails at {}: {}",
                crate::format_ms(found.at_ms),
                found.message
            );
            let _ = writeln!(text, "  reproduce: {}", shrunk.reproduce_command(&extra));
        }
        _ => {
            let _ = writeln!(text, "(no smaller scenario fails the same way)");
        }
    }
    if let Some(lines) = &shrunk_report.trace {
        let skip = lines.len().saturating_sub(REPORT_LINES_MAX);
        let _ = writeln!(
            text,
            "trace ({} lines; the last {}; --trace prints all):",
            lines.len(),
            lines.len() - skip
        );
        for line in &lines[skip..] {
            let _ = writeln!(text, "  {line}");
        }
    }
    text
}

/// A defect of the system (not of the simulator) that the simulator found and that is not
/// fixed yet: failures matching it are reported as known, not as new.
#[derive(Clone, Copy, Debug)]
pub struct KnownIssue {
    pub name: &'static str,
    /// What goes wrong, and where.
    pub summary: &'static str,
    /// A seed (with the CI caps) that shows it...
    pub example_seed: u64,
    /// ...with these fault kinds switched off.
    pub example_without: &'static [FaultKind],
    matches: fn(&Failure) -> bool,
}

impl KnownIssue {
    pub fn matches(&self, failure: &Failure) -> bool {
        (self.matches)(failure)
    }
}

/// What the simulator has found and is not fixed yet. Remove an entry when its fix lands:
/// the `known_issues_still_reproduce` test (ignored) says which still do.
///
/// Empty: the three defects it found (`stale-upgrade-record`, seed 34;
/// `machine-agent-follows-agent-version-down`, seed 202; `fall-back-onto-migrated-store`,
/// seed 574 `--without lease-expiry`) are fixed in the core, with regression scenarios in
/// `core/tests/scenarios.rs`; so are three more the sweep showed while they were being fixed
/// (a held controller retried without its model completing the record without the others; a
/// retry with no step left creating a record `V -> V`; a straggler unable to finish an
/// upgrade the others had finished before an abort).
pub const KNOWN_ISSUES: &[KnownIssue] = &[];

impl KnownIssue {
    /// The scenario that shows this issue.
    pub fn example(&self) -> Scenario {
        let overrides = Overrides {
            without: self.example_without.to_vec(),
            ..Overrides::default()
        };
        Scenario::with_overrides(self.example_seed, Caps::CI, &overrides)
    }
}

/// The known issue a failure matches, if any.
pub fn known_issue(failure: &Failure) -> Option<&'static KnownIssue> {
    KNOWN_ISSUES.iter().find(|issue| issue.matches(failure))
}
