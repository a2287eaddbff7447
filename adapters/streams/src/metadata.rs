//! Parsing simplestreams documents exactly as Juju writes them: the index
//! (`streams/v1/index2.json`, legacy `streams/v1/index.json`), products files
//! (`com.ubuntu.juju:<stream>:agents`, older `com.ubuntu.juju:<stream>:tools` with
//! series-keyed product ids such as `com.ubuntu.juju:12.04:amd64`) and `mirrors.json`.
//!
//! A document that cannot be used at all is an error naming the file, the field and the
//! value. An item that cannot be verified is rejected on its own and reported with the same
//! detail, and the rest of the document stays usable.
//!
//! # Inheritance
//!
//! Simplestreams lets an item inherit any attribute it lacks from its version collection,
//! then its product, then the document (Juju's `simplestreams` decoder does the same): in
//! Juju 1.x metadata items carry no `release` or `arch`, their product does.

use std::collections::BTreeMap;

use lockstep_core::policy::{Catalogue, CatalogueEntry, PolicyError, Sha256, Stream};
use lockstep_core::version::{Binary, Reason, Version};
use serde_json::{Map, Value};

use crate::error::{MetadataError, quote, quote_json};
use crate::source::check_relative_path;

/// The index Juju 2.x and later write and read first.
pub const INDEX_PATH: &str = "streams/v1/index2.json";
/// The legacy index, read when `index2.json` does not exist; Juju writes it with the
/// `released` stream only.
pub const LEGACY_INDEX_PATH: &str = "streams/v1/index.json";
/// Where mirrors are described.
pub const MIRRORS_PATH: &str = "streams/v1/mirrors.json";
/// `format` of an index.
pub const INDEX_FORMAT: &str = "index:1.0";
/// `format` of a products file, and of an index entry pointing to one.
pub const PRODUCTS_FORMAT: &str = "products:1.0";
/// `format` of a mirrors reference and a mirror-info file.
pub const MIRRORS_FORMAT: &str = "mirrors:1.0";
/// `datatype` of agent-binary content.
pub const CONTENT_DOWNLOAD: &str = "content-download";
/// The only `ftype` Juju publishes for agent binaries.
pub const FTYPE_TAR_GZ: &str = "tar.gz";

/// The field name used for a document as a whole.
const DOCUMENT: &str = "(document)";
/// The value shown for an absent field.
const MISSING: &str = "(missing)";

/// Juju's content id for a stream's agent binaries: `com.ubuntu.juju:released:agents`.
pub fn agents_content_id(stream: Stream) -> String {
    format!("com.ubuntu.juju:{stream}:agents")
}

/// Juju's products file path for a stream: `streams/v1/com.ubuntu.juju-released-agents.json`.
pub fn agents_products_path(stream: Stream) -> String {
    format!("streams/v1/com.ubuntu.juju-{stream}-agents.json")
}

/// The stream an agent-binary content id names: `com.ubuntu.juju:<stream>:agents` or the
/// older `com.ubuntu.juju:<stream>:tools`; `None` for any other content (images share the
/// index) or an unknown stream.
pub fn agent_content_stream(content_id: &str) -> Option<Stream> {
    let rest = content_id.strip_prefix("com.ubuntu.juju:")?;
    let (stream, kind) = rest.split_once(':')?;
    if kind != "agents" && kind != "tools" {
        return None;
    }
    Stream::parse(stream).ok()
}

// ---------------------------------------------------------------------------------------
// JSON helpers: every failure names file, field and value
// ---------------------------------------------------------------------------------------

fn failure(file: &str, field: &str, value: String, problem: impl Into<String>) -> MetadataError {
    MetadataError {
        file: file.to_owned(),
        field: field.to_owned(),
        value,
        problem: problem.into(),
    }
}

/// `parent.key`, or `key` at the top.
fn member(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// `parent["key"]`: a map entry whose key is data.
fn keyed(parent: &str, key: &str) -> String {
    format!("{parent}[{}]", quote(key))
}

fn parse_document(file: &str, bytes: &[u8]) -> Result<Map<String, Value>, MetadataError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        failure(
            file,
            DOCUMENT,
            format!("({} bytes)", bytes.len()),
            format!("malformed JSON: {error}"),
        )
    })?;
    match value {
        Value::Object(object) => Ok(object),
        other => Err(failure(
            file,
            DOCUMENT,
            quote_json(&other),
            "expected a JSON object",
        )),
    }
}

fn object<'v>(
    file: &str,
    field: &str,
    value: &'v Value,
) -> Result<&'v Map<String, Value>, MetadataError> {
    value
        .as_object()
        .ok_or_else(|| failure(file, field, quote_json(value), "expected a JSON object"))
}

fn required<'v>(
    file: &str,
    parent: &str,
    map: &'v Map<String, Value>,
    key: &str,
) -> Result<&'v Value, MetadataError> {
    map.get(key)
        .ok_or_else(|| failure(file, &member(parent, key), MISSING.to_owned(), "required"))
}

fn required_str<'v>(
    file: &str,
    parent: &str,
    map: &'v Map<String, Value>,
    key: &str,
) -> Result<&'v str, MetadataError> {
    let value = required(file, parent, map, key)?;
    value.as_str().ok_or_else(|| {
        failure(
            file,
            &member(parent, key),
            quote_json(value),
            "expected a string",
        )
    })
}

fn optional_str<'v>(
    file: &str,
    parent: &str,
    map: &'v Map<String, Value>,
    key: &str,
) -> Result<Option<&'v str>, MetadataError> {
    match map.get(key) {
        None => Ok(None),
        Some(value) => value.as_str().map(Some).ok_or_else(|| {
            failure(
                file,
                &member(parent, key),
                quote_json(value),
                "expected a string",
            )
        }),
    }
}

fn expect_exact(
    file: &str,
    parent: &str,
    map: &Map<String, Value>,
    key: &str,
    expected: &str,
) -> Result<(), MetadataError> {
    let text = required_str(file, parent, map, key)?;
    if text != expected {
        return Err(failure(
            file,
            &member(parent, key),
            quote(text),
            format!("expected {expected:?}"),
        ));
    }
    Ok(())
}

fn updated(file: &str, parent: &str, text: &str) -> Result<u64, MetadataError> {
    crate::time::parse_rfc1123(text).ok_or_else(|| {
        failure(
            file,
            &member(parent, "updated"),
            quote(text),
            "expected an RFC 1123 time such as \"Thu, 01 Jan 1970 00:00:00 +0000\", not before 1970",
        )
    })
}

fn relative_path(file: &str, field: &str, text: &str) -> Result<(), MetadataError> {
    check_relative_path(text).map_err(|problem| failure(file, field, quote(text), problem))
}

// ---------------------------------------------------------------------------------------
// Index
// ---------------------------------------------------------------------------------------

/// A parsed index: the agent-binary entries it lists. Entries for other content (cloud
/// images share Juju's index) are skipped and named in `ignored_content_ids`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Index {
    /// The document's path in the source.
    pub file: String,
    /// The document's `updated`, in seconds since the Unix epoch: what the rollback and
    /// freeze guards check.
    pub updated_unix_seconds: u64,
    /// Agent-binary entries, ordered by content id.
    pub entries: Vec<IndexEntry>,
    /// Content ids of other entries, skipped.
    pub ignored_content_ids: Vec<String>,
}

/// One agent-binary entry of an index: where a stream's products file lives and which
/// products it may contain.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct IndexEntry {
    /// `com.ubuntu.juju:<stream>:agents` (or `...:tools`): the products file it points to
    /// must carry the same `content_id`.
    pub content_id: String,
    /// The stream the content id names.
    pub stream: Stream,
    /// The products file, relative to the source root.
    pub path: String,
    /// The product ids (`com.ubuntu.juju:ubuntu:amd64`) the products file may contain.
    pub product_ids: Vec<String>,
    /// The entry's own `updated`, when given.
    pub updated_unix_seconds: Option<u64>,
}

impl Index {
    /// Parses an index. Refused: malformed JSON, a `format` other than `index:1.0`, an
    /// absent or unparsable `updated`, and an agent-binary entry whose `datatype`,
    /// `format`, `path` or `products` is wrong.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Index, MetadataError> {
        let document = parse_document(file, bytes)?;
        expect_exact(file, "", &document, "format", INDEX_FORMAT)?;
        let updated_text = required_str(file, "", &document, "updated")?;
        let updated_unix_seconds = updated(file, "", updated_text)?;
        let index = object(file, "index", required(file, "", &document, "index")?)?;
        let mut entries = Vec::new();
        let mut ignored_content_ids = Vec::new();
        for (content_id, value) in index {
            let field = keyed("index", content_id);
            let Some(stream) = agent_content_stream(content_id) else {
                ignored_content_ids.push(content_id.clone());
                continue;
            };
            let entry = object(file, &field, value)?;
            expect_exact(file, &field, entry, "datatype", CONTENT_DOWNLOAD)?;
            expect_exact(file, &field, entry, "format", PRODUCTS_FORMAT)?;
            let path = required_str(file, &field, entry, "path")?;
            relative_path(file, &member(&field, "path"), path)?;
            let products_field = member(&field, "products");
            let products = required(file, &field, entry, "products")?;
            let products = products.as_array().ok_or_else(|| {
                failure(
                    file,
                    &products_field,
                    quote_json(products),
                    "expected an array of product ids",
                )
            })?;
            let mut product_ids = Vec::with_capacity(products.len());
            for (position, product) in products.iter().enumerate() {
                let text = product.as_str().ok_or_else(|| {
                    failure(
                        file,
                        &format!("{products_field}[{position}]"),
                        quote_json(product),
                        "expected a product id string",
                    )
                })?;
                product_ids.push(text.to_owned());
            }
            let updated_unix_seconds = match optional_str(file, &field, entry, "updated")? {
                Some(text) => Some(updated(file, &field, text)?),
                None => None,
            };
            entries.push(IndexEntry {
                content_id: content_id.clone(),
                stream,
                path: path.to_owned(),
                product_ids,
                updated_unix_seconds,
            });
        }
        Ok(Index {
            file: file.to_owned(),
            updated_unix_seconds,
            entries,
            ignored_content_ids,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Products
// ---------------------------------------------------------------------------------------

/// The item attributes read, in the order they are resolved. `series` and `os` stand in
/// for `release` when an item has none.
const ITEM_KEYS: [&str; 9] = [
    "version", "release", "series", "os", "arch", "size", "path", "ftype", "sha256",
];

/// One item of a products file with its inherited attributes resolved, not yet verified.
#[derive(Clone, PartialEq, Debug)]
pub struct ProductItem {
    /// The product id it is listed under (`com.ubuntu.juju:ubuntu:amd64`).
    pub product_id: String,
    /// The item's JSON path in the document.
    pub field: String,
    /// Each attribute found: where it was found (JSON path) and its value.
    attributes: BTreeMap<&'static str, (String, Value)>,
}

/// A parsed products file.
#[derive(Clone, PartialEq, Debug)]
pub struct Products {
    /// The document's path in the source.
    pub file: String,
    /// Its `content_id`, which must equal the index entry that named the file.
    pub content_id: String,
    /// Its `updated`, when given.
    pub updated_unix_seconds: Option<u64>,
    /// Every item, in document order (products, then version dates, then item ids, each
    /// sorted).
    pub items: Vec<ProductItem>,
}

/// A verified item: a catalogue entry and where it was listed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ListedEntry {
    /// The entry.
    pub entry: CatalogueEntry,
    /// The products file listing it.
    pub file: String,
    /// The item's JSON path there.
    pub field: String,
}

/// The outcome of verifying a products file's items: the usable entries and the rejected
/// items with reasons.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Verified {
    /// Items that can be verified.
    pub entries: Vec<ListedEntry>,
    /// Items that cannot, each naming file, field, value and problem.
    pub rejected: Vec<MetadataError>,
}

impl Products {
    /// Parses a products file. Refused as a whole: malformed JSON, a `format` other than
    /// `products:1.0`, no `content_id`, an unparsable `updated`, and `products`,
    /// `versions`, `items` or an item that is not a JSON object.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Products, MetadataError> {
        let document = parse_document(file, bytes)?;
        expect_exact(file, "", &document, "format", PRODUCTS_FORMAT)?;
        let content_id = required_str(file, "", &document, "content_id")?.to_owned();
        let updated_unix_seconds = match optional_str(file, "", &document, "updated")? {
            Some(text) => Some(updated(file, "", text)?),
            None => None,
        };
        let products = object(file, "products", required(file, "", &document, "products")?)?;
        let mut items = Vec::new();
        for (product_id, product) in products {
            let product_field = keyed("products", product_id);
            let product = object(file, &product_field, product)?;
            let versions = object(
                file,
                &member(&product_field, "versions"),
                required(file, &product_field, product, "versions")?,
            )?;
            for (date, collection) in versions {
                let collection_field = keyed(&member(&product_field, "versions"), date);
                let collection = object(file, &collection_field, collection)?;
                let collection_items = object(
                    file,
                    &member(&collection_field, "items"),
                    required(file, &collection_field, collection, "items")?,
                )?;
                for (item_id, item) in collection_items {
                    let item_field = keyed(&member(&collection_field, "items"), item_id);
                    let item = object(file, &item_field, item)?;
                    // Nearest level first: item, version collection, product, document.
                    let levels: [(&str, &Map<String, Value>); 4] = [
                        (&item_field, item),
                        (&collection_field, collection),
                        (&product_field, product),
                        ("", &document),
                    ];
                    let mut attributes = BTreeMap::new();
                    for key in ITEM_KEYS {
                        if let Some((parent, value)) = levels
                            .iter()
                            .find_map(|(parent, map)| map.get(key).map(|value| (parent, value)))
                        {
                            attributes.insert(key, (member(parent, key), value.clone()));
                        }
                    }
                    items.push(ProductItem {
                        product_id: product_id.clone(),
                        field: item_field,
                        attributes,
                    });
                }
            }
        }
        Ok(Products {
            file: file.to_owned(),
            content_id,
            updated_unix_seconds,
            items,
        })
    }

    /// Binds this products file to the index entry that named it.
    pub fn check_named_by(&self, entry: &IndexEntry) -> Result<(), MetadataError> {
        // Mix-and-match attack (TUF specification, "Goals: protect against mix-and-match
        // attacks": "An attacker presents clients with a view of a repository that includes
        // files that never existed together on the repository at the same time."). A
        // products file is trusted only for the content id of the index entry that pointed
        // to it, so a mirror cannot answer the released stream's path with the devel
        // stream's products, or with another repository's file.
        if self.content_id != entry.content_id {
            return Err(failure(
                &self.file,
                "content_id",
                quote(&self.content_id),
                format!(
                    "the index entry {} points to this file, so its content_id must be {:?}: \
                     refused as a possible mix-and-match attack; regenerate the mirror's \
                     metadata so that index and products files agree",
                    quote(&entry.content_id),
                    entry.content_id
                ),
            ));
        }
        Ok(())
    }

    /// Verifies every item as an entry of `entry`'s stream. Rejected: items of products
    /// that the index entry does not list, and items whose version, release, arch, size
    /// (0 or above `item_size_bytes_max`), sha256 (not 64 hexadecimal digits), path
    /// (escaping the mirror root) or ftype (not `tar.gz`) cannot be used.
    pub fn verify(&self, entry: &IndexEntry, item_size_bytes_max: u64) -> Verified {
        let mut verified = Verified::default();
        for item in &self.items {
            match self.verify_item(item, entry, item_size_bytes_max) {
                Ok(catalogue_entry) => verified.entries.push(ListedEntry {
                    entry: catalogue_entry,
                    file: self.file.clone(),
                    field: item.field.clone(),
                }),
                Err(error) => verified.rejected.push(error),
            }
        }
        assert_eq!(
            verified.entries.len() + verified.rejected.len(),
            self.items.len()
        );
        verified
    }

    fn verify_item(
        &self,
        item: &ProductItem,
        entry: &IndexEntry,
        item_size_bytes_max: u64,
    ) -> Result<CatalogueEntry, MetadataError> {
        let file = self.file.as_str();
        // Mix-and-match, within the file: only products the index announced are read, as
        // Juju only looks up the product ids the index lists.
        if !entry.product_ids.contains(&item.product_id) {
            return Err(failure(
                file,
                &item.field,
                quote(&item.product_id),
                format!(
                    "product id not listed by the index entry {}; ignored as a possible \
                     mix-and-match attack",
                    quote(&entry.content_id)
                ),
            ));
        }
        let text = |key: &'static str| -> Result<(&str, &str), MetadataError> {
            match item.attributes.get(key) {
                None => Err(failure(
                    file,
                    &member(&item.field, key),
                    MISSING.to_owned(),
                    "required",
                )),
                Some((field, Value::String(text))) => Ok((field.as_str(), text.as_str())),
                Some((field, other)) => {
                    Err(failure(file, field, quote_json(other), "expected a string"))
                }
            }
        };
        let (version_field, version_text) = text("version")?;
        let number = Version::parse(version_text).map_err(|error| {
            failure(file, version_field, quote(version_text), error.to_string())
        })?;
        let release_key = ["release", "series", "os"]
            .into_iter()
            .find(|key| item.attributes.contains_key(key))
            .unwrap_or("release");
        let (release_field, release) = text(release_key)?;
        let (arch_field, arch) = text("arch")?;
        let binary = Binary::new(number, release, arch).map_err(|error| {
            let (field, value) = match error.reason {
                Reason::BadName { name: "arch", .. } => (arch_field, arch),
                _ => (release_field, release),
            };
            failure(file, field, quote(value), error.to_string())
        })?;
        // Juju's product ids end with the architecture (`com.ubuntu.juju:ubuntu:amd64`,
        // `com.ubuntu.juju:12.04:amd64`): an item listed under another architecture's
        // product would be offered to the wrong machines.
        if let Some(product_arch) = item.product_id.rsplit(':').next()
            && item.product_id.starts_with("com.ubuntu.juju:")
            && product_arch != arch
        {
            return Err(failure(
                file,
                arch_field,
                quote(arch),
                format!(
                    "listed under product {} of another architecture",
                    quote(&item.product_id)
                ),
            ));
        }
        let size_bytes = match item.attributes.get("size") {
            None => {
                return Err(failure(
                    file,
                    &member(&item.field, "size"),
                    MISSING.to_owned(),
                    "required",
                ));
            }
            Some((field, value)) => {
                let size = value.as_u64().ok_or_else(|| {
                    failure(
                        file,
                        field,
                        quote_json(value),
                        "expected a whole number of bytes",
                    )
                })?;
                if size == 0 {
                    return Err(failure(
                        file,
                        field,
                        "0".to_owned(),
                        "a declared size of 0 cannot be verified",
                    ));
                }
                if size > item_size_bytes_max {
                    return Err(failure(
                        file,
                        field,
                        size.to_string(),
                        format!("above the cap of {item_size_bytes_max} bytes per agent binary"),
                    ));
                }
                size
            }
        };
        let (sha256_field, sha256_text) = text("sha256")?;
        let sha256 = Sha256::parse(sha256_text).map_err(|_| {
            failure(
                file,
                sha256_field,
                quote(sha256_text),
                format!(
                    "not a sha256 digest: expected 64 hexadecimal digits, found {} characters",
                    sha256_text.chars().count()
                ),
            )
        })?;
        let (path_field, path) = text("path")?;
        relative_path(file, path_field, path)?;
        if item.attributes.contains_key("ftype") {
            let (ftype_field, ftype) = text("ftype")?;
            if ftype != FTYPE_TAR_GZ {
                return Err(failure(
                    file,
                    ftype_field,
                    quote(ftype),
                    format!("expected {FTYPE_TAR_GZ:?}, the only agent-binary file type"),
                ));
            }
        }
        Ok(CatalogueEntry {
            binary,
            stream: entry.stream,
            size_bytes,
            sha256,
            path: path.to_owned(),
        })
    }
}

/// Builds a catalogue from verified entries. One binary listed more than once in a stream
/// with different sizes or digests contradicts itself: every listing of it is rejected
/// (added to `rejected`) and the rest is kept. Identical listings collapse into one.
#[expect(
    clippy::result_large_err,
    reason = "the core's PolicyError is cold and carries the offending binaries by value"
)]
pub fn build_catalogue(
    mut listed: Vec<ListedEntry>,
    rejected: &mut Vec<MetadataError>,
) -> Result<Catalogue, PolicyError> {
    listed
        .sort_by(|a, b| (&a.entry.binary, a.entry.stream).cmp(&(&b.entry.binary, b.entry.stream)));
    let mut kept = Vec::with_capacity(listed.len());
    for group in
        listed.chunk_by(|a, b| a.entry.binary == b.entry.binary && a.entry.stream == b.entry.stream)
    {
        let first = &group[0];
        let conflicting = group.iter().any(|other| {
            other.entry.sha256 != first.entry.sha256
                || other.entry.size_bytes != first.entry.size_bytes
        });
        if !conflicting {
            kept.push(first.entry.clone());
            continue;
        }
        let listings: Vec<String> = group
            .iter()
            .map(|other| {
                format!(
                    "{} {}: sha256 {}, {} bytes",
                    other.file, other.field, other.entry.sha256, other.entry.size_bytes
                )
            })
            .collect();
        for other in group {
            rejected.push(failure(
                &other.file,
                &other.field,
                quote(&other.entry.binary.to_string()),
                format!(
                    "{} is listed {} times in stream {} with different contents ({}); the \
                     metadata contradicts itself, so no listing of it is trusted",
                    other.entry.binary,
                    group.len(),
                    other.entry.stream,
                    listings.join("; ")
                ),
            ));
        }
    }
    Catalogue::new(kept)
}

// ---------------------------------------------------------------------------------------
// Mirrors
// ---------------------------------------------------------------------------------------

/// A cloud a mirror serves (`region`, `endpoint`).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CloudSpec {
    /// Region name.
    pub region: String,
    /// Endpoint URL.
    pub endpoint: String,
}

/// One reference in `streams/v1/mirrors.json`: where the mirror list for a content id is.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MirrorReference {
    /// The content id mirrored (`com.ubuntu.juju:released:agents`).
    pub content_id: String,
    /// `content-download` for agent binaries.
    pub datatype: String,
    /// The mirror-info file, relative to the source root.
    pub path: String,
    /// `updated` as written (Juju writes `YYYYMMDD` here, not RFC 1123).
    pub updated: Option<String>,
    /// Clouds served; empty for all.
    pub clouds: Vec<CloudSpec>,
}

/// One mirror in a mirror-info file.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MirrorInfo {
    /// The content id mirrored.
    pub content_id: String,
    /// The mirror's base URL.
    pub mirror: String,
    /// The products file at the mirror, relative to its base URL.
    pub path: String,
    /// Clouds served; empty for all.
    pub clouds: Vec<CloudSpec>,
}

fn clouds(
    file: &str,
    parent: &str,
    map: &Map<String, Value>,
) -> Result<Vec<CloudSpec>, MetadataError> {
    let Some(value) = map.get("clouds") else {
        return Ok(Vec::new());
    };
    let field = member(parent, "clouds");
    let array = value.as_array().ok_or_else(|| {
        failure(
            file,
            &field,
            quote_json(value),
            "expected an array of clouds",
        )
    })?;
    array
        .iter()
        .enumerate()
        .map(|(position, cloud)| {
            let cloud_field = format!("{field}[{position}]");
            let cloud = object(file, &cloud_field, cloud)?;
            Ok(CloudSpec {
                region: optional_str(file, &cloud_field, cloud, "region")?
                    .unwrap_or_default()
                    .to_owned(),
                endpoint: optional_str(file, &cloud_field, cloud, "endpoint")?
                    .unwrap_or_default()
                    .to_owned(),
            })
        })
        .collect()
}

/// One listing of a mirrors document: content id, the listing's object, its JSON path.
type MirrorListing<'d> = (String, &'d Map<String, Value>, String);

fn mirror_lists<'d>(
    file: &str,
    document: &'d Map<String, Value>,
) -> Result<Vec<MirrorListing<'d>>, MetadataError> {
    let mirrors = object(file, "mirrors", required(file, "", document, "mirrors")?)?;
    let mut found = Vec::new();
    for (content_id, list) in mirrors {
        let list_field = keyed("mirrors", content_id);
        let array = list
            .as_array()
            .ok_or_else(|| failure(file, &list_field, quote_json(list), "expected an array"))?;
        for (position, value) in array.iter().enumerate() {
            let field = format!("{list_field}[{position}]");
            found.push((content_id.clone(), object(file, &field, value)?, field));
        }
    }
    Ok(found)
}

/// Parses `streams/v1/mirrors.json` as Juju writes it
/// (`{"mirrors": {"<content id>": [{"datatype", "path", "updated", "format"}]}}`).
pub fn parse_mirrors(file: &str, bytes: &[u8]) -> Result<Vec<MirrorReference>, MetadataError> {
    let document = parse_document(file, bytes)?;
    mirror_lists(file, &document)?
        .into_iter()
        .map(|(content_id, reference, field)| {
            expect_exact(file, &field, reference, "format", MIRRORS_FORMAT)?;
            let path = required_str(file, &field, reference, "path")?;
            relative_path(file, &member(&field, "path"), path)?;
            Ok(MirrorReference {
                content_id,
                datatype: required_str(file, &field, reference, "datatype")?.to_owned(),
                path: path.to_owned(),
                updated: optional_str(file, &field, reference, "updated")?.map(str::to_owned),
                clouds: clouds(file, &field, reference)?,
            })
        })
        .collect()
}

/// Parses a mirror-info file, the target of a [`MirrorReference`]
/// (`{"mirrors": {"<content id>": [{"mirror", "path", "clouds"}]}, "format": "mirrors:1.0"}`).
pub fn parse_mirror_info(file: &str, bytes: &[u8]) -> Result<Vec<MirrorInfo>, MetadataError> {
    let document = parse_document(file, bytes)?;
    expect_exact(file, "", &document, "format", MIRRORS_FORMAT)?;
    mirror_lists(file, &document)?
        .into_iter()
        .map(|(content_id, info, field)| {
            let path = required_str(file, &field, info, "path")?;
            relative_path(file, &member(&field, "path"), path)?;
            Ok(MirrorInfo {
                content_id,
                mirror: required_str(file, &field, info, "mirror")?.to_owned(),
                path: path.to_owned(),
                clouds: clouds(file, &field, info)?,
            })
        })
        .collect()
}
