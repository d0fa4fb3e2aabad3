//! Online index changes: add and drop an index of a live catalog while writes go on
//! (DynamoDB's online global secondary index creation, with the catalog's invariants).
//!
//! **The schema.** The index fields a catalog is created with are its identity fields
//! (`crate::schema`): they feed every record's RowKey and stay for its lifetime. An added
//! index is `backfilling` from its change until its backfill job is done, then `active`; a
//! dropped one is `dropping` until its rows are removed, then gone. The stored schema row has
//! a version, raised by each change (`crate::wal::schema_row`).
//!
//! **A change, in order:**
//! 1. The schema row is updated under its ETag: the index is added as `backfilling` (or
//!    marked `dropping`) with version `v + 1`.
//! 2. The clock partition's schema row is raised to `v + 1` (`crate::wal::clock`). From
//!    here on, every WAL append round in any process reads `v + 1` in the same query that
//!    gives it its ids, and refuses to log operations validated under an older schema
//!    ([`crate::Error::SchemaChanged`]: the catalog re-reads the schema and validates them
//!    again). So no process logs anything validated under the old schema after the change.
//! 3. A schema entry (`crate::wal::Op::Schema`) is logged in shard 0. Entries carry the
//!    version they were validated under, and an applier that sees a newer one re-reads the
//!    schema first.
//! 4. Applying the entry: the low-watermark barrier (every write acknowledged before the
//!    change was issued is applied), then the fence (`crate::apply::schema_change`): every
//!    shard's applier, in any process, applies with `v + 1` before the job starts. So no
//!    process applies anything with the old schema once the job runs, and every write applied
//!    from then on maintains the new index (or no longer writes the dropped one).
//! 5. The job ([`crate::jobs::index`]): backfill writes every existing record's row of the
//!    new index, fenced by the record's WAL id like any apply; then the index turns `active`.
//!    Drop removes the index's rows; then the index leaves the schema.
//!
//! **Lookups** on a `backfilling` index get [`crate::Error::IndexNotReady`] (HTTP 409
//! `index_not_ready`) with the job's progress, unless they pass `allow_partial=true`; on a
//! dropping or unknown field, [`crate::Error::Invalid`] naming the active indexes (HTTP 400).
//! Writes by filter (delete, replace) need active indexes. A process re-reads the schema
//! when a write, an entry or a lease says it changed, and before a lookup when its copy is
//! older than [`LOOKUP_SCHEMA_AGE`].
//!
//! **Crash safety.** Each step is idempotent, and a change that stopped half way (the
//! process died after step 1 or 2) is completed by running the same command again: `index
//! add` of an index that is `backfilling` without a job, or `index drop` of a `dropping`
//! one, publishes the change again (steps 2-3). Step 4 runs again until it is applied (the
//! entry stays pending), and starts the job once: its id derives from the entry's WAL id,
//! and an index whose job is recorded already starts none. Named crash points
//! `after_schema_row`, `after_schema_clock` and `before_schema_job` (`crate::faults`).
//!
//! **Limits.** Identity fields cannot be dropped online (they feed every RowKey: that is a
//! `rebuild`). An index cannot be dropped while it is backfilling. Added indexes are
//! plaintext (hashed fields are fixed at creation). Because an added index does not feed the
//! RowKey, an upsert that changes a record's value of it moves the record's row: the apply
//! reads the record's stored version (one read per upserted record, only in catalogs with
//! added indexes) and tombstones the old row.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::jobs::{Job, JobId, Jobs};
use crate::query::Filter;
use crate::record::validate_field_name;
use crate::schema::{AddedIndex, IndexState, Schema};
use crate::wal::clock::Clock;
use crate::wal::{schema_row, Op, ShardId, WalId};

/// A lookup re-reads the schema first when this process's copy is older than this (so a
/// process that only reads learns of a change within about this long).
pub const LOOKUP_SCHEMA_AGE: Duration = Duration::from_secs(5);

/// One index, as `index list` and `GET /api/indexes` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexInfo {
    /// The indexed field.
    pub field: String,
    /// `active`, `backfilling` or `dropping`.
    pub state: IndexState,
    /// True for an identity field (created with the catalog; feeds the RowKey).
    pub identity: bool,
    /// The schema version of the change that put it in this state (0 for identity fields).
    pub version: u64,
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

fn jobs(catalog: &Catalog) -> Jobs {
    let names = catalog.names();
    Jobs::new(catalog.store().clone(), names.wal_table.clone(), names.scan_queue.clone())
}

/// Every index of the catalog (re-reads the schema; one more read per running job).
pub async fn list(catalog: &Catalog) -> Result<Vec<IndexInfo>> {
    catalog.applier().reload_schema().await?;
    let schema = catalog.schema();
    let mut out: Vec<IndexInfo> = schema
        .identity_keys()
        .iter()
        .map(|f| IndexInfo {
            field: f.clone(),
            state: IndexState::Active,
            identity: true,
            version: 0,
            job: None,
            progress: None,
        })
        .collect();
    for a in schema.added() {
        out.push(info_of(catalog, a).await?);
    }
    Ok(out)
}

async fn info_of(catalog: &Catalog, a: &AddedIndex) -> Result<IndexInfo> {
    let progress = match (&a.job, a.state) {
        (Some(id), IndexState::Backfilling | IndexState::Dropping) => match jobs(catalog).get(&JobId::parse(id)?).await
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
        job: a.job.clone(),
        progress,
    })
}

/// Adds index `field` online (see the module docs); returns once the change is logged (the
/// backfill runs on the scan queue). Errors: a bad field name ([`Error::Invalid`]), a field
/// that is already an index ([`Error::Conflict`], naming its state).
pub async fn add(catalog: &Catalog, field: &str) -> Result<IndexChange> {
    validate_field_name(field).map_err(|e| Error::invalid(format!("field: {e}")))?;
    let wanted = field.to_string();
    let row = schema_row::update(catalog.store().as_ref(), &catalog.names().wal_table, |identity, added, version| {
        let lower = wanted.to_lowercase();
        if identity.iter().any(|k| k.to_lowercase() == lower) {
            return Err(Error::Conflict(format!("field: '{wanted}' is already an index (an identity field, active)")));
        }
        if let Some(a) = added.iter().find(|a| a.field.to_lowercase() == lower) {
            // A change that stopped before its job started (the process died between the
            // steps): publish it again (each step is idempotent).
            if a.field == wanted && a.state == IndexState::Backfilling && a.job.is_none() {
                return Ok(false);
            }
            return Err(Error::Conflict(format!(
                "field: '{}' is already an index ({}{}); drop it first to add it again",
                a.field,
                a.state.name(),
                a.job.as_ref().map(|j| format!(", job {j}")).unwrap_or_default()
            )));
        }
        *version += 1;
        added.push(AddedIndex { field: wanted.clone(), state: IndexState::Backfilling, version: *version, job: None });
        Ok(true)
    })
    .await?;
    publish(catalog, &row, field).await
}

/// Drops index `field` online (see the module docs): it stops being maintained once every
/// applier uses the new schema, and a job removes its rows. Errors: an identity field or a
/// backfilling index ([`Error::Conflict`], saying what to do instead), a field that is not an
/// index ([`Error::NotFound`], naming the indexes).
pub async fn drop(catalog: &Catalog, field: &str) -> Result<IndexChange> {
    validate_field_name(field).map_err(|e| Error::invalid(format!("field: {e}")))?;
    let wanted = field.to_string();
    let row = schema_row::update(catalog.store().as_ref(), &catalog.names().wal_table, |identity, added, version| {
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
    publish(catalog, &row, field).await
}

/// Steps 2-3 of a change whose schema row is `row`: raise the clock's schema version, adopt
/// the schema here, log the schema entry and hint its shard.
async fn publish(catalog: &Catalog, row: &crate::store::Entity, field: &str) -> Result<IndexChange> {
    let stored = schema_row::StoredSchema::of(row);
    let index = stored
        .added
        .iter()
        .find(|a| a.field == field)
        .cloned()
        .ok_or_else(|| Error::NotFound(format!("field: '{field}' is not an index")))?;
    let (store, wal_table) = (catalog.store(), &catalog.names().wal_table);
    crate::faults::point("after_schema_row")?;
    Clock::raise_schema_version(store.as_ref(), wal_table, stored.version).await?;
    crate::faults::point("after_schema_clock")?;
    catalog.applier().adopt(row)?;
    let op = Op::Schema { version: index.version };
    let mut tries = 0;
    let id: WalId = loop {
        let version = catalog.schema().version();
        match catalog.wal().append_under(vec![(ShardId::ZERO, op.clone())], version).await {
            Ok(mut ids) => break ids.remove(0),
            Err(Error::SchemaChanged(v)) if tries < 4 => {
                tries += 1;
                catalog.applier().ensure_schema(v).await?;
            }
            Err(e) => return Err(e),
        }
    };
    catalog.hint(ShardId::ZERO, &id);
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
            job: Some(job),
            progress: None,
        },
    })
}

/// The schema to run lookup `filter` under, after checking the filter against it: re-read
/// when this process's copy is older than [`LOOKUP_SCHEMA_AGE`], or once more when the
/// filter fails against it (the index may have just turned active). A backfilling index's
/// error carries its job's progress.
pub async fn lookup_schema(catalog: &Catalog, filter: &Filter) -> Result<Arc<Schema>> {
    let applier = catalog.applier();
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
            let field =
                filter.fields.iter().map(|(f, _)| f).find(|f| schema.index_state(f) == Some(IndexState::Backfilling));
            let added = field.and_then(|f| schema.added().iter().find(|a| a.field == *f));
            let progress = match added {
                Some(a) => progress_text(catalog, a).await,
                None => String::new(),
            };
            Err(Error::IndexNotReady(format!("{message}{progress}")))
        }
        Err(e) => Err(e),
    }
}

/// ` (backfill job J: N of M work items done, R rows scanned)`, or why it has not started.
async fn progress_text(catalog: &Catalog, a: &AddedIndex) -> String {
    let Some(id) = &a.job else {
        return " (its backfill starts once every applier uses schema version ".to_string()
            + &a.version.to_string()
            + ")";
    };
    match JobId::parse(id) {
        Ok(job_id) => match jobs(catalog).get(&job_id).await {
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
