//! The etcd engine (feature `etcd`): the store shared by several controllers.
//!
//! ## Keys
//!
//! Everything lives under one prefix (`lockstep/` by default; several stores may share a
//! cluster under different prefixes):
//!
//! | key | value |
//! | --- | --- |
//! | `head` | `{revision, commit}`: the store's revision and the id of the last commit |
//! | `log/<last revision, 20 digits>` | one committed transaction's events: `{first, commit, events}` |
//! | `compacted` | the revision at or below which events were dropped |
//! | `model`, `machine/<id>` | the model, the machines |
//! | `application/<name>`, `unit/<name>`, `relation/<key>`, `settings/<id>`, `charm/<url>` | documents |
//! | `step/<step>@<version>` | database-step checkpoints |
//! | `op/<operation-id>` | client operations' recorded results |
//! | `agent-password/<tag>` | an agent's credential (its argon2 PHC string, JSON) |
//! | `agent-status/<tag>` | an agent's last report ([`crate::AgentStatus`]) |
//! | `record/current` | the upgrade-info record with its revision |
//! | `record/archived/<revision, 20 digits>` | archived records |
//! | `lease` | the coordinator lease `{token, holder, ttl, expires-at, lease}`, attached to an etcd lease |
//! | `lease-next` | the next fencing token |
//!
//! ## How the trait maps to etcd
//!
//! - **Transactions** are optimistic, as etcd's STM: one atomic read of `head` (and of
//!   `lease` when fenced) gives an etcd revision `H`; the body reads at `H` (a consistent
//!   snapshot) through an overlay of its own writes; the commit is one etcd transaction
//!   `if mod_revision(head) == seen [and create_revision(lease) == token] then <the writes>,
//!   put log/<last>, put head`. Every commit rewrites `head`, so any concurrent commit fails
//!   the compare and the body runs again on the new state (serializable, like SQLite's single
//!   writer). A database step's changes, its checkpoint and its events are one etcd
//!   transaction; so are an operation's effect and its recorded result.
//! - **Writes without events** (`op/`, `agent-password/`, `agent-status/`) are keys in the
//!   same commit and log nothing. A commit of such keys alone still rewrites `head` (same
//!   revision, a new commit id), so that it conflicts with concurrent transactions like any
//!   other; [`Store::wait_for_change`] wakes only for a `head` whose revision grew. Except
//!   agents' statuses (heartbeats): a commit of those alone is put without the compare on
//!   `head` and leaves it alone, so the fleet's heartbeats never make another transaction
//!   run again, and wake no watcher.
//! - **The upgrade-info record** is created if absent and advanced by compare-and-set on its
//!   revision by the trait's helpers inside such a transaction: the compare on `head` is
//!   stronger than one on the record's key, so a stale revision can never commit.
//! - **Revisions** are lockstep's own counter, kept in `head` and advanced by the commit that
//!   writes the events, exactly as in SQLite: one revision per write, consecutive within a
//!   transaction, never reused. etcd gives one revision per *transaction*, and the trait
//!   promises one per *write* (a page of [`Store::changes_since`] may end inside a
//!   transaction, a record's revision is its own write's), so etcd's revision cannot be the
//!   event's. Each lockstep revision maps to the etcd revision of its `log/` key (its
//!   `create_revision`), and that is what watches start from.
//! - **The event log** is the `log/` keys, named by the last revision they hold, so a range
//!   read from `log/<R + 1>` returns every event after `R` in order (the first batch may
//!   start before `R + 1`). [`Store::wait_for_change`] is etcd's watch on `head` with a start
//!   revision one above the etcd revision it read, so nothing committed in between is
//!   missed, from any process. [`Store::compact`] deletes whole batches at or below the
//!   revision and raises `compacted` in one transaction; a reader from below it gets
//!   `ResyncNeeded`, as from the other engines. (etcd's own MVCC compaction only limits how
//!   far back a watch may start: a watch cancelled for compaction wakes its waiter, who
//!   re-reads.)
//! - **The lease** is an etcd lease: acquire grants one (TTL from the call, in whole seconds,
//!   at least [`EtcdConfig::server_ttl_min`]) and creates `lease` on it if absent
//!   (`create_revision == 0`), taking the next fencing token from `lease-next` in the same
//!   etcd transaction (tokens are 1, 2, ... as in the other engines and the core's model:
//!   they only grow and are never granted twice). A token names one grant, that is one
//!   `create_revision` of the key. A keep-alive is one etcd keep-alive plus a rewrite of the
//!   value's `expires-at`; release deletes the key and revokes the lease. A fenced commit
//!   reads the grant its token names when it begins and carries
//!   `create_revision(lease) == <that grant's revision>`: once the etcd lease expired (its
//!   key is deleted) or another controller took over (a new key, a new revision), a deposed
//!   coordinator's late write is refused by etcd itself. The lease is live while its
//!   key exists *and* the store's [`Clock`] is before `expires-at` (the trait's rule, and what
//!   lets tests expire it with a [`crate::ManualClock`]); a lease expired on the clock is
//!   taken over by deleting its key first (compare on its revisions), so the new holder's
//!   token is a fresh `create_revision`. Clock skew between hosts can only make a lease
//!   change hands early, never let two holders write: the fence is etcd's compare.
//! - **Bounded retries.** Every etcd call is retried with capped, jittered exponential
//!   backoff while the error is transient (unavailable, deadline, leader change, transport)
//!   for at most [`EtcdConfig::retry_for`]; each attempt has its own timeout. etcd's client
//!   does not retry: in the team's measurements (etcd 3.5, three members on loopback; not
//!   a test of this repository) killing the raft leader failed about 2 s of requests.
//! - **Writes are safe to repeat.** Reads and lease keep-alives are idempotent; every commit
//!   is a compare-and-set, so a repeat of one that landed fails its compare instead of
//!   writing twice. Each commit carries a fresh id in `head` and in its `log/` key; when a
//!   commit's answer was lost and its repeat fails the compare, the failure branch reads
//!   both back and recognises the commit as ours (`Committed`, not a second run of the
//!   body). Lease creation recognises its own etcd lease on the key the same way.
//! - **max-txn-ops.** A commit needs one etcd operation per key written plus two (`log/`,
//!   `head`); several writes of one key in a transaction are one operation (every event is
//!   still logged). A transaction over [`EtcdConfig::max_txn_ops`] (etcd's `--max-txn-ops`,
//!   128 by default) is refused before it is sent, with an error that says so: split a large
//!   step into checkpointed chunks, or raise the cluster's limit and this setting together.
//! - **TLS.** `https://` endpoints need [`EtcdConfig::tls`] ([`EtcdTls`]): the CA that signed
//!   the members' certificates, which must name the host each endpoint gives (an IP such as
//!   `127.0.0.1`, or a DNS name), and this client's certificate and key when the cluster
//!   asks for one (`--client-cert-auth`); rustls over ring, as the rest of the workspace.
//!   The scheme and the setting must agree: an `https://` endpoint without `tls`, or `tls`
//!   with an `http://` endpoint, is refused at connect, naming the endpoint (an endpoint
//!   without a scheme follows the setting). PEM that does not parse is refused at connect,
//!   saying which (CA, certificate or key); a certificate the cluster rejects fails the first
//!   call, after the retries.
//! - **Plain http stays on this machine.** An endpoint spoken to in plain http whose host is
//!   not loopback is refused at connect, naming it, unless [`EtcdConfig::insecure`] is set
//!   (the rule is [`crate::endpoint`]'s): whoever can write the store can change the model's
//!   config, `agent-metadata-url` included, and plain http lets the network between do so.
//! - **Authentication.** With [`EtcdConfig::user`] ([`EtcdUser`]) the client authenticates
//!   at connect (transient failures retried for [`EtcdConfig::retry_for`]) and whenever its
//!   token expired (etcd's simple tokens last `--auth-token-ttl`, 300 s by default, after
//!   their last use). The user needs a role with `readwrite` on the prefix; leases need no
//!   more. What etcd refuses for authentication or permission (a wrong password, no user
//!   against an etcd with authentication, a user given to an etcd without it, a role
//!   without the prefix) is [`StoreError::Denied`], never retried, naming the user and
//!   never the password. A user given to an etcd whose authentication is disabled is
//!   refused too: whoever configured one expects the store to be closed to others.
//!
//! ## Sync over async
//!
//! The trait is synchronous; `etcd-client` is async (tonic). The store owns a private
//! multi-threaded tokio runtime (two worker threads, `lockstep-etcd`) that owns the client's
//! connections. A call spawns its future on that runtime and waits for the answer on a
//! standard channel: it never enters a runtime on the caller's thread, so it works from a
//! plain thread, from `tokio::task::spawn_blocking` (how the agent calls the store) and even
//! from a runtime's own thread (where it blocks that thread, as every synchronous store
//! does). The runtime is shut down in the background when the last handle is dropped, so
//! dropping a store inside an async task does not panic.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KeyValue, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use lockstep_core::lifecycle::{ControllerId, LeaseToken, Revision, UpgradeInfo};
use lockstep_core::steps::StepKey;
use lockstep_core::{Millis, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::encode;
use crate::lease::{Clock, Lease, SystemClock};
use crate::postcondition;
use crate::sqlite::RECORD_CURRENT;
use crate::{
    Abort, AgentStatus, ChangeKind, Changes, Checkpoint, EntityKind, Event, Machine, Model, Store,
    StoreError, Tx, TxOutcome, finish_body, machine_tag,
};

/// How many times a transaction runs again after conflicting with another writer (or a lost
/// compare on the lease key).
const ATTEMPTS_MAX: u32 = 1000;
/// Log batches read per etcd range request while paging [`Store::changes_since`].
const PAGE_BATCHES: usize = 256;
/// The longest pause between two attempts of one call.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The first pause after a failed attempt.
const BACKOFF_FIRST: Duration = Duration::from_millis(20);

/// Where and how to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `http://127.0.0.1:2379`; the client balances over them.
    pub endpoints: Vec<String>,
    /// Every key of this store starts with it (normalised to end with `/`).
    pub prefix: String,
    /// The cluster's `--max-txn-ops` (etcd's default 128): larger commits are refused here.
    pub max_txn_ops: usize,
    /// How long one call keeps retrying transient failures before it fails.
    pub retry_for: Duration,
    /// One attempt's timeout.
    pub request_timeout: Duration,
    /// The shortest TTL asked of etcd for the lease, whatever the call's TTL (zero: the
    /// call's TTL rounded up to whole seconds). Tests that expire leases with a manual
    /// clock raise it so that the server never expires one first.
    pub server_ttl_min: Duration,
    /// TLS to the members (`https://` endpoints); `None`: plain `http://`.
    pub tls: Option<EtcdTls>,
    /// etcd's user authentication: the user and its password.
    pub user: Option<EtcdUser>,
    /// Accept plain http to endpoints that are not loopback (refused at connect otherwise).
    pub insecure: bool,
}

/// An etcd user and its password (`etcdctl --user`). The password is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// TLS to etcd (endpoints `https://...`): the CA that signed the members' certificates, and
/// this client's own certificate and key for a cluster that asks for one (`--client-cert-auth`).
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA certificate(s), PEM: the members' certificates must chain to one of them.
    pub ca_pem: String,
    /// This client's certificate and key, for `--client-cert-auth`.
    pub identity: Option<EtcdIdentity>,
}

/// A client certificate and its private key, PEM.
#[derive(Clone)]
pub struct EtcdIdentity {
    /// The certificate, possibly followed by intermediates.
    pub cert_pem: String,
    /// The private key (PKCS#8, PKCS#1 or SEC1): never printed.
    pub key_pem: String,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("identity", &self.identity)
            .finish()
    }
}

impl std::fmt::Debug for EtcdIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdIdentity")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// The defaults: prefix `lockstep/`, 128 operations per transaction, retries for 20 s,
    /// 3 s per attempt.
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: "lockstep/".to_owned(),
            max_txn_ops: 128,
            retry_for: Duration::from_secs(20),
            request_timeout: Duration::from_secs(3),
            server_ttl_min: Duration::ZERO,
            tls: None,
            user: None,
            insecure: false,
        }
    }

    pub fn with_prefix(mut self, prefix: impl Into<String>) -> EtcdConfig {
        self.prefix = prefix.into();
        self
    }

    pub fn with_tls(mut self, tls: EtcdTls) -> EtcdConfig {
        self.tls = Some(tls);
        self
    }

    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> EtcdConfig {
        self.user = Some(EtcdUser {
            name: name.into(),
            password: password.into(),
        });
        self
    }

    /// Refuses an endpoint spoken to in plain http off loopback, unless `insecure`.
    fn check_plain_endpoints(&self) -> Result<(), String> {
        if self.insecure {
            return Ok(());
        }
        let tls = self.tls.is_some();
        match crate::endpoint::plain_off_loopback(self.endpoints.iter().map(String::as_str), tls) {
            Some(endpoint) => Err(format!(
                "endpoint {endpoint} is plain http to a host that is not loopback: whoever is \
                 on the network between can read and change the store; use https:// with TLS, \
                 or set `insecure` to accept it"
            )),
            None => Ok(()),
        }
    }

    /// The client's TLS options, after checking that every endpoint's scheme agrees with
    /// [`EtcdConfig::tls`] and that its PEM parses; the error says what is wrong.
    fn tls_options(&self) -> Result<Option<TlsOptions>, String> {
        for endpoint in &self.endpoints {
            let scheme = endpoint
                .split_once("://")
                .map(|(scheme, _)| scheme.to_ascii_lowercase());
            match (scheme.as_deref(), &self.tls) {
                (Some("https"), None) => {
                    return Err(format!(
                        "endpoint {endpoint} is https but no TLS is configured: give the CA \
                         that signed the members' certificates"
                    ));
                }
                (Some("http"), Some(_)) => {
                    return Err(format!(
                        "endpoint {endpoint} is plain http but TLS is configured: use https://"
                    ));
                }
                _ => {}
            }
        }
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        check_ca(&tls.ca_pem)
            .map_err(|detail| format!("the TLS CA certificate (ca_pem) {detail}"))?;
        let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some(identity) = &tls.identity {
            check_certificates(&identity.cert_pem)
                .map_err(|detail| format!("the TLS client certificate (cert_pem) {detail}"))?;
            check_key(&identity.key_pem)
                .map_err(|detail| format!("the TLS client key (key_pem) {detail}"))?;
            options = options.identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
        }
        Ok(Some(options))
    }
}

/// The certificates in `pem`; an error (to follow the name of what was read) when a block
/// is malformed or there is none. (The client takes bad PEM silently, or fails late
/// without saying which file.)
fn check_certificates(
    pem: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certificates = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("is not PEM: {error}"))?;
    if certificates.is_empty() {
        return Err("is not PEM: no CERTIFICATE block".to_owned());
    }
    Ok(certificates)
}

/// A CA whose every certificate can be a trust anchor.
fn check_ca(pem: &str) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in check_certificates(pem)? {
        roots
            .add(certificate)
            .map_err(|error| format!("is not a usable CA certificate: {error}"))?;
    }
    Ok(())
}

/// A private key the client's TLS (rustls on ring) can sign with.
fn check_key(pem: &str) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|error| format!("is not PEM: {error}"))?;
    rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|error| format!("is not a usable private key: {error}"))?;
    Ok(())
}

/// The etcd store. Clones are handles sharing one client and runtime; another
/// [`EtcdStore::connect`] to the same cluster and prefix is another controller.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.config.endpoints)
            .field("prefix", &self.inner.config.prefix)
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: Client,
    /// Taken by `drop`, which shuts it down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    clock: Arc<dyn Clock>,
    config: EtcdConfig,
    /// Names the store in errors.
    site: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why a call gave up.
enum Failure {
    /// etcd refused it (not worth repeating): a compacted revision, a missing lease, a
    /// transaction too large...
    Refused(etcd_client::Error),
    /// Transient failures until the retry budget ran out.
    GaveUp(String),
}

#[derive(Serialize, Deserialize)]
struct Head {
    revision: u64,
    commit: String,
}

#[derive(Serialize, Deserialize)]
struct Batch {
    first: u64,
    commit: String,
    events: Vec<(EntityKind, String, ChangeKind, serde_json::Value)>,
}

#[derive(Serialize, Deserialize)]
struct StoredRecord {
    record: UpgradeInfo,
    revision: Revision,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct StoredLease {
    /// The fencing token: lockstep's own counter (`lease-next`), 1, 2, ... as in the other
    /// engines; it names one grant, whose key's `create_revision` the fence compares.
    token: u64,
    holder: ControllerId,
    ttl: Millis,
    expires_at: Timestamp,
    /// The etcd lease the key is attached to.
    lease: i64,
}

/// A fresh id for one commit: process, time and a counter.
fn commit_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{:x}-{nanos:x}-{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// `base` scaled by a factor in [0.5, 1.5), from the clock's nanoseconds (no generator).
fn jittered(base: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    base.mul_f64(0.5 + f64::from(nanos % 1000) / 1000.0)
}

/// Transient: worth another attempt (gRPC codes, transport failures).
fn retriable(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        // Cancelled, Unknown, DeadlineExceeded, ResourceExhausted, Aborted, Internal,
        // Unavailable (etcd's "leader changed", "no leader", "request timed out").
        E::GRpcStatus(status) => matches!(i32::from(status.code()), 1 | 2 | 4 | 8 | 10 | 13 | 14),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        _ => false,
    }
}

/// etcd refused a read at a compacted revision.
fn compacted(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if i32::from(status.code()) == 11)
}

/// What etcd's refusal of this client's credentials or permissions means, naming `user`
/// (never its password); `None` when `error` is not such a refusal. etcd's messages are
/// matched (`api/v3rpc/rpctypes`), as their codes are shared with other errors.
fn denial(error: &etcd_client::Error, user: Option<&EtcdUser>, prefix: &str) -> Option<String> {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return None;
    };
    let message = status.message();
    let who = match user {
        Some(user) => format!("user {:?}", user.name),
        None => "this client (no user)".to_owned(),
    };
    let meaning = if message.contains("authentication failed") {
        format!("etcd refused {who}: wrong user name or password")
    } else if message.contains("user name is empty") {
        "etcd has authentication enabled and this client gave no user: configure a user and \
         its password"
            .to_owned()
    } else if message.contains("authentication is not enabled") {
        format!(
            "{who} was configured but etcd has authentication disabled, so anyone who reaches \
             it can change the store: enable it (etcdctl auth enable) or configure no user"
        )
    } else if message.contains("permission denied") {
        format!("etcd denied {who} access to {prefix}: grant its role readwrite on that prefix")
    } else if message.contains("invalid auth token") {
        format!("etcd refused the authentication token of {who}")
    } else if i32::from(status.code()) == 16 {
        format!("etcd refused {who}")
    } else {
        return None;
    };
    Some(format!("{meaning} ({message})"))
}

fn number(key: u64) -> String {
    format!("{key:020}")
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|error| StoreError::Decode {
        what: what.to_owned(),
        detail: error.to_string(),
    })
}

fn bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store types encode as JSON")
}

impl EtcdStore {
    /// Connects on the system clock.
    pub fn connect(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with_clock(config, Arc::new(SystemClock))
    }

    /// Connects; transactions' `now` and lease expiry read `clock`.
    pub fn connect_with_clock(
        mut config: EtcdConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<EtcdStore, StoreError> {
        if !config.prefix.ends_with('/') {
            config.prefix.push('/');
        }
        let site = PathBuf::from(format!(
            "etcd://{}/{}",
            config.endpoints.join(","),
            config.prefix
        ));
        let engine = |detail: String| StoreError::Engine {
            path: site.clone(),
            detail,
        };
        if config.endpoints.is_empty() {
            return Err(engine("no etcd endpoints given".to_owned()));
        }
        config.check_plain_endpoints().map_err(engine)?;
        let tls = config.tls_options().map_err(engine)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lockstep-etcd")
            .enable_all()
            .build()
            .map_err(|error| engine(format!("cannot start the etcd client's runtime: {error}")))?;
        let handle = runtime.handle().clone();
        let endpoints = config.endpoints.clone();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.request_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(Duration::from_secs(1), config.request_timeout);
        // The server name each member's certificate is checked against is its endpoint's
        // host (tonic's default): an IP endpoint needs an IP SAN, a named one a DNS SAN.
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        if let Some(user) = &config.user {
            // A token expires `--auth-token-ttl` after its last use: a quiet controller
            // authenticates again rather than failing its next call.
            options = options
                .with_user(user.name.clone(), user.password.clone())
                .with_auto_token_refresh(true);
        }
        // On the store's runtime, waited for on a channel: `block_on` here would panic when
        // the caller is itself inside a runtime. Without a user the channel connects lazily
        // and a failure here is a bad endpoint; with one, connecting authenticates, retried
        // like any call while etcd cannot be reached.
        let (retry_for, timeout) = (config.retry_for, config.request_timeout);
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        handle.spawn(async move {
            let deadline = tokio::time::Instant::now() + retry_for;
            let mut backoff = BACKOFF_FIRST;
            let mut attempts = 0u32;
            let outcome = loop {
                attempts += 1;
                let attempt = Client::connect(endpoints.clone(), Some(options.clone()));
                let error = match tokio::time::timeout(timeout, attempt).await {
                    Ok(Ok(client)) => break Ok(client),
                    Ok(Err(error)) if !retriable(&error) => break Err(Failure::Refused(error)),
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("no answer within {timeout:?}"),
                };
                let pause = jittered(backoff);
                if tokio::time::Instant::now() + pause > deadline {
                    break Err(Failure::GaveUp(format!(
                        "{error} (gave up after {attempts} attempts in {retry_for:?})"
                    )));
                }
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            };
            let _ = sender.send(outcome);
        });
        let connected = receiver
            .recv()
            .map_err(|error| engine(format!("the client's runtime stopped: {error}")))
            .and_then(|outcome| {
                outcome.map_err(|failure| match failure {
                    Failure::Refused(error) => {
                        match denial(&error, config.user.as_ref(), &config.prefix) {
                            Some(detail) => StoreError::Denied {
                                path: site.clone(),
                                detail,
                            },
                            None => engine(format!("cannot connect: {error}")),
                        }
                    }
                    Failure::GaveUp(detail) => engine(format!("cannot connect: {detail}")),
                })
            });
        let client = match connected {
            Ok(client) => client,
            Err(error) => {
                // Dropping a runtime blocks, which panics inside the caller's own runtime
                // (bootstrap's): shut it down in the background, as `Inner`'s drop does.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                client,
                runtime: Some(runtime),
                handle,
                clock,
                config,
                site,
            }),
        })
    }

    /// The configuration in force (prefix normalised).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }
}

impl Inner {
    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.config.prefix)
    }

    fn engine(&self, what: &str, detail: impl std::fmt::Display) -> StoreError {
        StoreError::Engine {
            path: self.site.clone(),
            detail: format!("{what}: {detail}"),
        }
    }

    fn fail(&self, what: &str, failure: Failure) -> StoreError {
        match failure {
            Failure::Refused(error) => {
                match denial(&error, self.config.user.as_ref(), &self.config.prefix) {
                    Some(detail) => StoreError::Denied {
                        path: self.site.clone(),
                        detail: format!("{what}: {detail}"),
                    },
                    None => self.engine(what, error),
                }
            }
            Failure::GaveUp(detail) => self.engine(what, detail),
        }
    }

    /// Runs `future` on the store's runtime and waits for it on this thread.
    fn block<T, F>(&self, future: F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = sender.send(future.await);
        });
        receiver
            .recv()
            .expect("the store's runtime runs until the store is dropped")
    }

    /// One etcd call, retried with capped, jittered backoff while its failures are transient.
    fn call<T, F, Fut>(&self, mut attempt: F) -> Result<T, Failure>
    where
        F: FnMut(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let client = self.client.clone();
        let retry_for = self.config.retry_for;
        let timeout = self.config.request_timeout;
        self.block(async move {
            let deadline = tokio::time::Instant::now() + retry_for;
            let mut backoff = BACKOFF_FIRST;
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let error = match tokio::time::timeout(timeout, attempt(client.clone())).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(error)) if !retriable(&error) => return Err(Failure::Refused(error)),
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("no answer within {timeout:?}"),
                };
                let pause = jittered(backoff);
                if tokio::time::Instant::now() + pause > deadline {
                    return Err(Failure::GaveUp(format!(
                        "{error} (gave up after {attempts} attempts in {retry_for:?})"
                    )));
                }
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        })
    }

    /// Reads `keys` atomically (one etcd transaction of gets): the etcd revision read at,
    /// and each key's entry.
    fn read_keys(&self, keys: &[String]) -> Result<(i64, Vec<Option<KeyValue>>), StoreError> {
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|key| TxnOp::get(key.as_str(), None))
            .collect();
        let txn = Txn::new().and_then(gets);
        let response = self
            .call(move |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .map_err(|failure| self.fail("read", failure))?;
        let at = response.header().map_or(0, |header| header.revision());
        let entries = response
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        Ok((at, entries))
    }

    fn get(&self, key: &str, at: Option<i64>) -> Result<Option<KeyValue>, Failure> {
        let key = key.to_owned();
        let options = at.map(|at| GetOptions::new().with_revision(at));
        let response = self.call(move |mut client| {
            let (key, options) = (key.clone(), options.clone());
            async move { client.get(key, options).await }
        })?;
        Ok(response.kvs().first().cloned())
    }

    /// Keys in `[from, end)` at `at` (`None`: latest), at most `limit` (0: all), in key
    /// order (or reversed); and whether more remain.
    fn range(
        &self,
        from: &str,
        end: Vec<u8>,
        at: Option<i64>,
        limit: usize,
        descending: bool,
    ) -> Result<(Vec<KeyValue>, bool), Failure> {
        let mut options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        if descending {
            options = options.with_sort(SortTarget::Key, SortOrder::Descend);
        }
        if let Some(at) = at {
            options = options.with_revision(at);
        }
        let from = from.to_owned();
        let response = self.call(move |mut client| {
            let (from, options) = (from.clone(), options.clone());
            async move { client.get(from, Some(options)).await }
        })?;
        Ok((response.kvs().to_vec(), response.more()))
    }

    fn txn(&self, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.call(move |mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .map_err(|failure| self.fail(what, failure))
    }

    fn head(&self, entry: Option<&KeyValue>) -> Result<Head, StoreError> {
        match entry {
            None => Ok(Head {
                revision: 0,
                commit: String::new(),
            }),
            Some(kv) => decode("the store's head", kv.value()),
        }
    }

    fn stored_lease(&self, entry: &KeyValue) -> Result<StoredLease, StoreError> {
        decode("the coordinator lease", entry.value())
    }

    /// When a write fenced on `token` may commit (the lease key is the grant `token` names
    /// and the store's clock has not passed its expiry): the key's `create_revision`, which
    /// the commit compares.
    fn fence_holds(
        &self,
        entry: Option<&KeyValue>,
        token: LeaseToken,
        now: Timestamp,
    ) -> Result<Option<i64>, StoreError> {
        let Some(kv) = entry else {
            return Ok(None);
        };
        let lease = self.stored_lease(kv)?;
        Ok((lease.token == token.0 && now < lease.expires_at).then(|| kv.create_revision()))
    }

    fn lease_entry(&self) -> Result<Option<KeyValue>, StoreError> {
        self.get(&self.key("lease"), None)
            .map_err(|failure| self.fail("read the lease", failure))
    }

    /// Grants an etcd lease for `ttl` (whole seconds, at least the configured minimum).
    fn grant(&self, ttl: Millis) -> Result<i64, StoreError> {
        let seconds = ttl
            .0
            .div_ceil(1000)
            .max(self.config.server_ttl_min.as_secs())
            .max(1);
        let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
        let response = self
            .call(move |mut client| async move { client.lease_grant(seconds, None).await })
            .map_err(|failure| self.fail("grant a lease", failure))?;
        Ok(response.id())
    }

    /// One etcd keep-alive of `lease`: `false` when etcd no longer has it.
    fn server_keep_alive(&self, lease: i64) -> Result<bool, StoreError> {
        match self
            .call(move |mut client| async move { client.lease_keep_alive(lease).await.map(|_| ()) })
        {
            Ok(()) => Ok(true),
            Err(Failure::Refused(_)) => Ok(false),
            Err(failure) => Err(self.fail("keep the lease alive", failure)),
        }
    }

    /// Revokes `lease` (its key goes with it); a lease etcd no longer has is fine.
    fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        match self.call(move |mut client| async move { client.lease_revoke(lease).await }) {
            Ok(_) | Err(Failure::Refused(_)) => Ok(()),
            Err(failure) => Err(self.fail("revoke a lease", failure)),
        }
    }

    /// Rewrites the lease's value if the key is still the grant created at `created`.
    fn put_lease_if(&self, created: i64, value: &StoredLease) -> Result<bool, StoreError> {
        let key = self.key("lease");
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                created,
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                bytes(value),
                Some(PutOptions::new().with_lease(value.lease)),
            )]);
        Ok(self.txn("extend the lease", txn)?.succeeded())
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

impl Store for EtcdStore {
    fn transaction(
        &self,
        fence: Option<LeaseToken>,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), Abort>,
    ) -> Result<TxOutcome, StoreError> {
        let inner = &*self.inner;
        let head_key = inner.key("head");
        let lease_key = inner.key("lease");
        for attempt in 0..ATTEMPTS_MAX {
            if attempt > 0 {
                // Another writer won: let it finish before running the body again.
                std::thread::sleep(jittered(Duration::from_millis(u64::from(attempt.min(20)))));
            }
            let (at, entries) = inner.read_keys(&[head_key.clone(), lease_key.clone()])?;
            let head_entry = entries[0].as_ref();
            let head = inner.head(head_entry)?;
            let head_mod = head_entry.map_or(0, KeyValue::mod_revision);
            let now = inner.now();
            let mut grant = None;
            if let Some(token) = fence {
                grant = inner.fence_holds(entries[1].as_ref(), token, now)?;
                if grant.is_none() {
                    return Ok(TxOutcome::Fenced);
                }
            }
            let mut tx = EtcdTx {
                inner,
                at,
                base: head.revision,
                now,
                reads: HashMap::new(),
                writes: BTreeMap::new(),
                events: Vec::new(),
                stale: false,
            };
            let result = body(&mut tx);
            if tx.stale {
                continue;
            }
            if result.is_err() {
                return finish_body(result);
            }
            // The fence again at the commit point, with the lease as it is now (a step may
            // outlive its lease on the store's clock; etcd checks the key in the commit).
            if let Some(token) = fence
                && inner
                    .fence_holds(inner.lease_entry()?.as_ref(), token, inner.now())?
                    .is_none()
            {
                return Ok(TxOutcome::Fenced);
            }
            if tx.writes.is_empty() && tx.events.is_empty() {
                return Ok(TxOutcome::Committed(Revision(head.revision)));
            }
            // Agents' statuses alone (heartbeats, from every agent every few seconds): put
            // without the compare on `head` and without moving it, so that they never make
            // another transaction run again (one whose body outlasts the interval between
            // heartbeats, a long database step, would otherwise never commit), nor run again
            // themselves. What their body read is not checked: a status is its writer's
            // alone, and one landing after its machine's removal is shown nowhere.
            let status_prefix = inner.key("agent-status/");
            if tx.events.is_empty()
                && tx
                    .writes
                    .iter()
                    .all(|(key, value)| key.starts_with(&status_prefix) && value.is_some())
            {
                let ops: Vec<TxnOp> = tx
                    .writes
                    .iter()
                    .filter_map(|(key, value)| {
                        value
                            .as_ref()
                            .map(|value| TxnOp::put(key.as_str(), value.clone(), None))
                    })
                    .collect();
                inner.txn("commit agents' statuses", Txn::new().and_then(ops))?;
                return Ok(TxOutcome::Committed(Revision(head.revision)));
            }
            let logged = tx.events.len() as u64;
            let revision = head.revision + logged;
            let commit = commit_id();
            let mut ops: Vec<TxnOp> = tx
                .writes
                .iter()
                .map(|(key, value)| match value {
                    Some(value) => TxnOp::put(key.as_str(), value.clone(), None),
                    None => TxnOp::delete(key.as_str(), None),
                })
                .collect();
            let log_key = inner.key(&format!("log/{}", number(revision)));
            if !tx.events.is_empty() {
                let batch = Batch {
                    first: head.revision + 1,
                    commit: commit.clone(),
                    events: std::mem::take(&mut tx.events),
                };
                ops.push(TxnOp::put(log_key.as_str(), bytes(&batch), None));
            }
            ops.push(TxnOp::put(
                head_key.as_str(),
                bytes(&Head {
                    revision,
                    commit: commit.clone(),
                }),
                None,
            ));
            if ops.len() > inner.config.max_txn_ops {
                return Err(inner.engine(
                    "commit",
                    format!(
                        "the transaction writes {} keys, more than etcd's max-txn-ops ({}): \
                         split it into checkpointed chunks, or raise --max-txn-ops on the \
                         cluster and in the store's configuration",
                        ops.len(),
                        inner.config.max_txn_ops
                    ),
                ));
            }
            let mut compares = vec![Compare::mod_revision(
                head_key.as_str(),
                CompareOp::Equal,
                head_mod,
            )];
            if let Some(created) = grant {
                compares.push(Compare::create_revision(
                    lease_key.as_str(),
                    CompareOp::Equal,
                    created,
                ));
            }
            // On a failed compare, read back what would show that this very commit landed
            // already (an earlier attempt whose answer was lost).
            let txn = Txn::new().when(compares).and_then(ops).or_else([
                TxnOp::get(head_key.as_str(), None),
                TxnOp::get(log_key.as_str(), None),
            ]);
            let response = inner.txn("commit", txn)?;
            if response.succeeded() {
                postcondition::assert_commit(
                    "etcd",
                    Revision(head.revision),
                    logged,
                    Revision(revision),
                );
                return Ok(TxOutcome::Committed(Revision(revision)));
            }
            let landed = response.op_responses().into_iter().any(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
                    serde_json::from_slice::<serde_json::Value>(kv.value())
                        .is_ok_and(|value| value["commit"] == commit.as_str())
                }),
                _ => false,
            });
            if landed {
                postcondition::assert_commit(
                    "etcd",
                    Revision(head.revision),
                    logged,
                    Revision(revision),
                );
                return Ok(TxOutcome::Committed(Revision(revision)));
            }
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    fn snapshot(
        &self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        for _ in 0..ATTEMPTS_MAX {
            let (at, entries) = inner.read_keys(&[inner.key("head")])?;
            let head = inner.head(entries[0].as_ref())?;
            let mut tx = EtcdTx {
                inner,
                at,
                base: head.revision,
                now: inner.now(),
                reads: HashMap::new(),
                writes: BTreeMap::new(),
                events: Vec::new(),
                stale: false,
            };
            let result = body(&mut tx);
            if !tx.stale {
                return result;
            }
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    fn acquire_lease(
        &self,
        holder: ControllerId,
        ttl: Millis,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let inner = &*self.inner;
        let key = inner.key("lease");
        let next_key = inner.key("lease-next");
        for _ in 0..ATTEMPTS_MAX {
            let (_, entries) = inner.read_keys(&[key.clone(), next_key.clone()])?;
            let now = inner.now();
            match &entries[0] {
                Some(kv) => {
                    let lease = inner.stored_lease(kv)?;
                    if now < lease.expires_at {
                        if lease.holder != holder {
                            return Ok(None);
                        }
                        // The live holder: extended, same token.
                        if !inner.server_keep_alive(lease.lease)? {
                            continue;
                        }
                        let extended = StoredLease {
                            ttl,
                            expires_at: now + ttl,
                            ..lease
                        };
                        if inner.put_lease_if(kv.create_revision(), &extended)? {
                            return Ok(Some(LeaseToken(lease.token)));
                        }
                        continue;
                    }
                    // Expired on the store's clock: delete the key (if it is still that
                    // grant, unchanged), so that the next grant is a new key.
                    let txn = Txn::new()
                        .when([
                            Compare::create_revision(
                                key.as_str(),
                                CompareOp::Equal,
                                kv.create_revision(),
                            ),
                            Compare::mod_revision(
                                key.as_str(),
                                CompareOp::Equal,
                                kv.mod_revision(),
                            ),
                        ])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    if inner.txn("take over an expired lease", txn)?.succeeded() {
                        inner.revoke(lease.lease)?;
                    }
                }
                None => {
                    let (next, next_mod) = match &entries[1] {
                        Some(kv) => (
                            decode::<u64>("the next lease token", kv.value())?,
                            kv.mod_revision(),
                        ),
                        None => (1, 0),
                    };
                    let id = inner.grant(ttl)?;
                    let value = StoredLease {
                        token: next,
                        holder,
                        ttl,
                        expires_at: now + ttl,
                        lease: id,
                    };
                    let txn = Txn::new()
                        .when([
                            Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                            Compare::mod_revision(next_key.as_str(), CompareOp::Equal, next_mod),
                        ])
                        .and_then([
                            TxnOp::put(
                                key.as_str(),
                                bytes(&value),
                                Some(PutOptions::new().with_lease(id)),
                            ),
                            TxnOp::put(next_key.as_str(), bytes(&(next + 1)), None),
                        ])
                        .or_else([TxnOp::get(key.as_str(), None)]);
                    let response = inner.txn("acquire the lease", txn)?;
                    if response.succeeded() {
                        return Ok(Some(LeaseToken(next)));
                    }
                    // Ours already, from an attempt whose answer was lost?
                    let ours = response.op_responses().into_iter().find_map(|op| match op {
                        TxnOpResponse::Get(get) => get
                            .kvs()
                            .first()
                            .filter(|kv| kv.lease() == id)
                            .and_then(|kv| inner.stored_lease(kv).ok())
                            .map(|lease| lease.token),
                        _ => None,
                    });
                    if let Some(token) = ours {
                        return Ok(Some(LeaseToken(token)));
                    }
                    inner.revoke(id)?;
                }
            }
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    fn keep_alive_lease(
        &self,
        holder: ControllerId,
        token: LeaseToken,
    ) -> Result<Option<LeaseToken>, StoreError> {
        let inner = &*self.inner;
        let Some(kv) = inner.lease_entry()? else {
            return Ok(None);
        };
        let lease = inner.stored_lease(&kv)?;
        let now = inner.now();
        if lease.token != token.0 || lease.holder != holder || now >= lease.expires_at {
            return Ok(None);
        }
        if !inner.server_keep_alive(lease.lease)? {
            return Ok(None);
        }
        let extended = StoredLease {
            expires_at: now + lease.ttl,
            ..lease
        };
        Ok(inner
            .put_lease_if(kv.create_revision(), &extended)?
            .then_some(token))
    }

    fn release_lease(&self, holder: ControllerId, token: LeaseToken) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let key = inner.key("lease");
        let Some(kv) = inner.lease_entry()? else {
            return Ok(false);
        };
        let lease = inner.stored_lease(&kv)?;
        if lease.token != token.0 || lease.holder != holder {
            return Ok(false);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                kv.create_revision(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let released = inner.txn("release the lease", txn)?.succeeded();
        // Revoke in any case: the grant is ours and of no further use.
        inner.revoke(lease.lease)?;
        Ok(released)
    }

    fn lease(&self) -> Result<Option<Lease>, StoreError> {
        let inner = &*self.inner;
        let Some(kv) = inner.lease_entry()? else {
            return Ok(None);
        };
        let lease = inner.stored_lease(&kv)?;
        Ok(Some(Lease {
            holder: lease.holder,
            token: LeaseToken(lease.token),
            ttl: lease.ttl,
            expires_at: lease.expires_at,
        }))
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Changes, StoreError> {
        let inner = &*self.inner;
        let log_prefix = inner.key("log/");
        'attempt: for _ in 0..ATTEMPTS_MAX {
            let (at, entries) = inner.read_keys(&[inner.key("head"), inner.key("compacted")])?;
            let current = inner.head(entries[0].as_ref())?.revision;
            let floor = match &entries[1] {
                Some(kv) => decode::<u64>("the compaction mark", kv.value())?,
                None => 0,
            };
            if after.0 < floor || after.0 > current {
                return Ok(Changes::ResyncNeeded {
                    compacted: Revision(floor),
                    current: Revision(current),
                });
            }
            let mut events = Vec::new();
            let mut from = inner.key(&format!("log/{}", number(after.0 + 1)));
            while events.len() < limit {
                let want = (limit - events.len()).min(PAGE_BATCHES);
                let (batches, more) =
                    match inner.range(&from, prefix_end(&log_prefix), Some(at), want, false) {
                        Ok(page) => page,
                        Err(Failure::Refused(error)) if compacted(&error) => continue 'attempt,
                        Err(failure) => return Err(inner.fail("read the event log", failure)),
                    };
                for kv in &batches {
                    let batch: Batch = decode("an event-log batch", kv.value())?;
                    for (index, (kind, id, change, entity)) in batch.events.into_iter().enumerate()
                    {
                        let revision = Revision(batch.first + index as u64);
                        if revision > after && events.len() < limit {
                            events.push(Event {
                                revision,
                                kind,
                                id,
                                change,
                                entity,
                            });
                        }
                    }
                }
                match batches.last() {
                    Some(last) if more => {
                        let mut next = last.key().to_vec();
                        next.push(0);
                        from = String::from_utf8(next)
                            .map_err(|error| inner.engine("read the event log", error))?;
                    }
                    _ => break,
                }
            }
            return Ok(Changes::Events {
                events,
                current: Revision(current),
            });
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    fn compact(&self, through: Revision) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let mark_key = inner.key("compacted");
        for _ in 0..ATTEMPTS_MAX {
            let (_, entries) = inner.read_keys(&[inner.key("head"), mark_key.clone()])?;
            let current = inner.head(entries[0].as_ref())?.revision;
            let (floor, mark_mod) = match &entries[1] {
                Some(kv) => (
                    decode::<u64>("the compaction mark", kv.value())?,
                    kv.mod_revision(),
                ),
                None => (0, 0),
            };
            let through = through.0.min(current);
            if through <= floor {
                return Ok(());
            }
            // Whole batches whose last revision is at or below `through`; a batch that
            // straddles it stays, and the mark hides its older events.
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    mark_key.as_str(),
                    CompareOp::Equal,
                    mark_mod,
                )])
                .and_then([
                    TxnOp::put(mark_key.as_str(), bytes(&through), None),
                    TxnOp::delete(
                        inner.key("log/"),
                        Some(
                            DeleteOptions::new()
                                .with_range(inner.key(&format!("log/{}", number(through + 1)))),
                        ),
                    ),
                ]);
            if inner.txn("compact the event log", txn)?.succeeded() {
                return Ok(());
            }
        }
        Err(StoreError::Contention {
            attempts: ATTEMPTS_MAX,
        })
    }

    /// etcd's watch on `head` from the etcd revision just after the one read: hears commits
    /// from every process. A `head` rewritten at the same revision (a commit that logged no
    /// event: an operation, an agent's credential or heartbeat) does not wake the caller.
    fn wait_for_change(&self, after: Revision, timeout: Duration) -> bool {
        let inner = &*self.inner;
        let started = std::time::Instant::now();
        let head_key = inner.key("head");
        let Ok((at, entries)) = inner.read_keys(std::slice::from_ref(&head_key)) else {
            std::thread::sleep(timeout.min(Duration::from_millis(50)));
            return false;
        };
        match inner.head(entries[0].as_ref()) {
            Ok(head) if head.revision > after.0 => return true,
            Ok(_) => {}
            Err(_) => return true,
        }
        let remaining = timeout.saturating_sub(started.elapsed());
        let client = inner.client.clone();
        inner.block(async move {
            let deadline = tokio::time::Instant::now() + remaining;
            let mut client = client;
            let options = WatchOptions::new().with_start_revision(at + 1);
            let mut stream = match tokio::time::timeout_at(
                deadline,
                client.watch(head_key, Some(options)),
            )
            .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(_)) => {
                    let pause = tokio::time::Instant::now() + Duration::from_millis(50);
                    tokio::time::sleep_until(pause.min(deadline)).await;
                    return false;
                }
                Err(_) => return false,
            };
            loop {
                match tokio::time::timeout_at(deadline, stream.message()).await {
                    Ok(Ok(Some(response))) => {
                        // Compacted past `at`: wake the caller, who reads again.
                        if response.canceled() {
                            return true;
                        }
                        let grew = response.events().iter().any(|event| {
                            event.kv().is_none_or(|kv| {
                                serde_json::from_slice::<Head>(kv.value())
                                    .map_or(true, |head| head.revision > after.0)
                            })
                        });
                        if grew {
                            return true;
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        let pause = tokio::time::Instant::now() + Duration::from_millis(50);
                        tokio::time::sleep_until(pause.min(deadline)).await;
                        return false;
                    }
                    Err(_) => return false,
                }
            }
        })
    }

    fn revision(&self) -> Result<Revision, StoreError> {
        let inner = &*self.inner;
        let (_, entries) = inner.read_keys(&[inner.key("head")])?;
        Ok(Revision(inner.head(entries[0].as_ref())?.revision))
    }
}

/// A transaction body's view: reads at the etcd revision `at` through its own writes.
struct EtcdTx<'a> {
    inner: &'a Inner,
    at: i64,
    /// The store's revision when the transaction began.
    base: u64,
    now: Timestamp,
    reads: HashMap<String, Option<Vec<u8>>>,
    /// Key → new value (`None`: deleted), one etcd operation each.
    writes: BTreeMap<String, Option<Vec<u8>>>,
    events: Vec<(EntityKind, String, ChangeKind, serde_json::Value)>,
    /// A read found `at` compacted by etcd: the transaction starts over.
    stale: bool,
}

impl EtcdTx<'_> {
    fn failed(&mut self, what: &str, failure: Failure) -> StoreError {
        match failure {
            Failure::Refused(error) if compacted(&error) => {
                self.stale = true;
                StoreError::Contention { attempts: 1 }
            }
            failure => self.inner.fail(what, failure),
        }
    }

    fn get(&mut self, suffix: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.inner.key(suffix);
        if let Some(value) = self.writes.get(&key) {
            return Ok(value.clone());
        }
        if let Some(value) = self.reads.get(&key) {
            return Ok(value.clone());
        }
        let value = match self.inner.get(&key, Some(self.at)) {
            Ok(entry) => entry.map(|kv| kv.value().to_vec()),
            Err(failure) => return Err(self.failed("read", failure)),
        };
        self.reads.insert(key, value.clone());
        Ok(value)
    }

    fn typed<T: serde::de::DeserializeOwned>(
        &mut self,
        suffix: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.get(suffix)? {
            None => Ok(None),
            Some(value) => decode(suffix, &value).map(Some),
        }
    }

    /// Every key under `suffix` with its value, in key order, this transaction's writes
    /// included.
    fn list(&mut self, suffix: &str) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        let prefix = self.inner.key(suffix);
        let mut listed = BTreeMap::new();
        let mut from = prefix.clone();
        loop {
            let (entries, more) =
                match self
                    .inner
                    .range(&from, prefix_end(&prefix), Some(self.at), 0, false)
                {
                    Ok(page) => page,
                    Err(failure) => return Err(self.failed("list", failure)),
                };
            for kv in &entries {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                listed.insert(key, kv.value().to_vec());
            }
            match entries.last() {
                Some(last) if more => {
                    from = format!("{}\0", String::from_utf8_lossy(last.key()));
                }
                _ => break,
            }
        }
        for (key, value) in self.writes.range(prefix.clone()..) {
            if !key.starts_with(&prefix) {
                break;
            }
            match value {
                Some(value) => listed.insert(key.clone(), value.clone()),
                None => listed.remove(key),
            };
        }
        Ok(listed)
    }

    fn put(&mut self, suffix: &str, value: Vec<u8>) {
        self.writes.insert(self.inner.key(suffix), Some(value));
    }

    fn delete(&mut self, suffix: &str) {
        self.writes.insert(self.inner.key(suffix), None);
    }

    fn log(
        &mut self,
        kind: EntityKind,
        id: &str,
        change: ChangeKind,
        entity: serde_json::Value,
    ) -> Revision {
        self.events.push((kind, id.to_owned(), change, entity));
        Revision(self.base + self.events.len() as u64)
    }

    fn document_key(kind: EntityKind, id: &str) -> Result<String, StoreError> {
        crate::sqlite::document_table(kind)?;
        Ok(format!("{kind}/{id}"))
    }
}

impl Tx for EtcdTx<'_> {
    fn now(&self) -> Timestamp {
        self.now
    }

    fn revision(&mut self) -> Result<Revision, StoreError> {
        Ok(Revision(self.base + self.events.len() as u64))
    }

    fn model(&mut self) -> Result<Option<Model>, StoreError> {
        self.typed("model")
    }

    fn put_model(&mut self, model: &Model) -> Result<Revision, StoreError> {
        self.put("model", bytes(model));
        Ok(self.log(
            EntityKind::Model,
            &model.uuid,
            ChangeKind::Change,
            encode(model),
        ))
    }

    fn machine(&mut self, id: &str) -> Result<Option<Machine>, StoreError> {
        self.typed(&format!("machine/{id}"))
    }

    fn machines(&mut self) -> Result<Vec<Machine>, StoreError> {
        self.list("machine/")?
            .into_iter()
            .map(|(key, value)| decode(&key, &value))
            .collect()
    }

    fn put_machine(&mut self, machine: &Machine) -> Result<Revision, StoreError> {
        self.put(&format!("machine/{}", machine.id), bytes(machine));
        Ok(self.log(
            EntityKind::Machine,
            &machine.id,
            ChangeKind::Change,
            encode(machine),
        ))
    }

    fn remove_machine(&mut self, id: &str) -> Result<Option<Revision>, StoreError> {
        let tag = machine_tag(id);
        for key in [
            format!("agent-password/{tag}"),
            format!("agent-status/{tag}"),
        ] {
            if self.get(&key)?.is_some() {
                self.delete(&key);
            }
        }
        let key = format!("machine/{id}");
        let Some(machine) = self.typed::<Machine>(&key)? else {
            return Ok(None);
        };
        self.delete(&key);
        Ok(Some(self.log(
            EntityKind::Machine,
            id,
            ChangeKind::Remove,
            encode(&machine),
        )))
    }

    fn document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let key = Self::document_key(kind, id)?;
        self.typed(&key)
    }

    fn documents(
        &mut self,
        kind: EntityKind,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let prefix = self.inner.key(&Self::document_key(kind, "")?);
        self.list(&Self::document_key(kind, "")?)?
            .into_iter()
            .map(|(key, value)| {
                let document = decode(&key, &value)?;
                Ok((key[prefix.len()..].to_owned(), document))
            })
            .collect()
    }

    fn put_document(
        &mut self,
        kind: EntityKind,
        id: &str,
        document: &serde_json::Value,
    ) -> Result<Revision, StoreError> {
        let key = Self::document_key(kind, id)?;
        self.put(&key, bytes(document));
        Ok(self.log(kind, id, ChangeKind::Change, document.clone()))
    }

    fn remove_document(
        &mut self,
        kind: EntityKind,
        id: &str,
    ) -> Result<Option<Revision>, StoreError> {
        let key = Self::document_key(kind, id)?;
        let Some(document) = self.typed::<serde_json::Value>(&key)? else {
            return Ok(None);
        };
        self.delete(&key);
        Ok(Some(self.log(kind, id, ChangeKind::Remove, document)))
    }

    fn checkpoint(&mut self, key: &StepKey) -> Result<Option<Checkpoint>, StoreError> {
        self.typed(&format!("step/{key}"))
    }

    fn put_checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<Revision, StoreError> {
        let id = checkpoint.key.to_string();
        self.put(&format!("step/{id}"), bytes(checkpoint));
        Ok(self.log(
            EntityKind::Step,
            &id,
            ChangeKind::Change,
            encode(checkpoint),
        ))
    }

    fn operation(&mut self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.typed(&format!("op/{id}"))
    }

    fn put_operation(&mut self, id: &str, result: &serde_json::Value) -> Result<(), StoreError> {
        self.put(&format!("op/{id}"), bytes(result));
        Ok(())
    }

    fn agent_password_hash(&mut self, tag: &str) -> Result<Option<String>, StoreError> {
        self.typed(&format!("agent-password/{tag}"))
    }

    fn set_agent_password_hash(&mut self, tag: &str, phc: &str) -> Result<(), StoreError> {
        self.put(&format!("agent-password/{tag}"), bytes(&phc));
        Ok(())
    }

    fn agent_status(&mut self, tag: &str) -> Result<Option<AgentStatus>, StoreError> {
        self.typed(&format!("agent-status/{tag}"))
    }

    fn agent_statuses(&mut self) -> Result<Vec<(String, AgentStatus)>, StoreError> {
        let prefix = self.inner.key("agent-status/");
        self.list("agent-status/")?
            .into_iter()
            .map(|(key, value)| Ok((key[prefix.len()..].to_owned(), decode(&key, &value)?)))
            .collect()
    }

    fn put_agent_status(&mut self, tag: &str, status: &AgentStatus) -> Result<(), StoreError> {
        self.put(&format!("agent-status/{tag}"), bytes(status));
        Ok(())
    }

    fn record(&mut self) -> Result<Option<(UpgradeInfo, Revision)>, StoreError> {
        Ok(self
            .typed::<StoredRecord>("record/current")?
            .map(|stored| (stored.record, stored.revision)))
    }

    fn last_archived(&mut self) -> Result<Option<UpgradeInfo>, StoreError> {
        // Archived records are never deleted: the newest is the last key, in etcd or in
        // this transaction's writes.
        let prefix = self.inner.key("record/archived/");
        let written = self
            .writes
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .filter_map(|(_, value)| value.clone())
            .last();
        if let Some(value) = written {
            return decode("an archived upgrade-info record", &value).map(Some);
        }
        let newest = match self
            .inner
            .range(&prefix, prefix_end(&prefix), Some(self.at), 1, true)
        {
            Ok((entries, _)) => entries.into_iter().next(),
            Err(failure) => return Err(self.failed("read the archive", failure)),
        };
        newest
            .map(|kv| decode("an archived upgrade-info record", kv.value()))
            .transpose()
    }

    fn put_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        let revision = self.log(
            EntityKind::UpgradeInfo,
            RECORD_CURRENT,
            ChangeKind::Change,
            encode(record),
        );
        self.put(
            "record/current",
            bytes(&StoredRecord {
                record: *record,
                revision,
            }),
        );
        Ok(revision)
    }

    fn archive_record(&mut self, record: &UpgradeInfo) -> Result<Revision, StoreError> {
        let revision = self.log(
            EntityKind::UpgradeInfo,
            RECORD_CURRENT,
            ChangeKind::Remove,
            encode(record),
        );
        self.delete("record/current");
        self.put(
            &format!("record/archived/{}", number(revision.0)),
            bytes(record),
        );
        Ok(revision)
    }
}
