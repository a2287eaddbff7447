//! The API's view of the catalogue: `Client.FindTools`, `ModelConfig.ModelSet agent-version`,
//! `Upgrader.Tools` and the tools endpoint all ask for it, often. A mirror that stalls must
//! not stall them.
//!
//! - **No lock across network I/O.** A lookup runs in a task of its own; the cache's state
//!   sits behind a `std::sync::Mutex` held only to read or update it.
//! - **The last good catalogue is served while a refresh runs.** A catalogue read within
//!   [`FRESH_FOR`] is served as is; an older one (of the same `agent-metadata-url`) is
//!   served at once while one refresh, never more, reads the mirror again.
//! - **Failures are remembered** for [`FAILURE_REMEMBERED_FOR`]: a mirror that refuses or
//!   fails is not asked again by every call in that time; each call gets the failure.
//! - **A caller waits for the mirror at most [`WAIT_AT_MOST`]**, counted from the start of
//!   the refresh, and only when there is nothing to serve (the first lookup, or a new
//!   `agent-metadata-url`). After that it is told the lookup is still running; the refresh
//!   goes on and the next call gets its result.
//!
//! A blackholed mirror therefore costs the API one wait of at most [`WAIT_AT_MOST`] per
//! refresh, not one per call, and nothing at all while a good catalogue is known.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockstep_core::policy::Catalogue;
use tokio::sync::watch;
// tokio's clock: the real one, or a test's paused one.
use tokio::time::Instant;

/// How long a catalogue read is served without reading the mirror again.
pub const FRESH_FOR: Duration = Duration::from_secs(30);
/// How long a failed lookup is answered from memory before the mirror is asked again.
pub const FAILURE_REMEMBERED_FOR: Duration = Duration::from_secs(10);
/// The longest a caller waits for a lookup when no catalogue can be served meanwhile.
pub const WAIT_AT_MOST: Duration = Duration::from_secs(2);

/// The cached catalogue of one `agent-metadata-url` (`None`: the controller has no source).
#[derive(Clone)]
pub struct CatalogueCache {
    state: Arc<Mutex<State>>,
    /// Bumped when a refresh ends, for the callers waiting on it.
    finished: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    good: Option<Read<Catalogue>>,
    failed: Option<Read<String>>,
    /// The url being read and since when.
    refreshing: Option<(Option<String>, Instant)>,
}

struct Read<T> {
    url: Option<String>,
    at: Instant,
    value: T,
}

/// What the state says a caller gets, decided under the lock.
enum Answer {
    Serve(Result<Catalogue, String>),
    /// Wait for the refresh started at this instant (perhaps by this caller).
    Wait(Instant),
}

impl std::fmt::Debug for CatalogueCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self
            .state
            .lock()
            .expect("the catalogue cache's lock is never poisoned");
        f.debug_struct("CatalogueCache")
            .field("good_url", &state.good.as_ref().map(|read| &read.url))
            .field("failed", &state.failed.as_ref().map(|read| &read.value))
            .field("refreshing", &state.refreshing)
            .finish()
    }
}

impl Default for CatalogueCache {
    fn default() -> CatalogueCache {
        CatalogueCache::new()
    }
}

impl CatalogueCache {
    /// An empty cache: the first call reads the mirror.
    pub fn new() -> CatalogueCache {
        CatalogueCache {
            state: Arc::new(Mutex::new(State::default())),
            finished: watch::channel(0).0,
        }
    }

    /// The catalogue of `url`, read by `look_up` when the cache has none fresh enough.
    /// `look_up` runs in a task of its own (it outlives this call when the caller stops
    /// waiting) and at most one runs at a time.
    pub async fn get<F>(
        &self,
        url: Option<String>,
        look_up: impl FnOnce() -> F,
    ) -> Result<Catalogue, String>
    where
        F: Future<Output = Result<Catalogue, String>> + Send + 'static,
    {
        let mut finished = self.finished.subscribe();
        let started = match self.answer(&url, Instant::now(), look_up) {
            Answer::Serve(result) => return result,
            Answer::Wait(started) => started,
        };
        let deadline = started + WAIT_AT_MOST;
        loop {
            if let Some(result) = self.settled(&url, started) {
                return result;
            }
            match tokio::time::timeout_at(deadline, finished.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => break,
            }
        }
        self.settled(&url, started).unwrap_or_else(|| {
            Err(format!(
                "the agent binaries at {} are still being looked up (for {} s so far; the \
                 mirror has not answered): try again shortly",
                url.as_deref().unwrap_or("(no agent-metadata-url)"),
                started.elapsed().as_secs()
            ))
        })
    }

    /// Decides, under the lock, what a call for `url` at `now` gets; starts a refresh when
    /// one is due and none runs.
    fn answer<F>(&self, url: &Option<String>, now: Instant, look_up: impl FnOnce() -> F) -> Answer
    where
        F: Future<Output = Result<Catalogue, String>> + Send + 'static,
    {
        let mut state = self
            .state
            .lock()
            .expect("the catalogue cache's lock is never poisoned");
        let good = state.good.as_ref().filter(|read| &read.url == url);
        if let Some(good) = good
            && now.duration_since(good.at) < FRESH_FOR
        {
            return Answer::Serve(Ok(good.value.clone()));
        }
        let failed = state.failed.as_ref().filter(|read| &read.url == url);
        let failure_remembered =
            failed.is_some_and(|read| now.duration_since(read.at) < FAILURE_REMEMBERED_FOR);
        // What can be served without waiting: a stale good catalogue, else a failure still
        // remembered.
        let stale_good = good.map(|read| read.value.clone());
        let remembered_failure = failed
            .filter(|_| failure_remembered)
            .map(|read| read.value.clone());
        let running = state
            .refreshing
            .as_ref()
            .filter(|(reading, _)| reading == url)
            .map(|(_, since)| *since);
        let started = match running {
            Some(since) => Some(since),
            None if failure_remembered => None,
            None => {
                state.refreshing = Some((url.clone(), now));
                self.spawn_refresh(url.clone(), look_up());
                Some(now)
            }
        };
        match (stale_good, remembered_failure, started) {
            (Some(catalogue), _, _) => Answer::Serve(Ok(catalogue)),
            (None, Some(failure), _) => Answer::Serve(Err(failure)),
            (None, None, Some(started)) => Answer::Wait(started),
            (None, None, None) => {
                unreachable!("no refresh is started only for a remembered failure")
            }
        }
    }

    fn spawn_refresh<F>(&self, url: Option<String>, look_up: F)
    where
        F: Future<Output = Result<Catalogue, String>> + Send + 'static,
    {
        let state = Arc::clone(&self.state);
        let finished = self.finished.clone();
        tokio::spawn(async move {
            // In a task of its own, so that a lookup that panics ends this refresh with an
            // error instead of leaving it marked running forever.
            let result = tokio::spawn(look_up).await.unwrap_or_else(|error| {
                Err(format!("the catalogue lookup ended abnormally: {error}"))
            });
            let at = Instant::now();
            {
                let mut state = state
                    .lock()
                    .expect("the catalogue cache's lock is never poisoned");
                if state
                    .refreshing
                    .as_ref()
                    .is_some_and(|(reading, _)| reading == &url)
                {
                    state.refreshing = None;
                }
                match result {
                    Ok(value) => {
                        state.good = Some(Read { url, at, value });
                        state.failed = None;
                    }
                    Err(value) => {
                        tracing::warn!(target: "lockstep::agent", url = url.as_deref().unwrap_or(""), error = %value, "the API's catalogue lookup failed; remembered for {} s", FAILURE_REMEMBERED_FOR.as_secs());
                        state.failed = Some(Read { url, at, value });
                    }
                }
            }
            finished.send_modify(|generation| *generation += 1);
        });
    }

    /// The result a caller waiting on the refresh started at `started` can take now: a good
    /// catalogue of `url` (there was none when it began waiting), or a failure of `url`
    /// that refresh or a later one met; an older, expired failure is not its answer.
    fn settled(&self, url: &Option<String>, started: Instant) -> Option<Result<Catalogue, String>> {
        let state = self
            .state
            .lock()
            .expect("the catalogue cache's lock is never poisoned");
        if let Some(good) = state.good.as_ref().filter(|read| &read.url == url) {
            return Some(Ok(good.value.clone()));
        }
        state
            .failed
            .as_ref()
            .filter(|read| &read.url == url && read.at >= started)
            .map(|read| Err(read.value.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use lockstep_core::policy::{CatalogueEntry, Sha256, Stream};
    use lockstep_core::{Binary, Version};

    use super::*;

    fn catalogue(patch: u32) -> Catalogue {
        let binary = Binary::new(Version::new(2, 9, patch), "ubuntu", "amd64").unwrap();
        Catalogue::new(vec![CatalogueEntry {
            binary,
            stream: Stream::Released,
            path: format!("released/juju-2.9.{patch}-ubuntu-amd64.tgz"),
            size_bytes: 1,
            sha256: Sha256::parse(&"ab".repeat(32)).unwrap(),
        }])
        .unwrap()
    }

    fn url() -> Option<String> {
        Some("https://mirror.example.invalid/tools/".to_owned())
    }

    /// A lookup that never answers (a blackholed mirror), counting its starts.
    fn blackhole(
        starts: &Arc<AtomicU32>,
    ) -> impl FnOnce() -> std::future::Pending<Result<Catalogue, String>> {
        let starts = Arc::clone(starts);
        move || {
            starts.fetch_add(1, Ordering::SeqCst);
            std::future::pending()
        }
    }

    fn answering(
        starts: &Arc<AtomicU32>,
        result: Result<Catalogue, String>,
    ) -> impl FnOnce() -> std::future::Ready<Result<Catalogue, String>> {
        let starts = Arc::clone(starts);
        move || {
            starts.fetch_add(1, Ordering::SeqCst);
            std::future::ready(result)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_to_serve_a_blackholed_mirror_costs_one_bounded_wait_per_refresh() {
        let cache = CatalogueCache::new();
        let starts = Arc::new(AtomicU32::new(0));
        let began = tokio::time::Instant::now();
        let error = cache.get(url(), blackhole(&starts)).await.unwrap_err();
        assert_eq!(began.elapsed(), WAIT_AT_MOST);
        assert!(error.contains("still being looked up"), "{error}");
        assert!(error.contains("mirror.example.invalid"), "{error}");
        // Later calls while the lookup hangs answer at once, and start no second lookup.
        let again = tokio::time::Instant::now();
        for _ in 0..10 {
            cache.get(url(), blackhole(&starts)).await.unwrap_err();
        }
        assert_eq!(again.elapsed(), Duration::ZERO);
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_catalogue_is_served_at_once_while_a_hung_refresh_runs() {
        let cache = CatalogueCache::new();
        let starts = Arc::new(AtomicU32::new(0));
        let read = cache
            .get(url(), answering(&starts, Ok(catalogue(43))))
            .await;
        assert_eq!(read, Ok(catalogue(43)));
        // Fresh: the mirror is not asked.
        cache.get(url(), blackhole(&starts)).await.unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        tokio::time::advance(FRESH_FOR).await;
        let began = tokio::time::Instant::now();
        for _ in 0..5 {
            assert_eq!(
                cache.get(url(), blackhole(&starts)).await,
                Ok(catalogue(43))
            );
        }
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert_eq!(
            starts.load(Ordering::SeqCst),
            2,
            "one refresh, not one per call"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_remembered_for_its_time_then_the_mirror_is_asked_again() {
        let cache = CatalogueCache::new();
        let starts = Arc::new(AtomicU32::new(0));
        let refused = Err("metadata refused: bad signature".to_owned());
        assert_eq!(
            cache.get(url(), answering(&starts, refused.clone())).await,
            refused
        );
        tokio::time::advance(FAILURE_REMEMBERED_FOR - Duration::from_millis(1)).await;
        assert_eq!(
            cache
                .get(url(), answering(&starts, Ok(catalogue(44))))
                .await,
            refused
        );
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            cache
                .get(url(), answering(&starts, Ok(catalogue(44))))
                .await,
            Ok(catalogue(44))
        );
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_metadata_url_is_read_not_served_from_the_old_ones_catalogue() {
        let cache = CatalogueCache::new();
        let starts = Arc::new(AtomicU32::new(0));
        cache
            .get(url(), answering(&starts, Ok(catalogue(43))))
            .await
            .unwrap();
        let other = Some("https://other.example.invalid/".to_owned());
        assert_eq!(
            cache
                .get(other, answering(&starts, Ok(catalogue(45))))
                .await,
            Ok(catalogue(45))
        );
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }
}
