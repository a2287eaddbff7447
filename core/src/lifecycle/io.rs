//! What the machine shares with its driver, and the only ways it asks for anything: the
//! main request in flight, requests beside it, the one snapshot write, and the gate and
//! status it publishes.
//!
//! spec/lifecycle.md, "Rules the machine keeps": "At most one main request is in flight;
//! the lease keep-alive, the record watch and lease release run beside it. A completion
//! whose id is not awaited is stale and ignored."

use std::collections::VecDeque;

use crate::gate::GateView;
use crate::lifecycle::Timer;
use crate::lifecycle::record::Revision;
use crate::lifecycle::types::{
    Input, Output, Request, RequestId, StatusReport, StepIndex, request_name,
};
use crate::phase::Phase;
use crate::time::{Millis, Timestamp};
use crate::version::{Binary, Version};

use super::machine::Machine;

/// Outputs held at most between two drains; the driver drains after every input.
pub const OUTPUTS_MAX: usize = 32;

/// What the main in-flight request is for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Pending {
    Persist(PersistFor),
    LoadModel,
    Capabilities,
    RecordWrite,
    DatabaseStep(StepIndex),
    HostStep(StepIndex),
    Catalogue,
    DesiredBinary,
    /// The model's `agent-version` asked to become this version.
    SetAgentVersion(Version),
    Report,
    Stage,
}

impl Pending {
    /// Requests whose effect outlives this process if they complete after it gave up on
    /// them: store writes and steps. Reads and local persists are safe to abandon.
    pub(super) fn writes_shared_state(self) -> bool {
        matches!(
            self,
            Pending::RecordWrite
                | Pending::DatabaseStep(_)
                | Pending::HostStep(_)
                | Pending::SetAgentVersion(_)
                | Pending::Report
        )
    }
}

/// Why a snapshot is being persisted: what to do once it is durable.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PersistFor {
    /// Bootstrapping: a trial boot counted (or a switch resumed) before anything else.
    Boot,
    /// A host step ran: its checkpoint.
    HostCheckpoint(StepIndex),
    /// Database steps of the trial version may have run: no fall back from here on.
    PastDatabaseSteps,
    /// Every planned step took effect: `upgradedToVersion` advances.
    UpgradedTo,
    /// Upgrading: `previous` and the trial, before restarting into the new binary.
    Switch,
    /// The trial is given up: restart into the previous binary once durable.
    FallBack,
    /// Ready (or on the way there): the trial proved or cleared, bootstrap complete.
    ClearTrial,
}

/// What the gates and statuses published say, noted by [`Io::push_gate`] and
/// [`Io::push_status`] as each is made, for the read-path checks of I1 and I9 after a
/// dispatch (`Machine::assert_after_dispatch`): they read these notes instead of walking
/// the output queue.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Published {
    /// The phase and progress of the last gate pushed: the gate the driver serves by.
    pub(crate) gate: (Phase, u32),
    /// Notes of the dispatch under way, cleared after it.
    pub(crate) dispatch: DispatchNotes,
}

/// What the gates and statuses of one dispatch broke of I1 and I9, the first of each.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub(crate) struct DispatchNotes {
    /// A gate naming Ready was pushed.
    pub(crate) ready_gate: bool,
    /// A gate's progress ran back within its phase: (phase, from, to).
    pub(crate) regressed: Option<(Phase, u32, u32)>,
    /// A status was marked with a phase other than the last gate's: (status phase, gate
    /// phase, its position in the output queue).
    pub(crate) mismarked: Option<(Phase, Phase, usize)>,
}

/// What the machine shares with its driver between dispatches: the clock reading, the
/// output queue, the timer table and the request counter. Passed to statig as context, so
/// the wrapper can drain outputs without reaching into the machine.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Io {
    pub(crate) now: Timestamp,
    pub(crate) outputs: VecDeque<Output>,
    pub(crate) timers: [Option<Timestamp>; Timer::COUNT],
    /// The earliest of `timers`, kept as they are armed and cancelled.
    pub(crate) earliest: Option<Timestamp>,
    /// What the outputs pushed said of the gate.
    pub(crate) published: Published,
    next_request: u64,
    /// Set once the process asked to restart into another binary: it makes no further
    /// request, whatever it is told, so nothing of it runs beside its successor.
    exiting: bool,
}

impl Io {
    pub(crate) fn new() -> Io {
        Io {
            now: Timestamp::ZERO,
            outputs: VecDeque::with_capacity(OUTPUTS_MAX),
            timers: [None; Timer::COUNT],
            earliest: None,
            published: Published {
                gate: (Phase::Bootstrapping, 0),
                dispatch: DispatchNotes::default(),
            },
            next_request: 1,
            exiting: false,
        }
    }

    /// Asks the driver to switch to `binary` and restart; the last request this process
    /// makes.
    ///
    /// spec/lifecycle.md: "A process that asked to restart into another binary makes no
    /// further request, whatever it is told afterwards: nothing of it runs beside its
    /// successor."
    pub(super) fn exit_into(&mut self, binary: Binary) {
        if !self.exiting {
            let id = self.next_id();
            self.emit_request(id, Request::RestartInto(binary));
            self.exiting = true;
        }
    }

    fn next_id(&mut self) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        id
    }

    /// Issues a request that runs beside the main one (lease keep-alive, watch, release).
    pub(super) fn request_aside(&mut self, request: Request) -> RequestId {
        let id = self.next_id();
        self.emit_request(id, request);
        id
    }

    fn emit_request(&mut self, id: RequestId, request: Request) {
        if self.exiting {
            tracing::debug!(target: "lockstep::lifecycle", request = request_name(&request), "not sent: restarting");
            return;
        }
        tracing::debug!(target: "lockstep::lifecycle", id = id.0, request = request_name(&request), "request");
        self.make_room();
        self.outputs.push_back(Output::Request { id, request });
    }

    /// Asserts the driver drains ([`OUTPUTS_MAX`]), and makes room in the queue for one
    /// more output before it is built: knowing the slot is there, the compiler builds the
    /// output (some 260 bytes) in it rather than on the stack first and copying it over.
    #[inline]
    fn make_room(&mut self) {
        let undrained = self.outputs.len();
        assert!(
            undrained < OUTPUTS_MAX,
            "more than {OUTPUTS_MAX} outputs undrained: the driver must drain after every input"
        );
        if undrained == self.outputs.capacity() {
            self.grow_outputs();
        }
        assert!(self.outputs.len() < self.outputs.capacity());
    }

    /// Only a queue that was never used has no room: `Io::new` makes room for
    /// [`OUTPUTS_MAX`], and a clone (a model checker's) starts empty.
    #[cold]
    #[inline(never)]
    fn grow_outputs(&mut self) {
        self.outputs.reserve(1);
    }

    pub(crate) fn push(&mut self, output: Output) {
        self.make_room();
        self.outputs.push_back(output);
    }

    /// Publishes a gate, noting what it says for the read-path checks.
    pub(crate) fn push_gate(&mut self, view: GateView) {
        let published = &mut self.published;
        let (phase, done) = published.gate;
        if view.phase == phase
            && view.progress.done < done
            && published.dispatch.regressed.is_none()
        {
            published.dispatch.regressed = Some((phase, done, view.progress.done));
        }
        published.dispatch.ready_gate |= view.phase == Phase::Ready;
        published.gate = (view.phase, view.progress.done);
        self.push(Output::Gate(view));
    }

    /// Publishes a status, noting what it says for the read-path checks.
    pub(crate) fn push_status(&mut self, report: StatusReport) {
        let published = &mut self.published;
        if report.phase != published.gate.0 && published.dispatch.mismarked.is_none() {
            published.dispatch.mismarked =
                Some((report.phase, published.gate.0, self.outputs.len()));
        }
        self.push(Output::Status(report));
    }

    pub(super) fn set_timer(&mut self, timer: Timer, after: Millis) {
        let at = self.now + after;
        let replaced = self.timers[timer as usize].replace(at);
        if replaced.is_some() && replaced == self.earliest {
            self.earliest = self.find_earliest();
        } else {
            self.earliest = Some(self.earliest.map_or(at, |earliest| earliest.min(at)));
        }
    }

    /// Disarms `timer`. A timer not armed is left as it is in line, without a call: most
    /// cancels are of such timers (RunningSteps cancels the controllers' wait on every
    /// event).
    #[inline]
    pub(crate) fn cancel_timer(&mut self, timer: Timer) {
        if self.timers[timer as usize].is_some() {
            self.cancel_armed_timer(timer);
        }
    }

    #[inline(never)]
    fn cancel_armed_timer(&mut self, timer: Timer) {
        let cancelled = self.timers[timer as usize].take();
        if cancelled.is_some() && cancelled == self.earliest {
            self.earliest = self.find_earliest();
        }
    }

    fn find_earliest(&self) -> Option<Timestamp> {
        self.timers.iter().flatten().min().copied()
    }

    /// True when an armed timer is due at `now`.
    #[inline]
    pub(crate) fn any_due(&self, now: Timestamp) -> bool {
        debug_assert_eq!(self.earliest, self.find_earliest());
        self.earliest.is_some_and(|at| at <= now)
    }

    pub(super) fn timer_armed(&self, timer: Timer) -> bool {
        self.timers[timer as usize].is_some()
    }
}

impl Machine {
    /// Issues the main request; asserts none is in flight.
    pub(super) fn request(&mut self, io: &mut Io, pending: Pending, request: Request) -> RequestId {
        assert!(
            self.pending.is_none(),
            "request {pending:?} while {:?} is in flight",
            self.pending
        );
        let id = io.next_id();
        if !io.exiting {
            self.pending = Some((id, pending));
        }
        io.emit_request(id, request);
        id
    }

    /// The one write of the snapshot: the snapshot as it now is, durable before `reason`'s
    /// continuation runs (the completion is `Done` with this request's id).
    ///
    /// CONTRACT.md, "Where state lives": the snapshot "lives in the agent's data dir
    /// (`agent.conf`), written atomically"; the driver writes it whole, so every write
    /// carries everything decided so far.
    pub(super) fn persist(&mut self, io: &mut Io, reason: PersistFor) {
        let snapshot = self.snapshot.clone();
        self.request(
            io,
            Pending::Persist(reason),
            Request::PersistSnapshot(snapshot),
        );
    }

    /// True (and clears it) when `id` completes the main request of this kind.
    #[inline]
    pub(super) fn completes(&mut self, id: RequestId, kind: Pending) -> bool {
        if self.pending == Some((id, kind)) {
            self.pending = None;
            true
        } else {
            false
        }
    }

    /// True (and clears it) when `id` completes the `agent-version` write in flight.
    #[inline]
    pub(super) fn completes_agent_version_write(&mut self, id: RequestId) -> bool {
        match self.pending {
            Some((pending_id, Pending::SetAgentVersion(_))) if pending_id == id => {
                self.pending = None;
                true
            }
            _ => false,
        }
    }

    /// Reads an input as what it means before any phase sees it: a refused `agent-version`
    /// write whose refusal found the model already holding the value asked for is a write
    /// done (Juju accepts the current value back; a store that refused it anyway, or a
    /// write another controller made first, leaves nothing to do): the id of the write,
    /// to be dispatched as its `Done`. Every other input is itself (`None`), and is
    /// dispatched as it is, without a copy.
    ///
    /// spec/lifecycle.md: "The core decides: a refusal that found the model holding the
    /// value asked for is a write done; any other is a refusal".
    #[inline]
    pub(crate) fn settle(&self, input: &Input) -> Option<RequestId> {
        match *input {
            Input::AgentVersionRefused {
                id, agent_version, ..
            } if self.pending == Some((id, Pending::SetAgentVersion(agent_version))) => {
                tracing::debug!(target: "lockstep::lifecycle", id = id.0, version = %agent_version, "agent-version write refused, but the model holds the value: done");
                Some(id)
            }
            _ => None,
        }
    }

    /// Subscribes to the upgrade-info record (the current view first, then every change).
    ///
    /// spec/lifecycle.md: "The record watch delivers the current view first, so a
    /// controller that subscribes after the coordinator finished does not wait forever
    /// (Juju's bug)."
    pub(super) fn watch_record(&mut self, io: &mut Io) {
        self.watching = true;
        io.request_aside(Request::WatchRecord { after: Revision(0) });
    }

    // ---------------------------------------------------------------- publishing

    /// The gate for `phase`, with the progress published last.
    pub(super) fn view(&self, phase: Phase) -> GateView {
        GateView {
            phase,
            progress: self.gate.progress,
            retry_after: self.config.limits.retry_after,
        }
    }

    /// Publishes a new phase's gate and its first status, before the phase's entry runs.
    pub(super) fn publish_phase(&mut self, io: &mut Io, gate: GateView, message: String) {
        self.gate = gate;
        io.push_gate(self.gate);
        io.push_status(StatusReport {
            phase: gate.phase,
            progress: gate.progress,
            message,
        });
    }

    /// A status line, marked with the phase the gate last published.
    pub(super) fn status_message(&mut self, io: &mut Io, message: String) {
        tracing::info!(target: "lockstep::lifecycle", phase = %self.gate.phase, message = %message, "status");
        io.push_status(StatusReport {
            phase: self.gate.phase,
            progress: self.gate.progress,
            message,
        });
    }

    /// Publishes progress within the phase, when it moved forward.
    ///
    /// spec/invariants.md, I9: "Published progress never runs backwards within a phase".
    /// What this agent knows can: a controller that takes the lease over counts database
    /// steps from its own `database_next` (the store answers `AlreadyApplied` for those
    /// already run), also after its host steps ran when the record of its upgrade was
    /// archived and created again (a straggler whose record Ready controllers joined). The
    /// gate keeps the furthest point reached.
    pub(super) fn set_progress(&mut self, io: &mut Io, done: u32) {
        let done = done.max(self.gate.progress.done);
        self.assert_progress_forward(done);
        if self.gate.progress.done != done {
            self.gate.progress.done = done;
            io.push_gate(self.gate);
        }
    }
}
