//! A job's budget, checked before every model call of every session: tokens,
//! cost (priced from the spec's table, else the built-in one) and a deadline.
//! Crossing one ends the session with the reason; nothing stored is lost.

use std::sync::Arc;

use flower_model::spec::Budget;
use flower_model::{JobId, now_ms};
use flower_store::Store;

pub struct JobLimits {
    store: Arc<dyn Store>,
    job: JobId,
    budget: Budget,
    /// The job's model, whose price applies to its usage.
    model: String,
    /// When the job was submitted (ms).
    submitted: i64,
}

impl JobLimits {
    /// `None` when the budget sets no limit.
    pub fn new(store: Arc<dyn Store>, job: JobId, budget: &Budget, model: &str, submitted: i64) -> Option<Arc<Self>> {
        let any = budget.max_tokens.is_some() || budget.max_cost_usd.is_some() || budget.deadline.is_some();
        any.then(|| Arc::new(Self { store, job, budget: budget.clone(), model: model.to_string(), submitted }))
    }

    /// Why the job must stop now, if it must.
    pub async fn exceeded(&self) -> Option<String> {
        if let Some(d) = self.budget.deadline
            && now_ms() - self.submitted > d.as_millis() as i64
        {
            return Some(format!("deadline of {} ms passed", d.as_millis()));
        }
        if self.budget.max_tokens.is_none() && self.budget.max_cost_usd.is_none() {
            return None;
        }
        let usage = match self.store.get_job(self.job).await {
            Ok(j) => j.usage,
            Err(e) => {
                tracing::warn!(error = %e, "budget not checked");
                return None;
            }
        };
        let tokens = usage.context_tokens() + usage.output_tokens;
        if let Some(max) = self.budget.max_tokens
            && tokens >= max
        {
            return Some(format!("token budget spent: {tokens} of {max} tokens"));
        }
        if let Some(max) = self.budget.max_cost_usd
            && let Some(price) = self.budget.price(&self.model)
        {
            let cost = price.cost(&usage);
            if cost >= max {
                return Some(format!("cost budget spent: ${cost:.4} of ${max:.4}"));
            }
        }
        None
    }
}
