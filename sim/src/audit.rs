//! The cache audit joined with what a job recorded: the simulator knows, per
//! session, which requests missed the cache the previous one left; the job
//! knows which of its requests were deliberate rewrites (a deferred tool
//! loaded, uneventful output pruned). A miss that no rewrite explains is a
//! broken append-only discipline (see docs/design.md, section 6).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::engine::AuditRecord;

pub use flower_model::audit::CacheAudit;

/// Join the simulator's per-session audit (`records`, by session id) with the
/// rewrites a job recorded, as (session id, turn) pairs.
pub fn join(records: &HashMap<String, Vec<AuditRecord>>, rewrites: &[(String, u32)]) -> CacheAudit {
    let mut a = CacheAudit::default();
    let mut sessions: Vec<_> = records.iter().collect();
    sessions.sort_by(|x, y| x.0.cmp(y.0));
    for (session, list) in sessions {
        for rec in list {
            a.requests += 1;
            a.append_only += usize::from(rec.append_only);
            if !rec.miss {
                continue;
            }
            a.misses += 1;
            if rewrites.iter().any(|(s, turn)| s == session && *turn == rec.turn) {
                a.explained += 1;
            } else {
                a.unexplained.push(format!(
                    "session {session} turn {}: {}read {} of the {} blocks the previous request left cached",
                    rec.turn,
                    if rec.append_only { "" } else { "not append-only; " },
                    rec.read_blocks,
                    rec.previous_cached_blocks
                ));
            }
        }
    }
    a
}

/// The body of the simulator's `GET /v1/flower/audit`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditReply {
    pub sessions: HashMap<String, Vec<AuditRecord>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(turn: u32, miss: bool) -> AuditRecord {
        AuditRecord {
            turn,
            append_only: !miss,
            miss,
            read_blocks: 1,
            previous_cached_blocks: 3,
            cache_read: 0,
            cache_write: 0,
        }
    }

    #[test]
    fn a_miss_at_a_recorded_rewrite_is_explained_and_others_are_named() {
        let records = HashMap::from([("s1".to_string(), vec![rec(1, false), rec(2, true), rec(3, true)])]);
        let a = join(&records, &[("s1".into(), 2)]);
        assert_eq!((a.requests, a.append_only, a.misses, a.explained), (3, 1, 2, 1));
        assert_eq!(
            a.unexplained,
            vec!["session s1 turn 3: not append-only; read 1 of the 3 blocks the previous request left cached"]
        );
    }
}
