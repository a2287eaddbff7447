//! Bad input: each case asserts a clear error and that nothing was installed or remembered.

mod common;

use std::fs;
use std::path::Path;

use common::{DAY, DAY_0, generate, listing, put_tarball, read_json, write_json};
use lockstep_core::policy::{CatalogueEntry, PolicyError, Stream};
use lockstep_streams::{
    DirectorySource, DownloadError, HighWaterMarkFile, Keyring, LookupConfig, LookupError, Source,
    SourceError, download, look_up,
};

const PRODUCTS: &str = "tools/streams/v1/com.ubuntu.juju-released-agents.json";
const CONFIG: LookupConfig = LookupConfig {
    metadata_size_bytes_max: 1 << 20,
    item_size_bytes_max: 1 << 30,
    freeze_after_seconds: 30 * DAY,
    future_skew_seconds: DAY,
    keyring: Keyring::empty(),
    allow_unsigned: true,
};

/// A mirror with two released binaries, generated at `updated`, and an empty state dir.
struct Site {
    mirror: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Site {
    fn new(updated: u64) -> Site {
        let mirror = tempfile::tempdir().unwrap();
        put_tarball(
            mirror.path(),
            Stream::Released,
            "juju-2.9.43-ubuntu-amd64.tgz",
            5_000,
        );
        put_tarball(
            mirror.path(),
            Stream::Released,
            "juju-2.9.44-ubuntu-amd64.tgz",
            9_000,
        );
        generate(mirror.path(), updated);
        Site {
            mirror,
            state: tempfile::tempdir().unwrap(),
        }
    }
    fn root(&self) -> &Path {
        self.mirror.path()
    }
    fn source(&self) -> DirectorySource {
        DirectorySource::new(self.root().join("tools")).unwrap()
    }
    fn mark(&self) -> HighWaterMarkFile {
        HighWaterMarkFile::new(self.state.path().join("streams-mark.json"))
    }
    fn look_up(&self, now: u64) -> Result<lockstep_streams::Lookup, LookupError> {
        look_up(&self.source(), &self.mark(), &CONFIG, now)
    }
    /// The mark file's bytes, or `None` when absent.
    fn remembered(&self) -> Option<Vec<u8>> {
        fs::read(self.mark().path()).ok()
    }
    fn entry(&self, version: &str) -> CatalogueEntry {
        let lookup = self.look_up(DAY_0 + DAY).unwrap();
        lookup
            .catalogue
            .entries()
            .iter()
            .find(|entry| entry.binary.number.to_string() == version)
            .unwrap()
            .clone()
    }
    fn edit_item(&self, version: &str, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.root().join(PRODUCTS);
        let mut document = read_json(&path);
        let products = document["products"].as_object_mut().unwrap();
        let product = products.get_mut("com.ubuntu.juju:ubuntu:amd64").unwrap();
        let collection = product["versions"]
            .as_object_mut()
            .unwrap()
            .values_mut()
            .next()
            .unwrap();
        edit(&mut collection["items"][format!("{version}-ubuntu-amd64")]);
        write_json(&path, &document);
    }
}

fn policy_error(error: LookupError) -> PolicyError {
    match error {
        LookupError::Policy { error, .. } => *error,
        other => panic!("expected a policy error, got {other}"),
    }
}

// ------------------------------------------------------------------ downloads

/// Downloads into an agent dir that already holds the running binary; asserts that a
/// failure leaves exactly that.
fn download_fails(site: &Site, entry: &CatalogueEntry) -> DownloadError {
    let agent = tempfile::tempdir().unwrap();
    let destination = agent.path().join("tools.tar.gz");
    fs::write(&destination, b"the running binary").unwrap();
    let error = download(&site.source(), entry, &destination, &mut |_| {}).unwrap_err();
    assert_eq!(fs::read(&destination).unwrap(), b"the running binary");
    assert_eq!(
        listing(agent.path()),
        vec!["tools.tar.gz"],
        "temporary file left behind"
    );
    error
}

fn tarball(site: &Site, version: &str) -> std::path::PathBuf {
    site.root()
        .join(format!("tools/released/juju-{version}-ubuntu-amd64.tgz"))
}

#[test]
fn tampered_binary_is_refused() {
    let site = Site::new(DAY_0);
    let entry = site.entry("2.9.44");
    let mut bytes = fs::read(tarball(&site, "2.9.44")).unwrap();
    bytes[4_321] ^= 0x01;
    fs::write(tarball(&site, "2.9.44"), &bytes).unwrap();
    let error = download_fails(&site, &entry);
    let DownloadError::HashMismatch {
        expected_sha256,
        actual_sha256,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(*expected_sha256, entry.sha256);
    assert_ne!(actual_sha256, expected_sha256);
    assert!(
        error.to_string().starts_with(&format!(
            "\"released/juju-2.9.44-ubuntu-amd64.tgz\": expected sha256 {}, got {actual_sha256}; \
             refused, nothing was installed",
            entry.sha256
        )),
        "{error}"
    );
}

#[test]
fn truncated_binary_is_refused() {
    let site = Site::new(DAY_0);
    let entry = site.entry("2.9.44");
    let bytes = fs::read(tarball(&site, "2.9.44")).unwrap();
    fs::write(tarball(&site, "2.9.44"), &bytes[..8_999]).unwrap();
    let error = download_fails(&site, &entry);
    assert_eq!(
        error,
        DownloadError::Truncated {
            path: "\"released/juju-2.9.44-ubuntu-amd64.tgz\"".to_owned(),
            expected_size_bytes: 9_000,
            actual_size_bytes: 8_999,
        }
    );
    assert!(
        error
            .to_string()
            .contains("expected 9000 bytes, the mirror sent 8999")
    );
}

#[test]
fn binary_longer_than_declared_is_refused() {
    let site = Site::new(DAY_0);
    let entry = site.entry("2.9.44");
    let mut bytes = fs::read(tarball(&site, "2.9.44")).unwrap();
    bytes.push(0);
    fs::write(tarball(&site, "2.9.44"), &bytes).unwrap();
    let error = download_fails(&site, &entry);
    assert_eq!(
        error,
        DownloadError::TooLong {
            path: "\"released/juju-2.9.44-ubuntu-amd64.tgz\"".to_owned(),
            expected_size_bytes: 9_000,
            actual_size_bytes_min: 9_001,
        }
    );
}

/// A source that lies about nothing up front and streams more than declared: the cap
/// applies while reading, not only to an announced length.
#[derive(Debug)]
struct Endless;

impl Source for Endless {
    fn location(&self) -> String {
        "test://endless".to_owned()
    }
    fn open(
        &self,
        _path: &str,
        size_bytes_max: u64,
    ) -> Result<Box<dyn std::io::Read + Send>, SourceError> {
        Ok(Box::new(lockstep_streams::source::CappedReader::new(
            std::io::repeat(7),
            size_bytes_max,
        )))
    }
}

#[test]
fn streamed_source_longer_than_declared_is_cut_at_one_byte_more() {
    let site = Site::new(DAY_0);
    let entry = site.entry("2.9.44");
    let agent = tempfile::tempdir().unwrap();
    let destination = agent.path().join("tools.tar.gz");
    let error = download(&Endless, &entry, &destination, &mut |_| {}).unwrap_err();
    assert_eq!(
        error,
        DownloadError::TooLong {
            path: "\"released/juju-2.9.44-ubuntu-amd64.tgz\"".to_owned(),
            expected_size_bytes: 9_000,
            actual_size_bytes_min: 9_001,
        }
    );
    assert!(listing(agent.path()).is_empty());
}

// ------------------------------------------------------------------ item rejections

#[test]
fn declared_size_zero_is_rejected_and_the_rest_stays_usable() {
    let site = Site::new(DAY_0);
    site.edit_item("2.9.44", |item| item["size"] = 0.into());
    let lookup = site.look_up(DAY_0 + DAY).unwrap();
    let versions: Vec<String> = lookup
        .catalogue
        .entries()
        .iter()
        .map(|entry| entry.binary.to_string())
        .collect();
    assert_eq!(versions, vec!["2.9.43-ubuntu-amd64"]);
    assert_eq!(lookup.rejected.len(), 1);
    assert_eq!(
        lookup.rejected[0].to_string(),
        format!(
            "streams/v1/com.ubuntu.juju-released-agents.json: products[\"com.ubuntu.juju:ubuntu:amd64\"]\
             .versions[\"{}\"].items[\"2.9.44-ubuntu-amd64\"].size 0: a declared size of 0 cannot \
             be verified",
            lockstep_streams::time::format_yyyymmdd(DAY_0)
        )
    );
}

#[test]
fn path_traversal_is_rejected_and_never_fetched() {
    let site = Site::new(DAY_0);
    site.edit_item("2.9.44", |item| item["path"] = "../../outside.tgz".into());
    site.edit_item("2.9.43", |item| item["path"] = "/etc/passwd".into());
    let lookup = site.look_up(DAY_0 + DAY).unwrap();
    assert!(lookup.catalogue.entries().is_empty());
    let problems: Vec<(&str, &str)> = lookup
        .rejected
        .iter()
        .map(|e| (e.value.as_str(), e.problem.as_str()))
        .collect();
    assert_eq!(
        problems,
        vec![
            ("\"/etc/passwd\"", "absolute path: escapes the mirror root"),
            (
                "\"../../outside.tgz\"",
                "path has a `..` component: escapes the mirror root"
            ),
        ]
    );

    // The source refuses such paths on its own, and symbolic links leading out.
    let source = site.source();
    let Err(error) = source.open("../outside.tgz", 100) else {
        panic!("opened a path outside the root");
    };
    assert!(matches!(error, SourceError::InvalidPath { .. }), "{error}");
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"secret").unwrap();
    std::os::unix::fs::symlink(outside.path(), site.root().join("tools/link")).unwrap();
    let Err(error) = source.open("link/secret", 100) else {
        panic!("followed a link outside the root");
    };
    assert_eq!(
        error.to_string(),
        format!(
            "refused to fetch \"link/secret\" from {}: resolves (through a symbolic link) \
             outside the mirror root; the metadata names a path outside the mirror: regenerate \
             the mirror's metadata",
            source.location()
        )
    );
}

#[test]
fn duplicated_items_with_different_hashes_are_rejected_and_the_rest_stays_usable() {
    let site = Site::new(DAY_0);
    let path = site.root().join(PRODUCTS);
    let mut document = read_json(&path);
    let product = &mut document["products"]["com.ubuntu.juju:ubuntu:amd64"]["versions"];
    let mut older = product
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .clone();
    older["items"]["2.9.44-ubuntu-amd64"]["sha256"] = "00".repeat(32).into();
    older["items"]
        .as_object_mut()
        .unwrap()
        .remove("2.9.43-ubuntu-amd64");
    product["20200101"] = older;
    write_json(&path, &document);

    let lookup = site.look_up(DAY_0 + DAY).unwrap();
    let versions: Vec<String> = lookup
        .catalogue
        .entries()
        .iter()
        .map(|entry| entry.binary.number.to_string())
        .collect();
    assert_eq!(versions, vec!["2.9.43"]);
    assert_eq!(lookup.rejected.len(), 2);
    for rejection in &lookup.rejected {
        assert!(
            rejection.problem.starts_with(
                "2.9.44-ubuntu-amd64 is listed 2 times in stream released with different contents"
            ),
            "{rejection}"
        );
        assert!(rejection.problem.contains(&"00".repeat(32)), "{rejection}");
    }
}

// ------------------------------------------------------------------ whole-document refusals

#[test]
fn malformed_json_is_refused_and_nothing_remembered() {
    let site = Site::new(DAY_0);
    fs::write(site.root().join(PRODUCTS), b"{\"products\": {").unwrap();
    let error = site.look_up(DAY_0 + DAY).unwrap_err();
    assert_eq!(
        error.to_string(),
        "streams/v1/com.ubuntu.juju-released-agents.json: (document) (14 bytes): malformed \
         JSON: EOF while parsing an object at line 1 column 14"
    );
    assert_eq!(site.remembered(), None);
}

#[test]
fn metadata_rolled_back_to_an_older_updated_is_refused_and_the_mark_kept() {
    let site = Site::new(DAY_0 + 10 * DAY);
    site.look_up(DAY_0 + 11 * DAY).unwrap();
    let remembered = site.remembered().unwrap();
    // The mirror is regenerated with an older time: a replay of older metadata.
    generate(site.root(), DAY_0 + 5 * DAY);
    let error = policy_error(site.look_up(DAY_0 + 11 * DAY).unwrap_err());
    assert_eq!(
        error,
        PolicyError::MetadataRollback {
            metadata_updated_unix_seconds: DAY_0 + 5 * DAY,
            accepted_updated_unix_seconds: DAY_0 + 10 * DAY,
        }
    );
    assert_eq!(site.remembered().unwrap(), remembered);
}

#[test]
fn frozen_metadata_is_refused_and_nothing_remembered() {
    let site = Site::new(DAY_0);
    let error = site.look_up(DAY_0 + 30 * DAY + 1).unwrap_err();
    assert!(
        error.to_string().contains("possible freeze attack"),
        "{error}"
    );
    assert_eq!(
        policy_error(error),
        PolicyError::MetadataFrozen {
            metadata_updated_unix_seconds: DAY_0,
            now_unix_seconds: DAY_0 + 30 * DAY + 1,
            freeze_after_seconds: 30 * DAY,
        }
    );
    assert_eq!(site.remembered(), None);
    // Exactly at the bound is still fresh.
    site.look_up(DAY_0 + 30 * DAY).unwrap();
}

#[test]
fn metadata_dated_past_the_skew_is_refused_unremembered_and_genuine_metadata_after_it_accepted() {
    // A mirror announces metadata dated ten years ahead: were it remembered, every genuine
    // catalogue after it would be refused as a rollback.
    let site = Site::new(DAY_0 + 3_650 * DAY);
    let error = site.look_up(DAY_0).unwrap_err();
    assert!(
        error.to_string().contains("refused, and not remembered"),
        "{error}"
    );
    assert_eq!(
        policy_error(error),
        PolicyError::MetadataFromTheFuture {
            metadata_updated_unix_seconds: DAY_0 + 3_650 * DAY,
            now_unix_seconds: DAY_0,
            future_skew_seconds: DAY,
        }
    );
    assert_eq!(site.remembered(), None);
    // The genuine metadata, served next, is accepted and becomes the mark.
    generate(site.root(), DAY_0);
    site.look_up(DAY_0).unwrap();
    assert_eq!(
        String::from_utf8(site.remembered().unwrap()).unwrap(),
        format!("{{\"updated_unix_seconds\":{DAY_0},\"version\":\"2.9.44\"}}")
    );
    // Exactly the skew ahead is still admitted (a controller whose clock is slow).
    generate(site.root(), DAY_0 + 2 * DAY);
    site.look_up(DAY_0 + DAY).unwrap();
}

/// A directory source that stops before its first products file until released, so that a
/// test can interleave a second lookup.
#[derive(Debug)]
struct Paused {
    inner: DirectorySource,
    reached: std::sync::mpsc::SyncSender<()>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Source for Paused {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn open(
        &self,
        path: &str,
        size_bytes_max: u64,
    ) -> Result<Box<dyn std::io::Read + Send>, SourceError> {
        if path.contains("com.ubuntu.juju-released-agents") {
            self.reached.send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        self.inner.open(path, size_bytes_max)
    }
}

#[test]
fn a_lookup_that_lost_the_race_to_newer_metadata_is_refused_and_the_mark_never_moves_back() {
    // Two lookups share one mark (the driver's and the API's): the first reads older
    // metadata and is held before its products file; the second accepts newer metadata
    // meanwhile. Released, the first must not write its older mark over the newer one.
    let older = Site::new(DAY_0 + DAY);
    let newer = Site::new(DAY_0 + 2 * DAY);
    let mark = newer.mark();
    let (reached_tx, reached) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::channel();
    let paused = Paused {
        inner: older.source(),
        reached: reached_tx,
        release: std::sync::Mutex::new(release_rx),
    };
    let first = std::thread::scope(|scope| {
        let first = scope.spawn(|| look_up(&paused, &mark, &CONFIG, DAY_0 + 2 * DAY));
        reached.recv().unwrap();
        newer.look_up(DAY_0 + 2 * DAY).unwrap();
        let accepted = newer.remembered().unwrap();
        release.send(()).unwrap();
        let first = first.join().unwrap();
        assert_eq!(newer.remembered().unwrap(), accepted, "the mark moved back");
        first
    });
    assert_eq!(
        policy_error(first.unwrap_err()),
        PolicyError::MetadataRollback {
            metadata_updated_unix_seconds: DAY_0 + DAY,
            accepted_updated_unix_seconds: DAY_0 + 2 * DAY,
        }
    );
}

#[test]
fn catalogue_that_lost_the_newest_version_is_refused_and_the_mark_kept() {
    let site = Site::new(DAY_0);
    site.look_up(DAY_0).unwrap();
    let remembered = site.remembered().unwrap();
    fs::remove_file(tarball(&site, "2.9.44")).unwrap();
    generate(site.root(), DAY_0 + DAY);
    let error = policy_error(site.look_up(DAY_0 + DAY).unwrap_err());
    assert!(
        matches!(error, PolicyError::VersionRollback { .. }),
        "{error}"
    );
    assert_eq!(site.remembered().unwrap(), remembered);
}

#[test]
fn products_file_swapped_from_another_index_is_refused_and_nothing_remembered() {
    let site = Site::new(DAY_0);
    let other = tempfile::tempdir().unwrap();
    put_tarball(
        other.path(),
        Stream::Devel,
        "juju-2.9.44-ubuntu-amd64.tgz",
        9_000,
    );
    generate(other.path(), DAY_0);
    // The released path answers with another mirror's devel products file.
    fs::copy(
        other
            .path()
            .join("tools/streams/v1/com.ubuntu.juju-devel-agents.json"),
        site.root().join(PRODUCTS),
    )
    .unwrap();
    let error = site.look_up(DAY_0 + DAY).unwrap_err();
    let LookupError::Metadata(error) = error else {
        panic!("{error}");
    };
    assert_eq!(error.field, "content_id");
    assert_eq!(error.value, "\"com.ubuntu.juju:devel:agents\"");
    assert!(
        error.problem.contains("possible mix-and-match attack"),
        "{error}"
    );
    assert_eq!(site.remembered(), None);
}

#[test]
fn oversized_metadata_is_refused_before_parsing() {
    let site = Site::new(DAY_0);
    let config = LookupConfig {
        metadata_size_bytes_max: 64,
        ..CONFIG
    };
    let error = look_up(&site.source(), &site.mark(), &config, DAY_0).unwrap_err();
    let LookupError::Source(SourceError::TooLarge {
        path,
        size_bytes_max: 64,
        announced_size_bytes: Some(_),
        ..
    }) = &error
    else {
        panic!("{error}");
    };
    assert_eq!(path, "\"streams/v1/index2.json\"");
    assert_eq!(site.remembered(), None);
}

#[test]
fn corrupt_mark_file_is_an_error_not_a_fresh_start() {
    let site = Site::new(DAY_0);
    fs::write(site.mark().path(), b"{\"updated_unix_seconds\": \"soon\"}").unwrap();
    let error = site.look_up(DAY_0).unwrap_err();
    assert!(matches!(error, LookupError::State(_)), "{error}");
    assert!(error.to_string().contains("corrupt"), "{error}");
}

#[test]
fn missing_index_names_what_was_looked_for() {
    let empty = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let source = DirectorySource::new(empty.path()).unwrap();
    let mark = HighWaterMarkFile::new(state.path().join("mark.json"));
    let error = look_up(&source, &mark, &CONFIG, DAY_0).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "\"streams/v1/index.json\" not found at {}; check agent-metadata-url and that the \
             mirror is complete",
            source.location()
        )
    );
}
