-- What metrics recording costs (bench/metricscost.go): the same
-- sequential echo calls on three connections to the same server from this
-- light thread: one recorded ("on"), one dialled with configure{ metrics
-- = false } ("off": its pool has Go's no-op observer), and a second
-- recorded one ("on2": an A/A control, what two connections differ by
-- when nothing distinguishes them), in blocks taken in every order in
-- turn, so that the load of a shared machine weighs on all alike.
local qrpc = require "resty.ffi.qrpc"
local cfg = require "bench_config"
local bc = require "bench_common"

local ngx = ngx
local tonumber = tonumber
local tostring = tostring
local floor = math.floor
local min = math.min
local str_rep = string.rep

local _M = {}

local clock = bc.clock
local CLOCK_MONOTONIC = bc.MONOTONIC
local CLOCK_PROCESS_CPUTIME_ID = bc.PROCESS_CPUTIME

-- Distinct option values make two cache entries (two pools, two QUIC
-- connections) for the same server; the timeouts are never reached.
local ON_OPTS = { ca = cfg.ca, server_name = "localhost", timeout = 5002 }
local OFF_OPTS = { ca = cfg.ca, server_name = "localhost", timeout = 5001 }
local ON2_OPTS = { ca = cfg.ca, server_name = "localhost", timeout = 5003 }
-- the six orders of the three modes, one per round in turn
local ORDERS = { { 1, 2, 3 }, { 3, 2, 1 }, { 2, 3, 1 }, { 1, 3, 2 }, { 3, 1, 2 }, { 2, 1, 3 } }
local WARMUP = 300

local loop = bc.echo_loop

-- recorded is the worker's count of ok echo calls to addr in
-- qrpc.metrics(): the harness checks that exactly the "on" calls add to it.
local function recorded(addr)
    local text = qrpc.metrics()
    if not text then
        return -1
    end
    local pat = 'qrpc_client_calls_total{method="echo",server="'
                .. addr:gsub("%p", "%%%0") .. '",result="ok"} (%d+)'
    return tonumber(text:match(pat)) or 0
end

local fail = bc.fail

-- GET /bench/metrics?n=N&size=S&block=B: N calls in each mode. Answers
-- wall and worker CPU seconds of each mode, and how many calls the
-- metrics recorded meanwhile.
function _M.run()
    local n = tonumber(ngx.var.arg_n) or 1000
    local body = str_rep("x", tonumber(ngx.var.arg_size) or 100)
    local block = tonumber(ngx.var.arg_block) or 50

    -- The "off" pool is dialled while recording is off; recording is back
    -- on before anything else can dial (no other request runs during a
    -- bench).
    local ok, err = qrpc.configure{ metrics = false }
    if not ok then
        return fail(err)
    end
    local off
    off, err = qrpc.connect(cfg.addr, OFF_OPTS)
    ok = qrpc.configure{ metrics = true }
    if not off or not ok then
        return fail("off: " .. tostring(err))
    end
    local on, on2
    on, err = qrpc.connect(cfg.addr, ON_OPTS)
    if not on then
        return fail("on: " .. tostring(err))
    end
    on2, err = qrpc.connect(cfg.addr, ON2_OPTS)
    if not on2 then
        return fail("on2: " .. tostring(err))
    end
    local conns = { on, off, on2 }
    local errs = 0
    for m = 1, 3 do
        errs = errs + loop(conns[m], WARMUP, body)
    end

    local secs, cpu = { 0, 0, 0 }, { 0, 0, 0 }
    local before = recorded(cfg.addr)
    local done, round = 0, 0
    while done < n do
        local b = min(block, n - done)
        local order = ORDERS[round % #ORDERS + 1]
        for k = 1, 3 do
            local m = order[k]
            local t0, c0 = clock(CLOCK_MONOTONIC), clock(CLOCK_PROCESS_CPUTIME_ID)
            errs = errs + loop(conns[m], b, body)
            cpu[m] = cpu[m] + clock(CLOCK_PROCESS_CPUTIME_ID) - c0
            secs[m] = secs[m] + clock(CLOCK_MONOTONIC) - t0
        end
        done, round = done + b, round + 1
    end
    local rec = recorded(cfg.addr) - before
    ngx.say('{"calls":', floor(done), ',"errors":', errs, ',"recorded":', rec,
            ',"on":{"secs":', secs[1], ',"cpu":', cpu[1],
            '},"off":{"secs":', secs[2], ',"cpu":', cpu[2],
            '},"on2":{"secs":', secs[3], ',"cpu":', cpu[3], '}}')
end

return _M
