//! The agent's data directory, laid out as Juju's `/var/lib/juju`.
//!
//! ```text
//! <root>/                              e.g. /var/lib/lockstep
//! ├── agent.conf                       AgentConf, YAML, 0600: identity, API, the snapshot
//! ├── controller.yaml                  the client's view of the controller, 0600 (CLI)
//! ├── users.json                       the API's users, argon2 hashes, 0600
//! ├── lockstepd.pid                    the launcher's pid, locked while it runs
//! ├── store.db                         the controllers' shared state, SQLite (controllers)
//! ├── ca.pem                           the controller's CA certificate
//! ├── server.pem                       the API server's certificate
//! ├── server-key.pem                   its private key, 0600
//! ├── streams-mark.json                simplestreams high-water mark (never moves back)
//! ├── metadata-keys.asc                public keys that must sign the mirror's metadata, 0600
//! ├── link-probe.json                  a machine agent's measure of its link, if it probed
//! ├── logs/                            the daemon's logs
//! ├── ha/machine-<N>/                  controllers `enable-ha` added, each a data dir
//! ├── cache/
//! │   └── tools/
//! │       └── juju-2.9.43-ubuntu-amd64.tgz   tarballs a controller serves to its agents
//! └── tools/
//!     ├── 2.9.43-ubuntu-amd64/         one directory per installed binary
//!     │   ├── lockstepd                the executable
//!     │   ├── downloaded-tools.txt     DownloadedTools, JSON: version, url, sha256, size
//!     │   └── FORCE-VERSION            optional: the version this binary reports
//!     ├── 2.9.44-ubuntu-amd64/
//!     └── machine-0 -> 2.9.43-ubuntu-amd64   the agent's current binary, switched atomically
//! ```
//!
//! As in Juju, an agent runs `tools/<tag>/lockstepd` and an upgrade installs the new
//! binary beside the old one, then points `tools/<tag>` at it with one `rename`, so a crash
//! leaves the old or the new link and never none. Every file the agent itself replaces is
//! written atomically ([`lockstep_fs`]: temporary file in the same directory, fsync,
//! rename, fsync of the directory; CONTRACT.md, "Where state lives"), and every binary
//! directory is assembled under a temporary name in `tools/` and renamed into place only
//! when complete.
//!
//! One module per concern, each using only the ones listed before it:
//!
//! - `names`: the file names, the largest size read of each, the modes written;
//! - `error`: [`DataDirError`], naming the file and the offending value;
//! - `layout`: [`DataDir`], where each file is; agent tags and binaries as names;
//! - `files`: capped reads, new files in a staging directory, hashing copies;
//! - `identity`: which agent binary a local file is, read without running it (its
//!   embedded marker, its ELF header, `FORCE-VERSION` beside it), with its size and sha256;
//! - `agent_conf`: [`AgentConf`] (format, read, atomic write, mode 0600);
//! - `downloaded_tools`: [`DownloadedTools`], Juju's provenance file;
//! - `users`: [`User`], `users.json`;
//! - `metadata_keys`: `metadata-keys.asc`, the keys that sign the mirror's metadata;
//!   `metadata-ca.pem`, the certificate authorities trusted for an https:// mirror;
//! - `binaries`: installing binaries (a tarball, or a local binary as identified), switching
//!   the agent link;
//! - `sweep`: removing the temporary files a crash left, at the launcher's start.

mod agent_conf;
mod binaries;
mod downloaded_tools;
mod error;
mod files;
mod identity;
mod layout;
mod link_probe;
mod metadata_keys;
pub mod names;
mod sweep;
mod users;

pub use agent_conf::{AGENT_CONF_MODE, AgentConf, ApiPassword, Provisioner, StoreEngine};
pub use downloaded_tools::DownloadedTools;
pub use error::{DataDirError, Endianness, IdentityProblem};
pub use identity::{
    AGENT_IDENTITY_MARKER, BinaryIdentity, MarkedIdentity, parse_identity_marker,
    read_binary_identity, read_force_version,
};
pub use layout::{AGENT_OS, DataDir, check_tag, host_arch, host_binary, juju_arch};
pub use link_probe::LinkProbe;
pub use metadata_keys::{read_keyring, read_metadata_ca};
pub use names::*;
pub use sweep::Swept;
pub use users::User;

/// Sets the process umask to [`UMASK`] (`0077`): what `lockstepd` and `lockstep bootstrap`
/// create without an explicit mode (the SQLite store and its WAL, the logs, the tools
/// cache, directories) is private to the agent's user. Files written with a mode
/// (`lockstep_fs::write_file_atomically`) get exactly that mode.
pub fn private_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(UMASK));
}

#[cfg(test)]
mod tests {
    use lockstep_core::version::{Binary, Version};

    use super::*;

    #[test]
    fn tags_are_plain_lowercase_names_that_cannot_be_binaries_or_temporaries() {
        for tag in [
            "machine-0",
            "controller-0",
            "unit-wordpress-0",
            "machine-0-lxd-1",
        ] {
            assert!(check_tag(tag).is_ok(), "{tag}");
        }
        for tag in [
            "",
            "0",
            "2.9.43-ubuntu-amd64",
            ".switch-x",
            "../x",
            "machine/0",
            "Machine-0",
            "machine-",
            &"m".repeat(65),
        ] {
            let error = check_tag(tag).unwrap_err();
            assert!(
                error.to_string().contains(&format!("{tag:?}")) || tag.len() > 64,
                "{error}"
            );
        }
    }

    #[test]
    fn juju_names_the_architectures() {
        assert_eq!(juju_arch("x86_64"), "amd64");
        assert_eq!(juju_arch("aarch64"), "arm64");
        assert_eq!(juju_arch("powerpc64le"), "ppc64el");
        assert_eq!(juju_arch("s390x"), "s390x");
        assert_eq!(juju_arch("riscv64"), "riscv64");
        let host = host_binary(Version::new(2, 9, 43));
        assert_eq!(host.release, "ubuntu");
        assert!(Binary::parse(&host.to_string()).is_ok(), "{host}");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(host.to_string(), "2.9.43-ubuntu-amd64");
        }
    }
}
