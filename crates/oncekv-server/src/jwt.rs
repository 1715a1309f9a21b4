//! etcd's JWT auth tokens (`--auth-token jwt,sign-method=RS256,priv-key=...,ttl=5m`).
//!
//! A token is a JSON Web Token (RFC 7519) whose claims are etcd's: `username`, `revision`
//! (the auth store's revision when it was issued) and `exp` (Unix seconds). Members that
//! share the key check each other's tokens, and so does any etcd member configured with
//! the same key. The signature methods are etcd 3.4's (RSA PKCS#1 v1.5 and PSS, ECDSA
//! P-256 and P-384, HMAC) and EdDSA (etcd 3.5). A member given only a public key checks
//! tokens and issues none (etcd's verify-only mode).
//!
//! Why `jsonwebtoken`: it is the maintained JWT crate, and its 9.x line signs with ring,
//! the crypto rustls already uses here (10.x on, as 12.0 checked, offers only aws-lc-rs
//! or RustCrypto: a second crypto stack, and RustCrypto's `rsa` has an open timing
//! advisory, RUSTSEC-2023-0071). Without its PEM feature it adds no other crate. It makes and checks the tokens: the JWS encoding, the signatures,
//! and refusing a token of another method than the member's (no `none`, no RSA public
//! key taken for an HMAC secret).
//!
//! What stays here is reading the key files as etcd does, which the crate does not:
//! - A file may hold several PEM blocks (`openssl ecparam -genkey` writes `EC PARAMETERS`
//!   before the key); the crate reads the first, x509-parser's PEM reader finds the key's.
//! - EC private keys in SEC1 (`EC PRIVATE KEY`, what openssl writes) are wrapped as
//!   PKCS#8, the only form the crate takes; RSA keys in PKCS#8 are unwrapped to the PKCS#1
//!   its DER reader takes (its PEM feature would do that, but pulls in two crates).
//! - A private key alone is enough (its public half checks the tokens), and a public key
//!   given beside it must be its pair. The crate's keys do not give their public half, so
//!   ring reads the private key for it; that also refuses a bad key at start.
//! - Public keys as SubjectPublicKeyInfo, PKCS#1 (RSA) or a certificate's (x509-parser).
//!
//! Checking a signature costs tens of microseconds (RSA most), and a client sends the same
//! token with every request, so tokens that checked out are remembered (a bounded map);
//! expiry is still checked on every use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use x509_parser::pem::Pem;

/// Tokens remembered as checked; past this the memory is cleared and refilled.
const CACHE_LIMIT: usize = 4096;

/// The kind of key a signature method takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

/// The method `name` (its JWT name) and the kind of key it takes.
fn method(name: &str) -> Result<(Algorithm, Family), String> {
    if name == "ES512" {
        return Err("auth: sign-method ES512 (P-521) is not supported; use ES256 or ES384".into());
    }
    let algorithm: Algorithm = name
        .parse()
        .map_err(|_| "auth: invalid auth signature method".to_string())?;
    let family = match algorithm {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Family::Hmac,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Family::Rsa,
        Algorithm::ES256 | Algorithm::ES384 => Family::Ec,
        Algorithm::EdDSA => Family::Ed,
    };
    Ok((algorithm, family))
}

/// What `--auth-token jwt,...` names: the method, the key files' contents, the tokens' TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtOptions {
    pub sign_method: String,
    pub public_key: Option<Vec<u8>>,
    pub private_key: Option<Vec<u8>>,
    pub ttl: Duration,
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
    algorithm: Algorithm,
    signer: Option<EncodingKey>,
    verifier: DecodingKey,
    validation: Validation,
    ttl: Duration,
    checked: Mutex<HashMap<String, Claims>>,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("method", &self.algorithm)
            .field("verify_only", &self.signer.is_none())
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// The PEM blocks of `file` that decode (label and DER).
fn pem_blocks(file: &[u8]) -> Vec<Pem> {
    Pem::iter_from_buffer(file).filter_map(Result::ok).collect()
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

/// A SEC1 EC private key wrapped as PKCS#8 for `curve` (the crate and ring read only
/// PKCS#8).
fn sec1_to_pkcs8(sec1: &[u8], curve: &[u8]) -> Vec<u8> {
    let mut alg = der(0x06, OID_EC_PUBLIC_KEY);
    alg.extend(der(0x06, curve));
    let mut body = der(0x02, &[0]);
    body.extend(der(0x30, &alg));
    body.extend(der(0x04, sec1));
    der(0x30, &body)
}

/// The PKCS#1 RSAPrivateKey inside a PKCS#8 PrivateKeyInfo (its third field, an OCTET
/// STRING): the form the crate signs with.
fn pkcs8_to_pkcs1(pkcs8: &[u8]) -> Result<Vec<u8>, String> {
    let (_, info) =
        x509_parser::der_parser::der::parse_der_sequence(pkcs8).map_err(|e| e.to_string())?;
    let fields = info.as_sequence().map_err(|e| e.to_string())?;
    let key = fields.get(2).ok_or("no privateKey field")?;
    key.as_slice()
        .map(<[u8]>::to_vec)
        .map_err(|e| e.to_string())
}

/// The signing key from a private key file, and its public half in the form the
/// crate's `from_*_der` take (RSAPublicKey DER, an EC point, Ed25519's 32 bytes).
fn private_key(
    algorithm: Algorithm,
    family: Family,
    file: &[u8],
) -> Result<(EncodingKey, Vec<u8>), String> {
    let Some(pem) = pem_blocks(file)
        .into_iter()
        .find(|p| p.label.ends_with("PRIVATE KEY"))
    else {
        return Err("auth: the private key file holds no PEM private key".into());
    };
    let (label, der) = (pem.label, pem.contents);
    let bad = |e: &dyn std::fmt::Display| format!("auth: private key ({label}): {e}");
    let (key, public) = match family {
        Family::Rsa => {
            let pkcs1 = label == "RSA PRIVATE KEY";
            let pair = if pkcs1 {
                RsaKeyPair::from_der(&der)
            } else {
                RsaKeyPair::from_pkcs8(&der)
            }
            .map_err(|e| bad(&e))?;
            let der = if pkcs1 {
                der
            } else {
                pkcs8_to_pkcs1(&der).map_err(|e| bad(&e))?
            };
            (
                EncodingKey::from_rsa_der(&der),
                pair.public().as_ref().to_vec(),
            )
        }
        Family::Ec => {
            let (ring_alg, curve) = if algorithm == Algorithm::ES256 {
                (&signature::ECDSA_P256_SHA256_FIXED_SIGNING, OID_P256)
            } else {
                (&signature::ECDSA_P384_SHA384_FIXED_SIGNING, OID_P384)
            };
            let pkcs8 = if label == "EC PRIVATE KEY" {
                sec1_to_pkcs8(&der, curve)
            } else {
                der
            };
            let pair = EcdsaKeyPair::from_pkcs8(ring_alg, &pkcs8, &SystemRandom::new())
                .map_err(|e| bad(&format!("{e} (is it a key of {algorithm:?}'s curve?)")))?;
            (
                EncodingKey::from_ec_der(&pkcs8),
                pair.public_key().as_ref().to_vec(),
            )
        }
        Family::Ed => {
            let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| bad(&e))?;
            (
                EncodingKey::from_ed_der(&der),
                pair.public_key().as_ref().to_vec(),
            )
        }
        // An HMAC key is the file's bytes, not PEM; Jwt::new does not come here for one.
        Family::Hmac => return Err("auth: internal: HMAC key read as a PEM key".into()),
    };
    // The crate reads the key only when it signs: one signature now, so that a key it
    // cannot use stops the start rather than every sign-in.
    jsonwebtoken::encode(&Header::new(algorithm), &serde_json::json!({}), &key)
        .map_err(|e| bad(&e))?;
    Ok((key, public))
}

/// The public key in the form the crate's `from_*_der` take (the SubjectPublicKeyInfo's
/// key bits), from a PEM file.
fn public_key(file: &[u8]) -> Result<Vec<u8>, String> {
    let blocks = pem_blocks(file);
    if let Some(pem) = blocks.iter().find(|p| p.label == "RSA PUBLIC KEY") {
        return Ok(pem.contents.clone());
    }
    use x509_parser::prelude::FromDer;
    let Some(pem) = blocks.iter().find(|p| p.label == "PUBLIC KEY") else {
        // A certificate will do, as in etcd (its key parsing falls back to one): its
        // subject's key is the public key.
        if let Some(pem) = blocks.iter().find(|p| p.label == "CERTIFICATE") {
            let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents)
                .map_err(|e| format!("auth: public key certificate: {e}"))?;
            return Ok(cert.public_key().subject_public_key.data.to_vec());
        }
        return Err("auth: the public key file holds no PEM public key (nor a certificate)".into());
    };
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&pem.contents)
        .map_err(|e| format!("auth: public key: {e}"))?;
    Ok(spki.subject_public_key.data.to_vec())
}

impl Jwt {
    /// Reads the keys `opts` names; refuses, with etcd's messages where it has them, a
    /// method it does not know, a missing key, or keys that are not a pair.
    pub fn new(opts: &JwtOptions) -> Result<Jwt, String> {
        let (algorithm, family) = method(&opts.sign_method)?;
        let private = opts.private_key.as_deref().filter(|k| !k.is_empty());
        let public = opts.public_key.as_deref().filter(|k| !k.is_empty());
        let (signer, verifier) = if family == Family::Hmac {
            // etcd takes the secret file's bytes as they are; HMAC has no public key.
            let secret = private.ok_or("auth: missing key data")?;
            (
                Some(EncodingKey::from_secret(secret)),
                DecodingKey::from_secret(secret),
            )
        } else {
            let signer = private
                .map(|file| private_key(algorithm, family, file))
                .transpose()?;
            let given = public.map(public_key).transpose()?;
            let public = match (&signer, given) {
                (Some((_, derived)), Some(given)) if *derived != given => {
                    return Err("auth: public and private keys don't match".into());
                }
                (Some((_, derived)), _) => derived.clone(),
                (None, Some(given)) => given,
                (None, None) => return Err("auth: missing key data".into()),
            };
            let verifier = match family {
                Family::Rsa => DecodingKey::from_rsa_der(&public),
                Family::Ec => DecodingKey::from_ec_der(&public),
                Family::Ed | Family::Hmac => DecodingKey::from_ed_der(&public),
            };
            (signer.map(|(key, _)| key), verifier)
        };
        // Only the method is the crate's to check: expiry is checked in `verify` against
        // the caller's clock on every use (remembered tokens too), and etcd's tokens carry
        // no other registered claim (a token without `exp` is valid, as in etcd).
        let mut validation = Validation::new(algorithm);
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        Ok(Jwt {
            algorithm,
            signer,
            verifier,
            validation,
            ttl: opts.ttl,
            checked: Mutex::new(HashMap::new()),
        })
    }

    /// A token for `username` at auth revision `revision`, valid for the TTL from
    /// `now_s` (Unix seconds).
    pub fn sign(&self, username: &str, revision: u64, now_s: u64) -> Result<String, String> {
        let Some(key) = &self.signer else {
            return Err("auth: token signing attempted with verify-only key".into());
        };
        // Keys in order, as etcd's (Go's) JSON writes them.
        let claims = serde_json::json!({
            "exp": now_s + self.ttl.as_secs(),
            "revision": revision,
            "username": username,
        });
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key)
            .map_err(|e| format!("auth: signing a token: {e}"))
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
        let claims =
            jsonwebtoken::decode::<serde_json::Value>(token, &self.verifier, &self.validation)
                .ok()?
                .claims;
        // Numbers read as etcd (Go) reads them, as floats.
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
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

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

    /// Tokens as an etcd member with these keys issues them for alice at auth revision 7,
    /// expiring at 1300: Go's header (`{"alg":..,"typ":"JWT"}`) and claims in key order.
    /// RS256 and HS256 are deterministic, so these are byte for byte etcd's (made by this
    /// module before it used jsonwebtoken, whose header writes `typ` first).
    const ETCD_TOKENS: [(&str, &str, &str); 2] = [
        (
            "RS256",
            "rsa.pem",
            "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjEzMDAsInJldmlzaW9uIjo3LCJ1c2VybmFtZSI6ImFsaWNlIn0.WZ_cVq94jNwZkZxUIKjHVaAjokXvy1NFTO7fZhuYKRKA45qasxYOgoF3MeJPcdRRxVwyhLUJUAvIX_FDVFceb1vHuSEJLbVWUQA6o3eqEhRY-lKFPnXjelhZnQcv7VeL3aQYecerT2L0J5d5LZzAmLktc9r-jGTfJarkkjdsOvnqsFYI4X_kLisBZ0N-kR1KJSvSC2yoICL01DNqZnkUpY7KhKDHRH_bA7asHiJeFZ9yq2Q4qJZadbptcoFmPX0rV4LXQiFCJ9ig-frpHUYWHGF6dxjd-YADGxlVMiRxMC5nd3buyhl3amsKgyAel9YawyN3mUZrEBf0EzFjQQTaJg",
        ),
        (
            "HS256",
            "hmac.key",
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjEzMDAsInJldmlzaW9uIjo3LCJ1c2VybmFtZSI6ImFsaWNlIn0.m3E2LqbzDnwuIg2dZq9I7bOB6DrDbkCLOPGFlRMTzW8",
        ),
    ];

    #[test]
    fn etcds_tokens_check_and_tampered_ones_do_not() {
        let alice = Claims {
            username: "alice".into(),
            revision: 7,
            expires: 1_300,
        };
        for (method, private, token) in ETCD_TOKENS {
            let j = jwt(method, Some(private), None).unwrap();
            assert_eq!(j.verify(token, 1_000), Some(alice.clone()), "{method}");
            let (signing_input, sig) = token.rsplit_once('.').unwrap();
            // A signature with one byte changed.
            let mut bytes = URL_SAFE_NO_PAD.decode(sig).unwrap();
            bytes[0] ^= 1;
            let forged = format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(bytes));
            assert!(j.verify(&forged, 1_000).is_none(), "{method}");
            // The signature moved onto other claims.
            let claims = URL_SAFE_NO_PAD.encode(r#"{"exp":9999,"revision":7,"username":"alice"}"#);
            let header = signing_input.split('.').next().unwrap();
            assert!(
                j.verify(&format!("{header}.{claims}.{sig}"), 1_000)
                    .is_none(),
                "{method}"
            );
        }
        // The RS256 token under another header (HS256, the classic confusion) is refused
        // by an RS256 member.
        let rs = jwt("RS256", Some("rsa.pem"), None).unwrap();
        let (_, rest) = ETCD_TOKENS[0].2.split_once('.').unwrap();
        let relabelled = format!(
            "{}.{rest}",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#)
        );
        assert!(rs.verify(&relabelled, 1_000).is_none());
    }

    #[test]
    fn a_token_the_crate_makes_with_the_key_checks() {
        let secret = key("hmac.key");
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &serde_json::json!({"username": "erin", "revision": 4, "exp": 60}),
            &EncodingKey::from_secret(&secret),
        )
        .unwrap();
        let j = jwt("HS384", Some("hmac.key"), None).unwrap();
        assert_eq!(
            j.verify(&token, 60),
            Some(Claims {
                username: "erin".into(),
                revision: 4,
                expires: 60
            })
        );
        // Another secret's token, and one without a username, are not taken.
        let other = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &serde_json::json!({"username": "erin", "revision": 4, "exp": 60}),
            &EncodingKey::from_secret(b"another secret"),
        )
        .unwrap();
        assert!(j.verify(&other, 60).is_none());
        let nameless = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &serde_json::json!({"revision": 4}),
            &EncodingKey::from_secret(&secret),
        )
        .unwrap();
        assert!(j.verify(&nameless, 60).is_none());
    }

    #[test]
    fn the_key_is_found_among_other_pem_blocks() {
        // What `openssl ecparam -name prime256v1 -genkey` writes: the curve, then the key.
        let mut file =
            b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
                .to_vec();
        file.extend(key("ec256.pem"));
        let j = Jwt::new(&JwtOptions {
            sign_method: "ES256".into(),
            private_key: Some(file),
            public_key: Some(key("ec256.pub.pem")),
            ttl: Duration::from_secs(300),
        })
        .unwrap();
        let token = j.sign("frank", 1, 0).unwrap();
        assert_eq!(j.verify(&token, 0).unwrap().username, "frank");
    }
}
