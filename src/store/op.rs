//! The storage operations as a typed enum, one variant per method of [`super::table::TableStore`] and
//! [`super::queue::QueueStore`], shared by the wrappers that match on them (fault injection) or count
//! them ([`super::counting`]) or price them ([`super::sim`]). Always compiled.

use serde::Serialize;

/// One storage operation. Each call of a store method is exactly one `OpKind`; an entity
/// group transaction is one [`OpKind::Batch`] whatever its size, and
/// [`super::TableStore::count_range`] is one [`OpKind::Query`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `create_table`.
    CreateTable,
    /// `delete_table`.
    DeleteTable,
    /// `get` (point read).
    Get,
    /// `insert`.
    Insert,
    /// `upsert` (InsertOrReplace).
    Upsert,
    /// `replace` (conditional update).
    Replace,
    /// `delete` (conditional delete of one entity).
    Delete,
    /// `query_partition` and `count_range`.
    Query,
    /// `scan` (one page of a whole-table scan).
    Scan,
    /// `query_partitions` (one page of a PartitionKey range query, across partitions).
    QueryPartitions,
    /// `batch` (one entity group transaction).
    Batch,
    /// `create_queue`.
    CreateQueue,
    /// `delete_queue`.
    DeleteQueue,
    /// `put_message`.
    PutMessage,
    /// `receive_messages`.
    Receive,
    /// `delete_message`.
    DeleteMessage,
    /// `release_message` (update visibility).
    ReleaseMessage,
    /// `approximate_count` (queue metadata).
    Count,
}

impl OpKind {
    /// Every operation, in declaration order (`ALL[op.index()] == op`).
    pub const ALL: [OpKind; 18] = [
        OpKind::CreateTable,
        OpKind::DeleteTable,
        OpKind::Get,
        OpKind::Insert,
        OpKind::Upsert,
        OpKind::Replace,
        OpKind::Delete,
        OpKind::Query,
        OpKind::Scan,
        OpKind::QueryPartitions,
        OpKind::Batch,
        OpKind::CreateQueue,
        OpKind::DeleteQueue,
        OpKind::PutMessage,
        OpKind::Receive,
        OpKind::DeleteMessage,
        OpKind::ReleaseMessage,
        OpKind::Count,
    ];

    /// Position in [`OpKind::ALL`] (for array-indexed counters).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The snake_case name used in JSON (`"put_message"`).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::CreateTable => "create_table",
            OpKind::DeleteTable => "delete_table",
            OpKind::Get => "get",
            OpKind::Insert => "insert",
            OpKind::Upsert => "upsert",
            OpKind::Replace => "replace",
            OpKind::Delete => "delete",
            OpKind::Query => "query",
            OpKind::Scan => "scan",
            OpKind::QueryPartitions => "query_partitions",
            OpKind::Batch => "batch",
            OpKind::CreateQueue => "create_queue",
            OpKind::DeleteQueue => "delete_queue",
            OpKind::PutMessage => "put_message",
            OpKind::Receive => "receive",
            OpKind::DeleteMessage => "delete_message",
            OpKind::ReleaseMessage => "release_message",
            OpKind::Count => "count",
        }
    }

    /// True for operations that change state.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            OpKind::Insert
                | OpKind::Upsert
                | OpKind::Replace
                | OpKind::Delete
                | OpKind::Batch
                | OpKind::PutMessage
                | OpKind::DeleteMessage
                | OpKind::ReleaseMessage
        )
    }

    /// True for Queue service operations (the rest are Table service operations).
    pub fn is_queue(self) -> bool {
        matches!(
            self,
            OpKind::CreateQueue
                | OpKind::DeleteQueue
                | OpKind::PutMessage
                | OpKind::Receive
                | OpKind::DeleteMessage
                | OpKind::ReleaseMessage
                | OpKind::Count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order_and_names_match_serde() {
        for (i, op) in OpKind::ALL.iter().enumerate() {
            assert_eq!(op.index(), i, "{op:?}");
            assert_eq!(serde_json::to_value(op).unwrap(), serde_json::json!(op.name()));
        }
        assert_eq!(OpKind::ALL.iter().filter(|o| o.is_queue()).count(), 7);
    }
}
