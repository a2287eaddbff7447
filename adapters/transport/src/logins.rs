//! Password checks and failed logins.
//!
//! [`PasswordChecks`]: argon2 checks cost 19 MiB and milliseconds of CPU each, so they run
//! on a few threads of their own ([`ApiLimits::login_concurrency`]), never on tokio's
//! blocking pool, which the store and the lease keep-alive use. Waiting checks queue per
//! source address and are taken in turn across addresses: one address's flood delays
//! another's login by at most one check per address with checks waiting. A hash that must
//! be read from the shared state (a machine agent's) is read by the login thread, in the
//! check's turn ([`PasswordChecks::verify_looked_up`]): a flood of logins reads the state no
//! more often at once than the pool has threads.
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

/// Most argon2 memory, in 1 KiB blocks, a hash may ask a login thread for (64 MiB; the
/// hashes lockstep makes ask for 19 MiB). A hash asking for more never matches.
pub const ARGON2_BLOCKS_MAX: usize = 64 << 10;

/// A login thread's password checker. It keeps its argon2 memory from one check to the
/// next: allocating 19 MiB per check left glibc holding a heap of that size per thread
/// that ever checked (the worker grew by 19 MiB per login thread and stayed there, 255 MiB
/// on a controller that had done nothing but logins), while one buffer per thread bounds
/// the pool's memory at 19 MiB a thread, whatever the allocator does.
#[derive(Debug, Default)]
pub struct Verifier {
    memory: Vec<argon2::Block>,
}

impl Verifier {
    /// Whether `password` matches `hash`, an argon2 hash in PHC form; `false` for anything
    /// that is not one.
    pub fn verify(&mut self, password: &str, hash: &str) -> bool {
        use argon2::password_hash::{Error, Output, PasswordHash};
        let Ok(parsed) = PasswordHash::new(hash) else {
            return false;
        };
        let (Some(salt), Some(expected)) = (parsed.salt, parsed.hash) else {
            return false;
        };
        let (Ok(algorithm), Ok(params)) = (
            argon2::Algorithm::try_from(parsed.algorithm),
            argon2::Params::try_from(&parsed),
        ) else {
            return false;
        };
        let Ok(version) = parsed.version.map(argon2::Version::try_from).transpose() else {
            return false;
        };
        let blocks = params.block_count();
        if blocks > ARGON2_BLOCKS_MAX {
            tracing::warn!(target: "lockstep::api", blocks, "a password hash asks for more argon2 memory than a login thread has");
            return false;
        }
        if self.memory.len() < blocks {
            self.memory.resize(blocks, argon2::Block::default());
        }
        let mut salt_bytes = [0_u8; 64];
        let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
            return false;
        };
        let argon2 = argon2::Argon2::new(algorithm, version.unwrap_or_default(), params);
        let memory = &mut self.memory[..blocks];
        Output::init_with(expected.len(), |out| {
            argon2
                .hash_password_into_with_memory(password.as_bytes(), salt, out, &mut *memory)
                .map_err(|_| Error::Password)
        })
        // `Output`'s equality takes the same time wherever the outputs differ.
        .is_ok_and(|computed| computed == expected)
    }
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
    hash: Hash,
    verdict: oneshot::Sender<Checked>,
}

/// Where a check's hash comes from.
enum Hash {
    /// Known when the check was queued (users: the API's configuration).
    Known(String),
    /// Read by the login thread in the check's turn (agents: the shared state). `Ok(None)`:
    /// no such credential, and the password is checked against `unknown` instead, so that
    /// the time taken does not tell; `Err(())`: the state could not be read (likewise).
    Lookup {
        read: HashLookup,
        unknown: &'static str,
    },
}

/// Reads a hash for [`PasswordChecks::verify_looked_up`], on a login thread.
pub type HashLookup = Box<dyn FnOnce() -> Result<Option<String>, ()> + Send>;

impl std::fmt::Debug for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hash::Known(_) => f.write_str("Known(..)"),
            Hash::Lookup { .. } => f.write_str("Lookup(..)"),
        }
    }
}

/// What a check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// A credential was found and the password matches it.
    pub matched: bool,
    /// The credential could not be read (the state was unavailable): the login failed for
    /// the controller's reason, not the client's.
    pub unavailable: bool,
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
        self.check(source, password, Hash::Known(hash.to_owned()))
            .await
            .map(|checked| checked.matched)
    }

    /// Whether `password` matches the hash `read` finds, read and checked by a login thread
    /// in `source`'s turn; when `read` finds none (or fails), `password` is checked against
    /// `unknown`, which never matches, so that the time taken does not tell.
    pub async fn verify_looked_up(
        &self,
        source: IpAddr,
        password: &str,
        read: HashLookup,
        unknown: &'static str,
    ) -> Result<Checked, QueueFull> {
        self.check(source, password, Hash::Lookup { read, unknown })
            .await
    }

    async fn check(
        &self,
        source: IpAddr,
        password: &str,
        hash: Hash,
    ) -> Result<Checked, QueueFull> {
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
                hash,
                verdict,
            });
            if first {
                queues.turns.push_back(source);
            }
            queues.queued += 1;
        }
        self.shared.work.notify_one();
        // A thread that cannot answer (it panicked) answers no.
        Ok(answer.await.unwrap_or_default())
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
        let mut verifier = Verifier::default();
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
            let checked = if check.verdict.is_closed() {
                Checked::default()
            } else {
                match check.hash {
                    Hash::Known(hash) => Checked {
                        matched: verifier.verify(&check.password, &hash),
                        unavailable: false,
                    },
                    Hash::Lookup { read, unknown } => {
                        let found = read();
                        let hash = match &found {
                            Ok(Some(hash)) => hash.as_str(),
                            Ok(None) | Err(()) => unknown,
                        };
                        let matched = verifier.verify(&check.password, hash);
                        Checked {
                            matched: matched && matches!(found, Ok(Some(_))),
                            unavailable: found.is_err(),
                        }
                    }
                }
            };
            self.queues.lock().expect("not poisoned").checking -= 1;
            let _ = check.verdict.send(checked);
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
                hash: Hash::Known(String::new()),
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

    #[test]
    fn the_verifier_agrees_with_argon2_s_own_on_every_kind_of_hash_and_reuses_its_memory() {
        use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
        let mut verifier = Verifier::default();
        let salt = SaltString::generate(&mut OsRng);
        let small = argon2::Params::new(64, 2, 1, Some(24)).unwrap();
        let hashes = [
            crate::auth::hash_password("right"),
            argon2::Argon2::new(
                argon2::Algorithm::Argon2i,
                argon2::Version::V0x10,
                small.clone(),
            )
            .hash_password(b"right", &salt)
            .unwrap()
            .to_string(),
            argon2::Argon2::new(argon2::Algorithm::Argon2d, argon2::Version::V0x13, small)
                .hash_password(b"right", &salt)
                .unwrap()
                .to_string(),
        ];
        for hash in &hashes {
            assert!(verifier.verify("right", hash), "{hash}");
            assert!(!verifier.verify("wrong", hash), "{hash}");
        }
        // The default hash's 19 MiB, allocated once and kept.
        assert_eq!(verifier.memory.len(), 19 * 1024);
        for garbage in [
            "",
            "$argon2id$v=19$m=1,t=1,p=1$c2FsdA$",
            "plain",
            "$argon2id$v=19$m=99999999,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo",
        ] {
            assert!(!verifier.verify("right", garbage), "{garbage}");
        }
    }

    #[tokio::test]
    async fn checks_run_on_the_login_threads_and_answer_whether_the_password_matches() {
        let checks = PasswordChecks::new(&ApiLimits::default());
        let hash = crate::auth::hash_password("right");
        assert_eq!(checks.verify(source(1), "right", &hash).await, Ok(true));
        assert_eq!(checks.verify(source(1), "wrong", &hash).await, Ok(false));
        assert_eq!(checks.in_progress(), (0, 0));
    }

    #[tokio::test]
    async fn a_looked_up_hash_is_read_on_a_login_thread_and_nobody_known_never_matches() {
        let checks = PasswordChecks::new(&ApiLimits::default());
        let hash = crate::auth::hash_password("right");
        let unknown: &'static str = Box::leak(crate::auth::hash_password("right").into_boxed_str());
        let found = |hash: Result<Option<String>, ()>| -> HashLookup {
            Box::new(move || {
                let thread = std::thread::current();
                assert!(
                    thread
                        .name()
                        .is_some_and(|name| name.starts_with("lockstep-login-")),
                    "read on {:?}",
                    thread.name()
                );
                hash
            })
        };
        let check = |read, password| checks.verify_looked_up(source(1), password, read, unknown);
        let matched = Checked {
            matched: true,
            unavailable: false,
        };
        assert_eq!(
            check(found(Ok(Some(hash.clone()))), "right").await,
            Ok(matched)
        );
        assert_eq!(
            check(found(Ok(Some(hash))), "wrong").await,
            Ok(Checked::default())
        );
        // Nobody known: checked against `unknown`, which the password matches, and still no.
        assert_eq!(
            check(found(Ok(None)), "right").await,
            Ok(Checked::default())
        );
        assert_eq!(
            check(found(Err(())), "right").await,
            Ok(Checked {
                matched: false,
                unavailable: true
            })
        );
    }
}
