//! The apply engine of one catalog ([`Applier`]): what it holds (the WAL, the store, the schema
//! in force, per-shard locks, the row cache), how it is built, and the schema it applies
//! with. The apply pass is in the parent module, each step of it in a sibling module.

use crate::env::Instant;
use std::sync::Arc;

use super::{dropping_rows, history_target, row_cache, schema_jobs};
use crate::error::{Error, Result};
use crate::schema::Schema;
use crate::store::{Entity, Store, StoreError};
use crate::wal::schema_row;
use crate::wal::{Op, ShardId, Wal, WalOptions, METADATA};

/// The apply engine of one catalog (see the module docs).
pub struct Applier {
    pub(crate) wal: Arc<Wal>,
    pub(crate) store: Arc<dyn Store>,
    /// Catalog table name.
    pub(crate) catalog_table: String,
    /// The schema as configured (identity fields, row key, hashed fields; version 0).
    base: Schema,
    /// The schema in force here: `base` with the stored added indexes, re-read when a newer
    /// version shows up ([`Applier::reload_schema`]).
    schema: std::sync::RwLock<Arc<Schema>>,
    pub(crate) opts: WalOptions,
    /// One applier per shard per process at a time.
    pub(super) locks: Vec<tokio::sync::Mutex<()>>,
    /// Catalog rows this process last wrote or read (ETag, WAL id), for one-request updates.
    pub(crate) rows: row_cache::RowCache,
    /// Whether unseen rows tend to exist (picks insert-first or read-first).
    pub(crate) existence: row_cache::Existence,
    /// Where history rows go, when the catalog keeps history ([`history`]).
    pub(crate) history: Option<history_target::HistoryTarget>,
    /// Starts the jobs of schema changes ([`schema_change`]).
    pub(crate) jobs: Option<Arc<dyn schema_jobs::SchemaJobs>>,
    /// When the schema was last read from the store (for [`Applier::schema_within`]).
    schema_read: std::sync::Mutex<Instant>,
    /// Rows written in partitions of dropping indexes, until checked ([`dropping`]).
    pub(super) dropping: dropping_rows::DroppingRows,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier").field("catalog_table", &self.catalog_table).finish()
    }
}

impl Applier {
    /// The engine applying `wal` to `catalog_table`. Call [`Applier::init`] before use.
    pub fn new(wal: Arc<Wal>, catalog_table: String, schema: Schema) -> Applier {
        let opts = wal.opts.clone();
        let locks = (0..crate::wal::shard::MAX_SHARDS).map(|_| tokio::sync::Mutex::new(())).collect();
        Applier {
            store: wal.store.clone(),
            wal,
            catalog_table,
            base: schema.clone(),
            schema: std::sync::RwLock::new(Arc::new(schema)),
            opts,
            locks,
            rows: row_cache::RowCache::default(),
            existence: row_cache::Existence::default(),
            history: None,
            jobs: None,
            schema_read: std::sync::Mutex::new(crate::env::now()),
            dropping: dropping_rows::DroppingRows::default(),
        }
    }

    /// Starts the jobs of schema changes through `jobs` (builder style).
    pub fn with_jobs(mut self, jobs: Arc<dyn schema_jobs::SchemaJobs>) -> Applier {
        self.jobs = Some(jobs);
        self
    }

    /// Also records every applied change in the history table `table` (builder style; call
    /// before [`Applier::init`], which creates the table).
    pub fn with_history(mut self, table: String, opts: crate::history::HistoryOptions) -> Applier {
        self.history = Some(history_target::HistoryTarget { table, opts });
        self
    }

    /// The history table, when the catalog keeps history.
    pub fn history_table(&self) -> Option<&str> {
        self.history.as_ref().map(|h| h.table.as_str())
    }

    /// Creates the catalog table and stores or checks the schema: a catalog opened with
    /// another schema than the one it was created with fails with [`Error::SchemaMismatch`],
    /// as does one opened with another hash key than the one its hashed keys were made with.
    pub async fn init(&self) -> Result<()> {
        self.store.create_table(&self.catalog_table).await?;
        if let Some(h) = &self.history {
            self.store.create_table(&h.table).await?;
        }
        let table = self.wal.table();
        let want = schema_row::row(&self.base);
        let stored = match self.store.insert(table, &want).await {
            Ok(_) => return Ok(()),
            Err(StoreError::AlreadyExists(_)) => self.store.get(table, METADATA, schema_row::ROW).await?,
            Err(e) => return Err(e.into()),
        };
        let stored = stored.ok_or_else(|| Error::SchemaMismatch("schema row vanished while opening".into()))?;
        schema_row::check(&stored, &self.base, &self.catalog_table)?;
        self.adopt(&stored)?;
        if schema_row::needs_healing(&stored) {
            // Rewritten without the marker by a release from before it: mark it again, so
            // releases from before online index changes refuse the catalog (a conditional
            // write; the list and version stay as stored).
            tracing::info!("schema row written by an earlier release: marking it changed again");
            let healed = schema_row::update(self.store.as_ref(), table, |_, _, _| Ok(true)).await?;
            self.adopt(&healed)?;
        }
        Ok(())
    }

    /// The schema in force in this process (cheap: a shared pointer).
    pub fn schema(&self) -> Arc<Schema> {
        self.schema.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes the stored schema row `stored` the one in force, unless this process already
    /// has a newer version. Errors when the row is not one this process can use.
    pub(crate) fn adopt(&self, stored: &Entity) -> Result<()> {
        *self.schema_read.lock().unwrap_or_else(|p| p.into_inner()) = crate::env::now();
        let parsed = schema_row::StoredSchema::of(stored);
        let schema = parsed.apply_to(self.base.clone())?;
        let mut current = self.schema.write().unwrap_or_else(|p| p.into_inner());
        if schema.version() >= current.version() {
            if schema.version() > current.version() {
                tracing::info!(version = schema.version(), indexes = %schema.index_keys.join(","), "schema changed");
                // Rows of a dropped index were deleted behind the cache's back.
                self.rows.clear();
            }
            self.wal.note_schema_version(schema.version());
            *current = Arc::new(schema);
        }
        Ok(())
    }

    /// Re-reads the stored schema and makes it the one in force (one request). Returns the
    /// version now in force.
    pub async fn reload_schema(&self) -> Result<u64> {
        let stored = schema_row::read_row(self.store.as_ref(), self.wal.table())
            .await?
            .ok_or_else(|| Error::SchemaMismatch("the catalog's schema row is gone".into()))?;
        self.adopt(&stored)?;
        Ok(self.schema().version())
    }

    /// How long ago the schema was last read from the store.
    pub fn schema_age(&self) -> std::time::Duration {
        self.schema_read.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    /// The schema in force, re-read first when it was read longer than `max_age` ago.
    pub async fn schema_within(&self, max_age: std::time::Duration) -> Result<Arc<Schema>> {
        if self.schema_age() > max_age {
            self.reload_schema().await?;
        }
        Ok(self.schema())
    }

    /// Re-reads the schema if this process's version is below `version` (an entry, lease
    /// row or clock row said a newer one exists).
    pub(crate) async fn ensure_schema(&self, version: u64) -> Result<()> {
        if self.schema().version() < version {
            self.reload_schema().await?;
        }
        Ok(())
    }

    /// The WAL.
    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// The shard an operation is logged in: an upsert in the shard of its record's RowKey,
    /// anything that reads the catalog to decide what to write (replace, delete) in shard 0,
    /// behind the barrier. Errors when the record cannot be keyed.
    pub fn route(&self, op: &Op) -> Result<ShardId> {
        match op {
            Op::Upsert { record } => Ok(self.shard_of(&self.schema().record_keys(record)?.row_key)),
            Op::Replace { .. } | Op::Delete { .. } | Op::Schema { .. } | Op::RemoveRow { .. } => Ok(ShardId::ZERO),
        }
    }

    /// The shard an upsert of the record with this RowKey is logged in, over the shard
    /// count in force in this process.
    pub fn shard_of(&self, row_key: &str) -> ShardId {
        ShardId::for_row_key(row_key, self.wal.shard_count())
    }
}
