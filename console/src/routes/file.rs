//! `/jobs/ID/files/PATH`: one file of a job's workbench, as plain text or a
//! download, sandboxed so that a file can never script the console.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::Console;
use crate::auth::Signed;
use crate::error::Refusal;

#[derive(Deserialize, Default)]
pub struct FileQuery {
    /// 1: as a download, whatever it holds.
    #[serde(default)]
    download: u8,
}

pub async fn file(
    s: Signed,
    State(c): State<Console>,
    Path((job, path)): Path<(String, String)>,
    Query(q): Query<FileQuery>,
) -> Result<Response, Refusal> {
    let job = s.app.job_id("job_id", &job).await?;
    let bytes = c.app().artifact(job, &path).await?;
    let text = std::str::from_utf8(&bytes).is_ok();
    let kind = if text { "text/plain; charset=utf-8" } else { "application/octet-stream" };
    let mut r = (StatusCode::OK, bytes).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'; sandbox"));
    if (q.download == 1 || !text)
        && let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{}\"", download_name(&path)))
    {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

/// The file's name as a download offers it: its last component, only the
/// characters safe in a quoted header value.
fn download_name(path: &str) -> String {
    path.rsplit('/')
        .next()
        .unwrap_or("file")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || ".-_".contains(*c))
        .collect()
}
