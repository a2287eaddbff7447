//! The model's agent-binary metadata source (`agent-metadata-url`, `--metadata-source`)
//! as one async source: a local directory or an HTTP(S) mirror. Used by the daemon to look
//! binaries up and stage them, and by `lockstep bootstrap` to install the first one.
//!
//! [`MetadataTrust`]: which metadata every lookup accepts, as the operator chose at
//! bootstrap (`--metadata-key`, `--allow-unsigned-metadata`) and `agent.conf` pins, and
//! which certificate authorities an `https://` mirror may present (the system's, and
//! `--metadata-ca`). Over plain `http://` only signed metadata is accepted: there, anyone
//! on the path could rewrite unsigned metadata.

use lockstep_core::policy::CatalogueEntry;
use lockstep_streams::{
    AsyncSource, DirectorySource, HttpSource, Keyring, LookupConfig, LookupError, RedirectRule,
    SourceError,
};

use rustls::pki_types::CertificateDer;

use crate::datadir::{AgentConf, DataDir, read_keyring, read_metadata_ca};

/// Which metadata this agent's lookups accept: read from `agent.conf` and the keyring file
/// it names, never from the shared store or the API, so that whoever can change
/// `agent-metadata-url` cannot change what must sign it.
///
/// | `agent.conf` | lookups accept |
/// |---|---|
/// | `metadata-keyring` | only `.sjson` metadata signed by one of its keys |
/// | `metadata-keyring`, `allow-unsigned-metadata` | signed metadata that verifies, else unsigned `.json` |
/// | `allow-unsigned-metadata` | unsigned `.json` metadata |
/// | neither (a controller bootstrapped from its local binary) | nothing |
///
/// Over plain `http://`, unsigned metadata is never accepted, whatever `agent.conf` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataTrust {
    /// The pinned keys; empty when none was given.
    pub keyring: Keyring,
    /// `--allow-unsigned-metadata`.
    pub allow_unsigned: bool,
    /// `--metadata-ca`: certificate authorities an `https://` mirror may chain to besides
    /// the system's.
    pub mirror_cas: Vec<CertificateDer<'static>>,
    /// `--allow-metadata-redirects`: an `https://` mirror's redirects are followed to other
    /// hosts too (by default only to its own host).
    pub redirects_to_other_hosts: bool,
    /// Why the pinned keys could not be read (a missing or replaced `metadata-keys.asc`):
    /// every lookup is then refused with this reason.
    pub problem: Option<String>,
}

impl MetadataTrust {
    /// The trust `conf` pins: its keyring file, read and checked against the fingerprints
    /// it pins. A problem with the file is kept (every lookup then refuses, naming it) rather
    /// than stopping the agent: the controller serves on, it only upgrades nothing.
    pub fn of(data: &DataDir, conf: &AgentConf) -> MetadataTrust {
        let mut trust = MetadataTrust {
            keyring: Keyring::empty(),
            allow_unsigned: conf.allow_unsigned_metadata,
            mirror_cas: Vec::new(),
            redirects_to_other_hosts: conf.allow_metadata_redirects,
            problem: None,
        };
        if let Some(path) = &conf.metadata_ca {
            let path = data.root().join(path);
            match read_metadata_ca(&path) {
                Ok((_, certificates)) => trust.mirror_cas = certificates,
                Err(error) => {
                    trust.problem = Some(format!(
                        "cannot read the mirror's certificate authorities {} pins: {error}; \
                         no metadata is read until they are restored",
                        data.agent_conf_path().display()
                    ));
                    return trust;
                }
            }
        }
        let Some(path) = &conf.metadata_keyring else {
            return trust;
        };
        let path = data.root().join(path);
        match read_keyring(&path) {
            Ok(keyring) if keyring.fingerprints() == conf.metadata_key_fingerprints => {
                trust.keyring = keyring;
            }
            Ok(keyring) => {
                trust.problem = Some(format!(
                    "{} holds the keys {:?}, but {} pins {:?}: the keyring was replaced; \
                     no metadata is accepted until it is restored",
                    path.display(),
                    keyring.fingerprints(),
                    data.agent_conf_path().display(),
                    conf.metadata_key_fingerprints
                ));
            }
            Err(error) => {
                trust.problem = Some(format!(
                    "cannot read the metadata keys {} pins: {error}; no metadata is \
                     accepted until they are restored",
                    data.agent_conf_path().display()
                ));
            }
        }
        trust
    }

    /// The trust of a new controller: `keyring` (perhaps empty) and the operator's flag;
    /// no certificate authority but the system's (see [`MetadataTrust::with_mirror_cas`]).
    pub fn new(keyring: Keyring, allow_unsigned: bool) -> MetadataTrust {
        MetadataTrust {
            keyring,
            allow_unsigned,
            mirror_cas: Vec::new(),
            redirects_to_other_hosts: false,
            problem: None,
        }
    }

    /// This trust, following an `https://` mirror's redirects to other hosts or not.
    pub fn with_redirects_to_other_hosts(self, allowed: bool) -> MetadataTrust {
        MetadataTrust {
            redirects_to_other_hosts: allowed,
            ..self
        }
    }

    /// This trust, with `certificates` trusted for an `https://` mirror.
    pub fn with_mirror_cas(self, certificates: Vec<CertificateDer<'static>>) -> MetadataTrust {
        MetadataTrust {
            mirror_cas: certificates,
            ..self
        }
    }

    /// Pins this trust in `conf`, the keyring having been written at `keyring_path` and the
    /// mirror's certificate authorities at `ca_path`.
    pub fn pin(
        &self,
        conf: &mut AgentConf,
        keyring_path: Option<std::path::PathBuf>,
        ca_path: Option<std::path::PathBuf>,
    ) {
        conf.metadata_ca = ca_path;
        conf.metadata_keyring = keyring_path;
        conf.metadata_key_fingerprints = self.keyring.fingerprints();
        conf.allow_unsigned_metadata = self.allow_unsigned;
        conf.allow_metadata_redirects = self.redirects_to_other_hosts;
    }

    /// The configuration of a lookup at `url`; `Err` (the reason) when the pinned keys are
    /// unusable, or when `url` is plain `http://` and no key is pinned: over plain http,
    /// unsigned metadata is refused even with `--allow-unsigned-metadata`.
    pub fn lookup_config(&self, url: &str) -> Result<LookupConfig, String> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        let plain_http = url.starts_with("http://");
        if plain_http && self.keyring.is_empty() {
            return Err(format!(
                "{url} is plain http, and over plain http only signed metadata is accepted \
                 (anyone on the path could rewrite unsigned metadata), but no key is pinned: \
                 sign the mirror's metadata and bootstrap with --metadata-key FILE, or serve \
                 the mirror over https (--metadata-ca FILE for its own certificate authority)"
            ));
        }
        Ok(LookupConfig {
            allow_unsigned: self.allow_unsigned && !plain_http,
            ..LookupConfig::signed_by(self.keyring.clone())
        })
    }

    /// The HTTP(S) settings of a mirror under this trust: the system's certificate
    /// authorities and `--metadata-ca`'s; redirects only to https, and only on the same host
    /// unless `--allow-metadata-redirects`.
    pub fn http_config(&self) -> lockstep_streams::HttpConfig {
        lockstep_streams::HttpConfig {
            trusted_certificates: self.mirror_cas.clone(),
            redirect_to_other_hosts: self.redirects_to_other_hosts,
            ..lockstep_streams::HttpConfig::default()
        }
    }

    /// True when unsigned metadata is accepted.
    pub fn allows_unsigned(&self) -> bool {
        self.allow_unsigned && self.problem.is_none()
    }

    /// What `lockstep status` shows as `metadata-verification`: `signed (key <fingerprint>)`,
    /// `unsigned-allowed`, both, `none (...)` or `broken: ...`; with `; redirects to other
    /// hosts followed` after it under `--allow-metadata-redirects`.
    pub fn describe(&self) -> String {
        if let Some(problem) = &self.problem {
            return format!("broken: {problem}");
        }
        let verification = self.describe_keys();
        match self.redirects_to_other_hosts {
            true => format!("{verification}; redirects to other hosts followed"),
            false => verification,
        }
    }

    fn describe_keys(&self) -> String {
        let fingerprints = self.keyring.fingerprints();
        let signed = match fingerprints.as_slice() {
            [] => None,
            [one] => Some(format!("signed (key {one})")),
            many => Some(format!("signed (keys {})", many.join(", "))),
        };
        match (signed, self.allow_unsigned) {
            (Some(signed), false) => signed,
            (Some(signed), true) => format!("unsigned-allowed, else {signed}"),
            (None, true) => "unsigned-allowed".to_owned(),
            (None, false) => {
                "none (bootstrapped without --metadata-key: all metadata refused)".to_owned()
            }
        }
    }

    /// A hint for an error of a lookup under this trust: the flags that choose it.
    pub fn hint(&self, error: &LookupError) -> String {
        if let LookupError::Source(SourceError::RedirectRefused {
            rule: RedirectRule::SameHost,
            ..
        }) = error
            && !self.redirects_to_other_hosts
        {
            return " (a redirect to another https host is followed only when the controller \
                    was bootstrapped with --allow-metadata-redirects)"
                .to_owned();
        }
        let signature =
            matches!(error, LookupError::Metadata(error) if error.field == "(signature)");
        if !signature {
            return String::new();
        }
        format!(
            " (metadata verification: {}; the keys are chosen at bootstrap with \
             --metadata-key FILE, unsigned metadata accepted only with \
             --allow-unsigned-metadata)",
            self.describe()
        )
    }
}

/// The model's metadata source, as an async source.
#[derive(Debug)]
pub enum MetadataSource {
    Directory(DirectorySource),
    /// Boxed: an HTTP source carries its client and limits.
    Http(Box<HttpSource>),
}

impl MetadataSource {
    /// `http://` and `https://` URLs are fetched, trusting the certificate authorities
    /// `trust` names; anything else is a local directory (`file://` or a path).
    pub fn open(url: &str, trust: &MetadataTrust) -> Result<MetadataSource, SourceError> {
        if url.starts_with("http://") || url.starts_with("https://") {
            HttpSource::new(url, trust.http_config())
                .map(|source| MetadataSource::Http(Box::new(source)))
        } else {
            DirectorySource::from_url(url).map(MetadataSource::Directory)
        }
    }

    pub async fn look_up(
        &self,
        mark: &lockstep_streams::HighWaterMarkFile,
        config: &LookupConfig,
        now: u64,
    ) -> Result<lockstep_streams::Lookup, lockstep_streams::LookupError> {
        match self {
            MetadataSource::Directory(source) => {
                lockstep_streams::look_up_async(source, mark, config, now).await
            }
            MetadataSource::Http(source) => {
                lockstep_streams::look_up_async(&**source, mark, config, now).await
            }
        }
    }

    pub async fn download(
        &self,
        entry: &CatalogueEntry,
        destination: &std::path::Path,
        progress: &mut (dyn FnMut(lockstep_streams::DownloadProgress) + Send),
    ) -> Result<(), lockstep_streams::DownloadError> {
        match self {
            MetadataSource::Directory(source) => {
                AsyncSource::download(source, entry, destination, progress).await
            }
            MetadataSource::Http(source) => {
                AsyncSource::download(&**source, entry, destination, progress).await
            }
        }
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use lockstep_core::lifecycle::Snapshot;
    use lockstep_core::version::{Binary, Version};
    use lockstep_streams::SigningKey;

    use super::*;

    fn conf() -> AgentConf {
        let binary = Binary::new(Version::new(2, 9, 43), "ubuntu", "amd64").unwrap();
        AgentConf::new("machine-0", Snapshot::bootstrapped(&binary))
    }

    fn keyring(key: &SigningKey) -> Keyring {
        Keyring::from_bytes(key.public_key_armored().unwrap().as_bytes()).unwrap()
    }

    #[test]
    fn the_pinned_keys_are_read_from_the_data_dir_and_must_match_agent_conf() {
        let root = tempfile::tempdir().unwrap();
        let data = DataDir::new(root.path());
        let key = SigningKey::generate("pinned <pinned@example.invalid>").unwrap();
        let trust = MetadataTrust::new(keyring(&key), false);
        let path = data.write_metadata_keys(&trust.keyring).unwrap();
        let mut conf = conf();
        trust.pin(&mut conf, Some(path.clone()), None);
        assert_eq!(conf.metadata_key_fingerprints, vec![key.fingerprint()]);
        // Through agent.conf's text and back.
        let conf = AgentConf::parse(&conf.to_yaml().unwrap(), &data.agent_conf_path()).unwrap();
        let read = MetadataTrust::of(&data, &conf);
        assert_eq!(read, trust);
        assert_eq!(
            read.describe(),
            format!("signed (key {})", key.fingerprint())
        );
        let config = read.lookup_config("/srv/mirror").unwrap();
        assert!(!config.allow_unsigned);
        assert_eq!(config.keyring.fingerprints(), vec![key.fingerprint()]);

        // Another key written over the file: refused, naming both fingerprints.
        let other = SigningKey::generate("other <other@example.invalid>").unwrap();
        data.write_metadata_keys(&keyring(&other)).unwrap();
        let replaced = MetadataTrust::of(&data, &conf);
        let problem = replaced.lookup_config("/srv/mirror").unwrap_err();
        assert!(
            problem.contains(&key.fingerprint()) && problem.contains(&other.fingerprint()),
            "{problem}"
        );
        assert!(replaced.describe().starts_with("broken: "), "{replaced:?}");
        assert!(!replaced.allows_unsigned());

        // The file gone: refused, naming it.
        std::fs::remove_file(&path).unwrap();
        let problem = MetadataTrust::of(&data, &conf)
            .lookup_config("/srv/mirror")
            .unwrap_err();
        assert!(problem.contains("metadata-keys.asc"), "{problem}");
    }

    #[test]
    fn each_choice_is_described_and_configures_the_lookup() {
        let root = tempfile::tempdir().unwrap();
        let data = DataDir::new(root.path());
        // Neither flag: nothing is accepted.
        let none = MetadataTrust::of(&data, &conf());
        let config = none.lookup_config("/srv/mirror").unwrap();
        assert!(config.keyring.is_empty() && !config.allow_unsigned);
        assert!(none.describe().starts_with("none"), "{}", none.describe());
        // Unsigned allowed, with and without a key.
        let mut conf = conf();
        conf.allow_unsigned_metadata = true;
        let unsigned = MetadataTrust::of(&data, &conf);
        assert_eq!(unsigned.describe(), "unsigned-allowed");
        assert!(
            unsigned
                .lookup_config("/srv/mirror")
                .unwrap()
                .allow_unsigned
        );
        assert!(
            unsigned
                .lookup_config("https://mirror.example.invalid/")
                .unwrap()
                .allow_unsigned
        );
        // Over plain http, unsigned metadata is never accepted: without a key, nothing is.
        let problem = unsigned
            .lookup_config("http://mirror.example.invalid/")
            .unwrap_err();
        assert!(
            problem.contains("over plain http only signed metadata is accepted"),
            "{problem}"
        );
        let key = SigningKey::generate("both <both@example.invalid>").unwrap();
        let both = MetadataTrust::new(keyring(&key), true);
        assert_eq!(
            both.describe(),
            format!("unsigned-allowed, else signed (key {})", key.fingerprint())
        );
        // With a key, plain http reads signed metadata only.
        let config = both
            .lookup_config("http://mirror.example.invalid/")
            .unwrap();
        assert!(!config.allow_unsigned);
        assert_eq!(config.keyring.fingerprints(), vec![key.fingerprint()]);
    }

    #[test]
    fn only_a_redirect_refused_for_its_host_is_hinted_at_allow_metadata_redirects() {
        let refused = |rule| {
            LookupError::Source(SourceError::RedirectRefused {
                location: "https://mirror.example.invalid/tools".to_owned(),
                path: "\"streams/v1/index.sjson\"".to_owned(),
                rule,
                problem: "refused".to_owned(),
            })
        };
        let trust = MetadataTrust::new(Keyring::empty(), false);
        assert!(
            trust
                .hint(&refused(RedirectRule::SameHost))
                .contains("--allow-metadata-redirects")
        );
        // The flag would not change these: no hint names it.
        for rule in [RedirectRule::HttpsOnly, RedirectRule::TooMany] {
            assert_eq!(trust.hint(&refused(rule)), "", "{rule:?}");
        }
        // Already allowed: nothing to hint (and other hosts are followed).
        let allowing = trust.with_redirects_to_other_hosts(true);
        assert_eq!(allowing.hint(&refused(RedirectRule::SameHost)), "");
        assert!(allowing.http_config().redirect_to_other_hosts);
        assert!(
            allowing
                .describe()
                .ends_with("; redirects to other hosts followed")
        );
    }
}
