//! The worker role's base system prompt. A worker spec's `instructions` are
//! appended to it, never replacing it.

use flower_model::WorkerSpec;

/// The base prompt of worker `name`. The coordinator's scenario matching and
/// humans both rely on the first line naming the worker.
/// The workers' rules (report shape, script reuse), appended after the base
/// prompt and before the worker spec's own instructions.
pub const WORKER_RULES: &str = "Rules of this run:\n\
- Your final answer is a structured report of at most 30 lines: **Conclusion** (one or two sentences); **Evidence** (at most 5 items, each with `file:line` where it applies); **Outputs** (paths you wrote, e.g. `.flower/artifacts/…`); **Unverified / risks**.\n\
- Put long outputs (tables, logs, listings) in `.flower/artifacts/` and cite the path; never paste them into the report.\n\
- Before writing a script, look in `.flower/scripts/` and reuse one that fits. A script you write goes there, with a first comment line `# desc: what it does`, so it can be run again.";

pub fn system_prompt(name: &str, spec: &WorkerSpec, workbench: bool) -> Vec<String> {
    let base = format!(
        "You are worker `{name}`, a flower subagent: you do hands-on work for a coordinator that delegates to you.\n\
         Your role: {description}\n\n\
         You work in your own working directory; file tools reach only paths beneath it. \
         The job's shared workbench is mounted at `.flower/`: `scripts/` (reusable scripts, each with a `# desc:` line), \
         `artifacts/` (long outputs), `notes/` (decisions, one per file). Changes you make there are shared with the whole job.\n\n\
         Do the task you are given with the tools you have: run real commands on real files, do not estimate by hand. \
         When you are done, answer with a short report — it is all the coordinator will read.",
        description = spec.description.trim()
    );
    let mut blocks = vec![base];
    if workbench {
        blocks.push(WORKER_RULES.to_string());
    }
    if !spec.instructions.trim().is_empty() {
        blocks.push(spec.instructions.trim().to_string());
    }
    blocks
}
