//! The user's actions, posted from the job page: cancel, a message to the
//! coordinator, an answer to a waiting question. Each checks the form's
//! CSRF value, hands the form to the application layer (which checks the
//! job id and the text) and sends the browser back to the job.

use axum::extract::{Form, Path};
use axum::response::Response;
use flower_coordinator::app::AnswerRequest;
use serde::Deserialize;

use super::redirect;
use crate::auth::Signed;
use crate::error::Refusal;

#[derive(Deserialize)]
pub struct CancelForm {
    csrf: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
pub struct MessageForm {
    csrf: String,
    message: String,
}

#[derive(Deserialize)]
pub struct AnswerForm {
    csrf: String,
    question: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    option: Option<u32>,
}

/// Back to the job's page.
fn to_job(job: &flower_model::Job) -> Response {
    redirect(&format!("/jobs/{}", job.id))
}

pub async fn cancel(s: Signed, Path(job): Path<String>, Form(f): Form<CancelForm>) -> Result<Response, Refusal> {
    s.form(&f.csrf)?;
    let reason = if f.reason.trim().is_empty() { "cancelled from the console" } else { f.reason.as_str() };
    Ok(to_job(&s.app.cancel(&job, reason).await?))
}

pub async fn interrupt(s: Signed, Path(job): Path<String>, Form(f): Form<MessageForm>) -> Result<Response, Refusal> {
    s.form(&f.csrf)?;
    Ok(to_job(&s.app.interrupt(&job, &f.message).await?))
}

pub async fn answer(s: Signed, Path(job): Path<String>, Form(f): Form<AnswerForm>) -> Result<Response, Refusal> {
    s.form(&f.csrf)?;
    let answer = AnswerRequest { question_id: f.question, text: f.text, option: f.option.unwrap_or(0) };
    Ok(to_job(&s.app.answer(&job, answer).await?))
}
