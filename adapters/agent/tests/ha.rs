//! Highly available controllers on etcd (issue 10): a real 3-member etcd cluster and three
//! real controller processes (`lockstep bootstrap --store etcd` then `lockstep enable-ha`),
//! all on 127.0.0.1 with ports chosen free at run time. Every scenario asserts what the
//! issue asks: the upgrade completes (or aborts saying why), no database step ran twice
//! (the store's event log holds each checkpoint once), every client operation was applied
//! once, and all controllers end Ready on one version.
//!
//! Needs `--features etcd` and etcd installed (`.ci/install-etcd`). Each scenario starts its
//! own cluster and three controllers, so the scenarios take turns ([`one_at_a_time`]) whatever
//! `--test-threads` says.
//! Measured times are printed (run with `--nocapture`); `benches/ha.rs` is the benchmark.
#![allow(clippy::print_stderr)]

mod common;
#[path = "../../store/tests/support/etcd_cluster.rs"]
mod etcd_cluster;
#[path = "common/ha.rs"]
mod ha_harness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{next, own};
use ha_harness::*;
use lockstep_core::Phase;
use lockstep_core::lifecycle::UpgradeStatus;
use serde_json::json;

/// The turn of one scenario: held from before its etcd cluster starts until its controllers
/// and cluster are stopped (declared first in each test, so dropped last). Two scenarios at
/// once would share two cores among six etcd members and six controllers.
/// An async lock: each `#[tokio::test]` has its own runtime, and the turn is held across
/// the scenario's awaits (a scenario that fails releases it as it unwinds).
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_upgrade_together_while_a_client_deploys_through_them_then_their_agents()
{
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[]);
    let model = ha.store.load_model().unwrap().unwrap();
    assert_eq!(model.agent_version, own());
    let controllers: BTreeSet<u8> = model.controllers.iter().map(|c| c.0).collect();
    assert_eq!(controllers, BTreeSet::from([0, 1, 2]));

    // Three machine agents, spread over the three controllers by the local provider.
    let add = ha.controllers[0].run(&["add-machine", "-n", "3"]);
    assert!(add.status.success(), "{}", common::text(&add));
    let agents = ha.controllers[0].data().machine_agent_dirs();
    let firsts: BTreeSet<String> = agents
        .iter()
        .map(|dir| dir.read_agent_conf().unwrap().unwrap().apiaddresses[0].clone())
        .collect();
    assert_eq!(
        firsts.len(),
        3,
        "each agent on a controller of its own: {firsts:?}"
    );
    // Nothing of etcd reaches an agent: no endpoint, no user, no certificate, no store file.
    for dir in &agents {
        let conf = dir.read_agent_conf().unwrap().unwrap();
        assert!(
            conf.etcd_endpoints.is_empty()
                && conf.etcd_prefix.is_empty()
                && conf.etcd_user.is_none()
                && conf.etcd_password_file.is_none()
                && conf.etcd_cacert.is_none()
                && conf.etcd_cert.is_none()
                && conf.etcd_key.is_none(),
            "{}: {conf:?}",
            dir.agent_conf_path().display()
        );
        assert!(!dir.store_path().exists(), "{}", dir.root().display());
    }

    let started = Instant::now();
    ha.upgrade();
    // A client deploys through controller 1 while all three upgrade: its calls wait through
    // the upgrade and each is applied once.
    let deploy = ha.deploy_in_background(1);
    ha.assert_upgraded_once().await;
    eprintln!("three controllers upgraded in {:?}", started.elapsed());
    ha.assert_deployed_once(deploy).await;
    // Then every agent, each through its own controller.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let output = ha.controllers[0].run(&["status", "--format", "json"]);
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        let on_next = status["machines"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, machine)| {
                let jobs = machine["jobs"].as_array().cloned().unwrap_or_default();
                jobs.contains(&json!("JobHostUnits")) && !jobs.contains(&json!("JobManageModel"))
            })
            .filter(|(_, machine)| {
                let shown = &machine["agent-status"];
                shown["status"] == "started" && shown["version"] == next().to_string()
            })
            .count();
        if on_next == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{on_next} of 3 machine agents on {} after the controllers: {status:#}",
            next()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Nor can one reach it: an agent's processes connect to controllers' APIs only, never
    // to an etcd member.
    let apis: BTreeSet<std::net::SocketAddr> = ha
        .controllers
        .iter()
        .map(|controller| {
            let conf = controller.data().read_agent_conf().unwrap().unwrap();
            conf.api_listen.parse().unwrap()
        })
        .collect();
    let etcd_ports: BTreeSet<u16> = ha
        .etcd
        .all_endpoints()
        .iter()
        .filter_map(|url| url.rsplit(':').next()?.trim_end_matches('/').parse().ok())
        .collect();
    assert!(!etcd_ports.is_empty());
    for dir in &agents {
        let launcher = common::pid_in(&dir.pid_path()).expect("a launcher pid");
        let worker = lockstep_agent::cli::demo::worker_pid(launcher).expect("a worker");
        let peers: Vec<std::net::SocketAddr> = [launcher, worker]
            .into_iter()
            .flat_map(common::tcp_peers)
            .collect();
        assert!(
            !peers.is_empty()
                && peers
                    .iter()
                    .all(|peer| apis.contains(peer) && !etcd_ports.contains(&peer.port())),
            "{} connects to {peers:?}; the controllers' APIs are {apis:?}, etcd's ports {etcd_ports:?}",
            dir.root().display()
        );
    }
    // The coordinator released its lease when its steps were done, and the rollout's
    // coordinator (`spec/rollout.md`) its own at its first pass that found the fleet on the
    // target (a pass a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    while ha.coordinator().is_some() {
        assert!(
            Instant::now() < deadline,
            "controller {:?} still holds the lease with the fleet on {}",
            ha.coordinator(),
            next()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The staged rollout's record, read from the shared store.
fn rollout_record(ha: &Ha) -> Option<lockstep_core::rollout::Rollout> {
    let mut record = None;
    ha.store
        .snapshot(&mut |tx| {
            record = tx.rollout()?;
            Ok(())
        })
        .expect("a snapshot of the store");
    record
}

/// A staged rollout (one canary, one agent at a time) whose coordinator, the controller
/// holding the lease, is killed -9 once the rollout admitted its canary: another controller
/// takes the lease over within its bound and goes on from the record in the shared store;
/// no admission is lost or made again, the three machine agents end on N+1, and at no
/// moment did two of them receive a binary at once (counted from the agents' logs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_coordinator_killed_9_mid_rollout_is_taken_over_and_the_fleet_finishes() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[]);
    let set = ha.controllers[0].run(&[
        "model-config",
        "rollout-canaries=1",
        "rollout-max-at-once=1",
    ]);
    assert!(set.status.success(), "{}", common::text(&set));
    let add = ha.controllers[0].run(&["add-machine", "-n", "3"]);
    assert!(add.status.success(), "{}", common::text(&add));
    ha.upgrade();
    ha.assert_upgraded_once().await;

    // The canary admitted, the rollout under way: kill its coordinator.
    let deadline = Instant::now() + UPGRADED_WITHIN;
    let (before, coordinator) = loop {
        if let (Some(record), Some(holder)) = (rollout_record(&ha), ha.coordinator())
            && record.target == next()
            && !record.admitted.is_empty()
            && record.admitted.len() < 3
        {
            break (record, holder);
        }
        assert!(
            Instant::now() < deadline,
            "no rollout under way
{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed = Instant::now();
    let killed_ns = common::monotonic_now_ns();
    ha.controllers[coordinator].kill_9();
    let (successor, takeover) = ha.wait_takeover(coordinator, killed).await;
    eprintln!("controller {successor} took the rollout over from {coordinator} in {takeover:?}");
    assert!(
        takeover <= lease_ttl() + lease_retry() + TAKEOVER_SLACK,
        "took {takeover:?} to take over"
    );

    // The fleet finishes through the two that are left.
    let alive = (0..3).find(|id| *id != coordinator).unwrap();
    let deadline = Instant::now() + UPGRADED_WITHIN;
    loop {
        let output = ha.controllers[alive].run(&["status", "--format", "json"]);
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        if status["model"]["lockstep"]["rollout"]["state"] == "done" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rollout did not finish after controller {coordinator} was killed: {status:#}
{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = rollout_record(&ha).expect("the record");
    assert_eq!(after.admitted.len(), 3, "{after:?}");
    for (id, at) in &before.admitted {
        assert_eq!(
            after.admitted.get(id),
            Some(at),
            "admission of {id} lost or made again: {before:?} then {after:?}"
        );
    }
    assert!(
        after.halted.is_none() && after.failed.is_empty(),
        "{after:?}"
    );
    // Each agent received the binary whole once. The kill lands just after an admission,
    // when that agent may be receiving from the killed controller: such a download breaks
    // off and is made again, whole, through another; no other breaks off.
    let receiving = common::agents_receiving_windows(&ha.controllers[0].data());
    let mut whole: BTreeMap<&str, usize> = BTreeMap::new();
    for (agent, window) in &receiving {
        if window.whole {
            *whole.entry(agent.as_str()).or_default() += 1;
        } else {
            assert!(
                window.last >= killed_ns,
                "{agent}: a download broke off before the kill: {receiving:?}"
            );
        }
    }
    assert_eq!(whole.len(), 3, "{receiving:?}");
    assert!(whole.values().all(|count| *count == 1), "{receiving:?}");
    let windows: Vec<(u64, u64)> = receiving
        .iter()
        .map(|(_, window)| (window.first, window.last))
        .collect();
    assert_eq!(common::most_at_once(&windows), 1, "{windows:?}");
    ha.restart(coordinator, &[]);
    ha.wait_all_running(next()).await;
}

/// etcd over TLS with client certificates (`--client-cert-auth` on every member): three
/// controllers bootstrapped with `--etcd-cacert`, `--etcd-cert` and `--etcd-key` upgrade as
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_on_etcd_over_tls_upgrade_together() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start_on(etcd_cluster::EtcdCluster::start_tls(3, &[]), 3, &[]);
    let conf = ha.controllers[2].data().read_agent_conf().unwrap().unwrap();
    assert!(
        conf.etcd_endpoints
            .iter()
            .all(|url| url.starts_with("https://")),
        "{:?}",
        conf.etcd_endpoints
    );
    assert!(conf.etcd_cacert.is_some() && conf.etcd_cert.is_some() && conf.etcd_key.is_some());
    ha.upgrade();
    let deploy = ha.deploy_in_background(2);
    ha.assert_upgraded_once().await;
    ha.assert_deployed_once(deploy).await;
}

/// `controller.yaml` lists every controller after enable-ha: with the first one down, the
/// CLI carries on through another (they serve one model), and what it did is there once;
/// the others show the killed one `down` once its last status report is older than
/// `AGENT_DOWN_AFTER`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_carries_on_through_another_controller_when_the_first_is_down_and_status_says_so() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[]);
    let endpoints = ha.controllers[0].controller_file().api_endpoints;
    assert_eq!(endpoints.len(), 3, "{endpoints:?}");
    ha.controllers[0].kill_9();
    let killed_at = Instant::now();
    let deploy = ha.deploy_in_background(0);
    let deploy = deploy.join().expect("the deploy thread");
    assert!(deploy.status.success(), "{}", common::text(&deploy));
    let status = ha.controllers[0].run(&["status", "--format", "json"]);
    assert!(status.status.success(), "{}", common::text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    common::assert_bundle_deployed_once(&status);
    assert_eq!(
        status["machines"]["1"]["agent-status"]["status"], "started",
        "{status:#}"
    );
    let bound = lockstep_transport::facade::machiner::AGENT_DOWN_AFTER;
    loop {
        let output = ha.controllers[0].run(&["status", "--format", "json"]);
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        let shown = &status["machines"]["0"]["agent-status"];
        if shown["status"] == "down" {
            break;
        }
        // The bound, and time for one `lockstep status` on a busy machine.
        assert!(
            killed_at.elapsed() < bound + Duration::from_secs(15),
            "controller 0 not shown down {:?} after it was killed: {shown:#}",
            killed_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ha.restart(0, &[]);
    ha.controllers[0].wait_ready(READY_WITHIN).await;
    for controller in &ha.controllers {
        common::assert_bundle_deployed_once(&controller.full_status().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_coordinator_in_a_database_step_hands_over_within_the_lease_bound() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[(
        lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
        DB_STEP_PAUSE_MS,
    )]);
    let before = ha.db_step_lines();
    // A client deploys through controller 0, which may be the one killed.
    let deploy = ha.deploy_in_background(0);
    let (coordinator, successor, takeover) = ha.kill_coordinator_in_database_step().await;
    eprintln!("controller {successor} took over from {coordinator} in {takeover:?}");
    assert!(
        takeover <= lease_ttl() + lease_retry() + TAKEOVER_SLACK,
        "took {takeover:?} to take over"
    );
    // The successor runs the step itself: the killed one's transaction never committed.
    let started = Instant::now();
    while ha.log_lines(successor, DB_STEP_LINE) <= before[successor] {
        assert!(started.elapsed() < UPGRADED_WITHIN, "{}", ha.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ha.restart(coordinator, &[]);
    ha.assert_upgraded_once().await;
    ha.assert_deployed_once(deploy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_waits_for_a_killed_controller_then_completes_when_it_returns() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[]);
    ha.controllers[2].kill_9();
    ha.upgrade();
    let deploy = ha.deploy_in_background(0);
    // Controllers 0 and 1 restart into N+1, say they are ready, and wait for 2.
    let started = Instant::now();
    loop {
        if let Some(record) = ha.record_to(next()) {
            let ready: BTreeSet<u8> = record.controllers_ready.iter().map(|c| c.0).collect();
            assert!(!ready.contains(&2), "{record:?}");
            if ready == BTreeSet::from([0, 1]) {
                break;
            }
        }
        assert!(started.elapsed() < UPGRADED_WITHIN, "{}", ha.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // They keep waiting: no database step runs, nobody opens its API.
    tokio::time::sleep(2 * lease_ttl()).await;
    let record = ha.record_to(next()).unwrap();
    assert_eq!(record.status, UpgradeStatus::Pending, "{record:?}");
    assert!(!next_step_checkpointed(&*ha.store));
    for id in [0, 1] {
        let status = ha.controllers[id].status().await;
        assert_ne!(status["phase"], "ready", "{status}");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("waiting for controllers"),
            "controller {id}: {status}"
        );
    }
    // Controller 2 returns on N, learns the model wants N+1, upgrades and joins.
    ha.restart(2, &[]);
    ha.assert_upgraded_once().await;
    ha.assert_deployed_once(deploy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_aborts_saying_why_when_a_killed_controller_does_not_return() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[
        ("LOCKSTEPD_CONTROLLERS_WAIT_SEC", "20"),
        ("LOCKSTEPD_TRIAL_READY_TIMEOUT_SEC", "40"),
    ]);
    ha.controllers[2].kill_9();
    ha.upgrade();
    let deploy = ha.deploy_in_background(1);
    // Controllers 0 and 1 wait for 2 for LOCKSTEPD_CONTROLLERS_WAIT_SEC, then abort.
    let started = Instant::now();
    let mut messages = [String::new(), String::new()];
    while !messages.iter().all(|message| message.contains("aborted")) {
        for id in [0, 1] {
            let status = ha.controllers[id].status().await;
            messages[id] = status["message"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            started.elapsed() < UPGRADED_WITHIN,
            "{messages:?}\n{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The one whose wait ran out first says why; the other read the aborted record.
    assert!(
        messages.iter().any(|message| message.contains(
            "timed out after 20000ms waiting for controllers (ready [0, 1] of [0, 1, 2])"
        )),
        "{messages:?}"
    );
    let record = ha.record_to(next()).expect("the record");
    assert_eq!(record.status, UpgradeStatus::Aborted, "{record:?}");
    assert!(!next_step_checkpointed(&*ha.store));
    ha.assert_database_steps_once();
    // Then, at their trial deadline, they fall back (no database step ran) onto N.
    for id in [0, 1] {
        ha.controllers[id]
            .wait_running(own(), UPGRADED_WITHIN)
            .await;
    }
    // The fall back set the model's agent-version back, so the returning controller stays.
    let model = ha.store.load_model().unwrap().unwrap();
    assert_eq!(model.agent_version, own());
    ha.restart(2, &[]);
    ha.controllers[2].wait_running(own(), READY_WITHIN).await;
    ha.assert_database_steps_once();
    ha.assert_deployed_once(deploy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_etcd_leader_mid_upgrade_is_ridden_through() {
    let _turn = one_at_a_time().await;
    let mut ha = Ha::start(&[(
        lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
        "3000",
    )]);
    let before = ha.db_step_lines();
    ha.upgrade();
    let deploy = ha.deploy_in_background(0);
    ha.wait_database_step(&before).await;
    let leader = ha.etcd.leader().expect("etcd has a leader");
    ha.etcd.kill(leader);
    ha.assert_upgraded_once().await;
    ha.assert_deployed_once(deploy).await;
}

/// The application a cut-off controller is asked to deploy, and must not.
const REFUSED_APPLICATION: &str = "refused-while-cut-off";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_off_from_etcd_gives_its_lease_up_and_recovers() {
    let _turn = one_at_a_time().await;
    let ha = Ha::start(&[(
        lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
        DB_STEP_PAUSE_MS,
    )]);
    // Each controller reaches etcd through its own proxies, one per member.
    let targets: Vec<std::net::SocketAddr> = ha
        .etcd
        .endpoints()
        .iter()
        .map(|url| url.trim_start_matches("http://").parse().unwrap())
        .collect();
    let proxies: Vec<Vec<Proxy>> = (0..3)
        .map(|_| targets.iter().map(|target| Proxy::start(*target)).collect())
        .collect();
    for (id, own_proxies) in proxies.iter().enumerate() {
        let urls: Vec<String> = own_proxies.iter().map(Proxy::url).collect();
        ha.controllers[id].stop();
        ha.restart(id, &[("LOCKSTEPD_ETCD_ENDPOINTS", &urls.join(","))]);
    }
    for controller in &ha.controllers {
        controller.wait_ready(READY_WITHIN).await;
    }

    let before = ha.db_step_lines();
    ha.upgrade();
    let deploy = ha.deploy_in_background(0);
    let coordinator = ha.wait_database_step(&before).await;
    for proxy in &proxies[coordinator] {
        proxy.blackhole();
    }
    let cut = Instant::now();
    // Its keep-alive goes unanswered: it gives the lease up and stops coordinating.
    while ha.log_lines(coordinator, LEASE_GIVEN_UP_LINE) == 0 {
        assert!(
            cut.elapsed() < lease_ttl() + TAKEOVER_SLACK,
            "controller {coordinator} kept acting as coordinator\n{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (successor, takeover) = ha.wait_takeover(coordinator, cut).await;
    eprintln!("controller {successor} took over from cut-off {coordinator} in {takeover:?}");
    // The successor commits the step; the cut-off one answers no full-API call meanwhile.
    let started = Instant::now();
    while !next_step_checkpointed(&*ha.store) {
        assert!(started.elapsed() < UPGRADED_WITHIN, "{}", ha.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = ha.controllers[coordinator].client();
    let refused = client
        .mutate(
            "Application",
            lockstep_agent::cli::commands::APPLICATION_VERSION,
            "Deploy",
            json!({"applications": [{
                "application": REFUSED_APPLICATION,
                "charm-url": "ch:amd64/jammy/ubuntu",
                "num-units": 1,
            }]}),
            Duration::from_secs(3),
        )
        .await;
    match refused {
        Err(lockstep_transport::client::ClientError::GaveUp(give_up)) => {
            assert!(!give_up.disconnected, "{give_up:?}");
            assert!(
                give_up.phase.is_some_and(|phase| phase != Phase::Ready),
                "{give_up:?}"
            );
        }
        other => panic!("the cut-off controller answered a mutating call: {other:?}"),
    }
    let status = ha.controllers[coordinator].status().await;
    assert_ne!(status["phase"], "ready", "{status}");

    for proxy in &proxies[coordinator] {
        proxy.heal();
    }
    ha.assert_upgraded_once().await;
    ha.assert_deployed_once(deploy).await;
    // The refused call was never applied, on any controller.
    for controller in &ha.controllers {
        let status = controller.full_status().await;
        assert!(
            status["applications"].get(REFUSED_APPLICATION).is_none(),
            "{status:#}"
        );
    }
}
