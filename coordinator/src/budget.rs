//! A job whose tokens or cost ran out asks its user to raise the budget or
//! stop (docs/design.md, section 10): the job waits in `waiting_for_budget`
//! (no model call, no worker slot), the question goes through the ask path
//! (`Answer`, `flower answer`, the console, MCP), and the answer is the
//! decision — option 1 doubles the limits that ran out, a number is the new
//! limit, option 2, anything else or no answer within `runtime.budget.wait`
//! stops the job (`failed`, the budget as its reason). Raises are read back
//! from the job's events, so a resumed run goes on with the budget as raised
//! and keeps waiting on a question asked before it.

use async_trait::async_trait;
use flower_agent::limits::{BudgetGate, Raise, Spent};
use flower_model::spec::{AskOptions, Budget};
use flower_model::{EventKind, JobId, JobState, SessionId};
use flower_store::{Store, StoreError};

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
    let number: String = text
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '_' || *c == ',')
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    let value: f64 = number.trim_end_matches('.').parse().ok()?;
    if tokens_ran_out {
        let tokens = value as u64;
        (tokens > spent.tokens).then(|| {
            raised.max_tokens = Some(tokens);
            raised
        })
    } else {
        let more = spent.cost_usd.is_none_or(|c| value > c);
        (value.is_finite() && more).then(|| {
            raised.max_cost_usd = Some(value);
            raised
        })
    }
}

/// An answer's words and chosen option.
type Answer = (String, Option<u32>);

/// What the job's events say about the budget's questions: the budget as
/// raised by their answers, and the question still open, if any.
pub async fn replay(store: &dyn Store, job: JobId, base: &Budget) -> Result<(Budget, u32, Option<String>), StoreError> {
    let mut asked: Vec<(String, Option<Answer>)> = Vec::new();
    flower_store::scan_events(store, job, 0, |e| match &e.kind {
        EventKind::QuestionAsked { id, .. } if id.starts_with(PREFIX) => asked.push((id.clone(), None)),
        EventKind::QuestionAnswered { id, answer, option, .. } => {
            if let Some((_, a)) = asked.iter_mut().find(|(q, a)| q == id && a.is_none()) {
                *a = Some((answer.clone(), *option));
            }
        }
        _ => {}
    })
    .await?;
    let mut budget = base.clone();
    let mut open = None;
    for (id, answer) in &asked {
        match answer {
            Some((text, option)) => {
                // Which limit ran out is in the id; the spent amounts only
                // bound a number given in words, and a replayed raise was
                // accepted when it was given.
                let kind = id.strip_prefix(PREFIX).and_then(|r| r.split('-').next()).unwrap_or("cost");
                let spent = Spent { reason: kind.to_string(), tokens: 0, cost_usd: None };
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
    store: std::sync::Arc<dyn Store>,
    job: JobId,
    stop: crate::stop::Stop,
}

impl BudgetAsk {
    pub fn new(asker: Asker, store: std::sync::Arc<dyn Store>, job: JobId, stop: crate::stop::Stop) -> Self {
        Self { asker: asker.waiting_in(JobState::WaitingForBudget), store, job, stop }
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

#[async_trait]
impl BudgetGate for BudgetAsk {
    async fn ask(&self, session: SessionId, spent: &Spent, budget: &Budget) -> Raise {
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
        Spent { reason: reason.into(), tokens, cost_usd: cost }
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
