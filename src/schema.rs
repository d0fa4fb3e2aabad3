//! The catalog schema: which fields are indexed and which field sorts records (the RowKey
//! base). Stored in the WAL table on first use; opening a catalog with another schema fails.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::keys;
use crate::record::{validate_field_name, Record};

/// Index keys and row-key field of a catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// Indexed fields, in configuration order. Each gets one row per record that has a value.
    pub index_keys: Vec<String>,
    /// The field whose value starts the RowKey (sort order within an index partition).
    pub row_key: String,
}

/// Where one record lives: its RowKey and one PartitionKey per indexed value it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKeys {
    /// RowKey shared by every row of the record.
    pub row_key: String,
    /// (index field, PartitionKey) for each index field with a value, in schema order.
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
            validate_field_name(k).map_err(|e| Error::Config(e.to_string()))?;
        }
        for (i, k) in index_keys.iter().enumerate() {
            if index_keys[..i].iter().any(|o| o.to_lowercase() == k.to_lowercase()) {
                return Err(Error::Config(format!("index keys: '{k}' is listed twice")));
            }
        }
        Ok(Schema { index_keys, row_key })
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
    /// Missing, null and empty values mean "not indexed" (a sparse index).
    pub fn index_value(record: &Record, field: &str) -> Option<String> {
        record.get(field).and_then(keys::key_string).filter(|s| !s.is_empty())
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
            if let Some(Json::Object(_) | Json::Array(_)) = record.get(field) {
                return Err(Error::invalid(format!("index field '{field}' must be a string, number or boolean")));
            }
            if let Some(value) = Self::index_value(record, field) {
                partitions.push((field.clone(), keys::partition_key(field, &value)?));
            }
        }
        if partitions.is_empty() {
            return Err(Error::invalid(format!(
                "record has no value for any index field ({}); it could never be found",
                self.index_keys.join(", ")
            )));
        }
        let mut sorted: Vec<&String> = self.index_keys.iter().collect();
        sorted.sort();
        let values: Vec<String> =
            sorted.iter().map(|f| record.get(f.as_str()).and_then(keys::key_string).unwrap_or_default()).collect();
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

    #[test]
    fn schema_is_validated() {
        assert!(Schema::new(vec![], "x").is_err());
        assert!(Schema::new(vec!["a".into(), "A".into()], "x").is_err());
        assert!(Schema::new(vec!["a-b".into()], "x").is_err());
        assert!(Schema::new(vec!["a".into()], "PartitionKey").is_err());
    }
}
