//! Filters and paged reads of one index partition.
//!
//! A filter names one or more index fields with a value each; a record matches when every
//! named field's value equals the given one case-insensitively (the reference lowercases
//! keys, so matching is case-insensitive). One index's partition is read: an active
//! composite index whose fields are exactly the filter's (`country+subd` for
//! `country=US&subd=Texas`), else the first field's (`crate::index_choice`); the fields are
//! checked on the records read, which gives the reference's intersection semantics with one
//! partition read instead of one per field.
//!
//! A hashed index field (`crate::hashed`) is looked up by the HMAC of the value, computed
//! the same way as when the record was written, so `ssn=123-45-6789` finds the record while
//! no key holds the number. Only exact lookups exist on index fields: `row_from`/`row_to`
//! bound the sort (row-key) field, which can never be hashed.

use base64::Engine as _;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::keys;
use crate::record::{self, Record};
use crate::schema::Schema;
use crate::store::{pager, Entity, RowRange, TableStore, MAX_PAGE};

/// Which records an operation addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    /// (index field, value) pairs; all must match.
    pub fields: Vec<(String, String)>,
    /// Smallest sort value (inclusive), compared on the lowercased RowKey.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_from: Option<String>,
    /// Largest sort value (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_to: Option<String>,
    /// One record identity (its RowKey, as stored): only rows with exactly this RowKey
    /// match. Index values alone cannot name one identity (a record without a value for some
    /// index field and one with a value there share every value a filter can name); `repair`
    /// needs to delete exactly one. Absent from WAL entries without it, so older entries read
    /// as before (a process of an earlier version ignores it and matches by fields alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Read an index that is still backfilling ([`crate::schema::IndexState::Backfilling`]):
    /// the rows it has so far, which miss records written before it was added and not yet
    /// backfilled. Lookups only; never logged (writes need active indexes).
    #[serde(skip)]
    pub allow_partial: bool,
    /// Return only these fields of each record (HTTP `?fields=a,b`; at most
    /// [`MAX_RETURNED_FIELDS`]). Through a projected index (`crate::projection`) they must be
    /// fields its rows hold, and the lookup then answers from the index rows without reading
    /// the fact rows. Lookups only; never logged.
    #[serde(skip)]
    pub returning: Option<Vec<String>>,
}

/// At most this many fields in [`Filter::returning`].
pub const MAX_RETURNED_FIELDS: usize = 64;

impl Filter {
    /// A filter on these fields, without a sort-value range.
    pub fn new(fields: Vec<(String, String)>) -> Filter {
        Filter { fields, row_from: None, row_to: None, identity: None, allow_partial: false, returning: None }
    }

    /// Restricts the filter to one record identity (builder style; see [`Filter::identity`]).
    pub fn identity(mut self, row_key: impl Into<String>) -> Filter {
        self.identity = Some(row_key.into());
        self
    }

    /// Returns only `fields` of each record (builder style; see [`Filter::returning`]).
    pub fn returning(mut self, fields: Option<Vec<String>>) -> Filter {
        self.returning = fields;
        self
    }

    /// Allows reading a backfilling index (builder style; see [`Filter::allow_partial`]).
    pub fn allow_partial(mut self, yes: bool) -> Filter {
        self.allow_partial = yes;
        self
    }

    /// Adds a sort-value range (builder style).
    pub fn range(mut self, row_from: Option<String>, row_to: Option<String>) -> Filter {
        self.row_from = row_from;
        self.row_to = row_to;
        self
    }

    /// Checks the filter against the schema: at least one field, each value non-empty and
    /// short enough for a key, and an index to read (`crate::index_choice`): an active
    /// composite index whose fields are exactly the filter's, or else only index fields.
    /// Errors name the field or index: [`Error::Invalid`] for a field that is not an index,
    /// a dropping index or a composite index's name; [`Error::IndexNotReady`] for a
    /// backfilling one without [`Filter::allow_partial`].
    pub fn validate(&self, schema: &Schema) -> Result<()> {
        for (field, value) in &self.fields {
            if value.is_empty() && !crate::composite::is_composite(field) {
                return Err(Error::invalid(format!("filter: the value of '{field}' is empty")));
            }
        }
        let (index, _) = self.index_read(schema)?;
        if !crate::composite::is_composite(&index) {
            for (field, value) in &self.fields {
                schema.partition_key(field, value)?;
            }
        }
        for (name, bound) in [("row_from", &self.row_from), ("row_to", &self.row_to), ("identity", &self.identity)] {
            if let Some(b) = bound {
                if b.encode_utf16().count() > keys::MAX_KEY_UTF16 {
                    return Err(Error::invalid(format!(
                        "{name}: longer than {} UTF-16 code units",
                        keys::MAX_KEY_UTF16
                    )));
                }
            }
        }
        Ok(())
    }

    /// True when the record has every filtered value (case-insensitively; through the
    /// HMAC for hashed fields, so a redacted record matches its plaintext value).
    pub fn matches(&self, schema: &Schema, record: &Record) -> bool {
        self.fields.iter().all(|(field, value)| {
            Schema::index_value(record, field).is_some_and(|v| schema.same_value(field, &v, value))
        })
    }

    /// The partition a lookup with this filter reads (`crate::index_choice`).
    pub fn partition_key(&self, schema: &Schema) -> Result<String> {
        Ok(self.index_read(schema)?.1)
    }

    /// The RowKey ranges to read for the filter's sort-value bounds: at most two, ascending
    /// and disjoint (see `keys::row_ranges`). They may hold a few rows outside the bounds:
    /// check each with [`Filter::in_sort_range`].
    pub fn row_ranges(&self) -> Vec<RowRange> {
        match &self.identity {
            Some(id) => vec![RowRange { from: Some(id.clone()), to: Some(id.clone()), ..RowRange::default() }],
            None => keys::row_ranges(self.row_from.as_deref(), self.row_to.as_deref()),
        }
    }

    /// One RowKey range covering every range of [`Filter::row_ranges`] (from the first's
    /// start to the last's end), for callers that read a single range. It is wider than the
    /// ranges when there are two (a `row_to` starting with a digit, space or punctuation and
    /// no `row_from`): prefer [`Filter::row_ranges`]. Check each row with
    /// [`Filter::in_sort_range`].
    pub fn row_range(&self) -> RowRange {
        let ranges = self.row_ranges();
        match (ranges.first(), ranges.last()) {
            (Some(first), Some(last)) => RowRange {
                from: first.from.clone(),
                before: last.before.clone(),
                to: last.to.clone(),
                ..RowRange::default()
            },
            // Nothing can match: `RowKey lt ''` selects no row.
            _ => RowRange { before: Some(String::new()), ..RowRange::default() },
        }
    }

    /// True when a row's sort value lies within the filter's bounds.
    pub fn in_sort_range(&self, row_key: &str) -> bool {
        keys::sort_value_in_range(row_key, self.row_from.as_deref(), self.row_to.as_deref())
    }

    /// True when a row's RowKey passes the filter: its sort value is within the bounds and,
    /// with [`Filter::identity`], it is that identity. (The record itself is checked by
    /// [`Filter::matches`].)
    pub fn admits_row_key(&self, row_key: &str) -> bool {
        self.in_sort_range(row_key) && self.identity.as_deref().is_none_or(|id| id == row_key)
    }
}

// Redacting a filter is the schema's (it holds the keys), written here so that `schema` does
// not depend on `query`.
impl Schema {
    /// The filter as logged: every hashed field's value in redacted form, so a WAL entry
    /// holds no plaintext of a hashed field. It addresses the same records.
    pub fn blind_filter(&self, mut filter: Filter) -> Filter {
        for (field, value) in &mut filter.fields {
            if let Some(key) = self.key_of(field) {
                *value = key.redacted(value);
            }
        }
        filter
    }
}

/// A record found by a query, with the RowKey it is stored under.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The record (no system properties).
    pub record: Record,
    /// Its RowKey.
    pub row_key: String,
}

/// One page of query results.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultPage {
    /// Matching records in RowKey order.
    pub records: Vec<Found>,
    /// Pass back to get the next page; `None` when there is nothing more.
    pub continuation: Option<String>,
    /// The index read: a field, or a composite index's name such as `country+subd`
    /// (`crate::index_choice`; HTTP: the `X-TableCatalog-Index` header).
    pub index: String,
}

pub(crate) fn encode_continuation(row_key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(row_key)
}

pub(crate) fn decode_continuation(token: &str) -> Result<String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| Error::invalid("continuation: not a token this catalog issued"))
}

fn live_match(schema: &Schema, filter: &Filter, e: &Entity) -> Option<Found> {
    if !filter.admits_row_key(&e.row_key) {
        return None;
    }
    record::from_entity(e)
        .filter(|r| filter.matches(schema, r) || (projected(r) && filter.matches_held(schema, r)))
        .map(|record| Found { record, row_key: e.row_key.clone() })
}

/// True for a projected row's payload (`crate::projection`).
fn projected(r: &Record) -> bool {
    r.contains_key(crate::projection::FACT_PARTITION)
}

impl Filter {
    /// True when the record has every filtered value among the fields it holds: a projected
    /// row written before an index was added lacks that index's field, and its fact row
    /// decides (`resolve_facts` checks the whole filter there).
    fn matches_held(&self, schema: &Schema, record: &Record) -> bool {
        self.fields.iter().all(|(field, value)| match Schema::index_value(record, field) {
            Some(v) => schema.same_value(field, &v, value),
            None => !record.contains_key(field.as_str()),
        })
    }
}

/// True when every RowKey of `range` is at or below `row_key` (UTF-16 order, as the service
/// compares keys): resuming after `row_key` finds nothing there.
pub(crate) fn ends_at_or_before(range: &RowRange, row_key: &str) -> bool {
    let le = |bound: &str| bound.encode_utf16().cmp(row_key.encode_utf16()).is_le();
    range.before.as_deref().is_some_and(le) || range.to.as_deref().is_some_and(le)
}

/// At most this many fact rows are read at once for a page of a projected index.
const FACT_READS: usize = 16;

/// Reads up to `limit` matching records of the filter's partition, starting after
/// `continuation`. Tombstones and records failing the other filter fields are skipped, so
/// this may read more rows than it returns. The filter's RowKey ranges
/// ([`Filter::row_ranges`]) are read in order; the continuation is the last RowKey returned.
///
/// Through a projected index (`crate::projection`) each row found is followed to its
/// record's fact row (read concurrently, at most 16 at once), and the whole record is
/// returned; a row whose fact row is gone, a tombstone, or no longer matches the filter (the
/// record changed between the two reads) is left out, so a page may then hold fewer than
/// `limit` records while a continuation follows.
pub async fn query_page(
    store: &dyn TableStore,
    table: &str,
    schema: &Schema,
    filter: &Filter,
    limit: usize,
    continuation: Option<&str>,
) -> Result<ResultPage> {
    let mut page = read_page(store, table, schema, filter, limit, continuation).await?;
    resolve_facts(store, table, schema, filter, &mut page.records).await?;
    Ok(page)
}

/// Replaces each record of `found` read from a projected row (it holds
/// `crate::projection::FACT_PARTITION`) by the live record of its fact row when that still
/// matches `filter`, and leaves it out otherwise. Records read whole are kept as they are.
async fn resolve_facts(
    store: &dyn TableStore,
    table: &str,
    schema: &Schema,
    filter: &Filter,
    found: &mut Vec<Found>,
) -> Result<()> {
    use crate::projection::FACT_PARTITION;
    use futures::StreamExt;
    if !found.iter().any(|f| f.record.contains_key(FACT_PARTITION)) {
        return Ok(());
    }
    let from_rows = filter.returning.is_some();
    let reads = found.drain(..).map(|f| async move {
        let Some(fact_pk) = f.record.get(FACT_PARTITION).and_then(serde_json::Value::as_str) else {
            return Ok::<_, Error>(Some(f));
        };
        // `returning` fields the rows hold (checked by the caller): the row answers, unless
        // it lacks a filtered or a returned field (written before that index was added and
        // not yet refreshed by its backfill, or a field the record does not have: its fact
        // row says which).
        let holds_returned = |r: &Record| filter.returning.iter().flatten().all(|name| r.contains_key(name.as_str()));
        if from_rows && filter.matches(schema, &f.record) && holds_returned(&f.record) {
            return Ok(Some(f));
        }
        let row = store.get(table, fact_pk, &f.row_key).await?;
        let record = row.as_ref().and_then(record::from_entity).filter(|r| filter.matches(schema, r));
        Ok(record.map(|record| Found { record, row_key: f.row_key }))
    });
    let resolved: Vec<Option<Found>> = futures::stream::iter(reads).buffered(FACT_READS).try_collect().await?;
    *found = resolved.into_iter().flatten().collect();
    Ok(())
}

/// [`query_page`]'s read of the index partition, rows as they are.
async fn read_page(
    store: &dyn TableStore,
    table: &str,
    schema: &Schema,
    filter: &Filter,
    limit: usize,
    continuation: Option<&str>,
) -> Result<ResultPage> {
    let (index, pk) = filter.index_read(schema)?;
    let resume = continuation.map(decode_continuation).transpose()?;
    let ranges = filter.row_ranges();
    let limit = limit.max(1);
    let mut out = ResultPage { index, ..ResultPage::default() };
    for (n, range) in ranges.iter().enumerate() {
        if resume.as_deref().is_some_and(|rk| ends_at_or_before(range, rk)) {
            continue;
        }
        let range = RowRange { after: resume.clone(), ..range.clone() };
        let later_ranges = n + 1 < ranges.len();
        let want = (limit - out.records.len()).min(MAX_PAGE);
        let mut pages = pager::pages(store, table, &pk, &range, want);
        while let Some(page) = pages.try_next().await? {
            for e in &page.entities {
                if let Some(found) = live_match(schema, filter, e) {
                    out.records.push(found);
                    if out.records.len() == limit {
                        let more = later_ranges
                            || page.continuation.is_some()
                            || e.row_key != page.entities.last().map(|l| l.row_key.clone()).unwrap_or_default();
                        out.continuation = more.then(|| encode_continuation(&e.row_key));
                        return Ok(out);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Every matching record of the filter (all pages).
pub async fn query_all(store: &dyn TableStore, table: &str, schema: &Schema, filter: &Filter) -> Result<Vec<Found>> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = query_page(store, table, schema, filter, MAX_PAGE, token.as_deref()).await?;
        all.extend(page.records);
        match page.continuation {
            Some(next) => token = Some(next),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matching_is_case_insensitive_and_needs_every_field() {
        let r = json!({"icao": "KJFK", "iata": "JFK", "name": "x"}).as_object().cloned().unwrap();
        let s = Schema::new(vec!["icao".into(), "iata".into(), "lid".into()], "name").unwrap();
        let f =
            |pairs: &[(&str, &str)]| Filter::new(pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
        assert!(f(&[("icao", "kjfk")]).matches(&s, &r));
        assert!(f(&[("icao", "KJFK"), ("iata", "jfk")]).matches(&s, &r));
        assert!(!f(&[("icao", "KJFK"), ("iata", "LGA")]).matches(&s, &r));
        assert!(!f(&[("lid", "JFK")]).matches(&s, &r));
    }

    #[test]
    fn validation_names_the_field() {
        let s = Schema::new(vec!["icao".into(), "iata".into()], "name").unwrap();
        let err = Filter::new(vec![("city".into(), "x".into())]).validate(&s).unwrap_err().to_string();
        assert!(err.contains("'city' is not an index field"), "{err}");
        assert!(Filter::default().validate(&s).is_err());
        assert!(Filter::new(vec![("icao".into(), "".into())]).validate(&s).is_err());
        assert!(Filter::new(vec![("icao".into(), "x".repeat(600))]).validate(&s).is_err());
        assert!(decode_continuation("%%%").is_err());
    }
}
