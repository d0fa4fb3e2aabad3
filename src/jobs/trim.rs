//! The `trim-history` job: removes history rows older than the retention period from the
//! whole history table ([`crate::history`]), one scan step per work item. Retention by age is
//! otherwise applied only when a record is written again; this job covers the records that
//! are not (a count limit needs no job: a record's count grows only when it is written).
//!
//! Parameters: `days` (1..=36,500; default the catalog's `TABLE_CATALOG_HISTORY_DAYS`, and
//! required without it), `segment` (1..=1,000). Counters: `rows` read, `removed`.
//! Idempotent: a rerun finds the rows it removed gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value as Json};

use super::kinds::{children, scan_step, segment_of};
use super::{Job, JobRunner, StepResult};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::history::{inverted_time, MAX_DAYS};
use crate::scan::{self, Step};
use crate::store::bulk_delete;
use crate::wal::id::now_micros;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// Trims the history table of a catalog.
pub struct TrimHistory {
    catalog: Arc<Catalog>,
}

impl TrimHistory {
    /// A runner for `catalog`'s history table.
    pub fn new(catalog: Arc<Catalog>) -> TrimHistory {
        TrimHistory { catalog }
    }

    fn days(&self, params: &Json) -> Result<u32> {
        match params.get("days") {
            None | Some(Json::Null) => self.catalog.options().history.keep_days.ok_or_else(|| {
                Error::invalid("params.days: required (the catalog sets no TABLE_CATALOG_HISTORY_DAYS)")
            }),
            Some(v) => v
                .as_u64()
                .filter(|d| (1..=u64::from(MAX_DAYS)).contains(d))
                .map(|d| d as u32)
                .ok_or_else(|| Error::invalid(format!("params.days: {v} is not a whole number in 1..={MAX_DAYS}"))),
        }
    }
}

#[async_trait]
impl JobRunner for TrimHistory {
    fn roots(&self, params: &Json) -> Result<Vec<Json>> {
        if let Some(unknown) =
            params.as_object().and_then(|o| o.keys().find(|k| !["days", "segment"].contains(&k.as_str())))
        {
            return Err(Error::invalid(format!("params.{unknown}: unknown parameter (known: days, segment)")));
        }
        if !self.catalog.options().history.enabled {
            return Err(Error::invalid(
                "kind: this catalog keeps no history (TABLE_CATALOG_HISTORY is off; CLI: --history on)",
            ));
        }
        self.days(params)?;
        segment_of(params)?;
        Ok(vec![json!(Step::root())])
    }

    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult> {
        let step = scan_step(step)?;
        let cutoff = inverted_time(now_micros() - i64::from(self.days(&job.params)?) * DAY_US);
        let (store, table) = (self.catalog.store().as_ref(), &self.catalog.names().history_table);
        let out = scan::run_step(store, table, &step, segment_of(&job.params)?).await?;
        // A history RowKey starts with the inverted time: at or above the cutoff = older.
        let mut old: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for e in &out.entities {
            if e.row_key.as_str() >= cutoff.as_str() {
                old.entry(e.partition_key.as_str()).or_default().push(e.row_key.clone());
            }
        }
        let mut removed = 0u64;
        for (pk, keys) in &old {
            bulk_delete::delete_rows(store, table, pk, keys).await?;
            removed += keys.len() as u64;
        }
        let counters =
            BTreeMap::from([("rows".to_string(), out.entities.len() as u64), ("removed".to_string(), removed)]);
        Ok(StepResult { counters, findings: Vec::new(), next: children(&out.next) })
    }
}
