//! Who goes first when a route's calls must wait (docs/design.md section
//! 15, "Rate limits"): a route's shared state ([`Route`]) keeps, beside its
//! buckets, the calls waiting for them. Waiting calls go in one order —
//! priority first (1 the most urgent), then the namespace that has had the
//! least of the route (weighted fair share), then within a namespace the
//! job that has had the least, then the oldest — and a call goes only when
//! the buckets hold enough for every call before it as well as for itself:
//! a later call never takes what an earlier one waits for. A waiting call
//! comes back when its turn should come ([`Wait::ms`] says when); one that
//! does not come back by its lease is forgotten, so a process that dies
//! holds nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Buckets, Quota, Wait};

/// How long after its expected turn a waiting call is kept for, unseen.
pub const WAITER_LEASE_MS: i64 = 5_000;

/// The default priority (the middle of 1–5).
pub const DEFAULT_PRIORITY: u8 = 3;

/// Who asks: the order its calls wait in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claimant {
    pub namespace: String,
    pub job: String,
    /// The task, when a worker asks (empty for a coordinator's calls).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task: String,
    /// 1 (most urgent) to 5.
    pub priority: u8,
    /// The namespace's share against the others' (1: equal).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(w: &f64) -> bool {
    *w == 1.0
}

impl Claimant {
    pub fn new(namespace: impl Into<String>, job: impl Into<String>, priority: u8) -> Self {
        Self { namespace: namespace.into(), job: job.into(), task: String::new(), priority, weight: 1.0 }
    }

    fn job_key(&self) -> String {
        format!("{}/{}", self.namespace, self.job)
    }
}

/// A call waiting for its route.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Waiter {
    pub claim: Claimant,
    /// Chosen by the call: how it finds itself again.
    pub ticket: u64,
    pub input_tokens: u64,
    /// When it first asked.
    pub since: i64,
    /// When its turn should come, as last told.
    pub turn_at: i64,
    /// Forgotten when not seen again by then.
    pub expires: i64,
}

/// What each namespace and each job has had of a route, in shares of its
/// limits divided by weight, and the level a newcomer starts from (virtual
/// time: a namespace that was away does not come back owed the past).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Shares {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<String, f64>,
    #[serde(default)]
    pub namespace_clock: f64,
    #[serde(default)]
    pub job_clock: f64,
}

impl Shares {
    fn namespace(&self, ns: &str) -> f64 {
        self.namespaces.get(ns).copied().unwrap_or(0.0).max(self.namespace_clock)
    }

    fn job(&self, key: &str) -> f64 {
        self.jobs.get(key).copied().unwrap_or(0.0).max(self.job_clock)
    }

    /// `claim` had `cost` of the route.
    fn served(&mut self, claim: &Claimant, cost: f64) {
        let ns = self.namespace(&claim.namespace);
        self.namespace_clock = self.namespace_clock.max(ns);
        self.namespaces.insert(claim.namespace.clone(), ns + cost / claim.weight.max(1e-6));
        let key = claim.job_key();
        let job = self.job(&key);
        self.job_clock = self.job_clock.max(job);
        self.jobs.insert(key, job + cost);
    }
}

/// A route's shared state: its buckets and who waits for them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    #[serde(flatten)]
    pub buckets: Buckets,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiter>,
    #[serde(default)]
    pub shares: Shares,
}

impl Route {
    pub fn new(buckets: Buckets) -> Self {
        Self { buckets, waiting: Vec::new(), shares: Shares::default() }
    }

    /// A request's share of the route: of its tightest limit.
    fn cost(quota: &Quota, input_tokens: u64) -> f64 {
        let requests = quota.requests_per_minute.map_or(0.0, |l| 1.0 / l as f64);
        let input = quota.input_tokens_per_minute.map_or(0.0, |l| input_tokens as f64 / l as f64);
        requests.max(input).max(1e-9)
    }

    /// The waiting calls in the order they go: priority, then the namespace
    /// and the job that have had least (counting those placed before), then
    /// the oldest.
    pub fn order(&self) -> Vec<usize> {
        // Each job's line (its calls oldest first), and the shares as they
        // grow while the order is placed.
        let mut namespaces: Vec<(&str, f64)> = Vec::new();
        let mut lines: Vec<(u8, usize, f64, std::collections::VecDeque<usize>)> = Vec::new();
        let mut by_age: Vec<usize> = (0..self.waiting.len()).collect();
        by_age.sort_by_key(|&i| (self.waiting[i].since, self.waiting[i].ticket));
        for i in by_age {
            let c = &self.waiting[i].claim;
            let ns = match namespaces.iter().position(|(n, _)| *n == c.namespace) {
                Some(at) => at,
                None => {
                    namespaces.push((&c.namespace, self.shares.namespace(&c.namespace)));
                    namespaces.len() - 1
                }
            };
            match lines
                .iter_mut()
                .find(|(p, n, _, line)| *p == c.priority && *n == ns && self.waiting[line[0]].claim.job == c.job)
            {
                Some(line) => line.3.push_back(i),
                None => lines.push((c.priority, ns, self.shares.job(&c.job_key()), [i].into())),
            }
        }
        let mut order = Vec::with_capacity(self.waiting.len());
        while let Some(at) = (0..lines.len()).filter(|&l| !lines[l].3.is_empty()).min_by(|&a, &b| {
            let key = |l: usize| {
                let (p, ns, job, line) = &lines[l];
                (*p, namespaces[*ns].1, *job, self.waiting[line[0]].since)
            };
            key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
        }) {
            let Some(next) = lines[at].3.pop_front() else { break };
            let w = &self.waiting[next];
            let cost = Self::cost(&self.buckets.quota, w.input_tokens);
            namespaces[lines[at].1].1 += cost / w.claim.weight.max(1e-6);
            lines[at].2 += cost;
            order.push(next);
        }
        order
    }

    /// The call `ticket` of `claim` asks for a request of `input_tokens` at
    /// `now`: it goes (taken from the buckets, its share counted), or waits
    /// in line, told how long until its turn.
    pub fn admit(&mut self, claim: &Claimant, ticket: u64, input_tokens: u64, now: i64) -> Result<(), Wait> {
        self.buckets.refill(now);
        self.waiting.retain(|w| w.expires >= now || w.ticket == ticket);
        match self.waiting.iter_mut().find(|w| w.ticket == ticket) {
            Some(w) => {
                w.input_tokens = input_tokens;
                w.claim = claim.clone();
            }
            None => self.waiting.push(Waiter {
                claim: claim.clone(),
                ticket,
                input_tokens,
                since: now,
                turn_at: now,
                expires: now + WAITER_LEASE_MS,
            }),
        }
        // Everyone in line before this call is given their request first,
        // on a copy of the buckets.
        let mut room = self.buckets;
        let (mut requests, mut tokens) = (0u64, 0u64);
        let mut blocked = None;
        let mut place = None;
        for i in self.order() {
            let w = &self.waiting[i];
            requests += 1;
            tokens += w.input_tokens;
            if blocked.is_none()
                && let Err(wait) = room.admit(w.input_tokens, now)
            {
                blocked = Some(wait);
            }
            if w.ticket == ticket {
                place = Some(i);
                break;
            }
        }
        match blocked {
            None => {
                // Its turn: the buckets hold what the copy gave it.
                self.buckets.admit(input_tokens, now)?;
                self.waiting.retain(|w| w.ticket != ticket);
                self.shares.served(claim, Self::cost(&self.buckets.quota, input_tokens));
                self.forget_idle_shares();
                Ok(())
            }
            Some(blocked) => {
                let wait = self.buckets.wait_for_all(requests, tokens).unwrap_or(blocked);
                if let Some(w) = place.and_then(|i| self.waiting.get_mut(i)) {
                    w.turn_at = now + wait.ms;
                    w.expires = w.turn_at + WAITER_LEASE_MS;
                }
                Err(wait)
            }
        }
    }

    /// Shares of namespaces and jobs with no call waiting and no more than
    /// a newcomer would be given are forgotten (the row stays small).
    fn forget_idle_shares(&mut self) {
        let waiting_ns: std::collections::HashSet<&str> =
            self.waiting.iter().map(|w| w.claim.namespace.as_str()).collect();
        let waiting_jobs: std::collections::HashSet<String> = self.waiting.iter().map(|w| w.claim.job_key()).collect();
        let (ns_clock, job_clock) = (self.shares.namespace_clock, self.shares.job_clock);
        self.shares.namespaces.retain(|ns, v| waiting_ns.contains(ns.as_str()) || *v > ns_clock);
        self.shares.jobs.retain(|j, v| waiting_jobs.contains(j) || *v > job_clock);
    }

    /// The calls waiting at `now` (not past their lease).
    pub fn waiting_at(&self, now: i64) -> impl Iterator<Item = &Waiter> {
        self.waiting.iter().filter(move |w| w.expires >= now)
    }
}

impl Buckets {
    /// How long until the buckets hold `requests` requests and `tokens`
    /// input tokens at once (and no output debt): the longest of the three,
    /// `None` when nothing is missing.
    pub fn wait_for_all(&self, requests: u64, tokens: u64) -> Option<Wait> {
        self.longest_wait(requests as f64, tokens as f64, super::Bucket::refilled_to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(rpm: u64) -> Route {
        Route::new(Buckets::full(Quota { requests_per_minute: Some(rpm), ..Quota::default() }, 0))
    }

    #[test]
    fn a_later_call_never_takes_what_an_earlier_one_waits_for() {
        let mut r = route(60);
        let a = Claimant::new("a", "j1", 3);
        for t in 0..60 {
            assert_eq!(r.admit(&a, t, 10, 0), Ok(()));
        }
        let w = r.admit(&a, 100, 10, 0).unwrap_err();
        assert_eq!(w.ms, 1_000, "one a second");
        let w2 = r.admit(&a, 101, 10, 0).unwrap_err();
        assert_eq!(w2.ms, 2_000, "second in line: its turn comes after the first's");
        // At 1 s there is room for one: the second in line may not take it.
        assert!(r.admit(&a, 101, 10, 1_000).is_err());
        assert_eq!(r.admit(&a, 100, 10, 1_000), Ok(()));
        assert_eq!(r.admit(&a, 101, 10, 2_000), Ok(()));
        assert!(r.waiting.is_empty());
    }

    #[test]
    fn priority_first_then_the_namespace_that_had_least() {
        let mut r = route(60);
        let (low, high) = (Claimant::new("a", "j1", 5), Claimant::new("b", "j2", 1));
        for t in 0..60 {
            r.admit(&low, t, 1, 0).unwrap();
        }
        assert!(r.admit(&low, 100, 1, 0).is_err());
        let w = r.admit(&high, 200, 1, 10).unwrap_err();
        assert_eq!(w.ms, 990, "an urgent call goes before those already waiting");
        assert!(r.admit(&low, 100, 1, 1_000).is_err(), "the urgent call's turn");
        assert_eq!(r.admit(&high, 200, 1, 1_000), Ok(()));
        assert_eq!(r.admit(&low, 100, 1, 2_000), Ok(()));

        // Equal priority, a newcomer: namespace a has had 61 requests, c none.
        let c = Claimant::new("c", "j3", 5);
        for t in 0..4 {
            r.admit(&low, 300 + t, 1, 2_000).unwrap_err();
            r.admit(&c, 400 + t, 1, 2_000).unwrap_err();
        }
        // c, new here, starts level with a (not owed a's past): in turn.
        let order: Vec<&str> = r.order().iter().map(|&i| r.waiting[i].claim.namespace.as_str()).collect();
        assert_eq!(order[0], "c", "{order:?}");
        assert!(order.windows(3).all(|w| !(w[0] == w[1] && w[1] == w[2])), "in turn: {order:?}");
    }

    #[test]
    fn equal_shares_alternate_and_a_newcomer_starts_level() {
        let mut r = route(600);
        let (a, b) = (Claimant::new("a", "j1", 3), Claimant::new("b", "j2", 3));
        for t in 0..600 {
            r.admit(&a, t, 1, 0).unwrap();
        }
        // b was away while a used the route: it starts from the clock, not from 0.
        for t in 0..3 {
            r.admit(&a, 1_000 + t, 1, 0).unwrap_err();
            r.admit(&b, 2_000 + t, 1, 0).unwrap_err();
        }
        let order: Vec<&str> = r.order().iter().map(|&i| r.waiting[i].claim.namespace.as_str()).collect();
        assert_eq!(order.iter().filter(|n| **n == "b").count(), 3);
        assert!(order[..2].contains(&"a") && order[..2].contains(&"b"), "in turn: {order:?}");
    }

    #[test]
    fn three_namespaces_in_line_are_served_in_turn() {
        // a asked first, with many calls; b and c after: each gets a third.
        let mut r = route(60);
        let claims = [Claimant::new("a", "j1", 3), Claimant::new("b", "j2", 3), Claimant::new("c", "j3", 3)];
        for t in 0..60 {
            r.admit(&claims[0], t, 1, 0).unwrap();
        }
        for (n, c) in claims.iter().enumerate() {
            for t in 0..20 {
                let _ = r.admit(c, 1_000 + (n as u64) * 100 + t, 1, n as i64);
            }
        }
        let first: Vec<&str> = r.order().iter().take(30).map(|&i| r.waiting[i].claim.namespace.as_str()).collect();
        for ns in ["a", "b", "c"] {
            assert_eq!(first.iter().filter(|n| **n == ns).count(), 10, "{first:?}");
        }
    }

    #[test]
    fn a_waiter_not_seen_by_its_lease_is_forgotten() {
        let mut r = route(1);
        let a = Claimant::new("a", "j1", 3);
        r.admit(&a, 1, 1, 0).unwrap();
        let w = r.admit(&a, 2, 1, 0).unwrap_err();
        assert_eq!(w.ms, 60_000);
        assert_eq!(r.waiting_at(60_000 + WAITER_LEASE_MS).count(), 1);
        // Its caller died: after its turn and the lease, another call is first.
        let later = 60_000 + WAITER_LEASE_MS + 1;
        assert_eq!(r.waiting_at(later).count(), 0);
        assert_eq!(r.admit(&a, 3, 1, later), Ok(()));
    }

    #[test]
    fn a_route_reads_buckets_stored_before_it_had_a_line() {
        let b = Buckets::full(Quota { requests_per_minute: Some(5), ..Quota::default() }, 7);
        let stored = serde_json::to_string(&b).unwrap();
        let r: Route = serde_json::from_str(&stored).unwrap();
        assert_eq!(r, Route::new(b));
    }
}
