//! The in-process bus of the embedded mode: a work queue with acks, naks and
//! redelivery, publish dedupe, and a broadcast notice stream.
//!
//! A delivery dropped without an ack (its task panicked or was aborted) is
//! redelivered at once, as JetStream redelivers after the ack wait.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, broadcast};

use crate::{BusError, Delivery, Notice, NoticeStream, Notifier, Result, TaskMessage, TaskQueue};

/// How long a dedupe id is remembered (JetStream's default window).
const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

#[derive(Default)]
struct QueueState {
    ready: VecDeque<(TaskMessage, u32)>,
    /// Delivered and not yet settled, or nak'ed and waiting out the delay.
    in_flight: usize,
    seen: HashMap<String, Instant>,
    closed: bool,
}

struct Shared {
    state: Mutex<QueueState>,
    wake: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A delivery given back (nak'ed or abandoned) waits again.
    fn requeue(&self, msg: TaskMessage, delivered: u32) {
        {
            let mut st = self.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
            st.ready.push_back((msg, delivered));
        }
        self.wake.notify_one();
    }

    /// A delivery acked or terminated: gone for good.
    fn settled(&self) {
        let mut st = self.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
    }
}

#[derive(Clone)]
pub struct MemoryBus {
    shared: Arc<Shared>,
    notices: broadcast::Sender<Notice>,
}

impl Default for MemoryBus {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBus {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared { state: Mutex::new(QueueState::default()), wake: Notify::new() }),
            notices: broadcast::channel(4096).0,
        }
    }

    /// Publish a task that earlier deliveries (in a process that died) already
    /// reached `prior` times: its next delivery counts `prior + 1`, so the
    /// store's attempt claim sees a new attempt.
    pub fn publish_resumed(&self, task: TaskMessage, prior: u32) -> bool {
        {
            let mut st = self.shared.lock();
            if st.closed || st.seen.insert(task.dedupe_id(), Instant::now()).is_some() {
                return false;
            }
            st.ready.push_back((task, prior));
        }
        self.shared.wake.notify_one();
        true
    }

    /// Stop handing out deliveries: every waiting `next` returns `Closed`.
    pub fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_waiters();
    }

    /// Messages waiting to be delivered.
    pub fn pending(&self) -> usize {
        self.shared.lock().ready.len()
    }
}

#[async_trait]
impl TaskQueue for MemoryBus {
    async fn publish(&self, task: TaskMessage) -> Result<bool> {
        {
            let mut st = self.shared.lock();
            if st.closed {
                return Err(BusError::Closed);
            }
            let now = Instant::now();
            st.seen.retain(|_, at| now.duration_since(*at) < DEDUPE_WINDOW);
            if st.seen.insert(task.dedupe_id(), now).is_some() {
                return Ok(false);
            }
            st.ready.push_back((task, 0));
        }
        self.shared.wake.notify_one();
        Ok(true)
    }

    async fn next(&self) -> Result<Box<dyn Delivery>> {
        loop {
            let notified = self.shared.wake.notified();
            {
                let mut st = self.shared.lock();
                if st.closed {
                    return Err(BusError::Closed);
                }
                if let Some((msg, delivered)) = st.ready.pop_front() {
                    st.in_flight += 1;
                    if !st.ready.is_empty() {
                        // Pass the baton: another consumer may be waiting.
                        self.shared.wake.notify_one();
                    }
                    return Ok(Box::new(MemoryDelivery {
                        shared: self.shared.clone(),
                        msg,
                        delivered: delivered + 1,
                        settled: Mutex::new(false),
                    }));
                }
            }
            notified.await;
        }
    }

    async fn lag(&self) -> Result<u64> {
        let st = self.shared.lock();
        Ok((st.ready.len() + st.in_flight) as u64)
    }
}

#[async_trait]
impl Notifier for MemoryBus {
    async fn notify(&self, notice: Notice) -> Result<()> {
        // No subscriber is fine: notices are hints.
        let _ = self.notices.send(notice);
        Ok(())
    }

    fn subscribe(&self) -> NoticeStream {
        NoticeStream::new(self.notices.subscribe())
    }
}

struct MemoryDelivery {
    shared: Arc<Shared>,
    msg: TaskMessage,
    delivered: u32,
    settled: Mutex<bool>,
}

impl MemoryDelivery {
    /// Mark settled; false if it already was (a second ack is a no-op).
    fn settle(&self) -> bool {
        let mut s = self.settled.lock().unwrap_or_else(|p| p.into_inner());
        !std::mem::replace(&mut *s, true)
    }
}

#[async_trait]
impl Delivery for MemoryDelivery {
    fn message(&self) -> &TaskMessage {
        &self.msg
    }
    fn delivered(&self) -> u32 {
        self.delivered
    }
    async fn ack(&self) -> Result<()> {
        if self.settle() {
            self.shared.settled();
        }
        Ok(())
    }
    async fn nak(&self, delay: Option<Duration>) -> Result<()> {
        if self.settle() {
            let (shared, msg, n) = (self.shared.clone(), self.msg.clone(), self.delivered);
            match delay {
                Some(d) if !d.is_zero() => {
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        shared.requeue(msg, n);
                    });
                }
                _ => shared.requeue(msg, n),
            }
        }
        Ok(())
    }
    async fn progress(&self) -> Result<()> {
        Ok(())
    }
    async fn term(&self) -> Result<()> {
        if self.settle() {
            self.shared.settled();
        }
        Ok(())
    }
}

impl Drop for MemoryDelivery {
    fn drop(&mut self) {
        if self.settle() {
            self.shared.requeue(self.msg.clone(), self.delivered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::msg;

    #[tokio::test]
    async fn publish_is_deduplicated() {
        let bus = MemoryBus::new();
        let m = msg();
        assert!(bus.publish(m.clone()).await.unwrap());
        assert!(!bus.publish(m.clone()).await.unwrap());
        assert!(bus.publish(TaskMessage { epoch: 2, ..m }).await.unwrap(), "a new epoch is a new dispatch");
        assert_eq!(bus.pending(), 2);
    }

    #[tokio::test]
    async fn close_wakes_consumers() {
        let bus = MemoryBus::new();
        let b = bus.clone();
        let waiter = tokio::spawn(async move { b.next().await.err() });
        tokio::task::yield_now().await;
        bus.close();
        assert!(matches!(waiter.await.unwrap(), Some(BusError::Closed)));
    }
}
