//! The job kinds over the prefix scan (`crate::scan`): each work item is one scan step
//! (one query of at most `segment` entities); its rows are checked on their own
//! (`crate::verify::check_row`) and, for `repair`, each disagreeing record's latest state is
//! re-logged through the WAL (`crate::repair::apply_fix`).
//!
//! Parameters (`POST /api/jobs` body `{"kind": "verify", "params": {...}}`):
//! - `segment`: entities per scan query, 1..=1,000 (default 1,000, Azure's page size).
//!
//! Counters: `rows`, `partitions`, `records` (live), `tombstones`, `findings` and one per finding kind
//! (`missing_row`, `orphan_row`, `moved_row`, `stale`, `split_state`, `stray_row`,
//! `unreadable`); `repair` adds `upserts`, `deletes`, `removals` and `unrepairable`. Each finding is stored as the JSON line
//! `verify` prints (`GET /api/jobs/{id}/findings`).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::error::Result;
use crate::job_core::segment::{add, segment, Segment, SCAN_STEP};
use crate::job_core::typed::{JobKindSpec, Outcome};
use crate::job_core::{Job, JobKind, Jobs};
use crate::repair::{apply_fix, Fixed};
use crate::scan::{self, Step};
use crate::verify::{check_row, Finding, RowCheck};

/// Rows of one step checked at once (each check reads up to one row per index field).
const CHECK_CONCURRENCY: usize = 16;

/// Parameters of `verify` and `repair`: `{"segment": 1..=1000}` (optional; `{}` is fine).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScanParams {
    /// Entities per scan query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// What one `verify`/`repair` step counts, as stored: `partitions` always; `rows`,
/// `tombstones`, `records` once a row was read; `findings` and one per finding kind once a
/// finding was made; `upserts`, `deletes`, `removals`, `unrepairable` once a fix had that
/// outcome (a key is absent, not 0, until then).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CheckCounters {
    /// PartitionKeys first seen by this step.
    pub partitions: u64,
    /// Rows read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// Tombstone rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<u64>,
    /// Live records (counted on the row that reports its record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Findings, all kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<u64>,
    /// Records re-logged as upserts (`repair`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upserts: Option<u64>,
    /// Records re-logged as deletes (`repair`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletes: Option<u64>,
    /// Stray rows removed (`repair`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removals: Option<u64>,
    /// Fixes refused (`repair`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrepairable: Option<u64>,
    /// Findings by kind (`missing_row`, `stale`, ...).
    #[serde(flatten)]
    pub by_kind: BTreeMap<String, u64>,
}

/// `verify` (`repair: false`) and `repair` over the catalog's table.
pub struct ScanCheck {
    catalog: Arc<Catalog>,
    repair: bool,
}

#[async_trait]
impl JobKindSpec for ScanCheck {
    type Params = ScanParams;
    type Step = Step;
    type Counters = CheckCounters;
    type Finding = Finding;
    const PARAMS: &'static [&'static str] = &["segment"];
    const STEP: &'static str = SCAN_STEP;

    fn roots(&self, _p: &ScanParams) -> Result<Vec<Step>> {
        Ok(vec![Step::root()])
    }

    async fn run(&self, _job: &Job, p: &ScanParams, step: Step) -> Result<Outcome<Self>> {
        let schema = self.catalog.schema();
        let (store, table, schema) = (self.catalog.store().as_ref(), &self.catalog.names().table, schema.as_ref());
        let out = scan::run_step(store, table, &step, segment(p.segment)).await?;
        // Partitions first seen by this step: each distinct PartitionKey of the page, except
        // the one a `Partition` step continues (counted by the step that began it).
        let mut c = CheckCounters::default();
        let mut last: Option<&str> = match &step {
            Step::Partition { pk, after: Some(_) } => Some(pk.as_str()),
            _ => None,
        };
        for e in &out.entities {
            if last != Some(e.partition_key.as_str()) {
                c.partitions += 1;
                last = Some(e.partition_key.as_str());
            }
        }
        let checks: Vec<RowCheck> = futures::stream::iter(out.entities)
            .map(|e| check_row(store, table, schema, e))
            .buffer_unordered(CHECK_CONCURRENCY)
            .try_collect()
            .await?;
        let mut findings = Vec::new();
        for check in checks {
            add(&mut c.rows, 1);
            add(&mut c.tombstones, u64::from(check.tombstone));
            add(&mut c.records, u64::from(check.record.as_ref().is_some_and(|r| r.live)));
            for f in check.findings {
                add(&mut c.findings, 1);
                *c.by_kind.entry(f.kind.name().to_string()).or_default() += 1;
                findings.push(f);
            }
            if !self.repair {
                continue;
            }
            if let Some(fix) = check.record.and_then(|r| r.fix) {
                let what = match apply_fix(&self.catalog, fix).await? {
                    Fixed::Upserted => &mut c.upserts,
                    Fixed::Deleted => &mut c.deletes,
                    Fixed::Removed => &mut c.removals,
                    Fixed::Refused => &mut c.unrepairable,
                };
                add(what, 1);
            }
        }
        Ok(Outcome { next: out.next, counters: c, findings })
    }
}

impl Jobs {
    /// The jobs of `catalog`: work items on its scan queue, records in its WAL table, and
    /// the kinds `verify`, `repair`, `rebuild`, `trim-history`, `backfill` and `drop-index`.
    pub fn for_catalog(catalog: Arc<Catalog>) -> Jobs {
        let names = catalog.names().clone();
        Jobs::new(catalog.store().clone(), names.wal_table, names.scan_queue)
            .with_runner(JobKind::Verify, Arc::new(ScanCheck { catalog: catalog.clone(), repair: false }))
            .with_runner(JobKind::Repair, Arc::new(ScanCheck { catalog: catalog.clone(), repair: true }))
            .with_runner(JobKind::Rebuild, Arc::new(super::rebuild::Rebuild::new(catalog.clone())))
            .with_runner(JobKind::TrimHistory, Arc::new(super::trim::TrimHistory::new(catalog.clone())))
            .with_runner(JobKind::Backfill, Arc::new(super::index::IndexJob::new(catalog.clone(), JobKind::Backfill)))
            .with_runner(JobKind::DropIndex, Arc::new(super::index::IndexJob::new(catalog, JobKind::DropIndex)))
    }
}
