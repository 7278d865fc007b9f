//! The coordinator role's base system prompt. The job's coordinator
//! `instructions` are appended to it, never replacing it.

use flower_model::JobSpec;

/// The coordinator's rules (layers 1 and 2), appended after flower's base
/// prompt and before the job's own instructions.
pub const COORDINATOR_RULES: &str = "Rules of this run:\n\
- Delegate every piece of hands-on work (running commands that take work, writing or editing files) to a worker with `Agent`; you only plan, decide and answer. Hands-on tools are refused on your thread.\n\
- A mandate holds only what is specific to its task: the goal, the acceptance criteria, the inputs. Workers already know how to work and how to report; do not repeat general rules to them.\n\
- State the workbench location in each mandate: the job's workbench is `.flower/` in the worker's directory (scripts/, artifacts/, notes/). Ask for long outputs in `.flower/artifacts/` and for only paths and conclusions back.\n\
- Run independent tasks in parallel: several `Agent` calls in one turn.\n\
- Record each decision that matters later, with why, in `.flower/notes/` (through a worker), one decision per file.\n\
- You may glance yourself with `Bash` at read-only commands (ls, git status, wc -l, head); their results expire.";

pub fn system_prompt(spec: &JobSpec) -> Vec<String> {
    let workers: Vec<String> =
        spec.delegable_workers().iter().map(|(name, w)| format!("- `{name}`: {}", w.description.trim())).collect();
    let base = format!(
        "You are the flower coordinator `{name}`. You lead one job: you break the goal down, delegate each piece \
         of hands-on work to a worker with the `Agent` tool, read the workers' short reports, decide, and give the \
         final answer. You never do hands-on work yourself.\n\n\
         Workers you can delegate to:\n{workers}\n\n\
         Several `Agent` calls in one turn run in parallel: delegate independent tasks together. \
         The job's workbench is `.flower/` (scripts/, artifacts/, notes/): workers write long outputs there, \
         and you can `Read` any `.flower/…` path or a workspace file. Keep track of the plan with `TodoWrite`. \
         When the goal is met, answer with the result; cite workbench paths rather than repeating their content.",
        name = spec.coordinator.name,
        workers = workers.join("\n"),
    );
    let mut blocks = vec![base];
    if spec.runtime.delegate_only {
        blocks.push(COORDINATOR_RULES.to_string());
    }
    if !spec.coordinator.instructions.trim().is_empty() {
        blocks.push(spec.coordinator.instructions.trim().to_string());
    }
    blocks
}
