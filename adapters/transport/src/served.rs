//! Which facades the server serves, and which a login may call: the table Login advertises,
//! `spec/wire.md` repeats and every call is checked against.

use lockstep_core::gate::{self, Login};

use crate::wire::WireError;

/// The facades served: name, versions (as advertised in Login's reply) and methods. The
/// same table is in `spec/wire.md`, and a test keeps the two equal.
pub const FACADES: &[(&str, &[u32], &[&str])] = &[
    ("Admin", &[3], &["Login", "RedirectInfo"]),
    ("Agent", &[3], &["GetEntities"]),
    ("AllWatcher", &[1, 3], &["Next", "Stop"]),
    (
        "Application",
        &[1, 20],
        &[
            "Deploy",
            "AddUnits",
            "AddRelation",
            "Expose",
            "Get",
            "Set",
            "SetConfigs",
            "UnsetApplicationsConfig",
            "DestroyApplication",
            "DestroyUnit",
        ],
    ),
    ("Charms", &[6], &["ResolveCharms"]),
    (
        "Client",
        &[1, 8],
        &[
            "FullStatus",
            "FindTools",
            "AbortCurrentUpgrade",
            "SetModelAgentVersion",
            "ModelGet",
            "ModelSet",
            "ModelUnset",
            "AddMachines",
            "WatchAll",
        ],
    ),
    (
        "Controller",
        &[11, 12],
        &["AllModels", "ControllerAPIInfoForModels"],
    ),
    (
        "MachineManager",
        &[10],
        &[
            "AddMachines",
            "DestroyMachineWithParams",
            "ProvisioningScript",
        ],
    ),
    ("Machiner", &[5], &["SetStatus"]),
    (
        "ModelConfig",
        &[3],
        &["ModelGet", "ModelSet", "ModelUnset", "GetModelConstraints"],
    ),
    (
        "ModelManager",
        &[9, 10],
        &["ModelInfo", "ListModelSummaries"],
    ),
    ("NotifyWatcher", &[1], &["Next", "Stop"]),
    ("Pinger", &[1], &["Ping"]),
    (
        "Upgrade",
        &[1],
        &["Status", "WatchProgress", "ResumeRollout", "AbortRollout"],
    ),
    (
        "Upgrader",
        &[1],
        &[
            "SetTools",
            "SetVersion",
            "DesiredVersion",
            "Tools",
            "WatchAPIVersion",
        ],
    ),
];

/// The facades an agent login may call; a user may call every facade but
/// [`AGENT_ONLY_FACADES`] (Juju's agent and client facades are apart in the same way).
/// Anything else is `permission denied`, code `unauthorized access` (Juju's `ErrPerm`).
pub const AGENT_FACADES: &[&str] = &[
    "Admin",
    "Agent",
    "Machiner",
    "NotifyWatcher",
    "Pinger",
    "Upgrade",
    "Upgrader",
];

/// The agents' own facades, which users may not call: an agent's view of itself, its
/// reports, and the watchers only agents open (`Upgrader.WatchAPIVersion`).
pub const AGENT_ONLY_FACADES: &[&str] = &["Agent", "Machiner", "NotifyWatcher", "Upgrader"];

/// `not implemented` unless the facade, version and method are served, in Juju's words
/// (`rpcreflect.CallNotImplementedError`): an unknown facade, or a known one at a version
/// not served, is `unknown version (V) of interface "F"` (`unknown object type "F"` at
/// version 0); a method not served is `no such request - method F(V).M is not
/// implemented`.
pub fn served(facade: &str, version: u32, method: &str) -> Result<(), WireError> {
    let Some((_, versions, methods)) = FACADES.iter().find(|(name, _, _)| *name == facade) else {
        return Err(WireError::new(
            "not implemented",
            if version == 0 {
                format!("unknown object type {facade:?}")
            } else {
                format!("unknown version ({version}) of interface {facade:?}")
            },
        ));
    };
    if !versions.contains(&version) {
        return Err(WireError::new(
            "not implemented",
            format!("unknown version ({version}) of interface {facade:?}"),
        ));
    }
    if methods.contains(&method) {
        Ok(())
    } else {
        Err(not_implemented(facade, version, method))
    }
}

/// Juju's answer to a method it does not have.
pub fn not_implemented(facade: &str, version: u32, method: &str) -> WireError {
    WireError::new(
        "not implemented",
        format!("no such request - method {facade}({version}).{method} is not implemented"),
    )
}

/// True when `login` may call `facade` at all (the gate decides about the phase): users
/// every facade but [`AGENT_ONLY_FACADES`], agents [`AGENT_FACADES`]. Before login the gate
/// admits `Admin` only.
pub fn permitted(login: Login, facade: &str) -> bool {
    match login {
        Login::Anonymous => true,
        Login::User => !AGENT_ONLY_FACADES.contains(&facade),
        Login::ControllerAgent | Login::MachineAgent => AGENT_FACADES.contains(&facade),
    }
}

/// The label a facade is counted under in `/metrics`: a served or allow-listed facade's
/// name, else `other`, so the label cardinality is bounded by [`FACADES`].
pub fn facade_label(facade: &str) -> &'static str {
    FACADES
        .iter()
        .map(|(name, _, _)| *name)
        .chain(gate::LIMITED_ALLOW_LIST.iter().map(|(name, _)| *name))
        .chain(gate::AGENT_REPORTS.iter().map(|(name, _)| *name))
        .find(|name| *name == facade)
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spec/wire.md's table of served facades and the code's are the same: names,
    /// versions and methods.
    #[test]
    fn the_spec_lists_the_facades_served() {
        let spec = include_str!("../../../spec/wire.md");
        let start = spec
            .find("| facade | versions | methods |")
            .expect("facade table");
        let mut rows: Vec<(String, Vec<u32>, Vec<String>)> = spec[start..]
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let versions = cells[2].split(", ").map(|v| v.parse().unwrap()).collect();
                let methods = cells[3].split(", ").map(str::to_owned).collect();
                (cells[1].to_owned(), versions, methods)
            })
            .collect();
        rows.sort();
        let code: Vec<(String, Vec<u32>, Vec<String>)> = FACADES
            .iter()
            .map(|(name, versions, methods)| {
                let methods = methods.iter().map(|method| (*method).to_owned()).collect();
                ((*name).to_owned(), versions.to_vec(), methods)
            })
            .collect();
        assert_eq!(rows, code, "FACADES is sorted by name");
    }

    #[test]
    fn agents_only_facades_are_agents_facades_and_served() {
        for facade in AGENT_ONLY_FACADES {
            assert!(AGENT_FACADES.contains(facade), "{facade}");
            assert!(FACADES.iter().any(|(name, ..)| name == facade), "{facade}");
            assert!(!permitted(Login::User, facade), "{facade}");
        }
        for facade in AGENT_FACADES {
            assert!(FACADES.iter().any(|(name, ..)| name == facade), "{facade}");
        }
    }
}
