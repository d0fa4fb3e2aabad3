//! Applying the WAL: the fan-out from pending entries to catalog rows.
//!
//! Protocol (one applier per shard at a time, under the lease):
//! 1. Read pending entries in id order (all that are pending, whatever the checkpoint says:
//!    an entry logged late with a small id is still applied).
//! 2. Apply each entry. Runs of upserts are applied together: each row gets the last write
//!    of the run, rows of different partitions are written concurrently. Replace and delete
//!    resolve their filter now, against live rows and their own tombstones (so a retry after
//!    a crash finds the same records), record their tombstones in the tombstone index, then
//!    write the tombstones and (replace) the new record.
//! 3. After each group (a run of up to 64 upserts, or one replace or delete), advance the
//!    checkpoint and then remove its entries from the pending partition, so a lost lease or a
//!    crash costs at most the group in flight.
//!
//! Fencing: every catalog row carries the id of the entry that last wrote it
//! ([`crate::record::RowMeta`]), and a row is only replaced by a larger id (ETag-conditional).
//! So applying any entry again, in any order, concurrently with a stale lease holder, cannot
//! bring back an older payload or resurrect a deleted record: the outcome is that of applying
//! the entries once, in id order.
//!
//! An entry that can never be applied (unreadable, or its record no longer valid) is moved
//! to the `dead` partition with the reason, so it never blocks the entries behind it.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};

use super::id::now_micros;
use super::lease::Lease;
use super::{Op, Wal, WalEntry, WalId, DEAD, PENDING_BEFORE, SHARD, TOMBSTONES};
use crate::error::{Error, Result};
use crate::faults;
use crate::query::Filter;
use crate::record::{self, Record, RowMeta};
use crate::store::{pager, BatchOp, Entity, IfMatch, RowRange, StoreError, Value, MAX_BATCH_OPS, MAX_PAGE};

/// What an apply pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// This caller applied entries until none were pending.
    Drained {
        /// Entries applied (or moved aside as dead).
        applied: usize,
    },
    /// Another applier holds the shard; it re-checks for pending entries before it stops.
    Busy,
    /// This caller applied entries and stopped at its time budget with entries still pending.
    Partial {
        /// Entries applied (or moved aside as dead).
        applied: usize,
    },
}

/// A row to write: a live record or a tombstone of one.
#[derive(Debug, Clone, Copy)]
enum RowWrite<'a> {
    Live(&'a Record),
    Tombstone(&'a Record),
}

/// Longest run of upserts applied together.
const UPSERT_RUN: usize = 64;
/// Pending entries read per request while draining (two groups of upserts).
pub const DRAIN_PAGE: usize = 2 * UPSERT_RUN;

impl Wal {
    /// Applies every pending entry, unless another applier holds the shard's lease; stops
    /// at a page boundary after [`super::WalOptions::apply_budget`].
    pub async fn apply_pending(&self) -> Result<DrainOutcome> {
        self.apply_pending_by(std::time::Instant::now() + self.opts.apply_budget).await
    }

    /// Like [`Wal::apply_pending`], but stops at the first page boundary past `deadline`
    /// ([`DrainOutcome::Partial`]); a page is at most [`DRAIN_PAGE`] entries.
    pub async fn apply_pending_by(&self, deadline: std::time::Instant) -> Result<DrainOutcome> {
        let Ok(_guard) = self.apply_lock.try_lock() else {
            return Ok(DrainOutcome::Busy);
        };
        let mut applied = 0;
        loop {
            let Some(mut lease) = self.acquire_lease().await? else {
                return Ok(if applied > 0 { DrainOutcome::Drained { applied } } else { DrainOutcome::Busy });
            };
            let result = self.drain(&mut lease, deadline).await;
            self.release_lease(lease).await;
            match result? {
                Some((n, false)) => applied += n,
                Some((n, true)) => return Ok(DrainOutcome::Partial { applied: applied + n }),
                None => return Ok(DrainOutcome::Busy),
            }
            // Writers that found the lease taken while we held it rely on this re-check.
            if self.pending_page(1).await?.is_empty() {
                return Ok(DrainOutcome::Drained { applied });
            }
        }
    }

    /// Applies pending entries page by page: `(applied, stopped at the budget)`, or `None`
    /// when the lease was lost. Pages of [`DRAIN_PAGE`] entries are read one ahead while the
    /// current one is applied, so the first group starts after one short read and the
    /// reads overlap the writes.
    async fn drain(&self, lease: &mut Lease, deadline: std::time::Instant) -> Result<Option<(usize, bool)>> {
        let mut applied = 0;
        let mut pages = self.prefetch_pending();
        loop {
            if !self.keep_lease(lease).await? {
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
                    Ok(entry) => entries.push(entry),
                    Err(bad) => self.bury(e, &bad.reason).await?,
                }
            }
            if !self.apply_entries(&entries, lease).await? {
                return Ok(None);
            }
            applied += page.len();
            if std::time::Instant::now() >= deadline {
                return Ok(Some((applied, true)));
            }
        }
    }

    /// Reads the pending entries in id order, one page ahead of the consumer, in a task of
    /// its own (it stops when the receiver is dropped). A page is `Err` once, then the
    /// channel closes.
    fn prefetch_pending(&self) -> tokio::sync::mpsc::Receiver<Result<Vec<Entity>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (store, table) = (self.store.clone(), self.table.clone());
        tokio::spawn(async move {
            let range = RowRange { before: Some(PENDING_BEFORE.into()), ..RowRange::default() };
            let mut pages = pager::pages(store.as_ref(), &table, SHARD, &range, DRAIN_PAGE);
            while let Some(page) = pages.next().await {
                let failed = page.is_err();
                if tx.send(page.map(|p| p.entities).map_err(Error::from)).await.is_err() || failed {
                    return;
                }
            }
        });
        rx
    }

    /// Applies entries in order, group by group, each group removed from the pending
    /// partition and checkpointed as soon as it is applied, so a lost lease or a crash never
    /// costs more than the group in flight. `Ok(false)` when the lease was lost.
    async fn apply_entries(&self, entries: &[WalEntry], lease: &mut Lease) -> Result<bool> {
        let mut i = 0;
        while i < entries.len() {
            if !self.keep_lease(lease).await? {
                return Ok(false);
            }
            let run = entries[i..].iter().take(UPSERT_RUN).take_while(|e| matches!(e.op, Op::Upsert { .. })).count();
            let group = &entries[i..i + run.max(1)];
            let result = if run > 0 { self.apply_upserts(group).await } else { self.apply_filtered(&group[0]).await };
            match result {
                Ok(()) => {}
                Err(e) if e.is_transient() => return Err(e),
                // A permanent failure: find the entry (or entries) that cause it and move them
                // aside, so the rest of the log keeps flowing.
                Err(e) if group.len() == 1 => self.bury(&group[0].to_entity(SHARD), &e.to_string()).await?,
                Err(_) => {
                    for entry in group {
                        let one = std::slice::from_ref(entry);
                        if let Err(e) = self.apply_upserts(one).await {
                            if e.is_transient() {
                                return Err(e);
                            }
                            self.bury(&entry.to_entity(SHARD), &e.to_string()).await?;
                        }
                    }
                }
            }
            // Checkpoint first, then remove: an entry that is no longer pending is then always
            // at or below the checkpoint, so `wal_state` can tell applied from unknown.
            faults::point("before_checkpoint")?;
            if let Some(last) = group.iter().map(|e| &e.id).max() {
                self.advance_checkpoint(last).await?;
            }
            faults::point("before_remove_applied")?;
            self.remove_pending(group).await?;
            i += group.len();
        }
        Ok(true)
    }

    /// A run of upserts: the last write of each row wins, rows written concurrently.
    async fn apply_upserts(&self, group: &[WalEntry]) -> Result<()> {
        let mut rows: BTreeMap<(String, String), (&WalId, &Record)> = BTreeMap::new();
        for entry in group {
            let Op::Upsert { record } = &entry.op else { continue };
            let keys = self.schema.record_keys(record)?;
            for (_, pk) in keys.partitions {
                rows.insert((pk, keys.row_key.clone()), (&entry.id, record));
            }
        }
        self.write_rows(rows.into_iter().map(|((pk, rk), (id, rec))| (pk, rk, id, RowWrite::Live(rec))).collect()).await
    }

    /// Replace or delete: resolve the filter page by page, tombstoning what each page
    /// matched (so memory stays bounded by a page, whatever the filter matches), then write
    /// the new record.
    async fn apply_filtered(&self, entry: &WalEntry) -> Result<()> {
        let (filter, new_record) = match &entry.op {
            Op::Replace { filter, record } => (filter, Some(record)),
            Op::Delete { filter } => (filter, None),
            Op::Upsert { .. } => return self.apply_upserts(std::slice::from_ref(entry)).await,
        };
        let new_keys = new_record.map(|r| self.schema.record_keys(r)).transpose()?;
        let new_rows: BTreeSet<(String, String)> =
            new_keys.iter().flat_map(|k| k.partitions.iter().map(|(_, pk)| (pk.clone(), k.row_key.clone()))).collect();
        let pk = filter.partition_key()?;
        let range = filter.row_range();
        let mut pages = pager::pages(self.store.as_ref(), &self.catalog_table, &pk, &range, MAX_PAGE);
        while let Some(page) = pages.try_next().await? {
            let mut doomed: BTreeMap<(String, String), Record> = BTreeMap::new();
            for (row_key, rec) in self.matches(filter, &entry.id, &page.entities) {
                let rows = match self.schema.record_keys(&rec) {
                    Ok(k) => k.partitions.into_iter().map(|(_, pk)| (pk, k.row_key.clone())).collect(),
                    // A row another client wrote that our schema cannot key: remove the row found.
                    Err(_) => vec![(pk.clone(), row_key)],
                };
                for row in rows {
                    if !new_rows.contains(&row) {
                        doomed.insert(row, rec.clone());
                    }
                }
            }
            if doomed.is_empty() {
                continue;
            }
            self.index_tombstones(&entry.id, doomed.keys()).await?;
            let writes = doomed
                .iter()
                .map(|((pk, rk), rec)| (pk.clone(), rk.clone(), &entry.id, RowWrite::Tombstone(rec)))
                .collect();
            self.write_rows(writes).await?;
        }
        if let Some(record) = new_record {
            let writes =
                new_rows.iter().map(|(pk, rk)| (pk.clone(), rk.clone(), &entry.id, RowWrite::Live(record))).collect();
            self.write_rows(writes).await?;
        }
        Ok(())
    }

    /// The records of one page of the filter's partition that the filter addresses for
    /// entry `id`: live matching rows, plus rows this same entry already turned into
    /// tombstones (a re-application after a crash). Returns (RowKey, record).
    fn matches(&self, filter: &Filter, id: &WalId, entities: &[Entity]) -> Vec<(String, Record)> {
        let mut out = Vec::new();
        for e in entities {
            let meta = RowMeta::of(e);
            if (meta.deleted && meta.wal_id != id.as_str()) || !filter.in_sort_range(&e.row_key) {
                continue;
            }
            let rec = record::payload(e, &meta);
            if filter.matches(&rec) {
                out.push((e.row_key.clone(), rec));
            }
        }
        out
    }

    /// Records the tombstones entry `id` is about to write, so the sweeper can find them.
    async fn index_tombstones<'a>(&self, id: &WalId, rows: impl Iterator<Item = &'a (String, String)>) -> Result<()> {
        let entities: Vec<Entity> = rows
            .map(|(pk, rk)| {
                let hash = crate::keys::fingerprint([format!("{pk}\u{1}{rk}").as_str()]);
                Entity::new(TOMBSTONES, format!("{id}_{hash}_{}", rk.len()))
                    .with("pk", Value::String(pk.clone()))
                    .with("rk", Value::String(rk.clone()))
            })
            .collect();
        let mut by_key: BTreeMap<String, Entity> = BTreeMap::new();
        for e in entities {
            by_key.insert(e.row_key.clone(), e);
        }
        let all: Vec<Entity> = by_key.into_values().collect();
        for chunk in all.chunks(MAX_BATCH_OPS) {
            let ops: Vec<BatchOp> = chunk.iter().cloned().map(BatchOp::Upsert).collect();
            self.store.batch(&self.table, TOMBSTONES, &ops).await?;
        }
        Ok(())
    }

    async fn write_rows(&self, rows: Vec<(String, String, &WalId, RowWrite<'_>)>) -> Result<()> {
        // Build owned entities first: the futures then borrow only `self`.
        let futures: Vec<_> = rows
            .into_iter()
            .map(|(pk, rk, id, write)| {
                let properties = match write {
                    RowWrite::Live(r) => record::to_properties(r, id.as_str()),
                    RowWrite::Tombstone(r) => record::tombstone_properties(r, id.as_str(), now_micros()),
                };
                self.put_row(Entity { partition_key: pk, row_key: rk, etag: None, properties }, id.to_string())
            })
            .collect();
        futures::stream::iter(futures)
            .buffer_unordered(self.opts.apply_concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// Writes one catalog row unless it already carries entry `id` or a larger one.
    async fn put_row(&self, entity: Entity, id: String) -> Result<()> {
        self.put_row_fenced(&entity, &id).await?;
        faults::point("after_fanout_row")
    }

    /// The fenced write: a new row costs one insert; a row this process saw before costs one
    /// conditional replace (see [`super::row_cache`]); otherwise insert, 409, read, replace.
    async fn put_row_fenced(&self, entity: &Entity, id: &str) -> Result<()> {
        let table = &self.catalog_table;
        let (pk, rk) = (&entity.partition_key, &entity.row_key);
        if let Some((tag, seen)) = self.rows.get(pk, rk) {
            if seen.as_str() >= id {
                return Ok(()); // written by this entry already, or by a newer one
            }
            match self.store.replace(table, entity, &IfMatch::Etag(tag)).await {
                Ok(tag) => {
                    self.rows.put(pk, rk, tag, id);
                    return Ok(());
                }
                Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => self.rows.forget(pk, rk),
                Err(e) => return Err(e.into()),
            }
        }
        match self.store.insert(table, entity).await {
            Ok(tag) => {
                self.rows.put(pk, rk, tag, id);
                return Ok(());
            }
            Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        loop {
            let Some(current) = self.store.get(table, pk, rk).await? else {
                match self.store.insert(table, entity).await {
                    Ok(tag) => {
                        self.rows.put(pk, rk, tag, id);
                        return Ok(());
                    }
                    Err(StoreError::AlreadyExists(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            let tag = current
                .etag
                .clone()
                .ok_or_else(|| Error::Store(StoreError::Other("row read without an ETag".into())))?;
            let current_id = RowMeta::of(&current).wal_id;
            if current_id.as_str() >= id {
                self.rows.put(pk, rk, tag, &current_id);
                return Ok(()); // written by this entry already, or by a newer one
            }
            match self.store.replace(table, entity, &IfMatch::Etag(tag)).await {
                Ok(tag) => {
                    self.rows.put(pk, rk, tag, id);
                    return Ok(());
                }
                Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Removes applied entries from the pending partition (already-removed ones are fine).
    async fn remove_pending(&self, entries: &[WalEntry]) -> Result<()> {
        for chunk in entries.chunks(MAX_BATCH_OPS) {
            let ops: Vec<BatchOp> =
                chunk.iter().map(|e| BatchOp::Delete { row_key: e.id.to_string(), if_match: IfMatch::Any }).collect();
            match self.store.batch(&self.table, SHARD, &ops).await {
                Ok(_) => {}
                // Another applier removed some: fall back to one by one.
                Err(StoreError::BatchFailed { .. }) => {
                    for e in chunk {
                        match self.store.delete(&self.table, SHARD, e.id.as_str(), &IfMatch::Any).await {
                            Ok(()) | Err(StoreError::NotFound(_)) => {}
                            Err(err) => return Err(err.into()),
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Moves an entry that can never be applied to the `dead` partition, with the reason.
    async fn bury(&self, entry: &Entity, reason: &str) -> Result<()> {
        tracing::error!(wal_id = %entry.row_key, %reason, "WAL entry cannot be applied; moved to the dead partition");
        let mut dead = entry.clone();
        dead.partition_key = DEAD.to_string();
        dead.etag = None;
        dead.properties.insert("reason".into(), Value::String(reason.chars().take(4000).collect()));
        self.store.upsert(&self.table, &dead).await?;
        match self.store.delete(&self.table, SHARD, &entry.row_key, &IfMatch::Any).await {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
