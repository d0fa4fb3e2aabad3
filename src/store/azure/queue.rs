//! [`QueueStore`] on `azure_storage_queues`.
//!
//! Message text is passed through as-is (the crate adds no Base64; the engine encodes
//! itself). Limits are checked before any I/O. Durations are sent in whole seconds, rounded
//! up (the crate truncates, which turns 500 ms into an invalid 0).

use std::time::Duration;

use async_trait::async_trait;
use azure_storage_queues::{PopReceipt, QueueClient};

use super::error::map_error;
use super::{check_queue_name, AzureStore};
use crate::store::error::{StoreError, StoreResult};
use crate::store::queue::{validate_message, validate_receive, QueueStore, ReceivedMessage};

/// How long a message lives once visible (the service default, 7 days).
const MESSAGE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl AzureStore {
    fn queue_client(&self, queue: &str) -> StoreResult<QueueClient> {
        check_queue_name(queue)?;
        Ok(self.queues.queue_client(queue))
    }
}

#[async_trait]
impl QueueStore for AzureStore {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        let client = &self.queue_client(queue)?;
        self.retry
            .run_idempotent("create queue", |e| matches!(e, StoreError::AlreadyExists(_)), || client.create())
            .await
    }

    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        let client = &self.queue_client(queue)?;
        self.retry.run_idempotent("delete queue", |e| matches!(e, StoreError::NotFound(_)), || client.delete()).await
    }

    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        const WHAT: &str = "put message";
        validate_message(text, visible_after)?;
        let client = &self.queue_client(queue)?;
        let delay = ceil_secs(visible_after);
        // A retried put can duplicate the message (at-least-once; consumers are idempotent).
        let out = self
            .retry
            .run(WHAT, || async move {
                let mut request = client.put_message(text);
                if delay > 0 {
                    // The delay must stay below the time to live: live 7 days once visible.
                    request = request
                        .visibility_timeout(Duration::from_secs(delay))
                        .ttl(MESSAGE_TTL + Duration::from_secs(delay));
                }
                let response = request.await.map_err(|e| map_error(&e, WHAT))?;
                Ok(response.queue_message.message_id)
            })
            .await;
        out.result
    }

    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        const WHAT: &str = "receive messages";
        validate_receive(max, visibility)?;
        let client = &self.queue_client(queue)?;
        let count =
            u8::try_from(max).map_err(|_| StoreError::InvalidInput(format!("receive: {max} messages requested")))?;
        let hide = Duration::from_secs(ceil_secs(visibility));
        let out = self
            .retry
            .run(WHAT, || async move {
                let response = client
                    .get_messages()
                    .number_of_messages(count)
                    .visibility_timeout(hide)
                    .await
                    .map_err(|e| map_error(&e, WHAT))?;
                Ok(response
                    .messages
                    .into_iter()
                    .map(|m| ReceivedMessage {
                        id: m.message_id,
                        pop_receipt: m.pop_receipt,
                        dequeue_count: u32::try_from(m.dequeue_count).unwrap_or(u32::MAX),
                        text: m.message_text,
                    })
                    .collect())
            })
            .await;
        out.result
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        const WHAT: &str = "delete message";
        let client = &self.queue_client(queue)?.pop_receipt_client(PopReceipt::new(id, pop_receipt));
        let out = self
            .retry
            .run(WHAT, || async move { client.delete().await.map(|_| ()).map_err(|e| map_error(&e, WHAT)) })
            .await;
        match out.result {
            // Gone after a transient failure: our own first attempt deleted it.
            Err(StoreError::NotFound(_)) if out.after_transient => Ok(()),
            other => other,
        }
    }

    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        const WHAT: &str = "release message";
        validate_message(text, visible_after)?;
        let client = &self.queue_client(queue)?.pop_receipt_client(PopReceipt::new(id, pop_receipt));
        let delay = Duration::from_secs(ceil_secs(visible_after));
        let out = self
            .retry
            .run(WHAT, || async move {
                // The crate always sends a body, so the original text goes back with it.
                let response = client.update(text, delay).await.map_err(|e| map_error(&e, WHAT))?;
                Ok(response.pop_receipt)
            })
            .await;
        out.result
    }

    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        const WHAT: &str = "queue length";
        let client = &self.queue_client(queue)?;
        let out = self
            .retry
            .run(WHAT, || async move {
                let response = client.get_metadata().await.map_err(|e| map_error(&e, WHAT))?;
                Ok(response.approximate_messages_count as u64)
            })
            .await;
        out.result
    }
}
