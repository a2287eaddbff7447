//! Relay version 3's lease (`spec/relay.md`, "Version 3: leases"): the launcher hands the
//! worker a client connection's socket and a journal ([`crate::journal`]) on a relay
//! stream, as `SCM_RIGHTS` riding on a `lease` frame; the worker serves the connection on
//! them ([`crate::leased::serve`]), so that no call crosses the launcher, and holds the
//! stream open while it does. When the stream ends (the worker is done with the
//! connection, stops, or dies, even by SIGKILL) the launcher takes the connection back from
//! the journal ([`take_back`]): the session where the worker's last commit left it, the
//! bytes it had committed and not written, and what it kept ([`Kept`]: the login, the
//! watchers' positions, the calls taken and not answered).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::api::Api;
use crate::journal::{self, Journal, JournaledStream, Lease};
use crate::leased::{self, FrameBounded, Kept, Stamps};
use crate::records::{RecordStream, Session as Records};
use crate::relay::{self, LeaseOpen, Message, Open, RelayError};

/// Launcher: leases the connection on `socket` to the worker at the other end of
/// `stream` (past `welcome`, at [`relay::LEASE_VERSION`] or later), with `journal` to take
/// it back from (its earlier commits forgotten first: should the worker never take the
/// lease, the connection is taken back as `open` leaves it). `open` must say where the
/// connection stands: nothing read from the socket or written to it but what it counts.
pub async fn lease(
    stream: &mut UnixStream,
    open: &LeaseOpen,
    socket: &std::net::TcpStream,
    journal: &mut Journal,
) -> Result<(), RelayError> {
    journal.reset();
    let body = relay::encode(&Message::Lease(Box::new(open.clone())))?;
    crate::pipes::send_with(stream, &body, &[socket.as_fd(), journal.file()]).await
}

/// Launcher: waits until the worker is done with a leased connection, which is when its
/// stream ends. The worker sends nothing on it; should anything come, the lease is over
/// all the same.
pub async fn returned(stream: &mut UnixStream) {
    use tokio::io::AsyncReadExt;
    let mut byte = [0_u8; 1];
    let _ = stream.read(&mut byte).await;
}

/// A connection taken back from its journal: the client's socket, its session carried on
/// from the holder's last commit, and what the holder kept.
#[derive(Debug)]
pub struct TakenBack<S = TcpStream> {
    pub socket: RecordStream<S>,
    pub kept: Kept,
}

/// Launcher: takes a leased connection back once its holder is done with it (its stream
/// ended, [`returned`]): reads where the journal's last commit left the session, writes to
/// the client what the holder had committed and not written, and carries the session on
/// from there. `socket` is the launcher's own descriptor of the client's socket.
pub async fn take_back(
    journal: &Journal,
    lease: &Lease,
    socket: std::net::TcpStream,
) -> io::Result<TakenBack> {
    take_back_into(journal, lease, socket, |socket| socket).await
}

/// [`take_back`], the session carried on over `wrap` of the socket (the launcher's own
/// layers under its records, such as its admission's metering).
pub async fn take_back_into<S>(
    journal: &Journal,
    lease: &Lease,
    socket: std::net::TcpStream,
    wrap: impl FnOnce(TcpStream) -> S,
) -> io::Result<TakenBack<S>> {
    let mut recovered = journal::recover(journal, lease, socket.as_fd())?;
    let kept = Kept::decode(&recovered.app).map_err(io::Error::other)?;
    socket.set_nonblocking(true)?;
    // What the socket holds now is read at once, after what the holder had consumed: the
    // messages the client had sent by the time the connection came back are readable
    // without waiting for the reactor to report the socket readable.
    let bound = recovered.read_ahead.len() + lease.shape.read_ring;
    let mut chunk = [0_u8; 16 << 10];
    while recovered.read_ahead.len() < bound {
        match io::Read::read(&mut &socket, &mut chunk) {
            Ok(0) => break,
            Ok(n) => recovered.read_ahead.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    let mut socket = TcpStream::from_std(socket)?;
    socket.write_all(&recovered.unwritten).await?;
    let session = Records::new(&recovered.session).map_err(io::Error::from)?;
    Ok(TakenBack {
        socket: RecordStream::resume(wrap(socket), session, recovered.read_ahead, recovered.skip),
        kept,
    })
}

/// Worker: serves the connection a `lease` hands it, on the socket and journal that came
/// with it (`fds`: the socket, then the journal's memory file), until the client goes or
/// the connection cannot go on here; then ends, closing `stream`, which gives the
/// connection back to the launcher. The launcher's own end of the stream closing (it
/// exits) ends the lease too.
pub(crate) async fn serve(
    api: &Api,
    boot: &str,
    open: LeaseOpen,
    fds: Vec<OwnedFd>,
    mut stream: UnixStream,
) -> Result<(), RelayError> {
    let [socket, file]: [OwnedFd; 2] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
        RelayError(format!(
            "a lease came with {} descriptors; 2 expected",
            fds.len()
        ))
    })?;
    let failed = |what: &str, error: io::Error| RelayError(format!("{what}: {error}"));
    let lease = open.lease();
    let kept = open.kept;
    let session = crate::relayed::restored(
        api,
        &Open {
            connection: open.connection,
            peer: open.peer,
            reached: open.reached,
            path: open.path.clone(),
            login: kept.login.clone(),
            watchers: relay::positions(&kept.watchers),
        },
    )
    .await
    .map_err(|reason| RelayError(format!("the leased connection cannot go on here: {reason}")))?;
    let journal = Journal::open(file, lease.shape, lease.session.suite)
        .map_err(|error| failed("the lease's journal", error))?;
    let socket = std::net::TcpStream::from(socket);
    socket
        .set_nonblocking(true)
        .map_err(|error| failed("the leased socket", error))?;
    let socket = TcpStream::from_std(socket).map_err(|error| failed("the leased socket", error))?;
    let journaled = JournaledStream::new(socket, journal, &lease)
        .map_err(|error| failed("taking the lease", error))?;
    let websocket = WebSocketStream::from_raw_socket(
        FrameBounded::new(journaled),
        Role::Server,
        Some(crate::front::websocket_config()),
    )
    .await;
    let stamps = Stamps {
        boot: boot.to_owned(),
        connection: open.connection,
    };
    tokio::select! {
        served = leased::serve(api, &session, &stamps, kept, websocket) => {
            served.map_err(|error| RelayError(error.to_string()))
        }
        () = returned(&mut stream) => Ok(()),
    }
}
