//! One seed → one whole scenario (swarm testing, after TigerBeetle's VOPR): how many
//! controllers, machine agents and clients, the upgrade policy, the catalogue and when a
//! newer patch is published, which faults are switched on and how often they strike.
//!
//! A scenario is chosen from its seed alone, then [`Overrides`] may narrow it (the shrinker
//! does, and the printed reproduce command carries them), so a failing run is always
//! reproduced by its seed plus the overrides printed with it.

use std::fmt;

use lockstep_core::Version;
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::rollout::RolloutPolicy;

use crate::rng::Rng;

pub const V41: Version = Version::new(2, 9, 41);
pub const V42: Version = Version::new(2, 9, 42);
pub const V43: Version = Version::new(2, 9, 43);
pub const V44: Version = Version::new(2, 9, 44);

/// The largest scenario a seed may choose.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Caps {
    pub controllers_max: u8,
    pub agents_max: u32,
    pub clients_max: u32,
}

impl Caps {
    /// What CI's sweep runs: at most 50 agents and 10 clients a seed.
    pub const CI: Caps = Caps {
        controllers_max: 5,
        agents_max: 50,
        clients_max: 10,
    };
    /// Issue 9's full range, run by hand.
    pub const FULL: Caps = Caps {
        controllers_max: 5,
        agents_max: 1000,
        clients_max: 50,
    };
}

/// How the world starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Start {
    /// Every agent was bootstrapped on the old version long ago and is Ready; the
    /// operator (or a pin in the model) asks for an upgrade.
    Upgrade,
    /// Fresh controllers boot for the first time (their snapshot is not written yet); with
    /// `--auto-upgrade` they upgrade to the newest patch before bootstrap returns.
    Bootstrap,
}

/// One fault kind, by its command-line name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum FaultKind {
    /// Processes crash at any moment and restart, losing what was not durable.
    Crash,
    /// A process crashes right before or right after a snapshot write becomes durable.
    PersistCrash,
    /// Messages between any two parties are lost.
    Drop,
    /// Messages arrive twice.
    Duplicate,
    /// Some messages are held back for long (which reorders them).
    Delay,
    /// A party is cut off from another, or from everyone, for a while.
    Partition,
    /// The agent-binary stream stops answering.
    StreamStall,
    /// The stream serves bytes that fail verification.
    StreamCorrupt,
    /// The stream serves older metadata than it served before.
    StreamRollback,
    /// Hosts' clocks are offset and run at different rates.
    ClockSkew,
    /// The operator aborts the upgrade.
    Abort,
    /// The operator asks for the upgrade again.
    Rerequest,
    /// The coordinator lease expires soon after it was granted or kept alive (lost
    /// keep-alives, a paused holder).
    LeaseExpiry,
    /// A controller's report of the binary it runs (`Upgrader.SetTools`, once its own API
    /// server admits its agent) lands late: until then the store holds what it reported
    /// before, while it already runs, and is configured with, the new binary.
    ReportLag,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::Crash,
        FaultKind::PersistCrash,
        FaultKind::Drop,
        FaultKind::Duplicate,
        FaultKind::Delay,
        FaultKind::Partition,
        FaultKind::StreamStall,
        FaultKind::StreamCorrupt,
        FaultKind::StreamRollback,
        FaultKind::ClockSkew,
        FaultKind::Abort,
        FaultKind::Rerequest,
        FaultKind::LeaseExpiry,
        FaultKind::ReportLag,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::PersistCrash => "persist-crash",
            FaultKind::Drop => "drop",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Delay => "delay",
            FaultKind::Partition => "partition",
            FaultKind::StreamStall => "stream-stall",
            FaultKind::StreamCorrupt => "stream-corrupt",
            FaultKind::StreamRollback => "stream-rollback",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::Abort => "abort",
            FaultKind::Rerequest => "rerequest",
            FaultKind::LeaseExpiry => "lease-expiry",
            FaultKind::ReportLag => "report-lag",
        }
    }

    pub fn parse(text: &str) -> Option<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
    }
}

/// Fault rates: 0 (or `None`) is off. Rates are per million draws.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Faults {
    /// Mean virtual time between process crashes.
    pub crash_interval_ms: Option<u64>,
    pub persist_crash_per_million: u32,
    pub drop_per_million: u32,
    pub duplicate_per_million: u32,
    pub delay_per_million: u32,
    /// Mean virtual time between partitions.
    pub partition_interval_ms: Option<u64>,
    pub stream_stall_per_million: u32,
    pub stream_corrupt_per_million: u32,
    pub stream_rollback_per_million: u32,
    pub clock_skew: bool,
    /// When the operator aborts the upgrade.
    pub abort_at_ms: Option<u64>,
    /// When the operator asks for the upgrade again.
    pub rerequest_at_ms: Option<u64>,
    /// Chance that a lease just granted or kept alive expires within 50ms.
    pub lease_expiry_per_million: u32,
    /// A controller's binary report lands up to this long after it was made.
    pub report_lag_max_ms: Option<u64>,
}

impl Faults {
    fn enabled(&self, kind: FaultKind) -> bool {
        match kind {
            FaultKind::Crash => self.crash_interval_ms.is_some(),
            FaultKind::PersistCrash => self.persist_crash_per_million > 0,
            FaultKind::Drop => self.drop_per_million > 0,
            FaultKind::Duplicate => self.duplicate_per_million > 0,
            FaultKind::Delay => self.delay_per_million > 0,
            FaultKind::Partition => self.partition_interval_ms.is_some(),
            FaultKind::StreamStall => self.stream_stall_per_million > 0,
            FaultKind::StreamCorrupt => self.stream_corrupt_per_million > 0,
            FaultKind::StreamRollback => self.stream_rollback_per_million > 0,
            FaultKind::ClockSkew => self.clock_skew,
            FaultKind::Abort => self.abort_at_ms.is_some(),
            FaultKind::Rerequest => self.rerequest_at_ms.is_some(),
            FaultKind::LeaseExpiry => self.lease_expiry_per_million > 0,
            FaultKind::ReportLag => self.report_lag_max_ms.is_some(),
        }
    }

    /// Turns fault `kind` off.
    pub fn disable(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::Crash => self.crash_interval_ms = None,
            FaultKind::PersistCrash => self.persist_crash_per_million = 0,
            FaultKind::Drop => self.drop_per_million = 0,
            FaultKind::Duplicate => self.duplicate_per_million = 0,
            FaultKind::Delay => self.delay_per_million = 0,
            FaultKind::Partition => self.partition_interval_ms = None,
            FaultKind::StreamStall => self.stream_stall_per_million = 0,
            FaultKind::StreamCorrupt => self.stream_corrupt_per_million = 0,
            FaultKind::StreamRollback => self.stream_rollback_per_million = 0,
            FaultKind::ClockSkew => self.clock_skew = false,
            FaultKind::Abort => self.abort_at_ms = None,
            FaultKind::Rerequest => self.rerequest_at_ms = None,
            FaultKind::LeaseExpiry => self.lease_expiry_per_million = 0,
            FaultKind::ReportLag => self.report_lag_max_ms = None,
        }
    }

    /// The fault kinds switched on.
    pub fn kinds(&self) -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|&kind| self.enabled(kind))
            .collect()
    }
}

/// The operator's `upgrade-controller`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OperatorRequest {
    pub at_ms: u64,
    /// Which controller's API receives it.
    pub controller: u8,
    /// `--agent-version`, or `None` for the newest patch.
    pub version: Option<Version>,
}

/// Narrowing of a seed's scenario (shrinking, reproduce commands, CI caps).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Overrides {
    pub controllers: Option<u8>,
    pub agents: Option<u32>,
    pub deployers: Option<u32>,
    pub watchers: Option<u32>,
    pub pollers: Option<u32>,
    pub without: Vec<FaultKind>,
    pub safety_ms: Option<u64>,
}

impl Overrides {
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }

    /// The command-line flags that apply these overrides.
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        if let Some(value) = self.controllers {
            flags.push_str(&format!(" --controllers {value}"));
        }
        if let Some(value) = self.agents {
            flags.push_str(&format!(" --agents {value}"));
        }
        if let Some(value) = self.deployers {
            flags.push_str(&format!(" --deployers {value}"));
        }
        if let Some(value) = self.watchers {
            flags.push_str(&format!(" --watchers {value}"));
        }
        if let Some(value) = self.pollers {
            flags.push_str(&format!(" --pollers {value}"));
        }
        if !self.without.is_empty() {
            let names: Vec<&str> = self.without.iter().map(|kind| kind.as_str()).collect();
            flags.push_str(&format!(" --without {}", names.join(",")));
        }
        if let Some(value) = self.safety_ms {
            flags.push_str(&format!(" --safety-ms {value}"));
        }
        flags
    }
}

/// Everything a seed chose.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub start: Start,
    pub controllers: u8,
    pub agents: u32,
    /// Clients deploying applications from the moment bootstrap begins.
    pub deployers: u32,
    /// Clients watching every change (`AllWatcher.Next`).
    pub watchers: u32,
    /// Clients polling `Client.FullStatus`.
    pub pollers: u32,
    /// Operations each deployer makes.
    pub operations_per_deployer: u32,
    pub policy: UpgradePolicy,
    /// What every agent runs (and, for Upgrade, was upgraded to) at the start.
    pub from: Version,
    /// The model's `agent-version` at the start (a pin sets it to the pinned version).
    pub agent_version: Version,
    /// Versions the stream lists from the start.
    pub catalogue: Vec<Version>,
    /// A newer patch and when the stream starts listing it.
    pub newer_patch: Option<(Version, u64)>,
    pub request: Option<OperatorRequest>,
    /// Which of the registry's steps exist (database and host steps for 2.9.43 and 2.9.44).
    pub steps: [bool; 4],
    /// The periodic catalogue check's interval.
    pub catalogue_check_ms: u64,
    pub faults: Faults,
    /// How long faults are injected.
    pub safety_ms: u64,
    /// How long after healing every agent must be Ready and every client finished.
    pub liveness_ms: u64,
    pub overrides: Overrides,
    /// A fleet upgrade (`Scenario::fleet`): downloads take time on the link model, agents
    /// report their status, and the coordinator runs a staged rollout. `None` for the
    /// scenarios a seed chooses, whose downloads complete at once.
    pub fleet: Option<Fleet>,
}

/// Bytes per second of `megabits` per second.
pub const fn mbit(megabits: u64) -> u64 {
    megabits * 1_000_000 / 8
}

/// The links of a fleet upgrade, and its rollout.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fleet {
    /// The agent binary's size (the catalogue's `size_bytes`).
    pub binary_bytes: u64,
    /// Each controller's egress, shared fairly among the agent downloads it serves.
    pub egress_bytes_per_second: u64,
    /// Each controller's link to the agent-binary stream (its own fetch, once).
    pub upstream_bytes_per_second: u64,
    /// A usual agent's link (each agent draws its own around it).
    pub agent_bytes_per_second: u64,
    /// Agents on a slow link, per million: their link is 1–10% of the usual one.
    pub slow_agents_per_million: u32,
    /// Each download's speed varies by up to this much (per mille) around the agent's own.
    pub jitter_per_mille: u64,
    /// The model's `max-agent-downloads` (`None`: unset, the core's default).
    pub max_agent_downloads: Option<u64>,
    /// The model's `rollout-*` settings.
    pub rollout: RolloutPolicy,
    /// The fleet went through an earlier upgrade: each agent's status says how fast the
    /// download of the binary it runs was (its link, with jitter), so the rollout admits
    /// slow links early (`rollout::admission_order`). `false`: a fleet's first rollout,
    /// which knows no rate when it starts: each agent probes its link after its start
    /// spread (`upgrader::LINK_PROBE_BYTES`), as the real machine agent does, and the
    /// rollout uses the rates as they are reported.
    pub rates_known: bool,
}

impl Default for Fleet {
    /// A data centre: 60 MB binaries, controllers on 10 Gbit/s, agents on 1 Gbit/s (5% of
    /// them on 10–100 Mbit/s), a 1 Gbit/s stream; 5 canaries, then at most 1,000 agents at
    /// once, halted past 50 failures; each agent's last download rate known.
    fn default() -> Fleet {
        Fleet {
            binary_bytes: 60_000_000,
            egress_bytes_per_second: mbit(10_000),
            upstream_bytes_per_second: mbit(1_000),
            agent_bytes_per_second: mbit(1_000),
            slow_agents_per_million: 50_000,
            jitter_per_mille: 300,
            max_agent_downloads: None,
            rollout: RolloutPolicy {
                canaries: 5,
                max_at_once: 1_000,
                failures_tolerated: 50,
                ..RolloutPolicy::default()
            },
            rates_known: true,
        }
    }
}

impl Scenario {
    /// The scenario of `seed` within `caps`.
    pub fn generate(seed: u64, caps: Caps) -> Scenario {
        let mut rng = Rng::new(seed, 0x5CE7_A210);
        let start = if rng.range(0, 3) == 0 {
            Start::Bootstrap
        } else {
            Start::Upgrade
        };
        let controllers = rng.range(1, u64::from(caps.controllers_max)) as u8;
        // Swarm testing: many seeds are small, a few reach the cap.
        let agents = match rng.range(0, 3) {
            0 => 0,
            1 => rng.range(1, 5.min(u64::from(caps.agents_max))),
            _ => rng.range(0, u64::from(caps.agents_max)),
        } as u32;
        let clients = rng.range(0, u64::from(caps.clients_max)) as u32;
        let deployers = rng.range(0, u64::from(clients)) as u32;
        let watchers = rng.range(0, u64::from(clients - deployers)) as u32;
        let pollers = clients - deployers - watchers;
        let operations_per_deployer = rng.range(1, 5) as u32;

        let mut catalogue = vec![V42];
        if rng.range(0, 9) > 0 {
            catalogue.push(V43);
        }
        if rng.coin() {
            catalogue.insert(0, V41);
        }
        let newer_patch = rng.coin().then(|| (V44, rng.range(0, 20 * 60 * 1000)));

        let (policy, agent_version, request) = match start {
            Start::Bootstrap => {
                let policy = if rng.range(0, 3) > 0 {
                    UpgradePolicy::AutoPatch
                } else {
                    UpgradePolicy::Off
                };
                (policy, V42, None)
            }
            Start::Upgrade => match rng.range(0, 5) {
                0 => (UpgradePolicy::Pinned(V43), V43, None),
                1 => {
                    let request = OperatorRequest {
                        at_ms: rng.range(0, 60_000),
                        controller: rng.range(0, u64::from(controllers) - 1) as u8,
                        version: None,
                    };
                    (UpgradePolicy::Off, V42, Some(request))
                }
                _ => {
                    let request = OperatorRequest {
                        at_ms: rng.range(0, 60_000),
                        controller: rng.range(0, u64::from(controllers) - 1) as u8,
                        version: Some(V43),
                    };
                    (UpgradePolicy::Off, V42, Some(request))
                }
            },
        };
        let steps = [
            rng.range(0, 3) > 0,
            rng.range(0, 3) > 0,
            rng.coin(),
            rng.coin(),
        ];
        let catalogue_check_ms = if rng.coin() {
            6 * 60 * 60 * 1000
        } else {
            rng.range(60_000, 10 * 60 * 1000)
        };
        let safety_ms = rng.range(30_000, 15 * 60 * 1000);

        let mut faults = Faults::default();
        let on = |rng: &mut Rng| rng.range(0, 2) == 0;
        if on(&mut rng) {
            faults.crash_interval_ms = Some(rng.range(5_000, 120_000));
        }
        if on(&mut rng) {
            faults.persist_crash_per_million = rng.range(1_000, 50_000) as u32;
        }
        if on(&mut rng) {
            faults.drop_per_million = rng.range(1_000, 100_000) as u32;
        }
        if on(&mut rng) {
            faults.duplicate_per_million = rng.range(1_000, 50_000) as u32;
        }
        if on(&mut rng) {
            faults.delay_per_million = rng.range(1_000, 200_000) as u32;
        }
        if on(&mut rng) {
            faults.partition_interval_ms = Some(rng.range(10_000, 180_000));
        }
        if on(&mut rng) {
            faults.stream_stall_per_million = rng.range(10_000, 300_000) as u32;
        }
        if on(&mut rng) {
            faults.stream_corrupt_per_million = rng.range(10_000, 300_000) as u32;
        }
        if on(&mut rng) {
            faults.stream_rollback_per_million = rng.range(10_000, 500_000) as u32;
        }
        faults.clock_skew = on(&mut rng);
        if rng.range(0, 4) == 0 {
            faults.abort_at_ms = Some(rng.range(0, safety_ms));
        }
        if rng.range(0, 3) == 0 {
            faults.rerequest_at_ms = Some(rng.range(0, safety_ms));
        }
        if on(&mut rng) {
            faults.lease_expiry_per_million = rng.range(50_000, 500_000) as u32;
        }
        if on(&mut rng) {
            faults.report_lag_max_ms = Some(rng.range(1_000, 10 * 60 * 1000));
        }

        Scenario {
            seed,
            start,
            controllers,
            agents,
            deployers,
            watchers,
            pollers,
            operations_per_deployer,
            policy,
            from: V42,
            agent_version,
            catalogue,
            newer_patch,
            request,
            steps,
            catalogue_check_ms,
            faults,
            safety_ms,
            liveness_ms: 3 * 60 * 60 * 1000,
            overrides: Overrides::default(),
            fleet: None,
        }
    }

    /// A fleet upgrade (issue 21): 3 controllers and `agents` machine agents on 2.9.42, the
    /// operator asks for 2.9.43 (a database step and a host step on every machine) a
    /// second in; faults for the whole run: processes crash (about one every 2 s of virtual
    /// time somewhere in the fleet) and some right around a snapshot write, messages are
    /// lost (0.5%), held back (1%) or duplicated (0.2%); links are slow and jittery
    /// (`fleet`), and controllers answer "busy" past their download bound.
    pub fn fleet(seed: u64, agents: u32, fleet: Fleet) -> Scenario {
        let faults = Faults {
            crash_interval_ms: Some(2_000),
            persist_crash_per_million: 1_000,
            drop_per_million: 5_000,
            duplicate_per_million: 2_000,
            delay_per_million: 10_000,
            ..Faults::default()
        };
        Scenario {
            seed,
            start: Start::Upgrade,
            controllers: 3,
            agents,
            deployers: 0,
            watchers: 0,
            pollers: 0,
            operations_per_deployer: 0,
            policy: UpgradePolicy::Off,
            from: V42,
            agent_version: V42,
            catalogue: vec![V42, V43],
            newer_patch: None,
            request: Some(OperatorRequest {
                at_ms: 1_000,
                controller: 0,
                version: Some(V43),
            }),
            steps: [true, true, false, false],
            catalogue_check_ms: 6 * 60 * 60 * 1000,
            faults,
            safety_ms: 4 * 60 * 60 * 1000,
            liveness_ms: 60 * 60 * 1000,
            overrides: Overrides::default(),
            fleet: Some(fleet),
        }
    }

    /// The scenario of `seed` within `caps`, narrowed by `overrides`.
    pub fn with_overrides(seed: u64, caps: Caps, overrides: &Overrides) -> Scenario {
        let mut scenario = Scenario::generate(seed, caps);
        scenario.apply(overrides);
        scenario
    }

    fn apply(&mut self, overrides: &Overrides) {
        if let Some(value) = overrides.controllers {
            self.controllers = value.clamp(1, 5);
            if let Some(request) = &mut self.request {
                request.controller = request.controller.min(self.controllers - 1);
            }
        }
        if let Some(value) = overrides.agents {
            self.agents = value;
        }
        if let Some(value) = overrides.deployers {
            self.deployers = value;
        }
        if let Some(value) = overrides.watchers {
            self.watchers = value;
        }
        if let Some(value) = overrides.pollers {
            self.pollers = value;
        }
        for &kind in &overrides.without {
            self.faults.disable(kind);
        }
        if let Some(value) = overrides.safety_ms {
            self.safety_ms = value;
            if self.faults.abort_at_ms.is_some_and(|at| at > value) {
                self.faults.abort_at_ms = Some(value);
            }
            if self.faults.rerequest_at_ms.is_some_and(|at| at > value) {
                self.faults.rerequest_at_ms = Some(value);
            }
        }
        self.overrides = overrides.clone();
    }

    /// The exact command that reruns this scenario.
    pub fn reproduce_command(&self, extra: &str) -> String {
        format!(
            "cargo run -p lockstep-sim --release -- --seed {}{}{extra}",
            self.seed,
            self.overrides.flags()
        )
    }

    pub fn clients(&self) -> u32 {
        self.deployers + self.watchers + self.pollers
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {}", self.seed)?;
        writeln!(
            f,
            "  start {:?}, controllers {}, machine agents {}, clients {} (deployers {} x {} operations, watchers {}, pollers {})",
            self.start,
            self.controllers,
            self.agents,
            self.clients(),
            self.deployers,
            self.operations_per_deployer,
            self.watchers,
            self.pollers
        )?;
        let versions: Vec<String> = self.catalogue.iter().map(ToString::to_string).collect();
        writeln!(
            f,
            "  from {}, agent-version {}, policy {:?}, catalogue [{}], newer patch {}",
            self.from,
            self.agent_version,
            self.policy,
            versions.join(", "),
            match self.newer_patch {
                Some((version, at)) => format!("{version} at {}", crate::format_ms(at)),
                None => "none".to_owned(),
            }
        )?;
        writeln!(
            f,
            "  operator request {}, steps {:?}, catalogue check every {}",
            match self.request {
                Some(request) => format!(
                    "{} on controller-{} at {}",
                    request
                        .version
                        .map_or("newest patch".to_owned(), |version| version.to_string()),
                    request.controller,
                    crate::format_ms(request.at_ms)
                ),
                None => "none".to_owned(),
            },
            self.steps,
            crate::format_ms(self.catalogue_check_ms)
        )?;
        writeln!(
            f,
            "  safety {} then liveness within {}",
            crate::format_ms(self.safety_ms),
            crate::format_ms(self.liveness_ms)
        )?;
        write!(f, "  faults {:?}", self.faults)?;
        if let Some(fleet) = &self.fleet {
            write!(
                f,
                "\n  fleet: binary {} MB, controller egress {} Mbit/s, upstream {} Mbit/s, agent links {} Mbit/s ({} per million slow, jitter {} per mille), max-agent-downloads {}, rollout {:?}, {}",
                fleet.binary_bytes / 1_000_000,
                fleet.egress_bytes_per_second * 8 / 1_000_000,
                fleet.upstream_bytes_per_second * 8 / 1_000_000,
                fleet.agent_bytes_per_second * 8 / 1_000_000,
                fleet.slow_agents_per_million,
                fleet.jitter_per_mille,
                fleet
                    .max_agent_downloads
                    .map_or("unset".to_owned(), |max| max.to_string()),
                fleet.rollout,
                if fleet.rates_known {
                    "each agent's last download rate known (an earlier upgrade's)"
                } else {
                    "no download rate known (a first rollout: the agents probe their links)"
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_chooses_the_same_scenario_every_time_within_its_caps() {
        for seed in 0..500 {
            let scenario = Scenario::generate(seed, Caps::CI);
            assert_eq!(scenario, Scenario::generate(seed, Caps::CI));
            assert!((1..=5).contains(&scenario.controllers));
            assert!(scenario.agents <= 50);
            assert!(scenario.clients() <= 10);
        }
    }

    #[test]
    fn overrides_narrow_and_print_as_flags() {
        let overrides = Overrides {
            agents: Some(2),
            without: vec![FaultKind::Drop, FaultKind::Crash],
            ..Overrides::default()
        };
        let scenario = Scenario::with_overrides(7, Caps::CI, &overrides);
        assert_eq!(scenario.agents, 2);
        assert_eq!(scenario.faults.drop_per_million, 0);
        assert_eq!(scenario.faults.crash_interval_ms, None);
        assert_eq!(
            scenario.reproduce_command(""),
            "cargo run -p lockstep-sim --release -- --seed 7 --agents 2 --without drop,crash"
        );
    }
}
