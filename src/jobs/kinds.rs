//! The job kinds over the prefix scan ([`crate::scan`]): each work item is one scan step
//! (one query of at most `segment` entities); its rows are checked on their own
//! ([`crate::verify::check_row`]) and, for `repair`, each disagreeing record's latest state is
//! re-logged through the WAL ([`crate::repair::apply_fix`]).
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
use serde_json::{json, Value as Json};

use super::{Job, JobKind, JobRunner, Jobs, StepResult};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::repair::{apply_fix, Fixed};
use crate::scan::{self, Step};
use crate::store::MAX_PAGE;
use crate::verify::{check_row, RowCheck};

/// Rows of one step checked at once (each check reads up to one row per index field).
const CHECK_CONCURRENCY: usize = 16;

/// `verify` (`repair: false`) and `repair` over the catalog's table.
pub struct ScanCheck {
    catalog: Arc<Catalog>,
    repair: bool,
}

/// `params.segment`: entities per scan query, 1..=1,000 (default 1,000). Shared by every
/// scan-based job kind.
pub(super) fn segment_of(params: &Json) -> Result<usize> {
    match params.get("segment") {
        None | Some(Json::Null) => Ok(MAX_PAGE),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_PAGE as u64).contains(&n) => Ok(n as usize),
            _ => Err(Error::invalid(format!("params.segment: {v} is not a whole number in 1..={MAX_PAGE}"))),
        },
    }
}

/// A work item of a scan-based job: one scan step (an input fault if it is not one).
pub(super) fn scan_step(step: &Json) -> Result<Step> {
    serde_json::from_value(step.clone()).map_err(|e| Error::invalid(format!("work item: not a scan step: {e}")))
}

/// The work items a scan step discovered.
pub(super) fn children(next: &[Step]) -> Vec<Json> {
    next.iter().map(|s| json!(s)).collect()
}

#[async_trait]
impl JobRunner for ScanCheck {
    fn roots(&self, params: &Json) -> Result<Vec<Json>> {
        if let Some(unknown) = params.as_object().and_then(|o| o.keys().find(|k| k.as_str() != "segment")) {
            return Err(Error::invalid(format!("params.{unknown}: unknown parameter (known: segment)")));
        }
        segment_of(params)?;
        Ok(vec![json!(Step::root())])
    }

    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult> {
        let step: Step = serde_json::from_value(step.clone())
            .map_err(|e| Error::invalid(format!("work item: not a scan step: {e}")))?;
        let segment = segment_of(&job.params)?;
        let schema = self.catalog.schema();
        let (store, table, schema) = (self.catalog.store().as_ref(), &self.catalog.names().table, schema.as_ref());
        let out = scan::run_step(store, table, &step, segment).await?;
        // Partitions first seen by this step: each distinct PartitionKey of the page, except
        // the one a `Partition` step continues (counted by the step that began it).
        let mut partitions = 0u64;
        let mut last: Option<&str> = match &step {
            Step::Partition { pk, after: Some(_) } => Some(pk.as_str()),
            _ => None,
        };
        for e in &out.entities {
            if last != Some(e.partition_key.as_str()) {
                partitions += 1;
                last = Some(e.partition_key.as_str());
            }
        }
        let checks: Vec<RowCheck> = futures::stream::iter(out.entities)
            .map(|e| check_row(store, table, schema, e))
            .buffer_unordered(CHECK_CONCURRENCY)
            .try_collect()
            .await?;
        let mut result = StepResult { next: children(&out.next), ..StepResult::default() };
        let count = |c: &mut BTreeMap<String, u64>, k: &str, n: u64| *c.entry(k.to_string()).or_default() += n;
        count(&mut result.counters, "partitions", partitions);
        for check in checks {
            count(&mut result.counters, "rows", 1);
            count(&mut result.counters, "tombstones", u64::from(check.tombstone));
            count(&mut result.counters, "records", u64::from(check.record.as_ref().is_some_and(|r| r.live)));
            for f in &check.findings {
                count(&mut result.counters, "findings", 1);
                count(&mut result.counters, f.kind.name(), 1);
                result.findings.push(serde_json::to_value(f).map_err(|e| Error::invalid(format!("finding: {e}")))?);
            }
            if !self.repair {
                continue;
            }
            if let Some(fix) = check.record.and_then(|r| r.fix) {
                let what = match apply_fix(&self.catalog, fix).await? {
                    Fixed::Upserted => "upserts",
                    Fixed::Deleted => "deletes",
                    Fixed::Removed => "removals",
                    Fixed::Refused => "unrepairable",
                };
                count(&mut result.counters, what, 1);
            }
        }
        Ok(result)
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
