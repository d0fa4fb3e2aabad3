//! The jobs of online index changes ([`crate::indexes`]): `backfill` adds the rows of an
//! added index to every existing record; `drop-index` removes the rows of a dropped one.
//! Neither is started by hand: the apply of the change's WAL entry starts it, once every
//! applier uses the new schema ([`crate::apply::schema_change`]), under the id
//! [`super::JobId::for_wal`] of that entry.
//!
//! Parameters: `field` (the index), `version` (the schema version of the change), and
//! `segment` (entities per scan query, 1..=1,000, default 1,000).
//!
//! **Backfill** scans the whole catalog table (the prefix scan of [`crate::scan`]). Each live
//! row that is its record's owner row (the row of the record's first identity field with a
//! value, so each record is handled once) gives the record's row of the new index, written
//! with the owner row's WAL id through the apply engine's fenced write
//! ([`crate::apply::Applier::write_rows`]): like any apply, it never replaces a row written
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
use serde_json::{json, Value as Json};

use super::kinds::{children, scan_step, segment_of};
use super::{Job, JobKind, JobRunner, StepResult};
use crate::apply::fanout::RowWrite;
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::record::{self, RowMeta};
use crate::scan::{self, Step, SENTINEL};
use crate::schema::IndexState;
use crate::store::bulk_delete;
use crate::wal::WalId;

/// The parameters of an index job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexParams {
    /// The index field.
    pub field: String,
    /// The schema version of the change.
    pub version: u64,
}

impl IndexParams {
    /// The job parameters as stored.
    pub fn to_json(&self) -> Json {
        json!({"field": self.field, "version": self.version})
    }

    /// Reads and checks the parameters ([`Error::Invalid`] naming the parameter).
    pub fn of(params: &Json) -> Result<IndexParams> {
        if let Some(unknown) =
            params.as_object().and_then(|o| o.keys().find(|k| !["field", "version", "segment"].contains(&k.as_str())))
        {
            return Err(Error::invalid(format!(
                "params.{unknown}: unknown parameter (known: field, version, segment)"
            )));
        }
        let field = params
            .get("field")
            .and_then(Json::as_str)
            .ok_or_else(|| Error::invalid("params.field: the index field is required (a string)"))?;
        crate::record::validate_field_name(field).map_err(|e| Error::invalid(format!("params.field: {e}")))?;
        let version = params
            .get("version")
            .and_then(Json::as_u64)
            .ok_or_else(|| Error::invalid("params.version: the schema version is required (a whole number)"))?;
        segment_of(params)?;
        Ok(IndexParams { field: field.to_string(), version })
    }
}

/// The PartitionKey prefix every row of index `field` starts with (`{n}_{field}`, as
/// [`crate::keys::partition_key`] builds it).
pub fn partition_prefix(field: &str) -> String {
    let lower = field.to_lowercase();
    crate::keys::escape_key(&format!("{}_{lower}", lower.chars().count()))
}

/// The first work items of an index job of `kind` on `field`.
pub fn roots(kind: JobKind, field: &str) -> Vec<Json> {
    let step = match kind {
        JobKind::DropIndex => {
            let prefix = partition_prefix(field);
            Step::Prefix { lo: Some(prefix.clone()), hi: Some(format!("{prefix}{SENTINEL}")), prefix }
        }
        _ => Step::root(),
    };
    vec![json!(step)]
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

    async fn backfill(&self, p: &IndexParams, rows: Vec<crate::store::Entity>) -> Result<BTreeMap<String, u64>> {
        let applier = self.catalog.applier();
        applier.ensure_schema(p.version).await?;
        let schema = applier.schema();
        let mut counters: BTreeMap<String, u64> = BTreeMap::new();
        let mut count = |k: &str| *counters.entry(k.to_string()).or_default() += 1;
        let mut writes = Vec::new();
        for e in &rows {
            count("rows");
            let meta = RowMeta::of(e);
            if meta.deleted {
                count("tombstones");
                continue;
            }
            let rec = record::payload(e, &meta);
            let Ok(keys) = schema.record_keys(&rec) else {
                count("unkeyable");
                continue;
            };
            let identity = schema.identity_keys();
            let owner = keys.partitions.iter().find(|(f, _)| identity.contains(f));
            if keys.row_key != e.row_key || owner.map(|(_, pk)| pk) != Some(&e.partition_key) {
                continue; // not the owner row: another row of the record handles it
            }
            count("records");
            if let Some((_, pk)) = keys.partitions.iter().find(|(f, _)| *f == p.field) {
                writes.push((pk.clone(), keys.row_key.clone(), WalId::from_stored(meta.wal_id.clone()), rec));
            }
        }
        let n = writes.len() as u64;
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
        *counters.entry("written".into()).or_default() += n;
        Ok(counters)
    }

    async fn drop_rows(&self, p: &IndexParams, rows: Vec<crate::store::Entity>) -> Result<BTreeMap<String, u64>> {
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
        Ok(BTreeMap::from([("deleted".to_string(), deleted)]))
    }
}

#[async_trait]
impl JobRunner for IndexJob {
    fn roots(&self, params: &Json) -> Result<Vec<Json>> {
        let p = IndexParams::of(params)?;
        Err(Error::invalid(format!(
            "kind: '{}' jobs are started by `index add` / `index drop` (field '{}'), not by hand",
            self.kind.name(),
            p.field
        )))
    }

    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult> {
        let p = IndexParams::of(&job.params)?;
        let step = scan_step(step)?;
        let out =
            scan::run_step(self.catalog.store().as_ref(), &self.catalog.names().table, &step, segment_of(&job.params)?)
                .await?;
        let counters = match self.kind {
            JobKind::DropIndex => self.drop_rows(&p, out.entities).await?,
            _ => self.backfill(&p, out.entities).await?,
        };
        Ok(StepResult { counters, findings: Vec::new(), next: children(&out.next) })
    }

    async fn finished(&self, job: &Job) -> Result<()> {
        let p = IndexParams::of(&job.params)?;
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
