//! Staged rollouts of machine agents: which agents are told a new version, in what order,
//! and when the rollout stops. Juju upgrades every machine agent as soon as its controllers
//! are done; fleets elsewhere (Teleport's canary groups, Mender's phased deployments) go in
//! stages. Here a rollout first upgrades a few *canary* agents, which must become healthy
//! (Ready on the new version, as their status reports say) within a bound; then at most
//! [`RolloutPolicy::max_at_once`] agents upgrade at a time; and it *halts* as soon as a
//! canary fails or more than [`RolloutPolicy::failures_tolerated`] agents failed.
//!
//! The rollout's state is a [`Rollout`] record, which the coordinator keeps in the shared
//! store with fenced writes (so a coordinator change loses nothing: the next coordinator
//! reads the record and goes on). [`advance`] is the one decision: given the record, the
//! policy, what every agent last reported and the time, it returns the record to write.
//! [`desired`] answers an agent's `Upgrader.DesiredVersion` from the record, after the
//! controllers-first rule ([`crate::upgrader::desired_version`]) has allowed the target.
//! [`resume`] and [`abort`] are the operator's verbs. Like the rest of the crate, this
//! performs no I/O and reads no clock; the record is bounded by the fleet the caller passes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::time::{Millis, Timestamp};
use crate::version::Version;

/// Model config: the number of canary agents upgraded first (0: none).
pub const CANARIES_KEY: &str = "rollout-canaries";
/// Model config: the most agents upgrading at once (0: no bound but the download bound).
pub const MAX_AT_ONCE_KEY: &str = "rollout-max-at-once";
/// Model config: the rollout halts when more than this many agents failed.
pub const FAILURES_TOLERATED_KEY: &str = "rollout-failures-tolerated";
/// Model config: seconds a canary has to become healthy on the new version.
pub const CANARY_DEADLINE_KEY: &str = "rollout-canary-deadline";

/// How long a canary has to become healthy by default.
pub const CANARY_DEADLINE_DEFAULT: Millis = Millis(10 * 60 * 1000);

/// How a rollout proceeds: the model's `rollout-*` settings.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RolloutPolicy {
    /// Agents upgraded first, alone; every other agent waits until they are all healthy.
    pub canaries: u32,
    /// How long each canary has, from its admission, to report Ready on the target.
    pub canary_deadline: Millis,
    /// The most admitted agents not yet healthy on the target at once; 0: no bound.
    pub max_at_once: u32,
    /// The rollout halts when more than this many admitted agents failed.
    pub failures_tolerated: u32,
}

impl Default for RolloutPolicy {
    /// Juju's behaviour: no canaries, every agent at once, never halted.
    fn default() -> RolloutPolicy {
        RolloutPolicy {
            canaries: 0,
            canary_deadline: CANARY_DEADLINE_DEFAULT,
            max_at_once: 0,
            failures_tolerated: u32::MAX,
        }
    }
}

/// What an agent last reported, as the rollout reads it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AgentView {
    /// Its machine id (`1`): the rollout goes through agents in this order.
    pub id: String,
    /// The version it reported running (`Upgrader.SetTools`); `None` until it reported.
    pub running: Option<Version>,
    /// Its health, from its last status report.
    pub health: Health,
    /// Bytes per second its last agent-binary download ran at, first byte to last, as the
    /// agent reported it (`data.download-rate` in its status); `None` when it never said.
    pub download_rate: Option<u64>,
}

/// An agent's health, from its last status report (`Machiner.SetStatus`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Health {
    /// Ready (`started`, phase `ready`).
    Ready,
    /// Alive and working (upgrading, running steps, restarting).
    Busy,
    /// It reported a failure (`error`), with its message.
    Failed(String),
    /// It stopped reporting (`down`): neither admitted nor counted until it is back.
    Down,
}

impl Health {
    /// An agent's health from its last status report (`Machiner.SetStatus`): its status
    /// word, message and lockstep phase, and whether it is `silent` (older than the
    /// controllers' down bound, or never sent): down when silent, failed when it reports
    /// `error` (its message the reason), Ready in phase `ready`, else busy. The one reading
    /// of a report, for the controllers' coordinator and the simulator's alike.
    pub fn of_report(status: &str, info: &str, phase: &str, silent: bool) -> Health {
        if silent {
            Health::Down
        } else if status == "error" {
            Health::Failed(info.to_owned())
        } else if phase == crate::Phase::Ready.as_str() {
            Health::Ready
        } else {
            Health::Busy
        }
    }
}

/// Why a rollout halted: the agents that failed and what each said.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Halt {
    /// The failed agents by id, with their reasons.
    pub failed: BTreeMap<String, String>,
}

/// A rollout of one target version: the record the coordinator stores.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Rollout {
    /// The version the agents move to.
    pub target: Version,
    /// The agents told the target, by id, with when they were admitted.
    pub admitted: BTreeMap<String, Timestamp>,
    /// The canaries among them, chosen when the rollout began.
    pub canaries: BTreeSet<String>,
    /// Set once every canary was healthy on the target: the others may go from then on,
    /// and a canary failing later counts as any other agent's failure.
    pub canaries_passed: bool,
    /// Admitted agents that failed, with their reasons (a canary past its deadline too).
    pub failed: BTreeMap<String, String>,
    /// Set when the rollout halted; no agent is admitted until [`resume`].
    pub halted: Option<Halt>,
    /// Agents held on the version they run by [`abort`], by id: told that version.
    pub held: BTreeMap<String, Version>,
    /// Agents told to fetch the target ahead of their admission while the canaries try it
    /// ([`stage_ahead`]): the first agents [`advance`] will admit after them, as many as
    /// [`RolloutPolicy::max_at_once`] leaves beside the canaries (with the canaries, no
    /// more agents receive a binary at once than the policy admits; every other agent when
    /// it sets no bound). Each downloads, verifies and keeps the binary, runs what it runs,
    /// and switches only once admitted, so the controllers' egress works while the canaries
    /// download, restart, run their steps and report Ready. Chosen with the canaries;
    /// emptied once they passed (these agents are admitted first) or the rollout halted
    /// (the binary stays on disk, unused). Not counted in [`Rollout::in_flight`]: an agent
    /// fetching ahead runs its version.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub staging: BTreeSet<String>,
}

impl Rollout {
    /// A rollout of `target` that has admitted no agent yet.
    pub fn new(target: Version) -> Rollout {
        Rollout {
            target,
            admitted: BTreeMap::new(),
            canaries: BTreeSet::new(),
            canaries_passed: false,
            failed: BTreeMap::new(),
            halted: None,
            held: BTreeMap::new(),
            staging: BTreeSet::new(),
        }
    }

    /// Whether agent `id` is told to fetch the target ahead of its admission
    /// ([`stage_ahead`], whatever it runs): among the staging, or a canary before anyone
    /// was admitted ([`prepare`]: the controllers still go first; once admissions begin, a
    /// canary waiting for room is not told ahead, which would put more agents receiving
    /// than the bound); not admitted, failed or held; the rollout not halted.
    pub fn told_ahead(&self, id: &str) -> bool {
        let chosen =
            self.staging.contains(id) || (self.canaries.contains(id) && self.admitted.is_empty());
        chosen
            && self.halted.is_none()
            && !self.admitted.contains_key(id)
            && !self.failed.contains_key(id)
            && !self.held.contains_key(id)
    }

    /// The agents told to fetch the target ahead ([`Rollout::told_ahead`]), in id order.
    pub fn fetching_ahead(&self) -> BTreeSet<&str> {
        self.staging
            .iter()
            .chain(&self.canaries)
            .map(String::as_str)
            .filter(|id| self.told_ahead(id))
            .collect()
    }

    /// Admitted agents that are neither healthy on the target nor failed.
    pub fn in_flight(&self, agents: &[AgentView]) -> usize {
        agents
            .iter()
            .filter(|agent| self.admitted.contains_key(&agent.id))
            .filter(|agent| !self.failed.contains_key(&agent.id))
            .filter(|agent| !healthy_on(agent, self.target))
            .count()
    }
}

/// In an admission order, one agent in this many is taken from the slow end of the known
/// download rates ([`admission_order`]); the others from the fast end.
pub const SLOW_LINK_EVERY: usize = 9;

/// The order in which `candidates` (in machine-id order) are admitted, after
/// `admitted_before` agents were (the canaries included): the turns are counted over the
/// whole rollout, so the share holds however many each coordinator pass admits.
///
/// An agent on a slow link takes many times longer than the others to download its binary
/// whenever it is admitted; admitted late, it keeps the fleet's upgrade going long after the
/// controllers' egress has gone quiet. So the agents whose last download was slowest go
/// early. Not all at once, though: a controller bounds the downloads it serves at a time
/// (`max-agent-downloads`), and slow transfers holding every slot leave its egress idle.
/// So one admission in [`SLOW_LINK_EVERY`] (the first, the tenth, ...) goes to the slowest
/// agent not yet taken and the others to the fastest; agents whose rate is unknown count
/// as the fastest (in machine-id order among themselves). With no rate known, this is
/// machine-id order. The simulator's
/// fleet (`tests/sim`, spec/rollout.md) chose the share: 1 in 4 left up to a third of the
/// egress idle from 10 s to 40 s, 1 in 9 kept it full.
pub fn admission_order<'a>(
    candidates: &[&'a AgentView],
    admitted_before: usize,
) -> Vec<&'a AgentView> {
    let (mut known, unknown): (Vec<&AgentView>, Vec<&AgentView>) = candidates
        .iter()
        .copied()
        .partition(|agent| agent.download_rate.is_some());
    // Fastest first; the sort is stable, so machine-id order stays among equal rates.
    known.sort_by_key(|agent| std::cmp::Reverse(agent.download_rate));
    // The unknown first, then the known from the fastest: the front is the fast end, the
    // back the slowest known.
    let mut line: VecDeque<&AgentView> = unknown.into_iter().chain(known).collect();
    let mut order = Vec::with_capacity(line.len());
    while !line.is_empty() {
        let slow_turn = (admitted_before + order.len()).is_multiple_of(SLOW_LINK_EVERY)
            && line
                .back()
                .is_some_and(|agent| agent.download_rate.is_some());
        let next = if slow_turn {
            line.pop_back()
        } else {
            line.pop_front()
        };
        order.extend(next);
    }
    order
}

/// The order in which canaries are chosen among `candidates` (in machine-id order): the
/// fastest known download rates first, then the agents whose rate is unknown, in
/// machine-id order. A canary is there to try the binary, which a slow link does not try
/// any better, and every other agent waits until the last canary is Ready: a canary on a
/// slow link would hold the whole fleet back. With no rate known, machine-id order.
pub fn canary_order<'a>(candidates: &[&'a AgentView]) -> Vec<&'a AgentView> {
    let mut order = candidates.to_vec();
    // Stable: machine-id order among equal rates, and among the unknown (`None` sorts
    // below every rate, so the unknown go after the known).
    order.sort_by_key(|agent| std::cmp::Reverse(agent.download_rate));
    order
}

/// True when `agent` reported running `target` and is Ready.
fn healthy_on(agent: &AgentView, target: Version) -> bool {
    agent.running == Some(target) && agent.health == Health::Ready
}

/// One step of the rollout: the record to write after reading what every agent reported
/// at `now`. Records failures (an admitted agent that reported one; a canary not healthy
/// on the target within [`RolloutPolicy::canary_deadline`]), halts when a canary failed or
/// more than [`RolloutPolicy::failures_tolerated`] agents did, and otherwise admits agents:
/// the canaries first (in [`canary_order`], chosen now if not yet chosen, among agents
/// that are not down and do not run the target already), nobody else until every canary
/// is healthy on the target, then, in [`admission_order`], as many as
/// [`RolloutPolicy::max_at_once`] leaves room for. An agent
/// down is not admitted (it catches up once it is back) and blocks nothing; an agent that
/// already runs the target needs no admission. Calling it again with the same inputs
/// changes nothing more.
pub fn advance(
    policy: &RolloutPolicy,
    rollout: &Rollout,
    agents: &[AgentView],
    now: Timestamp,
) -> Rollout {
    let mut next = rollout.clone();
    let mut ordered: Vec<&AgentView> = agents.iter().collect();
    ordered.sort_by(|a, b| machine_order(&a.id, &b.id));

    // Failures among the admitted.
    for agent in &ordered {
        let Some(&admitted_at) = next.admitted.get(&agent.id) else {
            continue;
        };
        if next.failed.contains_key(&agent.id) || healthy_on(agent, next.target) {
            continue;
        }
        if let Health::Failed(reason) = &agent.health {
            next.failed.insert(agent.id.clone(), reason.clone());
        } else if next.canaries.contains(&agent.id)
            && now.millis_since(admitted_at) > policy.canary_deadline.0
        {
            next.failed.insert(
                agent.id.clone(),
                format!(
                    "canary not healthy on {} within {} s",
                    next.target,
                    policy.canary_deadline.0 / 1000
                ),
            );
        }
    }
    let canary_failed =
        !next.canaries_passed && next.failed.keys().any(|id| next.canaries.contains(id));
    if next.halted.is_none()
        && (canary_failed || next.failed.len() as u64 > u64::from(policy.failures_tolerated))
    {
        next.halted = Some(Halt {
            failed: next.failed.clone(),
        });
    }
    if next.halted.is_some() {
        next.staging.clear();
        return next;
    }

    let candidates = candidates(&next, &ordered);
    choose_canaries(policy, &mut next, &candidates);
    // A policy with canaries passes them only once some were chosen and all of them are
    // healthy: with no agent up to choose from (a fleet down at the first pass), none pass
    // vacuously, or the fleet would go without canaries when it comes back.
    let canaries_healthy = next.canaries_passed
        || ((policy.canaries == 0 || !next.canaries.is_empty())
            && next.canaries.iter().all(|id| {
                ordered
                    .iter()
                    .any(|agent| agent.id == *id && healthy_on(agent, next.target))
            }));
    next.canaries_passed = canaries_healthy;
    let wave = match policy.max_at_once {
        0 => usize::MAX,
        max => max as usize,
    };
    if canaries_healthy {
        next.staging.clear();
    } else {
        choose_staging(policy, &mut next, &candidates);
    }
    let room = wave.saturating_sub(next.in_flight(agents));
    let mut order = admission_order(&candidates, next.admitted.len());
    // The agents that fetched the target ahead go first (stable: in admission order
    // among themselves): their binary is on disk already.
    order.sort_by_key(|agent| !rollout.staging.contains(&agent.id));
    let admit: Vec<String> = order
        .into_iter()
        .filter(|agent| canaries_healthy || next.canaries.contains(&agent.id))
        .take(room)
        .map(|agent| agent.id.clone())
        .collect();
    let admitted_now = !admit.is_empty();
    for id in admit {
        next.admitted.insert(id, now);
    }
    // Postconditions: an admission never takes the agents in flight past the bound (an
    // agent healthy on the target that restarts counts again, admitted or not), and no one
    // but a canary is admitted before every canary is healthy.
    assert!(
        !admitted_now
            || policy.max_at_once == 0
            || next.in_flight(agents) <= policy.max_at_once as usize
    );
    assert!(
        canaries_healthy
            || next
                .admitted
                .keys()
                .all(|id| rollout.admitted.contains_key(id) || next.canaries.contains(id))
    );
    next
}

/// Who may be admitted (in the order of `ordered`): up and not reporting a failure, not
/// admitted, not on the target already, not held.
fn candidates<'a>(rollout: &Rollout, ordered: &[&'a AgentView]) -> Vec<&'a AgentView> {
    ordered
        .iter()
        .copied()
        .filter(|agent| matches!(agent.health, Health::Ready | Health::Busy))
        .filter(|agent| !rollout.admitted.contains_key(&agent.id))
        .filter(|agent| !rollout.held.contains_key(&agent.id))
        .filter(|agent| agent.running != Some(rollout.target))
        .collect()
}

/// The canaries, in [`canary_order`] among `candidates`, unless chosen already.
fn choose_canaries(policy: &RolloutPolicy, rollout: &mut Rollout, candidates: &[&AgentView]) {
    if policy.canaries > 0 && !rollout.canaries_passed && rollout.canaries.is_empty() {
        rollout.canaries = canary_order(candidates)
            .iter()
            .take(policy.canaries as usize)
            .map(|agent| agent.id.clone())
            .collect();
    }
}

/// [`Rollout::staging`], unless chosen already: once canaries are chosen, the first agents
/// after them in [`admission_order`], as many as the bound leaves beside the canaries.
fn choose_staging(policy: &RolloutPolicy, rollout: &mut Rollout, candidates: &[&AgentView]) {
    if !rollout.staging.is_empty() || rollout.canaries.is_empty() {
        return;
    }
    let beside = match policy.max_at_once {
        0 => usize::MAX,
        max => (max as usize).saturating_sub(rollout.canaries.len()),
    };
    let others: Vec<&AgentView> = candidates
        .iter()
        .copied()
        .filter(|agent| !rollout.canaries.contains(&agent.id))
        .collect();
    rollout.staging = admission_order(&others, rollout.canaries.len())
        .into_iter()
        .take(beside)
        .map(|agent| agent.id.clone())
        .collect();
}

/// The record while Juju's controllers-first rule lets no agent switch yet (not every
/// controller reported running the target): the canaries are chosen as [`advance`] would
/// choose them, and so is [`Rollout::staging`]; nobody is admitted. The canaries and the
/// agents fetching ahead download the binary ([`stage_ahead`]) while the controllers
/// upgrade themselves, so the controllers' egress works from the moment `agent-version` is
/// set, and each canary switches as soon as it is admitted. Only a policy with canaries,
/// no more than the bound admits at once, prepares (without canaries every agent goes at
/// once once the controllers run the target, and there is no first set to choose); a
/// halted record, or one that admitted agents already, prepares nothing. Calling it again
/// with the same inputs changes nothing more.
pub fn prepare(policy: &RolloutPolicy, rollout: &Rollout, agents: &[AgentView]) -> Rollout {
    let mut next = rollout.clone();
    let canaries_beyond_the_bound = policy.max_at_once > 0 && policy.canaries > policy.max_at_once;
    if policy.canaries == 0
        || canaries_beyond_the_bound
        || next.halted.is_some()
        || !next.admitted.is_empty()
    {
        return next;
    }
    let mut ordered: Vec<&AgentView> = agents.iter().collect();
    ordered.sort_by(|a, b| machine_order(&a.id, &b.id));
    let candidates = candidates(&next, &ordered);
    choose_canaries(policy, &mut next, &candidates);
    choose_staging(policy, &mut next, &candidates);
    // Postcondition: nobody admitted, and no more agents fetch ahead than the bound admits.
    assert_eq!(next.admitted, rollout.admitted);
    assert!(
        policy.max_at_once == 0
            || next.staging.len() + next.canaries.len() <= policy.max_at_once as usize
    );
    next
}

/// The version agent `id`, which reported running `running`, is told while `rollout` goes
/// on (`None`: it never reported, and is told the target only once admitted): the target
/// once admitted, the version an abort held it on, else the version it runs. An agent
/// recorded failed is told the version it runs: one that fell back from a bad binary stays
/// where it is, not sent to the same binary again, until [`resume`].
pub fn desired(rollout: &Rollout, id: &str, running: Option<Version>) -> Option<Version> {
    if let Some(version) = rollout.held.get(id) {
        return Some(*version);
    }
    if rollout.failed.contains_key(id) && running.is_some() {
        return running;
    }
    if rollout.admitted.contains_key(id) || running == Some(rollout.target) {
        return Some(rollout.target);
    }
    running
}

/// The version agent `id`, which reported running `running`, is told to fetch ahead of its
/// admission (`Upgrader.DesiredVersion`'s `stage-version`): the target while it is among
/// [`Rollout::staging`] or a canary before any admission (the controllers still go first,
/// see [`prepare`]), not admitted, failed or held, the rollout not halted, and it does not
/// run the target ([`Rollout::told_ahead`]). It downloads and verifies the binary and
/// keeps it, and runs what it runs until [`desired`] tells it the target.
pub fn stage_ahead(rollout: &Rollout, id: &str, running: Option<Version>) -> Option<Version> {
    (rollout.told_ahead(id) && running != Some(rollout.target)).then_some(rollout.target)
}

/// `upgrade-model --resume`: the halt is lifted and the failures forgotten, so the failed
/// agents may be admitted again (after, say, a fixed binary was published) and the
/// rollout goes on from where it stopped.
pub fn resume(rollout: &Rollout) -> Rollout {
    let mut next = rollout.clone();
    next.halted = None;
    for id in std::mem::take(&mut next.failed).into_keys() {
        next.admitted.remove(&id);
    }
    next
}

/// `upgrade-model --abort`: every agent that has not switched to the target is held on the
/// version it runs (a per-agent target: the model's `agent-version` is never lowered), and
/// the rollout halts. An agent that never reported a version is held nowhere: it is not
/// admitted either.
pub fn abort(rollout: &Rollout, agents: &[AgentView]) -> Rollout {
    let mut next = rollout.clone();
    for agent in agents {
        if agent.running == Some(next.target) {
            continue;
        }
        next.admitted.remove(&agent.id);
        if let Some(running) = agent.running {
            next.held.insert(agent.id.clone(), running);
        }
    }
    if next.halted.is_none() {
        next.halted = Some(Halt {
            failed: next.failed.clone(),
        });
    }
    next.staging.clear();
    next
}

/// Juju's machine-id order: `2` before `10`, `1/lxd/0` after `1` (numbers compare as
/// numbers, segment by segment; anything else as text).
pub fn machine_order(a: &str, b: &str) -> std::cmp::Ordering {
    let mut left = a.split('/');
    let mut right = b.split('/');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order != std::cmp::Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// The record of a rollout of `target`, after `previous` (the record of an older target,
/// if any). A new target does not lift a halt: the operator who published a fixed binary
/// says `upgrade-model --resume` once satisfied, so the new record starts halted, with the
/// previous failures (whose agents are told the version they run meanwhile). What an abort
/// held is not carried: a new target is the operator's new word for every agent.
pub fn retarget(previous: Option<&Rollout>, target: Version) -> Rollout {
    let mut next = Rollout::new(target);
    if let Some(previous) = previous.filter(|previous| previous.halted.is_some()) {
        next.halted = previous.halted.clone();
        next.failed = previous.failed.clone();
    }
    next
}

/// What `Upgrader.DesiredVersion` tells agent `id` (not a controller), which reported
/// running `running`, once Juju's controllers-first rule
/// ([`crate::upgrader::desired_version`]) answered `controllers_first`: that rule says
/// where an agent may go, the rollout who goes when.
///
/// - Where the rule keeps the agent on what it runs, so does this.
/// - With a record of that target, [`desired`] (an agent that never reported is told the
///   rule's answer: nothing holds it anywhere).
/// - With no record of it yet: the rule's answer under the default policy (Juju's
///   behaviour, with no coordinator pass to wait for), unless a halted record stands (a
///   halt is not lifted by a new target, [`retarget`]); else the version it runs, until the
///   coordinator admits it.
pub fn told(
    policy: &RolloutPolicy,
    record: Option<&Rollout>,
    id: &str,
    running: Option<Version>,
    controllers_first: Version,
) -> Version {
    if running == Some(controllers_first) {
        return controllers_first;
    }
    match record {
        Some(record) if record.target == controllers_first => {
            desired(record, id, running).unwrap_or(controllers_first)
        }
        _ if policy.is_default() && record.is_none_or(|record| record.halted.is_none()) => {
            controllers_first
        }
        _ => running.unwrap_or(controllers_first),
    }
}

/// What `Upgrader.DesiredVersion` tells agent `id` (not a controller) to fetch ahead of its
/// admission while the model's `agent-version` is `model_agent_version`: with a record of
/// that target, [`stage_ahead`]; else nothing. Fetching ahead switches nothing, so Juju's
/// controllers-first rule, which says when an agent may *run* the target, does not hold it
/// back: the agents [`prepare`] chose fetch while the controllers upgrade themselves.
pub fn told_stage(
    record: Option<&Rollout>,
    id: &str,
    running: Option<Version>,
    model_agent_version: Version,
) -> Option<Version> {
    record
        .filter(|record| record.target == model_agent_version)
        .and_then(|record| stage_ahead(record, id, running))
}

/// A `rollout-*` model config value that is not one: names the key and the value.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RolloutConfigError {
    /// The key (`rollout-canaries`).
    pub key: &'static str,
    /// The value as given.
    pub value: String,
    /// What the key takes.
    pub expected: &'static str,
}

impl std::fmt::Display for RolloutConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "model config key {:?}: {:?} is not {}",
            self.key, self.value, self.expected
        )
    }
}

impl std::error::Error for RolloutConfigError {}

/// The most canaries a policy may name.
pub const CANARIES_MAX: u32 = 1_000;
/// The longest canary deadline, in seconds (a week).
pub const CANARY_DEADLINE_MAX_SECONDS: u64 = 7 * 24 * 3600;

/// The rollout keys and what each takes.
const KEYS: [(&str, &str); 4] = [
    (CANARIES_KEY, "a whole number from 0 to 1000"),
    (
        CANARY_DEADLINE_KEY,
        "a whole number of seconds from 1 to 604800",
    ),
    (MAX_AT_ONCE_KEY, "a whole number (0: no bound)"),
    (FAILURES_TOLERATED_KEY, "a whole number"),
];

/// Checks one model config value (its text: a number's digits, or a string's content) if
/// `key` is one of the rollout keys; other keys are not this module's.
pub fn check_setting(key: &str, text: &str) -> Result<(), RolloutConfigError> {
    let Some(&(key, expected)) = KEYS.iter().find(|(name, _)| *name == key) else {
        return Ok(());
    };
    let error = || RolloutConfigError {
        key,
        value: text.to_owned(),
        expected,
    };
    let number: u64 = text.trim().parse().map_err(|_| error())?;
    let fits = match key {
        CANARIES_KEY => number <= u64::from(CANARIES_MAX),
        CANARY_DEADLINE_KEY => (1..=CANARY_DEADLINE_MAX_SECONDS).contains(&number),
        _ => number < u64::from(u32::MAX),
    };
    if fits { Ok(()) } else { Err(error()) }
}

impl RolloutPolicy {
    /// Juju's behaviour: no canaries, no bound, never halted.
    pub fn is_default(&self) -> bool {
        self.canaries == 0 && self.max_at_once == 0 && self.failures_tolerated == u32::MAX
    }

    /// The policy the model's config sets; `get` answers a key's value as text (`None`:
    /// not set, its default). Each value is checked as [`check_setting`] checks it.
    pub fn from_settings(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<RolloutPolicy, RolloutConfigError> {
        let mut policy = RolloutPolicy::default();
        for (key, _) in KEYS {
            let Some(text) = get(key) else { continue };
            check_setting(key, &text)?;
            let number: u64 = text.trim().parse().expect("checked");
            match key {
                CANARIES_KEY => policy.canaries = number as u32,
                CANARY_DEADLINE_KEY => policy.canary_deadline = Millis(number * 1000),
                MAX_AT_ONCE_KEY => policy.max_at_once = number as u32,
                _ => policy.failures_tolerated = number as u32,
            }
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn agent(id: &str, running: &str, health: Health) -> AgentView {
        AgentView {
            id: id.to_owned(),
            running: Some(v(running)),
            health,
            download_rate: None,
        }
    }

    fn fleet(n: usize, running: &str) -> Vec<AgentView> {
        (1..=n)
            .map(|i| agent(&format!("{i:02}"), running, Health::Ready))
            .collect()
    }

    /// Agents admitted report Ready on the target: what a working binary does.
    fn upgrade(agents: &mut [AgentView], rollout: &Rollout) {
        for agent in agents {
            if rollout.admitted.contains_key(&agent.id) && agent.health != Health::Down {
                agent.running = Some(rollout.target);
                agent.health = Health::Ready;
            }
        }
    }

    #[test]
    fn the_default_policy_admits_every_agent_at_once_as_juju_does() {
        let agents = fleet(5, "3.6.1");
        let next = advance(
            &RolloutPolicy::default(),
            &Rollout::new(v("3.6.2")),
            &agents,
            Timestamp(0),
        );
        assert_eq!(next.admitted.len(), 5);
        assert!(next.canaries.is_empty() && next.halted.is_none());
    }

    #[test]
    fn canaries_go_alone_then_the_rest_in_waves_of_max_at_once() {
        let policy = RolloutPolicy {
            canaries: 2,
            max_at_once: 3,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(10, "3.6.1");
        let mut rollout = Rollout::new(v("3.6.2"));
        rollout = advance(&policy, &rollout, &agents, Timestamp(0));
        assert_eq!(
            rollout.admitted.keys().collect::<Vec<_>>(),
            ["01", "02"],
            "the canaries alone"
        );
        // Not yet healthy: nobody else.
        rollout = advance(&policy, &rollout, &agents, Timestamp(1));
        assert_eq!(rollout.admitted.len(), 2);
        upgrade(&mut agents, &rollout);
        rollout = advance(&policy, &rollout, &agents, Timestamp(2));
        assert_eq!(rollout.admitted.len(), 5, "{rollout:?}");
        assert_eq!(rollout.in_flight(&agents), 3);
        for round in 3..10 {
            upgrade(&mut agents, &rollout);
            rollout = advance(&policy, &rollout, &agents, Timestamp(round));
        }
        upgrade(&mut agents, &rollout);
        assert!(agents.iter().all(|agent| agent.running == Some(v("3.6.2"))));
        assert!(rollout.halted.is_none());
    }

    #[test]
    fn the_first_wave_fetches_ahead_while_the_canaries_try_the_binary_and_goes_first() {
        let policy = RolloutPolicy {
            canaries: 1,
            max_at_once: 3,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(5, "3.6.1");
        // Agent 05 is the fastest: the canary. Beside it, the bound leaves two: the fast
        // end in id order, 01 and 02, told in the same record.
        agents[4].download_rate = Some(1_000);
        let mut rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        assert_eq!(rollout.admitted.keys().collect::<Vec<_>>(), ["05"]);
        assert_eq!(rollout.staging.iter().collect::<Vec<_>>(), ["01", "02"]);
        let running = Some(v("3.6.1"));
        assert_eq!(stage_ahead(&rollout, "01", running), Some(v("3.6.2")));
        assert_eq!(
            desired(&rollout, "01", running),
            running,
            "fetch, not switch"
        );
        assert_eq!(
            stage_ahead(&rollout, "03", running),
            None,
            "not in the wave"
        );
        assert_eq!(
            stage_ahead(&rollout, "05", running),
            None,
            "the canary is admitted"
        );
        // Another pass before the canary is healthy: the same agents, no write.
        assert_eq!(advance(&policy, &rollout, &agents, Timestamp(1)), rollout);
        // Agent 01 now looks slowest: the order alone would take 02, 03 and 04 (the slow
        // turn comes at the ninth), but those that fetched ahead go first.
        agents[0].download_rate = Some(1);
        agents[1].download_rate = Some(500);
        upgrade(&mut agents, &rollout);
        rollout = advance(&policy, &rollout, &agents, Timestamp(2));
        assert!(rollout.canaries_passed && rollout.staging.is_empty());
        assert_eq!(
            rollout.admitted.keys().collect::<Vec<_>>(),
            ["01", "02", "03", "05"]
        );
    }

    #[test]
    fn before_the_controllers_run_the_target_the_canaries_and_the_first_wave_fetch_ahead() {
        let policy = RolloutPolicy {
            canaries: 1,
            max_at_once: 3,
            ..RolloutPolicy::default()
        };
        let agents = fleet(5, "3.6.1");
        let running = Some(v("3.6.1"));
        let prepared = prepare(&policy, &Rollout::new(v("3.6.2")), &agents);
        assert!(
            prepared.admitted.is_empty(),
            "controllers first: nobody switches"
        );
        assert_eq!(prepared.canaries.iter().collect::<Vec<_>>(), ["01"]);
        assert_eq!(prepared.staging.iter().collect::<Vec<_>>(), ["02", "03"]);
        assert_eq!(
            prepared.fetching_ahead().into_iter().collect::<Vec<_>>(),
            ["01", "02", "03"],
            "the canary too, as many as max-at-once in all"
        );
        assert_eq!(stage_ahead(&prepared, "01", running), Some(v("3.6.2")));
        assert_eq!(desired(&prepared, "01", running), running);
        assert_eq!(stage_ahead(&prepared, "04", running), None);
        // Again: nothing more to write.
        assert_eq!(prepare(&policy, &prepared, &agents), prepared);
        // The controllers run it: the canary is admitted (it runs the target once it
        // switches) and no longer fetches ahead; the wave keeps fetching.
        let admitted = advance(&policy, &prepared, &agents, Timestamp(0));
        assert_eq!(admitted.admitted.keys().collect::<Vec<_>>(), ["01"]);
        assert_eq!(desired(&admitted, "01", running), Some(v("3.6.2")));
        assert_eq!(stage_ahead(&admitted, "01", running), None);
        assert_eq!(
            admitted.fetching_ahead().into_iter().collect::<Vec<_>>(),
            ["02", "03"]
        );
        // Without canaries there is no first set: nothing prepared (Juju's way, or waves
        // chosen at admission).
        let plain = RolloutPolicy {
            max_at_once: 3,
            ..RolloutPolicy::default()
        };
        let fresh = Rollout::new(v("3.6.2"));
        assert_eq!(prepare(&plain, &fresh, &agents), fresh);
        // Nor on a halted record.
        let mut halted = Rollout::new(v("3.6.2"));
        halted.halted = Some(Halt {
            failed: BTreeMap::new(),
        });
        assert_eq!(prepare(&policy, &halted, &agents), halted);
    }

    #[test]
    fn a_halt_stops_the_fetching_ahead() {
        let policy = RolloutPolicy {
            canaries: 1,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(3, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        assert_eq!(rollout.staging.len(), 2, "no bound: every other agent");
        agents[0].health = Health::Failed("host step failed".to_owned());
        let halted = advance(&policy, &rollout, &agents, Timestamp(1));
        assert!(halted.halted.is_some() && halted.staging.is_empty());
        assert_eq!(stage_ahead(&halted, "02", Some(v("3.6.1"))), None);
        let aborted = abort(&rollout, &agents);
        assert!(aborted.staging.is_empty());
    }

    #[test]
    fn a_failing_canary_halts_the_rollout_with_no_other_agent_admitted() {
        let policy = RolloutPolicy {
            canaries: 1,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(4, "3.6.1");
        let mut rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].health = Health::Failed("host step failed: exit 1".to_owned());
        rollout = advance(&policy, &rollout, &agents, Timestamp(1));
        let halt = rollout.halted.clone().expect("halted");
        assert_eq!(
            halt.failed,
            BTreeMap::from([("01".to_owned(), "host step failed: exit 1".to_owned())])
        );
        assert_eq!(rollout.admitted.keys().collect::<Vec<_>>(), ["01"]);
        // Halted: nothing moves, however often it is asked.
        agents[0].health = Health::Ready;
        assert_eq!(advance(&policy, &rollout, &agents, Timestamp(2)), rollout);

        // A fixed binary is published: a new target, resumed; the canary goes again first.
        let mut fixed = resume(&rollout);
        fixed.target = v("3.6.3");
        let fixed = advance(&policy, &fixed, &agents, Timestamp(3));
        assert!(fixed.halted.is_none());
        assert_eq!(fixed.admitted.keys().collect::<Vec<_>>(), ["01"]);
    }

    #[test]
    fn a_canary_not_healthy_within_its_deadline_counts_as_failed() {
        let policy = RolloutPolicy {
            canaries: 1,
            canary_deadline: Millis(1_000),
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(3, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].health = Health::Busy;
        let still = advance(&policy, &rollout, &agents, Timestamp(1_000));
        assert!(still.halted.is_none());
        let late = advance(&policy, &rollout, &agents, Timestamp(1_001));
        assert!(late.halted.is_some(), "{late:?}");
    }

    #[test]
    fn more_failures_than_tolerated_halt_fewer_do_not() {
        let policy = RolloutPolicy {
            failures_tolerated: 1,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(4, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].health = Health::Failed("a".into());
        let one = advance(&policy, &rollout, &agents, Timestamp(1));
        assert!(one.halted.is_none());
        agents[1].health = Health::Failed("b".into());
        let two = advance(&policy, &one, &agents, Timestamp(2));
        assert_eq!(two.halted.map(|halt| halt.failed.len()), Some(2));
    }

    #[test]
    fn a_down_agent_is_skipped_and_catches_up_when_back() {
        let policy = RolloutPolicy::default();
        let mut agents = fleet(3, "3.6.1");
        agents[1].health = Health::Down;
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        assert_eq!(rollout.admitted.keys().collect::<Vec<_>>(), ["01", "03"]);
        assert_eq!(desired(&rollout, "02", Some(v("3.6.1"))), Some(v("3.6.1")));
        agents[1].health = Health::Ready;
        let back = advance(&policy, &rollout, &agents, Timestamp(1));
        assert_eq!(desired(&back, "02", Some(v("3.6.1"))), Some(v("3.6.2")));
    }

    #[test]
    fn abort_holds_every_agent_that_has_not_switched_on_what_it_runs() {
        let policy = RolloutPolicy {
            max_at_once: 2,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(4, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].running = Some(v("3.6.2"));
        let aborted = abort(&rollout, &agents);
        assert!(aborted.halted.is_some());
        assert_eq!(desired(&aborted, "01", Some(v("3.6.2"))), Some(v("3.6.2")));
        for id in ["02", "03", "04"] {
            assert_eq!(
                desired(&aborted, id, Some(v("3.6.1"))),
                Some(v("3.6.1")),
                "{id}"
            );
        }
        // And it stays so: halted admits nothing.
        assert_eq!(advance(&policy, &aborted, &agents, Timestamp(1)), aborted);
    }

    #[test]
    fn a_report_reads_as_down_failed_ready_or_busy() {
        assert_eq!(
            Health::of_report("started", "", "ready", true),
            Health::Down
        );
        assert_eq!(
            Health::of_report("error", "bad", "steps-failed", false),
            Health::Failed("bad".into())
        );
        assert_eq!(
            Health::of_report("started", "", "ready", false),
            Health::Ready
        );
        assert_eq!(
            Health::of_report("started", "", "upgrading", false),
            Health::Busy
        );
    }

    #[test]
    fn machine_ids_go_in_jujus_order() {
        let mut ids = vec!["10", "2", "1/lxd/0", "1", "1/lxd/10", "1/lxd/2"];
        ids.sort_by(|a, b| machine_order(a, b));
        assert_eq!(ids, ["1", "1/lxd/0", "1/lxd/2", "1/lxd/10", "2", "10"]);
    }

    #[test]
    fn a_failed_agent_is_told_what_it_runs_and_is_not_admitted_again() {
        let policy = RolloutPolicy {
            failures_tolerated: 5,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(2, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].health = Health::Failed("bad".into());
        let failed = advance(&policy, &rollout, &agents, Timestamp(1));
        assert_eq!(desired(&failed, "01", Some(v("3.6.1"))), Some(v("3.6.1")));
        assert_eq!(desired(&failed, "02", Some(v("3.6.1"))), Some(v("3.6.2")));
        // An agent already reporting a failure is not a candidate.
        let fresh = advance(&policy, &Rollout::new(v("3.6.3")), &agents, Timestamp(2));
        assert_eq!(fresh.admitted.keys().collect::<Vec<_>>(), ["02"]);
    }

    #[test]
    fn a_new_target_keeps_a_halt_until_resumed_but_not_what_an_abort_held() {
        let policy = RolloutPolicy {
            canaries: 1,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(3, "3.6.1");
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        agents[0].health = Health::Failed("bad".into());
        let halted = advance(&policy, &rollout, &agents, Timestamp(1));
        let mut aborted = abort(&halted, &agents);
        aborted.held.insert("03".into(), v("3.6.1"));
        let next = retarget(Some(&aborted), v("3.6.3"));
        assert!(next.halted.is_some() && next.held.is_empty() && next.admitted.is_empty());
        assert_eq!(next.failed.keys().collect::<Vec<_>>(), ["01"]);
        agents[0].health = Health::Ready;
        assert_eq!(advance(&policy, &next, &agents, Timestamp(2)), next);
        let resumed = advance(&policy, &resume(&next), &agents, Timestamp(3));
        assert_eq!(resumed.admitted.keys().collect::<Vec<_>>(), ["01"]);
        assert!(retarget(Some(&resumed), v("3.6.4")).halted.is_none());
        assert_eq!(retarget(None, v("3.6.4")), Rollout::new(v("3.6.4")));
    }

    #[test]
    fn an_agent_is_told_the_rules_answer_as_the_rollout_allows() {
        let staged = RolloutPolicy {
            canaries: 1,
            ..RolloutPolicy::default()
        };
        let juju = RolloutPolicy::default();
        let (old, new) = (v("3.6.1"), v("3.6.2"));
        // Controllers not done: the rule keeps it where it is, whatever the rollout.
        assert_eq!(told(&staged, None, "1", Some(old), old), old);
        // No record yet: Juju's answer under the default policy; else wait for admission.
        assert_eq!(told(&juju, None, "1", Some(old), new), new);
        assert_eq!(told(&staged, None, "1", Some(old), new), old);
        // A record of the target decides.
        let mut record = Rollout::new(new);
        assert_eq!(told(&juju, Some(&record), "1", Some(old), new), old);
        record.admitted.insert("1".into(), Timestamp(0));
        assert_eq!(told(&staged, Some(&record), "1", Some(old), new), new);
        // A halted record of an older target holds even the default policy back.
        let mut older = Rollout::new(old);
        assert_eq!(told(&juju, Some(&older), "1", Some(old), new), new);
        older.halted = Some(Halt {
            failed: BTreeMap::new(),
        });
        assert_eq!(told(&juju, Some(&older), "1", Some(old), new), old);
        // Never reported: nothing holds it.
        assert_eq!(told(&staged, None, "1", None, new), new);
    }

    #[test]
    fn the_policy_is_read_from_model_config_and_bad_values_are_named() {
        let config = BTreeMap::from([
            (CANARIES_KEY, "2"),
            (MAX_AT_ONCE_KEY, " 5 "),
            (CANARY_DEADLINE_KEY, "30"),
        ]);
        let policy =
            RolloutPolicy::from_settings(|key| config.get(key).map(|text| text.to_string()))
                .unwrap();
        assert_eq!(
            policy,
            RolloutPolicy {
                canaries: 2,
                canary_deadline: Millis(30_000),
                max_at_once: 5,
                failures_tolerated: u32::MAX,
            }
        );
        assert!(!policy.is_default());
        assert!(RolloutPolicy::from_settings(|_| None).unwrap().is_default());
        let error = check_setting(CANARIES_KEY, "two").unwrap_err();
        assert_eq!(
            error.to_string(),
            "model config key \"rollout-canaries\": \"two\" is not a whole number from 0 to 1000"
        );
        assert!(check_setting(CANARY_DEADLINE_KEY, "0").is_err());
        assert!(check_setting(FAILURES_TOLERATED_KEY, "-1").is_err());
        assert!(check_setting("logging-config", "anything").is_ok());
    }

    fn health() -> impl Strategy<Value = Health> {
        prop_oneof![
            4 => Just(Health::Ready),
            2 => Just(Health::Busy),
            1 => Just(Health::Down),
            1 => "[a-z]{1,4}".prop_map(Health::Failed),
        ]
    }

    fn ids<'a>(order: &[&'a AgentView]) -> Vec<&'a str> {
        order.iter().map(|agent| agent.id.as_str()).collect()
    }

    #[test]
    fn with_no_download_rate_known_agents_are_admitted_in_machine_id_order() {
        let agents = fleet(12, "3.6.1");
        let candidates: Vec<&AgentView> = agents.iter().collect();
        assert_eq!(
            ids(&admission_order(&candidates, 3)),
            ids(&candidates),
            "machine-id order, as before any download was measured"
        );
    }

    #[test]
    fn the_slowest_known_links_go_early_one_admission_in_nine() {
        // Agents 01..=20: 03, 07 and 15 are slow (their rates 5, 1 and 9), 11's rate is
        // unknown, the others fast (100 + id).
        let mut agents = fleet(20, "3.6.1");
        for (i, agent) in agents.iter_mut().enumerate() {
            let id = i as u64 + 1;
            agent.download_rate = match id {
                3 => Some(5),
                7 => Some(1),
                15 => Some(9),
                11 => None,
                _ => Some(100 + id),
            };
        }
        let candidates: Vec<&AgentView> = agents.iter().collect();
        let order = ids(&admission_order(&candidates, 0));
        assert_eq!(order.len(), 20);
        // Turn 0: the slowest (07); turns 1-8: the unknown (11), then the fastest known;
        // turn 9: the next slowest (03); turn 18: the last slow one (15).
        assert_eq!(
            order,
            [
                "07", "11", "20", "19", "18", "17", "16", "14", "13", "03", "12", "10", "09", "08",
                "06", "05", "04", "02", "15", "01"
            ]
        );
    }

    #[test]
    fn the_canaries_are_the_fastest_known_and_take_the_first_turns() {
        let policy = RolloutPolicy {
            canaries: 1,
            max_at_once: 2,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(6, "3.6.1");
        // 05 is slow, 03 the fastest, 06's rate unknown, the others in between. The canary
        // is the fastest, and it takes turn 0: with six agents there is no turn 9, and 05
        // goes last.
        for agent in &mut agents {
            agent.download_rate = match agent.id.as_str() {
                "05" => Some(10),
                "03" => Some(5_000),
                "06" => None,
                _ => Some(1_000),
            };
        }
        let mut rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        assert_eq!(rollout.canaries.iter().collect::<Vec<_>>(), ["03"]);
        upgrade(&mut agents, &rollout);
        rollout = advance(&policy, &rollout, &agents, Timestamp(1));
        assert_eq!(
            rollout.admitted.keys().collect::<Vec<_>>(),
            ["01", "03", "06"],
            "after the canary (turn 0), turns 1 and 2 go to the fast end: the unknown (06) \
             first, then the fastest known, in id order among equals (01)"
        );
    }

    #[test]
    fn a_fleet_down_at_the_first_pass_does_not_pass_its_canaries_without_any() {
        let policy = RolloutPolicy {
            canaries: 2,
            max_at_once: 10,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(6, "3.6.1");
        for agent in &mut agents {
            agent.health = Health::Down;
        }
        let rollout = advance(&policy, &Rollout::new(v("3.6.2")), &agents, Timestamp(0));
        assert!(rollout.canaries.is_empty() && rollout.admitted.is_empty());
        assert!(!rollout.canaries_passed, "no canary, so none passed");
        // The fleet comes back: two canaries first, alone.
        for agent in &mut agents {
            agent.health = Health::Ready;
        }
        let rollout = advance(&policy, &rollout, &agents, Timestamp(1));
        assert_eq!(rollout.canaries.len(), 2);
        assert_eq!(rollout.admitted.len(), 2, "{rollout:?}");
        assert!(!rollout.canaries_passed);
    }

    #[test]
    fn the_slow_turns_are_counted_over_the_whole_rollout() {
        // One admission per pass (max-at-once 1): the slow agent gets turn 0, then eight
        // fast ones go before the next slow one, as if all were admitted in one pass.
        let policy = RolloutPolicy {
            max_at_once: 1,
            ..RolloutPolicy::default()
        };
        let mut agents = fleet(12, "3.6.1");
        for agent in &mut agents {
            agent.download_rate = Some(match agent.id.as_str() {
                "04" => 10,
                "07" => 20,
                _ => 1_000,
            });
        }
        let mut rollout = Rollout::new(v("3.6.2"));
        let mut order = Vec::new();
        for round in 0..12 {
            let next = advance(&policy, &rollout, &agents, Timestamp(round));
            for id in next.admitted.keys() {
                if !rollout.admitted.contains_key(id) {
                    order.push(id.clone());
                }
            }
            rollout = next;
            upgrade(&mut agents, &rollout);
        }
        assert_eq!(
            order,
            [
                "04", "01", "02", "03", "05", "06", "08", "09", "10", "07", "11", "12"
            ]
        );
    }

    proptest! {
        /// Whatever the rates, the admission order is the candidates, each once; the slow
        /// end never takes an agent whose rate is unknown, so those keep machine-id order.
        #[test]
        fn the_admission_order_is_a_permutation_that_keeps_unknown_rates_in_id_order(
            rates in proptest::collection::vec(proptest::option::of(1u64..50), 0..40),
        ) {
            let mut agents = fleet(rates.len(), "3.6.1");
            for (agent, rate) in agents.iter_mut().zip(&rates) {
                agent.download_rate = *rate;
            }
            let candidates: Vec<&AgentView> = agents.iter().collect();
            let order = admission_order(&candidates, 0);
            let mut sorted = ids(&order);
            sorted.sort_unstable();
            prop_assert_eq!(sorted, ids(&candidates));
            let unknown: Vec<&str> = order
                .iter()
                .filter(|agent| agent.download_rate.is_none())
                .map(|agent| agent.id.as_str())
                .collect();
            let mut in_id_order = unknown.clone();
            in_id_order.sort_unstable();
            prop_assert_eq!(unknown, in_id_order);
            // Every slow turn that found a known rate took the slowest not yet taken.
            let mut left: Vec<u64> = rates.iter().flatten().copied().collect();
            left.sort_unstable();
            for (turn, agent) in order.iter().enumerate() {
                if let Some(rate) = agent.download_rate {
                    if turn.is_multiple_of(SLOW_LINK_EVERY) {
                        prop_assert_eq!(rate, left[0]);
                    }
                    let at = left.iter().position(|r| *r == rate).expect("not taken twice");
                    left.remove(at);
                }
            }
        }

        /// Whatever the agents report, round after round (the first `prepared` of them
        /// before the controllers run the target: [`prepare`]): no admission takes the
        /// agents in flight past max_at_once,
        /// no agent but a canary admitted before every canary is healthy, nothing admitted
        /// while halted or prepared, and an admission is never taken back.
        #[test]
        fn the_rollout_keeps_its_bounds(
            prepared in 0usize..4,
            canaries in 0u32..4,
            max_at_once in 0u32..5,
            failures_tolerated in 0u32..4,
            rounds in proptest::collection::vec(proptest::collection::vec(health(), 8), 1..12),
            rates in proptest::collection::vec(proptest::option::of(1u64..1_000), 8),
        ) {
            let policy = RolloutPolicy {
                canaries,
                canary_deadline: Millis(3),
                max_at_once,
                failures_tolerated,
            };
            let mut agents = fleet(8, "3.6.1");
            for (agent, rate) in agents.iter_mut().zip(rates) {
                agent.download_rate = rate;
            }
            let mut rollout = Rollout::new(v("3.6.2"));
            for (round, healths) in rounds.into_iter().enumerate() {
                for (agent, health) in agents.iter_mut().zip(healths) {
                    // An admitted agent that reports Ready does so on the target.
                    if health == Health::Ready && rollout.admitted.contains_key(&agent.id) {
                        agent.running = Some(rollout.target);
                    }
                    agent.health = health;
                }
                let next = if round < prepared {
                    let next = prepare(&policy, &rollout, &agents);
                    prop_assert_eq!(&next.admitted, &rollout.admitted);
                    next
                } else {
                    advance(&policy, &rollout, &agents, Timestamp(round as u64))
                };
                if max_at_once > 0 && next.admitted.len() > rollout.admitted.len() {
                    prop_assert!(next.in_flight(&agents) <= max_at_once as usize);
                }
                prop_assert!(rollout.admitted.keys().all(|id| next.admitted.contains_key(id)));
                if rollout.halted.is_some() {
                    prop_assert_eq!(&next.admitted, &rollout.admitted);
                }
                if !next.canaries_passed {
                    for id in next.admitted.keys() {
                        prop_assert!(
                            rollout.admitted.contains_key(id) || next.canaries.contains(id)
                        );
                    }
                }
                prop_assert!(next.canaries.len() <= canaries as usize);
                // Fetching ahead: only while the canaries try the binary, never a canary,
                // at most one wave.
                if next.canaries_passed || next.halted.is_some() {
                    prop_assert!(next.staging.is_empty());
                }
                prop_assert!(next.staging.is_disjoint(&next.canaries));
                if max_at_once > 0 && !next.staging.is_empty() {
                    // With the canaries, no more than the bound receive a binary at once.
                    prop_assert!(
                        next.staging.len() + next.canaries.len() <= max_at_once as usize
                    );
                }
                if max_at_once > 0 {
                    prop_assert!(next.staging.len() <= max_at_once as usize);
                }
                prop_assert!(next
                    .fetching_ahead()
                    .iter()
                    .all(|id| next.staging.contains(*id) || next.canaries.contains(*id)));
                // Counted at the agents: those admitted and not yet healthy, and those
                // told to fetch ahead, receive the binary at once; a write that admits or
                // prepares keeps them within the bound.
                let wrote_admission = next.admitted.len() > rollout.admitted.len();
                if max_at_once > 0 && (wrote_admission || round < prepared) {
                    prop_assert!(
                        next.in_flight(&agents) + next.fetching_ahead().len()
                            <= max_at_once as usize,
                        "{:?}", next
                    );
                }
                for agent in &agents {
                    if let Some(version) = stage_ahead(&next, &agent.id, agent.running) {
                        prop_assert_eq!(version, next.target);
                        prop_assert_eq!(desired(&next, &agent.id, agent.running), agent.running);
                    }
                }
                prop_assert!(canaries == 0 || !next.canaries_passed || !next.canaries.is_empty());
                rollout = next;
            }
        }
    }
}
