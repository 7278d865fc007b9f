//! The console's one sign-in and CSRF scheme (docs/design.md, sections 14
//! and 17). Who a request is comes from the application layer
//! ([`App::authenticate`]): a bearer header (scripts) or the HttpOnly
//! cookie the sign-in form sets. Signing in with an API key, the operator's
//! token or a signed token opens a session kept here: the cookie holds a
//! random session id (never the credential), which ends at sign-out or
//! after [`SESSION_TTL`]. Failed sign-ins are throttled per address.
//! [`Signed`], the extractor every page, stream and action takes, is the
//! application acting for the caller; a request without one gets the
//! sign-in form at the same address (the deep link kept).
//! Every form that changes a job carries the session's CSRF value, checked
//! by [`Signed::form`]; the sign-in form carries a value of its own, also
//! set as a `SameSite=Strict` cookie ([`login_form`]), so a sign-in posted
//! from another site (which would sign the browser in as someone else) is
//! refused. Every comparison is the project's constant-time one
//! ([`flower_model::secret::same`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use flower_coordinator::app::App;
use flower_coordinator::app::access::Caller;
use sha2::{Digest, Sha256};

use crate::Console;
use crate::error::Refusal;

/// The session cookie's name.
pub const COOKIE: &str = "flower_console";

/// How long a signed-in session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Failed sign-ins allowed per address per [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// A signed-in browser.
struct Session {
    caller: Caller,
    csrf: String,
    until: Instant,
}

/// Sessions, the CSRF value of callers without one, and failed sign-ins.
pub struct Auth {
    /// By the digest of the session id (the cookie's value).
    sessions: Mutex<HashMap<String, Session>>,
    secret: String,
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn same(a: &str, b: &str) -> bool {
    flower_model::secret::same(a.as_bytes(), b.as_bytes())
}

impl Default for Auth {
    fn default() -> Self {
        Self { sessions: Mutex::default(), secret: hex::encode(rand::random::<[u8; 32]>()), failures: Mutex::default() }
    }
}

impl Auth {
    /// The CSRF value of a caller without a session: derived from what it
    /// showed (a bearer credential), or from this process's secret.
    fn csrf_of(&self, shown: &str) -> String {
        digest(&format!("flower-console-csrf:{}:{shown}", self.secret))
    }

    /// Whether `ip` may try to sign in now.
    pub fn throttled(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip else { return false };
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.get(&ip).is_some_and(|(n, since)| *n >= MAX_FAILURES && since.elapsed() < FAILURE_WINDOW)
    }

    /// Count a failed sign-in from `ip`.
    pub fn failed(&self, ip: Option<IpAddr>) {
        let Some(ip) = ip else { return };
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let entry = failures.entry(ip).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= FAILURE_WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }

    /// Open a session for `caller`: the `Set-Cookie` value.
    pub fn open(&self, caller: Caller) -> String {
        let id = hex::encode(rand::random::<[u8; 32]>());
        let csrf = self.csrf_of(&id);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, s| s.until > Instant::now());
        sessions.insert(digest(&id), Session { caller, csrf, until: Instant::now() + SESSION_TTL });
        format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}", SESSION_TTL.as_secs())
    }

    /// End the session the request's cookie names: the `Set-Cookie` value that clears it.
    pub fn close(&self, headers: &HeaderMap) -> String {
        if let Some(id) = cookie(headers, COOKIE) {
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(&digest(&id));
        }
        format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
    }

    /// The caller and CSRF value of the request's session, if it is live.
    fn session(&self, headers: &HeaderMap) -> Option<(Caller, String)> {
        let id = cookie(headers, COOKIE)?;
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let s = sessions.get(&digest(&id)).filter(|s| s.until > Instant::now())?;
        Some((s.caller.clone(), s.csrf.clone()))
    }
}

/// A request's caller: the application acting for it, and the CSRF value
/// its forms carry.
pub struct Signed {
    pub app: App,
    pub csrf: String,
}

impl Signed {
    /// `Ok` when a posted form carries this caller's CSRF value.
    pub fn form(&self, given: &str) -> Result<(), Refusal> {
        if same(given, &self.csrf) { Ok(()) } else { Err(Refusal::StaleForm) }
    }
}

/// The peer's address, when the console is served with it.
pub fn peer(parts: &Parts) -> Option<SocketAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}

/// The peer's address as an extractor (none when the console is served
/// without it, as in tests that call the router directly).
pub struct Peer(pub Option<SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(peer(parts)))
    }
}

/// The audit log's "from where" of a console request.
pub fn origin(parts: &Parts) -> String {
    peer(parts).map_or_else(|| "console".into(), |a| format!("console {a}"))
}

impl FromRequestParts<Console> for Signed {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Refusal> {
        let app = c.app();
        let bearer = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if let Some(b) = bearer {
            let credential = b.strip_prefix("Bearer ").ok_or(Refusal::SignIn(next(parts)))?;
            let acting = app.authenticate(Some(credential), &origin(parts)).await?;
            return Ok(Signed { app: acting, csrf: c.auth().csrf_of(&digest(credential)) });
        }
        if let Some((caller, csrf)) = c.auth().session(&parts.headers) {
            // A session lasts no longer than its credential: expired or revoked since, it ends.
            if !app.still_valid(&caller).await? {
                c.auth().close(&parts.headers);
                return Err(Refusal::SignIn(next(parts)));
            }
            let caller = Caller { origin: origin(parts), ..caller };
            return Ok(Signed { app: app.acting_as(caller), csrf });
        }
        if !app.auth_required() {
            let acting = app.authenticate(None, &origin(parts)).await?;
            return Ok(Signed { app: acting, csrf: c.auth().csrf_of("") });
        }
        Err(Refusal::SignIn(next(parts)))
    }
}

/// Where to go after signing in: this request's path and query (a GET
/// page), or the jobs.
fn next(parts: &Parts) -> String {
    let asked = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    if parts.method == axum::http::Method::GET { local_path(asked).to_string() } else { "/".into() }
}

/// `to` when it is a path of this console (`/…`, not `//…` nor a URL), else `/`.
pub fn local_path(to: &str) -> &str {
    let ok = to.starts_with('/') && !to.starts_with("//") && !to.contains('\\') && !to.chars().any(char::is_control);
    if ok { to } else { "/" }
}

/// The cookie carrying the sign-in form's CSRF value (double submit).
pub const LOGIN_COOKIE: &str = "flower_console_login";

/// A sign-in form's CSRF value, and the `Set-Cookie` that goes with it.
pub fn login_form() -> (String, String) {
    let value = hex::encode(rand::random::<[u8; 16]>());
    let cookie = format!("{LOGIN_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/login; Max-Age=3600");
    (value, cookie)
}

/// Whether a sign-in's form value is the one its cookie carries.
pub fn login_form_ok(headers: &HeaderMap, given: &str) -> bool {
    cookie(headers, LOGIN_COOKIE).is_some_and(|v| !given.is_empty() && same(&v, given))
}

/// The value of the cookie `name`, when the request carries it.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name && !v.is_empty()).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd") && !same("abc", "ab") && !same("", "a"));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; flower_console=xyz; b=2"));
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn a_session_is_a_random_id_ended_by_sign_out() {
        let auth = Auth::default();
        let set = auth.open(Caller::local("test"));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        let value = set.split(';').next().unwrap().to_string();
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(&value).unwrap());
        let (caller, csrf) = auth.session(&h).unwrap();
        assert_eq!(caller.principal.subject, "local");
        assert_ne!(csrf, auth.csrf_of(""), "a session's CSRF value is its own");
        assert!(auth.close(&h).contains("Max-Age=0"));
        assert!(auth.session(&h).is_none(), "signed out");
        let mut forged = HeaderMap::new();
        forged.insert(header::COOKIE, HeaderValue::from_static("flower_console=00"));
        assert!(auth.session(&forged).is_none());
    }

    #[test]
    fn failed_sign_ins_are_throttled_per_address() {
        let auth = Auth::default();
        let (a, b) = (Some("127.0.0.2".parse().unwrap()), Some("127.0.0.3".parse().unwrap()));
        for _ in 0..MAX_FAILURES {
            assert!(!auth.throttled(a));
            auth.failed(a);
        }
        assert!(auth.throttled(a) && !auth.throttled(b));
    }

    #[test]
    fn only_local_paths_are_followed_after_sign_in() {
        assert_eq!(local_path("/jobs/abc?x=1"), "/jobs/abc?x=1");
        for bad in ["//evil.example/", "https://evil.example/", "/\\evil", "jobs", ""] {
            assert_eq!(local_path(bad), "/", "{bad:?}");
        }
    }
}
