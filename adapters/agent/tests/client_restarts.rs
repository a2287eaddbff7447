//! The client against a server that dies: `lockstepd` runs as its own process, which the
//! tests SIGKILL (launcher and worker) and start again on the same data dir and port,
//! between events and in the middle of calls. Issue 7's "tests with real processes".

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Controller, Mirror, Published, next};
use lockstep_transport::client::ClientError;
use serde_json::{Value, json};

/// A controller asked to upgrade to a tampered binary, with staging retried only every two
/// minutes: it stays `upgrading` for as long as a test needs.
async fn stuck_upgrading() -> (Mirror, Controller) {
    let mirror = Mirror::n_and_next(Published::Tampered);
    let source = mirror.source();
    let key = mirror.key();
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    controller.kill_9();
    controller.set_agent_version_in_store(next());
    controller.start(&[("LOCKSTEPD_STAGE_RETRY_SEC", "120")]);
    controller
        .wait_phase("upgrading", Duration::from_secs(60))
        .await;
    (mirror, controller)
}

fn deploy_params(name: &str, units: u64) -> Value {
    json!({"applications": [{"application": name, "charm-url": "ubuntu", "num-units": units}]})
}

/// A watcher resumes across five kill -9 restarts and sees every application once, in
/// order; one more change between each restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_each_change_once_in_order_across_kill_9_restarts() {
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let watching = controller.client();
    let writing = controller.client();
    let mut watcher = watching.watch();
    let first = watcher.next(Duration::from_secs(30)).await.unwrap();
    let mut revisions: Vec<u64> = first.iter().map(|d| d.revision.0).collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..5 {
        let name = format!("app-{round}");
        writing
            .mutate(
                "Application",
                20,
                "Deploy",
                deploy_params(&name, 1),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        controller.kill_9();
        controller.start(&[]);
        // The change made before the restart arrives once, after it.
        while !seen.contains_key(&name) {
            for delta in watcher.next(Duration::from_secs(60)).await.unwrap() {
                revisions.push(delta.revision.0);
                if delta.delta[0] == "application" {
                    let app = delta.delta[2]["name"].as_str().unwrap().to_owned();
                    *seen.entry(app).or_default() += 1;
                }
            }
        }
    }
    assert!(
        revisions.windows(2).all(|p| p[0] <= p[1]),
        "in order: {revisions:?}"
    );
    for (app, count) in &seen {
        assert_eq!(*count, 1, "{app} delivered {count} times: {seen:?}");
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
}

/// A deploy in flight when the server is killed is retried with its operation-id and
/// applied exactly once, whatever moment the kill hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_through_a_kill_9_during_the_call_is_applied_once() {
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let client = controller.client();
    for (round, delay_ms) in [0u64, 1, 3, 7, 15].into_iter().enumerate() {
        let name = format!("through-{round}");
        let call = client.mutate(
            "Application",
            20,
            "Deploy",
            deploy_params(&name, 3),
            Duration::from_secs(90),
        );
        let kill = async {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            controller.kill_9();
            controller.start(&[]);
        };
        let (result, ()) = tokio::join!(call, kill);
        result.unwrap_or_else(|e| panic!("deploy {name}: {e}"));
    }
    let status = controller.full_status().await;
    for round in 0..5 {
        let name = format!("through-{round}");
        let units = status["applications"][&name]["units"]
            .as_object()
            .map(|u| u.len());
        assert_eq!(
            units,
            Some(3),
            "{name} applied once with 3 units: {status:#}"
        );
    }
    let retries = client.stats();
    assert!(
        retries.disconnected > 0,
        "the kills were ridden through: {retries:?}"
    );
}

/// A client that subscribed while the controller upgraded proceeds once it is Ready, and
/// its first full-API call succeeds; the phases it saw are the limited ones, then Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_for_ready_proceeds_when_ready() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let source = mirror.source();
    let key = mirror.key();
    let controller =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    controller.assert_bootstrapped();
    // Stop it, ask for the upgrade in the store, and start it again: it boots limited.
    controller.kill_9();
    controller.set_agent_version_in_store(next());
    // The client must subscribe while the controller is still limited. Without help it may
    // not: `start` returns once the pid file is written, before the launcher binds the API
    // port, so the client's first connect can be refused and back off (100 ms, doubling to
    // 3 s), while the whole upgrade takes about a second; a client that answers late sees
    // only Ready. So the new binary pauses 3 s inside its database step (the failpoint
    // holds it in `running-steps`, under the 4 s the lease keep-alive may wait for the
    // store), the test waits until the controller serves that phase, and only then starts
    // waiting: its first call goes to a listening controller and is answered at once,
    // within the pause, with a limited phase.
    let client = controller.client();
    controller.start(&[(
        lockstep_agent::daemon::failpoints::PAUSE_DATABASE_STEP_MS,
        "3000",
    )]);
    controller
        .wait_phase("running-steps", Duration::from_secs(60))
        .await;
    let phases = client.wait_ready(Duration::from_secs(120)).await.unwrap();
    assert_eq!(
        phases.last(),
        Some(&lockstep_core::Phase::Ready),
        "{phases:?}"
    );
    assert!(
        phases.len() > 1,
        "it waited through limited phases: {phases:?}"
    );
    client
        .call("Client", 8, "FullStatus", json!({}), Duration::from_secs(5))
        .await
        .expect("the first call after Ready succeeds");
    let status = controller.status().await;
    assert_eq!(status["agent-version"], next().to_string());
}

/// A call that cannot be served before its deadline fails naming the phase it was stuck in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_expires_with_the_phase_named() {
    let (_mirror, controller) = stuck_upgrading().await;
    let client = controller.client();
    let error = client
        .mutate(
            "Application",
            20,
            "Deploy",
            deploy_params("late", 1),
            Duration::from_secs(3),
        )
        .await
        .expect_err("the controller stays upgrading past the deadline");
    let ClientError::GaveUp(give_up) = &error else {
        panic!("expected GaveUp, got {error:?}");
    };
    assert_eq!(
        give_up.phase,
        Some(lockstep_core::Phase::Upgrading),
        "{error}"
    );
    assert!(
        error.to_string().contains("upgrading"),
        "the message names the phase: {error}"
    );
}

/// The CLI against a controller that is upgrading: a command waits through it with a
/// note, and gives up at its `--timeout` naming the phase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_commands_wait_through_an_upgrade_with_a_note_and_name_the_phase() {
    let (_mirror, controller) = stuck_upgrading().await;

    let bundle = controller.dir.path().join("bundle.yaml");
    std::fs::write(&bundle, lockstep_agent::cli::demo::DEMO_BUNDLE).unwrap();
    let deploy = controller.run(&["deploy", bundle.to_str().unwrap(), "--timeout", "3"]);
    let said = common::text(&deploy);
    assert!(!deploy.status.success(), "{said}");
    assert!(said.contains("waiting up to"), "a visible note: {said}");
    assert!(said.contains("upgrading"), "the phase is named: {said}");
    // Status is served in every phase, and says what the controller is doing.
    let status = controller.run(&["status", "--format", "json"]);
    assert!(status.status.success(), "{}", common::text(&status));
}
