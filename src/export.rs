//! Export: every live record of a catalog exactly once, as JSON lines (one record object per
//! line, without system properties), readable by `table-catalog import` (JSON lines), so an
//! export imported into an empty catalog with the same schema reproduces the catalog.
//!
//! The table is walked with the prefix scanner ([`crate::scan`]); each record is written by
//! its **owner** row (the row of its first index value in schema order, see
//! [`crate::verify`]), so no state is kept across rows and memory is one scan page. A record
//! whose owner row is missing is not exported: `verify` reports it, `repair` restores it.

use std::io::Write;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::error::Error;
use crate::record::{self, Record, RowMeta};
use crate::schema::Schema;
use crate::store::{Entity, TableStore};

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading the catalog failed.
    #[error("reading the catalog: {0}")]
    Catalog(#[from] Error),
    /// Writing the output failed.
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
}

/// The record a row exports: `Some` when the row is live and is its record's owner row.
pub fn owned_record(schema: &Schema, entity: &Entity) -> Option<Record> {
    let meta = RowMeta::of(entity);
    if meta.deleted {
        return None;
    }
    let payload = record::payload(entity, &meta);
    let keys = schema.record_keys(&payload).ok()?;
    let owner = keys.partitions.first().is_some_and(|(_, pk)| *pk == entity.partition_key);
    (owner && keys.row_key == entity.row_key).then_some(payload)
}

/// Every live record of catalog table `table` once, in the scan's order, `segment`
/// (1..=1,000) rows per query.
pub fn records<'a>(
    store: &'a dyn TableStore,
    table: &'a str,
    schema: &'a Schema,
    segment: usize,
) -> BoxStream<'a, Result<Record, Error>> {
    crate::scan::entities(store, table, segment)
        .map_err(Error::from)
        .try_filter_map(move |e| futures::future::ready(Ok(owned_record(schema, &e))))
        .boxed()
}

/// Writes every live record of `table` to `out` as JSON lines; calls `progress` with the
/// number of records written so far after each one. Returns the number written.
pub async fn to_writer(
    store: &dyn TableStore,
    table: &str,
    schema: &Schema,
    segment: usize,
    out: &mut dyn Write,
    mut progress: impl FnMut(u64),
) -> Result<u64, ExportError> {
    let mut records = records(store, table, schema, segment);
    let mut written = 0u64;
    while let Some(record) = records.try_next().await? {
        serde_json::to_writer(&mut *out, &record).map_err(std::io::Error::from)?;
        out.write_all(b"\n")?;
        written += 1;
        progress(written);
    }
    out.flush()?;
    Ok(written)
}
