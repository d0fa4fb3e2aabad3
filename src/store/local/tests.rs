//! Group commit: what shares a transaction, what one failing request may roll back, what a
//! dead writer answers, and that reads of a file store do not wait for the writer.
//!
//! Interleavings are made exact with a "gate": a request that holds the writer thread until
//! the test opens it, so every request sent meanwhile is queued for the gate's group.

use std::sync::mpsc;
use std::time::Duration;

use futures::future::join_all;

use super::super::error::StoreError;
use super::super::queue::QueueStore;
use super::super::table::{BatchOp, IfMatch, TableStore};
use super::super::value::{Entity, Value};
use super::{Durability, LocalStore};

fn e(pk: &str, rk: &str, n: i32) -> Entity {
    Entity::new(pk, rk).with("n", Value::Int32(n))
}

/// Holds the writer thread inside a request until the returned sender is used (or dropped).
/// Returns once the writer is inside the gate.
async fn close_gate(store: &LocalStore) -> (mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
    let (open_tx, open_rx) = mpsc::channel::<()>();
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = store.writer.clone();
    let task = tokio::spawn(async move {
        let held = writer.call(move |_| {
            let _ = inside_tx.send(());
            let _ = open_rx.recv();
            Ok(())
        });
        let _ = held.await;
    });
    inside_rx.await.expect("the writer runs the gate");
    (open_tx, task)
}

#[tokio::test]
async fn queued_writes_share_one_commit_and_failures_roll_back_only_themselves() {
    let store = LocalStore::in_memory().unwrap();
    store.create_table("groups").await.unwrap();
    let taken = store.insert("groups", &e("p", "taken", 0)).await.unwrap();
    let (open, gate) = close_gate(&store).await;
    let before = store.write_stats();
    let mut writes = Vec::new();
    for i in 0..100 {
        let s = store.clone();
        writes.push(Box::pin(async move { s.insert("groups", &e("p", &format!("{i:03}"), i)).await.map(|_| ()) })
            as futures::future::BoxFuture<'static, Result<(), StoreError>>);
    }
    // Fail on their own, inside the same group: a 409, a 412, and a batch failing at its
    // second operation after its first wrote.
    let s = store.clone();
    writes.push(Box::pin(async move { s.insert("groups", &e("p", "taken", 1)).await.map(|_| ()) }));
    let s = store.clone();
    let stale = IfMatch::Etag(crate::store::value::ETag("W/\"stale\"".into()));
    writes.push(Box::pin(async move { s.replace("groups", &e("p", "taken", 2), &stale).await.map(|_| ()) }));
    let s = store.clone();
    let ops = vec![BatchOp::Insert(e("p", "b1", 0)), BatchOp::Insert(e("p", "taken", 0))];
    writes.push(Box::pin(async move { s.batch("groups", "p", &ops).await.map(|_| ()) }));
    // `join!` polls the writes first (each sends its request), then opens the gate.
    let (results, ()) = futures::join!(join_all(writes), async move { open.send(()).unwrap() });
    gate.await.unwrap();
    let after = store.write_stats();
    assert_eq!(after.requests - before.requests, 104, "the gate and 103 queued requests ran");
    assert_eq!(after.commits - before.commits, 1, "the gate's group holds every queued request");
    assert!(results[..100].iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    assert!(matches!(results[100], Err(StoreError::AlreadyExists(_))), "{:?}", results[100]);
    assert!(matches!(results[101], Err(StoreError::PreconditionFailed(_))), "{:?}", results[101]);
    assert!(matches!(results[102], Err(StoreError::BatchFailed { index: 1, .. })), "{:?}", results[102]);
    assert_eq!(store.get("groups", "p", "b1").await.unwrap(), None, "the failed batch wrote nothing");
    let kept = store.get("groups", "p", "taken").await.unwrap().expect("still there");
    assert_eq!((kept.etag, kept.properties["n"].clone()), (Some(taken), Value::Int32(0)));
    for i in [0, 57, 99] {
        assert!(store.get("groups", "p", &format!("{i:03}")).await.unwrap().is_some(), "write {i} committed");
    }
}

#[tokio::test]
async fn concurrent_conditional_replaces_let_exactly_one_win() {
    let store = LocalStore::in_memory().unwrap();
    store.create_table("race").await.unwrap();
    let v1 = IfMatch::Etag(store.insert("race", &e("p", "r", 0)).await.unwrap());
    let tasks: Vec<_> = (1..=32)
        .map(|i| {
            let (s, m) = (store.clone(), v1.clone());
            tokio::spawn(async move { s.replace("race", &e("p", "r", i), &m).await })
        })
        .collect();
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => won += 1,
            Err(StoreError::PreconditionFailed(_)) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(won, 1, "one replace with the first ETag wins, the others get 412");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_receivers_never_get_the_same_message() {
    let store = LocalStore::in_memory().unwrap();
    store.create_queue("recv").await.unwrap();
    for i in 0..200 {
        store.put_message("recv", &format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let batch = s.receive_messages("recv", 7, Duration::from_secs(600)).await.unwrap();
                    if batch.is_empty() {
                        return got;
                    }
                    got.extend(batch.into_iter().map(|m| m.text));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!((before, all.len()), (200, 200), "each message received once");
}

fn gone<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::Other(m)) if m.contains("writer thread has stopped"))
}

#[tokio::test]
async fn a_dead_writer_is_an_error_not_a_hang() {
    let store = LocalStore::in_memory().unwrap();
    store.create_table("dead").await.unwrap();
    let (open, gate) = close_gate(&store).await;
    // Queued behind the gate: the writer stops before it runs them.
    store.writer.kill();
    let entity = e("p", "queued", 0);
    let queued = store.insert("dead", &entity);
    let (queued, ()) = futures::join!(queued, async move { open.send(()).unwrap() });
    gate.await.unwrap();
    assert!(gone(&queued), "{queued:?}");
    let later = store.insert("dead", &e("p", "later", 0)).await;
    assert!(gone(&later), "{later:?}");
    assert!(gone(&store.get("dead", "p", "later").await), "in-memory reads go through the writer");
}

#[tokio::test]
async fn a_panicking_request_is_rolled_back_and_the_writer_goes_on() {
    let store = LocalStore::in_memory().unwrap();
    store.create_table("panics").await.unwrap();
    let r: Result<(), StoreError> = store
        .writer
        .call(|c| {
            super::sql::create_table(c, "halfway")?;
            panic!("a bug inside a request");
        })
        .await;
    assert!(matches!(&r, Err(StoreError::Other(m)) if m.contains("panic")), "{r:?}");
    assert!(matches!(store.get("halfway", "p", "r").await, Err(StoreError::NotFound(_))), "rolled back");
    store.insert("panics", &e("p", "r", 1)).await.expect("the writer still works");
}

#[tokio::test]
async fn file_store_reads_do_not_wait_for_the_writer_and_see_acknowledged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), Durability::Full).unwrap();
    store.create_table("reads").await.unwrap();
    store.insert("reads", &e("p", "acked", 1)).await.unwrap();
    let (open, gate) = close_gate(&store).await;
    // The writer is held: a read still completes, and sees the acknowledged write. (The
    // timeout only turns a regression into a failure instead of a hang.)
    let read = tokio::time::timeout(Duration::from_secs(60), store.get("reads", "p", "acked")).await;
    let got = read.expect("a read does not queue behind the writer").unwrap();
    assert_eq!(got.map(|g| g.properties["n"].clone()), Some(Value::Int32(1)));
    open.send(()).unwrap();
    gate.await.unwrap();
    // Read-after-write from another clone, right after the acknowledgement.
    let other = store.clone();
    store.upsert("reads", &e("p", "acked", 2)).await.unwrap();
    let seen = other.get("reads", "p", "acked").await.unwrap().unwrap();
    assert_eq!(seen.properties["n"], Value::Int32(2));
}

/// A verify job with 8 workers ran every point read on a blocking thread of its own (517
/// threads) and opened a connection for each read beyond the pool of 16: concurrent reads
/// must run at most `MAX_READERS` at once, on at most that many connections, and all of them
/// still complete. (Each read holds its slot for a few milliseconds so that they overlap.)
#[tokio::test]
async fn many_concurrent_reads_do_not_open_a_connection_each() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), Durability::Process).unwrap();
    store.create_table("reads").await.unwrap();
    store.insert("reads", &e("p", "r", 7)).await.unwrap();
    let readers = store.readers.clone().expect("a file store has read connections");
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let reads = (0..64).map(|_| {
        let (running, most) = (running.clone(), most.clone());
        readers.call(move |conn| {
            most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            running.fetch_sub(1, Ordering::SeqCst);
            super::sql::get(conn, "reads", "p", "r")
        })
    });
    for got in join_all(reads).await {
        assert_eq!(got.unwrap().map(|g| g.properties["n"].clone()), Some(Value::Int32(7)));
    }
    let (most, opened) = (most.load(Ordering::SeqCst), readers.opened());
    assert!(most <= super::readers::MAX_READERS, "{most} reads ran at once");
    assert!(opened <= super::readers::MAX_READERS, "{opened} connections opened for 64 reads");
}

/// Checkpoints ran inside the writer's commits, holding every queued write for the copy and
/// the database fsync: the checkpoint thread copies the log into the database file while the
/// writer thread is busy (held here inside a request, so it cannot checkpoint itself).
#[tokio::test]
async fn the_log_is_checkpointed_while_the_writer_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), Durability::Full).unwrap();
    let db = dir.path().join("catalog.sqlite3");
    store.create_table("ckpt").await.unwrap();
    let before = std::fs::metadata(&db).unwrap().len();
    let payload = "x".repeat(1000);
    for i in 0..200 {
        let row = Entity::new("p", format!("{i:04}")).with("s", Value::String(payload.clone()));
        store.insert("ckpt", &row).await.unwrap();
    }
    let (open, gate) = close_gate(&store).await;
    // 200 rows of 1 KB are in the log; the database file holds them once checkpointed. (The
    // bound only turns a regression into a failure instead of a hang.)
    let mut waited = Duration::ZERO;
    while std::fs::metadata(&db).unwrap().len() < before + 200 * 1000 {
        assert!(waited < Duration::from_secs(60), "no checkpoint while the writer was held ({before} bytes)");
        crate::env::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    open.send(()).unwrap();
    gate.await.unwrap();
    assert_eq!(
        store.get("ckpt", "p", "0199").await.unwrap().map(|g| g.properties["s"].clone()),
        Some(Value::String(payload))
    );
}
