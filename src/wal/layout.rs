//! The layout of the WAL table (see the module docs of `super`): its partition keys, the
//! bounds of the pending entries' RowKeys, the properties of dead entries, and the RowKeys of
//! intent markers.

/// The PartitionKey of shard 0 (the partition of catalogs from before shards).
pub const SHARD: &str = "wal";
/// PartitionKey of metadata rows.
pub const METADATA: &str = "metadata";
/// PartitionKey of the tombstone index.
pub const TOMBSTONES: &str = "tombstones";
/// PartitionKey of entries that cannot be applied.
pub const DEAD: &str = "dead";
/// Property of a dead entry: why it can never be applied (at most 4,000 characters).
pub const DEAD_REASON: &str = "reason";
/// Property of a dead entry: the pending partition (shard) it was moved from. Absent on
/// entries buried before it existed.
pub const DEAD_FROM: &str = "from";
/// Property of a dead entry: when it was moved, in microseconds since the Unix epoch.
pub const DEAD_AT: &str = "died_at";
/// RowKeys of pending entries sort below this bound (ids start with a digit).
pub const PENDING_BEFORE: &str = ":";
/// RowKey prefix of intent markers in the shard partition.
pub const INTENT_PREFIX: &str = "intent:";

/// RowKey of the marker for queue message `message_id` (escaped; hashed when long).
pub fn intent_marker_key(message_id: &str) -> String {
    let escaped = crate::keys::escape_key(message_id);
    if escaped.encode_utf16().count() <= 200 {
        format!("{INTENT_PREFIX}{escaped}")
    } else {
        format!("{INTENT_PREFIX}md5-{}", crate::keys::fingerprint([message_id]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_marker_keys_are_bounded() {
        assert_eq!(intent_marker_key("abc-123"), "intent:abc-123");
        assert!(intent_marker_key(&"x/".repeat(300)).len() < 50);
        assert!(intent_marker_key("a").as_str() > PENDING_BEFORE);
    }
}
