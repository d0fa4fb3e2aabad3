//! What `Catalog::status` reports (and `GET /api/status`, and the gauges of
//! `crate::metrics`): the health of the WAL's shards and of the queues. Its own module, so
//! that the metrics can render it without depending on the catalog.

use serde::Serialize;

use crate::store::counting::RequestSnapshot;

/// Health of one WAL shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardStatus {
    /// The shard's WAL partition (`wal`, `wal-01`..).
    pub shard: String,
    /// Entries not yet applied; a lower bound when `pending_capped`.
    pub pending: u64,
    /// The count reached `crate::wal::COUNT_CAP`. Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pending_capped: bool,
    /// Age of the oldest pending entry, in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
    /// The last applied WAL id of this shard.
    pub checkpoint: Option<String>,
}

/// Health of the WAL and the queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// The catalog's mode, chosen at creation: `wal` or `single-partition`
    /// (`crate::Mode`; README, "Choosing a mode").
    pub mode: &'static str,
    /// Single-partition mode: the tenant key, the PartitionKey of every row. Omitted in WAL
    /// mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// WAL entries not yet applied, over every shard; a lower bound when `pending_capped`.
    pub pending: u64,
    /// Some shard's backlog reached the count cap (`crate::wal::COUNT_CAP` entries, counted
    /// so that a status read stays cheap under any backlog): `pending` is at least that much.
    /// Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pending_capped: bool,
    /// Age of the oldest pending entry of any shard, in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
    /// The largest checkpoint over the shards (the last applied WAL id).
    pub checkpoint: Option<String>,
    /// Each shard's pending count, oldest pending age and checkpoint.
    pub shards: Vec<ShardStatus>,
    /// Messages on the poison queue (approximate).
    pub poison: u64,
    /// WAL entries that could not be applied (see the WAL's `dead` partition).
    pub dead: u64,
    /// Storage requests this process has made since it opened its store, by operation and
    /// outcome (see [`crate::store::CountingStore`]). Present when the catalog was given its
    /// store's counters ([`Catalog::with_request_counts`](crate::Catalog::with_request_counts);
    /// [`crate::Config::open`] does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<RequestSnapshot>,
}
