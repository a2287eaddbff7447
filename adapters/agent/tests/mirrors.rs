//! Mirrors as users run them, against real `lockstep bootstrap` and `lockstepd` processes on
//! 127.0.0.1 (issue 18, items 2 and 4):
//!
//! - an `https://` mirror with its own certificate authority is refused until the operator
//!   names the CA (`--metadata-ca`, pinned in `agent.conf` and used by the daemon too), or
//!   the system's trust store holds it (`SSL_CERT_FILE`);
//! - over plain `http://` only signed metadata is accepted, `--allow-unsigned-metadata` or
//!   not;
//! - an `https://` mirror's redirect to another host is refused, naming it, until the
//!   operator allows it (`--allow-metadata-redirects`, pinned in `agent.conf` and shown by
//!   status);
//! - a mirror that stops answering (blackholed) does not stall the API: `FindTools`,
//!   `ModelSet agent-version` and the tools endpoint answer from the last good catalogue, or,
//!   when there is none, say the lookup is still running, within a bound far below the
//!   mirror's own timeouts;
//! - a Ready controller restarted while its mirror hangs is Ready again without checking
//!   its version, and reports `upgrade-available` from Ready once the mirror answers.

use crate::common;

use std::time::{Duration, Instant};

use common::http_mirror::{HoldBack, HttpMirror, TestCa};
use common::{Controller, Mirror, Published, basic, next, own, text};
use serde_json::{Value, json};

const READY_WITHIN: Duration = Duration::from_secs(180);

/// Far below what a blackholed mirror costs a caller that waits for it (the HTTP source's
/// 30 s throughput window, then retries), far above the API's own wait for a lookup (2 s).
const ANSWERED_WITHIN: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_mirror_with_its_own_ca_is_refused_until_metadata_ca_names_it_and_the_daemon_trusts_it_too()
 {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let ca = TestCa::new();
    let served = HttpMirror::serve_tls(mirror.path(), &ca, HoldBack::Nothing);
    let source = served.tools_url();
    assert!(source.starts_with("https://127.0.0.1:"), "{source}");
    let ca_file = mirror.path().join("mirror-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let key = mirror.key();

    let refused =
        Controller::bootstrap(&["--metadata-source", &source, "--metadata-key", &key], &[]);
    assert!(
        !refused.bootstrap.status.success(),
        "{}",
        text(&refused.bootstrap)
    );
    let said = String::from_utf8_lossy(&refused.bootstrap.stderr);
    assert!(
        said.contains(&source) && said.contains("UnknownIssuer"),
        "{}",
        text(&refused.bootstrap)
    );
    assert!(!refused.data().pid_path().exists(), "nothing was started");

    // Named: bootstrap installs N from the mirror, and the daemon, reading the CA pinned in
    // agent.conf, upgrades itself from it to N+1.
    let trusted = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--no-fetch-ahead",
            "--metadata-source",
            &source,
            "--metadata-key",
            &key,
            "--metadata-ca",
            ca_file.to_str().unwrap(),
        ],
        &[],
    );
    trusted.assert_bootstrapped();
    trusted.wait_running(next(), READY_WITHIN).await;
    let data = trusted.data();
    let conf = data.read_agent_conf().unwrap().unwrap();
    assert_eq!(conf.metadata_ca, Some(data.metadata_ca_path()), "{conf:?}");
    assert_eq!(
        std::fs::read_to_string(data.metadata_ca_path()).unwrap(),
        ca.pem
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.metadata_ca_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_mirror_whose_ca_is_in_the_system_trust_store_through_ssl_cert_file_is_trusted() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let ca = TestCa::new();
    let served = HttpMirror::serve_tls(mirror.path(), &ca, HoldBack::Nothing);
    let source = served.tools_url();
    let bundle = mirror.path().join("system-bundle.pem");
    std::fs::write(&bundle, &ca.pem).unwrap();
    let controller = Controller::bootstrap(
        &[
            "--auto-upgrade",
            "--no-fetch-ahead",
            "--metadata-source",
            &source,
            "--metadata-key",
            &mirror.key(),
        ],
        &[("SSL_CERT_FILE", bundle.to_str().unwrap())],
    );
    controller.assert_bootstrapped();
    // The daemon bootstrap started inherited SSL_CERT_FILE, as a unit's Environment= would
    // give it: it reads N+1 from the mirror too.
    controller.wait_running(next(), READY_WITHIN).await;
    assert_eq!(
        controller
            .data()
            .read_agent_conf()
            .unwrap()
            .unwrap()
            .metadata_ca,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_plain_http_unsigned_metadata_is_refused_even_with_allow_unsigned_metadata() {
    let mirror = Mirror::unsigned(&[(own(), Published::Lockstepd)]);
    let served = HttpMirror::serve(mirror.path(), Duration::ZERO);
    let source = served.tools_url();
    let refused = Controller::bootstrap(
        &["--metadata-source", &source, "--allow-unsigned-metadata"],
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
        "over plain http only signed metadata is accepted",
        "--metadata-key FILE",
        "https",
    ] {
        assert!(
            said.contains(reason),
            "{reason:?}: {}",
            text(&refused.bootstrap)
        );
    }
    assert!(!refused.data_dir.exists(), "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_mirror_redirecting_to_another_host_is_refused_until_allow_metadata_redirects() {
    let mirror = Mirror::n_and_next(Published::Lockstepd);
    let ca = TestCa::new();
    // The files at https://localhost:<port>; the mirror the operator names, at
    // https://127.0.0.1:<other port>, redirects every request there: another host name.
    let files = HttpMirror::serve_tls(mirror.path(), &ca, HoldBack::Nothing);
    let elsewhere = format!("https://localhost:{}", files.port());
    let front = HttpMirror::redirect_tls(&ca, &elsewhere);
    let source = front.tools_url();
    let ca_file = mirror.path().join("mirror-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let (key, ca_path) = (mirror.key(), ca_file.to_str().unwrap().to_owned());
    let args = [
        "--metadata-source",
        &source,
        "--metadata-key",
        &key,
        "--metadata-ca",
        &ca_path,
    ];

    let refused = Controller::bootstrap(&args, &[]);
    let said = text(&refused.bootstrap);
    assert!(!refused.bootstrap.status.success(), "{said}");
    assert!(
        said.contains(&format!("to {elsewhere}/tools/"))
            && said.contains("redirects are followed only on the mirror's own host")
            && said.contains("--allow-metadata-redirects"),
        "{said}"
    );
    assert!(!refused.data().pid_path().exists(), "nothing was started");

    let mut allowed = args.to_vec();
    allowed.extend(["--allow-metadata-redirects", "--auto-upgrade"]);
    let trusted = Controller::bootstrap(&allowed, &[]);
    trusted.assert_bootstrapped();
    // The daemon follows it too: it found N+1 through the redirect and upgraded to it.
    trusted.wait_running(next(), READY_WITHIN).await;
    let conf = trusted.data().read_agent_conf().unwrap().unwrap();
    assert!(conf.allow_metadata_redirects, "{conf:?}");
    let status = trusted.full_status().await;
    let verification = status["machines"]["0"]["lockstep"]["metadata-verification"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        verification.ends_with("; redirects to other hosts followed"),
        "{verification}"
    );
    assert!(
        trusted
            .log()
            .contains("redirects are followed to other hosts"),
        "{}",
        trusted.log()
    );
}

/// `Client.FindTools` for every version, and how long it took.
async fn find_tools(controller: &Controller) -> (Value, Duration) {
    let started = Instant::now();
    let found = controller
        .client()
        .call(
            "Client",
            1,
            "FindTools",
            json!({}),
            Duration::from_secs(120),
        )
        .await
        .expect("FindTools answers");
    (found, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_mirror_leaves_find_tools_model_set_and_the_tools_endpoint_answering() {
    let (_mirror, served, controller) = ready_behind_a_mirror_that_can_hang().await;
    let (found, _) = find_tools(&controller).await;
    let listed = found["list"].as_array().map_or(0, Vec::len);
    assert!(listed >= 2, "N and N+1 listed: {found}");

    // The mirror stops answering metadata. Once the API's catalogue is stale, each call is
    // answered from it at once while one refresh hangs on the mirror.
    served.blackhole_metadata();
    tokio::time::sleep(lockstep_agent::daemon::catalogue::FRESH_FOR + Duration::from_secs(1)).await;
    for _ in 0..3 {
        let (again, took) = find_tools(&controller).await;
        assert_eq!(
            again["list"], found["list"],
            "the last good catalogue: {again}"
        );
        assert!(took < ANSWERED_WITHIN, "FindTools took {took:?}");
    }
    assert!(
        served.held() >= 1,
        "the refresh reached the blackholed mirror"
    );
    let started = Instant::now();
    let refused = controller
        .client()
        .call(
            "ModelConfig",
            3,
            "ModelSet",
            json!({"config": {"agent-version": "2.9.999"}}),
            Duration::from_secs(120),
        )
        .await
        .expect_err("no binary of 2.9.999 is published");
    assert!(
        started.elapsed() < ANSWERED_WITHIN,
        "ModelSet took {:?}",
        started.elapsed()
    );
    assert!(
        refused.to_string().contains("no agent binaries found"),
        "{refused}"
    );
    let file = controller.controller_file();
    let binary = lockstep_agent::datadir::host_binary(own());
    let started = Instant::now();
    let (status, body) = controller
        .https_get(
            &format!("/model/{}/tools/{binary}", file.model_uuid),
            Some(basic("user-admin", &file.password)),
        )
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        started.elapsed() < ANSWERED_WITHIN,
        "the tools endpoint took {:?}",
        started.elapsed()
    );

    // Restarted while the mirror is still blackholed, the controller has no catalogue to
    // serve: the first call waits at most the API's bound and says the lookup is running;
    // the next is answered at once, the same way.
    controller.stop();
    controller.start(&[]);
    for _ in 0..2 {
        let (answer, took) = find_tools(&controller).await;
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("still being looked up"), "{answer}");
        assert!(took < ANSWERED_WITHIN, "FindTools took {took:?}");
    }
    // Released, the mirror answers and the catalogue is served again.
    served.release();
    let started = Instant::now();
    loop {
        let (answer, _) = find_tools(&controller).await;
        if answer["list"] == found["list"] {
            break;
        }
        assert!(
            started.elapsed() < READY_WITHIN,
            "the catalogue never came back: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Ready controller restarted while its mirror hangs is Ready again without waiting for
/// the mirror: after bootstrap, on the model's agent-version, its version check could only
/// stay (spec/lifecycle.md, "Rules"), so it does not enter `checking-agent-version`; the
/// lookup that reports `upgrade-available` is made from Ready. Before, it waited in
/// `checking-agent-version` for three lookups, each failing only after the HTTP source's
/// throughput windows and retries (minutes, beyond `READY_WITHIN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_while_its_mirror_hangs_is_ready_without_checking_its_version() {
    let (_mirror, served, controller) = ready_behind_a_mirror_that_can_hang().await;
    let status = controller.status().await;
    assert_eq!(
        status["upgrade-available"],
        next().to_string(),
        "{status:#}"
    );
    let first_boot = controller.log();
    assert!(
        first_boot.contains("gate phase=\"checking-agent-version\""),
        "bootstrap checks its version:\n{first_boot}"
    );

    served.blackhole_metadata();
    controller.stop();
    let before = controller.log().len();
    controller.start(&[]);
    controller.wait_ready(READY_WITHIN).await;
    let log = controller.log();
    let restarted = log.get(before..).expect("the log is appended to");
    assert!(
        restarted.contains("gate phase=\"ready\""),
        "Ready after the restart:\n{restarted}"
    );
    assert!(
        !restarted.contains("gate phase=\"checking-agent-version\""),
        "the restarted controller checked its version:\n{restarted}"
    );
    assert!(
        !restarted.contains("catalogue lookup failed"),
        "Ready only once its lookups failed:\n{restarted}"
    );
    // Its lookup, made from Ready, hangs on the mirror: nothing reported yet. Released, the
    // mirror answers it, and Ready reports what it found.
    let status = controller.status().await;
    assert_eq!(status["phase"], "ready", "{status:#}");
    assert_eq!(status["upgrade-available"], Value::Null, "{status:#}");
    served.release();
    let started = Instant::now();
    loop {
        let status = controller.status().await;
        if status["upgrade-available"] == next().to_string() {
            break;
        }
        assert!(
            started.elapsed() < READY_WITHIN,
            "upgrade-available never reported from Ready: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A controller bootstrapped, Ready, from N and N+1 on a mirror served over HTTP whose
/// metadata answers can be made to hang ([`HttpMirror::blackhole_metadata`]).
async fn ready_behind_a_mirror_that_can_hang() -> (Mirror, HttpMirror, Controller) {
    let (mirror, served, controller) = Controller::from_held_http_mirror(HoldBack::MetadataFromNow);
    controller.wait_ready(READY_WITHIN).await;
    (mirror, served, controller)
}
