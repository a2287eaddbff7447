//! The HTTP probes: `/livez`, `/readyz` (200 only when Ready, the phase and progress in the
//! body) and `/metrics` (Prometheus text: the phase, calls and gate rejections by facade).
//! Pure functions of the published gate view and the counters.

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lockstep_core::Phase;
use lockstep_core::gate::GateView;
use serde_json::json;

use crate::admission::ConnectionCounts;
use crate::limits::Refusal;
use crate::state::Fleet;

/// Counters for `/metrics`. Keys are facade labels ([`crate::served::facade_label`]), so
/// the label cardinality is bounded.
#[derive(Debug, Default)]
pub struct Metrics {
    pub calls: BTreeMap<&'static str, u64>,
    pub rejections: BTreeMap<&'static str, u64>,
}

/// `GET /livez`.
pub async fn livez() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: 200 when Ready, else 503; the phase and progress as JSON either way.
pub fn readyz(view: GateView) -> Response {
    let body = json!({
        "phase": view.phase.as_str(),
        "step": view.progress.done,
        "steps": view.progress.total,
        "target-version": view.progress.target.map(|version| version.to_string()),
    });
    let status = if view.phase == Phase::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// The front door's leases, appended to `/metrics` (`text` ends with a newline): client
/// connections the launcher leased to a worker, and leases over (the connection taken
/// back, or ended, when the worker was done with it, stopped or died).
pub fn add_lease_counts(text: &mut String, leased: u64, returned: u64) {
    text.push_str("# HELP lockstep_front_door_leases_total Client connections the launcher leased to a worker, which served them on their own socket.\n");
    text.push_str("# TYPE lockstep_front_door_leases_total counter\n");
    let _ = writeln!(text, "lockstep_front_door_leases_total {leased}");
    text.push_str("# HELP lockstep_front_door_leases_returned_total Leases over: the connection taken back when its worker was done with it, stopped or died.\n");
    text.push_str("# TYPE lockstep_front_door_leases_returned_total counter\n");
    let _ = writeln!(text, "lockstep_front_door_leases_returned_total {returned}");
}

/// `/metrics` as a worker behind the front door rendered it, with the launcher's
/// `counts` added to every series that counts connections: the connections, their
/// admission's refusals and the bytes queued for them are the launcher's; the logins'
/// refusals (throttled, queue full) and the watchers are the worker's. Other lines are
/// kept as they are.
pub fn add_connection_counts(text: &str, counts: &ConnectionCounts) -> String {
    let mut added: BTreeMap<String, u64> = BTreeMap::new();
    added.insert(
        "lockstep_api_connections{state=\"pending\"}".to_owned(),
        counts.pending as u64,
    );
    added.insert(
        "lockstep_api_connections{state=\"logged-in\"}".to_owned(),
        counts.logged_in as u64,
    );
    added.insert(
        "lockstep_api_logins_throttled_total".to_owned(),
        counts.refusals[Refusal::LoginThrottled.index()],
    );
    for refusal in Refusal::ALL {
        added.insert(
            format!("lockstep_api_refusals_total{{reason=\"{refusal}\"}}"),
            counts.refusals[refusal.index()],
        );
    }
    added.insert(
        "lockstep_api_reply_bytes_queued".to_owned(),
        counts.reply_bytes as u64,
    );
    added.insert("lockstep_api_watchers".to_owned(), counts.watchers as u64);
    let mut merged = String::with_capacity(text.len());
    for line in text.lines() {
        let sum = line.rsplit_once(' ').and_then(|(series, value)| {
            let more = added.get(series)?;
            Some((series, value.parse::<u64>().ok()? + more))
        });
        match sum {
            Some((series, value)) => {
                let _ = writeln!(merged, "{series} {value}");
            }
            None => {
                merged.push_str(line);
                merged.push('\n');
            }
        }
    }
    merged
}

/// The machine agents' gauges: what the store says of the fleet (absent when it could not
/// be read in time) and this controller's agent downloads in flight.
#[derive(Clone, Copy, Debug)]
pub struct FleetGauges<'a> {
    pub fleet: Option<&'a Fleet>,
    pub downloads_in_flight: u32,
    pub downloads_waiting: u32,
}

/// Label values are versions, phases and rollout states: no quote, backslash or newline
/// can reach them, but a label is escaped as Prometheus asks all the same.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn fleet_gauges(text: &mut String, gauges: &FleetGauges<'_>) {
    text.push_str(
        "# HELP lockstep_agent_downloads_in_flight Machine agents' binary downloads this controller serves now.\n",
    );
    text.push_str("# TYPE lockstep_agent_downloads_in_flight gauge\n");
    let _ = writeln!(
        text,
        "lockstep_agent_downloads_in_flight {}",
        gauges.downloads_in_flight
    );
    text.push_str(
        "# HELP lockstep_agent_downloads_waiting Machine agents' download requests waiting in this controller's queue for a slot.\n",
    );
    text.push_str("# TYPE lockstep_agent_downloads_waiting gauge\n");
    let _ = writeln!(
        text,
        "lockstep_agent_downloads_waiting {}",
        gauges.downloads_waiting
    );
    let Some(fleet) = gauges.fleet else {
        return;
    };
    text.push_str(
        "# HELP lockstep_machine_agents Machine agents by the version and phase they last reported (down: silent).\n",
    );
    text.push_str("# TYPE lockstep_machine_agents gauge\n");
    for ((version, phase), count) in &fleet.agents {
        let _ = writeln!(
            text,
            "lockstep_machine_agents{{version=\"{}\",phase=\"{}\"}} {count}",
            label(version),
            label(phase)
        );
    }
    let Some(rollout) = &fleet.rollout else {
        return;
    };
    text.push_str(
        "# HELP lockstep_rollout_info The staged rollout of machine agents: its target and state (1).\n",
    );
    text.push_str("# TYPE lockstep_rollout_info gauge\n");
    let _ = writeln!(
        text,
        "lockstep_rollout_info{{target=\"{}\",state=\"{}\"}} 1",
        label(&rollout.target),
        label(&rollout.state)
    );
    text.push_str(
        "# HELP lockstep_rollout_agents The rollout's machine agents by where they are in it.\n",
    );
    text.push_str("# TYPE lockstep_rollout_agents gauge\n");
    for (state, count) in [
        ("all", rollout.agents),
        ("admitted", rollout.admitted),
        ("on-target", rollout.on_target),
        ("failed", rollout.failed),
        ("held", rollout.held),
        ("fetching-ahead", rollout.fetching_ahead),
    ] {
        let _ = writeln!(text, "lockstep_rollout_agents{{state=\"{state}\"}} {count}");
    }
    text.push_str("# HELP lockstep_rollout_halted 1 while the rollout is halted.\n");
    text.push_str("# TYPE lockstep_rollout_halted gauge\n");
    let _ = writeln!(
        text,
        "lockstep_rollout_halted {}",
        u8::from(rollout.state == "halted")
    );
}

/// `GET /metrics`: Prometheus text format, the phase as a labelled gauge, calls and gate
/// rejections by facade, connections and logins, and refusals by reason.
pub fn metrics(
    view: GateView,
    metrics: &Metrics,
    connections: &ConnectionCounts,
    (checking, queued): (usize, usize),
    fleet: FleetGauges<'_>,
) -> Response {
    let mut text = String::new();
    text.push_str("# HELP lockstep_phase The agent's lifecycle phase (1 for the current one).\n");
    text.push_str("# TYPE lockstep_phase gauge\n");
    // A worker's phase: the lifecycle's (between two workers no worker answers).
    for phase in Phase::LIFECYCLE {
        let value = u8::from(phase == view.phase);
        let _ = writeln!(text, "lockstep_phase{{phase=\"{phase}\"}} {value}");
    }
    text.push_str("# HELP lockstep_upgrade_steps Steps of the current phase done and planned.\n");
    text.push_str("# TYPE lockstep_upgrade_steps gauge\n");
    let _ = writeln!(
        text,
        "lockstep_upgrade_steps{{state=\"done\"}} {}",
        view.progress.done
    );
    let _ = writeln!(
        text,
        "lockstep_upgrade_steps{{state=\"planned\"}} {}",
        view.progress.total
    );
    text.push_str("# HELP lockstep_api_calls_total API calls received, by facade.\n");
    text.push_str("# TYPE lockstep_api_calls_total counter\n");
    for (facade, count) in &metrics.calls {
        let _ = writeln!(
            text,
            "lockstep_api_calls_total{{facade=\"{facade}\"}} {count}"
        );
    }
    text.push_str("# HELP lockstep_gate_rejections_total Calls the gate turned away, by facade.\n");
    text.push_str("# TYPE lockstep_gate_rejections_total counter\n");
    for (facade, count) in &metrics.rejections {
        let _ = writeln!(
            text,
            "lockstep_gate_rejections_total{{facade=\"{facade}\"}} {count}"
        );
    }
    text.push_str("# HELP lockstep_api_connections Connections open, by whether they logged in.\n");
    text.push_str("# TYPE lockstep_api_connections gauge\n");
    let _ = writeln!(
        text,
        "lockstep_api_connections{{state=\"pending\"}} {}",
        connections.pending
    );
    let _ = writeln!(
        text,
        "lockstep_api_connections{{state=\"logged-in\"}} {}",
        connections.logged_in
    );
    text.push_str("# HELP lockstep_api_logins Password checks running and waiting for a thread.\n");
    text.push_str("# TYPE lockstep_api_logins gauge\n");
    let _ = writeln!(text, "lockstep_api_logins{{state=\"checking\"}} {checking}");
    let _ = writeln!(text, "lockstep_api_logins{{state=\"queued\"}} {queued}");
    text.push_str(
        "# HELP lockstep_api_logins_throttled_total Logins refused without a check after too many failures.\n",
    );
    text.push_str("# TYPE lockstep_api_logins_throttled_total counter\n");
    let _ = writeln!(
        text,
        "lockstep_api_logins_throttled_total {}",
        connections.refusals[Refusal::LoginThrottled.index()]
    );
    text.push_str(
        "# HELP lockstep_api_refusals_total Connections refused or closed, and logins refused, by the limit that did it.\n",
    );
    text.push_str("# TYPE lockstep_api_refusals_total counter\n");
    for refusal in Refusal::ALL {
        let _ = writeln!(
            text,
            "lockstep_api_refusals_total{{reason=\"{refusal}\"}} {}",
            connections.refusals[refusal.index()]
        );
    }
    text.push_str(
        "# HELP lockstep_api_reply_bytes_queued Reply bytes computed and not yet written, all connections.\n",
    );
    text.push_str("# TYPE lockstep_api_reply_bytes_queued gauge\n");
    let _ = writeln!(
        text,
        "lockstep_api_reply_bytes_queued {}",
        connections.reply_bytes
    );
    text.push_str("# HELP lockstep_api_watchers AllWatchers held, all connections.\n");
    text.push_str("# TYPE lockstep_api_watchers gauge\n");
    let _ = writeln!(text, "lockstep_api_watchers {}", connections.watchers);
    fleet_gauges(&mut text, &fleet);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::{Millis, Progress};

    async fn rendered(counts: &ConnectionCounts) -> String {
        rendered_with(
            counts,
            FleetGauges {
                fleet: None,
                downloads_in_flight: 0,
                downloads_waiting: 0,
            },
        )
        .await
    }

    async fn rendered_with(counts: &ConnectionCounts, fleet: FleetGauges<'_>) -> String {
        let view = GateView {
            phase: Phase::Ready,
            progress: Progress::default(),
            retry_after: Millis(1000),
        };
        let response = metrics(view, &Metrics::default(), counts, (1, 2), fleet);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    fn counts(base: u64) -> ConnectionCounts {
        ConnectionCounts {
            pending: base as usize + 1,
            logged_in: base as usize + 2,
            reply_bytes: base as usize + 3,
            watchers: base as usize + 4,
            refusals: std::array::from_fn(|index| base + 10 + index as u64),
        }
    }

    #[tokio::test]
    async fn the_fleets_gauges_name_each_version_and_phase_and_the_rollout() {
        let fleet = Fleet {
            agents: BTreeMap::from([
                (("2.9.44".to_owned(), "ready".to_owned()), 7),
                (("2.9.45".to_owned(), "upgrading".to_owned()), 1),
            ]),
            rollout: Some(crate::state::RolloutGauges {
                target: "2.9.45".to_owned(),
                state: "halted".to_owned(),
                agents: 8,
                admitted: 1,
                on_target: 0,
                failed: 1,
                held: 0,
                fetching_ahead: 2,
            }),
        };
        let text = rendered_with(
            &counts(0),
            FleetGauges {
                fleet: Some(&fleet),
                downloads_in_flight: 3,
                downloads_waiting: 5,
            },
        )
        .await;
        for line in [
            "lockstep_agent_downloads_in_flight 3\n",
            "lockstep_agent_downloads_waiting 5\n",
            "lockstep_machine_agents{version=\"2.9.44\",phase=\"ready\"} 7\n",
            "lockstep_machine_agents{version=\"2.9.45\",phase=\"upgrading\"} 1\n",
            "lockstep_rollout_info{target=\"2.9.45\",state=\"halted\"} 1\n",
            "lockstep_rollout_agents{state=\"failed\"} 1\n",
            "lockstep_rollout_agents{state=\"fetching-ahead\"} 2\n",
            "lockstep_rollout_halted 1\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }

    #[tokio::test]
    async fn the_launchers_counts_are_added_to_every_connection_series_of_the_workers_metrics() {
        let (worker, launcher) = (counts(100), counts(1000));
        let sum = ConnectionCounts {
            pending: worker.pending + launcher.pending,
            logged_in: worker.logged_in + launcher.logged_in,
            reply_bytes: worker.reply_bytes + launcher.reply_bytes,
            watchers: worker.watchers + launcher.watchers,
            refusals: std::array::from_fn(|index| {
                worker.refusals[index] + launcher.refusals[index]
            }),
        };
        let merged = add_connection_counts(&rendered(&worker).await, &launcher);
        assert_eq!(merged, rendered(&sum).await);
        assert!(
            merged.contains("lockstep_phase{phase=\"ready\"} 1\n"),
            "{merged}"
        );
    }
}
