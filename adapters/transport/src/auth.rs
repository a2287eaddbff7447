//! Authentication: users and machine agents log in with a password checked against an
//! argon2id hash (on the login pool of [`crate::logins`]: a check costs milliseconds of
//! CPU and 19 MiB). Users' hashes are the API's configuration; agents' are in the shared
//! state, issued by any controller (`MachineManager.ProvisioningScript`), and an agent logs
//! in only for a machine that exists there.

use std::net::IpAddr;
use std::time::Duration;

use lockstep_core::Role;
use lockstep_core::gate::Login;
use tokio::time::Instant;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::admission::Ticket;
use crate::api::Api;
use crate::limits::{LOGIN_THROTTLE_FIRST, Refusal};
use crate::logins::{Checked, HashLookup, QueueFull};
use crate::tools_endpoint::http_error;
use crate::wire::WireError;

/// How long a failed login waits before it answers, whatever was wrong (a user that does
/// not exist and a wrong password take the same time).
pub const LOGIN_FAILURE_DELAY: Duration = Duration::from_millis(250);

/// A user's access to the model, Juju's `permission.Access` for models: `read` may call
/// reads, `write` may change the model's entities and config, `admin` may also write the
/// keys with lockstep's semantics (`agent-version`, `agent-stream`, `agent-metadata-url`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ModelAccess {
    Read,
    Write,
    Admin,
}

impl ModelAccess {
    /// Juju's name, as Login's `user-info.model-access` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelAccess::Read => "read",
            ModelAccess::Write => "write",
            ModelAccess::Admin => "admin",
        }
    }
}

/// The model access of `user`, one of [`crate::api::ApiConfig::users`]: every user there is
/// the model's admin (lockstep makes one user, `admin`, at bootstrap, as `juju bootstrap`
/// makes its admin). The rules that read it ([`crate::facade::model_config`]) are written
/// against the access, so a user with less is refused once there is one.
pub fn model_access(_user: &str) -> ModelAccess {
    ModelAccess::Admin
}

/// Hashes a password for [`crate::api::ApiConfig::users`] (argon2id, random salt, PHC
/// string).
pub fn hash_password(password: &str) -> String {
    use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
    let salt = SaltString::generate(&mut OsRng);
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters hashes any password")
        .to_string()
}

/// A hash no password is known for, verified against when a login names no one known.
fn unknown_entity_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| hash_password("no one logs in with this"))
}

/// The machine id an agent tag names: `machine-1` → `1`, `machine-0-lxd-1` → `0/lxd/1`
/// (Juju's tag grammar); `None` for anything else.
pub fn machine_id(tag: &str) -> Option<String> {
    let id = tag.strip_prefix("machine-")?;
    let valid = !id.is_empty()
        && id
            .split('-')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric()));
    valid.then(|| id.replace('-', "/"))
}

/// Why a login was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// Nobody known, a wrong password, or an agent whose machine does not exist.
    Unauthorized,
    /// Too many failed logins from this source, or for this user from a source that failed
    /// too: refused without a check for `retry_after`.
    Throttled { retry_after: Duration },
    /// This source's password checks already wait [`ApiLimits::queued_logins_per_source_max`]
    /// deep.
    ///
    /// [`ApiLimits::queued_logins_per_source_max`]: crate::limits::ApiLimits::queued_logins_per_source_max
    QueueFull,
}

impl Denied {
    /// What the client is told: Juju's `unauthorized access`, or its `try again` with the
    /// wait in `error-info.retry-after-ms`.
    pub fn to_wire(self, source: IpAddr) -> WireError {
        let (message, wait) = match self {
            Denied::Unauthorized => {
                return WireError::new("unauthorized access", "invalid entity name or password");
            }
            Denied::Throttled { retry_after } => (
                format!(
                    "too many failed logins from {source}: retry after {}s",
                    retry_after.as_secs_f64().ceil()
                ),
                retry_after,
            ),
            Denied::QueueFull => (
                format!(
                    "login checks queued for {source} are full: retry after {}s",
                    LOGIN_THROTTLE_FIRST.as_secs()
                ),
                LOGIN_THROTTLE_FIRST,
            ),
        };
        WireError {
            message,
            code: "try again".to_owned(),
            info: Some(serde_json::json!({"retry-after-ms": wait.as_millis() as u64})),
        }
    }
}

/// Who `auth-tag` and `credentials` authenticate, if anyone, for a client at `source`: a
/// user of [`crate::api::ApiConfig::users`], or a machine agent whose password hash is in
/// the shared state ([`SharedState::agent_password_hash`], so any controller admits an
/// agent whose password any controller issued) and whose machine exists there (a controller
/// agent when the machine is a controller). Someone unknown costs a check too, so the time
/// taken does not tell. The check runs on the login pool in `source`'s turn, unless the
/// source or the user is throttled ([`crate::logins`]).
///
/// [`SharedState::agent_password_hash`]: crate::state::SharedState::agent_password_hash
pub async fn authenticate(
    api: &Api,
    source: IpAddr,
    tag: &str,
    password: &str,
) -> Result<Login, Denied> {
    if let Err(retry_after) = api.throttle.check(source, tag, Instant::now()) {
        api.connections.count(Refusal::LoginThrottled);
        return Err(Denied::Throttled { retry_after });
    }
    let user = tag.strip_prefix("user-");
    let checked = match user {
        Some(user) => {
            let known = api.config.users.iter().find(|(name, _)| name == user);
            let hash: &str = match known {
                Some((_, hash)) => hash,
                None => unknown_entity_hash(),
            };
            api.checks
                .verify(source, password, hash)
                .await
                .map(|matched| Checked {
                    matched: matched && known.is_some(),
                    unavailable: false,
                })
        }
        // An agent's hash is read by the login thread, in the source's turn.
        None => {
            let read = agent_hash_lookup(api, tag);
            api.checks
                .verify_looked_up(source, password, read, unknown_entity_hash())
                .await
        }
    };
    let checked = match checked {
        Ok(checked) => checked,
        Err(QueueFull) => {
            api.connections.count(Refusal::LoginQueueFull);
            return Err(Denied::QueueFull);
        }
    };
    if !checked.matched {
        // The state could not be read: the login fails (after a check, so it takes the
        // same time), and is not counted against the agent or its source.
        if !checked.unavailable {
            api.throttle.failed(source, tag, Instant::now());
        }
        return Err(Denied::Unauthorized);
    }
    api.throttle.succeeded(source);
    if user.is_some() {
        return Ok(Login::User);
    }
    agent_login(api, tag).await.ok_or(Denied::Unauthorized)
}

/// Reads agent `tag`'s password hash from the shared state, for a login thread (which is
/// no runtime thread: it waits for the state on the runtime of the call that queued it).
/// `Ok(None)` at once for a tag that is not a machine agent's; `Err(())` when the state
/// could not be read (logged).
fn agent_hash_lookup(api: &Api, tag: &str) -> HashLookup {
    let (state, runtime, tag) = (
        std::sync::Arc::clone(&api.state),
        tokio::runtime::Handle::current(),
        tag.to_owned(),
    );
    Box::new(move || {
        if machine_id(&tag).is_none() {
            return Ok(None);
        }
        runtime
            .block_on(state.agent_password_hash(&tag))
            .map_err(|error| {
                tracing::warn!(target: "lockstep::api", tag, error = %error.message, "cannot read an agent's credentials");
            })
    })
}

/// The login of agent `tag`, which authenticated: a controller agent when its machine is a
/// controller, a machine agent otherwise; `None` when its machine does not exist (or the
/// state cannot say).
async fn agent_login(api: &Api, tag: &str) -> Option<Login> {
    let roles = api.state.machine_roles(&machine_id(tag)?).await.ok()??;
    Some(if roles.contains(Role::Controller) {
        Login::ControllerAgent
    } else {
        Login::MachineAgent
    })
}

/// Who a login carried over from the previous worker is now (`spec/relay.md`): `tag` must
/// still be a user of [`crate::api::ApiConfig::users`], or an agent that still has a
/// password hash in the shared state and whose machine exists; an agent's kind is read
/// afresh from its machine's roles. No password: the launcher, which only this worker's
/// relay socket accepts, vouches that a worker authenticated it.
pub async fn carried(api: &Api, tag: &str) -> Option<Login> {
    if let Some(user) = tag.strip_prefix("user-") {
        return api
            .config
            .users
            .iter()
            .any(|(name, _)| name == user)
            .then_some(Login::User);
    }
    machine_id(tag)?;
    api.state.agent_password_hash(tag).await.ok()??;
    agent_login(api, tag).await
}

/// `user-admin:<password>` from an `Authorization: Basic` header.
pub fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    use base64::Engine;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (tag, password) = text.split_once(':')?;
    Some((tag.to_owned(), password.to_owned()))
}

/// The login of an HTTP request (the charms and tools endpoints): HTTP Basic credentials
/// checked as `Admin.Login` checks them (throttled, on the login pool), for one of `who`;
/// then the connection is no longer a stranger's. `Ok((who, tag))`, or the response that
/// refuses it: 401 with `WWW-Authenticate` (no credentials, wrong ones, or a login not
/// among `who`, after [`LOGIN_FAILURE_DELAY`]), 429 with `Retry-After` (throttled), 503
/// (the connection was closed meanwhile). Errors are JSON as Juju's HTTP endpoints send
/// them.
pub async fn http_login(
    api: &Api,
    source: IpAddr,
    ticket: Option<&Ticket>,
    headers: &HeaderMap,
    who: &[Login],
) -> Result<(Login, String), Response> {
    let unauthorized = |message: &str| {
        let mut response = http_error(StatusCode::UNAUTHORIZED, "unauthorized access", message);
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"juju\""),
        );
        response
    };
    let Some((tag, password)) = basic_credentials(headers) else {
        return Err(unauthorized(
            "no credentials provided: use HTTP Basic authentication (user-<name> or an agent's tag, and its password)",
        ));
    };
    let login = authenticate(api, source, &tag, &password)
        .await
        .and_then(|login| {
            if who.contains(&login) {
                Ok(login)
            } else {
                Err(Denied::Unauthorized)
            }
        });
    let login = match login {
        Ok(login) => login,
        Err(Denied::Unauthorized) => {
            tokio::time::sleep(LOGIN_FAILURE_DELAY).await;
            return Err(unauthorized("invalid entity name or password"));
        }
        Err(denied) => {
            let error = denied.to_wire(source);
            let wait_sec = error
                .info
                .as_ref()
                .and_then(|info| info["retry-after-ms"].as_u64())
                .map_or(1, |ms| ms.div_ceil(1000));
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, wait_sec.to_string())],
                axum::Json(serde_json::json!({"error": {"message": error.message,
                    "code": error.code, "info": error.info}})),
            )
                .into_response());
        }
    };
    if let Some(ticket) = ticket
        && !api.connections.logged_in(ticket)
    {
        return Err(http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "connection closed",
            "the connection was closed while its login was checked",
        ));
    }
    Ok((login, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_tags_name_machine_ids_as_juju_s_grammar_does() {
        assert_eq!(machine_id("machine-1").as_deref(), Some("1"));
        assert_eq!(machine_id("machine-0-lxd-1").as_deref(), Some("0/lxd/1"));
        for tag in [
            "machine-",
            "machine-1-",
            "unit-mysql-0",
            "user-admin",
            "machine-a b",
        ] {
            assert_eq!(machine_id(tag), None, "{tag}");
        }
    }
}
