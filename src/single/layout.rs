//! Where a record's rows live in single-partition mode: every row in the one partition
//! of the tenant (its PartitionKey is the escaped tenant key), told apart by RowKey
//! (seed 001, "intra-partition secondary index pattern"):
//!
//! - the **owner row** `0%;{identity}`: the record, whose index values name its index rows;
//! - one **index row** per indexed value, `{index key}%;{identity}`, where `{index key}` is
//!   the PartitionKey the WAL mode gives that value (`{n}_{field}{value}`, lowercased and
//!   escaped: `crate::keys::partition_key`), and `{identity}` is the record's RowKey in the
//!   WAL mode (`{sort value}:{fingerprint}`), so rows of one value sort by sort value and
//!   the `row_from`/`row_to` ranges of `crate::keys::row_ranges` apply after the prefix.
//!
//! `%;` never occurs inside an escaped key (`crate::keys::escape_key` writes `%` only as
//! `%XX` with two hex digits), so `{index key}%;` is a prefix no other value's rows share,
//! and the range `[{p}%;, {p}%<)` holds exactly the rows of one value. No index key starts
//! with `0` (the `{n}_` length prefix is at least `1_`), so owner rows never mix with them.

use crate::keys;
use crate::store::RowRange;

/// Ends an index key or the owner marker inside a RowKey.
pub(crate) const SEP: &str = "%;";
/// The character after `;`: `{p}%<` is the exclusive end of the rows prefixed `{p}%;`.
const SEP_END: &str = "%<";
/// The owner rows' prefix before [`SEP`].
const OWNER: &str = "0";

/// The PartitionKey of tenant `tenant`: its escaped form. Errors name the setting and the
/// key limit (1 KiB).
pub(crate) fn partition(tenant: &str) -> Result<String, keys::KeyError> {
    keys::check_len("PartitionKey", "tenant", keys::escape_key(tenant))
}

/// The RowKey prefix of index key `index_key` (a WAL-mode PartitionKey).
pub(crate) fn index_prefix(index_key: &str) -> String {
    format!("{index_key}{SEP}")
}

/// The RowKey prefix of owner rows.
pub(crate) fn owner_prefix() -> String {
    index_prefix(OWNER)
}

/// The owner row's RowKey of record `identity`.
pub(crate) fn owner_row(identity: &str) -> String {
    format!("{}{identity}", owner_prefix())
}

/// The index row's RowKey of record `identity` under index key `index_key`.
pub(crate) fn index_row(index_key: &str, identity: &str) -> String {
    format!("{}{identity}", index_prefix(index_key))
}

/// `range` (over identities) moved under `prefix`: the same rows, as RowKeys of the tenant
/// partition. Unbounded ends become the prefix's own bounds.
pub(crate) fn under_prefix(prefix: &str, range: &RowRange) -> RowRange {
    let p = |b: &Option<String>| b.as_ref().map(|b| format!("{prefix}{b}"));
    let stem = prefix.strip_suffix(SEP).unwrap_or(prefix);
    let mut out = RowRange { from: p(&range.from), after: p(&range.after), before: p(&range.before), to: p(&range.to) };
    if out.from.is_none() && out.after.is_none() {
        out.from = Some(prefix.to_string());
    }
    if out.before.is_none() && out.to.is_none() {
        out.before = Some(format!("{stem}{SEP_END}"));
    }
    out
}

/// The identity a RowKey under `prefix` belongs to.
pub(crate) fn identity_of<'a>(prefix: &str, row_key: &'a str) -> Option<&'a str> {
    row_key.strip_prefix(prefix)
}

/// Checks that a RowKey of the layout fits Azure's 1 KiB key limit (an index key and an
/// identity together may not), naming `field`, the field whose value made it.
pub(crate) fn check_row_key(row_key: &str, field: &str) -> Result<(), keys::KeyError> {
    keys::check_len("RowKey", field, row_key.to_string()).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_s_rows_are_exactly_its_prefix_range() {
        let p = index_prefix(&keys::partition_key("iata", "ab").unwrap());
        let all = under_prefix(&p, &RowRange::default());
        let mine = index_row(&keys::partition_key("iata", "ab").unwrap(), "x:00000000");
        let longer = index_row(&keys::partition_key("iata", "abc").unwrap(), "x:00000000");
        let escaped = index_row(&keys::partition_key("iata", "ab%").unwrap(), "x:00000000");
        let owner = owner_row("x:00000000");
        assert!(all.contains(&mine));
        assert!(!all.contains(&longer) && !all.contains(&escaped) && !all.contains(&owner));
        assert_eq!(identity_of(&p, &mine), Some("x:00000000"));
        let owners = under_prefix(&owner_prefix(), &RowRange::default());
        assert!(owners.contains(&owner) && !owners.contains(&mine));
    }

    #[test]
    fn sort_ranges_keep_their_meaning_under_the_prefix() {
        let p = index_prefix("4_iatajfk");
        for range in keys::row_ranges(Some("john"), Some("john z")) {
            let r = under_prefix(&p, &range);
            assert!(r.contains(&format!("{p}john f kennedy:12345678")));
            assert!(!r.contains(&format!("{p}kennedy:12345678")));
        }
    }
}
