//! Which index a filter reads: one partition of one index, chosen from the fields the filter
//! names (the other fields are checked on the records read, `crate::query`).
//!
//! **The rule, for a lookup** (and for validating a write's filter):
//! 1. An *active* composite index whose fields are exactly the filter's fields (as a set,
//!    compared case-sensitively like record fields; `country=US&subd=Texas` and
//!    `subd=Texas&country=US` both pick `country+subd`): its partition of the tuple holds
//!    exactly the matching records. The first such index in the order they were added.
//! 2. Else, when every field is a queryable single-field index (active, or backfilling with
//!    `allow_partial`): the first field's index, as before composite indexes.
//! 3. Else, with `allow_partial`, a backfilling composite index whose fields are exactly the
//!    filter's. Without it, a lookup that needs a backfilling composite index gets
//!    [`crate::Error::IndexNotReady`], as on a backfilling single-field index.
//!
//! A composite index serves only a filter that names exactly its fields: a filter naming
//! more fields or fewer uses the single-field rule (so `country=US` alone never reads
//! `country+subd`, whose partitions split a country over its subdivisions). Preferring an
//! active composite index over single-field indexes is what makes the Redmond-and-Smith
//! lookup one partition of exactly the answers instead of all of Redmond.
//!
//! **When a filter entry is applied** (delete, replace), with the schema as stored (the
//! states as they are, not as `Schema::with_dropping_maintained` rewrites them):
//! 1. an exact composite index only while it is *active* (complete);
//! 2. else the first field whose single-field index is active; else the first whose index
//!    is dropping (its rows stay exact until its job removes them); never a backfilling
//!    one; else, when every
//!    field is a maintained single-field index (a backfilling state can be this process's
//!    stale copy), the first field's;
//! 3. else an exact composite index that is dropping or backfilling: the filter could only
//!    have been validated through it while it was active (no single-field rule serves it),
//!    so it is complete (a backfilling state is this process's stale copy), and a dropping
//!    one is resolved through, as a dropping single-field index is.
//!
//! A dropping composite index is never read when single-field indexes serve the filter: an
//! entry validated after the drop, through them, may be applied after the drop's job
//! emptied the composite's partitions, and would find nothing there (found by the
//! simulator, seed 12, once it added and dropped `country+iata`; a lost acknowledged
//! delete). Test `composite_indexes::a_delete_by_a_dropped_composite_index_fields_reads_a_single_field_index`.
//! Nor is a backfilling single-field index read when a complete one serves: an entry
//! validated through `country+iata` while it was active, applied after its drop was logged
//! and `country` was added (still backfilling), read `country`'s incomplete partition and
//! lost the delete (simulator, seed 226); it reads `iata` instead. And an active field is
//! preferred to a dropping one: an entry validated through `country+iata` while it was
//! active can be logged just after the drop of `country`; applied once the composite was
//! dropping too, it read `country`'s partition, which the drop's job had already emptied,
//! and lost the delete (simulator, seed 2455). A dropping index is read only for an entry
//! that no active index serves: one validated through it, so logged before its drop, whose
//! job starts only after every earlier entry of shard 0 was applied.

use std::collections::BTreeSet;

use crate::composite;
use crate::error::{Error, Result};
use crate::query::Filter;
use crate::schema::{IndexState, Schema};

/// What a choice is for: the states of index that may serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A lookup, or validating a write's filter: active indexes (backfilling ones too with
    /// [`Filter::allow_partial`]).
    Lookup,
    /// Applying a filter entry, with the schema as stored (module docs): an active exact
    /// composite, else maintained or dropping single-field indexes, else a dropping or
    /// backfilling exact composite.
    Apply,
}

impl Filter {
    /// The field names of the filter, as a set.
    fn field_set(&self) -> BTreeSet<&str> {
        self.fields.iter().map(|(f, _)| f.as_str()).collect()
    }

    /// The first composite index of `schema` in a state `ok` accepts whose fields are exactly
    /// the filter's.
    fn exact_composite<'s>(&self, schema: &'s Schema, ok: impl Fn(IndexState) -> bool) -> Option<&'s str> {
        let set = self.field_set();
        schema
            .composites()
            .filter(|a| ok(a.state))
            .find(|a| composite::fields_of(&a.field).into_iter().collect::<BTreeSet<_>>() == set)
            .map(|a| a.field.as_str())
    }

    /// The index this filter reads under `schema` (module docs): a composite index's name or
    /// the first field. `None` when no index can serve it (see [`Filter::validate`] for why).
    pub(crate) fn choose_index(&self, schema: &Schema, purpose: Purpose) -> Option<String> {
        let (first, _) = self.fields.first()?;
        if self.fields.iter().any(|(f, _)| composite::is_composite(f)) {
            return None;
        }
        if let Some(c) = self.exact_composite(schema, |s| s == IndexState::Active) {
            return Some(c.to_string());
        }
        let single = |f: &str| match purpose {
            Purpose::Lookup => match schema.index_state(f) {
                Some(IndexState::Active) => true,
                Some(IndexState::Backfilling) => self.allow_partial,
                _ => false,
            },
            Purpose::Apply => schema.is_index(f) || schema.index_state(f) == Some(IndexState::Dropping),
        };
        if purpose == Purpose::Apply {
            // The first field whose index is complete: active, else dropping. A backfilling
            // one lacks older records' rows: an entry validated through a composite index
            // since dropped may be applied after another index on one of its fields was
            // added, and that index is still backfilling (simulator seed 226). A dropping one
            // is complete only while its job has not run, which holds for an entry logged
            // before the drop (validated through it); an entry logged after the drop was
            // validated through another index (an active composite one), and the drop's job
            // may have emptied the dropping index's partitions before it is applied: an
            // active index serves it then (simulator seed 2455: a lost acknowledged delete).
            let state = |f: &str| schema.index_state(f);
            for complete in [IndexState::Active, IndexState::Dropping] {
                if let Some((f, _)) = self.fields.iter().find(|(f, _)| state(f) == Some(complete)) {
                    return Some(f.clone());
                }
            }
        }
        if self.fields.iter().all(|(f, _)| single(f)) {
            return Some(first.clone());
        }
        let fallback = |s: IndexState| match purpose {
            Purpose::Lookup => self.allow_partial && s == IndexState::Backfilling,
            Purpose::Apply => s != IndexState::Active,
        };
        self.exact_composite(schema, fallback).map(str::to_string)
    }

    /// The PartitionKey of index `index` (as [`Filter::choose_index`] gave it) for the
    /// filter's values.
    pub(crate) fn partition_of(&self, schema: &Schema, index: &str) -> Result<String> {
        if composite::is_composite(index) {
            return schema
                .composite_partition_key(index, &self.fields)
                .unwrap_or_else(|| Err(Error::invalid(format!("filter: does not name every field of '{index}'"))));
        }
        let (_, value) = self
            .fields
            .iter()
            .find(|(f, _)| f == index)
            .ok_or_else(|| Error::invalid(format!("filter: does not name '{index}'")))?;
        schema.partition_key(index, value)
    }

    /// The index a lookup with this filter reads and its PartitionKey; the error
    /// [`Filter::validate`] gives when none can serve it.
    pub(crate) fn index_read(&self, schema: &Schema) -> Result<(String, String)> {
        let index = self.choose_index(schema, Purpose::Lookup).ok_or_else(|| self.unserved(schema))?;
        let pk = self.partition_of(schema, &index)?;
        Ok((index, pk))
    }

    /// The backfilling index that keeps this lookup from being served, if that is why: the
    /// exact composite index, else the first backfilling field.
    pub(crate) fn backfilling_index(&self, schema: &Schema) -> Option<String> {
        if let Some(c) = self.exact_composite(schema, |s| s == IndexState::Backfilling) {
            return Some(c.to_string());
        }
        self.fields.iter().map(|(f, _)| f).find(|f| schema.index_state(f) == Some(IndexState::Backfilling)).cloned()
    }

    /// Why no index serves this lookup: the first problem, naming the field or index.
    pub(crate) fn unserved(&self, schema: &Schema) -> Error {
        if self.fields.is_empty() {
            return Error::invalid(format!("filter: name at least one index field ({}) with a value", known(schema)));
        }
        if let Some((f, _)) = self.fields.iter().find(|(f, _)| composite::is_composite(f)) {
            let example: Vec<String> = composite::fields_of(f).iter().map(|c| format!("{c}=...")).collect();
            return Error::invalid(format!(
                "filter: '{f}' names a composite index; filter by its fields instead ({})",
                example.join("&")
            ));
        }
        if let Some(c) = self.exact_composite(schema, |s| s != IndexState::Active) {
            return match schema.index_state(c) {
                Some(IndexState::Backfilling) => not_ready(c),
                _ => Error::invalid(format!(
                    "filter: the index '{c}' is being dropped; active index fields are {}",
                    known(schema)
                )),
            };
        }
        for (field, _) in &self.fields {
            match schema.index_state(field) {
                Some(IndexState::Active) => {}
                Some(IndexState::Backfilling) if self.allow_partial => {}
                Some(IndexState::Backfilling) => return not_ready(field),
                Some(IndexState::Dropping) => {
                    return Error::invalid(format!(
                        "filter: the index '{field}' is being dropped; active index fields are {}",
                        known(schema)
                    ))
                }
                None => {
                    return Error::invalid(format!(
                        "filter: '{field}' is not an index field; index fields are {}",
                        known(schema)
                    ))
                }
            }
        }
        Error::invalid("filter: no index serves it")
    }
}

fn not_ready(index: &str) -> Error {
    Error::IndexNotReady(format!(
        "index '{index}' is backfilling: rows of records written before it was added are still being added, so a lookup could miss records; pass allow_partial=true (HTTP) or --allow-partial (table-catalog query) to read the rows it has"
    ))
}

/// The active indexes, for error messages: the single fields, then the composite indexes
/// with the rule that picks them.
fn known(schema: &Schema) -> String {
    let active = schema.active_keys();
    let (composites, singles): (Vec<&str>, Vec<&str>) = active.into_iter().partition(|k| composite::is_composite(k));
    if composites.is_empty() {
        return singles.join(", ");
    }
    format!(
        "{}; composite indexes (read by a filter naming exactly their fields) are {}",
        singles.join(", "),
        composites.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::AddedIndex;
    use serde_json::json;

    fn schema(added: &[(&str, IndexState)]) -> Schema {
        let added = added
            .iter()
            .enumerate()
            .map(|(i, (f, s))| AddedIndex {
                field: f.to_string(),
                state: *s,
                version: i as u64 + 1,
                job: None,
                projection: Default::default(),
            })
            .collect();
        Schema::new(vec!["icao".into(), "iata".into()], "name").unwrap().with_added(added, 9).unwrap()
    }

    fn filter(pairs: &[(&str, &str)]) -> Filter {
        Filter::new(pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn an_active_composite_serves_exactly_its_fields_in_any_order() {
        let s = schema(&[("country", IndexState::Active), ("country+subd", IndexState::Active)]);
        let both = filter(&[("subd", "Texas"), ("country", "US")]);
        assert_eq!(both.index_read(&s).unwrap(), ("country+subd".into(), "12_country+subd2_us5_texas".into()));
        assert_eq!(filter(&[("country", "US")]).index_read(&s).unwrap().0, "country");
        let more = filter(&[("country", "US"), ("subd", "Texas"), ("icao", "KXYZ")]);
        let err = more.validate(&s).unwrap_err().to_string();
        assert!(err.contains("'subd' is not an index field") && err.contains("country+subd"), "{err}");
        let r = json!({"icao": "KXYZ", "country": "us", "subd": "TEXAS", "name": "x"});
        assert!(both.matches(&s, r.as_object().unwrap()));
        assert!(both.validate(&s).is_ok());
    }

    #[test]
    fn a_backfilling_composite_needs_allow_partial_unless_single_indexes_serve() {
        let s = schema(&[("country+subd", IndexState::Backfilling)]);
        let f = filter(&[("country", "US"), ("subd", "Texas")]);
        match f.validate(&s) {
            Err(Error::IndexNotReady(m)) => assert!(m.contains("'country+subd' is backfilling"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.backfilling_index(&s).as_deref(), Some("country+subd"));
        assert_eq!(f.clone().allow_partial(true).index_read(&s).unwrap().0, "country+subd");
        assert_eq!(f.choose_index(&s, Purpose::Apply).as_deref(), Some("country+subd"));
        let with_singles = schema(&[
            ("country", IndexState::Active),
            ("subd", IndexState::Active),
            ("country+subd", IndexState::Backfilling),
        ]);
        assert_eq!(f.index_read(&with_singles).unwrap().0, "country", "active single indexes serve meanwhile");
        let dropping = schema(&[("country+subd", IndexState::Dropping)]);
        let err = f.validate(&dropping).unwrap_err().to_string();
        assert!(err.contains("'country+subd' is being dropped"), "{err}");
        assert_eq!(f.choose_index(&dropping, Purpose::Apply).as_deref(), Some("country+subd"), "only it serves");
    }

    #[test]
    fn an_applied_filter_reads_a_dropping_composite_only_when_single_indexes_cannot_serve() {
        let f = filter(&[("country", "US"), ("subd", "Texas")]);
        let dropping = schema(&[
            ("country", IndexState::Active),
            ("subd", IndexState::Active),
            ("country+subd", IndexState::Dropping),
        ]);
        assert_eq!(f.choose_index(&dropping, Purpose::Apply).as_deref(), Some("country"));
        let single_dropping = schema(&[
            ("country", IndexState::Dropping),
            ("subd", IndexState::Active),
            ("country+subd", IndexState::Active),
        ]);
        assert_eq!(f.choose_index(&single_dropping, Purpose::Apply).as_deref(), Some("country+subd"));
    }

    #[test]
    fn an_applied_filter_never_reads_a_backfilling_index_when_a_complete_one_serves() {
        // Simulator seed 226: validated through `country+iata` while active; applied after
        // its drop was logged and `country` was added, still backfilling.
        let f = filter(&[("country", "US"), ("iata", "AAA")]);
        let s = schema(&[("country+iata", IndexState::Dropping), ("country", IndexState::Backfilling)]);
        assert_eq!(f.choose_index(&s, Purpose::Apply).as_deref(), Some("iata"));
    }

    #[test]
    fn an_applied_filter_prefers_an_active_index_to_one_whose_drop_may_have_emptied_it() {
        // Simulator seed 2455: `country=US&iata=BBB` validated through `country+iata` while
        // active, logged just after the drop of `country`; applied once `country+iata` was
        // dropping too, it read `country`'s partition, which the drop's job had emptied.
        let f = filter(&[("country", "US"), ("iata", "BBB")]);
        let s = schema(&[("country", IndexState::Dropping), ("country+iata", IndexState::Dropping)]);
        assert_eq!(f.choose_index(&s, Purpose::Apply).as_deref(), Some("iata"));
        // Only a dropping index serves (an entry logged before its drop): it is read.
        let alone = filter(&[("country", "US")]);
        assert_eq!(alone.choose_index(&s, Purpose::Apply).as_deref(), Some("country"));
    }

    #[test]
    fn a_filter_cannot_name_a_composite_index_itself() {
        let s = schema(&[("country+subd", IndexState::Active)]);
        let err = filter(&[("country+subd", "x")]).validate(&s).unwrap_err().to_string();
        assert!(err.contains("names a composite index; filter by its fields instead (country=...&subd=...)"), "{err}");
    }
}
