//! A worker's slot, lent while a task's model call waits for its route's
//! turn (docs/design.md section 15, "Rate limits"): the worker runs each task
//! inside [`Slot::scope`]; a call told to wait gives the slot back for the
//! wait ([`lent`]), so the worker may take another task meanwhile — one of
//! another route, or a more urgent one that goes first in the route's line —
//! and takes a slot again before it asks for its turn once more. A worker
//! keeps at most [`RESIDENT_PER_SLOT`] tasks per slot in hand, waiting or
//! running.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Tasks a worker holds per slot at most (the running ones and those
/// waiting for their route without a slot).
pub const RESIDENT_PER_SLOT: usize = 4;

/// Waits shorter than this keep the slot (lending it would cost more than it gives).
pub const LEND_FROM: Duration = Duration::from_millis(250);

tokio::task_local! {
    static SLOT: Arc<Slot>;
}

/// The slot a task runs in: the worker's slots and the one it holds now.
pub struct Slot {
    slots: Arc<Semaphore>,
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Slot {
    pub fn new(slots: Arc<Semaphore>, permit: OwnedSemaphorePermit) -> Arc<Self> {
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
        if let Ok(permit) = slot.slots.clone().acquire_owned().await {
            slot.put(permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_lends_the_slot_and_takes_one_back() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = Slot::new(slots.clone(), slots.clone().acquire_owned().await.unwrap());
        let inside = slots.clone();
        let task = tokio::spawn(slot.scope(async move {
            lent(Duration::from_secs(5)).await;
            inside.available_permits()
        }));
        tokio::task::yield_now().await;
        // Lent: another task may run in it meanwhile.
        let other = slots.clone().try_acquire_owned().expect("the slot is lent");
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!task.is_finished(), "the waiting task takes a slot back before it goes on");
        drop(other);
        assert_eq!(task.await.unwrap(), 0, "it holds its slot again");
        assert_eq!(slots.available_permits(), 1, "and gives it back when it ends");

        // A short wait keeps the slot; outside a slot nothing is lent.
        let slot = Slot::new(slots.clone(), slots.clone().acquire_owned().await.unwrap());
        let inside = slots.clone();
        let kept = slot
            .scope(async move {
                lent(Duration::from_millis(10)).await;
                inside.available_permits()
            })
            .await;
        assert_eq!(kept, 0);
        lent(Duration::from_secs(1)).await;
    }
}
