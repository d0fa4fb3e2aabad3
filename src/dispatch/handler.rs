//! What a queue's handler is given and what it answers ([`Handler`]): the meaning of the
//! messages of one queue, without their transport.

use async_trait::async_trait;

use crate::error::Result;

/// One delivery of a message, decoded.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The message text after Base64 decoding.
    pub text: &'a str,
    /// The queue's message id (stable across redeliveries).
    pub id: &'a str,
    /// Deliveries so far, this one included (1 on the first).
    pub dequeue_count: u32,
}

/// What a handler made of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The work is done; the line is logged (and returned to the Functions host).
    Done(String),
    /// The message can never succeed: it goes to the poison queue with this reason.
    Rejected(String),
}

/// The meaning of the messages of one queue.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles one delivery. `Err` means "may succeed later": the message is retried.
    async fn handle(&self, delivery: Delivery<'_>) -> Result<Handled>;

    /// Called once a message is given up on: it failed `maxDequeueCount` times (its last
    /// failing delivery), so the host or the worker moves it to the poison queue with
    /// `reason`. Lets the handler record the failure where users look (e.g. a job's state).
    async fn on_poisoned(&self, _delivery: Delivery<'_>, _reason: &str) {}

    /// Notified when new work was put on the queue by this process, so an in-process worker
    /// receives at once instead of at its next poll. `None`: poll only.
    fn wake(&self) -> Option<&tokio::sync::Notify> {
        None
    }
}
