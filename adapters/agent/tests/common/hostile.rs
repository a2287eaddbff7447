//! Harness for the hostile-load tests (tests/hostile.rs): a controller from `lockstep
//! bootstrap` whose worker pid is recorded at the start, its processes' peak resident memory
//! sampled throughout, a legitimate client on 127.0.0.1 that opens a new connection, logs in
//! and calls `Client.FullStatus` in a loop and records every call, raw TLS and websocket
//! connections from any loopback source address for the attackers, and `/metrics`.
#![allow(dead_code, clippy::print_stderr)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::common::Controller;

/// The bound on the controller's processes together (launcher and worker).
pub const MEMORY_BOUND_BYTES: u64 = 256 << 20;

/// Resident memory at which the sampler stops the controller at once (SIGKILL to its process
/// group) and the test fails: a controller without bounds grows by gigabytes in seconds under
/// a login flood, and the machine running the tests is shared.
pub const RUNAWAY_RSS_BYTES: u64 = 1 << 30;

/// The legitimate client's address; attackers use 127.0.0.2 and up.
pub const LEGIT_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// How long any one step of a client may wait for the server before the test calls it a
/// hang (a guard against a test that never ends, not a latency bound).
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// The pause between two of the legitimate client's calls.
const LEGIT_PAUSE: Duration = Duration::from_millis(100);

/// `127.0.0.<last>`.
pub fn loopback(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// One hostile load at a time in this test binary: each test's latencies and memory are its
/// own load's, not its neighbour's (the machine has 2 cores).
pub static ONE_LOAD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Raises this process's soft limit on open files to its hard limit; returns the new soft
/// limit (`u64::MAX`: unlimited).
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(error) = setrlimit(Resource::Nofile, raised) {
        eprintln!("cannot raise RLIMIT_NOFILE to {:?}: {error}", limit.maximum);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// A TCP connection to `target` from `source` (any port).
pub async fn tcp_from(source: Ipv4Addr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

pub type Tls = tokio_rustls::client::TlsStream<TcpStream>;
pub type Socket = tokio_tungstenite::WebSocketStream<Tls>;

/// A reply, or how the connection ended instead.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    Reply(Value),
    /// A close frame (its code), the end of the stream, or a read error.
    Closed(String),
}

/// The controller under attack: where it listens, its CA and admin password, its launcher
/// and worker, and a sampler of their memory.
pub struct Target {
    pub controller: Controller,
    pub address: SocketAddr,
    pub ca_pem: String,
    pub model_uuid: String,
    pub password: String,
    pub launcher: u32,
    pub worker: u32,
    tls: Arc<rustls::ClientConfig>,
    memory: MemorySampler,
}

impl Target {
    /// `lockstep bootstrap --api-port 0` with `env` (the `LOCKSTEPD_*` limits a test makes
    /// smaller), then the worker's pid and a memory sampler.
    pub fn bootstrap(env: &[(&str, &str)]) -> Target {
        let controller = Controller::bootstrap(&[], env);
        controller.assert_bootstrapped();
        let file = controller.controller_file();
        let address: SocketAddr = file.api_endpoints[0]
            .parse()
            .unwrap_or_else(|error| panic!("{:?}: {error}", file.api_endpoints));
        assert_eq!(address.ip(), LEGIT_SOURCE, "the API listens on {address}");
        let launcher = controller.launcher_pid().expect("the launcher's pid file");
        let worker = controller.worker_pid().expect("a worker runs");
        let tls = lockstep_transport::tls::client_config(
            &file.ca_cert,
            &[&rustls::version::TLS13, &rustls::version::TLS12],
        )
        .expect("the controller's CA");
        Target {
            address,
            ca_pem: file.ca_cert,
            model_uuid: file.model_uuid,
            password: file.password,
            launcher,
            worker,
            tls,
            memory: MemorySampler::start(launcher, worker),
            controller,
        }
    }

    pub fn tls_config(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.tls)
    }

    /// TCP from `source`, then TLS with the controller's CA.
    pub async fn tls_from(&self, source: Ipv4Addr) -> Result<Tls, String> {
        let tcp = tcp_from(source, self.address)
            .await
            .map_err(|error| format!("TCP from {source}: {error}"))?;
        let name = rustls::pki_types::ServerName::try_from("juju-apiserver").expect("a name");
        tokio_rustls::TlsConnector::from(self.tls_config())
            .connect(name, tcp)
            .await
            .map_err(|error| format!("TLS from {source}: {error}"))
    }

    /// The model's API websocket, from `source`; nobody logged in yet.
    pub async fn websocket_from(&self, source: Ipv4Addr) -> Result<Socket, String> {
        let tls = self.tls_from(source).await?;
        let url = format!("wss://{}/model/{}/api", self.address, self.model_uuid);
        tokio_tungstenite::client_async(url, tls)
            .await
            .map(|(socket, _)| socket)
            .map_err(|error| format!("websocket from {source}: {error}"))
    }

    /// The `Admin.Login` request of the admin user with `password`.
    pub fn login_request(id: u64, password: &str) -> Value {
        json!({"request-id": id, "type": "Admin", "version": 3, "request": "Login",
               "params": {"auth-tag": "user-admin", "credentials": password,
                          "client-version": lockstep_transport::server::SERVER_VERSION}})
    }

    /// A websocket from `source` on which the admin logged in with the right password.
    pub async fn logged_in_from(&self, source: Ipv4Addr) -> Result<Socket, String> {
        let mut socket = self.websocket_from(source).await?;
        let reply = request(&mut socket, Target::login_request(1, &self.password)).await?;
        if reply.get("error").is_some() {
            return Err(format!("login from {source} refused: {reply}"));
        }
        Ok(socket)
    }

    /// One of the legitimate client's calls: a new connection from 127.0.0.1, `Admin.Login`
    /// as admin, `Client.FullStatus`. `Err` says what went wrong.
    pub async fn legit_call(&self) -> Result<(), String> {
        let mut socket = self.websocket_from(LEGIT_SOURCE).await?;
        let login = request(&mut socket, Target::login_request(1, &self.password)).await?;
        if login.get("error").is_some() {
            return Err(format!("login refused: {login}"));
        }
        let status = request(
            &mut socket,
            json!({"request-id": 2, "type": "Client", "version": 8, "request": "FullStatus",
                   "params": {}}),
        )
        .await?;
        if status.get("error").is_some() || status["response"]["model"].is_null() {
            return Err(format!("FullStatus failed: {status}"));
        }
        let _ = socket.close(None).await;
        Ok(())
    }

    /// `GET /metrics` from 127.0.0.1 over TLS: the body.
    pub async fn metrics(&self) -> Metrics {
        let fetch = async {
            let mut tls = self.tls_from(LEGIT_SOURCE).await?;
            let request = format!(
                "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.address
            );
            tls.write_all(request.as_bytes())
                .await
                .map_err(|error| format!("sending GET /metrics: {error}"))?;
            tls.flush()
                .await
                .map_err(|error| format!("sending GET /metrics: {error}"))?;
            let mut response = Vec::new();
            // The server may end the TLS stream without close_notify: what arrived counts.
            let _ = tls.read_to_end(&mut response).await;
            let response = String::from_utf8_lossy(&response).into_owned();
            let (head, body) = response
                .split_once("\r\n\r\n")
                .ok_or_else(|| format!("no HTTP response: {response:?}"))?;
            if !head.starts_with("HTTP/1.1 200") {
                return Err(format!("GET /metrics: {head}"));
            }
            Ok::<_, String>(Metrics(body.to_owned()))
        };
        let error = match tokio::time::timeout(HANG_GUARD, fetch).await {
            Ok(Ok(metrics)) => return metrics,
            Ok(Err(error)) => error,
            Err(_) => format!("GET /metrics: no answer within {HANG_GUARD:?}"),
        };
        self.assert_no_runaway();
        panic!("{error}");
    }

    /// Fails the test if the memory sampler had to stop the controller.
    fn assert_no_runaway(&self) {
        if let Some(runaway) = self.memory.runaway() {
            panic!(
                "the controller's resident memory ran away: {runaway}; the test stopped it \
                 (the bound is {} MiB)",
                MEMORY_BOUND_BYTES >> 20
            );
        }
    }

    /// Starts the legitimate client's loop.
    pub fn start_legit(self: &Arc<Target>) -> Legit {
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::clone(self);
        let stopping = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut record = LegitRecord::default();
            while !stopping.load(Ordering::SeqCst) {
                let started = Instant::now();
                let outcome = match tokio::time::timeout(HANG_GUARD, target.legit_call()).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(format!("no answer within {HANG_GUARD:?}")),
                };
                let latency = started.elapsed();
                match outcome {
                    Ok(()) => record.calls.push((started, latency)),
                    Err(error) => record.failures.push(format!(
                        "call {} (started {:?} into the test): {error}",
                        record.calls.len() + record.failures.len() + 1,
                        started.duration_since(record.began)
                    )),
                }
                tokio::time::sleep(LEGIT_PAUSE).await;
            }
            record
        });
        Legit { stop, task }
    }

    /// Ends the test's common part: stops the memory sampler, prints the figures line
    /// (`hostile <name>: legit median <ms> worst <ms> over <n> calls; peak rss <MiB>`), then
    /// asserts that the worker is the one that served at the start, alive; that the
    /// legitimate client succeeded on every call, some of them during the attack;
    /// and that the controller's peak resident memory stayed under the bound.
    pub fn finish(&self, name: &str, legit: &LegitRecord, attack: &Attack) {
        let memory = self.memory.stop();
        let latencies: Vec<Duration> = legit.calls.iter().map(|(_, latency)| *latency).collect();
        eprintln!(
            "hostile {name}: legit median {:.1} worst {:.1} over {} calls; peak rss {:.1} \
             (launcher {:.1}, worker {:.1})",
            millis(median(&latencies)),
            millis(latencies.iter().max().copied().unwrap_or_default()),
            latencies.len(),
            mib(memory.peak_hwm_bytes),
            mib(memory.launcher_hwm_bytes),
            mib(memory.worker_hwm_bytes),
        );
        self.assert_no_runaway();
        let worker_now = self.controller.worker_pid();
        assert!(
            worker_now == Some(self.worker) && lockstep_agent::process::alive(self.worker),
            "the worker that served at the start ({}) is gone: the launcher's worker is now \
             {worker_now:?}; peak rss {:.1} MiB",
            self.worker,
            mib(memory.peak_hwm_bytes)
        );
        assert!(
            legit.failures.is_empty(),
            "the legitimate client failed {} of {} calls:\n{}",
            legit.failures.len(),
            legit.failures.len() + legit.calls.len(),
            legit.failures.join("\n")
        );
        let during = legit
            .calls
            .iter()
            .filter(|(started, latency)| {
                *started < attack.ended && *started + *latency > attack.began
            })
            .count();
        assert!(
            during > 0,
            "none of the legitimate client's {} calls overlapped the attack ({:?} long)",
            legit.calls.len(),
            attack.ended - attack.began
        );
        assert!(
            memory.peak_hwm_bytes < MEMORY_BOUND_BYTES,
            "peak resident memory of launcher and worker together: {:.1} MiB (launcher {:.1}, \
             worker {:.1}), over the bound of {} MiB",
            mib(memory.peak_hwm_bytes),
            mib(memory.launcher_hwm_bytes),
            mib(memory.worker_hwm_bytes),
            MEMORY_BOUND_BYTES >> 20
        );
    }
}

/// When the attack ran.
#[derive(Clone, Copy, Debug)]
pub struct Attack {
    pub began: Instant,
    pub ended: Instant,
}

/// Sends `frame` and waits for the reply carrying its `request-id` (other replies are
/// skipped); `Err` if the connection ended first or nothing came within [`HANG_GUARD`].
pub async fn request(socket: &mut Socket, frame: Value) -> Result<Value, String> {
    let id = frame["request-id"].clone();
    send(socket, &frame).await?;
    loop {
        match receive(socket).await {
            Received::Reply(reply) if reply["request-id"] == id => return Ok(reply),
            Received::Reply(_) => continue,
            Received::Closed(how) => return Err(format!("connection closed: {how}")),
        }
    }
}

/// Sends one text frame.
pub async fn send(socket: &mut Socket, frame: &Value) -> Result<(), String> {
    match tokio::time::timeout(
        HANG_GUARD,
        socket.send(Message::Text(frame.to_string().into())),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("sending: {error}")),
        Err(_) => Err(format!("sending: blocked for {HANG_GUARD:?}")),
    }
}

/// The next reply (pings skipped), or how the connection ended; a connection silent for
/// [`HANG_GUARD`] counts as closed ("silent").
pub async fn receive(socket: &mut Socket) -> Received {
    loop {
        let next = match tokio::time::timeout(HANG_GUARD, socket.next()).await {
            Ok(next) => next,
            Err(_) => return Received::Closed(format!("silent for {HANG_GUARD:?}")),
        };
        match next {
            Some(Ok(Message::Text(text))) => {
                return match serde_json::from_str(&text) {
                    Ok(reply) => Received::Reply(reply),
                    Err(error) => Received::Closed(format!("not JSON ({error}): {text}")),
                };
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            Some(Ok(Message::Binary(bytes))) => {
                return Received::Closed(format!("a binary frame of {} bytes", bytes.len()));
            }
            Some(Ok(Message::Close(frame))) => {
                return Received::Closed(match frame {
                    Some(frame) => format!("close {} {}", u16::from(frame.code), frame.reason),
                    None => "close".to_owned(),
                });
            }
            Some(Err(error)) => return Received::Closed(format!("read error: {error}")),
            None => return Received::Closed("end of stream".to_owned()),
        }
    }
}

/// The legitimate client's loop, running.
pub struct Legit {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<LegitRecord>,
}

impl Legit {
    /// Stops the loop after the call in progress and returns its record.
    pub async fn stop(self) -> LegitRecord {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the legitimate client's loop")
    }
}

/// Every call of the legitimate client: when each successful one started and how long it
/// took; what went wrong with the others.
#[derive(Debug)]
pub struct LegitRecord {
    pub began: Instant,
    pub calls: Vec<(Instant, Duration)>,
    pub failures: Vec<String>,
}

impl Default for LegitRecord {
    fn default() -> LegitRecord {
        LegitRecord {
            began: Instant::now(),
            calls: Vec::new(),
            failures: Vec::new(),
        }
    }
}

/// `/metrics`, as Prometheus text.
#[derive(Clone, Debug)]
pub struct Metrics(pub String);

impl Metrics {
    /// The value of the sample named exactly `series` (`name` or `name{label="value"}`);
    /// 0 when absent (a counter never incremented may not be listed).
    pub fn value(&self, series: &str) -> f64 {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().ok()).flatten()
            })
            .unwrap_or(0.0)
    }

    /// `lockstep_api_refusals_total{reason="<reason>"}`.
    pub fn refusals(&self, reason: &str) -> f64 {
        self.value(&format!(
            "lockstep_api_refusals_total{{reason=\"{reason}\"}}"
        ))
    }

    /// The lines of the API's own limits (`lockstep_api_connections`, `_logins`,
    /// `_refusals_total`, ...), for messages and the test's output.
    pub fn limits(&self) -> String {
        self.0
            .lines()
            .filter(|line| {
                !line.starts_with('#')
                    && line.starts_with("lockstep_api_")
                    && !line.starts_with("lockstep_api_calls_total")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The peak resident memory of the controller's launcher and worker, sampled every 10 ms
/// from `/proc/<pid>/status` (`VmHWM`, the kernel's own high-water mark, so a peak between
/// two samples counts too).
struct MemorySampler {
    stop: Arc<AtomicBool>,
    /// Set when the resident memory passed [`RUNAWAY_RSS_BYTES`] and the sampler killed the
    /// controller.
    runaway: Arc<std::sync::Mutex<Option<String>>>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<Memory>>>,
}

#[derive(Clone, Debug, Default)]
struct Memory {
    launcher_hwm_bytes: u64,
    worker_hwm_bytes: u64,
    /// The largest sum of the two high-water marks seen.
    peak_hwm_bytes: u64,
}

/// `VmHWM` and `VmRSS` of `pid`, in bytes; `None` once the process is gone.
fn status_memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

impl MemorySampler {
    fn start(launcher: u32, worker: u32) -> MemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let runaway: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let ran_away = Arc::clone(&runaway);
        let thread = std::thread::spawn(move || {
            let mut memory = Memory::default();
            loop {
                let (launcher_hwm, launcher_rss) = status_memory(launcher).unwrap_or_default();
                let (worker_hwm, worker_rss) = status_memory(worker).unwrap_or_default();
                memory.launcher_hwm_bytes = memory.launcher_hwm_bytes.max(launcher_hwm);
                memory.worker_hwm_bytes = memory.worker_hwm_bytes.max(worker_hwm);
                memory.peak_hwm_bytes = memory.peak_hwm_bytes.max(launcher_hwm + worker_hwm);
                let rss = launcher_rss + worker_rss;
                let mut ran_away = ran_away.lock().expect("not poisoned");
                if rss > RUNAWAY_RSS_BYTES && ran_away.is_none() {
                    let runaway = format!(
                        "{:.1} MiB resident (launcher {:.1}, worker {:.1})",
                        mib(rss),
                        mib(launcher_rss),
                        mib(worker_rss)
                    );
                    eprintln!("the controller's memory ran away ({runaway}): killing it");
                    *ran_away = Some(runaway);
                    if let Some(group) = rustix::process::Pid::from_raw(launcher as i32) {
                        let _ = rustix::process::kill_process_group(
                            group,
                            rustix::process::Signal::KILL,
                        );
                    }
                }
                drop(ran_away);
                if stopping.load(Ordering::SeqCst) {
                    return memory;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        MemorySampler {
            stop,
            runaway,
            thread: std::sync::Mutex::new(Some(thread)),
        }
    }

    /// What the sampler saw when it stopped a runaway controller.
    fn runaway(&self) -> Option<String> {
        self.runaway.lock().expect("not poisoned").clone()
    }

    /// Stops sampling (after one last sample) and returns the peaks.
    fn stop(&self) -> Memory {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .lock()
            .expect("not poisoned")
            .take()
            .map(|thread| thread.join().expect("the memory sampler"))
            .unwrap_or_default()
    }
}

impl Drop for MemorySampler {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

pub fn median(latencies: &[Duration]) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}
