//! The process's Prometheus series: one registry per process, shared by
//! whatever the process runs (a coordinator's owner and dispatch, a worker's
//! task loop, every model call). It knows no role: each series is recorded
//! where its event happens and stays at zero in a process that never has one.
//!
//! Labels are low-cardinality by rule: a state, an outcome, a provider's
//! configured name, a model, a token kind — never a job id or a task id.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use flower_model::Usage;
use flower_model::spec::Price;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

/// A job series' labels: its namespace (bounded: namespaces are made by an
/// admin; never a job id) and state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceStateLabel {
    pub namespace: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespacePeriodLabel {
    pub namespace: String,
    /// `day` or `month` (UTC).
    pub period: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceOutcomeLabel {
    pub namespace: String,
    pub outcome: &'static str,
}

/// A provider route (api|endpoint|key fingerprint|model: a few per
/// deployment, never a key).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

/// A route and one of its rate limits (requests, input tokens, output tokens).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLimitLabel {
    pub route: String,
    /// `requests`, `input_tokens` or `output_tokens`.
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelCallLabels {
    pub provider: String,
    pub model: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderModelLabels {
    pub provider: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// The `denial_kind`s a session's guards write: the delegate guard's
/// ([`crate::guards::DELEGATE_GUARD`]) and the worker's tools guard
/// (`flower_worker::tools::WORKER_TOOLS_GUARD`). Any other kind is counted as
/// `other`, so the label set stays fixed.
pub const DENIAL_KINDS: &[&str] = &[crate::guards::DELEGATE_GUARD, "worker_tools"];

/// The label a denial of `kind` is counted under.
pub fn denial_label(kind: &str) -> &'static str {
    DENIAL_KINDS.iter().copied().find(|k| *k == kind).unwrap_or("other")
}

/// What becomes of a dead letter's task (`flower_dead_letters_total{outcome}`).
pub const DEAD_LETTER_OUTCOMES: &[&str] = &["republished", "failed", "none"];

/// Every series a flower process exports.
pub struct Metrics {
    registry: Registry,
    /// Jobs by state, as the store counts them (set by whoever can ask the store).
    pub jobs: Family<NamespaceStateLabel, Gauge>,
    /// What each namespace's jobs spent this UTC day and month, in dollars
    /// (set, as `jobs`, from the store at each scrape).
    pub namespace_spend: Family<NamespacePeriodLabel, Gauge<f64, AtomicU64>>,
    /// Each namespace's cost limits, where set.
    pub namespace_budget: Family<NamespacePeriodLabel, Gauge<f64, AtomicU64>>,
    /// Tokens each namespace's jobs used this UTC day.
    pub namespace_tokens: Family<NamespaceLabel, Gauge>,
    /// A namespace's tasks not ended: `live` (queued or running), `held`.
    pub namespace_tasks: Family<NamespaceStateLabel, Gauge>,
    /// Task attempts by outcome: `started`, then `succeeded`, `failed`,
    /// `cancelled` or `retried` (a transient failure; the delivery comes back).
    pub tasks: Family<NamespaceOutcomeLabel, Counter>,
    /// Tasks a coordinator created and put on the queue (one per `Agent` call).
    pub tasks_queued: Counter,
    pub task_duration: Histogram,
    pub worker_slots: Gauge,
    pub worker_slots_busy: Gauge,
    pub model_calls: Family<ModelCallLabels, Counter>,
    pub model_call_duration: Histogram,
    /// Waits of model calls for their route's rate limits, by limit.
    pub quota_waits: Family<RouteLimitLabel, Counter>,
    pub quota_wait: Family<RouteLabel, Histogram, fn() -> Histogram>,
    pub quota_admitted: Family<RouteLabel, Counter>,
    pub quota_refused: Family<RouteLabel, Counter>,
    pub quota_waiting: Family<RouteLabel, Gauge>,
    pub quota_used: Family<RouteLimitLabel, Gauge<f64, AtomicU64>>,
    pub tokens: Family<KindLabel, Counter>,
    pub lease_takeovers: Counter,
    /// Task messages the queue gave up on, by what became of their task:
    /// `republished`, `failed`, or `none` (running, ended, or never committed).
    pub dead_letters: Family<OutcomeLabel, Counter>,
    /// Large tool results written to the workbench and replaced by a pointer.
    pub spills: Counter,
    /// Tool calls denied by a guard, by denial kind ([`denial_label`]).
    pub tool_denials: Family<KindLabel, Counter>,
    /// Pruning passes over a stored transcript fed back to a resumed session.
    pub prunes: Counter,
    /// Claims that found no task row yet and were made again (a task's
    /// message may reach a worker before its creator's first statement
    /// reaches the store).
    pub claims_early: Counter,
    /// Dollars spent on model calls, priced as the job's budget prices them
    /// (its `prices`, else the built-in table); models with no price add nothing.
    pub model_cost: Family<ProviderModelLabels, Counter<f64, AtomicU64>>,
    /// Messages of the workers' shared consumer not yet acknowledged (waiting
    /// plus delivered and in flight), as this worker last read them.
    pub queue_lag: Gauge,
    /// From a task's creation (the coordinator's `Agent` call) to its first
    /// attempt starting on a worker; measured by the worker, so across hosts
    /// it includes their clock difference.
    pub dispatch: Histogram,
}

/// Histogram buckets from 50 ms to about 7 h: model calls take seconds, task
/// attempts minutes to hours.
fn long_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.05, 2.5, 14)
}

impl Metrics {
    fn new() -> Self {
        let mut m = Self {
            jobs: Family::default(),
            namespace_spend: Family::default(),
            namespace_budget: Family::default(),
            namespace_tokens: Family::default(),
            namespace_tasks: Family::default(),
            tasks: Family::default(),
            tasks_queued: Counter::default(),
            task_duration: Histogram::new(long_buckets()),
            worker_slots: Gauge::default(),
            worker_slots_busy: Gauge::default(),
            model_calls: Family::default(),
            model_call_duration: Histogram::new(long_buckets()),
            quota_waits: Family::default(),
            quota_wait: Family::new_with_constructor(|| Histogram::new(long_buckets())),
            quota_admitted: Family::default(),
            quota_refused: Family::default(),
            quota_waiting: Family::default(),
            quota_used: Family::default(),
            tokens: Family::default(),
            lease_takeovers: Counter::default(),
            dead_letters: Family::default(),
            spills: Counter::default(),
            tool_denials: Family::default(),
            prunes: Counter::default(),
            claims_early: Counter::default(),
            model_cost: Family::default(),
            queue_lag: Gauge::default(),
            dispatch: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            registry: Registry::default(),
        };
        // Every outcome from the start: a rate over them sees zeros, not no series.
        for outcome in DEAD_LETTER_OUTCOMES {
            let _ = m.dead_letters.get_or_create(&OutcomeLabel { outcome });
        }
        // Counters are written with the `_total` suffix.
        let mut registry = Registry::default();
        m.register_jobs(&mut registry);
        m.register_workers(&mut registry);
        m.register_model_calls(&mut registry);
        m.register_context(&mut registry);
        m.registry = registry;
        m
    }

    /// A coordinator's series: jobs, the tasks it queues, its leases, dead letters.
    fn register_jobs(&self, registry: &mut Registry) {
        registry.register("flower_jobs", "Jobs by namespace and state, as stored", self.jobs.clone());
        registry.register(
            "flower_namespace_spend_usd",
            "What a namespace's jobs spent this UTC day or month, priced as their budgets price it",
            self.namespace_spend.clone(),
        );
        registry.register(
            "flower_namespace_budget_usd",
            "A namespace's cost limit per UTC day or month, where one is set",
            self.namespace_budget.clone(),
        );
        registry.register(
            "flower_namespace_tokens",
            "Tokens a namespace's jobs used this UTC day",
            self.namespace_tokens.clone(),
        );
        registry.register(
            "flower_namespace_tasks",
            "A namespace's tasks not ended: live (queued for a worker or running) or held by its task limit",
            self.namespace_tasks.clone(),
        );
        registry.register(
            "flower_tasks_queued",
            "Tasks this coordinator created and queued (one per Agent call)",
            self.tasks_queued.clone(),
        );
        registry.register(
            "flower_lease_takeovers",
            "Job leases taken by this coordinator (a new job's first owner, or a dead owner's successor)",
            self.lease_takeovers.clone(),
        );
        registry.register(
            "flower_dead_letters",
            "Task messages the queue gave up on, taken by this coordinator, by what became of their task",
            self.dead_letters.clone(),
        );
    }

    /// A worker's series: task attempts, slots, claims and its view of the queue.
    fn register_workers(&self, registry: &mut Registry) {
        registry.register(
            "flower_tasks",
            "Task attempts on this worker, by their job's namespace and outcome",
            self.tasks.clone(),
        );
        registry.register(
            "flower_task_duration_seconds",
            "Time a task attempt ran on this worker",
            self.task_duration.clone(),
        );
        registry.register("flower_worker_slots", "Tasks this worker runs at once", self.worker_slots.clone());
        registry.register("flower_worker_slots_busy", "Slots running a task now", self.worker_slots_busy.clone());
        registry.register(
            "flower_dispatch_seconds",
            "From a task's creation (the Agent call) to its first attempt starting",
            self.dispatch.clone(),
        );
        registry.register(
            "flower_claims_early",
            "Claims that found no task row yet (the message came before its creator's first statement) and were made again",
            self.claims_early.clone(),
        );
        registry.register(
            "flower_queue_lag_messages",
            "Task messages of the workers' consumer not yet acknowledged (pending plus in flight), as this worker sees them",
            self.queue_lag.clone(),
        );
    }

    /// Every model call's series: count, duration, tokens and cost.
    fn register_model_calls(&self, registry: &mut Registry) {
        registry.register(
            "flower_model_calls",
            "Model calls by provider, model and outcome (ok or error), retries inside a call included in it",
            self.model_calls.clone(),
        );
        registry.register(
            "flower_model_call_duration_seconds",
            "Time a model call took, retries included",
            self.model_call_duration.clone(),
        );
        registry.register(
            "flower_quota_waits",
            "Waits of this process's model calls for their route's rate limits (shared by every process), by route and the limit waited for",
            self.quota_waits.clone(),
        );
        registry.register(
            "flower_quota_wait_seconds",
            "How long a model call was told to wait for its route's turn (each wait), by route",
            self.quota_wait.clone(),
        );
        registry.register(
            "flower_quota_admitted",
            "Model calls of this process admitted by their route's rate limits, by route",
            self.quota_admitted.clone(),
        );
        registry.register(
            "flower_quota_refused",
            "Model calls of this process the provider refused for its rate limits (429 or 529), by route",
            self.quota_refused.clone(),
        );
        registry.register(
            "flower_quota_waiting",
            "Model calls of every process waiting for their route's turn now, by route (read from the store at each scrape)",
            self.quota_waiting.clone(),
        );
        registry.register(
            "flower_quota_used_ratio",
            "How much of each of a route's rate limits is used now (0: all of it free, 1: none left, above 1: in debt), by route and limit",
            self.quota_used.clone(),
        );
        registry.register(
            "flower_tokens",
            "Tokens reported by the provider, by kind (input, output, cache_read, cache_write)",
            self.tokens.clone(),
        );
        registry.register(
            "flower_model_cost_dollars",
            "Cost of model calls in US dollars by provider and model, at the job's prices (unpriced models add nothing)",
            self.model_cost.clone(),
        );
    }

    /// What the context layers do: spills, guards' denials, pruning passes.
    fn register_context(&self, registry: &mut Registry) {
        registry.register(
            "flower_spills",
            "Large tool results spilled to the workbench (replaced by a pointer and a head)",
            self.spills.clone(),
        );
        registry.register(
            "flower_tool_denials",
            "Tool calls denied by a guard, by denial kind (delegate_guard, worker_tools, other)",
            self.tool_denials.clone(),
        );
        registry.register(
            "flower_prunes",
            "Pruning passes over a stored transcript when a session resumes",
            self.prunes.clone(),
        );
    }

    /// Set the jobs gauge from the store's counts by namespace and state;
    /// the states of a namespace (and of `default`) with no job read 0.
    pub fn set_job_counts(&self, counts: &[(String, flower_model::JobState, u64)]) {
        use flower_model::JobState::*;
        let mut namespaces: Vec<&str> = counts.iter().map(|(ns, _, _)| ns.as_str()).collect();
        namespaces.push(flower_model::access::DEFAULT_NAMESPACE);
        namespaces.sort_unstable();
        namespaces.dedup();
        for namespace in namespaces {
            for state in [Queued, Running, WaitingForUser, WaitingForBudget, Succeeded, Failed, Cancelled] {
                let n: u64 = counts.iter().filter(|(ns, s, _)| ns == namespace && *s == state).map(|(_, _, n)| n).sum();
                let label = NamespaceStateLabel { namespace: namespace.to_string(), state: state.as_str() };
                self.jobs.get_or_create(&label).set(n as i64);
            }
        }
    }

    /// Set a namespace's spend and cost limits (as read from the store).
    pub fn set_namespace_spend(
        &self,
        namespace: &str,
        spent: &crate::spend::Tally,
        limits: &flower_model::access::Limits,
    ) {
        let label = |period| NamespacePeriodLabel { namespace: namespace.to_string(), period };
        self.namespace_spend.get_or_create(&label("day")).set(spent.cost_today);
        self.namespace_spend.get_or_create(&label("month")).set(spent.cost_this_month);
        self.namespace_tokens
            .get_or_create(&NamespaceLabel { namespace: namespace.to_string() })
            .set(spent.tokens_today as i64);
        for (period, limit) in [("day", limits.cost_per_day_usd), ("month", limits.cost_per_month_usd)] {
            match limit {
                Some(l) => {
                    self.namespace_budget.get_or_create(&label(period)).set(l);
                }
                None => {
                    self.namespace_budget.remove(&label(period));
                }
            }
        }
    }

    /// Set a namespace's live and held tasks (as read from the store).
    /// Each route's calls waiting and how much of each limit is used, at `now`.
    pub fn set_routes(&self, routes: &[(String, flower_model::quota::Route)], now: i64) {
        for (route, state) in routes {
            let label = RouteLabel { route: route.clone() };
            self.quota_waiting.get_or_create(&label).set(state.waiting_at(now).count() as i64);
            let mut buckets = state.buckets;
            buckets.refill(now);
            for (limit, b) in
                [("requests", buckets.requests), ("input_tokens", buckets.input), ("output_tokens", buckets.output)]
            {
                if let Some(b) = b.filter(|b| b.limit > 0.0) {
                    let label = RouteLimitLabel { route: route.clone(), limit: limit.to_string() };
                    self.quota_used.get_or_create(&label).set(1.0 - b.level / b.limit);
                }
            }
        }
    }

    pub fn set_namespace_tasks(&self, namespace: &str, tasks: flower_store::TaskCounts) {
        for (state, n) in [("live", tasks.live), ("held", tasks.held)] {
            let label = NamespaceStateLabel { namespace: namespace.to_string(), state };
            self.namespace_tasks.get_or_create(&label).set(n as i64);
        }
    }

    /// Record one finished model call; with a `price` for its model, its cost too.
    pub fn model_call(
        &self,
        provider: &str,
        model: &str,
        took: Duration,
        usage: Option<&Usage>,
        price: Option<&Price>,
    ) {
        let outcome = if usage.is_some() { "ok" } else { "error" };
        self.model_calls
            .get_or_create(&ModelCallLabels { provider: provider.to_string(), model: model.to_string(), outcome })
            .inc();
        self.model_call_duration.observe(took.as_secs_f64());
        if let Some(u) = usage {
            for (kind, n) in [
                ("input", u.input_tokens),
                ("output", u.output_tokens),
                ("cache_read", u.cache_read_input_tokens),
                ("cache_write", u.cache_creation_input_tokens),
            ] {
                self.tokens.get_or_create(&KindLabel { kind }).inc_by(n);
            }
            if let Some(p) = price {
                self.model_cost
                    .get_or_create(&ProviderModelLabels { provider: provider.to_string(), model: model.to_string() })
                    .inc_by(p.cost(u));
            }
        }
    }

    /// Count a tool call denied by a guard with this `denial_kind`.
    pub fn tool_denied(&self, kind: &str) {
        self.tool_denials.get_or_create(&KindLabel { kind: denial_label(kind) }).inc();
    }

    /// Count a task attempt's outcome, under its job's namespace.
    pub fn task(&self, namespace: &str, outcome: &'static str) {
        self.tasks.get_or_create(&NamespaceOutcomeLabel { namespace: namespace.to_string(), outcome }).inc();
    }

    /// The registry in the text exposition format (OpenMetrics, which
    /// Prometheus reads).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics not encoded");
        }
        out
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_named_by_convention() {
        let m = Metrics::new();
        m.task("default", "started");
        let usage = Usage { output_tokens: 5, ..Default::default() };
        m.model_call("sim", "m", Duration::from_millis(20), Some(&usage), None);
        let sonnet = flower_model::spec::builtin_price("claude-sonnet-4-5");
        assert!(sonnet.is_some());
        m.model_call("sim", "claude-sonnet-4-5", Duration::from_millis(20), Some(&usage), sonnet.as_ref());
        m.model_call("sim", "claude-sonnet-4-5", Duration::from_millis(20), None, sonnet.as_ref());
        m.set_job_counts(&[("team-a".into(), flower_model::JobState::Running, 2)]);
        m.spills.inc();
        m.tool_denied(crate::guards::DELEGATE_GUARD);
        m.tool_denied("worker_tools");
        m.tool_denied("permission-rule");
        m.tool_denied("something-else");
        m.prunes.inc();
        m.queue_lag.set(3);
        m.dead_letters.get_or_create(&OutcomeLabel { outcome: "republished" }).inc();
        let text = m.encode();
        for line in [
            "flower_tasks_total{namespace=\"default\",outcome=\"started\"} 1",
            "flower_model_calls_total{provider=\"sim\",model=\"m\",outcome=\"ok\"} 1",
            "flower_tokens_total{kind=\"output\"} 10",
            "flower_jobs{namespace=\"team-a\",state=\"running\"} 2",
            "flower_jobs{namespace=\"team-a\",state=\"failed\"} 0",
            "flower_jobs{namespace=\"default\",state=\"running\"} 0",
            "flower_model_call_duration_seconds_count 3",
            "flower_lease_takeovers_total 0",
            "flower_tasks_queued_total 0",
            "flower_spills_total 1",
            "flower_tool_denials_total{kind=\"delegate_guard\"} 1",
            "flower_tool_denials_total{kind=\"worker_tools\"} 1",
            "flower_tool_denials_total{kind=\"other\"} 2",
            "flower_prunes_total 1",
            "flower_queue_lag_messages 3",
            "flower_dead_letters_total{outcome=\"republished\"} 1",
            "flower_dead_letters_total{outcome=\"failed\"} 0",
            "# TYPE flower_model_cost_dollars counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        // 5 output tokens of Sonnet at $15/MTok; the failed call and the
        // unpriced model add nothing.
        let cost: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("flower_model_cost_dollars_total"))
            .map(|rest| {
                assert!(rest.starts_with("{provider=\"sim\",model=\"claude-sonnet-4-5\"} "), "{rest}");
                rest.rsplit(' ').next().unwrap_or_default().parse().unwrap_or(f64::NAN)
            })
            .collect();
        assert_eq!(cost.len(), 1, "{text}");
        assert!((cost[0] - 7.5e-5).abs() < 1e-12, "{text}");
    }
}
