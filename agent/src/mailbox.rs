//! Messages for a running session from outside: a user's interrupt, and the
//! late reports of calls the interrupt left running. Both are taken in before
//! the next model call; an arriving message also wakes a session waiting on
//! its tool calls, so an interrupt is delivered at once.

use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Default)]
pub struct Mailbox {
    messages: Mutex<Vec<String>>,
    notices: Mutex<Vec<String>>,
    wake: Notify,
    answers: Notify,
}

impl Mailbox {
    /// A user's message (appended as a user message).
    pub fn push(&self, text: String) {
        self.messages.lock().unwrap_or_else(|p| p.into_inner()).push(text);
        self.wake.notify_one();
    }

    /// A report that arrived after its call was answered with a placeholder
    /// (appended as a notice).
    pub fn push_notice(&self, text: String) {
        self.notices.lock().unwrap_or_else(|p| p.into_inner()).push(text);
    }

    pub fn take_messages(&self) -> Vec<String> {
        std::mem::take(&mut *self.messages.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// An answer to a question of this job was stored: wakes the `ask` call
    /// waiting for it (it reads the answer from the store).
    pub fn answer_arrived(&self) {
        self.answers.notify_one();
    }

    /// Resolves on the next [`Mailbox::answer_arrived`] (or at once if one
    /// came since the last wait).
    pub async fn answer_notice(&self) {
        self.answers.notified().await;
    }

    /// Resolves once a user's message is waiting.
    pub async fn message_arrived(&self) {
        loop {
            if !self.messages.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                return;
            }
            self.wake.notified().await;
        }
    }
}
