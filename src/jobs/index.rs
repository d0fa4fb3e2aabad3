//! The jobs of online index changes ([`crate::indexes`]): `backfill` adds the rows of an
//! added index to every existing record; `drop-index` removes the rows of a dropped one.
//! Neither is started by hand: the apply of the change's WAL entry starts it, once every
//! applier uses the new schema (`crate::apply::schema_change`), under the id
//! [`super::JobId::for_wal`] of that entry.
//!
//! Parameters: `field` (the index), `version` (the schema version of the change), and
//! `segment` (entities per scan query, 1..=1,000, default 1,000).
//!
//! **Backfill** scans the whole catalog table (the prefix scan of `crate::scan`). Each live
//! row that is its record's owner row (the row of the record's first identity field with a
//! value, so each record is handled once) gives the record's row of the new index, written
//! with the owner row's WAL id through the apply engine's fenced write
//! (`Applier::write_rows`, `crate::apply`): like any apply, it never replaces a row written
//! by a newer entry, nor a tombstone. So a record updated or deleted while the backfill runs
//! ends in the state of its newest entry, whichever of the two writes lands first. When every
//! work item is done, the index turns `active`.
//!
//! Counters: `rows` (scanned), `records` (owner rows), `written` (rows of the new index
//! written or found written), `tombstones`, `unkeyable` (rows the schema cannot key, left for
//! `verify`).
//!
//! **Drop** scans only the PartitionKeys of the index (prefix `{n}_{field}`) and deletes
//! every row it finds (nothing writes them any more once the change is fenced). When every
//! work item is done, the index leaves the schema. Counter: `deleted`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

pub use crate::job_core::index_params::partition_prefix;
#[cfg(test)]
pub(crate) use crate::job_core::index_params::roots;

use crate::apply::fanout::RowWrite;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::job_core::index_params::{IndexJobParams, PARAMS};
use crate::job_core::segment::{add, segment, SCAN_STEP};
use crate::job_core::typed::{JobKindSpec, NoFinding, Outcome};
use crate::job_core::{Job, JobKind};
use crate::record::{self, RowMeta};
use crate::scan::{self, Step};
use crate::schema::IndexState;
use crate::store::bulk_delete;
use crate::wal::WalId;

/// At most this many projected rows are refreshed at once by a backfill step.
const REFRESHES: usize = 16;

/// What one step of an index job counts, as stored. Backfill: `written` always; `rows`,
/// `records`, `tombstones`, `unkeyable` once counted. Drop: `deleted` only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexCounters {
    /// Rows read (backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// Owner rows, one per record (backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Tombstones skipped (backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<u64>,
    /// Rows the schema cannot key (backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unkeyable: Option<u64>,
    /// Rows of the new index written or found written (backfill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written: Option<u64>,
    /// Rows removed (drop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
}

/// `backfill` and `drop-index` (see the module docs).
pub struct IndexJob {
    catalog: Arc<Catalog>,
    kind: JobKind,
}

impl IndexJob {
    /// The runner of `kind` (`Backfill` or `DropIndex`) for `catalog`.
    pub fn new(catalog: Arc<Catalog>, kind: JobKind) -> IndexJob {
        IndexJob { catalog, kind }
    }

    async fn backfill(&self, p: &IndexJobParams, rows: Vec<crate::store::Entity>) -> Result<IndexCounters> {
        let applier = self.catalog.applier();
        applier.ensure_schema(p.version).await?;
        let schema = applier.schema();
        let mut c = IndexCounters::default();
        let (mut refresh, mut writes) = (Vec::new(), Vec::new());
        for e in &rows {
            add(&mut c.rows, 1);
            let meta = RowMeta::of(e);
            if meta.deleted {
                add(&mut c.tombstones, 1);
                continue;
            }
            let rec = record::payload(e, &meta);
            let Ok(keys) = schema.record_keys(&rec) else {
                add(&mut c.unkeyable, 1);
                continue;
            };
            if keys.row_key != e.row_key || schema.owner_partition(&keys) != Some(&e.partition_key) {
                continue; // not the owner row: another row of the record handles it
            }
            add(&mut c.records, 1);
            // The record's rows of other projected indexes hold every indexed value: written
            // before this index was added, they lack its field, which a filter through them
            // needs to find this index's row. Refreshed (same WAL id, newer schema version;
            // only rows that exist, `crate::apply::refresh`) before this index's row, so no
            // filter finds this index's row without its rows naming it.
            for (index, pk) in keys.partitions.iter().filter(|(f, _)| *f != p.field) {
                if !schema.projection_of(index).is_all() {
                    let payload = schema.row_payload(index, &rec, &e.partition_key).into_owned();
                    refresh.push((pk.clone(), keys.row_key.clone(), meta.wal_id.clone(), payload));
                }
            }
            if let Some((_, pk)) = keys.partitions.iter().find(|(f, _)| *f == p.field) {
                // This row is the record's fact row: a projected index's row points to it.
                let payload = schema.row_payload(&p.field, &rec, &e.partition_key).into_owned();
                writes.push((pk.clone(), keys.row_key.clone(), WalId::from_stored(meta.wal_id.clone()), payload));
            }
        }
        let n = writes.len() as u64;
        // Concurrently, at most REFRESHES at once, all before this index's rows.
        let version = applier.schema().version();
        // (Collected first, so that the stream holds the futures, not a closure over borrowed
        // data, which keeps the step's future `Send`.)
        let refreshes: Vec<_> = refresh
            .iter()
            .map(|(pk, rk, id, payload)| applier.refresh_row(pk, rk, id, payload, p.version, version))
            .collect();
        futures::stream::iter(refreshes).buffer_unordered(REFRESHES).try_collect::<Vec<()>>().await?;
        let rows =
            || writes.iter().map(|(pk, rk, id, rec)| (pk.clone(), rk.clone(), id, RowWrite::Live(rec))).collect();
        match applier.write_rows(rows(), applier.schema().version()).await {
            // A row written under a newer schema (an index change since this step began):
            // write again with it (every write is fenced).
            Err(Error::SchemaChanged(version)) => {
                applier.ensure_schema(version).await?;
                applier.write_rows(rows(), applier.schema().version()).await?;
            }
            other => other?,
        }
        add(&mut c.written, n);
        Ok(c)
    }

    async fn drop_rows(&self, p: &IndexJobParams, rows: Vec<crate::store::Entity>) -> Result<IndexCounters> {
        let prefix = partition_prefix(&p.field);
        let mut by_partition: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in rows.into_iter().filter(|e| e.partition_key.starts_with(&prefix)) {
            by_partition.entry(e.partition_key).or_default().push(e.row_key);
        }
        let mut deleted = 0u64;
        let (store, table) = (self.catalog.store(), &self.catalog.names().table);
        for (pk, keys) in by_partition {
            bulk_delete::delete_rows(store.as_ref(), table, &pk, &keys).await?;
            deleted += keys.len() as u64;
        }
        Ok(IndexCounters { deleted: Some(deleted), ..IndexCounters::default() })
    }
}

#[async_trait]
impl JobKindSpec for IndexJob {
    type Params = IndexJobParams;
    type Step = Step;
    type Counters = IndexCounters;
    type Finding = NoFinding;
    const PARAMS: &'static [&'static str] = PARAMS;
    const STEP: &'static str = SCAN_STEP;

    fn roots(&self, p: &IndexJobParams) -> Result<Vec<Step>> {
        Err(Error::invalid(format!(
            "kind: '{}' jobs are started by `index add` / `index drop` (field '{}'), not by hand",
            self.kind.name(),
            p.field
        )))
    }

    async fn run(&self, _job: &Job, p: &IndexJobParams, step: Step) -> Result<Outcome<Self>> {
        let (store, table) = (self.catalog.store().as_ref(), &self.catalog.names().table);
        let out = scan::run_step(store, table, &step, segment(p.segment)).await?;
        let counters = match self.kind {
            JobKind::DropIndex => self.drop_rows(p, out.entities).await?,
            _ => self.backfill(p, out.entities).await?,
        };
        Ok(Outcome { counters, findings: Vec::new(), next: out.next })
    }

    async fn finished(&self, _job: &Job, p: &IndexJobParams) -> Result<()> {
        let (store, wal_table) = (self.catalog.store(), &self.catalog.names().wal_table);
        let kind = self.kind;
        crate::wal::schema_row::update(store.as_ref(), wal_table, |_, added, _| {
            let Some(i) = added.iter().position(|a| a.field == p.field && a.version == p.version) else {
                return Ok(false); // superseded by a later change, or finished before
            };
            match (kind, added[i].state) {
                (JobKind::Backfill, IndexState::Backfilling) => added[i].state = IndexState::Active,
                (JobKind::DropIndex, IndexState::Dropping) => {
                    added.remove(i);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })
        .await?;
        self.catalog.applier().reload_schema().await?;
        tracing::info!(field = %p.field, kind = kind.name(), "index change finished");
        Ok(())
    }
}
