//! Queue operations: the [`QueueStore`] trait, [`Store`] (tables and queues together) and
//! the checks every backend makes before I/O.

use std::time::Duration;

use async_trait::async_trait;

use super::error::{StoreError, StoreResult};
use super::table::TableStore;

/// Most messages one queue receive returns (Azure: 32).
pub const MAX_RECEIVE: usize = 32;
/// Largest queue message text, in bytes of UTF-8 (Azure: 64 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// A message received from a queue, invisible to others until its visibility timeout ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// Service-assigned message id (stable across redeliveries).
    pub id: String,
    /// Receipt required to delete or update this delivery; replaced by every receive/update.
    pub pop_receipt: String,
    /// How many times the message has been received, this delivery included (1 on first).
    pub dequeue_count: u32,
    /// The message text as stored (callers choose the encoding, e.g. Base64).
    pub text: String,
}

/// Queue operations. Queue names are lowercase letters, digits and single dashes, 3-63
/// characters.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Creates the queue if it does not exist (idempotent).
    async fn create_queue(&self, queue: &str) -> StoreResult<()>;

    /// Deletes the queue; a missing queue is not an error.
    async fn delete_queue(&self, queue: &str) -> StoreResult<()>;

    /// Appends a message that becomes visible after `visible_after` (0 s to 7 days). The
    /// text must be at most [`MAX_MESSAGE_BYTES`]; returns the message id.
    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String>;

    /// Receives up to `max` (1..=32) visible messages and hides them for `visibility`
    /// (1 s to 7 days), incrementing their dequeue count. No ordering is guaranteed.
    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>>;

    /// Deletes a received message; `PreconditionFailed` for a stale pop receipt, `NotFound`
    /// when it is already gone.
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()>;

    /// Makes a received message visible again after `visible_after`, keeping its text.
    /// Returns the new pop receipt.
    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String>;

    /// Approximate number of messages (visible or not).
    async fn approximate_count(&self, queue: &str) -> StoreResult<u64>;
}

/// A backend providing both tables and queues.
pub trait Store: TableStore + QueueStore {}
impl<T: TableStore + QueueStore> Store for T {}

/// Checks a pop receipt against the message's current one: `PreconditionFailed` when the
/// receipt is stale.
pub(crate) fn check_pop_receipt(current: &str, pop_receipt: &str) -> StoreResult<()> {
    if current == pop_receipt {
        Ok(())
    } else {
        Err(StoreError::PreconditionFailed("pop receipt does not match (PopReceiptMismatch)".into()))
    }
}

/// Checks queue-message rules before I/O.
pub fn validate_message(text: &str, visible_after: Duration) -> StoreResult<()> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "queue message: {} bytes, the limit is {MAX_MESSAGE_BYTES}",
            text.len()
        )));
    }
    if visible_after > Duration::from_secs(7 * 24 * 3600) {
        return Err(StoreError::InvalidInput("queue message: visibility delay over 7 days".into()));
    }
    Ok(())
}

/// Checks receive parameters before I/O (Azure: 1..=32 messages, visibility 1 s..7 days).
pub fn validate_receive(max: usize, visibility: Duration) -> StoreResult<()> {
    if max == 0 || max > MAX_RECEIVE {
        return Err(StoreError::InvalidInput(format!("receive: {max} messages requested, allowed 1..={MAX_RECEIVE}")));
    }
    if visibility < Duration::from_secs(1) || visibility > Duration::from_secs(7 * 24 * 3600) {
        return Err(StoreError::InvalidInput(
            "receive: visibility timeout must be 1 s to 7 days (whole seconds)".into(),
        ));
    }
    Ok(())
}

/// Checks a queue name before I/O: 3-63 lowercase letters, digits and single dashes,
/// starting and ending with a letter or digit.
pub fn check_queue_name(queue: &str) -> StoreResult<()> {
    let ok = (3..=63).contains(&queue.len())
        && queue.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !queue.starts_with('-')
        && !queue.ends_with('-')
        && !queue.contains("--");
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "queue name {queue:?} is invalid: 3-63 lowercase letters, digits and single dashes"
        )))
    }
}
