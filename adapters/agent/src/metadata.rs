//! The model's agent-binary metadata source (`agent-metadata-url`, `--metadata-source`)
//! as one async source: a local directory or an HTTP(S) mirror. Used by the daemon to look
//! binaries up and stage them, and by `lockstep bootstrap` to install the first one.

use lockstep_core::policy::CatalogueEntry;
use lockstep_streams::{AsyncSource, DirectorySource, HttpSource, LookupConfig, SourceError};

/// The model's metadata source, as an async source.
#[derive(Debug)]
pub enum MetadataSource {
    Directory(DirectorySource),
    Http(HttpSource),
}

impl MetadataSource {
    /// `http://` and `https://` URLs are fetched; anything else is a local directory
    /// (`file://` or a path).
    pub fn open(url: &str) -> Result<MetadataSource, SourceError> {
        if url.starts_with("http://") || url.starts_with("https://") {
            HttpSource::new(url, lockstep_streams::HttpConfig::default()).map(MetadataSource::Http)
        } else {
            DirectorySource::from_url(url).map(MetadataSource::Directory)
        }
    }

    pub async fn look_up(
        &self,
        mark: &lockstep_streams::HighWaterMarkFile,
        config: &LookupConfig,
        now: u64,
    ) -> Result<lockstep_streams::Lookup, lockstep_streams::LookupError> {
        match self {
            MetadataSource::Directory(source) => {
                lockstep_streams::look_up_async(source, mark, config, now).await
            }
            MetadataSource::Http(source) => {
                lockstep_streams::look_up_async(source, mark, config, now).await
            }
        }
    }

    pub async fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &std::path::Path,
        progress: &mut (dyn FnMut(lockstep_streams::DownloadProgress) + Send),
    ) -> Result<(), lockstep_streams::DownloadError> {
        match self {
            MetadataSource::Directory(source) => {
                AsyncSource::download(source, entry, destination, progress).await
            }
            MetadataSource::Http(source) => {
                AsyncSource::download(source, entry, destination, progress).await
            }
        }
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}
