//! `flower bench hotpath`: the dispatch and claim path, run for a fixed number
//! of tasks on one thread over the in-memory SQLite store and the in-process
//! bus, so that an instruction count of the process (`bench/callgrind` runs
//! it under callgrind) depends on the code, not on the machine's load.
//!
//! Per task, as the coordinator and a worker do it: the fan-out's task rows in
//! one write, one publish per task; then per delivery the claim that opens
//! the attempt's session, a finish carrying the final turn's entries, the ack.

use std::process::ExitCode;

use clap::Args;
use flower_bus::{MemoryBus, TaskMessage, TaskQueue};
use flower_model::{ContentBlock, Entry, EntryKind, JobId, Role, Session, SessionId, Task, TaskOutcome, Usage};
use flower_store::{Batch, Claim, NewJob, SqliteStore, Store};

#[derive(Args)]
pub struct HotpathArgs {
    /// Tasks to dispatch and claim (0: start-up only, the baseline)
    #[arg(long, default_value_t = 200)]
    pub tasks: usize,
    /// Tasks per coordinator turn (one `create_tasks` write each)
    #[arg(long, default_value_t = 8)]
    pub fan_out: usize,
}

pub async fn hotpath(a: HotpathArgs) -> anyhow::Result<ExitCode> {
    // On a runtime of one thread of its own: no scheduling differences between runs.
    let (tasks, fan_out) = (a.tasks, a.fan_out.max(1));
    let done = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(run(tasks, fan_out))
    })
    .await??;
    anyhow::ensure!(done == a.tasks, "{done} of {} tasks finished", a.tasks);
    println!("{done} tasks dispatched, claimed and finished");
    Ok(ExitCode::SUCCESS)
}

async fn run(tasks: usize, fan_out: usize) -> anyhow::Result<usize> {
    let store = SqliteStore::in_memory()?;
    let bus = MemoryBus::new();
    let job = store.create_job(NewJob::new(JobId::random(), "hotpath", serde_json::json!({}))).await?.0.id;
    let coordinator = SessionId::random();
    let mut done = 0;
    let mut n = 0;
    while n < tasks {
        let turn: Vec<Task> = (n..tasks.min(n + fan_out))
            .map(|i| Task::queued(job, coordinator, &format!("toolu_{i:06}"), "w", "d", "do the thing"))
            .collect();
        n += turn.len();
        let (created, _) = store.create_tasks(turn, None).await?;
        for (task, _) in &created {
            let message = TaskMessage {
                job_id: job,
                task_id: task.id,
                worker: task.worker.clone(),
                epoch: 0,
                base_attempt: 0,
                trace: None,
                body: flower_bus::TaskBody::of(task),
                republish: 0,
                stream_notice: false,
            };
            bus.publish(message).await?;
        }
        for _ in 0..created.len() {
            let delivery = bus.next().await?;
            let message = delivery.message().clone();
            let session = Session {
                id: message.task_id.session(),
                job_id: job,
                role: Role::Worker,
                label: message.worker.clone(),
                task_id: Some(message.task_id),
                created_at: 0,
            };
            let claimed = store.claim_task_opening(message.task_id, 1, "w1", Some(session.clone())).await?;
            anyhow::ensure!(matches!(claimed, Claim::Claimed { .. }), "a first delivery is claimed");
            let input = Entry::new(job, session.id, None, EntryKind::User, vec![ContentBlock::text("do the thing")]);
            let answer =
                Entry::new(job, session.id, Some(input.uuid), EntryKind::Assistant, vec![ContentBlock::text("done")]);
            let batch = Batch { entries: vec![input, answer], ..Default::default() };
            let outcome = TaskOutcome::Succeeded { report: "done".into() };
            store.finish_task_with(message.task_id, 1, outcome, Usage::default(), batch).await?;
            delivery.ack().await?;
            done += 1;
        }
    }
    Ok(done)
}
