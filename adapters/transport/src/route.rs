//! Routing one request: count it, check that the facade is served, ask the core's gate with
//! the phase published at this moment (not at login, so a connection opened while the
//! agent was limited becomes full the moment it is Ready), check that the login may call
//! the facade, and call the facade's method.

use lockstep_core::gate::{self, Login};
use serde_json::Value;

use crate::api::Api;
use crate::facade::{
    admin, agent, all_watcher, application, charms, client, controller, machine_manager, machiner,
    model_config, model_manager, notify_watcher, pinger, upgrade, upgrader,
};
use crate::served::{facade_label, not_implemented, permitted, served};
use crate::session::Session;
use crate::wire::{self, WireError};

/// The reply to one frame.
pub async fn answer(api: &Api, session: &Session, text: &str) -> String {
    let request = match wire::decode(text) {
        Ok(request) => request,
        Err(error) => {
            return wire::encode_error(
                error.request_id.unwrap_or(0),
                error.framing,
                &WireError::new("bad request", error.message),
            );
        }
    };
    let (id, framing) = (request.request_id, request.framing);
    match call(api, session, &request).await {
        Ok(response) => wire::encode_response(id, framing, response),
        Err(error) => wire::encode_error(id, framing, &error),
    }
}

/// One call: admitted by the gate and permitted to the login, then served.
pub(crate) async fn call(
    api: &Api,
    session: &Session,
    request: &wire::Request,
) -> Result<Value, WireError> {
    let (facade, method) = (request.facade.as_str(), request.method.as_str());
    let who = session.login();
    let label = facade_label(facade);
    *api.metrics
        .lock()
        .expect("not poisoned")
        .calls
        .entry(label)
        .or_default() += 1;
    // The gate reads the phase as it is now, for every call.
    let view = api.view();
    if who != Login::Anonymous {
        served(facade, request.version, method)?;
    }
    if let Err(refused) = gate::admit(&view, who, facade, method) {
        if refused.code == gate::UPGRADE_IN_PROGRESS {
            *api.metrics
                .lock()
                .expect("not poisoned")
                .rejections
                .entry(label)
                .or_default() += 1;
        }
        return Err(refused.into());
    }
    if !permitted(who, facade) {
        return Err(WireError::permission_denied());
    }
    let params = &request.params;
    match (facade, method) {
        ("Admin", "Login") => admin::login(api, session, request).await,
        ("Admin", "RedirectInfo") => admin::redirect_info(),
        ("Pinger", "Ping") => pinger::ping(),
        ("Client", "FullStatus") => client::full_status(api, view).await,
        ("Client", "AbortCurrentUpgrade") => client::abort_current_upgrade(api),
        ("Client", "SetModelAgentVersion") => {
            client::set_model_agent_version(api, session, params).await
        }
        ("Client" | "ModelConfig", "ModelGet") => model_config::model_get(api).await,
        ("Client" | "ModelConfig", "ModelSet") => {
            model_config::model_set(api, session, params).await
        }
        ("Client" | "ModelConfig", "ModelUnset") => {
            model_config::model_unset(api, session, params).await
        }
        ("ModelConfig", "GetModelConstraints") => model_config::get_model_constraints(),
        ("Client" | "MachineManager", "AddMachines") => {
            machine_manager::add_machines(api, params).await
        }
        ("MachineManager", "DestroyMachineWithParams") => {
            machine_manager::destroy_machines(api, params).await
        }
        ("MachineManager", "ProvisioningScript") => {
            machine_manager::provisioning_script(api, session, params).await
        }
        ("Client", "FindTools") => client::find_tools(api, session, params).await,
        ("Client", "WatchAll") => client::watch_all(api, session, params),
        ("ModelManager", "ModelInfo") => model_manager::model_info(api, view, params).await,
        ("ModelManager", "ListModelSummaries") => {
            model_manager::list_model_summaries(api, view).await
        }
        ("Controller", "AllModels") => controller::all_models(api).await,
        ("Controller", "ControllerAPIInfoForModels") => {
            controller::api_info_for_models(api, session, params).await
        }
        ("Charms", "ResolveCharms") => charms::resolve_charms(params),
        ("Application", "Deploy") => application::deploy(api, params).await,
        ("Application", "AddUnits") => application::add_units(api, params).await,
        ("Application", "AddRelation") => application::add_relation(api, params).await,
        ("Application", "Expose") => application::expose(api, params).await,
        ("Application", "Get") => application::get(api, params).await,
        ("Application", "Set") => application::set(api, params).await,
        ("Application", "SetConfigs") => application::set_configs(api, params).await,
        ("Application", "UnsetApplicationsConfig") => application::unset_config(api, params).await,
        ("Application", "DestroyApplication") => {
            application::destroy_application(api, params).await
        }
        ("Application", "DestroyUnit") => application::destroy_unit(api, params).await,
        ("Upgrader", "SetTools" | "SetVersion") => upgrader::set_tools(api, session, params).await,
        ("Upgrader", "DesiredVersion") => upgrader::desired_version(api, session, params).await,
        ("Upgrader", "Tools") => upgrader::tools(api, session, params).await,
        ("Upgrader", "WatchAPIVersion") => upgrader::watch_api_version(api, session, params).await,
        ("NotifyWatcher", "Next") => notify_watcher::next(api, session, &request.id).await,
        ("NotifyWatcher", "Stop") => notify_watcher::stop(session, &request.id),
        ("Agent", "GetEntities") => agent::get_entities(api, session, params).await,
        ("Machiner", "SetStatus") => machiner::set_status(api, session, params).await,
        ("AllWatcher", "Next") => all_watcher::next(api, session, &request.id).await,
        ("AllWatcher", "Stop") => all_watcher::stop(session, &request.id),
        ("Upgrade", "WatchProgress") => upgrade::watch_progress(api, params).await,
        ("Upgrade", "Status") => upgrade::status(api, view),
        ("Upgrade", "ResumeRollout") => upgrade::resume_rollout(api, session, params).await,
        ("Upgrade", "AbortRollout") => upgrade::abort_rollout(api, session, params).await,
        _ => Err(not_implemented(facade, request.version, method)),
    }
}
