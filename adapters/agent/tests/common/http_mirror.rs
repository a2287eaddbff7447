//! A mirror directory served over plain HTTP on 127.0.0.1 (a free port), whose metadata
//! answers (`streams/v1/...`) are held back by a delay: a controller looking it up stays in
//! `checking-agent-version` that long, long enough for a test to act in that phase. One
//! thread accepts, one thread per connection answers `GET` with the file (`Connection:
//! close`, no `Range`: a resuming client starts again from the first byte). Dropping it
//! stops accepting and joins every thread.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct HttpMirror {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl HttpMirror {
    /// Serves `root` (the directory holding `tools/`).
    pub fn serve(root: &Path, metadata_delay: Duration) -> HttpMirror {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
        let address = listener.local_addr().expect("a local address");
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let stopping = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            let mut connections = Vec::new();
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let root = root.clone();
                connections.push(std::thread::spawn(move || {
                    let _ = answer(stream, &root, metadata_delay);
                }));
            }
            for connection in connections {
                let _ = connection.join();
            }
        });
        HttpMirror {
            address,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// The URL of `tools/`, as `--metadata-source` takes it.
    pub fn tools_url(&self) -> String {
        format!("http://{}/tools/", self.address)
    }
}

impl Drop for HttpMirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(self.address);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn answer(stream: TcpStream, root: &Path, metadata_delay: Duration) -> std::io::Result<()> {
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
