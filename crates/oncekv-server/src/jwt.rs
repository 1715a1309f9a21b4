//! etcd's JWT auth tokens (`--auth-token jwt,sign-method=RS256,priv-key=...,ttl=5m`).
//!
//! A token is a JSON Web Token (RFC 7519) whose claims are etcd's: `username`, `revision`
//! (the auth store's revision when it was issued) and `exp` (Unix seconds). Members that
//! share the key check each other's tokens, and so does any etcd member configured with
//! the same key. The signature methods are etcd 3.4's (RSA PKCS#1 v1.5 and PSS, ECDSA
//! P-256 and P-384, HMAC) and EdDSA (etcd 3.5), all through ring. A member given only a
//! public key checks tokens and issues none (etcd's verify-only mode).
//!
//! Keys are read as etcd reads them: PEM, RSA private keys in PKCS#1 or PKCS#8, EC private
//! keys in SEC1 (what `openssl ecparam -genkey` writes) or PKCS#8, public keys as
//! SubjectPublicKeyInfo (or PKCS#1 for RSA). A private key alone is enough: its public
//! half checks the tokens.
//!
//! Checking a signature costs tens of microseconds (RSA most), and a client sends the same
//! token with every request, so tokens that checked out are remembered (a bounded map);
//! expiry is still checked on every use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};

/// Tokens remembered as checked; past this the memory is cleared and refilled.
const CACHE_LIMIT: usize = 4096;

/// The signature methods, by their JWT names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    Hs256,
    Hs384,
    Hs512,
    EdDsa,
}

impl Method {
    fn parse(name: &str) -> Result<Method, String> {
        Ok(match name {
            "RS256" => Method::Rs256,
            "RS384" => Method::Rs384,
            "RS512" => Method::Rs512,
            "PS256" => Method::Ps256,
            "PS384" => Method::Ps384,
            "PS512" => Method::Ps512,
            "ES256" => Method::Es256,
            "ES384" => Method::Es384,
            "HS256" => Method::Hs256,
            "HS384" => Method::Hs384,
            "HS512" => Method::Hs512,
            "EdDSA" => Method::EdDsa,
            "ES512" => {
                return Err(
                    "auth: sign-method ES512 (P-521) is not supported; use ES256 or \
                            ES384"
                        .into(),
                );
            }
            _ => return Err("auth: invalid auth signature method".into()),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Method::Rs256 => "RS256",
            Method::Rs384 => "RS384",
            Method::Rs512 => "RS512",
            Method::Ps256 => "PS256",
            Method::Ps384 => "PS384",
            Method::Ps512 => "PS512",
            Method::Es256 => "ES256",
            Method::Es384 => "ES384",
            Method::Hs256 => "HS256",
            Method::Hs384 => "HS384",
            Method::Hs512 => "HS512",
            Method::EdDsa => "EdDSA",
        }
    }

    fn verification(self) -> Option<&'static dyn signature::VerificationAlgorithm> {
        Some(match self {
            Method::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            Method::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
            Method::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
            Method::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
            Method::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
            Method::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
            Method::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
            Method::Es384 => &signature::ECDSA_P384_SHA384_FIXED,
            Method::EdDsa => &signature::ED25519,
            Method::Hs256 | Method::Hs384 | Method::Hs512 => return None,
        })
    }

    /// The signing encoding of an RSA method (PKCS#1 v1.5 or PSS).
    fn rsa_encoding(self) -> Option<&'static dyn signature::RsaEncoding> {
        Some(match self {
            Method::Rs256 => &signature::RSA_PKCS1_SHA256,
            Method::Rs384 => &signature::RSA_PKCS1_SHA384,
            Method::Rs512 => &signature::RSA_PKCS1_SHA512,
            Method::Ps256 => &signature::RSA_PSS_SHA256,
            Method::Ps384 => &signature::RSA_PSS_SHA384,
            Method::Ps512 => &signature::RSA_PSS_SHA512,
            _ => return None,
        })
    }

    fn hmac(self) -> Option<ring::hmac::Algorithm> {
        match self {
            Method::Hs256 => Some(ring::hmac::HMAC_SHA256),
            Method::Hs384 => Some(ring::hmac::HMAC_SHA384),
            Method::Hs512 => Some(ring::hmac::HMAC_SHA512),
            _ => None,
        }
    }
}

/// What `--auth-token jwt,...` names: the method, the key files' contents, the tokens' TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtOptions {
    pub sign_method: String,
    pub public_key: Option<Vec<u8>>,
    pub private_key: Option<Vec<u8>>,
    pub ttl: Duration,
}

enum Signer {
    Rsa(RsaKeyPair, &'static dyn signature::RsaEncoding),
    Ecdsa(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Hmac(ring::hmac::Key),
}

enum Verifier {
    /// The public key in the form ring takes for the method (RSAPublicKey DER, an EC
    /// point, Ed25519's 32 bytes).
    Public(Vec<u8>),
    Hmac(ring::hmac::Key),
}

/// What a checked token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub username: String,
    pub revision: u64,
    /// Unix seconds after which it is refused.
    pub expires: u64,
}

/// A member's JWT signer and checker.
pub struct Jwt {
    method: Method,
    signer: Option<Signer>,
    verifier: Verifier,
    ttl: Duration,
    checked: Mutex<HashMap<String, Claims>>,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("method", &self.method)
            .field("verify_only", &self.signer.is_none())
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// The PEM blocks of `text`: label and DER.
fn pem_blocks(text: &[u8]) -> Vec<(String, Vec<u8>)> {
    let text = String::from_utf8_lossy(text);
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(label) = line
            .trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let mut body = String::new();
        for line in lines.by_ref() {
            let line = line.trim();
            if line.starts_with("-----END ") {
                break;
            }
            // Headers of the old encrypted format ("Proc-Type: ...") are not base64.
            if !line.contains(':') {
                body.push_str(line);
            }
        }
        if let Ok(der) = STANDARD.decode(body) {
            out.push((label.to_string(), der));
        }
    }
    out
}

/// A DER TLV.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(content);
    out
}

const OID_EC_PUBLIC_KEY: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2B, 0x81, 0x04, 0x00, 0x22];

/// A SEC1 EC private key wrapped as PKCS#8 for `curve` (ring reads only PKCS#8).
fn sec1_to_pkcs8(sec1: &[u8], curve: &[u8]) -> Vec<u8> {
    let mut alg = der(0x06, OID_EC_PUBLIC_KEY);
    alg.extend(der(0x06, curve));
    let mut body = der(0x02, &[0]);
    body.extend(der(0x30, &alg));
    body.extend(der(0x04, sec1));
    der(0x30, &body)
}

fn private_key(method: Method, pem: &[u8]) -> Result<Signer, String> {
    let rng = SystemRandom::new();
    if let Some(alg) = method.hmac() {
        // etcd takes the file's bytes as they are.
        return Ok(Signer::Hmac(ring::hmac::Key::new(alg, pem)));
    }
    let blocks = pem_blocks(pem);
    let Some((label, der)) = blocks.into_iter().find(|(l, _)| l.ends_with("PRIVATE KEY")) else {
        return Err("auth: the private key file holds no PEM private key".into());
    };
    let bad = |e: &dyn std::fmt::Display| format!("auth: private key ({label}): {e}");
    match method {
        Method::Rs256
        | Method::Rs384
        | Method::Rs512
        | Method::Ps256
        | Method::Ps384
        | Method::Ps512 => {
            let encoding = method
                .rsa_encoding()
                .ok_or("auth: internal: an RSA method without its encoding")?;
            Ok(Signer::Rsa(
                rsa_key(&label, &der).map_err(|e| bad(&e))?,
                encoding,
            ))
        }
        Method::Es256 | Method::Es384 => {
            let (alg, curve) = if method == Method::Es256 {
                (&signature::ECDSA_P256_SHA256_FIXED_SIGNING, OID_P256)
            } else {
                (&signature::ECDSA_P384_SHA384_FIXED_SIGNING, OID_P384)
            };
            let pkcs8 = if label == "EC PRIVATE KEY" {
                sec1_to_pkcs8(&der, curve)
            } else {
                der
            };
            EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng)
                .map(Signer::Ecdsa)
                .map_err(|e| bad(&format!("{e} (is it a key of {}'s curve?)", method.name())))
        }
        Method::EdDsa => Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map(Signer::Ed25519)
            .map_err(|e| bad(&e)),
        // Returned above: an HMAC key is the file's bytes, not PEM.
        Method::Hs256 | Method::Hs384 | Method::Hs512 => {
            Err("auth: internal: HMAC key read as a PEM key".into())
        }
    }
}

fn rsa_key(label: &str, der: &[u8]) -> Result<RsaKeyPair, String> {
    let key = if label == "RSA PRIVATE KEY" {
        RsaKeyPair::from_der(der)
    } else {
        RsaKeyPair::from_pkcs8(der)
    };
    key.map_err(|e| e.to_string())
}

/// The public key in ring's form (the SubjectPublicKeyInfo's key bits), from a PEM file.
fn public_key(pem: &[u8]) -> Result<Vec<u8>, String> {
    let blocks = pem_blocks(pem);
    if let Some((_, der)) = blocks.iter().find(|(l, _)| l == "RSA PUBLIC KEY") {
        return Ok(der.clone());
    }
    use x509_parser::prelude::FromDer;
    let Some((_, der)) = blocks.iter().find(|(l, _)| l == "PUBLIC KEY") else {
        // A certificate will do, as in etcd (its key parsing falls back to one): its
        // subject's key is the public key.
        if let Some((_, der)) = blocks.iter().find(|(l, _)| l == "CERTIFICATE") {
            let (_, cert) = x509_parser::parse_x509_certificate(der)
                .map_err(|e| format!("auth: public key certificate: {e}"))?;
            return Ok(cert.public_key().subject_public_key.data.to_vec());
        }
        return Err("auth: the public key file holds no PEM public key (nor a certificate)".into());
    };
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(der)
        .map_err(|e| format!("auth: public key: {e}"))?;
    Ok(spki.subject_public_key.data.to_vec())
}

impl Jwt {
    /// Reads the keys `opts` names; refuses, with etcd's messages where it has them, a
    /// method it does not know, a missing key, or keys that are not a pair.
    pub fn new(opts: &JwtOptions) -> Result<Jwt, String> {
        let method = Method::parse(&opts.sign_method)?;
        let signer = match &opts.private_key {
            Some(pem) if !pem.is_empty() => Some(private_key(method, pem)?),
            _ => None,
        };
        let given_public = match &opts.public_key {
            Some(pem) if !pem.is_empty() && method.hmac().is_none() => Some(public_key(pem)?),
            _ => None,
        };
        let derived = match &signer {
            Some(Signer::Rsa(k, _)) => Some(Verifier::Public(k.public().as_ref().to_vec())),
            Some(Signer::Ecdsa(k)) => Some(Verifier::Public(k.public_key().as_ref().to_vec())),
            Some(Signer::Ed25519(k)) => Some(Verifier::Public(k.public_key().as_ref().to_vec())),
            Some(Signer::Hmac(k)) => Some(Verifier::Hmac(k.clone())),
            None => None,
        };
        let verifier = match (derived, given_public) {
            (Some(Verifier::Public(derived)), Some(given)) if derived != given => {
                return Err("auth: public and private keys don't match".into());
            }
            (Some(v), _) => v,
            (None, Some(given)) => Verifier::Public(given),
            (None, None) => return Err("auth: missing key data".into()),
        };
        Ok(Jwt {
            method,
            signer,
            verifier,
            ttl: opts.ttl,
            checked: Mutex::new(HashMap::new()),
        })
    }

    /// A token for `username` at auth revision `revision`, valid for the TTL from
    /// `now_s` (Unix seconds).
    pub fn sign(&self, username: &str, revision: u64, now_s: u64) -> Result<String, String> {
        let Some(signer) = &self.signer else {
            return Err("auth: token signing attempted with verify-only key".into());
        };
        let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, self.method.name());
        // Keys in order, as etcd's (Go's) JSON writes them.
        let claims = serde_json::json!({
            "exp": now_s + self.ttl.as_secs(),
            "revision": revision,
            "username": username,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let sig = match signer {
            Signer::Rsa(key, encoding) => {
                let mut sig = vec![0; key.public().modulus_len()];
                key.sign(*encoding, &rng, signing_input.as_bytes(), &mut sig)
                    .map_err(|e| format!("auth: signing a token: {e}"))?;
                sig
            }
            Signer::Ecdsa(key) => key
                .sign(&rng, signing_input.as_bytes())
                .map_err(|e| format!("auth: signing a token: {e}"))?
                .as_ref()
                .to_vec(),
            Signer::Ed25519(key) => key.sign(signing_input.as_bytes()).as_ref().to_vec(),
            Signer::Hmac(key) => ring::hmac::sign(key, signing_input.as_bytes())
                .as_ref()
                .to_vec(),
        };
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }

    /// The claims of `token` if its signature (by this method and key) holds and it has
    /// not expired at `now_s`.
    pub fn verify(&self, token: &str, now_s: u64) -> Option<Claims> {
        let remembered = self.checked.lock().ok().and_then(|m| m.get(token).cloned());
        let claims = match remembered {
            Some(c) => c,
            None => {
                let c = self.check_signature(token)?;
                if let Ok(mut m) = self.checked.lock() {
                    if m.len() >= CACHE_LIMIT {
                        m.clear();
                    }
                    m.insert(token.to_string(), c.clone());
                }
                c
            }
        };
        (now_s <= claims.expires).then_some(claims)
    }

    fn check_signature(&self, token: &str) -> Option<Claims> {
        let (signing_input, sig) = token.rsplit_once('.')?;
        let (header, claims) = signing_input.split_once('.')?;
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
        // etcd refuses a token of another method than its own (no "none", no confusion
        // of an RSA public key for an HMAC secret).
        if header.get("alg")?.as_str()? != self.method.name() {
            return None;
        }
        let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
        let ok = match &self.verifier {
            Verifier::Hmac(key) => ring::hmac::verify(key, signing_input.as_bytes(), &sig).is_ok(),
            Verifier::Public(public) => {
                let alg = self.method.verification()?;
                signature::UnparsedPublicKey::new(alg, public)
                    .verify(signing_input.as_bytes(), &sig)
                    .is_ok()
            }
        };
        if !ok {
            return None;
        }
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).ok()?).ok()?;
        Some(Claims {
            username: claims.get("username")?.as_str()?.to_string(),
            revision: claims.get("revision")?.as_f64()? as u64,
            // A token without an expiry is valid (JWT's rule), as etcd takes it.
            expires: claims
                .get("exp")
                .map_or(Some(u64::MAX), |e| e.as_f64().map(|e| e as u64))?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Keys made with openssl for these tests only (testdata/jwt): RSA in PKCS#1 and
    /// PKCS#8, EC in SEC1 (P-256, P-384), Ed25519 in PKCS#8, an HMAC secret, and a
    /// self-signed certificate of the first RSA key.
    fn key(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/testdata/jwt/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    fn jwt(method: &str, private: Option<&str>, public: Option<&str>) -> Result<Jwt, String> {
        Jwt::new(&JwtOptions {
            sign_method: method.into(),
            private_key: private.map(key),
            public_key: public.map(key),
            ttl: Duration::from_secs(300),
        })
    }

    #[test]
    fn every_method_signs_and_checks_its_own_tokens() {
        for (method, private) in [
            ("RS256", "rsa.pem"),
            ("RS384", "rsa2.pkcs8.pem"),
            ("RS512", "rsa.pem"),
            ("PS256", "rsa.pem"),
            ("PS512", "rsa2.pkcs8.pem"),
            ("ES256", "ec256.pem"),
            ("ES384", "ec384.pem"),
            ("EdDSA", "ed25519.pem"),
            ("HS256", "hmac.key"),
            ("HS512", "hmac.key"),
        ] {
            let j = jwt(method, Some(private), None).unwrap();
            let token = j.sign("alice", 7, 1_000).unwrap();
            let claims = j.verify(&token, 1_000).unwrap();
            assert_eq!(
                claims,
                Claims {
                    username: "alice".into(),
                    revision: 7,
                    expires: 1_300
                },
                "{method}"
            );
            // Expired after the TTL.
            assert!(j.verify(&token, 1_301).is_none(), "{method}");
            // Any change to the claims breaks the signature.
            let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
            parts[1] = URL_SAFE_NO_PAD.encode(r#"{"exp":1300,"revision":7,"username":"root"}"#);
            assert!(j.verify(&parts.join("."), 1_000).is_none(), "{method}");
            // A token claiming no signature ("alg":"none") is refused.
            let none = format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
                parts[1]
            );
            assert!(j.verify(&none, 1_000).is_none(), "{method}");
            assert!(j.verify("not.a.token", 1_000).is_none());
        }
    }

    #[test]
    fn another_key_or_method_is_refused() {
        let a = jwt("RS256", Some("rsa.pem"), None).unwrap();
        let b = jwt("RS256", Some("rsa2.pkcs8.pem"), None).unwrap();
        let token = a.sign("alice", 1, 10).unwrap();
        assert!(b.verify(&token, 10).is_none());
        let ps = jwt("PS256", Some("rsa.pem"), None).unwrap();
        assert!(ps.verify(&token, 10).is_none(), "same key, other method");
        // An HMAC member given the RSA public key's bytes as its secret does not take an
        // RS256 token re-labelled HS256 (the classic confusion).
        let hs = Jwt::new(&JwtOptions {
            sign_method: "HS256".into(),
            private_key: Some(key("rsa.pub.pem")),
            public_key: None,
            ttl: Duration::from_secs(300),
        })
        .unwrap();
        assert!(hs.verify(&token, 10).is_none());
    }

    #[test]
    fn a_public_key_alone_checks_and_does_not_sign() {
        let signer = jwt("RS256", Some("rsa.pem"), Some("rsa.pub.pem")).unwrap();
        let checker = jwt("RS256", None, Some("rsa.pub.pem")).unwrap();
        let token = signer.sign("bob", 3, 50).unwrap();
        assert_eq!(checker.verify(&token, 50).unwrap().username, "bob");
        assert_eq!(
            checker.sign("bob", 3, 50).unwrap_err(),
            "auth: token signing attempted with verify-only key"
        );
        let ec = jwt("ES256", None, Some("ec256.pub.pem")).unwrap();
        let token = jwt("ES256", Some("ec256.pem"), None)
            .unwrap()
            .sign("carol", 1, 5)
            .unwrap();
        assert_eq!(ec.verify(&token, 5).unwrap().username, "carol");
    }

    #[test]
    fn a_certificate_serves_as_the_public_key() {
        // etcd's own tests give a server certificate as pub-key.
        let signer = jwt("RS256", Some("rsa.pem"), Some("rsa.crt.pem")).unwrap();
        let checker = jwt("RS256", None, Some("rsa.crt.pem")).unwrap();
        let token = signer.sign("dave", 2, 9).unwrap();
        assert_eq!(checker.verify(&token, 9).unwrap().username, "dave");
        assert_eq!(
            jwt("RS256", Some("rsa2.pkcs8.pem"), Some("rsa.crt.pem")).unwrap_err(),
            "auth: public and private keys don't match"
        );
    }

    #[test]
    fn bad_options_are_refused_with_etcds_messages() {
        let err = |r: Result<Jwt, String>| r.unwrap_err();
        assert_eq!(
            err(jwt("XS999", Some("rsa.pem"), None)),
            "auth: invalid auth signature method"
        );
        assert_eq!(err(jwt("RS256", None, None)), "auth: missing key data");
        assert_eq!(
            err(jwt("RS256", Some("rsa2.pkcs8.pem"), Some("rsa.pub.pem"))),
            "auth: public and private keys don't match"
        );
        assert!(err(jwt("ES256", Some("ec384.pem"), None)).contains("curve"));
        assert!(err(jwt("ES512", Some("ec384.pem"), None)).contains("not supported"));
        assert!(err(jwt("RS256", Some("hmac.key"), None)).contains("no PEM private key"));
    }
}
