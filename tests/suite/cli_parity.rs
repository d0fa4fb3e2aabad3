//! The CLI and the HTTP API answer alike (issue 28): `query --allow-partial` reads a
//! backfilling index as `allow_partial=true` does, and the `index_not_ready` error names both;
//! `query --limit 0` fails with the message of HTTP's 400; `wal show ID` prints the JSON of
//! `GET /api/wal/{id}`. The binary runs on an embedded store that the test also opens
//! in-process, behind the HTTP router.

use crate::common;

use std::path::Path;
use std::process::Output;

use axum::body::Body;
use serde_json::Value;
use table_catalog::config::Config;

const ARGS: [&str; 6] = ["--name", "parity", "--index-keys", "icao,iata", "--row-key", "name"];

fn bin(store: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env("RUST_LOG", "error")
        .args(ARGS)
        .arg("--local-path")
        .arg(store)
        .args(args)
        .output()
        .expect("run table-catalog")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout_json(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test]
async fn cli_and_http_answer_alike() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path();
    for (icao, country) in [("KAAA", "US"), ("KBBB", "US"), ("EGLL", "GB")] {
        let r = format!(r#"{{"icao":"{icao}","name":"Field {icao}","country":"{country}"}}"#);
        assert!(bin(store, &["insert", &r]).status.success());
    }
    // An added index that stays backfilling: no worker runs its job (--parallel 0).
    let added = bin(store, &["index", "add", "country", "--parallel", "0"]);
    assert!(added.status.success(), "{}", stderr(&added));
    let catalog = std::sync::Arc::new(Config::new("parity").local_path(store).open().await.expect("open"));
    let app = table_catalog::http::router(catalog.clone());

    // A lookup on it: refused alike, and the error names the CLI flag and the HTTP parameter.
    let refused = bin(store, &["query", "country=US"]);
    assert_eq!(refused.status.code(), Some(1));
    let (status, body) = common::call(&app, "GET", "/api/records?country=US", None, Body::empty()).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (409, Some("index_not_ready")), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for want in ["--allow-partial", "allow_partial=true"] {
        assert!(message.contains(want) && stderr(&refused).contains(want), "{want}: {message} / {}", stderr(&refused));
    }
    // Read anyway: the same records (the rows the index has so far; here none were backfilled).
    let partial = bin(store, &["query", "country=US", "--allow-partial"]);
    assert!(partial.status.success(), "{}", stderr(&partial));
    let (status, body) =
        common::call(&app, "GET", "/api/records?country=US&allow_partial=true", None, Body::empty()).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(Value::Array(stdout_json(&partial)), body["records"]);

    // --limit 0: the error HTTP's 400 carries.
    let zero = bin(store, &["query", "icao=KAAA", "--limit", "0"]);
    assert_eq!(zero.status.code(), Some(1), "{}", stderr(&zero));
    let (status, body) = common::call(&app, "GET", "/api/records?icao=KAAA&limit=0", None, Body::empty()).await;
    assert_eq!(status.as_u16(), 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty() && stderr(&zero).contains(message), "{message} / {}", stderr(&zero));
    // A limit over one page still pages (the CLI's limit is a total, not a page size).
    let many = bin(store, &["query", "icao=KAAA", "--limit", "5000"]);
    assert_eq!(stdout_json(&many).len(), 1, "{}", stderr(&many));

    // wal show ID: the JSON of GET /api/wal/{id}, for an applied id, one below the
    // checkpoint that was never logged, and (exit 1 / 404) one above every checkpoint.
    let w = bin(store, &["insert", "--upsert", r#"{"icao":"KCCC","name":"Field KCCC"}"#]);
    let id = stdout_json(&w)[0]["id"].as_str().expect("id").to_string();
    let never = "2000-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000";
    for (id, state) in [(id.as_str(), "applied"), (never, "unknown")] {
        let shown = bin(store, &["wal", "show", id]);
        assert!(shown.status.success(), "{}", stderr(&shown));
        let (status, body) = common::call(&app, "GET", &format!("/api/wal/{id}"), None, Body::empty()).await;
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_eq!(stdout_json(&shown), std::slice::from_ref(&body), "wal show {id}");
        assert_eq!(body["state"], state, "{body}");
    }
    let above = "2999-01-01T00:00:00.000000_00000000-0000-0000-0000-000000000000";
    let shown = bin(store, &["wal", "show", above]);
    assert_eq!(shown.status.code(), Some(1));
    let (status, body) = common::call(&app, "GET", &format!("/api/wal/{above}"), None, Body::empty()).await;
    assert_eq!(status.as_u16(), 404, "{body}");
    assert!(stderr(&shown).contains(body["error"]["message"].as_str().unwrap_or("?")), "{}", stderr(&shown));

    // redrive: HTTP's answer on stdout (here nothing is dead).
    let redrive = bin(store, &["redrive"]);
    assert!(redrive.status.success(), "{}", stderr(&redrive));
    let (status, body) = common::call(&app, "POST", "/api/wal/dead/redrive", None, Body::empty()).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(stdout_json(&redrive), [body], "redrive answers as POST /api/wal/dead/redrive");
}

/// `replace FIELD=VALUE… JSON` does what `PUT /api/records?FIELD=VALUE…` does (issue 27, item
/// 5): the matched records go, the new one is stored; and `delete --row-from/--row-to` keeps
/// to the sort range.
#[test]
fn replace_and_a_ranged_delete_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path();
    for (icao, name) in [("KAAA", "Alpha"), ("KBBB", "Bravo"), ("KCCC", "Charlie")] {
        let r = format!(r#"{{"icao":"{icao}","iata":"ZZZ","name":"{name}"}}"#);
        assert!(bin(store, &["insert", &r]).status.success());
    }
    let replaced = bin(store, &["replace", "icao=KAAA", r#"{"icao":"KAAA","iata":"AAA","name":"Alpha Two"}"#]);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    let by_icao = stdout_json(&bin(store, &["query", "icao=KAAA"]));
    assert_eq!(by_icao.len(), 1, "{by_icao:?}");
    assert_eq!(by_icao[0]["name"], "Alpha Two", "{by_icao:?}");

    // Only the records of iata=ZZZ whose sort value (name) is in [Bravo, Bravo] go.
    let deleted = bin(store, &["delete", "iata=ZZZ", "--row-from", "Bravo", "--row-to", "Bravo"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let left: Vec<Value> = stdout_json(&bin(store, &["query", "iata=ZZZ"]));
    let names: Vec<&str> = left.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, vec!["Charlie"], "{left:?}");

    let bad = bin(store, &["replace", "icao=KAAA", "[1]"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("must be a JSON object"), "{}", stderr(&bad));
}

/// The bracketed `[possible values: ...]` list clap prints in a help text or an error.
fn possible_values(text: &str) -> Vec<String> {
    let start = text.find("[possible values: ").map(|i| i + "[possible values: ".len());
    let list = start.and_then(|s| text[s..].find(']').map(|e| &text[s..s + e]));
    list.unwrap_or_else(|| panic!("no possible values in: {text}")).split(", ").map(str::to_string).collect()
}

/// Help offers what the command takes (issue 28): `export --help` has no `--parallel` (export
/// runs serially, and the flag is refused), and `jobs start --help` lists the kinds that
/// `jobs start` accepts, the same list its error for another kind gives.
#[test]
fn help_offers_what_the_command_takes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let help = bin(dir.path(), &["export", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--segment"), "{text}");
    assert!(!text.contains("--parallel"), "export does not run in parallel: {text}");
    assert_eq!(bin(dir.path(), &["export", "--parallel", "2"]).status.code(), Some(2));

    let help = bin(dir.path(), &["jobs", "start", "--help"]);
    assert!(help.status.success(), "{}", stderr(&help));
    let offered = possible_values(&String::from_utf8_lossy(&help.stdout));
    let refused = bin(dir.path(), &["jobs", "start", "nosuchkind"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert_eq!(offered, possible_values(&stderr(&refused)));
    assert_eq!(offered, ["verify", "repair", "trim-history"]);

    // Each write command describes itself (delete had no text, replace started with delete's).
    let help = bin(dir.path(), &["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    let line =
        |cmd: &str| text.lines().find(|l| l.trim_start().starts_with(&format!("{cmd} "))).unwrap_or("").to_string();
    assert!(line("delete").contains("Delete the records"), "{text}");
    assert!(line("replace").contains("Replace the records") && !line("replace").contains("Delete"), "{text}");
}

/// `history --limit 0`, `dead --limit 0` and `jobs list --limit 0` fail with the message
/// HTTP's 400 carries for `limit=0` (they printed "no history", nothing, one job, and exited
/// 0), as `query --limit 0` does.
#[tokio::test]
async fn a_zero_limit_fails_in_history_and_dead_as_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path();
    let record = r#"{"icao":"KAAA","name":"Field KAAA"}"#;
    assert!(bin(store, &["--history", "on", "insert", record]).status.success());
    let mut config = Config::new("parity").local_path(store);
    config.options.history.enabled = true;
    let app = table_catalog::http::router(std::sync::Arc::new(config.open().await.expect("open")));
    let cases: [(&[&str], &str); 3] = [
        (&["--history", "on", "history", "icao=KAAA", "--limit", "0"], "/api/records/history?icao=KAAA&limit=0"),
        (&["dead", "--limit", "0"], "/api/wal/dead?limit=0"),
        (&["jobs", "list", "--limit", "0"], "/api/jobs?limit=0"),
    ];
    for (args, uri) in cases {
        let out = bin(store, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let (status, body) = common::call(&app, "GET", uri, None, Body::empty()).await;
        assert_eq!(status.as_u16(), 400, "{uri}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("limit") && stderr(&out).contains(message), "{message} / {}", stderr(&out));
    }
    // A positive limit still prints: the one change, and no dead entry.
    let history = bin(store, &["--history", "on", "history", "icao=KAAA", "--limit", "5000"]);
    assert_eq!(stdout_json(&history).len(), 1, "{}", stderr(&history));
    let dead = bin(store, &["dead", "--limit", "5000"]);
    assert!(dead.status.success() && dead.stdout.is_empty(), "{}", stderr(&dead));
    let jobs = bin(store, &["jobs", "list", "--limit", "5000"]);
    assert!(jobs.status.success() && jobs.stdout.is_empty(), "{}", stderr(&jobs));
}

/// `wal show` of a malformed id fails naming the field, with HTTP's 400 message; `history`
/// on a catalog without history names the CLI flag besides the setting, with HTTP's 404
/// message.
#[tokio::test]
async fn a_malformed_wal_id_and_history_off_are_refused_alike() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path();
    assert!(bin(store, &["insert", r#"{"icao":"KAAA","name":"Field KAAA"}"#]).status.success());
    let catalog = Config::new("parity").local_path(store).open().await.expect("open");
    let app = table_catalog::http::router(std::sync::Arc::new(catalog));
    // History off: the error names the setting and the CLI flag, alike.
    let history = bin(store, &["history", "icao=KAAA"]);
    assert_eq!(history.status.code(), Some(1), "{}", stderr(&history));
    let (status, body) = common::call(&app, "GET", "/api/records/history?icao=KAAA", None, Body::empty()).await;
    assert_eq!(status.as_u16(), 404, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("TABLE_CATALOG_HISTORY=on") && message.contains("--history on"), "{message}");
    assert!(stderr(&history).contains(message), "{}", stderr(&history));

    let shown = bin(store, &["wal", "show", "bogus"]);
    assert_eq!(shown.status.code(), Some(1), "{}", stderr(&shown));
    let (status, body) = common::call(&app, "GET", "/api/wal/bogus", None, Body::empty()).await;
    assert_eq!(status.as_u16(), 400, "{body}");
    assert_eq!(body["error"]["message"], "id: 'bogus' is not a WAL id", "{body}");
    assert!(stderr(&shown).contains("id: 'bogus' is not a WAL id"), "{}", stderr(&shown));
}
