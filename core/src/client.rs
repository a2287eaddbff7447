//! What an API client decides, as pure logic: when to retry a call and how long to wait,
//! when to reconnect and log in again, where a watcher resumes and which changes it has
//! already delivered, and which `operation-id` a mutating call carries.
//!
//! The seeds ask this of every Juju client (retry `upgrade in progress`, reconnect after a
//! disconnect, resume watchers), and neither Python client does all of it. lockstep's tokio
//! client drives this module; the simulator drives the very same code, so what it checks is
//! what the client does. Like the rest of the crate it reads no clock and draws no random
//! number: time and jitter arrive as arguments.

use std::fmt;

use crate::lifecycle::Revision;
use crate::phase::Phase;
use crate::time::{Millis, Timestamp};

/// How a client retries, with the bounds that make every wait finite.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RetryPolicy {
    /// The first wait.
    pub initial: Millis,
    /// No wait is longer than this (before the server's retry-after, which wins when larger).
    pub maximum: Millis,
    /// Attempts at one call, the first included.
    pub attempts_max: u32,
}

impl Default for RetryPolicy {
    /// Juju's bootstrap waits up to 60 attempts 3 s apart; python-jujuclient retries 61
    /// times 1 s apart. This starts faster and backs off to the same pace.
    fn default() -> RetryPolicy {
        RetryPolicy {
            initial: Millis(100),
            maximum: Millis(3_000),
            attempts_max: 1_000,
        }
    }
}

/// How one attempt at a call ended, as the client saw it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Attempt {
    /// Answered (with a result, or with an error that retrying cannot fix).
    Answered,
    /// Refused with `upgrade in progress`; the detail from `error-info` when present.
    UpgradeInProgress {
        /// The phase the refusal named, when `error-info` carried one.
        phase: Option<Phase>,
        /// The wait the refusal asked for, when `error-info` carried one.
        retry_after: Option<Millis>,
    },
    /// The connection failed or closed before an answer (agent restarting, network).
    Disconnected,
}

/// What to do next.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Decision {
    /// The call is over: hand its answer to the caller.
    Finish,
    /// Send the same call again after `wait`.
    Retry {
        /// How long to wait before sending it again.
        wait: Millis,
    },
    /// Reconnect, log in again, then send the same call (with the same `operation-id`)
    /// after `wait`.
    Reconnect {
        /// How long to wait before reconnecting.
        wait: Millis,
    },
    /// Stop: the caller's deadline or the attempt bound would be passed.
    GiveUp(GiveUp),
}

/// Why a call was given up, naming what it was waiting for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GiveUp {
    /// The phase the agent was last seen in, when it said.
    pub phase: Option<Phase>,
    /// Whether the last attempt was a disconnect rather than a refusal.
    pub disconnected: bool,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Time waited between attempts in all.
    pub waited: Millis,
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.phase, self.disconnected) {
            (_, true) => write!(f, "the controller could not be reached"),
            (Some(phase), false) => write!(
                f,
                "the controller was still in phase {phase} (upgrade in progress)"
            ),
            (None, false) => write!(
                f,
                "the controller was still upgrading (upgrade in progress)"
            ),
        }?;
        write!(
            f,
            " after {} attempts over {}; wait longer with a larger deadline, or see `lockstep status`",
            self.attempts, self.waited
        )
    }
}

impl std::error::Error for GiveUp {}

/// One call's retry state, from its first attempt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Call {
    started: Timestamp,
    deadline: Timestamp,
    attempts: u32,
    phase: Option<Phase>,
}

impl Call {
    /// A call first sent at `now`, which the caller will wait for until `deadline`.
    pub fn new(now: Timestamp, deadline: Timestamp) -> Call {
        Call {
            started: now,
            deadline,
            attempts: 0,
            phase: None,
        }
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Decides after an attempt ended at `now`. `jitter` is a random draw in `0..=1000`
    /// supplied by the caller: each wait is between half and all of the exponential
    /// backoff ("equal jitter"), so clients that were refused together do not return
    /// together. The server's retry-after is a floor. A wait that would end past the
    /// deadline gives up instead.
    pub fn decide(
        &mut self,
        policy: &RetryPolicy,
        now: Timestamp,
        attempt: Attempt,
        jitter: u16,
    ) -> Decision {
        self.attempts += 1;
        let (retry_after, disconnected) = match attempt {
            Attempt::Answered => return Decision::Finish,
            Attempt::UpgradeInProgress { phase, retry_after } => {
                self.phase = phase.or(self.phase);
                (retry_after, false)
            }
            Attempt::Disconnected => (None, true),
        };
        let backoff = backoff(policy, self.attempts, jitter);
        let wait = retry_after.map_or(backoff, |floor| backoff.max(floor));
        if self.attempts >= policy.attempts_max || now + wait > self.deadline {
            return Decision::GiveUp(GiveUp {
                phase: self.phase,
                disconnected,
                attempts: self.attempts,
                waited: now - self.started,
            });
        }
        if disconnected {
            Decision::Reconnect { wait }
        } else {
            Decision::Retry { wait }
        }
    }
}

/// The `attempt`-th wait (1-based): `initial × 2^(attempt-1)`, capped, then jittered into
/// its upper half.
fn backoff(policy: &RetryPolicy, attempt: u32, jitter: u16) -> Millis {
    let exponent = attempt.saturating_sub(1).min(32);
    let full = policy
        .initial
        .0
        .saturating_mul(1u64 << exponent)
        .min(policy.maximum.0);
    let jitter = u64::from(jitter.min(1000));
    Millis(full / 2 + full * jitter / 2000)
}

/// Which of a client's controller addresses the next connect tries: the first (the address
/// the client was given), then each fallback (the other controllers of a highly available
/// model) in turn, round and round.
///
/// The client moves on only when a connect fails: refused, reset, a TLS or websocket
/// failure, or no answer within [`Failover::CONNECT_TIMEOUT`] (the driver abandons a
/// connect at that bound and reports [`Connect::TimedOut`]). A connect that opened stays:
/// a client keeps talking to a controller that answers, and a disconnect after a working
/// connection reconnects to the same controller first (it is most likely restarting).
/// With one address there is nowhere else to go.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Failover {
    addresses: usize,
    current: usize,
}

/// How a connect to the address [`Failover::address`] named ended.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Connect {
    /// Connected (TCP, TLS and websocket) within the connect timeout.
    Opened,
    /// Refused, reset, or a TLS or websocket failure.
    Failed,
    /// No answer within [`Failover::CONNECT_TIMEOUT`]: abandoned.
    TimedOut,
}

impl Failover {
    /// How long one connect (TCP, TLS, websocket) may take before it counts as failed and,
    /// with fallback addresses, the next controller is tried. A call's own deadline still
    /// bounds the whole retry loop.
    pub const CONNECT_TIMEOUT: Millis = Millis(10_000);

    /// Failover among `addresses` addresses (at least one: the client's own).
    pub fn new(addresses: usize) -> Failover {
        assert!(addresses >= 1, "a client connects to at least one address");
        Failover {
            addresses,
            current: 0,
        }
    }

    /// The index of the address the next connect tries: 0 for the client's own, `n` for
    /// its `n`-th fallback.
    pub fn address(&self) -> usize {
        self.current
    }

    /// Records how the connect to [`Failover::address`] ended; returns the address the next
    /// connect tries.
    pub fn connect_ended(&mut self, connect: Connect) -> usize {
        match connect {
            Connect::Opened => {}
            Connect::Failed | Connect::TimedOut => {
                self.current = (self.current + 1) % self.addresses;
            }
        }
        assert!(self.current < self.addresses);
        self.current
    }
}

/// Where a watcher stands in the event log, so that after a reconnect it resumes there and
/// delivers every change exactly once, in order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct WatchPosition {
    delivered: Option<Revision>,
}

impl WatchPosition {
    /// A watcher that has delivered nothing: its first `Next` brings the whole state.
    pub fn new() -> WatchPosition {
        WatchPosition { delivered: None }
    }

    /// The revision to resume after (`Client.WatchAll {"after-revision": R}`), or `None`
    /// for a fresh watcher.
    pub fn resume_after(&self) -> Option<Revision> {
        self.delivered
    }

    /// True if a change at `revision` has not been delivered yet: deliver it, and it is
    /// recorded. Replays after a reconnect (revisions at or below the last delivered) are
    /// refused, so nothing is delivered twice.
    pub fn accept(&mut self, revision: Revision) -> bool {
        if self
            .delivered
            .is_some_and(|delivered| revision <= delivered)
        {
            return false;
        }
        self.delivered = Some(revision);
        true
    }

    /// Records that everything up to `revision` is known (a `Next` whose deltas were all
    /// filtered, or the whole-state snapshot at that revision).
    pub fn reached(&mut self, revision: Revision) {
        if self.delivered.is_none_or(|delivered| revision > delivered) {
            self.delivered = Some(revision);
        }
    }

    /// The server compacted past our position: a new watcher sends the whole state again.
    pub fn resync(&mut self) {
        self.delivered = None;
    }
}

/// `operation-id`s for mutating calls: one per call, kept across its retries and
/// reconnects, so the store applies it exactly once.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct OperationIds {
    client: String,
    next: u64,
}

impl OperationIds {
    /// Ids for a client whose unique name is `client` (e.g. a random 128-bit value in hex,
    /// drawn by the caller once per client).
    pub fn new(client: impl Into<String>) -> OperationIds {
        OperationIds {
            client: client.into(),
            next: 1,
        }
    }

    /// The id of the next new call; a retry of a call reuses the id it was given.
    pub fn next_id(&mut self) -> String {
        let id = format!("{}-{}", self.client, self.next);
        self.next += 1;
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Millis(100),
            maximum: Millis(1_000),
            attempts_max: 50,
        }
    }

    const REFUSED: Attempt = Attempt::UpgradeInProgress {
        phase: Some(Phase::RunningSteps),
        retry_after: None,
    };

    #[test]
    fn backoff_doubles_to_its_cap_within_its_jitter_band() {
        let mut call = Call::new(Timestamp(0), Timestamp(1_000_000));
        let mut expected_full = [100, 200, 400, 800, 1000, 1000].into_iter();
        for jitter in [0, 1000, 500, 0, 1000, 250] {
            let full = expected_full.next().unwrap();
            let Decision::Retry { wait } = call.decide(&policy(), Timestamp(0), REFUSED, jitter)
            else {
                panic!("expected a retry")
            };
            let expected = full / 2 + full * u64::from(jitter) / 2000;
            assert_eq!(
                wait,
                Millis(expected),
                "attempt {} jitter {jitter}",
                call.attempts()
            );
            assert!(wait.0 >= full / 2 && wait.0 <= full);
        }
    }

    #[test]
    fn the_servers_retry_after_is_a_floor() {
        let mut call = Call::new(Timestamp(0), Timestamp(60_000));
        let refused = Attempt::UpgradeInProgress {
            phase: Some(Phase::Upgrading),
            retry_after: Some(Millis(2_000)),
        };
        assert_eq!(
            call.decide(&policy(), Timestamp(0), refused, 0),
            Decision::Retry {
                wait: Millis(2_000)
            }
        );
    }

    #[test]
    fn a_deadline_gives_up_naming_the_phase_it_was_stuck_in() {
        let mut call = Call::new(Timestamp(0), Timestamp(1_000));
        let mut now = Timestamp(0);
        let give_up = loop {
            match call.decide(&policy(), now, REFUSED, 1000) {
                Decision::Retry { wait } => now = now + wait,
                Decision::GiveUp(give_up) => break give_up,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(give_up.phase, Some(Phase::RunningSteps));
        assert!(now.as_millis() <= 1_000, "never waited past the deadline");
        let message = give_up.to_string();
        assert!(
            message.contains("still in phase running-steps"),
            "{message}"
        );
        assert!(
            message.contains(&format!("after {} attempts", give_up.attempts)),
            "{message}"
        );
    }

    #[test]
    fn disconnects_reconnect_and_answers_finish() {
        let mut call = Call::new(Timestamp(0), Timestamp(60_000));
        assert!(matches!(
            call.decide(&policy(), Timestamp(0), Attempt::Disconnected, 0),
            Decision::Reconnect { .. }
        ));
        assert_eq!(
            call.decide(&policy(), Timestamp(10), Attempt::Answered, 0),
            Decision::Finish
        );
        let mut bounded = Call::new(Timestamp(0), Timestamp(u64::MAX));
        let policy = RetryPolicy {
            attempts_max: 3,
            ..policy()
        };
        assert!(matches!(
            bounded.decide(&policy, Timestamp(0), Attempt::Disconnected, 0),
            Decision::Reconnect { .. }
        ));
        assert!(matches!(
            bounded.decide(&policy, Timestamp(0), Attempt::Disconnected, 0),
            Decision::Reconnect { .. }
        ));
        let Decision::GiveUp(give_up) =
            bounded.decide(&policy, Timestamp(0), Attempt::Disconnected, 0)
        else {
            panic!("the attempt bound holds")
        };
        assert!(give_up.disconnected && give_up.to_string().contains("could not be reached"));
    }

    #[test]
    fn failover_moves_on_only_when_a_connect_fails() {
        let mut failover = Failover::new(3);
        assert_eq!(failover.address(), 0, "the client's own address first");
        assert_eq!(
            failover.connect_ended(Connect::Opened),
            0,
            "stays while it answers"
        );
        assert_eq!(failover.connect_ended(Connect::Failed), 1);
        assert_eq!(failover.connect_ended(Connect::TimedOut), 2);
        assert_eq!(failover.connect_ended(Connect::Opened), 2);
        assert_eq!(
            failover.connect_ended(Connect::Failed),
            0,
            "round and round"
        );
        let mut alone = Failover::new(1);
        assert_eq!(
            alone.connect_ended(Connect::TimedOut),
            0,
            "nowhere else to go"
        );
        assert_eq!(Failover::CONNECT_TIMEOUT, Millis(10_000));
    }

    #[test]
    fn a_resumed_watcher_delivers_each_change_once_in_order() {
        let mut position = WatchPosition::new();
        assert_eq!(position.resume_after(), None);
        position.reached(Revision(10)); // the whole-state snapshot at revision 10
        let first: Vec<bool> = [11, 12, 14].map(|r| position.accept(Revision(r))).to_vec();
        assert_eq!(first, [true, true, true]);
        // Reconnect: resume after 14; a server that replays 12..15 delivers only 15.
        assert_eq!(position.resume_after(), Some(Revision(14)));
        let replay: Vec<bool> = [12, 14, 15].map(|r| position.accept(Revision(r))).to_vec();
        assert_eq!(replay, [false, false, true]);
        position.reached(Revision(13)); // never moves back
        assert_eq!(position.resume_after(), Some(Revision(15)));
        position.resync();
        assert_eq!(position.resume_after(), None);
    }

    #[test]
    fn operation_ids_are_unique_per_call_and_stable_per_client() {
        let mut ids = OperationIds::new("c0ffee");
        assert_eq!(ids.next_id(), "c0ffee-1");
        assert_eq!(ids.next_id(), "c0ffee-2");
    }

    proptest::proptest! {
        /// Whatever happens, every wait is finite, never runs past the deadline, and the
        /// call ends within the attempt bound.
        #[test]
        fn every_call_ends_within_its_bounds(
            outcomes in proptest::collection::vec(0u8..3, 1..200),
            jitters in proptest::collection::vec(0u16..=1000, 200),
            deadline in 0u64..100_000,
        ) {
            let policy = policy();
            let mut call = Call::new(Timestamp(0), Timestamp(deadline));
            let mut now = Timestamp(0);
            for (index, outcome) in outcomes.iter().enumerate() {
                let attempt = match outcome {
                    0 => Attempt::Answered,
                    1 => REFUSED,
                    _ => Attempt::Disconnected,
                };
                match call.decide(&policy, now, attempt, jitters[index]) {
                    Decision::Finish | Decision::GiveUp(_) => return Ok(()),
                    Decision::Retry { wait } | Decision::Reconnect { wait } => {
                        proptest::prop_assert!(wait <= policy.maximum);
                        now = now + wait;
                        proptest::prop_assert!(now.as_millis() <= deadline);
                    }
                }
                proptest::prop_assert!(call.attempts() < policy.attempts_max);
            }
        }
    }
}
