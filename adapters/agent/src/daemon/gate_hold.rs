//! The order in which a driver makes the core's outputs visible: a gate that opens waits
//! for the snapshot writes asked for before it.
//!
//! The core publishes a phase's gate as it enters the phase, and asks for the write of
//! its snapshot (`agent.conf`) in the same step: entering Ready records that bootstrap is
//! over (`bootstrap_complete`) and that a new binary proved itself. A driver that showed
//! Ready first (to a client, to its supervisor with `READY=1`, to `lockstep bootstrap`
//! saying "is now available") and was killed before the write would restart believing it
//! is still bootstrapping, where `--auto-upgrade` applies and an `agent-version` set
//! since is not honoured. So a gate that opens is held until every snapshot write asked
//! for so far is done. A gate that closes is published at once, and replaces an opening
//! one still held: opening late is always safe, closing late never is.

use std::collections::HashSet;

use lockstep_core::gate::GateView;
use lockstep_core::lifecycle::{Input, Output, Request, RequestId};

/// The snapshot writes in flight and the opening gate waiting for them.
#[derive(Debug, Default)]
pub struct GateHold {
    persisting: HashSet<RequestId>,
    opening: Option<GateView>,
}

impl GateHold {
    /// Notes the snapshot writes among one step's outputs, before any of its gates is
    /// published (the core emits a step's gate before the write that step asks for).
    pub fn outputs(&mut self, outputs: &[Output]) {
        for output in outputs {
            if let Output::Request {
                id,
                request: Request::PersistSnapshot(_),
            } = output
            {
                self.persisting.insert(*id);
            }
        }
    }

    /// Notes an input for the core: the completion of a snapshot write.
    pub fn input(&mut self, input: &Input) {
        if let Input::Done { id } = input {
            self.persisting.remove(id);
        }
    }

    /// The gate to publish now for `view`, or `None` while it is held.
    pub fn gate(&mut self, view: GateView) -> Option<GateView> {
        if !view.is_limited() && !self.persisting.is_empty() {
            self.opening = Some(view);
            return None;
        }
        self.opening = None;
        Some(view)
    }

    /// Whether an opening gate is held: what the agent reports of its phase stays that of
    /// the gate last published.
    pub fn holding(&self) -> bool {
        self.opening.is_some()
    }

    /// The held gate, once every snapshot write it waited for is done.
    pub fn release(&mut self) -> Option<GateView> {
        if self.persisting.is_empty() {
            self.opening.take()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::lifecycle::Snapshot;
    use lockstep_core::{Binary, Phase, Version};

    fn view(phase: Phase) -> GateView {
        GateView {
            phase,
            progress: Default::default(),
            retry_after: Default::default(),
        }
    }

    fn persist(id: u64) -> Output {
        Output::Request {
            id: RequestId(id),
            request: Request::PersistSnapshot(Snapshot::bootstrapped(
                &Binary::new(Version::new(2, 9, 43), "ubuntu", "amd64").unwrap(),
            )),
        }
    }

    #[test]
    fn an_opening_gate_waits_for_every_write_asked_for_before_it() {
        let mut hold = GateHold::default();
        hold.outputs(&[persist(1)]);
        hold.outputs(&[Output::Gate(view(Phase::Ready)), persist(2)]);
        assert_eq!(hold.gate(view(Phase::Ready)), None);
        assert!(hold.holding());
        hold.input(&Input::Done { id: RequestId(2) });
        assert_eq!(hold.release(), None, "write 1 is still under way");
        hold.input(&Input::Done { id: RequestId(7) });
        assert_eq!(hold.release(), None, "another request's completion");
        hold.input(&Input::Done { id: RequestId(1) });
        assert_eq!(hold.release(), Some(view(Phase::Ready)));
        assert!(!hold.holding());
        assert_eq!(hold.release(), None, "released once");
    }

    #[test]
    fn a_closing_gate_is_published_at_once_and_drops_an_opening_one_held() {
        let mut hold = GateHold::default();
        hold.outputs(&[persist(1)]);
        assert_eq!(hold.gate(view(Phase::Ready)), None);
        let closing = view(Phase::Upgrading);
        assert_eq!(hold.gate(closing), Some(closing));
        assert!(!hold.holding());
        hold.input(&Input::Done { id: RequestId(1) });
        assert_eq!(hold.release(), None, "the Ready given up is not published");
    }

    #[test]
    fn with_no_write_under_way_an_opening_gate_is_published_at_once() {
        let mut hold = GateHold::default();
        let ready = view(Phase::Ready);
        assert_eq!(hold.gate(ready), Some(ready));
        hold.outputs(&[persist(1)]);
        hold.input(&Input::Done { id: RequestId(1) });
        assert_eq!(hold.gate(ready), Some(ready));
    }
}
