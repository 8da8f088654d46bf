package scalar

import "time"

// TimePattern is the shape of the timestamps usage events and signals carry,
// as the JSON Schemas state it next to "format": "date-time". It is RFC 3339's
// date-time narrowed to what every consumer handles identically: upper-case
// T and Z, no leap second, at most nine fractional digits (nanoseconds), and
// a year from 1970 to 2105 (ClickHouse's DateTime ends in February 2106;
// schemas.MaxEventTimeText).
const TimePattern = `^(19[7-9][0-9]|20[0-9]{2}|210[0-5])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`

// ParseTime parses an RFC 3339 timestamp of the shape TimePattern describes
// and returns it in UTC. On failure it returns the reason for a
// schemas.FieldError instead.
//
// It exists because time.Parse is more lenient than RFC 3339 in ways the
// JSON Schema is not (a comma before the fraction, any number of fractional
// digits) and allocates a time.Location for every non-UTC offset; converting
// to UTC here allocates nothing.
func ParseTime(s string) (time.Time, string) {
	const shape = "is not an RFC 3339 timestamp like 2024-05-01T12:00:00Z or 2024-05-01T14:00:00.123+02:00"
	if len(s) < len("2006-01-02T15:04:05Z") {
		return time.Time{}, shape
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	sec, ok6 := digits(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, shape
	}
	if year < 1970 {
		return time.Time{}, "has a year before 1970; send the time the request finished"
	}
	if year > 2105 {
		// As written, like TimePattern; the UTC check after the offset is
		// schemas.CheckEventTime's.
		return time.Time{}, "has a year after 2105, where Sluice's storage ends (ClickHouse DateTime); check the gateway's clock"
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) {
		return time.Time{}, "is not a calendar date"
	}
	if hour > 23 || minute > 59 {
		return time.Time{}, "is not a time of day"
	}
	if sec > 59 {
		return time.Time{}, "has second 60 or more; leap seconds are not accepted, send :59"
	}
	rest := s[19:]
	nsec := 0
	if rest != "" && rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		ndig := n - 1
		if ndig == 0 || ndig > 9 {
			return time.Time{}, "has a fraction of a second that is not 1 to 9 digits"
		}
		for i := 1; i < n; i++ {
			nsec = nsec*10 + int(rest[i]-'0')
		}
		for i := ndig; i < 9; i++ {
			nsec *= 10
		}
		rest = rest[n:]
	}
	var offset int // seconds east of UTC
	switch {
	case rest == "Z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, okh := digits(rest[1:3])
		om, okm := digits(rest[4:6])
		if !okh || !okm || oh > 23 || om > 59 {
			return time.Time{}, "has a UTC offset that is not +hh:mm or -hh:mm"
		}
		offset = oh*3600 + om*60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, shape
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if offset != 0 {
		t = t.Add(-time.Duration(offset) * time.Second)
	}
	return t, ""
}

// digits parses a run of ASCII digits.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// daysIn is the number of days of month in year, leap years included.
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
