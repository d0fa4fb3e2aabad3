//! Catching up before a read-your-writes query (`consistent=true`).
//!
//! Promise: a consistent read returns every write acknowledged before the read began, through
//! any process. Why catching up to the clock's high-water mark H, read after the request
//! began, keeps it:
//! - A write W acknowledged before the read began had its id published on the clock before
//!   its acknowledgement ([`crate::wal::clock`]), so H ≥ W's id.
//! - W was durable before its acknowledgement, so it is pending in its shard until applied
//!   (entries leave the pending partition only after they were applied).
//! - So once no shard holds a pending entry with an id ≤ H, every such W is applied, and a
//!   query made after that sees its rows (or, for a delete, their tombstones).
//!
//! Writes acknowledged while the read runs may or may not show, as with any read. A write
//! that failed (indeterminate) is not covered. A dead entry never applies, so it cannot hold
//! the read back.
//!
//! Cost: one request per shard (its oldest pending entry, concurrently) when nothing is
//! pending. Otherwise one clock read, then per lagging shard one count of its entries up to H
//! (keys only), and the apply passes. Bounded: above [`MAX_CATCH_UP`] entries to apply, or
//! past the deadline, it gives up ([`CaughtUp::Backlog`] / [`CaughtUp::NotYet`]), and the
//! caller answers 503 with `Retry-After` rather than serve a stale read labelled consistent.

use std::time::Duration;

use crate::env::Instant;

use super::applier::Applier;
use crate::error::Result;
use crate::store::RowRange;
use crate::wal::id::format_micros;
use crate::wal::{ShardId, WalId};

/// Most pending entries a consistent read applies before it answers; above it, the read is
/// refused ([`CaughtUp::Backlog`]).
pub const MAX_CATCH_UP: u64 = 1_000;

/// How catching up ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaughtUp {
    /// Every write acknowledged before the call is applied.
    Yes,
    /// More than [`MAX_CATCH_UP`] entries were pending below the high-water mark.
    Backlog {
        /// Entries pending at or below the high-water mark (counted up to the shards that
        /// were behind).
        pending: u64,
    },
    /// The deadline passed first (another applier holds a lagging shard, or applying is
    /// slow).
    NotYet,
}

impl Applier {
    /// Applies, here, every pending entry up to the clock's high-water mark read at the
    /// start (see the module docs), giving up at `deadline` or above [`MAX_CATCH_UP`]
    /// entries. Transient storage failures on the way are retried until `deadline`.
    pub async fn catch_up(&self, deadline: Instant) -> Result<CaughtUp> {
        let mut bound: Option<WalId> = None;
        let mut counted = false;
        let mut delays = crate::env::poll_delays(Duration::from_millis(5), Duration::from_millis(100));
        loop {
            match self.catch_up_round(deadline, &mut bound, &mut counted).await {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => {}
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
            if crate::env::now() >= deadline {
                return Ok(CaughtUp::NotYet);
            }
            // Another applier holds a lagging shard (it is applying it), or storage failed
            // for a moment: look again shortly.
            let left = deadline.saturating_duration_since(crate::env::now());
            crate::env::sleep(delays.next().unwrap_or(left).min(left)).await;
        }
    }

    /// One round: `Some` when caught up or refused, `None` after applying what it could.
    /// `bound` (every id at or below the high-water mark is below it) is read in the first
    /// round that finds anything pending; `counted` once the backlog was counted.
    async fn catch_up_round(
        &self,
        deadline: Instant,
        bound: &mut Option<WalId>,
        counted: &mut bool,
    ) -> Result<Option<CaughtUp>> {
        let count = self.wal.current_shard_count().await?;
        let oldest = self.oldest_pending_of(ShardId::all(count).collect()).await?;
        if oldest.is_empty() {
            return Ok(Some(CaughtUp::Yes));
        }
        let bound = match bound {
            Some(b) => b.clone(),
            None => bound.insert(WalId::from_stored(format_micros(self.wal.high_water().await? + 1))).clone(),
        };
        let behind: Vec<ShardId> = oldest.into_iter().filter(|(_, o)| *o < bound).map(|(s, _)| s).collect();
        if behind.is_empty() {
            return Ok(Some(CaughtUp::Yes));
        }
        if !*counted {
            let upto = RowRange { before: Some(bound.to_string()), ..RowRange::default() };
            let counts = futures::future::try_join_all(behind.iter().map(|s| {
                let upto = &upto;
                async move { self.store.count_range(self.wal.table(), &s.partition(), upto, u64::MAX).await }
            }))
            .await?;
            let pending: u64 = counts.iter().map(|(n, _)| n).sum();
            if pending > MAX_CATCH_UP {
                return Ok(Some(CaughtUp::Backlog { pending }));
            }
            *counted = true;
        }
        futures::future::try_join_all(behind.iter().map(|s| self.apply_shard_by(*s, deadline))).await?;
        Ok(None)
    }

    /// The oldest pending id of each of `shards` that has one: one request per shard,
    /// concurrently.
    async fn oldest_pending_of(&self, shards: Vec<ShardId>) -> Result<Vec<(ShardId, WalId)>> {
        let checks = shards
            .into_iter()
            .map(|s| async move { Ok::<_, crate::Error>(self.wal.oldest_pending(s).await?.map(|o| (s, o))) });
        Ok(futures::future::try_join_all(checks).await?.into_iter().flatten().collect())
    }
}
