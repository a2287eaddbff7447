//! A connection held by another process through a journal (`journal.rs`), taken back after
//! that process is killed with SIGKILL at moments spread over its work, and carried on: a
//! rustls client streaming messages to an echo sees every echo once, in order, on the one
//! connection, across every kill. Between every other two holders the test itself serves a
//! few messages on the session it took back, as the launcher does while no worker serves,
//! then hands the connection over again.
//!
//! The holder is this test binary run again (`journal_child`), given the socket and the
//! journal's memory file as inherited descriptors and the lease in its environment.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_transport::journal::{self, Journal, JournaledStream, Lease, Shape};
use lockstep_transport::records::{self, RecordStream, Session};
use lockstep_transport::tls::{Credentials, client_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Set for the holder, which reads its lease (JSON) from its standard input.
const LEASE_ENV: &str = "LOCKSTEP_JOURNAL_TEST_LEASE";
const SOCKET_FD_ENV: &str = "LOCKSTEP_JOURNAL_TEST_SOCKET_FD";
const JOURNAL_FD_ENV: &str = "LOCKSTEP_JOURNAL_TEST_JOURNAL_FD";
const MESSAGES: usize = 5000;
/// Holders are killed until at least this many were and three quarters of the echoes are
/// done, at most [`KILLS_MAX`].
const KILLS_MIN: usize = 30;
const KILLS_MAX: usize = 400;
const SHAPE: Shape = Shape {
    read_ring: 256 << 10,
    write_ring: 256 << 10,
};

/// A deterministic stream of numbers (xorshift), so that a failure can be replayed.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn message(index: usize, len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len).map(|i| (i * 7 + index) as u8).collect();
    bytes[..4].copy_from_slice(&(index as u32).to_be_bytes());
    bytes
}

/// The holder's role: echoes each message (a 4-byte length, then its bytes) and absorbs it
/// once the echo is sealed; a length of 0 ends it. Does nothing when run by hand.
#[test]
#[ignore = "the journal test's child process, run by that test"]
#[allow(
    clippy::print_stdout,
    reason = "the holder tells the test it serves on stdout"
)]
fn journal_child() {
    if std::env::var_os(LEASE_ENV).is_none() {
        return;
    }
    let lease: Lease = serde_json::from_reader(std::io::stdin()).unwrap();
    let fd = |name: &str| -> OwnedFd {
        let fd: i32 = std::env::var(name).unwrap().parse().unwrap();
        // SAFETY: the parent made this descriptor for this process alone, inherited open.
        #[allow(unsafe_code)]
        unsafe {
            OwnedFd::from_raw_fd(fd)
        }
    };
    let socket = std::net::TcpStream::from(fd(SOCKET_FD_ENV));
    let journal = Journal::open(fd(JOURNAL_FD_ENV), lease.shape, lease.session.suite).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        socket.set_nonblocking(true).unwrap();
        let socket = TcpStream::from_std(socket).unwrap();
        let mut stream = JournaledStream::new(socket, journal, &lease).unwrap();
        println!("serving");
        loop {
            let len = stream.read_u32().await.unwrap() as usize;
            if len == 0 {
                stream.absorb(4);
                stream.shutdown().await.unwrap();
                return;
            }
            let mut bytes = vec![0u8; len];
            stream.read_exact(&mut bytes).await.unwrap();
            stream.write_u32(len as u32).await.unwrap();
            stream.write_all(&bytes).await.unwrap();
            stream.absorb(4 + len as u64);
            stream.flush().await.unwrap();
        }
    });
}

/// The parent's own turn with the connection, as a launcher's between workers: carries the
/// session on from where the dead holder left it, echoes `messages` messages, and gives the
/// socket back with what the next holder needs (its session, read-ahead and skip), waiting
/// for a message's end if one is half read.
async fn serve_between(
    socket: TcpStream,
    session: records::SessionState,
    read_ahead: Vec<u8>,
    skip: u64,
    messages: u64,
) -> (TcpStream, (records::SessionState, Vec<u8>, u64)) {
    let mut stream =
        RecordStream::resume(socket, Session::new(&session).unwrap(), read_ahead, skip);
    let mut served = 0;
    loop {
        if served >= messages {
            match stream.into_handover() {
                Ok(handover) => {
                    return (
                        handover.io,
                        (handover.session, handover.read_ahead, handover.skip),
                    );
                }
                Err(back) => stream = *back,
            }
        }
        let len = stream.read_u32().await.unwrap() as usize;
        assert_ne!(len, 0, "the client ended while the parent served");
        let mut bytes = vec![0u8; len];
        stream.read_exact(&mut bytes).await.unwrap();
        stream.write_u32(len as u32).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        stream.flush().await.unwrap();
        served += 1;
    }
}

/// Starts a holder for `lease` on the socket and journal given (the journal's earlier
/// commits forgotten, as the launcher forgets them before a lease).
fn hold(lease: &Lease, socket: &TcpStream, journal: &mut Journal) -> std::process::Child {
    journal.reset();
    // Duplicates the child inherits (no close-on-exec), closed here once it has them.
    let socket = rustix::io::fcntl_dupfd_cloexec(socket.as_fd(), 3).unwrap();
    let file = rustix::io::fcntl_dupfd_cloexec(journal.file(), 3).unwrap();
    for fd in [&socket, &file] {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).unwrap();
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "journal_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LEASE_ENV, "stdin")
        .env(SOCKET_FD_ENV, socket.as_raw_fd().to_string())
        .env(JOURNAL_FD_ENV, file.as_raw_fd().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the holder");
    drop((socket, file));
    let mut child = child;
    let mut stdin = child.stdin.take().unwrap();
    serde_json::to_writer(&mut stdin, lease).unwrap();
    drop(stdin);
    child
}

/// Waits for the holder to say it serves (libtest may put its own words before).
fn serving(child: &mut std::process::Child) -> std::io::BufReader<std::process::ChildStdout> {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving") {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the holder ended before serving"
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(
    clippy::print_stderr,
    reason = "what the kills found, on stderr, for --nocapture"
)]
async fn a_holder_killed_at_any_moment_leaves_the_connection_to_carry_on_with_every_byte_once() {
    let credentials = Credentials::generate("journal", &[]).unwrap();
    let server_config = credentials.server_config().unwrap();
    let client_config = client_config(&credentials.ca_pem, &[&rustls::version::TLS13]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();

    // The client: streams messages of 4 bytes to 8 KB, never more than 8 ahead of their
    // echoes, and checks each echo.
    let echoes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let echoes_seen = Arc::clone(&echoes);
    let client = tokio::spawn(async move {
        let socket = TcpStream::connect(address).await.unwrap();
        // Each message's length and bytes go out at once: with Nagle's algorithm the bytes
        // would wait for the server's delayed acknowledgement of the length.
        socket.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(&client_config))
            .connect("localhost".try_into().unwrap(), socket)
            .await
            .unwrap();
        let (mut reader, mut writer) = tokio::io::split(tls);
        let (sent, mut echoed) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
        let writing = tokio::spawn(async move {
            let mut numbers = Numbers(0x9e37_79b9_7f4a_7c15);
            for index in 0..MESSAGES {
                let len = 4 + numbers.next(8_000) as usize;
                let bytes = message(index, len);
                sent.send(bytes.clone()).await.unwrap();
                writer.write_u32(len as u32).await.unwrap();
                writer.write_all(&bytes).await.unwrap();
                writer.flush().await.unwrap();
            }
            writer.write_u32(0).await.unwrap();
            writer.flush().await.unwrap();
            writer
        });
        for index in 0..MESSAGES {
            if index % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let expected = echoed.recv().await.unwrap();
            let len = reader.read_u32().await.unwrap() as usize;
            assert_eq!(len, expected.len(), "echo {index}'s length");
            let mut got = vec![0u8; len];
            reader.read_exact(&mut got).await.unwrap();
            assert!(got == expected, "echo {index} came back changed");
            echoes_seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut rest = Vec::new();
        assert_eq!(
            reader.read_to_end(&mut rest).await.unwrap(),
            0,
            "a clean close_notify"
        );
        drop(writing.await.unwrap());
    });

    let (socket, _) = listener.accept().await.unwrap();
    socket.set_nodelay(true).unwrap();
    // A small send buffer, and a client that reads slowly now and then: holders are often
    // killed with committed bytes the socket has not taken.
    rustix::net::sockopt::set_socket_send_buffer_size(&socket, 4096).unwrap();
    let (socket, session) = records::accept(&server_config, socket).await.unwrap();
    let mut journal = Journal::create(SHAPE, session.suite).unwrap();
    let mut lease = Lease {
        shape: SHAPE,
        session,
        counters: journal::socket_counters(socket.as_fd()).unwrap(),
        read_ahead: Vec::new(),
        skip: 0,
        app: Vec::new(),
    };
    let mut numbers = Numbers(0x2545_f491_4f6c_dd1d);
    let mut recovered_states = Vec::new();
    let started = Instant::now();
    let mut kill = 0;
    let mut served_between = 0;
    let mut socket = socket;
    while kill < KILLS_MIN || echoes.load(std::sync::atomic::Ordering::Relaxed) < MESSAGES * 3 / 4 {
        assert!(
            kill < KILLS_MAX,
            "{KILLS_MAX} holders made too little progress"
        );
        let mut holder = hold(&lease, &socket, &mut journal);
        let out = tokio::task::block_in_place(|| serving(&mut holder));
        tokio::time::sleep(Duration::from_micros(numbers.next(3_000))).await;
        holder.kill().unwrap();
        let status = holder.wait().unwrap();
        drop(out);
        assert!(
            !status.success(),
            "holder {kill} ended by itself ({status}) before its kill"
        );
        let recovered = journal::recover(&journal, &lease, socket.as_fd()).unwrap();
        recovered_states.push((
            echoes.load(std::sync::atomic::Ordering::Relaxed),
            recovered.read_ahead.len(),
            recovered.unwritten.len(),
        ));
        kill += 1;
        // What the dead holder committed and did not write goes out first.
        let mut written = 0;
        while written < recovered.unwritten.len() {
            socket.writable().await.unwrap();
            match socket.try_write(&recovered.unwritten[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("writing what the holder left: {e}"),
            }
        }
        // Every other time the parent serves a few messages itself, as the launcher does
        // while no worker serves, then hands the connection over again.
        let (session, read_ahead, skip);
        (socket, session, read_ahead, skip) = if kill % 2 == 0 {
            let served = numbers.next(8);
            let (socket, handover) = serve_between(
                socket,
                recovered.session,
                recovered.read_ahead,
                recovered.skip,
                served,
            )
            .await;
            served_between += served;
            (socket, handover.0, handover.1, handover.2)
        } else {
            (
                socket,
                recovered.session,
                recovered.read_ahead,
                recovered.skip,
            )
        };
        lease = Lease {
            shape: SHAPE,
            session,
            counters: journal::socket_counters(socket.as_fd()).unwrap(),
            read_ahead,
            skip,
            app: recovered.app,
        };
    }
    // The holders killed did most of the work; the last runs to the end.
    let mut holder = hold(&lease, &socket, &mut journal);
    let status = tokio::task::spawn_blocking(move || holder.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "the last holder failed: {status}");
    client
        .await
        .expect("the client saw every echo once, in order");
    assert!(
        served_between > 0,
        "the parent served no message between holders"
    );
    // The kills found holders in the states recovery is for.
    let mid_message = recovered_states
        .iter()
        .filter(|(_, read_ahead, _)| *read_ahead > 26)
        .count();
    let unwritten = recovered_states
        .iter()
        .filter(|(_, _, unwritten)| *unwritten > 0)
        .count();
    assert!(
        mid_message > 0,
        "no holder was killed with part of a message read"
    );
    assert!(
        unwritten > 0,
        "no holder was killed with committed bytes unwritten"
    );
    eprintln!(
        "{kill} holders killed in {:?}; at each kill (echoes so far, read-ahead bytes taken back, unwritten bytes taken back): {recovered_states:?}",
        started.elapsed()
    );
}

/// The journal's memory file's resident bytes (a memory file's blocks are its pages).
fn resident(journal: &Journal) -> u64 {
    rustix::fs::fstat(journal.file()).unwrap().st_blocks as u64 * 512
}

/// An API connection's journal (`Shape::API`: a read ring of more than a MiB, application
/// state of up to 2.25 MiB per slot) through which 8 MiB are echoed, one message of them
/// 900 KB, with 1 MiB of application state committed once and then 100 bytes: afterwards
/// the file holds less than 512 KiB of pages, where it held more than 2 MiB at the peak.
#[tokio::test]
async fn a_journal_keeps_pages_only_for_what_it_still_holds() {
    let credentials = Credentials::generate("journal", &[]).unwrap();
    let server_config = credentials.server_config().unwrap();
    let client_config = client_config(&credentials.ca_pem, &[&rustls::version::TLS13]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut sizes = vec![32 << 10; 228];
    sizes.insert(100, 900_000);
    let sizes_sent = sizes.clone();
    let client = tokio::spawn(async move {
        let socket = TcpStream::connect(address).await.unwrap();
        socket.set_nodelay(true).unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client_config)
            .connect("localhost".try_into().unwrap(), socket)
            .await
            .unwrap();
        for (index, len) in sizes_sent.into_iter().enumerate() {
            let bytes = message(index, len);
            tls.write_u32(len as u32).await.unwrap();
            tls.write_all(&bytes).await.unwrap();
            tls.flush().await.unwrap();
            assert_eq!(tls.read_u32().await.unwrap() as usize, len);
            let mut got = vec![0u8; len];
            tls.read_exact(&mut got).await.unwrap();
            assert!(got == bytes, "echo {index} came back changed");
        }
        tls
    });
    let (socket, _) = listener.accept().await.unwrap();
    let (socket, session) = records::accept(&server_config, socket).await.unwrap();
    let journal = Journal::create(Shape::API, session.suite).unwrap();
    let view = Journal::open(
        rustix::io::fcntl_dupfd_cloexec(journal.file(), 3).unwrap(),
        Shape::API,
        session.suite,
    )
    .unwrap();
    let lease = Lease {
        shape: Shape::API,
        session,
        counters: journal::socket_counters(socket.as_fd()).unwrap(),
        read_ahead: Vec::new(),
        skip: 0,
        app: Vec::new(),
    };
    let mut stream = JournaledStream::new(socket, journal, &lease).unwrap();
    let mut peak = 0;
    for (index, &len) in sizes.iter().enumerate() {
        assert_eq!(stream.read_u32().await.unwrap() as usize, len);
        let mut bytes = vec![0u8; len];
        stream.read_exact(&mut bytes).await.unwrap();
        stream.write_u32(len as u32).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        stream.absorb(4 + len as u64);
        match index {
            // Both slots get a MiB of state, one commit each.
            150 | 151 => stream.set_app(&vec![7u8; 1 << 20]).unwrap(),
            152.. => stream.set_app(&[1u8; 100]).unwrap(),
            _ => {}
        }
        stream.flush().await.unwrap();
        peak = peak.max(resident(&view));
    }
    let _tls = client.await.unwrap();
    let after = resident(&view);
    assert!(
        peak > 2 << 20,
        "the peak held the large message and state: {peak}"
    );
    assert!(
        after < 512 << 10,
        "{after} bytes resident after (peak {peak})"
    );
}

/// A journal one holder committed to, reset and leased again, and the second holder never
/// takes the lease (a worker that dies before its first commit, or refuses the lease): the
/// connection is recovered as the second lease left it, not from the first holder's
/// commit.
#[tokio::test]
async fn a_lease_no_holder_took_is_recovered_as_it_was_leased() {
    let credentials = Credentials::generate("journal", &[]).unwrap();
    let server_config = credentials.server_config().unwrap();
    let client_config = client_config(&credentials.ca_pem, &[&rustls::version::TLS13]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let client = tokio::spawn(async move {
        let socket = TcpStream::connect(address).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client_config)
            .connect("localhost".try_into().unwrap(), socket)
            .await
            .unwrap();
        tls.write_all(b"hello").await.unwrap();
        tls.flush().await.unwrap();
        tls
    });
    let (socket, _) = listener.accept().await.unwrap();
    let (socket, session) = records::accept(&server_config, socket).await.unwrap();
    let mut journal = Journal::create(SHAPE, session.suite).unwrap();
    let view = Journal::open(
        rustix::io::fcntl_dupfd_cloexec(journal.file(), 3).unwrap(),
        SHAPE,
        session.suite,
    )
    .unwrap();
    let kept_socket = socket.into_std().unwrap();
    let first = Lease {
        shape: SHAPE,
        session: session.clone(),
        counters: journal::socket_counters(kept_socket.as_fd()).unwrap(),
        read_ahead: Vec::new(),
        skip: 0,
        app: b"first".to_vec(),
    };
    // The first holder reads the client's message, absorbs it and commits.
    {
        let socket = TcpStream::from_std(kept_socket.try_clone().unwrap()).unwrap();
        let mut stream = JournaledStream::new(socket, view, &first).unwrap();
        let mut hello = [0u8; 5];
        stream.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello");
        stream.absorb(5);
        stream.set_app(b"first, after hello").unwrap();
        stream.flush().await.unwrap();
    }
    let after_first = journal::recover(&journal, &first, kept_socket.as_fd()).unwrap();
    assert_eq!(after_first.app, b"first, after hello");

    // Leased again: what the lease counts from is the socket now, the session the first
    // holder's, the read-ahead made up (nothing checks it against the socket).
    journal.reset();
    let second = Lease {
        shape: SHAPE,
        session: after_first.session.clone(),
        counters: journal::socket_counters(kept_socket.as_fd()).unwrap(),
        read_ahead: b"ciphertext read ahead".to_vec(),
        skip: 3,
        app: b"second".to_vec(),
    };
    let recovered = journal::recover(&journal, &second, kept_socket.as_fd()).unwrap();
    assert_eq!(recovered.read_ahead, second.read_ahead);
    assert_eq!(recovered.skip, 3);
    assert_eq!(recovered.app, b"second");
    assert_eq!(recovered.session, second.session);
    assert!(recovered.unwritten.is_empty());
    drop(client.await.unwrap());
}
