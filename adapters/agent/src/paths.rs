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

/// An executable installed beside this one (`lockstep` finds `lockstepd` so).
pub fn sibling_executable(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found beside {}: build both binaries (cargo build -p lockstep-agent)",
            path.display(),
            exe.display()
        ))
    }
}
