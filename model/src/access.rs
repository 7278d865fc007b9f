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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    pub created_at: i64,
    #[serde(default)]
    pub limits: Limits,
}

/// A namespace's limits (all off by default): how many of its jobs and
/// tasks run at once, and what its jobs may spend per UTC day and month,
/// priced as a job's own budget is (its spec's prices, else the built-in
/// table). A job that would spend past them waits in `waiting_for_budget`
/// and asks for a raise, for `wait` (docs/design.md, section 17).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Jobs of the namespace started and not ended (queued ones wait).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
    /// Tasks of the namespace's jobs queued for a worker or running; more
    /// are `held`, holding no worker slot, until one ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_day_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_month_usd: Option<f64>,
    /// Input + cache reads + cache writes + output, as a job's `max_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// How long a job waits for a raise of the namespace's budget before it
    /// ends `failed` (default 15 minutes; `0s`: it ends at once).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde::option")]
    pub wait: Option<std::time::Duration>,
}

/// How long a job waits for a raise of its namespace's budget, by default.
pub const DEFAULT_NAMESPACE_WAIT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

impl Limits {
    /// Whether any spending limit is set.
    pub fn limits_spend(&self) -> bool {
        self.cost_per_day_usd.is_some() || self.cost_per_month_usd.is_some() || self.tokens_per_day.is_some()
    }

    pub fn raise_wait(&self) -> std::time::Duration {
        self.wait.unwrap_or(DEFAULT_NAMESPACE_WAIT)
    }

    /// Refuses a limit no job could live with: a zero count, a negative or
    /// non-finite amount. Names the field.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.max_jobs == Some(0) {
            return Err(("max_jobs", "must be at least 1 (leave it unset for no limit)".into()));
        }
        if self.max_tasks == Some(0) {
            return Err(("max_tasks", "must be at least 1 (leave it unset for no limit)".into()));
        }
        for (field, c) in [("cost_per_day_usd", self.cost_per_day_usd), ("cost_per_month_usd", self.cost_per_month_usd)]
        {
            if c.is_some_and(|c| !c.is_finite() || c <= 0.0) {
                return Err((field, "must be a positive amount of US dollars".into()));
            }
        }
        if self.tokens_per_day == Some(0) {
            return Err(("tokens_per_day", "must be at least 1 (leave it unset for no limit)".into()));
        }
        Ok(())
    }
}

/// Which of a namespace's spending limits ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendLimit {
    CostPerDay,
    CostPerMonth,
    TokensPerDay,
}

impl SpendLimit {
    pub const ALL: [SpendLimit; 3] = [SpendLimit::CostPerDay, SpendLimit::CostPerMonth, SpendLimit::TokensPerDay];

    /// In a question's id: `cost-day`, `cost-month`, `tokens-day`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpendLimit::CostPerDay => "cost-day",
            SpendLimit::CostPerMonth => "cost-month",
            SpendLimit::TokensPerDay => "tokens-day",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// In words: `daily cost budget`, …
    pub fn words(self) -> &'static str {
        match self {
            SpendLimit::CostPerDay => "daily cost budget",
            SpendLimit::CostPerMonth => "monthly cost budget",
            SpendLimit::TokensPerDay => "daily token budget",
        }
    }

    /// The limit's value in `limits` (tokens as a number).
    pub fn get(self, limits: &Limits) -> Option<f64> {
        match self {
            SpendLimit::CostPerDay => limits.cost_per_day_usd,
            SpendLimit::CostPerMonth => limits.cost_per_month_usd,
            SpendLimit::TokensPerDay => limits.tokens_per_day.map(|t| t as f64),
        }
    }

    /// `limits` with this limit at `value`.
    pub fn set(self, limits: &Limits, value: f64) -> Limits {
        let mut l = limits.clone();
        match self {
            SpendLimit::CostPerDay => l.cost_per_day_usd = Some(value),
            SpendLimit::CostPerMonth => l.cost_per_month_usd = Some(value),
            SpendLimit::TokensPerDay => l.tokens_per_day = Some(value.round() as u64),
        }
        l
    }

    /// An amount of what this limit counts, for people: `$1.2345`, `1200 tokens`.
    pub fn amount(self, value: f64) -> String {
        match self {
            SpendLimit::TokensPerDay => format!("{} tokens", value.round() as u64),
            _ => format!("${value:.4}"),
        }
    }
}

/// The UTC day of a time in ms (days since 1970-01-01): what spending is
/// counted by.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(86_400_000)
}

/// The first day of the UTC month of `day`.
pub fn month_start(day: i64) -> i64 {
    // Days to a civil date (Howard Hinnant's algorithm), then back from the 1st.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    day - (d - 1)
}

#[cfg(test)]
mod day_tests {
    use super::*;

    #[test]
    fn days_and_months_are_utc() {
        assert_eq!(day_of(0), 0);
        assert_eq!(day_of(-1), -1);
        assert_eq!(month_start(0), 0, "1970-01-01");
        assert_eq!(month_start(31), 31, "1970-02-01");
        assert_eq!(month_start(58), 31, "1970-02-28");
        assert_eq!(month_start(59), 59, "1970-03-01");
        // 2024-02-29 is day 19782; its month began on day 19754.
        assert_eq!(month_start(19_782), 19_754);
        assert_eq!(month_start(19_783), 19_783, "2024-03-01");
        // 2026-12-07 (day 20794) is in the month from 2026-12-01 (day 20788).
        assert_eq!(month_start(20_794), 20_788);
    }

    #[test]
    fn limits_name_the_bad_field() {
        assert!(Limits::default().check().is_ok());
        let bad = Limits { max_jobs: Some(0), ..Default::default() };
        assert_eq!(bad.check().unwrap_err().0, "max_jobs");
        let bad = Limits { max_tasks: Some(0), ..Default::default() };
        assert_eq!(bad.check().unwrap_err().0, "max_tasks");
        let bad = Limits { cost_per_month_usd: Some(f64::NAN), ..Default::default() };
        assert_eq!(bad.check().unwrap_err().0, "cost_per_month_usd");
        let raised = SpendLimit::CostPerDay.set(&Limits::default(), 2.0);
        assert_eq!(SpendLimit::CostPerDay.get(&raised), Some(2.0));
        assert_eq!(SpendLimit::parse("tokens-day"), Some(SpendLimit::TokensPerDay));
    }
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
