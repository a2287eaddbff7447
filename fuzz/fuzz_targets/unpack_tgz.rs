//! Agent tarballs: any bytes are unpacked or refused, never a panic, and nothing is ever
//! written outside the destination; a refused archive leaves the destination empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_agent::unpack::{UnpackLimits, unpack_tgz};

fuzz_target!(|data: &[u8]| {
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let archive = scratch.path().join("agent.tgz");
    std::fs::write(&archive, data).expect("write the archive");
    let destination = scratch.path().join("out");
    std::fs::create_dir(&destination).expect("create the destination");
    let limits = UnpackLimits {
        total_bytes_max: 1 << 20,
        entries_max: 16,
    };
    let result = unpack_tgz(&archive, &destination, &limits);
    let mut outside: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("list the scratch dir")
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    outside.sort();
    assert_eq!(outside, ["agent.tgz", "out"], "written beside the destination");
    let inside = std::fs::read_dir(&destination).expect("list").count();
    match result {
        Ok(names) => assert_eq!(inside, names.len()),
        Err(_) => assert_eq!(inside, 0, "a refused archive left files behind"),
    }
});
