//! History rows: the history options, one change of a record as the applier records it
//! ([`Change`]) and a history row as read back ([`HistoryEntry`]); the row layout is in the
//! docs of the `history` module.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::record::Record;
use crate::settings;
use crate::store::{Entity, Value};
use crate::wal::entry::{chunks, join_chunks};
use crate::wal::WalId;

/// Whether history is kept when `TABLE_CATALOG_HISTORY` is unset: off, because it costs one
/// more storage request per record per apply group and keeps every past version of a record
/// (deleted ones included) until retention removes them; an audit trail is opted into.
pub const DEFAULT_ENABLED: bool = false;
/// The history row format this build writes and reads.
pub const FORMAT_VERSION: i32 = 1;
/// Longest `TABLE_CATALOG_HISTORY_DAYS` (100 years).
pub const MAX_DAYS: u32 = 36_500;
/// Largest `TABLE_CATALOG_HISTORY_MAX`.
pub const MAX_PER_RECORD: u32 = 1_000_000;

/// Property of a superseded marker: the RowKey of the stamped row that replaced it.
pub const SUPERSEDED_BY: &str = "superseded_by";

/// True for a superseded marker (see the module docs), which is not a change.
pub fn is_marker(e: &Entity) -> bool {
    e.properties.contains_key(SUPERSEDED_BY)
}

/// The marker that replaces row `row_key` of `identity`, superseded by row `stamped`.
pub(crate) fn marker(identity: &str, row_key: &str, stamped: &str) -> Entity {
    Entity::new(identity, row_key).with(SUPERSEDED_BY, Value::String(stamped.to_string()))
}

/// History tunables of a catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Write history rows when applying ([`DEFAULT_ENABLED`] unless set).
    pub enabled: bool,
    /// Remove a record's history rows older than this many days (1..=[`MAX_DAYS`]); `None`
    /// keeps them.
    pub keep_days: Option<u32>,
    /// Keep at most about this many rows per record (1..=[`MAX_PER_RECORD`]); `None` keeps
    /// all. See `retention` for the slack.
    pub max_per_record: Option<u32>,
}

impl HistoryOptions {
    /// History on, no retention limit.
    pub fn on() -> HistoryOptions {
        HistoryOptions { enabled: true, ..HistoryOptions::default() }
    }

    /// Checks the limits; the error names the setting.
    pub fn validate(&self) -> Result<()> {
        if let Some(d) = self.keep_days {
            if !(1..=MAX_DAYS).contains(&d) {
                return Err(Error::Config(format!(
                    "{}: {d} is out of range 1..={MAX_DAYS} days",
                    settings::HISTORY_DAYS
                )));
            }
        }
        if let Some(m) = self.max_per_record {
            if !(1..=MAX_PER_RECORD).contains(&m) {
                return Err(Error::Config(format!(
                    "{}: {m} is out of range 1..={MAX_PER_RECORD} rows per record",
                    settings::HISTORY_MAX
                )));
            }
        }
        Ok(())
    }
}

/// Parses an on/off setting value (`on`, `off`, `true`, `false`, `1`, `0`, `yes`, `no`); the
/// error names the setting.
pub fn parse_switch(setting: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(Error::Config(format!("{setting}: '{value}' is not on or off"))),
    }
}

/// What a change did to a record, as stored in the `op` property.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeOp {
    /// An upsert (or insert) wrote the record.
    Upsert,
    /// A replace by filter: removed a matched record, or wrote the new one.
    Replace,
    /// A delete by filter removed the record.
    Delete,
}

impl ChangeOp {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Upsert => "upsert",
            ChangeOp::Replace => "replace",
            ChangeOp::Delete => "delete",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<ChangeOp> {
        [ChangeOp::Upsert, ChangeOp::Replace, ChangeOp::Delete].into_iter().find(|o| o.as_str() == s)
    }
}

/// One change of one record identity, as the applier records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change<'a> {
    /// The record's identity (the RowKey of its catalog rows).
    pub identity: String,
    /// The operation of the entry.
    pub op: ChangeOp,
    /// The entry.
    pub wal_id: &'a WalId,
    /// The record after the change; `None` when the change removed it.
    pub record: Option<&'a Record>,
}

/// `i64::MAX - micros`, zero-padded to 19 digits: newer times sort first.
pub fn inverted_time(micros: i64) -> String {
    format!("{:019}", i64::MAX - micros.max(0))
}

/// The history RowKey of WAL entry `id` (see the module docs). For a stamped id
/// `{seal}+{position}` ([`WalId::stamped`]: an entry logged late, taking effect just after
/// `seal`) it is `pred(row_key(seal))~{row_key(position)}`, where `pred` lowers the last hex
/// digit by one (with borrow): it sorts just before the seal's row (newer), after every row
/// of an id newer than the seal (their keys, of the same fixed length, are at most
/// `pred(row_key(seal))`), and among rows stamped with one seal, newer positions first.
pub fn row_key(id: &WalId) -> String {
    if let Some((seal, position)) = id.as_str().rsplit_once(crate::wal::id::STAMP) {
        let seal = row_key(&WalId::from_stored(seal.to_string()));
        return format!("{}~{}", predecessor(&seal), row_key(&WalId::from_stored(position.to_string())));
    }
    let (_, uuid) = id.as_str().split_once('_').unwrap_or(("", id.as_str()));
    let complemented: String = uuid
        .chars()
        .map(|c| match c.to_digit(16) {
            Some(d) if !c.is_ascii_uppercase() => char::from_digit(15 - d, 16).unwrap_or(c),
            _ => c,
        })
        .collect();
    format!("{}_{complemented}", inverted_time(id.micros().unwrap_or(0)))
}

/// `key` with its trailing hex number (the digits after the last `_` or `~`, dashes skipped)
/// lowered by one: the largest key of the same length below it. Unchanged when that number
/// is all zeros (a complemented UUID of all `f`s, which version-4 UUIDs never are).
fn predecessor(key: &str) -> String {
    let mut chars: Vec<char> = key.chars().collect();
    for c in chars.iter_mut().rev() {
        match c.to_digit(16) {
            Some(0) => *c = 'f',
            Some(d) => {
                *c = char::from_digit(d - 1, 16).unwrap_or(*c);
                return chars.into_iter().collect();
            }
            None if *c == '-' => {}
            None => break,
        }
    }
    key.to_string()
}

impl Change<'_> {
    /// The history row.
    pub fn to_entity(&self) -> Entity {
        let mut e = Entity::new(self.identity.clone(), row_key(self.wal_id))
            .with("v", Value::Int32(FORMAT_VERSION))
            .with("op", Value::String(self.op.as_str().into()))
            .with("wal_id", Value::String(self.wal_id.to_string()))
            .with("time", Value::Int64(self.wal_id.micros().unwrap_or(0)));
        let parts = match self.record {
            Some(r) => chunks(&serde_json::to_string(r).unwrap_or_default()),
            None => Vec::new(),
        };
        e.properties.insert("n".into(), Value::Int32(parts.len() as i32));
        for (i, p) in parts.into_iter().enumerate() {
            e.properties.insert(format!("b{i}"), Value::String(p));
        }
        e
    }
}

/// A history row as read back (`GET /api/records/history`, `table-catalog history`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// The record's identity (RowKey of its catalog rows).
    pub identity: String,
    /// What the change was.
    pub op: ChangeOp,
    /// The WAL entry that made it.
    pub wal_id: String,
    /// When: the WAL id's time, RFC 3339 UTC with microseconds.
    pub time: String,
    /// The same time in microseconds since the Unix epoch.
    pub time_us: i64,
    /// The record after the change; `None` when the change removed it.
    pub record: Option<Record>,
    /// The history RowKey (for continuation and diagnostics; not serialised).
    #[serde(skip)]
    pub row_key: String,
}

impl HistoryEntry {
    /// Reads a stored row; an unreadable row is an error naming it.
    pub fn from_entity(e: &Entity) -> Result<HistoryEntry> {
        let bad = |what: &str| {
            Error::Store(crate::store::StoreError::Other(format!(
                "history row {}/{}: {what}",
                e.partition_key, e.row_key
            )))
        };
        let op = e.str("op").and_then(ChangeOp::parse).ok_or_else(|| bad("missing or unknown op"))?;
        let time_us = match e.properties.get("time") {
            Some(Value::Int64(t)) => *t,
            _ => return Err(bad("missing time")),
        };
        let n = match e.properties.get("n") {
            Some(Value::Int32(n)) if *n >= 0 => *n,
            _ => return Err(bad("missing chunk count")),
        };
        let record = if n == 0 {
            None
        } else {
            let body = join_chunks(e, n).map_err(|m| bad(&m))?;
            Some(serde_json::from_str(&body).map_err(|_| bad("record is not a JSON object"))?)
        };
        Ok(HistoryEntry {
            identity: e.partition_key.clone(),
            op,
            wal_id: e.str("wal_id").unwrap_or_default().to_string(),
            time: format!("{}Z", crate::wal::id::format_micros(time_us)),
            time_us,
            record,
            row_key: e.row_key.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(micros: i64, uuid: &str) -> WalId {
        WalId::new(micros, uuid::Uuid::parse_str(uuid).unwrap())
    }

    #[test]
    fn stamped_ids_keep_descending_effective_order() {
        let id = |t: i64, u: u128| WalId::new(t, uuid::Uuid::from_u128(u));
        let seal = id(2_000, 0x10);
        let a = WalId::stamped(&seal, &id(1_000, 9));
        let b = WalId::stamped(&seal, &id(1_500, 1));
        let nested = WalId::stamped(&a, &id(1_200, 3));
        // Effective order, oldest first.
        let order = [id(1_999, 7), id(2_000, 0x0f), seal.clone(), a, nested, b, id(2_000, 0x11), id(2_001, 0)];
        for w in order.windows(2) {
            assert!(w[0] < w[1], "{} < {}", w[0], w[1]);
            assert!(row_key(&w[0]) > row_key(&w[1]), "history rows newest first: {} / {}", w[0], w[1]);
        }
        assert_eq!(predecessor("x_0a0-0"), "x_09f-f");
    }

    #[test]
    fn row_keys_sort_in_descending_wal_id_order_even_within_one_microsecond() {
        let ids = [
            id(1_000_000, "00000000-0000-0000-0000-000000000001"),
            id(1_000_000, "0f8fad5b-d9cb-469f-a165-70867728950e"),
            id(1_000_000, "ff000000-0000-0000-0000-000000000000"),
            id(1_000_001, "00000000-0000-0000-0000-000000000000"),
            id(9_999_999_999_999, "7d4c2b7e-0c1a-4f43-9a7b-3d2f1e0c9b8a"),
        ];
        let keys: Vec<String> = ids.iter().map(row_key).collect();
        for w in keys.windows(2) {
            assert!(w[0] > w[1], "{} should sort after {}", w[0], w[1]);
        }
        assert!(keys.iter().all(|k| k.len() == 19 + 1 + 36), "{keys:?}");
        assert_eq!(&keys[3][..19], "9223372036853775806");
        assert_ne!(row_key(&ids[0]), row_key(&ids[1]), "unique per entry");
    }

    #[test]
    fn rows_round_trip_with_large_records_split_under_the_property_limit() {
        let record = json!({"name": "é😀".repeat(40_000), "n": 1}).as_object().cloned().unwrap();
        let wal = id(1_763_699_340_123_456, "0f8fad5b-d9cb-469f-a165-70867728950e");
        let change =
            Change { identity: "faux:1234abcd".into(), op: ChangeOp::Replace, wal_id: &wal, record: Some(&record) };
        let e = change.to_entity();
        for (k, v) in &e.properties {
            if let Value::String(s) = v {
                assert!(s.encode_utf16().count() <= 32_768, "{k}");
            }
        }
        let back = HistoryEntry::from_entity(&e).unwrap();
        assert_eq!(back.record.as_ref(), Some(&record));
        assert_eq!(
            (back.op, back.wal_id.as_str(), back.time_us),
            (ChangeOp::Replace, wal.as_str(), 1_763_699_340_123_456)
        );
        assert_eq!(back.time, "2025-11-21T04:29:00.123456Z");
        let removed = Change { record: None, op: ChangeOp::Delete, ..change };
        assert_eq!(HistoryEntry::from_entity(&removed.to_entity()).unwrap().record, None);
    }

    #[test]
    fn options_are_checked_naming_the_setting() {
        assert!(HistoryOptions::on().validate().is_ok());
        let days = HistoryOptions { keep_days: Some(0), ..HistoryOptions::on() };
        assert!(days.validate().unwrap_err().to_string().contains(settings::HISTORY_DAYS));
        let max = HistoryOptions { max_per_record: Some(0), ..HistoryOptions::on() };
        assert!(max.validate().unwrap_err().to_string().contains(settings::HISTORY_MAX));
        assert!(parse_switch("X", "On").unwrap());
        assert!(!parse_switch("X", "0").unwrap());
        assert!(parse_switch("X", "maybe").unwrap_err().to_string().contains("X: 'maybe'"));
    }
}
