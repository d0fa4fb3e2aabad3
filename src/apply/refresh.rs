//! Refreshing a record's existing projected rows (docs/ARCHITECTURE.md, "Projections"): the
//! backfill of an index `B` writes again the rows of other projected indexes that were
//! written before `B` was added (they lack `B`'s field, which a delete through them needs to
//! find `B`'s row). It only ever replaces a row that is live and was written by the very
//! entry the backfill read on the fact row; it never creates one. A row that is missing
//! belongs to an index whose own backfill has not reached the record yet, and that backfill
//! writes it under a schema holding `B`; creating it here could outlive the record: a delete
//! applied under a schema without that index (an entry before its change, applied before
//! its backfill starts) writes no tombstone there (simulator seeds 285, 412, 454, 620, 810).

use super::applier::Applier;
use crate::error::Result;
use crate::record::{self, Record, RowMeta};
use crate::store::{Entity, IfMatch, StoreError};

impl Applier {
    /// Replaces row (`pk`, `rk`) by `payload` under WAL id `id` and schema `version` when the
    /// row is live, was written by `id`, and under a schema older than `since` (the version
    /// that added the field it lacks); leaves it alone otherwise (absent, a tombstone, another
    /// entry's row, or written under `since` or later, so holding that field), and when another writer replaces it between the read and the write (412 or
    /// 404: that writer is a newer entry or a delete). Costs one read, and one conditional
    /// replace when it writes. Errors: storage failures other than those two.
    pub(crate) async fn refresh_row(
        &self,
        pk: &str,
        rk: &str,
        id: &str,
        payload: &Record,
        since: u64,
        version: u64,
    ) -> Result<()> {
        let table = &self.catalog_table;
        let Some(row) = self.store.get(table, pk, rk).await? else { return Ok(()) };
        let meta = RowMeta::of(&row);
        if meta.deleted || meta.wal_id != id || meta.schema_version >= since {
            return Ok(());
        }
        let Some(etag) = row.etag.clone() else { return Ok(()) };
        let mut properties = record::to_properties(payload, id);
        record::set_schema_version(&mut properties, version);
        let entity = Entity { partition_key: pk.to_string(), row_key: rk.to_string(), etag: None, properties };
        match self.store.replace(table, &entity, &IfMatch::Etag(etag)).await {
            Ok(tag) => {
                self.rows.put(pk, rk, tag, id, version);
                Ok(())
            }
            Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => {
                self.rows.forget(pk, rk);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}
