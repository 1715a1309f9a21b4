//! `txn`: etcdctl's transaction format read from standard input, parsed in full before
//! anything is sent.
//!
//! ```text
//! value("greeting") = "hello"      <- compares, one per line
//! mod("counter") > "0"
//!                                  <- blank line
//! put outcome yes                  <- requests run if every compare holds
//! get greeting
//!                                  <- blank line
//! put outcome no --prev-kv         <- requests run otherwise
//!                                  <- blank line (or end of input)
//! ```
//!
//! Compare targets: `ver`/`version`, `c`/`create`, `m`/`mod` (decimal numbers),
//! `val`/`value` (a string), `lease` (an ID in hex); operators `=`, `!=`, `<`, `>`. Request
//! lines are `put`, `get` and `del` with the flags of those commands; arguments may be
//! quoted ("a b" with Go escapes, or 'a b').

use std::io::{BufRead, Write as _};

use clap::{Args, Parser};
use oncekv_client::{Client, Compare, CompareOp, TxnOp};

use super::kv::{DelOp, GetOp, PutOp};
use super::output::Printer;
use super::{CliError, ClientFlags, emit, parse_lease_id};

#[derive(Debug, Args)]
pub struct TxnArgs {
    /// Prompt for each part of the transaction (compares, success and failure requests).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    #[command(flatten)]
    pub flags: ClientFlags,
}

/// A transaction ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

/// One request line of a txn branch, parsed with the flags of the command of its name.
#[derive(Debug, Parser)]
#[command(no_binary_name = true, disable_help_subcommand = true)]
enum RequestLine {
    Put(PutOp),
    Get(GetOp),
    Del(DelOp),
}

/// Reads the transaction from standard input.
pub fn read(args: &TxnArgs) -> Result<Txn, CliError> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    parse(&mut input, args.interactive)
}

/// Parses the three sections; each ends at a blank line or at the end of the input.
pub fn parse(input: &mut dyn BufRead, interactive: bool) -> Result<Txn, CliError> {
    let prompts = [
        "compares:",
        "success requests (get, put, del):",
        "failure requests (get, put, del):",
    ];
    let mut sections: [Vec<String>; 3] = Default::default();
    for (section, prompt) in sections.iter_mut().zip(prompts) {
        if interactive {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{prompt}").and_then(|()| out.flush());
        }
        loop {
            let mut line = String::new();
            let n = input
                .read_line(&mut line)
                .map_err(|e| CliError::new(format!("reading the txn from stdin: {e}")))?;
            let line = line.trim_end_matches(['\n', '\r']);
            if n == 0 || line.trim().is_empty() {
                break;
            }
            section.push(line.to_string());
        }
    }
    let [compares, success, failure] = sections;
    Ok(Txn {
        compares: compares
            .iter()
            .map(|l| parse_compare(l))
            .collect::<Result<_, _>>()?,
        success: success
            .iter()
            .map(|l| parse_request(l))
            .collect::<Result<_, _>>()?,
        failure: failure
            .iter()
            .map(|l| parse_request(l))
            .collect::<Result<_, _>>()?,
    })
}

pub async fn run(client: Client, p: Printer, txn: Txn) -> Result<(), CliError> {
    let r = client.txn(txn.compares, txn.success, txn.failure).await?;
    emit(&p.txn(&r))
}

/// `target("key") op "operand"`.
fn parse_compare(line: &str) -> Result<Compare, CliError> {
    let malformed = |why: &str| CliError::new(format!("malformed comparison: {line} ({why})"));
    let (target, rest) = line
        .split_once('(')
        .ok_or_else(|| malformed("expected target(\"key\")"))?;
    let target = target.trim();
    let (key, rest) = quoted(rest.trim_start()).map_err(|e| malformed(&e))?;
    let rest = rest
        .trim_start()
        .strip_prefix(')')
        .ok_or_else(|| malformed("expected ')' after the key"))?
        .trim_start();
    let (op, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let op = match op {
        "=" | "==" => CompareOp::Equal,
        "!=" => CompareOp::NotEqual,
        "<" => CompareOp::Less,
        ">" => CompareOp::Greater,
        other => return Err(malformed(&format!("unknown operator {other:?}"))),
    };
    let rest = rest.trim();
    let operand = if rest.starts_with(['"', '`']) {
        let (value, after) = quoted(rest).map_err(|e| malformed(&e))?;
        if !after.trim().is_empty() {
            return Err(malformed("unexpected text after the operand"));
        }
        value
    } else if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err(malformed("expected one operand, e.g. \"value\""));
    } else {
        rest.to_string()
    };
    let number = || {
        operand
            .parse::<i64>()
            .map_err(|_| malformed(&format!("{target} needs a number, not {operand:?}")))
    };
    Ok(match target {
        "ver" | "version" => Compare::version(key, op, number()?),
        "c" | "create" => Compare::create_revision(key, op, number()?),
        "m" | "mod" => Compare::mod_revision(key, op, number()?),
        "val" | "value" => Compare::value(key, op, operand),
        "lease" => Compare::lease(
            key,
            op,
            parse_lease_id(&operand).map_err(|e| malformed(&e))?,
        ),
        other => return Err(malformed(&format!("unknown target {other}"))),
    })
}

/// A `put`, `get` or `del` line with its flags.
fn parse_request(line: &str) -> Result<TxnOp, CliError> {
    let invalid = |why: &str| CliError::new(format!("invalid txn request: {line} ({why})"));
    let args = split_args(line).map_err(|e| invalid(&e))?;
    let parsed = RequestLine::try_parse_from(&args).map_err(|e| {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        invalid(first.strip_prefix("error: ").unwrap_or(first))
    })?;
    Ok(match parsed {
        RequestLine::Put(op) => op.resolve(None)?.into_txn_op(),
        RequestLine::Get(op) => op.into_txn_op(),
        RequestLine::Del(op) => op.into_txn_op(),
    })
}

/// A quoted string at the start of `s` (Go syntax: "..." with escapes, or `...` raw),
/// and what follows it.
fn quoted(s: &str) -> Result<(String, &str), String> {
    let mut chars = s.char_indices();
    match chars.next() {
        Some((_, '`')) => {
            let body = &s[1..];
            let end = body.find('`').ok_or("unterminated `string`")?;
            Ok((body[..end].to_string(), &body[end + 1..]))
        }
        Some((_, '"')) => {
            let mut out = String::new();
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => return Ok((out, &s[i + 1..])),
                    '\\' => {
                        let (_, e) = chars.next().ok_or("unterminated \"string\"")?;
                        out.push(unescape(e)?);
                    }
                    c => out.push(c),
                }
            }
            Err("unterminated \"string\"".into())
        }
        _ => Err("expected a quoted string".into()),
    }
}

fn unescape(c: char) -> Result<char, String> {
    Ok(match c {
        'n' => '\n',
        't' => '\t',
        'r' => '\r',
        '0' => '\0',
        '\\' | '"' | '\'' | '`' => c,
        other => return Err(format!("unknown escape \\{other}")),
    })
}

/// Splits a request line into arguments as a shell would: whitespace separates, "..."
/// (with escapes) and '...' quote.
fn split_args(line: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(arg) = current.take() {
                    args.push(arg);
                }
            }
            '"' => {
                let arg = current.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => arg.push(unescape(chars.next().ok_or("dangling \\")?)?),
                        Some(c) => arg.push(c),
                        None => return Err("unterminated \"".into()),
                    }
                }
            }
            '\'' => {
                let arg = current.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => arg.push(c),
                        None => return Err("unterminated '".into()),
                    }
                }
            }
            '\\' => {
                let next = chars.next().ok_or("dangling \\")?;
                current.get_or_insert_with(String::new).push(next);
            }
            c => current.get_or_insert_with(String::new).push(c),
        }
    }
    args.extend(current);
    Ok(args)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use oncekv_client::{DeleteOptions, GetOptions, PutOptions};

    fn parse_text(text: &str) -> Result<Txn, CliError> {
        let mut input = text.as_bytes();
        parse(&mut input, false)
    }

    // The format etcdctl users already write must mean the same transaction here.
    #[test]
    fn etcdctls_txn_format_parses_into_compares_and_branches() {
        let txn = parse_text(
            "value(\"greeting\") = \"hello\"\nmod(\"counter\") > \"0\"\n\
             lease(\"l\") != \"2a\"\n\n\
             put outcome yes\nget \"a b\" --prefix\n\n\
             put outcome no --prev-kv\ndel k --from-key\n\n",
        )
        .unwrap();
        assert_eq!(
            txn.compares,
            vec![
                Compare::value("greeting", CompareOp::Equal, "hello"),
                Compare::mod_revision("counter", CompareOp::Greater, 0),
                Compare::lease("l", CompareOp::NotEqual, 0x2a),
            ]
        );
        assert_eq!(
            txn.success,
            vec![
                TxnOp::put("outcome", "yes", PutOptions::new()),
                TxnOp::get("a b", GetOptions::new().with_prefix()),
            ]
        );
        assert_eq!(
            txn.failure,
            vec![
                TxnOp::put("outcome", "no", PutOptions::new().with_prev_kv()),
                TxnOp::delete("k", DeleteOptions::new().with_from_key()),
            ]
        );
    }

    // etcdctl demands a closing blank line; a missing one only ends the input here.
    #[test]
    fn the_end_of_input_closes_the_open_section() {
        let txn = parse_text("ver(\"k\") = \"0\"\n\nput k v").unwrap();
        assert_eq!(txn.success, vec![TxnOp::put("k", "v", PutOptions::new())]);
        assert!(txn.failure.is_empty());
        let txn = parse_text("").unwrap();
        assert!(txn.compares.is_empty() && txn.success.is_empty());
    }

    #[test]
    fn bad_lines_are_refused_with_the_line() {
        for (text, want) in [
            ("valu(\"k\") = \"v\"\n", "unknown target valu"),
            ("value(k) = \"v\"\n", "malformed comparison"),
            ("mod(\"k\") > \"x\"\n", "needs a number"),
            ("value(\"k\") ~ \"v\"\n", "unknown operator"),
            ("\nfoo k\n", "invalid txn request: foo k"),
            ("\nput k\n", "put needs a key and a value"),
            ("\nput \"k v\n", "unterminated"),
        ] {
            let err = parse_text(text).unwrap_err().message;
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn request_lines_split_like_a_shell() {
        assert_eq!(
            split_args(r#"put "a b" 'c d' e\ f "x\ty""#).unwrap(),
            ["put", "a b", "c d", "e f", "x\ty"]
        );
        assert_eq!(split_args("put k \"\"").unwrap(), ["put", "k", ""]);
    }
}
