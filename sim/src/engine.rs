//! Deciding a reply: validate the request as the API would, pick the role and
//! the step from what the request shows, render the step. Pure apart from the
//! fault counters, so the server stays a thin shell around it.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::scenario::{Scenario, Step, ToolCall};

/// What to answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Message(Planned),
    /// An API error: HTTP status, error type, message.
    Error {
        status: u16,
        kind: String,
        message: String,
    },
}

/// A planned assistant message.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub id: String,
    pub model: String,
    /// Content blocks in the Messages API shape.
    pub content: Vec<Value>,
    pub stop_reason: &'static str,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cut the stream before `message_stop`.
    pub drop_stream: bool,
    /// Prompt-cache figures (`input_tokens` above is what was read uncached).
    pub cache: crate::cache::CacheUsage,
}

/// The text answered to a request no scripted role matches.
pub const DEFAULT_TEXT: &str =
    "Hello from flower sim. No scripted role matched this request, so this is the default reply.";
const TEMPLATE_CAP: usize = 4000;

pub struct Engine {
    scenario: Scenario,
    /// Faults already served, per (request fingerprint, kind).
    served: Mutex<HashMap<(String, &'static str), u32>>,
    cache: crate::cache::PromptCache,
    /// Chat Completions' automatic prefix cache (its own: two providers share nothing).
    automatic: crate::cache::AutomaticCache,
    /// Per session (the `x-flower-session` header): what each request read
    /// versus what the one before it left in the cache.
    audit: Mutex<HashMap<String, SessionAudit>>,
    /// Where answered requests are logged with their instants, when asked (`--timeline`).
    timeline: Option<crate::timeline::Timeline>,
    /// Rate limits per API key (the scenario's `quota`, or `--quota-*`).
    quotas: crate::quota::Quotas,
}

/// One audited request of a session.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditRecord {
    /// The session's request number, from 1 (a resend of the same body is not counted again).
    pub turn: u32,
    /// It begins with the previous request's blocks (`cache_control` stripped).
    pub append_only: bool,
    pub read_blocks: usize,
    /// Blocks the previous request left cached.
    pub previous_cached_blocks: usize,
    /// Not append-only, or read less than the previous request left: a
    /// rewrite the client must have recorded, else an unexplained miss.
    pub miss: bool,
    pub cache_read: u64,
    pub cache_write: u64,
}

#[derive(Default)]
struct SessionAudit {
    last: Option<crate::cache::Shape>,
    records: Vec<AuditRecord>,
}

fn invalid(message: impl Into<String>) -> String {
    message.into()
}

/// A request's input tokens, estimated from its system, messages and tools.
pub fn request_tokens(body: &Value) -> u64 {
    estimate_tokens(json_len(&body["system"]) + json_len(&body["messages"]) + json_len(&body["tools"]))
}

/// The length of `v` as JSON, counted as it is written (not kept).
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Into a counter, of a JSON value: nothing to fail.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

/// Rough token count: the simulator has no tokenizer; 4 characters a token.
pub fn estimate_tokens(chars: usize) -> u64 {
    flower_model::usage::estimate_tokens(chars)
}

fn nonce() -> String {
    let n: u64 = rand::random();
    format!("{n:016x}")
}

impl Engine {
    pub fn new(scenario: Scenario) -> Self {
        Self {
            served: Mutex::new(HashMap::new()),
            cache: Default::default(),
            automatic: Default::default(),
            audit: Default::default(),
            timeline: None,
            quotas: crate::quota::Quotas::new(scenario.quota),
            scenario,
        }
    }

    /// Enforce `quota` instead of the scenario's.
    pub fn with_quota(mut self, quota: crate::quota::Quota) -> Self {
        self.scenario.quota = quota;
        self.quotas = crate::quota::Quotas::new(quota);
        self
    }

    pub fn quotas(&self) -> &crate::quota::Quotas {
        &self.quotas
    }

    /// Log every answered Messages request to `timeline`.
    pub fn with_timeline(mut self, timeline: crate::timeline::Timeline) -> Self {
        self.timeline = Some(timeline);
        self
    }

    pub fn timeline(&self) -> Option<&crate::timeline::Timeline> {
        self.timeline.as_ref()
    }

    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    pub fn reply(&self, body: &Value) -> Reply {
        self.reply_for(body, None)
    }

    /// Every session's audit so far, by session id.
    pub fn audit(&self) -> HashMap<String, Vec<AuditRecord>> {
        let audit = self.audit.lock().unwrap_or_else(|p| p.into_inner());
        audit.iter().map(|(k, v)| (k.clone(), v.records.clone())).collect()
    }

    fn record(&self, session: &str, usage: &crate::cache::CacheUsage, shape: crate::cache::Shape) {
        let mut audit = self.audit.lock().unwrap_or_else(|p| p.into_inner());
        let a = audit.entry(session.to_string()).or_default();
        if a.last.as_ref().is_some_and(|l| l.chain == shape.chain) {
            return;
        }
        let (append_only, previous_cached_blocks) = match &a.last {
            Some(l) => (shape.chain.starts_with(&l.chain), l.cached_blocks),
            None => (true, 0),
        };
        a.records.push(AuditRecord {
            turn: a.records.len() as u32 + 1,
            append_only,
            read_blocks: shape.read_blocks,
            previous_cached_blocks,
            miss: !append_only || shape.read_blocks < previous_cached_blocks,
            cache_read: usage.cache_read,
            cache_write: usage.cache_write_5m + usage.cache_write_1h,
        });
        a.last = Some(shape);
    }

    /// [`Engine::reply`] for a request of `session` (audited).
    pub fn reply_for(&self, body: &Value, session: Option<&str>) -> Reply {
        if let Err(message) = validate(body) {
            return Reply::Error { status: 400, kind: "invalid_request_error".into(), message };
        }
        let total = request_tokens(body);
        let model = body["model"].as_str().unwrap_or_default();
        let now = std::time::Instant::now();
        let begins = now + std::time::Duration::from_millis(self.scenario.latency.ttft_ms);
        let cache = match self.cache.account(body, model, total, now, begins) {
            Ok((c, shape)) => {
                if let Some(session) = session {
                    self.record(session, &c, shape);
                }
                c
            }
            Err(message) => return Reply::Error { status: 400, kind: "invalid_request_error".into(), message },
        };
        match self.reply_uncached(body, total) {
            Reply::Message(mut p) => {
                p.input_tokens = cache.input_tokens;
                p.cache = cache;
                Reply::Message(p)
            }
            error => error,
        }
    }

    /// A Chat Completions request of `session` (audited): translated to the
    /// Messages shape and played the same way, with the automatic prefix
    /// cache's figures and OpenAI's overflow error.
    pub fn reply_chat(&self, chat: &Value, session: Option<&str>) -> Reply {
        let invalid = |message: String| Reply::Error { status: 400, kind: "invalid_request_error".into(), message };
        let body = match crate::chat::to_messages_body(chat) {
            Ok(b) => b,
            Err(m) => return invalid(m),
        };
        if let Err(message) = validate(&body) {
            return invalid(message);
        }
        let total = request_tokens(&body);
        if let Some(window) = self.scenario.window_tokens
            && total > window
        {
            return Reply::Error {
                status: 400,
                kind: "context_length_exceeded".into(),
                message: crate::chat::too_long(window, total),
            };
        }
        let now = std::time::Instant::now();
        let begins = now + std::time::Duration::from_millis(self.scenario.latency.ttft_ms);
        let (cache, shape) = self.automatic.account(&body, total, now, begins);
        if let Some(session) = session {
            self.record(session, &cache, shape);
        }
        match self.reply_uncached(&body, total) {
            Reply::Message(mut p) => {
                p.input_tokens = cache.input_tokens;
                p.cache = cache;
                Reply::Message(p)
            }
            error => error,
        }
    }

    /// The reply to a request of `input_tokens` (estimated once by the caller).
    fn reply_uncached(&self, body: &Value, input_tokens: u64) -> Reply {
        // Faults on a share of all requests, chosen by fingerprint, each served once.
        let fingerprint = Fingerprint::of(body);
        let faults = self.scenario.faults;
        if faults.overloaded > 0.0
            && share(fingerprint.get(), "overloaded") < faults.overloaded
            && self.take_fault(fingerprint.get(), "rate-overloaded", 1)
        {
            return Reply::Error { status: 529, kind: "overloaded_error".into(), message: "Overloaded".into() };
        }
        let rate_drop = faults.dropped > 0.0
            && share(fingerprint.get(), "dropped") < faults.dropped
            && self.take_fault(fingerprint.get(), "rate-dropped", 1);
        let model = body["model"].as_str().unwrap_or_default().to_string();
        let model = self.scenario.model.clone().unwrap_or(model);
        let messages = body["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
        if let Some(window) = self.scenario.window_tokens
            && input_tokens > window
        {
            return Reply::Error {
                status: 400,
                kind: "invalid_request_error".into(),
                message: format!("prompt is too long: {input_tokens} tokens > {window} maximum"),
            };
        }
        let last_user = messages.last().map(|m| content_text(&m["content"])).unwrap_or_default();
        if last_user.contains("<flower-handoff>") {
            return self.handoff_reply(model, messages, input_tokens);
        }
        let request = Incoming { system: system_text(&body["system"]), messages, input_tokens, rate_drop };
        self.scripted_reply(model, &request, &fingerprint)
    }

    /// The reply to a handoff request: the document the scenario's handoff
    /// setting calls for, or its error.
    fn handoff_reply(&self, model: String, messages: &[Value], input_tokens: u64) -> Reply {
        let seen = highest_step(messages).unwrap_or(0);
        let doc = match self.scenario.handoff {
            crate::scenario::HandoffReply::Error => {
                return Reply::Error { status: 500, kind: "api_error".into(), message: "Internal server error".into() };
            }
            crate::scenario::HandoffReply::Incomplete => {
                format!("## Doing now\nworking (last calls: toolu_s{seen:03}_0_handoff)\n")
            }
            crate::scenario::HandoffReply::Full => format!(
                "## Doing now\nThe scripted plan, at step {seen}.\n## Decided\n- keep going (the plan holds)\n## Dead ends\n- none\n## Next\n- the next step\n## Where things are\n- last calls: toolu_s{seen:03}_0_handoff\n- .flower/ for tables\n"
            ),
        };
        Reply::Message(planned(model, vec![json!({"type": "text", "text": doc})], input_tokens, false))
    }

    /// The next scripted step of the role the request shows (the default
    /// text when none matches, a marker once the role's steps are done), with
    /// the step's own faults.
    fn scripted_reply(&self, model: String, request: &Incoming<'_>, fingerprint: &Fingerprint<'_>) -> Reply {
        let (messages, input_tokens, rate_drop) = (request.messages, request.input_tokens, request.rate_drop);
        let first_user = messages.first().map(|m| content_text(&m["content"])).unwrap_or_default();
        let Some(role_idx) = self.scenario.role_for(&request.system, &first_user) else {
            let content = vec![json!({"type": "text", "text": DEFAULT_TEXT})];
            return Reply::Message(planned(model, content, input_tokens, rate_drop));
        };
        let role = &self.scenario.roles[role_idx];
        let next = highest_step(messages).map_or(0, |s| s + 1);
        let Some(step) = role.steps.get(next) else {
            let content = vec![json!({"type": "text", "text": "(scenario complete)"})];
            return Reply::Message(planned(model, content, input_tokens, rate_drop));
        };
        if let Some(f) = &step.fail
            && self.take_fault(fingerprint.get(), "fail", f.times)
        {
            return Reply::Error { status: f.status, kind: f.kind.clone(), message: f.message.clone() };
        }
        let drop =
            rate_drop || step.drop_stream.as_ref().is_some_and(|d| self.take_fault(fingerprint.get(), "drop", d.times));
        let (text, calls) = choose(step, messages);
        let results = ResultIndex::new(messages);
        let mut content = Vec::new();
        if let Some(t) = text {
            content.push(json!({"type": "text", "text": results.render(t, &role.steps)}));
        }
        for (k, call) in calls.iter().enumerate() {
            content.push(json!({
                "type": "tool_use",
                "id": format!("toolu_s{next:03}_{k}_{}", nonce()),
                "name": call.name,
                "input": render_value(&call.input, &results, &role.steps),
            }));
        }
        if content.is_empty() {
            content.push(json!({"type": "text", "text": ""}));
        }
        Reply::Message(planned(model, content, input_tokens, drop))
    }

    /// Serve a fault if this fingerprint has had fewer than `times` of it.
    fn take_fault(&self, fingerprint: &str, kind: &'static str, times: u32) -> bool {
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        let n = served.entry((fingerprint.to_string(), kind)).or_insert(0);
        if *n < times {
            *n += 1;
            true
        } else {
            false
        }
    }
}

/// A request's fingerprint (the SHA-256 of its body as JSON), computed the
/// first time a fault asks for it: most requests meet no fault, and hashing
/// a long history costs more than answering it.
struct Fingerprint<'a> {
    body: &'a Value,
    hex: std::cell::OnceCell<String>,
}

impl<'a> Fingerprint<'a> {
    fn of(body: &'a Value) -> Self {
        Self { body, hex: std::cell::OnceCell::new() }
    }

    fn get(&self) -> &str {
        self.hex.get_or_init(|| hex::encode(Sha256::digest(self.body.to_string().as_bytes())))
    }
}

/// What a scripted reply is chosen from.
struct Incoming<'a> {
    system: String,
    messages: &'a [Value],
    input_tokens: u64,
    /// A rate fault already chose to drop this reply's stream.
    rate_drop: bool,
}

/// Where a request's fingerprint falls in [0, 1] for a fault kind (`salt`):
/// a fault rate of r hits the requests below r.
fn share(fingerprint: &str, salt: &str) -> f64 {
    let h = Sha256::digest(format!("{salt}{fingerprint}").as_bytes());
    u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]) as f64 / u64::MAX as f64
}

fn planned(model: String, content: Vec<Value>, input_tokens: u64, drop_stream: bool) -> Planned {
    let chars: usize = content.iter().map(|b| b.to_string().len()).sum();
    let has_tools = content.iter().any(|b| b["type"] == "tool_use");
    Planned {
        id: format!("msg_sim_{}", nonce()),
        model,
        content,
        stop_reason: if has_tools { "tool_use" } else { "end_turn" },
        input_tokens,
        output_tokens: estimate_tokens(chars).max(1),
        drop_stream,
        cache: Default::default(),
    }
}

/// The step chosen by its branches, given the last tool result.
fn choose<'a>(step: &'a Step, messages: &[Value]) -> (Option<&'a String>, &'a [ToolCall]) {
    let result = last_tool_result(messages);
    let said = last_user_text(messages);
    for b in &step.branches {
        let hit = match &b.when.user {
            Some(needle) => said.as_deref().is_some_and(|t| t.contains(needle.as_str())),
            None => result.as_ref().is_some_and(|(text, is_error)| b.when.matches(text, *is_error)),
        };
        if hit {
            return (b.text.as_ref(), &b.tool_calls);
        }
    }
    (step.text.as_ref(), &step.tool_calls)
}

/// The text of the request's last message when it is the user's own (text
/// blocks, no tool result).
fn last_user_text(messages: &[Value]) -> Option<String> {
    let last = messages.last().filter(|m| m["role"] == "user")?;
    match &last["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) if blocks.iter().all(|b| b["type"] == "text") => Some(content_text(&last["content"])),
        _ => None,
    }
}

/// The step index encoded in a tool_use id written by the simulator.
pub fn step_of(tool_use_id: &str) -> Option<usize> {
    let rest = tool_use_id.strip_prefix("toolu_s")?;
    rest.split('_').next()?.parse().ok()
}

fn highest_step(messages: &[Value]) -> Option<usize> {
    let in_calls = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_use")
        .filter_map(|b| b["id"].as_str().and_then(step_of))
        .max();
    // A handoff document names the last calls: a new session continues after them.
    let in_text = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| {
            let text = content_text(&m["content"]);
            text.match_indices("toolu_s").filter_map(|(i, _)| step_of(&text[i..])).collect::<Vec<_>>()
        })
        .max();
    in_calls.max(in_text)
}

fn system_text(system: &Value) -> String {
    match system {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

/// Text of a content value (string or blocks), tool results included.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b["type"].as_str() {
                Some("text") => b["text"].as_str().unwrap_or_default().to_string(),
                Some("tool_result") => content_text(&b["content"]),
                _ => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn last_tool_result(messages: &[Value]) -> Option<(String, bool)> {
    let last = messages.last()?;
    let blocks = last["content"].as_array()?;
    let r = blocks.iter().rev().find(|b| b["type"] == "tool_result")?;
    Some((content_text(&r["content"]), r["is_error"].as_bool().unwrap_or(false)))
}

/// Tool results of the request by the step that made the call: read from
/// the history the first time a template names one (most steps have no
/// template, and a long history has thousands of results).
struct ResultIndex<'a> {
    messages: &'a [Value],
    last: std::cell::OnceCell<String>,
    by_step: std::cell::OnceCell<HashMap<usize, Vec<String>>>,
}

impl<'a> ResultIndex<'a> {
    fn new(messages: &'a [Value]) -> Self {
        Self { messages, last: Default::default(), by_step: Default::default() }
    }

    fn by_step(&self) -> &HashMap<usize, Vec<String>> {
        self.by_step.get_or_init(|| {
            let mut by_step: HashMap<usize, Vec<String>> = HashMap::new();
            for m in self.messages.iter().filter(|m| m["role"] == "user") {
                for b in m["content"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    if b["type"] == "tool_result"
                        && let Some(step) = b["tool_use_id"].as_str().and_then(step_of)
                    {
                        by_step.entry(step).or_default().push(content_text(&b["content"]));
                    }
                }
            }
            by_step
        })
    }

    fn render(&self, template: &str, steps: &[Step]) -> String {
        if !template.contains("{{") {
            return template.to_string();
        }
        let mut out = if template.contains("{{last_result}}") {
            let last = self.last.get_or_init(|| last_tool_result(self.messages).map(|(t, _)| t).unwrap_or_default());
            template.replace("{{last_result}}", &cap(last))
        } else {
            template.to_string()
        };
        while let Some(start) = out.find("{{result:") {
            let Some(len) = out[start..].find("}}") else { break };
            let id = &out[start + 9..start + len];
            let text = steps
                .iter()
                .position(|s| s.id == id)
                .and_then(|i| self.by_step().get(&i))
                .map(|v| cap(&v.join("\n\n")))
                .unwrap_or_else(|| format!("(no result of step {id})"));
            out.replace_range(start..start + len + 2, &text);
        }
        out
    }
}

fn cap(s: &str) -> String {
    // Keep a leading indent (column output), drop surrounding blank lines.
    let s = s.trim_end().trim_start_matches(['\n', '\r']);
    if s.len() <= TEMPLATE_CAP {
        return s.to_string();
    }
    let mut end = TEMPLATE_CAP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn render_value(v: &Value, results: &ResultIndex<'_>, steps: &[Step]) -> Value {
    match v {
        Value::String(s) => Value::String(results.render(s, steps)),
        Value::Array(a) => Value::Array(a.iter().map(|x| render_value(x, results, steps)).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, x)| (k.clone(), render_value(x, results, steps))).collect())
        }
        other => other.clone(),
    }
}

/// The request checks the real API makes that a harness most easily gets wrong.
fn validate(body: &Value) -> Result<(), String> {
    if !body["model"].is_string() {
        return Err(invalid("model: Field required"));
    }
    if !body["max_tokens"].is_u64() {
        return Err(invalid("max_tokens: Field required"));
    }
    let Some(messages) = body["messages"].as_array() else { return Err(invalid("messages: Field required")) };
    if messages.is_empty() {
        return Err(invalid("messages: at least one message is required"));
    }
    if let Some(tools) = body["tools"].as_array() {
        for (i, t) in tools.iter().enumerate() {
            let name = t["name"].as_str().unwrap_or_default();
            let ok = !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(invalid(format!(
                    "tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                )));
            }
        }
    }
    // Breakpoints are blocks carrying the key (a tool may well have a
    // parameter named `cache_control`: that is not one).
    let cache_marks = crate::cache::blocks_of(body).filter(|b| b.cache_control().is_some()).count();
    if cache_marks > 4 {
        return Err(invalid(format!("A maximum of 4 blocks with cache_control may be provided. Found {cache_marks}.")));
    }
    let mut prev_role = "";
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(invalid(format!("messages.{i}.role: Input should be 'user' or 'assistant'")));
        }
        if i == 0 && role != "user" {
            return Err(invalid("messages.0.role: the first message must use the \"user\" role"));
        }
        if role == prev_role {
            return Err(invalid(format!("messages.{i}: roles must alternate between \"user\" and \"assistant\"")));
        }
        prev_role = role;
        if role != "assistant" {
            continue;
        }
        let ids: Vec<&str> = m["content"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str())
            .collect();
        if ids.is_empty() {
            continue;
        }
        let next = messages.get(i + 1).and_then(|n| n["content"].as_array()).map(Vec::as_slice).unwrap_or_default();
        let leading: Vec<&str> =
            next.iter().take_while(|b| b["type"] == "tool_result").filter_map(|b| b["tool_use_id"].as_str()).collect();
        let missing: Vec<&str> = ids.iter().copied().filter(|id| !leading.contains(id)).collect();
        if !missing.is_empty() && i + 1 < messages.len() {
            return Err(invalid(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                missing.join(", ")
            )));
        }
        if i + 1 == messages.len() {
            return Err(invalid(
                "the final message must be a user message; an assistant prefill cannot end in tool_use",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const SCRIPT: &str = r#"
roles:
  - name: lead
    match: {system: coordinator}
    steps:
      - id: look
        text: looking
        tool_calls:
          - {name: Read, input: {file_path: a.txt}}
          - {name: Read, input: {file_path: b.txt}}
      - id: react
        text: plain
        branches:
          - when: {error: true}
            text: "it failed: {{last_result}}"
      - id: last
        text: "a={{result:look}}"
"#;

    fn engine() -> Engine {
        Engine::new(Scenario::parse(SCRIPT).unwrap())
    }

    fn req(messages: Value) -> Value {
        json!({"model": "m", "max_tokens": 100, "system": "you are the coordinator", "messages": messages})
    }

    fn msg(r: Reply) -> Planned {
        match r {
            Reply::Message(p) => p,
            Reply::Error { message, .. } => panic!("error: {message}"),
        }
    }

    #[test]
    fn steps_follow_the_highest_step_id_the_request_shows() {
        let e = engine();
        let first = msg(e.reply(&req(json!([{"role": "user", "content": "go"}]))));
        assert_eq!(first.stop_reason, "tool_use");
        let ids: Vec<String> = first.content.iter().filter_map(|b| b["id"].as_str().map(str::to_string)).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.iter().all(|i| step_of(i) == Some(0)));

        let results = json!([
            {"type": "tool_result", "tool_use_id": ids[0], "content": "AAA"},
            {"type": "tool_result", "tool_use_id": ids[1], "content": [{"type": "text", "text": "BBB"}], "is_error": true},
        ]);
        let history = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": results},
        ]);
        let second = msg(e.reply(&req(history.clone())));
        assert_eq!(
            second.content,
            vec![json!({"type": "text", "text": "it failed: BBB"})],
            "branch on the last result"
        );
        assert_eq!(second.stop_reason, "end_turn");

        // The same request again gives the same step: choice is stateless.
        assert_eq!(msg(e.reply(&req(history))).content, second.content);
    }

    #[test]
    fn an_instruction_after_a_final_answer_takes_a_user_branch() {
        let e = Engine::new(
            Scenario::parse(
                "roles:\n  - name: c\n    match: {system: coordinator}\n    steps:\n      - id: answer\n        text: first\n        branches:\n          - when: {user: \"try again\"}\n            tool_calls: [{name: Read, input: {file_path: a}}]\n      - id: again\n        text: \"second: {{last_result}}\"\n",
            )
            .unwrap(),
        );
        let first = msg(e.reply(&req(json!([{"role": "user", "content": "go"}]))));
        assert_eq!(
            first.content,
            vec![json!({"type": "text", "text": "first"})],
            "no instruction yet: the step itself"
        );
        let told = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "text", "text": "[judge] try again"}]},
        ]);
        let retry = msg(e.reply(&req(told.clone())));
        assert_eq!(retry.stop_reason, "tool_use", "the branch's calls");
        let id = retry.content.iter().find_map(|b| b["id"].as_str()).unwrap().to_string();
        let mut after = told.as_array().unwrap().clone();
        after.push(json!({"role": "assistant", "content": retry.content}));
        after.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "A"}]}));
        assert_eq!(msg(e.reply(&req(json!(after)))).content, vec![json!({"type": "text", "text": "second: A"})]);
    }

    #[test]
    fn templates_see_results_of_a_named_step() {
        let e = engine();
        let tu = |id: &str| json!({"type": "tool_use", "id": id, "name": "Read", "input": {}});
        let history = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [tu("toolu_s000_0_x"), tu("toolu_s000_1_y")]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_s000_0_x", "content": "one"},
                {"type": "tool_result", "tool_use_id": "toolu_s000_1_y", "content": "two"}]},
            {"role": "assistant", "content": [tu("toolu_s001_0_z")]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s001_0_z", "content": "x"}]},
        ]);
        let p = msg(e.reply(&req(history)));
        assert_eq!(p.content, vec![json!({"type": "text", "text": "a=one\n\ntwo"})]);
    }

    #[test]
    fn unmatched_requests_get_the_default_reply() {
        let p =
            msg(engine()
                .reply(&json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})));
        assert_eq!(p.content, vec![json!({"type": "text", "text": DEFAULT_TEXT})]);
        assert!(p.input_tokens > 0 && p.output_tokens > 0);
    }

    #[test]
    fn malformed_histories_get_the_api_error() {
        let e = engine();
        let r = e.reply(&req(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "no result"}]},
        ])));
        let Reply::Error { status, kind, message } = r else { panic!() };
        assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
        assert!(
            message.contains("`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
            "{message}"
        );
        assert!(matches!(e.reply(&json!({"model": "m", "messages": []})), Reply::Error { status: 400, .. }));
        assert!(matches!(
            e.reply(&req(json!([{"role": "assistant", "content": "x"}]))),
            Reply::Error { status: 400, .. }
        ));
    }

    #[test]
    fn faults_fail_k_times_per_fingerprint() {
        let e = Engine::new(
            Scenario::parse(
                "roles:\n  - name: r\n    steps:\n      - id: a\n        text: ok\n        fail: {times: 2}\n",
            )
            .unwrap(),
        );
        let r = req(json!([{"role": "user", "content": "x"}]));
        assert!(matches!(e.reply(&r), Reply::Error { status: 529, .. }));
        assert!(matches!(e.reply(&r), Reply::Error { status: 529, .. }));
        assert!(matches!(e.reply(&r), Reply::Message(_)));
        let other = req(json!([{"role": "user", "content": "y"}]));
        assert!(matches!(e.reply(&other), Reply::Error { .. }), "counted per request fingerprint");
    }
}
