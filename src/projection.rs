//! Index projections (issue 31, item 1): what an index's rows hold, chosen when the index is
//! added online (`table-catalog index add FIELD --projection keys`, `POST /api/indexes`
//! `{"field": .., "projection": ..}`) and stored with it in the schema.
//!
//! - [`Projection::All`] (the default, and the only projection before this): every row holds
//!   the whole record.
//! - [`Projection::Keys`]: a row holds the record's identity (the identity fields and the
//!   row-key field), the value of every index field the schema knows (so the keys of a
//!   projected payload are those of the record, and a filter on indexed fields matches it
//!   the same way), and the PartitionKey of the record's *fact row* (its owner row: the row
//!   in its first identity field's partition, which always holds the whole record).
//! - [`Projection::Include`]: `keys`, plus the listed fields.
//!
//! **Spelling** (CLI, HTTP body, stored schema, `index list`): `all`, `keys`,
//! `include:a,b` (1 to [`MAX_INCLUDED_FIELDS`] valid field names, none twice, compared
//! case-insensitively). An absent projection in a stored schema is `all`, so schemas
//! written before projections read unchanged.
//!
//! **Limits.** Identity fields are always `all`: the fact row is one of their rows, and
//! they are fixed at creation, so a catalog is created with `all` everywhere and projected
//! indexes are added online. Asking for another projection on an identity field is
//! [`crate::Error::Invalid`] (HTTP 400).
//!
//! `Schema::row_payload` builds a row's payload (fan-out and backfill); lookups follow
//! projected rows to their fact rows (`crate::query::query_page`). docs/ARCHITECTURE.md,
//! "Projections", has the design and what is not done yet.

use std::fmt;

use crate::error::{Error, Result};
use crate::record::validate_field_name;

/// At most this many fields in an `include:` projection.
pub const MAX_INCLUDED_FIELDS: usize = 32;

/// The field of a projected row's payload that holds its record's fact-row PartitionKey
/// (`_tc` prefixed, so no record field can take the name: `crate::record::validate_field_name`).
pub(crate) const FACT_PARTITION: &str = "_tcfact";

/// What an index's rows hold (see the module docs). Written and parsed as `all`, `keys` or
/// `include:a,b`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Projection {
    /// The whole record (the default).
    #[default]
    All,
    /// The record's identity, its indexed values and its fact row's PartitionKey.
    Keys,
    /// `Keys` and these fields (1 to [`MAX_INCLUDED_FIELDS`], in the order given).
    Include(Vec<String>),
}

impl Projection {
    /// Parses `all`, `keys` or `include:a,b` (surrounding spaces and spaces around the
    /// field names are ignored). Errors ([`Error::Invalid`]) name what is wrong and the
    /// limit: an unknown projection, an empty include list, an invalid field name, a field
    /// listed twice, more than [`MAX_INCLUDED_FIELDS`] fields.
    pub fn parse(text: &str) -> Result<Projection> {
        let text = text.trim();
        match text {
            "all" => return Ok(Projection::All),
            "keys" => return Ok(Projection::Keys),
            _ => {}
        }
        let Some(list) = text.strip_prefix("include:") else {
            return Err(Error::invalid(format!(
                "projection: '{}' is not a projection; use all, keys or include:FIELD,FIELD (at most {MAX_INCLUDED_FIELDS} fields)",
                text.escape_debug()
            )));
        };
        let fields: Vec<String> = list.split(',').map(|f| f.trim().to_string()).collect();
        if fields.iter().all(String::is_empty) {
            return Err(Error::invalid(format!(
                "projection: include: lists no field; name 1 to {MAX_INCLUDED_FIELDS} fields (include:FIELD,FIELD)"
            )));
        }
        if fields.len() > MAX_INCLUDED_FIELDS {
            return Err(Error::invalid(format!(
                "projection: include: lists {} fields; the limit is {MAX_INCLUDED_FIELDS}",
                fields.len()
            )));
        }
        for (i, f) in fields.iter().enumerate() {
            if f.is_empty() {
                return Err(Error::invalid(format!("projection: include: field {} is empty (a stray ',')", i + 1)));
            }
            validate_field_name(f).map_err(|e| Error::invalid(format!("projection: include: {e}")))?;
            if fields[..i].iter().any(|o| o.eq_ignore_ascii_case(f)) {
                return Err(Error::invalid(format!("projection: include: '{f}' is listed twice")));
            }
        }
        Ok(Projection::Include(fields))
    }

    /// True for [`Projection::All`]: rows hold the whole record.
    pub fn is_all(&self) -> bool {
        *self == Projection::All
    }
}

impl fmt::Display for Projection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Projection::All => f.write_str("all"),
            Projection::Keys => f.write_str("keys"),
            Projection::Include(list) => write!(f, "include:{}", list.join(",")),
        }
    }
}

impl From<Projection> for String {
    fn from(p: Projection) -> String {
        p.to_string()
    }
}

impl TryFrom<String> for Projection {
    type Error = Error;
    fn try_from(text: String) -> Result<Projection> {
        Projection::parse(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{AddedIndex, IndexState, Schema};
    use serde_json::{json, Value as Json};

    fn schema() -> Schema {
        let added = |field: &str, projection: Projection| AddedIndex {
            field: field.into(),
            state: IndexState::Active,
            version: 1,
            job: None,
            projection,
        };
        Schema::new(vec!["icao".into(), "iata".into()], "name")
            .unwrap()
            .with_added(vec![added("country", Projection::Keys), added("type+subd", Projection::All)], 2)
            .unwrap()
    }

    #[test]
    fn parses_and_writes_back_each_projection() {
        for text in ["all", "keys", "include:elevation", "include:elevation,lat,lon"] {
            let p = Projection::parse(text).unwrap();
            assert_eq!(p.to_string(), text);
            let stored = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Projection>(&stored).unwrap(), p);
        }
        assert_eq!(
            Projection::parse(" include: lat , lon ").unwrap(),
            Projection::Include(vec!["lat".into(), "lon".into()])
        );
        assert_eq!(Projection::default(), Projection::All);
    }

    #[test]
    fn bad_projections_name_the_field_and_the_limit() {
        let err = |t: &str| Projection::parse(t).unwrap_err().to_string();
        assert!(err("KEYS").contains("'KEYS' is not a projection"), "{}", err("KEYS"));
        assert!(err("some").contains("use all, keys or include:"));
        assert!(err("include:").contains("lists no field"));
        assert!(err("include:a,,b").contains("field 2 is empty"), "{}", err("include:a,,b"));
        assert!(err("include:a-b").contains("'a-b' is not a valid property name"), "{}", err("include:a-b"));
        assert!(err("include:_tcfact").contains("_tcfact"), "{}", err("include:_tcfact"));
        assert!(err("include:lat,LAT").contains("'LAT' is listed twice"));
        let many: Vec<String> = (0..=MAX_INCLUDED_FIELDS).map(|i| format!("f{i}")).collect();
        let e = err(&format!("include:{}", many.join(",")));
        assert!(e.contains("lists 33 fields; the limit is 32"), "{e}");
        assert!(serde_json::from_str::<Projection>("\"nope\"").is_err());
    }

    #[test]
    fn a_keys_row_holds_identity_indexed_values_and_the_fact_partition() {
        let s = schema();
        let r = json!({"icao": "KJFK", "iata": "JFK", "name": "JFK Intl", "country": "US", "subd": "NY",
            "type": "large", "elevation": 13, "wiki": "x".repeat(100)});
        let r = r.as_object().unwrap();
        let keys = s.project(&Projection::Keys, r, "4_icaokjfk");
        let expect = json!({"icao": "KJFK", "iata": "JFK", "name": "JFK Intl", "country": "US", "subd": "NY",
            "type": "large", "_tcfact": "4_icaokjfk"});
        assert_eq!(Json::Object(keys.clone()), expect);
        // The projected payload has the record's keys: fencing, moves and filters read them.
        let mut plain = keys.clone();
        plain.remove(FACT_PARTITION);
        assert_eq!(s.record_keys(&plain).unwrap(), s.record_keys(r).unwrap());
        let inc = s.project(&Projection::Include(vec!["elevation".into()]), r, "4_icaokjfk");
        assert_eq!(inc["elevation"], json!(13));
        assert!(!inc.contains_key("wiki"));
        assert_eq!(&s.project(&Projection::All, r, "4_icaokjfk"), r, "all: the record itself");
    }

    #[test]
    fn a_stored_index_without_a_projection_is_all() {
        let old: AddedIndex = serde_json::from_str(r#"{"field":"country","state":"active","version":1}"#).unwrap();
        assert_eq!(old.projection, Projection::All);
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("projection"), "all is not written, so older readers see the same row: {text}");
        let keys = AddedIndex { projection: Projection::Keys, ..old };
        let text = serde_json::to_string(&keys).unwrap();
        assert!(text.contains(r#""projection":"keys""#), "{text}");
        assert_eq!(serde_json::from_str::<AddedIndex>(&text).unwrap(), keys);
    }
}
