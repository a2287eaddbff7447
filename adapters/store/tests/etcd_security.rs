//! Who may use the etcd engine (feature `etcd`; run with
//! `cargo test -p lockstep-store --features etcd --test etcd_security`): etcd's user
//! authentication against a real etcd with it enabled (the right user works; a wrong
//! password, no user, a user outside its prefix, and a user given to an etcd without
//! authentication are refused with a reason naming the user and never the password; an
//! expired token is renewed), and plain http off loopback refused before anything connects.

#![allow(clippy::print_stderr)]

#[path = "support/etcd_cluster.rs"]
mod etcd_cluster;

use std::time::{Duration, Instant};

use etcd_cluster::EtcdCluster;
use lockstep_core::Millis;
use lockstep_core::lifecycle::ControllerId;
use lockstep_store::{Application, EtcdConfig, EtcdStore, Life, Store, StoreError, Tx};

const USER: &str = "lockstep";
const PASSWORD: &str = "the-right-password";
const WRONG: &str = "a-wrong-password";

fn add(tx: &mut dyn Tx, name: &str) -> Result<(), lockstep_store::Abort> {
    tx.put_application(&Application {
        name: name.to_owned(),
        charm: format!("ch:amd64/jammy/{name}-1"),
        life: Life::Alive,
    })?;
    Ok(())
}

/// A 1-member cluster with authentication: user `lockstep` may read and write `lockstep/`.
fn with_auth(extra: &[&str]) -> EtcdCluster {
    let cluster = EtcdCluster::start(1, extra);
    cluster.enable_auth("root-password", &[(USER, PASSWORD, "lockstep/")]);
    cluster
}

/// A configuration that gives up soon: refusals must not wait for it.
fn config(cluster: &EtcdCluster, prefix: &str) -> EtcdConfig {
    let mut config = EtcdConfig::new(cluster.endpoints()).with_prefix(prefix);
    config.retry_for = Duration::from_secs(10);
    config.request_timeout = Duration::from_secs(2);
    config
}

/// The detail of a refusal of credentials (the test fails on any other error).
fn denied(error: StoreError) -> String {
    match error {
        StoreError::Denied { detail, .. } => detail,
        other => panic!("not a refusal of credentials: {other}"),
    }
}

#[test]
fn etcd_with_authentication_serves_its_user_and_refuses_a_wrong_password_naming_the_user() {
    let cluster = with_auth(&[]);
    let store =
        EtcdStore::connect(config(&cluster, "lockstep/auth").with_user(USER, PASSWORD)).unwrap();
    store
        .transaction(None, &mut |tx| add(tx, "served"))
        .unwrap();
    let token = store
        .acquire_lease(ControllerId(0), Millis(5000))
        .unwrap()
        .expect("the lease is free");
    assert!(store.release_lease(ControllerId(0), token).unwrap());
    assert!(store.revision().unwrap().0 >= 1);
    drop(store);

    for (user, password) in [(USER, WRONG), ("nobody", PASSWORD)] {
        let started = Instant::now();
        let error = EtcdStore::connect(config(&cluster, "lockstep/auth").with_user(user, password))
            .unwrap_err();
        let elapsed = started.elapsed();
        let message = error.to_string();
        let detail = denied(error);
        eprintln!("{user}: refused after {elapsed:?}: {message}");
        assert!(
            detail.contains(&format!(
                "etcd refused user {user:?}: wrong user name or password"
            )),
            "{detail}"
        );
        assert!(!message.contains(password), "{message}");
        // Refused at once, not retried as if etcd were unreachable.
        assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    }
}

#[test]
fn etcd_with_authentication_refuses_a_client_without_a_user_saying_so() {
    let cluster = with_auth(&[]);
    let anonymous = EtcdStore::connect(config(&cluster, "lockstep/anonymous")).unwrap();
    let started = Instant::now();
    let error = anonymous
        .transaction(None, &mut |tx| add(tx, "anonymous"))
        .unwrap_err();
    let elapsed = started.elapsed();
    let detail = denied(error);
    assert!(
        detail.contains("etcd has authentication enabled and this client gave no user"),
        "{detail}"
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    // Nothing was written: the user sees an empty store.
    let store =
        EtcdStore::connect(config(&cluster, "lockstep/anonymous").with_user(USER, PASSWORD))
            .unwrap();
    assert_eq!(store.revision().unwrap().0, 0);
}

#[test]
fn etcd_denies_a_user_outside_its_prefix_naming_the_prefix() {
    let cluster = with_auth(&[]);
    let store = EtcdStore::connect(config(&cluster, "elsewhere").with_user(USER, PASSWORD))
        .expect("the user authenticates");
    let detail = denied(
        store
            .transaction(None, &mut |tx| add(tx, "elsewhere"))
            .unwrap_err(),
    );
    assert!(
        detail.contains(&format!(
            "etcd denied user {USER:?} access to elsewhere/: grant its role readwrite"
        )),
        "{detail}"
    );
}

#[test]
fn an_etcd_user_given_to_an_etcd_without_authentication_is_refused() {
    let cluster = EtcdCluster::start(1, &[]);
    let detail =
        denied(EtcdStore::connect(config(&cluster, "open").with_user(USER, PASSWORD)).unwrap_err());
    assert!(
        detail.contains(&format!(
            "user {USER:?} was configured but etcd has authentication disabled"
        )),
        "{detail}"
    );
}

/// etcd forgets a simple token `--auth-token-ttl` after its last use: a controller quiet for
/// longer must log in again, not fail its next call.
#[test]
fn an_expired_etcd_token_is_renewed_and_the_next_call_succeeds() {
    let cluster = with_auth(&["--auth-token-ttl=1"]);
    let store =
        EtcdStore::connect(config(&cluster, "lockstep/quiet").with_user(USER, PASSWORD)).unwrap();
    store
        .transaction(None, &mut |tx| add(tx, "before"))
        .unwrap();
    // The server's token keeper runs about every second: past two TTLs the token is gone.
    std::thread::sleep(Duration::from_secs(4));
    store.transaction(None, &mut |tx| add(tx, "after")).unwrap();
    assert!(store.revision().unwrap().0 >= 2);
}

/// No cluster and no traffic: the refusal comes before the client exists.
#[test]
fn a_plain_endpoint_off_loopback_is_refused_at_connect_naming_it_unless_insecure() {
    for endpoint in [
        "http://192.0.2.1:2379",
        "192.0.2.1:2379",
        "http://[2001:db8::1]:2379",
    ] {
        let message = EtcdStore::connect(EtcdConfig::new([endpoint]))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains(&format!(
                "endpoint {endpoint} is plain http to a host that is not loopback"
            )) && message.contains("insecure"),
            "{message}"
        );
    }
    // Loopback is accepted (the client connects lazily: nothing listens there).
    for endpoint in ["http://127.0.0.1:1", "localhost:1", "http://[::1]:1"] {
        EtcdStore::connect(EtcdConfig::new([endpoint]))
            .unwrap_or_else(|error| panic!("{endpoint}: {error}"));
    }
}
