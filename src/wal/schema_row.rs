//! The schema as stored in the WAL table, row `metadata/schema`: written on first use,
//! compared on every open.
//!
//! Properties: `index_keys` (comma list of the maintained index fields), `row_key`, `v`
//! (format). Once an index was added or dropped ([`crate::indexes`]) the row also has
//! `identity_keys` (the index fields at creation, which feed the fingerprint; absent means
//! `index_keys`), `indexes` (JSON list of [`AddedIndex`]), `version` (Int64, the schema
//! version; absent means 0) and `format` (Int32, [`SCHEMA_FORMAT`]; absent means 1).
//!
//! **Older and newer releases.** Once the indexes changed, `index_keys` ends with
//! [`CHANGED_MARKER`], which is not a valid field name. So a release from before online index
//! changes refuses the catalog whether or not it is configured: configured, its index keys
//! differ from the stored list; unconfigured (it takes the stored list as the catalog's
//! index keys), the marker fails its field-name check. Before the marker, such a release
//! opened a changed catalog when unconfigured, read the added index as an identity field,
//! fingerprinted new records over it and wrote rows that `verify` reports as unreadable.
//! Releases that know online index changes read `identity_keys` and `indexes` and never
//! use `index_keys` as a list of fields. A release that rewrites the row without the marker
//! (one from before it) is healed by the next open ([`needs_healing`]). This build refuses a
//! row whose `format` is above [`SCHEMA_FORMAT`] (written by a newer release it does not
//! understand), and every later release checks the same. A catalog with hashed
//! index fields (`crate::hashed`) also has `hashed` and `redact` (comma lists) and
//! `hash_key_id` (8 hex digits of SHA-256 of the secret, never the secret). A row without
//! them, as every catalog from before hashed keys has, means no field is hashed, so the rows
//! of plaintext catalogs are unchanged.

use crate::error::{Error, Result};
use crate::hashed::KeyId;
use crate::schema::{AddedIndex, Schema};
use crate::settings;
use crate::store::{Entity, StoreError, TableStore, Value};
use crate::wal::entry::FORMAT_VERSION;
use crate::wal::METADATA;

/// RowKey of the schema row in the `metadata` partition.
pub const ROW: &str = "schema";
/// The schema row format this build writes and reads (property `format`; absent means 1,
/// every row from before it). 2: a changed schema's `index_keys` ends with [`CHANGED_MARKER`].
pub const SCHEMA_FORMAT: i32 = 2;
/// The last element of `index_keys` once the indexes changed online (module docs): an
/// invalid field name, which releases from before online index changes refuse, naming it.
pub const CHANGED_MARKER: &str = "!indexes-changed-online:open-with-a-newer-table-catalog";

/// The maintained index fields of a changed schema as stored in `index_keys`: the list, then
/// [`CHANGED_MARKER`].
fn marked(maintained: &[String]) -> String {
    maintained.iter().map(String::as_str).chain(std::iter::once(CHANGED_MARKER)).collect::<Vec<_>>().join(",")
}

/// `index_keys` as a list of fields (the marker left out).
fn maintained_of(e: &Entity) -> Vec<String> {
    Schema::parse_list(e.str("index_keys").unwrap_or_default()).into_iter().filter(|k| k != CHANGED_MARKER).collect()
}

/// The row's `format` (1 when absent).
fn format_of(e: &Entity) -> i32 {
    match e.properties.get("format") {
        Some(Value::Int32(v)) => *v,
        Some(Value::Int64(v)) => i32::try_from(*v).unwrap_or(i32::MAX),
        _ => 1,
    }
}

/// Whether the stored row describes a changed schema (an index added or dropped) whose
/// `index_keys` lacks the marker or whose `format` is older: written or rewritten by a
/// release from before [`SCHEMA_FORMAT`] 2. Such a row is rewritten at open
/// ([`crate::apply::Applier::init`]), so that releases from before online index changes
/// refuse the catalog again.
pub fn needs_healing(e: &Entity) -> bool {
    let s = StoredSchema::of(e);
    let changed = s.version > 0 || !s.added.is_empty();
    let marker = Schema::parse_list(e.str("index_keys").unwrap_or_default()).iter().any(|k| k == CHANGED_MARKER);
    changed && (!marker || format_of(e) < SCHEMA_FORMAT)
}

/// The schema row to store for `schema`.
pub fn row(schema: &Schema) -> Entity {
    let mut e = Entity::new(METADATA, ROW)
        .with("index_keys", Value::String(schema.index_keys.join(",")))
        .with("row_key", Value::String(schema.row_key.clone()))
        .with("v", Value::Int32(FORMAT_VERSION));
    if schema.version() > 0 || !schema.added().is_empty() {
        let added = serde_json::to_string(schema.added()).unwrap_or_default();
        e = e
            .with("index_keys", Value::String(marked(&schema.index_keys)))
            .with("identity_keys", Value::String(schema.identity_keys().join(",")))
            .with("indexes", Value::String(added))
            .with("version", Value::Int64(schema.version() as i64))
            .with("format", Value::Int32(SCHEMA_FORMAT));
    }
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
    /// The identity fields (the index fields the catalog was created with).
    pub index_keys: Vec<String>,
    /// Indexes added since, with their states.
    pub added: Vec<AddedIndex>,
    /// The schema version.
    pub version: u64,
    /// The ETag of the row as read (for a compare-and-swap update).
    pub etag: Option<crate::store::ETag>,
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
        let identity = e.str("identity_keys").map(Schema::parse_list).unwrap_or_else(|| maintained_of(e));
        StoredSchema {
            index_keys: identity,
            // An unreadable list is treated as none: `check` then refuses the row, since its
            // maintained `index_keys` no longer match.
            added: e.str("indexes").and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default(),
            version: match e.properties.get("version") {
                Some(Value::Int64(v)) => (*v).max(0) as u64,
                _ => 0,
            },
            etag: e.etag.clone(),
            row_key: e.str("row_key").unwrap_or_default().to_string(),
            hashed: list("hashed"),
            redact: list("redact"),
            hash_key_id: e.str("hash_key_id").map(KeyId::from_stored),
        }
    }
}

impl StoredSchema {
    /// `configured` (the identity fields, row key and hashed fields this process was
    /// configured with, checked by [`check`]) with the stored added indexes and version.
    pub fn apply_to(&self, configured: Schema) -> Result<Schema> {
        configured.with_identity(self.index_keys.clone())?.with_added(self.added.clone(), self.version)
    }
}

/// The stored schema row of the catalog whose WAL table is `wal_table` (with its ETag).
pub async fn read_row(store: &dyn TableStore, wal_table: &str) -> Result<Option<Entity>> {
    match store.get(wal_table, METADATA, ROW).await {
        Ok(row) => Ok(row),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
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

/// Changes the stored list of added indexes and the version under the row's ETag, retrying
/// when another process changed the row meanwhile. `change` gets the identity fields, the
/// added indexes and the version as stored, edits them, and returns `Ok(false)` to leave the
/// row as it is (or an error, which is returned; nothing is written then). The maintained
/// `index_keys` are derived from the result. Returns the row as stored afterwards.
pub async fn update(
    store: &dyn TableStore,
    wal_table: &str,
    mut change: impl FnMut(&[String], &mut Vec<AddedIndex>, &mut u64) -> Result<bool>,
) -> Result<Entity> {
    loop {
        let Some(current) = read_row(store, wal_table).await? else {
            return Err(Error::NotFound("the catalog has no schema row yet; open it once first".into()));
        };
        let stored = StoredSchema::of(&current);
        let (mut added, mut version) = (stored.added.clone(), stored.version);
        if !change(&stored.index_keys, &mut added, &mut version)? {
            return Ok(current);
        }
        let maintained: Vec<String> = stored
            .index_keys
            .iter()
            .cloned()
            .chain(added.iter().filter(|a| a.state != crate::schema::IndexState::Dropping).map(|a| a.field.clone()))
            .collect();
        let mut row = current.clone();
        row.etag = None;
        let list = serde_json::to_string(&added).map_err(|e| Error::invalid(format!("indexes: {e}")))?;
        row.properties.insert("index_keys".into(), Value::String(marked(&maintained)));
        row.properties.insert("format".into(), Value::Int32(SCHEMA_FORMAT));
        row.properties.insert("identity_keys".into(), Value::String(stored.index_keys.join(",")));
        row.properties.insert("indexes".into(), Value::String(list));
        row.properties.insert("version".into(), Value::Int64(version as i64));
        let tag = current.etag.clone().map_or(crate::store::IfMatch::Any, crate::store::IfMatch::Etag);
        match store.replace(wal_table, &row, &tag).await {
            Ok(etag) => {
                row.etag = Some(etag);
                return Ok(row);
            }
            Err(StoreError::PreconditionFailed(_)) => continue,
            Err(e) => return Err(e.into()),
        }
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
    let format = format_of(stored);
    if format > SCHEMA_FORMAT {
        return Err(Error::SchemaMismatch(format!(
            "catalog '{table}' has schema format {format}, written by a newer release of table-catalog; this \
             build reads formats up to {SCHEMA_FORMAT}: upgrade table-catalog to open it"
        )));
    }
    let s = StoredSchema::of(stored);
    let maintained = maintained_of(stored);
    let keys_ok = s.index_keys == schema.identity_keys() || maintained == schema.index_keys;
    if !keys_ok || s.row_key != schema.row_key {
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
            "catalog '{table}' keys its hashed fields with the secret whose id is {}, but {} has id {}: with it no lookup would find the existing rows. Use the original secret. Rotating the secret means re-keying every row of the hashed indexes: `table-catalog rebuild --into NEW_NAME` with TABLE_CATALOG_REBUILD_HASH_KEY set to the new secret",
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

    /// `plain()` with `dept` added online (active, version 1).
    fn with_dept() -> Schema {
        use crate::schema::{AddedIndex, IndexState};
        let dept = AddedIndex {
            field: "dept".into(),
            state: IndexState::Active,
            version: 1,
            job: None,
            projection: Default::default(),
        };
        plain().with_added(vec![dept], 1).unwrap()
    }

    #[test]
    fn a_changed_schema_is_stored_with_its_identity_and_earlier_releases_refuse_it() {
        let changed = with_dept();
        let e = row(&changed);
        let stored_keys = e.str("index_keys").unwrap();
        assert_eq!(stored_keys, format!("eid,ssn,dept,{CHANGED_MARKER}"), "what an earlier release reads");
        assert_eq!(e.properties.get("format"), Some(&Value::Int32(SCHEMA_FORMAT)));
        assert!(!needs_healing(&e));
        // A release from before online index changes, unconfigured, takes the stored list as
        // its index keys: the marker fails the field-name check (that release's check is
        // the same `validate_field_name`).
        let err = Schema::new(Schema::parse_list(stored_keys), "lastname").unwrap_err().to_string();
        assert!(err.contains(CHANGED_MARKER), "{err}");
        // Configured with the creation keys, it compares the list and refuses too.
        assert_ne!(Schema::parse_list(stored_keys), plain().index_keys);
        assert_eq!(e.str("identity_keys"), Some("eid,ssn"));
        let stored = StoredSchema::of(&e);
        assert_eq!((stored.index_keys.clone(), stored.version), (vec!["eid".to_string(), "ssn".to_string()], 1));
        // A process configured with the creation keys, or with the maintained list, opens it.
        check(&e, &plain(), "t").unwrap();
        let maintained = Schema::new(vec!["eid".into(), "ssn".into(), "dept".into()], "lastname").unwrap();
        check(&e, &maintained, "t").unwrap();
        assert_eq!(stored.apply_to(maintained).unwrap(), changed, "the stored identity wins");
        let other = Schema::new(vec!["eid".into()], "lastname").unwrap();
        assert!(check(&e, &other, "t").is_err());
    }

    #[test]
    fn a_row_rewritten_by_an_earlier_release_is_healed_and_a_newer_format_is_refused() {
        let changed = with_dept();
        // What a release from before the marker writes: the maintained list, no format.
        let mut old = row(&changed);
        old.properties.insert("index_keys".into(), Value::String("eid,ssn,dept".into()));
        old.properties.remove("format");
        assert!(needs_healing(&old));
        check(&old, &plain(), "t").unwrap();
        assert_eq!(StoredSchema::of(&old).apply_to(plain()).unwrap(), changed, "still read right");
        // An unchanged catalog's row needs nothing.
        assert!(!needs_healing(&row(&plain())));
        // A newer release's format: refused, naming both formats.
        let mut newer = row(&changed);
        newer.properties.insert("format".into(), Value::Int32(SCHEMA_FORMAT + 1));
        let err = check(&newer, &plain(), "t").unwrap_err().to_string();
        assert!(err.contains("schema format 3") && err.contains("upgrade"), "{err}");
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
