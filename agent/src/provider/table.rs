//! The provider table a service or worker process is configured with: a name
//! (`anthropic`, `openai`, `sim`) → an endpoint, keys from the environment
//! (`<NAME>_API_KEY`), a cap on concurrent model calls per provider. Each
//! entry is spoken to in the API a role's route asks for: Messages or Chat
//! Completions (an `openai` role of a `sim` job speaks Chat Completions to
//! the `sim` entry). Jobs name a provider; they never carry endpoints or keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    AnthropicClient, ClientConfig, Observer, OpenAiClient, Provider, ProviderError, ProviderSource, Request, Response,
};
use flower_model::spec::{Api, Budget, Route};
use flower_model::{JobId, JobSpec};

#[derive(Clone, Default)]
pub struct ConfiguredProviders {
    /// The clients by name and API, unmetered: [`Self::get`] and
    /// [`Self::for_route`] wrap them.
    clients: BTreeMap<String, BTreeMap<Api, Arc<dyn Provider>>>,
}

/// A provider entry that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("provider `{entry}`: {reason}")]
pub struct ProviderConfigError {
    pub entry: String,
    pub reason: String,
}

impl ConfiguredProviders {
    /// A table of ready-made providers (embedding, benchmarks), each
    /// answering both APIs.
    pub fn from_map(clients: BTreeMap<String, Arc<dyn Provider>>) -> Self {
        let clients = clients
            .into_iter()
            .map(|(name, p)| (name, [(Api::Messages, p.clone()), (Api::ChatCompletions, p)].into_iter().collect()))
            .collect();
        Self { clients }
    }

    /// Parse `NAME=URL` entries (from repeated flags or a comma-separated
    /// `FLOWER_PROVIDERS`), each with at most `max_concurrent` calls at once;
    /// with a store, their routes' rate limits are learnt and kept there
    /// ([`super::quota`]).
    pub fn parse(
        entries: &[String],
        max_concurrent: usize,
        quotas: Option<&Arc<dyn flower_store::Store>>,
    ) -> Result<Self, ProviderConfigError> {
        let mut clients: BTreeMap<String, BTreeMap<Api, Arc<dyn Provider>>> = BTreeMap::new();
        for entry in entries.iter().flat_map(|e| e.split(',')).map(str::trim).filter(|e| !e.is_empty()) {
            let err = |reason: &str| ProviderConfigError { entry: entry.to_string(), reason: reason.to_string() };
            let (name, url) = entry.split_once('=').ok_or_else(|| err("expected NAME=URL"))?;
            let name = name.trim();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(err("the name is letters, digits, `_` and `-`"));
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(err("the URL must start with http:// or https://"));
            }
            let key_var = format!("{}_API_KEY", name.to_ascii_uppercase().replace('-', "_"));
            let config = ClientConfig {
                base_url: url.trim().to_string(),
                api_key: std::env::var(&key_var).ok().filter(|k| !k.is_empty()),
                max_concurrent,
                ..Default::default()
            };
            let quota = |api: &str| {
                quotas.map(|s| {
                    super::quota::RouteQuotas::new(s.clone(), api, &config.base_url, config.api_key.as_deref())
                })
            };
            let messages = ClientConfig { quota: quota("messages"), ..config.clone() };
            let messages: Arc<dyn Provider> =
                Arc::new(AnthropicClient::new(messages).map_err(|e| err(&e.to_string()))?);
            let chat = ClientConfig { quota: quota("chat"), ..config };
            let chat: Arc<dyn Provider> = Arc::new(OpenAiClient::new(chat).map_err(|e| err(&e.to_string()))?);
            let apis = [(Api::Messages, messages), (Api::ChatCompletions, chat)].into_iter().collect();
            if clients.insert(name.to_string(), apis).is_some() {
                return Err(err("configured twice"));
            }
        }
        Ok(Self { clients })
    }

    pub fn names(&self) -> Vec<&str> {
        self.clients.keys().map(String::as_str).collect()
    }

    /// The provider `name` speaking `api`, its calls metered and priced
    /// from the built-in table.
    pub fn get(&self, name: &str, api: Api) -> Option<Arc<dyn Provider>> {
        self.metered(name, api, Budget::default())
    }

    /// The provider the coordinator of `spec` uses, its calls metered and
    /// priced as the job's budget prices them (the spec's `prices`, else
    /// the built-in table).
    pub fn for_spec(&self, spec: &JobSpec) -> Option<Arc<dyn Provider>> {
        self.for_route(spec, spec.coordinator_route())
    }

    /// The provider of one of `spec`'s routes, metered and priced as [`Self::for_spec`].
    pub fn for_route(&self, spec: &JobSpec, route: Route) -> Option<Arc<dyn Provider>> {
        let prices = Budget { prices: spec.runtime.budget.prices.clone(), ..Default::default() };
        self.metered(route.entry.name(), route.api, prices)
    }

    fn metered(&self, name: &str, api: Api, prices: Budget) -> Option<Arc<dyn Provider>> {
        let (name, apis) = self.clients.get_key_value(name)?;
        let inner = apis.get(&api)?.clone();
        Some(Arc::new(Metered { name: name.clone(), inner, prices }))
    }

    /// Why a spec cannot run here, if it cannot: every provider its roles
    /// name must be configured.
    pub fn check(&self, spec: &JobSpec) -> Result<(), String> {
        for route in spec.routes() {
            let name = route.entry.name();
            if !self.clients.contains_key(name) {
                return Err(format!(
                    "provider: `{name}` is not configured on this service (configured: {})",
                    if self.clients.is_empty() { "none".to_string() } else { self.names().join(", ") }
                ));
            }
        }
        Ok(())
    }
}

/// A configured provider whose calls are counted under its configured name:
/// every model call of the process goes through the table, whichever part of
/// the loop (a turn, a handoff summary) makes it.
struct Metered {
    name: String,
    inner: Arc<dyn Provider>,
    /// The price table of the job's budget (only `prices` matters): a call
    /// is priced as the job's cost budget prices it.
    prices: Budget,
}

#[async_trait::async_trait]
impl Provider for Metered {
    async fn send(&self, request: &Request, observer: Option<Observer>) -> Result<Response, ProviderError> {
        let started = std::time::Instant::now();
        let result = self.inner.send(request, observer).await;
        let usage = result.as_ref().ok().map(|r| &r.usage);
        let price = self.prices.price(&request.model);
        crate::metrics::metrics().model_call(&self.name, &request.model, started.elapsed(), usage, price.as_ref());
        result
    }
}

impl ProviderSource for ConfiguredProviders {
    fn for_job(&self, _job: JobId, spec: &JobSpec, route: Route) -> Result<Arc<dyn Provider>, ProviderError> {
        self.for_route(spec, route).ok_or_else(|| ProviderError::Api {
            status: 400,
            kind: "not_configured".into(),
            message: format!("provider `{}` is not configured here", route.entry.name()),
            retry_after: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_parsed_and_checked() {
        let p = ConfiguredProviders::parse(
            &["sim=http://127.0.0.1:8787, anthropic=https://api.anthropic.com".into()],
            4,
            None,
        )
        .unwrap();
        assert_eq!(p.names(), vec!["anthropic", "sim"]);
        let err = |e: &[&str]| {
            let entries: Vec<String> = e.iter().map(|s| s.to_string()).collect();
            ConfiguredProviders::parse(&entries, 1, None).err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert!(err(&["sim"]).contains("NAME=URL"));
        assert!(err(&["sim=ftp://x"]).contains("http://"));
        assert!(err(&["a=http://x", "a=http://y"]).contains("twice"));
    }
}
