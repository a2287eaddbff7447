//! When a supervisor starts a worker again after it ended without asking to (a crash, a
//! watchdog kill, an exit with an error): the agent's launcher waits this long, and the
//! simulator's crash fault restarts its processes after the same wait, so that what the
//! simulator measures is what the launcher does. Pure: the count and the run time arrive
//! as arguments.

use crate::time::Millis;

/// The first wait, after one failure.
pub const RESTART_DELAY_FIRST: Millis = Millis(500);
/// No wait is longer than this.
pub const RESTART_DELAY_MAX: Millis = Millis(30_000);
/// A worker that ran at least this long before it ended is restarted after the first
/// wait, whatever ended before it.
pub const RESTART_RAN_LONG: Millis = Millis(60_000);

/// The wait before the next start after `failures` consecutive failures (counted from 1,
/// and set back to 0 by the supervisor once a worker reports Ready), the last of which ran
/// for `ran`: [`RESTART_DELAY_FIRST`] doubling up to [`RESTART_DELAY_MAX`]; a worker that
/// ran for [`RESTART_RAN_LONG`] or more waits the first delay again.
pub fn restart_delay(failures: u32, ran: Millis) -> Millis {
    if ran.0 > RESTART_RAN_LONG.0 {
        return RESTART_DELAY_FIRST;
    }
    let exponent = failures.saturating_sub(1).min(6);
    Millis((RESTART_DELAY_FIRST.0 << exponent).min(RESTART_DELAY_MAX.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_to_a_cap_and_resets_after_a_long_run() {
        assert_eq!(restart_delay(1, Millis(0)), Millis(500));
        assert_eq!(restart_delay(2, Millis(0)), Millis(1_000));
        assert_eq!(restart_delay(6, Millis(0)), Millis(16_000));
        assert_eq!(restart_delay(7, Millis(0)), Millis(30_000));
        assert_eq!(restart_delay(20, Millis(0)), Millis(30_000));
        assert_eq!(restart_delay(20, Millis(120_000)), Millis(500));
    }
}
