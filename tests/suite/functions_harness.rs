//! The Functions app end to end, with a test harness playing the Azure Functions host
//! (`tests/suite/harness`: the host cannot be installed here) and Azurite as the storage account.
//!
//! The harness starts the `table-catalog` binary as the custom handler from `host.json` and
//! `local.settings.json`, proxies (or forwards) HTTP requests to it, delivers apply-queue
//! messages with the host's payloads and retry/poison rules, and fires the sweep timer. The tests cover: an
//! airports import over HTTP and lookups by every identifier; a write intent put on the queue
//! by another service, and its redelivery; a transient storage failure that is retried; bad
//! messages ending on the poison queue (by the catalog, by the host's decoding, and after
//! `maxDequeueCount` failures); the timer applying an entry whose hint was lost; a verify job
//! through the `scan` function; an online index change (issue 13): added through the
//! `indexes` function, its entry applied by `apply`, its backfill run by `scan`, then dropped
//! through `indexes_field`. HTTP modes (issue 27): the suite runs with the host proxying, as a
//! current host does with our host.json (both flags set); a chunked upload is applied when
//! proxying and reaches the handler empty when forwarding (an older host); function keys are
//! checked when proxying; an export is streamed when proxying and buffered when forwarding;
//! an ignored size run exports 100,000 records.
//!
//! Needs `TC_TEST_AZURE_CONNECTION` (Azurite, `source scripts/azurite.sh start`): without it
//! the tests print a `SKIPPED:` line (`scripts/test.sh` fails on it), and fail under `CI`.
//! `TC_HARNESS_AIRPORTS=N` limits the import to the first N airports (default: the test's
//! sample, 4,058, or all 28,403 in the long check);
//! `TC_HARNESS_ECHO=1` prints the handler's output.

use crate::common;
use crate::harness;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::StreamExt;
use serde_json::{json, Value};
use table_catalog::record::Record;
use table_catalog::store::{QueueStore, RowRange};
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::wal::{Op, INTENT_PREFIX, SHARD};
use table_catalog::{CatalogOptions, Config};

use harness::payload::Verdict;
use harness::{azurite, Event, Harness, HarnessOptions};

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

fn unb64(text: &str) -> String {
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(text).expect("base64")).expect("UTF-8")
}

fn enc(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

fn record(v: Value) -> Record {
    v.as_object().cloned().expect("a JSON object")
}

/// The WAL id in an apply log line `intent {msg} logged as {id} and applied`.
fn logged_wal_id(line: &str) -> Option<String> {
    let rest = line.split(" logged as ").nth(1)?;
    Some(rest.split_whitespace().next()?.to_string())
}

fn deleted(h: &Harness, id: &str) -> bool {
    h.events().iter().any(|e| matches!(e, Event::Deleted { id: i, .. } if i == id))
}

fn poisoned(h: &Harness, id: &str) -> bool {
    h.events().iter().any(|e| matches!(e, Event::Poisoned { id: i, .. } if i == id))
}

/// Records matching `field=value` through the front end (with the function key, if any).
async fn lookup(h: &Harness, field: &str, value: &str) -> Vec<Value> {
    let code = h.options.function_key.as_deref().map(|k| format!("&code={}", enc(k))).unwrap_or_default();
    let (status, body) = h.get_json(&format!("/api/records?{field}={}&limit=1000{code}", enc(value))).await;
    assert_eq!(status, 200, "GET {field}={value}: {body}");
    body["records"].as_array().cloned().unwrap_or_default()
}

async fn status(h: &Harness) -> Value {
    let code = h.options.function_key.as_deref().map(|k| format!("?code={}", enc(k))).unwrap_or_default();
    let (s, body) = h.get_json(&format!("/api/status{code}")).await;
    assert_eq!(s, 200, "{body}");
    body
}

/// (1) Airports imported over HTTP (`POST /api/records/batch` in chunks), applied by the
/// queue messages the writes enqueue, then found by each identifier through forwarded
/// `GET /api/records`. Also the front end's own answers: 401 without the key ("Azure mode"),
/// 404 for what no function serves. A sample of 4,058 airports spread over the whole file
/// (every 7th): the whole data set goes through the import on the embedded store in
/// `airports::every_airport_is_found_by_each_identifier_it_has`, and through this harness on
/// Azurite in the long check below (28,403 airports, about 85,000 rows: most of this test's
/// CPU, Azurite's and the handler's, on a 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn airports_import_over_http_and_lookups_by_each_identifier() {
    airports_import_over_http(7).await;
}

/// (1) with every airport (28,403), as the Functions app would import them on Azure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long check (all 28,403 airports into Azurite through the harness; CI imports every 7th in airports_import_over_http_and_lookups_by_each_identifier): scripts/test.sh --test suite -- --ignored"]
async fn all_airports_import_over_http_and_lookups_by_each_identifier() {
    airports_import_over_http(1).await;
}

/// Imports every `step`-th airport (`TC_HARNESS_AIRPORTS=N` keeps the first N of those) and
/// looks a sample of them up by each identifier.
async fn airports_import_over_http(step: usize) {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    opts.function_key = Some(key.clone());
    let started = Instant::now();
    let h = Harness::start(opts).await;
    let ready = h.handler.ready_after;

    // The host's own answers, before the handler is involved.
    let (s, body) = h.get_json("/api/health").await;
    assert_eq!((s, &body), (200, &json!({"status": "ok"})), "anonymous function, no key needed");
    assert_eq!(h.get_json("/api/status").await.0, 401, "function-level route without a key");
    assert_eq!(h.get_json(&format!("/api/nothing?code={key}")).await.0, 404);
    assert_eq!(h.client().delete(h.url(&format!("/api/records/batch?code={key}"))).send().await.unwrap().status(), 404);
    assert_eq!(h.get_json(&format!("/records?code={key}")).await.0, 404, "routes live under the api prefix");
    let (s, body) =
        h.get_json(&format!("/api/wal/20250101T000000000000Z_00000000-0000-0000-0000-000000000000?code={key}")).await;
    assert!(s == 404 || s == 400, "wal/{{id}} is routed to the handler: {s} {body}");
    let refused: Vec<_> =
        h.http_records().into_iter().filter(|r| r.status == 401 || r.forwarded_uri.is_none()).collect();
    assert_eq!(refused.len(), 4, "401 and 404 answered by the host without forwarding: {refused:?}");

    let schema = common::airports_schema();
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &schema).unwrap();
    let records: Vec<Record> = rows.into_iter().map(|(_, r)| r.expect("valid airport row")).collect();
    assert_eq!(records.len(), 28_403);
    let records: Vec<Record> = records.into_iter().step_by(step).collect();
    let n = std::env::var("TC_HARNESS_AIRPORTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(records.len())
        .min(records.len());
    let records = &records[..n];

    let import_started = Instant::now();
    let mut wal_ids = BTreeSet::new();
    for chunk in records.chunks(2_000) {
        let resp = h
            .client()
            .post(h.url("/api/records/batch"))
            .header("x-functions-key", &key)
            .json(&chunk)
            .send()
            .await
            .expect("batch POST");
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 202, "{body}");
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), chunk.len());
        for r in results {
            wal_ids.insert(r["id"].as_str().unwrap_or_else(|| panic!("rejected: {r}")).to_string());
        }
    }
    assert_eq!(wal_ids.len(), n, "one WAL id per airport");
    let import_time = import_started.elapsed();

    // The hints the writes enqueued are delivered to /apply, which applies the WAL.
    let apply_started = Instant::now();
    h.wait_queue_drained(Duration::from_secs(600)).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let st = status(&h).await;
        if st["pending"] == 0 {
            assert_eq!(st["dead"], 0, "{st}");
            assert_eq!(st["poison"], 0, "{st}");
            break;
        }
        assert!(Instant::now() < deadline, "still pending: {st}\n{}", h.diagnostics());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let apply_time = apply_started.elapsed();
    let invs = h.invocations();
    assert!(!invs.is_empty(), "the apply function was invoked");
    assert!(invs.iter().all(|i| i.function == "apply"), "{}", h.diagnostics());
    // On a loaded machine an apply can fail transiently (a storage timeout answered 500); the
    // host then retries it, as the contract says. Every message must end in a success.
    for failed in invs.iter().filter(|i| !i.succeeded()) {
        assert_eq!(failed.status, Some(500), "only transient failures (500): {}", h.diagnostics());
        assert!(
            invs.iter().any(|i| i.message_id == failed.message_id && i.succeeded()),
            "message {:?} was retried until it succeeded: {}",
            failed.message_id,
            h.diagnostics()
        );
    }
    assert!(
        invs.iter().filter(|i| i.succeeded()).all(|i| i.logs().iter().any(|l| l.contains("handled"))),
        "{}",
        h.diagnostics()
    );
    let hints = invs.len();

    // Lookups of a sample by each identifier it has.
    let lookups_started = Instant::now();
    let step = (n / 600).max(1);
    let sample: Vec<&Record> = records.iter().step_by(step).collect();
    let queries: Vec<(&Record, &str, String)> = sample
        .iter()
        .flat_map(|r| {
            ["icao", "iata", "lid"]
                .into_iter()
                .filter_map(move |f| r[f].as_str().filter(|v| !v.is_empty()).map(|v| (*r, f, v.to_string())))
        })
        .collect();
    let h_ref = &h;
    let misses: Vec<String> = futures::stream::iter(queries.iter())
        .map(|(r, f, v)| async move {
            let found = lookup(h_ref, f, v).await;
            (!found.contains(&Value::Object((*r).clone()))).then(|| format!("{f}={v} does not find {}", r["name"]))
        })
        .buffer_unordered(16)
        .filter_map(|m| async move { m })
        .collect()
        .await;
    assert!(misses.is_empty(), "{} misses, e.g. {:?}", misses.len(), &misses[..misses.len().min(5)]);
    let lookup_time = lookups_started.elapsed();
    assert!(queries.len() > sample.len(), "several identifiers per airport on average");

    // What the handler got: the path with /api, the query with `code`, the host headers.
    let forwarded = h.http_records().into_iter().find(|r| r.uri.starts_with("/api/records?")).unwrap();
    let fwd = forwarded.forwarded_uri.unwrap();
    assert!(fwd.starts_with("/api/records?") && fwd.contains(&format!("code={key}")), "{fwd}");
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    eprintln!(
        "airports via harness: {n} records; handler ready in {ready:?}; import {import_time:.1?} ({:.0}/s); \
         applied {apply_time:.1?} after the import via {hints} apply invocations; {} lookups in {lookup_time:.1?}; total {:.1?}",
        n as f64 / import_time.as_secs_f64(),
        queries.len(),
        started.elapsed()
    );
    h.stop().await;
}

/// (2) A write intent another service puts on the queue (base64 JSON, docs/INTENTS.md) is
/// logged and applied; when its delete is lost and the same message is delivered again, it
/// is logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_intent_is_applied_and_a_redelivered_intent_is_logged_once() {
    let Some(cs) = azurite() else { return };
    let h = Harness::start(HarnessOptions::airports(&cs)).await;
    let airport = json!({"icao": "ZZHA", "iata": "ZHA", "lid": "ZH1", "name": "Harness Field", "city": "Testville", "elevation": 12});
    let intent = json!({"v": 1, "op": "insert", "record": airport}).to_string();

    h.lose_next_deletes(1);
    let id = h.put_intent(&intent).await;
    h.wait_for(Duration::from_secs(60), "the redelivered intent to be deleted", |h| deleted(h, &id)).await;

    let invs = h.invocations_of(&id);
    assert_eq!(invs.iter().map(|i| i.dequeue_count.unwrap()).collect::<Vec<_>>(), [1, 2], "{}", h.diagnostics());
    assert!(invs.iter().all(|i| i.succeeded() && i.status == Some(200)), "{}", h.diagnostics());
    let events = h.events();
    assert!(events.contains(&Event::DeleteLost { id: id.clone(), dequeue_count: 1 }), "{events:?}");
    assert!(events.contains(&Event::Deleted { id: id.clone(), dequeue_count: 2 }), "{events:?}");

    // The host payload: the text JSON-quoted inside a JSON string, quoted Id, string count.
    let req = &invs[0].request;
    let inner: String = serde_json::from_str(req["Data"]["message"].as_str().unwrap()).unwrap();
    assert_eq!(inner, intent);
    assert_eq!(req["Metadata"]["Id"], Value::String(format!("\"{id}\"")));
    assert_eq!(req["Metadata"]["DequeueCount"], "1");
    assert_eq!(req["Metadata"]["sys"]["MethodName"], "apply");

    // Both deliveries report the same WAL id.
    let ids: Vec<String> = invs
        .iter()
        .map(|i| i.logs().iter().find_map(|l| logged_wal_id(l)).unwrap_or_else(|| panic!("{:?}", i.logs())))
        .collect();
    assert_eq!(ids[0], ids[1], "redelivery logged under the same WAL id");
    let wal_id = ids[0].clone();
    assert!(invs[0].logs()[0].contains(&format!("intent {id} logged as {wal_id} and applied")), "{:?}", invs[0].logs());

    // Applied: found by each identifier, once.
    for (f, v) in [("icao", "ZZHA"), ("iata", "ZHA"), ("lid", "ZH1")] {
        assert_eq!(lookup(&h, f, v).await, vec![airport.clone()], "{f}={v}");
    }
    let (s, body) = h.get_json(&format!("/api/wal/{wal_id}")).await;
    assert_eq!((s, body["state"].as_str()), (200, Some("applied")), "{body}");

    // Logged once: one intent marker, one WAL entry ever (the checkpoint is that entry).
    let catalog = Config::new(h.catalog_name()).connection_string(cs.clone()).open().await.unwrap();
    let range =
        RowRange { from: Some(INTENT_PREFIX.to_string()), before: Some("intent;".into()), ..RowRange::default() };
    let markers = catalog.store().query_partition(&catalog.names().wal_table, SHARD, &range, 100, None).await.unwrap();
    assert_eq!(markers.entities.len(), 1, "{:?}", markers.entities);
    assert_eq!(markers.entities[0].str("id"), Some(wal_id.as_str()));
    let st = catalog.status().await.unwrap();
    assert_eq!((st.pending, st.checkpoint.as_deref()), (0, Some(wal_id.as_str())), "{st:?}");
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

/// (3) An apply that fails transiently is retried after host.json's visibilityTimeout and
/// then succeeds. The failure is real: the harness's proxy in front of the Table service
/// answers `503 ServerBusy` to the handler while the first delivery runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_storage_failure_is_retried_and_then_succeeds() {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    opts.storage_proxy = true;
    let h = Harness::start(opts).await;
    let visibility = h.app.host.queues.visibility_timeout;
    assert!(visibility >= Duration::from_secs(1), "host.json visibilityTimeout {visibility:?}");

    let airport = json!({"icao": "ZZTR", "lid": "ZT1", "name": "Transient Strip"});
    h.storage_outage(true);
    let id = h.put_intent(&json!({"v": 1, "op": "upsert", "record": airport}).to_string()).await;
    h.wait_for(Duration::from_secs(60), "the first delivery to be released", |h| {
        h.events().iter().any(|e| matches!(e, Event::Released { id: i, .. } if *i == id))
    })
    .await;
    h.storage_outage(false);
    let first = h.invocations_of(&id);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].status, Some(500), "{}", h.diagnostics());
    assert!(matches!(first[0].verdict, Verdict::Failure(_)));
    assert!(
        first[0].response_body.contains("ServerBusy") || first[0].response_body.contains("storage"),
        "{}",
        first[0].response_body
    );
    assert!(h.storage_requests_refused() > 0);
    let released_at = h
        .events_with_time()
        .into_iter()
        .find_map(|(t, e)| {
            matches!(&e, Event::Released { id: i, dequeue_count: 1, after } if *i == id && *after == visibility)
                .then_some(t)
        })
        .expect("released with host.json visibilityTimeout");

    h.wait_for(visibility + Duration::from_secs(60), "the retried delivery to succeed", |h| deleted(h, &id)).await;
    let deleted_at = h
        .events_with_time()
        .into_iter()
        .find_map(|(t, e)| matches!(&e, Event::Deleted { id: i, .. } if *i == id).then_some(t))
        .unwrap();
    let invs = h.invocations_of(&id);
    assert_eq!(
        invs.iter().map(|i| (i.dequeue_count.unwrap(), i.status)).collect::<Vec<_>>(),
        [(1, Some(500)), (2, Some(200))]
    );
    let waited = deleted_at - released_at;
    assert!(
        waited >= visibility - Duration::from_millis(1500),
        "retried after {waited:?}, visibilityTimeout {visibility:?}"
    );
    assert_eq!(lookup(&h, "icao", "ZZTR").await, vec![airport.clone()]);
    assert_eq!(lookup(&h, "lid", "ZT1").await, vec![airport]);
    assert_eq!(status(&h).await["poison"], 0);
    eprintln!(
        "transient failure: {} storage requests refused; retried after {waited:.1?}",
        h.storage_requests_refused()
    );
    h.stop().await;
}

/// (4a) Messages that can never succeed end on the poison queue: bad intents poisoned by the
/// catalog itself, with the reason, on the first delivery (answered 200); a message that is
/// not base64 copied raw by the host without invoking the function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanently_bad_messages_end_on_the_poison_queue() {
    let Some(cs) = azurite() else { return };
    let h = Harness::start(HarnessOptions::airports(&cs)).await;
    let not_json = "this is not JSON";
    let unknown_op = r#"{"v":1,"op":"merge","record":{"icao":"ZZBD","name":"Bad Op"}}"#;
    let no_index = r#"{"v":1,"op":"insert","record":{"name":"Nowhere"}}"#;
    let raw = "%%% not base64 %%%";
    let id_json = h.put_intent(not_json).await;
    let id_op = h.put_intent(unknown_op).await;
    let id_idx = h.put_intent(no_index).await;
    let id_raw = h.put_raw(raw).await;
    h.wait_for(Duration::from_secs(60), "all four messages handled", |h| {
        deleted(h, &id_json) && deleted(h, &id_op) && deleted(h, &id_idx) && poisoned(h, &id_raw)
    })
    .await;

    for id in [&id_json, &id_op, &id_idx] {
        let invs = h.invocations_of(id);
        assert_eq!(invs.len(), 1, "poisoned on the first delivery: {}", h.diagnostics());
        assert_eq!(invs[0].status, Some(200));
        assert!(invs[0].logs().iter().any(|l| l.contains("moved to the poison queue")), "{:?}", invs[0].logs());
    }
    assert!(h.invocations_of(&id_raw).is_empty(), "invalid base64 is never invoked");
    assert_eq!(status(&h).await["poison"], 4);

    let poison = h.poison_messages().await;
    assert_eq!(poison.len(), 4, "{poison:?}");
    let mut reasons = Vec::new();
    for m in &poison {
        if m.text == raw {
            continue; // the host's raw copy
        }
        let body: Value = serde_json::from_str(&unb64(&m.text)).expect("catalog poison message is base64 JSON");
        let reason = body["reason"].as_str().expect("reason").to_string();
        let original = body["message"].as_str().unwrap();
        let mid = body["message_id"].as_str().unwrap();
        let expected = [(&id_json, not_json), (&id_op, unknown_op), (&id_idx, no_index)];
        let (_, text) =
            expected.iter().find(|(i, _)| i.as_str() == mid).expect("poison message names the queue message id");
        assert_eq!(original, *text);
        reasons.push((mid.to_string(), reason));
    }
    assert!(poison.iter().any(|m| m.text == raw), "the raw copy of the undecodable message");
    let reason_of = |id: &str| reasons.iter().find(|(i, _)| i == id).map(|(_, r)| r.clone()).unwrap();
    assert!(reason_of(&id_json).contains("not valid JSON"), "{reasons:?}");
    assert!(reason_of(&id_op).contains("unknown op 'merge'"), "{reasons:?}");
    assert!(reason_of(&id_idx).contains("no value for any index field"), "{reasons:?}");
    eprintln!("poison reasons: {reasons:?}");
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

/// (4b) A message whose invocation fails every time (storage down for good) is moved to the
/// poison queue by the host after exactly maxDequeueCount invocations; a message whose bytes
/// are not UTF-8 fails binding every time and is poisoned without any invocation.
/// visibilityTimeout is shortened to 1 s (a harness option) to keep the test short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_every_time_is_poisoned_after_max_dequeue_count() {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    opts.storage_proxy = true;
    opts.visibility_timeout = Some(Duration::from_secs(1));
    let h = Harness::start(opts).await;
    let max = h.app.host.queues.max_dequeue_count;
    h.storage_outage(true);
    let text = json!({"v": 1, "op": "insert", "record": {"icao": "ZZPX", "name": "Never"}}).to_string();
    let id = h.put_intent(&text).await;
    let not_utf8 = base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe, 0x7b]);
    let id_bin = h.put_raw(&not_utf8).await;
    let started = Instant::now();
    h.wait_for(Duration::from_secs(180), "both messages poisoned", |h| poisoned(h, &id) && poisoned(h, &id_bin)).await;
    let took = started.elapsed();

    let invs = h.invocations_of(&id);
    assert_eq!(invs.len(), max as usize, "exactly maxDequeueCount invocations: {}", h.diagnostics());
    assert_eq!(invs.iter().map(|i| i.dequeue_count.unwrap()).collect::<Vec<_>>(), (1..=max).collect::<Vec<_>>());
    assert!(invs.iter().all(|i| i.status == Some(500) && !i.succeeded()), "{}", h.diagnostics());
    let events = h.events();
    let released = events.iter().filter(|e| matches!(e, Event::Released { id: i, .. } if *i == id)).count();
    assert_eq!(released, max as usize - 1);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Poisoned { id: i, dequeue_count, .. } if *i == id && *dequeue_count == max)));

    assert!(h.invocations_of(&id_bin).is_empty(), "a message that cannot be bound is never invoked");
    let binding_failures =
        events.iter().filter(|e| matches!(e, Event::BindingFailed { id: i, .. } if *i == id_bin)).count();
    assert_eq!(binding_failures, max as usize);

    let poison = h.poison_messages().await;
    let texts: BTreeSet<String> = poison.iter().map(|m| m.text.clone()).collect();
    assert_eq!(texts, BTreeSet::from([b64(&text), not_utf8]), "the host copies the message text as stored");
    h.storage_outage(false);
    assert!(lookup(&h, "icao", "ZZPX").await.is_empty(), "a poisoned intent is not applied");
    eprintln!("poisoned after {max} failed deliveries in {took:.1?}");
    h.stop().await;
}

/// (5) The timer applies a WAL entry whose hint was lost: an entry written with the library
/// (`Wal::append` does not enqueue a hint) is left alone by a sweep before the threshold and
/// applied by the first sweep after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_sweeps_an_entry_whose_hint_was_lost() {
    let Some(cs) = azurite() else { return };
    let h = Harness::start(HarnessOptions::airports(&cs)).await;
    let threshold = CatalogOptions::default().sweep_apply_after;
    let catalog = Config::new(h.catalog_name())
        .index_keys(["icao", "iata", "lid"])
        .row_key("name")
        .connection_string(cs.clone())
        .open()
        .await
        .unwrap();
    let airport = json!({"icao": "ZZSW", "iata": "ZSW", "name": "Sweeper Field"});
    let op = Op::Upsert { record: record(airport.clone()) };
    let ids = catalog.wal().append(vec![(catalog.applier().route(&op).unwrap(), op)]).await.unwrap();
    let appended = Instant::now();
    let wal_id = ids[0].to_string();

    let sweep_report = |inv: &harness::Invocation| -> Value {
        assert!(inv.succeeded(), "{inv:?}");
        let line =
            inv.logs().iter().find_map(|l| l.strip_prefix("sweep: ")).unwrap_or_else(|| panic!("{:?}", inv.logs()));
        serde_json::from_str(line).unwrap()
    };
    let early = h.fire_timer().await;
    let report = sweep_report(&early);
    assert_eq!((report["applied"].as_u64(), report["pending"].as_u64()), (Some(0), Some(1)), "{report}");
    // The host's timer payload: TimerInfo object, monitor on (5-minute schedule), sys only.
    let timer = &early.request["Data"]["timer"];
    assert_eq!(timer["Schedule"], json!({"AdjustForDST": true}));
    assert!(timer["ScheduleStatus"]["Next"].is_string(), "{timer}");
    assert_eq!(timer["IsPastDue"], false);
    assert_eq!(early.request["Metadata"].as_object().unwrap().keys().collect::<Vec<_>>(), ["sys"]);
    assert!(lookup(&h, "icao", "ZZSW").await.is_empty(), "not applied before the threshold");
    assert_eq!(h.store.approximate_count(&h.queue).await.unwrap(), 0, "no hint was enqueued");

    let wait = (threshold + Duration::from_secs(1)).saturating_sub(appended.elapsed());
    eprintln!("waiting {wait:.1?} for the sweep threshold ({threshold:?})");
    tokio::time::sleep(wait).await;
    let late = h.fire_timer().await;
    let report = sweep_report(&late);
    assert_eq!((report["applied"].as_u64(), report["pending"].as_u64()), (Some(1), Some(0)), "{report}");
    assert_eq!(lookup(&h, "icao", "ZZSW").await, vec![airport.clone()]);
    assert_eq!(lookup(&h, "iata", "ZSW").await, vec![airport]);
    let (s, body) = h.get_json(&format!("/api/wal/{wal_id}")).await;
    assert_eq!((s, body["state"].as_str()), (200, Some("applied")), "{body}");
    assert!(h.invocations().iter().all(|i| i.function == "sweep"), "nothing came through the queue");
    let output = h.handler_output();
    assert!(
        !output.iter().any(|l| l.contains("not understood")),
        "the handler understood the timer payload: {output:?}"
    );
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

/// (7) A verify job runs end to end through the `scan` queue function: started over HTTP, its
/// work items delivered by the host to `POST /scan`, one of them delivered twice (its delete
/// is lost), and its counts equal a serial verify's. A corrupted record (an index row deleted
/// around the WAL) is its one finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verify_job_runs_through_the_scan_function_with_a_redelivered_work_item() {
    let Some(cs) = azurite() else { return };
    let h = Harness::start(HarnessOptions::airports(&cs)).await;
    let schema = common::airports_schema();
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &schema).unwrap();
    let records: Vec<Record> = rows.into_iter().take(300).map(|(_, r)| r.expect("valid airport row")).collect();
    let resp = h.client().post(h.url("/api/records/batch?wait=true")).json(&records).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap_or_default());
    h.wait_queue_drained(Duration::from_secs(120)).await;

    let catalog = Config::new(h.catalog_name()).connection_string(cs.clone()).open().await.unwrap();
    catalog.recover().await.unwrap();
    let keys = catalog.schema().record_keys(&records[7]).unwrap();
    let (_, pk) = keys.partitions.last().unwrap().clone();
    catalog
        .store()
        .delete(&catalog.names().table, &pk, &keys.row_key, &table_catalog::store::IfMatch::Any)
        .await
        .unwrap();
    let serial =
        table_catalog::testing::verify::verify(catalog.store().as_ref(), &catalog.names().table, &catalog.schema())
            .await
            .unwrap();
    assert_eq!(serial.total_findings(), 1, "{:?}", serial.violations);

    h.lose_next_deletes_of("scan", 1);
    let resp = h
        .client()
        .post(h.url("/api/jobs"))
        .json(&json!({"kind": "verify", "params": {"segment": 50}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let job: Value = resp.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(180);
    let done = loop {
        let (s, body) = h.get_json(&format!("/api/jobs/{id}")).await;
        assert_eq!(s, 200, "{body}");
        if body["state"] != "running" && body["state"] != "queued" {
            break body;
        }
        assert!(Instant::now() < deadline, "job not done: {body}\n{}", h.diagnostics());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["counters"]["rows"].as_u64(), Some(serial.rows as u64), "{done}");
    assert_eq!(done["counters"]["records"].as_u64(), Some(serial.records as u64), "{done}");
    assert_eq!(done["counters"]["missing_row"].as_u64(), Some(1), "{done}");
    assert!(done["steps_done"].as_u64().unwrap_or(0) > 1, "the scan split into several work items: {done}");

    let scans: Vec<_> = h.invocations().into_iter().filter(|i| i.function == "scan").collect();
    assert!(scans.iter().all(|i| i.succeeded()), "{}", h.diagnostics());
    assert!(scans.iter().any(|i| i.dequeue_count == Some(2)), "a work item was redelivered: {}", h.diagnostics());
    let findings = h.client().get(h.url(&format!("/api/jobs/{id}/findings"))).send().await.unwrap();
    assert_eq!(findings.headers()["content-type"], "application/x-ndjson");
    let text = findings.text().await.unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("missing_row") && text.contains(&pk), "{text}");
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

/// `method path` through the front end with the function key in `x-functions-key`:
/// (status, JSON body or `null`).
async fn call_keyed(h: &Harness, method: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
    let key = h.options.function_key.as_deref().expect("a function key");
    let mut req = h.client().request(method, h.url(path)).header("x-functions-key", key);
    if let Some(b) = body {
        req = req.json(b);
    }
    let r = req.send().await.expect("request through the harness");
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Polls `GET /api/jobs/{id}` until the job is final; returns it. An index change's job is
/// created when the change's WAL entry is applied: until then it is 404.
async fn job_final(h: &Harness, id: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let (s, body) = call_keyed(h, reqwest::Method::GET, &format!("/api/jobs/{id}"), None).await;
        assert!(s == 200 || s == 404, "{s} {body}");
        if s == 200 && !matches!(body["state"].as_str(), Some("running" | "queued")) {
            return body;
        }
        assert!(Instant::now() < deadline, "job not final: {body}\n{}", h.diagnostics());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The `GET /api/indexes` entry of `field` (`None` when it is not an index).
async fn index_entry(h: &Harness, field: &str) -> Option<Value> {
    let (s, body) = call_keyed(h, reqwest::Method::GET, "/api/indexes", None).await;
    assert_eq!(s, 200, "{body}");
    body["indexes"].as_array().expect("indexes").iter().find(|i| i["field"] == field).cloned()
}

/// Every record `field=value` finds through the `records` function, following the
/// continuation in pages of at most `limit`; with the size of each page read.
async fn lookup_pages(h: &Harness, field: &str, value: &str, limit: usize) -> (Vec<Value>, Vec<usize>) {
    let (mut records, mut pages, mut token): (Vec<Value>, Vec<usize>, Option<String>) = (Vec::new(), Vec::new(), None);
    loop {
        let cont = token.as_deref().map(|t| format!("&continuation={}", enc(t))).unwrap_or_default();
        let path = format!("/api/records?{field}={}&limit={limit}{cont}", enc(value));
        let (s, body) = call_keyed(h, reqwest::Method::GET, &path, None).await;
        assert_eq!(s, 200, "GET {path}: {body}");
        let page = body["records"].as_array().cloned().unwrap_or_default();
        assert!(page.len() <= limit, "{field}={value}: a page of {} > {limit}", page.len());
        pages.push(page.len());
        records.extend(page);
        token = body["continuation"].as_str().map(str::to_string);
        if token.is_none() {
            return (records, pages);
        }
    }
}

/// (8) An online index change end to end through the functions (issue 13): `POST
/// /api/indexes {"field":"country"}` through the `indexes` function; the change's WAL entry
/// applied by the `apply` queue function (the hint the change enqueues); the backfill job's
/// work items run by the `scan` queue function, one of them delivered twice (its delete is
/// lost); a record moved to another country and one deleted while the backfill may run; the
/// index turns active, every country value's lookup through the `records` function finds
/// exactly its records in pages of 100, all full but the last, and a verify job through
/// `scan` finds nothing. Then `DELETE /api/indexes/country` through the `indexes_field`
/// function: its job runs through `scan`, lookups by country get 400 naming the active
/// indexes, and no row of the index remains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_is_added_and_dropped_through_the_functions_with_its_jobs_on_the_scan_function() {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    opts.function_key = Some(format!("k-{}", uuid::Uuid::new_v4().simple()));
    let h = Harness::start(opts).await;
    let schema = common::airports_schema();
    let rows = import::read_file(&common::airports_csv(), Format::Csv, &schema).unwrap();
    // Every 25th airport: about 1,100 records of many countries, several hundred in the US.
    let mut records: Vec<Record> = rows.into_iter().step_by(25).map(|(_, r)| r.expect("valid airport row")).collect();
    let (s, body) = call_keyed(&h, reqwest::Method::POST, "/api/records/batch?wait=true", Some(&json!(records))).await;
    assert!((200..300).contains(&s), "{s} {body}");
    h.wait_queue_drained(Duration::from_secs(300)).await;

    let (s, _) = h.get_json("/api/indexes").await;
    assert_eq!(s, 401, "the indexes function needs the function key");
    h.lose_next_deletes_of("scan", 1);
    let (s, change) = call_keyed(&h, reqwest::Method::POST, "/api/indexes", Some(&json!({"field": "country"}))).await;
    assert_eq!(s, 202, "{change}");
    assert_eq!(change["index"]["state"], "backfilling", "{change}");
    let wal_id = change["wal_id"].as_str().expect("wal_id").to_string();
    let backfill_job = change["job"].as_str().expect("job").to_string();
    let forwarded = h.http_records().into_iter().filter(|r| r.uri.starts_with("/api/indexes")).count();
    assert!(forwarded >= 1, "the POST went through the indexes function");

    // The hint names the change's entry; the apply function applies it and starts the job.
    h.wait_for(Duration::from_secs(180), "the change's hint to be applied by the apply function", |h| {
        h.invocations().iter().any(|i| {
            i.function == "apply" && i.succeeded() && i.message_text.as_deref().is_some_and(|t| t.contains(&wal_id))
        })
    })
    .await;
    let (s, body) = call_keyed(&h, reqwest::Method::GET, &format!("/api/wal/{wal_id}"), None).await;
    assert_eq!((s, body["state"].as_str()), (200, Some("applied")), "{body}");

    // Writes while the backfill may still run: one record moves to a new country, one goes.
    let moved = {
        let r = records.iter_mut().find(|r| r["country"] == "FR").expect("a French airport");
        r.insert("country".into(), json!("ZZ"));
        r.clone()
    };
    let (s, body) =
        call_keyed(&h, reqwest::Method::POST, "/api/records?upsert=true&wait=true", Some(&json!(moved))).await;
    assert!((200..300).contains(&s), "{s} {body}");
    let gone = records.iter().position(|r| r["country"] == "CA").expect("a Canadian airport");
    let gone = records.remove(gone);
    let icao = gone["icao"].as_str().expect("an icao").to_string();
    let (s, body) =
        call_keyed(&h, reqwest::Method::DELETE, &format!("/api/records?icao={}&wait=true", enc(&icao)), None).await;
    assert!((200..300).contains(&s), "{s} {body}");

    let done = job_final(&h, &backfill_job, Duration::from_secs(300)).await;
    assert_eq!((done["state"].as_str(), done["kind"].as_str()), (Some("done"), Some("backfill")), "{done}");
    let live = records.len() as u64;
    let counted = done["counters"]["records"].as_u64().unwrap_or(0);
    assert!(
        counted == live || counted == live + 1,
        "records {counted}, {live} live (+1 if the delete came later): {done}"
    );
    assert!(done["steps_done"].as_u64().unwrap_or(0) > 1, "the backfill split into several work items: {done}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let entry = index_entry(&h, "country").await.expect("country is an index");
        if entry["state"] == "active" {
            break;
        }
        assert!(Instant::now() < deadline, "country not active: {entry}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut by_country: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for r in &records {
        if let Some(c) = r["country"].as_str().filter(|c| !c.is_empty()) {
            by_country.entry(c.to_string()).or_default().push(Value::Object(r.clone()).to_string());
        }
    }
    assert!(by_country["US"].len() > 200, "the US index partition pages: {}", by_country["US"].len());
    for (country, want) in &by_country {
        let (found, pages) = lookup_pages(&h, "country", country, 100).await;
        let mut got: Vec<String> = found.iter().map(Value::to_string).collect();
        got.sort();
        let mut want = want.clone();
        want.sort();
        let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).take(3).collect();
        let extra: Vec<&String> = got.iter().filter(|g| !want.contains(g)).take(3).collect();
        assert!(
            got == want,
            "country={country}: {} found, {} expected; missing e.g. {missing:?}; not expected e.g. {extra:?}",
            got.len(),
            want.len()
        );
        // Every page but the last is full: ceil(n / 100) pages, or one more, empty, when n is
        // a multiple of 100 and tombstones follow (the page that filled up had a continuation).
        let n = want.len();
        let full = pages[..pages.len() - 1].iter().all(|&p| p == 100);
        let trailing_empty = n % 100 == 0 && pages.len() == n / 100 + 1 && pages.last() == Some(&0);
        assert!(
            full && (pages.len() == n.div_ceil(100) || trailing_empty),
            "country={country}: {n} in pages {pages:?}"
        );
    }
    assert!(lookup_pages(&h, "country", "CA", 1000).await.0.iter().all(|r| r["icao"] != icao.as_str()));

    let (s, verify) = call_keyed(
        &h,
        reqwest::Method::POST,
        "/api/jobs",
        Some(&json!({"kind": "verify", "params": {"segment": 200}})),
    )
    .await;
    assert_eq!(s, 202, "{verify}");
    let verified = job_final(&h, verify["id"].as_str().unwrap(), Duration::from_secs(300)).await;
    assert_eq!(verified["state"], "done", "{verified}");
    assert_eq!(verified["counters"]["records"].as_u64(), Some(live), "{verified}");
    let key = h.options.function_key.clone().unwrap();
    let findings = h
        .client()
        .get(h.url(&format!("/api/jobs/{}/findings", verify["id"].as_str().unwrap())))
        .header("x-functions-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(findings.status().as_u16(), 200);
    let text = findings.text().await.unwrap();
    assert!(text.trim().is_empty(), "no findings: {text}");

    // Drop through the indexes_field function.
    let (s, dropped) = call_keyed(&h, reqwest::Method::DELETE, "/api/indexes/country", None).await;
    assert_eq!(s, 202, "{dropped}");
    assert_eq!(dropped["index"]["state"], "dropping", "{dropped}");
    let drop_job = dropped["job"].as_str().expect("job").to_string();
    let (s, body) = call_keyed(&h, reqwest::Method::GET, "/api/records?country=US", None).await;
    assert_eq!(s, 400, "a dropped index is not queryable: {body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("icao"), "names the active indexes: {body}");
    let done = job_final(&h, &drop_job, Duration::from_secs(300)).await;
    assert_eq!((done["state"].as_str(), done["kind"].as_str()), (Some("done"), Some("drop-index")), "{done}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while index_entry(&h, "country").await.is_some() {
        assert!(Instant::now() < deadline, "country still listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every work item of both jobs came through the scan function; one was delivered twice.
    let scans: Vec<_> = h.invocations().into_iter().filter(|i| i.function == "scan").collect();
    assert!(scans.iter().all(|i| i.succeeded()), "{}", h.diagnostics());
    let job_of = |i: &harness::Invocation| -> String {
        let item: Value = serde_json::from_str(i.message_text.as_deref().unwrap_or("null")).unwrap_or(Value::Null);
        item["job"].as_str().unwrap_or_default().to_string()
    };
    assert!(
        scans.iter().any(|i| job_of(i) == backfill_job && i.dequeue_count == Some(2)),
        "a backfill work item was redelivered: {}",
        h.diagnostics()
    );
    assert!(scans.iter().any(|i| job_of(i) == drop_job), "the drop ran through the scan function");

    // No row of the index remains, and the catalog verifies clean.
    let catalog = Config::new(h.catalog_name()).connection_string(cs.clone()).open().await.unwrap();
    assert_eq!(common::rows_of_index(&catalog, "country").await, 0, "rows of the dropped index remain");
    let report =
        table_catalog::testing::verify::verify(catalog.store().as_ref(), &catalog.names().table, &catalog.schema())
            .await
            .unwrap();
    assert_eq!(report.total_findings(), 0, "{:?}", report.findings);
    assert_eq!(report.records as u64, live);
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

// ---------------------------------------------------------------------------------------------
// HTTP modes (issue 27): host.json sets enableProxyingHttpRequest and enableForwardingHttpRequest;
// a current host proxies (streams both bodies), an older one forwards (buffers the answer, drops
// a body without Content-Length). docs/FUNCTIONS.md §2.

/// A synthetic airport-shaped record: one identifier (`icao` = `S` + 7 digits) and its name.
fn synthetic(i: usize) -> Value {
    json!({"icao": format!("S{i:07}"), "name": format!("Synthetic {i}"), "city": "Nowhere", "elevation": i % 9000})
}

/// A request body sent chunked (no Content-Length): one frame per part.
fn chunked_body(parts: Vec<String>) -> reqwest::Body {
    let frames = futures::stream::iter(
        parts.into_iter().map(|p| Ok::<_, std::io::Error>(http_body::Frame::data(axum::body::Bytes::from(p)))),
    );
    reqwest::Body::wrap(http_body_util::StreamBody::new(frames))
}

/// Imports `records` through `POST /api/records/batch` (2,000 per request, key in
/// `x-functions-key`) and waits until `apply` has applied every entry.
async fn import_through_the_functions(h: &Harness, records: &[Value]) {
    for chunk in records.chunks(2_000) {
        let (s, body) = call_keyed(h, reqwest::Method::POST, "/api/records/batch", Some(&json!(chunk))).await;
        assert_eq!(s, 202, "{body}");
        let results = body["results"].as_array().expect("results");
        assert!(results.iter().all(|r| r["id"].is_string()), "a record was rejected: {body}");
    }
    h.wait_queue_drained(Duration::from_secs(1_800)).await;
    let deadline = Instant::now() + Duration::from_secs(1_800);
    loop {
        let st = status(h).await;
        if st["pending"] == 0 {
            assert_eq!(st["dead"], 0, "{st}");
            return;
        }
        assert!(Instant::now() < deadline, "still pending: {st}\n{}", h.diagnostics());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The harness's record of the last request to `path` (path without query).
fn last_record(h: &Harness, path: &str) -> harness::front::HttpRecord {
    h.http_records().into_iter().rev().find(|r| r.uri.split('?').next() == Some(path)).expect("a record of the request")
}

/// A `/proc/<pid>/status` size field (`VmHWM`: peak resident set, `VmRSS`: current), in KiB.
fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn peak_rss_kib(pid: &str) -> Option<u64> {
    proc_status_kib(pid, "VmHWM:")
}

/// Resets `VmHWM` to the current resident set (`clear_refs` 5, Linux 4.0+); false if refused.
fn reset_peak_rss(pid: &str) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// (9) A batch upload sent chunked (no Content-Length) reaches the handler and is applied
/// when the host proxies (`enableProxyingHttpRequest`, the default with our host.json); an
/// older host that only forwards copies the body only when Content-Length > 0, so the handler
/// gets an empty body and refuses it (400, naming Content-Length): nothing is written. Sent
/// with a Content-Length, the same upload goes through.
/// Documented in FUNCTIONS.md §2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_upload_is_applied_when_proxying_and_dropped_when_forwarding() {
    let Some(cs) = azurite() else { return };
    let lines = |from: usize| -> Vec<String> { (from..from + 3).map(|i| format!("{}\n", synthetic(i))).collect() };

    let h = Harness::start(HarnessOptions::airports(&cs)).await;
    let r = h
        .client()
        .post(h.url("/api/records/batch?wait=true"))
        .header("content-type", "application/x-ndjson")
        .body(chunked_body(lines(1)))
        .send()
        .await
        .expect("chunked POST");
    let s = r.status().as_u16();
    let body: Value = r.json().await.expect("JSON answer");
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["results"].as_array().map(Vec::len), Some(3), "{body}");
    let rec = last_record(&h, "/api/records/batch");
    assert_eq!(rec.mode, Some(harness::app::HttpMode::Proxying), "host.json's both flags: proxying wins");
    assert!(!rec.request_body_dropped);
    for i in 1..4 {
        assert_eq!(lookup(&h, "icao", &format!("S{i:07}")).await, [synthetic(i)], "record {i} applied");
    }
    let name = h.catalog_name().to_string();

    // An older host on the same catalog: forwarding only.
    let mut opts = HarnessOptions::airports(&cs);
    opts.catalog_name = name;
    opts.http_mode = Some(harness::app::HttpMode::Forwarding);
    let older = Harness::start(opts).await;
    let r = older
        .client()
        .post(older.url("/api/records/batch?wait=true"))
        .header("content-type", "application/x-ndjson")
        .body(chunked_body(lines(11)))
        .send()
        .await
        .expect("chunked POST");
    let s = r.status().as_u16();
    let body: Value = r.json().await.expect("JSON answer");
    // The handler got an empty body: refused, naming the cause.
    assert_eq!(s, 400, "the handler got no body: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|e| e.contains("Content-Length")), "{body}");
    let rec = last_record(&older, "/api/records/batch");
    assert_eq!(rec.mode, Some(harness::app::HttpMode::Forwarding));
    assert!(rec.request_body_dropped, "forwarding drops a body without Content-Length: {rec:?}");
    for i in 11..14 {
        assert!(lookup(&older, "icao", &format!("S{i:07}")).await.is_empty(), "record {i} must not exist");
    }
    // The same upload with a Content-Length goes through the older host.
    let r = older
        .client()
        .post(older.url("/api/records/batch?wait=true"))
        .header("content-type", "application/x-ndjson")
        .body(lines(11).concat())
        .send()
        .await
        .expect("POST with a length");
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(lookup(&older, "icao", "S0000011").await, [synthetic(11)]);
    assert!(h.bugs().is_empty() && older.bugs().is_empty());
    older.stop().await;
    h.stop().await;
}

/// (10) Proxying still checks function keys before the handler sees anything: a
/// function-level route answers 401 without a key and is proxied with the key in `code` (the
/// query, `code` included, reaches the handler unchanged) and in `x-functions-key`; the
/// handler gets the host headers and `X-Forwarded-*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_keys_are_required_and_accepted_when_proxying() {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    opts.function_key = Some(key.clone());
    let h = Harness::start(opts).await;

    assert_eq!(h.get_json("/api/status").await.0, 401, "no key");
    assert_eq!(h.get_json("/api/status?code=wrong").await.0, 401, "wrong key");
    let rec = last_record(&h, "/api/status");
    assert_eq!((rec.mode, rec.forwarded_uri), (None, None), "refused by the host, not proxied");

    let (s, body) = h.get_json(&format!("/api/status?code={key}&x=a+b&x=c")).await;
    assert_eq!(s, 200, "{body}");
    let rec = last_record(&h, "/api/status");
    assert_eq!(rec.mode, Some(harness::app::HttpMode::Proxying));
    assert_eq!(rec.forwarded_uri.as_deref(), Some(format!("/api/status?code={key}&x=a+b&x=c").as_str()), "raw query");

    let r = h.client().get(h.url("/api/status")).header("x-functions-key", &key).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = h.client().get(h.url("/api/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "anonymous function, no key needed");

    // A write with the key in the header is applied.
    let (s, body) =
        call_keyed(&h, reqwest::Method::POST, "/api/records/batch?wait=true", Some(&json!([synthetic(7)]))).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(lookup(&h, "icao", "S0000007").await, [synthetic(7)]);
    assert!(h.bugs().is_empty(), "{:?}", h.bugs());
    h.stop().await;
}

/// (11) An export through a proxying host is streamed: when the client holds the first bytes
/// of the body, the front had read none of the handler's answer before relaying it (it
/// relays chunks as they come), and the export completes with every record once. The same
/// export through an older, forwarding host arrives complete too, but only after the front
/// buffered all of it (what limits a real host to small exports within 230 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_through_the_proxying_host_is_streamed_with_every_record() {
    let Some(cs) = azurite() else { return };
    let mut opts = HarnessOptions::airports(&cs);
    let key = format!("k-{}", uuid::Uuid::new_v4().simple());
    opts.function_key = Some(key.clone());
    let h = Harness::start(opts.clone()).await;
    let n = 3_000;
    let records: Vec<Value> = (0..n).map(synthetic).collect();
    import_through_the_functions(&h, &records).await;

    let mut r = h.client().get(h.url("/api/export")).header("x-functions-key", &key).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let first = r.chunk().await.expect("reading the export").expect("a first chunk");
    assert!(!first.is_empty());
    let rec = last_record(&h, "/api/export");
    assert_eq!(rec.mode, Some(harness::app::HttpMode::Proxying));
    assert_eq!(rec.answer_bytes_read_before_relaying, Some(0), "the proxying front does not buffer: {rec:?}");
    let mut body = first.to_vec();
    while let Some(chunk) = r.chunk().await.expect("reading the export") {
        body.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(body).expect("UTF-8");
    let exported: BTreeSet<String> = text.lines().map(String::from).collect();
    assert_eq!(text.lines().count(), n, "each record once");
    let expected: BTreeSet<String> = records.iter().map(Value::to_string).collect();
    assert_eq!(exported, expected);

    // An older host, forwarding, on the same catalog: same export, buffered.
    opts.http_mode = Some(harness::app::HttpMode::Forwarding);
    let older = Harness::start(opts).await;
    let r = older.client().get(older.url(&format!("/api/export?code={key}"))).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let rec = last_record(&older, "/api/export");
    let buffered = r.bytes().await.expect("the export");
    assert_eq!(rec.answer_bytes_read_before_relaying, Some(buffered.len() as u64), "forwarding buffers it all");
    assert_eq!(buffered.len(), text.len());
    assert!(h.bugs().is_empty() && older.bugs().is_empty());
    older.stop().await;
    h.stop().await;
}

/// (12) Size run, ignored by default: imports `TC_HARNESS_EXPORT_RECORDS` (default 100,000)
/// synthetic records through the functions, then exports them through `/api/export` on a
/// proxying host, and prints the times, the handler's peak memory (`VmHWM`, reset before the
/// export so that it is the export's own) and the test process's (the harness front lives
/// there: a buffering front would grow with the export).
/// Figures in docs/FUNCTIONS.md and docs/BENCHMARKS.md. Run:
///
/// ```text
/// source scripts/azurite.sh start
/// cargo test --test suite -- --ignored --nocapture functions_harness::export_of_many_records_streams_through_the_proxying_host
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "size run: 100,000 records (minutes); see the doc comment"]
async fn export_of_many_records_streams_through_the_proxying_host() {
    let Some(cs) = azurite() else { return };
    let n: usize = std::env::var("TC_HARNESS_EXPORT_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let mut opts = HarnessOptions::airports(&cs);
    opts.function_key = Some(format!("k-{}", uuid::Uuid::new_v4().simple()));
    opts.http_mode = Some(harness::app::HttpMode::Proxying);
    opts.rust_log = "warn".into();
    let h = Harness::start(opts).await;
    let records: Vec<Value> = (0..n).map(synthetic).collect();
    let started = Instant::now();
    import_through_the_functions(&h, &records).await;
    let import_time = started.elapsed();
    drop(records);
    let handler_pid = h.handler.pid.to_string();
    let (handler_import, test_import) = (peak_rss_kib(&handler_pid), peak_rss_kib("self"));
    // From here VmHWM is the export's own peak (else the import's would hide it).
    let reset = reset_peak_rss(&handler_pid) && reset_peak_rss("self");
    let (handler_rss, test_rss) = (proc_status_kib(&handler_pid, "VmRSS:"), proc_status_kib("self", "VmRSS:"));

    let started = Instant::now();
    let key = h.options.function_key.clone().unwrap_or_default();
    let mut r = h.client().get(h.url("/api/export")).header("x-functions-key", &key).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let first_chunk = started.elapsed();
    let (mut lines, mut bytes) = (0usize, 0u64);
    let mut seen = vec![false; n];
    let mut partial = Vec::new();
    while let Some(chunk) = r.chunk().await.expect("reading the export") {
        bytes += chunk.len() as u64;
        partial.extend_from_slice(&chunk);
        let end = partial.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        for line in partial[..end].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line).expect("a JSON line");
            let i: usize = v["icao"].as_str().and_then(|s| s[1..].parse().ok()).expect("a synthetic icao");
            assert!(!seen[i], "record {i} exported twice");
            seen[i] = true;
            lines += 1;
        }
        partial.drain(..end);
    }
    let export_time = started.elapsed();
    assert!(partial.is_empty(), "the export ends with a full line");
    assert_eq!(lines, n, "every record once");
    let rec = last_record(&h, "/api/export");
    assert_eq!(rec.answer_bytes_read_before_relaying, Some(0), "streamed: {rec:?}");
    let kib = |v: Option<u64>| v.map_or("?".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
    let during = if reset { "during the export" } else { "whole run: the peak could not be reset" };
    eprintln!(
        "export via proxying harness: {n} records; import {import_time:.1?}; export {export_time:.1?} \
         ({bytes} bytes, {:.0} records/s, first chunk after {first_chunk:.1?}); VmHWM {during}: handler {}, \
         test process (harness front included) {}; VmRSS when the export started: handler {}, test process {}; \
         VmHWM until the export: handler {}, test process {}",
        n as f64 / export_time.as_secs_f64(),
        kib(peak_rss_kib(&handler_pid)),
        kib(peak_rss_kib("self")),
        kib(handler_rss),
        kib(test_rss),
        kib(handler_import),
        kib(test_import),
    );
    h.stop().await;
}
