//! Relay version 2's hand-over (`spec/relay.md`): after `open`, the worker makes two pipes
//! and sends the launcher its ends of them with a `pipes` frame, as `SCM_RIGHTS` on the
//! relay socket; the connection's messages go over the pipes from then on. Every end is
//! close-on-exec, so no process the launcher or the worker starts inherits one (a worker
//! that died must leave its ends closed, which is how the launcher learns it went).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

use crate::relay::{self, Message, RelayError};

/// The worker's ends: it reads the launcher's calls and writes its replies.
#[derive(Debug)]
pub struct WorkerEnds {
    pub calls: pipe::Receiver,
    pub replies: pipe::Sender,
}

/// The launcher's ends: it writes calls and reads replies.
#[derive(Debug)]
pub struct LauncherEnds {
    pub calls: pipe::Sender,
    pub replies: pipe::Receiver,
}

/// The largest frame the launcher reads on the socket after `open`: a `pipes` or a
/// `close`, both small.
const AFTER_OPEN_FRAME_BYTES_MAX: usize = 16 << 10;

fn pipe_pair() -> Result<(OwnedFd, OwnedFd), RelayError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|error| RelayError(format!("making a pipe: {error}")))
}

/// Sends `body` as one frame on `stream` with `fds` riding on its first byte as
/// `SCM_RIGHTS`. The descriptors stay this process's too (the kernel gives the receiver
/// duplicates).
pub(crate) async fn send_with(
    stream: &mut UnixStream,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), RelayError> {
    let failed = |error: std::io::Error| RelayError(format!("sending descriptors: {error}"));
    let mut frame = u32::try_from(body.len())
        .map_err(|_| RelayError(format!("a frame of {} bytes", body.len())))?
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(body);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_MAX))];
    assert!(
        fds.len() <= FDS_MAX,
        "at most {FDS_MAX} descriptors a frame"
    );
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
            rustix::net::sendmsg(
                &*stream,
                &[IoSlice::new(&frame)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(std::io::Error::from)
        })
        .await
        .map_err(failed)?;
    // The descriptors rode with the first byte; the rest of the frame, if any, follows.
    stream.write_all(&frame[sent..]).await.map_err(failed)
}

/// The most descriptors a relay frame carries: a lease's socket and journal.
const FDS_MAX: usize = 2;

/// Reads one frame of at most `max` bytes from `stream`, with the descriptors riding on
/// it (close-on-exec). Reads no byte past the frame. `Ok(None)`: the stream ended first.
pub(crate) async fn receive_with(
    stream: &mut UnixStream,
    max: usize,
) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>, RelayError> {
    let failed = |error: std::io::Error| RelayError(format!("reading descriptors: {error}"));
    let mut head = [0_u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_MAX))];
    let mut fds: Vec<OwnedFd> = Vec::new();
    let received = stream
        .async_io(Interest::READABLE, || {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let message = rustix::net::recvmsg(
                &*stream,
                &mut [IoSliceMut::new(&mut head)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            for ancillary in control.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = ancillary {
                    fds.extend(rights);
                }
            }
            Ok(message.bytes)
        })
        .await
        .map_err(failed)?;
    if received == 0 {
        return Ok(None);
    }
    stream
        .read_exact(&mut head[received..])
        .await
        .map_err(failed)?;
    let length = u32::from_be_bytes(head) as usize;
    if length > max {
        return Err(RelayError(format!(
            "a frame of {length} bytes, over the limit of {max}"
        )));
    }
    let mut body = vec![0_u8; length];
    stream.read_exact(&mut body).await.map_err(failed)?;
    Ok(Some((body, fds)))
}

/// Worker: makes the connection's two pipes and sends the launcher its ends with a
/// `pipes` frame on `stream`; returns the worker's ends.
pub async fn hand_over(stream: &mut UnixStream) -> Result<WorkerEnds, RelayError> {
    let (calls_read, calls_write) = pipe_pair()?;
    let (replies_read, replies_write) = pipe_pair()?;
    let body = relay::encode(&Message::Pipes(relay::Pipes::default()))?;
    send_with(stream, &body, &[calls_write.as_fd(), replies_read.as_fd()])
        .await
        .map_err(|error| RelayError(format!("handing the pipes over: {}", error.0)))?;
    // The launcher's ends are its own now (the kernel holds them until it takes them).
    drop((calls_write, replies_read));
    Ok(WorkerEnds {
        calls: pipe::Receiver::from_owned_fd(calls_read)
            .map_err(|error| RelayError(format!("the calls pipe: {error}")))?,
        replies: pipe::Sender::from_owned_fd(replies_write)
            .map_err(|error| RelayError(format!("the replies pipe: {error}")))?,
    })
}

/// What the worker answered `open` with, on a version 2 stream.
#[derive(Debug)]
pub enum AfterOpen {
    /// The connection's pipes.
    Pipes(LauncherEnds),
    /// Any other message (a `close`: the connection cannot go on there).
    Message(Message),
}

/// Launcher: reads the one frame the worker sends after `open` on a version 2 stream,
/// taking the descriptors that ride with it. `Ok(None)`: the worker closed the stream.
pub async fn receive(stream: &mut UnixStream) -> Result<Option<AfterOpen>, RelayError> {
    let Some((body, fds)) = receive_with(stream, AFTER_OPEN_FRAME_BYTES_MAX)
        .await
        .map_err(|error| RelayError(format!("reading the worker's pipes: {}", error.0)))?
    else {
        return Ok(None);
    };
    match relay::decode(&body)? {
        Message::Pipes(_) => {
            let [calls, replies]: [OwnedFd; 2] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
                RelayError(format!(
                    "pipes came with {} descriptors; 2 expected",
                    fds.len()
                ))
            })?;
            Ok(Some(AfterOpen::Pipes(LauncherEnds {
                calls: pipe::Sender::from_owned_fd(calls)
                    .map_err(|error| RelayError(format!("the calls pipe: {error}")))?,
                replies: pipe::Receiver::from_owned_fd(replies)
                    .map_err(|error| RelayError(format!("the replies pipe: {error}")))?,
            })))
        }
        other => Ok(Some(AfterOpen::Message(other))),
    }
}
