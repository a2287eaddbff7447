//! The async [`AsyncSource`] trait the agent drives, implemented by [`HttpSource`] and
//! [`DirectorySource`], and [`look_up_async`].
//!
//! **Sync or async.** The agent is tokio-based and HTTP fetches are long and must be
//! cancellable, so the agent uses this async trait (native `async fn` in traits, used
//! generically: no boxing, no `dyn`). The synchronous [`Source`] trait stays: it is the
//! simplest way to read a directory mirror (the generator, the CLI, the fuzz target and
//! the existing tests use it), and the lookup's guards are written once, against it.
//! [`look_up_async`] fetches the few metadata documents asynchronously, then runs the same
//! synchronous [`look_up`] over the fetched bytes, so every guard applies unchanged to
//! every transport.
//!
//! [`DirectorySource`]'s async methods do their file I/O on the calling thread: local reads
//! do not stall, but a multi-megabyte binary copy occupies a runtime worker while it runs;
//! drive it from `spawn_blocking` when that matters.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{Cursor, Read};
use std::path::Path;

use lockstep_core::policy::CatalogueEntry;
use pgp::composed::CleartextSignedMessage;

use crate::download::{DownloadProgress, download};
use crate::error::{DownloadError, LookupError, SourceError, quote};
use crate::http::HttpSource;
use crate::lookup::{Lookup, LookupConfig, look_up};
use crate::metadata::{INDEX_PATH, Index, LEGACY_INDEX_PATH};
use crate::signature::{SIGNED_SUFFIX, signed_path};
use crate::source::{DirectorySource, Source, check_relative_path, read_document};
use crate::state::HighWaterMarkFile;

/// Where the agent reads metadata and binaries from, asynchronously. Same contract as
/// [`Source`]: paths relative to the root, checked with [`check_relative_path`]; no fetch
/// yields more than its cap.
pub trait AsyncSource: std::fmt::Debug + Sync {
    /// Where this source reads, for messages.
    fn location(&self) -> String;

    /// Fetches a whole (small) document, at most `size_bytes_max` bytes.
    fn read_document(
        &self,
        path: &str,
        size_bytes_max: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> + Send;

    /// Fetches `entry` into `destination`, verified: installed only when size and sha256
    /// match (see [`crate::download()`]).
    fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &Path,
        progress: &mut (dyn FnMut(DownloadProgress) + Send),
    ) -> impl Future<Output = Result<(), DownloadError>> + Send;
}

impl AsyncSource for HttpSource {
    fn location(&self) -> String {
        HttpSource::location(self)
    }

    async fn read_document(&self, path: &str, size_bytes_max: u64) -> Result<Vec<u8>, SourceError> {
        HttpSource::read_document(self, path, size_bytes_max).await
    }

    async fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &Path,
        progress: &mut (dyn FnMut(DownloadProgress) + Send),
    ) -> Result<(), DownloadError> {
        HttpSource::download(self, entry, destination, progress).await
    }
}

impl AsyncSource for DirectorySource {
    fn location(&self) -> String {
        Source::location(self)
    }

    async fn read_document(&self, path: &str, size_bytes_max: u64) -> Result<Vec<u8>, SourceError> {
        read_document(self, path, size_bytes_max)
    }

    /// The copy and its sha256 are blocking file I/O and CPU work: they run on tokio's
    /// blocking pool, never on a runtime thread (which they would hold for the whole file),
    /// so two downloads run side by side; progress comes back over a channel.
    async fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &Path,
        progress: &mut (dyn FnMut(DownloadProgress) + Send),
    ) -> Result<(), DownloadError> {
        let (source, owned_entry, owned_destination) =
            (self.clone(), entry.clone(), destination.to_owned());
        let (sender, mut steps) = tokio::sync::mpsc::unbounded_channel();
        let copying = tokio::task::spawn_blocking(move || {
            download(&source, &owned_entry, &owned_destination, &mut |step| {
                let _ = sender.send(step);
            })
        });
        // Ends when the copy drops its sender, finished or not.
        while let Some(step) = steps.recv().await {
            progress(step);
        }
        match copying.await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(DownloadError::Destination {
                path: destination.display().to_string(),
                problem: format!("the copy was cancelled: {error}"),
            }),
        }
    }
}

/// Metadata documents already fetched, served to the synchronous lookup.
#[derive(Debug)]
struct Fetched {
    location: String,
    documents: BTreeMap<String, Vec<u8>>,
}

impl Source for Fetched {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn open(&self, path: &str, size_bytes_max: u64) -> Result<Box<dyn Read + Send>, SourceError> {
        check_relative_path(path).map_err(|problem| SourceError::InvalidPath {
            location: self.location.clone(),
            path: quote(path),
            problem,
        })?;
        let bytes = self
            .documents
            .get(path)
            .ok_or_else(|| SourceError::NotFound {
                location: self.location.clone(),
                path: quote(path),
            })?;
        // Fetched with the same cap.
        assert!(bytes.len() as u64 <= size_bytes_max);
        Ok(Box::new(Cursor::new(bytes.clone())))
    }
}

/// [`look_up`] at an async source: fetches the index (`index2`, else the legacy `index`)
/// and the products files it names, signed (`.sjson`) and unsigned (`.json`) as the
/// configuration allows, each capped at `config.metadata_size_bytes_max`, then applies
/// every guard and signature check of [`look_up`] to exactly those bytes. The high-water mark advances only when everything passed.
pub async fn look_up_async<S: AsyncSource>(
    source: &S,
    mark_file: &HighWaterMarkFile,
    config: &LookupConfig,
    now_unix_seconds: u64,
) -> Result<Lookup, LookupError> {
    let mut fetched = Fetched {
        location: source.location(),
        documents: BTreeMap::new(),
    };
    let mut indexes = fetch_candidates(source, INDEX_PATH, config, &mut fetched).await?;
    if indexes.is_empty() {
        indexes = fetch_candidates(source, LEGACY_INDEX_PATH, config, &mut fetched).await?;
    }
    // Only to learn which products files to fetch: `look_up` verifies and parses the index
    // again, and reports whatever is wrong with it.
    let mut products_paths = Vec::new();
    for path in indexes {
        let bytes = &fetched.documents[&path];
        let text = if path.ends_with(SIGNED_SUFFIX) {
            match CleartextSignedMessage::from_string(&String::from_utf8_lossy(bytes)) {
                Ok((message, _)) => message.signed_text().into_bytes(),
                Err(_) => continue,
            }
        } else {
            bytes.clone()
        };
        if let Ok(index) = Index::parse(&path, &text) {
            products_paths.extend(index.entries.into_iter().map(|entry| entry.path));
        }
    }
    for path in products_paths {
        fetch_candidates(source, &path, config, &mut fetched).await?;
    }
    look_up(&fetched, mark_file, config, now_unix_seconds)
}

/// Fetches the documents that [`read_metadata`](crate::lookup) may read for `path`
/// (the `.sjson` sibling, the `.json` document, as the configuration allows), skipping
/// those the source does not have; returns the paths fetched.
async fn fetch_candidates<S: AsyncSource>(
    source: &S,
    path: &str,
    config: &LookupConfig,
    fetched: &mut Fetched,
) -> Result<Vec<String>, LookupError> {
    let mut candidates = Vec::new();
    if !config.keyring.is_empty() {
        candidates.push(signed_path(path).unwrap_or_else(|| path.to_owned()));
    }
    if config.allow_unsigned && !candidates.iter().any(|candidate| candidate == path) {
        candidates.push(path.to_owned());
    }
    let mut found = Vec::new();
    for candidate in candidates {
        if fetched.documents.contains_key(&candidate) {
            found.push(candidate);
            continue;
        }
        match source
            .read_document(&candidate, config.metadata_size_bytes_max)
            .await
        {
            Ok(bytes) => {
                fetched.documents.insert(candidate.clone(), bytes);
                found.push(candidate);
            }
            Err(SourceError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(found)
}
