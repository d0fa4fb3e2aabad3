//! Azure's rules for PartitionKey and RowKey values: the characters it forbids, the longest
//! key, and the order keys sort in. Backends and [`super::value`] check keys by them;
//! `crate::keys` builds keys that follow them.

/// Longest PartitionKey or RowKey, in UTF-16 code units: 1 KiB as UTF-16. Azure documents
/// "up to 1 KiB"; Azurite enforces 512 UTF-16 units; this limit is safe under both readings.
pub const MAX_KEY_UTF16: usize = 512;

/// True for the characters Azure forbids in PartitionKey and RowKey values.
pub fn is_forbidden_key_char(c: char) -> bool {
    matches!(c, '/' | '\\' | '#' | '?' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Compares keys by UTF-16 code units, the order of the Table service (and of Azurite and
/// the embedded store): astral characters (surrogate pairs) sort below U+E000..U+FFFF.
pub fn cmp_utf16(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}
