//! The parameters and first work items of the index jobs (`backfill`, `drop-index`; run by
//! `crate::jobs::index`), here so that the schema manager can start those jobs.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value as Json;

use super::segment::Segment;
use super::typed::stored;
use super::JobKind;
use crate::scan::{Step, SENTINEL};

/// The parameter names of an index job.
pub(crate) const PARAMS: &[&str] = &["field", "version", "segment"];

/// The parameters of an index job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexParams {
    /// The index field.
    pub field: String,
    /// The schema version of the change.
    pub version: u64,
}

impl IndexParams {
    /// The job parameters as stored (`{"field": ..., "version": ...}`).
    pub fn to_json(&self) -> Json {
        let p = IndexJobParams { field: self.field.clone(), version: self.version, segment: None };
        // A struct of a string and whole numbers always serialises.
        stored("params", &p).unwrap_or_default()
    }

    /// Reads and checks the parameters ([`crate::Error::Invalid`] naming the parameter); the
    /// job itself reads them through its typed `Params` (`crate::jobs::index`).
    #[cfg(test)]
    pub fn of(params: &Json) -> crate::error::Result<IndexParams> {
        let p: IndexJobParams = super::typed::params_of(PARAMS, params)?;
        Ok(IndexParams { field: p.field, version: p.version })
    }
}

/// The parameters of an index job as stored: `{"field": "iata", "version": 3}`, and an
/// optional `"segment": 1..=1000`. `field` must be a valid field name (else
/// [`crate::Error::Invalid`] `params.field: ...`); `field` and `version` are required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IndexJobParams {
    /// The index field.
    #[serde(deserialize_with = "field_name")]
    pub field: String,
    /// The schema version of the change.
    pub version: u64,
    /// Entities per scan query (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// An index name that [`crate::composite::validate_index_name`] accepts (a field name, or
/// a composite index's fields joined by `+`).
fn field_name<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let field = String::deserialize(d)?;
    crate::composite::validate_index_name(&field).map_err(serde::de::Error::custom)?;
    Ok(field)
}

/// The PartitionKey prefix every row of index `field` starts with (`{n}_{field}`, as
/// `crate::keys::partition_key` builds it).
pub fn partition_prefix(field: &str) -> String {
    let lower = field.to_lowercase();
    crate::keys::escape_key(&format!("{}_{lower}", lower.chars().count()))
}

/// The first work item of an index job of `kind` on `field`: the whole table for a
/// backfill, the index's PartitionKeys for a drop.
pub(crate) fn root_step(kind: JobKind, field: &str) -> Step {
    match kind {
        JobKind::DropIndex => {
            let prefix = partition_prefix(field);
            Step::Prefix { lo: Some(prefix.clone()), hi: Some(format!("{prefix}{SENTINEL}")), prefix }
        }
        _ => Step::root(),
    }
}

/// The first work items of an index job of `kind` on `field`, as stored.
pub fn roots(kind: JobKind, field: &str) -> Vec<Json> {
    // A scan step (strings only) always serialises.
    stored("work item", &root_step(kind, field)).into_iter().collect()
}
