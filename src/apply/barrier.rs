//! The low-watermark barrier: how replace and delete by filter keep their order against
//! every shard.
//!
//! A shard's low watermark is its oldest pending WAL id (infinity when nothing is pending):
//! every entry of the shard below it is applied. A filter entry F (logged in shard 0) is
//! applied only once every other shard's low watermark is above F's id.
//!
//! Why that is enough (the argument is spelled out in docs/ARCHITECTURE.md):
//! - Every write W acknowledged before F was issued has a smaller id (the allocator's order
//!   invariant) and was durable, so pending in its shard, before F was logged. The barrier
//!   waits until W is no longer pending, i.e. applied, so F's filter sees W's rows.
//! - Writes with ids above F that were applied before F are harmless: the only entries
//!   outside shard 0 are upserts, and every row write is fenced by WAL id, so F's
//!   tombstones and F's new record cannot overwrite a row written by a larger id, and what F
//!   reads from such a row (a match it then cannot overwrite) changes nothing. The outcome
//!   is that of applying in id order.
//! - Writes with ids below F that were not acknowledged when F was issued are concurrent
//!   with F; applying them after F is a valid order, as in the one-shard WAL.
//!
//! One check serves a whole page: a check that passes also reports the other shards' low
//! watermark L (the smallest pending id among them, or none). Every filter entry of the
//! same page with an id below L passes without another check. The page was read before the
//! check, so each such entry F' was logged before it; a write acknowledged before F' was
//! issued was durable before F' was logged, hence before the check, with an id below F' and
//! so below L: it was no longer pending at the check, i.e. applied. The argument needs the
//! page to have been read before the check, so the clearance never outlives its page (an
//! entry of a later page may have been logged after the check, and a write acknowledged
//! before it may have been logged after the check too). Without it, a backlog of filter
//! entries in shard 0 cost one query per other shard each.
//!
//! While it waits, the barrier applies the lagging shards itself when their lease is free
//! (a nested pass, which never waits on a barrier of its own, so there is no cycle), keeps
//! its own lease renewed, and gives up at the caller's deadline: the filter entry then stays
//! pending, its shard reports `Partial`, and the next hint or sweep retries. A shard whose
//! applier is frozen holds the barrier until its lease expires and another applier (or this
//! barrier) takes the shard over.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use super::{Applier, DrainOutcome};
use crate::error::Result;
use crate::faults;
use crate::wal::lease::Lease;
use crate::wal::{ShardId, WalId};

/// Whether a barrier passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Passed {
    /// Every other shard is past the id. `low_watermark` is the smallest pending id of the
    /// other shards seen by the check that passed (`None`: nothing was pending): a filter
    /// entry of the same page below it passes too (see the module docs).
    Yes {
        /// The other shards' low watermark at the check.
        low_watermark: Option<WalId>,
    },
    /// The deadline came first.
    NotYet,
    /// The waiting applier lost its own lease.
    LeaseLost,
}

/// One barrier check: the shards still behind an id, and the low watermark of them all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Behind {
    /// The shards other than the filter entry's whose low watermark is at or below its id.
    pub shards: Vec<ShardId>,
    /// The smallest pending id of the other shards (`None`: nothing pending).
    pub low_watermark: Option<WalId>,
}

/// What the barrier checks that passed on one page prove for the rest of that page (never
/// keep it past the page: see the module docs).
#[derive(Debug, Clone, Default)]
pub struct PageClearance {
    /// `Some(low)`: a check passed and saw low watermark `low` (`None`: nothing pending).
    passed: Option<Option<WalId>>,
}

impl PageClearance {
    /// True when a filter entry of this page with this id needs no check of its own.
    pub fn covers(&self, id: &WalId) -> bool {
        match &self.passed {
            None => false,
            Some(None) => true,
            Some(Some(low)) => id < low,
        }
    }

    /// Records a check that passed on this page.
    pub fn passed(&mut self, low_watermark: Option<WalId>) {
        self.passed = Some(low_watermark);
    }
}

impl Applier {
    /// The shards other than `own` whose low watermark is at or below `id`, and the low
    /// watermark of all of them (one request per shard, concurrently; the shard count is
    /// re-read, so shards added by another process are covered).
    pub async fn shards_behind(&self, own: ShardId, id: &WalId) -> Result<Behind> {
        let count = self.wal.current_shard_count().await?;
        let checks = ShardId::all(count)
            .filter(|s| *s != own)
            .map(|s| async move { Ok::<_, crate::Error>((s, self.wal.oldest_pending(s).await?)) });
        let oldest = futures::future::try_join_all(checks).await?;
        let shards = oldest.iter().filter(|(_, o)| o.as_ref().is_some_and(|o| o <= id)).map(|(s, _)| *s).collect();
        let low_watermark = oldest.into_iter().filter_map(|(_, o)| o).min();
        Ok(Behind { shards, low_watermark })
    }

    /// Waits until every shard other than `own` has applied every entry below `id` (see the
    /// module docs), applying lagging shards itself when it can. Returns at `deadline` at the
    /// latest.
    /// (Boxed: it runs nested apply passes, which is recursion through
    /// [`Applier::run_shard`].)
    pub(crate) fn barrier<'a>(
        &'a self,
        own: ShardId,
        id: &'a WalId,
        lease: &'a mut Lease,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Passed>> {
        Box::pin(self.wait_barrier(own, id, lease, deadline))
    }

    async fn wait_barrier(&self, own: ShardId, id: &WalId, lease: &mut Lease, deadline: Instant) -> Result<Passed> {
        let mut delay = Duration::from_millis(5);
        loop {
            let Behind { shards: behind, low_watermark } = self.shards_behind(own, id).await?;
            if behind.is_empty() {
                return Ok(Passed::Yes { low_watermark });
            }
            faults::point("barrier_wait")?;
            tracing::debug!(wal_id = %id, behind = behind.len(), "filter entry waits for the barrier");
            let passes = behind.iter().map(|s| self.run_shard(*s, deadline, true));
            let outcomes = futures::future::try_join_all(passes).await?;
            if Instant::now() >= deadline {
                return Ok(Passed::NotYet);
            }
            if !self.wal.keep_lease(lease).await? {
                return Ok(Passed::LeaseLost);
            }
            // A shard held by another applier (or stopped at its own filter entry): wait for
            // it, backing off; a shard applied here is re-checked at once.
            if outcomes.iter().any(|o| matches!(o, DrainOutcome::Busy | DrainOutcome::Partial { .. })) {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(delay.min(left)).await;
                delay = (delay * 2).min(Duration::from_millis(200));
            }
        }
    }
}
