//! Record history: one row per (record identity, applied change) in the table
//! `{catalog}history`, newest first (the log-tail pattern).
//!
//! Layout of a history row:
//! - **PartitionKey** = the record's identity, i.e. the RowKey of its catalog rows (already an
//!   escaped key of at most 1 KiB), so "the last N changes of a record" is one query of one
//!   partition.
//! - **RowKey** = `{i64::MAX - t:019}_{u'}` where `t` is the WAL id's time in microseconds and
//!   `u'` the id's UUID with every hex digit complemented (`0`↔`f`). The zero-padded inverted
//!   time makes the newest change sort first ("log tail pattern": pad the inverted ticks so
//!   they sort as strings); the complemented UUID makes two entries of the same microsecond
//!   (the id clock can give concurrent writers of different processes the same one) sort
//!   newest first too, so RowKey order is exactly descending WAL-id order. The key is unique
//!   per entry and the same on every re-application, which makes the write idempotent.
//! - Properties: `op` (`upsert` / `replace` / `delete`, [`ChangeOp`]), `wal_id`, `time` (the
//!   WAL id's time, Int64 µs since the Unix epoch), `v` (format, 1), and the record after the
//!   change as compact JSON split like a WAL entry body (`n` chunks `b0..`, each under the
//!   64 KiB string property limit); `n` = 0 when the change removed the record.
//!
//! **Superseded markers.** An entry applied under its own id and then, logged late, stamped
//! after a seal (docs/ARCHITECTURE.md, "Order", step 2) takes effect only at the stamp. Its
//! stamped application replaces the row of its own id with a marker (property
//! [`SUPERSEDED_BY`]: the stamped row's key, no `op`), not a deletion: a stale applier still
//! writing the unstamped application meets the marker (its insert answers 409, which counts
//! as written) instead of writing the row back (simulator seed 5522). Readers skip markers
//! ([`is_marker`]); retention counts and removes them like rows.
//!
//! A replace or delete by filter writes a row for every identity its filter matched (record
//! absent) and, for a replace, one for the new record. The rows are written by the apply path
//! (`crate::apply`), after the change's catalog rows and before its group is checkpointed;
//! see docs/ARCHITECTURE.md, "History", for the idempotence argument and the cost.

pub(crate) mod change;
pub(crate) mod read;
pub(crate) mod retention;

pub(crate) use change::marker;
pub use change::{
    inverted_time, is_marker, parse_switch, row_key, Change, ChangeOp, HistoryEntry, HistoryOptions, DEFAULT_ENABLED,
    FORMAT_VERSION, MAX_DAYS, MAX_PER_RECORD, SUPERSEDED_BY,
};
pub use read::{HistoryPage, MAX_IDENTITIES};
