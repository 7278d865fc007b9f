//! Layer 2 for the coordinator: the workbench index reaches the main thread
//! as notices — the whole index at session start, then only a diff when it
//! changed — appended, never rewriting what was already sent (the system
//! prompt stays byte-identical, so the cached prefix holds).
//!
//! The workbench is listed again before a turn unless everything that
//! arrived since the last listing is known to have left it as it was (the
//! reports of workers that ran no tool) and that listing is recent: a job
//! delegating many small tasks does not list its object storage once per
//! turn, and what changes it otherwise (a worker mid-task, a user) shows
//! within [`UNTOUCHED_FRESH`] of turns.

use async_trait::async_trait;
use flower_agent::hooks::TurnHook;
use flower_store::Workbench;
use flower_store::workbench::{DescriptionCache, index_diff};
use tokio::sync::Mutex;

/// How long a listing stands for turns whose results left the workbench as
/// it was.
pub const UNTOUCHED_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

pub struct IndexNotices {
    workbench: Workbench,
    /// When the index was last listed, if nothing since may have changed
    /// the workbench.
    untouched_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// The index as last sent to the model.
    sent: Mutex<Option<String>>,
    /// Descriptions of unchanged files are not read again every turn.
    descriptions: Mutex<DescriptionCache>,
}

impl IndexNotices {
    pub fn new(workbench: Workbench) -> Self {
        Self {
            workbench,
            untouched_since: std::sync::Mutex::new(None),
            sent: Mutex::new(None),
            descriptions: Mutex::new(DescriptionCache::new()),
        }
    }
}

#[async_trait]
impl TurnHook for IndexNotices {
    async fn before_turn(&self) -> Option<String> {
        let mut descriptions = self.descriptions.lock().await;
        let mut sent = self.sent.lock().await;
        {
            let mut since = self.untouched_since.lock().unwrap_or_else(|p| p.into_inner());
            if sent.is_some() && since.is_some_and(|at| at.elapsed() < UNTOUCHED_FRESH) {
                return None;
            }
            // Set before listing: what arrives from now on is seen by the next turn.
            *since = Some(std::time::Instant::now());
        }
        // What was sent is what INDEX.md held then (read or written here).
        let index = match self.workbench.refresh_index_after(&mut descriptions, sent.as_deref()).await {
            Ok((index, _)) => index,
            Err(e) => {
                tracing::warn!(error = %e, "workbench index not refreshed");
                *self.untouched_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                return None;
            }
        };
        let notice = match sent.as_deref() {
            None => Some(format!(
                "The job's workbench (.flower/) — read files with Read; workers see it as .flower/ in their directory.\n{index}"
            )),
            Some(previous) if previous != index => {
                Some(format!("The workbench index changed (+ added, - removed):\n{}", index_diff(previous, &index)))
            }
            Some(_) => None,
        };
        *sent = Some(index);
        notice
    }

    fn arrived(&self, workbench_untouched: bool) {
        if !workbench_untouched {
            *self.untouched_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flower_model::JobId;

    use super::*;

    #[tokio::test]
    async fn the_workbench_is_listed_again_unless_what_arrived_left_it_alone() {
        let wb = Workbench::new(Arc::new(object_store::memory::InMemory::new()), JobId::random());
        let hook = IndexNotices::new(wb.clone());
        let first = hook.before_turn().await.expect("the whole index at the first turn");
        assert!(first.contains("(empty)"), "{first}");
        // A worker that ran a tool wrote a file: listed again, the diff sent.
        wb.put("notes/a.md", "a").await.unwrap();
        hook.arrived(false);
        let diff = hook.before_turn().await.expect("a changed index");
        assert!(diff.contains("+ ") && diff.contains("notes/a.md"), "{diff}");
        // Reports of workers that ran no tool: the last listing stands.
        wb.put("notes/b.md", "b").await.unwrap();
        hook.arrived(true);
        assert_eq!(hook.before_turn().await, None, "not listed for untouched results");
        // Whatever else arrives (a user's message) lists it again.
        hook.arrived(false);
        let diff = hook.before_turn().await.expect("b shows once listed");
        assert!(diff.contains("notes/b.md"), "{diff}");
        // A listing older than UNTOUCHED_FRESH is not trusted.
        wb.put("notes/c.md", "c").await.unwrap();
        *hook.untouched_since.lock().unwrap() = Some(std::time::Instant::now() - UNTOUCHED_FRESH);
        hook.arrived(true);
        let diff = hook.before_turn().await.expect("c shows after the listing went stale");
        assert!(diff.contains("notes/c.md"), "{diff}");
    }
}
