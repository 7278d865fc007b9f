//! Namespaces, API keys and the audit log on SQLite (docs/design.md, section
//! 17); provider routes' rate limits (section 15).

use flower_model::access::{ApiKey, AuditRecord, Limits, Namespace};
use flower_model::quota;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{exec, json, parse, parse_id, row};
use crate::{Result, Spend, StoreError};

const KEY_COLS: &str =
    "id, namespace, role, name, digest, created_at, created_by, expires_at, last_used_at, revoked_at";

const AUDIT_COLS: &str = "seq, at, subject, namespace, action, target, origin, outcome, detail";

fn decode_key(r: &Row<'_>) -> rusqlite::Result<(ApiKey, String)> {
    let role: String = r.get(2)?;
    Ok((
        ApiKey {
            id: r.get(0)?,
            namespace: r.get(1)?,
            role: flower_model::access::Role::Viewer,
            name: r.get(3)?,
            digest: r.get(4)?,
            created_at: r.get(5)?,
            created_by: r.get(6)?,
            expires_at: r.get(7)?,
            last_used_at: r.get(8)?,
            revoked_at: r.get(9)?,
        },
        role,
    ))
}

fn with_role((mut key, role): (ApiKey, String)) -> Result<ApiKey> {
    key.role = parse_id(&role)?;
    Ok(key)
}

fn decode_audit(r: &Row<'_>) -> rusqlite::Result<(AuditRecord, String)> {
    Ok((
        AuditRecord {
            seq: r.get(0)?,
            at: r.get(1)?,
            subject: r.get(2)?,
            namespace: r.get(3)?,
            action: r.get(4)?,
            target: r.get(5)?,
            origin: r.get(6)?,
            outcome: flower_model::access::Outcome::Ok,
            detail: r.get(8)?,
        },
        r.get(7)?,
    ))
}

pub(super) fn create_namespace(c: &Connection, name: &str) -> Result<bool> {
    Ok(exec(
        c,
        "INSERT INTO namespaces (name, created_at) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
        params![name, flower_model::now_ms()],
    )? == 1)
}

fn decode_namespace(r: &Row<'_>) -> rusqlite::Result<(Namespace, String)> {
    Ok((Namespace { name: r.get(0)?, created_at: r.get(1)?, limits: Limits::default() }, r.get(2)?))
}

fn with_limits((mut n, limits): (Namespace, String)) -> Result<Namespace> {
    n.limits = parse(&limits)?;
    Ok(n)
}

pub(super) fn namespaces(c: &Connection) -> Result<Vec<Namespace>> {
    let mut stmt = c.prepare_cached("SELECT name, created_at, limits FROM namespaces ORDER BY name")?;
    let rows = stmt.query_map([], decode_namespace)?;
    rows.map(|r| with_limits(r?)).collect()
}

pub(super) fn namespace(c: &Connection, name: &str) -> Result<Namespace> {
    let found =
        row(c, "SELECT name, created_at, limits FROM namespaces WHERE name = ?1", params![name], decode_namespace)
            .optional()?;
    with_limits(found.ok_or_else(|| StoreError::NotFound(format!("namespace {name}")))?)
}

pub(super) fn set_limits(c: &Connection, name: &str, limits: &Limits) -> Result<Namespace> {
    if exec(c, "UPDATE namespaces SET limits = ?2 WHERE name = ?1", params![name, json(limits)?])? == 0 {
        return Err(StoreError::NotFound(format!("namespace {name}")));
    }
    namespace(c, name)
}

pub(super) fn spend(c: &Connection, namespace: &str, since_day: i64) -> Result<Vec<Spend>> {
    let mut stmt = c.prepare_cached(
        "SELECT day, job_id, input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
                ephemeral_1h_input_tokens
         FROM spend WHERE namespace = ?1 AND day >= ?2 ORDER BY day, job_id",
    )?;
    let rows = stmt.query_map(params![namespace, since_day], |r| {
        let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, [n(2)?, n(3)?, n(4)?, n(5)?, n(6)?]))
    })?;
    rows.map(|r| {
        let (day, job, tokens) = r?;
        Ok(Spend { day, job: parse_id(&job)?, usage: crate::spent_usage(tokens) })
    })
    .collect()
}

fn namespace_exists(c: &Connection, name: &str) -> Result<bool> {
    Ok(row(c, "SELECT 1 FROM namespaces WHERE name = ?1", params![name], |_| Ok(())).optional()?.is_some())
}

pub(super) fn create_key(c: &Connection, key: &ApiKey, replaces: Option<&str>) -> Result<()> {
    if !namespace_exists(c, &key.namespace)? {
        return Err(StoreError::NotFound(format!("namespace `{}`", key.namespace)));
    }
    exec(
        c,
        &format!("INSERT INTO api_keys ({KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, NULL)"),
        params![
            key.id,
            key.namespace,
            key.role.as_str(),
            key.name,
            key.digest,
            key.created_at,
            key.created_by,
            key.expires_at
        ],
    )?;
    if let Some(old) = replaces {
        let revoked = exec(
            c,
            "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
            params![old, key.created_at],
        )?;
        if revoked != 1 {
            return Err(StoreError::KeyRevoked(old.to_string()));
        }
    }
    Ok(())
}

pub(super) fn get_key(c: &Connection, id: &str) -> Result<ApiKey> {
    let found = row(c, &format!("SELECT {KEY_COLS} FROM api_keys WHERE id = ?1"), params![id], decode_key)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("key `{id}`")))?;
    with_role(found)
}

pub(super) fn keys(c: &Connection, namespace: Option<&str>) -> Result<Vec<ApiKey>> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {KEY_COLS} FROM api_keys WHERE ?1 IS NULL OR namespace = ?1 ORDER BY created_at, id"
    ))?;
    let rows: Vec<_> = stmt.query_map(params![namespace], decode_key)?.collect::<rusqlite::Result<_>>()?;
    rows.into_iter().map(with_role).collect()
}

pub(super) fn revoke_key(c: &Connection, id: &str, at: i64) -> Result<ApiKey> {
    exec(c, "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?2) WHERE id = ?1", params![id, at])?;
    get_key(c, id)
}

pub(super) fn touch_keys(c: &Connection, ids: &[String], at: i64) -> Result<()> {
    for id in ids {
        exec(
            c,
            "UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
            params![id, at],
        )?;
    }
    Ok(())
}

pub(super) fn append_audit(c: &Connection, records: &[AuditRecord]) -> Result<()> {
    for a in records {
        exec(
            c,
            "INSERT INTO audit_log (at, subject, namespace, action, target, origin, outcome, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![a.at, a.subject, a.namespace, a.action, a.target, a.origin, a.outcome.as_str(), a.detail],
        )?;
    }
    Ok(())
}

pub(super) fn audit_log(c: &Connection, namespace: Option<&str>, after: i64, limit: u32) -> Result<Vec<AuditRecord>> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {AUDIT_COLS} FROM audit_log WHERE seq > ?1 AND (?2 IS NULL OR namespace = ?2) ORDER BY seq LIMIT ?3"
    ))?;
    let rows: Vec<_> =
        stmt.query_map(params![after, namespace, limit], decode_audit)?.collect::<rusqlite::Result<_>>()?;
    rows.into_iter()
        .map(|(mut a, outcome)| {
            a.outcome = outcome.parse().map_err(StoreError::Corrupt)?;
            Ok(a)
        })
        .collect()
}

fn buckets(c: &Connection, route: &str) -> Result<Option<quota::Route>> {
    let text: Option<String> = c
        .prepare_cached("SELECT buckets FROM route_quotas WHERE route = ?1")?
        .query_row(params![route], |r| r.get(0))
        .optional()?;
    text.map(|t| parse(&t)).transpose()
}

fn write_buckets(c: &Connection, route: &str, b: &quota::Route, now: i64) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO route_quotas (route, buckets, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (route) DO UPDATE SET buckets = excluded.buckets, updated_at = excluded.updated_at",
    )?
    .execute(params![route, json(b)?, now])?;
    Ok(())
}

/// [`crate::Store::change_quota`] in a transaction (one writer at a time).
pub(super) fn change_quota(
    c: &Connection,
    route: &str,
    change: crate::rules::QuotaChange,
    now: i64,
) -> Result<Option<quota::Wait>> {
    let (write, wait) = crate::rules::quota_change(buckets(c, route)?, change, now);
    if let Some(b) = write {
        write_buckets(c, route, &b, now)?;
    }
    Ok(wait)
}

pub(super) fn route_quotas(c: &Connection) -> Result<Vec<(String, quota::Route)>> {
    let mut stmt = c.prepare_cached("SELECT route, buckets FROM route_quotas ORDER BY route")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    rows.map(|r| {
        let (route, text) = r?;
        Ok((route, parse(&text)?))
    })
    .collect()
}
