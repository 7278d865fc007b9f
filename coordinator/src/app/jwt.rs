//! Signed tokens (docs/design.md, section 17): a JWT from an identity
//! provider, verified against its JWKS (read from a file or a URL by the
//! runtime), with the namespace and role read from configured claims. Only
//! asymmetric algorithms are accepted (RS*, PS*, ES*, EdDSA), each only
//! with a key of its own type; `alg: none` and HMAC are refused, as is a
//! token without an expiry, not yet valid (`nbf`), or with another issuer
//! or audience. Keys marked for encryption (`use: enc`) are not used.

use std::sync::RwLock;

use flower_model::access::{Role, check_namespace};
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::access::Principal;

/// What a deployment expects of a token.
#[derive(Clone, Debug)]
pub struct JwtConfig {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` a token must carry.
    pub audience: String,
    /// The claim naming the namespace (default `flower_namespace`).
    pub namespace_claim: String,
    /// The claim naming the role (default `flower_role`).
    pub role_claim: String,
}

impl JwtConfig {
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            audience: audience.into(),
            namespace_claim: "flower_namespace".into(),
            role_claim: "flower_role".into(),
        }
    }
}

/// Verifies tokens against the keys last read.
pub struct Verifier {
    config: JwtConfig,
    keys: RwLock<JwkSet>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.keys.read().map(|k| k.keys.len()).unwrap_or_default();
        f.debug_struct("Verifier").field("config", &self.config).field("keys", &keys).finish()
    }
}

/// Whether `alg` may be used with `key`: asymmetric only, of the key's type.
fn fits(alg: Algorithm, key: &Jwk) -> bool {
    use Algorithm::*;
    match &key.algorithm {
        AlgorithmParameters::RSA(_) => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
        AlgorithmParameters::EllipticCurve(_) => matches!(alg, ES256 | ES384),
        AlgorithmParameters::OctetKeyPair(_) => alg == EdDSA,
        AlgorithmParameters::OctetKey(_) => false,
    }
}

impl Verifier {
    /// A verifier with the keys of `jwks` (a JWKS document, JSON).
    pub fn new(config: JwtConfig, jwks: &str) -> Result<Self, String> {
        Ok(Self { config, keys: RwLock::new(parse(jwks)?) })
    }

    /// Take the keys of a JWKS read again (a provider's key rotation); the
    /// number of keys.
    pub fn replace_keys(&self, jwks: &str) -> Result<usize, String> {
        let set = parse(jwks)?;
        let n = set.keys.len();
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = set;
        Ok(n)
    }

    /// The principal a token names and its expiry (ms), or why it is refused.
    pub fn verify(&self, token: &str) -> Result<(Principal, i64), String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("unreadable header ({e})"))?;
        let key = {
            let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
            let found = match &header.kid {
                Some(kid) => keys.find(kid).cloned(),
                None if keys.keys.len() == 1 => keys.keys.first().cloned(),
                None => None,
            };
            found.ok_or("no key of the JWKS matches its `kid`")?
        };
        if matches!(key.common.public_key_use, Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)) {
            return Err("the key its `kid` names is for encryption, not signatures".into());
        }
        if !fits(header.alg, &key) {
            return Err(format!("algorithm {:?} is not accepted with this key", header.alg));
        }
        if let Some(want) = key.common.key_algorithm
            && format!("{want:?}") != format!("{:?}", header.alg)
        {
            return Err(format!("the key is for {want:?}, not {:?}", header.alg));
        }
        let decoding = DecodingKey::from_jwk(&key).map_err(|e| format!("unusable key ({e})"))?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 30;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &decoding, &validation)
            .map_err(|e| e.to_string())?;
        let exp = data.claims.get("exp").and_then(serde_json::Value::as_i64).ok_or("no numeric `exp` claim")?;
        Ok((self.principal(&data.claims)?, exp.saturating_mul(1000)))
    }

    fn principal(&self, claims: &serde_json::Map<String, serde_json::Value>) -> Result<Principal, String> {
        let text = |name: &str| claims.get(name).and_then(|v| v.as_str()).map(str::to_string);
        let namespace = text(&self.config.namespace_claim)
            .ok_or_else(|| format!("no `{}` claim (the namespace)", self.config.namespace_claim))?;
        check_namespace(&namespace)?;
        let role: Role = text(&self.config.role_claim)
            .ok_or_else(|| format!("no `{}` claim (the role)", self.config.role_claim))?
            .parse()?;
        let subject = text("sub").ok_or("no `sub` claim")?;
        Ok(Principal { namespace, role, subject: format!("jwt:{subject}") })
    }
}

fn parse(jwks: &str) -> Result<JwkSet, String> {
    serde_json::from_str(jwks).map_err(|e| format!("not a JWKS: {e}"))
}
