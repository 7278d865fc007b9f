//! The creation locks of task rows: a transaction creating tasks holds an
//! advisory lock per row (two-key space, keyed by the task id) from its
//! first statement, so a claim of one of them, which takes the same lock
//! shared, waits for its commit — and the task's message may go out before
//! it (docs/design.md section 3, "Staged writes"). Taken with the fence
//! check in one statement when both apply.

use flower_model::{Task, TaskId};

use super::leases::{FENCE, check_fence};
use super::transaction::{Tx, db_execute, db_query_one};
use crate::rules;
use crate::{Fence, Result};

/// The advisory-lock space of task rows being created (the two-key form,
/// which does not overlap the one-key space of [`super::MIGRATION_LOCK`]).
pub(super) const TASK_LOCK_CLASS: i32 = 0x666c_7774;

/// A task id's advisory-lock key (a collision only makes a claim wait for
/// another task's creator).
pub(super) fn task_lock_key(id: TaskId) -> i32 {
    let b = id.0.as_bytes();
    i32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ i32::from_le_bytes([b[12], b[13], b[14], b[15]])
}

/// Take the creation locks of `tasks` (exclusive, to the transaction's
/// end): a claim of one of them waits for this transaction (see
/// `claim_locked` in [`super::claims`]), so its message may be published
/// before the commit.
async fn lock_new_tasks(tx: &Tx<'_>, tasks: &[Task]) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    db_execute(tx, LOCK_NEW_TASKS, &[&TASK_LOCK_CLASS, &lock_keys(tasks)]).await?;
    Ok(())
}

/// The creation-lock keys of `tasks`, in the one order every transaction
/// takes them in: two creators never wait on each other in a cycle.
fn lock_keys(tasks: &[Task]) -> Vec<i32> {
    let mut keys: Vec<i32> = tasks.iter().map(|t| task_lock_key(t.id)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// [`lock_new_tasks`]'s statement.
const LOCK_NEW_TASKS: &str = "SELECT pg_advisory_xact_lock($1, k) FROM UNNEST($2::int4[]) AS k";

/// [`check_fence`] and [`lock_new_tasks`] in one statement (one statement's
/// work less for the server, on the path to a new task's message). Both
/// parts are evaluated whatever the other finds (each CTE is materialised:
/// one locks a row, the other calls a volatile function).
const FENCE_AND_LOCK: &str = "WITH fence AS (SELECT epoch FROM leases WHERE job_id = $1 FOR SHARE),
     locks AS (SELECT pg_advisory_xact_lock($2, k) FROM UNNEST($3::int4[]) AS k)
     SELECT (SELECT epoch FROM fence), (SELECT count(*) FROM locks)";

/// The statements [`fence_and_lock`] sends.
pub(super) fn fence_and_lock_statements(fence: Option<Fence>, tasks: &[Task]) -> &'static [&'static str] {
    match (fence.is_some(), tasks.is_empty()) {
        (true, false) => &[FENCE_AND_LOCK],
        (true, true) => &[FENCE],
        (false, false) => &[LOCK_NEW_TASKS],
        (false, true) => &[],
    }
}

/// [`check_fence`] and [`lock_new_tasks`], in one statement when both apply.
pub(super) async fn fence_and_lock(tx: &Tx<'_>, fence: Option<Fence>, tasks: &[Task]) -> Result<()> {
    match fence {
        Some(f) if !tasks.is_empty() => {
            let row = db_query_one(tx, FENCE_AND_LOCK, &[&f.job.0, &TASK_LOCK_CLASS, &lock_keys(tasks)]).await?;
            rules::check_fence(f, row.get::<_, Option<i64>>(0).unwrap_or(0))
        }
        _ => {
            futures::try_join!(check_fence(tx, fence), lock_new_tasks(tx, tasks))?;
            Ok(())
        }
    }
}
