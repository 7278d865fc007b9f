//! `/login`: the sign-in form, and its post, which sets the session cookie
//! (a digest of the token) when the token is this console's.

use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;

use super::redirect;
use crate::Console;
use crate::error::status;
use crate::views::layout;

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

/// The form; to the jobs when there is no token or the request shows it.
pub async fn page(State(c): State<Console>, headers: HeaderMap) -> Response {
    if !c.auth().required() || c.auth().shown(&headers) {
        return redirect("/");
    }
    layout::respond(StatusCode::OK, layout::sign_in(None))
}

/// Sign in: the cookie and the jobs, or the form again saying why not.
pub async fn sign_in(State(c): State<Console>, Form(f): Form<LoginForm>) -> Response {
    if !c.auth().required() {
        return redirect("/");
    }
    let Some(cookie) = c.auth().sign_in(&f.token) else {
        let why = "That token is not this service's.";
        return layout::respond(status(flower_model::ErrorKind::Unauthenticated), layout::sign_in(Some(why)));
    };
    let mut r = redirect("/");
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
