//! A TCP proxy for tests that cuts connections the way a network partition would and then
//! heals the cut.
//!
//! [`Proxy::start`] listens on a free port of 127.0.0.1 and forwards every connection it
//! accepts to one target address, bytes unchanged, in both directions. A test gives the
//! proxy's address to a process in place of the target's (for example, an etcd member's
//! client URL to a controller), then calls [`Proxy::blackhole`] to cut the process off
//! and [`Proxy::heal`] to end the cut.
//!
//! The proxy connects to the target and nowhere else. It uses only the standard library:
//! one thread accepts, and each connection has one thread per direction. Every socket has
//! a short read and write timeout, so that each thread notices a blackhole or the proxy's
//! drop within about 50 ms and no thread stays blocked.
#![allow(dead_code)]

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Read and write timeout of the forwarded sockets: how often a blocked copy loop checks
/// the flags.
const POLL: Duration = Duration::from_millis(50);
/// Sleep of the accept loop when no connection is waiting.
const ACCEPT_POLL: Duration = Duration::from_millis(10);
/// Longest wait for the connection to the target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Size of each copy loop's buffer.
const BUF_LEN: usize = 16 * 1024;

/// A TCP proxy from a free port of 127.0.0.1 to one target address.
///
/// Dropping the proxy stops it: it closes the listener and every connection, and waits for
/// its threads to end.
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// What the proxy's threads share.
struct Shared {
    /// Set when the proxy is dropped: every thread ends.
    stop: AtomicBool,
    state: Mutex<State>,
    /// Bytes per second each direction of each connection may carry; 0: no limit.
    rate: std::sync::atomic::AtomicU64,
    /// Bytes forwarded so far, both directions, every connection.
    forwarded: std::sync::atomic::AtomicU64,
}

struct State {
    /// Whether the proxy is blackholed now.
    blackholed: bool,
    /// The connections whose threads may still run.
    conns: Vec<Conn>,
}

/// One accepted connection.
struct Conn {
    /// The accepted socket and, unless it was accepted during a blackhole, the socket to
    /// the target.
    sockets: Vec<TcpStream>,
    /// Set when the connection exists during a blackhole, and never cleared: from then on
    /// its bytes are dropped, and the next heal closes it.
    cut: Arc<AtomicBool>,
    /// The connection's copy threads.
    threads: Vec<JoinHandle<()>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A copy thread never holds the lock, and no code holding it panics; if one did,
        // the state is still consistent enough to shut the sockets down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

impl Proxy {
    /// Starts a proxy that listens on 127.0.0.1 on a port chosen by the OS and forwards
    /// every accepted connection to `target`.
    ///
    /// Each accepted connection gets its own connection to `target`; if that connection
    /// fails, the accepted one is closed.
    ///
    /// # Panics
    ///
    /// If the listener cannot be set up or its thread cannot be started.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("proxy: cannot listen on 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("proxy: cannot make the listener non-blocking");
        let addr = listener
            .local_addr()
            .expect("proxy: cannot read the listener's address");
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            rate: std::sync::atomic::AtomicU64::new(0),
            forwarded: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(State {
                blackholed: false,
                conns: Vec::new(),
            }),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{}-accept", addr.port()))
                .spawn(move || accept_loop(&listener, target, &shared))
                .expect("proxy: cannot start the accept thread")
        };
        Proxy {
            addr,
            target,
            shared,
            accept: Some(accept),
        }
    }

    /// The address the proxy listens on: 127.0.0.1 and the port the OS chose.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's address as an URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    /// Slows every connection, existing ones included, to about `bytes_per_second` in each
    /// direction (a slow link); 0 lifts the limit.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.shared.rate.store(bytes_per_second, Ordering::SeqCst);
    }

    /// Bytes forwarded so far, both directions of every connection.
    pub fn forwarded_bytes(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Cuts every connection off, as a network partition would.
    ///
    /// From now on, the bytes of every existing connection are read and dropped in both
    /// directions; no socket is closed, so each side simply gets no answer. A connection
    /// accepted while blackholed gets no connection to the target, and its bytes are read
    /// and dropped too. A connection cut off is never forwarded again: [`Proxy::heal`]
    /// closes it. Calling this while already blackholed changes nothing.
    pub fn blackhole(&self) {
        let mut state = self.shared.lock();
        state.blackholed = true;
        for conn in &state.conns {
            conn.cut.store(true, Ordering::SeqCst);
        }
    }

    /// Ends the blackhole: closes (shuts down both ways) every connection that existed
    /// while blackholed, so that its clients notice and reconnect, and forwards the
    /// connections accepted from now on again.
    ///
    /// When this returns, every such connection has been shut down. Calling this when not
    /// blackholed changes nothing.
    pub fn heal(&self) {
        let mut state = self.shared.lock();
        state.blackholed = false;
        for conn in state
            .conns
            .iter()
            .filter(|conn| conn.cut.load(Ordering::SeqCst))
        {
            conn.shutdown();
        }
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .field("blackholed", &self.shared.lock().blackholed)
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The accept loop ends within ACCEPT_POLL, or after a connection attempt to the
        // target (at most CONNECT_TIMEOUT); it registers no connection after that.
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let conns = std::mem::take(&mut self.shared.lock().conns);
        for conn in &conns {
            conn.shutdown();
        }
        // Each copy thread sees the stop flag or a shut socket within POLL.
        for conn in conns {
            for thread in conn.threads {
                let _ = thread.join();
            }
        }
    }
}

impl Conn {
    fn shutdown(&self) {
        for socket in &self.sockets {
            // Fails only if the socket is already shut or reset: nothing is left to do.
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    fn finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => handle(client, target, shared),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock when no connection is waiting; anything else (a connection reset
            // before it was accepted, no descriptor left) is retried after the same sleep.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Connects an accepted socket to the target (unless blackholed), registers the
/// connection and starts its copy threads. On any failure the accepted socket is closed.
fn handle(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    if configure(&client).is_err() {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let upstream = if shared.lock().blackholed {
        None
    } else {
        let connected = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT)
            .and_then(|upstream| configure(&upstream).map(|()| upstream));
        match connected {
            Ok(upstream) => Some(upstream),
            Err(_) => {
                let _ = client.shutdown(Shutdown::Both);
                return;
            }
        }
    };

    let mut state = shared.lock();
    state.conns.retain(|conn| !conn.finished());
    // A connection without a socket to the target is always cut. Registering it and
    // reading `blackholed` under the same lock as blackhole() and heal() makes each
    // connection either seen by the next heal or forwarded.
    let cut = Arc::new(AtomicBool::new(state.blackholed || upstream.is_none()));
    let mut conn = Conn {
        sockets: vec![client],
        cut,
        threads: Vec::new(),
    };
    if let Some(upstream) = upstream {
        conn.sockets.push(upstream);
    }
    if start_threads(&mut conn, shared).is_err() {
        conn.shutdown();
    }
    if conn.cut.load(Ordering::SeqCst) && !state.blackholed {
        // Accepted while blackholed, but heal() ran before it was registered.
        conn.shutdown();
    }
    state.conns.push(conn);
}

/// Starts one copy thread per direction, or a single discarding thread when the
/// connection has no socket to the target.
fn start_threads(conn: &mut Conn, shared: &Arc<Shared>) -> io::Result<()> {
    let directions: Vec<(TcpStream, Option<TcpStream>)> = match conn.sockets.as_slice() {
        [client] => vec![(client.try_clone()?, None)],
        [client, upstream] => vec![
            (client.try_clone()?, Some(upstream.try_clone()?)),
            (upstream.try_clone()?, Some(client.try_clone()?)),
        ],
        _ => unreachable!("a connection has one or two sockets"),
    };
    for (src, dst) in directions {
        let cut = Arc::clone(&conn.cut);
        let shared = Arc::clone(shared);
        let thread = thread::Builder::new()
            .name("proxy-copy".to_owned())
            .spawn(move || copy(src, dst, &cut, &shared))?;
        conn.threads.push(thread);
    }
    Ok(())
}

fn configure(socket: &TcpStream) -> io::Result<()> {
    // An accepted socket may inherit the listener's non-blocking mode on some platforms.
    socket.set_nonblocking(false)?;
    socket.set_read_timeout(Some(POLL))?;
    socket.set_write_timeout(Some(POLL))?;
    socket.set_nodelay(true)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Copies `src` to `dst` until `src` ends, or reads and drops its bytes once `cut` is set
/// (or always, when there is no `dst`). When `src` ends (end of file or error) and the
/// connection is not cut, shuts down `dst`'s write half so the half-close reaches the peer.
fn copy(mut src: TcpStream, mut dst: Option<TcpStream>, cut: &AtomicBool, shared: &Shared) {
    let mut buf = vec![0; BUF_LEN];
    loop {
        if shared.stopped() {
            // Drop shuts every socket down.
            return;
        }
        let len = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(len) => len,
            Err(e) if timed_out(&e) => continue,
            Err(_) => break,
        };
        let Some(dst) = dst.as_mut() else { continue };
        if forward(dst, &buf[..len], cut, shared).is_err() {
            break;
        }
        shared.forwarded.fetch_add(len as u64, Ordering::SeqCst);
        let rate = shared.rate.load(Ordering::SeqCst);
        if rate > 0 {
            thread::sleep(Duration::from_secs_f64(len as f64 / rate as f64));
        }
    }
    // Under a cut nothing crosses, not even the end of the stream: heal() closes both sides.
    if !cut.load(Ordering::SeqCst)
        && let Some(dst) = &dst
    {
        let _ = dst.shutdown(Shutdown::Write);
    }
}

/// Writes `data` to `dst` unless the connection is or becomes cut, or the proxy stops, in
/// which case the rest of `data` is dropped.
fn forward(
    dst: &mut TcpStream,
    mut data: &[u8],
    cut: &AtomicBool,
    shared: &Shared,
) -> io::Result<()> {
    while !data.is_empty() {
        if cut.load(Ordering::SeqCst) || shared.stopped() {
            return Ok(());
        }
        match dst.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(len) => data = &data[len..],
            Err(e) if timed_out(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
