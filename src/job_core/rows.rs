//! Where jobs live: partitions of the catalog's WAL table.
//!
//! | PartitionKey | RowKey | properties |
//! |---|---|---|
//! | `jobs` | job id (newest first) | `job`: the [`Job`] as JSON |
//! | `jobtodo-{id}` | work item key | `step`: the outstanding work item (JSON); `plan`: its [`Plan`] once it ran |
//! | `jobdone-{id}` | work item key | `counters`: what that item counted (JSON) |
//! | `jobfind-{id}` | finding key | `finding`: one finding (JSON), e.g. a disagreeing record |
//!
//! A work item's key is the MD5 of its JSON, so the same item always maps to the same rows:
//! a redelivered or rerun item overwrites its own `done` row and findings instead of adding
//! to them, and the totals are exact under at-least-once delivery.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use md5::{Digest, Md5};
use serde_json::Value as Json;

use super::model::{Job, JobId};
use crate::error::{Error, Result};
use crate::store::{
    pager, BatchOp, ETag, Entity, IfMatch, RowRange, Store, StoreError, StoreResult, Value, MAX_BATCH_OPS, MAX_PAGE,
};

/// Partition of the job records.
pub const JOBS: &str = "jobs";

/// Longest `last_error` kept, in characters.
const MAX_ERROR_CHARS: usize = 2_000;

/// The key of a work item or a finding: 32 hex digits of MD5 over its text.
pub fn key_of(text: &str) -> String {
    Md5::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// What a work item's run decided, recorded in its `jobtodo` row before any of it takes
/// effect: every later delivery of the item enqueues these children and counts these
/// counters, so a rerun that would see another table (a repair writes to the table it scans)
/// cannot leave a child outstanding that no message carries.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// The work items it discovered (at most 3 for the scan-based kinds, 4.6 KiB each), as the
    /// stored JSON of the kind's step type.
    pub next: Vec<Json>,
    /// What it counted.
    pub counters: BTreeMap<String, u64>,
}

/// An outstanding work item's row: its ETag and its plan once one was recorded.
#[derive(Debug, Clone)]
pub struct Todo {
    /// The row's ETag (for [`JobRows::record_plan`]).
    pub etag: ETag,
    /// The recorded plan, if the item ran before.
    pub plan: Option<Plan>,
}

/// Job rows of one WAL table.
#[derive(Clone)]
pub struct JobRows {
    store: Arc<dyn Store>,
    table: String,
}

fn todo(id: &JobId) -> String {
    format!("jobtodo-{id}")
}

fn done(id: &JobId) -> String {
    format!("jobdone-{id}")
}

fn found(id: &JobId) -> String {
    format!("jobfind-{id}")
}

fn json_property(e: &Entity, name: &str) -> Result<Json> {
    let text = e.str(name).ok_or_else(|| {
        Error::Store(StoreError::Other(format!("job row {}/{}: no '{name}'", e.partition_key, e.row_key)))
    })?;
    serde_json::from_str(text).map_err(|err| {
        Error::Store(StoreError::Other(format!(
            "job row {}/{}: '{name}' is not JSON: {err}",
            e.partition_key, e.row_key
        )))
    })
}

impl JobRows {
    /// Rows in `table` (the catalog's WAL table).
    pub fn new(store: Arc<dyn Store>, table: String) -> JobRows {
        JobRows { store, table }
    }

    fn job_entity(job: &Job) -> Result<Entity> {
        let mut job = job.clone();
        if let Some(e) = &mut job.last_error {
            if e.chars().count() > MAX_ERROR_CHARS {
                *e = e.chars().take(MAX_ERROR_CHARS).collect::<String>() + "...";
            }
        }
        let text = serde_json::to_string(&job).map_err(|e| Error::invalid(format!("job: {e}")))?;
        Ok(Entity::new(JOBS, job.id.as_str()).with("job", Value::String(text)))
    }

    fn job_of(e: &Entity) -> Result<Job> {
        serde_json::from_value(json_property(e, "job")?)
            .map_err(|err| Error::Store(StoreError::Other(format!("job {}: unreadable record: {err}", e.row_key))))
    }

    /// Stores a new job.
    pub async fn insert_job(&self, job: &Job) -> Result<()> {
        self.store.insert(&self.table, &Self::job_entity(job)?).await?;
        Ok(())
    }

    /// The job and its ETag; `None` when there is no such job.
    pub async fn read_job(&self, id: &JobId) -> Result<Option<(Job, ETag)>> {
        let Some(e) = self.store.get(&self.table, JOBS, id.as_str()).await? else { return Ok(None) };
        let tag = e.etag.clone().ok_or_else(|| Error::Store(StoreError::Other("job read without an ETag".into())))?;
        Ok(Some((Self::job_of(&e)?, tag)))
    }

    /// Replaces the job if it still carries `tag` ([`StoreError::PreconditionFailed`] if not).
    pub async fn replace_job(&self, job: &Job, tag: ETag) -> Result<()> {
        self.store.replace(&self.table, &Self::job_entity(job)?, &IfMatch::Etag(tag)).await?;
        Ok(())
    }

    /// One page of jobs, newest first.
    pub async fn list(&self, limit: usize, continuation: Option<&str>) -> Result<(Vec<Job>, Option<String>)> {
        let page = self.store.query_partition(&self.table, JOBS, &RowRange::default(), limit, continuation).await?;
        let jobs = page.entities.iter().map(Self::job_of).collect::<Result<Vec<_>>>()?;
        Ok((jobs, page.continuation))
    }

    /// Records an outstanding work item (idempotent).
    pub async fn add_todo(&self, id: &JobId, step: &str) -> Result<()> {
        let e = Entity::new(todo(id), key_of(step)).with("step", Value::String(step.to_string()));
        match self.store.insert(&self.table, &e).await {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The work item's outstanding row; `None` once it is finished.
    pub async fn todo(&self, id: &JobId, step: &str) -> Result<Option<Todo>> {
        let Some(e) = self.store.get(&self.table, &todo(id), &key_of(step)).await? else { return Ok(None) };
        let etag =
            e.etag.clone().ok_or_else(|| Error::Store(StoreError::Other("job row read without an ETag".into())))?;
        let plan = match e.str("plan") {
            None => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|err| {
                Error::Store(StoreError::Other(format!("job {id}: unreadable plan of a work item: {err}")))
            })?),
        };
        Ok(Some(Todo { etag, plan }))
    }

    /// Records `plan` in the item's outstanding row if the row still carries `etag`, and
    /// returns the plan in force: `plan`, or the one another delivery recorded first. `None`
    /// when the item is finished (nothing to do).
    pub async fn record_plan(&self, id: &JobId, step: &str, etag: ETag, plan: Plan) -> Result<Option<Plan>> {
        let text = serde_json::to_string(&plan).map_err(|e| Error::invalid(format!("plan: {e}")))?;
        let e = Entity::new(todo(id), key_of(step))
            .with("step", Value::String(step.to_string()))
            .with("plan", Value::String(text));
        match self.store.replace(&self.table, &e, &IfMatch::Etag(etag)).await {
            Ok(_) => Ok(Some(plan)),
            Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => {
                // Another delivery recorded its plan (or finished the item) first.
                Ok(self.todo(id, step).await?.and_then(|t| t.plan))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Records what a work item counted, then removes it from the outstanding ones (in that
    /// order: an item is never gone from both).
    pub async fn finish_todo(&self, id: &JobId, step: &str, counters: &BTreeMap<String, u64>) -> Result<()> {
        let key = key_of(step);
        let text = serde_json::to_string(counters).map_err(|e| Error::invalid(format!("counters: {e}")))?;
        self.store
            .upsert(&self.table, &Entity::new(done(id), key.clone()).with("counters", Value::String(text)))
            .await?;
        match self.store.delete(&self.table, &todo(id), &key, &IfMatch::Any).await {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The outstanding work items (their JSON), in key order.
    pub fn todo_steps(&self, id: &JobId) -> BoxStream<'static, Result<String>> {
        self.rows(todo(id)).map(|e| Ok(e?.str("step").unwrap_or_default().to_string())).boxed()
    }

    fn rows(&self, partition: String) -> BoxStream<'static, StoreResult<Entity>> {
        pager::owned_entities(self.store.clone(), self.table.clone(), partition, RowRange::default(), MAX_PAGE)
    }

    /// True while any work item is outstanding: one request of one entity, whatever the
    /// number outstanding (a page may be empty and still carry a token; the pager follows).
    pub async fn any_todo(&self, id: &JobId) -> Result<bool> {
        let range = RowRange::default();
        let partition = todo(id);
        let mut first = pager::entities(self.store.as_ref(), &self.table, &partition, &range, 1);
        Ok(first.next().await.transpose()?.is_some())
    }

    /// Number of outstanding work items (keys only on Azure).
    pub async fn todo_count(&self, id: &JobId) -> Result<u64> {
        Ok(self.store.count_range(&self.table, &todo(id), &RowRange::default(), u64::MAX).await?.0)
    }

    /// Work items completed and the sum of their counters.
    pub async fn done_totals(&self, id: &JobId) -> Result<(u64, BTreeMap<String, u64>)> {
        let mut rows = self.rows(done(id));
        let (mut steps, mut totals) = (0u64, BTreeMap::<String, u64>::new());
        while let Some(e) = rows.next().await {
            let counters: BTreeMap<String, u64> = serde_json::from_value(json_property(&e?, "counters")?)
                .map_err(|err| Error::Store(StoreError::Other(format!("job {id}: unreadable counters: {err}"))))?;
            steps += 1;
            for (k, v) in counters {
                *totals.entry(k).or_default() += v;
            }
        }
        Ok((steps, totals))
    }

    /// Stores findings, each under the key of its text (a rerun overwrites its own findings).
    pub async fn put_findings(&self, id: &JobId, findings: &[Json]) -> Result<()> {
        let partition = found(id);
        let mut ops: BTreeMap<String, BatchOp> = BTreeMap::new();
        for f in findings {
            let text = f.to_string();
            let key = key_of(&text);
            ops.insert(
                key.clone(),
                BatchOp::Upsert(Entity::new(partition.clone(), key).with("finding", Value::String(text))),
            );
        }
        let ops: Vec<BatchOp> = ops.into_values().collect();
        for chunk in ops.chunks(MAX_BATCH_OPS) {
            self.store.batch(&self.table, &partition, chunk).await?;
        }
        Ok(())
    }

    /// Every finding of the job, in key order.
    pub fn findings(&self, id: &JobId) -> BoxStream<'static, Result<Json>> {
        self.rows(found(id)).map(|e| json_property(&e?, "finding")).boxed()
    }
}
