//! [`ConnectionHold`]: what an HTTP connection keeps until it ends. Every connection the
//! server accepts (and every stream the launcher relays to a worker) carries one, as an
//! `Extension<Arc<ConnectionHold>>` of its requests; the server drops it when the
//! connection ends, which drops what it holds.
//!
//! It holds two things:
//!
//! - A machine agent's download slot past the response's last byte
//!   ([`crate::tools_endpoint`]), until the client closes the connection or
//!   [`LINGER_MAX`] passes. A byte handed to the connection is not a byte the agent has
//!   read: it may wait in socket buffers (and the launcher's) for a while. Freed only once
//!   the agent hung up, a slot covers the agent's whole download as the agent sees it, so
//!   the bound on downloads in flight holds when counted at the agents.
//! - The launcher's relay stream to the worker for this client connection
//!   ([`crate::front`]), so that the worker's side of the connection ends when the client's
//!   does, and the next request of the same connection reuses it.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest a download slot is held after the response's last byte, for a client that
/// keeps its connection open.
pub const LINGER_MAX: Duration = Duration::from_secs(10);

/// What a connection keeps until it ends. See the module documentation.
#[derive(Default)]
pub struct ConnectionHold {
    kept: Mutex<Vec<Box<dyn Any + Send>>>,
    relay: Mutex<Option<hyper::client::conn::http1::SendRequest<axum::body::Body>>>,
}

impl std::fmt::Debug for ConnectionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionHold")
            .field("kept", &self.kept.lock().map(|kept| kept.len()).ok())
            .finish_non_exhaustive()
    }
}

impl ConnectionHold {
    /// Keeps `value` until the connection ends or [`LINGER_MAX`] passes, whichever comes
    /// first; then drops it. Outside a tokio runtime (no timer to run) it is dropped at once.
    pub fn linger<T: Send + 'static>(self: &Arc<Self>, value: T) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cell = Arc::new(Mutex::new(Some(value)));
        self.kept
            .lock()
            .expect("not poisoned")
            .push(Box::new(Lingering(Arc::clone(&cell))));
        runtime.spawn(async move {
            tokio::time::sleep(LINGER_MAX).await;
            drop(cell.lock().expect("not poisoned").take());
        });
    }

    /// The relay stream kept for this connection, if it is still open.
    pub fn take_relay(&self) -> Option<hyper::client::conn::http1::SendRequest<axum::body::Body>> {
        self.relay
            .lock()
            .expect("not poisoned")
            .take()
            .filter(|relay| !relay.is_closed())
    }

    /// Keeps `relay` for this connection (replacing any earlier one) until it ends.
    pub fn keep_relay(&self, relay: hyper::client::conn::http1::SendRequest<axum::body::Body>) {
        *self.relay.lock().expect("not poisoned") = Some(relay);
    }
}

/// A lingering value: dropped with the connection's hold unless the timer took it first.
struct Lingering<T>(Arc<Mutex<Option<T>>>);

impl<T> Drop for Lingering<T> {
    fn drop(&mut self) {
        if let Ok(mut value) = self.0.lock() {
            drop(value.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Counted(Arc<AtomicU32>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A lingering value goes when the connection's hold does, not before.
    #[tokio::test(start_paused = true)]
    async fn a_lingering_value_is_dropped_with_the_connection() {
        let held = Arc::new(AtomicU32::new(1));
        let hold = Arc::new(ConnectionHold::default());
        hold.linger(Counted(Arc::clone(&held)));
        tokio::time::sleep(LINGER_MAX / 2).await;
        assert_eq!(held.load(Ordering::SeqCst), 1);
        drop(hold);
        assert_eq!(held.load(Ordering::SeqCst), 0);
        // The timer finds nothing left to drop.
        tokio::time::sleep(LINGER_MAX).await;
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    /// A connection kept open does not keep a lingering value past LINGER_MAX.
    #[tokio::test(start_paused = true)]
    async fn a_lingering_value_is_dropped_after_linger_max_on_an_open_connection() {
        let held = Arc::new(AtomicU32::new(1));
        let hold = Arc::new(ConnectionHold::default());
        hold.linger(Counted(Arc::clone(&held)));
        tokio::time::sleep(LINGER_MAX - Duration::from_millis(1)).await;
        assert_eq!(held.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(held.load(Ordering::SeqCst), 0);
        drop(hold);
    }
}
