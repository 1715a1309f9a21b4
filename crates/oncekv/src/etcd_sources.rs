//! Where `oncekv serve` takes its settings from besides its command line, as an etcd
//! member does, so that a unit file or manifest written for etcd starts oncekv unchanged:
//!
//! - `ETCD_*` environment variables, one per flag (`ETCD_DATA_DIR` for `--data-dir`). A
//!   flag given both ways is an error, as in etcd 3.4 (which of the two was meant is not
//!   guessed); an `ETCD_*` variable that names no flag is warned about.
//! - etcd's YAML configuration file (`--config-file`, or `ETCD_CONFIG_FILE`): the flags'
//!   names as keys, the TLS flags under `client-transport-security` and
//!   `peer-transport-security`. When one is given every other flag and variable is
//!   ignored, as in etcd. A key that is not an oncekv setting is refused unless it is
//!   empty, so a file never half-applies.
//!
//! Both become command-line arguments for `serve`, so one parser checks every value and
//! its errors name the flag.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;

/// What resolving the settings has to tell the operator, logged once logging is set up
/// (etcd logs the same lines).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Notes {
    pub info: Vec<String>,
    pub warnings: Vec<String>,
}

/// Why the settings could not be resolved.
#[derive(Debug)]
pub enum Failure {
    /// The command line itself does not parse (or asks for --help): clap reports it.
    Clap(clap::Error),
    /// A conflict, or a bad value in the environment or the configuration file.
    Message(String),
}

/// The environment variable etcd reads for `--flag`.
pub fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))
}

/// The arguments to run with: `argv` unchanged unless its command is `serve` and a
/// configuration file or `ETCD_*` variables (from `env`) set something.
pub fn resolve(
    cmd: &clap::Command,
    argv: Vec<OsString>,
    env: &[(String, String)],
) -> Result<(Vec<OsString>, Notes), Failure> {
    let matches = cmd
        .clone()
        .try_get_matches_from(&argv)
        .map_err(Failure::Clap)?;
    let (Some(("serve", serve)), Some(serve_cmd)) =
        (matches.subcommand(), cmd.find_subcommand("serve"))
    else {
        return Ok((argv, Notes::default()));
    };
    let get_env = |name: &str| {
        env.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let mut notes = Notes::default();
    // Each flag's id and every name it answers to (etcd's older names are aliases here).
    let flags: Vec<(String, Vec<String>)> = serve_cmd
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            if matches!(long, "help" | "version") {
                return None;
            }
            let mut names = vec![long.to_string()];
            names.extend(
                arg.get_all_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_string),
            );
            Some((arg.get_id().to_string(), names))
        })
        .collect();

    let config_file = serve
        .get_one::<PathBuf>("config_file")
        .cloned()
        .or_else(|| get_env(&env_name("config-file")).map(PathBuf::from));
    if let Some(path) = config_file {
        let in_file =
            |e: String| Failure::Message(format!("--config-file {}: {e}", path.display()));
        let text = std::fs::read_to_string(&path).map_err(|e| in_file(e.to_string()))?;
        let known: BTreeSet<&str> = flags
            .iter()
            .flat_map(|(_, names)| names.iter().map(String::as_str))
            .collect();
        let args = yaml_args(&text, &known).map_err(in_file)?;
        let mut resolved = vec![argv.first().cloned().unwrap_or_else(|| "oncekv".into())];
        resolved.push("serve".into());
        resolved.extend(args.into_iter().map(OsString::from));
        if let Err(e) = cmd.clone().try_get_matches_from(&resolved) {
            return Err(in_file(first_line(&e)));
        }
        notes.info.push(format!(
            "Loading server configuration from {:?}. Other configuration command line flags \
             and environment variables will be ignored if provided.",
            path.display().to_string()
        ));
        return Ok((resolved, notes));
    }

    let mut added = Vec::new();
    for (id, names) in &flags {
        for name in names {
            let var = env_name(name);
            let Some(value) = get_env(&var) else {
                continue;
            };
            if serve.value_source(id) == Some(ValueSource::CommandLine) {
                return Err(Failure::Message(format!(
                    "conflicting environment variable {var:?} is shadowed by corresponding \
                     command-line flag (either unset environment variable or disable flag)"
                )));
            }
            notes.info.push(format!(
                "recognized and used environment variable {var}={value}"
            ));
            added.push((var, format!("--{name}={value}")));
            // One value per flag: a second name of the same flag would be a duplicate.
            break;
        }
    }
    // Unknown: naming no flag at all (one set empty, or shadowed by another name of its
    // flag, is not unknown).
    let known: BTreeSet<String> = flags
        .iter()
        .flat_map(|(_, names)| names.iter().map(|n| env_name(n)))
        .collect();
    let mut unknown: Vec<&(String, String)> = env
        .iter()
        .filter(|(k, _)| k.starts_with("ETCD_") && !known.contains(k))
        .collect();
    unknown.sort();
    for (k, v) in unknown {
        notes
            .warnings
            .push(format!("unrecognized environment variable {k}={v}"));
    }
    if added.is_empty() {
        return Ok((argv, notes));
    }
    let vars: Vec<&str> = added.iter().map(|(var, _)| var.as_str()).collect();
    let vars = vars.join(", ");
    let mut resolved = argv;
    resolved.extend(added.into_iter().map(|(_, arg)| OsString::from(arg)));
    if let Err(e) = cmd.clone().try_get_matches_from(&resolved) {
        return Err(Failure::Message(format!(
            "with the environment's {vars}: {}",
            first_line(&e)
        )));
    }
    Ok((resolved, notes))
}

/// A clap error's message without its usage lines.
fn first_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// The `--flag=value` arguments an etcd YAML configuration file stands for. `known` holds
/// the flags `serve` takes. A key set to nothing (`wal-dir:`) leaves its flag at its
/// default, as in etcd.
pub fn yaml_args(text: &str, known: &BTreeSet<&str>) -> Result<Vec<String>, String> {
    use yaml_serde::Value;
    let doc: Value = yaml_serde::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let map = match doc {
        Value::Mapping(map) => map,
        Value::Null => return Ok(Vec::new()),
        _ => return Err("expected settings as `key: value` lines".into()),
    };
    let mut args = Vec::new();
    for (key, value) in &map {
        let key = key
            .as_str()
            .ok_or_else(|| format!("a key is not a string: {key:?}"))?;
        match key {
            "client-transport-security" | "peer-transport-security" => {
                let prefix = if key.starts_with("peer") { "peer-" } else { "" };
                let inner = match value {
                    Value::Mapping(inner) => inner.clone(),
                    Value::Null => Default::default(),
                    _ => return Err(format!("{key}: expected its settings under it")),
                };
                for (k, v) in &inner {
                    let k = k
                        .as_str()
                        .ok_or_else(|| format!("{key}: a key is not a string: {k:?}"))?;
                    // The client port's flags have no prefix, except these.
                    let flag = match (prefix, k) {
                        ("", "allowed-cn" | "allowed-hostname") => format!("client-cert-{k}"),
                        (_, "allowed-cn" | "allowed-hostname") => format!("{prefix}cert-{k}"),
                        ("", "crl-file") => "client-crl-file".to_string(),
                        _ => format!("{prefix}{k}"),
                    };
                    push_arg(&mut args, &format!("{key}.{k}"), &flag, v, known)?;
                }
            }
            _ => push_arg(&mut args, key, key, value, known)?,
        }
    }
    Ok(args)
}

/// Flags etcd keeps as Go durations: its YAML file gives them in nanoseconds (a bare
/// number), where the command line takes `2h` or `20s`.
const DURATION_FLAGS: [&str; 5] = [
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "corrupt-check-time",
    "experimental-corrupt-check-time",
    "experimental-watch-progress-notify-interval",
];

fn push_arg(
    args: &mut Vec<String>,
    key: &str,
    flag: &str,
    value: &yaml_serde::Value,
    known: &BTreeSet<&str>,
) -> Result<(), String> {
    use yaml_serde::Value;
    let text = match value {
        Value::Null => return Ok(()),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if DURATION_FLAGS.contains(&flag) => format!("{n}ns"),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(format!("{key}: expected a list of plain values")),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        _ => return Err(format!("{key}: expected a plain value")),
    };
    if !known.contains(flag) {
        if text.is_empty() {
            return Ok(());
        }
        return Err(format!(
            "{key}: not an oncekv setting (`oncekv serve --help` lists them)"
        ));
    }
    args.push(format!("--{flag}={text}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> BTreeSet<&'static str> {
        [
            "name",
            "data-dir",
            "log-outputs",
            "client-cert-auth",
            "client-crl-file",
            "client-cert-allowed-hostname",
            "cert-file",
            "peer-cert-file",
            "peer-client-cert-auth",
            "peer-cert-allowed-cn",
            "snapshot-count",
            "grpc-keepalive-interval",
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn an_etcd_configuration_file_becomes_flags() {
        let text = "name: 'infra1'\ndata-dir:\nsnapshot-count: 5000\nlog-outputs: [stderr]\n\
                    grpc-keepalive-interval: 7200000000000\n\
                    client-transport-security:\n  cert-file: /c.pem\n  client-cert-auth: false\n  \
                    crl-file: /crl.pem\n  allowed-hostname: h1\n\
                    peer-transport-security:\n  cert-file: /p.pem\n  client-cert-auth: true\n  \
                    allowed-cn: m1\nwal-dir:\ncors: ''\n";
        assert_eq!(
            yaml_args(text, &known()),
            Ok(vec![
                "--name=infra1".to_string(),
                "--snapshot-count=5000".into(),
                "--log-outputs=stderr".into(),
                "--grpc-keepalive-interval=7200000000000ns".into(),
                "--cert-file=/c.pem".into(),
                "--client-cert-auth=false".into(),
                "--client-crl-file=/crl.pem".into(),
                "--client-cert-allowed-hostname=h1".into(),
                "--peer-cert-file=/p.pem".into(),
                "--peer-client-cert-auth=true".into(),
                "--peer-cert-allowed-cn=m1".into(),
            ])
        );
    }

    #[test]
    fn a_setting_oncekv_lacks_is_refused_unless_empty() {
        let refused = yaml_args("discovery-srv-name: x\n", &known());
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("discovery-srv-name")),
            "{refused:?}"
        );
        assert_eq!(yaml_args("tls-min-version: ''\n", &known()), Ok(vec![]));
        assert!(yaml_args("- a\n- b\n", &known()).is_err());
        assert!(yaml_args("name: [a: 1]\n", &known()).is_err());
        assert!(yaml_args("name: 'unclosed\n", &known()).is_err());
        assert_eq!(yaml_args("", &known()), Ok(vec![]));
    }

    #[test]
    fn flag_names_map_to_etcds_variables() {
        assert_eq!(env_name("data-dir"), "ETCD_DATA_DIR");
        assert_eq!(
            env_name("experimental-initial-corrupt-check"),
            "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK"
        );
    }
}
