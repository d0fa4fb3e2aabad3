//! The write-ahead log: how a write becomes durable before its multi-partition fan-out.
//! Applying it (fan-out, fencing, tombstones, the barrier) is [`crate::apply`].
//!
//! Layout of the WAL table (PartitionKey / RowKey):
//! - `wal`, `wal-01`.. / [`WalId`]: pending entries ([`entry`]) of each shard ([`shard`]).
//!   An entry is removed once applied.
//! - `wal` / `intent:{message}`: marks a queue intent as logged (see [`Wal::append_intent`]).
//! - `metadata` / `checkpoint`, and `wal-01`.. / `checkpoint`: the last applied WAL id of
//!   each shard, property `datetime` (shard 0's as the reference) ([`checkpoint`]).
//!   Catalogs from before keep `metadata` / `checkpoint-wal-01`.. rows, read as a floor.
//! - `clock` / `~high`: the high row, the largest id timestamp any process published and the
//!   schema version ([`clock`]). Catalogs from before keep per-process rows there (and
//!   `metadata` / `clock-*` rows): folded into the high row when it is created, then pruned
//!   by the sweeper.
//! - `metadata` / `lease-wal`, and `wal-01`.. / `lease`: the applier lease of each shard
//!   ([`lease`]).
//! - `wal`, `wal-01`.. / `seal`: each shard's seal ([`seal`]).
//! - `metadata` / `shards`: the shard count ([`shard`]).
//! - `metadata` / `schema`: the catalog schema, stored on first use.
//! - `tombstones` / `{WalId}_{hash}`: tombstones written by deletes, for the sweeper.
//! - `dead` / [`WalId`]: entries that can never be applied, with the reason, so they never
//!   block the entries behind them.

pub mod append;
pub mod checkpoint;
pub mod clock;
mod dead;
pub mod entry;
pub mod id;
mod layout;
pub mod lease;
mod log;
pub(crate) mod max_row;
mod options;
pub(crate) mod pace;
pub mod schema_row;
pub mod seal;
pub mod shard;

pub use dead::{DeadEntry, DeadPage};
pub use entry::{Op, WalEntry};
pub use id::WalId;
pub use layout::{
    intent_marker_key, DEAD, DEAD_AT, DEAD_FROM, DEAD_REASON, INTENT_PREFIX, METADATA, PENDING_BEFORE, SHARD,
    TOMBSTONES,
};
pub use log::{oldest_of, ShardBacklog, Wal, COUNT_CAP};
pub use options::WalOptions;
pub use shard::ShardId;

#[cfg(any(test, feature = "testing"))]
use crate::store::Entity;

/// Whether `e` is a pending WAL entry: in a shard partition, below the markers (how the
/// tests' fault injector recognises entry writes: `crate::store::fault::FaultStore::with_entries`).
#[cfg(any(test, feature = "testing"))]
pub fn is_pending_entry(e: &Entity) -> bool {
    ShardId::from_partition(&e.partition_key).is_some() && e.row_key.as_str() < PENDING_BEFORE
}
