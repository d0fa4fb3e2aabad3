//! Record <-> entity mapping.
//!
//! A record is a JSON object. Each top-level field becomes one typed property, so other
//! clients (the Python reference, Storage Explorer) read catalog rows naturally:
//! strings as `Edm.String`, booleans as `Edm.Boolean`, integers as `Edm.Int32` or `Edm.Int64`,
//! other numbers as `Edm.Double`. Values with no lossless EDM type (null, nested objects and
//! arrays, integers above `i64::MAX`) are stored as their JSON text in an `Edm.String`, and
//! their names are listed in the system property [`META`], so the record round-trips
//! exactly.
//!
//! [`META`] (`_tc`) also carries the WAL id that last wrote the row (fencing) and the
//! tombstone flag. Returned records never contain it or any other system property.
//!
//! Limits (Azure, "Understanding the Table service data model"): 252 user properties per
//! entity, of which we use one, so a record has at most [`MAX_FIELDS`] fields; property names
//! follow C# identifier rules, at most 255 characters; a string is at most 32,768 UTF-16
//! code units (64 KiB); an entity is at most 1 MiB. We also cap a record's JSON text at
//! [`MAX_RECORD_BYTES`] so that the record, its WAL entry and every index row fit in 1 MiB.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::store::{Entity, Properties, Value};

/// A catalog record: a JSON object.
pub type Record = Map<String, Json>;

/// Name of the system property on every catalog row.
pub const META: &str = "_tc";
/// Prefix reserved for system properties.
pub const RESERVED_PREFIX: &str = "_tc";
/// Most fields a record may have (252 user properties minus [`META`]).
pub const MAX_FIELDS: usize = 251;
/// Longest property name, in characters.
pub const MAX_NAME_CHARS: usize = 255;
/// Longest string value, in UTF-16 code units (Azure: 64 KiB).
pub const MAX_STRING_UTF16: usize = 32 * 1024;
/// Largest record, as compact JSON, in bytes.
pub const MAX_RECORD_BYTES: usize = 256 * 1024;
/// Deepest nesting of arrays and objects inside a record (the record itself is level 1).
pub const MAX_DEPTH: usize = 64;
/// Room kept in [`META`] for the WAL id and the flags, in UTF-16 units.
const META_RESERVE: usize = 256;

/// Names the Table service reserves for system properties.
const SYSTEM_NAMES: [&str; 4] = ["PartitionKey", "RowKey", "Timestamp", "ETag"];

/// The system property's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RowMeta {
    /// WAL id of the entry that last wrote the row; rows are only replaced by larger ids.
    #[serde(rename = "w", default)]
    pub wal_id: String,
    /// Fields stored as JSON text.
    #[serde(rename = "j", default, skip_serializing_if = "Vec::is_empty")]
    pub json_fields: Vec<String>,
    /// True on a tombstone: the record was deleted by `wal_id`.
    #[serde(rename = "d", default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// On a tombstone: when it was written, in microseconds since the Unix epoch by the
    /// applier's clock. An entry can be applied long after its id was allocated (a backlog),
    /// so the sweeper keeps a tombstone for the grace period counted from this time, not
    /// from its id. `None` on live rows and on tombstones written before this field existed.
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<i64>,
    /// The catalog's schema version the writer applied with (0, not stored: the catalog's
    /// first schema, and rows of releases before this field). An applier on an older schema
    /// must not overwrite the row: it re-reads the schema first (docs/ARCHITECTURE.md,
    /// "Order", step 10).
    #[serde(rename = "s", default, skip_serializing_if = "is_zero")]
    pub schema_version: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl RowMeta {
    /// Reads the system property of a row; rows written by other clients have none and get
    /// the empty WAL id (older than every id we write).
    pub fn of(entity: &Entity) -> RowMeta {
        entity.str(META).and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default()
    }
}

/// Checks a property name: C# identifier rules (letters, digits, `_`; not starting with a
/// digit), at most 255 characters, not a system name, not starting with `_tc`.
pub fn validate_field_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok_start = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !ok_start || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::invalid(format!(
            "field name '{}' is not a valid property name: use letters, digits and '_', not starting with a digit",
            name.escape_debug()
        )));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(Error::invalid(format!("field name '{name}' is longer than {MAX_NAME_CHARS} characters")));
    }
    if SYSTEM_NAMES.iter().any(|s| s.eq_ignore_ascii_case(name))
        || name.to_ascii_lowercase().starts_with(RESERVED_PREFIX)
    {
        return Err(Error::invalid(format!(
            "field name '{name}' is reserved (PartitionKey, RowKey, Timestamp, ETag and names starting with '{RESERVED_PREFIX}')"
        )));
    }
    Ok(())
}

/// Checks the shape and limits of a record without building an entity.
pub fn validate(record: &Record) -> Result<()> {
    if record.len() > MAX_FIELDS {
        return Err(Error::invalid(format!("record has {} fields; the limit is {MAX_FIELDS}", record.len())));
    }
    let mut json_names_units = 0;
    for (name, value) in record {
        validate_field_name(name)?;
        if depth(value) + 1 > MAX_DEPTH {
            return Err(Error::invalid(format!("field '{name}' is nested more than {MAX_DEPTH} levels deep")));
        }
        // Each field becomes one string property: the text itself, or its JSON text.
        let (units, what) = match value {
            Json::String(s) => (s.encode_utf16().count(), "UTF-16 code units"),
            other if typed(other).is_none() => {
                json_names_units += name.len() + 3;
                (other.to_string().encode_utf16().count(), "UTF-16 code units as JSON text")
            }
            _ => (0, ""),
        };
        if units > MAX_STRING_UTF16 {
            return Err(Error::TooLarge(format!(
                "field '{name}' is {units} {what}; the limit is {MAX_STRING_UTF16} (64 KiB)"
            )));
        }
    }
    if json_names_units + META_RESERVE > MAX_STRING_UTF16 {
        return Err(Error::TooLarge(format!(
            "record has too many null, nested or very large numeric fields with long names: their names take {json_names_units} of the {} UTF-16 units the system property can list",
            MAX_STRING_UTF16 - META_RESERVE
        )));
    }
    let size = serde_json::to_string(record).map(|s| s.len()).unwrap_or(usize::MAX);
    if size > MAX_RECORD_BYTES {
        return Err(Error::TooLarge(format!(
            "record is {size} bytes as JSON; the limit is {MAX_RECORD_BYTES} (256 KiB)"
        )));
    }
    Ok(())
}

/// Nesting depth of a value (scalars 0, `[]` and `{}` 1).
fn depth(value: &Json) -> usize {
    match value {
        Json::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Json::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Maps a JSON value to a property value; `None` when it needs JSON text (null, nested
/// values, integers above `i64::MAX`, and `-0.0`, whose sign a Double does not keep on every
/// service).
fn typed(value: &Json) -> Option<Value> {
    match value {
        Json::String(s) => Some(Value::String(s.clone())),
        Json::Bool(b) => Some(Value::Bool(*b)),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i32::try_from(i).map_or(Value::Int64(i), Value::Int32))
            } else if n.is_f64() {
                n.as_f64().filter(|f| !(*f == 0.0 && f.is_sign_negative())).map(Value::Double)
            } else {
                None // u64 above i64::MAX
            }
        }
        _ => None,
    }
}

/// The properties of a catalog row for `record`, written by WAL entry `wal_id`.
/// `record` must have passed [`validate`].
pub fn to_properties(record: &Record, wal_id: &str) -> Properties {
    let mut props = Properties::new();
    let mut meta = RowMeta { wal_id: wal_id.to_string(), ..RowMeta::default() };
    for (name, value) in record {
        let v = typed(value).unwrap_or_else(|| {
            meta.json_fields.push(name.clone());
            Value::String(value.to_string())
        });
        props.insert(name.clone(), v);
    }
    props.insert(META.to_string(), Value::String(meta_json(&meta)));
    props
}

/// The properties of a tombstone of `record` written by WAL entry `wal_id`. A tombstone
/// keeps the record it deleted, so a delete that is applied again after a crash finds the
/// same records (its filter is resolved against live rows and its own tombstones).
pub fn tombstone_properties(record: &Record, wal_id: &str, written_at_us: i64) -> Properties {
    let mut props = to_properties(record, wal_id);
    edit_meta(&mut props, |meta| {
        meta.deleted = true;
        meta.deleted_at = Some(written_at_us);
    });
    props
}

/// Marks the row `props` (built by [`to_properties`] or [`tombstone_properties`]) as written
/// under schema version `version` ([`RowMeta::schema_version`]).
pub fn set_schema_version(props: &mut Properties, version: u64) {
    if version != 0 {
        edit_meta(props, |meta| meta.schema_version = version);
    }
}

/// Changes the system property of the row `props` in place.
fn edit_meta(props: &mut Properties, edit: impl FnOnce(&mut RowMeta)) {
    let mut meta = props
        .get(META)
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str::<RowMeta>(s).ok())
        .unwrap_or_default();
    edit(&mut meta);
    props.insert(META.to_string(), Value::String(meta_json(&meta)));
}

fn meta_json(meta: &RowMeta) -> String {
    serde_json::to_string(meta).unwrap_or_default()
}

/// The record stored in a row, without system properties; `None` for a tombstone.
/// Rows written by other clients (typed properties only) are read as they are.
pub fn from_entity(entity: &Entity) -> Option<Record> {
    let meta = RowMeta::of(entity);
    (!meta.deleted).then(|| payload(entity, &meta))
}

/// The record a row carries, live or tombstone, given its parsed [`RowMeta`].
pub fn payload(entity: &Entity, meta: &RowMeta) -> Record {
    let mut record = Record::new();
    for (name, value) in &entity.properties {
        if name == META || name.starts_with("odata.") || name.ends_with("@odata.type") {
            continue;
        }
        let json = match value {
            Value::String(s) if meta.json_fields.iter().any(|f| f == name) => {
                serde_json::from_str(s).unwrap_or_else(|_| Json::String(s.clone()))
            }
            Value::String(s) | Value::DateTime(s) | Value::Guid(s) => Json::String(s.clone()),
            Value::Int32(i) => Json::from(*i),
            Value::Int64(i) => Json::from(*i),
            Value::Double(f) => {
                serde_json::Number::from_f64(*f).map_or_else(|| Json::String(f.to_string()), Json::Number)
            }
            Value::Bool(b) => Json::Bool(*b),
            Value::Binary(b) => {
                use base64::Engine as _;
                Json::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
        };
        record.insert(name.clone(), json);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(v: Json) -> Record {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn round_trips_every_json_shape_exactly() {
        let r = rec(json!({
            "s": "it's / é 😀", "t": true, "f": false, "i": 7, "neg": -2147483649i64,
            "big": 9007199254740993i64, "max": i64::MAX, "min": i64::MIN, "huge": u64::MAX,
            "x": 0.1, "e": 1e300, "whole": 100.0, "n": null,
            "obj": {"a": [1, {"b": null}], "c": "d"}, "arr": [1, "2", 3.5, false], "empty": ""
        }));
        validate(&r).unwrap();
        let props = to_properties(&r, "w1");
        assert_eq!(props["i"], Value::Int32(7));
        assert_eq!(props["big"], Value::Int64(9007199254740993));
        assert_eq!(props["whole"], Value::Double(100.0));
        let e = Entity { partition_key: "p".into(), row_key: "r".into(), etag: None, properties: props };
        let back = from_entity(&e).unwrap();
        assert_eq!(back, r);
        assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(&r).unwrap());
        assert_eq!(RowMeta::of(&e).wal_id, "w1");
    }

    #[test]
    fn reads_rows_written_by_the_reference() {
        let e = Entity::new("3_eidf314", "faux:ec8246f2")
            .with("eid", Value::String("F314".into()))
            .with("n", Value::Int64(5))
            .with("d", Value::Double(1.5))
            .with("operation", Value::String("insert".into()));
        let r = from_entity(&e).unwrap();
        assert_eq!(Json::Object(r), json!({"eid": "F314", "n": 5, "d": 1.5, "operation": "insert"}));
        assert_eq!(RowMeta::of(&e).wal_id, "");
    }

    #[test]
    fn tombstones_are_not_records() {
        let r = rec(json!({"a": 1, "n": null}));
        let e = Entity { properties: tombstone_properties(&r, "w9", 42), ..Entity::new("p", "r") };
        assert_eq!(from_entity(&e), None);
        let meta = RowMeta::of(&e);
        assert!(meta.deleted);
        assert_eq!(meta.wal_id, "w9");
        assert_eq!(meta.deleted_at, Some(42));
        assert_eq!(payload(&e, &meta), r);
    }

    #[test]
    fn rejects_reserved_and_invalid_names() {
        for name in ["PartitionKey", "rowkey", "Timestamp", "_tc", "_TCx", "1abc", "a-b", "a b", "é", ""] {
            let r = rec(json!({ name: 1 }));
            let err = validate(&r).unwrap_err().to_string();
            assert!(err.contains("field name"), "{name}: {err}");
        }
        assert!(validate(&rec(json!({ "a".repeat(256): 1 }))).is_err());
        assert!(validate(&rec(json!({ "a".repeat(255): 1 }))).is_ok());
        assert!(validate(&rec(json!({"operation": "x", "_x": 1}))).is_ok());
    }

    #[test]
    fn enforces_property_count_and_sizes() {
        let mut r = Record::new();
        for i in 0..MAX_FIELDS {
            r.insert(format!("f{i}"), json!(i));
        }
        validate(&r).unwrap();
        r.insert("one_more".into(), json!(1));
        assert!(validate(&r).unwrap_err().to_string().contains("limit is 251"));
        let long = rec(json!({"s": "é".repeat(MAX_STRING_UTF16 + 1)}));
        assert!(matches!(validate(&long), Err(Error::TooLarge(m)) if m.contains("'s'")));
        assert!(validate(&rec(json!({"s": "😀".repeat(MAX_STRING_UTF16 / 2)}))).is_ok());
        let mut big = Record::new();
        for i in 0..10 {
            big.insert(format!("f{i}"), json!("x".repeat(30_000)));
        }
        assert!(matches!(validate(&big), Err(Error::TooLarge(m)) if m.contains("256 KiB")));
    }
}
