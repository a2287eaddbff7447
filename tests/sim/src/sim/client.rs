//! The clients: deployers (mutating calls with `operation-id`s), watchers
//! (`AllWatcher.Next`, resuming with `WatchPosition`) and status pollers. Each decides as
//! lockstep's tokio client does, with `lockstep_core::client`: `Call` retries an attempt
//! (reconnecting after a disconnect), and `Failover` chooses the controller a connect
//! goes to: it stays with a controller that answers, and moves on to the next when a
//! connect is refused or times out.

use lockstep_core::Timestamp;
use lockstep_core::client::{self, Attempt, Call, Connect, Failover, OperationIds, WatchPosition};
use lockstep_core::lifecycle::Revision;

use super::network::{API_TIMEOUT_MS, CLIENT_DEADLINE_MS, ClientAnswer, ClientOp, Message, Party};
use super::{Event, Sim};
use crate::checkers::{EndWatcher, Observation};
use crate::rng::Rng;
use crate::scenario::Scenario;

/// What a client does.
#[derive(Debug)]
pub(super) enum ClientRole {
    Deployer {
        ids: OperationIds,
        left: u32,
        current: Option<String>,
    },
    Watcher {
        position: WatchPosition,
        baseline: Option<Revision>,
    },
    Poller {
        left: u32,
    },
}

/// One client.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) role: ClientRole,
    /// Which of the controllers' addresses the next connect tries (the core's decision).
    failover: Failover,
    /// The controller of the client's own address (`Failover`'s address 0), drawn at
    /// random; its fallbacks are the controllers after it, round and round.
    first: usize,
    /// The controller process the client's connection is open to, if one is.
    connection: Option<u64>,
    /// The attempt in flight opens a connection first.
    connecting: bool,
    call: Option<Call>,
    /// Counts attempts: answers and timeouts of an earlier one are void.
    pub(super) attempt: u64,
    in_flight: bool,
    pub(super) finished: bool,
    pub(super) gave_up: Option<String>,
}

impl Client {
    /// The clients of `scenario`: deployers, then watchers, then pollers, each given the
    /// address of a controller drawn from `rng`.
    pub(super) fn all(scenario: &Scenario, rng: &mut Rng) -> Vec<Client> {
        let controllers = usize::from(scenario.controllers);
        let mut roles = Vec::new();
        for index in 0..scenario.deployers {
            roles.push(ClientRole::Deployer {
                ids: OperationIds::new(format!("deployer{index}")),
                left: scenario.operations_per_deployer,
                current: None,
            });
        }
        for _ in 0..scenario.watchers {
            roles.push(ClientRole::Watcher {
                position: WatchPosition::new(),
                baseline: None,
            });
        }
        for _ in 0..scenario.pollers {
            roles.push(ClientRole::Poller { left: 20 });
        }
        roles
            .into_iter()
            .map(|role| Client {
                role,
                failover: Failover::new(controllers),
                first: rng.index(controllers),
                connection: None,
                connecting: false,
                call: None,
                attempt: 0,
                in_flight: false,
                finished: false,
                gave_up: None,
            })
            .collect()
    }

    /// Whether the client is done: a watcher once it has seen the log up to `scanned`,
    /// any other once it finished (gave up included).
    pub(super) fn done(&self, scanned: Revision) -> bool {
        match &self.role {
            ClientRole::Watcher { position, .. } => {
                position.resume_after().is_some_and(|at| at >= scanned)
            }
            _ => self.finished,
        }
    }

    /// Whether a liveness failure names the client: a watcher that has not seen the log up
    /// to `scanned`, any other that has not finished or gave up.
    pub(super) fn unfinished(&self, scanned: Revision) -> bool {
        match &self.role {
            ClientRole::Watcher { .. } => !self.done(scanned),
            _ => !self.finished || self.gave_up.is_some(),
        }
    }

    /// The attempt in flight failed: a connect it opened ended as `connect` (the failover
    /// moves on), or the connection it was sent on is gone (the next connect tries the
    /// same controller first).
    fn connection_lost(&mut self, connect: Connect) {
        if self.connecting {
            self.connecting = false;
            self.failover.connect_ended(connect);
        }
        self.connection = None;
    }

    /// The watcher's end state, for the checkers (`None` for other clients).
    pub(super) fn end_watcher(&self, client: usize) -> Option<EndWatcher> {
        match &self.role {
            ClientRole::Watcher { position, baseline } => Some(EndWatcher {
                client,
                baseline: *baseline,
                position: position.resume_after(),
            }),
            _ => None,
        }
    }
}

impl Sim {
    /// [`Event::ClientWake`]: the client's next attempt is due.
    pub(super) fn client_wake(&mut self, client: usize, attempt: u64) {
        if self.clients[client].attempt == attempt && !self.clients[client].finished {
            self.client_send(client);
        }
    }

    /// [`Event::ClientTimeout`]: no answer in time: the connect timed out, or the
    /// connection is taken for broken; a disconnect either way.
    pub(super) fn client_timeout(&mut self, client: usize, attempt: u64) {
        let state = &mut self.clients[client];
        if state.attempt == attempt && state.in_flight {
            state.in_flight = false;
            state.connection_lost(Connect::TimedOut);
            self.client_decide(client, Attempt::Disconnected);
        }
    }

    fn client_send(&mut self, client: usize) {
        let scanned = self.executor.scanned;
        let controllers = usize::from(self.scenario.controllers);
        let now = self.queue.now;
        let state = &mut self.clients[client];
        if state.in_flight || state.finished {
            return;
        }
        let op = match &mut state.role {
            ClientRole::Deployer { ids, left, current } => {
                if current.is_none() {
                    if *left == 0 {
                        state.finished = true;
                        return;
                    }
                    *left -= 1;
                    *current = Some(ids.next_id());
                }
                ClientOp::Deploy {
                    operation: current.clone().expect("set above"),
                }
            }
            ClientRole::Watcher { position, .. } => {
                let _ = scanned;
                ClientOp::Next {
                    after: position.resume_after(),
                }
            }
            ClientRole::Poller { left } => {
                if *left == 0 {
                    state.finished = true;
                    return;
                }
                ClientOp::Status
            }
        };
        if state.call.is_none() {
            state.call = Some(Call::new(
                Timestamp(now),
                Timestamp(now + CLIENT_DEADLINE_MS),
            ));
        }
        let controller = (state.first + state.failover.address()) % controllers;
        state.connecting = state.connection.is_none();
        // A connect is abandoned at the core's connect timeout; a call on an open
        // connection that gets no answer in the API timeout is taken for broken.
        let timeout = if state.connecting {
            Failover::CONNECT_TIMEOUT.0
        } else {
            API_TIMEOUT_MS
        };
        state.attempt += 1;
        state.in_flight = true;
        let attempt = state.attempt;
        let message = Message::ClientCall {
            client,
            controller,
            connection: state.connection,
            attempt,
            op,
        };
        self.send(Party::Client(client), Party::Host(controller), message);
        self.queue
            .schedule(now + timeout, Event::ClientTimeout { client, attempt });
    }

    /// A controller's answer reaches the client.
    pub(super) fn client_reply(
        &mut self,
        client: usize,
        attempt: u64,
        server: u64,
        answer: ClientAnswer,
    ) {
        let state = &mut self.clients[client];
        if state.attempt != attempt || !state.in_flight {
            return; // an answer to an attempt given up on
        }
        state.in_flight = false;
        if let ClientAnswer::Unreachable = answer {
            state.connection_lost(Connect::Failed);
            self.client_decide(client, Attempt::Disconnected);
            return;
        }
        // The controller answered (a refusal included): the connection is open to it.
        if state.connecting {
            state.connecting = false;
            state.failover.connect_ended(Connect::Opened);
        }
        state.connection = Some(server);
        match answer {
            ClientAnswer::Refused { phase, retry_after } => {
                if let Some(timeline) = &mut self.timeline {
                    timeline.retry(self.queue.now, client);
                }
                self.client_decide(
                    client,
                    Attempt::UpgradeInProgress {
                        phase: Some(phase),
                        retry_after: Some(lockstep_core::Millis(retry_after)),
                    },
                );
            }
            answer => {
                let mut delivered = Vec::new();
                let state = &mut self.clients[client];
                match (&mut state.role, answer) {
                    (ClientRole::Deployer { current, .. }, ClientAnswer::Deployed) => {
                        let operation = current.take().expect("a call in flight");
                        self.answered_operations.push(operation);
                    }
                    (
                        ClientRole::Watcher { position, baseline },
                        ClientAnswer::Snapshot(revision),
                    ) => {
                        if position.resume_after().is_none() {
                            position.reached(revision);
                            baseline.get_or_insert(revision);
                        }
                    }
                    (ClientRole::Watcher { position, .. }, ClientAnswer::Events(revisions)) => {
                        for revision in revisions {
                            if position.accept(revision) {
                                delivered.push(revision);
                            }
                        }
                    }
                    (ClientRole::Poller { left }, ClientAnswer::Status) => {
                        *left = left.saturating_sub(1);
                    }
                    (role, answer) => panic!("{answer:?} answers no call of {role:?}"),
                }
                for revision in delivered {
                    self.observe(Observation::WatcherDelivered { client, revision });
                }
                self.client_decide(client, Attempt::Answered);
            }
        }
    }

    /// Asks the shared client logic what to do after an attempt, and schedules it.
    fn client_decide(&mut self, client: usize, attempt: Attempt) {
        let jitter = self.rng.range(0, 1000) as u16;
        let now = Timestamp(self.queue.now);
        let policy = self.retry_policy;
        let idle = self.rng.range(500, 3_000);
        let state = &mut self.clients[client];
        let Some(call) = &mut state.call else {
            return;
        };
        let wait = match call.decide(&policy, now, attempt, jitter) {
            client::Decision::Finish => {
                state.call = None;
                idle
            }
            client::Decision::Retry { wait } => wait.0,
            client::Decision::Reconnect { wait } => {
                state.connection = None;
                wait.0
            }
            client::Decision::GiveUp(give_up) => {
                state.gave_up = Some(give_up.to_string());
                state.finished = true;
                return;
            }
        };
        state.attempt += 1;
        let attempt = state.attempt;
        self.queue
            .schedule(now.0 + wait, Event::ClientWake { client, attempt });
    }
}
