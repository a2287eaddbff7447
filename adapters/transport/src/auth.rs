//! Authentication: users and machine agents log in with a password checked against an
//! argon2id hash (on the blocking pool: a hash costs milliseconds of CPU), and an agent
//! only for a machine that exists in the shared state.

use std::time::Duration;

use lockstep_core::Role;
use lockstep_core::gate::Login;

use crate::api::Api;

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

fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// Verifies on the blocking pool; `false` if that pool could not run it.
async fn verified(password: String, hash: String) -> bool {
    tokio::task::spawn_blocking(move || verify_password(&password, &hash))
        .await
        .unwrap_or(false)
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

/// Who `auth-tag` and `credentials` authenticate, if anyone: a user of
/// [`crate::api::ApiConfig::users`], or an agent of [`crate::api::ApiConfig::agents`] whose
/// machine exists in the shared state (a controller agent when the machine is a
/// controller). Someone unknown costs a hash too, so the time taken does not tell.
pub async fn authenticate(api: &Api, tag: &str, password: &str) -> Option<Login> {
    let user = tag.strip_prefix("user-");
    let hash = match user {
        Some(user) => api.config.users.iter().find(|(name, _)| name == user),
        None => api.config.agents.iter().find(|(agent, _)| agent == tag),
    }
    .map(|(_, hash)| hash.clone());
    let Some(hash) = hash else {
        let _ = verified(password.to_owned(), unknown_entity_hash().to_owned()).await;
        return None;
    };
    if user.is_some() {
        return verified(password.to_owned(), hash)
            .await
            .then_some(Login::User);
    }
    let id = machine_id(tag)?;
    if !verified(password.to_owned(), hash).await {
        return None;
    }
    let roles = api.state.machine_roles(&id).await.ok().flatten()?;
    Some(if roles.contains(Role::Controller) {
        Login::ControllerAgent
    } else {
        Login::MachineAgent
    })
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
