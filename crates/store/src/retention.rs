//! Retention: which snapshots a keep policy keeps, with restic's rules
//! (`restic forget --keep-*`), so users coming from restic get what they
//! expect. Per image, snapshots are walked newest first:
//!
//! - `last N` keeps the N newest;
//! - `hourly/daily/weekly/monthly/yearly N` keeps the newest snapshot of
//!   each of the N newest hours (days, ISO weeks, months, years) that
//!   have one; a period without snapshots does not count;
//! - `within D` keeps every snapshot taken less than D before the image's
//!   newest snapshot (not before now: a repository that stopped getting
//!   backups does not empty itself). D is counted back on the calendar
//!   as restic counts it (Go's `AddDate`): years and months first, a day
//!   past the month's end carried into the next month (a month before
//!   31 March is 2 March in a leap year), then days, then hours;
//! - `within-hourly/daily/weekly/monthly/yearly D` keeps the newest
//!   snapshot of each hour (day, ...) among those `within D` keeps;
//! - a snapshot is kept if any rule keeps it; the others are forgotten;
//! - the image's latest snapshot (the highest number: what `NAME`
//!   restores) is always kept, also when its time is older than others'
//!   (`backup --time`, a clock set back), where restic would sort it by
//!   its time.
//!
//! Periods are calendar periods in UTC (restic places each snapshot in
//! the time zone its time was recorded in, the zone of the machine that
//! took it; UTC gives every machine of a site the same answer).
//! docs/retention.md has the table of which snapshot each rule keeps.

use crate::error::{Result, StoreError};
use chrono::{DateTime, Datelike, Timelike, Utc};

/// How many of each to keep; `None` (or 0): that rule keeps nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeepPolicy {
    /// The N newest snapshots (for this and the counts below, `u32::MAX`
    /// keeps all: restic's `unlimited`).
    pub last: Option<u32>,
    /// The newest of each of the N newest hours.
    pub hourly: Option<u32>,
    /// ... days.
    pub daily: Option<u32>,
    /// ... ISO weeks.
    pub weekly: Option<u32>,
    /// ... months.
    pub monthly: Option<u32>,
    /// ... years.
    pub yearly: Option<u32>,
    /// Every snapshot taken after this span before the newest.
    pub within: Option<CalendarSpan>,
    /// The newest of each hour among the snapshots taken after this span
    /// before the newest (restic's `--keep-within-hourly`).
    pub within_hourly: Option<CalendarSpan>,
    /// ... of each day.
    pub within_daily: Option<CalendarSpan>,
    /// ... of each ISO week.
    pub within_weekly: Option<CalendarSpan>,
    /// ... of each month.
    pub within_monthly: Option<CalendarSpan>,
    /// ... of each year.
    pub within_yearly: Option<CalendarSpan>,
    /// Every snapshot that has all the tags of one of these lists
    /// (restic's `--keep-tag`).
    pub tags: Vec<Vec<String>>,
}

impl KeepPolicy {
    /// Whether no rule would keep anything (forgetting with such a policy
    /// would remove every snapshot: refused by callers, as restic does).
    pub fn is_empty(&self) -> bool {
        [
            self.last,
            self.hourly,
            self.daily,
            self.weekly,
            self.monthly,
            self.yearly,
        ]
        .iter()
        .all(|n| n.unwrap_or(0) == 0)
            && self.within.is_none()
            && self.within_buckets().iter().all(|(_, _, w)| w.is_none())
            && self.tags.is_empty()
    }

    /// The `within-*` rules: each one's reason, its period (as
    /// [`period`] names it) and its span.
    fn within_buckets(&self) -> [(&'static str, &'static str, Option<CalendarSpan>); 5] {
        [
            ("within-hourly", "hourly", self.within_hourly),
            ("within-daily", "daily", self.within_daily),
            ("within-weekly", "weekly", self.within_weekly),
            ("within-monthly", "monthly", self.within_monthly),
            ("within-yearly", "yearly", self.within_yearly),
        ]
    }
}

/// A span of calendar time as restic writes it (`1y2m3d4h`): years,
/// months, days and hours, counted back from a time on the calendar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CalendarSpan {
    /// Years.
    pub years: u64,
    /// Months.
    pub months: u64,
    /// Days.
    pub days: u64,
    /// Hours.
    pub hours: u64,
}

impl CalendarSpan {
    /// The time this span before `t` (Unix seconds, UTC), as Go's
    /// `t.AddDate(-years, -months, -days).Add(-hours)` gives it: the
    /// month moved back first, then the day of the month taken from the
    /// first of that month, so a day past the month's end carries into
    /// the next (a month before 31 March 2024 is 2 March); `None` before
    /// the calendar's start (every snapshot is after it).
    pub fn before(&self, t: i64) -> Option<i64> {
        let at = DateTime::<Utc>::from_timestamp(t, 0)?;
        let month = i128::from(at.year()) * 12 + i128::from(at.month0())
            - i128::from(self.years) * 12
            - i128::from(self.months);
        let year = i32::try_from(month.div_euclid(12)).ok()?;
        let month0 = u32::try_from(month.rem_euclid(12)).ok()?;
        let first = chrono::NaiveDate::from_ymd_opt(year, month0 + 1, 1)?;
        let day = i64::from(at.day0()).checked_sub(i64::try_from(self.days).ok()?)?;
        let date = first.checked_add_signed(chrono::TimeDelta::try_days(day)?)?;
        let back = date.and_time(at.time()).and_utc().timestamp();
        back.checked_sub(i64::try_from(self.hours).ok()?.checked_mul(3600)?)
    }
}

/// Where a span before the newest snapshot begins: a snapshot is within
/// it when taken strictly after `after` (Go's `After`, as restic); with
/// `None` (a span past the calendar's start) every snapshot is.
#[derive(Clone, Copy)]
struct Cut {
    after: Option<i64>,
}

impl Cut {
    fn new(span: CalendarSpan, newest: i64) -> Cut {
        Cut {
            after: span.before(newest),
        }
    }

    fn holds(&self, t: i64) -> bool {
        self.after.is_none_or(|from| t > from)
    }
}

/// One snapshot as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dated {
    /// Snapshot number.
    pub snapshot: u64,
    /// When it was taken (Unix seconds).
    pub created: i64,
    /// Its tags.
    pub tags: Vec<String>,
}

/// A snapshot's verdict and the rules that keep it (empty: forgotten).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The snapshot.
    pub snapshot: Dated,
    /// `last`, `hourly`, ..., `within` or `tag`, for each rule that keeps
    /// it (`latest` for the image's highest number, kept whatever the
    /// rules).
    pub reasons: Vec<&'static str>,
}

impl Verdict {
    /// Whether some rule keeps it.
    pub fn keep(&self) -> bool {
        !self.reasons.is_empty()
    }
}

/// The period of `t` for a rule (equal values: the same period).
fn period(rule: &str, t: &DateTime<Utc>) -> i64 {
    let (y, m, d, h) = (
        i64::from(t.year()),
        i64::from(t.month()),
        i64::from(t.day()),
        i64::from(t.hour()),
    );
    match rule {
        "hourly" => ((y * 100 + m) * 100 + d) * 100 + h,
        "daily" => (y * 100 + m) * 100 + d,
        "weekly" => {
            let w = t.iso_week();
            i64::from(w.year()) * 100 + i64::from(w.week())
        }
        "monthly" => y * 100 + m,
        _ => y,
    }
}

/// The verdicts for one image's snapshots under `policy`, newest first.
pub fn apply(policy: &KeepPolicy, snapshots: &[Dated]) -> Vec<Verdict> {
    let mut sorted: Vec<Dated> = snapshots.to_vec();
    // Newest first; the higher number first among equal times.
    sorted.sort_by_key(|s| std::cmp::Reverse((s.created, s.snapshot)));
    let newest = sorted.first().map(|s| s.created);
    // The highest number is what `NAME` restores and a writable image
    // starts from: never forgotten by a policy, even when an older time
    // was given to it (`backup --time`) or the clock went back. (Any
    // rule keeps the newest by time, which it is otherwise.)
    let latest = sorted.iter().map(|s| s.snapshot).max();
    let buckets: [(&'static str, Option<u32>); 5] = [
        ("hourly", policy.hourly),
        ("daily", policy.daily),
        ("weekly", policy.weekly),
        ("monthly", policy.monthly),
        ("yearly", policy.yearly),
    ];
    let mut left: Vec<u32> = buckets.iter().map(|(_, n)| n.unwrap_or(0)).collect();
    let mut seen: Vec<Option<i64>> = vec![None; buckets.len()];
    let mut last_left = policy.last.unwrap_or(0);
    // Each span's cut, once (no snapshots: no cuts, nothing to keep).
    let cut = |span: Option<CalendarSpan>| Some(Cut::new(span?, newest?));
    let within = cut(policy.within);
    let within_buckets = policy
        .within_buckets()
        .map(|(rule, every, span)| (rule, every, cut(span)));
    let mut within_seen: [Option<i64>; 5] = [None; 5];
    let mut out = Vec::with_capacity(sorted.len());
    for s in sorted {
        let mut reasons = Vec::new();
        if last_left > 0 {
            last_left -= 1;
            reasons.push("last");
        }
        let t = DateTime::<Utc>::from_timestamp(s.created, 0).unwrap_or_default();
        for (i, (rule, _)) in buckets.iter().enumerate() {
            if left[i] == 0 {
                continue;
            }
            let p = period(rule, &t);
            if seen[i] != Some(p) {
                seen[i] = Some(p);
                left[i] -= 1;
                reasons.push(*rule);
            }
        }
        if within.is_some_and(|c| c.holds(s.created)) {
            reasons.push("within");
        }
        // No count: every period inside the span keeps its newest.
        for (i, (rule, every, cut)) in within_buckets.iter().enumerate() {
            if cut.is_some_and(|c| c.holds(s.created)) {
                let p = period(every, &t);
                if within_seen[i] != Some(p) {
                    within_seen[i] = Some(p);
                    reasons.push(*rule);
                }
            }
        }
        if !policy.tags.is_empty() && crate::manifest::tags_match(&s.tags, &policy.tags) {
            reasons.push("tag");
        }
        if reasons.is_empty() && Some(s.snapshot) == latest {
            reasons.push("latest");
        }
        out.push(Verdict {
            snapshot: s,
            reasons,
        });
    }
    out
}

/// Parse a span as restic writes them: `1y2m3d4h`, each unit at most
/// once and in any order (`36h`, `2h1d`), not all zero.
pub fn parse_span(s: &str) -> Result<CalendarSpan> {
    let bad = || {
        StoreError::Invalid(format!(
            "bad duration {s:?}: use numbers with y, m, d or h, each at most once, as 1y6m or 14d or 36h"
        ))
    };
    let mut span = CalendarSpan::default();
    let mut num = String::new();
    // Each unit at most once (`1y1y` is a typo, not two years).
    let mut seen = 0u8;
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().map_err(|_| bad())?;
        num.clear();
        let (order, field) = match c {
            'y' => (1, &mut span.years),
            'm' => (2, &mut span.months),
            'd' => (3, &mut span.days),
            'h' => (4, &mut span.hours),
            _ => return Err(bad()),
        };
        if seen & 1 << order != 0 {
            return Err(bad());
        }
        seen |= 1 << order;
        *field = n;
    }
    if !num.is_empty() || span == CalendarSpan::default() {
        return Err(bad());
    }
    Ok(span)
}

/// A Unix time as `2026-11-25 12:00:00 UTC`.
pub fn format_time(secs: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("@{secs}"))
}

/// Parse a snapshot time: RFC 3339 (`2026-11-25T12:00:00Z`), or
/// `YYYY-MM-DD HH:MM:SS` / `YYYY-MM-DD` taken as UTC, or `@SECONDS`.
pub fn parse_time(s: &str) -> Result<i64> {
    let s = s.trim();
    if let Some(secs) = s.strip_prefix('@') {
        // Only times the calendar can place: retention sorts them into
        // hours, days and years.
        return secs
            .parse::<i64>()
            .ok()
            .filter(|&t| DateTime::<Utc>::from_timestamp(t, 0).is_some())
            .ok_or_else(|| StoreError::Invalid(format!("bad time {s:?}")));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp());
    }
    for fmt in ["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, fmt) {
            return Ok(t.and_utc().timestamp());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc().timestamp());
        }
    }
    Err(StoreError::Invalid(format!(
        "bad time {s:?}: use 2026-11-25T12:00:00Z, \"2026-11-25 12:00:00\" (UTC), 2026-11-25 or @SECONDS"
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn at(s: &str) -> i64 {
        parse_time(s).unwrap()
    }

    fn snaps(times: &[&str]) -> Vec<Dated> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| Dated {
                snapshot: i as u64 + 1,
                created: at(t),
                tags: Vec::new(),
            })
            .collect()
    }

    fn kept(policy: &KeepPolicy, s: &[Dated]) -> Vec<u64> {
        let mut v: Vec<u64> = apply(policy, s)
            .into_iter()
            .filter(Verdict::keep)
            .map(|v| v.snapshot.snapshot)
            .collect();
        v.sort_unstable();
        v
    }

    /// `--keep-tag`: a snapshot with every tag of one list is kept, as
    /// restic's; it still counts for the other rules.
    #[test]
    fn tagged_snapshots_are_kept() {
        let mut s = snaps(&[
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z",
            "2026-01-04T00:00:00Z",
        ]);
        s[0].tags = vec!["keep".into(), "db".into()];
        s[1].tags = vec!["keep".into()];
        s[2].tags = vec!["db".into()];
        let p = |tags: &[&[&str]]| KeepPolicy {
            tags: tags
                .iter()
                .map(|g| g.iter().map(|t| t.to_string()).collect())
                .collect(),
            ..Default::default()
        };
        assert!(!p(&[&["keep"]]).is_empty());
        assert_eq!(kept(&p(&[&["keep"]]), &s), [1, 2, 4]);
        assert_eq!(kept(&p(&[&["keep", "db"]]), &s), [1, 4]);
        assert_eq!(kept(&p(&[&["keep", "db"], &["db"]]), &s), [1, 3, 4]);
        assert_eq!(kept(&p(&[&["none"]]), &s), [4]);
        let both = KeepPolicy {
            last: Some(1),
            ..p(&[&["db"]])
        };
        let v = apply(&both, &s);
        assert_eq!(v[0].reasons, ["last"]);
        assert_eq!(v[1].reasons, ["tag"]);
    }

    /// Outside QA: `backup --time` gave the latest snapshot an older time,
    /// and `--keep-last 1` forgot what `restore NAME` restores. The
    /// latest (highest number) is always kept.
    #[test]
    fn the_latest_snapshot_is_kept_whatever_its_time() {
        let s = snaps(&["2026-03-02T00:00:00Z", "2020-01-01T00:00:00Z"]);
        let last = KeepPolicy {
            last: Some(1),
            ..KeepPolicy::default()
        };
        assert_eq!(kept(&last, &s), [1, 2]);
        let v = apply(&last, &s);
        assert_eq!(v[1].reasons, ["latest"]);
        // In time order, nothing changes.
        let s = snaps(&["2020-01-01T00:00:00Z", "2026-03-02T00:00:00Z"]);
        assert_eq!(kept(&last, &s), [2]);
    }

    /// Two snapshots a day for ten days, 06:00 and 18:00.
    fn twice_daily() -> Vec<Dated> {
        let mut t = Vec::new();
        for d in 1..=10 {
            t.push(format!("2026-03-{d:02}T06:00:00Z"));
            t.push(format!("2026-03-{d:02}T18:00:00Z"));
        }
        let t: Vec<&str> = t.iter().map(String::as_str).collect();
        snaps(&t)
    }

    #[test]
    fn last_keeps_the_newest() {
        let s = twice_daily();
        let p = KeepPolicy {
            last: Some(3),
            ..Default::default()
        };
        assert_eq!(kept(&p, &s), vec![18, 19, 20]);
    }

    #[test]
    fn daily_keeps_the_newest_of_each_day() {
        let s = twice_daily();
        let p = KeepPolicy {
            daily: Some(3),
            ..Default::default()
        };
        // Days 10, 9, 8: their 18:00 snapshots (20, 18, 16).
        assert_eq!(kept(&p, &s), vec![16, 18, 20]);
    }

    #[test]
    fn an_unlimited_count_keeps_every_period() {
        let s = twice_daily();
        let p = KeepPolicy {
            daily: Some(u32::MAX),
            ..Default::default()
        };
        assert_eq!(kept(&p, &s), (1..=10).map(|d| 2 * d).collect::<Vec<u64>>());
        let all = KeepPolicy {
            last: Some(u32::MAX),
            ..Default::default()
        };
        assert_eq!(kept(&all, &s), (1..=20).collect::<Vec<u64>>());
    }

    #[test]
    fn rules_add_up_and_reasons_are_named() {
        let s = twice_daily();
        let p = KeepPolicy {
            last: Some(1),
            daily: Some(2),
            weekly: Some(2),
            ..Default::default()
        };
        // last: 20; daily: 20, 18; weekly (ISO weeks: Mar 9-10 is week
        // 11, Mar 2-8 week 10): 20 and day 8's 18:00 (16).
        assert_eq!(kept(&p, &s), vec![16, 18, 20]);
        let v = apply(&p, &s);
        assert_eq!(v[0].reasons, vec!["last", "daily", "weekly"]);
    }

    #[test]
    fn empty_periods_do_not_count() {
        // Gaps: days 1, 5 and 9 only.
        let s = snaps(&[
            "2026-03-01T10:00:00Z",
            "2026-03-05T10:00:00Z",
            "2026-03-09T10:00:00Z",
        ]);
        let p = KeepPolicy {
            daily: Some(2),
            ..Default::default()
        };
        assert_eq!(kept(&p, &s), vec![2, 3]);
    }

    #[test]
    fn within_counts_from_the_newest_snapshot() {
        let s = twice_daily();
        let p = KeepPolicy {
            within: Some(parse_span("2d").unwrap()),
            ..Default::default()
        };
        // Newest is day 10 18:00; less than 48 h before it: day 8 18:00
        // is exactly 48 h (not kept), day 9 06:00 on.
        assert_eq!(kept(&p, &s), vec![17, 18, 19, 20]);
    }

    #[test]
    fn within_longer_than_time_itself_keeps_everything() {
        let s = twice_daily();
        for within in ["292471208679y", "2562047788015216h"] {
            let p = KeepPolicy {
                within: Some(parse_span(within).unwrap()),
                ..Default::default()
            };
            assert_eq!(kept(&p, &s), (1..=20).collect::<Vec<_>>(), "{within}");
        }
    }

    #[test]
    fn monthly_and_yearly() {
        let s = snaps(&[
            "2024-12-31T23:00:00Z",
            "2025-01-15T00:00:00Z",
            "2025-06-01T00:00:00Z",
            "2025-06-20T00:00:00Z",
            "2026-02-01T00:00:00Z",
        ]);
        let monthly = KeepPolicy {
            monthly: Some(3),
            ..Default::default()
        };
        assert_eq!(kept(&monthly, &s), vec![2, 4, 5]);
        let yearly = KeepPolicy {
            yearly: Some(10),
            ..Default::default()
        };
        assert_eq!(kept(&yearly, &s), vec![1, 4, 5]);
    }

    /// restic's documentation of `forget` ("Removing snapshots according
    /// to a policy"): with daily backups for 100 years, `--keep-daily 7
    /// --keep-weekly 5 --keep-monthly 12 --keep-yearly 75` keeps the 7
    /// newest, then 4 more last-days-of-a-week (the 7 dailies already hold
    /// one), 11 or 12 last-days-of-a-month (as the weeklies cross a month
    /// or not) and the last days of 75 years; all else goes.
    #[test]
    fn restics_documented_hundred_years_of_dailies() {
        // Noon every day from 2000-01-01 (a Saturday) for 100 years, to
        // Sunday 2099-12-27: the doc's "4 more weeklies" holds when the
        // newest day ends an ISO week (else the 7 dailies hold the last
        // days of two weeks, and 3 more are kept).
        let start = at("2000-01-01T12:00:00Z");
        let days = 36_521i64;
        let s: Vec<Dated> = (0..days)
            .map(|d| Dated {
                snapshot: d as u64 + 1,
                created: start + d * 86_400,
                tags: Vec::new(),
            })
            .collect();
        let p = KeepPolicy {
            daily: Some(7),
            weekly: Some(5),
            monthly: Some(12),
            yearly: Some(75),
            ..Default::default()
        };
        let v = apply(&p, &s);
        let count = |r: &str| v.iter().filter(|x| x.reasons.contains(&r)).count();
        assert_eq!(count("daily"), 7);
        assert_eq!(count("weekly"), 5);
        assert_eq!(count("monthly"), 12);
        assert_eq!(count("yearly"), 75);
        let kept: Vec<&Verdict> = v.iter().filter(|x| x.keep()).collect();
        let newest = days as u64;
        // The 7 newest are the dailies.
        for n in newest - 6..=newest {
            assert!(kept.iter().any(|x| x.snapshot.snapshot == n), "{n}");
        }
        let only = |r: &str, not: &[&str]| {
            kept.iter()
                .filter(|x| x.reasons.contains(&r) && !not.iter().any(|o| x.reasons.contains(o)))
                .count()
        };
        assert_eq!(only("weekly", &["daily"]), 4);
        let monthly = only("monthly", &["daily", "weekly"]);
        assert!(monthly == 11 || monthly == 12, "{monthly}");
        // Every yearly one is the last day of its year (Dec 31), but the
        // newest year's, which is the newest snapshot.
        for x in kept.iter().filter(|x| x.reasons.contains(&"yearly")) {
            let n = x.snapshot.snapshot;
            let next_is_new_year = n == newest || {
                let (y1, _) = year_and_day(x.snapshot.created);
                let (y2, _) = year_and_day(x.snapshot.created + 86_400);
                y1 != y2
            };
            assert!(next_is_new_year, "snapshot {n} is not its year's last");
        }
        assert_eq!(
            kept.len(),
            7 + 4 + monthly + only("yearly", &["daily", "weekly", "monthly"]),
            "nothing else is kept"
        );
        assert!(kept.len() < 100, "{} kept", kept.len());
    }

    /// The UTC year and day of year of a Unix time (for the test above).
    fn year_and_day(t: i64) -> (i64, i64) {
        let mut days = t.div_euclid(86_400);
        let mut y = 1970;
        loop {
            let len = if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 {
                366
            } else {
                365
            };
            if days < len {
                return (y, days);
            }
            days -= len;
            y += 1;
        }
    }

    #[test]
    fn an_empty_policy_is_empty() {
        assert!(KeepPolicy::default().is_empty());
        assert!(KeepPolicy {
            last: Some(0),
            ..Default::default()
        }
        .is_empty());
        assert!(!KeepPolicy {
            within: Some(parse_span("1h").unwrap()),
            ..Default::default()
        }
        .is_empty());
        assert!(!KeepPolicy {
            within_weekly: Some(parse_span("1m").unwrap()),
            ..Default::default()
        }
        .is_empty());
    }

    /// A span is counted back on the calendar as restic's Go does:
    /// months first, a day past the month's end carried over, then days
    /// and hours.
    #[test]
    fn spans_count_back_on_the_calendar_as_restic_does() {
        let back = |from: &str, span: &str| {
            format_time(parse_span(span).unwrap().before(at(from)).unwrap())
        };
        // February 2024 has 29 days: its "31st" is 2 March.
        assert_eq!(
            back("2024-03-31T12:00:00Z", "1m"),
            "2024-03-02 12:00:00 UTC"
        );
        assert_eq!(
            back("2023-03-31T12:00:00Z", "1m"),
            "2023-03-03 12:00:00 UTC"
        );
        assert_eq!(
            back("2024-08-01T00:00:00Z", "1m"),
            "2024-07-01 00:00:00 UTC"
        );
        assert_eq!(
            back("2024-03-01T00:00:00Z", "1m"),
            "2024-02-01 00:00:00 UTC"
        );
        // 29 February less a year is 1 March (28 February's next day).
        assert_eq!(
            back("2024-02-29T06:00:00Z", "1y"),
            "2023-03-01 06:00:00 UTC"
        );
        // Months past a year carry into years; days past the month's
        // start go back into the month before.
        assert_eq!(
            back("2024-01-15T00:00:00Z", "13m"),
            "2022-12-15 00:00:00 UTC"
        );
        assert_eq!(
            back("2024-03-05T00:00:00Z", "10d"),
            "2024-02-24 00:00:00 UTC"
        );
        assert_eq!(
            back("2024-03-01T01:00:00Z", "1d2h"),
            "2024-02-28 23:00:00 UTC"
        );
        assert_eq!(
            back("2024-03-31T00:00:00Z", "1m1d"),
            "2024-03-01 00:00:00 UTC"
        );
        // Past the calendar's start: nothing is before it.
        assert_eq!(parse_span("999999999y").unwrap().before(0), None);
    }

    /// `within-daily` keeps the newest of each day inside its span, with
    /// no count; days outside it keep nothing.
    #[test]
    fn within_daily_keeps_each_days_newest_inside_the_span() {
        let s = twice_daily();
        let p = KeepPolicy {
            within_daily: Some(parse_span("3d").unwrap()),
            ..Default::default()
        };
        // Newest day 10 18:00; from day 7 18:00 (exclusive): day 8, 9, 10's
        // 18:00 are each day's newest.
        assert_eq!(kept(&p, &s), vec![16, 18, 20]);
        let reasons: Vec<_> = apply(&p, &s)
            .into_iter()
            .filter(Verdict::keep)
            .map(|v| v.reasons)
            .collect();
        assert!(
            reasons.iter().all(|r| r == &["within-daily"]),
            "{reasons:?}"
        );
        let p = KeepPolicy {
            within_weekly: Some(parse_span("1m").unwrap()),
            ..Default::default()
        };
        // 1-10 March 2026: ISO week 9 ends on Sunday 1 March, week 10 on
        // the 8th, week 11 from the 9th.
        assert_eq!(kept(&p, &s), vec![2, 16, 20]);
    }

    #[test]
    fn durations_and_times_parse_or_fail_clearly() {
        let span = |years, months, days, hours| CalendarSpan {
            years,
            months,
            days,
            hours,
        };
        assert_eq!(parse_span("1y2m3d4h").unwrap(), span(1, 2, 3, 4));
        assert_eq!(parse_span("36h").unwrap(), span(0, 0, 0, 36));
        assert_eq!(parse_span("2h1d").unwrap(), span(0, 0, 1, 2));
        for bad in [
            "",
            "5",
            "3x",
            "d",
            "99999999999999999999y",
            "1y1y",
            "1d2h3d",
            "0d",
            "0y0h",
        ] {
            assert!(parse_span(bad).is_err(), "{bad}");
        }
        assert_eq!(at("2026-01-01T00:00:00Z"), 1_767_225_600);
        assert_eq!(at("2026-01-01 00:00:00"), 1_767_225_600);
        assert_eq!(at("2026-01-01"), 1_767_225_600);
        assert_eq!(at("@1767225600"), 1_767_225_600);
        assert!(parse_time("yesterday").is_err());
        assert!(
            parse_time("@99999999999999999").is_err(),
            "beyond the calendar"
        );
    }
}
