//! README.md's command blocks run as written, in order, against a fresh embedded catalog: the
//! walkthrough's `serve --import` (on a slice of `data/airports.csv`), then the blocks of
//! "Changing the indexes of a live catalog" and "Record history", each line as the user types
//! it (`table-catalog` on `PATH`, the working folder holding `.table-catalog/`, `serve`'s
//! address in place of `127.0.0.1:7071`), with each command's status and output checked.
//! A hand-written runner for these sections only (issue 28); the README as a whole is not
//! yet run by a harness.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// The README, as the user reads it.
fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md")
}

/// The `n`th (0-based) ```sh block after the heading line `heading`.
fn sh_block(readme: &str, heading: &str, n: usize) -> Vec<String> {
    let after = readme.split_once(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("README has no '{heading}'")).1;
    let block = after.split("```sh\n").nth(n + 1).unwrap_or_else(|| panic!("'{heading}' has no sh block {n}"));
    let block = block.split("```").next().unwrap_or_default();
    block.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// The user's shell: `PATH` starts with the folder of the built binary, the working folder is
/// `dir`, `exports` are the `export` lines run so far.
struct Shell {
    dir: PathBuf,
    base: String,
    exports: Vec<(String, String)>,
}

impl Shell {
    /// Runs one README line (`export K=V` sets K for the following lines).
    fn run(&mut self, line: &str) -> Output {
        if let Some((k, v)) = line.strip_prefix("export ").and_then(|kv| kv.split_once('=')) {
            self.exports.push((k.to_string(), v.trim_matches('"').to_string()));
            return std::process::Command::new("true").output().expect("true");
        }
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_table-catalog")).parent().expect("bin folder").to_path_buf();
        let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        let line = line.replace("http://127.0.0.1:7071", &self.base);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&line)
            .current_dir(&self.dir)
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env_remove("AzureWebJobsStorage")
            .env_remove(table_catalog::settings::NAME)
            .env_remove(table_catalog::settings::LOCAL_PATH)
            .env("RUST_LOG", "error")
            .env("PATH", path)
            .envs(self.exports.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "README line failed: {line}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// Every stdout line of `out` as JSON.
fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The header and the first 300 airports (all in the US) and JFK, as `small.csv` in `dir`.
fn airports_slice(dir: &Path) -> PathBuf {
    let all = std::fs::read_to_string(common::airports_csv()).expect("data/airports.csv");
    let mut lines: Vec<&str> = all.lines().take(301).collect();
    lines.extend(all.lines().filter(|l| l.starts_with("\"KJFK\"")));
    let path = dir.join("small.csv");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write small.csv");
    path
}

/// The global arguments of the README's first `cargo run --release -- ... serve` line after
/// `heading` (what stands between `--` and `serve`).
fn serve_args(readme: &str, heading: &str) -> Vec<String> {
    let line = sh_block(readme, heading, 0)
        .into_iter()
        .find(|l| l.starts_with("cargo run --release --") && l.contains(" serve"))
        .unwrap_or_else(|| panic!("'{heading}' starts no serve"));
    let args = line.split_once(" -- ").expect("--").1.split_once(" serve").expect("serve").0;
    args.split_whitespace().map(String::from).collect()
}

#[tokio::test]
async fn index_and_history_sections_run_as_written() {
    let readme = readme();
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = airports_slice(dir.path());
    let store = dir.path().join(".table-catalog");
    let store_arg = store.to_string_lossy().to_string();

    // The walkthrough's first command, on the slice.
    let mut global = serve_args(&readme, "## Two commands");
    assert_eq!(global, ["--name", "airports", "--index-keys", "icao,iata,lid", "--row-key", "name"]);
    global.extend(["--local-path".to_string(), store_arg.clone()]);
    let csv_arg = csv.to_string_lossy().to_string();
    let args: Vec<&str> = global.iter().map(String::as_str).collect();
    let mut served = common::serve::start(&args, &["--import", &csv_arg], &[]).await;
    let mut sh = Shell { dir: dir.path().to_path_buf(), base: served.base.clone(), exports: Vec::new() };

    let lines = sh_block(&readme, "### Changing the indexes of a live catalog", 0);
    assert_eq!(lines.len(), 6, "{lines:?}");
    let added = json_lines(&sh.run(&lines[0]));
    assert_eq!(
        (added[0]["index"]["state"].as_str(), added[0]["job"]["state"].as_str()),
        (Some("active"), Some("done"))
    );
    let list = json_lines(&sh.run(&lines[1]));
    assert!(list.iter().any(|i| i["field"] == "country" && i["state"] == "active"), "{list:?}");
    let mut answers = Vec::new();
    for line in &lines[2..4] {
        let page = json_lines(&sh.run(line));
        let records = page[0]["records"].as_array().unwrap_or_else(|| panic!("{line}: {page:?}"));
        assert!(records.len() == 2 && records.iter().all(|r| r["country"] == "US"), "{line}: {page:?}");
        answers.push(records.clone());
    }
    assert_eq!(json_lines(&sh.run(&lines[4])), answers[1], "the CLI reads what HTTP reads");
    sh.run(&lines[5]);
    let list = json_lines(&sh.run(&lines[1]));
    assert!(list.iter().all(|i| i["field"] != "country" || i["state"] == "dropping"), "{list:?}");

    // "stop it (Ctrl-C) and start it again with history on".
    served.child.kill().await.expect("stop serve");
    let mut global = serve_args(&readme, "### Record history");
    assert_eq!(global, ["--name", "airports", "--history", "on"], "the README restarts serve with history on");
    global.extend(["--local-path".to_string(), store_arg]);
    let args: Vec<&str> = global.iter().map(String::as_str).collect();
    let served = common::serve::start(&args, &[], &[]).await;
    sh.base = served.base.clone();
    let jfk_before = json_lines(&sh.run("table-catalog --name airports query icao=KJFK"));

    let lines = sh_block(&readme, "### Record history", 1);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for line in &lines[..4] {
        sh.run(line);
    }
    let changes = json_lines(&sh.run(&lines[4]));
    let ops: Vec<&str> = changes.iter().filter_map(|c| c["op"].as_str()).collect();
    assert_eq!(ops, ["delete", "upsert", "upsert"], "{changes:?}");
    assert_eq!(
        (changes[1]["record"]["elevation"].as_i64(), changes[2]["record"]["elevation"].as_i64()),
        (Some(14), Some(13))
    );
    let page = json_lines(&sh.run(&lines[5]));
    let history = page[0]["history"].as_array().unwrap_or_else(|| panic!("{page:?}"));
    let ops: Vec<&str> = history.iter().filter_map(|c| c["op"].as_str()).collect();
    assert_eq!(ops, ["delete", "upsert"], "{page:?}");
    let jfk_after = json_lines(&sh.run("table-catalog --name airports query icao=KJFK"));
    assert_eq!(jfk_after, jfk_before, "the walkthrough leaves the real JFK record as it was");
    assert_eq!(jfk_after[0]["city"], "New York");
}

#[tokio::test]
async fn a_command_without_the_catalog_name_says_which_catalogs_there_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sh = Shell { dir: dir.path().to_path_buf(), base: String::new(), exports: Vec::new() };
    sh.run(
        r#"table-catalog --name airports --index-keys icao,iata --row-key name insert '{"icao":"KJFK","name":"JFK"}'"#,
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .args(["index", "list"])
        .current_dir(dir.path())
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env_remove(table_catalog::settings::NAME)
        .env_remove(table_catalog::settings::LOCAL_PATH)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for want in ["no catalog named 'catalog'", "--name", "catalogs here: airports", "--index-keys"] {
        assert!(stderr.contains(want), "{want}: {stderr}");
    }
}

/// The README's HTTP table row for `route` (the line starting with `| \`route`).
fn table_row(readme: &str, route: &str) -> String {
    let start = format!("| `{route}");
    readme.lines().find(|l| l.starts_with(&start)).unwrap_or_else(|| panic!("README has no row {route}")).to_string()
}

/// What the HTTP table says `DELETE ...&wait=true` and `POST /api/records/batch?wait=true`
/// answer is what they answer, and "Identifiers are not unique" holds: a second record with
/// JFK's IATA code is accepted and `?iata=JFK` returns both.
#[tokio::test]
async fn http_table_shapes_and_shared_identifiers_match_the_answers() {
    use axum::body::Body;
    let readme = readme();
    let app = table_catalog::http::router(common::airports_catalog(common::Backend::Local).await);
    let jfk = serde_json::json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"});
    let (s, _) = common::call(&app, "POST", "/api/records?wait=true", Some("application/json"), jfk.to_string()).await;
    assert_eq!(s.as_u16(), 201);

    let row = table_row(&readme, "DELETE /api/records");
    let (s, body) = common::call(&app, "DELETE", "/api/records?icao=ZZZZ&wait=true", None, Body::empty()).await;
    assert_eq!((s.as_u16(), body["applied"].as_bool()), (200, Some(true)), "{body}");
    assert!(body["id"].is_string() && row.contains("with `wait=true` 200 `{id, applied: true}`"), "{row}");

    let row = table_row(&readme, "POST /api/records/batch");
    let batch = r#"[{"icao":"ZZB1","name":"B1"},{"name":"no index value"}]"#;
    let (s, body) =
        common::call(&app, "POST", "/api/records/batch?wait=true", Some("application/json"), batch.to_string()).await;
    assert_eq!(s.as_u16(), 202, "{body}");
    let results = body["results"].as_array().unwrap_or_else(|| panic!("{body}"));
    assert!(results[0]["id"].is_string() && results[1]["error"]["code"].is_string(), "{body}");
    assert!(row.contains(r#"202 `{"results": [...]}`"#) && row.contains("202 with `wait=true` too"), "{row}");

    let section = readme.split_once("### Identifiers are not unique").expect("the section").1;
    assert!(section.contains(r#"POST {"icao":"ZZZB","iata":"JFK","name":"Second JFK"}"#));
    let second = r#"{"icao":"ZZZB","iata":"JFK","name":"Second JFK"}"#;
    let (s, body) =
        common::call(&app, "POST", "/api/records?wait=true", Some("application/json"), second.to_string()).await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let (_, body) = common::call(&app, "GET", "/api/records?iata=JFK", None, Body::empty()).await;
    let icaos: Vec<&str> =
        body["records"].as_array().expect("records").iter().filter_map(|r| r["icao"].as_str()).collect();
    assert_eq!(icaos.len(), 2, "both records with iata JFK: {body}");
    assert!(icaos.contains(&"KJFK") && icaos.contains(&"ZZZB"), "{body}");
    let (s, body) = common::call(
        &app,
        "PUT",
        "/api/records?icao=NOPE&wait=true",
        Some("application/json"),
        r#"{"icao":"ZZNP","name":"Put Made"}"#.to_string(),
    )
    .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let (_, body) = common::call(&app, "GET", "/api/records?icao=ZZNP", None, Body::empty()).await;
    assert_eq!(body["records"].as_array().map(Vec::len), Some(1), "PUT with no match stores the body: {body}");
}
