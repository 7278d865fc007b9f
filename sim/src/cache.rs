//! Prompt-cache accounting faithful to the provider's rules, so cache rate is
//! measured, not assumed:
//! - the prefix is linearised `tools` → `system` → `messages` blocks;
//! - at most 4 `cache_control` breakpoints, longer TTLs before shorter ones
//!   (else the provider's 400 error);
//! - writes happen only at breakpoints; a read is found by checking at most 20
//!   block positions backwards from each breakpoint (the breakpoint first);
//! - entries live 5 min or 1 h from the request's start and a hit refreshes
//!   them; an entry is readable only once the response that wrote it begins;
//! - below the model's minimum cacheable length nothing is cached;
//! - usage: read A (the longest prefix hit), 1-h write B − A (B the last 1-h
//!   breakpoint after A), 5-min write C − B (C the last breakpoint).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::engine::estimate_tokens;

const LOOKBACK: usize = 20;
const FIVE_MIN: Duration = Duration::from_secs(300);
const ONE_HOUR: Duration = Duration::from_secs(3600);

/// Minimum cacheable prompt length of a model, in tokens.
pub fn min_cacheable(model: &str) -> u64 {
    let m = model.to_ascii_lowercase();
    if m.contains("opus-4-5") || m.contains("haiku-4-5") {
        4096
    } else if m.contains("haiku") {
        2048
    } else {
        1024
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Tokens read without the cache.
    pub input_tokens: u64,
    pub cache_read: u64,
    pub cache_write_5m: u64,
    pub cache_write_1h: u64,
}

struct Cached {
    ttl: Duration,
    expires: Instant,
    readable_at: Instant,
}

/// What one request looked like to the cache, for the audit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Prefix hashes of its blocks (`cache_control` stripped): request B
    /// extends request A exactly when A's chain is a prefix of B's.
    pub chain: Vec<[u8; 32]>,
    /// Blocks read from the cache (the prefix up to the hit).
    pub read_blocks: usize,
    /// Blocks the cache holds for this prefix after the request (its last
    /// breakpoint long enough to cache, or what it read).
    pub cached_blocks: usize,
}

#[derive(Default)]
pub struct PromptCache {
    entries: Mutex<HashMap<[u8; 32], Cached>>,
}

struct Block {
    /// Hash of the prefix up to and including this block.
    prefix: [u8; 32],
    /// Estimated tokens of the prefix up to and including this block.
    tokens: u64,
    ttl: Option<Duration>,
}

/// One block of a request's prefix, borrowed from the request: what the
/// cache hashes is its JSON without `cache_control`, a message's block
/// with its message's role.
pub(crate) enum BlockRef<'a> {
    /// A plain-text system prompt or message content, as a text block.
    Text {
        text: &'a str,
        role: Option<&'a Value>,
    },
    Object {
        block: &'a serde_json::Map<String, Value>,
        role: Option<&'a Value>,
    },
    Other(&'a Value),
}

impl BlockRef<'_> {
    /// The block's breakpoint marker, if it carries one.
    pub(crate) fn cache_control(&self) -> Option<&Value> {
        match self {
            BlockRef::Object { block, .. } => block.get("cache_control"),
            _ => None,
        }
    }
}

impl serde::Serialize for BlockRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            BlockRef::Text { text, role } => {
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("type", "text")?;
                m.serialize_entry("text", text)?;
                if let Some(role) = role {
                    m.serialize_entry("role", role)?;
                }
                m.end()
            }
            BlockRef::Object { block, role } => {
                let mut m = s.serialize_map(None)?;
                for (k, v) in block.iter() {
                    if k != "cache_control" && !(role.is_some() && k == "role") {
                        m.serialize_entry(k, v)?;
                    }
                }
                if let Some(role) = role {
                    m.serialize_entry("role", role)?;
                }
                m.end()
            }
            BlockRef::Other(v) => v.serialize(s),
        }
    }
}

/// The prefix's blocks in order: tools, system, then each message's content
/// blocks (borrowed: a request of thousands of blocks is walked, not copied).
pub(crate) fn blocks_of(body: &Value) -> impl Iterator<Item = BlockRef<'_>> {
    fn block<'a>(b: &'a Value, role: Option<&'a Value>) -> BlockRef<'a> {
        match b {
            Value::Object(block) => BlockRef::Object { block, role },
            other => BlockRef::Other(other),
        }
    }
    let tools = body["tools"].as_array().into_iter().flatten().map(move |t| block(t, None));
    let system: Vec<BlockRef<'_>> = match &body["system"] {
        Value::String(text) => vec![BlockRef::Text { text, role: None }],
        Value::Array(a) => a.iter().map(|b| block(b, None)).collect(),
        _ => Vec::new(),
    };
    let messages = body["messages"].as_array().into_iter().flatten().flat_map(move |m| {
        let role = Some(&m["role"]);
        let blocks: Box<dyn Iterator<Item = BlockRef<'_>>> = match &m["content"] {
            Value::String(text) => Box::new(std::iter::once(BlockRef::Text { text, role })),
            Value::Array(a) => Box::new(a.iter().map(move |b| block(b, role))),
            _ => Box::new(std::iter::empty()),
        };
        blocks
    });
    tools.chain(system).chain(messages)
}

impl PromptCache {
    /// Account one request (`total` its estimated input tokens) made at `now`,
    /// whose response begins at `responds_at`. `Err` is the provider's 400 message.
    pub fn account(
        &self,
        body: &Value,
        model: &str,
        total: u64,
        now: Instant,
        responds_at: Instant,
    ) -> Result<(CacheUsage, Shape), String> {
        let blocks = linearise(body);
        check_breakpoints(&blocks)?;
        let tokens = blocks.last().map_or(0, |b| b.tokens);
        // Scale block estimates to the request's own total (the two estimates differ in framing).
        let scale = |t: u64| if tokens == 0 { 0 } else { (t as u128 * total as u128 / tokens as u128) as u64 };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, e| e.expires > now);
        let hit = longest_hit(&mut entries, &blocks, now);
        let read = hit.map_or(0, |a| blocks[a].tokens);
        let read_blocks = hit.map_or(0, |a| a + 1);
        let min = min_cacheable(model);
        let writes = write_breakpoints(&mut entries, &blocks, hit, |t| scale(t) >= min, (now, responds_at));
        let (last_1h, last) = (writes.last_1h.max(read), writes.last.max(read));
        let (read, w1h, w5m) = (scale(read), scale(last_1h) - scale(read), scale(last) - scale(last_1h.max(read)));
        let usage = CacheUsage {
            input_tokens: total.saturating_sub(read + w1h + w5m),
            cache_read: read,
            cache_write_5m: w5m,
            cache_write_1h: w1h,
        };
        let cached_blocks = writes.cached_blocks.max(read_blocks);
        Ok((usage, Shape { chain: blocks.iter().map(|b| b.prefix).collect(), read_blocks, cached_blocks }))
    }
}

/// Automatic prefix caching, as OpenAI documents it for Chat Completions:
/// no markers; a request's prefix is cached once its response begins (for
/// 5 min, refreshed on a hit); a later request reads the longest cached
/// prefix it starts with, counted only from 1,024 tokens and in 128-token
/// steps; nothing is charged for writing. Prefixes are matched at block
/// boundaries (tools, system, each message's parts), which is where an
/// append-only history's shared prefix ends.
#[derive(Default)]
pub struct AutomaticCache {
    entries: Mutex<HashMap<[u8; 32], Cached>>,
}

/// The shortest prefix cached, in tokens.
pub const AUTOMATIC_MIN: u64 = 1024;
/// Cached tokens are counted in steps of this many.
pub const AUTOMATIC_STEP: u64 = 128;

impl AutomaticCache {
    /// Account one request, as [`PromptCache::account`] (a `cache_control`
    /// in it is not read: the API has none).
    pub fn account(&self, body: &Value, total: u64, now: Instant, responds_at: Instant) -> (CacheUsage, Shape) {
        // Its blocks' TTLs are not read: the API has no breakpoints.
        let blocks = linearise(body);
        let tokens = blocks.last().map_or(0, |b| b.tokens);
        let scale = |t: u64| if tokens == 0 { 0 } else { (t as u128 * total as u128 / tokens as u128) as u64 };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, e| e.expires > now);
        let hit =
            (0..blocks.len()).rev().find(|&q| entries.get(&blocks[q].prefix).is_some_and(|e| e.readable_at <= now));
        let counted = |t: u64| if t >= AUTOMATIC_MIN { t / AUTOMATIC_STEP * AUTOMATIC_STEP } else { 0 };
        let read = hit.map_or(0, |a| counted(scale(blocks[a].tokens)));
        if let Some(a) = hit {
            for b in &blocks[..=a] {
                if let Some(e) = entries.get_mut(&b.prefix) {
                    e.expires = now + FIVE_MIN;
                }
            }
        }
        let cacheable = scale(tokens) >= AUTOMATIC_MIN;
        if cacheable {
            for b in &blocks {
                entries.entry(b.prefix).or_insert(Cached {
                    ttl: FIVE_MIN,
                    expires: now + FIVE_MIN,
                    readable_at: responds_at,
                });
            }
        }
        let usage = CacheUsage { input_tokens: total.saturating_sub(read), cache_read: read, ..Default::default() };
        let read_blocks = if read > 0 { hit.map_or(0, |a| a + 1) } else { 0 };
        let cached_blocks = if cacheable { blocks.len() } else { read_blocks };
        (usage, Shape { chain: blocks.iter().map(|b| b.prefix).collect(), read_blocks, cached_blocks })
    }
}

/// The request's prefix as blocks, each with its prefix hash (markers
/// stripped), its running token estimate and its breakpoint TTL.
fn linearise(body: &Value) -> Vec<Block> {
    let mut chain = Sha256::digest(b"flower-sim-cache").into();
    let mut tokens = 0u64;
    let mut blocks = Vec::new();
    let mut text = Vec::new();
    for b in blocks_of(body) {
        let ttl = b.cache_control().map(|cc| if cc["ttl"] == "1h" { ONE_HOUR } else { FIVE_MIN });
        text.clear();
        // Into memory, of JSON values: nothing to fail.
        let _ = serde_json::to_writer(&mut text, &b);
        tokens += estimate_tokens(text.len());
        let mut h = Sha256::new();
        h.update(chain);
        h.update(&text);
        chain = h.finalize().into();
        blocks.push(Block { prefix: chain, tokens, ttl });
    }
    blocks
}

/// The provider's 400 message for breakpoints out of order (a 1-h one after
/// a 5-min one) or too many.
fn check_breakpoints(blocks: &[Block]) -> Result<(), String> {
    let ttls: Vec<Duration> = blocks.iter().filter_map(|b| b.ttl).collect();
    // Longer TTLs first: past the leading 1-h ones, no other.
    if ttls.iter().skip_while(|t| **t == ONE_HOUR).any(|t| *t == ONE_HOUR) {
        return Err("a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block".into());
    }
    if ttls.len() > 4 {
        return Err(format!("A maximum of 4 blocks with cache_control may be provided. Found {}.", ttls.len()));
    }
    Ok(())
}

/// A: the longest prefix found within 20 positions back of any breakpoint
/// (each hit refreshes its entry), as a block index.
fn longest_hit(entries: &mut HashMap<[u8; 32], Cached>, blocks: &[Block], now: Instant) -> Option<usize> {
    let mut hit: Option<usize> = None;
    for (p, b) in blocks.iter().enumerate() {
        if b.ttl.is_none() {
            continue;
        }
        for q in (p.saturating_sub(LOOKBACK - 1)..=p).rev() {
            if let Some(e) = entries.get_mut(&blocks[q].prefix)
                && e.readable_at <= now
            {
                e.expires = now + e.ttl;
                hit = Some(hit.map_or(q, |h: usize| h.max(q)));
                break;
            }
        }
    }
    hit
}

/// What the writes of one request reached.
struct Writes {
    /// Prefix tokens up to the last 1-h breakpoint written (B), 0 if none.
    last_1h: u64,
    /// Prefix tokens up to the last breakpoint written (C), 0 if none.
    last: u64,
    /// Blocks up to the last breakpoint written, 0 if none.
    cached_blocks: usize,
}

/// Writes at every breakpoint after the hit, when `cacheable` (long enough
/// to cache); readable once the response begins (`at` is the request's
/// start and its response's).
fn write_breakpoints(
    entries: &mut HashMap<[u8; 32], Cached>,
    blocks: &[Block],
    hit: Option<usize>,
    cacheable: impl Fn(u64) -> bool,
    (now, responds_at): (Instant, Instant),
) -> Writes {
    let mut writes = Writes { last_1h: 0, last: 0, cached_blocks: 0 };
    for (p, b) in blocks.iter().enumerate() {
        let Some(ttl) = b.ttl else { continue };
        if hit.is_some_and(|a| p <= a) || !cacheable(b.tokens) {
            continue;
        }
        entries.entry(b.prefix).or_insert(Cached { ttl, expires: now + ttl, readable_at: responds_at });
        writes.cached_blocks = writes.cached_blocks.max(p + 1);
        if ttl == ONE_HOUR {
            writes.last_1h = writes.last_1h.max(b.tokens);
        }
        writes.last = writes.last.max(b.tokens);
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn long(n: usize) -> String {
        "word ".repeat(n)
    }

    fn req(system: &str, user: &str, cc_system: Option<&str>) -> Value {
        let mut sys = json!({"type": "text", "text": system});
        if let Some(ttl) = cc_system {
            sys["cache_control"] =
                if ttl == "1h" { json!({"type": "ephemeral", "ttl": "1h"}) } else { json!({"type": "ephemeral"}) };
        }
        json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "system": [sys], "messages": [{"role": "user", "content": user}]})
    }

    fn account(c: &PromptCache, body: &Value, now: Instant) -> CacheUsage {
        let total = estimate_tokens(body.to_string().len());
        c.account(body, "claude-sonnet-4-5", total, now, now).unwrap().0
    }

    /// Provider example: a first request writes the cached system prompt, the
    /// next identical-prefix request reads it.
    #[test]
    fn a_cached_system_prompt_is_written_then_read() {
        let c = PromptCache::default();
        let t0 = Instant::now();
        let first = account(&c, &req(&long(2000), "q1", Some("5m")), t0);
        assert!(first.cache_write_5m > 1024 && first.cache_read == 0, "{first:?}");
        let second = account(&c, &req(&long(2000), "another question", Some("5m")), t0 + Duration::from_secs(1));
        assert!(
            second.cache_read.abs_diff(first.cache_write_5m) <= first.cache_write_5m / 100,
            "{first:?} then {second:?}"
        );
        assert_eq!(second.cache_write_5m, 0);
    }

    /// Provider example: below the minimum cacheable length nothing is cached, no error.
    #[test]
    fn short_prompts_are_not_cached() {
        let c = PromptCache::default();
        let t0 = Instant::now();
        let u = account(&c, &req("short system prompt", "q", Some("5m")), t0);
        assert_eq!((u.cache_read, u.cache_write_5m, u.cache_write_1h), (0, 0, 0));
        assert_eq!(account(&c, &req("short system prompt", "q", Some("5m")), t0).cache_read, 0);
    }

    /// An entry is readable only once the response that wrote it began; it expires after its TTL.
    #[test]
    fn readability_and_expiry() {
        let c = PromptCache::default();
        let t0 = Instant::now();
        let body = req(&long(2000), "q", Some("5m"));
        let total = estimate_tokens(body.to_string().len());
        c.account(&body, "claude-sonnet-4-5", total, t0, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(
            account(&c, &body, t0 + Duration::from_secs(1)).cache_read,
            0,
            "the writer has not begun responding"
        );
        assert!(account(&c, &body, t0 + Duration::from_secs(3)).cache_read > 0);
        assert_eq!(account(&c, &body, t0 + Duration::from_secs(3 + 301)).cache_read, 0, "5 minutes later it expired");
    }

    /// Mixed TTLs: read A, 1-h write B − A, 5-min write C − B; a 1h after a 5m is the provider's 400.
    #[test]
    fn mixed_ttls_split_the_writes_and_order_is_enforced() {
        let c = PromptCache::default();
        let t0 = Instant::now();
        let body = json!({"model": "m", "max_tokens": 1, "system": [
            {"type": "text", "text": long(1500), "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            {"type": "text", "text": long(1500), "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "q"}]});
        let u = account(&c, &body, t0);
        assert!(u.cache_write_1h > 0 && u.cache_write_5m > 0 && u.cache_read == 0, "{u:?}");
        let bad = json!({"model": "m", "max_tokens": 1, "system": [
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": "q"}]});
        assert!(c.account(&bad, "m", 10, t0, t0).unwrap_err().contains("must not come after"));
    }

    /// A breakpoint finds an earlier entry only within 20 blocks.
    #[test]
    fn lookback_is_twenty_blocks() {
        let c = PromptCache::default();
        let t0 = Instant::now();
        let mut messages = vec![
            json!({"role": "user", "content": [{"type": "text", "text": long(1500), "cache_control": {"type": "ephemeral"}}]}),
        ];
        account(&c, &json!({"model": "m", "max_tokens": 1, "messages": messages.clone()}), t0);
        let strip = |m: &mut Vec<Value>| m[0]["content"][0].as_object_mut().unwrap().remove("cache_control");
        strip(&mut messages);
        let tail = |n: usize, tag: &str| -> Vec<Value> {
            (0..n).map(|i| json!({"type": "text", "text": format!("{tag}{i}")})).collect()
        };
        let mut near = messages.clone();
        let mut blocks = tail(19, "near");
        blocks.last_mut().unwrap()["cache_control"] = json!({"type": "ephemeral"});
        near.push(json!({"role": "assistant", "content": blocks}));
        near.push(json!({"role": "user", "content": "x"}));
        assert!(
            account(&c, &json!({"model": "m", "max_tokens": 1, "messages": near}), t0).cache_read > 0,
            "19 blocks back: found"
        );
        let mut far = messages.clone();
        let mut blocks = tail(25, "far");
        blocks.last_mut().unwrap()["cache_control"] = json!({"type": "ephemeral"});
        far.push(json!({"role": "assistant", "content": blocks}));
        far.push(json!({"role": "user", "content": "x"}));
        assert_eq!(
            account(&c, &json!({"model": "m", "max_tokens": 1, "messages": far}), t0).cache_read,
            0,
            "25 blocks back: a silent miss"
        );
    }

    #[test]
    fn automatic_caching_reads_the_shared_prefix_from_1024_tokens_in_128_token_steps() {
        let c = AutomaticCache::default();
        let now = Instant::now();
        let body = |user: &str, extra: Option<&str>| {
            let mut messages = vec![json!({"role": "user", "content": user})];
            if let Some(e) = extra {
                messages.push(json!({"role": "assistant", "content": "ok"}));
                messages.push(json!({"role": "user", "content": e}));
            }
            json!({"model": "gpt-4.1", "max_tokens": 10, "system": long(2000), "messages": messages})
        };
        let total = |b: &Value| estimate_tokens(b.to_string().len());
        let first = body("go", None);
        let (u1, _) = c.account(&first, total(&first), now, now);
        assert_eq!(u1.cache_read, 0, "nothing cached yet");
        assert_eq!(u1.input_tokens, total(&first));
        let second = body("go", Some("more"));
        let (u2, shape) = c.account(&second, total(&second), now, now);
        assert!(u2.cache_read >= AUTOMATIC_MIN && u2.cache_read % AUTOMATIC_STEP == 0, "{u2:?}");
        assert!(u2.cache_read <= total(&first));
        assert_eq!(u2.cache_read + u2.input_tokens, total(&second));
        assert_eq!((u2.cache_write_5m, u2.cache_write_1h), (0, 0), "writes are not charged");
        assert_eq!(shape.read_blocks, 2, "system and the first user message");
        // A short prompt is never cached.
        let short = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        c.account(&short, total(&short), now, now);
        assert_eq!(c.account(&short, total(&short), now, now).0.cache_read, 0);
        // Entries expire after 5 minutes without a hit.
        let later = now + Duration::from_secs(301);
        assert_eq!(c.account(&second, total(&second), later, later).0.cache_read, 0);
    }
}
