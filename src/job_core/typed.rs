//! Typed job kinds: each kind declares serde types for its parameters, its work item (step),
//! its counters and its findings ([`JobKindSpec`]), and this module is the ONE place that
//! converts them from and to the stored JSON (job records, `jobtodo`/`jobdone`/`jobfind` rows,
//! queue messages): every [`JobKindSpec`] is a [`JobRunner`] through the blanket impl below.
//!
//! Stored form: a typed value is written as `serde_json::to_value(..)` (a `serde_json::Value`
//! sorts object keys), exactly the text older builds wrote, so a work item's key (the MD5 of
//! its text, [`super::rows::key_of`]) is the same in every build. Job parameters are stored as
//! given (checked here, not rewritten).
//!
//! Errors: parameters that do not fit give [`Error::Invalid`] naming the parameter
//! (`params.{name}: ...`; `params.{name}: unknown parameter (known: ...)` for a name the kind
//! does not take; `params.{name}: required` for a missing one); a work item that does not fit
//! gives [`Error::Invalid`] `work item: not {STEP}: {path}: ...`, an input fault that fails
//! the job.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;

use super::model::Job;
use super::runner::{JobRunner, StepResult};
use crate::error::{Error, Result};

/// What one work item of a typed kind produced.
pub(crate) struct Outcome<K: JobKindSpec + ?Sized> {
    /// Work items it discovered.
    pub next: Vec<K::Step>,
    /// What it counted; stored as a map of whole numbers (fields left out when skipped).
    pub counters: K::Counters,
    /// Findings to report, each stored under the key of its JSON text.
    pub findings: Vec<K::Finding>,
}

/// A finding type for kinds that report none (no value exists).
#[derive(Debug, Serialize)]
pub(crate) enum NoFinding {}

/// One job kind in its own types. See [`JobRunner`] for the delivery contract (at least once,
/// possibly concurrently: [`JobKindSpec::run`] must be idempotent).
#[async_trait]
pub(crate) trait JobKindSpec: Send + Sync {
    /// The parameters (a JSON object of the names in [`JobKindSpec::PARAMS`]).
    type Params: Serialize + DeserializeOwned + Send + Sync;
    /// One work item.
    type Step: Serialize + DeserializeOwned + Send + Sync;
    /// What one work item counts: serialises to a JSON object of whole numbers.
    type Counters: Serialize + Send;
    /// One finding.
    type Finding: Serialize + Send;

    /// The parameter names the kind takes (for the unknown-parameter error).
    const PARAMS: &'static [&'static str];
    /// What a work item is, for errors (`"a scan step"`).
    const STEP: &'static str;

    /// Checks parameters beyond their shape and returns the first work items
    /// ([`Error::Invalid`] naming the parameter).
    fn roots(&self, p: &Self::Params) -> Result<Vec<Self::Step>>;

    /// Runs one work item.
    async fn run(&self, job: &Job, p: &Self::Params, step: Self::Step) -> Result<Outcome<Self>>;

    /// Runs once every work item is done (see [`JobRunner::finished`]).
    async fn finished(&self, _job: &Job, _p: &Self::Params) -> Result<()> {
        Ok(())
    }
}

/// `serde_path_to_error`'s path as this module names it: `""` at the top, else `.a.b`.
fn path_suffix(path: &serde_path_to_error::Path) -> String {
    let p = path.to_string();
    if p == "." {
        String::new()
    } else {
        format!(".{p}")
    }
}

/// Reads parameters of shape `P` from their stored or given JSON: [`Error::Invalid`] naming
/// the parameter (`params.{name}: ...`) when they do not fit.
pub(crate) fn params_of<P: DeserializeOwned>(known: &[&str], params: &Json) -> Result<P> {
    let Some(object) = params.as_object() else {
        return Err(Error::invalid("params: must be a JSON object"));
    };
    if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(Error::invalid(format!("params.{unknown}: unknown parameter (known: {})", known.join(", "))));
    }
    serde_path_to_error::deserialize(params).map_err(|e| {
        let at = path_suffix(e.path());
        let inner = e.inner().to_string();
        // serde names a missing field only in its message ("missing field `into`").
        match inner.strip_prefix("missing field `").and_then(|r| r.strip_suffix('`')) {
            Some(name) => Error::invalid(format!("params{at}.{name}: required")),
            None => Error::invalid(format!("params{at}: {inner}")),
        }
    })
}

/// Reads a work item of shape `S` ([`Error::Invalid`] `work item: not {what}: ...` otherwise).
pub(crate) fn step_of<S: DeserializeOwned>(what: &str, step: &Json) -> Result<S> {
    serde_path_to_error::deserialize(step).map_err(|e| {
        let at = e.path().to_string();
        let at = if at == "." { String::new() } else { format!("{at}: ") };
        Error::invalid(format!("work item: not {what}: {at}{}", e.inner()))
    })
}

/// The stored JSON of a typed value (object keys sorted, as every build wrote them).
pub(crate) fn stored<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<Json> {
    serde_json::to_value(value).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

/// Counters as stored: the JSON object `counters` serialises to, as whole numbers.
pub(crate) fn counters_of<C: Serialize>(counters: &C) -> Result<BTreeMap<String, u64>> {
    serde_json::from_value(stored("counters", counters)?)
        .map_err(|e| Error::invalid(format!("counters: not a map of whole numbers: {e}")))
}

/// Every typed kind runs as a [`JobRunner`]: the one conversion between stored JSON and types.
#[async_trait]
impl<K: JobKindSpec> JobRunner for K {
    fn roots(&self, params: &Json) -> Result<Vec<Json>> {
        let p: K::Params = params_of(K::PARAMS, params)?;
        JobKindSpec::roots(self, &p)?.iter().map(|s| stored("work item", s)).collect()
    }

    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult> {
        let p: K::Params = params_of(K::PARAMS, &job.params)?;
        let step: K::Step = step_of(K::STEP, step)?;
        let out = JobKindSpec::run(self, job, &p, step).await?;
        Ok(StepResult {
            counters: counters_of(&out.counters)?,
            findings: out.findings.iter().map(|f| stored("finding", f)).collect::<Result<_>>()?,
            next: out.next.iter().map(|s| stored("work item", s)).collect::<Result<_>>()?,
        })
    }

    async fn finished(&self, job: &Job) -> Result<()> {
        let p: K::Params = params_of(K::PARAMS, &job.params)?;
        JobKindSpec::finished(self, job, &p).await
    }
}

/// Test helpers: the stored JSON `text` read as `T` and written back (must equal `text`).
#[cfg(test)]
pub(crate) fn round_trip<T: Serialize + DeserializeOwned>(text: &str) -> String {
    let json: Json = serde_json::from_str(text).expect("test JSON");
    let typed: T = serde_path_to_error::deserialize(&json).expect("fits the type");
    stored("test", &typed).expect("serialises").to_string()
}
