//! `Admin`: `Login` (users and machine agents) and `RedirectInfo`.

use lockstep_core::gate::{self, Login};
use serde_json::{Value, json};

use crate::api::Api;
use crate::auth::{self, Denied, LOGIN_FAILURE_DELAY};
use crate::served::{FACADES, permitted};
use crate::session::Session;
use crate::wire::{self, SERVER_VERSION, WireError};

/// `Admin.RedirectInfo`: lockstep never redirects (python-jujuclient asks before login).
pub fn redirect_info() -> Result<Value, WireError> {
    Err(WireError::new("", "not redirected"))
}

/// `Admin.Login` v3: a user (`user-admin`, `credentials` its password) or a machine agent
/// (`machine-1`, `credentials` its password; Juju's `nonce` is accepted and not checked).
/// Every failure answers the same after the same delay, except a throttled login (too many
/// failures, or its source's checks queued too deep), which is told at once to try again
/// and when. An authenticated agent other than
/// a controller's is then refused while the agent is not Ready, as Juju refuses it.
pub async fn login(
    api: &Api,
    session: &Session,
    request: &wire::Request,
) -> Result<Value, WireError> {
    if request.version != 3 {
        return Err(WireError::new(
            "not implemented",
            format!(
                "unknown version ({}) of interface \"Admin\"",
                request.version
            ),
        ));
    }
    let tag = request
        .params
        .get("auth-tag")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let password = request
        .params
        .get("credentials")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let source = session.source();
    let who = match auth::authenticate(api, source, tag, password).await {
        Ok(who) => who,
        Err(Denied::Unauthorized) => {
            tokio::time::sleep(LOGIN_FAILURE_DELAY).await;
            return Err(Denied::Unauthorized.to_wire(source));
        }
        Err(denied) => return Err(denied.to_wire(source)),
    };
    // Juju's rule: agents other than controllers' wait until the upgrade is over.
    gate::admit_login(&api.view(), who, tag)?;
    // The connection leaves the strangers' slots; if it was closed meanwhile (its login
    // deadline passed, or a newcomer took its slot), nobody is there to tell.
    if let Some(ticket) = session.ticket()
        && !api.connections.logged_in(ticket)
    {
        return Err(WireError::new("", "connection closed"));
    }
    session.logged_in(who, tag);
    let servers: Vec<Value> = api
        .address_for(session)
        .map(|address| {
            json!([{"value": address.ip().to_string(), "port": address.port(), "type": "ipv4", "scope": "local-machine"}])
        })
        .into_iter()
        .collect();
    let facades: Vec<Value> = FACADES
        .iter()
        .filter(|(name, _, _)| permitted(who, name))
        .map(|(name, versions, _)| json!({"name": name, "versions": versions}))
        .collect();
    let mut reply = json!({
        "servers": servers,
        "model-tag": format!("model-{}", api.config.model_uuid),
        "controller-tag": format!("controller-{}", api.config.controller_uuid),
        "facades": facades,
        "server-version": SERVER_VERSION,
    });
    if who == Login::User {
        let user = tag.strip_prefix("user-").unwrap_or_default();
        let access = auth::model_access(user);
        session.grant(access);
        reply["user-info"] = json!({
            "display-name": user,
            "identity": tag,
            "controller-access": "superuser",
            "model-access": access.as_str(),
        });
    }
    Ok(reply)
}
