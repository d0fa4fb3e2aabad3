//! Whole-table verification of the convergence invariant, for operators (`table-catalog
//! verify`) and for the crash and randomized tests.
//!
//! Run it when the WAL is drained (nothing pending). It walks every row of the catalog table
//! and checks, for every RowKey (one record identity):
//! - every live row carries the same record and the same WAL id;
//! - the record has exactly one live row per index value it has (none missing, none extra);
//! - no identity mixes live rows and tombstones (a split state).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::error::Result;
use crate::record::{self, Record, RowMeta};
use crate::schema::Schema;
use crate::store::{Entity, TableStore, MAX_PAGE};

/// What a verification found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Rows read.
    pub rows: usize,
    /// Live records (identities with live rows).
    pub records: usize,
    /// Tombstone rows.
    pub tombstones: usize,
    /// Each violation, described.
    pub violations: Vec<String>,
}

impl VerifyReport {
    /// True when no invariant is violated.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Reads every row of `table`.
pub async fn scan_all(store: &dyn TableStore, table: &str) -> Result<Vec<Entity>> {
    let mut rows = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = store.scan(table, MAX_PAGE, token.as_deref()).await?;
        rows.extend(page.entities);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return Ok(rows),
        }
    }
}

/// Live records of the table, one per identity (RowKey), for comparing with a model.
pub fn live_records(rows: &[Entity]) -> BTreeMap<String, Record> {
    rows.iter().filter_map(|e| record::from_entity(e).map(|r| (e.row_key.clone(), r))).collect()
}

/// Checks the convergence invariant over all rows of `table`.
pub async fn verify(store: &dyn TableStore, table: &str, schema: &Schema) -> Result<VerifyReport> {
    let rows = scan_all(store, table).await?;
    let mut report = VerifyReport { rows: rows.len(), ..VerifyReport::default() };
    let mut by_identity: BTreeMap<&str, Vec<&Entity>> = BTreeMap::new();
    for e in &rows {
        by_identity.entry(e.row_key.as_str()).or_default().push(e);
    }
    for (rk, group) in by_identity {
        let metas: Vec<RowMeta> = group.iter().map(|e| RowMeta::of(e)).collect();
        let live: Vec<(&Entity, &RowMeta)> = group.iter().copied().zip(&metas).filter(|(_, m)| !m.deleted).collect();
        report.tombstones += group.len() - live.len();
        let Some((first, first_meta)) = live.first() else { continue };
        report.records += 1;
        if live.len() != group.len() {
            report.violations.push(format!("RowKey {rk}: live rows and tombstones mixed (split state)"));
        }
        let payload = record::payload(first, first_meta);
        for (e, m) in &live[1..] {
            if record::payload(e, m) != payload || m.wal_id != first_meta.wal_id {
                report.violations.push(format!(
                    "RowKey {rk}: rows {} and {} differ (WAL ids {} / {})",
                    first.partition_key, e.partition_key, first_meta.wal_id, m.wal_id
                ));
            }
        }
        let have: BTreeSet<&str> = live.iter().map(|(e, _)| e.partition_key.as_str()).collect();
        match schema.record_keys(&payload) {
            Ok(keys) => {
                let want: BTreeSet<&str> = keys.partitions.iter().map(|(_, pk)| pk.as_str()).collect();
                for missing in want.difference(&have) {
                    report.violations.push(format!("RowKey {rk}: index row {missing} is missing"));
                }
                for extra in have.difference(&want) {
                    report.violations.push(format!("RowKey {rk}: row {extra} does not belong to the record"));
                }
                if keys.row_key != rk {
                    report.violations.push(format!("RowKey {rk}: the record's keys give RowKey {}", keys.row_key));
                }
            }
            Err(e) => report.violations.push(format!("RowKey {rk}: stored record cannot be keyed: {e}")),
        }
    }
    Ok(report)
}
