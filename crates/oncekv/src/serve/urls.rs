//! The URL flags of `serve` (and `snapshot restore`): listen URLs to socket addresses,
//! `--initial-cluster` to members, and the advertised peer URL checked against it.

use std::net::SocketAddr;
use std::path::PathBuf;

use oncekv_server::Member;

/// `http://127.0.0.1:2379` (or `https://`) → its socket address. `localhost` is
/// 127.0.0.1 (etcd's default URLs use it); other host names are not resolved, as etcd
/// refuses domain names for binding.
pub fn parse_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?}: only http:// and https:// URLs are supported"))?;
    let host_port = rest.trim_end_matches('/');
    let host_port = match host_port.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => host_port.to_string(),
    };
    host_port
        .parse()
        .map_err(|_| format!("{url:?}: expected http://IP:PORT (host names are not resolved)"))
}

/// etcd's `--listen-client-urls`: one or more URLs, comma separated, all `http://` or all
/// `https://` (a port's TLS settings apply to every listener).
pub fn parse_listen_urls(flag: &str, urls: &str) -> Result<Vec<SocketAddr>, String> {
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let https = urls.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != urls.len() {
        return Err(format!(
            "--{flag} mixes http:// and https:// URLs; oncekv serves one scheme per port"
        ));
    }
    if urls.is_empty() {
        return Err(format!("--{flag} is empty"));
    }
    urls.into_iter().map(parse_url).collect()
}

/// etcd's `--listen-peer-urls`: [`parse_listen_urls`]'s TCP addresses, and unix sockets
/// (`unix://etcd.unix:1`: etcd's form, the host and port together are the socket's path).
pub fn parse_peer_listen_urls(urls: &str) -> Result<(Vec<SocketAddr>, Vec<PathBuf>), String> {
    let mut unix = Vec::new();
    let mut tcp = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if url.starts_with("unixs://") {
            return Err(format!(
                "--listen-peer-urls {url:?}: TLS on a unix socket is not supported; use \
                 unix:// or https://"
            ));
        }
        match url.strip_prefix("unix://") {
            Some(path) if !path.trim_end_matches('/').is_empty() => {
                unix.push(PathBuf::from(path.trim_end_matches('/')))
            }
            Some(_) => return Err(format!("--listen-peer-urls {url:?}: no socket path")),
            None => tcp.push(url),
        }
    }
    let tcp = match tcp.is_empty() {
        true => Vec::new(),
        false => parse_listen_urls("listen-peer-urls", &tcp.join(","))?,
    };
    Ok((tcp, unix))
}

/// `n1=http://a:2380,n2=http://b:2380` → members (client URLs unknown).
pub fn parse_initial_cluster(s: &str) -> Result<Vec<Member>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|part| {
            let (name, url) = part
                .split_once('=')
                .ok_or_else(|| format!("--initial-cluster entry {part:?} is not name=url"))?;
            // A unix socket (etcd's `unix://PATH`) names no address to check.
            if !url.trim().starts_with("unix://") {
                parse_url(url)?;
            }
            Ok(Member {
                name: name.trim().to_string(),
                peer_url: url.trim().to_string(),
                client_url: String::new(),
            })
        })
        .collect()
}

/// etcd's check of `--initial-advertise-peer-urls` against `name`'s entry in
/// `--initial-cluster`: the entry is how the other members reach this one, so the two
/// must agree (oncekv: exactly one URL).
pub fn check_advertised_peer_url(name: &str, members: &[Member], urls: &str) -> Result<(), String> {
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let listed = members
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.peer_url.trim_end_matches('/'))
        .ok_or_else(|| {
            format!("couldn't find local name {name:?} in the initial cluster configuration")
        })?;
    match urls.as_slice() {
        [url] if url.trim_end_matches('/') == listed => Ok(()),
        [] => Err("--initial-advertise-peer-urls is empty".into()),
        [_] => Err(format!(
            "--initial-cluster has {name}={listed} but missing from --initial-advertise-peer-urls={}",
            urls.join(",")
        )),
        _ => Err(format!(
            "--initial-advertise-peer-urls={}: oncekv serves one peer URL per member",
            urls.join(",")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_may_be_unix_sockets_as_etcd_writes_them() {
        let (tcp, unix) =
            parse_peer_listen_urls("http://127.0.0.1:2380, unix://etcd.unix:1").expect("parses");
        assert_eq!(tcp, vec!["127.0.0.1:2380".parse().expect("addr")]);
        assert_eq!(unix, vec![PathBuf::from("etcd.unix:1")]);
        assert!(parse_peer_listen_urls("unixs://etcd.unix:1").is_err());
        assert!(parse_peer_listen_urls("unix://").is_err());
        let members = parse_initial_cluster("e1=unix://etcd.unix:1").expect("parses");
        assert_eq!(members[0].peer_url, "unix://etcd.unix:1");
    }
}
