//! Looking up the catalogue at a source, with the freshness guards.

use lockstep_core::policy::{Catalogue, HighWaterMark, PolicyError, SIZE_BYTES_MAX};

use crate::error::{LookupError, MetadataError, SourceError};
use crate::metadata::{INDEX_PATH, Index, LEGACY_INDEX_PATH, Products, build_catalogue};
use crate::signature::{Keyring, SIGNED_SUFFIX, signed_path};
use crate::source::{Source, read_document};
use crate::state::HighWaterMarkFile;
use pgp::composed::CleartextSignedMessage;

/// Limits, guards and trust of a lookup.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LookupConfig {
    /// The largest metadata document fetched (index or products file). Juju's public
    /// products file for every agent ever released is a few MiB.
    pub metadata_size_bytes_max: u64,
    /// The largest agent binary an item may announce; larger items are rejected.
    pub item_size_bytes_max: u64,
    /// Metadata whose `updated` is older than this (at `now`) is refused as frozen.
    /// Regenerate a private mirror's metadata at least this often.
    pub freeze_after_seconds: u64,
    /// Metadata whose `updated` is further than this ahead of `now` is refused, and never
    /// becomes the high-water mark (a mark dated years ahead would refuse every genuine
    /// catalogue after it).
    pub future_skew_seconds: u64,
    /// The OpenPGP keys that sign the mirror's metadata. When not empty, every document is
    /// read from its clear-signed `.sjson` sibling and must verify against one of them.
    pub keyring: Keyring,
    /// Accept unsigned `.json` metadata (only where no `.sjson` exists when keys are
    /// configured). Off by default: a private mirror either signs its metadata
    /// (`--sign-key`) or is trusted explicitly with this flag, as Juju does for a
    /// user-supplied `agent-metadata-url`.
    pub allow_unsigned: bool,
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
            future_skew_seconds: HighWaterMark::FUTURE_SKEW_SECONDS_DEFAULT,
            keyring: Keyring::empty(),
            allow_unsigned: false,
        }
    }
}

impl LookupConfig {
    /// The defaults, accepting unsigned metadata: a mirror the operator trusts without
    /// signatures (a local directory, a private network).
    pub fn allowing_unsigned() -> LookupConfig {
        LookupConfig {
            allow_unsigned: true,
            ..LookupConfig::default()
        }
    }

    /// The defaults, requiring metadata signed by a key of `keyring`.
    pub fn signed_by(keyring: Keyring) -> LookupConfig {
        LookupConfig {
            keyring,
            ..LookupConfig::default()
        }
    }
}

/// Reads the metadata document `path` (an unsigned `.json` path as an index names it, or
/// a `.sjson` path) under the signature rules of [`crate::signature`]; returns the path
/// actually read and the JSON bytes.
pub(crate) fn read_metadata(
    source: &dyn Source,
    path: &str,
    config: &LookupConfig,
) -> Result<(String, Vec<u8>), LookupError> {
    let cap = config.metadata_size_bytes_max;
    let unsigned_refused = |file: &str| MetadataError {
        file: file.to_owned(),
        field: "(signature)".to_owned(),
        value: "(unsigned)".to_owned(),
        problem: if config.keyring.is_empty() {
            "unsigned metadata is refused and no signing key is configured: configure the \
             mirror's public key, or allow unsigned metadata for a mirror you trust"
                .to_owned()
        } else {
            format!(
                "no clear-signed .sjson document, and unsigned metadata is refused: the \
                 mirror's metadata must be signed (--sign-key) by one of the configured keys \
                 {:?}, or unsigned metadata allowed",
                config.keyring.fingerprints()
            )
        },
    };
    if !config.keyring.is_empty() {
        let signed = signed_path(path).unwrap_or_else(|| path.to_owned());
        match read_document(source, &signed, cap) {
            Ok(bytes) => return Ok((signed.clone(), config.keyring.verify(&signed, &bytes)?)),
            Err(SourceError::NotFound { .. }) if config.allow_unsigned && signed != path => {}
            Err(SourceError::NotFound { .. }) if signed != path => {
                return Err(unsigned_refused(path).into());
            }
            Err(error) => return Err(error.into()),
        }
    } else if !config.allow_unsigned {
        return Err(unsigned_refused(path).into());
    }
    let bytes = read_document(source, path, cap)?;
    if path.ends_with(SIGNED_SUFFIX) {
        // Allowed unsigned and no key to check with: the signed document's text is used
        // as if unsigned.
        let (message, _) = CleartextSignedMessage::from_string(&String::from_utf8_lossy(&bytes))
            .map_err(|error| MetadataError {
                file: path.to_owned(),
                field: "(signature)".to_owned(),
                value: "(document)".to_owned(),
                problem: format!("not an OpenPGP clear-signed message: {error}"),
            })?;
        return Ok((path.to_owned(), message.signed_text().into_bytes()));
    }
    Ok((path.to_owned(), bytes))
}

/// True when a failure to read an index means "try the legacy index".
fn index_absent(error: &LookupError) -> bool {
    match error {
        LookupError::Source(SourceError::NotFound { .. }) => true,
        LookupError::Metadata(error) => error.value == "(unsigned)",
        _ => false,
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
/// Guards, in order: the index must not be dated more than `future_skew_seconds` after
/// `now_unix_seconds` (mark poisoning), nor be older than the remembered mark (rollback),
/// nor older than `freeze_after_seconds` at `now_unix_seconds` (freeze); each products file
/// must carry the content id of the index entry that named it (mix-and-match); the
/// catalogue's highest version must not be below the remembered one. Only when every guard
/// passed is the mark advanced and stored, by its one writer
/// ([`HighWaterMarkFile::admit_and_advance`]: the guards again against the mark as stored
/// at that moment, under its lock); on any error nothing is remembered.
pub fn look_up(
    source: &dyn Source,
    mark_file: &HighWaterMarkFile,
    config: &LookupConfig,
    now_unix_seconds: u64,
) -> Result<Lookup, LookupError> {
    let mark = mark_file.load()?;
    let (index_file, index_bytes) = match read_metadata(source, INDEX_PATH, config) {
        Ok(read) => read,
        Err(error) if index_absent(&error) => {
            match read_metadata(source, LEGACY_INDEX_PATH, config) {
                Ok(read) => read,
                // Neither index: report the unsigned one refused, else the legacy one
                // missing.
                Err(legacy_error)
                    if index_absent(&legacy_error) && matches!(error, LookupError::Metadata(_)) =>
                {
                    return Err(error);
                }
                Err(legacy_error) => return Err(legacy_error),
            }
        }
        Err(error) => return Err(error),
    };
    let index_file = index_file.as_str();
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
    // A third check first, against mark poisoning: metadata dated further ahead than
    // `future_skew_seconds` is refused and never becomes the mark.
    // This check is early, against the mark as loaded, so that refused metadata is not
    // parsed further; the deciding one is made again with the mark's one writer below.
    let policy = |error| LookupError::Policy {
        file: index_file.to_owned(),
        error: Box::new(error),
    };
    mark.admit(
        index.updated_unix_seconds,
        now_unix_seconds,
        config.freeze_after_seconds,
        config.future_skew_seconds,
    )
    .map_err(policy)?;
    if index.entries.is_empty() {
        return Err(LookupError::NoAgentMetadata {
            file: index_file.to_owned(),
        });
    }
    let mut listed = Vec::new();
    let mut rejected = Vec::new();
    for entry in &index.entries {
        let (products_file, bytes) = read_metadata(source, &entry.path, config)?;
        let products = Products::parse(&products_file, &bytes)?;
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
    mark.admit_version(highest).map_err(policy)?;
    // The mark's one writer: both checks made again against the mark as stored now, and the
    // mark advanced, under the mark file's lock. A concurrent lookup (the driver's and the
    // API's, or another process) that accepted newer metadata meanwhile makes this one a
    // rollback, refused, instead of moving the mark backwards.
    mark_file
        .admit_and_advance(|stored| {
            stored.admit(
                index.updated_unix_seconds,
                now_unix_seconds,
                config.freeze_after_seconds,
                config.future_skew_seconds,
            )?;
            stored.admit_version(highest)?;
            let mut advanced = *stored;
            advanced.advance(index.updated_unix_seconds, highest);
            Ok::<_, Box<PolicyError>>(advanced)
        })?
        .map_err(|error| LookupError::Policy {
            file: index_file.to_owned(),
            error,
        })?;
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
