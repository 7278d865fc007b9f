//! Namespaces, roles, API keys and the audit log, as records (docs/design.md,
//! section 17). Who may do what is decided by the application layer; the
//! store keeps these rows; this module only names them and checks their
//! shapes.

use serde::{Deserialize, Serialize};

/// The namespace of everything written before namespaces existed, and of an
/// open deployment's callers.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name.
pub const MAX_NAMESPACE: usize = 63;

/// Whether `name` is a namespace name: 1–63 lowercase letters, digits and
/// `-`, starting with a letter (a DNS label, so it is also a valid metric
/// label value and path segment).
pub fn check_namespace(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAMESPACE
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a namespace name: 1 to {MAX_NAMESPACE} lowercase letters, digits and `-`, starting with a letter"
        ))
    }
}

/// What a caller may do, each role including the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads: jobs, events, transcripts, artifacts.
    Viewer,
    /// Submits jobs, and interrupts, answers and continues its own.
    Submitter,
    /// Cancels any job of its namespace, reads its audit log and manages its keys.
    Operator,
    /// Namespaces and global settings; every namespace.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Submitter => "submitter",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "submitter" => Ok(Role::Submitter),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!("`{other}` is not a role (viewer, submitter, operator, admin)")),
        }
    }
}

/// A namespace as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    pub created_at: i64,
}

/// An API key as stored: never the key itself, only its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// The key's public id (in the key itself: `flk_<id>_<secret>`).
    pub id: String,
    pub namespace: String,
    pub role: Role,
    /// What the key is for (free text given at creation).
    pub name: String,
    /// SHA-256 of the whole key, hex.
    #[serde(skip_serializing)]
    pub digest: String,
    pub created_at: i64,
    /// Who made it (a subject).
    pub created_by: String,
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl ApiKey {
    /// Whether the key may be used at `now_ms`.
    pub fn live(&self, now_ms: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now_ms < at)
    }
}

/// How a call ended, as the audit log records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    /// No credential, or not a valid one.
    Unauthenticated,
    /// A credential whose role (or namespace) does not allow the call.
    Denied,
    /// Allowed, and failed (bad input, a job already ended, an outage).
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Denied => "denied",
            Outcome::Failed => "failed",
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ok" => Ok(Outcome::Ok),
            "unauthenticated" => Ok(Outcome::Unauthenticated),
            "denied" => Ok(Outcome::Denied),
            "failed" => Ok(Outcome::Failed),
            other => Err(format!("`{other}` is not an outcome")),
        }
    }
}

/// One mutating call, as the audit log keeps it: append-only, never edited
/// through any API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its place in the log (assigned by the store; 0 before).
    pub seq: i64,
    pub at: i64,
    /// Who: a key's id, a token's subject, `token` (the operator's token),
    /// `local` (an open deployment), or `anonymous`.
    pub subject: String,
    /// The namespace acted in (the caller's when the target is unknown).
    pub namespace: String,
    /// What: `submit`, `cancel`, `interrupt`, `answer`, `continue`, `aside`,
    /// `key.create`, `key.revoke`, `namespace.create`, …
    pub action: String,
    /// On what: a job id, a key id, a namespace (or empty).
    pub target: String,
    /// From where: the front-end and the peer (`grpc 127.0.0.1:53122`).
    pub origin: String,
    pub outcome: Outcome,
    /// Why it was refused or failed; empty when it went through.
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        for ok in ["default", "team-a", "a", "t0"] {
            assert!(check_namespace(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Team", "-a", "a-", "0a", "a/b", "a b", &"a".repeat(64)] {
            assert!(check_namespace(bad).unwrap_err().contains("not a namespace name"), "{bad:?}");
        }
    }

    #[test]
    fn a_key_is_live_until_revoked_or_expired() {
        let mut k = ApiKey {
            id: "0123456789abcdef".into(),
            namespace: "a".into(),
            role: Role::Viewer,
            name: String::new(),
            digest: String::new(),
            created_at: 0,
            created_by: "token".into(),
            expires_at: Some(100),
            last_used_at: None,
            revoked_at: None,
        };
        assert!(k.live(99) && !k.live(100));
        k.expires_at = None;
        assert!(k.live(i64::MAX));
        k.revoked_at = Some(5);
        assert!(!k.live(0));
        assert_eq!("operator".parse::<Role>(), Ok(Role::Operator));
        assert!("root".parse::<Role>().unwrap_err().contains("not a role"));
    }
}
