//! The record layer (`records.rs`) against a TLS stack nobody here wrote: Python's `ssl`
//! (OpenSSL) as the client, over real loopback TCP, TLS 1.3 and TLS 1.2. The server takes
//! the session from rustls after the handshake and, between every two messages, moves it
//! to a new stream from its serialized state, as it would to another process.

use std::io::Write;
use std::process::{Command, Stdio};

use lockstep_transport::records::{self, RecordStream, Session, SessionState};
use lockstep_transport::tls::Credentials;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The client: connects, then for each size sends a 4-byte length and that many bytes and
/// checks that the same come back; prints the protocol and suite OpenSSL negotiated.
const CLIENT: &str = r#"
import socket, ssl, struct, sys
port, ca, version = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
ctx.minimum_version = getattr(ssl.TLSVersion, version)
ctx.maximum_version = getattr(ssl.TLSVersion, version)
with socket.create_connection(("127.0.0.1", port)) as raw:
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        for i, n in enumerate([1, 200, 16384, 16385, 300000, 7]):
            sent = bytes((j * 31 + i) % 256 for j in range(n))
            s.sendall(struct.pack(">I", n) + sent)
            got = b""
            while len(got) < n:
                chunk = s.recv(n - len(got))
                if not chunk:
                    sys.exit(f"the server closed after {len(got)} of {n} bytes")
                got += chunk
            if got != sent:
                sys.exit(f"{n} bytes came back changed")
        s.sendall(struct.pack(">I", 0))
        if s.recv(1) != b"":
            sys.exit("no clean close after the last message")
        print(s.version(), s.cipher()[0])
"#;

async fn serve_moving(listener: TcpListener, config: std::sync::Arc<rustls::ServerConfig>) -> u64 {
    let (socket, _) = listener.accept().await.unwrap();
    let (socket, state) = records::accept(&config, socket).await.unwrap();
    let mut state = serde_json::to_vec(&state).unwrap();
    let (mut socket, mut read_ahead, mut skip): (TcpStream, Vec<u8>, u64) = (socket, Vec::new(), 0);
    let mut moves = 0;
    loop {
        // Another "process" picks the session up from its state.
        let parsed: SessionState = serde_json::from_slice(&state).unwrap();
        let mut stream =
            RecordStream::resume(socket, Session::new(&parsed).unwrap(), read_ahead, skip);
        let n = stream.read_u32().await.unwrap() as usize;
        if n == 0 {
            stream.shutdown().await.unwrap();
            return moves;
        }
        let mut message = vec![0u8; n];
        stream.read_exact(&mut message).await.unwrap();
        stream.write_all(&message).await.unwrap();
        stream.flush().await.unwrap();
        let handover = stream
            .into_handover()
            .expect("nothing waiting between messages");
        socket = handover.io;
        read_ahead = handover.read_ahead;
        skip = handover.skip;
        state = serde_json::to_vec(&handover.session).unwrap();
        moves += 1;
    }
}

async fn openssl_client_round_trips(version: &str) -> String {
    let credentials = Credentials::generate("records", &[]).unwrap();
    let config = credentials.server_config().unwrap();
    let mut ca = tempfile::NamedTempFile::new().unwrap();
    ca.write_all(credentials.ca_pem.as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(serve_moving(listener, config));
    let mut client = Command::new("python3")
        .args(["-c", CLIENT, &port.to_string()])
        .arg(ca.path())
        .arg(version)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let pid = client.id();
    let output = tokio::task::spawn_blocking(move || {
        let status = client.wait().unwrap();
        let mut out = String::new();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut client.stdout.take().unwrap(), &mut out).unwrap();
        std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut err).unwrap();
        (status, out, err)
    });
    let (status, out, err) = tokio::time::timeout(std::time::Duration::from_secs(60), output)
        .await
        .unwrap_or_else(|_| {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("the client (pid {pid}) did not finish in 60 s");
        })
        .unwrap();
    assert!(status.success(), "the OpenSSL client failed: {err}");
    assert_eq!(
        server.await.unwrap(),
        6,
        "the session did not move after every message"
    );
    out.trim().to_owned()
}

#[tokio::test]
async fn an_openssl_tls13_client_is_served_by_a_session_moved_after_every_message() {
    let negotiated = openssl_client_round_trips("TLSv1_3").await;
    assert!(negotiated.starts_with("TLSv1.3 "), "{negotiated}");
}

#[tokio::test]
async fn an_openssl_tls12_client_is_served_by_a_session_moved_after_every_message() {
    let negotiated = openssl_client_round_trips("TLSv1_2").await;
    assert!(negotiated.starts_with("TLSv1.2 "), "{negotiated}");
}
