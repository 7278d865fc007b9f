//! Trace context carried across the queue continues the same trace.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
// A test reads top to bottom.
#![allow(clippy::too_many_lines)]

use flower_bus::trace::{continue_trace, current_traceparent};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn the_worker_span_continues_the_publishers_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::with_default(subscriber, || {
        assert_eq!(current_traceparent(), None, "outside any span there is nothing to carry");
        let publish = tracing::info_span!("task.publish");
        let carried = publish.in_scope(current_traceparent).expect("a traceparent inside a span");
        assert!(carried.starts_with("00-") && carried.len() == 55, "{carried}");
        drop(publish);
        // Elsewhere (another process, after NATS): a fresh span adopts it.
        let task = tracing::info_span!("task");
        continue_trace(&task, &carried);
        task.in_scope(|| tracing::info_span!("llm.call").in_scope(|| {}));
        drop(task);
    });
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let by = |name: &str| spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("span {name}"));
    let (publish, task, call) = (by("task.publish"), by("task"), by("llm.call"));
    assert_eq!(task.span_context.trace_id(), publish.span_context.trace_id(), "one trace across the queue");
    assert_eq!(task.parent_span_id, publish.span_context.span_id());
    assert_eq!(call.span_context.trace_id(), publish.span_context.trace_id());
}
