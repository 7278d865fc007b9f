//! The process's Prometheus series: one registry per process, shared by
//! whatever the process runs (a coordinator's owner and dispatch, a worker's
//! task loop, every model call). It knows no role: each series is recorded
//! where its event happens and stays at zero in a process that never has one.
//!
//! Labels are low-cardinality by rule: a state, an outcome, a provider's
//! configured name, a model, a token kind — never a job id or a task id.

use std::sync::OnceLock;
use std::time::Duration;

use flower_model::Usage;
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
pub struct KindLabel {
    pub kind: &'static str,
}

/// Every series a flower process exports.
pub struct Metrics {
    registry: Registry,
    /// Jobs by state, as the store counts them (set by whoever can ask the store).
    pub jobs: Family<StateLabel, Gauge>,
    /// Task attempts by outcome: `started`, then `succeeded`, `failed`,
    /// `cancelled` or `retried` (a transient failure; the delivery comes back).
    pub tasks: Family<OutcomeLabel, Counter>,
    pub task_duration: Histogram,
    pub worker_slots: Gauge,
    pub worker_slots_busy: Gauge,
    pub model_calls: Family<ModelCallLabels, Counter>,
    pub model_call_duration: Histogram,
    pub tokens: Family<KindLabel, Counter>,
    pub lease_takeovers: Counter,
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
        let mut registry = Registry::default();
        let m = Self {
            jobs: Family::default(),
            tasks: Family::default(),
            task_duration: Histogram::new(long_buckets()),
            worker_slots: Gauge::default(),
            worker_slots_busy: Gauge::default(),
            model_calls: Family::default(),
            model_call_duration: Histogram::new(long_buckets()),
            tokens: Family::default(),
            lease_takeovers: Counter::default(),
            dispatch: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            registry: Registry::default(),
        };
        registry.register("flower_jobs", "Jobs by state, as stored", m.jobs.clone());
        // Counters are written with the `_total` suffix.
        registry.register("flower_tasks", "Task attempts on this worker, by outcome", m.tasks.clone());
        registry.register(
            "flower_task_duration_seconds",
            "Time a task attempt ran on this worker",
            m.task_duration.clone(),
        );
        registry.register("flower_worker_slots", "Tasks this worker runs at once", m.worker_slots.clone());
        registry.register("flower_worker_slots_busy", "Slots running a task now", m.worker_slots_busy.clone());
        registry.register(
            "flower_model_calls",
            "Model calls by provider, model and outcome (ok or error), retries inside a call included in it",
            m.model_calls.clone(),
        );
        registry.register(
            "flower_model_call_duration_seconds",
            "Time a model call took, retries included",
            m.model_call_duration.clone(),
        );
        registry.register(
            "flower_tokens",
            "Tokens reported by the provider, by kind (input, output, cache_read, cache_write)",
            m.tokens.clone(),
        );
        registry.register(
            "flower_lease_takeovers",
            "Job leases taken by this coordinator (a new job's first owner, or a dead owner's successor)",
            m.lease_takeovers.clone(),
        );
        registry.register(
            "flower_dispatch_seconds",
            "From a task's creation (the Agent call) to its first attempt starting",
            m.dispatch.clone(),
        );
        Self { registry, ..m }
    }

    /// Set the jobs gauge from the store's counts; states with no job read 0.
    pub fn set_job_counts(&self, counts: &[(flower_model::JobState, u64)]) {
        use flower_model::JobState::*;
        for state in [Queued, Running, Waiting, Succeeded, Failed, Cancelled] {
            let n = counts.iter().filter(|(s, _)| *s == state).map(|(_, n)| *n).sum::<u64>();
            self.jobs.get_or_create(&StateLabel { state: state.as_str() }).set(n as i64);
        }
    }

    /// Record one finished model call.
    pub fn model_call(&self, provider: &str, model: &str, took: Duration, usage: Option<&Usage>) {
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
        }
    }

    /// Count a task attempt's outcome.
    pub fn task(&self, outcome: &'static str) {
        self.tasks.get_or_create(&OutcomeLabel { outcome }).inc();
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
        m.task("started");
        m.model_call("sim", "m", Duration::from_millis(20), Some(&Usage { output_tokens: 5, ..Default::default() }));
        m.set_job_counts(&[(flower_model::JobState::Running, 2)]);
        let text = m.encode();
        for line in [
            "flower_tasks_total{outcome=\"started\"} 1",
            "flower_model_calls_total{provider=\"sim\",model=\"m\",outcome=\"ok\"} 1",
            "flower_tokens_total{kind=\"output\"} 5",
            "flower_jobs{state=\"running\"} 2",
            "flower_jobs{state=\"failed\"} 0",
            "flower_model_call_duration_seconds_count 1",
            "flower_lease_takeovers_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }
}
