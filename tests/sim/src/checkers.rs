//! The checkers: one object per invariant, each naming what it checks. The simulator feeds
//! every checker every [`Observation`] as it happens (safety, after every event) and the
//! [`End`] of a live run (the "exactly once" and "at least once" halves that only hold
//! once everything finished).
//!
//! Checkers read only what they are shown: they keep their own tallies rather than asking
//! the simulator, so a bug in the simulator's bookkeeping cannot hide a violation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use lockstep_core::gate::{self, Login};
use lockstep_core::lifecycle::{Revision, Snapshot, UpgradeInfo, UpgradeStatus};
use lockstep_core::policy::UpgradePolicy;
use lockstep_core::rollout::{AgentView, Health, Rollout, RolloutPolicy};
use lockstep_core::steps::{self, StepKey, StepRegistry};
use lockstep_core::{Binary, Phase, Roles, Version};

/// Something that happened, as the checkers see it.
#[derive(Clone, Debug)]
pub enum Observation<'a> {
    /// A process published a gate view; `process` is its phase after the input.
    GatePublished {
        host: usize,
        view: Phase,
        process: Phase,
    },
    /// The API server of a controller answered a call through the gate.
    GateDecision {
        host: usize,
        process: Phase,
        login: Login,
        facade: &'a str,
        method: &'a str,
        admitted: bool,
    },
    /// A database step's changes and checkpoint committed; `lease_current`: the writer
    /// held the live lease at the commit.
    DatabaseStepCommitted {
        host: usize,
        key: StepKey,
        lease_current: bool,
    },
    /// A host step ran on a host.
    HostStepRan { host: usize, key: StepKey },
    /// A snapshot became durable on a host's disk.
    SnapshotDurable { host: usize, snapshot: &'a Snapshot },
    /// A process started on a binary.
    Booted {
        host: usize,
        binary: &'a Binary,
        /// Versions the stream has listed so far.
        listed: &'a BTreeSet<Version>,
    },
    /// The store recorded the binary a host's agent reported running (`Upgrader.SetTools`).
    BinaryReported { host: usize, binary: &'a Binary },
    /// A process ended to restart into another binary.
    Restart {
        host: usize,
        from: &'a Binary,
        to: &'a Binary,
        durable: Option<&'a Snapshot>,
    },
    /// A process is Ready (observed after every input it handled).
    Ready {
        host: usize,
        running: Version,
        /// `upgradedToVersion` as the process holds it and as last persisted.
        upgraded_to: Version,
        durable_upgraded_to: Option<Version>,
        controller: bool,
    },
    /// The store's log recorded a write of the upgrade-info record (`archived`: removed as
    /// final).
    RecordWritten { record: UpgradeInfo, archived: bool },
    /// The store refused a write the core asked for as invalid.
    StoreRefused { what: String },
    /// The store applied a client operation's effects (not a replay).
    OperationApplied { operation: &'a str },
    /// A watcher delivered a change to its caller.
    WatcherDelivered { client: usize, revision: Revision },
    /// The store's log holds a new rollout record; `agents` is what every machine agent
    /// had reported to the store when it was written.
    RolloutWritten {
        record: &'a Rollout,
        agents: &'a [AgentView],
    },
}

/// A host at the end of a live run.
#[derive(Clone, Debug)]
pub struct EndHost {
    pub roles: Roles,
    pub controller: bool,
    pub origin: Version,
    pub running: Version,
    pub durable: Option<Snapshot>,
}

/// A watcher at the end of a live run.
#[derive(Clone, Debug)]
pub struct EndWatcher {
    pub client: usize,
    /// The revision of the whole-state snapshot it started from.
    pub baseline: Option<Revision>,
    /// Where it stands now.
    pub position: Option<Revision>,
}

/// Everything the end-of-run halves read.
#[derive(Clone, Debug)]
pub struct End<'a> {
    pub hosts: &'a [EndHost],
    /// The model's `agent-version`.
    pub agent_version: Version,
    /// Every revision in the store's event log, ascending.
    pub revisions: &'a [Revision],
    /// Each database step's effect writes and checkpoints found in the log.
    pub step_effects: &'a BTreeMap<StepKey, (u32, u32)>,
    /// Each client operation's effect writes found in the log.
    pub operation_effects: &'a BTreeMap<String, u32>,
    /// Operations whose callers were told they succeeded.
    pub answered_operations: &'a [String],
    pub watchers: &'a [EndWatcher],
}

/// One invariant's checker.
pub trait Checker: std::fmt::Debug {
    /// A short stable name (used in failure reports and tests).
    fn name(&self) -> &'static str;
    /// The invariant, in words (with its number in `spec/invariants.md` where it has one).
    fn invariant(&self) -> &'static str;
    /// Checks one observation; `Err` names the violation.
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String>;
    /// Checks the end of a live run.
    fn finish(&mut self, _end: &End<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// What checkers are built from.
#[derive(Clone, Debug)]
pub struct Setup {
    pub registry: Arc<StepRegistry>,
    pub policy: UpgradePolicy,
    /// The model's rollout policy.
    pub rollout: RolloutPolicy,
    /// What every agent ran at the start.
    pub from: Version,
    pub hosts: Vec<(Roles, bool)>,
}

/// Every checker, in report order.
pub fn all(setup: &Setup) -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(GateChecker),
        Box::new(GatePublicationChecker),
        Box::new(DatabaseStepChecker::new(setup)),
        Box::new(HostStepChecker::new(setup)),
        Box::new(UpgradedToChecker::new(setup)),
        Box::new(ReadyChecker::default()),
        Box::new(VersionPolicyChecker::new(setup)),
        Box::new(NoDowngradeChecker::new(setup)),
        Box::new(ControllersFirstChecker::new(setup)),
        Box::new(RecordChecker::default()),
        Box::new(OperationChecker::default()),
        Box::new(WatcherChecker::default()),
        Box::new(RolloutChecker::new(setup)),
    ]
}

// ------------------------------------------------------------------ I1

/// I1, as clients see it: the gate never admitted a write (a call outside the limited
/// allow-list, which holds reads and the abort of the upgrade) while the process was
/// in another phase than Ready.
#[derive(Debug)]
pub struct GateChecker;

impl Checker for GateChecker {
    fn name(&self) -> &'static str {
        "gate"
    }
    fn invariant(&self) -> &'static str {
        "I1: the gate never admitted a write outside Ready"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::GateDecision {
                host,
                process,
                login,
                facade,
                method,
                admitted: true,
            } if process != Phase::Ready && !gate::allowed_when_limited(facade, method) => Err(
                format!("host {host} admitted {facade}.{method} for {login} while in {process}"),
            ),
            _ => Ok(()),
        }
    }
}

/// I1, as published: no process published a Ready gate view (the full API) while in
/// another phase, whether or not a call arrived in time to be admitted by it.
#[derive(Debug)]
pub struct GatePublicationChecker;

impl Checker for GatePublicationChecker {
    fn name(&self) -> &'static str {
        "gate-publication"
    }
    fn invariant(&self) -> &'static str {
        "I1: no Ready gate view was published outside Ready"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::GatePublished {
                host,
                view: Phase::Ready,
                process,
            } if process != Phase::Ready => Err(format!(
                "host {host} published a Ready gate (full API) while in {process}"
            )),
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ I2, I3

/// I2 and I3: each database step committed at most once (exactly once by the end of an
/// upgrade that reached its version), and only under the current coordinator lease.
#[derive(Debug)]
pub struct DatabaseStepChecker {
    registry: Arc<StepRegistry>,
    from: Version,
    commits: BTreeMap<StepKey, u32>,
}

impl DatabaseStepChecker {
    fn new(setup: &Setup) -> DatabaseStepChecker {
        DatabaseStepChecker {
            registry: Arc::clone(&setup.registry),
            from: setup.from,
            commits: BTreeMap::new(),
        }
    }
}

impl Checker for DatabaseStepChecker {
    fn name(&self) -> &'static str {
        "database-steps"
    }
    fn invariant(&self) -> &'static str {
        "I2/I3: each database step ran exactly once per upgrade, fenced on the current lease"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::DatabaseStepCommitted {
            host,
            key,
            lease_current,
        } = *observation
        else {
            return Ok(());
        };
        if !lease_current {
            return Err(format!(
                "host {host} committed database step {key} without holding the current lease"
            ));
        }
        let commits = self.commits.entry(key).or_insert(0);
        *commits += 1;
        if *commits > 1 {
            return Err(format!("database step {key} committed {commits} times"));
        }
        Ok(())
    }
    fn finish(&mut self, end: &End<'_>) -> Result<(), String> {
        for (key, &(effects, checkpoints)) in end.step_effects {
            if effects != checkpoints || effects > 1 {
                return Err(format!(
                    "database step {key}: {effects} effect writes and {checkpoints} checkpoints in the store's log"
                ));
            }
        }
        if end.agent_version <= self.from {
            return Ok(());
        }
        let controller = Roles::of(&[lockstep_core::Role::Controller]);
        let plan = steps::plan(
            &self.registry,
            self.from,
            end.agent_version,
            controller,
            true,
        );
        for &index in plan.database() {
            let key = self.registry.key(index);
            let (effects, _) = end.step_effects.get(&key).copied().unwrap_or((0, 0));
            if effects != 1 {
                return Err(format!(
                    "the upgrade to {} finished with database step {key} applied {effects} times",
                    end.agent_version
                ));
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ I5

/// I5: a host step's checkpoint became durable only after the step ran on that host; by
/// the end, every host step planned for an agent ran there at least once.
#[derive(Debug)]
pub struct HostStepChecker {
    registry: Arc<StepRegistry>,
    runs: Vec<BTreeMap<StepKey, u32>>,
}

impl HostStepChecker {
    fn new(setup: &Setup) -> HostStepChecker {
        HostStepChecker {
            registry: Arc::clone(&setup.registry),
            runs: vec![BTreeMap::new(); setup.hosts.len()],
        }
    }
}

impl Checker for HostStepChecker {
    fn name(&self) -> &'static str {
        "host-steps"
    }
    fn invariant(&self) -> &'static str {
        "I5: each host step ran at least once per agent, before its checkpoint"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::HostStepRan { host, key } => {
                *self.runs[host].entry(key).or_insert(0) += 1;
                Ok(())
            }
            Observation::SnapshotDurable { host, snapshot } => {
                match snapshot
                    .host_checkpoints
                    .iter()
                    .find(|key| !self.runs[host].contains_key(key))
                {
                    Some(key) => Err(format!(
                        "host {host}'s checkpoint of host step {key} is durable but the step never ran there"
                    )),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
    fn finish(&mut self, end: &End<'_>) -> Result<(), String> {
        for (index, host) in end.hosts.iter().enumerate() {
            let Some(durable) = &host.durable else {
                continue;
            };
            let plan = steps::plan(
                &self.registry,
                host.origin,
                durable.upgraded_to_version,
                host.roles,
                host.controller,
            );
            for &step in plan.host() {
                let key = self.registry.key(step);
                if !self.runs[index].contains_key(&key) {
                    return Err(format!(
                        "host {index} finished at {} without ever running host step {key}",
                        durable.upgraded_to_version
                    ));
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ I6

/// I6: `upgradedToVersion` never ran ahead of the checkpoints: whenever a snapshot became
/// durable, every step planned from the host's origin to its `upgradedToVersion` had taken
/// effect (database steps committed, host steps run on that host).
#[derive(Debug)]
pub struct UpgradedToChecker {
    registry: Arc<StepRegistry>,
    from: Version,
    hosts: Vec<(Roles, bool)>,
    committed: BTreeSet<StepKey>,
    runs: Vec<BTreeSet<StepKey>>,
}

impl UpgradedToChecker {
    fn new(setup: &Setup) -> UpgradedToChecker {
        UpgradedToChecker {
            registry: Arc::clone(&setup.registry),
            from: setup.from,
            hosts: setup.hosts.clone(),
            committed: BTreeSet::new(),
            runs: vec![BTreeSet::new(); setup.hosts.len()],
        }
    }
}

impl Checker for UpgradedToChecker {
    fn name(&self) -> &'static str {
        "upgraded-to"
    }
    fn invariant(&self) -> &'static str {
        "I6: upgradedToVersion never ran ahead of the checkpoints"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::DatabaseStepCommitted { key, .. } => {
                self.committed.insert(key);
                Ok(())
            }
            Observation::HostStepRan { host, key } => {
                self.runs[host].insert(key);
                Ok(())
            }
            Observation::SnapshotDurable { host, snapshot } => {
                let (roles, controller) = self.hosts[host];
                let plan = steps::plan(
                    &self.registry,
                    self.from,
                    snapshot.upgraded_to_version,
                    roles,
                    controller,
                );
                for index in plan.iter() {
                    let key = self.registry.key(index);
                    let done = match self.registry.step(index).kind {
                        steps::StepKind::Database => self.committed.contains(&key),
                        steps::StepKind::Host => self.runs[host].contains(&key),
                    };
                    if !done {
                        return Err(format!(
                            "host {host} persisted upgradedToVersion {} while step {key} had not taken effect",
                            snapshot.upgraded_to_version
                        ));
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ I7, I8

/// I7 and I8: a process is Ready only with `upgradedToVersion` equal to its running
/// version, and no controller is Ready on a binary older than a database step applied.
#[derive(Debug, Default)]
pub struct ReadyChecker {
    newest_step: Option<StepKey>,
}

impl Checker for ReadyChecker {
    fn name(&self) -> &'static str {
        "ready"
    }
    fn invariant(&self) -> &'static str {
        "I7/I8: Ready only with its steps done, never on a binary older than the store"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::DatabaseStepCommitted { key, .. } => {
                if self
                    .newest_step
                    .is_none_or(|newest| key.target_version > newest.target_version)
                {
                    self.newest_step = Some(key);
                }
                Ok(())
            }
            Observation::Ready {
                host,
                running,
                upgraded_to,
                durable_upgraded_to,
                controller,
            } => {
                if upgraded_to != running && durable_upgraded_to != Some(running) {
                    return Err(format!(
                        "host {host} is Ready on {running} with upgradedToVersion {upgraded_to}"
                    ));
                }
                if let Some(key) = self.newest_step
                    && controller
                    && key.target_version > running
                {
                    return Err(format!(
                        "controller host {host} is Ready on {running}, older than database step {key}"
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ versions

/// No agent ran a version that the policy and the catalogue did not allow: every binary
/// booted is the starting one or one the stream listed by then, of the running major (and
/// the pinned version under a pin).
#[derive(Debug)]
pub struct VersionPolicyChecker {
    policy: UpgradePolicy,
    from: Version,
}

impl VersionPolicyChecker {
    fn new(setup: &Setup) -> VersionPolicyChecker {
        VersionPolicyChecker {
            policy: setup.policy.clone(),
            from: setup.from,
        }
    }
}

impl Checker for VersionPolicyChecker {
    fn name(&self) -> &'static str {
        "version-policy"
    }
    fn invariant(&self) -> &'static str {
        "no agent ran a version the policy and catalogue did not allow"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::Booted {
            host,
            binary,
            listed,
        } = *observation
        else {
            return Ok(());
        };
        let version = binary.number;
        if version == self.from {
            return Ok(());
        }
        if !listed.contains(&version) {
            return Err(format!(
                "host {host} booted {binary}, which the stream never listed"
            ));
        }
        let allowed = match &self.policy {
            UpgradePolicy::Pinned(pinned) => version == *pinned,
            UpgradePolicy::Off | UpgradePolicy::AutoPatch => version.major == self.from.major,
            UpgradePolicy::LocalBinary { binary: local, .. } => version == local.number,
        };
        if !allowed {
            return Err(format!(
                "host {host} booted {binary}, which policy {:?} does not allow",
                self.policy
            ));
        }
        Ok(())
    }
}

/// No version went backwards without an explicit pin: a restart into an older binary is
/// either to a pinned version or the safe fall back of a trial (the previous binary, no
/// database step of the trial's version run).
#[derive(Debug)]
pub struct NoDowngradeChecker {
    policy: UpgradePolicy,
    hosts: Vec<(Roles, bool)>,
}

impl NoDowngradeChecker {
    fn new(setup: &Setup) -> NoDowngradeChecker {
        NoDowngradeChecker {
            policy: setup.policy.clone(),
            hosts: setup.hosts.clone(),
        }
    }
}

impl Checker for NoDowngradeChecker {
    fn name(&self) -> &'static str {
        "no-downgrade"
    }
    fn invariant(&self) -> &'static str {
        "no version went backwards without an explicit pin (or a safe fall back)"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::Restart {
            host,
            from,
            to,
            durable,
        } = *observation
        else {
            return Ok(());
        };
        if to.number >= from.number {
            return Ok(());
        }
        if self.policy == UpgradePolicy::Pinned(to.number) {
            return Ok(());
        }
        let safe_fall_back = durable.is_some_and(|snapshot| {
            snapshot.previous.as_ref() == Some(to)
                && snapshot
                    .trial
                    .as_ref()
                    .is_some_and(|trial| trial.binary == *from && !trial.past_database_steps)
        });
        if safe_fall_back {
            return Ok(());
        }
        let what = if self.hosts[host].1 {
            "controller"
        } else {
            "machine agent"
        };
        Err(format!(
            "{what} host {host} restarted from {from} into older {to} without a pin or a safe fall back (snapshot {durable:?})"
        ))
    }
}

/// Juju's controllers-first rule, as it shows: an agent other than a controller restarts
/// into a newer version only after every controller has reported running that version (or
/// a newer one) through `Upgrader.SetTools`. What a controller is configured with, or is
/// about to boot, does not count: only what it reported.
#[derive(Debug)]
pub struct ControllersFirstChecker {
    hosts: Vec<(Roles, bool)>,
    /// The newest version each host has reported running so far.
    highest_reported: Vec<Option<Version>>,
    /// The controllers' hosts.
    controllers: Vec<usize>,
}

impl ControllersFirstChecker {
    fn new(setup: &Setup) -> ControllersFirstChecker {
        ControllersFirstChecker {
            hosts: setup.hosts.clone(),
            highest_reported: vec![None; setup.hosts.len()],
            controllers: (0..setup.hosts.len())
                .filter(|&host| setup.hosts[host].1)
                .collect(),
        }
    }
}

impl Checker for ControllersFirstChecker {
    fn name(&self) -> &'static str {
        "controllers-first"
    }
    fn invariant(&self) -> &'static str {
        "controllers first: no other agent upgrades to a version before every controller reported running it"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match *observation {
            Observation::BinaryReported { host, binary } => {
                let highest = &mut self.highest_reported[host];
                *highest = (*highest).max(Some(binary.number));
                Ok(())
            }
            Observation::Restart { host, from, to, .. }
                if !self.hosts[host].1 && to.number > from.number =>
            {
                let behind = self
                    .controllers
                    .iter()
                    .map(|&controller| (controller, self.highest_reported[controller]))
                    .find(|(_, highest)| highest.is_none_or(|highest| highest < to.number));
                match behind {
                    Some((controller, highest)) => Err(format!(
                        "machine agent host {host} restarted from {from} into {to} while controller host {controller} had reported running at most {highest:?}"
                    )),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ I4

/// I4: the upgrade-info record only took valid transitions (pending → db-complete →
/// running → complete, or → aborted; ready and done only grow; done ⊆ ready), as the
/// store's log shows them, and the core never asked the store for an invalid one.
#[derive(Debug, Default)]
pub struct RecordChecker {
    current: Option<UpgradeInfo>,
}

impl Checker for RecordChecker {
    fn name(&self) -> &'static str {
        "record"
    }
    fn invariant(&self) -> &'static str {
        "I4: the upgrade-info record only took valid transitions"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        match observation {
            Observation::StoreRefused { what } => Err(format!("the store refused: {what}")),
            Observation::RecordWritten { record, archived } => {
                let next = *record;
                match self.current {
                    None if !archived && next.status != UpgradeStatus::Pending => {
                        return Err(format!("a new record started {:?}", next.status));
                    }
                    None if *archived => {
                        return Err("a record was archived while none was current".to_owned());
                    }
                    Some(current) if !current.may_become(&next) => {
                        return Err(format!("the record went from {current:?} to {next:?}"));
                    }
                    _ => {}
                }
                if *archived != next.status.is_final() {
                    return Err(format!(
                        "record {next:?} archived {archived} with status {:?}",
                        next.status
                    ));
                }
                self.current = (!archived).then_some(next);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------ clients

/// Every client operation was applied exactly once: never twice (retries and duplicates
/// carry the same `operation-id`), and once for every operation its caller saw succeed.
#[derive(Debug, Default)]
pub struct OperationChecker {
    applied: BTreeMap<String, u32>,
}

impl Checker for OperationChecker {
    fn name(&self) -> &'static str {
        "operations"
    }
    fn invariant(&self) -> &'static str {
        "every client operation was applied exactly once"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::OperationApplied { operation } = *observation else {
            return Ok(());
        };
        let applied = self.applied.entry(operation.to_owned()).or_insert(0);
        *applied += 1;
        if *applied > 1 {
            return Err(format!("operation {operation} applied {applied} times"));
        }
        Ok(())
    }
    fn finish(&mut self, end: &End<'_>) -> Result<(), String> {
        for (operation, &effects) in end.operation_effects {
            if effects > 1 {
                return Err(format!(
                    "operation {operation} has {effects} effect writes in the store's log"
                ));
            }
        }
        for operation in end.answered_operations {
            let effects = end.operation_effects.get(operation).copied().unwrap_or(0);
            if effects != 1 {
                return Err(format!(
                    "operation {operation} was answered but has {effects} effect writes"
                ));
            }
        }
        Ok(())
    }
}

/// Every watcher saw every change exactly once, in order: what it delivered is exactly
/// the store's log after the revision it started from, up to where it stands.
#[derive(Debug, Default)]
pub struct WatcherChecker {
    delivered: BTreeMap<usize, Vec<Revision>>,
}

impl Checker for WatcherChecker {
    fn name(&self) -> &'static str {
        "watchers"
    }
    fn invariant(&self) -> &'static str {
        "every watcher saw every change exactly once, in order"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::WatcherDelivered { client, revision } = *observation else {
            return Ok(());
        };
        let delivered = self.delivered.entry(client).or_default();
        if let Some(&last) = delivered.last()
            && revision <= last
        {
            return Err(format!(
                "watcher {client} delivered revision {} after {}",
                revision.0, last.0
            ));
        }
        delivered.push(revision);
        Ok(())
    }
    fn finish(&mut self, end: &End<'_>) -> Result<(), String> {
        for watcher in end.watchers {
            let (Some(baseline), Some(position)) = (watcher.baseline, watcher.position) else {
                continue;
            };
            let expected: Vec<Revision> = end
                .revisions
                .iter()
                .copied()
                .filter(|&revision| revision > baseline && revision <= position)
                .collect();
            let empty = Vec::new();
            let delivered = self.delivered.get(&watcher.client).unwrap_or(&empty);
            if *delivered != expected {
                let missing: Vec<u64> = expected
                    .iter()
                    .filter(|revision| !delivered.contains(revision))
                    .map(|revision| revision.0)
                    .collect();
                return Err(format!(
                    "watcher {} delivered {} changes after revision {}, the log has {} (missing {missing:?})",
                    watcher.client,
                    delivered.len(),
                    baseline.0,
                    expected.len()
                ));
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ rollout

/// The staged rollout's bounds, as the records in the store show them (`spec/rollout.md`):
/// a record that admits agents never leaves more than `max-at-once` admitted agents not
/// yet healthy on the target (by what the agents had reported when it was written); no
/// agent but a canary is admitted before every canary was healthy on the target (under a
/// policy with canaries, none chosen counts as none healthy); a halted
/// rollout admits no one; an admission is never taken back while the target stands;
/// there are never more canaries than the policy names; and the agents told to fetch ahead
/// of admission are never canaries, are there only while the canaries try the binary and
/// the rollout is not halted, and, with the canaries, are no more than `max-at-once`.
#[derive(Debug)]
pub struct RolloutChecker {
    policy: RolloutPolicy,
    previous: Option<Rollout>,
    /// Every canary was seen healthy on the target (by this checker's own reading).
    canaries_seen_healthy: bool,
}

impl RolloutChecker {
    fn new(setup: &Setup) -> RolloutChecker {
        RolloutChecker {
            policy: setup.rollout,
            previous: None,
            canaries_seen_healthy: false,
        }
    }
}

/// Healthy on `target`: reported running it, and Ready.
fn healthy_on(agent: &AgentView, target: Version) -> bool {
    agent.running == Some(target) && agent.health == Health::Ready
}

impl Checker for RolloutChecker {
    fn name(&self) -> &'static str {
        "rollout"
    }
    fn invariant(&self) -> &'static str {
        "a staged rollout never has more than max-at-once agents in flight after an admission, and admits no one but a canary before the canaries passed"
    }
    fn observe(&mut self, observation: &Observation<'_>) -> Result<(), String> {
        let Observation::RolloutWritten { record, agents } = *observation else {
            return Ok(());
        };
        let previous = self
            .previous
            .take()
            .filter(|previous| previous.target == record.target);
        if previous.is_none() {
            self.canaries_seen_healthy = false;
        }
        let admitted_before = |id: &str| {
            previous
                .as_ref()
                .is_some_and(|previous| previous.admitted.contains_key(id))
        };
        let new: Vec<&String> = record
            .admitted
            .keys()
            .filter(|id| !admitted_before(id))
            .collect();
        if record.canaries.len() > self.policy.canaries as usize {
            return Err(format!(
                "{} canaries chosen, the policy names {}",
                record.canaries.len(),
                self.policy.canaries
            ));
        }
        if !record.staging.is_empty() {
            if record.canaries_passed || record.halted.is_some() {
                return Err(format!(
                    "{} agents told to fetch {} ahead after the canaries passed or a halt",
                    record.staging.len(),
                    record.target
                ));
            }
            if let Some(id) = record.staging.intersection(&record.canaries).next() {
                return Err(format!("canary {id} told to fetch ahead"));
            }
            let receiving = record.staging.len() + record.canaries.len();
            if self.policy.max_at_once > 0 && receiving > self.policy.max_at_once as usize {
                return Err(format!(
                    "{} agents fetching {} ahead beside {} canaries, max-at-once is {}",
                    record.staging.len(),
                    record.target,
                    record.canaries.len(),
                    self.policy.max_at_once
                ));
            }
        }
        if let Some(previous) = &previous {
            if let Some(id) = previous
                .admitted
                .keys()
                .find(|id| !record.admitted.contains_key(*id) && !previous.failed.contains_key(*id))
            {
                return Err(format!(
                    "agent {id}'s admission to {} was taken back",
                    record.target
                ));
            }
            if previous.halted.is_some() && !new.is_empty() {
                return Err(format!(
                    "the halted rollout to {} admitted {} agents (first {})",
                    record.target,
                    new.len(),
                    new[0]
                ));
            }
        }
        // Under a policy with canaries, none chosen is none healthy (not all of none).
        let canaries_healthy = (self.policy.canaries == 0 || !record.canaries.is_empty())
            && record.canaries.iter().all(|id| {
                agents
                    .iter()
                    .find(|agent| agent.id == *id)
                    .is_some_and(|agent| healthy_on(agent, record.target))
            });
        let canaries_passed_before = self.canaries_seen_healthy;
        self.canaries_seen_healthy |= canaries_healthy;
        if !canaries_passed_before
            && !canaries_healthy
            && let Some(id) = new.iter().find(|id| !record.canaries.contains(id.as_str()))
        {
            return Err(format!(
                "agent {id} admitted to {} before the canaries {:?} were healthy on it",
                record.target, record.canaries
            ));
        }
        if !new.is_empty() && self.policy.max_at_once > 0 {
            // Admitted, not failed, and not healthy on the target (an admitted agent of
            // which nothing is known counts too).
            let counts = |agent: &&AgentView| {
                record.admitted.contains_key(&agent.id) && !record.failed.contains_key(&agent.id)
            };
            let seen = agents.iter().filter(counts).count();
            let unseen = record
                .admitted
                .keys()
                .filter(|id| !record.failed.contains_key(*id))
                .count()
                - seen;
            let in_flight = agents
                .iter()
                .filter(counts)
                .filter(|agent| !healthy_on(agent, record.target))
                .count()
                + unseen;
            if in_flight > self.policy.max_at_once as usize {
                return Err(format!(
                    "{in_flight} agents in flight to {} after admitting {} more, max-at-once is {}",
                    record.target,
                    new.len(),
                    self.policy.max_at_once
                ));
            }
        }
        self.previous = Some(record.clone());
        Ok(())
    }
}
