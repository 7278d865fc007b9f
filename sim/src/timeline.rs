//! The request timeline (`flower sim --timeline FILE`): one JSON line per
//! Messages request, with when it arrived and when its answer was ready, in
//! microseconds since the Unix epoch — the clock every process on the
//! machine shares, so benchmarks read orchestration overheads across
//! separate processes from it (`bench/peers`).
//!
//! A line: `{"in": µs, "out": µs, "first": <the first user text, at most 80
//! chars>, "results": [tool_use ids answered in the last message],
//! "calls": [{"id", "prompt"}] of the answer's tool calls}`. Lines are written
//! by a thread of their own, never on the server's async threads, in batches
//! every [`FLUSH_EVERY`]: logging a line wakes no thread, so the answer it
//! stamps goes out without a switch to the writer in between (the timeline
//! must not weigh on the instants it records).

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

use serde_json::{Value, json};

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// How often the writer takes the lines logged since it last looked.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

pub struct Timeline {
    lines: std::sync::Mutex<Option<mpsc::Sender<String>>>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Timeline {
    /// Write to `path` (created or truncated).
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let (tx, rx) = mpsc::channel::<String>();
        let writer = std::thread::Builder::new().name("sim-timeline".into()).spawn(move || {
            // A reader sees every answered request within FLUSH_EVERY of it.
            loop {
                std::thread::sleep(FLUSH_EVERY);
                loop {
                    match rx.try_recv() {
                        Ok(line) => {
                            let _ = writeln!(file, "{line}");
                        }
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => {
                            let _ = file.flush();
                            return;
                        }
                    }
                }
                let _ = file.flush();
            }
        })?;
        Ok(Self { lines: std::sync::Mutex::new(Some(tx)), writer: std::sync::Mutex::new(Some(writer)) })
    }

    /// Stop taking lines and wait until every line taken is in the file.
    pub fn close(&self) {
        drop(self.lines.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(w) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = w.join();
        }
    }

    /// Record one answered request (`body` in the Messages shape, `content` the answer's blocks).
    pub fn record(&self, arrived: u64, body: &Value, content: &[Value]) {
        let line = json!({"in": arrived, "out": now_us(), "first": first_text(body), "results": results(body), "calls": calls(content)});
        if let Some(tx) = &*self.lines.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = tx.send(line.to_string());
        }
    }
}

fn text_of(content: &Value) -> Option<&str> {
    match content {
        Value::String(s) => Some(s),
        Value::Array(blocks) => blocks.iter().find_map(|b| (b["type"] == "text").then(|| b["text"].as_str()).flatten()),
        _ => None,
    }
}

fn first_text(body: &Value) -> String {
    let first = body["messages"].as_array().and_then(|m| m.iter().find(|m| m["role"] == "user"));
    first.and_then(|m| text_of(&m["content"])).unwrap_or_default().chars().take(80).collect()
}

fn results(body: &Value) -> Vec<String> {
    let last = body["messages"].as_array().and_then(|m| m.last());
    let blocks = last.and_then(|m| m["content"].as_array()).map(Vec::as_slice).unwrap_or_default();
    blocks
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .filter_map(|b| b["tool_use_id"].as_str().map(String::from))
        .collect()
}

fn calls(content: &[Value]) -> Vec<Value> {
    content
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| json!({"id": b["id"], "prompt": b["input"]["prompt"]}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_first_text_the_results_and_the_calls() {
        let body = json!({"messages": [
            {"role": "user", "content": "task 7: do it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Agent", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
        ]});
        let content =
            vec![json!({"type": "tool_use", "id": "toolu_2", "name": "Agent", "input": {"prompt": "task 8"}})];
        assert_eq!(first_text(&body), "task 7: do it");
        assert_eq!(results(&body), vec!["toolu_1"]);
        assert_eq!(calls(&content), vec![json!({"id": "toolu_2", "prompt": "task 8"})]);
        let blocks = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "in blocks"}]}]});
        assert_eq!(first_text(&blocks), "in blocks");
    }

    #[test]
    fn lines_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let t = Timeline::create(&path).unwrap();
        let before = now_us();
        t.record(before, &json!({"messages": [{"role": "user", "content": "hi"}]}), &[]);
        t.close();
        let line = std::fs::read_to_string(&path).unwrap();
        assert_eq!(line.lines().count(), 1, "{line}");
        let v: Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(v["first"], "hi");
        assert!(v["out"].as_u64().unwrap() >= before && v["in"].as_u64() == Some(before));
    }
}
