//! Periodic maintenance (the timer function, or a timer task in `serve`):
//! - applies the shard when its oldest pending entry is older than a threshold (its queue
//!   hint was lost, or its applier died);
//! - removes tombstones once no entry they fence against can still be pending or in flight:
//!   written by an entry older than the oldest pending one and than the grace period, and
//!   themselves written more than the grace period ago (an entry applied from a backlog
//!   writes a tombstone with an old id while a stale applier may still hold an older entry);
//! - removes intent markers older than their time-to-live, and the clock rows of processes
//!   gone for an hour;
//! - reports pending count, oldest pending age and dead entries.

use std::time::Duration;

use serde::Serialize;

use super::apply::DrainOutcome;
use super::id::{format_micros, now_micros};
use super::{Wal, WalId, INTENT_PREFIX, SHARD, TOMBSTONES};
use crate::error::Result;
use crate::record::RowMeta;
use futures::TryStreamExt;

use crate::store::{pager, IfMatch, RowRange, StoreError, Value, MAX_PAGE};

/// What a sweep found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Entries still pending after the sweep.
    pub pending: u64,
    /// Age of the oldest pending entry, in milliseconds (by its id's timestamp).
    pub oldest_pending_age_ms: Option<u64>,
    /// Entries the sweep applied.
    pub applied: usize,
    /// True when another applier held the shard.
    pub busy: bool,
    /// Tombstones removed.
    pub tombstones_removed: usize,
    /// Intent markers removed.
    pub markers_removed: usize,
    /// Clock rows of processes gone for an hour removed (see [`super::clock::Clock::prune`]).
    pub clocks_removed: usize,
    /// Entries in the dead partition.
    pub dead: u64,
}

/// Age in ms of an entry id, by the local clock (0 when the id is in the future).
pub fn age_ms(id: &super::WalId) -> Option<u64> {
    id.micros().map(|ts| ((now_micros() - ts).max(0) / 1000) as u64)
}

impl Wal {
    /// Runs one sweep. Entries pending for longer than `apply_after` are applied.
    pub async fn sweep(&self, apply_after: Duration) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        // Only the oldest entry decides; counting a backlog (one query per 1,000 entries) is
        // left to the report below.
        let oldest = self.pending_page(1).await?.first().map(|e| WalId::from_stored(e.row_key.clone()));
        if oldest.is_some_and(|o| age_ms(&o).unwrap_or(u64::MAX) >= apply_after.as_millis() as u64) {
            match self.apply_pending().await? {
                DrainOutcome::Drained { applied } | DrainOutcome::Partial { applied } => report.applied = applied,
                DrainOutcome::Busy => report.busy = true,
            }
        }
        let (pending, oldest) = self.pending_stats().await?;
        report.pending = pending;
        report.oldest_pending_age_ms = oldest.as_ref().and_then(age_ms);
        let grace_horizon = now_micros() - self.opts.tombstone_grace.as_micros() as i64;
        let horizon = oldest.and_then(|o| o.micros()).map_or(grace_horizon, |o| o.min(grace_horizon));
        report.tombstones_removed = self.remove_tombstones(&format_micros(horizon), grace_horizon).await?;
        report.markers_removed = self.remove_markers().await?;
        report.clocks_removed = self.appender.clock.prune(self.store.as_ref(), &self.table).await?;
        report.dead = self.dead_count().await?;
        Ok(report)
    }

    /// Removes tombstones written by entries with ids below `horizon` and written (by the
    /// applier's clock) before `written_before` (microseconds since the epoch). Index entries
    /// of tombstones still too young are kept for a later sweep; the others are removed.
    async fn remove_tombstones(&self, horizon: &str, written_before: i64) -> Result<usize> {
        let range = RowRange { before: Some(horizon.to_string()), ..RowRange::default() };
        let mut removed = 0;
        let mut pages = pager::pages(self.store.as_ref(), &self.table, TOMBSTONES, &range, MAX_PAGE);
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
                match self.store.delete(&self.table, TOMBSTONES, &idx.row_key, &IfMatch::Any).await {
                    Ok(()) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(removed)
    }

    /// Removes intent markers older than their time-to-live.
    async fn remove_markers(&self) -> Result<usize> {
        let range =
            RowRange { from: Some(INTENT_PREFIX.to_string()), before: Some("intent;".into()), ..RowRange::default() };
        let cutoff = now_micros() - self.opts.intent_marker_ttl.as_micros() as i64;
        let mut removed = 0;
        let mut pages = pager::pages(self.store.as_ref(), &self.table, SHARD, &range, MAX_PAGE);
        while let Some(page) = pages.try_next().await? {
            for m in &page.entities {
                if matches!(m.properties.get("at"), Some(Value::Int64(at)) if *at < cutoff) {
                    match self.store.delete(&self.table, SHARD, &m.row_key, &IfMatch::Any).await {
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
