//! `lockstepd`: the controller agent.
//!
//! `lockstepd --data-dir D` is the launcher (see `lockstep_agent::daemon::launcher`): it owns the
//! API's socket and runs the worker, `lockstepd worker`, from `D/tools/machine-0/`. Run it
//! under systemd with `Type=notify` (see `adapters/agent/lockstepd.service`), or let
//! `lockstep bootstrap` start it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lockstep_agent::daemon::api_limits::ApiLimitFlags;
use lockstep_agent::daemon::capabilities::{self, CapabilitySource};
use lockstep_agent::daemon::launcher::{self, LauncherOptions};
use lockstep_agent::daemon::worker::{self, RestartMode, WorkerOptions};
use lockstep_agent::logging::{self, LogFormat};
use lockstep_agent::notify::Notifier;
use lockstep_agent::store::{StoreEngine, StoreOverrides};
use lockstep_core::Millis;
use lockstep_core::jobs::Capabilities;
use lockstep_core::lifecycle::Limits;

/// This build's identity marker (`datadir::AGENT_IDENTITY_MARKER`: its version and OS),
/// which `lockstep bootstrap --build-agent` reads from the file without running it. Kept in
/// every build, release and stripped ones included: `#[used]`, and read at every start
/// (`main`), through `black_box` so that no optimisation can fold it away.
#[used]
static AGENT_IDENTITY: &str = lockstep_agent::datadir::AGENT_IDENTITY_MARKER;

#[derive(Parser, Debug)]
#[command(name = "lockstepd", version, about = "lockstep's controller agent")]
struct Args {
    /// The controller's data directory.
    #[arg(long, env = "LOCKSTEP_DATA_DIR", default_value_os_t = lockstep_agent::paths::default_data_dir())]
    data_dir: PathBuf,
    /// Log lines as text or JSON.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// How the worker restarts into a new binary.
    #[arg(long, value_enum, env = "LOCKSTEPD_RESTART", default_value_t = RestartMode::Exec, global = true)]
    restart: RestartMode,
    /// A worker that sends no watchdog ping for this many seconds is killed as hung.
    #[arg(long, env = "LOCKSTEPD_WATCHDOG_SEC", default_value_t = 30)]
    watchdog_sec: u64,
    /// Seconds a worker may take to stop after SIGTERM before it is killed.
    #[arg(long, default_value_t = 30)]
    stop_timeout_sec: u64,
    /// The launcher holds the clients' connections itself and relays them to the worker,
    /// so that a worker's restart (a self-upgrade, a crash) closes none of them (the
    /// default). `--front-door=false`: every worker serves the port itself, and its
    /// restart closes every connection.
    #[arg(
        long,
        env = "LOCKSTEPD_FRONT_DOOR",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "true|false"
    )]
    front_door: bool,
    /// Behind the front door, a logged-in connection with nothing in flight is leased to the
    /// worker, which serves it on the client's own socket until it stops or dies, when the
    /// launcher takes it back (the default; `spec/relay.md`, "Version 3: leases").
    /// `--front-door-lease=false`: the launcher relays every call.
    #[arg(
        long,
        env = "LOCKSTEPD_FRONT_DOOR_LEASE",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "true|false"
    )]
    front_door_lease: bool,
    /// How many threads serve the front door's connections, each connection on one thread
    /// for its whole life. Default: half the CPUs, rounded up. 0: no threads of their own;
    /// the launcher's runtime serves them, its threads sharing every connection's tasks.
    #[arg(
        long,
        env = "LOCKSTEPD_FRONT_DOOR_THREADS",
        value_parser = clap::value_parser!(u16).range(0..=1024),
        value_name = "N"
    )]
    front_door_threads: Option<u16>,
    /// Seconds a new binary may take from start to Ready before the agent falls back.
    #[arg(
        long,
        env = "LOCKSTEPD_TRIAL_READY_TIMEOUT_SEC",
        default_value_t = 600,
        global = true
    )]
    trial_ready_timeout_sec: u64,
    /// Seconds between attempts at staging (downloading and verifying) a binary.
    #[arg(
        long,
        env = "LOCKSTEPD_STAGE_RETRY_SEC",
        default_value_t = 5,
        global = true
    )]
    stage_retry_sec: u64,
    /// The environment's capabilities, overriding the interrogation of this host: the
    /// provider reports exactly this list (comma-separated; `--capabilities=` for none).
    /// Without it (or --capabilities-file) a controller interrogates its host at bootstrap
    /// and at the end of every upgrade: manage-firewall when nft or iptables is on PATH and
    /// the process has CAP_NET_ADMIN.
    #[arg(
        long,
        env = "LOCKSTEPD_CAPABILITIES",
        value_parser = capabilities::parse_override,
        value_name = "LIST",
        global = true
    )]
    capabilities: Option<Capabilities>,
    /// A file holding the capabilities (the same list), read afresh at every refresh, so
    /// that they can change between two upgrades (for tests).
    #[arg(
        long,
        env = "LOCKSTEPD_CAPABILITIES_FILE",
        value_name = "PATH",
        conflicts_with = "capabilities",
        global = true
    )]
    capabilities_file: Option<PathBuf>,
    /// The engine holding the controllers' shared state, overriding agent.conf's `store`.
    #[arg(long, value_enum, env = "LOCKSTEPD_STORE", global = true)]
    store: Option<StoreEngine>,
    /// etcd's client endpoints (comma-separated host:port), overriding agent.conf's.
    #[arg(
        long,
        env = "LOCKSTEPD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        global = true
    )]
    etcd_endpoints: Vec<String>,
    /// Accept plain http to etcd endpoints that are not loopback for this run (refused
    /// otherwise; `lockstep bootstrap --etcd-insecure` records it in agent.conf).
    #[arg(long, env = "LOCKSTEPD_ETCD_INSECURE", global = true)]
    etcd_insecure: bool,
    /// Seconds controllers wait for each other to join an upgrade before it is aborted.
    #[arg(
        long,
        env = "LOCKSTEPD_CONTROLLERS_WAIT_SEC",
        default_value_t = 900,
        global = true
    )]
    controllers_wait_sec: u64,
    /// The API's limits on connections, logins, unwritten replies and watchers.
    #[command(flatten)]
    api_limits: ApiLimitFlags,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the worker (started by the launcher; not for direct use).
    #[command(hide = true)]
    Worker,
    /// Print the version this binary reports (FORCE-VERSION included) and exit.
    Version,
}

/// The marker embedded in this executable names this build: an invariant, checked at
/// every start (a panic naming both when it breaks).
fn check_identity_marker() {
    let embedded = std::hint::black_box(AGENT_IDENTITY);
    let marked = lockstep_agent::datadir::parse_identity_marker(embedded);
    let built = lockstep_agent::steps::build_version();
    assert!(
        matches!(&marked, Ok(marked) if marked.version == built
            && marked.os == lockstep_agent::datadir::AGENT_OS),
        "the identity marker embedded in lockstepd ({embedded:?}: {marked:?}) does not name \
         this build ({built}, {})",
        lockstep_agent::datadir::AGENT_OS
    );
}

/// What this run's flags change of agent.conf's store.
fn store_overrides(args: &Args) -> StoreOverrides {
    StoreOverrides {
        engine: args.store,
        etcd_endpoints: args.etcd_endpoints.clone(),
        etcd_insecure: args.etcd_insecure,
    }
}

/// Where this run's capabilities come from: `--capabilities`, `--capabilities-file` (made
/// absolute, so that it names the same file whatever directory a worker runs in), or this
/// host interrogated.
fn capability_source(args: &Args) -> CapabilitySource {
    match (&args.capabilities, &args.capabilities_file) {
        (Some(capabilities), _) => CapabilitySource::Override(capabilities.clone()),
        (None, Some(path)) => {
            CapabilitySource::File(std::path::absolute(path).unwrap_or_else(|_| path.clone()))
        }
        (None, None) => CapabilitySource::Host,
    }
}

fn main() -> ExitCode {
    // Before any other thread runs.
    lockstep_agent::daemon::memory::return_large_allocations();
    check_identity_marker();
    // Whatever the daemon creates without an explicit mode is private to its user.
    lockstep_agent::datadir::private_umask();
    let args = Args::parse();
    logging::init(args.log_format);
    match lockstep_agent::daemon::descriptors::raise_open_files_limit() {
        Ok(raised) if raised.before != raised.after => tracing::debug!(
            target: "lockstep::agent",
            before = ?raised.before,
            after = ?raised.after,
            "raised the soft limit on open files to the hard limit"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(
            target: "lockstep::agent",
            %error,
            "cannot raise the soft limit on open files to the hard limit"
        ),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime can be built");
    let result = match args.command {
        Some(Command::Version) => worker::running_binary().map(|binary| {
            logging::say(&binary.to_string());
            0
        }),
        Some(Command::Worker) => {
            let limits = Limits {
                trial_ready_timeout: Millis(args.trial_ready_timeout_sec * 1000),
                stage_retry_delay: Millis(args.stage_retry_sec * 1000),
                controllers_wait: Millis(args.controllers_wait_sec * 1000),
                ..Limits::default()
            };
            let options = WorkerOptions {
                data_dir: args.data_dir.clone(),
                restart: args.restart,
                limits,
                capabilities: capability_source(&args),
                store: store_overrides(&args),
                api_limits: args.api_limits.limits(),
            };
            runtime.block_on(worker::run(options, Notifier::from_env()))
        }
        None => {
            let mut worker_args = vec![
                "--data-dir".to_owned(),
                args.data_dir.display().to_string(),
                "--log-format".to_owned(),
                format!("{:?}", args.log_format).to_lowercase(),
                "--restart".to_owned(),
                format!("{:?}", args.restart).to_lowercase(),
                "--trial-ready-timeout-sec".to_owned(),
                args.trial_ready_timeout_sec.to_string(),
                "--stage-retry-sec".to_owned(),
                args.stage_retry_sec.to_string(),
                "--controllers-wait-sec".to_owned(),
                args.controllers_wait_sec.to_string(),
            ];
            worker_args.extend(capability_source(&args).to_args());
            worker_args.extend(args.api_limits.to_args());
            if let Some(store) = args.store {
                worker_args.push("--store".to_owned());
                worker_args.push(format!("{store:?}").to_lowercase());
            }
            if !args.etcd_endpoints.is_empty() {
                worker_args.push("--etcd-endpoints".to_owned());
                worker_args.push(args.etcd_endpoints.join(","));
            }
            if args.etcd_insecure {
                worker_args.push("--etcd-insecure".to_owned());
            }
            runtime.block_on(launcher::run(LauncherOptions {
                data_dir: args.data_dir.clone(),
                watchdog: Duration::from_secs(args.watchdog_sec.max(1)),
                stop_timeout: Duration::from_secs(args.stop_timeout_sec),
                store: store_overrides(&args),
                worker_args,
                front_door: args.front_door.then(|| args.api_limits.limits()),
                front_door_lease: args.front_door_lease,
                front_door_threads: args.front_door_threads.map_or_else(
                    lockstep_transport::threads::ConnectionThreads::default_count,
                    usize::from,
                ),
            }))
        }
    };
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code as u8),
        Err(error) => {
            tracing::error!(target: "lockstep", %error, "lockstepd failed");
            logging::complain(&format!("lockstepd: {error}"));
            ExitCode::from(1)
        }
    }
}
