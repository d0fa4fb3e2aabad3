//! The jobs framework under `crate::jobs` (which re-exports it): the job records and their
//! work items ([`Jobs`], [`rows`]), the kinds' interface ([`runner`], `typed`), and the
//! parameters shared by kinds. It needs no catalog, so the catalog and its schema manager can
//! start and read jobs; the kinds that run against a catalog are in `crate::jobs`. The
//! protocol is in `crate::jobs`' docs.

pub(crate) mod index_params;
pub mod model;
pub mod rows;
pub mod runner;
pub(crate) mod segment;
pub(crate) mod typed;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub use model::{Job, JobId, JobKind, JobState};
pub use runner::JobRunner;

use crate::error::{Error, Result};
use crate::messages;
use crate::store::{Store, StoreError};
use rows::JobRows;

/// Format version of work-item messages.
pub const VERSION: u32 = 1;

/// A work item as it travels on the scan queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkItem {
    /// Format version (1).
    pub v: u32,
    /// The job.
    pub job: JobId,
    /// What to do, in the job kind's terms: the stored JSON of its step type (read by the
    /// kind's runner, e.g. a scan step `{"step":"prefix","prefix":""}`).
    pub step: Json,
}

/// A page of jobs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobPage {
    /// The jobs.
    pub jobs: Vec<Job>,
    /// Token for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuation: Option<String>,
}

/// The jobs of one catalog: start, inspect, cancel, and run their work items.
pub struct Jobs {
    rows: JobRows,
    store: Arc<dyn Store>,
    queue: String,
    runners: BTreeMap<JobKind, Arc<dyn JobRunner>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").field("queue", &self.queue).field("kinds", &self.runners.keys()).finish()
    }
}

impl Jobs {
    /// Jobs kept in `wal_table`, with work items on `queue`, and no kinds yet.
    pub fn new(store: Arc<dyn Store>, wal_table: String, queue: String) -> Jobs {
        Jobs { rows: JobRows::new(store.clone(), wal_table), store, queue, runners: BTreeMap::new() }
    }

    /// Adds the runner of a kind (builder style).
    pub fn with_runner(mut self, kind: JobKind, runner: Arc<dyn JobRunner>) -> Jobs {
        self.runners.insert(kind, runner);
        self
    }

    /// The queue of the work items.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    fn runner(&self, kind: JobKind) -> Result<&Arc<dyn JobRunner>> {
        self.runners
            .get(&kind)
            .ok_or_else(|| Error::invalid(format!("kind: '{}' jobs are not available here", kind.name())))
    }

    /// Creates a job and enqueues its first work items. [`Error::Invalid`] for bad parameters
    /// (nothing is written then).
    pub async fn start(&self, kind: JobKind, params: Json) -> Result<Job> {
        if !params.is_object() {
            return Err(Error::invalid("params: must be a JSON object"));
        }
        let roots = self.runner(kind)?.roots(&params)?;
        self.start_as(JobId::new(), kind, params, roots).await
    }

    /// Creates job `id` with work items `roots` (no runner needed: the caller checked the
    /// parameters), unless a job with that id exists already: then returns it as it is (so a
    /// re-applied schema change starts its job once).
    pub async fn start_as(&self, id: JobId, kind: JobKind, params: Json, roots: Vec<Json>) -> Result<Job> {
        if let Some((job, _)) = self.rows.read_job(&id).await? {
            if job.state != JobState::Queued {
                return Ok(job);
            }
        }
        let mut job = Job {
            id,
            kind,
            params,
            state: JobState::Queued,
            counters: BTreeMap::new(),
            steps_done: 0,
            steps_pending: roots.len() as u64,
            created: model::now_rfc3339(),
            started: None,
            finished: None,
            last_error: None,
        };
        match self.rows.insert_job(&job).await {
            // Created by an earlier attempt that stopped before its roots were all enqueued:
            // enqueue them (again; duplicates are harmless).
            Ok(()) | Err(Error::Store(StoreError::AlreadyExists(_))) => {}
            Err(e) => return Err(e),
        }
        for step in &roots {
            self.enqueue(&job.id, step).await?;
        }
        job = self.transition(&job.id, |j| (j.state == JobState::Queued).then_some(JobState::Running), None).await?;
        tracing::info!(job = %job.id, kind = kind.name(), "job started");
        Ok(job)
    }

    async fn enqueue(&self, id: &JobId, step: &Json) -> Result<()> {
        let text = step.to_string();
        self.rows.add_todo(id, &text).await?;
        let item = WorkItem { v: VERSION, job: id.clone(), step: step.clone() };
        let body = serde_json::to_string(&item).map_err(|e| Error::invalid(format!("work item: {e}")))?;
        self.store.put_message(&self.queue, &messages::encode(&body), Duration::ZERO).await?;
        Ok(())
    }

    /// The job, with live totals while it runs. [`Error::NotFound`] when there is none.
    pub async fn get(&self, id: &JobId) -> Result<Job> {
        let (mut job, _) = self.read(id).await?;
        if !job.state.is_final() {
            let (done, counters) = self.rows.done_totals(id).await?;
            job.steps_done = done;
            job.counters = counters;
            job.steps_pending = self.rows.todo_count(id).await?;
        }
        Ok(job)
    }

    async fn read(&self, id: &JobId) -> Result<(Job, crate::store::ETag)> {
        self.rows.read_job(id).await?.ok_or_else(|| Error::NotFound(format!("id: no job '{id}'")))
    }

    /// One page of jobs, newest first (at most `limit`, 1..=1,000; [`Error::Invalid`] naming
    /// `limit` and the range otherwise, as a query's page).
    pub async fn list(&self, limit: usize, continuation: Option<&str>) -> Result<JobPage> {
        let max = crate::store::MAX_PAGE;
        if !(1..=max).contains(&limit) {
            return Err(Error::invalid(format!("limit: {limit} is out of range 1..={max}")));
        }
        let (jobs, continuation) = self.rows.list(limit, continuation).await?;
        Ok(JobPage { jobs, continuation })
    }

    /// Cancels a job: outstanding work items are dropped when delivered. [`Error::Conflict`]
    /// when it is already final.
    pub async fn cancel(&self, id: &JobId) -> Result<Job> {
        let (job, _) = self.read(id).await?;
        if job.state.is_final() {
            return Err(Error::Conflict(format!("job {id} is already {}", job.state.name())));
        }
        self.transition(id, |j| (!j.state.is_final()).then_some(JobState::Cancelled), None).await
    }

    /// Fails a running job with `reason` (no-op when it is already final).
    pub async fn fail(&self, id: &JobId, reason: &str) -> Result<Job> {
        tracing::warn!(job = %id, reason, "job failed");
        self.transition(id, |j| (!j.state.is_final()).then_some(JobState::Failed), Some(reason)).await
    }

    /// Every finding of a job, in key order.
    pub fn findings(&self, id: &JobId) -> BoxStream<'static, Result<Json>> {
        self.rows.findings(id)
    }

    /// Re-enqueues every outstanding work item of a running job (after an enqueue was lost);
    /// returns how many. Duplicates are harmless.
    pub async fn resume(&self, id: &JobId) -> Result<usize> {
        let (job, _) = self.read(id).await?;
        if job.state.is_final() {
            return Ok(0);
        }
        let steps: Vec<String> = self.rows.todo_steps(id).try_collect().await?;
        for text in &steps {
            let step: Json = serde_json::from_str(text)
                .map_err(|e| Error::Store(StoreError::Other(format!("job {id}: unreadable work item: {e}"))))?;
            let item = WorkItem { v: VERSION, job: id.clone(), step };
            let body = serde_json::to_string(&item).map_err(|e| Error::invalid(format!("work item: {e}")))?;
            self.store.put_message(&self.queue, &messages::encode(&body), Duration::ZERO).await?;
        }
        Ok(steps.len())
    }

    /// Runs one work item (the protocol in the module docs). Returns a line for the log.
    pub async fn run_item(&self, item: &WorkItem) -> Result<String> {
        let id = &item.job;
        let Some((job, _)) = self.rows.read_job(id).await? else {
            return Ok(format!("job {id} does not exist; work item dropped"));
        };
        if job.state.is_final() {
            return Ok(format!("job {id} is {}; work item dropped", job.state.name()));
        }
        let text = item.step.to_string();
        let Some(todo) = self.rows.todo(id, &text).await? else {
            self.finish_if_complete(id).await?;
            return Ok(format!("job {id}: work item already done"));
        };
        let plan = match todo.plan {
            Some(plan) => plan,
            None => {
                let result = match self.runner(job.kind)?.run(&job, &item.step).await {
                    Ok(r) => r,
                    Err(e) if e.is_input_fault() => {
                        self.fail(id, &format!("a work item can never succeed: {e}")).await?;
                        return Ok(format!("job {id} failed: {e}"));
                    }
                    Err(e) => return Err(e),
                };
                if !result.findings.is_empty() {
                    self.rows.put_findings(id, &result.findings).await?;
                }
                let plan = rows::Plan { next: result.next, counters: result.counters };
                match self.rows.record_plan(id, &text, todo.etag, plan).await? {
                    Some(plan) => plan,
                    None => {
                        self.finish_if_complete(id).await?;
                        return Ok(format!("job {id}: work item already done"));
                    }
                }
            }
        };
        for step in &plan.next {
            self.enqueue(id, step).await?;
        }
        self.rows.finish_todo(id, &text, &plan.counters).await?;
        self.finish_if_complete(id).await?;
        Ok(format!("job {id}: work item done ({} new)", plan.next.len()))
    }

    /// Marks the job done with its totals when nothing is outstanding.
    async fn finish_if_complete(&self, id: &JobId) -> Result<()> {
        if self.rows.any_todo(id).await? {
            return Ok(());
        }
        let (job, _) = self.read(id).await?;
        if job.state.is_final() {
            return Ok(());
        }
        self.runner(job.kind)?.finished(&job).await?;
        let (steps, counters) = self.rows.done_totals(id).await?;
        loop {
            let (mut job, tag) = self.read(id).await?;
            if job.state.is_final() {
                return Ok(());
            }
            job.state = JobState::Done;
            job.counters = counters.clone();
            job.steps_done = steps;
            job.steps_pending = 0;
            job.finished = Some(model::now_rfc3339());
            match self.rows.replace_job(&job, tag).await {
                Ok(()) => {
                    tracing::info!(job = %id, ?counters, "job done");
                    return Ok(());
                }
                Err(Error::Store(StoreError::PreconditionFailed(_))) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Moves the job to the state `next` gives (if any), under its ETag, retrying on races.
    async fn transition(
        &self,
        id: &JobId,
        next: impl Fn(&Job) -> Option<JobState>,
        error: Option<&str>,
    ) -> Result<Job> {
        loop {
            let (mut job, tag) = self.read(id).await?;
            let Some(state) = next(&job) else { return Ok(job) };
            job.state = state;
            if state == JobState::Running {
                job.started = Some(model::now_rfc3339());
            }
            if let Some(e) = error {
                job.last_error = Some(e.to_string());
            }
            if state.is_final() {
                job.finished = Some(model::now_rfc3339());
            }
            match self.rows.replace_job(&job, tag).await {
                Ok(()) => return Ok(job),
                Err(Error::Store(StoreError::PreconditionFailed(_))) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests;
