//! [`TableStore`] on `azure_data_tables`, plus our own `$batch`.

use async_trait::async_trait;
use azure_core::headers::{HeaderName, Headers, ACCEPT, CONTENT_TYPE};
use azure_core::prelude::Continuable as _;
use azure_core::{Context, Etag, Method};
use azure_data_tables::clients::{EntityClient, TableClient};
use azure_data_tables::IfMatchCondition;
use azure_storage::clients::ServiceType;
use futures::StreamExt as _;

use super::batch::{self, BatchBody};
use super::entity::{
    decode_continuation, encode_continuation, escape_quotes, from_json, partition_filter, partitions_filter,
    same_properties, to_body, to_json, JsonEntity,
};
use super::error::{http_status, map_error};
use super::{check_table_name, AzureStore};
use crate::store::error::{StoreError, StoreResult};
use crate::store::page::{count_pages, Page, PartitionRange, RowRange, MAX_PAGE};
use crate::store::table::{validate_batch, BatchOp, IfMatch, TableStore};
use crate::store::value::{ETag, Entity};

/// True for the error code of a missing table (as opposed to a missing entity).
fn is_table_not_found(code: Option<&str>) -> bool {
    code.is_some_and(|c| c.eq_ignore_ascii_case("TableNotFound"))
}

fn condition(if_match: &IfMatch) -> IfMatchCondition {
    match if_match {
        IfMatch::Any => IfMatchCondition::Any,
        IfMatch::Etag(ETag(e)) => IfMatchCondition::Etag(Etag::from(e.clone())),
    }
}

/// What a point operation found when the service answered 404.
enum Found<T> {
    Yes(T),
    /// The entity (not the table) is missing; the error to report if that is wrong.
    NoEntity(StoreError),
}

impl AzureStore {
    fn table_client(&self, table: &str) -> StoreResult<TableClient> {
        check_table_name(table)?;
        Ok(self.tables.table_client(table))
    }

    /// The crate puts keys into the address verbatim, so quotes are doubled here.
    fn entity_client(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<EntityClient> {
        Ok(self
            .table_client(table)?
            .partition_key_client(escape_quotes(partition_key))
            .entity_client(escape_quotes(row_key)))
    }

    /// Result of a point operation: 404 for a missing entity becomes `NoEntity`, anything
    /// else an error.
    fn found<T>(result: azure_core::Result<T>, what: &str) -> StoreResult<Found<T>> {
        match result {
            Ok(v) => Ok(Found::Yes(v)),
            Err(e) => match http_status(&e) {
                Some((404, code)) if !is_table_not_found(code) => Ok(Found::NoEntity(map_error(&e, what))),
                _ => Err(map_error(&e, what)),
            },
        }
    }

    async fn query_page(
        &self,
        table: &str,
        filter: Option<String>,
        select: Option<&'static str>,
        limit: usize,
        continuation: Option<&str>,
        what: &str,
    ) -> StoreResult<Page> {
        let client = &self.table_client(table)?;
        let limit = u32::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(MAX_PAGE as u32);
        let resume = continuation.map(decode_continuation).transpose()?;
        let (filter, resume) = (&filter, &resume);
        let out = self
            .retry
            .run(what, || async move {
                // `top` is the page size, re-sent on every page: take exactly one page.
                let mut query = client.query().top(limit);
                if let Some(f) = filter {
                    query = query.filter(f.clone());
                }
                if let Some(columns) = select {
                    query = query.select(columns);
                }
                if let Some((next_pk, next_rk)) = resume {
                    query = query.initial_partition_key(next_pk.clone());
                    if let Some(rk) = next_rk {
                        query = query.initial_row_key(rk.clone());
                    }
                }
                let mut pages = query.into_stream::<JsonEntity>();
                match pages.next().await {
                    None => Ok((Vec::new(), None)),
                    Some(Ok(page)) => {
                        let next = page.continuation();
                        Ok((page.entities, next))
                    }
                    Some(Err(e)) => Err(map_error(&e, what)),
                }
            })
            .await;
        let (entities, next) = out.result?;
        Ok(Page {
            entities: entities.into_iter().map(|m| from_json(m, None)).collect::<StoreResult<_>>()?,
            continuation: next.as_ref().map(encode_continuation),
        })
    }

    /// Sends one `$batch` request through the signed pipeline; returns the response's
    /// content type and body.
    async fn send_batch(&self, body: &BatchBody) -> StoreResult<(Option<String>, String)> {
        const WHAT: &str = "batch";
        let url = batch::url_with_segment(&self.info.table_endpoint, "$batch")?;
        let mut headers = Headers::new();
        headers.insert(CONTENT_TYPE, body.content_type.clone());
        headers.insert(ACCEPT, "application/json;odata=minimalmetadata");
        headers.insert(HeaderName::from_static("dataserviceversion"), "3.0;");
        headers.insert(HeaderName::from_static("maxdataserviceversion"), "3.0;NetFx");
        let mut request =
            azure_storage::clients::finalize_request(url, Method::Post, headers, Some(body.body.clone().into()))
                .map_err(|e| map_error(&e, WHAT))?;
        let mut ctx = Context::new();
        ctx.insert(ServiceType::Table);
        let response = self.table_pipeline.send(&ctx, &mut request).await.map_err(|e| map_error(&e, WHAT))?;
        let content_type = response.headers().get_optional_string(&CONTENT_TYPE);
        let bytes = response.into_body().collect().await.map_err(|e| map_error(&e, WHAT))?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| StoreError::Other(format!("{WHAT}: the response is not UTF-8")))?;
        Ok((content_type, text))
    }

    /// A batch of one operation is that operation (atomic by itself), sent as a plain
    /// request: one round trip without multipart, and immune to Azurite's `$batch` address
    /// parser, which splits keys containing `RowKey='` or `',` at the wrong place (its
    /// regular expressions do not honour doubled quotes). Failures of the operation are
    /// reported as `BatchFailed { index: 0 }`, like those of a multipart batch.
    async fn single_operation_batch(
        &self,
        table: &str,
        partition_key: &str,
        op: &BatchOp,
    ) -> StoreResult<Vec<Option<ETag>>> {
        if let BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) = op {
            to_json(e)?; // local validation errors stay InvalidInput
        }
        let result = match op {
            BatchOp::Insert(e) => self.insert(table, e).await.map(Some),
            BatchOp::Upsert(e) => self.upsert(table, e).await.map(Some),
            BatchOp::Replace(e, if_match) => self.replace(table, e, if_match).await.map(Some),
            BatchOp::Delete { row_key, if_match } => {
                self.delete(table, partition_key, row_key, if_match).await.map(|()| None)
            }
        };
        match result {
            Ok(etag) => Ok(vec![etag]),
            // The request as a whole did not go through: not an operation failure.
            Err(e @ StoreError::Unavailable(_)) => Err(e),
            Err(source) => Err(StoreError::BatchFailed { index: 0, source: Box::new(source) }),
        }
    }

    /// After a transient failure and a retry that conflicted: is the whole batch's effect
    /// already there (the first attempt committed)? Returns the current ETags if so.
    async fn batch_already_applied(
        &self,
        table: &str,
        partition_key: &str,
        ops: &[BatchOp],
    ) -> StoreResult<Option<Vec<Option<ETag>>>> {
        let mut etags = Vec::with_capacity(ops.len());
        for op in ops {
            let current = self.get(table, partition_key, op.row_key()).await?;
            match (op, current) {
                (BatchOp::Delete { .. }, None) => etags.push(None),
                (BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _), Some(c))
                    if same_properties(&c.properties, &e.properties) =>
                {
                    etags.push(c.etag)
                }
                _ => return Ok(None),
            }
        }
        Ok(Some(etags))
    }

    /// After a transient failure and a retry that conflicted: does the entity hold exactly
    /// what we wrote (the first attempt committed)? Returns its ETag if so.
    async fn write_already_applied(&self, table: &str, entity: &Entity) -> StoreResult<Option<ETag>> {
        Ok(match self.get(table, &entity.partition_key, &entity.row_key).await? {
            Some(current) if same_properties(&current.properties, &entity.properties) => current.etag,
            _ => None,
        })
    }
}

#[async_trait]
impl TableStore for AzureStore {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        let client = &self.table_client(table)?;
        self.retry
            .run_idempotent("create table", |e| matches!(e, StoreError::AlreadyExists(_)), || client.create())
            .await
    }

    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        let client = &self.table_client(table)?;
        self.retry.run_idempotent("delete table", |e| matches!(e, StoreError::NotFound(_)), || client.delete()).await
    }

    async fn get(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Option<Entity>> {
        const WHAT: &str = "get entity";
        let client = &self.entity_client(table, partition_key, row_key)?;
        let out = self.retry.run(WHAT, || async move { Self::found(client.get::<JsonEntity>().await, WHAT) }).await;
        match out.result? {
            Found::Yes(response) => Ok(Some(from_json(response.entity, Some(ETag(response.etag.to_string())))?)),
            Found::NoEntity(_) => Ok(None),
        }
    }

    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        const WHAT: &str = "insert entity";
        let body = &to_body(entity)?;
        let client = &self.table_client(table)?;
        let out = self
            .retry
            .run(WHAT, || async move {
                let request = client.insert::<_, JsonEntity>(body).map_err(|e| map_error(&e, WHAT))?;
                let response = request.await.map_err(|e| map_error(&e, WHAT))?;
                Ok(ETag(response.etag.to_string()))
            })
            .await;
        match out.result {
            // A retried POST can conflict with its own earlier, committed attempt.
            Err(StoreError::AlreadyExists(msg)) if out.after_transient => {
                match self.write_already_applied(table, entity).await? {
                    Some(etag) => Ok(etag),
                    None => Err(StoreError::AlreadyExists(msg)),
                }
            }
            other => other,
        }
    }

    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        const WHAT: &str = "upsert entity";
        let body = &to_body(entity)?;
        let client = &self.entity_client(table, &entity.partition_key, &entity.row_key)?;
        let out = self
            .retry
            .run(WHAT, || async move {
                let request = client.insert_or_replace(body).map_err(|e| map_error(&e, WHAT))?;
                let response = request.await.map_err(|e| map_error(&e, WHAT))?;
                Ok(ETag(response.etag.to_string()))
            })
            .await;
        out.result
    }

    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        const WHAT: &str = "replace entity";
        let body = &to_body(entity)?;
        let client = &self.entity_client(table, &entity.partition_key, &entity.row_key)?;
        let out = self
            .retry
            .run(WHAT, || async move {
                // Always with If-Match: the crate's update without one would be an upsert.
                let request = client.update(body, condition(if_match)).map_err(|e| map_error(&e, WHAT))?;
                let response = request.await.map_err(|e| map_error(&e, WHAT))?;
                Ok(ETag(response.etag.to_string()))
            })
            .await;
        match out.result {
            // Our own committed first attempt changed the ETag.
            Err(StoreError::PreconditionFailed(msg)) if out.after_transient => {
                match self.write_already_applied(table, entity).await? {
                    Some(etag) => Ok(etag),
                    None => Err(StoreError::PreconditionFailed(msg)),
                }
            }
            other => other,
        }
    }

    async fn delete(&self, table: &str, partition_key: &str, row_key: &str, if_match: &IfMatch) -> StoreResult<()> {
        const WHAT: &str = "delete entity";
        let client = &self.entity_client(table, partition_key, row_key)?;
        let out = self
            .retry
            .run(WHAT, || async move { Self::found(client.delete().if_match(condition(if_match)).await, WHAT) })
            .await;
        match out.result? {
            Found::Yes(_) => Ok(()),
            // Gone after a transient failure: our own first attempt deleted it.
            Found::NoEntity(_) if out.after_transient => Ok(()),
            Found::NoEntity(e) => Err(e),
        }
    }

    async fn query_partition(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let filter = partition_filter(partition_key, range);
        self.query_page(table, Some(filter), None, limit, continuation, "query partition").await
    }

    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.query_page(table, partitions_filter(range), None, limit, continuation, "query partitions").await
    }

    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.query_page(table, None, None, limit, continuation, "scan table").await
    }

    async fn count_range(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        let filter = partition_filter(partition_key, range);
        let keys_only = Some("PartitionKey,RowKey");
        count_pages(cap, |token| {
            let filter = Some(filter.clone());
            async move { self.query_page(table, filter, keys_only, MAX_PAGE, token.as_deref(), "count").await }
        })
        .await
    }

    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        const WHAT: &str = "batch";
        validate_batch(partition_key, ops)?;
        check_table_name(table)?;
        if let [op] = ops {
            return self.single_operation_batch(table, partition_key, op).await;
        }
        let body = &batch::build(&self.info.table_endpoint, table, partition_key, ops)?;
        let out = self
            .retry
            .run(WHAT, || async move {
                let (content_type, text) = self.send_batch(body).await?;
                batch::interpret(ops, &batch::parse_response(content_type.as_deref(), &text), WHAT)
            })
            .await;
        match out.result {
            Err(StoreError::BatchFailed { index, source }) if out.after_transient => {
                let conflict = matches!(
                    *source,
                    StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_)
                );
                if conflict {
                    if let Some(etags) = self.batch_already_applied(table, partition_key, ops).await? {
                        return Ok(etags);
                    }
                }
                Err(StoreError::BatchFailed { index, source })
            }
            other => other,
        }
    }
}
