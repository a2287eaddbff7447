//! A mirror directory served over plain HTTP on 127.0.0.1 (a free port), whose metadata
//! answers (`streams/v1/...`) are held back by a delay: a controller looking it up stays in
//! `checking-agent-version` that long, long enough for a test to act in that phase. Or the
//! mirror holds some requests back until the test releases them ([`HoldBack`]): the
//! controller that asked stays in its phase for as long as the test needs, with no timing.
//! One thread accepts, one thread per connection answers `GET` with the file (`Connection:
//! close`, no `Range`: a resuming client starts again from the first byte). Dropping it
//! releases what it holds, stops accepting and joins every thread.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct HttpMirror {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    hold: Arc<Hold>,
    acceptor: Option<JoinHandle<()>>,
}

/// Which requests a mirror holds back, unanswered, until [`HttpMirror::release`].
#[derive(Clone, Debug)]
pub enum HoldBack {
    /// None.
    Nothing,
    /// The download of one agent binary, `juju-<binary>.tgz` (`binary` as
    /// `2.9.44-ubuntu-amd64`): the controller downloading it stays `upgrading`.
    Binary(String),
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
    binaries_asked: usize,
    held: usize,
}

impl Hold {
    /// Blocks while `path` is one to hold back and the test has not released the mirror.
    fn wait_if_held(&self, path: &str) {
        let mut state = self.state.lock().expect("not poisoned");
        let binary = path.ends_with(".tgz");
        let held = match &self.back {
            HoldBack::Nothing => false,
            HoldBack::Binary(name) => binary && path.ends_with(&format!("/juju-{name}.tgz")),
            HoldBack::MetadataAfterABinary => {
                path.contains("/streams/") && state.binaries_asked > 0
            }
        };
        if binary {
            state.binaries_asked += 1;
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
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
        let address = listener.local_addr().expect("a local address");
        let stop = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(Hold {
            back,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let root = root.to_path_buf();
        let stopping = Arc::clone(&stop);
        let holding = Arc::clone(&hold);
        let acceptor = std::thread::spawn(move || {
            let mut connections = Vec::new();
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let root = root.clone();
                let hold = Arc::clone(&holding);
                connections.push(std::thread::spawn(move || {
                    let _ = answer(stream, &root, metadata_delay, &hold);
                }));
            }
            for connection in connections {
                let _ = connection.join();
            }
        });
        HttpMirror {
            address,
            stop,
            hold,
            acceptor: Some(acceptor),
        }
    }

    /// The URL of `tools/`, as `--metadata-source` takes it.
    pub fn tools_url(&self) -> String {
        format!("http://{}/tools/", self.address)
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
    stream: TcpStream,
    root: &Path,
    metadata_delay: Duration,
    hold: &Hold,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let mut stream = stream;
    let path = request.split_whitespace().nth(1).unwrap_or("/");
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
