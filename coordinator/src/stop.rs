//! Why a run stops. One cancellation token used to mean three things — a
//! user's cancel, a lost lease, this replica shutting down — and only the
//! first may end the job and cancel its tasks; the other two hand the job
//! over to another owner, which resumes it (docs/design.md, section 4).

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// The user cancelled the job: it ends `cancelled`, its tasks with it.
    User,
    /// Another owner holds the job's lease now: write nothing more.
    LeaseLost,
    /// This replica is shutting down: leave the job as it stands for the next owner.
    Shutdown,
}

/// A run's stop signal with its cause (the first cause given wins).
#[derive(Clone, Debug, Default)]
pub struct Stop {
    token: CancellationToken,
    cause: Arc<OnceLock<StopCause>>,
}

impl Stop {
    /// A stop signal driven by `token` alone: a cancel through it is a user's.
    pub fn from_token(token: CancellationToken) -> Self {
        Self { token, cause: Default::default() }
    }

    pub fn stop(&self, cause: StopCause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }

    /// What the agent loop and the waits select on.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The cause, once stopped (a bare token cancel counts as the user's).
    pub fn cause(&self) -> Option<StopCause> {
        self.is_stopped().then(|| self.cause.get().copied().unwrap_or(StopCause::User))
    }

    /// Stopped to hand the job over (lease lost, shutdown): the job must not end.
    pub fn handing_over(&self) -> bool {
        matches!(self.cause(), Some(StopCause::LeaseLost | StopCause::Shutdown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cause_wins_and_a_bare_cancel_is_the_users() {
        let s = Stop::default();
        assert_eq!(s.cause(), None);
        s.stop(StopCause::Shutdown);
        s.stop(StopCause::User);
        assert_eq!(s.cause(), Some(StopCause::Shutdown));
        assert!(s.handing_over());
        let t = CancellationToken::new();
        let s = Stop::from_token(t.clone());
        t.cancel();
        assert_eq!(s.cause(), Some(StopCause::User));
        assert!(!s.handing_over());
    }
}
