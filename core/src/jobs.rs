//! Roles × environment capabilities → the jobs the API reports (seed 004).
//!
//! Juju gave every machine a list of *jobs* (`JobHostUnits`, `JobManageEnviron`, later
//! `JobManageModel`, ...) and stored that list on the machine. Seed 004 (William Reade and
//! Andrew Wilkins, juju-dev, September 2013) points out what goes wrong: a fact about the
//! *environment* ("this cloud lets Juju manage firewalls") ends up tacked onto particular
//! machines, so a newer version that learns a new fact has to rewrite every machine, and an
//! older client can still write a machine with an old, incomplete set of jobs. Their cure,
//! which Juju never built and lockstep does:
//!
//! - a machine stores its [`Roles`] (`controller`, `host-machine`): what it is for;
//! - the model stores the environment's [`Capabilities`] (`manage-firewall`,
//!   `manage-networking`), reported by the environment provider at bootstrap and discovered
//!   again at the end of every upgrade;
//! - the API reports *jobs*, derived from both by one [`JobTable`] on every report and never
//!   stored, so when a newer provider reports a new capability every machine's jobs change
//!   with no per-machine migration;
//! - a machine stored with jobs only (written by an older version or an older client) is
//!   reported with its jobs as stored, plus the jobs its equivalent roles imply
//!   ([`roles_for_legacy_jobs`]), until an upgrade step migrates it.
//!
//! The embedder supplies the table (`CONTRACT.md`: "The embedder supplies ... the
//! capabilities→jobs table"), so a [`Job`] is an open, validated name rather than a closed
//! enum; lockstep's own table is [`JobTable::lockstep`], and `spec/jobs.md` holds the same
//! table as data that the tests compare with the code.
//!
//! Job names are Juju's wire names (`multiwatcher.MachineJob` / `params.MachineJob`):
//! `JobHostUnits`, `JobManageModel` (Juju ≥ 2.0), `JobManageEnviron` (its Juju 1.x name),
//! `JobManageNetworking` (Juju 1.2x), and `JobManageState`, deprecated in Juju 1.18 but still
//! carried by old stored machines. `JobManageFirewall` is the seed's example of a job that
//! should come from a capability; Juju itself never had it.
//!
//! Every collection here is bounded: [`Capabilities::COUNT_MAX`], [`JobTable::RULES_MAX`],
//! [`JobTable::JOBS_MAX`], [`LegacyJobs::COUNT_MAX`] and [`Jobs::COUNT_MAX`], chosen so that
//! [`reported_jobs`] can never overflow the set it returns.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use crate::role::{Role, Roles};

/// A machine job as the API reports it, e.g. `JobHostUnits`: Juju's `MachineJob`.
///
/// A valid name matches `Job[A-Z][A-Za-z]*` and has at most [`Job::NAME_LENGTH_MAX`]
/// characters. The name is open: an embedder's table may report jobs lockstep does not know.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Job(Cow<'static, str>);

impl Job {
    /// Longest job name accepted; Juju's longest is `JobManageNetworking` (19 characters).
    pub const NAME_LENGTH_MAX: usize = 64;

    /// `JobHostUnits`: the machine runs units of applications (role `host-machine`).
    pub const HOST_UNITS: Job = Job(Cow::Borrowed("JobHostUnits"));
    /// `JobManageModel`: the machine runs the controller (role `controller`). Juju ≥ 2.0.
    pub const MANAGE_MODEL: Job = Job(Cow::Borrowed("JobManageModel"));
    /// `JobManageNetworking`: in Juju 1.2x, the machine agent may configure its own host's
    /// networking. Reported for `host-machine` when the environment has `manage-networking`.
    pub const MANAGE_NETWORKING: Job = Job(Cow::Borrowed("JobManageNetworking"));
    /// `JobManageFirewall`: the controller runs the firewaller. Seed 004's example of a job
    /// that follows from a capability (`manage-firewall`); not a Juju job.
    pub const MANAGE_FIREWALL: Job = Job(Cow::Borrowed("JobManageFirewall"));
    /// `JobManageEnviron`: Juju 1.x's name for `JobManageModel`; only on legacy machines.
    pub const MANAGE_ENVIRON: Job = Job(Cow::Borrowed("JobManageEnviron"));
    /// `JobManageState`: deprecated in Juju 1.18 (its state server became part of
    /// `JobManageEnviron`); only on legacy machines.
    pub const MANAGE_STATE: Job = Job(Cow::Borrowed("JobManageState"));

    /// Validates `name` (`Job[A-Z][A-Za-z]*`, at most [`Job::NAME_LENGTH_MAX`] characters).
    /// A `&'static str` is kept without allocating.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Result<Job, JobsError> {
        let name = name.into();
        if !job_name_is_valid(&name) {
            return Err(JobsError::InvalidJob {
                name: name.into_owned(),
            });
        }
        Ok(Job(name))
    }

    /// The wire name, e.g. `JobHostUnits`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Job {
    type Err = JobsError;
    fn from_str(name: &str) -> Result<Job, JobsError> {
        Job::new(name.to_owned())
    }
}

impl serde::Serialize for Job {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Job {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Job, D::Error> {
        let name = String::deserialize(deserializer)?;
        Job::new(name).map_err(serde::de::Error::custom)
    }
}

/// `Job[A-Z][A-Za-z]*`, 4..=[`Job::NAME_LENGTH_MAX`] bytes. `const` so that the associated
/// constants are checked at compile time (see the assertions below).
const fn job_name_is_valid(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.len() < 4 || bytes.len() > Job::NAME_LENGTH_MAX {
        return false;
    }
    if bytes[0] != b'J' || bytes[1] != b'o' || bytes[2] != b'b' || !bytes[3].is_ascii_uppercase() {
        return false;
    }
    let mut index = 4;
    while index < bytes.len() {
        if !bytes[index].is_ascii_alphabetic() {
            return false;
        }
        index += 1;
    }
    true
}

/// An environment capability, e.g. `manage-firewall`: a named fact the environment provider
/// reports about the cloud, stored on the model (never on a machine).
///
/// A valid name is lowercase kebab case: `[a-z][a-z0-9]*(-[a-z0-9]+)*`, at most
/// [`Capability::NAME_LENGTH_MAX`] characters.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Capability(Cow<'static, str>);

impl Capability {
    /// Longest capability name accepted.
    pub const NAME_LENGTH_MAX: usize = 64;

    /// `manage-firewall`: Juju may open and close ports in the cloud's firewall.
    pub const MANAGE_FIREWALL: Capability = Capability(Cow::Borrowed("manage-firewall"));
    /// `manage-networking`: machine agents may configure their own host's networking.
    pub const MANAGE_NETWORKING: Capability = Capability(Cow::Borrowed("manage-networking"));

    /// Validates `name` (lowercase kebab case, at most [`Capability::NAME_LENGTH_MAX`]
    /// characters). A `&'static str` is kept without allocating.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Result<Capability, JobsError> {
        let name = name.into();
        if !capability_name_is_valid(&name) {
            return Err(JobsError::InvalidCapability {
                name: name.into_owned(),
            });
        }
        Ok(Capability(name))
    }

    /// The name, e.g. `manage-firewall`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Capability {
    type Err = JobsError;
    fn from_str(name: &str) -> Result<Capability, JobsError> {
        Capability::new(name.to_owned())
    }
}

impl serde::Serialize for Capability {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Capability {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Capability, D::Error> {
        let name = String::deserialize(deserializer)?;
        Capability::new(name).map_err(serde::de::Error::custom)
    }
}

/// `[a-z][a-z0-9]*(-[a-z0-9]+)*`, 1..=[`Capability::NAME_LENGTH_MAX`] bytes.
const fn capability_name_is_valid(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > Capability::NAME_LENGTH_MAX {
        return false;
    }
    if !bytes[0].is_ascii_lowercase() || bytes[bytes.len() - 1] == b'-' {
        return false;
    }
    let mut index = 1;
    while index < bytes.len() {
        let byte = bytes[index];
        let hyphen_pair = byte == b'-' && bytes[index - 1] == b'-';
        if hyphen_pair || !(byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-') {
            return false;
        }
        index += 1;
    }
    true
}

// Every name lockstep ships is valid: checked when the crate compiles.
const _: () = {
    assert!(job_name_is_valid("JobHostUnits"));
    assert!(job_name_is_valid("JobManageModel"));
    assert!(job_name_is_valid("JobManageNetworking"));
    assert!(job_name_is_valid("JobManageFirewall"));
    assert!(job_name_is_valid("JobManageEnviron"));
    assert!(job_name_is_valid("JobManageState"));
    assert!(capability_name_is_valid("manage-firewall"));
    assert!(capability_name_is_valid("manage-networking"));
    // reported_jobs unions at most a legacy machine's jobs and the table's jobs.
    assert!(Jobs::COUNT_MAX == LegacyJobs::COUNT_MAX + JobTable::JOBS_MAX);
};

/// The environment's capabilities: a set, iterated in name order, of at most
/// [`Capabilities::COUNT_MAX`] names. Stored on the model; written at bootstrap and
/// replaced at the end of every upgrade.
///
/// Name order makes the set canonical: two providers that report the same capabilities in a
/// different order produce equal sets and the same serialised form.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// Sorted, no duplicates, at most `COUNT_MAX`.
    names: Vec<Capability>,
}

impl Capabilities {
    /// Most capabilities one environment may report. Real providers report a handful.
    pub const COUNT_MAX: usize = 32;

    /// The empty set: an environment whose provider reports nothing.
    pub const fn new() -> Capabilities {
        Capabilities { names: Vec::new() }
    }

    /// Builds the set from what the provider reported; duplicates are ignored. Fails when
    /// more than [`Capabilities::COUNT_MAX`] distinct names are reported.
    pub fn from_capabilities(
        capabilities: impl IntoIterator<Item = Capability>,
    ) -> Result<Capabilities, JobsError> {
        let mut set = Capabilities::new();
        for capability in capabilities {
            set.insert(capability)?;
        }
        Ok(set)
    }

    /// Adds `capability`; `Ok(false)` if it was already present.
    pub fn insert(&mut self, capability: Capability) -> Result<bool, JobsError> {
        match self.names.binary_search(&capability) {
            Ok(_) => Ok(false),
            Err(_) if self.names.len() == Capabilities::COUNT_MAX => {
                Err(JobsError::TooManyCapabilities {
                    rejected: capability,
                })
            }
            Err(index) => {
                self.names.insert(index, capability);
                debug_assert!(self.names.windows(2).all(|pair| pair[0] < pair[1]));
                Ok(true)
            }
        }
    }

    /// True if the environment has `capability`.
    pub fn contains(&self, capability: &Capability) -> bool {
        self.names.binary_search(capability).is_ok()
    }

    /// True if every capability of `self` is in `other`.
    pub fn is_subset(&self, other: &Capabilities) -> bool {
        self.names
            .iter()
            .all(|capability| other.contains(capability))
    }

    /// The capabilities, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.names.iter()
    }

    /// How many capabilities.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when the provider reported none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.names.iter().map(Capability::as_str))
            .finish()
    }
}

impl serde::Serialize for Capabilities {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Capabilities {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Capabilities, D::Error> {
        let names = Vec::<Capability>::deserialize(deserializer)?;
        Capabilities::from_capabilities(names).map_err(serde::de::Error::custom)
    }
}

/// The jobs a machine reports: a set in a stable order (first appearance), of at most
/// [`Jobs::COUNT_MAX`] jobs.
///
/// The order is meaningful: a legacy machine's stored jobs come first, as stored, then the
/// jobs its roles imply in table order; a machine with roles reports jobs in table order.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Jobs {
    /// No duplicates, at most `COUNT_MAX`.
    jobs: Vec<Job>,
}

impl Jobs {
    /// Most jobs one machine may report: a legacy machine's stored jobs plus every job the
    /// table can produce.
    pub const COUNT_MAX: usize = 32;

    /// No jobs.
    pub const fn new() -> Jobs {
        Jobs { jobs: Vec::new() }
    }

    /// Appends `job` unless present; `Ok(false)` if it was already there.
    pub fn insert(&mut self, job: Job) -> Result<bool, JobsError> {
        if self.contains(&job) {
            return Ok(false);
        }
        if self.jobs.len() == Jobs::COUNT_MAX {
            return Err(JobsError::TooManyJobs { rejected: job });
        }
        self.jobs.push(job);
        Ok(true)
    }

    /// Appends `job` unless present, where the limits guarantee it fits.
    fn insert_within_limit(&mut self, job: &Job) {
        if !self.contains(job) {
            assert!(
                self.jobs.len() < Jobs::COUNT_MAX,
                "Jobs::COUNT_MAX exceeded"
            );
            self.jobs.push(job.clone());
        }
    }

    /// True if `job` is reported.
    pub fn contains(&self, job: &Job) -> bool {
        self.jobs.contains(job)
    }

    /// True if every job of `other` is in `self` (order aside).
    pub fn is_superset(&self, other: &Jobs) -> bool {
        other.jobs.iter().all(|job| self.contains(job))
    }

    /// The jobs, in order.
    pub fn as_slice(&self) -> &[Job] {
        &self.jobs
    }

    /// The jobs, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Job> {
        self.jobs.iter()
    }

    /// How many jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// True when the machine has no job.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

impl fmt::Debug for Jobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.jobs.iter().map(Job::as_str))
            .finish()
    }
}

impl serde::Serialize for Jobs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.jobs.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Jobs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Jobs, D::Error> {
        let list = Vec::<Job>::deserialize(deserializer)?;
        let mut jobs = Jobs::new();
        for job in list {
            jobs.insert(job).map_err(serde::de::Error::custom)?;
        }
        Ok(jobs)
    }
}

/// One row of a [`JobTable`]: a machine with `role` gets `job`, when the environment has
/// `capability` (always, when `capability` is `None`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct JobRule {
    /// The role the machine must have.
    pub role: Role,
    /// The capability the environment must have; `None`: no capability needed.
    pub capability: Option<Capability>,
    /// The job reported when both hold.
    pub job: Job,
}

impl fmt::Display for JobRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.capability {
            None => write!(f, "{} -> {}", self.role, self.job),
            Some(capability) => write!(f, "{} + {} -> {}", self.role, capability, self.job),
        }
    }
}

/// Roles × capabilities → jobs: the one table the API derives every machine's jobs from.
///
/// Rules are kept in the order given; a machine's jobs follow that order. At most
/// [`JobTable::RULES_MAX`] rules naming at most [`JobTable::JOBS_MAX`] distinct jobs, no
/// rule twice.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct JobTable {
    rules: Vec<JobRule>,
}

impl JobTable {
    /// Most rules a table may have.
    pub const RULES_MAX: usize = 64;
    /// Most distinct jobs a table may name.
    pub const JOBS_MAX: usize = 16;

    /// Validates an embedder's table: at most [`JobTable::RULES_MAX`] rules, at most
    /// [`JobTable::JOBS_MAX`] distinct jobs, no rule twice.
    pub fn new(rules: Vec<JobRule>) -> Result<JobTable, JobsError> {
        if rules.len() > JobTable::RULES_MAX {
            return Err(JobsError::TooManyRules { count: rules.len() });
        }
        let mut jobs: Vec<&Job> = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            if rules[..index].contains(rule) {
                return Err(JobsError::DuplicateRule { rule: rule.clone() });
            }
            if !jobs.contains(&&rule.job) {
                if jobs.len() == JobTable::JOBS_MAX {
                    return Err(JobsError::TooManyTableJobs {
                        rejected: rule.job.clone(),
                    });
                }
                jobs.push(&rule.job);
            }
        }
        Ok(JobTable { rules })
    }

    /// lockstep's own table (also in `spec/jobs.md`, which a test compares with this):
    ///
    /// | role | capability | job |
    /// |---|---|---|
    /// | `host-machine` | (always) | `JobHostUnits` |
    /// | `controller` | (always) | `JobManageModel` |
    /// | `host-machine` | `manage-networking` | `JobManageNetworking` |
    /// | `controller` | `manage-firewall` | `JobManageFirewall` |
    pub fn lockstep() -> JobTable {
        let rule = |role, capability, job| JobRule {
            role,
            capability,
            job,
        };
        JobTable::new(vec![
            rule(Role::HostMachine, None, Job::HOST_UNITS),
            rule(Role::Controller, None, Job::MANAGE_MODEL),
            rule(
                Role::HostMachine,
                Some(Capability::MANAGE_NETWORKING),
                Job::MANAGE_NETWORKING,
            ),
            rule(
                Role::Controller,
                Some(Capability::MANAGE_FIREWALL),
                Job::MANAGE_FIREWALL,
            ),
        ])
        .expect("lockstep's job table is within limits and has no duplicate rule")
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[JobRule] {
        &self.rules
    }

    /// The jobs of a machine with `roles` in an environment with `capabilities`, in table
    /// order: every rule whose role the machine has and whose capability (if any) the
    /// environment has.
    pub fn jobs_for(&self, roles: Roles, capabilities: &Capabilities) -> Jobs {
        let mut jobs = Jobs::new();
        for rule in &self.rules {
            let capable = rule
                .capability
                .as_ref()
                .is_none_or(|capability| capabilities.contains(capability));
            if roles.contains(rule.role) && capable {
                jobs.insert_within_limit(&rule.job);
            }
        }
        assert!(jobs.len() <= JobTable::JOBS_MAX);
        jobs
    }
}

/// Juju's legacy jobs and the role each implies, in the order `spec/jobs.md` lists them.
/// A job not listed implies no role.
pub const LEGACY_JOB_ROLES: [(Job, Role); 6] = [
    (Job::HOST_UNITS, Role::HostMachine),
    (Job::MANAGE_MODEL, Role::Controller),
    (Job::MANAGE_ENVIRON, Role::Controller),
    (Job::MANAGE_STATE, Role::Controller),
    (Job::MANAGE_NETWORKING, Role::HostMachine),
    (Job::MANAGE_FIREWALL, Role::Controller),
];

/// The roles equivalent to a legacy machine's stored jobs ([`LEGACY_JOB_ROLES`]): what an
/// upgrade step would store as the machine's roles when it migrates it. Unknown jobs imply no
/// role.
pub fn roles_for_legacy_jobs(jobs: &[Job]) -> Roles {
    jobs.iter().fold(Roles::NONE, |roles, job| {
        match LEGACY_JOB_ROLES.iter().find(|(legacy, _)| legacy == job) {
            Some(&(_, role)) => roles.with(role),
            None => roles,
        }
    })
}

/// A legacy machine's stored jobs, as stored (order and duplicates kept), at most
/// [`LegacyJobs::COUNT_MAX`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LegacyJobs<'a> {
    jobs: &'a [Job],
}

impl<'a> LegacyJobs<'a> {
    /// Most jobs read from one legacy machine document. Juju never gave a machine more
    /// than four.
    pub const COUNT_MAX: usize = 16;

    /// Checks the bound; the error names the first job past it.
    pub fn new(jobs: &'a [Job]) -> Result<LegacyJobs<'a>, JobsError> {
        if jobs.len() > LegacyJobs::COUNT_MAX {
            return Err(JobsError::TooManyLegacyJobs {
                count: jobs.len(),
                first_excess: jobs[LegacyJobs::COUNT_MAX].clone(),
            });
        }
        Ok(LegacyJobs { jobs })
    }

    /// The stored jobs, as stored.
    pub fn as_slice(&self) -> &'a [Job] {
        self.jobs
    }
}

/// How a machine is stored: with roles (written by this version) or with jobs only (written
/// by an older version or an older client).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoredMachine<'a> {
    /// A machine document with roles; any jobs it also carries are ignored.
    Roles(Roles),
    /// A machine document with legacy jobs only.
    LegacyJobs(LegacyJobs<'a>),
}

impl<'a> StoredMachine<'a> {
    /// Classifies a machine document by its two fields, as seed 004 proposes: "the result of
    /// roles+envcaps if roles are present", "jobs+tweaks if only jobs are present". A
    /// document with no roles and no jobs is a legacy machine with no job.
    pub fn from_fields(
        roles: Roles,
        legacy_jobs: &'a [Job],
    ) -> Result<StoredMachine<'a>, JobsError> {
        if roles.is_empty() {
            Ok(StoredMachine::LegacyJobs(LegacyJobs::new(legacy_jobs)?))
        } else {
            Ok(StoredMachine::Roles(roles))
        }
    }
}

/// The jobs the API reports for `machine` in an environment with `capabilities`.
///
/// - A machine with roles: exactly `table`'s jobs for its roles and the capabilities.
/// - A legacy machine: its stored jobs as stored (duplicates dropped), then the jobs its
///   equivalent roles ([`roles_for_legacy_jobs`]) imply, each job once.
///
/// Nothing here reads or writes the machine's stored data: when the capabilities change
/// (re-discovered at the end of an upgrade), every machine's reported jobs change with them.
pub fn reported_jobs(
    table: &JobTable,
    machine: StoredMachine<'_>,
    capabilities: &Capabilities,
) -> Jobs {
    match machine {
        StoredMachine::Roles(roles) => table.jobs_for(roles, capabilities),
        StoredMachine::LegacyJobs(legacy) => {
            let stored = legacy.as_slice();
            let roles = roles_for_legacy_jobs(stored);
            let mut jobs = Jobs::new();
            for job in stored {
                jobs.insert_within_limit(job);
            }
            for job in table.jobs_for(roles, capabilities).iter() {
                jobs.insert_within_limit(job);
            }
            debug_assert!(stored.iter().all(|job| jobs.contains(job)));
            jobs
        }
    }
}

/// A job table, capability, job or machine document that lockstep refuses.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum JobsError {
    /// A job name that is not `Job[A-Z][A-Za-z]*` of at most [`Job::NAME_LENGTH_MAX`].
    InvalidJob {
        /// The offending name, verbatim.
        name: String,
    },
    /// A capability name that is not lowercase kebab case of at most
    /// [`Capability::NAME_LENGTH_MAX`].
    InvalidCapability {
        /// The offending name, verbatim.
        name: String,
    },
    /// More than [`Capabilities::COUNT_MAX`] distinct capabilities.
    TooManyCapabilities {
        /// The capability that did not fit.
        rejected: Capability,
    },
    /// More than [`Jobs::COUNT_MAX`] jobs.
    TooManyJobs {
        /// The job that did not fit.
        rejected: Job,
    },
    /// A job table with more than [`JobTable::RULES_MAX`] rules.
    TooManyRules {
        /// How many rules were given.
        count: usize,
    },
    /// A job table naming more than [`JobTable::JOBS_MAX`] distinct jobs.
    TooManyTableJobs {
        /// The first job past the limit.
        rejected: Job,
    },
    /// A job table with the same rule twice.
    DuplicateRule {
        /// The repeated rule.
        rule: JobRule,
    },
    /// A legacy machine document with more than [`LegacyJobs::COUNT_MAX`] jobs.
    TooManyLegacyJobs {
        /// How many jobs the document stores.
        count: usize,
        /// The first job past the limit.
        first_excess: Job,
    },
}

impl fmt::Display for JobsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobsError::InvalidJob { name } => write!(
                f,
                "invalid job {name:?}: a job is \"Job\" followed by an upper-case letter and \
                 letters only, at most {} characters (e.g. JobHostUnits); correct the job \
                 table or the machine document that carries it",
                Job::NAME_LENGTH_MAX
            ),
            JobsError::InvalidCapability { name } => write!(
                f,
                "invalid capability {name:?}: a capability is 1 to {} lower-case letters, \
                 digits and single hyphens, starting with a letter (e.g. manage-firewall); \
                 correct what the environment provider reports",
                Capability::NAME_LENGTH_MAX
            ),
            JobsError::TooManyCapabilities { rejected } => write!(
                f,
                "cannot add capability {:?}: an environment has at most {} capabilities; \
                 the provider reports too many, report fewer",
                rejected.as_str(),
                Capabilities::COUNT_MAX
            ),
            JobsError::TooManyJobs { rejected } => write!(
                f,
                "cannot add job {:?}: a machine reports at most {} jobs",
                rejected.as_str(),
                Jobs::COUNT_MAX
            ),
            JobsError::TooManyRules { count } => write!(
                f,
                "job table has {count} rules, more than the {} allowed; merge or remove rules",
                JobTable::RULES_MAX
            ),
            JobsError::TooManyTableJobs { rejected } => write!(
                f,
                "job table names more than {} distinct jobs (job {:?} is one too many); \
                 remove jobs from the table",
                JobTable::JOBS_MAX,
                rejected.as_str()
            ),
            JobsError::DuplicateRule { rule } => {
                write!(f, "job table has the rule \"{rule}\" twice; remove one")
            }
            JobsError::TooManyLegacyJobs {
                count,
                first_excess,
            } => write!(
                f,
                "machine document stores {count} legacy jobs, more than the {} lockstep reads \
                 (job {:?} is the first past the limit); remove duplicate or unknown jobs \
                 from the document",
                LegacyJobs::COUNT_MAX,
                first_excess.as_str()
            ),
        }
    }
}

impl std::error::Error for JobsError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SPEC: &str = include_str!("../../spec/jobs.md");

    fn job(name: &'static str) -> Job {
        Job::new(name).unwrap()
    }

    fn capabilities(names: &[&'static str]) -> Capabilities {
        Capabilities::from_capabilities(names.iter().map(|&name| Capability::new(name).unwrap()))
            .unwrap()
    }

    fn names(jobs: &Jobs) -> Vec<&str> {
        jobs.iter().map(Job::as_str).collect()
    }

    fn legacy(jobs: &[Job]) -> StoredMachine<'_> {
        StoredMachine::LegacyJobs(LegacyJobs::new(jobs).unwrap())
    }

    fn report(machine: StoredMachine<'_>, names: &[&'static str]) -> Vec<String> {
        let jobs = reported_jobs(&JobTable::lockstep(), machine, &capabilities(names));
        jobs.iter().map(|job| job.as_str().to_owned()).collect()
    }

    // --- spec/jobs.md as data -------------------------------------------------------------

    /// The rows of the first markdown table after the line `heading`, header and separator
    /// skipped, cells trimmed and stripped of backticks.
    fn spec_table(heading: &str) -> Vec<Vec<String>> {
        let mut lines = SPEC.lines().skip_while(|line| line.trim() != heading);
        assert!(
            lines.next().is_some(),
            "spec/jobs.md has no heading {heading:?}"
        );
        let rows: Vec<Vec<String>> = lines
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                line.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(|cell| cell.trim().replace('`', ""))
                    .collect()
            })
            .collect();
        assert!(
            rows.len() > 2,
            "spec/jobs.md: table under {heading:?} is empty"
        );
        assert!(rows[1].iter().all(|cell| cell.starts_with("---")));
        rows[2..].to_vec()
    }

    fn parse_capability_cell(cell: &str) -> Option<Capability> {
        match cell {
            "(always)" => None,
            name => Some(name.parse().unwrap()),
        }
    }

    fn parse_list<T>(cell: &str, parse: impl Fn(&str) -> T) -> Vec<T> {
        if cell == "(none)" {
            return Vec::new();
        }
        cell.split(',').map(|item| parse(item.trim())).collect()
    }

    #[test]
    fn spec_rules_table_is_the_lockstep_table() {
        let rules = spec_table("## The table")
            .into_iter()
            .map(|row| {
                assert_eq!(row.len(), 3, "{row:?}");
                JobRule {
                    role: Role::parse(&row[0]).unwrap(),
                    capability: parse_capability_cell(&row[1]),
                    job: row[2].parse().unwrap(),
                }
            })
            .collect();
        assert_eq!(JobTable::new(rules).unwrap(), JobTable::lockstep());
    }

    #[test]
    fn spec_legacy_table_is_the_code() {
        let rows: Vec<(Job, Role)> = spec_table("## Legacy machines")
            .into_iter()
            .map(|row| {
                assert_eq!(row.len(), 2, "{row:?}");
                (row[0].parse().unwrap(), Role::parse(&row[1]).unwrap())
            })
            .collect();
        assert_eq!(rows, LEGACY_JOB_ROLES.to_vec());
        for (legacy_job, role) in rows {
            let roles = roles_for_legacy_jobs(std::slice::from_ref(&legacy_job));
            assert_eq!(roles, Roles::of(&[role]), "{legacy_job}");
        }
    }

    #[test]
    fn spec_worked_examples_hold() {
        let rows = spec_table("## Worked examples");
        assert_eq!(rows.len(), 10);
        for row in rows {
            assert_eq!(row.len(), 3, "{row:?}");
            let stored_jobs: Vec<Job>;
            let machine = match row[0].split_once(": ") {
                Some(("roles", list)) => {
                    StoredMachine::Roles(Roles::of(&parse_list(list, |name| {
                        Role::parse(name).unwrap()
                    })))
                }
                Some(("jobs", list)) => {
                    stored_jobs = parse_list(list, |name| name.parse().unwrap());
                    legacy(&stored_jobs)
                }
                _ => panic!("spec/jobs.md: bad stored machine {:?}", row[0]),
            };
            let environment = Capabilities::from_capabilities(parse_list(&row[1], |name| {
                name.parse::<Capability>().unwrap()
            }))
            .unwrap();
            let expected = parse_list(&row[2], str::to_owned);
            let jobs = reported_jobs(&JobTable::lockstep(), machine, &environment);
            assert_eq!(names(&jobs), expected, "spec/jobs.md example {row:?}");
        }
    }

    // --- machines with roles --------------------------------------------------------------

    #[test]
    fn every_role_combination_times_every_capability_subset() {
        const FIREWALL: &str = "manage-firewall";
        const NETWORKING: &str = "manage-networking";
        // `manage-storage` is a capability no rule mentions: it never changes anything.
        const OTHER: &str = "manage-storage";
        let controller = Roles::of(&[Role::Controller]);
        let host = Roles::of(&[Role::HostMachine]);
        let both = Roles::of(&[Role::Controller, Role::HostMachine]);
        #[rustfmt::skip]
        let cases: &[(Roles, &[&str], &[&str])] = &[
            (Roles::NONE, &[], &[]),
            (Roles::NONE, &[FIREWALL, NETWORKING, OTHER], &[]),
            (host, &[], &["JobHostUnits"]),
            (host, &[OTHER], &["JobHostUnits"]),
            (host, &[FIREWALL], &["JobHostUnits"]),
            (host, &[NETWORKING], &["JobHostUnits", "JobManageNetworking"]),
            (host, &[FIREWALL, NETWORKING], &["JobHostUnits", "JobManageNetworking"]),
            (host, &[FIREWALL, NETWORKING, OTHER], &["JobHostUnits", "JobManageNetworking"]),
            (controller, &[], &["JobManageModel"]),
            (controller, &[OTHER], &["JobManageModel"]),
            (controller, &[FIREWALL], &["JobManageModel", "JobManageFirewall"]),
            (controller, &[NETWORKING], &["JobManageModel"]),
            (controller, &[FIREWALL, NETWORKING], &["JobManageModel", "JobManageFirewall"]),
            (controller, &[FIREWALL, NETWORKING, OTHER], &["JobManageModel", "JobManageFirewall"]),
            (both, &[], &["JobHostUnits", "JobManageModel"]),
            (both, &[OTHER], &["JobHostUnits", "JobManageModel"]),
            (both, &[FIREWALL], &["JobHostUnits", "JobManageModel", "JobManageFirewall"]),
            (both, &[NETWORKING], &["JobHostUnits", "JobManageModel", "JobManageNetworking"]),
            (both, &[FIREWALL, NETWORKING],
                &["JobHostUnits", "JobManageModel", "JobManageNetworking", "JobManageFirewall"]),
            (both, &[OTHER, NETWORKING, FIREWALL],
                &["JobHostUnits", "JobManageModel", "JobManageNetworking", "JobManageFirewall"]),
        ];
        for &(roles, environment, expected) in cases {
            assert_eq!(
                report(StoredMachine::Roles(roles), environment),
                expected,
                "roles {roles:?}, capabilities {environment:?}"
            );
        }
    }

    #[test]
    fn roles_win_over_jobs_stored_beside_them() {
        let stored = [Job::MANAGE_STATE, job("JobRunCharms")];
        let machine = StoredMachine::from_fields(Roles::of(&[Role::HostMachine]), &stored);
        assert_eq!(
            machine,
            Ok(StoredMachine::Roles(Roles::of(&[Role::HostMachine])))
        );
        assert_eq!(report(machine.unwrap(), &[]), ["JobHostUnits"]);

        let machine = StoredMachine::from_fields(Roles::NONE, &stored).unwrap();
        assert_eq!(machine, legacy(&stored));
        assert_eq!(
            report(machine, &[]),
            ["JobManageState", "JobRunCharms", "JobManageModel"]
        );

        let machine = StoredMachine::from_fields(Roles::NONE, &[]).unwrap();
        assert!(report(machine, &["manage-firewall"]).is_empty());
    }

    // --- legacy machines ------------------------------------------------------------------

    #[test]
    fn each_legacy_job_alone() {
        #[rustfmt::skip]
        let cases: &[(Job, &[&str], &[&str])] = &[
            (Job::HOST_UNITS, &[], &["JobHostUnits"]),
            (Job::HOST_UNITS, &["manage-networking"], &["JobHostUnits", "JobManageNetworking"]),
            (Job::MANAGE_MODEL, &[], &["JobManageModel"]),
            (Job::MANAGE_MODEL, &["manage-firewall"], &["JobManageModel", "JobManageFirewall"]),
            (Job::MANAGE_ENVIRON, &[], &["JobManageEnviron", "JobManageModel"]),
            (Job::MANAGE_ENVIRON, &["manage-firewall"],
                &["JobManageEnviron", "JobManageModel", "JobManageFirewall"]),
            (Job::MANAGE_STATE, &[], &["JobManageState", "JobManageModel"]),
            (Job::MANAGE_NETWORKING, &[], &["JobManageNetworking", "JobHostUnits"]),
            (Job::MANAGE_NETWORKING, &["manage-networking"],
                &["JobManageNetworking", "JobHostUnits"]),
            (Job::MANAGE_FIREWALL, &[], &["JobManageFirewall", "JobManageModel"]),
            (Job::MANAGE_FIREWALL, &["manage-firewall"], &["JobManageFirewall", "JobManageModel"]),
        ];
        for (stored, environment, expected) in cases {
            let stored = std::slice::from_ref(stored);
            assert_eq!(report(legacy(stored), environment), *expected, "{stored:?}");
        }
    }

    #[test]
    fn legacy_mixtures_and_unknown_jobs() {
        #[rustfmt::skip]
        let cases: &[(&[&'static str], &[&str], &[&str])] = &[
            (&[], &["manage-firewall"], &[]),
            // Juju 1.16's state server: both old controller jobs, and units.
            (&["JobManageEnviron", "JobManageState", "JobHostUnits"], &[],
                &["JobManageEnviron", "JobManageState", "JobHostUnits", "JobManageModel"]),
            (&["JobHostUnits", "JobManageEnviron"], &["manage-firewall", "manage-networking"],
                &["JobHostUnits", "JobManageEnviron", "JobManageModel", "JobManageNetworking",
                  "JobManageFirewall"]),
            // Duplicates as stored are reported once, at their first position.
            (&["JobManageModel", "JobHostUnits", "JobManageModel"], &[],
                &["JobManageModel", "JobHostUnits"]),
            // Unknown jobs are kept, in place, and imply no role.
            (&["JobRunCharms"], &["manage-firewall"], &["JobRunCharms"]),
            (&["JobRunCharms", "JobHostUnits"], &[], &["JobRunCharms", "JobHostUnits"]),
            (&["JobManageState", "JobRunCharms"], &[],
                &["JobManageState", "JobRunCharms", "JobManageModel"]),
        ];
        for &(stored, environment, expected) in cases {
            let stored: Vec<Job> = stored.iter().map(|&name| job(name)).collect();
            assert_eq!(report(legacy(&stored), environment), expected, "{stored:?}");
        }
    }

    #[test]
    fn roles_for_legacy_jobs_table() {
        let controller = Roles::of(&[Role::Controller]);
        let host = Roles::of(&[Role::HostMachine]);
        let both = Roles::of(&[Role::Controller, Role::HostMachine]);
        let cases: &[(&[Job], Roles)] = &[
            (&[], Roles::NONE),
            (&[Job::HOST_UNITS], host),
            (&[Job::MANAGE_NETWORKING], host),
            (&[Job::MANAGE_MODEL], controller),
            (&[Job::MANAGE_ENVIRON], controller),
            (&[Job::MANAGE_STATE], controller),
            (&[Job::MANAGE_FIREWALL], controller),
            (&[Job::MANAGE_STATE, Job::HOST_UNITS], both),
            (&[Job(Cow::Borrowed("JobRunCharms"))], Roles::NONE),
        ];
        for (jobs, roles) in cases {
            assert_eq!(roles_for_legacy_jobs(jobs), *roles, "{jobs:?}");
        }
    }

    // --- seed 004 -------------------------------------------------------------------------

    /// Seed 004: "during subsequent upgrades we could just *always* finish by running a func
    /// that instantiates the environment, interrogates it for capabilities, and sets them in
    /// state ... when we restarted everything we'd just automatically get the right jobs for
    /// every machine". The machines below are never written; only the model's capabilities
    /// change, and every affected machine reports its new job.
    #[test]
    fn new_capability_after_upgrade_changes_jobs_without_touching_machines() {
        let table = JobTable::lockstep();
        let legacy_controller = vec![Job::MANAGE_ENVIRON, Job::MANAGE_STATE];
        let legacy_host = vec![Job::HOST_UNITS];
        let machines: [(&'static str, Roles, &[Job]); 4] = [
            ("0", Roles::of(&[Role::Controller]), &[]),
            ("1", Roles::of(&[Role::HostMachine]), &[]),
            ("2", Roles::NONE, &legacy_controller),
            ("3", Roles::NONE, &legacy_host),
        ];
        let stored_before = format!("{machines:?}");
        let report_all = |environment: &Capabilities| -> Vec<(&'static str, Vec<String>)> {
            machines
                .iter()
                .map(|&(id, roles, jobs)| {
                    let machine = StoredMachine::from_fields(roles, jobs).unwrap();
                    let reported = reported_jobs(&table, machine, environment);
                    (id, reported.iter().map(|job| job.to_string()).collect())
                })
                .collect()
        };
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        // Bootstrap: the old provider reports manage-networking only.
        let mut environment = capabilities(&["manage-networking"]);
        assert_eq!(
            report_all(&environment),
            [
                ("0", strings(&["JobManageModel"])),
                ("1", strings(&["JobHostUnits", "JobManageNetworking"])),
                (
                    "2",
                    strings(&["JobManageEnviron", "JobManageState", "JobManageModel"])
                ),
                ("3", strings(&["JobHostUnits", "JobManageNetworking"])),
            ]
        );

        // End of the upgrade: the new provider also reports manage-firewall.
        assert_eq!(environment.insert(Capability::MANAGE_FIREWALL), Ok(true));
        assert_eq!(
            report_all(&environment),
            [
                ("0", strings(&["JobManageModel", "JobManageFirewall"])),
                ("1", strings(&["JobHostUnits", "JobManageNetworking"])),
                (
                    "2",
                    strings(&[
                        "JobManageEnviron",
                        "JobManageState",
                        "JobManageModel",
                        "JobManageFirewall"
                    ])
                ),
                ("3", strings(&["JobHostUnits", "JobManageNetworking"])),
            ]
        );
        assert_eq!(format!("{machines:?}"), stored_before);
    }

    // --- validation -----------------------------------------------------------------------

    #[test]
    fn job_names() {
        for valid in ["JobHostUnits", "JobX", "JobManageModel", "JobRunCharms"] {
            assert_eq!(job(valid).as_str(), valid);
        }
        let too_long = format!("Job{}", "A".repeat(62));
        assert_eq!(too_long.len(), 65);
        assert!(Job::new(too_long[..64].to_owned()).is_ok());
        for invalid in [
            "",
            "Job",
            "job",
            "JobhostUnits",
            "jobHostUnits",
            "HostUnits",
            "Job Host",
            "JobHost-Units",
            "JobHost2",
            "JobÄrger",
            too_long.as_str(),
        ] {
            let error = invalid.parse::<Job>().unwrap_err();
            assert_eq!(
                error,
                JobsError::InvalidJob {
                    name: invalid.to_owned()
                }
            );
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("invalid job {invalid:?}: ")),
                "{error}"
            );
        }
        assert_eq!(
            Job::new("jobHostUnits").unwrap_err().to_string(),
            "invalid job \"jobHostUnits\": a job is \"Job\" followed by an upper-case letter \
             and letters only, at most 64 characters (e.g. JobHostUnits); correct the job \
             table or the machine document that carries it"
        );
    }

    #[test]
    fn capability_names() {
        for valid in ["manage-firewall", "a", "ipv6", "manage-l2-networking", "x9"] {
            assert_eq!(Capability::new(valid).unwrap().as_str(), valid);
        }
        let too_long = "a".repeat(65);
        assert!(Capability::new(too_long[..64].to_owned()).is_ok());
        for invalid in [
            "",
            "Manage-firewall",
            "manage_firewall",
            "manage firewall",
            "-manage",
            "manage-",
            "manage--firewall",
            "9lives",
            "manage-firewalL",
            too_long.as_str(),
        ] {
            let error = invalid.parse::<Capability>().unwrap_err();
            assert_eq!(
                error,
                JobsError::InvalidCapability {
                    name: invalid.to_owned()
                }
            );
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("invalid capability {invalid:?}: ")),
                "{error}"
            );
        }
        assert_eq!(
            Capability::new("Manage-Firewall").unwrap_err().to_string(),
            "invalid capability \"Manage-Firewall\": a capability is 1 to 64 lower-case \
             letters, digits and single hyphens, starting with a letter (e.g. \
             manage-firewall); correct what the environment provider reports"
        );
    }

    #[test]
    fn capabilities_are_a_bounded_sorted_set() {
        let mut set = capabilities(&["manage-networking", "manage-firewall", "manage-firewall"]);
        assert_eq!(
            format!("{set:?}"),
            r#"{"manage-firewall", "manage-networking"}"#
        );
        assert_eq!(set.len(), 2);
        assert_eq!(set, capabilities(&["manage-firewall", "manage-networking"]));
        assert_eq!(set.insert(Capability::MANAGE_FIREWALL), Ok(false));
        for index in 2..Capabilities::COUNT_MAX {
            assert_eq!(
                set.insert(Capability::new(format!("c{index}")).unwrap()),
                Ok(true)
            );
        }
        assert_eq!(set.len(), Capabilities::COUNT_MAX);
        // A duplicate still "fits" at the limit; a new name does not.
        assert_eq!(set.insert(Capability::new("c2").unwrap()), Ok(false));
        let error = set.insert(Capability::new("zeta").unwrap()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot add capability \"zeta\": an environment has at most 32 capabilities; \
             the provider reports too many, report fewer"
        );
        assert!(!set.contains(&Capability::new("zeta").unwrap()));
    }

    #[test]
    fn jobs_are_a_bounded_ordered_set() {
        let mut jobs = Jobs::new();
        assert_eq!(jobs.insert(Job::MANAGE_MODEL), Ok(true));
        assert_eq!(jobs.insert(Job::HOST_UNITS), Ok(true));
        assert_eq!(jobs.insert(Job::MANAGE_MODEL), Ok(false));
        assert_eq!(format!("{jobs:?}"), r#"["JobManageModel", "JobHostUnits"]"#);
        let letters = ('A'..='Z').chain('a'..='z');
        for letter in letters.take(Jobs::COUNT_MAX - 2) {
            assert_eq!(
                jobs.insert(Job::new(format!("JobX{letter}")).unwrap()),
                Ok(true)
            );
        }
        assert_eq!(jobs.len(), Jobs::COUNT_MAX);
        let error = jobs.insert(job("JobOneTooMany")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot add job \"JobOneTooMany\": a machine reports at most 32 jobs"
        );
    }

    #[test]
    fn table_limits_and_duplicates() {
        let rule = |name: String| JobRule {
            role: Role::Controller,
            capability: None,
            job: Job::new(name).unwrap(),
        };
        let letters: Vec<char> = ('A'..='Z').chain('a'..='z').collect();

        let duplicate = vec![
            rule("JobA".into()),
            JobRule {
                role: Role::HostMachine,
                capability: Some(Capability::MANAGE_NETWORKING),
                job: Job::MANAGE_NETWORKING,
            },
            rule("JobB".into()),
            JobRule {
                role: Role::HostMachine,
                capability: Some(Capability::MANAGE_NETWORKING),
                job: Job::MANAGE_NETWORKING,
            },
        ];
        assert_eq!(
            JobTable::new(duplicate).unwrap_err().to_string(),
            "job table has the rule \"host-machine + manage-networking -> \
             JobManageNetworking\" twice; remove one"
        );

        let sixteen: Vec<JobRule> = letters[..16]
            .iter()
            .map(|letter| rule(format!("Job{letter}")))
            .collect();
        let table = JobTable::new(sixteen.clone()).unwrap();
        let jobs = table.jobs_for(Roles::of(&[Role::Controller]), &Capabilities::new());
        assert_eq!(jobs.len(), JobTable::JOBS_MAX);

        let mut seventeen = sixteen;
        seventeen.push(rule("JobQ".into()));
        assert_eq!(
            JobTable::new(seventeen).unwrap_err(),
            JobsError::TooManyTableJobs {
                rejected: job("JobQ")
            }
        );

        // Many rules may share few jobs, up to RULES_MAX.
        let shared: Vec<JobRule> = (0..JobTable::RULES_MAX)
            .map(|index| JobRule {
                role: Role::ALL[index % 2],
                capability: Some(Capability::new(format!("c{index}")).unwrap()),
                job: Job::HOST_UNITS,
            })
            .collect();
        let mut too_many = shared.clone();
        assert!(JobTable::new(shared).is_ok());
        too_many.push(rule("JobA".into()));
        assert_eq!(
            JobTable::new(too_many).unwrap_err().to_string(),
            "job table has 65 rules, more than the 64 allowed; merge or remove rules"
        );
    }

    #[test]
    fn legacy_document_bound() {
        let stored: Vec<Job> = ('A'..='Q')
            .map(|letter| Job::new(format!("Job{letter}")).unwrap())
            .collect();
        assert_eq!(stored.len(), LegacyJobs::COUNT_MAX + 1);
        assert!(LegacyJobs::new(&stored[..LegacyJobs::COUNT_MAX]).is_ok());
        let error = StoredMachine::from_fields(Roles::NONE, &stored).unwrap_err();
        assert_eq!(
            error.to_string(),
            "machine document stores 17 legacy jobs, more than the 16 lockstep reads (job \
             \"JobQ\" is the first past the limit); remove duplicate or unknown jobs from the \
             document"
        );
        // The bound applies only to legacy machines: roles win, jobs are not read.
        assert!(StoredMachine::from_fields(Roles::of(&[Role::Controller]), &stored).is_ok());

        // The largest legacy machine and the largest table still fit in Jobs::COUNT_MAX.
        let table = JobTable::new(
            ('a'..='p')
                .map(|letter| JobRule {
                    role: Role::Controller,
                    capability: None,
                    job: Job::new(format!("JobT{letter}")).unwrap(),
                })
                .collect(),
        )
        .unwrap();
        let stored = &stored[..LegacyJobs::COUNT_MAX - 1];
        let mut stored = stored.to_vec();
        stored.push(Job::MANAGE_MODEL);
        let jobs = reported_jobs(&table, legacy(&stored), &Capabilities::new());
        assert_eq!(jobs.len(), Jobs::COUNT_MAX);
        assert_eq!(jobs.as_slice()[..16], stored[..]);
    }

    #[test]
    fn serde_round_trips_and_validates() {
        let environment = capabilities(&["manage-networking", "manage-firewall"]);
        let text = serde_json::to_string(&environment).unwrap();
        assert_eq!(text, r#"["manage-firewall","manage-networking"]"#);
        assert_eq!(
            serde_json::from_str::<Capabilities>(&text).unwrap(),
            environment
        );
        let error = serde_json::from_str::<Capabilities>(r#"["ok","Not-Ok"]"#).unwrap_err();
        assert!(error.to_string().contains("\"Not-Ok\""), "{error}");

        let jobs = reported_jobs(
            &JobTable::lockstep(),
            legacy(&[Job::MANAGE_ENVIRON]),
            &environment,
        );
        let text = serde_json::to_string(&jobs).unwrap();
        assert_eq!(
            text,
            r#"["JobManageEnviron","JobManageModel","JobManageFirewall"]"#
        );
        assert_eq!(serde_json::from_str::<Jobs>(&text).unwrap(), jobs);
        let error = serde_json::from_str::<Job>(r#""JobHost_Units""#).unwrap_err();
        assert!(error.to_string().contains("\"JobHost_Units\""), "{error}");
    }

    // --- properties -----------------------------------------------------------------------

    fn arbitrary_roles() -> impl Strategy<Value = Roles> {
        (any::<bool>(), any::<bool>()).prop_map(|(controller, host)| {
            let mut roles = Roles::NONE;
            if controller {
                roles = roles.with(Role::Controller);
            }
            if host {
                roles = roles.with(Role::HostMachine);
            }
            roles
        })
    }

    /// Names from a small pool so that subsets and overlaps are common.
    fn arbitrary_capability_names() -> impl Strategy<Value = Vec<&'static str>> {
        proptest::sample::subsequence(
            vec![
                "manage-firewall",
                "manage-networking",
                "manage-storage",
                "ipv6",
                "spaces",
            ],
            0..=5,
        )
        .prop_shuffle()
    }

    fn arbitrary_legacy_jobs() -> impl Strategy<Value = Vec<Job>> {
        let pool = vec![
            Job::HOST_UNITS,
            Job::MANAGE_MODEL,
            Job::MANAGE_ENVIRON,
            Job::MANAGE_STATE,
            Job::MANAGE_NETWORKING,
            Job::MANAGE_FIREWALL,
            Job(Cow::Borrowed("JobRunCharms")),
        ];
        proptest::collection::vec(proptest::sample::select(pool), 0..=LegacyJobs::COUNT_MAX)
    }

    proptest! {
        /// A machine with roles reports a function of (roles, capabilities) alone: not of the
        /// order the provider reported capabilities in, nor of jobs stored beside the roles.
        /// Growing the capabilities only adds jobs.
        #[test]
        fn roles_machine_jobs_depend_only_on_roles_and_capabilities_and_grow_monotonically(
            roles in arbitrary_roles(),
            smaller in arbitrary_capability_names(),
            extra in arbitrary_capability_names(),
            stale_jobs in arbitrary_legacy_jobs(),
        ) {
            let table = JobTable::lockstep();
            let small = capabilities(&smaller);
            let reversed: Vec<&'static str> = smaller.iter().rev().copied().collect();
            let mut large = capabilities(&reversed);
            for name in &extra {
                large.insert(Capability::new(*name).unwrap()).unwrap();
            }
            prop_assert!(small.is_subset(&large));

            let jobs = reported_jobs(&table, StoredMachine::Roles(roles), &small);
            prop_assert_eq!(&jobs, &table.jobs_for(roles, &capabilities(&reversed)));
            if !roles.is_empty() {
                let beside = StoredMachine::from_fields(roles, &stale_jobs).unwrap();
                prop_assert_eq!(&jobs, &reported_jobs(&table, beside, &small));
            }
            // Every job comes from a rule that applies.
            for job in jobs.iter() {
                prop_assert!(table.rules().iter().any(|rule| &rule.job == job
                    && roles.contains(rule.role)
                    && rule.capability.as_ref().is_none_or(|c| small.contains(c))));
            }

            let grown = reported_jobs(&table, StoredMachine::Roles(roles), &large);
            prop_assert!(grown.is_superset(&jobs), "{:?} ⊉ {:?}", grown, jobs);
            // Table order is kept: the smaller report is a subsequence of the larger one.
            let positions: Vec<usize> = jobs
                .iter()
                .map(|job| grown.iter().position(|other| other == job).unwrap())
                .collect();
            prop_assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "{:?}", positions);
        }

        /// A legacy machine reports its stored jobs first, as stored, then exactly the jobs
        /// its equivalent roles imply; growing the capabilities only adds jobs.
        #[test]
        fn legacy_machine_reports_stored_jobs_then_implied_jobs(
            stored in arbitrary_legacy_jobs(),
            smaller in arbitrary_capability_names(),
            extra in arbitrary_capability_names(),
        ) {
            let table = JobTable::lockstep();
            let small = capabilities(&smaller);
            let mut large = small.clone();
            for name in &extra {
                large.insert(Capability::new(*name).unwrap()).unwrap();
            }
            let jobs = reported_jobs(&table, legacy(&stored), &small);

            let mut deduplicated: Vec<Job> = Vec::new();
            for job in &stored {
                if !deduplicated.contains(job) {
                    deduplicated.push(job.clone());
                }
            }
            prop_assert_eq!(&jobs.as_slice()[..deduplicated.len()], &deduplicated[..]);
            let implied = table.jobs_for(roles_for_legacy_jobs(&stored), &small);
            prop_assert!(jobs.is_superset(&implied));
            prop_assert_eq!(jobs.len(), {
                deduplicated.len()
                    + implied.iter().filter(|job| !deduplicated.contains(job)).count()
            });

            let grown = reported_jobs(&table, legacy(&stored), &large);
            prop_assert!(grown.is_superset(&jobs));
        }
    }
}
