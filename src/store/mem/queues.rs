//! Queues of the in-memory store: messages with a visibility time, a dequeue count and the
//! pop receipt of their latest delivery.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::env::Instant;
use async_trait::async_trait;

use super::state::{MemStore, Message, Queue, State};
use crate::store::error::{message_not_found, queue_not_found, StoreResult};
use crate::store::queue::{
    check_pop_receipt, check_queue_name, validate_message, validate_receive, QueueStore, ReceivedMessage,
};

/// "Now" for visibility timeouts ([`crate::env::now`]: the paused, auto-advancing clock of
/// the simulator, real time elsewhere). The only place this store reads time.
fn now() -> Instant {
    crate::env::now()
}

/// Queue `name` of `queues`; `NotFound` when there is none. (A function of the map, not of
/// [`State`], so the counters can be borrowed beside it.)
fn find_queue<'a>(queues: &'a mut BTreeMap<String, Queue>, name: &str) -> StoreResult<&'a mut Queue> {
    queues.get_mut(name).ok_or_else(|| queue_not_found(name))
}

impl Queue {
    /// Message `id` if `pop_receipt` is its latest receipt: `NotFound` for a missing
    /// message, `PreconditionFailed` for a stale receipt.
    fn delivered(&mut self, id: &str, pop_receipt: &str) -> StoreResult<&mut Message> {
        let message = self.messages.get_mut(id).ok_or_else(|| message_not_found(id))?;
        check_pop_receipt(&message.pop_receipt, pop_receipt)?;
        Ok(message)
    }
}

#[async_trait]
impl QueueStore for MemStore {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        check_queue_name(queue)?;
        self.with(|s| {
            s.queues.entry(queue.to_string()).or_default();
        });
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        self.with(|s| s.queues.remove(queue));
        Ok(())
    }

    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        self.with(|State { queues, counters, .. }| {
            let q = find_queue(queues, queue)?;
            let (seq, id) = counters.message_id();
            let message = Message {
                seq,
                text: text.to_string(),
                visible_at: now() + visible_after,
                dequeue_count: 0,
                pop_receipt: counters.pop_receipt(),
            };
            q.messages.insert(id.clone(), message);
            Ok(id)
        })
    }

    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        validate_receive(max, visibility)?;
        self.with(|State { queues, counters, .. }| {
            let now = now();
            let q = find_queue(queues, queue)?;
            let mut visible: Vec<(&String, &mut Message)> =
                q.messages.iter_mut().filter(|(_, m)| m.visible_at <= now).collect();
            visible.sort_by_key(|(_, m)| (m.visible_at, m.seq));
            // The service takes the timeout in whole seconds.
            let hidden_until = now + Duration::from_secs(visibility.as_secs());
            Ok(visible
                .into_iter()
                .take(max)
                .map(|(id, m)| {
                    m.visible_at = hidden_until;
                    m.dequeue_count = m.dequeue_count.saturating_add(1);
                    m.pop_receipt = counters.pop_receipt();
                    ReceivedMessage {
                        id: id.clone(),
                        pop_receipt: m.pop_receipt.clone(),
                        dequeue_count: m.dequeue_count,
                        text: m.text.clone(),
                    }
                })
                .collect())
        })
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        self.with(|s| {
            let q = find_queue(&mut s.queues, queue)?;
            q.delivered(id, pop_receipt)?;
            q.messages.remove(id);
            Ok(())
        })
    }

    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        self.with(|State { queues, counters, .. }| {
            let message = find_queue(queues, queue)?.delivered(id, pop_receipt)?;
            message.visible_at = now() + visible_after;
            message.text = text.to_string();
            message.pop_receipt = counters.pop_receipt();
            Ok(message.pop_receipt.clone())
        })
    }

    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        self.with(|s| Ok(find_queue(&mut s.queues, queue)?.messages.len() as u64))
    }
}
