//! A gate in front of Postgres for fault tests: the cluster's processes reach
//! the test database through it, so one test can take "Postgres" down for its
//! own processes without touching the server every other test shares.
//!
//! Down means what a stopped server means to a client: every open connection
//! is cut and new ones are refused until the gate opens again. The gate can
//! also trip on a statement: when a client sends one whose text contains a
//! pattern, that connection is cut before the statement reaches the server
//! (it is not executed) and the gate stays down for a while — "Postgres
//! stopped while this was being saved".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Trip {
    pattern: Vec<u8>,
    down_for: Duration,
    tripped: Option<tokio::sync::oneshot::Sender<()>>,
}

struct State {
    /// Bumped when the gate goes down: connections of an older generation end.
    generation: watch::Sender<u64>,
    up: Mutex<bool>,
    trip: Mutex<Option<Trip>>,
}

/// Bytes only the write of a task's end sends: its `task_finished` event,
/// inserted in the same transaction as the report (cut there, the report is
/// not committed).
pub const REPORT_WRITE: &str = "task_finished";

pub struct PgGate {
    pub addr: std::net::SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl PgGate {
    /// Listen on a free loopback port, forwarding to `upstream` (host:port).
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State { generation: watch::channel(0).0, up: Mutex::new(true), trip: Mutex::new(None) });
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                if !*st.up.lock().unwrap() {
                    drop(client); // refused: the server is "down"
                    continue;
                }
                let st = st.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move { forward(client, upstream, st).await });
            }
        });
        Self { addr, state, accept }
    }

    /// `url` with its host:port replaced by the gate's.
    pub fn url(&self, url: &str) -> String {
        let (head, rest) = url.split_once('@').unwrap();
        let (_, tail) = rest.split_once('/').unwrap();
        format!("{head}@{}/{tail}", self.addr)
    }

    /// Down now: cut every connection, refuse new ones.
    pub fn down(&self) {
        down(&self.state);
    }

    pub fn up(&self) {
        *self.state.up.lock().unwrap() = true;
    }

    /// Trip on the next statement containing `pattern`: that statement is not
    /// executed, the gate goes down for `down_for`, then up again. The
    /// receiver fires when it tripped.
    pub fn trip_on(&self, pattern: &str, down_for: Duration) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.state.trip.lock().unwrap() =
            Some(Trip { pattern: pattern.as_bytes().to_vec(), down_for, tripped: Some(tx) });
        rx
    }
}

impl Drop for PgGate {
    fn drop(&mut self) {
        self.accept.abort();
        down(&self.state);
    }
}

fn down(state: &State) {
    *state.up.lock().unwrap() = false;
    state.generation.send_modify(|g| *g += 1);
}

async fn forward(mut client: TcpStream, upstream: String, st: Arc<State>) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
    let mut gen_rx = st.generation.subscribe();
    gen_rx.mark_unchanged();
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let mut cbuf = vec![0u8; 64 * 1024];
    let mut sbuf = vec![0u8; 64 * 1024];
    // The end of the previous client read, so a pattern split across reads is seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            n = cr.read(&mut cbuf) => {
                let Ok(n) = n else { return };
                if n == 0 { return; }
                let mut seen = std::mem::take(&mut tail);
                seen.extend_from_slice(&cbuf[..n]);
                if tripped(&st, &seen) { return; }
                tail = seen[seen.len().saturating_sub(256)..].to_vec();
                if sw.write_all(&cbuf[..n]).await.is_err() { return; }
            }
            n = sr.read(&mut sbuf) => {
                let Ok(n) = n else { return };
                if n == 0 { return; }
                if cw.write_all(&sbuf[..n]).await.is_err() { return; }
            }
            _ = gen_rx.changed() => return,
        }
    }
}

/// Whether `bytes` trip the armed pattern; if so the gate goes down and a
/// timer brings it up again.
fn tripped(st: &Arc<State>, bytes: &[u8]) -> bool {
    let mut trip = st.trip.lock().unwrap();
    let Some(t) = trip.as_mut() else { return false };
    if !bytes.windows(t.pattern.len()).any(|w| w == t.pattern.as_slice()) {
        return false;
    }
    let t = trip.take().unwrap();
    drop(trip);
    down(st);
    if let Some(tx) = t.tripped {
        let _ = tx.send(());
    }
    let st = st.clone();
    tokio::spawn(async move {
        tokio::time::sleep(t.down_for).await;
        *st.up.lock().unwrap() = true;
    });
    true
}
