//! Tests of the prefix scanner: seed 004's worked example, edge cases of NuGet Insights'
//! test suite (empty table, empty PartitionKey, PartitionKey equal to a prefix, surrogate
//! pairs, zero-row pages that carry a token), and a property test over random tables.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use proptest::prelude::*;

use super::*;
use crate::keys::cmp_utf16;
use crate::store::counting::CountingStore;
use crate::store::local::LocalStore;
use crate::store::{
    BatchOp, ETag, Entity, IfMatch, OpKind, Page, PartitionRange, RowRange, StoreError, StoreResult, TableStore,
};

const T: &str = "scantable";

async fn store_with(rows: &[(&str, &str)]) -> LocalStore {
    let s = LocalStore::in_memory().unwrap();
    s.create_table(T).await.unwrap();
    for (pk, rk) in rows {
        s.insert(T, &Entity::new(*pk, *rk)).await.unwrap();
    }
    s
}

fn keys(entities: &[Entity]) -> Vec<String> {
    entities.iter().map(|e| format!("{}/{}", e.partition_key, e.row_key)).collect()
}

/// Seed 004's table: last names as PartitionKeys, first names as RowKeys.
const SEED_TABLE: [(&str, &str); 10] = [
    ("Dashner", "Cleopatra"),
    ("Davis", "Gemma"),
    ("Davis", "Loralee"),
    ("Dodge", "Lowell"),
    ("Hartlage", "Marketta"),
    ("Nuckles", "Timmy"),
    ("Rundle", "Coleen"),
    ("Splawn", "Lise"),
    ("Wedell", "Annabelle"),
    ("Wongus", "Rosenda"),
];

#[tokio::test]
async fn the_seeds_worked_example_discovers_its_prefixes_with_its_queries() {
    let local = store_with(&SEED_TABLE).await;
    let store = CountingStore::new(Arc::new(local));
    let steps: Vec<(Step, StepOutput)> = walk(&store, T, 2).try_collect().await.unwrap();
    let got: Vec<(String, Vec<String>)> = steps.iter().map(|(s, o)| (s.to_string(), keys(&o.entities))).collect();
    let want: Vec<(&str, Vec<&str>)> = vec![
        // Seed step 1: no filter; learns D.
        ("no filter", vec!["Dashner/Cleopatra", "Davis/Gemma"]),
        // Seed follow-up 1: more Davis records?
        ("PK = 'Davis' and RK > 'Gemma'", vec!["Davis/Loralee"]),
        // Seed follow-up 2: more D* records? (inclusive upper bound, see the module docs)
        ("PK > 'Davis' and PK <= 'D\\u{ffff}'", vec!["Dodge/Lowell"]),
        // Seed step 2: skipping D; learns H and N.
        ("PK > 'D\\u{ffff}'", vec!["Hartlage/Marketta", "Nuckles/Timmy"]),
        // "Similar logic could be applied to N* and S*": both come back empty.
        ("PK = 'Nuckles' and RK > 'Timmy'", vec![]),
        ("PK > 'Nuckles' and PK <= 'N\\u{ffff}'", vec![]),
        // Seed step 3: skipping N; learns R and S.
        ("PK > 'N\\u{ffff}'", vec!["Rundle/Coleen", "Splawn/Lise"]),
        ("PK = 'Splawn' and RK > 'Lise'", vec![]),
        ("PK > 'Splawn' and PK <= 'S\\u{ffff}'", vec![]),
        // Seed step 4: skipping S; learns W, the last prefix (no continuation token).
        ("PK > 'S\\u{ffff}'", vec!["Wedell/Annabelle", "Wongus/Rosenda"]),
    ];
    let want: Vec<(String, Vec<String>)> =
        want.into_iter().map(|(q, r)| (q.to_string(), r.into_iter().map(String::from).collect())).collect();
    assert_eq!(got, want);
    // The prefixes discovered by the four top-level queries, and the three expanded.
    let top: Vec<&StepOutput> = steps
        .iter()
        .filter(|(s, _)| matches!(s, Step::Prefix { prefix, .. } if prefix.is_empty()))
        .map(|(_, o)| o)
        .collect();
    assert_eq!(top.len(), 4);
    let mut discovered: Vec<char> =
        top.iter().flat_map(|o| o.entities.iter().filter_map(|e| e.partition_key.chars().next())).collect();
    discovered.dedup();
    assert_eq!(discovered, ['D', 'H', 'N', 'R', 'S', 'W']);
    let expanded: Vec<&str> = steps
        .iter()
        .filter_map(|(s, _)| match s {
            Step::Prefix { prefix, .. } if !prefix.is_empty() => Some(prefix.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(expanded, ["D", "N", "S"]);
    // All ten entities, once each, in table order; one query per step.
    let all: Vec<String> = steps.iter().flat_map(|(_, o)| keys(&o.entities)).collect();
    let mut sorted: Vec<String> = SEED_TABLE.iter().map(|(p, r)| format!("{p}/{r}")).collect();
    sorted.sort();
    assert_eq!(all, sorted);
    let counts = store.counts().snapshot();
    assert_eq!(counts.op(OpKind::QueryPartitions), 7);
    assert_eq!(counts.op(OpKind::Query), 3);
}

#[tokio::test]
async fn keys_continuing_a_prefix_with_the_sentinel_are_not_lost() {
    // `D` + U+FFFF is exactly the bound of the D subtree; with an exclusive bound it would
    // fall between the subtree and the rest of the root range.
    let rows =
        [("D", "r"), ("Da", "r"), ("D\u{ffff}", "r"), ("D\u{ffff}a", "r"), ("D\u{ffff}\u{ffff}", "r"), ("E", "r")];
    let store = store_with(&rows).await;
    for segment in [1, 2, 3] {
        let got: Vec<Entity> = entities(&store, T, segment).take(rows.len() + 1).try_collect().await.unwrap();
        assert_eq!(keys(&got).len(), rows.len(), "segment {segment}: {:?}", keys(&got));
    }
}

#[tokio::test]
async fn empty_table_empty_partition_key_and_a_key_equal_to_its_prefix() {
    let store = store_with(&[]).await;
    let steps: Vec<(Step, StepOutput)> = walk(&store, T, 1).try_collect().await.unwrap();
    assert_eq!(steps.len(), 1, "an empty table is one query");
    assert!(steps[0].1.entities.is_empty() && steps[0].1.next.is_empty());

    let rows = [("", "a"), ("", "b"), ("a", "1"), ("a", "2"), ("ab", "1"), ("a😀", "1"), ("a😀b", "1"), ("b", "")];
    let store = store_with(&rows).await;
    for segment in [1, 2, 1000] {
        let got: Vec<Entity> = entities(&store, T, segment).try_collect().await.unwrap();
        let mut want: Vec<(String, String)> = rows.iter().map(|(p, r)| (p.to_string(), r.to_string())).collect();
        want.sort_by(|a, b| cmp_utf16(&a.0, &b.0).then_with(|| cmp_utf16(&a.1, &b.1)));
        let got: Vec<(String, String)> = got.into_iter().map(|e| (e.partition_key, e.row_key)).collect();
        assert_eq!(got, want, "segment {segment}");
    }
    // A surrogate pair is one character: the child prefix of `a😀b` under `a` is `a😀`.
    let out =
        run_step(&store, T, &Step::Prefix { prefix: "a".into(), lo: Some("ab".into()), hi: None }, 1).await.unwrap();
    assert_eq!(keys(&out.entities), ["a😀/1"]);
    assert!(out.next.contains(&Step::Prefix {
        prefix: "a😀".into(),
        lo: Some("a😀".into()),
        hi: Some("a😀\u{ffff}".into())
    }));
}

#[tokio::test]
async fn a_partition_larger_than_a_segment_is_paged_one_page_per_step() {
    let rows: Vec<(String, String)> = (0..25).map(|i| ("big".to_string(), format!("{i:02}"))).collect();
    let refs: Vec<(&str, &str)> = rows.iter().map(|(p, r)| (p.as_str(), r.as_str())).collect();
    let store = store_with(&refs).await;
    let steps: Vec<(Step, StepOutput)> = walk(&store, T, 4).try_collect().await.unwrap();
    assert!(steps.iter().all(|(_, o)| o.entities.len() <= 4));
    let partition_steps = steps.iter().filter(|(s, _)| matches!(s, Step::Partition { .. })).count();
    assert_eq!(
        partition_steps, 6,
        "after the first page of 4, 21 rows in pages of 4 (the last page ends the partition)"
    );
    let all: Vec<String> = steps.iter().flat_map(|(_, o)| keys(&o.entities)).collect();
    assert_eq!(all.len(), 25);
}

#[tokio::test]
async fn a_segment_outside_1_to_1000_is_refused_before_any_query() {
    let store = CountingStore::new(Arc::new(store_with(&[]).await));
    for segment in [0, 1001] {
        let err = run_step(&store, T, &Step::root(), segment).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidInput(m) if m.contains("segment") && m.contains("1..=1000")),
            "{err}"
        );
    }
    assert_eq!(store.counts().snapshot().total, 0);
}

#[test]
fn steps_travel_as_small_json() {
    let step = Step::Prefix { prefix: "D".into(), lo: Some("Davis".into()), hi: Some("D\u{ffff}".into()) };
    let json = serde_json::to_string(&step).unwrap();
    assert_eq!(json, "{\"step\":\"prefix\",\"prefix\":\"D\",\"lo\":\"Davis\",\"hi\":\"D\u{ffff}\"}");
    assert_eq!(serde_json::from_str::<Step>(&json).unwrap(), step);
    assert_eq!(serde_json::to_string(&Step::root()).unwrap(), "{\"step\":\"prefix\",\"prefix\":\"\"}");
    let p = Step::Partition { pk: "it's".into(), after: None };
    assert_eq!(serde_json::from_str::<Step>(&serde_json::to_string(&p).unwrap()).unwrap(), p);
    // The largest step: three keys of 512 UTF-16 units of 3-byte characters.
    let k = "\u{fffe}".repeat(512);
    let big = Step::Prefix { prefix: k.clone(), lo: Some(k.clone()), hi: Some(k) };
    assert!(serde_json::to_string(&big).unwrap().len() < crate::store::MAX_MESSAGE_BYTES / 8);
}

/// A store with the service's legal page quirks: empty pages that carry a token, short pages,
/// and a token after a full last page (NuGet Insights' memory stubs do the latter). It wraps
/// the embedded store; only the two query methods are changed.
struct Quirky {
    inner: LocalStore,
    calls: AtomicU64,
}

const DONE: &str = "done";

impl Quirky {
    async fn page<F, Fut>(&self, limit: usize, continuation: Option<&str>, fetch: F) -> StoreResult<Page>
    where
        F: FnOnce(usize, Option<String>) -> Fut,
        Fut: std::future::Future<Output = StoreResult<Page>>,
    {
        let inner_token = match continuation {
            Some(DONE) => return Ok(Page::default()),
            Some(t) => t.strip_prefix("q|").map(String::from).filter(|t| !t.is_empty()),
            None => None,
        };
        let limit = limit.clamp(1, crate::store::MAX_PAGE);
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if n % 3 == 0 {
            return Ok(Page {
                entities: Vec::new(),
                continuation: Some(format!("q|{}", inner_token.unwrap_or_default())),
            });
        }
        let ask = if n % 3 == 1 { limit.div_ceil(2) } else { limit };
        let page = fetch(ask, inner_token).await?;
        let continuation = match page.continuation {
            Some(t) => Some(format!("q|{t}")),
            None if page.entities.len() == limit => Some(DONE.to_string()),
            None => None,
        };
        Ok(Page { entities: page.entities, continuation })
    }
}

#[async_trait]
impl TableStore for Quirky {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        self.inner.create_table(table).await
    }
    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        self.inner.delete_table(table).await
    }
    async fn get(&self, table: &str, pk: &str, rk: &str) -> StoreResult<Option<Entity>> {
        self.inner.get(table, pk, rk).await
    }
    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.inner.insert(table, entity).await
    }
    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.inner.upsert(table, entity).await
    }
    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        self.inner.replace(table, entity, if_match).await
    }
    async fn delete(&self, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
        self.inner.delete(table, pk, rk, if_match).await
    }
    async fn query_partition(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.page(limit, continuation, |n, t| async move {
            self.inner.query_partition(table, pk, range, n, t.as_deref()).await
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
        self.page(limit, continuation, |n, t| async move {
            self.inner.query_partitions(table, range, n, t.as_deref()).await
        })
        .await
    }
    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.inner.scan(table, limit, continuation).await
    }
    async fn batch(&self, table: &str, pk: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        self.inner.batch(table, pk, ops).await
    }
}

/// Key pieces: ASCII, our `%XX` escapes, `_`, digits, non-ASCII BMP characters (below and
/// above the surrogate range), astral characters (surrogate pairs) and U+FFFF itself.
fn key() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "A", "D", "a", "z", "~", "%41", "%25", "%2F", "_", "0", "4_", "9", "é", "ー", "\u{e000}", "\u{fffe}",
        "\u{ffff}", "😀", "𐐷",
    ]);
    prop::collection::vec(atoms, 0..4).prop_map(|v| v.concat())
}

fn le_keys(a: (&str, &str), b: (&str, &str)) -> bool {
    cmp_utf16(a.0, b.0).then_with(|| cmp_utf16(a.1, b.1)).is_le()
}

/// Checks one random table: every entity once, in order, and every executed step's range
/// split exactly into what it returned and its children's ranges (on every table key, every
/// probe key and every bound the steps used).
async fn check_table(rows: Vec<(String, String)>, probes: Vec<(String, String)>, segment: usize, quirks: bool) {
    let local = LocalStore::in_memory().unwrap();
    local.create_table(T).await.unwrap();
    let mut want: Vec<(String, String)> = rows;
    want.sort_by(|a, b| cmp_utf16(&a.0, &b.0).then_with(|| cmp_utf16(&a.1, &b.1)));
    want.dedup();
    for (pk, rk) in &want {
        local.insert(T, &Entity::new(pk.clone(), rk.clone())).await.unwrap();
    }
    let quirky = Quirky { inner: local.clone(), calls: AtomicU64::new(0) };
    let store: &dyn TableStore = if quirks { &quirky } else { &local };
    // Each step that returns entities makes at most three children; one that returns none
    // makes none. One step more than that bound proves a runaway walk without hanging.
    let bound = 1 + 3 * want.len();
    let steps: Vec<(Step, StepOutput)> = walk(store, T, segment).take(bound + 1).try_collect().await.unwrap();
    assert!(steps.len() <= bound, "more than {bound} steps for {} entities", want.len());
    let got: Vec<(String, String)> = steps
        .iter()
        .flat_map(|(_, o)| o.entities.iter().map(|e| (e.partition_key.clone(), e.row_key.clone())))
        .collect();
    assert_eq!(got, want, "every entity once, in table order");

    let mut probe_keys: Vec<(String, String)> = want.into_iter().chain(probes).collect();
    for (s, _) in &steps {
        if let Step::Prefix { lo, hi, .. } = s {
            for b in lo.iter().chain(hi.iter()) {
                probe_keys.push((b.clone(), String::new()));
                probe_keys.push((b.clone(), "zz".into()));
            }
        }
    }
    for (step, out) in &steps {
        assert!(out.entities.len() <= segment);
        let last = out.entities.last().map(|e| (e.partition_key.as_str(), e.row_key.as_str()));
        for (pk, rk) in &probe_keys {
            let children = out.next.iter().filter(|c| c.contains(pk, rk)).count();
            if !step.contains(pk, rk) {
                assert_eq!(children, 0, "{step}: a child covers ({pk:?}, {rk:?}) outside its parent");
                continue;
            }
            let in_page = out.next.is_empty() || last.is_some_and(|l| le_keys((pk, rk), l));
            assert_eq!(
                usize::from(in_page) + children,
                1,
                "{step}: ({pk:?}, {rk:?}) covered {} times",
                usize::from(in_page) + children
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn every_entity_is_visited_once_and_step_ranges_never_overlap(
        rows in prop::collection::vec((key(), key()), 0..40),
        probes in prop::collection::vec((key(), key()), 0..20),
        segment in prop_oneof![1..=5usize, Just(1000usize)],
        quirks in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check_table(rows, probes, segment, quirks));
    }
}
