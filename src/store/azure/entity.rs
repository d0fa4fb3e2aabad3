//! Entities on the wire: typed [`Value`]s to and from the Table service's JSON, OData
//! literals and filters, and continuation tokens.
//!
//! Wire format ("Payload format for Table service operations"): a bare JSON string is
//! `Edm.String`, a bare integer `Edm.Int32`, a bare boolean `Edm.Boolean`; every other type
//! travels as a value plus a `"<name>@odata.type"` annotation. We always annotate Int64
//! (as a decimal string: `serde_json` would write a bare number, which the service reads as
//! Int32/Double and Azurite stores with JavaScript precision), Double (so `1.0` is not read
//! back as Int32; NaN and the infinities as the strings `NaN`/`Infinity`/`-Infinity`),
//! DateTime, Guid and Binary (base64). Responses carry `odata.*` metadata, `Timestamp` and
//! annotations, all of which are tolerated and dropped; `odata.etag` is the ETag of query
//! results.

use base64::Engine as _;
use serde_json::{Map, Number, Value as Json};

use crate::store::error::{StoreError, StoreResult};
use crate::store::page::{PartitionRange, RowRange};
use crate::store::value::check_entity;
use crate::store::value::{ETag, Entity, Properties, Value};

/// A JSON entity as the crates read and write it.
pub(crate) type JsonEntity = Map<String, Json>;

const ANNOTATION: &str = "@odata.type";
const SYSTEM_PROPERTIES: [&str; 3] = ["PartitionKey", "RowKey", "Timestamp"];

/// Doubles every `'`: the OData string-literal escape, needed in entity addresses
/// (`table(PartitionKey='…',RowKey='…')`, which the crate builds without escaping) and in
/// `$filter` literals.
pub(crate) fn escape_quotes(s: &str) -> String {
    s.replace('\'', "''")
}

/// An OData string literal: `'it''s'`.
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", escape_quotes(s))
}

/// `PartitionKey eq '…'` plus the RowKey bounds of `range`, every literal escaped.
pub(crate) fn partition_filter(partition_key: &str, range: &RowRange) -> String {
    let mut filter = format!("PartitionKey eq {}", literal(partition_key));
    for (op, bound) in [("ge", &range.from), ("gt", &range.after), ("lt", &range.before), ("le", &range.to)] {
        if let Some(b) = bound {
            filter.push_str(&format!(" and RowKey {op} {}", literal(b)));
        }
    }
    filter
}

/// The `$filter` of a cross-partition query: the PartitionKey bounds of `range`, every
/// literal escaped; `None` for an unbounded range (a plain scan). A `'\u{ffff}'` bound
/// travels as its UTF-8 bytes, percent-encoded in the URL like every other character.
pub(crate) fn partitions_filter(range: &PartitionRange) -> Option<String> {
    let bounds: Vec<String> = [("gt", &range.after), ("lt", &range.before), ("le", &range.to)]
        .into_iter()
        .filter_map(|(op, bound)| bound.as_ref().map(|b| format!("PartitionKey {op} {}", literal(b))))
        .collect();
    (!bounds.is_empty()).then(|| bounds.join(" and "))
}

/// Writes every non-ASCII character of JSON text as a `\uXXXX` escape (surrogate pairs
/// for astral characters). Non-ASCII text only occurs inside JSON strings, so the result is
/// the same JSON value. Azurite corrupts multi-byte characters that straddle a 64 KiB chunk
/// boundary of a request body (Azure/Azurite#2670); an ASCII body has none.
pub(crate) fn ascii_json(text: &str) -> String {
    if text.is_ascii() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut buf = [0u16; 2];
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// The request body of a write: [`to_json`] as ASCII-only JSON text.
pub(crate) fn to_body(entity: &Entity) -> StoreResult<Box<serde_json::value::RawValue>> {
    let text = serde_json::to_string(&to_json(entity)?)
        .map_err(|e| StoreError::InvalidInput(format!("entity cannot be serialized: {e}")))?;
    serde_json::value::RawValue::from_string(ascii_json(&text))
        .map_err(|e| StoreError::InvalidInput(format!("entity cannot be serialized: {e}")))
}

/// The JSON body of a write: keys plus annotated properties. Checks the entity limits first.
pub(crate) fn to_json(entity: &Entity) -> StoreResult<JsonEntity> {
    check_entity(entity)?;
    let mut map = Map::new();
    map.insert("PartitionKey".into(), Json::String(entity.partition_key.clone()));
    map.insert("RowKey".into(), Json::String(entity.row_key.clone()));
    for (name, value) in &entity.properties {
        let (json, annotate) = match value {
            Value::String(s) => (Json::String(s.clone()), false),
            Value::Int32(i) => (Json::from(*i), false),
            Value::Int64(i) => (Json::String(i.to_string()), true),
            Value::Double(d) => (double_to_json(*d), true),
            Value::Bool(b) => (Json::Bool(*b), false),
            Value::DateTime(s) | Value::Guid(s) => (Json::String(s.clone()), true),
            Value::Binary(b) => (Json::String(base64::engine::general_purpose::STANDARD.encode(b)), true),
        };
        if annotate {
            map.insert(format!("{name}{ANNOTATION}"), Json::String(value.edm_type().into()));
        }
        map.insert(name.clone(), json);
    }
    Ok(map)
}

fn double_to_json(d: f64) -> Json {
    match Number::from_f64(d) {
        Some(n) => Json::Number(n),
        None if d.is_nan() => Json::String("NaN".into()),
        None if d > 0.0 => Json::String("Infinity".into()),
        None => Json::String("-Infinity".into()),
    }
}

fn bad(name: &str, want: &str) -> StoreError {
    StoreError::Other(format!("unexpected response: property {name:?} is not a valid {want}"))
}

/// Reads an entity from a response. `etag` (from the `ETag` header of a point read) wins
/// over `odata.etag` (query results).
pub(crate) fn from_json(mut map: JsonEntity, etag: Option<ETag>) -> StoreResult<Entity> {
    let mut key = |name: &str| match map.remove(name) {
        Some(Json::String(s)) => Ok(s),
        _ => Err(StoreError::Other(format!("unexpected response: entity without a string {name}"))),
    };
    let partition_key = key("PartitionKey")?;
    let row_key = key("RowKey")?;
    let etag = etag.or_else(|| match map.get("odata.etag") {
        Some(Json::String(s)) => Some(ETag(s.clone())),
        _ => None,
    });
    let mut properties = Properties::new();
    for (name, json) in &map {
        if name.contains('@') || name.starts_with("odata.") || SYSTEM_PROPERTIES.contains(&name.as_str()) {
            continue;
        }
        let edm = match map.get(&format!("{name}{ANNOTATION}")) {
            Some(Json::String(t)) => Some(t.as_str()),
            _ => None,
        };
        if let Some(value) = value_from_json(name, json, edm)? {
            properties.insert(name.clone(), value);
        }
    }
    Ok(Entity { partition_key, row_key, etag, properties })
}

fn value_from_json(name: &str, json: &Json, edm: Option<&str>) -> StoreResult<Option<Value>> {
    if json.is_null() {
        return Ok(None); // null properties are not stored
    }
    let text = || json.as_str().map(str::to_string).ok_or_else(|| bad(name, edm.unwrap_or("string")));
    let value = match edm {
        Some("Edm.String") => Value::String(text()?),
        Some("Edm.Int32") => Value::Int32(
            match json {
                Json::Number(n) => n.as_i64().and_then(|i| i32::try_from(i).ok()),
                Json::String(s) => s.parse().ok(),
                _ => None,
            }
            .ok_or_else(|| bad(name, "Edm.Int32"))?,
        ),
        Some("Edm.Int64") => Value::Int64(
            match json {
                Json::String(s) => s.parse().ok(),
                Json::Number(n) => n.as_i64(),
                _ => None,
            }
            .ok_or_else(|| bad(name, "Edm.Int64"))?,
        ),
        Some("Edm.Double") => Value::Double(
            match json {
                Json::Number(n) => n.as_f64(),
                Json::String(s) => parse_double(s),
                _ => None,
            }
            .ok_or_else(|| bad(name, "Edm.Double"))?,
        ),
        Some("Edm.Boolean") => Value::Bool(json.as_bool().ok_or_else(|| bad(name, "Edm.Boolean"))?),
        Some("Edm.DateTime") => Value::DateTime(text()?),
        Some("Edm.Guid") => Value::Guid(text()?),
        Some("Edm.Binary") => Value::Binary(
            base64::engine::general_purpose::STANDARD.decode(text()?).map_err(|_| bad(name, "Edm.Binary"))?,
        ),
        Some(other) => {
            return Err(StoreError::Other(format!(
                "unexpected response: property {name:?} has unsupported type {other:?}"
            )))
        }
        None => match json {
            Json::String(s) => Value::String(s.clone()),
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => i32::try_from(i).map(Value::Int32).unwrap_or(Value::Int64(i)),
                (None, Some(f)) => Value::Double(f),
                (None, None) => return Err(bad(name, "number")),
            },
            _ => return Err(bad(name, "EDM value")),
        },
    };
    Ok(Some(value))
}

fn parse_double(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "Infinity" | "INF" => Some(f64::INFINITY),
        "-Infinity" | "-INF" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

/// True when two property sets hold the same values as the service would store them
/// (NaN equals NaN; DateTimes compare as instants, so `…05Z` equals `…05.0000000Z`).
pub(crate) fn same_properties(a: &Properties, b: &Properties) -> bool {
    a.len() == b.len()
        && a.iter().all(|(name, va)| {
            b.get(name).is_some_and(|vb| match (va, vb) {
                (Value::Double(x), Value::Double(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                (Value::DateTime(x), Value::DateTime(y)) => x == y || same_instant(x, y),
                (Value::Guid(x), Value::Guid(y)) => x.eq_ignore_ascii_case(y),
                _ => va == vb,
            })
        })
}

fn same_instant(a: &str, b: &str) -> bool {
    use time::format_description::well_known::Rfc3339;
    match (time::OffsetDateTime::parse(a, &Rfc3339), time::OffsetDateTime::parse(b, &Rfc3339)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The service continuation (NextPartitionKey, NextRowKey) as one opaque string: base64url
/// of a small versioned JSON object.
pub(crate) fn encode_continuation(next: &(String, Option<String>)) -> String {
    let json = serde_json::json!({ "v": 1, "npk": next.0, "nrk": next.1 });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
}

/// Reverses [`encode_continuation`]; `InvalidInput` for anything else.
pub(crate) fn decode_continuation(token: &str) -> StoreResult<(String, Option<String>)> {
    let bad = || StoreError::InvalidInput("continuation token is not one this store issued".into());
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.trim()).map_err(|_| bad())?;
    let json: Json = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if json.get("v").and_then(Json::as_u64) != Some(1) {
        return Err(bad());
    }
    let npk = json.get("npk").and_then(Json::as_str).ok_or_else(bad)?.to_string();
    let nrk = match json.get("nrk") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad()),
    };
    Ok((npk, nrk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_ascii_and_mean_the_same() {
        let text = serde_json::to_string(&serde_json::json!({"s": "é😀\"<&>'", "n": 1})).unwrap();
        let ascii = ascii_json(&text);
        assert!(ascii.is_ascii());
        assert_eq!(serde_json::from_str::<Json>(&ascii).unwrap(), serde_json::from_str::<Json>(&text).unwrap());
        assert!(ascii.contains("\\ud83d\\ude00"));
    }

    #[test]
    fn quotes_are_doubled_in_filters() {
        let range = RowRange { from: Some("a'b".into()), before: Some("'".into()), ..RowRange::default() };
        assert_eq!(partition_filter("it's", &range), "PartitionKey eq 'it''s' and RowKey ge 'a''b' and RowKey lt ''''");
        let prefix =
            PartitionRange { after: Some("D'x".into()), to: Some("D\u{ffff}".into()), ..PartitionRange::default() };
        assert_eq!(partitions_filter(&prefix).unwrap(), "PartitionKey gt 'D''x' and PartitionKey le 'D\u{ffff}'");
        assert_eq!(partitions_filter(&PartitionRange::default()), None);
    }

    #[test]
    fn every_type_round_trips_through_json() {
        let entity = Entity::new("p", "r")
            .with("s", Value::String("x".into()))
            .with("i", Value::Int32(-5))
            .with("l", Value::Int64(i64::MIN))
            .with("d", Value::Double(1.0))
            .with("nan", Value::Double(f64::NAN))
            .with("ninf", Value::Double(f64::NEG_INFINITY))
            .with("b", Value::Bool(false))
            .with("t", Value::DateTime("2024-01-02T03:04:05.1234567Z".into()))
            .with("g", Value::Guid("c9da6455-213d-42c9-9a79-3e9149a57833".into()))
            .with("x", Value::Binary(vec![0, 255]));
        let mut json = to_json(&entity).unwrap();
        assert_eq!(json["l"], Json::String(i64::MIN.to_string()));
        assert_eq!(json["l@odata.type"], "Edm.Int64");
        assert_eq!(json["d@odata.type"], "Edm.Double");
        assert_eq!(json["nan"], "NaN");
        // Metadata of a fullmetadata response is dropped.
        json.insert("odata.etag".into(), Json::String("W/\"x\"".into()));
        json.insert("Timestamp".into(), Json::String("2024-01-01T00:00:00Z".into()));
        json.insert("Timestamp@odata.type".into(), Json::String("Edm.DateTime".into()));
        let back = from_json(json, None).unwrap();
        assert_eq!(back.etag, Some(ETag("W/\"x\"".into())));
        assert!(same_properties(&back.properties, &entity.properties));
        assert_eq!(back.properties.len(), entity.properties.len());
    }

    #[test]
    fn reserved_names_are_rejected() {
        for name in ["PartitionKey", "Timestamp", "odata.etag", "a@odata.type", "1abc", "a-b", "", &"n".repeat(256)] {
            let e = Entity::new("p", "r").with(name, Value::Int32(1));
            assert!(matches!(to_json(&e), Err(StoreError::InvalidInput(_))), "{name}");
        }
    }

    #[test]
    fn continuation_tokens_round_trip_and_reject_garbage() {
        for next in [("p'1".to_string(), Some("r 2".to_string())), ("p".to_string(), None)] {
            assert_eq!(decode_continuation(&encode_continuation(&next)).unwrap(), next);
        }
        assert!(matches!(decode_continuation("not a token"), Err(StoreError::InvalidInput(_))));
    }
}
