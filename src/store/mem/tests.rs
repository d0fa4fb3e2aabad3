//! The in-memory store's own properties: determinism, page cutting, tokens. (Its behaviour
//! as a backend is the conformance suite's, in `tests/suite/conformance.rs`.)

use std::time::Duration;

use futures::TryStreamExt;

use super::MemStore;
use crate::store::error::StoreError;
use crate::store::page::{PartitionRange, RowRange};
use crate::store::pager;
use crate::store::queue::QueueStore;
use crate::store::table::{BatchOp, IfMatch, TableStore};
use crate::store::value::{Entity, Value};

fn e(pk: &str, rk: &str, n: i32) -> Entity {
    Entity::new(pk, rk).with("n", Value::Int32(n))
}

/// A fixed sequence of table and queue operations, sleeping past a visibility timeout;
/// every answer (ETags, ids, receipts, errors, pages, elapsed time) as text.
async fn script(store: &MemStore) -> Vec<String> {
    let mut log = Vec::new();
    let start = crate::env::now();
    store.create_table("Sim").await.unwrap();
    let a = store.insert("sim", &e("p", "a", 1)).await;
    log.push(format!("{a:?}"));
    log.push(format!("{:?}", store.upsert("sim", &e("p", "b", 2)).await));
    log.push(format!("{:?}", store.insert("sim", &e("p", "a", 3)).await));
    let ops = [
        BatchOp::Replace(e("p", "a", 4), IfMatch::Any),
        BatchOp::Insert(e("p", "c", 5)),
        BatchOp::Delete { row_key: "b".into(), if_match: IfMatch::Any },
    ];
    log.push(format!("{:?}", store.batch("sim", "p", &ops).await));
    let failing = [BatchOp::Insert(e("p", "d", 6)), BatchOp::Insert(e("p", "a", 7))];
    log.push(format!("{:?}", store.batch("sim", "p", &failing).await));
    log.push(format!("{:?}", store.replace("sim", &e("p", "a", 8), &IfMatch::Etag(a.unwrap())).await));
    let first = store.scan("sim", 1, None).await.unwrap();
    log.push(format!("{first:?}"));
    log.push(format!("{:?}", store.scan("sim", 1, first.continuation.as_deref()).await));

    store.create_queue("work").await.unwrap();
    log.push(format!("{:?}", store.put_message("work", "one", Duration::ZERO).await));
    log.push(format!("{:?}", store.put_message("work", "two", Duration::from_secs(10)).await));
    let one = store.receive_messages("work", 32, Duration::from_secs(30)).await.unwrap();
    log.push(format!("{one:?}"));
    crate::env::sleep(Duration::from_secs(10)).await;
    log.push(format!("{:?}", store.receive_messages("work", 32, Duration::from_secs(30)).await));
    // 31 s after the first receive: "one"'s 30 s visibility timeout has ended.
    crate::env::sleep(Duration::from_secs(21)).await;
    let again = store.receive_messages("work", 32, Duration::from_secs(30)).await.unwrap();
    log.push(format!("{again:?}"));
    log.push(format!("{:?}", store.delete_message("work", &one[0].id, &one[0].pop_receipt).await));
    let released =
        store.release_message("work", &again[0].id, &again[0].pop_receipt, "one", Duration::from_secs(5)).await;
    log.push(format!("{released:?}"));
    log.push(format!("{:?}", store.approximate_count("work").await));
    log.push(format!("elapsed {:?}", start.elapsed()));
    log
}

/// The same operations on two fresh stores give the same ETags, ids, receipts and answers,
/// and the visibility timeout follows tokio's paused clock, not real time.
#[tokio::test(start_paused = true)]
async fn same_operations_same_execution() {
    let first = script(&MemStore::new()).await;
    let second = script(&MemStore::new()).await;
    assert_eq!(first, second);
    // Counters, not time or randomness: the first write is W/"1", the first message msg-1.
    assert_eq!(first[0], r#"Ok(ETag("W/\"1\""))"#);
    assert_eq!(first[8], r#"Ok("msg-1")"#);
    // The batch failed at its second operation and wrote nothing (no "d" in the scan).
    assert!(first[4].starts_with("Err(BatchFailed { index: 1, source: AlreadyExists("), "{}", first[4]);
    assert!(first[5].starts_with("Err(PreconditionFailed("), "{}", first[5]);
    // "one" hidden, then "two" after its delay, then "one" again after 30 s, received twice.
    assert!(first[10].contains(r#"id: "msg-1""#) && first[10].contains("dequeue_count: 1"), "{}", first[10]);
    assert!(first[11].contains(r#"id: "msg-2""#) && !first[11].contains("msg-1"), "{}", first[11]);
    assert!(first[12].contains(r#"id: "msg-1""#) && first[12].contains("dequeue_count: 2"), "{}", first[12]);
    assert!(first[13].starts_with("Err(PreconditionFailed("), "stale receipt: {}", first[13]);
    assert_eq!(first[15], "Ok(2)");
    assert_eq!(first.last().unwrap(), "elapsed 31s", "paused time moves only by the sleeps");
}

/// `(page sizes, keys)` of a query followed through its tokens.
async fn follow(mut fetch: impl AsyncFnMut(Option<String>) -> crate::store::page::Page) -> (Vec<usize>, Vec<String>) {
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
        store.count_range("pages", "p", &all, u64::MAX).await.unwrap(),
        (10, Some("00".into())),
        "count_range is not paged"
    );
}

#[tokio::test(start_paused = true)]
async fn random_short_pages_cut_first_pages_too_and_lose_nothing() {
    let _seeded = crate::env::simulate(7, 0); // the cuts replay from the seed
    let store = filled(MemStore::with_random_short_pages(0.5)).await;
    let all = RowRange::default();
    let expected: Vec<String> = (0..10).map(|i| format!("p/{i:02}")).collect();
    let mut empty_first = 0;
    let mut sizes_seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let (sizes, keys) =
            follow(async |t| store.query_partition("pages", "p", &all, 4, t.as_deref()).await.unwrap()).await;
        assert_eq!(keys, expected, "nothing lost, nothing repeated, in order");
        assert!(sizes.iter().all(|&n| n <= 4), "{sizes:?}");
        empty_first += usize::from(sizes[0] == 0);
        sizes_seen.extend(sizes);
    }
    // A cut draws 0..=3 entities with probability 1/2: about 1 first page in 8 is empty.
    assert!((5..=60).contains(&empty_first), "empty first pages: {empty_first} of 200");
    assert_eq!(sizes_seen.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    let full = filled(MemStore::with_random_short_pages(0.0)).await;
    let (sizes, _) = follow(async |t| full.query_partition("pages", "p", &all, 4, t.as_deref()).await.unwrap()).await;
    assert_eq!(sizes, [4, 4, 2], "probability 0: pages as without cuts");
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
