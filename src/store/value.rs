//! Entities and typed property values (the Table service's EDM types).
//!
//! Source: "Payload format for Table service operations" and "Understanding the Table service
//! data model" (learn.microsoft.com/rest/api/storageservices/).

use std::collections::BTreeMap;

use super::ETag;

/// A typed property value. Null properties are not stored by the Table service, so there is
/// no null variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `Edm.String`, at most 32,768 UTF-16 code units (64 KiB).
    String(String),
    /// `Edm.Int32`.
    Int32(i32),
    /// `Edm.Int64` (sent as an annotated JSON string on the wire).
    Int64(i64),
    /// `Edm.Double`, including NaN and infinities.
    Double(f64),
    /// `Edm.Boolean`.
    Bool(bool),
    /// `Edm.DateTime`, kept as the ISO-8601 text the service returned.
    DateTime(String),
    /// `Edm.Guid`, kept as text.
    Guid(String),
    /// `Edm.Binary`, at most 64 KiB.
    Binary(Vec<u8>),
}

impl Value {
    /// The EDM type name, e.g. `Edm.Int64`.
    pub fn edm_type(&self) -> &'static str {
        match self {
            Value::String(_) => "Edm.String",
            Value::Int32(_) => "Edm.Int32",
            Value::Int64(_) => "Edm.Int64",
            Value::Double(_) => "Edm.Double",
            Value::Bool(_) => "Edm.Boolean",
            Value::DateTime(_) => "Edm.DateTime",
            Value::Guid(_) => "Edm.Guid",
            Value::Binary(_) => "Edm.Binary",
        }
    }

    /// Size the service charges for this value, in bytes (strings count 2 bytes per UTF-16
    /// code unit, plus 4; see "Understanding the Table service data model").
    pub fn stored_size(&self) -> usize {
        match self {
            Value::String(s) | Value::DateTime(s) => 4 + 2 * s.encode_utf16().count(),
            Value::Int32(_) => 4,
            Value::Int64(_) | Value::Double(_) => 8,
            Value::Bool(_) => 1,
            Value::Guid(_) => 16,
            Value::Binary(b) => 4 + b.len(),
        }
    }

    /// The string inside a `String` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// User properties of an entity by name (system properties excluded).
pub type Properties = BTreeMap<String, Value>;

/// One table entity.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Entity {
    /// PartitionKey (validated by [`crate::keys`]).
    pub partition_key: String,
    /// RowKey (validated by [`crate::keys`]).
    pub row_key: String,
    /// The version the service returned; `None` on entities built for writing.
    pub etag: Option<ETag>,
    /// User properties.
    pub properties: Properties,
}

impl Entity {
    /// A new entity without properties.
    pub fn new(partition_key: impl Into<String>, row_key: impl Into<String>) -> Self {
        Entity { partition_key: partition_key.into(), row_key: row_key.into(), etag: None, properties: Properties::new() }
    }

    /// Adds a property (builder style).
    pub fn with(mut self, name: impl Into<String>, value: Value) -> Self {
        self.properties.insert(name.into(), value);
        self
    }

    /// A string property, if present and a string.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.properties.get(name).and_then(Value::as_str)
    }

    /// Size the service charges for this entity, in bytes: 4 + keys as UTF-16 + per property
    /// 8 + name as UTF-16 + value. The limit is 1 MiB.
    pub fn stored_size(&self) -> usize {
        let keys = 2 * (self.partition_key.encode_utf16().count() + self.row_key.encode_utf16().count());
        4 + keys
            + self
                .properties
                .iter()
                .map(|(k, v)| 8 + 2 * k.encode_utf16().count() + v.stored_size())
                .sum::<usize>()
    }
}
