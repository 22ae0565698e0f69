//! Epoch milliseconds as the words of an explanation, in UTC: `10:03` for a time and `Dec 8`
//! for a day. UTC because the runtime knows no time zone; the structured facts carry the epoch
//! milliseconds for an application to show in its own.

use courier_engine::Millis;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

const DAY_MS: u64 = 86_400_000;

/// `HH:MM` UTC.
pub fn clock(at: Millis) -> String {
    let minutes = (at % DAY_MS) / 60_000;
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

/// `Mon D` (UTC), e.g. `Dec 8`.
pub fn day(at: Millis) -> String {
    let (_, month, day) = civil(at / DAY_MS);
    format!("{} {day}", MONTHS[(month - 1) as usize])
}

/// `HH:MM`, prefixed by the day when it is not the day of `now`.
pub fn when(at: Millis, now: Millis) -> String {
    if at / DAY_MS == now / DAY_MS {
        clock(at)
    } else {
        format!("{} {}", day(at), clock(at))
    }
}

/// A duration in the largest unit that keeps it readable: `850 ms`, `12 s`, `4 min`, `3 h`.
pub fn span(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=119_999 => format!("{} s", ms / 1_000),
        120_000..=7_199_999 => format!("{} min", ms / 60_000),
        _ => format!("{} h", ms / 3_600_000),
    }
}

/// (year, month 1..=12, day 1..=31) of the day `days` after 1970-01-01, by Howard Hinnant's
/// `civil_from_days`.
fn civil(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_utc_clock_and_day() {
        // 2026-12-08T10:03:00Z
        let at = 1_796_724_180_000;
        assert_eq!(clock(at), "10:03");
        assert_eq!(day(at), "Dec 8");
        assert_eq!(when(at, at + 60_000), "10:03");
        assert_eq!(when(at, at + DAY_MS), "Dec 8 10:03");
        assert_eq!(day(0), "Jan 1");
        assert_eq!(day(951_782_400_000), "Feb 29", "2000-02-29");
    }

    #[test]
    fn spans_pick_a_readable_unit() {
        assert_eq!(span(850), "850 ms");
        assert_eq!(span(12_400), "12 s");
        assert_eq!(span(240_000), "4 min");
        assert_eq!(span(3 * 3_600_000), "3 h");
    }
}
