//! Entities and typed property values (the Table service's EDM types).
//!
//! Source: "Payload format for Table service operations" and "Understanding the Table service
//! data model" (learn.microsoft.com/rest/api/storageservices/).

use std::collections::BTreeMap;

use super::error::{StoreError, StoreResult};

/// An opaque entity version. Compare only for equality; never parse.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

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
    /// PartitionKey (validated by `crate::keys`).
    pub partition_key: String,
    /// RowKey (validated by `crate::keys`).
    pub row_key: String,
    /// The version the service returned; `None` on entities built for writing.
    pub etag: Option<ETag>,
    /// User properties.
    pub properties: Properties,
}

impl Entity {
    /// A new entity without properties.
    pub fn new(partition_key: impl Into<String>, row_key: impl Into<String>) -> Self {
        Entity {
            partition_key: partition_key.into(),
            row_key: row_key.into(),
            etag: None,
            properties: Properties::new(),
        }
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
            + self.properties.iter().map(|(k, v)| 8 + 2 * k.encode_utf16().count() + v.stored_size()).sum::<usize>()
    }
}

// ---- entity limits, checked by every backend before I/O ----

/// Most user properties of an entity (255 including PartitionKey, RowKey, Timestamp).
pub const MAX_PROPERTIES: usize = 252;
/// Largest entity, as [`Entity::stored_size`] counts it.
pub const MAX_ENTITY_BYTES: usize = 1024 * 1024;
/// Longest `Edm.String`, in UTF-16 code units (64 KiB).
pub const MAX_STRING_UNITS: usize = 32 * 1024;
/// Largest `Edm.Binary`, in bytes.
pub const MAX_BINARY_BYTES: usize = 64 * 1024;
/// Longest property name, in characters.
pub const MAX_NAME_CHARS: usize = 255;

/// Property names: C# identifiers of at most 255 characters, and none that would collide
/// with the keys or the OData metadata in the JSON object (a property called `PartitionKey`
/// would overwrite the key; `odata.*` and `x@odata.type` are not identifiers). Azurite checks none of this (Azurite#955); Azure does.
fn check_property_name(name: &str) -> StoreResult<()> {
    if ["PartitionKey", "RowKey", "Timestamp"].contains(&name) {
        return Err(StoreError::InvalidInput(format!(
            "property name {name:?} is reserved (PartitionKey, RowKey, Timestamp)"
        )));
    }
    let mut chars = name.chars();
    let identifier =
        chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_');
    if !identifier || name.chars().count() > MAX_NAME_CHARS {
        return Err(StoreError::InvalidInput(format!(
            "property name {name:?} is invalid: a letter or '_' followed by letters, digits or '_', at most {MAX_NAME_CHARS} characters"
        )));
    }
    Ok(())
}

/// The Table service's entity limits ("Understanding the Table service data model"),
/// checked before I/O because Azurite enforces only some of them (more than 252 properties
/// and 1 MiB entities pass on insert there, Azurite#1446).
///
/// Keys: no character Azure forbids (`super::key_rules::is_forbidden_key_char`: `/ \ # ?` and
/// control characters; Azurite answers 400 InvalidInput, or 500 for `/`) and at most
/// `super::key_rules::MAX_KEY_UTF16` UTF-16 code units each (Azurite's cap).
pub fn check_entity(entity: &Entity) -> StoreResult<()> {
    for (what, key) in [("PartitionKey", &entity.partition_key), ("RowKey", &entity.row_key)] {
        if let Some(c) = key.chars().find(|c| super::key_rules::is_forbidden_key_char(*c)) {
            return Err(StoreError::InvalidInput(format!(
                "{what} {key:?} holds {c:?}, which Azure forbids in keys (/ \\ # ? and control characters)"
            )));
        }
        let units = key.encode_utf16().count();
        if units > super::key_rules::MAX_KEY_UTF16 {
            return Err(StoreError::InvalidInput(format!(
                "{what} is {units} UTF-16 code units, the limit is {} (1 KiB)",
                super::key_rules::MAX_KEY_UTF16
            )));
        }
    }
    if entity.properties.len() > MAX_PROPERTIES {
        return Err(StoreError::InvalidInput(format!(
            "entity has {} properties, the limit is {MAX_PROPERTIES} (TooManyProperties)",
            entity.properties.len()
        )));
    }
    for (name, value) in &entity.properties {
        check_property_name(name)?;
        let too_large = match value {
            Value::String(s) => s.encode_utf16().count() > MAX_STRING_UNITS,
            Value::Binary(b) => b.len() > MAX_BINARY_BYTES,
            _ => false,
        };
        if too_large {
            return Err(StoreError::InvalidInput(format!(
                "property {name:?} exceeds 64 KiB (strings: {MAX_STRING_UNITS} UTF-16 code units, binary: {MAX_BINARY_BYTES} bytes; PropertyValueTooLarge)"
            )));
        }
    }
    let size = entity.stored_size();
    if size > MAX_ENTITY_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "entity is {size} bytes as stored (strings count 2 bytes per UTF-16 code unit), the limit is {MAX_ENTITY_BYTES} (EntityTooLarge)"
        )));
    }
    Ok(())
}
