//! Composite indexes: one index over several fields, named by the fields joined with `+`
//! (`country+subd`), whose PartitionKey holds every component's value, so "the airports in
//! Texas, US" is one partition read (the index table pattern's composite keys).
//!
//! **Names.** 2 to [`MAX_COMPOSITE_FIELDS`] fields joined by [`COMPOSITE_SEPARATOR`], each a
//! valid field name ([`crate::record::validate_field_name`]: letters, digits and `_`, so a
//! field name never holds the separator and the split is unambiguous), no field twice
//! (compared case-insensitively, as keys are lowercased), at most
//! [`crate::record::MAX_NAME_CHARS`] characters in all. Order is significant for the key
//! (components are encoded in the name's order), not for lookups (a filter names a set of
//! fields), so `index add` refuses a second order of the same fields.
//!
//! **Values.** A record has a value for a composite index only when every component field
//! has a non-empty string, number or boolean value ([`crate::keys::key_string`]); a component
//! that is an object or an array rejects the record, as for a single-field index.
//!
//! **PartitionKey.** With `k_i` the key form of component `i` (its value lowercased, or for a
//! hashed field the hex HMAC, `crate::schema::Schema::key_value`) and `n_i` its length in
//! characters, the raw key is
//!
//! ```text
//! {N}_{name}{n_1}_{k_1}{n_2}_{k_2}...{n_m}_{k_m}     N = characters of the lowercased name
//! ```
//!
//! escaped like every key (`crate::keys::escape_key`): `(US, Texas)` on `country+subd` gives
//! `12_country+subd2_us5_texas`. It is the single-field scheme (`{n}_{field}{value}`, whose
//! length prefix needs no delimiter) applied twice: once to the index name, once to each
//! component.
//!
//! **Why no two value tuples collide.** Escaping is injective, so it is enough that the raw
//! key determines the tuple. Read `N`'s digits up to the first `_` and the next `N`
//! characters: the name, hence the component count `m`. Then, `m` times: digits up to the
//! next `_` give `n_i` (digits in a value cannot confuse this: the value starts only after
//! that `_`, and exactly `n_i` characters are taken), the next `n_i` characters are `k_i`.
//! Each step is forced, so two tuples with the same key have the same key forms component
//! by component: the same tuple under the index's case-insensitive equality. A
//! separator, `_`, digits, `%` or an empty-looking string inside a value is just
//! counted. No composite key equals a single-field key either: the `N` characters after
//! `N_` hold a `+` in a composite key and never in a single-field key (field names have
//! no `+`). Proved by the property tests below (`decode` is the parser above).
//!
//! **Limit.** The whole key is at most `crate::keys::MAX_KEY_UTF16` UTF-16 code units
//! (1 KiB), like every key: a record whose values make it longer is rejected, naming the
//! index and the limit.

use crate::error::{Error, Result};
use crate::keys::{self, KeyError};
use crate::record::{validate_field_name, MAX_NAME_CHARS};

/// Joins the fields of a composite index's name (`country+subd`).
pub const COMPOSITE_SEPARATOR: char = '+';

/// The most fields a composite index may have.
pub const MAX_COMPOSITE_FIELDS: usize = 4;

/// True when `index` names a composite index (holds [`COMPOSITE_SEPARATOR`]).
pub fn is_composite(index: &str) -> bool {
    index.contains(COMPOSITE_SEPARATOR)
}

/// The fields of index `index`: its components for a composite index, else the index itself.
pub fn fields_of(index: &str) -> Vec<&str> {
    index.split(COMPOSITE_SEPARATOR).collect()
}

/// Checks an index name: a valid field name, or a composite name (module docs). Errors
/// ([`Error::Invalid`]) name the index, the component at fault and the limit.
pub fn validate_index_name(index: &str) -> Result<()> {
    if !is_composite(index) {
        return validate_field_name(index);
    }
    let fields = fields_of(index);
    if fields.len() > MAX_COMPOSITE_FIELDS {
        return Err(Error::invalid(format!(
            "composite index '{index}' has {} fields; the limit is {MAX_COMPOSITE_FIELDS}",
            fields.len()
        )));
    }
    for (i, f) in fields.iter().enumerate() {
        if f.is_empty() {
            return Err(Error::invalid(format!(
                "composite index '{index}': field {} of {} is empty; name 2 to {MAX_COMPOSITE_FIELDS} fields joined by '{COMPOSITE_SEPARATOR}'",
                i + 1,
                fields.len()
            )));
        }
        validate_field_name(f).map_err(|e| Error::invalid(format!("composite index '{index}': {e}")))?;
        if let Some(first) = fields[..i].iter().find(|o| o.eq_ignore_ascii_case(f)) {
            return Err(Error::invalid(format!(
                "composite index '{index}': field '{f}' is listed twice (as '{first}'; names are compared case-insensitively)"
            )));
        }
    }
    if index.chars().count() > MAX_NAME_CHARS {
        return Err(Error::invalid(format!(
            "composite index '{index}' is {} characters long; the limit is {MAX_NAME_CHARS}",
            index.chars().count()
        )));
    }
    Ok(())
}

/// The PartitionKey of composite index `index` for the key forms `key_values` of its
/// components, in the order of the name (module docs). Errors when the key is over
/// `MAX_KEY_UTF16` UTF-16 code units.
pub(crate) fn partition_key<'a>(
    index: &str,
    key_values: impl IntoIterator<Item = &'a str>,
) -> std::result::Result<String, KeyError> {
    let name = index.to_lowercase();
    let mut raw = format!("{}_{name}", name.chars().count());
    for value in key_values {
        let value = value.to_lowercase();
        raw.push_str(&format!("{}_{value}", value.chars().count()));
    }
    keys::check_len("PartitionKey", index, keys::escape_key(&raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    /// The parser of the module docs: the index name and the component key forms of a
    /// composite PartitionKey, `None` for a key of another shape.
    fn decode(pk: &str) -> Option<(String, Vec<String>)> {
        let raw = keys::unescape_key(pk)?;
        let mut rest: &str = &raw;
        fn counted(rest: &mut &str) -> Option<String> {
            let (n, tail) = rest.split_once('_')?;
            let n: usize = n.parse().ok()?;
            let taken: String = tail.chars().take(n).collect();
            (taken.chars().count() == n).then_some(())?;
            *rest = &tail[taken.len()..];
            Some(taken)
        }
        let name = counted(&mut rest)?;
        let m = fields_of(&name).len();
        let values = (0..m).map(|_| counted(&mut rest)).collect::<Option<Vec<_>>>()?;
        (rest.is_empty() && is_composite(&name)).then_some((name, values))
    }

    #[test]
    fn keys_read_as_documented() {
        assert_eq!(partition_key("country+subd", ["US", "Texas"]).unwrap(), "12_country+subd2_us5_texas");
        // A value holding the separator, '_', digits, '%' and a forbidden character.
        let pk = partition_key("a+b", ["1_x+", "50%/"]).unwrap();
        assert_eq!(pk, "3_a+b4_1_x+4_50%25%2F");
        assert_eq!(decode(&pk), Some(("a+b".into(), vec!["1_x+".into(), "50%/".into()])));
        assert_eq!(decode("3_eidf314"), None, "a single-field key is not a composite key");
    }

    #[test]
    fn names_are_checked_naming_the_field_and_the_limit() {
        let err = |n: &str| validate_index_name(n).unwrap_err().to_string();
        assert!(validate_index_name("country+subd").is_ok());
        assert!(validate_index_name("country").is_ok());
        assert!(err("a+a").contains("field 'a' is listed twice"), "{}", err("a+a"));
        assert!(err("a+A").contains("listed twice"), "{}", err("a+A"));
        assert!(err("a+").contains("field 2 of 2 is empty"), "{}", err("a+"));
        assert!(err("+a").contains("field 1 of 2 is empty"), "{}", err("+a"));
        assert!(err("a+b-c").contains("'b-c' is not a valid property name"), "{}", err("a+b-c"));
        assert!(err("a+b+c+d+e").contains("has 5 fields; the limit is 4"), "{}", err("a+b+c+d+e"));
        let long = format!("{}+b", "a".repeat(255));
        assert!(err(&long).contains("the limit is 255"), "{}", err(&long));
        assert!(err("a-b").contains("not a valid property name"));
    }

    #[test]
    fn over_long_keys_name_the_index() {
        let err = partition_key("a+b", ["x", &"y".repeat(600)]).unwrap_err().to_string();
        assert!(err.contains("field 'a+b'") && err.contains("the limit is 512"), "{err}");
    }

    /// Values over characters that matter to the scheme: the separator, `_`, digits, `%` and
    /// the characters escaping rewrites, case, multi-unit and context-lowercased ones.
    fn value() -> impl Strategy<Value = String> {
        let chars = vec![
            '+', '_', '0', '1', '2', '9', '%', '/', '#', '?', '\\', '\u{0}', '\u{1f}', '\u{85}', ':', ' ', 'a', 'A',
            'b', 'é', 'É', 'Σ', 'σ', 'ς', 'İ', 'ß', '😀', '\u{e000}',
        ];
        prop::collection::vec(prop::sample::select(chars), 0..7).prop_map(|cs| cs.into_iter().collect())
    }

    fn name() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a+b", "country+subd", "A+b+c", "x1+y_2+z+w"]).prop_map(String::from)
    }

    fn tuple(name: &str) -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(value(), fields_of(name).len())
    }

    fn key(name: &str, values: &[String]) -> String {
        partition_key(name, values.iter().map(String::as_str)).expect("short key")
    }

    fn lowered(values: &[String]) -> Vec<String> {
        values.iter().map(|v| v.to_lowercase()).collect()
    }

    /// The characters of `joined` cut into `m` parts at the points `cuts` picks: a tuple with
    /// the same characters as another, differently split (what a plain concatenation, or a
    /// separator that values may hold, would confuse).
    fn resplit(joined: &str, m: usize, cuts: &[usize]) -> Vec<String> {
        let chars: Vec<char> = joined.chars().collect();
        let mut points: Vec<usize> = cuts.iter().take(m - 1).map(|c| c % (chars.len() + 1)).collect();
        points.sort_unstable();
        let mut parts = Vec::with_capacity(m);
        let mut start = 0;
        for p in points {
            parts.push(chars[start..p].iter().collect());
            start = p;
        }
        parts.push(chars[start..].iter().collect());
        parts
    }

    /// Short values over the characters a split could hide in.
    fn tricky_tuple(name: &str) -> impl Strategy<Value = Vec<String>> {
        let chars = vec!['+', '+', '_', '1', '2', 'a', 'A', '%', '/', 'é'];
        let value = prop::collection::vec(prop::sample::select(chars), 0..5).prop_map(|cs| cs.into_iter().collect());
        prop::collection::vec(value, fields_of(name).len())
    }

    proptest! {
        #![proptest_config(Config { cases: 4000, rng_seed: RngSeed::Fixed(0xC04D_0517), failure_persistence: None, ..Config::default() })]

        /// Tuples made of the same characters split differently (joined with nothing, the
        /// separator, `_` or a length-like `1_`) share a key only when equal once lowercased.
        #[test]
        fn resplit_tuples_never_share_a_partition_key(
            (name, a) in name().prop_flat_map(|n| (Just(n.clone()), tricky_tuple(&n))),
            glue in prop::sample::select(vec!["", "+", "_", "1_"]),
            cuts in prop::collection::vec(any::<usize>(), 3),
        ) {
            let b = resplit(&a.join(glue), a.len(), &cuts);
            let (ka, kb) = (key(&name, &a), key(&name, &b));
            prop_assert_eq!(ka == kb, lowered(&a) == lowered(&b), "{:?} {:?} -> {} {}", a, b, ka, kb);
        }

        /// Two value tuples of one index share a PartitionKey exactly when they are equal
        /// component by component once lowercased (the index's equality).
        #[test]
        fn no_two_tuples_share_a_partition_key(
            (name, a, b) in name().prop_flat_map(|n| (Just(n.clone()), tuple(&n), tuple(&n))),
        ) {
            let (ka, kb) = (key(&name, &a), key(&name, &b));
            prop_assert_eq!(ka == kb, lowered(&a) == lowered(&b), "{:?} {:?} -> {} {}", a, b, ka, kb);
        }

        /// The key parses back to the index and the lowered tuple (so the map is injective),
        /// is a legal key, and never equals a single-field key or another index's key.
        #[test]
        fn a_key_determines_its_index_and_tuple(
            (name, values) in name().prop_flat_map(|n| (Just(n.clone()), tuple(&n))),
            other in name(),
            single in value(),
        ) {
            let pk = key(&name, &values);
            prop_assert!(!pk.chars().any(keys::is_forbidden_key_char), "{}", pk);
            prop_assert_eq!(decode(&pk), Some((name.to_lowercase(), lowered(&values))));
            prop_assert_ne!(&pk, &keys::partition_key("a", &single).expect("short key"));
            prop_assert_ne!(&pk, &keys::partition_key("ab", &single).expect("short key"));
            if other != name {
                let padded: Vec<String> = fields_of(&other).iter().enumerate().map(|(i, _)| values.get(i).cloned().unwrap_or_default()).collect();
                prop_assert_ne!(&pk, &key(&other, &padded));
            }
        }
    }
}
