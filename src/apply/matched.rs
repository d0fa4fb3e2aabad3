//! What a filter entry's apply decided about one row of the partition it reads
//! ([`super::filter`]): a match, or a row a later entry wrote that the history must decide.
//! Its own file so that the filter and the fact-row reads (`super::fact`) both use it
//! without depending on each other.

use crate::record::Record;

/// A row of the filter's partition that the filter addresses.
pub(super) enum Match {
    /// A live row whose record matches (or this entry's own tombstone). `later`: a later
    /// entry wrote it (applied before this one; fencing keeps this entry off it).
    /// `wal_id`: the entry that wrote the row.
    Live { partition: String, row_key: String, record: Record, later: bool, wal_id: String },
    /// A row a later entry wrote (applied before this one) that does not show a match: a
    /// tombstone (the later entry moved the record to another value of an added index), or a
    /// live version that no longer matches (it changed a filtered field this partition does
    /// not read: a filter on two fields reads one field's partition). Only with history:
    /// whether this entry removed the version before it is for the history to say
    /// (`Applier::version_before`).
    LaterUnmatched { row_key: String },
}

impl Match {
    pub(super) fn row_key(&self) -> &str {
        match self {
            Match::Live { row_key, .. } | Match::LaterUnmatched { row_key } => row_key,
        }
    }
}
