package bridge

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lineSink collects what the runtime logs.
type lineSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *lineSink) take(level uint32, line string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, string(rune('0'+level))+" "+line)
	return true
}

func (s *lineSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

func TestLogLinesAndLevels(t *testing.T) {
	for _, tc := range []struct {
		l    slog.Level
		want uint32
	}{
		{slog.LevelError, NgxLogErr}, {slog.LevelError + 4, NgxLogErr},
		{slog.LevelWarn, NgxLogWarn}, {slog.LevelInfo, NgxLogNotice},
		{slog.LevelInfo - 2, NgxLogInfo}, {slog.LevelDebug, NgxLogDebug},
	} {
		if got := ngxLevel(tc.l); got != tc.want {
			t.Errorf("ngxLevel(%v) = %d, want %d", tc.l, got, tc.want)
		}
	}
	var sink lineSink
	r := New(newGoMemory(t), sink.take)
	r.Logger().WithGroup("g").With("addr", "127.0.0.1:1").Warn("qrpc something happened", "err", "boom now", "n", 3)
	r.Logger().Debug("qrpc quiet")
	want := `5 qrpc: something happened g.addr=127.0.0.1:1 g.err="boom now" g.n=3`
	if got := sink.all(); len(got) != 1 || got[0] != want {
		t.Fatalf("lines %q, want [%q]", got, want)
	}
	if err := r.ApplyHostConfig("log_level=debug"); err != nil {
		t.Fatal(err)
	}
	r.Logger().Debug("qrpc loud", "s", slog.GroupValue(slog.String("k", "v")))
	if got := sink.all(); len(got) != 2 || got[1] != "8 qrpc: loud s.k=v" {
		t.Fatalf("after log_level=debug: %q", got)
	}
	for _, bad := range []string{"log_level=loud", "colour=blue"} {
		if err := r.ApplyHostConfig(bad); err == nil || !strings.HasPrefix(err.Error(), "cfg: ") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
