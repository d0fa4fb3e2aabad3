//! Tables of the in-memory store: entities by PartitionKey then RowKey (UTF-16 order),
//! writes checked then applied under the store's lock, pages cut by continuation tokens
//! that name the next entity.

use std::cmp::Ordering;
use std::ops::Bound::{self, Excluded, Included, Unbounded};

use async_trait::async_trait;
use base64::Engine as _;

use super::state::{Counters, Key, MemStore, Pages, State, Stored, Table};
use crate::store::error::{already_exists, table_not_found, StoreError, StoreResult};
use crate::store::page::{Page, PartitionRange, RowRange, MAX_PAGE};
use crate::store::table::{check_if_match, validate_batch, BatchOp, IfMatch, TableStore};
use crate::store::value::check_entity;
use crate::store::value::{ETag, Entity};

impl Table {
    fn current(&self, pk: &str, rk: &str) -> Option<&Stored> {
        self.partitions.get(&Key::new(pk))?.get(&Key::new(rk))
    }

    /// The precondition of `op` on partition `pk`, against the current state.
    fn check(&self, pk: &str, op: &BatchOp) -> StoreResult<()> {
        let current = self.current(pk, op.row_key()).map(|s| s.etag.0.as_str());
        match op {
            BatchOp::Insert(_) if current.is_some() => Err(already_exists()),
            BatchOp::Insert(_) | BatchOp::Upsert(_) => Ok(()),
            BatchOp::Replace(_, if_match) => check_if_match(current, if_match, "replace"),
            BatchOp::Delete { if_match, .. } => check_if_match(current, if_match, "delete"),
        }
    }

    /// Applies `op` (its precondition held) to partition `pk`: the new ETag of a write,
    /// `None` for a delete.
    fn apply(&mut self, pk: &str, op: BatchOp, counters: &mut Counters) -> Option<ETag> {
        match op {
            BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) => {
                let etag = counters.etag();
                let stored = Stored { etag: etag.clone(), properties: e.properties };
                self.partitions.entry(Key::new(pk)).or_default().insert(Key(e.row_key), stored);
                Some(etag)
            }
            BatchOp::Delete { row_key, .. } => {
                let partition = Key::new(pk);
                if let Some(rows) = self.partitions.get_mut(&partition) {
                    rows.remove(&Key(row_key));
                    if rows.is_empty() {
                        self.partitions.remove(&partition);
                    }
                }
                None
            }
        }
    }

    /// The entities of partition `pk` within `range`, from `resume` on if given, in RowKey
    /// order.
    fn partition_entries<'a>(
        &'a self,
        pk: &str,
        range: &'a RowRange,
        resume: Option<&Resume>,
    ) -> impl Iterator<Item = (&'a Key, &'a Key, &'a Stored)> + 'a {
        let start = [
            range.from.as_deref().map_or(Unbounded, |k| Included(Key::new(k))),
            range.after.as_deref().map_or(Unbounded, |k| Excluded(Key::new(k))),
            resume.map_or(Unbounded, |r| Included(Key::new(&r.rk))),
        ]
        .into_iter()
        .fold(Unbounded, tighter);
        self.partitions.get_key_value(&Key::new(pk)).into_iter().flat_map(move |(pk, rows)| {
            // Every entity from `start` on is above the lower bounds, so the first one
            // outside `range` is past an upper bound, and so are all after it.
            rows.range((start.clone(), Unbounded))
                .take_while(|(rk, _)| range.contains(&rk.0))
                .map(move |(rk, s)| (pk, rk, s))
        })
    }

    /// The entities whose PartitionKey lies in `range`, from `resume` on if given, in
    /// (PartitionKey, RowKey) order.
    fn range_entries<'a>(
        &'a self,
        range: &'a PartitionRange,
        resume: Option<&'a Resume>,
    ) -> impl Iterator<Item = (&'a Key, &'a Key, &'a Stored)> + 'a {
        let after = range.after.as_deref().map_or(Unbounded, |k| Excluded(Key::new(k)));
        let start = tighter(after, resume.map_or(Unbounded, |r| Included(Key::new(&r.pk))));
        self.partitions.range((start, Unbounded)).take_while(|(pk, _)| range.contains(&pk.0)).flat_map(
            move |(pk, rows)| {
                let from = match resume {
                    Some(r) if r.pk == pk.0 => Included(Key::new(&r.rk)),
                    _ => Unbounded,
                };
                rows.range((from, Unbounded)).map(move |(rk, s)| (pk, rk, s))
            },
        )
    }
}

/// The tighter of two lower bounds (on a tie, `Excluded`).
fn tighter(a: Bound<Key>, b: Bound<Key>) -> Bound<Key> {
    match (&a, &b) {
        (Unbounded, _) => b,
        (_, Unbounded) => a,
        (Included(x) | Excluded(x), Included(y) | Excluded(y)) => match x.cmp(y) {
            Ordering::Greater => a,
            Ordering::Less => b,
            Ordering::Equal if matches!(a, Excluded(_)) => a,
            Ordering::Equal => b,
        },
    }
}

fn entity(pk: &Key, rk: &Key, stored: &Stored) -> Entity {
    Entity {
        partition_key: pk.0.clone(),
        row_key: rk.0.clone(),
        etag: Some(stored.etag.clone()),
        properties: stored.properties.clone(),
    }
}

// ---- continuation tokens ----

/// Where a query resumes: the keys of the next entity to return (inclusive, like Azure's
/// `NextPartitionKey`/`NextRowKey`) and how many pages of the query came before.
struct Resume {
    pk: String,
    rk: String,
    page: u64,
}

/// Marks tokens of this store (a token of another backend is refused, not misread).
const TOKEN_PREFIX: &str = "mem1.";

/// `mem1.` + base64url of the JSON `[PartitionKey, RowKey, page]`.
fn encode_token(pk: &str, rk: &str, page: u64) -> String {
    let json = serde_json::json!([pk, rk, page]).to_string();
    format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
}

/// Inverse of [`encode_token`]; `InvalidInput` for a token this store did not issue.
fn decode_token(token: &str) -> StoreResult<Resume> {
    let bad = || StoreError::InvalidInput("continuation token is not one this store issued".into());
    let encoded = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded).map_err(|_| bad())?;
    let (pk, rk, page) = serde_json::from_slice::<(String, String, u64)>(&bytes).map_err(|_| bad())?;
    Ok(Resume { pk, rk, page })
}

impl MemStore {
    /// How many entities page number `page` (0 = first) of a query holds.
    fn page_size(&self, limit: usize, page: u64) -> usize {
        match self.pages {
            Pages::Full => limit,
            Pages::Pattern => match page % 3 {
                0 => limit,
                1 => 0,
                _ => (limit / 2).max(1),
            },
            Pages::Random(probability) => crate::env::with_rng(|rng| {
                let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let cut = probability > 0.0 && unit < probability;
                if cut {
                    (rng.next_u64() % limit as u64) as usize
                } else {
                    limit
                }
            }),
        }
    }

    /// A page of `entries` (the query's entities from where this page starts): at most
    /// [`Self::page_size`], with a token naming the next entity if there is one.
    fn page<'a>(
        &self,
        entries: impl Iterator<Item = (&'a Key, &'a Key, &'a Stored)>,
        limit: usize,
        resume: Option<&Resume>,
    ) -> Page {
        let number = resume.map_or(0, |r| r.page);
        let mut entries = entries;
        let size = self.page_size(limit.clamp(1, MAX_PAGE), number);
        let entities = entries.by_ref().take(size).map(|(pk, rk, s)| entity(pk, rk, s)).collect();
        let continuation = entries.next().map(|(pk, rk, _)| encode_token(&pk.0, &rk.0, number + 1));
        Page { entities, continuation }
    }

    /// One write outside a batch: its own error rather than `BatchFailed`.
    fn write_one(&self, table: &str, pk: &str, op: BatchOp) -> StoreResult<Option<ETag>> {
        match self.with(|s| s.write(table, pk, vec![op])) {
            Ok(mut etags) => Ok(etags.pop().flatten()),
            Err(StoreError::BatchFailed { source, .. }) => Err(*source),
            Err(other) => Err(other),
        }
    }

    /// An insert, upsert or replace of `entity` (checked against the entity limits first).
    fn write_entity(&self, table: &str, entity: &Entity, op: impl FnOnce(Entity) -> BatchOp) -> StoreResult<ETag> {
        check_entity(entity)?;
        self.write_one(table, &entity.partition_key, op(entity.clone()))?
            .ok_or_else(|| StoreError::Other("in-memory store: a write returned no ETag".into()))
    }

    /// A page of the entities whose PartitionKey lies in `range` (`scan`: all of them).
    fn range_page(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let resume = continuation.map(decode_token).transpose()?;
        self.with(|s| Ok(self.page(s.table(table)?.range_entries(range, resume.as_ref()), limit, resume.as_ref())))
    }
}

impl State {
    fn table(&self, table: &str) -> StoreResult<&Table> {
        self.tables.get(&table.to_lowercase()).ok_or_else(|| table_not_found(table))
    }

    /// Runs `ops` on partition `pk` of `table`, all or none: every precondition is checked
    /// against the state before the batch (a batch names each RowKey once, so no operation
    /// depends on another's effect), then all are applied. The first failing operation
    /// gives `BatchFailed { index }`; a missing table `NotFound`.
    fn write(&mut self, table: &str, pk: &str, ops: Vec<BatchOp>) -> StoreResult<Vec<Option<ETag>>> {
        let State { tables, counters, .. } = self;
        let t = tables.get_mut(&table.to_lowercase()).ok_or_else(|| table_not_found(table))?;
        for (index, op) in ops.iter().enumerate() {
            t.check(pk, op).map_err(|source| StoreError::BatchFailed { index, source: Box::new(source) })?;
        }
        Ok(ops.into_iter().map(|op| t.apply(pk, op, counters)).collect())
    }
}

#[async_trait]
impl TableStore for MemStore {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        crate::store::table::check_table_name(table)?;
        self.with(|s| {
            s.tables.entry(table.to_lowercase()).or_default();
        });
        Ok(())
    }

    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        self.with(|s| s.tables.remove(&table.to_lowercase()));
        Ok(())
    }

    async fn get(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Option<Entity>> {
        self.with(|s| {
            let stored = s.table(table)?.current(partition_key, row_key);
            Ok(stored.map(|st| entity(&Key::new(partition_key), &Key::new(row_key), st)))
        })
    }

    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.write_entity(table, entity, BatchOp::Insert)
    }

    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.write_entity(table, entity, BatchOp::Upsert)
    }

    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        self.write_entity(table, entity, |e| BatchOp::Replace(e, if_match.clone()))
    }

    async fn delete(&self, table: &str, partition_key: &str, row_key: &str, if_match: &IfMatch) -> StoreResult<()> {
        let op = BatchOp::Delete { row_key: row_key.to_string(), if_match: if_match.clone() };
        self.write_one(table, partition_key, op).map(|_| ())
    }

    async fn query_partition(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let resume = continuation.map(decode_token).transpose()?;
        if resume.as_ref().is_some_and(|r| r.pk != partition_key) {
            return Err(StoreError::InvalidInput("continuation token belongs to another partition's query".into()));
        }
        self.with(|s| {
            let entries = s.table(table)?.partition_entries(partition_key, range, resume.as_ref());
            Ok(self.page(entries, limit, resume.as_ref()))
        })
    }

    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.range_page(table, range, limit, continuation)
    }

    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.range_page(table, &PartitionRange::default(), limit, continuation)
    }

    async fn count_range(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        self.with(|s| {
            let mut entries = s.table(table)?.partition_entries(partition_key, range, None);
            let first = entries.next().map(|(_, rk, _)| rk.0.clone());
            let rest = usize::try_from(cap.saturating_sub(1)).unwrap_or(usize::MAX);
            Ok((first.as_ref().map_or(0, |_| 1 + entries.take(rest).count() as u64), first))
        })
    }

    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        validate_batch(partition_key, ops)?;
        for op in ops {
            if let BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) = op {
                check_entity(e)?;
            }
        }
        self.with(|s| s.write(table, partition_key, ops.to_vec()))
    }
}
