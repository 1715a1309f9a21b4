//! The `oncekv` command: run a member, or a local development cluster.

mod dev;
mod serve;

use clap::{Parser, Subcommand};

/// oncekv: an etcd-compatible replicated key-value and lease service in which every
/// command sent through an oncekv session takes effect exactly once.
#[derive(Debug, Parser)]
#[command(name = "oncekv", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one cluster member (flags named as etcd's where they mean the same).
    Serve(serve::ServeArgs),
    /// Run a local cluster in this process (3 members by default) for development.
    Dev(dev::DevArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONCEKV_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,oncekv=info,oncekv_server=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncekv: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Serve(args) => serve::run(args).await,
            Cmd::Dev(args) => dev::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oncekv: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
