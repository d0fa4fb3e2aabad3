//! The dispatcher of one queue ([`Dispatcher`]): one delivery of a message, end to end, as the
//! Functions host handles it (retries, poisoning, deletion).

use std::sync::Arc;

use super::handler::{Delivery, Handled, Handler};
use super::poison;
use super::policy::QueuePolicy;
use crate::error::Result;
use crate::messages;
use crate::store::{ReceivedMessage, Store};

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Handled; delete the message.
    Done(String),
    /// Moved to the poison queue with this reason; delete the message.
    Poisoned(String),
    /// Failed; leave it to be delivered again (the error, for the log).
    Retry(String),
}

/// A queue, its poison queue, its handler and the policy.
pub struct Dispatcher {
    pub(super) store: Arc<dyn Store>,
    pub(super) queue: String,
    poison_queue: String,
    pub(super) policy: QueuePolicy,
    pub(super) handler: Arc<dyn Handler>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("queue", &self.queue).field("policy", &self.policy).finish()
    }
}

impl Dispatcher {
    /// A dispatcher of `queue` (poison queue `poison_queue`) with the app's `host.json` policy.
    pub fn new(store: Arc<dyn Store>, queue: String, poison_queue: String, handler: Arc<dyn Handler>) -> Dispatcher {
        Dispatcher { store, queue, poison_queue, policy: QueuePolicy::host(), handler }
    }

    /// The same with another policy (tests, benchmarks).
    pub fn with_policy(mut self, policy: QueuePolicy) -> Dispatcher {
        self.policy = policy;
        self
    }

    /// The queue this dispatcher consumes.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The policy in force.
    pub fn policy(&self) -> &QueuePolicy {
        &self.policy
    }

    /// One decoded delivery, as the Functions host invokes it: a rejected message is poisoned
    /// here (the host would only retry it); an error is for the host to retry, and to poison
    /// after `maxDequeueCount`. `Err` only when a rejected message could not be poisoned (then
    /// it must be retried, so it is not lost).
    pub async fn invoke(&self, delivery: Delivery<'_>) -> Result<Disposition> {
        match self.handler.handle(delivery).await {
            Ok(Handled::Done(line)) => Ok(Disposition::Done(line)),
            Ok(Handled::Rejected(reason)) => {
                self.poison(delivery.text, delivery.id, delivery.dequeue_count, &reason).await?;
                Ok(Disposition::Poisoned(reason))
            }
            Err(e) => {
                if delivery.dequeue_count >= self.policy.max_dequeue_count {
                    let reason = format!("failed {} times; last error: {e}", delivery.dequeue_count);
                    self.handler.on_poisoned(delivery, &reason).await;
                }
                Ok(Disposition::Retry(e.to_string()))
            }
        }
    }

    /// One received message, end to end, as the host does it: poisoned unread when it was
    /// delivered more than `maxDequeueCount` times; invalid Base64 or UTF-8 poisoned at once;
    /// otherwise [`Dispatcher::invoke`]. Done or poisoned: deleted. Failed: visible again
    /// after `visibilityTimeout`, or poisoned once it failed `maxDequeueCount` times.
    pub async fn deliver(&self, m: ReceivedMessage) -> Disposition {
        let max = self.policy.max_dequeue_count;
        let disposition = if m.dequeue_count > max {
            let reason = format!("delivered {} times, more than maxDequeueCount {max}", m.dequeue_count);
            if let Ok(text) = messages::decode(&m.text) {
                let delivery = Delivery { text: &text, id: &m.id, dequeue_count: m.dequeue_count };
                self.handler.on_poisoned(delivery, &reason).await;
            }
            self.poison_or_retry(&m.text, &m.id, m.dequeue_count, reason).await
        } else {
            match messages::decode(&m.text) {
                Err(e) => self.poison_or_retry(&m.text, &m.id, m.dequeue_count, e.to_string()).await,
                Ok(text) => {
                    let delivery = Delivery { text: &text, id: &m.id, dequeue_count: m.dequeue_count };
                    match self.invoke(delivery).await {
                        Ok(Disposition::Retry(e)) if m.dequeue_count >= max => {
                            let reason = format!("failed {} times; last error: {e}", m.dequeue_count);
                            self.poison_or_retry(&text, &m.id, m.dequeue_count, reason).await
                        }
                        Ok(d) => d,
                        Err(e) => Disposition::Retry(e.to_string()),
                    }
                }
            }
        };
        match &disposition {
            Disposition::Done(_) | Disposition::Poisoned(_) => {
                if let Err(e) = self.store.delete_message(&self.queue, &m.id, &m.pop_receipt).await {
                    tracing::debug!(queue = %self.queue, error = %e, "could not delete a handled message; it will be handled again (idempotent)");
                }
            }
            Disposition::Retry(e) => {
                let delay = self.policy.retry_delay;
                tracing::warn!(queue = %self.queue, message_id = %m.id, dequeue_count = m.dequeue_count, error = %e, ?delay, "message failed; will retry");
                if let Err(re) = self.store.release_message(&self.queue, &m.id, &m.pop_receipt, &m.text, delay).await {
                    tracing::debug!(error = %re, "could not release the message; it reappears after its visibility timeout");
                }
            }
        }
        disposition
    }

    async fn poison(&self, text: &str, id: &str, dequeue_count: u32, reason: &str) -> Result<()> {
        poison::poison(self.store.as_ref(), &self.poison_queue, text, id, dequeue_count, reason).await
    }

    async fn poison_or_retry(&self, text: &str, id: &str, dequeue_count: u32, reason: String) -> Disposition {
        match self.poison(text, id, dequeue_count, &reason).await {
            Ok(()) => Disposition::Poisoned(reason),
            Err(e) => {
                tracing::error!(error = %e, "could not move a message to the poison queue");
                Disposition::Retry(format!("{reason}; and poisoning it failed: {e}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::error::Error;
    use crate::store::local::LocalStore;
    use crate::store::QueueStore;

    /// Fails (transiently) every time, or rejects, counting its invocations.
    struct Flaky {
        reject: bool,
        calls: AtomicU32,
    }

    #[async_trait]
    impl Handler for Flaky {
        async fn handle(&self, d: Delivery<'_>) -> Result<Handled> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.reject {
                return Ok(Handled::Rejected(format!("cannot use '{}'", d.text)));
            }
            Err(Error::Store(crate::store::StoreError::Unavailable("try later".into())))
        }
    }

    async fn setup(reject: bool) -> (Arc<dyn Store>, Arc<Flaky>, Dispatcher) {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
        store.create_queue("work").await.unwrap();
        store.create_queue("work-poison").await.unwrap();
        let handler = Arc::new(Flaky { reject, calls: AtomicU32::new(0) });
        let policy = QueuePolicy { max_dequeue_count: 3, retry_delay: Duration::ZERO, ..QueuePolicy::host() };
        let d =
            Dispatcher::new(store.clone(), "work".into(), "work-poison".into(), handler.clone()).with_policy(policy);
        (store, handler, d)
    }

    async fn receive_one(store: &dyn QueueStore) -> Option<ReceivedMessage> {
        store.receive_messages("work", 1, Duration::from_secs(60)).await.unwrap().into_iter().next()
    }

    async fn poison_entries(store: &dyn QueueStore) -> Vec<serde_json::Value> {
        let got = store.receive_messages("work-poison", 32, Duration::from_secs(60)).await.unwrap();
        got.iter().map(|m| serde_json::from_str(&messages::decode(&m.text).unwrap()).unwrap()).collect()
    }

    #[tokio::test]
    async fn a_failing_message_is_retried_then_poisoned_after_max_dequeue_count() {
        let (store, handler, d) = setup(false).await;
        store.put_message("work", &messages::encode("job"), Duration::ZERO).await.unwrap();
        let mut dispositions = Vec::new();
        while let Some(m) = receive_one(store.as_ref()).await {
            dispositions.push(d.deliver(m).await);
        }
        assert_eq!(handler.calls.load(Ordering::SeqCst), 3, "{dispositions:?}");
        assert!(matches!(&dispositions[..2], [Disposition::Retry(_), Disposition::Retry(_)]), "{dispositions:?}");
        assert!(
            matches!(&dispositions[2], Disposition::Poisoned(r) if r.contains("failed 3 times")),
            "{dispositions:?}"
        );
        let poison = poison_entries(store.as_ref()).await;
        assert_eq!(poison.len(), 1);
        assert_eq!((poison[0]["message"].as_str(), poison[0]["dequeue_count"].as_u64()), (Some("job"), Some(3)));
        assert_eq!(store.approximate_count("work").await.unwrap(), 0, "deleted after poisoning");
    }

    #[tokio::test]
    async fn a_rejected_message_is_poisoned_at_once_and_bad_base64_without_invoking() {
        let (store, handler, d) = setup(true).await;
        store.put_message("work", &messages::encode("bad"), Duration::ZERO).await.unwrap();
        let m = receive_one(store.as_ref()).await.unwrap();
        assert_eq!(d.deliver(m).await, Disposition::Poisoned("cannot use 'bad'".into()));
        store.put_message("work", "not base64!", Duration::ZERO).await.unwrap();
        let m = receive_one(store.as_ref()).await.unwrap();
        assert!(matches!(d.deliver(m).await, Disposition::Poisoned(r) if r.contains("Base64")));
        assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "bad Base64 never reaches the handler");
        let reasons: Vec<String> =
            poison_entries(store.as_ref()).await.iter().map(|p| p["reason"].as_str().unwrap().to_string()).collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(receive_one(store.as_ref()).await.is_none(), "both deleted");
    }

    #[tokio::test]
    async fn invoke_leaves_retries_to_the_host() {
        let (store, _, d) = setup(false).await;
        let out = d.invoke(Delivery { text: "x", id: "m", dequeue_count: 10 }).await.unwrap();
        assert!(matches!(out, Disposition::Retry(_)), "{out:?}");
        assert!(poison_entries(store.as_ref()).await.is_empty(), "the host poisons, not invoke");
    }
}
