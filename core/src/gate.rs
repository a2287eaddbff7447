//! The API gate: which calls are admitted in which phase and for which login, and the exact
//! rejection of every other call.
//!
//! The rule, pinned in `spec/wire.md` ("The gate"):
//!
//! - A connection that has not logged in yet ([`Login::Anonymous`]) may call only
//!   [`BEFORE_LOGIN_ALLOW_LIST`] (`Admin.Login`, `Admin.RedirectInfo`), in every phase.
//!   Anything else is refused as Juju refuses it: code `not implemented`, message
//!   `unknown object type "Client"` (Juju's `adminRoot.FindMethod` in `apiserver/root.go`
//!   serves only the `Admin` facade before login and answers any other facade with
//!   `rpcreflect.CallNotImplementedError`; the message is that error's version-less form, since
//!   facade versions are the server's business, not the gate's).
//! - In [`Phase::Ready`] every call of a logged-in user or agent is admitted. Whether the
//!   facade and method exist is the server's business.
//! - In every other phase (limited), users and controller agents are admitted to
//!   [`LIMITED_ALLOW_LIST`] only; every other call is refused with message and code
//!   [`UPGRADE_IN_PROGRESS`] and a [`RejectionDetail`] for `error-info`. The list is Juju's
//!   `allowedMethodsDuringUpgrades` (`apiserver/restrict_upgrades.go`: `Client.FullStatus`,
//!   `Client.FindTools`, `Client.AbortCurrentUpgrade`, `Pinger.Ping`), without Juju's
//!   `SSHClient` calls (lockstep has no SSH facade), with lockstep's `Upgrade.Status` and
//!   `Upgrade.WatchProgress`, and with every read-only call lockstep serves (model and
//!   controller information, config reads, the all-watcher). Where Juju refuses reads during
//!   upgrades, lockstep serves them: its steps commit atomically, so a read never sees half a
//!   step. No call that changes the model is admitted before Ready ([`LIMITED_WRITES`] is
//!   the abort of the upgrade itself).
//! - In limited phases a non-controller agent ([`Login::MachineAgent`]) is refused outright,
//!   as Juju's `restrictRootDuringMaintenance` (`apiserver/admin.go`) refuses agent logins:
//!   `login for machine 1 blocked because upgrade is in progress`, here with code
//!   [`UPGRADE_IN_PROGRESS`] and the same detail. Controller agents log in (Juju's
//!   `TestControllerMachineLoginDuringMaintenance`) and get the limited list.
//! - An agent's report on itself ([`AGENT_REPORTS`]: `Machiner.SetStatus`) is admitted to
//!   every logged-in agent, controller or machine, in every phase (held between two
//!   workers). Juju restricts users only during an upgrade: its controller agents keep the
//!   whole API, and a machine agent is refused at login; lockstep gates per call, so a
//!   machine agent that logged in while Ready still holds its connection when the phase
//!   changes, and its status reports must not turn into `upgrade in progress` (FullStatus
//!   would show it `down` for the whole upgrade).
//!
//! - Between two workers ([`Phase::Restarting`], the launcher's view while it holds the
//!   connections and no worker serves them), [`between_workers`] decides: the launcher
//!   answers `Pinger.Ping` itself, holds logins and reads for the next worker, and refuses
//!   every call that changes state with [`UPGRADE_IN_PROGRESS`] (the one limited write, the
//!   abort of an upgrade, included: no worker is there to apply it).
//!
//! Where lockstep differs from Juju: Juju decides the restriction once, at login, for the life
//! of the connection; [`admit`] is called on every request and reads the current
//! [`GateView`], so a connection opened early gets the full API the moment the phase is
//! Ready. Names are matched exactly and case-sensitively, as Juju's RPC matches them.
//!
//! [`admit`] never allocates when it admits a call: the server calls it on every request.
//! Only a rejection allocates (its message).

use std::borrow::Cow;
use std::fmt;

use crate::phase::{Phase, Progress};
use crate::time::Millis;
use crate::version::Version;

/// The message and the code of the limited-phase rejection: Juju's `CodeUpgradeInProgress`.
///
/// python-jujuclient retries only when the message contains exactly this lowercase
/// substring; python-libjuju compares the code. Never reword it.
pub const UPGRADE_IN_PROGRESS: &str = "upgrade in progress";

/// The code of a call made before login: Juju's `CodeNotImplemented`, which Juju answers for
/// any facade but `Admin` on a connection that has not logged in.
pub const NOT_IMPLEMENTED: &str = "not implemented";

/// Calls admitted to logged-in users and controller agents in every phase, as
/// `(facade, method)`. Pinned in `spec/wire.md`; a test proves the two agree.
///
/// Two kinds: Juju's `allowedMethodsDuringUpgrades` and lockstep's `Upgrade` facade (the
/// calls that watch or steer the upgrade itself), and every call that only reads. Reads are
/// safe in every phase because every database step commits atomically: a read sees one
/// revision, before or after a step, never half of one. So a client that never retries
/// (python-libjuju) connects, reads status and watches through an upgrade, and only calls
/// that change the model wait for Ready. Of the calls listed, [`LIMITED_WRITES`] are the only
/// ones that change state; every other one is a read, which the agent's tests check call by
/// call against a real store (its revision does not move).
pub const LIMITED_ALLOW_LIST: &[(&str, &str)] = &[
    // Logging in, and Juju's calls during upgrades.
    ("Admin", "Login"),
    ("Admin", "RedirectInfo"),
    ("Pinger", "Ping"),
    ("Client", "FullStatus"),
    ("Client", "FindTools"),
    ("Client", "AbortCurrentUpgrade"),
    ("Upgrade", "WatchProgress"),
    ("Upgrade", "Status"),
    // Reads: model and controller information, config, charms resolved, the all-watcher.
    ("Client", "ModelGet"),
    ("Client", "WatchAll"),
    ("AllWatcher", "Next"),
    ("AllWatcher", "Stop"),
    ("ModelConfig", "ModelGet"),
    ("ModelConfig", "GetModelConstraints"),
    ("ModelManager", "ModelInfo"),
    ("ModelManager", "ListModelSummaries"),
    ("Controller", "AllModels"),
    ("Controller", "ControllerAPIInfoForModels"),
    ("Charms", "ResolveCharms"),
    ("Application", "Get"),
];

/// The calls of [`LIMITED_ALLOW_LIST`] that change state: the operator's abort of the
/// upgrade itself (Juju's `Client.AbortCurrentUpgrade`, which Juju also serves during
/// upgrades). No call that changes the model is admitted before Ready.
pub const LIMITED_WRITES: &[(&str, &str)] = &[("Client", "AbortCurrentUpgrade")];

/// Calls by which a logged-in agent reports on itself, admitted to every agent (controller
/// or machine) in every phase, and held between two workers for the next one. Each report
/// replaces the previous one (the last write wins), so sending it again changes nothing
/// more: holding it, or replaying it on the next worker, is harmless. Users are not admitted
/// to them by this list (they are refused as any other call; the server refuses them agent
/// facades anyway). Pinned in `spec/wire.md` ("The gate").
pub const AGENT_REPORTS: &[(&str, &str)] = &[("Machiner", "SetStatus")];

/// Calls admitted to a connection that has not logged in yet, in every phase. Every entry is
/// also in [`LIMITED_ALLOW_LIST`].
pub const BEFORE_LOGIN_ALLOW_LIST: &[(&str, &str)] =
    &[("Admin", "Login"), ("Admin", "RedirectInfo")];

/// The longest facade or method name a rejection message quotes in full; longer names (which
/// no real facade has) are cut, so a hostile request cannot make a rejection arbitrarily big.
pub const NAME_LENGTH_MAX: usize = 128;

/// Who is calling on a connection. Serialized as [`Login::as_str`] names (the relay carries
/// a connection's login from one worker to the next: `spec/relay.md`).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Login {
    /// Not logged in yet: only `Admin.Login` and `Admin.RedirectInfo` are served.
    Anonymous,
    /// A user (`user-admin`): the CLI, python-jujuclient, python-libjuju, our client.
    User,
    /// The agent of a controller machine.
    ControllerAgent,
    /// The agent of any other machine; refused while the controller is not Ready.
    MachineAgent,
}

impl Login {
    /// Every login, anonymous first.
    pub const ALL: [Login; 4] = [
        Login::Anonymous,
        Login::User,
        Login::ControllerAgent,
        Login::MachineAgent,
    ];

    /// The log name: `anonymous`, `user`, `controller-agent`, `machine-agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Login::Anonymous => "anonymous",
            Login::User => "user",
            Login::ControllerAgent => "controller-agent",
            Login::MachineAgent => "machine-agent",
        }
    }
}

impl fmt::Display for Login {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the lifecycle exposes to the gate; the server reads it afresh for every call.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct GateView {
    /// The agent's current phase: Ready opens the full API, every other phase is limited.
    pub phase: Phase,
    /// How far the phase has got, reported in the rejection detail.
    pub progress: Progress,
    /// How long a rejected client should wait before retrying.
    pub retry_after: Millis,
}

impl GateView {
    /// True in every phase but Ready.
    pub fn is_limited(&self) -> bool {
        !self.phase.is_ready()
    }
}

/// A refused call: what the server puts in the reply's `error`, `error-code` and
/// `error-info`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rejection {
    /// The reply's `error-code`: [`UPGRADE_IN_PROGRESS`] or [`NOT_IMPLEMENTED`].
    pub code: &'static str,
    /// The reply's `error`, verbatim. [`fmt::Display`] adds the detail for logs; the wire
    /// carries only this.
    pub message: Cow<'static, str>,
    /// The reply's `error-info`; present on every phase rejection, absent before login.
    pub detail: Option<RejectionDetail>,
}

/// The `error-info` object of a phase rejection (kebab-case keys; schema and example in
/// `spec/wire.md`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RejectionDetail {
    /// The agent's phase when it refused the call.
    pub phase: Phase,
    /// Steps (or, while upgrading, stages) completed so far.
    pub step: u32,
    /// Steps (or stages) planned in all; 0 when not known yet.
    pub steps: u32,
    /// The version the agent is moving to, once known (`null` until then).
    #[serde(rename = "target-version")]
    pub target: Option<Version>,
    /// How long to wait before retrying, in milliseconds.
    pub retry_after_ms: u64,
}

impl RejectionDetail {
    /// The detail of a rejection made while the lifecycle shows `view`.
    pub fn from_view(view: &GateView) -> RejectionDetail {
        let Progress {
            done,
            total,
            target,
        } = view.progress;
        assert!(
            total == 0 || done <= total,
            "progress {done} of {total} in phase {}: done exceeds total",
            view.phase
        );
        RejectionDetail {
            phase: view.phase,
            step: done,
            steps: total,
            target,
            retry_after_ms: view.retry_after.0,
        }
    }
}

impl Rejection {
    /// The limited-phase rejection: message and code `upgrade in progress`, with detail.
    pub fn upgrade_in_progress(view: &GateView) -> Rejection {
        Rejection {
            code: UPGRADE_IN_PROGRESS,
            message: Cow::Borrowed(UPGRADE_IN_PROGRESS),
            detail: Some(RejectionDetail::from_view(view)),
        }
    }

    /// A refused agent login, in Juju's words: `login for <who> blocked because upgrade is in
    /// progress`, where `who` is Juju's readable tag (`machine 1`).
    pub fn login_blocked(view: &GateView, who: &str) -> Rejection {
        Rejection {
            code: UPGRADE_IN_PROGRESS,
            message: Cow::Owned(format!(
                "login for {} blocked because upgrade is in progress",
                cut(who)
            )),
            detail: Some(RejectionDetail::from_view(view)),
        }
    }

    /// A call made before login, in Juju's words: `unknown object type "Client"` for a facade
    /// other than `Admin`, `no such request - method Admin.X is not implemented` otherwise.
    pub fn not_logged_in(facade: &str, method: &str) -> Rejection {
        let message = if facade == "Admin" {
            format!(
                "no such request - method Admin.{} is not implemented",
                cut(method)
            )
        } else {
            format!("unknown object type {:?}", cut(facade))
        };
        Rejection {
            code: NOT_IMPLEMENTED,
            message: Cow::Owned(message),
            detail: None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if self.code != self.message {
            write!(f, " (code {:?})", self.code)?;
        }
        match &self.detail {
            Some(detail) => {
                write!(f, ": the agent is in phase {}", detail.phase)?;
                if detail.steps > 0 {
                    write!(f, ", step {} of {}", detail.step, detail.steps)?;
                }
                if let Some(target) = &detail.target {
                    write!(f, ", moving to {target}")?;
                }
                write!(
                    f,
                    "; retry after {}ms, or wait for Ready with Upgrade.WatchProgress",
                    detail.retry_after_ms
                )
            }
            None => f.write_str(": not logged in; call Admin.Login first"),
        }
    }
}

impl std::error::Error for Rejection {}

/// Decides whether `login` may call `facade.method` now. Called by the server on every
/// request, before it looks the facade up; never allocates when it admits.
pub fn admit(view: &GateView, login: Login, facade: &str, method: &str) -> Result<(), Rejection> {
    let outcome = decide(view, login, facade, method);
    if let Err(rejection) = &outcome {
        tracing::debug!(
            phase = view.phase.as_str(),
            login = login.as_str(),
            facade = cut(facade),
            method = cut(method),
            code = rejection.code,
            "gate rejected call"
        );
    }
    outcome
}

/// Decides whether an authenticated `Admin.Login` may make `login` the connection's login
/// now; `tag` is the login's auth tag (`machine-1`), named in the refusal as Juju names it
/// (`login for machine 1 blocked because upgrade is in progress`).
///
/// Agrees with [`admit`] of `Admin.Login` for the same login; only the message names the tag.
pub fn admit_login(view: &GateView, login: Login, tag: &str) -> Result<(), Rejection> {
    assert!(
        login != Login::Anonymous,
        "admit_login({tag:?}): an authenticated login is never anonymous; use admit for calls \
         before login"
    );
    if login == Login::MachineAgent && view.is_limited() {
        let rejection = Rejection::login_blocked(view, &readable_tag(tag));
        tracing::debug!(
            phase = view.phase.as_str(),
            login = login.as_str(),
            tag = cut(tag),
            code = rejection.code,
            "gate refused login"
        );
        return Err(rejection);
    }
    Ok(())
}

/// What the launcher does with a call that reaches it while no worker serves the connection
/// (the view's phase is [`Phase::Restarting`]); the rule of `spec/wire.md`, "Between two
/// workers".
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum BetweenWorkers {
    /// Answered by the launcher itself: `Pinger.Ping` of a logged-in connection, so that a
    /// client's keep-alive never waits on a restart.
    Answer,
    /// Held until the next worker takes the connection over: logins and reads, which change
    /// nothing and so cannot be half-done. The launcher bounds the wait; past it, the call
    /// is refused with [`Rejection::upgrade_in_progress`] of the same view, which every Juju
    /// client retries.
    Wait,
    /// Refused now: a call that changes state (it is not forwarded to a worker that may be
    /// gone, and a refused call was never applied, so the client's retry is safe), or one
    /// the connection may not make at all.
    Refuse(Rejection),
}

/// Decides what happens to `login`'s call of `facade.method` while no worker serves the
/// connection; `view` is the launcher's, its phase [`Phase::Restarting`] and its progress
/// the last the worker published. [`admit`] of the same view agrees: it admits exactly
/// what this answers or holds.
///
/// A call a worker already received when it died is not this function's business: the
/// launcher replays it on the next worker under the operation-id it stamped on it.
pub fn between_workers(
    view: &GateView,
    login: Login,
    facade: &str,
    method: &str,
) -> BetweenWorkers {
    assert!(
        view.phase == Phase::Restarting,
        "between_workers({facade}.{method}) with phase {}: only the launcher's view between \
         two workers is restarting",
        view.phase
    );
    match login {
        Login::Anonymous if allowed_before_login(facade, method) => BetweenWorkers::Wait,
        Login::Anonymous => BetweenWorkers::Refuse(Rejection::not_logged_in(facade, method)),
        _ if (facade, method) == ("Pinger", "Ping") => BetweenWorkers::Answer,
        Login::ControllerAgent | Login::MachineAgent if agent_report(facade, method) => {
            BetweenWorkers::Wait
        }
        Login::User | Login::ControllerAgent if read_only(facade, method) => BetweenWorkers::Wait,
        Login::User | Login::ControllerAgent => {
            BetweenWorkers::Refuse(Rejection::upgrade_in_progress(view))
        }
        Login::MachineAgent if (facade, method) == ("Admin", "Login") => {
            BetweenWorkers::Refuse(Rejection::login_blocked(view, "machine agent"))
        }
        Login::MachineAgent => BetweenWorkers::Refuse(Rejection::upgrade_in_progress(view)),
    }
}

/// True when `facade.method` is served to logged-in users and controller agents in limited
/// phases.
pub fn allowed_when_limited(facade: &str, method: &str) -> bool {
    listed(LIMITED_ALLOW_LIST, facade, method)
}

/// True when `facade.method` is served in limited phases and only reads: on
/// [`LIMITED_ALLOW_LIST`] and not among [`LIMITED_WRITES`].
pub fn read_only(facade: &str, method: &str) -> bool {
    allowed_when_limited(facade, method) && !listed(LIMITED_WRITES, facade, method)
}

/// True when `facade.method` is an agent's report on itself ([`AGENT_REPORTS`]), admitted
/// to logged-in agents in every phase.
pub fn agent_report(facade: &str, method: &str) -> bool {
    listed(AGENT_REPORTS, facade, method)
}

/// True when `facade.method` is served to a connection that has not logged in yet.
pub fn allowed_before_login(facade: &str, method: &str) -> bool {
    listed(BEFORE_LOGIN_ALLOW_LIST, facade, method)
}

fn decide(view: &GateView, login: Login, facade: &str, method: &str) -> Result<(), Rejection> {
    match login {
        Login::Anonymous if allowed_before_login(facade, method) => Ok(()),
        Login::Anonymous => Err(Rejection::not_logged_in(facade, method)),
        _ if view.phase == Phase::Restarting => {
            match between_workers(view, login, facade, method) {
                BetweenWorkers::Answer | BetweenWorkers::Wait => Ok(()),
                BetweenWorkers::Refuse(rejection) => Err(rejection),
            }
        }
        _ if view.phase.is_ready() => Ok(()),
        Login::ControllerAgent | Login::MachineAgent if agent_report(facade, method) => Ok(()),
        Login::User | Login::ControllerAgent if allowed_when_limited(facade, method) => Ok(()),
        Login::User | Login::ControllerAgent => Err(Rejection::upgrade_in_progress(view)),
        Login::MachineAgent if (facade, method) == ("Admin", "Login") => {
            Err(Rejection::login_blocked(view, "machine agent"))
        }
        Login::MachineAgent => Err(Rejection::upgrade_in_progress(view)),
    }
}

fn listed(list: &[(&str, &str)], facade: &str, method: &str) -> bool {
    list.iter()
        .any(|&(listed_facade, listed_method)| listed_facade == facade && listed_method == method)
}

/// Juju's `names.ReadableString`: kind, a space, then the id (`machine-0-lxd-1` →
/// `machine 0/lxd/1`, `unit-mysql-0` → `unit mysql/0`). A string that is not a tag is
/// returned as given.
fn readable_tag(tag: &str) -> String {
    let Some((kind, id)) = tag.split_once('-') else {
        return tag.to_owned();
    };
    match kind {
        "machine" => format!("machine {}", id.replace('-', "/")),
        "unit" => match id.rsplit_once('-') {
            Some((application, number)) => format!("unit {application}/{number}"),
            None => format!("unit {id}"),
        },
        _ => format!("{kind} {id}"),
    }
}

/// `name`, cut to at most [`NAME_LENGTH_MAX`] bytes on a character boundary.
fn cut(name: &str) -> &str {
    if name.len() <= NAME_LENGTH_MAX {
        return name;
    }
    let mut end = NAME_LENGTH_MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const SPEC: &str = include_str!("../../spec/wire.md");

    fn version(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn view(phase: Phase) -> GateView {
        GateView {
            phase,
            progress: Progress {
                done: 2,
                total: 5,
                target: Some(version("2.9.43")),
            },
            retry_after: Millis(1500),
        }
    }

    /// The outcome a call must have; written out by hand, not computed from the code.
    #[derive(Clone, Copy, Debug)]
    enum Expect {
        Admitted,
        /// `upgrade in progress`, with detail.
        Upgrade,
        /// `login for machine agent blocked because upgrade is in progress`, with detail.
        Blocked,
        /// Code `not implemented`, this message, no detail.
        NotLoggedIn(&'static str),
    }
    use Expect::{Admitted, Blocked, NotLoggedIn, Upgrade};

    /// Per call: what an anonymous connection gets (every phase), then what a user, a
    /// controller agent and a machine agent get in a limited phase.
    #[rustfmt::skip]
    const MATRIX: &[(&str, &str, Expect, Expect, Expect, Expect)] = &[
        ("Admin", "Login", Admitted, Admitted, Admitted, Blocked),
        ("Admin", "RedirectInfo", Admitted, Admitted, Admitted, Upgrade),
        ("Pinger", "Ping", NotLoggedIn(r#"unknown object type "Pinger""#), Admitted, Admitted, Upgrade),
        ("Client", "FullStatus", NotLoggedIn(r#"unknown object type "Client""#), Admitted, Admitted, Upgrade),
        ("Client", "FindTools", NotLoggedIn(r#"unknown object type "Client""#), Admitted, Admitted, Upgrade),
        ("Client", "AbortCurrentUpgrade", NotLoggedIn(r#"unknown object type "Client""#), Admitted, Admitted, Upgrade),
        ("Upgrade", "WatchProgress", NotLoggedIn(r#"unknown object type "Upgrade""#), Admitted, Admitted, Upgrade),
        ("Upgrade", "Status", NotLoggedIn(r#"unknown object type "Upgrade""#), Admitted, Admitted, Upgrade),
        ("Application", "Deploy", NotLoggedIn(r#"unknown object type "Application""#), Upgrade, Upgrade, Upgrade),
        ("Client", "WatchAll", NotLoggedIn(r#"unknown object type "Client""#), Admitted, Admitted, Upgrade),
        ("AllWatcher", "Next", NotLoggedIn(r#"unknown object type "AllWatcher""#), Admitted, Admitted, Upgrade),
        ("ModelManager", "ModelInfo", NotLoggedIn(r#"unknown object type "ModelManager""#), Admitted, Admitted, Upgrade),
        ("Application", "Get", NotLoggedIn(r#"unknown object type "Application""#), Admitted, Admitted, Upgrade),
        ("Client", "ModelGet", NotLoggedIn(r#"unknown object type "Client""#), Admitted, Admitted, Upgrade),
        ("AllWatcher", "Stop", NotLoggedIn(r#"unknown object type "AllWatcher""#), Admitted, Admitted, Upgrade),
        ("ModelConfig", "ModelGet", NotLoggedIn(r#"unknown object type "ModelConfig""#), Admitted, Admitted, Upgrade),
        ("ModelConfig", "GetModelConstraints", NotLoggedIn(r#"unknown object type "ModelConfig""#), Admitted, Admitted, Upgrade),
        ("ModelManager", "ListModelSummaries", NotLoggedIn(r#"unknown object type "ModelManager""#), Admitted, Admitted, Upgrade),
        ("Controller", "AllModels", NotLoggedIn(r#"unknown object type "Controller""#), Admitted, Admitted, Upgrade),
        ("Controller", "ControllerAPIInfoForModels", NotLoggedIn(r#"unknown object type "Controller""#), Admitted, Admitted, Upgrade),
        ("Charms", "ResolveCharms", NotLoggedIn(r#"unknown object type "Charms""#), Admitted, Admitted, Upgrade),
        ("Client", "AddMachines", NotLoggedIn(r#"unknown object type "Client""#), Upgrade, Upgrade, Upgrade),
        ("Client", "ModelSet", NotLoggedIn(r#"unknown object type "Client""#), Upgrade, Upgrade, Upgrade),
        ("Charms", "AddCharm", NotLoggedIn(r#"unknown object type "Charms""#), Upgrade, Upgrade, Upgrade),
        ("ModelConfig", "ModelSet", NotLoggedIn(r#"unknown object type "ModelConfig""#), Upgrade, Upgrade, Upgrade),
        ("Upgrader", "DesiredVersion", NotLoggedIn(r#"unknown object type "Upgrader""#), Upgrade, Upgrade, Upgrade),
        ("Machiner", "SetStatus", NotLoggedIn(r#"unknown object type "Machiner""#), Upgrade, Admitted, Admitted),
        ("Machiner", "Life", NotLoggedIn(r#"unknown object type "Machiner""#), Upgrade, Upgrade, Upgrade),
        ("client", "fullstatus", NotLoggedIn(r#"unknown object type "client""#), Upgrade, Upgrade, Upgrade),
        ("Client", "fullStatus", NotLoggedIn(r#"unknown object type "Client""#), Upgrade, Upgrade, Upgrade),
        ("admin", "login", NotLoggedIn(r#"unknown object type "admin""#), Upgrade, Upgrade, Upgrade),
        ("Admin", "Logout", NotLoggedIn("no such request - method Admin.Logout is not implemented"), Upgrade, Upgrade, Upgrade),
        ("Admin", "login", NotLoggedIn("no such request - method Admin.login is not implemented"), Upgrade, Upgrade, Upgrade),
        ("", "", NotLoggedIn(r#"unknown object type """#), Upgrade, Upgrade, Upgrade),
    ];

    fn check(phase: Phase, login: Login, facade: &str, method: &str, expect: Expect) {
        let context = format!("{phase} {login} {facade}.{method}");
        let outcome = admit(&view(phase), login, facade, method);
        let detail = Some(RejectionDetail {
            phase,
            step: 2,
            steps: 5,
            target: Some(version("2.9.43")),
            retry_after_ms: 1500,
        });
        let expected = match expect {
            Admitted => Ok(()),
            Upgrade => Err(Rejection {
                code: "upgrade in progress",
                message: Cow::Borrowed("upgrade in progress"),
                detail,
            }),
            Blocked => Err(Rejection {
                code: "upgrade in progress",
                message: Cow::Borrowed(
                    "login for machine agent blocked because upgrade is in progress",
                ),
                detail,
            }),
            NotLoggedIn(message) => Err(Rejection {
                code: "not implemented",
                message: Cow::Borrowed(message),
                detail: None,
            }),
        };
        assert_eq!(outcome, expected, "{context}");
    }

    #[test]
    fn admits_exactly_the_matrix_in_every_phase() {
        let mut checked = 0;
        for phase in Phase::ALL {
            for &(facade, method, anonymous, user, controller, machine) in MATRIX {
                let (user, controller, machine) = match (phase, facade, method) {
                    (Phase::Ready, _, _) => (Admitted, Admitted, Admitted),
                    // Between two workers: no worker is there to abort an upgrade, and the
                    // launcher answers every logged-in connection's ping itself.
                    (Phase::Restarting, "Client", "AbortCurrentUpgrade") => {
                        (Upgrade, Upgrade, machine)
                    }
                    (Phase::Restarting, "Pinger", "Ping") => (user, controller, Admitted),
                    _ => (user, controller, machine),
                };
                check(phase, Login::Anonymous, facade, method, anonymous);
                check(phase, Login::User, facade, method, user);
                check(phase, Login::ControllerAgent, facade, method, controller);
                check(phase, Login::MachineAgent, facade, method, machine);
                checked += 4;
            }
        }
        assert_eq!(checked, Phase::ALL.len() * MATRIX.len() * Login::ALL.len());
        // The matrix covers every allow-listed call.
        for &(facade, method) in LIMITED_ALLOW_LIST.iter().chain(AGENT_REPORTS) {
            assert!(
                MATRIX.iter().any(|row| (row.0, row.1) == (facade, method)),
                "{facade}.{method} is missing from the matrix"
            );
        }
    }

    #[test]
    fn only_ready_is_full() {
        let limited: Vec<Phase> = Phase::ALL
            .into_iter()
            .filter(|phase| view(*phase).is_limited())
            .collect();
        assert_eq!(
            limited,
            [
                Phase::Bootstrapping,
                Phase::RunningSteps,
                Phase::CheckingAgentVersion,
                Phase::Upgrading,
                Phase::StepsFailed,
                Phase::UpgradeFailed,
                Phase::Restarting,
            ]
        );
    }

    #[test]
    fn between_workers_pings_are_answered_reads_held_and_writes_refused() {
        let restarting = view(Phase::Restarting);
        for &(facade, method, ..) in MATRIX {
            for login in Login::ALL {
                let context = format!("{login} {facade}.{method}");
                let decided = between_workers(&restarting, login, facade, method);
                let expected = match login {
                    Login::Anonymous if allowed_before_login(facade, method) => "wait",
                    Login::Anonymous => "refuse",
                    _ if (facade, method) == ("Pinger", "Ping") => "answer",
                    Login::ControllerAgent | Login::MachineAgent
                        if AGENT_REPORTS.contains(&(facade, method)) =>
                    {
                        "wait"
                    }
                    Login::User | Login::ControllerAgent if read_only(facade, method) => "wait",
                    _ => "refuse",
                };
                let kind = match &decided {
                    BetweenWorkers::Answer => "answer",
                    BetweenWorkers::Wait => "wait",
                    BetweenWorkers::Refuse(_) => "refuse",
                };
                assert_eq!(kind, expected, "{context}");
                // admit agrees: it admits what is answered or held, and refuses the same way.
                match (decided, admit(&restarting, login, facade, method)) {
                    (BetweenWorkers::Refuse(refused), Err(rejected)) => {
                        assert_eq!(refused, rejected, "{context}");
                    }
                    (BetweenWorkers::Answer | BetweenWorkers::Wait, Ok(())) => {}
                    (decided, admitted) => panic!("{context}: {decided:?} but {admitted:?}"),
                }
            }
        }
        // Every call that changes state is refused, retryably, with the restarting detail.
        for (facade, method) in [("Application", "Deploy"), ("Client", "AbortCurrentUpgrade")] {
            let BetweenWorkers::Refuse(rejection) =
                between_workers(&restarting, Login::User, facade, method)
            else {
                panic!("{facade}.{method} is not refused between workers");
            };
            assert_eq!(rejection.message, UPGRADE_IN_PROGRESS);
            assert_eq!(
                rejection.detail.map(|detail| detail.phase),
                Some(Phase::Restarting)
            );
        }
    }

    #[test]
    #[should_panic(expected = "only the launcher's view between two workers is restarting")]
    fn between_workers_with_a_workers_phase_is_a_bug() {
        let _ = between_workers(&view(Phase::Ready), Login::User, "Pinger", "Ping");
    }

    #[test]
    fn a_connection_becomes_full_when_the_phase_becomes_ready() {
        // The same connection (a user logged in during RunningSteps) is gated per call.
        let mut current = view(Phase::RunningSteps);
        let deploy = |view: &GateView| admit(view, Login::User, "Application", "Deploy");
        assert_eq!(deploy(&current).unwrap_err().code, UPGRADE_IN_PROGRESS);
        current.phase = Phase::Ready;
        assert_eq!(deploy(&current), Ok(()));
        current.phase = Phase::Upgrading;
        assert_eq!(deploy(&current).unwrap_err().code, UPGRADE_IN_PROGRESS);
    }

    #[test]
    fn the_detail_follows_the_view() {
        let unknown = GateView {
            phase: Phase::Bootstrapping,
            progress: Progress::default(),
            retry_after: Millis(250),
        };
        let rejection = admit(&unknown, Login::User, "Client", "AddMachines").unwrap_err();
        assert_eq!(
            rejection.detail,
            Some(RejectionDetail {
                phase: Phase::Bootstrapping,
                step: 0,
                steps: 0,
                target: None,
                retry_after_ms: 250,
            })
        );
    }

    #[test]
    fn machine_agent_logins_are_refused_naming_the_agent_as_juju_does() {
        let cases: &[(&str, &str)] = &[
            (
                "machine-1",
                "login for machine 1 blocked because upgrade is in progress",
            ),
            (
                "machine-0-lxd-1",
                "login for machine 0/lxd/1 blocked because upgrade is in progress",
            ),
            (
                "unit-mysql-0",
                "login for unit mysql/0 blocked because upgrade is in progress",
            ),
            (
                "application-mysql",
                "login for application mysql blocked because upgrade is in progress",
            ),
            (
                "nonsense",
                "login for nonsense blocked because upgrade is in progress",
            ),
        ];
        for phase in Phase::ALL {
            for &(tag, message) in cases {
                let outcome = admit_login(&view(phase), Login::MachineAgent, tag);
                if phase == Phase::Ready {
                    assert_eq!(outcome, Ok(()), "{phase} {tag}");
                    continue;
                }
                let rejection = outcome.unwrap_err();
                assert_eq!(rejection.code, "upgrade in progress", "{phase} {tag}");
                assert_eq!(rejection.message, message, "{phase} {tag}");
                assert_eq!(
                    rejection.detail,
                    Some(RejectionDetail::from_view(&view(phase)))
                );
            }
            for login in [Login::User, Login::ControllerAgent] {
                assert_eq!(admit_login(&view(phase), login, "user-admin"), Ok(()));
            }
        }
    }

    #[test]
    fn admit_login_agrees_with_admit_of_admin_login() {
        for phase in Phase::ALL {
            for login in [Login::User, Login::ControllerAgent, Login::MachineAgent] {
                let by_call = admit(&view(phase), login, "Admin", "Login");
                let by_login = admit_login(&view(phase), login, "machine-7");
                assert_eq!(by_call.is_ok(), by_login.is_ok(), "{phase} {login}");
                if let (Err(by_call), Err(by_login)) = (by_call, by_login) {
                    assert_eq!(by_call.code, by_login.code);
                    assert_eq!(by_call.detail, by_login.detail);
                    assert_eq!(
                        by_login.message,
                        "login for machine 7 blocked because upgrade is in progress"
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "never anonymous")]
    fn admit_login_refuses_an_anonymous_login() {
        let _ = admit_login(&view(Phase::Ready), Login::Anonymous, "");
    }

    #[test]
    #[should_panic(expected = "progress 6 of 5 in phase running-steps")]
    fn a_progress_past_its_total_is_a_bug() {
        let mut broken = view(Phase::RunningSteps);
        broken.progress.done = 6;
        let _ = admit(&broken, Login::User, "Application", "Deploy");
    }

    #[test]
    fn the_allow_lists_are_well_formed() {
        for (index, &(facade, method)) in LIMITED_ALLOW_LIST.iter().enumerate() {
            for name in [facade, method] {
                assert!(
                    name.starts_with(|c: char| c.is_ascii_uppercase())
                        && name.bytes().all(|b| b.is_ascii_alphanumeric()),
                    "{name:?} is not a Juju RPC name"
                );
            }
            assert!(
                !LIMITED_ALLOW_LIST[..index].contains(&(facade, method)),
                "{facade}.{method} is listed twice"
            );
        }
        for entry in BEFORE_LOGIN_ALLOW_LIST {
            assert!(
                LIMITED_ALLOW_LIST.contains(entry),
                "{entry:?} is served before login but not in limited phases"
            );
        }
        for entry in LIMITED_WRITES {
            assert!(
                LIMITED_ALLOW_LIST.contains(entry),
                "{entry:?} is a limited write but not served in limited phases"
            );
        }
        for entry in AGENT_REPORTS {
            assert!(
                !LIMITED_ALLOW_LIST.contains(entry),
                "{entry:?} is an agent's report: users are not admitted to it when limited"
            );
        }
    }

    /// The rows of the table headed `| call | admitted | kind |` in the "The gate" section
    /// of spec/wire.md, as `(facade, method, admitted, kind)`.
    fn spec_allow_list() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        let section = SPEC
            .split("\n## ")
            .find(|section| section.starts_with("The gate\n"))
            .expect("spec/wire.md has a section \"## The gate\"");
        let mut lines = section
            .lines()
            .skip_while(|line| line.trim() != "| call | admitted | kind |");
        assert!(
            lines.next().is_some(),
            "no `| call | admitted | kind |` table"
        );
        let separator = lines.next().expect("a separator row");
        assert!(separator.starts_with("|---"), "{separator:?}");
        lines
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                assert_eq!(cells.len(), 5, "row {line:?} needs three cells");
                let call = cells[1]
                    .strip_prefix('`')
                    .and_then(|call| call.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("call {:?} is not in backticks", cells[1]));
                let (facade, method) = call
                    .split_once('.')
                    .unwrap_or_else(|| panic!("call {call:?} is not Facade.Method"));
                (facade, method, cells[2], cells[3])
            })
            .collect()
    }

    #[test]
    fn the_spec_table_is_the_allow_list() {
        let expected: Vec<(&str, &str, &str, &str)> = LIMITED_ALLOW_LIST
            .iter()
            .map(|&(facade, method)| {
                let admitted = if allowed_before_login(facade, method) {
                    "before login"
                } else {
                    "limited"
                };
                let kind = if read_only(facade, method) {
                    "read"
                } else {
                    "write"
                };
                (facade, method, admitted, kind)
            })
            .collect();
        assert_eq!(spec_allow_list(), expected);
    }

    /// spec/wire.md lists the agents' reports (`AGENT_REPORTS`) in the table headed
    /// `| agent's report | admitted |` of "The gate".
    #[test]
    fn the_spec_lists_the_agents_reports() {
        let section = SPEC
            .split("\n## ")
            .find(|section| section.starts_with("The gate\n"))
            .expect("spec/wire.md has a section \"## The gate\"");
        let rows: Vec<String> = section
            .lines()
            .skip_while(|line| line.trim() != "| agent's report | admitted |")
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                line.split('|')
                    .nth(1)
                    .unwrap()
                    .trim()
                    .trim_matches('`')
                    .to_owned()
            })
            .collect();
        let expected: Vec<String> = AGENT_REPORTS
            .iter()
            .map(|(facade, method)| format!("{facade}.{method}"))
            .collect();
        assert_eq!(rows, expected);
    }

    #[test]
    fn the_spec_names_the_limited_phases_and_the_messages() {
        let limited: Vec<String> = Phase::LIFECYCLE
            .into_iter()
            .filter(|phase| !phase.is_ready())
            .map(|phase| format!("`{phase}`"))
            .collect();
        let line = format!("Limited phases: {}.", limited.join(", "));
        assert!(SPEC.contains(&line), "spec/wire.md lacks {line:?}");
        let limit = format!("Names longer than {NAME_LENGTH_MAX} bytes are cut");
        assert!(SPEC.contains(&limit), "spec/wire.md lacks {limit:?}");
        for text in [
            "`upgrade in progress`",
            "`not implemented`",
            "`unknown object type \"Client\"`",
            "`login for machine 1 blocked because upgrade is in progress`",
            "### Between two workers: `restarting`",
            "## Framing and facades",
            "## error-info",
        ] {
            assert!(SPEC.contains(text), "spec/wire.md lacks {text:?}");
        }
    }

    #[test]
    fn error_info_has_the_documented_shape() {
        let rejection = admit(
            &view(Phase::RunningSteps),
            Login::User,
            "Client",
            "AddMachines",
        )
        .unwrap_err();
        let detail = rejection.detail.unwrap();
        assert_eq!(
            serde_json::to_value(detail).unwrap(),
            json!({
                "phase": "running-steps",
                "step": 2,
                "steps": 5,
                "target-version": "2.9.43",
                "retry-after-ms": 1500,
            })
        );
        let unknown = RejectionDetail {
            phase: Phase::Bootstrapping,
            step: 0,
            steps: 0,
            target: None,
            retry_after_ms: 1000,
        };
        assert_eq!(
            serde_json::to_value(unknown).unwrap(),
            json!({
                "phase": "bootstrapping",
                "step": 0,
                "steps": 0,
                "target-version": null,
                "retry-after-ms": 1000,
            })
        );
    }

    #[test]
    fn error_info_parses_back_and_tolerates_new_keys() {
        let text = r#"{"phase": "upgrading", "step": 1, "steps": 3,
            "target-version": "1.25-beta1", "retry-after-ms": 2000, "added-later": true}"#;
        let detail: RejectionDetail = serde_json::from_str(text).unwrap();
        assert_eq!(
            detail,
            RejectionDetail {
                phase: Phase::Upgrading,
                step: 1,
                steps: 3,
                target: Some(version("1.25-beta1")),
                retry_after_ms: 2000,
            }
        );
        let error = serde_json::from_str::<RejectionDetail>(
            r#"{"phase": "upgrading", "step": 1, "steps": 3, "retry-after-ms": 2000,
                "target-version": "2.9"}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("\"2.9\""), "{error}");
    }

    #[test]
    fn the_spec_example_is_what_serde_writes() {
        let section = SPEC
            .split("\n## ")
            .find(|section| section.starts_with("error-info\n"))
            .expect("spec/wire.md has a section \"## error-info\"");
        let example = section
            .split("```json\n")
            .nth(1)
            .and_then(|rest| rest.split("\n```").next())
            .expect("a json example in \"## error-info\"");
        let reply: serde_json::Value = serde_json::from_str(example).unwrap();
        let view = GateView {
            phase: Phase::RunningSteps,
            progress: Progress {
                done: 3,
                total: 7,
                target: Some(version("2.9.43")),
            },
            retry_after: Millis(1000),
        };
        let rejection = admit(&view, Login::User, "Application", "Deploy").unwrap_err();
        assert_eq!(
            reply,
            json!({
                "request-id": 4,
                "error": rejection.message,
                "error-code": rejection.code,
                "error-info": rejection.detail,
                "response": {},
            })
        );
    }

    #[test]
    fn display_names_the_values_and_what_to_do() {
        let cases: &[(Result<(), Rejection>, &str)] = &[
            (
                admit(
                    &view(Phase::RunningSteps),
                    Login::User,
                    "Client",
                    "AddMachines",
                ),
                "upgrade in progress: the agent is in phase running-steps, step 2 of 5, \
                 moving to 2.9.43; retry after 1500ms, or wait for Ready with \
                 Upgrade.WatchProgress",
            ),
            (
                admit_login(&view(Phase::Upgrading), Login::MachineAgent, "machine-3"),
                "login for machine 3 blocked because upgrade is in progress \
                 (code \"upgrade in progress\"): the agent is in phase upgrading, step 2 of 5, \
                 moving to 2.9.43; retry after 1500ms, or wait for Ready with \
                 Upgrade.WatchProgress",
            ),
            (
                admit(
                    &view(Phase::Ready),
                    Login::Anonymous,
                    "Client",
                    "FullStatus",
                ),
                "unknown object type \"Client\" (code \"not implemented\"): not logged in; \
                 call Admin.Login first",
            ),
        ];
        for (outcome, expected) in cases {
            assert_eq!(outcome.as_ref().unwrap_err().to_string(), *expected);
        }
        let unknown = GateView {
            phase: Phase::Bootstrapping,
            progress: Progress::default(),
            retry_after: Millis(1000),
        };
        assert_eq!(
            admit(&unknown, Login::User, "Client", "AddMachines")
                .unwrap_err()
                .to_string(),
            "upgrade in progress: the agent is in phase bootstrapping; retry after 1000ms, \
             or wait for Ready with Upgrade.WatchProgress"
        );
    }

    #[test]
    fn hostile_names_are_cut_in_messages() {
        let long = "X".repeat(10_000);
        let rejection = admit(&view(Phase::Ready), Login::Anonymous, &long, "Y").unwrap_err();
        assert_eq!(
            rejection.message,
            format!("unknown object type \"{}\"", "X".repeat(NAME_LENGTH_MAX))
        );
        // A cut never splits a character: 127 ASCII bytes, then a 2-byte 'é'.
        let accented = format!("{}é", "a".repeat(NAME_LENGTH_MAX - 1));
        assert_eq!(cut(&accented), "a".repeat(NAME_LENGTH_MAX - 1));
        let rejection = admit(&view(Phase::Ready), Login::Anonymous, "Admin", &long).unwrap_err();
        assert_eq!(
            rejection.message.len(),
            "no such request - method Admin. is not implemented".len() + NAME_LENGTH_MAX
        );
    }

    fn any_phase() -> impl Strategy<Value = Phase> {
        prop::sample::select(Phase::ALL.to_vec())
    }

    fn any_login() -> impl Strategy<Value = Login> {
        prop::sample::select(Login::ALL.to_vec())
    }

    /// Names near the allow-list (real names, names with one letter's case flipped, prefixes)
    /// and arbitrary strings.
    fn any_name() -> impl Strategy<Value = String> {
        let real: Vec<String> = LIMITED_ALLOW_LIST
            .iter()
            .chain(AGENT_REPORTS)
            .flat_map(|&(facade, method)| [facade.to_owned(), method.to_owned()])
            .collect();
        let real_for_flip = real.clone();
        prop_oneof![
            prop::sample::select(real),
            (
                prop::sample::select(real_for_flip),
                any::<prop::sample::Index>()
            )
                .prop_map(|(name, index)| {
                    let at = index.index(name.len());
                    let mut bytes = name.into_bytes();
                    bytes[at] ^= 0x20; // ASCII letters: flip the case.
                    String::from_utf8(bytes).unwrap()
                }),
            ".{0,12}",
        ]
    }

    proptest! {
        #[test]
        fn admits_only_what_the_rules_allow(
            phase in any_phase(),
            login in any_login(),
            facade in any_name(),
            method in any_name(),
            retry_after_ms in 0u64..100_000,
        ) {
            let view = GateView { retry_after: Millis(retry_after_ms), ..view(phase) };
            let outcome = admit(&view, login, &facade, &method);
            let listed_limited = LIMITED_ALLOW_LIST.contains(&(facade.as_str(), method.as_str()));
            let listed_before = BEFORE_LOGIN_ALLOW_LIST.contains(&(facade.as_str(), method.as_str()));
            let report = login != Login::User
                && AGENT_REPORTS.contains(&(facade.as_str(), method.as_str()));
            let admitted = match login {
                Login::Anonymous => listed_before,
                _ if phase == Phase::Ready => true,
                _ if phase == Phase::Restarting => {
                    (facade.as_str(), method.as_str()) == ("Pinger", "Ping")
                        || (login != Login::MachineAgent && read_only(&facade, &method))
                        || report
                }
                Login::MachineAgent => report,
                Login::User | Login::ControllerAgent => listed_limited || report,
            };
            prop_assert_eq!(outcome.is_ok(), admitted);
            if let Err(rejection) = outcome {
                if login == Login::Anonymous {
                    prop_assert_eq!(rejection.code, NOT_IMPLEMENTED);
                    prop_assert_eq!(rejection.detail, None);
                } else {
                    prop_assert_eq!(rejection.code, UPGRADE_IN_PROGRESS);
                    prop_assert!(rejection.message.contains("upgrade"));
                    let detail = rejection.detail.unwrap();
                    prop_assert_eq!(detail.phase, phase);
                    prop_assert_eq!(detail.retry_after_ms, retry_after_ms);
                    // python-jujuclient retries on this exact substring.
                    if (facade.as_str(), method.as_str()) != ("Admin", "Login") {
                        prop_assert_eq!(rejection.message.as_ref(), "upgrade in progress");
                    }
                }
            }
        }
    }
}
