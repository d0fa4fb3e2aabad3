//! Tunables of the WAL ([`WalOptions`]).

use std::time::Duration;

use super::shard;

/// Tunables of the WAL, with defaults suited to Azure.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// How long an applier lease lasts before others may take it over.
    pub lease_duration: Duration,
    /// Rows written concurrently during a fan-out.
    pub apply_concurrency: usize,
    /// How long a tombstone is kept after the delete that wrote it (must exceed the lease
    /// duration plus the longest storage request, so no stale applier can still write).
    pub tombstone_grace: Duration,
    /// How long an intent marker is kept (at least the queue message time-to-live: 7 days).
    pub intent_marker_ttl: Duration,
    /// Longest an apply pass keeps going before it stops at a group boundary (so one queue
    /// invocation stays well inside the Functions timeout; the rest is picked up by the next
    /// message or the sweeper).
    pub apply_budget: Duration,
    /// Offset added to this process's clock when allocating WAL ids, in microseconds (0 in
    /// production; the reliability tests skew writers' clocks with it).
    pub clock_skew_us: i64,
    /// WAL shards new entries are spread over (1..=`shard::MAX_SHARDS`): each has its own
    /// WAL partition, lease and checkpoint, and its own applier. A catalog remembers the
    /// largest count it was ever opened with, and appliers, the sweeper and `status` cover
    /// that many.
    pub shards: u16,
    /// Rows per page when a replace or delete reads its filter's partition (1..=1,000, the
    /// service's page limit; default 1,000). A filter entry past its pass's deadline stops
    /// between two such pages (`crate::apply::filter`); tests and the simulator make them
    /// small so filters span many pages.
    pub filter_page: usize,
    /// Most operations one process holds waiting for an append round (default 10,000). An
    /// append that would queue past it is refused at once with [`crate::Error::Busy`] (HTTP
    /// 503 with `Retry-After: 1`), before any WAL id is taken, so a flood of writes cannot
    /// grow the queue and every write's wait without bound. A call larger than the limit
    /// is still taken when nothing waits.
    pub max_queued_writes: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            lease_duration: Duration::from_secs(60),
            apply_concurrency: 32,
            tombstone_grace: Duration::from_secs(600),
            intent_marker_ttl: Duration::from_secs(8 * 24 * 3600),
            apply_budget: Duration::from_secs(60),
            clock_skew_us: 0,
            shards: shard::DEFAULT_SHARDS,
            filter_page: crate::store::MAX_PAGE,
            max_queued_writes: 10_000,
        }
    }
}
