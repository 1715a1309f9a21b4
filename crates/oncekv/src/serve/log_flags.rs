//! etcd's logging flags of `serve`: the tracing filter they give and where log lines go.

use std::path::PathBuf;

use clap::Args;

/// etcd's logging flags. `ONCEKV_LOG` (a tracing filter such as
/// `info,openraft=debug`), when set, overrides `--log-level`.
#[derive(Debug, Args, Clone)]
pub struct LogArgs {
    /// Least severe messages logged: debug, info, warn, error (etcd's panic and fatal
    /// log as error).
    #[arg(long, default_value = "info",
          value_parser = ["debug", "info", "warn", "error", "panic", "fatal"])]
    pub log_level: String,
    /// etcd's choice of logging library; oncekv has one, so either value logs the same.
    #[arg(long, default_value = "zap", value_parser = ["zap", "capnslog"])]
    pub logger: String,
    /// Where logs go: "default" or "stderr", "stdout", or a file path (appended to).
    #[arg(long, default_value = "default")]
    pub log_outputs: String,
    /// etcd 3.4's older switch for debug-level logging: the same as --log-level=debug.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub debug: bool,
    /// capnslog's per-package levels: accepted only empty (use --log-level).
    #[arg(long, hide = true)]
    pub log_package_levels: Option<String>,
}

/// Where a member's log lines go.
#[derive(Debug, PartialEq, Eq)]
pub enum LogOutput {
    Stderr,
    Stdout,
    File(PathBuf),
}

impl LogArgs {
    /// The tracing filter for `--log-level`: oncekv's own messages at that level,
    /// libraries' (openraft, hyper) only from warn up unless debug is asked for.
    pub fn filter(&self) -> String {
        let level = if self.debug {
            "debug"
        } else {
            self.log_level.as_str()
        };
        match level {
            "debug" => "info,oncekv=debug,oncekv_server=debug,openraft=debug".into(),
            "info" => "warn,oncekv=info,oncekv_server=info".into(),
            "warn" => "warn".into(),
            _ => "error".into(),
        }
    }

    pub fn output(&self) -> Result<LogOutput, String> {
        let outputs: Vec<&str> = self
            .log_outputs
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        match outputs.as_slice() {
            [] | ["default"] | ["stderr"] => Ok(LogOutput::Stderr),
            ["stdout"] => Ok(LogOutput::Stdout),
            ["systemd/journal"] => Err(
                "--log-outputs systemd/journal: not supported; use stderr (journald collects a \
                 unit's stderr)"
                    .into(),
            ),
            [path] => Ok(LogOutput::File(PathBuf::from(path))),
            _ => Err(format!(
                "--log-outputs {}: oncekv logs to one output",
                self.log_outputs
            )),
        }
    }
}
