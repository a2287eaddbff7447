//! The names in the data directory, the largest size read of each file, and the modes
//! files are written with: data, used by every other part of [`datadir`](super).

use crate::unpack::UnpackLimits;

/// The agent's configuration and snapshot.
pub const AGENT_CONF: &str = "agent.conf";
/// The controller's bootstrap configuration.
pub const CONTROLLER_CONFIG: &str = "controller.yaml";
/// The SQLite store.
pub const STORE: &str = "store.db";
/// The API's users, JSON (`[{name, password-hash}]`).
pub const USERS: &str = "users.json";
/// The launcher's pid, locked while it runs.
pub const PID: &str = "lockstepd.pid";
/// The controllers `enable-ha` added beside this one, `ha/machine-<N>/`.
pub const HA: &str = "ha";
/// The controller's CA certificate (PEM).
pub const CA_CERT: &str = "ca.pem";
/// The API server's certificate (PEM).
pub const SERVER_CERT: &str = "server.pem";
/// The API server's private key (PEM).
pub const SERVER_KEY: &str = "server-key.pem";
/// The simplestreams high-water mark.
pub const STREAMS_MARK: &str = "streams-mark.json";
/// Logs.
pub const LOGS: &str = "logs";
/// Installed binaries and the agents' links.
pub const TOOLS: &str = "tools";
/// The executable in a binary directory (Juju's `jujud`).
pub const EXECUTABLE: &str = "lockstepd";
/// A binary's provenance, in its directory (Juju's name).
pub const DOWNLOADED_TOOLS: &str = "downloaded-tools.txt";
/// A machine agent's link probe's result (it never downloaded a binary).
pub const LINK_PROBE: &str = "link-probe.json";
/// Largest `link-probe.json` read.
pub const LINK_PROBE_BYTES_MAX: u64 = 4 * 1024;
/// The version a binary reports, beside its executable (Juju's name).
pub const FORCE_VERSION: &str = "FORCE-VERSION";

/// Largest `agent.conf` read: a few kilobytes in practice (a CA certificate is the bulk).
pub const AGENT_CONF_BYTES_MAX: u64 = 1024 * 1024;
/// Largest `downloaded-tools.txt` read.
pub const DOWNLOADED_TOOLS_BYTES_MAX: u64 = 64 * 1024;
/// Largest `FORCE-VERSION` read.
pub const FORCE_VERSION_BYTES_MAX: u64 = 1024;
/// Largest local executable installed by
/// [`DataDir::install_local_binary`](super::DataDir::install_local_binary).
pub const LOCAL_BINARY_BYTES_MAX: u64 = UnpackLimits::TOTAL_BYTES_MAX_DEFAULT;
/// Bytes of a local agent binary's ELF header read for its architecture: the
/// identification (`e_ident`, 16 bytes), `e_type` (2) and `e_machine` (2).
pub const ELF_HEADER_READ_BYTES: usize = 20;
/// Longest agent tag.
pub const TAG_LENGTH_MAX: usize = 64;

/// Largest `users.json` read.
pub const USERS_BYTES_MAX: u64 = 1024 * 1024;

/// The mode of a file only the agent may read: `agent.conf`, the server's private key,
/// `users.json`, `controller.yaml` (it holds the admin's password).
pub const SECRET_FILE_MODE: u32 = 0o600;
/// The mode of every other file of the data directory: `downloaded-tools.txt`,
/// `FORCE-VERSION`, the store, the logs, the tools cache. Only the agent's user reads its
/// data directory.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// The mode of the one file anyone may read: the controller's CA certificate (`ca.pem`).
pub const PUBLIC_FILE_MODE: u32 = 0o644;
/// The mode of an installed executable and of a binary directory (inside the private data
/// directory, which is what keeps others out).
pub const EXECUTABLE_MODE: u32 = 0o755;
/// The mode of the data directory itself: private to the agent's user.
pub const DATA_DIR_MODE: u32 = 0o700;
/// The process umask of `lockstepd` and of `lockstep bootstrap`: whatever they create
/// without an explicit mode (the SQLite store and its WAL, the logs, the tools cache,
/// directories) is private.
pub const UMASK: u32 = 0o077;

/// The OpenPGP public keys that must sign the mirror's metadata (`lockstep bootstrap
/// --metadata-key`), ASCII-armored; `agent.conf`'s `metadata-keyring` names it.
pub const METADATA_KEYS: &str = "metadata-keys.asc";
/// Largest `metadata-keys.asc` read.
pub const METADATA_KEYS_BYTES_MAX: u64 = lockstep_streams::signature::KEY_FILE_BYTES_MAX;
/// `metadata-keys.asc`'s mode: only the agent reads it, and only root may replace it.
pub const METADATA_KEYS_MODE: u32 = SECRET_FILE_MODE;
/// The certificate authorities trusted for an `https://` mirror besides the system's
/// (`lockstep bootstrap --metadata-ca`), PEM; `agent.conf`'s `metadata-ca` names it.
pub const METADATA_CA: &str = "metadata-ca.pem";
/// Largest `metadata-ca.pem` read: a bundle of a few dozen certificates.
pub const METADATA_CA_BYTES_MAX: u64 = 1 << 20;
/// `metadata-ca.pem`'s mode: as every file of the data dir but the controller's own CA.
pub const METADATA_CA_MODE: u32 = SECRET_FILE_MODE;
