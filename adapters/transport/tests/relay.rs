//! The worker's side of the relay (`spec/relay.md`) on a real unix socket, with the test
//! process as the launcher: the handshake, the launcher-only rule, the login reported and
//! carried to a fresh stream without credentials, a stamped write replayed once, and a
//! watcher carried over that continues from the revision delivered. Each scenario runs in
//! every version this worker speaks: version 1 is a launcher of an older lockstep (one that
//! speaks nothing newer), under which a newer worker must keep serving; version 2 goes over
//! the pipes the worker hands over. (The shared state is the tests' in-memory one; the
//! launcher's side and real processes come with it.)

mod support;

use std::os::fd::AsFd;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use lockstep_core::Phase;
use lockstep_core::gate::Login;
use lockstep_transport::pipes::{self, AfterOpen};
use lockstep_transport::relay::{
    self, Call, CarriedLogin, Hello, Message, Open, Reply, WatcherPosition,
};
use lockstep_transport::relayed::{self, Launcher};
use serde_json::{Value, json};
use support::*;
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, FramedRead, FramedWrite, LengthDelimitedCodec};

const BOOT: &str = "9f1c04e2a7b35d68";

/// A server fixture with a relay listener beside it, accepting `launcher`.
struct Worker {
    fixture: Fixture,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _relay: tokio::task::JoinHandle<()>,
}

fn this_process() -> Launcher {
    Launcher {
        pid: std::process::id(),
        uid: rustix::process::geteuid().as_raw(),
    }
}

async fn worker(launcher: Launcher) -> Worker {
    let fixture = start(Phase::Ready).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(relay::SOCKET_NAME);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let relay = tokio::spawn(relayed::serve(
        std::sync::Arc::clone(&fixture.api),
        listener,
        launcher,
    ));
    Worker {
        fixture,
        socket,
        _dir: dir,
        _relay: relay,
    }
}

type Read = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type Write = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The launcher's end of one stream: the socket, or from version 2 the pipes.
struct Stream {
    version: u32,
    replies: FramedRead<Read, LengthDelimitedCodec>,
    calls: FramedWrite<Write, LengthDelimitedCodec>,
    /// What the worker sent on the socket after `open` instead of pipes.
    first: Option<Message>,
}

impl Stream {
    async fn connect(worker: &Worker) -> Stream {
        Stream::over(UnixStream::connect(&worker.socket).await.unwrap(), 1)
    }

    fn over(socket: UnixStream, version: u32) -> Stream {
        let (reader, writer) = socket.into_split();
        Stream {
            version,
            replies: FramedRead::new(Box::new(reader), relay::framing_to_launcher()),
            calls: FramedWrite::new(Box::new(writer), relay::framing_to_worker()),
            first: None,
        }
    }

    async fn send(&mut self, message: Message) {
        let bytes = relay::encode_in(self.version, &message).unwrap();
        self.calls.send(bytes.as_slice()).await.unwrap();
    }

    /// The next message, or `None` once the worker closed the stream (or reset it, closing
    /// it with our frame unread).
    async fn receive(&mut self) -> Option<Message> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        let frame = tokio::time::timeout(Duration::from_secs(10), self.replies.next())
            .await
            .expect("the worker answers within 10 s")?;
        Some(relay::decode_in(self.version, &frame.ok()?).unwrap())
    }

    /// A stream past `hello`/`welcome` in `version` and `open` (and, from version 2, on the
    /// pipes the worker handed over).
    async fn open(
        worker: &Worker,
        version: u32,
        connection: u64,
        login: Option<CarriedLogin>,
        watchers: Vec<WatcherPosition>,
    ) -> Stream {
        let socket = UnixStream::connect(&worker.socket).await.unwrap();
        // Both directions on one framing (the larger bound): the handshake's frames are
        // small, and the socket is whole again afterwards.
        let mut framed = Framed::new(socket, relay::framing_to_launcher());
        let hello = Message::Hello(Hello {
            versions: vec![version],
            launcher: "0.1.0".to_owned(),
            boot: BOOT.to_owned(),
        });
        framed
            .send(relay::encode(&hello).unwrap().as_slice())
            .await
            .unwrap();
        let welcome = framed.next().await.unwrap().unwrap();
        match relay::decode(&welcome).unwrap() {
            Message::Welcome(welcome) => assert_eq!(welcome.version, version),
            other => panic!("expected welcome, got {other:?}"),
        }
        let open = Message::Open(Open {
            connection,
            peer: "127.0.0.1:40000".parse().unwrap(),
            reached: Some("127.0.0.1:17070".parse().unwrap()),
            path: "/api".to_owned(),
            login,
            watchers,
        });
        framed
            .send(relay::encode(&open).unwrap().as_slice())
            .await
            .unwrap();
        let parts = framed.into_parts();
        assert!(parts.read_buf.is_empty(), "the worker sent only welcome");
        let mut socket = parts.io;
        if version < relay::PIPES_VERSION {
            return Stream::over(socket, version);
        }
        match pipes::receive(&mut socket).await.unwrap() {
            Some(AfterOpen::Pipes(ends)) => {
                // No process the launcher starts (the next worker) may inherit them.
                for fd in [ends.replies.as_fd(), ends.calls.as_fd()] {
                    let flags = rustix::io::fcntl_getfd(fd).unwrap();
                    assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
                }
                Stream {
                    version,
                    replies: FramedRead::new(Box::new(ends.replies), relay::framing_to_launcher()),
                    calls: FramedWrite::new(Box::new(ends.calls), relay::framing_to_worker()),
                    first: None,
                }
            }
            Some(AfterOpen::Message(message)) => {
                let mut stream = Stream::over(socket, version);
                stream.first = Some(message);
                stream
            }
            None => Stream::over(socket, version),
        }
    }

    async fn hello(&mut self, versions: &[u32]) {
        self.send(Message::Hello(Hello {
            versions: versions.to_vec(),
            launcher: "0.1.0".to_owned(),
            boot: BOOT.to_owned(),
        }))
        .await;
    }

    /// Sends `request` with the operation-id the launcher would stamp on connection
    /// `connection`, and returns the reply and its frame parsed.
    async fn call(&mut self, connection: u64, request: Value) -> (Reply, Value) {
        let frame = request.to_string();
        let operation_id = relay::operation_id(
            BOOT,
            connection,
            &lockstep_transport::wire::decode(&frame).unwrap(),
        );
        self.call_stamped(frame, operation_id).await
    }

    async fn call_stamped(
        &mut self,
        frame: String,
        operation_id: Option<String>,
    ) -> (Reply, Value) {
        self.send(Message::Call(Call {
            frame,
            operation_id,
            replayed: false,
        }))
        .await;
        match self.receive().await {
            Some(Message::Reply(reply)) => {
                let value = serde_json::from_str(&reply.frame).unwrap();
                (reply, value)
            }
            other => panic!("expected a reply, got {other:?}"),
        }
    }
}

fn user_admin() -> CarriedLogin {
    CarriedLogin {
        tag: "user-admin".to_owned(),
        kind: Login::User,
    }
}

fn login_request() -> Value {
    json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
           "params": {"auth-tag": "user-admin", "credentials": PASSWORD, "client-version": "3.6.1"}})
}

fn full_status(request_id: u64) -> Value {
    json!({"request-id": request_id, "type": "Client", "version": 8, "request": "FullStatus", "params": {}})
}

#[tokio::test]
async fn the_worker_welcomes_its_launchers_version_and_refuses_one_it_does_not_speak() {
    let worker = worker(this_process()).await;
    let mut stream = Stream::connect(&worker).await;
    stream.hello(&[0, 1, 9]).await;
    match stream.receive().await {
        Some(Message::Welcome(welcome)) => {
            assert_eq!(welcome.version, 1);
            assert_eq!(welcome.worker, env!("CARGO_PKG_VERSION"));
        }
        other => panic!("expected welcome, got {other:?}"),
    }

    // A launcher of this build: the highest version both speak.
    let mut stream = Stream::connect(&worker).await;
    stream.hello(relay::VERSIONS).await;
    match stream.receive().await {
        Some(Message::Welcome(welcome)) => assert_eq!(welcome.version, 3),
        other => panic!("expected welcome, got {other:?}"),
    }

    let mut stream = Stream::connect(&worker).await;
    stream.hello(&[4, 5]).await;
    match stream.receive().await {
        Some(Message::Refused(refused)) => {
            assert_eq!(refused.versions, relay::VERSIONS);
            assert!(refused.reason.contains("[4, 5]"), "{}", refused.reason);
        }
        other => panic!("expected refused, got {other:?}"),
    }
    assert_eq!(stream.receive().await, None, "closed after refused");
}

#[tokio::test]
async fn a_stream_from_another_process_than_the_launcher_is_closed_unanswered() {
    // The launcher is pid 1 here: this test process is not it.
    let worker = worker(Launcher {
        pid: 1,
        uid: rustix::process::geteuid().as_raw(),
    })
    .await;
    let mut stream = Stream::connect(&worker).await;
    stream.hello(relay::VERSIONS).await;
    assert_eq!(stream.receive().await, None);
}

#[tokio::test]
async fn a_login_is_reported_then_carried_to_a_fresh_stream_without_credentials() {
    for version in relay::VERSIONS.iter().copied() {
        login_carried_in(version).await;
    }
}

async fn login_carried_in(version: u32) {
    let worker = worker(this_process()).await;
    let mut first = Stream::open(&worker, version, 1, None, Vec::new()).await;
    let (reply, value) = first.call(1, full_status(1)).await;
    assert_eq!(value["error-code"], "not implemented", "{value}");
    assert_eq!(reply.login, None);
    let (reply, value) = first.call(1, login_request()).await;
    assert!(value.get("error").is_none(), "{value}");
    assert_eq!(reply.login, Some(user_admin()));

    // The next worker's stream: the login comes with open, no password anywhere.
    let mut carried = Stream::open(&worker, version, 1, Some(user_admin()), Vec::new()).await;
    let (reply, value) = carried.call(1, full_status(2)).await;
    assert!(value["response"]["model"].is_object(), "{value}");
    assert_eq!(reply.login, None, "only a login's reply reports it");

    // A login the worker no longer admits ends the connection, with the reason.
    let gone = CarriedLogin {
        tag: "user-mallory".to_owned(),
        kind: Login::User,
    };
    let mut refused = Stream::open(&worker, version, 2, Some(gone), Vec::new()).await;
    match refused.receive().await {
        Some(Message::Close(close)) => {
            assert_eq!(close.code, 1008);
            assert!(
                close.reason.contains("user-mallory may no longer log in"),
                "{}",
                close.reason
            );
        }
        other => panic!("expected close, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stamped_write_replayed_on_the_next_stream_is_applied_once() {
    for version in relay::VERSIONS.iter().copied() {
        stamped_write_replayed_in(version).await;
    }
}

async fn stamped_write_replayed_in(version: u32) {
    let worker = worker(this_process()).await;
    let add = json!({"request-id": 7, "type": "Client", "version": 8, "request": "AddMachines",
                     "params": {"params": [{"jobs": ["JobHostUnits"]}]}});
    let mut first = Stream::open(&worker, version, 5, Some(user_admin()), Vec::new()).await;
    let before = worker.fixture.state.revision();
    let (_, applied) = first.call(5, add.clone()).await;
    assert!(applied.get("error").is_none(), "{applied}");
    let after = worker.fixture.state.revision();
    assert!(after > before, "the call was applied");

    // The worker died before the launcher got the reply: the launcher sends the same call,
    // under the same stamp, to the next worker.
    let mut next = Stream::open(&worker, version, 5, Some(user_admin()), Vec::new()).await;
    let (_, replayed) = next.call(5, add.clone()).await;
    assert_eq!(replayed, applied, "the replay answers what was applied");
    assert_eq!(worker.fixture.state.revision(), after, "applied once");

    // Without the stamp the same frame is another call: the stamp is what makes it once.
    let (_, again) = next.call_stamped(add.to_string(), None).await;
    assert!(again.get("error").is_none(), "{again}");
    assert!(worker.fixture.state.revision() > after);
}

#[tokio::test]
async fn a_watcher_carried_over_continues_from_the_revision_delivered() {
    for version in relay::VERSIONS.iter().copied() {
        watcher_carried_in(version).await;
    }
}

async fn watcher_carried_in(version: u32) {
    let worker = worker(this_process()).await;
    let mut first = Stream::open(&worker, version, 3, Some(user_admin()), Vec::new()).await;
    let watch = json!({"request-id": 2, "type": "Client", "version": 8, "request": "WatchAll", "params": {}});
    let (reply, value) = first.call(3, watch).await;
    let id = value["response"]["watcher-id"].as_str().unwrap().to_owned();
    assert_eq!(
        reply.watcher,
        Some(WatcherPosition {
            id: id.clone(),
            revision: None,
            stopped: false
        })
    );
    let next = |request_id: u64| json!({"request-id": request_id, "type": "AllWatcher", "version": 3, "id": id, "request": "Next"});
    let (reply, snapshot) = first.call(3, next(3)).await;
    let delivered = snapshot["response"]["revision"].as_u64().unwrap();
    assert_eq!(reply.watcher.as_ref().unwrap().revision, Some(delivered));

    // A change the first worker never delivered.
    let add = json!({"request-id": 4, "type": "Client", "version": 8, "request": "AddMachines",
                     "params": {"params": [{"jobs": ["JobHostUnits"]}]}});
    first.call(3, add).await;
    drop(first);

    // The next worker gets the watcher at the revision delivered: its Next answers the
    // change, once, under the same id.
    let carried = WatcherPosition {
        id: id.clone(),
        revision: Some(delivered),
        stopped: false,
    };
    let mut second = Stream::open(&worker, version, 3, Some(user_admin()), vec![carried]).await;
    let (reply, deltas) = second.call(3, next(5)).await;
    let revisions: Vec<u64> = deltas["response"]["revisions"]
        .as_array()
        .unwrap_or_else(|| panic!("{deltas}"))
        .iter()
        .map(|revision| revision.as_u64().unwrap())
        .collect();
    assert!(!revisions.is_empty(), "{deltas}");
    assert!(
        revisions.iter().all(|revision| *revision > delivered),
        "{deltas}"
    );
    let reached = deltas["response"]["revision"].as_u64().unwrap();
    assert_eq!(reply.watcher.as_ref().unwrap().revision, Some(reached));

    // A new watcher on that connection does not reuse the carried id; Stop reports it.
    let watch = json!({"request-id": 6, "type": "Client", "version": 8, "request": "WatchAll", "params": {}});
    let (_, value) = second.call(3, watch).await;
    let other = value["response"]["watcher-id"].as_str().unwrap().to_owned();
    assert!(
        other.parse::<u64>().unwrap() > id.parse::<u64>().unwrap(),
        "{other} after {id}"
    );
    let stop =
        json!({"request-id": 7, "type": "AllWatcher", "version": 3, "id": id, "request": "Stop"});
    let (reply, _) = second.call(3, stop).await;
    assert_eq!(
        reply.watcher,
        Some(WatcherPosition {
            id,
            revision: None,
            stopped: true
        })
    );
}

/// A reply far larger than a pipe's buffer (64 KiB) or the worker's reply buffer (256 KiB)
/// crosses whole, in order with the replies after it, in every version.
#[tokio::test]
async fn a_reply_larger_than_the_pipes_crosses_whole_and_the_stream_goes_on() {
    for version in relay::VERSIONS.iter().copied() {
        let worker = worker(this_process()).await;
        let mut stream = Stream::open(&worker, version, 9, Some(user_admin()), Vec::new()).await;
        let method = "x".repeat(600_000);
        let call = json!({"request-id": 2, "type": "Pinger", "version": 1, "request": method});
        let (reply, value) = stream.call(9, call).await;
        assert_eq!(reply.request_id, Some(2));
        assert_eq!(value["error-code"], "not implemented", "version {version}");
        let message = value["error"].as_str().unwrap();
        assert!(
            message.contains(&method),
            "version {version}: {} bytes",
            message.len()
        );
        let (_, status) = stream.call(9, full_status(3)).await;
        assert!(status["response"]["model"].is_object(), "{status}");
    }
}
