//! `lockstep`: the operator's command line, Juju's verbs and flags where they exist.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use lockstep_agent::cli::bootstrap::BootstrapOptions;
use lockstep_agent::cli::commands::{self, Session};
use lockstep_agent::cli::error::CliError;
use lockstep_agent::cli::juju_data::{JujuData, JujuDataError, Registration};
use lockstep_agent::cli::status::Format;
use lockstep_agent::logging::{self, LogFormat, complain, say};
use lockstep_agent::store::StoreEngine;
use lockstep_core::Version;
use lockstep_core::policy::Stream;

#[derive(Parser, Debug)]
#[command(
    name = "lockstep",
    version,
    about = "Bootstrap and operate a lockstep controller"
)]
struct Args {
    /// The controller's data directory.
    #[arg(long, global = true, env = "LOCKSTEP_DATA_DIR", default_value_os_t = lockstep_agent::paths::default_data_dir())]
    data_dir: PathBuf,
    /// A controller by name from Juju's client store (`$JUJU_DATA/controllers.yaml`,
    /// written by bootstrap), instead of --data-dir, for commands that talk to it.
    #[arg(short = 'c', long, global = true)]
    controller: Option<String>,
    /// Give up after this many seconds (commands wait through an upgrade until then).
    #[arg(long, global = true, default_value_t = 600)]
    timeout: u64,
    /// Log lines as text or JSON (on stderr; `RUST_LOG` filters them).
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per run; bootstrap's many flags are its size"
)]
enum Command {
    /// Start a local controller and wait until its API is fully available.
    Bootstrap {
        /// Upgrade to the newest published patch before bootstrap returns.
        #[arg(long)]
        auto_upgrade: bool,
        /// With --auto-upgrade, leave the new binary's download to the controller once it
        /// has started (as Juju's controllers do) instead of fetching it beside the first
        /// binary, at the same time; the controller then spends the download in phase
        /// `upgrading`.
        #[arg(long, requires = "auto_upgrade")]
        no_fetch_ahead: bool,
        /// Run exactly this agent version.
        #[arg(long, value_parser = Version::parse)]
        agent_version: Option<Version>,
        /// The stream to take agent binaries from (released, proposed, devel, testing).
        #[arg(long, value_parser = Stream::parse)]
        agent_stream: Option<Stream>,
        /// Use the local lockstepd binary and nothing else. Its version and arch are read
        /// from the file (its identity marker, its ELF header, a FORCE-VERSION beside it),
        /// never guessed; one built for another arch than this host's is refused.
        #[arg(long)]
        build_agent: bool,
        /// The lockstepd to install with --build-agent (default: the one beside this
        /// lockstep).
        #[arg(long, value_name = "FILE", requires = "build_agent")]
        agent_binary: Option<PathBuf>,
        /// A simplestreams mirror: a directory, file:// or http(s):// URL.
        #[arg(long)]
        metadata_source: Option<String>,
        /// The API's port on 127.0.0.1 (0: a free one).
        #[arg(long, default_value_t = 17070)]
        api_port: u16,
        /// The controller's name.
        #[arg(long, default_value = "lockstep")]
        name: String,
        /// Where the controllers' shared state lives: sqlite (in the data dir) or etcd
        /// (needed by enable-ha; a lockstep built with `--features etcd`).
        #[arg(long, value_enum, default_value_t = StoreEngine::Sqlite)]
        store: StoreEngine,
        /// etcd's client endpoints, comma-separated host:port, with `--store etcd`.
        #[arg(long, value_delimiter = ',')]
        etcd_endpoints: Vec<String>,
        /// TLS to etcd: the CA certificate (PEM) of its members; endpoints are then https.
        #[arg(long, value_name = "FILE")]
        etcd_cacert: Option<PathBuf>,
        /// TLS to etcd: this controller's client certificate (PEM), for --client-cert-auth.
        #[arg(long, value_name = "FILE", requires = "etcd_key")]
        etcd_cert: Option<PathBuf>,
        /// TLS to etcd: the client certificate's private key (PEM).
        #[arg(long, value_name = "FILE", requires = "etcd_cert")]
        etcd_key: Option<PathBuf>,
        /// etcd's user authentication: the user this controller logs in as (its role needs
        /// readwrite on the prefix lockstep/<controller-uuid>/). Recorded in agent.conf.
        #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
        etcd_user: Option<String>,
        /// The file holding --etcd-user's password (one line), mode 0600 and owned by the
        /// user running lockstep. agent.conf records its path, never the password; it is
        /// read at every start.
        #[arg(long, value_name = "FILE", requires = "etcd_user")]
        etcd_password_file: Option<PathBuf>,
        /// Accept plain http to etcd endpoints that are not loopback (refused otherwise):
        /// whoever is on the network between can then change the controllers' state.
        /// Recorded in agent.conf, warned about at every start, shown by `lockstep status`.
        #[arg(long)]
        etcd_insecure: bool,
        /// The OpenPGP public key (or keyring; armored or binary) that must sign the
        /// --metadata-source's metadata. Copied into the data dir and pinned in agent.conf:
        /// never taken from the store or the API.
        #[arg(long, value_name = "FILE")]
        metadata_key: Option<PathBuf>,
        /// Accept unsigned metadata from the --metadata-source (recorded in agent.conf,
        /// warned about at every start, shown by `lockstep status`): whoever can change
        /// the mirror, or the network to it, then chooses what the controller runs.
        #[arg(long)]
        allow_unsigned_metadata: bool,
        /// Certificate authorities (a PEM bundle) an https:// --metadata-source may chain
        /// to besides the system's (which honour SSL_CERT_FILE). Copied into the data dir
        /// and pinned in agent.conf.
        #[arg(long, value_name = "FILE")]
        metadata_ca: Option<PathBuf>,
        /// Follow an https:// --metadata-source's redirects to other hosts too (by default
        /// only to its own host; never to plain http). Recorded in agent.conf, warned about
        /// at every start, shown by `lockstep status`.
        #[arg(long)]
        allow_metadata_redirects: bool,
        /// Who starts the agents of machines the controller records: `manual` (Juju's
        /// manual provider: `lockstep add-machine` provisions the machines it adds on this
        /// host; machines other clients add wait for a provisioning script) or `local` (the
        /// controller starts an agent on its host for every machine any client adds).
        #[arg(long, value_enum, default_value = "manual")]
        provisioner: lockstep_agent::datadir::Provisioner,
    },
    /// Show the controller's phase, versions, machines, applications and units.
    Status {
        #[arg(long, default_value = "tabular")]
        format: Format,
    },
    /// Deploy a Juju bundle (applications, units, exposure, relations).
    Deploy { bundle: PathBuf },
    /// Add machines that host units, each with a machine agent started on this host (the
    /// local provider) under <data-dir>/machines/.
    AddMachine {
        #[arg(short = 'n', default_value_t = 1)]
        count: u32,
    },
    /// Stream the model's changes as JSON lines, resuming across controller restarts.
    Watch {
        /// Stop after this many deltas.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Upgrade the controller to a version, or to the newest published patch.
    UpgradeController {
        #[arg(long, value_parser = Version::parse)]
        agent_version: Option<Version>,
        #[arg(long)]
        dry_run: bool,
        /// Run a held upgrade's steps again.
        #[arg(long)]
        reset_previous_upgrade: bool,
    },
    /// Give up the upgrade in progress.
    AbortUpgrade,
    /// Upgrade the model's agents (the controllers first, then the machine agents as the
    /// model's rollout-* config stages them), or resume or abort a staged rollout.
    UpgradeModel {
        #[arg(long, value_parser = Version::parse, conflicts_with_all = ["resume", "abort"])]
        agent_version: Option<Version>,
        #[arg(long, conflicts_with_all = ["resume", "abort"])]
        dry_run: bool,
        /// Refuse the upgrade while any agent runs another version than the model's (Juju's
        /// check before every upgrade; lockstep lets agents that were down catch up
        /// instead, unless asked).
        #[arg(long, conflicts_with_all = ["resume", "abort"])]
        check_agent_versions: bool,
        /// Lift a halted rollout: the failed machine agents go again, then the rest.
        #[arg(long, conflicts_with = "abort")]
        resume: bool,
        /// Hold every machine agent that has not switched on the version it runs, and halt.
        #[arg(long)]
        abort: bool,
    },
    /// Show the model's config, or set keys: `model-config rollout-canaries=1`.
    ModelConfig {
        /// KEY=VALUE settings; none: show the config.
        settings: Vec<String>,
    },
    /// Run more controllers beside this one on this machine, sharing its etcd store
    /// (bootstrap with --store etcd); waits until they are ready.
    EnableHa {
        /// How many controllers in all (3, 5 or 7).
        #[arg(short = 'n', default_value_t = 3)]
        count: u8,
    },
    /// Stop the controller's processes.
    KillController,
    /// Simplestreams metadata for a mirror.
    Metadata {
        #[command(subcommand)]
        command: MetadataCommand,
    },
    /// Bootstrap with an upgrade while a deployer and a watcher run, in a temporary
    /// directory; prints a timeline and checks that nothing was lost or applied twice.
    Demo {
        /// Keep the temporary directory for inspection.
        #[arg(long)]
        keep: bool,
        /// Also draw the run as an SVG swimlane (phases and versions over time), as
        /// lockstep-sim --timeline draws a simulated one.
        #[arg(long, value_name = "FILE")]
        timeline: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum MetadataCommand {
    /// Write simplestreams metadata for the tarballs under `<dir>/tools/<stream>/`.
    GenerateAgentBinaries {
        #[arg(short = 'd', long)]
        dir: PathBuf,
        /// Also write every document clear-signed (`.sjson`) with this OpenPGP secret key
        /// (armored or binary, without a passphrase), for `bootstrap --metadata-key`.
        #[arg(long, value_name = "FILE")]
        sign_key: Option<PathBuf>,
    },
    /// Make an OpenPGP key pair (Ed25519, no passphrase) for signing a mirror's metadata:
    /// DIR/metadata-signing-key.asc (secret, 0600) and DIR/metadata-public-key.asc.
    GenerateKey {
        #[arg(short = 'o', long, value_name = "DIR")]
        output: PathBuf,
        /// The key's user id.
        #[arg(long, default_value = "lockstep metadata signing key")]
        name: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    logging::init(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime can be built");
    let timeout = Duration::from_secs(args.timeout);
    let result = runtime.block_on(run(args, timeout));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The edge: the typed error becomes the text the operator reads.
        Err(error) => {
            complain(&format!("ERROR {error}"));
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args, timeout: Duration) -> Result<(), CliError> {
    let session = || Session::resolve(args.controller.as_deref(), &args.data_dir, timeout);
    let talks_to_a_controller = matches!(
        args.command,
        Command::Status { .. }
            | Command::Deploy { .. }
            | Command::AddMachine { .. }
            | Command::Watch { .. }
            | Command::UpgradeController { .. }
            | Command::AbortUpgrade
            | Command::UpgradeModel { .. }
            | Command::ModelConfig { .. }
    );
    if let (Some(name), false) = (&args.controller, talks_to_a_controller) {
        return Err(CliError::ControllerFlag { name: name.clone() });
    }
    match args.command {
        Command::Bootstrap {
            auto_upgrade,
            no_fetch_ahead,
            agent_version,
            agent_stream,
            build_agent,
            agent_binary,
            metadata_source,
            api_port,
            name,
            store,
            etcd_endpoints,
            etcd_cacert,
            etcd_cert,
            etcd_key,
            etcd_user,
            etcd_password_file,
            etcd_insecure,
            metadata_key,
            allow_unsigned_metadata,
            metadata_ca,
            allow_metadata_redirects,
            provisioner,
        } => {
            let options = BootstrapOptions {
                data_dir: args.data_dir.clone(),
                name,
                auto_upgrade,
                fetch_ahead: !no_fetch_ahead,
                agent_version,
                agent_stream,
                build_agent,
                metadata_source,
                api_port,
                local_agent: match agent_binary {
                    Some(path) => path,
                    None => lockstep_agent::paths::sibling_executable("lockstepd")?,
                },
                store,
                etcd_endpoints,
                etcd_tls: lockstep_agent::store::EtcdTlsFiles {
                    cacert: etcd_cacert,
                    cert: etcd_cert,
                    key: etcd_key,
                },
                etcd_auth: lockstep_agent::store::EtcdAuthFiles {
                    user: etcd_user,
                    password_file: etcd_password_file,
                },
                etcd_insecure,
                metadata_key,
                allow_unsigned_metadata,
                metadata_ca,
                allow_metadata_redirects,
                provisioner,
            };
            bootstrap_command(&options, timeout).await
        }
        Command::Status { format } => Ok(commands::status(&session()?, format).await?),
        Command::Deploy { bundle } => Ok(commands::deploy(&session()?, &bundle).await?),
        Command::AddMachine { count } => {
            let primary = lockstep_agent::datadir::DataDir::new(&args.data_dir);
            lockstep_agent::cli::machines::add_machines(&session()?, &primary, count).await?;
            Ok(())
        }
        Command::Watch { limit } => Ok(commands::watch(&session()?, limit).await?),
        Command::UpgradeController {
            agent_version,
            dry_run,
            reset_previous_upgrade,
        } => {
            commands::upgrade_controller(
                &session()?,
                agent_version,
                dry_run,
                reset_previous_upgrade,
                false,
            )
            .await?;
            Ok(())
        }
        Command::AbortUpgrade => Ok(commands::abort_upgrade(&session()?).await?),
        Command::UpgradeModel {
            agent_version,
            dry_run,
            check_agent_versions,
            resume,
            abort,
        } => Ok(commands::upgrade_model(
            &session()?,
            agent_version,
            resume,
            abort,
            dry_run,
            check_agent_versions,
        )
        .await?),
        Command::ModelConfig { settings } => {
            Ok(commands::model_config(&session()?, &settings).await?)
        }
        Command::EnableHa { count } => {
            let primary = lockstep_agent::datadir::DataDir::new(&args.data_dir);
            let added = lockstep_agent::cli::ha::enable_ha(&primary, count, timeout, say).await?;
            say(&format!(
                "enable-ha complete: {} controllers ({} added)",
                count,
                added.len()
            ));
            Ok(())
        }
        Command::KillController => Ok(commands::kill_controller(
            &args.data_dir,
            &JujuData::from_env()?,
            Duration::from_secs(60),
        )?),
        Command::Metadata {
            command: MetadataCommand::GenerateAgentBinaries { dir, sign_key },
        } => Ok(commands::generate_agent_binaries(
            &dir,
            sign_key.as_deref(),
        )?),
        Command::Metadata {
            command: MetadataCommand::GenerateKey { output, name },
        } => {
            let key = commands::generate_key(&output, &name)?;
            say(&format!(
                "wrote {} (secret, for generate-agent-binaries --sign-key) and {} (public, for \
                 bootstrap --metadata-key); key {}",
                output.join(commands::SIGNING_KEY_FILE).display(),
                output.join(commands::PUBLIC_KEY_FILE).display(),
                key.fingerprint()
            ));
            Ok(())
        }
        Command::Demo { keep, timeline } => {
            Ok(lockstep_agent::cli::demo::run(keep, timeout, timeline).await?)
        }
    }
}

async fn bootstrap_command(options: &BootstrapOptions, timeout: Duration) -> Result<(), CliError> {
    let started = Instant::now();
    // Juju's client store is read first: a file that would refuse the new controller's
    // entries stops bootstrap before it starts anything.
    let juju_data = JujuData::from_env()?;
    juju_data.check()?;
    let mut registered = None;
    let bootstrapped =
        lockstep_agent::cli::bootstrap::bootstrap(options, timeout, say, |controller, version| {
            juju_data.add_controller(&Registration {
                controller,
                agent_version: version,
            })?;
            registered = Some((controller.name.clone(), controller.uuid.clone()));
            Ok::<(), JujuDataError>(())
        })
        .await;
    let outcome = match bootstrapped {
        Ok(outcome) => outcome,
        Err(error) => {
            // A controller that never became ready is not left in the client store.
            if let Some((name, uuid)) = registered {
                let _ = juju_data.remove_controller(&name, &uuid);
            }
            return Err(error.into());
        }
    };
    // The version it runs now (an upgrade during bootstrap changes it).
    juju_data.add_controller(&Registration {
        controller: &outcome.controller,
        agent_version: &outcome.agent_version,
    })?;
    say(&format!(
        "Bootstrap complete, controller {:?} is now available ({:.1}s{})",
        options.name,
        started.elapsed().as_secs_f64(),
        outcome
            .upgraded
            .map(|(from, to)| format!(", upgraded {from} -> {to}"))
            .unwrap_or_default()
    ));
    Ok(())
}
