//! Bundles parse, validate with every problem at its key path, and plan deterministically;
//! the demo bundle deployed through the real facades gives a `FullStatus` reply that
//! `lockstep status` renders in every format.

use std::path::Path;

use lockstep_agent::api::{applications, status as state_status};
use lockstep_agent::cli::bundle::{Bundle, BundleChange, BundleError, NUM_UNITS_MAX};
use lockstep_agent::cli::status::{self, Format};
use lockstep_core::gate::GateView;
use lockstep_core::jobs::JobTable;
use lockstep_core::{Millis, Phase, Progress, Version};
use lockstep_store::{Durability, MemoryStore, Model, Store};
use lockstep_transport::backend::LifecycleStatus;
use lockstep_transport::facade::client::full_status_reply;
use serde_json::{Value, json};

fn demo_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bundles/demo.yaml")
}

fn problems(error: &BundleError) -> Vec<String> {
    match error {
        BundleError::Invalid { problems, .. } => {
            problems.iter().map(|problem| problem.to_string()).collect()
        }
        other => panic!("expected an invalid bundle, got: {other}"),
    }
}

// ---------------------------------------------------------------------------------------
// Bundles
// ---------------------------------------------------------------------------------------

#[test]
fn the_demo_bundle_parses_and_plans_deploys_then_exposes_then_relations() {
    let bundle = Bundle::from_file(&demo_path()).unwrap();
    let names: Vec<(&str, &str, u32, bool)> = bundle
        .applications
        .iter()
        .map(|application| {
            (
                application.name.as_str(),
                application.charm.as_str(),
                application.num_units,
                application.expose,
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("postgresql", "postgresql", 1, false),
            ("wordpress", "wordpress", 2, true),
            ("haproxy", "haproxy", 1, true),
            ("prometheus", "prometheus2", 1, false),
        ]
    );
    let deploy = |application: &str, charm: &str, num_units| BundleChange::Deploy {
        application: application.into(),
        charm: charm.into(),
        num_units,
    };
    let relate = |a: &str, b: &str| BundleChange::AddRelation {
        endpoints: [a.into(), b.into()],
    };
    let expected = vec![
        deploy("postgresql", "postgresql", 1),
        deploy("wordpress", "wordpress", 2),
        deploy("haproxy", "haproxy", 1),
        deploy("prometheus", "prometheus2", 1),
        BundleChange::Expose {
            application: "wordpress".into(),
        },
        BundleChange::Expose {
            application: "haproxy".into(),
        },
        relate("wordpress:db", "postgresql:db"),
        relate("haproxy:reverseproxy", "wordpress:website"),
        relate("prometheus:target", "haproxy"),
    ];
    assert_eq!(bundle.plan(), expected);
    // Deterministic: parsing again gives the same plan.
    let text = std::fs::read_to_string(demo_path()).unwrap();
    assert_eq!(Bundle::parse(&text).unwrap().plan(), expected);
}

#[test]
fn legacy_services_numbers_and_juju_s_ignored_keys_are_accepted() {
    let bundle = Bundle::parse(
        r#"
series: jammy
description: legacy
machines:
  "0": {series: jammy}
services:
  mysql:
    charm: cs:mysql-42
    num_units: 1
    to: [0]
    constraints: mem=4G
    options: {dataset-size: 80%}
  wiki:
    charm: cs:mediawiki
    num_units: 0
    expose: yes
    to: ["lxd:0"]
    annotations: {gui-x: 10}
  db-admin2:
    charm: local:phpmyadmin
relations:
  - [wiki, mysql]
  - - db-admin2:db
    - mysql:db
"#,
    )
    .unwrap();
    assert_eq!(bundle.applications.len(), 3);
    assert_eq!(bundle.applications[0].to, ["0"]);
    assert_eq!(bundle.applications[1].to, ["lxd:0"]);
    assert!(
        bundle.applications[1].expose,
        "YAML 1.1's yes, as goyaml reads it"
    );
    assert_eq!(
        bundle.applications[2].num_units, 0,
        "num_units defaults to 0"
    );
    assert_eq!(
        bundle.relations,
        [
            ["wiki".to_owned(), "mysql".to_owned()],
            ["db-admin2:db".to_owned(), "mysql:db".to_owned()]
        ]
    );
    // Kubernetes bundles say scale.
    let bundle =
        Bundle::parse("bundle: kubernetes\napplications:\n  a:\n    charm: a\n    scale: 3\n")
            .unwrap();
    assert_eq!(bundle.applications[0].num_units, 3);
}

#[test]
fn every_problem_is_reported_at_its_key_path() {
    let error = Bundle::parse(
        r#"
colour: blue
applications:
  My_App:
    charm: x
  web:
    charm: "  "
    num_units: 1001
    expose: maybe
    to: wrong
  db:
    charm: postgresql
    num-units: 2
  cache:
    num_units: -1
  lb:
    charm: haproxy
    num_units: 1.5
    flavour: vanilla
  app-2:
    charm: x
  ok:
    charm: ok
relations:
  - ["ok:db", "missing:db"]
  - ["ok"]
  - ["ok:Bad", "nope"]
  - ["ok", "ok:peer"]
  - ["ok:a", "lb:b"]
  - ["lb:b", "ok:a"]
  - "ok:db missing:db"
"#,
    )
    .unwrap_err();
    let found = problems(&error);
    let expected = [
        "colour: unknown top-level key \"colour\"",
        "applications.My_App: invalid application name \"My_App\"",
        "applications.web.charm: the charm is empty",
        &format!("applications.web.num_units: 1001 units is over the limit of {NUM_UNITS_MAX}"),
        "applications.web.expose: expected true or false, found a string",
        "applications.web.to: expected a list of placements",
        "applications.db.num-units: unknown key \"num-units\"; Juju spells it num_units",
        "applications.cache.num_units: expected a number of units from 0 to 1000, found the integer -1",
        "applications.cache.charm: missing: every application needs a charm",
        "applications.lb.num_units: expected a number of units from 0 to 1000, found the number 1.5",
        "applications.lb.flavour: unknown key \"flavour\"",
        "applications.app-2: invalid application name \"app-2\"",
        "relations[0][1]: \"missing:db\" refers to application \"missing\", which the bundle does not define",
        "relations[1]: expected a pair of endpoints, found a list",
        "relations[2][0]: invalid endpoint name \"Bad\" in \"ok:Bad\"",
        "relations[2][1]: \"nope\" refers to application \"nope\"",
        "relations[3]: relates application \"ok\" to itself",
        "relations[5]: relation [\"lb:b\", \"ok:a\"] is listed more than once",
        "relations[6]: expected a pair of endpoints, found the string \"ok:db missing:db\"",
    ];
    for needle in expected {
        assert!(
            found.iter().any(|problem| problem.starts_with(needle)),
            "{needle:?} not among:\n{}",
            found.join("\n")
        );
    }
    assert_eq!(found.len(), expected.len(), "{}", found.join("\n"));
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "bundle <input> is invalid ({} problems):\n  colour: ",
            expected.len()
        )),
        "{message}"
    );
}

#[test]
fn broken_yaml_and_hostile_input_are_errors_not_panics() {
    let yaml_error = |text: &str| match Bundle::parse(text) {
        Err(BundleError::Yaml { detail, .. }) => detail,
        other => panic!("expected a YAML error for {text:?}, got {other:?}"),
    };
    yaml_error("applications: [unclosed");
    let detail = yaml_error("applications:\n  a: {charm: a}\n  a: {charm: b}\n");
    assert!(detail.to_lowercase().contains("duplicate"), "{detail}");
    let laughs = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
                  g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n";
    assert!(Bundle::parse(laughs).is_err());
    yaml_error(&format!("applications:\n{}", "[".repeat(10_000)));
    let detail = yaml_error("---\napplications: {a: {charm: a}}\n---\napplications: {}\n");
    assert!(detail.contains("overlays are not supported"), "{detail}");

    let too_large = format!("description: {}\n", "x".repeat(1024 * 1024));
    assert!(matches!(
        Bundle::parse(&too_large),
        Err(BundleError::TooLarge { .. })
    ));

    for (text, needle) in [
        ("", "the bundle is empty"),
        (
            "- a\n- b\n",
            "expected a map with `applications:` at the top, found a list",
        ),
        ("relations: []\n", "no `applications:` key"),
        ("applications: {}\n", "applications: no applications"),
        (
            "applications: [a]\n",
            "applications: expected a map of application name",
        ),
        (
            "applications: {a: {charm: a}}\nservices: {b: {charm: b}}\n",
            "services: both `applications` and `services` given",
        ),
        (
            "applications:\n  a: charm\n",
            "applications.a: expected a map",
        ),
    ] {
        let found = problems(&Bundle::parse(text).unwrap_err());
        assert!(
            found.iter().any(|problem| problem.contains(needle)),
            "{needle:?} not among {found:?}"
        );
    }
}

#[test]
fn reading_a_file_names_it() {
    let temporary = tempfile::tempdir().unwrap();
    let missing = temporary.path().join("missing.yaml");
    let error = Bundle::from_file(&missing).unwrap_err();
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );
    let bad = temporary.path().join("bad.yaml");
    std::fs::write(&bad, "applications:\n  a:\n    num_units: 1\n").unwrap();
    let error = Bundle::from_file(&bad).unwrap_err();
    assert!(
        error.to_string().starts_with(&format!(
            "bundle {} is invalid (1 problem):\n  applications.a.charm: missing",
            bad.display()
        )),
        "{error}"
    );
    let large = temporary.path().join("large.yaml");
    std::fs::write(&large, vec![b'#'; 1024 * 1024 + 1]).unwrap();
    assert!(matches!(
        Bundle::from_file(&large),
        Err(BundleError::TooLarge { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Status, from the real facades
// ---------------------------------------------------------------------------------------

/// The demo bundle deployed through the API's own facades on an in-memory store, with a
/// controller machine; returns the `Client.FullStatus` reply in `phase`.
fn full_status(phase: Phase) -> Value {
    let store = MemoryStore::new(Durability::Full);
    store
        .create_model(&Model {
            uuid: "deadbeef-0000-4000-8000-000000000001".into(),
            name: "controller".into(),
            agent_version: Version::new(2, 9, 43),
            agent_stream: None,
            agent_metadata_url: None,
            policy: lockstep_core::policy::UpgradePolicy::Off,
            controllers: lockstep_core::lifecycle::ControllerSet::first(1),
            capabilities: lockstep_core::jobs::Capabilities::new(),
            capabilities_discovered: None,
            upgrade_available: Some(Version::new(2, 9, 44)),
        })
        .unwrap();
    // The controller machine as bootstrap records it: its agent runs a known binary.
    let mut controller = lockstep_store::Machine::with_roles(
        "0",
        lockstep_core::Roles::of(&[lockstep_core::Role::Controller]),
    );
    controller.agent_binary = Some(lockstep_core::Binary::parse("2.9.43-ubuntu-amd64").unwrap());
    store.add_machine(&controller).unwrap();
    let bundle = Bundle::from_file(&demo_path()).unwrap();
    for change in bundle.plan() {
        match change {
            BundleChange::Deploy {
                application,
                charm,
                num_units,
            } => applications::deploy(
                &store,
                &json!({"applications": [{"application": application, "charm-url": charm,
                                          "num-units": num_units}]}),
            ),
            BundleChange::Expose { application } => {
                applications::expose(&store, &json!({"application": application}))
            }
            BundleChange::AddRelation { endpoints } => {
                applications::add_relation(&store, &json!({"endpoints": endpoints}))
            }
        }
        .unwrap();
    }
    let lifecycle = LifecycleStatus {
        gate: GateView {
            phase,
            progress: Progress {
                done: 1,
                total: 3,
                target: Some(Version::new(2, 9, 44)),
            },
            retry_after: Millis(1000),
        },
        agent_version: "2.9.43".into(),
        upgrade_available: Some("2.9.44".into()),
    };
    let state = state_status::full_status(&store, &JobTable::lockstep()).unwrap();
    full_status_reply(state, &lifecycle, 1_700_000_000)
}

#[test]
fn status_renders_the_real_full_status_reply_as_juju_status_does() {
    let reply = full_status(Phase::RunningSteps);
    let text = status::render_tabular(&reply, Some("lockstep")).unwrap();
    let lines: Vec<&str> = text.lines().collect();

    // The model header: columns aligned under their titles.
    let header = lines[0];
    let row = lines[1];
    let column = |title: &str| {
        let start = header.find(title).unwrap();
        row[start..].split("  ").next().unwrap().trim().to_owned()
    };
    assert_eq!(column("Model"), "controller");
    assert_eq!(column("Controller"), "lockstep");
    assert_eq!(column("Version"), "2.9.43");
    assert_eq!(column("Phase"), "running-steps");
    assert_eq!(column("Upgrade-available"), "2.9.44");
    assert_eq!(column("Progress"), "1/3 to 2.9.44");
    assert_eq!(column("Status"), "busy");
    assert_eq!(column("Timestamp"), "22:13:20Z");
    assert!(row.ends_with("upgrade in progress: running-steps"), "{row}");

    let section = |title: &str| -> Vec<&str> {
        let start = lines
            .iter()
            .position(|line| line.starts_with(title))
            .unwrap_or_else(|| panic!("no {title} table in\n{text}"));
        lines[start..]
            .iter()
            .take_while(|line| !line.is_empty())
            .copied()
            .collect()
    };
    assert_eq!(
        section("App "),
        [
            "App         Version  Status   Scale  Charm        Exposed",
            "haproxy     -        unknown  1      haproxy      yes",
            "postgresql  -        unknown  1      postgresql   no",
            "prometheus  -        unknown  1      prometheus2  no",
            "wordpress   -        unknown  2      wordpress    yes",
        ]
    );
    // lockstep runs no charms and no unit agents: Juju's words for neither having started.
    assert_eq!(
        section("Unit ")[0],
        "Unit          Workload  Agent       Machine"
    );
    assert_eq!(section("Unit ").len(), 6);
    assert!(
        section("Unit ")
            .iter()
            .any(|line| line.starts_with("wordpress/1   unknown   allocating  ")),
        "{text}"
    );
    let machines = section("Machine ");
    assert_eq!(machines.len(), 7, "{text}");
    assert!(
        machines[1].starts_with("0        started  ") && machines[1].contains("JobManageModel"),
        "{text}"
    );
    // The release its agent reported; lockstep knows no channel.
    assert!(machines[1].contains("  ubuntu  "), "{text}");
    // A machine no agent runs on is pending.
    assert!(machines[2].starts_with("1        pending  "), "{text}");
    let relations = section("Integration provider");
    assert_eq!(relations.len(), 4, "{text}");
    assert!(
        relations
            .iter()
            .any(|line| line.starts_with("wordpress:db          postgresql:db")),
        "{text}"
    );

    // Every line is aligned without trailing spaces; the text ends with a newline.
    assert!(lines.iter().all(|line| line.trim_end() == *line), "{text}");
    assert!(text.ends_with('\n'));
    // Through `render`, the controller is not known.
    let plain = status::render(&reply, Format::Tabular).unwrap();
    assert!(
        plain.lines().nth(1).unwrap().starts_with("controller  -  "),
        "{plain}"
    );
}

#[test]
fn when_ready_there_is_no_progress_and_no_message() {
    let reply = full_status(Phase::Ready);
    let text = status::render(&reply, Format::Tabular).unwrap();
    let header = text.lines().next().unwrap();
    let row = text.lines().nth(1).unwrap();
    let at = |title: &str| {
        row[header.find(title).unwrap()..]
            .split("  ")
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(at("Phase"), "ready");
    assert_eq!(at("Progress"), "-");
    assert_eq!(at("Status"), "available");
    assert!(row.ends_with(" -"), "{row}");
}

#[test]
fn json_and_yaml_print_the_reply_itself() {
    let reply = full_status(Phase::Upgrading);
    let json_text = status::render(&reply, Format::Json).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&json_text).unwrap(), reply);
    assert!(
        json_text.contains("\n  \"applications\": {"),
        "pretty-printed"
    );
    let yaml_text = status::render(&reply, Format::Yaml).unwrap();
    let back: Value = serde_saphyr::from_str(&yaml_text).unwrap();
    assert_eq!(back, reply, "{yaml_text}");
    assert!(yaml_text.ends_with('\n'));
}
