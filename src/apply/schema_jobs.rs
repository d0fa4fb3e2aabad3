//! How the apply engine starts the job of a schema change ([`SchemaJobs`]), the one thing
//! it needs of the jobs (applying the change is in `super::schema_change`).

use futures::future::BoxFuture;

use crate::error::Result;
use crate::wal::WalId;

/// How the apply engine starts the job of a schema change (the narrow interface to the jobs,
/// wired in by the catalog: [`crate::apply::Applier::with_jobs`]).
pub trait SchemaJobs: Send + Sync {
    /// The id of the job of the change logged as `wal_id`.
    fn job_id(&self, wal_id: &WalId) -> String;
    /// Starts job `id` (idempotent): the backfill of added index `field` (`dropping` false)
    /// or the removal of dropped index `field`'s rows (`dropping` true), for the change to
    /// schema `version`.
    fn start<'a>(&'a self, id: &'a str, field: &'a str, dropping: bool, version: u64) -> BoxFuture<'a, Result<()>>;
}
