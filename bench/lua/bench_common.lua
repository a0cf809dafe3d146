-- What the Lua bench modules share: clock_gettime, declared once under a
-- name of its own (another module may declare the libc one; a second cdef
-- of a name is an error), the echo loop and the error answer.
local ffi = require "ffi"

local tonumber = tonumber
local C = ffi.C

ffi.cdef [[
typedef struct { long sec; long nsec; } qrpc_bench_ts_t;
int qrpc_bench_clock_gettime(int clk, qrpc_bench_ts_t *tp) __asm__("clock_gettime");
typedef struct {
    long utime_sec, utime_usec, stime_sec, stime_usec;
    long maxrss, ixrss, idrss, isrss, minflt, majflt, nswap, inblock, oublock;
    long msgsnd, msgrcv, nsignals, nvcsw, nivcsw;
} qrpc_bench_rusage_t;
int qrpc_bench_getrusage(int who, qrpc_bench_rusage_t *ru) __asm__("getrusage");
]]

local ts = ffi.new("qrpc_bench_ts_t")
local ru = ffi.new("qrpc_bench_rusage_t")

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


-- switches() -> how many times the worker's threads (all of them, Go's
-- included) were switched out so far, waiting or preempted; nil when
-- getrusage fails.
function _M.switches()
    if C.qrpc_bench_getrusage(0, ru) ~= 0 then -- RUSAGE_SELF
        return nil
    end
    return tonumber(ru.nvcsw) + tonumber(ru.nivcsw)
end


-- echo_loop makes n sequential echo calls of body on conn; returns how
-- many failed or came back wrong.
function _M.echo_loop(conn, n, body)
    local errs = 0
    for _ = 1, n do
        local res = conn:unary("echo", body)
        if not res or #res.body ~= #body then
            errs = errs + 1
        end
    end
    return errs
end


function _M.fail(msg)
    ngx.status = 500
    ngx.say(msg)
end

return _M
