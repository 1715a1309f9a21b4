//! The `oncekv` command: run a member or a local development cluster, measure a cluster,
//! and talk to one as etcdctl does (every write exactly once, through a session).

mod bench;
mod cli;
mod demo;
mod dev;
mod etcd_sources;
mod fault_proxy;
mod grpc_proxy;
mod log_filter;
mod serve;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the server allocates per request in many small
/// pieces across worker threads (HTTP/2 frames, headers, protobuf messages), where glibc's
/// arenas cost a measurable share of the server's CPU (crates/oncekv-server/benches/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// oncekv: an etcd-compatible replicated key-value and lease service in which every
/// command sent through an oncekv session takes effect exactly once.
///
/// The client commands (put, get, del, txn, watch, compaction, lease, member, endpoint)
/// take etcdctl 3.4's arguments and print what it prints.
#[derive(Debug, Parser)]
#[command(name = "oncekv", version, args_override_self = true)]
struct Cli {
    #[command(flatten)]
    client: cli::GlobalArgs,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one cluster member (flags named as etcd's where they mean the same).
    ///
    /// As with etcd, every flag can also be set as an environment variable ETCD_<FLAG>
    /// (ETCD_DATA_DIR for --data-dir; not both ways at once), or all of them in etcd's YAML
    /// configuration file with --config-file (then other flags and variables are ignored).
    Serve(Box<serve::ServeArgs>),
    /// Run a local cluster in this process (3 members by default) for development.
    Dev(dev::DevArgs),
    /// Measure throughput and latency of an etcd-compatible cluster (oncekv or etcd).
    Bench(bench::BenchArgs),
    /// Show exactly-once under lost replies and leader kills, and check it (exits 0 only
    /// if it held), with an etcd-style client for contrast.
    Demo(demo::DemoArgs),
    /// etcd's gRPC proxy for unchanged etcd clients, relaying every write exactly once
    /// (`oncekv grpc-proxy start --endpoints ...`).
    GrpcProxy(grpc_proxy::GrpcProxyArgs),
    /// A TCP proxy that drops a share of the replies it relays (a test tool: put it
    /// between any etcd client and a member to see what lost replies do).
    FaultProxy(fault_proxy::FaultProxyArgs),
    #[command(flatten)]
    Client(cli::Command),
}

impl Cmd {
    /// The log filter used when `ONCEKV_LOG` is not set. The client commands print only
    /// their output (and errors), as etcdctl does.
    fn default_log_filter(&self) -> &'static str {
        match self {
            Cmd::Client(_) => "error",
            // The demo's own report is the output; raft's complaints about the members it
            // kills on purpose would drown it.
            Cmd::Demo(_) => "error,openraft=off",
            _ => "warn,oncekv=info,oncekv_server=info,oncekv_proxy=info",
        }
    }
}

/// Resolves at the first SIGINT (ctrl-c) or SIGTERM (what systemd, Kubernetes and `kill`
/// send to stop a service): the servers then stop gracefully, as etcd does on either. An
/// error if the signals cannot be listened for.
pub(crate) async fn stop_requested() -> Result<(), String> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("listening for SIGTERM: {e}"))?;
    tokio::select! {
        signal = tokio::signal::ctrl_c() => signal.map_err(|e| format!("waiting for ctrl-c: {e}")),
        _ = term.recv() => Ok(()),
    }
}

/// How `serve`, `dev` and `bench` report a failure.
fn server_exit(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oncekv: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logging as `command` asks: `serve`'s etcd flags (`--log-level`, `--log-outputs`), the
/// command's default otherwise; `ONCEKV_LOG` overrides the level either way.
fn init_logging(command: &Cmd) -> Result<(), String> {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let (filter, output) = match command {
        Cmd::Serve(args) => (args.log.filter(), args.log.output()?),
        other => (
            other.default_log_filter().to_string(),
            serve::LogOutput::Stderr,
        ),
    };
    // Colour codes belong on a terminal, not in a log file.
    let ansi = !matches!(output, serve::LogOutput::File(_));
    let writer = match output {
        serve::LogOutput::Stderr => BoxMakeWriter::new(std::io::stderr),
        serve::LogOutput::Stdout => BoxMakeWriter::new(std::io::stdout),
        serve::LogOutput::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("--log-outputs {}: {e}", path.display()))?;
            BoxMakeWriter::new(std::sync::Mutex::new(file))
        }
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("ONCEKV_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with(log_filter::QuietElections)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(ansi),
        )
        .init();
    Ok(())
}

/// The command line, with `serve`'s settings from `ETCD_*` variables or an etcd
/// configuration file folded in; what that resolution has to report.
fn parse_cli() -> Result<(Cli, etcd_sources::Notes), String> {
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let command = Cli::command();
    let (argv, notes) = match etcd_sources::resolve(&command, std::env::args_os().collect(), &env) {
        Ok(resolved) => resolved,
        Err(etcd_sources::Failure::Clap(e)) => e.exit(),
        Err(etcd_sources::Failure::Message(e)) => return Err(e),
    };
    let cli = command
        .try_get_matches_from(argv)
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| e.exit());
    Ok((cli, notes))
}

fn main() -> ExitCode {
    let (cli, notes) = match parse_cli() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("oncekv: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = init_logging(&cli.command) {
        eprintln!("oncekv: {e}");
        return ExitCode::FAILURE;
    }
    for line in &notes.info {
        tracing::info!("{line}");
    }
    for line in &notes.warnings {
        tracing::warn!("{line}");
    }
    let runtime = match runtime_builder(&cli.command).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncekv: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match cli.command {
            Cmd::Serve(args) => server_exit(serve::run(*args).await),
            Cmd::Dev(args) => server_exit(dev::run(args).await),
            Cmd::Bench(args) => server_exit(bench::run(args).await),
            Cmd::Demo(args) => server_exit(demo::run(args).await),
            Cmd::GrpcProxy(args) => server_exit(grpc_proxy::run(args).await),
            Cmd::FaultProxy(args) => server_exit(fault_proxy::run(args).await),
            Cmd::Client(command) => cli::run(cli.client, command).await,
        }
    })
}

/// The one runtime every command runs on (a member, `oncekv dev`'s three, a bench's
/// clients).
///
/// tokio's LIFO slot runs a task woken by the running one next, ahead of the queue. A
/// connection's HTTP/2 task is woken by every request task that finishes a reply; with the
/// slot it runs after each of them and flushes one reply per write (about 0.8 `writev` per
/// put under 64 clients), without it the replies finished in one scheduling round leave in
/// one write (0.1 per put) and the server spends 10 to 15 % less CPU per request (benches
/// README, "The LIFO slot"). The switch needs `--cfg tokio_unstable`, which the
/// workspace's `.cargo/config.toml` sets; a build without it keeps tokio's default.
///
/// `grpc-proxy` runs on as many worker threads as its `--worker-threads` asks (1 by
/// default): a relayed call passes between four tasks, and on one thread those hand-offs
/// need no cross-thread wake-up (README, "The grpc-proxy's cost").
fn runtime_builder(command: &Cmd) -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Cmd::GrpcProxy(args) = command {
        builder.worker_threads(args.worker_threads());
    }
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // clap checks a command's definition only when it parses: this catches a clash
    // between the client options and a subcommand's own flags (bench has --endpoints and
    // -w too) in every subcommand, before a user meets it.
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    fn resolve(argv: &[&str], env: &[(&str, &str)]) -> Result<(Cli, etcd_sources::Notes), String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = argv.iter().map(|a| std::ffi::OsString::from(*a)).collect();
        let (argv, notes) =
            etcd_sources::resolve(&Cli::command(), argv, &env).map_err(|e| match e {
                etcd_sources::Failure::Clap(e) => e.to_string(),
                etcd_sources::Failure::Message(m) => m,
            })?;
        Ok((Cli::try_parse_from(argv).map_err(|e| e.to_string())?, notes))
    }

    fn serve_args(cli: Cli) -> serve::ServeArgs {
        match cli.command {
            Cmd::Serve(args) => *args,
            other => panic!("not serve: {other:?}"),
        }
    }

    // etcd's ETCD_* variables set serve's flags; a flag set both ways is refused, as in
    // etcd 3.4; unknown ETCD_* variables are warned about; other commands ignore them.
    #[test]
    fn etcd_environment_variables_set_serve_flags() {
        let env = [
            ("ETCD_NAME", "infra1"),
            ("ETCD_DATA_DIR", "/var/lib/x"),
            ("ETCD_CLIENT_CERT_AUTH", "false"),
            ("ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", "true"),
            ("ETCD_NO_SUCH_FLAG", "1"),
            // Empty is unset: no conflict with --snapshot-count, and not unknown.
            ("ETCD_SNAPSHOT_COUNT", ""),
            ("PATH", "/bin"),
        ];
        let (cli, notes) = resolve(&["oncekv", "serve", "--snapshot-count", "7"], &env).unwrap();
        let args = serve_args(cli);
        assert_eq!(args.name, "infra1");
        assert_eq!(args.data_dir, std::path::PathBuf::from("/var/lib/x"));
        assert!(!args.tls.client_cert_auth);
        assert!(args.tuning.initial_corrupt_check);
        assert_eq!(args.tuning.snapshot_count, 7);
        assert!(
            notes.info.iter().any(|l| l.contains("ETCD_NAME=infra1")),
            "{notes:?}"
        );
        assert_eq!(
            notes.warnings,
            vec!["unrecognized environment variable ETCD_NO_SUCH_FLAG=1".to_string()]
        );

        let conflict = resolve(&["oncekv", "serve", "--name", "x"], &env).unwrap_err();
        assert!(conflict.contains("\"ETCD_NAME\" is shadowed"), "{conflict}");
        let bad = resolve(&["oncekv", "serve"], &[("ETCD_SNAPSHOT_COUNT", "many")]).unwrap_err();
        assert!(bad.contains("ETCD_SNAPSHOT_COUNT"), "{bad}");
        // Client commands are etcdctl's: ETCD_* is not theirs.
        let (_, notes) = resolve(&["oncekv", "get", "k"], &env).unwrap();
        assert_eq!(notes, etcd_sources::Notes::default());
    }

    // With --config-file, the file's settings are the member's and every other flag and
    // variable is ignored, as in etcd.
    #[test]
    fn an_etcd_configuration_file_sets_serve_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("etcd.conf.yml");
        std::fs::write(
            &file,
            "name: fromfile\nsnapshot-count: 42\nwal-dir:\nmax-wals: 5\nproxy: 'off'\n\
             client-transport-security:\n  client-cert-auth: false\n  auto-tls: true\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let (cli, notes) = resolve(
            &[
                "oncekv",
                "serve",
                "--name",
                "ignored",
                "--config-file",
                path,
            ],
            &[("ETCD_DATA_DIR", "/ignored")],
        )
        .unwrap();
        let args = serve_args(cli);
        assert_eq!(args.name, "fromfile");
        assert_eq!(args.tuning.snapshot_count, 42);
        assert!(args.tls.auto_tls);
        assert_eq!(args.data_dir, std::path::PathBuf::from("default.oncekv"));
        assert!(
            notes.info[0].contains("Loading server configuration"),
            "{notes:?}"
        );

        let (cli, _) = resolve(&["oncekv", "serve"], &[("ETCD_CONFIG_FILE", path)]).unwrap();
        assert_eq!(serve_args(cli).name, "fromfile");

        std::fs::write(&file, "snapshot-count: lots\n").unwrap();
        let bad = resolve(&["oncekv", "serve", "--config-file", path], &[]).unwrap_err();
        assert!(
            bad.contains("--config-file") && bad.contains("lots"),
            "{bad}"
        );
        let missing = dir.path().join("missing.yml");
        let gone = resolve(
            &[
                "oncekv",
                "serve",
                "--config-file",
                missing.to_str().unwrap(),
            ],
            &[],
        )
        .unwrap_err();
        assert!(gone.contains("missing.yml"), "{gone}");
    }

    // etcd's boolean flags take =true/=false as well as standing alone.
    #[test]
    fn boolean_flags_take_etcds_values() {
        let args = serve_args(
            Cli::try_parse_from([
                "oncekv",
                "serve",
                "--client-cert-auth=false",
                "--peer-auto-tls",
                "--strict-reconfig-check=false",
                "--pre-vote=true",
            ])
            .unwrap(),
        );
        assert!(!args.tls.client_cert_auth);
        assert!(args.tls.peer_auto_tls);
        // A flag given twice: the last wins, as Go's flag package has it (etcd's own tests
        // pass --client-cert-auth twice).
        let args = serve_args(
            Cli::try_parse_from([
                "oncekv",
                "serve",
                "--name=a",
                "--client-cert-auth",
                "--name=b",
                "--client-cert-auth",
            ])
            .unwrap(),
        );
        assert_eq!((args.name.as_str(), args.tls.client_cert_auth), ("b", true));
        assert_eq!(args.etcd.check(), Ok(vec![]));
        for refused in [
            "--strict-reconfig-check",
            "--force-new-cluster=true",
            "--proxy=on",
            "--discovery=https://discovery.etcd.io/x",
            "--cors=*",
            "--host-whitelist=a.example.com",
        ] {
            let args = serve_args(Cli::try_parse_from(["oncekv", "serve", refused]).unwrap());
            assert!(args.etcd.check().is_err(), "{refused} accepted");
        }
        let args = serve_args(Cli::try_parse_from(["oncekv", "serve", "--enable-pprof"]).unwrap());
        assert_eq!(args.etcd.check().map(|w| w.len()), Ok(1));
    }

    // Every flag etcd 3.4's --help lists is one `oncekv serve` knows (hidden or not), so an
    // etcd member's command line never fails on an unknown flag.
    #[test]
    fn every_etcd_flag_is_known() {
        let Ok(help) = std::process::Command::new("etcd").arg("--help").output() else {
            panic!("etcd is not installed: run .ci/install-deps");
        };
        let help = String::from_utf8_lossy(&help.stdout).into_owned()
            + &String::from_utf8_lossy(&help.stderr);
        let cli = <Cli as clap::CommandFactory>::command();
        let serve = cli
            .get_subcommands()
            .find(|c| c.get_name() == "serve")
            .unwrap();
        let known: std::collections::BTreeSet<String> = serve
            .get_arguments()
            .flat_map(|a| {
                a.get_long()
                    .into_iter()
                    .chain(a.get_all_aliases().into_iter().flatten())
                    .map(str::to_string)
            })
            .collect();
        let etcd: Vec<&str> = help
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .filter_map(|l| l.split([' ', '\'', '=']).next())
            .filter(|f| !f.is_empty())
            .collect();
        assert!(etcd.len() > 60, "etcd --help lists {} flags", etcd.len());
        let missing: Vec<&&str> = etcd
            .iter()
            .filter(|f| !known.contains(**f) && !["help", "version"].contains(f))
            .collect();
        assert!(
            missing.is_empty(),
            "etcd flags oncekv serve lacks: {missing:?}"
        );
    }

    // etcd's tuning flags for its backend and elections parse; the ones asking for what
    // oncekv lacks are refused or warned about.
    #[test]
    fn etcds_tuning_flags_parse() {
        let args = serve_args(
            Cli::try_parse_from([
                "oncekv",
                "serve",
                "--backend-batch-interval=10ms",
                "--backend-batch-limit=1000",
                "--experimental-backend-bbolt-freelist-type=map",
                "--experimental-compaction-batch-limit=1000",
                "--experimental-enable-lease-checkpoint",
                "--experimental-peer-skip-client-san-verification=false",
                "--initial-election-tick-advance=false",
                "--experimental-warning-apply-duration=250ms",
            ])
            .unwrap(),
        );
        assert_eq!(args.etcd.check(), Ok(vec![]));
        assert_eq!(
            args.tuning.experimental_warning_apply_duration,
            std::time::Duration::from_millis(250)
        );
        let args = serve_args(
            Cli::try_parse_from(["oncekv", "serve", "--experimental-enable-v2v3=/v2/"]).unwrap(),
        );
        assert!(args.etcd.check().unwrap_err().contains("v2"));
        let args = serve_args(
            Cli::try_parse_from(["oncekv", "serve", "--grpc-keepalive-min-time=10s"]).unwrap(),
        );
        assert_eq!(args.etcd.check().map(|w| w.len()), Ok(1));
        assert!(
            Cli::try_parse_from([
                "oncekv",
                "serve",
                "--experimental-backend-bbolt-freelist-type=list"
            ])
            .is_err()
        );
    }

    // The options may come before or after the command, as with etcdctl; after wins.
    #[test]
    fn client_options_parse_before_and_after_the_command() {
        let cli =
            Cli::try_parse_from(["oncekv", "--endpoints", "a:1,b:2", "get", "k", "-w", "json"]);
        assert!(matches!(
            cli,
            Ok(Cli {
                command: Cmd::Client(cli::Command::Get(_)),
                ..
            })
        ));
        let cli = Cli::try_parse_from(["oncekv", "lease", "grant", "60", "--endpoints", "a:1"]);
        assert!(cli.is_ok(), "{cli:?}");
        let cli = Cli::try_parse_from(["oncekv", "bench", "put", "--endpoints", "a:1"]);
        assert!(cli.is_ok(), "bench keeps its own options: {cli:?}");
    }

    // The cluster flags of an etcd member's configuration parse as etcd writes them.
    #[test]
    fn etcds_cluster_flags_parse() {
        let serve = |extra: &[&str]| {
            let mut argv = vec!["oncekv", "serve", "--name", "n1"];
            argv.extend(extra);
            match Cli::try_parse_from(argv) {
                Ok(Cli {
                    command: Cmd::Serve(args),
                    ..
                }) => Ok(*args),
                Ok(other) => panic!("not serve: {other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        let args = serve(&[
            "--initial-advertise-peer-urls",
            "http://10.0.0.1:2380",
            "--initial-cluster-token",
            "staging-1",
            "--enable-v2=false",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(args.initial_cluster_token, "staging-1");
        assert!(!args.enable_v2);
        assert_eq!(
            serve(&[]).map(|a| a.initial_cluster_token).as_deref(),
            Ok("etcd-cluster")
        );
        assert!(serve(&["--enable-v2"]).is_ok_and(|a| a.enable_v2));
        assert!(
            serve(&["--peer-cert-allowed-cn", "member"]).is_ok_and(|a| a
                .tls
                .peer_cert_allowed_cn
                .as_deref()
                == Some("member"))
        );
        // etcd's logging flags.
        let args = serve(&[
            "--logger=zap",
            "--log-level",
            "debug",
            "--log-outputs",
            "stdout",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(args.log.filter().contains("oncekv_server=debug"));
        assert_eq!(args.log.output(), Ok(serve::LogOutput::Stdout));
        let args = serve(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(args.log.output(), Ok(serve::LogOutput::Stderr));
        assert_eq!(args.log.filter(), "warn,oncekv=info,oncekv_server=info");
        let args = serve(&["--log-outputs", "/var/log/oncekv.log", "--log-level=fatal"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            args.log.output(),
            Ok(serve::LogOutput::File("/var/log/oncekv.log".into()))
        );
        assert_eq!(args.log.filter(), "error");
        let args = serve(&["--log-outputs", "stderr,/tmp/x.log"]).unwrap_or_else(|e| panic!("{e}"));
        assert!(args.log.output().is_err());
        assert!(serve(&["--log-level", "verbose"]).is_err());
    }

    #[test]
    fn listen_urls_are_lists_of_one_scheme_and_localhost_binds_loopback() {
        assert_eq!(
            serve::parse_listen_urls(
                "listen-client-urls",
                "http://10.0.0.1:2379, http://localhost:2379"
            ),
            Ok(vec![
                "10.0.0.1:2379".parse().unwrap_or_else(|e| panic!("{e}")),
                "127.0.0.1:2379".parse().unwrap_or_else(|e| panic!("{e}")),
            ])
        );
        assert!(
            serve::parse_listen_urls(
                "listen-client-urls",
                "http://10.0.0.1:2379,https://10.0.0.1:2380"
            )
            .is_err_and(|e| e.contains("mixes http:// and https://"))
        );
        assert!(serve::parse_listen_urls("listen-client-urls", " ").is_err());
        assert!(serve::parse_url("http://etcd.example.com:2379").is_err());
    }

    #[test]
    fn the_advertised_peer_url_must_be_the_members_entry() {
        let members =
            serve::parse_initial_cluster("n1=http://10.0.0.1:2380,n2=http://10.0.0.2:2380")
                .unwrap_or_else(|e| panic!("{e}"));
        let check = |name, urls| serve::check_advertised_peer_url(name, &members, urls);
        assert_eq!(check("n1", "http://10.0.0.1:2380"), Ok(()));
        assert_eq!(check("n1", " http://10.0.0.1:2380/ "), Ok(()));
        assert_eq!(
            check("n1", "http://10.0.0.9:2380"),
            Err(
                "--initial-cluster has n1=http://10.0.0.1:2380 but missing from \
                 --initial-advertise-peer-urls=http://10.0.0.9:2380"
                    .into()
            )
        );
        assert!(
            check("n1", "http://10.0.0.1:2380,http://10.0.0.1:2381")
                .is_err_and(|e| e.contains("one peer URL per member"))
        );
        assert!(
            check("n3", "http://10.0.0.3:2380")
                .is_err_and(|e| e.contains("couldn't find local name \"n3\""))
        );
    }
}
