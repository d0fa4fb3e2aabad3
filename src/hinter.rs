//! Apply-queue hints, sent after the acknowledgement and coalesced.
//!
//! A hint (`{"v":1,"shard":..,"id":..}`) only wakes an applier: whoever consumes it applies
//! everything pending in the shard it names, not just the entry. So a process needs at most
//! one hint per shard in flight, plus one more for the writes logged while it was being sent
//! (an applier that had already looked at the pending entries might otherwise miss them).
//! While hints keep coming, this sends one per shard written to, waits a gap, and sends
//! again for the shards written meanwhile: at most one queue message per shard per gap per
//! process, however many writes.
//!
//! **The gap scales with the number of writing processes.** An applier woken by any
//! process's hint applies every process's entries, so N processes each hinting every
//! [`MIN_GAP`] would send N times the hints (and start N times the apply passes) for the
//! same work: with 3 `serve` processes on Azurite, 0.36 of 1.14 queue requests per write
//! were hints and 0.42 receives (docs/BENCHMARKS.md). The gap is `MIN_GAP` divided by this
//! process's share of the writes ([`WriteShare`]: its clock publications over the
//! catalog's, which the high row counts, `crate::wal::pace`), at most [`MAX_GAP`]: all processes together then hint each shard
//! about once per `MIN_GAP`, and a process alone keeps `MIN_GAP`. The first hint after an
//! idle spell goes at once, whatever the gap.
//!
//! Hints are sent by a background task: a write is acknowledged once its entry is durable,
//! without waiting for the queue. A lost hint (the process dies, the queue fails) delays the
//! entry until the sweeper applies it, which is the backstop for every lost hint anyway.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::faults;
use crate::messages;
use crate::store::Store;
use crate::wal::clock::WriteShare;
use crate::wal::{ShardId, WalId};

/// Shortest time between two hints of one process (the gap of a process writing alone).
pub const MIN_GAP: Duration = Duration::from_millis(100);
/// Longest time between two hints of one process, however small its share of the writes:
/// bounds the wait of a shard that only this process writes to. 32 × [`MIN_GAP`], so up to
/// 32 processes writing evenly still hint each shard about once per `MIN_GAP` together (with
/// 800 ms, 32 simulated instances sent 4 times the hints, and with 64 shards the hints and
/// the apply passes they start took 0.78 of 6.72 requests per write: docs/BENCHMARKS.md,
/// "Scale-out"). A lone process keeps `MIN_GAP`, and the first hint after an idle spell goes
/// at once; the sweeper remains the backstop.
pub const MAX_GAP: Duration = Duration::from_millis(3_200);

/// The gap after a round of hints for a process whose share of the writes is `share`
/// (in (0, 1]): `MIN_GAP / share`, within [`MIN_GAP`, `MAX_GAP`].
pub fn gap_for(share: f64) -> Duration {
    let ratio = MAX_GAP.as_secs_f64() / MIN_GAP.as_secs_f64();
    let scale = if share.is_finite() && share > 0.0 { (1.0 / share).clamp(1.0, ratio) } else { ratio };
    MIN_GAP.mul_f64(scale)
}

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
    /// This process's share of the writes: sets the gap ([`gap_for`]).
    share: WriteShare,
}

impl Hinter {
    /// A hinter for `queue` (the apply queue); `sent` is notified after each round of hints
    /// was put on the queue, so an in-process worker receives them at once; `share` is this
    /// process's share of the writes ([`crate::wal::Wal::write_share`]).
    pub fn new(store: Arc<dyn Store>, queue: String, sent: Arc<tokio::sync::Notify>, share: WriteShare) -> Hinter {
        Hinter {
            store,
            queue,
            state: Arc::new(Mutex::new(State::default())),
            idle: Arc::new(tokio::sync::Notify::new()),
            sent,
            share,
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
            crate::env::sleep(gap_for(self.share.get())).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_is_the_minimum_divided_by_the_share_within_bounds() {
        assert_eq!(gap_for(1.0), MIN_GAP);
        assert_eq!(gap_for(0.5), MIN_GAP * 2);
        assert_eq!(gap_for(1.0 / 3.0).as_millis(), 300);
        assert_eq!(gap_for(0.01), MAX_GAP);
        assert_eq!(gap_for(0.0), MAX_GAP);
        assert_eq!(gap_for(f64::NAN), MAX_GAP);
        assert_eq!(gap_for(7.0), MIN_GAP); // never below the minimum
    }
}
