//! TLS on a server port (client or peer): the handshake for every accepted connection,
//! certificates re-read when their files change, the client certificate's common name
//! handed to the request handlers, and etcd's `--auto-tls` self-signed certificates.
//!
//! Handshakes run in their own tasks, each bounded by
//! `conn_guard::FIRST_BYTES_TIMEOUT`: a client that stalls
//! mid-handshake holds its connection slot until then and delays no one else. A
//! plaintext client on a TLS port fails the handshake and is closed.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use oncekv_proto::tls::{
    TlsError, load_certs, load_crls, load_key, load_roots, provider_for_suites,
};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::conn_guard::FIRST_BYTES_TIMEOUT;

mod verify;

pub use verify::NameRule;
use verify::{PortVerifier, common_name};

/// A port's certificate files (etcd's `--cert-file`, `--key-file`, `--trusted-ca-file`,
/// `--client-cert-auth`, or their `--peer-` forms).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA that signs the certificates connecting clients (or peers) present.
    pub trusted_ca_file: Option<PathBuf>,
    /// Refuse connections without a certificate signed by `trusted_ca_file`.
    pub client_cert_auth: bool,
    /// The certificates are self-signed (auto-TLS): a member dialing a peer port so
    /// configured cannot check them against a CA, as with etcd's `--peer-auto-tls`.
    pub self_signed: bool,
    /// Only connections whose certificate (signed by `trusted_ca_file`) has this common
    /// name are served (etcd's `--peer-cert-allowed-cn`).
    pub allowed_cn: Option<String>,
    /// Only connections whose certificate (signed by `trusted_ca_file`) is valid for this
    /// host name or IP address by its subject alternative names are served (etcd's
    /// `--peer-cert-allowed-hostname`, `--client-cert-allowed-hostname`).
    pub allowed_hostname: Option<String>,
    /// Revoked certificates (etcd's `--client-crl-file`, `--peer-crl-file`): a connection
    /// presenting one is refused. Re-read when the file changes, like the certificates.
    pub crl_file: Option<PathBuf>,
    /// etcd's `--cipher-suites` (Go's names); empty: every suite rustls offers.
    pub cipher_suites: Vec<String>,
}

/// Each file's modification time and length, `None` if it cannot be read: a change in
/// any means the configuration is to be rebuilt.
type Stamp = Vec<Option<(SystemTime, u64)>>;

impl TlsFiles {
    fn stamp(&self) -> Stamp {
        let mut paths = vec![&self.cert_file, &self.key_file];
        paths.extend(self.trusted_ca_file.as_ref());
        paths.extend(self.crl_file.as_ref());
        paths
            .into_iter()
            .map(|p| {
                let meta = std::fs::metadata(p).ok()?;
                Some((meta.modified().ok()?, meta.len()))
            })
            .collect()
    }

    fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = provider_for_suites(&self.cipher_suites)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.trusted_ca_file {
            Some(ca) => {
                let roots = Arc::new(load_roots(ca)?);
                let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
                if let Some(crl) = &self.crl_file {
                    // As etcd checks a CRL: the presented certificate itself, and a
                    // certificate the list does not cover is not refused for that.
                    verifier = verifier
                        .with_crls(load_crls(crl)?)
                        .only_check_end_entity_revocation()
                        .allow_unknown_revocation_status();
                }
                let verifier = if self.client_cert_auth {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                let verifier = verifier.build().map_err(|e| TlsError::BadCertificate {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
                let trusted = match &self.crl_file {
                    Some(_) => Vec::new(),
                    None => load_certs(ca)?,
                };
                let verifier = Arc::new(PortVerifier {
                    inner: verifier,
                    trusted,
                    rule: NameRule::of(self),
                });
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_single_cert(load_certs(&self.cert_file)?, load_key(&self.key_file)?)?;
        // gRPC over HTTP/2, and HTTP/1.1 for curl on /metrics and /health.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A port's TLS configuration, rebuilt when one of its files changes (checked at every
/// handshake, as etcd re-reads its certificates; a stat per file is cheap next to a
/// handshake). A change that does not load (a key written before its certificate) keeps
/// the previous configuration, logged, until the files load again.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: Mutex<(Stamp, Arc<ServerConfig>)>,
}

impl ServerTls {
    /// Loads `files` now: a server with unusable certificates does not start.
    pub fn new(files: TlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let stamp = files.stamp();
        let config = files.server_config()?;
        Ok(Arc::new(ServerTls {
            files,
            current: Mutex::new((stamp, config)),
        }))
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        let stamp = self.files.stamp();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.0 != stamp {
            match self.files.server_config() {
                Ok(config) => {
                    tracing::info!(cert = %self.files.cert_file.display(), "reloaded TLS certificates");
                    *current = (stamp, config);
                }
                Err(e) => {
                    tracing::warn!(
                        "TLS files changed but do not load ({e}); keeping the previous ones"
                    );
                    // Not retried at every handshake until the files change again.
                    current.0 = stamp;
                }
            }
        }
        current.1.clone()
    }
}

/// `e` as a member logs it: a TLS alert the other side sent in Go's words, as etcd's
/// members log it ("remote error: tls: bad certificate"), anything else as it is.
pub fn describe_io_error(e: &io::Error) -> String {
    use rustls::AlertDescription as A;
    let Some(rustls::Error::AlertReceived(alert)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return e.to_string();
    };
    let go = match alert {
        A::BadCertificate => "bad certificate",
        A::UnknownCA => "unknown certificate authority",
        A::CertificateExpired => "expired certificate",
        A::CertificateRevoked => "revoked certificate",
        A::CertificateUnknown => "unknown certificate",
        A::UnsupportedCertificate => "unsupported certificate",
        A::CertificateRequired => "certificate required",
        A::AccessDenied => "access denied",
        A::HandshakeFailure => "handshake failure",
        A::ProtocolVersion => "protocol version not supported",
        other => return format!("remote error: tls: {other:?}"),
    };
    format!("remote error: tls: {go}")
}

/// What the request handlers learn about a connection: the common name of the client's
/// certificate, if it presented one the port's CA signed (etcd's `--client-cert-auth`
/// user).
#[derive(Debug, Clone, Default)]
pub struct CertIdentity {
    pub common_name: Option<Arc<str>>,
}

/// A connection that is either plaintext or TLS.
#[derive(Debug)]
pub enum MaybeTls<IO> {
    Plain(IO),
    Tls(Box<TlsStream<IO>>, CertIdentity),
}

/// `incoming`'s connections through TLS when `tls` is given, as they are otherwise.
pub fn accept<S, IO>(
    incoming: S,
    tls: Option<Arc<ServerTls>>,
) -> Pin<Box<dyn futures::Stream<Item = io::Result<MaybeTls<IO>>> + Send>>
where
    S: futures::Stream<Item = io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use futures::StreamExt;
    let Some(tls) = tls else {
        return Box::pin(incoming.map(|conn| conn.map(MaybeTls::Plain)));
    };
    // Handshakes finish in any order; the server sees connections as they complete.
    crate::conn_guard::prepare_each(incoming, move |io| {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        async move {
            match tokio::time::timeout(FIRST_BYTES_TIMEOUT, acceptor.accept(io)).await {
                Ok(Ok(stream)) => {
                    let cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first());
                    // The names a port allows were checked in the handshake
                    // (`verify::PortVerifier`).
                    let identity = CertIdentity {
                        common_name: cert.and_then(|cert| common_name(cert)),
                    };
                    Some(MaybeTls::Tls(Box::new(stream), identity))
                }
                Ok(Err(e)) => {
                    tracing::debug!("TLS handshake failed: {e}");
                    None
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    None
                }
            }
        }
    })
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(io) => Pin::new(io).poll_read(cx, buf),
            MaybeTls::Tls(io, _) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(io) => Pin::new(io).poll_write(cx, buf),
            MaybeTls::Tls(io, _) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(io) => Pin::new(io).poll_flush(cx),
            MaybeTls::Tls(io, _) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(io) => Pin::new(io).poll_shutdown(cx),
            MaybeTls::Tls(io, _) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(io, _) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(io) => io.is_write_vectored(),
            MaybeTls::Tls(io, _) => io.is_write_vectored(),
        }
    }
}

impl<IO> Connected for MaybeTls<IO> {
    type ConnectInfo = CertIdentity;

    fn connect_info(&self) -> CertIdentity {
        match self {
            MaybeTls::Plain(_) => CertIdentity::default(),
            MaybeTls::Tls(_, identity) => identity.clone(),
        }
    }
}

/// etcd's `--auto-tls` / `--peer-auto-tls`: a self-signed certificate for `hosts` in
/// `dir` (`cert.pem`, `key.pem`), made on first use and kept across restarts.
pub fn self_signed(dir: &Path, hosts: &[String]) -> io::Result<TlsFiles> {
    let files = TlsFiles {
        cert_file: dir.join("cert.pem"),
        key_file: dir.join("key.pem"),
        self_signed: true,
        ..TlsFiles::default()
    };
    if files.cert_file.exists() && files.key_file.exists() {
        return Ok(files);
    }
    let cert = rcgen::generate_simple_self_signed(hosts.to_vec())
        .map_err(|e| io::Error::other(format!("cannot generate a certificate: {e}")))?;
    std::fs::create_dir_all(dir)?;
    write_private(&files.key_file, cert.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&files.cert_file, cert.cert.pem())?;
    Ok(files)
}

/// Writes a file only its owner can read (private keys).
pub fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// A throw-away certificate authority and the certificates a local cluster needs (`oncekv
/// dev --tls`, and tests): one server certificate for 127.0.0.1 / localhost that every
/// member uses on both ports (it dials its peers with it too), and one client certificate
/// per user name (the common name, for `--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct DevPki {
    pub ca_file: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// `(user, certificate, key)`.
    pub clients: Vec<(String, PathBuf, PathBuf)>,
    /// The authority's revocation list (`crl.pem`), listing the certificates of the users
    /// given to [`DevPki::create_revoking`] (none for [`DevPki::create`]).
    pub crl_file: PathBuf,
}

impl DevPki {
    /// Writes a new authority and its certificates into `dir`.
    pub fn create(dir: &Path, users: &[&str]) -> io::Result<DevPki> {
        DevPki::create_revoking(dir, users, &[])
    }

    /// [`DevPki::create`], with the certificates of `revoked` (some of `users`) on the
    /// authority's revocation list.
    pub fn create_revoking(dir: &Path, users: &[&str], revoked: &[&str]) -> io::Result<DevPki> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
            ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
            RevokedCertParams, SerialNumber,
        };
        let failed = |e: rcgen::Error| io::Error::other(format!("making certificates: {e}"));
        std::fs::create_dir_all(dir)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "oncekv throw-away CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(failed)?;
        let ca_cert = ca.self_signed(&ca_key).map_err(failed)?;
        let issuer = Issuer::new(ca, ca_key);
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem())?;

        // Serial numbers are the certificates' order of making, so the list can name them.
        let serial = std::cell::Cell::new(1u64);
        let leaf = |sans: Vec<String>, cn: &str, name: &str| -> io::Result<(PathBuf, PathBuf)> {
            let mut params = CertificateParams::new(sans).map_err(failed)?;
            serial.set(serial.get() + 1);
            params.serial_number = Some(SerialNumber::from(serial.get()));
            params.distinguished_name.push(DnType::CommonName, cn);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate().map_err(failed)?;
            let cert = params.signed_by(&key, &issuer).map_err(failed)?;
            let (cert_file, key_file) = (
                dir.join(format!("{name}.pem")),
                dir.join(format!("{name}-key.pem")),
            );
            std::fs::write(&cert_file, cert.pem())?;
            write_private(&key_file, key.serialize_pem().as_bytes())?;
            Ok((cert_file, key_file))
        };
        let hosts = ["127.0.0.1", "localhost", "::1"].map(String::from).to_vec();
        let (server_cert, server_key) = leaf(hosts, "oncekv member", "server")?;
        let mut clients = Vec::new();
        let mut revoked_certs = Vec::new();
        for user in users {
            let (cert, key) = leaf(Vec::new(), user, &format!("client-{user}"))?;
            clients.push((user.to_string(), cert, key));
            if revoked.contains(user) {
                revoked_certs.push(RevokedCertParams {
                    serial_number: SerialNumber::from(serial.get()),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                });
            }
        }
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&issuer)
        .map_err(failed)?;
        let crl_file = dir.join("crl.pem");
        std::fs::write(&crl_file, crl.pem().map_err(failed)?)?;
        Ok(DevPki {
            ca_file,
            server_cert,
            server_key,
            clients,
            crl_file,
        })
    }

    /// Both ports' TLS for a member: certificates from this authority required of peers,
    /// and of clients too when `client_cert_auth`.
    pub fn member_tls(&self, client_cert_auth: bool) -> (TlsFiles, TlsFiles) {
        let files = |client_cert_auth| TlsFiles {
            cert_file: self.server_cert.clone(),
            key_file: self.server_key.clone(),
            trusted_ca_file: Some(self.ca_file.clone()),
            client_cert_auth,
            ..TlsFiles::default()
        };
        (files(client_cert_auth), files(true))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::verify::{dns_name_matches, names_host};
    use super::*;

    #[test]
    fn an_alert_the_other_side_sent_reads_as_etcds_members_log_it() {
        let alert = |a| io::Error::new(io::ErrorKind::InvalidData, rustls::Error::AlertReceived(a));
        assert_eq!(
            describe_io_error(&alert(rustls::AlertDescription::BadCertificate)),
            "remote error: tls: bad certificate"
        );
        assert_eq!(
            describe_io_error(&alert(rustls::AlertDescription::UnknownCA)),
            "remote error: tls: unknown certificate authority"
        );
        let plain = io::Error::new(io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(describe_io_error(&plain), "refused");
    }

    #[test]
    fn allowed_host_names_match_subject_alternative_names() {
        assert!(dns_name_matches(
            "Member1.Example.com",
            "member1.example.com."
        ));
        assert!(dns_name_matches("*.example.com", "m1.example.com"));
        assert!(!dns_name_matches("*.example.com", "a.m1.example.com"));
        assert!(!dns_name_matches("*.example.com", "example.com"));
        assert!(!dns_name_matches("m1.example.com", "m2.example.com"));

        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::create(dir.path(), &["alice"]).unwrap();
        // The member certificate names 127.0.0.1, localhost and ::1; alice's names none.
        let member = load_certs(&pki.server_cert).unwrap().remove(0);
        let alice = load_certs(&pki.clients[0].1).unwrap().remove(0);
        for host in ["localhost", "LOCALHOST", "127.0.0.1", "::1"] {
            assert!(names_host(&member, host), "{host}");
        }
        for host in ["127.0.0.2", "example.com", "oncekv member"] {
            assert!(!names_host(&member, host), "{host}");
        }
        assert!(!names_host(&alice, "alice"));
        assert!(!names_host(b"not a certificate", "localhost"));
    }

    /// A self-signed CA certificate (common name `cn`) and its key, as PEM files in `dir`.
    fn self_signed_ca(dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_file, key_file) = (
            dir.join(format!("{cn}.pem")),
            dir.join(format!("{cn}-key.pem")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    /// Whether a client presenting `client` (certificate and key files) completes a
    /// handshake with a server configured by `files`.
    async fn handshake(files: &TlsFiles, client: (&Path, &Path)) -> bool {
        let server = ServerTls::new(files.clone()).unwrap().config();
        // The server's certificate is signed by the first certificate of the CA file.
        let mut roots = rustls::RootCertStore::empty();
        let trusted = files.trusted_ca_file.as_ref().unwrap();
        roots.add(load_certs(trusted).unwrap().remove(0)).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(load_certs(client.0).unwrap(), load_key(client.1).unwrap())
        .unwrap();
        let (a, b) = tokio::io::duplex(64 << 10);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let (client, server) = tokio::join!(
            async {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = connector.connect(name, a).await?;
                s.write_all(b"ping").await?;
                // TLS 1.3 refuses a client certificate after the client's handshake ends:
                // a reply proves the server took it.
                let mut reply = [0u8; 4];
                s.read_exact(&mut reply).await.map(|_| reply)
            },
            async {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = acceptor.accept(b).await?;
                let mut got = [0u8; 4];
                s.read_exact(&mut got).await?;
                s.write_all(b"pong").await?;
                s.flush().await
            }
        );
        client.is_ok_and(|reply| &reply == b"pong") && server.is_ok()
    }

    #[tokio::test]
    async fn a_trusted_self_signed_certificate_is_accepted_as_the_client_s_own() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::create(&dir.path().join("pki"), &[]).unwrap();
        // A self-signed CA certificate among the trusted ones, presented by the client as
        // its own (etcd's tests do so with one whose common name is "root").
        let (cert, key) = self_signed_ca(dir.path(), "root");
        let (other_cert, other_key) = self_signed_ca(dir.path(), "mallory");
        let trusted = dir.path().join("trusted.pem");
        let both = [pki.ca_file.as_path(), cert.as_path()].map(|f| std::fs::read(f).unwrap());
        std::fs::write(&trusted, both.concat()).unwrap();
        let files = TlsFiles {
            cert_file: pki.server_cert.clone(),
            key_file: pki.server_key.clone(),
            trusted_ca_file: Some(trusted),
            client_cert_auth: true,
            ..TlsFiles::default()
        };
        assert!(
            handshake(&files, (&cert, &key)).await,
            "the trusted certificate itself"
        );
        assert!(
            !handshake(&files, (&other_cert, &other_key)).await,
            "a self-signed certificate the server does not trust"
        );
    }
}
