//! The apply engine: from pending WAL entries to catalog rows.
//!
//! Protocol (per shard, one applier at a time under the shard's lease, N shards in parallel):
//! 1. Read the shard's pending entries in id order (all that are pending, whatever the
//!    checkpoint says: an entry logged late with a small id is still applied).
//! 2. Apply each entry. Runs of upserts are applied together ([`fanout`]): each row gets the
//!    last write of the run, rows of different partitions are written concurrently. Replace
//!    and delete ([`filter`]) first wait for the low-watermark barrier ([`barrier`]): every
//!    other shard must have applied everything below their id. They then resolve their filter
//!    against live rows and their own tombstones (so a retry after a crash finds the same
//!    records), record their tombstones in the tombstone index, write the tombstones and
//!    (replace) the new record.
//! 3. After each group (a run of up to 64 upserts, or one replace or delete), advance the
//!    shard's checkpoint and then remove the group's entries from the pending partition, so a
//!    lost lease or a crash costs at most the group in flight.
//!
//! Fencing ([`fanout`]): a catalog row is only replaced by a larger WAL id, so re-applying,
//! stale lease holders and appliers of other shards cannot undo newer work.
//!
//! An entry that can never be applied (unreadable, or its record no longer valid) is moved
//! to the `dead` partition with the reason, so it never blocks the entries behind it.

mod applier;
pub mod barrier;
pub mod catch_up;
pub mod dead;
mod dropping;
mod dropping_rows;
mod earlier;
mod fact;
pub mod fanout;
pub mod filter;
pub mod history;
mod history_target;
mod matched;
mod outcome;
mod refresh;
pub mod row_cache;
pub mod schema_change;
mod schema_jobs;
mod stamp;
mod stray;
pub mod sweep;

pub use applier::Applier;
pub use outcome::DrainOutcome;

use crate::env::Instant;

use futures::future::BoxFuture;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::faults;
use crate::store::{bulk_delete, pager, Entity, IfMatch, RowRange, StoreError, Value};
use crate::wal::lease::Lease;
use crate::wal::{Op, ShardId, WalEntry, DEAD, DEAD_AT, DEAD_FROM, DEAD_REASON, PENDING_BEFORE};

/// How applying a page went.
enum Flow {
    /// Every entry applied.
    Done,
    /// Stopped before a filter entry whose barrier did not pass in time (or, in a nested
    /// pass, before any filter entry), or inside a filter entry at the deadline, its
    /// progress recorded ([`filter::Filtered::Stopped`]).
    Stopped,
    /// The lease was lost.
    LeaseLost,
    /// An entry logged late appeared before the current position: re-read the shard from
    /// its oldest pending entry ([`barrier::Passed::Restart`]).
    Restart,
}

/// What applying one group did ([`Applier::apply_group`]).
enum Step {
    /// The group (this many entries) is applied, checkpointed and no longer pending.
    Applied(usize),
    /// Apply the same group again (it met a row written under a newer schema, now adopted).
    Again,
    /// The page ends here.
    End(Flow),
}

/// First delay before a group that failed transiently is applied again within its pass.
const GROUP_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(1);
/// Longest delay between such attempts.
const GROUP_RETRY_MAX: std::time::Duration = std::time::Duration::from_millis(50);
/// Most attempts of one group after a transient failure, within one pass.
const GROUP_RETRIES: usize = 10;

/// Longest run of upserts applied together.
const UPSERT_RUN: usize = 64;
/// Pending entries read per request while draining (two groups of upserts).
pub const DRAIN_PAGE: usize = 2 * UPSERT_RUN;

impl Applier {
    /// Applies every pending entry of every shard, shards in parallel; each stops at a group
    /// boundary after [`WalOptions::apply_budget`].
    pub async fn apply_all(&self) -> Result<DrainOutcome> {
        let deadline = crate::env::now() + self.opts.apply_budget;
        let count = self.wal.current_shard_count().await?;
        let outcomes =
            futures::future::try_join_all(ShardId::all(count).map(|s| self.apply_shard_by(s, deadline))).await?;
        Ok(DrainOutcome::combine(outcomes))
    }

    /// Applies every pending entry of `shard`, unless another applier holds its lease; stops
    /// at a group boundary after [`WalOptions::apply_budget`].
    pub async fn apply_shard(&self, shard: ShardId) -> Result<DrainOutcome> {
        self.apply_shard_by(shard, crate::env::now() + self.opts.apply_budget).await
    }

    /// Like [`Applier::apply_shard`], but stops at the first group boundary past `deadline`
    /// ([`DrainOutcome::Partial`]); a group is one replace, delete or schema change, or a run
    /// of at most 64 upserts. A replace or delete waits for its barrier until
    /// `deadline` at most, and one matching many records stops between two pages of its
    /// filter's partition past it ([`crate::wal::WalEntry::resume`]).
    pub fn apply_shard_by(&self, shard: ShardId, deadline: Instant) -> BoxFuture<'_, Result<DrainOutcome>> {
        Box::pin(self.run_shard(shard, deadline, false))
    }

    /// One shard's apply pass. `nested` passes (run by a barrier on behalf of a filter entry
    /// of another shard) stop before filter entries instead of waiting on a barrier.
    pub(crate) async fn run_shard(&self, shard: ShardId, deadline: Instant, nested: bool) -> Result<DrainOutcome> {
        let Some(lock) = self.locks.get(shard.index() as usize) else {
            return Err(Error::invalid(format!("shard {shard} is out of range")));
        };
        let Ok(_guard) = lock.try_lock() else {
            return Ok(DrainOutcome::Busy);
        };
        let mut applied = 0;
        loop {
            let Some(mut lease) = self.wal.acquire_lease(shard).await? else {
                return Ok(if applied > 0 { DrainOutcome::Drained { applied } } else { DrainOutcome::Busy });
            };
            let result = self.drain(&mut lease, deadline, nested).await;
            self.wal.release_lease(lease).await;
            match result? {
                Some((n, false)) => applied += n,
                Some((n, true)) => return Ok(DrainOutcome::Partial { applied: applied + n }),
                None => return Ok(DrainOutcome::Busy),
            }
            // Writers that found the lease taken while we held it rely on this re-check.
            if self.wal.pending_page(shard, 1).await?.is_empty() {
                return Ok(DrainOutcome::Drained { applied });
            }
        }
    }

    /// Applies the lease's shard page by page: `(applied, stopped early)`, or `None` when the
    /// lease was lost. Pages of [`DRAIN_PAGE`] entries are read one ahead while the current
    /// one is applied, so the first group starts after one short read and the reads overlap
    /// the writes.
    async fn drain(&self, lease: &mut Lease, deadline: Instant, nested: bool) -> Result<Option<(usize, bool)>> {
        let mut applied = 0;
        // A schema change asked this shard's appliers for a newer schema: adopt it and say
        // so in the lease row before the first group ([`schema_change`]).
        if lease.wanted_schema() > self.schema().version() {
            self.ensure_schema(lease.wanted_schema()).await?;
            if !self.wal.renew_lease(lease).await? {
                return Ok(None);
            }
        }
        let mut pages = self.prefetch_pending(lease.shard());
        loop {
            // `pages` is replaced when a barrier finds an entry logged late before the
            // current position (Flow::Restart).
            if !self.wal.keep_lease(lease).await? {
                return Ok(None);
            }
            let Some(page) = pages.recv().await else {
                return Ok(Some((applied, false)));
            };
            let page = page?;
            if page.is_empty() {
                continue; // a short page with a continuation token
            }
            let mut entries = Vec::with_capacity(page.len());
            for e in &page {
                match WalEntry::from_entity(e) {
                    Ok(entry) => entries.push((entry, e)),
                    Err(bad) => self.bury(e, &bad.reason).await?,
                }
            }
            let buried = page.len() - entries.len();
            let mut entries = self.stamp_late(lease.shard(), entries).await?;
            // In effective-id order: an entry stamped after a filter that sealed the shard and
            // is still pending (its attempt stopped after the seal) must not be applied before
            // it (found by the checker: a delete stamped after another delete of the same
            // record, applied first, wrote a removal row for a record the other one removed).
            // Entries that were not stamped keep their order (the sort is stable).
            entries.sort_by(|a, b| a.effective().cmp(b.effective()));
            // Nothing is applied under an id the clock has not published: a failed writer's
            // entry may have been stored without its publication, and an operation issued
            // after anyone saw its effect must get a larger id (stamped ids lie just above a
            // seal, which its barrier published).
            if let Some(top) = entries.iter().filter(|e| e.at.is_none()).filter_map(|e| e.id.micros()).max() {
                self.wal.publish_at_least(top).await?;
            }
            // An entry validated under a newer schema than ours: adopt it first.
            if let Some(newest) = entries.iter().map(|e| e.schema_version).max() {
                self.ensure_schema(newest).await?;
            }
            let (n, flow) = self.apply_entries(&entries, lease, deadline, nested).await?;
            applied += n + buried;
            match flow {
                Flow::Done => {}
                Flow::Stopped => return Ok(Some((applied, true))),
                Flow::LeaseLost => return Ok(None),
                Flow::Restart => pages = self.prefetch_pending(lease.shard()),
            }
            if crate::env::now() >= deadline {
                return Ok(Some((applied, true)));
            }
        }
    }

    /// Reads a shard's pending entries in id order, one page ahead of the consumer, in a task
    /// of its own (it stops when the receiver is dropped). A page is `Err` once, then the
    /// channel closes.
    fn prefetch_pending(&self, shard: ShardId) -> tokio::sync::mpsc::Receiver<Result<Vec<Entity>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (store, table) = (self.store.clone(), self.wal.table().to_string());
        tokio::spawn(async move {
            let range = RowRange { before: Some(PENDING_BEFORE.into()), ..RowRange::default() };
            let partition = shard.partition();
            let mut pages = pager::pages(store.as_ref(), &table, &partition, &range, DRAIN_PAGE);
            while let Some(page) = pages.next().await {
                let failed = page.is_err();
                if tx.send(page.map(|p| p.entities).map_err(Error::from)).await.is_err() || failed {
                    return;
                }
            }
        });
        rx
    }

    /// Applies entries in order, group by group, each group checkpointed and removed from the
    /// pending partition as soon as it is applied, so a lost lease or a crash never costs more
    /// than the group in flight. Returns the entries applied and how it ended. `entries` is
    /// one page, read from the store before this call: a barrier check that passes clears
    /// the filter entries of the page below the low watermark it saw, and only those
    /// ([`barrier::PageClearance`]).
    ///
    /// A group that fails transiently (a 503 the store's own retries did not absorb) is tried
    /// again here, after a backoff ([`GROUP_RETRY_MIN`] doubling to [`GROUP_RETRY_MAX`], at
    /// most [`GROUP_RETRIES`] times, never past `deadline`): applying is idempotent, and the
    /// lease and the page's clearance still hold, so the retry costs the group's own requests
    /// instead of a new pass with its page read and barrier. Shard 0 applies every filter
    /// entry in one serial path, and a pass ended at every 503 made that path the
    /// bottleneck of the randomized checker's long runs (docs/RELIABILITY.md, "Long runs").
    async fn apply_entries(
        &self,
        entries: &[WalEntry],
        lease: &mut Lease,
        deadline: Instant,
        nested: bool,
    ) -> Result<(usize, Flow)> {
        let mut clearance = barrier::PageClearance::default();
        let mut i = 0;
        let mut retries = None;
        while i < entries.len() {
            if !self.wal.keep_lease(lease).await? {
                return Ok((i, Flow::LeaseLost));
            }
            match self.apply_group(&entries[i..], &mut clearance, lease, deadline, nested).await {
                Ok(Step::Applied(n)) => {
                    i += n;
                    retries = None;
                    // Past the deadline, stop at this group boundary, not the page's: a page
                    // of slow filter entries (each with many records, under a backlog) held a
                    // caller's `wait` or an intent's queue invocation for minutes
                    // (docs/RELIABILITY.md, "The shard-0 backlog that fed itself").
                    if i < entries.len() && crate::env::now() >= deadline {
                        return Ok((i, Flow::Stopped));
                    }
                }
                Ok(Step::Again) => {}
                Ok(Step::End(flow)) => return Ok((i, flow)),
                Err(e) if e.is_transient() => {
                    let delays = retries.get_or_insert_with(|| {
                        use backon::BackoffBuilder;
                        crate::env::backoff(GROUP_RETRY_MIN, GROUP_RETRY_MAX, GROUP_RETRIES).build()
                    });
                    let Some(delay) = delays.next().filter(|d| crate::env::now() + *d < deadline) else {
                        return Err(e);
                    };
                    tracing::debug!(wal_id = %entries[i].id, error = %e, ?delay, "group failed transiently: applying it again");
                    crate::env::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
        Ok((i, Flow::Done))
    }

    /// Applies the first group of `entries` (a run of up to [`UPSERT_RUN`] upserts, or one
    /// other entry after its barrier), checkpoints it and removes it from the pending
    /// partition. `entries` is the rest of the page.
    async fn apply_group(
        &self,
        entries: &[WalEntry],
        clearance: &mut barrier::PageClearance,
        lease: &mut Lease,
        deadline: Instant,
        nested: bool,
    ) -> Result<Step> {
        let shard = lease.shard();
        let run = entries.iter().take(UPSERT_RUN).take_while(|e| matches!(e.op, Op::Upsert { .. })).count();
        let group = &entries[..run.max(1)];
        let ended = |passed: barrier::Passed| match passed {
            barrier::Passed::Yes { .. } => None,
            barrier::Passed::NotYet => Some(Step::End(Flow::Stopped)),
            barrier::Passed::LeaseLost => Some(Step::End(Flow::LeaseLost)),
            barrier::Passed::Restart => Some(Step::End(Flow::Restart)),
        };
        if run == 0 {
            if nested {
                return Ok(Step::End(Flow::Stopped));
            }
            if !clearance.covers(group[0].effective()) {
                let passed = self.barrier(shard, entries, lease, deadline).await?;
                if let barrier::Passed::Yes { cleared } = &passed {
                    clearance.passed(cleared.clone());
                }
                if let Some(end) = ended(passed) {
                    return Ok(end);
                }
            } else if !self.seal_own(shard, entries).await? {
                return Ok(Step::End(Flow::Restart));
            }
            if let Op::Schema { version } = group[0].op {
                if let Some(end) = ended(self.fence(shard, version, lease, deadline).await?) {
                    return Ok(end);
                }
            }
        }
        let result = if run > 0 {
            self.apply_upserts(group).await
        } else {
            match self.keeping_lease(lease, self.apply_filtered(&group[0], Some((shard, deadline)))).await {
                Some(Ok(filter::Filtered::Stopped)) => {
                    // At the deadline, its progress recorded: the next pass goes on from there.
                    self.settle_dropping().await?;
                    return Ok(Step::End(Flow::Stopped));
                }
                Some(result) => result.map(|_| ()),
                None => {
                    // The lease was lost while the filter ran: stopped where it was, like a
                    // crash (its next attempt completes what this one began).
                    self.settle_dropping().await?;
                    return Ok(Step::End(Flow::LeaseLost));
                }
            }
        };
        if result.is_err() {
            // Rows of a dropping index this failed attempt may have written (a write that
            // committed and answered an error, say) are checked now: the retry may come
            // after the drop's job finished, and would not write them again.
            self.settle_dropping().await?;
        }
        match result {
            Ok(()) => {}
            // A row this group met was written under a newer schema: apply the group
            // again with it (every write is fenced, so what this attempt wrote stays
            // right; docs/ARCHITECTURE.md, "Order", step 10).
            Err(Error::SchemaChanged(version)) => {
                tracing::debug!(version, wal_id = %group[0].id, "a row was written under a newer schema: applying the group again with it");
                self.ensure_schema(version).await?;
                if self.schema().version() < version {
                    return Err(Error::SchemaMismatch(format!(
                        "a catalog row was written under schema version {version}, above the catalog's schema row ({})",
                        self.schema().version()
                    )));
                }
                return Ok(Step::Again);
            }
            // Transient, or a fault of the environment (a missing table, 403): retried by
            // the caller, the next hint or sweep, never buried.
            Err(e) if !e.is_input_fault() => return Err(e),
            // The input's own fault: find the entry (or entries) that cause it and move
            // them aside, so the rest of the log keeps flowing.
            Err(e) if group.len() == 1 => self.bury(&group[0].to_entity(&shard.partition()), &e.to_string()).await?,
            Err(_) => {
                for entry in group {
                    let one = std::slice::from_ref(entry);
                    if let Err(e) = self.apply_upserts(one).await {
                        if !e.is_input_fault() {
                            return Err(e);
                        }
                        self.bury(&entry.to_entity(&shard.partition()), &e.to_string()).await?;
                    }
                }
            }
        }
        // Checkpoint first, then remove: an entry that is no longer pending is then always
        // at or below the checkpoint, so `wal_state` can tell applied from unknown.
        faults::point("before_checkpoint")?;
        if let Some(last) = group.iter().map(|e| &e.id).max() {
            self.wal.advance_checkpoint(shard, last).await?;
        }
        faults::point("before_remove_applied")?;
        self.remove_pending(shard, group).await?;
        Ok(Step::Applied(group.len()))
    }

    /// Runs `work` (one filter entry, which can read and write any number of pages) while
    /// renewing `lease` whenever it is past half its duration, checked every quarter of it, so
    /// a long filter keeps its shard instead of losing it to another applier halfway. `None`
    /// when the lease was lost (or could not be renewed in time): `work` is then dropped
    /// where it was, like a crash; every write it made is fenced and its next attempt
    /// completes it. A renewal that fails transiently is tried again at the next check.
    async fn keeping_lease<T>(&self, lease: &mut Lease, work: impl std::future::Future<Output = T>) -> Option<T> {
        let every = lease.duration() / 4;
        let keeper = async {
            loop {
                crate::env::sleep(every).await;
                match self.wal.keep_lease(lease).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) if e.is_transient() && lease.valid() => {
                        tracing::debug!(error = %e, "lease renewal failed during a filter; trying again");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewal failed during a filter: stopping it");
                        return;
                    }
                }
            }
        };
        // Biased: the work first, so a simulated run takes the same branch every time.
        tokio::select! {
            biased;
            out = work => Some(out),
            () = keeper => None,
        }
    }

    /// Removes applied entries from the shard's pending partition (already-removed ones are
    /// fine).
    async fn remove_pending(&self, shard: ShardId, entries: &[WalEntry]) -> Result<()> {
        let keys: Vec<String> = entries.iter().map(|e| e.id.to_string()).collect();
        Ok(bulk_delete::delete_rows(self.store.as_ref(), self.wal.table(), &shard.partition(), &keys).await?)
    }

    /// Moves an entry that can never be applied (as stored in its shard's partition) to the
    /// `dead` partition, with the reason, the shard it came from and the time.
    async fn bury(&self, entry: &Entity, reason: &str) -> Result<()> {
        tracing::error!(wal_id = %entry.row_key, shard = %entry.partition_key, %reason, "WAL entry cannot be applied; moved to the dead partition");
        let table = self.wal.table();
        let mut dead = entry.clone();
        dead.partition_key = DEAD.to_string();
        dead.etag = None;
        dead.properties.insert(DEAD_REASON.into(), Value::String(reason.chars().take(4000).collect()));
        dead.properties.insert(DEAD_FROM.into(), Value::String(entry.partition_key.clone()));
        dead.properties.insert(DEAD_AT.into(), Value::Int64(crate::wal::id::now_micros()));
        self.store.upsert(table, &dead).await?;
        match self.store.delete(table, &entry.partition_key, &entry.row_key, &IfMatch::Any).await {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
