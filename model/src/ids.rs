//! Ids. Jobs and sessions get random ids; a task's id is *derived* from the
//! delegation that created it (job, coordinator session, `tool_use` id) so a
//! coordinator that retries or resumes a turn finds the same task again instead
//! of creating a second one. Each delivery of a task is a numbered attempt.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! id_type {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub fn random() -> Self {
                Self(Uuid::new_v4())
            }
            /// The first 8 hex digits: enough for humans, never for lookups.
            pub fn short(&self) -> String {
                self.0.simple().to_string()[..8].to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

id_type!(JobId, "A job: one goal given to a coordinator.");
id_type!(SessionId, "One agent conversation: the coordinator's main thread or one subagent.");
id_type!(TaskId, "One delegation (an `Agent` call), stable across its attempts.");

/// Namespace for derived task ids (a fixed random UUID).
const TASK_NAMESPACE: Uuid = Uuid::from_u128(0x6a1f_3c52_9b0e_4d7a_8f21_5e6c_0b9d_4a13);

impl TaskId {
    /// The id of the task created by `tool_use_id` in `session` of `job`.
    pub fn derive(job: JobId, session: SessionId, tool_use_id: &str) -> Self {
        let mut name = Vec::with_capacity(32 + 32 + tool_use_id.len());
        name.extend_from_slice(job.0.as_bytes());
        name.extend_from_slice(session.0.as_bytes());
        name.extend_from_slice(tool_use_id.as_bytes());
        Self(Uuid::new_v5(&TASK_NAMESPACE, &name))
    }

    /// The session a worker runs for this task: derived too, so a redelivered
    /// task finds the subagent transcript of its earlier attempts.
    pub fn session(&self) -> SessionId {
        SessionId(Uuid::new_v5(&TASK_NAMESPACE, self.0.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_derived_from_the_delegation() {
        let job = JobId::random();
        let session = SessionId::random();
        let a = TaskId::derive(job, session, "toolu_1");
        assert_eq!(a, TaskId::derive(job, session, "toolu_1"));
        assert_ne!(a, TaskId::derive(job, session, "toolu_2"));
        assert_ne!(a, TaskId::derive(job, SessionId::random(), "toolu_1"));
        assert_ne!(a, TaskId::derive(JobId::random(), session, "toolu_1"));
        assert_eq!(a.session(), a.session());
        assert_ne!(a.session().0, a.0);
    }

    #[test]
    fn ids_round_trip_through_text() {
        let id = JobId::random();
        let parsed: JobId = id.to_string().parse().unwrap();
        assert_eq!(id, parsed);
        assert_eq!(id.short().len(), 8);
    }
}
