//! The network: who talks to whom ([`Party`]), what they say ([`Message`]), and how it
//! travels: 1–10 ms of latency, and in the safety phase lost, duplicated, held back
//! (reordered) or cut off by a partition.

use lockstep_core::lifecycle::{Input, Request, RequestId, Revision, StagePlan};
use lockstep_core::policy::Catalogue;
use lockstep_core::{Phase, Version};

use super::{Event, Sim};
use crate::rng::Rng;

/// Virtual milliseconds an API call to a controller waits for its answer.
pub(super) const API_TIMEOUT_MS: u64 = 3_000;
/// Client calls (and the drivers' calls) wait at most this long for one call to succeed.
pub(super) const CLIENT_DEADLINE_MS: u64 = 6 * 60 * 60 * 1000;

/// A party on the network.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Party {
    Store,
    Streams,
    Host(usize),
    Client(usize),
}

/// What a machine agent asks a controller's API.
#[derive(Clone, Debug)]
pub(super) enum AgentCall {
    /// A request of its core (`LoadModel`, `DesiredBinary`, `StageBinary`).
    Request(Box<Request>),
    /// `Upgrader.DesiredVersion`, which the agent polls.
    Poll,
    /// A fleet run's agent reports its status (`Machiner.SetStatus`: its phase), every
    /// driver tick in every phase, and once Ready polls `Upgrader.DesiredVersion` on the
    /// same connection.
    Report {
        phase: Phase,
        /// Its status message (why, in a failure phase).
        info: String,
        poll: bool,
    },
}

/// What a client asks a controller's API.
#[derive(Clone, Debug)]
pub(super) enum ClientOp {
    /// `Application.Deploy` with an `operation-id`.
    Deploy { operation: String },
    /// `AllWatcher.Next` after a revision (`None`: the first call, answered by a snapshot).
    Next { after: Option<Revision> },
    /// `Client.FullStatus`.
    Status,
}

/// A controller's answer to a client.
#[derive(Clone, Debug)]
pub(super) enum ClientAnswer {
    Deployed,
    Snapshot(Revision),
    Events(Vec<Revision>),
    Status,
    Refused {
        phase: Phase,
        retry_after: u64,
    },
    /// Nobody listens (the controller's process is down) or the connection the call was
    /// sent on belonged to a process that has gone: refused or reset.
    Unreachable,
}

#[derive(Clone, Debug)]
pub(super) enum Message {
    StoreRequest {
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    },
    Reply {
        host: usize,
        incarnation: u64,
        id: Option<RequestId>,
        input: Input,
    },
    Refused {
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        phase: Phase,
        retry_after: u64,
    },
    AgentCall {
        host: usize,
        incarnation: u64,
        controller: usize,
        id: RequestId,
        attempt: u32,
        call: AgentCall,
    },
    /// A controller's tools endpoint is serving its bound of agent downloads (HTTP 503
    /// with `Retry-After`).
    DownloadBusy {
        host: usize,
        incarnation: u64,
        id: RequestId,
        attempt: u32,
        retry_after: u64,
    },
    PollReply {
        host: usize,
        incarnation: u64,
        agent_version: Version,
        /// The binary to fetch ahead of admission (`stage-version` and `Upgrader.Tools`'
        /// `stage-tools`), while the rollout says so.
        stage: Option<Box<StagePlan>>,
    },
    /// A machine agent's `Upgrader.WatchAPIVersion` watcher fires (its `NotifyWatcher.Next`
    /// returns): its desired version may have changed, and it asks again.
    VersionChanged { host: usize, incarnation: u64 },
    /// A machine agent asks `controller`'s probe endpoint for a link probe.
    LinkProbe {
        host: usize,
        incarnation: u64,
        controller: usize,
    },
    StreamRequest {
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    },
    StreamReply {
        host: usize,
        incarnation: u64,
        id: RequestId,
        reply: Result<(Catalogue, u64), String>,
    },
    ClientCall {
        client: usize,
        controller: usize,
        /// The controller process the client's connection is open to; `None`: the call
        /// opens a connection first.
        connection: Option<u64>,
        attempt: u64,
        op: ClientOp,
    },
    ClientReply {
        client: usize,
        attempt: u64,
        /// The controller process that answered.
        server: u64,
        answer: ClientAnswer,
    },
}

/// One partition: `a` cut off from `b`, or from everyone.
#[derive(Clone, Copy, Debug)]
struct PartitionRule {
    a: Party,
    b: Option<Party>,
    healed: bool,
}

/// The network's state: the partitions so far.
#[derive(Debug, Default)]
pub(super) struct Network {
    partitions: Vec<PartitionRule>,
}

impl Network {
    /// Whether a message from `from` to `to` is cut off now.
    pub(super) fn blocked(&self, from: Party, to: Party) -> bool {
        self.partitions.iter().any(|rule| {
            !rule.healed
                && match rule.b {
                    None => rule.a == from || rule.a == to,
                    Some(b) => (rule.a == from && b == to) || (rule.a == to && b == from),
                }
        })
    }

    pub(super) fn heal(&mut self, index: usize) {
        self.partitions[index].healed = true;
    }

    pub(super) fn heal_all(&mut self) {
        for rule in &mut self.partitions {
            rule.healed = true;
        }
    }
}

impl Sim {
    /// Sends `message`: it arrives after its latency as an [`Event::Deliver`], unless lost
    /// (or cut off by a partition when it arrives).
    pub(super) fn send(&mut self, from: Party, to: Party, message: Message) {
        let faults = &self.scenario.faults;
        let (drop, delay, duplicate) = if self.in_safety() {
            (
                faults.drop_per_million,
                faults.delay_per_million,
                faults.duplicate_per_million,
            )
        } else {
            (0, 0, 0)
        };
        let now = self.queue.now;
        if self.rng.chance(drop) {
            self.trace.note(now, "message dropped");
            return;
        }
        let mut latency = self.rng.range(1, 10);
        if self.rng.chance(delay) {
            latency += self.rng.range(100, 10_000);
        }
        let twice = self.rng.chance(duplicate);
        if twice {
            let at = now + latency + self.rng.range(0, 2_000);
            self.queue.schedule(
                at,
                Event::Deliver {
                    from,
                    to,
                    message: Box::new(message.clone()),
                },
            );
        }
        self.queue.schedule(
            now + latency,
            Event::Deliver {
                from,
                to,
                message: Box::new(message),
            },
        );
    }

    /// Sends the end of a stream (a download's last bytes): after its latency, never lost,
    /// duplicated or held back one message at a time (the connection may die with either
    /// end, which the link model handles).
    pub(super) fn send_stream(&mut self, from: Party, to: Party, message: Message) {
        let latency = self.rng.range(1, 10);
        let at = self.queue.now + latency;
        self.queue.schedule(
            at,
            Event::Deliver {
                from,
                to,
                message: Box::new(message),
            },
        );
    }

    /// The partition fault: a party is cut off from another, or from everyone, for 1 s to
    /// 2 min; the next partition is scheduled.
    pub(super) fn partition(&mut self) {
        let parties = self.hosts.len() + 2 + self.clients.len();
        let pick = |rng: &mut Rng, hosts: usize| -> Party {
            let index = rng.index(parties);
            match index {
                0 => Party::Store,
                1 => Party::Streams,
                index if index - 2 < hosts => Party::Host(index - 2),
                index => Party::Client(index - 2 - hosts),
            }
        };
        let hosts = self.hosts.len();
        let a = pick(&mut self.rng, hosts);
        let b = if self.rng.coin() {
            None
        } else {
            Some(pick(&mut self.rng, hosts))
        };
        let lasting = self.rng.range(1_000, 120_000);
        let index = self.network.partitions.len();
        self.network.partitions.push(PartitionRule {
            a,
            b,
            healed: false,
        });
        let host = match a {
            Party::Host(host) => Some(host),
            _ => None,
        };
        self.mark_fault(host, &format!("partition {a:?} from {b:?}"));
        let now = self.queue.now;
        self.queue
            .schedule(now + lasting, Event::HealPartition { index });
        if let Some(interval) = self.scenario.faults.partition_interval_ms {
            let next = now + self.rng.range(1, interval * 2);
            self.queue.schedule(next, Event::Partition);
        }
    }
}
