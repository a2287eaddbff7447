//! Conventional locations beyond the data dir's own layout (`datadir`).

use std::path::{Path, PathBuf};

/// `--data-dir`'s default: `/var/lib/lockstep` for root (Juju's `/var/lib/juju`), else
/// `$XDG_DATA_HOME/lockstep` (`~/.local/share/lockstep`).
pub fn default_data_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/lockstep");
    }
    if let Some(data_home) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(data_home).join("lockstep");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    Path::new(&home).join(".local/share/lockstep")
}

/// Why an executable beside this one cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum ExecutableError {
    #[error("cannot find this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    #[error("{} has no directory", path.display())]
    NoDirectory { path: PathBuf },
    #[error(
        "{} not found beside {}: build both binaries (cargo build -p lockstep-agent)",
        path.display(),
        beside.display()
    )]
    NotBeside { path: PathBuf, beside: PathBuf },
}

/// This executable and the directory it is in.
fn executable_and_dir() -> Result<(PathBuf, PathBuf), ExecutableError> {
    let exe = std::env::current_exe().map_err(ExecutableError::CurrentExe)?;
    match exe.parent() {
        Some(dir) => {
            let dir = dir.to_path_buf();
            Ok((exe, dir))
        }
        None => Err(ExecutableError::NoDirectory { path: exe }),
    }
}

/// The directory this executable is in (where Juju's `FORCE-VERSION` is looked for).
pub fn executable_dir() -> Result<PathBuf, ExecutableError> {
    executable_and_dir().map(|(_, dir)| dir)
}

/// An executable installed beside this one (`lockstep` finds `lockstepd` so).
pub fn sibling_executable(name: &str) -> Result<PathBuf, ExecutableError> {
    let (exe, dir) = executable_and_dir()?;
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ExecutableError::NotBeside { path, beside: exe })
    }
}
