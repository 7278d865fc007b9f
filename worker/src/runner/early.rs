//! A first delivery that carries the task's words: its run starts while
//! its claim commits (docs/design.md section 3). The session acts on
//! nothing the model answers (no entry, no tool) before the claim commits:
//! it waits at a gate the claim opens; a refused claim cancels it and its
//! answer is dropped. A first answer that was final before the claim held
//! the task's row is offered to the claim, which then ends the task in the
//! same write ([`Store::claim_task_ending`]); its end's notice goes out once
//! that transaction holds the row. A job with MCP servers starts none of
//! their programs before the claim: it is claimed first, then run.
//!
//! [`Store::claim_task_ending`]: flower_store::Store::claim_task_ending

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use flower_agent::{AgentError, Outcome};
use flower_bus::{Delivery, TaskMessage};
use flower_model::{Task, TaskOutcome, Usage, now_ms};
use flower_store::{Batch, Claim, EndOffer, OfferedEnd, StoreError};
use tokio_util::sync::CancellationToken;

use super::claim::{Claimed, Running};
use super::end::Workbench;
use super::folder::{Fill, Opened, TaskDir};
use super::jobs::CachedJob;
use super::session::Start;
use super::{Failure, Worker};

/// How long a first delivery's claim waits for its run to need it: a model
/// that answers sooner, finally, has its attempt claimed and ended in one
/// write; a slower one finds it claimed (the task shows as started) long
/// before its answer.
const CLAIM_AFTER: Duration = Duration::from_millis(20);

/// What a first delivery's run shares with its claim: the gate its session
/// waits at, the end it may offer the claim, and whether the end's notice
/// went out.
pub(super) struct Early {
    pub(super) gate: flower_agent::Gate,
    offer: EndOffer,
    notice: Arc<AtomicBool>,
}

/// What a first delivery's claim decided, while its run waits at the gate.
enum Verdict {
    /// Claimed and ended in one write with the run's offered end: the
    /// claimed row, the ended row and what the write stored.
    Ended(Task, Box<(Task, flower_store::Written)>),
    /// Claimed, the directory filled: the run goes on.
    Claimed(Task, Running),
    /// Claimed, but the directory could not be filled: the run stops at its
    /// gate and the attempt fails (given back when the cause is transient).
    Unfilled(Task, Running, StoreError),
    /// Refused: the delivery is settled, the run stops at its gate.
    Refused,
}

impl Verdict {
    /// Whether the run waiting at the gate may act.
    fn opens_gate(&self) -> bool {
        matches!(self, Self::Ended(..) | Self::Claimed(..))
    }
}

impl Worker {
    /// A first delivery with the task's words: the claim, and meanwhile the
    /// attempt's directory, session and first model request (see the
    /// module doc).
    pub(super) async fn handle_early(&self, delivery: Arc<dyn Delivery>, msg: TaskMessage, queued: Task) {
        let start = Start { fresh: true, stream_notice: msg.stream_notice };
        // The directory is opened now and filled (workspace, workbench)
        // while the claim commits: the first request needs neither.
        match self.open_attempt(&msg, 1, Fill::Later).await {
            Ok((cached, dir)) if !cached.1.mcp_servers.is_empty() => {
                self.claim_before_programs(delivery, &queued, (cached, dir), start).await
            }
            opened => self.run_beside_claim(delivery, &queued, opened, start).await,
        }
    }

    /// A job with programs to start (MCP servers): the claim first, the
    /// directory filled meanwhile, then the run.
    async fn claim_before_programs(
        &self,
        delivery: Arc<dyn Delivery>,
        queued: &Task,
        (cached, dir): (CachedJob, TaskDir),
        start: Start,
    ) {
        let attempt = 1;
        let none = EndOffer::default();
        let (claim, filled) = tokio::join!(self.claim(delivery.as_ref(), attempt, &none), dir.filler.fill());
        let opened: Opened = Ok((cached, dir));
        let Some((task, _)) = self.claimed(delivery.as_ref(), claim.map(|(claim, _)| claim)).await else {
            return self.discard(queued.job_id, Some(opened)).await;
        };
        let cancel = CancellationToken::new();
        let running = self.started(&task, attempt, delivery.clone(), &cancel);
        let (result, held) = match filled {
            Ok(()) => self.execute(queued, attempt, opened, start, cancel.clone(), None).await,
            Err(e) => {
                self.discard(queued.job_id, Some(opened)).await;
                (Err((Failure::store("preparing the working directory", e), Usage::default())), Batch::default())
            }
        };
        self.settle(&task, attempt, result, held, &cancel, running, delivery, &Default::default()).await;
    }

    /// The run beside its claim: the claim is made once the run needs it,
    /// and the session acts on nothing before the claim's verdict.
    async fn run_beside_claim(&self, delivery: Arc<dyn Delivery>, queued: &Task, opened: Opened, start: Start) {
        let attempt = 1;
        let began = std::time::Instant::now();
        let cancel = CancellationToken::new();
        let (decided, decision) = tokio::sync::watch::channel(None::<bool>);
        let asked = Arc::new(tokio::sync::Notify::new());
        let gate = flower_agent::Gate { decision, asked: asked.clone() };
        let early = Early { gate, offer: EndOffer::default(), notice: Default::default() };
        let filler = opened.as_ref().ok().map(|(_, dir)| dir.filler.clone());
        let claim_side = async {
            // The claim is made once the run needs it (its session asks the
            // gate: a tool call, a write), once it offers its end, once it
            // is over — or after CLAIM_AFTER: a fast final answer is then
            // claimed and ended in one write.
            tokio::select! {
                _ = asked.notified() => {}
                _ = tokio::time::sleep(CLAIM_AFTER) => {}
            }
            // The directory fills while the claim commits — unless the run
            // already offered its end: a first-turn final answer ran no
            // tool, and nothing reads the directory after it.
            let fill = async {
                match &filler {
                    Some(f) if !early.offer.is_made() => f.fill().await,
                    _ => Ok(()),
                }
            };
            let (claim, filled) = tokio::join!(self.claim(delivery.as_ref(), attempt, &early.offer), fill);
            let verdict = self.verdict(&delivery, attempt, claim, filled, &cancel).await;
            if matches!(verdict, Verdict::Refused) {
                cancel.cancel();
            }
            let _ = decided.send(Some(verdict.opens_gate()));
            verdict
        };
        let run_side = async {
            // A session stopped at its gate releases its directory itself.
            let ran = self.execute(queued, attempt, opened, start, cancel.clone(), Some(&early)).await;
            // Over without asking (a failure before any write): claim now.
            early.gate.asked.notify_one();
            ran
        };
        match tokio::join!(claim_side, run_side) {
            (Verdict::Ended(claimed, end), _) => {
                let (ended, written) = *end;
                self.claimed_and_ended(&claimed, &ended, &written, &early.notice, began).await;
                let _ = delivery.ack().await;
            }
            (Verdict::Claimed(task, running), (result, held)) => {
                self.settle(&task, attempt, result, held, &cancel, running, delivery, &early.notice).await;
            }
            // The session stopped at its gate and released its directory.
            (Verdict::Unfilled(task, running, e), _) => {
                let failed = Err((Failure::store("preparing the working directory", e), Usage::default()));
                self.settle(&task, attempt, failed, Batch::default(), &cancel, running, delivery, &Default::default())
                    .await;
            }
            // The session stopped at its gate, before any write or tool (or
            // held its final answer), and released its directory.
            (Verdict::Refused, _) => {}
        }
    }

    /// What the claim (and the directory's filling beside it) decided for
    /// the run waiting at its gate; a claimed attempt starts running here.
    async fn verdict(
        &self,
        delivery: &Arc<dyn Delivery>,
        attempt: u32,
        claim: Result<Claimed, StoreError>,
        filled: Result<(), StoreError>,
        cancel: &CancellationToken,
    ) -> Verdict {
        match claim {
            // Claimed and ended in one write: the run's offered end.
            Ok((Claim::Claimed { task, mut events }, Some((ended, written)))) => {
                events.extend(written.events);
                Verdict::Ended(task, Box::new((ended, flower_store::Written { events, ..written })))
            }
            claim => match self.claimed(delivery.as_ref(), claim.map(|(claim, _)| claim)).await {
                None => Verdict::Refused,
                Some((task, _)) => {
                    let running = self.started(&task, attempt, delivery.clone(), cancel);
                    match filled {
                        Ok(()) => Verdict::Claimed(task, running),
                        Err(e) => Verdict::Unfilled(task, running, e),
                    }
                }
            },
        }
    }

    /// At the end of a run started before its claim: a final answer given
    /// before the claim decided, on a first turn that ran no tool, is
    /// offered to the claim, to end the task in its write. Asking the gate
    /// starts the claim (it takes the offer); the directory fills beside
    /// the claim, and the decision comes after both. Whether the claim
    /// refused the run: a session its claim refused acted on nothing, and
    /// there is nothing to keep.
    pub(super) async fn refused_by_claim(
        &self,
        early: &Early,
        task: &Task,
        attempt: u32,
        outcome: &Result<Outcome, AgentError>,
        held: &Batch,
        workbench: Workbench,
    ) -> bool {
        if workbench == Workbench::Untouched
            && early.gate.decision.borrow().is_none()
            && let Ok(Outcome::Answered { text, usage, .. }) = outcome
        {
            let outcome = TaskOutcome::Succeeded { report: text.clone() };
            let mut batch = held.clone();
            if let flower_store::rules::ClaimDecision::Take(claim) =
                flower_store::rules::claim(task, attempt, &self.opts.worker_id, now_ms())
            {
                self.stage_notice(&claim.task, attempt, &outcome, *usage, &mut batch, &early.notice, workbench);
            }
            let _ = early.offer.offer(OfferedEnd { outcome, usage: *usage, batch });
        }
        !flower_agent::gate_opens(&early.gate).await
    }

    /// An attempt claimed and ended in one write: its events announced, its
    /// end's notice sent unless it went out while the write was staged.
    async fn claimed_and_ended(
        &self,
        claimed: &Task,
        ended: &Task,
        written: &flower_store::Written,
        notice: &AtomicBool,
        began: std::time::Instant,
    ) {
        let metrics = flower_agent::metrics::metrics();
        let namespace = self.namespace_of(claimed.job_id);
        metrics.task(&namespace, "started");
        metrics.dispatch.observe((now_ms() - claimed.created_at).max(0) as f64 / 1000.0);
        // From the delivery: the claim and the end are one write.
        metrics.task_duration.observe(began.elapsed().as_secs_f64());
        metrics
            .task(&namespace, if ended.state == flower_model::TaskState::Succeeded { "succeeded" } else { "failed" });
        // Only a first-turn final answer is offered to its claim: it ran
        // no tool, the workbench is as it found it.
        self.ended(ended, written, notice, Workbench::Untouched).await;
    }
}
