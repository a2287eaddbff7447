//! The model's config (`ModelGet`, `ModelInfo`), its `agent-stream`, and the agent-version
//! `ModelConfig.ModelSet` changes.

use lockstep_core::Version;
use lockstep_core::policy::{Catalogue, Stream};
use lockstep_core::upgrader as core;
use lockstep_core::upgrader::{
    self, AgentVersionCheck, AgentVersionRefusal, AgentVersionRequester,
};
use lockstep_store::{AgentVersionSet, Store};
use lockstep_transport::state::{AgentVersionChange, ModelConfig};
use lockstep_transport::wire::WireError;
use serde_json::json;

use super::calls::{model, store_error};

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

/// An agent-version refusal as the wire carries it: the core's message and code
/// ([`AgentVersionRefusal`]), and for Juju's `state.UpgradeInProgressError` the record in
/// `error-info` (`previous-version`, `target-version`, `status`).
pub fn refusal_error(refusal: &AgentVersionRefusal) -> WireError {
    let info = match refusal {
        AgentVersionRefusal::UpgradeInProgress { record } => Some(json!({
            "previous-version": record.previous_version.to_string(),
            "target-version": record.target_version.to_string(),
            "status": record.status.to_string(),
        })),
        AgentVersionRefusal::Downgrade { .. } | AgentVersionRefusal::NoBinaries { .. } => None,
    };
    WireError {
        message: refusal.to_string(),
        code: refusal.code().to_owned(),
        info,
    }
}

/// The agent-version a `ModelConfig.ModelSet` may move to, checked against the store
/// before the catalogue is asked (the core's rule, [`upgrader::agent_version_change`], for
/// an operator): unchanged when it is the current one already, allowed, refused while an upgrade-info record is current and for a lower
/// version. [`set_agent_version`] checks again, with the catalogue, inside its write.
pub fn agent_version_change(
    store: &dyn Store,
    version: Version,
) -> Result<AgentVersionChange, WireError> {
    let mut read = None;
    store
        .snapshot(&mut |tx| {
            read = Some((tx.model()?, tx.record()?));
            Ok(())
        })
        .map_err(store_error)?;
    let (model, record) = read.expect("the snapshot body ran");
    let model =
        model.ok_or_else(|| WireError::new("not found", "the controller has no model yet"))?;
    let record = record.map(|(record, _)| record);
    match upgrader::agent_version_change(
        model.agent_version,
        record.as_ref(),
        version,
        AgentVersionRequester::Operator,
    ) {
        Ok(core::AgentVersionChange::Unchanged) => Ok(AgentVersionChange::Unchanged),
        Ok(core::AgentVersionChange::Changed { .. }) => Ok(AgentVersionChange::Allowed),
        Err(refusal) => Err(refusal_error(&refusal)),
    }
}

/// Writes the model's agent-version as an operator's change: the store decides by the
/// core's rule ([`AgentVersionCheck::operator`]: no current record, no downgrade, a binary
/// of `version` in `catalogue`) inside the transaction that writes it.
pub fn set_agent_version(
    store: &dyn Store,
    version: Version,
    catalogue: &Catalogue,
) -> Result<(), WireError> {
    match store
        .set_agent_version(version, &AgentVersionCheck::operator(catalogue))
        .map_err(store_error)?
    {
        AgentVersionSet::Set { model, .. } => {
            assert_eq!(model.agent_version, version);
            Ok(())
        }
        AgentVersionSet::Refused { refusal, .. } => Err(refusal_error(&refusal)),
    }
}
