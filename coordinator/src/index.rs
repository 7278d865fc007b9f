//! Layer 2 for the coordinator: the workbench index reaches the main thread
//! as notices — the whole index at session start, then only a diff when it
//! changed — appended, never rewriting what was already sent (the system
//! prompt stays byte-identical, so the cached prefix holds).

use async_trait::async_trait;
use flower_agent::hooks::TurnHook;
use flower_store::Workbench;
use flower_store::workbench::{DescriptionCache, index_diff};
use tokio::sync::Mutex;

pub struct IndexNotices {
    workbench: Workbench,
    /// The index as last sent to the model.
    sent: Mutex<Option<String>>,
    /// Descriptions of unchanged files are not read again every turn.
    descriptions: Mutex<DescriptionCache>,
}

impl IndexNotices {
    pub fn new(workbench: Workbench) -> Self {
        Self { workbench, sent: Mutex::new(None), descriptions: Mutex::new(DescriptionCache::new()) }
    }
}

#[async_trait]
impl TurnHook for IndexNotices {
    async fn before_turn(&self) -> Option<String> {
        let mut descriptions = self.descriptions.lock().await;
        let mut sent = self.sent.lock().await;
        // What was sent is what INDEX.md held then (read or written here).
        let index = match self.workbench.refresh_index_after(&mut descriptions, sent.as_deref()).await {
            Ok((index, _)) => index,
            Err(e) => {
                tracing::warn!(error = %e, "workbench index not refreshed");
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
}
