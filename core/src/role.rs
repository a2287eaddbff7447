//! Machine roles (seed 004): what a machine is for, stored on the machine.

use std::fmt;

/// A machine's role. A machine may have both.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs the controller: the API server and the shared store.
    Controller,
    /// Hosts units of applications.
    HostMachine,
}

impl Role {
    /// Every role, in wire order.
    pub const ALL: [Role; 2] = [Role::Controller, Role::HostMachine];

    /// The wire name: `controller`, `host-machine`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::HostMachine => "host-machine",
        }
    }

    /// Parses the wire name; `None` for anything else.
    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of roles, as a bit set: `Copy`, ordered, allocation-free.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Roles(u8);

impl Roles {
    /// No role.
    pub const NONE: Roles = Roles(0);

    /// The set of `roles`.
    pub fn of(roles: &[Role]) -> Roles {
        roles.iter().fold(Roles::NONE, |set, &role| set.with(role))
    }

    /// This set and `role`.
    pub fn with(self, role: Role) -> Roles {
        Roles(self.0 | Roles::bit(role))
    }

    /// True when `role` is in the set.
    pub fn contains(self, role: Role) -> bool {
        self.0 & Roles::bit(role) != 0
    }

    /// True when no role is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The roles in the set, in wire order.
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL
            .into_iter()
            .filter(move |&role| self.contains(role))
    }

    fn bit(role: Role) -> u8 {
        match role {
            Role::Controller => 1,
            Role::HostMachine => 2,
        }
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Roles {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Roles {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Roles, D::Error> {
        let roles = Vec::<Role>::deserialize(deserializer)?;
        Ok(Roles::of(&roles))
    }
}
