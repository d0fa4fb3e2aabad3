//! A stand-in for the Azure Functions host (v4) running this custom-handler app, for tests.
//! The facts it reproduces, with their sources, are in
//! docs/FUNCTIONS.md (the host contract the handler relies on)
//! and `docs/FUNCTIONS.md`.
//!
//! [`Harness::start`] reads `host.json`, every `functions/*/function.json` and
//! `local.settings.json` ([`app`]), starts the binary under test as the custom handler
//! ([`process`]: executable standing for `defaultExecutablePath`, host.json `arguments`,
//! environment = `local.settings.json` `Values` overridden by the test's settings plus the
//! host's variables, readiness by `GET /` every 25 ms for at most 30 s), then plays the host:
//!
//! - HTTP functions: a front end on its own port routes `/{routePrefix}/{route}` by the
//!   function.json `route` and `methods` and hands matching requests to the handler in
//!   proxying mode (streamed both ways) or forwarding mode (rebuilt, answer buffered), as
//!   host.json says or `HarnessOptions::http_mode` overrides ([`front`]); other requests get
//!   the host's 404;
//! - the queue trigger: a listener on the real queue in Azurite, with the host's decoding,
//!   payload, response judging, retry and poison rules from host.json ([`queue`]);
//! - the timer trigger: [`Harness::fire_timer`] sends the `TimerInfo` invocation
//!   ([`timer`] computes `ScheduleStatus` from the NCRONTAB schedule).
//!
//! For failure tests it can put a TCP proxy between the handler and the Table service that
//! answers `503 ServerBusy` on demand ([`proxy`]), and "lose" the delete of a processed
//! message so that it is redelivered ([`Harness::lose_next_deletes`]).
//!
//! Deviations from the host, all explicit: `HarnessOptions::visibility_timeout` can shorten
//! host.json's `visibilityTimeout` (retry tests would otherwise take minutes); the timer is
//! fired by the test, not by its schedule; `InsertionTime` is the time the harness first saw
//! the message (the `QueueStore` trait does not return it).
#![allow(dead_code)]

pub mod app;
pub mod client;
pub mod front;
pub mod payload;
pub mod process;
pub mod proxy;
pub mod queue;
pub mod timer;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use table_catalog::store::AzureStore;
use table_catalog::store::{QueueStore, ReceivedMessage, TableStore};
use table_catalog::testing::settings;

use app::{resolve_setting_refs, App, HttpMode, Trigger};
use payload::Verdict;
use process::HandlerProcess;
use proxy::StorageProxy;
use queue::QueueListener;

/// One invocation of a non-HTTP function.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub function: String,
    pub invocation_id: String,
    /// Queue message id (queue trigger only).
    pub message_id: Option<String>,
    pub dequeue_count: Option<u32>,
    /// Decoded message text (queue trigger only).
    pub message_text: Option<String>,
    /// The body sent.
    pub request: Value,
    /// HTTP status, `None` when no response came.
    pub status: Option<u16>,
    pub response_body: String,
    pub verdict: Verdict,
    pub elapsed: Duration,
}

impl Invocation {
    /// The `Logs` of a successful invocation (the host drops them on failure).
    pub fn logs(&self) -> &[String] {
        match &self.verdict {
            Verdict::Success { logs, .. } => logs,
            _ => &[],
        }
    }

    pub fn succeeded(&self) -> bool {
        self.verdict.is_success()
    }
}

/// What the queue listener did with a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Deleted {
        id: String,
        dequeue_count: u32,
    },
    Released {
        id: String,
        dequeue_count: u32,
        after: Duration,
    },
    /// Copied to the poison queue (as `poison_id`) and deleted.
    Poisoned {
        id: String,
        dequeue_count: u32,
        poison_id: String,
        reason: String,
    },
    /// A successful invocation whose delete was lost on purpose (message visible again).
    DeleteLost {
        id: String,
        dequeue_count: u32,
    },
    /// The trigger value could not be bound (not UTF-8): a failed attempt without a POST.
    BindingFailed {
        id: String,
        dequeue_count: u32,
    },
    ListenerError(String),
}

/// State shared by the harness tasks.
#[derive(Default)]
pub struct Shared {
    invocations: Mutex<Vec<Invocation>>,
    events: Mutex<Vec<(Instant, Event)>>,
    /// Handler behaviours the host would not report but that are bugs (empty 2xx bodies).
    bugs: Mutex<Vec<String>>,
    pub polls_empty: AtomicU64,
}

impl Shared {
    pub fn record(&self, inv: Invocation) {
        if let Verdict::Bug(b) = &inv.verdict {
            self.bugs.lock().unwrap().push(format!("{} invocation {}: {b}", inv.function, inv.invocation_id));
        }
        self.invocations.lock().unwrap().push(inv);
    }

    pub fn event(&self, e: Event) {
        self.events.lock().unwrap().push((Instant::now(), e));
    }
}

/// What a test configures.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// Azurite connection string with explicit endpoints (`TC_TEST_AZURE_CONNECTION`).
    pub connection_string: String,
    /// `TABLE_CATALOG_NAME`; the WAL table and queue names follow it.
    pub catalog_name: String,
    pub index_keys: String,
    pub row_key: String,
    /// "Azure mode": function/admin-level HTTP functions require this key.
    pub function_key: Option<String>,
    /// Route the handler's Table traffic through a [`StorageProxy`] that can fail it.
    pub storage_proxy: bool,
    /// Overrides host.json `visibilityTimeout` (a documented deviation, for speed).
    pub visibility_timeout: Option<Duration>,
    /// `RUST_LOG` of the handler.
    pub rust_log: String,
    /// Print the handler's output as it comes (`TC_HARNESS_ECHO=1`).
    pub echo: bool,
    /// Upper bound of one invocation (the host's is functionTimeout + 1 min).
    pub invocation_timeout: Duration,
    /// Overrides the HTTP mode host.json gives: `Forwarding` plays a host that predates
    /// `enableProxyingHttpRequest` (it ignores the key), `Proxying` one that has it. `None`:
    /// host.json as a current host reads it (proxying wins when both flags are set).
    pub http_mode: Option<HttpMode>,
    /// Seed of the queue listener's polling jitter (`TC_HARNESS_SEED`, default 20261121);
    /// printed with the diagnostics when a test fails.
    pub seed: u64,
}

impl HarnessOptions {
    /// Defaults for an airports catalog (`icao,iata,lid`, row key `name`) with a unique name.
    pub fn airports(connection_string: &str) -> HarnessOptions {
        HarnessOptions {
            connection_string: connection_string.to_string(),
            catalog_name: format!("fh{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            index_keys: "icao,iata,lid".into(),
            row_key: "name".into(),
            function_key: None,
            storage_proxy: false,
            visibility_timeout: None,
            rust_log: "info".into(),
            echo: std::env::var_os("TC_HARNESS_ECHO").is_some(),
            invocation_timeout: Duration::from_secs(120),
            http_mode: None,
            seed: std::env::var("TC_HARNESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261121),
        }
    }
}

/// The connection string with its `TableEndpoint` port replaced.
fn with_table_port(cs: &str, port: u16) -> String {
    let mut found = false;
    let parts: Vec<String> = cs
        .split(';')
        .map(|part| match part.split_once('=') {
            Some((k, v)) if k.trim().eq_ignore_ascii_case("TableEndpoint") => {
                let mut url = reqwest::Url::parse(v.trim()).expect("TableEndpoint URL");
                url.set_port(Some(port)).unwrap();
                found = true;
                format!("{k}={}", url.as_str().trim_end_matches('/'))
            }
            _ => part.to_string(),
        })
        .collect();
    assert!(found, "the storage proxy needs a connection string with an explicit TableEndpoint");
    parts.join(";")
}

fn table_port(cs: &str) -> u16 {
    cs.split(';')
        .find_map(|p| {
            p.split_once('=').filter(|(k, _)| k.trim().eq_ignore_ascii_case("TableEndpoint")).map(|(_, v)| v.trim())
        })
        .and_then(|v| reqwest::Url::parse(v).ok())
        .and_then(|u| u.port_or_known_default())
        .expect("an explicit TableEndpoint with a port")
}

/// The running host stand-in.
pub struct Harness {
    pub app: Arc<App>,
    /// Environment of the handler (app settings and host variables).
    pub env: BTreeMap<String, String>,
    pub options: HarnessOptions,
    /// The apply queue the trigger listens on (resolved `queueName`).
    pub queue: String,
    pub poison_queue: String,
    /// The host's storage (`connection` of the queue trigger).
    pub store: Arc<AzureStore>,
    pub shared: Arc<Shared>,
    pub http_records: Arc<Mutex<Vec<front::HttpRecord>>>,
    pub front_port: u16,
    pub handler: HandlerProcess,
    /// The `apply` function's listener.
    listener: Arc<QueueListener>,
    /// Every queue-triggered function's listener, by function name.
    listeners: BTreeMap<String, Arc<QueueListener>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    proxy: Option<StorageProxy>,
    client: reqwest::Client,
}

impl Harness {
    /// Loads the app, starts the handler and waits until it is ready, then starts the front
    /// end and the queue listener.
    pub async fn start(options: HarnessOptions) -> Harness {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut app = App::load(root);
        if let Some(mode) = options.http_mode {
            app.host.set_http_mode(mode);
        }
        let app = Arc::new(app);
        for f in app.http_functions() {
            let Trigger::Http { in_and_out_only, .. } = &f.trigger else { unreachable!() };
            assert!(
                app.host.http_mode().is_some() && *in_and_out_only,
                "{}: payload-mode HTTP invocation is not implemented by this harness",
                f.name
            );
        }
        let proxy = if options.storage_proxy {
            Some(StorageProxy::start(table_port(&options.connection_string)).await)
        } else {
            None
        };
        let handler_cs = match &proxy {
            Some(p) => with_table_port(&options.connection_string, p.port),
            None => options.connection_string.clone(),
        };

        let name = options.catalog_name.clone();
        let worker_id = uuid::Uuid::new_v4().to_string();
        let mut env = app.local_values.clone();
        env.insert(settings::WEBJOBS_STORAGE.into(), options.connection_string.clone());
        env.insert(settings::CONNECTION_STRING.into(), handler_cs);
        env.insert(settings::NAME.into(), name.clone());
        env.insert(settings::WAL_NAME.into(), format!("{name}wal"));
        env.insert(settings::QUEUE.into(), format!("{}-apply", name.to_lowercase()));
        env.insert(settings::SCAN_QUEUE.into(), format!("{}-apply-scan", name.to_lowercase()));
        env.insert(settings::INDEX_KEYS.into(), options.index_keys.clone());
        env.insert(settings::ROW_KEY.into(), options.row_key.clone());
        // Set by the host for the worker process (the ports below).
        env.insert("FUNCTIONS_CUSTOMHANDLER_WORKER_ID".into(), worker_id.clone());
        env.insert("FUNCTIONS_HTTPWORKER_ID".into(), worker_id);
        env.insert("FUNCTIONS_APP_ROOT_PATH".into(), root.display().to_string());
        // Not an app setting: inherited from the host process's environment.
        env.insert("RUST_LOG".into(), options.rust_log.clone());

        let exe = Path::new(env!("CARGO_BIN_EXE_table-catalog"));
        let mut attempts = 0;
        let (handler, port) = loop {
            let port = process::free_port();
            env.insert(settings::CUSTOMHANDLER_PORT.into(), port.to_string());
            env.insert("FUNCTIONS_HTTPWORKER_PORT".into(), port.to_string());
            match HandlerProcess::start(&app, exe, &env, port, options.echo).await {
                Ok(h) => break (h, port),
                // Like the host, the harness hands over a port it found free; another process
                // can take it before the handler binds it. Then pick another.
                Err(e) if attempts < 3 && e.contains(&format!("binding 127.0.0.1:{port}")) => attempts += 1,
                Err(e) => panic!("starting the custom handler: {e}"),
            }
        };

        let shared = Arc::new(Shared::default());
        let mut queue_options = app.host.queues.clone();
        if let Some(v) = options.visibility_timeout {
            queue_options.visibility_timeout = v;
        }
        let invocation_timeout = app
            .host
            .function_timeout
            .map(|t| t + Duration::from_secs(60))
            .unwrap_or(Duration::MAX)
            .min(options.invocation_timeout);
        // One listener per queue-triggered function, as the host runs them.
        let mut listeners = BTreeMap::new();
        let mut store = None;
        for f in app.functions.iter().filter(|f| matches!(f.trigger, Trigger::Queue { .. })) {
            let Trigger::Queue { binding, queue_name, connection, data_type } = &f.trigger else { unreachable!() };
            let queue =
                resolve_setting_refs(queue_name, &env).unwrap_or_else(|e| panic!("{}: {e}", f.name)).to_lowercase();
            let host_cs =
                env.get(connection).unwrap_or_else(|| panic!("{}: connection setting {connection} is not set", f.name));
            let store = store
                .get_or_insert_with(|| {
                    Arc::new(AzureStore::from_connection_string(host_cs).expect("host storage connection string"))
                })
                .clone();
            let listener = Arc::new(QueueListener::new(
                store,
                queue,
                f.name.clone(),
                binding.clone(),
                data_type.as_deref() == Some("binary"),
                queue_options.clone(),
                port,
                invocation_timeout,
                shared.clone(),
                options.seed,
            ));
            listeners.insert(f.name.clone(), listener);
        }
        let store = store.expect("the app has a queue-triggered function");
        let listener = listeners.get("apply").expect("the app has the apply function").clone();
        let queue = listener.queue.clone();
        let poison_queue = listener.poison_queue().expect("apply queue has a poison queue");

        let http_records = Arc::new(Mutex::new(Vec::new()));
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let front_state = Arc::new(front::Front {
            app: app.clone(),
            handler_port: port,
            function_key: options.function_key.clone(),
            client: client.clone(),
            proxy_client: front::proxy_client(),
            records: http_records.clone(),
        });
        let (front_port, front_task) = front::start(front_state).await;
        let mut tasks = vec![front_task];
        tasks.extend(listeners.values().map(|l| tokio::spawn(l.clone().run())));

        Harness {
            app,
            env,
            options,
            queue,
            poison_queue,
            store,
            shared,
            http_records,
            front_port,
            handler,
            listener,
            listeners,
            tasks,
            proxy,
            client,
        }
    }

    pub fn catalog_name(&self) -> &str {
        &self.options.catalog_name
    }

    /// `http://127.0.0.1:{front}{path_and_query}`: the app's public address.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://127.0.0.1:{}{path_and_query}", self.front_port)
    }

    /// A client for the front end.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// `GET path` through the front end: (status, JSON body or `null`).
    pub async fn get_json(&self, path_and_query: &str) -> (u16, Value) {
        let r = self.client.get(self.url(path_and_query)).send().await.expect("GET through the harness");
        let status = r.status().as_u16();
        let body = r.bytes().await.unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// Puts a raw message text on the apply queue (no encoding); returns its id.
    pub async fn put_raw(&self, text: &str) -> String {
        self.store.put_message(&self.queue, text, Duration::ZERO).await.expect("put_message")
    }

    /// Puts `json` on the apply queue the way another service must: base64 of the UTF-8.
    pub async fn put_intent(&self, json: &str) -> String {
        self.put_raw(&base64::engine::general_purpose::STANDARD.encode(json.as_bytes())).await
    }

    pub fn invocations(&self) -> Vec<Invocation> {
        self.shared.invocations.lock().unwrap().clone()
    }

    pub fn invocations_of(&self, message_id: &str) -> Vec<Invocation> {
        self.invocations().into_iter().filter(|i| i.message_id.as_deref() == Some(message_id)).collect()
    }

    pub fn events(&self) -> Vec<Event> {
        self.shared.events.lock().unwrap().iter().map(|(_, e)| e.clone()).collect()
    }

    pub fn events_with_time(&self) -> Vec<(Instant, Event)> {
        self.shared.events.lock().unwrap().clone()
    }

    pub fn bugs(&self) -> Vec<String> {
        self.shared.bugs.lock().unwrap().clone()
    }

    pub fn http_records(&self) -> Vec<front::HttpRecord> {
        self.http_records.lock().unwrap().clone()
    }

    /// Listener errors so far (storage errors of the harness itself).
    pub fn listener_errors(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::ListenerError(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// Polls `cond` every 50 ms until it holds; panics with `what` after `timeout`.
    pub async fn wait_for(&self, timeout: Duration, what: &str, mut cond: impl FnMut(&Harness) -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() >= deadline {
                panic!("timed out after {timeout:?} waiting for {what}\n{}", self.diagnostics());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the apply queue is empty (visible or not) and nothing is in flight.
    pub async fn wait_queue_drained(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let count = self.store.approximate_count(&self.queue).await.unwrap_or(u64::MAX);
            if count == 0 && self.listener.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            if Instant::now() >= deadline {
                panic!("apply queue not drained after {timeout:?} ({count} messages)\n{}", self.diagnostics());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Makes the next `n` message deletes of function `function`'s listener get lost.
    pub fn lose_next_deletes_of(&self, function: &str, n: usize) {
        let l = self.listeners.get(function).unwrap_or_else(|| panic!("no queue function {function}"));
        l.lose_deletes.store(n, Ordering::SeqCst);
    }

    /// Fires the timer function once, as its schedule would now.
    pub async fn fire_timer(&self) -> Invocation {
        let f = self.app.only("timer");
        let Trigger::Timer { binding, schedule, use_monitor, .. } = &f.trigger else { unreachable!() };
        let cron = timer::Cron::parse(schedule).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let now = time::OffsetDateTime::now_utc();
        let monitor = *use_monitor && !cron.fires_more_than_once_a_minute(now);
        let status = monitor.then(|| {
            let last = cron.last_at_or_before(now).expect("a previous occurrence");
            payload::ScheduleStatus { last, next: cron.next_after(now).expect("a next occurrence"), last_updated: last }
        });
        let body = payload::timer_invocation(&f.name, binding, status.as_ref(), false);
        queue::invoke(self.handler.port, &f.name, body, None, self.listener.invocation_timeout, &self.shared).await
    }

    /// Reads (and hides for a minute) every message on the poison queue.
    pub async fn poison_messages(&self) -> Vec<ReceivedMessage> {
        let mut out = Vec::new();
        loop {
            let batch = self
                .store
                .receive_messages(&self.poison_queue, 32, Duration::from_secs(60))
                .await
                .expect("poison queue");
            if batch.is_empty() {
                return out;
            }
            out.extend(batch);
        }
    }

    /// The next `n` successful invocations do not delete their message: it becomes visible
    /// again at once, as if the host had died before the delete and the lease had run out.
    pub fn lose_next_deletes(&self, n: usize) {
        self.lose_next_deletes_of("apply", n);
    }

    /// Starts or ends a Table-service outage for the handler (needs `storage_proxy`).
    pub fn storage_outage(&self, on: bool) {
        self.proxy.as_ref().expect("HarnessOptions::storage_proxy").set_outage(on);
    }

    /// Requests the proxy refused with 503 so far.
    pub fn storage_requests_refused(&self) -> u64 {
        self.proxy.as_ref().map_or(0, |p| p.refused.load(Ordering::SeqCst))
    }

    /// The handler's output so far.
    pub fn handler_output(&self) -> Vec<String> {
        self.handler.output.lock().unwrap().clone()
    }

    /// Handler output tail, invocations and events, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut s = String::new();
        s.push_str("--- invocations (last 20) ---\n");
        let invs = self.invocations();
        for i in &invs[invs.len().saturating_sub(20)..] {
            s.push_str(&format!(
                "{} msg={:?} n={:?} status={:?} {:?} body={}\n",
                i.function,
                i.message_id,
                i.dequeue_count,
                i.status,
                i.verdict,
                i.response_body.chars().take(300).collect::<String>()
            ));
        }
        s.push_str("--- queue events (last 20) ---\n");
        let ev = self.events();
        for e in &ev[ev.len().saturating_sub(20)..] {
            s.push_str(&format!("{e:?}\n"));
        }
        s.push_str("--- handler output (last 30 lines) ---\n");
        s.push_str(&self.handler.output_tail(30));
        s
    }

    /// Stops the listener, the front end and the handler, and deletes the catalog's tables
    /// and queues (best effort).
    pub async fn stop(mut self) {
        for l in self.listeners.values() {
            l.stop.store(true, Ordering::SeqCst);
        }
        for t in &self.tasks {
            t.abort();
        }
        self.handler.kill().await;
        let name = self.options.catalog_name.clone();
        for table in [name.clone(), format!("{name}wal")] {
            let _ = self.store.delete_table(&table).await;
        }
        for l in self.listeners.values() {
            for q in [Some(l.queue.clone()), l.poison_queue()].into_iter().flatten() {
                let _ = self.store.delete_queue(&q).await;
            }
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for l in self.listeners.values() {
            l.stop.store(true, Ordering::SeqCst);
        }
        for t in &self.tasks {
            t.abort();
        }
        if std::thread::panicking() {
            eprintln!(
                "=== harness diagnostics ({}, seed {}: TC_HARNESS_SEED={} reproduces the jitter) ===\n{}",
                self.options.catalog_name,
                self.options.seed,
                self.options.seed,
                self.diagnostics()
            );
        }
    }
}

/// The Azurite connection string, or `None` after reporting the running test as skipped
/// (see `tests/common/skip.rs`; under `CI` a missing Azurite is a failure).
pub fn azurite() -> Option<String> {
    crate::common::skip::azurite(&crate::common::skip::current_test())
}
