//! Kill the importer 22 times at seeded points of its progress, restart, and check that every
//! acknowledged record is present in every index with the payload of its latest acknowledged
//! write, and that no index row lacks its siblings.
//!
//! Kills follow the importer's progress, never the clock, so how many hit while logging and
//! while applying holds by construction on any machine, fast or loaded:
//!
//! - **SIGKILL after N acknowledgements** (N from the seed, fewer than the file's batches). The
//!   importer runs with `--print-acks --ack-gate`: it prints `acked <rows>` once a batch is
//!   durable, but only after reading a line from stdin. The test writes N lines, waits for the
//!   N-th `acked` line and sends SIGKILL. The importer is then logging batch N+1 or waiting to
//!   acknowledge it: a kill while logging. Where exactly it dies is up to the scheduler, the
//!   random part that the seed does not fix.
//! - **Abort at the k-th hit of a named crash point** (`TABLE_CATALOG_CRASH_AT=name:k`, see
//!   `src/faults.rs`; k from the seed): `before_clock_publish` and `after_wal_write` on the
//!   write path (while logging), `after_fanout_row`, `before_history_write`,
//!   `after_history_write`, `before_remove_applied` and `before_checkpoint` on the apply path
//!   (while applying). The importers keep record history (`--history on`); at the end, every
//!   record's current row must have its history row (same WAL id, same record), so no kill
//!   between the catalog rows and the history write loses the history of a change.
//!
//! Round k imports the airports with a field `round = k`, so a later round overwrites the
//! earlier payloads: a record whose round-k write was acknowledged must end with a round >= k
//! (an older round would be a lost acknowledged write). The last round runs to completion on
//! the first half of the airports only, so the second half keeps what the killed rounds
//! acknowledged, and the check covers their acknowledgements.
//!
//! Seed: `TC_KILL_SEED` (default 20261121); every failure message carries it.
#![cfg(unix)]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::config::Config;
use table_catalog::history::{HistoryEntry, HistoryOptions};
use table_catalog::query::Filter;
use table_catalog::record::{Record, RowMeta};
use table_catalog::store::Durability;
use table_catalog::testing::import::{read_file, Format};
use table_catalog::testing::wal::WalId;

const KILLS: usize = 26;
const AIRPORTS: usize = 2_000;
const BATCH: usize = 50;
const BATCHES: usize = AIRPORTS / BATCH;
/// Rows of the last, uninterrupted round.
const LAST_ROUND_ROWS: usize = AIRPORTS / 2;
/// Longest wait for one `acked` line or one exit; only a hung importer reaches it.
const HANG_GUARD: Duration = Duration::from_secs(300);
const SIGKILL: i32 = 9;
const SIGABRT: i32 = 6;

/// Crash points on the write path (each hit once per batch, so `k <= BATCHES` is reached
/// before logging ends) and on the apply path.
// (`before_enqueue` is not among them: the hint is sent after the acknowledgement by a
// background task, coalesced, so it is not hit once per batch.)
const WRITE_POINTS: [&str; 2] = ["before_clock_publish", "after_wal_write"];
const APPLY_POINTS: [&str; 5] =
    ["after_fanout_row", "before_history_write", "after_history_write", "before_remove_applied", "before_checkpoint"];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kill {
    /// SIGKILL once exactly this many batches were acknowledged.
    AfterAcks(usize),
    /// Abort at the k-th hit of the named crash point.
    CrashAt(&'static str, usize),
}

impl Kill {
    fn while_logging(self) -> bool {
        matches!(self, Kill::AfterAcks(_)) || matches!(self, Kill::CrashAt(p, _) if WRITE_POINTS.contains(&p))
    }

    fn while_applying(self) -> bool {
        matches!(self, Kill::CrashAt(p, _) if APPLY_POINTS.contains(&p))
    }
}

/// A fixed mix of kills in seeded order, at seeded positions: 10 SIGKILLs after N
/// acknowledgements (one of them past the half of the file, so that the records the last
/// round leaves alone were acknowledged by a killed round), 2 aborts at each write-path
/// point, 4 at `after_fanout_row` and 2 at each apply-group point (the two history points
/// included).
///
/// Every position is reached in a round: a write-path point is hit once per batch; a row
/// write at least once per record (k <= AIRPORTS / 2); a group point at least once per 64
/// upserts, so 32 times (k <= 16).
fn schedule(rng: &mut StdRng) -> Vec<Kill> {
    let mut kills = vec![Kill::AfterAcks(rng.gen_range(BATCHES / 2 + 1..BATCHES))];
    kills.extend((1..10).map(|_| Kill::AfterAcks(rng.gen_range(1..BATCHES))));
    for point in WRITE_POINTS {
        kills.extend((0..2).map(|_| Kill::CrashAt(point, rng.gen_range(1..=BATCHES))));
    }
    kills.extend((0..4).map(|_| Kill::CrashAt("after_fanout_row", rng.gen_range(1..=AIRPORTS / 2))));
    for point in &APPLY_POINTS[1..] {
        kills.extend((0..2).map(|_| Kill::CrashAt(point, rng.gen_range(1..=16))));
    }
    kills.shuffle(rng);
    assert_eq!(kills.len(), KILLS);
    kills
}

/// The catalog flags every run uses. A short lease: a killed importer's lease expires
/// quickly, so the next one takes over. History on: the apply path passes the history points.
const ARGS: [&str; 12] = [
    "--name",
    "kill",
    "--index-keys",
    "icao,iata,lid",
    "--row-key",
    "name",
    "--durability",
    "process",
    "--lease-secs",
    "2",
    "--history",
    "on",
];

fn bin(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_table-catalog"));
    c.env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env_remove("TABLE_CATALOG_CRASH_AT")
        .env("RUST_LOG", "error")
        .args(ARGS)
        .arg("--local-path")
        .arg(store);
    c
}

/// How one import ended: rows acknowledged, exit status, stderr.
struct Outcome {
    acked: usize,
    status: ExitStatus,
    stderr: String,
}

/// Runs one import of `file`, killed as `kill` says (or not at all).
fn import(store: &Path, file: &Path, kill: Option<Kill>, ctx: &str) -> Outcome {
    let err_path = file.with_extension("stderr");
    let mut cmd = bin(store);
    cmd.args(["import", "--batch", &BATCH.to_string(), "--print-acks", "--file"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&err_path).unwrap());
    match kill {
        Some(Kill::AfterAcks(_)) => {
            cmd.arg("--ack-gate").stdin(Stdio::piped());
        }
        Some(Kill::CrashAt(point, k)) => {
            cmd.env("TABLE_CATALOG_CRASH_AT", format!("{point}:{k}"));
        }
        None => {}
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, acks) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse::<usize>().ok()) {
                let _ = tx.send(n);
            }
        }
    });
    let stderr = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let mut acked = 0;
    let mut gate = None;
    if let Some(Kill::AfterAcks(n)) = kill {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all("go\n".repeat(n).as_bytes()).unwrap();
        gate = Some(stdin); // kept open: the importer waits for line N+1 until killed
        for i in 0..n {
            acked = acks.recv_timeout(HANG_GUARD).unwrap_or_else(|e| {
                panic!("{ctx}: the importer stopped after {i} of {n} acknowledgements ({e}): {}", stderr())
            });
        }
        child.kill().unwrap(); // SIGKILL
    }
    let status = child.wait().unwrap();
    drop(gate);
    reader.join().unwrap();
    acked = acks.try_iter().fold(acked, usize::max);
    Outcome { acked, status, stderr: stderr() }
}

fn round_file(dir: &Path, round: usize, airports: &[Record]) -> std::path::PathBuf {
    let file = dir.join(format!("round{round}.jsonl"));
    let lines: Vec<String> = airports
        .iter()
        .map(|a| {
            let mut r = a.clone();
            r.insert("round".into(), json!(round));
            serde_json::Value::Object(r).to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    file
}

#[test]
fn sigkill_during_import_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("TC_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261121);
    eprintln!("crash_kill seed {seed} (TC_KILL_SEED={seed} reproduces the schedule)");
    if !cfg!(feature = "testing") {
        common::skip::skipped("crash_kill", "needs the `testing` feature (crash points)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let kills = schedule(&mut rng);
    for kill in &kills {
        if let Kill::CrashAt(point, _) = kill {
            assert!(
                table_catalog::testing::faults::POINTS.contains(point),
                "{point} is not a crash point of src/faults.rs"
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let airports: Vec<Record> = read_file(&common::airports_csv(), Format::Csv, &common::airports_schema())
        .unwrap()
        .into_iter()
        .take(AIRPORTS)
        .map(|(_, r)| r.unwrap())
        .collect();

    let mut acked = vec![0usize; KILLS + 1];
    let mut after_logging = 0;
    for (round, kill) in kills.iter().enumerate() {
        let ctx = format!("seed {seed}, round {round}, {kill:?}");
        let out = import(&store, &round_file(dir.path(), round, &airports), Some(*kill), &ctx);
        acked[round] = out.acked;
        match *kill {
            Kill::AfterAcks(n) => {
                assert_eq!(out.status.signal(), Some(SIGKILL), "{ctx}: {:?} {}", out.status, out.stderr);
                assert_eq!(out.acked, n * BATCH, "{ctx}: acknowledgements past the gate");
            }
            Kill::CrashAt(point, _) => {
                assert_eq!(
                    out.status.signal(),
                    Some(SIGABRT),
                    "{ctx}: the crash point was not reached: {}",
                    out.stderr
                );
                assert!(out.stderr.contains(&format!("crash point {point}: aborting")), "{ctx}: {}", out.stderr);
            }
        }
        if kill.while_logging() {
            assert!(out.acked < AIRPORTS, "{ctx}: killed while logging, yet all {AIRPORTS} rows were acknowledged");
        }
        after_logging += usize::from(kill.while_applying() && out.acked == AIRPORTS);
    }
    let last = round_file(dir.path(), KILLS, &airports[..LAST_ROUND_ROWS]);
    let out = import(&store, &last, None, &format!("seed {seed}, last round"));
    assert!(out.status.success(), "seed {seed}: the last import runs to completion: {}", out.stderr);
    assert_eq!(out.acked, LAST_ROUND_ROWS, "seed {seed}");
    acked[KILLS] = out.acked;

    // By construction; the asserts above checked every round.
    let logging = kills.iter().filter(|k| k.while_logging()).count();
    let applying = kills.iter().filter(|k| k.while_applying()).count();
    let sigkills = kills.iter().filter(|k| matches!(k, Kill::AfterAcks(_))).count();
    assert_eq!((logging, applying, sigkills), (14, 12, 10), "seed {seed}: {kills:?}");
    // Shown in every run (written past the test harness's output capture).
    let _ = writeln!(
        std::io::stderr(),
        "crash_kill seed {seed}: {KILLS} kills: {logging} while logging ({sigkills} SIGKILL after N acks, {} at \
         write-path crash points), {applying} while applying (at apply crash points; {after_logging} after logging \
         had finished); rows acknowledged per round {acked:?}",
        logging - sigkills
    );

    // Restart: drain whatever the last kill left, then check the whole table.
    let out = bin(&store).arg("recover").output().unwrap();
    assert!(out.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&out.stderr));
    let out = bin(&store).arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "seed {seed}: verify: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let checked = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(check_acknowledged(&store, &airports, &acked, seed));
    // Records of the second half whose latest acknowledgement came from a killed round; the
    // first AfterAcks kill acknowledged more than half of the file, so there are some.
    assert!(checked > 0, "seed {seed}: no killed round's acknowledgement was checked: {acked:?}");
}

/// Checks every record against the rounds that acknowledged it; returns how many records of
/// the second half (untouched by the last round) were checked.
async fn check_acknowledged(store: &Path, airports: &[Record], acked: &[usize], seed: u64) -> usize {
    let mut cfg = Config::new("kill").index_keys(["icao", "iata", "lid"]).row_key("name").local_path(store);
    cfg.durability = Durability::Process;
    cfg.options.history = HistoryOptions::on();
    let catalog = cfg.open().await.unwrap();
    assert_eq!(catalog.status().await.unwrap().pending, 0, "seed {seed}");
    // History: the change that wrote each record's current rows has its history row.
    let history = catalog.applier().history_table().unwrap().to_string();
    let rows =
        table_catalog::testing::verify::scan_all(catalog.store().as_ref(), &catalog.names().table).await.unwrap();
    let mut identities = std::collections::BTreeSet::new();
    for row in &rows {
        let Some(record) = table_catalog::record::from_entity(row) else { continue };
        if !identities.insert(row.row_key.clone()) {
            continue;
        }
        let id = WalId::from_stored(RowMeta::of(row).wal_id);
        let stored = catalog.store().get(&history, &row.row_key, &table_catalog::history::row_key(&id)).await.unwrap();
        let entry = stored.map(|e| HistoryEntry::from_entity(&e).unwrap());
        assert_eq!(
            entry.and_then(|e| e.record),
            Some(record),
            "seed {seed}: {}: no history row for the change {id} that wrote it",
            row.row_key
        );
    }
    assert!(identities.len() >= LAST_ROUND_ROWS, "seed {seed}: {} records", identities.len());
    let mut checked = 0;
    for (i, a) in airports.iter().enumerate() {
        let Some(latest_acked) = (0..acked.len()).filter(|k| i < acked[*k]).max() else {
            continue; // never acknowledged: may be absent; verify checked its rows agree
        };
        checked += usize::from(i >= LAST_ROUND_ROWS);
        for field in ["icao", "iata", "lid"] {
            let value = a[field].as_str().unwrap();
            if value.is_empty() {
                continue;
            }
            let found = catalog.query_all(&Filter::new(vec![(field.into(), value.into())])).await.unwrap();
            let mine: Vec<_> = found.iter().filter(|r| r["name"] == a["name"] && r["icao"] == a["icao"]).collect();
            assert_eq!(mine.len(), 1, "seed {seed}: {field}={value}");
            let round = mine[0]["round"].as_u64().unwrap() as usize;
            assert!(
                round >= latest_acked,
                "seed {seed}: {field}={value}: payload of round {round}, but round {latest_acked} was acknowledged"
            );
        }
    }
    checked
}
