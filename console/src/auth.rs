//! The console's one sign-in and CSRF scheme (docs/design.md section 14).
//!
//! With a token, every request shows it: a bearer header (scripts) or the
//! HttpOnly cookie the sign-in form sets, whose value is a digest of the
//! token (never the token); anything else is refused with the sign-in form
//! ([`Signed`], the extractor every page, stream and action takes; not the
//! sign-in form, nor the stylesheet and script).
//! Every form that changes a job carries a CSRF value derived from the
//! token (or, without one, from a secret of this process), checked by
//! [`Auth::form`]. Every comparison is the project's constant-time one
//! ([`flower_model::secret::same`]).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::Console;
use crate::error::Refusal;

/// The session cookie's name.
pub const COOKIE: &str = "flower_console";

/// The token's digest (the cookie's value) and the CSRF value of this console.
pub struct Auth {
    /// `None`: no token is set, every request is let in.
    session: Option<String>,
    csrf: String,
}

fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The cookie value a token signs in with.
fn session_of(token: &str) -> String {
    digest(&format!("flower-console-session:{token}"))
}

fn same(a: &str, b: &str) -> bool {
    flower_model::secret::same(a.as_bytes(), b.as_bytes())
}

impl Auth {
    /// The scheme for `token` (none, or empty: no sign-in).
    pub fn new(token: Option<String>) -> Self {
        let token = token.filter(|t| !t.is_empty());
        let secret = token.clone().unwrap_or_else(|| hex::encode(rand::random::<[u8; 32]>()));
        Self { session: token.as_deref().map(session_of), csrf: digest(&format!("flower-console-csrf:{secret}")) }
    }

    /// Whether requests must show a token.
    pub fn required(&self) -> bool {
        self.session.is_some()
    }

    /// Whether the request shows the token (or none is set).
    pub fn shown(&self, headers: &HeaderMap) -> bool {
        let Some(want) = &self.session else { return true };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(session_of);
        let cookie = cookie(headers, COOKIE);
        bearer.iter().chain(cookie.iter()).any(|got| same(got, want))
    }

    /// The `Set-Cookie` value that signs a browser in with `token`, when it
    /// is this console's token.
    pub fn sign_in(&self, token: &str) -> Option<String> {
        let want = self.session.as_ref()?;
        let got = session_of(token);
        same(&got, want).then(|| format!("{COOKIE}={got}; HttpOnly; SameSite=Strict; Path=/"))
    }

    /// The CSRF value every form that changes a job carries.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// `Ok` when a posted form carries this console's CSRF value.
    pub fn form(&self, given: &str) -> Result<(), Refusal> {
        if same(given, &self.csrf) { Ok(()) } else { Err(Refusal::StaleForm) }
    }
}

/// A request that showed the token (or came to a console without one).
pub struct Signed;

impl FromRequestParts<Console> for Signed {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Refusal> {
        if c.auth().shown(&parts.headers) { Ok(Signed) } else { Err(Refusal::SignIn) }
    }
}

/// The value of the cookie `name`, when the request carries it.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == name).then(|| v.to_string())
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
    fn a_token_is_shown_by_bearer_or_by_the_cookie_sign_in_sets() {
        let auth = Auth::new(Some("s3cret".into()));
        assert!(!auth.shown(&HeaderMap::new()));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"));
        assert!(auth.shown(&h));
        assert_eq!(auth.sign_in("wrong"), None);
        let set = auth.sign_in("s3cret").unwrap();
        assert!(!set.contains("s3cret"), "the cookie holds a digest, never the token");
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(set.split(';').next().unwrap()).unwrap());
        assert!(auth.shown(&h));
        assert!(auth.form(auth.csrf()).is_ok() && auth.form("forged").is_err());
        let open = Auth::new(Some(String::new()));
        assert!(!open.required() && open.shown(&HeaderMap::new()) && open.sign_in("x").is_none());
    }
}
