//! The schema manager: the one owner of the schema in force in this process and of its
//! changes. It holds the apply engine (which keeps the schema), adds and drops indexes online
//! (the steps of `crate::indexes`' docs), retries an operation under a newer schema
//! ([`SchemaManager::under_schema`]), picks the schema a lookup runs under, and starts the
//! jobs of schema changes for the apply engine ([`SchemaJobs`], implemented here for the jobs
//! table). The catalog holds one; `crate::indexes` is its public face.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;

use crate::apply::schema_change::SchemaJobs;
use crate::apply::Applier;
use crate::composite::{fields_of, is_composite, validate_index_name};
use crate::error::{Error, Result};
use crate::hinter::Hinter;
use crate::job_core::index_params::{roots, IndexParams};
use crate::job_core::{Job, JobId, JobKind, Jobs};
use crate::projection::Projection;
use crate::query::Filter;
use crate::schema::{AddedIndex, IndexState, Schema};
use crate::store::{Entity, Store};
use crate::wal::clock::Clock;
use crate::wal::{schema_row, Op, ShardId, Wal, WalId};

/// A lookup re-reads the schema first when this process's copy is older than this (so a
/// process that only reads learns of a change within about this long).
pub const LOOKUP_SCHEMA_AGE: Duration = Duration::from_secs(5);

/// One index, as `index list` and `GET /api/indexes` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexInfo {
    /// The indexed field, or a composite index's fields joined by `+` (`country+subd`).
    pub field: String,
    /// `active`, `backfilling` or `dropping`.
    pub state: IndexState,
    /// True for an identity field (created with the catalog; feeds the RowKey).
    pub identity: bool,
    /// The schema version of the change that put it in this state (0 for identity fields).
    pub version: u64,
    /// What its rows hold: `all`, `keys` or `include:a,b` (`crate::projection`; identity
    /// fields are always `all`).
    pub projection: Projection,
    /// The job backfilling or removing its rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// That job, with its progress (while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Job>,
}

/// The outcome of `index add` / `index drop`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexChange {
    /// The index after the change.
    pub index: IndexInfo,
    /// The schema version the change created.
    pub version: u64,
    /// The WAL id of the change's schema entry.
    pub wal_id: String,
    /// The id its job gets once every applier uses the new schema.
    pub job: String,
}

/// The schema in force and its changes (see the module docs).
pub(crate) struct SchemaManager {
    store: Arc<dyn Store>,
    wal: Arc<Wal>,
    applier: Applier,
    /// The jobs table (no kinds: only starts and reads jobs).
    jobs: Arc<Jobs>,
    /// Sends the apply-queue hint of a schema entry.
    hints: Hinter,
}

impl SchemaManager {
    /// The jobs of the catalog whose WAL table is `wal_table`, with work items on
    /// `scan_queue`: what the apply engine starts schema changes' jobs through
    /// ([`Applier::with_jobs`]) and this manager reads them from.
    pub(crate) fn jobs(store: Arc<dyn Store>, wal_table: String, scan_queue: String) -> Arc<Jobs> {
        Arc::new(Jobs::new(store, wal_table, scan_queue))
    }

    /// The manager of `applier`'s schema (`jobs` as [`SchemaManager::jobs`] gave it).
    pub(crate) fn new(store: Arc<dyn Store>, wal: Arc<Wal>, applier: Applier, jobs: Arc<Jobs>, hints: Hinter) -> Self {
        SchemaManager { store, wal, applier, jobs, hints }
    }

    /// The apply engine.
    pub(crate) fn applier(&self) -> &Applier {
        &self.applier
    }

    /// The WAL.
    pub(crate) fn wal(&self) -> &Wal {
        &self.wal
    }

    /// The schema in force in this process.
    pub(crate) fn schema(&self) -> Arc<Schema> {
        self.applier.schema()
    }

    /// Runs `attempt` with the schema in force, again with the re-read schema when the
    /// schema changed while it was logging ([`Error::SchemaChanged`]: nothing was written),
    /// so nothing is logged as validated under a replaced schema. At most 5 attempts.
    pub(crate) async fn under_schema<T, F, Fut>(&self, attempt: F) -> Result<T>
    where
        F: Fn(Arc<Schema>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match attempt(self.schema()).await {
                Err(Error::SchemaChanged(version)) if tries < 4 => {
                    tries += 1;
                    self.applier.ensure_schema(version).await?;
                }
                other => return other,
            }
        }
    }
    /// Every index of the catalog (re-reads the schema; one more read per running job).
    pub(crate) async fn list(&self) -> Result<Vec<IndexInfo>> {
        self.applier.reload_schema().await?;
        let schema = self.schema();
        let mut out: Vec<IndexInfo> = schema
            .identity_keys()
            .iter()
            .map(|f| IndexInfo {
                field: f.clone(),
                state: IndexState::Active,
                identity: true,
                version: 0,
                projection: Projection::All,
                job: None,
                progress: None,
            })
            .collect();
        for a in schema.added() {
            out.push(self.info_of(a).await?);
        }
        Ok(out)
    }

    async fn info_of(&self, a: &AddedIndex) -> Result<IndexInfo> {
        let progress = match (&a.job, a.state) {
            (Some(id), IndexState::Backfilling | IndexState::Dropping) => match self.jobs.get(&JobId::parse(id)?).await
            {
                Ok(job) => Some(job),
                Err(Error::NotFound(_)) => None,
                Err(e) => return Err(e),
            },
            _ => None,
        };
        Ok(IndexInfo {
            field: a.field.clone(),
            state: a.state,
            identity: false,
            version: a.version,
            projection: a.projection.clone(),
            job: a.job.clone(),
            progress,
        })
    }

    /// Adds index `field` online with projection `projection` (see the module docs); returns
    /// once the change is logged (the backfill runs on the scan queue). Errors: a bad field
    /// name or a projection other than `all` on an identity field ([`Error::Invalid`]), a field
    /// that is already an index ([`Error::Conflict`], naming its state), the same index
    /// asked for again with another projection ([`Error::Conflict`]).
    pub(crate) async fn add(&self, field: &str, projection: Projection) -> Result<IndexChange> {
        validate_index_name(field).map_err(|e| Error::invalid(format!("field: {e}")))?;
        let wanted = field.to_string();
        let row = schema_row::update(self.store.as_ref(), self.wal.table(), |identity, added, version| {
            let lower = wanted.to_lowercase();
            if !projection.is_all() && identity.iter().any(|k| k.to_lowercase() == lower) {
                return Err(Error::invalid(format!(
                    "projection: '{wanted}' is an identity field, whose rows hold the whole record (one of them is the record's fact row, which projected rows point to), so its projection is all; add another index with --projection {projection}"
                )));
            }
            if identity.iter().any(|k| k.to_lowercase() == lower) {
                return Err(Error::Conflict(format!(
                    "field: '{wanted}' is already an index (an identity field, active)"
                )));
            }
            if let Some(a) = added.iter().find(|a| a.field.to_lowercase() == lower) {
                // A change that stopped before its job started (the process died between the
                // steps): publish it again (each step is idempotent).
                if a.field == wanted && a.state == IndexState::Backfilling && a.job.is_none() {
                    if a.projection != projection {
                        return Err(Error::Conflict(format!(
                            "field: '{wanted}' is being added with projection {}, not {projection}; run the same command again to complete it, or drop it once it is active",
                            a.projection
                        )));
                    }
                    return Ok(false);
                }
                return Err(Error::Conflict(format!(
                    "field: '{}' is already an index ({}{}); drop it first to add it again",
                    a.field,
                    a.state.name(),
                    a.job.as_ref().map(|j| format!(", job {j}")).unwrap_or_default()
                )));
            }
            if let Some(a) = added.iter().find(|a| is_composite(&a.field) && same_fields(&a.field, &wanted)) {
                // Lookups name a set of fields: a second order of the same fields would serve
                // no lookup the first does not (`crate::index_choice`).
                return Err(Error::Conflict(format!(
                    "field: the composite index '{}' ({}) already has the fields of '{wanted}'; lookups name a set of fields, so one order serves them all",
                    a.field,
                    a.state.name()
                )));
            }
            *version += 1;
            added.push(AddedIndex {
                field: wanted.clone(),
                state: IndexState::Backfilling,
                version: *version,
                job: None,
                projection: projection.clone(),
            });
            Ok(true)
        })
        .await?;
        self.publish(&row, field).await
    }

    /// Drops index `field` online (see the module docs): it stops being maintained once every
    /// applier uses the new schema, and a job removes its rows. Errors: an identity field or a
    /// backfilling index ([`Error::Conflict`], saying what to do instead), a field that is not an
    /// index ([`Error::NotFound`], naming the indexes).
    pub(crate) async fn drop(&self, field: &str) -> Result<IndexChange> {
        validate_index_name(field).map_err(|e| Error::invalid(format!("field: {e}")))?;
        let wanted = field.to_string();
        let row = schema_row::update(self.store.as_ref(), self.wal.table(), |identity, added, version| {
            if identity.contains(&wanted) {
                return Err(Error::Conflict(format!(
                    "field: '{wanted}' is an identity field (created with the catalog, it feeds every record's RowKey) and cannot be dropped online; rebuild the catalog without it: table-catalog rebuild --into NEW_NAME --new-index-keys ..."
                )));
            }
            let Some(a) = added.iter_mut().find(|a| a.field == wanted) else {
                let mut known: Vec<&str> = identity.iter().map(String::as_str).collect();
                known.extend(added.iter().map(|a| a.field.as_str()));
                return Err(Error::NotFound(format!("field: '{wanted}' is not an index; indexes are {}", known.join(", "))));
            };
            match a.state {
                IndexState::Active => {}
                // Dropped already (and maybe stopped before its job started): publish it again.
                IndexState::Dropping => return Ok(false),
                IndexState::Backfilling => {
                    return Err(Error::Conflict(format!(
                        "field: '{wanted}' is backfilling{}; drop it once it is active",
                        a.job.as_ref().map(|j| format!(" (job {j})")).unwrap_or_default()
                    )))
                }
            }
            *version += 1;
            a.state = IndexState::Dropping;
            a.version = *version;
            a.job = None;
            Ok(true)
        })
        .await?;
        self.publish(&row, field).await
    }

    /// Steps 2-3 of a change whose schema row is `row`: raise the clock's schema version, adopt
    /// the schema here, log the schema entry and hint its shard.
    async fn publish(&self, row: &Entity, field: &str) -> Result<IndexChange> {
        let stored = schema_row::StoredSchema::of(row);
        let index = stored
            .added
            .iter()
            .find(|a| a.field == field)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("field: '{field}' is not an index")))?;
        let (store, wal_table) = (&self.store, self.wal.table());
        crate::faults::point("after_schema_row")?;
        Clock::raise_schema_version(store.as_ref(), wal_table, stored.version).await?;
        crate::faults::point("after_schema_clock")?;
        self.applier.adopt(row)?;
        let op = Op::Schema { version: index.version };
        let id: WalId = self
            .under_schema(|schema| {
                let op = op.clone();
                async move { Ok(self.wal.append_under(vec![(ShardId::ZERO, op)], schema.version()).await?.remove(0)) }
            })
            .await?;
        self.hints.hint(ShardId::ZERO, &id);
        tracing::info!(field, state = index.state.name(), version = index.version, wal_id = %id, "index change logged");
        let job = JobId::for_wal(&id).to_string();
        Ok(IndexChange {
            version: index.version,
            wal_id: id.to_string(),
            job: job.clone(),
            index: IndexInfo {
                field: index.field,
                state: index.state,
                identity: false,
                version: index.version,
                projection: index.projection,
                job: Some(job),
                progress: None,
            },
        })
    }

    /// The schema to run lookup `filter` under, after checking the filter against it: re-read
    /// when this process's copy is older than [`LOOKUP_SCHEMA_AGE`], or once more when the
    /// filter fails against it (the index may have just turned active). A backfilling index's
    /// error carries its job's progress.
    pub(crate) async fn lookup_schema(&self, filter: &Filter) -> Result<Arc<Schema>> {
        let applier = &self.applier;
        let schema = applier.schema_within(LOOKUP_SCHEMA_AGE).await?;
        let schema = match filter.validate(&schema) {
            Ok(()) => return Ok(schema),
            Err(Error::IndexNotReady(_) | Error::Invalid(_)) if applier.schema_age() > Duration::from_millis(100) => {
                applier.reload_schema().await?;
                applier.schema()
            }
            Err(_) => schema,
        };
        match filter.validate(&schema) {
            Ok(()) => Ok(schema),
            Err(Error::IndexNotReady(message)) => {
                let index = filter.backfilling_index(&schema);
                let added = index.and_then(|f| schema.added().iter().find(|a| a.field == f));
                let progress = match added {
                    Some(a) => self.progress_text(a).await,
                    None => String::new(),
                };
                Err(Error::IndexNotReady(format!("{message}{progress}")))
            }
            Err(e) => Err(e),
        }
    }

    /// ` (backfill job J: N of M work items done, R rows scanned)`, or why it has not started.
    async fn progress_text(&self, a: &AddedIndex) -> String {
        let Some(id) = &a.job else {
            return " (its backfill starts once every applier uses schema version ".to_string()
                + &a.version.to_string()
                + ")";
        };
        match JobId::parse(id) {
            Ok(job_id) => match self.jobs.get(&job_id).await {
                Ok(job) => format!(
                    " (backfill job {id}: {} of {} work items done, {} rows scanned, {} rows written; GET /api/jobs/{id} or table-catalog jobs show {id})",
                    job.steps_done,
                    job.steps_done + job.steps_pending,
                    job.counters.get("rows").copied().unwrap_or(0),
                    job.counters.get("written").copied().unwrap_or(0)
                ),
                Err(_) => format!(" (backfill job {id})"),
            },
            Err(_) => String::new(),
        }
    }
}

impl SchemaJobs for Jobs {
    fn job_id(&self, wal_id: &WalId) -> String {
        JobId::for_wal(wal_id).to_string()
    }

    fn start<'a>(&'a self, id: &'a str, field: &'a str, dropping: bool, version: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let kind = if dropping { JobKind::DropIndex } else { JobKind::Backfill };
            let id = JobId::parse(id)?;
            let params = IndexParams { field: field.to_string(), version }.to_json();
            self.start_as(id.clone(), kind, params, roots(kind, field)).await?;
            tracing::info!(field = %field, version, job = %id, kind = kind.name(), "schema change applied; job started");
            Ok(())
        })
    }
}

/// True when composite index names `a` and `b` have the same fields in any order (compared
/// case-insensitively, as keys are).
fn same_fields(a: &str, b: &str) -> bool {
    let set = |n: &str| fields_of(n).into_iter().map(str::to_lowercase).collect::<std::collections::BTreeSet<_>>();
    is_composite(b) && set(a) == set(b)
}
