//! Which connections the API holds, and what each may cost before and after login.
//!
//! Every accepted connection gets a [`Ticket`] from [`Connections::admit`] or is refused:
//! at most [`ApiLimits::connections_max`] open; of those not logged in yet, at most
//! [`ApiLimits::pending_connections_per_source_max`] per source address and
//! [`ApiLimits::pending_connections_max`] in all, shared fairly: when the pending slots are
//! full, a newcomer takes the slot of the oldest connection of the source holding most, if
//! that source would still hold at least as many as the newcomer's; so a flood from a few
//! addresses cannot keep another's client out. A ticket is a slot: dropping its [`Admitted`] guard frees it.
//!
//! A ticket also carries what its connection holds after login (unwritten reply bytes,
//! counted against its own bound and all connections' [`ApiLimits::reply_bytes_max`]) and
//! the token that closes it, with the reason, from anywhere.
//!
//! [`Metered`] wraps a connection's socket to count what it reads before login against
//! [`ApiLimits::pre_login_bytes_max`].

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::limits::{ApiLimits, Refusal};

/// Every connection of the API, and the counters `/metrics` shows about them.
#[derive(Debug)]
pub struct Connections {
    pub(crate) limits: ApiLimits,
    registry: Mutex<Registry>,
    /// Reply bytes computed and not yet written, all connections together.
    reply_bytes: AtomicUsize,
    /// AllWatchers held, all connections together.
    watchers: AtomicUsize,
    /// Refusals by [`Refusal::index`].
    refusals: [AtomicU64; Refusal::ALL.len()],
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    open: BTreeMap<u64, Arc<Ticket>>,
    /// Connections not logged in yet, by source address, oldest first.
    pending: BTreeMap<IpAddr, VecDeque<Arc<Ticket>>>,
    pending_count: usize,
}

/// One admitted connection.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    logged_in: AtomicBool,
    /// Bytes read before login.
    pre_login_bytes: AtomicUsize,
    /// Reply bytes computed for this connection and not yet written.
    reply_bytes: AtomicUsize,
    /// Cancelled when the connection must end; every task serving it watches this.
    pub closed: CancellationToken,
    /// Why it was closed by the API, if it was.
    reason: OnceLock<Refusal>,
}

/// A held slot: dropping it frees the slot and ends whatever still serves the connection.
#[derive(Debug)]
pub struct Admitted {
    pub ticket: Arc<Ticket>,
    connections: Arc<Connections>,
}

impl Admitted {
    /// Closes the connection for `reason`.
    pub fn close(&self, reason: Refusal) {
        self.ticket.close(&self.connections, reason);
    }

    /// The connection logged in ([`Connections::logged_in`]).
    pub fn logged_in(&self) -> bool {
        self.connections.logged_in(&self.ticket)
    }

    /// [`Connections::reserve_reply`] for this connection.
    pub fn reserve_reply(&self, bytes: usize) -> bool {
        self.connections.reserve_reply(&self.ticket, bytes)
    }

    /// [`Connections::release_reply`] for this connection.
    pub fn release_reply(&self, bytes: usize) {
        self.connections.release_reply(&self.ticket, bytes);
    }

    /// The limits it was admitted under.
    pub fn limits(&self) -> &ApiLimits {
        &self.connections.limits
    }

    /// Closes the connection if it has not logged in within the login timeout: a task
    /// that ends with the connection or at the deadline, whichever comes first.
    pub fn enforce_login_deadline(&self) {
        let (ticket, connections) = (Arc::clone(&self.ticket), Arc::clone(&self.connections));
        let timeout = connections.limits.login_timeout;
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(timeout) => {
                    if !ticket.is_logged_in() {
                        ticket.close(&connections, Refusal::LoginTimeout);
                    }
                }
                () = ticket.closed.cancelled() => {}
            }
        });
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.leave(&self.ticket);
        self.ticket.closed.cancel();
    }
}

/// A snapshot for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCounts {
    pub pending: usize,
    pub logged_in: usize,
    pub reply_bytes: usize,
    pub watchers: usize,
    pub refusals: [u64; Refusal::ALL.len()],
}

impl Connections {
    pub fn new(limits: ApiLimits) -> Connections {
        Connections {
            limits,
            registry: Mutex::new(Registry::default()),
            reply_bytes: AtomicUsize::new(0),
            watchers: AtomicUsize::new(0),
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// A slot for a connection from `peer`, or the cap that refuses it. May close
    /// another source's oldest pending connection (see the module's text).
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Admitted, Refusal> {
        let source = peer.ip();
        let mut registry = self.registry.lock().expect("not poisoned");
        let refused = if registry.open.len() >= self.limits.connections_max {
            Some(Refusal::MaxConnections)
        } else {
            let held = registry.pending.get(&source).map_or(0, VecDeque::len);
            if held >= self.limits.pending_connections_per_source_max {
                Some(Refusal::MaxPendingConnectionsPerSource)
            } else if registry.pending_count >= self.limits.pending_connections_max {
                // The source holding most gives up its oldest, if it holds more than this
                // newcomer's source would after admitting it.
                let greediest = registry
                    .pending
                    .iter()
                    .max_by_key(|(_, queue)| queue.len())
                    .filter(|(_, queue)| queue.len() > held + 1)
                    .map(|(address, _)| *address);
                match greediest.and_then(|address| registry.pop_pending(address)) {
                    Some(oldest) => {
                        oldest.close(self, Refusal::Evicted);
                        None
                    }
                    None => Some(Refusal::MaxPendingConnections),
                }
            } else {
                None
            }
        };
        if let Some(refusal) = refused {
            drop(registry);
            self.count(refusal);
            return Err(refusal);
        }
        registry.next_id += 1;
        let ticket = Arc::new(Ticket {
            id: registry.next_id,
            peer,
            logged_in: AtomicBool::new(false),
            pre_login_bytes: AtomicUsize::new(0),
            reply_bytes: AtomicUsize::new(0),
            closed: CancellationToken::new(),
            reason: OnceLock::new(),
        });
        registry.open.insert(ticket.id, Arc::clone(&ticket));
        registry
            .pending
            .entry(source)
            .or_default()
            .push_back(Arc::clone(&ticket));
        registry.pending_count += 1;
        Ok(Admitted {
            ticket,
            connections: Arc::clone(self),
        })
    }

    /// `ticket`'s connection logged in: it leaves the pending slots and its input is no
    /// longer metered. `false` if it was closed meanwhile (evicted, timed out).
    pub fn logged_in(&self, ticket: &Ticket) -> bool {
        let mut registry = self.registry.lock().expect("not poisoned");
        if ticket.closed.is_cancelled() {
            return false;
        }
        if !ticket.logged_in.swap(true, Ordering::AcqRel) {
            registry.remove_pending(ticket);
        }
        true
    }

    fn leave(&self, ticket: &Ticket) {
        let mut registry = self.registry.lock().expect("not poisoned");
        registry.open.remove(&ticket.id);
        registry.remove_pending(ticket);
        drop(registry);
        let unwritten = ticket.reply_bytes.swap(0, Ordering::AcqRel);
        self.reply_bytes.fetch_sub(unwritten, Ordering::AcqRel);
    }

    /// Closes every connection (the server stops).
    pub fn close_all(&self) {
        for ticket in self.registry.lock().expect("not poisoned").open.values() {
            ticket.closed.cancel();
        }
    }

    /// Counts one refusal (`/metrics`).
    pub fn count(&self, refusal: Refusal) {
        self.refusals[refusal.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Accounts `bytes` of a reply computed for `ticket`'s connection and not yet written.
    /// Over the connection's bound it is closed; over all connections' bound the one
    /// holding most is (perhaps this one). `false` if this connection was closed.
    pub fn reserve_reply(&self, ticket: &Ticket, bytes: usize) -> bool {
        let own = ticket.reply_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        let all = self.reply_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if own > self.limits.reply_bytes_per_connection_max {
            ticket.close(self, Refusal::ReplyBytes);
        } else if all > self.limits.reply_bytes_max {
            let greediest = self
                .registry
                .lock()
                .expect("not poisoned")
                .open
                .values()
                .filter(|other| !other.closed.is_cancelled())
                .max_by_key(|other| other.reply_bytes.load(Ordering::Acquire))
                .cloned();
            if let Some(greediest) = greediest {
                greediest.close(self, Refusal::ReplyBytes);
            }
        }
        !ticket.closed.is_cancelled()
    }

    /// `bytes` of `ticket`'s replies were written (or dropped).
    pub fn release_reply(&self, ticket: &Ticket, bytes: usize) {
        // Both counters only ever drop by what was added to them; `leave` takes what is
        // left of the ticket's at once, so never below zero.
        let taken = ticket
            .reply_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes))
            })
            .map_or(0, |held| held.min(bytes));
        self.reply_bytes.fetch_sub(taken, Ordering::AcqRel);
    }

    /// A slot for one more AllWatcher among all connections', or `None` when all are held.
    pub fn watcher_slot(self: &Arc<Self>) -> Option<WatcherSlot> {
        let max = self.limits.watchers_max;
        self.watchers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .ok()
            .map(|_| WatcherSlot(Arc::clone(self)))
    }

    /// Counts for `/metrics`.
    pub fn counts(&self) -> ConnectionCounts {
        let registry = self.registry.lock().expect("not poisoned");
        ConnectionCounts {
            pending: registry.pending_count,
            logged_in: registry.open.len() - registry.pending_count,
            reply_bytes: self.reply_bytes.load(Ordering::Acquire),
            watchers: self.watchers.load(Ordering::Acquire),
            refusals: std::array::from_fn(|index| self.refusals[index].load(Ordering::Relaxed)),
        }
    }
}

/// One AllWatcher's place among all connections'; dropping it frees it.
#[derive(Debug)]
pub struct WatcherSlot(Arc<Connections>);

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Registry {
    fn pop_pending(&mut self, source: IpAddr) -> Option<Arc<Ticket>> {
        let queue = self.pending.get_mut(&source)?;
        let oldest = queue.pop_front()?;
        if queue.is_empty() {
            self.pending.remove(&source);
        }
        self.pending_count -= 1;
        Some(oldest)
    }

    fn remove_pending(&mut self, ticket: &Ticket) {
        let source = ticket.peer.ip();
        let Some(queue) = self.pending.get_mut(&source) else {
            return;
        };
        let Some(position) = queue.iter().position(|held| held.id == ticket.id) else {
            return;
        };
        queue.remove(position);
        if queue.is_empty() {
            self.pending.remove(&source);
        }
        self.pending_count -= 1;
    }
}

impl Ticket {
    /// Closes the connection for `reason`, counted once however many times it is asked.
    pub fn close(&self, connections: &Connections, reason: Refusal) {
        if self.reason.set(reason).is_ok() && !self.closed.is_cancelled() {
            connections.count(reason);
            tracing::debug!(target: "lockstep::api", peer = %self.peer, %reason, "connection closed");
        }
        self.closed.cancel();
    }

    /// Whether its connection logged in.
    pub fn is_logged_in(&self) -> bool {
        self.logged_in.load(Ordering::Acquire)
    }

    /// Why the API closed it, if it did.
    pub fn reason(&self) -> Option<Refusal> {
        self.reason.get().copied()
    }
}

/// A socket whose input is counted while its connection has not logged in: past
/// [`ApiLimits::pre_login_bytes_max`] the read fails and the connection is closed.
#[derive(Debug)]
pub struct Metered<S> {
    inner: S,
    ticket: Arc<Ticket>,
    connections: Arc<Connections>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, admitted: &Admitted) -> Metered<S> {
        Metered {
            inner,
            ticket: Arc::clone(&admitted.ticket),
            connections: Arc::clone(&admitted.connections),
        }
    }

    /// The socket, uncounted from here (a connection is leased only logged in).
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = buf.filled().len() - before;
            if read > 0 && !self.ticket.is_logged_in() {
                let total = self
                    .ticket
                    .pre_login_bytes
                    .fetch_add(read, Ordering::AcqRel)
                    + read;
                let max = self.connections.limits.pre_login_bytes_max;
                if total > max {
                    self.ticket.close(&self.connections, Refusal::PreLoginBytes);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{total} bytes read before a login, over the limit of {max}"),
                    )));
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pending: usize, per_source: usize, open: usize) -> ApiLimits {
        ApiLimits {
            connections_max: open,
            pending_connections_max: pending,
            pending_connections_per_source_max: per_source,
            ..ApiLimits::default()
        }
    }

    fn peer(last: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], port))
    }

    #[test]
    fn a_source_over_its_pending_share_is_refused_and_others_are_not() {
        let connections = Arc::new(Connections::new(limits(100, 2, 100)));
        let held: Vec<_> = (0..2)
            .map(|port| connections.admit(peer(2, port)).expect("under the cap"))
            .collect();
        assert_eq!(
            connections.admit(peer(2, 9)).err(),
            Some(Refusal::MaxPendingConnectionsPerSource)
        );
        let other = connections.admit(peer(1, 1)).expect("another source");
        assert_eq!(connections.counts().pending, 3);
        drop(held);
        drop(other);
        assert_eq!(connections.counts().pending, 0);
        assert_eq!(
            connections.counts().refusals[Refusal::MaxPendingConnectionsPerSource.index()],
            1
        );
    }

    #[test]
    fn when_pending_slots_are_full_a_newcomer_takes_the_greediest_source_s_oldest() {
        let connections = Arc::new(Connections::new(limits(4, 4, 100)));
        let flood: Vec<_> = (0..4)
            .map(|port| connections.admit(peer(2, port)).expect("under the cap"))
            .collect();
        let legit = connections.admit(peer(1, 1)).expect("takes a flood slot");
        assert!(flood[0].ticket.closed.is_cancelled());
        assert_eq!(flood[0].ticket.reason(), Some(Refusal::Evicted));
        assert!(!flood[1].ticket.closed.is_cancelled());
        assert!(!legit.ticket.closed.is_cancelled());
        // Two each now is not fair game for a third from the second source... until the
        // first holds more than it would.
        let second = connections.admit(peer(1, 2)).expect("flood still holds 3");
        assert!(flood[1].ticket.closed.is_cancelled());
        assert_eq!(
            connections.admit(peer(1, 3)).err(),
            Some(Refusal::MaxPendingConnections),
            "2 against 2: nobody holds more than the newcomer's source would"
        );
        drop((flood, legit, second));
        assert_eq!(connections.counts().pending, 0);
    }

    #[test]
    fn a_login_frees_its_pending_slot_and_the_connection_cap_counts_both() {
        let connections = Arc::new(Connections::new(limits(1, 1, 2)));
        let first = connections.admit(peer(1, 1)).expect("first");
        assert!(connections.logged_in(&first.ticket));
        let second = connections
            .admit(peer(1, 2))
            .expect("the pending slot is free");
        assert_eq!(
            connections.admit(peer(3, 1)).err(),
            Some(Refusal::MaxConnections)
        );
        let counts = connections.counts();
        assert_eq!((counts.pending, counts.logged_in), (1, 1));
        drop((first, second));
        let counts = connections.counts();
        assert_eq!((counts.pending, counts.logged_in), (0, 0));
    }

    #[test]
    fn an_evicted_connection_cannot_log_in_afterwards() {
        let connections = Arc::new(Connections::new(limits(2, 2, 10)));
        let first = connections.admit(peer(2, 1)).expect("first");
        let _also = connections.admit(peer(2, 2)).expect("second");
        let _third = connections.admit(peer(1, 1)).expect("evicts the first");
        assert!(!connections.logged_in(&first.ticket));
    }

    #[test]
    fn reply_bytes_over_a_connection_s_bound_close_it_and_over_all_close_the_greediest() {
        let limits = ApiLimits {
            reply_bytes_per_connection_max: 100,
            reply_bytes_max: 150,
            ..ApiLimits::default()
        };
        let connections = Arc::new(Connections::new(limits));
        let slow = connections.admit(peer(2, 1)).expect("slow");
        let busy = connections.admit(peer(1, 1)).expect("busy");
        assert!(connections.reserve_reply(&slow.ticket, 90));
        assert!(connections.reserve_reply(&busy.ticket, 40));
        // 90 + 40 + 30 > 150: the slow reader, holding most, is closed, not the caller.
        assert!(connections.reserve_reply(&busy.ticket, 30));
        assert_eq!(slow.ticket.reason(), Some(Refusal::ReplyBytes));
        connections.release_reply(&busy.ticket, 70);
        assert!(!connections.reserve_reply(&busy.ticket, 101));
        assert_eq!(busy.ticket.reason(), Some(Refusal::ReplyBytes));
        drop((slow, busy));
        assert_eq!(connections.counts().reply_bytes, 0);
    }

    #[test]
    fn watcher_slots_are_bounded_and_freed_on_drop() {
        let connections = Arc::new(Connections::new(ApiLimits {
            watchers_max: 2,
            ..ApiLimits::default()
        }));
        let first = connections.watcher_slot().expect("first");
        let _second = connections.watcher_slot().expect("second");
        assert!(connections.watcher_slot().is_none());
        drop(first);
        assert!(connections.watcher_slot().is_some());
    }
}
