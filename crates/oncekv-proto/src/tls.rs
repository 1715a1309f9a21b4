//! TLS for the connections clients and members open: which servers to trust, which
//! certificate to present, and a [`Connector`](crate::net::Connector) that dials TCP and
//! then TLS.
//!
//! rustls with the ring provider: no OpenSSL, and nothing to build with cmake. Channels
//! are always given `http://` URLs (tonic then leaves the byte stream to the connector),
//! and the connector decides from its configuration whether to speak TLS.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Where a bundle of system CA certificates usually is (Debian's ca-certificates): what
/// an `https://` endpoint is checked against when no CA file is given, as etcdctl does.
const SYSTEM_CA_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// A certificate, key or CA file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("{path}: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("no trusted CA: give a CA file (--cacert) or skip verification")]
    NoTrustedCa,
    #[error("a client certificate needs both a certificate file and a key file")]
    HalfIdentity,
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{path} holds no certificate revocation list (PEM \"X509 CRL\" or DER)")]
    NoCrl { path: PathBuf },
    #[error("--cipher-suites: {0}")]
    CipherSuite(String),
}

/// The cipher suites etcd's `--cipher-suites` may name (Go's names) that rustls
/// implements: for TLS 1.2, ECDHE key exchange with AES-GCM or ChaCha20-Poly1305 (Go's
/// others, CBC, RSA key exchange, 3DES and RC4, are refused by name); and TLS 1.3's three.
const SUITES: [(&str, rustls::CipherSuite); 9] = {
    use rustls::CipherSuite as S;
    [
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
            S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        ("TLS_AES_128_GCM_SHA256", S::TLS13_AES_128_GCM_SHA256),
        ("TLS_AES_256_GCM_SHA384", S::TLS13_AES_256_GCM_SHA384),
        (
            "TLS_CHACHA20_POLY1305_SHA256",
            S::TLS13_CHACHA20_POLY1305_SHA256,
        ),
    ]
};

/// The crypto provider for etcd's `--cipher-suites` list (empty: every suite). As in Go,
/// which etcd is written in, the list restricts TLS 1.2; TLS 1.3's suites stay on unless
/// the list names some of them (`TLS_AES_128_GCM_SHA256`...), then only those. A name
/// that is not a suite oncekv can offer is an error.
pub fn provider_for_suites(names: &[String]) -> Result<Arc<CryptoProvider>, TlsError> {
    let base = rustls::crypto::ring::default_provider();
    let is_tls13 = |s: &rustls::SupportedCipherSuite| s.version() == &rustls::version::TLS13;
    let mut chosen = Vec::new();
    for given in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        // Go knows the TLS 1.2 ChaCha20 suites with and without the trailing _SHA256.
        let wanted = SUITES
            .iter()
            .find(|(go, _)| *go == given || given.strip_suffix("_SHA256") == Some(go))
            .map(|(_, suite)| *suite);
        let found = wanted.and_then(|w| base.cipher_suites.iter().find(|s| s.suite() == w));
        let Some(suite) = found else {
            return Err(TlsError::CipherSuite(format!(
                "{given} is not offered (oncekv offers {})",
                SUITES.map(|(go, _)| go).join(", ")
            )));
        };
        chosen.push(*suite);
    }
    if chosen.is_empty() {
        return Ok(Arc::new(base));
    }
    if !chosen.iter().any(is_tls13) {
        chosen.extend(base.cipher_suites.iter().filter(|s| is_tls13(s)).copied());
    }
    // rustls prefers suites in this order: TLS 1.3's first, as its default list has them.
    chosen.sort_by_key(|s| !is_tls13(s));
    Ok(Arc::new(CryptoProvider {
        cipher_suites: chosen,
        ..base
    }))
}

/// The certificate revocation lists in `path` (etcd's `--client-crl-file`): PEM blocks
/// or one DER list.
pub fn load_crls(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateRevocationListDer<'static>>, TlsError> {
    use rustls::pki_types::CertificateRevocationListDer;
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let pem: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if !pem.is_empty() {
        return Ok(pem);
    }
    // DER: an ASN.1 SEQUENCE.
    if bytes.first() == Some(&0x30) {
        return Ok(vec![CertificateRevocationListDer::from(bytes)]);
    }
    Err(TlsError::NoCrl {
        path: path.to_path_buf(),
    })
}

/// The crypto every oncekv TLS configuration uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file at `path`.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key in the PEM file at `path`.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoKey {
        path: path.to_path_buf(),
    })
}

/// The CA certificates in `path` as a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// How a client (or a member dialing its peers) speaks TLS: etcdctl's `--cacert`,
/// `--cert`, `--key` and `--insecure-skip-tls-verify`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsOptions {
    /// The CA that signs the servers' certificates; the system's bundle when `None`.
    pub ca_file: Option<PathBuf>,
    /// A certificate and key to present (servers with `--client-cert-auth` require one).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Accept any server certificate (etcd's auto-TLS certificates are self-signed).
    pub insecure_skip_verify: bool,
}

impl ClientTlsOptions {
    /// The rustls configuration these options describe, files read now.
    pub fn build(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = if self.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider())))
        } else {
            let roots = match &self.ca_file {
                Some(path) => load_roots(path)?,
                None => system_roots()?,
            };
            builder.with_root_certificates(roots)
        };
        let mut config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                builder.with_client_auth_cert(load_certs(cert)?, load_key(key)?)?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(TlsError::HalfIdentity),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

fn system_roots() -> Result<RootCertStore, TlsError> {
    for bundle in SYSTEM_CA_BUNDLES {
        let path = Path::new(bundle);
        if path.exists() {
            let mut roots = RootCertStore::empty();
            // A bundle may hold certificates webpki cannot parse; the rest still count.
            let (added, _ignored) = roots.add_parsable_certificates(load_certs(path)?);
            if added > 0 {
                return Ok(roots);
            }
        }
    }
    Err(TlsError::NoTrustedCa)
}

/// The name a server's certificate must carry for `host` (an IP address or a DNS name).
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is not a valid TLS server name: {e}"),
        )
    })
}

/// Accepts every server certificate while still checking that the server holds its key
/// (the handshake's signatures): `--insecure-skip-tls-verify`, and members under
/// `--peer-auto-tls`, whose certificates are self-signed.
struct AcceptAnyServer(Arc<CryptoProvider>);

impl fmt::Debug for AcceptAnyServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcceptAnyServer")
    }
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(names: &[&str]) -> Result<Vec<rustls::CipherSuite>, TlsError> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        Ok(provider_for_suites(&names)?
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect())
    }

    #[test]
    fn etcds_cipher_suite_names_restrict_tls12_and_keep_tls13() -> Result<(), TlsError> {
        let all = rustls::crypto::ring::default_provider().cipher_suites.len();
        assert_eq!(suites(&[])?.len(), all);
        let chosen = suites(&[
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        ])?;
        assert!(chosen.contains(&rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert!(
            chosen.contains(&rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
        );
        assert!(!chosen.contains(&rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384));
        // TLS 1.3 stays whole, as in Go, unless its suites are named.
        assert!(chosen.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
        let only13 = suites(&["TLS_AES_128_GCM_SHA256"])?;
        assert!(only13.contains(&rustls::CipherSuite::TLS13_AES_128_GCM_SHA256));
        assert!(!only13.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
        let refused = suites(&["TLS_RSA_WITH_AES_128_CBC_SHA"]).map(|_| ());
        assert!(
            matches!(&refused, Err(TlsError::CipherSuite(m)) if m.contains("TLS_RSA_WITH_AES_128_CBC_SHA")),
            "{refused:?}"
        );
        Ok(())
    }
}
