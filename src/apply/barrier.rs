//! The low-watermark barrier and the seals: how replace and delete by filter keep their
//! order against every shard, including entries that become durable out of id order.
//!
//! A shard's low watermark is its oldest pending WAL id (infinity when nothing is pending):
//! every entry of the shard below it is applied or not yet durable. A filter entry F
//! (logged in shard 0) resolves its filter only after its barrier passed:
//! 1. **publish**: the id clock's high-water mark is raised to the timestamp of the page's
//!    largest filter entry if it is below it, so every id allocated from now on is above
//!    every bound this barrier may seal;
//! 2. **check**: no other shard holds a pending entry at or below F's effective id, and
//!    F's own shard holds none below it except the entries of the page being applied
//!    (an own-shard entry missing from the page was logged after the page was read: the
//!    pass restarts from the oldest pending entry, [`Passed::Restart`]);
//! 3. **seal**: the seal ([`crate::wal::seal`]) of every other shard is raised to the bound;
//! 4. **check again** with the bound;
//! 5. **seal the own shard** at F's own effective id, between two checks of it
//!    (`Applier::seal_own`), for every filter entry, also one a page's clearance covers.
//!    The own shard still holds the page's later entries, so it is never sealed past an
//!    entry still to be applied: a seal left behind by an attempt that stopped (a deadline,
//!    a lost lease, a crash) covers only entries that became durable after its check.
//!
//! Why (the whole argument, with every case, is in docs/ARCHITECTURE.md, "Order"):
//! - A write W acknowledged before F was issued was durable before F was logged, hence
//!   before check 2, which waits until W is no longer pending, i.e. applied: F sees W.
//! - An entry U below the bound that check 2 did not see became durable after it, so after
//!   F was issued, and it is acknowledged only after step 1: U is concurrent with F, and
//!   every write issued after U's acknowledgement has an id above the bound. If its applier
//!   reads the seal after step 3, U is stamped and takes effect just after the bound; if it
//!   read the seal before, U was durable before check 4, which then waits until U is
//!   applied, so F sees it. Either way the outcome is that of an order.
//! - Entries with a larger effective id applied before F: fencing keeps F's tombstones off
//!   their rows, exactly as if they had been applied after F.
//!
//! One check serves a page: the bound is the largest effective id of the page's filter
//! entries below the other shards' low watermark seen by check 2; every filter entry of the
//! page at or below it passes with F. Each was logged before the page was read, so before
//! check 2, and the argument above holds for it unchanged. The clearance never outlives its
//! page (an entry of a later page may have been logged after the check).
//!
//! While it waits, the barrier applies the lagging shards itself when their lease is free
//! (a nested pass, which never waits on a barrier of its own, so there is no cycle), keeps
//! its own lease renewed, and gives up at the caller's deadline: the filter entry then stays
//! pending, its shard reports `Partial`, and the next hint or sweep retries. A shard whose
//! applier is frozen holds the barrier until its lease expires and another applier (or this
//! barrier) takes the shard over.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::env::Instant;

use futures::future::BoxFuture;

use super::applier::Applier;
use super::outcome::DrainOutcome;
use crate::error::Result;
use crate::faults;
use crate::wal::lease::Lease;
use crate::wal::{Op, ShardId, WalEntry, WalId};

/// Whether a barrier passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Passed {
    /// The filter entry may resolve. `cleared`: the bound its check sealed; a filter entry
    /// of the same page at or below it passes too (`None`: the schema fence, which clears
    /// nothing else).
    Yes {
        /// The sealed bound.
        cleared: Option<WalId>,
    },
    /// The deadline came first.
    NotYet,
    /// The waiting applier lost its own lease.
    LeaseLost,
    /// The filter entry's own shard holds an entry logged after the page was read with a
    /// smaller id: re-read the shard from its oldest pending entry.
    Restart,
}

/// One barrier check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Behind {
    /// The shards other than the filter entry's whose low watermark is at or below the bound.
    pub shards: Vec<ShardId>,
    /// The smallest pending id of the other shards (`None`: nothing pending).
    pub low_watermark: Option<WalId>,
    /// The filter entry's own shard holds a pending entry below the bound that is not in the
    /// page being applied.
    pub own_late: bool,
    /// The shard count the check covered.
    pub count: u16,
}

/// What the barrier checks that passed on one page prove for the rest of that page (never
/// keep it past the page: see the module docs).
#[derive(Debug, Clone, Default)]
pub struct PageClearance {
    /// The bound a passed check sealed.
    cleared: Option<WalId>,
}

impl PageClearance {
    /// True when a filter entry of this page with this effective id needs no check of its own.
    pub fn covers(&self, id: &WalId) -> bool {
        self.cleared.as_ref().is_some_and(|c| id <= c)
    }

    /// Records a check that passed on this page.
    pub fn passed(&mut self, cleared: Option<WalId>) {
        if cleared > self.cleared {
            self.cleared = cleared;
        }
    }
}

impl Applier {
    /// One check against `bound`: the shards other than `own` whose low watermark is at or
    /// below it and the low watermark of them all (one request per shard, concurrently; the
    /// shard count is re-read, so shards added by another process are covered), and whether
    /// `own` holds a pending entry below it other than the entries of `page` (one more
    /// request).
    pub async fn shards_behind(&self, own: ShardId, bound: &WalId, page: &[WalEntry]) -> Result<Behind> {
        let count = self.wal.current_shard_count().await?;
        let checks = ShardId::all(count)
            .filter(|s| *s != own)
            .map(|s| async move { Ok::<_, crate::Error>((s, self.wal.oldest_pending(s).await?)) });
        let mine: BTreeSet<&str> = page.iter().filter(|e| e.id < *bound).map(|e| e.id.as_str()).collect();
        let own_pending = self.wal.pending_before(own, bound, mine.len() + 1);
        let (oldest, own_pending) =
            futures::future::try_join(futures::future::try_join_all(checks), own_pending).await?;
        let shards = oldest.iter().filter(|(_, o)| o.as_ref().is_some_and(|o| o <= bound)).map(|(s, _)| *s).collect();
        let low_watermark = oldest.into_iter().filter_map(|(_, o)| o).min();
        let own_late = own_pending.iter().any(|id| !mine.contains(id.as_str()));
        Ok(Behind { shards, low_watermark, own_late, count })
    }

    /// Waits until filter entry `page[0]` may resolve (see the module docs), applying lagging
    /// shards itself when it can; `page` is the rest of the page it was read in. Returns at
    /// `deadline` at the latest.
    /// (Boxed: it runs nested apply passes, which is recursion through
    /// [`Applier::run_shard`].)
    pub(crate) fn barrier<'a>(
        &'a self,
        own: ShardId,
        page: &'a [WalEntry],
        lease: &'a mut Lease,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Passed>> {
        Box::pin(self.wait_barrier(own, page, lease, deadline))
    }

    async fn wait_barrier(
        &self,
        own: ShardId,
        page: &[WalEntry],
        lease: &mut Lease,
        deadline: Instant,
    ) -> Result<Passed> {
        let Some(id) = page.first().map(WalEntry::effective) else {
            return Ok(Passed::Yes { cleared: None });
        };
        // Every id allocated from now on is above every bound this barrier may seal: an entry
        // that becomes durable after the first check is acknowledged only after this.
        let filters = page.iter().filter(|e| !matches!(e.op, Op::Upsert { .. })).map(WalEntry::effective);
        self.publish_at_least(filters.max().unwrap_or(id)).await?;
        let mut delays = crate::env::poll_delays(Duration::from_millis(5), Duration::from_millis(200));
        loop {
            let first = self.shards_behind(own, id, page).await?;
            if first.own_late {
                return Ok(Passed::Restart);
            }
            let behind = if first.shards.is_empty() {
                // The bound: the largest filter entry of the page this check clears.
                let bound = page
                    .iter()
                    .filter(|e| !matches!(e.op, Op::Upsert { .. }))
                    .map(WalEntry::effective)
                    .filter(|e| first.low_watermark.as_ref().is_none_or(|low| *e < low))
                    .max()
                    .unwrap_or(id);
                let seals = ShardId::all(first.count).filter(|s| *s != own).map(|s| self.wal.raise_seal(s, bound));
                futures::future::try_join_all(seals).await?;
                let again = self.shards_behind(own, bound, page).await?;
                if again.own_late {
                    return Ok(Passed::Restart);
                }
                if again.shards.is_empty() && again.count == first.count {
                    if !self.seal_own(own, page).await? {
                        return Ok(Passed::Restart);
                    }
                    return Ok(Passed::Yes { cleared: Some(bound.clone()) });
                }
                // Something became durable below the bound between the checks (stamped, or
                // applied before this entry resolves), or a shard was added: check again.
                again.shards
            } else {
                first.shards
            };
            faults::point("barrier_wait")?;
            tracing::debug!(wal_id = %id, behind = behind.len(), "filter entry waits for the barrier");
            let passes = behind.iter().map(|s| self.run_shard(*s, deadline, true));
            let outcomes = futures::future::try_join_all(passes).await?;
            if crate::env::now() >= deadline {
                return Ok(Passed::NotYet);
            }
            if !self.wal.keep_lease(lease).await? {
                return Ok(Passed::LeaseLost);
            }
            // A shard held by another applier (or stopped at its own filter entry): wait for
            // it, backing off; a shard applied here is re-checked at once.
            if behind.is_empty()
                || outcomes.iter().any(|o| matches!(o, DrainOutcome::Busy | DrainOutcome::Partial { .. }))
            {
                let left = deadline.saturating_duration_since(crate::env::now());
                crate::env::sleep(delays.next().unwrap_or(left).min(left)).await;
            }
        }
    }

    /// Seals the filter entry's own shard at the entry's own effective id (`page[0]`; `page`
    /// is the rest of the page it was read in): checks that the shard holds no pending entry
    /// below it except the page's, raises the seal, and checks again. False when an entry
    /// logged after the page was read turned up below it: the pass restarts from the oldest
    /// pending entry. Run for every filter entry, also one a page's clearance covers: the own
    /// shard is sealed one entry at a time, never past an entry that is still to be applied,
    /// so a seal left behind by an attempt that stopped (a deadline, a lost lease, a crash)
    /// covers only entries that became durable after its check (two queries, one seal).
    pub(crate) async fn seal_own(&self, own: ShardId, page: &[WalEntry]) -> Result<bool> {
        let Some(id) = page.first().map(WalEntry::effective) else { return Ok(true) };
        let mine: BTreeSet<&str> = page.iter().filter(|e| e.id < *id).map(|e| e.id.as_str()).collect();
        let late = |pending: Vec<WalId>| pending.iter().any(|p| !mine.contains(p.as_str()));
        if late(self.wal.pending_before(own, id, mine.len() + 1).await?) {
            return Ok(false);
        }
        self.wal.raise_seal(own, id).await?;
        Ok(!late(self.wal.pending_before(own, id, mine.len() + 1).await?))
    }

    /// Makes the id clock's high-water mark at least `bound`'s timestamp (at most one read;
    /// one publication when it is below, e.g. while the filter entry's own round still
    /// publishes), so every id allocated from now on is larger than every id stamped with
    /// `bound`.
    async fn publish_at_least(&self, bound: &WalId) -> Result<()> {
        let Some(micros) = bound.micros() else { return Ok(()) };
        self.wal.publish_at_least(micros).await
    }
}
