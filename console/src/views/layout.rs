//! The document around every page, the headers every page is sent with
//! (the content security policy among them), the problem page and the
//! sign-in form.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// Pages load their script and style from the console only; nothing inline.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
                   frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// A page or fragment with the console's headers: HTML, the content
/// security policy, no sniffing, no referrer, never cached.
pub fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut r = (status, markup).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A whole page: `body` under the console's top bar, titled `title`.
pub fn document(title: &str, body: Markup) -> Markup {
    page(title, body, true)
}

/// A whole page, with the sign-out button or (the sign-in form's page) without.
fn page(title: &str, body: Markup, sign_out: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · flower" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header class="top" {
                    a href="/" class="brand" { "flower" }
                    nav aria-label="main" { a href="/" { "Jobs" } }
                    @if sign_out {
                        form method="post" action="/logout" class="sign-out" { button type="submit" { "Sign out" } }
                    }
                }
                (body)
            }
        }
    }
}

/// The page for a refused or failed request.
pub fn problem(message: &str) -> Markup {
    document(
        "flower",
        html! {
            main {
                p class="error" role="alert" { (message) }
                p { a href="/" { "Jobs" } }
            }
        },
    )
}

/// The sign-in page, saying why the last try failed when it did; after
/// signing in, the browser goes to `next`. Sent with its CSRF cookie.
pub fn sign_in(status: StatusCode, error: Option<&str>, next: &str) -> Response {
    let (csrf, cookie) = crate::auth::login_form();
    let mut r = respond(status, sign_in_form(error, next, &csrf));
    if let Ok(v) = axum::http::HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(axum::http::header::SET_COOKIE, v);
    }
    r
}

fn sign_in_form(error: Option<&str>, next: &str, csrf: &str) -> Markup {
    page(
        "Sign in",
        html! {
            main class="narrow" {
                h1 { "flower" }
                form method="post" action="/login" class="card" {
                    label for="token" { "Access token or API key" }
                    input id="token" name="token" type="password" autocomplete="current-password" required autofocus;
                    input type="hidden" name="next" value=(next);
                    input type="hidden" name="csrf" value=(csrf);
                    @if let Some(e) = error {
                        p class="error" role="alert" { (e) }
                    }
                    button type="submit" { "Sign in" }
                }
            }
        },
        false,
    )
}
