//! `NotifyWatcher`: `Next` and `Stop` of the watchers `Upgrader.WatchAPIVersion` opened on
//! this connection (the request's `id` names the watcher, as for `AllWatcher`). A `Next`
//! answers `{}`: the first at once (Juju's initial event), each later one once the agent's
//! desired version, or the version it is told to fetch ahead (`stage-version`), differs
//! from what the previous `Next` saw. A `Next` on an id this
//! connection does not hold (a watcher of the previous worker, or one stopped) is Juju's
//! `unknown watcher id`, code `not found`: the agent opens a new watcher.

use lockstep_core::Version;
use serde_json::{Value, json};

use crate::api::Api;
use crate::facade::upgrader::server_version;
use crate::session::Session;
use crate::wire::WireError;

/// `NotifyWatcher.Next`: `{}` at once the first time; then blocks until the watched agent's
/// desired version or `stage-version` (`Upgrader.DesiredVersion`'s answer) differs from
/// what the previous `Next` saw, or the watcher is stopped (`watcher was stopped`, code `stopped`). It waits
/// on the state's wake-up ([`SharedState::wait_for_change`]) and reads the agent's view
/// again only when the state's revision moved.
///
/// [`SharedState::wait_for_change`]: crate::state::SharedState::wait_for_change
pub async fn next(api: &Api, session: &Session, id: &str) -> Result<Value, WireError> {
    let watcher = session.notify_watcher(id)?;
    let mut stopped = watcher.stopped.subscribe();
    // One Next at a time per watcher: a second waits for the first.
    let mut seen = watcher.seen.lock().await;
    loop {
        if *stopped.borrow_and_update() {
            return Err(WireError::new("stopped", "watcher was stopped"));
        }
        // The revision first: a change committed while the view is read moves it past
        // `read_at`, and the view is read again.
        let read_at = api.state.revision().await?;
        let desired = desired_and_ahead(api, session, &watcher.tag).await?;
        if *seen != Some(desired) {
            *seen = Some(desired);
            return Ok(json!({}));
        }
        loop {
            tokio::select! {
                () = api.state.wait_for_change(read_at) => {}
                _ = stopped.changed() => break,
            }
            if api.state.revision().await? > read_at {
                break;
            }
        }
    }
}

/// The version agent `tag` should run now and the one it is told to fetch ahead, as
/// `Upgrader.DesiredVersion` answers them.
async fn desired_and_ahead(
    api: &Api,
    session: &Session,
    tag: &str,
) -> Result<(Version, Option<Version>), WireError> {
    let views = api
        .state
        .agent_views(&session.agent(), server_version(api)?, &[tag.to_owned()])
        .await?;
    views
        .entities
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(WireError::new("", "the state answered no entity")))
        .map(|view| (view.desired, view.stage))
}

/// `NotifyWatcher.Stop`: ends the watcher; a pending `Next` fails with `watcher was
/// stopped`.
pub fn stop(session: &Session, id: &str) -> Result<Value, WireError> {
    session.stop_notify_watcher(id)?;
    Ok(json!({}))
}
