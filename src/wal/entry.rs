//! WAL entries: what a write intends, stored as one entity in the shard's partition of the
//! WAL table (PartitionKey = shard, RowKey = [`WalId`]).
//!
//! Properties: `v` (format version, Int32), `op` (operation name, for people reading the
//! table), `n` (chunk count) and `b0`..`b{n-1}`: the operation as JSON, split so that no
//! string property exceeds the 64 KiB (32,768 UTF-16 units) property limit.

use serde::{Deserialize, Serialize};

use super::id::WalId;
use crate::query::Filter;
use crate::record::Record;
use crate::store::{Entity, Value};

/// The WAL entry format this build writes and reads.
pub const FORMAT_VERSION: i32 = 1;
/// Most UTF-16 units in one body chunk (the property limit is 32,768).
const CHUNK_UTF16: usize = 32_000;

/// A logged operation. Filters are resolved when the entry is applied, not when it is
/// logged, so a delete logged after a not-yet-applied insert still removes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// Store the record in every index (create or overwrite by identity).
    Upsert {
        /// The record.
        record: Record,
    },
    /// Delete the records matching the filter, then store the record.
    Replace {
        /// Which records to replace.
        filter: Filter,
        /// The new record.
        record: Record,
    },
    /// Delete the records matching the filter from every index.
    Delete {
        /// Which records to delete.
        filter: Filter,
    },
    /// A schema change took effect at this point of the log ([`crate::indexes`]): applying
    /// it (behind the barrier, like a filter entry) fences every applier onto schema
    /// `version` and then starts the job the change needs (backfill or row removal).
    Schema {
        /// The schema version the change created.
        version: u64,
    },
    /// Remove one catalog row that belongs to no record where it is (a `stray_row` finding
    /// of `verify`, logged by `repair`): the row (`partition_key`, `row_key`) is deleted
    /// when it is still the one the scan saw (ETag `etag`) and still does not belong under
    /// the schema the entry is applied with. A row written since, by an applier or by
    /// hand, is left alone, so this never removes what it did not judge.
    #[serde(rename = "remove_row")]
    RemoveRow {
        /// The row's PartitionKey.
        partition_key: String,
        /// The row's RowKey.
        row_key: String,
        /// The row's ETag when the scan judged it.
        etag: String,
    },
}

impl Op {
    /// The operation's name (`upsert`, `replace`, `delete`, `schema`, `remove_row`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Upsert { .. } => "upsert",
            Op::Replace { .. } => "replace",
            Op::Delete { .. } => "delete",
            Op::Schema { .. } => "schema",
            Op::RemoveRow { .. } => "remove_row",
        }
    }
}

/// One pending WAL entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WalEntry {
    /// Its id (RowKey).
    pub id: WalId,
    /// What to do.
    pub op: Op,
    /// The schema version its writer validated it under (property `sv`; 0 when absent, as
    /// on every entry from before schema versions). An applier whose schema is older
    /// re-reads the schema before applying it.
    pub schema_version: u64,
    /// Set when the entry was logged late ([`super::seal`]): the id it takes effect at
    /// (property `at`, [`WalId::stamped`]). `None`: it takes effect at [`WalEntry::id`].
    pub at: Option<WalId>,
    /// How far earlier attempts of a filter entry got (property `resume`): the RowKey of the
    /// last row of the filter's partition that an attempt stopped at its deadline had
    /// handled. Every row up to it (in the service's RowKey order), and the records those
    /// rows named, are done; an attempt reads on after it ([`crate::apply::filter`]).
    /// `None`: no attempt stopped at its deadline.
    pub resume: Option<String>,
}

/// The property holding a stamped entry's effective id.
pub const AT: &str = "at";
/// The property holding a filter entry's resume point ([`WalEntry::resume`]).
pub const RESUME: &str = "resume";

/// Why a stored entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("WAL entry {id}: {reason}")]
pub struct UnreadableEntry {
    /// RowKey of the entry.
    pub id: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Splits `text` into chunks of at most 32,000 UTF-16 units, each under the 64 KiB string
/// property limit (the WAL entry body and the history record use it; [`join_chunks`] reads
/// them back).
pub(crate) fn chunks(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut units = 0;
    for c in text.chars() {
        if units + c.len_utf16() > CHUNK_UTF16 {
            out.push(String::new());
            units = 0;
        }
        units += c.len_utf16();
        if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out
}

/// Reads back chunks `b0`..`b{n-1}` of an entity written with [`chunks`]; the error names
/// the first missing chunk.
pub(crate) fn join_chunks(e: &Entity, n: i32) -> Result<String, String> {
    let mut body = String::new();
    for i in 0..n {
        body.push_str(e.str(&format!("b{i}")).ok_or_else(|| format!("missing body chunk {i}"))?);
    }
    Ok(body)
}

impl WalEntry {
    /// The entity to store in partition `shard`.
    pub fn to_entity(&self, shard: &str) -> Entity {
        let body = serde_json::to_string(&self.op).unwrap_or_default();
        let parts = chunks(&body);
        let mut e = Entity::new(shard, self.id.as_str())
            .with("v", Value::Int32(FORMAT_VERSION))
            .with("op", Value::String(self.op.name().into()))
            .with("n", Value::Int32(parts.len() as i32));
        if self.schema_version > 0 {
            e.properties.insert("sv".into(), Value::Int64(self.schema_version as i64));
        }
        for (i, p) in parts.into_iter().enumerate() {
            e.properties.insert(format!("b{i}"), Value::String(p));
        }
        if let Some(at) = &self.at {
            e.properties.insert(AT.into(), Value::String(at.to_string()));
        }
        if let Some(resume) = &self.resume {
            e.properties.insert(RESUME.into(), Value::String(resume.clone()));
        }
        e
    }

    /// The id this entry takes effect at: its stamp when it was logged late, else its id.
    /// Every row it writes (catalog, tombstone, history) carries this id, and fencing
    /// compares it.
    pub fn effective(&self) -> &WalId {
        self.at.as_ref().unwrap_or(&self.id)
    }

    /// Reads an entry back; entries of an unknown format version or with a damaged body are
    /// reported, never guessed at.
    pub fn from_entity(e: &Entity) -> Result<WalEntry, UnreadableEntry> {
        let bad = |reason: String| UnreadableEntry { id: e.row_key.clone(), reason };
        match e.properties.get("v") {
            Some(Value::Int32(FORMAT_VERSION)) => {}
            other => return Err(bad(format!("unsupported format version {other:?}"))),
        }
        let n = match e.properties.get("n") {
            Some(Value::Int32(n)) if *n >= 1 => *n,
            _ => return Err(bad("missing chunk count".into())),
        };
        let body = join_chunks(e, n).map_err(bad)?;
        let op = serde_json::from_str(&body).map_err(|err| bad(format!("body is not a valid operation: {err}")))?;
        let schema_version = match e.properties.get("sv") {
            Some(Value::Int64(v)) => (*v).max(0) as u64,
            _ => 0,
        };
        let at = e.str(AT).map(|s| WalId::from_stored(s.to_string()));
        let resume = e.str(RESUME).map(str::to_string);
        Ok(WalEntry { id: WalId::from_stored(e.row_key.clone()), op, schema_version, at, resume })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_round_trip_including_large_bodies() {
        let record = json!({"name": "é😀".repeat(40_000), "n": 1}).as_object().cloned().unwrap();
        let entry = WalEntry {
            id: WalId::new(1, uuid::Uuid::nil()),
            op: Op::Upsert { record },
            schema_version: 3,
            at: None,
            resume: None,
        };
        let e = entry.to_entity("wal");
        assert!(e.properties.len() > 4, "body split into chunks");
        for (k, v) in &e.properties {
            if let Value::String(s) = v {
                assert!(s.encode_utf16().count() <= 32_768, "{k}");
            }
        }
        assert_eq!(WalEntry::from_entity(&e).unwrap(), entry);
        let del = WalEntry {
            id: WalId::new(2, uuid::Uuid::nil()),
            op: Op::Delete { filter: Filter::new(vec![("icao".into(), "KJFK".into())]) },
            schema_version: 0,
            at: Some(WalId::stamped(&WalId::new(3, uuid::Uuid::nil()), &WalId::new(2, uuid::Uuid::nil()))),
            resume: Some("0123abcd".into()),
        };
        assert_eq!(WalEntry::from_entity(&del.to_entity("wal")).unwrap(), del);
    }

    #[test]
    fn unreadable_entries_are_reported() {
        let mut e = WalEntry {
            id: WalId::new(1, uuid::Uuid::nil()),
            op: Op::Delete { filter: Filter::default() },
            schema_version: 0,
            at: None,
            resume: None,
        }
        .to_entity("wal");
        e.properties.insert("v".into(), Value::Int32(99));
        assert!(WalEntry::from_entity(&e).unwrap_err().reason.contains("version"));
        e.properties.insert("v".into(), Value::Int32(1));
        e.properties.insert("b0".into(), Value::String("{".into()));
        assert!(WalEntry::from_entity(&e).is_err());
    }
}
