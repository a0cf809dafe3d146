package bridge

import (
	"bytes"
	"fmt"
)

// QRPC_OP_CONFIGURE: runtime settings of this worker, as opts lines
// ("key=value\n"):
//
//	metrics=on|off   record calls in the worker's metrics (on). Off, the
//	                 pools dialled afterwards get qrpc.NopObserver, so
//	                 their calls cost nothing to record and show nowhere
//	                 in the metrics; pools dialled before keep recording.
//
// Unknown keys and values are errors, and then nothing is applied. The
// answer is the settings in force after the command, in the same form.

func init() {
	RegisterQuery(OpConfigure, func(r *Runtime, cmd *Command) ([]byte, error) {
		if err := r.Configure(cmd.Opts); err != nil {
			return nil, err
		}
		return r.settings(), nil
	})
}

// Configure applies CONFIGURE's opts lines (see above).
func (r *Runtime) Configure(opts []byte) error {
	if len(opts) > maxOptsLen {
		return Badf("opts: %d bytes, at most %d", len(opts), maxOptsLen)
	}
	var off *bool
	for _, line := range bytes.Split(opts, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok {
			return Badf("opts: %q is not key=value", clipOpt(string(line)))
		}
		switch key, val := string(k), string(v); key {
		case "metrics":
			var b bool
			switch val {
			case "on":
			case "off":
				b = true
			default:
				return Badf("opts: metrics must be on or off, got %q", clipOpt(val))
			}
			off = &b
		default:
			return Badf("opts: unknown key %q", clipOpt(key))
		}
	}
	if off != nil {
		r.metricsOff.Store(*off)
	}
	return nil
}

// settings is the answer of CONFIGURE: what is in force now.
func (r *Runtime) settings() []byte {
	state := "on"
	if r.metricsOff.Load() {
		state = "off"
	}
	return fmt.Appendf(nil, "metrics=%s\n", state)
}
