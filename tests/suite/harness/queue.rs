//! The queue trigger's listener (contract §2, §4, §6), on the real queue in Azurite through
//! `AzureStore` (the `QueueStore` trait):
//!
//! - polls with a randomized exponential backoff from 100 ms up to `maxPollingInterval`
//!   while the queue is empty; fetches `batchSize` messages with a 10-minute visibility
//!   lease, and fetches again as soon as no more than `newBatchThreshold` are in flight;
//! - decodes each message per `messageEncoding`: invalid base64 is copied raw to
//!   `{queue}-poison` and deleted **without invoking**; bytes that are not UTF-8 fail the
//!   binding (a failed attempt without an invocation);
//! - a message already dequeued more than `maxDequeueCount` times is poisoned before
//!   invocation;
//! - invokes `POST /{function}` with the host payload and judges the answer; on success
//!   deletes the message; on failure poisons it (copy of the text to `{queue}-poison`, then
//!   delete) when `DequeueCount >= maxDequeueCount`, else makes it visible again after
//!   `visibilityTimeout`.
//!
//! Not reproduced: lease renewal while an invocation runs (invocations here take seconds, the
//! lease is 10 minutes), the host's `RetryContext` (no `retry` policy is configured).
//! `InsertionTime`/`ExpirationTime` are not exposed by `QueueStore::receive_messages`; the
//! harness sends the time it first saw the message (and + 7 days, the default time-to-live)
//! and says so in `QueueListener` docs; `NextVisibleTime` is the dequeue time plus the lease,
//! which is what the service returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use table_catalog::store::AzureStore;
use table_catalog::store::{QueueStore, ReceivedMessage, StoreError};
use time::OffsetDateTime;

use super::app::{MessageEncoding, QueueOptions};
use super::client;
use super::payload::{self, QueueData, QueueMeta, Verdict};
use super::{Event, Invocation, Shared};

/// Visibility lease of a dequeued message (the listener's default; renewed by the host).
pub const LEASE: Duration = Duration::from_secs(600);
/// Shortest polling delay of the listener's backoff.
pub const MIN_POLL: Duration = Duration::from_millis(100);

/// Everything one listener needs.
pub struct QueueListener {
    pub store: Arc<AzureStore>,
    pub queue: String,
    pub function: String,
    pub binding: String,
    pub binary: bool,
    pub options: QueueOptions,
    pub handler_port: u16,
    pub invocation_timeout: Duration,
    pub shared: Arc<Shared>,
    pub stop: Arc<AtomicBool>,
    pub in_flight: Arc<AtomicUsize>,
    /// Successful invocations whose delete is "lost": the message is made visible again at
    /// once instead, as if the host had died before deleting and the lease had run out.
    pub lose_deletes: Arc<AtomicUsize>,
    /// When each message id was first seen (stands in for InsertionTime).
    first_seen: Mutex<HashMap<String, OffsetDateTime>>,
    /// Seeded source of the polling jitter.
    rng: Mutex<StdRng>,
}

impl QueueListener {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<AzureStore>,
        queue: String,
        function: String,
        binding: String,
        binary: bool,
        options: QueueOptions,
        handler_port: u16,
        invocation_timeout: Duration,
        shared: Arc<Shared>,
        seed: u64,
    ) -> QueueListener {
        QueueListener {
            store,
            queue,
            function,
            binding,
            binary,
            options,
            handler_port,
            invocation_timeout,
            shared,
            stop: Arc::new(AtomicBool::new(false)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            lose_deletes: Arc::new(AtomicUsize::new(0)),
            first_seen: Mutex::new(HashMap::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    pub fn poison_queue(&self) -> Option<String> {
        // Queues that already end in -poison get no poison queue (contract §4).
        (!self.queue.ends_with("-poison")).then(|| format!("{}-poison", self.queue))
    }

    /// `d` with up to ±20 % jitter, from the seeded generator.
    fn jitter(&self, d: Duration) -> Duration {
        let f = 0.8 + self.rng.lock().map_or(0.2, |mut r| r.gen::<f64>() * 0.4);
        d.mul_f64(f)
    }

    /// The polling loop; returns when `stop` is set.
    pub async fn run(self: Arc<Self>) {
        let mut delay = MIN_POLL;
        while !self.stop.load(Ordering::SeqCst) {
            if self.in_flight.load(Ordering::SeqCst) > self.options.new_batch_threshold {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let got = self.store.receive_messages(&self.queue, self.options.batch_size, LEASE).await;
            let messages = match got {
                Ok(m) => m,
                Err(StoreError::NotFound(_)) => Vec::new(),
                Err(e) => {
                    self.shared.event(Event::ListenerError(e.to_string()));
                    Vec::new()
                }
            };
            if messages.is_empty() {
                self.shared.polls_empty.fetch_add(1, Ordering::SeqCst);
                let delay_now = self.jitter(delay);
                tokio::time::sleep(delay_now).await;
                delay = (delay * 2).min(self.options.max_polling_interval);
                continue;
            }
            delay = MIN_POLL;
            for m in messages {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                let me = self.clone();
                tokio::spawn(async move {
                    me.process(m).await;
                    me.in_flight.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
    }

    async fn process(&self, m: ReceivedMessage) {
        let dequeued_at = OffsetDateTime::now_utc();
        let max = self.options.max_dequeue_count;
        if m.dequeue_count > max {
            self.poison(
                &m,
                format!("dequeued {} times, more than maxDequeueCount {max}, before invocation", m.dequeue_count),
            )
            .await;
            return;
        }
        let text = match self.options.message_encoding {
            MessageEncoding::None => Ok(m.text.clone().into_bytes()),
            MessageEncoding::Base64 => {
                // Convert.FromBase64String ignores white space and needs the padding.
                let compact: String = m.text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
                base64::engine::general_purpose::STANDARD.decode(compact)
            }
        };
        let bytes = match text {
            Ok(b) => b,
            Err(e) => {
                // MessageDecodingFailed hook: raw copy to poison, delete, no invocation.
                self.poison(&m, format!("message is not valid base64 ({e}); not invoked")).await;
                return;
            }
        };
        // The strict UTF-8 decoder runs while binding the default `string` value; failing
        // there fails the attempt without a POST. `dataType: binary` skips it.
        let text = String::from_utf8(bytes.clone()).ok();
        if text.is_none() && !self.binary {
            self.shared.event(Event::BindingFailed { id: m.id.clone(), dequeue_count: m.dequeue_count });
            self.after_failure(&m).await;
            return;
        }
        let insertion_time = *self.first_seen.lock().unwrap().entry(m.id.clone()).or_insert(dequeued_at);
        let meta = QueueMeta {
            id: m.id.clone(),
            pop_receipt: m.pop_receipt.clone(),
            dequeue_count: m.dequeue_count,
            insertion_time,
            expiration_time: insertion_time + Duration::from_secs(7 * 24 * 3600),
            next_visible_time: dequeued_at + LEASE,
        };
        let data = match (&text, self.binary) {
            (Some(t), false) => QueueData::Text(t),
            _ => QueueData::Binary(&bytes),
        };
        let body = payload::queue_invocation(&self.function, &self.binding, data, &meta);
        let text = text.unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        let inv = invoke(
            self.handler_port,
            &self.function,
            body,
            Some((m.id.clone(), m.dequeue_count, text.clone())),
            self.invocation_timeout,
            &self.shared,
        )
        .await;
        if inv.verdict.is_success() {
            if self.lose_deletes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                match self.store.release_message(&self.queue, &m.id, &m.pop_receipt, &m.text, Duration::ZERO).await {
                    Ok(_) => self.shared.event(Event::DeleteLost { id: m.id.clone(), dequeue_count: m.dequeue_count }),
                    Err(e) => self.shared.event(Event::ListenerError(format!("simulating a lost delete: {e}"))),
                }
                return;
            }
            match self.store.delete_message(&self.queue, &m.id, &m.pop_receipt).await {
                Ok(()) => self.shared.event(Event::Deleted { id: m.id.clone(), dequeue_count: m.dequeue_count }),
                Err(e) => self.shared.event(Event::ListenerError(format!("deleting {}: {e}", m.id))),
            }
        } else {
            self.after_failure(&m).await;
        }
    }

    /// A failed attempt: poison at maxDequeueCount, else visible again after visibilityTimeout.
    async fn after_failure(&self, m: &ReceivedMessage) {
        let max = self.options.max_dequeue_count;
        if m.dequeue_count >= max {
            self.poison(m, format!("failed {} times (maxDequeueCount {max})", m.dequeue_count)).await;
        } else {
            let after = self.options.visibility_timeout;
            match self.store.release_message(&self.queue, &m.id, &m.pop_receipt, &m.text, after).await {
                Ok(_) => self.shared.event(Event::Released { id: m.id.clone(), dequeue_count: m.dequeue_count, after }),
                Err(e) => self.shared.event(Event::ListenerError(format!("releasing {}: {e}", m.id))),
            }
        }
    }

    /// Copies the message text as stored (same encoding) to the poison queue and deletes it.
    async fn poison(&self, m: &ReceivedMessage, reason: String) {
        let Some(poison) = self.poison_queue() else {
            // No poison queue: the message stays invisible until its lease ends, forever retried.
            self.shared.event(Event::ListenerError(format!("{}: no poison queue for {}", m.id, self.queue)));
            return;
        };
        let copied = async {
            self.store.create_queue(&poison).await?;
            self.store.put_message(&poison, &m.text, Duration::ZERO).await
        }
        .await;
        match copied {
            Ok(poison_id) => {
                if let Err(e) = self.store.delete_message(&self.queue, &m.id, &m.pop_receipt).await {
                    self.shared.event(Event::ListenerError(format!("deleting poisoned {}: {e}", m.id)));
                }
                self.shared.event(Event::Poisoned {
                    id: m.id.clone(),
                    dequeue_count: m.dequeue_count,
                    poison_id,
                    reason,
                });
            }
            Err(e) => self.shared.event(Event::ListenerError(format!("copying {} to {poison}: {e}", m.id))),
        }
    }
}

/// Sends one invocation (`POST /{function}`, chunked JSON) and records it.
pub async fn invoke(
    port: u16,
    function: &str,
    body: serde_json::Value,
    message: Option<(String, u32, String)>,
    timeout: Duration,
    shared: &Shared,
) -> Invocation {
    let invocation_id = uuid::Uuid::new_v4().to_string();
    let headers = payload::invocation_headers(&invocation_id);
    let started = Instant::now();
    let bytes = body.to_string().into_bytes();
    let result = client::request(port, "POST", &format!("/{function}"), &headers, Some(&bytes), true, timeout).await;
    let elapsed = started.elapsed();
    let (status, response_body, verdict) = match result {
        Ok(r) => {
            let verdict = payload::judge(r.status, r.header("content-type"), &r.body);
            (Some(r.status), String::from_utf8_lossy(&r.body).into_owned(), verdict)
        }
        Err(e) => (None, String::new(), Verdict::Failure(format!("request failed: {e}"))),
    };
    let (message_id, dequeue_count, message_text) = match message {
        Some((id, n, t)) => (Some(id), Some(n), Some(t)),
        None => (None, None, None),
    };
    let inv = Invocation {
        function: function.to_string(),
        invocation_id,
        message_id,
        dequeue_count,
        message_text,
        request: body,
        status,
        response_body,
        verdict,
        elapsed,
    };
    shared.record(inv.clone());
    inv
}
