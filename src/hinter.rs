//! Apply-queue hints, sent after the acknowledgement and coalesced.
//!
//! A hint (`{"v":1,"shard":..,"id":..}`) only wakes an applier: whoever consumes it applies
//! everything pending in the shard it names, not just the entry. So a process needs at most
//! one hint per shard in flight, plus one more for the writes logged while it was being sent
//! (an applier that had already looked at the pending entries might otherwise miss them).
//! While hints keep coming, this sends one per shard written to, waits [`MIN_GAP`], and sends
//! again for the shards written meanwhile: at most one queue message per shard per `MIN_GAP`
//! per process, however many writes.
//!
//! Hints are sent by a background task: a write is acknowledged once its entry is durable,
//! without waiting for the queue. A lost hint (the process dies, the queue fails) delays the
//! entry until the sweeper applies it, which is the backstop for every lost hint anyway.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::faults;
use crate::messages;
use crate::store::Store;
use crate::wal::{ShardId, WalId};

/// Shortest time between two hints of one process.
pub const MIN_GAP: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// A sender task is running.
    sending: bool,
    /// The newest id of each shard logged since the sender last read this.
    latest: std::collections::BTreeMap<ShardId, WalId>,
}

/// Sends hints for one catalog's apply queue (cheap to clone).
#[derive(Clone)]
pub struct Hinter {
    store: Arc<dyn Store>,
    queue: String,
    state: Arc<Mutex<State>>,
    /// Notified when the sender task stops (nothing left to send).
    idle: Arc<tokio::sync::Notify>,
    /// Notified after each round of hints reached the queue (wakes an in-process worker).
    sent: Arc<tokio::sync::Notify>,
}

impl Hinter {
    /// A hinter for `queue` (the apply queue); `sent` is notified after each round of hints
    /// was put on the queue, so an in-process worker receives them at once.
    pub fn new(store: Arc<dyn Store>, queue: String, sent: Arc<tokio::sync::Notify>) -> Hinter {
        Hinter {
            store,
            queue,
            state: Arc::new(Mutex::new(State::default())),
            idle: Arc::new(tokio::sync::Notify::new()),
            sent,
        }
    }

    /// Asks for a hint naming entry `id` of `shard`; returns at once.
    pub fn hint(&self, shard: ShardId, id: &WalId) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.latest.insert(shard, id.clone());
        if !std::mem::replace(&mut st.sending, true) {
            tokio::spawn(self.clone().send_until_idle());
        }
    }

    /// Waits until every hint asked for so far was sent (or given up on). For tests and
    /// orderly shutdown; a hint asked for meanwhile extends the wait.
    pub async fn settled(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.state.lock().unwrap_or_else(|p| p.into_inner()).sending {
                return;
            }
            notified.await;
        }
    }

    async fn send_until_idle(self) {
        loop {
            let next = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.latest.is_empty() {
                    st.sending = false;
                    self.idle.notify_waiters();
                    return;
                }
                std::mem::take(&mut st.latest)
            };
            futures::future::join_all(next.iter().map(|(shard, id)| self.send(*shard, id))).await;
            self.sent.notify_one();
            tokio::time::sleep(MIN_GAP).await;
        }
    }

    async fn send(&self, shard: ShardId, id: &WalId) {
        if let Err(e) = faults::point("before_enqueue") {
            tracing::warn!(wal_id = %id, error = %e, "apply hint not sent (fault point); the sweeper will apply the entry");
            return;
        }
        let text = messages::encode(&messages::hint_json(&shard.partition(), id.as_str()));
        if let Err(e) = self.store.put_message(&self.queue, &text, Duration::ZERO).await {
            tracing::warn!(wal_id = %id, error = %e, "could not enqueue the apply hint; the sweeper will apply the entry");
        }
    }
}
