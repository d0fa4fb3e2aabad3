//! Per-record linearizability of the checker's history (issue 25): does some order of the
//! operations on one record, consistent with real time, explain what the catalog shows?
//!
//! **The projection.** Each record identity (its RowKey) is checked on its own. Every
//! operation is projected onto the identity as one [`Action`]:
//! - an upsert or insert of the identity, or a replace whose new record has it: `Write(r)`,
//!   the state becomes `r`;
//! - a delete, or a replace whose new record is another identity: `Remove(field = value)`,
//!   the record is removed if its state at that instant has the value (an effective change),
//!   else nothing happens;
//! - a consistent read or a consistent lookup by an added field: `Read`, the state at that
//!   instant must be what it answered (exactly that record, or absent), or, for a lookup
//!   that did not return the identity, absent or without the value.
//!
//! **Real time.** Each operation has the logical times it was issued and acknowledged
//! ([`Event`]). Operation A precedes B when A was acknowledged before B was issued; the order
//! must keep that. An operation that failed (a transient error: its entry may have been
//! written) may take effect at any time after it was issued, or never (Jepsen's `:info`,
//! `required: false`). A queued intent that the queue accepted must take effect, at any time
//! after it was sent (`ended: None`).
//!
//! **What must be explained**, by one order for all three:
//! - (a) the final state of the record;
//! - (b) every consistent read's and consistent lookup's answer;
//! - (c) the record's history rows: read oldest first, they must be exactly the effective
//!   changes of the order, one row per change: a row holding the record for every write (an
//!   applied upsert or replace writes its row even when a newer version is already stored),
//!   and a removal row for every remove that found the record with the value; a row
//!   attributed to the operation whose WAL id it carries (an operation whose id is unknown,
//!   such as a failed one, may own a row whose id belongs to no known operation).
//!   Nothing requires a row's WAL id to be above the previous row's: the order is the
//!   history table's order (RowKey, newest first), and WAL-id order is not expected.
//!
//! **The search** (Wing & Gong's, with Lowe's memoization as in Knossos and Porcupine): a
//! depth-first search over partial orders, each node the set of operations placed so far
//! and the number of history rows explained, visited once. The history rows pin the order of
//! the effective changes, so at each node the next row names the operation that must come
//! next (or, for a row with an unknown id, the few that may); operations that change nothing
//! in the current state (a read it satisfies, a remove that does not match, when it owns no
//! row) are placed at once without branching: placing such an operation as early as real time
//! allows never removes an option (it changes no state, and placed, it no longer holds back
//! the operations it precedes). So the search is linear in the operations unless rows with
//! unknown ids leave a choice, and a budget of nodes bounds it ([`Verdict::Undecided`]).
//!
//! **Not checked here.** Per record only: a filter's single instant across the records it
//! matches is not enforced (each record's order may place the same delete at a different
//! instant), nor the atomicity of a replace (removal of the matched records and the write of
//! its new record at one instant), nor that a lookup's records were all read at one instant.
//! An acknowledged insert is a write (its refusal of a visible record is checked at log time
//! and not modelled).

use std::collections::{BTreeSet, HashMap, HashSet};

use table_catalog::record::Record;

/// A filter: `(field, value)` pairs, all of which a record must have (one pair, or two for
/// a composite index's fields).
pub type Filter = Vec<(String, String)>;

/// A filter on one field.
pub fn one((field, value): &(String, String)) -> Filter {
    vec![(field.clone(), value.clone())]
}

/// Whether `r` has every `field` = `value` of the filter as a filter sees it (non-empty,
/// case-insensitive).
pub fn has(r: &Record, filter: &Filter) -> bool {
    !filter.is_empty()
        && filter.iter().all(|(field, value)| {
            r.get(field.as_str())
                .and_then(|v| v.as_str())
                .is_some_and(|v| !v.is_empty() && v.to_lowercase() == value.to_lowercase())
        })
}

/// The filter as a query string (`country=US&iata=AAA`).
pub fn show(filter: &Filter) -> String {
    filter.iter().map(|(f, v)| format!("{f}={v}")).collect::<Vec<_>>().join("&")
}

/// What an operation does to the record (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The state becomes this record.
    Write(Record),
    /// The record is removed if its state has the filter's value.
    Remove(Filter),
    /// The state must be as expected.
    Read(Expect),
}

/// What a read saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// Exactly this state (`None`: absent).
    Is(Option<Record>),
    /// Absent, or a record without the filter's value (a lookup that did not return it).
    Lacks(Filter),
}

impl Expect {
    fn holds(&self, state: Option<&Record>) -> bool {
        match self {
            Expect::Is(want) => want.as_ref() == state,
            Expect::Lacks(f) => !state.is_some_and(|r| has(r, f)),
        }
    }
}

/// One operation, projected onto the record.
#[derive(Debug, Clone)]
pub struct Event {
    pub action: Action,
    /// Logical time it was issued.
    pub issued: u64,
    /// Logical time it was acknowledged; `None`: it may take effect any time after it was
    /// issued (a failed call, a queued intent), so it precedes nothing.
    pub ended: Option<u64>,
    /// It must take effect (acknowledged); `false`: it may take effect, or never (failed).
    pub required: bool,
    /// The WAL id it was logged under, when known.
    pub wal_id: Option<String>,
    /// How reports name it.
    pub label: String,
}

/// One history row of the record.
#[derive(Debug, Clone)]
pub struct Row {
    pub wal_id: String,
    /// The record after the change; `None`: removed.
    pub record: Option<Record>,
}

/// The answer of [`check`].
#[derive(Debug)]
pub enum Verdict {
    /// An order explains everything; `states`: search nodes visited.
    Linearizable { states: usize },
    /// No order does: why, at the deepest point the search reached.
    Violation(String),
    /// The budget of search nodes ran out before an answer.
    Undecided { states: usize },
}

/// Search nodes visited per record before [`Verdict::Undecided`].
pub const DEFAULT_BUDGET: usize = 200_000;

/// A short description of a state: `absent`, or the record's `v`, `by` and added-index values.
pub fn brief(state: Option<&Record>) -> String {
    match state {
        None => "absent".into(),
        Some(r) => {
            let field = |f: &str| r.get(f).map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            format!(
                "v={} by={} country={} tz={} subd={}",
                field("v"),
                field("by"),
                field("country"),
                field("tz"),
                field("subd")
            )
        }
    }
}

/// Checks that some order of `events` consistent with real time explains `rows` (the
/// record's history, oldest first), the reads, and the final state `live` (see the module
/// docs). At most `budget` search nodes.
pub fn check(events: &[Event], rows: &[Row], live: Option<&Record>, budget: usize) -> Verdict {
    let search = match Search::new(events, rows, live) {
        Ok(s) => s,
        Err(why) => return Verdict::Violation(why),
    };
    search.run(budget)
}

/// A node: `row` history rows explained; the required events placed are those at positions
/// (in issue order) below `first` and those in `placed`; `used`: the optional events placed.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Node {
    row: usize,
    first: usize,
    placed: BTreeSet<usize>,
    used: BTreeSet<usize>,
}

struct Search<'a> {
    events: &'a [Event],
    rows: &'a [Row],
    live: Option<&'a Record>,
    /// The required events (indexes into `events`), in issue order.
    required: Vec<usize>,
    /// Each event's position in `required`.
    position: Vec<Option<usize>>,
    /// The event owning each row by its WAL id.
    owner: Vec<Option<usize>>,
    /// Each event's row by its WAL id.
    own_row: Vec<Option<usize>>,
    /// For each row owned by no event: the events without a known id that could have made it.
    candidates: Vec<Vec<usize>>,
    /// Each event's last row among those it is a candidate of.
    last_candidacy: Vec<Option<usize>>,
}

/// Why the search failed at its deepest point.
struct Deepest {
    row: usize,
    why: Option<String>,
}

impl Deepest {
    fn note(&mut self, row: usize, why: impl FnOnce() -> String) {
        if self.why.is_none() || row > self.row {
            self.row = row;
            self.why = Some(why());
        }
    }
}

impl<'a> Search<'a> {
    fn new(events: &'a [Event], rows: &'a [Row], live: Option<&'a Record>) -> Result<Search<'a>, String> {
        let mut required: Vec<usize> = (0..events.len()).filter(|i| events[*i].required).collect();
        required.sort_by_key(|i| (events[*i].issued, *i));
        let mut position = vec![None; events.len()];
        for (p, i) in required.iter().enumerate() {
            position[*i] = Some(p);
        }
        let mut owner = vec![None; rows.len()];
        let mut own_row = vec![None; events.len()];
        let mut candidates = vec![Vec::new(); rows.len()];
        let mut last_candidacy = vec![None; events.len()];
        let by_id: HashMap<&str, usize> =
            events.iter().enumerate().filter_map(|(i, e)| e.wal_id.as_deref().map(|id| (id, i))).collect();
        let mut seen = HashSet::new();
        for (j, row) in rows.iter().enumerate() {
            if !seen.insert(row.wal_id.as_str()) {
                return Err(format!("two history rows of WAL id {}", row.wal_id));
            }
            match by_id.get(row.wal_id.as_str()).copied() {
                Some(i) => {
                    owner[j] = Some(i);
                    own_row[i] = Some(j);
                }
                None => {
                    for (i, e) in events.iter().enumerate() {
                        let fits = match (&e.action, &row.record) {
                            (Action::Write(r), Some(written)) => r == written,
                            (Action::Remove(_), None) => true,
                            _ => false,
                        };
                        if e.wal_id.is_none() && fits {
                            candidates[j].push(i);
                            last_candidacy[i] = Some(j);
                        }
                    }
                }
            }
        }
        for (i, e) in events.iter().enumerate() {
            if let (Action::Write(_), Some(id), None, true) = (&e.action, &e.wal_id, own_row[i], e.required) {
                return Err(format!("{} has no history row (WAL id {id})", e.label));
            }
        }
        Ok(Search { events, rows, live, required, position, owner, own_row, candidates, last_candidacy })
    }

    /// The state after `row` history rows.
    fn state(&self, row: usize) -> Option<&'a Record> {
        row.checked_sub(1).and_then(|j| self.rows[j].record.as_ref())
    }

    fn is_placed(&self, node: &Node, p: usize) -> bool {
        p < node.first || node.placed.contains(&p)
    }

    fn place(&self, node: &mut Node, i: usize) {
        match self.position[i] {
            Some(p) => {
                node.placed.insert(p);
                while node.placed.remove(&node.first) {
                    node.first += 1;
                }
            }
            None => {
                node.used.insert(i);
            }
        }
    }

    /// The earliest acknowledgement among the required events not placed yet (with the event),
    /// `u64::MAX` when none: an event issued before it may come next.
    fn horizon(&self, node: &Node) -> (u64, Option<usize>) {
        let mut best = (u64::MAX, None);
        for p in node.first..self.required.len() {
            let e = &self.events[self.required[p]];
            if e.issued >= best.0 {
                break; // issue order: every later event ends later still
            }
            if !self.is_placed(node, p) {
                if let Some(ended) = e.ended.filter(|t| *t < best.0) {
                    best = (ended, Some(self.required[p]));
                }
            }
        }
        best
    }

    /// Whether event `i` changes nothing in the state after `row` rows and can own no row
    /// from there on: it can be placed at once.
    fn idle(&self, i: usize, row: usize) -> bool {
        let state = self.state(row);
        match &self.events[i].action {
            Action::Read(expect) => expect.holds(state),
            Action::Remove(f) => {
                !state.is_some_and(|r| has(r, f))
                    && self.own_row[i].is_none()
                    && self.last_candidacy[i].is_none_or(|last| last < row)
            }
            Action::Write(_) => false,
        }
    }

    /// Whether event `i` can have made the next row (`row`).
    fn makes(&self, i: usize, row: usize) -> Result<(), String> {
        let state = self.state(row);
        let made = &self.rows[row];
        match (&self.events[i].action, &made.record) {
            (Action::Write(r), Some(written)) if r == written => Ok(()),
            (Action::Write(_), _) => Err("the row holds another state than it writes".into()),
            (Action::Remove(f), None) if state.is_some_and(|r| has(r, f)) => Ok(()),
            (Action::Remove(f), None) => {
                Err(format!("the record then ({}) does not have {}, so it removes nothing", brief(state), show(f)))
            }
            (Action::Remove(_), Some(_)) => Err("the row holds a record, not a removal".into()),
            (Action::Read(_), _) => Err("a read writes no row".into()),
        }
    }

    /// Places every event that may come next and changes nothing.
    fn settle(&self, node: &mut Node) {
        loop {
            let (horizon, _) = self.horizon(node);
            let idle: Vec<usize> = (node.first..self.required.len())
                .take_while(|p| self.events[self.required[*p]].issued < horizon)
                .filter(|p| !self.is_placed(node, *p) && self.idle(self.required[*p], node.row))
                .map(|p| self.required[p])
                .collect();
            if idle.is_empty() {
                return;
            }
            for i in idle {
                self.place(node, i);
            }
        }
    }

    fn describe_row(&self, row: usize) -> String {
        let r = &self.rows[row];
        match &r.record {
            Some(rec) => {
                format!("history row {} of {} ({}, WAL id {})", row + 1, self.rows.len(), brief(Some(rec)), r.wal_id)
            }
            None => format!("history row {} of {} (removal, WAL id {})", row + 1, self.rows.len(), r.wal_id),
        }
    }

    fn run(&self, budget: usize) -> Verdict {
        let mut stack = vec![Node { row: 0, first: 0, placed: BTreeSet::new(), used: BTreeSet::new() }];
        let mut visited: HashSet<Node> = HashSet::new();
        let mut deepest = Deepest { row: 0, why: None };
        while let Some(mut node) = stack.pop() {
            self.settle(&mut node);
            if !visited.insert(node.clone()) {
                continue;
            }
            if visited.len() > budget {
                return Verdict::Undecided { states: visited.len() };
            }
            let (horizon, blocker) = self.horizon(&node);
            let state = self.state(node.row);
            if node.row == self.rows.len() {
                if node.first < self.required.len() {
                    let left: Vec<&str> = (node.first..self.required.len())
                        .filter(|p| !self.is_placed(&node, *p))
                        .take(3)
                        .map(|p| self.events[self.required[p]].label.as_str())
                        .collect();
                    deepest.note(node.row, || {
                        format!(
                            "after all {} history rows (the record {}), no place is left for: {}",
                            self.rows.len(),
                            brief(state),
                            left.join("; ")
                        )
                    });
                } else if state != self.live {
                    deepest.note(node.row, || {
                        format!("the history ends with the record {}, but it is {}", brief(state), brief(self.live))
                    });
                } else {
                    return Verdict::Linearizable { states: visited.len() };
                }
                continue;
            }
            let next = node.row;
            let blocked = |i: usize| {
                let e = &self.events[i];
                let by = blocker.map(|b| self.events[b].label.as_str()).unwrap_or_default();
                format!(
                    "{} cannot take effect yet: {by}, acknowledged before it was issued, has no place before it",
                    e.label
                )
            };
            let mut children = Vec::new();
            match self.owner[next] {
                Some(i) => {
                    let placed = match self.position[i] {
                        Some(p) => self.is_placed(&node, p),
                        None => node.used.contains(&i),
                    };
                    if placed {
                        deepest.note(next, || {
                            format!("{}: {} took effect already", self.describe_row(next), self.events[i].label)
                        });
                    } else if self.events[i].issued >= horizon {
                        deepest.note(next, || format!("{}: {}", self.describe_row(next), blocked(i)));
                    } else {
                        match self.makes(i, next) {
                            Ok(()) => children.push(i),
                            Err(why) => deepest.note(next, || {
                                format!("{} belongs to {}, but {why}", self.describe_row(next), self.events[i].label)
                            }),
                        }
                    }
                }
                None => {
                    for &i in &self.candidates[next] {
                        let placed = match self.position[i] {
                            Some(p) => self.is_placed(&node, p),
                            None => node.used.contains(&i),
                        };
                        if !placed && self.events[i].issued < horizon && self.makes(i, next).is_ok() {
                            children.push(i);
                        }
                    }
                    if children.is_empty() {
                        deepest.note(next, || {
                            format!(
                                "{}: no operation without a known WAL id can have made it then (the record {}; {} candidates)",
                                self.describe_row(next),
                                brief(state),
                                self.candidates[next].len()
                            )
                        });
                    }
                }
            }
            // Rows made by the choices below, in reverse so that the first is tried first.
            for &i in children.iter().rev() {
                let mut child = node.clone();
                self.place(&mut child, i);
                child.row += 1;
                stack.push(child);
            }
            // A required remove with an unknown id that matches nothing now may also take
            // effect now, as a no-op, instead of owning a later row.
            for p in node.first..self.required.len() {
                let i = self.required[p];
                let e = &self.events[i];
                if e.issued >= horizon {
                    break;
                }
                if let Action::Remove(f) = &e.action {
                    if !self.is_placed(&node, p) && e.wal_id.is_none() && !state.is_some_and(|r| has(r, f)) {
                        let mut child = node.clone();
                        self.place(&mut child, i);
                        stack.push(child);
                    }
                }
            }
        }
        Verdict::Violation(deepest.why.unwrap_or_else(|| "no order explains the history".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(v: u64, country: &str) -> Record {
        let mut r = Record::new();
        r.insert("icao".into(), json!("KAAA"));
        r.insert("iata".into(), json!("AAA"));
        r.insert("v".into(), json!(v));
        r.insert("country".into(), json!(country));
        r
    }

    fn filter(field: &str, value: &str) -> Filter {
        vec![(field.to_string(), value.to_string())]
    }

    /// An acknowledged operation, issued and acknowledged at these times, logged under `id`.
    fn acked(action: Action, issued: u64, ended: u64, id: &str) -> Event {
        let label = format!("{id} ({issued}-{ended})");
        Event { action, issued, ended: Some(ended), required: true, wal_id: Some(id.into()), label }
    }

    fn failed(action: Action, issued: u64) -> Event {
        Event { action, issued, ended: None, required: false, wal_id: None, label: format!("failed ({issued})") }
    }

    fn read(expect: Expect, issued: u64, ended: u64) -> Event {
        Event {
            action: Action::Read(expect),
            issued,
            ended: Some(ended),
            required: true,
            wal_id: None,
            label: "read".into(),
        }
    }

    fn row(id: &str, record: Option<&Record>) -> Row {
        Row { wal_id: id.into(), record: record.cloned() }
    }

    fn linearizable(events: &[Event], rows: &[Row], live: Option<&Record>) -> bool {
        match check(events, rows, live, DEFAULT_BUDGET) {
            Verdict::Linearizable { .. } => true,
            Verdict::Violation(why) => {
                eprintln!("violation: {why}");
                false
            }
            Verdict::Undecided { states } => panic!("undecided after {states} states"),
        }
    }

    #[test]
    fn a_linearizable_history_passes() {
        let (r0, r1) = (record(1, "US"), record(2, "CA"));
        let events = [
            acked(Action::Write(r0.clone()), 1, 2, "a"),
            read(Expect::Is(Some(r0.clone())), 3, 4),
            // Concurrent: the read may see either.
            acked(Action::Write(r1.clone()), 5, 8, "b"),
            read(Expect::Is(Some(r0.clone())), 6, 7),
            acked(Action::Remove(filter("country", "US")), 9, 10, "c"),
            read(Expect::Lacks(filter("country", "US")), 11, 12),
        ];
        let rows = [row("a", Some(&r0)), row("b", Some(&r1))];
        assert!(linearizable(&events, &rows, Some(&r1)));
        // The remove by the old value found nothing: it has no row, and must not have one.
        let rows = [row("a", Some(&r0)), row("b", Some(&r1)), row("c", None)];
        assert!(!linearizable(&events, &rows, None));
    }

    /// Defect 1 of issue 25: R0 (country US) applied; U (country CA) logged late; F (delete
    /// country=US, a larger id, concurrent with U) applied before U was pending removes R0;
    /// U then finds a newer row and writes nothing. Both orders of U and F leave R live with
    /// CA; the unfixed code leaves it absent, its rows in WAL-id order.
    #[test]
    fn the_lost_upsert_of_defect_1_is_not_linearizable() {
        let (r0, u) = (record(1, "US"), record(2, "CA"));
        let events = [
            acked(Action::Write(r0.clone()), 1, 2, "a"),
            acked(Action::Write(u.clone()), 3, 8, "b"),
            acked(Action::Remove(filter("country", "US")), 4, 6, "c"),
        ];
        let unfixed = [row("a", Some(&r0)), row("b", Some(&u)), row("c", None)];
        assert!(!linearizable(&events, &unfixed, None));
        match check(&events, &unfixed, None, DEFAULT_BUDGET) {
            Verdict::Violation(why) => assert!(why.contains("does not have country=US"), "{why}"),
            other => panic!("{other:?}"),
        }
        // What the data alone shows is wrong too (rows consistent with U then F, but F had
        // nothing to remove, so R cannot be absent).
        assert!(!linearizable(&events, &[row("a", Some(&r0)), row("b", Some(&u))], None));
        // Fixed: U takes effect just after F (F's row first), or F after U (no removal).
        assert!(linearizable(&events, &[row("a", Some(&r0)), row("c", None), row("b", Some(&u))], Some(&u)));
        assert!(linearizable(&events, &[row("a", Some(&r0)), row("b", Some(&u))], Some(&u)));
    }

    /// Item 3 of issue 25: D (delete icao=KAAA) logged late, F (delete iata=AAA, larger id)
    /// matching the same record applied first; D then matches only tombstones and writes no
    /// row. Valid as the order F, D while D was concurrent with F; not once D was acknowledged
    /// before F was issued (D must then remove the record itself).
    #[test]
    fn a_late_delete_after_a_concurrent_delete_of_the_same_record_needs_no_row() {
        let r0 = record(1, "US");
        let rows = [row("a", Some(&r0)), row("f", None)];
        let concurrent = [
            acked(Action::Write(r0.clone()), 1, 2, "a"),
            acked(Action::Remove(filter("icao", "KAAA")), 3, 9, "d"),
            acked(Action::Remove(filter("iata", "AAA")), 4, 6, "f"),
        ];
        assert!(linearizable(&concurrent, &rows, None));
        let before = [
            acked(Action::Write(r0.clone()), 1, 2, "a"),
            acked(Action::Remove(filter("icao", "KAAA")), 3, 4, "d"),
            acked(Action::Remove(filter("iata", "AAA")), 5, 6, "f"),
        ];
        assert!(!linearizable(&before, &rows, None));
    }

    /// Seed 13 on Azurite with 16 shards: an upsert failed (a 503 after its WAL entry was
    /// written) before its id was published; a delete issued after the failure got a smaller
    /// id, so the upsert won. A failed write is indeterminate: it may take effect after a later
    /// acknowledged delete. An acknowledged one may not.
    #[test]
    fn a_failed_write_may_take_effect_after_a_later_acknowledged_delete() {
        let r = record(1, "US");
        let delete = acked(Action::Remove(filter("icao", "KAAA")), 191, 192, "f");
        let rows = [row("u", Some(&r))];
        assert!(linearizable(&[failed(Action::Write(r.clone()), 189), delete.clone()], &rows, Some(&r)));
        assert!(linearizable(&[failed(Action::Write(r.clone()), 189), delete.clone()], &[], None));
        let acked_write = acked(Action::Write(r.clone()), 189, 190, "u");
        assert!(!linearizable(&[acked_write, delete], &rows, Some(&r)));
    }

    #[test]
    fn a_stale_read_is_not_linearizable() {
        let (r1, r2) = (record(1, "US"), record(2, "US"));
        let rows = [row("a", Some(&r1)), row("b", Some(&r2))];
        let mut events = vec![acked(Action::Write(r1.clone()), 1, 2, "a"), acked(Action::Write(r2.clone()), 3, 4, "b")];
        events.push(read(Expect::Is(Some(r2.clone())), 5, 6));
        assert!(linearizable(&events, &rows, Some(&r2)));
        events.push(read(Expect::Is(Some(r1.clone())), 7, 8));
        assert!(!linearizable(&events, &rows, Some(&r2)));
    }

    /// Rows with unknown ids (failed calls) leave a choice: two failed removes by different
    /// values, each of which can only have made one of the two removal rows.
    #[test]
    fn rows_of_failed_calls_are_matched_to_the_calls_that_can_have_made_them() {
        let (us, ca) = (record(1, "US"), record(2, "CA"));
        let events = [
            failed(Action::Remove(filter("country", "CA")), 1),
            failed(Action::Remove(filter("country", "US")), 2),
            acked(Action::Write(us.clone()), 3, 4, "a"),
            acked(Action::Write(ca.clone()), 5, 6, "b"),
        ];
        let rows = [row("a", Some(&us)), row("x", None), row("b", Some(&ca)), row("y", None)];
        assert!(linearizable(&events, &rows, None));
        // A third removal has no call left to make it.
        let rows = [row("a", Some(&us)), row("x", None), row("b", Some(&ca)), row("y", None), row("z", None)];
        assert!(!linearizable(&events, &rows, None));
    }

    #[test]
    fn an_acknowledged_write_without_a_row_is_reported() {
        let r = record(1, "US");
        match check(&[acked(Action::Write(r.clone()), 1, 2, "a")], &[], None, DEFAULT_BUDGET) {
            Verdict::Violation(why) => assert!(why.contains("has no history row"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
