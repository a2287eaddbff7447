//! [`DataDir`]: where each file of the data directory is, and the names it accepts (agent
//! tags, binaries).

use std::fs;
use std::path::{Path, PathBuf};

use lockstep_core::version::{Binary, Version};

use super::error::DataDirError;
use super::names::{
    AGENT_CONF, CA_CERT, CONTROLLER_CONFIG, EXECUTABLE, HA, LOGS, PID, SERVER_CERT, SERVER_KEY,
    STORE, STREAMS_MARK, TAG_LENGTH_MAX, TOOLS, USERS,
};

/// The agent's data directory; see the module documentation for its layout.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/agent.conf`
    pub fn agent_conf_path(&self) -> PathBuf {
        self.root.join(AGENT_CONF)
    }

    /// `<root>/controller.yaml`
    pub fn controller_config_path(&self) -> PathBuf {
        self.root.join(CONTROLLER_CONFIG)
    }

    /// `<root>/store.db`
    pub fn store_path(&self) -> PathBuf {
        self.root.join(STORE)
    }

    /// `<root>/ca.pem`
    pub fn ca_cert_path(&self) -> PathBuf {
        self.root.join(CA_CERT)
    }

    /// `<root>/server.pem`
    pub fn server_cert_path(&self) -> PathBuf {
        self.root.join(SERVER_CERT)
    }

    /// `<root>/server-key.pem`
    pub fn server_key_path(&self) -> PathBuf {
        self.root.join(SERVER_KEY)
    }

    /// `<root>/users.json`
    pub fn users_path(&self) -> PathBuf {
        self.root.join(USERS)
    }

    /// `<root>/lockstepd.pid`
    pub fn pid_path(&self) -> PathBuf {
        self.root.join(PID)
    }

    /// `<root>/ha/machine-<id>`: the data dir of controller `id` that `enable-ha` added.
    pub fn ha_member_dir(&self, id: u8) -> PathBuf {
        self.root.join(HA).join(format!("machine-{id}"))
    }

    /// `<root>/machines`: the data directories of the machine agents `lockstep add-machine`
    /// started on this host (the local provider).
    pub fn machine_agents_dir(&self) -> PathBuf {
        self.root.join("machines")
    }

    /// `<root>/machines/machine-<id>`: the data directory of machine `id`'s agent.
    pub fn machine_agent_dir(&self, id: &str) -> DataDir {
        DataDir::new(self.machine_agents_dir().join(format!("machine-{id}")))
    }

    /// Every machine agent's data directory under `<root>/machines` (those holding an
    /// `agent.conf`), by name.
    pub fn machine_agent_dirs(&self) -> Vec<DataDir> {
        let mut dirs: Vec<PathBuf> = fs::read_dir(self.machine_agents_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.join(AGENT_CONF).is_file())
            .collect();
        dirs.sort();
        dirs.into_iter().map(DataDir::new).collect()
    }

    /// `<root>/streams-mark.json`
    pub fn streams_mark_path(&self) -> PathBuf {
        self.root.join(STREAMS_MARK)
    }

    /// `<root>/logs`
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join(LOGS)
    }

    /// `<root>/cache/tools`
    pub fn tools_cache_dir(&self) -> PathBuf {
        self.root.join("cache").join(TOOLS)
    }

    /// `<root>/cache/tools/juju-<version>-<os>-<arch>.tgz`: Juju's tarball name.
    pub fn cached_tarball_path(&self, binary: &Binary) -> PathBuf {
        self.tools_cache_dir().join(format!("juju-{binary}.tgz"))
    }

    /// `<root>/tools`
    pub fn tools_dir(&self) -> PathBuf {
        self.root.join(TOOLS)
    }

    /// `<root>/tools/<version>-<os>-<arch>`
    pub fn binary_dir(&self, binary: &Binary) -> PathBuf {
        self.tools_dir().join(binary.to_string())
    }

    /// `<root>/tools/<version>-<os>-<arch>/lockstepd`
    pub fn binary_path(&self, binary: &Binary) -> PathBuf {
        self.binary_dir(binary).join(EXECUTABLE)
    }

    /// `<root>/tools/<tag>`, e.g. `tools/machine-0`. The tag must pass [`check_tag`]; the
    /// methods that use the link check it.
    pub fn agent_link(&self, tag: &str) -> PathBuf {
        self.tools_dir().join(tag)
    }

    /// Creates the root, `tools/`, `logs/` and `cache/tools/` if missing.
    pub fn create_layout(&self) -> Result<(), DataDirError> {
        for dir in [
            self.root.clone(),
            self.tools_dir(),
            self.logs_dir(),
            self.tools_cache_dir(),
        ] {
            fs::create_dir_all(&dir).map_err(DataDirError::io(&dir, "create the directory"))?;
        }
        Ok(())
    }
}

/// Checks an agent tag: 1 to [`TAG_LENGTH_MAX`] characters of `a-z`, `0-9`, `-`, starting
/// with a letter and not ending with `-` (`machine-0`, `unit-wordpress-0`). Such a name is
/// never a binary's (those start with a digit) nor a temporary entry's (those start with
/// `.`), and never leaves `tools/`.
pub fn check_tag(tag: &str) -> Result<(), DataDirError> {
    let valid = !tag.is_empty()
        && tag.len() <= TAG_LENGTH_MAX
        && tag.starts_with(|c: char| c.is_ascii_lowercase())
        && !tag.ends_with('-')
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(DataDirError::BadTag {
            tag: tag.to_owned(),
        })
    }
}

/// A binary built by hand (its fields are public) must still name a plain directory.
pub(super) fn check_binary(binary: &Binary) -> Result<(), DataDirError> {
    let text = binary.to_string();
    match Binary::parse(&text) {
        Ok(parsed) if parsed == *binary => Ok(()),
        _ => Err(DataDirError::BadBinary { binary: text }),
    }
}

/// The OS lockstep's agents are built for and name in their binaries (Juju 2.9 names agent
/// binaries by OS, not series). Every `lockstepd` embeds it in its identity marker
/// ([`AGENT_IDENTITY_MARKER`](super::identity::AGENT_IDENTITY_MARKER)).
pub const AGENT_OS: &str = "ubuntu";

/// The architecture this process was built for, by Juju's name: the host's, since the
/// process runs on it. A local agent binary must be built for it.
pub fn host_arch() -> &'static str {
    if std::env::consts::ARCH == "powerpc64" && cfg!(target_endian = "little") {
        "ppc64el"
    } else {
        juju_arch(std::env::consts::ARCH)
    }
}

/// The binary this build is for `version`: [`AGENT_OS`], [`host_arch`]. For a binary built
/// into this process (what a running `lockstepd` is, what a mirror is asked for); a local
/// file's identity is read from the file instead (`identity::read_binary_identity`).
pub fn host_binary(version: Version) -> Binary {
    Binary {
        number: version,
        release: AGENT_OS.to_owned(),
        arch: host_arch().to_owned(),
    }
}

/// Juju's name for a Rust architecture (`std::env::consts::ARCH`); others unchanged.
pub fn juju_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64le" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "x86" => "i386",
        "arm" => "armhf",
        other => other,
    }
}
