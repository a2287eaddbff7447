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

/// `GET /metrics`: Prometheus text format, the phase as a labelled gauge, calls and gate
/// rejections by facade, connections and logins, and refusals by reason.
pub fn metrics(
    view: GateView,
    metrics: &Metrics,
    connections: &ConnectionCounts,
    (checking, queued): (usize, usize),
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
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}
