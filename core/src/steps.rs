//! Upgrade steps: the registry an embedder supplies, and the plan of which steps this agent
//! runs for upgraded-to → running version and its roles.
//!
//! # The rule
//!
//! A step runs when its target version `v` satisfies `from < v <= to`, where `from` is the
//! agent's recorded `upgradedToVersion` and `to` is the running binary's version with its
//! pre-release tag and build number cleared, so that `1.25-beta1` runs the steps of
//! `1.25.0` and `1.25.1` (its release line up to its own patch) and a build `2.9.43.1` runs
//! the steps of `2.9.43`. This is Juju's `newOpsIterator` (`upgrades/operations.go`), which
//! clears `to.Tag` and skips operations with `TargetVersion() <= from` or `> to`.
//!
//! Juju clears the tag only "if the agent version has actually changed, lest we trigger
//! upgrade mode unnecessarily for non-final versions". We keep that guard in its general
//! form: when `from >= running` (compared in full, tag and build included) the plan is empty.
//! So an agent restarted on the `1.25-beta1` it already recorded plans nothing, and a
//! downgrade never runs steps (Juju would run the `1.25.1` steps when going from `1.25.0`
//! back to `1.25-beta1`; we do not).
//!
//! Each step has a [`StepKind`]:
//! - **database** steps change state shared by the controllers. They run exactly once per
//!   [`StepKey`] (step id, target version): the step's changes and its checkpoint commit in
//!   one store transaction. They run on the coordinator only, the controller holding the
//!   upgrade lease, which plays Juju's `DatabaseMaster` target (`PerformStateUpgrade`).
//! - **host** steps change the agent's own machine. They run at least once, must be
//!   idempotent, and are checkpointed in the agent's local snapshot after they succeed
//!   (Juju's API steps, `PerformUpgradeSteps`).
//!
//! A [`Plan`] therefore has two lists, as Juju runs them: every database step first (on the
//! coordinator, before the upgrade-info record says `db-complete`), then, on every
//! controller and machine, its host steps. Each list is ordered by target version, and by
//! registry order within one version (Juju's `stateUpgradeOperations` and
//! `upgradeOperations` are ordered slices of per-version step lists).
//!
//! A host step's targets match the agent as Juju's `targetsMatch` does: `controller` needs
//! the controller role, `host-machine` the host-machine role, and `all-machines` matches
//! every agent.
//!
//! Steps are referred to by [`StepIndex`], their position in the registry the embedder
//! declared: the lifecycle and the model checker carry small indices, and the embedder maps
//! an index back to the code that runs it.
//!
//! Where we differ from Juju: Juju treats an unknown `from` (`version.Zero`) as `1.16.0`, the
//! first release that recorded `upgradedToVersion`. lockstep has no such history, so `from`
//! = [`Version::ZERO`] plans every step up to `to`; the Bootstrapping phase records the
//! running version for a fresh agent, so that a freshly bootstrapped controller runs no
//! steps (Juju's historic bug of recording the client's version is the lifecycle's to avoid).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::role::{Role, Roles};
use crate::version::Version;

/// The most steps a registry may hold. A bound for the model checker and for the plan's
/// lists; Juju's largest release lines had a few dozen steps. Retire steps whose target
/// version is older than the oldest version you support upgrading from.
pub const STEPS_MAX: usize = 256;

/// What a step changes, which decides where it runs and how often.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Changes shared state. Runs exactly once, on the coordinator only; its changes and its
    /// checkpoint commit in one store transaction. Targets only [`Target::DatabaseMaster`].
    Database,
    /// Changes the agent's own machine. Runs at least once on every agent whose roles match
    /// its targets, so it must be idempotent; checkpointed in the local snapshot after it
    /// succeeded.
    Host,
}

impl StepKind {
    /// The wire and log name: `database` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Database => "database",
            StepKind::Host => "host",
        }
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of agent a step is for: Juju's `upgrades.Target`, with kebab-case wire names.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// Any agent with the controller role (Juju's `Controller`, once `StateServer`).
    Controller,
    /// Any agent with the host-machine role: a machine units are deployed to.
    HostMachine,
    /// The controller holding the upgrade lease, the only one that runs database steps
    /// (Juju's `DatabaseMaster`).
    DatabaseMaster,
    /// Every agent, whatever its roles (Juju's `AllMachines`).
    AllMachines,
}

impl Target {
    /// Every target, in declaration order.
    pub const ALL: [Target; 4] = [
        Target::Controller,
        Target::HostMachine,
        Target::DatabaseMaster,
        Target::AllMachines,
    ];

    /// The wire and log name: `controller`, `host-machine`, `database-master`,
    /// `all-machines`.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Controller => "controller",
            Target::HostMachine => "host-machine",
            Target::DatabaseMaster => "database-master",
            Target::AllMachines => "all-machines",
        }
    }

    /// Parses the wire name; `None` for anything else.
    pub fn parse(text: &str) -> Option<Target> {
        Target::ALL
            .into_iter()
            .find(|target| target.as_str() == text)
    }

    /// True when a host step with this target runs on an agent with `roles`. Database steps
    /// are decided by the coordinator flag instead (see [`plan`]).
    fn matches_host(self, roles: Roles) -> bool {
        match self {
            Target::Controller => roles.contains(Role::Controller),
            Target::HostMachine => roles.contains(Role::HostMachine),
            Target::AllMachines => true,
            // The registry refuses host steps that target the database master.
            Target::DatabaseMaster => false,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step's name: 1 to [`StepId::LENGTH_MAX`] bytes of `a-z`, `0-9` and `-`, starting and
/// ending with a letter or digit, e.g. `add-controller-uuid`.
///
/// It is half of the checkpoint key ([`StepKey`]) written to the store and to the local
/// snapshot, so it is validated on the way in and never changes meaning. Stored inline:
/// `Copy`, allocation-free, and constructible in a `const` or `static` with
/// [`StepId::new`].
#[derive(Clone, Copy, Eq)]
pub struct StepId {
    bytes: [u8; StepId::LENGTH_MAX],
    length: u8,
}

impl StepId {
    /// Longest id accepted, in bytes.
    pub const LENGTH_MAX: usize = 64;

    /// Builds an id from a literal, for registries declared as data.
    ///
    /// # Panics
    ///
    /// If `text` is not a valid id; in a `const` or `static` that is a compile error. Use
    /// [`StepId::parse`] for text that did not come from the program itself.
    pub const fn new(text: &str) -> StepId {
        match StepId::build(text) {
            Some(id) => id,
            None => panic!(
                "invalid step id: use 1 to 64 bytes of a-z, 0-9 and '-', starting and \
                 ending with a letter or digit"
            ),
        }
    }

    /// Parses an id; the error names the text and the rule.
    pub fn parse(text: &str) -> Result<StepId, StepError> {
        StepId::build(text).ok_or_else(|| StepError::InvalidStepId {
            text: text.to_owned(),
        })
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (see `build`).
        std::str::from_utf8(&self.bytes[..usize::from(self.length)]).expect("step id is ASCII")
    }

    const fn build(text: &str) -> Option<StepId> {
        let input = text.as_bytes();
        let length = input.len();
        if length == 0 || length > StepId::LENGTH_MAX {
            return None;
        }
        if input[0] == b'-' || input[length - 1] == b'-' {
            return None;
        }
        let mut bytes = [0u8; StepId::LENGTH_MAX];
        let mut i = 0;
        while i < length {
            let byte = input[i];
            if !(byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-') {
                return None;
            }
            bytes[i] = byte;
            i += 1;
        }
        Some(StepId {
            bytes,
            length: length as u8,
        })
    }
}

impl PartialEq for StepId {
    /// Lengths first: ids of different lengths, most pairs compared, differ without a look
    /// at their bytes. Equal to comparing every byte, since the bytes past the length are
    /// always zero (see `build`), which also keeps the derived `Hash` consistent.
    ///
    /// The bytes are compared eight at a time and the differences folded, which compiles to
    /// a few vector compares in line where `[u8; 64] == [u8; 64]` calls `bcmp` (a host
    /// step's checkpoint is looked for by key after every event of RunningSteps).
    #[inline]
    fn eq(&self, other: &StepId) -> bool {
        fn words(id: &StepId) -> impl Iterator<Item = u64> + '_ {
            id.bytes
                .chunks_exact(8)
                .map(|word| u64::from_ne_bytes(word.try_into().expect("eight bytes")))
        }
        self.length == other.length
            && words(self)
                .zip(words(other))
                .fold(0, |differ, (a, b)| differ | (a ^ b))
                == 0
    }
}

impl std::hash::Hash for StepId {
    /// As derived: every byte, then the length.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
        self.length.hash(state);
    }
}

impl Ord for StepId {
    fn cmp(&self, other: &StepId) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for StepId {
    fn partial_cmp(&self, other: &StepId) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StepId({})", self.as_str())
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepId {
    type Err = StepError;
    fn from_str(text: &str) -> Result<StepId, StepError> {
        StepId::parse(text)
    }
}

impl serde::Serialize for StepId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for StepId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<StepId, D::Error> {
        let text = <Cow<'de, str>>::deserialize(deserializer)?;
        StepId::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The checkpoint key of a step: database steps run exactly once, and host steps are
/// skipped once checkpointed, per (step id, target version) (`CONTRACT.md`).
///
/// Its text form, for logs and store keys, is `<id>@<version>`, e.g.
/// `add-controller-uuid@2.9.5`.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub struct StepKey {
    /// The step's id.
    pub id: StepId,
    /// The release the step upgrades to.
    pub target_version: Version,
}

impl StepKey {
    /// Parses `<id>@<version>`; the error names the text.
    pub fn parse(text: &str) -> Result<StepKey, StepError> {
        let invalid = || StepError::InvalidStepKey {
            text: text.to_owned(),
        };
        let (id, version) = text.split_once('@').ok_or_else(invalid)?;
        let id = StepId::parse(id).map_err(|_| invalid())?;
        let target_version = Version::parse(version).map_err(|_| invalid())?;
        Ok(StepKey { id, target_version })
    }
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.target_version)
    }
}

impl FromStr for StepKey {
    type Err = StepError;
    fn from_str(text: &str) -> Result<StepKey, StepError> {
        StepKey::parse(text)
    }
}

/// One upgrade step as the embedder declares it. The code that runs it lives with the
/// embedder, found by [`StepIndex`] or [`StepId`]; the core only plans and checkpoints.
///
/// `targets` and `description` are `&'static` so that a registry is plain data, declared
/// as a `static` next to the functions it names, as Juju declares `stepsFor29()`; the core
/// never builds steps from untrusted input, and a `Step` stays `Copy` and allocation-free.
/// Checkpoints, which are read back from storage, use [`StepKey`], which owns its data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Step {
    /// The step's name, unique in the registry.
    pub id: StepId,
    /// The release whose upgrade needs this step: it runs when upgrading from below this
    /// version to it or beyond. A release: no pre-release tag, no build number.
    pub target_version: Version,
    /// Database (shared state, exactly once, coordinator) or host (own machine, at least
    /// once, idempotent).
    pub kind: StepKind,
    /// The agents the step is for: exactly `[DatabaseMaster]` for a database step; one or
    /// more of `Controller`, `HostMachine`, `AllMachines` for a host step.
    pub targets: &'static [Target],
    /// What the step does, for status and logs (Juju's `Description()`).
    pub description: &'static str,
}

impl Step {
    /// A database step, targeted at the database master (the coordinator).
    ///
    /// # Panics
    ///
    /// If `id` is not a valid [`StepId`] (a compile error in a `const` or `static`).
    pub const fn database(id: &str, target_version: Version, description: &'static str) -> Step {
        Step {
            id: StepId::new(id),
            target_version,
            kind: StepKind::Database,
            targets: &[Target::DatabaseMaster],
            description,
        }
    }

    /// A host step for the agents matching `targets`.
    ///
    /// # Panics
    ///
    /// If `id` is not a valid [`StepId`] (a compile error in a `const` or `static`).
    pub const fn host(
        id: &str,
        target_version: Version,
        targets: &'static [Target],
        description: &'static str,
    ) -> Step {
        Step {
            id: StepId::new(id),
            target_version,
            kind: StepKind::Host,
            targets,
            description,
        }
    }

    /// The step's checkpoint key.
    pub fn key(&self) -> StepKey {
        StepKey {
            id: self.id,
            target_version: self.target_version,
        }
    }
}

/// A step's position in its [`StepRegistry`], in the order the embedder declared it.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct StepIndex(pub u16);

impl StepIndex {
    /// The index as a `usize`, for slices.
    pub fn as_usize(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for StepIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A validated list of steps: the embedder's, or lockstep's own for its schema.
///
/// Invariants, checked by [`StepRegistry::new`]: at most [`STEPS_MAX`] steps; ids unique;
/// target versions are releases above [`Version::ZERO`]; a database step targets exactly
/// `[DatabaseMaster]`; a host step has at least one target, none twice, and never
/// `DatabaseMaster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRegistry {
    steps: Vec<Step>,
    /// Every index, sorted by target version, then by registry order: the run order.
    by_version: Vec<StepIndex>,
}

impl StepRegistry {
    /// Validates `steps` and builds the registry. The first problem found is returned; it
    /// names the step and says how to fix it.
    pub fn new(steps: &[Step]) -> Result<StepRegistry, StepError> {
        if steps.len() > STEPS_MAX {
            return Err(StepError::TooManySteps { count: steps.len() });
        }
        for (position, step) in steps.iter().enumerate() {
            if let Some(first) = steps[..position].iter().position(|s| s.id == step.id) {
                return Err(StepError::DuplicateStepId {
                    id: step.id,
                    first_index: StepIndex(first as u16),
                    second_index: StepIndex(position as u16),
                });
            }
            check_step(step)?;
        }
        let mut by_version: Vec<StepIndex> =
            (0..steps.len()).map(|i| StepIndex(i as u16)).collect();
        // A stable sort keeps registry order within one target version.
        by_version.sort_by_key(|index| steps[index.as_usize()].target_version);
        let registry = StepRegistry {
            steps: steps.to_vec(),
            by_version,
        };
        assert_eq!(registry.by_version.len(), registry.steps.len());
        Ok(registry)
    }

    /// The registry with no steps.
    pub fn empty() -> StepRegistry {
        StepRegistry {
            steps: Vec::new(),
            by_version: Vec::new(),
        }
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when there are no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Every step, in registry order (the order of [`StepIndex`]).
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The step at `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not from this registry.
    pub fn step(&self, index: StepIndex) -> &Step {
        assert!(
            index.as_usize() < self.steps.len(),
            "step index {index} out of range for a registry of {} steps",
            self.steps.len()
        );
        &self.steps[index.as_usize()]
    }

    /// The checkpoint key of the step at `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not from this registry.
    pub fn key(&self, index: StepIndex) -> StepKey {
        self.step(index).key()
    }

    /// The index of the step with this id, if any.
    pub fn index_of(&self, id: &StepId) -> Option<StepIndex> {
        self.steps
            .iter()
            .position(|step| step.id == *id)
            .map(|position| StepIndex(position as u16))
    }
}

fn check_step(step: &Step) -> Result<(), StepError> {
    if !step.target_version.is_release() || step.target_version.build != 0 {
        return Err(StepError::TargetVersionNotRelease {
            id: step.id,
            target_version: step.target_version,
        });
    }
    if step.target_version == Version::ZERO {
        return Err(StepError::TargetVersionZero { id: step.id });
    }
    if step.targets.is_empty() {
        return Err(StepError::NoTargets {
            id: step.id,
            kind: step.kind,
        });
    }
    for (position, target) in step.targets.iter().enumerate() {
        if step.targets[..position].contains(target) {
            return Err(StepError::DuplicateTarget {
                id: step.id,
                target: *target,
            });
        }
    }
    match step.kind {
        StepKind::Database => {
            if step.targets != [Target::DatabaseMaster] {
                return Err(StepError::DatabaseStepTargets {
                    id: step.id,
                    targets: step.targets,
                });
            }
        }
        StepKind::Host => {
            if step.targets.contains(&Target::DatabaseMaster) {
                return Err(StepError::HostStepTargetsDatabaseMaster { id: step.id });
            }
        }
    }
    Ok(())
}

/// The steps one agent runs for one upgrade, as indices into its [`StepRegistry`].
///
/// Invariants (asserted by [`plan`]): every step's target version `v` satisfies
/// `from < v <= to`; `database` holds database steps only and `host` host steps only; each
/// list is sorted by target version, registry order within a version; no step appears twice;
/// at most [`STEPS_MAX`] steps in all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    from: Version,
    to: Version,
    database: Vec<StepIndex>,
    host: Vec<StepIndex>,
}

impl Plan {
    /// The recorded `upgradedToVersion` the plan starts from.
    pub fn from(&self) -> Version {
        self.from
    }

    /// The running version with its tag and build cleared: the highest target version
    /// planned.
    pub fn to(&self) -> Version {
        self.to
    }

    /// Database steps, to run first, on the coordinator only, before `db-complete`.
    pub fn database(&self) -> &[StepIndex] {
        &self.database
    }

    /// Host steps, to run after `db-complete`.
    pub fn host(&self) -> &[StepIndex] {
        &self.host
    }

    /// Every planned step in run order: database steps, then host steps.
    pub fn iter(&self) -> impl Iterator<Item = StepIndex> + '_ {
        self.database.iter().chain(self.host.iter()).copied()
    }

    /// Number of steps planned in all.
    pub fn len(&self) -> usize {
        self.database.len() + self.host.len()
    }

    /// True when nothing is to run: the agent may record `upgradedToVersion` at once.
    pub fn is_empty(&self) -> bool {
        self.database.is_empty() && self.host.is_empty()
    }

    fn assert_invariants(&self, registry: &StepRegistry) {
        assert!(self.len() <= STEPS_MAX.min(registry.len()));
        for (list, kind) in [
            (&self.database, StepKind::Database),
            (&self.host, StepKind::Host),
        ] {
            for index in list {
                let step = registry.step(*index);
                assert_eq!(step.kind, kind, "{} planned as {kind}", step.id);
                assert!(self.from < step.target_version && step.target_version <= self.to);
            }
            for pair in list.windows(2) {
                let (earlier, later) = (registry.step(pair[0]), registry.step(pair[1]));
                let ordered = match earlier.target_version.cmp(&later.target_version) {
                    Ordering::Less => true,
                    Ordering::Equal => pair[0] < pair[1],
                    Ordering::Greater => false,
                };
                assert!(ordered, "{} planned before {}", earlier.id, later.id);
            }
        }
    }
}

/// Plans the steps an agent runs after recording `upgradedToVersion` = `from` and starting
/// on the binary `running`.
///
/// - Nothing when `from >= running` (same version, or a downgrade).
/// - Otherwise, with `to = running.without_tag_and_build()`, every step whose target version
///   `v` satisfies `from < v <= to` and that is for this agent:
///   - a database step when `coordinator` (this controller holds the upgrade lease) and
///     `roles` has the controller role;
///   - a host step when any of its targets matches `roles` (`all-machines` always).
///
/// See the module documentation for how this mirrors Juju.
pub fn plan(
    registry: &StepRegistry,
    from: Version,
    running: Version,
    roles: Roles,
    coordinator: bool,
) -> Plan {
    let to = running.without_tag_and_build();
    let mut result = Plan {
        from,
        to,
        database: Vec::new(),
        host: Vec::new(),
    };
    // Juju's guard "only if the agent version has actually changed", widened to refuse
    // downgrades: compare the running version in full, before clearing tag and build.
    if from < running {
        let database_allowed = coordinator && roles.contains(Role::Controller);
        for &index in &registry.by_version {
            let step = registry.step(index);
            // Juju's opsIterator: skip `v <= from` (already run) and `v > to` (not yet).
            if step.target_version <= from || step.target_version > to {
                continue;
            }
            match step.kind {
                StepKind::Database => {
                    if database_allowed {
                        result.database.push(index);
                    }
                }
                StepKind::Host => {
                    if step.targets.iter().any(|target| target.matches_host(roles)) {
                        result.host.push(index);
                    }
                }
            }
        }
    }
    result.assert_invariants(registry);
    tracing::debug!(
        from = %from,
        running = %running,
        to = %to,
        coordinator,
        database_steps = result.database.len(),
        host_steps = result.host.len(),
        "planned upgrade steps"
    );
    result
}

/// A step id, step key or registry that lockstep refuses. Each message names the offending
/// value and says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// Text that is not a step id.
    InvalidStepId {
        /// The offending text, verbatim.
        text: String,
    },
    /// Text that is not `<id>@<version>`.
    InvalidStepKey {
        /// The offending text, verbatim.
        text: String,
    },
    /// More than [`STEPS_MAX`] steps.
    TooManySteps {
        /// How many steps the registry was given.
        count: usize,
    },
    /// Two steps with one id.
    DuplicateStepId {
        /// The repeated id.
        id: StepId,
        /// Where it first appears.
        first_index: StepIndex,
        /// Where it appears again.
        second_index: StepIndex,
    },
    /// A target version with a pre-release tag or a build number.
    TargetVersionNotRelease {
        /// The step.
        id: StepId,
        /// Its target version.
        target_version: Version,
    },
    /// A target version of `0.0.0`, which no upgrade reaches.
    TargetVersionZero {
        /// The step.
        id: StepId,
    },
    /// A step with no targets.
    NoTargets {
        /// The step.
        id: StepId,
        /// Its kind, to suggest the right targets.
        kind: StepKind,
    },
    /// A step listing one target twice.
    DuplicateTarget {
        /// The step.
        id: StepId,
        /// The repeated target.
        target: Target,
    },
    /// A database step whose targets are not exactly `[database-master]`.
    DatabaseStepTargets {
        /// The step.
        id: StepId,
        /// Its targets.
        targets: &'static [Target],
    },
    /// A host step that targets `database-master`.
    HostStepTargetsDatabaseMaster {
        /// The step.
        id: StepId,
    },
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::InvalidStepId { text } => write!(
                f,
                "invalid step id {text:?}: use 1 to {} bytes of a-z, 0-9 and '-', starting and \
                 ending with a letter or digit (e.g. \"add-controller-uuid\")",
                StepId::LENGTH_MAX
            ),
            StepError::InvalidStepKey { text } => write!(
                f,
                "invalid step key {text:?}: expected <step-id>@<release>, \
                 e.g. \"add-controller-uuid@2.9.5\""
            ),
            StepError::TooManySteps { count } => write!(
                f,
                "step registry has {count} steps, more than the limit of {STEPS_MAX}: retire \
                 steps whose target version is older than the oldest version you support \
                 upgrading from"
            ),
            StepError::DuplicateStepId {
                id,
                first_index,
                second_index,
            } => write!(
                f,
                "duplicate step id \"{id}\" at registry positions {first_index} and \
                 {second_index}: a step id is a checkpoint key, give each step its own id"
            ),
            StepError::TargetVersionNotRelease { id, target_version } => write!(
                f,
                "step \"{id}\" has target version {target_version}, which is not a release: \
                 use major.minor.patch without pre-release tag or build number (e.g. {}), \
                 agents running pre-releases and builds run the steps of their release line",
                target_version.without_tag_and_build()
            ),
            StepError::TargetVersionZero { id } => write!(
                f,
                "step \"{id}\" has target version 0.0.0, which no upgrade reaches: use the \
                 first release that needs the step"
            ),
            StepError::NoTargets { id, kind } => match kind {
                StepKind::Database => write!(
                    f,
                    "database step \"{id}\" has no targets: give it the target database-master"
                ),
                StepKind::Host => write!(
                    f,
                    "host step \"{id}\" has no targets: give it one or more of controller, \
                     host-machine, all-machines"
                ),
            },
            StepError::DuplicateTarget { id, target } => write!(
                f,
                "step \"{id}\" lists target {target} more than once: list each target once"
            ),
            StepError::DatabaseStepTargets { id, targets } => {
                write!(f, "database step \"{id}\" targets [")?;
                for (position, target) in targets.iter().enumerate() {
                    if position > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{target}")?;
                }
                f.write_str(
                    "]: a database step changes shared state and runs once, on the \
                     coordinator; give it exactly the target database-master, or make it a \
                     host step",
                )
            }
            StepError::HostStepTargetsDatabaseMaster { id } => write!(
                f,
                "host step \"{id}\" targets database-master: only database steps run on the \
                 coordinator alone; make it a database step, or target controller, \
                 host-machine or all-machines"
            ),
        }
    }
}

impl std::error::Error for StepError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CONTROLLER: &[Target] = &[Target::Controller];
    const HOST_MACHINE: &[Target] = &[Target::HostMachine];
    const ALL_MACHINES: &[Target] = &[Target::AllMachines];
    const BOTH: &[Target] = &[Target::Controller, Target::HostMachine];

    /// A registry shaped like Juju's: several steps per release, database and host steps
    /// mixed, declared partly out of version order (the 2.9.0 host step comes after the
    /// 2.9.43 ones) to show that plans sort by version but keep registry order within one.
    static REAL_STEPS: &[Step] = &[
        Step::database(
            "add-environ-uuid-to-services",
            Version::new(1, 25, 0),
            "add the model UUID to every service document",
        ),
        Step::host(
            "write-lxc-default-mtu",
            Version::new(1, 25, 1),
            ALL_MACHINES,
            "write the default MTU into the LXC configuration",
        ),
        Step::host(
            "add-juju-run-symlink",
            Version::new(1, 25, 2),
            CONTROLLER,
            "link juju-run into /usr/local/bin",
        ),
        Step::database(
            "add-controller-uuid",
            Version::new(2, 9, 0),
            "add the controller UUID to every model document",
        ),
        Step::database(
            "migrate-legacy-jobs-to-roles",
            Version::new(2, 9, 5),
            "store roles for machines that only carry legacy jobs",
        ),
        Step::host(
            "write-controller-api-port",
            Version::new(2, 9, 5),
            CONTROLLER,
            "write the controller API port into agent.conf",
        ),
        Step::host(
            "update-unit-agent-symlinks",
            Version::new(2, 9, 5),
            HOST_MACHINE,
            "point unit agents' tool symlinks at the machine agent's binary",
        ),
        Step::database(
            "add-upgrade-info-archive",
            Version::new(2, 9, 43),
            "create the archive collection for finished upgrade-info records",
        ),
        Step::host(
            "rewrite-agent-conf-format",
            Version::new(2, 9, 43),
            BOTH,
            "rewrite agent.conf in the 2.9.43 format",
        ),
        Step::host(
            "remove-legacy-rsyslog-config",
            Version::new(2, 9, 0),
            ALL_MACHINES,
            "remove the rsyslog forwarding configuration",
        ),
        Step::database(
            "drop-juju-1-collections",
            Version::new(3, 0, 0),
            "drop collections unused since Juju 1",
        ),
        Step::host(
            "remove-mongo-snap-channel",
            Version::new(3, 0, 0),
            CONTROLLER,
            "remove the pinned juju-db snap channel",
        ),
        Step::host(
            "install-lxd-profile",
            Version::new(3, 0, 0),
            HOST_MACHINE,
            "install the default LXD profile",
        ),
    ];

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn registry() -> StepRegistry {
        StepRegistry::new(REAL_STEPS).unwrap()
    }

    fn ids(registry: &StepRegistry, indices: &[StepIndex]) -> Vec<String> {
        indices
            .iter()
            .map(|&index| registry.step(index).id.to_string())
            .collect()
    }

    const CONTROLLER_ROLES: &[Role] = &[Role::Controller];
    const HOST_ROLES: &[Role] = &[Role::HostMachine];
    const BOTH_ROLES: &[Role] = &[Role::Controller, Role::HostMachine];
    const NO_ROLES: &[Role] = &[];

    struct Case {
        from: &'static str,
        running: &'static str,
        roles: &'static [Role],
        coordinator: bool,
        database: &'static [&'static str],
        host: &'static [&'static str],
    }

    #[test]
    fn plans_exact_ordered_steps() {
        let cases = [
            // A 2.9.0 controller holding the lease, upgrading to 3.0.0: all 2.9.x and 3.0.0
            // database steps, then its controller and all-machines host steps.
            Case {
                from: "2.9.0",
                running: "3.0.0",
                roles: CONTROLLER_ROLES,
                coordinator: true,
                database: &[
                    "migrate-legacy-jobs-to-roles",
                    "add-upgrade-info-archive",
                    "drop-juju-1-collections",
                ],
                host: &[
                    "write-controller-api-port",
                    "rewrite-agent-conf-format",
                    "remove-mongo-snap-channel",
                ],
            },
            // The same controller without the lease runs no database step.
            Case {
                from: "2.9.0",
                running: "3.0.0",
                roles: CONTROLLER_ROLES,
                coordinator: false,
                database: &[],
                host: &[
                    "write-controller-api-port",
                    "rewrite-agent-conf-format",
                    "remove-mongo-snap-channel",
                ],
            },
            // A host machine: its own host steps only, even if (wrongly) called coordinator.
            Case {
                from: "2.9.0",
                running: "3.0.0",
                roles: HOST_ROLES,
                coordinator: true,
                database: &[],
                host: &[
                    "update-unit-agent-symlinks",
                    "rewrite-agent-conf-format",
                    "install-lxd-profile",
                ],
            },
            // Both roles: the union, each step once, in version then registry order.
            Case {
                from: "2.9.0",
                running: "3.0.0",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[
                    "migrate-legacy-jobs-to-roles",
                    "add-upgrade-info-archive",
                    "drop-juju-1-collections",
                ],
                host: &[
                    "write-controller-api-port",
                    "update-unit-agent-symlinks",
                    "rewrite-agent-conf-format",
                    "remove-mongo-snap-channel",
                    "install-lxd-profile",
                ],
            },
            // No roles: only all-machines steps.
            Case {
                from: "1.25.0",
                running: "2.9.0",
                roles: NO_ROLES,
                coordinator: true,
                database: &[],
                host: &["write-lxc-default-mtu", "remove-legacy-rsyslog-config"],
            },
            // From ZERO: every step up to the running version, sorted by version although
            // remove-legacy-rsyslog-config (2.9.0) is declared after the 2.9.43 steps.
            Case {
                from: "0.0.0",
                running: "2.9.5",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[
                    "add-environ-uuid-to-services",
                    "add-controller-uuid",
                    "migrate-legacy-jobs-to-roles",
                ],
                host: &[
                    "write-lxc-default-mtu",
                    "add-juju-run-symlink",
                    "remove-legacy-rsyslog-config",
                    "write-controller-api-port",
                    "update-unit-agent-symlinks",
                ],
            },
            // from < v <= to: the 2.9.5 steps already ran, the 2.9.43 ones run now.
            Case {
                from: "2.9.5",
                running: "2.9.43",
                roles: CONTROLLER_ROLES,
                coordinator: true,
                database: &["add-upgrade-info-archive"],
                host: &["rewrite-agent-conf-format"],
            },
            // A patch with no steps of its own.
            Case {
                from: "2.9.43",
                running: "2.9.44",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // Same version: nothing.
            Case {
                from: "2.9.43",
                running: "2.9.43",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // Downgrade: nothing.
            Case {
                from: "3.0.0",
                running: "2.9.0",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // A beta runs its release line's steps up to its own patch (1.25.0, 1.25.1),
            // not 1.25.2: Juju clears the tag, 1.25-beta1 plans as 1.25.1.
            Case {
                from: "1.24.7",
                running: "1.25-beta1",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &["add-environ-uuid-to-services"],
                host: &["write-lxc-default-mtu"],
            },
            // Restarted on the beta it already recorded: nothing (Juju's "only if the agent
            // version has actually changed").
            Case {
                from: "1.25-beta1",
                running: "1.25-beta1",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // From one beta to the next: the line's steps up to patch 2 are planned again;
            // checkpoints skip those that already ran.
            Case {
                from: "1.25-beta1",
                running: "1.25-beta2",
                roles: CONTROLLER_ROLES,
                coordinator: true,
                database: &["add-environ-uuid-to-services"],
                host: &["write-lxc-default-mtu", "add-juju-run-symlink"],
            },
            // From the release down to a beta of it: no downgrade steps (Juju would run
            // the 1.25.1 steps here).
            Case {
                from: "1.25.0",
                running: "1.25-beta1",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // A build number runs its release's steps.
            Case {
                from: "2.9.42",
                running: "2.9.43.1",
                roles: CONTROLLER_ROLES,
                coordinator: true,
                database: &["add-upgrade-info-archive"],
                host: &["rewrite-agent-conf-format"],
            },
            // From a release to a build of it: nothing new.
            Case {
                from: "2.9.43",
                running: "2.9.43.2",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
            // From a build to the next build: nothing.
            Case {
                from: "2.9.43.1",
                running: "2.9.43.2",
                roles: BOTH_ROLES,
                coordinator: true,
                database: &[],
                host: &[],
            },
        ];
        let registry = registry();
        for case in &cases {
            let label = format!(
                "{} -> {} roles {:?} coordinator {}",
                case.from, case.running, case.roles, case.coordinator
            );
            let planned = plan(
                &registry,
                v(case.from),
                v(case.running),
                Roles::of(case.roles),
                case.coordinator,
            );
            assert_eq!(ids(&registry, planned.database()), case.database, "{label}");
            assert_eq!(ids(&registry, planned.host()), case.host, "{label}");
            assert_eq!(
                planned.len(),
                case.database.len() + case.host.len(),
                "{label}"
            );
            assert_eq!(
                planned.is_empty(),
                case.database.is_empty() && case.host.is_empty(),
                "{label}"
            );
            let in_run_order: Vec<StepIndex> = planned.iter().collect();
            let expected: Vec<StepIndex> = planned
                .database()
                .iter()
                .chain(planned.host())
                .copied()
                .collect();
            assert_eq!(in_run_order, expected, "{label}");
            assert_eq!(planned.from(), v(case.from), "{label}");
            assert_eq!(
                planned.to(),
                v(case.running).without_tag_and_build(),
                "{label}"
            );
        }
    }

    #[test]
    fn an_empty_registry_plans_nothing() {
        let planned = plan(
            &StepRegistry::empty(),
            Version::ZERO,
            v("3.6.1"),
            Roles::of(BOTH_ROLES),
            true,
        );
        assert!(planned.is_empty());
        assert_eq!(planned.len(), 0);
    }

    #[test]
    fn registry_lookups() {
        let registry = registry();
        assert_eq!(registry.len(), REAL_STEPS.len());
        assert!(!registry.is_empty());
        let id = StepId::parse("add-upgrade-info-archive").unwrap();
        let index = registry.index_of(&id).unwrap();
        assert_eq!(index, StepIndex(7));
        assert_eq!(
            registry.key(index),
            StepKey {
                id,
                target_version: v("2.9.43")
            }
        );
        assert_eq!(registry.step(index).kind, StepKind::Database);
        assert_eq!(
            registry.index_of(&StepId::new("no-such-step")),
            None,
            "unknown id"
        );
    }

    #[test]
    #[should_panic(expected = "step index 13 out of range for a registry of 13 steps")]
    fn a_foreign_index_panics_naming_it() {
        registry().step(StepIndex(13));
    }

    #[test]
    fn step_ids_are_validated() {
        let valid = [
            "a",
            "0",
            "add-controller-uuid",
            "step-2-9-43",
            "a-b",
            "x234567890123456789012345678901234567890123456789012345678901234",
        ];
        for text in valid {
            assert_eq!(StepId::parse(text).unwrap().as_str(), text);
            assert_eq!(StepId::new(text).as_str(), text);
        }
        let long = "x".repeat(StepId::LENGTH_MAX + 1);
        let invalid = [
            "",
            "-leading",
            "trailing-",
            "-",
            "Upper",
            "snake_case",
            "dotted.name",
            "with space",
            "slash/name",
            "tab\tname",
            "é",
            "add-controller-uuid@2.9.5",
            long.as_str(),
        ];
        for text in invalid {
            let error = StepId::parse(text).expect_err(text);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("invalid step id {text:?}: use 1 to 64 bytes")),
                "{message}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "invalid step id")]
    fn step_id_new_panics_on_invalid_text() {
        StepId::new("Not_Valid");
    }

    #[test]
    fn step_ids_order_as_text() {
        let ascending = ["a", "a-b", "a0", "ab", "b"];
        for (i, a) in ascending.iter().enumerate() {
            for (j, b) in ascending.iter().enumerate() {
                assert_eq!(StepId::new(a).cmp(&StepId::new(b)), i.cmp(&j), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn step_keys_round_trip() {
        let key = StepKey::parse("add-controller-uuid@2.9.5").unwrap();
        assert_eq!(key.id.as_str(), "add-controller-uuid");
        assert_eq!(key.target_version, v("2.9.5"));
        assert_eq!(key.to_string(), "add-controller-uuid@2.9.5");
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(
            json,
            r#"{"id":"add-controller-uuid","target-version":"2.9.5"}"#
        );
        assert_eq!(serde_json::from_str::<StepKey>(&json).unwrap(), key);
        for text in [
            "",
            "add-controller-uuid",
            "@2.9.5",
            "Bad@2.9.5",
            "a@2.9",
            "a@b@2.9.5",
        ] {
            let message = StepKey::parse(text).expect_err(text).to_string();
            assert!(
                message.starts_with(&format!("invalid step key {text:?}: expected")),
                "{message}"
            );
        }
        let error = serde_json::from_str::<StepKey>(r#"{"id":"Bad","target-version":"2.9.5"}"#)
            .unwrap_err();
        assert!(
            error.to_string().contains("invalid step id \"Bad\""),
            "{error}"
        );
    }

    #[test]
    fn wire_names() {
        let targets = [
            (Target::Controller, "controller"),
            (Target::HostMachine, "host-machine"),
            (Target::DatabaseMaster, "database-master"),
            (Target::AllMachines, "all-machines"),
        ];
        for (target, name) in targets {
            assert_eq!(target.as_str(), name);
            assert_eq!(target.to_string(), name);
            assert_eq!(Target::parse(name), Some(target));
            assert_eq!(
                serde_json::to_string(&target).unwrap(),
                format!("\"{name}\"")
            );
            assert_eq!(
                serde_json::from_str::<Target>(&format!("\"{name}\"")).unwrap(),
                target
            );
        }
        assert_eq!(Target::parse("databaseMaster"), None);
        for (kind, name) in [(StepKind::Database, "database"), (StepKind::Host, "host")] {
            assert_eq!(kind.to_string(), name);
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
        }
        assert_eq!(serde_json::to_string(&StepIndex(7)).unwrap(), "7");
    }

    fn step(id: &str, version: &str, kind: StepKind, targets: &'static [Target]) -> Step {
        Step {
            id: StepId::parse(id).unwrap(),
            target_version: v(version),
            kind,
            targets,
            description: "test step",
        }
    }

    #[test]
    fn registry_refuses_invalid_steps_naming_them() {
        use StepKind::{Database, Host};
        let database_master: &'static [Target] = &[Target::DatabaseMaster];
        let cases: Vec<(Vec<Step>, &str)> = vec![
            (
                vec![
                    step("add-controller-uuid", "2.9.0", Database, database_master),
                    step("write-api-port", "2.9.5", Host, CONTROLLER),
                    step("add-controller-uuid", "2.9.43", Database, database_master),
                ],
                "duplicate step id \"add-controller-uuid\" at registry positions 0 and 2: \
                 a step id is a checkpoint key, give each step its own id",
            ),
            (
                vec![step("beta-step", "2.9-beta1", Host, CONTROLLER)],
                "step \"beta-step\" has target version 2.9-beta1, which is not a release: \
                 use major.minor.patch without pre-release tag or build number (e.g. 2.9.1)",
            ),
            (
                vec![step("build-step", "2.9.43.1", Database, database_master)],
                "step \"build-step\" has target version 2.9.43.1, which is not a release: \
                 use major.minor.patch without pre-release tag or build number (e.g. 2.9.43)",
            ),
            (
                vec![step("zero-step", "0.0.0", Host, ALL_MACHINES)],
                "step \"zero-step\" has target version 0.0.0, which no upgrade reaches",
            ),
            (
                vec![step("db-on-controllers", "2.9.5", Database, CONTROLLER)],
                "database step \"db-on-controllers\" targets [controller]: a database step \
                 changes shared state and runs once, on the coordinator; give it exactly the \
                 target database-master, or make it a host step",
            ),
            (
                vec![step(
                    "db-everywhere",
                    "2.9.5",
                    Database,
                    &[Target::DatabaseMaster, Target::AllMachines],
                )],
                "database step \"db-everywhere\" targets [database-master, all-machines]:",
            ),
            (
                vec![step("host-on-master", "2.9.5", Host, database_master)],
                "host step \"host-on-master\" targets database-master: only database steps \
                 run on the coordinator alone; make it a database step, or target controller, \
                 host-machine or all-machines",
            ),
            (
                vec![step(
                    "host-mixed",
                    "2.9.5",
                    Host,
                    &[Target::Controller, Target::DatabaseMaster],
                )],
                "host step \"host-mixed\" targets database-master",
            ),
            (
                vec![step("host-nowhere", "2.9.5", Host, &[])],
                "host step \"host-nowhere\" has no targets: give it one or more of controller, \
                 host-machine, all-machines",
            ),
            (
                vec![step("db-nowhere", "2.9.5", Database, &[])],
                "database step \"db-nowhere\" has no targets: give it the target \
                 database-master",
            ),
            (
                vec![step(
                    "host-twice",
                    "2.9.5",
                    Host,
                    &[Target::Controller, Target::HostMachine, Target::Controller],
                )],
                "step \"host-twice\" lists target controller more than once",
            ),
            (
                vec![step(
                    "db-twice",
                    "2.9.5",
                    Database,
                    &[Target::DatabaseMaster, Target::DatabaseMaster],
                )],
                "step \"db-twice\" lists target database-master more than once",
            ),
        ];
        for (steps, expected) in cases {
            let message = StepRegistry::new(&steps).expect_err(expected).to_string();
            assert!(
                message.starts_with(expected),
                "{message:?} does not start with {expected:?}"
            );
        }
    }

    #[test]
    fn registry_is_bounded() {
        let ids: Vec<String> = (0..=STEPS_MAX).map(|i| format!("step-{i}")).collect();
        let steps: Vec<Step> = ids
            .iter()
            .map(|id| step(id, "2.9.0", StepKind::Host, ALL_MACHINES))
            .collect();
        assert_eq!(StepRegistry::new(&steps[..STEPS_MAX]).unwrap().len(), 256);
        let message = StepRegistry::new(&steps).unwrap_err().to_string();
        assert_eq!(
            message,
            "step registry has 257 steps, more than the limit of 256: retire steps whose \
             target version is older than the oldest version you support upgrading from"
        );
    }

    /// Every non-empty set of host targets, as statics (steps hold `&'static [Target]`).
    const HOST_TARGET_SETS: &[&[Target]] = &[
        &[Target::Controller],
        &[Target::HostMachine],
        &[Target::AllMachines],
        &[Target::Controller, Target::HostMachine],
        &[Target::Controller, Target::AllMachines],
        &[Target::HostMachine, Target::AllMachines],
        &[Target::AllMachines, Target::HostMachine, Target::Controller],
    ];

    const STEP_VERSIONS: &[&str] = &[
        "1.25.0", "1.25.1", "1.25.2", "2.0.0", "2.9.0", "2.9.5", "2.9.43", "2.9.44", "3.0.0",
        "3.6.1",
    ];

    fn version_strategy() -> impl Strategy<Value = Version> {
        let tag = prop::option::weighted(0.3, prop::sample::select(vec!["alpha", "beta", "rc"]));
        (
            0u32..4,
            prop::sample::select(vec![0u32, 9, 25]),
            tag,
            0u32..50,
            0u32..3,
        )
            .prop_map(|(major, minor, tag, patch, build)| Version {
                major,
                minor,
                tag: tag.and_then(crate::version::Tag::new),
                patch,
                build,
            })
    }

    fn steps_strategy() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            (
                prop::sample::select(STEP_VERSIONS.to_vec()),
                any::<bool>(),
                0..HOST_TARGET_SETS.len(),
            ),
            0..40,
        )
        .prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (version, database, targets))| {
                    let id = format!("step-{i}");
                    if database {
                        step(&id, version, StepKind::Database, &[Target::DatabaseMaster])
                    } else {
                        step(&id, version, StepKind::Host, HOST_TARGET_SETS[targets])
                    }
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn plans_obey_the_rule(
            steps in steps_strategy(),
            from in version_strategy(),
            running in version_strategy(),
            controller in any::<bool>(),
            host_machine in any::<bool>(),
            coordinator in any::<bool>(),
        ) {
            let registry = StepRegistry::new(&steps).unwrap();
            let mut roles = Roles::NONE;
            if controller { roles = roles.with(Role::Controller); }
            if host_machine { roles = roles.with(Role::HostMachine); }
            let planned = plan(&registry, from, running, roles, coordinator);
            let to = running.without_tag_and_build();

            let mut seen = Vec::new();
            for (list, kind) in [(planned.database(), StepKind::Database),
                                 (planned.host(), StepKind::Host)] {
                for index in list {
                    let step = registry.step(*index);
                    prop_assert_eq!(step.kind, kind);
                    prop_assert!(from < step.target_version && step.target_version <= to,
                        "{} at {} planned for {} -> {}", step.id, step.target_version, from, running);
                    prop_assert!(!seen.contains(index), "{} planned twice", step.id);
                    seen.push(*index);
                }
                let versions: Vec<Version> =
                    list.iter().map(|index| registry.step(*index).target_version).collect();
                prop_assert!(versions.windows(2).all(|pair| pair[0] <= pair[1]));
            }
            if !(coordinator && controller) {
                prop_assert!(planned.database().is_empty());
            }
            if from >= running {
                prop_assert!(planned.is_empty());
            }

            // Completeness: an independent, naive reading of the rule gives the same lists.
            let for_this_agent = |step: &Step| match step.kind {
                StepKind::Database => coordinator && controller,
                StepKind::Host => step.targets.iter().any(|target| match target {
                    Target::Controller => controller,
                    Target::HostMachine => host_machine,
                    Target::AllMachines => true,
                    Target::DatabaseMaster => false,
                }),
            };
            let mut expected: Vec<(Version, usize)> = steps
                .iter()
                .enumerate()
                .filter(|(_, step)| from < running
                    && from < step.target_version
                    && step.target_version <= to
                    && for_this_agent(step))
                .map(|(i, step)| (step.target_version, i))
                .collect();
            expected.sort();
            let expected_database: Vec<StepIndex> = expected.iter()
                .filter(|(_, i)| steps[*i].kind == StepKind::Database)
                .map(|(_, i)| StepIndex(*i as u16)).collect();
            let expected_host: Vec<StepIndex> = expected.iter()
                .filter(|(_, i)| steps[*i].kind == StepKind::Host)
                .map(|(_, i)| StepIndex(*i as u16)).collect();
            prop_assert_eq!(planned.database(), &expected_database[..]);
            prop_assert_eq!(planned.host(), &expected_host[..]);
        }
    }
}
