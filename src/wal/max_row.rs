//! A row holding a string that only grows: the shape of a shard's checkpoint and of its
//! seal ([`super::seal`]).
//!
//! Raising it is read, then replace under the ETag (insert when absent). A concurrent raise
//! makes the swap fail (412, or 409 on a concurrent insert); it is retried with capped
//! exponential backoff and jitter (10 attempts, 2 ms to 200 ms), and a stored value found at
//! or past the wanted one ends it. Values compare as strings (WAL ids sort by time).
//!
//! Each process remembers the ETag and value it last saw of each such row ([`Known`]): a
//! raise by the row's usual writer (the shard's applier for its checkpoint, shard 0's
//! applier for every seal) is then one conditional replace, and a raise to a value at or
//! below the remembered one costs nothing, because a stored value only grows and these rows
//! are never deleted. A stale ETag costs a 412 and the read path above.

use std::collections::HashMap;
use std::sync::Mutex;
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

/// What this process last saw of grow-only rows: (PartitionKey, RowKey) → (ETag, value).
#[derive(Debug, Default)]
pub(crate) struct Known(Mutex<HashMap<(String, String), (ETag, String)>>);

impl Known {
    fn get(&self, pk: &str, rk: &str) -> Option<(ETag, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&(pk.to_string(), rk.to_string())).cloned()
    }

    /// Remembers `value` under `tag`, unless a larger value is remembered already.
    fn put(&self, pk: &str, rk: &str, tag: ETag, value: &str) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let slot = known.entry((pk.to_string(), rk.to_string())).or_insert_with(|| (tag.clone(), value.to_string()));
        if slot.1.as_str() <= value {
            *slot = (tag, value.to_string());
        }
    }

    fn forget(&self, pk: &str, rk: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&(pk.to_string(), rk.to_string()));
    }
}

/// Raises property `prop` of the row to `value` unless it already holds a value at or past
/// it. Returns once the stored value is at least `value`. `known` saves the read when this
/// process wrote or read the row last (see the module docs).
pub(crate) async fn raise(
    store: &dyn Store,
    known: &Known,
    table: &str,
    partition_key: &str,
    row_key: &str,
    prop: &str,
    value: &str,
) -> Result<()> {
    use backon::Retryable;
    let e = Entity::new(partition_key, row_key).with(prop, Value::String(value.to_string()));
    if let Some((tag, seen)) = known.get(partition_key, row_key) {
        if seen.as_str() >= value {
            return Ok(());
        }
        match store.replace(table, &e, &IfMatch::Etag(tag)).await {
            Ok(tag) => {
                known.put(partition_key, row_key, tag, value);
                return Ok(());
            }
            Err(err) if is_conflict(&err) => known.forget(partition_key, row_key),
            Err(err) => return Err(err.into()),
        }
    }
    let attempt = || async {
        let cur = store.get(table, partition_key, row_key).await?;
        let r = match &cur {
            Some(c) => {
                let tag = c.etag.clone().unwrap_or(ETag(String::new()));
                if let Some(stored) = c.str(prop).filter(|d| *d >= value) {
                    known.put(partition_key, row_key, tag, stored);
                    return Ok(());
                }
                store.replace(table, &e, &IfMatch::Etag(tag)).await
            }
            None => store.insert(table, &e).await,
        };
        r.map(|tag| known.put(partition_key, row_key, tag, value))
    };
    let backoff = crate::env::backoff(Duration::from_millis(2), Duration::from_millis(200), 10);
    Ok(attempt.retry(backoff).sleep(crate::env::sleep).when(is_conflict).await?)
}
