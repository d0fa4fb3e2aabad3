//! The Azure backend (`store::azure::AzureStore`).
//!
//! - Network-free: connection-string forms, secrets never printed, limits enforced before
//!   any I/O, and fault handling against a scripted fake HTTP server (retries, timeouts, a
//!   retried insert that conflicts with its own committed first attempt, empty pages that
//!   carry a token, the exact addresses and filters sent for quoted keys).
//! - Against Azurite, with the connection string in `TC_TEST_AZURE_CONNECTION`
//!   (`source scripts/azurite.sh start`): the shared conformance suite, every tricky key in
//!   every operation, ETags, paging over 2,500 entities, batches, queues.
//!
//! Without `TC_TEST_AZURE_CONNECTION` the Azurite tests print a `SKIPPED:` line (see
//! `tests/common/skip.rs`; `scripts/test.sh` fails on it), and fail under `CI`.

use crate::common;
#[allow(dead_code)] // only its relaying and connection count are used here
use crate::harness::proxy;

use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxy::StorageProxy;
use table_catalog::store::{AzureStore, CredentialKind, RetryPolicy, DEV_ACCOUNT_KEY};
use table_catalog::store::{
    BatchOp, ETag, Entity, IfMatch, QueueStore, RowRange, StoreError, TableStore, Value, MAX_MESSAGE_BYTES,
};
use table_catalog::testing::store::conformance;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------

/// The Azurite store, or `None` after reporting `test` as skipped (see `common::skip`).
fn azurite(test: &str) -> Option<AzureStore> {
    let cs = common::skip::azurite(test)?;
    Some(AzureStore::from_connection_string(&cs).unwrap_or_else(|e| panic!("TC_TEST_AZURE_CONNECTION is invalid: {e}")))
}

macro_rules! store_or_skip {
    ($name:expr) => {
        match azurite($name) {
            Some(store) => store,
            None => return,
        }
    };
}

fn table_name() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

fn queue_name() -> String {
    format!("q-{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

fn ent(pk: &str, rk: &str, n: i32) -> Entity {
    Entity::new(pk, rk).with("n", Value::Int32(n))
}

/// The keys the fact sheet lists as hard to carry through URLs, filters and batches.
fn tricky_keys() -> Vec<String> {
    let mut keys: Vec<String> =
        ["it's", "''", "'", "a',RowKey='x", "100%", "50%25", "%41", "a+b", "a b", "a&b=c", "a)b(", "é", "😀", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
    keys.push("😀".repeat(256));
    keys
}

/// True when `store` talks to Azurite (its well-known account).
fn is_azurite(store: &AzureStore) -> bool {
    store.account() == Some("devstoreaccount1")
}

/// Azurite 3.37's `$batch` parser finds keys in an operation's address with the regular
/// expressions `(?<=PartitionKey=')(.*)(?=',)` and `(?<=RowKey=')(.+)(?='\))`, which ignore
/// doubled quotes: a PartitionKey containing `RowKey='` or a RowKey containing `',` is cut
/// at the wrong place (real Azure parses the OData literal).
fn azurite_misparses_batch_address(pk: &str, rk: &str) -> bool {
    pk.contains("RowKey='") || rk.contains("',")
}

/// A store whose endpoints refuse connections: any I/O fails with `Unavailable`, so an
/// `InvalidInput` from it proves the request was rejected before I/O.
fn unreachable_store() -> AzureStore {
    AzureStore::from_connection_string(&format!(
        "AccountName=devstoreaccount1;AccountKey={DEV_ACCOUNT_KEY};\
         TableEndpoint=http://127.0.0.1:9/devstoreaccount1;QueueEndpoint=http://127.0.0.1:9/devstoreaccount1"
    ))
    .unwrap()
    .with_retry_policy(fast_retry())
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        request_timeout: Duration::from_millis(500),
    }
}

async fn read_partition(store: &AzureStore, t: &str, pk: &str, page: usize) -> Vec<Entity> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let p = store.query_partition(t, pk, &RowRange::default(), page, token.as_deref()).await.unwrap();
        assert!(p.entities.len() <= page);
        out.extend(p.entities);
        match p.continuation {
            Some(next) => token = Some(next),
            None => return out,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Connection strings (no network)
// ---------------------------------------------------------------------------------------

#[test]
fn development_storage_maps_to_azurite_defaults() {
    for s in ["UseDevelopmentStorage=true", "usedevelopmentstorage=TRUE;", " UseDevelopmentStorage = true ; "] {
        let store = AzureStore::from_connection_string(s).unwrap();
        assert!(store.is_development_storage());
        assert_eq!(store.account(), Some("devstoreaccount1"));
        assert_eq!(store.table_endpoint(), "http://127.0.0.1:10002/devstoreaccount1");
        assert_eq!(store.queue_endpoint(), "http://127.0.0.1:10001/devstoreaccount1");
        assert_eq!(store.credential_kind(), CredentialKind::SharedKey);
    }
    let proxied =
        AzureStore::from_connection_string("UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://azurite")
            .unwrap();
    assert_eq!(proxied.table_endpoint(), "http://azurite:10002/devstoreaccount1");
    assert!(matches!(
        AzureStore::from_connection_string("UseDevelopmentStorage=yes"),
        Err(StoreError::InvalidInput(m)) if m.contains("UseDevelopmentStorage")
    ));
}

#[test]
fn account_key_and_explicit_endpoints() {
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let derived = AzureStore::from_connection_string(&format!(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key};EndpointSuffix=core.chinacloudapi.cn"
    ))
    .unwrap();
    assert_eq!(derived.table_endpoint(), "https://acct.table.core.chinacloudapi.cn/");
    assert_eq!(derived.queue_endpoint(), "https://acct.queue.core.chinacloudapi.cn/");
    let default_suffix = AzureStore::from_connection_string(&format!("AccountName=acct;AccountKey={key}")).unwrap();
    assert_eq!(default_suffix.table_endpoint(), "https://acct.table.core.windows.net/");

    // Explicit endpoints win (the way tests reach Azurite on random ports); unknown keys
    // (BlobEndpoint, Foo) are ignored; key names are case-insensitive.
    let explicit = AzureStore::from_connection_string(&format!(
        "defaultendpointsprotocol=http;ACCOUNTNAME=devstoreaccount1;accountkey={DEV_ACCOUNT_KEY};\
         TableEndpoint=http://127.0.0.1:4711/devstoreaccount1/;QUEUEENDPOINT=http://127.0.0.1:4712/devstoreaccount1;\
         BlobEndpoint=http://127.0.0.1:4710/devstoreaccount1;Foo=bar"
    ))
    .unwrap();
    assert_eq!(explicit.table_endpoint(), "http://127.0.0.1:4711/devstoreaccount1");
    assert_eq!(explicit.queue_endpoint(), "http://127.0.0.1:4712/devstoreaccount1");
    assert!(!explicit.is_development_storage());
}

#[test]
fn shared_access_signature_forms() {
    let sas = "sv=2022-11-02&ss=tq&srt=sco&sp=rwdlacu&se=2030-01-01T00:00:00Z&sig=c2lnbmF0dXJl";
    let with_account =
        AzureStore::from_connection_string(&format!("AccountName=acct;SharedAccessSignature={sas}")).unwrap();
    assert_eq!(with_account.credential_kind(), CredentialKind::SharedAccessSignature);
    assert_eq!(with_account.table_endpoint(), "https://acct.table.core.windows.net/");
    let endpoints_only = AzureStore::from_connection_string(&format!(
        "TableEndpoint=https://acct.table.core.windows.net;QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=?{sas}"
    ))
    .unwrap();
    assert_eq!(endpoints_only.account(), None);
    assert_eq!(endpoints_only.credential_kind(), CredentialKind::SharedAccessSignature);
}

#[test]
fn bad_connection_strings_name_the_problem() {
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let cases = [
        (String::new(), "no settings"),
        ("AccountName=acct".to_string(), "no credentials"),
        (format!("AccountKey={key}"), "AccountKey requires AccountName"),
        (
            format!("AccountName=acct;AccountKey={key};SharedAccessSignature=sv=1&sig=x"),
            "both AccountKey and SharedAccessSignature",
        ),
        (format!("AccountName=acct;AccountKey={key};AccountName=other"), "AccountName is given more than once"),
        ("AccountName=acct;AccountKey=not base64!".to_string(), "AccountKey is not valid base64"),
        (format!("AccountName=acct;AccountKey={key};DefaultEndpointsProtocol=ftp"), "DefaultEndpointsProtocol"),
        (format!("AccountName=acct;AccountKey={key};TableEndpoint=not a url"), "TableEndpoint is not an absolute URL"),
        (
            format!("AccountName=acct;AccountKey={key};QueueEndpoint=https://q.example/?sig=x"),
            "QueueEndpoint must not contain a query",
        ),
        ("SharedAccessSignature=sv=1&sig=x;TableEndpoint=https://t.example".to_string(), "QueueEndpoint is missing"),
        ("AccountName=acct;SharedAccessSignature=sv=1".to_string(), "no sig= parameter"),
        (
            format!("UseDevelopmentStorage=true;AccountName=acct;AccountKey={key}"),
            "cannot be combined with AccountName",
        ),
        (format!("AccountName=acct;AccountKey={key};junk"), "segment 3 is not of the form Key=Value"),
        ("AccountName=acct;AccountKey=".to_string(), "AccountKey is empty"),
    ];
    for (s, want) in cases {
        match AzureStore::from_connection_string(&s) {
            Err(StoreError::InvalidInput(msg)) => assert!(msg.contains(want), "{s:?}: {msg:?} should mention {want:?}"),
            other => panic!("{s:?} should be rejected, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Secrets never printed
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn secrets_never_appear_in_errors_or_debug_output() {
    let key = "U0VDUkVULUtFWS1NQVJLRVItMTIzNDU2Nzg5MA==";
    let sig = "U0VDUkVUU0lHTkFUVVJFTUFSS0VS";
    let marker = ["SECRET", "U0VDUkVU", "MARKER"];
    let assert_clean = |what: &str, text: &str| {
        for m in marker {
            assert!(!text.contains(m), "{what} leaks {m}: {text}");
        }
        assert!(!text.contains(key) && !text.contains(sig), "{what} leaks a secret: {text}");
    };

    // Parse errors, for every way a string can be wrong.
    let bad = [
        format!("AccountName=acct;AccountKey={key};AccountKey={key}"),
        format!("AccountKey={key}"),
        format!("AccountName=acct;AccountKey={key};SharedAccessSignature=sv=1&sig={sig}"),
        format!("AccountName=acct;AccountKey={key}!!"),
        format!("AccountName=acct;AccountKey={key};TableEndpoint=http://x/?sig={sig}"),
        format!("UseDevelopmentStorage=true;SharedAccessSignature=sig={sig}"),
        format!("AccountName=acct;AccountKey={key};{sig}"),
        format!("AccountName=acct;SharedAccessSignature=sv={sig}"),
    ];
    for s in &bad {
        let err = AzureStore::from_connection_string(s).unwrap_err();
        assert_clean("parse error (Display)", &err.to_string());
        assert_clean("parse error (Debug)", &format!("{err:?}"));
    }

    // Debug of working stores.
    let with_key = AzureStore::from_connection_string(&format!("AccountName=acct;AccountKey={key}")).unwrap();
    let with_sas = AzureStore::from_connection_string(&format!(
        "SharedAccessSignature=sv=2022-11-02&sig={sig};TableEndpoint=http://127.0.0.1:9/acct;QueueEndpoint=http://127.0.0.1:9/acct"
    ))
    .unwrap()
    .with_retry_policy(fast_retry());
    for store in [&with_key, &with_sas] {
        assert_clean("Debug", &format!("{store:?}"));
        assert_clean("Debug (alternate)", &format!("{store:#?}"));
    }

    // Transport errors: the SAS is in the request URL, which the HTTP client's own error
    // message includes; ours must not.
    let err = with_sas.get("tbl", "p", "r").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert_clean("transport error", &format!("{err} {err:?}"));
    let err = with_sas.put_message("q-1", "hello", Duration::ZERO).await.unwrap_err();
    assert_clean("transport error", &format!("{err} {err:?}"));

    // HTTP errors: the body and headers (which can echo the request) stay out.
    let fake = FakeServer::start(move |_req: &Req| Reply::json(403, &format!("{{\"odata.error\":{{\"code\":\"AuthorizationFailure\",\"message\":{{\"value\":\"denied\\nsig={sig}\"}}}}}}")).header("x-ms-error-code", "AuthorizationFailure").header("x-echo", sig)).await;
    let store = fake.store_with_sas(&format!("sv=2022-11-02&sig={sig}"));
    let err = store.get("tbl", "p", "r").await.unwrap_err();
    assert!(matches!(&err, StoreError::Other(m) if m.contains("403") && m.contains("AuthorizationFailure")), "{err:?}");
    assert_clean("HTTP error", &format!("{err} {err:?}"));
}

// ---------------------------------------------------------------------------------------
// Rules enforced before any I/O (no network: the endpoint refuses connections)
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn limits_are_enforced_before_io() {
    let store = unreachable_store();
    let invalid = |r: Result<_, StoreError>, what: &str| match r {
        Err(StoreError::InvalidInput(_)) => {}
        other => panic!("{what}: expected InvalidInput before I/O, got {other:?}"),
    };
    let ops = |n: usize, pk: &str| (0..n).map(|i| BatchOp::Insert(ent(pk, &format!("{i:03}"), 0))).collect::<Vec<_>>();
    invalid(store.batch("tbl", "p", &ops(101, "p")).await.map(|_| ()), "101 operations");
    invalid(store.batch("tbl", "p", &[]).await.map(|_| ()), "empty batch");
    let mut mixed = ops(2, "p");
    mixed.push(BatchOp::Upsert(ent("other", "x", 0)));
    invalid(store.batch("tbl", "p", &mixed).await.map(|_| ()), "cross-partition batch");
    let dup = vec![BatchOp::Insert(ent("p", "x", 0)), BatchOp::Delete { row_key: "x".into(), if_match: IfMatch::Any }];
    invalid(store.batch("tbl", "p", &dup).await.map(|_| ()), "duplicate RowKey");
    // Over 4 MiB of body: 80 entities of ~60 KB.
    let big: Vec<BatchOp> = (0..80)
        .map(|i| BatchOp::Insert(Entity::new("p", format!("{i}")).with("s", Value::String("x".repeat(60_000)))))
        .collect();
    invalid(store.batch("tbl", "p", &big).await.map(|_| ()), "batch over 4 MiB");
    invalid(
        store.insert("tbl", &Entity::new("p", "r").with("PartitionKey", Value::Int32(1))).await.map(|_| ()),
        "reserved name",
    );
    // Entity limits Azurite does not check (Azure does): the valid side of each limit gets
    // past validation and fails on I/O (Unavailable).
    let passes = |r: Result<ETag, StoreError>, what: &str| match r {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("{what}: expected to pass validation, got {other:?}"),
    };
    let props = |n: usize| (0..n).fold(Entity::new("p", "r"), |e, i| e.with(format!("p{i}"), Value::Int32(0)));
    passes(store.insert("tbl", &props(252)).await, "252 properties");
    invalid(store.insert("tbl", &props(253)).await.map(|_| ()), "253 properties");
    for name in ["1abc", "a-b", "a b", "odata.etag"] {
        invalid(store.upsert("tbl", &Entity::new("p", "r").with(name, Value::Bool(true))).await.map(|_| ()), name);
    }
    passes(store.upsert("tbl", &Entity::new("p", "r").with("n".repeat(255), Value::Bool(true))).await, "255-char name");
    invalid(
        store.upsert("tbl", &Entity::new("p", "r").with("n".repeat(256), Value::Bool(true))).await.map(|_| ()),
        "256-char name",
    );
    let with = |v: Value| Entity::new("p", "r").with("v", v);
    passes(store.insert("tbl", &with(Value::String("x".repeat(32_768)))).await, "32,768 units");
    invalid(store.insert("tbl", &with(Value::String("x".repeat(32_769)))).await.map(|_| ()), "32,769 units");
    passes(store.insert("tbl", &with(Value::String("😀".repeat(16_384)))).await, "16,384 emoji");
    invalid(store.insert("tbl", &with(Value::String("😀".repeat(16_385)))).await.map(|_| ()), "16,385 emoji");
    passes(store.insert("tbl", &with(Value::Binary(vec![0; 65_536]))).await, "64 KiB binary");
    invalid(store.insert("tbl", &with(Value::Binary(vec![0; 65_537]))).await.map(|_| ()), "64 KiB + 1 binary");
    // 17 strings of 32,000 ASCII characters: 0.54 MB of UTF-8 but 1.09 MB as stored (UTF-16).
    let large = (0..17).fold(Entity::new("p", "r"), |e, i| e.with(format!("s{i}"), Value::String("x".repeat(32_000))));
    invalid(store.replace("tbl", &large, &IfMatch::Any).await.map(|_| ()), "entity over 1 MiB");
    invalid(store.create_table("bad-name").await, "table name");
    invalid(store.create_queue("Bad_Queue").await, "queue name");
    invalid(
        store.put_message("q-1", &"a".repeat(MAX_MESSAGE_BYTES + 1), Duration::ZERO).await.map(|_| ()),
        "64 KiB + 1",
    );
    invalid(store.put_message("q-1", "x", Duration::from_secs(7 * 24 * 3600 + 1)).await.map(|_| ()), "delay > 7 days");
    invalid(store.receive_messages("q-1", 0, Duration::from_secs(30)).await.map(|_| ()), "receive 0");
    invalid(store.receive_messages("q-1", 33, Duration::from_secs(30)).await.map(|_| ()), "receive 33");
    invalid(store.receive_messages("q-1", 1, Duration::from_millis(500)).await.map(|_| ()), "visibility 500 ms");
    invalid(
        store.query_partition("tbl", "p", &RowRange::default(), 10, Some("garbage")).await.map(|_| ()),
        "bad token",
    );
    // And the same store really fails on I/O, so the checks above did not reach it.
    assert!(matches!(store.get("tbl", "p", "r").await, Err(StoreError::Unavailable(_))));
}

// ---------------------------------------------------------------------------------------
// Fake server: retries, timeouts, idempotent insert, exact wire requests
// ---------------------------------------------------------------------------------------

/// One request the fake server received.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    /// Path and query, as sent (percent-encoded).
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// What the fake server does with a request.
enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Close the connection without answering (a reset after the server acted).
    Close,
    /// Never answer.
    Hang,
}

impl Reply {
    fn status(status: u16) -> Reply {
        Reply::Respond { status, headers: Vec::new(), body: String::new() }
    }
    fn json(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![(
                "Content-Type".into(),
                "application/json;odata=fullmetadata;streaming=true;charset=utf-8".into(),
            )],
            body: body.into(),
        }
    }
    fn header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
}

type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

/// A scripted HTTP/1.1 server on a random loopback port.
struct FakeServer {
    port: u16,
    requests: Arc<Mutex<Vec<Req>>>,
}

impl FakeServer {
    async fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> FakeServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let log = requests.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_connection(socket, handler.clone(), log.clone()));
            }
        });
        FakeServer { port, requests }
    }

    fn store(&self) -> AzureStore {
        AzureStore::from_connection_string(&format!(
            "AccountName=devstoreaccount1;AccountKey={DEV_ACCOUNT_KEY};TableEndpoint=http://127.0.0.1:{p}/devstoreaccount1;\
             QueueEndpoint=http://127.0.0.1:{p}/devstoreaccount1",
            p = self.port
        ))
        .unwrap()
        .with_retry_policy(fast_retry())
    }

    fn store_with_sas(&self, sas: &str) -> AzureStore {
        AzureStore::from_connection_string(&format!(
            "SharedAccessSignature={sas};TableEndpoint=http://127.0.0.1:{p}/devstoreaccount1;\
             QueueEndpoint=http://127.0.0.1:{p}/devstoreaccount1",
            p = self.port
        ))
        .unwrap()
        .with_retry_policy(fast_retry())
    }

    fn requests(&self) -> Vec<Req> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve_connection(mut socket: tokio::net::TcpStream, handler: Arc<Handler>, log: Arc<Mutex<Vec<Req>>>) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // Read the head.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or_default().split(' ');
        let (method, target) =
            (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).to_string();
        buf.drain(..head_end + length);
        let req = Req { method, target, headers, body };
        log.lock().unwrap().push(req.clone());
        match handler(&req) {
            Reply::Close => return,
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Reply::Respond { status, headers, body } => {
                let mut out = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nx-ms-request-id: 00000000-0000-0000-0000-000000000001\r\n\
                     x-ms-version: 2022-11-02\r\nDate: Sat, 21 Nov 2026 04:00:00 GMT\r\nServer: fake\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&body);
                if socket.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn entity_json(pk: &str, rk: &str, n: i32, etag: &str) -> String {
    serde_json::json!({
        "odata.metadata": "http://x/$metadata#t/@Element",
        "odata.etag": etag,
        "PartitionKey": pk,
        "RowKey": rk,
        "Timestamp@odata.type": "Edm.DateTime",
        "Timestamp": "2026-11-21T04:00:00.0000000Z",
        "n": n,
    })
    .to_string()
}

#[tokio::test]
async fn a_500_fails_fast_after_bounded_retries() {
    let fake = FakeServer::start(|_: &Req| Reply::status(500)).await;
    let store = fake.store();
    let err = store.get("tbl", "p", "r").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("500")), "{err:?}");
    // Bounded by the attempt count, not by a timed assertion (a loaded machine is slow).
    assert_eq!(fake.requests().len(), 4, "4 attempts in total");
    // With the default policy the same is bounded too (4 attempts, < 5 s of backoff).
    assert_eq!(RetryPolicy::default().max_attempts, 4);
}

#[tokio::test]
async fn a_503_is_retried_until_it_succeeds() {
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    let fake = FakeServer::start(move |_: &Req| {
        let mut n = c.lock().unwrap();
        *n += 1;
        if *n <= 2 {
            Reply::status(503).header("Retry-After", "0")
        } else {
            Reply::json(200, &entity_json("p", "r", 7, "W/\"datetime'x'\"")).header("ETag", "W/\"datetime'x'\"")
        }
    })
    .await;
    let got = fake.store().get("tbl", "p", "r").await.unwrap().unwrap();
    assert_eq!(got.properties["n"], Value::Int32(7));
    assert_eq!(got.etag, Some(ETag("W/\"datetime'x'\"".into())));
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn a_hung_request_times_out() {
    let fake = FakeServer::start(|_: &Req| Reply::Hang).await;
    let store = fake.store().with_retry_policy(RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        request_timeout: Duration::from_millis(200),
    });
    let started = Instant::now();
    let err = store.get("tbl", "p", "r").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("no response")), "{err:?}");
    assert_eq!(fake.requests().len(), 2, "each attempt timed out, then the policy stopped");
    // The server hangs for an hour: returning at all shows the timeout; the bound is loose
    // so that a loaded machine does not fail it.
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}

/// The server commits the insert but the connection drops before the answer; the retry
/// gets 409 EntityAlreadyExists, and the store recognises its own write.
#[tokio::test]
async fn a_retried_insert_that_conflicts_with_its_own_commit_succeeds() {
    for (stored_n, want_ok) in [(1, true), (2, false)] {
        let posts = Arc::new(Mutex::new(0));
        let p = posts.clone();
        let fake = FakeServer::start(move |req: &Req| match req.method.as_str() {
            "POST" => {
                let mut n = p.lock().unwrap();
                *n += 1;
                if *n == 1 {
                    Reply::Close
                } else {
                    Reply::json(409, r#"{"odata.error":{"code":"EntityAlreadyExists","message":{"value":"The specified entity already exists."}}}"#)
                        .header("x-ms-error-code", "EntityAlreadyExists")
                }
            }
            "GET" => Reply::json(200, &entity_json("p", "it's", stored_n, "W/\"datetime'1'\"")).header("ETag", "W/\"datetime'1'\""),
            _ => Reply::status(500),
        })
        .await;
        let result = fake.store().insert("tbl", &ent("p", "it's", 1)).await;
        if want_ok {
            assert_eq!(result.unwrap(), ETag("W/\"datetime'1'\"".into()));
        } else {
            assert!(
                matches!(result, Err(StoreError::AlreadyExists(_))),
                "different content is a real conflict: {result:?}"
            );
        }
        let methods: Vec<String> = fake.requests().iter().map(|r| r.method.clone()).collect();
        assert_eq!(methods, ["POST", "POST", "GET"]);
        // A conflict without an earlier transient failure is reported as is (no read).
    }
}

/// The same for a multipart batch (the retry's first operation conflicts, the reads show the
/// whole batch in place) and for a delete (the retry finds nothing to delete).
#[tokio::test]
async fn retried_batches_and_deletes_recognise_their_own_commit() {
    let attempts = Arc::new(Mutex::new(0));
    let a = attempts.clone();
    let fake = FakeServer::start(move |req: &Req| match req.method.as_str() {
        "POST" | "DELETE" => {
            let mut n = a.lock().unwrap();
            *n += 1;
            if *n % 2 == 1 {
                return Reply::Close;
            }
            if req.method == "DELETE" {
                return Reply::json(404, r#"{"odata.error":{"code":"ResourceNotFound","message":{"value":"gone"}}}"#)
                    .header("x-ms-error-code", "ResourceNotFound");
            }
            let body = "--batchresponse_b\r\nContent-Type: multipart/mixed; boundary=changesetresponse_c\r\n\r\n\
                        --changesetresponse_c\r\nContent-Type: application/http\r\n\r\n\
                        HTTP/1.1 409 Conflict\r\nContent-ID: 1\r\n\r\n\
                        {\"odata.error\":{\"code\":\"EntityAlreadyExists\",\"message\":{\"value\":\"0:exists\"}}}\r\n\
                        --changesetresponse_c--\r\n--batchresponse_b--\r\n";
            Reply::Respond {
                status: 202,
                headers: vec![("Content-Type".into(), "multipart/mixed; boundary=batchresponse_b".into())],
                body: body.into(),
            }
        }
        "GET" => {
            let rk = if req.target.contains("RowKey='a'") { "a" } else { "b" };
            Reply::json(200, &entity_json("p", rk, 1, &format!("W/\"{rk}\""))).header("ETag", &format!("W/\"{rk}\""))
        }
        _ => Reply::status(500),
    })
    .await;
    let store = fake.store();
    let ops = [BatchOp::Insert(ent("p", "a", 1)), BatchOp::Upsert(ent("p", "b", 1))];
    let etags = store.batch("tbl", "p", &ops).await.unwrap();
    assert_eq!(etags, [Some(ETag("W/\"a\"".into())), Some(ETag("W/\"b\"".into()))]);
    store.delete("tbl", "p", "a", &IfMatch::Any).await.expect("a delete whose first attempt committed");
    let methods: Vec<String> = fake.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["POST", "POST", "GET", "GET", "DELETE", "DELETE"]);
}

#[tokio::test]
async fn an_empty_page_with_a_token_is_returned_and_resumed() {
    let fake = FakeServer::start(|req: &Req| {
        if req.target.contains("NextPartitionKey") {
            Reply::json(
                200,
                &format!("{{\"odata.metadata\":\"x\",\"value\":[{}]}}", entity_json("p", "r", 1, "W/\"e\"")),
            )
        } else {
            Reply::json(200, r#"{"odata.metadata":"x","value":[]}"#)
                .header("x-ms-continuation-NextPartitionKey", "1!4!cA--")
                .header("x-ms-continuation-NextRowKey", "1!4!cg--")
        }
    })
    .await;
    let store = fake.store();
    let first = store.query_partition("tbl", "p", &RowRange::default(), 1000, None).await.unwrap();
    assert!(first.entities.is_empty());
    let token = first.continuation.expect("an empty page can carry a token");
    let second = store.query_partition("tbl", "p", &RowRange::default(), 1000, Some(&token)).await.unwrap();
    assert_eq!(second.entities.len(), 1);
    assert_eq!(second.entities[0].etag, Some(ETag("W/\"e\"".into())), "query results take odata.etag");
    assert_eq!(second.continuation, None);
    let resumed = &fake.requests()[1].target;
    assert!(
        resumed.contains("NextPartitionKey=1%214%21cA--") && resumed.contains("NextRowKey=1%214%21cg--"),
        "{resumed}"
    );
    assert!(resumed.contains("%24top=1000"), "{resumed}");
}

/// `count_range` asks for keys only (`$select`), follows continuations across an empty
/// page, and reports the first RowKey of the range.
#[tokio::test]
async fn count_range_reads_keys_only_and_follows_continuations() {
    let fake = FakeServer::start(|req: &Req| {
        if req.target.contains("NextPartitionKey") {
            let rows = [entity_json("p", "r1", 1, "W/\"a\""), entity_json("p", "r2", 2, "W/\"b\"")].join(",");
            Reply::json(200, &format!("{{\"odata.metadata\":\"x\",\"value\":[{rows}]}}"))
        } else {
            Reply::json(200, r#"{"odata.metadata":"x","value":[]}"#)
                .header("x-ms-continuation-NextPartitionKey", "1!4!cA--")
                .header("x-ms-continuation-NextRowKey", "1!4!cg--")
        }
    })
    .await;
    let counted = fake.store().count_range("tbl", "p", &RowRange::default(), u64::MAX).await.unwrap();
    assert_eq!(counted, (2, Some("r1".to_string())));
    let targets: Vec<String> = fake.requests().iter().map(|r| r.target.clone()).collect();
    assert_eq!(targets.len(), 2, "{targets:?}");
    for t in &targets {
        assert!(t.contains("%24select=PartitionKey%2CRowKey"), "{t}");
    }
}

/// The exact requests for a quoted key: quotes doubled in the address and in the filter,
/// If-Match on replace and delete, Int64 annotated.
#[tokio::test]
async fn quoted_keys_are_escaped_on_the_wire() {
    let fake = FakeServer::start(|req: &Req| match req.method.as_str() {
        "GET" if req.target.contains("()") => Reply::json(200, r#"{"odata.metadata":"x","value":[]}"#),
        "GET" => Reply::json(404, r#"{"odata.error":{"code":"ResourceNotFound","message":{"value":"nope"}}}"#)
            .header("x-ms-error-code", "ResourceNotFound"),
        _ => Reply::status(204).header("ETag", "W/\"datetime'2'\"").header("Preference-Applied", "return-no-content"),
    })
    .await;
    let store = fake.store();
    assert_eq!(store.get("tbl", "o'neil", "a',RowKey='x").await.unwrap(), None);
    store
        .replace(
            "tbl",
            &Entity::new("o'neil", "it's").with("l", Value::Int64(i64::MAX)),
            &IfMatch::Etag(ETag("W/\"datetime'1'\"".into())),
        )
        .await
        .unwrap();
    store.delete("tbl", "o'neil", "it's", &IfMatch::Any).await.unwrap();
    let range = RowRange { from: Some("it's".into()), ..RowRange::default() };
    store.query_partition("tbl", "o'neil", &range, 10, None).await.unwrap();
    let reqs = fake.requests();
    assert_eq!(reqs[0].target, "/devstoreaccount1/tbl(PartitionKey='o''neil',RowKey='a'',RowKey=''x')");
    assert_eq!(reqs[1].method, "PUT");
    assert_eq!(reqs[1].target, "/devstoreaccount1/tbl(PartitionKey='o''neil',RowKey='it''s')");
    assert_eq!(reqs[1].header("If-Match"), Some("W/\"datetime'1'\""));
    let body: serde_json::Value = serde_json::from_str(&reqs[1].body).unwrap();
    assert_eq!(body["l"], "9223372036854775807");
    assert_eq!(body["l@odata.type"], "Edm.Int64");
    assert_eq!(reqs[2].method, "DELETE");
    assert_eq!(reqs[2].header("If-Match"), Some("*"));
    // $filter=PartitionKey eq 'o''neil' and RowKey ge 'it''s', form-encoded.
    assert!(
        reqs[3].target.contains("%24filter=PartitionKey+eq+%27o%27%27neil%27+and+RowKey+ge+%27it%27%27s%27"),
        "{}",
        reqs[3].target
    );
}

#[tokio::test]
async fn batch_failure_index_comes_from_the_sub_response() {
    let fake = FakeServer::start(|req: &Req| {
        assert!(req.target.ends_with("/$batch"), "{}", req.target);
        let body = "--batchresponse_b\r\nContent-Type: multipart/mixed; boundary=changesetresponse_c\r\n\r\n\
                    --changesetresponse_c\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
                    HTTP/1.1 412 Precondition Failed\r\nContent-ID: 3\r\nContent-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n\r\n\
                    {\"odata.error\":{\"code\":\"UpdateConditionNotSatisfied\",\"message\":{\"value\":\"2:The update condition specified in the request was not satisfied.\"}}}\r\n\
                    --changesetresponse_c--\r\n--batchresponse_b--\r\n";
        Reply::Respond {
            status: 202,
            headers: vec![("Content-Type".into(), "multipart/mixed; boundary=batchresponse_b".into())],
            body: body.into(),
        }
    })
    .await;
    let ops = vec![
        BatchOp::Insert(ent("p", "a", 0)),
        BatchOp::Upsert(ent("p", "b", 0)),
        BatchOp::Replace(ent("p", "c", 0), IfMatch::Etag(ETag("W/\"old\"".into()))),
    ];
    match fake.store().batch("tbl", "p", &ops).await {
        Err(StoreError::BatchFailed { index: 2, source }) => {
            assert!(
                matches!(*source, StoreError::PreconditionFailed(ref m) if m.contains("UpdateConditionNotSatisfied"))
            )
        }
        other => panic!("{other:?}"),
    }
    let sent = &fake.requests()[0].body;
    assert_eq!(sent.matches("If-Match: ").count(), 1, "only the replace carries If-Match; the upsert must not");
    assert!(sent.contains("If-Match: W/\"old\""));
}

// ---------------------------------------------------------------------------------------
// Against Azurite
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn azurite_passes_the_conformance_suite() {
    let store = store_or_skip!("azurite_passes_the_conformance_suite");
    conformance::run_all(&store).await;
}

#[tokio::test]
async fn azurite_tables_are_created_idempotently_and_missing_ones_are_not_found() {
    let store = store_or_skip!("azurite_tables_are_created_idempotently_and_missing_ones_are_not_found");
    let t = table_name();
    assert!(matches!(store.get(&t, "p", "r").await, Err(StoreError::NotFound(_))), "get on a missing table");
    assert!(matches!(
        store.query_partition(&t, "p", &RowRange::default(), 10, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(store.insert(&t, &ent("p", "r", 1)).await, Err(StoreError::NotFound(_))));
    assert!(
        matches!(store.delete(&t, "p", "r", &IfMatch::Any).await, Err(StoreError::NotFound(ref m)) if m.contains("TableNotFound"))
    );
    let two = [BatchOp::Insert(ent("p", "a", 1)), BatchOp::Insert(ent("p", "b", 1))];
    let r = store.batch(&t, "p", &two).await;
    assert!(
        matches!(&r, Err(StoreError::NotFound(_)))
            || matches!(&r, Err(StoreError::BatchFailed { source, .. }) if matches!(**source, StoreError::NotFound(_))),
        "batch on a missing table: {r:?}"
    );
    store.create_table(&t).await.unwrap();
    store.create_table(&t).await.unwrap();
    assert_eq!(store.get(&t, "p", "r").await.unwrap(), None, "missing entity in an existing table");
    store.delete_table(&t).await.unwrap();
    store.delete_table(&t).await.expect("deleting a missing table is fine");
}

/// Every tricky key as PartitionKey and as RowKey, through insert, point read, filter
/// query, conditional replace, batch (insert, replace, upsert, delete) and delete.
#[tokio::test]
async fn azurite_tricky_keys_work_in_every_operation() {
    let store = store_or_skip!("azurite_tricky_keys_work_in_every_operation");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    for key in tricky_keys() {
        for (pk, rk) in [(key.clone(), "r".to_string()), ("p".to_string(), key.clone())] {
            let ctx = format!("pk={pk:?} rk={rk:?}");
            let v1 = store.insert(&t, &ent(&pk, &rk, 1)).await.unwrap_or_else(|e| panic!("insert {ctx}: {e}"));
            let got = store.get(&t, &pk, &rk).await.unwrap().unwrap_or_else(|| panic!("get {ctx}"));
            assert_eq!(
                (got.partition_key.as_str(), got.row_key.as_str(), got.etag.as_ref()),
                (pk.as_str(), rk.as_str(), Some(&v1))
            );
            let exact = RowRange { from: Some(rk.clone()), to: Some(rk.clone()), ..RowRange::default() };
            let page =
                store.query_partition(&t, &pk, &exact, 10, None).await.unwrap_or_else(|e| panic!("query {ctx}: {e}"));
            assert_eq!(page.entities.len(), 1, "filter {ctx}");
            assert_eq!(page.entities[0].row_key, rk);
            let v2 = store
                .replace(&t, &ent(&pk, &rk, 2), &IfMatch::Etag(v1.clone()))
                .await
                .unwrap_or_else(|e| panic!("replace {ctx}: {e}"));
            assert!(matches!(
                store.replace(&t, &ent(&pk, &rk, 3), &IfMatch::Etag(v1)).await,
                Err(StoreError::PreconditionFailed(_))
            ));
            // Single-operation batches (sent as plain requests).
            // Another RowKey in the same partition, still within 512 UTF-16 code units.
            let other = if rk.encode_utf16().count() >= 511 {
                format!("{}~", rk.chars().skip(1).collect::<String>())
            } else {
                format!("{rk}~")
            };
            store
                .batch(&t, &pk, &[BatchOp::Insert(ent(&pk, &other, 0))])
                .await
                .unwrap_or_else(|e| panic!("batch 1 {ctx}: {e}"));
            store
                .batch(&t, &pk, &[BatchOp::Delete { row_key: other.clone(), if_match: IfMatch::Any }])
                .await
                .unwrap_or_else(|e| panic!("batch 1 {ctx}: {e}"));
            if is_azurite(&store) && azurite_misparses_batch_address(&pk, &other) {
                // Known Azurite divergence, see azurite_batch_address_parser_divergence.
                let now = store.get(&t, &pk, &rk).await.unwrap().unwrap();
                store.delete(&t, &pk, &rk, &IfMatch::Etag(now.etag.unwrap())).await.unwrap();
                continue;
            }
            // Multipart batches: the key in the URL of replace/delete and in the body of insert.
            let etags = store
                .batch(
                    &t,
                    &pk,
                    &[BatchOp::Insert(ent(&pk, &other, 0)), BatchOp::Replace(ent(&pk, &rk, 4), IfMatch::Etag(v2))],
                )
                .await
                .unwrap_or_else(|e| panic!("batch {ctx}: {e}"));
            let v4 = etags[1].clone().unwrap();
            store
                .batch(
                    &t,
                    &pk,
                    &[
                        BatchOp::Upsert(ent(&pk, &rk, 5)),
                        BatchOp::Delete { row_key: other.clone(), if_match: IfMatch::Any },
                    ],
                )
                .await
                .unwrap_or_else(|e| panic!("batch 2 {ctx}: {e}"));
            assert_eq!(store.get(&t, &pk, &other).await.unwrap(), None, "batch delete {ctx}");
            let now = store.get(&t, &pk, &rk).await.unwrap().unwrap();
            assert_eq!(now.properties["n"], Value::Int32(5));
            assert!(matches!(
                store.delete(&t, &pk, &rk, &IfMatch::Etag(v4)).await,
                Err(StoreError::PreconditionFailed(_))
            ));
            store
                .delete(&t, &pk, &rk, &IfMatch::Etag(now.etag.unwrap()))
                .await
                .unwrap_or_else(|e| panic!("delete {ctx}: {e}"));
            assert_eq!(store.get(&t, &pk, &rk).await.unwrap(), None, "deleted {ctx}");
        }
    }
    // Injection-shaped keys address nothing else.
    store.insert(&t, &ent("p", "a", 1)).await.unwrap();
    assert_eq!(store.get(&t, "p", "a',RowKey='x").await.unwrap(), None);
    assert!(matches!(store.delete(&t, "p", "a',RowKey='x", &IfMatch::Any).await, Err(StoreError::NotFound(_))));
    let sneaky = RowRange { from: Some("x' or RowKey ge '".into()), ..RowRange::default() };
    assert!(store.query_partition(&t, "p", &sneaky, 10, None).await.unwrap().entities.is_empty());
    store.delete_table(&t).await.unwrap();
}

/// The key `a',RowKey='x` in a multipart batch: correct on Azure, misparsed by Azurite
/// (see [`azurite_misparses_batch_address`]). If Azurite fixes its parser this test says so.
#[tokio::test]
async fn azurite_batch_address_parser_divergence() {
    let store = store_or_skip!("azurite_batch_address_parser_divergence");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    let key = "a',RowKey='x";
    store.insert(&t, &ent(key, "r", 1)).await.unwrap();
    let ops = [BatchOp::Insert(ent(key, "s", 0)), BatchOp::Replace(ent(key, "r", 2), IfMatch::Any)];
    let result = store.batch(&t, key, &ops).await;
    if is_azurite(&store) {
        assert!(
            matches!(result, Err(StoreError::BatchFailed { index: 1, .. })),
            "Azurite misparses the address (if this changed, drop the workaround in the tests): {result:?}"
        );
        assert_eq!(store.get(&t, key, "s").await.unwrap(), None, "and the batch stays atomic");
    } else {
        result.unwrap();
        assert_eq!(store.get(&t, key, "r").await.unwrap().unwrap().properties["n"], Value::Int32(2));
    }
    store.delete_table(&t).await.unwrap();
}

#[tokio::test]
async fn azurite_etags_guard_every_conditional_write() {
    let store = store_or_skip!("azurite_etags_guard_every_conditional_write");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    let v1 = store.insert(&t, &ent("p", "r", 1)).await.unwrap();
    assert!(matches!(store.insert(&t, &ent("p", "r", 1)).await, Err(StoreError::AlreadyExists(_))), "duplicate insert");
    // Two writers holding the same ETag: exactly one wins.
    let (e2, e3, cond) = (ent("p", "r", 2), ent("p", "r", 3), IfMatch::Etag(v1.clone()));
    let (a, b) = tokio::join!(store.replace(&t, &e2, &cond), store.replace(&t, &e3, &cond));
    assert_eq!([&a, &b].iter().filter(|r| r.is_ok()).count(), 1, "{a:?} {b:?}");
    assert!([&a, &b].iter().any(|r| matches!(r, Err(StoreError::PreconditionFailed(_)))));
    assert!(matches!(store.delete(&t, "p", "r", &IfMatch::Etag(v1)).await, Err(StoreError::PreconditionFailed(_))));
    // If-Match: * never creates.
    assert!(matches!(store.replace(&t, &ent("p", "ghost", 1), &IfMatch::Any).await, Err(StoreError::NotFound(_))));
    assert!(matches!(store.delete(&t, "p", "ghost", &IfMatch::Any).await, Err(StoreError::NotFound(_))));
    assert_eq!(store.get(&t, "p", "ghost").await.unwrap(), None);
    // Upsert creates; delete and re-insert yields a new ETag.
    let u = store.upsert(&t, &ent("p", "u", 1)).await.unwrap();
    store.delete(&t, "p", "u", &IfMatch::Etag(u.clone())).await.unwrap();
    let again = store.insert(&t, &ent("p", "u", 1)).await.unwrap();
    assert_ne!(u, again);
    store.delete_table(&t).await.unwrap();
}

#[tokio::test]
async fn azurite_typed_values_read_back_exactly() {
    let store = store_or_skip!("azurite_typed_values_read_back_exactly");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    let entity = Entity::new("p", "r")
        .with("s", Value::String("it's <&> \"q\" é 😀 \u{0}".into()))
        .with("i32", Value::Int32(i32::MAX))
        .with("i32min", Value::Int32(i32::MIN))
        .with("i64", Value::Int64(i64::MAX))
        .with("i64min", Value::Int64(i64::MIN))
        .with("i64small", Value::Int64(5))
        .with("exact", Value::Int64((1 << 53) + 1))
        .with("one", Value::Double(1.0))
        .with("tenth", Value::Double(0.1))
        .with("huge", Value::Double(1e300))
        .with("tiny", Value::Double(5e-324))
        .with("nan", Value::Double(f64::NAN))
        .with("inf", Value::Double(f64::INFINITY))
        .with("ninf", Value::Double(f64::NEG_INFINITY))
        .with("t", Value::Bool(true))
        .with("f", Value::Bool(false))
        .with("dt", Value::DateTime("2024-01-02T03:04:05.1234567Z".into()))
        .with("guid", Value::Guid("c9da6455-213d-42c9-9a79-3e9149a57833".into()))
        .with("bin", Value::Binary((0..=255).collect()))
        .with("empty", Value::Binary(Vec::new()))
        .with("big", Value::Binary(vec![7; 64 * 1024]));
    let etag = store.insert(&t, &entity).await.unwrap();
    for got in [
        store.get(&t, "p", "r").await.unwrap().unwrap(),
        store.query_partition(&t, "p", &RowRange::default(), 10, None).await.unwrap().entities.remove(0),
        store.scan(&t, 10, None).await.unwrap().entities.remove(0),
    ] {
        assert_eq!(got.etag.as_ref(), Some(&etag));
        assert_eq!(got.properties.len(), entity.properties.len(), "{:?}", got.properties.keys());
        for (name, want) in &entity.properties {
            let have = &got.properties[name];
            match (want, have) {
                (Value::Double(a), Value::Double(b)) if a.is_nan() => assert!(b.is_nan(), "{name}"),
                _ => assert_eq!(want, have, "property {name}"),
            }
        }
    }
    store.delete_table(&t).await.unwrap();
}

#[tokio::test]
async fn azurite_pages_over_2500_entities() {
    let store = store_or_skip!("azurite_pages_over_2500_entities");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    for chunk in (0..2500).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<BatchOp> = chunk.iter().map(|i| BatchOp::Insert(ent("p", &format!("{i:05}"), *i))).collect();
        store.batch(&t, "p", &ops).await.unwrap();
    }
    store.insert(&t, &ent("q", "00000", 0)).await.unwrap();

    // Pages of 1,000: [1000, 1000, 500], in order, no duplicates.
    let mut sizes = Vec::new();
    let mut keys = Vec::new();
    let mut tokens = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = store.query_partition(&t, "p", &RowRange::default(), 1000, token.as_deref()).await.unwrap();
        sizes.push(page.entities.len());
        keys.extend(page.entities.iter().map(|e| e.row_key.clone()));
        match page.continuation {
            Some(next) => {
                tokens.push(next.clone());
                token = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(sizes, [1000, 1000, 500]);
    assert_eq!(keys.len(), 2500);
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 2500, "no duplicates");
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "RowKey order");
    assert!(keys.iter().all(|k| k.len() == 5), "only partition p");

    // A saved token resumes at the same place, again and again.
    for _ in 0..2 {
        let resumed = store.query_partition(&t, "p", &RowRange::default(), 1000, Some(&tokens[1])).await.unwrap();
        assert_eq!(resumed.entities.len(), 500);
        assert_eq!(resumed.entities[0].row_key, "02000");
    }
    // Page size is the limit of one page, not a total; over 1,000 is capped.
    let small = read_partition(&store, &t, "p", 333).await;
    assert_eq!(small.len(), 2500);
    let capped = store.query_partition(&t, "p", &RowRange::default(), 5000, None).await.unwrap();
    assert_eq!(capped.entities.len(), 1000);
    // Range + paging.
    let range = RowRange { after: Some("00999".into()), before: Some("02000".into()), ..RowRange::default() };
    let mut n = 0;
    let mut token: Option<String> = None;
    loop {
        let page = store.query_partition(&t, "p", &range, 300, token.as_deref()).await.unwrap();
        n += page.entities.len();
        match page.continuation {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(n, 1000);
    // Scan covers both partitions, in (PartitionKey, RowKey) order.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = store.scan(&t, 1000, token.as_deref()).await.unwrap();
        seen.extend(page.entities.into_iter().map(|e| (e.partition_key, e.row_key)));
        match page.continuation {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 2501);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    store.delete_table(&t).await.unwrap();
}

#[tokio::test]
async fn azurite_batches_are_atomic_and_report_the_failing_index() {
    let store = store_or_skip!("azurite_batches_are_atomic_and_report_the_failing_index");
    let t = table_name();
    store.create_table(&t).await.unwrap();
    let inserts =
        |pk: &str, n: usize| (0..n).map(|i| BatchOp::Insert(ent(pk, &format!("{i:03}"), 0))).collect::<Vec<_>>();

    // 100 operations succeed, with one ETag each.
    let etags = store.batch(&t, "ok", &inserts("ok", 100)).await.unwrap();
    assert_eq!(etags.len(), 100);
    assert!(etags.iter().all(Option::is_some));
    assert_eq!(read_partition(&store, &t, "ok", 1000).await.len(), 100);
    // 101 are rejected before I/O.
    assert!(matches!(store.batch(&t, "big", &inserts("big", 101)).await, Err(StoreError::InvalidInput(_))));
    assert!(read_partition(&store, &t, "big", 1000).await.is_empty());

    // A conflicting insert at index 50: BatchFailed { index: 50 }, nothing written.
    store.insert(&t, &ent("f", "050", 9)).await.unwrap();
    match store.batch(&t, "f", &inserts("f", 100)).await {
        Err(StoreError::BatchFailed { index: 50, source }) => {
            assert!(matches!(*source, StoreError::AlreadyExists(_)), "{source:?}")
        }
        other => panic!("expected BatchFailed at 50, got {other:?}"),
    }
    let left = read_partition(&store, &t, "f", 1000).await;
    assert_eq!(left.len(), 1, "only the pre-existing entity");
    assert_eq!(left[0].properties["n"], Value::Int32(9));

    // A stale ETag at 99 and a missing entity at 0.
    let v = store.insert(&t, &ent("s", "099", 0)).await.unwrap();
    store.upsert(&t, &ent("s", "099", 1)).await.unwrap();
    let mut ops = inserts("s", 99);
    ops.push(BatchOp::Replace(ent("s", "099", 2), IfMatch::Etag(v)));
    match store.batch(&t, "s", &ops).await {
        Err(StoreError::BatchFailed { index: 99, source }) => {
            assert!(matches!(*source, StoreError::PreconditionFailed(_)))
        }
        other => panic!("expected BatchFailed at 99, got {other:?}"),
    }
    let mut ops = inserts("m", 5);
    ops[0] = BatchOp::Delete { row_key: "000".into(), if_match: IfMatch::Any };
    match store.batch(&t, "m", &ops).await {
        Err(StoreError::BatchFailed { index: 0, source }) => assert!(matches!(*source, StoreError::NotFound(_))),
        other => panic!("expected BatchFailed at 0, got {other:?}"),
    }
    assert!(read_partition(&store, &t, "m", 1000).await.is_empty());
    // Replace (If-Match: *) in a batch never creates.
    let r = store.batch(&t, "g", &[BatchOp::Replace(ent("g", "ghost", 0), IfMatch::Any)]).await;
    assert!(matches!(r, Err(StoreError::BatchFailed { index: 0, .. })), "{r:?}");
    assert_eq!(store.get(&t, "g", "ghost").await.unwrap(), None);

    // Cross-partition batches are rejected here (Azurite itself would commit them).
    let mut mixed = inserts("x1", 3);
    mixed.push(BatchOp::Insert(ent("x2", "000", 0)));
    assert!(matches!(store.batch(&t, "x1", &mixed).await, Err(StoreError::InvalidInput(_))));
    assert!(read_partition(&store, &t, "x1", 1000).await.is_empty());
    assert!(read_partition(&store, &t, "x2", 1000).await.is_empty());
    store.delete_table(&t).await.unwrap();
}

#[tokio::test]
async fn azurite_queue_visibility_receipts_and_limits() {
    let store = store_or_skip!("azurite_queue_visibility_receipts_and_limits");
    let q = queue_name();
    store.create_queue(&q).await.unwrap();
    store.create_queue(&q).await.expect("idempotent");

    // Text passes through unchanged (no Base64 added or removed).
    let text = "eyJ2IjoxfQ== <&> \"x\" 'y' ünï 😀";
    let id = store.put_message(&q, text, Duration::ZERO).await.unwrap();
    let first = store.receive_messages(&q, 32, Duration::from_secs(1)).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].id.as_str(), first[0].text.as_str(), first[0].dequeue_count), (id.as_str(), text, 1));
    assert!(store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap().is_empty(), "hidden while leased");

    // After the visibility timeout it comes back with dequeue count 2 and a new receipt.
    let mut second = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        second = store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap();
        if !second.is_empty() {
            break;
        }
    }
    let second = second.pop().expect("redelivered after the visibility timeout");
    assert_eq!((second.id.as_str(), second.dequeue_count), (id.as_str(), 2));
    assert!(matches!(
        store.delete_message(&q, &id, &first[0].pop_receipt).await,
        Err(StoreError::PreconditionFailed(_))
    ));

    // Release keeps the text and returns the only receipt that still works.
    let receipt =
        store.release_message(&q, &id, &second.pop_receipt, &second.text, Duration::from_secs(1)).await.unwrap();
    assert!(matches!(
        store.release_message(&q, &id, &second.pop_receipt, text, Duration::ZERO).await,
        Err(StoreError::PreconditionFailed(_))
    ));
    assert!(
        store.receive_messages(&q, 1, Duration::from_secs(30)).await.unwrap().is_empty(),
        "released with a 1 s delay"
    );
    store.delete_message(&q, &id, &receipt).await.unwrap();
    assert!(matches!(store.delete_message(&q, &id, &receipt).await, Err(StoreError::NotFound(_))), "double delete");
    assert_eq!(store.approximate_count(&q).await.unwrap(), 0);

    // Exactly 64 KiB is accepted, one byte more is rejected before I/O.
    store.put_message(&q, &"a".repeat(MAX_MESSAGE_BYTES), Duration::ZERO).await.expect("64 KiB");
    assert!(matches!(
        store.put_message(&q, &"a".repeat(MAX_MESSAGE_BYTES + 1), Duration::ZERO).await,
        Err(StoreError::InvalidInput(_))
    ));
    // The longest delay (7 days) is accepted; the message stays hidden.
    store.put_message(&q, "later", Duration::from_secs(7 * 24 * 3600)).await.expect("7-day delay");
    let got = store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.iter().map(|m| m.text.len()).collect::<Vec<_>>(), [MAX_MESSAGE_BYTES]);
    assert_eq!(store.approximate_count(&q).await.unwrap(), 2);

    assert!(
        matches!(store.put_message(&queue_name(), "x", Duration::ZERO).await, Err(StoreError::NotFound(_))),
        "missing queue"
    );
    store.delete_queue(&q).await.unwrap();
    store.delete_queue(&q).await.expect("deleting a missing queue is fine");
}

/// Regression: azure_core 0.21's default HTTP client keeps no idle connection
/// (`pool_max_idle_per_host(0)`), so every request opened a new TCP connection (on Azure a
/// TLS handshake too): about 1,100 connections/s from one `serve` under load on Azurite.
/// Sequential requests of one store now share a connection per endpoint.
#[tokio::test]
async fn azurite_sequential_requests_reuse_one_connection_per_endpoint() {
    let Some(cs) = common::skip::azurite("azurite_sequential_requests_reuse_one_connection_per_endpoint") else {
        return;
    };
    // Route both endpoints through proxies that count the connections they relay.
    let endpoint = |key: &str| -> (u16, String) {
        let value = cs.split(';').find_map(|kv| kv.strip_prefix(&format!("{key}="))).expect("explicit endpoint");
        let rest = value.strip_prefix("http://127.0.0.1:").expect("a loopback http endpoint");
        let (port, path) = rest.split_once('/').expect("account path");
        (port.parse().expect("port"), path.to_string())
    };
    let ((table_port, table_path), (queue_port, queue_path)) = (endpoint("TableEndpoint"), endpoint("QueueEndpoint"));
    let (tables_proxy, queues_proxy) = (StorageProxy::start(table_port).await, StorageProxy::start(queue_port).await);
    let proxied: Vec<String> = cs
        .split(';')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some(("TableEndpoint", _)) => format!("TableEndpoint=http://127.0.0.1:{}/{table_path}", tables_proxy.port),
            Some(("QueueEndpoint", _)) => format!("QueueEndpoint=http://127.0.0.1:{}/{queue_path}", queues_proxy.port),
            _ => kv.to_string(),
        })
        .collect();
    let store = AzureStore::from_connection_string(&proxied.join(";")).unwrap();

    let (t, q) = (table_name(), queue_name());
    store.create_table(&t).await.unwrap();
    for i in 0..20 {
        store.insert(&t, &ent("p", &format!("r{i:02}"), i)).await.unwrap();
        assert!(store.get(&t, "p", &format!("r{i:02}")).await.unwrap().is_some());
    }
    let batch: Vec<BatchOp> = (0..5).map(|i| BatchOp::Upsert(ent("b", &format!("r{i}"), i))).collect();
    store.batch(&t, "b", &batch).await.unwrap();
    store.create_queue(&q).await.unwrap();
    for i in 0..10 {
        store.put_message(&q, &format!("m{i}"), Duration::ZERO).await.unwrap();
    }
    for m in store.receive_messages(&q, 32, Duration::from_secs(30)).await.unwrap() {
        store.delete_message(&q, &m.id, &m.pop_receipt).await.unwrap();
    }
    let (tables, queues) = (tables_proxy.relayed.load(SeqCst), queues_proxy.relayed.load(SeqCst));
    // 42 table and 22 queue requests, one after the other.
    assert!(
        tables <= 2 && queues <= 2,
        "connections opened: {tables} to the table endpoint, {queues} to the queue endpoint"
    );
    store.delete_table(&t).await.unwrap();
    store.delete_queue(&q).await.unwrap();
}
