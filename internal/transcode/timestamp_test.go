package transcode

import (
	"math/rand"
	"testing"
	"time"
)

// timeFormat is what appendTimestamp replaces: the time package's
// formatter.
func timeFormat(secs, nanos int64) string {
	return time.Unix(secs, nanos).UTC().Format("2006-01-02T15:04:05.000000000")
}

// TestAppendTimestampIsTimeFormat: the edges of the range, of eras,
// centuries, leap days and days, then random instants, written as the
// time package writes them.
func TestAppendTimestampIsTimeFormat(t *testing.T) {
	secs := []int64{minTimestampSeconds, maxTimestampSeconds, 0, -1, 1, 86399, 86400, -86400, -86401,
		951782400, 951868800, 4107542400, 4107628800, -2203977600, -62135596799, 253402300798,
		-12219292800, 946684799, 946684800, 68256000, 1709164800, 1709251199}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 200000; i++ {
		secs = append(secs, minTimestampSeconds+r.Int63n(maxTimestampSeconds-minTimestampSeconds+1))
	}
	for _, s := range secs {
		for _, n := range []int64{0, 1, 999999999, 120000000, int64(r.Int31n(1e9))} {
			got := string(appendTimestamp([]byte("x"), s, n))
			if want := "x" + timeFormat(s, n); got != want {
				t.Fatalf("appendTimestamp(%d, %d) = %q, want %q", s, n, got, want)
			}
		}
	}
}

// TestParseTimestampUTCIsTimeParse: what the time package writes,
// parseTimestampUTC reads (every fraction length), as the time package
// reads it; and the strings near that form that it leaves to the
// general parser or reads as it does.
func TestParseTimestampUTCIsTimeParse(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	layouts := []string{"2006-01-02T15:04:05Z", "2006-01-02T15:04:05.0Z", "2006-01-02T15:04:05.000Z",
		"2006-01-02T15:04:05.00000Z", "2006-01-02T15:04:05.000000Z", "2006-01-02T15:04:05.000000000Z"}
	for i := 0; i < 100000; i++ {
		s := minTimestampSeconds + r.Int63n(maxTimestampSeconds-minTimestampSeconds+1)
		text := time.Unix(s, int64(r.Int31n(1e9))).UTC().Format(layouts[i%len(layouts)])
		secs, nanos, ok := parseTimestampUTC(text)
		ws, wn, wok := parseTimestampGeneral(text)
		if !ok || !wok || secs != ws || nanos != wn {
			t.Fatalf("%q: parseTimestampUTC = %d %d %v, time.Parse = %d %d %v", text, secs, nanos, ok, ws, wn, wok)
		}
	}
	for _, text := range []string{
		"2024-02-29T00:00:00Z", "2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2000-02-29T23:59:59Z",
		"2024-04-31T00:00:00Z", "2024-13-01T00:00:00Z", "2024-00-01T00:00:00Z", "2024-01-00T00:00:00Z",
		"2024-01-01T24:00:00Z", "2024-01-01T23:60:00Z", "2024-01-01T23:59:60Z", "0000-01-01T00:00:00Z",
		"0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "2024-01-01T00:00:00.Z",
		"2024-01-01T00:00:00.1234567890Z", "2024-01-01T00:00:00z", "2024-01-01t00:00:00Z",
		"2024-01-01T00:00:00+01:00", "2024-01-01T00:00:00.5-07:30", "+024-01-01T00:00:00Z",
		"2024-1-01T00:00:00Z", "2024-01-01T00:00:0aZ", "2024-01-01T00:00:00.1a2Z", "2024-01-01 00:00:00Z",
	} {
		checkTimestampText(t, text)
	}
}

// checkTimestampText: when parseTimestampUTC reads text, it reads what
// the general parser reads.
func checkTimestampText(t *testing.T, text string) {
	t.Helper()
	secs, nanos, ok := parseTimestampUTC(text)
	if !ok {
		return
	}
	ws, wn, wok := parseTimestampGeneral(text)
	if !wok || secs != ws || nanos != wn {
		t.Fatalf("%q: parseTimestampUTC = %d %d, time.Parse = %d %d %v", text, secs, nanos, ws, wn, wok)
	}
}

func FuzzParseTimestampUTC(f *testing.F) {
	for _, s := range []string{"2024-02-29T00:00:00Z", "0001-01-01T00:00:00.000000001Z", "9999-12-31T23:59:59.5Z"} {
		f.Add(s)
	}
	f.Fuzz(checkTimestampText)
}

func FuzzAppendTimestamp(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(minTimestampSeconds), int64(999999999))
	f.Fuzz(func(t *testing.T, s, n int64) {
		if s < minTimestampSeconds || s > maxTimestampSeconds || n < 0 || n > maxNanos {
			return
		}
		if got, want := string(appendTimestamp(nil, s, n)), timeFormat(s, n); got != want {
			t.Fatalf("appendTimestamp(%d, %d) = %q, want %q", s, n, got, want)
		}
	})
}

// The two against the time package's, hot; the call path pays them cold
// (bench_test.go's Cold benchmarks show the whole message's).
func BenchmarkTimestampFormat(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.Run("ours", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf = appendTimestamp(buf[:0], 1709164800+int64(i), 123456789)
		}
	})
	b.Run("time", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf = time.Unix(1709164800+int64(i), 123456789).UTC().AppendFormat(buf[:0], "2006-01-02T15:04:05.000000000")
		}
	})
}

func BenchmarkTimestampParse(b *testing.B) {
	const s = "2024-02-29T12:34:56.123456789Z"
	b.Run("ours", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			parseTimestamp(s)
		}
	})
	b.Run("time", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			parseTimestampGeneral(s)
		}
	})
}
