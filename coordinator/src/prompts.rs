//! The coordinator role's base system prompt. The job's coordinator
//! `instructions` are appended to it, never replacing it.

use flower_model::JobSpec;

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
    if !spec.coordinator.instructions.trim().is_empty() {
        blocks.push(spec.coordinator.instructions.trim().to_string());
    }
    blocks
}
