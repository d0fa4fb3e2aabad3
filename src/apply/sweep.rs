//! Periodic maintenance (the timer function, or a timer task in `serve`), over every shard:
//! - applies a shard when its oldest pending entry is older than a threshold (its queue
//!   hint was lost, or its applier died);
//! - removes tombstones once no entry they fence against can still be pending or in flight:
//!   written by an entry older than the oldest pending one of every shard and than the grace
//!   period, and
//!   themselves written more than the grace period ago (an entry applied from a backlog
//!   writes a tombstone with an old id while a stale applier may still hold an older entry);
//! - removes intent markers older than their time-to-live, and the clock rows of processes
//!   gone for an hour;
//! - reports pending count, oldest pending age and dead entries.

use serde::Serialize;

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::outcome::DrainOutcome;
use crate::error::Result;
use crate::record::RowMeta;
use crate::store::{pager, IfMatch, RowRange, StoreError, Value, MAX_PAGE};
use crate::wal::id::{format_micros, now_micros};
use crate::wal::{ShardId, WalId, INTENT_PREFIX, SHARD, TOMBSTONES};

/// What a sweep found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Entries still pending after the sweep, over every shard.
    pub pending: u64,
    /// Age of the oldest pending entry of any shard, in milliseconds (by its id's timestamp).
    pub oldest_pending_age_ms: Option<u64>,
    /// Entries the sweep applied.
    pub applied: usize,
    /// True when another applier held a shard the sweep meant to apply.
    pub busy: bool,
    /// Shards swept.
    pub shards: u16,
    /// Tombstones removed.
    pub tombstones_removed: usize,
    /// Intent markers removed.
    pub markers_removed: usize,
    /// Clock rows of processes gone for an hour removed (see `crate::wal::clock::Clock::prune`).
    pub clocks_removed: usize,
    /// Entries in the dead partition.
    pub dead: u64,
}

/// Age in ms of an entry id, by the local clock (0 when the id is in the future).
pub fn age_ms(id: &WalId) -> Option<u64> {
    id.micros().map(|ts| ((now_micros() - ts).max(0) / 1000) as u64)
}

/// Shards applied by one sweep at the same time.
pub const SWEEP_PARALLEL: usize = 8;

impl Applier {
    /// Runs one sweep. Shards whose oldest entry has been pending longer than `apply_after`
    /// are applied, up to [`SWEEP_PARALLEL`] at a time.
    pub async fn sweep(&self, apply_after: std::time::Duration) -> Result<SweepReport> {
        let count = self.wal.current_shard_count().await?;
        let mut report = SweepReport { shards: count, ..SweepReport::default() };
        let after_ms = apply_after.as_millis() as u64;
        let outcomes: Vec<Result<Option<DrainOutcome>>> = futures::stream::iter(ShardId::all(count))
            .map(|s| async move {
                // Only the oldest entry decides; counting a backlog is left to the report below.
                let oldest = self.wal.oldest_pending(s).await?;
                if oldest.is_some_and(|o| age_ms(&o).unwrap_or(u64::MAX) >= after_ms) {
                    return Ok(Some(self.apply_shard(s).await?));
                }
                Ok(None)
            })
            .buffer_unordered(SWEEP_PARALLEL)
            .collect()
            .await;
        for outcome in outcomes {
            match outcome? {
                Some(DrainOutcome::Busy) => report.busy = true,
                Some(o) => report.applied += o.applied(),
                None => {}
            }
        }
        let backlog = self.wal.backlog_over(count).await?;
        report.pending = backlog.iter().map(|b| b.pending).sum();
        let oldest = crate::wal::oldest_of(&backlog);
        report.oldest_pending_age_ms = oldest.as_ref().and_then(age_ms);
        let grace_horizon = now_micros() - self.opts.tombstone_grace.as_micros() as i64;
        let horizon = oldest.and_then(|o| o.micros()).map_or(grace_horizon, |o| o.min(grace_horizon));
        report.tombstones_removed = self.remove_tombstones(&format_micros(horizon), grace_horizon).await?;
        report.markers_removed = self.remove_markers().await?;
        report.clocks_removed = self.wal.appender.clock.prune(self.store.as_ref(), self.wal.table()).await?;
        report.dead = self.wal.dead_count().await?;
        Ok(report)
    }

    /// Removes tombstones written by entries with ids below `horizon` and written (by the
    /// applier's clock) before `written_before` (microseconds since the epoch). Index entries
    /// of tombstones still too young are kept for a later sweep; the others are removed.
    async fn remove_tombstones(&self, horizon: &str, written_before: i64) -> Result<usize> {
        let range = RowRange { before: Some(horizon.to_string()), ..RowRange::default() };
        let mut removed = 0;
        let mut pages = pager::pages(self.store.as_ref(), self.wal.table(), TOMBSTONES, &range, MAX_PAGE);
        while let Some(page) = pages.try_next().await? {
            for idx in &page.entities {
                let (Some(pk), Some(rk)) = (idx.str("pk"), idx.str("rk")) else { continue };
                // A row gone, live again, or a newer tombstone (indexed under its own id) only
                // loses its index entry.
                if let Some(row) = self.store.get(&self.catalog_table, pk, rk).await? {
                    let meta = RowMeta::of(&row);
                    if meta.deleted && meta.wal_id.as_str() < horizon {
                        if meta.deleted_at.is_some_and(|at| at >= written_before) {
                            continue; // too young: a stale applier may still hold an older entry
                        }
                        let tag = row.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
                        match self.store.delete(&self.catalog_table, pk, rk, &tag).await {
                            Ok(()) => removed += 1,
                            Err(StoreError::NotFound(_) | StoreError::PreconditionFailed(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                match self.store.delete(self.wal.table(), TOMBSTONES, &idx.row_key, &IfMatch::Any).await {
                    Ok(()) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(removed)
    }

    /// Removes intent markers (all in shard 0's partition) older than their time-to-live.
    async fn remove_markers(&self) -> Result<usize> {
        let range =
            RowRange { from: Some(INTENT_PREFIX.to_string()), before: Some("intent;".into()), ..RowRange::default() };
        let cutoff = now_micros() - self.opts.intent_marker_ttl.as_micros() as i64;
        let mut removed = 0;
        let mut pages = pager::pages(self.store.as_ref(), self.wal.table(), SHARD, &range, MAX_PAGE);
        while let Some(page) = pages.try_next().await? {
            for m in &page.entities {
                if matches!(m.properties.get("at"), Some(Value::Int64(at)) if *at < cutoff) {
                    match self.store.delete(self.wal.table(), SHARD, &m.row_key, &IfMatch::Any).await {
                        Ok(()) => removed += 1,
                        Err(StoreError::NotFound(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(removed)
    }
}
