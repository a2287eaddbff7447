//! Failpoints for tests (as FoundationDB's buggify or TiKV's fail-rs): environment
//! variables that make `lockstepd` misbehave on purpose, so that the end-to-end and HA
//! tests can reach states no honest input reaches on demand.
//!
//! Compiled only with the crate feature `failpoints`, which release builds and
//! `cargo install` never enable: the crate's tests and benches turn it on through their
//! dev-dependency on the crate itself. `.ci/run` checks that a default release `lockstepd`
//! holds no `LOCKSTEPD_FAILPOINT_` name.

use std::time::Duration;

/// When this variable is set, every host step fails. It lets the end-to-end tests make a
/// new binary that has run its database steps fail before Ready.
pub const FAIL_HOST_STEPS: &str = "LOCKSTEPD_FAILPOINT_HOST_STEPS";

/// When this variable holds a version (`2.9.45`), every host step of a *machine agent*
/// (never a controller's) running that version fails: the rollout tests' bad binary, which
/// its controllers run fine and the canary cannot.
pub const FAIL_MACHINE_HOST_STEPS: &str = "LOCKSTEPD_FAILPOINT_MACHINE_HOST_STEPS";

/// Whether [`FAIL_MACHINE_HOST_STEPS`] names `running`.
pub fn machine_host_steps_fail(running: lockstep_core::Version) -> bool {
    std::env::var(FAIL_MACHINE_HOST_STEPS)
        .ok()
        .and_then(|text| lockstep_core::Version::parse(text.trim()).ok())
        == Some(running)
}

/// When this variable holds a version and a number of milliseconds (`2.9.45:8000`), every
/// host step of a *machine agent* running that version pauses that long before it runs:
/// a canary whose steps take time, as real ones do, while the agents after it fetch the
/// binary ahead.
pub const PAUSE_MACHINE_HOST_STEP: &str = "LOCKSTEPD_FAILPOINT_MACHINE_HOST_STEP_PAUSE";

/// The pause [`PAUSE_MACHINE_HOST_STEP`] asks of a machine agent running `running`, if any.
pub fn machine_host_step_pause(running: lockstep_core::Version) -> Option<Duration> {
    let text = std::env::var(PAUSE_MACHINE_HOST_STEP).ok()?;
    let (version, milliseconds) = text.trim().split_once(':')?;
    (lockstep_core::Version::parse(version).ok()? == running)
        .then(|| milliseconds.parse::<u64>().ok().map(Duration::from_millis))
        .flatten()
}

/// When this variable holds a number of milliseconds, the `record-agent-binaries` database
/// step pauses that long inside its transaction, before its changes and checkpoint commit,
/// so that a test can kill or cut off the coordinator while a database step is under way.
pub const PAUSE_DATABASE_STEP_MS: &str = "LOCKSTEPD_FAILPOINT_DB_STEP_PAUSE_MS";

/// When this variable holds a number of milliseconds, every write of the lifecycle's
/// snapshot to `agent.conf` pauses that long before it writes: a test can then see what
/// the agent shows while that write is under way.
pub const PAUSE_PERSIST_MS: &str = "LOCKSTEPD_FAILPOINT_PERSIST_PAUSE_MS";

/// The pause [`PAUSE_PERSIST_MS`] asks for, if any.
pub fn persist_pause() -> Option<Duration> {
    std::env::var(PAUSE_PERSIST_MS)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// When this variable is set, the launcher forwards none of its worker's notifications to
/// its own `NOTIFY_SOCKET` (as a launcher from before they were forwarded): `lockstep
/// bootstrap` then waits through the API.
pub const SILENT_LAUNCHER: &str = "LOCKSTEPD_FAILPOINT_SILENT_LAUNCHER";

/// Whether [`SILENT_LAUNCHER`] is set.
pub fn launcher_silent() -> bool {
    std::env::var_os(SILENT_LAUNCHER).is_some()
}

/// Whether [`FAIL_HOST_STEPS`] is set.
pub fn host_steps_fail() -> bool {
    std::env::var_os(FAIL_HOST_STEPS).is_some()
}

/// The pause [`PAUSE_DATABASE_STEP_MS`] asks for, if any.
pub fn database_step_pause() -> Option<Duration> {
    std::env::var(PAUSE_DATABASE_STEP_MS)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(Duration::from_millis)
}
