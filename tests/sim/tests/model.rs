//! Model checks with stateright (issue 9, part 3): `always` and `sometimes` properties,
//! breadth first, under state and time caps; counterexamples replayed through the real
//! core; planted defects found here too. Prints states explored and time
//! (`cargo test -p lockstep-sim --test model -- --nocapture`).
#![allow(
    clippy::print_stdout,
    reason = "the checks report states explored and time"
)]

use std::time::Duration;

use lockstep_core::lifecycle::Mutations;
use lockstep_core::testkit::Violation;
use lockstep_sim::model::{self, HaUpgrade, WatchProtocol};

const SAFETY: &str = "I1-I9 hold (World::check)";
const UPGRADED: &str = "every controller upgraded, record complete";

#[test]
fn two_controllers_with_a_crash_and_a_lease_expiry_keep_every_invariant() {
    let ha = HaUpgrade::new("ha2-crash-expiry", 2, false, 1, 1, Mutations::default());
    let (report, ha) = model::check(ha.name, ha, 300_000, false, Duration::from_secs(40));
    println!("{report}");
    assert!(!report.found(SAFETY), "{report}");
    // Breadth first stops at the cap before the end of the upgrade: depth first shows it
    // can complete.
    let (deep, _) = model::check(
        "ha2-crash-expiry (depth first)",
        ha,
        300_000,
        true,
        Duration::from_secs(40),
    );
    println!("{deep}");
    assert!(!deep.found(SAFETY), "{deep}");
    assert!(deep.found(UPGRADED), "the upgrade can complete: {deep}");
}

#[test]
fn three_controllers_without_faults_keep_every_invariant() {
    let ha = HaUpgrade::new("ha3-no-faults", 3, true, 0, 0, Mutations::default());
    let (report, ha) = model::check(ha.name, ha, 200_000, false, Duration::from_secs(30));
    println!("{report}");
    assert!(!report.found(SAFETY), "{report}");
    let (deep, _) = model::check(
        "ha3-no-faults (depth first)",
        ha,
        200_000,
        true,
        Duration::from_secs(30),
    );
    println!("{deep}");
    assert!(!deep.found(SAFETY), "{deep}");
    assert!(deep.found(UPGRADED), "{deep}");
}

#[test]
fn an_unfenced_coordinator_is_found_and_replays_through_the_real_core() {
    let mutations = Mutations {
        unfenced_coordinator: true,
        ..Mutations::default()
    };
    let ha = HaUpgrade::new("ha2-unfenced", 2, false, 0, 1, mutations);
    let (report, ha) = model::check(ha.name, ha, 300_000, false, Duration::from_secs(40));
    println!("{report}");
    assert!(
        report.found(SAFETY),
        "the planted defect is found: {report}"
    );
    let path = model::counterexample(&ha, SAFETY, 300_000, Duration::from_secs(40))
        .expect("a counterexample");
    let violation = model::replay(&ha, &path).expect("the replay breaks the invariant too");
    assert_eq!(violation, Violation::UnfencedCoordinatorWrite, "{path:?}");
}

#[test]
fn the_gate_opened_before_the_version_check_is_found() {
    let mutations = Mutations {
        gate_before_version_check: true,
        ..Mutations::default()
    };
    let ha = HaUpgrade::new("ha1-gate", 1, false, 0, 0, mutations);
    let path = model::counterexample(&ha, SAFETY, 100_000, Duration::from_secs(20))
        .expect("a counterexample");
    let violation = model::replay(&ha, &path).expect("the replay breaks the invariant too");
    assert!(
        matches!(violation, Violation::GateOpenOutsideReady { .. }),
        "{violation:?}"
    );
}

#[test]
fn a_watcher_delivers_every_change_once_in_order_through_loss_duplicates_and_reordering() {
    let protocol = WatchProtocol {
        changes: 3,
        losses: 1,
        duplicates: 1,
        deliver_without_position: false,
    };
    let (report, _) = model::check(
        "watch-resume",
        protocol,
        2_000_000,
        false,
        Duration::from_secs(30),
    );
    println!("{report}");
    assert!(report.exhausted, "{report}");
    assert!(
        !report.found("each change delivered once, in order"),
        "{report}"
    );
    assert!(report.found("every change delivered"), "{report}");
}

#[test]
fn a_watcher_without_its_position_is_caught_delivering_twice() {
    let protocol = WatchProtocol {
        changes: 2,
        losses: 0,
        duplicates: 1,
        deliver_without_position: true,
    };
    let (report, _) = model::check(
        "watch-planted",
        protocol,
        1_000_000,
        false,
        Duration::from_secs(30),
    );
    println!("{report}");
    assert!(
        report.found("each change delivered once, in order"),
        "{report}"
    );
}
