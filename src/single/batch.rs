//! Batch upserts in single-partition mode (`POST /api/records/batch`, `import`): records of
//! different identities share EGTs, as many as fit one (100 operations, 4 MiB), so a bulk
//! load costs one owner-row read per record and one transaction per group instead of one
//! per record. Each group's EGT is conditional on every owner row it changes, like a single
//! write (`super::write`), and retried on a race; a group that does not fit once its owner
//! rows are read, or fails otherwise, is written again one record per EGT, so every input
//! gets its own result. Inputs with the same identity go to successive rounds, in input
//! order, so the last one wins.

use std::collections::BTreeMap;

use futures::StreamExt as _;

use crate::error::{Error, Result};
use crate::record::Record;
use crate::store::MAX_BATCH_OPS;

use super::write::Rows;
use super::{egt, SinglePartition};

/// Groups written at once.
const CONCURRENCY: usize = 8;

/// One input: its position, the record as stored, its rows and write id.
struct Item {
    slot: usize,
    record: Record,
    rows: Rows,
    id: String,
}

impl SinglePartition {
    /// Upserts many records (each validated on its own; an invalid one gets its error and
    /// the others are written). One result per input, in order: the write id, or the error.
    pub(crate) async fn upsert_many(&self, records: Vec<Record>) -> Vec<Result<String>> {
        let mut results: Vec<Option<Result<String>>> = (0..records.len()).map(|_| None).collect();
        // Round r holds the r-th input of every identity.
        let mut rounds: Vec<Vec<Item>> = Vec::new();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (slot, record) in records.into_iter().enumerate() {
            let id = crate::env::uuid().to_string();
            match self.check(record).and_then(|r| Ok((self.rows(&r, &id)?, r))) {
                Ok((rows, record)) => {
                    let round = seen.entry(rows.identity.clone()).or_insert(0);
                    if rounds.len() <= *round {
                        rounds.push(Vec::new());
                    }
                    rounds[*round].push(Item { slot, record, rows, id });
                    *round += 1;
                }
                Err(e) => results[slot] = Some(Err(e)),
            }
        }
        for round in rounds {
            let done: Vec<Vec<(usize, Result<String>)>> = futures::stream::iter(groups(round))
                .map(|group| self.put_group(group))
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for (slot, result) in done.into_iter().flatten() {
                results[slot] = Some(result);
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(Error::invalid("batch: missing result")))).collect()
    }

    /// Writes `group` (distinct identities) in one EGT, or one record per EGT when that
    /// fails.
    async fn put_group(&self, group: Vec<Item>) -> Vec<(usize, Result<String>)> {
        if group.len() > 1 {
            let together = self
                .retrying("batch upsert", || async {
                    let reads = group.iter().map(|item| self.current(&item.rows.identity));
                    let currents = futures::future::try_join_all(reads).await?;
                    let mut ops = Vec::new();
                    for (item, current) in group.iter().zip(&currents) {
                        ops.extend(self.store_ops(&item.rows, current.as_ref()));
                    }
                    if egt::check(&ops, "this batch").is_err() {
                        return Ok(false);
                    }
                    self.store.batch(&self.table, &self.partition, &ops).await?;
                    Ok(true)
                })
                .await;
            if let Ok(true) = together {
                return group.into_iter().map(|item| (item.slot, Ok(item.id))).collect();
            }
        }
        let mut out = Vec::with_capacity(group.len());
        for item in group {
            let result = self.put(&item.record, false, &item.id).await.map(|_| item.id);
            out.push((item.slot, result));
        }
        out
    }
}

/// Packs `items` into groups whose new rows fit one EGT (operations and bytes, as written to
/// an empty partition; deletes of rows a record leaves are checked once its owner row is
/// read).
fn groups(items: Vec<Item>) -> Vec<Vec<Item>> {
    let mut out: Vec<Vec<Item>> = Vec::new();
    let (mut ops, mut bytes) = (0usize, 0usize);
    for item in items {
        let n = item.rows.index.len() + 1;
        let b: usize = std::iter::once(&item.rows.owner).chain(&item.rows.index).map(egt::entity_bytes).sum();
        let fits = ops + n <= MAX_BATCH_OPS && bytes + b <= crate::store::MAX_BATCH_BYTES;
        match out.last_mut() {
            Some(group) if fits => group.push(item),
            _ => {
                (ops, bytes) = (0, 0);
                out.push(vec![item]);
            }
        }
        ops += n;
        bytes += b;
    }
    out
}
