//! Repair: re-logs the latest state of every record `verify` finds disagreeing, through the
//! WAL, so a repair obeys fencing and ordering like any write and never edits catalog rows
//! directly (issue 12).
//!
//! The latest state of a record is its row with the highest WAL id ([`crate::verify::Fix`]):
//! a live row becomes an upsert of its payload (restoring missing rows, replacing stale ones
//! and older tombstones); a tombstone, or an orphan row whose owner and other rows are gone,
//! becomes a delete of exactly that identity ([`crate::query::Filter::identity`]). The new
//! entries get ids above every row's, so they win over what is there. A stray row (a copy
//! of a record's row under a partition its index values do not include) becomes the removal
//! of that row, fenced by the ETag the scan saw ([`crate::wal::Op::RemoveRow`]). Unreadable
//! rows are counted and left alone. Apply afterwards (`recover`, or a running `serve`).

use std::collections::BTreeMap;

use futures::TryStreamExt;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::error::Result;
use crate::verify::{row_checks, Fix, RowCheck, VerifyOptions};

/// What a repair did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RepairReport {
    /// Rows checked.
    pub rows: usize,
    /// Findings by kind, as `verify` reports them.
    pub findings: BTreeMap<&'static str, u64>,
    /// Records re-logged as upserts.
    pub upserts: u64,
    /// Records re-logged as deletes.
    pub deletes: u64,
    /// Stray rows logged for removal ([`crate::verify::FindingKind::StrayRow`]).
    pub removals: u64,
    /// Rows or records left alone: unreadable rows, and records whose latest state the
    /// catalog refuses as a write (the reasons are logged as warnings).
    pub unrepairable: u64,
}

/// What [`apply_fix`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixed {
    /// Logged an upsert of the record's latest payload.
    Upserted,
    /// Logged a delete of the identity.
    Deleted,
    /// Logged the removal of a stray row.
    Removed,
    /// The catalog refuses the latest state as a write (logged as a warning); left alone.
    Refused,
}

/// Logs one record's fix through the WAL (a normal write: fenced, ordered, applied by the
/// appliers). Errors: storage failures; a write refused for its content is
/// [`Fixed::Refused`], not an error.
pub async fn apply_fix(catalog: &Catalog, fix: Fix) -> Result<Fixed> {
    let written = match fix {
        Fix::Upsert(record) => catalog.upsert(record, false).await.map(|_| Fixed::Upserted),
        Fix::Delete(filter) => catalog.delete(filter, false).await.map(|_| Fixed::Deleted),
        Fix::RemoveRow { partition_key, row_key, etag } => {
            catalog.remove_stray_row(&partition_key, &row_key, &etag).await.map(|_| Fixed::Removed)
        }
    };
    match written {
        Err(e) if e.is_input_fault() => {
            tracing::warn!(error = %e, "repair: the record's latest state cannot be written; left alone");
            Ok(Fixed::Refused)
        }
        other => other,
    }
}

/// Checks every row of the catalog table and logs one write per disagreeing record;
/// `on_check` sees every row check (progress, findings output). Errors: storage failures of
/// the scan and the checks, and WAL appends that fail for a reason other than the record
/// itself.
pub async fn repair(
    catalog: &Catalog,
    opts: VerifyOptions,
    mut on_check: impl FnMut(&RowCheck),
) -> Result<RepairReport> {
    let store = catalog.store().as_ref();
    let schema = catalog.schema();
    let mut checks = row_checks(store, &catalog.names().table, &schema, opts);
    let mut report = RepairReport::default();
    while let Some(check) = checks.try_next().await? {
        on_check(&check);
        report.rows += 1;
        for f in &check.findings {
            *report.findings.entry(f.kind.name()).or_default() += 1;
            report.unrepairable += u64::from(matches!(f.kind, crate::verify::FindingKind::Unreadable { .. }));
        }
        let Some(fix) = check.record.and_then(|r| r.fix) else { continue };
        match apply_fix(catalog, fix).await? {
            Fixed::Upserted => report.upserts += 1,
            Fixed::Deleted => report.deletes += 1,
            Fixed::Removed => report.removals += 1,
            Fixed::Refused => report.unrepairable += 1,
        }
    }
    Ok(report)
}
