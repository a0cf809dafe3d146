-- The bench's clocks: clock_gettime for the Lua bench modules
-- (bench_proto, bench_pools, bench_metrics), declared once under a name of
-- its own (another module may declare the libc one; a second cdef of a
-- name is an error).
local ffi = require "ffi"

local tonumber = tonumber
local C = ffi.C

ffi.cdef [[
typedef struct { long sec; long nsec; } qrpc_bench_ts_t;
int qrpc_bench_clock_gettime(int clk, qrpc_bench_ts_t *tp) __asm__("clock_gettime");
]]

local ts = ffi.new("qrpc_bench_ts_t")

local _M = {
    MONOTONIC = 1,
    PROCESS_CPUTIME = 2, -- the worker: every thread, Go's included
    THREAD_CPUTIME = 3,  -- the nginx thread (Lua, the module, Go inside its cgo calls)
}

-- clock(id) -> seconds, or nil when the clock cannot be read (another
-- process's that has gone).
function _M.clock(id)
    if C.qrpc_bench_clock_gettime(id, ts) ~= 0 then
        return nil
    end
    return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end

return _M
