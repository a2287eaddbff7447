//! Looking up the catalogue at a source, with the freshness guards.

use lockstep_core::policy::{Catalogue, SIZE_BYTES_MAX};

use crate::error::{LookupError, MetadataError, SourceError};
use crate::metadata::{INDEX_PATH, Index, LEGACY_INDEX_PATH, Products, build_catalogue};
use crate::source::{Source, read_document};
use crate::state::HighWaterMarkFile;

/// Limits and guards of a lookup.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LookupConfig {
    /// The largest metadata document fetched (index or products file). Juju's public
    /// products file for every agent ever released is a few MiB.
    pub metadata_size_bytes_max: u64,
    /// The largest agent binary an item may announce; larger items are rejected.
    pub item_size_bytes_max: u64,
    /// Metadata whose `updated` is older than this (at `now`) is refused as frozen.
    /// Regenerate a private mirror's metadata at least this often.
    pub freeze_after_seconds: u64,
}

impl LookupConfig {
    /// 16 MiB.
    pub const METADATA_SIZE_BYTES_MAX_DEFAULT: u64 = 16 << 20;
    /// 90 days: long enough for a mirror regenerated with each quarterly Juju release,
    /// short enough that a mirror abandoned for a season is noticed.
    pub const FREEZE_AFTER_SECONDS_DEFAULT: u64 = 90 * 86_400;
}

impl Default for LookupConfig {
    fn default() -> LookupConfig {
        LookupConfig {
            metadata_size_bytes_max: LookupConfig::METADATA_SIZE_BYTES_MAX_DEFAULT,
            item_size_bytes_max: SIZE_BYTES_MAX,
            freeze_after_seconds: LookupConfig::FREEZE_AFTER_SECONDS_DEFAULT,
        }
    }
}

/// A catalogue accepted from a source.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Lookup {
    /// The usable entries.
    pub catalogue: Catalogue,
    /// Items that could not be verified, each naming file, field, value and reason.
    pub rejected: Vec<MetadataError>,
    /// The index read (`streams/v1/index2.json`, or the legacy `index.json`).
    pub index_file: String,
    /// The index's `updated`, now remembered in the high-water mark.
    pub index_updated_unix_seconds: u64,
}

/// Reads the catalogue at `source`: the index (`index2.json`, else the legacy
/// `index.json`), then the products file of every agent-binary stream it lists.
///
/// Guards, in order: the index must not be older than the remembered mark (rollback) nor
/// older than `freeze_after_seconds` at `now_unix_seconds` (freeze); each products file must
/// carry the content id of the index entry that named it (mix-and-match); the catalogue's
/// highest version must not be below the remembered one. Only when every guard passed is
/// the mark advanced and stored; on any error nothing is remembered.
pub fn look_up(
    source: &dyn Source,
    mark_file: &HighWaterMarkFile,
    config: &LookupConfig,
    now_unix_seconds: u64,
) -> Result<Lookup, LookupError> {
    let mark = mark_file.load()?;
    let (index_file, index_bytes) =
        match read_document(source, INDEX_PATH, config.metadata_size_bytes_max) {
            Ok(bytes) => (INDEX_PATH, bytes),
            Err(SourceError::NotFound { .. }) => (
                LEGACY_INDEX_PATH,
                read_document(source, LEGACY_INDEX_PATH, config.metadata_size_bytes_max)?,
            ),
            Err(error) => return Err(error.into()),
        };
    let index = Index::parse(index_file, &index_bytes)?;
    // The index plays TUF's timestamp metadata: the entry point whose `updated` vouches for
    // everything it names. `HighWaterMark::admit` applies both checks:
    // Rollback attack (TUF specification §5.4.3): "If the new timestamp metadata version is
    // less than the trusted timestamp metadata version, discard it, abort the update cycle,
    // and report the potential rollback attack."
    // Freeze attack (TUF specification §5.4.4): "If the new timestamp metadata file has
    // expired, discard it, abort the update cycle, and report the potential freeze
    // attack." Simplestreams has no expiry: metadata expires `freeze_after_seconds` after
    // its `updated`, and `now` plays TUF's fixed update start time.
    mark.admit(
        index.updated_unix_seconds,
        now_unix_seconds,
        config.freeze_after_seconds,
    )
    .map_err(|error| LookupError::Policy {
        file: index_file.to_owned(),
        error: Box::new(error),
    })?;
    if index.entries.is_empty() {
        return Err(LookupError::NoAgentMetadata {
            file: index_file.to_owned(),
        });
    }
    let mut listed = Vec::new();
    let mut rejected = Vec::new();
    for entry in &index.entries {
        let bytes = read_document(source, &entry.path, config.metadata_size_bytes_max)?;
        let products = Products::parse(&entry.path, &bytes)?;
        // Mix-and-match attack (TUF specification, goals: "An attacker presents clients
        // with a view of a repository that includes files that never existed together on
        // the repository at the same time."): the products file must be the one this index
        // entry names, by content id.
        products.check_named_by(entry)?;
        let verified = products.verify(entry, config.item_size_bytes_max);
        listed.extend(verified.entries);
        rejected.extend(verified.rejected);
    }
    let catalogue =
        build_catalogue(listed, &mut rejected).map_err(|error| LookupError::Policy {
            file: index_file.to_owned(),
            error: Box::new(error),
        })?;
    // Rollback attack (TUF specification §5.5.5): "any targets metadata filename that was
    // listed in the trusted snapshot metadata file, if any, MUST continue to be listed in
    // the new snapshot metadata file." A fresh `updated` does not excuse a catalogue that
    // lost the newest binary already accepted.
    let highest = catalogue.highest_version();
    mark.admit_version(highest)
        .map_err(|error| LookupError::Policy {
            file: index_file.to_owned(),
            error: Box::new(error),
        })?;
    let mut advanced = mark;
    advanced.advance(index.updated_unix_seconds, highest);
    if advanced != mark {
        mark_file.store(&advanced)?;
    }
    for rejection in &rejected {
        tracing::warn!(
            file = %rejection.file,
            field = %rejection.field,
            value = %rejection.value,
            problem = %rejection.problem,
            "rejected streams item"
        );
    }
    tracing::info!(
        index = index_file,
        updated_unix_seconds = index.updated_unix_seconds,
        entries = catalogue.entries().len(),
        rejected = rejected.len(),
        "accepted streams catalogue"
    );
    Ok(Lookup {
        catalogue,
        rejected,
        index_file: index_file.to_owned(),
        index_updated_unix_seconds: index.updated_unix_seconds,
    })
}
