//! Trace context across the queue: the publisher's span context travels with
//! the task message (W3C `traceparent`, as a NATS header), and the worker's
//! span continues the same trace. Without an OpenTelemetry layer installed
//! there is no context, and nothing is carried.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C trace-context header name.
pub const TRACEPARENT: &str = "traceparent";

/// The current span's `traceparent`, when it belongs to a trace.
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Make `span` a child of the trace `traceparent` names.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let carrier: HashMap<String, String> = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}
