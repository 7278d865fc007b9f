use std::time::Duration;

use bytesize::ByteSize;
use pretty_assertions::assert_eq;

use super::*;

const GOOD: &str = r#"
name: demo
goal: find out how big data/ is
provider: sim
scenario: scenario.yaml
coordinator:
  name: lead
workers:
  counter:
    description: counts files
    tools: [Bash, Read]
"#;

fn err(text: &str) -> SpecError {
    JobSpec::parse(text).unwrap_err()
}

#[test]
fn a_good_spec_parses_with_defaults() {
    let spec = JobSpec::parse(GOOD).unwrap();
    assert_eq!(spec.model, DEFAULT_MODEL);
    assert_eq!(spec.workers["counter"].model, "inherit");
    assert_eq!(spec.runtime, RuntimeOptions::default());
    assert_eq!(spec.delegable_workers().len(), 1);
}

#[test]
fn json_is_accepted() {
    let v: serde_json::Value = serde_yaml_ng::from_str(GOOD).unwrap();
    let spec = JobSpec::parse(&serde_json::to_string(&v).unwrap()).unwrap();
    assert_eq!(spec, JobSpec::parse(GOOD).unwrap());
}

#[test]
fn errors_name_the_field() {
    let e = err(&GOOD.replace("goal: find out how big data/ is\n", ""));
    assert_eq!((e.field.as_str(), e.message.as_str()), ("goal", "missing (required)"));

    let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: Bash"));
    assert_eq!(e.field, "workers.counter.tools");
    assert!(e.message.contains("expected a sequence"), "{e}");

    let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: [Bash, Bsh]"));
    assert_eq!(e.field, "workers.counter.tools[1]");

    let e = err(&GOOD.replace("name: lead", "name: lead\n  workers: [counter, ghost]"));
    assert_eq!(e.field, "coordinator.workers[1]");
    assert!(e.message.contains("no worker named `ghost`"), "{e}");

    let e = err(&format!("{GOOD}runtime:\n  max_turns: many\n"));
    assert_eq!(e.field, "runtime.max_turns");

    let e = err(&format!("{GOOD}runtime:\n  max_turn: 3\n"));
    assert_eq!(e.field, "runtime.max_turn");
    assert!(e.message.contains("unknown field `max_turn`"), "{e}");

    let e = err(&GOOD.replace("description: counts files", "description: counts files\n    colour: red"));
    assert_eq!(e.field, "workers.counter.colour", "{e}");

    let e = err(&GOOD.replace("description: counts files", "description: [counts, files]"));
    assert_eq!(e.field, "workers.counter.description", "{e}");

    let e = err(&GOOD.replace("scenario: scenario.yaml\n", ""));
    assert_eq!(e.field, "scenario");

    assert_eq!(err("- a\n- b\n").field, "(document)");
    assert_eq!(err("name: [").field, "(document)");
}

#[test]
fn mcp_servers_are_checked_and_secrets_stay_out() {
    let with = |m: &str| format!("{GOOD}mcp_servers:\n{m}");
    let ok =
        JobSpec::parse(&with("  fx:\n    command: [flower, mcp-fixture]\n    env_from: {TOKEN: MY_TOKEN}\n")).unwrap();
    assert_eq!(ok.mcp_servers["fx"].env_from["TOKEN"], "MY_TOKEN");
    let e = err(&with("  fx:\n    command: [srv]\n    env: {TOKEN: hunter2}\n"));
    assert_eq!(e.field, "mcp_servers.fx.env", "a clear-text environment is refused: {e}");
    let e = err(&with("  fx: {}\n"));
    assert!(e.field == "mcp_servers.fx" && e.message.contains("`command` (stdio) or `url`"), "{e}");
    let e = err(&with("  fx:\n    url: ftp://x\n"));
    assert_eq!(e.field, "mcp_servers.fx.url");
    let e = err(&with("  fx:\n    command: [srv]\n    env_from: {TOKEN: \"hunter2 value\"}\n"));
    assert_eq!(e.field, "mcp_servers.fx.env_from");
    let e = err(&with("  a_very_long_server_name:\n    command: [srv]\n"));
    assert!(e.message.contains("64 characters"), "{e}");
    let resident: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let e = err(&with(&format!("  fx:\n    command: [srv]\n    resident: [{}]\n", resident.join(", "))));
    assert!(e.message.contains("at most 40"), "{e}");
}

/// GOOD as a JSON value, to edit one field.
fn good() -> serde_json::Value {
    serde_yaml_ng::from_str(GOOD).unwrap()
}

fn err_v(v: serde_json::Value) -> SpecError {
    JobSpec::from_value(v).unwrap_err()
}

#[test]
fn the_judge_is_checked() {
    for (opts, field, says) in [
        ("judge: {rounds: 0}", "workflow.judge.rounds", "1 and 10"),
        ("judge: {rounds: 11}", "workflow.judge.rounds", "1 and 10"),
        ("judge: {can_run: yes please}", "workflow.judge.can_run", "invalid"),
        ("judges: {}", "workflow.judges", "unknown field"),
    ] {
        let e = err(&format!("{GOOD}workflow:\n  {opts}\n"));
        assert_eq!(e.field, field, "{opts}: {e}");
        assert!(e.message.contains(says), "{opts}: {e}");
    }
    let spec = JobSpec::parse(&format!("{GOOD}workflow:\n  judge: {{}}\n")).unwrap();
    assert_eq!(spec.workflow.judge, Some(JudgeOptions { rounds: 3, can_run: false }));
    let spec = JobSpec::parse(&format!("{GOOD}workflow:\n  judge: {{can_run: true}}\n")).unwrap();
    assert_eq!(spec.workflow.judge, Some(JudgeOptions { rounds: 3, can_run: true }));
    assert!(JobSpec::parse(GOOD).unwrap().workflow.is_empty());
}

#[test]
fn runtime_numbers_have_upper_bounds() {
    for (opts, field, limit) in [
        ("max_turns: 4294967295", "runtime.max_turns", "10000"),
        ("worker_max_turns: 10001", "runtime.worker_max_turns", "10000"),
        ("concurrency: 4294967295", "runtime.concurrency", "1024"),
        ("max_output_tokens: 4294967295", "runtime.max_output_tokens", "128000"),
        ("bash_timeout: 10y", "runtime.bash_timeout", "10m"),
        ("bash_timeout: 601s", "runtime.bash_timeout", "10m"),
        ("bash_output_limit: 0 B", "runtime.bash_output_limit", "more than 0 B"),
        ("bash_output_limit: 1 EiB", "runtime.bash_output_limit", "MiB"),
        ("workspace_limit: 0 B", "runtime.workspace_limit", "more than 0 B"),
        ("workspace_limit: 5 GiB", "runtime.workspace_limit", "GiB"),
        ("spill_threshold: 1000001", "runtime.spill_threshold", "1000000"),
        ("pruning: {keep_denials: 100001}", "runtime.pruning.keep_denials", "100000"),
        ("pruning: {ephemeral: {keep_recent: 100001}}", "runtime.pruning.ephemeral.keep_recent", "100000"),
        ("pruning: {ephemeral: {max_chars: 10000001}}", "runtime.pruning.ephemeral.max_chars", "10000000"),
        ("pruning: {trim: {keep_recent: 100001}}", "runtime.pruning.trim.keep_recent", "100000"),
        ("pruning: {trim: {min_chars: 10000001}}", "runtime.pruning.trim.min_chars", "10000000"),
        ("handoff: {max_generations: 0}", "runtime.handoff.max_generations", "1 to 64"),
        ("handoff: {max_generations: 65}", "runtime.handoff.max_generations", "1 to 64"),
        ("handoff: {window: 999}", "runtime.handoff.window", "1000 to 10000000"),
        ("handoff: {window: 10000001}", "runtime.handoff.window", "1000 to 10000000"),
        ("ask: {timeout: 0s}", "runtime.ask.timeout", "1s and 7 days"),
        ("ask: {timeout: 8days}", "runtime.ask.timeout", "1s and 7 days"),
        ("ask: {max_asks: 0}", "runtime.ask.max_asks", "1 and 100"),
        ("ask: {max_asks: 101}", "runtime.ask.max_asks", "1 and 100"),
        ("ask: {timout: 1m}", "runtime.ask.timout", "expected `timeout`"),
    ] {
        let e = err(&format!("{GOOD}runtime:\n  {opts}\n"));
        assert_eq!(e.field, field, "{opts}: {e}");
        assert!(e.message.contains(limit), "{opts}: the message says the limit: {e}");
    }
    let at_the_limits = "runtime:\n  max_turns: 10000\n  worker_max_turns: 10000\n  concurrency: 1024\n  \
        max_output_tokens: 128000\n  bash_timeout: 10m\n  bash_output_limit: 64 MiB\n  workspace_limit: 4 GiB\n  \
        spill_threshold: 1000000\n  handoff: {max_generations: 64, window: 10000000}\n";
    JobSpec::parse(&format!("{GOOD}{at_the_limits}")).unwrap();
}

#[test]
fn names_goal_and_prompts_are_bounded() {
    let mut v = good();
    v["name"] = "n".repeat(1_000_000).into();
    let e = err_v(v);
    assert!(e.field == "name" && e.message.contains("at most 200"), "{e}");
    let mut v = good();
    v["name"] = "two\nlines".into();
    assert!(err_v(v).field == "name", "control characters in a name are refused");
    let mut v = good();
    v["goal"] = "g".repeat(16 << 20).into();
    let e = err_v(v);
    assert!(e.field == "goal" && e.message.contains("at most 256 KiB"), "{e}");
    let mut v = good();
    v["goal"] = "g".repeat(MAX_GOAL_BYTES).into();
    JobSpec::from_value(v).unwrap();
    assert_eq!(MAX_MESSAGE_BYTES, MAX_GOAL_BYTES);

    let mut v = good();
    v["coordinator"]["name"] = "c".repeat(65).into();
    let e = err_v(v);
    assert!(e.field == "coordinator.name" && e.message.contains("at most 64"), "{e}");
    let mut v = good();
    let long = "w".repeat(65);
    v["workers"] = serde_json::json!({ long.clone(): {"description": "d"} });
    let e = err_v(v);
    assert!(e.field == format!("workers.{long}") && e.message.contains("at most 64"), "{e}");

    let big = "i".repeat(64 * 1024 + 1);
    for field in ["coordinator.instructions", "workers.counter.instructions", "workers.counter.description"] {
        let mut v = good();
        let mut at = &mut v;
        for k in field.split('.') {
            at = &mut at[k];
        }
        *at = big.clone().into();
        let e = err_v(v);
        assert!(e.field == field && e.message.contains("at most 64 KiB"), "{field}: {e}");
    }
}

#[test]
fn a_nul_byte_anywhere_is_refused_at_its_exact_path() {
    let mut v = good();
    v["workers"]["counter"]["instructions"] = "a\0b".into();
    assert_eq!(err_v(v).field, "workers.counter.instructions");
    let mut v = good();
    v["coordinator"]["workers"] = serde_json::json!(["counter", "gho\0st"]);
    let e = err_v(v);
    assert!(e.field == "coordinator.workers[1]" && e.message.contains("NUL"), "{e}");
    let mut v = good();
    v["name"] = "demo\0".into();
    assert_eq!(err_v(v).field, "name");
    assert_eq!(err(&GOOD.replace("name: demo", "name: \"de\\0mo\"")).field, "name", "YAML's `\\0` escape");
    let mut v = good();
    v["workers"]["co\0unter"] = serde_json::json!({"description": "d"});
    assert_eq!(err_v(v).field, "workers.co\\0unter");
    let mut v = good();
    v["runtime"] = serde_json::json!({"budget": {"prices": {"m\0": {}}}});
    assert_eq!(err_v(v).field, "runtime.budget.prices.m\\0");
}

#[test]
fn budgets_and_deadlines_must_be_reachable() {
    for (opts, field) in [
        ("max_tokens: 0", "runtime.budget.max_tokens"),
        ("max_cost_usd: 0", "runtime.budget.max_cost_usd"),
        ("max_cost_usd: -1.5", "runtime.budget.max_cost_usd"),
        ("max_cost_usd: .nan", "runtime.budget.max_cost_usd"),
        ("max_cost_usd: .inf", "runtime.budget.max_cost_usd"),
        ("max_cost_usd: -.inf", "runtime.budget.max_cost_usd"),
        ("deadline: 0s", "runtime.budget.deadline"),
    ] {
        let e = err(&format!("{GOOD}runtime:\n  budget:\n    {opts}\n"));
        assert_eq!(e.field, field, "{opts}: {e}");
    }
    // A spec built in code is held to the same rule.
    for usd in [f64::NAN, f64::INFINITY] {
        let mut spec = JobSpec::parse(GOOD).unwrap();
        spec.runtime.budget.max_cost_usd = Some(usd);
        assert_eq!(spec.validate().unwrap_err().field, "runtime.budget.max_cost_usd");
    }
    let price = "{input: -1, output: 1, cache_write_5m: 1, cache_write_1h: 1, cache_read: 1}";
    let e = err(&format!("{GOOD}runtime:\n  budget:\n    prices:\n      m: {price}\n"));
    assert_eq!(e.field, "runtime.budget.prices.m.input");
    JobSpec::parse(&format!("{GOOD}runtime:\n  budget: {{max_tokens: 1, max_cost_usd: 0.01, deadline: 1ms}}\n"))
        .unwrap();
}

#[test]
fn a_tool_listed_twice_is_named() {
    let e = err(&GOOD.replace("tools: [Bash, Read]", "tools: [Bash, Read, Bash]"));
    assert_eq!((e.field.as_str(), e.message.as_str()), ("workers.counter.tools[2]", "`Bash` listed twice"));
}

#[test]
fn a_sequence_where_a_mapping_belongs_is_refused() {
    for (path, field) in [
        (&["runtime"][..], "runtime"),
        (&["coordinator"], "coordinator"),
        (&["workers"], "workers"),
        (&["workers", "counter"], "workers.counter"),
        (&["mcp_servers"], "mcp_servers"),
        (&["mcp_servers", "fx"], "mcp_servers.fx"),
        (&["mcp_servers", "fx", "env_from"], "mcp_servers.fx.env_from"),
        (&["runtime", "pruning"], "runtime.pruning"),
        (&["runtime", "pruning", "ephemeral"], "runtime.pruning.ephemeral"),
        (&["runtime", "pruning", "trim"], "runtime.pruning.trim"),
        (&["runtime", "handoff"], "runtime.handoff"),
        (&["runtime", "budget"], "runtime.budget"),
        (&["runtime", "budget", "prices"], "runtime.budget.prices"),
        (&["runtime", "budget", "prices", "m"], "runtime.budget.prices.m"),
    ] {
        let mut v = good();
        v["mcp_servers"] = serde_json::json!({"fx": {"command": ["srv"]}});
        let mut at = &mut v;
        for k in path {
            if at.get(*k).is_none() {
                at[*k] = serde_json::json!({});
            }
            at = &mut at[*k];
        }
        *at = serde_json::json!([]);
        let e = err_v(v);
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains("must be a mapping") && e.message.contains("a sequence"), "{e}");
    }
    let e = err(&format!("{GOOD}runtime: []\n"));
    assert_eq!(e.field, "runtime");
}

#[test]
fn a_huge_key_is_not_echoed_in_the_field() {
    // (YAML caps a plain key at 1024 characters; JSON has no such cap.)
    let mut v: serde_json::Value = serde_yaml_ng::from_str(GOOD).unwrap();
    let worker = v["workers"]["counter"].take();
    v["workers"] = serde_json::json!({ "w".repeat(1 << 20) + " x": worker });
    let e = err(&v.to_string());
    assert!(e.field.starts_with("workers.www") && e.field.len() < 300, "{}", e.field.len());
}

#[test]
fn durations_and_sizes_are_typed() {
    let spec = JobSpec::parse(&format!("{GOOD}runtime:\n  bash_timeout: 5s\n  bash_output_limit: 1 MiB\n")).unwrap();
    assert_eq!(spec.runtime.bash_timeout, Duration::from_secs(5));
    assert_eq!(spec.runtime.bash_output_limit, ByteSize::mib(1));
    let e = err(&format!("{GOOD}runtime:\n  bash_timeout: 0s\n"));
    assert_eq!(e.field, "runtime.bash_timeout");
}

#[test]
fn each_role_routes_to_its_provider_and_api() {
    let two = GOOD.replace("    tools: [Bash, Read]\n", "    tools: [Bash, Read]\n    provider: openai\n");
    let spec = JobSpec::parse(&two).unwrap();
    let w = &spec.workers["counter"];
    // With `sim`, the simulator answers both APIs.
    assert_eq!(spec.coordinator_route(), Route { entry: ProviderKind::Sim, api: Api::Messages });
    assert_eq!(spec.worker_route(w), Route { entry: ProviderKind::Sim, api: Api::ChatCompletions });
    assert_eq!(spec.routes().len(), 2);
    let real = two.replace("provider: sim\nscenario: scenario.yaml\n", "provider: anthropic\n");
    let spec = JobSpec::parse(&real).unwrap();
    assert_eq!(spec.coordinator_route(), Route { entry: ProviderKind::Anthropic, api: Api::Messages });
    assert_eq!(
        spec.worker_route(&spec.workers["counter"]),
        Route { entry: ProviderKind::Openai, api: Api::ChatCompletions }
    );
    let openai = GOOD.replace("provider: sim\nscenario: scenario.yaml\n", "provider: openai\n");
    let spec = JobSpec::parse(&openai).unwrap();
    assert_eq!(spec.routes(), vec![Route { entry: ProviderKind::Openai, api: Api::ChatCompletions }]);
    // A role does not name the simulator; an unknown provider names its field.
    let e = err(&GOOD.replace("  name: lead\n", "  name: lead\n  provider: sim\n"));
    assert_eq!(e.field, "coordinator.provider");
    let e = err(&GOOD.replace("    tools: [Bash, Read]\n", "    tools: [Bash, Read]\n    provider: mistral\n"));
    assert!(e.field.starts_with("workers"), "{e}");
    assert!(e.to_string().contains("mistral"), "{e}");
    let e = err(&openai.replace("provider: openai\n", "provider: openai\nscenario: s.yaml\n"));
    assert_eq!(e.field, "scenario");
}

#[test]
fn openai_models_have_prices_with_their_cached_rate() {
    let p = builtin_price("gpt-4.1-mini").unwrap();
    assert_eq!((p.input, p.cache_read, p.output), (0.4, 0.1, 1.6), "not gpt-4.1's");
    assert_eq!(builtin_price("gpt-4o").unwrap().cache_read, 1.25);
    assert!(builtin_price("llama-3-70b").is_none());
}
