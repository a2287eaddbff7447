//! Simplestreams documents in the formats Juju writes and reads, written for lockstep
//! (tests/data/README.md describes each set).

mod common;

use std::fs;

use common::{DAY, data, read_json};
use lockstep_core::policy::Stream;
use lockstep_streams::metadata::{
    INDEX_PATH, Index, IndexEntry, LEGACY_INDEX_PATH, Products, build_catalogue, parse_mirror_info,
    parse_mirrors,
};
use lockstep_streams::{DirectorySource, HighWaterMarkFile, LookupConfig, LookupError, look_up};
use serde_json::Value;

/// Every rejection as (file, field, value, problem), for exact comparison.
fn rejections(errors: &[lockstep_streams::MetadataError]) -> Vec<(String, String, String, String)> {
    errors
        .iter()
        .map(|e| {
            (
                e.file.clone(),
                e.field.clone(),
                e.value.clone(),
                e.problem.clone(),
            )
        })
        .collect()
}

fn row(file: &str, field: &str, value: &str, problem: &str) -> (String, String, String, String) {
    (
        file.to_owned(),
        field.to_owned(),
        value.to_owned(),
        problem.to_owned(),
    )
}

/// A lookup configuration that never calls the fixtures frozen.
fn never_frozen() -> LookupConfig {
    LookupConfig {
        freeze_after_seconds: u64::MAX,
        future_skew_seconds: u64::MAX,
        ..LookupConfig::allowing_unsigned()
    }
}

const SIZE_CAP: &str = "above the cap of 4294967296 bytes per agent binary";
const EMPTY_SHA: &str = "not a sha256 digest: expected 64 hexadecimal digits, found 0 characters";
const ABSOLUTE: &str = "absolute path: escapes the mirror root";

/// `updated` of agents-v3's index2.json: Mon, 13 Oct 2025 08:45:00 +0000.
const AGENTS_V3_UPDATED: u64 = 1_760_345_100;
/// `updated` of agents-v3's legacy index.json: Mon, 13 Oct 2025 08:41:17 +0000.
const AGENTS_V3_LEGACY_UPDATED: u64 = 1_760_344_877;
/// `updated` of tools-v1's indexes: Wed, 17 Aug 2016 14:03:52 +0000.
const TOOLS_V1_UPDATED: u64 = 1_471_442_632;
/// `updated` of shared-index-v1's index.json: Thu, 03 Jul 2014 16:20:45 +0000.
const SHARED_INDEX_V1_UPDATED: u64 = 1_404_404_445;

#[test]
fn agents_v3_metadata_parses_and_every_unverifiable_item_is_reported() {
    let state = tempfile::tempdir().unwrap();
    let mark = HighWaterMarkFile::new(state.path().join("mark.json"));
    let source = DirectorySource::new(data("agents-v3")).unwrap();
    let lookup = look_up(&source, &mark, &never_frozen(), AGENTS_V3_UPDATED + DAY).unwrap();
    assert_eq!(lookup.index_file, INDEX_PATH);
    assert_eq!(lookup.index_updated_unix_seconds, AGENTS_V3_UPDATED);
    assert!(lookup.catalogue.entries().is_empty());
    let proposed = "streams/v1/com.ubuntu.juju-proposed-agents.json";
    let released = "streams/v1/com.ubuntu.juju-released-agents.json";
    // One defect per item, each caught by its own check: streams in content-id order,
    // items in product-id order.
    assert_eq!(
        rejections(&lookup.rejected),
        vec![
            row(
                proposed,
                r#"products["com.ubuntu.juju:ubuntu:amd64"].versions["20251013"].items["3.6-rc2-ubuntu-amd64"].sha256"#,
                r#""""#,
                EMPTY_SHA,
            ),
            row(
                proposed,
                r#"products["com.ubuntu.juju:ubuntu:riscv64"].versions["20251013"].items["3.6-rc2-ubuntu-riscv64"].path"#,
                r#""/var/lib/juju/agents/juju-3.6-rc2-ubuntu-riscv64.tgz""#,
                ABSOLUTE,
            ),
            row(
                released,
                r#"products["com.ubuntu.juju:ubuntu:amd64"].versions["20251013"].items["3.5.7-ubuntu-amd64"].size"#,
                "0",
                "a declared size of 0 cannot be verified",
            ),
            row(
                released,
                r#"products["com.ubuntu.juju:ubuntu:arm64"].versions["20251013"].items["3.5.7-ubuntu-arm64"].sha256"#,
                r#""1bba752defd7ecd460a1f1aa416fa1cee49decafc0a42bf31e5bfed3""#,
                "not a sha256 digest: expected 64 hexadecimal digits, found 56 characters",
            ),
            row(
                released,
                r#"products["com.ubuntu.juju:ubuntu:s390x"].versions["20251013"].items["3.5.7-ubuntu-s390x"].size"#,
                "18014398509481984",
                SIZE_CAP,
            ),
        ]
    );
    // Accepted (nothing usable, but fresh and consistent): the time is remembered, and no
    // version, since the catalogue lists none.
    let remembered = mark.load().unwrap();
    assert_eq!(remembered.updated_unix_seconds, Some(AGENTS_V3_UPDATED));
    assert_eq!(remembered.version, None);
}

#[test]
fn tools_v1_series_keyed_metadata_parses() {
    let bytes = fs::read(data("tools-v1").join(INDEX_PATH)).unwrap();
    let index = Index::parse(INDEX_PATH, &bytes).unwrap();
    assert_eq!(index.updated_unix_seconds, TOOLS_V1_UPDATED);
    let streams: Vec<(Stream, &str)> = index
        .entries
        .iter()
        .map(|entry| (entry.stream, entry.content_id.as_str()))
        .collect();
    assert_eq!(
        streams,
        vec![
            (Stream::Proposed, "com.ubuntu.juju:proposed:tools"),
            (Stream::Released, "com.ubuntu.juju:released:tools"),
        ]
    );
    assert_eq!(
        index.entries[0].product_ids,
        vec![
            "com.ubuntu.juju:16.04:arm64",
            "com.ubuntu.juju:16.04:ppc64el"
        ]
    );
    assert_eq!(
        index.entries[1].product_ids,
        vec![
            "com.ubuntu.juju:14.04:amd64",
            "com.ubuntu.juju:14.04:armhf",
            "com.ubuntu.juju:16.04:s390x"
        ]
    );

    // Each released item is well formed but for one field: a size of 0, a 128-digit
    // (sha512-length) digest, a size one byte above the cap.
    let file = "streams/v1/com.ubuntu.juju-released-tools.json";
    let bytes = fs::read(data("tools-v1").join(file)).unwrap();
    let products = Products::parse(file, &bytes).unwrap();
    assert_eq!(products.updated_unix_seconds, Some(TOOLS_V1_UPDATED));
    products.check_named_by(&index.entries[1]).unwrap();
    assert_eq!(
        products
            .check_named_by(&index.entries[0])
            .unwrap_err()
            .field,
        "content_id"
    );
    let verified = products.verify(&index.entries[1], 4 << 30);
    assert!(verified.entries.is_empty());
    assert_eq!(
        rejections(&verified.rejected),
        vec![
            row(
                file,
                r#"products["com.ubuntu.juju:14.04:amd64"].versions["20160817"].items["1.25.6-trusty-amd64"].size"#,
                "0",
                "a declared size of 0 cannot be verified",
            ),
            row(
                file,
                r#"products["com.ubuntu.juju:14.04:armhf"].versions["20160817"].items["1.25.6-trusty-armhf"].sha256"#,
                "\"7bdd1e5c7d8bfa49bf3a7901c4e15ea5577181bd69be5be19da340b363bcdab78778254d2bfd7b39719070af02a06b8fd95a\"... \
                 (128 characters)",
                "not a sha256 digest: expected 64 hexadecimal digits, found 128 characters",
            ),
            row(
                file,
                r#"products["com.ubuntu.juju:16.04:s390x"].versions["20160817"].items["1.25.6-xenial-s390x"].size"#,
                "4294967297",
                SIZE_CAP,
            ),
        ]
    );

    let state = tempfile::tempdir().unwrap();
    let mark = HighWaterMarkFile::new(state.path().join("mark.json"));
    let source = DirectorySource::new(data("tools-v1")).unwrap();
    let lookup = look_up(&source, &mark, &never_frozen(), TOOLS_V1_UPDATED).unwrap();
    assert_eq!(lookup.index_file, INDEX_PATH);
    assert!(lookup.catalogue.entries().is_empty());
    let fields: Vec<&str> = lookup.rejected.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            r#"products["com.ubuntu.juju:16.04:arm64"].versions["20160817"].items["1.25.7-xenial-arm64"].sha256"#,
            r#"products["com.ubuntu.juju:16.04:ppc64el"].versions["20160817"].items["1.25.7-xenial-ppc64el"].path"#,
            r#"products["com.ubuntu.juju:14.04:amd64"].versions["20160817"].items["1.25.6-trusty-amd64"].size"#,
            r#"products["com.ubuntu.juju:14.04:armhf"].versions["20160817"].items["1.25.6-trusty-armhf"].sha256"#,
            r#"products["com.ubuntu.juju:16.04:s390x"].versions["20160817"].items["1.25.6-xenial-s390x"].size"#,
        ]
    );
}

#[test]
fn legacy_index_json_is_read_when_index2_is_absent() {
    let mirror = tempfile::tempdir().unwrap();
    let v1 = mirror.path().join("streams/v1");
    fs::create_dir_all(&v1).unwrap();
    for name in ["index.json", "com.ubuntu.juju-released-agents.json"] {
        fs::copy(data("agents-v3/streams/v1").join(name), v1.join(name)).unwrap();
    }
    let state = tempfile::tempdir().unwrap();
    let mark = HighWaterMarkFile::new(state.path().join("mark.json"));
    let source = DirectorySource::new(mirror.path()).unwrap();
    let lookup = look_up(&source, &mark, &never_frozen(), AGENTS_V3_UPDATED).unwrap();
    assert_eq!(lookup.index_file, LEGACY_INDEX_PATH);
    assert_eq!(lookup.index_updated_unix_seconds, AGENTS_V3_LEGACY_UPDATED);
    // Only the released stream is in the legacy index.
    assert_eq!(lookup.rejected.len(), 3);
    assert!(lookup.rejected.iter().all(|e| e.file.contains("released")));
}

#[test]
fn shared_index_v1_products_file_named_by_another_content_id_is_refused_and_nothing_remembered() {
    let state = tempfile::tempdir().unwrap();
    let mark_path = state.path().join("mark.json");
    let mark = HighWaterMarkFile::new(&mark_path);
    let source = DirectorySource::new(data("shared-index-v1")).unwrap();
    let error = look_up(
        &source,
        &mark,
        &never_frozen(),
        SHARED_INDEX_V1_UPDATED + 7 * DAY,
    )
    .unwrap_err();
    let LookupError::Metadata(error) = error else {
        panic!("{error}");
    };
    assert_eq!(error.file, "streams/v1/juju-tools.json");
    assert_eq!(error.field, "content_id");
    assert_eq!(error.value, r#""com.ubuntu.juju:tools""#);
    assert!(
        error.to_string().contains("possible mix-and-match attack"),
        "{error}"
    );
    assert!(!mark_path.exists());

    // Only the legacy index exists; the cloud-image entries it shares are skipped.
    assert!(!data("shared-index-v1").join(INDEX_PATH).exists());
    let bytes = fs::read(data("shared-index-v1").join(LEGACY_INDEX_PATH)).unwrap();
    let index = Index::parse(LEGACY_INDEX_PATH, &bytes).unwrap();
    assert_eq!(index.updated_unix_seconds, SHARED_INDEX_V1_UPDATED);
    assert_eq!(
        index.ignored_content_ids,
        vec![
            "com.ubuntu.cloud:daily:download",
            "com.ubuntu.cloud:released:azure"
        ]
    );
    assert_eq!(index.entries.len(), 1);
    assert_eq!(
        index.entries[0].content_id,
        "com.ubuntu.juju:released:tools"
    );
    assert_eq!(index.entries[0].path, "streams/v1/juju-tools.json");
    assert_eq!(
        index.entries[0].product_ids,
        released_tools_entry().product_ids
    );
}

/// shared-index-v1's index entry, with the content id its products file names, so that
/// the items can be verified.
fn released_tools_entry() -> IndexEntry {
    IndexEntry {
        content_id: "com.ubuntu.juju:tools".to_owned(),
        stream: Stream::Released,
        path: "streams/v1/juju-tools.json".to_owned(),
        product_ids: [
            "com.ubuntu.juju:12.04:i386",
            "com.ubuntu.juju:13.10:amd64",
            "com.ubuntu.juju:14.04:amd64",
            "com.ubuntu.juju:14.04:armhf",
        ]
        .map(str::to_owned)
        .to_vec(),
        updated_unix_seconds: None,
    }
}

#[test]
fn md5_length_digests_of_old_metadata_are_rejected_item_by_item() {
    let file = "streams/v1/juju-tools.json";
    let bytes = fs::read(data("shared-index-v1").join(file)).unwrap();
    let products = Products::parse(file, &bytes).unwrap();
    let verified = products.verify(&released_tools_entry(), 4 << 30);
    assert!(verified.entries.is_empty());
    assert_eq!(verified.rejected.len(), 8);
    assert!(
        verified
            .rejected
            .iter()
            .all(|e| e.field.ends_with(".sha256") && e.problem.ends_with("found 32 characters")),
        "{:?}",
        verified.rejected
    );
    let first = &verified.rejected[0];
    assert_eq!(
        first.to_string(),
        "streams/v1/juju-tools.json: products[\"com.ubuntu.juju:12.04:i386\"].versions\
         [\"20140530\"].items[\"1.18.4\"].sha256 \"89c9a40cc90ff8d6e4f04039ec156529\": \
         not a sha256 digest: expected 64 hexadecimal digits, found 32 characters"
    );
}

/// Doubles every 32-digit `sha256` of a products document to 64 digits.
fn double_digests(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                match member {
                    Value::String(digest) if key == "sha256" => {
                        assert_eq!(digest.len(), 32, "{digest}");
                        *digest = digest.repeat(2);
                    }
                    _ => double_digests(member),
                }
            }
        }
        Value::Array(array) => array.iter_mut().for_each(double_digests),
        _ => {}
    }
}

#[test]
fn items_inherit_release_and_arch_and_contradicting_duplicates_are_rejected() {
    // The same document with each 32-digit digest doubled to 64 digits: every item becomes
    // verifiable although none names its own release or arch, and the one binary the
    // fixture lists twice with different sizes and digests (1.18.4-trusty-armhf, in the
    // version collections 20140530 and 20140703) contradicts itself.
    let file = "streams/v1/juju-tools.json";
    let mut document = read_json(&data("shared-index-v1").join(file));
    double_digests(&mut document);
    let bytes = serde_json::to_vec(&document).unwrap();
    let products = Products::parse(file, &bytes).unwrap();
    let mut verified = products.verify(&released_tools_entry(), 4 << 30);
    assert_eq!(verified.entries.len(), 8);
    assert!(verified.rejected.is_empty(), "{:?}", verified.rejected);
    let catalogue = build_catalogue(verified.entries, &mut verified.rejected).unwrap();
    let binaries: Vec<String> = catalogue
        .entries()
        .iter()
        .map(|entry| entry.binary.to_string())
        .collect();
    assert_eq!(
        binaries,
        vec![
            "1.18.4-precise-i386",
            "1.18.4-saucy-amd64",
            "1.18.4-trusty-amd64",
            "1.20.0-trusty-amd64",
            "1.20.1-trusty-amd64",
            "1.20.1-trusty-armhf",
        ]
    );
    let inherited = &catalogue.entries()[4];
    assert_eq!(inherited.binary.release, "trusty");
    assert_eq!(inherited.binary.arch, "amd64");
    assert_eq!(inherited.stream, Stream::Released);
    assert_eq!(inherited.size_bytes, 7_361_405);
    assert_eq!(
        inherited.path,
        "tools/releases/20140703/juju-1.20.1-trusty-amd64.tgz"
    );
    assert_eq!(
        inherited.sha256.to_string(),
        "a555cc98d8a8f556a9aaf27d869153dfa555cc98d8a8f556a9aaf27d869153df"
    );
    let conflicts: Vec<&str> = verified.rejected.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        conflicts,
        vec![
            r#"products["com.ubuntu.juju:14.04:armhf"].versions["20140530"].items["1.18.4"]"#,
            r#"products["com.ubuntu.juju:14.04:armhf"].versions["20140703"].items["1.18.4"]"#,
        ]
    );
    assert!(
        verified.rejected[0].problem.starts_with(
            "1.18.4-trusty-armhf is listed 2 times in stream released with different contents"
        ),
        "{}",
        verified.rejected[0]
    );
}

#[test]
fn mirrors_json_and_mirror_info_parse() {
    let bytes = fs::read(data("shared-index-v1/streams/v1/mirrors.json")).unwrap();
    let references = parse_mirrors("streams/v1/mirrors.json", &bytes).unwrap();
    assert_eq!(references.len(), 2);
    assert_eq!(references[0].content_id, "com.ubuntu.juju:released:tools");
    assert_eq!(references[0].datatype, "content-download");
    assert_eq!(references[0].path, "streams/v1/juju-tools-mirrors.json");
    assert_eq!(
        references[0].updated.as_deref(),
        Some("Fri, 04 Jul 2014 07:30:00 +0000")
    );
    assert_eq!(references[0].clouds.len(), 2);
    assert_eq!(references[0].clouds[1].region, "RegionTwo");
    assert_eq!(references[1].path, "streams/v1/juju-tools-mirrors-lab.json");
    assert!(references[1].clouds.is_empty());

    let file = "streams/v1/juju-tools-mirrors.json";
    let bytes = fs::read(data("shared-index-v1").join(file)).unwrap();
    let mirrors = parse_mirror_info(file, &bytes).unwrap();
    let urls: Vec<(&str, &str, &str)> = mirrors
        .iter()
        .map(|m| (m.content_id.as_str(), m.mirror.as_str(), m.path.as_str()))
        .collect();
    assert_eq!(
        urls,
        vec![
            (
                "com.ubuntu.juju:released:tools",
                "https://juju.dc1.example.net/tools/",
                "streams/v1/juju-tools.json"
            ),
            (
                "com.ubuntu.juju:released:tools",
                "file:///srv/juju-tools/",
                "streams/v1/juju-tools.json"
            ),
            (
                "com.ubuntu.juju:released:tools",
                "https://archive.example.org/juju/",
                "streams/v1/juju-tools.json"
            ),
        ]
    );
    assert_eq!(mirrors[1].clouds[0].region, "RegionTwo");
    assert_eq!(
        mirrors[1].clouds[0].endpoint,
        "https://keystone.dc2.example.net:5000/v3"
    );

    let escaping = br#"{"mirrors": {"com.ubuntu.juju:released:agents": [
        {"datatype": "content-download", "path": "../../etc/passwd", "format": "mirrors:1.0"}]}}"#;
    let error = parse_mirrors("streams/v1/mirrors.json", escaping).unwrap_err();
    assert_eq!(
        error.to_string(),
        "streams/v1/mirrors.json: mirrors[\"com.ubuntu.juju:released:agents\"][0].path \
         \"../../etc/passwd\": path has a `..` component: escapes the mirror root"
    );
}

#[test]
fn malformed_index_documents_name_file_field_and_value() {
    let agents = r#""com.ubuntu.juju:released:agents""#;
    let entry = |body: &str| {
        format!(
            r#"{{"format": "index:1.0", "updated": "Thu, 01 Jan 1970 00:00:00 +0000",
                "index": {{{agents}: {{{body}}}}}}}"#
        )
    };
    let good = r#""datatype": "content-download", "format": "products:1.0", "path": "streams/v1/p.json", "products": ["com.ubuntu.juju:ubuntu:amd64"]"#;
    let cases: Vec<(String, &str)> = vec![
        (
            "{".to_owned(),
            "f: (document) (1 bytes): malformed JSON: EOF while parsing an object at line 1 column 1",
        ),
        ("[]".to_owned(), "f: (document) []: expected a JSON object"),
        (
            r#"{"format": "index:2.0"}"#.to_owned(),
            "f: format \"index:2.0\": expected \"index:1.0\"",
        ),
        (
            r#"{"format": "index:1.0"}"#.to_owned(),
            "f: updated (missing): required",
        ),
        (
            r#"{"format": "index:1.0", "updated": "yesterday", "index": {}}"#.to_owned(),
            "f: updated \"yesterday\": expected an RFC 1123 time such as \"Thu, 01 Jan 1970 \
             00:00:00 +0000\", not before 1970",
        ),
        (
            entry(&good.replace("streams/v1/p.json", "../p.json")),
            "f: index[\"com.ubuntu.juju:released:agents\"].path \"../p.json\": path has a `..` \
             component: escapes the mirror root",
        ),
        (
            entry(&good.replace("streams/v1/p.json", "/srv/p.json")),
            "f: index[\"com.ubuntu.juju:released:agents\"].path \"/srv/p.json\": absolute \
             path: escapes the mirror root",
        ),
        (
            entry(&good.replace("content-download", "image-ids")),
            "f: index[\"com.ubuntu.juju:released:agents\"].datatype \"image-ids\": expected \
             \"content-download\"",
        ),
        (
            entry(&good.replace(r#"["com.ubuntu.juju:ubuntu:amd64"]"#, "[7]")),
            "f: index[\"com.ubuntu.juju:released:agents\"].products[0] 7: expected a product \
             id string",
        ),
    ];
    for (text, expected) in cases {
        let error = Index::parse("f", text.as_bytes()).unwrap_err();
        assert_eq!(error.to_string(), expected, "{text}");
    }
    assert_eq!(
        Index::parse("f", entry(good).as_bytes())
            .unwrap()
            .entries
            .len(),
        1
    );
}
