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
//! 5. The job (`crate::jobs::index`): backfill writes every existing record's row of the
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
//!
//! **Composite indexes** (`crate::composite`): an index over 2 to
//! [`MAX_COMPOSITE_FIELDS`] fields, named by them joined with [`COMPOSITE_SEPARATOR`]
//! (`country+subd`), is added and dropped by the same steps, under that name. A record has a
//! row in it when every one of its fields has a value; a lookup naming exactly its fields
//! reads it (`crate::index_choice`; [`crate::query::ResultPage::index`] says which index a
//! lookup read). A composite index cannot be an identity field.
//!
//! The work is the schema manager's (`crate::schema_manager`, held by the catalog); these
//! functions are its public face.

use std::sync::Arc;

pub use crate::composite::{COMPOSITE_SEPARATOR, MAX_COMPOSITE_FIELDS};
pub use crate::projection::{Projection, MAX_INCLUDED_FIELDS};
pub use crate::schema_manager::{IndexChange, IndexInfo, LOOKUP_SCHEMA_AGE};

use crate::catalog::Catalog;
use crate::error::Result;
use crate::query::Filter;
use crate::schema::Schema;

/// Every index of the catalog (re-reads the schema; one more read per running job).
pub async fn list(catalog: &Catalog) -> Result<Vec<IndexInfo>> {
    if catalog.mode() != crate::catalog::Mode::Wal {
        // Single-partition mode: the identity fields, fixed (no index changes).
        return Ok(catalog
            .schema()
            .identity_keys()
            .iter()
            .map(|f| IndexInfo {
                field: f.clone(),
                state: crate::schema::IndexState::Active,
                identity: true,
                version: 0,
                projection: crate::projection::Projection::All,
                job: None,
                progress: None,
            })
            .collect());
    }
    catalog.schemas().list().await
}

/// Adds index `field` online (see the module docs): a field, or a composite index's fields
/// joined by `+` (`country+subd`); returns once the change is logged (the backfill runs on
/// the scan queue). Errors: single-partition mode ([`crate::Error::NotSupported`]); a bad name ([`crate::Error::Invalid`], naming the field and the
/// limit: not a valid field name, a composite name with an empty field, a field twice, more
/// than [`MAX_COMPOSITE_FIELDS`] fields, more than 255 characters); an index that exists
/// already, or a composite index with the same fields in another order
/// ([`crate::Error::Conflict`], naming its state). Nothing is written on error.
pub async fn add(catalog: &Catalog, field: &str) -> Result<IndexChange> {
    add_projected(catalog, field, Projection::All).await
}

/// [`add`] with projection `projection` ([`Projection`]: `all`, `keys`, `include:a,b`):
/// what the index's rows hold. Errors as [`add`], and: a projection other than `all` on an
/// identity field ([`crate::Error::Invalid`]: identity fields always hold the whole record);
/// an index being added with another projection ([`crate::Error::Conflict`]). Nothing is
/// written on error.
///
/// A lookup through a `keys` or `include` index reads the index page, then each record's
/// fact row, and returns whole records. A delete or replace whose filter reads a projected
/// index may name only that index's fields and identity fields (others:
/// [`crate::Error::Invalid`]). docs/ARCHITECTURE.md, "Projections".
pub async fn add_projected(catalog: &Catalog, field: &str, projection: Projection) -> Result<IndexChange> {
    catalog.wal_mode_only("adding an index online")?;
    catalog.schemas().add(field, projection).await
}

/// Drops index `field` online (see the module docs): it stops being maintained once every
/// applier uses the new schema, and a job removes its rows. Errors: single-partition mode
/// ([`crate::Error::NotSupported`]), an identity field or a
/// backfilling index ([`crate::Error::Conflict`], saying what to do instead), a field that is
/// not an index ([`crate::Error::NotFound`], naming the indexes).
pub async fn drop(catalog: &Catalog, field: &str) -> Result<IndexChange> {
    catalog.wal_mode_only("dropping an index online")?;
    catalog.schemas().drop(field).await
}

/// The schema to run lookup `filter` under, after checking the filter against it: re-read
/// when this process's copy is older than [`LOOKUP_SCHEMA_AGE`], or once more when the
/// filter fails against it (the index may have just turned active). A backfilling index's
/// error carries its job's progress.
pub async fn lookup_schema(catalog: &Catalog, filter: &Filter) -> Result<Arc<Schema>> {
    catalog.schemas().lookup_schema(filter).await
}
