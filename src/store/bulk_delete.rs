//! Deleting many rows of one partition: one entity group transaction per 100 rows, falling
//! back to one delete per row when a batch fails because another process removed some
//! (rows already gone are fine).

use super::error::{StoreError, StoreResult};
use super::table::{BatchOp, IfMatch, TableStore, MAX_BATCH_OPS};

/// Deletes the rows `row_keys` of partition `partition_key` whatever their ETag; rows
/// already absent are skipped. Cost: one request per 100 rows, plus one per row of a batch
/// that met an absent row.
pub async fn delete_rows<S: TableStore + ?Sized>(
    store: &S,
    table: &str,
    partition_key: &str,
    row_keys: &[String],
) -> StoreResult<()> {
    for chunk in row_keys.chunks(MAX_BATCH_OPS) {
        let ops: Vec<BatchOp> =
            chunk.iter().map(|rk| BatchOp::Delete { row_key: rk.clone(), if_match: IfMatch::Any }).collect();
        match store.batch(table, partition_key, &ops).await {
            Ok(_) => {}
            Err(StoreError::BatchFailed { .. }) => {
                for rk in chunk {
                    match store.delete(table, partition_key, rk, &IfMatch::Any).await {
                        Ok(()) | Err(StoreError::NotFound(_)) => {}
                        Err(err) => return Err(err),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
