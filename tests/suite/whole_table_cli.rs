//! `table-catalog verify`, `repair` and `export` as an operator runs them (embedded store):
//! verify prints one JSON line per finding on stdout, the counts on stderr and exits 3;
//! repair re-logs and applies; verify then exits 0 with nothing on stdout; export writes
//! every record once.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};
use table_catalog::config::Config;
use table_catalog::store::IfMatch;

const ARGS: [&str; 6] = ["--name", "clicat", "--index-keys", "icao,iata", "--row-key", "name"];

fn bin(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env("RUST_LOG", "error")
        .args(ARGS)
        .arg("--local-path")
        .arg(store)
        .args(args)
        .output()
        .unwrap()
}

/// The counts `verify` prints as the last line of stderr.
fn counts(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    serde_json::from_str(stderr.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[tokio::test]
async fn verify_reports_findings_repair_fixes_them_and_export_writes_every_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let c = Config::new("clicat").index_keys(["icao", "iata"]).row_key("name").local_path(dir.path());
        let c = c.open().await.unwrap();
        for i in 0..20 {
            let r = json!({"icao": format!("K{i:03}"), "iata": format!("I{i:02}"), "name": format!("Field {i}")});
            c.upsert(r.as_object().cloned().unwrap(), false).await.unwrap();
        }
        c.recover().await.unwrap();
        // Remove the iata row of three records.
        for i in [3, 7, 11] {
            let r = json!({"icao": format!("K{i:03}"), "iata": format!("I{i:02}"), "name": format!("Field {i}")});
            let keys = c.schema().record_keys(r.as_object().unwrap()).unwrap();
            c.store().delete(&c.names().table, &keys.partitions[1].1, &keys.row_key, &IfMatch::Any).await.unwrap();
        }
    }
    let out = bin(dir.path(), &["verify", "--segment", "3", "--concurrency", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|f| f["kind"] == "missing_row" && f["pk"].as_str().unwrap().starts_with("4_iata")));
    assert!(lines.iter().all(|f| f["rows"].as_array().unwrap().len() == 2 && f["row_key"].is_string()));
    let c = counts(&out);
    assert_eq!(
        (c["rows"].clone(), c["records"].clone(), c["findings"].clone()),
        (json!(37), json!(20), json!({"missing_row": 3}))
    );

    // The same as a job with 3 workers here: the same findings, the same counts.
    let par = bin(dir.path(), &["verify", "--segment", "3", "--parallel", "3"]);
    assert_eq!(par.status.code(), Some(3), "{}", String::from_utf8_lossy(&par.stderr));
    let mut par_lines: Vec<Value> =
        String::from_utf8_lossy(&par.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut serial_lines = lines.clone();
    let key = |v: &Value| v.to_string();
    par_lines.sort_by_key(key);
    serial_lines.sort_by_key(key);
    assert_eq!(par_lines, serial_lines, "a parallel verify finds what the serial one finds");
    assert_eq!(counts(&par), c, "a parallel verify prints the serial one's summary, in its shape");
    let jobs = bin(dir.path(), &["jobs", "list"]);
    let listed: Vec<Value> =
        String::from_utf8_lossy(&jobs.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(listed.len(), 1, "{}", String::from_utf8_lossy(&jobs.stderr));
    assert_eq!((listed[0]["kind"].as_str(), listed[0]["state"].as_str()), (Some("verify"), Some("done")));
    let id = listed[0]["id"].as_str().unwrap();
    let show = bin(dir.path(), &["jobs", "show", id, "--findings"]);
    assert_eq!(String::from_utf8_lossy(&show.stdout).lines().count(), 1 + 3, "the job and its 3 findings");
    let cancel = bin(dir.path(), &["jobs", "cancel", id]);
    assert!(!cancel.status.success(), "a done job cannot be cancelled");
    assert!(
        String::from_utf8_lossy(&cancel.stderr).contains("already done"),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );

    let bad = bin(dir.path(), &["verify", "--segment", "1001"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--segment: '1001'"));

    let out = bin(dir.path(), &["repair"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["upserts"].clone(), report["deletes"].clone(), report["applied"].clone()),
        (json!(3), json!(0), json!(3))
    );

    let out = bin(dir.path(), &["verify"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
    assert_eq!(counts(&out)["rows"], json!(40));

    // `repair --parallel` reports in the serial repair's shape, with the job's id.
    let par = bin(dir.path(), &["repair", "--parallel", "2"]);
    assert!(par.status.success(), "{}", String::from_utf8_lossy(&par.stderr));
    let mut par: Value = serde_json::from_slice(&par.stdout).unwrap();
    assert!(par["job"].is_string(), "{par}");
    par.as_object_mut().unwrap().remove("job");
    let fields = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(fields(&par), fields(&report), "{par} against {report}");
    assert_eq!(
        (par["rows"].clone(), par["upserts"].clone(), par["findings"].clone()),
        (json!(40), json!(0), json!({}))
    );

    let file = dir.path().join("export.jsonl");
    let out = bin(dir.path(), &["export", "--output", file.to_str().unwrap(), "--segment", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exported = std::fs::read_to_string(&file).unwrap();
    assert_eq!(exported.lines().count(), 20);
    assert_eq!(counts(&out)["exported"], json!(20));
    let stdout_export = bin(dir.path(), &["export"]);
    assert_eq!(String::from_utf8_lossy(&stdout_export.stdout), exported, "stdout and file exports agree");
}
