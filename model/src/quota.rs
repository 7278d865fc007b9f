//! Token buckets, as providers describe their rate limits: a level that
//! refills continuously at its limit per minute, up to the limit. Shared by
//! the simulator (which enforces limits) and the runtime (which keeps under
//! them). Times are milliseconds on any clock the caller keeps.

use serde::{Deserialize, Serialize};

/// One bucket. Its level may go below zero (usage charged after the
/// fact): it is in debt until refilled.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Per minute.
    pub limit: f64,
    pub level: f64,
    /// When `level` was read (ms).
    pub at: i64,
}

impl Bucket {
    /// A full bucket of `limit` per minute at `now`.
    pub fn full(limit: u64, now: i64) -> Self {
        Self { limit: limit as f64, level: limit as f64, at: now }
    }

    /// Refilled up to `now` (a clock that went back refills nothing).
    pub fn refill(&mut self, now: i64) {
        let dt = (now - self.at).max(0) as f64;
        self.level = (self.level + self.limit * dt / 60_000.0).min(self.limit);
        self.at = self.at.max(now);
    }

    /// How long (ms) until `need` is there; 0 if it is now. A need above the
    /// limit waits for a full bucket (and is then taken whole).
    pub fn wait_for(&self, need: f64) -> i64 {
        let need = need.min(self.limit);
        if self.level >= need || self.limit <= 0.0 {
            return 0;
        }
        ((need - self.level) * 60_000.0 / self.limit).ceil() as i64
    }

    /// How long (ms) until full again.
    pub fn full_in(&self) -> i64 {
        if self.limit <= 0.0 {
            return 0;
        }
        ((self.limit - self.level).max(0.0) * 60_000.0 / self.limit).ceil() as i64
    }

    /// Take `n` (at most the limit: a request larger than the bucket takes it whole).
    pub fn take(&mut self, n: f64) {
        self.level -= n.min(self.limit);
    }

    /// Charge `n` after the fact (it may put the bucket in debt).
    pub fn charge(&mut self, n: f64) {
        self.level -= n;
    }

    /// A new limit learnt or set: the level keeps what was used of the old one.
    pub fn relimit(&mut self, limit: u64) {
        let used = self.limit - self.level;
        self.limit = limit as f64;
        self.level = self.limit - used;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_and_waits_for_what_is_missing() {
        let mut b = Bucket::full(60, 0);
        for _ in 0..60 {
            assert_eq!(b.wait_for(1.0), 0);
            b.take(1.0);
        }
        assert_eq!(b.wait_for(1.0), 1000, "60 a minute: one a second");
        b.refill(500);
        assert_eq!(b.wait_for(1.0), 500);
        b.refill(100);
        assert_eq!(b.at, 500, "a clock that went back refills nothing");
        b.refill(60_500);
        assert_eq!((b.level, b.full_in()), (60.0, 0), "full, not more");
        b.charge(90.0);
        assert_eq!(b.wait_for(0.0), 30_000, "30 in debt at 60 a minute");
        let mut big = Bucket::full(100, 0);
        assert_eq!(big.wait_for(5_000.0), 0, "larger than the bucket: a full one takes it");
        big.take(5_000.0);
        assert_eq!(big.level, 0.0);
        big.relimit(200);
        assert_eq!(big.level, 100.0, "what was used of the old limit stays used");
    }
}
