//! `runtime.handoff`: when the coordinator's main thread hands off to a new
//! session, from the model's context window (docs/design.md section 6).

use serde::{Deserialize, Serialize};

use crate::windows::Windows;

/// Handoff of the coordinator's main thread (flower's formula).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffOptions {
    pub enabled: bool,
    /// The model's context window in tokens (default: from the model name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Room kept free; 0 means max(50,000, 25 % of the window).
    pub headroom: u64,
    /// Sessions a job may use before it fails (default 8).
    pub max_generations: u32,
}

impl Default for HandoffOptions {
    fn default() -> Self {
        Self { enabled: true, window: None, headroom: 0, max_generations: 8 }
    }
}

impl HandoffOptions {
    /// The window: configured, else learnt from a provider's overflow
    /// error (`learnt`, this process's table: see [`crate::windows`]), else
    /// known from the model name (200K for Claude models).
    pub fn window_for(&self, model: &str, learnt: &Windows) -> u64 {
        self.window.or_else(|| learnt.learnt(model)).unwrap_or(if model.contains("[1m]") { 1_000_000 } else { 200_000 })
    }

    /// (warn at, hand off at): `at = max(10_000, window − room)`, the warning
    /// at `max(1_000, at − 20_000)`, the window as [`Self::window_for`] finds it.
    pub fn thresholds(&self, model: &str, learnt: &Windows) -> (u64, u64) {
        let window = self.window_for(model, learnt);
        let room = if self.headroom > 0 { self.headroom } else { 50_000u64.max(window / 4) };
        let at = 10_000u64.max(window.saturating_sub(room));
        (1_000u64.max(at.saturating_sub(20_000)), at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learnt_window_counts_unless_one_is_configured() {
        let learnt = Windows::default();
        let h = HandoffOptions::default();
        assert_eq!(h.window_for("claude-sonnet-4-5", &learnt), 200_000);
        assert_eq!(h.window_for("claude-sonnet-4-5[1m]", &learnt), 1_000_000);
        learnt.learn("claude-sonnet-4-5", 100_000);
        assert_eq!(h.window_for("claude-sonnet-4-5", &learnt), 100_000);
        assert_eq!(h.thresholds("claude-sonnet-4-5", &learnt), (30_000, 50_000));
        assert_eq!(h.window_for("claude-sonnet-4-5", &Windows::default()), 200_000, "another process's table");
        let configured = HandoffOptions { window: Some(150_000), ..h };
        assert_eq!(configured.window_for("claude-sonnet-4-5", &learnt), 150_000);
    }
}
