//! The HTTP(S) source: `reqwest` over rustls with ring, a trust store the operator
//! configures, and the limits every fetch carries.
//!
//! Each fetch (a metadata document or an agent binary) has:
//!
//! - a **size cap**: the document cap, or the binary's declared size. A `Content-Length`
//!   above it is refused before the body is read; a body that runs past it (no
//!   `Content-Length`, or a lying one) is cut one chunk after the cap.
//! - a **deadline** for the whole fetch, every attempt and backoff included.
//! - a **minimum throughput**: each attempt measures the bytes received over consecutive
//!   windows of [`HttpConfig::throughput_window`]; a window below
//!   [`HttpConfig::throughput_min_bytes_per_second`] fails the attempt. A mirror that
//!   stalls mid-download therefore fails within one window, not at the deadline.
//! - **bounded retries**: at most [`RetryPolicy::attempts_max`] attempts, separated by
//!   capped exponential backoff with jitter drawn from a seeded generator (no clock, no
//!   global randomness). Only transient failures are retried (network errors, stalls,
//!   HTTP 408, 429 and 5xx); a wrong size, a wrong digest or a 404 is final.
//!
//! An interrupted binary download resumes with `Range: bytes=<received>-`; a `206` answer
//! is accepted only when its `Content-Range` starts exactly there and announces the
//! declared size. A `200` answer (the server ignores `Range`) restarts the download from
//! the first byte. Bytes stream into the temporary file while they are hashed; nothing is
//! held in memory beyond one chunk. The running sha256 is kept across attempts, so the
//! prefix already written is hashed once, when it arrived, and never read back. Resuming
//! is within one download call: a temporary file left by a process that died is deleted,
//! not resumed.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lockstep_core::policy::CatalogueEntry;
use reqwest::header::{CONTENT_RANGE, RANGE};
use reqwest::{StatusCode, Url};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::download::{DownloadProgress, Staged};
use crate::error::{DownloadError, RedirectRule, SourceError, quote};
use crate::source::check_relative_path;

/// How often and how long to retry a failed attempt.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RetryPolicy {
    /// Attempts per fetch, the first included: 1 to [`RetryPolicy::ATTEMPTS_MAX`].
    pub attempts_max: u32,
    /// Backoff before the second attempt; it doubles for each further one.
    pub backoff_initial: Duration,
    /// The largest backoff.
    pub backoff_max: Duration,
    /// Seed of the jitter generator. Each backoff is drawn uniformly from its upper half:
    /// `[b/2, b)`. Give each agent a different seed so that a fleet does not retry in step.
    pub jitter_seed: u64,
}

impl RetryPolicy {
    /// The most attempts a policy may ask for.
    pub const ATTEMPTS_MAX: u32 = 10;

    /// The backoff after failed attempt `attempt` (0 for the first), jittered by `jitter`.
    pub fn backoff(&self, attempt: u32, jitter: &mut Jitter) -> Duration {
        let doubled = self
            .backoff_initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.backoff_max);
        let half = doubled / 2;
        // A fraction in [0, 1) with 32 bits of resolution.
        let fraction = (jitter.next_u64() >> 32) as f64 / (1u64 << 32) as f64;
        half + half.mul_f64(fraction)
    }
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts_max: 4,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            jitter_seed: 0,
        }
    }
}

/// The jitter generator: SplitMix64, seeded from [`RetryPolicy::jitter_seed`].
#[derive(Clone, Debug)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Jitter {
        Jitter { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The limits, retries and trust of an [`HttpSource`].
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Certificate authorities trusted for `https://` mirrors besides the system's (DER): a
    /// private mirror's own CA (`--metadata-ca FILE`). Load a PEM bundle with
    /// [`HttpConfig::trust_pem`].
    pub trusted_certificates: Vec<CertificateDer<'static>>,
    /// Trust the system's certificate authorities too (`rustls-native-certs`: the
    /// distribution's bundle, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set), as every
    /// HTTPS client on the host does. On by default.
    pub system_roots: bool,
    /// Follow redirects to another host. Off by default: a redirect is followed only to
    /// `https://` on the host the fetch began at, so that neither a downgrade to plain
    /// http nor a hop to a host the operator did not name can happen behind their back.
    pub redirect_to_other_hosts: bool,
    /// The longest a TCP (and TLS) connection may take to open.
    pub connect_timeout: Duration,
    /// The longest a whole fetch may take, every attempt and backoff included.
    pub deadline: Duration,
    /// The throughput below which an attempt fails (slow-retrieval attack).
    pub throughput_min_bytes_per_second: u64,
    /// The window over which throughput is measured; a mirror that stalls fails within
    /// one window.
    pub throughput_window: Duration,
    /// Retries of failed attempts.
    pub retry: RetryPolicy,
    /// HTTP Basic credentials sent with every request: a machine agent's tag and password
    /// for its controller's tools endpoint. Never sent to another host: redirects to other
    /// hosts are refused unless [`HttpConfig::redirect_to_other_hosts`], and reqwest drops
    /// `Authorization` on a redirect to another host.
    pub basic_auth: Option<BasicAuth>,
}

/// HTTP Basic credentials; the password is never printed.
#[derive(Clone)]
pub struct BasicAuth {
    /// The user (an agent's tag, `machine-1`).
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("user", &self.user)
            .field("password", &"(hidden)")
            .finish()
    }
}

impl HttpConfig {
    /// Adds every certificate of a PEM bundle to the trust store.
    pub fn trust_pem(&mut self, pem: &[u8]) -> Result<(), SourceError> {
        let before = self.trusted_certificates.len();
        for certificate in CertificateDer::pem_slice_iter(pem) {
            let certificate = certificate.map_err(|error| SourceError::Protocol {
                location: "(trust store)".to_owned(),
                path: String::new(),
                problem: format!("a trusted certificate is not valid PEM: {error}"),
            })?;
            self.trusted_certificates.push(certificate);
        }
        if self.trusted_certificates.len() == before {
            return Err(SourceError::Protocol {
                location: "(trust store)".to_owned(),
                path: String::new(),
                problem: "the PEM bundle holds no certificate".to_owned(),
            });
        }
        Ok(())
    }
}

impl Default for HttpConfig {
    /// The system's certificate authorities, redirects only to https on the same host,
    /// 10 s to connect, 30 minutes per fetch, at least 16 KiB/s over every 30 s.
    fn default() -> HttpConfig {
        HttpConfig {
            trusted_certificates: Vec::new(),
            system_roots: true,
            redirect_to_other_hosts: false,
            connect_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(30 * 60),
            throughput_min_bytes_per_second: 16 * 1024,
            throughput_window: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            basic_auth: None,
        }
    }
}

/// A mirror served over HTTP or HTTPS: `https://streams.canonical.com/juju/tools/`.
#[derive(Clone)]
pub struct HttpSource {
    base: Url,
    client: reqwest::Client,
    config: HttpConfig,
}

impl fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSource")
            .field("base", &self.base.as_str())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Where a fetch writes what it receives.
trait Sink {
    /// True when the cap is the exact size (a binary), false when it is only an upper
    /// bound (a document).
    fn exact_size(&self) -> bool;
    fn received_bytes(&self) -> u64;
    /// Forgets what was received: the next attempt starts at byte 0.
    fn restart(&mut self) -> Result<(), Failure>;
    fn write(&mut self, bytes: &[u8]) -> Result<(), Failure>;
}

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// Retried when attempts and time are left.
    Transient(SourceError),
    /// Final.
    Final(SourceError),
    /// More bytes than the cap: at least this many.
    TooLong(u64),
    /// The sink failed (the destination cannot be written).
    Sink(DownloadError),
}

struct DocumentSink {
    bytes: Vec<u8>,
}

impl Sink for DocumentSink {
    fn exact_size(&self) -> bool {
        false
    }
    fn received_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn restart(&mut self) -> Result<(), Failure> {
        self.bytes.clear();
        Ok(())
    }
    fn write(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }
}

struct BinarySink<'a, 'p> {
    staged: Staged<'a>,
    progress: &'p mut (dyn FnMut(DownloadProgress) + Send),
}

impl Sink for BinarySink<'_, '_> {
    fn exact_size(&self) -> bool {
        true
    }
    fn received_bytes(&self) -> u64 {
        self.staged.received_bytes()
    }
    fn restart(&mut self) -> Result<(), Failure> {
        self.staged.restart().map_err(Failure::Sink)?;
        (self.progress)(self.staged.progress());
        Ok(())
    }
    fn write(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        self.staged.write(bytes).map_err(Failure::Sink)?;
        (self.progress)(self.staged.progress());
        Ok(())
    }
}

impl HttpSource {
    /// A source rooted at `base_url` (`http://` or `https://`; the directory that holds
    /// `streams/v1/`). The client uses rustls with the ring provider and trusts exactly
    /// `config.trusted_certificates`.
    pub fn new(base_url: &str, config: HttpConfig) -> Result<HttpSource, SourceError> {
        let invalid = |problem: String| SourceError::Protocol {
            location: quote(base_url),
            path: String::new(),
            problem,
        };
        let mut base =
            Url::parse(base_url).map_err(|error| invalid(format!("not a URL: {error}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid("not an http:// or https:// URL".to_owned()));
        }
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        if !(1..=RetryPolicy::ATTEMPTS_MAX).contains(&config.retry.attempts_max)
            || config.throughput_window.is_zero()
            || config.deadline.is_zero()
        {
            return Err(invalid(format!(
                "attempts must be 1 to {}, the throughput window and the deadline above 0: \
                 {config:?}",
                RetryPolicy::ATTEMPTS_MAX
            )));
        }
        let mut roots = rustls::RootCertStore::empty();
        if config.system_roots {
            // Certificates the platform's bundle holds but rustls cannot parse are skipped,
            // as browsers do; the count is logged.
            let (added, ignored) = roots.add_parsable_certificates(system_roots().iter().cloned());
            tracing::debug!(added, ignored, "system certificate authorities trusted");
        }
        for certificate in &config.trusted_certificates {
            roots
                .add(certificate.clone())
                .map_err(|error| invalid(format!("a trusted certificate is invalid: {error}")))?;
        }
        // The workspace's one crypto provider, set explicitly: reqwest is built without one.
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| invalid(format!("TLS versions: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(config.connect_timeout)
            .redirect(redirect_policy(config.redirect_to_other_hosts))
            .build()
            .map_err(|error| invalid(format!("cannot build the HTTP client: {error}")))?;
        Ok(HttpSource {
            base,
            client,
            config,
        })
    }

    /// The base URL, ending in `/`.
    pub fn location(&self) -> String {
        self.base.to_string()
    }

    /// Fetches a whole (small) document, at most `size_bytes_max` bytes.
    pub async fn read_document(
        &self,
        path: &str,
        size_bytes_max: u64,
    ) -> Result<Vec<u8>, SourceError> {
        let mut sink = DocumentSink { bytes: Vec::new() };
        match self.fetch(path, size_bytes_max, &mut sink).await {
            Ok(()) => Ok(sink.bytes),
            Err(Failure::TooLong(actual_size_bytes_min)) => Err(SourceError::TooLarge {
                location: self.location(),
                path: quote(path),
                size_bytes_max,
                announced_size_bytes: Some(actual_size_bytes_min),
            }),
            Err(Failure::Transient(error) | Failure::Final(error)) => Err(error),
            Err(Failure::Sink(error)) => unreachable!("a document sink cannot fail: {error}"),
        }
    }

    /// Fetches `entry` into `destination`, verified; see [`crate::download()`] for the
    /// checks, which are the same. Resumes with `Range` after an interruption.
    pub async fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &Path,
        progress: &mut (dyn FnMut(DownloadProgress) + Send),
    ) -> Result<(), DownloadError> {
        let mut sink = BinarySink {
            staged: Staged::new(entry, destination)?,
            progress,
        };
        match self.fetch(&entry.path, entry.size_bytes, &mut sink).await {
            Ok(()) => sink.staged.install(),
            Err(Failure::TooLong(actual_size_bytes_min)) => Err(DownloadError::TooLong {
                path: quote(&entry.path),
                expected_size_bytes: entry.size_bytes,
                actual_size_bytes_min,
            }),
            Err(Failure::Transient(error) | Failure::Final(error)) => {
                Err(DownloadError::Source(error))
            }
            Err(Failure::Sink(error)) => Err(error),
        }
    }

    fn url(&self, path: &str) -> Result<Url, SourceError> {
        check_relative_path(path).map_err(|problem| SourceError::InvalidPath {
            location: self.location(),
            path: quote(path),
            problem,
        })?;
        let mut url = self.base.clone();
        // Each component is percent-encoded as one segment: a `:` or `?` in a file name
        // stays part of the path.
        url.path_segments_mut()
            .map_err(|()| SourceError::InvalidPath {
                location: self.location(),
                path: quote(path),
                problem: "the base URL cannot hold a path",
            })?
            .pop_if_empty()
            .extend(path.split('/'));
        Ok(url)
    }

    /// Runs attempts until one succeeds, a failure is final, attempts run out or the
    /// deadline passes. Bounded: at most `attempts_max` attempts, each bounded by the
    /// deadline.
    async fn fetch(&self, path: &str, cap: u64, sink: &mut impl Sink) -> Result<(), Failure> {
        let url = self.url(path).map_err(Failure::Final)?;
        let started = Instant::now();
        let deadline = started + self.config.deadline;
        let retry = self.config.retry;
        let mut jitter = Jitter::new(retry.jitter_seed);
        let past_deadline = |received_bytes| {
            Failure::Transient(SourceError::DeadlineExceeded {
                location: self.location(),
                path: quote(path),
                deadline_milliseconds: self.config.deadline.as_millis() as u64,
                received_bytes,
            })
        };
        let mut attempt = 0;
        loop {
            let outcome = match timeout_at(deadline, self.attempt(path, &url, cap, sink)).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => return Err(past_deadline(sink.received_bytes())),
            };
            let error = match outcome {
                Ok(()) => return Ok(()),
                Err(Failure::Transient(error)) if attempt + 1 < retry.attempts_max => error,
                Err(failure) => return Err(failure),
            };
            let backoff = retry.backoff(attempt, &mut jitter);
            tracing::warn!(
                url = %url,
                attempt = attempt + 1,
                attempts_max = retry.attempts_max,
                received_bytes = sink.received_bytes(),
                backoff_milliseconds = backoff.as_millis() as u64,
                error = %error,
                "fetch attempt failed; retrying"
            );
            if Instant::now() + backoff >= deadline {
                return Err(past_deadline(sink.received_bytes()));
            }
            sleep_until(Instant::now() + backoff).await;
            attempt += 1;
        }
    }

    /// One request: resumes at `sink.received_bytes()` with `Range` when that is above 0.
    async fn attempt(
        &self,
        path: &str,
        url: &Url,
        cap: u64,
        sink: &mut impl Sink,
    ) -> Result<(), Failure> {
        let location = self.location();
        let transient = |message: String| {
            Failure::Transient(SourceError::Io {
                location: location.clone(),
                path: quote(path),
                kind: std::io::ErrorKind::Other,
                message,
            })
        };
        let offset = sink.received_bytes();
        let mut request = self.client.get(url.clone());
        if let Some(auth) = &self.config.basic_auth {
            request = request.basic_auth(&auth.user, Some(&auth.password));
        }
        if offset > 0 {
            request = request.header(RANGE, format!("bytes={offset}-"));
        }
        let mut response = request.send().await.map_err(|error| {
            if let Some(refused) = refused_redirect(&error) {
                // A redirect the policy refused: final, the mirror will answer the same.
                Failure::Final(SourceError::RedirectRefused {
                    location: location.clone(),
                    path: quote(path),
                    rule: refused.rule,
                    problem: error_chain(&error),
                })
            } else {
                transient(error_chain(&error))
            }
        })?;
        let status = response.status();
        match status {
            StatusCode::OK if offset > 0 => {
                tracing::info!(url = %url, offset, "server ignored Range; restarting from byte 0");
                sink.restart()?;
            }
            StatusCode::OK => {}
            StatusCode::PARTIAL_CONTENT if offset > 0 => {
                let content_range = response
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("");
                if let Err(problem) =
                    check_content_range(content_range, offset, cap, sink.exact_size())
                {
                    // The partial file cannot be trusted to line up: start over.
                    sink.restart()?;
                    return Err(Failure::Transient(SourceError::Protocol {
                        location,
                        path: quote(path),
                        problem: format!(
                            "asked for bytes {offset}- of {cap}, got Content-Range {:?}: \
                             {problem}; restarting from byte 0",
                            quote(content_range)
                        ),
                    }));
                }
            }
            StatusCode::NOT_FOUND | StatusCode::GONE => {
                return Err(Failure::Final(SourceError::NotFound {
                    location,
                    path: quote(path),
                }));
            }
            _ => {
                // Seconds only: the HTTP-date form is not one a controller sends.
                let retry_after_seconds = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|text| text.trim().parse::<u64>().ok());
                let error = SourceError::Status {
                    location,
                    path: quote(path),
                    status: status.as_u16(),
                    retry_after_seconds,
                };
                let retryable = status.is_server_error()
                    || status == StatusCode::REQUEST_TIMEOUT
                    || status == StatusCode::TOO_MANY_REQUESTS;
                return Err(if retryable {
                    Failure::Transient(error)
                } else {
                    Failure::Final(error)
                });
            }
        }
        let start = sink.received_bytes();
        // Refuse an announced oversize before reading it.
        if let Some(length) = response.content_length()
            && start.saturating_add(length) > cap
        {
            return Err(Failure::TooLong(start.saturating_add(length)));
        }
        let window = self.config.throughput_window;
        let window_bytes_min = (self.config.throughput_min_bytes_per_second as f64
            * window.as_secs_f64())
        .ceil() as u64;
        let mut window_start = Instant::now();
        let mut window_bytes: u64 = 0;
        loop {
            let window_end = window_start + window;
            match timeout_at(window_end, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    let received = sink.received_bytes() + chunk.len() as u64;
                    if received > cap {
                        return Err(Failure::TooLong(received));
                    }
                    sink.write(&chunk)?;
                    window_bytes += chunk.len() as u64;
                }
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(error)) => return Err(transient(error_chain(&error))),
                // The window ended with no chunk; judged below.
                Err(_elapsed) => {}
            }
            // Slow-retrieval attack (TUF specification §5.6, "the client SHOULD ... abort
            // the download if the average download speed falls below a threshold"; goals:
            // "An attacker may respond to clients with a very slow stream of data that
            // essentially results in the client never continuing the update process").
            let now = Instant::now();
            if now >= window_end {
                if window_bytes < window_bytes_min {
                    return Err(Failure::Transient(SourceError::TooSlow {
                        location,
                        path: quote(path),
                        window_bytes,
                        window_milliseconds: now.duration_since(window_start).as_millis() as u64,
                        throughput_min_bytes_per_second: self
                            .config
                            .throughput_min_bytes_per_second,
                    }));
                }
                window_start = now;
                window_bytes = 0;
            }
        }
    }
}

/// Checks a `Content-Range: bytes <first>-<last>/<complete>` answer to `Range:
/// bytes=<offset>-`: it must start at `offset` and end inside the file, whose complete
/// length must be `cap` when `exact` (a binary of declared size) and at most `cap`
/// otherwise (a document).
fn check_content_range(
    value: &str,
    offset: u64,
    cap: u64,
    exact: bool,
) -> Result<(), &'static str> {
    let range = value
        .strip_prefix("bytes ")
        .ok_or("not a byte range (`bytes <first>-<last>/<length>`)")?;
    let (span, complete) = range.split_once('/').ok_or("no `/<length>`")?;
    let (first, last) = span.split_once('-').ok_or("no `<first>-<last>`")?;
    let parse = |text: &str| text.trim().parse::<u64>().map_err(|_| "not a number");
    let (first, last) = (parse(first)?, parse(last)?);
    if first != offset {
        return Err("the range does not start where the download stopped");
    }
    let size_bytes = if complete.trim() == "*" {
        cap
    } else {
        parse(complete)?
    };
    if (exact && size_bytes != cap) || size_bytes > cap {
        return Err("the complete length is not the declared size, or above the cap");
    }
    if last < first || last >= size_bytes {
        return Err("the range does not end inside the file");
    }
    Ok(())
}

/// The most redirects one fetch follows.
const REDIRECTS_MAX: usize = 5;

/// A redirect [`redirect_policy`] refused: the rule, and a message naming where it pointed.
#[derive(Debug)]
struct RefusedRedirect {
    rule: RedirectRule,
    message: String,
}

impl std::fmt::Display for RefusedRedirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RefusedRedirect {}

/// The refusal of [`redirect_policy`] behind `error`, if that is what ended the request.
fn refused_redirect(error: &reqwest::Error) -> Option<&RefusedRedirect> {
    if !error.is_redirect() {
        return None;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<RefusedRedirect>() {
            return Some(refused);
        }
        source = cause.source();
    }
    None
}

/// Redirects are followed only to `https://`, and to another host only when
/// `to_other_hosts`; at most [`REDIRECTS_MAX`]. A refused redirect names where it pointed.
fn redirect_policy(to_other_hosts: bool) -> reqwest::redirect::Policy {
    let refuse = |rule, message| RefusedRedirect { rule, message };
    reqwest::redirect::Policy::custom(move |attempt| {
        let next = attempt.url().clone();
        let first = attempt.previous().first().cloned();
        if attempt.previous().len() > REDIRECTS_MAX {
            return attempt.error(refuse(
                RedirectRule::TooMany,
                format!("more than {REDIRECTS_MAX} redirects (the last to {next})"),
            ));
        }
        if next.scheme() != "https" {
            return attempt.error(refuse(
                RedirectRule::HttpsOnly,
                format!("redirect to {next} refused: redirects are followed only to https://"),
            ));
        }
        let host = |url: &Url| url.host_str().map(str::to_ascii_lowercase);
        if let Some(first) = first
            && !to_other_hosts
            && host(&first) != host(&next)
        {
            return attempt.error(refuse(
                RedirectRule::SameHost,
                format!(
                    "redirect from {first} to {next} refused: redirects are followed only on \
                     the mirror's own host ({})",
                    first.host_str().unwrap_or("")
                ),
            ));
        }
        attempt.follow()
    })
}

/// The system's certificate authorities, read once per process (`rustls-native-certs`:
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` when set, else the platform's bundle). Errors reading
/// some of them are logged; what could be read is used.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: std::sync::OnceLock<Vec<CertificateDer<'static>>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "reading the system's certificate authorities");
        }
        found.certs
    })
}

/// An error and its causes, on one line: reqwest's own message says little.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let policy = RetryPolicy {
            attempts_max: 10,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            jitter_seed: 42,
        };
        let mut jitter = Jitter::new(policy.jitter_seed);
        let expected_full = [100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000];
        for (attempt, full) in expected_full.into_iter().enumerate() {
            let backoff = policy.backoff(attempt as u32, &mut jitter);
            let full = Duration::from_millis(full);
            assert!(
                backoff >= full / 2 && backoff < full,
                "{attempt}: {backoff:?}"
            );
        }
        // Same seed, same delays; another seed, others.
        let draw = |seed| {
            let mut jitter = Jitter::new(seed);
            (0..5)
                .map(|attempt| policy.backoff(attempt, &mut jitter))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // Huge attempt numbers neither overflow nor pass the cap.
        assert!(policy.backoff(u32::MAX, &mut jitter) < Duration::from_millis(1000));
    }

    #[test]
    fn content_range_must_continue_the_download() {
        assert_eq!(
            check_content_range("bytes 100-999/1000", 100, 1000, true),
            Ok(())
        );
        assert_eq!(
            check_content_range("bytes 100-999/*", 100, 1000, true),
            Ok(())
        );
        // A document: any complete length up to the cap.
        assert_eq!(
            check_content_range("bytes 100-499/500", 100, 1000, false),
            Ok(())
        );
        assert!(check_content_range("bytes 100-499/500", 100, 1000, true).is_err());
        assert!(check_content_range("bytes 100-1499/1500", 100, 1000, false).is_err());
        for (value, offset, size) in [
            ("bytes 0-999/1000", 100, 1000),
            ("bytes 100-999/2000", 100, 1000),
            ("bytes 100-1000/1000", 100, 1000),
            ("bytes 100-99/1000", 100, 1000),
            ("items 100-999/1000", 100, 1000),
            ("bytes 100-999", 100, 1000),
            ("bytes x-999/1000", 100, 1000),
            ("", 100, 1000),
        ] {
            assert!(
                check_content_range(value, offset, size, true).is_err(),
                "{value:?}"
            );
        }
    }

    #[test]
    fn urls_keep_each_path_component_a_segment() {
        let source =
            HttpSource::new("http://127.0.0.1:1/mirror/tools", HttpConfig::default()).unwrap();
        assert_eq!(source.location(), "http://127.0.0.1:1/mirror/tools/");
        assert_eq!(
            source
                .url("streams/v1/com.ubuntu.juju:released:tools.json")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:1/mirror/tools/streams/v1/com.ubuntu.juju:released:tools.json"
        );
        assert_eq!(
            source.url("a/b?c#d").unwrap().as_str(),
            "http://127.0.0.1:1/mirror/tools/a/b%3Fc%23d"
        );
        assert!(matches!(
            source.url("../etc/passwd"),
            Err(SourceError::InvalidPath { .. })
        ));
        assert!(HttpSource::new("ftp://x/", HttpConfig::default()).is_err());
        let no_attempts = HttpConfig {
            retry: RetryPolicy {
                attempts_max: 0,
                ..RetryPolicy::default()
            },
            ..HttpConfig::default()
        };
        assert!(HttpSource::new("http://x/", no_attempts).is_err());
    }
}
