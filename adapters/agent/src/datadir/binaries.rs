//! The installed binaries: `tools/<version>-<os>-<arch>/` directories assembled under a
//! temporary name and renamed into place when complete, and the agent links
//! `tools/<tag>` switched with one rename.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lockstep_core::policy::Sha256;
use lockstep_core::version::{Binary, Version};

use crate::unpack::{UnpackLimits, unpack_tgz};

use super::downloaded_tools::DownloadedTools;
use super::error::DataDirError;
use super::files::{copy_hashed, random_u64, sha256_of_file, sync_directory, write_new_file};
use super::identity::{BinaryIdentity, read_force_version};
use super::layout::{DataDir, check_binary, check_tag};
use super::names::{
    DOWNLOADED_TOOLS, EXECUTABLE, EXECUTABLE_MODE, FORCE_VERSION, LOCAL_BINARY_BYTES_MAX,
    PRIVATE_FILE_MODE,
};

/// Prefixes of the temporary entries made in `tools/`; none is a valid tag or binary.
const STAGING_PREFIX: &str = ".install-";
const REPLACED_PREFIX: &str = ".replaced-";
const SWITCH_PREFIX: &str = ".switch-";
/// Attempts at a fresh random name for a temporary symlink.
const SWITCH_NAME_ATTEMPTS_MAX: usize = 8;

impl DataDir {
    /// The binary `tools/<tag>` points at; `None` when the link does not exist.
    pub fn current_binary(&self, tag: &str) -> Result<Option<Binary>, DataDirError> {
        check_tag(tag)?;
        let link = self.agent_link(tag);
        let target = match fs::read_link(&link) {
            Ok(target) => target,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) if error.kind() == io::ErrorKind::InvalidInput => {
                return Err(DataDirError::BadLink {
                    path: link,
                    target: String::new(),
                    detail: "not a symlink; remove it and switch again".into(),
                });
            }
            Err(error) => return Err(DataDirError::io(&link, "read the link")(error)),
        };
        let text = target.to_string_lossy().into_owned();
        let bad = |detail: String| DataDirError::BadLink {
            path: link.clone(),
            target: text.clone(),
            detail,
        };
        if target.is_absolute() || text.contains('/') {
            return Err(bad(
                "expected a relative <version>-<os>-<arch> name in the same directory".into(),
            ));
        }
        Binary::parse(&text)
            .map(Some)
            .map_err(|error| bad(error.to_string()))
    }

    /// Points `tools/<tag>` at `binary`'s directory atomically: a symlink made under a
    /// temporary name in `tools/` is renamed over the link, then `tools/` is fsynced.
    /// Refuses unless `tools/<binary>/lockstepd` is an executable regular file.
    pub fn switch_to(&self, tag: &str, binary: &Binary) -> Result<(), DataDirError> {
        check_tag(tag)?;
        check_binary(binary)?;
        let executable = self.binary_path(binary);
        check_executable(&executable)?;
        let tools = self.tools_dir();
        let link = self.agent_link(tag);
        let target = binary.to_string();
        let mut attempt = 0;
        let temporary = loop {
            let candidate = tools.join(format!("{SWITCH_PREFIX}{tag}-{:016x}", random_u64()));
            match std::os::unix::fs::symlink(&target, &candidate) {
                Ok(()) => break candidate,
                Err(error)
                    if error.kind() == io::ErrorKind::AlreadyExists
                        && attempt + 1 < SWITCH_NAME_ATTEMPTS_MAX =>
                {
                    attempt += 1;
                }
                Err(error) => {
                    return Err(DataDirError::io(&candidate, "create the symlink")(error));
                }
            }
        };
        if let Err(error) = fs::rename(&temporary, &link) {
            let _ = fs::remove_file(&temporary);
            return Err(DataDirError::io(&link, "replace the agent link")(error));
        }
        sync_directory(&tools)?;
        tracing::info!(tag, binary = %binary, link = %link.display(), "agent link switched");
        Ok(())
    }

    /// The binaries installed in `tools/` (directories named as a binary), sorted.
    pub fn installed_binaries(&self) -> Result<Vec<Binary>, DataDirError> {
        let tools = self.tools_dir();
        let entries = match fs::read_dir(&tools) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(DataDirError::io(&tools, "list")(error)),
        };
        let mut binaries = Vec::new();
        for entry in entries {
            let entry = entry.map_err(DataDirError::io(&tools, "list"))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            if let (true, Ok(binary)) = (is_dir, Binary::parse(&name)) {
                binaries.push(binary);
            }
        }
        binaries.sort();
        Ok(binaries)
    }

    /// The provenance of an installed binary; `None` when it has none.
    pub fn read_downloaded_tools(
        &self,
        binary: &Binary,
    ) -> Result<Option<DownloadedTools>, DataDirError> {
        check_binary(binary)?;
        DownloadedTools::read(&self.binary_dir(binary))
    }

    /// Installs an agent tarball as `tools/<binary>/`; returns the executable's path.
    ///
    /// The tarball must match `tools` (its version, size and sha256: checked again here
    /// even though the download checked them, because it is cheap and the file may have
    /// been replaced since). It is unpacked with [`unpack_tgz`] into a temporary directory
    /// in `tools/`, which must then hold an executable regular `lockstepd`;
    /// `downloaded-tools.txt` is written, everything fsynced, and the directory renamed
    /// into place. Idempotent: a directory already installed with the same sha256 is kept;
    /// one with another sha256 (or a broken one) is replaced atomically.
    pub fn install_tarball(
        &self,
        binary: &Binary,
        tarball: &Path,
        tools: &DownloadedTools,
    ) -> Result<PathBuf, DataDirError> {
        check_binary(binary)?;
        if tools.version != *binary {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the version its metadata names",
                expected: binary.to_string(),
                actual: tools.version.to_string(),
            });
        }
        let (sha256, size_bytes) = sha256_of_file(tarball, tools.size_bytes.saturating_add(1))?;
        if size_bytes != tools.size_bytes {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the size in bytes",
                expected: tools.size_bytes.to_string(),
                actual: if size_bytes > tools.size_bytes {
                    format!("over {}", tools.size_bytes)
                } else {
                    size_bytes.to_string()
                },
            });
        }
        if sha256 != tools.sha256 {
            return Err(DataDirError::Mismatch {
                path: tarball.to_path_buf(),
                what: "the sha256",
                expected: tools.sha256.to_string(),
                actual: sha256.to_string(),
            });
        }
        let target = self.binary_dir(binary);
        if self.is_installed(&target, sha256, None)? {
            tracing::debug!(binary = %binary, "agent binary already installed");
            return Ok(target.join(EXECUTABLE));
        }
        let staging = self.staging_dir(binary)?;
        unpack_tgz(tarball, staging.path(), &UnpackLimits::default())?;
        check_executable(&staging.path().join(EXECUTABLE))?;
        write_new_file(
            &staging.path().join(DOWNLOADED_TOOLS),
            &tools.to_json(),
            PRIVATE_FILE_MODE,
        )?;
        sync_directory(staging.path())?;
        self.place(binary, staging, sha256, None)
    }

    /// Installs the executable `exe` as `tools/<binary>/lockstepd`; returns its path. Its
    /// sha256 and size go into `downloaded-tools.txt` with the url `file://<exe>`. With
    /// `force_version`, a `FORCE-VERSION` file makes the binary report `binary`'s version
    /// whatever it was built as (Juju's mechanism). Same temporary-directory discipline and
    /// idempotence as [`DataDir::install_tarball`]. For a binary already installed (what
    /// `enable-ha` copies); an operator's own build goes through
    /// [`DataDir::install_identified_binary`].
    pub fn install_local_binary(
        &self,
        binary: &Binary,
        exe: &Path,
        force_version: bool,
    ) -> Result<PathBuf, DataDirError> {
        self.install_executable(binary, exe, force_version.then_some(binary.number), None)
    }

    /// Installs a local binary as its identity says (the operator's own build,
    /// `--build-agent`): as `tools/<identity.binary>/lockstepd`, with `FORCE-VERSION` when
    /// one was beside it, and `downloaded-tools.txt` recording the identity, size and
    /// sha256. The copy must hash as the identity was read, else it is refused naming the
    /// file (it changed in between) and nothing is installed.
    pub fn install_identified_binary(
        &self,
        identity: &BinaryIdentity,
    ) -> Result<PathBuf, DataDirError> {
        self.install_executable(
            &identity.binary,
            &identity.path,
            identity.forced_version,
            Some((identity.sha256, identity.size_bytes)),
        )
    }

    fn install_executable(
        &self,
        binary: &Binary,
        exe: &Path,
        forced_version: Option<Version>,
        expected: Option<(Sha256, u64)>,
    ) -> Result<PathBuf, DataDirError> {
        check_binary(binary)?;
        let metadata = fs::metadata(exe).map_err(DataDirError::io(exe, "read the metadata of"))?;
        if !metadata.is_file() {
            return Err(DataDirError::NotInstalled {
                path: exe.to_path_buf(),
                detail: "not a regular file".into(),
            });
        }
        let staging = self.staging_dir(binary)?;
        let staged = staging.path().join(EXECUTABLE);
        let (sha256, size_bytes) = copy_hashed(exe, &staged, LOCAL_BINARY_BYTES_MAX)?;
        if let Some((expected_sha256, expected_size_bytes)) = expected
            && (sha256, size_bytes) != (expected_sha256, expected_size_bytes)
        {
            return Err(DataDirError::Mismatch {
                path: exe.to_path_buf(),
                what: "the sha256 and size of the copy (the file changed since it was read)",
                expected: format!("{expected_sha256} ({expected_size_bytes} bytes)"),
                actual: format!("{sha256} ({size_bytes} bytes)"),
            });
        }
        let forced = Some(forced_version);
        let target = self.binary_dir(binary);
        if self.is_installed(&target, sha256, forced)? {
            tracing::debug!(binary = %binary, "local agent binary already installed");
            return Ok(target.join(EXECUTABLE));
        }
        if let Some(version) = forced_version {
            write_new_file(
                &staging.path().join(FORCE_VERSION),
                format!("{version}\n").as_bytes(),
                PRIVATE_FILE_MODE,
            )?;
        }
        let absolute = fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        let tools = DownloadedTools {
            version: binary.clone(),
            url: format!("file://{}", absolute.display()),
            sha256,
            size_bytes,
            download_rate: None,
        };
        write_new_file(
            &staging.path().join(DOWNLOADED_TOOLS),
            &tools.to_json(),
            PRIVATE_FILE_MODE,
        )?;
        sync_directory(staging.path())?;
        self.place(binary, staging, sha256, forced)
    }

    /// Removes what an interrupted install or switch left in `tools/` (temporary
    /// directories and symlinks). Call it at start, before anything installs; returns how
    /// many entries were removed.
    pub fn remove_stale_temporaries(&self) -> Result<usize, DataDirError> {
        let tools = self.tools_dir();
        let entries = match fs::read_dir(&tools) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(error) => return Err(DataDirError::io(&tools, "list")(error)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(DataDirError::io(&tools, "list"))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let stale = [STAGING_PREFIX, REPLACED_PREFIX, SWITCH_PREFIX]
                .iter()
                .any(|prefix| name.starts_with(prefix));
            if !stale {
                continue;
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            let result = if is_dir {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            result.map_err(DataDirError::io(&path, "remove"))?;
            removed += 1;
        }
        if removed > 0 {
            sync_directory(&tools)?;
        }
        Ok(removed)
    }

    /// True when `target` holds an executable whose provenance records `sha256` (and, when
    /// `forced` is given, exactly that `FORCE-VERSION`).
    fn is_installed(
        &self,
        target: &Path,
        sha256: Sha256,
        forced: Option<Option<Version>>,
    ) -> Result<bool, DataDirError> {
        match fs::symlink_metadata(target) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(DataDirError::io(target, "inspect")(error)),
        }
        // A directory whose metadata is unreadable or malformed is broken: replace it.
        let recorded = match DownloadedTools::read(target) {
            Ok(Some(recorded)) => recorded,
            Ok(None) | Err(_) => return Ok(false),
        };
        if recorded.sha256 != sha256 || check_executable(&target.join(EXECUTABLE)).is_err() {
            return Ok(false);
        }
        match forced {
            None => Ok(true),
            Some(expected) => Ok(read_force_version(target).ok() == Some(expected)),
        }
    }

    /// A fresh temporary directory in `tools/`, removed when dropped.
    fn staging_dir(&self, binary: &Binary) -> Result<tempfile::TempDir, DataDirError> {
        let tools = self.tools_dir();
        fs::create_dir_all(&tools).map_err(DataDirError::io(&tools, "create"))?;
        tempfile::Builder::new()
            .prefix(&format!("{STAGING_PREFIX}{binary}-"))
            .permissions(fs::Permissions::from_mode(EXECUTABLE_MODE))
            .tempdir_in(&tools)
            .map_err(DataDirError::io(&tools, "create a temporary directory in"))
    }

    /// Renames the complete `staging` directory to `tools/<binary>`, replacing whatever is
    /// there atomically, and fsyncs `tools/`.
    fn place(
        &self,
        binary: &Binary,
        staging: tempfile::TempDir,
        sha256: Sha256,
        forced: Option<Option<Version>>,
    ) -> Result<PathBuf, DataDirError> {
        let tools = self.tools_dir();
        let target = self.binary_dir(binary);
        match fs::rename(staging.path(), &target) {
            Ok(()) => {
                // The staging path no longer exists; nothing to clean up.
                let _ = staging.keep();
            }
            Err(error) if is_occupied(&error) => {
                // Someone installed it meanwhile (a concurrent agent): keep theirs if it is
                // the same binary; otherwise replace it.
                if self.is_installed(&target, sha256, forced)? {
                    return Ok(target.join(EXECUTABLE));
                }
                replace_directory(&tools, staging, &target)?;
            }
            Err(error) => {
                return Err(DataDirError::io(&target, "rename the new binary into")(
                    error,
                ));
            }
        }
        sync_directory(&tools)?;
        tracing::info!(binary = %binary, dir = %target.display(), "agent binary installed");
        Ok(target.join(EXECUTABLE))
    }
}

/// True when a rename failed because the destination is a non-empty directory or exists.
fn is_occupied(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::AlreadyExists
            | io::ErrorKind::DirectoryNotEmpty
            | io::ErrorKind::IsADirectory
    ) || error.kind() == io::ErrorKind::NotADirectory
}

/// Puts `staging` at `target`, where something already is. On Linux the two are exchanged
/// in one `renameat2(RENAME_EXCHANGE)`, so `target` always exists; elsewhere (or when the
/// file system cannot exchange) the old one is renamed aside first. The old one is removed.
fn replace_directory(
    tools: &Path,
    staging: tempfile::TempDir,
    target: &Path,
) -> Result<(), DataDirError> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let exchanged = rustix::fs::renameat_with(
            rustix::fs::CWD,
            staging.path(),
            rustix::fs::CWD,
            target,
            rustix::fs::RenameFlags::EXCHANGE,
        );
        match exchanged {
            Ok(()) => {
                // `staging` now holds the old directory: fsync the exchange, then drop it.
                sync_directory(tools)?;
                let old = staging.path().to_path_buf();
                if let Err(error) = staging.close() {
                    tracing::warn!(path = %old.display(), %error,
                        "cannot remove a replaced agent binary");
                }
                return Ok(());
            }
            Err(error)
                if error == rustix::io::Errno::INVAL || error == rustix::io::Errno::NOSYS =>
            {
                // The file system cannot exchange: fall back to renaming aside.
            }
            Err(error) => {
                return Err(DataDirError::io(target, "exchange the new binary with")(
                    io::Error::from(error),
                ));
            }
        }
    }
    let aside = tools.join(format!(
        "{REPLACED_PREFIX}{}-{:016x}",
        target
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        random_u64()
    ));
    fs::rename(target, &aside).map_err(DataDirError::io(target, "rename aside"))?;
    if let Err(error) = fs::rename(staging.path(), target) {
        // Put the old one back rather than leave no binary at all.
        let _ = fs::rename(&aside, target);
        return Err(DataDirError::io(target, "rename the new binary into")(
            error,
        ));
    }
    let _ = staging.keep();
    sync_directory(tools)?;
    if let Err(error) = fs::remove_dir_all(&aside) {
        tracing::warn!(path = %aside.display(), %error, "cannot remove a replaced agent binary");
    }
    Ok(())
}

fn check_executable(path: &Path) -> Result<(), DataDirError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(DataDirError::NotInstalled {
                path: path.to_path_buf(),
                detail: "no such file".into(),
            });
        }
        Err(error) => return Err(DataDirError::io(path, "inspect")(error)),
    };
    if !metadata.is_file() {
        return Err(DataDirError::NotInstalled {
            path: path.to_path_buf(),
            detail: "not a regular file".into(),
        });
    }
    if metadata.permissions().mode() & 0o111 == 0 {
        return Err(DataDirError::NotInstalled {
            path: path.to_path_buf(),
            detail: format!(
                "not executable (mode {:#o})",
                metadata.permissions().mode() & 0o7777
            ),
        });
    }
    Ok(())
}
