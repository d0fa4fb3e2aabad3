//! A row holding a string that only grows: the shape of a shard's checkpoint and of its
//! seal ([`super::seal`]).
//!
//! Raising it is read, then replace under the ETag (insert when absent). A concurrent raise
//! makes the swap fail (412, or 409 on a concurrent insert); it is retried with capped
//! exponential backoff and jitter (10 attempts, 2 ms to 200 ms), and a stored value found at
//! or past the wanted one ends it. Values compare as strings (WAL ids sort by time).

use std::time::Duration;

use crate::error::Result;
use crate::store::{ETag, Entity, IfMatch, Store, StoreError, Value};

fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_))
}

/// The value of property `prop` of row (`partition_key`, `row_key`), if the row exists.
pub(crate) async fn read(
    store: &dyn Store,
    table: &str,
    partition_key: &str,
    row_key: &str,
    prop: &str,
) -> Result<Option<String>> {
    Ok(store.get(table, partition_key, row_key).await?.and_then(|e| e.str(prop).map(str::to_string)))
}

/// Raises property `prop` of the row to `value` unless it already holds a value at or past
/// it. Returns once the stored value is at least `value`.
pub(crate) async fn raise(
    store: &dyn Store,
    table: &str,
    partition_key: &str,
    row_key: &str,
    prop: &str,
    value: &str,
) -> Result<()> {
    use backon::Retryable;
    let attempt = || async {
        let cur = store.get(table, partition_key, row_key).await?;
        let e = Entity::new(partition_key, row_key).with(prop, Value::String(value.to_string()));
        let r = match &cur {
            Some(c) if c.str(prop).is_some_and(|d| d >= value) => return Ok(()),
            Some(c) => {
                let tag = c.etag.clone().unwrap_or(ETag(String::new()));
                store.replace(table, &e, &IfMatch::Etag(tag)).await
            }
            None => store.insert(table, &e).await,
        };
        r.map(|_| ())
    };
    let backoff = crate::env::backoff(Duration::from_millis(2), Duration::from_millis(200), 10);
    Ok(attempt.retry(backoff).sleep(crate::env::sleep).when(is_conflict).await?)
}
