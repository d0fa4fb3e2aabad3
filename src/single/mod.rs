//! Single-partition mode (issue 31, item 3): a catalog whose every row lives in ONE
//! partition of the catalog table, named by a tenant key, so that every write is one entity
//! group transaction (EGT) and atomic without a write-ahead log.
//!
//! Chosen when the catalog is created ([`Mode`], stored with the schema in a mode row:
//! `meta`) and checked on every open. The layout (`layout`): an owner row per record, and one
//! row per indexed value whose RowKey starts with the value's WAL-mode PartitionKey, each a
//! full copy of the record. Writes (`write`): upsert, insert, replace and delete are each one
//! EGT conditional on the owner rows they change, retried on a concurrent change; a filter
//! that matches several records removes each in its own EGT (atomic per record). Lookups
//! (`query`): one RowKey range of the partition.
//!
//! Limits (`egt`): 100 operations and 4 MiB per EGT (Azure), so at most 99 index values per
//! record and about 4 MiB of row copies per write; a partition's throughput target is 2,000
//! entities per second (Azure's scalability targets), and each write touches one entity per
//! row. Not supported in this mode (refused with [`crate::Error::NotSupported`]): history,
//! online index changes, whole-table jobs, the WAL's operator reads, hashed index fields.

pub(crate) mod batch;
pub(crate) mod egt;
pub(crate) mod layout;
pub(crate) mod meta;
pub(crate) mod query;
pub(crate) mod write;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::names::Names;
use crate::query::Filter;
use crate::record::{self, Record};
use crate::schema::Schema;
use crate::store::Store;

/// Attempts of one write under contention (the first included): a write whose record keeps
/// changing under it answers 503 `busy` after this many.
pub(crate) const ATTEMPTS: usize = 40;

/// How a catalog stores its records, chosen when it is created and stored with it (opening
/// it in the other mode fails with [`Error::SchemaMismatch`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    /// One partition per indexed value, writes made crash-safe by the write-ahead log and
    /// applied by the queue worker and the sweeper (the default; docs/ARCHITECTURE.md).
    #[default]
    Wal,
    /// Every row of the catalog in one partition, named by `tenant` (any text up to 1 KiB
    /// once escaped; setting `TABLE_CATALOG_TENANT`, CLI `--tenant`): every write is one
    /// entity group transaction, applied when acknowledged; no WAL, queue or sweeper.
    /// Limits: at most 99 index values per record, about 4 MiB of rows per write, and a
    /// partition's target of 2,000 entities/s (docs/ARCHITECTURE.md, "Single-partition mode").
    SinglePartition {
        /// The tenant (catalog) key: the partition's name.
        tenant: String,
    },
}

impl Mode {
    /// The mode's name as settings spell it: `wal` or `single-partition`.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Wal => "wal",
            Mode::SinglePartition { .. } => "single-partition",
        }
    }

    /// The mode named `name` (`wal`, `single-partition`) with `tenant` for the latter;
    /// [`Error::Config`] naming `setting` for another name or a missing tenant.
    pub fn parse(setting: &str, name: &str, tenant: Option<&str>) -> Result<Mode> {
        match (name.trim().to_ascii_lowercase().as_str(), tenant.map(str::trim)) {
            ("wal" | "", _) => Ok(Mode::Wal),
            ("single-partition", Some(t)) if !t.is_empty() => Ok(Mode::SinglePartition { tenant: t.to_string() }),
            ("single-partition", _) => Err(Error::Config(format!(
                "{setting}: single-partition needs a tenant key ({}, --tenant)",
                crate::settings::TENANT
            ))),
            (other, _) => Err(Error::Config(format!("{setting}: '{other}' is not a mode (wal, single-partition)"))),
        }
    }
}

/// The single-partition engine of one catalog.
pub(crate) struct SinglePartition {
    store: Arc<dyn Store>,
    table: String,
    /// The tenant key as configured.
    tenant: String,
    /// Its PartitionKey (escaped).
    partition: String,
    schema: Arc<Schema>,
}

impl SinglePartition {
    /// Opens tenant `tenant`'s catalog in `names.table`: checks or stores the mode row
    /// (`meta::open`) and returns the engine with the schema in force.
    pub(crate) async fn open(
        store: Arc<dyn Store>,
        names: &Names,
        tenant: &str,
        configured: Option<Schema>,
    ) -> Result<SinglePartition> {
        if tenant.is_empty() {
            return Err(Error::Config(format!(
                "{}: the tenant key of a single-partition catalog is empty",
                crate::settings::TENANT
            )));
        }
        let partition = layout::partition(tenant)?;
        let schema = meta::open(store.as_ref(), names, &partition, configured).await?;
        Ok(SinglePartition {
            store,
            table: names.table.clone(),
            tenant: tenant.to_string(),
            partition,
            schema: Arc::new(schema),
        })
    }

    /// The tenant key.
    pub(crate) fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The schema (fixed: index changes are not supported in this mode).
    pub(crate) fn schema(&self) -> Arc<Schema> {
        self.schema.clone()
    }

    /// Validates a record as the WAL mode does (redacted fields, shape and size limits, keys).
    fn check(&self, record: Record) -> Result<Record> {
        let record = self.schema.redact(record);
        record::validate(&record)?;
        self.schema.record_keys(&record)?;
        Ok(record)
    }

    /// Validates a write's filter (active indexes only; fields and bounds as in WAL mode).
    fn check_filter(&self, filter: Filter) -> Result<Filter> {
        let filter = filter.allow_partial(false);
        filter.validate(&self.schema)?;
        Ok(filter)
    }

    /// Inserts (`insert_only`) or upserts `record`; returns it as stored.
    pub(crate) async fn upsert(&self, record: Record, insert_only: bool, write_id: &str) -> Result<Record> {
        let record = self.check(record)?;
        self.put(&record, insert_only, write_id).await?;
        Ok(record)
    }

    /// Deletes the records matching `filter`, each in its own EGT (atomic per record): the
    /// filter is resolved through its index, and each record is deleted under its owner
    /// row's ETag if it still matches (re-read and retried on a concurrent change). Returns
    /// how many were deleted.
    pub(crate) async fn delete(&self, filter: Filter) -> Result<usize> {
        let filter = self.check_filter(filter)?;
        let mut n = 0;
        for identity in self.matching(&filter).await? {
            n += usize::from(self.remove(&identity, &filter).await?);
        }
        Ok(n)
    }

    /// Replaces the records matching `filter` with `record`: every match but one is deleted
    /// in its own EGT, then one EGT deletes the last match and stores `record` (so a replace
    /// of one record is atomic). When that last match changed meanwhile so that it no longer
    /// matches (another writer replaced or deleted it), the filter is resolved again, so two
    /// replaces of one record take effect one after the other. Without a match, `record` is
    /// stored. Returns it as stored.
    pub(crate) async fn replace(&self, filter: Filter, record: Record, write_id: &str) -> Result<Record> {
        let filter = self.check_filter(filter)?;
        let record = self.check(record)?;
        let new_identity = self.rows(&record, write_id)?.identity;
        for _ in 0..ATTEMPTS {
            let mut matched = self.matching(&filter).await?;
            // The match that is the new record itself, or else the last, goes with the store.
            let last = match matched.iter().position(|m| *m == new_identity) {
                Some(i) => Some(matched.remove(i)),
                None => matched.pop(),
            };
            for identity in &matched {
                self.remove(identity, &filter).await?;
            }
            match last {
                Some(old) => {
                    if self.swap(&old, &filter, &record, write_id).await?.is_some() {
                        return Ok(record);
                    }
                }
                None => {
                    self.put(&record, false, write_id).await?;
                    return Ok(record);
                }
            }
        }
        Err(Error::Busy {
            message: format!(
                "replace: the last matched record kept changing ({} attempts): the new record was not stored (other matched records may have been deleted); retry",
                ATTEMPTS
            ),
            retry_after_secs: 1,
        })
    }
}
