//! Key encoding: how an identifier becomes a PartitionKey and a record a RowKey.
//!
//! From the product description (az-table-catalog README, "Key Encoding" and "Technical
//! Specification"):
//! - PartitionKey = `{n}_{field}{value}` with field and value lowercased and `n` the length in
//!   characters of the lowercased field name: `("eid", "F314")` gives `3_eidf314`. The length
//!   prefix makes the encoding collision-free without a delimiter: `("a", "b:c")` gives
//!   `1_ab:c` and `("a:b", "c")` gives `3_a:bc`.
//! - RowKey = lowercase of `{sortvalue}:{fp}` where `fp` is the first 8 hex digits of the MD5
//!   of the lowercased string forms of the indexed values, taken in alphabetical order of the
//!   index field names and joined by `|`.
//!
//! Two rules of our own, because Azure forbids some characters in keys ("Understanding the
//! Table service data model": `/ \ # ?`, U+0000-U+001F, U+007F-U+009F):
//! - those characters and `%` itself are written as `%XX` (each UTF-8 byte, uppercase hex),
//!   so the encoding stays injective and the result is always a legal key;
//! - an encoded key longer than [`MAX_KEY_UTF16`] UTF-16 code units (1 KiB) is rejected with
//!   [`KeyError::TooLong`] before any I/O.
//!
//! The fingerprint is computed over the raw (unescaped) lowercased values, so it equals the
//! Python reference's for the same record.

use md5::{Digest, Md5};

pub use crate::store::key_rules::{cmp_utf16, is_forbidden_key_char, MAX_KEY_UTF16};
use crate::store::RowRange;

/// Why a key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The encoded key is over `MAX_KEY_UTF16` UTF-16 code units.
    #[error(
        "{what} for field '{field}' is {len} UTF-16 code units once encoded; the limit is {MAX_KEY_UTF16} (1 KiB)"
    )]
    TooLong {
        /// "PartitionKey" or "RowKey".
        what: &'static str,
        /// The field whose value made the key.
        field: String,
        /// Encoded length in UTF-16 code units.
        len: usize,
    },
}

/// Writes forbidden characters and `%` as `%XX` (one per UTF-8 byte, uppercase hex).
/// Everything else is kept as is. Injective: `%` never stands for itself in the output.
pub fn escape_key(raw: &str) -> String {
    if !raw.chars().any(|c| c == '%' || is_forbidden_key_char(c)) {
        return raw.to_string();
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for c in raw.chars() {
        if c == '%' || is_forbidden_key_char(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Inverse of [`escape_key`]; `None` if `encoded` is not an output of it.
pub fn unescape_key(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = encoded.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(crate) fn check_len(what: &'static str, field: &str, key: String) -> Result<String, KeyError> {
    let len = key.encode_utf16().count();
    if len > MAX_KEY_UTF16 {
        return Err(KeyError::TooLong { what, field: field.to_string(), len });
    }
    Ok(key)
}

/// The PartitionKey of index `field` holding `value`: `escape(lower("{n}_{field}{value}"))`.
///
/// ```
/// assert_eq!(table_catalog::testing::keys::partition_key("eid", "F314").unwrap(), "3_eidf314");
/// assert_eq!(table_catalog::testing::keys::partition_key("a", "b:c").unwrap(), "1_ab:c");
/// assert_eq!(table_catalog::testing::keys::partition_key("a:b", "c").unwrap(), "3_a:bc");
/// ```
pub fn partition_key(field: &str, value: &str) -> Result<String, KeyError> {
    // Field and value are lowercased as one string, as the reference does, so context-
    // dependent lowercasing (a word-final 'Σ' becomes 'ς') gives the reference's result.
    let n = field.to_lowercase().chars().count();
    let raw = format!("{n}_{}", format!("{field}{value}").to_lowercase());
    check_len("PartitionKey", field, escape_key(&raw))
}

/// The (lowercased) index field a PartitionKey built by [`partition_key`] belongs to: the
/// `{n}_` prefix gives its length in characters. `None` for a key of another shape.
///
/// ```
/// assert_eq!(table_catalog::testing::keys::partition_field("3_eidf314").as_deref(), Some("eid"));
/// assert_eq!(table_catalog::testing::keys::partition_field("metadata"), None);
/// ```
pub fn partition_field(pk: &str) -> Option<String> {
    let (n, rest) = pk.split_once('_')?;
    let n: usize = n.parse().ok()?;
    let field: String = rest.chars().take(n).collect();
    (field.chars().count() == n && n > 0).then_some(field)
}

/// First 8 hex digits of MD5 over the lowercased index values joined by `|`. `values` must
/// be in alphabetical order of their field names (see [`crate::schema::Schema`]); a missing
/// value contributes the empty string.
pub fn fingerprint<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let joined = values.into_iter().map(str::to_lowercase).collect::<Vec<_>>().join("|");
    let digest = Md5::digest(joined.as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// The RowKey of a record: `escape(lower("{sort_value}:{fingerprint}"))`.
/// `field` names the row-key field for the error message.
pub fn row_key(field: &str, sort_value: &str, fingerprint: &str) -> Result<String, KeyError> {
    check_len("RowKey", field, escape_key(&format!("{sort_value}:{fingerprint}").to_lowercase()))
}

/// Inclusive lower RowKey bound for records whose sort value is at least `from`:
/// `RowKey ge '{from}'`. Every RowKey starts with its sort value, so none with a sort value
/// at least `from` is below it; the few extra rows it lets in (a sort value that is a prefix
/// of `from`) are removed by [`sort_value_in_range`]. (The reference uses `'{from}:'`, which
/// misses sort values extending `from` with a character sorting before `:`, such as a space:
/// `row_from=john` would miss "john f kennedy".)
///
/// Tightness: a RowKey at or above the bound whose sort value is below `from` has a sort value
/// that is a proper prefix of `from` (anything else differs from `from` at a smaller
/// character, so its RowKey is below the bound too); there are at most as many such sort
/// values as `from` has characters.
pub fn row_from_bound(from: &str) -> String {
    // Greek sigma lowercases to 'ς' or 'σ' depending on what follows it, so the same sort
    // value can appear with either in a RowKey; the lower bound takes the smaller ('ς').
    escape_key(&from.to_lowercase().replace('σ', "ς"))
}

/// The sort value `to` as it appears at the start of RowKeys (the larger sigma, 'σ').
fn sort_to(to: &str) -> String {
    escape_key(&to.to_lowercase().replace('ς', "σ"))
}

/// Exclusive upper RowKey bound (`RowKey lt`) covering every RowKey whose sort value is
/// non-empty and at most `to`. The empty sort value needs the extra range [`row_ranges`]
/// adds, and [`row_ranges`] also tightens the bound when there is a lower one. The extra
/// rows the bound admits are removed by [`sort_value_in_range`].
///
/// `to = "1000"` gives `1;`: sort values "1".."1999…" and those starting with "0" are read,
/// not those starting with "2".."9". See [`row_ranges`] for the rule and its proof.
pub fn row_before_bound(to: &str) -> String {
    upper_bound(&sort_to(to), "")
}

/// `t[..i] + ";"` where `i` is the first index `>= 1` with `t[i] <= ':'` whose prefix
/// `t[..i]` is at least `lower` (`t.len()` if none); see [`row_ranges`].
fn upper_bound(t: &str, lower: &str) -> String {
    let cut = t
        .char_indices()
        .skip(1)
        .find(|&(i, c)| c <= ':' && cmp_utf16(&t[..i], lower).is_ge())
        .map_or(t.len(), |(i, _)| i);
    format!("{};", &t[..cut])
}

/// Smallest RowKey of a record with an empty sort value (`:` and 8 hex digits).
pub const EMPTY_SORT_FIRST: &str = ":00000000";
/// Largest RowKey of a record with an empty sort value.
pub const EMPTY_SORT_LAST: &str = ":ffffffff";

/// The RowKey ranges to read for sort values within `from..=to` (either open when `None`),
/// ascending and disjoint: none when nothing can match, else one or two. They may hold
/// rows outside `from..=to`: check each row with [`sort_value_in_range`].
///
/// Let `f = row_from_bound(from)` (`""` without `from`) and `t` = `to` as it appears in
/// RowKeys (lowercased, escaped). A sort value `s` is in range when `f <= s <= t`, comparing
/// UTF-16 code units as the service does; its RowKey is `s + ":" + fp` (8 hex digits).
/// Indexes below count characters. A character `<= ';'` is a single ASCII code unit and
/// sorts below every other code unit, so comparing a string holding one with another
/// string is decided by characters.
///
/// 1. The main range is `[f, t[..i] + ";")`, `i` = the first index `>= 1` with
///    `t[i] <= ':'` and `t[..i] >= f`, or `t.len()` if none. Take `s` in range, `s`
///    non-empty:
///    - `s` differs from `t` at an index `j < i`, `s[j] < t[j]`: the RowKey is below the
///      bound at `j`.
///    - else `s` starts with `t[..min(i, len s)]`. If `len s > i`, the RowKey has `s[i] <=
///      t[i] <= ':'` at `i`, below the bound's `;`. If `len s == i`, it has `:` there,
///      below `;`. If `len s < i`, `s = t[..len s]` is a proper prefix of `t` with
///      `1 <= len s < i` and `s >= f`, so by the choice of `i`, `t[len s] > ':'`, while
///      the RowKey has `:` at `len s`: below.
///
///    And the RowKey is at least `f` since `s` is. Cutting at index 0 (as before issue 10)
///    turned `to = "1000"` into `RowKey lt ';'`, a walk over every sort value starting
///    with a digit, space or punctuation. Cutting later than needed is what `t[..i] >= f`
///    buys: `"42"..="420"` gives `[42, 42;)`, not `[42, 4;)`.
/// 2. The empty sort value (`f` empty) escapes step 1: its RowKey `:fp` is above a bound
///    whose first character is below `:`. When the main range does not end above
///    `:ffffffff`, a second range `[max(end of the first, ":00000000"), ":ffffffff"]` holds
///    its RowKeys. With `t` empty only the empty sort value can match, so only this range
///    is read.
///
/// Tightness: the main range's end starts with `t[0]`, so no sort value starting with a
/// larger character is read (except sort values starting with `:` that fall in the second
/// range); below `f` it admits only proper prefixes of `f`.
pub fn row_ranges(from: Option<&str>, to: Option<&str>) -> Vec<RowRange> {
    let lower = from.map(row_from_bound);
    let f = lower.as_deref().unwrap_or("");
    let Some(to) = to else {
        return vec![RowRange { from: lower, ..RowRange::default() }];
    };
    let t = sort_to(to);
    if cmp_utf16(&t, f).is_lt() {
        return Vec::new();
    }
    let empty_range = |start: &str| RowRange {
        from: Some(max_utf16(start, EMPTY_SORT_FIRST).to_string()),
        to: Some(EMPTY_SORT_LAST.to_string()),
        ..RowRange::default()
    };
    if t.is_empty() {
        return vec![empty_range("")];
    }
    let before = upper_bound(&t, f);
    let needs_empty = f.is_empty() && cmp_utf16(&before, EMPTY_SORT_LAST).is_le();
    let mut ranges = vec![RowRange { from: lower, before: Some(before.clone()), ..RowRange::default() }];
    if needs_empty {
        ranges.push(empty_range(&before));
    }
    ranges
}

fn max_utf16<'a>(a: &'a str, b: &'a str) -> &'a str {
    if cmp_utf16(a, b).is_ge() {
        a
    } else {
        b
    }
}

/// The sort value part of a RowKey (without the trailing `:` and 8-hex fingerprint).
pub fn sort_part(row_key: &str) -> &str {
    let n = row_key.len();
    if n >= 9 && row_key.is_char_boundary(n - 9) && row_key[n - 9..].starts_with(':') {
        &row_key[..n - 9]
    } else {
        row_key
    }
}

/// True when the sort value of `row_key` lies within `from..=to` (lowercased, compared in
/// UTF-16 code-unit order like the service).
pub fn sort_value_in_range(row_key: &str, from: Option<&str>, to: Option<&str>) -> bool {
    let s = sort_part(row_key);
    from.is_none_or(|f| cmp_utf16(s, &row_from_bound(f)).is_ge())
        && to.is_none_or(|t| cmp_utf16(s, &sort_to(t)).is_le())
}

/// The string form of a JSON value used in keys, matching Python's `str()` as the reference
/// applies it: strings as is, `True`/`False`, integers in decimal, floats as Python's
/// `repr` (`1e+20`, `0.0001`, `100.0`). `null` is a missing value (`None`). Arrays and objects
/// use their compact JSON text (the reference would use Python's dict syntax; such values
/// make poor identifiers anyway).
pub fn key_string(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value as J;
    match value {
        J::Null => None,
        J::String(s) => Some(s.clone()),
        J::Bool(true) => Some("True".into()),
        J::Bool(false) => Some("False".into()),
        J::Number(n) => Some(match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => python_float_repr(f),
            _ => n.to_string(),
        }),
        other => Some(other.to_string()),
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional notation when the
/// decimal exponent is in -4..16, scientific otherwise (`1e+16`, `1.5e-07`).
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` prints the shortest round-trip digits, e.g. "1.5e-7", "-1e20".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let frac = &digits[1..];
        let mant = if frac.is_empty() { digits[..1].to_string() } else { format!("{}.{frac}", &digits[..1]) };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_description_examples() {
        assert_eq!(partition_key("eid", "F314").unwrap(), "3_eidf314");
        assert_eq!(partition_key("ssn", "123-45-6789").unwrap(), "3_ssn123-45-6789");
        assert_eq!(partition_key("a", "b:c").unwrap(), "1_ab:c");
        assert_eq!(partition_key("a:b", "c").unwrap(), "3_a:bc");
        assert_ne!(partition_key("a", "b:c").unwrap(), partition_key("a:b", "c").unwrap());
    }

    #[test]
    fn length_prefix_counts_characters_of_the_lowercased_field() {
        assert_eq!(partition_key("ÉID", "x").unwrap(), "3_éidx");
    }

    #[test]
    fn forbidden_characters_and_percent_are_escaped() {
        assert_eq!(escape_key("a/b\\c#d?e"), "a%2Fb%5Cc%23d%3Fe");
        assert_eq!(escape_key("100%"), "100%25");
        assert_eq!(escape_key("tab\there"), "tab%09here");
        assert_eq!(escape_key("\u{85}"), "%C2%85");
        assert_eq!(escape_key("it's é 😀 a+b"), "it's é 😀 a+b");
        for s in ["a/b", "100%", "%2F", "x\u{0}y\u{9f}", "é/😀", ""] {
            let e = escape_key(s);
            assert!(!e.chars().any(is_forbidden_key_char), "{e:?}");
            assert_eq!(unescape_key(&e).as_deref(), Some(s));
        }
        // Injective: a literal "%2F" and a "/" encode differently.
        assert_ne!(escape_key("%2F"), escape_key("/"));
    }

    #[test]
    fn key_length_limit_is_512_utf16_units_after_encoding() {
        // "3_eid" is 5 units.
        assert!(partition_key("eid", &"x".repeat(507)).is_ok());
        let err = partition_key("eid", &"x".repeat(508)).unwrap_err();
        assert_eq!(err, KeyError::TooLong { what: "PartitionKey", field: "eid".into(), len: 513 });
        // Each emoji is two UTF-16 units; each '/' becomes three characters.
        assert!(partition_key("eid", &"😀".repeat(253)).is_ok());
        assert!(partition_key("eid", &"😀".repeat(254)).is_err());
        assert!(partition_key("eid", &"/".repeat(169)).is_ok());
        assert!(partition_key("eid", &"/".repeat(170)).is_err());
        assert!(row_key("name", &"n".repeat(503), "ec8246f2").is_ok());
        assert!(row_key("name", &"n".repeat(504), "ec8246f2").is_err());
    }

    #[test]
    fn fingerprint_is_md5_prefix_of_sorted_lowercased_values() {
        // md5("f314|1414213562|123-45-6789") = 56a9e4594f09645a7123f8d5b534d238, computed
        // independently (`printf '%s' 'f314|1414213562|123-45-6789' | md5sum`); the input is
        // mixed-case, so the test also fails if the values are not lowercased.
        assert_eq!(fingerprint(["F314", "1414213562", "123-45-6789"]), "56a9e459");
        assert_eq!(fingerprint([""]), "d41d8cd9"); // md5("")
        assert_eq!(row_key("last", "Faux", "EC8246F2").unwrap(), "faux:ec8246f2");
    }

    #[test]
    fn range_bounds_follow_the_reference() {
        assert_eq!(row_from_bound("Faux"), "faux");
        assert_eq!(row_before_bound("Faux"), "faux;");
        assert_eq!(row_before_bound("Runway 1"), "runway;");
        let rk = row_key("last", "faux", "ec8246f2").unwrap();
        assert!(rk.as_str() >= row_from_bound("faux").as_str() && rk < row_before_bound("faux"));
        // Sort values sharing a prefix with a bound, next character before ':' (space, digit).
        let names = ["Runway", "Runway 1", "Runway 10", "Runway 1 North", "Runway 2"];
        let rks: Vec<String> = names.iter().map(|n| row_key("name", n, "0123abcd").unwrap()).collect();
        let select = |from: Option<&str>, to: Option<&str>| -> Vec<&str> {
            let range = crate::store::RowRange {
                from: from.map(row_from_bound),
                before: to.map(row_before_bound),
                ..Default::default()
            };
            names
                .iter()
                .zip(&rks)
                .filter(|(_, rk)| range.contains(rk) && sort_value_in_range(rk, from, to))
                .map(|(n, _)| *n)
                .collect()
        };
        assert_eq!(select(None, Some("Runway 1")), ["Runway", "Runway 1"]);
        assert_eq!(select(Some("Runway 1!"), None), ["Runway 10", "Runway 2"]);
        assert_eq!(select(Some("runway 1"), Some("RUNWAY 10")), ["Runway 1", "Runway 10", "Runway 1 North"]);
        assert_eq!(sort_part("faux:ec8246f2"), "faux");
    }

    #[test]
    fn upper_bound_keeps_the_first_character() {
        // Cut after the first character when the next sorts at or before ':'.
        assert_eq!(row_before_bound("1000"), "1;");
        assert_eq!(row_before_bound("12:30"), "1;");
        assert_eq!(row_before_bound("a:b"), "a;");
        assert_eq!(row_before_bound(" x"), " x;");
        assert_eq!(row_before_bound("a/b"), "a;"); // escaped "a%2Fb": '%' sorts before ':'
        assert_eq!(row_before_bound("é1"), "é;");
        assert_eq!(row_before_bound(""), ";");
        let digits = row_ranges(None, Some("1000"));
        let main = RowRange { before: Some("1;".into()), ..RowRange::default() };
        let empty =
            RowRange { from: Some(EMPTY_SORT_FIRST.into()), to: Some(EMPTY_SORT_LAST.into()), ..RowRange::default() };
        assert_eq!(digits, [main, empty.clone()], "the empty sort value needs its own range");
        assert_eq!(row_ranges(Some("0"), Some("1000")).len(), 1, "no empty sort value above a lower bound");
        assert_eq!(row_ranges(None, Some("faux")).len(), 1, "'faux;' already holds ':…'");
        assert_eq!(row_ranges(None, Some("")), [empty]);
        assert!(row_ranges(Some("a"), Some("")).is_empty());
        assert!(row_ranges(Some("b"), Some("a")).is_empty());
        // With a lower bound, the cut need not cover prefixes below it.
        assert_eq!(row_ranges(Some("42"), Some("420"))[0].before.as_deref(), Some("42;"));
        assert_eq!(row_ranges(Some("5"), Some("5001"))[0].before.as_deref(), Some("5;"));
        // A bound starting with ':' ends inside the empty sort value's keys: the second range
        // starts where the first ends, so no RowKey is read twice.
        let colon = row_ranges(None, Some(":a"));
        assert_eq!(colon[0].before.as_deref(), Some(":a;"));
        assert_eq!(colon[1].from.as_deref(), Some(":a;"));
    }

    mod ranges {
        use super::super::*;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed};
        use std::cmp::Ordering;

        const SEED: u64 = 0x7AB1_ECA7;
        static PRINT_SEED: std::sync::Once = std::sync::Once::new();

        fn cmp16(a: &str, b: &str) -> Ordering {
            a.encode_utf16().cmp(b.encode_utf16())
        }

        /// `RowRange::contains` in the service's (UTF-16) order.
        fn contains16(r: &RowRange, rk: &str) -> bool {
            r.from.as_deref().is_none_or(|f| cmp16(rk, f).is_ge())
                && r.after.as_deref().is_none_or(|a| cmp16(rk, a).is_gt())
                && r.before.as_deref().is_none_or(|b| cmp16(rk, b).is_lt())
                && r.to.as_deref().is_none_or(|t| cmp16(rk, t).is_le())
        }

        /// Sort values over characters around ':' and ';', escapes, case, sigma, multi-unit.
        fn sort_value() -> impl Strategy<Value = String> {
            let chars = vec![
                '0', '1', '9', ':', ';', ' ', '!', '%', '/', '#', '\t', 'a', 'A', 'f', 'g', 'z', '~', 'é', 'Σ', 'σ',
                'ς', '😀', '\u{e000}', '\u{ff5e}',
            ];
            prop::collection::vec(prop::sample::select(chars), 0..6).prop_map(|cs| cs.into_iter().collect())
        }

        fn fingerprint_hex() -> impl Strategy<Value = String> {
            prop::sample::select(vec!["00000000", "0123abcd", "99999999", "a0000000", "ffffffff"])
                .prop_map(String::from)
        }

        proptest! {
            #![proptest_config(Config { cases: 4000, rng_seed: RngSeed::Fixed(SEED), failure_persistence: None, ..Config::default() })]

            /// Every RowKey whose sort value is within `from..=to` is inside one of the
            /// ranges; the ranges are ascending and disjoint; and a row read outside the
            /// bounds is one of the few the bounds must admit.
            #[test]
            fn ranges_cover_the_sort_range_and_stay_tight(
                sorts in prop::collection::vec((sort_value(), fingerprint_hex()), 1..12),
                from in prop::option::of(sort_value()),
                to in prop::option::of(sort_value()),
            ) {
                PRINT_SEED.call_once(|| eprintln!("proptest seed {SEED:#x}"));
                let ranges = row_ranges(from.as_deref(), to.as_deref());
                for pair in ranges.windows(2) {
                    let end = pair[0].before.as_deref().expect("a first range of two has an upper bound");
                    let start = pair[1].from.as_deref().expect("a second range has a lower bound");
                    prop_assert!(cmp16(end, start).is_le(), "ranges overlap: {ranges:?}");
                }
                for (sort, fp) in &sorts {
                    let rk = row_key("f", sort, fp).expect("short key");
                    let inside = ranges.iter().filter(|r| contains16(r, &rk)).count();
                    prop_assert!(inside <= 1, "{rk:?} in {inside} ranges: {ranges:?}");
                    let wanted = sort_value_in_range(&rk, from.as_deref(), to.as_deref());
                    prop_assert!(!wanted || inside == 1, "{rk:?} ({sort:?}) is within {from:?}..={to:?} but outside {ranges:?}");
                    if inside == 0 || wanted {
                        continue;
                    }
                    // Admitted but outside the bounds: below `from` only as a proper prefix of
                    // it; above `to` only with the same first character (or, in the empty
                    // sort value's range, a sort value starting with ':').
                    let s = sort_part(&rk);
                    if let Some(f) = from.as_deref().map(row_from_bound) {
                        if cmp16(s, &f).is_lt() {
                            prop_assert!(f.starts_with(s) && f.len() > s.len(), "{s:?} admitted below {f:?}");
                        }
                    }
                    if let Some(t) = to.as_deref().map(sort_to) {
                        if cmp16(s, &t).is_gt() {
                            let first = |x: &str| x.encode_utf16().next();
                            prop_assert!(
                                first(s) == first(&t) || (s.starts_with(':') && t.chars().next().is_none_or(|c| c <= ':')),
                                "{s:?} admitted above {t:?} by {ranges:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn key_string_matches_python_str() {
        use serde_json::json;
        assert_eq!(key_string(&json!("F314")).unwrap(), "F314");
        assert_eq!(key_string(&json!(true)).unwrap(), "True");
        assert_eq!(key_string(&json!(12)).unwrap(), "12");
        assert_eq!(key_string(&json!(-12)).unwrap(), "-12");
        assert_eq!(key_string(&json!(18446744073709551615u64)).unwrap(), "18446744073709551615");
        assert_eq!(key_string(&json!(null)), None);
        let cases = [
            (100.0, "100.0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e300, "-2.5e+300"),
            (123456.789, "123456.789"),
            (-0.0, "-0.0"),
        ];
        for (f, s) in cases {
            assert_eq!(python_float_repr(f), s, "{f}");
        }
    }
}
