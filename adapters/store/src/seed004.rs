//! Seed 004 at the store: capabilities on the model, roles on machines, jobs derived on
//! every report, and lockstep's own database step that migrates legacy machines.
//!
//! - The environment provider ([`EnvironProvider`]; [`LocalProvider`] reports a given
//!   list) reports capabilities, and why ([`CapabilityReport`]); [`refresh_capabilities`] asks it
//!   afresh and writes its answer to the model at bootstrap and at the end of every upgrade
//!   (`Request::RefreshCapabilities`). That is one write to the model: no machine is
//!   touched, yet every machine's reported jobs follow.
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

/// What a provider found when asked: the capabilities it reports, and why, in words for
/// the log (what it checked on the host, the file it read, the flag that set them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapabilityReport {
    pub capabilities: Capabilities,
    pub reason: String,
}

/// What reports the environment's capabilities. It is asked afresh at every
/// `Request::RefreshCapabilities` (a controller's bootstrap and the end of every upgrade),
/// so a provider that looks at the world sees it as it is then.
///
/// The agent's providers (the host's own interrogation, the `--capabilities` override, the
/// `--capabilities-file` made for tests) live in the agent crate
/// (`lockstep_agent::daemon::capabilities`): probing a host is the daemon's business, and
/// this crate touches nothing but the store.
pub trait EnvironProvider {
    /// The capabilities now; `Err` says why the provider has no answer.
    fn report(&self) -> Result<CapabilityReport, String>;
}

/// Parses a comma- or space-separated list of capabilities (`manage-firewall,
/// manage-networking`; empty: none). The error names the first bad entry.
pub fn parse_capabilities(text: &str) -> Result<Capabilities, JobsError> {
    let names = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|name| !name.is_empty())
        .map(|name| Capability::new(name.to_owned()));
    Capabilities::from_capabilities(names.collect::<Result<Vec<_>, _>>()?)
}

/// A provider whose capabilities are given (`capabilities: manage-firewall, ...`): it
/// reports them as given, whatever the world says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalProvider {
    capabilities: Capabilities,
}

impl LocalProvider {
    /// Parses a comma- or space-separated list ([`parse_capabilities`]); the error names
    /// the bad entry.
    pub fn from_config(text: &str) -> Result<LocalProvider, JobsError> {
        Ok(LocalProvider::new(parse_capabilities(text)?))
    }

    /// A provider reporting `capabilities`.
    pub fn new(capabilities: Capabilities) -> LocalProvider {
        LocalProvider { capabilities }
    }

    /// What it reports.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }
}

impl EnvironProvider for LocalProvider {
    fn report(&self) -> Result<CapabilityReport, String> {
        Ok(CapabilityReport {
            capabilities: self.capabilities.clone(),
            reason: "as configured, not discovered".to_owned(),
        })
    }
}

/// What [`refresh_capabilities`] wrote, and what the provider said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refreshed {
    /// The model after the write.
    pub model: Model,
    /// The provider's answer.
    pub report: CapabilityReport,
}

/// `Request::RefreshCapabilities`: asks the provider and writes the answer to the model.
/// One write to the model, whatever changed: machines are never touched.
pub fn refresh_capabilities(
    store: &dyn Store,
    provider: &dyn EnvironProvider,
    by: Version,
) -> Result<Refreshed, RefreshError> {
    let report = provider.report().map_err(RefreshError::Provider)?;
    let model = store
        .set_capabilities(&report.capabilities, by)
        .map_err(RefreshError::Store)?;
    Ok(Refreshed { model, report })
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use lockstep_core::jobs::JobTable;
    use lockstep_core::{Role, Roles};

    use super::*;
    use crate::{Changes, Durability, EntityKind, MemoryStore};

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    /// A provider whose answers a test sets between two refreshes, as a new version's
    /// provider (or a changed host) would answer differently at the end of an upgrade.
    struct Scripted(RefCell<Vec<Result<&'static str, &'static str>>>);

    impl EnvironProvider for Scripted {
        fn report(&self) -> Result<CapabilityReport, String> {
            match self.0.borrow_mut().remove(0) {
                Ok(list) => Ok(CapabilityReport {
                    capabilities: parse_capabilities(list).map_err(|e| e.to_string())?,
                    reason: format!("scripted: {list:?}"),
                }),
                Err(reason) => Err(reason.to_owned()),
            }
        }
    }

    fn jobs(store: &dyn Store, id: &str) -> Vec<String> {
        let (_, jobs) = store
            .reported_jobs(&JobTable::lockstep())
            .unwrap()
            .into_iter()
            .find(|(machine, _)| machine == id)
            .unwrap();
        jobs.iter().map(|job| job.as_str().to_owned()).collect()
    }

    #[test]
    fn seed004_each_refresh_asks_the_provider_afresh_and_writes_only_the_model() {
        let store = MemoryStore::new(Durability::Full);
        store.create_model(&crate::suite::model()).unwrap();
        store
            .add_machine(&Machine::with_roles("0", Roles::of(&[Role::Controller])))
            .unwrap();
        store
            .add_machine(&Machine::with_roles("1", Roles::of(&[Role::HostMachine])))
            .unwrap();
        let provider = Scripted(RefCell::new(vec![
            Ok(""),
            Ok("manage-firewall manage-networking"),
            Err("the cloud did not answer"),
            Ok(""),
        ]));

        let first = refresh_capabilities(&store, &provider, v("2.9.42")).unwrap();
        assert!(first.model.capabilities.is_empty());
        assert_eq!(first.report.reason, "scripted: \"\"");
        assert_eq!(jobs(&store, "0"), ["JobManageModel"]);

        let before = store.revision().unwrap();
        let second = refresh_capabilities(&store, &provider, v("2.9.43")).unwrap();
        assert_eq!(
            second.model.capabilities_discovered.unwrap().by,
            v("2.9.43")
        );
        assert_eq!(jobs(&store, "0"), ["JobManageModel", "JobManageFirewall"]);
        assert_eq!(jobs(&store, "1"), ["JobHostUnits", "JobManageNetworking"]);
        let Changes::Events { events, .. } = store.changes_since(before, 100).unwrap() else {
            panic!("compacted");
        };
        let kinds: Vec<_> = events.iter().map(|event| event.kind).collect();
        assert_eq!(kinds, [EntityKind::Model]);

        // A provider with no answer writes nothing: the model keeps what it had.
        let error = refresh_capabilities(&store, &provider, v("2.9.44")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the environment provider cannot report capabilities: the cloud did not answer"
        );
        assert_eq!(jobs(&store, "1"), ["JobHostUnits", "JobManageNetworking"]);

        // Gone at the next refresh: the jobs follow, still with no machine written.
        refresh_capabilities(&store, &provider, v("2.9.44")).unwrap();
        assert_eq!(jobs(&store, "0"), ["JobManageModel"]);
        assert_eq!(jobs(&store, "1"), ["JobHostUnits"]);
    }

    #[test]
    fn seed004_a_local_provider_reports_what_it_was_given() {
        let provider = LocalProvider::from_config("manage-networking,manage-firewall,").unwrap();
        let report = provider.report().unwrap();
        assert_eq!(
            report.capabilities,
            Capabilities::from_capabilities([
                Capability::MANAGE_FIREWALL,
                Capability::MANAGE_NETWORKING
            ])
            .unwrap()
        );
        assert_eq!(report.reason, "as configured, not discovered");
        assert!(parse_capabilities(" , ").unwrap().is_empty());
        let error = parse_capabilities("manage-firewall,Manage_Networking").unwrap_err();
        assert!(
            error.to_string().contains("\"Manage_Networking\""),
            "{error}"
        );
    }
}
