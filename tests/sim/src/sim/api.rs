//! The API server of each controller, as its process answers: machine agents' calls
//! (`Admin.Login` as a machine agent, the model, `Upgrader.DesiredVersion`, the desired
//! binary, the tools endpoint) and clients' calls (`Application.Deploy`, `AllWatcher.Next`,
//! `Client.FullStatus`). Every call but the tools endpoint goes through the core's gate
//! (`gate::admit_login`, `gate::admit`) with the view the process last published. The
//! Upgrader answers with the core's decisions, as the facades do: the version an agent
//! should run by `upgrader::desired_version` (controllers first, over the binaries the
//! machines reported), the binary for it by `Catalogue::entry_for` (one stream rule).

use lockstep_core::gate::{self, Login};
use lockstep_core::lifecycle::{Input, Request, RequestId, StagePlan, StageSource};
use lockstep_core::rollout;
use lockstep_core::upgrader::{self, AskingAgent};
use lockstep_core::{Binary, Version};
use lockstep_store::{Changes, OperationOutcome, Store};

use super::Sim;
use super::network::{AgentCall, ClientAnswer, ClientOp, Message, Party};
use crate::checkers::Observation;

impl Sim {
    /// A machine agent's call reaches `controller`'s API server.
    pub(super) fn api_agent_call(
        &mut self,
        host: usize,
        incarnation: u64,
        controller: usize,
        id: RequestId,
        attempt: u32,
        call: AgentCall,
    ) {
        let Some(process) = &self.hosts[controller].process else {
            return; // nobody listens: the caller times out
        };
        let phase = process.phase();
        let view = self.hosts[controller].gate;
        let tag = self.hosts[host].name.clone();
        if let AgentCall::Request(request) = &call
            && let Request::StageBinary(_) = **request
        {
            // The tools endpoint is plain HTTP, not behind the API gate.
        } else {
            let admitted = gate::admit_login(&view, Login::MachineAgent, &tag).is_ok();
            self.observe(Observation::GateDecision {
                host: controller,
                process: phase,
                login: Login::MachineAgent,
                facade: "Admin",
                method: "Login",
                admitted,
            });
            if !admitted {
                let message = Message::Refused {
                    host,
                    incarnation,
                    id,
                    attempt,
                    phase: view.phase,
                    retry_after: view.retry_after.0,
                };
                self.send(Party::Host(controller), Party::Host(host), message);
                return;
            }
            // Logged in, the agent's upgrader reports the binary it runs first
            // (`Upgrader.SetTools`), then asks what it should run.
            if self.hosts[host].incarnation == incarnation {
                let running = self.hosts[host].config.running.clone();
                self.record_binary(host, incarnation, &running);
            }
        }
        let model = self.model();
        let reply = |input: Input| Message::Reply {
            host,
            incarnation,
            id: Some(id),
            input,
        };
        let call = match call {
            AgentCall::Poll => None,
            AgentCall::Report { phase, info, poll } => {
                // `Machiner.SetStatus` (an agent's report on itself), then, once Ready,
                // `Upgrader.DesiredVersion`.
                if self.hosts[host].incarnation == incarnation {
                    self.record_status(controller, host, phase, info);
                }
                if !poll {
                    return;
                }
                None
            }
            AgentCall::Request(request) => Some(*request),
        };
        let message = match call {
            // `Upgrader.DesiredVersion`: the version the agent should run, controllers first.
            None => {
                let (agent_version, stage) = self.desired_and_ahead(host, controller);
                // `Upgrader.Tools`' `stage-tools`: the catalogue's binary of the version to
                // fetch ahead, for what the agent runs (the one stream rule).
                let stage = stage.and_then(|number| {
                    let running = self.executor.reported(host)?;
                    let wanted = Binary {
                        number,
                        ..running.clone()
                    };
                    let entry = self
                        .streams
                        .current()
                        .entry_for(&wanted, model.agent_stream)?
                        .clone();
                    Some(Box::new(StagePlan {
                        binary: entry.binary,
                        size_bytes: entry.size_bytes,
                        sha256: entry.sha256,
                        source: StageSource::Controller,
                    }))
                });
                Message::PollReply {
                    host,
                    incarnation,
                    agent_version,
                    stage,
                }
            }
            Some(Request::LoadModel) => reply(Input::ModelLoaded {
                id,
                model: model.view(),
            }),
            // `Upgrader.Tools`: the catalogue's binary of the desired version for the release
            // and architecture the agent reported, by the core's one stream rule.
            Some(Request::DesiredBinary) => {
                let desired = self.desired_version(host, controller);
                let Some(running) = self.executor.reported(host) else {
                    return; // never reported (`not found`): the agent asks again
                };
                let wanted = Binary {
                    number: desired,
                    ..running.clone()
                };
                let Some(entry) = self
                    .streams
                    .current()
                    .entry_for(&wanted, model.agent_stream)
                    .cloned()
                else {
                    return; // no binary to offer yet (`not found`): the agent asks again
                };
                reply(Input::DesiredBinary {
                    id,
                    plan: StagePlan {
                        binary: entry.binary,
                        size_bytes: entry.size_bytes,
                        sha256: entry.sha256,
                        source: StageSource::Controller,
                    },
                })
            }
            // The tools endpoint serves the catalogue's entry for the binary asked for (the
            // one stream rule); the agent checks the download against its plan's digest.
            Some(Request::StageBinary(plan)) => {
                let result = match self
                    .streams
                    .current()
                    .entry_for(&plan.binary, model.agent_stream)
                {
                    Some(entry) if entry.sha256 == plan.sha256 => Ok(()),
                    Some(_) => Err(format!(
                        "sha256 mismatch for {}: the download does not match the plan",
                        plan.binary
                    )),
                    None => Err(format!("no agent binaries found for {}", plan.binary)),
                };
                if result.is_ok() && self.scenario.fleet.is_some() {
                    // A fleet run: the download takes time on the link model, admitted
                    // under the core's bound.
                    self.serve_download(controller, host, incarnation, id, attempt, &plan);
                    return;
                }
                reply(Input::Staged { id, result })
            }
            Some(other) => panic!("{other:?} is not an agent API call"),
        };
        self.send(Party::Host(controller), Party::Host(host), message);
    }

    /// What `controller`'s `Upgrader.DesiredVersion` answers `host` (the poll and the
    /// desired binary alike): the core's controllers-first rule, the one the facades call,
    /// over what the store holds (the model's agent-version, each controller machine's
    /// reported binary) and the answering server's own version; then, for an agent other
    /// than a controller, the staged rollout's answer (`rollout::told`) over the record
    /// the server last read from the store.
    fn desired_version(&mut self, host: usize, controller: usize) -> Version {
        self.desired_and_ahead(host, controller).0
    }

    /// [`Sim::desired_version`], and the version the rollout tells the agent to fetch ahead
    /// of its admission (`rollout::told_stage`, `stage-version`).
    fn desired_and_ahead(&mut self, host: usize, controller: usize) -> (Version, Option<Version>) {
        let model_agent_version = self.model().agent_version;
        let controllers = usize::from(self.scenario.controllers);
        // Counted for the report only (`Report::answers_before_a_report`), never part of
        // the answer: a controller runs, or is about to boot, another binary than the one
        // the store holds as its report.
        let unreported = (0..controllers).any(|index| {
            self.executor.reported[index]
                .as_ref()
                .is_none_or(|(_, binary)| *binary != self.hosts[index].config.running)
        });
        if unreported {
            self.answers_before_a_report += 1;
        }
        let reported = self.executor.reported(host);
        let controllers_first = upgrader::desired_version(
            model_agent_version,
            AskingAgent {
                roles: self.hosts[host].config.roles,
                reported,
            },
            (0..controllers).map(|index| self.executor.reported(index)),
            self.hosts[controller].config.running.number,
        );
        if self.hosts[host].is_controller() {
            return (controllers_first, None);
        }
        let id = self.machine_id(host);
        let running = reported.map(|binary| binary.number);
        let record = self.rollout_record();
        let ahead = rollout::told_stage(record, &id, running, model_agent_version);
        let told = rollout::told(
            &self.rollout_policy(),
            record,
            &id,
            running,
            controllers_first,
        );
        (told, ahead)
    }

    /// A client's call reaches `controller`'s API server.
    pub(super) fn api_client_call(
        &mut self,
        client: usize,
        controller: usize,
        connection: Option<u64>,
        attempt: u64,
        op: ClientOp,
    ) {
        let server = self.hosts[controller].incarnation;
        // Nobody listens (the connect is refused), or the process the connection was open
        // to has gone (the connection is reset).
        let listening = self.hosts[controller]
            .process
            .as_ref()
            .filter(|_| connection.is_none_or(|open| open == server));
        let Some(process) = listening else {
            let message = Message::ClientReply {
                client,
                attempt,
                server,
                answer: ClientAnswer::Unreachable,
            };
            self.send(Party::Host(controller), Party::Client(client), message);
            return;
        };
        let phase = process.phase();
        let view = self.hosts[controller].gate;
        let (facade, method) = match &op {
            ClientOp::Deploy { .. } => ("Application", "Deploy"),
            ClientOp::Next { .. } => ("AllWatcher", "Next"),
            ClientOp::Status => ("Client", "FullStatus"),
        };
        let admitted = gate::admit(&view, Login::User, facade, method).is_ok();
        self.observe(Observation::GateDecision {
            host: controller,
            process: phase,
            login: Login::User,
            facade,
            method,
            admitted,
        });
        let answer = if !admitted {
            ClientAnswer::Refused {
                phase: view.phase,
                retry_after: view.retry_after.0,
            }
        } else {
            match op {
                ClientOp::Deploy { operation } => {
                    let outcome = self
                        .executor
                        .store
                        .apply_operation(&operation, &mut |tx| {
                            tx.put_application(&lockstep_store::Application {
                                name: operation.clone(),
                                charm: "ch:amd64/jammy/mysql-42".to_owned(),
                                life: lockstep_store::Life::Alive,
                            })?;
                            Ok(serde_json::json!({ "deployed": operation }))
                        })
                        .expect("the store answers");
                    if let OperationOutcome::Applied(_) = outcome {
                        self.observe(Observation::OperationApplied {
                            operation: &operation,
                        });
                    }
                    self.scan_store();
                    ClientAnswer::Deployed
                }
                ClientOp::Next { after: None } => ClientAnswer::Snapshot(self.executor.scanned),
                ClientOp::Next { after: Some(after) } => {
                    match self
                        .executor
                        .store
                        .changes_since(after, 20)
                        .expect("the store answers")
                    {
                        Changes::Events { events, .. } => ClientAnswer::Events(
                            events.iter().map(|event| event.revision).collect(),
                        ),
                        Changes::ResyncNeeded { current, .. } => ClientAnswer::Snapshot(current),
                    }
                }
                ClientOp::Status => ClientAnswer::Status,
            }
        };
        let message = Message::ClientReply {
            client,
            attempt,
            server,
            answer,
        };
        self.send(Party::Host(controller), Party::Client(client), message);
    }
}
