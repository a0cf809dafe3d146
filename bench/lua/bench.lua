-- Benchmark loops run inside nginx. Each request runs one measurement and
-- answers with its duration; the Go harness (bench/main.go) compares it
-- with the baseline it measures itself in the same run.
local qrpc = require "resty.ffi.qrpc"
local cfg = require "bench_config"

local ffi = require "ffi"
local semaphore = require "ngx.semaphore"

local ngx = ngx
local ffi_string = ffi.string
local spawn = ngx.thread.spawn
local wait = ngx.thread.wait
local tcp = ngx.socket.tcp
local str_rep = string.rep
local str_char = string.char
local floor = math.floor
local min = math.min
local tonumber = tonumber

local _M = {}

local WARMUP_MAX = 2000

local function be32(n)
    return str_char(floor(n / 16777216) % 256, floor(n / 65536) % 256,
                    floor(n / 256) % 256, n % 256)
end

local common = require "bench_common"
local qrpc_loop = common.echo_loop
local clock = common.clock
local switches = common.switches
local MONOTONIC = common.MONOTONIC
local PROCESS_CPUTIME = common.PROCESS_CPUTIME

-- through the C submit queue and Go's submitter goroutine and back (the
-- hand-off of a unary call)
local function ipc_loop(_, n, body)
    local errs = 0
    local echo = require("resty.ffi.qrpc.testing").echo
    for _ = 1, n do
        local res = echo(body)
        if not res or #res ~= #body then
            errs = errs + 1
        end
    end
    return errs
end

-- lua-resty-ffi's own Go echo example (libffi_go_echo.so)
local function rfecho_loop(demo, n, body)
    local errs = 0
    for _ = 1, n do
        local ok, res = demo:echo(body)
        if not ok or #res ~= #body then
            errs = errs + 1
        end
    end
    return errs
end

-- The floor of any design that wakes its calls with ngx.semaphore, as the
-- built-in host does on stock ngx_lua: each call queues its waiter and
-- waits; the first of a round wakes one driver light thread (as the first
-- completion's byte wakes the dispatcher), which builds each result in Lua
-- (a table and a string copied from C memory, as a completion is decoded)
-- and posts. No IPC, no Go: what is left of a call when the hand-off
-- costs nothing.
local function floor_driver(st)
    local pending, buf, size, kick = st.pending, st.buf, st.size, st.kick
    while st.active > 0 do
        kick:wait(1)
        local k = st.np
        for i = 1, k do
            local w = pending[i]
            pending[i] = nil
            w.val = { code = 0, headers = {}, body = ffi_string(buf, size) }
            w.sema:post(1)
        end
        st.np = 0
    end
    st.driver = nil
end

local function floor_loop(st, n, body)
    st.active = st.active + 1
    if not st.driver then
        st.driver = spawn(floor_driver, st)
    end
    local w = { sema = semaphore.new(0) }
    local errs = 0
    for _ = 1, n do
        local np = st.np + 1
        st.np = np
        st.pending[np] = w
        if np == 1 then
            st.kick:post(1)
        end
        local ok = w.sema:wait(10)
        local res = w.val
        w.val = nil
        if not ok or not res or #res.body ~= #body then
            errs = errs + 1
        end
    end
    st.active = st.active - 1
    if st.active == 0 then
        st.kick:post(1) -- the driver ends
    end
    return errs
end

local function uds_loop(path, n, body)
    local sock = tcp()
    local ok, err = sock:connect("unix:" .. path)
    if not ok then
        ngx.log(ngx.ERR, "uds connect: ", err)
        return n
    end
    local msg = be32(#body) .. body
    local errs = 0
    for _ = 1, n do
        local _, serr = sock:send(msg)
        if serr then
            errs = errs + 1
        else
            local hdr = sock:receive(4)
            local data = hdr and sock:receive(#body)
            if not data then
                errs = errs + 1
            end
        end
    end
    sock:setkeepalive()
    return errs
end

function _M.run()
    local args = ngx.req.get_uri_args()
    local kind = args.kind
    local n = tonumber(args.n) or 1000
    local size = tonumber(args.size) or 100
    local c = tonumber(args.c) or 1
    local body = str_rep("x", size)

    local loop, target
    if kind == "unary" or kind == "pool" then
        local addrs = cfg.addr
        if kind == "pool" then
            -- addrs: comma-separated host:port list, one pool of them all
            addrs = {}
            for a in (args.addrs or ""):gmatch("[^,]+") do
                addrs[#addrs + 1] = a
            end
        end
        local conn, err = qrpc.connect(addrs, { ca = cfg.ca, server_name = "localhost" })
        if not conn then
            ngx.status = 500
            ngx.say(err)
            return
        end
        loop, target = qrpc_loop, conn
    elseif kind == "ipc" then
        loop, target = ipc_loop, false
    elseif kind == "rfecho" then
        local load_ffi = rawget(ngx, "load_ffi")
        local demo = load_ffi and load_ffi("ffi_go_echo")
        if not demo then
            ngx.status = 500
            ngx.say("lua-resty-ffi's ffi_go_echo did not load")
            return
        end
        loop, target = rfecho_loop, demo
    elseif kind == "semafloor" then
        local buf = ffi.new("char[?]", size)
        ffi.copy(buf, body, size)
        loop = floor_loop
        target = { pending = {}, np = 0, active = 0, buf = buf, size = size,
                   kick = semaphore.new(0) }
    elseif kind == "uds" then
        loop, target = uds_loop, cfg.uds
    else
        ngx.status = 400
        ngx.say("unknown kind")
        return
    end

    -- warm up (connections, JIT traces); capped: a sequential warm-up of
    -- a tenth of a large concurrent run took longer than the run itself
    loop(target, min(floor(n / 10) + 1, WARMUP_MAX), body)

    -- the worker's CPU time and context switches during the loop: what a
    -- call costs the worker, beside how long it takes
    -- jitv=<file>: the loop's LuaJIT trace log (breakdown.go), every
    -- trace compiled again inside it
    local jitv = args.jitv
    if jitv then
        jit.flush()
        require("jit.v").on(jitv)
    end
    local cpu0, csw0 = clock(PROCESS_CPUTIME), switches()
    local t0 = clock(MONOTONIC)
    local errs = 0
    if c <= 1 then
        errs = loop(target, n, body)
    else
        local threads = {}
        local per = floor(n / c)
        for i = 1, c do
            threads[i] = spawn(loop, target, per, body)
        end
        for i = 1, c do
            local ok, e = wait(threads[i])
            errs = errs + (ok and e or per)
        end
        n = per * c
    end
    local secs = clock(MONOTONIC) - t0
    if jitv then
        require("jit.v").off()
    end
    local cpu, csw = clock(PROCESS_CPUTIME) - cpu0, switches() - csw0
    ngx.say('{"secs":', secs, ',"calls":', n, ',"errors":', errs,
            ',"cpu":', cpu, ',"csw":', csw, '}')
end

return _M
