//! `MachineManager` (v10, python-libjuju's only version): `AddMachines`,
//! `DestroyMachineWithParams` and `ProvisioningScript`. `AddMachines` is the same call of
//! the shared state as `Client.AddMachines` and `lockstep add-machine`: one way to record a
//! machine.

use serde_json::{Value, json};

use crate::api::Api;
use crate::auth::{ModelAccess, machine_id};
use crate::facade::upgrader::server_version;
use crate::session::Session;
use crate::state::Provisioning;
use crate::wire::WireError;

/// `MachineManager.AddMachines {"params": [{"jobs", "base", "constraints", "placement",
/// "container-type", ...}]}` → `{"machines": [{"machine": "1"} | {"error"}]}`.
pub async fn add_machines(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.add_machines(params).await
}

/// `MachineManager.DestroyMachineWithParams {"machine-tags", "force", "keep", "dry-run",
/// "max-wait"}` → `{"results": [{"info": {"machine-id", "destroyed-units", ...}} |
/// {"error"}]}`.
pub async fn destroy_machines(api: &Api, params: &Value) -> Result<Value, WireError> {
    api.state.destroy_machines(params).await
}

/// `MachineManager.ProvisioningScript {"machine-id": "1", "nonce", "data-dir": "/path",
/// "disable-package-commands"}` → `{"script": "<sh script>"}` (Juju's
/// `ProvisioningScriptResult`), for a user with `admin` access to the model. The state
/// issues the machine's agent a fresh password and renders the script that writes its
/// `agent.conf` under `data-dir`; the transport gives it what only it knows: the address the
/// caller reached this API at, the controller's CA and this server's version.
pub async fn provisioning_script(
    api: &Api,
    session: &Session,
    params: &Value,
) -> Result<Value, WireError> {
    if session.model_access() < ModelAccess::Admin {
        return Err(WireError::permission_denied());
    }
    let bad = |message: String| WireError::new("bad request", message);
    let text = |key: &str| -> Result<String, WireError> {
        match params.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(bad(format!("{key} must be a string"))),
        }
    };
    let machine = text("machine-id")?;
    let tag = format!("machine-{}", machine.replace('/', "-"));
    if machine_id(&tag).as_deref() != Some(machine.as_str()) {
        return Err(bad(format!(
            "machine-id {:?} is not a machine id",
            machine.chars().take(64).collect::<String>()
        )));
    }
    let data_dir = text("data-dir")?;
    if !data_dir.starts_with('/')
        || data_dir.len() > DATA_DIR_BYTES_MAX
        || data_dir.chars().any(char::is_control)
    {
        return Err(bad(format!(
            "data-dir must be an absolute path of at most {DATA_DIR_BYTES_MAX} bytes without control characters"
        )));
    }
    let nonce = text("nonce")?;
    let disable_package_commands = match params.get("disable-package-commands") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(disable)) => *disable,
        Some(_) => return Err(bad("disable-package-commands must be a boolean".into())),
    };
    let api_addresses: Vec<String> = api
        .address_for(session)
        .map(|address| address.to_string())
        .into_iter()
        .collect();
    if api_addresses.is_empty() {
        return Err(WireError::new(
            "",
            "this controller does not know the address it is reached at",
        ));
    }
    let ca_pem = api.ca_pem().ok_or_else(|| {
        WireError::new(
            "",
            "this controller's certificate chain has no CA certificate",
        )
    })?;
    let request = Provisioning {
        machine_id: machine,
        nonce,
        data_dir,
        disable_package_commands,
        identity: api.identity(),
        api_addresses,
        ca_pem,
        server_version: server_version(api)?,
    };
    let script = api.state.provisioning_script(&request).await?;
    Ok(json!({"script": script}))
}

/// The longest `data-dir` accepted, in bytes.
pub const DATA_DIR_BYTES_MAX: usize = 1024;
