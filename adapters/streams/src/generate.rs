//! The mirror generator: Juju's `juju metadata generate-agent-binaries` as a library
//! function.
//!
//! # Layout
//!
//! ```text
//! <dir>/tools/                                  the metadata source root (agent-metadata-url)
//!   released/juju-2.9.43-ubuntu-amd64.tgz       binaries, one directory per stream
//!   proposed/juju-3.6.1-linux-arm64.tgz
//!   streams/v1/index2.json                      written: every stream
//!   streams/v1/index.json                       written: the released stream only (legacy)
//!   streams/v1/com.ubuntu.juju-released-agents.json   written: one products file per stream
//!   streams/v1/*.sjson                          with --sign-key: clear-signed copies
//! ```
//!
//! File names are Juju's, `juju-<version>-<os>-<arch>.tgz`; lockstep's own binaries use the
//! same naming. As Juju does, a binary built for `linux` is listed for the releases
//! `ubuntu`, `centos` and `genericlinux` as well, all pointing to the one file.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;

use lockstep_core::policy::{CatalogueEntry, SIZE_BYTES_MAX, Stream};
use lockstep_core::version::Binary;
use serde_json::{Map, Value, json};

use crate::download::measure;
use crate::error::GenerateError;
use crate::metadata::{
    CONTENT_DOWNLOAD, FTYPE_TAR_GZ, INDEX_FORMAT, INDEX_PATH, LEGACY_INDEX_PATH, PRODUCTS_FORMAT,
    agents_content_id, agents_products_path,
};
use crate::signature::{SigningKey, signed_path};
use crate::time::{format_rfc1123, format_yyyymmdd};

/// The mode of every metadata file written: a mirror is served to everyone.
const METADATA_MODE: u32 = 0o644;

/// Juju's `toolsReleaseAltMapping`: a `linux` binary also serves these releases.
const LINUX_RELEASES: [&str; 3] = ["ubuntu", "centos", "genericlinux"];

/// What the generator needs besides the directory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GenerateOptions {
    /// The time written as `updated` (seconds since the Unix epoch); the crate reads no
    /// clock.
    pub now_unix_seconds: u64,
}

/// What the generator did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Generated {
    /// Every entry listed, sorted by binary then stream.
    pub entries: Vec<CatalogueEntry>,
    /// The metadata files written, relative to `<dir>/tools`.
    pub files_written: Vec<String>,
    /// Files in a stream directory that were not listed, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Scans `<dir>/tools/<stream>/` for every stream, computes each binary's size and sha256
/// (reading it once, in chunks), and writes the index, the legacy index and one products
/// file per stream under `<dir>/tools/streams/v1/`, each replaced atomically. Fails when no
/// stream directory holds a binary.
pub fn generate_agent_binaries(
    dir: &Path,
    options: &GenerateOptions,
) -> Result<Generated, GenerateError> {
    let tools = dir.join("tools");
    let error = |path: &Path, problem: String| GenerateError {
        path: path.display().to_string(),
        problem,
    };
    let mut generated = Generated::default();
    for stream in Stream::ALL {
        let stream_dir = tools.join(stream.as_str());
        if !stream_dir.is_dir() {
            continue;
        }
        let mut names: Vec<String> = Vec::new();
        for entry in fs::read_dir(&stream_dir)
            .map_err(|e| error(&stream_dir, format!("cannot list: {e}")))?
        {
            let entry = entry.map_err(|e| error(&stream_dir, format!("cannot list: {e}")))?;
            match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(name) => generated.skipped.push((
                    format!("{stream}/{}", name.to_string_lossy()),
                    "file name is not UTF-8".to_owned(),
                )),
            }
        }
        names.sort();
        for name in names {
            let relative = format!("{stream}/{name}");
            let Some(binary_text) = name
                .strip_prefix("juju-")
                .and_then(|rest| rest.strip_suffix(".tgz"))
            else {
                generated.skipped.push((
                    relative,
                    "not named juju-<version>-<os>-<arch>.tgz".to_owned(),
                ));
                continue;
            };
            let binary = match Binary::parse(binary_text) {
                Ok(binary) => binary,
                Err(parse_error) => {
                    generated.skipped.push((relative, parse_error.to_string()));
                    continue;
                }
            };
            let path = stream_dir.join(&name);
            let mut file =
                File::open(&path).map_err(|e| error(&path, format!("cannot open: {e}")))?;
            let metadata = file
                .metadata()
                .map_err(|e| error(&path, format!("cannot stat: {e}")))?;
            if !metadata.is_file() {
                generated
                    .skipped
                    .push((relative, "not a regular file".to_owned()));
                continue;
            }
            let (size_bytes, sha256) =
                measure(&mut file).map_err(|e| error(&path, format!("cannot read: {e}")))?;
            if size_bytes == 0 || size_bytes > SIZE_BYTES_MAX {
                generated.skipped.push((
                    relative,
                    format!("{size_bytes} bytes: an agent binary has 1 byte to 4 GiB"),
                ));
                continue;
            }
            let mut releases = vec![binary.release.clone()];
            if binary.release == "linux" {
                releases.extend(LINUX_RELEASES.iter().map(|release| (*release).to_owned()));
            }
            for release in releases {
                let listed = Binary::new(binary.number, &release, &binary.arch)
                    .expect("release and arch were validated when the file name was parsed");
                generated.entries.push(CatalogueEntry {
                    binary: listed,
                    stream,
                    size_bytes,
                    sha256,
                    path: relative.clone(),
                });
            }
        }
    }
    if generated.entries.is_empty() {
        return Err(error(
            &tools,
            "no agent binaries found in any of tools/released, tools/proposed, tools/devel, \
             tools/testing; copy juju-<version>-<os>-<arch>.tgz files there first"
                .to_owned(),
        ));
    }
    generated
        .entries
        .sort_by(|a, b| (&a.binary, a.stream).cmp(&(&b.binary, b.stream)));

    let updated = format_rfc1123(options.now_unix_seconds);
    let date = format_yyyymmdd(options.now_unix_seconds);
    let mut index = Map::new();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for stream in Stream::ALL {
        let entries: Vec<&CatalogueEntry> = generated
            .entries
            .iter()
            .filter(|entry| entry.stream == stream)
            .collect();
        if entries.is_empty() {
            continue;
        }
        let mut products: BTreeMap<String, (String, Map<String, Value>, &CatalogueEntry)> =
            BTreeMap::new();
        for entry in &entries {
            let product_id = format!(
                "com.ubuntu.juju:{}:{}",
                entry.binary.release, entry.binary.arch
            );
            let item = json!({
                "release": entry.binary.release,
                "version": entry.binary.number.to_string(),
                "arch": entry.binary.arch,
                "size": entry.size_bytes,
                "path": entry.path,
                "ftype": FTYPE_TAR_GZ,
                "sha256": entry.sha256.to_string(),
            });
            let product = products
                .entry(product_id)
                .or_insert_with(|| (entry.binary.arch.clone(), Map::new(), entry));
            product.1.insert(entry.binary.to_string(), item);
            if entry.binary.number > product.2.binary.number {
                product.2 = entry;
            }
        }
        let product_ids: Vec<String> = products.keys().cloned().collect();
        let products: Map<String, Value> = products
            .into_iter()
            .map(|(id, (arch, items, newest))| {
                let product = json!({
                    "version": newest.binary.number.to_string(),
                    "arch": arch,
                    "versions": { date.clone(): { "items": items } },
                });
                (id, product)
            })
            .collect();
        let products_path = agents_products_path(stream);
        let document = json!({
            "products": products,
            "updated": updated,
            "format": PRODUCTS_FORMAT,
            "content_id": agents_content_id(stream),
        });
        files.push((products_path.clone(), pretty(&document)));
        index.insert(
            agents_content_id(stream),
            json!({
                "updated": updated,
                "format": PRODUCTS_FORMAT,
                "datatype": CONTENT_DOWNLOAD,
                "path": products_path,
                "products": product_ids,
            }),
        );
    }
    let index_document = |index: Map<String, Value>| json!({ "index": index, "updated": updated, "format": INDEX_FORMAT });
    let released_id = agents_content_id(Stream::Released);
    if let Some(released) = index.get(&released_id) {
        let legacy: Map<String, Value> = [(released_id.clone(), released.clone())]
            .into_iter()
            .collect();
        files.push((
            LEGACY_INDEX_PATH.to_owned(),
            pretty(&index_document(legacy)),
        ));
    }
    // The index last: a reader never sees it name a products file not yet written.
    files.push((INDEX_PATH.to_owned(), pretty(&index_document(index))));
    let streams_dir = tools.join("streams").join("v1");
    fs::create_dir_all(&streams_dir)
        .map_err(|e| error(&streams_dir, format!("cannot create: {e}")))?;
    for (relative, bytes) in files {
        let path = tools.join(&relative);
        lockstep_fs::write_file_atomically(&path, &bytes, METADATA_MODE)
            .map_err(|e| error(&path, e.to_string()))?;
        generated.files_written.push(relative);
    }
    tracing::info!(
        dir = %dir.display(),
        entries = generated.entries.len(),
        skipped = generated.skipped.len(),
        "generated agent-binary metadata"
    );
    Ok(generated)
}

/// Writes a clear-signed `.sjson` sibling of every metadata file `generated` wrote (the
/// CLI's `--sign-key <file>`), each replaced atomically. A signed index names the signed
/// products files (`....sjson`), so that a verified index leads only to verified
/// documents. Returns the files written, relative to `<dir>/tools`.
pub fn sign_generated_metadata(
    dir: &Path,
    generated: &Generated,
    key: &SigningKey,
) -> Result<Vec<String>, GenerateError> {
    let tools = dir.join("tools");
    let error = |path: &Path, problem: String| GenerateError {
        path: path.display().to_string(),
        problem,
    };
    let mut written = Vec::new();
    for relative in &generated.files_written {
        let Some(signed_relative) = signed_path(relative) else {
            continue;
        };
        let path = tools.join(relative);
        let bytes = fs::read(&path).map_err(|e| error(&path, format!("cannot read: {e}")))?;
        let mut document: Value = serde_json::from_slice(&bytes)
            .map_err(|e| error(&path, format!("not the JSON just written: {e}")))?;
        if (relative == INDEX_PATH || relative == LEGACY_INDEX_PATH)
            && let Some(Value::Object(entries)) = document.get_mut("index")
        {
            for entry in entries.values_mut() {
                if let Some(Value::String(products)) = entry.get_mut("path")
                    && let Some(signed) = signed_path(products)
                {
                    *products = signed;
                }
            }
        }
        let text = String::from_utf8(pretty(&document)).expect("serde_json writes UTF-8");
        let signed = key
            .clear_sign(&text)
            .map_err(|e| error(&path, format!("cannot sign: {e}")))?;
        let signed_file = tools.join(&signed_relative);
        lockstep_fs::write_file_atomically(&signed_file, signed.as_bytes(), METADATA_MODE)
            .map_err(|e| error(&signed_file, e.to_string()))?;
        written.push(signed_relative);
    }
    Ok(written)
}

fn pretty(document: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(document).expect("JSON values always serialise");
    bytes.push(b'\n');
    bytes
}
