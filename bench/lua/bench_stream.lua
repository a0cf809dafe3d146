-- The stream section (bench/stream.go): the same unary echo calls made
-- from an http {} location and from a stream {} server of one worker, by
-- this one module in both Lua VMs, so that what differs is the subsystem
-- (each VM has its own completion queue, wake-up socket and dispatcher).
--
-- The stream server reads request lines and answers one line each:
--   call <size>          one echo call of a size-byte body: the body, or "ERR <error>"
--   loop <n> <size>      measure(n, size): a JSON line, or "ERR <error>"
--   subsystem            qrpc.stats().subsystem after a call
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
local switches = bc.switches
local MONOTONIC = bc.MONOTONIC
local PROCESS_CPUTIME = bc.PROCESS_CPUTIME

-- As bench.lua's warm-up: connections and JIT traces, capped.
local WARMUP_MAX = 2000
-- Bodies larger than this are refused: the answer line is the body.
local MAX_SIZE = 65536

local bodies = {}

local function body(size)
    local b = bodies[size]
    if not b then
        b = str_rep("x", size)
        bodies[size] = b
    end
    return b
end

-- size(s) -> a body size from a request argument (100 when absent), or
-- nil when it is out of range.
local function size_arg(s)
    local n = tonumber(s or 100)
    if not n or n < 0 or n > MAX_SIZE then
        return nil
    end
    return floor(n)
end

local function connect()
    -- cached: one connection per VM for every request
    return qrpc.connect(cfg.addr, { ca = cfg.ca, server_name = "localhost" })
end

-- call(size) -> the echoed body of one unary call, or nil, err.
local function call(size)
    local conn, err = connect()
    if not conn then
        return nil, err
    end
    local res
    res, err = conn:unary("echo", body(size))
    if not res then
        return nil, err
    end
    if res.code ~= 0 or #res.body ~= size then
        return nil, "echo answered code " .. tostring(res.code) .. " with " .. #res.body .. " bytes"
    end
    return res.body
end

-- measure(n, size) -> the JSON answer of bench.lua's run for n sequential
-- echo calls of a size-byte body (secs, calls, errors, and the worker's
-- CPU time and context switches during the loop), or nil, err.
function _M.measure(n, size)
    if not n or n < 1 or not size then
        return nil, "bad arguments"
    end
    local conn, err = connect()
    if not conn then
        return nil, err
    end
    local b = body(size)
    bc.echo_loop(conn, min(floor(n / 10) + 1, WARMUP_MAX), b)
    local cpu0, csw0 = clock(PROCESS_CPUTIME), switches()
    local t0 = clock(MONOTONIC)
    local errs = bc.echo_loop(conn, n, b)
    local secs = clock(MONOTONIC) - t0
    local cpu, csw = clock(PROCESS_CPUTIME) - cpu0, switches() - csw0
    return '{"secs":' .. secs .. ',"calls":' .. n .. ',"errors":' .. errs
        .. ',"cpu":' .. cpu .. ',"csw":' .. csw .. '}'
end

local function subsystem()
    local _, err = call(1)
    if err then
        return nil, err
    end
    return qrpc.stats().subsystem
end

-- http {}: GET /loop?n=&size=
function _M.http_loop()
    local args = ngx.req.get_uri_args()
    local out, err = _M.measure(tonumber(args.n), size_arg(args.size))
    if not out then
        return bc.fail(err)
    end
    ngx.say(out)
end

-- http {}: GET /call?size= (wrk), one call per request
function _M.http_call()
    local size = size_arg(ngx.var.arg_size)
    if not size then
        return bc.fail("bad size")
    end
    local res, err = call(size)
    if not res then
        ngx.status = 502
        ngx.say(err)
        return
    end
    ngx.print(res)
end

-- http {}: GET /subsystem
function _M.http_subsystem()
    local s, err = subsystem()
    if not s then
        return bc.fail(err)
    end
    ngx.print(s)
end

-- stream {}: the line server (see the top of this file)
local function answer(line)
    local cmd, a, b = line:match("^(%S+) ?(%S*) ?(%S*)$")
    local out, err
    if cmd == "call" then
        local size = size_arg(a)
        if size then
            out, err = call(size)
        else
            err = "bad size"
        end
    elseif cmd == "loop" then
        out, err = _M.measure(tonumber(a), size_arg(b))
    elseif cmd == "subsystem" then
        out, err = subsystem()
    else
        err = "bad line"
    end
    if not out then
        return "ERR " .. (tostring(err):gsub("\n", " "))
    end
    return out
end

function _M.serve()
    local sock = assert(ngx.req.socket())
    -- connect, send, read: an idle client is dropped after 60 s
    sock:settimeouts(5000, 5000, 60000)
    while true do
        local line = sock:receive("*l")
        if not line then
            return -- closed by the client, or idle
        end
        if not sock:send(answer(line) .. "\n") then
            return
        end
    end
end

return _M
