//! The data directory and agent tarballs: hand-built malicious archives are refused and
//! leave nothing behind; installs, switches and `agent.conf` writes are atomic, idempotent
//! and leave no temporary files.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lockstep_agent::datadir::{
    self, AgentConf, DataDir, DataDirError, DownloadedTools, read_force_version,
};
use lockstep_agent::unpack::extensions::ExtensionProblem;
use lockstep_agent::unpack::{
    DestinationProblem, NameProblem, UnpackError, UnpackLimits, UnpackProblem, pack_tgz, unpack_tgz,
};
use lockstep_core::lifecycle::{Snapshot, Trial};
use lockstep_core::policy::Sha256;
use lockstep_core::steps::StepKey;
use lockstep_core::{Binary, Version};
use sha2::Digest;
use tar::{EntryType, Header};

// ---------------------------------------------------------------------------------------
// Hand-built archives
// ---------------------------------------------------------------------------------------

/// One raw entry: the name bytes go straight into the header, bypassing the tar crate's
/// own checks, so `../x` and `/etc/x` can be written.
struct Raw<'a> {
    name: &'a [u8],
    kind: EntryType,
    mode: u32,
    data: &'a [u8],
    link: Option<&'a [u8]>,
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> Raw<'a> {
    Raw {
        name: name.as_bytes(),
        kind: EntryType::Regular,
        mode: 0o755,
        data,
        link: None,
    }
}

fn special(name: &str, kind: EntryType) -> Raw<'_> {
    Raw {
        name: name.as_bytes(),
        kind,
        mode: 0o644,
        data: b"",
        link: None,
    }
}

fn gzip_tar(tar: &[u8], out: &Path) {
    let mut encoder =
        flate2::write::GzEncoder::new(fs::File::create(out).unwrap(), Default::default());
    encoder.write_all(tar).unwrap();
    encoder.finish().unwrap();
}

fn raw_tar(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = Header::new_ustar();
        header.as_old_mut().name[..entry.name.len()].copy_from_slice(entry.name);
        header.set_entry_type(entry.kind);
        header.set_mode(entry.mode);
        header.set_size(entry.data.len() as u64);
        if let Some(link) = entry.link {
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        }
        header.set_cksum();
        builder.append(&header, entry.data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn archive(dir: &Path, entries: &[Raw<'_>]) -> PathBuf {
    let path = dir.join("agent.tgz");
    gzip_tar(&raw_tar(entries), &path);
    path
}

struct Fixture {
    _temporary: tempfile::TempDir,
    root: PathBuf,
    destination: PathBuf,
}

fn fixture() -> Fixture {
    let temporary = tempfile::tempdir().unwrap();
    let root = temporary.path().to_path_buf();
    let destination = root.join("inner").join("destination");
    fs::create_dir_all(&destination).unwrap();
    Fixture {
        _temporary: temporary,
        root,
        destination,
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Unpacks `entries`, expects a refusal, and checks nothing was left anywhere.
fn refused(entries: &[Raw<'_>], limits: &UnpackLimits) -> UnpackError {
    let fixture = fixture();
    let tarball = archive(&fixture.root, entries);
    let error = unpack_tgz(&tarball, &fixture.destination, limits).unwrap_err();
    assert_eq!(
        listing(&fixture.destination),
        Vec::<String>::new(),
        "{error}"
    );
    assert_eq!(
        listing(&fixture.root.join("inner")),
        ["destination"],
        "{error}"
    );
    assert_eq!(listing(&fixture.root), ["agent.tgz", "inner"], "{error}");
    assert!(
        error.to_string().contains(&tarball.display().to_string()),
        "the error names the archive: {error}"
    );
    error
}

// ---------------------------------------------------------------------------------------
// unpack_tgz
// ---------------------------------------------------------------------------------------

#[test]
fn a_flat_tarball_unpacks_private_with_the_owner_s_executable_bit_and_nothing_else_of_its_mode() {
    let fixture = fixture();
    let tarball = archive(
        &fixture.root,
        &[
            Raw {
                mode: 0o6755,
                ..file("lockstepd", b"#!/bin/sh\necho lockstepd\n")
            },
            Raw {
                mode: 0o666,
                ..file("FORCE-VERSION", b"2.9.44\n")
            },
            Raw {
                mode: 0o1700,
                ..file("README", b"")
            },
        ],
    );
    let names = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap();
    assert_eq!(names, ["lockstepd", "FORCE-VERSION", "README"]);
    let mode = |name: &str| {
        fs::metadata(fixture.destination.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(
        mode("lockstepd"),
        0o700,
        "setuid and setgid dropped, private to the agent's user"
    );
    assert_eq!(mode("FORCE-VERSION"), 0o600, "never readable by others");
    assert_eq!(
        mode("README"),
        0o700,
        "sticky dropped, the owner's executable bit kept"
    );
    assert_eq!(
        fs::read(fixture.destination.join("lockstepd")).unwrap(),
        b"#!/bin/sh\necho lockstepd\n"
    );
}

#[test]
fn names_that_leave_the_destination_are_refused() {
    let cases: [(&str, NameProblem); 7] = [
        ("../x", NameProblem::ParentDirectory),
        ("../../../../../../tmp/x", NameProblem::ParentDirectory),
        ("/etc/x", NameProblem::Absolute),
        ("bin/lockstepd", NameProblem::Slash),
        ("./lockstepd", NameProblem::Slash),
        ("..\\x", NameProblem::ParentDirectory),
        ("bin\\lockstepd", NameProblem::Backslash),
    ];
    for (name, expected) in cases {
        let error = refused(&[file(name, b"evil")], &UnpackLimits::default());
        assert!(
            matches!(error.problem, UnpackProblem::Name(problem) if problem == expected),
            "{name}: {error}"
        );
        assert_eq!(error.entry.as_deref(), Some(name));
        assert!(error.to_string().contains(&format!("{name:?}")), "{error}");
    }
    let error = refused(
        &[special("..", EntryType::Regular)],
        &UnpackLimits::default(),
    );
    assert!(matches!(
        error.problem,
        UnpackProblem::Name(NameProblem::ParentDirectory)
    ));
    let error = refused(
        &[special(".", EntryType::Regular)],
        &UnpackLimits::default(),
    );
    assert!(matches!(
        error.problem,
        UnpackProblem::Name(NameProblem::CurrentDirectory)
    ));
    let error = refused(
        &[Raw {
            name: b"lockstepd\xff",
            ..file("", b"")
        }],
        &UnpackLimits::default(),
    );
    assert!(matches!(
        error.problem,
        UnpackProblem::Name(NameProblem::NotUtf8)
    ));
}

#[test]
fn an_entry_after_a_good_one_that_is_refused_removes_the_good_one() {
    let error = refused(
        &[file("lockstepd", b"good"), file("../x", b"evil")],
        &UnpackLimits::default(),
    );
    assert_eq!(error.entry.as_deref(), Some("../x"));
}

#[test]
fn links_directories_and_special_files_are_refused() {
    let symlink = Raw {
        link: Some(b"/etc/passwd"),
        ..special("lockstepd", EntryType::Symlink)
    };
    let hardlink = Raw {
        link: Some(b"/etc/passwd"),
        ..special("lockstepd", EntryType::Link)
    };
    let cases = [
        (symlink, "symlink"),
        (hardlink, "hard link"),
        (special("tools", EntryType::Directory), "directory"),
        (special("pipe", EntryType::Fifo), "fifo"),
        (special("tty", EntryType::Char), "character device"),
        (special("disk", EntryType::Block), "block device"),
        (special("sparse", EntryType::GNUSparse), "GNU sparse file"),
    ];
    for (entry, kind) in cases {
        // After a good file, to check it is cleaned up too.
        let error = refused(
            &[file("FORCE-VERSION", b"1.2.3"), entry],
            &UnpackLimits::default(),
        );
        assert!(
            matches!(error.problem, UnpackProblem::NotRegular { kind: found } if found == kind),
            "{kind}: {error}"
        );
        assert!(error.to_string().contains(&format!("a {kind}")), "{error}");
    }
}

#[test]
fn extension_headers_name_the_next_file_and_its_name_rules_still_apply() {
    let fixture = fixture();
    let tarball = fixture.root.join("agent.tgz");
    // A GNU long name, as the tar crate writes for a long path with a GNU header: the file
    // gets its 150-byte name.
    let long = "x".repeat(150);
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o755);
    builder
        .append_data(&mut header, &long, &b"good"[..])
        .unwrap();
    gzip_tar(&builder.into_inner().unwrap(), &tarball);
    unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap();
    assert_eq!(listing(&fixture.destination), vec![long.clone()]);
    assert_eq!(
        std::fs::read(fixture.destination.join(&long)).unwrap(),
        b"good"
    );
    std::fs::remove_file(fixture.destination.join(&long)).unwrap();

    // A long name past NAME_MAX: refused by the name rule, as a ustar name would be.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o755);
    builder
        .append_data(&mut header, "y".repeat(300), &b"evil"[..])
        .unwrap();
    gzip_tar(&builder.into_inner().unwrap(), &tarball);
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::Name(NameProblem::TooLong)),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());

    // A PAX header that would rename the next entry to ../x: the traversal rule applies to
    // the effective name.
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_pax_extensions([("path", &b"../x"[..])])
        .unwrap();
    builder
        .append(&raw_header("lockstepd", 4), &b"evil"[..])
        .unwrap();
    gzip_tar(&builder.into_inner().unwrap(), &tarball);
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Name(NameProblem::ParentDirectory)
        ),
        "{error}"
    );
    assert_eq!(error.entry.as_deref(), Some("../x"), "{error}");
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());
    assert!(!fixture.root.join("x").exists());

    // A PAX link target: refused, whatever entry follows.
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_pax_extensions([("linkpath", &b"/etc/shadow"[..])])
        .unwrap();
    builder
        .append(&raw_header("lockstepd", 4), &b"evil"[..])
        .unwrap();
    gzip_tar(&builder.into_inner().unwrap(), &tarball);
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(
            &error.problem,
            UnpackProblem::Extension(ExtensionProblem::Unsupported { key, .. }) if key == "linkpath"
        ),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());
}

fn raw_header(name: &str, size: u64) -> Header {
    let mut header = Header::new_ustar();
    header.set_path(name).unwrap();
    header.set_size(size);
    header.set_mode(0o755);
    header.set_cksum();
    header
}

#[test]
fn the_byte_and_entry_limits_hold_before_anything_is_read() {
    let limits = UnpackLimits {
        total_bytes_max: 10,
        entries_max: 2,
    };
    let error = refused(&[file("lockstepd", &[0u8; 11])], &limits);
    assert!(
        matches!(
            error.problem,
            UnpackProblem::TooManyBytes {
                size_bytes: 11,
                total_bytes_max: 10
            }
        ),
        "{error}"
    );
    // The total counts: 6 + 5 is over 10.
    let error = refused(
        &[
            file("lockstepd", &[0u8; 6]),
            file("FORCE-VERSION", &[0u8; 5]),
        ],
        &limits,
    );
    assert!(
        matches!(error.problem, UnpackProblem::TooManyBytes { .. }),
        "{error}"
    );
    assert_eq!(error.entry.as_deref(), Some("FORCE-VERSION"));
    let error = refused(
        &[file("a", b"1"), file("b", b"2"), file("c", b"3")],
        &limits,
    );
    assert!(
        matches!(
            error.problem,
            UnpackProblem::TooManyEntries { entries_max: 2 }
        ),
        "{error}"
    );
    // Exactly at the limits is accepted.
    let fixture = fixture();
    let tarball = archive(&fixture.root, &[file("a", &[1u8; 5]), file("b", &[2u8; 5])]);
    assert_eq!(
        unpack_tgz(&tarball, &fixture.destination, &limits).unwrap(),
        ["a", "b"]
    );
    // The defaults are Juju-sized.
    assert_eq!(
        UnpackLimits::default(),
        UnpackLimits {
            total_bytes_max: 1 << 30,
            entries_max: 64
        }
    );
}

#[test]
fn a_declared_size_larger_than_the_gzip_stream_is_not_believed() {
    // A header claiming 1 GiB with a few bytes behind it: refused by the limit, without
    // reading (or allocating) anything.
    let mut tar = raw_tar(&[file("lockstepd", b"x")]);
    let mut header = Header::new_ustar();
    header.as_mut_bytes().copy_from_slice(&tar[..512]);
    header.set_size(1 << 40);
    header.set_cksum();
    tar[..512].copy_from_slice(header.as_bytes());
    let fixture = fixture();
    let tarball = fixture.root.join("agent.tgz");
    gzip_tar(&tar, &tarball);
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::TooManyBytes { .. }),
        "{error}"
    );
}

#[test]
fn duplicates_truncation_and_garbage_are_refused() {
    let error = refused(
        &[file("lockstepd", b"one"), file("lockstepd", b"two")],
        &UnpackLimits::default(),
    );
    assert!(matches!(error.problem, UnpackProblem::Duplicate), "{error}");

    // Cut inside the data of the second entry.
    let tar = raw_tar(&[
        file("FORCE-VERSION", b"1.2.3"),
        file("lockstepd", &[7u8; 4096]),
    ]);
    let fixture = fixture();
    let tarball = fixture.root.join("agent.tgz");
    gzip_tar(&tar[..512 * 2 + 512 + 1000], &tarball);
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Truncated { .. } | UnpackProblem::Corrupt { .. }
        ),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());

    fs::write(&tarball, b"this is not gzip").unwrap();
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::Corrupt { .. }),
        "{error}"
    );

    let error = unpack_tgz(
        &fixture.root.join("missing.tgz"),
        &fixture.destination,
        &UnpackLimits::default(),
    )
    .unwrap_err();
    assert!(matches!(error.problem, UnpackProblem::Io { .. }), "{error}");
}

#[test]
fn the_destination_must_be_an_existing_empty_directory() {
    let fixture = fixture();
    let tarball = archive(&fixture.root, &[file("lockstepd", b"x")]);
    fs::write(fixture.destination.join("old"), b"").unwrap();
    let error = unpack_tgz(&tarball, &fixture.destination, &UnpackLimits::default()).unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Destination {
                problem: DestinationProblem::NotEmpty,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("the directory is not empty"),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), ["old"]);
    let error = unpack_tgz(
        &tarball,
        &fixture.root.join("nowhere"),
        &UnpackLimits::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Destination {
                problem: DestinationProblem::Unreadable(_),
                ..
            }
        ),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------
// pack_tgz
// ---------------------------------------------------------------------------------------

#[test]
fn packed_tarballs_are_reproducible_and_unpack_to_what_was_packed() {
    let fixture = fixture();
    let exe = fixture.root.join("exe");
    fs::write(&exe, b"#!/bin/sh\n").unwrap();
    let version = fixture.root.join("version");
    fs::write(&version, b"2.9.44\n").unwrap();
    let entries = [
        ("lockstepd", exe.as_path(), 0o755),
        ("FORCE-VERSION", version.as_path(), 0o644),
    ];
    let first = fixture.root.join("juju-2.9.44-ubuntu-amd64.tgz");
    let second = fixture.root.join("again.tgz");
    pack_tgz(&entries, &first).unwrap();
    pack_tgz(&entries, &second).unwrap();
    assert_eq!(fs::read(&first).unwrap(), fs::read(&second).unwrap());
    let names = unpack_tgz(&first, &fixture.destination, &UnpackLimits::default()).unwrap();
    assert_eq!(names, ["lockstepd", "FORCE-VERSION"]);
    assert_eq!(
        fs::read(fixture.destination.join("FORCE-VERSION")).unwrap(),
        b"2.9.44\n"
    );
    // No temporary file beside the archives.
    assert_eq!(
        listing(&fixture.root),
        [
            "again.tgz",
            "exe",
            "inner",
            "juju-2.9.44-ubuntu-amd64.tgz",
            "version"
        ]
    );
}

#[test]
fn pack_refuses_what_unpack_would_refuse() {
    let fixture = fixture();
    let exe = fixture.root.join("exe");
    fs::write(&exe, b"x").unwrap();
    let out = fixture.root.join("out.tgz");
    let error = pack_tgz(&[("../lockstepd", exe.as_path(), 0o755)], &out).unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Name(NameProblem::ParentDirectory)
        ),
        "{error}"
    );
    let error = pack_tgz(&[("lockstepd", exe.as_path(), 0o4755)], &out).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::Mode { mode: 0o4755 }),
        "{error}"
    );
    let error = pack_tgz(
        &[
            ("lockstepd", exe.as_path(), 0o755),
            ("lockstepd", exe.as_path(), 0o755),
        ],
        &out,
    )
    .unwrap_err();
    assert!(matches!(error.problem, UnpackProblem::Duplicate), "{error}");
    let error = pack_tgz(&[("lockstepd", fixture.root.as_path(), 0o755)], &out).unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");
    assert!(!out.exists());
}

// ---------------------------------------------------------------------------------------
// The data directory
// ---------------------------------------------------------------------------------------

fn binary(text: &str) -> Binary {
    Binary::parse(text).unwrap()
}

fn sha256_of(bytes: &[u8]) -> Sha256 {
    Sha256(sha2::Sha256::digest(bytes).into())
}

/// Packs a tarball holding `lockstepd` with `script`; returns it with its metadata.
fn tarball(dir: &Path, binary: &Binary, script: &[u8], mode: u32) -> (PathBuf, DownloadedTools) {
    let exe = dir.join(format!("exe-{binary}"));
    fs::write(&exe, script).unwrap();
    let path = dir.join(format!("juju-{binary}.tgz"));
    pack_tgz(&[("lockstepd", exe.as_path(), mode)], &path).unwrap();
    let bytes = fs::read(&path).unwrap();
    let tools = DownloadedTools {
        version: binary.clone(),
        url: format!("https://streams.example/agents/juju-{binary}.tgz"),
        sha256: sha256_of(&bytes),
        size_bytes: bytes.len() as u64,
        download_rate: None,
    };
    (path, tools)
}

fn data_dir() -> (tempfile::TempDir, DataDir) {
    let temporary = tempfile::tempdir().unwrap();
    let data = DataDir::new(temporary.path().join("data"));
    data.create_layout().unwrap();
    (temporary, data)
}

/// The names in `tools/` that are temporary (an install or switch left them).
fn temporaries(data: &DataDir) -> Vec<String> {
    listing(&data.tools_dir())
        .into_iter()
        .filter(|name| name.starts_with('.'))
        .collect()
}

#[test]
fn the_layout_is_juju_s() {
    let data = DataDir::new("/var/lib/lockstep");
    let b = binary("2.9.43-ubuntu-amd64");
    let path = |path: PathBuf| path.display().to_string();
    assert_eq!(data.root(), Path::new("/var/lib/lockstep"));
    assert_eq!(path(data.agent_conf_path()), "/var/lib/lockstep/agent.conf");
    assert_eq!(path(data.tools_dir()), "/var/lib/lockstep/tools");
    assert_eq!(
        path(data.binary_dir(&b)),
        "/var/lib/lockstep/tools/2.9.43-ubuntu-amd64"
    );
    assert_eq!(
        path(data.binary_path(&b)),
        "/var/lib/lockstep/tools/2.9.43-ubuntu-amd64/lockstepd"
    );
    assert_eq!(
        path(data.agent_link("machine-0")),
        "/var/lib/lockstep/tools/machine-0"
    );
    assert_eq!(path(data.store_path()), "/var/lib/lockstep/store.db");
    assert_eq!(path(data.ca_cert_path()), "/var/lib/lockstep/ca.pem");
    assert_eq!(
        path(data.server_cert_path()),
        "/var/lib/lockstep/server.pem"
    );
    assert_eq!(
        path(data.server_key_path()),
        "/var/lib/lockstep/server-key.pem"
    );
    assert_eq!(
        path(data.controller_config_path()),
        "/var/lib/lockstep/controller.yaml"
    );
    assert_eq!(path(data.logs_dir()), "/var/lib/lockstep/logs");
    assert_eq!(
        path(data.streams_mark_path()),
        "/var/lib/lockstep/streams-mark.json"
    );
    assert_eq!(
        path(data.tools_cache_dir()),
        "/var/lib/lockstep/cache/tools"
    );
    assert_eq!(
        path(data.cached_tarball_path(&b)),
        "/var/lib/lockstep/cache/tools/juju-2.9.43-ubuntu-amd64.tgz"
    );
}

fn full_conf() -> AgentConf {
    let mut snapshot = Snapshot::bootstrapped(&binary("2.9.43-ubuntu-amd64"));
    snapshot.previous = Some(binary("2.9.42-ubuntu-amd64"));
    snapshot.trial = Some(Trial {
        binary: binary("2.9.44-ubuntu-amd64"),
        boots: 1,
        past_database_steps: true,
        switches: 0,
    });
    snapshot.host_checkpoints = vec![StepKey::parse("write-config@2.9.44").unwrap()];
    let mut conf = AgentConf::new("machine-0", snapshot);
    conf.controller = "deadbeef-0000-4000-8000-000000000002".into();
    conf.model = "deadbeef-0000-4000-8000-000000000001".into();
    conf.controller_id = 2;
    conf.api_listen = "0.0.0.0:17070".into();
    conf.apiaddresses = vec!["10.0.0.1:17070".into(), "10.0.0.2:17070".into()];
    conf.cacert = "-----BEGIN CERTIFICATE-----\nMIIB\nAAAA\n-----END CERTIFICATE-----\n".into();
    conf.store = lockstep_agent::store::StoreEngine::Etcd;
    conf.etcd_endpoints = vec![
        "https://127.0.0.1:2379".into(),
        "https://127.0.0.1:22379".into(),
    ];
    conf.etcd_prefix = "lockstep/deadbeef-0000-4000-8000-000000000002/".into();
    conf.etcd_cacert = Some("/etc/etcd/ca.pem".into());
    conf.etcd_cert = Some("/etc/etcd/client.pem".into());
    conf.etcd_key = Some("/etc/etcd/client-key.pem".into());
    conf.etcd_user = Some("lockstep".into());
    conf.etcd_password_file = Some("/etc/etcd/lockstep.password".into());
    conf.etcd_insecure = true;
    conf
}

#[test]
fn agent_conf_round_trips_with_juju_s_keys_written_atomically_0600() {
    let (_temporary, data) = data_dir();
    assert!(data.read_agent_conf().unwrap().is_none());
    let conf = full_conf();
    data.write_agent_conf(&conf).unwrap();
    let read = data.read_agent_conf().unwrap().unwrap();
    assert_eq!(read, conf);
    assert_eq!(read.snapshot(), conf.snapshot());
    assert_eq!(read.snapshot().upgraded_to_version, Version::new(2, 9, 43));

    let text = fs::read_to_string(data.agent_conf_path()).unwrap();
    for key in [
        "tag:",
        "controller:",
        "model:",
        "apiaddresses:",
        "cacert:",
        "controller-id:",
        "api-listen:",
        "format:",
        "previous-binary:",
        "trial:",
        "host-checkpoints:",
        "bootstrap-complete:",
        "store: etcd",
        "etcd-endpoints:",
        "etcd-prefix:",
        "etcd-cacert: /etc/etcd/ca.pem",
        "etcd-cert: /etc/etcd/client.pem",
        "etcd-key: /etc/etcd/client-key.pem",
        "etcd-user: lockstep",
        "etcd-password-file: /etc/etcd/lockstep.password",
        "etcd-insecure: true",
    ] {
        assert!(text.contains(key), "{key} in\n{text}");
    }
    assert_eq!(text.matches("upgradedToVersion:").count(), 1, "{text}");
    assert!(!text.contains("upgraded-to-version"), "{text}");
    assert!(!text.contains("upgraded_to_version"), "{text}");
    let mode = fs::metadata(data.agent_conf_path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // set_snapshot replaces the snapshot and keeps the identity.
    let mut changed = read.clone();
    let mut snapshot = changed.snapshot();
    snapshot.upgraded_to_version = Version::new(2, 9, 44);
    snapshot.trial = None;
    snapshot.bootstrap_complete = true;
    changed.set_snapshot(snapshot.clone());
    assert_eq!(changed.snapshot(), snapshot);
    assert_eq!(changed.tag, "machine-0");
    assert_eq!(changed.apiaddresses, conf.apiaddresses);
    data.write_agent_conf(&changed).unwrap();
    assert_eq!(data.read_agent_conf().unwrap().unwrap(), changed);
    // Only agent.conf and the layout's directories: no temporary file left.
    assert_eq!(
        listing(data.root()),
        ["agent.conf", "cache", "logs", "tools"]
    );
}

#[test]
fn agent_conf_refuses_newer_formats_and_malformed_yaml_naming_the_file() {
    let (_temporary, data) = data_dir();
    let path = data.agent_conf_path();
    let text = full_conf().to_yaml().unwrap();

    let newer = text.replace("format: 1", "format: 99\nsomething-new: {a: 1}");
    assert_ne!(newer, text);
    fs::write(&path, &newer).unwrap();
    let error = data.read_agent_conf().unwrap_err();
    assert!(matches!(error, DataDirError::NewerFormat { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("99"), "{message}");

    // Unknown keys of the same format are ignored: the previous binary reads what a newer
    // one of the same format wrote.
    fs::write(&path, format!("{text}something-new: 1\n")).unwrap();
    assert_eq!(data.read_agent_conf().unwrap().unwrap(), full_conf());

    for (bad, needle) in [
        ("tag: [unclosed\n", ""),
        ("format: 1\ntag: machine-0\n", "missing field `controller`"),
        (
            &text.replace("upgradedToVersion: 2.9.43\n", ""),
            "missing field `upgradedToVersion`",
        ),
        ("tag: machine-0\n", "format"),
        (
            &text.replace("upgradedToVersion: 2.9.43", "upgradedToVersion: 2.9.x"),
            "2.9.x",
        ),
        (&text.replace("tag: machine-0", "tag: ../etc"), "../etc"),
        (&format!("{text}tag: machine-1\n"), ""),
    ] {
        fs::write(&path, bad).unwrap();
        let error = data.read_agent_conf().unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, DataDirError::Malformed { .. }), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(needle), "{needle} in {message}");
        assert_eq!(message.lines().count(), 1, "{message}");
    }
}

#[test]
fn a_tarball_installs_once_and_a_different_one_replaces_it() {
    let (temporary, data) = data_dir();
    let b = binary("2.9.44-ubuntu-amd64");
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\necho one\n", 0o755);
    let installed = data.install_tarball(&b, &path, &tools).unwrap();
    assert_eq!(installed, data.binary_path(&b));
    assert_eq!(fs::read(&installed).unwrap(), b"#!/bin/sh\necho one\n");
    assert_eq!(data.read_downloaded_tools(&b).unwrap(), Some(tools.clone()));
    let json: serde_json::Value = serde_json::from_slice(
        &fs::read(data.binary_dir(&b).join("downloaded-tools.txt")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        json,
        serde_json::json!({"version": "2.9.44-ubuntu-amd64", "url": tools.url,
                           "sha256": tools.sha256.to_string(), "size": tools.size_bytes})
    );

    // The same tarball again: the directory is kept (the marker survives).
    fs::write(data.binary_dir(&b).join("marker"), b"").unwrap();
    data.install_tarball(&b, &path, &tools).unwrap();
    assert!(data.binary_dir(&b).join("marker").exists());

    // Another build of the same version: replaced atomically.
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\necho two\n", 0o755);
    data.install_tarball(&b, &path, &tools).unwrap();
    assert!(!data.binary_dir(&b).join("marker").exists());
    assert_eq!(
        fs::read(data.binary_path(&b)).unwrap(),
        b"#!/bin/sh\necho two\n"
    );
    assert_eq!(data.read_downloaded_tools(&b).unwrap(), Some(tools));
    assert_eq!(temporaries(&data), Vec::<String>::new());
    assert_eq!(data.installed_binaries().unwrap(), [b]);
}

#[test]
fn a_tarball_that_does_not_match_its_metadata_or_holds_no_executable_is_refused() {
    let (temporary, data) = data_dir();
    let b = binary("2.9.44-ubuntu-amd64");
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\n", 0o755);

    let wrong_sha = DownloadedTools {
        sha256: Sha256([0; 32]),
        ..tools.clone()
    };
    let error = data.install_tarball(&b, &path, &wrong_sha).unwrap_err();
    assert!(
        matches!(
            error,
            DataDirError::Mismatch {
                what: "the sha256",
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains(&tools.sha256.to_string()),
        "{error}"
    );
    let wrong_size = DownloadedTools {
        size_bytes: tools.size_bytes - 1,
        ..tools.clone()
    };
    let error = data.install_tarball(&b, &path, &wrong_size).unwrap_err();
    assert!(matches!(error, DataDirError::Mismatch { .. }), "{error}");
    let error = data
        .install_tarball(&binary("2.9.45-ubuntu-amd64"), &path, &tools)
        .unwrap_err();
    assert!(error.to_string().contains("2.9.45-ubuntu-amd64"), "{error}");

    // A tarball whose lockstepd is not executable, or which has none.
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\n", 0o644);
    let error = data.install_tarball(&b, &path, &tools).unwrap_err();
    assert!(error.to_string().contains("not executable"), "{error}");
    let other = temporary.path().join("other.tgz");
    let exe = temporary.path().join("jujud");
    fs::write(&exe, b"#!/bin/sh\n").unwrap();
    pack_tgz(&[("jujud", exe.as_path(), 0o755)], &other).unwrap();
    let bytes = fs::read(&other).unwrap();
    let tools = DownloadedTools {
        sha256: sha256_of(&bytes),
        size_bytes: bytes.len() as u64,
        ..tools
    };
    let error = data.install_tarball(&b, &other, &tools).unwrap_err();
    assert!(
        matches!(error, DataDirError::NotInstalled { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("lockstepd"), "{error}");

    // A malicious tarball: the unpack error, nothing installed.
    let evil = temporary.path().join("evil.tgz");
    gzip_tar(&raw_tar(&[file("../lockstepd", b"evil")]), &evil);
    let bytes = fs::read(&evil).unwrap();
    let tools = DownloadedTools {
        sha256: sha256_of(&bytes),
        size_bytes: bytes.len() as u64,
        ..tools
    };
    let error = data.install_tarball(&b, &evil, &tools).unwrap_err();
    assert!(matches!(error, DataDirError::Unpack(_)), "{error}");
    assert!(!data.tools_dir().join("lockstepd").exists());

    assert!(!data.binary_dir(&b).exists());
    assert_eq!(temporaries(&data), Vec::<String>::new());
    assert_eq!(listing(&data.tools_dir()), Vec::<String>::new());
}

#[test]
fn the_agent_link_switches_atomically_and_only_to_an_installed_binary() {
    let (temporary, data) = data_dir();
    let old = binary("2.9.43-ubuntu-amd64");
    let new = binary("2.9.44-ubuntu-amd64");
    assert_eq!(data.current_binary("machine-0").unwrap(), None);

    let error = data.switch_to("machine-0", &old).unwrap_err();
    assert!(
        matches!(error, DataDirError::NotInstalled { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("2.9.43-ubuntu-amd64/lockstepd"),
        "{error}"
    );

    for b in [&old, &new] {
        let (path, tools) = tarball(temporary.path(), b, b"#!/bin/sh\n", 0o755);
        data.install_tarball(b, &path, &tools).unwrap();
    }
    data.switch_to("machine-0", &old).unwrap();
    assert_eq!(data.current_binary("machine-0").unwrap(), Some(old.clone()));
    assert_eq!(
        fs::read_link(data.agent_link("machine-0")).unwrap(),
        Path::new("2.9.43-ubuntu-amd64"),
        "a relative link, as Juju's"
    );
    data.switch_to("machine-0", &new).unwrap();
    assert_eq!(data.current_binary("machine-0").unwrap(), Some(new.clone()));
    // The link resolves to the executable.
    assert!(data.agent_link("machine-0").join("lockstepd").is_file());
    assert_eq!(temporaries(&data), Vec::<String>::new());

    let error = data.switch_to("../machine-0", &new).unwrap_err();
    assert!(matches!(error, DataDirError::BadTag { .. }), "{error}");
    assert!(error.to_string().contains("\"../machine-0\""), "{error}");

    // A directory that is not executable cannot be switched to.
    fs::set_permissions(data.binary_path(&old), fs::Permissions::from_mode(0o644)).unwrap();
    let error = data.switch_to("machine-0", &old).unwrap_err();
    assert!(error.to_string().contains("not executable"), "{error}");
    assert_eq!(data.current_binary("machine-0").unwrap(), Some(new));
}

#[test]
fn a_link_that_is_not_a_relative_symlink_to_a_binary_is_an_error_naming_it() {
    let (_temporary, data) = data_dir();
    let link = data.agent_link("machine-0");
    fs::write(&link, b"").unwrap();
    let error = data.current_binary("machine-0").unwrap_err();
    assert!(error.to_string().contains("not a symlink"), "{error}");
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/usr/bin/2.9.43-ubuntu-amd64", &link).unwrap();
    let error = data.current_binary("machine-0").unwrap_err();
    assert!(matches!(error, DataDirError::BadLink { .. }), "{error}");
    assert!(
        error.to_string().contains("/usr/bin/2.9.43-ubuntu-amd64"),
        "{error}"
    );
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("current", &link).unwrap();
    let error = data.current_binary("machine-0").unwrap_err();
    assert!(error.to_string().contains("\"current\""), "{error}");
}

#[test]
fn a_local_binary_installs_with_its_digest_and_force_version() {
    let (temporary, data) = data_dir();
    let exe = temporary.path().join("lockstepd-build");
    let script = b"#!/bin/sh\necho local\n";
    fs::write(&exe, script).unwrap();
    let b = binary("2.9.44-ubuntu-amd64");

    let installed = data.install_local_binary(&b, &exe, true).unwrap();
    assert_eq!(installed, data.binary_path(&b));
    assert_eq!(fs::read(&installed).unwrap(), script);
    assert_eq!(
        fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let tools = data.read_downloaded_tools(&b).unwrap().unwrap();
    assert_eq!(tools.version, b);
    assert_eq!(tools.sha256, sha256_of(script));
    assert_eq!(tools.size_bytes, script.len() as u64);
    assert_eq!(
        tools.url,
        format!("file://{}", fs::canonicalize(&exe).unwrap().display())
    );
    assert_eq!(
        fs::read_to_string(data.binary_dir(&b).join("FORCE-VERSION")).unwrap(),
        "2.9.44\n"
    );
    assert_eq!(
        read_force_version(&data.binary_dir(&b)).unwrap(),
        Some(Version::new(2, 9, 44))
    );

    // Idempotent; and without force the FORCE-VERSION goes.
    fs::write(data.binary_dir(&b).join("marker"), b"").unwrap();
    data.install_local_binary(&b, &exe, true).unwrap();
    assert!(data.binary_dir(&b).join("marker").exists());
    data.install_local_binary(&b, &exe, false).unwrap();
    assert_eq!(read_force_version(&data.binary_dir(&b)).unwrap(), None);
    assert!(!data.binary_dir(&b).join("marker").exists());
    assert_eq!(temporaries(&data), Vec::<String>::new());

    let error = data
        .install_local_binary(&b, temporary.path(), false)
        .unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");
    let missing = temporary.path().join("missing");
    let error = data.install_local_binary(&b, &missing, false).unwrap_err();
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );
}

/// A file identified as an agent binary of `version` for this host: the real lockstepd's
/// ELF header (this host's arch), padding, and a marker.
fn synthetic_agent(dir: &Path, version: &str) -> PathBuf {
    let mut bytes = fs::read(env!("CARGO_BIN_EXE_lockstepd")).unwrap()[..64].to_vec();
    bytes.extend_from_slice(&[0u8; 4096]);
    bytes.extend_from_slice(
        format!("LOCKSTEP-AGENT-IDENTITY:v1:version={version};os=ubuntu\0").as_bytes(),
    );
    let path = dir.join("lockstepd");
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn the_built_lockstepd_is_identified_by_its_marker_and_elf_header_as_this_build_on_this_host() {
    let lockstepd = Path::new(env!("CARGO_BIN_EXE_lockstepd"));
    let identity = datadir::read_binary_identity(lockstepd).unwrap();
    let own = lockstep_agent::steps::build_version();
    assert_eq!(identity.binary, datadir::host_binary(own));
    assert_eq!(identity.binary.arch, datadir::host_arch());
    assert_eq!(identity.built_version, own);
    assert_eq!(identity.forced_version, None);
    let bytes = fs::read(lockstepd).unwrap();
    assert_eq!(identity.size_bytes, bytes.len() as u64);
    assert_eq!(identity.sha256, sha256_of(&bytes));
    assert!(identity.require_arch(datadir::host_arch()).is_ok());
}

#[test]
fn the_lockstep_cli_is_refused_as_an_agent_binary_for_it_holds_no_identity_marker() {
    // It links the reader (and so the marker's prefix), but not the marker.
    let lockstep = Path::new(env!("CARGO_BIN_EXE_lockstep"));
    let error = datadir::read_binary_identity(lockstep).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(
            error,
            DataDirError::Identity {
                problem: datadir::IdentityProblem::NoMarker,
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.contains(&lockstep.display().to_string()),
        "{message}"
    );
}

#[test]
fn an_identified_binary_installs_as_its_identity_with_its_digest_and_force_version() {
    let (temporary, data) = data_dir();
    let build = temporary.path().join("build");
    fs::create_dir(&build).unwrap();
    let exe = synthetic_agent(&build, "2.9.43");
    fs::write(build.join("FORCE-VERSION"), "2.9.44\n").unwrap();
    let identity = datadir::read_binary_identity(&exe).unwrap();
    let b = binary(&format!("2.9.44-ubuntu-{}", datadir::host_arch()));
    assert_eq!(identity.binary, b);

    let installed = data.install_identified_binary(&identity).unwrap();
    assert_eq!(installed, data.binary_path(&b));
    assert_eq!(fs::read(&installed).unwrap(), fs::read(&exe).unwrap());
    let tools = data.read_downloaded_tools(&b).unwrap().unwrap();
    assert_eq!(
        tools,
        DownloadedTools {
            version: b.clone(),
            url: format!("file://{}", fs::canonicalize(&exe).unwrap().display()),
            sha256: identity.sha256,
            size_bytes: identity.size_bytes,
            download_rate: None,
        }
    );
    assert_eq!(
        read_force_version(&data.binary_dir(&b)).unwrap(),
        Some(Version::new(2, 9, 44))
    );
    assert_eq!(temporaries(&data), Vec::<String>::new());
}

#[test]
fn a_binary_changed_after_it_was_identified_is_refused_and_nothing_is_installed() {
    let (temporary, data) = data_dir();
    let exe = synthetic_agent(temporary.path(), "2.9.43");
    let identity = datadir::read_binary_identity(&exe).unwrap();
    let mut bytes = fs::read(&exe).unwrap();
    bytes.extend_from_slice(b"appended after it was read");
    fs::write(&exe, &bytes).unwrap();

    let error = data.install_identified_binary(&identity).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, DataDirError::Mismatch { .. }), "{message}");
    assert!(message.contains(&exe.display().to_string()), "{message}");
    assert!(
        message.contains(&identity.sha256.to_string())
            && message.contains(&sha256_of(&bytes).to_string()),
        "names both digests: {message}"
    );
    assert_eq!(data.installed_binaries().unwrap(), Vec::<Binary>::new());
    assert_eq!(temporaries(&data), Vec::<String>::new());
}

#[test]
fn force_version_is_trimmed_and_a_malformed_one_names_the_file_and_text() {
    let temporary = tempfile::tempdir().unwrap();
    assert_eq!(read_force_version(temporary.path()).unwrap(), None);
    let path = temporary.path().join("FORCE-VERSION");
    fs::write(&path, "  1.25-beta1\n\n").unwrap();
    assert_eq!(
        read_force_version(temporary.path()).unwrap(),
        Some(Version::parse("1.25-beta1").unwrap())
    );
    fs::write(&path, "2.9.x\n").unwrap();
    let error = read_force_version(temporary.path()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("\"2.9.x\""), "{message}");
    fs::write(&path, "1".repeat(5000)).unwrap();
    let error = read_force_version(temporary.path()).unwrap_err();
    assert!(matches!(error, DataDirError::TooLarge { .. }), "{error}");
}

#[test]
fn stale_temporaries_are_removed_and_nothing_else() {
    let (temporary, data) = data_dir();
    let b = binary("2.9.44-ubuntu-amd64");
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\n", 0o755);
    data.install_tarball(&b, &path, &tools).unwrap();
    data.switch_to("machine-0", &b).unwrap();
    let tools_dir = data.tools_dir();
    fs::create_dir(tools_dir.join(".install-2.9.45-ubuntu-amd64-abc")).unwrap();
    fs::write(
        tools_dir.join(".install-2.9.45-ubuntu-amd64-abc/lockstepd"),
        b"",
    )
    .unwrap();
    fs::create_dir(tools_dir.join(".replaced-2.9.43-ubuntu-amd64-1")).unwrap();
    std::os::unix::fs::symlink("2.9.44-ubuntu-amd64", tools_dir.join(".switch-machine-0-1"))
        .unwrap();
    assert_eq!(data.remove_stale_temporaries().unwrap(), 3);
    assert_eq!(listing(&tools_dir), ["2.9.44-ubuntu-amd64", "machine-0"]);
    assert_eq!(data.remove_stale_temporaries().unwrap(), 0);
}

#[test]
fn the_host_binary_is_named_as_juju_names_it() {
    let host = datadir::host_binary(Version::new(2, 9, 43));
    assert_eq!(host.release, "ubuntu");
    assert_eq!(
        host.arch,
        match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => datadir::juju_arch(other),
        }
    );
}

#[test]
fn downloaded_tools_keep_jujus_format_and_a_malformed_digest_names_the_file_and_value() {
    let (temporary, data) = data_dir();
    let b = binary("2.9.44-ubuntu-amd64");
    let (path, tools) = tarball(temporary.path(), &b, b"#!/bin/sh\n", 0o755);
    data.install_tarball(&b, &path, &tools).unwrap();
    let file = data.binary_dir(&b).join("downloaded-tools.txt");

    // Juju's keys, the digest as 64 lowercase hex digits; an uppercase one reads the same.
    let text = fs::read_to_string(&file).unwrap();
    let digest = tools.sha256.to_string();
    assert_eq!(
        text,
        format!(
            "{{\"version\":\"2.9.44-ubuntu-amd64\",\"url\":{:?},\"sha256\":\"{digest}\",\"size\":{}}}",
            tools.url, tools.size_bytes
        )
    );
    fs::write(&file, text.replace(&digest, &digest.to_uppercase())).unwrap();
    assert_eq!(data.read_downloaded_tools(&b).unwrap(), Some(tools.clone()));

    // A digest that is not 64 hex digits is refused, naming the file and the value.
    fs::write(&file, text.replace(&digest, "not hex")).unwrap();
    let error = data.read_downloaded_tools(&b).unwrap_err();
    assert!(matches!(error, DataDirError::Malformed { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains("\"not hex\""), "{message}");
    // Such a directory counts as broken: installing the tarball again replaces it.
    data.install_tarball(&b, &path, &tools).unwrap();
    assert_eq!(data.read_downloaded_tools(&b).unwrap(), Some(tools));

    // A download from a controller adds lockstep's `download-rate` after Juju's keys, and
    // reads back; Juju's file without it reads as no rate (above).
    let b2 = binary("2.9.45-ubuntu-amd64");
    let (path, tools2) = tarball(temporary.path(), &b2, b"#!/bin/sh\n", 0o755);
    let measured2 = DownloadedTools {
        download_rate: Some(117_000_000),
        ..tools2
    };
    data.install_tarball(&b2, &path, &measured2).unwrap();
    let text = fs::read_to_string(data.binary_dir(&b2).join("downloaded-tools.txt")).unwrap();
    assert!(
        text.ends_with(&format!(
            ",\"size\":{},\"download-rate\":117000000}}",
            measured2.size_bytes
        )),
        "{text}"
    );
    assert_eq!(data.read_downloaded_tools(&b2).unwrap(), Some(measured2));
}

/// `cacert` is written as a literal block only when one reads back unchanged; the values a
/// literal block cannot hold (found by the `agent_conf_parse` fuzz target: `"\n"` came back
/// as `""`) are written quoted. Each round-trips, and so does the fuzzer's input.
#[test]
fn agent_conf_strings_a_literal_block_cannot_hold_are_written_so_that_they_read_back_unchanged() {
    let path = Path::new("agent.conf");
    let binary = Binary::new(Version::new(2, 9, 43), "ubuntu", "amd64").unwrap();
    for cacert in [
        "\n",
        "\n\n",
        "a\n\n",
        " indented\n",
        "\tindented\n",
        "nul\u{0}inside\n",
        "no final line break\nsecond",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    ] {
        let mut conf = AgentConf::new("machine-0", Snapshot::bootstrapped(&binary));
        conf.cacert = cacert.to_owned();
        let written = conf.to_yaml().unwrap();
        let read = AgentConf::parse(&written, path).unwrap();
        assert_eq!(read.cacert, cacert, "written as:\n{written}");
    }
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus/agent_conf_parse/regression-cacert-only-a-line-break");
    let text = String::from_utf8(fs::read(found).unwrap()).unwrap();
    let conf = AgentConf::parse(&text, path).unwrap();
    let again = AgentConf::parse(&conf.to_yaml().unwrap(), path).unwrap();
    assert_eq!(again, conf);
}

#[test]
fn a_machine_agents_password_is_written_and_read_back_but_never_printed() {
    let root = tempfile::tempdir().unwrap();
    let data = DataDir::new(root.path());
    let mut conf = full_conf();
    conf.apipassword = "0123456789abcdef-s3cret".to_owned().into();
    data.write_agent_conf(&conf).unwrap();
    let back = data.read_agent_conf().unwrap().unwrap();
    assert_eq!(back.apipassword.as_str(), "0123456789abcdef-s3cret");
    let text = std::fs::read_to_string(data.agent_conf_path()).unwrap();
    assert!(
        text.contains("apipassword: 0123456789abcdef-s3cret"),
        "{text}"
    );
    let printed = format!("{back:?}");
    assert!(!printed.contains("s3cret"), "{printed}");
    assert!(printed.contains("apipassword: (hidden)"), "{printed}");
}
