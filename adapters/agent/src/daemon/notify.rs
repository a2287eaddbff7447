//! systemd's notification protocol (`sd_notify(3)`), both ends.
//!
//! The worker sends `READY=1`, `STATUS=...`, `RELOADING=1` (before it restarts into a new
//! binary) and `WATCHDOG=1` (every second from the driver's loop) to `$NOTIFY_SOCKET`. The
//! launcher listens on a socket of its own, which it hands its worker as `NOTIFY_SOCKET`,
//! and forwards `READY=1` and `STATUS=` to systemd's socket when it runs under systemd.
//! No socket configured: nothing is sent.
//!
//! The launcher's socket is abstract (no file), so any local process could send to it: the
//! launcher therefore reads each datagram with the sender's credentials, which the kernel
//! attaches (`SO_PASSCRED`; the sender cannot forge them), and acts only on those from its
//! current worker's pid ([`receive`]), as systemd does with `NotifyAccess=main`. Otherwise
//! a hung trial binary could be kept alive, or declared Ready, from outside.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The environment variable naming the socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends notifications to `$NOTIFY_SOCKET`, if set.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

/// Parses `NOTIFY_SOCKET`: a path, or `@name` for an abstract socket.
pub fn socket_address(text: &str) -> std::io::Result<SocketAddr> {
    match text.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(text),
    }
}

impl Notifier {
    /// A notifier for `$NOTIFY_SOCKET`; a malformed value is logged and ignored.
    pub fn from_env() -> Notifier {
        let Some(text) = std::env::var_os(NOTIFY_SOCKET) else {
            return Notifier::none();
        };
        let text = text.to_string_lossy().into_owned();
        match socket_address(&text).and_then(|address| Ok((UnixDatagram::unbound()?, address))) {
            Ok(target) => Notifier {
                target: Some(target),
            },
            Err(error) => {
                tracing::warn!(target: "lockstep::agent", socket = %text, %error, "NOTIFY_SOCKET unusable; not notifying");
                Notifier::none()
            }
        }
    }

    pub fn none() -> Notifier {
        Notifier { target: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends one message (newline-separated `KEY=value` lines). Failures are logged only:
    /// the agent works without its supervisor's notifications.
    pub fn send(&self, message: &str) {
        if let Some((socket, address)) = &self.target
            && let Err(error) = socket.send_to_addr(message.as_bytes(), address)
        {
            tracing::debug!(target: "lockstep::agent", %error, "sd_notify failed");
        }
    }

    pub fn ready(&self) {
        self.send("READY=1\nSTATUS=ready");
    }

    pub fn status(&self, line: &str) {
        // One line: a newline would start another assignment.
        let line: String = line
            .chars()
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        self.send(&format!("STATUS={line}"));
    }

    pub fn reloading(&self, line: &str) {
        self.send(&format!("RELOADING=1\nSTATUS={line}"));
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }
}

/// Makes `socket` receive each datagram with its sender's credentials (`SO_PASSCRED`).
pub fn pass_credentials(socket: &impl std::os::fd::AsFd) -> std::io::Result<()> {
    rustix::net::sockopt::set_socket_passcred(socket, true).map_err(std::io::Error::from)
}

/// Receives one datagram into `buffer` on a socket set up with [`pass_credentials`]:
/// its length, and the sender's pid (`None` when the kernel attached no credentials).
pub async fn receive(
    socket: &tokio::net::UnixDatagram,
    buffer: &mut [u8],
) -> std::io::Result<(usize, Option<u32>)> {
    use std::mem::MaybeUninit;

    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

    socket
        .async_io(tokio::io::Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let received = rustix::net::recvmsg(
                socket,
                &mut [std::io::IoSliceMut::new(buffer)],
                &mut control,
                RecvFlags::DONTWAIT,
            )?;
            let sender = control.drain().find_map(|message| match message {
                RecvAncillaryMessage::ScmCredentials(credentials) => {
                    Some(credentials.pid.as_raw_nonzero().get() as u32)
                }
                _ => None,
            });
            Ok((received.bytes, sender))
        })
        .await
}

/// One parsed notification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notification {
    pub ready: bool,
    pub reloading: bool,
    pub stopping: bool,
    pub watchdog: bool,
    /// `RELAY=1` (lockstep's own, which systemd ignores): the worker listens on the relay
    /// socket, so the launcher's connections waiting for a worker try it at once.
    pub relay: bool,
    pub status: Option<String>,
}

impl Notification {
    pub fn parse(message: &[u8]) -> Notification {
        let mut notification = Notification::default();
        for line in String::from_utf8_lossy(message).lines() {
            match line.split_once('=') {
                Some(("READY", "1")) => notification.ready = true,
                Some(("RELOADING", "1")) => notification.reloading = true,
                Some(("STOPPING", "1")) => notification.stopping = true,
                Some(("WATCHDOG", "1")) => notification.watchdog = true,
                Some(("RELAY", "1")) => notification.relay = true,
                Some(("STATUS", text)) => notification.status = Some(text.to_owned()),
                _ => {}
            }
        }
        notification
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_datagram_is_received_with_its_senders_pid() {
        let name = format!("lockstep-test-credentials-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        listener.set_nonblocking(true).unwrap();
        pass_credentials(&listener).unwrap();
        let listener = tokio::net::UnixDatagram::from_std(listener).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.send_to_addr(b"WATCHDOG=1", &address).unwrap();
        let mut buffer = [0u8; 64];
        let (length, pid) = receive(&listener, &mut buffer).await.unwrap();
        assert_eq!(&buffer[..length], b"WATCHDOG=1");
        assert_eq!(pid, Some(std::process::id()));
    }

    #[test]
    fn a_notifier_reaches_a_listener_on_an_abstract_socket() {
        let name = format!("lockstep-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        let notifier = Notifier {
            target: Some((UnixDatagram::unbound().unwrap(), address)),
        };
        notifier.status("running-steps 1/2\nsecond line");
        let mut buffer = [0u8; 256];
        let length = listener.recv(&mut buffer).unwrap();
        let notification = Notification::parse(&buffer[..length]);
        assert_eq!(
            notification.status.as_deref(),
            Some("running-steps 1/2 second line")
        );
        notifier.ready();
        let length = listener.recv(&mut buffer).unwrap();
        assert!(Notification::parse(&buffer[..length]).ready);
    }

    #[test]
    fn relay_1_says_the_worker_listens_on_its_relay_socket_and_nothing_else() {
        let relay = Notification::parse(b"RELAY=1");
        assert!(relay.relay);
        assert!(!relay.ready && !relay.watchdog && relay.status.is_none());
        assert!(!Notification::parse(b"READY=1\nRELAY=0").relay);
    }
}
