//! Bulk import from CSV (with a header) or JSON lines, through the batch write path.
//!
//! CSV: every cell is a string, except in numeric columns: a column whose non-empty cells
//! are all canonical numbers (`13`, `-0.5`, `1e3`; not `007` or `+1`) becomes numbers. Index
//! and row-key columns always stay strings (identifiers like `0001` keep their zeros).
//! Empty cells stay empty strings (an empty index value means "not indexed").
//!
//! Files are streamed, never read whole: [`open`] yields rows one at a time, and
//! [`RowStream`] runs it on a blocking thread that hands rows over through a bounded channel
//! of [`ROW_CHANNEL`] rows, so an import holds at most that many rows plus one batch in
//! memory. A CSV file is read twice (once to find its numeric columns, once for the records);
//! a JSON line longer than [`MAX_LINE_BYTES`] is rejected as a row without being held whole.

use crate::env::Instant;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Number, Value as Json};
use tokio::sync::mpsc;

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::record::Record;
use crate::schema::Schema;

/// One input row: its 1-based number (the line of a JSON-lines file, the data row of a CSV
/// file) and the record, or why it cannot be one.
pub type Row = (usize, std::result::Result<Record, String>);

/// Records per WAL append (each append writes entity group transactions of 100 entries).
pub const DEFAULT_BATCH: usize = 500;

/// Rows buffered between the reading thread and the importer (see [`RowStream`]).
pub const ROW_CHANNEL: usize = 1024;

/// Longest JSON line read, in bytes (4 MiB, without the line end). A record is at most
/// [`crate::record::MAX_RECORD_BYTES`] (256 KiB), which even with every character written as
/// a 6-byte `\uXXXX` escape stays under this; a longer line is rejected as a row.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header row.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

impl Format {
    /// Guesses the format from the file name (`.jsonl`, `.ndjson`, `.json` are JSON lines).
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("jsonl" | "ndjson" | "json") => Format::JsonLines,
            _ => Format::Csv,
        }
    }
}

/// One input row that could not be imported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    /// 1-based line (JSON lines) or data row (CSV, header excluded).
    pub row: usize,
    /// Why.
    pub reason: String,
}

/// Outcome of an import.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Records read.
    pub read: usize,
    /// Records logged to the WAL.
    pub logged: usize,
    /// Rows rejected, with reasons.
    pub rejected: Vec<Rejected>,
    /// Wall time, in seconds.
    pub seconds: f64,
}

impl Summary {
    /// Logged records per second.
    pub fn records_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.logged as f64 / self.seconds
        } else {
            0.0
        }
    }
}

fn canonical_number(s: &str) -> Option<Number> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let int_part = digits.split(['.', 'e', 'E']).next().unwrap_or("");
    if int_part.is_empty()
        || (int_part.len() > 1 && int_part.starts_with('0'))
        || !int_part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if let Ok(i) = s.parse::<i64>() {
        return Some(Number::from(i));
    }
    if let Ok(u) = s.parse::<u64>() {
        return Some(Number::from(u));
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite()).and_then(Number::from_f64)
}

/// Reads a whole file into memory: rows of data, or per-row errors. For tests and small
/// files; an import streams with [`RowStream`] instead.
///
/// Errors: [`Error::Invalid`] naming the file when it cannot be opened or read, or when a
/// CSV header is unreadable or names a column twice.
pub fn read_file(path: &Path, format: Format, schema: &Schema) -> Result<Vec<Row>> {
    open(path, format, schema)?.collect()
}

/// Rows of a file, read as they are consumed. Each item is a row (data, or why the row is
/// rejected), or a fatal error that ends the input (the file cannot be read).
pub struct Rows {
    inner: Box<dyn Iterator<Item = Result<Row>> + Send>,
}

impl Iterator for Rows {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        self.inner.next()
    }
}

/// Opens a file for streaming. Blocking: a CSV file is read through once here, to find its
/// numeric columns, and opened again for the records.
///
/// Errors: [`Error::Invalid`] naming the file when it cannot be opened or read, or when a
/// CSV header is unreadable or names a column twice. Nothing has been imported then.
pub fn open(path: &Path, format: Format, schema: &Schema) -> Result<Rows> {
    let file = || File::open(path).map_err(|e| io_error(path, &e));
    let inner: Box<dyn Iterator<Item = Result<Row>> + Send> = match format {
        Format::JsonLines => Box::new(JsonLines::new(BufReader::new(file()?), path.to_path_buf())),
        Format::Csv => Box::new(CsvRows::new(file()?, file()?, schema, path)?),
    };
    Ok(Rows { inner })
}

fn io_error(path: &Path, e: &std::io::Error) -> Error {
    Error::invalid(format!("{}: {e}", path.display()))
}

/// Parses JSON lines held in memory, numbered by line (blank lines skipped; a line that is
/// not UTF-8 is rejected, never repaired). See [`open`] for files.
pub fn read_json_lines(bytes: &[u8]) -> Result<Vec<Row>> {
    JsonLines::new(bytes, PathBuf::from("<input>")).collect()
}

/// Parses CSV held in memory, with a header; numeric columns (see the module docs) become
/// numbers. See [`open`] for files.
pub fn read_csv(bytes: &[u8], schema: &Schema) -> Result<Vec<Row>> {
    CsvRows::new(bytes, bytes, schema, Path::new("<input>"))?.collect()
}

/// JSON lines, numbered by line: blank lines are skipped (but counted), a line that is not
/// UTF-8 is rejected, never repaired.
struct JsonLines<R> {
    reader: R,
    path: PathBuf,
    line: usize,
    buf: Vec<u8>,
    failed: bool,
}

impl<R: BufRead> JsonLines<R> {
    fn new(reader: R, path: PathBuf) -> Self {
        JsonLines { reader, path, line: 0, buf: Vec::new(), failed: false }
    }
}

impl<R: BufRead> Iterator for JsonLines<R> {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        while !self.failed {
            self.buf.clear();
            let (consumed, too_long) = match read_line_bounded(&mut self.reader, &mut self.buf, MAX_LINE_BYTES) {
                Ok(r) => r,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(io_error(&self.path, &e)));
                }
            };
            if consumed == 0 {
                return None;
            }
            self.line += 1;
            if too_long {
                return Some(Ok((self.line, Err(format!("line is longer than {MAX_LINE_BYTES} bytes")))));
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(Ok((self.line, parse_json_line(&self.buf))));
        }
        None
    }
}

fn parse_json_line(line: &[u8]) -> std::result::Result<Record, String> {
    match std::str::from_utf8(line) {
        Err(_) => Err("line is not valid UTF-8".to_string()),
        Ok(text) => match serde_json::from_str::<Json>(text) {
            Ok(Json::Object(r)) => Ok(r),
            Ok(_) => Err("not a JSON object".to_string()),
            Err(e) => Err(format!("invalid JSON: {e}")),
        },
    }
}

/// Reads up to and including the next `\n` into `buf` (without it), keeping at most `max`
/// bytes. Returns the bytes consumed (0 at the end of input) and whether the line was longer
/// than `max` (then `buf` is empty and the rest of the line was skipped).
fn read_line_bounded(r: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<(usize, bool)> {
    let (mut consumed, mut too_long) = (0, false);
    loop {
        let available = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((consumed, too_long));
        }
        let newline = available.iter().position(|b| *b == b'\n');
        let line_part = &available[..newline.unwrap_or(available.len())];
        if !too_long && buf.len() + line_part.len() > max {
            too_long = true;
            buf.clear();
        }
        if !too_long {
            buf.extend_from_slice(line_part);
        }
        let used = line_part.len() + usize::from(newline.is_some());
        r.consume(used);
        consumed += used;
        if newline.is_some() {
            return Ok((consumed, too_long));
        }
    }
}

/// CSV records as rows, numbered from 1 after the header. Built from two readers of the same
/// input: the first is read through to find the numeric columns, the second gives the rows.
struct CsvRows<R: Read> {
    headers: Vec<String>,
    numeric: Vec<bool>,
    records: csv::StringRecordsIntoIter<R>,
    path: PathBuf,
    row: usize,
    failed: bool,
}

fn csv_reader<R: Read>(r: R) -> csv::Reader<R> {
    csv::ReaderBuilder::new().has_headers(true).flexible(false).from_reader(r)
}

/// A CSV error that ends the input (the data could not be read), as opposed to a bad row.
fn csv_fatal(path: &Path, e: &csv::Error) -> Option<Error> {
    match e.kind() {
        csv::ErrorKind::Io(io) => Some(io_error(path, io)),
        _ => None,
    }
}

impl<R: Read> CsvRows<R> {
    fn new(first: impl Read, second: R, schema: &Schema, path: &Path) -> Result<Self> {
        let mut reader = csv_reader(first);
        let headers: Vec<String> = reader
            .headers()
            .map_err(|e| Error::invalid(format!("CSV header: {e}")))?
            .iter()
            .map(String::from)
            .collect();
        for (i, h) in headers.iter().enumerate() {
            if headers[..i].contains(h) {
                return Err(Error::invalid(format!("CSV header: column '{h}' appears more than once")));
            }
        }
        // A column is numeric when it has a non-empty cell and every non-empty cell of the
        // readable rows is a canonical number; index and row-key columns never are.
        let mut numeric: Vec<bool> = headers.iter().map(|h| !schema.is_index(h) && h != &schema.row_key).collect();
        let mut seen = vec![false; headers.len()];
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(false) => break,
                Ok(true) => {
                    for (i, cell) in record.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
                        if let Some(n) = numeric.get_mut(i) {
                            seen[i] = true;
                            *n = *n && canonical_number(cell).is_some();
                        }
                    }
                }
                Err(e) => {
                    if let Some(fatal) = csv_fatal(path, &e) {
                        return Err(fatal);
                    }
                }
            }
        }
        for (n, seen) in numeric.iter_mut().zip(seen) {
            *n = *n && seen;
        }
        let mut second = csv_reader(second);
        second.headers().map_err(|e| Error::invalid(format!("CSV header: {e}")))?;
        Ok(CsvRows {
            headers,
            numeric,
            records: second.into_records(),
            path: path.to_path_buf(),
            row: 0,
            failed: false,
        })
    }
}

impl<R: Read> Iterator for CsvRows<R> {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        if self.failed {
            return None;
        }
        let row = self.records.next()?;
        self.row += 1;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                if let Some(fatal) = csv_fatal(&self.path, &e) {
                    self.failed = true;
                    return Some(Err(fatal));
                }
                return Some(Ok((self.row, Err(format!("CSV: {e}")))));
            }
        };
        let mut record = Map::new();
        for (i, cell) in row.iter().enumerate() {
            let value = match canonical_number(cell) {
                Some(n) if self.numeric.get(i).copied().unwrap_or(false) => Json::Number(n),
                _ => Json::String(cell.to_string()),
            };
            let Some(name) = self.headers.get(i) else { break };
            record.insert(name.clone(), value);
        }
        Some(Ok((self.row, Ok(record))))
    }
}

/// Rows of a file read by a blocking thread ([`open`]) and handed over through a channel of
/// [`ROW_CHANNEL`] rows: the reader waits while the importer is busy, so memory stays
/// bounded whatever the file's size. Dropping the stream stops the reader.
pub struct RowStream {
    rx: mpsc::Receiver<Result<Row>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl RowStream {
    /// Starts reading `path` on a blocking thread. Must be called inside a Tokio runtime.
    /// Errors opening or reading the file arrive from [`RowStream::next_chunk`].
    pub fn open(path: &Path, format: Format, schema: &Schema) -> RowStream {
        let (tx, rx) = mpsc::channel(ROW_CHANNEL);
        let (path, schema) = (path.to_path_buf(), schema.clone());
        let reader = tokio::task::spawn_blocking(move || {
            let rows = match open(&path, format, &schema) {
                Ok(rows) => rows,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            for row in rows {
                let fatal = row.is_err();
                if tx.blocking_send(row).is_err() || fatal {
                    return;
                }
            }
        });
        RowStream { rx, reader: Some(reader) }
    }

    /// The next rows, at most `max` (at least 1); empty at the end of the input.
    ///
    /// Errors: the file could not be opened or read (see [`open`]); rows returned before
    /// stay valid.
    pub async fn next_chunk(&mut self, max: usize) -> Result<Vec<Row>> {
        let mut rows = Vec::with_capacity(max.clamp(1, ROW_CHANNEL));
        while rows.len() < max.max(1) {
            match self.rx.recv().await {
                Some(Ok(row)) => rows.push(row),
                Some(Err(e)) => return Err(e),
                None => {
                    // The reader is done; a reader that panicked must not look like the end.
                    if let Some(reader) = self.reader.take() {
                        reader.await.map_err(|e| Error::invalid(format!("reading the input failed: {e}")))?;
                    }
                    break;
                }
            }
        }
        Ok(rows)
    }
}

/// Logs rows through [`Catalog::upsert_many`], one batch per call, and keeps the
/// [`Summary`]. Rows that failed to parse or fail validation are rejected with their reason;
/// the rest are logged.
pub struct Importer<'a> {
    catalog: &'a Catalog,
    summary: Summary,
    started: Instant,
}

impl<'a> Importer<'a> {
    /// An importer into `catalog`; its clock for [`Summary::seconds`] starts now.
    pub fn new(catalog: &'a Catalog) -> Self {
        Importer { catalog, summary: Summary::default(), started: crate::env::now() }
    }

    /// Logs one batch (one WAL append). Returns the number of rows done so far, rejected ones
    /// included; when it returns, every accepted row so far is durable (acknowledged).
    ///
    /// Errors: the WAL append failed (storage); rows of earlier batches stay logged.
    pub async fn log(&mut self, rows: Vec<Row>) -> Result<usize> {
        self.summary.read += rows.len();
        let mut numbers = Vec::with_capacity(rows.len());
        let mut records = Vec::with_capacity(rows.len());
        for (n, row) in rows {
            match row {
                Ok(r) => {
                    numbers.push(n);
                    records.push(r);
                }
                Err(reason) => self.summary.rejected.push(Rejected { row: n, reason }),
            }
        }
        if !records.is_empty() {
            let results = self.catalog.upsert_many(records, false).await?;
            for (row, result) in numbers.into_iter().zip(results) {
                match result {
                    Ok(_) => self.summary.logged += 1,
                    Err(e) => self.summary.rejected.push(Rejected { row, reason: e.to_string() }),
                }
            }
        }
        Ok(self.summary.read)
    }

    /// The summary: rejected rows sorted by row number, wall time since [`Importer::new`].
    pub fn finish(mut self) -> Summary {
        self.summary.rejected.sort_by_key(|r| r.row);
        self.summary.seconds = self.started.elapsed().as_secs_f64();
        self.summary
    }
}

/// Logs `rows` through [`Catalog::upsert_many`] in batches of `batch`, calling `progress`
/// with the number of rows done after each batch. Rows that fail validation are rejected
/// with their reason; the rest are logged.
pub async fn import_rows(
    catalog: &Catalog,
    rows: Vec<Row>,
    batch: usize,
    mut progress: impl FnMut(usize),
) -> Result<Summary> {
    let mut importer = Importer::new(catalog);
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let done = importer.log(rows.by_ref().take(batch.max(1)).collect()).await?;
        progress(done);
    }
    Ok(importer.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_columns_only_when_every_cell_is_a_canonical_number() {
        let schema = Schema::new(vec!["icao".into(), "lid".into()], "name").unwrap();
        let csv = "icao,name,elevation,lat,code,lid\n00AA,A,3435,38.7,007,0001\n00AK,B,,-151.5,12,00AK\n";
        let rows = read_csv(csv.as_bytes(), &schema).unwrap();
        let a = rows[0].1.as_ref().unwrap();
        assert_eq!(a["icao"], "00AA");
        assert_eq!(a["elevation"], 3435);
        assert_eq!(a["lat"], 38.7);
        assert_eq!(a["code"], "007");
        assert_eq!(a["lid"], "0001");
        let b = rows[1].1.as_ref().unwrap();
        assert_eq!(b["elevation"], "");
        assert_eq!(b["lat"], -151.5);
        assert_eq!(b["code"], "12");
    }

    #[test]
    fn json_lines_report_bad_lines() {
        let rows = read_json_lines(b"{\"a\":1}\n\n[1]\n{bad\n{\"z\":\"\xfc\"}\n").unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows[0].1.is_ok());
        assert_eq!((rows[1].0, rows[1].1.as_ref().unwrap_err().as_str()), (3, "not a JSON object"));
        assert!(rows[2].1.as_ref().unwrap_err().starts_with("invalid JSON"));
        assert_eq!(rows[3].1.as_ref().unwrap_err(), "line is not valid UTF-8");
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_whole_and_the_next_line_is_read() {
        let input = b"0123456789\nabc\nlast";
        let mut reader = std::io::BufReader::with_capacity(4, &input[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line_bounded(&mut reader, &mut buf, 5).unwrap(), (11, true));
        assert!(buf.is_empty());
        assert_eq!(read_line_bounded(&mut reader, &mut buf, 5).unwrap(), (4, false));
        assert_eq!(buf, b"abc");
        buf.clear();
        assert_eq!(read_line_bounded(&mut reader, &mut buf, 5).unwrap(), (4, false));
        assert_eq!(buf, b"last");
        buf.clear();
        assert_eq!(read_line_bounded(&mut reader, &mut buf, 5).unwrap(), (0, false));
    }

    #[test]
    fn a_streamed_file_gives_the_rows_of_the_whole_file() {
        let schema = Schema::new(vec!["icao".into()], "name").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let csv = "icao,name,n\nA,a,1\nB,b\nC,c,2.5\n";
        let path = dir.path().join("x.csv");
        std::fs::write(&path, csv).unwrap();
        let streamed = read_file(&path, Format::Csv, &schema).unwrap();
        assert_eq!(streamed, read_csv(csv.as_bytes(), &schema).unwrap());
        assert_eq!(streamed.len(), 3);
        assert_eq!(streamed[2].1.as_ref().unwrap()["n"], 2.5);
        assert!(streamed[1].1.as_ref().unwrap_err().starts_with("CSV"));
        let missing = read_file(&dir.path().join("missing.csv"), Format::Csv, &schema).unwrap_err();
        assert!(missing.to_string().contains("missing.csv"), "{missing}");
    }

    #[test]
    fn canonical_numbers() {
        for (s, ok) in [
            ("0", true),
            ("-1", true),
            ("1.5", true),
            ("1e3", true),
            ("007", false),
            ("+1", false),
            ("", false),
            ("1.", true),
            ("abc", false),
            ("0.5", true),
            ("NaN", false),
        ] {
            assert_eq!(canonical_number(s).is_some(), ok, "{s}");
        }
    }
}
