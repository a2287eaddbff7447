//! Juju's version grammar: agent versions and agent binaries.
//!
//! The grammar and ordering follow `github.com/juju/version` exactly, so a string a Juju
//! operator typed (or a simplestreams catalogue carries) means the same thing here:
//!
//! ```text
//! version := major "." minor ( "." patch | "-" tag patch ) [ "." build ]
//! binary  := version "-" release "-" arch          release: an OS (ubuntu) or series (trusty)
//! ```
//!
//! Each number has 1 to 9 ASCII digits (Juju's `\d{1,9}`); a tag is 1 to
//! [`Tag::LENGTH_MAX`] lowercase ASCII letters. Ordering: major, minor, then a pre-release
//! sorts before its release (`1.25-beta1 < 1.25.0`) and tags compare as strings, then patch,
//! then build (`2.9.43 < 2.9.43.1`).
//!
//! [`Version`] is `Copy` and never allocates: the lifecycle holds versions in hot paths and
//! in model-checked state.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// The largest value a version component may have: Juju accepts at most nine digits.
pub const COMPONENT_MAX: u32 = 999_999_999;

/// A pre-release tag such as `beta` in `1.25-beta1`: lowercase ASCII letters, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag {
    bytes: [u8; Tag::LENGTH_MAX],
    length: u8,
}

impl Tag {
    /// Longest tag accepted. Juju's own tags are `alpha`, `beta`, `rc`, `dev`; the bound keeps
    /// [`Version`] `Copy` and its size fixed.
    pub const LENGTH_MAX: usize = 15;

    /// Builds a tag; `None` unless `text` is 1..=[`Tag::LENGTH_MAX`] lowercase ASCII letters.
    pub fn new(text: &str) -> Option<Tag> {
        let valid = !text.is_empty()
            && text.len() <= Tag::LENGTH_MAX
            && text.bytes().all(|b| b.is_ascii_lowercase());
        if !valid {
            return None;
        }
        let mut bytes = [0u8; Tag::LENGTH_MAX];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(Tag {
            bytes,
            length: text.len() as u8,
        })
    }

    /// The tag's letters, e.g. `beta`.
    pub fn as_str(&self) -> &str {
        // Only ASCII lowercase letters are ever stored (see `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.length)]).expect("tag is ASCII")
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent version, Juju's `version.Number`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    /// The major version: `2` in `2.9.43`.
    pub major: u32,
    /// The minor version: `9` in `2.9.43`.
    pub minor: u32,
    /// Pre-release tag; `None` for a release.
    pub tag: Option<Tag>,
    /// The patch number: `43` in `2.9.43`; in a tagged version, the tag's number (`1` in
    /// `1.25-beta1`).
    pub patch: u32,
    /// Build number (`2.9.43.1`); 0 when absent, and then not displayed.
    pub build: u32,
}

impl Version {
    /// The zero version: what an agent that never recorded `upgradedToVersion` has run.
    pub const ZERO: Version = Version::new(0, 0, 0);

    /// A release version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            tag: None,
            patch,
            build: 0,
        }
    }

    /// Parses Juju's grammar; the error names the input and what is wrong with it.
    pub fn parse(input: &str) -> Result<Version, ParseVersionError> {
        parse_number(input).map_err(|reason| ParseVersionError {
            input: input.to_owned(),
            what: "version",
            reason,
        })
    }

    /// True for a release (no pre-release tag).
    pub fn is_release(&self) -> bool {
        self.tag.is_none()
    }

    /// The version with its pre-release tag and build number cleared, as Juju does to the
    /// running version before planning upgrade steps, so that `1.25-beta1` runs the steps of
    /// its release line and a build `2.9.43.1` runs the steps of `2.9.43`.
    pub fn without_tag_and_build(self) -> Version {
        Version {
            tag: None,
            build: 0,
            ..self
        }
    }

    /// True when both share major and minor: the scope of an implicit patch upgrade.
    pub fn same_minor(&self, other: &Version) -> bool {
        self.major == other.major && self.minor == other.minor
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Version) -> Ordering {
        self.major
            .cmp(&other.major)
            .then(self.minor.cmp(&other.minor))
            .then_with(|| match (&self.tag, &other.tag) {
                (None, None) => Ordering::Equal,
                // A pre-release sorts before its release.
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(a), Some(b)) => a.as_str().cmp(b.as_str()),
            })
            .then(self.patch.cmp(&other.patch))
            .then(self.build.cmp(&other.build))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Version) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tag {
            None => write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?,
            Some(tag) => write!(f, "{}.{}-{}{}", self.major, self.minor, tag, self.patch)?,
        }
        if self.build > 0 {
            write!(f, ".{}", self.build)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({self})")
    }
}

impl FromStr for Version {
    type Err = ParseVersionError;
    fn from_str(input: &str) -> Result<Version, ParseVersionError> {
        Version::parse(input)
    }
}

impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Version, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Version::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// An agent binary: a version built for one release (OS such as `ubuntu`, or a series such
/// as `trusty` in Juju 1.x names) and one architecture. Juju's `version.Binary`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Binary {
    /// The version.
    pub number: Version,
    /// The release: an OS (`ubuntu`) or, in Juju 1.x names, a series (`trusty`).
    pub release: String,
    /// The architecture, e.g. `amd64`.
    pub arch: String,
}

impl Binary {
    /// Longest release or arch name accepted; real ones are under 10 characters.
    pub const NAME_LENGTH_MAX: usize = 32;

    /// Builds a binary name, validating release and arch as [`Binary::parse`] does.
    pub fn new(number: Version, release: &str, arch: &str) -> Result<Binary, ParseVersionError> {
        let text = format!("{number}-{release}-{arch}");
        check_name(release, "release")
            .and_then(|()| check_name(arch, "arch"))
            .map_err(|reason| ParseVersionError {
                input: text,
                what: "binary",
                reason,
            })?;
        Ok(Binary {
            number,
            release: release.to_owned(),
            arch: arch.to_owned(),
        })
    }

    /// Parses `<version>-<release>-<arch>`, e.g. `2.9.43-ubuntu-amd64`,
    /// `1.25-beta1-trusty-amd64`.
    pub fn parse(input: &str) -> Result<Binary, ParseVersionError> {
        let error = |reason| ParseVersionError {
            input: input.to_owned(),
            what: "binary",
            reason,
        };
        // Split from the right: the version itself may contain '-' (a pre-release tag).
        let mut parts = input.rsplitn(3, '-');
        let arch = parts.next().unwrap_or_default();
        let (Some(release), Some(number)) = (parts.next(), parts.next()) else {
            return Err(error(Reason::BinaryShape));
        };
        check_name(release, "release").map_err(error)?;
        check_name(arch, "arch").map_err(error)?;
        let number = parse_number(number).map_err(error)?;
        Ok(Binary {
            number,
            release: release.to_owned(),
            arch: arch.to_owned(),
        })
    }
}

impl fmt::Display for Binary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.number, self.release, self.arch)
    }
}

impl fmt::Debug for Binary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Binary({self})")
    }
}

impl FromStr for Binary {
    type Err = ParseVersionError;
    fn from_str(input: &str) -> Result<Binary, ParseVersionError> {
        Binary::parse(input)
    }
}

impl serde::Serialize for Binary {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Binary {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Binary, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Binary::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A string that is not a version or binary in Juju's grammar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseVersionError {
    /// The offending input, verbatim.
    pub input: String,
    /// `"version"` or `"binary"`.
    pub what: &'static str,
    /// Why it was refused.
    pub reason: Reason,
}

/// Why a version or binary string was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The input is empty.
    Empty,
    /// Not `major.minor.patch` or `major.minor-tagN` (with an optional `.build`).
    Shape,
    /// A component that is not 1 to 9 ASCII digits.
    Component {
        /// Which component: `major`, `minor`, `patch` or `build`.
        name: &'static str,
        /// The component as given.
        text: String,
    },
    /// A pre-release tag without its number, as in `1.2-beta`.
    TagWithoutNumber {
        /// The tag as given.
        tag: String,
    },
    /// A tag that is not 1..=15 lowercase ASCII letters.
    BadTag {
        /// The tag as given.
        tag: String,
    },
    /// A binary that is not `<version>-<release>-<arch>`.
    BinaryShape,
    /// A release or arch name that is empty, too long, or has characters outside
    /// `[A-Za-z0-9._]` (which would be unsafe in a file name).
    BadName {
        /// `release` or `arch`.
        name: &'static str,
        /// The name as given.
        text: String,
    },
}

impl fmt::Display for ParseVersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}: ", self.what, self.input)?;
        match &self.reason {
            Reason::Empty => f.write_str("empty string"),
            Reason::Shape => f.write_str(
                "expected major.minor.patch, major.minor-tagN or either with .build \
                 (e.g. 2.9.43, 1.25-beta1, 2.9.43.1)",
            ),
            Reason::Component { name, text } => write!(
                f,
                "{name} {text:?} is not a number of 1 to 9 digits (at most {COMPONENT_MAX})"
            ),
            Reason::TagWithoutNumber { tag } => write!(
                f,
                "pre-release tag {tag:?} needs a number after it (e.g. 1.25-{tag}1)"
            ),
            Reason::BadTag { tag } => write!(
                f,
                "pre-release tag {tag:?} must be 1 to {} lowercase letters a-z",
                Tag::LENGTH_MAX
            ),
            Reason::BinaryShape => f.write_str(
                "expected <version>-<release>-<arch> (e.g. 2.9.43-ubuntu-amd64, \
                 1.22.1-trusty-amd64)",
            ),
            Reason::BadName { name, text } => write!(
                f,
                "{name} {text:?} must be 1 to {} characters of A-Z, a-z, 0-9, '.' or '_'",
                Binary::NAME_LENGTH_MAX
            ),
        }
    }
}

impl std::error::Error for ParseVersionError {}

fn parse_number(input: &str) -> Result<Version, Reason> {
    if input.is_empty() {
        return Err(Reason::Empty);
    }
    let (major, rest) = input.split_once('.').ok_or(Reason::Shape)?;
    let major = component(major, "major")?;
    // The minor ends at the first '.' (release) or '-' (pre-release).
    let split = rest.find(['.', '-']).ok_or(Reason::Shape)?;
    let (minor, separator, rest) = (&rest[..split], &rest[split..split + 1], &rest[split + 1..]);
    let minor = component(minor, "minor")?;
    let (patch_text, build_text) = match rest.split_once('.') {
        Some((patch, build)) => (patch, Some(build)),
        None => (rest, None),
    };
    let (tag, patch_text) = if separator == "-" {
        let digits_at = patch_text
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(patch_text.len());
        let (tag_text, number) = patch_text.split_at(digits_at);
        let tag = Tag::new(tag_text).ok_or_else(|| Reason::BadTag {
            tag: tag_text.to_owned(),
        })?;
        if number.is_empty() {
            return Err(Reason::TagWithoutNumber {
                tag: tag_text.to_owned(),
            });
        }
        (Some(tag), number)
    } else {
        (None, patch_text)
    };
    let patch = component(patch_text, "patch")?;
    let build = match build_text {
        Some(text) => component(text, "build")?,
        None => 0,
    };
    Ok(Version {
        major,
        minor,
        tag,
        patch,
        build,
    })
}

fn component(text: &str, name: &'static str) -> Result<u32, Reason> {
    let valid = (1..=9).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    if !valid {
        return Err(Reason::Component {
            name,
            text: text.to_owned(),
        });
    }
    // At most nine ASCII digits always fit in a u32.
    Ok(text.parse().expect("nine digits fit in u32"))
}

fn check_name(text: &str, name: &'static str) -> Result<(), Reason> {
    let valid = !text.is_empty()
        && text.len() <= Binary::NAME_LENGTH_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Reason::BadName {
            name,
            text: text.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    /// Text, then major, minor, tag, patch, build.
    type Case = (&'static str, u32, u32, Option<&'static str>, u32, u32);

    #[test]
    fn parses_real_juju_versions() {
        let cases: &[Case] = &[
            ("2.9.43", 2, 9, None, 43, 0),
            ("1.25-beta1", 1, 25, Some("beta"), 1, 0),
            ("2.9.43.1", 2, 9, None, 43, 1),
            ("1.22.1", 1, 22, None, 1, 0),
            ("3.6.1", 3, 6, None, 1, 0),
            ("2.0-rc3", 2, 0, Some("rc"), 3, 0),
            ("2.0-beta18.2", 2, 0, Some("beta"), 18, 2),
            ("1.16.0", 1, 16, None, 0, 0),
            ("0.0.0", 0, 0, None, 0, 0),
            ("999999999.1.1", 999_999_999, 1, None, 1, 0),
        ];
        for &(text, major, minor, tag, patch, build) in cases {
            let parsed = v(text);
            assert_eq!(
                (parsed.major, parsed.minor, parsed.patch, parsed.build),
                (major, minor, patch, build),
                "{text}"
            );
            assert_eq!(parsed.tag.as_ref().map(Tag::as_str), tag, "{text}");
            assert_eq!(parsed.to_string(), text, "round trip of {text}");
        }
    }

    #[test]
    fn a_zero_build_is_not_displayed() {
        assert_eq!(v("2.9.43.0").to_string(), "2.9.43");
        assert_eq!(v("2.9.43.0"), v("2.9.43"));
    }

    #[test]
    fn refuses_bad_versions_naming_them() {
        let cases: &[(&str, &str)] = &[
            ("", "empty string"),
            ("1", "expected major.minor.patch"),
            ("1.2", "expected major.minor.patch"),
            ("1.2.3.4.5", "build \"4.5\""),
            ("1.2-beta", "pre-release tag \"beta\" needs a number"),
            ("1.2-1", "pre-release tag \"\""),
            ("1.2-BETA1", "pre-release tag \"BETA\""),
            ("1.2-beta1x", "patch \"1x\""),
            ("1.2-averyveryverylongtag1", "1 to 15 lowercase"),
            ("1234567890.0.0", "major \"1234567890\""),
            ("1.99999999999999999999.0", "minor"),
            ("1..2", "minor \"\""),
            ("1.2.", "patch \"\""),
            ("1.2.3.", "build \"\""),
            (".1.2", "major \"\""),
            ("-1.2.3", "major \"-1\""),
            ("+1.2.3", "major \"+1\""),
            ("1.2.3 ", "patch \"3 \""),
            (" 1.2.3", "major \" 1\""),
            ("１.2.3", "major"),
            ("1.2.٣", "patch"),
            ("v1.2.3", "major \"v1\""),
            ("1.2.3-ubuntu-amd64", "patch"),
        ];
        for &(text, expected) in cases {
            let error = Version::parse(text).expect_err(text);
            let message = error.to_string();
            assert!(
                message.contains(expected),
                "{text:?}: {message:?} lacks {expected:?}"
            );
            assert!(
                message.starts_with(&format!("invalid version {text:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn orders_as_juju_does() {
        let ascending = [
            "0.0.0",
            "1.16.0",
            "1.22.1",
            "1.22.3",
            "1.25-alpha1",
            "1.25-beta1",
            "1.25-beta2",
            "1.25-beta2.1",
            "1.25-rc1",
            "1.25.0",
            "1.25.0.1",
            "1.25.1",
            "2.0-beta18",
            "2.0.0",
            "2.9.9",
            "2.9.43",
            "2.9.43.1",
            "2.9.43.2",
            "2.10.0",
            "3.6.1",
        ];
        for (i, a) in ascending.iter().enumerate() {
            for (j, b) in ascending.iter().enumerate() {
                assert_eq!(v(a).cmp(&v(b)), i.cmp(&j), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn clears_tag_and_build_for_step_planning() {
        assert_eq!(v("1.25-beta1").without_tag_and_build(), v("1.25.1"));
        assert_eq!(v("2.9.43.7").without_tag_and_build(), v("2.9.43"));
    }

    #[test]
    fn parses_binaries_old_and_new() {
        let cases: &[(&str, &str, &str, &str)] = &[
            ("2.9.43-ubuntu-amd64", "2.9.43", "ubuntu", "amd64"),
            ("1.22.1-trusty-amd64", "1.22.1", "trusty", "amd64"),
            ("1.25-beta1-trusty-amd64", "1.25-beta1", "trusty", "amd64"),
            ("2.9.43.1-ubuntu-arm64", "2.9.43.1", "ubuntu", "arm64"),
            ("1.16.0-precise-i386", "1.16.0", "precise", "i386"),
            ("3.6.1-ubuntu-ppc64el", "3.6.1", "ubuntu", "ppc64el"),
            ("2.8.0-centos7-s390x", "2.8.0", "centos7", "s390x"),
        ];
        for &(text, number, release, arch) in cases {
            let binary = Binary::parse(text).unwrap();
            assert_eq!(binary.number, v(number), "{text}");
            assert_eq!(binary.release, release, "{text}");
            assert_eq!(binary.arch, arch, "{text}");
            assert_eq!(binary.to_string(), text);
        }
    }

    #[test]
    fn refuses_bad_binaries_naming_them() {
        let cases: &[(&str, &str)] = &[
            ("", "expected <version>-<release>-<arch>"),
            ("2.9.43", "expected <version>-<release>-<arch>"),
            ("2.9.43-ubuntu", "expected <version>-<release>-<arch>"),
            ("2.9.43--amd64", "release \"\""),
            ("2.9.43-ubuntu-", "arch \"\""),
            ("2.9-ubuntu-amd64", "expected major.minor.patch"),
            ("2.9.43-ubu/ntu-amd64", "release \"ubu/ntu\""),
            ("2.9.43-..\\x-amd64", "release"),
            ("2.9.43-ubuntu-amd 64", "arch \"amd 64\""),
            ("2.9.43-ubuntu-ämd64", "arch"),
        ];
        for &(text, expected) in cases {
            let message = Binary::parse(text).expect_err(text).to_string();
            assert!(
                message.contains(expected),
                "{text:?}: {message:?} lacks {expected:?}"
            );
            assert!(message.starts_with("invalid binary"), "{message}");
        }
    }

    #[test]
    fn serde_uses_the_text_form() {
        let binary = Binary::parse("1.25-beta1-trusty-amd64").unwrap();
        let json = serde_json::to_string(&binary).unwrap();
        assert_eq!(json, "\"1.25-beta1-trusty-amd64\"");
        assert_eq!(serde_json::from_str::<Binary>(&json).unwrap(), binary);
        let error = serde_json::from_str::<Version>("\"1.2-beta\"").unwrap_err();
        assert!(error.to_string().contains("needs a number"), "{error}");
    }
}
