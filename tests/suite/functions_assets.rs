//! Consistency of the Azure Functions deployment assets with each other and with the binary:
//! `host.json`, `functions/*/function.json`, `local.settings.json`, `infra/main.bicep` (+ its
//! parameters file) and `docs/FUNCTIONS.md` against `table_catalog::testing::settings::SETTINGS`, the
//! binary's default names and the handler's function/binding names.
//!
//! The Bicep file is read with a small line-based reader and a tiny expression evaluator
//! (string literals with `${}` interpolation, `toLower()`, params and vars); `main.bicep`
//! keeps one property per line so that this stays enough. Anything it cannot evaluate
//! (`uniqueString()`, resource properties) counts as "set, value unknown".

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use table_catalog::functions::{
    APPLY_BINDING, APPLY_FUNCTION, HANDLER_SUBCOMMAND, HTTP_ROUTE_PREFIX, SCAN_BINDING, SCAN_FUNCTION, SWEEP_BINDING,
    SWEEP_FUNCTION,
};
use table_catalog::testing::settings::{self, FunctionsApp, Setting, SETTINGS};

// ---------------------------------------------------------------------------------------------
// Reading the assets

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn json(rel: &str) -> Value {
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
}

fn host_json() -> Value {
    json("host.json")
}

/// Function folder name -> parsed function.json.
fn functions() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let dir = root().join("functions");
    for entry in fs::read_dir(&dir).expect("functions/ folder") {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_dir() {
            panic!("functions/ holds a non-folder: {}", entry.path().display());
        }
        let name = entry.file_name().into_string().unwrap();
        let rel = format!("functions/{name}/function.json");
        out.insert(name, json(&rel));
    }
    out
}

fn bindings(f: &Value) -> Vec<&Value> {
    f["bindings"].as_array().expect("function.json has a bindings array").iter().collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn local_values() -> BTreeMap<String, String> {
    let v = json("local.settings.json");
    assert_eq!(v["IsEncrypted"], Value::Bool(false), "local.settings.json: IsEncrypted must be false");
    v["Values"]
        .as_object()
        .expect("local.settings.json has Values")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_else(|| panic!("Values.{k} must be a string")).to_string()))
        .collect()
}

/// The binary's file name, as Cargo builds it.
fn binary_name() -> String {
    Path::new(env!("CARGO_BIN_EXE_table-catalog")).file_name().unwrap().to_string_lossy().into_owned()
}

/// What the Functions app needs set (by the operator) for the binary and the host.
fn functions_app_settings() -> Vec<&'static Setting> {
    SETTINGS.iter().filter(|s| s.required_in_functions_app()).collect()
}

/// True when `s` has a value in a settings source that has `is_set` names: set itself, or its
/// default is another setting's value (`{OTHER}` alone) and that one has a value.
fn satisfied(s: &Setting, is_set: &dyn Fn(&str) -> bool) -> bool {
    if is_set(s.name) {
        return true;
    }
    match s.default {
        Some(d) if d.starts_with('{') && d.ends_with('}') && d[1..d.len() - 1].chars().all(|c| c != '{') => {
            let other = &d[1..d.len() - 1];
            settings::find(other).is_some_and(|o| satisfied(o, is_set))
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// A minimal Bicep reader

#[derive(Debug)]
struct Bicep {
    /// param name -> default expression.
    params: BTreeMap<String, Option<String>>,
    vars: BTreeMap<String, String>,
    /// (symbol, type without api version, top-level `name:` expression).
    resources: Vec<(String, String, String)>,
    /// appSettings entries (name, value expression), in order.
    app_settings: Vec<(String, String)>,
}

impl Bicep {
    fn load() -> Bicep {
        Bicep::parse(&read("infra/main.bicep"))
    }

    fn parse(text: &str) -> Bicep {
        let lines: Vec<&str> = text.lines().collect();
        let mut b =
            Bicep { params: BTreeMap::new(), vars: BTreeMap::new(), resources: Vec::new(), app_settings: Vec::new() };
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            if let Some(rest) = line.strip_prefix("param ") {
                let (decl, default) = match rest.split_once(" = ") {
                    Some((d, e)) => (d, Some(e.trim().to_string())),
                    None => (rest, None),
                };
                let name = decl.split_whitespace().next().unwrap().to_string();
                b.params.insert(name, default);
            } else if let Some(rest) = line.strip_prefix("var ") {
                let (name, expr) = rest.split_once(" = ").unwrap_or_else(|| panic!("var line: {line}"));
                b.vars.insert(name.trim().to_string(), expr.trim().to_string());
            } else if let Some(rest) = line.strip_prefix("resource ") {
                let mut parts = rest.splitn(2, ' ');
                let symbol = parts.next().unwrap().to_string();
                let rtype = parts.next().unwrap().trim_start_matches('\'').split('@').next().unwrap().to_string();
                // Top-level properties of a resource body are indented by exactly two spaces.
                let mut name = String::new();
                let mut j = i + 1;
                while j < lines.len() && lines[j] != "}" {
                    if let Some(e) = lines[j].strip_prefix("  name: ") {
                        name = e.trim().to_string();
                    }
                    j += 1;
                }
                b.resources.push((symbol, rtype, name));
            }
            if line.trim() == "appSettings: [" {
                let indent = line.len() - line.trim_start().len();
                let mut j = i + 1;
                let mut pending: Option<String> = None;
                while j < lines.len() {
                    let l = lines[j];
                    if l.trim() == "]" && l.len() - l.trim_start().len() == indent {
                        break;
                    }
                    let t = l.trim();
                    if let Some(n) = t.strip_prefix("name: ") {
                        pending = Some(
                            literal(n).unwrap_or_else(|| panic!("app setting name must be a literal: {t}")).to_string(),
                        );
                    } else if let Some(v) = t.strip_prefix("value: ") {
                        let n = pending.take().unwrap_or_else(|| panic!("value without name: {t}"));
                        b.app_settings.push((n, v.trim().to_string()));
                    }
                    j += 1;
                }
                assert!(pending.is_none(), "app setting without value");
            }
            i += 1;
        }
        b
    }

    fn setting_names(&self) -> BTreeSet<&str> {
        self.app_settings.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn setting_expr(&self, name: &str) -> Option<&str> {
        self.app_settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Names (evaluated) of the resources of a type.
    fn resource_names(&self, rtype: &str, params: &BTreeMap<String, String>) -> BTreeSet<String> {
        self.resources
            .iter()
            .filter(|(_, t, _)| t == rtype)
            .map(|(s, _, n)| self.eval(n, params).unwrap_or_else(|| panic!("cannot evaluate the name of {s}: {n}")))
            .collect()
    }

    /// Evaluates `expr` with `params` overriding parameter defaults. `None` when the value is
    /// not statically known.
    fn eval(&self, expr: &str, params: &BTreeMap<String, String>) -> Option<String> {
        self.eval_depth(expr, params, 0)
    }

    fn eval_depth(&self, expr: &str, params: &BTreeMap<String, String>, depth: usize) -> Option<String> {
        assert!(depth < 32, "Bicep expression nests too deep (a cycle?): {expr}");
        let e = expr.trim();
        if let Some(body) = literal(e) {
            return self.interpolate(body, params, depth);
        }
        if let Some(arg) = call(e, "toLower") {
            return self.eval_depth(arg, params, depth + 1).map(|s| s.to_lowercase());
        }
        if !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            if let Some(v) = params.get(e) {
                return Some(v.clone());
            }
            if let Some(v) = self.vars.get(e) {
                return self.eval_depth(v, params, depth + 1);
            }
            if let Some(d) = self.params.get(e) {
                return d.as_deref().and_then(|d| self.eval_depth(d, params, depth + 1));
            }
            panic!("unknown Bicep identifier {e}");
        }
        None
    }

    fn interpolate(&self, body: &str, params: &BTreeMap<String, String>, depth: usize) -> Option<String> {
        let mut out = String::new();
        let mut rest = body;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after.find('}').expect("unclosed ${ in a Bicep string");
            out.push_str(&self.eval_depth(&after[..end], params, depth + 1)?);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Some(out)
    }
}

/// The body of a single-quoted Bicep string literal that is the whole expression.
fn literal(e: &str) -> Option<&str> {
    let body = e.strip_prefix('\'')?.strip_suffix('\'')?;
    (!body.contains('\'')).then_some(body)
}

/// The argument of `name(arg)` when that call is the whole expression.
fn call<'a>(e: &'a str, name: &str) -> Option<&'a str> {
    e.strip_prefix(name)?.strip_prefix('(')?.strip_suffix(')')
}

fn no_overrides() -> BTreeMap<String, String> {
    BTreeMap::new()
}

// ---------------------------------------------------------------------------------------------
// host.json

#[test]
fn host_json_starts_the_binary_in_handler_mode_with_proxying_and_forwarding() {
    let h = host_json();
    assert_eq!(h["version"], "2.0");
    let ch = &h["customHandler"];
    assert_eq!(ch["description"]["defaultExecutablePath"].as_str(), Some(binary_name().as_str()));
    assert_eq!(ch["description"]["arguments"], serde_json::json!([HANDLER_SUBCOMMAND]));
    assert_eq!(ch["enableForwardingHttpRequest"], Value::Bool(true));
    // Both flags: a host that knows proxying checks it first and streams (export, findings);
    // an older host ignores the unknown key and forwards (docs/FUNCTIONS.md §2).
    assert_eq!(ch["enableProxyingHttpRequest"], Value::Bool(true));
    // Newest hosts synthesise HTTP functions from customHandler.http and then refuse to start
    // with function.json files present; this app uses function.json files.
    assert!(ch.get("http").is_none(), "customHandler.http conflicts with function.json files");
    assert_eq!(h["extensionBundle"]["id"], "Microsoft.Azure.Functions.ExtensionBundle");
    assert_eq!(h["extensionBundle"]["version"], "[4.*, 5.0.0)");
    assert_eq!(h["extensions"]["http"]["routePrefix"].as_str(), Some(HTTP_ROUTE_PREFIX));
}

fn timespan_secs(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("expected a TimeSpan string, got {v}"));
    let parts: Vec<u64> = s.split(':').map(|p| p.parse().unwrap_or_else(|_| panic!("bad TimeSpan {s}"))).collect();
    assert_eq!(parts.len(), 3, "TimeSpan hh:mm:ss expected, got {s}");
    parts[0] * 3600 + parts[1] * 60 + parts[2]
}

#[test]
fn host_json_queue_settings_are_deliberate() {
    let q = &host_json()["extensions"]["queues"];
    for key in [
        "batchSize",
        "newBatchThreshold",
        "maxPollingInterval",
        "visibilityTimeout",
        "maxDequeueCount",
        "messageEncoding",
    ] {
        assert!(q.get(key).is_some(), "host.json extensions.queues.{key} must be set explicitly");
    }
    let batch = q["batchSize"].as_u64().unwrap();
    assert!((1..=32).contains(&batch), "batchSize must be 1..=32 (the queue service's limit), got {batch}");
    let max_dequeue = q["maxDequeueCount"].as_u64().unwrap();
    assert!(max_dequeue >= 2, "maxDequeueCount {max_dequeue} leaves no room for a retry");
    let visibility = timespan_secs(&q["visibilityTimeout"]);
    assert!(visibility > 0, "visibilityTimeout 0 retries a failing message immediately");
    timespan_secs(&q["maxPollingInterval"]);
    // Producers (the write path, other services) base64-encode message text; see FUNCTIONS.md.
    assert_eq!(q["messageEncoding"], "base64");
    assert_eq!(
        table_catalog::testing::messages::encode("{}"),
        "e30=",
        "the catalog's own producers must write base64 too"
    );
    timespan_secs(&host_json()["functionTimeout"]);
}

// ---------------------------------------------------------------------------------------------
// function.json files

/// Route and methods of each HTTP function: the API of ARCHITECTURE.md §6.
const HTTP_FUNCTIONS: &[(&str, &str, &[&str], &str)] = &[
    ("records", "records", &["get", "post", "put", "delete"], "function"),
    ("records_batch", "records/batch", &["post"], "function"),
    ("records_history", "records/history", &["get"], "function"),
    ("wal", "wal/{id}", &["get"], "function"),
    ("wal_dead", "wal/dead", &["get"], "function"),
    ("wal_redrive", "wal/dead/redrive", &["post"], "function"),
    ("health", "health", &["get"], "anonymous"),
    ("status", "status", &["get"], "function"),
    ("metrics", "metrics", &["get"], "function"),
    ("jobs", "jobs", &["get", "post"], "function"),
    ("jobs_id", "jobs/{id}", &["get", "delete"], "function"),
    ("jobs_findings", "jobs/{id}/findings", &["get"], "function"),
    ("export", "export", &["get"], "function"),
    ("indexes", "indexes", &["get", "post"], "function"),
    ("indexes_field", "indexes/{field}", &["delete"], "function"),
];

#[test]
fn function_folders_are_the_expected_set_with_valid_names() {
    let found: BTreeSet<String> = functions().into_keys().collect();
    let mut expected: BTreeSet<String> = HTTP_FUNCTIONS.iter().map(|f| f.0.to_string()).collect();
    expected.insert(APPLY_FUNCTION.to_string());
    expected.insert(SCAN_FUNCTION.to_string());
    expected.insert(SWEEP_FUNCTION.to_string());
    assert_eq!(found, expected);
    for name in &found {
        // The host's function name rule: ^[a-z][a-z0-9_-]{0,127}$ (case-insensitive); we keep
        // folder names lowercase so the invocation path `/{name}` is predictable.
        let mut chars = name.chars();
        assert!(chars.next().is_some_and(|c| c.is_ascii_lowercase()), "{name}");
        assert!(chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'), "{name}");
        assert!(name.len() <= 128);
        let entries: Vec<String> = fs::read_dir(root().join("functions").join(name))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(entries, ["function.json"], "functions/{name} must hold only function.json");
    }
}

#[test]
fn http_functions_qualify_for_forwarding() {
    let fns = functions();
    for (name, route, methods, auth) in HTTP_FUNCTIONS {
        let f = &fns[*name];
        let all = bindings(f);
        let inputs: Vec<&&Value> = all.iter().filter(|b| str_of(b, "direction") == Some("in")).collect();
        let outputs: Vec<&&Value> = all.iter().filter(|b| str_of(b, "direction") == Some("out")).collect();
        // The host forwards the raw request only to "one httpTrigger in + one http out" functions.
        assert_eq!(all.len(), 2, "{name}: only the two HTTP bindings");
        assert_eq!(inputs.len(), 1, "{name}: exactly one input binding");
        assert_eq!(outputs.len(), 1, "{name}: exactly one output binding");
        let trigger = inputs[0];
        assert_eq!(str_of(trigger, "type"), Some("httpTrigger"), "{name}");
        assert_eq!(str_of(outputs[0], "type"), Some("http"), "{name}");
        assert_eq!(str_of(trigger, "route"), Some(*route), "{name}: route");
        assert!(!route.starts_with(HTTP_ROUTE_PREFIX), "{name}: the host adds the route prefix");
        let got: BTreeSet<String> = trigger["methods"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: methods must be listed"))
            .iter()
            .map(|m| m.as_str().unwrap().to_lowercase())
            .collect();
        let want: BTreeSet<String> = methods.iter().map(|m| m.to_string()).collect();
        assert_eq!(got, want, "{name}: methods");
        assert_eq!(str_of(trigger, "authLevel"), Some(*auth), "{name}: authLevel");
    }
}

/// Every method of every HTTP function reaches a route of the API router at the path the host
/// forwards (`/{routePrefix}/{route}`): no 404 or 405.
#[tokio::test]
async fn http_functions_are_served_by_the_api_router() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    let store = std::sync::Arc::new(table_catalog::store::LocalStore::in_memory().unwrap());
    let names = table_catalog::config::Names::new("assets", None, None).unwrap();
    let schema = table_catalog::testing::schema::Schema::new(vec!["eid".into()], "lastname").unwrap();
    let catalog = table_catalog::catalog::Catalog::open(store, names, schema, Default::default()).await.unwrap();
    let app = table_catalog::functions::handler_router(std::sync::Arc::new(catalog));
    for (name, route, methods, _) in HTTP_FUNCTIONS {
        let path = format!("/{HTTP_ROUTE_PREFIX}/{}?eid=x", route.replace("{id}", "20250101T000000000000Z_x"));
        for method in *methods {
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&path)
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
            // A 404 from a handler (unknown WAL id) carries the API's JSON error; the router's
            // own 404 for an unrouted path has the code `no_route`.
            let api_error = serde_json::from_slice::<Value>(&body)
                .is_ok_and(|v| v.get("error").is_some_and(|e| e["code"] != "no_route"));
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED && (status != StatusCode::NOT_FOUND || api_error),
                "{method} {path} (function {name}) is not routed: {status}"
            );
        }
    }
}

#[test]
fn apply_function_triggers_on_the_apply_queue() {
    let fns = functions();
    let all = bindings(&fns[APPLY_FUNCTION]);
    assert_eq!(all.len(), 1, "apply has only its queue trigger (no outputs: the handler answers Outputs {{}})");
    let t = all[0];
    assert_eq!(str_of(t, "type"), Some("queueTrigger"));
    assert_eq!(str_of(t, "direction"), Some("in"));
    assert_eq!(str_of(t, "name"), Some(APPLY_BINDING));
    assert_eq!(str_of(t, "queueName").map(str::to_string), Some(format!("%{}%", settings::QUEUE)));
    assert_eq!(str_of(t, "connection").unwrap_or("AzureWebJobsStorage"), settings::WEBJOBS_STORAGE);
    // The handler decodes the default string binding (double-encoded JSON string); a binary
    // binding would arrive as base64 instead.
    assert!(matches!(str_of(t, "dataType"), None | Some("string")), "apply: dataType must stay string");
}

#[test]
fn scan_function_triggers_on_the_scan_queue() {
    let fns = functions();
    let all = bindings(&fns[SCAN_FUNCTION]);
    assert_eq!(all.len(), 1, "scan has only its queue trigger");
    let t = all[0];
    assert_eq!(str_of(t, "type"), Some("queueTrigger"));
    assert_eq!(str_of(t, "direction"), Some("in"));
    assert_eq!(str_of(t, "name"), Some(SCAN_BINDING));
    assert_eq!(str_of(t, "queueName").map(str::to_string), Some(format!("%{}%", settings::SCAN_QUEUE)));
    assert_eq!(str_of(t, "connection").unwrap_or("AzureWebJobsStorage"), settings::WEBJOBS_STORAGE);
    assert!(matches!(str_of(t, "dataType"), None | Some("string")), "scan: dataType must stay string");
}

#[test]
fn sweep_function_is_a_timer_at_most_once_a_minute() {
    let fns = functions();
    let all = bindings(&fns[SWEEP_FUNCTION]);
    assert_eq!(all.len(), 1);
    let t = all[0];
    assert_eq!(str_of(t, "type"), Some("timerTrigger"));
    assert_eq!(str_of(t, "direction"), Some("in"));
    assert_eq!(str_of(t, "name"), Some(SWEEP_BINDING));
    let schedule = str_of(t, "schedule").expect("schedule");
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    assert_eq!(
        fields.len(),
        6,
        "NCRONTAB has 6 fields: {{second}} {{minute}} {{hour}} {{day}} {{month}} {{day-of-week}}"
    );
    // A fixed second keeps the schedule at most once a minute, where the schedule monitor
    // (useMonitor, catch-up of missed runs) stays on.
    assert!(fields[0].chars().all(|c| c.is_ascii_digit()), "sweep must not fire more than once a minute");
    assert_ne!(t.get("runOnStartup"), Some(&Value::Bool(true)), "runOnStartup fires on every scale-out");
}

#[test]
fn invocation_paths_do_not_collide_with_forwarded_routes() {
    // Non-HTTP functions are invoked at `/{name}`, forwarded HTTP requests keep `/api/...`.
    for name in [APPLY_FUNCTION, SCAN_FUNCTION, SWEEP_FUNCTION] {
        assert_ne!(name, HTTP_ROUTE_PREFIX);
    }
    assert!(!HTTP_ROUTE_PREFIX.is_empty(), "an empty route prefix would mix API and invocation paths");
}

// ---------------------------------------------------------------------------------------------
// local.settings.json

#[test]
fn local_settings_set_every_functions_app_setting() {
    let values = local_values();
    assert!(values.get("FUNCTIONS_WORKER_RUNTIME").is_some_and(|v| v.eq_ignore_ascii_case("custom")));
    assert_eq!(values.get(settings::WEBJOBS_STORAGE).map(String::as_str), Some("UseDevelopmentStorage=true"));
    let is_set = |n: &str| values.get(n).is_some_and(|v| !v.is_empty());
    for s in functions_app_settings() {
        assert!(satisfied(s, &is_set), "local.settings.json does not set {}", s.name);
    }
    // Optional settings are listed, empty (off): placeholders, never a real secret.
    for s in SETTINGS.iter().filter(|s| s.functions_app == FunctionsApp::Optional) {
        assert_eq!(
            values.get(s.name).map(String::as_str),
            Some(""),
            "local.settings.json: {} as an empty placeholder",
            s.name
        );
    }
    for s in SETTINGS.iter().filter(|s| !matches!(s.functions_app, FunctionsApp::AppSetting | FunctionsApp::Optional)) {
        assert!(
            !values.contains_key(s.name),
            "local.settings.json sets {}, which the Functions app leaves unset ({:?})",
            s.name,
            s.functions_app
        );
    }
    for key in values.keys().filter(|k| k.starts_with("TABLE_CATALOG_")) {
        assert!(settings::find(key).is_some(), "local.settings.json sets {key}, which the binary does not read");
    }
}

#[test]
fn local_settings_names_are_the_binary_defaults() {
    let values = local_values();
    let none = |_: &str| None;
    for name in [settings::NAME, settings::WAL_NAME, settings::QUEUE] {
        assert_eq!(
            values.get(name).map(String::as_str),
            settings::default_value(name, &none).as_deref(),
            "local.settings.json {name} differs from the binary's default"
        );
    }
    assert_eq!(values[settings::NAME], settings::DEFAULT_NAME);
}

// ---------------------------------------------------------------------------------------------
// infra/main.bicep and its parameters

#[test]
fn bicep_sets_every_functions_app_setting() {
    let b = Bicep::load();
    let names = b.setting_names();
    // The apply trigger's connection `AzureWebJobsStorage`: a connection string, or the
    // identity-based form (credential + service URIs), which only the host can use.
    let identity_based = [
        "AzureWebJobsStorage__credential",
        "AzureWebJobsStorage__queueServiceUri",
        "AzureWebJobsStorage__blobServiceUri",
    ]
    .iter()
    .all(|n| names.contains(n));
    let is_set = |n: &str| names.contains(n) || (n == settings::WEBJOBS_STORAGE && identity_based);
    for s in functions_app_settings() {
        assert!(satisfied(s, &is_set), "infra/main.bicep does not set app setting {}", s.name);
    }
    for s in SETTINGS.iter().filter(|s| s.functions_app == FunctionsApp::Optional) {
        assert!(names.contains(s.name), "main.bicep does not set optional app setting {}", s.name);
    }
    // The HMAC secret is a Key Vault reference (or empty), never a value in the template.
    assert_eq!(b.setting_expr(settings::HASH_KEY), Some("hashKeyReference"));
    let reference = &b.vars["hashKeyReference"];
    assert!(reference.contains("'@Microsoft.KeyVault(VaultName=${hashKeyVaultName};SecretName=${hashKeySecretName})'"));
    assert!(reference.starts_with("empty(hashKeyVaultName) ? ''"), "{reference}");
    for s in SETTINGS.iter().filter(|s| {
        !matches!(s.functions_app, FunctionsApp::AppSetting | FunctionsApp::Identity | FunctionsApp::Optional)
    }) {
        assert!(
            !names.contains(s.name),
            "main.bicep sets {}, which the Functions app leaves unset ({:?})",
            s.name,
            s.functions_app
        );
    }
    for n in names.iter().filter(|n| n.starts_with("TABLE_CATALOG_")) {
        assert!(settings::find(n).is_some(), "main.bicep sets {n}, which the binary does not read");
    }
    // Keyless: the host and the binary both use the managed identity (AzureWebJobsStorage__*).
    assert!(identity_based, "main.bicep must use the identity-based AzureWebJobsStorage__* connection");
    for s in SETTINGS.iter().filter(|s| s.functions_app == FunctionsApp::Identity) {
        assert!(names.contains(s.name), "main.bicep does not set identity setting {}", s.name);
    }
    assert_eq!(
        b.setting_expr(settings::WEBJOBS_CREDENTIAL).and_then(literal),
        Some("managedidentity"),
        "AzureWebJobsStorage__credential"
    );
    for (name, value) in &b.app_settings {
        for secret in ["listKeys(", "AccountKey", "SharedAccessSignature", "sig="] {
            assert!(!value.contains(secret), "app setting {name} holds a key or SAS (`{secret}`)");
        }
        assert!(
            name == "APPLICATIONINSIGHTS_CONNECTION_STRING" || !name.to_ascii_lowercase().contains("connection_string"),
            "app setting {name} is a connection string"
        );
    }
    // Flex Consumption sets these itself (functionAppConfig.runtime) and rejects them.
    for n in
        ["FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE", "WEBSITE_CONTENTSHARE"]
    {
        assert!(!names.contains(n), "{n} must not be set on a Flex Consumption app");
    }
    assert!(names.contains("APPLICATIONINSIGHTS_CONNECTION_STRING"));
}

#[test]
fn bicep_deploys_a_linux_flex_consumption_custom_handler_app() {
    let text = read("infra/main.bicep");
    let b = Bicep::load();
    let types: BTreeSet<&str> = b.resources.iter().map(|(_, t, _)| t.as_str()).collect();
    for t in [
        "Microsoft.Storage/storageAccounts",
        "Microsoft.Storage/storageAccounts/tableServices/tables",
        "Microsoft.Storage/storageAccounts/queueServices/queues",
        "Microsoft.Web/serverfarms",
        "Microsoft.Web/sites",
        "Microsoft.ManagedIdentity/userAssignedIdentities",
        "Microsoft.Authorization/roleAssignments",
        "Microsoft.Insights/components",
    ] {
        assert!(types.contains(t), "main.bicep has no {t}");
    }
    for needle in [
        "tier: 'FlexConsumption'",
        "name: 'FC1'",
        "kind: 'functionapp,linux'",
        "reserved: true",
        "name: 'custom'",
        "version: '1.0'",
        "type: 'blobContainer'",
        // Role ids: Storage Blob Data Owner, Storage Queue Data Contributor, Storage Table
        // Data Contributor (the host's table endpoint and the binary's tables).
        "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
        "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
        "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
        // No storage key: Shared Key access is off.
        "allowSharedKeyAccess: false",
    ] {
        assert!(text.contains(needle), "main.bicep lacks `{needle}`");
    }
    for e in fs::read_dir(root().join("infra")).unwrap() {
        let path = e.unwrap().path();
        let content = fs::read_to_string(&path).unwrap_or_default();
        assert!(!content.contains("listKeys("), "{} reads a storage key (listKeys)", path.display());
    }
    assert!(!text.contains("allowSharedKeyAccess: true"), "main.bicep allows Shared Key access");
    // namePrefix becomes part of the storage account name: 3-10 characters, lowercase letters
    // and digits only (a storage account name allows nothing else).
    for needle in [
        "@minLength(3)\n@maxLength(10)\nparam namePrefix string",
        "var prefixAllowed = 'abcdefghijklmnopqrstuvwxyz0123456789'",
        "empty(prefixInvalidChars)",
    ] {
        assert!(text.contains(needle), "main.bicep does not validate namePrefix (`{needle}`)");
    }
}

/// Bicep's derivation of the storage names, for a given catalog name.
fn bicep_names(
    b: &Bicep,
    catalog: Option<&str>,
) -> (BTreeMap<&'static str, String>, BTreeSet<String>, BTreeSet<String>) {
    let mut params = no_overrides();
    if let Some(c) = catalog {
        params.insert("catalogName".to_string(), c.to_string());
    }
    let mut app = BTreeMap::new();
    for name in [settings::NAME, settings::WAL_NAME, settings::QUEUE, settings::SCAN_QUEUE] {
        let expr = b.setting_expr(name).unwrap_or_else(|| panic!("main.bicep does not set {name}"));
        app.insert(name, b.eval(expr, &params).unwrap_or_else(|| panic!("cannot evaluate {name}: {expr}")));
    }
    let tables = b.resource_names("Microsoft.Storage/storageAccounts/tableServices/tables", &params);
    let queues = b.resource_names("Microsoft.Storage/storageAccounts/queueServices/queues", &params);
    (app, tables, queues)
}

#[test]
fn bicep_names_agree_with_the_binary_defaults() {
    let b = Bicep::load();
    let default_catalog = b.params["catalogName"].as_deref().and_then(|d| b.eval(d, &no_overrides()));
    assert_eq!(default_catalog.as_deref(), Some(settings::DEFAULT_NAME));
    for catalog in [None, Some("Providers"), Some("abc123")] {
        let (app, tables, queues) = bicep_names(&b, catalog);
        let name = catalog.unwrap_or(settings::DEFAULT_NAME).to_string();
        let lookup = |n: &str| (n == settings::NAME).then(|| name.clone());
        let binary = |n: &str| settings::default_value(n, &lookup).unwrap();
        for n in [settings::NAME, settings::WAL_NAME, settings::QUEUE] {
            assert_eq!(app[n], binary(n), "{n} for catalog {name}: Bicep vs binary default");
        }
        let want_tables: BTreeSet<String> = [binary(settings::NAME), binary(settings::WAL_NAME)].into();
        assert_eq!(tables, want_tables, "tables for catalog {name}");
        let queue = binary(settings::QUEUE);
        let scan = binary(settings::SCAN_QUEUE);
        assert_eq!(app[settings::SCAN_QUEUE], scan, "scan queue for catalog {name}");
        let want_queues: BTreeSet<String> =
            [settings::poison_queue_name(&queue), queue, settings::poison_queue_name(&scan), scan].into();
        assert_eq!(queues, want_queues, "queues for catalog {name}");
    }
    let (_, tables, queues) = bicep_names(&b, None);
    assert_eq!(tables, ["catalog", "catalogwal"].map(String::from).into());
    assert_eq!(
        queues,
        ["catalog-apply", "catalog-apply-poison", "catalog-apply-scan", "catalog-apply-scan-poison"]
            .map(String::from)
            .into()
    );
}

#[test]
fn parameters_file_fits_the_bicep_and_local_settings() {
    let b = Bicep::load();
    let p = json("infra/main.parameters.json");
    let params = p["parameters"].as_object().expect("parameters object");
    for name in params.keys() {
        assert!(b.params.contains_key(name), "main.parameters.json sets unknown param {name}");
    }
    for (name, default) in &b.params {
        if default.is_none() {
            assert!(params.contains_key(name), "required param {name} missing from main.parameters.json");
        }
    }
    // The example deployment and the local settings describe the same catalog.
    let values = local_values();
    let value = |n: &str| params[n]["value"].as_str().unwrap().to_string();
    assert_eq!(value("catalogName"), values[settings::NAME]);
    assert_eq!(value("indexKeys"), values[settings::INDEX_KEYS]);
    assert_eq!(value("rowKey"), values[settings::ROW_KEY]);
    for (setting, param) in
        [(settings::INDEX_KEYS, "indexKeys"), (settings::ROW_KEY, "rowKey"), (settings::NAME, "catalogName")]
    {
        let expr = b.setting_expr(setting).unwrap();
        let marker: BTreeMap<String, String> = [(param.to_string(), "Marker7".to_string())].into();
        assert_eq!(b.eval(expr, &marker).as_deref(), Some("Marker7"), "{setting} must come from param {param}");
    }
}

// ---------------------------------------------------------------------------------------------
// The binary's source and the docs

/// Environment variables read in src/ that are not settings: test-only switches.
/// Read from the environment but not TableCatalog settings: a crash-point hook, and
/// `NO_COLOR` (the cross-tool convention of no-color.org, like `RUST_LOG`).
const NOT_SETTINGS: &[&str] = &["TABLE_CATALOG_CRASH_AT", "NO_COLOR"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// String literals that follow one of `prefixes` (`var("`, `env = "`, ...).
fn literals_after(text: &str, prefixes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for p in prefixes {
        let mut rest = text;
        while let Some(i) = rest.find(p) {
            let after = &rest[i + p.len()..];
            if let Some(end) = after.find('"') {
                out.push(after[..end].to_string());
            }
            rest = after;
        }
    }
    out
}

/// `TABLE_CATALOG_*` identifiers anywhere in `text`.
fn catalog_identifiers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("TABLE_CATALOG_") {
        let tail = &rest[i..];
        let len =
            tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..len].trim_end_matches('_').to_string());
        rest = &tail[len..];
    }
    out
}

#[test]
fn the_source_reads_only_listed_settings() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let settings_rs = root().join("src").join("settings.rs");
    let mut unknown = BTreeSet::new();
    for f in files.iter().filter(|f| **f != settings_rs) {
        let text = fs::read_to_string(f).unwrap();
        let mut names = literals_after(&text, &["env::var(\"", "env::var_os(\"", "env = \""]);
        names.extend(catalog_identifiers(&text));
        for n in names {
            if settings::find(&n).is_none() && !NOT_SETTINGS.contains(&n.as_str()) && !n.starts_with("TC_TEST_") {
                unknown.insert(format!("{n} ({})", f.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(unknown.is_empty(), "environment variables read but not in settings::SETTINGS: {unknown:?}");
}

#[test]
fn functions_doc_covers_every_setting_and_function() {
    let doc = read("docs/FUNCTIONS.md");
    for s in SETTINGS {
        assert!(doc.contains(s.name), "docs/FUNCTIONS.md does not mention {}", s.name);
    }
    for name in functions().keys() {
        assert!(doc.contains(&format!("`{name}`")), "docs/FUNCTIONS.md does not describe function `{name}`");
    }
}

/// The README's configuration table has a row for every setting, with its literal default,
/// and no row for a setting that does not exist.
#[test]
fn readme_configuration_table_matches_the_settings() {
    let readme = read("README.md");
    let section = readme.split("## Configuration").nth(1).expect("README has a Configuration section");
    let rows: Vec<&str> =
        section.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("| `")).collect();
    for s in SETTINGS {
        let name = format!("`{}`", s.name);
        let row = rows
            .iter()
            .find(|r| r.contains(&name))
            .unwrap_or_else(|| panic!("README's configuration table has no row for {name}"));
        if let Some(default) = s.default.filter(|d| !d.contains('{')) {
            assert!(
                row.contains(&format!("`{default}")),
                "README gives {name} another default than `{default}`: {row}"
            );
        }
    }
    for row in &rows {
        let first = row.split('|').nth(1).unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            assert!(settings::find(name).is_some(), "README documents {name}, which is not in settings::SETTINGS");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reader itself

#[test]
fn bicep_reader_evaluates_the_supported_subset() {
    let b = Bicep::parse(
        "param a string = 'Xy'\nparam req string\nvar b = '${a}wal'\nvar c = toLower('${a}-q')\nvar d = uniqueString(a)\n\
         resource t 'Microsoft.X/y@2020-01-01' = {\n  name: c\n  properties: {\n    name: 'inner'\n  }\n}\n",
    );
    let none = no_overrides();
    assert_eq!(b.eval("b", &none).as_deref(), Some("Xywal"));
    assert_eq!(b.eval("c", &none).as_deref(), Some("xy-q"));
    assert_eq!(b.eval("d", &none), None);
    assert_eq!(b.eval("req", &none), None);
    assert_eq!(b.resource_names("Microsoft.X/y", &none), ["xy-q".to_string()].into());
    let over: BTreeMap<String, String> = [("a".to_string(), "Q".to_string())].into();
    assert_eq!(b.eval("b", &over).as_deref(), Some("Qwal"));
}
