//! Logs to stderr (`RUST_LOG`, default `warn`), and — when an endpoint is
//! configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. `http://collector:4318`) —
//! spans exported over OTLP (HTTP/protobuf), with the trace context carried
//! across NATS so one trace runs submit → coordinator turn → task publish →
//! worker → model call.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Flushes spans on drop.
pub struct Telemetry(Option<SdkTracerProvider>);

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = p.shutdown();
        }
    }
}

pub fn init(service: &str) -> Telemetry {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter());
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.is_empty());
    let Some(endpoint) = endpoint else {
        tracing_subscriber::registry().with(fmt).init();
        return Telemetry(None);
    };
    let exporter = match opentelemetry_otlp::SpanExporter::builder().with_http().build() {
        Ok(e) => e,
        Err(e) => {
            tracing_subscriber::registry().with(fmt).init();
            tracing::error!(endpoint, error = %e, "OTLP export disabled");
            return Telemetry(None);
        }
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(format!("flower-{service}")).build())
        .build();
    let tracer = provider.tracer("flower");
    let spans = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(EnvFilter::new("info"));
    tracing_subscriber::registry().with(fmt).with(spans).init();
    tracing::info!(endpoint, "exporting spans over OTLP");
    Telemetry(Some(provider))
}
