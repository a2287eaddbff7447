//! Helpers shared by the integration tests: real directories, real files.

#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::fs;
use std::path::{Path, PathBuf};

pub mod server;

use lockstep_core::policy::Stream;
use lockstep_streams::{GenerateOptions, Generated, generate_agent_binaries};

/// 2026-12-01T00:00:00Z.
pub const DAY_0: u64 = 1_796_083_200;
pub const DAY: u64 = 86_400;

/// A fixture under tests/data: simplestreams documents in Juju's formats, written for
/// lockstep (tests/data/README.md).
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Deterministic content for a fake agent binary.
pub fn tarball_bytes(name: &str, size_bytes: usize) -> Vec<u8> {
    let seed = name.bytes().fold(7u32, |acc, b| {
        acc.wrapping_mul(31).wrapping_add(u32::from(b))
    });
    (0..size_bytes)
        .map(|i| (seed.wrapping_add(i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// Puts `<root>/tools/<stream>/<name>` with deterministic content.
pub fn put_tarball(root: &Path, stream: Stream, name: &str, size_bytes: usize) -> Vec<u8> {
    let dir = root.join("tools").join(stream.as_str());
    fs::create_dir_all(&dir).unwrap();
    let bytes = tarball_bytes(name, size_bytes);
    fs::write(dir.join(name), &bytes).unwrap();
    bytes
}

/// Generates the mirror's metadata as of `now`.
pub fn generate(root: &Path, now_unix_seconds: u64) -> Generated {
    generate_agent_binaries(root, &GenerateOptions { now_unix_seconds }).unwrap()
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// Writes a JSON file.
pub fn write_json(path: &Path, value: &serde_json::Value) {
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

/// Names of the entries of a directory, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}
