//! Six-field NCRONTAB schedules (`{second} {minute} {hour} {day} {month} {day-of-week}`, UTC)
//! as the timer trigger reads them, enough to fill `ScheduleStatus` and to tell whether the
//! schedule monitor is on (the extension forces it off when a schedule fires more than once a
//! minute; contract §3).

use time::{Duration, OffsetDateTime};

/// A parsed schedule: the allowed values of each field.
#[derive(Debug, Clone)]
pub struct Cron {
    fields: [Vec<bool>; 6],
}

const RANGES: [(u32, u32); 6] = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6)];

fn parse_field(text: &str, (lo, hi): (u32, u32)) -> Result<Vec<bool>, String> {
    let mut allowed = vec![false; hi as usize + 1];
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|_| format!("bad step in '{part}'"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("zero step in '{part}'"));
        }
        let (from, to) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (
                a.parse().map_err(|_| format!("bad range '{range}'"))?,
                b.parse().map_err(|_| format!("bad range '{range}'"))?,
            )
        } else {
            let v: u32 = range.parse().map_err(|_| format!("bad value '{range}' (names are not supported here)"))?;
            (v, if part.contains('/') { hi } else { v })
        };
        if from < lo || to > hi || from > to {
            return Err(format!("'{part}' is outside {lo}-{hi}"));
        }
        let mut v = from;
        while v <= to {
            allowed[v as usize] = true;
            v += step;
        }
    }
    Ok(allowed)
}

impl Cron {
    pub fn parse(schedule: &str) -> Result<Cron, String> {
        let parts: Vec<&str> = schedule.split_whitespace().collect();
        if parts.len() != 6 {
            return Err(format!("'{schedule}' is not a 6-field NCRONTAB expression"));
        }
        let mut fields: [Vec<bool>; 6] = Default::default();
        for (i, p) in parts.iter().enumerate() {
            fields[i] = parse_field(p, RANGES[i])?;
        }
        Ok(Cron { fields })
    }

    fn matches(&self, t: OffsetDateTime) -> bool {
        let f = &self.fields;
        f[0][t.second() as usize]
            && f[1][t.minute() as usize]
            && f[2][t.hour() as usize]
            && f[3][t.day() as usize]
            && f[4][u8::from(t.month()) as usize]
            && f[5][t.weekday().number_days_from_sunday() as usize]
    }

    /// First occurrence strictly after `t` (searched second by second, up to 400 days).
    pub fn next_after(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        let mut c = t.replace_nanosecond(0).unwrap() + Duration::SECOND;
        let end = t + Duration::days(400);
        while c <= end {
            if self.matches(c) {
                return Some(c);
            }
            c += Duration::SECOND;
        }
        None
    }

    /// Last occurrence at or before `t`.
    pub fn last_at_or_before(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        let mut c = t.replace_nanosecond(0).unwrap();
        let end = t - Duration::days(400);
        while c >= end {
            if self.matches(c) {
                return Some(c);
            }
            c -= Duration::SECOND;
        }
        None
    }

    /// True when two consecutive occurrences are less than a minute apart (the extension
    /// then turns the schedule monitor off).
    pub fn fires_more_than_once_a_minute(&self, from: OffsetDateTime) -> bool {
        let Some(a) = self.next_after(from) else { return false };
        let Some(b) = self.next_after(a) else { return false };
        (b - a) < Duration::MINUTE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_five_minutes() {
        let c = Cron::parse("0 */5 * * * *").unwrap();
        let t = OffsetDateTime::from_unix_timestamp(1_735_725_723).unwrap(); // 10:02:03
        assert_eq!(c.next_after(t).unwrap().unix_timestamp(), 1_735_725_900); // 10:05:00
        assert_eq!(c.last_at_or_before(t).unwrap().unix_timestamp(), 1_735_725_600); // 10:00:00
        assert!(!c.fires_more_than_once_a_minute(t));
        assert!(Cron::parse("*/10 * * * * *").unwrap().fires_more_than_once_a_minute(t));
        assert!(Cron::parse("0 */5 * * *").is_err());
    }
}
