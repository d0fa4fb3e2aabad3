//! What a verification finds: one [`Finding`] per disagreement, each one JSON line naming
//! the record identity (RowKey), the PartitionKeys and the WAL ids involved.

use serde::{Deserialize, Serialize};

/// The state of one row of a record, as a check saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowState {
    /// A live row.
    Live,
    /// A tombstone (the record was deleted by the row's WAL id).
    Tombstone,
    /// No row (or one that does not belong to the record, reported by itself as
    /// [`FindingKind::StrayRow`] or [`FindingKind::Unreadable`]).
    Missing,
}

/// One expected row of a record: its partition, state and the WAL id that last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenRow {
    /// The PartitionKey (one index value of the record).
    pub pk: String,
    /// Live, tombstone or missing.
    pub state: RowState,
    /// The row's WAL id (`_tc.w`; empty for rows written by other clients); `None` when
    /// missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_id: Option<String>,
}

/// What is wrong with a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FindingKind {
    /// A live record has no row in partition `pk` (one of its index values).
    MissingRow {
        /// The partition without the row.
        pk: String,
    },
    /// The live row in `pk` is all that is left of its record: the record's owner row (its
    /// first index value in schema order) and every other row are gone, as after a delete
    /// whose tombstones were removed before this row was. `repair` deletes it.
    OrphanRow {
        /// The orphan's partition.
        pk: String,
    },
    /// The live row in `pk`, of an index added online, is a value its record no longer has:
    /// an earlier row of the record (by schema order) is newer and does not list this
    /// partition. The apply of the upsert that moved the record tombstones such a row, so
    /// this is only seen with entries pending (verify a drained WAL) or after a fault.
    /// `repair` does not re-log anything for it (the record itself is consistent); dropping
    /// and adding the index again removes it.
    MovedRow {
        /// The left-behind row's partition.
        pk: String,
        /// The WAL id of the record's newer row.
        newest: String,
    },
    /// The row in `pk` differs from the record's newest row (by WAL id, or by payload under
    /// the same WAL id). `repair` re-logs the newest row.
    Stale {
        /// The stale row's partition.
        pk: String,
        /// Its WAL id.
        wal_id: String,
        /// The newest WAL id among the record's rows.
        newest: String,
    },
    /// Live rows and tombstones of one record (see [`Finding::rows`]). `repair` re-logs the
    /// state of the row with the highest WAL id: a delete or an upsert.
    SplitState,
    /// A live row whose payload keys to its RowKey, but whose record's index values do not
    /// include its partition `pk`: a copy of the record's row under another PartitionKey (a
    /// write lost halfway through an older release, an edit by hand). Queries of `pk` would
    /// return the record. `repair` removes it through the WAL, only while it is the row the
    /// scan saw (its ETag).
    StrayRow {
        /// The stray row's partition.
        pk: String,
    },
    /// A row that cannot be checked: its record cannot be keyed by the schema, or its keys
    /// give another RowKey than the row's. `repair` leaves it alone.
    Unreadable {
        /// The row's partition.
        pk: String,
        /// Why.
        reason: String,
    },
}

impl FindingKind {
    /// The kind's name in JSON (`"missing_row"`), for counts.
    pub fn name(&self) -> &'static str {
        match self {
            FindingKind::MissingRow { .. } => "missing_row",
            FindingKind::OrphanRow { .. } => "orphan_row",
            FindingKind::MovedRow { .. } => "moved_row",
            FindingKind::Stale { .. } => "stale",
            FindingKind::SplitState => "split_state",
            FindingKind::StrayRow { .. } => "stray_row",
            FindingKind::Unreadable { .. } => "unreadable",
        }
    }
}

/// One disagreement, serialised as one JSON line:
/// `{"kind":"missing_row","pk":"4_iatajfk","row_key":"john f kennedy…:1a2b3c4d","rows":[…]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What is wrong.
    #[serde(flatten)]
    pub kind: FindingKind,
    /// The record identity (RowKey).
    pub row_key: String,
    /// The record's rows as the check saw them, in schema order (for `unreadable`, the row
    /// itself).
    pub rows: Vec<SeenRow>,
}

impl Finding {
    /// The finding as one line of JSON (no line end).
    pub fn json_line(&self) -> String {
        // A struct of strings and enums always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }
}
