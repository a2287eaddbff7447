//! The extension headers real tools write before a file's own header, read as metadata of
//! that file: PAX extended headers (`x`) and global headers (`g`), which POSIX.1-2001 archives
//! carry (GNU tar `--format=posix`, Python's `tarfile` by default), and GNU long-name
//! headers (`L`, GNU tar `--format=gnu` for names over 100 bytes).
//!
//! Each header is bounded before its data is read ([`EXTENSION_BYTES_MAX`]), and only what
//! can describe a flat regular file is accepted: a `path` (or long name) and a `size`, the
//! rest (times, owners, charsets, vendor keys) ignored. What would make this reader and
//! another disagree about what an archive holds is refused: a link target or a sparse map,
//! a global `path` or `size`, two names for one file, a `size` other than the header's,
//! a header describing no file.

use std::fmt;
use std::io::Read;

use tar::EntryType;

/// Largest extension header read, in bytes. GNU tar's PAX header for a file is about 100
/// bytes (three times), a long name at most a file name; 64 KiB leaves room for vendor keys
/// and stops a header that would fill memory.
pub const EXTENSION_BYTES_MAX: u64 = 64 * 1024;

/// The kinds of extension header accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ExtensionKind {
    /// PAX extended header (`x`): applies to the next file.
    Pax,
    /// PAX global header (`g`): applies to every later file.
    PaxGlobal,
    /// GNU long name (`L`): the next file's name.
    GnuLongName,
}

impl ExtensionKind {
    /// The kind of extension header `kind` is, if it is one this reader accepts.
    pub fn of(kind: EntryType) -> Option<ExtensionKind> {
        match kind {
            EntryType::XHeader => Some(ExtensionKind::Pax),
            EntryType::XGlobalHeader => Some(ExtensionKind::PaxGlobal),
            EntryType::GNULongName => Some(ExtensionKind::GnuLongName),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ExtensionKind::Pax => "PAX extended header",
            ExtensionKind::PaxGlobal => "PAX global header",
            ExtensionKind::GnuLongName => "GNU long-name header",
        }
    }
}

/// Why an extension header is refused.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ExtensionProblem {
    /// Larger than [`EXTENSION_BYTES_MAX`].
    TooLarge {
        kind: ExtensionKind,
        size_bytes: u64,
    },
    /// Not a sequence of `<length> <key>=<value>\n` records, or a name with a NUL inside.
    Malformed { kind: ExtensionKind, detail: String },
    /// A key that describes something other than a flat regular file.
    Unsupported { kind: ExtensionKind, key: String },
    /// A second header of the same kind, or a second name, for one file.
    Repeated { kind: ExtensionKind },
    /// The header's `size` differs from the size in the file's own header.
    SizeDisagrees {
        extension_bytes: u64,
        header_bytes: u64,
    },
    /// The archive ends after the header, with no file for it to describe.
    Dangling { kind: ExtensionKind },
}

impl fmt::Display for ExtensionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtensionProblem::TooLarge { kind, size_bytes } => write!(
                f,
                "a {} of {size_bytes} bytes, more than {EXTENSION_BYTES_MAX}",
                kind.name()
            ),
            ExtensionProblem::Malformed { kind, detail } => {
                write!(f, "a malformed {}: {detail}", kind.name())
            }
            ExtensionProblem::Unsupported { kind, key } => write!(
                f,
                "a {} with key {key:?}, which agent tarballs never need (only regular files \
                 are accepted)",
                kind.name()
            ),
            ExtensionProblem::Repeated { kind } => {
                write!(f, "a second {} or name for the same file", kind.name())
            }
            ExtensionProblem::SizeDisagrees {
                extension_bytes,
                header_bytes,
            } => write!(
                f,
                "a PAX size of {extension_bytes} bytes for a file whose header says \
                 {header_bytes}"
            ),
            ExtensionProblem::Dangling { kind } => {
                write!(f, "a {} that describes no file", kind.name())
            }
        }
    }
}

/// What the extension headers read so far say of the next file.
#[derive(Debug, Default)]
pub struct Pending {
    path: Option<Vec<u8>>,
    size_bytes: Option<u64>,
    /// The kinds of per-file header read since the last file, for the repeat and dangling
    /// checks.
    pax: bool,
    long_name: bool,
}

/// The next file's effective name and size, once its own header is read.
#[derive(Debug, PartialEq, Eq)]
pub struct Effective {
    /// The name from an extension header, if one named the file.
    pub path: Option<Vec<u8>>,
}

impl Pending {
    /// Reads one extension header of `kind` whose data is `data` (`size_bytes` long, as its
    /// header says) into what the next file will be given. Reads at most
    /// [`EXTENSION_BYTES_MAX`] bytes.
    pub fn read(
        &mut self,
        kind: ExtensionKind,
        size_bytes: u64,
        data: impl Read,
    ) -> Result<(), ReadFailure> {
        if size_bytes > EXTENSION_BYTES_MAX {
            return Err(ReadFailure::Problem(ExtensionProblem::TooLarge {
                kind,
                size_bytes,
            }));
        }
        let mut bytes = Vec::with_capacity(size_bytes as usize);
        data.take(EXTENSION_BYTES_MAX)
            .read_to_end(&mut bytes)
            .map_err(ReadFailure::Io)?;
        if bytes.len() as u64 != size_bytes {
            return Err(ReadFailure::Problem(ExtensionProblem::Malformed {
                kind,
                detail: format!("{} bytes where its header says {size_bytes}", bytes.len()),
            }));
        }
        self.apply(kind, &bytes).map_err(ReadFailure::Problem)
    }

    fn apply(&mut self, kind: ExtensionKind, bytes: &[u8]) -> Result<(), ExtensionProblem> {
        match kind {
            ExtensionKind::GnuLongName => {
                if self.long_name {
                    return Err(ExtensionProblem::Repeated { kind });
                }
                self.long_name = true;
                let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
                let name = &bytes[..end];
                if name.contains(&0) {
                    return Err(ExtensionProblem::Malformed {
                        kind,
                        detail: "a NUL inside the name".to_owned(),
                    });
                }
                self.set_path(kind, name.to_vec())
            }
            ExtensionKind::Pax | ExtensionKind::PaxGlobal => {
                if kind == ExtensionKind::Pax {
                    if self.pax {
                        return Err(ExtensionProblem::Repeated { kind });
                    }
                    self.pax = true;
                }
                for record in records(kind, bytes)? {
                    let (key, value) = record;
                    match (kind, key) {
                        (ExtensionKind::Pax, "path") => self.set_path(kind, value.to_vec())?,
                        (ExtensionKind::Pax, "size") => {
                            let size = std::str::from_utf8(value)
                                .ok()
                                .and_then(|text| text.parse::<u64>().ok())
                                .ok_or_else(|| ExtensionProblem::Malformed {
                                    kind,
                                    detail: format!(
                                        "size {:?} is not a number of bytes",
                                        String::from_utf8_lossy(value)
                                    ),
                                })?;
                            self.size_bytes = Some(size);
                        }
                        // A link's target, a sparse file's map, or a name or size for every
                        // file: nothing a flat archive of regular files has.
                        (_, "linkpath" | "path" | "size")
                        | (_, "GNU.sparse.map" | "GNU.sparse.size" | "GNU.sparse.name")
                        | (_, "GNU.sparse.major" | "GNU.sparse.minor" | "GNU.sparse.offset")
                        | (_, "GNU.sparse.numblocks" | "GNU.sparse.realsize") => {
                            return Err(ExtensionProblem::Unsupported {
                                kind,
                                key: key.to_owned(),
                            });
                        }
                        // Times, owners, charsets, comments, vendor keys: not kept (the
                        // agent writes its own mode and owner, and no times).
                        _ => {}
                    }
                }
                Ok(())
            }
        }
    }

    fn set_path(&mut self, kind: ExtensionKind, path: Vec<u8>) -> Result<(), ExtensionProblem> {
        if self.path.is_some() {
            return Err(ExtensionProblem::Repeated { kind });
        }
        self.path = Some(path);
        Ok(())
    }

    /// The file whose header `header_bytes` follows takes what was read for it; the
    /// per-file state starts over for the next one.
    pub fn take_for_file(&mut self, header_bytes: u64) -> Result<Effective, ExtensionProblem> {
        let pending = std::mem::take(self);
        if let Some(extension_bytes) = pending.size_bytes
            && extension_bytes != header_bytes
        {
            return Err(ExtensionProblem::SizeDisagrees {
                extension_bytes,
                header_bytes,
            });
        }
        Ok(Effective { path: pending.path })
    }

    /// At the end of the archive: a per-file header with no file after it is refused.
    pub fn finish(&self) -> Result<(), ExtensionProblem> {
        if self.pax {
            return Err(ExtensionProblem::Dangling {
                kind: ExtensionKind::Pax,
            });
        }
        if self.long_name {
            return Err(ExtensionProblem::Dangling {
                kind: ExtensionKind::GnuLongName,
            });
        }
        Ok(())
    }
}

/// Why reading an extension header failed.
#[derive(Debug)]
pub enum ReadFailure {
    /// The archive could not be read (corrupt gzip, truncated data).
    Io(std::io::Error),
    Problem(ExtensionProblem),
}

/// The `<length> <key>=<value>\n` records of a PAX header, each checked: the length counts
/// the whole record, digits, space and newline included (POSIX.1-2001, `pax`).
fn records(kind: ExtensionKind, bytes: &[u8]) -> Result<Vec<(&str, &[u8])>, ExtensionProblem> {
    let malformed = |detail: String| ExtensionProblem::Malformed { kind, detail };
    let mut records = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| malformed("a record without a length".to_owned()))?;
        let length: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
            .ok_or_else(|| {
                malformed(format!(
                    "record length {:?} is not a number",
                    String::from_utf8_lossy(&rest[..space])
                ))
            })?;
        if length <= space + 1 || length > rest.len() || rest[length - 1] != b'\n' {
            return Err(malformed(format!(
                "a record of length {length} that does not end in a newline where it says"
            )));
        }
        let record = &rest[space + 1..length - 1];
        let equals = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| malformed("a record without '='".to_owned()))?;
        let key = std::str::from_utf8(&record[..equals])
            .map_err(|_| malformed("a key that is not UTF-8".to_owned()))?;
        records.push((key, &record[equals + 1..]));
        rest = &rest[length..];
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        // The length counts its own digits: find the fixed point.
        let mut length = body.len() + 1;
        while format!("{length}{body}").len() != length {
            length += 1;
        }
        format!("{length}{body}")
    }

    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
        records
            .iter()
            .map(|(key, value)| record(key, value))
            .collect::<String>()
            .into_bytes()
    }

    fn read(
        pending: &mut Pending,
        kind: ExtensionKind,
        data: &[u8],
    ) -> Result<(), ExtensionProblem> {
        match pending.read(kind, data.len() as u64, data) {
            Ok(()) => Ok(()),
            Err(ReadFailure::Problem(problem)) => Err(problem),
            Err(ReadFailure::Io(error)) => panic!("{error}"),
        }
    }

    #[test]
    fn a_pax_header_names_and_sizes_the_next_file_and_its_times_are_ignored() {
        let mut pending = Pending::default();
        let data = pax(&[
            ("mtime", "1700000000.123456789"),
            ("atime", "1700000000.5"),
            ("path", "lockstepd"),
            ("size", "42"),
            ("SCHILY.fflags", "nodump"),
        ]);
        read(&mut pending, ExtensionKind::Pax, &data).unwrap();
        assert_eq!(
            pending.take_for_file(42).unwrap(),
            Effective {
                path: Some(b"lockstepd".to_vec())
            }
        );
        pending.finish().unwrap();
    }

    #[test]
    fn a_gnu_long_name_loses_its_trailing_nuls() {
        let mut pending = Pending::default();
        let name = "n".repeat(150);
        read(
            &mut pending,
            ExtensionKind::GnuLongName,
            format!("{name}\0").as_bytes(),
        )
        .unwrap();
        assert_eq!(
            pending.take_for_file(1).unwrap().path,
            Some(name.into_bytes())
        );
    }

    #[test]
    fn what_no_flat_archive_of_regular_files_needs_is_refused() {
        let cases: Vec<(ExtensionKind, Vec<u8>, ExtensionProblem)> = vec![
            (
                ExtensionKind::Pax,
                pax(&[("linkpath", "/etc/shadow")]),
                ExtensionProblem::Unsupported {
                    kind: ExtensionKind::Pax,
                    key: "linkpath".into(),
                },
            ),
            (
                ExtensionKind::Pax,
                pax(&[("GNU.sparse.map", "0,10")]),
                ExtensionProblem::Unsupported {
                    kind: ExtensionKind::Pax,
                    key: "GNU.sparse.map".into(),
                },
            ),
            (
                ExtensionKind::PaxGlobal,
                pax(&[("path", "lockstepd")]),
                ExtensionProblem::Unsupported {
                    kind: ExtensionKind::PaxGlobal,
                    key: "path".into(),
                },
            ),
            (
                ExtensionKind::Pax,
                pax(&[("size", "ten")]),
                ExtensionProblem::Malformed {
                    kind: ExtensionKind::Pax,
                    detail: "size \"ten\" is not a number of bytes".into(),
                },
            ),
            (
                ExtensionKind::Pax,
                b"99 path=x\n".to_vec(),
                ExtensionProblem::Malformed {
                    kind: ExtensionKind::Pax,
                    detail: "a record of length 99 that does not end in a newline where it \
                             says"
                        .into(),
                },
            ),
            (
                ExtensionKind::Pax,
                b"x path=y\n".to_vec(),
                ExtensionProblem::Malformed {
                    kind: ExtensionKind::Pax,
                    detail: "record length \"x\" is not a number".into(),
                },
            ),
            (
                ExtensionKind::GnuLongName,
                b"a\0b\0".to_vec(),
                ExtensionProblem::Malformed {
                    kind: ExtensionKind::GnuLongName,
                    detail: "a NUL inside the name".into(),
                },
            ),
        ];
        for (kind, data, expected) in cases {
            let mut pending = Pending::default();
            assert_eq!(read(&mut pending, kind, &data), Err(expected));
        }
    }

    #[test]
    fn a_global_header_without_a_name_or_size_is_accepted() {
        let mut pending = Pending::default();
        let data = pax(&[("comment", "built by CI"), ("mtime", "0")]);
        read(&mut pending, ExtensionKind::PaxGlobal, &data).unwrap();
        pending.finish().unwrap();
        assert_eq!(pending.take_for_file(3).unwrap().path, None);
    }

    #[test]
    fn two_names_a_size_that_disagrees_and_a_header_for_no_file_are_refused() {
        let mut pending = Pending::default();
        read(&mut pending, ExtensionKind::Pax, &pax(&[("path", "a")])).unwrap();
        assert_eq!(
            read(&mut pending, ExtensionKind::GnuLongName, b"b\0"),
            Err(ExtensionProblem::Repeated {
                kind: ExtensionKind::GnuLongName
            })
        );
        let mut pending = Pending::default();
        read(&mut pending, ExtensionKind::Pax, &pax(&[("mtime", "1")])).unwrap();
        assert_eq!(
            read(&mut pending, ExtensionKind::Pax, &pax(&[("mtime", "2")])),
            Err(ExtensionProblem::Repeated {
                kind: ExtensionKind::Pax
            })
        );
        let mut pending = Pending::default();
        read(&mut pending, ExtensionKind::Pax, &pax(&[("size", "7")])).unwrap();
        assert_eq!(
            pending.take_for_file(8),
            Err(ExtensionProblem::SizeDisagrees {
                extension_bytes: 7,
                header_bytes: 8
            })
        );
        let mut pending = Pending::default();
        read(&mut pending, ExtensionKind::GnuLongName, b"late\0").unwrap();
        assert_eq!(
            pending.finish(),
            Err(ExtensionProblem::Dangling {
                kind: ExtensionKind::GnuLongName
            })
        );
    }

    #[test]
    fn a_header_larger_than_the_bound_is_refused_before_it_is_read() {
        let mut pending = Pending::default();
        let never_read = std::io::repeat(b'x');
        let failure = pending
            .read(ExtensionKind::Pax, EXTENSION_BYTES_MAX + 1, never_read)
            .unwrap_err();
        assert!(
            matches!(
                failure,
                ReadFailure::Problem(ExtensionProblem::TooLarge {
                    kind: ExtensionKind::Pax,
                    size_bytes
                }) if size_bytes == EXTENSION_BYTES_MAX + 1
            ),
            "{failure:?}"
        );
    }
}
