//! The Azure Functions deployment package built by `scripts/package.sh`.
//!
//! Runs only with `TC_TEST_PACKAGE=1` (`scripts/test.sh` sets it); otherwise it prints a
//! `SKIPPED:` line (see `tests/common/skip.rs`; `scripts/test.sh` fails on it). Builds the real
//! package with `scripts/package.sh` (an `x86_64-unknown-linux-musl` build with the
//! deployment's features; the script installs the target and a musl C compiler when missing;
//! profile `package-check`, the release profile without optimisation, unless
//! `TC_PACKAGE_PROFILE` names another: `TC_PACKAGE_PROFILE=release` checks what a deployment
//! gets, at 5 minutes more on a 2-core machine), checks the zip layout the host expects (host.json, the
//! executable and one folder per function at the zip root, modes kept), reads the packaged ELF
//! with the `object` crate (static: no PT_INTERP, no DT_NEEDED; or else no `GLIBC_` symbol
//! version above 2.17), then extracts the zip and starts the
//! packaged binary the way the Functions host does: `table-catalog handler` in the app root
//! with `FUNCTIONS_CUSTOMHANDLER_PORT` set, polling `GET /` every 25 ms until any HTTP
//! response, for at most 30 s (the host's initialization timeout).
//!
//! Storage: with `TC_TEST_AZURE_CONNECTION` (Azurite, `scripts/azurite.sh`) the handler gets
//! that connection string and a catalog name unique to the run; without it, no connection
//! string at all and a temporary `TABLE_CATALOG_LOCAL_PATH`.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use table_catalog::testing::settings::{self, SETTINGS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const BINARY: &str = "table-catalog";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// One entry of a zip's central directory.
#[derive(Debug)]
struct ZipEntry {
    name: String,
    /// Unix mode, when the entry was made on Unix (`version made by` host 3).
    mode: Option<u32>,
    crc32: u32,
    size: u64,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the central directory of a (non-zip64) zip file.
fn zip_entries(bytes: &[u8]) -> Vec<ZipEntry> {
    let eocd = (0..=bytes.len().saturating_sub(22))
        .rev()
        .find(|&i| bytes[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .expect("zip end-of-central-directory record");
    let count = u16_at(bytes, eocd + 10);
    let mut at = u32_at(bytes, eocd + 16) as usize;
    let mut out = Vec::new();
    for _ in 0..count {
        assert_eq!(bytes[at..at + 4], [0x50, 0x4b, 0x01, 0x02], "central directory header");
        let made_by_host = bytes[at + 5];
        let crc32 = u32_at(bytes, at + 16);
        let size = u64::from(u32_at(bytes, at + 24));
        let (name_len, extra_len, comment_len) =
            (u16_at(bytes, at + 28), u16_at(bytes, at + 30), u16_at(bytes, at + 32));
        let external = u32_at(bytes, at + 38);
        let name = String::from_utf8(bytes[at + 46..at + 46 + name_len].to_vec()).expect("UTF-8 entry name");
        let mode = (made_by_host == 3).then_some(external >> 16);
        out.push(ZipEntry { name, mode, crc32, size });
        at += 46 + name_len + extra_len + comment_len;
    }
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// The zip content the host needs: host.json, the binary, `<function>/function.json`.
fn expected_entries() -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    out.insert("host.json".to_string(), root().join("host.json"));
    for e in fs::read_dir(root().join("functions")).unwrap() {
        let dir = e.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        out.insert(format!("{name}/function.json"), dir.join("function.json"));
    }
    out
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Status code of `GET path`, or `None` when no HTTP response came (connection refused...).
fn http_get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    let line = std::str::from_utf8(&head).ok()?;
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}

/// Kills the handler when the test ends, passed or not.
struct Handler(Child);

impl Drop for Handler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4000);
    text[text.char_indices().map(|(i, _)| i).find(|&i| i >= start).unwrap_or(text.len())..].to_string()
}

/// The newest glibc a dynamic package may need: the oldest glibc of any Functions worker image
/// is unknown, 2.17 is what `cargo zigbuild --target x86_64-unknown-linux-gnu.2.17` builds for.
const MAX_GLIBC: (u32, u32) = (2, 17);

/// How an ELF executable is linked: what the loader must find on the worker.
#[derive(Debug, PartialEq)]
struct Linkage {
    /// The PT_INTERP program header (the dynamic loader), if any.
    interpreter: Option<String>,
    /// DT_NEEDED entries (shared libraries).
    needed: Vec<String>,
    /// `GLIBC_x.y` symbol versions the binary needs (SHT_GNU_VERNEED), as (x, y).
    glibc: Vec<(u32, u32)>,
}

impl Linkage {
    fn is_static(&self) -> bool {
        self.interpreter.is_none() && self.needed.is_empty()
    }

    /// Static, or needing no glibc symbol version newer than `max`.
    fn runs_on_glibc(&self, max: (u32, u32)) -> bool {
        self.is_static() || self.glibc.iter().all(|&v| v <= max)
    }
}

/// Reads the linkage of a 64-bit little-endian ELF file with the `object` crate.
fn elf_linkage(data: &[u8]) -> Linkage {
    use object::elf::{FileHeader64, DT_NEEDED, PT_INTERP};
    use object::read::elf::{Dyn, FileHeader, ProgramHeader};
    use object::LittleEndian as LE;

    let header = FileHeader64::<LE>::parse(data).expect("ELF64 little-endian header");
    let endian = LE;
    let mut interpreter = None;
    for ph in header.program_headers(endian, data).expect("program headers") {
        if ph.p_type(endian) == PT_INTERP {
            let bytes = ph.data(endian, data).expect("PT_INTERP data");
            interpreter = Some(String::from_utf8_lossy(bytes).trim_end_matches('\0').to_string());
        }
    }
    let sections = header.sections(endian, data).expect("section headers");
    let mut needed = Vec::new();
    if let Some((dynamic, link)) = sections.dynamic(endian, data).expect("dynamic section") {
        let strings = sections.strings(endian, data, link).expect("dynamic string table");
        for d in dynamic.iter().filter(|d| d.tag(endian) == DT_NEEDED) {
            let name = d.string(endian, strings).expect("DT_NEEDED name");
            needed.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    let mut glibc = Vec::new();
    if let Some((mut needs, link)) = sections.gnu_verneed(endian, data).expect("version needs") {
        let strings = sections.strings(endian, data, link).expect("version string table");
        while let Some((_, mut aux)) = needs.next().expect("Verneed entry") {
            while let Some(a) = aux.next().expect("Vernaux entry") {
                let name = String::from_utf8_lossy(a.name(endian, strings).expect("version name")).into_owned();
                let mut parts = name.strip_prefix("GLIBC_").into_iter().flat_map(|v| v.split('.'));
                if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next().map(str::parse), parts.next().map(str::parse))
                {
                    glibc.push((major, minor));
                }
            }
        }
    }
    glibc.sort_unstable();
    glibc.dedup();
    Linkage { interpreter, needed, glibc }
}

/// The ELF reader tells a dynamic glibc executable (this test's own build of the binary, linked
/// against the build machine's glibc) from the bounds, so the package check can fail.
#[test]
fn elf_linkage_reads_a_dynamic_glibc_binary() {
    let own = fs::read(env!("CARGO_BIN_EXE_table-catalog")).unwrap();
    let linkage = elf_linkage(&own);
    assert!(!linkage.is_static(), "{linkage:?}");
    assert!(linkage.interpreter.as_deref().is_some_and(|i| i.contains("ld-linux")), "{linkage:?}");
    assert!(linkage.needed.iter().any(|n| n.starts_with("libc.so")), "{linkage:?}");
    let newest = *linkage.glibc.last().expect("GLIBC_ versions");
    assert!(newest >= (2, 2), "{linkage:?}");
    assert!(linkage.runs_on_glibc(newest), "{linkage:?}");
    assert!(!linkage.runs_on_glibc((newest.0, newest.1 - 1)), "{linkage:?}");
}

#[test]
fn package_has_the_host_layout_and_the_binary_starts_in_handler_mode() {
    if std::env::var("TC_TEST_PACKAGE").ok().as_deref() != Some("1") {
        common::skip::skipped(
            "package_has_the_host_layout_and_the_binary_starts_in_handler_mode",
            "TC_TEST_PACKAGE is not 1 (set it to build the Functions package and check it)",
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();

    // Build the package a deployment gets: musl, the deployment's features (an extra full build
    // of the binary), in the `package-check` profile unless TC_PACKAGE_PROFILE names another.
    let profile = std::env::var("TC_PACKAGE_PROFILE").unwrap_or_else(|_| "package-check".into());
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/package.sh"))
        .env("TC_PACKAGE_OUT", out.path())
        .env("TC_PACKAGE_PROFILE", &profile)
        .env_remove("TC_PACKAGE_BINARY");
    let run = cmd.stderr(Stdio::inherit()).output().expect("run scripts/package.sh");
    assert!(run.status.success(), "scripts/package.sh failed: {}", run.status);
    let printed = String::from_utf8(run.stdout).unwrap();
    let zip_path = PathBuf::from(printed.lines().last().expect("package.sh prints the zip path").trim());
    assert_eq!(zip_path, out.path().join("table-catalog-functions.zip"));
    let bytes = fs::read(&zip_path).unwrap();

    // Layout: exactly the expected entries, at the root, with their modes and content.
    let entries = zip_entries(&bytes);
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let mut expected = expected_entries();
    let mut want: Vec<String> = expected.keys().cloned().collect();
    want.push(BINARY.to_string());
    want.sort();
    let mut got: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    got.sort();
    assert_eq!(got, want, "zip entries");
    assert!(!names.contains(&"local.settings.json"), "local.settings.json must not be packaged");
    for e in &entries {
        let mode = e.mode.unwrap_or_else(|| panic!("{}: no Unix mode recorded", e.name));
        assert_eq!(mode & 0o170000, 0o100000, "{}: regular file", e.name);
        let want_mode = if e.name == BINARY { 0o755 } else { 0o644 };
        assert_eq!(mode & 0o777, want_mode, "{}: mode {:o}", e.name, mode & 0o777);
        if let Some(src) = expected.remove(&e.name) {
            let content = fs::read(&src).unwrap();
            assert_eq!(
                (e.size, e.crc32),
                (content.len() as u64, crc32(&content)),
                "{} differs from {}",
                e.name,
                src.display()
            );
        }
    }

    // Extract as a deployment would and check the binary.
    let app = out.path().join("app");
    fs::create_dir(&app).unwrap();
    let status = Command::new("python3")
        .args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"])
        .arg(&zip_path)
        .arg(&app)
        .status()
        .expect("python3 to extract the zip");
    assert!(status.success());
    let exe = app.join(BINARY);
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let elf = fs::read(&exe).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "ELF executable");
    assert_eq!(elf[4], 2, "64-bit ELF");
    assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 0x3e, "x86-64 machine");
    let linkage = elf_linkage(&elf);
    println!("packaged binary: {linkage:?}");
    assert!(
        linkage.runs_on_glibc(MAX_GLIBC),
        "the packaged binary needs more than a static binary or glibc {MAX_GLIBC:?}: {linkage:?}"
    );

    // Built without the `bench` and `testing` features (scripts/package.sh): no `bench` command.
    let bench = Command::new(&exe).args(["bench", "--help"]).output().unwrap();
    assert!(!bench.status.success(), "the packaged binary has no `bench` command");
    assert!(String::from_utf8_lossy(&bench.stderr).contains("unrecognized subcommand 'bench'"), "{bench:?}");
    println!("packaged binary: {} bytes", fs::metadata(&exe).unwrap().len());

    // Start it as the host does: `<app root>/table-catalog handler`, cwd = app root.
    let values: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(root().join("local.settings.json")).unwrap()).unwrap();
    let logs = out.path().join("handler.log");
    let errs = out.path().join("handler.err");
    let mut cmd = Command::new(&exe);
    cmd.arg(table_catalog::functions::HANDLER_SUBCOMMAND).current_dir(&app);
    for s in SETTINGS {
        cmd.env_remove(s.name);
    }
    for (k, v) in values["Values"].as_object().unwrap() {
        cmd.env(k, v.as_str().unwrap());
    }
    let name = format!("pkg{}", std::process::id());
    let lookup = |n: &str| (n == settings::NAME).then(|| name.clone());
    match std::env::var("TC_TEST_AZURE_CONNECTION") {
        Ok(conn) if !conn.is_empty() => {
            cmd.env(settings::WEBJOBS_STORAGE, &conn).env(settings::CONNECTION_STRING, &conn);
            for n in [settings::NAME, settings::WAL_NAME, settings::QUEUE, settings::SCAN_QUEUE] {
                cmd.env(n, settings::default_value(n, &lookup).unwrap());
            }
        }
        _ => {
            cmd.env_remove(settings::WEBJOBS_STORAGE).env(settings::LOCAL_PATH, out.path().join("store"));
        }
    }
    cmd.env("FUNCTIONS_CUSTOMHANDLER_WORKER_ID", "00000000-0000-0000-0000-000000000001")
        .env("FUNCTIONS_HTTPWORKER_ID", "00000000-0000-0000-0000-000000000001")
        .env("FUNCTIONS_APP_ROOT_PATH", &app)
        .stdin(Stdio::null());

    let mut attempts = 0;
    let (port, ready_status, started, _handler) = 'start: loop {
        // Like the host, hand over a port found free; another process can take it before the
        // handler binds it (the handler then exits naming it): pick another.
        let port = free_port();
        cmd.env(settings::CUSTOMHANDLER_PORT, port.to_string())
            .env("FUNCTIONS_HTTPWORKER_PORT", port.to_string())
            .stdout(fs::File::create(&logs).unwrap())
            .stderr(fs::File::create(&errs).unwrap());
        let mut handler = Handler(cmd.spawn().expect("start the packaged binary"));
        let started = Instant::now();
        loop {
            if let Some(status) = http_get_status(port, "/") {
                break 'start (port, status, started, handler);
            }
            if let Some(exit) = handler.0.try_wait().unwrap() {
                if attempts < 3 && log_tail(&errs).contains(&format!("binding 127.0.0.1:{port}")) {
                    attempts += 1;
                    continue 'start;
                }
                panic!(
                    "handler exited ({exit}) before answering GET /\nstdout:\n{}\nstderr:\n{}",
                    log_tail(&logs),
                    log_tail(&errs)
                );
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "handler not ready within {READY_TIMEOUT:?} (the host would restart it)\nstderr:\n{}",
                log_tail(&errs)
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    };
    println!("handler answered GET / with {ready_status} after {:?}", started.elapsed());

    // Forwarded API requests keep the route prefix: /api/health must be routed (any status
    // but 404; 503 is fine when storage is unreachable).
    let health = http_get_status(port, "/api/health").expect("an HTTP response to GET /api/health");
    assert_ne!(health, 404, "GET /api/health is not routed: the API must live under /api");
    println!("GET /api/health -> {health}");
}

#[test]
fn zip_reader_and_crc_work() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
    // A zip with one stored entry "a" (content "x", mode 0644) made on Unix.
    let mut z = Vec::new();
    let crc = crc32(b"x");
    // Local header.
    z.extend_from_slice(&[0x50, 0x4b, 0x03, 0x04, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    z.extend_from_slice(&crc.to_le_bytes());
    z.extend_from_slice(&1u32.to_le_bytes());
    z.extend_from_slice(&1u32.to_le_bytes());
    z.extend_from_slice(&1u16.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z.extend_from_slice(b"ax");
    let cd = z.len() as u32;
    z.extend_from_slice(&[0x50, 0x4b, 0x01, 0x02, 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    z.extend_from_slice(&crc.to_le_bytes());
    z.extend_from_slice(&1u32.to_le_bytes());
    z.extend_from_slice(&1u32.to_le_bytes());
    z.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    z.extend_from_slice(&((0o100644u32) << 16).to_le_bytes());
    z.extend_from_slice(&0u32.to_le_bytes());
    z.extend_from_slice(b"a");
    let cd_len = z.len() as u32 - cd;
    z.extend_from_slice(&[0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 1, 0, 1, 0]);
    z.extend_from_slice(&cd_len.to_le_bytes());
    z.extend_from_slice(&cd.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    let e = zip_entries(&z);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].name.as_str(), e[0].mode, e[0].crc32, e[0].size), ("a", Some(0o100644), crc, 1));
}
