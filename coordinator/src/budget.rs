//! A job whose tokens or cost ran out asks its user to raise the budget or
//! stop (docs/design.md, section 10): the job waits in `waiting_for_budget`
//! (no model call, no worker slot), the question goes through the ask path
//! (`Answer`, `flower answer`, the console, MCP), and the answer is the
//! decision — option 1 doubles the limits that ran out, a number is the new
//! limit, option 2, anything else or no answer within `runtime.budget.wait`
//! stops the job (`failed`, the budget as its reason). Raises are read back
//! from the job's events, so a resumed run goes on with the budget as raised
//! and keeps waiting on a question asked before it.
//!
//! A namespace's spending limit reached (section 17) asks the same way
//! (`namespace-budget-cost-day-1`, …), for the namespace's `wait`: only an
//! operator of the namespace may answer, and the application stores the
//! raise on the namespace (option 1 doubles the limit, a number is its new
//! value), so every job waiting on it goes on; a limit raised otherwise
//! answers the question for them.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

use flower_agent::limits::{BudgetGate, Raise, Spent};
use flower_agent::spend::{NamespaceBudget, NamespaceBudgets, Over};
use flower_model::access::{Limits, SpendLimit};
use flower_model::spec::{AskOptions, Budget};
use flower_model::{EventKind, JobId, JobState, SessionId};
use flower_store::{Batch, Store, StoreError};

use crate::tools::ask::{Asked, Asker};

/// The budget's questions are `budget-tokens-1`, `budget-cost-2`, …: which
/// limit ran out, and their number.
const PREFIX: &str = "budget-";

/// Which limit a [`Spent`] says ran out: `tokens` or `cost`.
fn limit_of(spent: &Spent) -> &'static str {
    if spent.reason.starts_with("token") { "tokens" } else { "cost" }
}

/// The options of the budget's question.
pub fn options() -> Vec<String> {
    vec!["Raise it: double the limit that ran out".into(), "Stop here".into()]
}

/// The first number in an answer's words (`raise it to $5`, `50,000 tokens`).
fn number_in(text: &str) -> Option<f64> {
    let number: String = text
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '_' || *c == ',')
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    number.trim_end_matches('.').parse().ok().filter(|v: &f64| v.is_finite())
}

/// The budget after the answer `text` / `option` to a question about
/// `budget`, or `None` to stop.
pub fn decide(budget: &Budget, spent: &Spent, text: &str, option: Option<u32>) -> Option<Budget> {
    let mut raised = budget.clone();
    let tokens_ran_out = limit_of(spent) == "tokens";
    match option {
        Some(1) if tokens_ran_out => {
            raised.max_tokens = budget.max_tokens.map(|t| t.saturating_mul(2));
            return Some(raised);
        }
        Some(1) => {
            raised.max_cost_usd = budget.max_cost_usd.map(|c| c * 2.0);
            return Some(raised);
        }
        Some(_) => return None,
        None => {}
    }
    // Words: the first number in them is the new limit of what ran out.
    let value = number_in(text)?;
    if tokens_ran_out {
        let tokens = value as u64;
        (tokens > spent.tokens).then(|| {
            raised.max_tokens = Some(tokens);
            raised
        })
    } else {
        let more = spent.cost_usd.is_none_or(|c| value > c);
        more.then(|| {
            raised.max_cost_usd = Some(value);
            raised
        })
    }
}

/// The namespace's questions: `namespace-budget-cost-day-1`, ….
pub const NAMESPACE_PREFIX: &str = "namespace-budget-";

/// The namespace's limit a question is about, when it is one of the
/// namespace's budget questions.
pub fn namespace_question(id: &str) -> Option<SpendLimit> {
    let (limit, _) = id.strip_prefix(NAMESPACE_PREFIX)?.rsplit_once('-')?;
    SpendLimit::parse(limit)
}

/// The options of the namespace's question.
pub fn namespace_options() -> Vec<String> {
    vec!["Raise it: double the namespace's limit that ran out".into(), "Stop this job here".into()]
}

/// A namespace's limits after an operator's answer to a question about
/// `limit`: option 1 doubles it, a number in the words above what it was is
/// its new value; `None`: no raise.
pub fn raise_namespace(limits: &Limits, limit: SpendLimit, text: &str, option: Option<u32>) -> Option<Limits> {
    let current = limit.get(limits)?;
    let value = match option {
        Some(1) => current * 2.0,
        Some(_) => return None,
        None => number_in(text).filter(|v| *v > current)?,
    };
    Some(limit.set(limits, value))
}

/// An answer's words and chosen option.
type Answer = (String, Option<u32>);

/// The job's questions whose ids start with `prefix`, in order, each with
/// its first answer.
async fn questions(store: &dyn Store, job: JobId, prefix: &str) -> Result<Vec<(String, Option<Answer>)>, StoreError> {
    let mut asked: Vec<(String, Option<Answer>)> = Vec::new();
    flower_store::scan_events(store, job, 0, |e| match &e.kind {
        EventKind::QuestionAsked { id, .. } if id.starts_with(prefix) => asked.push((id.clone(), None)),
        EventKind::QuestionAnswered { id, answer, option, .. } => {
            if let Some((_, a)) = asked.iter_mut().find(|(q, a)| q == id && a.is_none()) {
                *a = Some((answer.clone(), *option));
            }
        }
        _ => {}
    })
    .await?;
    Ok(asked)
}

/// How many questions `asked` holds, and the one still open, if any.
fn count_open(asked: &[(String, Option<Answer>)]) -> (u32, Option<String>) {
    (asked.len() as u32, asked.iter().find(|(_, a)| a.is_none()).map(|(id, _)| id.clone()))
}

/// What the job's events say about the budget's questions: the budget as
/// raised by their answers, and the question still open, if any.
pub async fn replay(store: &dyn Store, job: JobId, base: &Budget) -> Result<(Budget, u32, Option<String>), StoreError> {
    let asked = questions(store, job, PREFIX).await?;
    let mut budget = base.clone();
    let mut open = None;
    for (id, answer) in &asked {
        match answer {
            Some((text, option)) => {
                // Which limit ran out is in the id; the spent amounts only
                // bound a number given in words, and a replayed raise was
                // accepted when it was given.
                let kind = id.strip_prefix(PREFIX).and_then(|r| r.split('-').next()).unwrap_or("cost");
                let spent = Spent { reason: kind.to_string(), tokens: 0, cost_usd: None, namespace: None };
                if let Some(raised) = decide(&budget, &spent, text, *option) {
                    budget = raised;
                }
            }
            None => open = Some(id.clone()),
        }
    }
    Ok((budget, asked.len() as u32, open))
}

/// The job's [`BudgetGate`]: the ask path, waiting in `waiting_for_budget`.
pub struct BudgetAsk {
    asker: Asker,
    store: Arc<dyn Store>,
    job: JobId,
    stop: crate::stop::Stop,
    /// The process's readings of the namespaces' budgets.
    budgets: NamespaceBudgets,
}

impl BudgetAsk {
    /// The asker's timeout is the job's `runtime.budget.wait` (zero: the
    /// job's own budget ends it at once, unasked).
    pub fn new(
        asker: Asker,
        store: Arc<dyn Store>,
        job: JobId,
        stop: crate::stop::Stop,
        budgets: NamespaceBudgets,
    ) -> Self {
        Self { asker: asker.waiting_in(JobState::WaitingForBudget), store, job, stop, budgets }
    }

    /// The ask options of the budget's question: `wait`, and no count limit.
    pub fn ask_options(wait: std::time::Duration) -> AskOptions {
        AskOptions { timeout: wait, max_asks: u32::MAX }
    }
}

fn question(spent: &Spent, budget: &Budget) -> String {
    let cost = spent.cost_usd.map(|c| format!(" (${c:.4})")).unwrap_or_default();
    let limits = [budget.max_tokens.map(|t| format!("{t} tokens")), budget.max_cost_usd.map(|c| format!("${c:.4}"))]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" and ");
    format!(
        "The job's {}: it has spent {} tokens{cost} of its budget of {limits}. Raise the budget, or stop here? \
         (Option 1 doubles the limit that ran out; a number in words is the new limit; option 2 stops the job, \
         keeping what it made.)",
        spent.reason, spent.tokens
    )
}

fn namespace_question_text(spent: &Spent, over: &Over) -> String {
    let cost = spent.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default();
    format!(
        "The {} (this job: {} tokens{cost}). Raise the namespace's budget, or stop this job here? (An operator of \
         the namespace answers: option 1 doubles the limit; a number in words is the new limit; option 2 stops the \
         job, keeping what it made. Without an answer within {} the job stops.)",
        over.reason(),
        spent.tokens,
        humantime::format_duration(over.wait)
    )
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a namespace's question is answered when its limit was raised
/// otherwise (the limits set, another job's question answered).
pub const RAISED_ELSEWHERE: &str = "the namespace's budget was raised";

/// Answers question `id` once the namespace's spend is under its limits
/// again (read through the process's shared reading of the namespace).
async fn answer_when_raised(store: Arc<dyn Store>, budget: Arc<NamespaceBudget>, job: JobId, id: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(None) = budget.checked().await {
            let kind =
                EventKind::QuestionAnswered { id, answer: RAISED_ELSEWHERE.into(), option: None, by: "limits".into() };
            if let Err(e) = store.append(Batch { events: vec![(job, kind)], ..Default::default() }).await {
                tracing::warn!(job = %job, error = %e, "a raise of the namespace's budget was not noted");
            }
            return;
        }
    }
}

impl BudgetAsk {
    /// The namespace's limit is reached: ask its operators, for its `wait`.
    async fn ask_namespace(&self, session: SessionId, spent: &Spent, over: &Over) -> Raise {
        if over.wait.is_zero() {
            return Raise::Stop;
        }
        let id = match questions(self.store.as_ref(), self.job, NAMESPACE_PREFIX).await.map(|q| count_open(&q)) {
            Ok((_, Some(open))) => open,
            Ok((n, None)) => format!("{NAMESPACE_PREFIX}{}-{}", over.limit.as_str(), n + 1),
            Err(e) => {
                tracing::warn!(job = %self.job, error = %e, "the namespace's question could not be read; stopping");
                return Raise::Stop;
            }
        };
        let budget = self.budgets.get(&over.namespace);
        let watch = tokio::spawn(answer_when_raised(self.store.clone(), budget, self.job, id.clone()));
        let _watch = AbortOnDrop(watch);
        let asker = self.asker.clone().timed(over.wait);
        let text = namespace_question_text(spent, over);
        match asker.ask(self.job, session, &id, &text, &namespace_options(), self.stop.token()).await {
            // The application stored the raise (or the limits were raised
            // otherwise): the next check reads them.
            Ok(Asked::Answer { by, .. }) if by == "limits" => Raise::To(Budget::default()),
            Ok(Asked::Answer { text, option, by }) if by == "user" => {
                let raised = option == Some(1) || (option.is_none() && number_in(&text).is_some());
                if raised { Raise::To(Budget::default()) } else { Raise::Stop }
            }
            Ok(Asked::Answer { .. }) => Raise::Stop,
            Ok(Asked::Cancelled | Asked::HandingOver) => Raise::Interrupted,
            Err(e) => {
                tracing::warn!(job = %self.job, error = %e, "the namespace's question failed; stopping");
                Raise::Stop
            }
        }
    }
}

#[async_trait]
impl BudgetGate for BudgetAsk {
    async fn ask(&self, session: SessionId, spent: &Spent, budget: &Budget) -> Raise {
        if let Some(over) = &spent.namespace {
            return match self.ask_namespace(session, spent, over).await {
                // The job's own budget is as it was.
                Raise::To(_) => Raise::To(budget.clone()),
                other => other,
            };
        }
        if self.asker.options().timeout.is_zero() {
            return Raise::Stop;
        }
        let id = match replay(self.store.as_ref(), self.job, budget).await {
            Ok((_, _, Some(open))) => open,
            Ok((_, n, None)) => format!("{PREFIX}{}-{}", limit_of(spent), n + 1),
            Err(e) => {
                tracing::warn!(job = %self.job, error = %e, "the budget's question could not be read; stopping");
                return Raise::Stop;
            }
        };
        let asked =
            self.asker.ask(self.job, session, &id, &question(spent, budget), &options(), self.stop.token()).await;
        match asked {
            Ok(Asked::Answer { text, option, .. }) => match decide(budget, spent, &text, option) {
                Some(raised) => Raise::To(raised),
                None => Raise::Stop,
            },
            Ok(Asked::Cancelled | Asked::HandingOver) => Raise::Interrupted,
            Err(e) => {
                tracing::warn!(job = %self.job, error = %e, "the budget's question failed; stopping");
                Raise::Stop
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(reason: &str, tokens: u64, cost: Option<f64>) -> Spent {
        Spent { reason: reason.into(), tokens, cost_usd: cost, namespace: None }
    }

    #[test]
    fn an_operators_answer_raises_the_namespaces_limit() {
        let limits = Limits { cost_per_day_usd: Some(1.0), tokens_per_day: Some(1000), ..Default::default() };
        let day = SpendLimit::CostPerDay;
        assert_eq!(raise_namespace(&limits, day, "", Some(1)).unwrap().cost_per_day_usd, Some(2.0));
        assert_eq!(raise_namespace(&limits, day, "make it $3.50", None).unwrap().cost_per_day_usd, Some(3.5));
        assert_eq!(raise_namespace(&limits, day, "0.5", None), None, "below the limit: not a raise");
        assert_eq!(raise_namespace(&limits, day, "", Some(2)), None);
        assert_eq!(raise_namespace(&limits, SpendLimit::CostPerMonth, "", Some(1)), None, "no such limit set");
        let tokens = raise_namespace(&limits, SpendLimit::TokensPerDay, "5,000", None).unwrap();
        assert_eq!((tokens.tokens_per_day, tokens.cost_per_day_usd), (Some(5000), Some(1.0)));
        assert_eq!(namespace_question("namespace-budget-cost-day-3"), Some(day));
        assert_eq!(namespace_question("namespace-budget-tokens-day-12"), Some(SpendLimit::TokensPerDay));
        assert_eq!(namespace_question("budget-cost-1"), None);
    }

    #[test]
    fn an_answer_raises_or_stops() {
        let b = Budget { max_tokens: Some(1000), max_cost_usd: Some(1.0), ..Default::default() };
        let cost = spent("cost budget spent: $1.02 of $1.00", 900, Some(1.02));
        let doubled = decide(&b, &cost, "", Some(1)).unwrap();
        assert_eq!((doubled.max_tokens, doubled.max_cost_usd), (Some(1000), Some(2.0)), "the limit that ran out");
        assert_eq!(decide(&b, &cost, "", Some(2)), None);
        assert_eq!(decide(&b, &cost, "raise it to $5", None).unwrap().max_cost_usd, Some(5.0));
        assert_eq!(decide(&b, &cost, "1", None), None, "below what is spent: not a raise");
        assert_eq!(decide(&b, &cost, "no answer", None), None);
        assert_eq!(decide(&b, &cost, "stop", None), None);
        let tokens = spent("token budget spent: 1000 of 1000 tokens", 1000, None);
        assert_eq!(decide(&b, &tokens, "go to 50,000 tokens", None).unwrap().max_tokens, Some(50_000));
        assert_eq!(decide(&b, &tokens, "", Some(1)).unwrap().max_tokens, Some(2000));
        assert_eq!(decide(&b, &tokens, "50000", None).unwrap().max_cost_usd, Some(1.0), "cost untouched");
    }
}
