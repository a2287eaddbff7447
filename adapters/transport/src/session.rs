//! One connection's state: who logged in, the address its client reached, and its
//! AllWatchers and NotifyWatchers, which belong to it as in Juju (they end with the
//! connection). Both kinds share the connection's watcher limit and id sequence; only
//! AllWatchers are carried over to the next worker (an agent whose NotifyWatcher is gone
//! gets `not found` and opens another, as after a restart of Juju's controller).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lockstep_core::gate::Login;
use lockstep_core::lifecycle::Revision;

use crate::admission::{Admitted, Ticket, WatcherSlot};
use crate::auth::ModelAccess;
use crate::wire::WireError;

/// One connection's state.
#[derive(Debug)]
pub struct Session {
    login: Mutex<Login>,
    /// The agent's tag (`machine-1`) once an agent logged in; empty for users.
    agent: Mutex<String>,
    /// The tag that logged in (`user-admin`, `machine-1`); empty before login.
    tag: Mutex<String>,
    /// A logged-in user's access to the model; `read` for everyone else.
    access: Mutex<ModelAccess>,
    /// The address the client reached this server on.
    pub reached: Option<SocketAddr>,
    /// The connection's slot, when served by the API's accept loop.
    admitted: Option<Arc<Admitted>>,
    /// The client's address as the launcher reported it, for a connection relayed from
    /// the front door (whose slot is the launcher's).
    relayed_from: Option<SocketAddr>,
    watchers: Mutex<BTreeMap<u64, Arc<Watcher>>>,
    notify_watchers: Mutex<BTreeMap<u64, Arc<NotifyWatcher>>>,
    next_watcher: AtomicU64,
}

/// A NotifyWatcher of an agent's desired version (`Upgrader.WatchAPIVersion`): whose, and
/// the version the previous `Next` saw (`None` before the first `Next`, which answers at
/// once).
#[derive(Debug)]
pub struct NotifyWatcher {
    /// The agent watched (`machine-1`): the logged-in agent's own tag.
    pub tag: String,
    /// Held for the whole of a `Next`: one `Next` at a time per watcher.
    pub seen: tokio::sync::Mutex<Option<(lockstep_core::Version, Option<lockstep_core::Version>)>>,
    pub stopped: tokio::sync::watch::Sender<bool>,
    /// Its place among all connections' watchers.
    _slot: WatcherSlot,
}

/// An AllWatcher: its position in the event log (`None` until the first `Next` sent the
/// whole state) and whether it was stopped.
#[derive(Debug)]
pub struct Watcher {
    /// Held for the whole of a `Next`: one `Next` at a time per watcher.
    pub position: tokio::sync::Mutex<Option<Revision>>,
    pub stopped: tokio::sync::watch::Sender<bool>,
    /// Its place among all connections' watchers.
    _slot: WatcherSlot,
}

impl Watcher {
    fn new(position: Option<Revision>, slot: WatcherSlot) -> Arc<Watcher> {
        let (stopped, _) = tokio::sync::watch::channel(false);
        Arc::new(Watcher {
            position: tokio::sync::Mutex::new(position),
            stopped,
            _slot: slot,
        })
    }
}

impl Session {
    /// A connection nobody logged in on yet, holding its slot.
    pub fn new(reached: Option<SocketAddr>, admitted: Option<Arc<Admitted>>) -> Session {
        Session {
            admitted,
            relayed_from: None,
            login: Mutex::new(Login::Anonymous),
            agent: Mutex::new(String::new()),
            tag: Mutex::new(String::new()),
            access: Mutex::new(ModelAccess::Read),
            reached,
            watchers: Mutex::new(BTreeMap::new()),
            notify_watchers: Mutex::new(BTreeMap::new()),
            next_watcher: AtomicU64::new(1),
        }
    }

    /// A connection the launcher holds and relays (`spec/relay.md`): `peer` is the
    /// client's address, which the failed-login throttle and the login queue count by.
    pub fn relayed(reached: Option<SocketAddr>, peer: SocketAddr) -> Session {
        Session {
            relayed_from: Some(peer),
            ..Session::new(reached, None)
        }
    }

    /// The client's address; unspecified when the router is served without the API's
    /// accept loop and not relayed.
    pub fn source(&self) -> IpAddr {
        self.ticket()
            .map(|ticket| ticket.peer)
            .or(self.relayed_from)
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |peer| peer.ip())
    }

    /// The connection's slot, if it has one.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.admitted.as_deref().map(|admitted| &*admitted.ticket)
    }

    /// Who logged in on this connection (the gate reads it on every call).
    pub fn login(&self) -> Login {
        *self.login.lock().expect("not poisoned")
    }

    /// Records a successful login: `who`, and the agent's tag for an agent login.
    pub fn logged_in(&self, who: Login, tag: &str) {
        *self.login.lock().expect("not poisoned") = who;
        *self.agent.lock().expect("not poisoned") = match who {
            Login::ControllerAgent | Login::MachineAgent => tag.to_owned(),
            Login::Anonymous | Login::User => String::new(),
        };
        *self.tag.lock().expect("not poisoned") = tag.to_owned();
    }

    /// The tag that logged in; empty before login.
    pub fn tag(&self) -> String {
        self.tag.lock().expect("not poisoned").clone()
    }

    /// Records a logged-in user's access to the model.
    pub fn grant(&self, access: ModelAccess) {
        *self.access.lock().expect("not poisoned") = access;
    }

    /// The logged-in user's access to the model (`read` for agents and before login).
    pub fn model_access(&self) -> ModelAccess {
        *self.access.lock().expect("not poisoned")
    }

    /// The logged-in agent's tag; empty for users.
    pub fn agent(&self) -> String {
        self.agent.lock().expect("not poisoned").clone()
    }

    /// A new watcher starting after `position` (`None`: from the whole state), holding
    /// `slot`, unless the connection holds `max` already; its id.
    pub fn add_watcher(
        &self,
        position: Option<Revision>,
        max: usize,
        slot: WatcherSlot,
    ) -> Result<u64, WireError> {
        let mut watchers = self.watchers.lock().expect("not poisoned");
        self.room_for_a_watcher(watchers.len(), max)?;
        let id = self.next_watcher.fetch_add(1, Ordering::Relaxed);
        watchers.insert(id, Watcher::new(position, slot));
        Ok(id)
    }

    /// `Ok` while the connection holds fewer than `max` watchers of both kinds, of which
    /// `all_watchers` AllWatchers (their map is locked by the caller; the NotifyWatchers'
    /// is locked here, always after it).
    fn room_for_a_watcher(&self, all_watchers: usize, max: usize) -> Result<(), WireError> {
        let held = all_watchers + self.notify_watchers.lock().expect("not poisoned").len();
        if held >= max {
            return Err(WireError::new(
                "quota limit exceeded",
                format!(
                    "a connection may hold at most {max} watchers (--max-watchers-per-connection); stop one first"
                ),
            ));
        }
        Ok(())
    }

    /// A new NotifyWatcher of agent `tag`'s desired version, holding `slot`, unless the
    /// connection holds `max` watchers already; its id.
    pub fn add_notify_watcher(
        &self,
        tag: &str,
        max: usize,
        slot: WatcherSlot,
    ) -> Result<u64, WireError> {
        let watchers = self.watchers.lock().expect("not poisoned");
        self.room_for_a_watcher(watchers.len(), max)?;
        let id = self.next_watcher.fetch_add(1, Ordering::Relaxed);
        let (stopped, _) = tokio::sync::watch::channel(false);
        self.notify_watchers.lock().expect("not poisoned").insert(
            id,
            Arc::new(NotifyWatcher {
                tag: tag.to_owned(),
                seen: tokio::sync::Mutex::new(None),
                stopped,
                _slot: slot,
            }),
        );
        drop(watchers);
        Ok(id)
    }

    /// The NotifyWatcher of id `id`; Juju's `unknown watcher id` (code `not found`)
    /// otherwise, which tells an agent to open a new one.
    pub fn notify_watcher(&self, id: &str) -> Result<Arc<NotifyWatcher>, WireError> {
        id.parse::<u64>()
            .ok()
            .and_then(|id| {
                self.notify_watchers
                    .lock()
                    .expect("not poisoned")
                    .get(&id)
                    .cloned()
            })
            .ok_or_else(|| WireError::new("not found", format!("unknown watcher id {id:?}")))
    }

    /// Stops NotifyWatcher `id` (a pending `Next` fails with `watcher was stopped`) and
    /// forgets it.
    pub fn stop_notify_watcher(&self, id: &str) -> Result<(), WireError> {
        let watcher = self.notify_watcher(id)?;
        watcher.stopped.send_replace(true);
        if let Ok(id) = id.parse::<u64>() {
            self.notify_watchers
                .lock()
                .expect("not poisoned")
                .remove(&id);
        }
        Ok(())
    }

    /// A watcher carried over from the previous worker (`spec/relay.md`): id `id`, after
    /// `position`, holding `slot`. Later watchers get ids above it, so none is reused.
    pub fn restore_watcher(
        &self,
        id: u64,
        position: Option<Revision>,
        max: usize,
        slot: WatcherSlot,
    ) -> Result<(), WireError> {
        let mut watchers = self.watchers.lock().expect("not poisoned");
        if watchers.contains_key(&id) {
            return Err(WireError::new(
                "bad request",
                format!("watcher {id} is carried over twice"),
            ));
        }
        if self.room_for_a_watcher(watchers.len(), max).is_err() {
            return Err(WireError::new(
                "quota limit exceeded",
                format!(
                    "watcher {id} cannot be carried over: the connection holds {max} watchers, its limit (--max-watchers-per-connection)"
                ),
            ));
        }
        self.next_watcher
            .fetch_max(id.saturating_add(1), Ordering::Relaxed);
        watchers.insert(id, Watcher::new(position, slot));
        Ok(())
    }

    /// The watcher of id `id` (as the client sends it, a decimal string).
    pub fn watcher(&self, id: &str) -> Result<Arc<Watcher>, WireError> {
        id.parse::<u64>()
            .ok()
            .and_then(|id| {
                self.watchers
                    .lock()
                    .expect("not poisoned")
                    .get(&id)
                    .cloned()
            })
            .ok_or_else(|| WireError::new("not found", format!("unknown watcher id {id:?}")))
    }

    /// Stops watcher `id` (a pending `Next` fails with `watcher was stopped`) and forgets it.
    pub fn stop_watcher(&self, id: &str) -> Result<(), WireError> {
        let watcher = self.watcher(id)?;
        watcher.stopped.send_replace(true);
        if let Ok(id) = id.parse::<u64>() {
            self.watchers.lock().expect("not poisoned").remove(&id);
        }
        Ok(())
    }
}
