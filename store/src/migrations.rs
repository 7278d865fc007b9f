//! Each backend's schema as numbered migrations, embedded in the binary and
//! applied in order at start, in one transaction, recorded in a
//! `flower_migrations (version, applied_at)` table. A migration that has
//! shipped is never edited: a change is a new, higher version, so a database
//! written by any earlier release moves forward with its rows.

use crate::{Result, StoreError};

/// One schema step: its version and its SQL.
pub type Migration = (i32, &'static str);

/// The Postgres schema, in order.
pub const POSTGRES: &[Migration] = &[
    (1, include_str!("../migrations/postgres/0001_initial.sql")),
    (2, include_str!("../migrations/postgres/0002_waiting_for_user.sql")),
    (3, include_str!("../migrations/postgres/0003_continuations.sql")),
    (4, include_str!("../migrations/postgres/0004_entry_chunks.sql")),
    (5, include_str!("../migrations/postgres/0005_counted_parents.sql")),
    (6, include_str!("../migrations/postgres/0006_unflushed_events.sql")),
    (7, include_str!("../migrations/postgres/0007_namespaces.sql")),
    (8, include_str!("../migrations/postgres/0008_namespace_limits.sql")),
    (9, include_str!("../migrations/postgres/0009_route_quotas.sql")),
];

/// The SQLite schema, in order. Version 1 is the schema shipped before
/// versions were recorded, written so that it applies as a no-op to a
/// database that release created.
pub const SQLITE: &[Migration] = &[
    (1, include_str!("../migrations/sqlite/0001_initial.sql")),
    (2, include_str!("../migrations/sqlite/0002_job_indexes.sql")),
    (3, include_str!("../migrations/sqlite/0003_waiting_for_user.sql")),
    (4, include_str!("../migrations/sqlite/0004_continuations.sql")),
    (5, include_str!("../migrations/sqlite/0005_namespaces.sql")),
    (6, include_str!("../migrations/sqlite/0006_namespace_limits.sql")),
    (7, include_str!("../migrations/sqlite/0007_route_quotas.sql")),
];

/// Creates the version table where it is missing (same SQL on both backends).
pub const VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS flower_migrations (version integer PRIMARY KEY, applied_at bigint NOT NULL)";

/// The migrations of `all` not yet in `applied`, in order. A database that
/// records a version this build does not know was written by a newer
/// release: refused rather than written with an older idea of its schema.
pub fn pending(all: &'static [Migration], applied: &[i32]) -> Result<Vec<Migration>> {
    let latest = all.iter().map(|(v, _)| *v).max().unwrap_or(0);
    if let Some(newer) = applied.iter().copied().filter(|v| *v > latest).max() {
        return Err(StoreError::Corrupt(format!(
            "the database is at schema version {newer}, newer than this build knows ({latest}); upgrade flower"
        )));
    }
    Ok(all.iter().copied().filter(|(v, _)| !applied.contains(v)).collect())
}

/// The latest version of `all`.
pub fn latest(all: &[Migration]) -> i32 {
    all.iter().map(|(v, _)| *v).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn versions_are_increasing_from_one() {
        for all in [POSTGRES, SQLITE] {
            let versions: Vec<i32> = all.iter().map(|(v, _)| *v).collect();
            assert_eq!(versions, (1..=versions.len() as i32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn only_missing_versions_are_pending_and_newer_databases_are_refused() {
        assert_eq!(pending(SQLITE, &[]).unwrap().len(), SQLITE.len());
        assert_eq!(pending(SQLITE, &[1]).unwrap().iter().map(|(v, _)| *v).collect::<Vec<_>>(), vec![2, 3, 4, 5, 6, 7]);
        assert!(pending(SQLITE, &[1, 2, 3, 4, 5, 6, 7]).unwrap().is_empty());
        assert!(matches!(pending(POSTGRES, &[1, 99]), Err(StoreError::Corrupt(_))));
        assert_eq!(latest(SQLITE), 7);
    }
}
