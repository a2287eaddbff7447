//! python-jujuclient 0.54.0 and python-libjuju (PyPI `juju`) 3.6.1.3 in a throwaway
//! virtualenv under the target directory, their dependencies pinned by
//! `tests/interop/constraints.txt`; shared by the interop tests (`api_interop.rs`,
//! `juju_data.rs`) and the benches (`jujuclient.rs`, `libjuju.rs`).
//! `LOCKSTEP_INTEROP_PYTHON` may name a Python that has both already.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const CLIENTS: [&str; 2] = ["jujuclient==0.54.0", "juju==3.6.1.3"];

/// Creates the virtualenv once per test process (tests share it); later runs reuse it.
pub fn python() -> PathBuf {
    static VENV: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut venv = VENV.lock().expect("not poisoned");
    if let Some(python) = &*venv {
        return python.clone();
    }
    if let Some(python) = std::env::var_os("LOCKSTEP_INTEROP_PYTHON") {
        let python = PathBuf::from(python);
        *venv = Some(python.clone());
        return python;
    }
    let directory = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-venv");
    // Two test processes (two `cargo test` runs sharing the target directory) take turns:
    // one builds the virtualenv, the other then finds it built.
    let lock_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-venv.lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|error| panic!("{}: {error}", lock_path.display()));
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|error| panic!("lock {}: {error}", lock_path.display()));
    let python = directory.join("bin/python");
    let marker = directory.join("installed.txt");
    let wanted = CLIENTS.join(" ");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        let _ = std::fs::remove_dir_all(&directory);
        run(Command::new("python3").args(["-m", "venv"]).arg(&directory));
        let constraints =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/constraints.txt");
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-c",
            ])
            .arg(&constraints)
            .args(CLIENTS));
        std::fs::write(&marker, &wanted).expect("write the venv marker");
    }
    *venv = Some(python.clone());
    python
}

pub fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
