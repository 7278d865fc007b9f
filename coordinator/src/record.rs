//! A job's workflow record (`flower status JOB`, gRPC `GetWorkflow`): its
//! lineage, its sessions by step, the judge's verdicts, the questions asked
//! and their answers, the model calls waiting for a rate-limited route — read
//! from the job row, its sessions, its events and the routes' lines.

use flower_model::{EventKind, JobId, Lineage, Role, SessionId, now_ms};
use flower_store::{Store, StoreError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The job this one continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<Lineage>,
    /// Its continuations, oldest first.
    #[serde(default)]
    pub continued_by: Vec<JobId>,
    /// Its sessions but the workers', in the order started: the steps
    /// (clarify, goal, coordinator generations, judge rounds, asides).
    #[serde(default)]
    pub steps: Vec<Step>,
    /// How many worker sessions ran (one per task attempt).
    #[serde(default)]
    pub worker_sessions: usize,
    #[serde(default)]
    pub verdicts: Vec<VerdictLine>,
    #[serde(default)]
    pub questions: Vec<QuestionLine>,
    /// The coordinator's handoffs, each with the window an overflow error named.
    #[serde(default)]
    pub handoffs: Vec<HandoffLine>,
    /// Its model calls waiting now for a rate-limited provider route's turn
    /// (the job runs, held back by the route: not stalled).
    #[serde(default)]
    pub waiting_for_quota: Vec<QuotaWaitLine>,
}

/// A model call of the job waiting for its route's turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaWaitLine {
    /// The provider route (api|endpoint|key fingerprint|model).
    pub route: String,
    /// The task whose call it is; `None`: the coordinator's (or a step's).
    pub task: Option<String>,
    pub priority: u8,
    /// Since when it waits (ms).
    pub since: i64,
    /// When its turn should come (ms), as the route last told it.
    pub turn_at: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HandoffLine {
    /// The generation the new session is.
    pub generation: u32,
    /// The provider refused the prompt as too long (else the threshold was reached).
    pub forced: bool,
    pub degraded: bool,
    /// The model's real window, learnt from the provider's overflow error.
    pub window: Option<u64>,
    pub document: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub session: SessionId,
    pub role: String,
    pub label: String,
    pub started_at: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerdictLine {
    pub round: u32,
    pub session: SessionId,
    pub verdict: String,
    pub failed: Vec<String>,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionLine {
    pub id: String,
    pub role: String,
    pub question: String,
    pub options: Vec<String>,
    /// `None` while it waits.
    pub answer: Option<String>,
    /// `user` or `timeout`.
    pub answered_by: Option<String>,
}

/// Read `job`'s record.
pub async fn workflow(store: &dyn Store, job: JobId) -> Result<Record, StoreError> {
    let row = store.get_job(job).await?;
    let mut record =
        Record { continues: row.continues, continued_by: store.continuations(job).await?, ..Default::default() };
    for s in store.sessions(job).await? {
        if s.role == Role::Worker {
            record.worker_sessions += 1;
        } else {
            record.steps.push(Step {
                session: s.id,
                role: s.role.as_str().into(),
                label: s.label,
                started_at: s.created_at,
            });
        }
    }
    flower_store::scan_events(store, job, 0, |e| match &e.kind {
        EventKind::JudgeVerdict { round, session, verdict, failed, reason } => record.verdicts.push(VerdictLine {
            round: *round,
            session: *session,
            verdict: verdict.clone(),
            failed: failed.clone(),
            reason: reason.clone(),
        }),
        EventKind::QuestionAsked { id, role, question, options, .. } => record.questions.push(QuestionLine {
            id: id.clone(),
            role: role.clone(),
            question: question.clone(),
            options: options.clone(),
            answer: None,
            answered_by: None,
        }),
        EventKind::Handoff { generation, forced, degraded, document, window, .. } => {
            record.handoffs.push(HandoffLine {
                generation: *generation,
                forced: *forced,
                degraded: *degraded,
                window: *window,
                document: document.clone(),
            })
        }
        EventKind::QuestionAnswered { id, answer, by, .. } => {
            if let Some(q) = record.questions.iter_mut().find(|q| q.id == *id && q.answer.is_none()) {
                q.answer = Some(answer.clone());
                q.answered_by = Some(by.clone());
            }
        }
        _ => {}
    })
    .await?;
    if !row.state.is_terminal() {
        record.waiting_for_quota = quota_waits(store, job, now_ms()).await?;
    }
    Ok(record)
}

/// `job`'s model calls waiting for a route's turn at `now`, earliest turn first.
pub async fn quota_waits(store: &dyn Store, job: JobId, now: i64) -> Result<Vec<QuotaWaitLine>, StoreError> {
    let job = job.to_string();
    let mut out: Vec<QuotaWaitLine> = store
        .route_quotas()
        .await?
        .into_iter()
        .flat_map(|(route, state)| {
            state
                .waiting_at(now)
                .filter(|w| w.claim.job == job)
                .map(|w| QuotaWaitLine {
                    route: route.clone(),
                    task: Some(w.claim.task.clone()).filter(|t| !t.is_empty()),
                    priority: w.claim.priority,
                    since: w.since,
                    turn_at: w.turn_at,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by_key(|w| w.turn_at);
    Ok(out)
}

impl Record {
    /// The record for people, one line each, indented under the job's line.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(l) = &self.continues {
            out.push(format!("  continues {} with: {}", l.parent, one_line(&l.instruction)));
        }
        for c in &self.continued_by {
            out.push(format!("  continued by {c}"));
        }
        if !self.steps.is_empty() {
            let steps: Vec<String> = self.steps.iter().map(|s| format!("{} ({})", s.label, s.role)).collect();
            out.push(format!("  sessions: {}; {} worker session(s)", steps.join(" → "), self.worker_sessions));
        }
        for v in &self.verdicts {
            let failed =
                if v.failed.is_empty() { String::new() } else { format!(" ({} checks failed)", v.failed.len()) };
            out.push(format!("  judge round {}: {}{failed} — {}", v.round, v.verdict, one_line(&v.reason)));
        }
        for h in &self.handoffs {
            out.push(format!(
                "  handoff → generation {}: {}{}{} ({})",
                h.generation,
                if h.forced { "the provider refused the prompt as too long" } else { "the threshold was reached" },
                h.window.map(|w| format!("; the model's window is {w} tokens")).unwrap_or_default(),
                if h.degraded { "; degraded document" } else { "" },
                h.document
            ));
        }
        let now = now_ms();
        for w in &self.waiting_for_quota {
            out.push(format!(
                "  waiting_for_quota: {} on {} (priority {}; waiting {:.0} s, turn in ~{:.0} s)",
                w.task.as_deref().map_or_else(|| "the coordinator".to_string(), |t| format!("task {t}")),
                w.route,
                w.priority,
                (now - w.since).max(0) as f64 / 1000.0,
                (w.turn_at - now).max(0) as f64 / 1000.0,
            ));
        }
        for q in &self.questions {
            out.push(format!(
                "  asked ({}): {} → {}",
                q.role,
                one_line(&q.question),
                q.answer.as_deref().map(one_line).unwrap_or_else(|| "(waiting)".into())
            ));
        }
        out
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
