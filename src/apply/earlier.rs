//! What a filter entry removed in an earlier attempt, found through its index tombstones.
//!
//! A replace or delete resolves its filter by reading the filter's partition, and a retry
//! (the attempt failed after some of its tombstones landed) finds its own tombstones there
//! and completes them ([`super::filter`]). Through an index being dropped, that partition can
//! be emptied between the attempts by the drop's job, and the retry then saw nothing: the
//! earlier attempt's tombstones elsewhere (the owner row) stayed without their history row,
//! so the history kept a record the catalog had removed (found by the simulator, seed 1410).
//!
//! So such a filter also reads the entry's index tombstones (written before its tombstones,
//! [`Applier::index_tombstones`]: one range query of RowKeys `{id}_…`), reads the rows they
//! name, and treats each identity as its partition page would: this entry's own tombstone,
//! a row still live (decided on, not yet written), or a later entry's row. For every filter
//! entry, not only through a dropping index: the row it matched can also stop showing the
//! record between the attempts (an older version of the record, applied again by a paused
//! applier, shadows itself there with a tombstone just below this entry's id,
//! `super::fanout`), and the retry then left the record live in its other rows although the
//! delete was acknowledged (found by the simulator with random short pages, seed 2835). On a
//! first attempt the query returns only identities already handled: one request, no reads.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::matched::Match;
use crate::error::Result;
use crate::query::Filter;
use crate::record::RowMeta;
use crate::store::{pager, Entity, RowRange, MAX_PAGE};
use crate::wal::{WalId, TOMBSTONES};

impl Applier {
    /// The records entry `id` decided to remove in an earlier attempt (module docs), except
    /// identities in `handled` and those at or below `resume` (handled to the end by an
    /// attempt that stopped at its deadline, [`crate::wal::WalEntry::resume`]). Per identity, the row with the largest WAL id among those its
    /// index tombstones name (this entry's own tombstone wins over the older rows it
    /// replaced); rows gone (the drop's job) are skipped.
    pub(super) async fn matched_earlier(
        &self,
        filter: &Filter,
        id: &WalId,
        handled: &BTreeSet<String>,
        resume: Option<&str>,
    ) -> Result<Vec<Match>> {
        let range = RowRange { from: Some(format!("{id}_")), before: Some(format!("{id}`")), ..RowRange::default() };
        let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut rows = pager::entities(self.store.as_ref(), self.wal.table(), TOMBSTONES, &range, MAX_PAGE);
        while let Some(t) = rows.try_next().await? {
            if let (Some(pk), Some(rk)) = (t.str("pk"), t.str("rk")) {
                if !handled.contains(rk) && !super::filter::resumed_past(rk, resume) {
                    named.entry(rk.to_string()).or_default().insert(pk.to_string());
                }
            }
        }
        // The named rows, read concurrently: a retry of a filter entry that matched many
        // records reads them all, and one after another each retry took longer (and, with
        // transient failures, failed more often) the more records it had matched.
        let reads: Vec<_> = named
            .iter()
            .flat_map(|(rk, pks)| pks.iter().map(move |pk| (pk.clone(), rk.clone())))
            .map(|(pk, rk)| async move { Ok::<_, crate::Error>(self.store.get(&self.catalog_table, &pk, &rk).await?) })
            .collect();
        let rows: Vec<Option<Entity>> =
            futures::stream::iter(reads).buffered(self.opts.apply_concurrency.max(1)).try_collect().await?;
        let mut best: BTreeMap<String, Entity> = BTreeMap::new();
        for row in rows.into_iter().flatten() {
            match best.get(&row.row_key) {
                Some(b) if RowMeta::of(b).wal_id >= RowMeta::of(&row).wal_id => {}
                _ => {
                    best.insert(row.row_key.clone(), row);
                }
            }
        }
        let latest: Vec<Entity> = best.into_values().collect();
        self.matches(filter, id, &latest).await
    }
}
