//! README.md runs as written (issue 28): every command block, in order, against a fresh embedded
//! catalog in a temporary folder holding `data/airports.csv`.
//!
//! - ` ```console ` blocks are run and checked by `trycmd` (the `$ ` lines are commands, the lines
//!   under each are its stdout and stderr, `[..]` stands for text that differs between runs,
//!   `? failed` for a failing exit status). `table-catalog` is this build's binary; `curl` is the
//!   machine's curl, reached through a shim that points the README's `127.0.0.1:7071` at the
//!   test's own `serve` (on a port the OS picks, so runs never collide).
//! - ` ```sh ` blocks are the user's set-up, which the test performs: a `cargo run --release --
//!   ... serve` line starts `serve` in the background in that folder (this build's binary; a
//!   later one stops the running `serve` and starts the new one, as the README tells the user
//!   to), `export NAME=VALUE` is evaluated by `sh` and set for the commands after it, and
//!   `export PATH=...target/release...` is what makes `table-catalog` this build's binary. The
//!   import line `serve` prints is checked against the ` ```text ` block after it (counts and
//!   file exact, timings not). The sh blocks not run are in [`NOT_RUN`], each with the reason; an
//!   sh block in neither list fails the test.
//! - A fence without a language fails the test (trycmd would read it as commands).
//!
//! To take new output into README.md: `TRYCMD=overwrite cargo test
//! --test suite -- readme::the_readme_runs_as_written`, then put `[..]` back where ids and
//! times differ.

use crate::common;

use std::path::{Path, PathBuf};

/// ` ```sh ` blocks the test does not run, found by a line they contain, with the reason.
const NOT_RUN: [(&str, &str); 3] = [
    ("scripts/test.sh", "the test command itself"),
    ("UseDevelopmentStorage=true", "points the CLI at Azurite or an Azure account (the Azurite suites of scripts/test.sh run the same import and CLI on Azurite: tests/suite/azure_store.rs, tests/cli_azure.rs)"),
    ("az deployment group create", "deploys to an Azure subscription"),
];

/// The `serve` line of the README: `cargo run --release -- GLOBAL serve SERVE`.
const CARGO_RUN: &str = "cargo run --release --";

/// The README, as the user reads it.
fn readme_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")
}

/// One fenced block: its language, the line numbers (0-based) of its fences, its lines.
struct Block {
    lang: String,
    open: usize,
    close: usize,
    lines: Vec<String>,
}

/// Every fenced block of `text`; panics on a fence without a language.
fn blocks(text: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<(String, usize, Vec<String>)> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let lang = info.split(',').next().unwrap_or_default().trim().to_string();
                assert!(
                    !lang.is_empty(),
                    "README.md line {}: a fence without a language (trycmd reads it as commands)",
                    n + 1
                );
                open = Some((lang, n, Vec::new()));
            }
            (Some(_), Some(_)) => {
                let (lang, start, lines) = open.take().expect("open block");
                found.push(Block { lang, open: start, close: n, lines });
            }
            (Some((_, _, lines)), None) => lines.push(line.to_string()),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md ends inside a fenced block");
    found
}

/// What a run ` ```sh ` block asks the test to do before the commands after it.
enum SetUp {
    /// Stop the running `serve` (if any) and start `table-catalog GLOBAL serve SERVE`.
    Serve { global: Vec<String>, serve: Vec<String> },
    /// Set `NAME=VALUE` for the commands after it.
    Export(String, String),
}

/// The set-up lines of an sh block, or `None` when it is in [`NOT_RUN`].
fn set_up(block: &Block) -> Option<Vec<SetUp>> {
    if let Some((_, why)) = NOT_RUN.iter().find(|(line, _)| block.lines.iter().any(|l| l.contains(line))) {
        eprintln!("README.md line {}: sh block not run: {why}", block.open + 1);
        return None;
    }
    let mut steps = Vec::new();
    for line in block.lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(rest) = line.strip_prefix(CARGO_RUN) {
            let (global, serve) = rest
                .split_once(" serve")
                .unwrap_or_else(|| panic!("README.md line {}: only `serve` is run this way: {line}", block.open + 1));
            let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
            steps.push(SetUp::Serve { global: words(global), serve: words(serve) });
        } else if let Some((name, value)) = line.strip_prefix("export ").and_then(|kv| kv.split_once('=')) {
            if name == "PATH" {
                assert!(value.contains("target/release"), "README.md line {}: {line}", block.open + 1);
                continue; // the test registers its own build as `table-catalog`
            }
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{line}\nprintf %s \"${name}\""))
                .output()
                .expect("sh");
            assert!(out.status.success(), "README.md line {}: {line}: {out:?}", block.open + 1);
            steps.push(SetUp::Export(name.to_string(), String::from_utf8_lossy(&out.stdout).into_owned()));
        } else {
            panic!("README.md line {}: an sh line the test neither runs nor lists in NOT_RUN: {line}", block.open + 1);
        }
    }
    Some(steps)
}

/// A `curl` that sends the README's `http://127.0.0.1:7071` to `base` instead.
fn curl_shim(dir: &Path, base: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("curl");
    let script = format!(
        "#!/bin/sh\n# README.md's address -> the test's serve\nn=$#\nfor a in \"$@\"; do set -- \"$@\" \"$(printf '%s' \"$a\" | sed 's#http://127.0.0.1:7071#{base}#g')\"; done\nshift $n\nexec curl \"$@\"\n"
    );
    std::fs::write(&path, script).expect("write the curl shim");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod the curl shim");
    path
}

/// The import line `serve` printed agrees with the README's (counts and file; not the timings).
fn check_import_line(said: &[String], shown: &Block) {
    let Some(want) = shown.lines.iter().find(|l| l.starts_with("imported ")) else { return };
    let got = said
        .iter()
        .find(|l| l.contains("imported "))
        .unwrap_or_else(|| panic!("serve printed no import line: {said:?}"));
    let got = &got[got.find("imported ").expect("imported")..];
    let fixed = |l: &str| {
        let (head, rest) = l.split_once(" in ").expect("' in '");
        (head.to_string(), rest.split_once("), ").map(|(_, tail)| tail.to_string()).expect("'), '"))
    };
    assert_eq!(fixed(got), fixed(want), "README.md line {}: serve printed {got}", shown.open + 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_runs_as_written() {
    for var in ["AZURE_STORAGE_CONNECTION_STRING", "AzureWebJobsStorage", "RUST_LOG", "NO_COLOR"] {
        std::env::remove_var(var);
    }
    for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("TABLE_CATALOG_")).collect::<Vec<_>>() {
        std::env::remove_var(var);
    }
    let readme = std::fs::read_to_string(readme_path()).expect("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("data")).expect("work/data");
    std::fs::copy(common::airports_csv(), work.join("data/airports.csv")).expect("copy data/airports.csv");

    // Segments: the lines between two run sh blocks. Each runs as its own trycmd case, a copy
    // of the README with every other line blank (so trycmd's line numbers are README's).
    let all = blocks(&readme);
    let mut cuts: Vec<(usize, Vec<SetUp>)> = vec![(0, Vec::new())];
    for block in &all {
        match block.lang.as_str() {
            "sh" => {
                if let Some(steps) = set_up(block) {
                    cuts.push((block.close + 1, steps));
                }
            }
            "console" | "trycmd" => {}
            _ => {}
        }
    }
    let mut served: Option<common::serve::Served> = None;
    let mut exports: Vec<(String, String)> = Vec::new();
    let mut ran = 0;
    let mut regions: Vec<(usize, usize, Option<PathBuf>)> = Vec::new();
    for (i, (start, steps)) in cuts.iter().enumerate() {
        for step in steps {
            match step {
                SetUp::Serve { global, serve } => {
                    if let Some(mut old) = served.take() {
                        old.child.kill().await.expect("stop serve");
                    }
                    let global: Vec<&str> = global.iter().map(String::as_str).collect();
                    let serve: Vec<&str> = serve.iter().map(String::as_str).collect();
                    let env: Vec<(&str, &str)> = exports.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    let started = common::serve::start_in(Some(&work), &global, &serve, &env).await;
                    if let Some(shown) = all.iter().find(|b| b.open >= *start && b.lang == "text") {
                        check_import_line(&started.said, shown);
                    }
                    served = Some(started);
                }
                SetUp::Export(name, value) => exports.push((name.clone(), value.clone())),
            }
        }
        let end = cuts.get(i + 1).map_or(lines.len(), |(next, _)| *next);
        let commands = all.iter().filter(|b| b.lang == "console" && b.open >= *start && b.close < end).count();
        if commands == 0 {
            regions.push((*start, end, None));
            continue;
        }
        let segment: String = lines
            .iter()
            .enumerate()
            .map(|(n, l)| if (*start..end).contains(&n) { format!("{l}\n") } else { "\n".to_string() })
            .collect();
        // trycmd runs a case `X.md` in the folder `X.in` when there is one.
        let case = tmp.path().join(format!("README-{i}.md"));
        std::fs::write(&case, segment).expect("write a segment");
        std::os::unix::fs::symlink(&work, tmp.path().join(format!("README-{i}.in"))).expect("link the work folder");
        let base = served.as_ref().map_or("http://127.0.0.1:9".to_string(), |s| s.base.clone());
        let shim = curl_shim(tmp.path(), &base);
        let cases = trycmd::TestCases::new();
        cases.register_bin("table-catalog", Path::new(env!("CARGO_BIN_EXE_table-catalog")));
        cases.register_bin("curl", shim);
        cases.env("RUST_LOG", "error");
        for (k, v) in &exports {
            cases.env(k.clone(), v.clone());
        }
        cases.case(&case);
        // trycmd runs its cases on another thread pool and panics with a diff on a mismatch.
        tokio::task::block_in_place(|| cases.run());
        ran += commands;
        regions.push((*start, end, Some(case)));
    }
    if std::env::var("TRYCMD").as_deref() == Ok("overwrite") {
        // Each segment's region, as trycmd rewrote it, back into README.md.
        let mut out: Vec<String> = Vec::new();
        for (start, end, case) in &regions {
            match case {
                None => out.extend(lines[*start..*end].iter().map(|l| l.to_string())),
                Some(case) => {
                    let text = std::fs::read_to_string(case).expect("read a segment");
                    let seg: Vec<&str> = text.lines().collect();
                    out.extend(seg[*start..seg.len() - (lines.len() - end)].iter().map(|l| l.to_string()));
                }
            }
        }
        std::fs::write(readme_path(), out.join("\n") + "\n").expect("write README.md");
    }
    assert!(ran >= 5, "README.md has {ran} console blocks: expected the walkthroughs");
}

#[tokio::test]
async fn a_command_without_the_catalog_name_says_which_catalogs_there_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_table-catalog"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env_remove("AzureWebJobsStorage")
            .env_remove(table_catalog::testing::settings::NAME)
            .env_remove(table_catalog::testing::settings::LOCAL_PATH)
            .output()
            .expect("run")
    };
    let out = run(&[
        "--name",
        "airports",
        "--index-keys",
        "icao,iata",
        "--row-key",
        "name",
        "insert",
        r#"{"icao":"KJFK","name":"JFK"}"#,
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["index", "list"]);
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
    let readme = std::fs::read_to_string(readme_path()).expect("README.md");
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
