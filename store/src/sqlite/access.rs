//! Namespaces, API keys and the audit log on SQLite (docs/design.md, section 17).

use flower_model::access::{ApiKey, AuditRecord, Namespace};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{exec, parse_id, row};
use crate::{Result, StoreError};

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

pub(super) fn namespaces(c: &Connection) -> Result<Vec<Namespace>> {
    let mut stmt = c.prepare_cached("SELECT name, created_at FROM namespaces ORDER BY name")?;
    let rows = stmt.query_map([], |r| Ok(Namespace { name: r.get(0)?, created_at: r.get(1)? }))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
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
