//! `strftime_now(fmt)`, the global `transformers` gives chat templates: the current time
//! formatted with Python's `strftime` directives (in UTC here).

use std::fmt::Write as _;

/// Days since 1970-01-01 → (year, month 1-12, day 1-31) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `strftime_now(fmt)`: the current time (UTC) formatted with Python's `strftime`
/// directives `%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`; other directives are kept.
pub(super) fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format_time(fmt, secs)
}

fn format_time(fmt: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS.get(mo as usize - 1).copied().unwrap_or("");
    let day_name = DAYS.get(weekday).copied().unwrap_or("");
    let year_start = {
        // days since epoch of January 1st of year y
        let mut probe = days - 366;
        while civil_from_days(probe + 1).0 < y {
            probe += 1;
        }
        while civil_from_days(probe).0 >= y {
            probe -= 1;
        }
        probe + 1
    };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(dir) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match dir {
            'Y' => write!(out, "{y}"),
            'y' => write!(out, "{:02}", y.rem_euclid(100)),
            'm' => write!(out, "{mo:02}"),
            'd' => write!(out, "{d:02}"),
            'e' => write!(out, "{d:>2}"),
            'H' => write!(out, "{h:02}"),
            'I' => write!(out, "{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            'M' => write!(out, "{mi:02}"),
            'S' => write!(out, "{s:02}"),
            'p' => write!(out, "{}", if h < 12 { "AM" } else { "PM" }),
            'B' => write!(out, "{month}"),
            'b' => write!(out, "{}", month.get(..3).unwrap_or("")),
            'A' => write!(out, "{day_name}"),
            'a' => write!(out, "{}", day_name.get(..3).unwrap_or("")),
            'j' => write!(out, "{:03}", days - year_start + 1),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formatting() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 (Python strftime)
        let t = 1_722_000_309;
        assert_eq!(
            format_time("%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%", t),
            "2024-07-26 13:25:09 Fri Friday Jul July 208 24 01PM %"
        );
        assert_eq!(format_time("%d %b %Y", 0), "01 Jan 1970");
    }
}
