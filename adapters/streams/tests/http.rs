//! The HTTP(S) source against a real server on 127.0.0.1 (tests/common/server.rs) serving a
//! mirror made by the generator: lookup, selection and download; a stalling mirror; a
//! download resumed by `Range`; a server that ignores `Range`; tampered bytes; oversized
//! answers; TLS with a test CA. Every test stops its server, and with it every task.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::TestServer;
use common::{DAY, DAY_0, generate, listing, put_tarball};
use lockstep_core::Binary;
use lockstep_core::policy::{
    CatalogueEntry, Decision, Occasion, SelectionRequest, Stream, UpgradePolicy, select,
};
use lockstep_streams::{
    AsyncSource, DirectorySource, DownloadError, DownloadProgress, HighWaterMarkFile, HttpConfig,
    HttpSource, LookupConfig, LookupError, RedirectRule, RetryPolicy, SourceError, look_up_async,
};

const BINARY_BYTES: usize = 1 << 20;

/// A generated mirror with 2.9.43 and 2.9.44 (1 MiB) in released.
fn mirror() -> (tempfile::TempDir, Vec<u8>) {
    let site = tempfile::tempdir().unwrap();
    put_tarball(
        site.path(),
        Stream::Released,
        "juju-2.9.43-ubuntu-amd64.tgz",
        1000,
    );
    let newest = put_tarball(
        site.path(),
        Stream::Released,
        "juju-2.9.44-ubuntu-amd64.tgz",
        BINARY_BYTES,
    );
    generate(site.path(), DAY_0);
    (site, newest)
}

fn tools(site: &Path) -> PathBuf {
    site.join("tools")
}

/// Fast limits for tests: at least 256 KiB/s over 200 ms windows, 3 attempts 10-20 ms apart.
fn config() -> HttpConfig {
    HttpConfig {
        deadline: Duration::from_secs(20),
        throughput_min_bytes_per_second: 256 << 10,
        throughput_window: Duration::from_millis(200),
        retry: RetryPolicy {
            attempts_max: 3,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            jitter_seed: 1,
        },
        ..HttpConfig::default()
    }
}

/// Looks up the catalogue and selects the AutoPatch upgrade from 2.9.43.
async fn select_upgrade(source: &impl AsyncSource, state: &Path) -> CatalogueEntry {
    let mark = HighWaterMarkFile::new(state.join("mark.json"));
    let lookup = look_up_async(
        source,
        &mark,
        &LookupConfig::allowing_unsigned(),
        DAY_0 + DAY,
    )
    .await
    .unwrap();
    assert!(lookup.rejected.is_empty(), "{:?}", lookup.rejected);
    assert_eq!(lookup.index_file, "streams/v1/index2.json");
    let running = Binary::parse("2.9.43-ubuntu-amd64").unwrap();
    let request = SelectionRequest {
        running: &running,
        policy: &UpgradePolicy::AutoPatch,
        stream: None,
        occasion: Occasion::Bootstrap,
    };
    let Decision::Upgrade { entry } = select(&request, &lookup.catalogue).unwrap() else {
        panic!("expected an upgrade");
    };
    assert_eq!(entry.binary.to_string(), "2.9.44-ubuntu-amd64");
    entry
}

/// Downloads `entry` into a fresh directory; returns the result, the directory's listing
/// afterwards and the progress reports.
async fn fetch(
    source: &impl AsyncSource,
    entry: &CatalogueEntry,
) -> (
    Result<Vec<u8>, DownloadError>,
    Vec<String>,
    Vec<DownloadProgress>,
) {
    let agent = tempfile::tempdir().unwrap();
    let destination = agent.path().join("tools.tar.gz");
    let mut reports = Vec::new();
    let result = source
        .download(entry, &destination, &mut |report| reports.push(report))
        .await
        .map(|()| std::fs::read(&destination).unwrap());
    (result, listing(agent.path()), reports)
}

fn binary_requests(server: &TestServer) -> Vec<common::server::Served> {
    server
        .log()
        .into_iter()
        .filter(|served| served.path.ends_with(".tgz"))
        .collect()
}

#[tokio::test]
async fn lookup_select_and_download_over_http() {
    let (site, newest) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    let (result, files, reports) = fetch(&source, &entry).await;
    assert_eq!(result.unwrap(), newest);
    assert_eq!(files, vec!["tools.tar.gz"]);
    assert_eq!(reports.last().unwrap().received_bytes, BINARY_BYTES as u64);
    assert!(
        reports
            .windows(2)
            .all(|pair| pair[0].received_bytes < pair[1].received_bytes)
    );
    let requests = binary_requests(&server);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].range, None);

    // The directory source behind the same async trait gives the same answer.
    let directory = DirectorySource::new(tools(site.path())).unwrap();
    let state = tempfile::tempdir().unwrap();
    assert_eq!(select_upgrade(&directory, state.path()).await, entry);
    assert_eq!(fetch(&directory, &entry).await.0.unwrap(), newest);
    server.stop().await;
}

#[tokio::test]
async fn a_mirror_that_stalls_fails_by_the_throughput_bound() {
    let (site, _) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    server.behave(|behaviour| behaviour.stall_after_bytes = Some(100_000));
    let started = Instant::now();
    let (result, files, _) = fetch(&source, &entry).await;
    let elapsed = started.elapsed();
    let Err(DownloadError::Source(SourceError::TooSlow {
        window_bytes,
        throughput_min_bytes_per_second,
        ..
    })) = result
    else {
        panic!("expected TooSlow, got {result:?}");
    };
    assert!(window_bytes < 200_000, "{window_bytes}");
    assert_eq!(throughput_min_bytes_per_second, 256 << 10);
    // 3 attempts of at most two 200 ms windows each, plus backoffs: far below the 20 s
    // deadline.
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert!(files.is_empty(), "{files:?}");
    // Each retry resumed where the previous attempt stalled.
    let requests = binary_requests(&server);
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(requests[0].range, None);
    assert!(requests[1].range.is_some());
    server.stop().await;
}

#[tokio::test]
async fn an_interrupted_download_resumes_with_range() {
    let (site, newest) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    server.behave(|behaviour| {
        behaviour.drop_after_bytes = Some(300_000);
        behaviour.drops_remaining = 1;
    });
    let (result, files, reports) = fetch(&source, &entry).await;
    assert_eq!(result.unwrap(), newest);
    assert_eq!(files, vec!["tools.tar.gz"]);
    let requests = binary_requests(&server);
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(
        (requests[0].range.as_deref(), requests[0].status),
        (None, 200)
    );
    let range = requests[1].range.as_deref().unwrap();
    let offset: u64 = range
        .strip_prefix("bytes=")
        .and_then(|rest| rest.strip_suffix('-'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(offset > 0 && offset <= 300_000, "{range}");
    assert_eq!(requests[1].status, 206);
    // Progress never went back: nothing was fetched twice.
    assert!(
        reports
            .windows(2)
            .all(|pair| pair[0].received_bytes < pair[1].received_bytes)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_server_that_ignores_range_restarts_the_download() {
    let (site, newest) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    server.behave(|behaviour| {
        behaviour.drop_after_bytes = Some(300_000);
        behaviour.drops_remaining = 1;
        behaviour.ignore_range = true;
    });
    let (result, files, reports) = fetch(&source, &entry).await;
    assert_eq!(result.unwrap(), newest);
    assert_eq!(files, vec!["tools.tar.gz"]);
    let requests = binary_requests(&server);
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(requests[1].range.is_some());
    assert_eq!(requests[1].status, 200);
    // The restart was reported: progress went back to 0 once.
    let restarts = reports
        .windows(2)
        .filter(|pair| pair[1].received_bytes < pair[0].received_bytes)
        .count();
    assert_eq!(restarts, 1);
    assert!(reports.iter().any(|report| report.received_bytes == 0));
    server.stop().await;
}

#[tokio::test]
async fn tampered_bytes_are_refused_and_nothing_is_installed() {
    let (site, newest) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    server.behave(|behaviour| behaviour.corrupt_at = Some(654_321));
    let (result, files, _) = fetch(&source, &entry).await;
    let Err(DownloadError::HashMismatch {
        expected_sha256, ..
    }) = result
    else {
        panic!("expected HashMismatch, got {result:?}");
    };
    assert_eq!(expected_sha256, entry.sha256);
    assert!(files.is_empty(), "{files:?}");
    // A wrong digest is final: not retried.
    assert_eq!(binary_requests(&server).len(), 1);
    assert_eq!(newest.len(), BINARY_BYTES);
    server.stop().await;
}

#[tokio::test]
async fn oversized_answers_are_cut_at_the_cap() {
    let (site, _) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    let declared = entry.size_bytes;

    // Announced by Content-Length: refused before the body is read.
    server.behave(|behaviour| behaviour.extra_bytes = 10);
    let (result, files, reports) = fetch(&source, &entry).await;
    assert_eq!(
        result.unwrap_err(),
        DownloadError::TooLong {
            path: format!("{:?}", entry.path),
            expected_size_bytes: declared,
            actual_size_bytes_min: declared + 10,
        }
    );
    assert!(files.is_empty());
    assert!(reports.is_empty(), "{reports:?}");

    // Not announced (chunked): cut when the first byte past the cap arrives.
    server.behave(|behaviour| {
        behaviour.extra_bytes = 50 << 20;
        behaviour.omit_content_length = true;
    });
    let (result, files, reports) = fetch(&source, &entry).await;
    let Err(DownloadError::TooLong {
        actual_size_bytes_min,
        ..
    }) = result
    else {
        panic!("expected TooLong, got {result:?}");
    };
    assert!(actual_size_bytes_min > declared);
    assert!(actual_size_bytes_min <= declared + 64 * 1024);
    assert!(files.is_empty());
    assert!(
        reports
            .iter()
            .all(|report| report.received_bytes <= declared)
    );

    // A metadata document above the metadata cap.
    let small = LookupConfig {
        metadata_size_bytes_max: 100,
        ..LookupConfig::allowing_unsigned()
    };
    server.behave(|behaviour| *behaviour = Default::default());
    let mark = HighWaterMarkFile::new(state.path().join("other-mark.json"));
    let error = look_up_async(&source, &mark, &small, DAY_0 + DAY)
        .await
        .unwrap_err();
    let LookupError::Source(SourceError::TooLarge {
        size_bytes_max: 100,
        ..
    }) = error
    else {
        panic!("expected TooLarge, got {error:?}");
    };
    assert!(!mark.path().exists());
    server.stop().await;
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times() {
    let (site, newest) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;

    // Two 503s, then the file: the third and last attempt succeeds.
    server.behave(|behaviour| {
        behaviour.fail_with_status = Some(503);
        behaviour.failures_remaining = 2;
    });
    assert_eq!(fetch(&source, &entry).await.0.unwrap(), newest);
    let statuses: Vec<u16> = binary_requests(&server)
        .iter()
        .map(|served| served.status)
        .collect();
    assert_eq!(statuses, [503, 503, 200]);

    // Always 503: exactly `attempts_max` requests, then the status is reported.
    server.behave(|behaviour| behaviour.failures_remaining = u32::MAX);
    let (result, files, _) = fetch(&source, &entry).await;
    let Err(DownloadError::Source(SourceError::Status {
        status: 503,
        retry_after_seconds,
        ..
    })) = result
    else {
        panic!("expected HTTP 503, got {result:?}");
    };
    assert_eq!(retry_after_seconds, Some(7), "the server's Retry-After");
    assert!(files.is_empty());
    assert_eq!(binary_requests(&server).len(), 3 + 3);
    server.stop().await;
}

#[tokio::test]
async fn a_fetch_ends_at_its_deadline() {
    let (site, _) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    // A throughput window longer than the deadline: only the deadline can end this.
    let source = HttpSource::new(
        &server.url(),
        HttpConfig {
            deadline: Duration::from_millis(300),
            throughput_window: Duration::from_secs(60),
            ..config()
        },
    )
    .unwrap();
    server.behave(|behaviour| behaviour.delay_headers = Some(Duration::from_secs(30)));
    let started = Instant::now();
    let error = source
        .read_document("streams/v1/index2.json", 1 << 20)
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(
            error,
            SourceError::DeadlineExceeded {
                deadline_milliseconds: 300,
                received_bytes: 0,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_interrupted_document_resumes_with_range() {
    let (site, _) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    server.behave(|behaviour| {
        behaviour.drop_after_bytes = Some(100);
        behaviour.drops_remaining = 1;
    });
    let state = tempfile::tempdir().unwrap();
    select_upgrade(&source, state.path()).await;
    let log = server.log();
    assert_eq!(log[0].path, "streams/v1/index2.json");
    assert_eq!((log[0].range.as_deref(), log[0].status), (None, 200));
    assert_eq!(log[1].path, "streams/v1/index2.json");
    // Resumed where the cut left it: after at most the 100 bytes sent.
    let offset: u64 = log[1]
        .range
        .as_deref()
        .and_then(|range| range.strip_prefix("bytes="))
        .and_then(|rest| rest.strip_suffix('-'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(offset > 0 && offset <= 100, "{:?}", log[1]);
    assert_eq!(log[1].status, 206);
    server.stop().await;
}

#[tokio::test]
async fn a_missing_file_is_not_retried() {
    let (site, _) = mirror();
    let server = TestServer::start(tools(site.path())).await;
    let source = HttpSource::new(&server.url(), config()).unwrap();
    let error = source
        .read_document("streams/v1/absent.json", 1000)
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::NotFound { .. }), "{error:?}");
    assert_eq!(server.log().len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn https_with_a_configured_test_ca() {
    let (site, newest) = mirror();
    let (ca_pem, server_config) = test_ca();
    let server = TestServer::start_with(tools(site.path()), Some(server_config)).await;
    let url = format!("https://{}/", server.address);

    let mut trusting = config();
    trusting.trust_pem(ca_pem.as_bytes()).unwrap();
    let source = HttpSource::new(&url, trusting).unwrap();
    let state = tempfile::tempdir().unwrap();
    let entry = select_upgrade(&source, state.path()).await;
    assert_eq!(fetch(&source, &entry).await.0.unwrap(), newest);

    // Without the CA in the trust store the server is not believed.
    let untrusting = HttpSource::new(&url, config()).unwrap();
    let error = untrusting
        .read_document("streams/v1/index2.json", 1 << 20)
        .await
        .unwrap_err();
    let SourceError::Io { message, .. } = &error else {
        panic!("expected a TLS failure, got {error:?}");
    };
    assert!(message.contains("certificate"), "{message}");
    server.stop().await;
}

/// Redirects: followed only to https on the mirror's own host unless other hosts are
/// allowed; a refused one is final (not retried) and names where it pointed.
#[tokio::test]
async fn redirects_are_followed_only_to_https_on_the_same_host_unless_configured() {
    let (site, _) = mirror();
    let (ca_pem, server_config) = test_ca();
    let target = TestServer::start_with(tools(site.path()), Some(Arc::clone(&server_config))).await;
    let plain = TestServer::start(tools(site.path())).await;
    let front = TestServer::start_with(tools(site.path()), Some(server_config)).await;
    let front_url = format!("https://{}/", front.address);
    let trusting = || {
        let mut config = config();
        config.trust_pem(ca_pem.as_bytes()).unwrap();
        config
    };
    let read = |config: HttpConfig| {
        let url = front_url.clone();
        async move {
            HttpSource::new(&url, config)
                .unwrap()
                .read_document("streams/v1/index2.json", 1 << 20)
                .await
        }
    };

    // To plain http: refused, once, naming the target; the http server never asked.
    let downgrade = format!("http://{}/", plain.address);
    front.behave(|behaviour| behaviour.redirect_to = Some(downgrade.clone()));
    let error = read(trusting()).await.unwrap_err();
    let SourceError::RedirectRefused { problem, rule, .. } = &error else {
        panic!("expected a refused redirect, got {error:?}");
    };
    assert_eq!(*rule, RedirectRule::HttpsOnly);
    assert!(
        problem.contains("redirects are followed only to https://") && problem.contains(&downgrade),
        "{problem}"
    );
    assert_eq!(front.log().len(), 1, "a refused redirect is not retried");
    assert!(plain.log().is_empty());

    // To https on another host name (localhost, not 127.0.0.1): refused, naming both.
    let elsewhere = format!("https://localhost:{}/", target.address.port());
    front.behave(|behaviour| behaviour.redirect_to = Some(elsewhere.clone()));
    let error = read(trusting()).await.unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::RedirectRefused {
                rule: RedirectRule::SameHost,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("redirects are followed only on the mirror's own host")
            && error.to_string().contains(&elsewhere),
        "{error}"
    );
    assert!(target.log().is_empty());
    // ... followed when other hosts are allowed.
    let mut allowing = trusting();
    allowing.redirect_to_other_hosts = true;
    read(allowing).await.unwrap();
    assert_eq!(target.log().len(), 1);

    // To https on the same host (another port): followed.
    let same_host = format!("https://127.0.0.1:{}/", target.address.port());
    front.behave(|behaviour| behaviour.redirect_to = Some(same_host.clone()));
    read(trusting()).await.unwrap();
    assert_eq!(target.log().len(), 2);
    for server in [front, target, plain] {
        server.stop().await;
    }
}

/// A CA generated for this test run and a server certificate for 127.0.0.1 (and
/// localhost) it signed.
fn test_ca() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let certificate = params.signed_by(&key, &issuer).unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![certificate.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), Arc::new(server_config))
}
