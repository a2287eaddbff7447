//! A real HTTP(S) server for the tests and the benchmark: serves a mirror directory on
//! 127.0.0.1 at a free port, with `Range` support and misbehaviours a test switches on
//! (stall, drop the connection, corrupt a byte, ignore `Range`, omit `Content-Length`,
//! send extra bytes). It records every request. Stopping it (or dropping it) aborts the
//! accept task, whose `JoinSet` aborts every connection task.

use std::convert::Infallible;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

const CHUNK_BYTES: usize = 64 * 1024;

/// What the server does wrong; everything off by default.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// After this many body bytes of a response, send nothing more and keep the
    /// connection open.
    pub stall_after_bytes: Option<u64>,
    /// After this many body bytes of a response, fail the body (hyper closes the
    /// connection), for the next `drops_remaining` responses.
    pub drop_after_bytes: Option<u64>,
    pub drops_remaining: u32,
    /// Flip the byte at this offset of the file.
    pub corrupt_at: Option<u64>,
    /// Answer every request with `200` and the whole file.
    pub ignore_range: bool,
    /// Send no `Content-Length` (chunked encoding).
    pub omit_content_length: bool,
    /// Append this many zero bytes to every file.
    pub extra_bytes: u64,
    /// Answer the next `failures_remaining` requests with this status and no body.
    pub fail_with_status: Option<u16>,
    pub failures_remaining: u32,
    /// Hold every answer back this long before the headers.
    pub delay_headers: Option<std::time::Duration>,
    /// Answer every request with `302 Found` to this base URL followed by the request's
    /// path.
    pub redirect_to: Option<String>,
}

/// One request the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
}

#[derive(Debug)]
struct Shared {
    root: PathBuf,
    behaviour: Mutex<Behaviour>,
    log: Mutex<Vec<Served>>,
}

#[derive(Debug)]
pub struct TestServer {
    pub address: SocketAddr,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serves `root` over plain HTTP.
    pub async fn start(root: PathBuf) -> TestServer {
        TestServer::start_with(root, None).await
    }

    /// Serves `root`, over TLS when `tls` is given.
    pub async fn start_with(root: PathBuf, tls: Option<Arc<rustls::ServerConfig>>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            root,
            behaviour: Mutex::new(Behaviour::default()),
            log: Mutex::new(Vec::new()),
        });
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let accepting = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            // Dropped, with every connection task in it, when this task is aborted.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                while connections.try_join_next().is_some() {}
                let shared = Arc::clone(&accepting);
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move {
                            let delay = shared.behaviour.lock().unwrap().delay_headers;
                            if let Some(delay) = delay {
                                tokio::time::sleep(delay).await;
                            }
                            Ok::<_, Infallible>(answer(&shared, &request))
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                    }
                });
            }
        });
        TestServer {
            address,
            shared,
            task: Some(task),
        }
    }

    /// `http://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    /// Changes the behaviour for the next requests.
    pub fn behave(&self, change: impl FnOnce(&mut Behaviour)) {
        change(&mut self.shared.behaviour.lock().unwrap());
    }

    /// Every request answered so far.
    pub fn log(&self) -> Vec<Served> {
        self.shared.log.lock().unwrap().clone()
    }

    /// Stops accepting and aborts every connection; returns when the task has ended.
    pub async fn stop(mut self) {
        let task = self.task.take().unwrap();
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

type Body = UnsyncBoxBody<Bytes, io::Error>;

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = status;
    response
}

fn answer(shared: &Shared, request: &Request<Incoming>) -> Response<Body> {
    let behaviour = shared.behaviour.lock().unwrap().clone();
    let path = request.uri().path().trim_start_matches('/').to_owned();
    let range = request
        .headers()
        .get(RANGE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let response = match behaviour.fail_with_status {
        _ if behaviour.redirect_to.is_some() => {
            let mut response = empty(StatusCode::FOUND);
            let location = format!("{}{path}", behaviour.redirect_to.as_deref().unwrap_or(""));
            response.headers_mut().insert(
                hyper::header::LOCATION,
                hyper::header::HeaderValue::from_str(&location).unwrap(),
            );
            response
        }
        Some(status) if behaviour.failures_remaining > 0 => {
            shared.behaviour.lock().unwrap().failures_remaining -= 1;
            let mut response = empty(StatusCode::from_u16(status).unwrap());
            if status == 503 || status == 429 {
                // The wait a busy server asks for, which the error reports.
                response.headers_mut().insert(
                    hyper::header::RETRY_AFTER,
                    hyper::header::HeaderValue::from_static("7"),
                );
            }
            response
        }
        _ => serve(shared, &behaviour, &path, range.as_deref()),
    };
    if behaviour.drop_after_bytes.is_some() && behaviour.drops_remaining > 0 {
        shared.behaviour.lock().unwrap().drops_remaining -= 1;
    }
    shared.log.lock().unwrap().push(Served {
        path,
        range,
        status: response.status().as_u16(),
    });
    response
}

fn serve(
    shared: &Shared,
    behaviour: &Behaviour,
    path: &str,
    range: Option<&str>,
) -> Response<Body> {
    if path
        .split('/')
        .any(|component| component == ".." || component.contains('%'))
    {
        return empty(StatusCode::BAD_REQUEST);
    }
    let Ok(mut file) = File::open(shared.root.join(path)) else {
        return empty(StatusCode::NOT_FOUND);
    };
    let file_bytes = match file.metadata() {
        Ok(metadata) if metadata.is_file() => metadata.len(),
        _ => return empty(StatusCode::NOT_FOUND),
    };
    let total = file_bytes + behaviour.extra_bytes;
    let start = match range.and_then(|range| range.strip_prefix("bytes=")) {
        Some(spec) if !behaviour.ignore_range => {
            match spec
                .strip_suffix('-')
                .and_then(|first| first.parse::<u64>().ok())
            {
                Some(first) if first < total => first,
                _ => return empty(StatusCode::RANGE_NOT_SATISFIABLE),
            }
        }
        _ => 0,
    };
    file.seek(SeekFrom::Start(start.min(file_bytes))).unwrap();
    let state = BodyState {
        file,
        file_bytes,
        position: start,
        total,
        sent: 0,
        behaviour: if behaviour.drops_remaining > 0 {
            behaviour.clone()
        } else {
            Behaviour {
                drop_after_bytes: None,
                ..behaviour.clone()
            }
        },
    };
    let stream = futures_util::stream::unfold(state, next_frame);
    let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
    if start > 0 {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        response.headers_mut().insert(
            CONTENT_RANGE,
            format!("bytes {start}-{}/{total}", total - 1)
                .parse()
                .unwrap(),
        );
    }
    if !behaviour.omit_content_length {
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, (total - start).into());
    }
    response
}

struct BodyState {
    file: File,
    file_bytes: u64,
    position: u64,
    total: u64,
    sent: u64,
    behaviour: Behaviour,
}

async fn next_frame(mut state: BodyState) -> Option<(Result<Frame<Bytes>, io::Error>, BodyState)> {
    if state.position >= state.total {
        return None;
    }
    if state
        .behaviour
        .stall_after_bytes
        .is_some_and(|limit| state.sent >= limit)
    {
        std::future::pending::<()>().await;
    }
    if let Some(limit) = state.behaviour.drop_after_bytes
        && state.sent >= limit
    {
        // Let hyper flush what was sent (it writes when the body is pending), then fail
        // the body; hyper closes the connection mid-response.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        state.position = state.total;
        return Some((Err(io::Error::other("dropped by the test server")), state));
    }
    let mut length = CHUNK_BYTES as u64;
    length = length.min(state.total - state.position);
    for limit in [
        state.behaviour.stall_after_bytes,
        state.behaviour.drop_after_bytes,
    ]
    .into_iter()
    .flatten()
    {
        if limit > state.sent {
            length = length.min(limit - state.sent);
        }
    }
    let mut chunk = vec![0u8; length as usize];
    if state.position < state.file_bytes {
        let from_file = length.min(state.file_bytes - state.position) as usize;
        state.file.read_exact(&mut chunk[..from_file]).unwrap();
    }
    if let Some(offset) = state.behaviour.corrupt_at
        && (state.position..state.position + length).contains(&offset)
    {
        chunk[(offset - state.position) as usize] ^= 0xff;
    }
    state.position += length;
    state.sent += length;
    Some((Ok(Frame::data(Bytes::from(chunk))), state))
}
