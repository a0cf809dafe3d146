-- Pools (bench/pools.go): the same echo calls through two
-- connections of this worker, a pool of several servers (a) and a pool of
-- one (b), in alternating blocks with the order flipped every round, so
-- that the drifting load of a shared machine weighs on both alike. Each
-- block is timed, with the CPU time of this worker (all its threads) and
-- of the server processes (their CPU clocks, read by pid).
local qrpc = require "resty.ffi.qrpc"
local cfg = require "bench_config"
local bc = require "bench_common"

local ngx = ngx
local tonumber = tonumber
local tostring = tostring
local ipairs = ipairs
local floor = math.floor
local tab_sort = table.sort
local tab_concat = table.concat
local min = math.min
local max = math.max
local str_rep = string.rep
local bit = require "bit"
local bnot, lshift, bor = bit.bnot, bit.lshift, bit.bor
local spawn = ngx.thread.spawn
local wait = ngx.thread.wait

local _M = {}

local clock = bc.clock
local CLOCK_MONOTONIC = bc.MONOTONIC
local CLOCK_PROCESS_CPUTIME_ID = bc.PROCESS_CPUTIME

-- Another process's CPU clock (all its threads): Linux's
-- MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), as clock_getcpuclockid
-- makes it; readable without privileges.
local function pid_clock(pid)
    return bor(lshift(bnot(pid), 3), 2)
end

local CONN_OPTS = { ca = cfg.ca, server_name = "localhost" }

local function list(s)
    local t = {}
    for a in (s or ""):gmatch("[^,]+") do
        t[#t + 1] = a
    end
    return t
end

local loop = bc.echo_loop

-- block runs n calls on conn: sequentially, or from c light threads.
local function block(conn, n, c, body)
    if c <= 1 then
        return loop(conn, n, body)
    end
    local threads = {}
    local per = floor(n / c)
    for i = 1, c do
        threads[i] = spawn(loop, conn, per, body)
    end
    local errs = 0
    for i = 1, c do
        local ok, e = wait(threads[i])
        errs = errs + (ok and e or per)
    end
    return errs
end

local fail = bc.fail

-- GET /bench/pools?a=addrs&b=addrs&n=N&c=C&block=B&pids=P,...[&aconns=K][&bconns=K]
-- [&abal=B][&bbal=B][&ashared=1][&bshared=1]: N calls
-- through each pool, in blocks of B calls (from C light threads each).
-- Answers, per pool: wall seconds, this worker's CPU seconds, the server
-- processes' CPU seconds.
function _M.run()
    local args = ngx.req.get_uri_args()
    local n = tonumber(args.n) or 1000
    local c = max(tonumber(args.c) or 1, 1)
    local bs = max(tonumber(args.block) or 50, c)
    local body = str_rep("x", tonumber(args.size) or 100)
    local clocks = {}
    for _, p in ipairs(list(args.pids)) do
        local id = pid_clock(tonumber(p))
        if not clock(id) then
            return fail("cannot read the CPU clock of pid " .. p)
        end
        clocks[#clocks + 1] = id
    end
    local function servers()
        local s = 0
        for i = 1, #clocks do
            s = s + (clock(clocks[i]) or 0)
        end
        return s
    end

    local conns = {}
    for i, k in ipairs({ "a", "b" }) do
        -- aconns / bconns: QUIC connections per server (the `conns` option)
        local opts = CONN_OPTS
        local nc = tonumber(args[k .. "conns"])
        local bal = args[k .. "bal"]
        -- ashared / bshared: the pool shared through the dict bench_pools
        local shared = args[k .. "shared"] and "bench_pools" or nil
        if (nc and nc > 1) or bal or shared then
            opts = { ca = CONN_OPTS.ca, server_name = CONN_OPTS.server_name,
                     conns = nc and nc > 1 and nc or nil, balance = bal,
                     shared = shared }
        end
        local conn, err = qrpc.connect(list(args[k]), opts)
        if not conn then
            return fail(k .. ": " .. tostring(err))
        end
        conns[i] = conn
    end
    -- warm up both (connections, streams, JIT traces)
    local errs = 0
    for i = 1, 2 do
        errs = errs + block(conns[i], min(floor(n / 10) + c, 2000), c, body)
    end

    local secs, cpu, srv = { 0, 0 }, { 0, 0 }, { 0, 0 }
    local done, round = 0, 0
    while done < n do
        local b = min(bs, n - done)
        for k = 1, 2 do
            local m = (round % 2 == 0) and k or 3 - k
            local t0, c0, s0 = clock(CLOCK_MONOTONIC), clock(CLOCK_PROCESS_CPUTIME_ID), servers()
            errs = errs + block(conns[m], b, c, body)
            srv[m] = srv[m] + servers() - s0
            cpu[m] = cpu[m] + clock(CLOCK_PROCESS_CPUTIME_ID) - c0
            secs[m] = secs[m] + clock(CLOCK_MONOTONIC) - t0
        end
        done, round = done + b, round + 1
    end
    ngx.say('{"calls":', floor(done), ',"errors":', errs,
            ',"a":{"secs":', secs[1], ',"cpu":', cpu[1], ',"srv":', srv[1],
            '},"b":{"secs":', secs[2], ',"cpu":', cpu[2], ',"srv":', srv[2], '}}')
end

-- GET /bench/balance?addrs=a,b,c&balance=B&n=N&c=C: N echo calls of 100 B
-- from C light threads through a pool of addrs balanced by B, each call
-- timed. Answers the calls, errors, latency percentiles (ms) and the
-- attempts each server took (conn:peers()).
function _M.balance()
    local args = ngx.req.get_uri_args()
    local n = tonumber(args.n) or 1000
    local c = max(tonumber(args.c) or 1, 1)
    local body = str_rep("x", 100)
    local conn, err = qrpc.connect(list(args.addrs), {
        ca = CONN_OPTS.ca, server_name = CONN_OPTS.server_name,
        balance = args.balance, timeout = 2000,
    })
    if not conn then
        return fail(tostring(err))
    end
    local before = {}
    for _, p in ipairs(conn:peers()) do
        before[p.addr] = p.calls
    end
    local lat = {}
    local per = floor(n / c)
    local function run(base)
        local errs = 0
        for i = 1, per do
            local t0 = clock(CLOCK_MONOTONIC)
            local res = conn:unary("echo", body)
            lat[base + i] = clock(CLOCK_MONOTONIC) - t0
            if not res or #res.body ~= #body then
                errs = errs + 1
            end
        end
        return errs
    end
    local threads = {}
    for i = 1, c do
        threads[i] = spawn(run, (i - 1) * per)
    end
    local errs = 0
    for i = 1, c do
        local ok, e = wait(threads[i])
        errs = errs + (ok and e or per)
    end
    tab_sort(lat)
    local total = #lat
    local function q(f)
        return lat[min(total, floor(f * total) + 1)] * 1000
    end
    local shares = {}
    for _, p in ipairs(conn:peers()) do
        shares[#shares + 1] = '"' .. p.addr .. '":' .. (p.calls - (before[p.addr] or 0))
    end
    ngx.say('{"calls":', total, ',"errors":', errs, ',"p50":', q(0.5),
            ',"p99":', q(0.99), ',"servers":{', tab_concat(shares, ","), '}}')
end


return _M
