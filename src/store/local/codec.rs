//! How the embedded store writes values down: entity properties as tagged JSON, ETags,
//! continuation tokens, and the UTF-16 key order.

use base64::Engine as _;

use super::super::error::{StoreError, StoreResult};
use super::super::page::Page;
use super::super::value::{ETag, Entity, Properties, Value};

/// Compares keys by UTF-16 code units, the order Azurite uses (SQLite's own would be
/// code-point order); registered as the `UTF16` collation.
pub(super) use crate::store::key_rules::cmp_utf16 as utf16_cmp;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(super) fn now_ms() -> i64 {
    crate::env::now_micros() / 1000
}

/// A fresh opaque ETag.
pub(super) fn new_etag() -> ETag {
    ETag(format!("W/\"{}\"", crate::env::uuid().simple()))
}

/// Properties as a JSON object of `[tag, value]` pairs (the tag keeps the EDM type).
pub(super) fn encode_props(props: &Properties) -> String {
    use serde_json::json;
    let map: serde_json::Map<String, serde_json::Value> = props
        .iter()
        .map(|(k, v)| {
            let tagged = match v {
                Value::String(s) => json!(["S", s]),
                Value::Int32(i) => json!(["I", i]),
                Value::Int64(i) => json!(["L", i.to_string()]),
                Value::Double(f) if f.is_finite() => json!(["D", f]),
                Value::Double(f) => json!(["D", f.to_string()]),
                Value::Bool(b) => json!(["B", b]),
                Value::DateTime(s) => json!(["T", s]),
                Value::Guid(s) => json!(["G", s]),
                Value::Binary(b) => json!(["X", base64::engine::general_purpose::STANDARD.encode(b)]),
            };
            (k.clone(), tagged)
        })
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Inverse of [`encode_props`].
pub(super) fn decode_props(text: &str) -> StoreResult<Properties> {
    let bad = || StoreError::Other("embedded store: corrupt property encoding".into());
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|_| bad())?;
    let mut props = Properties::new();
    for (k, v) in map {
        let (tag, val) = match v.as_array().map(Vec::as_slice) {
            Some([serde_json::Value::String(t), val]) => (t.clone(), val.clone()),
            _ => return Err(bad()),
        };
        let s = || val.as_str().map(String::from).ok_or_else(bad);
        let value = match tag.as_str() {
            "S" => Value::String(s()?),
            "I" => Value::Int32(val.as_i64().and_then(|i| i32::try_from(i).ok()).ok_or_else(bad)?),
            "L" => Value::Int64(s()?.parse().map_err(|_| bad())?),
            "D" => Value::Double(match val.as_f64() {
                Some(f) => f,
                None => s()?.parse().map_err(|_| bad())?,
            }),
            "B" => Value::Bool(val.as_bool().ok_or_else(bad)?),
            "T" => Value::DateTime(s()?),
            "G" => Value::Guid(s()?),
            "X" => Value::Binary(base64::engine::general_purpose::STANDARD.decode(s()?).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        props.insert(k, value);
    }
    Ok(props)
}

/// Continuation tokens: base64url of the JSON `[PartitionKey, RowKey]` of the last entity
/// returned; the next page starts strictly after it.
pub(super) fn encode_token(pk: &str, rk: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::json!([pk, rk]).to_string())
}

/// Inverse of [`encode_token`]; `InvalidInput` for a token this store did not issue.
pub(super) fn decode_token(token: &str) -> StoreResult<(String, String)> {
    let bad = || StoreError::InvalidInput("continuation token is not one this store issued".into());
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    serde_json::from_slice::<(String, String)>(&bytes).map_err(|_| bad())
}

/// A page from `limit + 1` rows read: the first `limit`, with a token when there were more.
pub(super) fn page_from(rows: Vec<Entity>, limit: usize) -> Page {
    let mut entities = rows;
    let continuation = if entities.len() > limit {
        entities.truncate(limit);
        entities.last().map(|e| encode_token(&e.partition_key, &e.row_key))
    } else {
        None
    };
    Page { entities, continuation }
}
