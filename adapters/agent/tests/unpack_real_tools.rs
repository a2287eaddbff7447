//! Agent tarballs as real tools write them, unpacked by the agent: GNU tar `--format=gnu`
//! (long names in `L` headers) and `--format=posix` (a PAX `x` header before every file),
//! and Python's `tarfile` (PAX by default, GNU on request, a global `g` header when asked).
//! Every archive is written by the tool itself, in a temporary directory, at test time; the
//! refusals are archives the same tools write with a link, a traversing name or a name
//! past the limit.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep_agent::unpack::extensions::ExtensionProblem;
use lockstep_agent::unpack::{NameProblem, UnpackError, UnpackLimits, UnpackProblem, unpack_tgz};

/// A source directory holding an agent binary's files (`lockstepd` executable,
/// `FORCE-VERSION`, and a file with a 150-byte name), an empty destination, and the
/// directory for the archive.
struct Fixture {
    _root: tempfile::TempDir,
    source: PathBuf,
    destination: PathBuf,
    tarball: PathBuf,
}

const LONG: usize = 150;

fn fixture() -> Fixture {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let source = root.path().join("source");
    let destination = root.path().join("destination");
    std::fs::create_dir(&source).unwrap();
    std::fs::create_dir(&destination).unwrap();
    std::fs::write(source.join("lockstepd"), b"#!/bin/sh\necho lockstepd\n").unwrap();
    std::fs::set_permissions(
        source.join("lockstepd"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(source.join("FORCE-VERSION"), b"0.1.1").unwrap();
    std::fs::write(source.join("n".repeat(LONG)), b"a long name").unwrap();
    let tarball = root.path().join("agent.tgz");
    Fixture {
        _root: root,
        source,
        destination,
        tarball,
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// GNU tar, in `source`, of `names`, gzip-compressed, in `format`.
fn gnu_tar(fixture: &Fixture, format: &str, names: &[&str]) {
    run(Command::new("tar")
        .arg(format!("--format={format}"))
        .arg("-czf")
        .arg(&fixture.tarball)
        .arg("-C")
        .arg(&fixture.source)
        .args(names));
}

/// Python's `tarfile` running `script` with `tarball` and `source` as arguments.
fn python_tarfile(fixture: &Fixture, script: &str) {
    run(Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&fixture.tarball)
        .arg(&fixture.source));
}

fn unpack(fixture: &Fixture) -> Result<Vec<String>, UnpackError> {
    unpack_tgz(
        &fixture.tarball,
        &fixture.destination,
        &UnpackLimits::default(),
    )
}

fn listing(directory: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The three files arrived whole, `lockstepd` executable and nothing else beside them.
fn assert_unpacked(fixture: &Fixture) {
    let long = "n".repeat(LONG);
    let mut expected = vec!["FORCE-VERSION".to_owned(), "lockstepd".to_owned(), long];
    expected.sort();
    assert_eq!(listing(&fixture.destination), expected);
    for name in &expected {
        assert_eq!(
            std::fs::read(fixture.destination.join(name)).unwrap(),
            std::fs::read(fixture.source.join(name)).unwrap(),
            "{name}"
        );
    }
    let mode = |name: &str| {
        std::fs::metadata(fixture.destination.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    // Private to the agent's user, the owner's execute bit kept (see `unpack.rs`).
    assert_eq!(mode("lockstepd"), 0o700);
    assert_eq!(mode("FORCE-VERSION"), 0o600);
}

#[test]
fn gnu_tar_gnu_format_with_a_long_name_unpacks() {
    let fixture = fixture();
    let long = "n".repeat(LONG);
    gnu_tar(&fixture, "gnu", &["lockstepd", "FORCE-VERSION", &long]);
    unpack(&fixture).unwrap();
    assert_unpacked(&fixture);
}

#[test]
fn gnu_tar_posix_format_with_a_pax_header_before_every_file_unpacks() {
    let fixture = fixture();
    let long = "n".repeat(LONG);
    gnu_tar(&fixture, "posix", &["lockstepd", "FORCE-VERSION", &long]);
    unpack(&fixture).unwrap();
    assert_unpacked(&fixture);
}

#[test]
fn python_tarfile_default_pax_format_with_a_global_header_unpacks() {
    let fixture = fixture();
    python_tarfile(
        &fixture,
        r#"
import os, sys, tarfile
tarball, source = sys.argv[1:3]
assert tarfile.DEFAULT_FORMAT == tarfile.PAX_FORMAT
# A global header (comment, mtime) before the files, as a build system may add.
with tarfile.open(tarball, "w:gz", pax_headers={"comment": "built by CI"}) as archive:
    for name in sorted(os.listdir(source)):
        archive.add(os.path.join(source, name), arcname=name)
"#,
    );
    unpack(&fixture).unwrap();
    assert_unpacked(&fixture);
}

#[test]
fn python_tarfile_gnu_format_unpacks() {
    let fixture = fixture();
    python_tarfile(
        &fixture,
        r#"
import os, sys, tarfile
tarball, source = sys.argv[1:3]
with tarfile.open(tarball, "w:gz", format=tarfile.GNU_FORMAT) as archive:
    for name in sorted(os.listdir(source)):
        archive.add(os.path.join(source, name), arcname=name)
"#,
    );
    unpack(&fixture).unwrap();
    assert_unpacked(&fixture);
}

#[test]
fn a_symlink_a_traversing_pax_name_and_a_name_past_the_limit_are_refused_as_the_tools_write_them() {
    // GNU tar, POSIX format, with a symlink beside the binary.
    let fixture = fixture();
    std::os::unix::fs::symlink("/etc/shadow", fixture.source.join("shadow")).unwrap();
    gnu_tar(&fixture, "posix", &["lockstepd", "shadow"]);
    let error = unpack(&fixture).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::NotRegular { kind: "symlink" }),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());

    // Python's tarfile, PAX format, a file whose PAX path climbs out of the destination.
    let fixture = self::fixture();
    python_tarfile(
        &fixture,
        r#"
import io, sys, tarfile
tarball = sys.argv[1]
with tarfile.open(tarball, "w:gz") as archive:
    data = b"evil"
    info = tarfile.TarInfo("lockstepd")
    info.size = len(data)
    info.pax_headers = {"path": "../../lockstepd"}
    archive.addfile(info, io.BytesIO(data))
"#,
    );
    let error = unpack(&fixture).unwrap_err();
    assert!(
        matches!(
            error.problem,
            UnpackProblem::Name(NameProblem::ParentDirectory)
        ),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());

    // Python's tarfile, GNU format, a long name of 300 bytes (over NAME_MAX).
    let fixture = self::fixture();
    python_tarfile(
        &fixture,
        r#"
import io, sys, tarfile
tarball = sys.argv[1]
with tarfile.open(tarball, "w:gz", format=tarfile.GNU_FORMAT) as archive:
    data = b"long"
    info = tarfile.TarInfo("z" * 300)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))
"#,
    );
    let error = unpack(&fixture).unwrap_err();
    assert!(
        matches!(error.problem, UnpackProblem::Name(NameProblem::TooLong)),
        "{error}"
    );

    // Python's tarfile, PAX format, a hard link: its PAX header names the link's target.
    let fixture = self::fixture();
    python_tarfile(
        &fixture,
        r#"
import sys, tarfile
tarball = sys.argv[1]
with tarfile.open(tarball, "w:gz") as archive:
    info = tarfile.TarInfo("lockstepd")
    info.type = tarfile.LNKTYPE
    info.linkname = "t" * 120
    archive.addfile(info)
"#,
    );
    let error = unpack(&fixture).unwrap_err();
    assert!(
        matches!(
            &error.problem,
            UnpackProblem::Extension(ExtensionProblem::Unsupported { key, .. })
                if key == "linkpath"
        ),
        "{error}"
    );
    assert_eq!(listing(&fixture.destination), Vec::<String>::new());
}
