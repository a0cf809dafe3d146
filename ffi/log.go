package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// nginx log levels (NGX_LOG_*).
const (
	ngxLogErr    = 4
	ngxLogWarn   = 5
	ngxLogNotice = 6
	ngxLogInfo   = 7
	ngxLogDebug  = 8
)

// ngxLevel maps slog levels to nginx's. slog's Info becomes NOTICE: nginx's
// own "info" is per-client-connection chatter that operators rarely enable,
// and the client's Info lines (a connection re-established) belong next to
// its warnings.
func ngxLevel(l slog.Level) uint32 {
	switch {
	case l >= slog.LevelError:
		return ngxLogErr
	case l >= slog.LevelWarn:
		return ngxLogWarn
	case l >= slog.LevelInfo:
		return ngxLogNotice
	case l > slog.LevelDebug:
		return ngxLogInfo
	}
	return ngxLogDebug
}

func ngxLevelName(l uint32) string {
	switch l {
	case ngxLogErr:
		return "error"
	case ngxLogWarn:
		return "warn"
	case ngxLogNotice:
		return "notice"
	case ngxLogInfo:
		return "info"
	}
	return "debug"
}

// minLogLevel filters what the handler formats at all (libffi_init's cfg
// can lower it with log_level=debug).
var minLogLevel atomic.Int64

func init() { minLogLevel.Store(int64(slog.LevelInfo)) }

// logHandler formats records as one line, "qrpc: msg key=value ...", and
// sends it to nginx: through the completion queue when the built-in host
// is open (the dispatcher ngx.log()s it), else to stderr, which nginx
// points at its error log. Callers never pass request or response bodies.
type logHandler struct {
	attrs string // pre-formatted WithAttrs
	group string // dotted prefix for keys
}

func newLogHandler() *logHandler { return &logHandler{} }

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool {
	return int64(l) >= minLogLevel.Load()
}

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString("qrpc: ")
	sb.WriteString(strings.TrimPrefix(r.Message, "qrpc "))
	sb.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		appendAttr(&sb, h.group, a)
		return true
	})
	emitLog(ngxLevel(r.Level), sb.String())
	return nil
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var sb strings.Builder
	sb.WriteString(h.attrs)
	for _, a := range as {
		appendAttr(&sb, h.group, a)
	}
	return &logHandler{attrs: sb.String(), group: h.group}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logHandler{attrs: h.attrs, group: h.group + name + "."}
}

func appendAttr(sb *strings.Builder, group string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		g := group
		if a.Key != "" {
			g += a.Key + "."
		}
		for _, ga := range a.Value.Group() {
			appendAttr(sb, g, ga)
		}
		return
	}
	sb.WriteByte(' ')
	sb.WriteString(group)
	sb.WriteString(a.Key)
	sb.WriteByte('=')
	v := a.Value.String()
	if v == "" || strings.ContainsAny(v, " =\"\n\t") {
		v = strconv.Quote(v)
	}
	sb.WriteString(v)
}

// emitLog routes one line; it never blocks on the network.
func emitLog(level uint32, line string) {
	line = strings.ReplaceAll(line, "\n", " ")
	if builtin.pushLog(level, line) {
		return
	}
	stderrLog(level, line)
}

// stderrLog writes a line shaped like nginx's own, in one write(2) so that
// lines from several threads do not interleave.
func stderrLog(level uint32, line string) {
	msg := fmt.Sprintf("%s [%s] %d#0: %s\n", time.Now().Format("2006/01/02 15:04:05"),
		ngxLevelName(level), os.Getpid(), line)
	_, _ = os.Stderr.WriteString(msg)
}
