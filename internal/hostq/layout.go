package hostq

// The check that the Go mirrors of qrpc.h's types and constants match the
// C compiler's view of qrpc.h, run once before a host starts.

/*
#include <stddef.h>
#include "qrpc.h"

static size_t qrpc_cmd_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_cmd_t, version), offsetof(qrpc_cmd_t, op), offsetof(qrpc_cmd_t, conn),
		offsetof(qrpc_cmd_t, call_id), offsetof(qrpc_cmd_t, timeout_ms), offsetof(qrpc_cmd_t, nhdrs),
		offsetof(qrpc_cmd_t, method), offsetof(qrpc_cmd_t, method_len),
		offsetof(qrpc_cmd_t, body), offsetof(qrpc_cmd_t, body_len),
		offsetof(qrpc_cmd_t, hdrs), offsetof(qrpc_cmd_t, hdrs_len),
		offsetof(qrpc_cmd_t, addr), offsetof(qrpc_cmd_t, addr_len),
		offsetof(qrpc_cmd_t, server_name), offsetof(qrpc_cmd_t, server_name_len),
		offsetof(qrpc_cmd_t, ca), offsetof(qrpc_cmd_t, ca_len),
		offsetof(qrpc_cmd_t, cert), offsetof(qrpc_cmd_t, cert_len),
		offsetof(qrpc_cmd_t, key), offsetof(qrpc_cmd_t, key_len),
		offsetof(qrpc_cmd_t, pins), offsetof(qrpc_cmd_t, pins_len),
		offsetof(qrpc_cmd_t, insecure), offsetof(qrpc_cmd_t, conns), offsetof(qrpc_cmd_t, streams),
		offsetof(qrpc_cmd_t, idle_timeout_ms), offsetof(qrpc_cmd_t, max_frame_size),
		offsetof(qrpc_cmd_t, retries),
		offsetof(qrpc_cmd_t, hash_key), offsetof(qrpc_cmd_t, hash_key_len),
		offsetof(qrpc_cmd_t, req_type), offsetof(qrpc_cmd_t, req_type_len),
		offsetof(qrpc_cmd_t, resp_type), offsetof(qrpc_cmd_t, resp_type_len),
		offsetof(qrpc_cmd_t, flags), offsetof(qrpc_cmd_t, vm),
		offsetof(qrpc_cmd_t, opts), offsetof(qrpc_cmd_t, opts_len),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}

// The constants of qrpc.h that the runtime mirrors, in constNames' order.
// Returns 0 past the end.
static int qrpc_const(int i, long long *v) {
	static const long long c[] = {
		QRPC_CMD_VERSION,
		QRPC_OP_CONNECT, QRPC_OP_UNARY, QRPC_OP_EVENT, QRPC_OP_CLOSE, QRPC_OP_CANCEL, QRPC_OP_ECHO,
		QRPC_OP_PEERS, QRPC_OP_METRICS, QRPC_OP_PROTO_LOAD, QRPC_OP_CONFIGURE, QRPC_OP_PROFILE, QRPC_F_DISCARD_UNKNOWN,
		QRPC_OK, QRPC_PENDING, QRPC_LOG, QRPC_ERR, QRPC_ERR_TIMEOUT, QRPC_ERR_CLOSED, QRPC_ERR_FULL,
		QRPC_ERR_BADARG, QRPC_ERR_CONNECT, QRPC_ERR_UNAVAIL, QRPC_ERR_TOOBIG, QRPC_ERR_LOST,
		QRPC_F_PROTO_NAMES, QRPC_BAD_RESPONSE, QRPC_F_LUA_TABLE, QRPC_F_LUA_REQUEST,
		QRPC_MAX_VMS, QRPC_RESULT_HEAD, QRPC_OP_PROTO_DESCRIBE, QRPC_OP_POOL_SHARE, QRPC_SHARE,
	};
	if (i < 0 || i >= (int)(sizeof c / sizeof c[0])) return 0;
	if (v != NULL) *v = c[i];
	return 1;
}

static size_t qrpc_completion_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_completion_t, call_id), offsetof(qrpc_completion_t, handle),
		offsetof(qrpc_completion_t, status), offsetof(qrpc_completion_t, code),
		offsetof(qrpc_completion_t, data), offsetof(qrpc_completion_t, len),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}

static size_t qrpc_stats_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_stats_t, inflight), offsetof(qrpc_stats_t, calls),
		offsetof(qrpc_stats_t, events), offsetof(qrpc_stats_t, dropped),
		offsetof(qrpc_stats_t, reconnects), offsetof(qrpc_stats_t, queued),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

const constNames = `QRPC_CMD_VERSION
	QRPC_OP_CONNECT QRPC_OP_UNARY QRPC_OP_EVENT QRPC_OP_CLOSE QRPC_OP_CANCEL QRPC_OP_ECHO
	QRPC_OP_PEERS QRPC_OP_METRICS QRPC_OP_PROTO_LOAD QRPC_OP_CONFIGURE QRPC_OP_PROFILE QRPC_F_DISCARD_UNKNOWN
	QRPC_OK QRPC_PENDING QRPC_LOG QRPC_ERR QRPC_ERR_TIMEOUT QRPC_ERR_CLOSED QRPC_ERR_FULL
	QRPC_ERR_BADARG QRPC_ERR_CONNECT QRPC_ERR_UNAVAIL QRPC_ERR_TOOBIG QRPC_ERR_LOST
	QRPC_F_PROTO_NAMES QRPC_BAD_RESPONSE QRPC_F_LUA_TABLE QRPC_F_LUA_REQUEST
	QRPC_MAX_VMS QRPC_RESULT_HEAD QRPC_OP_PROTO_DESCRIBE QRPC_OP_POOL_SHARE QRPC_SHARE`

// abiLayoutErr compares the Go mirrors (internal/bridge/cmdabi.go) and the runtime's
// constants with the C compiler's view of qrpc.h.
func abiLayoutErr() error {
	names := strings.Fields(constNames)
	goVals := []int64{bridge.CmdVersion,
		bridge.OpConnect, bridge.OpUnary, bridge.OpEvent, bridge.OpClose, bridge.OpCancel, bridge.OpEcho,
		bridge.OpPeers, bridge.OpMetrics, bridge.OpProtoLoad, bridge.OpConfigure, bridge.OpProfile, bridge.FlagDiscardUnknown,
		int64(bridge.StatusOK), int64(bridge.StatusPending), int64(bridge.StatusLog), int64(bridge.ErrGeneric),
		int64(bridge.ErrTimeout), int64(bridge.ErrClosed), int64(bridge.ErrFull), int64(bridge.ErrBadArg),
		int64(bridge.ErrConnect), int64(bridge.ErrUnavail), int64(bridge.ErrTooBig), int64(bridge.ErrLost),
		bridge.FlagProtoNames, bridge.StatusBadResponse, bridge.FlagLuaTable, bridge.FlagLuaRequest,
		bridge.MaxVMs, bridge.ResultHead, bridge.OpProtoDescribe, bridge.OpPoolShare, int64(bridge.StatusShare)}
	if len(names) != len(goVals) || C.qrpc_const(C.int(len(goVals)), nil) != 0 {
		return fmt.Errorf("the constant lists of layout.go differ in length")
	}
	for i, g := range goVals {
		var v C.longlong
		if C.qrpc_const(C.int(i), &v) == 0 || int64(v) != g {
			return fmt.Errorf("%s is %d in C, %d in Go", names[i], v, g)
		}
	}
	check := func(name string, goSize, cSize uintptr, goOff []uintptr, cOff func(int) uintptr) error {
		if goSize != cSize {
			return fmt.Errorf("%s: size %d in Go, %d in C", name, goSize, cSize)
		}
		for i, o := range goOff {
			if c := cOff(i); c != o {
				return fmt.Errorf("%s: field %d at offset %d in Go, %d in C", name, i, o, c)
			}
		}
		if cOff(len(goOff)) != ^uintptr(0) {
			return fmt.Errorf("%s: C has more fields than Go", name)
		}
		return nil
	}
	if err := check("qrpc_cmd_t", unsafe.Sizeof(bridge.CmdABI{}), C.sizeof_qrpc_cmd_t, bridge.CmdOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_cmd_offset(C.int(i))) }); err != nil {
		return err
	}
	if err := check("qrpc_completion_t", unsafe.Sizeof(bridge.Completion{}), C.sizeof_qrpc_completion_t, bridge.CompletionOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_completion_offset(C.int(i))) }); err != nil {
		return err
	}
	return check("qrpc_stats_t", unsafe.Sizeof(bridge.Stats{}), C.sizeof_qrpc_stats_t, bridge.StatsOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_stats_offset(C.int(i))) })
}

var (
	layoutOnce sync.Once
	layoutErr  error
)

// CheckLayout runs abiLayoutErr once; both hosts refuse to start when it
// failed.
func CheckLayout() error {
	layoutOnce.Do(func() { layoutErr = abiLayoutErr() })
	return layoutErr
}

// SizeofCmd is sizeof(qrpc_cmd_t), the exact length of a lua-resty-ffi request.
const SizeofCmd = C.sizeof_qrpc_cmd_t
