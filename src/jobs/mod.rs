//! Jobs: whole-table operations (verify, repair, ...) split into small work items that travel
//! on a queue, so that many workers (Functions instances, `serve --scan-workers`, the CLI's
//! `--parallel`) run one job together, and a crash loses nothing.
//!
//! Each kind has its own serde types for its parameters, work items and counters (the
//! crate-internal `typed::JobKindSpec`); this module and `rows` carry them in their stored
//! JSON form, converted to and from the types in one place (`typed`), byte for byte as older
//! builds stored them.
//!
//! A job is a durable record in the WAL table (`rows`). Its work items are queue messages
//! on the scan queue (`{queue}-scan`): `{"v":1,"job":ID,"step":{...}}`, Base64 like every
//! message of the app, dispatched by `crate::dispatch` with the `host.json` policy.
//!
//! The protocol, per work item (at-least-once delivery, any number of workers):
//! 1. Drop it if the job is final (done, failed, cancelled) or the item is no longer
//!    outstanding (its `jobtodo` row is gone: a redelivery of a finished item).
//! 2. Unless an earlier delivery recorded the item's plan: run it ([`JobRunner::run`],
//!    idempotent), store its findings (keyed by their text), and record its plan (the items
//!    it discovered and its counters) in its `jobtodo` row under the row's ETag; when
//!    another delivery recorded one first, that plan is the one in force.
//! 3. Record each item of the plan as outstanding, then enqueue it. A crash anywhere after
//!    the plan was recorded redelivers this item, which enqueues the same items again: a
//!    rerun never discovers other items, even where the table changed since (a repair
//!    writes to the table it scans), so no outstanding item is left without a message.
//! 4. Store the plan's counters (keyed by the item), then remove the item from the
//!    outstanding ones.
//! 5. If nothing is outstanding any more, total the counters and mark the job `done`. The
//!    last item to finish always sees an empty `jobtodo` partition (every item records its
//!    children before it removes itself), so a job cannot stall with all items finished.
//!
//! A work item that fails `maxDequeueCount` times fails the job with the reason; an item
//! whose own content is at fault fails it at once. `resume` re-enqueues the outstanding items
//! of a running job (for an enqueue lost to a crash of the process that started it).
//!
//! The framework (job records, work items, the kinds' interface, the index jobs' parameters)
//! is the crate-internal `job_core`, re-exported here: it needs no catalog, so the catalog's
//! schema manager starts and reads jobs through it. The kinds that run against a catalog are
//! here (`kinds`, `index`, `rebuild`, `trim`), above the catalog.

pub(crate) mod handler;
pub(crate) mod index;
pub(crate) mod kinds;
pub(crate) mod rebuild;
pub(crate) mod trim;

pub use crate::job_core::model::{Job, JobId, JobKind, JobState};
pub use crate::job_core::runner::{JobRunner, StepResult};
pub use crate::job_core::{JobPage, Jobs, WorkItem, VERSION};
pub use handler::JobHandler;

#[cfg(test)]
mod typed_tests;
