//! Checking a call against its caller and recording it (docs/design.md,
//! section 17): every mutating call — allowed, refused or failed — is one
//! row of the audit log, with who, where, what, on what and how it ended.

use flower_model::ErrorKind;
use flower_model::access::{AuditRecord, Outcome};
use flower_model::{Job, now_ms};

use super::access::{Action, Caller, Owner};
use super::{App, AppError, Result};

/// A mutating call as the audit log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Submit,
    Continue,
    Cancel,
    Interrupt,
    Answer,
    Aside,
    CreateNamespace,
    CreateKey,
    RotateKey,
    RevokeKey,
    SetLimits,
    RaiseBudget,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Submit => "submit",
            Verb::Continue => "continue",
            Verb::Cancel => "cancel",
            Verb::Interrupt => "interrupt",
            Verb::Answer => "answer",
            Verb::Aside => "aside",
            Verb::CreateNamespace => "namespace.create",
            Verb::CreateKey => "key.create",
            Verb::RotateKey => "key.rotate",
            Verb::RevokeKey => "key.revoke",
            Verb::SetLimits => "namespace.limits",
            Verb::RaiseBudget => "namespace.raise",
        }
    }

    /// What the caller's role must allow.
    pub fn action(self) -> Action {
        match self {
            Verb::Submit => Action::Submit,
            Verb::Continue | Verb::Interrupt | Verb::Answer | Verb::Aside => Action::Steer,
            Verb::Cancel => Action::Cancel,
            Verb::CreateNamespace | Verb::SetLimits => Action::ManageNamespaces,
            Verb::RaiseBudget => Action::RaiseBudget,
            Verb::CreateKey | Verb::RotateKey | Verb::RevokeKey => Action::ManageKeys,
        }
    }
}

/// Longest target or detail an audit record keeps (what a caller sends is
/// cut: an anonymous request must not fill the log).
pub const MAX_FIELD: usize = 256;

/// `text`, cut at `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    match text.char_indices().map(|(i, c)| i + c.len_utf8()).take_while(|end| *end <= max).last() {
        Some(end) if end < text.len() => &text[..end],
        Some(_) => text,
        None => "",
    }
}

fn outcome_of(kind: ErrorKind) -> Outcome {
    match kind {
        ErrorKind::Unauthenticated => Outcome::Unauthenticated,
        ErrorKind::PermissionDenied | ErrorKind::NotFound => Outcome::Denied,
        _ => Outcome::Failed,
    }
}

impl App {
    /// Write one audit record (a failure to write is logged, not returned:
    /// the call it records has happened, or been refused, already).
    pub(crate) async fn record(
        &self,
        caller: &Caller,
        verb: Verb,
        namespace: &str,
        target: &str,
        result: Result<(), &AppError>,
    ) {
        let (outcome, detail) = match result {
            Ok(()) => (Outcome::Ok, String::new()),
            Err(e) => (outcome_of(e.kind), cut(&e.message, MAX_FIELD).to_string()),
        };
        let target = cut(target, MAX_FIELD);
        let record = AuditRecord {
            seq: 0,
            at: now_ms(),
            subject: caller.principal.subject.clone(),
            namespace: namespace.to_string(),
            action: verb.as_str().to_string(),
            target: target.to_string(),
            origin: caller.origin.clone(),
            outcome,
            detail,
        };
        if let Err(e) = self.b.store.append_audit(vec![record]).await {
            tracing::error!(error = %e, action = verb.as_str(), target, "an audit record was not written");
        }
    }

    /// Record a call refused before any caller was known (no credential, a
    /// bad one): subject `anonymous`, in the default namespace.
    pub async fn record_refused(&self, origin: &str, verb: Verb, target: &str, error: &AppError) {
        let caller = Caller::local(origin);
        let anonymous = Caller {
            principal: super::access::Principal { subject: "anonymous".into(), ..caller.principal },
            origin: caller.origin,
            until: None,
        };
        self.record(&anonymous, verb, flower_model::access::DEFAULT_NAMESPACE, target, Err(error)).await;
    }

    /// Whether the caller may do `verb` on `job`: `NOT_FOUND` when the
    /// job's namespace is not the caller's, `PERMISSION_DENIED` when its
    /// role does not allow it. A refusal is recorded.
    pub(crate) async fn authorize_on(&self, caller: &Caller, verb: Verb, job: &Job, target: &str) -> Result<()> {
        let p = &caller.principal;
        let owner = if job.submitted_by.as_deref() == Some(p.subject.as_str()) { Owner::Caller } else { Owner::Other };
        let refused = if !p.sees(&job.namespace) {
            Some(super::not_found(target))
        } else if !p.allows(verb.action(), &job.namespace, owner) {
            Some(denied(caller, verb, owner))
        } else {
            None
        };
        match refused {
            Some(e) => {
                let ns = if p.sees(&job.namespace) { job.namespace.as_str() } else { p.namespace.as_str() };
                self.record(caller, verb, ns, target, Err(&e)).await;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Whether the caller may do `verb` in `namespace` (no job yet: a
    /// submit, a key, a namespace). A refusal is recorded.
    pub(crate) async fn authorize_in(&self, caller: &Caller, verb: Verb, namespace: &str, target: &str) -> Result<()> {
        if caller.principal.allows(verb.action(), namespace, Owner::Caller) {
            return Ok(());
        }
        let e = denied(caller, verb, Owner::Caller);
        self.record(caller, verb, &caller.principal.namespace, target, Err(&e)).await;
        Err(e)
    }

    /// The namespace a request names, or the caller's: `None` for an
    /// admin naming none (every namespace). Another namespace than the
    /// caller's is refused but for an admin.
    pub(crate) fn namespace_scope(&self, field: &str, named: &str) -> Result<Option<String>> {
        let p = self.caller()?.principal;
        if named.is_empty() {
            return Ok((p.role != super::access::Role::Admin).then_some(p.namespace));
        }
        flower_model::access::check_namespace(named).map_err(|m| AppError::invalid(field, m))?;
        if !p.sees(named) {
            return Err(AppError::new(
                ErrorKind::PermissionDenied,
                format!("{field}: this credential is bound to namespace `{}`", p.namespace),
            ));
        }
        Ok(Some(named.to_string()))
    }

    /// Run a call and record how it ended.
    pub(crate) async fn audited<T>(
        &self,
        caller: &Caller,
        verb: Verb,
        namespace: &str,
        target: &str,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let result = call.await;
        self.record(caller, verb, namespace, target, result.as_ref().map(|_| ())).await;
        result
    }
}

fn denied(caller: &Caller, verb: Verb, owner: Owner) -> AppError {
    let p = &caller.principal;
    let whose = match (verb.action(), owner) {
        (Action::Cancel | Action::Steer, Owner::Other) if p.role == super::access::Role::Submitter => {
            " (a submitter acts on its own jobs only)"
        }
        _ => "",
    };
    AppError::new(ErrorKind::PermissionDenied, format!("role `{}` may not {} here{whose}", p.role, verb.as_str()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_fields_are_cut_on_a_character_boundary() {
        assert_eq!(super::cut("abc", 256), "abc");
        assert_eq!(super::cut(&"x".repeat(1000), 256).len(), 256);
        assert_eq!(super::cut("ééé", 3), "é");
        assert_eq!(super::cut("", 3), "");
    }
}
