//! The domain's types on the wire and back: states, roles, usage, jobs and
//! the typed details of events. Conversions only; what a message means is
//! its caller's business.

use flower_model as m;

use crate::v1 as pb;

impl From<m::JobState> for pb::JobState {
    fn from(s: m::JobState) -> Self {
        match s {
            m::JobState::Queued => Self::Queued,
            m::JobState::Running => Self::Running,
            m::JobState::WaitingForUser => Self::WaitingForUser,
            m::JobState::WaitingForBudget => Self::WaitingForBudget,
            m::JobState::Succeeded => Self::Succeeded,
            m::JobState::Failed => Self::Failed,
            m::JobState::Cancelled => Self::Cancelled,
        }
    }
}

/// A job's state from the wire: the typed field, or (from a service that
/// predates it) the name.
pub fn job_state(typed: i32, name: &str) -> Option<m::JobState> {
    match pb::JobState::try_from(typed).unwrap_or(pb::JobState::Unspecified) {
        pb::JobState::Unspecified => name.parse().ok(),
        pb::JobState::Queued => Some(m::JobState::Queued),
        pb::JobState::Running => Some(m::JobState::Running),
        pb::JobState::WaitingForUser => Some(m::JobState::WaitingForUser),
        pb::JobState::WaitingForBudget => Some(m::JobState::WaitingForBudget),
        pb::JobState::Succeeded => Some(m::JobState::Succeeded),
        pb::JobState::Failed => Some(m::JobState::Failed),
        pb::JobState::Cancelled => Some(m::JobState::Cancelled),
    }
}

impl From<m::TaskState> for pb::TaskState {
    fn from(s: m::TaskState) -> Self {
        match s {
            m::TaskState::Held => Self::Held,
            m::TaskState::Queued => Self::Queued,
            m::TaskState::Running => Self::Running,
            m::TaskState::Succeeded => Self::Succeeded,
            m::TaskState::Failed => Self::Failed,
            m::TaskState::Cancelled => Self::Cancelled,
        }
    }
}

/// A task's state from the wire: the typed field, or (from a sender that
/// predates it) the name.
pub fn task_state(typed: i32, name: &str) -> Option<m::TaskState> {
    match pb::TaskState::try_from(typed).unwrap_or(pb::TaskState::Unspecified) {
        pb::TaskState::Unspecified => name.parse().ok(),
        pb::TaskState::Held => Some(m::TaskState::Held),
        pb::TaskState::Queued => Some(m::TaskState::Queued),
        pb::TaskState::Running => Some(m::TaskState::Running),
        pb::TaskState::Succeeded => Some(m::TaskState::Succeeded),
        pb::TaskState::Failed => Some(m::TaskState::Failed),
        pb::TaskState::Cancelled => Some(m::TaskState::Cancelled),
    }
}

impl From<m::Role> for pb::Role {
    fn from(r: m::Role) -> Self {
        match r {
            m::Role::Coordinator => Self::Coordinator,
            m::Role::Worker => Self::Worker,
            m::Role::Judge => Self::Judge,
            m::Role::Clarifier => Self::Clarifier,
            m::Role::Aside => Self::Aside,
        }
    }
}

/// A session's role from the wire: the typed field, or the name.
pub fn role(typed: i32, name: &str) -> Option<m::Role> {
    match pb::Role::try_from(typed).unwrap_or(pb::Role::Unspecified) {
        pb::Role::Unspecified => name.parse().ok(),
        pb::Role::Coordinator => Some(m::Role::Coordinator),
        pb::Role::Worker => Some(m::Role::Worker),
        pb::Role::Judge => Some(m::Role::Judge),
        pb::Role::Clarifier => Some(m::Role::Clarifier),
        pb::Role::Aside => Some(m::Role::Aside),
    }
}

impl From<&m::Usage> for pb::Usage {
    fn from(u: &m::Usage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            cache_creation_5m_input_tokens: u.cache_creation.ephemeral_5m_input_tokens,
            cache_creation_1h_input_tokens: u.cache_creation.ephemeral_1h_input_tokens,
        }
    }
}

impl From<&pb::Usage> for m::Usage {
    fn from(u: &pb::Usage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            cache_creation: m::usage::CacheCreation {
                ephemeral_5m_input_tokens: u.cache_creation_5m_input_tokens,
                ephemeral_1h_input_tokens: u.cache_creation_1h_input_tokens,
            },
        }
    }
}

impl From<&m::Job> for pb::Job {
    fn from(j: &m::Job) -> Self {
        Self {
            id: j.id.to_string(),
            name: j.name.clone(),
            state: j.state.as_str().into(),
            reason: j.reason.clone().unwrap_or_default(),
            final_answer: j.final_answer.clone().unwrap_or_default(),
            created_at_ms: j.created_at,
            updated_at_ms: j.updated_at,
            usage: Some((&j.usage).into()),
            continues_job_id: j.continues.as_ref().map(|l| l.parent.to_string()).unwrap_or_default(),
            instruction: j.continues.as_ref().map(|l| l.instruction.clone()).unwrap_or_default(),
            job_state: pb::JobState::from(j.state).into(),
            namespace: j.namespace.clone(),
            submitted_by: j.submitted_by.clone().unwrap_or_default(),
        }
    }
}

impl From<&m::access::ApiKey> for pb::ApiKey {
    fn from(k: &m::access::ApiKey) -> Self {
        Self {
            id: k.id.clone(),
            namespace: k.namespace.clone(),
            role: k.role.as_str().into(),
            name: k.name.clone(),
            created_at_ms: k.created_at,
            created_by: k.created_by.clone(),
            expires_at_ms: k.expires_at.unwrap_or_default(),
            last_used_at_ms: k.last_used_at.unwrap_or_default(),
            revoked_at_ms: k.revoked_at.unwrap_or_default(),
        }
    }
}

/// A key read back from the wire (never with its digest); a role this
/// client does not know is refused with its name.
impl TryFrom<pb::ApiKey> for m::access::ApiKey {
    type Error = String;
    fn try_from(k: pb::ApiKey) -> Result<Self, String> {
        let at = |v: i64| (v != 0).then_some(v);
        Ok(Self {
            role: k.role.parse()?,
            id: k.id,
            namespace: k.namespace,
            name: k.name,
            digest: String::new(),
            created_at: k.created_at_ms,
            created_by: k.created_by,
            expires_at: at(k.expires_at_ms),
            last_used_at: at(k.last_used_at_ms),
            revoked_at: at(k.revoked_at_ms),
        })
    }
}

impl TryFrom<pb::AuditRecord> for m::access::AuditRecord {
    type Error = String;
    fn try_from(r: pb::AuditRecord) -> Result<Self, String> {
        Ok(Self {
            outcome: r.outcome.parse()?,
            seq: r.seq,
            at: r.at_ms,
            subject: r.subject,
            namespace: r.namespace,
            action: r.action,
            target: r.target,
            origin: r.origin,
            detail: r.detail,
        })
    }
}

impl From<&m::access::AuditRecord> for pb::AuditRecord {
    fn from(a: &m::access::AuditRecord) -> Self {
        Self {
            seq: a.seq,
            at_ms: a.at,
            subject: a.subject.clone(),
            namespace: a.namespace.clone(),
            action: a.action.clone(),
            target: a.target.clone(),
            origin: a.origin.clone(),
            outcome: a.outcome.as_str().into(),
            detail: a.detail.clone(),
        }
    }
}

impl pb::Job {
    /// The job's state, typed (`None`: a state this client does not know).
    pub fn typed_state(&self) -> Option<m::JobState> {
        job_state(self.job_state, &self.state)
    }
}

impl pb::Session {
    /// The session's role, typed.
    pub fn typed_role(&self) -> Option<m::Role> {
        role(self.session_role, &self.role)
    }
}

impl From<&m::Event> for pb::JobEvent {
    fn from(e: &m::Event) -> Self {
        use pb::job_event::Detail;
        let detail = match &e.kind {
            m::EventKind::JobState { state, reason } => Some(Detail::JobStateChanged(pb::JobStateChanged {
                state: pb::JobState::from(*state).into(),
                reason: reason.clone().unwrap_or_default(),
            })),
            m::EventKind::QuestionAsked { id, role, question, options, .. } => {
                Some(Detail::QuestionAsked(pb::QuestionAsked {
                    id: id.clone(),
                    question: question.clone(),
                    options: options.clone(),
                    role: role.parse::<m::Role>().map(pb::Role::from).unwrap_or(pb::Role::Unspecified).into(),
                }))
            }
            m::EventKind::QuestionAnswered { id, answer, .. } => {
                Some(Detail::QuestionAnswered(pb::QuestionAnswered { id: id.clone(), answer: answer.clone() }))
            }
            _ => None,
        };
        Self {
            job_id: e.job_id.to_string(),
            seq: e.seq,
            at_ms: e.at,
            kind: e.kind.name().into(),
            payload_json: serde_json::to_string(&e.kind).unwrap_or_default(),
            detail,
        }
    }
}

impl From<&m::access::Limits> for pb::Limits {
    fn from(l: &m::access::Limits) -> Self {
        pb::Limits {
            max_jobs: l.max_jobs,
            max_tasks: l.max_tasks,
            cost_per_day_usd: l.cost_per_day_usd,
            cost_per_month_usd: l.cost_per_month_usd,
            tokens_per_day: l.tokens_per_day,
            wait_ms: l.wait.map(|w| w.as_millis() as u64),
        }
    }
}

impl From<pb::Limits> for m::access::Limits {
    fn from(l: pb::Limits) -> Self {
        m::access::Limits {
            max_jobs: l.max_jobs,
            max_tasks: l.max_tasks,
            cost_per_day_usd: l.cost_per_day_usd,
            cost_per_month_usd: l.cost_per_month_usd,
            tokens_per_day: l.tokens_per_day,
            wait: l.wait_ms.map(std::time::Duration::from_millis),
        }
    }
}

impl From<&m::access::Namespace> for pb::Namespace {
    fn from(n: &m::access::Namespace) -> Self {
        pb::Namespace {
            name: n.name.clone(),
            created_at_ms: n.created_at,
            limits: Some((&n.limits).into()),
            spend: None,
        }
    }
}

impl From<pb::Namespace> for m::access::Namespace {
    fn from(n: pb::Namespace) -> Self {
        m::access::Namespace {
            name: n.name,
            created_at: n.created_at_ms,
            limits: n.limits.map(Into::into).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_roles_go_and_come_back() {
        use m::JobState::*;
        for s in [Queued, Running, WaitingForUser, WaitingForBudget, Succeeded, Failed, Cancelled] {
            assert_eq!(job_state(pb::JobState::from(s).into(), ""), Some(s));
            // A service that predates the typed field sends the name only.
            assert_eq!(job_state(0, s.as_str()), Some(s));
        }
        use m::TaskState as T;
        for s in [T::Held, T::Queued, T::Running, T::Succeeded, T::Failed, T::Cancelled] {
            assert_eq!(task_state(pb::TaskState::from(s).into(), ""), Some(s));
            assert_eq!(task_state(0, s.as_str()), Some(s));
        }
        for r in [m::Role::Coordinator, m::Role::Worker, m::Role::Judge, m::Role::Clarifier, m::Role::Aside] {
            assert_eq!(role(pb::Role::from(r).into(), ""), Some(r));
        }
        assert_eq!(job_state(99, "nonsense"), None);
    }

    #[test]
    fn usage_keeps_its_cache_split() {
        let mut u = m::Usage { input_tokens: 3, output_tokens: 4, cache_read_input_tokens: 5, ..Default::default() };
        u.cache_creation_input_tokens = 9;
        u.cache_creation.ephemeral_5m_input_tokens = 7;
        u.cache_creation.ephemeral_1h_input_tokens = 2;
        assert_eq!(m::Usage::from(&pb::Usage::from(&u)), u);
    }
}
