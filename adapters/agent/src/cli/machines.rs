//! `lockstep add-machine` with the local provider: each machine the controller records
//! (`Client.AddMachines`) gets a machine agent on this host, provisioned as Juju's manual
//! provider does it: `MachineManager.ProvisioningScript` issues the agent's credentials
//! (the controllers keep only their hash) and answers a script that writes its
//! `agent.conf`; the script runs here, the controller's current binary is installed beside
//! it, and `lockstepd` starts on that data directory (`<data-dir>/machines/machine-<id>/`).
//! `kill-controller` stops these agents too ([`DataDir::machine_agent_dirs`]).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::cli::commands::{CLIENT_VERSION, CallError, CommandError, Session, check_results};
use crate::datadir::{DataDir, DataDirError, Provisioner};
use crate::logging::say;

/// The facade version of `MachineManager` the CLI speaks.
pub const MACHINE_MANAGER_VERSION: u32 = 10;

/// Why a machine could not be given its agent.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error(
        "{} holds no controller (no agent.conf): add-machine starts machine agents with the \
         local provider, on the controller's host; pass its --data-dir",
        data_dir.display()
    )]
    NoController { data_dir: PathBuf },
    /// The reply is not shown: a script in it would hold the agent's password.
    #[error("MachineManager.ProvisioningScript for machine {id} answered no script")]
    NoScript { id: String },
    #[error("the provisioning script of machine {id} ran but wrote no {}", path.display())]
    NoAgentConf { id: String, path: PathBuf },
    #[error("the provisioning script of machine {id} failed ({status}): {stderr}")]
    Script {
        id: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("cannot run sh for machine {id}'s provisioning script: {error}")]
    Shell {
        id: String,
        #[source]
        error: std::io::Error,
    },
    #[error(
        "the controller's provisioner started no agent for machine(s) {} within {waited_s}s \
         (see its log: lockstepd.log, target lockstep::provisioner)",
        ids.join(", ")
    )]
    NotStarted { ids: Vec<String>, waited_s: u64 },
    #[error(transparent)]
    LocalAgent(#[from] crate::local_provider::LocalAgentError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Call(#[from] CallError),
}

/// A machine agent the local provider started.
#[derive(Debug)]
pub struct Started {
    pub id: String,
    pub data: DataDir,
    pub pid: u32,
}

/// `lockstep add-machine -n COUNT`: records the machines, then provisions an agent for each
/// on this host from the controller in `primary`.
pub async fn add_machines(
    session: &Session,
    primary: &DataDir,
    count: u32,
) -> Result<Vec<Started>, ProvisionError> {
    let controller = primary
        .read_agent_conf()?
        .ok_or_else(|| ProvisionError::NoController {
            data_dir: primary.root().to_path_buf(),
        })?;
    session.wait_ready().await?;
    let params: Vec<Value> = (0..count)
        .map(|_| json!({"jobs": ["JobHostUnits"]}))
        .collect();
    let reply = session
        .mutate(
            "Client",
            CLIENT_VERSION,
            "AddMachines",
            json!({"params": params}),
        )
        .await?;
    check_results(&reply, "add-machine")?;
    let ids: Vec<String> = reply["machines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|machine| machine["machine"].as_str().map(str::to_owned))
        .collect();
    if controller.provisioner == Provisioner::Local {
        for id in &ids {
            say(&format!("created machine {id}"));
        }
        return wait_for_provisioner(session, ids).await;
    }
    let mut started = Vec::new();
    let controllers = &session.controller.api_endpoints;
    for (index, id) in ids.into_iter().enumerate() {
        say(&format!("created machine {id}"));
        let data = primary.machine_agent_dir(&id);
        let script = provisioning_script(session, &id, data.root()).await?;
        run_script(&id, &script)?;
        // The script names the controller this command reached; with several, the local
        // provider spreads the agents over them, each agent knowing every controller (it
        // fails over in that order).
        if controllers.len() > 1 {
            let mut conf = data
                .read_agent_conf()?
                .ok_or_else(|| ProvisionError::NoAgentConf {
                    id: id.clone(),
                    path: data.agent_conf_path(),
                })?;
            let first = index % controllers.len();
            conf.apiaddresses = controllers[first..]
                .iter()
                .chain(&controllers[..first])
                .cloned()
                .collect();
            data.write_agent_conf(&conf)?;
        }
        let crate::local_provider::StartedAgent { binary, pid } =
            crate::local_provider::start(primary, &controller.tag, &data, &id)?;
        say(&format!(
            "started machine {id}'s agent: lockstepd (pid {pid}, {binary}) in {}",
            data.root().display()
        ));
        started.push(Started { id, data, pid });
    }
    Ok(started)
}

/// How often `add-machine` asks whether the controller's provisioner started the agents.
pub const PROVISIONER_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// With the controller's own provisioner (`provisioner: local`): waits until the agent of
/// every machine in `ids` has reported itself (`Client.FullStatus` shows its agent status,
/// as `lockstep status` does), saying so for each, until the command's deadline.
async fn wait_for_provisioner(
    session: &Session,
    mut ids: Vec<String>,
) -> Result<Vec<Started>, ProvisionError> {
    let started_at = std::time::Instant::now();
    while !ids.is_empty() {
        let reply = session
            .call(
                "Client",
                CLIENT_VERSION,
                "FullStatus",
                json!({"patterns": []}),
            )
            .await?;
        ids.retain(|id| {
            let agent = &reply["machines"][id.as_str()]["agent-status"];
            let status = agent["status"].as_str().unwrap_or("");
            if matches!(status, "" | "pending" | "allocating") {
                return true;
            }
            say(&format!(
                "machine {id}'s agent is {status} ({}), started by the controller's provisioner",
                agent["version"].as_str().unwrap_or("no version yet")
            ));
            false
        });
        if ids.is_empty() {
            break;
        }
        if session.left() < PROVISIONER_POLL {
            return Err(ProvisionError::NotStarted {
                ids,
                waited_s: started_at.elapsed().as_secs(),
            });
        }
        tokio::time::sleep(PROVISIONER_POLL).await;
    }
    // The agents run under whichever controller's data dir provisioned them; none is
    // this command's child.
    Ok(Vec::new())
}

/// `MachineManager.ProvisioningScript` for machine `id`, its agent's data dir `data_dir`.
async fn provisioning_script(
    session: &Session,
    id: &str,
    data_dir: &Path,
) -> Result<String, ProvisionError> {
    let nonce = format!("lockstep:{id}:{}", std::process::id());
    let reply = session
        .mutate(
            "MachineManager",
            MACHINE_MANAGER_VERSION,
            "ProvisioningScript",
            json!({
                "machine-id": id,
                "nonce": nonce,
                "data-dir": data_dir.display().to_string(),
                "disable-package-commands": true,
            }),
        )
        .await?;
    // Juju's ProvisioningScriptResult: `{"script": "..."}`.
    reply["script"]
        .as_str()
        .filter(|script| !script.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ProvisionError::NoScript { id: id.to_owned() })
}

/// Runs a provisioning script with `sh` on this host (the local provider's "machine"),
/// the script on standard input: its text holds the agent's password, so it is never
/// written to a file or put on a command line.
fn run_script(id: &str, script: &str) -> Result<(), ProvisionError> {
    use std::io::Write;
    let mut child = std::process::Command::new("sh")
        .arg("-s")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|error| ProvisionError::Shell {
            id: id.to_owned(),
            error,
        })?;
    let written = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes());
    let output = child
        .wait_with_output()
        .map_err(|error| ProvisionError::Shell {
            id: id.to_owned(),
            error,
        })?;
    if let Err(error) = written {
        return Err(ProvisionError::Shell {
            id: id.to_owned(),
            error,
        });
    }
    if !output.status.success() {
        return Err(ProvisionError::Script {
            id: id.to_owned(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(())
}
