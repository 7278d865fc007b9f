//! A namespace's spending limits, as a job's model calls are checked against
//! them (docs/design.md, section 17): what the namespace's jobs spent today
//! and this month (UTC), each job's usage priced as its own budget prices it
//! (its spec's prices, else the built-in table; a job whose model has no
//! known price counts its tokens, not a cost).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flower_bus::Notifier;

use flower_model::access::{Limits, SpendLimit, day_of, month_start};
use flower_model::spec::{Budget, Price};
use flower_model::{JobId, Task, TaskId, now_ms};
use flower_store::{Spend, Store, StoreError};

/// A reading is reused this long: a namespace's spend is read at most this
/// often per job, and a raise is seen within it.
const FRESH: Duration = Duration::from_secs(1);

/// What a namespace's jobs spent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub tokens_today: u64,
    pub cost_today: f64,
    pub cost_this_month: f64,
}

impl Tally {
    /// Sum `rows` (from the first day of the month on), each job's usage at
    /// its price.
    pub fn of(rows: &[Spend], today: i64, price: impl Fn(JobId) -> Option<Price>) -> Tally {
        let mut t = Tally::default();
        for r in rows {
            let cost = price(r.job).map(|p| p.cost(&r.usage)).unwrap_or(0.0);
            if r.day >= today {
                t.tokens_today += r.usage.context_tokens() + r.usage.output_tokens;
                t.cost_today += cost;
            }
            t.cost_this_month += cost;
        }
        t
    }

    /// The first limit of `limits` this tally reaches: which, what was
    /// spent and the limit, as numbers of what it counts.
    pub fn over(&self, limits: &Limits) -> Option<(SpendLimit, f64, f64)> {
        SpendLimit::ALL.into_iter().find_map(|l| {
            let spent = match l {
                SpendLimit::CostPerDay => self.cost_today,
                SpendLimit::CostPerMonth => self.cost_this_month,
                SpendLimit::TokensPerDay => self.tokens_today as f64,
            };
            l.get(limits).filter(|max| spent >= *max).map(|max| (l, spent, max))
        })
    }
}

/// A namespace's limit reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Over {
    pub namespace: String,
    pub limit: SpendLimit,
    pub spent: f64,
    pub max: f64,
    pub tally: Tally,
    /// How long a job waits for a raise (the namespace's `wait`).
    pub wait: Duration,
}

impl Over {
    /// `namespace `team-a`'s daily cost budget spent: $1.0200 of $1.0000`.
    pub fn reason(&self) -> String {
        format!(
            "namespace `{}`'s {} spent: {} of {}",
            self.namespace,
            self.limit.words(),
            self.limit.amount(self.spent),
            self.limit.amount(self.max)
        )
    }
}

/// Prices kept by [`known_prices`]; past this it starts again empty (a
/// month's jobs are read again, once each).
const PRICES_KEPT: usize = 50_000;

/// Each job's price, read once per process from its spec (a job id names
/// one spec, whichever store it is read from): shared by the runs' checks,
/// the metrics and the namespace's status.
fn known_prices() -> &'static Mutex<HashMap<JobId, Option<Price>>> {
    static KNOWN: std::sync::OnceLock<Mutex<HashMap<JobId, Option<Price>>>> = std::sync::OnceLock::new();
    KNOWN.get_or_init(Mutex::default)
}

/// The tally of `namespace` now: its spend rows of this month, priced.
pub async fn tally(store: &dyn Store, namespace: &str) -> Result<Tally, StoreError> {
    let today = day_of(now_ms());
    let rows = store.spend(namespace, month_start(today)).await?;
    let mut jobs: Vec<JobId> = rows.iter().map(|r| r.job).collect();
    jobs.sort_unstable();
    jobs.dedup();
    // This tally's prices, whatever the shared cache drops meanwhile.
    let mut prices: HashMap<JobId, Option<Price>> = HashMap::with_capacity(jobs.len());
    let mut missing = Vec::new();
    {
        let known = known_prices().lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs {
            match known.get(&job) {
                Some(p) => {
                    prices.insert(job, *p);
                }
                None => missing.push(job),
            }
        }
    }
    for job in missing {
        let price = store.get_job(job).await.ok().and_then(|j| price_of(&j.spec));
        prices.insert(job, price);
        let mut known = known_prices().lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= PRICES_KEPT {
            known.clear();
        }
        known.insert(job, price);
    }
    Ok(Tally::of(&rows, today, |j| prices.get(&j).copied().flatten()))
}

/// The price a job's usage is counted at: its spec's model, priced by its budget.
fn price_of(spec: &serde_json::Value) -> Option<Price> {
    let model = spec.get("model")?.as_str()?;
    let budget: Budget =
        spec.pointer("/runtime/budget").and_then(|b| serde_json::from_value(b.clone()).ok()).unwrap_or_default();
    budget.price(model)
}

/// The namespaces' budgets as one process's jobs check them: one reading
/// per namespace shared by all its jobs, so a namespace is read at most
/// once per [`FRESH`] whatever the number of its jobs here.
#[derive(Clone)]
pub struct NamespaceBudgets {
    store: Arc<dyn Store>,
    each: Arc<Mutex<HashMap<String, Arc<NamespaceBudget>>>>,
}

impl NamespaceBudgets {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store, each: Arc::default() }
    }

    /// The budget of `namespace` (namespaces are few: made by an admin).
    pub fn get(&self, namespace: &str) -> Arc<NamespaceBudget> {
        let mut each = self.each.lock().unwrap_or_else(|p| p.into_inner());
        each.entry(namespace.to_string()).or_insert_with(|| NamespaceBudget::new(self.store.clone(), namespace)).clone()
    }
}

/// A namespace's limits as its jobs' checks see them.
pub struct NamespaceBudget {
    store: Arc<dyn Store>,
    namespace: String,
    last: Mutex<Option<(Instant, Option<Over>)>>,
    /// Whether the last reading found a task limit (`max_tasks`).
    limits_tasks: AtomicBool,
    /// This process's tasks held by that limit.
    held: Arc<crate::admission::HeldTasks>,
}

impl NamespaceBudget {
    fn new(store: Arc<dyn Store>, namespace: &str) -> Arc<Self> {
        let held = Arc::new(crate::admission::HeldTasks::new(store.clone(), namespace));
        Arc::new(Self {
            store,
            namespace: namespace.to_string(),
            last: Mutex::new(None),
            limits_tasks: AtomicBool::new(false),
            held,
        })
    }

    /// Whether the namespace limits its tasks, as last read (before its
    /// jobs' model calls, at most every [`FRESH`]): the tasks its jobs
    /// create then start held.
    pub fn limits_tasks(&self) -> bool {
        self.limits_tasks.load(Ordering::Relaxed)
    }

    /// Wait until the held `task` is admitted by the namespace's task
    /// limit; its row, queued ([`crate::admission`]).
    pub async fn admitted(&self, notifier: &Arc<dyn Notifier>, task: TaskId) -> Result<Task, StoreError> {
        self.held.admitted(notifier, task).await
    }

    /// The limit reached, if one is (a store error lets the call go,
    /// logged: a namespace's limit is not a reason to lose a job's work).
    pub async fn over(&self) -> Option<Over> {
        self.checked().await.unwrap_or_else(|e| {
            tracing::warn!(namespace = %self.namespace, error = %e, "the namespace's budget was not checked");
            None
        })
    }

    /// The limit reached, if one is, read at most every [`FRESH`] (a
    /// reading that failed is not kept).
    pub async fn checked(&self) -> Result<Option<Over>, StoreError> {
        if let Some((at, over)) = &*self.last.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < FRESH
        {
            return Ok(over.clone());
        }
        let over = self.read().await?;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), over.clone()));
        Ok(over)
    }

    /// Read again at the next check (after a raise).
    pub fn forget(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    async fn read(&self) -> Result<Option<Over>, StoreError> {
        let limits = self.store.namespace(&self.namespace).await?.limits;
        self.limits_tasks.store(limits.max_tasks.is_some(), Ordering::Relaxed);
        if !limits.limits_spend() {
            return Ok(None);
        }
        let tally = tally(self.store.as_ref(), &self.namespace).await?;
        Ok(tally.over(&limits).map(|(limit, spent, max)| Over {
            namespace: self.namespace.clone(),
            limit,
            spent,
            max,
            tally,
            wait: limits.raise_wait(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_model::Usage;

    #[test]
    fn a_tally_prices_each_job_and_names_the_first_limit_reached() {
        let (a, b) = (JobId::random(), JobId::random());
        let mtok = Usage { input_tokens: 1_000_000, ..Default::default() };
        let rows = vec![
            Spend { day: 9, job: a, usage: mtok },
            Spend { day: 10, job: a, usage: mtok },
            Spend { day: 10, job: b, usage: mtok },
        ];
        let price = |j: JobId| {
            (j == a).then_some(Price {
                input: 3.0,
                output: 15.0,
                cache_write_5m: 3.75,
                cache_write_1h: 6.0,
                cache_read: 0.3,
            })
        };
        let t = Tally::of(&rows, 10, price);
        assert_eq!(t.tokens_today, 2_000_000, "b's tokens count though it has no price");
        assert!((t.cost_today - 3.0).abs() < 1e-9 && (t.cost_this_month - 6.0).abs() < 1e-9, "{t:?}");
        assert_eq!(t.over(&Limits::default()), None);
        let monthly = Limits { cost_per_month_usd: Some(5.0), cost_per_day_usd: Some(4.0), ..Default::default() };
        assert_eq!(t.over(&monthly).map(|o| o.0), Some(SpendLimit::CostPerMonth));
        let tokens = Limits { tokens_per_day: Some(2_000_000), ..Default::default() };
        assert_eq!(t.over(&tokens).map(|o| o.0), Some(SpendLimit::TokensPerDay), "reaching the limit is over it");
    }

    #[test]
    fn a_jobs_price_comes_from_its_spec() {
        let spec = serde_json::json!({"model": "claude-sonnet-4-5", "runtime": {"budget": {}}});
        assert_eq!(price_of(&spec).map(|p| p.input), Some(3.0));
        let own = serde_json::json!({"model": "local", "runtime": {"budget": {"prices": {"local": {
            "input": 1.0, "output": 2.0, "cache_write_5m": 1.0, "cache_write_1h": 1.0, "cache_read": 0.1}}}}});
        assert_eq!(price_of(&own).map(|p| p.output), Some(2.0));
        assert_eq!(price_of(&serde_json::json!({"model": "unknown-model"})), None);
    }
}
