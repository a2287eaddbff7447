//! The daemon's limit on open files.
//!
//! Behind the front door every client connection holds three descriptors in the launcher
//! (its socket and one end of each of its two relay pipes) and two in the worker, and the
//! API admits `--max-connections` (4096 by default) of them. A service manager usually
//! starts a daemon with a low soft limit (systemd's default is 1024) under a high hard one
//! (524288), expecting a daemon that needs more to raise its own, as Go's runtime does for
//! `jujud` since Go 1.19. So `lockstepd` raises its soft limit to its hard limit at start;
//! the worker, started by the launcher, inherits it.

/// The soft limit on open files before and after [`raise_open_files_limit`] (`None`:
/// unlimited).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OpenFiles {
    pub before: Option<u64>,
    pub after: Option<u64>,
}

/// Raises this process's soft limit on open files to its hard limit. An error names what
/// the system refused; the process goes on with the limit it had.
pub fn raise_open_files_limit() -> Result<OpenFiles, std::io::Error> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    Ok(OpenFiles {
        before: limit.current,
        after: getrlimit(Resource::Nofile).current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        // A soft limit under the hard one first (one less: harmless to the tests beside).
        let hard = getrlimit(Resource::Nofile).maximum;
        let lowered = hard.map_or(1 << 20, |hard| hard - 1);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(lowered),
                maximum: hard,
            },
        )
        .unwrap();
        let raised = raise_open_files_limit().unwrap();
        assert_eq!(raised.before, Some(lowered));
        assert_eq!(raised.after, hard);
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
        // Again: nothing left to raise.
        assert_eq!(
            raise_open_files_limit().unwrap(),
            OpenFiles {
                before: limit.maximum,
                after: limit.maximum
            }
        );
    }
}
