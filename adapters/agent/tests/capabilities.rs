//! Seed 004 end to end (issue 20, item 4), with real processes: the model's capabilities
//! are rediscovered by the controller's environment provider at the end of every upgrade,
//! and every machine's jobs follow at once, computed at the API from its roles (or a legacy
//! machine's stored jobs) and the model's capabilities, with no machine written. Machine
//! agents reread their jobs (`Agent.GetEntities`) each time they start, so after an upgrade
//! they come back on the new version with the new set.
//!
//! The controller runs the provider made for tests, `--capabilities-file`
//! (`LOCKSTEPD_CAPABILITIES_FILE`, passed through `lockstep bootstrap`'s environment to
//! `lockstepd`): the file is read afresh at every refresh, so the test changes the
//! environment's capabilities between two upgrades.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use lockstep_agent::datadir::{DataDir, host_binary};
use lockstep_core::jobs::Job;
use lockstep_core::lifecycle::Revision;
use lockstep_core::{Roles, Version};
use lockstep_store::{Changes, EntityKind, Life, Machine, Store};
use serde_json::{Value, json};

use crate::common::{Controller, Mirror, Published, later_patch, own, strip_ansi, text};

/// How long a controller may take to reach Ready through an upgrade.
const READY_WITHIN: Duration = Duration::from_secs(180);

/// How long machine agents may take to follow their controller to a new version.
const AGENTS_WITHIN: Duration = Duration::from_secs(180);

/// The id of the legacy machine the test stores itself, as an older client would have.
const LEGACY: &str = "10";

/// `lockstep status --format json`, as an operator reads it.
fn status(controller: &Controller) -> Value {
    let output = controller.run(&["status", "--format", "json"]);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!("status is not JSON ({error}): {}", text(&output));
    })
}

/// The jobs `status` shows for machine `id`.
fn jobs(status: &Value, id: &str) -> Value {
    status["machines"][id]["jobs"].clone()
}

/// The machine ids of the agents `lockstep add-machine` started, from their `agent.conf`.
fn agent_ids(controller: &Controller) -> Vec<String> {
    controller
        .data()
        .machine_agent_dirs()
        .iter()
        .map(|dir| {
            let tag = dir.read_agent_conf().unwrap().unwrap().tag;
            tag.trim_start_matches("machine-").to_owned()
        })
        .collect()
}

/// A machine agent's log without terminal colours.
fn agent_log(dir: &DataDir) -> String {
    strip_ansi(&std::fs::read_to_string(dir.logs_dir().join("lockstepd.log")).unwrap_or_default())
}

/// Each machine agent's last lines, for a failure's message.
fn agent_logs(controller: &Controller) -> String {
    controller
        .data()
        .machine_agent_dirs()
        .iter()
        .map(|dir| {
            let log = agent_log(dir);
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {}:\n{}", dir.root().display(), tail.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the agents of machines `ids` report `started` on `version`; that status.
async fn wait_for_agents(controller: &Controller, ids: &[String], version: Version) -> Value {
    let deadline = Instant::now() + AGENTS_WITHIN;
    loop {
        let status = status(controller);
        let on_version = ids
            .iter()
            .filter(|id| {
                let agent = &status["machines"][id.as_str()]["agent-status"];
                agent["status"] == "started" && agent["version"] == version.to_string()
            })
            .count();
        if on_version == ids.len() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{on_version} of {} machine agents started on {version} within {AGENTS_WITHIN:?}:\n\
             {status:#}\nagents:\n{}",
            ids.len(),
            agent_logs(controller)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The store's revision and its machines, read in one snapshot (SQLite, read-only).
fn stored_machines(data: &DataDir) -> (Revision, BTreeMap<String, Machine>) {
    let store =
        lockstep_store::SqliteStore::open(data.store_path(), lockstep_store::OpenMode::ReadOnly)
            .expect("open the store read-only");
    let mut read = (Revision(0), BTreeMap::new());
    store
        .snapshot(&mut |tx| {
            let machines = tx.machines()?;
            read = (
                tx.revision()?,
                machines
                    .into_iter()
                    .map(|machine| (machine.id.clone(), machine))
                    .collect(),
            );
            Ok(())
        })
        .expect("a snapshot of the store");
    read
}

/// Asserts that, since `before` was read at `after`, no machine was written except for the
/// binary its agent reports running (`Upgrader.SetTools`, and the controllers' own in the
/// `record-agent-binaries` step): no machine's roles, legacy jobs or life changed, no
/// machine was added or removed. Returns how many machine events there were, and the model's
/// events.
fn assert_no_machine_write_but_binaries(
    data: &DataDir,
    after: Revision,
    before: &BTreeMap<String, Machine>,
) -> (usize, Vec<Value>) {
    let store =
        lockstep_store::SqliteStore::open(data.store_path(), lockstep_store::OpenMode::ReadOnly)
            .expect("open the store read-only");
    let Changes::Events { events, .. } = store
        .changes_since(after, 1_000_000)
        .expect("the event log")
    else {
        panic!("the event log was compacted");
    };
    let mut machine_events = 0;
    let mut model_events = Vec::new();
    for event in events {
        match event.kind {
            EntityKind::Machine => {
                machine_events += 1;
                assert_eq!(
                    event.change,
                    lockstep_store::ChangeKind::Change,
                    "machine {} removed: {event:?}",
                    event.id
                );
                let was = before
                    .get(&event.id)
                    .unwrap_or_else(|| panic!("machine {} added: {event:?}", event.id));
                let now: Machine =
                    serde_json::from_value(event.entity.clone()).expect("a machine document");
                assert_eq!(
                    Machine {
                        agent_binary: was.agent_binary.clone(),
                        ..now.clone()
                    },
                    *was,
                    "machine {} written with more than its reported binary at revision {:?}",
                    event.id,
                    event.revision
                );
            }
            EntityKind::Model => model_events.push(event.entity),
            _ => {}
        }
    }
    (machine_events, model_events)
}

/// Asserts that the agent in `dir` started on `version` and then read `expected` as its
/// jobs (`jobs read`, logged after each start from `Agent.GetEntities`).
fn assert_reread_jobs(dir: &DataDir, version: Version, expected: &[&str]) {
    let log = agent_log(dir);
    let lines: Vec<&str> = log.lines().collect();
    let running = format!("running={}", host_binary(version));
    let started = lines
        .iter()
        .rposition(|line| line.contains("machine agent started") && line.contains(&running))
        .unwrap_or_else(|| {
            panic!(
                "{} never started on {version}:\n{log}",
                dir.root().display()
            )
        });
    let read = lines[started..]
        .iter()
        .find(|line| line.contains("jobs read"))
        .unwrap_or_else(|| {
            panic!(
                "{} did not read its jobs after starting on {version}:\n{log}",
                dir.root().display()
            )
        });
    let quoted: Vec<String> = expected.iter().map(|job| format!("{job:?}")).collect();
    let jobs = format!("jobs=[{}]", quoted.join(", "));
    assert!(
        read.contains(&jobs),
        "{} read other jobs than {jobs} on {version}: {read}",
        dir.root().display()
    );
}

/// The controller's `capabilities reported` line of the refresh at the end of the upgrade
/// to `by` (or its bootstrap, on the version it bootstrapped).
fn capabilities_reported(controller: &Controller, by: Version) -> String {
    let log = controller.log();
    log.lines()
        .rev()
        .find(|line| line.contains("capabilities reported") && line.contains(&format!("by={by}")))
        .unwrap_or_else(|| panic!("no capabilities reported by {by}:\n{log}"))
        .to_owned()
}

fn write_capabilities(file: &Path, list: &str) {
    std::fs::write(file, list).expect("write the capabilities file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_rediscovered_at_the_end_of_each_upgrade_change_every_machine_s_jobs_without_writing_a_machine()
 {
    let (n1, n2) = (later_patch(1), later_patch(2));
    let mirror = Mirror::new(&[
        (own(), Published::Lockstepd),
        (n1, Published::Lockstepd),
        (n2, Published::Lockstepd),
    ]);
    let (source, key) = (mirror.source(), mirror.key());
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("capabilities");
    write_capabilities(&file, "");
    let file_text = file.to_str().unwrap();
    let controller = Controller::bootstrap(
        &["--metadata-source", &source, "--metadata-key", &key],
        &[("LOCKSTEPD_CAPABILITIES_FILE", file_text)],
    );
    controller.assert_bootstrapped();
    let log = controller.log();
    assert!(
        log.contains(&format!(
            "capabilities: --capabilities-file: read from {file_text} at every refresh"
        )),
        "{log}"
    );
    let reported = capabilities_reported(&controller, own());
    assert!(
        reported.contains(&format!("reason=read from capabilities file {file_text}"))
            && !reported.contains("manage-"),
        "{reported}"
    );

    let add = controller.run(&["add-machine", "-n", "2"]);
    assert!(add.status.success(), "{}", text(&add));
    let agents = agent_ids(&controller);
    assert_eq!(agents.len(), 2, "{agents:?}");
    wait_for_agents(&controller, &agents, own()).await;
    // A machine as an older version stored it, with jobs and no roles: it stays legacy
    // (the step that migrates legacy machines ran long before), and is reported by the
    // legacy rule. It has no agent.
    {
        let store = lockstep_store::SqliteStore::open(
            controller.data().store_path(),
            lockstep_store::OpenMode::ReadWrite,
        )
        .expect("open the store");
        let legacy = Machine {
            id: LEGACY.to_owned(),
            roles: Roles::NONE,
            legacy_jobs: vec![Job::HOST_UNITS, Job::new("JobRunCharms").unwrap()],
            agent_binary: None,
            life: Life::Alive,
        };
        assert!(store.add_machine(&legacy).expect("store a legacy machine"));
    }

    // The environment has no capabilities: only the roles' own jobs.
    let status_before = status(&controller);
    let (revision_before, machines_before) = stored_machines(&controller.data());
    assert_eq!(
        jobs(&status_before, "0"),
        json!(["JobManageModel"]),
        "{status_before:#}"
    );
    for id in &agents {
        assert_eq!(
            jobs(&status_before, id),
            json!(["JobHostUnits"]),
            "{status_before:#}"
        );
    }
    assert_eq!(
        jobs(&status_before, LEGACY),
        json!(["JobHostUnits", "JobRunCharms"]),
        "{status_before:#}"
    );

    // N+1's provider finds manage-firewall and manage-networking.
    write_capabilities(&file, "manage-firewall, manage-networking\n");
    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &n1.to_string()]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(n1, READY_WITHIN).await;
    let status_after = wait_for_agents(&controller, &agents, n1).await;
    assert_eq!(
        jobs(&status_after, "0"),
        json!(["JobManageModel", "JobManageFirewall"]),
        "{status_after:#}"
    );
    for id in &agents {
        assert_eq!(
            jobs(&status_after, id),
            json!(["JobHostUnits", "JobManageNetworking"]),
            "{status_after:#}"
        );
    }
    assert_eq!(
        jobs(&status_after, LEGACY),
        json!(["JobHostUnits", "JobRunCharms", "JobManageNetworking"]),
        "{status_after:#}"
    );
    let (revision_after, machines_after) = stored_machines(&controller.data());
    let (machine_events, model_events) =
        assert_no_machine_write_but_binaries(&controller.data(), revision_before, &machines_before);
    // The check saw machine writes: the binaries reported, the controller's own and each
    // agent's (`Upgrader.SetTools` once back on N+1).
    assert!(
        machine_events > agents.len(),
        "{machine_events} machine events for a controller and {} agents",
        agents.len()
    );
    // The capabilities were written to the model once, by N+1's provider.
    let discovered: Vec<&Value> = model_events
        .iter()
        .filter(|model| model["capabilities"] == json!(["manage-firewall", "manage-networking"]))
        .collect();
    assert_eq!(discovered.len(), 1, "{model_events:#?}");
    assert_eq!(
        discovered[0]["capabilities-discovered"]["by"],
        n1.to_string(),
        "{model_events:#?}"
    );
    let reported = capabilities_reported(&controller, n1);
    assert!(
        reported.contains("capabilities=manage-firewall,manage-networking"),
        "{reported}"
    );
    // Each agent came back on N+1 and reread its jobs: the new set.
    for dir in controller.data().machine_agent_dirs() {
        assert_reread_jobs(&dir, n1, &["JobHostUnits", "JobManageNetworking"]);
    }

    // N+2's provider finds none: every job that followed from a capability is gone.
    write_capabilities(&file, "");
    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &n2.to_string()]);
    assert!(upgrade.status.success(), "{}", text(&upgrade));
    controller.wait_running(n2, READY_WITHIN).await;
    let status_gone = wait_for_agents(&controller, &agents, n2).await;
    assert_eq!(
        jobs(&status_gone, "0"),
        json!(["JobManageModel"]),
        "{status_gone:#}"
    );
    for id in &agents {
        assert_eq!(
            jobs(&status_gone, id),
            json!(["JobHostUnits"]),
            "{status_gone:#}"
        );
    }
    assert_eq!(
        jobs(&status_gone, LEGACY),
        json!(["JobHostUnits", "JobRunCharms"]),
        "{status_gone:#}"
    );
    assert_no_machine_write_but_binaries(&controller.data(), revision_after, &machines_after);
    let reported = capabilities_reported(&controller, n2);
    assert!(!reported.contains("manage-"), "{reported}");
    let (_, machines_end) = stored_machines(&controller.data());
    assert_eq!(machines_end[LEGACY], machines_before[LEGACY]);
    for id in &agents {
        assert_eq!(machines_end[id].roles, machines_before[id].roles);
        assert!(machines_end[id].legacy_jobs.is_empty());
    }
    // Each agent came back on N+2 and reread its jobs: the capability's job is gone.
    for dir in controller.data().machine_agent_dirs() {
        assert_reread_jobs(&dir, n2, &["JobHostUnits"]);
    }
}

/// The model's capabilities as stored, and the version that discovered them.
fn stored_capabilities(data: &DataDir) -> (Vec<String>, Option<Version>) {
    let store =
        lockstep_store::SqliteStore::open(data.store_path(), lockstep_store::OpenMode::ReadOnly)
            .expect("open the store read-only");
    let model = store.load_model().unwrap().expect("a model");
    (
        model
            .capabilities
            .iter()
            .map(|capability| capability.as_str().to_owned())
            .collect(),
        model.capabilities_discovered.map(|found| found.by),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_interrogates_its_host_unless_capabilities_overrides_it() {
    use lockstep_agent::daemon::capabilities::{HostProvider, ThisHost};
    use lockstep_store::seed004::EnvironProvider;

    // No flag: the host, as this process (the same user, PATH and capabilities) sees it.
    let expected = HostProvider::new(ThisHost).report().unwrap();
    let controller = Controller::bootstrap(&[], &[]);
    controller.assert_bootstrapped();
    let log = controller.log();
    assert!(
        log.contains("capabilities: interrogating this host at every refresh"),
        "{log}"
    );
    let reported = capabilities_reported(&controller, own());
    assert!(
        reported.contains(&format!("reason={}", expected.reason)),
        "{reported}\nexpected: {}",
        expected.reason
    );
    let listed: Vec<String> = expected
        .capabilities
        .iter()
        .map(|capability| capability.as_str().to_owned())
        .collect();
    assert_eq!(
        stored_capabilities(&controller.data()),
        (listed, Some(own()))
    );
    drop(controller);

    // `--capabilities` (here through its environment variable): what it says is what the
    // provider reports, logged as an override at start.
    let controller = Controller::bootstrap(&[], &[("LOCKSTEPD_CAPABILITIES", "manage-networking")]);
    controller.assert_bootstrapped();
    let log = controller.log();
    assert!(
        log.contains(
            "capabilities: --capabilities overrides the host's interrogation: the provider \
             reports exactly [manage-networking]"
        ),
        "{log}"
    );
    let reported = capabilities_reported(&controller, own());
    assert!(
        reported.contains("capabilities=manage-networking")
            && reported.contains("reason=--capabilities overrides the host's interrogation"),
        "{reported}"
    );
    assert_eq!(
        stored_capabilities(&controller.data()),
        (vec!["manage-networking".to_owned()], Some(own()))
    );
    drop(controller);

    // A bad value is refused at start, naming it.
    let controller = Controller::bootstrap(
        &["--timeout", "20"],
        &[("LOCKSTEPD_CAPABILITIES", "manage-firewall,Open_Ports")],
    );
    assert!(
        !controller.bootstrap.status.success(),
        "{}",
        text(&controller.bootstrap)
    );
    let log = controller.log();
    assert!(
        log.contains("\"Open_Ports\""),
        "{log}\n{}",
        text(&controller.bootstrap)
    );
}
