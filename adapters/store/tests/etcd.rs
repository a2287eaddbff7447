//! The etcd engine against real etcd processes (feature `etcd`; run with
//! `cargo test -p lockstep-store --features etcd --test etcd`). The generic suite runs on
//! etcd in `src/suite.rs`; these are what only a real server shows: the lease's TTL on the
//! server, a deposed coordinator's late write, etcd's max-txn-ops, calls from a runtime's
//! blocking pool, a 3-member cluster losing its leader under a stream of writes, and TLS
//! (a cluster that requires client certificates, and the configuration's checks).

#![allow(clippy::print_stderr)]

#[path = "support/etcd_cluster.rs"]
mod etcd_cluster;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_cluster::EtcdCluster;
use lockstep_core::lifecycle::{ControllerId, Revision, StepOutcome};
use lockstep_core::steps::{StepId, StepKey};
use lockstep_core::{Millis, Timestamp, Version};
use lockstep_store::{
    Application, Changes, EntityKind, EtcdConfig, EtcdIdentity, EtcdStore, EtcdTls, Life,
    ManualClock, OperationOutcome, Store, StoreError, Tx,
};

fn key(name: &str) -> StepKey {
    StepKey {
        id: StepId::parse(name).expect("a step id"),
        target_version: Version::new(2, 9, 43),
    }
}

fn add(tx: &mut dyn Tx, name: &str) -> Result<(), lockstep_store::Abort> {
    tx.put_application(&Application {
        name: name.to_owned(),
        charm: format!("ch:amd64/jammy/{name}-1"),
        life: Life::Alive,
    })?;
    Ok(())
}

fn all_events(store: &dyn Store) -> Vec<lockstep_store::Event> {
    match store.changes_since(Revision(0), usize::MAX).unwrap() {
        Changes::Events { events, .. } => events,
        other => panic!("{other:?}"),
    }
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The CA of a TLS cluster, and its client certificate when `identity`.
fn tls_of(cluster: &EtcdCluster, identity: bool) -> EtcdTls {
    let files = cluster.tls().expect("a TLS cluster");
    EtcdTls {
        ca_pem: read(&files.ca),
        identity: identity.then(|| EtcdIdentity {
            cert_pem: read(&files.cert),
            key_pem: read(&files.key),
        }),
    }
}

/// The detail of an engine error (the test fails on any other).
fn engine_detail(error: StoreError) -> String {
    match error {
        StoreError::Engine { detail, .. } => detail,
        other => panic!("not an engine error: {other}"),
    }
}

/// A clock that never moves: only the server's TTL can end a lease.
fn frozen() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)))
}

#[test]
fn etcd_lease_ends_on_the_servers_ttl_and_the_deposed_coordinators_late_write_is_refused() {
    let cluster = EtcdCluster::start(1, &[]);
    let config = EtcdConfig::new(cluster.endpoints()).with_prefix("ttl");
    let a = EtcdStore::connect_with_clock(config.clone(), frozen()).unwrap();
    let b = EtcdStore::connect_with_clock(config, frozen()).unwrap();
    let (c0, c1) = (ControllerId(0), ControllerId(1));
    let ttl = Millis(2000);

    let t1 = a.acquire_lease(c0, ttl).unwrap().expect("free");
    assert_eq!(
        a.run_database_step(key("first"), Some(t1), &mut |tx| add(tx, "a"))
            .unwrap(),
        StepOutcome::Applied
    );
    assert_eq!(b.acquire_lease(c1, ttl).unwrap(), None);
    // Keep-alives carry it past its TTL.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(a.keep_alive_lease(c0, t1).unwrap(), Some(t1));
    }
    assert_eq!(b.acquire_lease(c1, ttl).unwrap(), None, "kept alive");

    // A step of the coordinator is under way when its keep-alives stop: by the time it
    // commits, etcd has expired the lease and controller 1 holds a new one.
    let stopped = Instant::now();
    let mut taken_after = None;
    let outcome = a
        .run_database_step(key("late"), Some(t1), &mut |tx| {
            add(tx, "late")?;
            if taken_after.is_none() {
                loop {
                    if let Some(t2) = b.acquire_lease(c1, ttl).unwrap() {
                        taken_after = Some((stopped.elapsed(), t2));
                        break;
                    }
                    assert!(stopped.elapsed() < Duration::from_secs(15), "never expired");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(outcome, StepOutcome::Fenced, "the late write is refused");
    let (elapsed, t2) = taken_after.unwrap();
    eprintln!("lease with TTL 2 s taken over {elapsed:?} after the last keep-alive");
    assert!(elapsed >= Duration::from_millis(1500), "{elapsed:?}");
    assert!(t2 > t1);
    assert_eq!(a.keep_alive_lease(c0, t1).unwrap(), None, "lost");
    assert_eq!(
        a.run_database_step(key("late"), Some(t1), &mut |tx| add(tx, "late"))
            .unwrap(),
        StepOutcome::Fenced
    );
    assert_eq!(
        b.run_database_step(key("late"), Some(t2), &mut |tx| add(tx, "late"))
            .unwrap(),
        StepOutcome::Applied
    );
    let applications: Vec<String> = all_events(&b)
        .into_iter()
        .filter(|event| event.kind == EntityKind::Application)
        .map(|event| event.id)
        .collect();
    assert_eq!(
        applications,
        ["a", "late"],
        "the deposed write left nothing"
    );
    // The lease as stored is controller 1's.
    let lease = b.lease().unwrap().unwrap();
    assert_eq!((lease.holder, lease.token), (c1, t2));
    assert!(b.release_lease(c1, t2).unwrap());
}

#[test]
fn etcd_refuses_a_transaction_over_max_txn_ops_and_commits_it_when_raised() {
    let cluster = EtcdCluster::start(1, &["--max-txn-ops=1024"]);
    let store =
        EtcdStore::connect(EtcdConfig::new(cluster.endpoints()).with_prefix("ops")).unwrap();
    let mut big = |tx: &mut dyn Tx| {
        for index in 0..200 {
            add(tx, &format!("app-{index}"))?;
        }
        Ok(())
    };
    let error = store.transaction(None, &mut big).unwrap_err();
    assert!(
        matches!(&error, StoreError::Engine { detail, .. } if detail.contains("max-txn-ops")),
        "{error}"
    );
    assert_eq!(store.revision().unwrap(), Revision(0), "nothing written");
    // Writing one key many times is one operation; every event is still logged.
    store
        .transaction(None, &mut |tx| {
            for _ in 0..200 {
                add(tx, "same")?;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(store.revision().unwrap(), Revision(200));

    let mut config = EtcdConfig::new(cluster.endpoints()).with_prefix("ops-raised");
    config.max_txn_ops = 1024;
    let raised = EtcdStore::connect(config).unwrap();
    raised.transaction(None, &mut big).unwrap();
    assert_eq!(all_events(&raised).len(), 200);
}

#[test]
fn etcd_store_works_from_a_runtimes_blocking_pool_and_drops_inside_a_task() {
    let cluster = EtcdCluster::start(1, &[]);
    let endpoints = cluster.endpoints();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = tokio::task::spawn_blocking(move || {
            EtcdStore::connect(EtcdConfig::new(endpoints).with_prefix("blocking"))
        })
        .await
        .unwrap()
        .unwrap();
        let handle = store.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let token = handle.acquire_lease(ControllerId(0), Millis(5000)).unwrap();
            handle.run_database_step(key("from-the-pool"), token, &mut |tx| add(tx, "pooled"))
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(outcome, StepOutcome::Applied);
        let handle = store.clone();
        let replayed = tokio::task::spawn_blocking(move || {
            handle.apply_operation("op", &mut |tx| {
                add(tx, "op")?;
                Ok(serde_json::json!("done"))
            })
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            replayed,
            OperationOutcome::Applied(serde_json::json!("done"))
        );
        // The last handles are dropped on a worker thread of the caller's runtime.
        drop(store);
    });
}

/// A 3-member cluster; a writer streams operations, fenced database steps and keep-alives
/// while the raft leader is killed with SIGKILL: every call rides through on retries, every
/// operation and step is applied exactly once, and revisions stay consecutive.
#[test]
fn etcd_writes_ride_through_a_leader_kill_in_a_three_member_cluster() {
    const WRITES: usize = 300;
    const KILL_AT: usize = 60;
    let mut cluster = EtcdCluster::start(3, &[]);
    let store =
        EtcdStore::connect(EtcdConfig::new(cluster.all_endpoints()).with_prefix("failover"))
            .unwrap();
    let token = store
        .acquire_lease(ControllerId(0), Millis(10_000))
        .unwrap()
        .unwrap();
    let progress = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (store, progress) = (store.clone(), progress.clone());
        std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            for index in 0..WRITES {
                let started = Instant::now();
                let outcome = store
                    .apply_operation(&format!("op-{index}"), &mut |tx| {
                        add(tx, &format!("app-{index}"))?;
                        Ok(serde_json::json!(index))
                    })
                    .unwrap_or_else(|error| panic!("operation {index}: {error}"));
                assert_eq!(outcome, OperationOutcome::Applied(serde_json::json!(index)));
                if index % 3 == 0 {
                    let step = key(&format!("step-{index}"));
                    let outcome = store
                        .run_database_step(step, Some(token), &mut |tx| {
                            add(tx, &format!("step-app-{index}"))
                        })
                        .unwrap_or_else(|error| panic!("step {index}: {error}"));
                    assert_eq!(outcome, StepOutcome::Applied, "step {index}");
                }
                if index % 10 == 0 {
                    let kept = store
                        .keep_alive_lease(ControllerId(0), token)
                        .unwrap_or_else(|error| panic!("keep-alive {index}: {error}"));
                    assert_eq!(kept, Some(token), "keep-alive {index}");
                }
                slowest = slowest.max(started.elapsed());
                progress.store(index + 1, Ordering::SeqCst);
            }
            slowest
        })
    };
    while progress.load(Ordering::SeqCst) < KILL_AT {
        assert!(!writer.is_finished(), "the writer stopped early");
        std::thread::sleep(Duration::from_millis(5));
    }
    let leader = cluster.leader().expect("a leader");
    let killed_at = progress.load(Ordering::SeqCst);
    cluster.kill(leader);
    let slowest = writer.join().expect("the writer rode through");
    eprintln!(
        "killed leader {} at write {killed_at}; slowest iteration {slowest:?}",
        cluster.members()[leader].name
    );
    // Exactly once: each application once, consecutive revisions, one checkpoint a step.
    let events = all_events(&store);
    let revisions: Vec<u64> = events.iter().map(|event| event.revision.0).collect();
    assert_eq!(revisions, (1..=events.len() as u64).collect::<Vec<_>>());
    let mut applications: Vec<&str> = events
        .iter()
        .filter(|event| event.kind == EntityKind::Application)
        .map(|event| event.id.as_str())
        .collect();
    let steps = events
        .iter()
        .filter(|event| event.kind == EntityKind::Step)
        .count();
    assert_eq!(steps, WRITES.div_ceil(3));
    applications.sort_unstable();
    let total = applications.len();
    applications.dedup();
    assert_eq!(applications.len(), total, "an application written twice");
    assert_eq!(total, WRITES + WRITES.div_ceil(3));
    assert_eq!(
        store.lease().unwrap().map(|lease| lease.token),
        Some(token),
        "the lease survived the failover"
    );
}

/// A 1-member cluster over TLS that requires client certificates: a store with the CA and
/// the client's certificate writes, reads, holds the lease and hears a commit on its watch.
#[test]
fn etcd_over_tls_with_a_client_certificate_writes_reads_and_watches() {
    let cluster = EtcdCluster::start_tls(1, &[]);
    let endpoints = cluster.endpoints();
    assert!(
        endpoints
            .iter()
            .all(|endpoint| endpoint.starts_with("https://"))
    );
    let config = EtcdConfig::new(endpoints)
        .with_prefix("tls")
        .with_tls(tls_of(&cluster, true));
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("PRIVATE KEY"),
        "the key is never printed: {debug}"
    );
    let store = EtcdStore::connect(config).unwrap();

    store.transaction(None, &mut |tx| add(tx, "first")).unwrap();
    let token = store
        .acquire_lease(ControllerId(0), Millis(5000))
        .unwrap()
        .expect("free");
    assert_eq!(
        store
            .run_database_step(key("over-tls"), Some(token), &mut |tx| add(tx, "stepped"))
            .unwrap(),
        StepOutcome::Applied
    );
    let at = store.revision().unwrap();
    assert_eq!(at, Revision(3), "two applications and a checkpoint");

    // A watcher from `at` hears the next commit, from another handle over TLS.
    let watcher = {
        let store = store.clone();
        std::thread::spawn(move || store.wait_for_change(at, Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(200));
    store
        .transaction(None, &mut |tx| add(tx, "watched"))
        .unwrap();
    assert!(watcher.join().unwrap(), "woken by the commit");
    let events = match store.changes_since(at, usize::MAX).unwrap() {
        Changes::Events { events, current } => {
            assert_eq!(current, Revision(4));
            events
        }
        other => panic!("{other:?}"),
    };
    let ids: Vec<&str> = events.iter().map(|event| event.id.as_str()).collect();
    assert_eq!(ids, ["watched"]);
    let applications: Vec<String> = all_events(&store)
        .into_iter()
        .filter(|event| event.kind == EntityKind::Application)
        .map(|event| event.id)
        .collect();
    assert_eq!(applications, ["first", "stepped", "watched"]);
    assert!(store.release_lease(ControllerId(0), token).unwrap());
}

/// The same cluster refuses a client that trusts its CA but shows no certificate: the
/// first call fails once its retries run out, and writes nothing.
#[test]
fn etcd_over_tls_refuses_a_client_without_a_certificate() {
    let cluster = EtcdCluster::start_tls(1, &[]);
    let mut config = EtcdConfig::new(cluster.endpoints())
        .with_prefix("anonymous")
        .with_tls(tls_of(&cluster, false));
    config.retry_for = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(1);
    let bound = config.retry_for + config.request_timeout + Duration::from_secs(2);
    let anonymous = EtcdStore::connect(config).unwrap();
    let started = Instant::now();
    let error = anonymous
        .transaction(None, &mut |tx| add(tx, "anonymous"))
        .unwrap_err();
    let elapsed = started.elapsed();
    eprintln!("refused after {elapsed:?}: {error}");
    assert!(matches!(error, StoreError::Engine { .. }), "{error}");
    assert!(elapsed < bound, "{elapsed:?}");
    // For want of a client certificate, not for anything else.
    let log = read(&cluster.dir().join("m0.log"));
    let refusals: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("rejected connection"))
        .collect();
    assert!(
        !refusals.is_empty()
            && refusals
                .iter()
                .all(|line| line.contains("didn't provide a certificate")),
        "{refusals:#?}"
    );

    // With the client certificate, the cluster answers: nothing was written.
    let store = EtcdStore::connect(
        EtcdConfig::new(cluster.endpoints())
            .with_prefix("anonymous")
            .with_tls(tls_of(&cluster, true)),
    )
    .unwrap();
    assert_eq!(store.revision().unwrap(), Revision(0));
}

/// The scheme and the TLS setting must agree, and PEM must parse: refused at connect with
/// an error naming the endpoint, or what did not parse. No cluster needed.
#[test]
fn etcd_tls_configuration_is_checked_at_connect() {
    let https = "https://127.0.0.1:1";
    let detail = engine_detail(EtcdStore::connect(EtcdConfig::new([https])).unwrap_err());
    assert!(
        detail.contains(https) && detail.contains("no TLS"),
        "{detail}"
    );

    // Real PEM, made without a cluster.
    let dir = tempfile::tempdir().unwrap();
    let cluster_files = etcd_cluster::write_certificates(dir.path()).unwrap();
    let tls = EtcdTls {
        ca_pem: read(&cluster_files.ca),
        identity: Some(EtcdIdentity {
            cert_pem: read(&cluster_files.cert),
            key_pem: read(&cluster_files.key),
        }),
    };
    let http = "http://127.0.0.1:1";
    let detail = engine_detail(
        EtcdStore::connect(EtcdConfig::new([https, http]).with_tls(tls.clone())).unwrap_err(),
    );
    assert!(
        detail.contains(http) && detail.contains("plain http"),
        "{detail}"
    );

    // Good PEM connects (lazily: nothing listens there).
    EtcdStore::connect(EtcdConfig::new([https]).with_tls(tls.clone())).unwrap();
    // A scheme-less endpoint follows the setting.
    EtcdStore::connect(EtcdConfig::new(["127.0.0.1:1"]).with_tls(tls.clone())).unwrap();

    let broken = |change: &dyn Fn(&mut EtcdTls)| {
        let mut tls = tls.clone();
        change(&mut tls);
        engine_detail(EtcdStore::connect(EtcdConfig::new([https]).with_tls(tls)).unwrap_err())
    };
    let detail = broken(&|tls| tls.ca_pem = "not a certificate".to_owned());
    assert!(detail.contains("CA certificate"), "{detail}");
    let detail = broken(&|tls| {
        let identity = tls.identity.as_mut().unwrap();
        identity.cert_pem = identity.cert_pem.replacen('M', "!", 1);
    });
    assert!(detail.contains("client certificate"), "{detail}");
    let detail = broken(&|tls| {
        let identity = tls.identity.as_mut().unwrap();
        identity.key_pem = identity.cert_pem.clone();
    });
    assert!(detail.contains("client key"), "{detail}");
    let detail = broken(&|tls| {
        let identity = tls.identity.as_mut().unwrap();
        let lines: Vec<&str> = identity.key_pem.lines().collect();
        identity.key_pem = [&lines[..2], &lines[3..]].concat().join("\n");
    });
    assert!(detail.contains("client key"), "{detail}");
}
