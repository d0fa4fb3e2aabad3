//! The catalog schema: which fields are indexed, which of them are hashed or redacted
//! ([`crate::hashed`]), and which field sorts records (the RowKey base). Stored in the WAL
//! table on first use; opening a catalog with another schema fails.
//!
//! **Identity fields and maintained indexes.** The index fields a catalog is created with are
//! its *identity fields*: fixed forever, they alone feed the RowKey fingerprint, so a record's
//! identity never changes when indexes come and go. Indexes added later
//! ([`crate::indexes`]) are *maintained* like the identity fields (one row per record with a
//! value) but do not feed the fingerprint; each has a state ([`IndexState`]). The schema has a
//! version, raised by every change that alters what is maintained.

use std::borrow::Cow;

use serde_json::Value as Json;

use crate::composite;
use crate::error::{Error, Result};
use crate::hashed::HashKey;
use crate::keys;
use crate::projection::Projection;
use crate::record::{validate_field_name, Record};
use crate::settings;

/// The state of an index ([`crate::indexes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexState {
    /// Maintained and queryable.
    Active,
    /// Maintained for every write applied since its schema change; a backfill job is adding
    /// the rows of older records. Lookups get 409 `index_not_ready` unless they pass
    /// `allow_partial=true`.
    Backfilling,
    /// No longer maintained; a job is removing its rows. Lookups get 400.
    Dropping,
}

impl IndexState {
    /// The state's name (`active`, `backfilling`, `dropping`).
    pub fn name(self) -> &'static str {
        match self {
            IndexState::Active => "active",
            IndexState::Backfilling => "backfilling",
            IndexState::Dropping => "dropping",
        }
    }
}

/// An index added after the catalog was created, as the stored schema lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AddedIndex {
    /// The indexed field, or a composite index's fields joined by `+` (`country+subd`,
    /// `crate::composite`).
    pub field: String,
    /// Its state.
    pub state: IndexState,
    /// The schema version of the change that put it in this state.
    pub version: u64,
    /// The job backfilling or removing its rows, once started (a job id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// What its rows hold (`crate::projection`); absent in a stored schema means `all`,
    /// which is not written, so schemas without projections read and write unchanged.
    #[serde(default, skip_serializing_if = "Projection::is_all")]
    pub projection: Projection,
}

/// Index keys and row-key field of a catalog, with its hashed and redacted index fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// Maintained index fields: the identity fields, then the added indexes that are active
    /// or backfilling, in the order they were added. Each gets one row per record that has a
    /// value.
    pub index_keys: Vec<String>,
    /// The field whose value starts the RowKey (sort order within an index partition).
    pub row_key: String,
    /// Index fields keyed by the HMAC of their value instead of the value (a subset of
    /// `index_keys`, never the row-key field).
    hashed: Vec<String>,
    /// Hashed fields whose value records hold only in redacted form.
    redact: Vec<String>,
    /// The HMAC secret; present whenever `hashed` is not empty.
    hash_key: Option<HashKey>,
    /// The identity fields (the index fields at creation): only they feed the fingerprint.
    identity: Vec<String>,
    /// Indexes added after creation, with their states (dropping ones included).
    added: Vec<AddedIndex>,
    /// The schema version: 0 at creation, raised by each change of the maintained set.
    version: u64,
}

/// Where one record lives: its RowKey and one PartitionKey per indexed value it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKeys {
    /// RowKey shared by every row of the record.
    pub row_key: String,
    /// (index, PartitionKey) for each index the record has a value for, in schema order; the
    /// index is a field or a composite index's name (`Schema::index_partition`).
    pub partitions: Vec<(String, String)>,
}

impl Schema {
    /// A validated schema: at least one index key, all valid property names, no duplicates
    /// (case-insensitively, since keys are lowercased).
    pub fn new(index_keys: Vec<String>, row_key: impl Into<String>) -> Result<Schema> {
        let row_key = row_key.into();
        if index_keys.is_empty() {
            return Err(Error::Config(
                "index keys: at least one index field is required (TABLE_CATALOG_INDEX_KEYS)".into(),
            ));
        }
        for k in index_keys.iter().chain(std::iter::once(&row_key)) {
            if composite::is_composite(k) {
                return Err(Error::Config(format!(
                    "index keys: '{k}' is a composite index; the index fields a catalog is created with are its identity fields, which feed every record's RowKey one field each, so a composite index cannot be one: create the catalog with single fields and add it online (table-catalog index add {k}, POST /api/indexes)"
                )));
            }
            validate_field_name(k).map_err(|e| Error::Config(e.to_string()))?;
        }
        for (i, k) in index_keys.iter().enumerate() {
            if index_keys[..i].iter().any(|o| o.to_lowercase() == k.to_lowercase()) {
                return Err(Error::Config(format!("index keys: '{k}' is listed twice")));
            }
        }
        let identity = index_keys.clone();
        Ok(Schema {
            index_keys,
            row_key,
            hashed: Vec::new(),
            redact: Vec::new(),
            hash_key: None,
            identity,
            added: Vec::new(),
            version: 0,
        })
    }

    /// This schema with the indexes added since creation and the version of a stored schema
    /// (`added` in the order they were added; the identity fields stay those of `self`).
    /// Errors when an added index repeats an identity field or another added one.
    pub fn with_added(mut self, added: Vec<AddedIndex>, version: u64) -> Result<Schema> {
        for (i, a) in added.iter().enumerate() {
            composite::validate_index_name(&a.field).map_err(|e| Error::Config(e.to_string()))?;
            let lower = a.field.to_lowercase();
            if self.identity.iter().any(|k| k.to_lowercase() == lower)
                || added[..i].iter().any(|o| o.field.to_lowercase() == lower)
            {
                return Err(Error::Config(format!("stored schema: index '{}' is listed twice", a.field)));
            }
        }
        self.index_keys = self.identity.clone();
        self.index_keys.extend(added.iter().filter(|a| a.state != IndexState::Dropping).map(|a| a.field.clone()));
        self.added = added;
        self.version = version;
        Ok(self)
    }

    /// This schema with identity fields `identity` (the stored ones, when this process was
    /// configured with the maintained list instead), hashed fields and secret kept.
    pub fn with_identity(self, identity: Vec<String>) -> Result<Schema> {
        if identity == self.identity {
            return Ok(self);
        }
        let (hashed, redact, key) = (self.hashed.clone(), self.redact.clone(), self.hash_key.clone());
        Schema::new(identity, self.row_key)?.with_hashed_keys(hashed, redact, key)
    }

    /// The schema an entry is applied with: this one, except that an index being dropped is
    /// still maintained (its rows written, moved and tombstoned, and filters resolved through
    /// it) until its rows are gone, so they stay exact for every filter validated while it
    /// was active (docs/ARCHITECTURE.md, "Order", step 10; [`Schema::dropping_fields`]). An entry
    /// applied after the drop's job started may write rows behind it: the applier removes
    /// those once it sees the job recorded (`crate::apply::dropping`). `None` when nothing
    /// differs.
    pub fn with_dropping_maintained(&self) -> Option<Schema> {
        let kept = self.dropping_fields();
        if kept.is_empty() {
            return None;
        }
        let mut older = self.clone();
        for a in self.added.iter().filter(|a| a.state != IndexState::Dropping || kept.contains(&a.field)) {
            if !older.index_keys.contains(&a.field) {
                older.index_keys.push(a.field.clone());
            }
        }
        for a in older.added.iter_mut().filter(|a| kept.contains(&a.field)) {
            a.state = IndexState::Active;
        }
        Some(older)
    }

    /// The indexes [`Schema::with_dropping_maintained`] keeps maintained: every index being dropped, for entries
    /// validated before the drop and after it alike. A filter validated while the index was
    /// active resolves through its rows, and an entry validated after the drop can be ordered
    /// before that filter (its id came from a round that read the clock before the filter's
    /// writer published): had it not maintained the rows, the filter would find a record that
    /// entry had deleted and record a removal of an absent record (found by the checker on CI,
    /// seed 20261121, 4 shards, twice).
    pub fn dropping_fields(&self) -> Vec<String> {
        self.added.iter().filter(|a| a.state == IndexState::Dropping).map(|a| a.field.clone()).collect()
    }

    /// The identity fields: the index fields the catalog was created with, which alone feed
    /// the RowKey fingerprint.
    pub fn identity_keys(&self) -> &[String] {
        &self.identity
    }

    /// The PartitionKey of the record's **owner row** (its first identity field with a
    /// value, the same partition for every version of the identity), among its `keys`; also
    /// its fact row, which projected rows point to (`crate::projection`). `None` when the
    /// record has no identity value.
    pub(crate) fn owner_partition<'k>(&self, keys: &'k RecordKeys) -> Option<&'k String> {
        keys.partitions.iter().find(|(f, _)| self.identity.contains(f)).map(|(_, pk)| pk)
    }

    /// The maintained indexes added after creation (backfilling or active; not dropping),
    /// in `index_keys` order: the fields of `index_keys` after the identity fields.
    pub fn added_keys(&self) -> &[String] {
        self.index_keys.get(self.identity.len()..).unwrap_or_default()
    }

    /// The indexes added after creation, with their states.
    pub fn added(&self) -> &[AddedIndex] {
        &self.added
    }

    /// The projection of index `index` (`crate::projection`): `all` for identity fields,
    /// for unknown indexes and for added ones stored without one.
    pub fn projection_of(&self, index: &str) -> &Projection {
        static ALL: Projection = Projection::All;
        self.added.iter().find(|a| a.field == index).map_or(&ALL, |a| &a.projection)
    }

    /// True when a row of an index whose projection is `projection` holds `field`'s value
    /// of its record (`crate::projection`): every field under `all`; under `keys` an
    /// identity field, the row-key field or a field of any index the schema lists
    /// (maintained, backfilling or dropping; a composite index's fields each); under
    /// `include` those and the listed fields.
    pub(crate) fn holds(&self, projection: &Projection, field: &str) -> bool {
        let keys = || {
            self.identity.iter().any(|k| k == field)
                || self.row_key == field
                || self.index_keys.iter().chain(self.added.iter().map(|a| &a.field)).any(|index| {
                    if composite::is_composite(index) {
                        composite::fields_of(index).contains(&field)
                    } else {
                        index == field
                    }
                })
        };
        match projection {
            Projection::All => true,
            Projection::Keys => keys(),
            Projection::Include(list) => keys() || list.iter().any(|f| f == field),
        }
    }

    /// The payload of `record`'s row in an index whose projection is `projection`: the
    /// record itself under `all`; otherwise the fields the projection holds
    /// ([`Schema::holds`]) and `crate::projection::FACT_PARTITION`, the PartitionKey of the
    /// record's fact row, `fact_pk`. The one place a row's payload is built from a record
    /// and a projection.
    pub(crate) fn project(&self, projection: &Projection, record: &Record, fact_pk: &str) -> Record {
        if projection.is_all() {
            return record.clone();
        }
        let mut out: Record =
            record.iter().filter(|(k, _)| self.holds(projection, k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        out.insert(crate::projection::FACT_PARTITION.to_string(), Json::String(fact_pk.to_string()));
        out
    }

    /// The payload of `record`'s row in index `index` (a field or a composite index's
    /// name), whose record's fact row is in partition `fact_pk`: the record itself for an
    /// `all` index (borrowed), else its projection ([`Schema::project`]).
    pub(crate) fn row_payload<'r>(&self, index: &str, record: &'r Record, fact_pk: &str) -> Cow<'r, Record> {
        match self.projection_of(index) {
            Projection::All => Cow::Borrowed(record),
            projection => Cow::Owned(self.project(projection, record, fact_pk)),
        }
    }

    /// The schema version (0 until the first index change).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The state of index `field`: identity fields are always active; `None` for a field
    /// that is not indexed (or was dropped and its rows removed).
    pub fn index_state(&self, field: &str) -> Option<IndexState> {
        if self.identity.iter().any(|k| k == field) {
            return Some(IndexState::Active);
        }
        self.added.iter().find(|a| a.field == field).map(|a| a.state)
    }

    /// The state of the index whose PartitionKeys start like `pk` (`keys::partition_field`,
    /// compared lowercased as keys are), if any.
    pub fn state_of_partition(&self, pk: &str) -> Option<IndexState> {
        let field = keys::partition_field(pk)?;
        let named = |f: &String| f.to_lowercase() == field;
        if self.identity.iter().any(named) {
            return Some(IndexState::Active);
        }
        self.added.iter().find(|a| named(&a.field)).map(|a| a.state)
    }

    /// The active (queryable) index fields, in schema order.
    pub fn active_keys(&self) -> Vec<&str> {
        self.index_keys.iter().filter(|k| self.index_state(k) == Some(IndexState::Active)).map(String::as_str).collect()
    }

    /// True when some maintained index does not feed the fingerprint (an added index): an
    /// upsert may then move a record's row of that index to another partition, and its
    /// apply removes the old one (`crate::apply`).
    pub fn has_added_indexes(&self) -> bool {
        !self.added_keys().is_empty()
    }

    /// Marks index fields as hashed (keyed by `HMAC-SHA-256(key, value)`, see
    /// `crate::hashed`) and some of those as redacted (records hold the HMAC instead of
    /// the value). Errors, naming the field: a hashed field that is not an index field or is
    /// the row-key field (its value is in plaintext in every RowKey, and `row_from`/`row_to`
    /// compare it by range, which a hash cannot keep), a redacted field that is not hashed,
    /// a field listed twice, and hashed fields without a `key`.
    pub fn with_hashed_keys(
        mut self,
        hashed: Vec<String>,
        redact: Vec<String>,
        key: Option<HashKey>,
    ) -> Result<Schema> {
        let listed = |list: &[String], what: &str, setting: &str| -> Result<()> {
            for (i, f) in list.iter().enumerate() {
                if list[..i].contains(f) {
                    return Err(Error::Config(format!("{setting}: '{f}' is listed twice as {what}")));
                }
            }
            Ok(())
        };
        listed(&hashed, "hashed", settings::HASHED_KEYS)?;
        listed(&redact, "redacted", settings::REDACT_KEYS)?;
        for f in &hashed {
            if f.to_lowercase() == self.row_key.to_lowercase() {
                return Err(Error::Config(format!(
                    "{}: '{f}' is the row-key field, which cannot be hashed: its value starts every RowKey in plaintext and row_from/row_to compare it by range, while hashed indexes support exact lookups only",
                    settings::HASHED_KEYS
                )));
            }
            if !self.is_index(f) {
                return Err(Error::Config(format!(
                    "{}: '{f}' is not an index field; index fields are {}",
                    settings::HASHED_KEYS,
                    self.index_keys.join(", ")
                )));
            }
        }
        for f in &redact {
            if !hashed.contains(f) {
                return Err(Error::Config(format!(
                    "{}: '{f}' is not a hashed field; only hashed fields can be redacted (add it to {})",
                    settings::REDACT_KEYS,
                    settings::HASHED_KEYS
                )));
            }
        }
        if !hashed.is_empty() && key.is_none() {
            return Err(Error::Config(format!(
                "hashed index fields [{}] need the HMAC secret: set {} (at least 32 bytes, hex or base64)",
                hashed.join(","),
                settings::HASH_KEY
            )));
        }
        self.hash_key = if hashed.is_empty() { None } else { key };
        self.hashed = hashed;
        self.redact = redact;
        Ok(self)
    }

    /// Index fields keyed by the HMAC of their value.
    pub fn hashed(&self) -> &[String] {
        &self.hashed
    }

    /// Hashed fields that records hold in redacted form only.
    pub fn redacted(&self) -> &[String] {
        &self.redact
    }

    /// The HMAC secret (only when some field is hashed).
    pub fn hash_key(&self) -> Option<&HashKey> {
        self.hash_key.as_ref()
    }

    /// The key of `field`'s hashed index, when the field is hashed.
    pub(crate) fn key_of(&self, field: &str) -> Option<&HashKey> {
        self.hash_key.as_ref().filter(|_| self.hashed.iter().any(|h| h == field))
    }

    /// The form of index value `value` (a string form, `keys::key_string`) that keys and
    /// comparisons use: the value itself, or for a hashed field the hex HMAC of its
    /// lowercased form (a value already in redacted form gives its own hex).
    pub fn key_value(&self, field: &str, value: &str) -> String {
        match self.key_of(field) {
            Some(key) => key.index_digest(value),
            None => value.to_string(),
        }
    }

    /// True when index value `a` of `field` (as a record holds it) equals `b` (as a filter
    /// names it): case-insensitively, through the HMAC for a hashed field.
    pub fn same_value(&self, field: &str, a: &str, b: &str) -> bool {
        match self.key_of(field) {
            Some(key) => key.index_digest(a) == key.index_digest(b),
            None => a.to_lowercase() == b.to_lowercase(),
        }
    }

    /// The PartitionKey of `field`'s index for `value` (`keys::partition_key` of
    /// [`Schema::key_value`]).
    pub fn partition_key(&self, field: &str, value: &str) -> Result<String> {
        Ok(keys::partition_key(field, &self.key_value(field, value))?)
    }

    /// The record as stored: every redacted field with a value holds
    /// `hmac-sha256:<64 hex>` instead (`crate::hashed::REDACTED_PREFIX`). Values that are
    /// missing, null, empty, objects or arrays are left for [`Schema::record_keys`] to judge.
    pub fn redact(&self, mut record: Record) -> Record {
        let Some(key) = &self.hash_key else { return record };
        for field in &self.redact {
            if let Some(Json::Object(_) | Json::Array(_)) = record.get(field) {
                continue;
            }
            if let Some(value) = Self::index_value(&record, field) {
                record.insert(field.clone(), Json::String(key.redacted(&value)));
            }
        }
        record
    }

    /// Parses a comma-separated list of index keys (`"icao, iata,lid"`).
    pub fn parse_list(list: &str) -> Vec<String> {
        list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
    }

    /// True when `field` is an index key.
    pub fn is_index(&self, field: &str) -> bool {
        self.index_keys.iter().any(|k| k == field)
    }

    /// The string value of index field `field` in `record`, if it has a non-empty one.
    /// Missing, null and empty values mean "not indexed" (a sparse index). For a single
    /// field; a composite index's partition is `Schema::index_partition`'s.
    pub fn index_value(record: &Record, field: &str) -> Option<String> {
        record.get(field).and_then(keys::key_string).filter(|s| !s.is_empty())
    }

    /// The PartitionKey of `record`'s row in index `index` (a field, or a composite index
    /// such as `country+subd`, `crate::composite`), or `None` when the record has no value
    /// for it (for a composite index: when some component has none). The one place a
    /// record's index values become keys: fan-out, backfill, verify, repair and the row moves
    /// of an upsert all come through here ([`Schema::record_keys`]). Errors name the field:
    /// an object or array value, a key over 1 KiB.
    pub(crate) fn index_partition(&self, record: &Record, index: &str) -> Result<Option<String>> {
        if !composite::is_composite(index) {
            if let Some(Json::Object(_) | Json::Array(_)) = record.get(index) {
                return Err(Error::invalid(format!("index field '{index}' must be a string, number or boolean")));
            }
            return Self::index_value(record, index).map(|v| self.partition_key(index, &v)).transpose();
        }
        let mut values = Vec::new();
        for field in composite::fields_of(index) {
            if let Some(Json::Object(_) | Json::Array(_)) = record.get(field) {
                return Err(Error::invalid(format!(
                    "index field '{field}' (of composite index '{index}') must be a string, number or boolean"
                )));
            }
            match Self::index_value(record, field) {
                Some(v) => values.push(self.key_value(field, &v)),
                None => return Ok(None),
            }
        }
        Ok(Some(composite::partition_key(index, values.iter().map(String::as_str))?))
    }

    /// The PartitionKey of composite index `index` for a filter's `(field, value)` pairs,
    /// which name each of its fields (in any order). `None` when one is missing.
    pub(crate) fn composite_partition_key(&self, index: &str, fields: &[(String, String)]) -> Option<Result<String>> {
        let mut values = Vec::new();
        for field in composite::fields_of(index) {
            let (_, v) = fields.iter().find(|(f, _)| f == field)?;
            values.push(self.key_value(field, v));
        }
        Some(composite::partition_key(index, values.iter().map(String::as_str)).map_err(Error::from))
    }

    /// The composite indexes added to the catalog, dropping ones included, in the order
    /// they were added.
    pub(crate) fn composites(&self) -> impl Iterator<Item = &AddedIndex> {
        self.added.iter().filter(|a| composite::is_composite(&a.field))
    }

    /// Validates the record against the schema and computes its keys.
    ///
    /// Errors name the field: a missing or null row-key field, no index value at all, an
    /// index value that is an object or array, a key over 1 KiB.
    pub fn record_keys(&self, record: &Record) -> Result<RecordKeys> {
        let sort = match record.get(&self.row_key) {
            None | Some(Json::Null) => {
                return Err(Error::invalid(format!("record is missing the row-key field '{}'", self.row_key)))
            }
            Some(Json::Object(_) | Json::Array(_)) => {
                return Err(Error::invalid(format!(
                    "row-key field '{}' must be a string, number or boolean",
                    self.row_key
                )))
            }
            Some(v) => keys::key_string(v).unwrap_or_default(),
        };
        let mut partitions = Vec::new();
        for field in &self.index_keys {
            if let Some(pk) = self.index_partition(record, field)? {
                partitions.push((field.clone(), pk));
            }
        }
        if !self.identity.iter().any(|f| Self::index_value(record, f).is_some()) {
            return Err(Error::invalid(format!(
                "record has no value for any index field ({}); it could never be found",
                self.identity.join(", ")
            )));
        }
        let mut sorted: Vec<&String> = self.identity.iter().collect();
        sorted.sort();
        // A hashed field contributes its HMAC, so no key holds anything derived from its
        // plaintext without the secret; a missing value stays the empty string.
        let values: Vec<String> = sorted
            .iter()
            .map(|f| match record.get(f.as_str()).and_then(keys::key_string) {
                Some(v) if !v.is_empty() => self.key_value(f, &v),
                other => other.unwrap_or_default(),
            })
            .collect();
        let fp = keys::fingerprint(values.iter().map(String::as_str));
        Ok(RecordKeys { row_key: keys::row_key(&self.row_key, &sort, &fp)?, partitions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn providers() -> Schema {
        Schema::new(Schema::parse_list("eid, ssn,npi"), "lastname").unwrap()
    }

    #[test]
    fn fans_out_one_row_per_index_value() {
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "npi": "1414213562", "lastname": "Faux"});
        let keys = providers().record_keys(r.as_object().unwrap()).unwrap();
        let pks: Vec<&str> = keys.partitions.iter().map(|(_, pk)| pk.as_str()).collect();
        assert_eq!(pks, ["3_eidf314", "3_ssn123-45-6789", "3_npi1414213562"]);
        // md5("f314|1414213562|123-45-6789"), index fields sorted: eid, npi, ssn.
        assert!(keys.row_key.starts_with("faux:"));
        assert_eq!(keys.row_key.len(), "faux:".len() + 8);
    }

    #[test]
    fn sparse_index_values_get_no_row() {
        let r = json!({"eid": "F314", "ssn": "", "npi": null, "lastname": "Faux"});
        let keys = providers().record_keys(r.as_object().unwrap()).unwrap();
        assert_eq!(keys.partitions.len(), 1);
    }

    #[test]
    fn rejects_records_that_cannot_be_indexed() {
        let s = providers();
        let err = |v: Json| s.record_keys(v.as_object().unwrap()).unwrap_err().to_string();
        assert!(err(json!({"eid": "x"})).contains("row-key field 'lastname'"));
        assert!(err(json!({"lastname": "x", "eid": ""})).contains("no value for any index field"));
        assert!(err(json!({"lastname": "x", "eid": {"a": 1}})).contains("index field 'eid'"));
        assert!(err(json!({"lastname": "x", "eid": "y".repeat(600)})).contains("limit is 512"));
    }

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    /// HMAC-SHA-256 of "123-45-6789" under bytes 0..32 (see `hashed::tests`).
    const SSN_HMAC: &str = "c36200a49b51d6ab68039265bc674b1d0c688fd833eaf123936d026ed25fb4b1";

    fn hashed_providers(redact: &[&str]) -> Schema {
        let key = crate::hashed::HashKey::from_setting(KEY).unwrap();
        providers()
            .with_hashed_keys(vec!["ssn".into()], redact.iter().map(|s| s.to_string()).collect(), Some(key))
            .unwrap()
    }

    #[test]
    fn hashed_fields_key_by_the_hmac_and_nothing_else_changes() {
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "npi": "1414213562", "lastname": "Faux"});
        let r = r.as_object().unwrap();
        let plain = providers().record_keys(r).unwrap();
        let hashed = hashed_providers(&[]).record_keys(r).unwrap();
        let pks: Vec<&str> = hashed.partitions.iter().map(|(_, pk)| pk.as_str()).collect();
        assert_eq!(pks, ["3_eidf314", &format!("3_ssn{SSN_HMAC}"), "3_npi1414213562"]);
        // python3 -c "import hashlib; print(hashlib.md5(b'f314|1414213562|<SSN_HMAC>').hexdigest()[:8])"
        assert_eq!(hashed.row_key, "faux:1d1d6f87");
        assert_ne!(hashed.row_key, plain.row_key, "the fingerprint takes the HMAC, not the plaintext");
        assert_eq!(plain.partitions[1].1, "3_ssn123-45-6789", "plaintext catalogs are unchanged");
        // Case-insensitive like a plaintext key.
        let keys = |ssn: &str| {
            let r = json!({"eid": "F314", "ssn": ssn, "lastname": "Faux"});
            hashed_providers(&[]).record_keys(r.as_object().unwrap()).unwrap()
        };
        assert_eq!(keys("XY-12"), keys("xy-12"));
        assert_ne!(keys("XY-12"), keys("XY12"));
    }

    #[test]
    fn a_redacted_record_has_the_keys_of_its_plaintext() {
        let s = hashed_providers(&["ssn"]);
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "npi": "1414213562", "lastname": "Faux"});
        let redacted = s.redact(r.as_object().unwrap().clone());
        assert_eq!(redacted["ssn"], json!(format!("hmac-sha256:{SSN_HMAC}")));
        assert_eq!(redacted["eid"], json!("F314"), "other fields are untouched");
        assert_eq!(s.record_keys(&redacted).unwrap(), s.record_keys(r.as_object().unwrap()).unwrap());
        assert_eq!(s.redact(redacted.clone()), redacted, "redacting twice changes nothing");
        let sparse = json!({"eid": "F314", "ssn": "", "lastname": "Faux"});
        assert_eq!(s.redact(sparse.as_object().unwrap().clone())["ssn"], json!(""));
        let f = crate::query::Filter::new(vec![("ssn".into(), "123-45-6789".into())]);
        let blind = s.blind_filter(f.clone());
        assert_eq!(blind.fields[0].1, format!("hmac-sha256:{SSN_HMAC}"));
        assert_eq!(blind.partition_key(&s).unwrap(), f.partition_key(&s).unwrap());
        assert!(blind.matches(&s, &redacted) && f.matches(&s, &redacted));
        let other = crate::query::Filter::new(vec![("ssn".into(), "123456789".into())]);
        assert!(!other.matches(&s, &redacted), "no normalisation beyond lowercasing");
    }

    #[test]
    fn hashed_options_are_validated_naming_the_field() {
        let key = || Some(crate::hashed::HashKey::from_setting(KEY).unwrap());
        let err = |hashed: &[&str], redact: &[&str], key| {
            let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
            providers().with_hashed_keys(list(hashed), list(redact), key).unwrap_err().to_string()
        };
        let e = err(&["lastname"], &[], key());
        assert!(e.contains("'lastname' is the row-key field") && e.contains("exact lookups only"), "{e}");
        let e = err(&["city"], &[], key());
        assert!(e.contains("TABLE_CATALOG_HASHED_KEYS: 'city' is not an index field"), "{e}");
        let e = err(&["ssn"], &["npi"], key());
        assert!(e.contains("TABLE_CATALOG_REDACT_KEYS: 'npi' is not a hashed field"), "{e}");
        let e = err(&["ssn"], &[], None);
        assert!(e.contains("TABLE_CATALOG_HASH_KEY"), "{e}");
        assert!(err(&["ssn", "ssn"], &[], key()).contains("listed twice"));
        assert!(providers().with_hashed_keys(vec![], vec![], None).is_ok(), "no hashing needs no key");
        let shown = format!("{:?}", hashed_providers(&["ssn"]));
        assert!(shown.contains("[redacted]") && !shown.contains("0001020304"), "{shown}");
    }

    fn added(field: &str, state: IndexState, version: u64) -> AddedIndex {
        AddedIndex { field: field.into(), state, version, job: None, projection: Projection::All }
    }

    #[test]
    fn an_added_index_gets_rows_but_never_changes_the_row_key() {
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "lastname": "Faux", "dept": "ER"});
        let r = r.as_object().unwrap();
        let before = providers().record_keys(r).unwrap();
        let s = providers().with_added(vec![added("dept", IndexState::Backfilling, 1)], 1).unwrap();
        let after = s.record_keys(r).unwrap();
        assert_eq!(after.row_key, before.row_key, "identity fields alone feed the fingerprint");
        assert_eq!(after.partitions.last().map(|(f, pk)| (f.as_str(), pk.as_str())), Some(("dept", "4_depter")));
        assert!(s.has_added_indexes() && s.is_index("dept"));
        assert_eq!(s.index_state("dept"), Some(IndexState::Backfilling));
        assert_eq!(s.active_keys(), ["eid", "ssn", "npi"]);
        let dropping = providers().with_added(vec![added("dept", IndexState::Dropping, 2)], 2).unwrap();
        assert!(!dropping.is_index("dept"), "a dropping index is not maintained");
        assert_eq!(dropping.state_of_partition("4_depter"), Some(IndexState::Dropping));
        assert_eq!(dropping.record_keys(r).unwrap(), before);
        // A record needs an identity value; an added index's value alone is not enough.
        let only_dept = json!({"lastname": "Faux", "dept": "ER"});
        assert!(s.record_keys(only_dept.as_object().unwrap()).is_err());
        assert!(providers().with_added(vec![added("ssn", IndexState::Active, 1)], 1).is_err(), "listed twice");
    }

    /// Found by the checker on CI (seed 20261121, 4 shards, twice): an entry validated after
    /// `index drop` but ordered before a filter validated while the index was active did not
    /// tombstone its record's row of that index, and the filter then recorded the removal of
    /// a record that was already gone. A dropping index is maintained for every entry.
    #[test]
    fn a_dropping_index_is_maintained_for_entries_validated_after_the_drop_too() {
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "lastname": "Faux", "dept": "ER"});
        let r = r.as_object().unwrap();
        let dropping = providers().with_added(vec![added("dept", IndexState::Dropping, 2)], 2).unwrap();
        let applied = dropping.with_dropping_maintained().expect("the dropping index is kept");
        let keys = applied.record_keys(r).unwrap();
        assert!(keys.partitions.iter().any(|(f, pk)| f == "dept" && pk == "4_depter"), "{keys:?}");
        assert_eq!(dropping.dropping_fields(), ["dept"]);
    }

    #[test]
    fn a_composite_index_keys_a_record_only_when_every_field_has_a_value() {
        let s = providers().with_added(vec![added("dept+ssn", IndexState::Active, 1)], 1).unwrap();
        let keys = |v: Json| s.record_keys(v.as_object().unwrap());
        let r = keys(json!({"eid": "F314", "ssn": "123-45-6789", "lastname": "Faux", "dept": "ER"})).unwrap();
        let (_, pk) = r.partitions.last().unwrap();
        assert_eq!(pk, "8_dept+ssn2_er11_123-45-6789");
        assert_eq!(
            r.row_key,
            providers()
                .record_keys(
                    &json!({"eid": "F314", "ssn": "123-45-6789", "lastname": "Faux"}).as_object().unwrap().clone()
                )
                .unwrap()
                .row_key,
            "identity alone feeds the RowKey"
        );
        for sparse in [
            json!({"eid": "F314", "ssn": "1", "lastname": "Faux"}),
            json!({"eid": "F314", "ssn": "1", "dept": "", "lastname": "Faux"}),
        ] {
            let k = keys(sparse).unwrap();
            assert!(k.partitions.iter().all(|(f, _)| f != "dept+ssn"), "{k:?}");
        }
        let e = keys(json!({"eid": "F314", "ssn": "1", "dept": [1], "lastname": "Faux"})).unwrap_err().to_string();
        assert!(e.contains("index field 'dept' (of composite index 'dept+ssn')"), "{e}");
        // A hashed field contributes its HMAC, as in its own index.
        let hashed = hashed_providers(&[]).with_added(vec![added("dept+ssn", IndexState::Active, 1)], 1).unwrap();
        let r = json!({"eid": "F314", "ssn": "123-45-6789", "lastname": "Faux", "dept": "ER"});
        let k = hashed.record_keys(r.as_object().unwrap()).unwrap();
        assert_eq!(k.partitions.last().unwrap().1, format!("8_dept+ssn2_er64_{SSN_HMAC}"));
        assert!(providers().with_added(vec![added("dept+dept", IndexState::Active, 1)], 1).is_err());
        let e = Schema::new(vec!["eid".into(), "dept+ssn".into()], "lastname").unwrap_err().to_string();
        assert!(e.contains("'dept+ssn' is a composite index") && e.contains("index add dept+ssn"), "{e}");
        assert_eq!(s.state_of_partition("8_dept+ssn2_er1_1"), Some(IndexState::Active));
    }

    #[test]
    fn schema_is_validated() {
        assert!(Schema::new(vec![], "x").is_err());
        assert!(Schema::new(vec!["a".into(), "A".into()], "x").is_err());
        assert!(Schema::new(vec!["a-b".into()], "x").is_err());
        assert!(Schema::new(vec!["a".into()], "PartitionKey").is_err());
    }
}
