//! The environment provider of a controller's `lockstepd` (seed 004): what it reports as
//! the model's capabilities each time the core asks (`Request::RefreshCapabilities`: a
//! controller's bootstrap and the end of every upgrade).
//!
//! - By default the provider interrogates this host ([`HostProvider`]): `manage-firewall`
//!   when a firewall tool is usable by this process (an `nft` or `iptables` executable on
//!   `PATH`, and the process may administer the network: `CAP_NET_ADMIN` in
//!   `/proc/self/status`'s `CapEff`, or effective uid 0 where `CapEff` cannot be read).
//!   The facts come through [`HostFacts`], which tests substitute.
//! - `--capabilities LIST` is the operator's override: the provider reports the list as
//!   given, discovering nothing; it is logged at start as an override.
//! - `--capabilities-file PATH` is made for tests: the file (the same list) is read afresh
//!   at every refresh, so a test can change the capabilities between two upgrades.
//!
//! Every refresh logs the answer and the reason (`capabilities reported`).
//!
//! Host probing lives here, not in the store crate beside the `EnvironProvider` trait:
//! it reads the process's credentials, `PATH` and `/proc`, which is the daemon's business on
//! its host; the store crate touches nothing but the store.

use std::path::{Path, PathBuf};

use lockstep_core::jobs::{Capabilities, Capability};
use lockstep_store::seed004::{self, CapabilityReport, EnvironProvider, LocalProvider};

/// The firewall tools whose presence (with the right to use them) means `manage-firewall`,
/// in the order they are looked for.
pub const FIREWALL_TOOLS: [&str; 2] = ["nft", "iptables"];

/// `CAP_NET_ADMIN`'s bit in a capability mask (`linux/capability.h`).
pub const CAP_NET_ADMIN: u32 = 12;

/// Where the provider's answer comes from (`lockstepd`'s flags).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CapabilitySource {
    /// Interrogate this host at every refresh (no flag).
    #[default]
    Host,
    /// `--capabilities`: reported as given, whatever the host says.
    Override(Capabilities),
    /// `--capabilities-file`: read afresh at every refresh (for tests).
    File(PathBuf),
}

impl CapabilitySource {
    /// The provider to ask at one refresh.
    pub fn provider(&self) -> Box<dyn EnvironProvider + Send> {
        match self {
            CapabilitySource::Host => Box::new(HostProvider::new(ThisHost)),
            CapabilitySource::Override(capabilities) => {
                Box::new(OverrideProvider(LocalProvider::new(capabilities.clone())))
            }
            CapabilitySource::File(path) => Box::new(FileProvider::new(path.clone())),
        }
    }

    /// The flags that name this source, for the launcher to hand to its worker.
    pub fn to_args(&self) -> Vec<String> {
        match self {
            CapabilitySource::Host => Vec::new(),
            CapabilitySource::Override(capabilities) => {
                vec![format!("--capabilities={}", list(capabilities))]
            }
            CapabilitySource::File(path) => {
                vec!["--capabilities-file".to_owned(), path.display().to_string()]
            }
        }
    }

    /// One line for the log at start: where the capabilities will come from.
    pub fn describe(&self) -> String {
        match self {
            CapabilitySource::Host => {
                "interrogating this host at every refresh (manage-firewall: nft or iptables \
                 on PATH and CAP_NET_ADMIN)"
                    .to_owned()
            }
            CapabilitySource::Override(capabilities) => format!(
                "--capabilities overrides the host's interrogation: the provider reports \
                 exactly [{}]",
                list(capabilities)
            ),
            CapabilitySource::File(path) => format!(
                "--capabilities-file: read from {} at every refresh",
                path.display()
            ),
        }
    }
}

/// `a,b`: capabilities as `--capabilities` takes them.
pub fn list(capabilities: &Capabilities) -> String {
    capabilities
        .iter()
        .map(Capability::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

/// `--capabilities`'s parser: the list, checked at start; the error names the bad value.
pub fn parse_override(text: &str) -> Result<Capabilities, String> {
    seed004::parse_capabilities(text).map_err(|error| error.to_string())
}

/// What the host interrogation reads, behind a trait so that tests can substitute it.
pub trait HostFacts {
    /// The first executable file named `name` in the directories of `PATH`.
    fn executable_on_path(&self, name: &str) -> Option<PathBuf>;
    /// This process's effective user id.
    fn effective_uid(&self) -> u32;
    /// The text of `/proc/self/status`; `None` where it cannot be read.
    fn proc_self_status(&self) -> Option<String>;
}

/// The host this process runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThisHost;

impl HostFacts for ThisHost {
    fn executable_on_path(&self, name: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    }

    fn effective_uid(&self) -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn proc_self_status(&self) -> Option<String> {
        std::fs::read_to_string("/proc/self/status").ok()
    }
}

/// A regular file this process may execute (checked with its effective ids).
fn is_executable(path: &Path) -> bool {
    path.metadata().is_ok_and(|metadata| metadata.is_file())
        && rustix::fs::accessat(
            rustix::fs::CWD,
            path,
            rustix::fs::Access::EXEC_OK,
            rustix::fs::AtFlags::EACCESS,
        )
        .is_ok()
}

/// The effective capability mask of a `/proc/<pid>/status` text (`CapEff:` in hex).
pub fn effective_capabilities(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
}

/// Whether this process may administer the network, and why.
///
/// The kernel asks for `CAP_NET_ADMIN` in the effective set, not for uid 0: root in a
/// container that dropped the capability cannot change the firewall. So `CapEff` decides
/// wherever it can be read, and effective uid 0 stands in for it only where it cannot
/// (no `/proc`).
pub fn may_administer_network(host: &dyn HostFacts) -> (bool, String) {
    let uid = host.effective_uid();
    match host
        .proc_self_status()
        .as_deref()
        .and_then(effective_capabilities)
    {
        Some(mask) => {
            let held = mask & (1 << CAP_NET_ADMIN) != 0;
            let says = if held { "has" } else { "lacks" };
            (
                held,
                format!("the process {says} CAP_NET_ADMIN (CapEff {mask:016x}, euid {uid})"),
            )
        }
        None if uid == 0 => (
            true,
            "the process runs as effective uid 0 (CapEff unreadable)".to_owned(),
        ),
        None => (
            false,
            format!("the process is not root (euid {uid}) and its CapEff cannot be read"),
        ),
    }
}

/// `manage-firewall` on this host: a firewall tool on `PATH` that the process may use.
/// The answer and the reason, in words for the log.
pub fn probe_firewall(host: &dyn HostFacts) -> (bool, String) {
    let tool = FIREWALL_TOOLS
        .iter()
        .find_map(|name| host.executable_on_path(name));
    let Some(tool) = tool else {
        return (
            false,
            format!(
                "no manage-firewall: neither {} is an executable on PATH",
                FIREWALL_TOOLS.join(" nor ")
            ),
        );
    };
    let (admin, why) = may_administer_network(host);
    if admin {
        (
            true,
            format!("manage-firewall: {} is on PATH and {why}", tool.display()),
        )
    } else {
        (
            false,
            format!(
                "no manage-firewall: {} is on PATH but {why}",
                tool.display()
            ),
        )
    }
}

/// The provider that interrogates the host at every refresh.
#[derive(Clone, Debug)]
pub struct HostProvider<H> {
    host: H,
}

impl<H: HostFacts> HostProvider<H> {
    pub fn new(host: H) -> HostProvider<H> {
        HostProvider { host }
    }
}

impl<H: HostFacts> EnvironProvider for HostProvider<H> {
    fn report(&self) -> Result<CapabilityReport, String> {
        let (firewall, reason) = probe_firewall(&self.host);
        let capabilities = if firewall {
            Capabilities::from_capabilities([Capability::MANAGE_FIREWALL])
                .expect("one capability fits")
        } else {
            Capabilities::new()
        };
        Ok(CapabilityReport {
            capabilities,
            reason: format!("host interrogated: {reason}"),
        })
    }
}

/// `--capabilities`: what the operator says, reported as such.
#[derive(Clone, Debug)]
pub struct OverrideProvider(pub LocalProvider);

impl EnvironProvider for OverrideProvider {
    fn report(&self) -> Result<CapabilityReport, String> {
        Ok(CapabilityReport {
            capabilities: self.0.capabilities().clone(),
            reason: "--capabilities overrides the host's interrogation".to_owned(),
        })
    }
}

/// `--capabilities-file`: the list in a file, read afresh at every refresh.
#[derive(Clone, Debug)]
pub struct FileProvider {
    path: PathBuf,
}

impl FileProvider {
    pub fn new(path: PathBuf) -> FileProvider {
        FileProvider { path }
    }
}

impl EnvironProvider for FileProvider {
    fn report(&self) -> Result<CapabilityReport, String> {
        let path = self.path.display();
        let text = std::fs::read_to_string(&self.path)
            .map_err(|error| format!("capabilities file {path}: cannot read it: {error}"))?;
        let capabilities = seed004::parse_capabilities(&text)
            .map_err(|error| format!("capabilities file {path}: {error}"))?;
        Ok(CapabilityReport {
            capabilities,
            reason: format!("read from capabilities file {path}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host made up by a test.
    struct Fake {
        on_path: &'static [&'static str],
        euid: u32,
        status: Option<&'static str>,
    }

    impl HostFacts for Fake {
        fn executable_on_path(&self, name: &str) -> Option<PathBuf> {
            self.on_path
                .contains(&name)
                .then(|| Path::new("/usr/sbin").join(name))
        }
        fn effective_uid(&self) -> u32 {
            self.euid
        }
        fn proc_self_status(&self) -> Option<String> {
            self.status.map(str::to_owned)
        }
    }

    const ALL_CAPS: &str =
        "Name:\tlockstepd\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
    const NET_ADMIN_ONLY: &str = "CapEff:\t0000000000001000\n";
    const NO_CAPS: &str = "CapEff:\t0000000000000000\n";
    /// Docker's default set for root: no CAP_NET_ADMIN.
    const DOCKER_ROOT: &str = "CapEff:\t00000000a80425fb\n";

    fn capabilities_of(host: Fake) -> (Vec<String>, String) {
        let report = HostProvider::new(host).report().unwrap();
        (
            report
                .capabilities
                .iter()
                .map(|c| c.as_str().to_owned())
                .collect(),
            report.reason,
        )
    }

    #[test]
    fn the_host_has_manage_firewall_with_a_tool_on_path_and_the_right_to_use_it() {
        let cases = [
            (
                &["nft"][..],
                0,
                Some(ALL_CAPS),
                true,
                "/usr/sbin/nft is on PATH and the process has CAP_NET_ADMIN",
            ),
            (
                &["iptables"][..],
                1000,
                Some(NET_ADMIN_ONLY),
                true,
                "/usr/sbin/iptables is on PATH and the process has CAP_NET_ADMIN",
            ),
            (
                &["nft", "iptables"][..],
                0,
                None,
                true,
                "/usr/sbin/nft is on PATH and the process runs as effective uid 0",
            ),
            (
                &[][..],
                0,
                Some(ALL_CAPS),
                false,
                "neither nft nor iptables is an executable on PATH",
            ),
            (
                &["iptables"][..],
                1000,
                Some(NO_CAPS),
                false,
                "the process lacks CAP_NET_ADMIN (CapEff 0000000000000000, euid 1000)",
            ),
            (
                &["iptables"][..],
                0,
                Some(DOCKER_ROOT),
                false,
                "the process lacks CAP_NET_ADMIN",
            ),
            (
                &["nft"][..],
                1000,
                None,
                false,
                "not root (euid 1000) and its CapEff cannot be read",
            ),
            (
                &["nft"][..],
                1000,
                Some("CapEff:\tnot hex\n"),
                false,
                "cannot be read",
            ),
        ];
        for (on_path, euid, status, expected, why) in cases {
            let (capabilities, reason) = capabilities_of(Fake {
                on_path,
                euid,
                status,
            });
            let expected_list: &[&str] = if expected { &["manage-firewall"] } else { &[] };
            assert_eq!(
                capabilities, expected_list,
                "{on_path:?} {euid} {status:?}: {reason}"
            );
            assert!(reason.contains(why), "{reason:?} does not say {why:?}");
            assert!(reason.starts_with("host interrogated: "), "{reason}");
        }
    }

    #[test]
    fn this_host_is_interrogated_as_the_process_sees_it() {
        let report = HostProvider::new(ThisHost).report().unwrap();
        let has = report.capabilities.contains(&Capability::MANAGE_FIREWALL);
        let tool = FIREWALL_TOOLS
            .iter()
            .find_map(|name| ThisHost.executable_on_path(name));
        assert_eq!(
            has,
            tool.is_some() && may_administer_network(&ThisHost).0,
            "{}",
            report.reason
        );
    }

    #[test]
    fn a_capabilities_file_is_read_afresh_at_every_refresh_and_its_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capabilities");
        let provider = CapabilitySource::File(path.clone()).provider();
        let error = provider.report().unwrap_err();
        assert!(
            error.starts_with(&format!(
                "capabilities file {}: cannot read it: ",
                path.display()
            )),
            "{error}"
        );
        std::fs::write(&path, "").unwrap();
        assert!(provider.report().unwrap().capabilities.is_empty());
        std::fs::write(&path, "manage-firewall\n").unwrap();
        let report = provider.report().unwrap();
        assert_eq!(list(&report.capabilities), "manage-firewall");
        assert_eq!(
            report.reason,
            format!("read from capabilities file {}", path.display())
        );
        std::fs::write(&path, "manage-firewall, Manage_Networking\n").unwrap();
        let error = provider.report().unwrap_err();
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(error.contains("\"Manage_Networking\""), "{error}");
    }

    #[test]
    fn an_override_is_reported_as_given_and_handed_to_the_worker_as_given() {
        let capabilities = parse_override("manage-networking manage-firewall").unwrap();
        let source = CapabilitySource::Override(capabilities.clone());
        let report = source.provider().report().unwrap();
        assert_eq!(report.capabilities, capabilities);
        assert_eq!(
            report.reason,
            "--capabilities overrides the host's interrogation"
        );
        assert_eq!(
            source.to_args(),
            ["--capabilities=manage-firewall,manage-networking"]
        );
        assert!(
            source.describe().contains("overrides"),
            "{}",
            source.describe()
        );
        let none = CapabilitySource::Override(Capabilities::new());
        assert_eq!(none.to_args(), ["--capabilities="]);
        assert!(none.provider().report().unwrap().capabilities.is_empty());
        assert!(CapabilitySource::Host.to_args().is_empty());
        let error = parse_override("manage-firewall,BAD").unwrap_err();
        assert!(error.contains("\"BAD\""), "{error}");
    }
}
