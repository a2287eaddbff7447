//! `AllWatcher`: `Next` and `Stop` of the watchers `Client.WatchAll` opened on this
//! connection. The first `Next` sends the whole state; later ones block until there is a
//! change, and every answer carries the revision it reaches (`revision`) and each delta's
//! own (`revisions`), our extension for resuming after a reconnect.

use lockstep_core::lifecycle::Revision;
use serde_json::{Value, json};

use crate::api::Api;
use crate::session::Session;
use crate::state::Changes;
use crate::wire::{Delta, WireError};

/// Deltas one `AllWatcher.Next` returns at most; the rest come with the next call.
pub const DELTAS_PER_NEXT_MAX: usize = 1000;

/// `AllWatcher.Next`: the first call sends the whole state; later calls block until there
/// is a change (never an empty answer), or until the watcher is stopped.
pub async fn next(api: &Api, session: &Session, id: &str) -> Result<Value, WireError> {
    let watcher = session.watcher(id)?;
    let mut stopped = watcher.stopped.subscribe();
    // One Next at a time per watcher: a second waits for the first.
    let mut position = watcher.position.lock().await;
    loop {
        if *stopped.borrow_and_update() {
            return Err(WireError::new("stopped", "watcher was stopped"));
        }
        let Some(after) = *position else {
            let snapshot = api.state.snapshot(&api.identity()).await?;
            *position = Some(snapshot.revision);
            let revisions = vec![snapshot.revision.0; snapshot.deltas.len()];
            return Ok(json!({"deltas": snapshot.deltas, "revisions": revisions,
                             "revision": snapshot.revision.0}));
        };
        let (deltas, reached) = next_deltas(api, after).await?;
        *position = Some(reached);
        if !deltas.is_empty() {
            let revisions: Vec<u64> = deltas.iter().map(|delta| delta.revision.0).collect();
            let deltas: Vec<Value> = deltas.into_iter().map(|delta| delta.delta).collect();
            return Ok(json!({"deltas": deltas, "revisions": revisions, "revision": reached.0}));
        }
        tokio::select! {
            () = api.state.wait_for_change(reached) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// The deltas after `after`, and the revision they reach (never below `after`).
async fn next_deltas(api: &Api, after: Revision) -> Result<(Vec<Delta>, Revision), WireError> {
    let changes = api
        .state
        .changes_since(&api.identity(), after, DELTAS_PER_NEXT_MAX)
        .await?;
    match changes {
        Changes::Deltas { deltas, reached } => Ok((deltas, reached.max(after))),
        Changes::ResyncNeeded { compacted, current } => Err(WireError {
            message: format!(
                "watcher cannot resume after revision {}: events up to {} were compacted; \
                 start a new watcher (its first Next sends the whole state)",
                after.0, compacted.0
            ),
            code: "resync needed".to_owned(),
            info: Some(json!({"compacted-revision": compacted.0, "current-revision": current.0})),
        }),
    }
}

/// `AllWatcher.Stop`: ends the watcher; a pending `Next` fails with `watcher was stopped`.
pub fn stop(session: &Session, id: &str) -> Result<Value, WireError> {
    session.stop_watcher(id)?;
    Ok(json!({}))
}
