//! A client's calls kept under its routes' rate limits, shared by every
//! process through the store (docs/design.md section 15, "Rate limits"). A
//! route is the API, the endpoint, a fingerprint of the key (never the key)
//! and the model. Its limits are learnt from what responses state
//! ([`Stated`]); once a route has limits, each request is admitted before
//! it is sent ([`Store::admit_quota`], waiting without a client permit
//! while the buckets refill), and what it used corrects its estimate
//! afterwards. A route without limits costs one read of the store's routes
//! per [`REFRESH`], not one per request; a store error lets the call go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flower_model::quota::{Claimant, DEFAULT_PRIORITY, Quota};
use flower_model::{Usage, now_ms};
use flower_store::Store;
use rand::Rng;
use sha2::Digest;

use super::ratelimit::Stated;
use super::{Observer, StreamEvent};
use crate::metrics::RouteLabel;

/// How long what this process knows of a route's limits is trusted before
/// the store is read again (another process may have learnt them).
const REFRESH: Duration = Duration::from_secs(10);

/// The longest a waiting call sleeps before asking again (ms).
const MAX_PAUSE_MS: i64 = 10_000;

#[derive(Clone)]
pub struct RouteQuotas {
    store: Arc<dyn Store>,
    /// `api|endpoint|k:fingerprint`: a route is this and `|model`.
    prefix: String,
    known: Arc<Mutex<HashMap<String, Known>>>,
}

/// A route's limits as last known here (`None`: none), and when read.
type Known = (Option<Quota>, Instant);

impl std::fmt::Debug for RouteQuotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteQuotas").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl RouteQuotas {
    pub fn new(store: Arc<dyn Store>, api: &str, base_url: &str, api_key: Option<&str>) -> Self {
        let key = api_key.map_or_else(|| "none".to_string(), |k| hex::encode(&sha2::Sha256::digest(k)[..6]));
        Self { store, prefix: format!("{api}|{}|k:{key}", base_url.trim_end_matches('/')), known: Arc::default() }
    }

    pub fn route(&self, model: &str) -> String {
        format!("{}|{model}", self.prefix)
    }

    /// The route's limits as known here, read again from the store when
    /// older than [`REFRESH`] (every route at once: they are few).
    async fn limits(&self, route: &str) -> Option<Quota> {
        if let Some((limits, at)) = self.known.lock().unwrap_or_else(|p| p.into_inner()).get(route)
            && at.elapsed() < REFRESH
        {
            return *limits;
        }
        let now = Instant::now();
        let stored = match self.store.route_quotas().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "routes' rate limits not read; the call goes");
                return None;
            }
        };
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(route.to_string(), (None, now));
        for (r, state) in stored {
            if r.starts_with(&self.prefix) {
                known.insert(r, (Some(state.buckets.quota).filter(Quota::is_set), now));
            }
        }
        known.get(route).and_then(|(l, _)| *l)
    }

    /// Wait until a request on `model` may go, in its turn among the calls
    /// waiting for the route (`claimant`'s place: its priority, its
    /// namespace's and job's share); its input tokens, estimated by
    /// `estimate` only when the route has limits, are what its admission
    /// took (0: nothing taken).
    pub async fn admit(
        &self,
        model: &str,
        claimant: Option<&Claimant>,
        estimate: impl FnOnce() -> u64,
        observer: &Option<Observer>,
    ) -> u64 {
        let route = self.route(model);
        if self.limits(&route).await.is_none() {
            return 0;
        }
        let input_tokens = estimate();
        let anonymous;
        let claimant = match claimant {
            Some(c) => c,
            None => {
                anonymous = Claimant::new(flower_model::access::DEFAULT_NAMESPACE, "", DEFAULT_PRIORITY);
                &anonymous
            }
        };
        let ticket: u64 = rand::rng().random();
        loop {
            let wait = match self.store.admit_quota(&route, claimant, ticket, input_tokens, now_ms()).await {
                Ok(None) => {
                    crate::metrics::metrics().quota_admitted.get_or_create(&RouteLabel { route }).inc();
                    return input_tokens;
                }
                Ok(Some(wait)) => wait,
                Err(e) => {
                    tracing::warn!(%route, error = %e, "rate limit not checked; the call goes");
                    return 0;
                }
            };
            // Back when its turn should come (a little after: the calls before
            // it go first), or sooner when that is far (limits raised, calls
            // before it gone): its place is kept meanwhile.
            let spread = (wait.ms / 50).clamp(1, 20) as u64;
            let pause =
                Duration::from_millis(wait.ms.clamp(1, MAX_PAUSE_MS) as u64 + rand::rng().random_range(0..=spread));
            tracing::info!(%route, wait_ms = pause.as_millis() as u64, limit = wait.limit.words(), "waiting for quota");
            if let Some(obs) = observer {
                obs(StreamEvent::WaitingForQuota { route: route.clone(), wait: pause, limit: wait.limit.words() });
            }
            // The task's worker slot is lent meanwhile.
            crate::slot::lent(pause).await;
        }
    }

    /// What a response stated of its route's limits (stored when they
    /// differ from what is known here), and, for a refusal with a wait,
    /// that wait for every process (the route's buckets emptied for it).
    pub async fn stated(&self, model: &str, stated: &Stated, refused: bool) {
        let route = self.route(model);
        if refused {
            crate::metrics::metrics().quota_refused.get_or_create(&RouteLabel { route: route.clone() }).inc();
        }
        let limits = Quota {
            requests_per_minute: stated.requests.map(|w| w.limit).filter(|l| *l > 0),
            input_tokens_per_minute: stated.input_tokens.map(|w| w.limit).filter(|l| *l > 0),
            output_tokens_per_minute: stated.output_tokens.map(|w| w.limit).filter(|l| *l > 0),
        };
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner()).get(&route).and_then(|(l, _)| *l);
        let limits = if limits.is_set() { limits } else { known.unwrap_or_default() };
        let drain = refused.then(|| stated.retry_after.map_or(1_000, |d| d.as_millis() as i64));
        if !limits.is_set() || (known == Some(limits) && drain.is_none()) {
            return;
        }
        // What is left, when first learnt here: requests this process (or
        // another) sent before the limits were known were counted there.
        let remaining = (known.is_none()).then(|| Quota {
            requests_per_minute: stated.requests.map(|w| w.remaining),
            input_tokens_per_minute: stated.input_tokens.map(|w| w.remaining),
            output_tokens_per_minute: stated.output_tokens.map(|w| w.remaining),
        });
        match self.store.learn_quota(&route, limits, remaining, drain, now_ms()).await {
            Ok(()) => {
                if known != Some(limits) {
                    tracing::info!(%route, ?limits, "rate limits learnt");
                }
                self.known.lock().unwrap_or_else(|p| p.into_inner()).insert(route, (Some(limits), Instant::now()));
            }
            Err(e) => tracing::warn!(%route, error = %e, "rate limits not stored"),
        }
    }

    /// What an answered request used, against the `estimate` its admission
    /// took (all of it when none was: limits learnt meanwhile).
    pub async fn used(&self, model: &str, estimate: u64, usage: &Usage) {
        let route = self.route(model);
        if self.known.lock().unwrap_or_else(|p| p.into_inner()).get(&route).and_then(|(l, _)| *l).is_none() {
            return;
        }
        let input = usage.context_tokens() as f64 - estimate as f64;
        if let Err(e) = self.store.charge_quota(&route, input, usage.output_tokens as f64, now_ms()).await {
            tracing::warn!(%route, error = %e, "a request's usage not charged to its route");
        }
    }
}
