//! Identity-only storage access end to end: `table-catalog serve` with **no storage key or
//! connection string in its environment** (the environment is cleared), reaching an Azurite
//! started here in OAuth mode (`--oauth basic`, HTTPS with a self-signed certificate made by
//! this test, trusted through `SSL_CERT_FILE`), with tokens from the fake managed-identity
//! endpoint (`tests/common/identity.rs`) that checks the header, resource and client id.
//!
//! Covers: a batch import, lookups, a write intent put on the apply queue (by this test, also
//! with a token) and the apply path; tokens that expire every few seconds, so the run crosses
//! expiries and needs refreshes (Azurite rejects expired tokens).
//!
//! Needs Azurite installed in `.azurite/` (`scripts/azurite.sh install`; `scripts/test.sh`
//! does it); otherwise prints `SKIPPED:` (which `scripts/test.sh` fails on).
#![cfg(unix)]

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use table_catalog::store::AzureStore;
use table_catalog::store::IdentityConnection;
use table_catalog::store::QueueStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use common::identity::{Answer, FakeIdentity, HEADER};

const DEADLINE: Duration = Duration::from_secs(180);
const CLIENT_ID: &str = "11111111-2222-3333-4444-555555555555";
/// Token lifetime: short, so the run crosses several expiries.
const TOKEN_SECS: i64 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts Azurite with OAuth on HTTPS; returns the child and the (queue, table) ports.
async fn start_azurite(bin: &PathBuf, cert: &PathBuf, key: &PathBuf) -> (Child, u16, u16) {
    let (b, q, t) = (free_port(), free_port(), free_port());
    let child = Command::new(bin)
        .args(["--inMemoryPersistence", "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"])
        .args(["--blobHost", "127.0.0.1", "--queueHost", "127.0.0.1", "--tableHost", "127.0.0.1"])
        .args(["--blobPort", &b.to_string(), "--queuePort", &q.to_string(), "--tablePort", &t.to_string()])
        .args(["--oauth", "basic", "--cert"])
        .arg(cert)
        .arg("--key")
        .arg(key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start azurite");
    for port in [q, t] {
        common::wait_for("azurite listening", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
        })
        .await;
    }
    (child, q, t)
}

#[tokio::test]
async fn serve_works_with_a_managed_identity_only() {
    let _turn = crate::TURN.lock().await; // see tests/faults/main.rs
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let azurite = root.join(".azurite/node_modules/.bin/azurite");
    if !azurite.exists() {
        common::skip::skipped(
            "serve_works_with_a_managed_identity_only",
            "Azurite is not installed in .azurite/ (scripts/azurite.sh install)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();

    // A self-signed certificate for 127.0.0.1 (Azurite's OAuth needs HTTPS).
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let (_azurite, qport, tport) = start_azurite(&azurite, &cert, &key).await;

    let fake = FakeIdentity::start(vec![Answer::Jwt { secs: TOKEN_SECS }], Some(CLIENT_ID)).await;
    let table_uri = format!("https://127.0.0.1:{tport}/devstoreaccount1");
    let queue_uri = format!("https://127.0.0.1:{qport}/devstoreaccount1");
    let name = format!("idcat{}", std::process::id());
    let queue = format!("{name}-apply");
    let env: Vec<(&str, String)> = vec![
        ("SSL_CERT_FILE", cert.display().to_string()),
        ("AzureWebJobsStorage__tableServiceUri", table_uri.clone()),
        ("AzureWebJobsStorage__queueServiceUri", queue_uri.clone()),
        ("AzureWebJobsStorage__credential", "managedidentity".into()),
        ("AzureWebJobsStorage__clientId", CLIENT_ID.into()),
        ("IDENTITY_ENDPOINT", fake.url.clone()),
        ("IDENTITY_HEADER", HEADER.into()),
        ("RUST_LOG", "warn".into()),
    ];
    for (k, v) in &env {
        assert!(!v.contains("AccountKey") && !v.contains("Eby8vdM02"), "{k} holds a key");
    }

    // serve, with only the environment above.
    let mut child = Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["--name", &name, "--index-keys", "icao,iata,lid", "--row-key", "name"])
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let find_address = async {
        let mut seen = Vec::new();
        while let Some(line) = stderr.next_line().await.unwrap() {
            if let Some(rest) = line.split_once("listening on http://").map(|(_, r)| r) {
                return rest.split_whitespace().next().unwrap_or_default().to_string();
            }
            seen.push(line);
        }
        panic!("serve exited without printing its address:\n{}", seen.join("\n"));
    };
    let address = tokio::time::timeout(DEADLINE, find_address).await.expect("serve prints its address");
    let logs = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            seen.push(line);
        }
        seen
    });
    let base = format!("http://{address}");
    let client = reqwest::Client::new();

    // Import (the batch write path), applied before the answer.
    let records = vec![
        json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"}),
        json!({"icao": "KLAX", "iata": "LAX", "lid": "LAX", "name": "Los Angeles International Airport"}),
    ];
    let resp = client.post(format!("{base}/api/records/batch?wait=true")).json(&records).send().await.unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert!(status.is_success(), "import: {status} {body}");

    // Lookups by each index.
    for (field, value, want) in
        [("icao", "KJFK", &records[0]), ("iata", "LAX", &records[1]), ("lid", "JFK", &records[0])]
    {
        let found: Value =
            client.get(format!("{base}/api/records?{field}={value}")).send().await.unwrap().json().await.unwrap();
        assert_eq!(found["records"], json!([want]), "{field}={value}");
    }

    // Cross a token expiry, then a write intent through the queue: this process puts it with
    // its own identity-based client (no key here either), serve's worker logs and applies it.
    tokio::time::sleep(Duration::from_secs(TOKEN_SECS as u64 + 1)).await;
    std::env::set_var("SSL_CERT_FILE", &cert);
    let connection =
        IdentityConnection::from_lookup(|n: &str| env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone()))
            .unwrap()
            .unwrap();
    let store = AzureStore::from_identity(connection, fake.credential(Some(CLIENT_ID)));
    let intent = json!({"v": 1, "op": "insert", "record":
        {"icao": "KSFO", "iata": "SFO", "lid": "SFO", "name": "San Francisco International Airport"}});
    let text = table_catalog::testing::messages::encode(&intent.to_string());
    store.put_message(&queue, &text, Duration::ZERO).await.expect("put the intent with a token");
    let found = common::wait_for("the intent is applied", || async {
        let found: Value = client.get(format!("{base}/api/records?iata=SFO")).send().await.ok()?.json().await.ok()?;
        found["records"].as_array().is_some_and(|r| !r.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(found["records"][0]["icao"], "KSFO");
    common::wait_for("no WAL entry pending", || async {
        let status: Value = client.get(format!("{base}/api/status")).send().await.ok()?.json().await.ok()?;
        (status["pending"] == 0).then_some(())
    })
    .await;
    // An old record is still readable after the expiries: serve refreshed its token.
    let found: Value = client.get(format!("{base}/api/records?lid=LAX")).send().await.unwrap().json().await.unwrap();
    assert_eq!(found["records"], json!([records[1]]));

    fake.assert_no_problems();
    let requests = fake.requests();
    child.kill().await.unwrap();
    let logs = logs.await.unwrap().join("\n");
    assert!(!logs.contains(HEADER), "serve logged the identity header");
    // serve and this process each fetched a token; serve refreshed across the expiry.
    assert!(requests >= 3, "token requests: {requests} (no refresh?)\n{logs}");
    println!("token requests: {requests}");
}
