//! The staged rollout of machine agents (`spec/rollout.md`) over the store: what each
//! agent last reported as the core's [`AgentView`]s, the model's `rollout-*` keys as its
//! [`RolloutPolicy`], the coordinator's pass ([`coordinate`]: the core's
//! [`rollout::advance`] in a transaction fenced on the coordinator lease), the operator's
//! `upgrade-model --resume` and `--abort`, and the record as `lockstep status` shows it.
//! Every decision is the core's; this module reads and writes.

use lockstep_core::lifecycle::{ControllerId, LeaseToken};
use lockstep_core::rollout::{self, AgentView, Health, Rollout, RolloutConfigError, RolloutPolicy};
use lockstep_core::{Millis, Timestamp, Version};
use lockstep_store::{
    Abort, AgentStatus, Life, Machine, Store, StoreError, Tx, TxOutcome, machine_tag,
};
use lockstep_transport::facade::machiner::AGENT_DOWN_AFTER;
use lockstep_transport::facade::model_config::setting_text;
use lockstep_transport::state::{FLEET_VERSIONS_MAX, Fleet, RolloutGauges};
use lockstep_transport::wire::WireError;
use serde_json::{Map, Value, json};

use super::calls::{failed, mutate};
use super::machines::is_controller;
use super::model_config::settings;

/// The model's rollout policy from its stored config keys.
pub fn policy(settings: &Map<String, Value>) -> Result<RolloutPolicy, RolloutConfigError> {
    RolloutPolicy::from_settings(|key| settings.get(key).map(setting_text))
}

/// An agent's health from its last report at the store's clock `now`: down once the report
/// is older than [`AGENT_DOWN_AFTER`] (or it never reported), failed when it reports
/// `error` (with its message), Ready in phase `ready`, else busy.
pub fn health(report: Option<&AgentStatus>, now: Timestamp) -> Health {
    match report {
        None => Health::Down,
        Some(report) => Health::of_report(
            &report.status,
            &report.info,
            &report.phase,
            now.0.saturating_sub(report.updated.0) > AGENT_DOWN_AFTER.as_millis() as u64,
        ),
    }
}

/// The rollout's view of every alive machine agent that is no controller: the version it
/// reports running (its last status, else its `SetTools`) and its health.
pub fn agent_views(
    machines: &[Machine],
    statuses: &[(String, AgentStatus)],
    now: Timestamp,
) -> Vec<AgentView> {
    let reports: std::collections::HashMap<&str, &AgentStatus> = statuses
        .iter()
        .map(|(tag, status)| (tag.as_str(), status))
        .collect();
    machines
        .iter()
        .filter(|machine| machine.life == Life::Alive && !is_controller(machine))
        .map(|machine| {
            let report = reports.get(machine_tag(&machine.id).as_str()).copied();
            AgentView {
                id: machine.id.clone(),
                running: report
                    .and_then(|report| report.version.as_ref())
                    .or(machine.agent_binary.as_ref())
                    .map(|binary| binary.number),
                health: health(report, now),
                download_rate: report.and_then(|report| report.download_rate),
            }
        })
        .collect()
}

/// True once every controller machine reported running `target` or later: the
/// controllers-first rule lets agents go.
fn controllers_run(machines: &[Machine], target: Version) -> bool {
    lockstep_core::upgrader::controllers_run(
        target,
        machines
            .iter()
            .filter(|machine| is_controller(machine))
            .map(|machine| machine.agent_binary.as_ref()),
    )
}

/// What a coordinator pass did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Pass {
    /// Nothing to write: no rollout under way, or the record says what it would write.
    Idle,
    /// Another controller holds the coordinator lease (or this one lost it meanwhile).
    NotCoordinator,
    /// The model's `rollout-*` keys do not make a policy (set before they were checked).
    BadPolicy(RolloutConfigError),
    /// The record written.
    Written(Box<Rollout>),
}

/// What the coordinator would do now.
enum Plan {
    /// No rollout is under way: no model, the controllers not yet on the target and
    /// nothing for the core to prepare, or every agent on it.
    Nothing,
    /// The record says what the core would write.
    Unchanged,
    /// The record to write.
    Write(Rollout),
}

/// What the coordinator would write now, read in `tx`.
fn next_record(tx: &mut dyn Tx) -> Result<Result<Plan, RolloutConfigError>, StoreError> {
    let Some(model) = tx.model()? else {
        return Ok(Ok(Plan::Nothing));
    };
    let policy = match policy(&settings(tx)?) {
        Ok(policy) => policy,
        Err(error) => return Ok(Err(error)),
    };
    let target = model.agent_version;
    let machines = tx.machines()?;
    let controllers_run = controllers_run(&machines, target);
    let views = agent_views(&machines, &tx.agent_statuses()?, tx.now());
    let record = tx.rollout()?;
    let current = record.as_ref().filter(|record| record.target == target);
    if views.iter().all(|agent| agent.running == Some(target)) {
        // A fleet on the target needs no (more) rollout. Any other needs its record, the
        // default policy's too: it admits every agent at once (Juju's behaviour), and it
        // records the agents that fail, so that one that fell back from a bad binary is
        // told to stay where it is rather than sent to the same binary again.
        return Ok(Ok(Plan::Nothing));
    }
    let base = match current {
        Some(current) => current.clone(),
        None => rollout::retarget(record.as_ref(), target),
    };
    let next = if controllers_run {
        rollout::advance(&policy, &base, &views, tx.now())
    } else {
        // Before every controller runs the target (Juju's controllers first) no agent may
        // switch; the core's `prepare` says whether anyone fetches ahead meanwhile. When it
        // chooses nothing, nothing is written yet.
        let next = rollout::prepare(&policy, &base, &views);
        if next == base {
            return Ok(Ok(if current.is_some() {
                Plan::Unchanged
            } else {
                Plan::Nothing
            }));
        }
        next
    };
    Ok(Ok(if record.as_ref() == Some(&next) {
        Plan::Unchanged
    } else {
        Plan::Write(next)
    }))
}

/// One coordinator pass: reads whether the rollout has something to write (a snapshot, no
/// lease), and if so takes the coordinator lease for `holder` (`ttl`, the lifecycle's) and
/// writes the core's next record in a transaction fenced on it, read again inside. The
/// lease taken for a write lapses `ttl` after the last one (its own lifecycle extends the
/// same lease if an upgrade begins meanwhile), or is given back (`held`, the token this
/// coordinator took) by the first pass that finds no rollout under way, so that no lease
/// outlives the rollout. Called only while this controller is Ready, when its lifecycle
/// holds no lease.
pub fn coordinate(
    store: &dyn Store,
    holder: ControllerId,
    ttl: Millis,
    held: &mut Option<LeaseToken>,
) -> Result<Pass, StoreError> {
    let mut planned = None;
    store.snapshot(&mut |tx| {
        planned = Some(next_record(tx)?);
        Ok(())
    })?;
    match planned.expect("the snapshot body ran") {
        Err(error) => return Ok(Pass::BadPolicy(error)),
        Ok(Plan::Nothing) => {
            if let Some(token) = held.take() {
                store.release_lease(holder, token)?;
            }
            return Ok(Pass::Idle);
        }
        Ok(Plan::Unchanged) => return Ok(Pass::Idle),
        Ok(Plan::Write(_)) => {}
    }
    let Some(token) = store.acquire_lease(holder, ttl)? else {
        return Ok(Pass::NotCoordinator);
    };
    *held = Some(token);
    let mut written = None;
    let outcome = store.transaction(Some(token), &mut |tx| {
        written = None;
        match next_record(tx)? {
            Ok(Plan::Write(next)) => {
                tx.put_rollout(&next)?;
                written = Some(next);
                Ok(())
            }
            Ok(Plan::Nothing | Plan::Unchanged) | Err(_) => Err(Abort::Unchanged),
        }
    })?;
    // A prepared record (nobody admitted: the controllers still go first) is written once,
    // and its lease given back at once: the controllers' own upgrade needs the same lease
    // for its database steps, and would otherwise wait out its TTL.
    if written
        .as_ref()
        .is_some_and(|next| next.admitted.is_empty())
        && matches!(outcome, TxOutcome::Committed(_))
        && let Some(token) = held.take()
    {
        store.release_lease(holder, token)?;
    }
    Ok(match (outcome, written) {
        (TxOutcome::Committed(_), Some(next)) => Pass::Written(Box::new(next)),
        (TxOutcome::Fenced, _) => Pass::NotCoordinator,
        _ => Pass::Idle,
    })
}

/// The record of the model's current target that an operator's verb works on, in `tx`:
/// the stored one when it is of that target, else a new one after it (a halt carried).
fn current_record(tx: &mut dyn Tx) -> Result<(Rollout, Vec<AgentView>), Abort> {
    let model = tx.model()?.ok_or_else(|| {
        failed(WireError::new(
            "not found",
            "the controller has no model yet",
        ))
    })?;
    let machines = tx.machines()?;
    let views = agent_views(&machines, &tx.agent_statuses()?, tx.now());
    let record = tx.rollout()?;
    let record = match record {
        Some(record) if record.target == model.agent_version => record,
        other => rollout::retarget(other.as_ref(), model.agent_version),
    };
    Ok((record, views))
}

/// `Upgrade.ResumeRollout` (`lockstep upgrade-model --resume`): lifts the halt of the
/// model's rollout and forgets its failures, so the failed agents go again. Refused, naming
/// the target, when it is not halted. Answers the record as [`status`] shows it. Honours
/// `operation-id`.
pub fn resume(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    mutate(store, params, &mut |tx| {
        let (record, views) = current_record(tx)?;
        if record.halted.is_none() {
            return Err(failed(WireError::new(
                "bad request",
                format!(
                    "the rollout of {} is not halted: nothing to resume",
                    record.target
                ),
            )));
        }
        let next = rollout::resume(&record);
        tx.put_rollout(&next)?;
        Ok(status(&next, &views))
    })
}

/// `Upgrade.AbortRollout` (`lockstep upgrade-model --abort`): every machine agent that has
/// not switched to the model's agent-version is held on the version it runs (a per-agent
/// target; the model's agent-version stays), and the rollout halts. Answers the record as
/// [`status`] shows it. Honours `operation-id`.
pub fn abort(store: &dyn Store, params: &Value) -> Result<Value, WireError> {
    mutate(store, params, &mut |tx| {
        let (record, views) = current_record(tx)?;
        let next = rollout::abort(&record, &views);
        tx.put_rollout(&next)?;
        Ok(status(&next, &views))
    })
}

/// The rollout as `Client.FullStatus` shows it under `model.lockstep.rollout`: its target,
/// its state (`rolling-out`, `halted`, `done`), how many agents are admitted, on the
/// target, and in all, the canaries, the failed agents with their reasons (and, halted,
/// why it halted), the agents an abort holds and those told to fetch the target ahead.
pub fn status(record: &Rollout, agents: &[AgentView]) -> Value {
    let on_target = agents
        .iter()
        .filter(|agent| agent.running == Some(record.target) && agent.health == Health::Ready)
        .count();
    let state = if record.halted.is_some() {
        "halted"
    } else if on_target == agents.len() {
        "done"
    } else {
        "rolling-out"
    };
    json!({
        "target": record.target.to_string(),
        "state": state,
        "agents": agents.len(),
        "admitted": record.admitted.len(),
        "on-target": on_target,
        "canaries": record.canaries,
        "canaries-passed": record.canaries_passed,
        "failed": record.failed,
        "halted-on": record.halted.as_ref().map(|halt| &halt.failed),
        "held": record.held.iter().map(|(id, version)| (id.clone(), Value::String(version.to_string()))).collect::<Map<String, Value>>(),
        "fetching-ahead": record.fetching_ahead(),
    })
}

/// What `/metrics` shows of the fleet: the machine agents by the version and phase they
/// last reported (`down` once silent; `unknown` before their first report), at most
/// [`FLEET_VERSIONS_MAX`] versions named (the most populous) and the rest as `other`; and
/// the rollout's counts, as [`status`] computes them.
pub fn fleet(store: &dyn Store) -> Result<Fleet, StoreError> {
    let mut read = None;
    store.snapshot(&mut |tx| {
        read = Some((
            tx.model()?,
            tx.machines()?,
            tx.agent_statuses()?,
            tx.rollout()?,
            tx.now(),
        ));
        Ok(())
    })?;
    let (model, machines, statuses, record, now) = read.expect("the snapshot body ran");
    let agents = agent_views(&machines, &statuses, now);
    let reports: std::collections::HashMap<&str, &AgentStatus> = statuses
        .iter()
        .map(|(tag, status)| (tag.as_str(), status))
        .collect();
    let mut by_version: std::collections::BTreeMap<String, u64> = Default::default();
    for agent in &agents {
        *by_version
            .entry(
                agent
                    .running
                    .map_or_else(|| "unknown".to_owned(), |v| v.to_string()),
            )
            .or_default() += 1;
    }
    let mut named: Vec<(&String, &u64)> = by_version.iter().collect();
    named.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let named: std::collections::BTreeSet<String> = named
        .into_iter()
        .take(FLEET_VERSIONS_MAX)
        .map(|(version, _)| version.clone())
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    for agent in &agents {
        let version = agent
            .running
            .map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        let version = if named.contains(&version) {
            version
        } else {
            "other".to_owned()
        };
        let phase = match (&agent.health, reports.get(machine_tag(&agent.id).as_str())) {
            (Health::Down, Some(_)) => "down".to_owned(),
            (_, Some(report)) if !report.phase.is_empty() => report.phase.clone(),
            _ => "unknown".to_owned(),
        };
        *counts.entry((version, phase)).or_insert(0) += 1;
    }
    let rollout = record
        .filter(|record| {
            model
                .as_ref()
                .is_some_and(|model| record.target == model.agent_version)
                || record.halted.is_some()
        })
        .map(|record| {
            let shown = status(&record, &agents);
            let count = |key: &str| shown[key].as_u64().unwrap_or(0);
            RolloutGauges {
                target: record.target.to_string(),
                state: shown["state"].as_str().unwrap_or_default().to_owned(),
                agents: count("agents"),
                admitted: count("admitted"),
                on_target: count("on-target"),
                failed: record.failed.len() as u64,
                held: record.held.len() as u64,
                fetching_ahead: record.fetching_ahead().len() as u64,
            }
        });
    Ok(Fleet {
        agents: counts,
        rollout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::jobs::Capabilities;
    use lockstep_core::lifecycle::ControllerSet;
    use lockstep_core::policy::UpgradePolicy;
    use lockstep_core::{Binary, Role, Roles};
    use lockstep_store::{Durability, MemoryStore, Model};

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn binary(version: &str) -> Binary {
        Binary::parse(&format!("{version}-ubuntu-amd64")).unwrap()
    }

    fn report(version: &str, status: &str, phase: &str, at: u64) -> AgentStatus {
        AgentStatus {
            status: status.to_owned(),
            info: if status == "error" {
                "host step failed".to_owned()
            } else {
                String::new()
            },
            phase: phase.to_owned(),
            version: Some(binary(version)),
            download_rate: None,
            updated: Timestamp(at),
        }
    }

    #[test]
    fn health_is_read_from_the_last_report() {
        let now = Timestamp(100_000);
        assert_eq!(health(None, now), Health::Down);
        assert_eq!(
            health(Some(&report("3.6.1", "started", "ready", 99_000)), now),
            Health::Ready
        );
        assert_eq!(
            health(Some(&report("3.6.1", "started", "upgrading", 99_000)), now),
            Health::Busy
        );
        assert_eq!(
            health(Some(&report("3.6.1", "error", "steps-failed", 99_000)), now),
            Health::Failed("host step failed".into())
        );
        let old = now.0 - AGENT_DOWN_AFTER.as_millis() as u64 - 1;
        assert_eq!(
            health(Some(&report("3.6.1", "started", "ready", old)), now),
            Health::Down
        );
    }

    /// A model on 3.6.2 whose controller runs it, two agents on 3.6.1 reporting Ready, and
    /// the stored config `config`.
    fn store_with(config: Value) -> MemoryStore {
        let store = MemoryStore::new(Durability::Full);
        let model = Model {
            uuid: "deadbeef-0000-4000-8000-000000000001".to_owned(),
            name: "controller".to_owned(),
            agent_version: v("3.6.2"),
            agent_stream: None,
            agent_metadata_url: None,
            policy: UpgradePolicy::Off,
            controllers: ControllerSet::first(1),
            capabilities: Capabilities::new(),
            capabilities_discovered: None,
            upgrade_available: None,
        };
        store
            .transaction(None, &mut |tx| {
                tx.put_model(&model)?;
                let mut controller = Machine::with_roles("0", Roles::of(&[Role::Controller]));
                controller.agent_binary = Some(binary("3.6.2"));
                tx.put_machine(&controller)?;
                for id in ["1", "2"] {
                    let mut machine = Machine::with_roles(id, Roles::of(&[Role::HostMachine]));
                    machine.agent_binary = Some(binary("3.6.1"));
                    tx.put_machine(&machine)?;
                    let now = tx.now().0;
                    tx.put_agent_status(
                        &machine_tag(id),
                        &report("3.6.1", "started", "ready", now),
                    )?;
                }
                tx.put_document(lockstep_store::EntityKind::Settings, "model", &config)?;
                Ok(())
            })
            .unwrap();
        store
    }

    #[test]
    fn the_default_policy_admits_everyone_and_a_staged_one_the_canary_alone() {
        let mut held = None;
        let juju = store_with(json!({}));
        let Pass::Written(record) =
            coordinate(&juju, ControllerId(0), Millis(15_000), &mut held).unwrap()
        else {
            panic!("a record written");
        };
        assert_eq!(record.admitted.keys().collect::<Vec<_>>(), ["1", "2"]);
        assert_eq!(
            coordinate(&juju, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle
        );
        assert!(
            juju.lease().unwrap().is_some(),
            "kept while the rollout goes on"
        );

        let mut held = None;
        let staged = store_with(json!({"rollout-canaries": 1, "rollout-max-at-once": "1"}));
        let Pass::Written(record) =
            coordinate(&staged, ControllerId(0), Millis(15_000), &mut held).unwrap()
        else {
            panic!("a record written");
        };
        assert_eq!(record.admitted.keys().collect::<Vec<_>>(), ["1"]);
        assert_eq!(
            coordinate(&staged, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle
        );
        // Another controller is not the coordinator while the lease lives.
        let read = staged.read(|tx| tx.rollout()).unwrap().unwrap();
        assert_eq!(read, *record);
    }

    /// Every agent of `store` reports Ready on 3.6.2.
    fn all_on_target(store: &MemoryStore) {
        store
            .transaction(None, &mut |tx| {
                for mut machine in tx.machines()? {
                    machine.agent_binary = Some(binary("3.6.2"));
                    tx.put_machine(&machine)?;
                    let now = tx.now().0;
                    tx.put_agent_status(
                        &machine_tag(&machine.id),
                        &report("3.6.2", "started", "ready", now),
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }

    /// Before the controller runs the model's agent-version (Juju's controllers first), a
    /// staged policy prepares: the canary and the next in line are told to fetch ahead,
    /// nobody is admitted, and the lease is given back at once (the controllers' own
    /// upgrade needs it). Under Juju's policy nothing is written. Once the controller
    /// reported running the target, the canary is admitted.
    #[test]
    fn before_the_controllers_run_the_target_a_staged_rollout_is_prepared_and_the_lease_given_back()
    {
        let behind = |config: Value| {
            let store = store_with(config);
            store
                .transaction(None, &mut |tx| {
                    let mut controller = tx.machine("0")?.expect("the controller");
                    controller.agent_binary = Some(binary("3.6.1"));
                    tx.put_machine(&controller)?;
                    Ok(())
                })
                .unwrap();
            store
        };
        let mut held = None;
        let juju = behind(json!({}));
        assert_eq!(
            coordinate(&juju, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle
        );
        assert!(juju.read(|tx| tx.rollout()).unwrap().is_none());

        let staged = behind(json!({"rollout-canaries": 1, "rollout-max-at-once": "2"}));
        let Pass::Written(record) =
            coordinate(&staged, ControllerId(0), Millis(15_000), &mut held).unwrap()
        else {
            panic!("a prepared record written");
        };
        assert!(record.admitted.is_empty(), "{record:?}");
        assert_eq!(
            record.fetching_ahead().into_iter().collect::<Vec<_>>(),
            ["1", "2"]
        );
        assert!(held.is_none() && staged.lease().unwrap().is_none());
        assert_eq!(
            coordinate(&staged, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle,
            "prepared once"
        );

        staged
            .transaction(None, &mut |tx| {
                let mut controller = tx.machine("0")?.expect("the controller");
                controller.agent_binary = Some(binary("3.6.2"));
                tx.put_machine(&controller)?;
                Ok(())
            })
            .unwrap();
        let Pass::Written(record) =
            coordinate(&staged, ControllerId(0), Millis(15_000), &mut held).unwrap()
        else {
            panic!("the canary admitted");
        };
        assert_eq!(record.admitted.keys().collect::<Vec<_>>(), ["1"]);
        assert_eq!(
            record.fetching_ahead().into_iter().collect::<Vec<_>>(),
            ["2"]
        );
    }

    #[test]
    fn a_fleet_on_the_target_needs_no_record_and_takes_no_lease() {
        let mut held = None;
        let store = store_with(json!({"rollout-canaries": 1}));
        all_on_target(&store);
        assert_eq!(
            coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle
        );
        assert!(
            store.lease().unwrap().is_none(),
            "no lease taken for nothing"
        );
    }

    #[test]
    fn the_lease_is_given_back_once_the_fleet_is_on_the_target() {
        let mut held = None;
        let store = store_with(json!({}));
        let pass = coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap();
        assert!(matches!(pass, Pass::Written(_)), "{pass:?}");
        assert!(held.is_some() && store.lease().unwrap().is_some());
        all_on_target(&store);
        assert_eq!(
            coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap(),
            Pass::Idle
        );
        assert!(held.is_none());
        assert!(store.lease().unwrap().is_none(), "{:?}", store.lease());
    }

    #[test]
    fn the_fleet_counts_agents_by_version_and_phase_and_the_rollout() {
        let mut held = None;
        let store = store_with(json!({"rollout-canaries": 1}));
        coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap();
        let fleet = fleet(&store).unwrap();
        assert_eq!(
            fleet.agents,
            std::collections::BTreeMap::from([(("3.6.1".to_owned(), "ready".to_owned()), 2)])
        );
        let rollout = fleet.rollout.expect("a rollout");
        assert_eq!(
            (rollout.target.as_str(), rollout.state.as_str()),
            ("3.6.2", "rolling-out")
        );
        assert_eq!((rollout.agents, rollout.admitted), (2, 1));
    }

    #[test]
    fn desired_versions_are_read_once_per_revision_and_follow_the_rollout() {
        use super::super::upgrader::{DesiredCache, agent_views as desired_views};
        let store = store_with(json!({"rollout-canaries": 1}));
        let cache = DesiredCache::default();
        let server = v("3.6.2");
        let told = |tag: &str| {
            desired_views(&store, &cache, tag, server, &[tag.to_owned()])
                .unwrap()
                .entities[0]
                .as_ref()
                .unwrap()
                .desired
        };
        // Staged, no record yet: each agent stays where it is until admitted.
        assert_eq!(told("machine-1"), v("3.6.1"));
        let first = cache.inputs(&store).unwrap();
        assert!(
            std::sync::Arc::ptr_eq(&first, &cache.inputs(&store).unwrap()),
            "read once while the revision stays"
        );
        // Agents' reports move no revision: still the same read.
        store
            .transaction(None, &mut |tx| {
                let now = tx.now().0;
                tx.put_agent_status("machine-2", &report("3.6.1", "started", "ready", now))?;
                Ok(())
            })
            .unwrap();
        assert!(std::sync::Arc::ptr_eq(
            &first,
            &cache.inputs(&store).unwrap()
        ));
        // The coordinator admits the canary, machine 1: a new revision, read again.
        let mut held = None;
        coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap();
        assert!(!std::sync::Arc::ptr_eq(
            &first,
            &cache.inputs(&store).unwrap()
        ));
        assert_eq!(told("machine-1"), v("3.6.2"));
        assert_eq!(told("machine-2"), v("3.6.1"));
        // Another agent's tag is refused.
        let refused =
            desired_views(&store, &cache, "machine-2", server, &["machine-1".into()]).unwrap();
        assert!(refused.entities[0].is_err());
    }

    #[test]
    fn a_bad_policy_is_named_and_nothing_is_written() {
        let mut held = None;
        let store = store_with(json!({"rollout-canaries": "many"}));
        let Pass::BadPolicy(error) =
            coordinate(&store, ControllerId(0), Millis(15_000), &mut held).unwrap()
        else {
            panic!("a bad policy");
        };
        assert!(error.to_string().contains("\"many\""), "{error}");
    }

    #[test]
    fn abort_holds_the_agents_and_resume_refuses_what_is_not_halted() {
        let store = store_with(json!({"rollout-canaries": 1}));
        let error = resume(&store, &json!({})).unwrap_err();
        assert!(error.message.contains("3.6.2 is not halted"), "{error:?}");
        let answer = abort(&store, &json!({})).unwrap();
        assert_eq!(answer["state"], "halted");
        assert_eq!(answer["held"], json!({"1": "3.6.1", "2": "3.6.1"}));
        let answer = resume(&store, &json!({})).unwrap();
        assert_eq!(answer["state"], "rolling-out", "{answer}");
    }
}
