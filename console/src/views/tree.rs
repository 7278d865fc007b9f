//! The task tree: the coordinator-side sessions, the tasks each delegated,
//! and each task's worker session (its transcript), above the timeline.

use std::collections::BTreeMap;

use flower_coordinator::record::QuotaWaitLine;
use flower_model::{JobId, Role, SessionId, Task, TaskId};
use maud::{Markup, display, html};

use super::{charts, cut, human_ms};
use crate::routes::job::JobView;

/// Coordinator-side sessions with the tasks they delegated, each task with
/// its worker session (its transcript).
pub fn task_tree(v: &JobView, now: i64) -> Markup {
    let job = v.job.id;
    let mut by_parent: BTreeMap<SessionId, Vec<&Task>> = BTreeMap::new();
    for t in &v.tasks {
        by_parent.entry(t.parent_session).or_default().push(t);
    }
    let worker_session: BTreeMap<TaskId, SessionId> =
        v.sessions.iter().filter_map(|s| s.task_id.map(|t| (t, s.id))).collect();
    let waiting: BTreeMap<String, &QuotaWaitLine> =
        v.record.waiting_for_quota.iter().filter_map(|w| Some((w.task.clone()?, w))).collect();
    let quota = |t: &Task| waiting.get(&t.id.to_string()).copied();
    html! {
        section id="tree" aria-labelledby="tree-h" {
            h2 id="tree-h" { "Task tree" }
            ul class="tree" {
                @for s in v.sessions.iter().filter(|s| s.role != Role::Worker) {
                    @let tasks = by_parent.remove(&s.id).unwrap_or_default();
                    li {
                        a href={ "/jobs/" (display(job)) "/sessions/" (display(s.id)) } class="session" {
                            (s.label) " " span class="role" { (s.role.as_str()) }
                        }
                        @if !tasks.is_empty() {
                            ul { @for t in tasks { (task_item(job, t, worker_session.get(&t.id), quota(t))) } }
                        }
                    }
                }
                // Tasks whose delegating session is not stored (never expected).
                @for t in by_parent.into_values().flatten() {
                    (task_item(job, t, worker_session.get(&t.id), quota(t)))
                }
            }
            (charts::waterfall(v, now))
        }
    }
}

/// What a held task waits for, on hover.
const HELD: &str = "waiting for its namespace's task limit (no worker slot taken)";

/// One task: what it is (a link to its transcript when it has a session),
/// its state, attempt, duration, tokens and who ran it.
fn task_item(job: JobId, t: &Task, session: Option<&SessionId>, quota: Option<&QuotaWaitLine>) -> Markup {
    let label = if t.worker == flower_model::job::COMMAND_TASK {
        html! { "command: " (cut(&t.mandate, 80)) }
    } else {
        html! { (t.worker) " — " (t.description) }
    };
    let st = t.state.as_str();
    let held = t.state == flower_model::TaskState::Held;
    html! {
        li class="task" data-task=(display(t.id)) {
            @match session {
                Some(s) => a href={ "/jobs/" (display(job)) "/sessions/" (display(s)) } { (label) },
                None => (label),
            }
            " " span class={ "tstate tstate-" (st) } title=[held.then_some(HELD)] { (st) } " "
            @if let Some(w) = quota {
                span class="tstate tstate-waiting_for_quota" title={ "its model call waits for its turn on " (w.route) } {
                    "waiting_for_quota"
                } " "
            }
            span class="sub" {
                "attempt " (t.attempt) " · " (human_ms(t.updated_at - t.created_at)) " · "
                (t.usage.context_tokens() + t.usage.output_tokens) " tokens"
                @if let Some(w) = &t.claimed_by { " · " (w) }
            }
        }
    }
}
