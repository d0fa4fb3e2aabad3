//! A store wrapper that runs a [`Layer`] around every call, so that a concern that applies
//! to all storage operations alike (counting them, simulating the service's latency and
//! limits, observing them) is written once, as a layer, instead of once per trait method.
//!
//! [`LayeredStore`] implements [`TableStore`] and [`QueueStore`] by describing each call as a
//! [`Call`] (operation, table or queue, keys, the operations of a batch) and handing the layer
//! a closure that issues the call on the inner store. The layer may call it once (counting),
//! several times (retrying), or not at all (failing it). Layers stack: a `LayeredStore` is a
//! [`Store`] and can be the inner store of another.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::error::StoreResult;
use super::op::OpKind;
use super::page::{Page, PartitionRange, RowRange};
use super::queue::{QueueStore, ReceivedMessage, Store};
use super::table::{BatchOp, IfMatch, TableStore};
use super::value::{ETag, Entity};

/// One storage call, as a layer sees it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The operation.
    pub op: OpKind,
    /// The table or queue it addresses.
    pub target: &'a str,
    /// The PartitionKey of an entity operation, a partition query or a batch; `None` for
    /// table and queue operations, whole-table scans and PartitionKey range queries.
    pub partition_key: Option<&'a str>,
    /// The RowKey of a point operation (get, insert, upsert, replace, delete).
    pub row_key: Option<&'a str>,
    /// The operations of an entity group transaction; empty for every other call.
    pub batch: &'a [BatchOp],
}

impl<'a> Call<'a> {
    /// A call on a table or queue as a whole (create, delete, scan, queue operations).
    pub fn on(op: OpKind, target: &'a str) -> Call<'a> {
        Call { op, target, partition_key: None, row_key: None, batch: &[] }
    }

    /// A call on one partition (query, count).
    pub fn partition(op: OpKind, target: &'a str, partition_key: &'a str) -> Call<'a> {
        Call { partition_key: Some(partition_key), ..Call::on(op, target) }
    }

    /// A call on one entity.
    pub fn entity(op: OpKind, target: &'a str, partition_key: &'a str, row_key: &'a str) -> Call<'a> {
        Call { partition_key: Some(partition_key), row_key: Some(row_key), ..Call::on(op, target) }
    }

    /// Entities the request writes or addresses: the operations of a batch, 1 for a point
    /// operation, 0 otherwise (what a query reads is known only from its response, see
    /// [`Returned`]).
    pub fn entities(&self) -> usize {
        match self.op {
            OpKind::Batch => self.batch.len(),
            _ => usize::from(self.row_key.is_some()),
        }
    }
}

/// What a response carries, for layers that price or count reads.
pub trait Returned {
    /// Entities (or queue messages) in the response: a page's entities, 1 for a point read
    /// that found its entity, the number a `count_range` counted, received messages; 0 for
    /// write acknowledgements.
    fn returned(&self) -> usize {
        0
    }
}

impl Returned for () {}
impl Returned for ETag {}
impl Returned for String {}
impl Returned for u64 {}
impl Returned for Vec<Option<ETag>> {}
impl Returned for Option<Entity> {
    fn returned(&self) -> usize {
        usize::from(self.is_some())
    }
}
impl Returned for Page {
    fn returned(&self) -> usize {
        self.entities.len()
    }
}
impl Returned for (u64, Option<String>) {
    fn returned(&self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}
impl Returned for Vec<ReceivedMessage> {
    fn returned(&self) -> usize {
        self.len()
    }
}

/// Something that runs around every storage call of a [`LayeredStore`].
pub trait Layer: Send + Sync + 'static {
    /// Runs `call`. `attempt` issues it on the inner store (each invocation is one request);
    /// the layer decides whether, when and how often to invoke it, and returns the result
    /// the caller sees.
    fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, attempt: F) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = StoreResult<T>> + Send + 'a;
}

impl<L: Layer> Layer for Arc<L> {
    fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, attempt: F) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = StoreResult<T>> + Send + 'a,
    {
        (**self).run(call, attempt)
    }
}

/// A store whose every call goes through layer `L` before reaching the inner store.
pub struct LayeredStore<L> {
    inner: Arc<dyn Store>,
    layer: L,
}

impl<L> std::fmt::Debug for LayeredStore<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayeredStore").field("layer", &std::any::type_name::<L>()).finish()
    }
}

impl<L: Layer> LayeredStore<L> {
    /// Wraps `inner` in `layer`.
    pub fn with_layer(inner: Arc<dyn Store>, layer: L) -> LayeredStore<L> {
        LayeredStore { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
}

#[async_trait]
impl<L: Layer> TableStore for LayeredStore<L> {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        self.layer.run(Call::on(OpKind::CreateTable, table), || self.inner.create_table(table)).await
    }
    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        self.layer.run(Call::on(OpKind::DeleteTable, table), || self.inner.delete_table(table)).await
    }
    /// Forwarded without the layer: a diagnostic listing, not a catalog request.
    async fn list_tables(&self) -> StoreResult<Option<Vec<String>>> {
        self.inner.list_tables().await
    }
    async fn get(&self, table: &str, pk: &str, rk: &str) -> StoreResult<Option<Entity>> {
        self.layer.run(Call::entity(OpKind::Get, table, pk, rk), || self.inner.get(table, pk, rk)).await
    }
    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let call = Call::entity(OpKind::Insert, table, &entity.partition_key, &entity.row_key);
        self.layer.run(call, || self.inner.insert(table, entity)).await
    }
    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let call = Call::entity(OpKind::Upsert, table, &entity.partition_key, &entity.row_key);
        self.layer.run(call, || self.inner.upsert(table, entity)).await
    }
    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        let call = Call::entity(OpKind::Replace, table, &entity.partition_key, &entity.row_key);
        self.layer.run(call, || self.inner.replace(table, entity, if_match)).await
    }
    async fn delete(&self, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
        self.layer.run(Call::entity(OpKind::Delete, table, pk, rk), || self.inner.delete(table, pk, rk, if_match)).await
    }
    async fn query_partition(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.layer
            .run(Call::partition(OpKind::Query, table, pk), || {
                self.inner.query_partition(table, pk, range, limit, continuation)
            })
            .await
    }
    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.layer
            .run(Call::on(OpKind::QueryPartitions, table), || {
                self.inner.query_partitions(table, range, limit, continuation)
            })
            .await
    }
    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.layer.run(Call::on(OpKind::Scan, table), || self.inner.scan(table, limit, continuation)).await
    }
    async fn count_range(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        self.layer
            .run(Call::partition(OpKind::Query, table, pk), || self.inner.count_range(table, pk, range, cap))
            .await
    }
    async fn batch(&self, table: &str, pk: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        let call = Call { batch: ops, ..Call::partition(OpKind::Batch, table, pk) };
        self.layer.run(call, || self.inner.batch(table, pk, ops)).await
    }
}

#[async_trait]
impl<L: Layer> QueueStore for LayeredStore<L> {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        self.layer.run(Call::on(OpKind::CreateQueue, queue), || self.inner.create_queue(queue)).await
    }
    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        self.layer.run(Call::on(OpKind::DeleteQueue, queue), || self.inner.delete_queue(queue)).await
    }
    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        self.layer.run(Call::on(OpKind::PutMessage, queue), || self.inner.put_message(queue, text, visible_after)).await
    }
    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        self.layer.run(Call::on(OpKind::Receive, queue), || self.inner.receive_messages(queue, max, visibility)).await
    }
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        self.layer
            .run(Call::on(OpKind::DeleteMessage, queue), || self.inner.delete_message(queue, id, pop_receipt))
            .await
    }
    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        self.layer
            .run(Call::on(OpKind::ReleaseMessage, queue), || {
                self.inner.release_message(queue, id, pop_receipt, text, visible_after)
            })
            .await
    }
    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        self.layer.run(Call::on(OpKind::Count, queue), || self.inner.approximate_count(queue)).await
    }
}
