//! A worker's slot, lent while a task's model call waits for its route's
//! turn (docs/design.md section 15, "Rate limits"): the worker runs each task
//! inside [`Slot::scope`]; a call told to wait gives the slot back for the
//! wait ([`lent`]), so the worker may take another task meanwhile — one of
//! another route, or a more urgent one that goes first in the route's line —
//! and takes a slot again before it asks for its turn once more. A worker
//! keeps at most [`RESIDENT_PER_SLOT`] tasks per slot in hand, waiting or
//! running.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Tasks a worker holds per slot at most (the running ones and those
/// waiting for their route without a slot).
pub const RESIDENT_PER_SLOT: usize = 4;

/// Waits shorter than this keep the slot (lending it would cost more than it gives).
pub const LEND_FROM: Duration = Duration::from_millis(250);

tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// A worker's slots. A loop takes one before it waits for a message and
/// parks it meanwhile ([`Slots::park`]); a task back from its wait takes a
/// free slot or else a parked one — else it could wait behind loops idling
/// for messages that never come — and a loop whose slot was taken takes
/// another before it runs the message it got.
pub struct Slots {
    permits: Arc<Semaphore>,
    parked: Mutex<Vec<(u64, OwnedSemaphorePermit)>>,
    next: AtomicU64,
    parking: Notify,
}

impl Slots {
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(n)),
            parked: Mutex::default(),
            next: AtomicU64::new(0),
            parking: Notify::new(),
        })
    }

    /// A free slot (`None`: closed).
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, OwnedSemaphorePermit)>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Park an idle loop's slot: a task back from its wait may take it.
    pub fn park(&self, permit: OwnedSemaphorePermit) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().push((id, permit));
        self.parking.notify_waiters();
        id
    }

    /// The parked slot back, unless a task took it.
    pub fn unpark(&self, id: u64) -> Option<OwnedSemaphorePermit> {
        let mut parked = self.lock();
        let at = parked.iter().position(|(i, _)| *i == id)?;
        Some(parked.swap_remove(at).1)
    }

    /// A slot for a task back from its wait: a free one, or a parked one.
    async fn take_back(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            let parking = self.parking.notified();
            tokio::pin!(parking);
            parking.as_mut().enable();
            if let Ok(p) = self.permits.clone().try_acquire_owned() {
                return Some(p);
            }
            if let Some((_, p)) = self.lock().pop() {
                return Some(p);
            }
            tokio::select! {
                p = self.permits.clone().acquire_owned() => return p.ok(),
                _ = parking => {}
            }
        }
    }
}

/// The slot a task runs in: the worker's slots and the one it holds now.
pub struct Slot {
    slots: Arc<Slots>,
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Slot {
    pub fn new(slots: Arc<Slots>, permit: OwnedSemaphorePermit) -> Arc<Self> {
        Arc::new(Self { slots, held: Mutex::new(Some(permit)) })
    }

    /// Run `f` (a task) in this slot: its waits for a route's turn lend it.
    pub async fn scope<F: Future>(self: Arc<Self>, f: F) -> F::Output {
        SLOT.scope(self, f).await
    }

    fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn put(&self, permit: OwnedSemaphorePermit) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(permit);
    }
}

/// Sleep `pause`, the task's slot (when it runs in one and the pause is
/// long enough) lent meanwhile and taken back after.
pub async fn lent(pause: Duration) {
    let slot = SLOT.try_with(Arc::clone).ok().filter(|_| pause >= LEND_FROM);
    let permit = slot.as_ref().and_then(|s| s.take());
    let lending = permit.is_some();
    drop(permit);
    tokio::time::sleep(pause).await;
    if let (true, Some(slot)) = (lending, slot) {
        // Closed only when the worker is gone: the task then goes on without.
        if let Some(permit) = slot.slots.take_back().await {
            slot.put(permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_lends_the_slot_and_takes_one_back() {
        let slots = Slots::new(1);
        let slot = Slot::new(slots.clone(), slots.acquire().await.unwrap());
        let inside = slots.clone();
        let task = tokio::spawn(slot.scope(async move {
            lent(Duration::from_secs(5)).await;
            inside.permits.available_permits()
        }));
        tokio::task::yield_now().await;
        // Lent: a loop takes it and parks it while it idles for a message...
        let other = slots.permits.clone().try_acquire_owned().expect("the slot is lent");
        let parked = slots.park(other);
        tokio::time::sleep(Duration::from_secs(6)).await;
        // ...and the task back from its wait takes it.
        assert_eq!(task.await.unwrap(), 0, "it holds its slot again");
        assert!(slots.unpark(parked).is_none(), "the loop takes another before it runs its message");
        assert_eq!(slots.permits.available_permits(), 1, "and the task gives it back when it ends");

        // A short wait keeps the slot; outside a slot nothing is lent.
        let slot = Slot::new(slots.clone(), slots.acquire().await.unwrap());
        let inside = slots.clone();
        let kept = slot
            .scope(async move {
                lent(Duration::from_millis(10)).await;
                inside.permits.available_permits()
            })
            .await;
        assert_eq!(kept, 0);
        lent(Duration::from_secs(1)).await;
    }
}
