//! WAL shards: which WAL partition an entry goes to.

/// Most shards a catalog can have.
pub const MAX_SHARDS: u16 = 64;
/// Shards of a new catalog when nothing is configured.
pub const DEFAULT_SHARDS: u16 = 4;
