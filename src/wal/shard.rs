//! WAL shards: which WAL partition an entry goes to, and how many shards a catalog has.
//!
//! A catalog's WAL is split into N shards. Shard `k` is the WAL partition `wal` for k = 0 (the
//! partition of catalogs created before shards existed, so such a catalog is a one-shard
//! catalog as it stands) and `wal-{k:02}` otherwise. Each shard has its own lease
//! (`metadata/lease-{partition}`) and checkpoint (`metadata/checkpoint` for shard 0, the
//! reference's row; `metadata/checkpoint-{partition}` otherwise), so N appliers work in
//! parallel, and each partition stays under Azure's 2,000 entities/s per-partition target.
//!
//! Routing ([`ShardId::for_row_key`]): an upsert goes to the shard of its record's RowKey
//! (the record identity), `md5(RowKey)` read as a big-endian integer modulo N, so every write
//! of one record lands in one shard, applied in id order by one applier. Entries that read
//! the catalog to decide what to write (replace and delete by filter) and queue intents go to
//! shard 0; filter entries wait there for the low-watermark barrier
//! ([`crate::apply::barrier`]).
//!
//! The count: the row `metadata/shards` (property `count`) holds the largest count the
//! catalog was ever opened with (1 when absent). Opening with a larger count raises it
//! (compare-and-swap, never lowered), so appliers, the barrier, the sweeper and `status`
//! always cover every shard that may hold entries. Raising it is the migration: a
//! one-shard catalog opened with `--shards 8` keeps its pending entries in `wal` and spreads
//! new ones over eight shards.

use std::fmt;

use md5::{Digest, Md5};

use super::layout::METADATA;
use crate::error::{Error, Result};
use crate::store::{ETag, Entity, IfMatch, Store, StoreError, Value};

/// Most shards a catalog can have.
pub const MAX_SHARDS: u16 = 64;
/// Shards of a new catalog when nothing is configured (chosen by the simulated-Azure
/// benchmark: see docs/BENCHMARKS.md).
pub const DEFAULT_SHARDS: u16 = 4;
/// RowKey of the shard count row in the `metadata` partition.
pub const COUNT_ROW: &str = "shards";

/// One WAL shard (0..`MAX_SHARDS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(u16);

impl ShardId {
    /// Shard 0: partition `wal`, home of filter entries and queue intents.
    pub const ZERO: ShardId = ShardId(0);

    /// Shard `k`, if `k < MAX_SHARDS`.
    pub fn new(k: u16) -> Option<ShardId> {
        (k < MAX_SHARDS).then_some(ShardId(k))
    }

    /// Its number.
    pub fn index(self) -> u16 {
        self.0
    }

    /// The shards `0..count`.
    pub fn all(count: u16) -> impl Iterator<Item = ShardId> {
        (0..count.clamp(1, MAX_SHARDS)).map(ShardId)
    }

    /// The shard of a record with this RowKey in a catalog of `count` shards.
    pub fn for_row_key(row_key: &str, count: u16) -> ShardId {
        let count = count.clamp(1, MAX_SHARDS);
        if count == 1 {
            return ShardId::ZERO;
        }
        let digest = Md5::digest(row_key.as_bytes());
        let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        ShardId((n % u32::from(count)) as u16)
    }

    /// The WAL partition (PartitionKey) of this shard.
    pub fn partition(self) -> String {
        if self.0 == 0 {
            super::layout::SHARD.to_string()
        } else {
            format!("{}-{:02}", super::layout::SHARD, self.0)
        }
    }

    /// The shard whose partition is `name` (`wal`, `wal-01`..), as hints name it.
    pub fn from_partition(name: &str) -> Option<ShardId> {
        if name == super::layout::SHARD {
            return Some(ShardId::ZERO);
        }
        let digits = name.strip_prefix(super::layout::SHARD)?.strip_prefix('-')?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().and_then(ShardId::new).filter(|s| s.0 > 0)
    }

    /// Where this shard's checkpoint row lives, (PartitionKey, RowKey): `metadata/checkpoint`
    /// for shard 0 (the reference's row), `{partition}/checkpoint` in the shard's own
    /// partition otherwise, so checkpoint traffic spreads with the shards instead of
    /// concentrating on `metadata` (issue 30: with 64 shards the `metadata` partition held
    /// every lease and checkpoint and throttled at 32 instances).
    pub fn checkpoint_home(self) -> (String, String) {
        if self.0 == 0 {
            (METADATA.into(), CHECKPOINT_ROW.into())
        } else {
            (self.partition(), CHECKPOINT_ROW.into())
        }
    }

    /// RowKey of this shard's checkpoint row in `metadata` before it moved to the shard's
    /// partition (`checkpoint-{partition}`), read as a floor by a catalog written before the
    /// move ([`crate::wal::Wal::checkpoint`]). `None` for shard 0, whose row never moved.
    pub fn legacy_checkpoint_row(self) -> Option<String> {
        (self.0 > 0).then(|| format!("{CHECKPOINT_ROW}-{}", self.partition()))
    }

    /// Where this shard's lease row lives, (PartitionKey, RowKey): `metadata/lease-wal` for
    /// shard 0 (as before shards existed), `{partition}/lease` in the shard's own partition
    /// otherwise (see [`ShardId::checkpoint_home`]).
    pub fn lease_home(self) -> (String, String) {
        if self.0 == 0 {
            (METADATA.into(), format!("{LEASE_ROW}-{}", self.partition()))
        } else {
            (self.partition(), LEASE_ROW.into())
        }
    }
}

/// RowKey of a shard's checkpoint row (shard 0's in `metadata`, the others' in their own
/// partition). Sorts after every pending entry ([`super::PENDING_BEFORE`]).
pub const CHECKPOINT_ROW: &str = "checkpoint";
/// RowKey of a shard's lease row in its own partition (shard 0's is `lease-wal` in
/// `metadata`). Sorts after every pending entry ([`super::PENDING_BEFORE`]).
pub const LEASE_ROW: &str = "lease";

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.partition())
    }
}

/// Checks a configured shard count: 1..=[`MAX_SHARDS`].
pub fn check_count(setting: &str, count: u16) -> Result<u16> {
    if (1..=MAX_SHARDS).contains(&count) {
        Ok(count)
    } else {
        Err(Error::Config(format!("{setting}: {count} WAL shards is out of range 1..={MAX_SHARDS}")))
    }
}

fn count_of(e: &Entity) -> u16 {
    match e.properties.get("count") {
        Some(Value::Int32(n)) => (*n).clamp(1, i32::from(MAX_SHARDS)) as u16,
        _ => 1,
    }
}

/// The catalog's shard count as stored (1 when the row is absent: a catalog from before
/// shards, or a new one not yet opened).
pub async fn stored_count(store: &dyn Store, table: &str) -> Result<u16> {
    Ok(store.get(table, METADATA, COUNT_ROW).await?.as_ref().map_or(1, count_of))
}

/// Raises the stored count to at least `want` (never lowers it) and returns the count in
/// force afterwards. Concurrent raises are serialised by ETag; the largest wins.
pub async fn raise_count(store: &dyn Store, table: &str, want: u16) -> Result<u16> {
    loop {
        let current = store.get(table, METADATA, COUNT_ROW).await?;
        let have = current.as_ref().map_or(1, count_of);
        if current.is_some() && have >= want {
            return Ok(have);
        }
        let row = Entity::new(METADATA, COUNT_ROW).with("count", Value::Int32(i32::from(want.max(have))));
        let written = match &current {
            None => store.insert(table, &row).await,
            Some(c) => {
                let tag = c.etag.clone().unwrap_or(ETag(String::new()));
                store.replace(table, &row, &IfMatch::Etag(tag)).await
            }
        };
        match written {
            Ok(_) => return Ok(want.max(have)),
            Err(StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_round_trip_and_shard_zero_is_the_legacy_partition() {
        assert_eq!(ShardId::ZERO.partition(), "wal");
        assert_eq!(ShardId::ZERO.checkpoint_home(), ("metadata".to_string(), "checkpoint".to_string()));
        assert_eq!(ShardId::ZERO.lease_home(), ("metadata".to_string(), "lease-wal".to_string()));
        assert_eq!(ShardId::ZERO.legacy_checkpoint_row(), None);
        for k in 0..MAX_SHARDS {
            let s = ShardId::new(k).unwrap();
            assert_eq!(ShardId::from_partition(&s.partition()), Some(s));
        }
        assert_eq!(ShardId::new(3).unwrap().partition(), "wal-03");
        let three = ShardId::new(3).unwrap();
        assert_eq!(three.checkpoint_home(), ("wal-03".to_string(), "checkpoint".to_string()));
        assert_eq!(three.lease_home(), ("wal-03".to_string(), "lease".to_string()));
        assert_eq!(three.legacy_checkpoint_row().as_deref(), Some("checkpoint-wal-03"));
        // Both rows of a shard partition sort after its pending entries.
        assert!(CHECKPOINT_ROW > super::super::PENDING_BEFORE && LEASE_ROW > super::super::PENDING_BEFORE);
        for bad in ["wal-", "wal-3", "wal-00", "wal-64", "wal-x1", "dead", "wal-1a", "wal-+1"] {
            assert_eq!(ShardId::from_partition(bad), None, "{bad}");
        }
        assert!(ShardId::new(MAX_SHARDS).is_none());
    }

    #[test]
    fn routing_is_stable_and_spreads() {
        // Fixed values: routing must never change between versions (entries of one record
        // must keep landing in one shard).
        assert_eq!(ShardId::for_row_key("anything", 1), ShardId::ZERO);
        let a = ShardId::for_row_key("name:Kennedy_0123", 8);
        assert_eq!(a, ShardId::for_row_key("name:Kennedy_0123", 8));
        let mut seen = [0u32; 16];
        for i in 0..16_000 {
            seen[ShardId::for_row_key(&format!("k{i}"), 16).index() as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn counts_are_checked() {
        assert!(check_count("S", 0).is_err());
        assert!(check_count("S", MAX_SHARDS + 1).unwrap_err().to_string().contains("1..=64"));
        assert_eq!(check_count("S", 16).unwrap(), 16);
    }
}
