-- resty.ffi.qrpc.wire_keys: the record keys of the ABI's record blocks
-- (qrpc_cmd_t.opts, the query ops' answers). Generated from
-- internal/schema by "make schema": do not edit (make lint fails when the
-- two differ). NAME = id, and by id: names[id], types[id] ("str", "int",
-- "float").
-- luacheck: no max line length

local names, types = {}, {}
local _M = { names = names, types = types }

_M.ADDR = 1; names[1] = "ADDR"; types[1] = "str"  -- CONNECT: a server, host:port or an SRV name (repeatable; replaces cmd.addr)
_M.BALANCE = 2; names[2] = "BALANCE"; types[2] = "str"  -- CONNECT: round_robin, least_inflight, hash or p2c
_M.HEALTH_FAILURES = 3; names[3] = "HEALTH_FAILURES"; types[3] = "int"  -- CONNECT: failures in a row that eject
_M.HEALTH_EJECT_MS = 4; names[4] = "HEALTH_EJECT_MS"; types[4] = "int"  -- CONNECT: first ejection
_M.HEALTH_STALL_MS = 5; names[5] = "HEALTH_STALL_MS"; types[5] = "int"  -- CONNECT: stalled-server detection (0: never)
_M.HEALTH_ON = 6; names[6] = "HEALTH_ON"; types[6] = "int"  -- CONNECT: the failures that eject, a bit set: connect 1, reset 2, timeout 4
_M.CHECK_METHOD = 7; names[7] = "CHECK_METHOD"; types[7] = "str"  -- CONNECT: active health check method
_M.CHECK_INTERVAL_MS = 8; names[8] = "CHECK_INTERVAL_MS"; types[8] = "int"  -- CONNECT: active check period
_M.CHECK_TIMEOUT_MS = 9; names[9] = "CHECK_TIMEOUT_MS"; types[9] = "int"  -- CONNECT: active check timeout
_M.RETRIES = 10; names[10] = "RETRIES"; types[10] = "int"  -- CONNECT: default extra attempts on another server
_M.TRY_TIMEOUT_MS = 11; names[11] = "TRY_TIMEOUT_MS"; types[11] = "int"  -- CONNECT, UNARY: each attempt's bound (0: off)
_M.HEDGE_DELAY_MS = 12; names[12] = "HEDGE_DELAY_MS"; types[12] = "int"  -- CONNECT, UNARY: delay before each hedged copy
_M.HEDGE_P95 = 13; names[13] = "HEDGE_P95"; types[13] = "int"  -- CONNECT, UNARY: 1: hedge after the p95 latency instead of HEDGE_DELAY_MS
_M.HEDGE_MAX = 14; names[14] = "HEDGE_MAX"; types[14] = "int"  -- CONNECT, UNARY: hedged copies besides the first (0: off)
_M.BUDGET_RATIO = 15; names[15] = "BUDGET_RATIO"; types[15] = "float"  -- CONNECT: retry budget, share of the calls (0: none)
_M.BUDGET_MIN_PER_S = 16; names[16] = "BUDGET_MIN_PER_S"; types[16] = "int"  -- CONNECT: retry budget, reserve per second
_M.RESOLVE_MS = 17; names[17] = "RESOLVE_MS"; types[17] = "int"  -- CONNECT: re-resolve names this often (0: once)
_M.RESOLVER = 18; names[18] = "RESOLVER"; types[18] = "str"  -- CONNECT: UDP DNS server, host:port
_M.STREAM_BATCH = 19; names[19] = "STREAM_BATCH"; types[19] = "int"  -- CONNECT: consecutive calls on one stream
_M.THROTTLE_K = 20; names[20] = "THROTTLE_K"; types[20] = "float"  -- CONNECT: adaptive throttling's K (0: off)
_M.THROTTLE_CODE = 21; names[21] = "THROTTLE_CODE"; types[21] = "int"  -- CONNECT: a response code that counts as overload (repeatable)
_M.GOMAXPROCS = 22; names[22] = "GOMAXPROCS"; types[22] = "int"  -- CONFIGURE: the worker's Go Ps
_M.METRICS = 23; names[23] = "METRICS"; types[23] = "int"  -- CONFIGURE: 1 records metrics for pools dialled later, 0 does not
_M.SYSMON = 24; names[24] = "SYSMON"; types[24] = "str"  -- CONFIGURE answer: lazy or go
_M.PROFILE_KIND = 25; names[25] = "PROFILE_KIND"; types[25] = "str"  -- PROFILE: heap, allocs, goroutine, threadcreate, cpu or cpu-stop
_M.PROFILE_SECONDS = 26; names[26] = "PROFILE_SECONDS"; types[26] = "int"  -- PROFILE: a CPU profile's length
_M.IMPORT_PATH = 27; names[27] = "IMPORT_PATH"; types[27] = "str"  -- PROTO_LOAD, PROTO_DESCRIBE: a directory imports are searched in (repeatable)
_M.CONNECTIONS = 28; names[28] = "CONNECTIONS"; types[28] = "int"  -- PEERS of conn 0: the live QUIC connections of every pool
_M.PEER_ADDR = 29; names[29] = "PEER_ADDR"; types[29] = "str"  -- PEERS: a server; starts its records
_M.PEER_STATE = 30; names[30] = "PEER_STATE"; types[30] = "str"  -- PEERS: up, ejected, connecting, ...
_M.PEER_INFLIGHT = 31; names[31] = "PEER_INFLIGHT"; types[31] = "int"  -- PEERS: calls in flight
_M.PEER_CALLS = 32; names[32] = "PEER_CALLS"; types[32] = "int"  -- PEERS: calls sent
_M.PEER_FAILURES = 33; names[33] = "PEER_FAILURES"; types[33] = "int"  -- PEERS: failures in a row
_M.PEER_EJECTED_UNTIL_MS = 34; names[34] = "PEER_EJECTED_UNTIL_MS"; types[34] = "int"  -- PEERS: end of the ejection, Unix ms (0: not ejected)
_M.PEER_STALLED = 35; names[35] = "PEER_STALLED"; types[35] = "int"  -- PEERS: 1 when new calls avoid it as stalled
_M.SAMPLE_SERIES = 36; names[36] = "SAMPLE_SERIES"; types[36] = "str"  -- METRICS: a sample's series (render: a dict key, a tag before the series allowed)
_M.SAMPLE_COUNTER = 37; names[37] = "SAMPLE_COUNTER"; types[37] = "float"  -- METRICS: the value of the series before it, a counter (render: any sample)
_M.SAMPLE_GAUGE = 38; names[38] = "SAMPLE_GAUGE"; types[38] = "float"  -- METRICS snapshot: the value of the series before it, a gauge

return _M
