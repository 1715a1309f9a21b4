//! Checks of the certificate a connecting client or peer presents, beyond what webpki's
//! chain check does: a trusted certificate presented as itself (as Go accepts), and the
//! names a port allows (etcd's `--peer-cert-allowed-cn`, `--*-cert-allowed-hostname`).
//!
//! Both run inside the handshake, so a refused certificate is answered with a TLS alert
//! (`bad certificate`, as Go's server sends): the other side learns why, in the words
//! etcd's members log ("remote error: tls: bad certificate"), and this side logs the
//! refusal as etcd does ("client certificate authentication failed").

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// Whether a DER certificate is valid for `host` by its subject alternative names: an IP
/// address equal to it, or a DNS name equal to it (ignoring case) or matching it by a
/// leading `*.` wildcard for one label. As Go checks a host name, the common name is not
/// consulted.
pub(super) fn names_host(cert: &[u8], host: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return false;
    };
    let ip: Option<std::net::IpAddr> = host.parse().ok();
    san.value.general_names.iter().any(|name| match (name, ip) {
        (GeneralName::DNSName(dns), None) => dns_name_matches(dns, host),
        (GeneralName::IPAddress(bytes), Some(std::net::IpAddr::V4(ip))) => {
            *bytes == ip.octets().as_slice()
        }
        (GeneralName::IPAddress(bytes), Some(std::net::IpAddr::V6(ip))) => {
            *bytes == ip.octets().as_slice()
        }
        _ => false,
    })
}

pub(super) fn dns_name_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

/// The client certificate verifier of a port with a CA: webpki's chain check (`inner`),
/// with two additions.
///
/// - A certificate which is itself one of the trusted CA certificates, byte for byte,
///   within its validity period, is accepted: a self-signed certificate given both as the
///   CA (`--trusted-ca-file`) and as the client's own (`--cert`). Go's TLS, and so etcd,
///   accepts that chain of one; webpki refuses a CA certificate presented by an end
///   entity. The handshake still proves the client holds its key (the signatures are
///   checked by `inner`).
/// - The port's [`NameRule`], if it has one, refuses a certificate whose names it does
///   not allow.
#[derive(Debug)]
pub(super) struct PortVerifier {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    /// Accepted as themselves (none with a revocation list: it applies to the chain webpki
    /// checks).
    pub(super) trusted: Vec<CertificateDer<'static>>,
    pub(super) rule: Option<NameRule>,
}

impl ClientCertVerifier for PortVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => verified,
            Err(refused) => {
                let trusted = self
                    .trusted
                    .iter()
                    .any(|c| c.as_ref() == end_entity.as_ref());
                if !(trusted && valid_at(end_entity, now)) {
                    return Err(refused);
                }
                ClientCertVerified::assertion()
            }
        };
        if let Some(why) = self.rule.as_ref().and_then(|r| r.refuses(end_entity)) {
            tracing::warn!(
                common_name = common_name(end_entity).as_deref().unwrap_or("(none)"),
                "rejected connection: {why}"
            );
            // Sent as the alert `bad certificate`.
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether a DER certificate's validity period includes `now`.
fn valid_at(cert: &[u8], now: UnixTime) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    x509_parser::time::ASN1Time::from_timestamp(secs)
        .is_ok_and(|at| parsed.validity().is_valid_at(at))
}

/// The subject's common name in a DER certificate.
pub(super) fn common_name(cert: &[u8]) -> Option<Arc<str>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    Some(Arc::from(cn.as_str().ok()?))
}

/// The names a port allows in the certificates of the other side: a common name (etcd's
/// `--peer-cert-allowed-cn`) or a host name or IP address among the subject alternative
/// names (`--peer-cert-allowed-hostname`, `--client-cert-allowed-hostname`).
#[derive(Debug, Clone)]
pub struct NameRule {
    pub common_name: Option<String>,
    pub hostname: Option<String>,
}

impl NameRule {
    /// The rule `files` set, if any.
    pub fn of(files: &super::TlsFiles) -> Option<NameRule> {
        (files.allowed_cn.is_some() || files.allowed_hostname.is_some()).then(|| NameRule {
            common_name: files.allowed_cn.clone(),
            hostname: files.allowed_hostname.clone(),
        })
    }

    /// Why the rule refuses `cert` (DER), if it does, in etcd's words.
    pub fn refuses(&self, cert: &[u8]) -> Option<String> {
        if let Some(host) = &self.hostname
            && !names_host(cert, host)
        {
            return Some(format!(
                "client certificate authentication failed: the certificate is not valid \
                 for the allowed host name {host}"
            ));
        }
        if let Some(cn) = &self.common_name
            && common_name(cert).as_deref() != Some(cn.as_str())
        {
            return Some(format!(
                "CommonName authentication failed: the certificate's common name is not \
                 the allowed one, {cn}"
            ));
        }
        None
    }

    /// The rule as a check of the certificate a member it dials presents: a peer port's
    /// allowed names say which certificates are members', in both directions.
    pub fn dial_check(self) -> oncekv_proto::net::CertCheck {
        Arc::new(move |cert: &[u8]| match self.refuses(cert) {
            None => Ok(()),
            Some(why) => {
                tracing::warn!(
                    common_name = common_name(cert).as_deref().unwrap_or("(none)"),
                    "rejected a peer's certificate: {why}"
                );
                Err(why)
            }
        })
    }
}
