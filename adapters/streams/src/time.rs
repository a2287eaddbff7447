//! Simplestreams times: `updated` as Juju writes it (Go's `time.RFC1123Z`,
//! `Thu, 01 Jan 1970 00:00:00 +0000`) and the `YYYYMMDD` keys of product versions.
//!
//! The crate reads no clock: every function takes or returns seconds since the Unix epoch.

/// Seconds in one day.
const DAY_SECONDS: u64 = 86_400;

/// The latest year accepted, to keep every computation far from overflow.
const YEAR_MAX: i64 = 9999;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

/// Parses `Mon, 02 Jan 2006 15:04:05 -0700` (RFC 1123 with a numeric zone, Go's
/// `RFC1123Z`), also with the zone written `GMT` or `UTC` (Go's `RFC1123`). Returns seconds
/// since the Unix epoch; `None` for anything else or for a time before 1970.
/// The day of the week is checked for shape only, as Go does.
pub fn parse_rfc1123(text: &str) -> Option<u64> {
    let mut parts = text.split(' ');
    let weekday = parts.next()?;
    let day = parts.next()?;
    let month = parts.next()?;
    let year = parts.next()?;
    let clock = parts.next()?;
    let zone = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let weekday = weekday.strip_suffix(',')?;
    if !WEEKDAYS.contains(&weekday) {
        return None;
    }
    let day = digits(day, 2)?;
    let month = i64::try_from(MONTHS.iter().position(|name| *name == month)? + 1).ok()?;
    let year = digits(year, 4)?;
    let mut clock_parts = clock.split(':');
    let hour = digits(clock_parts.next()?, 2)?;
    let minute = digits(clock_parts.next()?, 2)?;
    let second = digits(clock_parts.next()?, 2)?;
    if clock_parts.next().is_some() {
        return None;
    }
    if !(1..=days_in_month(year, month)).contains(&day) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let offset_seconds = match zone {
        "GMT" | "UTC" => 0,
        _ => {
            let (sign, rest) = match zone.as_bytes().first()? {
                b'+' => (1, &zone[1..]),
                b'-' => (-1, &zone[1..]),
                _ => return None,
            };
            if rest.len() != 4 {
                return None;
            }
            let hours = digits(&rest[..2], 2)?;
            let minutes = digits(&rest[2..], 2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            sign * (hours * 3600 + minutes * 60)
        }
    };
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(local - offset_seconds).ok()
}

/// Formats seconds since the epoch as Juju writes `updated`:
/// `Thu, 01 Jan 1970 00:00:00 +0000`.
pub fn format_rfc1123(unix_seconds: u64) -> String {
    let (year, month, day) = civil_from_days(unix_seconds / DAY_SECONDS);
    let weekday = WEEKDAYS[usize::try_from((unix_seconds / DAY_SECONDS + 4) % 7).unwrap_or(0)];
    let in_day = unix_seconds % DAY_SECONDS;
    format!(
        "{weekday}, {day:02} {} {year:04} {:02}:{:02}:{:02} +0000",
        MONTHS[usize::try_from(month - 1).unwrap_or(0)],
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60
    )
}

/// Formats the date as the `YYYYMMDD` key Juju gives a product version.
pub fn format_yyyymmdd(unix_seconds: u64) -> String {
    let (year, month, day) = civil_from_days(unix_seconds / DAY_SECONDS);
    format!("{year:04}{month:02}{day:02}")
}

fn digits(text: &str, length: usize) -> Option<i64> {
    if text.len() != length || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    assert!((1..=12).contains(&month) && (1..=31).contains(&day));
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of `days_from_civil`), clamped to
/// [`YEAR_MAX`].
fn civil_from_days(days: u64) -> (i64, i64, i64) {
    let days = i64::try_from(days)
        .unwrap_or(i64::MAX)
        .min(days_from_civil(YEAR_MAX, 12, 31));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_times_juju_writes() {
        let cases: &[(&str, Option<u64>)] = &[
            ("Thu, 01 Jan 1970 00:00:00 +0000", Some(0)),
            ("Thu, 12 Mar 2015 09:41:17 +0000", Some(1426153277)),
            ("Tue, 03 Nov 2026 18:22:05 +0000", Some(1793730125)),
            ("Tue, 03 Nov 2026 20:22:05 +0200", Some(1793730125)),
            ("Tue, 03 Nov 2026 13:22:05 -0500", Some(1793730125)),
            ("Tue, 03 Nov 2026 18:22:05 GMT", Some(1793730125)),
            ("Thu, 29 Feb 2024 23:59:59 +0000", Some(1_709_251_199)),
            ("Thu, 01 Jan 1970 00:00:00 +0100", None), // before the epoch
            ("Fri, 29 Feb 2023 00:00:00 +0000", None), // no such day
            ("Thu, 1 Jan 1970 00:00:00 +0000", None),
            ("Thu 01 Jan 1970 00:00:00 +0000", None),
            ("Thu, 01 Jan 1970 00:00:00", None),
            ("Thu, 01 Jan 1970 24:00:00 +0000", None),
            ("Thu, 01 Foo 1970 00:00:00 +0000", None),
            ("2026-11-03T18:22:05Z", None),
            ("20261103", None),
            ("", None),
        ];
        for &(text, expected) in cases {
            assert_eq!(parse_rfc1123(text), expected, "{text:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for seconds in [0, 1_367_415_086, 1793730125, 1_709_251_199, 4_102_444_800] {
            let text = format_rfc1123(seconds);
            assert_eq!(parse_rfc1123(&text), Some(seconds), "{text}");
        }
        assert_eq!(format_rfc1123(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(
            format_rfc1123(1793730125),
            "Tue, 03 Nov 2026 18:22:05 +0000"
        );
        assert_eq!(format_yyyymmdd(1793730125), "20261103");
        assert_eq!(format_yyyymmdd(0), "19700101");
    }
}
