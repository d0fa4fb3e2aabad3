//! WAL ids: `{UTC timestamp with microseconds}_{uuid}`, e.g.
//! `2026-11-21T04:29:00.123456_0f8fad5b-d9cb-469f-a165-70867728950e` (the reference's
//! format). Ids sort by time as strings.
//!
//! Ids are allocated by [`super::clock`]: a new id's timestamp is above every timestamp any
//! process has published in the WAL table's `clock` partition and above this
//! process's own last one. So an id allocated after another one was acknowledged is always
//! larger, whatever the writers' clocks say, and ordering by id is the order writes were
//! issued in.

use std::fmt;

use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

const FORMAT: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]");

/// A WAL id (the RowKey of a pending entry).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalId(String);

impl WalId {
    /// The id for timestamp `micros` (µs since the Unix epoch) and `uuid`.
    pub fn new(micros: i64, uuid: uuid::Uuid) -> WalId {
        WalId(format!("{}_{uuid}", format_micros(micros)))
    }

    /// Parses and checks an id (as received in an API path).
    pub fn parse(s: &str) -> Option<WalId> {
        let (ts, u) = s.split_once('_')?;
        parse_micros(ts)?;
        uuid::Uuid::parse_str(u).ok()?;
        Some(WalId(s.to_string()))
    }

    /// The effective id of an entry logged late (`super::seal`): `{seal}+{position}`, where
    /// `position` is the entry's own id. It sorts just after `seal` (and after every other
    /// id stamped with the same seal and a smaller position) and before every id larger
    /// than `seal` that is not itself stamped with it, because plain ids have one fixed
    /// length and `+` follows none of their characters' places. Its timestamp
    /// ([`WalId::micros`]) is the seal's.
    pub fn stamped(seal: &WalId, position: &WalId) -> WalId {
        WalId(format!("{}{STAMP}{}", seal.0, position.0))
    }

    /// True for an effective id made by [`WalId::stamped`].
    pub fn is_stamped(&self) -> bool {
        self.0.contains(STAMP)
    }

    /// Parses and checks an effective id: a WAL id, or a stamped one ([`WalId::stamped`]),
    /// as history rows and catalog rows carry them.
    pub fn parse_effective(s: &str) -> Option<WalId> {
        s.split(STAMP).try_for_each(|part| WalId::parse(part).map(drop))?;
        Some(WalId(s.to_string()))
    }

    /// Wraps a string read from storage without checking it.
    pub fn from_stored(s: String) -> WalId {
        WalId(s)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its timestamp in µs since the Unix epoch, if it parses.
    pub fn micros(&self) -> Option<i64> {
        parse_micros(self.0.split('_').next()?)
    }
}

/// Joins a seal and an entry's position in a stamped id.
pub const STAMP: char = '+';

/// The id of the entry that wrote a row carrying effective id `effective` (a catalog row's
/// `w`, a history row's `wal_id`): the part after the last [`STAMP`], i.e. the id its writer
/// was acknowledged with; `effective` itself when it is not stamped.
pub fn entry_of(effective: &str) -> &str {
    effective.rsplit(STAMP).next().unwrap_or(effective)
}

impl fmt::Display for WalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Formats µs since the epoch as the id's timestamp part.
pub fn format_micros(micros: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(micros as i128 * 1000)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000000".into())
}

/// Parses the id's timestamp part to µs since the epoch.
pub fn parse_micros(ts: &str) -> Option<i64> {
    let t = time::PrimitiveDateTime::parse(ts, FORMAT).ok()?.assume_utc();
    Some((t.unix_timestamp_nanos() / 1000) as i64)
}

/// Now, in µs since the Unix epoch ([`crate::env::now_micros`]).
pub fn now_micros() -> i64 {
    crate::env::now_micros()
}

#[cfg(test)]
mod tests {
    #[test]
    fn stamped_ids_sort_just_after_their_seal() {
        let id = |t: i64, u: u128| super::WalId::new(t, uuid::Uuid::from_u128(u));
        let seal = id(2_000, 5);
        let (a, b) = (super::WalId::stamped(&seal, &id(1_000, 9)), super::WalId::stamped(&seal, &id(1_500, 1)));
        assert!(seal < a && a < b, "after the seal, in position order");
        assert!(b < id(2_000, 6) && b < id(2_001, 0), "before every larger plain id");
        assert!(id(1_999, u128::MAX) < a && id(2_000, 4) < a);
        let nested = super::WalId::stamped(&a, &id(1_200, 3));
        assert!(a < nested && nested < b);
        assert_eq!(a.micros(), Some(2_000));
        assert!(a.is_stamped() && !seal.is_stamped());
        assert_eq!(super::WalId::parse_effective(nested.as_str()), Some(nested.clone()));
        assert_eq!(super::WalId::parse(nested.as_str()), None, "an API path names a position, never a stamp");
        assert_eq!(super::WalId::parse_effective("x+y"), None);
        assert_eq!(super::entry_of(nested.as_str()), id(1_200, 3).as_str());
        assert_eq!(super::entry_of(seal.as_str()), seal.as_str());
    }
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_by_time() {
        let u = uuid::Uuid::nil();
        let a = WalId::new(1_763_699_340_123_456, u);
        assert_eq!(a.as_str(), "2025-11-21T04:29:00.123456_00000000-0000-0000-0000-000000000000");
        assert_eq!(a.micros(), Some(1_763_699_340_123_456));
        assert_eq!(WalId::parse(a.as_str()), Some(a.clone()));
        let b = WalId::new(1_763_699_340_123_457, u);
        assert!(a < b);
        assert!(WalId::parse("nope").is_none());
        assert!(WalId::parse("2025-11-21T04:29:00.123456_notauuid").is_none());
        // Pending ids sort before the ':' that starts non-entry rows of the WAL partition.
        assert!(a.as_str() < ":");
    }
}
