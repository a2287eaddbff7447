//! The mirror generator, round-tripped through lookup, the core's policy and download.

mod common;

use std::collections::BTreeSet;
use std::fs;

use common::{DAY, DAY_0, data, generate, listing, put_tarball, read_json};
use lockstep_core::Binary;
use lockstep_core::policy::{Decision, Occasion, SelectionRequest, Stream, UpgradePolicy, select};
use lockstep_streams::metadata::{INDEX_PATH, Index, LEGACY_INDEX_PATH};
use lockstep_streams::{
    DirectorySource, GenerateOptions, HighWaterMarkFile, LookupConfig, download,
    generate_agent_binaries, look_up,
};
use serde_json::Value;

#[test]
fn generated_mirror_round_trips_through_lookup_policy_and_download() {
    let site = tempfile::tempdir().unwrap();
    let root = site.path();
    put_tarball(
        root,
        Stream::Released,
        "juju-2.9.43-ubuntu-amd64.tgz",
        3_000,
    );
    let newest = put_tarball(
        root,
        Stream::Released,
        "juju-2.9.44-ubuntu-amd64.tgz",
        70_000,
    );
    let proposed = put_tarball(
        root,
        Stream::Proposed,
        "juju-2.9.45-ubuntu-amd64.tgz",
        1_000,
    );
    put_tarball(root, Stream::Released, "juju-3.6.1-linux-arm64.tgz", 500);
    put_tarball(root, Stream::Released, "README", 10);
    put_tarball(root, Stream::Released, "juju-not-a-version.tgz", 10);
    put_tarball(root, Stream::Released, "juju-2.9.46-ubuntu-amd64.tgz", 0);

    let generated = generate(root, DAY_0);
    assert_eq!(
        generated.files_written,
        vec![
            "streams/v1/com.ubuntu.juju-released-agents.json",
            "streams/v1/com.ubuntu.juju-proposed-agents.json",
            LEGACY_INDEX_PATH,
            INDEX_PATH,
        ]
    );
    let skipped: Vec<&str> = generated
        .skipped
        .iter()
        .map(|(path, _)| path.as_str())
        .collect();
    assert_eq!(
        skipped,
        vec![
            "released/README",
            "released/juju-2.9.46-ubuntu-amd64.tgz",
            "released/juju-not-a-version.tgz",
        ]
    );
    // A linux binary is listed for Juju's alternative releases too.
    assert_eq!(generated.entries.len(), 3 + 4);

    let state = tempfile::tempdir().unwrap();
    let mark = HighWaterMarkFile::new(state.path().join("mark.json"));
    let source =
        DirectorySource::from_url(&format!("file://{}", root.join("tools").display())).unwrap();
    let lookup = look_up(
        &source,
        &mark,
        &LookupConfig::allowing_unsigned(),
        DAY_0 + DAY,
    )
    .unwrap();
    assert!(lookup.rejected.is_empty(), "{:?}", lookup.rejected);
    assert_eq!(lookup.catalogue.entries(), &generated.entries[..]);
    let releases: BTreeSet<&str> = lookup
        .catalogue
        .entries()
        .iter()
        .filter(|entry| entry.binary.number.major == 3)
        .map(|entry| entry.binary.release.as_str())
        .collect();
    assert_eq!(
        releases,
        ["centos", "genericlinux", "linux", "ubuntu"]
            .into_iter()
            .collect()
    );
    let remembered = mark.load().unwrap();
    assert_eq!(remembered.updated_unix_seconds, Some(DAY_0));
    assert_eq!(remembered.version.unwrap().to_string(), "3.6.1");

    let running = Binary::parse("2.9.43-ubuntu-amd64").unwrap();
    let request = SelectionRequest {
        running: &running,
        policy: &UpgradePolicy::AutoPatch,
        stream: None,
        occasion: Occasion::Bootstrap,
    };
    let Decision::Upgrade { entry } = select(&request, &lookup.catalogue).unwrap() else {
        panic!("expected an upgrade");
    };
    assert_eq!(entry.binary.to_string(), "2.9.44-ubuntu-amd64");
    assert_eq!(entry.path, "released/juju-2.9.44-ubuntu-amd64.tgz");

    let agent = tempfile::tempdir().unwrap();
    let destination = agent.path().join("tools.tar.gz");
    let mut reports = Vec::new();
    download(&source, &entry, &destination, &mut |progress| {
        reports.push(progress)
    })
    .unwrap();
    assert_eq!(fs::read(&destination).unwrap(), newest);
    assert_eq!(listing(agent.path()), vec!["tools.tar.gz"]);
    assert_eq!(reports.last().unwrap().received_bytes, 70_000);
    assert!(reports.iter().all(|report| report.total_bytes == 70_000));
    assert!(
        reports
            .windows(2)
            .all(|pair| pair[0].received_bytes < pair[1].received_bytes)
    );

    // With agent-stream=proposed, the proposed patch wins.
    let request = SelectionRequest {
        stream: Some(Stream::Proposed),
        ..request
    };
    let Decision::Upgrade { entry } = select(&request, &lookup.catalogue).unwrap() else {
        panic!("expected an upgrade");
    };
    assert_eq!(entry.binary.to_string(), "2.9.45-ubuntu-amd64");
    assert_eq!(entry.stream, Stream::Proposed);
    download(&source, &entry, &destination, &mut |_| {}).unwrap();
    assert_eq!(fs::read(&destination).unwrap(), proposed);
}

/// The keys present at each level of a products document: document, product, version
/// collection, item.
fn products_shape(document: &Value) -> [BTreeSet<String>; 4] {
    let keys = |value: &Value| -> BTreeSet<String> {
        value.as_object().unwrap().keys().cloned().collect()
    };
    let mut shape: [BTreeSet<String>; 4] = Default::default();
    shape[0] = keys(document);
    for product in document["products"].as_object().unwrap().values() {
        shape[1].extend(keys(product));
        for collection in product["versions"].as_object().unwrap().values() {
            shape[2].extend(keys(collection));
            for item in collection["items"].as_object().unwrap().values() {
                shape[3].extend(keys(item));
            }
        }
    }
    shape
}

#[test]
fn generated_documents_have_juju_s_fields_and_names() {
    let site = tempfile::tempdir().unwrap();
    let root = site.path();
    put_tarball(root, Stream::Released, "juju-2.9.43-ubuntu-amd64.tgz", 100);
    put_tarball(root, Stream::Devel, "juju-3.7-beta1-ubuntu-arm64.tgz", 100);
    generate(root, 0);
    let v1 = root.join("tools/streams/v1");

    let ours = read_json(&v1.join("com.ubuntu.juju-released-agents.json"));
    // The same fields at every level as the Juju-3-format fixture (tests/data/agents-v3).
    let fixture = read_json(&data(
        "agents-v3/streams/v1/com.ubuntu.juju-released-agents.json",
    ));
    assert_eq!(products_shape(&ours), products_shape(&fixture));
    assert_eq!(ours["content_id"], "com.ubuntu.juju:released:agents");
    assert_eq!(ours["updated"], "Thu, 01 Jan 1970 00:00:00 +0000");
    let item = &ours["products"]["com.ubuntu.juju:ubuntu:amd64"]["versions"]["19700101"]["items"]["2.9.43-ubuntu-amd64"];
    assert_eq!(item["path"], "released/juju-2.9.43-ubuntu-amd64.tgz");
    assert_eq!(item["size"], 100);
    assert_eq!(item["ftype"], "tar.gz");

    // index2.json has every stream, index.json the released stream only, each entry with
    // the fields of the fixture's legacy index.
    let index2 = read_json(&v1.join("index2.json"));
    // Compared as a set: serde_json may keep insertion order (a dependency turns
    // `preserve_order` on), and the order of an object's keys carries no meaning.
    let ids: BTreeSet<&String> = index2["index"].as_object().unwrap().keys().collect();
    assert_eq!(
        ids.into_iter().map(String::as_str).collect::<Vec<_>>(),
        vec![
            "com.ubuntu.juju:devel:agents",
            "com.ubuntu.juju:released:agents"
        ]
    );
    let legacy = read_json(&v1.join("index.json"));
    let fixture_legacy = read_json(&data("agents-v3/streams/v1/index.json"));
    let entry = |index: &Value| -> BTreeSet<String> {
        index["index"]["com.ubuntu.juju:released:agents"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(entry(&legacy), entry(&fixture_legacy));
    assert_eq!(legacy["index"].as_object().unwrap().len(), 1);
    assert_eq!(
        legacy["index"]["com.ubuntu.juju:released:agents"]["path"],
        "streams/v1/com.ubuntu.juju-released-agents.json"
    );
    let parsed = Index::parse("index2.json", &fs::read(v1.join("index2.json")).unwrap()).unwrap();
    let devel = parsed
        .entries
        .iter()
        .find(|entry| entry.stream == Stream::Devel)
        .expect("the devel stream is indexed");
    assert_eq!(devel.product_ids, vec!["com.ubuntu.juju:ubuntu:arm64"]);
}

#[test]
fn generator_refuses_a_directory_without_binaries() {
    let site = tempfile::tempdir().unwrap();
    fs::create_dir_all(site.path().join("tools/released")).unwrap();
    let error = generate_agent_binaries(
        site.path(),
        &GenerateOptions {
            now_unix_seconds: 0,
        },
    )
    .unwrap_err();
    assert!(
        error.problem.starts_with("no agent binaries found"),
        "{error}"
    );
    assert!(!site.path().join("tools/streams").exists());
}
