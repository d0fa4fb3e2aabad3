//! The limits of one entity group transaction (EGT), checked before any I/O so that a write
//! over them is refused with the field and the limit and writes nothing.
//!
//! Azure ("Performing entity group transactions", learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions):
//! an EGT holds at most 100 operations ([`MAX_BATCH_OPS`]) on entities of one partition and
//! its request body is at most 4 MiB ([`MAX_BATCH_BYTES`]). A single-partition write is one
//! EGT: one operation per row it writes or deletes (the owner row, one row per index value,
//! and the deletes of index rows the record no longer has, or of the record a replace
//! removes), so a record may have at most 99 index values.

use crate::error::{Error, Result};
use crate::store::{BatchOp, Entity, Value, MAX_BATCH_BYTES, MAX_BATCH_OPS};

/// What an operation adds to the `$batch` body besides its entity's JSON: the changeset
/// part's headers and the request line (a conservative allowance; the URL holds both keys).
const OP_OVERHEAD: usize = 512;

/// The JSON size of `s` in the request body, at worst: non-ASCII characters are sent as
/// `\uXXXX` escapes, two for characters outside the BMP.
fn json_units(s: &str) -> usize {
    s.chars().map(|c| if c.is_ascii() { 1 } else { 12 }).sum()
}

/// An upper bound on the `$batch` request-body bytes of writing entity `e` (one operation).
pub(crate) fn entity_bytes(e: &Entity) -> usize {
    OP_OVERHEAD
        + json_units(&e.partition_key)
        + 3 * json_units(&e.row_key)
        + e.properties
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Value::String(s) => json_units(s),
                    Value::Binary(b) => b.len() * 4 / 3 + 4,
                    _ => 48,
                };
                json_units(k) * 2 + value + 64
            })
            .sum::<usize>()
}

/// An upper bound on the `$batch` request-body bytes of `op`.
pub(crate) fn op_bytes(op: &BatchOp) -> usize {
    match op {
        BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) => entity_bytes(e),
        BatchOp::Delete { row_key, .. } => OP_OVERHEAD + 3 * json_units(row_key),
    }
}

/// Checks that `ops` fit one EGT. `what` says what the write needs them for; the error names
/// the field (`record`) and the limit: [`Error::Invalid`] (HTTP 400), nothing written.
pub(crate) fn check(ops: &[BatchOp], what: &str) -> Result<()> {
    if ops.len() > MAX_BATCH_OPS {
        return Err(Error::invalid(format!(
            "record: {what} needs {} operations in one entity group transaction; the limit is {MAX_BATCH_OPS} \
             (Azure), so a record may have at most {} index values in single-partition mode",
            ops.len(),
            MAX_BATCH_OPS - 1
        )));
    }
    let bytes: usize = ops.iter().map(op_bytes).sum();
    if bytes > MAX_BATCH_BYTES {
        return Err(Error::invalid(format!(
            "record: {what} writes about {bytes} bytes in one entity group transaction ({} rows, each a copy of \
             the record); the limit is {MAX_BATCH_BYTES} bytes (4 MiB, Azure): use a smaller record or fewer \
             index values",
            ops.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_100_operations_and_4_mib_naming_the_limit() {
        let op = |i: usize| BatchOp::Delete { row_key: format!("r{i}"), if_match: crate::store::IfMatch::Any };
        assert!(check(&(0..100).map(op).collect::<Vec<_>>(), "an upsert").is_ok());
        let err = check(&(0..101).map(op).collect::<Vec<_>>(), "an upsert").unwrap_err().to_string();
        assert!(err.contains("101 operations") && err.contains("limit is 100"), "{err}");
        let big = Entity::new("t", "r").with("blob", Value::String("x".repeat(300 * 1024)));
        let ops: Vec<BatchOp> = (0..15).map(|_| BatchOp::Upsert(big.clone())).collect();
        let err = check(&ops, "an upsert").unwrap_err().to_string();
        assert!(err.contains("4194304") && err.starts_with("record:"), "{err}");
        assert!(check(&ops[..13], "an upsert").is_ok(), "13 copies of 300 KiB are under 4 MiB");
    }
}
