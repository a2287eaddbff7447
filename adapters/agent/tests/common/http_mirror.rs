//! A mirror directory served over plain HTTP on 127.0.0.1 (a free port), whose metadata
//! answers (`streams/v1/...`) are held back by a delay: a controller looking it up stays in
//! `checking-agent-version` that long, long enough for a test to act in that phase. Or the
//! mirror holds some requests back until the test releases them ([`HoldBack`]): the
//! controller that asked stays in its phase for as long as the test needs, with no timing.
//! One thread accepts, one thread per connection answers `GET` with the file (`Connection:
//! close`, no `Range`: a resuming client starts again from the first byte). Dropping it
//! releases what it holds, stops accepting and joins every thread.
//!
//! [`HttpMirror::serve_tls`] serves the same over HTTPS with a certificate for 127.0.0.1
//! (and `localhost`) signed by a CA made for the test ([`TestCa`]);
//! [`HttpMirror::blackhole_metadata`] makes every later metadata request hang (a mirror that
//! accepts and never answers); [`HttpMirror::redirect_tls`] answers every request with a
//! redirect to another origin.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct HttpMirror {
    address: SocketAddr,
    tls: bool,
    stop: Arc<AtomicBool>,
    hold: Arc<Hold>,
    acceptor: Option<JoinHandle<()>>,
}

/// What a mirror answers: files, or redirects.
#[derive(Clone, Debug)]
enum Serve {
    /// The files under this directory.
    Files(PathBuf),
    /// `302 Found` to this origin (`https://host:port`) and the path asked for.
    RedirectTo(String),
}

/// Which requests a mirror holds back, unanswered, until [`HttpMirror::release`].
#[derive(Clone, Debug)]
pub enum HoldBack {
    /// None.
    Nothing,
    /// The download of one agent binary, `juju-<binary>.tgz` (`binary` as
    /// `2.9.44-ubuntu-amd64`): the controller downloading it stays `upgrading`.
    Binary(String),
    /// Metadata (`streams/...`) asked for after [`HttpMirror::blackhole_metadata`].
    MetadataFromNow,
    /// Metadata (`streams/...`) asked for once the mirror has served a binary. `lockstep
    /// bootstrap` reads the metadata and downloads its binary before it starts the
    /// controller; the controller then checks the metadata again (`checking-agent-version`),
    /// and that check is held.
    MetadataAfterABinary,
}

struct Hold {
    back: HoldBack,
    state: Mutex<HoldState>,
    changed: Condvar,
}

#[derive(Default)]
struct HoldState {
    released: bool,
    blackholed: bool,
    binaries_asked: usize,
    held: usize,
    /// The path of every tarball asked for, in order.
    tarballs: Vec<String>,
}

impl Hold {
    /// Blocks while `path` is one to hold back and the test has not released the mirror.
    fn wait_if_held(&self, path: &str) {
        let mut state = self.state.lock().expect("not poisoned");
        let binary = path.ends_with(".tgz");
        let held = match &self.back {
            HoldBack::Nothing => false,
            HoldBack::Binary(name) => binary && path.ends_with(&format!("/juju-{name}.tgz")),
            HoldBack::MetadataFromNow => path.contains("/streams/") && state.blackholed,
            HoldBack::MetadataAfterABinary => {
                path.contains("/streams/") && state.binaries_asked > 0
            }
        };
        if binary {
            state.binaries_asked += 1;
            state.tarballs.push(path.to_owned());
        }
        if !held || state.released {
            return;
        }
        state.held += 1;
        while !state.released {
            state = self.changed.wait(state).expect("not poisoned");
        }
    }
}

impl HttpMirror {
    /// Serves `root` (the directory holding `tools/`).
    pub fn serve(root: &Path, metadata_delay: Duration) -> HttpMirror {
        HttpMirror::serve_holding(root, metadata_delay, HoldBack::Nothing)
    }

    /// Serves `root`, holding back the requests `back` names until [`HttpMirror::release`].
    pub fn serve_holding(root: &Path, metadata_delay: Duration, back: HoldBack) -> HttpMirror {
        HttpMirror::start(Serve::Files(root.into()), metadata_delay, back, None)
    }

    /// Serves `root` over HTTPS with `ca`'s certificate, holding back the
    /// requests `back` names.
    pub fn serve_tls(root: &Path, ca: &TestCa, back: HoldBack) -> HttpMirror {
        let serve = Serve::Files(root.into());
        HttpMirror::start(serve, Duration::ZERO, back, Some(Arc::clone(&ca.server)))
    }

    /// Over HTTPS with `ca`'s certificate, answers every request with `302 Found` to the
    /// same path at `origin` (`https://host:port`).
    pub fn redirect_tls(ca: &TestCa, origin: &str) -> HttpMirror {
        let serve = Serve::RedirectTo(origin.to_owned());
        let server = Some(Arc::clone(&ca.server));
        HttpMirror::start(serve, Duration::ZERO, HoldBack::Nothing, server)
    }

    fn start(
        serve: Serve,
        metadata_delay: Duration,
        back: HoldBack,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> HttpMirror {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
        let address = listener.local_addr().expect("a local address");
        let stop = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(Hold {
            back,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let tls_on = tls.is_some();
        let stopping = Arc::clone(&stop);
        let holding = Arc::clone(&hold);
        let acceptor = std::thread::spawn(move || {
            let mut connections = Vec::new();
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let serve = serve.clone();
                let hold = Arc::clone(&holding);
                let tls = tls.clone();
                connections.push(std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                    let _ = match tls {
                        None => answer(stream, &serve, metadata_delay, &hold),
                        Some(config) => rustls::ServerConnection::new(config)
                            .map_err(std::io::Error::other)
                            .and_then(|connection| {
                                let stream = rustls::StreamOwned::new(connection, stream);
                                answer(stream, &serve, metadata_delay, &hold)
                            }),
                    };
                }));
            }
            for connection in connections {
                let _ = connection.join();
            }
        });
        HttpMirror {
            address,
            tls: tls_on,
            stop,
            hold,
            acceptor: Some(acceptor),
        }
    }

    /// The port it listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The URL of `tools/`, as `--metadata-source` takes it.
    pub fn tools_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/tools/", self.address)
    }

    /// From now on, every metadata request hangs until [`HttpMirror::release`] (with
    /// [`HoldBack::MetadataFromNow`]).
    pub fn blackhole_metadata(&self) {
        self.hold.state.lock().expect("not poisoned").blackholed = true;
    }

    /// How many times the tarball of `binary` (`2.9.44-ubuntu-amd64`) was asked for.
    pub fn tarball_requests(&self, binary: &str) -> usize {
        let name = format!("/juju-{binary}.tgz");
        let state = self.hold.state.lock().expect("not poisoned");
        state
            .tarballs
            .iter()
            .filter(|path| path.ends_with(&name))
            .count()
    }

    /// How many requests the mirror has held back so far (answered or not).
    pub fn held(&self) -> usize {
        self.hold.state.lock().expect("not poisoned").held
    }

    /// Answers every request held back, and every later one at once.
    pub fn release(&self) {
        self.hold.state.lock().expect("not poisoned").released = true;
        self.hold.changed.notify_all();
    }
}

impl Drop for HttpMirror {
    fn drop(&mut self) {
        self.release();
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(self.address);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn answer(
    mut stream: impl Read + Write,
    serve: &Serve,
    metadata_delay: Duration,
    hold: &Hold,
) -> std::io::Result<()> {
    let mut request = String::new();
    {
        // A GET has no body: what the reader buffered past the head is not needed.
        let mut reader = BufReader::new(&mut stream);
        reader.read_line(&mut request)?;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
                break;
            }
        }
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let root = match serve {
        Serve::Files(root) => root,
        Serve::RedirectTo(origin) => {
            return write!(
                stream,
                "HTTP/1.1 302 Found\r\nLocation: {origin}{path}\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            );
        }
    };
    let Some(file) = resolve(root, path) else {
        return stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    };
    hold.wait_if_held(path);
    if path.contains("/streams/") {
        std::thread::sleep(metadata_delay);
    }
    let mut body = std::fs::File::open(&file)?;
    let length = body.metadata()?.len();
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    )?;
    std::io::copy(&mut body, &mut stream)?;
    stream.flush()
}

/// A certificate authority made for one test, and a server configuration for 127.0.0.1 and
/// `localhost` with a certificate it signed.
pub struct TestCa {
    /// The CA's certificate, PEM: what `--metadata-ca` or `SSL_CERT_FILE` is given.
    pub pem: String,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new() -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let certificate = params.signed_by(&key, &issuer).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![certificate.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        TestCa {
            pem: ca.pem(),
            server: Arc::new(server),
        }
    }
}

/// The regular file under `root` that `path` names; nothing outside it.
fn resolve(root: &Path, path: &str) -> Option<PathBuf> {
    let relative = Path::new(path.split('?').next()?.trim_start_matches('/'));
    if relative
        .components()
        .any(|component| !matches!(component, Component::Normal(_)))
    {
        return None;
    }
    let file = root.join(relative);
    file.is_file().then_some(file)
}
