//! The model's config (`ModelGet`, `ModelInfo`), its `agent-stream`, and the agent-version
//! `ModelConfig.ModelSet` changes.

use lockstep_core::Version;
use lockstep_core::lifecycle::UpgradeInfo;
use lockstep_core::policy::Stream;
use lockstep_store::{Store, StoreError};
use lockstep_transport::state::{AgentVersionChange, ModelConfig};
use lockstep_transport::wire::WireError;
use serde_json::json;

use super::calls::{model, store_error};

/// Juju's `state.UpgradeInProgressError`, the refusal of an agent-version change while an
/// upgrade-info record is current.
pub const AGENT_VERSION_UPGRADE_IN_PROGRESS: &str =
    "an upgrade is already in progress or the last upgrade did not complete";

/// The model's config.
pub fn model_config(store: &dyn Store) -> Result<ModelConfig, WireError> {
    let model = model(store)?;
    Ok(ModelConfig {
        name: model.name,
        uuid: model.uuid,
        agent_version: model.agent_version,
        agent_stream: model.agent_stream,
        agent_metadata_url: model.agent_metadata_url,
    })
}

/// The model's `agent-stream` (`None`: the default, also before bootstrap created the
/// model).
pub fn agent_stream(store: &dyn Store) -> Result<Option<Stream>, WireError> {
    Ok(store
        .load_model()
        .map_err(store_error)?
        .and_then(|model| model.agent_stream))
}

/// The refusal of an agent-version change while `record` is current: Juju's message and
/// code (`upgrade in progress`, as Juju's `ServerError` maps it), with the record in
/// `error-info` (`previous-version`, `target-version`, `status`).
pub fn agent_version_refused(record: &UpgradeInfo) -> WireError {
    WireError {
        message: AGENT_VERSION_UPGRADE_IN_PROGRESS.to_owned(),
        code: lockstep_core::gate::UPGRADE_IN_PROGRESS.to_owned(),
        info: Some(json!({
            "previous-version": record.previous_version.to_string(),
            "target-version": record.target_version.to_string(),
            "status": record.status.to_string(),
        })),
    }
}

/// The agent-version a `ModelConfig.ModelSet` may move to, checked against the store
/// before the catalogue is asked: unchanged when it is the current one already (nothing
/// to do, as Juju accepts the current value back), allowed with the model's
/// `agent-stream`, refused while an upgrade-info record is current (Juju's rule) and for a
/// lower version.
pub fn agent_version_change(
    store: &dyn Store,
    version: Version,
) -> Result<AgentVersionChange, WireError> {
    let current_model = model(store)?;
    let current = current_model.agent_version;
    if version == current {
        return Ok(AgentVersionChange::Unchanged);
    }
    if let Some((record, _)) = store.record_view().map_err(store_error)?.current {
        return Err(agent_version_refused(&record));
    }
    if version < current {
        return Err(WireError::new(
            "not supported",
            format!(
                "cannot change agent-version from {current} to the lower version {version}: \
                 downgrades are not supported"
            ),
        ));
    }
    Ok(AgentVersionChange::Allowed {
        model_stream: current_model.agent_stream,
    })
}

/// Writes the model's agent-version (the store refuses it while an upgrade-info record is
/// current, atomically with the write).
pub fn set_agent_version(store: &dyn Store, version: Version) -> Result<(), WireError> {
    match store.set_agent_version(version) {
        Ok(model) => {
            assert_eq!(model.agent_version, version);
            Ok(())
        }
        Err(StoreError::UpgradeInProgress { current }) => Err(agent_version_refused(&current)),
        Err(error) => Err(store_error(error)),
    }
}
