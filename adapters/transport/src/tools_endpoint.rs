//! The tools endpoint, `GET /model/<uuid>/tools/<version>-<os>-<arch>`: agent binaries
//! served from the controller's cache, in every phase, to a client that logged in with
//! HTTP Basic credentials (a user's, or an agent's tag and password: stricter than Juju,
//! which serves them to anyone; the server checks them before it calls [`ToolsEndpoint::get`]).
//!
//! A binary the cache lacks is fetched through [`Backend::fetch_binary`] at most once at a
//! time per binary, however many agents ask at the same moment (a thundering herd of agents
//! each downloading from upstream was a real Juju outage): the first request starts the
//! fetch, later ones wait for the same fetch, and every waiter gets its outcome. The fetch
//! is a task of its own: it finishes (and frees its slot) even when every request waiting
//! for it went away. A failed fetch is forgotten once reported, so the next request tries
//! again. Before a fetch, the cache drops every binary whose version is not one
//! [`Backend::versions_to_keep`] names (running, previous, target), so it holds a few
//! binaries, not every one ever asked for.
//!
//! Machine agents' downloads are admitted by the core's rule
//! ([`lockstep_core::upgrader::admit_agent_download`]) under the model's
//! `max-agent-downloads` (default [`lockstep_core::upgrader::AGENT_DOWNLOADS_MAX_DEFAULT`]).
//! Beyond it a request waits in a queue, first come first served: a slot freed is handed to
//! the queue's first request at once, so no slot idles while an agent waits. A request that
//! waited [`lockstep_core::upgrader::DOWNLOAD_QUEUE_WAIT`], or finds the queue full
//! ([`lockstep_core::upgrader::download_queue_max`]), is answered 503 with `Retry-After`,
//! code `try again`: the time the queue takes to drain, from how long this controller's
//! downloads held their slots ([`lockstep_core::upgrader::busy_retry_after`]); the agent
//! comes back then, with jitter. A machine agent fetching a binary ahead of its admission
//! (any version but the one `Upgrader.DesiredVersion` tells it to run: a staged rollout's
//! `stage-version`) waits behind every admitted agent's download ([`Downloader`]). A download holds its slot from admission (through an upstream fetch, if one is
//! needed) until the client closes the connection after the last byte (at most
//! [`crate::hold::LINGER_MAX`] after it), or goes away before: so the bound holds for the
//! downloads as the agents see them, not only as the controller writes them.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use lockstep_core::Binary;
use lockstep_core::policy::CatalogueEntry;
use lockstep_core::upgrader::{self, DownloadAdmission};
use serde_json::json;

use crate::backend::Backend;
use crate::hold::ConnectionHold;
use crate::state::SharedState;
use crate::tools;

/// Bytes read from the cache per chunk of a download.
pub const CHUNK_SIZE_BYTES: usize = 64 * 1024;

/// Binaries being fetched at once at most (each distinct binary is fetched once at a time;
/// this bounds the distinct ones). A request beyond it is answered 503.
pub const FETCHES_IN_FLIGHT_MAX: usize = 16;

/// The endpoint of one model: its cache directory and the fetches in flight.
#[derive(Debug)]
pub struct ToolsEndpoint {
    model_uuid: String,
    /// `None`: the endpoint is off (404).
    cache: Option<PathBuf>,
    fetches: Fetches,
    /// Machine agents' downloads admitted and not finished, and those waiting.
    agent_downloads: Arc<Downloads>,
    /// Link probes being served ([`upgrader::LINK_PROBES_AT_ONCE`] permits).
    link_probes: Arc<tokio::sync::Semaphore>,
}

/// Machine agents' downloads: the slots taken and the queue of requests waiting for one.
#[derive(Debug, Default)]
struct Downloads {
    state: Mutex<DownloadQueue>,
    /// `state.in_flight`, readable without the lock (for `/metrics`).
    in_flight: AtomicU32,
}

#[derive(Debug, Default)]
struct DownloadQueue {
    in_flight: u32,
    /// The bound the last request was admitted under (the model's, read per request).
    max: u32,
    /// How long a download holds its slot, from those that ended
    /// ([`upgrader::transfer_estimate`]): a busy answer asks for the time the queue takes.
    transfer: Option<lockstep_core::Millis>,
    /// Requests waiting for a slot, in the order they are served: admitted agents'
    /// downloads oldest first, then fetches ahead oldest first. A slot is handed over
    /// through the sender.
    waiting: VecDeque<Waiter>,
}

/// A request in the queue.
#[derive(Debug)]
struct Waiter {
    slot: tokio::sync::oneshot::Sender<DownloadSlot>,
    /// A fetch ahead of the agent's admission ([`Downloader::AgentAhead`]).
    ahead: bool,
}

/// Who asks for a binary, for the bound on machine agents' downloads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Downloader {
    /// A user or a controller's agent: not bounded.
    Other,
    /// A machine agent fetching the version it is told to run (`Upgrader.DesiredVersion`).
    Agent,
    /// A machine agent fetching a binary ahead of its admission (a staged rollout's
    /// `stage-version`, or any version but the one it is told to run): served after every
    /// [`Downloader::Agent`] download that waits, so an admitted agent (a canary first)
    /// never waits behind the wave fetching ahead of it.
    AgentAhead,
}

impl Downloads {
    /// Hands free slots (below `max`) to the oldest waiting requests. A request that went
    /// away is skipped; the slot it was offered comes back unused, never counted.
    fn hand_over(self: &Arc<Downloads>, queue: &mut DownloadQueue) {
        while queue.in_flight < queue.max.max(1) {
            let Some(waiter) = queue.waiting.pop_front() else {
                break;
            };
            match waiter.slot.send(DownloadSlot::taken(self)) {
                Ok(()) => queue.in_flight += 1,
                // Not counted, so not released: emptied, its `Drop` does nothing.
                Err(mut unused) => drop(unused.downloads.take()),
            }
        }
        self.in_flight.store(queue.in_flight, Ordering::SeqCst);
    }
}

/// A machine agent's admitted download: frees its slot when dropped (the response's last
/// byte handed over, the client gone, or an error answered), to the queue's first request
/// if one waits.
#[derive(Debug)]
struct DownloadSlot {
    downloads: Option<Arc<Downloads>>,
    /// When it was taken: how long it was held feeds the busy answers' estimate.
    since: std::time::Instant,
}

impl DownloadSlot {
    fn taken(downloads: &Arc<Downloads>) -> DownloadSlot {
        DownloadSlot {
            downloads: Some(Arc::clone(downloads)),
            since: std::time::Instant::now(),
        }
    }
}

impl Drop for DownloadSlot {
    fn drop(&mut self) {
        let Some(downloads) = &self.downloads else {
            return;
        };
        let held = self.since.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
        let mut queue = downloads.state.lock().expect("not poisoned");
        queue.transfer = Some(upgrader::transfer_estimate(
            queue.transfer,
            lockstep_core::Millis(held),
        ));
        queue.in_flight -= 1;
        downloads.hand_over(&mut queue);
    }
}

/// The model's `max-agent-downloads`, as the core reads it: a whole number (or its
/// decimal text); anything else leaves the default.
pub fn configured_agent_downloads_max(value: Option<&serde_json::Value>) -> u32 {
    let configured = value.and_then(|value| {
        value
            .as_u64()
            .or_else(|| value.as_str().and_then(|text| text.trim().parse().ok()))
    });
    upgrader::agent_downloads_max(configured)
}

impl ToolsEndpoint {
    /// The endpoint of model `model_uuid`, keeping binaries in `cache` (`None`: off).
    pub fn new(model_uuid: String, cache: Option<PathBuf>) -> ToolsEndpoint {
        ToolsEndpoint {
            model_uuid,
            cache,
            fetches: Fetches::default(),
            agent_downloads: Arc::default(),
            link_probes: Arc::new(tokio::sync::Semaphore::new(
                upgrader::LINK_PROBES_AT_ONCE as usize,
            )),
        }
    }

    /// `GET /model/<uuid>/link-probe`: [`upgrader::LINK_PROBE_BYTES`] zero bytes, for a
    /// machine agent that knows no download rate for its link to measure one (it times the
    /// bytes, first to last, and reports the rate in its status, which a rollout's
    /// admission order reads). Outside the download slots; 404 for another model, 503
    /// past [`upgrader::LINK_PROBES_AT_ONCE`].
    pub fn link_probe(&self, uuid: &str) -> Response {
        if uuid != self.model_uuid {
            return http_error(
                StatusCode::NOT_FOUND,
                "not found",
                format!("unknown model {uuid:?}"),
            );
        }
        let Ok(permit) = Arc::clone(&self.link_probes).try_acquire_owned() else {
            let mut busy = http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "",
                format!(
                    "this controller is serving {} link probes; probe again later",
                    upgrader::LINK_PROBES_AT_ONCE
                ),
            );
            busy.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(upgrader::LINK_PROBE_RETRY.0 / 1000),
            );
            return busy;
        };
        static ZEROS: [u8; CHUNK_SIZE_BYTES] = [0; CHUNK_SIZE_BYTES];
        // The permit goes with the body: released once it is sent, or dropped unsent.
        let chunks = futures_util::stream::unfold(
            (upgrader::LINK_PROBE_BYTES, permit),
            |(left, permit)| async move {
                if left == 0 {
                    return None;
                }
                let chunk = left.min(CHUNK_SIZE_BYTES as u64);
                let bytes = axum::body::Bytes::from_static(&ZEROS[..chunk as usize]);
                Some((Ok::<_, std::io::Error>(bytes), (left - chunk, permit)))
            },
        );
        (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (
                    header::CONTENT_LENGTH,
                    upgrader::LINK_PROBE_BYTES.to_string(),
                ),
                (header::CACHE_CONTROL, "no-store".to_owned()),
            ],
            axum::body::Body::from_stream(chunks),
        )
            .into_response()
    }

    /// `GET /model/<uuid>/tools/<binary>`: the binary's tarball from the cache, fetched
    /// through the backend first if the cache lacks it (once, whoever else asks at the same
    /// moment). Errors are JSON, `{"error": {"message", "code"}}`: 404 for another model,
    /// no cache configured, or a binary the catalogue lacks; 400 for a malformed name; 502
    /// when the fetch failed (the next request tries again); 503 when the catalogue cannot
    /// be read.
    pub async fn get(
        &self,
        backend: &Arc<dyn Backend>,
        state: &dyn SharedState,
        uuid: &str,
        binary: &str,
        downloader: Downloader,
        hold: Option<Arc<ConnectionHold>>,
    ) -> Response {
        if uuid != self.model_uuid {
            return http_error(
                StatusCode::NOT_FOUND,
                "not found",
                format!("unknown model {uuid:?}"),
            );
        }
        let Some(cache) = &self.cache else {
            return http_error(
                StatusCode::NOT_FOUND,
                "not found",
                "this controller serves no agent binaries: it has no tools cache configured",
            );
        };
        let binary = match Binary::parse(binary) {
            Ok(binary) => binary,
            Err(error) => {
                return http_error(StatusCode::BAD_REQUEST, "bad request", error.to_string());
            }
        };
        let catalogue = match backend.catalogue().await {
            Ok(catalogue) => catalogue,
            Err(reason) => {
                return http_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "",
                    tools::catalogue_unreadable(&reason),
                );
            }
        };
        let model_stream = state.agent_stream().await.ok().flatten();
        let Some(entry) = catalogue.entry_for(&binary, model_stream).cloned() else {
            return http_error(
                StatusCode::NOT_FOUND,
                "not found",
                format!("no agent binaries found for {binary}"),
            );
        };
        let slot = if downloader != Downloader::Other {
            let max = match state.model_config().await {
                Ok(config) => configured_agent_downloads_max(
                    config.settings.get(upgrader::AGENT_DOWNLOADS_MAX_KEY),
                ),
                Err(_) => upgrader::AGENT_DOWNLOADS_MAX_DEFAULT,
            };
            match self
                .admit_agent(max, downloader == Downloader::AgentAhead)
                .await
            {
                Ok(slot) => Some(slot),
                Err(busy) => return busy,
            }
        } else {
            None
        };
        match self.fetches.ensure(backend, cache, &entry).await {
            Ok(path) => serve_file(&path, slot, hold).await,
            Err((status, message)) => http_error(status, "", message),
        }
    }

    /// Machine agents' downloads in flight now.
    pub fn agent_downloads_in_flight(&self) -> u32 {
        self.agent_downloads.in_flight.load(Ordering::SeqCst)
    }

    /// Machine agents' download requests waiting in the queue now.
    pub fn agent_downloads_waiting(&self) -> u32 {
        let queue = self.agent_downloads.state.lock().expect("not poisoned");
        queue
            .waiting
            .iter()
            .filter(|waiter| !waiter.slot.is_closed())
            .count() as u32
    }

    /// A slot for one more machine agent's download under `max`: at once, or after a wait
    /// in the queue; or the 503 that refuses it (the queue full, or no slot within
    /// [`upgrader::DOWNLOAD_QUEUE_WAIT`]). A fetch `ahead` of admission waits behind every
    /// request; an admitted agent's behind admitted agents' only (each class holds at most
    /// [`upgrader::download_queue_max`]).
    async fn admit_agent(&self, max: u32, ahead: bool) -> Result<DownloadSlot, Response> {
        let downloads = &self.agent_downloads;
        let mut receiver = {
            let mut queue = downloads.state.lock().expect("not poisoned");
            queue.max = max;
            // Requests that went away (their clients hung up) hold no place.
            queue.waiting.retain(|waiter| !waiter.slot.is_closed());
            let waiting = queue
                .waiting
                .iter()
                .filter(|waiter| ahead || !waiter.ahead)
                .count() as u32;
            match upgrader::admit_agent_download(queue.in_flight, waiting, max, queue.transfer) {
                DownloadAdmission::Admit => {
                    queue.in_flight += 1;
                    downloads.in_flight.store(queue.in_flight, Ordering::SeqCst);
                    return Ok(DownloadSlot::taken(downloads));
                }
                DownloadAdmission::Queue => {
                    let (sender, receiver) = tokio::sync::oneshot::channel();
                    queue.waiting.insert(
                        waiting as usize,
                        Waiter {
                            slot: sender,
                            ahead,
                        },
                    );
                    // The bound may have been raised: a free slot goes to the oldest now.
                    downloads.hand_over(&mut queue);
                    receiver
                }
                DownloadAdmission::Busy { retry_after } => {
                    let message = format!(
                        "busy: {} agent downloads in flight and {waiting} waiting, the \
                         model's {} is {max}",
                        queue.in_flight,
                        upgrader::AGENT_DOWNLOADS_MAX_KEY
                    );
                    return Err(busy(message, retry_after));
                }
            }
        };
        let wait = std::time::Duration::from_millis(upgrader::DOWNLOAD_QUEUE_WAIT.0);
        match tokio::time::timeout(wait, &mut receiver).await {
            Ok(Ok(slot)) => Ok(slot),
            // The sender is dropped unsent only with the endpoint itself: answered busy.
            Ok(Err(_)) => Err(busy(
                "busy: the controller stopped serving downloads".to_owned(),
                upgrader::DOWNLOAD_BUSY_RETRY_AFTER,
            )),
            Err(_elapsed) => {
                // No more hand-overs; one made just before this is taken, not lost.
                receiver.close();
                match receiver.try_recv() {
                    Ok(slot) => Ok(slot),
                    Err(_) => {
                        let retry_after = {
                            let queue = downloads.state.lock().expect("not poisoned");
                            upgrader::busy_retry_after(
                                queue.waiting.len() as u32,
                                max,
                                queue.transfer,
                            )
                        };
                        Err(busy(
                            format!(
                                "busy: no download slot freed within {} s (the model's {} is \
                                 {max})",
                                wait.as_secs(),
                                upgrader::AGENT_DOWNLOADS_MAX_KEY
                            ),
                            retry_after,
                        ))
                    }
                }
            }
        }
    }
}

/// The 503 "try again" a busy controller answers, asking for `retry_after`.
fn busy(message: String, retry_after: lockstep_core::Millis) -> Response {
    let seconds = retry_after.0.div_ceil(1000).max(1);
    let mut response = http_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "try again",
        format!("{message}; retry after {seconds}s"),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
    response
}

/// An error body as Juju's HTTP endpoints send it: `{"error": {"message", "code"}}`.
pub fn http_error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    let body = if code.is_empty() {
        json!({"error": {"message": message}})
    } else {
        json!({"error": {"message": message, "code": code}})
    };
    (status, axum::Json(body)).into_response()
}

/// A fetch in flight, shared by every request waiting for that binary.
type Fetch = Shared<BoxFuture<'static, Result<(), String>>>;

/// The fetches in flight, by binary.
#[derive(Default)]
struct Fetches {
    in_flight: Arc<Mutex<HashMap<Binary, Fetch>>>,
}

impl std::fmt::Debug for Fetches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.in_flight.lock().expect("not poisoned").len();
        f.debug_struct("Fetches")
            .field("in_flight", &count)
            .finish()
    }
}

/// The cached tarball of `binary` in `cache`. A binary's text has no `/` (its release and
/// arch are ASCII letters, digits, `.` and `_`), so this is one file inside `cache`.
/// A binary's tarball in the cache: `juju-<binary>.tgz`, Juju's name, which the
/// controller's own staging of a binary writes too, so that a controller fetches each
/// binary from upstream once, for itself and its agents alike.
fn cached_path(cache: &Path, binary: &Binary) -> PathBuf {
    let name = format!("juju-{binary}.tgz");
    assert!(!name.contains('/') && !name.contains('\\'), "{name:?}");
    cache.join(name)
}

impl Fetches {
    /// Makes sure `entry`'s tarball is in `cache`, fetching it if it is not: at most one
    /// fetch per binary at a time, whose outcome every concurrent caller shares.
    async fn ensure(
        &self,
        backend: &Arc<dyn Backend>,
        cache: &Path,
        entry: &CatalogueEntry,
    ) -> Result<PathBuf, (StatusCode, String)> {
        let path = cached_path(cache, &entry.binary);
        let fetch = {
            let mut in_flight = self.in_flight.lock().expect("not poisoned");
            match in_flight.get(&entry.binary) {
                Some(fetch) => fetch.clone(),
                // Looked at under the lock: a fetch renames its file into place before it
                // leaves the map, so a binary is never fetched twice in a row.
                None if path.is_file() => return Ok(path),
                None if in_flight.len() >= FETCHES_IN_FLIGHT_MAX => {
                    return Err((
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "{FETCHES_IN_FLIGHT_MAX} agent binaries are being fetched already; \
                             retry {} later",
                            entry.binary
                        ),
                    ));
                }
                None => {
                    let fetch = self.start(Arc::clone(backend), cache, entry.clone());
                    in_flight.insert(entry.binary.clone(), fetch.clone());
                    fetch
                }
            }
        };
        fetch.await.map(|()| path).map_err(|reason| {
            (
                StatusCode::BAD_GATEWAY,
                format!("cannot fetch agent binary {}: {reason}", entry.binary),
            )
        })
    }

    /// The fetch of one binary: into a temporary file of the cache, checked for its size,
    /// renamed into place; it leaves the map of fetches in flight when done, after the
    /// rename, so the next request finds the file or, after a failure, fetches again.
    fn start(&self, backend: Arc<dyn Backend>, cache: &Path, entry: CatalogueEntry) -> Fetch {
        // Weak: the map holds this future, which must not keep the map alive once the
        // server is gone.
        let in_flight = Arc::downgrade(&self.in_flight);
        let cache = cache.to_owned();
        let task = tokio::spawn(async move {
            let path = cached_path(&cache, &entry.binary);
            let partial = cache.join(format!(".{}.tgz.partial", entry.binary));
            prune(&*backend, &cache, &entry.binary).await;
            let outcome = fetch_into(&*backend, &cache, &entry, &partial, &path).await;
            if outcome.is_err() {
                let _ = tokio::fs::remove_file(&partial).await;
            }
            match &outcome {
                Ok(()) => {
                    tracing::info!(target: "lockstep::api", binary = %entry.binary, "agent binary cached")
                }
                Err(reason) => {
                    tracing::warn!(target: "lockstep::api", binary = %entry.binary, %reason, "agent binary fetch failed")
                }
            }
            if let Some(in_flight) = in_flight.upgrade() {
                in_flight
                    .lock()
                    .expect("not poisoned")
                    .remove(&entry.binary);
            }
            outcome
        });
        async move {
            task.await
                .unwrap_or_else(|error| Err(format!("the fetch stopped: {error}")))
        }
        .boxed()
        .shared()
    }
}

/// Drops from `cache` every cached binary whose version [`Backend::versions_to_keep`] does
/// not name, except `fetching`'s. Only files named as this endpoint names them
/// (`juju-<binary>.tgz`, or `<binary>.tgz` as earlier versions did) are touched; a failure
/// to list or remove is logged, not fatal.
async fn prune(backend: &dyn Backend, cache: &Path, fetching: &Binary) {
    let keep = backend.versions_to_keep().await;
    let Ok(mut entries) = tokio::fs::read_dir(cache).await else {
        return;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name();
        let Some(binary) = name
            .to_str()
            .and_then(|name| name.strip_suffix(".tgz"))
            .map(|name| name.strip_prefix("juju-").unwrap_or(name))
            .and_then(|name| Binary::parse(name).ok())
        else {
            continue;
        };
        if binary == *fetching || keep.contains(&binary.number) {
            continue;
        }
        match tokio::fs::remove_file(entry.path()).await {
            Ok(()) => {
                tracing::info!(target: "lockstep::api", %binary, "agent binary dropped from the tools cache")
            }
            Err(error) => {
                tracing::warn!(target: "lockstep::api", %binary, %error, "cannot drop an agent binary from the tools cache")
            }
        }
    }
}

async fn fetch_into(
    backend: &dyn Backend,
    cache: &Path,
    entry: &CatalogueEntry,
    partial: &Path,
    path: &Path,
) -> Result<(), String> {
    tokio::fs::create_dir_all(cache)
        .await
        .map_err(|error| format!("cannot create the tools cache {}: {error}", cache.display()))?;
    // A fetch cut short by a stopped server may have left its file behind.
    let _ = tokio::fs::remove_file(partial).await;
    backend
        .fetch_binary(entry.clone(), partial.to_owned())
        .await?;
    let size_bytes = tokio::fs::metadata(partial)
        .await
        .map_err(|error| format!("the fetched file {} is missing: {error}", partial.display()))?
        .len();
    if size_bytes != entry.size_bytes {
        return Err(format!(
            "the fetched file has {size_bytes} bytes, the catalogue says {}",
            entry.size_bytes
        ));
    }
    // Durably, as every file lockstep replaces: the fetched file fsynced, renamed into
    // place, the cache directory fsynced.
    let (partial, path) = (partial.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || lockstep_fs::rename_durably(&partial, &path))
        .await
        .map_err(|error| format!("the rename into the tools cache panicked: {error}"))?
        .map_err(|error| format!("cannot put the fetched file into the tools cache: {error}"))
}

/// A download's slot while its body is served: when the body is dropped (all of it written,
/// or the client gone), the slot goes to the connection's hold, which keeps it until the
/// connection ends ([`ConnectionHold::linger`]); without a hold it is freed then.
struct LingeringSlot {
    slot: Option<DownloadSlot>,
    hold: Option<Arc<ConnectionHold>>,
}

impl Drop for LingeringSlot {
    fn drop(&mut self) {
        if let (Some(slot), Some(hold)) = (self.slot.take(), self.hold.take()) {
            hold.linger(slot);
        }
    }
}

/// The tarball at `path` as a streamed `application/x-tar-gz` body; `slot` (a machine
/// agent's download) is held until the body is dropped unfinished, or, once its last byte
/// is handed over, by the connection's `hold` until the client closes it (without a hold,
/// until the last byte).
async fn serve_file(
    path: &Path,
    slot: Option<DownloadSlot>,
    hold: Option<Arc<ConnectionHold>>,
) -> Response {
    let file = match tokio::fs::File::open(path).await {
        Ok(file) => file,
        Err(error) => {
            return http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "",
                format!(
                    "cannot open the cached agent binary {}: {error}",
                    path.display()
                ),
            );
        }
    };
    let size_bytes = match file.metadata().await {
        Ok(metadata) => metadata.len(),
        Err(error) => {
            return http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "",
                format!(
                    "cannot read the cached agent binary {}: {error}",
                    path.display()
                ),
            );
        }
    };
    // hyper drops the body once Content-Length bytes are written, without asking it for
    // its end: the slot is handed to the connection's hold when the body is dropped.
    let state = (file, LingeringSlot { slot, hold });
    let chunks = futures_util::stream::unfold(state, |(mut file, slot)| async move {
        use tokio::io::AsyncReadExt;
        let mut buffer = vec![0u8; CHUNK_SIZE_BYTES];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((
                    Ok::<_, std::io::Error>(axum::body::Bytes::from(buffer)),
                    (file, slot),
                ))
            }
            Err(error) => Some((Err(error), (file, slot))),
        }
    });
    (
        [
            (header::CONTENT_TYPE, "application/x-tar-gz".to_owned()),
            (header::CONTENT_LENGTH, size_bytes.to_string()),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response()
}

#[cfg(test)]
mod link_probe_tests {
    use super::*;

    #[tokio::test]
    async fn link_probes_past_the_bound_are_answered_busy_until_one_is_done() {
        let endpoint = ToolsEndpoint::new("u".to_owned(), None);
        assert_eq!(
            endpoint.link_probe("other").status(),
            StatusCode::NOT_FOUND,
            "another model's uuid"
        );
        // Each response holds its permit until its body is sent or dropped.
        let mut held: Vec<Response> = (0..upgrader::LINK_PROBES_AT_ONCE)
            .map(|_| endpoint.link_probe("u"))
            .collect();
        assert!(
            held.iter()
                .all(|response| response.status() == StatusCode::OK)
        );
        let busy = endpoint.link_probe("u");
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            busy.headers()[header::RETRY_AFTER],
            (upgrader::LINK_PROBE_RETRY.0 / 1000).to_string()
        );
        // One probe sent to the end: its permit goes back.
        let done = held.pop().expect("one");
        assert_eq!(
            done.headers()[header::CONTENT_LENGTH],
            upgrader::LINK_PROBE_BYTES.to_string()
        );
        let body = axum::body::to_bytes(done.into_body(), usize::MAX)
            .await
            .expect("the body");
        assert_eq!(body.len() as u64, upgrader::LINK_PROBE_BYTES);
        assert!(body.iter().all(|byte| *byte == 0));
        assert_eq!(endpoint.link_probe("u").status(), StatusCode::OK);
    }
}
