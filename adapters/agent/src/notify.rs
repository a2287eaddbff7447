//! systemd's notification protocol (`sd_notify(3)`), both ends.
//!
//! The worker sends `READY=1`, `STATUS=...`, `RELOADING=1` (before it restarts into a new
//! binary) and `WATCHDOG=1` (every second from the driver's loop) to `$NOTIFY_SOCKET`. The
//! launcher listens on a socket of its own, which it hands its worker as `NOTIFY_SOCKET`,
//! and forwards `READY=1` and `STATUS=` to its own `$NOTIFY_SOCKET`: systemd's when it runs
//! under systemd, `lockstep bootstrap`'s when bootstrap started it (bootstrap waits for
//! `READY=1` there, as systemd would). No socket configured: nothing is sent.
//!
//! Listening sockets ([`Listener`]) are abstract (no file), so any local process could send
//! to one: each datagram is therefore read with the sender's credentials, which the kernel
//! attaches (`SO_PASSCRED`; the sender cannot forge them), and only those from the process
//! listened to count ([`Listener::receive`]), as systemd does with `NotifyAccess=main`.
//! Otherwise a hung trial binary could be kept alive, or declared Ready, from outside.
//!
//! `STATUS=` lines are [`status_line`]'s: `<phase>[ <done>/<total>][ to <version>][:
//! <message>]`, which [`StatusLine::parse`] reads back.

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
        match Notifier::to(&text) {
            Ok(notifier) => notifier,
            Err(error) => {
                tracing::warn!(target: "lockstep::agent", socket = %text, %error, "NOTIFY_SOCKET unusable; not notifying");
                Notifier::none()
            }
        }
    }

    /// A notifier for the socket `text` names (a path, or `@name`), as `NOTIFY_SOCKET`
    /// would.
    pub fn to(text: &str) -> std::io::Result<Notifier> {
        let address = socket_address(text)?;
        Ok(Notifier {
            target: Some((UnixDatagram::unbound()?, address)),
        })
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

/// A notification socket of one's own: abstract, named `<prefix>-<pid>-<random>` (not
/// guessable, and gone with the socket), receiving each datagram with its sender's pid.
#[derive(Debug)]
pub struct Listener {
    socket: tokio::net::UnixDatagram,
    name: String,
}

impl Listener {
    /// Binds a new socket; must be called within a tokio runtime.
    pub fn bind(prefix: &str) -> std::io::Result<Listener> {
        use rand_core::RngCore;
        let name = format!(
            "{prefix}-{}-{:016x}",
            std::process::id(),
            rand_core::OsRng.next_u64()
        );
        let socket = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
        pass_credentials(&socket)?;
        socket.set_nonblocking(true)?;
        Ok(Listener {
            socket: tokio::net::UnixDatagram::from_std(socket)?,
            name,
        })
    }

    /// The value of `NOTIFY_SOCKET` that reaches this socket (`@name`).
    pub fn address(&self) -> String {
        format!("@{}", self.name)
    }

    /// The next datagram into `buffer`: its length and its sender's pid ([`receive`]).
    pub async fn receive(&self, buffer: &mut [u8]) -> std::io::Result<(usize, Option<u32>)> {
        receive(&self.socket, buffer).await
    }
}

/// One line for `sd_notify`'s `STATUS=` and the launcher's log:
/// `<phase>[ <done>/<total>][ to <version>][: <message>]`.
pub fn status_line(report: &lockstep_core::lifecycle::StatusReport) -> String {
    let mut line = report.phase.as_str().to_owned();
    if report.progress.total > 0 {
        line.push_str(&format!(
            " {}/{}",
            report.progress.done, report.progress.total
        ));
    }
    if let Some(target) = report.progress.target {
        line.push_str(&format!(" to {target}"));
    }
    if !report.message.is_empty() {
        line.push_str(": ");
        line.push_str(&report.message);
    }
    line
}

/// A [`status_line`] read back (by `lockstep bootstrap`, from the launcher's `STATUS=`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusLine {
    /// The phase's name (`running-steps`).
    pub phase: String,
    /// Steps done and planned, when there are steps.
    pub steps: Option<(u64, u64)>,
    /// The version the phase moves to, as written.
    pub target: Option<String>,
    /// What the agent said, if anything.
    pub message: Option<String>,
}

impl StatusLine {
    /// Reads `line`; words it does not expect before the message are left out, so a line
    /// of a later format still yields its phase.
    pub fn parse(line: &str) -> StatusLine {
        let (head, message) = match line.split_once(": ") {
            Some((head, message)) => (head, Some(message.to_owned())),
            None => (line, None),
        };
        let mut words = head.split(' ');
        let phase = words.next().unwrap_or("").to_owned();
        let mut status = StatusLine {
            phase,
            message,
            ..StatusLine::default()
        };
        while let Some(word) = words.next() {
            if word == "to" {
                status.target = words.next().map(str::to_owned);
            } else if let Some((done, total)) = word.split_once('/')
                && let (Ok(done), Ok(total)) = (done.parse(), total.parse())
            {
                status.steps = Some((done, total));
            }
        }
        status
    }
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
    fn a_status_line_reads_back_as_it_was_written() {
        use lockstep_core::lifecycle::StatusReport;
        use lockstep_core::{Phase, Version};
        let report = StatusReport {
            phase: Phase::RunningSteps,
            progress: lockstep_core::phase::Progress {
                done: 1,
                total: 2,
                target: Some(Version::new(2, 9, 43)),
            },
            message: "record agent binaries: done: next".to_owned(),
        };
        let line = status_line(&report);
        assert_eq!(
            line,
            "running-steps 1/2 to 2.9.43: record agent binaries: done: next"
        );
        assert_eq!(
            StatusLine::parse(&line),
            StatusLine {
                phase: "running-steps".to_owned(),
                steps: Some((1, 2)),
                target: Some("2.9.43".to_owned()),
                message: Some("record agent binaries: done: next".to_owned()),
            }
        );
        assert_eq!(
            StatusLine::parse("ready"),
            StatusLine {
                phase: "ready".to_owned(),
                ..StatusLine::default()
            }
        );
        // Words of a later format before the message are skipped, the phase kept.
        let later = StatusLine::parse("upgrading 3/4 via mirror to 2.9.44");
        assert_eq!(later.phase, "upgrading");
        assert_eq!(later.steps, Some((3, 4)));
        assert_eq!(later.target.as_deref(), Some("2.9.44"));
    }

    #[tokio::test]
    async fn a_listener_receives_what_a_notifier_of_its_address_sends_with_the_senders_pid() {
        let listener = Listener::bind("lockstep-test-listener").unwrap();
        let address = listener.address();
        assert!(address.starts_with("@lockstep-test-listener-"), "{address}");
        Notifier::to(&address).unwrap().ready();
        let mut buffer = [0u8; 64];
        let (length, pid) = listener.receive(&mut buffer).await.unwrap();
        assert!(Notification::parse(&buffer[..length]).ready);
        assert_eq!(pid, Some(std::process::id()));
    }

    #[test]
    fn relay_1_says_the_worker_listens_on_its_relay_socket_and_nothing_else() {
        let relay = Notification::parse(b"RELAY=1");
        assert!(relay.relay);
        assert!(!relay.ready && !relay.watchdog && relay.status.is_none());
        assert!(!Notification::parse(b"READY=1\nRELAY=0").relay);
    }
}
