//! Removing a stray catalog row ([`Op::RemoveRow`](crate::wal::Op::RemoveRow)), logged by
//! `repair` for a `stray_row` finding of `verify`: a row whose payload keys to its RowKey
//! but whose record's index values do not include its partition (a copy under another
//! PartitionKey, left by a write lost halfway through an older release or by an edit by
//! hand). Queries of that partition would return the record.
//!
//! Fenced twice, so the removal never touches a row it did not judge: the row is read back
//! and removed only while its ETag is the one the scan saw (the delete itself is conditional
//! on it, so a write between the read and the delete wins) and while it still does not
//! belong under the schema in force. Idempotent: a row already gone, or changed, is left
//! as it is. No history row: no record changes.

use super::applier::Applier;
use crate::error::Result;
use crate::record::RowMeta;
use crate::store::{ETag, IfMatch, StoreError};
use crate::verify::belongs;
use crate::wal::WalEntry;

impl Applier {
    pub(crate) async fn remove_stray_row(
        &self,
        entry: &WalEntry,
        partition_key: &str,
        row_key: &str,
        etag: &str,
    ) -> Result<()> {
        let Some(row) = self.store.get(&self.catalog_table, partition_key, row_key).await? else {
            tracing::info!(wal_id = %entry.id, partition_key, row_key, "stray row already gone");
            return Ok(());
        };
        if row.etag.as_ref().is_none_or(|t| t.0 != etag) {
            tracing::info!(wal_id = %entry.id, partition_key, row_key, "stray row written since the scan: left");
            return Ok(());
        }
        let meta = RowMeta::of(&row);
        if belongs(&self.schema(), &row, &meta).is_ok() {
            tracing::info!(wal_id = %entry.id, partition_key, row_key, "row belongs under the schema in force: left");
            return Ok(());
        }
        let fence = IfMatch::Etag(ETag(etag.to_string()));
        match self.store.delete(&self.catalog_table, partition_key, row_key, &fence).await {
            Ok(()) => {
                tracing::info!(wal_id = %entry.id, partition_key, row_key, "stray row removed");
                Ok(())
            }
            Err(StoreError::NotFound(_) | StoreError::PreconditionFailed(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
