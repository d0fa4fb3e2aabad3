//! The in-memory store's own properties: page cutting, tokens. (Its behaviour
//! as a backend is the conformance suite's, in `tests/conformance.rs`.)

use futures::TryStreamExt;

use super::MemStore;
use crate::store::{pager, Entity, PartitionRange, RowRange, StoreError, TableStore, Value};

fn e(pk: &str, rk: &str, n: i32) -> Entity {
    Entity::new(pk, rk).with("n", Value::Int32(n))
}

/// `(page sizes, keys)` of a query followed through its tokens.
async fn follow(mut fetch: impl AsyncFnMut(Option<String>) -> crate::store::Page) -> (Vec<usize>, Vec<String>) {
    let (mut sizes, mut keys, mut token) = (Vec::new(), Vec::new(), None);
    loop {
        let page = fetch(token.take()).await;
        sizes.push(page.entities.len());
        keys.extend(page.entities.into_iter().map(|e| format!("{}/{}", e.partition_key, e.row_key)));
        match page.continuation {
            Some(next) => token = Some(next),
            None => return (sizes, keys),
        }
    }
}

async fn filled(store: MemStore) -> MemStore {
    store.create_table("pages").await.unwrap();
    for (pk, n) in [("p", 10), ("q", 5)] {
        for i in 0..n {
            store.insert("pages", &e(pk, &format!("{i:02}"), i)).await.unwrap();
        }
    }
    store
}

#[tokio::test]
async fn pages_split_exactly_at_the_limit() {
    let store = filled(MemStore::new()).await;
    let all = RowRange::default();
    let (sizes, _) = follow(async |t| store.query_partition("pages", "p", &all, 5, t.as_deref()).await.unwrap()).await;
    assert_eq!(sizes, [5, 5], "a page ending with the partition has no token");
    let (sizes, keys) = follow(async |t| store.scan("pages", 4, t.as_deref()).await.unwrap()).await;
    assert_eq!(sizes, [4, 4, 4, 3]);
    assert_eq!(keys.len(), 15);
}

#[tokio::test]
async fn short_pages_follow_a_fixed_pattern_and_lose_nothing() {
    let store = filled(MemStore::with_short_pages()).await;
    let all = RowRange::default();
    let (sizes, keys) =
        follow(async |t| store.query_partition("pages", "p", &all, 4, t.as_deref()).await.unwrap()).await;
    assert_eq!(sizes, [4, 0, 2, 4], "full, empty, half, full");
    assert_eq!(keys, (0..10).map(|i| format!("p/{i:02}")).collect::<Vec<_>>());
    let (sizes, keys) = follow(async |t| store.scan("pages", 4, t.as_deref()).await.unwrap()).await;
    assert_eq!(sizes, [4, 0, 2, 4, 0, 2, 3]);
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!((keys.len(), keys), (15, sorted));
    let range = PartitionRange { after: Some("p".into()), ..PartitionRange::default() };
    let q: Vec<Entity> =
        pager::range_pages(&store, "pages", &range, 1).map_ok(|page| page.entities).try_concat().await.unwrap();
    assert_eq!(q.len(), 5, "the pager follows empty pages");
    assert_eq!(
        store.count_range("pages", "p", &all).await.unwrap(),
        (10, Some("00".into())),
        "count_range is not paged"
    );
}

#[tokio::test]
async fn foreign_tokens_are_refused() {
    let store = filled(MemStore::new()).await;
    let all = RowRange::default();
    let token = store.query_partition("pages", "p", &all, 2, None).await.unwrap().continuation.unwrap();
    for (pk, token) in [("q", token.as_str()), ("p", "not-a-token"), ("p", "mem1.!!")] {
        let r = store.query_partition("pages", pk, &all, 2, Some(token)).await;
        assert!(matches!(r, Err(StoreError::InvalidInput(_))), "{pk} {token}: {r:?}");
    }
}
