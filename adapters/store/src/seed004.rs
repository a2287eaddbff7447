//! Seed 004 at the store: capabilities on the model, roles on machines, jobs derived on
//! every report, and lockstep's own database step that migrates legacy machines.
//!
//! - The environment provider ([`EnvironProvider`]; [`LocalProvider`] reads the list from
//!   config) reports capabilities; [`refresh_capabilities`] writes them to the model at
//!   bootstrap and at the end of every upgrade (`Request::RefreshCapabilities`). That is one
//!   write to the model: no machine is touched, yet every machine's reported jobs follow.
//! - Machines written by this version carry roles; a machine an older client adds with jobs
//!   is stored with the equivalent roles ([`Machine::from_client_jobs`]); machines read from
//!   the schema before roles existed are legacy (jobs only) and are reported as the core's
//!   `reported_jobs` says until [`MACHINE_JOBS_TO_ROLES`] migrates them.

use lockstep_core::Version;
use lockstep_core::jobs::{Capabilities, Capability, JobsError, roles_for_legacy_jobs};
use lockstep_core::lifecycle::{LeaseToken, StepOutcome};
use lockstep_core::steps::{Step, StepError, StepKey, StepRegistry};

use crate::{Abort, Machine, Model, Store, StoreError, Tx};

/// lockstep's database step for schema 2: every legacy machine (no roles) gets the roles its
/// jobs imply, and its legacy jobs are cleared. A machine whose jobs imply no role (only
/// jobs lockstep does not know) is left as stored, and so reported as stored.
pub const MACHINE_JOBS_TO_ROLES: Step = Step::database(
    "machine-jobs-to-roles",
    Version::new(0, 1, 0),
    "store machine roles instead of legacy jobs",
);

/// lockstep's own steps for its own schema, in registry order.
pub const STEPS: [Step; 1] = [MACHINE_JOBS_TO_ROLES];

/// lockstep's step registry.
pub fn registry() -> Result<StepRegistry, StepError> {
    StepRegistry::new(&STEPS)
}

/// The body of [`MACHINE_JOBS_TO_ROLES`].
pub fn migrate_machine_jobs_to_roles(tx: &mut dyn Tx) -> Result<(), Abort> {
    for mut machine in tx.machines()? {
        if !machine.roles.is_empty() {
            continue;
        }
        let roles = roles_for_legacy_jobs(&machine.legacy_jobs);
        if roles.is_empty() {
            continue;
        }
        machine.roles = roles;
        machine.legacy_jobs.clear();
        tx.put_machine(&machine)?;
    }
    Ok(())
}

/// Runs one of lockstep's own database steps (`Request::RunStep`) through
/// [`Store::run_database_step`]. `None`: `key` is not one of lockstep's database steps.
pub fn run_step(
    store: &dyn Store,
    key: StepKey,
    fence: Option<LeaseToken>,
) -> Result<Option<StepOutcome>, StoreError> {
    if key == MACHINE_JOBS_TO_ROLES.key() {
        return store
            .run_database_step(key, fence, &mut migrate_machine_jobs_to_roles)
            .map(Some);
    }
    Ok(None)
}

/// What reports the environment's capabilities.
pub trait EnvironProvider {
    fn capabilities(&self) -> Result<Capabilities, String>;
}

/// A provider whose capabilities come from config (`capabilities: manage-firewall, ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalProvider {
    capabilities: Capabilities,
}

impl LocalProvider {
    /// Parses a comma- or space-separated list; the error names the bad entry.
    pub fn from_config(text: &str) -> Result<LocalProvider, JobsError> {
        let names = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|name| !name.is_empty())
            .map(|name| Capability::new(name.to_owned()));
        let capabilities = Capabilities::from_capabilities(names.collect::<Result<Vec<_>, _>>()?)?;
        Ok(LocalProvider { capabilities })
    }
}

impl EnvironProvider for LocalProvider {
    fn capabilities(&self) -> Result<Capabilities, String> {
        Ok(self.capabilities.clone())
    }
}

/// `Request::RefreshCapabilities`: asks the provider and writes the answer to the model.
pub fn refresh_capabilities(
    store: &dyn Store,
    provider: &dyn EnvironProvider,
    by: Version,
) -> Result<Model, RefreshError> {
    let capabilities = provider.capabilities().map_err(RefreshError::Provider)?;
    store
        .set_capabilities(&capabilities, by)
        .map_err(RefreshError::Store)
}

/// Why capabilities could not be refreshed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RefreshError {
    Provider(String),
    Store(StoreError),
}

impl std::fmt::Display for RefreshError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefreshError::Provider(reason) => {
                write!(
                    f,
                    "the environment provider cannot report capabilities: {reason}"
                )
            }
            RefreshError::Store(error) => write!(f, "cannot store capabilities: {error}"),
        }
    }
}

impl std::error::Error for RefreshError {}

/// A machine as an older client would add it: with jobs, stored with roles.
pub fn add_machine_from_client(
    store: &dyn Store,
    id: &str,
    jobs: Vec<lockstep_core::jobs::Job>,
) -> Result<bool, StoreError> {
    store.add_machine(&Machine::from_client_jobs(id, jobs))
}
