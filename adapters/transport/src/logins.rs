//! Password checks and failed logins.
//!
//! [`PasswordChecks`]: argon2 checks cost 19 MiB and milliseconds of CPU each, so they run
//! on a few threads of their own ([`ApiLimits::login_concurrency`]), never on tokio's
//! blocking pool, which the store and the lease keep-alive use. Waiting checks queue per
//! source address and are taken in turn across addresses: one address's flood delays
//! another's login by at most one check per address with checks waiting.
//!
//! [`Throttle`]: failed logins per source address and per user. After
//! [`ApiLimits::login_failures_before_throttle`] failures, the next login from that source
//! (or for that user, from a source that failed too) is refused without a check for
//! [`LOGIN_THROTTLE_FIRST`], doubling with each further failure up to
//! [`ApiLimits::login_throttle_max`]. A source that never failed is never throttled for a
//! user, so a flood against `admin` cannot lock the real admin out.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::limits::{ApiLimits, LOGIN_RECORDS_MAX, LOGIN_THROTTLE_FIRST};

/// Checks a password against an argon2 hash in PHC form.
pub fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// The login pool: a few threads checking passwords, fed fairly across source addresses.
#[derive(Debug)]
pub struct PasswordChecks {
    shared: Arc<Shared>,
    queued_per_source_max: usize,
}

#[derive(Debug)]
struct Shared {
    queues: Mutex<Queues>,
    work: Condvar,
}

#[derive(Debug, Default)]
struct Queues {
    by_source: HashMap<IpAddr, VecDeque<Check>>,
    /// Sources with checks waiting, in the order they get the next free thread.
    turns: VecDeque<IpAddr>,
    queued: usize,
    checking: usize,
    stopping: bool,
}

#[derive(Debug)]
struct Check {
    password: String,
    hash: String,
    verdict: oneshot::Sender<bool>,
}

/// `source`'s checks already wait [`ApiLimits::queued_logins_per_source_max`] deep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

impl PasswordChecks {
    /// Starts `limits.login_concurrency` threads (at least one); they stop when this is
    /// dropped.
    pub fn new(limits: &ApiLimits) -> PasswordChecks {
        PasswordChecks::start(limits, limits.login_concurrency.max(1))
    }

    fn start(limits: &ApiLimits, threads: usize) -> PasswordChecks {
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            work: Condvar::new(),
        });
        for index in 0..threads {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("lockstep-login-{index}"))
                .spawn(move || shared.serve())
                .expect("a login thread can be started");
        }
        PasswordChecks {
            shared,
            queued_per_source_max: limits.queued_logins_per_source_max,
        }
    }

    /// Whether `password` matches `hash`, checked in `source`'s turn.
    pub async fn verify(
        &self,
        source: IpAddr,
        password: &str,
        hash: &str,
    ) -> Result<bool, QueueFull> {
        let (verdict, answer) = oneshot::channel();
        {
            let mut queues = self.shared.queues.lock().expect("not poisoned");
            let queue = queues.by_source.entry(source).or_default();
            if queue.len() >= self.queued_per_source_max {
                if queue.is_empty() {
                    queues.by_source.remove(&source);
                }
                return Err(QueueFull);
            }
            let first = queue.is_empty();
            queue.push_back(Check {
                password: password.to_owned(),
                hash: hash.to_owned(),
                verdict,
            });
            if first {
                queues.turns.push_back(source);
            }
            queues.queued += 1;
        }
        self.shared.work.notify_one();
        // A thread that cannot answer (it panicked) answers no.
        Ok(answer.await.unwrap_or(false))
    }

    /// `(checking, queued)` now, for `/metrics`.
    pub fn in_progress(&self) -> (usize, usize) {
        let queues = self.shared.queues.lock().expect("not poisoned");
        (queues.checking, queues.queued)
    }
}

impl Drop for PasswordChecks {
    fn drop(&mut self) {
        self.shared.queues.lock().expect("not poisoned").stopping = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    fn serve(&self) {
        loop {
            let check = {
                let mut queues = self.queues.lock().expect("not poisoned");
                loop {
                    if queues.stopping {
                        return;
                    }
                    if let Some(check) = queues.next() {
                        break check;
                    }
                    queues = self.work.wait(queues).expect("not poisoned");
                }
            };
            // A client that went away no longer wants the answer: skip its hash.
            let matched =
                !check.verdict.is_closed() && verify_password(&check.password, &check.hash);
            self.queues.lock().expect("not poisoned").checking -= 1;
            let _ = check.verdict.send(matched);
        }
    }
}

impl Queues {
    /// The next check: the first of the source whose turn it is; that source goes to the
    /// back of the turns if it has more.
    fn next(&mut self) -> Option<Check> {
        let source = self.turns.pop_front()?;
        let queue = self.by_source.get_mut(&source)?;
        let check = queue.pop_front()?;
        if queue.is_empty() {
            self.by_source.remove(&source);
        } else {
            self.turns.push_back(source);
        }
        self.queued -= 1;
        self.checking += 1;
        Some(check)
    }
}

/// Failed logins by source address and by user.
#[derive(Debug)]
pub struct Throttle {
    failures_free: u32,
    wait_max: Duration,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    sources: BTreeMap<IpAddr, Record>,
    users: BTreeMap<String, Record>,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    last_failure: Instant,
    /// Refused without a check until then.
    until: Instant,
}

/// Longest tag a user record is kept under; longer ones are not users.
const TAG_SIZE_BYTES_MAX: usize = 256;

impl Throttle {
    pub fn new(limits: &ApiLimits) -> Throttle {
        Throttle {
            failures_free: limits.login_failures_before_throttle,
            wait_max: limits.login_throttle_max,
            records: Mutex::new(Records::default()),
        }
    }

    /// `Err(retry after)` when a login from `source` for `tag` must be refused without a
    /// check now.
    pub fn check(&self, source: IpAddr, tag: &str, now: Instant) -> Result<(), Duration> {
        let records = self.records.lock().expect("not poisoned");
        let source_record = records.sources.get(&source);
        let mut until = source_record.map(|record| record.until);
        // A user's throttle applies only to sources that failed too.
        if source_record.is_some_and(|record| record.failures > 0)
            && let Some(user) = records.users.get(tag)
        {
            until = until.max(Some(user.until));
        }
        match until {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// A login from `source` for `tag` failed.
    pub fn failed(&self, source: IpAddr, tag: &str, now: Instant) {
        let mut records = self.records.lock().expect("not poisoned");
        let (free, max) = (self.failures_free, self.wait_max);
        bump(&mut records.sources, source, now, free, max);
        if tag.len() <= TAG_SIZE_BYTES_MAX {
            bump(&mut records.users, tag.to_owned(), now, free, max);
        }
    }

    /// A login from `source` succeeded: its record is cleared.
    pub fn succeeded(&self, source: IpAddr) {
        self.records
            .lock()
            .expect("not poisoned")
            .sources
            .remove(&source);
    }
}

/// One more failure for `key`: past `free` failures, a wait of 1 s doubling per failure up
/// to `max`. Records quiet for `max` are forgotten first when the table is full, then the
/// least recently failed.
fn bump<K: Ord + Clone>(
    records: &mut BTreeMap<K, Record>,
    key: K,
    now: Instant,
    free: u32,
    max: Duration,
) {
    if !records.contains_key(&key) && records.len() >= LOGIN_RECORDS_MAX {
        records.retain(|_, record| now.saturating_duration_since(record.until) < max);
        if records.len() >= LOGIN_RECORDS_MAX
            && let Some(oldest) = records
                .iter()
                .min_by_key(|(_, record)| record.last_failure)
                .map(|(key, _)| key.clone())
        {
            records.remove(&oldest);
        }
    }
    let record = records.entry(key).or_insert(Record {
        failures: 0,
        last_failure: now,
        until: now,
    });
    // A record quiet for longer than the longest wait starts over.
    if now.saturating_duration_since(record.last_failure) > max.max(LOGIN_THROTTLE_FIRST) {
        record.failures = 0;
    }
    record.failures = record.failures.saturating_add(1);
    record.last_failure = now;
    if record.failures >= free {
        let doublings = (record.failures - free).min(31);
        let wait = LOGIN_THROTTLE_FIRST.saturating_mul(1 << doublings).min(max);
        record.until = now + wait;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn limits() -> ApiLimits {
        ApiLimits {
            login_failures_before_throttle: 3,
            login_throttle_max: Duration::from_secs(8),
            ..ApiLimits::default()
        }
    }

    #[test]
    fn failures_past_the_free_ones_wait_one_second_doubling_up_to_the_most() {
        let throttle = Throttle::new(&limits());
        let now = Instant::now();
        for _ in 0..2 {
            throttle.failed(source(2), "user-admin", now);
            assert_eq!(throttle.check(source(2), "user-admin", now), Ok(()));
        }
        let mut waits = Vec::new();
        for _ in 0..6 {
            throttle.failed(source(2), "user-admin", now);
            waits.push(throttle.check(source(2), "user-admin", now).unwrap_err());
        }
        let seconds: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(seconds, [1, 2, 4, 8, 8, 8]);
        assert_eq!(
            throttle.check(source(2), "user-admin", now + Duration::from_secs(9)),
            Ok(())
        );
    }

    #[test]
    fn a_source_that_never_failed_is_not_throttled_for_a_user_under_attack() {
        let throttle = Throttle::new(&limits());
        let now = Instant::now();
        for _ in 0..10 {
            throttle.failed(source(2), "user-admin", now);
        }
        assert!(throttle.check(source(2), "user-admin", now).is_err());
        assert_eq!(throttle.check(source(1), "user-admin", now), Ok(()));
        // One that failed once shares the user's wait.
        throttle.failed(source(3), "user-admin", now);
        assert!(throttle.check(source(3), "user-admin", now).is_err());
        assert_eq!(throttle.check(source(3), "user-other", now), Ok(()));
    }

    #[test]
    fn a_success_clears_the_source_s_record() {
        let throttle = Throttle::new(&limits());
        let now = Instant::now();
        for _ in 0..5 {
            throttle.failed(source(2), "user-x", now);
        }
        throttle.succeeded(source(2));
        assert_eq!(throttle.check(source(2), "user-y", now), Ok(()));
    }

    #[test]
    fn the_failure_table_stays_bounded() {
        let throttle = Throttle::new(&limits());
        let now = Instant::now();
        for index in 0..(LOGIN_RECORDS_MAX as u32 + 100) {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + index));
            throttle.failed(address, &format!("user-{index}"), now);
        }
        let records = throttle.records.lock().unwrap();
        assert!(records.sources.len() <= LOGIN_RECORDS_MAX);
        assert!(records.users.len() <= LOGIN_RECORDS_MAX);
    }

    #[test]
    fn waiting_checks_are_taken_in_turn_across_sources() {
        let mut queues = Queues::default();
        let push = |queues: &mut Queues, last: u8, password: &str| {
            let (verdict, _) = oneshot::channel();
            let queue = queues.by_source.entry(source(last)).or_default();
            if queue.is_empty() {
                queues.turns.push_back(source(last));
            }
            queue.push_back(Check {
                password: password.to_owned(),
                hash: String::new(),
                verdict,
            });
            queues.queued += 1;
        };
        for index in 0..5 {
            push(&mut queues, 2, &format!("flood-{index}"));
        }
        push(&mut queues, 1, "legit");
        let order: Vec<String> = std::iter::from_fn(|| queues.next())
            .map(|check| check.password)
            .collect();
        assert_eq!(order[..2], ["flood-0", "legit"]);
        assert_eq!(order.len(), 6);
    }

    #[test]
    fn a_source_with_a_full_queue_is_told_so_and_others_still_queue() {
        use futures_util::FutureExt;
        let limits = ApiLimits {
            queued_logins_per_source_max: 2,
            ..ApiLimits::default()
        };
        // No thread takes the checks, so they stay queued.
        let checks = PasswordChecks::start(&limits, 0);
        let mut waiting: Vec<_> = (0..2)
            .map(|_| Box::pin(checks.verify(source(2), "wrong", "hash")))
            .collect();
        for check in &mut waiting {
            assert_eq!(check.as_mut().now_or_never(), None);
        }
        assert_eq!(
            checks.verify(source(2), "wrong", "hash").now_or_never(),
            Some(Err(QueueFull))
        );
        let mut other = Box::pin(checks.verify(source(1), "right", "hash"));
        assert_eq!(other.as_mut().now_or_never(), None);
        assert_eq!(checks.in_progress(), (0, 3));
    }

    #[tokio::test]
    async fn checks_run_on_the_login_threads_and_answer_whether_the_password_matches() {
        let checks = PasswordChecks::new(&ApiLimits::default());
        let hash = crate::auth::hash_password("right");
        assert_eq!(checks.verify(source(1), "right", &hash).await, Ok(true));
        assert_eq!(checks.verify(source(1), "wrong", &hash).await, Ok(false));
        assert_eq!(checks.in_progress(), (0, 0));
    }
}
