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

use std::collections::{BTreeMap, BTreeSet};

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
        }
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

/// True when `agent` reported running `target` and is Ready.
fn healthy_on(agent: &AgentView, target: Version) -> bool {
    agent.running == Some(target) && agent.health == Health::Ready
}

/// One step of the rollout: the record to write after reading what every agent reported
/// at `now`. Records failures (an admitted agent that reported one; a canary not healthy
/// on the target within [`RolloutPolicy::canary_deadline`]), halts when a canary failed or
/// more than [`RolloutPolicy::failures_tolerated`] agents did, and otherwise admits agents
/// in id order: the canaries first (chosen now if not yet chosen, among agents that are
/// not down and do not run the target already), nobody else until every canary is healthy
/// on the target, then as many as [`RolloutPolicy::max_at_once`] leaves room for. An agent
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
    ordered.sort_by(|a, b| a.id.cmp(&b.id));

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
        return next;
    }

    // Who may be admitted: up, not admitted, not on the target already, not held.
    let candidates: Vec<&AgentView> = ordered
        .iter()
        .copied()
        .filter(|agent| agent.health != Health::Down)
        .filter(|agent| !next.admitted.contains_key(&agent.id))
        .filter(|agent| !next.held.contains_key(&agent.id))
        .filter(|agent| agent.running != Some(next.target))
        .collect();
    if policy.canaries > 0 && !next.canaries_passed && next.canaries.is_empty() {
        next.canaries = candidates
            .iter()
            .take(policy.canaries as usize)
            .map(|agent| agent.id.clone())
            .collect();
    }
    let canaries_healthy = next.canaries_passed
        || next.canaries.iter().all(|id| {
            ordered
                .iter()
                .any(|agent| agent.id == *id && healthy_on(agent, next.target))
        });
    next.canaries_passed = canaries_healthy;
    let room = match policy.max_at_once {
        0 => usize::MAX,
        max => (max as usize).saturating_sub(next.in_flight(agents)),
    };
    let admit: Vec<String> = candidates
        .iter()
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

/// The version agent `id`, which reported running `running`, is told while `rollout` goes
/// on (`None`: it never reported, and is told the target only once admitted): the target
/// once admitted, the version an abort held it on, else the version it runs.
pub fn desired(rollout: &Rollout, id: &str, running: Option<Version>) -> Option<Version> {
    if let Some(version) = rollout.held.get(id) {
        return Some(*version);
    }
    if rollout.admitted.contains_key(id) || running == Some(rollout.target) {
        return Some(rollout.target);
    }
    running
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
    next
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

    fn health() -> impl Strategy<Value = Health> {
        prop_oneof![
            4 => Just(Health::Ready),
            2 => Just(Health::Busy),
            1 => Just(Health::Down),
            1 => "[a-z]{1,4}".prop_map(Health::Failed),
        ]
    }

    proptest! {
        /// Whatever the agents report, round after round: no admission takes the agents in
        /// flight past max_at_once,
        /// no agent but a canary admitted before every canary is healthy, nothing admitted
        /// while halted, and an admission is never taken back.
        #[test]
        fn the_rollout_keeps_its_bounds(
            canaries in 0u32..4,
            max_at_once in 0u32..5,
            failures_tolerated in 0u32..4,
            rounds in proptest::collection::vec(proptest::collection::vec(health(), 8), 1..12),
        ) {
            let policy = RolloutPolicy {
                canaries,
                canary_deadline: Millis(3),
                max_at_once,
                failures_tolerated,
            };
            let mut agents = fleet(8, "3.6.1");
            let mut rollout = Rollout::new(v("3.6.2"));
            for (round, healths) in rounds.into_iter().enumerate() {
                for (agent, health) in agents.iter_mut().zip(healths) {
                    // An admitted agent that reports Ready does so on the target.
                    if health == Health::Ready && rollout.admitted.contains_key(&agent.id) {
                        agent.running = Some(rollout.target);
                    }
                    agent.health = health;
                }
                let next = advance(&policy, &rollout, &agents, Timestamp(round as u64));
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
                rollout = next;
            }
        }
    }
}
