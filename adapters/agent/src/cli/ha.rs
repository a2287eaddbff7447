//! `lockstep enable-ha`: more controllers for a controller bootstrapped on etcd, on this
//! machine, for trying highly available controllers out (Juju's `enable-ha` adds machines;
//! here the new controllers are processes beside the first).
//!
//! Controller N (machine N, `controller-id` N) gets its own data dir,
//! `<data>/ha/machine-N/`, with its own API port, binary and `agent.conf`; it shares the
//! first controller's CA, server certificate, users, metadata keys (`metadata-keys.asc`,
//! pinned again in its `agent.conf`) and etcd store. The model's controller
//! set grows to N in the same store transaction that adds the machines, so the next
//! upgrade's record waits for all of them.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use lockstep_core::lifecycle::{ControllerId, ControllerSet, Snapshot};
use lockstep_core::{Role, Roles, Version};
use lockstep_fs::AtomicWriteError;
use lockstep_store::{Machine, StoreError};

use crate::cli::bootstrap::{
    ControllerFile, ControllerFileError, WaitError, spawn_daemon, wait_until_ready,
};
use crate::datadir::{self, AgentConf, DataDir, DataDirError};
use crate::store::{StoreEngine, StoreSettings, StoreSetupError};

/// Why `enable-ha` refused or failed. Each names the flag, data dir or controller.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error(
        "-n {count}: enable-ha needs an odd number of controllers from 3 to {}",
        ControllerId::COUNT_MAX
    )]
    Count { count: u8 },
    #[error("no controller is bootstrapped in {}", data_dir.display())]
    NotBootstrapped { data_dir: PathBuf },
    #[error(
        "the controller in {} keeps its state in SQLite, which one controller owns: enable-ha \
         needs a controller bootstrapped with --store etcd --etcd-endpoints ...",
        data_dir.display()
    )]
    NotEtcd { data_dir: PathBuf },
    #[error("{store} holds no model")]
    NoModel { store: String },
    #[error("the controller already has {existing} controllers (asked for {count})")]
    AlreadyHas { existing: u8, count: u8 },
    #[error("an upgrade to {target} is in progress ({status}); run enable-ha when it has finished")]
    UpgradeInProgress {
        target: Version,
        status: &'static str,
    },
    #[error("{} has no current binary", data_dir.display())]
    NoCurrentBinary { data_dir: PathBuf },
    #[error("{} already holds controller {id}; remove it first", data_dir.display())]
    MemberExists { data_dir: PathBuf, id: u8 },
    #[error("cannot find a free port on 127.0.0.1: {0}")]
    NoFreePort(#[source] io::Error),
    #[error("{store}: {error}")]
    Store {
        store: String,
        #[source]
        error: StoreError,
    },
    #[error(transparent)]
    StoreSetup(#[from] StoreSetupError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Write(#[from] AtomicWriteError),
    #[error(transparent)]
    ControllerFile(#[from] ControllerFileError),
    #[error("controller {id}: {error}\nlast lines of its log:\n{tail}")]
    NotReady {
        id: u8,
        #[source]
        error: WaitError,
        tail: String,
    },
}

/// The data dirs of the controllers `enable-ha` added under `primary`, by id.
pub fn members(primary: &DataDir) -> Vec<(u8, DataDir)> {
    (1..ControllerId::COUNT_MAX)
        .map(|id| (id, DataDir::new(primary.ha_member_dir(id))))
        .filter(|(_, data)| data.agent_conf_path().exists())
        .collect()
}

/// What `enable-ha` started.
#[derive(Debug)]
pub struct Added {
    pub id: u8,
    pub data: DataDir,
    pub pid: u32,
    pub address: String,
}

/// Grows the controller in `primary` to `count` controllers and waits until every new one
/// is Ready. `count` is odd (a majority must survive one loss) and at most
/// [`ControllerId::COUNT_MAX`].
pub async fn enable_ha(
    primary: &DataDir,
    count: u8,
    timeout: Duration,
    mut on_line: impl FnMut(&str),
) -> Result<Vec<Added>, HaError> {
    if count < 3 || count.is_multiple_of(2) || count > ControllerId::COUNT_MAX {
        return Err(HaError::Count { count });
    }
    let conf = primary
        .read_agent_conf()?
        .ok_or_else(|| HaError::NotBootstrapped {
            data_dir: primary.root().to_path_buf(),
        })?;
    let settings = StoreSettings::of(&conf);
    if settings.engine != StoreEngine::Etcd {
        return Err(HaError::NotEtcd {
            data_dir: primary.root().to_path_buf(),
        });
    }
    let mut file = ControllerFile::read(primary)?;
    let store = crate::store::open(primary, &settings)?;
    let store_error = |error| HaError::Store {
        store: settings.describe(primary),
        error,
    };
    let model = store
        .load_model()
        .map_err(store_error)?
        .ok_or_else(|| HaError::NoModel {
            store: settings.describe(primary),
        })?;
    let existing = model.controllers.len() as u8;
    if existing >= count {
        return Err(HaError::AlreadyHas { existing, count });
    }
    if let Some(record) = store.record_view().map_err(store_error)?.current {
        return Err(HaError::UpgradeInProgress {
            target: record.0.target_version,
            status: record.0.status.as_str(),
        });
    }
    // The new controllers run what the first one runs now.
    let binary = primary
        .current_binary(&conf.tag)?
        .ok_or_else(|| HaError::NoCurrentBinary {
            data_dir: primary.root().to_path_buf(),
        })?;
    let binary_dir = primary.binary_dir(&binary);
    let forced = datadir::read_force_version(&binary_dir)?.is_some();
    let exe = binary_dir.join("lockstepd");

    let ids: Vec<u8> = (existing..count).collect();
    let mut prepared = Vec::new();
    for &id in &ids {
        let data = DataDir::new(primary.ha_member_dir(id));
        if data.agent_conf_path().exists() {
            return Err(HaError::MemberExists {
                data_dir: data.root().to_path_buf(),
                id,
            });
        }
        let port = crate::cli::bootstrap::free_port().map_err(HaError::NoFreePort)?;
        prepared.push((id, data, format!("127.0.0.1:{port}")));
    }
    let addresses: Vec<String> = file
        .api_endpoints
        .iter()
        .take(usize::from(existing))
        .cloned()
        .chain(prepared.iter().map(|(_, _, address)| address.clone()))
        .collect();

    for (id, data, address) in &prepared {
        std::fs::create_dir_all(data.tools_dir())
            .map_err(DataDirError::io(&data.tools_dir(), "create the directory"))?;
        for (from, to, mode) in [
            (primary.ca_cert_path(), data.ca_cert_path(), 0o644),
            (primary.server_cert_path(), data.server_cert_path(), 0o600),
            (primary.server_key_path(), data.server_key_path(), 0o600),
            (primary.users_path(), data.users_path(), 0o600),
        ] {
            let bytes = std::fs::read(&from).map_err(DataDirError::io(&from, "read"))?;
            lockstep_fs::write_file_atomically(&to, &bytes, mode)?;
        }
        // The metadata keys the operator pinned at bootstrap, pinned again in the new
        // controller's own agent.conf: a copy of the file, never anything from the store.
        let metadata_keyring = match &conf.metadata_keyring {
            Some(path) => {
                let from = primary.root().join(path);
                let bytes = std::fs::read(&from).map_err(DataDirError::io(&from, "read"))?;
                let to = data.metadata_keys_path();
                lockstep_fs::write_file_atomically(&to, &bytes, datadir::METADATA_KEYS_MODE)?;
                Some(to)
            }
            None => None,
        };
        // And the mirror's certificate authorities, likewise.
        let metadata_ca = match &conf.metadata_ca {
            Some(path) => {
                let from = primary.root().join(path);
                let bytes = std::fs::read(&from).map_err(DataDirError::io(&from, "read"))?;
                Some(data.write_metadata_ca(&bytes)?)
            }
            None => None,
        };
        data.install_local_binary(&binary, &exe, forced)?;
        let tag = format!("machine-{id}");
        data.switch_to(&tag, &binary)?;
        let member_file = ControllerFile {
            api_endpoints: std::iter::once(address.clone())
                .chain(addresses.iter().filter(|a| *a != address).cloned())
                .collect(),
            ..file.clone()
        };
        member_file.write(data)?;
        let mut member = AgentConf::new(&tag, Snapshot::bootstrapped(&binary));
        member.controller = conf.controller.clone();
        member.model = conf.model.clone();
        member.controller_id = *id;
        member.api_listen = address.clone();
        member.apiaddresses = addresses.clone();
        member.cacert = conf.cacert.clone();
        member.metadata_keyring = metadata_keyring;
        member.metadata_key_fingerprints = conf.metadata_key_fingerprints.clone();
        member.allow_unsigned_metadata = conf.allow_unsigned_metadata;
        member.metadata_ca = metadata_ca;
        member.allow_metadata_redirects = conf.allow_metadata_redirects;
        // Every controller runs the same provisioner: with `local`, they race for each new
        // machine and the store's claim lets exactly one start its agent.
        member.provisioner = conf.provisioner;
        settings.apply(&mut member);
        data.write_agent_conf(&member)?;
        on_line(&format!(
            "Prepared controller {id} in {} (API {address}, {binary})",
            data.root().display()
        ));
    }

    // One transaction: the machines and the larger controller set appear together.
    store
        .update_model(&mut |tx, model| {
            for &id in &ids {
                let mut machine =
                    Machine::with_roles(id.to_string(), Roles::of(&[Role::Controller]));
                machine.agent_binary = Some(binary.clone());
                if tx.machine(&machine.id)?.is_none() {
                    tx.put_machine(&machine)?;
                }
            }
            model.controllers = ControllerSet::first(count);
            Ok::<(), StoreError>(())
        })
        .map_err(store_error)?;
    on_line(&format!(
        "The model now has controllers {:?}",
        ControllerSet::first(count)
            .iter()
            .map(|ControllerId(id)| id)
            .collect::<Vec<_>>()
    ));

    let mut added = Vec::new();
    for (id, data, address) in prepared {
        let pid = spawn_daemon(&data, &[])?;
        on_line(&format!(
            "Started controller {id}: lockstepd (pid {pid}) on {address}"
        ));
        added.push(Added {
            id,
            data,
            pid,
            address,
        });
    }
    for member in &added {
        let client = ControllerFile::read(&member.data)?
            .direct_client(lockstep_core::client::RetryPolicy::default());
        wait_until_ready(&client, Some(member.pid), timeout, |_| {})
            .await
            .map_err(|error| HaError::NotReady {
                id: member.id,
                error,
                tail: crate::cli::bootstrap::log_tail(&member.data, 15),
            })?;
        on_line(&format!("Controller {} is ready", member.id));
    }
    file.api_endpoints = addresses;
    file.write(primary)?;
    Ok(added)
}
