//! Signed metadata by default (issue 18, item 1), against real `lockstep bootstrap` and
//! `lockstepd` processes on 127.0.0.1: a controller installs and upgrades only to binaries
//! whose metadata is signed by the key the operator pinned at bootstrap (`--metadata-key`),
//! or, when the operator said so (`--allow-unsigned-metadata`), unsigned metadata.
//!
//! The attacks: a mirror (or whoever sits between it and the controller) that announces a
//! new patch with its own tarball and digest, stripping the signatures or signing with its
//! own key; unsigned metadata offered to a controller that pinned a key; and whoever can
//! write the shared store pointing `agent-metadata-url` at a mirror signed by another key.
//! Each test asserts the reason given, that nothing was installed under `tools/`, and that
//! the attacker's binary never ran. Without the defense (lookups that allow unsigned
//! metadata and trust no key, as before) each of them installs the attacker's binary.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::http_mirror::HttpMirror;
use common::{Controller, Mirror, Published, next, own, text};
use lockstep_agent::datadir::{self, DataDir};
use lockstep_streams::SigningKey;
use serde_json::json;

const READY_WITHIN: Duration = Duration::from_secs(120);

/// Entries under `<data>/tools/` (binary directories and agent links).
fn tools_entries(data: &DataDir) -> Vec<String> {
    match std::fs::read_dir(data.tools_dir()) {
        Ok(entries) => entries
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The attacker takes the mirror over: a tarball of its own published as N+1 (a script that
/// leaves `marker` behind if it ever runs), the metadata regenerated with its digest, and
/// the signatures either stripped (`None`: the `.sjson` documents removed, so only the
/// attacker's unsigned `.json` is left) or made with the attacker's own key.
fn swap_in_the_attackers_binary(mirror: &Path, marker: &Path, key: Option<&SigningKey>) {
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("lockstepd");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch {}\nexec sleep 600\n", marker.display()),
    )
    .unwrap();
    let released = mirror.join("tools/released");
    lockstep_agent::unpack::pack_tgz(
        &[("lockstepd", script.as_path(), 0o755)],
        &released.join(format!("juju-{}.tgz", datadir::host_binary(next()))),
    )
    .unwrap();
    lockstep_agent::cli::demo::generate(mirror, key).unwrap();
    if key.is_none() {
        for entry in std::fs::read_dir(mirror.join("tools/streams/v1")).unwrap() {
            let path = entry.unwrap().path();
            if path
                .extension()
                .is_some_and(|extension| extension == "sjson")
            {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
}

/// The controller still runs N, installed nothing for N+1 (no binary directory, no cached
/// tarball), never ran the attacker's binary (no `marker`, when the binary leaves one), and
/// reports the refusal in `Upgrade.Status`
/// (`last-failure`) and its log, with every text of `reasons`.
async fn assert_refused_and_reported(
    controller: &Controller,
    marker: Option<&Path>,
    reasons: &[&str],
) {
    let data = controller.data();
    let attackers = datadir::host_binary(next());
    assert!(
        !controller.binary_dir(next()).exists(),
        "the attacker's binary was installed: {:?}",
        tools_entries(&data)
    );
    assert!(
        !data.cached_tarball_path(&attackers).exists(),
        "the attacker's tarball was downloaded"
    );
    assert!(
        !marker.is_some_and(Path::exists),
        "the attacker's binary ran"
    );
    let exe = controller.serving_exe().expect("a worker runs");
    assert!(exe.starts_with(controller.binary_dir(own())), "{exe:?}");
    let status = controller.status().await;
    assert_eq!(status["agent-version"], own().to_string(), "{status:#}");
    let failure = status["last-failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains("agent binary metadata refused"),
        "{status:#}"
    );
    let log = controller.log();
    for reason in reasons {
        assert!(failure.contains(reason), "{reason:?} in {status:#}");
        assert!(log.contains(reason), "{reason:?} in the log:\n{log}");
    }
    let full = controller.full_status().await;
    assert_eq!(full["model"]["version"], own().to_string(), "{full:#}");
}

/// Restarts the controller (stop by pid, start again) so that it checks the catalogue at
/// start (`checking-agent-version`, policy `--auto-upgrade`), and waits until it is Ready.
async fn restart(controller: &Controller) {
    controller.stop();
    controller.start(&[]);
    controller.wait_ready(READY_WITHIN).await;
}

/// (a) A mirror, served over HTTP, that announces N+1 with its own tarball and digest: with
/// its signatures stripped, then signed with its own key. The running controller refuses
/// each at its lookup and installs nothing; `upgrade-controller` names the reason; and a
/// new `bootstrap --auto-upgrade` against it fails before starting anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_swapping_in_its_own_binary_and_digest_is_refused_and_nothing_is_installed() {
    let mirror = Mirror::new(&[(own(), Published::Lockstepd)]);
    let pinned = mirror.key.as_ref().unwrap().fingerprint();
    let served = HttpMirror::serve(mirror.path(), Duration::ZERO);
    let source = served.tools_url();
    let key = mirror.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
    );
    controller.assert_bootstrapped();
    // The key is in the data dir (0600) and pinned in agent.conf; status shows it.
    let data = controller.data();
    let conf = data.read_agent_conf().unwrap().unwrap();
    assert_eq!(conf.metadata_key_fingerprints, vec![pinned.clone()]);
    assert_eq!(
        conf.metadata_keyring.as_deref(),
        Some(data.metadata_keys_path().as_path())
    );
    assert!(!conf.allow_unsigned_metadata);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.metadata_keys_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let status = controller.run(&["status"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&format!("signed (key {pinned})")),
        "{}",
        text(&status)
    );

    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("the-attackers-binary-ran");

    // Signatures stripped: only the attacker's unsigned metadata is left. The check at
    // start refuses it, and so does the operator's upgrade to the patch it announces.
    swap_in_the_attackers_binary(mirror.path(), &marker, None);
    restart(&controller).await;
    let reasons = ["no clear-signed .sjson document", pinned.as_str()];
    assert_refused_and_reported(&controller, Some(&marker), &reasons).await;
    let target = next().to_string();
    let upgrade = controller.run(&["upgrade-controller", "--agent-version", &target]);
    assert!(!upgrade.status.success(), "{}", text(&upgrade));
    for reason in reasons {
        assert!(
            String::from_utf8_lossy(&upgrade.stderr).contains(reason),
            "{reason:?}: {}",
            text(&upgrade)
        );
    }
    assert_refused_and_reported(&controller, Some(&marker), &reasons).await;

    // Signed again, with the attacker's own key.
    let attacker = SigningKey::generate("attacker <attacker@example.invalid>").unwrap();
    swap_in_the_attackers_binary(mirror.path(), &marker, Some(&attacker));
    restart(&controller).await;
    assert_refused_and_reported(
        &controller,
        Some(&marker),
        &["no signature verifies against the configured keys", &pinned],
    )
    .await;
    // The API's lookup refuses it too: upgrade-controller says why instead of "no upgrades".
    let upgrade = controller.run(&["upgrade-controller"]);
    assert!(!upgrade.status.success(), "{}", text(&upgrade));
    let said = String::from_utf8_lossy(&upgrade.stderr);
    assert!(
        said.contains("no signature verifies") && said.contains(&pinned),
        "{}",
        text(&upgrade)
    );
    assert!(!controller.binary_dir(next()).exists());

    // A new controller bootstrapped against the mirror now: refused before anything starts.
    let fresh = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
    );
    assert!(
        !fresh.bootstrap.status.success(),
        "{}",
        text(&fresh.bootstrap)
    );
    let said = String::from_utf8_lossy(&fresh.bootstrap.stderr);
    for reason in [
        source.as_str(),
        "no signature verifies against the configured keys",
        &pinned,
        "--metadata-key",
    ] {
        assert!(
            said.contains(reason),
            "{reason:?}: {}",
            text(&fresh.bootstrap)
        );
    }
    assert_eq!(tools_entries(&fresh.data()), Vec::<String>::new());
    assert!(!fresh.data().pid_path().exists(), "nothing was started");
    assert!(fresh.data().read_agent_conf().unwrap().is_none());
    assert!(!marker.exists(), "the attacker's binary ran");
}

/// (b) Unsigned metadata: refused when a key is pinned, naming the file, the mirror and the
/// key; refused before anything is written when neither flag is given, naming both; and
/// accepted with `--allow-unsigned-metadata`, which `agent.conf` records, every worker start
/// warns about, and `lockstep status` shows in every format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_metadata_is_refused_unless_allowed_and_the_allowance_is_recorded_logged_and_shown()
 {
    let mirror = Mirror::unsigned(&[
        (own(), Published::Lockstepd),
        (next(), Published::Lockstepd),
    ]);
    let source = mirror.source();
    let key = mirror.key();
    let fingerprint = fingerprint_of(&mirror.public_key);

    let refused = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
    );
    assert!(
        !refused.bootstrap.status.success(),
        "{}",
        text(&refused.bootstrap)
    );
    let said = String::from_utf8_lossy(&refused.bootstrap.stderr);
    for reason in [
        source.as_str(),
        "streams/v1/index2.json",
        "(unsigned)",
        "unsigned metadata is refused",
        &fingerprint,
        "--allow-unsigned-metadata",
    ] {
        assert!(
            said.contains(reason),
            "{reason:?}: {}",
            text(&refused.bootstrap)
        );
    }
    assert_eq!(tools_entries(&refused.data()), Vec::<String>::new());
    assert!(!refused.data().pid_path().exists(), "nothing was started");

    let neither = Controller::bootstrap(&["--metadata-source", &source], &[]);
    assert!(
        !neither.bootstrap.status.success(),
        "{}",
        text(&neither.bootstrap)
    );
    let said = String::from_utf8_lossy(&neither.bootstrap.stderr);
    assert!(
        said.contains("--metadata-key FILE") && said.contains("--allow-unsigned-metadata"),
        "{}",
        text(&neither.bootstrap)
    );
    assert!(!neither.data_dir.exists(), "nothing was written");

    let allowed = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--allow-unsigned-metadata",
        ],
        &[],
    );
    allowed.assert_bootstrapped();
    // Accepted: bootstrap installed N and the controller upgraded itself to N+1.
    allowed.wait_running(next(), READY_WITHIN).await;
    let conf = allowed.data().read_agent_conf().unwrap().unwrap();
    assert!(conf.allow_unsigned_metadata, "{conf:?}");
    assert_eq!(conf.metadata_keyring, None);
    // Warned at every worker start: N's, and N+1's after the re-exec.
    let warnings = allowed
        .log()
        .matches("unsigned agent-binary metadata is accepted")
        .count();
    assert!(warnings >= 2, "{warnings} warnings:\n{}", allowed.log());
    for format in ["tabular", "json", "yaml"] {
        let status = allowed.run(&["status", "--format", format]);
        assert!(status.status.success(), "{}", text(&status));
        assert!(
            String::from_utf8_lossy(&status.stdout).contains("unsigned-allowed"),
            "{format}: {}",
            text(&status)
        );
    }
}

/// (c) The key is never taken from the shared store or the API: `ModelSet` cannot change
/// `agent-metadata-url`, and whoever writes the store directly (as anyone who can write to
/// etcd could) to point it at a mirror signed by another key, offering N+1, has it refused
/// at the lookup, naming the pinned key; nothing is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_metadata_url_pointed_at_a_mirror_signed_by_another_key_is_refused_at_lookup() {
    let genuine = Mirror::new(&[(own(), Published::Lockstepd)]);
    let pinned = genuine.key.as_ref().unwrap().fingerprint();
    let attacker = Mirror::new(&[
        (own(), Published::Lockstepd),
        (next(), Published::Script("#!/bin/sh\nexec sleep 600\n")),
    ]);
    let attackers_key = attacker.key.as_ref().unwrap().fingerprint();
    let attackers_url = attacker.path().join("tools").display().to_string();
    let source = genuine.source();
    let key = genuine.key();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
        ],
        &[],
    );
    controller.assert_bootstrapped();

    // Through the API: refused, the url is chosen at bootstrap.
    let set = controller
        .client()
        .call(
            "ModelConfig",
            3,
            "ModelSet",
            json!({"config": {"agent-metadata-url": attackers_url}}),
            Duration::from_secs(30),
        )
        .await;
    let error = set.expect_err("ModelSet agent-metadata-url is refused");
    assert!(error.to_string().contains("chosen at bootstrap"), "{error}");

    // Straight into the store, as whoever can write it could.
    controller.stop();
    {
        use lockstep_store::Store;
        let store = lockstep_store::SqliteStore::open(
            controller.data().store_path(),
            lockstep_store::OpenMode::ReadWrite,
        )
        .unwrap();
        let url = attackers_url.clone();
        store
            .update_model(&mut |_, model| {
                model.agent_metadata_url = Some(url.clone());
                Ok(())
            })
            .unwrap();
    }
    controller.start(&[]);
    controller.wait_ready(READY_WITHIN).await;
    assert_refused_and_reported(
        &controller,
        None,
        &[
            &attackers_url,
            "no signature verifies against the configured keys",
            &pinned,
        ],
    )
    .await;
    // The pinned key is unchanged, and the attacker's appears nowhere as trusted.
    let conf = controller.data().read_agent_conf().unwrap().unwrap();
    assert_eq!(conf.metadata_key_fingerprints, vec![pinned.clone()]);
    let keys = std::fs::read(controller.data().metadata_keys_path()).unwrap();
    let keyring = lockstep_streams::Keyring::from_bytes(&keys).unwrap();
    assert_eq!(keyring.fingerprints(), vec![pinned]);
    assert_ne!(attackers_key, keyring.fingerprints()[0]);
    for upgrade in [
        vec!["upgrade-controller", "--dry-run"],
        vec!["upgrade-controller", "--agent-version", &next().to_string()],
    ] {
        let upgrade = controller.run(&upgrade);
        assert!(!upgrade.status.success(), "{}", text(&upgrade));
        assert!(
            String::from_utf8_lossy(&upgrade.stderr).contains("no signature verifies"),
            "{}",
            text(&upgrade)
        );
    }
    assert!(!controller.binary_dir(next()).exists());
}

/// The fingerprint of the (one) public key in a file.
fn fingerprint_of(path: &Path) -> String {
    datadir::read_keyring(path)
        .unwrap()
        .fingerprints()
        .remove(0)
}
