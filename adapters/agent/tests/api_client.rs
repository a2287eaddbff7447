//! lockstep's client against the transport's server over the agent's shared state on a
//! real store: across a restart of the server (same port, same SQLite file) it applies a
//! deploy once and its watcher delivers every change exactly once, in order; and it fails
//! over to another controller of the same model (one store). The transport's
//! `tests/client.rs` runs the same client tests over its in-memory state.

use crate::api_support;

use std::sync::Arc;
use std::time::Duration;

use api_support::*;
use lockstep_core::Phase;
use lockstep_core::client::RetryPolicy;
use lockstep_core::lifecycle::Revision;
use lockstep_core::{Millis, Version};
use lockstep_store::{OpenMode, SqliteStore, Store};
use lockstep_transport::client::{Client, ClientConfig};
use lockstep_transport::tls::Credentials;
use serde_json::json;

fn client(fixture: &Fixture) -> Client {
    Client::new(client_config(fixture))
}

fn client_config(fixture: &Fixture) -> ClientConfig {
    ClientConfig {
        address: format!("127.0.0.1:{}", fixture.port),
        fallback_addresses: Vec::new(),
        ca_pem: fixture.ca_pem.clone(),
        model_uuid: Some(MODEL_UUID.into()),
        user: "admin".into(),
        password: PASSWORD.into(),
        retry: RetryPolicy {
            initial: Millis(20),
            maximum: Millis(200),
            attempts_max: 1_000,
        },
        client_id: "test-client".into(),
    }
}

fn deploy(name: &str) -> serde_json::Value {
    json!({"applications": [{"application": name, "charm-url": format!("ch:{name}"), "num-units": 1}]})
}

fn collect(
    batch: Vec<lockstep_transport::client::Delta>,
    delivered: &mut Vec<Revision>,
    names: &mut Vec<String>,
) {
    for delta in batch {
        delivered.push(delta.revision);
        let entity = &delta.delta[2];
        let name = entity.get("name").or_else(|| entity.get("id")).unwrap();
        names.push(format!(
            "{}:{}",
            delta.delta[0].as_str().unwrap(),
            name.as_str().unwrap()
        ));
    }
}

const LONG: Duration = Duration::from_secs(30);

/// Reads `watcher` until `applications` applications have been delivered in all, then checks
/// that every revision came once and in order.
async fn watch_until_applications(
    watcher: &mut lockstep_transport::client::Watcher<'_>,
    delivered: &mut Vec<Revision>,
    names: &mut Vec<String>,
    applications: usize,
) {
    while names
        .iter()
        .filter(|name| name.starts_with("application:"))
        .count()
        < applications
    {
        collect(watcher.next(LONG).await.unwrap(), delivered, names);
    }
    assert!(
        delivered.windows(2).all(|pair| pair[0] < pair[1]),
        "in order, none twice: {delivered:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn across_a_restart_a_deploy_is_applied_once_and_the_watcher_loses_nothing() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("client-restart-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let open =
        || -> Arc<dyn Store> { Arc::new(SqliteStore::open(&path, OpenMode::ReadWrite).unwrap()) };
    let credentials = Credentials::generate("test", &[]).unwrap();
    let first = start_with(Phase::Ready, open(), 0, credentials.clone()).await;
    let port = first.port;
    let client = Arc::new(client(&first));

    let mut watcher = client.watch();
    let snapshot = watcher.next(LONG).await.unwrap();
    assert_eq!(snapshot.len(), 1, "the whole state: the model");
    client
        .mutate("Application", 20, "Deploy", deploy("a"), LONG)
        .await
        .unwrap();
    let mut delivered: Vec<Revision> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    collect(
        watcher.next(LONG).await.unwrap(),
        &mut delivered,
        &mut names,
    );

    // The agent dies: its server and every connection end.
    first.server.abort();
    drop(first);
    // A deploy issued while it is down retries until it is back.
    let deploying = tokio::spawn({
        let client = Arc::clone(&client);
        async move {
            client
                .mutate("Application", 20, "Deploy", deploy("b"), LONG)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = start_with(Phase::Ready, open(), port, credentials).await;
    assert_eq!(deploying.await.unwrap().unwrap(), json!({"results": [{}]}));
    client
        .mutate("Application", 20, "Deploy", deploy("c"), LONG)
        .await
        .unwrap();

    watch_until_applications(&mut watcher, &mut delivered, &mut names, 3).await;
    assert_eq!(
        names,
        [
            "application:a",
            "machine:0",
            "unit:a/0",
            "application:b",
            "machine:1",
            "unit:b/0",
            "application:c",
            "machine:2",
            "unit:c/0"
        ]
    );
    let status = client
        .call("Client", 8, "FullStatus", json!({}), LONG)
        .await
        .unwrap();
    assert_eq!(
        status["applications"].as_object().unwrap().len(),
        3,
        "each deploy applied once"
    );
    assert_eq!(
        second.store.load_model().unwrap().unwrap().agent_version,
        Version::new(2, 9, 43)
    );
    drop(second);
    let _ = std::fs::remove_file(&path);
}

/// Two controllers serving one model (one store, as highly available controllers share
/// etcd): a client whose first address is dead connects to the next, and when the controller
/// it uses goes away it carries on through the other: each deploy applied once, its watcher
/// losing nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_fails_over_to_another_controller_of_the_same_model() {
    let store: Arc<dyn Store> = Arc::new(lockstep_store::MemoryStore::new(
        lockstep_store::Durability::Full,
    ));
    let credentials = Credentials::generate("test", &[]).unwrap();
    let first = start_with(Phase::Ready, Arc::clone(&store), 0, credentials.clone()).await;
    let second = start_with(Phase::Ready, Arc::clone(&store), 0, credentials).await;
    // Nothing listens on the first address: a port bound, then freed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let client = Client::new(ClientConfig {
        address: dead,
        fallback_addresses: vec![
            format!("127.0.0.1:{}", first.port),
            format!("127.0.0.1:{}", second.port),
        ],
        ..client_config(&first)
    });
    let mut watcher = client.watch();
    assert_eq!(watcher.next(LONG).await.unwrap().len(), 1, "the model");
    client
        .mutate("Application", 20, "Deploy", deploy("a"), LONG)
        .await
        .unwrap();
    assert!(client.stats().disconnected >= 1, "{:?}", client.stats());

    // The controller in use dies: the next call and the watcher go to the other one.
    first.server.abort();
    drop(first);
    client
        .mutate("Application", 20, "Deploy", deploy("b"), LONG)
        .await
        .unwrap();
    let mut delivered: Vec<Revision> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    watch_until_applications(&mut watcher, &mut delivered, &mut names, 2).await;
    assert_eq!(
        names,
        [
            "application:a",
            "machine:0",
            "unit:a/0",
            "application:b",
            "machine:1",
            "unit:b/0"
        ]
    );
    let status = client
        .call("Client", 8, "FullStatus", json!({}), LONG)
        .await
        .unwrap();
    assert_eq!(status["applications"].as_object().unwrap().len(), 2);
    drop(second);
}
