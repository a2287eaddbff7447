//! The decisions of Juju's Upgrader facade (`apiserver/facades/agent/upgrader`) and of
//! `ModelConfig.ModelSet` about the model's `agent-version`, as pure functions over core
//! types: which version an agent should run (controllers first), and whether the model's
//! `agent-version` may change.
//!
//! Every place that answers these questions calls these functions: the controller's API
//! facades, the agent's driver (through the store, which runs the agent-version check inside
//! its write transaction), the simulator and the core's `testkit`. There is no second copy
//! to drift from them.
//!
//! Like the rest of the crate this performs no I/O: the caller reads the model, the machines
//! and the catalogue, and hands them in.

use std::fmt;

use crate::jobs::{Job, roles_for_legacy_jobs};
use crate::lifecycle::UpgradeInfo;
use crate::policy::{Catalogue, Stream};
use crate::role::{Role, Roles};
use crate::time::Millis;
use crate::version::{Binary, Version};

// ---------------------------------------------------------------------------------------
// The desired version: controllers first
// ---------------------------------------------------------------------------------------

/// A machine's roles as the Upgrader facade reads them: its stored roles, or, for a legacy
/// machine that stores only jobs (seed 004), the roles its jobs imply
/// ([`roles_for_legacy_jobs`]: `JobManageModel` and its older names make a controller).
pub fn machine_roles(stored: Roles, legacy_jobs: &[Job]) -> Roles {
    if stored.is_empty() {
        roles_for_legacy_jobs(legacy_jobs)
    } else {
        stored
    }
}

/// The agent that asks for its desired version, as the store knows it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AskingAgent<'a> {
    /// Its machine's roles ([`machine_roles`] for a legacy machine).
    pub roles: Roles,
    /// The binary it last reported running (`Upgrader.SetTools`); `None` until it reported.
    pub reported: Option<&'a Binary>,
}

/// Whether every controller machine reported running `wanted` or newer (`controllers`,
/// one item per controller machine, the binary it last *reported*; `None`: it has not
/// reported one): the half of the controllers-first rule that a staged rollout's
/// coordinator waits for before it admits any agent. [`desired_version`] adds the
/// answering API server's own version.
pub fn controllers_run<'a>(
    wanted: Version,
    controllers: impl IntoIterator<Item = Option<&'a Binary>>,
) -> bool {
    controllers
        .into_iter()
        .all(|reported| reported.is_some_and(|binary| binary.number >= wanted))
}

/// The agent-version an agent should run: Juju's controllers-first rule (the Upgrader
/// facade's `DesiredVersion`).
///
/// - A controller is told the model's `agent-version`.
/// - Any other agent is told `agent-version` only once every controller runs it: the API
///   server answering (`server_version`, its own running version) and every controller
///   machine by the binary it last *reported* (`controllers`, one item per controller
///   machine; `None`: it has not reported one, so it does not run it yet). A controller's
///   configured or intended version says nothing: only what it reported counts.
/// - Until then the agent is told the version it reported running, so it stays where it
///   is while the controllers go first; one that never reported is told the server's.
///
/// The work is one pass over `controllers`, which the caller bounds (a model has at most
/// [`crate::lifecycle::ControllerId::COUNT_MAX`] controllers).
pub fn desired_version<'a>(
    model_agent_version: Version,
    agent: AskingAgent<'_>,
    controllers: impl IntoIterator<Item = Option<&'a Binary>>,
    server_version: Version,
) -> Version {
    let wanted = model_agent_version;
    if agent.roles.contains(Role::Controller) {
        return wanted;
    }
    let controllers_run_it = server_version >= wanted && controllers_run(wanted, controllers);
    let desired = if controllers_run_it {
        wanted
    } else {
        agent
            .reported
            .map_or(server_version, |binary| binary.number)
    };
    // Postcondition: an agent other than a controller is told the model's version or the
    // one it stays on, nothing else.
    assert!(
        desired == wanted
            || Some(desired) == agent.reported.map(|binary| binary.number)
            || desired == server_version
    );
    desired
}

// ---------------------------------------------------------------------------------------
// Whether agent-version may change
// ---------------------------------------------------------------------------------------

/// Juju's `state.UpgradeInProgressError`: the refusal of an `agent-version` change while an
/// upgrade-info record is current.
pub const UPGRADE_IN_PROGRESS_MESSAGE: &str =
    "an upgrade is already in progress or the last upgrade did not complete";

/// Who asks to change the model's `agent-version`; it decides whether a lower version may
/// be set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AgentVersionRequester {
    /// An operator (`ModelConfig.ModelSet`, `juju upgrade-controller`): a lower version is
    /// refused, as Juju refuses it.
    Operator,
    /// The lifecycle's own `Request::SetAgentVersion`: the version its policy chose, or,
    /// after an upgrade failed, the version it runs (Juju's fix for a controller that
    /// restarted for ever asking for binaries it cannot find), which may be lower.
    Lifecycle,
}

/// An allowed `agent-version` write.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AgentVersionChange {
    /// The model holds the requested version already: nothing to write (Juju accepts the
    /// current value back, whatever else holds).
    Unchanged,
    /// Write `to` over `from`.
    Changed {
        /// The model's `agent-version` now.
        from: Version,
        /// The version to write.
        to: Version,
    },
}

/// Why an `agent-version` change is refused. The messages are Juju's where it has one.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum AgentVersionRefusal {
    /// An upgrade-info record is current (Juju's rule): no change until it is archived.
    UpgradeInProgress {
        /// The current record.
        record: UpgradeInfo,
    },
    /// An operator asked for a version lower than the model's.
    Downgrade {
        /// The model's agent-version.
        current: Version,
        /// The version asked for.
        requested: Version,
    },
    /// The operator asked that every agent run the model's version before it changes
    /// (Juju's check, which `Client.SetModelAgentVersion` runs unless `force`), and some do
    /// not: Juju's `versionInconsistentError`.
    AgentsBehind {
        /// The model's agent-version.
        current: Version,
        /// The first [`AGENTS_BEHIND_NAMED_MAX`] agents behind, by tag in Juju's order
        /// (sorted).
        named: Vec<String>,
        /// How many more are behind than are named.
        unnamed: usize,
    },
    /// The catalogue has no binary of that version in the streams the model searches for
    /// it (Juju's `no agent binaries found for version`).
    NoBinaries {
        /// The version asked for.
        version: Version,
        /// The streams searched, in order.
        streams: &'static [Stream],
    },
}

impl AgentVersionRefusal {
    /// Juju's error code for the refusal: `upgrade in progress`, `not supported` or
    /// `not found`.
    pub fn code(&self) -> &'static str {
        match self {
            AgentVersionRefusal::UpgradeInProgress { .. } => crate::gate::UPGRADE_IN_PROGRESS,
            AgentVersionRefusal::Downgrade { .. } => "not supported",
            // Juju's versionInconsistentError has no code of its own.
            AgentVersionRefusal::AgentsBehind { .. } => "",
            AgentVersionRefusal::NoBinaries { .. } => "not found",
        }
    }
}

impl fmt::Display for AgentVersionRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentVersionRefusal::UpgradeInProgress { .. } => {
                f.write_str(UPGRADE_IN_PROGRESS_MESSAGE)
            }
            AgentVersionRefusal::Downgrade { current, requested } => write!(
                f,
                "cannot change agent-version from {current} to the lower version \
                 {requested}: downgrades are not supported"
            ),
            AgentVersionRefusal::AgentsBehind {
                current,
                named,
                unnamed,
            } => {
                write!(
                    f,
                    "some agents have not upgraded to the current model version {current}: {}",
                    named.join(", ")
                )?;
                if *unnamed > 0 {
                    write!(f, ", and {unnamed} more")?;
                }
                Ok(())
            }
            AgentVersionRefusal::NoBinaries { version, .. } => {
                write!(f, "no agent binaries found for version {version}")
            }
        }
    }
}

impl std::error::Error for AgentVersionRefusal {}

/// Whether the model's `agent-version` may move from `current` to `requested`, with
/// `record` the current upgrade-info record (if any), in Juju's order:
/// 1. `requested` is the current version: [`AgentVersionChange::Unchanged`], whatever else
///    holds (Juju accepts the current value back);
/// 2. a record is current: refused ([`AgentVersionRefusal::UpgradeInProgress`]);
/// 3. an operator asks for a lower version: refused ([`AgentVersionRefusal::Downgrade`]);
/// 4. otherwise [`AgentVersionChange::Changed`].
///
/// A store calls this inside the transaction that writes the version, so the rule holds
/// for the value written (see [`AgentVersionCheck`]).
pub fn agent_version_change(
    current: Version,
    record: Option<&UpgradeInfo>,
    requested: Version,
    requester: AgentVersionRequester,
) -> Result<AgentVersionChange, AgentVersionRefusal> {
    if requested == current {
        return Ok(AgentVersionChange::Unchanged);
    }
    if let Some(record) = record {
        assert!(
            !record.status.is_final(),
            "a final record is archived, never current: {record:?}"
        );
        return Err(AgentVersionRefusal::UpgradeInProgress { record: *record });
    }
    if requester == AgentVersionRequester::Operator && requested < current {
        return Err(AgentVersionRefusal::Downgrade { current, requested });
    }
    Ok(AgentVersionChange::Changed {
        from: current,
        to: requested,
    })
}

/// The catalogue check of an operator's change: some binary of `version` is listed in the
/// streams the model searches for it ([`Catalogue::lists_version`]).
pub fn check_binaries(
    catalogue: &Catalogue,
    version: Version,
    model_stream: Option<Stream>,
) -> Result<(), AgentVersionRefusal> {
    if catalogue.lists_version(version, model_stream) {
        Ok(())
    } else {
        Err(AgentVersionRefusal::NoBinaries {
            version,
            streams: Stream::preferred(model_stream, &version),
        })
    }
}

/// The most agents an [`AgentVersionRefusal::AgentsBehind`] names; the rest are counted, so
/// the refusal of a fleet that missed an upgrade stays one readable line.
pub const AGENTS_BEHIND_NAMED_MAX: usize = 20;

/// An agent as the agent-version check reads it: its tag and the version it last reported
/// running (`None`: it never reported one).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AgentRunning<'a> {
    /// `machine-1`, ...
    pub tag: &'a str,
    /// The version it runs, as it last reported.
    pub running: Option<Version>,
}

/// Juju's check before an operator's upgrade (`checkCanUpgrade`): every agent runs the
/// model's `current` version. An agent that reported none is behind too, as in Juju.
/// Agents that were down through the last upgrade fail it; it runs only when the operator
/// asks ([`AgentVersionCheck::agents_current`]): by default they catch up when they return.
pub fn check_agents_current(
    current: Version,
    agents: &[AgentRunning<'_>],
) -> Result<(), AgentVersionRefusal> {
    let mut behind: Vec<&str> = agents
        .iter()
        .filter(|agent| agent.running != Some(current))
        .map(|agent| agent.tag)
        .collect();
    if behind.is_empty() {
        return Ok(());
    }
    behind.sort_unstable();
    let unnamed = behind.len().saturating_sub(AGENTS_BEHIND_NAMED_MAX);
    Err(AgentVersionRefusal::AgentsBehind {
        current,
        named: behind
            .into_iter()
            .take(AGENTS_BEHIND_NAMED_MAX)
            .map(str::to_owned)
            .collect(),
        unnamed,
    })
}

/// Everything a store needs to decide an `agent-version` write inside its transaction:
/// who asks, and for an operator the catalogue read beforehand (the version must have a
/// binary). The store reads the model's agent-version and agent-stream and the current
/// record in the same transaction and calls [`AgentVersionCheck::check`]: the decision and
/// the write are atomic.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AgentVersionCheck<'a> {
    /// Who asks.
    pub requester: AgentVersionRequester,
    /// When set, a change (not a no-op) is refused unless this catalogue lists a binary of
    /// the version ([`check_binaries`]).
    pub catalogue: Option<&'a Catalogue>,
    /// When set, a change is refused unless every agent runs the model's version
    /// ([`check_agents_current`]); the store then reads the agents in the same transaction.
    /// Off unless the operator asks: lagging agents do not block an upgrade by default.
    pub agents_current: bool,
}

impl AgentVersionCheck<'static> {
    /// The check of the lifecycle's own `Request::SetAgentVersion`: only the upgrade-info
    /// record can refuse it.
    pub const LIFECYCLE: AgentVersionCheck<'static> = AgentVersionCheck {
        requester: AgentVersionRequester::Lifecycle,
        catalogue: None,
        agents_current: false,
    };
}

impl<'a> AgentVersionCheck<'a> {
    /// An operator's change (`ModelConfig.ModelSet`), checked against `catalogue`.
    pub fn operator(catalogue: &'a Catalogue) -> AgentVersionCheck<'a> {
        AgentVersionCheck {
            requester: AgentVersionRequester::Operator,
            catalogue: Some(catalogue),
            agents_current: false,
        }
    }

    /// This check, also refusing a change while an agent runs another version than the
    /// model's (Juju's default for `Client.SetModelAgentVersion`, which `force` skips).
    pub fn with_agents_current(self) -> AgentVersionCheck<'a> {
        AgentVersionCheck {
            agents_current: true,
            ..self
        }
    }

    /// [`agent_version_change`], then, for a change, [`check_agents_current`] over
    /// `agents` when [`AgentVersionCheck::agents_current`] is set, then [`check_binaries`]
    /// when a catalogue is given. `model_stream` is the model's `agent-stream`; `agents`
    /// is read only for that check (empty otherwise).
    pub fn check(
        &self,
        current: Version,
        model_stream: Option<Stream>,
        record: Option<&UpgradeInfo>,
        requested: Version,
        agents: &[AgentRunning<'_>],
    ) -> Result<AgentVersionChange, AgentVersionRefusal> {
        let change = agent_version_change(current, record, requested, self.requester)?;
        if let AgentVersionChange::Changed { .. } = change {
            if self.agents_current {
                check_agents_current(current, agents)?;
            }
            if let Some(catalogue) = self.catalogue {
                check_binaries(catalogue, requested, model_stream)?;
            }
        }
        Ok(change)
    }
}

// ---------------------------------------------------------------------------------------
// Agents' downloads from their controller
// ---------------------------------------------------------------------------------------

/// The model config key bounding the agent downloads one controller serves at once.
pub const AGENT_DOWNLOADS_MAX_KEY: &str = "max-agent-downloads";

/// Agent downloads one controller serves at once when the model does not say. Enough to
/// fill a 10 Gbit/s egress with agents whose own links give 1 Gbit/s, with room for the
/// slow ones among them (the simulator's fleet, `tests/sim`: at 4 a controller used 13% of
/// its egress); each costs the controller a connection and a 64 KiB read buffer, not a
/// worker or a copy of the binary.
pub const AGENT_DOWNLOADS_MAX_DEFAULT: u32 = 64;

/// The most [`AGENT_DOWNLOADS_MAX_KEY`] may say.
pub const AGENT_DOWNLOADS_MAX_LIMIT: u32 = 1024;

/// What a controller's tools endpoint answers an agent's download.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DownloadAdmission {
    /// Serve it now.
    Admit,
    /// Every slot is taken, or others already wait: hold the request in the controller's
    /// queue, first come first served. It takes the next slot freed, or, after
    /// [`DOWNLOAD_QUEUE_WAIT`] without one, is answered busy. A slot freed goes to the
    /// queue's first request at once, so no slot idles while an agent waits.
    Queue,
    /// Too many in flight and the queue full: answer "busy" (HTTP 503 with `Retry-After`,
    /// [`busy_retry_after`]); the agent retries after that long, with jitter of its own.
    Busy {
        /// The wait the controller asks for.
        retry_after: Millis,
    },
}

/// The shortest wait a busy controller asks of an agent before it tries its download
/// again, and the one it asks before any download of its own ended.
pub const DOWNLOAD_BUSY_RETRY_AFTER: Millis = Millis(1_000);

/// The longest wait a busy controller asks for.
pub const DOWNLOAD_BUSY_RETRY_AFTER_MAX: Millis = Millis(30_000);

/// The wait a busy controller asks of an agent (HTTP `Retry-After`): about the time its
/// queue takes to serve the `waiting` requests ahead, `max` at a time, each taking
/// `transfer` (the controller's estimate from its own downloads, [`transfer_estimate`];
/// `None` before the first ended), so that the agent comes back once there is room rather
/// than at a guess. Within [`DOWNLOAD_BUSY_RETRY_AFTER`] and
/// [`DOWNLOAD_BUSY_RETRY_AFTER_MAX`].
pub fn busy_retry_after(waiting: u32, max: u32, transfer: Option<Millis>) -> Millis {
    let Some(transfer) = transfer else {
        return DOWNLOAD_BUSY_RETRY_AFTER;
    };
    let rounds = u64::from(waiting).div_ceil(u64::from(max.max(1)));
    Millis(
        rounds
            .saturating_mul(transfer.0)
            .clamp(DOWNLOAD_BUSY_RETRY_AFTER.0, DOWNLOAD_BUSY_RETRY_AFTER_MAX.0),
    )
}

/// A controller's estimate of how long one agent download holds its slot, after one more
/// ended in `sample`: a running mean weighing the newest an eighth (`None`: the first).
pub fn transfer_estimate(previous: Option<Millis>, sample: Millis) -> Millis {
    match previous {
        None => sample,
        Some(previous) => Millis((previous.0.saturating_mul(7)).saturating_add(sample.0) / 8),
    }
}

/// Requests a controller's queue holds per download slot: the queue holds at most this
/// times the model's bound ([`download_queue_max`]), so that what waits is bounded (each
/// is an open connection) and drains within about this many transfer times.
pub const DOWNLOAD_QUEUE_PER_SLOT: u32 = 4;

/// How long a request waits in the queue for a slot before it is answered busy: well
/// inside the agent's own patience for an answer (its HTTP source's deadline), so an agent
/// always hears back.
pub const DOWNLOAD_QUEUE_WAIT: Millis = Millis(10_000);

/// The most requests a controller holds in its queue under the model's bound `max`.
pub fn download_queue_max(max: u32) -> u32 {
    max.max(1).saturating_mul(DOWNLOAD_QUEUE_PER_SLOT)
}

/// Whether a controller serving `in_flight` agent downloads, with `waiting` requests in its
/// queue ahead of this one, admits one more now, queues it, or answers busy (asking for
/// [`busy_retry_after`] with its `transfer` estimate), under the model's bound `max` (at
/// least one is always admitted). A request never overtakes one that waits.
pub fn admit_agent_download(
    in_flight: u32,
    waiting: u32,
    max: u32,
    transfer: Option<Millis>,
) -> DownloadAdmission {
    if in_flight < max.max(1) && waiting == 0 {
        DownloadAdmission::Admit
    } else if waiting < download_queue_max(max) {
        DownloadAdmission::Queue
    } else {
        DownloadAdmission::Busy {
            retry_after: busy_retry_after(waiting, max, transfer),
        }
    }
}

/// The model's bound on agent downloads from its config value: a whole number in
/// `1..=`[`AGENT_DOWNLOADS_MAX_LIMIT`]; anything else (absent, zero, not a number) is the
/// default, [`AGENT_DOWNLOADS_MAX_DEFAULT`].
pub fn agent_downloads_max(configured: Option<u64>) -> u32 {
    match configured {
        Some(value) if (1..=u64::from(AGENT_DOWNLOADS_MAX_LIMIT)).contains(&value) => value as u32,
        _ => AGENT_DOWNLOADS_MAX_DEFAULT,
    }
}

/// The size of a link probe: what a machine agent that knows no download rate for its link
/// (it never downloaded a binary: provisioned from the controller's own disk) fetches from
/// its controller's probe endpoint soon after it starts, so that a fleet's first rollout
/// can admit its slow links early (`rollout::admission_order`) as a later one does. Large
/// enough that a slow link (10-100 Mbit/s) shows as slow against a controller's share per
/// download slot, small enough that a fleet's probes cost a sliver of its controllers'
/// egress (10,000 agents: about 1.7% of one 60 MB binary each). Served outside the
/// download slots.
pub const LINK_PROBE_BYTES: u64 = 1 << 20;

/// How long a machine agent waits before it probes its link again after a probe failed
/// (the controller down, restarting, the connection cut, or serving
/// [`LINK_PROBES_AT_ONCE`] probes already).
pub const LINK_PROBE_RETRY: Millis = Millis(30_000);

/// Link probes one controller serves at once; past it a probe is answered 503 and the
/// agent probes again after [`LINK_PROBE_RETRY`]. A probe shares the controller's egress
/// with the downloads and the other probes, so it measures the smaller of the agent's link
/// and that share: bounded, the share stays above the slow links a rollout must admit
/// early (10,000 agents probing at once, 64 probes beside 64 downloads: about 78 Mbit/s
/// of a 10 Gbit/s egress each).
pub const LINK_PROBES_AT_ONCE: u32 = 64;

/// The spread of the agents' start after they learn a new version: each waits a random
/// part of it before asking for its binary, so that a fleet does not arrive at once.
pub const AGENT_UPGRADE_SPREAD: Millis = Millis(3_000);

/// An agent's wait before it starts an upgrade, from a random draw (`jitter`, any value):
/// uniform over [`AGENT_UPGRADE_SPREAD`].
pub fn agent_upgrade_delay(jitter: u64) -> Millis {
    Millis(jitter % AGENT_UPGRADE_SPREAD.0.max(1))
}

/// The wait before an agent's `attempt`-th retry (from 1) of a download its controller
/// answered busy: the `retry_after` it asked for (a lockstep controller's estimate of when
/// its queue has room, [`busy_retry_after`]; at most [`DOWNLOAD_BUSY_RETRY_AFTER_MAX`]), or, when it asked for none, doubling from
/// [`DOWNLOAD_BUSY_RETRY_AFTER`] up to [`DOWNLOAD_BUSY_RETRY_AFTER_MAX`]; plus a random
/// part of up to half as much (`jitter`, any value), so that agents turned away together
/// do not come back together. (Until 2026-12-05 it doubled from the wait asked, plus as
/// much again: up to a minute, while the controller's slots stood free; the simulator's
/// fleet showed agents coming back after every other one was done.)
pub fn busy_download_backoff(attempt: u32, retry_after: Option<Millis>, jitter: u64) -> Millis {
    let base = match retry_after {
        // Bounded as a lockstep controller bounds what it asks: a `Retry-After` of a day
        // would otherwise park the agent's download past its own patience.
        Some(asked) => asked.0.clamp(1, DOWNLOAD_BUSY_RETRY_AFTER_MAX.0),
        None => DOWNLOAD_BUSY_RETRY_AFTER
            .0
            .saturating_mul(1 << attempt.saturating_sub(1).min(5))
            .min(DOWNLOAD_BUSY_RETRY_AFTER_MAX.0),
    };
    Millis(base + jitter % (base / 2 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{ControllerSet, UpgradeStatus};
    use crate::policy::{CatalogueEntry, Sha256};

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn b(text: &str) -> Binary {
        Binary::parse(text).unwrap()
    }

    fn controller_roles() -> Roles {
        Roles::of(&[Role::Controller])
    }

    fn host_roles() -> Roles {
        Roles::of(&[Role::HostMachine])
    }

    #[test]
    fn a_controller_is_told_the_models_version() {
        let reported = b("2.9.43-ubuntu-amd64");
        let agent = AskingAgent {
            roles: controller_roles(),
            reported: Some(&reported),
        };
        assert_eq!(
            desired_version(v("2.9.44"), agent, [Some(&reported)], v("2.9.43")),
            v("2.9.44")
        );
    }

    #[test]
    fn a_machine_waits_until_every_controller_reported_the_version() {
        let old = b("2.9.43-ubuntu-amd64");
        let new = b("2.9.44-ubuntu-amd64");
        let agent = AskingAgent {
            roles: host_roles(),
            reported: Some(&old),
        };
        let wanted = v("2.9.44");
        // Every controller reported 2.9.44 and the server runs it: go.
        assert_eq!(
            desired_version(wanted, agent, [Some(&new), Some(&new)], wanted),
            wanted
        );
        // One controller still reports 2.9.43: stay on what the agent runs.
        assert_eq!(
            desired_version(wanted, agent, [Some(&new), Some(&old)], wanted),
            v("2.9.43")
        );
        // One never reported: it does not run 2.9.44 as far as anyone knows.
        assert_eq!(
            desired_version(wanted, agent, [Some(&new), None], wanted),
            v("2.9.43")
        );
        // The server answering runs an older version itself.
        assert_eq!(
            desired_version(wanted, agent, [Some(&new)], v("2.9.43")),
            v("2.9.43")
        );
        // An agent that never reported is told the server's version meanwhile.
        let silent = AskingAgent {
            roles: host_roles(),
            reported: None,
        };
        assert_eq!(
            desired_version(wanted, silent, [Some(&old)], v("2.9.43")),
            v("2.9.43")
        );
        // No controller machine at all: the server alone decides.
        assert_eq!(
            desired_version(wanted, agent, std::iter::empty(), wanted),
            wanted
        );
    }

    #[test]
    fn a_legacy_machine_is_a_controller_by_its_jobs() {
        let manage = [Job::new("JobManageModel").unwrap()];
        let host = [Job::new("JobHostUnits").unwrap()];
        assert!(machine_roles(Roles::NONE, &manage).contains(Role::Controller));
        assert!(!machine_roles(Roles::NONE, &host).contains(Role::Controller));
        // Stored roles win over jobs.
        assert_eq!(machine_roles(host_roles(), &manage), host_roles());
    }

    fn record() -> UpgradeInfo {
        UpgradeInfo {
            previous_version: v("2.9.43"),
            target_version: v("2.9.44"),
            status: UpgradeStatus::Pending,
            controllers_ready: ControllerSet::EMPTY,
            controllers_done: ControllerSet::EMPTY,
        }
    }

    #[test]
    fn agent_version_changes_in_jujus_order() {
        use AgentVersionRequester::{Lifecycle, Operator};
        let record = record();
        let cases: &[(
            &str,
            Option<&UpgradeInfo>,
            &str,
            AgentVersionRequester,
            &str,
        )] = &[
            ("2.9.44", None, "2.9.44", Operator, "unchanged"),
            // The current value back is accepted even while a record is current.
            ("2.9.44", Some(&record), "2.9.44", Operator, "unchanged"),
            ("2.9.43", None, "2.9.44", Operator, "2.9.43 -> 2.9.44"),
            (
                "2.9.43",
                Some(&record),
                "2.9.45",
                Operator,
                "an upgrade is already in progress or the last upgrade did not complete",
            ),
            // The record is checked before the downgrade, as Juju does.
            (
                "2.9.44",
                Some(&record),
                "2.9.43",
                Lifecycle,
                "an upgrade is already in progress or the last upgrade did not complete",
            ),
            (
                "2.9.44",
                None,
                "2.9.43",
                Operator,
                "cannot change agent-version from 2.9.44 to the lower version 2.9.43: \
                 downgrades are not supported",
            ),
            // The lifecycle resets agent-version to the version it runs.
            ("2.9.44", None, "2.9.43", Lifecycle, "2.9.44 -> 2.9.43"),
        ];
        for &(current, record, requested, requester, expected) in cases {
            let outcome = agent_version_change(v(current), record, v(requested), requester);
            let described = match outcome {
                Ok(AgentVersionChange::Unchanged) => "unchanged".to_owned(),
                Ok(AgentVersionChange::Changed { from, to }) => format!("{from} -> {to}"),
                Err(refusal) => refusal.to_string(),
            };
            assert_eq!(
                described, expected,
                "{current} -> {requested} by {requester:?}, record {record:?}"
            );
        }
    }

    #[test]
    fn an_operator_change_needs_a_binary_in_the_models_streams() {
        let entry = |binary: &str, stream| CatalogueEntry {
            binary: b(binary),
            stream,
            size_bytes: 1024,
            sha256: Sha256([1; 32]),
            path: format!("agent/juju-{binary}.tgz"),
        };
        let catalogue = Catalogue::new(vec![
            entry("2.9.44-ubuntu-amd64", Stream::Released),
            entry("2.9.45-ubuntu-amd64", Stream::Proposed),
        ])
        .unwrap();
        let operator = AgentVersionCheck::operator(&catalogue);
        assert_eq!(
            operator.check(v("2.9.43"), None, None, v("2.9.44"), &[]),
            Ok(AgentVersionChange::Changed {
                from: v("2.9.43"),
                to: v("2.9.44")
            })
        );
        let refusal = operator
            .check(v("2.9.43"), None, None, v("2.9.45"), &[])
            .unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "no agent binaries found for version 2.9.45"
        );
        assert_eq!(refusal.code(), "not found");
        assert_eq!(
            operator.check(v("2.9.43"), Some(Stream::Proposed), None, v("2.9.45"), &[]),
            Ok(AgentVersionChange::Changed {
                from: v("2.9.43"),
                to: v("2.9.45")
            })
        );
        // A no-op needs no binary (Juju accepts the current value back).
        assert_eq!(
            operator.check(v("2.9.46"), None, None, v("2.9.46"), &[]),
            Ok(AgentVersionChange::Unchanged)
        );
        // The lifecycle's own write is not checked against a catalogue.
        assert!(
            AgentVersionCheck::LIFECYCLE
                .check(v("2.9.43"), None, None, v("2.9.47"), &[])
                .is_ok()
        );
        let in_progress = AgentVersionRefusal::UpgradeInProgress { record: record() };
        assert_eq!(in_progress.code(), "upgrade in progress");
    }

    #[test]
    fn agents_behind_refuse_a_change_only_when_the_operator_asks() {
        let catalogue = Catalogue::new(vec![CatalogueEntry {
            binary: b("2.9.44-ubuntu-amd64"),
            stream: Stream::Released,
            size_bytes: 1024,
            sha256: Sha256([1; 32]),
            path: "agent/juju-2.9.44-ubuntu-amd64.tgz".into(),
        }])
        .unwrap();
        let agents = [
            AgentRunning {
                tag: "machine-0",
                running: Some(v("2.9.43")),
            },
            AgentRunning {
                tag: "machine-2",
                running: Some(v("2.9.42")),
            },
            AgentRunning {
                tag: "machine-1",
                running: None,
            },
        ];
        let changed = Ok(AgentVersionChange::Changed {
            from: v("2.9.43"),
            to: v("2.9.44"),
        });
        // By default agents that lag do not block the next upgrade.
        let operator = AgentVersionCheck::operator(&catalogue);
        assert_eq!(
            operator.check(v("2.9.43"), None, None, v("2.9.44"), &agents),
            changed
        );
        // Asked for, they do, named in Juju's words and order; one that never reported
        // is behind too.
        let asked = operator.with_agents_current();
        let refusal = asked
            .check(v("2.9.43"), None, None, v("2.9.44"), &agents)
            .unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "some agents have not upgraded to the current model version 2.9.43: \
             machine-1, machine-2"
        );
        assert_eq!(refusal.code(), "");
        assert_eq!(
            asked.check(v("2.9.43"), None, None, v("2.9.44"), &agents[..1]),
            changed
        );
        // The current value back is no change: nothing to check.
        assert_eq!(
            asked.check(v("2.9.43"), None, None, v("2.9.43"), &agents),
            Ok(AgentVersionChange::Unchanged)
        );
        // A fleet that missed an upgrade is counted past the names.
        let tags: Vec<String> = (0..25).map(|n| format!("machine-{n:02}")).collect();
        let fleet: Vec<AgentRunning<'_>> = tags
            .iter()
            .map(|tag| AgentRunning { tag, running: None })
            .collect();
        let message = asked
            .check(v("2.9.43"), None, None, v("2.9.44"), &fleet)
            .unwrap_err()
            .to_string();
        assert!(
            message.ends_with("machine-18, machine-19, and 5 more"),
            "{message}"
        );
    }

    #[test]
    fn a_download_is_admitted_below_the_bound_queued_at_it_and_busy_past_the_queue() {
        assert_eq!(
            admit_agent_download(0, 0, 4, None),
            DownloadAdmission::Admit
        );
        assert_eq!(
            admit_agent_download(3, 0, 4, None),
            DownloadAdmission::Admit
        );
        // Full: queued, up to four per slot, then busy.
        assert_eq!(
            admit_agent_download(4, 0, 4, None),
            DownloadAdmission::Queue
        );
        assert_eq!(
            admit_agent_download(4, 15, 4, None),
            DownloadAdmission::Queue
        );
        assert_eq!(
            admit_agent_download(4, 16, 4, None),
            DownloadAdmission::Busy {
                retry_after: DOWNLOAD_BUSY_RETRY_AFTER
            }
        );
        // With downloads of 3 s measured, the queue of 16 ahead drains in 4 rounds.
        assert_eq!(
            admit_agent_download(4, 16, 4, Some(Millis(3_000))),
            DownloadAdmission::Busy {
                retry_after: Millis(12_000)
            }
        );
        // A free slot is not taken past a request that waits (the bound was raised).
        assert_eq!(
            admit_agent_download(3, 1, 8, None),
            DownloadAdmission::Queue
        );
        // A bound of zero would starve every agent: one is always admitted.
        assert_eq!(
            admit_agent_download(0, 0, 0, None),
            DownloadAdmission::Admit
        );
        assert_eq!(
            admit_agent_download(1, 0, 0, None),
            DownloadAdmission::Queue
        );
        assert!(matches!(
            admit_agent_download(1, 4, 0, None),
            DownloadAdmission::Busy { .. }
        ));
    }

    #[test]
    fn a_busy_controller_asks_for_the_time_its_queue_takes_within_bounds() {
        assert_eq!(busy_retry_after(256, 64, None), DOWNLOAD_BUSY_RETRY_AFTER);
        assert_eq!(
            busy_retry_after(256, 64, Some(Millis(3_000))),
            Millis(12_000)
        );
        assert_eq!(
            busy_retry_after(0, 64, Some(Millis(10))),
            DOWNLOAD_BUSY_RETRY_AFTER
        );
        assert_eq!(
            busy_retry_after(1_000, 1, Some(Millis(60_000))),
            DOWNLOAD_BUSY_RETRY_AFTER_MAX
        );
        assert_eq!(transfer_estimate(None, Millis(800)), Millis(800));
        assert_eq!(
            transfer_estimate(Some(Millis(800)), Millis(1_600)),
            Millis(900)
        );
    }

    #[test]
    fn the_models_download_bound_is_a_whole_number_in_range_or_the_default() {
        assert_eq!(agent_downloads_max(None), AGENT_DOWNLOADS_MAX_DEFAULT);
        assert_eq!(agent_downloads_max(Some(0)), AGENT_DOWNLOADS_MAX_DEFAULT);
        assert_eq!(agent_downloads_max(Some(1)), 1);
        assert_eq!(agent_downloads_max(Some(1024)), 1024);
        assert_eq!(agent_downloads_max(Some(1025)), AGENT_DOWNLOADS_MAX_DEFAULT);
    }

    #[test]
    fn busy_backoff_follows_the_servers_wait_or_doubles_without_one_and_spreads() {
        // The controller said: its wait, however many busy answers came before.
        let asked = Some(Millis(12_000));
        assert_eq!(busy_download_backoff(1, asked, 0), Millis(12_000));
        assert_eq!(busy_download_backoff(9, asked, 0), Millis(12_000));
        assert_eq!(busy_download_backoff(1, asked, 6_000), Millis(18_000));
        assert_eq!(busy_download_backoff(1, asked, 6_001), Millis(12_000));
        // However long it asks for, no longer than a lockstep controller would ask.
        let day = Some(Millis(86_400_000));
        assert_eq!(
            busy_download_backoff(1, day, 0),
            DOWNLOAD_BUSY_RETRY_AFTER_MAX
        );
        // It did not: doubling from a second up to the cap.
        assert_eq!(busy_download_backoff(1, None, 0), Millis(1_000));
        assert_eq!(busy_download_backoff(2, None, 0), Millis(2_000));
        assert_eq!(busy_download_backoff(6, None, 0), Millis(30_000));
        assert_eq!(busy_download_backoff(60, None, 0), Millis(30_000));
        for jitter in [0, 1, 7, u64::MAX] {
            let wait = busy_download_backoff(3, None, jitter);
            assert!(wait >= Millis(4_000) && wait <= Millis(6_000), "{wait:?}");
            assert!(agent_upgrade_delay(jitter) < AGENT_UPGRADE_SPREAD);
        }
    }
}
