//! Rows of an index being dropped that an entry validated before the drop wrote after the
//! drop's job had started.
//!
//! An entry validated before `index drop` still maintains the dropping index
//! ([`crate::schema::Schema::with_dropping_maintained`]), so that filters validated while the index was active
//! resolve through exact rows. Such an entry is usually ordered before the drop's entry and
//! applied before the drop's job starts (the barrier and the fence,
//! [`super::schema_change`]), and the job then removes the rows it wrote. One ordered after
//! the drop (logged late and stamped, or with a WAL id from a clock ahead of the others) can
//! be applied by a process whose copy of the schema does not show the job yet, after the
//! job's scan passed the row's partition: without this module the row stays behind the
//! job, in an index that no longer exists (found by the checker on CI, seed 20261121).
//!
//! The rule is write, then check (as in Dekker's mutual exclusion):
//! 1. every row written in a partition of an index the applier's schema does not maintain
//!    (dropping, or gone altogether) is noted, before its write and again once it returned
//!    ([`Applier::note_dropping_row`]). Judged by the schema in force at each note, not the
//!    one the entry started with: a reload between the two (a concurrent group's check)
//!    can show the index gone, and a row noted only while "dropping" was then written
//!    unnoted (found by `indexes_added_and_dropped_while_8_writers_write_leave_a_consistent_catalog`
//!    on CI). A failed attempt checks its notes at once (its write may have committed, and
//!    its retry may come after the job finished, when nothing writes the row again);
//! 2. after the entry's writes, the applier takes every noted row and re-reads the schema
//!    row (one read, only when something was noted) ([`Applier::settle_dropping`]). Taking
//!    a concurrent group's note early is safe: that group notes again after its write and
//!    checks again after its writes;
//! 3. if the drop's job is still not recorded, the rows were written before the job was, so
//!    before its scan began: the job removes them. Otherwise (job recorded, or the index
//!    gone) the applier deletes them itself. A row of an index dropped and since added
//!    again is left to that index (its backfill is fenced by WAL id like any write).
//!
//! A crash of the process between 1 and 3 leaves the entry pending, and its retry writes and
//! checks again while the index is dropping. Left open: a retry after the job has finished
//! writes nothing for the index, so such a row stays (docs/ARCHITECTURE.md, "Order", step 10).

use super::applier::Applier;
use crate::error::Result;
use crate::keys::{escape_key, partition_field};
use crate::schema::{IndexState, Schema};
use crate::store::{IfMatch, StoreError};

/// The field of catalog partition `pk` when `schema` does not maintain it (an index being
/// dropped, or one gone altogether); `None` for a maintained index or a key of another shape.
fn unmaintained_field(schema: &Schema, pk: &str) -> Option<String> {
    let field = partition_field(pk)?;
    let maintained = schema.index_keys.iter().any(|k| escape_key(&k.to_lowercase()) == field);
    (!maintained).then_some(field)
}

impl Applier {
    /// Notes row (`pk`, `rk`), about to be written or just written, when its partition
    /// belongs to an index this process's schema does not maintain (step 1 above).
    pub(crate) fn note_dropping_row(&self, pk: &str, rk: &str) {
        if unmaintained_field(&self.schema(), pk).is_some() {
            self.dropping.0.lock().unwrap_or_else(|p| p.into_inner()).insert((pk.to_string(), rk.to_string()));
        }
    }

    /// Steps 2 and 3 of the module docs: deletes the noted rows of indexes whose drop's job
    /// is recorded (or that are gone). Nothing to do, and no request, when nothing is noted.
    /// Errors: the schema read or a delete failed. The rows not settled are noted again
    /// first: the notes may be another group's, whose entries are not applied again, so a
    /// note dropped with the error would leave its row behind the job for good (found by the
    /// simulator with random short pages, seed 432: a 503 on the delete).
    pub(crate) async fn settle_dropping(&self) -> Result<()> {
        let taken = std::mem::take(&mut *self.dropping.0.lock().unwrap_or_else(|p| p.into_inner()));
        if taken.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.reload_schema().await {
            self.renote(taken);
            return Err(e);
        }
        let schema = self.schema();
        let job_started = |f: &str| match schema.added().iter().find(|a| escape_key(&a.field.to_lowercase()) == f) {
            None => true,
            Some(a) => a.state == IndexState::Dropping && a.job.is_some(),
        };
        let mut rows = taken.into_iter();
        while let Some((pk, rk)) = rows.next() {
            if !unmaintained_field(&schema, &pk).is_some_and(|f| job_started(&f)) {
                continue;
            }
            tracing::debug!(partition = %pk, row = %rk, "row of a dropped index written behind its job: removed");
            match self.store.delete(&self.catalog_table, &pk, &rk, &IfMatch::Any).await {
                Ok(()) | Err(StoreError::NotFound(_)) => self.rows.forget(&pk, &rk),
                Err(e) => {
                    self.renote(std::iter::once((pk, rk)).chain(rows));
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Notes again rows a failed [`Applier::settle_dropping`] took and did not settle.
    fn renote(&self, rows: impl IntoIterator<Item = (String, String)>) {
        self.dropping.0.lock().unwrap_or_else(|p| p.into_inner()).extend(rows);
    }
}
