//! The version decision: CheckingAgentVersion, and the same check made from Ready (the
//! periodic one, an operator's request, news of the model's `agent-version`). A controller
//! looks the catalogue up and lets the policy decide, then writes `agent-version` before
//! upgrading; an agent other than a controller asks its controller (controllers first).
//!
//! JUJU-REFERENCE.md, "Bootstrap and implicit upgrade": "A controller worker checks streams
//! every 6 hours for the newest patch of its major.minor and shows it as
//! `upgrade-available` in status; it never upgrades anything by itself."

use statig::Outcome::{self, Handled, Transition};

use crate::lifecycle::Timer;
use crate::lifecycle::record::{ControllerSet, RecordView, Revision};
use crate::lifecycle::types::{ModelView, Request, StagePlan, StageSource};
use crate::phase::Phase;
use crate::policy::{self, Decision, Occasion, SelectionRequest, Stream};
use crate::version::Version;

use super::held::Failure;
use super::io::{Io, Pending};
use super::machine::{Machine, State};
use super::trial::Upgrade;

/// Progress of CheckingAgentVersion and of Ready's background checks.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct Check {
    pub(super) attempts: u8,
    pub(super) occasion: Option<OccasionKey>,
    pub(super) retry_wait: bool,
    /// A binary decided on, waiting for `agent-version` to be written or to be staged.
    pub(super) chosen: Option<Box<StagePlan>>,
    /// Ready controllers: the record revision for which the model was read again, to
    /// learn whether `agent-version` still names the record's target.
    pub(super) model_read_for: Option<Revision>,
    /// Ready: failed stagings of the chosen binary so far (bounded by
    /// [`Limits::stage_attempts_max`](crate::lifecycle::Limits), as in Upgrading).
    pub(super) stage_attempts: u8,
    /// Ready: a staging of the chosen binary is to be tried again at `StageRetry`.
    pub(super) stage_retry_wait: bool,
    /// Ready: `agent-version` is being reset to the running version, after the chosen
    /// binary could not be staged.
    pub(super) resetting: bool,
    /// Ready: the lookup that reports `upgrade-available` is owed, by a controller that
    /// came to Ready without CheckingAgentVersion's (see [`Machine::after_own_steps`]); it
    /// is made once nothing else is under way.
    pub(super) report_owed: bool,
}

/// [`Occasion`] without borrowed data, kept in state.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum OccasionKey {
    Bootstrap,
    Periodic,
    Operator(Option<Version>),
}

impl OccasionKey {
    fn occasion(self) -> Occasion {
        match self {
            OccasionKey::Bootstrap => Occasion::Bootstrap,
            OccasionKey::Periodic => Occasion::Periodic,
            OccasionKey::Operator(version) => Occasion::OperatorRequest { version },
        }
    }
}

impl Machine {
    // ---------------------------------------------------------------- CheckingAgentVersion

    /// Where an agent goes once its own steps are done (`upgradedToVersion` is its running
    /// version): CheckingAgentVersion, unless it is a controller whose check could only
    /// stay. Such a check is a boot after bootstrap on the model's `agent-version` (and
    /// the pin, if any): the policy's periodic occasion, which stays whatever the
    /// catalogue says ([`policy::select`]), so the lookup could only report
    /// `upgrade-available`. That controller goes to Ready and makes the lookup from there:
    /// a mirror that is slow, unreachable or loses the request does not hold a restarted
    /// controller limited (and, controllers first, every agent behind it), and Juju's
    /// controllers do not consult streams to start either. An agent other than a
    /// controller always asks its controller: its desired version is the controller's word.
    pub(super) fn after_own_steps(&self) -> State {
        if self.is_controller() && self.occasion() == OccasionKey::Periodic && !self.must_upgrade()
        {
            return State::Ready {
                check: Check {
                    report_owed: true,
                    ..Check::default()
                },
            };
        }
        State::CheckingAgentVersion {
            check: Check::default(),
        }
    }

    /// The lookup owed by [`Machine::after_own_steps`], made from Ready once nothing else
    /// is under way: no request in flight, no upgrade chosen, no lookup waiting for its
    /// retry (any check begun from Ready pays the debt).
    pub(super) fn make_owed_report_lookup(&mut self, io: &mut Io, check: &mut Check) {
        if check.report_owed
            && self.pending.is_none()
            && check.chosen.is_none()
            && !check.retry_wait
        {
            self.begin_check_in_ready(io, check, OccasionKey::Periodic);
        }
    }

    /// Entering CheckingAgentVersion: the check starts at once.
    pub(super) fn begin_version_check(&mut self, io: &mut Io, check: &mut Check) {
        if self.mutations.gate_before_version_check {
            // Planted defect: the gate opens before the version is known.
            io.push_gate(self.view(Phase::Ready));
        }
        if check.occasion.is_none() {
            check.occasion = Some(self.occasion());
        }
        self.start_check(io);
    }

    /// Why this check runs. spec/lifecycle.md: "Until the agent first reaches Ready, every
    /// boot is part of the bootstrap (...): `--auto-upgrade` applies"; a model naming
    /// another version is an operator's request for it.
    fn occasion(&self) -> OccasionKey {
        let desired = self.model.as_ref().map(|model| model.agent_version);
        match desired {
            _ if !self.snapshot.bootstrap_complete => OccasionKey::Bootstrap,
            Some(version) if version != self.config.running.number => {
                OccasionKey::Operator(Some(version))
            }
            _ => OccasionKey::Periodic,
        }
    }

    /// True when staying on the running version would disobey the model.
    fn must_upgrade(&self) -> bool {
        match &self.model {
            Some(model) => {
                model.agent_version != self.config.running.number
                    || matches!(model.policy, policy::UpgradePolicy::Pinned(version) if version != self.config.running.number)
            }
            None => false,
        }
    }

    /// Controllers look the catalogue up in the streams preferred for the running version;
    /// other agents ask their controller.
    ///
    /// JUJU-REFERENCE.md, "Bootstrap and implicit upgrade": "an explicit `agent-stream`
    /// wins; fallbacks proposed→released, devel→proposed→released,
    /// testing→devel→proposed→released."
    pub(super) fn start_check(&mut self, io: &mut Io) {
        if self.is_controller() {
            let stream = self.model.as_ref().and_then(|model| model.stream);
            let streams = Stream::preferred(stream, &self.config.running.number);
            self.request(io, Pending::Catalogue, Request::LookupCatalogue { streams });
        } else {
            self.request(io, Pending::DesiredBinary, Request::DesiredBinary);
        }
    }

    #[expect(
        clippy::result_large_err,
        reason = "policy errors carry the binaries they name; built once per check"
    )]
    fn select(
        &self,
        occasion: OccasionKey,
        catalogue: &policy::Catalogue,
    ) -> Result<Decision, policy::PolicyError> {
        let default_model;
        let model = match &self.model {
            Some(model) => model,
            None => {
                default_model = ModelView {
                    agent_version: self.config.running.number,
                    policy: policy::UpgradePolicy::Off,
                    stream: None,
                    controllers: ControllerSet::EMPTY,
                };
                &default_model
            }
        };
        policy::select(
            &SelectionRequest {
                running: &self.config.running,
                policy: &model.policy,
                stream: model.stream,
                occasion: occasion.occasion(),
            },
            catalogue,
        )
    }

    /// The policy's word on the catalogue found, in CheckingAgentVersion: stay (reporting
    /// `upgrade-available` when it changed), or write `agent-version` and upgrade.
    ///
    /// JUJU-REFERENCE.md, "Bootstrap and implicit upgrade", historic bug: "bootstrap set an
    /// agent-version whose binaries the controller could not find, so it restarted
    /// forever; the fix resets agent-version to its own when binaries are missing."
    pub(super) fn decide(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        catalogue: &policy::Catalogue,
    ) -> Outcome<State> {
        let occasion = check.occasion.unwrap_or(OccasionKey::Periodic);
        match self.select(occasion, catalogue) {
            Ok(Decision::Stay { upgrade_available }) => {
                if self.must_upgrade() {
                    let reason = format!(
                        "agent-version {} cannot be installed: no matching agent binary",
                        self.model
                            .as_ref()
                            .map(|model| model.agent_version)
                            .unwrap_or(self.config.running.number)
                    );
                    return Transition(State::UpgradeFailed {
                        failure: Box::new(Failure::new(reason)),
                    });
                }
                if upgrade_available != self.upgrade_available {
                    self.upgrade_available = upgrade_available;
                    self.request(
                        io,
                        Pending::Report,
                        Request::ReportUpgradeAvailable(upgrade_available),
                    );
                    return Handled;
                }
                Transition(State::Ready {
                    check: Check::default(),
                })
            }
            Ok(decision) => {
                let plan = stage_plan(decision);
                let version = plan.binary.number;
                check.chosen = Some(Box::new(plan));
                if self.model.as_ref().map(|model| model.agent_version) != Some(version) {
                    self.request(
                        io,
                        Pending::SetAgentVersion(version),
                        Request::SetAgentVersion(version),
                    );
                    return Handled;
                }
                let plan = check.chosen.take().expect("just chosen");
                Transition(State::Upgrading {
                    upgrade: Box::new(Upgrade::new(*plan, false)),
                })
            }
            Err(error) => {
                let reason = error.to_string();
                Transition(State::UpgradeFailed {
                    failure: Box::new(Failure::new(reason)),
                })
            }
        }
    }

    /// spec/lifecycle.md, "Rules": "3 catalogue lookups" at most; then the upgrade fails if
    /// the model demands one, and the agent stays otherwise.
    pub(super) fn catalogue_lookup_failed(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        reason: &str,
    ) -> Outcome<State> {
        check.attempts += 1;
        if check.attempts < self.config.limits.catalogue_attempts_max {
            self.retry_lookup_later(io, check, reason);
            return Handled;
        }
        if self.must_upgrade() {
            let reason = format!("agent binaries could not be looked up: {reason}");
            return Transition(State::UpgradeFailed {
                failure: Box::new(Failure::new(reason)),
            });
        }
        self.status_message(
            io,
            format!("agent binary lookup failed (giving up): {reason}"),
        );
        Transition(State::Ready {
            check: Check::default(),
        })
    }

    /// A failed lookup is to be tried again at `CatalogueRetry`, and says so.
    fn retry_lookup_later(&mut self, io: &mut Io, check: &mut Check, reason: &str) {
        check.retry_wait = true;
        self.status_message(
            io,
            format!("agent binary lookup failed (will retry): {reason}"),
        );
        io.set_timer(
            Timer::CatalogueRetry,
            self.config.limits.catalogue_retry_delay,
        );
    }

    /// An agent other than a controller learnt the binary its controller wants it to run.
    pub(super) fn desired_binary_while_checking(
        &mut self,
        io: &mut Io,
        plan: &StagePlan,
    ) -> Outcome<State> {
        if let Some(reason) = self.refuse_downgrade(plan) {
            self.status_message(io, reason);
            Transition(State::Ready {
                check: Check::default(),
            })
        } else if plan.binary.number == self.config.running.number {
            Transition(State::Ready {
                check: Check::default(),
            })
        } else {
            Transition(State::Upgrading {
                upgrade: Box::new(Upgrade::new(plan.clone(), false)),
            })
        }
    }

    /// The store refused to change `agent-version`: another upgrade is recorded as in
    /// progress. Stay on this version; Ready archives the record if no controller can ever
    /// proceed with it.
    pub(super) fn agent_version_refused_while_checking(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        view: &RecordView,
    ) -> Outcome<State> {
        if let Some(plan) = check.chosen.take() {
            self.status_message(
                io,
                upgrade_refused_message(plan.binary.number, &view.normalized()),
            );
        }
        Transition(State::Ready {
            check: Check::default(),
        })
    }

    /// `agent-version` now names the chosen binary: upgrade to it.
    pub(super) fn agent_version_written_while_checking(
        &mut self,
        check: &mut Check,
    ) -> Outcome<State> {
        match check.chosen.take() {
            Some(plan) => {
                // The model holds the chosen version now.
                if let Some(model) = &mut self.model {
                    model.agent_version = plan.binary.number;
                }
                Transition(State::Upgrading {
                    upgrade: Box::new(Upgrade::new(*plan, false)),
                })
            }
            None => Transition(State::Ready {
                check: Check::default(),
            }),
        }
    }

    /// A machine agent never switches to a binary older than its `upgradedToVersion`: that
    /// binary would find state a newer one migrated and hold (as `policy::select` refuses an
    /// implicit downgrade for controllers). `agent-version` goes down when a controller gives
    /// an upgrade up, after this agent already upgraded.
    ///
    /// spec/lifecycle.md: "An agent other than a controller never switches to a binary older
    /// than its `upgradedToVersion` (...), whatever its controller offers."
    pub(super) fn refuse_downgrade(&self, plan: &StagePlan) -> Option<String> {
        let upgraded_to = self.snapshot.upgraded_to_version;
        (plan.binary.number < upgraded_to).then(|| {
            format!(
                "not switching to agent binary {}: it is older than upgradedToVersion \
                 {upgraded_to} (agent-version went down after this agent upgraded)",
                plan.binary
            )
        })
    }

    // ---------------------------------------------------------------- checks from Ready

    /// The 6-hourly check: it only reports (spec/lifecycle.md, "Choices made": "Ready's
    /// periodic check only reports").
    pub(super) fn periodic_check(&mut self, io: &mut Io, check: &mut Check) {
        io.set_timer(
            Timer::CatalogueCheck,
            self.config.limits.catalogue_check_interval,
        );
        // Not while an upgrade is chosen (its staging, or its retry, comes first), nor while
        // a lookup for one waits to be tried again.
        if self.pending.is_none() && check.chosen.is_none() && !check.retry_wait {
            self.begin_check_in_ready(io, check, OccasionKey::Periodic);
        }
    }

    /// An operator asked for an upgrade while Ready.
    pub(super) fn request_upgrade(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        version: Option<Version>,
    ) {
        if self.pending.is_some() || check.chosen.is_some() {
            self.status_message(io, "an upgrade check is already in progress".to_owned());
            return;
        }
        self.begin_check_in_ready(io, check, OccasionKey::Operator(version));
    }

    /// A check from Ready for `occasion`, its lookup the first: it takes over from a lookup
    /// that waits to be tried again (the newer occasion wins).
    pub(super) fn begin_check_in_ready(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        occasion: OccasionKey,
    ) {
        if check.retry_wait {
            check.retry_wait = false;
            io.cancel_timer(Timer::CatalogueRetry);
        }
        check.report_owed = false;
        check.attempts = 0;
        check.occasion = Some(occasion);
        self.start_check(io);
    }

    /// A lookup from Ready failed. One made for an upgrade (an operator's request, or the
    /// model's `agent-version` news) is tried again under CheckingAgentVersion's bounds
    /// (spec/lifecycle.md: 3 catalogue lookups, `catalogue_retry_delay` apart): a lookup
    /// lost on its way would otherwise leave the model's request unanswered for good, since
    /// the news was consumed and the operator asked once. The periodic one only reports,
    /// and its next round comes anyway.
    pub(super) fn lookup_failed_in_ready(&mut self, io: &mut Io, check: &mut Check, reason: &str) {
        let for_upgrade = matches!(check.occasion, Some(OccasionKey::Operator(_)));
        check.attempts += 1;
        if for_upgrade && check.attempts < self.config.limits.catalogue_attempts_max {
            self.retry_lookup_later(io, check, reason);
            return;
        }
        check.attempts = 0;
        check.occasion = None;
        let given_up = if for_upgrade { " (giving up)" } else { "" };
        self.status_message(
            io,
            format!("agent binary lookup failed{given_up}: {reason}"),
        );
    }

    /// `CatalogueRetry` while Ready: the failed lookup again, for the same occasion; after
    /// whatever request is in flight if there is one.
    pub(super) fn retry_lookup_in_ready(&mut self, io: &mut Io, check: &mut Check) {
        if self.pending.is_some() || check.chosen.is_some() {
            io.set_timer(
                Timer::CatalogueRetry,
                self.config.limits.catalogue_retry_delay,
            );
            return;
        }
        check.retry_wait = false;
        self.start_check(io);
    }

    /// The policy's word on the catalogue found, while Ready: report, or write
    /// `agent-version` and pre-stage the chosen binary (the gate closes only once it is
    /// verified).
    pub(super) fn decide_in_ready(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        catalogue: &policy::Catalogue,
    ) -> Outcome<State> {
        let occasion = check.occasion.take().unwrap_or(OccasionKey::Periodic);
        check.attempts = 0;
        match self.select(occasion, catalogue) {
            Ok(Decision::Stay { upgrade_available }) => {
                if upgrade_available != self.upgrade_available {
                    self.upgrade_available = upgrade_available;
                    self.request(
                        io,
                        Pending::Report,
                        Request::ReportUpgradeAvailable(upgrade_available),
                    );
                }
                Handled
            }
            Ok(decision) => {
                let plan = stage_plan(decision);
                let version = plan.binary.number;
                check.chosen = Some(Box::new(plan.clone()));
                if self.model.as_ref().map(|model| model.agent_version) != Some(version) {
                    self.request(
                        io,
                        Pending::SetAgentVersion(version),
                        Request::SetAgentVersion(version),
                    );
                } else {
                    self.request(io, Pending::Stage, Request::StageBinary(plan));
                }
                Handled
            }
            Err(error) => {
                self.status_message(io, format!("upgrade not started: {error}"));
                Handled
            }
        }
    }

    /// An agent other than a controller, Ready, learnt its desired binary: pre-stage it.
    pub(super) fn desired_binary_in_ready(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        plan: &StagePlan,
    ) {
        if let Some(reason) = self.refuse_downgrade(plan) {
            self.status_message(io, reason);
        } else if plan.binary.number != self.config.running.number {
            check.chosen = Some(Box::new(plan.clone()));
            self.request(io, Pending::Stage, Request::StageBinary(plan.clone()));
        }
    }

    /// An `agent-version` write made from Ready is done: a reset after a failed staging,
    /// or the chosen version, whose binary is then pre-staged.
    pub(super) fn agent_version_written_in_ready(&mut self, io: &mut Io, check: &mut Check) {
        if check.resetting {
            check.resetting = false;
            let running = self.config.running.number;
            if let Some(model) = &mut self.model {
                model.agent_version = running;
            }
            self.status_message(io, format!("agent-version reset to {running}"));
            return;
        }
        // Pre-stage while still Ready: the gate closes only once the binary is verified.
        if let Some(plan) = check.chosen.clone() {
            if let Some(model) = &mut self.model {
                model.agent_version = plan.binary.number;
            }
            self.request(io, Pending::Stage, Request::StageBinary(*plan));
        }
    }

    /// The store refused an `agent-version` write made from Ready.
    pub(super) fn agent_version_refused_in_ready(
        &mut self,
        io: &mut Io,
        check: &mut Check,
        view: &RecordView,
    ) {
        if check.resetting {
            check.resetting = false;
            self.status_message(
                io,
                format!(
                    "agent-version not reset to {}: {}",
                    self.config.running.number,
                    refusal_reason(&view.normalized())
                ),
            );
        } else if let Some(plan) = check.chosen.take() {
            self.status_message(
                io,
                upgrade_refused_message(plan.binary.number, &view.normalized()),
            );
        }
    }
}

/// Why an upgrade did not start: the store refused to change `agent-version`.
fn upgrade_refused_message(version: Version, view: &RecordView) -> String {
    format!("upgrade to {version} not started: {}", refusal_reason(view))
}

/// Why the store refused to change `agent-version`, from the record the refusal found.
///
/// JUJU-REFERENCE.md, "HA": "The agent version of the model cannot be changed while a
/// current record exists".
fn refusal_reason(view: &RecordView) -> String {
    match view.current {
        Some((record, _)) => format!(
            "agent-version cannot change while the upgrade {} -> {} is recorded as {} \
             (controllers ready {:?})",
            record.previous_version, record.target_version, record.status, record.controllers_ready
        ),
        None => "agent-version cannot change while an upgrade is in progress".to_owned(),
    }
}

/// What to stage for a decision to upgrade.
fn stage_plan(decision: Decision) -> StagePlan {
    match decision {
        Decision::Upgrade { entry } => StagePlan {
            binary: entry.binary,
            size_bytes: entry.size_bytes,
            sha256: entry.sha256,
            source: StageSource::Catalogue { path: entry.path },
        },
        Decision::UseLocal {
            binary,
            sha256,
            size_bytes,
        } => StagePlan {
            binary,
            size_bytes,
            sha256,
            source: StageSource::Local,
        },
        Decision::Stay { .. } => unreachable!("a stay decision stages nothing"),
    }
}
