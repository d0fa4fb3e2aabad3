//! The schema as stored in the WAL table, row `metadata/schema`: written on first use,
//! compared on every open.
//!
//! Properties: `index_keys` (comma list), `row_key`, `v` (format). A catalog with hashed
//! index fields ([`crate::hashed`]) also has `hashed` and `redact` (comma lists) and
//! `hash_key_id` (8 hex digits of SHA-256 of the secret, never the secret). A row without
//! them, as every catalog from before hashed keys has, means no field is hashed, so the rows
//! of plaintext catalogs are unchanged.

use crate::error::{Error, Result};
use crate::hashed::KeyId;
use crate::schema::Schema;
use crate::settings;
use crate::store::{Entity, StoreError, TableStore, Value};
use crate::wal::entry::FORMAT_VERSION;
use crate::wal::METADATA;

/// RowKey of the schema row in the `metadata` partition.
pub const ROW: &str = "schema";

/// The schema row to store for `schema`.
pub fn row(schema: &Schema) -> Entity {
    let mut e = Entity::new(METADATA, ROW)
        .with("index_keys", Value::String(schema.index_keys.join(",")))
        .with("row_key", Value::String(schema.row_key.clone()))
        .with("v", Value::Int32(FORMAT_VERSION));
    if let Some(key) = schema.hash_key() {
        e = e
            .with("hashed", Value::String(schema.hashed().join(",")))
            .with("redact", Value::String(schema.redacted().join(",")))
            .with("hash_key_id", Value::String(key.id().to_string()));
    }
    e
}

/// What a stored schema row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchema {
    /// Indexed fields.
    pub index_keys: Vec<String>,
    /// Row-key field.
    pub row_key: String,
    /// Hashed index fields (empty when the row predates hashed keys).
    pub hashed: Vec<String>,
    /// Redacted fields.
    pub redact: Vec<String>,
    /// Id of the secret the hashed fields were keyed with.
    pub hash_key_id: Option<KeyId>,
}

impl StoredSchema {
    /// Reads a schema row.
    pub fn of(e: &Entity) -> StoredSchema {
        let list = |name: &str| Schema::parse_list(e.str(name).unwrap_or_default());
        StoredSchema {
            index_keys: list("index_keys"),
            row_key: e.str("row_key").unwrap_or_default().to_string(),
            hashed: list("hashed"),
            redact: list("redact"),
            hash_key_id: e.str("hash_key_id").map(KeyId::from_stored),
        }
    }
}

/// The stored schema of the catalog whose WAL table is `wal_table`, if any.
pub async fn read(store: &dyn TableStore, wal_table: &str) -> Result<Option<StoredSchema>> {
    match store.get(wal_table, METADATA, ROW).await {
        Ok(row) => Ok(row.as_ref().map(StoredSchema::of)),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn sorted(list: &[String]) -> Vec<&String> {
    let mut v: Vec<&String> = list.iter().collect();
    v.sort();
    v
}

/// Checks the configured `schema` against the stored row of catalog `table`:
/// [`Error::SchemaMismatch`] naming both when index keys, row key, hashed or redacted fields
/// differ, or when the hash key is another one (by id; the key itself is never printed).
pub fn check(stored: &Entity, schema: &Schema, table: &str) -> Result<()> {
    let s = StoredSchema::of(stored);
    if s.index_keys != schema.index_keys || s.row_key != schema.row_key {
        return Err(Error::SchemaMismatch(format!(
            "catalog '{table}' was created with index keys [{}] and row key '{}', but this process is configured with index keys [{}] and row key '{}'; use the original schema or another catalog name",
            s.index_keys.join(","),
            s.row_key,
            schema.index_keys.join(","),
            schema.row_key
        )));
    }
    if sorted(&s.hashed) != sorted(schema.hashed()) || sorted(&s.redact) != sorted(schema.redacted()) {
        return Err(Error::SchemaMismatch(format!(
            "catalog '{table}' was created with hashed keys [{}] and redacted keys [{}], but this process is configured with hashed keys [{}] and redacted keys [{}] ({}, {}); use the original settings or another catalog name (changing them means rebuilding every row)",
            s.hashed.join(","),
            s.redact.join(","),
            schema.hashed().join(","),
            schema.redacted().join(","),
            settings::HASHED_KEYS,
            settings::REDACT_KEYS
        )));
    }
    let configured = schema.hash_key().map(|k| k.id());
    if s.hash_key_id.as_ref() != configured {
        let id = |k: Option<&KeyId>| k.map_or_else(|| "none".to_string(), KeyId::to_string);
        return Err(Error::SchemaMismatch(format!(
            "catalog '{table}' keys its hashed fields with the secret whose id is {}, but {} has id {}: with it no lookup would find the existing rows. Use the original secret. Rotating the secret means re-keying every row of the hashed indexes, a rebuild job that does not exist yet",
            id(s.hash_key_id.as_ref()),
            settings::HASH_KEY,
            id(configured)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashed::HashKey;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OTHER: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn plain() -> Schema {
        Schema::new(vec!["eid".into(), "ssn".into()], "lastname").unwrap()
    }

    fn hashed(key: &str, redact: &[&str]) -> Schema {
        let redact = redact.iter().map(|s| s.to_string()).collect();
        plain().with_hashed_keys(vec!["ssn".into()], redact, Some(HashKey::from_setting(key).unwrap())).unwrap()
    }

    #[test]
    fn a_plaintext_schema_row_is_unchanged() {
        let e = row(&plain());
        let mut names: Vec<&str> = e.properties.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["index_keys", "row_key", "v"]);
        check(&e, &plain(), "t").unwrap();
    }

    #[test]
    fn the_row_holds_the_key_id_not_the_key() {
        let e = row(&hashed(KEY, &["ssn"]));
        assert_eq!(e.str("hashed"), Some("ssn"));
        assert_eq!(e.str("redact"), Some("ssn"));
        assert_eq!(e.str("hash_key_id"), Some("630dcd29"));
        let text = format!("{e:?}");
        assert!(!text.contains(KEY) && !text.contains("0001020304"), "{text}");
        check(&e, &hashed(KEY, &["ssn"]), "t").unwrap();
    }

    #[test]
    fn changed_flags_or_key_fail_with_both_sides_named() {
        let stored = row(&hashed(KEY, &[]));
        let err = check(&stored, &plain(), "t").unwrap_err().to_string();
        assert!(err.contains("hashed keys [ssn]") && err.contains("configured with hashed keys []"), "{err}");
        let err = check(&row(&plain()), &hashed(KEY, &[]), "t").unwrap_err().to_string();
        assert!(err.contains("created with hashed keys []"), "{err}");
        let err = check(&stored, &hashed(KEY, &["ssn"]), "t").unwrap_err().to_string();
        assert!(err.contains("redacted keys [ssn]"), "{err}");
        let err = check(&stored, &hashed(OTHER, &[]), "t").unwrap_err().to_string();
        assert!(err.contains("id is 630dcd29") && err.contains("TABLE_CATALOG_HASH_KEY has id"), "{err}");
        assert!(err.contains("Rotating the secret"), "{err}");
        assert!(!err.contains(KEY) && !err.contains(OTHER), "{err}");
    }
}
