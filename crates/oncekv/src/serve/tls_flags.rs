//! etcd's TLS flags of `serve`, for the client and the peer port, and their checks: each
//! error names the flag to fix.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use oncekv_server::NodeConfig;

/// etcd's TLS flags, for the client port and (`--peer-`) the peer port.
#[derive(Debug, Args, Clone, Default)]
pub struct TlsArgs {
    /// The client port's certificate (PEM); re-read when the file changes.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// The client port's private key (PEM).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The CA that signs client certificates (with --client-cert-auth, required of every
    /// client; a certificate's common name authenticates it as that user).
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// Refuse clients without a certificate signed by --trusted-ca-file.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub client_cert_auth: bool,
    /// Serve clients with a self-signed certificate made in DATA_DIR/fixtures/client
    /// (clients must then skip verification: etcdctl --insecure-skip-tls-verify).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub auto_tls: bool,
    /// The peer port's certificate (PEM), also presented when dialing peers.
    #[arg(long)]
    pub peer_cert_file: Option<PathBuf>,
    /// The peer port's private key (PEM).
    #[arg(long)]
    pub peer_key_file: Option<PathBuf>,
    /// The CA that signs every member's peer certificate: peers are checked against it
    /// both ways.
    #[arg(long)]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Refuse peer connections without a certificate signed by --peer-trusted-ca-file.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub peer_client_cert_auth: bool,
    /// Serve and dial peers with a self-signed certificate made in DATA_DIR/fixtures/peer
    /// (encrypts peer traffic but authenticates no one: peers skip verification).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub peer_auto_tls: bool,
    /// Serve only peers whose certificate's common name is this (with
    /// --peer-client-cert-auth: the certificate must also be signed by
    /// --peer-trusted-ca-file). Refused connections are logged.
    #[arg(long)]
    pub peer_cert_allowed_cn: Option<String>,
    /// Serve only peers whose certificate (signed by --peer-trusted-ca-file) is valid for
    /// this host name or IP address (its subject alternative names; needs
    /// --peer-client-cert-auth; not with --peer-cert-allowed-cn).
    #[arg(long)]
    pub peer_cert_allowed_hostname: Option<String>,
    /// Serve only clients whose certificate is valid for this host name or IP address
    /// (needs --client-cert-auth).
    #[arg(long)]
    pub client_cert_allowed_hostname: Option<String>,
    /// Certificate revocation list (PEM or DER): clients presenting a certificate it
    /// lists are refused. Re-read when the file changes.
    #[arg(long)]
    pub client_crl_file: Option<PathBuf>,
    /// Certificate revocation list for peers' certificates.
    #[arg(long)]
    pub peer_crl_file: Option<PathBuf>,
    /// TLS 1.2 cipher suites both ports offer, comma separated, by Go's names (etcd's
    /// list, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256): ECDHE with AES-GCM or
    /// ChaCha20-Poly1305. As in etcd, TLS 1.3 stays on with its own suites. [default: all]
    #[arg(long)]
    pub cipher_suites: Option<String>,
}

impl TlsArgs {
    /// The TLS settings for both ports; `client_https` / `peer_https`: whether the listen
    /// URL asks for TLS.
    pub fn apply(
        &self,
        config: &mut NodeConfig,
        client_https: bool,
        peer_https: bool,
    ) -> Result<(), String> {
        let hosts = |addr: SocketAddr| {
            vec![
                addr.ip().to_string(),
                "127.0.0.1".to_string(),
                "localhost".to_string(),
            ]
        };
        config.client_tls = port_tls(
            "client",
            client_https,
            (&self.cert_file, &self.key_file),
            &self.trusted_ca_file,
            self.client_cert_auth,
            self.auto_tls.then(|| {
                (
                    config.data_dir.join("fixtures/client"),
                    hosts(config.client_addr),
                )
            }),
        )?;
        config.peer_tls = port_tls(
            "peer",
            peer_https,
            (&self.peer_cert_file, &self.peer_key_file),
            &self.peer_trusted_ca_file,
            self.peer_client_cert_auth,
            self.peer_auto_tls.then(|| {
                (
                    config.data_dir.join("fixtures/peer"),
                    hosts(config.peer_addr),
                )
            }),
        )?;
        let suites: Vec<String> = self
            .cipher_suites
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if !suites.is_empty() {
            // Checked now, so that a misspelt name stops the start with its flag.
            oncekv_proto::tls::provider_for_suites(&suites).map_err(|e| e.to_string())?;
            if config.client_tls.is_none() && config.peer_tls.is_none() {
                return Err("--cipher-suites: neither port serves TLS".into());
            }
        }
        for (port, crl, host, files) in [
            (
                "client",
                &self.client_crl_file,
                &self.client_cert_allowed_hostname,
                config.client_tls.as_mut(),
            ),
            (
                "peer",
                &self.peer_crl_file,
                &self.peer_cert_allowed_hostname,
                config.peer_tls.as_mut(),
            ),
        ] {
            let prefix = if port == "peer" { "peer-" } else { "" };
            let Some(files) = files else {
                if crl.is_some() {
                    return Err(format!("--{port}-crl-file: the {port} port serves no TLS"));
                }
                if host.is_some() {
                    return Err(format!(
                        "--{port}-cert-allowed-hostname: the {port} port serves no TLS"
                    ));
                }
                continue;
            };
            files.cipher_suites = suites.clone();
            files.crl_file = crl.clone();
            if crl.is_some() && files.trusted_ca_file.is_none() {
                return Err(format!(
                    "--{port}-crl-file needs --{prefix}trusted-ca-file: without it no \
                     {port} presents a certificate to check"
                ));
            }
            if host.is_some() && !files.client_cert_auth {
                return Err(format!(
                    "--{port}-cert-allowed-hostname needs --{prefix}client-cert-auth (and \
                     --{prefix}trusted-ca-file): without them no {port} presents a \
                     certificate to check"
                ));
            }
            files.allowed_hostname = host.clone();
        }
        if self.peer_cert_allowed_cn.is_some() && self.peer_cert_allowed_hostname.is_some() {
            return Err(
                "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive"
                    .into(),
            );
        }
        if let Some(cn) = &self.peer_cert_allowed_cn {
            match config.peer_tls.as_mut() {
                Some(files) if files.client_cert_auth => files.allowed_cn = Some(cn.clone()),
                _ => {
                    return Err("--peer-cert-allowed-cn needs --peer-client-cert-auth (and \
                                --peer-trusted-ca-file): without them peers present no \
                                certificate to check"
                        .into());
                }
            }
        }
        Ok(())
    }
}

/// One port's TLS files from its flags; errors name the flag to fix.
fn port_tls(
    port: &str,
    https: bool,
    (cert, key): (&Option<PathBuf>, &Option<PathBuf>),
    trusted_ca: &Option<PathBuf>,
    client_cert_auth: bool,
    auto: Option<(PathBuf, Vec<String>)>,
) -> Result<Option<oncekv_server::tls::TlsFiles>, String> {
    let prefix = if port == "peer" { "peer-" } else { "" };
    let files = match (cert, key, auto) {
        (Some(cert), Some(key), _) => Some(oncekv_server::tls::TlsFiles {
            cert_file: cert.clone(),
            key_file: key.clone(),
            trusted_ca_file: trusted_ca.clone(),
            client_cert_auth,
            ..Default::default()
        }),
        (Some(_), None, _) | (None, Some(_), _) => {
            return Err(format!(
                "--{prefix}cert-file and --{prefix}key-file go together"
            ));
        }
        (None, None, Some((dir, hosts))) => {
            let mut files = oncekv_server::tls::self_signed(&dir, &hosts)
                .map_err(|e| format!("--{prefix}auto-tls in {}: {e}", dir.display()))?;
            files.trusted_ca_file = trusted_ca.clone();
            files.client_cert_auth = client_cert_auth;
            Some(files)
        }
        (None, None, None) => None,
    };
    match (&files, https) {
        (Some(_), false) => Err(format!(
            "TLS is configured for the {port} port but --listen-{port}-urls is http://; use https://"
        )),
        (None, true) => Err(format!(
            "--listen-{port}-urls is https:// but no certificate is given: set \
             --{prefix}cert-file and --{prefix}key-file, or --{prefix}auto-tls"
        )),
        _ => {
            if client_cert_auth && trusted_ca.is_none() {
                return Err(format!(
                    "--{prefix}client-cert-auth needs --{prefix}trusted-ca-file"
                ));
            }
            Ok(files)
        }
    }
}
