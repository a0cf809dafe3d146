package transcode

// A google.protobuf.Timestamp crosses as RFC 3339 text in UTC on every
// call that carries one. The time package's general parser and
// formatter (a layout interpreter) spend their time on code and tables
// the call path does not otherwise touch, which a sequential call finds
// out of cache; these two do the one form in straight-line arithmetic
// (the civil-date conversion of H. Hinnant, "chrono-Compatible Low-Level
// Date Algorithms"). Their results equal the time package's
// (timestamp_test.go checks it, and fuzzes it).

// appendTimestamp appends secs and nanos (within the Timestamp range:
// years 1 to 9999, nanos in [0, 1e9)) as "2006-01-02T15:04:05" and nine
// fraction digits, which the caller trims (trimNanos).
func appendTimestamp(out []byte, secs int64, nanos int64) []byte {
	days := secs / 86400
	sod := secs - days*86400
	if sod < 0 {
		days--
		sod += 86400
	}
	y, m, d := civilFromDays(days)
	out = append4(out, int(y))
	out = append(out, '-')
	out = append2(out, m)
	out = append(out, '-')
	out = append2(out, d)
	out = append(out, 'T')
	out = append2(out, int(sod/3600))
	out = append(out, ':')
	out = append2(out, int(sod/60%60))
	out = append(out, ':')
	out = append2(out, int(sod%60))
	out = append(out, '.')
	n := len(out)
	out = append(out, "000000000"...)
	for i, v := n+8, nanos; i >= n; i-- {
		out[i] = byte('0' + v%10)
		v /= 10
	}
	return out
}

func append2(out []byte, v int) []byte {
	return append(out, byte('0'+v/10), byte('0'+v%10))
}

func append4(out []byte, v int) []byte {
	return append(out, byte('0'+v/1000), byte('0'+v/100%10), byte('0'+v/10%10), byte('0'+v%10))
}

// civilFromDays is the proleptic Gregorian date of days since
// 1970-01-01.
func civilFromDays(z int64) (y int64, m, d int) {
	z += 719468
	era := z
	if era < 0 {
		era -= 146096
	}
	era /= 146097
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	if mp < 10 {
		m = int(mp + 3)
	} else {
		m = int(mp - 9)
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

// daysFromCivil is civilFromDays' inverse.
func daysFromCivil(y int64, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := y
	if era < 0 {
		era -= 399
	}
	era /= 400
	yoe := y - era*400
	mm := int64(m)
	if mm > 2 {
		mm -= 3
	} else {
		mm += 9
	}
	doy := (153*mm+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// parseTimestampUTC reads the form a Timestamp is written in,
// "2006-01-02T15:04:05Z" with one to nine fraction digits or none;
// false for anything else (an offset, year 0, a leap second...), which
// the general parser then judges.
func parseTimestampUTC(s string) (secs int64, nanos int32, ok bool) {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return 0, 0, false
	}
	y, ok1 := decimal(s[0:4])
	mo, ok2 := decimal(s[5:7])
	d, ok3 := decimal(s[8:10])
	h, ok4 := decimal(s[11:13])
	mi, ok5 := decimal(s[14:16])
	sec, ok6 := decimal(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || y < 1 || mo < 1 || mo > 12 || d < 1 ||
		d > daysIn(mo, y) || h > 23 || mi > 59 || sec > 59 {
		return 0, 0, false
	}
	if frac := s[19 : len(s)-1]; frac != "" {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return 0, 0, false
		}
		f, ok := decimal(frac[1:])
		if !ok {
			return 0, 0, false
		}
		for i := len(frac) - 1; i < 9; i++ {
			f *= 10
		}
		nanos = int32(f)
	}
	secs = daysFromCivil(int64(y), mo, d)*86400 + int64(h*3600+mi*60+sec)
	return secs, nanos, true
}

// decimal is s as a decimal number; false unless s is all digits (and
// not empty).
func decimal(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	v := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

func daysIn(m, y int) int {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
