//! Queue messages on the apply queue, and their encoding.
//!
//! Two kinds share the queue:
//! - hint: `{"v":1,"shard":"wal","id":"<WAL id>"}`, enqueued by the write path after the WAL
//!   entry is durable. It only says "there is work"; losing one loses nothing (the sweeper
//!   applies entries whose hint never came).
//! - intent: `{"v":1,"op":"insert"|"upsert"|"replace"|"delete","record":{..},"filter":{..}}`,
//!   enqueued by other services. The consumer logs it to the WAL once (keyed by the queue
//!   message id), then applies it. `insert` and `upsert` both store the record; `filter`
//!   is an object of index field to value, with optional `row_from` / `row_to`.
//!
//! Message text is Base64 of the UTF-8 JSON, as the Azure Functions queue trigger expects by
//! default (host.json `extensions.queues.messageEncoding = "base64"`).

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::query::Filter;
use crate::record::Record;
use crate::wal::Op;

/// Message format version.
pub const VERSION: u32 = 1;

/// A hint that entry `id` of `shard` is pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hint {
    /// Format version (1).
    pub v: u32,
    /// WAL shard.
    pub shard: String,
    /// WAL id.
    pub id: String,
}

/// A write intent from another service.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    /// Format version (1).
    pub v: u32,
    /// `insert`, `upsert`, `replace` or `delete`.
    pub op: String,
    /// The record (insert, upsert, replace).
    #[serde(default)]
    pub record: Option<Json>,
    /// Index field -> value (replace, delete).
    #[serde(default)]
    pub filter: Option<Map<String, Json>>,
    /// Smallest sort value (replace, delete).
    #[serde(default)]
    pub row_from: Option<String>,
    /// Largest sort value (replace, delete).
    #[serde(default)]
    pub row_to: Option<String>,
}

/// A decoded apply-queue message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Work is pending.
    Hint(Hint),
    /// A write to log and apply.
    Intent(Intent),
}

/// Base64 of the text's UTF-8 bytes.
pub fn encode(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

/// Inverse of [`encode`]; errors for invalid Base64 or non-UTF-8 content (such a message can
/// never succeed: it goes to the poison queue).
pub fn decode(text: &str) -> Result<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| Error::invalid(format!("message is not valid Base64: {e}")))?;
    String::from_utf8(bytes).map_err(|_| Error::invalid("message is not UTF-8 text"))
}

/// The hint message text (before Base64) for an entry.
pub fn hint_json(shard: &str, id: &str) -> String {
    serde_json::to_string(&Hint { v: VERSION, shard: shard.into(), id: id.into() }).unwrap_or_default()
}

/// Parses decoded message text. Errors say why the message can never succeed.
pub fn parse(text: &str) -> Result<Message> {
    let json: Json =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("message is not valid JSON: {e}")))?;
    let obj = json.as_object().ok_or_else(|| Error::invalid("message must be a JSON object"))?;
    match obj.get("v").and_then(Json::as_u64) {
        Some(1) => {}
        _ => return Err(Error::invalid("message: field 'v' must be 1")),
    }
    if obj.contains_key("op") {
        let intent: Intent = serde_json::from_value(json).map_err(|e| Error::invalid(format!("intent: {e}")))?;
        Ok(Message::Intent(intent))
    } else if obj.contains_key("id") {
        let hint: Hint = serde_json::from_value(json).map_err(|e| Error::invalid(format!("hint: {e}")))?;
        Ok(Message::Hint(hint))
    } else {
        Err(Error::invalid("message is neither a hint (with 'id') nor an intent (with 'op')"))
    }
}

/// A filter object (`{"icao": "KJFK"}`) as a [`Filter`]; values must be strings, numbers or
/// booleans.
pub fn filter_from_object(obj: &Map<String, Json>, row_from: Option<String>, row_to: Option<String>) -> Result<Filter> {
    let mut fields = Vec::new();
    for (k, v) in obj {
        let value = crate::keys::key_string(v)
            .filter(|_| !v.is_object() && !v.is_array())
            .ok_or_else(|| Error::invalid(format!("filter: the value of '{k}' must be a string, number or boolean")))?;
        fields.push((k.clone(), value));
    }
    Ok(Filter::new(fields).range(row_from, row_to))
}

impl Intent {
    /// The WAL operation this intent asks for (not yet validated against the schema).
    pub fn to_op(&self) -> Result<Op> {
        let record = || -> Result<Record> {
            match &self.record {
                Some(Json::Object(r)) => Ok(r.clone()),
                Some(_) => Err(Error::invalid("intent: 'record' must be a JSON object")),
                None => Err(Error::invalid(format!("intent: op '{}' needs a 'record'", self.op))),
            }
        };
        let filter = || -> Result<Filter> {
            let obj = self
                .filter
                .as_ref()
                .ok_or_else(|| Error::invalid(format!("intent: op '{}' needs a 'filter'", self.op)))?;
            filter_from_object(obj, self.row_from.clone(), self.row_to.clone())
        };
        match self.op.as_str() {
            "insert" | "upsert" => Ok(Op::Upsert { record: record()? }),
            "replace" => Ok(Op::Replace { filter: filter()?, record: record()? }),
            "delete" => Ok(Op::Delete { filter: filter()? }),
            other => Err(Error::invalid(format!("intent: unknown op '{other}' (insert, upsert, replace, delete)"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip_and_errors() {
        let text = "{\"a\":\"<&>'\\\"é😀\"}";
        assert_eq!(decode(&encode(text)).unwrap(), text);
        assert!(decode("not base64!").is_err());
        assert!(decode(&base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe])).is_err());
    }

    #[test]
    fn parses_hints_and_intents() {
        assert!(matches!(parse(&hint_json("wal", "x")).unwrap(), Message::Hint(h) if h.id == "x"));
        let i = parse(r#"{"v":1,"op":"insert","record":{"icao":"KJFK","name":"x"}}"#).unwrap();
        let Message::Intent(i) = i else { panic!() };
        assert!(matches!(i.to_op().unwrap(), Op::Upsert { .. }));
        let d = parse(r#"{"v":1,"op":"delete","filter":{"icao":"KJFK"}}"#).unwrap();
        let Message::Intent(d) = d else { panic!() };
        assert!(
            matches!(d.to_op().unwrap(), Op::Delete { filter } if filter.fields == [("icao".to_string(), "KJFK".to_string())])
        );
    }

    #[test]
    fn bad_messages_say_why() {
        for (text, why) in [
            ("{", "not valid JSON"),
            ("[1]", "JSON object"),
            (r#"{"v":2,"id":"x"}"#, "'v' must be 1"),
            (r#"{"v":1}"#, "neither a hint"),
            (r#"{"v":1,"op":"merge","record":{}}"#, "unknown op"),
            (r#"{"v":1,"op":"insert"}"#, "needs a 'record'"),
            (r#"{"v":1,"op":"insert","record":[1]}"#, "must be a JSON object"),
            (r#"{"v":1,"op":"delete","filter":{"a":{"b":1}}}"#, "string, number or boolean"),
            (r#"{"v":1,"op":"insert","record":{},"extra":1}"#, "unknown field"),
        ] {
            let err = parse(text).and_then(|m| match m {
                Message::Intent(i) => i.to_op().map(|_| ()),
                Message::Hint(_) => Ok(()),
            });
            let msg = err.unwrap_err().to_string();
            assert!(msg.contains(why), "{text}: {msg}");
        }
    }
}
