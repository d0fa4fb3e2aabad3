//! Appending to the WAL with group commit.
//!
//! Concurrent appends of one process are coalesced into rounds. A round is run by a task of
//! its own (so a caller that is cancelled, e.g. by a dropped HTTP request, cannot stall the
//! others) for everybody queued when it starts. Up to [`rounds_for`] rounds run at once: an
//! append that finds a free slot starts a round (low latency when idle); when every slot is
//! busy, callers queue up and the next round to start takes them all (large rounds under
//! load).
//!
//! **Rounds in flight follow the process's share of the writes.** A process alone may run
//! [`MAX_ROUNDS`] rounds at once; a process with share `s` of the catalog's writes
//! ([`super::clock::WriteShare`]: its clock publications over the catalog's) runs about
//! `MAX_ROUNDS × s`, at least one. Rounds of several processes in flight at once meet each
//! other's publications (412, a read more), so fewer of them cost the clock less per write.
//!
//! **Round starts are paced** (`src/wal/pace.rs`): a process starts its rounds at least a gap
//! apart that grows with the number of processes writing and the clock requests a round
//! costs, so that the catalog's rounds together keep the clock partition's traffic (one read
//! and one publication per round, and a read per 412) near
//! `pace::ENTITIES_PER_SECOND`, 35% of Azure's per-partition target, however many
//! processes write. A process alone is paced 2.9 ms apart, less than a round takes; under
//! load each round carries the writes that queued meanwhile (fewer requests per write). The
//! share limit alone held 32 simulated instances' clock partition at 87% of its target, and
//! past 32 instances the clock throttled and writes failed (docs/BENCHMARKS.md, "Pacing the
//! append rounds").
//!
//! Overlapping rounds are safe: each reserves its ids under the process's own
//! last id, and publications never move the high-water mark back ([`super::clock`]). A round
//! costs one clock read (one entity) and one clock publication ([`super::clock`]) plus one
//! entity group transaction per 100 entries (and 4 MiB), whatever the number of callers and
//! processes; the clock publication and the entry writes run concurrently. A caller's append
//! returns when its entries are durable and its ids are published, never earlier.
//!
//! **Schema versions.** Each caller says which schema version it validated its operations
//! under. The round's clock read also returns the catalog's schema version
//! ([`super::clock`]); a caller whose version is older gets [`Error::SchemaChanged`] and
//! nothing of it is written (the catalog re-validates and retries), so no process logs
//! anything validated under a schema that a change already replaced when the round began.
//! Each entry carries its caller's version (property `sv`, see [`super::entry`]).
//!
//! A round that fails fails every caller in it with the same error. Entries of a failed
//! round may have been written; they are applied like any other (the caller was not
//! acknowledged, so nothing promised they would not be).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::future::try_join_all;
use tokio::sync::oneshot;

use super::clock::Clock;
use super::entry::{Op, WalEntry};
use super::id::WalId;
use super::shard::ShardId;
use crate::error::{Error, Result};
use crate::store::{BatchOp, Entity, Store, StoreError, MAX_BATCH_BYTES, MAX_BATCH_OPS};

struct Waiter {
    ops: Vec<(ShardId, Op)>,
    /// The schema version the caller validated `ops` under.
    schema_version: u64,
    reply: oneshot::Sender<Result<Vec<WalId>>>,
}

/// Most append rounds of one process in flight at once (a process alone).
pub const MAX_ROUNDS: usize = 4;

/// Append rounds a process may run at once when its share of the catalog's writes is
/// `share` (in (0, 1]; [`super::clock::WriteShare`]): `MAX_ROUNDS × share` rounded, within
/// 1..=[`MAX_ROUNDS`] (a share that is not a number counts as 1: the limit only trades
/// latency for fewer requests, never safety). Rounds of one process in flight at once meet
/// each other's publications (412), so fewer of them cost the clock less per write.
pub fn rounds_for(share: f64) -> usize {
    let share = if share.is_nan() { 1.0 } else { share.clamp(0.0, 1.0) };
    ((MAX_ROUNDS as f64 * share).round() as usize).clamp(1, MAX_ROUNDS)
}

/// Whether a round task that finished a round runs another, with `waiting` callers queued,
/// `running` round tasks (itself included) and `limit` = [`rounds_for`] the current share:
/// only when callers wait and no more tasks run than the limit allows. So the surplus tasks
/// leave when the share fell (a process alone ran 4 rounds, then others began to write),
/// even under a load that never lets the queue empty; as `limit` ≥ 1, one task always stays
/// while callers wait.
fn runs_another(waiting: usize, running: usize, limit: usize) -> bool {
    waiting > 0 && running <= limit
}

/// Appends waiting for a round, and how many round tasks run.
#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    /// Operations in `waiting`.
    queued: usize,
    running: usize,
}

/// The group-commit appender of one process's WAL (cheap to clone).
#[derive(Clone)]
pub(crate) struct Appender {
    store: Arc<dyn Store>,
    table: String,
    pub(crate) clock: Arc<Clock>,
    queue: Arc<Mutex<Queue>>,
    /// Most operations waiting for a round (`WalOptions::max_queued_writes`).
    max_queued: usize,
}

impl Appender {
    pub(crate) fn new(store: Arc<dyn Store>, table: String, clock: Clock, max_queued: usize) -> Appender {
        let queue = Arc::new(Mutex::new(Queue::default()));
        Appender { store, table, clock: Arc::new(clock), queue, max_queued }
    }

    /// Queues `ops` (validated under schema `schema_version`) for the next round and waits
    /// for it. Refused with [`Error::Busy`] (nothing written, no id taken) when the
    /// operations already waiting and `ops` together would pass the queue's limit
    /// (`WalOptions::max_queued_writes`); `ops` alone may pass it when nothing waits.
    pub(super) async fn append(&self, ops: Vec<(ShardId, Op)>, schema_version: u64) -> Result<Vec<WalId>> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.queued > 0 && q.queued + ops.len() > self.max_queued {
                return Err(Error::Busy {
                    message: format!(
                        "overloaded: {} writes wait to be logged in this process (limit {}, WalOptions::max_queued_writes); retry after 1 s",
                        q.queued, self.max_queued
                    ),
                    retry_after_secs: 1,
                });
            }
            q.queued += ops.len();
            q.waiting.push(Waiter { ops, schema_version, reply: tx });
            let free = q.running < rounds_for(self.clock.share());
            if free {
                q.running += 1;
            }
            free
        };
        if start {
            tokio::spawn(self.clone().run());
        }
        rx.await.map_err(|_| Error::Store(StoreError::Other("WAL append round ended without a reply".into())))?
    }

    /// Runs rounds, each when the pace allows, until nobody waits.
    async fn run(self) {
        loop {
            {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if !runs_another(q.waiting.len(), q.running, rounds_for(self.clock.share())) {
                    q.running -= 1;
                    return;
                }
            }
            let now = crate::env::now();
            let at = self.clock.pace().next_start(now);
            if at > now {
                crate::env::sleep_until(at).await; // the callers that queue meanwhile join
            }
            let round = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                q.queued = 0;
                std::mem::take(&mut q.waiting)
            };
            if round.is_empty() {
                continue; // another round task took them
            }
            let reading = self.clock.read(self.store.as_ref(), &self.table).await;
            let current = match reading {
                Ok(r) => r,
                Err(e) => {
                    for w in round {
                        let _ = w.reply.send(Err(Error::clone(&e)));
                    }
                    continue;
                }
            };
            // Callers that validated under a replaced schema write nothing.
            let (round, stale): (Vec<Waiter>, Vec<Waiter>) =
                round.into_iter().partition(|w| w.schema_version >= current.schema_version);
            for w in stale {
                let _ = w.reply.send(Err(Error::SchemaChanged(current.schema_version)));
            }
            if round.is_empty() {
                continue;
            }
            let ops: Vec<(ShardId, Op, u64)> =
                round.iter().flat_map(|w| w.ops.iter().map(|(s, o)| (*s, o.clone(), w.schema_version))).collect();
            let result = self.round(ops, current.high).await;
            let mut offset = 0;
            for w in round {
                let n = w.ops.len();
                let reply = match &result {
                    Ok(ids) => Ok(ids[offset..offset + n].to_vec()),
                    Err(e) => Err(Error::clone(e)),
                };
                offset += n;
                let _ = w.reply.send(reply); // a caller that went away needs no answer
            }
        }
    }

    /// Allocates ids for `ops` above the high-water mark `high` the round read, writes the
    /// entries (one entity group transaction per shard and 100 entries, all concurrently)
    /// and publishes the clock.
    async fn round(&self, ops: Vec<(ShardId, Op, u64)>, high: i64) -> Result<Vec<WalId>> {
        let (ids, last) = self.ids_above(high, ops.len());
        let mut by_shard: BTreeMap<ShardId, Vec<Entity>> = BTreeMap::new();
        for (id, (shard, op, schema_version)) in ids.iter().zip(ops) {
            let entry = WalEntry { id: id.clone(), op, schema_version, at: None, resume: None };
            by_shard.entry(shard).or_default().push(entry.to_entity(&shard.partition()));
        }
        let groups: Vec<(ShardId, &[Entity])> =
            by_shard.iter().flat_map(|(s, es)| batches(es).into_iter().map(move |g| (*s, g))).collect();
        let writes = try_join_all(groups.into_iter().map(|(shard, group)| self.write_entries(shard, group)));
        let publish = self.clock.publish(self.store.as_ref(), &self.table, last);
        // Both run to the end (no cancellation of an entry write half way), then the first
        // error is reported.
        let (written, published) = tokio::join!(writes, publish);
        written?;
        published?;
        Ok(ids)
    }

    /// `n` consecutive ids above high-water mark `high` (read from the clock by the caller)
    /// and above everything this process handed out, so above every id acknowledged so far
    /// in any process: `(ids, last timestamp)`. The caller must publish the last timestamp
    /// ([`Clock::publish`]) before acknowledging anything logged under these ids.
    pub(super) fn ids_above(&self, high: i64, n: usize) -> (Vec<WalId>, i64) {
        let start = self.clock.reserve(high, n);
        let ids = (0..n as i64).map(|i| WalId::new(start + i, crate::env::uuid())).collect();
        (ids, start + n as i64 - 1)
    }

    async fn write_entries(&self, shard: ShardId, group: &[Entity]) -> Result<()> {
        let result = if let [single] = group {
            self.store.insert(&self.table, single).await.map(|_| ())
        } else {
            let ops: Vec<BatchOp> = group.iter().cloned().map(BatchOp::Insert).collect();
            self.store.batch(&self.table, &shard.partition(), &ops).await.map(|_| ())
        };
        match result {
            // Ids are unique, so an existing entry is ours (a retried request that had
            // committed) or already applied and removed; either way it is durable.
            Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(StoreError::BatchFailed { source, .. }) if matches!(*source, StoreError::AlreadyExists(_)) => {
                for e in group {
                    match self.store.insert(&self.table, e).await {
                        Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
                        Err(err) => return Err(err.into()),
                    }
                }
                Ok(())
            }
            other => Ok(other?),
        }
    }
}

/// Splits entities into groups that fit one entity group transaction.
pub(crate) fn batches(entities: &[Entity]) -> Vec<&[Entity]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, e) in entities.iter().enumerate() {
        let size = e.stored_size() + 1024; // + per-operation MIME overhead
        if i > start && (i - start == MAX_BATCH_OPS || bytes + size > MAX_BATCH_BYTES - 64 * 1024) {
            out.push(&entities[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < entities.len() {
        out.push(&entities[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Value;

    #[test]
    fn rounds_follow_the_write_share() {
        assert_eq!(rounds_for(1.0), MAX_ROUNDS, "a process alone");
        assert_eq!(rounds_for(0.5), 2, "two processes writing evenly");
        assert_eq!(rounds_for(1.0 / 3.0), 1, "three");
        assert_eq!(rounds_for(1.0 / 8.0), 1, "never below one");
        assert_eq!(rounds_for(0.95), MAX_ROUNDS, "a rare other writer costs nothing");
        assert_eq!(rounds_for(f64::NAN), MAX_ROUNDS);
        assert_eq!(rounds_for(f64::MIN_POSITIVE), 1);
    }

    #[test]
    fn round_tasks_over_a_fallen_limit_leave_even_while_callers_wait() {
        assert!(runs_another(5, 4, 4), "within the limit, a task serves the callers");
        assert!(!runs_another(5, 4, 1), "4 tasks, limit 1: this one leaves");
        assert!(!runs_another(5, 2, 1), "2 tasks, limit 1: this one leaves");
        assert!(runs_another(5, 1, 1), "the last task stays while callers wait");
        assert!(!runs_another(0, 1, 4), "nobody waits");
    }

    #[test]
    fn batches_respect_count_and_size() {
        let small: Vec<Entity> = (0..250).map(|i| Entity::new("wal", format!("{i}"))).collect();
        let sizes: Vec<usize> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let big: Vec<Entity> =
            (0..20).map(|i| Entity::new("wal", format!("{i}")).with("b", Value::String("x".repeat(300_000)))).collect();
        for b in batches(&big) {
            assert!(b.iter().map(|e| e.stored_size()).sum::<usize>() < MAX_BATCH_BYTES);
        }
        assert_eq!(batches(&big).iter().map(|b| b.len()).sum::<usize>(), 20);
    }
}
