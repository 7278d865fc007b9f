//! Who is calling (docs/design.md, section 17): a bearer credential — an API
//! key, the operator's token or a signed token — becomes a [`Caller`], the
//! same way for every front-end. Keys read from the store are kept a few
//! seconds (a revocation made through this process applies at once, one
//! made elsewhere within [`KEY_CACHE`]); their `last_used_at` is written at
//! most once a minute per key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flower_model::ErrorKind;
use flower_model::access::{ApiKey, DEFAULT_NAMESPACE, Role};

use super::access::{self, Caller, Principal};
use super::{App, AppError, Result};

/// How long a key read from the store is trusted without reading it again.
pub const KEY_CACHE: Duration = Duration::from_secs(5);

/// How often a key's `last_used_at` is written, at most.
const TOUCH_EVERY_MS: i64 = 60_000;

/// The credentials a deployment accepts besides its API keys.
#[derive(Clone, Default)]
pub struct AuthConfig {
    /// The operator's token: an admin credential (subject `token`), kept
    /// from before keys existed.
    pub token: Option<String>,
    /// Signed tokens (JWT) from an identity provider.
    pub jwt: Option<Arc<super::jwt::Verifier>>,
}

impl AuthConfig {
    /// No credential configured: every caller without one is the local
    /// admin (one user on their own machine). A key shown is still checked.
    pub fn open(&self) -> bool {
        self.token.as_deref().is_none_or(str::is_empty) && self.jwt.is_none()
    }
}

/// Checks credentials; one per application, shared by its clones.
pub(crate) struct Authenticator {
    config: AuthConfig,
    keys: Mutex<HashMap<String, (ApiKey, Instant)>>,
    touched: Mutex<HashMap<String, i64>>,
}

impl Authenticator {
    pub(crate) fn new(config: AuthConfig) -> Self {
        Self { config, keys: Mutex::default(), touched: Mutex::default() }
    }

    pub(crate) fn open(&self) -> bool {
        self.config.open()
    }

    fn cached(&self, id: &str) -> Option<ApiKey> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(id).filter(|(_, at)| at.elapsed() < KEY_CACHE).map(|(k, _)| k.clone())
    }

    pub(crate) fn forget(&self, id: &str) {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// Whether `id`'s use at `now` should be written (once a minute).
    fn touch_due(&self, id: &str, now: i64) -> bool {
        let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
        match touched.get(id) {
            Some(at) if now - at < TOUCH_EVERY_MS => false,
            _ => {
                touched.insert(id.to_string(), now);
                true
            }
        }
    }
}

fn unauthenticated(why: &str) -> AppError {
    AppError::new(ErrorKind::Unauthenticated, why)
}

/// The words of every refused credential: which check failed is not told
/// (a key that does not exist and a revoked one look the same).
const NOT_VALID: &str = "the credential is not valid (unknown, revoked or expired)";

impl App {
    /// Whether callers must show a credential.
    pub fn auth_required(&self) -> bool {
        !self.auth.open()
    }

    /// The application acting for the caller `bearer` names (`None`: no
    /// credential shown), from `origin`. `UNAUTHENTICATED` for a missing or
    /// bad credential; nothing is written but the key's last use.
    pub async fn authenticate(&self, bearer: Option<&str>, origin: &str) -> Result<App> {
        // A credential is exactly what is shown: no trimming (a token with a
        // trailing space is another token).
        let bearer = bearer.filter(|b| !b.is_empty());
        let (principal, until) = match bearer {
            None if self.auth.open() => return Ok(self.acting_as(Caller::local(origin))),
            None => {
                return Err(unauthenticated(
                    "this service needs a credential: `authorization: Bearer <API key or token>`",
                ));
            }
            Some(b) => self.principal_of(b).await?,
        };
        Ok(self.acting_as(Caller { principal, origin: origin.to_string(), until }))
    }

    /// The principal a credential names, and when it stops being valid.
    async fn principal_of(&self, bearer: &str) -> Result<(Principal, Option<i64>)> {
        if let Some(token) = self.auth.config.token.as_deref().filter(|t| !t.is_empty())
            && flower_model::secret::same(bearer.as_bytes(), token.as_bytes())
        {
            let admin = Principal { namespace: DEFAULT_NAMESPACE.into(), role: Role::Admin, subject: "token".into() };
            return Ok((admin, None));
        }
        if let Some(id) = access::key_id(bearer) {
            return self.key_principal(id, bearer).await;
        }
        if let Some(jwt) = &self.auth.config.jwt
            && bearer.matches('.').count() == 2
        {
            let (principal, exp) =
                jwt.verify(bearer).map_err(|why| unauthenticated(&format!("the signed token is refused: {why}")))?;
            return Ok((principal, Some(exp)));
        }
        Err(unauthenticated(NOT_VALID))
    }

    /// Whether a caller checked earlier (a console session's) still holds:
    /// its credential not expired, and a key not revoked since (read again
    /// at most every [`KEY_CACHE`]).
    pub async fn still_valid(&self, caller: &Caller) -> Result<bool> {
        let now = flower_model::now_ms();
        if caller.until.is_some_and(|until| now >= until) {
            return Ok(false);
        }
        let Some(id) = caller.principal.subject.strip_prefix("key:") else { return Ok(true) };
        match self.key(id).await? {
            Some(key) => Ok(key.live(now)),
            None => Ok(false),
        }
    }

    /// The key `id`, from the cache or the store.
    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        if let Some(k) = self.auth.cached(id) {
            return Ok(Some(k));
        }
        match self.b.store.get_key(id).await {
            Ok(k) => {
                let mut keys = self.auth.keys.lock().unwrap_or_else(|p| p.into_inner());
                keys.insert(id.to_string(), (k.clone(), Instant::now()));
                Ok(Some(k))
            }
            Err(flower_store::StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn key_principal(&self, id: &str, presented: &str) -> Result<(Principal, Option<i64>)> {
        let Some(key) = self.key(id).await? else { return Err(unauthenticated(NOT_VALID)) };
        let now = flower_model::now_ms();
        if !access::key_matches(presented, &key.digest) || !key.live(now) {
            return Err(unauthenticated(NOT_VALID));
        }
        if self.auth.touch_due(id, now) {
            let store = self.b.store.clone();
            let id = id.to_string();
            tokio::spawn(async move {
                if let Err(e) = store.touch_keys(vec![id], now).await {
                    tracing::debug!(error = %e, "a key's last use was not written");
                }
            });
        }
        let until = key.expires_at;
        Ok((Principal { namespace: key.namespace, role: key.role, subject: format!("key:{}", key.id) }, until))
    }

    /// The application acting for `caller`.
    pub fn acting_as(&self, caller: Caller) -> App {
        let mut app = self.clone();
        app.caller = Some(Arc::new(caller));
        app
    }

    /// Who this application acts for: the caller it was given, or on an
    /// open deployment the local admin; `UNAUTHENTICATED` otherwise.
    pub fn caller(&self) -> Result<Caller> {
        match &self.caller {
            Some(c) => Ok((**c).clone()),
            None if self.auth.open() => Ok(Caller::local("local")),
            None => Err(unauthenticated("no credential was checked for this call")),
        }
    }
}
