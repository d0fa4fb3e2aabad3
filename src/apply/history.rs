//! Writing history rows from the apply path ([`crate::history`] has the layout).
//!
//! Each applied entry gets one row per record identity it changed, written after the
//! entry's catalog rows and before its group is checkpointed and leaves the pending
//! partition. So a crash anywhere before the checkpoint re-applies the group, which writes
//! the rows again; the RowKey depends only on the entry's id, so the row is inserted once and
//! a second insert gets 409, which counts as written (a transaction that meets such a row is
//! redone row by row). Rows of one identity share a partition
//! and go in one entity group transaction: one request per identity per group.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::history_target::HistoryTarget;
use crate::error::Result;
use crate::faults;
use crate::history::{self, retention, Change, HistoryEntry};
use crate::query::Filter;
use crate::record::Record;
use crate::store::{pager, BatchOp, Entity, RowRange, StoreError};
use crate::wal::append::batches;
use crate::wal::WalId;

impl Applier {
    /// Records `changes` in the history table, when the catalog keeps history. Passes the
    /// crash points `before_history_write` (after the catalog rows) and `after_history_write`.
    pub(crate) async fn record_history(&self, changes: Vec<Change<'_>>) -> Result<()> {
        let Some(target) = &self.history else { return Ok(()) };
        if changes.is_empty() {
            return Ok(());
        }
        faults::point("before_history_write")?;
        let mut by_identity: BTreeMap<String, BTreeMap<String, Entity>> = BTreeMap::new();
        for change in &changes {
            let e = change.to_entity();
            by_identity.entry(e.partition_key.clone()).or_default().insert(e.row_key.clone(), e);
        }
        // An entry stamped after its own id was applied once under that id (its group was
        // written, then the attempt stopped before the entry left the pending partition, and
        // a seal passed it meanwhile): it takes effect only at the stamp, so the row of the
        // first attempt is replaced by a marker (found by the simulator, seed 2173: two
        // history rows of one entry). A marker, not a deletion: a stale applier still
        // applying the entry under its own id would write the row again (seed 5522), and
        // a filter's `version_before` would take it for the version before the filter.
        let mut unstamped: BTreeMap<String, Vec<Entity>> = BTreeMap::new();
        for change in changes.iter().filter(|c| c.wal_id.is_stamped()) {
            let raw = WalId::from_stored(crate::wal::id::entry_of(change.wal_id.as_str()).to_string());
            let marker = history::marker(&change.identity, &history::row_key(&raw), &history::row_key(change.wal_id));
            unstamped.entry(change.identity.clone()).or_default().push(marker);
        }
        let unstamped = &unstamped;
        futures::stream::iter(by_identity)
            .map(|(identity, rows)| async move {
                let rows: Vec<Entity> = rows.into_values().collect();
                self.insert_history(target, &identity, &rows).await?;
                for marker in unstamped.get(&identity).into_iter().flatten() {
                    self.store.upsert(&target.table, marker).await?;
                }
                retention::trim(self.store.as_ref(), &target.table, &identity, &target.opts).await?;
                Ok::<_, crate::Error>(())
            })
            .buffer_unordered(self.opts.apply_concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        faults::point("after_history_write")
    }

    /// The version of `identity` just before entry `id`, when the history says it existed
    /// and `filter` matches it: its newest row older than `id` (superseded markers skipped).
    /// One query (`RowKey gt` the entry's history key, first row). Used for a row that a
    /// filter entry matched but a later entry wrote (an upsert of another shard applied
    /// first): the filter removed the record in effective-id order only if the version
    /// before it matched (with an added index, that version may hold another value than the
    /// row it matched). `None` without history.
    pub(crate) async fn version_before(&self, identity: &str, id: &WalId, filter: &Filter) -> Result<Option<Record>> {
        let Some(target) = &self.history else { return Ok(None) };
        let range = RowRange { after: Some(history::row_key(id)), ..RowRange::default() };
        let older = pager::entities(self.store.as_ref(), &target.table, identity, &range, 1);
        let mut older = older.try_filter(|e| futures::future::ready(!history::is_marker(e)));
        match older.try_next().await? {
            Some(row) => {
                let schema = self.schema();
                Ok(HistoryEntry::from_entity(&row)?.record.filter(|r| filter.matches(&schema, r)))
            }
            None => Ok(None),
        }
    }

    /// Inserts the rows of one identity, an entity group transaction per 100 rows (and
    /// 4 MiB). When the transaction fails because a row is already there (a re-application),
    /// the rows of that transaction are inserted one by one, each 409 counting as written:
    /// no row is skipped on the strength of an operation index.
    async fn insert_history(&self, target: &HistoryTarget, identity: &str, rows: &[Entity]) -> Result<()> {
        for chunk in batches(rows) {
            if let [one] = chunk {
                self.insert_once(&target.table, one).await?;
                continue;
            }
            let ops: Vec<BatchOp> = chunk.iter().cloned().map(BatchOp::Insert).collect();
            match self.store.batch(&target.table, identity, &ops).await {
                Ok(_) => {}
                Err(StoreError::BatchFailed { source, .. }) if matches!(*source, StoreError::AlreadyExists(_)) => {
                    for row in chunk {
                        self.insert_once(&target.table, row).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Inserts one history row; already there (409) is fine.
    async fn insert_once(&self, table: &str, row: &Entity) -> Result<()> {
        match self.store.insert(table, row).await {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use crate::catalog::{Catalog, CatalogOptions};
    use crate::config::Names;
    use crate::history::{self, Change, ChangeOp, HistoryOptions};
    use crate::query::Filter;
    use crate::schema::Schema;
    use crate::store::mem::MemStore;
    use crate::store::Store;
    use crate::wal::WalId;

    /// Regression (simulator seed 5522): upsert U was applied under its own id by an applier
    /// whose lease then expired; a seal passed U, the next applier stamped U and applied it
    /// at the stamp (its history row, and the removal of the row of U's own id); then the
    /// stale applier wrote U's unstamped history row. Two rows of one entry, and a delete
    /// between U's id and the stamp took that row for the version before it and recorded the
    /// removal of a record it could not have removed.
    #[tokio::test]
    async fn a_stale_applier_writing_an_entry_under_its_own_id_after_the_stamped_apply_adds_no_history_row() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let names = Names::new("stalehist", None, None).unwrap();
        let schema = Schema::new(vec!["icao".into(), "iata".into()], "name").unwrap();
        let opts = CatalogOptions { history: HistoryOptions::on(), ..CatalogOptions::default() };
        let c = Catalog::open(store.clone(), names.clone(), schema.clone(), opts).await.unwrap();
        let record = json!({"icao": "KEEE", "iata": "BBB", "name": "Echo"}).as_object().cloned().unwrap();
        let identity = schema.record_keys(&record).unwrap().row_key;
        let own = WalId::from_stored("2026-12-31T23:59:55.362000_67603b6c-be66-4ae7-adb3-08ca81892fc2".into());
        let seal = WalId::from_stored("2027-01-01T00:00:03.390001_86c4fb90-9148-458b-8c37-f8abdbddb3ac".into());
        let stamped = WalId::stamped(&seal, &own);
        let change =
            |wal_id| Change { identity: identity.clone(), op: ChangeOp::Upsert, wal_id, record: Some(&record) };

        c.applier().record_history(vec![change(&stamped)]).await.unwrap(); // the current applier
        c.applier().record_history(vec![change(&own)]).await.unwrap(); // the stale one, after it

        let rows = crate::verify::scan_all(store.as_ref(), &names.history_table).await.unwrap();
        let changes: Vec<&str> =
            rows.iter().filter(|e| !history::is_marker(e)).map(|e| e.str("wal_id").unwrap_or_default()).collect();
        assert_eq!(changes, vec![stamped.as_str()], "one row, at the stamp");
        // The delete that raised the seal (below the stamp, above U's own id) finds no
        // version of the record before it.
        let by_iata = Filter::new(vec![("iata".into(), "BBB".into())]);
        assert_eq!(c.applier().version_before(&identity, &seal, &by_iata).await.unwrap(), None);
    }
}
