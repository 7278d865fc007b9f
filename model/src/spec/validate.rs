//! The rules serde cannot express: required text, sizes, cross-references,
//! MCP servers' transports and credentials, and an upper bound on every
//! number of the runtime options. Each error names its field.

use std::time::Duration;

use bytesize::ByteSize;

use super::{
    JobSpec, MAX_GOAL_BYTES, MAX_INSTRUCTIONS_BYTES, MAX_NAME_CHARS, MAX_RESIDENT_TOOLS, MAX_ROLE_NAME_CHARS,
    McpServerSpec, ProviderKind, RuntimeOptions, SpecError, WORKER_TOOLS,
};

// Upper bounds of the runtime options (see `RuntimeOptions::validate_limits`).
const MAX_TURNS: u64 = 10_000;
const MAX_CONCURRENCY: u64 = 1_024;
/// The most output tokens a model offers in one call.
const MAX_OUTPUT_TOKENS: u64 = 128_000;
/// The documented maximum of `bash_timeout`.
const MAX_BASH_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_BASH_OUTPUT_LIMIT: ByteSize = ByteSize::mib(64);
const MAX_WORKSPACE_LIMIT: ByteSize = ByteSize::gib(4);
const MAX_SPILL_THRESHOLD: u64 = 1_000_000;
const MAX_KEEP_RECENT: u64 = 100_000;
const MAX_PRUNING_CHARS: u64 = 10_000_000;
const MAX_GENERATIONS: u64 = 64;
const MIN_WINDOW: u64 = 1_000;
const MAX_WINDOW: u64 = 10_000_000;

impl JobSpec {
    /// Rules serde cannot express: required text, sizes, cross-references
    /// and the limits of each runtime option. Each error names its field.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_text()?;
        self.validate_workers()?;
        self.validate_coordinator_workers()?;
        self.validate_provider()?;
        self.validate_ask()?;
        self.validate_workflow()?;
        for (name, m) in &self.mcp_servers {
            validate_mcp_server(name, m)?;
        }
        let resident: usize =
            self.mcp_servers.values().map(|m| m.resident.len()).sum::<usize>() + WORKER_TOOLS.len() + 1;
        if self.runtime.tool_deferral && resident > MAX_RESIDENT_TOOLS {
            return Err(SpecError::new(
                "mcp_servers",
                format!(
                    "{resident} resident tools: a role keeps at most {MAX_RESIDENT_TOOLS} (list fewer under `resident`)"
                ),
            ));
        }
        if self.network.egress.len() > crate::network::MAX_EGRESS {
            return Err(SpecError::new(
                "network.egress",
                format!("at most {} destinations", crate::network::MAX_EGRESS),
            ));
        }
        if let Some(p) = self.priority
            && !(1..=5).contains(&p)
        {
            return Err(SpecError::new("priority", format!("{p}: a priority is 1 (most urgent) to 5")));
        }
        self.runtime.validate_limits()?;
        self.validate_budget()
    }

    /// Names, goal and prompts: present, printable where shown, and bounded.
    fn validate_text(&self) -> Result<(), SpecError> {
        non_empty("name", &self.name)?;
        at_most_chars("name", &self.name, MAX_NAME_CHARS)?;
        printable("name", &self.name)?;
        non_empty("goal", &self.goal)?;
        at_most_bytes("goal", &self.goal, MAX_GOAL_BYTES)?;
        non_empty("model", &self.model)?;
        non_empty("coordinator.name", &self.coordinator.name)?;
        at_most_chars("coordinator.name", &self.coordinator.name, MAX_ROLE_NAME_CHARS)?;
        printable("coordinator.name", &self.coordinator.name)?;
        at_most_bytes("coordinator.instructions", &self.coordinator.instructions, MAX_INSTRUCTIONS_BYTES)
    }

    fn validate_workers(&self) -> Result<(), SpecError> {
        if self.workers.is_empty() {
            return Err(SpecError::new("workers", "at least one worker is required: the coordinator only delegates"));
        }
        for (name, w) in &self.workers {
            let at = format!("workers.{name}");
            if name.trim().is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(SpecError::new(at, "a worker name is one word without spaces"));
            }
            at_most_chars(&at, name, MAX_ROLE_NAME_CHARS)?;
            non_empty(&format!("{at}.description"), &w.description)?;
            at_most_bytes(&format!("{at}.description"), &w.description, MAX_INSTRUCTIONS_BYTES)?;
            at_most_bytes(&format!("{at}.instructions"), &w.instructions, MAX_INSTRUCTIONS_BYTES)?;
            non_empty(&format!("{at}.model"), &w.model)?;
            for (i, tool) in w.tools.iter().enumerate() {
                if !WORKER_TOOLS.contains(&tool.as_str()) {
                    return Err(SpecError::new(
                        format!("{at}.tools[{i}]"),
                        format!("unknown tool `{tool}` (workers may use: {})", WORKER_TOOLS.join(", ")),
                    ));
                }
                if w.tools[..i].contains(tool) {
                    return Err(SpecError::new(format!("{at}.tools[{i}]"), format!("`{tool}` listed twice")));
                }
            }
        }
        Ok(())
    }

    fn validate_coordinator_workers(&self) -> Result<(), SpecError> {
        let Some(list) = &self.coordinator.workers else { return Ok(()) };
        if list.is_empty() {
            return Err(SpecError::new("coordinator.workers", "empty: the coordinator needs a worker to delegate to"));
        }
        for (i, name) in list.iter().enumerate() {
            if !self.workers.contains_key(name) {
                let known: Vec<&str> = self.workers.keys().map(String::as_str).collect();
                return Err(SpecError::new(
                    format!("coordinator.workers[{i}]"),
                    format!("no worker named `{name}` (defined under `workers`: {})", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn validate_workflow(&self) -> Result<(), SpecError> {
        let Some(judge) = &self.workflow.judge else { return Ok(()) };
        if !(1..=10).contains(&judge.rounds) {
            return Err(SpecError::new("workflow.judge.rounds", "must be between 1 and 10"));
        }
        Ok(())
    }

    fn validate_ask(&self) -> Result<(), SpecError> {
        let Some(ask) = &self.runtime.ask else { return Ok(()) };
        if !(Duration::from_secs(1)..=Duration::from_secs(7 * 24 * 3600)).contains(&ask.timeout) {
            return Err(SpecError::new("runtime.ask.timeout", "must be between 1s and 7 days"));
        }
        if !(1..=100).contains(&ask.max_asks) {
            return Err(SpecError::new("runtime.ask.max_asks", "must be between 1 and 100"));
        }
        Ok(())
    }

    fn validate_provider(&self) -> Result<(), SpecError> {
        match self.provider {
            ProviderKind::Sim if self.scenario.is_none() => {
                return Err(SpecError::new("scenario", "required with provider `sim` (the file the simulator plays)"));
            }
            ProviderKind::Sim if self.base_url.is_some() => {
                return Err(SpecError::new("base_url", "not used with provider `sim` (the simulator runs in-process)"));
            }
            ProviderKind::Anthropic | ProviderKind::Openai if self.scenario.is_some() => {
                return Err(SpecError::new("scenario", "only used with provider `sim`"));
            }
            _ => {}
        }
        let roles = std::iter::once(("coordinator.provider".to_string(), self.coordinator.provider))
            .chain(self.workers.iter().map(|(n, w)| (format!("workers.{n}.provider"), w.provider)));
        for (field, kind) in roles {
            if kind == Some(ProviderKind::Sim) {
                return Err(SpecError::new(
                    field,
                    "`sim` is a job's provider, not a role's: a role names `anthropic` or `openai` (with provider `sim`, the simulator answers either API)",
                ));
            }
        }
        if let Some(url) = &self.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(SpecError::new("base_url", format!("`{url}` is not an http(s) URL")));
        }
        Ok(())
    }

    /// A budget or deadline that could never be met is a mistake, not a limit.
    fn validate_budget(&self) -> Result<(), SpecError> {
        let b = &self.runtime.budget;
        if b.max_tokens == Some(0) {
            return Err(SpecError::new("runtime.budget.max_tokens", "must be more than 0 (leave it out for no limit)"));
        }
        if let Some(usd) = b.max_cost_usd
            && !(usd.is_finite() && usd > 0.0)
        {
            return Err(SpecError::new(
                "runtime.budget.max_cost_usd",
                format!("{usd} is not a budget: a finite amount more than 0 (leave it out for no limit)"),
            ));
        }
        if b.deadline.is_some_and(|d| d.is_zero()) {
            return Err(SpecError::new(
                "runtime.budget.deadline",
                "must be longer than 0s (leave it out for no limit)",
            ));
        }
        for (model, p) in &b.prices {
            let fields = [
                ("input", p.input),
                ("output", p.output),
                ("cache_write_5m", p.cache_write_5m),
                ("cache_write_1h", p.cache_write_1h),
                ("cache_read", p.cache_read),
            ];
            if let Some((field, v)) = fields.into_iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
                return Err(SpecError::new(
                    format!("runtime.budget.prices.{model}.{field}"),
                    format!("{v} is not a price: a finite amount of 0 or more"),
                ));
            }
        }
        if b.max_cost_usd.is_some() {
            let models = std::iter::once(self.model.clone()).chain(self.workers.values().map(|w| self.worker_model(w)));
            for m in models {
                if b.price(&m).is_none() {
                    return Err(SpecError::new(
                        "runtime.budget.prices",
                        format!("no price for model `{m}`: add it to runtime.budget.prices to use max_cost_usd"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One MCP server: a usable name, one transport, credentials by reference only.
fn validate_mcp_server(name: &str, m: &McpServerSpec) -> Result<(), SpecError> {
    let at = format!("mcp_servers.{name}");
    if name.is_empty() || name.len() > 16 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(SpecError::new(
            at,
            "a server name is 1-16 letters, digits or '-' (tools are named mcp__<server>__<tool>, at most 64 characters)",
        ));
    }
    match (m.command.is_empty(), &m.url) {
        (true, None) => return Err(SpecError::new(at, "needs `command` (stdio) or `url` (streamable HTTP)")),
        (false, Some(_)) => {
            return Err(SpecError::new(at, "has both `command` and `url`: choose one transport"));
        }
        (true, Some(url)) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            return Err(SpecError::new(format!("{at}.url"), format!("`{url}` is not an http(s) URL")));
        }
        _ => {}
    }
    if m.url.is_some() && !m.env_from.is_empty() {
        return Err(SpecError::new(format!("{at}.env_from"), "only for stdio servers (use `token_env` over HTTP)"));
    }
    if !m.command.is_empty() && m.token_env.is_some() {
        return Err(SpecError::new(format!("{at}.token_env"), "only for HTTP servers (use `env_from` for stdio)"));
    }
    for (var, from) in m.env_from.iter().chain(m.token_env.as_ref().map(|t| (t, t))) {
        let ok = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok(var) || !ok(from) {
            return Err(SpecError::new(
                format!("{at}.env_from"),
                format!("`{var}: {from}` must name environment variables (secrets never go in a spec)"),
            ));
        }
    }
    Ok(())
}

impl RuntimeOptions {
    /// Upper bounds on every number: past them a value is a typo or would
    /// fail later (an hour-long `Bash` call, a model asked for more output
    /// tokens than any offers, an output buffer the size of the machine).
    fn validate_limits(&self) -> Result<(), SpecError> {
        in_range("runtime.max_turns", self.max_turns.into(), 1, MAX_TURNS)?;
        in_range("runtime.worker_max_turns", self.worker_max_turns.into(), 1, MAX_TURNS)?;
        in_range("runtime.concurrency", self.concurrency.into(), 1, MAX_CONCURRENCY)?;
        in_range("runtime.max_output_tokens", self.max_output_tokens.into(), 1, MAX_OUTPUT_TOKENS)?;
        if self.bash_timeout.is_zero() || self.bash_timeout > MAX_BASH_TIMEOUT {
            return Err(SpecError::new(
                "runtime.bash_timeout",
                format!(
                    "{} is out of range: must be longer than 0s and at most 10m",
                    humantime_serde::re::humantime::format_duration(self.bash_timeout)
                ),
            ));
        }
        in_bytes("runtime.bash_output_limit", self.bash_output_limit, MAX_BASH_OUTPUT_LIMIT)?;
        in_bytes("runtime.workspace_limit", self.workspace_limit, MAX_WORKSPACE_LIMIT)?;
        in_range("runtime.spill_threshold", self.spill_threshold as u64, 0, MAX_SPILL_THRESHOLD)?;
        let p = &self.pruning;
        in_range("runtime.pruning.keep_denials", p.keep_denials as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.ephemeral.keep_recent", p.ephemeral.keep_recent as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.ephemeral.max_chars", p.ephemeral.max_chars as u64, 0, MAX_PRUNING_CHARS)?;
        in_range("runtime.pruning.trim.keep_recent", p.trim.keep_recent as u64, 0, MAX_KEEP_RECENT)?;
        in_range("runtime.pruning.trim.min_chars", p.trim.min_chars as u64, 0, MAX_PRUNING_CHARS)?;
        let h = &self.handoff;
        in_range("runtime.handoff.max_generations", h.max_generations.into(), 1, MAX_GENERATIONS)?;
        if let Some(window) = h.window {
            in_range("runtime.handoff.window", window, MIN_WINDOW, MAX_WINDOW)?;
        }
        Ok(())
    }
}

fn in_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), SpecError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(SpecError::new(field, format!("{value} is out of range: must be from {min} to {max}")))
    }
}

fn in_bytes(field: &str, value: ByteSize, max: ByteSize) -> Result<(), SpecError> {
    if value.as_u64() == 0 || value > max {
        Err(SpecError::new(field, format!("{value} is out of range: must be more than 0 B and at most {max}")))
    } else {
        Ok(())
    }
}

fn at_most_chars(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    let n = value.chars().count();
    if n > max { Err(SpecError::new(field, format!("{n} characters: at most {max}"))) } else { Ok(()) }
}

fn at_most_bytes(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    if value.len() > max {
        Err(SpecError::new(field, format!("{} bytes: at most {} KiB", value.len(), max / 1024)))
    } else {
        Ok(())
    }
}

/// A name is shown on one line (listings, progress): no control characters.
fn printable(field: &str, value: &str) -> Result<(), SpecError> {
    match value.chars().find(|c| c.is_control()) {
        Some(c) => Err(SpecError::new(field, format!("contains the control character {c:?}"))),
        None => Ok(()),
    }
}

fn non_empty(field: &str, value: &str) -> Result<(), SpecError> {
    if value.trim().is_empty() { Err(SpecError::new(field, "must not be empty")) } else { Ok(()) }
}
