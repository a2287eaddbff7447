//! The drivers: what each process's driver does with its core's requests, as
//! lockstep-agent's driver does. Snapshot writes and host steps are local (`host.rs`);
//! a controller's other requests go to the store or the stream, a machine agent's to a
//! controller's API. A request whose answer is lost is retried with the core's
//! `client::Call` decisions (a lost answer is a disconnect, answered by reconnecting after
//! its backoff). Each tick, a controller resumes its record watch and reads the model's
//! agent-version; a machine agent polls `Upgrader.DesiredVersion`.
//!
//! Machine agents stand for Juju's, which dial every controller address at once and use
//! the first that answers: each call goes to a controller drawn at random. (Clients, which
//! are lockstep's, fail over with the core's `Failover`: `client.rs`.)

use lockstep_core::Timestamp;
use lockstep_core::client::{self, Attempt, Call};
use lockstep_core::lifecycle::{Input, Lifecycle, Request, RequestId, Revision, StagePlan};
use lockstep_core::steps::StepKind;
use lockstep_core::{Phase, Version};

use super::network::{API_TIMEOUT_MS, AgentCall, CLIENT_DEADLINE_MS, Message, Party};
use super::{Event, Sim};
use crate::checkers::Observation;

/// Virtual milliseconds a store request waits for its answer before it counts as lost.
const STORE_TIMEOUT_MS: u64 = 2_000;
/// Virtual milliseconds a stream request waits before the driver reports it failed.
const STREAM_TIMEOUT_MS: u64 = 30_000;
/// Controllers' driver tick (record watch resync, agent-version watch).
const CONTROLLER_TICK_MS: u64 = 2_000;
/// The request id of a machine agent driver's fetch ahead of its admission (the rollout's
/// `stage-version`): not a request of its core, whose ids count up from 0 (`u64::MAX` is
/// the agents' calls that await nothing).
pub(super) const PRESTAGE: RequestId = RequestId(u64::MAX - 1);

/// The request id of a machine agent's link probe ([`lockstep_core::upgrader::LINK_PROBE_BYTES`]):
/// no request of its core either.
pub(super) const LINK_PROBE: RequestId = RequestId(u64::MAX - 2);

/// Machine agents poll their controller's `Upgrader.DesiredVersion` this often.
const AGENT_POLL_MS: u64 = 10_000;

/// Where a host's request went.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Route {
    Store,
    Streams,
    Controller,
}

/// A request the driver awaits an answer to.
#[derive(Clone, Debug)]
pub(super) struct Awaiting {
    pub(super) request: Request,
    route: Route,
    call: Call,
    pub(super) attempt: u32,
    controller: usize,
    /// When the request was first sent.
    since: u64,
    /// "Busy" answers to this download so far, and when the first came.
    pub(super) busy: u32,
    pub(super) busy_since: Option<u64>,
}

impl Sim {
    /// Carries out one request of `host`'s process.
    pub(super) fn dispatch(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    ) {
        let controller = self.hosts[host].is_controller();
        let now = self.queue.now;
        match request {
            Request::PersistSnapshot(snapshot) => {
                let at = now + self.rng.range(1, 20);
                self.queue.schedule(
                    at,
                    Event::DiskWrite {
                        host,
                        incarnation,
                        id,
                        snapshot: Box::new(snapshot),
                    },
                );
            }
            Request::RunStep { step, key, .. }
                if self.registry.step(step).kind == StepKind::Host =>
            {
                let at = now + self.rng.range(1, 200);
                self.queue.schedule(
                    at,
                    Event::HostStep {
                        host,
                        incarnation,
                        id,
                        key,
                    },
                );
            }
            Request::RestartInto(target) => {
                let state = &self.hosts[host];
                let from = state.config.running.clone();
                let durable = state.durable.clone();
                self.observe(Observation::Restart {
                    host,
                    from: &from,
                    to: &target,
                    durable: durable.as_ref(),
                });
                self.trace.note(
                    now,
                    &format!("{} restarts into {target}", self.hosts[host].name),
                );
                self.stop(host);
                self.hosts[host].config.running = target;
                let incarnation = self.hosts[host].incarnation;
                let at = now + self.rng.range(100, 1_000);
                self.queue.schedule(at, Event::Boot { host, incarnation });
            }
            Request::ReleaseLease(_) | Request::KeepAliveLease(_) => {
                // Sent once, not retried, as lockstep-agent's driver does: a release is not
                // awaited, and a keep-alive is the core's to bound (its `LeaseDeadline`
                // gives the lease up if no answer comes in time).
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            Request::WatchRecord { .. } => {
                // A new subscription: its first delivery is the current view, whatever an
                // earlier subscription of this process delivered.
                self.hosts[host].watching = true;
                self.hosts[host].record_delivered = None;
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            Request::LookupCatalogue { .. } | Request::StageBinary(_) if controller => {
                self.await_request(host, id, request, Route::Streams);
            }
            Request::StageBinary(plan) if self.links.is_some() => {
                let state = &mut self.hosts[host];
                if state.prestaged == Some(plan.binary.number) {
                    // Fetched ahead and kept: on disk already, checked against the same
                    // digest (the agent's `stage_from_controller` finds it installed).
                    self.queue.schedule(
                        now,
                        Event::StagedOnDisk {
                            host,
                            incarnation,
                            id,
                        },
                    );
                } else if self.receiving_ahead(host, &plan) {
                    // Its bytes are arriving: the staging waits for that download.
                    self.hosts[host].stage_waiter = Some((id, plan));
                } else {
                    // A fetch ahead not yet served (queued, or waiting out a busy answer)
                    // is given up: the admitted agent's own download goes first.
                    let state = &mut self.hosts[host];
                    state.prestaging = None;
                    if state.awaiting.remove(&PRESTAGE).is_some() {
                        self.cancel_download(host);
                    }
                    self.await_request(host, id, Request::StageBinary(plan), Route::Controller);
                }
            }
            _ if controller => self.await_request(host, id, request, Route::Store),
            _ => self.await_request(host, id, request, Route::Controller),
        }
    }

    fn await_request(&mut self, host: usize, id: RequestId, request: Request, route: Route) {
        let now = self.queue.now;
        let deadline = Timestamp(now + CLIENT_DEADLINE_MS);
        let controller = self.pick_controller();
        self.hosts[host].awaiting.insert(
            id,
            Awaiting {
                request,
                route,
                call: Call::new(Timestamp(now), deadline),
                attempt: 0,
                controller,
                since: now,
                busy: 0,
                busy_since: None,
            },
        );
        self.send_request(host, id);
    }

    fn pick_controller(&mut self) -> usize {
        self.rng.index(usize::from(self.scenario.controllers))
    }

    /// Sends (again) an awaited request, and arms its timeout.
    fn send_request(&mut self, host: usize, id: RequestId) {
        let incarnation = self.hosts[host].incarnation;
        let Some(awaiting) = self.hosts[host].awaiting.get(&id) else {
            return;
        };
        if matches!(awaiting.request, Request::StageBinary(_)) {
            // A download in progress for an earlier attempt is given up (its connection
            // closed) before the request is sent again.
            self.cancel_download(host);
        }
        let Some(awaiting) = self.hosts[host].awaiting.get_mut(&id) else {
            return;
        };
        awaiting.attempt += 1;
        let attempt = awaiting.attempt;
        let request = awaiting.request.clone();
        let (to, message, timeout) = match awaiting.route {
            Route::Store => (
                Party::Store,
                Message::StoreRequest {
                    host,
                    incarnation,
                    id,
                    request,
                },
                STORE_TIMEOUT_MS,
            ),
            Route::Streams => (
                Party::Streams,
                Message::StreamRequest {
                    host,
                    incarnation,
                    id,
                    request,
                },
                STREAM_TIMEOUT_MS,
            ),
            Route::Controller => {
                let controller = awaiting.controller;
                (
                    Party::Host(controller),
                    Message::AgentCall {
                        host,
                        incarnation,
                        controller,
                        id,
                        attempt,
                        call: AgentCall::Request(Box::new(request)),
                    },
                    API_TIMEOUT_MS,
                )
            }
        };
        self.send(Party::Host(host), to, message);
        self.schedule_request_timeout(host, incarnation, id, attempt, timeout);
    }

    /// The attempt `attempt` of request `id` times out `after` ms from now unless answered.
    fn schedule_request_timeout(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        after: u64,
    ) {
        let at = self.queue.now + after;
        self.queue.schedule(
            at,
            Event::RequestTimeout {
                host,
                incarnation,
                id,
                attempt,
            },
        );
    }

    /// A machine agent's call that answers nothing (a status report, a desired-version
    /// poll), sent to `controller`'s API.
    pub(super) fn send_agent_call(
        &mut self,
        host: usize,
        incarnation: u64,
        controller: usize,
        call: AgentCall,
    ) {
        let message = Message::AgentCall {
            host,
            incarnation,
            controller,
            id: RequestId(u64::MAX),
            attempt: 0,
            call,
        };
        self.send(Party::Host(host), Party::Host(controller), message);
    }

    /// [`Event::Resend`]: the wait before another attempt is over.
    pub(super) fn resend(&mut self, host: usize, incarnation: u64, id: RequestId) {
        if self.current(host, incarnation) && self.hosts[host].awaiting.contains_key(&id) {
            self.send_request(host, id);
        }
    }

    /// [`Event::RequestTimeout`]: an attempt got no answer in time.
    pub(super) fn request_timeout(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
    ) {
        if !self.current(host, incarnation) {
            return;
        }
        let Some(awaiting) = self.hosts[host].awaiting.get(&id) else {
            return;
        };
        if awaiting.attempt != attempt {
            return;
        }
        if awaiting.route == Route::Controller
            && self.links.as_ref().is_some_and(|links| {
                links.receiving(host, id, attempt) || links.waiting(host, id, attempt)
            })
        {
            // Bytes are arriving: the connection is alive, wait on.
            self.schedule_request_timeout(host, incarnation, id, attempt, API_TIMEOUT_MS);
            return;
        }
        if awaiting.route == Route::Streams {
            // The stream stalled: the driver reports the failure; the core retries.
            let request = awaiting.request.clone();
            self.hosts[host].awaiting.remove(&id);
            let reason = "the agent-binary stream did not answer within 30s".to_owned();
            let input = match request {
                Request::StageBinary(_) => Input::Staged {
                    id,
                    result: Err(reason),
                },
                _ => Input::CatalogueFound {
                    id,
                    result: Err(reason),
                },
            };
            self.input(host, input);
            return;
        }
        self.retry(host, id, Attempt::Disconnected);
    }

    /// Asks the shared client logic what to do after an attempt failed.
    fn retry(&mut self, host: usize, id: RequestId, attempt: Attempt) {
        let jitter = self.rng.range(0, 1000) as u16;
        let now = Timestamp(self.queue.now);
        let policy = self.retry_policy;
        let incarnation = self.hosts[host].incarnation;
        let controllers = usize::from(self.scenario.controllers);
        let pick = self.rng.index(controllers);
        let name = self.hosts[host].name.clone();
        let Some(awaiting) = self.hosts[host].awaiting.get_mut(&id) else {
            return;
        };
        let wait = match awaiting.call.decide(&policy, now, attempt, jitter) {
            client::Decision::Finish => return,
            client::Decision::Retry { wait } => wait.0,
            client::Decision::Reconnect { wait } => {
                awaiting.controller = pick;
                wait.0
            }
            client::Decision::GiveUp(give_up) => {
                // The core awaits an answer: the driver starts the call over.
                self.trace
                    .note(now.0, &format!("{name} gave up a call: {give_up}"));
                awaiting.call = Call::new(now, Timestamp(now.0 + CLIENT_DEADLINE_MS));
                5_000
            }
        };
        self.queue.schedule(
            now.0 + wait,
            Event::Resend {
                host,
                incarnation,
                id,
            },
        );
    }

    /// A [`Message::Reply`] reaches the host: the answer to an awaited request, or a
    /// record-watch delivery (`id` `None`).
    pub(super) fn reply(
        &mut self,
        host: usize,
        incarnation: u64,
        id: Option<RequestId>,
        input: Input,
    ) {
        if !self.current(host, incarnation) {
            return;
        }
        match id {
            Some(id) => {
                // A keep-alive's answer goes to the core whenever it comes: the core ignores
                // one it no longer awaits.
                let aside = matches!(input, Input::LeaseAnswered { .. });
                let awaited = self.hosts[host].awaiting.remove(&id);
                if let (Some(awaiting), Some(links), Input::Staged { result: Ok(()), .. }) =
                    (&awaited, &mut self.links, &input)
                    && awaiting.route == Route::Controller
                {
                    links
                        .stats
                        .downloads_ms
                        .push(self.queue.now - awaiting.since);
                }
                if awaited.is_some() || aside {
                    self.input(host, input);
                }
            }
            None => {
                // A record watch delivery: newer views only, in order.
                if let Input::RecordChanged(view) = &input {
                    let state = &mut self.hosts[host];
                    if state
                        .record_delivered
                        .is_none_or(|seen| view.revision > seen)
                    {
                        state.record_delivered = Some(view.revision);
                        self.input(host, input);
                    }
                }
            }
        }
    }

    /// A [`Message::Refused`] reaches the host: a controller's gate turned its call away
    /// (`upgrade in progress`), which the shared client logic answers.
    pub(super) fn refused(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        phase: Phase,
        retry_after: u64,
    ) {
        if self.current(host, incarnation)
            && self.hosts[host]
                .awaiting
                .get(&id)
                .is_some_and(|awaiting| awaiting.attempt == attempt)
        {
            let refused = Attempt::UpgradeInProgress {
                phase: Some(phase),
                retry_after: Some(lockstep_core::Millis(retry_after)),
            };
            self.retry(host, id, refused);
        }
    }

    /// A [`Message::PollReply`] reaches a machine agent: the version it should run. In a
    /// fleet run the driver waits the core's start spread (`upgrader::agent_upgrade_delay`)
    /// before it hands a new one to its core, as lockstep-agent's machine agent does.
    pub(super) fn poll_reply(
        &mut self,
        host: usize,
        incarnation: u64,
        agent_version: Version,
        stage: Option<StagePlan>,
    ) {
        if !self.current(host, incarnation) {
            return;
        }
        if self.scenario.fleet.is_none() {
            self.feed_agent_version(host, agent_version);
            return;
        }
        if let Some(plan) = stage {
            self.prestage(host, incarnation, plan);
        }
        let state = &self.hosts[host];
        let fed = state.fed.unwrap_or(state.config.running.number);
        if agent_version == fed || state.pending_feed.is_some() {
            return; // nothing new, or already waiting to hand one over
        }
        self.hosts[host].pending_feed = Some(agent_version);
        let delay = lockstep_core::upgrader::agent_upgrade_delay(self.rng.next_u64());
        let at = self.queue.now + delay.0;
        self.queue.schedule(
            at,
            Event::FeedVersion {
                host,
                incarnation,
                version: agent_version,
            },
        );
    }

    /// A [`Message::VersionChanged`] reaches a machine agent: as lockstep-agent's machine
    /// agent after its `WatchAPIVersion` watcher fired, it asks its desired version at once
    /// (its 10 s poll stays, for a notification that was lost).
    pub(super) fn version_changed(&mut self, host: usize, incarnation: u64) {
        let ready = self.hosts[host]
            .process
            .as_ref()
            .is_some_and(|process| process.phase() == Phase::Ready);
        if self.current(host, incarnation) && ready {
            let controller = self.pick_controller();
            self.send_agent_call(host, incarnation, controller, AgentCall::Poll);
        }
    }

    /// [`Event::FeedVersion`]: the start spread is over.
    pub(super) fn feed_version(&mut self, host: usize, incarnation: u64, version: Version) {
        if self.current(host, incarnation) {
            self.hosts[host].pending_feed = None;
            self.feed_agent_version(host, version);
        }
    }

    /// [`Event::DriverTick`].
    pub(super) fn driver_tick(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation) {
            return;
        }
        let controller = self.hosts[host].is_controller();
        let phase = self.hosts[host].process.as_ref().map(Lifecycle::phase);
        if controller {
            // Resume the record watch after the last revision seen (a lost notification
            // is found again), in every phase: a subscription lasts as long as the process,
            // and lockstep-agent's watch thread reads the record again by itself.
            if self.hosts[host].watching {
                let after = self.hosts[host].record_delivered.unwrap_or(Revision(0));
                let message = Message::StoreRequest {
                    host,
                    incarnation,
                    id: RequestId(u64::MAX),
                    request: Request::WatchRecord { after },
                };
                self.send(Party::Host(host), Party::Store, message);
            }
            let version = self.model().agent_version;
            self.feed_agent_version(host, version);
        } else if let (Some(phase), Some(_)) = (phase, self.scenario.fleet) {
            // A fleet run: the agent reports its status in every phase, and polls once
            // Ready, on one connection.
            let controller = self.pick_controller();
            let call = AgentCall::Report {
                phase,
                info: String::new(),
                poll: phase == Phase::Ready,
            };
            self.send_agent_call(host, incarnation, controller, call);
        } else if phase == Some(Phase::Ready) {
            let controller = self.pick_controller();
            self.send_agent_call(host, incarnation, controller, AgentCall::Poll);
        }
        self.schedule_driver_tick(host, incarnation);
    }

    /// Schedules the driver's next tick, one interval later on the host's clock.
    pub(super) fn schedule_driver_tick(&mut self, host: usize, incarnation: u64) {
        let state = &self.hosts[host];
        let tick = if state.is_controller() {
            CONTROLLER_TICK_MS
        } else {
            AGENT_POLL_MS
        };
        let at = self.queue.now + state.clock.global_after(tick);
        self.queue
            .schedule(at, Event::DriverTick { host, incarnation });
    }

    /// A controller's upgrader reports the binary it runs (`Upgrader.SetTools`, through its
    /// own API server, which admits its agent once Ready); with the report-lag fault the
    /// write lands late, meanwhile the store holds what the controller reported before.
    pub(super) fn report_binary(&mut self, host: usize) {
        let state = &mut self.hosts[host];
        state.reported = true;
        let incarnation = state.incarnation;
        let binary = state.config.running.clone();
        let lag = match self.scenario.faults.report_lag_max_ms {
            Some(max) if self.in_safety() => self.rng.range(0, max),
            _ => 0,
        };
        if lag == 0 {
            self.record_binary(host, incarnation, &binary);
        } else {
            let at = self.queue.now + lag;
            self.queue.schedule(
                at,
                Event::BinaryReported {
                    host,
                    incarnation,
                    binary: Box::new(binary),
                },
            );
        }
    }

    /// Tells a process each change of the model's agent-version once, in any phase, as
    /// lockstep-agent's model watch does (counting from the version the process runs): the
    /// core keeps the latest and decides when to act on it.
    fn feed_agent_version(&mut self, host: usize, version: Version) {
        let state = &self.hosts[host];
        if state.process.is_none() {
            return;
        }
        if version == state.fed.unwrap_or(state.config.running.number) {
            return;
        }
        self.hosts[host].fed = Some(version);
        self.input(host, Input::AgentVersionChanged(version));
    }

    /// Whether `host`'s fetch ahead of `plan` is being served: its bytes are arriving.
    fn receiving_ahead(&self, host: usize, plan: &StagePlan) -> bool {
        let state = &self.hosts[host];
        let Some(awaiting) = state.awaiting.get(&PRESTAGE) else {
            return false;
        };
        state
            .prestaging
            .as_ref()
            .is_some_and(|ahead| ahead.binary == plan.binary)
            && self
                .links
                .as_ref()
                .is_some_and(|links| links.receiving(host, PRESTAGE, awaiting.attempt))
    }

    /// The rollout told a machine agent to fetch `plan` ahead of its admission: unless it
    /// has the binary, or fetches or stages one already, its driver starts after the core's
    /// start spread (`upgrader::agent_upgrade_delay`), as lockstep-agent's machine agent
    /// does.
    fn prestage(&mut self, host: usize, incarnation: u64, plan: StagePlan) {
        let state = &self.hosts[host];
        let staging = state
            .awaiting
            .values()
            .any(|awaiting| matches!(awaiting.request, Request::StageBinary(_)));
        if state.prestaged == Some(plan.binary.number) || state.prestaging.is_some() || staging {
            return;
        }
        self.hosts[host].prestaging = Some(plan);
        let delay = lockstep_core::upgrader::agent_upgrade_delay(self.rng.next_u64());
        self.queue.schedule(
            self.queue.now + delay.0,
            Event::Prestage { host, incarnation },
        );
    }

    /// [`Event::Prestage`]: the start spread is over; the fetch ahead is a download like
    /// the core's, through the same tools endpoint (busy answers, retries, cuts).
    pub(super) fn start_prestage(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation) || self.hosts[host].awaiting.contains_key(&PRESTAGE) {
            return;
        }
        let Some(plan) = self.hosts[host].prestaging.clone() else {
            return; // the core's own staging took over
        };
        self.fleet.prestages += 1;
        self.await_request(
            host,
            PRESTAGE,
            Request::StageBinary(plan),
            Route::Controller,
        );
    }

    /// The fetch ahead ended: kept on disk when `done`; a staging of the core that waited
    /// for it is answered, or, if the fetch failed, sent on its own.
    pub(super) fn prestage_done(&mut self, host: usize, done: bool) {
        let state = &mut self.hosts[host];
        let Some(plan) = state.prestaging.take() else {
            return;
        };
        if done {
            state.prestaged = Some(plan.binary.number);
            self.fleet.prestaged += 1;
        }
        let Some((id, waiting)) = state.stage_waiter.take() else {
            return;
        };
        if done && waiting.binary == plan.binary {
            let incarnation = state.incarnation;
            self.queue.schedule(
                self.queue.now,
                Event::StagedOnDisk {
                    host,
                    incarnation,
                    id,
                },
            );
        } else {
            self.await_request(host, id, Request::StageBinary(waiting), Route::Controller);
        }
    }
}

impl Sim {
    /// [`Event::LinkProbe`]: a machine agent that knows no rate for its link (it never
    /// downloaded a binary) asks a controller for a link probe, as lockstep-agent's machine
    /// agent does after its start spread, and looks again after
    /// [`lockstep_core::upgrader::LINK_PROBE_RETRY`]: a probe lost (the message, a crash of
    /// either end) is asked for again until a rate is known.
    pub(super) fn link_probe(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation)
            || self
                .links
                .as_ref()
                .is_none_or(|links| links.measured[host].is_some())
        {
            return;
        }
        let controller = self.rng.index(usize::from(self.scenario.controllers));
        let message = Message::LinkProbe {
            host,
            incarnation,
            controller,
        };
        self.send(Party::Host(host), Party::Host(controller), message);
        let again = self.queue.now + lockstep_core::upgrader::LINK_PROBE_RETRY.0;
        self.queue
            .schedule(again, Event::LinkProbe { host, incarnation });
    }

    /// `host`'s link probe ended: it reports its status at once, with the rate (as
    /// lockstep-agent's status reporter does when its probe ends), rather than at its next
    /// heartbeat: a rollout's canaries, chosen as soon as it is prepared, are the fastest
    /// links known then.
    pub(super) fn report_link_probe(&mut self, host: usize, incarnation: u64) {
        if !self.current(host, incarnation) {
            return;
        }
        let Some(phase) = self.hosts[host].process.as_ref().map(Lifecycle::phase) else {
            return;
        };
        let controller = self.pick_controller();
        let call = AgentCall::Report {
            phase,
            info: String::new(),
            poll: false,
        };
        self.send_agent_call(host, incarnation, controller, call);
    }
}
