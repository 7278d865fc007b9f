//! The console's routes, one module per page or action. Each takes
//! [`crate::auth::Signed`] (the token shown), translates its path, query
//! or form into an application-layer call or a read, and renders what comes
//! back; refusals are [`crate::error::Refusal`]s. Parsing a query for
//! display (filters, paging) is a route's; checking ids, text and paths is
//! the application layer's.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub mod actions;
pub mod file;
pub mod job;
pub mod jobs;
pub mod live;
pub mod login;
pub mod transcript;

/// A `303 See Other` to `to`.
fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}
