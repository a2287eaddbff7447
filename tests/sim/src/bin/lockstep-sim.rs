//! `lockstep-sim`: run seeds of the deterministic simulator.
//!
//! ```text
//! cargo run -p lockstep-sim --release -- --seeds 0..2000
//! cargo run -p lockstep-sim --release -- --seed 1234 --agents 0 --without drop --trace
//! cargo run -p lockstep-sim --release -- --seed 1234 --timeline out.svg
//! cargo run -p lockstep-sim --release -- --fleet --agents 10000
//! ```
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on its standard output and error"
)]

use std::process::ExitCode;

use lockstep_core::lifecycle::Mutations;
use lockstep_sim::fleet::run_fleet_scenario;
use lockstep_sim::scenario::{Caps, FaultKind, Fleet, Overrides, Scenario, mbit};
use lockstep_sim::sim::{RunOptions, run};
use lockstep_sim::sweep::{self, caps_flag, mutation_flag};

const USAGE: &str =
    "usage: lockstep-sim (--seeds A..B | --seed S) [--full] [--controllers N] [--agents N]
       lockstep-sim --fleet [--seed S] [--agents N] [--binary-mb N] [--egress-mbps N]
       [--upstream-mbps N] [--agent-mbps N] [--slow-per-million N] [--max-agent-downloads N]
       [--canaries N] [--max-at-once N] [--failures-tolerated N] [--rates-unknown]
       [--deployers N] [--watchers N] [--pollers N] [--without fault,fault] [--safety-ms MS]
       [--mutation NAME] [--trace] [--timeline out.svg] [--no-shrink] [--no-determinism-check]
faults: crash persist-crash drop duplicate delay partition stream-stall stream-corrupt
        stream-rollback clock-skew abort rerequest lease-expiry report-lag
mutations: gate-before-version-check checkpoint-before-effects unfenced-coordinator
           upgraded-to-with-step-missing";

#[derive(Debug, Default)]
struct Arguments {
    seeds: Option<std::ops::Range<u64>>,
    full: bool,
    overrides: Overrides,
    mutations: Mutations,
    trace: bool,
    timeline: Option<String>,
    shrink: bool,
    determinism: bool,
    /// `--fleet`: a fleet upgrade with these links and rollout.
    fleet: Option<Fleet>,
}

fn parse() -> Result<Arguments, String> {
    let mut arguments = Arguments {
        shrink: true,
        determinism: true,
        ..Arguments::default()
    };
    let mut words = std::env::args().skip(1);
    let number = |word: Option<String>, flag: &str| -> Result<u64, String> {
        word.ok_or(format!("{flag} needs a value"))?
            .parse()
            .map_err(|error| format!("{flag}: {error}"))
    };
    while let Some(word) = words.next() {
        match word.as_str() {
            "--seeds" => {
                let range = words.next().ok_or("--seeds needs A..B")?;
                let (from, to) = range.split_once("..").ok_or("--seeds needs A..B")?;
                let from: u64 = from.parse().map_err(|error| format!("--seeds: {error}"))?;
                let to: u64 = to.parse().map_err(|error| format!("--seeds: {error}"))?;
                arguments.seeds = Some(from..to);
            }
            "--seed" => {
                let seed = number(words.next(), "--seed")?;
                arguments.seeds = Some(seed..seed + 1);
            }
            "--full" => arguments.full = true,
            "--controllers" => {
                arguments.overrides.controllers = Some(number(words.next(), &word)? as u8)
            }
            "--agents" => arguments.overrides.agents = Some(number(words.next(), &word)? as u32),
            "--deployers" => {
                arguments.overrides.deployers = Some(number(words.next(), &word)? as u32)
            }
            "--watchers" => {
                arguments.overrides.watchers = Some(number(words.next(), &word)? as u32)
            }
            "--pollers" => arguments.overrides.pollers = Some(number(words.next(), &word)? as u32),
            "--safety-ms" => arguments.overrides.safety_ms = Some(number(words.next(), &word)?),
            "--without" => {
                let list = words.next().ok_or("--without needs fault names")?;
                for name in list.split(',') {
                    let kind =
                        FaultKind::parse(name).ok_or(format!("--without: unknown fault {name}"))?;
                    arguments.overrides.without.push(kind);
                }
            }
            "--mutation" => {
                let name = words.next().ok_or("--mutation needs a name")?;
                arguments.mutations =
                    sweep::mutation(&name).ok_or(format!("unknown mutation {name}"))?;
            }
            "--trace" => arguments.trace = true,
            "--timeline" => {
                arguments.timeline = Some(words.next().ok_or("--timeline needs a file")?)
            }
            "--fleet" => arguments.fleet = Some(Fleet::default()),
            "--rates-unknown" => {
                arguments
                    .fleet
                    .as_mut()
                    .ok_or("--rates-unknown needs --fleet first")?
                    .rates_known = false;
            }
            "--binary-mb"
            | "--egress-mbps"
            | "--upstream-mbps"
            | "--agent-mbps"
            | "--slow-per-million"
            | "--max-agent-downloads"
            | "--canaries"
            | "--max-at-once"
            | "--failures-tolerated" => {
                let value = number(words.next(), &word)?;
                let fleet = arguments
                    .fleet
                    .as_mut()
                    .ok_or(format!("{word} needs --fleet first"))?;
                match word.as_str() {
                    "--binary-mb" => fleet.binary_bytes = value * 1_000_000,
                    "--egress-mbps" => fleet.egress_bytes_per_second = mbit(value),
                    "--upstream-mbps" => fleet.upstream_bytes_per_second = mbit(value),
                    "--agent-mbps" => fleet.agent_bytes_per_second = mbit(value),
                    "--slow-per-million" => fleet.slow_agents_per_million = value as u32,
                    "--max-agent-downloads" => fleet.max_agent_downloads = Some(value),
                    "--canaries" => fleet.rollout.canaries = value as u32,
                    "--max-at-once" => fleet.rollout.max_at_once = value as u32,
                    _ => fleet.rollout.failures_tolerated = value as u32,
                }
            }
            "--no-shrink" => arguments.shrink = false,
            "--no-determinism-check" => arguments.determinism = false,
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if arguments.seeds.is_none() && arguments.fleet.is_none() {
        return Err(USAGE.to_owned());
    }
    Ok(arguments)
}

fn main() -> ExitCode {
    let arguments = match parse() {
        Ok(arguments) => arguments,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Some(fleet) = arguments.fleet {
        return run_fleet_mode(&arguments, fleet);
    }
    let caps = if arguments.full { Caps::FULL } else { Caps::CI };
    let seeds = arguments.seeds.clone().expect("checked");
    let single = seeds.end - seeds.start == 1;
    // Panics are failures the simulator reports itself: keep the default hook quiet.
    std::panic::set_hook(Box::new(|_| {}));

    if single {
        let scenario = Scenario::with_overrides(seeds.start, caps, &arguments.overrides);
        println!("{scenario}");
        let options = RunOptions {
            mutations: arguments.mutations,
            record_trace: arguments.trace,
            record_timeline: arguments.timeline.is_some(),
            ..RunOptions::default()
        };
        let started = std::time::Instant::now();
        let report = run(scenario.clone(), options);
        let wall = started.elapsed();
        if let Some(lines) = &report.trace {
            for line in lines {
                println!("{line}");
            }
        }
        if let (Some(path), Some(timeline)) = (&arguments.timeline, &report.timeline) {
            if let Err(error) = std::fs::write(path, timeline.to_svg(report.simulated_ms)) {
                eprintln!("cannot write {path}: {error}");
                return ExitCode::FAILURE;
            }
            println!("timeline written to {path}");
        }
        println!(
            "seed {}: {} events, simulated {}, wall {:.3}s, trace {:016x}",
            report.seed,
            report.events,
            lockstep_sim::format_ms(report.simulated_ms),
            wall.as_secs_f64(),
            report.trace_hash
        );
        if arguments.determinism {
            match sweep::check_determinism(&scenario, arguments.mutations) {
                Ok(hash) => println!("determinism: the seed replays to trace {hash:016x}"),
                Err(message) => {
                    println!("determinism FAILED: {message}");
                    return ExitCode::FAILURE;
                }
            }
        }
        return match &report.failure {
            None => {
                println!("passed");
                ExitCode::SUCCESS
            }
            Some(failure) => {
                if let Some(issue) = sweep::known_issue(failure) {
                    println!("known issue {}: {}", issue.name, issue.summary);
                }
                let (shrunk, shrunk_report) = if arguments.shrink {
                    sweep::shrink(&scenario, failure, caps, arguments.mutations)
                } else {
                    (scenario.clone(), report.clone())
                };
                print!(
                    "{}",
                    sweep::failure_report(
                        &scenario,
                        failure,
                        &shrunk,
                        &shrunk_report,
                        caps,
                        arguments.mutations
                    )
                );
                ExitCode::FAILURE
            }
        };
    }

    println!(
        "lockstep-sim: seeds {}..{} (caps: {} controllers, {} agents, {} clients){}{}{}",
        seeds.start,
        seeds.end,
        caps.controllers_max,
        caps.agents_max,
        caps.clients_max,
        arguments.overrides.flags(),
        caps_flag(caps),
        mutation_flag(arguments.mutations)
    );
    let summary = sweep::sweep(
        seeds.clone(),
        caps,
        &arguments.overrides,
        arguments.mutations,
        |scenario, report| {
            if let Some(failure) = &report.failure {
                let known = sweep::known_issue(failure).map_or(String::new(), |issue| {
                    format!(" [known issue {}]", issue.name)
                });
                println!(
                    "seed {}: {:?} failure ({}){known}: {}",
                    scenario.seed, failure.kind, failure.checker, failure.message
                );
            }
        },
    );
    println!("{summary}");
    let new: Vec<&(Scenario, lockstep_sim::Failure)> = summary
        .failures
        .iter()
        .filter(|(_, failure)| sweep::known_issue(failure).is_none())
        .collect();
    println!(
        "{} new failures; {} of known issues (see `sweep::KNOWN_ISSUES`)",
        new.len(),
        summary.failures.len() - new.len()
    );
    let mut failed = !new.is_empty();
    if arguments.determinism && seeds.end > seeds.start {
        let scenario = Scenario::with_overrides(seeds.start, caps, &arguments.overrides);
        match sweep::check_determinism(&scenario, arguments.mutations) {
            Ok(hash) => println!(
                "determinism: seed {} replays to trace {hash:016x}",
                scenario.seed
            ),
            Err(message) => {
                println!("determinism FAILED: {message}");
                failed = true;
            }
        }
    }
    if let Some((scenario, failure)) = new.first().copied().or(summary.failures.first()) {
        let (shrunk, shrunk_report) = if arguments.shrink {
            sweep::shrink(scenario, failure, caps, arguments.mutations)
        } else {
            let options = RunOptions {
                mutations: arguments.mutations,
                record_trace: true,
                ..RunOptions::default()
            };
            (scenario.clone(), run(scenario.clone(), options))
        };
        print!(
            "{}",
            sweep::failure_report(
                scenario,
                failure,
                &shrunk,
                &shrunk_report,
                caps,
                arguments.mutations
            )
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--fleet`: one fleet upgrade, its figures, the ratio line last.
fn run_fleet_mode(arguments: &Arguments, fleet: Fleet) -> ExitCode {
    let seed = arguments.seeds.as_ref().map_or(0, |seeds| seeds.start);
    let agents = arguments.overrides.agents.unwrap_or(10_000);
    let options = RunOptions {
        record_timeline: arguments.timeline.is_some(),
        ..RunOptions::default()
    };
    let mut scenario = Scenario::fleet(seed, agents, fleet);
    for kind in &arguments.overrides.without {
        scenario.faults.disable(*kind);
    }
    let fleet_run = run_fleet_scenario(scenario, options);
    println!("{}", fleet_run.scenario);
    if let (Some(path), Some(timeline)) = (&arguments.timeline, &fleet_run.report.timeline) {
        if let Err(error) = std::fs::write(path, timeline.to_svg(fleet_run.report.simulated_ms)) {
            eprintln!("cannot write {path}: {error}");
            return ExitCode::FAILURE;
        }
        println!("timeline written to {path}");
    }
    println!("{}", fleet_run.summary());
    if fleet_run.report.failure.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
