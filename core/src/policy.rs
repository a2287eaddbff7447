//! The upgrade policy (seed 001): which agent binary a controller should run, chosen from a
//! catalogue of published binaries, and the guard against rolled-back or frozen catalogues.
//!
//! # The rule
//!
//! An agent never changes version by surprise. Bug lp:1455260 (seed 001) is the story of
//! Juju 1.2x setting a fresh controller's `agent-version` to the newest patch in streams, so
//! that it upgraded itself while deploy scripts were already talking to it. Juju 1.25 added
//! `--agent-version` and `--no-auto-upgrade`, and Juju 2.0 made the implicit upgrade opt-in
//! with `--auto-upgrade`. lockstep follows Juju 2.x:
//!
//! | policy | [`Occasion::Bootstrap`] | [`Occasion::Periodic`] | [`Occasion::OperatorRequest`] |
//! |---|---|---|---|
//! | [`UpgradePolicy::Off`] (default) | stay, report | stay, report | newest patch, or `V` exactly |
//! | [`UpgradePolicy::AutoPatch`] | newest patch | stay, report | newest patch, or `V` exactly |
//! | [`UpgradePolicy::Pinned`] | the pin exactly | stay, report | the pin exactly |
//! | [`UpgradePolicy::LocalBinary`] | the file | stay, report | the file |
//!
//! "Report" is `upgrade-available` in status: the newest candidate of the running
//! major.minor strictly newer than the running version (Juju's controller worker that checks
//! streams every 6 hours, `apiserver/facades/controller/agenttools`). "Newest patch" never
//! leaves the running major.minor. Nothing selects a version lower than the running one
//! except a pin, which is the operator's exact word.
//!
//! # Streams
//!
//! Binaries are published in four streams, `released`, `proposed`, `devel` and `testing`.
//! An agent searches a list of them in fallback order, Juju's `PreferredStreams`
//! (`environs/tools/tools.go`): an explicit non-released `agent-stream` brings its
//! fallbacks; otherwise a development version (pre-release tag or build number, Juju's
//! `IsDev`) searches `devel, proposed, released`, and a release searches `released` only.
//! Candidates are the union of every searched stream; when the same binary is in several,
//! the entry of the earlier stream wins (Juju's `FindToolsForCloud`).
//!
//! # Rollback and freeze
//!
//! [`HighWaterMark`] remembers the newest catalogue metadata accepted and the highest
//! version it listed, as a TUF client remembers its trusted metadata: older metadata is a
//! rollback attack, metadata not refreshed within a bound is a freeze attack. The streams
//! adapter and the simulator share it; time comes in as data.

// Errors carry the offending binaries by value so that messages can name them. They are
// cold: boxing them would cost an allocation and clumsier matching for no gain, and the
// `Ok` side of `select` (a catalogue entry) is as large.
#![expect(
    clippy::result_large_err,
    reason = "errors are cold and as large as the decisions they replace"
)]

use std::fmt;
use std::str::FromStr;

use crate::version::{Binary, Version};

/// The most entries a [`Catalogue`] may hold. Juju's public streams list a few thousand
/// binaries across every version, OS and architecture; this leaves room for a decade of
/// releases while bounding the work and memory one catalogue costs.
pub const ENTRIES_MAX: usize = 100_000;

/// The longest path a [`CatalogueEntry`] may carry, in bytes. Simplestreams paths such as
/// `agent/2.9.43/juju-2.9.43-ubuntu-amd64.tgz` are under 100 bytes.
pub const PATH_LENGTH_MAX: usize = 1024;

/// The largest agent binary a [`CatalogueEntry`] may announce, in bytes (4 GiB). Juju's
/// tarballs are about 100 MiB; the fetch is bounded by the announced size, so a bound on
/// the announcement bounds the download.
pub const SIZE_BYTES_MAX: u64 = 4 << 30;

/// The most characters of an offending input quoted in an error: a multi-megabyte bad
/// digest must not become a multi-megabyte log line.
const QUOTE_LENGTH_MAX: usize = 100;

// ---------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------

/// An agent-binary stream, Juju's `agent-stream` (formerly `tools-stream`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Stream {
    /// Final releases. The default.
    Released,
    /// Release candidates proposed for release.
    Proposed,
    /// Development builds: alphas, betas.
    Devel,
    /// Builds under test by Juju's CI.
    Testing,
}

impl Stream {
    /// Every stream, in order of stability.
    pub const ALL: [Stream; 4] = [
        Stream::Released,
        Stream::Proposed,
        Stream::Devel,
        Stream::Testing,
    ];

    /// The name in config and simplestreams: `released`, `proposed`, `devel`, `testing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Released => "released",
            Stream::Proposed => "proposed",
            Stream::Devel => "devel",
            Stream::Testing => "testing",
        }
    }

    /// Parses a stream name exactly as written in `agent-stream`.
    pub fn parse(text: &str) -> Result<Stream, PolicyError> {
        Stream::ALL
            .into_iter()
            .find(|stream| stream.as_str() == text)
            .ok_or_else(|| PolicyError::UnknownStream { text: quote(text) })
    }

    /// This stream and the streams searched after it when it lacks a binary, Juju's
    /// `streamFallbacks`: each stream falls back to every more stable one.
    pub fn fallbacks(self) -> &'static [Stream] {
        const FALLBACKS: [Stream; 4] = [
            Stream::Testing,
            Stream::Devel,
            Stream::Proposed,
            Stream::Released,
        ];
        let fallbacks = match self {
            Stream::Testing => &FALLBACKS[0..],
            Stream::Devel => &FALLBACKS[1..],
            Stream::Proposed => &FALLBACKS[2..],
            Stream::Released => &FALLBACKS[3..],
        };
        assert_eq!(fallbacks[0], self);
        assert_eq!(fallbacks[fallbacks.len() - 1], Stream::Released);
        fallbacks
    }

    /// The streams to search, in preference order, Juju's `PreferredStreams`: an explicit
    /// stream other than `released` wins with its fallbacks; otherwise a development
    /// version (a pre-release tag such as `1.25-beta1`, or a build number such as
    /// `2.9.43.1`: Juju's `IsDev`) searches `devel, proposed, released`, and a release
    /// searches `released` only. An explicit `released` is the same as none, as in Juju.
    ///
    /// Juju's `IsDev` also treats an odd minor at or below 1.19.9 as development (its old
    /// numbering); lockstep's own versions never used that scheme, so it is not reproduced.
    pub fn preferred(explicit: Option<Stream>, running: &Version) -> &'static [Stream] {
        match explicit {
            Some(stream) if stream != Stream::Released => stream.fallbacks(),
            _ if is_development(running) => Stream::Devel.fallbacks(),
            _ => Stream::Released.fallbacks(),
        }
    }
}

/// Juju's `IsDev` for versions after its 1.19.9 switch-over: a tag or a build number.
fn is_development(version: &Version) -> bool {
    version.tag.is_some() || version.build > 0
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Stream {
    type Err = PolicyError;
    fn from_str(text: &str) -> Result<Stream, PolicyError> {
        Stream::parse(text)
    }
}

impl serde::Serialize for Stream {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Stream {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Stream, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Stream::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Displays a stream list as `[devel, proposed, released]`.
struct StreamList<'a>(&'a [Stream]);

impl fmt::Display for StreamList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (index, stream) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            f.write_str(stream.as_str())?;
        }
        f.write_str("]")
    }
}

// ---------------------------------------------------------------------------------------
// Digests and the catalogue
// ---------------------------------------------------------------------------------------

/// A SHA-256 digest of an agent binary tarball, written as 64 hexadecimal digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Length of the text form, in hexadecimal digits.
    pub const HEX_LENGTH: usize = 64;

    /// Parses exactly 64 hexadecimal digits (either case); the error quotes the input.
    pub fn parse(text: &str) -> Result<Sha256, PolicyError> {
        let error = || PolicyError::InvalidSha256 {
            text: quote(text),
            length_chars: text.chars().count(),
        };
        let bytes = text.as_bytes();
        if bytes.len() != Sha256::HEX_LENGTH {
            return Err(error());
        }
        let mut digest = [0u8; 32];
        for (index, pair) in bytes.chunks_exact(2).enumerate() {
            let high = hex_value(pair[0]).ok_or_else(error)?;
            let low = hex_value(pair[1]).ok_or_else(error)?;
            digest[index] = high << 4 | low;
        }
        Ok(Sha256(digest))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({self})")
    }
}

impl FromStr for Sha256 {
    type Err = PolicyError;
    fn from_str(text: &str) -> Result<Sha256, PolicyError> {
        Sha256::parse(text)
    }
}

impl serde::Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Sha256, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Sha256::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// One published agent binary: Juju's `tools.Tools` as read from simplestreams.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct CatalogueEntry {
    /// Version, release (OS or series) and architecture.
    pub binary: Binary,
    /// The stream that lists it.
    pub stream: Stream,
    /// Size of the tarball; the fetch reads at most this many bytes.
    pub size_bytes: u64,
    /// Digest of the tarball; the fetch verifies it before anything is installed.
    pub sha256: Sha256,
    /// Where the tarball lives, relative to the metadata source
    /// (`agent/2.9.43/juju-2.9.43-ubuntu-amd64.tgz`).
    pub path: String,
}

/// The agent binaries a metadata source publishes, validated: at most [`ENTRIES_MAX`]
/// entries, each binary listed at most once per stream, sorted by binary then stream.
#[derive(Clone, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "CatalogueData")]
pub struct Catalogue {
    entries: Vec<CatalogueEntry>,
}

/// The unvalidated form a catalogue is deserialized from.
#[derive(serde::Deserialize)]
struct CatalogueData {
    entries: Vec<CatalogueEntry>,
}

impl TryFrom<CatalogueData> for Catalogue {
    type Error = PolicyError;
    fn try_from(data: CatalogueData) -> Result<Catalogue, PolicyError> {
        Catalogue::new(data.entries)
    }
}

impl Catalogue {
    /// Validates and normalises entries. Refused: more than [`ENTRIES_MAX`] entries; an
    /// entry with an empty or over-long path or a size of 0 or over [`SIZE_BYTES_MAX`];
    /// one binary listed twice in one stream with a different sha256 or size (the metadata
    /// contradicts itself, so neither entry can be trusted). Identical duplicates (same
    /// sha256 and size) collapse into the first one listed.
    pub fn new(mut entries: Vec<CatalogueEntry>) -> Result<Catalogue, PolicyError> {
        if entries.len() > ENTRIES_MAX {
            return Err(PolicyError::CatalogueTooLarge {
                entries_count: entries.len(),
            });
        }
        for entry in &entries {
            check_entry(entry)?;
        }
        // Stable: among duplicates, the first listed stays first and is the one kept.
        entries.sort_by(|a, b| a.binary.cmp(&b.binary).then(a.stream.cmp(&b.stream)));
        let mut kept: Vec<CatalogueEntry> = Vec::with_capacity(entries.len());
        for entry in entries {
            match kept.last() {
                Some(last) if last.binary == entry.binary && last.stream == entry.stream => {
                    if last.sha256 != entry.sha256 || last.size_bytes != entry.size_bytes {
                        return Err(PolicyError::CatalogueConflict {
                            binary: entry.binary,
                            stream: entry.stream,
                            first_sha256: last.sha256,
                            first_size_bytes: last.size_bytes,
                            second_sha256: entry.sha256,
                            second_size_bytes: entry.size_bytes,
                        });
                    }
                }
                _ => kept.push(entry),
            }
        }
        let catalogue = Catalogue { entries: kept };
        assert!(catalogue.entries.len() <= ENTRIES_MAX);
        assert!(
            catalogue.entries.windows(2).all(|pair| {
                (&pair[0].binary, pair[0].stream) < (&pair[1].binary, pair[1].stream)
            })
        );
        Ok(catalogue)
    }

    /// The entries, sorted by binary then stream, without duplicates.
    pub fn entries(&self) -> &[CatalogueEntry] {
        &self.entries
    }

    /// The highest version listed for any release, architecture and stream; what the
    /// [`HighWaterMark`] remembers.
    pub fn highest_version(&self) -> Option<Version> {
        self.entries.iter().map(|entry| entry.binary.number).max()
    }

    /// The binaries an agent of this release and architecture may run, searching `streams`
    /// in preference order: the union of the streams, one entry per binary, taken from the
    /// earliest stream that lists it (Juju's `FindToolsForCloud`). Ascending by version.
    pub fn candidates<'a, 'query>(
        &'a self,
        release: &'query str,
        arch: &'query str,
        streams: &'query [Stream],
    ) -> impl Iterator<Item = &'a CatalogueEntry> + use<'a, 'query> {
        self.entries
            .chunk_by(|a, b| a.binary == b.binary)
            .filter(move |group| group[0].binary.release == release && group[0].binary.arch == arch)
            .filter_map(move |group| {
                streams
                    .iter()
                    .find_map(|stream| group.iter().find(|entry| entry.stream == *stream))
            })
    }

    /// The entry that serves exactly `binary`: from the first stream that lists it, searching
    /// the streams Juju prefers for that binary's version (`Stream::preferred(model_stream,
    /// &binary.number)`, Juju's `PreferredStreams(&version, ..., agent-stream)`), and from no
    /// other stream. A binary listed only in a stream the model does not search is not
    /// served: a `released` model never hands out a `devel` build.
    ///
    /// This is the one rule for "which entry serves a binary": the version decision
    /// ([`select`] for an exact version), the controller's `Upgrader.Tools` answer and its
    /// tools endpoint all use it.
    pub fn entry_for(
        &self,
        binary: &Binary,
        model_stream: Option<Stream>,
    ) -> Option<&CatalogueEntry> {
        let streams = Stream::preferred(model_stream, &binary.number);
        let listed = self.listed(binary);
        let entry = streams
            .iter()
            .find_map(|stream| listed.iter().find(|entry| entry.stream == *stream));
        if let Some(entry) = entry {
            assert_eq!(entry.binary, *binary);
            assert!(streams.contains(&entry.stream));
        }
        entry
    }

    /// True when some binary of exactly `version` (any release, any architecture) is listed
    /// in a stream the model searches for that version (`Stream::preferred(model_stream,
    /// &version)`): the catalogue check of an operator's `agent-version` change (Juju's
    /// `no agent binaries found for version`).
    pub fn lists_version(&self, version: Version, model_stream: Option<Stream>) -> bool {
        let streams = Stream::preferred(model_stream, &version);
        self.entries
            .iter()
            .any(|entry| entry.binary.number == version && streams.contains(&entry.stream))
    }

    /// The entries of exactly `binary`, one per stream (the entries are sorted by binary).
    fn listed(&self, binary: &Binary) -> &[CatalogueEntry] {
        let start = self.entries.partition_point(|entry| entry.binary < *binary);
        let end = start
            + self.entries[start..]
                .iter()
                .take_while(|entry| entry.binary == *binary)
                .count();
        &self.entries[start..end]
    }

    /// The candidate of exactly `version` for this release and architecture, if any.
    pub fn find(
        &self,
        version: Version,
        release: &str,
        arch: &str,
        streams: &[Stream],
    ) -> Option<&CatalogueEntry> {
        self.candidates(release, arch, streams)
            .find(|entry| entry.binary.number == version)
    }

    /// The newest candidate of the running major.minor strictly newer than the running
    /// version: `upgrade-available`, and what a patch upgrade selects.
    pub fn newest_patch(&self, running: &Binary, streams: &[Stream]) -> Option<&CatalogueEntry> {
        let newest = self
            .candidates(&running.release, &running.arch, streams)
            .filter(|entry| {
                entry.binary.number.same_minor(&running.number)
                    && entry.binary.number > running.number
            })
            .max_by_key(|entry| entry.binary.number);
        if let Some(entry) = newest {
            assert!(entry.binary.number > running.number);
            assert!(entry.binary.number.same_minor(&running.number));
        }
        newest
    }
}

fn check_entry(entry: &CatalogueEntry) -> Result<(), PolicyError> {
    let invalid = |field, value: String, expected| PolicyError::CatalogueEntryInvalid {
        binary: entry.binary.clone(),
        stream: entry.stream,
        field,
        value,
        expected,
    };
    if entry.path.is_empty() || entry.path.len() > PATH_LENGTH_MAX {
        return Err(invalid(
            "path",
            format!("{:?} ({} bytes)", quote(&entry.path), entry.path.len()),
            "a path of 1 to 1024 bytes",
        ));
    }
    if entry.size_bytes == 0 || entry.size_bytes > SIZE_BYTES_MAX {
        return Err(invalid(
            "size",
            format!("{} bytes", entry.size_bytes),
            "1 byte to 4 GiB",
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Policy and selection
// ---------------------------------------------------------------------------------------

/// How a controller chooses its agent version, set at bootstrap and kept in the model.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePolicy {
    /// Juju 2.x's default: stay on the running version and report the newest patch of the
    /// same major.minor as `upgrade-available`; upgrade only on `upgrade-controller`.
    #[default]
    Off,
    /// `--auto-upgrade`: at bootstrap, upgrade to the newest patch of the running
    /// major.minor before bootstrap returns; later patches are only reported (CONTRACT.md,
    /// "Versions").
    AutoPatch,
    /// `agent-version`: exactly this version, never anything else, lower ones included.
    Pinned(Version),
    /// `--build-agent` (formerly `--upload-tools`): this explicit file, with its own
    /// release, architecture and recorded digest, never guessed from the client machine.
    LocalBinary {
        /// Version, release and architecture the file was built for.
        binary: Binary,
        /// Digest recorded when the file was built or uploaded.
        sha256: Sha256,
        /// Size recorded when the file was built or uploaded.
        size_bytes: u64,
    },
}

/// Why the desired agent version is being decided.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Occasion {
    /// The controller's first start (CheckingAgentVersion after bootstrap).
    Bootstrap,
    /// The 6-hourly check while Ready: reports `upgrade-available`, never upgrades.
    Periodic,
    /// `upgrade-controller [--agent-version V]`: `V` exactly (never lower than running;
    /// pin with `agent-version` for that), or without `V` the newest patch of the running
    /// major.minor.
    OperatorRequest {
        /// The `--agent-version` given, if any.
        version: Option<Version>,
    },
}

/// Everything [`select`] decides from, besides the catalogue.
#[derive(Clone, Copy, Debug)]
pub struct SelectionRequest<'a> {
    /// The binary this agent runs now; only candidates of its release and arch qualify.
    pub running: &'a Binary,
    /// The model's upgrade policy.
    pub policy: &'a UpgradePolicy,
    /// The model's `agent-stream`, if set.
    pub stream: Option<Stream>,
    /// Why the decision is being made.
    pub occasion: Occasion,
}

/// What the agent should do about its version.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Keep running the current binary.
    Stay {
        /// Newest candidate of the running major.minor strictly newer than running: what
        /// status shows as `upgrade-available`.
        upgrade_available: Option<Version>,
    },
    /// Fetch this catalogue entry (at most its size, verifying its sha256) and switch.
    Upgrade {
        /// The chosen binary.
        entry: CatalogueEntry,
    },
    /// Switch to the operator's local binary.
    UseLocal {
        /// Version, release and architecture of the file.
        binary: Binary,
        /// Digest the file must have.
        sha256: Sha256,
        /// Size the file must have.
        size_bytes: u64,
    },
}

impl Decision {
    /// The binary the agent will run after acting on this decision, if it changes.
    pub fn target(&self) -> Option<&Binary> {
        match self {
            Decision::Stay { .. } => None,
            Decision::Upgrade { entry } => Some(&entry.binary),
            Decision::UseLocal { binary, .. } => Some(binary),
        }
    }
}

/// Who asked for an exact version that the catalogue lacks; shapes the advice given.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum VersionOrigin {
    /// The model's `agent-version` pin.
    AgentVersion,
    /// `upgrade-controller --agent-version`.
    UpgradeController,
}

/// Decides the desired agent binary for `request` from `catalogue` (see the module table).
///
/// Guarantees, checked by assertions and a property test: without a pin, the decision is
/// never a version lower than the running one; without a pin, a local binary or an
/// explicit `--agent-version`, it never leaves the running major.minor; on
/// [`Occasion::Periodic`] it is always [`Decision::Stay`].
pub fn select(
    request: &SelectionRequest<'_>,
    catalogue: &Catalogue,
) -> Result<Decision, PolicyError> {
    let running = request.running;
    let streams = Stream::preferred(request.stream, &running.number);
    let newest = catalogue.newest_patch(running, streams);
    let upgrade_available = newest.map(|entry| entry.binary.number);
    let stay = Decision::Stay { upgrade_available };
    let newest_patch = || match newest {
        Some(entry) => Decision::Upgrade {
            entry: entry.clone(),
        },
        None => stay.clone(),
    };

    let decision = match (request.policy, request.occasion) {
        // The 6-hourly check reports and never acts, whatever the policy.
        (_, Occasion::Periodic) => stay.clone(),

        (UpgradePolicy::Off, Occasion::Bootstrap) => stay.clone(),
        (UpgradePolicy::AutoPatch, Occasion::Bootstrap) => newest_patch(),
        (
            UpgradePolicy::Off | UpgradePolicy::AutoPatch,
            Occasion::OperatorRequest { version: None },
        ) => newest_patch(),
        (
            UpgradePolicy::Off | UpgradePolicy::AutoPatch,
            Occasion::OperatorRequest {
                version: Some(requested),
            },
        ) => {
            if requested < running.number {
                return Err(PolicyError::Downgrade {
                    running: running.number,
                    requested,
                });
            }
            if requested.major != running.number.major {
                return Err(PolicyError::MajorUpgrade {
                    running: running.number,
                    requested,
                });
            }
            if requested == running.number {
                stay.clone()
            } else {
                exact(
                    catalogue,
                    running,
                    request.stream,
                    requested,
                    VersionOrigin::UpgradeController,
                )?
            }
        }

        (UpgradePolicy::Pinned(pinned), occasion) => {
            if let Occasion::OperatorRequest {
                version: Some(requested),
            } = occasion
                && requested != *pinned
            {
                return Err(PolicyError::PinnedConflict {
                    pinned: *pinned,
                    requested,
                });
            }
            if *pinned == running.number {
                stay.clone()
            } else {
                exact(
                    catalogue,
                    running,
                    request.stream,
                    *pinned,
                    VersionOrigin::AgentVersion,
                )?
            }
        }

        (
            UpgradePolicy::LocalBinary {
                binary,
                sha256,
                size_bytes,
            },
            occasion,
        ) => {
            if binary.release != running.release || binary.arch != running.arch {
                return Err(PolicyError::LocalBinaryMismatch {
                    local: binary.clone(),
                    running: running.clone(),
                });
            }
            if let Occasion::OperatorRequest {
                version: Some(requested),
            } = occasion
                && requested != binary.number
            {
                return Err(PolicyError::LocalBinaryConflict {
                    local: binary.clone(),
                    requested,
                });
            }
            if binary.number < running.number {
                return Err(PolicyError::LocalBinaryDowngrade {
                    local: binary.clone(),
                    running: running.clone(),
                });
            }
            if binary.number == running.number {
                stay.clone()
            } else {
                Decision::UseLocal {
                    binary: binary.clone(),
                    sha256: *sha256,
                    size_bytes: *size_bytes,
                }
            }
        }
    };

    // Postconditions: the table's promises, checked on every decision.
    if let Decision::Stay {
        upgrade_available: reported,
    } = &decision
    {
        assert_eq!(*reported, upgrade_available);
    }
    if let Some(target) = decision.target() {
        assert_eq!(target.release, running.release);
        assert_eq!(target.arch, running.arch);
        assert_ne!(target.number, running.number);
        assert_ne!(request.occasion, Occasion::Periodic);
        match (request.policy, request.occasion) {
            (UpgradePolicy::Pinned(pinned), _) => assert_eq!(target.number, *pinned),
            (_, Occasion::OperatorRequest { version: Some(v) }) => {
                assert_eq!(target.number, v);
            }
            (UpgradePolicy::LocalBinary { .. }, _) => assert!(target.number > running.number),
            (UpgradePolicy::Off | UpgradePolicy::AutoPatch, _) => {
                assert!(target.number > running.number);
                assert!(target.number.same_minor(&running.number));
            }
        }
    }
    tracing::debug!(
        running = %running,
        policy = ?request.policy,
        occasion = ?request.occasion,
        streams = %StreamList(streams),
        decision = ?decision,
        "selected desired agent binary"
    );
    Ok(decision)
}

/// The entry of exactly `version` for the running release and architecture
/// ([`Catalogue::entry_for`]: the streams preferred for `version`), or an error naming what
/// was searched.
fn exact(
    catalogue: &Catalogue,
    running: &Binary,
    model_stream: Option<Stream>,
    version: Version,
    origin: VersionOrigin,
) -> Result<Decision, PolicyError> {
    let wanted = Binary {
        number: version,
        release: running.release.clone(),
        arch: running.arch.clone(),
    };
    match catalogue.entry_for(&wanted, model_stream) {
        Some(entry) => Ok(Decision::Upgrade {
            entry: entry.clone(),
        }),
        None => Err(PolicyError::VersionNotFound {
            version,
            origin,
            streams: Stream::preferred(model_stream, &version),
            release: running.release.clone(),
            arch: running.arch.clone(),
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Rollback high-water mark
// ---------------------------------------------------------------------------------------

/// The newest catalogue metadata accepted so far, persisted across restarts, so that a
/// mirror cannot serve older or stale metadata (TUF's trusted metadata state). Time is in
/// seconds since the Unix epoch, as simplestreams' `updated` field; the core has no clock,
/// so `now` is an argument.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, Default, serde::Serialize, serde::Deserialize,
)]
pub struct HighWaterMark {
    /// `updated` of the newest metadata accepted; `None` before the first.
    pub updated_unix_seconds: Option<u64>,
    /// Highest version any accepted catalogue listed; `None` before the first.
    pub version: Option<Version>,
}

impl HighWaterMark {
    /// How far ahead of the checking clock metadata may be dated by default: a day, far
    /// more than any honest clock skew, far less than a date that would hold the mark.
    pub const FUTURE_SKEW_SECONDS_DEFAULT: u64 = 86_400;

    /// Checks metadata last updated at `metadata_updated_unix_seconds` before it is used.
    /// Metadata as old as the accepted one is admitted (the same metadata fetched again);
    /// metadata exactly `freeze_after_seconds` old is still admitted, and so is metadata
    /// dated exactly `future_skew_seconds` ahead of `now_unix_seconds`.
    pub fn admit(
        &self,
        metadata_updated_unix_seconds: u64,
        now_unix_seconds: u64,
        freeze_after_seconds: u64,
        future_skew_seconds: u64,
    ) -> Result<(), PolicyError> {
        // Mark poisoning: metadata dated years ahead would become the mark, and every genuine
        // catalogue after it would be refused as a rollback until someone deleted the mark.
        // Checked first, so such metadata never moves the mark.
        if metadata_updated_unix_seconds > now_unix_seconds.saturating_add(future_skew_seconds) {
            return Err(PolicyError::MetadataFromTheFuture {
                metadata_updated_unix_seconds,
                now_unix_seconds,
                future_skew_seconds,
            });
        }
        // Rollback attack (TUF specification, §5.4.3 "Check for a rollback attack"): "If
        // the new timestamp metadata version is less than the trusted timestamp metadata
        // version, discard it, abort the update cycle, and report the potential rollback
        // attack." An older catalogue could hide a fix or bring back a withdrawn binary.
        if let Some(accepted_unix_seconds) = self.updated_unix_seconds
            && metadata_updated_unix_seconds < accepted_unix_seconds
        {
            return Err(PolicyError::MetadataRollback {
                metadata_updated_unix_seconds,
                accepted_updated_unix_seconds: accepted_unix_seconds,
            });
        }
        // Freeze attack (TUF specification, §5.4.4 "Check for a freeze attack"): "The
        // expiration timestamp in the new timestamp metadata file MUST be higher than the
        // fixed update start time. [...] If the new timestamp metadata file has expired,
        // discard it, abort the update cycle, and report the potential freeze attack." A
        // mirror that keeps serving the same valid metadata hides every later release;
        // simplestreams has no expiry, so metadata expires `freeze_after_seconds` after its
        // `updated` time, and `now` plays the fixed update start time.
        let age_seconds = now_unix_seconds.saturating_sub(metadata_updated_unix_seconds);
        if age_seconds > freeze_after_seconds {
            return Err(PolicyError::MetadataFrozen {
                metadata_updated_unix_seconds,
                now_unix_seconds,
                freeze_after_seconds,
            });
        }
        Ok(())
    }

    /// Checks the highest version an admitted catalogue lists (`None`: it lists nothing).
    pub fn admit_version(&self, catalogue_highest: Option<Version>) -> Result<(), PolicyError> {
        // Rollback attack (TUF specification, §5.5.5 "Check for a rollback attack"): "any
        // targets metadata filename that was listed in the trusted snapshot metadata file,
        // if any, MUST continue to be listed in the new snapshot metadata file." A catalogue
        // whose newest binary is older than one already accepted, or that lists nothing,
        // has been rolled back even if its `updated` time is new.
        if let Some(accepted) = self.version
            && catalogue_highest.is_none_or(|highest| highest < accepted)
        {
            return Err(PolicyError::VersionRollback {
                catalogue_highest,
                accepted_highest: accepted,
            });
        }
        Ok(())
    }

    /// Records admitted metadata. Never moves backwards: callers admit first, and a call
    /// that would lower either mark is a bug, so it panics.
    pub fn advance(
        &mut self,
        metadata_updated_unix_seconds: u64,
        catalogue_highest: Option<Version>,
    ) {
        if let Some(accepted) = self.updated_unix_seconds {
            assert!(
                metadata_updated_unix_seconds >= accepted,
                "high-water mark moved backwards: updated {metadata_updated_unix_seconds} < {accepted}"
            );
        }
        if let (Some(accepted), Some(highest)) = (self.version, catalogue_highest) {
            assert!(
                highest >= accepted,
                "high-water mark moved backwards: version {highest} < {accepted}"
            );
        }
        let before = *self;
        self.updated_unix_seconds = Some(metadata_updated_unix_seconds);
        self.version = catalogue_highest.or(self.version);
        assert!(self.updated_unix_seconds >= before.updated_unix_seconds);
        assert!(self.version >= before.version);
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Why a policy input was refused or no binary could be selected. Each message names the
/// offending value and what to do next.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PolicyError {
    /// `agent-stream` names no stream.
    UnknownStream {
        /// The text given (quoted at most 100 characters).
        text: String,
    },
    /// A digest that is not 64 hexadecimal digits.
    InvalidSha256 {
        /// The text given (quoted at most 100 characters).
        text: String,
        /// Its full length, in characters.
        length_chars: usize,
    },
    /// More than [`ENTRIES_MAX`] entries.
    CatalogueTooLarge {
        /// How many the metadata listed.
        entries_count: usize,
    },
    /// One binary listed twice in one stream with different contents.
    CatalogueConflict {
        /// The binary listed twice.
        binary: Binary,
        /// The stream listing it twice.
        stream: Stream,
        /// Digest of the first listing.
        first_sha256: Sha256,
        /// Size of the first listing.
        first_size_bytes: u64,
        /// Digest of the second listing.
        second_sha256: Sha256,
        /// Size of the second listing.
        second_size_bytes: u64,
    },
    /// An entry whose path or size is out of bounds.
    CatalogueEntryInvalid {
        /// The entry's binary.
        binary: Binary,
        /// The entry's stream.
        stream: Stream,
        /// `"path"` or `"size"`.
        field: &'static str,
        /// The offending value, as shown.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// An exact version (a pin or `--agent-version`) the catalogue does not list for this
    /// agent's release and architecture in the searched streams.
    VersionNotFound {
        /// The version asked for.
        version: Version,
        /// Who asked for it.
        origin: VersionOrigin,
        /// The streams searched, in order.
        streams: &'static [Stream],
        /// The agent's release.
        release: String,
        /// The agent's architecture.
        arch: String,
    },
    /// `upgrade-controller --agent-version` lower than the running version.
    Downgrade {
        /// The running version.
        running: Version,
        /// The version asked for.
        requested: Version,
    },
    /// `upgrade-controller --agent-version` of another major version.
    MajorUpgrade {
        /// The running version.
        running: Version,
        /// The version asked for.
        requested: Version,
    },
    /// `upgrade-controller --agent-version` other than the model's pin.
    PinnedConflict {
        /// The model's `agent-version`.
        pinned: Version,
        /// The version asked for.
        requested: Version,
    },
    /// A local binary built for another release or architecture than the agent's.
    LocalBinaryMismatch {
        /// The local binary.
        local: Binary,
        /// The binary the agent runs.
        running: Binary,
    },
    /// A local binary older than the running one.
    LocalBinaryDowngrade {
        /// The local binary.
        local: Binary,
        /// The binary the agent runs.
        running: Binary,
    },
    /// `upgrade-controller --agent-version` other than the local binary's version.
    LocalBinaryConflict {
        /// The local binary.
        local: Binary,
        /// The version asked for.
        requested: Version,
    },
    /// Metadata older than metadata already accepted.
    MetadataRollback {
        /// `updated` of the refused metadata.
        metadata_updated_unix_seconds: u64,
        /// `updated` of the newest metadata accepted.
        accepted_updated_unix_seconds: u64,
    },
    /// Metadata not refreshed within the freeze bound.
    MetadataFrozen {
        /// `updated` of the refused metadata.
        metadata_updated_unix_seconds: u64,
        /// The driver's time of the check.
        now_unix_seconds: u64,
        /// The largest age admitted.
        freeze_after_seconds: u64,
    },
    /// Metadata dated further ahead of the checking clock than the skew allowed.
    MetadataFromTheFuture {
        /// `updated` of the refused metadata.
        metadata_updated_unix_seconds: u64,
        /// The driver's time of the check.
        now_unix_seconds: u64,
        /// The furthest ahead admitted.
        future_skew_seconds: u64,
    },
    /// A catalogue whose highest version is below the highest already accepted.
    VersionRollback {
        /// The catalogue's highest version; `None` when it lists nothing.
        catalogue_highest: Option<Version>,
        /// The highest version accepted before.
        accepted_highest: Version,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::UnknownStream { text } => write!(
                f,
                "unknown agent-stream {text:?}: expected one of released, proposed, devel, \
                 testing; set agent-stream to one of them or unset it"
            ),
            PolicyError::InvalidSha256 { text, length_chars } => write!(
                f,
                "invalid sha256 {text:?} ({length_chars} characters): expected exactly 64 \
                 hexadecimal digits; copy the digest from the catalogue or from sha256sum of \
                 the file"
            ),
            PolicyError::CatalogueTooLarge { entries_count } => write!(
                f,
                "catalogue lists {entries_count} agent binaries, more than the {ENTRIES_MAX} \
                 allowed; prune old versions from the mirror or point agent-metadata-url at a \
                 smaller one"
            ),
            PolicyError::CatalogueConflict {
                binary,
                stream,
                first_sha256,
                first_size_bytes,
                second_sha256,
                second_size_bytes,
            } => write!(
                f,
                "catalogue lists {binary} twice in stream {stream} with different contents \
                 (sha256 {first_sha256}, {first_size_bytes} bytes; sha256 {second_sha256}, \
                 {second_size_bytes} bytes); the streams metadata contradicts itself: \
                 regenerate the mirror or point agent-metadata-url at a consistent one"
            ),
            PolicyError::CatalogueEntryInvalid {
                binary,
                stream,
                field,
                value,
                expected,
            } => write!(
                f,
                "catalogue entry {binary} in stream {stream} has {field} {value}, expected \
                 {expected}; regenerate the streams metadata"
            ),
            PolicyError::VersionNotFound {
                version,
                origin,
                streams,
                release,
                arch,
            } => {
                let streams = StreamList(streams);
                match origin {
                    VersionOrigin::AgentVersion => write!(
                        f,
                        "agent-version {version} not found in streams {streams} for \
                         {release}/{arch}; publish it, choose another agent-version, or unset it"
                    ),
                    VersionOrigin::UpgradeController => write!(
                        f,
                        "upgrade-controller --agent-version {version} not found in streams \
                         {streams} for {release}/{arch}; publish it, or choose a version the \
                         catalogue lists"
                    ),
                }
            }
            PolicyError::Downgrade { running, requested } => write!(
                f,
                "upgrade-controller --agent-version {requested} is older than the running \
                 {running}; upgrade-controller never downgrades: to run {requested}, pin it \
                 with agent-version={requested}"
            ),
            PolicyError::MajorUpgrade { running, requested } => write!(
                f,
                "upgrade-controller --agent-version {requested} changes the major version of \
                 the running {running}; upgrades across major versions are not supported: \
                 migrate the models to a controller of version {requested}"
            ),
            PolicyError::PinnedConflict { pinned, requested } => write!(
                f,
                "upgrade-controller --agent-version {requested} conflicts with \
                 agent-version={pinned} pinned in the model; change or unset agent-version \
                 first"
            ),
            PolicyError::LocalBinaryMismatch { local, running } => write!(
                f,
                "local agent binary {local} is built for {}/{} but this agent runs {running} \
                 on {}/{}; build the agent binary for {}/{}",
                local.release,
                local.arch,
                running.release,
                running.arch,
                running.release,
                running.arch
            ),
            PolicyError::LocalBinaryDowngrade { local, running } => write!(
                f,
                "local agent binary {local} is older than the running {running}; agents never \
                 downgrade implicitly: build a newer binary, or pin an older published version \
                 with agent-version"
            ),
            PolicyError::LocalBinaryConflict { local, requested } => write!(
                f,
                "upgrade-controller --agent-version {requested} conflicts with the local agent \
                 binary {local} chosen with --build-agent; omit --agent-version or build \
                 {requested}"
            ),
            PolicyError::MetadataRollback {
                metadata_updated_unix_seconds,
                accepted_updated_unix_seconds,
            } => write!(
                f,
                "streams metadata updated at {metadata_updated_unix_seconds} (unix seconds) is \
                 older than metadata already accepted, updated at \
                 {accepted_updated_unix_seconds}: refused as a possible rollback attack; check \
                 that the mirror at agent-metadata-url serves current metadata"
            ),
            PolicyError::MetadataFrozen {
                metadata_updated_unix_seconds,
                now_unix_seconds,
                freeze_after_seconds,
            } => write!(
                f,
                "streams metadata updated at {metadata_updated_unix_seconds} (unix seconds) is \
                 {} seconds old at {now_unix_seconds}, more than the {freeze_after_seconds} \
                 allowed: refused as a possible freeze attack; check that the mirror at \
                 agent-metadata-url is being refreshed",
                now_unix_seconds.saturating_sub(*metadata_updated_unix_seconds)
            ),
            PolicyError::MetadataFromTheFuture {
                metadata_updated_unix_seconds,
                now_unix_seconds,
                future_skew_seconds,
            } => write!(
                f,
                "streams metadata updated at {metadata_updated_unix_seconds} (unix seconds) is \
                 dated {} seconds after this controller's clock ({now_unix_seconds}), more than \
                 the {future_skew_seconds} allowed: refused, and not remembered, so that it \
                 cannot hold back genuine metadata; check the mirror's metadata and this \
                 controller's clock",
                metadata_updated_unix_seconds - now_unix_seconds
            ),
            PolicyError::VersionRollback {
                catalogue_highest,
                accepted_highest,
            } => {
                match catalogue_highest {
                    Some(highest) => write!(
                        f,
                        "catalogue's highest version {highest} is below {accepted_highest}"
                    )?,
                    None => write!(
                        f,
                        "catalogue lists no agent binaries, but {accepted_highest}"
                    )?,
                }
                write!(
                    f,
                    " was already accepted: refused as a possible rollback attack; check that \
                     the mirror at agent-metadata-url serves current metadata"
                )
            }
        }
    }
}

impl std::error::Error for PolicyError {}

/// At most [`QUOTE_LENGTH_MAX`] characters of `text`, with `…` when cut.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_LENGTH_MAX) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::Tag;
    use proptest::prelude::*;

    use Stream::{Devel, Proposed, Released, Testing};

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn b(text: &str) -> Binary {
        Binary::parse(text).unwrap()
    }

    fn entry_with(binary: &str, stream: Stream, digest: u8, size_bytes: u64) -> CatalogueEntry {
        let binary = b(binary);
        CatalogueEntry {
            path: format!("agent/{}/juju-{binary}.tgz", binary.number),
            binary,
            stream,
            size_bytes,
            sha256: Sha256([digest; 32]),
        }
    }

    fn entry(binary: &str, stream: Stream) -> CatalogueEntry {
        entry_with(binary, stream, 0xab, 1024)
    }

    fn catalogue(entries: &[(&str, Stream)]) -> Catalogue {
        Catalogue::new(
            entries
                .iter()
                .map(|&(binary, stream)| entry(binary, stream))
                .collect(),
        )
        .unwrap()
    }

    /// Running 2.9.43 on ubuntu/amd64 sees one newer patch per stream, and distractors of
    /// another arch, release, minor and major.
    fn world() -> Catalogue {
        let mut entries: Vec<CatalogueEntry> = [
            ("2.9.42-ubuntu-amd64", Released),
            ("2.9.43-ubuntu-amd64", Released),
            ("2.9.44-ubuntu-amd64", Released),
            ("2.9.45-ubuntu-amd64", Proposed),
            ("2.9.46-ubuntu-amd64", Devel),
            ("2.9.47-ubuntu-amd64", Testing),
            ("2.9.50-ubuntu-arm64", Released),
            ("2.9.51-centos7-amd64", Released),
            ("2.10.0-ubuntu-amd64", Released),
            ("3.0.0-ubuntu-amd64", Released),
        ]
        .iter()
        .map(|&(binary, stream)| entry(binary, stream))
        .collect();
        // The same binary in devel too, rebuilt: whichever stream is preferred wins.
        entries.push(entry_with("2.9.44-ubuntu-amd64", Devel, 0xde, 2048));
        Catalogue::new(entries).unwrap()
    }

    fn describe(result: &Result<Decision, PolicyError>) -> String {
        match result {
            Ok(Decision::Stay {
                upgrade_available: None,
            }) => "stay".to_owned(),
            Ok(Decision::Stay {
                upgrade_available: Some(available),
            }) => format!("stay, upgrade-available {available}"),
            Ok(Decision::Upgrade { entry }) => format!(
                "upgrade to {} from {} (sha256 {:02x}.., {} bytes)",
                entry.binary, entry.stream, entry.sha256.0[0], entry.size_bytes
            ),
            Ok(Decision::UseLocal {
                binary,
                sha256,
                size_bytes,
            }) => format!(
                "use local {binary} (sha256 {:02x}.., {size_bytes} bytes)",
                sha256.0[0]
            ),
            Err(error) => format!("error: {error}"),
        }
    }

    fn decide(
        running: &str,
        policy: &UpgradePolicy,
        stream: Option<Stream>,
        occasion: Occasion,
        catalogue: &Catalogue,
    ) -> String {
        let running = b(running);
        let request = SelectionRequest {
            running: &running,
            policy,
            stream,
            occasion,
        };
        describe(&select(&request, catalogue))
    }

    fn operator(version: Option<&str>) -> Occasion {
        Occasion::OperatorRequest {
            version: version.map(v),
        }
    }

    fn local(binary: &str) -> UpgradePolicy {
        UpgradePolicy::LocalBinary {
            binary: b(binary),
            sha256: Sha256([0x10; 32]),
            size_bytes: 4096,
        }
    }

    fn pinned(version: &str) -> UpgradePolicy {
        UpgradePolicy::Pinned(v(version))
    }

    // ------------------------------------------------------------------ streams

    #[test]
    fn preferred_streams_reproduce_juju() {
        let release = v("2.9.43");
        let beta = v("1.25-beta1");
        let build = v("2.9.43.1");
        let cases: &[(Option<Stream>, &Version, &[Stream])] = &[
            (None, &release, &[Released]),
            (None, &beta, &[Devel, Proposed, Released]),
            (None, &build, &[Devel, Proposed, Released]),
            // An explicit `released` is the same as none, as in Juju.
            (Some(Released), &release, &[Released]),
            (Some(Released), &beta, &[Devel, Proposed, Released]),
            (Some(Released), &build, &[Devel, Proposed, Released]),
            (Some(Proposed), &release, &[Proposed, Released]),
            (Some(Proposed), &beta, &[Proposed, Released]),
            (Some(Proposed), &build, &[Proposed, Released]),
            (Some(Devel), &release, &[Devel, Proposed, Released]),
            (Some(Devel), &beta, &[Devel, Proposed, Released]),
            (Some(Devel), &build, &[Devel, Proposed, Released]),
            (
                Some(Testing),
                &release,
                &[Testing, Devel, Proposed, Released],
            ),
            (Some(Testing), &beta, &[Testing, Devel, Proposed, Released]),
            (Some(Testing), &build, &[Testing, Devel, Proposed, Released]),
        ];
        for &(explicit, running, expected) in cases {
            assert_eq!(
                Stream::preferred(explicit, running),
                expected,
                "{explicit:?} {running}"
            );
        }
        assert_eq!(
            StreamList(&[Devel, Proposed, Released]).to_string(),
            "[devel, proposed, released]"
        );
    }

    #[test]
    fn stream_names_round_trip_and_unknown_names_are_refused() {
        let names: Vec<&str> = Stream::ALL.iter().map(|stream| stream.as_str()).collect();
        assert_eq!(names, ["released", "proposed", "devel", "testing"]);
        for stream in Stream::ALL {
            assert_eq!(Stream::parse(stream.as_str()), Ok(stream));
            let json = serde_json::to_string(&stream).unwrap();
            assert_eq!(json, format!("\"{stream}\""));
            assert_eq!(serde_json::from_str::<Stream>(&json).unwrap(), stream);
        }
        for bad in ["", "Released", "release", "stable", " devel"] {
            let error = Stream::parse(bad).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "unknown agent-stream {bad:?}: expected one of released, proposed, devel, \
                     testing; set agent-stream to one of them or unset it"
                )
            );
        }
        let error = serde_json::from_str::<Stream>("\"beta\"").unwrap_err();
        assert!(
            error.to_string().contains("unknown agent-stream \"beta\""),
            "{error}"
        );
    }

    // ------------------------------------------------------------------ sha256

    #[test]
    fn sha256_parses_exactly_64_hex_digits() {
        let lower = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let digest = Sha256::parse(lower).unwrap();
        assert_eq!(digest.0[..4], [0x00, 0x11, 0x22, 0x33]);
        assert_eq!(digest.0[31], 0xff);
        assert_eq!(digest.to_string(), lower);
        assert_eq!(Sha256::parse(&lower.to_uppercase()).unwrap(), digest);
        assert_eq!(format!("{digest:?}"), format!("Sha256({lower})"));
        let json = serde_json::to_string(&digest).unwrap();
        assert_eq!(json, format!("\"{lower}\""));
        assert_eq!(serde_json::from_str::<Sha256>(&json).unwrap(), digest);

        let long = "a".repeat(150);
        let cases: &[(&str, &str)] = &[
            ("", "invalid sha256 \"\" (0 characters)"),
            (&lower[1..], "(63 characters)"),
            (&format!("{lower}0"), "(65 characters)"),
            (
                "g0112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                "invalid sha256 \"g011",
            ),
            (
                "0011223344556677 899aabbccddeeff00112233445566778899aabbccddeeff",
                "(64 characters)",
            ),
            (
                "é0112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
                "(63 characters)",
            ),
            (&long, "…\" (150 characters)"),
        ];
        for &(text, expected) in cases {
            let message = Sha256::parse(text).unwrap_err().to_string();
            assert!(
                message.contains(expected),
                "{text:?}: {message:?} lacks {expected:?}"
            );
            assert!(
                message.ends_with(
                    "expected exactly 64 hexadecimal digits; copy the digest from the catalogue \
                     or from sha256sum of the file"
                ),
                "{message}"
            );
        }
        let quoted = Sha256::parse(&long).unwrap_err().to_string();
        assert!(
            quoted.contains(&format!("\"{}…\"", "a".repeat(100))),
            "{quoted}"
        );
    }

    // ------------------------------------------------------------------ catalogue

    #[test]
    fn catalogue_collapses_identical_duplicates_and_sorts() {
        let mut moved = entry("2.9.44-ubuntu-amd64", Released);
        moved.path = "mirror/elsewhere.tgz".to_owned();
        let catalogue = Catalogue::new(vec![
            entry("2.9.45-ubuntu-amd64", Released),
            entry("2.9.44-ubuntu-amd64", Released),
            moved,
            entry("2.9.44-ubuntu-amd64", Devel),
            entry("2.9.44-ubuntu-amd64", Released),
        ])
        .unwrap();
        let listed: Vec<String> = catalogue
            .entries()
            .iter()
            .map(|entry| format!("{} {} {}", entry.binary, entry.stream, entry.path))
            .collect();
        assert_eq!(
            listed,
            [
                "2.9.44-ubuntu-amd64 released agent/2.9.44/juju-2.9.44-ubuntu-amd64.tgz",
                "2.9.44-ubuntu-amd64 devel agent/2.9.44/juju-2.9.44-ubuntu-amd64.tgz",
                "2.9.45-ubuntu-amd64 released agent/2.9.45/juju-2.9.45-ubuntu-amd64.tgz",
            ]
        );
        assert_eq!(catalogue.highest_version(), Some(v("2.9.45")));
        assert_eq!(Catalogue::default().highest_version(), None);
    }

    #[test]
    fn catalogue_refuses_one_binary_with_two_contents_in_one_stream() {
        let cases = [
            (
                entry_with("2.9.44-ubuntu-amd64", Released, 0xab, 1024),
                entry_with("2.9.44-ubuntu-amd64", Released, 0xcd, 1024),
                format!(
                    "catalogue lists 2.9.44-ubuntu-amd64 twice in stream released with \
                     different contents (sha256 {}, 1024 bytes; sha256 {}, 1024 bytes); the \
                     streams metadata contradicts itself: regenerate the mirror or point \
                     agent-metadata-url at a consistent one",
                    "ab".repeat(32),
                    "cd".repeat(32)
                ),
            ),
            (
                entry_with("1.25-beta1-trusty-amd64", Devel, 0xab, 1024),
                entry_with("1.25-beta1-trusty-amd64", Devel, 0xab, 1025),
                format!(
                    "catalogue lists 1.25-beta1-trusty-amd64 twice in stream devel with \
                     different contents (sha256 {0}, 1024 bytes; sha256 {0}, 1025 bytes); the \
                     streams metadata contradicts itself: regenerate the mirror or point \
                     agent-metadata-url at a consistent one",
                    "ab".repeat(32)
                ),
            ),
        ];
        for (first, second, expected) in cases {
            let error = Catalogue::new(vec![entry("2.9.40-ubuntu-amd64", Released), first, second])
                .unwrap_err();
            assert_eq!(error.to_string(), expected);
        }
        // The same binary in two streams may differ: they are different publications.
        let both = Catalogue::new(vec![
            entry_with("2.9.44-ubuntu-amd64", Released, 0xab, 1024),
            entry_with("2.9.44-ubuntu-amd64", Proposed, 0xcd, 2048),
        ])
        .unwrap();
        assert_eq!(both.entries().len(), 2);
    }

    #[test]
    fn catalogue_is_bounded() {
        let one = entry("2.9.44-ubuntu-amd64", Released);
        let full = Catalogue::new(vec![one.clone(); ENTRIES_MAX]).unwrap();
        assert_eq!(full.entries(), std::slice::from_ref(&one));
        let error = Catalogue::new(vec![one; ENTRIES_MAX + 1]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "catalogue lists 100001 agent binaries, more than the 100000 allowed; prune old \
             versions from the mirror or point agent-metadata-url at a smaller one"
        );
    }

    #[test]
    fn catalogue_refuses_entries_out_of_bounds() {
        let with = |path: &str, size_bytes: u64| {
            let mut entry = entry("2.9.44-ubuntu-amd64", Proposed);
            entry.path = path.to_owned();
            entry.size_bytes = size_bytes;
            entry
        };
        let long = "p".repeat(PATH_LENGTH_MAX + 1);
        let cases: &[(CatalogueEntry, &str)] = &[
            (
                with("", 1024),
                "catalogue entry 2.9.44-ubuntu-amd64 in stream proposed has path \"\" (0 bytes), \
                 expected a path of 1 to 1024 bytes; regenerate the streams metadata",
            ),
            (with(&long, 1024), "has path \"pppp"),
            (with(&long, 1024), "…\" (1025 bytes)"),
            (
                with("a.tgz", 0),
                "catalogue entry 2.9.44-ubuntu-amd64 in stream proposed has size 0 bytes, \
                 expected 1 byte to 4 GiB; regenerate the streams metadata",
            ),
            (
                with("a.tgz", SIZE_BYTES_MAX + 1),
                "has size 4294967297 bytes",
            ),
        ];
        for (entry, expected) in cases {
            let message = Catalogue::new(vec![entry.clone()]).unwrap_err().to_string();
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
        assert!(Catalogue::new(vec![with(&"p".repeat(PATH_LENGTH_MAX), SIZE_BYTES_MAX)]).is_ok());
    }

    #[test]
    fn catalogue_serde_validates() {
        let catalogue = catalogue(&[("2.9.44-ubuntu-amd64", Released)]);
        let json = serde_json::to_string(&catalogue).unwrap();
        assert_eq!(
            json,
            format!(
                "{{\"entries\":[{{\"binary\":\"2.9.44-ubuntu-amd64\",\"stream\":\"released\",\
                 \"size_bytes\":1024,\"sha256\":\"{}\",\
                 \"path\":\"agent/2.9.44/juju-2.9.44-ubuntu-amd64.tgz\"}}]}}",
                "ab".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<Catalogue>(&json).unwrap(), catalogue);
        let conflicting = json.replace(
            "]}",
            &format!(",{}]}}", {
                let start = json.find("{\"binary").unwrap();
                json[start..json.len() - 2].replace("1024", "9")
            }),
        );
        let error = serde_json::from_str::<Catalogue>(&conflicting).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("catalogue lists 2.9.44-ubuntu-amd64 twice in stream released"),
            "{error}"
        );
    }

    #[test]
    fn the_entry_for_a_binary_comes_from_its_versions_streams_and_no_other() {
        let world = world();
        let served = |binary: &str, model_stream: Option<Stream>| {
            world
                .entry_for(&b(binary), model_stream)
                .map(|entry| (entry.stream, entry.size_bytes))
        };
        // A release searches released only: the released build, never the devel rebuild.
        assert_eq!(served("2.9.44-ubuntu-amd64", None), Some((Released, 1024)));
        assert_eq!(
            served("2.9.44-ubuntu-amd64", Some(Released)),
            Some((Released, 1024))
        );
        // An explicit devel stream prefers the devel build.
        assert_eq!(
            served("2.9.44-ubuntu-amd64", Some(Devel)),
            Some((Devel, 2048))
        );
        // Listed only in a stream the model does not search: not served (no "any stream"
        // fallback), although the catalogue lists the binary.
        assert_eq!(served("2.9.46-ubuntu-amd64", None), None);
        assert_eq!(served("2.9.46-ubuntu-amd64", Some(Proposed)), None);
        assert_eq!(
            served("2.9.46-ubuntu-amd64", Some(Devel)),
            Some((Devel, 1024))
        );
        assert_eq!(served("2.9.47-ubuntu-amd64", Some(Devel)), None);
        // Another release or architecture is another binary.
        assert_eq!(served("2.9.44-ubuntu-arm64", None), None);
        assert_eq!(served("2.9.50-ubuntu-arm64", None), Some((Released, 1024)));
        // A development version searches devel, proposed, released without being asked.
        let beta = catalogue(&[("2.10-beta1-ubuntu-amd64", Devel)]);
        assert!(
            beta.entry_for(&b("2.10-beta1-ubuntu-amd64"), None)
                .is_some()
        );
    }

    #[test]
    fn a_version_is_listed_only_in_the_streams_searched_for_it() {
        let world = world();
        assert!(world.lists_version(v("2.9.44"), None));
        assert!(world.lists_version(v("2.9.50"), None), "any architecture");
        assert!(world.lists_version(v("2.9.51"), None), "any release");
        assert!(!world.lists_version(v("2.9.45"), None), "proposed only");
        assert!(world.lists_version(v("2.9.45"), Some(Proposed)));
        assert!(
            !world.lists_version(v("2.9.47"), Some(Devel)),
            "testing only"
        );
        assert!(world.lists_version(v("2.9.47"), Some(Testing)));
        assert!(
            !world.lists_version(v("2.9.49"), Some(Testing)),
            "not listed"
        );
    }

    #[test]
    fn candidates_are_the_union_of_streams_earliest_stream_first() {
        let world = world();
        let listed = |streams: &[Stream]| -> Vec<String> {
            world
                .candidates("ubuntu", "amd64", streams)
                .map(|entry| format!("{} {}", entry.binary.number, entry.stream))
                .collect()
        };
        assert_eq!(
            listed(&[Released]),
            [
                "2.9.42 released",
                "2.9.43 released",
                "2.9.44 released",
                "2.10.0 released",
                "3.0.0 released"
            ]
        );
        assert_eq!(
            listed(&[Devel, Proposed, Released]),
            [
                "2.9.42 released",
                "2.9.43 released",
                "2.9.44 devel",
                "2.9.45 proposed",
                "2.9.46 devel",
                "2.10.0 released",
                "3.0.0 released"
            ]
        );
        assert_eq!(
            listed(&[Testing]),
            ["2.9.47 testing"],
            "a list without released searches only what it names"
        );
        assert_eq!(world.candidates("ubuntu", "arm64", &[Released]).count(), 1);
        assert_eq!(world.candidates("centos7", "amd64", &[Released]).count(), 1);
        assert_eq!(
            world
                .candidates("trusty", "amd64", Stream::Testing.fallbacks())
                .count(),
            0
        );
    }

    // ------------------------------------------------------------------ selection

    #[test]
    fn selection_follows_the_policy_table() {
        use Occasion::{Bootstrap, Periodic};
        use UpgradePolicy::{AutoPatch, Off};
        let world = world();
        let running = "2.9.43-ubuntu-amd64";
        let cases: &[(UpgradePolicy, Option<Stream>, Occasion, &str)] = &[
            // Off: stay and report the newest patch of the preferred streams.
            (Off, None, Bootstrap, "stay, upgrade-available 2.9.44"),
            (Off, None, Periodic, "stay, upgrade-available 2.9.44"),
            (
                Off,
                Some(Released),
                Periodic,
                "stay, upgrade-available 2.9.44",
            ),
            (
                Off,
                Some(Proposed),
                Periodic,
                "stay, upgrade-available 2.9.45",
            ),
            (Off, Some(Devel), Periodic, "stay, upgrade-available 2.9.46"),
            (
                Off,
                Some(Testing),
                Bootstrap,
                "stay, upgrade-available 2.9.47",
            ),
            // AutoPatch: upgrade at bootstrap only.
            (
                AutoPatch,
                None,
                Bootstrap,
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                AutoPatch,
                Some(Proposed),
                Bootstrap,
                "upgrade to 2.9.45-ubuntu-amd64 from proposed (sha256 ab.., 1024 bytes)",
            ),
            (
                AutoPatch,
                Some(Devel),
                Bootstrap,
                "upgrade to 2.9.46-ubuntu-amd64 from devel (sha256 ab.., 1024 bytes)",
            ),
            (
                AutoPatch,
                Some(Testing),
                Bootstrap,
                "upgrade to 2.9.47-ubuntu-amd64 from testing (sha256 ab.., 1024 bytes)",
            ),
            (AutoPatch, None, Periodic, "stay, upgrade-available 2.9.44"),
            (
                AutoPatch,
                Some(Devel),
                Periodic,
                "stay, upgrade-available 2.9.46",
            ),
            // upgrade-controller without --agent-version: the newest patch.
            (
                Off,
                None,
                operator(None),
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                AutoPatch,
                None,
                operator(None),
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                Off,
                Some(Proposed),
                operator(None),
                "upgrade to 2.9.45-ubuntu-amd64 from proposed (sha256 ab.., 1024 bytes)",
            ),
            // upgrade-controller --agent-version V: V exactly, from the earliest stream.
            (
                Off,
                None,
                operator(Some("2.9.44")),
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                Off,
                Some(Devel),
                operator(Some("2.9.44")),
                "upgrade to 2.9.44-ubuntu-amd64 from devel (sha256 de.., 2048 bytes)",
            ),
            (
                AutoPatch,
                Some(Devel),
                operator(Some("2.9.45")),
                "upgrade to 2.9.45-ubuntu-amd64 from proposed (sha256 ab.., 1024 bytes)",
            ),
            (
                Off,
                None,
                operator(Some("2.9.43")),
                "stay, upgrade-available 2.9.44",
            ),
            (
                Off,
                None,
                operator(Some("2.10.0")),
                "upgrade to 2.10.0-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                Off,
                None,
                operator(Some("2.9.45")),
                "error: upgrade-controller --agent-version 2.9.45 not found in streams [released] \
                 for ubuntu/amd64; publish it, or choose a version the catalogue lists",
            ),
            (
                Off,
                Some(Proposed),
                operator(Some("2.9.50")),
                "error: upgrade-controller --agent-version 2.9.50 not found in streams \
                 [proposed, released] for ubuntu/amd64; publish it, or choose a version the \
                 catalogue lists",
            ),
            (
                AutoPatch,
                None,
                operator(Some("2.9.42")),
                "error: upgrade-controller --agent-version 2.9.42 is older than the running \
                 2.9.43; upgrade-controller never downgrades: to run 2.9.42, pin it with \
                 agent-version=2.9.42",
            ),
            (
                Off,
                None,
                operator(Some("3.0.0")),
                "error: upgrade-controller --agent-version 3.0.0 changes the major version of \
                 the running 2.9.43; upgrades across major versions are not supported: migrate \
                 the models to a controller of version 3.0.0",
            ),
        ];
        for (policy, stream, occasion, expected) in cases {
            assert_eq!(
                decide(running, policy, *stream, *occasion, &world),
                *expected,
                "{policy:?} {stream:?} {occasion:?}"
            );
        }
    }

    #[test]
    fn pinned_is_exactly_that_version() {
        use Occasion::{Bootstrap, Periodic};
        let world = world();
        let running = "2.9.43-ubuntu-amd64";
        let cases: &[(&str, Option<Stream>, Occasion, &str)] = &[
            ("2.9.43", None, Bootstrap, "stay, upgrade-available 2.9.44"),
            (
                "2.9.44",
                None,
                Bootstrap,
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            // A pin is the operator's exact word: lower and other minors are allowed.
            (
                "2.9.42",
                None,
                Bootstrap,
                "upgrade to 2.9.42-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                "2.10.0",
                None,
                Bootstrap,
                "upgrade to 2.10.0-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                "2.9.46",
                Some(Devel),
                Bootstrap,
                "upgrade to 2.9.46-ubuntu-amd64 from devel (sha256 ab.., 1024 bytes)",
            ),
            (
                "2.9.48",
                None,
                Bootstrap,
                "error: agent-version 2.9.48 not found in streams [released] for ubuntu/amd64; \
                 publish it, choose another agent-version, or unset it",
            ),
            (
                "2.9.46",
                Some(Proposed),
                Bootstrap,
                "error: agent-version 2.9.46 not found in streams [proposed, released] for \
                 ubuntu/amd64; publish it, choose another agent-version, or unset it",
            ),
            (
                "2.9.50",
                None,
                Bootstrap,
                "error: agent-version 2.9.50 not found in streams [released] for ubuntu/amd64; \
                 publish it, choose another agent-version, or unset it",
            ),
            // The periodic check never acts, and never fails, whatever the pin.
            ("2.9.44", None, Periodic, "stay, upgrade-available 2.9.44"),
            ("2.9.48", None, Periodic, "stay, upgrade-available 2.9.44"),
            (
                "2.9.44",
                None,
                operator(None),
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                "2.9.44",
                None,
                operator(Some("2.9.44")),
                "upgrade to 2.9.44-ubuntu-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                "2.9.43",
                None,
                operator(None),
                "stay, upgrade-available 2.9.44",
            ),
            (
                "2.9.44",
                None,
                operator(Some("2.9.45")),
                "error: upgrade-controller --agent-version 2.9.45 conflicts with \
                 agent-version=2.9.44 pinned in the model; change or unset agent-version first",
            ),
        ];
        for &(pin, stream, occasion, expected) in cases {
            assert_eq!(
                decide(running, &pinned(pin), stream, occasion, &world),
                expected,
                "pinned {pin} {stream:?} {occasion:?}"
            );
        }
    }

    #[test]
    fn local_binary_must_match_the_agent() {
        use Occasion::{Bootstrap, Periodic};
        let world = world();
        let running = "2.9.43-ubuntu-amd64";
        let cases: &[(&str, Occasion, &str)] = &[
            (
                "2.9.60-ubuntu-amd64",
                Bootstrap,
                "use local 2.9.60-ubuntu-amd64 (sha256 10.., 4096 bytes)",
            ),
            (
                "2.9.60-ubuntu-amd64",
                operator(None),
                "use local 2.9.60-ubuntu-amd64 (sha256 10.., 4096 bytes)",
            ),
            (
                "2.9.60-ubuntu-amd64",
                operator(Some("2.9.60")),
                "use local 2.9.60-ubuntu-amd64 (sha256 10.., 4096 bytes)",
            ),
            (
                "2.10.1-ubuntu-amd64",
                Bootstrap,
                "use local 2.10.1-ubuntu-amd64 (sha256 10.., 4096 bytes)",
            ),
            (
                "2.9.60-ubuntu-amd64",
                Periodic,
                "stay, upgrade-available 2.9.44",
            ),
            (
                "2.9.43-ubuntu-amd64",
                Bootstrap,
                "stay, upgrade-available 2.9.44",
            ),
            (
                "2.9.60-ubuntu-arm64",
                Bootstrap,
                "error: local agent binary 2.9.60-ubuntu-arm64 is built for ubuntu/arm64 but \
                 this agent runs 2.9.43-ubuntu-amd64 on ubuntu/amd64; build the agent binary \
                 for ubuntu/amd64",
            ),
            (
                "2.9.60-centos7-amd64",
                Bootstrap,
                "error: local agent binary 2.9.60-centos7-amd64 is built for centos7/amd64 but \
                 this agent runs 2.9.43-ubuntu-amd64 on ubuntu/amd64; build the agent binary \
                 for ubuntu/amd64",
            ),
            // The periodic check only reports; a bad local binary fails when it is acted on.
            (
                "2.9.60-centos7-amd64",
                Periodic,
                "stay, upgrade-available 2.9.44",
            ),
            (
                "2.9.42-ubuntu-amd64",
                Bootstrap,
                "error: local agent binary 2.9.42-ubuntu-amd64 is older than the running \
                 2.9.43-ubuntu-amd64; agents never downgrade implicitly: build a newer binary, \
                 or pin an older published version with agent-version",
            ),
            (
                "2.9.60-ubuntu-amd64",
                operator(Some("2.9.44")),
                "error: upgrade-controller --agent-version 2.9.44 conflicts with the local \
                 agent binary 2.9.60-ubuntu-amd64 chosen with --build-agent; omit \
                 --agent-version or build 2.9.44",
            ),
        ];
        for &(binary, occasion, expected) in cases {
            assert_eq!(
                decide(running, &local(binary), None, occasion, &world),
                expected,
                "local {binary} {occasion:?}"
            );
        }
    }

    #[test]
    fn never_another_minor_or_major_implicitly() {
        let elsewhere = catalogue(&[
            ("2.9.42-ubuntu-amd64", Released),
            ("2.9.44-ubuntu-arm64", Released),
            ("2.9.44-centos7-amd64", Released),
            ("2.10.0-ubuntu-amd64", Released),
            ("2.10.0-ubuntu-amd64", Devel),
            ("3.9.44-ubuntu-amd64", Released),
            ("1.9.44-ubuntu-amd64", Released),
        ]);
        for policy in [UpgradePolicy::Off, UpgradePolicy::AutoPatch] {
            for stream in [None, Some(Devel), Some(Testing)] {
                for occasion in [Occasion::Bootstrap, Occasion::Periodic, operator(None)] {
                    assert_eq!(
                        decide("2.9.43-ubuntu-amd64", &policy, stream, occasion, &elsewhere),
                        "stay",
                        "{policy:?} {stream:?} {occasion:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn betas_upgrade_to_their_release() {
        use Occasion::{Bootstrap, Periodic};
        use UpgradePolicy::{AutoPatch, Off};
        let releases = catalogue(&[
            ("1.24.7-trusty-amd64", Released),
            ("1.25-beta1-trusty-amd64", Devel),
            ("1.25-beta2-trusty-amd64", Devel),
            ("1.25.0-trusty-amd64", Released),
            ("1.26-alpha1-trusty-amd64", Devel),
        ]);
        let cases: &[(&str, UpgradePolicy, Option<Stream>, Occasion, &str)] = &[
            (
                "1.25-beta1-trusty-amd64",
                Off,
                None,
                Periodic,
                "stay, upgrade-available 1.25.0",
            ),
            (
                "1.25-beta1-trusty-amd64",
                AutoPatch,
                None,
                Bootstrap,
                "upgrade to 1.25.0-trusty-amd64 from released (sha256 ab.., 1024 bytes)",
            ),
            (
                "1.25-beta1-trusty-amd64",
                Off,
                None,
                operator(Some("1.25-beta2")),
                "upgrade to 1.25-beta2-trusty-amd64 from devel (sha256 ab.., 1024 bytes)",
            ),
            (
                "1.25-beta1-trusty-amd64",
                Off,
                None,
                operator(Some("1.24.7")),
                "error: upgrade-controller --agent-version 1.24.7 is older than the running \
                 1.25-beta1; upgrade-controller never downgrades: to run 1.24.7, pin it with \
                 agent-version=1.24.7",
            ),
            // A release does not look at devel, and a beta is older than its release.
            ("1.25.0-trusty-amd64", Off, None, Periodic, "stay"),
            (
                "1.25.0-trusty-amd64",
                AutoPatch,
                Some(Devel),
                Bootstrap,
                "stay",
            ),
            (
                "1.25.0-trusty-amd64",
                Off,
                None,
                operator(Some("1.25-beta2")),
                "error: upgrade-controller --agent-version 1.25-beta2 is older than the running \
                 1.25.0; upgrade-controller never downgrades: to run 1.25-beta2, pin it with \
                 agent-version=1.25-beta2",
            ),
            (
                "1.24.7-trusty-amd64",
                AutoPatch,
                Some(Devel),
                Bootstrap,
                "stay",
            ),
        ];
        for (running, policy, stream, occasion, expected) in cases {
            assert_eq!(
                decide(running, policy, *stream, *occasion, &releases),
                *expected,
                "{running} {policy:?} {stream:?} {occasion:?}"
            );
        }
    }

    #[test]
    fn policy_and_decision_serde() {
        let cases: &[(UpgradePolicy, &str)] = &[
            (UpgradePolicy::Off, "\"off\""),
            (UpgradePolicy::AutoPatch, "\"auto-patch\""),
            (pinned("2.9.44"), "{\"pinned\":\"2.9.44\"}"),
        ];
        for (policy, json) in cases {
            assert_eq!(serde_json::to_string(policy).unwrap(), *json);
            assert_eq!(
                serde_json::from_str::<UpgradePolicy>(json).unwrap(),
                *policy
            );
        }
        let policy = local("2.9.60-ubuntu-amd64");
        let json = serde_json::to_string(&policy).unwrap();
        assert_eq!(
            serde_json::from_str::<UpgradePolicy>(&json).unwrap(),
            policy
        );
        assert_eq!(UpgradePolicy::default(), UpgradePolicy::Off);
        let stay = Decision::Stay {
            upgrade_available: Some(v("2.9.44")),
        };
        assert_eq!(
            serde_json::to_string(&stay).unwrap(),
            "{\"stay\":{\"upgrade_available\":\"2.9.44\"}}"
        );
    }

    // ------------------------------------------------------------------ high-water mark

    #[test]
    fn high_water_mark_refuses_rollback_and_freeze() {
        let fresh = HighWaterMark::default();
        assert_eq!(fresh.admit(1_000, 1_000, 0, 0), Ok(()));
        assert_eq!(fresh.admit_version(None), Ok(()));
        let mark = HighWaterMark {
            updated_unix_seconds: Some(1_000),
            version: Some(v("2.9.44")),
        };
        let cases: &[(u64, u64, u64, &str)] = &[
            (1_000, 1_000, 3_600, "ok"),
            (1_500, 1_000, 3_600, "ok"), // from the driver's future (500 s): age 0
            (87_400, 1_000, 3_600, "ok"), // exactly the skew ahead
            (
                87_401,
                1_000,
                3_600,
                "streams metadata updated at 87401 (unix seconds) is dated 86401 seconds after \
                 this controller's clock (1000), more than the 86400 allowed: refused, and not \
                 remembered, so that it cannot hold back genuine metadata; check the mirror's \
                 metadata and this controller's clock",
            ),
            (1_000, 4_600, 3_600, "ok"), // exactly at the bound
            (
                999,
                1_000,
                3_600,
                "streams metadata updated at 999 (unix seconds) is older than metadata already \
                 accepted, updated at 1000: refused as a possible rollback attack; check that \
                 the mirror at agent-metadata-url serves current metadata",
            ),
            (
                1_000,
                4_601,
                3_600,
                "streams metadata updated at 1000 (unix seconds) is 3601 seconds old at 4601, \
                 more than the 3600 allowed: refused as a possible freeze attack; check that the \
                 mirror at agent-metadata-url is being refreshed",
            ),
            (
                999,
                9_999,
                3_600,
                "streams metadata updated at 999 (unix seconds) is older than metadata already \
                 accepted, updated at 1000: refused as a possible rollback attack; check that \
                 the mirror at agent-metadata-url serves current metadata",
            ),
        ];
        for &(updated, now, freeze_after, expected) in cases {
            let outcome = match mark.admit(updated, now, freeze_after, 86_400) {
                Ok(()) => "ok".to_owned(),
                Err(error) => error.to_string(),
            };
            assert_eq!(outcome, expected, "updated {updated} now {now}");
        }
        let versions: &[(Option<&str>, &str)] = &[
            (Some("2.9.44"), "ok"),
            (Some("2.10.0"), "ok"),
            (
                Some("2.9.43"),
                "catalogue's highest version 2.9.43 is below 2.9.44 was already accepted: \
                 refused as a possible rollback attack; check that the mirror at \
                 agent-metadata-url serves current metadata",
            ),
            (
                None,
                "catalogue lists no agent binaries, but 2.9.44 was already accepted: refused as \
                 a possible rollback attack; check that the mirror at agent-metadata-url serves \
                 current metadata",
            ),
        ];
        for &(highest, expected) in versions {
            let outcome = match mark.admit_version(highest.map(v)) {
                Ok(()) => "ok".to_owned(),
                Err(error) => error.to_string(),
            };
            assert_eq!(outcome, expected, "{highest:?}");
        }
    }

    #[test]
    fn high_water_mark_advances_only_forwards() {
        let mut mark = HighWaterMark::default();
        mark.advance(1_000, Some(v("2.9.43")));
        assert_eq!(
            mark,
            HighWaterMark {
                updated_unix_seconds: Some(1_000),
                version: Some(v("2.9.43")),
            }
        );
        mark.advance(1_000, None);
        assert_eq!(mark.version, Some(v("2.9.43")));
        mark.advance(2_000, Some(v("2.9.44")));
        assert_eq!(
            mark,
            HighWaterMark {
                updated_unix_seconds: Some(2_000),
                version: Some(v("2.9.44")),
            }
        );
        let json = serde_json::to_string(&mark).unwrap();
        assert_eq!(
            json,
            "{\"updated_unix_seconds\":2000,\"version\":\"2.9.44\"}"
        );
        assert_eq!(serde_json::from_str::<HighWaterMark>(&json).unwrap(), mark);
    }

    #[test]
    #[should_panic(expected = "high-water mark moved backwards: updated 999 < 1000")]
    fn high_water_mark_asserts_updated_never_moves_backwards() {
        let mut mark = HighWaterMark::default();
        mark.advance(1_000, None);
        mark.advance(999, None);
    }

    #[test]
    #[should_panic(expected = "high-water mark moved backwards: version 2.9.43 < 2.9.44")]
    fn high_water_mark_asserts_version_never_moves_backwards() {
        let mut mark = HighWaterMark::default();
        mark.advance(1_000, Some(v("2.9.44")));
        mark.advance(2_000, Some(v("2.9.43")));
    }

    // ------------------------------------------------------------------ properties

    fn version_strategy() -> impl Strategy<Value = Version> {
        (
            1u32..=2,
            0u32..=2,
            prop::option::of(prop::sample::select(vec!["beta", "rc"])),
            0u32..=3,
            0u32..=1,
        )
            .prop_map(|(major, minor, tag, patch, build)| Version {
                major,
                minor,
                tag: tag.map(|tag| Tag::new(tag).unwrap()),
                patch,
                build,
            })
    }

    fn binary_strategy() -> impl Strategy<Value = Binary> {
        (
            version_strategy(),
            prop::sample::select(vec!["ubuntu", "centos7"]),
            prop::sample::select(vec!["amd64", "arm64"]),
        )
            .prop_map(|(number, release, arch)| Binary::new(number, release, arch).unwrap())
    }

    fn stream_strategy() -> impl Strategy<Value = Stream> {
        prop::sample::select(Stream::ALL.to_vec())
    }

    fn catalogue_strategy() -> impl Strategy<Value = Catalogue> {
        prop::collection::vec((binary_strategy(), stream_strategy()), 0..40).prop_map(|pairs| {
            let entries = pairs
                .into_iter()
                .map(|(binary, stream)| CatalogueEntry {
                    path: format!("agent/{binary}.tgz"),
                    binary,
                    stream,
                    size_bytes: 1024,
                    // One content per (binary, stream): duplicates are identical.
                    sha256: Sha256([stream as u8; 32]),
                })
                .collect();
            Catalogue::new(entries).unwrap()
        })
    }

    fn occasion_strategy() -> impl Strategy<Value = Occasion> {
        prop_oneof![
            Just(Occasion::Bootstrap),
            Just(Occasion::Periodic),
            prop::option::of(version_strategy())
                .prop_map(|version| Occasion::OperatorRequest { version }),
        ]
    }

    fn unpinned_policy_strategy() -> impl Strategy<Value = UpgradePolicy> {
        prop_oneof![
            Just(UpgradePolicy::Off),
            Just(UpgradePolicy::AutoPatch),
            binary_strategy().prop_map(|binary| UpgradePolicy::LocalBinary {
                binary,
                sha256: Sha256([7; 32]),
                size_bytes: 4096,
            }),
        ]
    }

    proptest! {
        #[test]
        fn unpinned_decisions_never_go_down_or_leave_the_minor_implicitly(
            catalogue in catalogue_strategy(),
            running in binary_strategy(),
            policy in unpinned_policy_strategy(),
            stream in prop::option::of(stream_strategy()),
            occasion in occasion_strategy(),
        ) {
            let request = SelectionRequest { running: &running, policy: &policy, stream, occasion };
            let result = select(&request, &catalogue);
            let explicit_version = match occasion {
                Occasion::OperatorRequest { version } => version,
                _ => None,
            };
            let implicit = explicit_version.is_none()
                && !matches!(policy, UpgradePolicy::LocalBinary { .. });
            match &result {
                Ok(Decision::Stay { upgrade_available: Some(available) }) => {
                    prop_assert!(*available > running.number);
                    prop_assert!(available.same_minor(&running.number));
                }
                Ok(Decision::Stay { upgrade_available: None }) => {}
                Ok(decision) => {
                    let target = decision.target().unwrap();
                    prop_assert!(target.number > running.number, "{target} from {running}");
                    prop_assert_eq!(&target.release, &running.release);
                    prop_assert_eq!(&target.arch, &running.arch);
                    prop_assert_ne!(occasion, Occasion::Periodic);
                    if implicit {
                        prop_assert!(target.number.same_minor(&running.number));
                    }
                    if let Some(version) = explicit_version {
                        prop_assert_eq!(target.number, version);
                    }
                }
                Err(error) => {
                    // Off and AutoPatch without an explicit version always decide.
                    prop_assert!(!implicit, "{error}");
                }
            }
        }

        #[test]
        fn pinned_decisions_are_the_pin_or_stay(
            catalogue in catalogue_strategy(),
            running in binary_strategy(),
            pin in version_strategy(),
            stream in prop::option::of(stream_strategy()),
            occasion in occasion_strategy(),
        ) {
            let policy = UpgradePolicy::Pinned(pin);
            let request = SelectionRequest { running: &running, policy: &policy, stream, occasion };
            match select(&request, &catalogue) {
                Ok(Decision::Stay { .. }) => prop_assert!(
                    pin == running.number || occasion == Occasion::Periodic
                ),
                Ok(decision) => prop_assert_eq!(decision.target().unwrap().number, pin),
                Err(PolicyError::VersionNotFound { version, origin, streams, .. }) => {
                    prop_assert_eq!(version, pin);
                    prop_assert_eq!(origin, VersionOrigin::AgentVersion);
                    // The one stream rule (`Catalogue::entry_for`): the streams preferred
                    // for the version wanted, not for the running one.
                    prop_assert_eq!(streams, Stream::preferred(stream, &pin));
                    prop_assert!(catalogue.find(pin, &running.release, &running.arch, streams).is_none());
                }
                Err(PolicyError::PinnedConflict { pinned, requested }) => {
                    prop_assert_eq!(pinned, pin);
                    prop_assert_eq!(occasion, Occasion::OperatorRequest { version: Some(requested) });
                }
                Err(error) => prop_assert!(false, "unexpected {error}"),
            }
        }

        #[test]
        fn catalogues_are_sorted_unique_and_complete(
            pairs in prop::collection::vec((binary_strategy(), stream_strategy()), 0..40),
        ) {
            let entries: Vec<CatalogueEntry> = pairs
                .iter()
                .map(|(binary, stream)| CatalogueEntry {
                    path: "a.tgz".to_owned(),
                    binary: binary.clone(),
                    stream: *stream,
                    size_bytes: 1,
                    sha256: Sha256([0; 32]),
                })
                .collect();
            let catalogue = Catalogue::new(entries).unwrap();
            let keys: Vec<(&Binary, Stream)> =
                catalogue.entries().iter().map(|entry| (&entry.binary, entry.stream)).collect();
            prop_assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
            for (binary, stream) in &pairs {
                prop_assert!(keys.contains(&(binary, *stream)));
            }
            prop_assert_eq!(
                catalogue.highest_version(),
                pairs.iter().map(|(binary, _)| binary.number).max()
            );
        }
    }
}
