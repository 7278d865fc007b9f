//! A job's budget, checked before every model call of every session: tokens,
//! cost (priced from the spec's table, else the built-in one) and a deadline.
//! A deadline passed ends the session with the reason. Tokens or cost spent
//! go to the job's [`BudgetGate`], when it has one: the user is asked to
//! raise the budget or stop (the job waits meanwhile, holding no model call),
//! and a raise lets the session go on. Nothing stored is lost either way.
//! With a gate, the job's namespace's spending limits are checked too
//! ([`crate::spend`]): reached, they go to the gate the same way.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use flower_model::spec::Budget;
use flower_model::{JobId, SessionId, now_ms};
use flower_store::Store;

/// What was spent when a budget ran out.
#[derive(Clone, Debug, PartialEq)]
pub struct Spent {
    /// `cost budget spent: $1.0200 of $1.0000`, …
    pub reason: String,
    pub tokens: u64,
    /// Priced at the job's model, when a price is known.
    pub cost_usd: Option<f64>,
    /// When it is the job's namespace's limit that was reached (then
    /// `tokens` and `cost_usd` are the job's own).
    pub namespace: Option<crate::spend::Over>,
}

/// The answer of a [`BudgetGate`].
#[derive(Clone, Debug, PartialEq)]
pub enum Raise {
    /// Go on with this budget.
    To(Budget),
    /// Stop here: the session ends on its budget.
    Stop,
    /// The run is stopping (cancelled, or handing the job over) while it waited.
    Interrupted,
}

/// Who decides whether a job whose budget ran out goes on.
#[async_trait]
pub trait BudgetGate: Send + Sync {
    /// `budget` is spent in `session`: ask, and wait for the answer.
    async fn ask(&self, session: SessionId, spent: &Spent, budget: &Budget) -> Raise;
}

/// What a check before a model call decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Go,
    /// End the session on its budget, with this reason.
    Stop(String),
    /// The run is stopping.
    Interrupted,
}

pub struct JobLimits {
    store: Arc<dyn Store>,
    job: JobId,
    /// The budget in force: the spec's, as raised since.
    budget: Mutex<Budget>,
    /// The job's model, whose price applies to its usage.
    model: String,
    /// When the job was submitted (ms).
    submitted: i64,
    gate: Option<Arc<dyn BudgetGate>>,
    namespace: Option<Arc<crate::spend::NamespaceBudget>>,
}

impl JobLimits {
    /// `None` when the budget sets no limit.
    pub fn new(
        store: Arc<dyn Store>,
        job: JobId,
        budget: &Budget,
        model: &str,
        submitted: i64,
        gate: Option<Arc<dyn BudgetGate>>,
    ) -> Option<Arc<Self>> {
        let any = budget.max_tokens.is_some() || budget.max_cost_usd.is_some() || budget.deadline.is_some();
        any.then(|| Arc::new(Self::of(store, job, budget, model, submitted, gate, None)))
    }

    fn of(
        store: Arc<dyn Store>,
        job: JobId,
        budget: &Budget,
        model: &str,
        submitted: i64,
        gate: Option<Arc<dyn BudgetGate>>,
        namespace: Option<Arc<crate::spend::NamespaceBudget>>,
    ) -> Self {
        Self { store, job, budget: Mutex::new(budget.clone()), model: model.to_string(), submitted, gate, namespace }
    }

    /// A job's limits with its namespace's spending limits checked too
    /// (through `gate`, which a namespace's limit always goes to).
    pub fn with_namespace(
        store: Arc<dyn Store>,
        job: JobId,
        budget: &Budget,
        model: &str,
        submitted: i64,
        gate: Arc<dyn BudgetGate>,
        namespace: Arc<crate::spend::NamespaceBudget>,
    ) -> Arc<Self> {
        Arc::new(Self::of(store, job, budget, model, submitted, Some(gate), Some(namespace)))
    }

    /// The budget in force.
    pub fn budget(&self) -> Budget {
        self.budget.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether `session` may make its next model call: the deadline, then
    /// tokens and cost; spent ones go to the gate, which may raise them.
    pub async fn check(&self, session: SessionId) -> Verdict {
        loop {
            let budget = self.budget();
            let spent = match self.spent(&budget).await {
                Ok(None) => match self.namespace_over(&budget).await {
                    None => return Verdict::Go,
                    Some(spent) => spent,
                },
                Ok(Some(spent)) => spent,
                Err(deadline) => return Verdict::Stop(deadline),
            };
            let Some(gate) = &self.gate else { return Verdict::Stop(spent.reason) };
            match gate.ask(session, &spent, &budget).await {
                Raise::To(raised) => {
                    tracing::info!(job = %self.job, "budget raised");
                    *self.budget.lock().unwrap_or_else(|p| p.into_inner()) = raised;
                    if let Some(ns) = &self.namespace {
                        ns.forget();
                    }
                }
                Raise::Stop => return Verdict::Stop(spent.reason),
                Raise::Interrupted => return Verdict::Interrupted,
            }
        }
    }

    /// The namespace's limit reached, as what the job spent.
    async fn namespace_over(&self, budget: &Budget) -> Option<Spent> {
        let over = self.namespace.as_ref()?.over().await?;
        let (tokens, cost_usd) = match self.store.get_job(self.job).await {
            Ok(j) => self.used(budget, &j.usage),
            Err(_) => (0, None),
        };
        Some(Spent { reason: over.reason(), tokens, cost_usd, namespace: Some(over) })
    }

    /// The tokens in `usage`, and its cost at the job's model's price.
    fn used(&self, budget: &Budget, usage: &flower_model::Usage) -> (u64, Option<f64>) {
        (usage.context_tokens() + usage.output_tokens, budget.price(&self.model).map(|p| p.cost(usage)))
    }

    /// Why the job must stop now, if it must (no gate asked).
    pub async fn exceeded(&self) -> Option<String> {
        match self.spent(&self.budget()).await {
            Ok(None) => None,
            Ok(Some(spent)) => Some(spent.reason),
            Err(deadline) => Some(deadline),
        }
    }

    /// `Err` when the deadline passed; what was spent when tokens or cost ran out.
    async fn spent(&self, budget: &Budget) -> Result<Option<Spent>, String> {
        if let Some(d) = budget.deadline
            && now_ms() - self.submitted > d.as_millis() as i64
        {
            return Err(format!("deadline of {} ms passed", d.as_millis()));
        }
        if budget.max_tokens.is_none() && budget.max_cost_usd.is_none() {
            return Ok(None);
        }
        let usage = match self.store.get_job(self.job).await {
            Ok(j) => j.usage,
            Err(e) => {
                tracing::warn!(error = %e, "budget not checked");
                return Ok(None);
            }
        };
        let (tokens, cost_usd) = self.used(budget, &usage);
        let spent = |reason| Ok(Some(Spent { reason, tokens, cost_usd, namespace: None }));
        if let Some(max) = budget.max_tokens
            && tokens >= max
        {
            return spent(format!("token budget spent: {tokens} of {max} tokens"));
        }
        if let (Some(max), Some(cost)) = (budget.max_cost_usd, cost_usd)
            && cost >= max
        {
            return spent(format!("cost budget spent: ${cost:.4} of ${max:.4}"));
        }
        Ok(None)
    }
}
