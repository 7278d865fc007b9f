//! Namespaces, API keys and the audit log on Postgres (docs/design.md,
//! section 17); provider routes' rate limits (section 15).

use flower_model::JobId;
use flower_model::access::{ApiKey, AuditRecord, Limits, Namespace};
use flower_model::quota;
use tokio_postgres::Row;

use super::transaction::{Tx, db_execute, db_query, db_query_opt};
use super::{PostgresStore, corrupt, from_json, json, parse};
use crate::{Result, Spend, StoreError};

const KEY_COLS: &str =
    "id, namespace, role, name, digest, created_at, created_by, expires_at, last_used_at, revoked_at";

const AUDIT_COLS: &str = "seq, at, subject, namespace, action, target, origin, outcome, detail";

fn decode_key(r: &Row) -> Result<ApiKey> {
    Ok(ApiKey {
        id: r.get(0),
        namespace: r.get(1),
        role: parse(r.get::<_, &str>(2))?,
        name: r.get(3),
        digest: r.get(4),
        created_at: r.get(5),
        created_by: r.get(6),
        expires_at: r.get(7),
        last_used_at: r.get(8),
        revoked_at: r.get(9),
    })
}

fn decode_audit(r: &Row) -> Result<AuditRecord> {
    Ok(AuditRecord {
        seq: r.get(0),
        at: r.get(1),
        subject: r.get(2),
        namespace: r.get(3),
        action: r.get(4),
        target: r.get(5),
        origin: r.get(6),
        outcome: r.get::<_, &str>(7).parse().map_err(corrupt)?,
        detail: r.get(8),
    })
}

pub(super) async fn create_namespace(store: &PostgresStore, name: &str) -> Result<bool> {
    let c = store.pool.get().await?;
    let n = db_execute(
        &c,
        "INSERT INTO namespaces (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[&name, &flower_model::now_ms()],
    )
    .await?;
    Ok(n == 1)
}

fn decode_namespace(r: &Row) -> Result<Namespace> {
    Ok(Namespace { name: r.get(0), created_at: r.get(1), limits: from_json(r.get(2))? })
}

pub(super) async fn namespaces(store: &PostgresStore) -> Result<Vec<Namespace>> {
    let c = store.pool.get().await?;
    let rows = db_query(&c, "SELECT name, created_at, limits FROM namespaces ORDER BY name", &[]).await?;
    rows.iter().map(decode_namespace).collect()
}

pub(super) async fn namespace(store: &PostgresStore, name: &str) -> Result<Namespace> {
    let c = store.pool.get().await?;
    let row = db_query_opt(&c, "SELECT name, created_at, limits FROM namespaces WHERE name = $1", &[&name]).await?;
    decode_namespace(&row.ok_or_else(|| StoreError::NotFound(format!("namespace {name}")))?)
}

pub(super) async fn set_limits(store: &PostgresStore, name: &str, limits: &Limits) -> Result<Namespace> {
    let c = store.pool.get().await?;
    let row = db_query_opt(
        &c,
        "UPDATE namespaces SET limits = $2 WHERE name = $1 RETURNING name, created_at, limits",
        &[&name, &json(limits)?],
    )
    .await?;
    decode_namespace(&row.ok_or_else(|| StoreError::NotFound(format!("namespace {name}")))?)
}

pub(super) async fn spend(store: &PostgresStore, namespace: &str, since_day: i64) -> Result<Vec<Spend>> {
    let c = store.pool.get().await?;
    let rows = db_query(
        &c,
        "SELECT day, job_id, input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
                ephemeral_1h_input_tokens
         FROM spend WHERE namespace = $1 AND day >= $2 ORDER BY day, job_id",
        &[&namespace, &since_day],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
            Spend { day: r.get(0), job: JobId(r.get(1)), usage: crate::spent_usage([n(2), n(3), n(4), n(5), n(6)]) }
        })
        .collect())
}

pub(super) async fn create_key(store: &PostgresStore, key: ApiKey, replaces: Option<String>) -> Result<()> {
    store
        .tx(move |tx| {
            Box::pin(async move {
                let exists = db_query_opt(tx, "SELECT 1 FROM namespaces WHERE name = $1", &[&key.namespace]).await?;
                if exists.is_none() {
                    return Err(StoreError::NotFound(format!("namespace `{}`", key.namespace)));
                }
                db_execute(
                    tx,
                    &format!("INSERT INTO api_keys ({KEY_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, NULL)"),
                    &[
                        &key.id,
                        &key.namespace,
                        &key.role.as_str(),
                        &key.name,
                        &key.digest,
                        &key.created_at,
                        &key.created_by,
                        &key.expires_at,
                    ],
                )
                .await?;
                if let Some(old) = replaces {
                    let revoked = db_execute(
                        tx,
                        "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
                        &[&old, &key.created_at],
                    )
                    .await?;
                    if revoked != 1 {
                        return Err(StoreError::KeyRevoked(old));
                    }
                }
                Ok(())
            })
        })
        .await
}

pub(super) async fn get_key(store: &PostgresStore, id: &str) -> Result<ApiKey> {
    let c = store.pool.get().await?;
    let row = db_query_opt(&c, &format!("SELECT {KEY_COLS} FROM api_keys WHERE id = $1"), &[&id])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("key `{id}`")))?;
    decode_key(&row)
}

pub(super) async fn keys(store: &PostgresStore, namespace: Option<&str>) -> Result<Vec<ApiKey>> {
    let c = store.pool.get().await?;
    let rows = db_query(
        &c,
        &format!("SELECT {KEY_COLS} FROM api_keys WHERE $1::text IS NULL OR namespace = $1 ORDER BY created_at, id"),
        &[&namespace],
    )
    .await?;
    rows.iter().map(decode_key).collect()
}

pub(super) async fn revoke_key(store: &PostgresStore, id: &str, at: i64) -> Result<ApiKey> {
    let c = store.pool.get().await?;
    let row = db_query_opt(
        &c,
        &format!("UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1 RETURNING {KEY_COLS}"),
        &[&id, &at],
    )
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("key `{id}`")))?;
    decode_key(&row)
}

pub(super) async fn touch_keys(store: &PostgresStore, ids: Vec<String>, at: i64) -> Result<()> {
    let c = store.pool.get().await?;
    db_execute(
        &c,
        "UPDATE api_keys SET last_used_at = $2 WHERE id = ANY($1) AND (last_used_at IS NULL OR last_used_at < $2)",
        &[&ids, &at],
    )
    .await?;
    Ok(())
}

pub(super) async fn append_audit(store: &PostgresStore, records: Vec<AuditRecord>) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let mut cols: [Vec<String>; 7] = Default::default();
    let mut at = Vec::with_capacity(records.len());
    for r in records {
        at.push(r.at);
        let [subject, namespace, action, target, origin, outcome, detail] = &mut cols;
        subject.push(r.subject);
        namespace.push(r.namespace);
        action.push(r.action);
        target.push(r.target);
        origin.push(r.origin);
        outcome.push(r.outcome.as_str().to_string());
        detail.push(r.detail);
    }
    let c = store.pool.get().await?;
    let [subject, namespace, action, target, origin, outcome, detail] = &cols;
    db_execute(
        &c,
        "INSERT INTO audit_log (at, subject, namespace, action, target, origin, outcome, detail)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])",
        &[&at, subject, namespace, action, target, origin, outcome, detail],
    )
    .await?;
    Ok(())
}

pub(super) async fn audit_log(
    store: &PostgresStore,
    namespace: Option<&str>,
    after: i64,
    limit: u32,
) -> Result<Vec<AuditRecord>> {
    let c = store.pool.get().await?;
    let rows = db_query(
        &c,
        &format!(
            "SELECT {AUDIT_COLS} FROM audit_log WHERE seq > $1 AND ($2::text IS NULL OR namespace = $2) ORDER BY seq LIMIT $3"
        ),
        &[&after, &namespace, &(limit as i64)],
    )
    .await?;
    rows.iter().map(decode_audit).collect()
}

/// A route's buckets, read and locked for the transaction.
async fn locked_buckets(tx: &Tx<'_>, route: &str) -> Result<Option<quota::Route>> {
    let row = db_query_opt(tx, "SELECT buckets FROM route_quotas WHERE route = $1 FOR UPDATE", &[&route]).await?;
    row.map(|r| from_json(r.get(0))).transpose()
}

async fn write_buckets(tx: &Tx<'_>, route: &str, b: &quota::Route, now: i64) -> Result<()> {
    db_execute(
        tx,
        "INSERT INTO route_quotas (route, buckets, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (route) DO UPDATE SET buckets = excluded.buckets, updated_at = excluded.updated_at",
        &[&route, &json(b)?, &now],
    )
    .await?;
    Ok(())
}

pub(super) async fn change_quota(
    store: &PostgresStore,
    route: &str,
    change: crate::rules::QuotaChange,
    now: i64,
) -> Result<Option<quota::Wait>> {
    let route = route.to_string();
    store
        .tx(move |tx| {
            Box::pin(async move {
                // Two processes learning a new route at once: the second
                // insert waits for the first, then updates its row.
                let current = locked_buckets(tx, &route).await?;
                let (write, wait) = crate::rules::quota_change(current, change, now);
                if let Some(b) = write {
                    write_buckets(tx, &route, &b, now).await?;
                }
                Ok(wait)
            })
        })
        .await
}

pub(super) async fn route_quotas(store: &PostgresStore) -> Result<Vec<(String, quota::Route)>> {
    let c = store.pool.get().await?;
    let rows = db_query(&c, "SELECT route, buckets FROM route_quotas ORDER BY route", &[]).await?;
    rows.iter().map(|r| Ok((r.get(0), from_json(r.get(1))?))).collect()
}
