//! The agent-binary stream: serves the catalogue as published so far, and binaries listed
//! in it. In the safety phase it may stall, serve corrupt bytes, or roll its metadata back;
//! each controller guards it as the streams adapter does, with the core's
//! `HighWaterMark` (a rollback is refused).

use std::collections::BTreeSet;

use lockstep_core::lifecycle::{Input, Request, RequestId};
use lockstep_core::policy::{Catalogue, CatalogueEntry, HighWaterMark, Sha256, Stream};
use lockstep_core::{Binary, Version};

use super::network::{Message, Party};
use super::{Event, Sim};
use crate::scenario::Scenario;

/// Unix seconds of the simulated epoch (the stream's `updated` times count from here).
const EPOCH_UNIX_SECONDS: u64 = 1_760_000_000;
/// Metadata older than this is frozen (TUF); long enough never to trigger here.
const FREEZE_AFTER_SECONDS: u64 = 30 * 24 * 3600;

/// What the stream lists, before and after the newer patch is published.
#[derive(Debug)]
pub(super) struct Streams {
    before: Catalogue,
    /// The catalogue with the newer patch, and when it is published.
    after: Option<(Catalogue, u64)>,
    published: bool,
    /// Versions the stream has listed so far.
    pub(super) listed: BTreeSet<Version>,
}

impl Streams {
    pub(super) fn new(scenario: &Scenario) -> Streams {
        let size = scenario.fleet.map_or(4096, |fleet| fleet.binary_bytes);
        Streams {
            before: catalogue_of(&scenario.catalogue, size),
            after: scenario.newer_patch.map(|(version, at)| {
                let mut versions = scenario.catalogue.clone();
                versions.push(version);
                (catalogue_of(&versions, size), at)
            }),
            published: false,
            listed: scenario.catalogue.iter().copied().collect(),
        }
    }

    /// The catalogue the stream serves now (what a controller's API offers from).
    pub(super) fn current(&self) -> &Catalogue {
        if self.published {
            &self.after.as_ref().expect("published").0
        } else {
            &self.before
        }
    }
}

/// The binary of `version` every host runs (one release and architecture).
pub(super) fn binary(version: Version) -> Binary {
    Binary::new(version, "ubuntu", "amd64").expect("a valid binary")
}

/// The digest of `version`'s tarball as the catalogue lists it.
fn artifact_sha(version: Version) -> Sha256 {
    Sha256([version.patch as u8; 32])
}

fn catalogue_of(versions: &[Version], size_bytes: u64) -> Catalogue {
    let entries = versions
        .iter()
        .map(|&version| CatalogueEntry {
            binary: binary(version),
            stream: Stream::Released,
            size_bytes,
            sha256: artifact_sha(version),
            path: format!("agent/{version}/juju-{version}-ubuntu-amd64.tgz"),
        })
        .collect();
    Catalogue::new(entries).expect("a valid catalogue")
}

impl Sim {
    /// [`super::Event::Publish`]: the stream starts listing the newer patch.
    pub(super) fn publish(&mut self) {
        self.streams.published = true;
        if let Some((version, _)) = self.scenario.newer_patch {
            self.streams.listed.insert(version);
            self.mark_fault(None, &format!("stream publishes {version}"));
        }
    }

    /// A controller's catalogue lookup or binary download reaches the stream.
    pub(super) fn stream_serve(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        request: Request,
    ) {
        let faults = &self.scenario.faults;
        let (stall, corrupt, rollback) = if self.in_safety() {
            (
                faults.stream_stall_per_million,
                faults.stream_corrupt_per_million,
                faults.stream_rollback_per_million,
            )
        } else {
            (0, 0, 0)
        };
        if self.rng.chance(stall) {
            self.mark_fault(Some(host), "stream stalls");
            return;
        }
        let corrupted = self.rng.chance(corrupt);
        let rolled_back = self.rng.chance(rollback);
        let request_kind = match &request {
            Request::StageBinary(plan) => Some(plan.size_bytes),
            _ => None,
        };
        let reply = match request {
            Request::LookupCatalogue { .. } => {
                if corrupted {
                    self.mark_fault(Some(host), "stream serves corrupt metadata");
                    Err("index.sjson: signature verification failed (corrupt bytes)".to_owned())
                } else if rolled_back || !self.streams.published {
                    if rolled_back {
                        self.mark_fault(Some(host), "stream rolls its metadata back");
                    }
                    Ok((self.streams.before.clone(), EPOCH_UNIX_SECONDS))
                } else {
                    let (catalogue, at) = self.streams.after.clone().expect("published");
                    Ok((catalogue, EPOCH_UNIX_SECONDS + at / 1000 + 1))
                }
            }
            Request::StageBinary(plan) => {
                let listed = self.streams.listed.contains(&plan.binary.number);
                let verified =
                    !corrupted && listed && plan.sha256 == artifact_sha(plan.binary.number);
                if corrupted {
                    self.mark_fault(Some(host), "stream serves a corrupt binary");
                }
                if verified {
                    Ok((Catalogue::default(), 0))
                } else {
                    Err(format!(
                        "sha256 mismatch for {}: the download does not match the catalogue",
                        plan.binary
                    ))
                }
            }
            other => panic!("{other:?} is not a stream request"),
        };
        // A fleet run: a binary takes its size over the upstream link to arrive.
        let transfer = match (&request_kind, &self.links, &reply) {
            (Some(bytes), Some(links), Ok(_)) => links.upstream_ms(*bytes),
            _ => 0,
        };
        let message = Message::StreamReply {
            host,
            incarnation,
            id,
            reply,
        };
        if transfer == 0 {
            self.send(Party::Streams, Party::Host(host), message);
        } else {
            let at = self.queue.now + transfer;
            self.queue.schedule(
                at,
                Event::Send {
                    from: Party::Streams,
                    to: Party::Host(host),
                    message: Box::new(message),
                },
            );
        }
    }

    /// The stream's answer reaches the controller's driver, which guards it as the streams
    /// adapter does before the core sees it.
    pub(super) fn stream_reply(
        &mut self,
        host: usize,
        incarnation: u64,
        id: RequestId,
        reply: Result<(Catalogue, u64), String>,
    ) {
        if !self.current(host, incarnation) {
            return;
        }
        let Some(awaiting) = self.hosts[host].awaiting.remove(&id) else {
            return;
        };
        let input = match awaiting.request {
            Request::StageBinary(plan) => {
                if reply.is_ok() {
                    self.binary_cached(host, plan.binary.number);
                }
                Input::Staged {
                    id,
                    result: reply.map(|_| ()),
                }
            }
            _ => {
                // The streams adapter's guards: nothing reaches the core unless admitted by
                // the high-water mark, which then advances (durably, with the host's disk).
                let now_unix = EPOCH_UNIX_SECONDS + self.queue.now / 1000;
                let result = reply.and_then(|(catalogue, updated)| {
                    let mark = &mut self.hosts[host].high_water;
                    let highest = catalogue.highest_version();
                    mark.admit(
                        updated,
                        now_unix,
                        FREEZE_AFTER_SECONDS,
                        HighWaterMark::FUTURE_SKEW_SECONDS_DEFAULT,
                    )
                    .map_err(|error| error.to_string())?;
                    mark.admit_version(highest)
                        .map_err(|error| error.to_string())?;
                    mark.advance(updated, highest);
                    Ok(catalogue)
                });
                Input::CatalogueFound { id, result }
            }
        };
        self.input(host, input);
    }
}
