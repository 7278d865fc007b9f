//! Scenario files: what the simulator plays.
//!
//! ```yaml
//! model: claude-sonnet-4-5          # optional: the model name reported back
//! latency: {ttft_ms: 200, tokens_per_sec: 80}   # optional, default instant
//! roles:                            # tried in order; the first match plays
//!   - name: coordinator
//!     match:
//!       system: "flower coordinator"  # substring of the system prompt
//!       first_user: "data/"           # optional: substring of the first user message
//!     steps:
//!       - id: survey                  # [A-Za-z0-9-], unique in the role
//!         text: "Splitting the survey."
//!         tool_calls:
//!           - name: Agent
//!             input: {subagent_type: counter, description: count, prompt: "..."}
//!       - id: answer
//!         text: "Done: {{result:survey}}"   # templating, see below
//! ```
//!
//! **Stateless step choice.** Every `tool_use` id the simulator writes carries
//! the index of the step that wrote it (`toolu_s003_1_…`). The next step is
//! the one after the highest index the request's assistant messages show — not
//! a turn count, so pruning, resume and handoff do not make it replay. A step
//! with no tool calls ends the conversation (`end_turn`); after the last step
//! the simulator answers `(scenario complete)`.
//!
//! **Branches.** A step may hold `branches`, each with a `when` tested against
//! the last tool result of the request: `{error: true}` (an error result),
//! `{denied: true}` (an error result whose text contains `Denied by`), or
//! `{contains: "text"}`; or, with `{user: "text"}`, against the request's
//! last message when it is the user's own text (an instruction given after
//! a final answer: the step that answered plays again, so a branch on it takes
//! the conversation on). The first branch that matches replaces the step's
//! `text`/`tool_calls`; none matching plays the step itself.
//!
//! **Templating** in texts and string inputs: `{{last_result}}` is the text of
//! the last tool result; `{{result:ID}}` the results of step `ID`'s calls
//! (joined by blank lines). Each is cut to 4000 characters.
//!
//! **Faults.** `fail: {status: 529, type: overloaded_error, message: Overloaded, times: 2}`
//! answers the step's first `times` identical requests with that error (counted
//! per request fingerprint, so a retry eventually succeeds); `drop_stream: {times: 1}`
//! starts streaming and cuts the connection before `message_stop`. Top-level
//! `faults: {overloaded: 0.1, dropped: 0.1}` hits that share of *all* requests
//! (chosen by request fingerprint, each at most once).
//!
//! **Rate limits.** `quota: {requests_per_minute: 50, input_tokens_per_minute:
//! 40000, output_tokens_per_minute: 8000}` enforces each provider's limits per
//! API key, with its 429s and headers (`crate::quota`; `flower sim --quota-*`
//! overrides).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub latency: Latency,
    #[serde(default)]
    pub roles: Vec<RoleScript>,
    /// Faults on a share of all requests (each request fails at most once, so retries succeed).
    #[serde(default)]
    pub faults: Faults,
    /// Requests larger than this many (estimated) input tokens get each API's
    /// overflow error ("prompt is too long: N tokens > W maximum";
    /// `context_length_exceeded`, "This model's maximum context length is W tokens…").
    #[serde(default)]
    pub window_tokens: Option<u64>,
    /// How a handoff request (`<flower-handoff>`) is answered.
    #[serde(default)]
    pub handoff: HandoffReply,
    /// Rate limits per API key ([`crate::quota`]).
    #[serde(default, skip_serializing_if = "crate::quota::Quota::is_unset")]
    pub quota: crate::quota::Quota,
}

/// The simulator's answer to a handoff request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffReply {
    /// A document with every section, naming the last calls (so steps continue).
    #[default]
    Full,
    /// A document missing sections (the harness must degrade).
    Incomplete,
    /// An API error (the harness must degrade).
    Error,
}

/// Shares of requests (0.0–1.0) answered with a fault the first time they are seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// 529 `overloaded_error`.
    #[serde(default)]
    pub overloaded: f64,
    /// A stream cut before `message_stop`.
    #[serde(default)]
    pub dropped: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Delay before the first byte of a response.
    #[serde(default)]
    pub ttft_ms: u64,
    /// Output pacing; 0 means instant.
    #[serde(default)]
    pub tokens_per_sec: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleScript {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: Matcher,
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matcher {
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub first_user: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub id: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub branches: Vec<Branch>,
    #[serde(default)]
    pub fail: Option<Fault>,
    #[serde(default)]
    pub drop_stream: Option<Drop>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub input: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    pub when: When,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    #[serde(default)]
    pub error: Option<bool>,
    #[serde(default)]
    pub denied: Option<bool>,
    #[serde(default)]
    pub contains: Option<String>,
    /// Matches when the request ends with a user's own message (no tool
    /// result) containing this: an instruction after a final answer (a
    /// judge's verdict, an interrupt) takes the conversation on.
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    #[serde(default = "overloaded_status")]
    pub status: u16,
    #[serde(rename = "type", default = "overloaded_type")]
    pub kind: String,
    #[serde(default = "overloaded_message")]
    pub message: String,
    #[serde(default = "one")]
    pub times: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drop {
    #[serde(default = "one")]
    pub times: u32,
}

fn overloaded_status() -> u16 {
    529
}
fn overloaded_type() -> String {
    "overloaded_error".into()
}
fn overloaded_message() -> String {
    "Overloaded".into()
}
fn one() -> u32 {
    1
}

/// A scenario file that cannot be played, with the field at fault.
#[derive(Debug, thiserror::Error)]
#[error("invalid scenario: {field}: {message}")]
pub struct ScenarioError {
    pub field: String,
    pub message: String,
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let value: serde_json::Value = serde_yaml_ng::from_str(text)
            .map_err(|e| ScenarioError { field: "(document)".into(), message: e.to_string() })?;
        let s: Scenario = serde_path_to_error::deserialize(value)
            .map_err(|e| ScenarioError { field: e.path().to_string(), message: e.into_inner().to_string() })?;
        s.validate()?;
        Ok(s)
    }

    pub fn load(path: &std::path::Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            field: "(document)".into(),
            message: format!("cannot read {}: {e}", path.display()),
        })?;
        Self::parse(&text)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        if let Err(field) = self.quota.check() {
            return Err(ScenarioError {
                field: field.into(),
                message: "must be at least 1 (leave it out for no limit)".into(),
            });
        }
        for (r, role) in self.roles.iter().enumerate() {
            let mut seen = std::collections::HashSet::new();
            for (s, step) in role.steps.iter().enumerate() {
                let field = format!("roles[{r}].steps[{s}].id");
                if step.id.is_empty() || !step.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                    return Err(ScenarioError {
                        field,
                        message: format!("`{}`: use letters, digits and `-`", step.id),
                    });
                }
                if !seen.insert(step.id.as_str()) {
                    return Err(ScenarioError {
                        field,
                        message: format!("`{}` is used twice in role `{}`", step.id, role.name),
                    });
                }
                for (b, br) in step.branches.iter().enumerate() {
                    if br.when == When::default() {
                        return Err(ScenarioError {
                            field: format!("roles[{r}].steps[{s}].branches[{b}].when"),
                            message: "give `error`, `denied` or `contains`".into(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The index of the first role whose matcher accepts this request.
    pub fn role_for(&self, system: &str, first_user: &str) -> Option<usize> {
        self.roles.iter().position(|r| {
            r.matcher.system.as_deref().is_none_or(|s| system.contains(s))
                && r.matcher.first_user.as_deref().is_none_or(|s| first_user.contains(s))
        })
    }
}

impl When {
    /// Does the last tool result (`text`, `is_error`) satisfy every condition given?
    pub fn matches(&self, text: &str, is_error: bool) -> bool {
        self.error.is_none_or(|e| e == is_error)
            && self.denied.is_none_or(|d| d == (is_error && text.contains("Denied by")))
            && self.contains.as_deref().is_none_or(|c| text.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let s = Scenario::parse(
            "roles:\n  - name: c\n    match: {system: coord}\n    steps:\n      - id: a\n        text: hi\n      - id: b\n        tool_calls: [{name: Read, input: {file_path: x}}]\n",
        )
        .unwrap();
        assert_eq!(s.roles[0].steps.len(), 2);
        assert_eq!(s.role_for("the coord prompt", ""), Some(0));
        assert_eq!(s.role_for("other", ""), None);

        let dup = Scenario::parse("roles:\n  - name: c\n    steps: [{id: a}, {id: a}]\n").unwrap_err();
        assert_eq!(dup.field, "roles[0].steps[1].id");
        let bad = Scenario::parse("roles:\n  - name: c\n    steps: [{id: a, txt: x}]\n").unwrap_err();
        assert_eq!(bad.field, "roles[0].steps[0].txt");
    }

    #[test]
    fn conditions_combine() {
        let w = When { error: Some(true), contains: Some("boom".into()), ..Default::default() };
        assert!(w.matches("boom!", true));
        assert!(!w.matches("boom!", false));
        assert!(!w.matches("fine", true));
        let d = When { denied: Some(true), ..Default::default() };
        assert!(d.matches("Denied by delegate_guard: delegate", true));
        assert!(!d.matches("Denied by x", false));
    }
}
