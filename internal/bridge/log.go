package bridge

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
	NgxLogErr    = 4
	NgxLogWarn   = 5
	NgxLogNotice = 6
	NgxLogInfo   = 7
	NgxLogDebug  = 8
)

// LogSink takes one formatted line at an nginx level; false when it
// cannot (the built-in host is not open), then the line goes to stderr,
// which nginx points at its error log. It must not block on the network.
type LogSink func(level uint32, line string) bool

// ngxLevel maps slog levels to nginx's. slog's Info becomes NOTICE: nginx's
// own "info" is per-client-connection chatter that operators rarely enable,
// and the client's Info lines (a connection re-established) belong next to
// its warnings.
func ngxLevel(l slog.Level) uint32 {
	switch {
	case l >= slog.LevelError:
		return NgxLogErr
	case l >= slog.LevelWarn:
		return NgxLogWarn
	case l >= slog.LevelInfo:
		return NgxLogNotice
	case l > slog.LevelDebug:
		return NgxLogInfo
	}
	return NgxLogDebug
}

func ngxLevelName(l uint32) string {
	switch l {
	case NgxLogErr:
		return "error"
	case NgxLogWarn:
		return "warn"
	case NgxLogNotice:
		return "notice"
	case NgxLogInfo:
		return "info"
	}
	return "debug"
}

// logHandler formats records as one line, "qrpc: msg key=value ...", and
// sends it to nginx through the sink (the built-in host's completion
// queue, whose dispatcher ngx.log()s it) or else stderr. Callers never
// pass request or response bodies.
type logHandler struct {
	level *atomic.Int64 // the lowest level formatted at all (Runtime.SetLogLevel)
	sink  LogSink
	attrs string // pre-formatted WithAttrs
	group string // dotted prefix for keys
}

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool {
	return int64(l) >= h.level.Load()
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
	h.emit(ngxLevel(r.Level), sb.String())
	return nil
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var sb strings.Builder
	sb.WriteString(h.attrs)
	for _, a := range as {
		appendAttr(&sb, h.group, a)
	}
	return &logHandler{level: h.level, sink: h.sink, attrs: sb.String(), group: h.group}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logHandler{level: h.level, sink: h.sink, attrs: h.attrs, group: h.group + name + "."}
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

// emit routes one line; it never blocks on the network.
func (h *logHandler) emit(level uint32, line string) {
	line = strings.ReplaceAll(line, "\n", " ")
	if h.sink != nil && h.sink(level, line) {
		return
	}
	StderrLog(level, line)
}

// StderrLog writes a line shaped like nginx's own, in one write(2) so that
// lines from several threads do not interleave.
func StderrLog(level uint32, line string) {
	msg := fmt.Sprintf("%s [%s] %d#0: %s\n", time.Now().Format("2006/01/02 15:04:05"),
		ngxLevelName(level), os.Getpid(), line)
	_, _ = os.Stderr.WriteString(msg)
}

// ApplyHostConfig reads libffi_init's cfg: space- or comma-separated
// key=value pairs. Only log_level (debug|info|warn|error) exists.
func (r *Runtime) ApplyHostConfig(cfg string) error {
	for _, kv := range strings.FieldsFunc(cfg, func(r rune) bool { return r == ' ' || r == ',' }) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "log_level":
			var l slog.Level
			if err := l.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("cfg: log_level: %w", err)
			}
			r.SetLogLevel(l)
		default:
			return fmt.Errorf("cfg: unknown key %q (known: log_level)", k)
		}
	}
	return nil
}

// reportPanic is safego's reporter: one error line per recovered panic,
// with where it happened, the value and the stack (compactStack), so that
// a bug found in production can be found in the code.
func (r *Runtime) reportPanic(where string, v any, stack []byte) {
	r.logger.Error("qrpc panic recovered", "where", where, "panic", fmt.Sprint(v), "stack", compactStack(stack))
}

// maxStackLen bounds the stack in a panic's line: nginx cuts an error
// log line at 2048 bytes, and the line has its prefix and the panic's
// value too.
const maxStackLen = 1400

// modulePrefix is this module's import path, left out of the stack's
// function names (every reader knows it).
const modulePrefix = "github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/"

// compactStack renders debug.Stack()'s text on one line, from the frame
// that panicked outwards: "pkg.Func file.go:123 < pkg.Caller file.go:45
// < ...". The frames of the recovery itself (debug.Stack, the deferred
// recover, runtime.gopanic) go: up to the panic( frame when there is one.
func compactStack(stack []byte) string {
	lines := strings.Split(strings.TrimSpace(string(stack)), "\n")
	if len(lines) > 0 && strings.HasPrefix(lines[0], "goroutine ") {
		lines = lines[1:]
	}
	var frames []string
	for i := 0; i+1 < len(lines); i += 2 {
		fn := strings.TrimSpace(lines[i])
		loc := strings.TrimSpace(lines[i+1])
		if strings.HasPrefix(fn, "panic(") {
			frames = frames[:0] // what came before is the recovery
			continue
		}
		created := strings.HasPrefix(fn, "created by ")
		if created {
			fn = strings.TrimPrefix(fn, "created by ")
			if j := strings.Index(fn, " in goroutine"); j > 0 {
				fn = fn[:j]
			}
		} else if j := strings.LastIndexByte(fn, '('); j > 0 {
			fn = fn[:j]
		}
		fn = strings.TrimPrefix(fn, modulePrefix)
		if created {
			fn = "created by " + fn
		}
		if j := strings.LastIndexByte(loc, ' '); j > 0 {
			loc = loc[:j] // the +0x offset
		}
		if j := strings.LastIndexByte(loc, '/'); j >= 0 {
			loc = loc[j+1:]
		}
		frames = append(frames, fn+" "+loc)
	}
	var b strings.Builder
	for i, f := range frames {
		if b.Len()+len(f)+3 > maxStackLen {
			b.WriteString(" < ...")
			break
		}
		if i > 0 {
			b.WriteString(" < ")
		}
		b.WriteString(f)
	}
	return b.String()
}
