//! `/login`: the sign-in form, and its post, which checks the credential
//! with the application layer (an API key, the operator's token or a signed
//! token), opens a session and goes on to the page asked for; failures are
//! throttled per address. `/logout` ends the session.

use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;

use super::redirect;
use crate::Console;
use crate::auth::{Peer, local_path};
use crate::error::status;
use crate::views::layout;

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
    /// The form's CSRF value, as its cookie carries it.
    #[serde(default)]
    csrf: String,
}

/// The form; to the jobs when no credential is needed.
pub async fn page(State(c): State<Console>) -> Response {
    if !c.app().auth_required() {
        return redirect("/");
    }
    layout::sign_in(StatusCode::OK, None, "/")
}

fn with_cookie(mut r: Response, cookie: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// Sign in: a session and the page asked for, or the form again saying why not.
pub async fn sign_in(
    State(c): State<Console>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = local_path(&f.next).to_string();
    let ip = peer.map(|p| p.ip());
    if c.auth().throttled(ip) {
        let why = "Too many failed sign-ins from this address: wait a minute.";
        return layout::sign_in(StatusCode::TOO_MANY_REQUESTS, Some(why), &next);
    }
    if c.app().auth_required() && !crate::auth::login_form_ok(&headers, &f.csrf) {
        let why = "This sign-in form is stale or not the console's (CSRF check): sign in again here.";
        return layout::sign_in(StatusCode::FORBIDDEN, Some(why), &next);
    }
    let origin = peer.map_or_else(|| "console".into(), |p| format!("console {p}"));
    match c.app().authenticate(Some(f.token.trim()), &origin).await {
        Ok(app) if c.app().auth_required() => match app.caller() {
            Ok(caller) => with_cookie(redirect(&next), &c.auth().open(caller)),
            Err(e) => layout::sign_in(status(e.kind), Some(&e.message), &next),
        },
        Ok(_) => redirect(&next),
        Err(e) => {
            c.auth().failed(ip);
            let why = match e.kind {
                flower_model::ErrorKind::Unauthenticated => "That key or token is not valid here.".to_string(),
                _ => e.message,
            };
            layout::sign_in(status(e.kind), Some(&why), &next)
        }
    }
}

/// Sign out: the session ends, the cookie is cleared.
pub async fn sign_out(State(c): State<Console>, headers: HeaderMap) -> Response {
    let cleared = c.auth().close(&headers);
    with_cookie(redirect(if c.app().auth_required() { "/login" } else { "/" }), &cleared)
}
