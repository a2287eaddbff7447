//! A client's websocket leased to a "worker" (`leased::serve` over the client's own socket,
//! its session carried on by `records.rs` and kept in a `journal.rs` journal): the client
//! logs in, adds a machine, watches, and leaves a `Next` waiting; the worker's task is
//! dropped, as a worker's death ends it; the journal, read as the launcher would read it,
//! holds what the launcher keeps of a relayed connection (the login, the watcher's
//! position) and no call answered, and the waiting `Next` is in exactly one of two places:
//! in the kept calls, if a commit followed it (here, the pong to the client's ping), or
//! else still in the read ring, read again by the launcher that takes the connection back.

mod support;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use lockstep_core::Phase;
use lockstep_transport::journal::{self, Journal, JournaledStream, Lease, Shape};
use lockstep_transport::leased::{self, FrameBounded, Kept, Stamps};
use lockstep_transport::records::{self, RecordStream, Session as Records};
use lockstep_transport::session::Session;
use lockstep_transport::tls::{Credentials, client_config};
use serde_json::json;
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

const SHAPE: Shape = Shape::API;

#[tokio::test]
async fn a_call_taken_and_committed_is_kept_and_not_read_again() {
    taken_back(true).await;
}

#[tokio::test]
async fn a_call_taken_and_not_committed_is_read_again_and_not_kept() {
    taken_back(false).await;
}

/// A client connected to a leased connection's worker over real TLS and TCP, and what the
/// launcher holds of it: a duplicate of the socket, the journal mapped, the lease.
struct Leased {
    client: Socket,
    worker: tokio::task::JoinHandle<()>,
    launchers_view: Journal,
    lease: Lease,
    kept_socket: std::net::TcpStream,
    fixture: Fixture,
}

async fn leased() -> Leased {
    let credentials = Credentials::generate("leased", &["127.0.0.1".parse().unwrap()]).unwrap();
    let server_config = credentials.server_config().unwrap();
    let fixture = start_with(Phase::Ready, fresh_state(), 0, credentials).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let client_tls = client_config(&fixture.ca_pem, &[&rustls::version::TLS13]).unwrap();
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(client_tls)
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap();
        WebSocketStream::from_raw_socket(tls, Role::Client, None).await
    });

    // The worker's side: the socket (a duplicate kept here, as the launcher keeps one),
    // its session taken from rustls, a journal, the websocket read a frame at a time.
    let (tcp, peer) = listener.accept().await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let kept_socket = tcp.into_std().unwrap();
    let tcp = TcpStream::from_std(kept_socket.try_clone().unwrap()).unwrap();
    let (tcp, session) = records::accept(&server_config, tcp).await.unwrap();
    let journal = Journal::create(SHAPE, session.suite).unwrap();
    let launchers_view = Journal::open(
        rustix::io::fcntl_dupfd_cloexec(journal.file(), 3).unwrap(),
        SHAPE,
        session.suite,
    )
    .unwrap();
    let lease = Lease {
        shape: SHAPE,
        counters: journal::socket_counters(tcp.as_fd()).unwrap(),
        session,
        read_ahead: Vec::new(),
        skip: 0,
        app: Kept::default().encode(),
    };
    let stream = JournaledStream::new(tcp, journal, &lease).unwrap();
    let socket =
        WebSocketStream::from_raw_socket(FrameBounded::new(stream), Role::Server, None).await;
    let stamps = Stamps {
        boot: "0123456789abcdef".to_owned(),
        connection: 7,
    };
    let api = Arc::clone(&fixture.api);
    let worker = tokio::spawn(async move {
        let session = Session::relayed(None, peer);
        let _ = leased::serve(&api, &session, &stamps, Kept::default(), socket).await;
    });

    let client = client.await.unwrap();
    Leased {
        client,
        worker,
        launchers_view,
        lease,
        kept_socket,
        fixture,
    }
}

async fn taken_back(ping_after_next: bool) {
    let Leased {
        mut client,
        worker,
        launchers_view,
        lease,
        kept_socket,
        fixture: _fixture,
    } = leased().await;
    assert_eq!(
        login(&mut client).await["response"]["user-info"]["identity"],
        "user-admin"
    );
    let added = call(
        &mut client,
        2,
        "Client",
        8,
        "AddMachines",
        json!({"params": [{"jobs": ["JobHostUnits"]}]}),
    )
    .await;
    assert!(added.get("error").is_none(), "{added}");
    let watch = call(&mut client, 3, "Client", 8, "WatchAll", json!({})).await;
    let id = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"});
    send(&mut client, next(4)).await;
    let snapshot = receive(&mut client).await;
    let delivered = snapshot["response"]["revision"].as_u64().unwrap();
    // A Next that waits: nothing changes.
    send(&mut client, next(5)).await;
    if ping_after_next {
        // The pong is written only after a commit: the Next is in it.
        use futures_util::SinkExt;
        client
            .send(Message::Ping("keepalive".into()))
            .await
            .unwrap();
        loop {
            if let Message::Pong(_) = client.next().await.unwrap().unwrap() {
                break;
            }
        }
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The worker dies.
    worker.abort();
    let _ = worker.await;
    let recovered = journal::recover(&launchers_view, &lease, kept_socket.as_fd()).unwrap();
    let kept = Kept::decode(&recovered.app).unwrap();
    assert_eq!(
        kept.login.as_ref().map(|login| login.tag.as_str()),
        Some("user-admin")
    );
    assert_eq!(kept.watchers.get(&id), Some(&Some(delivered)), "{kept:?}");
    assert!(recovered.unwritten.is_empty(), "every reply was written");

    // Taken back as the launcher would.
    let tcp = TcpStream::from_std(kept_socket).unwrap();
    let resumed = RecordStream::resume(
        tcp,
        Records::new(&recovered.session).unwrap(),
        recovered.read_ahead,
        recovered.skip,
    );
    let mut taken_back = WebSocketStream::from_raw_socket(resumed, Role::Server, None).await;
    if ping_after_next {
        assert_eq!(kept.pending.len(), 1, "only the waiting Next: {kept:?}");
        assert_eq!(kept.pending[0].request_id, 5);
        assert_eq!(
            kept.pending[0].operation_id, None,
            "a read carries no stamp"
        );
    } else {
        assert!(kept.pending.is_empty(), "{kept:?}");
        let again = taken_back.next().await.unwrap().unwrap();
        assert!(
            again.to_text().unwrap().contains("\"request-id\":5"),
            "{again:?}"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), taken_back.next())
            .await
            .is_err(),
        "a message the journal had absorbed came again"
    );
    // And the client, on the same connection, is heard by the launcher.
    send(
        &mut client,
        json!({"request-id": 6, "type": "Pinger", "version": 1, "request": "Ping", "params": {}}),
    )
    .await;
    let ping = taken_back.next().await.unwrap().unwrap();
    assert!(
        ping.to_text().unwrap().contains("\"request-id\":6"),
        "{ping:?}"
    );
}

#[tokio::test]
async fn a_call_too_large_for_the_journal_beside_those_waiting_is_taken_once_one_is_answered() {
    let Leased {
        mut client,
        worker,
        launchers_view,
        lease,
        kept_socket,
        fixture,
    } = leased().await;
    login(&mut client).await;
    // Two watchers, each with a large Next that waits for a change: each frame near the
    // API's largest, two fit in the journal's kept state, a third not.
    let pad = "p".repeat(900 << 10);
    let mut ids = Vec::new();
    for request_id in [2, 3] {
        let watch = call(&mut client, request_id, "Client", 8, "WatchAll", json!({})).await;
        ids.push(watch["response"]["watcher-id"].as_str().unwrap().to_owned());
    }
    let next = |request_id: u64, id: &str| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next", "params": {"pad": pad}});
    for (request_id, id) in [(4, &ids[0]), (5, &ids[1])] {
        send(&mut client, next(request_id, id)).await;
        let snapshot = receive(&mut client).await;
        assert_eq!(snapshot["request-id"], request_id, "{snapshot}");
    }
    send(&mut client, next(6, &ids[0])).await;
    send(&mut client, next(7, &ids[1])).await;
    send(&mut client, json!({"request-id": 8, "type": "Pinger", "version": 1, "request": "Ping", "params": {"pad": pad}})).await;
    // The ping waits behind the two Nexts until one is answered.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), receive(&mut client))
            .await
            .is_err(),
        "a call was answered that the journal had no room to keep"
    );
    fixture.state.add_machine(lockstep_core::Roles::of(&[
        lockstep_core::Role::HostMachine,
    ]));
    let mut answered = Vec::new();
    for _ in 0..3u8 {
        let reply = tokio::time::timeout(Duration::from_secs(30), receive(&mut client))
            .await
            .expect("three answers");
        assert!(reply.get("error").is_none(), "{reply}");
        answered.push(reply["request-id"].as_u64().unwrap());
    }
    assert_ne!(
        answered[0], 8,
        "a Next was answered first, then the ping taken: {answered:?}"
    );
    answered.sort();
    assert_eq!(answered, [6, 7, 8]);

    // What the journal holds: the large call kept whole while it waited is gone with its
    // answer.
    worker.abort();
    let _ = worker.await;
    let recovered = journal::recover(&launchers_view, &lease, kept_socket.as_fd()).unwrap();
    let kept = Kept::decode(&recovered.app).unwrap();
    assert!(
        kept.pending.is_empty(),
        "{:?}",
        kept.pending
            .iter()
            .map(|c| c.request_id)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_large_call_waiting_is_kept_whole() {
    let Leased {
        mut client,
        worker,
        launchers_view,
        lease,
        kept_socket,
        fixture: _fixture,
    } = leased().await;
    login(&mut client).await;
    let watch = call(&mut client, 2, "Client", 8, "WatchAll", json!({})).await;
    let id = watch["response"]["watcher-id"].as_str().unwrap().to_owned();
    let pad = "p".repeat(300 << 10);
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next", "params": {"pad": pad}});
    send(&mut client, next(3)).await;
    receive(&mut client).await;
    let waiting = next(4).to_string();
    client.send(Message::text(waiting.clone())).await.unwrap();
    client
        .send(Message::Ping("keepalive".into()))
        .await
        .unwrap();
    loop {
        if let Message::Pong(_) = client.next().await.unwrap().unwrap() {
            break;
        }
    }
    worker.abort();
    let _ = worker.await;
    let recovered = journal::recover(&launchers_view, &lease, kept_socket.as_fd()).unwrap();
    let kept = Kept::decode(&recovered.app).unwrap();
    assert_eq!(kept.pending.len(), 1);
    assert_eq!(
        kept.pending[0].frame, waiting,
        "the waiting call kept whole, as it came"
    );
}
