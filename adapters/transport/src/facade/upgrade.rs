//! `Upgrade`: `Status` and `WatchProgress`, lockstep's own facade, on the gate's allow-list
//! in every phase so a client can follow an upgrade and wait for Ready; and the operator's
//! verbs on the staged rollout of machine agents, `ResumeRollout` and `AbortRollout`
//! (writes: served in Ready only, to a user with admin access to the model).

use std::time::Duration;

use lockstep_core::Phase;
use lockstep_core::gate::GateView;
use serde_json::{Value, json};

use crate::api::Api;
use crate::auth::ModelAccess;
use crate::session::Session;
use crate::wire::WireError;

/// Longest a `Upgrade.WatchProgress` call waits for a change before it answers with the
/// current view anyway (the client simply calls again).
pub const WATCH_PROGRESS_WAIT_MAX: Duration = Duration::from_secs(30);

/// `Upgrade.Status`: the gate's `view` (as the call was admitted) with the lifecycle's
/// detail.
pub fn status(api: &Api, view: GateView) -> Result<Value, WireError> {
    let detail = api.backend.status_detail();
    Ok(json!({
        "phase": view.phase.as_str(),
        "step": view.progress.done,
        "steps": view.progress.total,
        "target-version": view.progress.target.map(|version| version.to_string()),
        "agent-version": api.backend.agent_version(),
        "upgrade-available": api.backend.upgrade_available(),
        "message": detail.message,
        "download": detail.download.map(|(received, total)| {
            json!({"received": received, "total": total})
        }),
        "last-failure": detail.last_failure,
    }))
}

/// The progress a client has seen, as it sends it back: phase and step.
fn progress_of(view: &GateView) -> Value {
    json!({
        "phase": view.phase.as_str(),
        "step": view.progress.done,
        "steps": view.progress.total,
        "target-version": view.progress.target.map(|version| version.to_string()),
        "ready": view.phase == Phase::Ready,
    })
}

/// `Upgrade.WatchProgress {"phase": p, "step": s}`: answers as soon as the phase or step
/// differs from what the client last saw (at once when it saw nothing, or at most after
/// [`WATCH_PROGRESS_WAIT_MAX`]), so a client waits for Ready by calling it in a loop with
/// no polling delay of its own. It is a call, not a server push, so that it stays on the
/// gate's allow-list in every phase.
pub async fn watch_progress(api: &Api, params: &Value) -> Result<Value, WireError> {
    let seen_phase = params
        .get("phase")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let seen_step = params.get("step").and_then(Value::as_u64);
    let differs = |view: &GateView| {
        seen_phase.as_deref() != Some(view.phase.as_str())
            || seen_step != Some(u64::from(view.progress.done))
    };
    let mut changes = api.gate.clone();
    let deadline = tokio::time::Instant::now() + WATCH_PROGRESS_WAIT_MAX;
    loop {
        let view = *changes.borrow_and_update();
        if differs(&view) {
            return Ok(progress_of(&view));
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ok(progress_of(&view));
                }
            }
            () = tokio::time::sleep_until(deadline) => return Ok(progress_of(&view)),
        }
    }
}

/// The operator's verbs are a model admin's, as `agent-version` is: refused to agents and
/// to users with less, naming the access needed and held.
fn operator(session: &Session, method: &str) -> Result<(), WireError> {
    if session.login() != lockstep_core::gate::Login::User {
        return Err(WireError::permission_denied());
    }
    let access = session.model_access();
    if access < ModelAccess::Admin {
        return Err(WireError {
            message: format!(
                "permission denied: Upgrade.{method} needs admin access to the model, the user \
                 has {}",
                access.as_str()
            ),
            code: "unauthorized access".to_owned(),
            info: None,
        });
    }
    Ok(())
}

/// `Upgrade.ResumeRollout {}`: `lockstep upgrade-model --resume`.
pub async fn resume_rollout(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    operator(session, "ResumeRollout")?;
    api.state.resume_rollout(params).await
}

/// `Upgrade.AbortRollout {}`: `lockstep upgrade-model --abort`.
pub async fn abort_rollout(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    operator(session, "AbortRollout")?;
    api.state.abort_rollout(params).await
}
