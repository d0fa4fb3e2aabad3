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
use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::history::{inverted_time, MAX_DAYS};
use crate::job_core::segment::{segment, Segment, SCAN_STEP};
use crate::job_core::typed::{JobKindSpec, NoFinding, Outcome};
use crate::job_core::Job;
use crate::scan::{self, Step};
use crate::store::bulk_delete;
use crate::wal::id::now_micros;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// `params.days`: the retention period, a whole number of days in 1..=36,500.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub(crate) struct Days(u32);

impl TryFrom<u64> for Days {
    type Error = String;

    fn try_from(d: u64) -> std::result::Result<Days, String> {
        match u32::try_from(d) {
            Ok(d) if (1..=MAX_DAYS).contains(&d) => Ok(Days(d)),
            _ => Err(format!("{d} is not a whole number in 1..={MAX_DAYS}")),
        }
    }
}

impl From<Days> for u64 {
    fn from(d: Days) -> u64 {
        u64::from(d.0)
    }
}

/// The parameters of `trim-history`, as given and stored: `{"days": 30, "segment": 100}`,
/// both optional (`days` defaults to the catalog's period).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TrimParams {
    /// Rows older than this many days are removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<Days>,
    /// Entities per scan query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// What one step counts, as stored (both keys always): `rows` read, `removed`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TrimCounters {
    /// History rows read.
    pub rows: u64,
    /// Rows removed (older than the period).
    pub removed: u64,
}

/// Trims the history table of a catalog.
pub struct TrimHistory {
    catalog: Arc<Catalog>,
}

impl TrimHistory {
    /// A runner for `catalog`'s history table.
    pub fn new(catalog: Arc<Catalog>) -> TrimHistory {
        TrimHistory { catalog }
    }

    /// The period in force: `params.days`, else the catalog's; [`Error::Invalid`] naming
    /// `params.days` when neither is set.
    fn days(&self, params: &TrimParams) -> Result<u32> {
        match params.days {
            Some(Days(d)) => Ok(d),
            None => self.catalog.options().history.keep_days.ok_or_else(|| {
                Error::invalid("params.days: required (the catalog sets no TABLE_CATALOG_HISTORY_DAYS)")
            }),
        }
    }
}

#[async_trait]
impl JobKindSpec for TrimHistory {
    type Params = TrimParams;
    type Step = Step;
    type Counters = TrimCounters;
    type Finding = NoFinding;
    const PARAMS: &'static [&'static str] = &["days", "segment"];
    const STEP: &'static str = SCAN_STEP;

    fn roots(&self, p: &TrimParams) -> Result<Vec<Step>> {
        if !self.catalog.options().history.enabled {
            return Err(Error::invalid(
                "kind: this catalog keeps no history (TABLE_CATALOG_HISTORY is off; CLI: --history on)",
            ));
        }
        self.days(p)?;
        Ok(vec![Step::root()])
    }

    async fn run(&self, _job: &Job, p: &TrimParams, step: Step) -> Result<Outcome<Self>> {
        let cutoff = inverted_time(now_micros() - i64::from(self.days(p)?) * DAY_US);
        let (store, table) = (self.catalog.store().as_ref(), &self.catalog.names().history_table);
        let out = scan::run_step(store, table, &step, segment(p.segment)).await?;
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
        let counters = TrimCounters { rows: out.entities.len() as u64, removed };
        Ok(Outcome { counters, findings: Vec::new(), next: out.next })
    }
}
