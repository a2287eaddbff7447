//! Staged rollouts of machine agents (issue 21, `spec/rollout.md`) with real processes: a
//! controller started as the README says, machine agents started by `lockstep add-machine`,
//! the policy set with `lockstep model-config`, and the operator's `lockstep upgrade-model
//! --resume`.

use std::time::{Duration, Instant};

use lockstep_agent::daemon::failpoints::{FAIL_MACHINE_HOST_STEPS, PAUSE_MACHINE_HOST_STEP};
use lockstep_agent::datadir::host_binary;
use serde_json::Value;

use crate::common::http_mirror::HoldBack;
use crate::common::{Controller, LOCKSTEPD, later_patch, next, own, text};
use crate::common::{agents_download_windows, download_windows, most_at_once};
use crate::machine_agents::{agent_logs, wait_for_agents};

/// How long a controller may take to reach Ready (through an upgrade included).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The machine agents' trial: a new binary not Ready within it is given up, and the agent
/// falls back to the binary it ran before.
const TRIAL_SECONDS: &str = "30";

/// `lockstep status --format json`, as an operator reads it.
fn status_json(controller: &Controller) -> Value {
    let output = controller.run(&["status", "--format", "json"]);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).expect("status --format json is JSON")
}

/// The ids of machines 1 to `count` in the order a rollout chooses its canaries and then
/// admits the fast end of its line (`rollout::canary_order`, `rollout::admission_order`):
/// the fastest reported link first, machine-id order among equal rates. Waits until each
/// agent reports a rate: its link probe's, for an agent provisioned from the controller's
/// own binary, which the loopback makes about equal and so in no fixed order.
async fn by_link_speed(controller: &Controller, count: usize) -> Vec<String> {
    let ids: Vec<String> = (1..=count).map(|id| id.to_string()).collect();
    let rate = |status: &Value, id: &str| {
        status["machines"][id]["agent-status"]["data"]["download-rate"].as_u64()
    };
    let status = wait_for_status(
        controller,
        "every agent's link rate reported",
        Duration::from_secs(60),
        |status| ids.iter().all(|id| rate(status, id).is_some()),
    )
    .await;
    let mut order = ids.clone();
    order.sort_by_key(|id| (std::cmp::Reverse(rate(&status, id)), id.parse::<u32>().ok()));
    order
}

/// Polls `lockstep status` until `done` says so, for at most `within`; returns that status.
async fn wait_for_status(
    controller: &Controller,
    what: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let status = status_json(controller);
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "not {what} within {within:?}:\n{status:#}\nagents:\n{}",
            agent_logs(controller)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn rollout(status: &Value) -> &Value {
    &status["model"]["lockstep"]["rollout"]
}

/// `lockstep upgrade-model --agent-version <version>`, asked again until the controller
/// lists the version: it reads its mirror again within its catalogue's freshness (30 s).
async fn upgrade_model_once_listed(controller: &Controller, version: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let upgrade = controller.run(&["upgrade-model", "--agent-version", version]);
        if upgrade.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline && text(&upgrade).contains("no agent binaries"),
            "{}",
            text(&upgrade)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits until the three machine agents report `started` on `version` and the rollout
/// says `done`; returns that status.
async fn finished_on(controller: &Controller, version: lockstep_core::Version) -> Value {
    wait_for_agents(controller, 3, version, Duration::from_secs(300)).await;
    wait_for_status(
        controller,
        "the rollout done",
        Duration::from_secs(60),
        |status| rollout(status)["state"] == "done",
    )
    .await
}

/// The version machine `id`'s agent reports in `status`, if it reports `started`.
fn started_on(status: &Value, id: &str) -> Option<String> {
    let agent = &status["machines"][id]["agent-status"];
    (agent["status"] == "started").then(|| agent["version"].as_str().unwrap_or("").to_owned())
}

/// The policy set and shown with `lockstep model-config`. A canary given a binary that fails
/// its host steps halts the rollout with no other agent
/// switched; the canary falls back to the binary it ran; `upgrade-model --abort` holds every
/// agent on what it runs, the model's agent-version untouched; with those agents behind,
/// `upgrade-model --check-agent-versions` is refused naming them, and without the flag the
/// model is upgraded to a fixed binary published meanwhile
/// (`upgrade-model --agent-version`), which does not lift the halt; `upgrade-model --resume` does, and the
/// fleet finishes on the fixed binary with at most `rollout-max-at-once` (1) agents
/// receiving a binary at any moment, counted from the agents' own logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_canary_halts_the_rollout_abort_holds_the_fleet_and_resume_after_a_fixed_binary_finishes_it()
 {
    let (bad, fixed) = (next(), later_patch(2));
    let (mirror, controller) = Controller::from_signed_mirror();
    let set = controller.run(&[
        "model-config",
        "rollout-canaries=1",
        "rollout-max-at-once=1",
        "rollout-failures-tolerated=0",
    ]);
    assert!(set.status.success(), "{}", text(&set));
    let shown = controller.run(&["model-config"]);
    assert!(shown.status.success(), "{}", text(&shown));
    for expected in [
        "rollout-canaries: 1\n",
        "rollout-max-at-once: 1\n",
        "rollout-failures-tolerated: 0\n",
    ] {
        assert!(
            text(&shown).contains(expected),
            "{expected:?}: {}",
            text(&shown)
        );
    }
    // A bad value is refused, naming it.
    let refused = controller.run(&["model-config", "rollout-canaries=some"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("\"some\""), "{}", text(&refused));

    // Three machine agents, whose host steps fail on the bad version only (a failpoint of
    // the machine agent, never of the controller, which runs that version fine).
    let bad_text = bad.to_string();
    let add = controller.run_with_env(
        &["add-machine", "-n", "3"],
        &[
            (FAIL_MACHINE_HOST_STEPS, bad_text.as_str()),
            ("LOCKSTEPD_TRIAL_READY_TIMEOUT_SEC", TRIAL_SECONDS),
        ],
    );
    assert!(add.status.success(), "{}", text(&add));
    wait_for_agents(&controller, 3, own(), Duration::from_secs(120)).await;
    // The canary: the fastest link the agents' probes reported.
    let canary = by_link_speed(&controller, 3).await.remove(0);

    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &bad_text]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(bad, READY_WITHIN).await;

    // The canary fails its host steps: the rollout halts, naming it and why.
    let halted = wait_for_status(&controller, "halted", Duration::from_secs(180), |status| {
        rollout(status)["state"] == "halted"
    })
    .await;
    let record = rollout(&halted);
    assert_eq!(record["target"], bad_text, "{record:#}");
    assert_eq!(
        record["canaries"],
        serde_json::json!([canary]),
        "{record:#}"
    );
    let failed = record["failed"].as_object().expect("failed agents");
    assert_eq!(failed.keys().collect::<Vec<_>>(), [&canary], "{record:#}");
    assert!(
        failed[&canary]
            .as_str()
            .unwrap()
            .contains(FAIL_MACHINE_HOST_STEPS),
        "{record:#}"
    );
    // /metrics shows it too: the rollout halted, its failure, the fleet by version/phase.
    let (code, body) = controller.https_get("/metrics", None).await;
    let metrics = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{metrics}");
    for expected in [
        format!("lockstep_rollout_info{{target=\"{bad_text}\",state=\"halted\"}} 1"),
        "lockstep_rollout_halted 1".to_owned(),
        "lockstep_rollout_agents{state=\"failed\"} 1".to_owned(),
        format!(
            "lockstep_machine_agents{{version=\"{}\",phase=\"ready\"}} 2",
            own()
        ),
    ] {
        assert!(
            metrics.contains(&expected),
            "{expected:?} not in:\n{metrics}"
        );
    }
    let tabular = controller.run(&["status"]);
    let shown = String::from_utf8_lossy(&tabular.stdout).into_owned();
    for expected in [
        "halted",
        "Failed-machine",
        FAIL_MACHINE_HOST_STEPS,
        "--resume",
    ] {
        assert!(shown.contains(expected), "{expected:?} not in:\n{shown}");
    }

    // Its trial over, the canary falls back to the binary it ran, and stays there: a failed
    // agent is told the version it runs.
    let own_text = own().to_string();
    wait_for_status(
        &controller,
        "the canary back on its first binary",
        Duration::from_secs(120),
        |status| started_on(status, &canary).as_deref() == Some(own_text.as_str()),
    )
    .await;
    // No other agent switched, nor fetched the bad binary.
    for dir in controller.data().machine_agent_dirs() {
        let conf = dir.read_agent_conf().unwrap().unwrap();
        if conf.tag == format!("machine-{canary}") {
            continue;
        }
        assert!(
            dir.read_downloaded_tools(&host_binary(bad))
                .unwrap()
                .is_none(),
            "{} downloaded {bad} while the rollout was halted",
            conf.tag
        );
    }

    // The operator aborts: every agent that has not switched is held on what it runs.
    let abort = controller.run(&["upgrade-model", "--abort"]);
    assert!(abort.status.success(), "{}", text(&abort));
    let aborted = status_json(&controller);
    let record = rollout(&aborted);
    assert_eq!(record["state"], "halted", "{record:#}");
    assert_eq!(
        record["held"],
        serde_json::json!({"1": own_text, "2": own_text, "3": own_text}),
        "{record:#}"
    );
    assert_eq!(
        aborted["model"]["version"], bad_text,
        "agent-version is never lowered"
    );

    // A fixed binary is published and the controller upgraded to it: the halt holds (what
    // the abort held does not: a new agent-version is the operator's new word).
    lockstep_agent::cli::demo::publish(mirror.path(), fixed, std::path::Path::new(LOCKSTEPD), true)
        .expect("publish the fixed binary");
    lockstep_agent::cli::demo::generate(mirror.path(), mirror.key.as_ref())
        .expect("regenerate the mirror's metadata");
    let fixed_text = fixed.to_string();
    // Asked to, the controller refuses an upgrade while agents lag (Juju's check, in Juju's
    // words): the three held agents run the first binary, the model the bad one. The
    // controller itself runs the model's version and is not named.
    let checked = controller.run(&[
        "upgrade-model",
        "--agent-version",
        &fixed_text,
        "--check-agent-versions",
    ]);
    assert!(!checked.status.success(), "{}", text(&checked));
    assert!(
        text(&checked).contains(&format!(
            "some agents have not upgraded to the current model version {bad_text}: \
             machine-1, machine-2, machine-3"
        )),
        "{}",
        text(&checked)
    );
    assert_eq!(
        status_json(&controller)["model"]["version"],
        bad_text,
        "a refused upgrade changes nothing"
    );
    // Not asked to, lagging agents do not block it.
    upgrade_model_once_listed(&controller, &fixed_text).await;
    controller.wait_running(fixed, READY_WITHIN).await;
    let still = wait_for_status(
        &controller,
        "the rollout of the fixed version recorded, halted",
        Duration::from_secs(60),
        |status| rollout(status)["target"] == fixed_text.as_str(),
    )
    .await;
    assert_eq!(rollout(&still)["state"], "halted", "{still:#}");
    assert_eq!(rollout(&still)["held"], serde_json::json!({}), "{still:#}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = status_json(&controller);
    for id in ["1", "2", "3"] {
        assert_eq!(
            started_on(&status, id).as_deref(),
            Some(own_text.as_str()),
            "machine {id} moved while the rollout was halted:\n{status:#}"
        );
    }

    // The operator resumes: the fleet finishes on the fixed binary.
    let resume = controller.run(&["upgrade-model", "--resume"]);
    assert!(resume.status.success(), "{}", text(&resume));
    assert!(text(&resume).contains("rolling-out"), "{}", text(&resume));
    let done = finished_on(&controller, fixed).await;
    assert_eq!(rollout(&done)["failed"], serde_json::json!({}), "{done:#}");
    // Resuming what is not halted is refused, naming the version.
    let again = controller.run(&["upgrade-model", "--resume"]);
    assert!(!again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains(&format!("{fixed_text} is not halted")),
        "{}",
        text(&again)
    );

    // max-at-once 1, counted at the agents: no two agents were ever receiving a binary at
    // the same moment (the canary's bad download included).
    let windows = agents_download_windows(&controller.data());
    assert_eq!(windows.len(), 4, "1 bad download and 3 fixed: {windows:?}");
    assert_eq!(most_at_once(&windows), 1, "{windows:?}");
}

/// While the canary tries a binary (its host steps take 8 s here, as real steps take
/// time), the agents next in line, as many as `rollout-max-at-once` (2) leaves beside it
/// (one: the next fastest link the agents' probes reported), are told to fetch it ahead of
/// their admission (`stage-version`): they download and keep it and go on running their
/// own. Admitted once the canary (the fastest link) is Ready on it, the next in line
/// switches without downloading it again. Read from the agents' own logs: each agent
/// received the target once, the next in line fetched it ahead and the last did not, and
/// no more than max-at-once agents were receiving a binary at any moment; `lockstep status`
/// names the next in line while the canary tries the binary. (The canary also fetches ahead
/// when a coordinator pass prepared the rollout while the controller was still Ready on the
/// old version, `rollout::prepare`; whether one did depends on the controller's timing
/// here, so either is accepted for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_after_the_canary_fetch_the_binary_ahead_and_switch_to_it_without_a_second_download()
 {
    let target = next();
    let (_mirror, controller) = Controller::from_signed_mirror();
    let set = controller.run(&[
        "model-config",
        "rollout-canaries=1",
        "rollout-max-at-once=2",
    ]);
    assert!(set.status.success(), "{}", text(&set));
    let pause = format!("{target}:8000");
    let add = controller.run_with_env(
        &["add-machine", "-n", "3"],
        &[(PAUSE_MACHINE_HOST_STEP, pause.as_str())],
    );
    assert!(add.status.success(), "{}", text(&add));
    wait_for_agents(&controller, 3, own(), Duration::from_secs(120)).await;
    let order = by_link_speed(&controller, 3).await;
    let (canary, next_in_line) = (order[0].clone(), order[1].clone());

    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &target.to_string()]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(target, READY_WITHIN).await;
    // `lockstep status` shows who fetches ahead while the canary tries the binary.
    let trying = wait_for_status(
        &controller,
        "the next in line told to fetch ahead",
        Duration::from_secs(120),
        |status| rollout(status)["fetching-ahead"] == serde_json::json!([next_in_line]),
    )
    .await;
    assert_eq!(rollout(&trying)["canaries-passed"], false, "{trying:#}");
    let done = finished_on(&controller, target).await;
    assert_eq!(
        rollout(&done)["canaries"],
        serde_json::json!([canary]),
        "{done:#}"
    );
    assert_eq!(
        rollout(&done)["fetching-ahead"],
        serde_json::json!([]),
        "{done:#}"
    );

    for dir in controller.data().machine_agent_dirs() {
        let tag = dir.read_agent_conf().unwrap().unwrap().tag;
        let log = std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default();
        let windows = download_windows(&log, &tag);
        assert_eq!(
            windows.len(),
            1,
            "{tag} received {target} once: {windows:?}\n{}",
            agent_logs(&controller)
        );
        let fetched_ahead = log.contains("fetched ahead of admission; kept, not switched to");
        if tag != format!("machine-{canary}") {
            assert_eq!(
                fetched_ahead,
                tag == format!("machine-{next_in_line}"),
                "{tag}: of the others, only the agent after the canary fetches ahead\n{}",
                agent_logs(&controller)
            );
        }
        assert!(
            dir.read_downloaded_tools(&host_binary(target))
                .unwrap()
                .is_some(),
            "{tag} has {target} installed"
        );
    }
    let windows = agents_download_windows(&controller.data());
    assert!(most_at_once(&windows) <= 2, "{windows:?}");
}

/// Before the controller runs the target (Juju's controllers first), the rollout is
/// prepared (`rollout::prepare`): the controller's own download of N+1 is held at the
/// mirror, so it stays Ready on N with the model's agent-version already N+1, and its
/// coordinator writes a record that admits nobody and tells the canary (the fastest link
/// the agents' probes reported) and the next in line (the next fastest, as
/// `rollout-max-at-once` 2 leaves) to fetch ahead, as `lockstep status` shows. Released, the controller upgrades, the canary is admitted, and the fleet
/// finishes with no more than max-at-once agents receiving a binary at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_controller_upgrades_itself_the_canary_and_the_next_in_line_are_told_to_fetch_ahead()
 {
    let target = next();
    let (_mirror, served, controller) =
        Controller::from_held_http_mirror(HoldBack::Binary(host_binary(target).to_string()));
    let set = controller.run(&[
        "model-config",
        "rollout-canaries=1",
        "rollout-max-at-once=2",
    ]);
    assert!(set.status.success(), "{}", text(&set));
    let add = controller.run(&["add-machine", "-n", "3"]);
    assert!(add.status.success(), "{}", text(&add));
    wait_for_agents(&controller, 3, own(), Duration::from_secs(120)).await;
    let order = by_link_speed(&controller, 3).await;
    // `fetching-ahead` lists ids in their text's order.
    let mut ahead = vec![order[0].clone(), order[1].clone()];
    ahead.sort();

    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &target.to_string()]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    let prepared = wait_for_status(
        &controller,
        "the canary and the next in line told to fetch ahead, nobody admitted",
        Duration::from_secs(120),
        |status| {
            rollout(status)["fetching-ahead"] == serde_json::json!(ahead)
                && rollout(status)["admitted"] == 0
        },
    )
    .await;
    assert_eq!(
        rollout(&prepared)["canaries"],
        serde_json::json!([order[0]]),
        "{prepared:#}"
    );
    assert!(
        controller
            .serving_exe()
            .is_some_and(|exe| exe.starts_with(controller.binary_dir(own()))),
        "the controller still runs {}",
        own()
    );
    assert!(
        served.held() >= 1,
        "the download of {target} from the mirror is held"
    );

    served.release();
    controller.wait_running(target, READY_WITHIN).await;
    let done = finished_on(&controller, target).await;
    assert_eq!(rollout(&done)["failed"], serde_json::json!({}), "{done:#}");
    let windows = agents_download_windows(&controller.data());
    assert!(most_at_once(&windows) <= 2, "{windows:?}");
}

/// Machine agents provisioned from the controller's own binary probe their link and report
/// the probe's rate; once they download a binary they report that download's rate instead
/// (`data.download-rate`, shown by `lockstep status`), and the next rollout admits the
/// slowest of them first and then the fastest (`rollout::admission_order`): three agents
/// report their probes (`link-probe.json`, one probe each), then, upgraded once under
/// Juju's policy, the rates their downloads recorded; given records of 50, 1 and 20 MB/s
/// (loopback makes them all fast) and restarted, they report those, and upgraded again
/// with `rollout-max-at-once=1` they receive the second binary one after the other, the
/// slowest first, then the fastest, read from their own logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_report_their_link_probe_then_their_download_rate_and_the_next_rollout_admits_the_slowest_first()
 {
    let (first, second) = (next(), later_patch(2));
    let (mirror, controller) = Controller::from_signed_mirror();
    let add = controller.run(&["add-machine", "-n", "3"]);
    assert!(add.status.success(), "{}", text(&add));
    wait_for_agents(&controller, 3, own(), Duration::from_secs(120)).await;
    let rate = |status: &Value, id: &str| {
        status["machines"][id]["agent-status"]["data"]["download-rate"].as_u64()
    };
    // What each agent recorded: its link probe, and the rate of its download of `binary`.
    let recorded = |id: &str, binary: Option<lockstep_core::Binary>| {
        let dir = controller
            .data()
            .machine_agent_dirs()
            .into_iter()
            .find(|dir| dir.read_agent_conf().unwrap().unwrap().tag == format!("machine-{id}"))
            .expect("the agent's data dir");
        let probe = dir.read_link_probe().unwrap();
        let downloaded = binary.and_then(|binary| {
            dir.read_downloaded_tools(&binary)
                .unwrap()
                .and_then(|tools| tools.download_rate)
        });
        let log = std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default();
        (probe, downloaded, log.matches("link probed").count())
    };
    // Provisioned from the controller's own binary, no agent has downloaded anything: each
    // probes its link once and reports what the probe measured.
    let probed = wait_for_status(
        &controller,
        "every agent's link probe reported",
        Duration::from_secs(60),
        |status| ["1", "2", "3"].iter().all(|id| rate(status, id).is_some()),
    )
    .await;
    for id in ["1", "2", "3"] {
        let (probe, _, probes) = recorded(id, None);
        let probe = probe.unwrap_or_else(|| panic!("machine {id} kept no link probe"));
        assert_eq!(probe.bytes, lockstep_core::upgrader::LINK_PROBE_BYTES);
        assert!(probe.bytes_per_second > 0, "machine {id}: {probe:?}");
        assert_eq!(
            rate(&probed, id),
            Some(probe.bytes_per_second),
            "machine {id} reports its probe:\n{probed:#}"
        );
        assert_eq!(probes, 1, "machine {id} probed once");
    }

    // Juju's policy: every agent at once. Each then reports the rate its download
    // measured, not its probe's.
    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &first.to_string()]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(first, READY_WITHIN).await;
    wait_for_agents(&controller, 3, first, Duration::from_secs(300)).await;
    let measured = wait_for_status(
        &controller,
        "every agent's download rate reported",
        Duration::from_secs(60),
        |status| {
            ["1", "2", "3"].iter().all(|id| {
                let (_, downloaded, _) = recorded(id, Some(host_binary(first)));
                downloaded.is_some() && rate(status, id) == downloaded
            })
        },
    )
    .await;
    assert!(
        ["1", "2", "3"]
            .iter()
            .all(|id| rate(&measured, id).is_some_and(|rate| rate > 0)),
        "{measured:#}"
    );
    for id in ["1", "2", "3"] {
        let (_, _, probes) = recorded(id, None);
        assert_eq!(
            probes, 1,
            "machine {id} did not probe again once it had downloaded"
        );
    }
    // `lockstep status` shows it too.
    let tabular = controller.run(&["status"]);
    let shown = String::from_utf8_lossy(&tabular.stdout).into_owned();
    assert!(
        shown.contains("Download") && shown.contains("B/s"),
        "{shown}"
    );

    // Loopback gives every agent about the same rate; give them links of their own: each
    // agent's record of its download says 50, 1 and 20 MB/s, and its worker, killed -9 and
    // restarted by its launcher, reports that.
    let links = [("1", 50_000_000u64), ("2", 1_000_000), ("3", 20_000_000)];
    for dir in controller.data().machine_agent_dirs() {
        let tag = dir.read_agent_conf().unwrap().unwrap().tag;
        let id = tag.strip_prefix("machine-").expect("a machine tag");
        let (_, link) = links
            .iter()
            .find(|(of, _)| *of == id)
            .expect("machines 1-3");
        let binary = host_binary(first);
        let mut tools = dir
            .read_downloaded_tools(&binary)
            .unwrap()
            .expect("downloaded");
        assert!(
            tools.url.contains("/tools/"),
            "downloaded from {}",
            tools.url
        );
        tools.download_rate = Some(*link);
        std::fs::write(
            dir.binary_dir(&binary).join("downloaded-tools.txt"),
            serde_json::to_vec(&tools).unwrap(),
        )
        .unwrap();
        let launcher = crate::common::pid_in(&dir.pid_path()).expect("a launcher pid");
        let worker = lockstep_agent::cli::demo::worker_pid(launcher).expect("a worker");
        let target = rustix::process::Pid::from_raw(worker as i32).unwrap();
        rustix::process::kill_process(target, rustix::process::Signal::KILL).unwrap();
    }
    wait_for_status(
        &controller,
        "the agents' new rates reported",
        Duration::from_secs(60),
        |status| {
            links
                .iter()
                .all(|(id, link)| rate(status, id) == Some(*link))
        },
    )
    .await;
    // Turn 0 goes to the slowest (2), the others to the fastest first (1, then 3): not
    // machine-id order, nor fastest or slowest first.
    let expected = ["2", "1", "3"];

    // One agent at a time, so each receives its binary only once the one before is Ready.
    let set = controller.run(&["model-config", "rollout-max-at-once=1"]);
    assert!(set.status.success(), "{}", text(&set));
    lockstep_agent::cli::demo::publish(
        mirror.path(),
        second,
        std::path::Path::new(LOCKSTEPD),
        true,
    )
    .expect("publish the second binary");
    lockstep_agent::cli::demo::generate(mirror.path(), mirror.key.as_ref())
        .expect("regenerate the mirror's metadata");
    upgrade_model_once_listed(&controller, &second.to_string()).await;
    controller.wait_running(second, READY_WITHIN).await;
    wait_for_agents(&controller, 3, second, Duration::from_secs(300)).await;

    // Each agent's second window (first byte to last, from its own log), in time order.
    let mut second_windows: Vec<(u64, u64, String)> = controller
        .data()
        .machine_agent_dirs()
        .iter()
        .map(|dir| {
            let tag = dir.read_agent_conf().unwrap().unwrap().tag;
            let log =
                std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default();
            let windows = download_windows(&log, &tag);
            assert_eq!(windows.len(), 2, "{tag}: two downloads: {windows:?}");
            let id = tag
                .strip_prefix("machine-")
                .expect("a machine tag")
                .to_owned();
            (windows[1].0, windows[1].1, id)
        })
        .collect();
    second_windows.sort_unstable();
    let order: Vec<&str> = second_windows
        .iter()
        .map(|(_, _, id)| id.as_str())
        .collect();
    assert_eq!(
        order, expected,
        "admitted slowest first, then fastest; windows {second_windows:?}"
    );
    for pair in second_windows.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "one at a time: {second_windows:?}");
    }
}
