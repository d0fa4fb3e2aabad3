//! What a job kind does with one work item, in the stored JSON form: the interface [`super::Jobs`]
//! calls. The kinds of this crate are written against their own types (the crate-internal
//! `typed::JobKindSpec`), which become a [`JobRunner`] through one adapter.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::Value as Json;

use super::model::Job;
use crate::error::Result;

/// The outcome of one work item.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepResult {
    /// What the item counted (`rows`, findings by kind, ...); summed over the job.
    pub counters: BTreeMap<String, u64>,
    /// Findings to report (e.g. one disagreeing record each), stored under the key of their
    /// text, so a rerun of the item reports each once.
    pub findings: Vec<Json>,
    /// Work items this one discovered (e.g. child key ranges of a scan).
    pub next: Vec<Json>,
}

/// One job kind.
///
/// Work items are delivered at least once, possibly concurrently with a rerun of themselves,
/// so [`JobRunner::run`] must be idempotent: whatever it writes elsewhere must be harmless to
/// write twice. Its counters replace those of an earlier run of the same item.
#[async_trait]
pub trait JobRunner: Send + Sync {
    /// Checks the job's parameters ([`crate::Error::Invalid`] naming the parameter) and
    /// returns its first work items.
    fn roots(&self, params: &Json) -> Result<Vec<Json>>;

    /// Runs one work item. An error that is not an input fault is retried (the queue
    /// redelivers the item); an input fault ([`crate::Error::is_input_fault`]) fails the job.
    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult>;

    /// Runs once every work item is done, before the job is marked `done` (so a crash here
    /// runs it again with the next delivery): e.g. a backfill turns its index active. Must be
    /// idempotent. An error keeps the job running; the last item is redelivered.
    async fn finished(&self, _job: &Job) -> Result<()> {
        Ok(())
    }
}
