-- qstream: what the stream tests (stream_test.go) run, the same code in
-- both subsystems: one request line "<op> <arg>" gets one answer line,
-- "OK ..." or "ERR <error>". A stream {} server reads the lines from its
-- TCP client (serve); an http location answers one line given as ?l=.

local qrpc = require "resty.ffi.qrpc"
local qtest = require "qtest"

local _M = {}

local function conn()
    return qtest.connect()
end

local ops = {}

-- unary <method> <body>
function ops.unary(arg)
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local method, body = arg:match("^(%S+)%s?(.*)$")
    local res
    res, err = c:unary(method, body, { timeout = 10000 })
    if not res then
        return "ERR " .. err
    end
    return "OK " .. res.code .. " " .. res.body
end

-- slowecho [<ms>] <body>: a call the server holds ms (300) ms, then an
-- echo of body (calls in flight across a reload or a quit)
function ops.slowecho(arg)
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local ms, rest = arg:match("^(%d+) (.*)$")
    if ms then
        arg = rest
    end
    local res
    res, err = c:unary("slow", ms or "300", { timeout = 10000 })
    if not res then
        return "ERR " .. err
    end
    return ops.unary("echo " .. arg)
end

-- timeout: a call that outlives its timeout
function ops.timeout()
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local res
    res, err = c:unary("slow", "2000", { timeout = 100 })
    if res then
        return "OK " .. res.body
    end
    return "ERR " .. err
end

-- event <key>: counted by the server under key
function ops.event(arg)
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local ok
    ok, err = c:event("count", arg)
    if not ok then
        return "ERR " .. err
    end
    return "OK sent"
end

-- closed: a call on a closed connection (its own, not the cached one)
function ops.closed()
    local c, err = qtest.connect({ conns = 2 })
    if not c then
        return "ERR " .. err
    end
    assert(c:close())
    local res
    res, err = c:unary("echo", "x")
    if res then
        return "OK " .. res.body
    end
    local ok, eerr = c:event("count", "closed")
    return "ERR " .. err .. " / " .. tostring(ok) .. " " .. tostring(eerr)
end

-- badargs: what misuse answers, every error joined
function ops.badargs()
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local out = {}
    local function add(_, e)
        out[#out + 1] = tostring(e)
    end
    add(c:unary(42))
    add(c:unary("echo", {}))
    add(c:unary("echo", "x", { timeout = -1 }))
    add(c:unary("echo", "x", { nope = 1 }))
    add(c:event(nil))
    add(qrpc.connect(""))
    add(qrpc.connect("127.0.0.1:1", { conns = 0 }))
    add(qrpc.configure{ host = "nope" })
    add(qrpc.proto.load("/nonexistent/x.proto"))
    return "ERR " .. table.concat(out, " | ")
end

-- proto: a schema loaded here (qstream.proto in the prefix, written by
-- the test), a Lua table in and out through the echo method
function ops.proto()
    local ok, err = qrpc.proto.load(qtest.dir .. "/qstream.proto")
    if not ok then
        return "ERR " .. err
    end
    local c
    c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local res
    res, err = c:unary("echo", { name = ngx.config.subsystem, n = 7 },
                       { request = "qs.Msg", response = "qs.Msg" })
    if not res then
        return "ERR " .. err
    end
    return "OK " .. res.code .. " " .. tostring(res.body.name) .. " " .. tostring(res.body.n)
end

-- stats: qrpc.stats() and the connection's
function ops.stats()
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local s = qrpc.stats()
    local cs = c:stats()
    return "OK subsystem=" .. tostring(s.subsystem) .. " host=" .. tostring(s.host)
           .. " loaded=" .. tostring(s.loaded) .. " calls=" .. tostring(cs.calls ~= nil)
end

-- peers: the connection's servers
function ops.peers()
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local p
    p, err = c:peers()
    if not p then
        return "ERR " .. err
    end
    return "OK " .. #p .. " " .. p[1].state
end

-- metrics: this worker's text has the calls counter
function ops.metrics()
    local text, err = qrpc.metrics()
    if not text then
        return "ERR " .. err
    end
    return "OK " .. tostring(text:find("qrpc_client_calls_total", 1, true) ~= nil)
           .. " " .. (text:match('qrpc_client_vm_completions_total{subsystem="'
                                 .. ngx.config.subsystem .. '"} (%d+)') or "none")
end

-- kill: a light thread killed while its call waits, then a call that works
function ops.kill(arg)
    local c, err = conn()
    if not c then
        return "ERR " .. err
    end
    local th = ngx.thread.spawn(function()
        return c:unary("slow", "300", { timeout = 3000 })
    end)
    -- until the call is in flight in Go (bounded)
    qtest.wait(10, function() return c:stats().inflight > 0 end)
    local ok, kerr = ngx.thread.kill(th)
    if not ok then
        return "ERR kill: " .. tostring(kerr)
    end
    local res
    res, err = c:unary("echo", arg, { timeout = 10000 })
    if not res then
        return "ERR " .. err
    end
    return "OK killed " .. res.body
end

-- echo_many: threads light threads at once, each echoing rounds bodies
-- of its own (sizes[...] + its number of bytes, tagged with the thread
-- and round); how many came back other than sent (Lua strings are
-- interned: == compares every byte).
local function echo_many(threads, rounds, sizes)
    local echo = require("resty.ffi.qrpc.testing").echo
    local function run(t)
        local wrong = 0
        for i = 1, rounds do
            local tag = string.format("<%03d:%03d>", t, i)
            local size = sizes[(t + i) % #sizes + 1] + t
            local body = string.rep(tag, math.floor(size / #tag)) .. tag:sub(1, size % #tag)
            local res, err = echo(body)
            if res ~= body then
                wrong = wrong + 1
                ngx.log(ngx.ERR, "echo_many: ", tag, " of ", #body, " bytes came back ",
                        res and (#res .. " bytes, different") or err)
            end
        end
        return wrong
    end
    local ths = {}
    for t = 1, threads do
        ths[t] = ngx.thread.spawn(run, t)
    end
    local wrong = 0
    for t = 1, threads do
        local ok, n = ngx.thread.wait(ths[t])
        wrong = wrong + (ok and n or 1000)
    end
    return wrong
end

-- echoes <threads> <rounds> <size,...>: echo_many.
function ops.echoes(arg)
    local threads, rounds, list = arg:match("^(%d+) (%d+) ([%d,]+)$")
    if not threads then
        return "ERR echoes wants <threads> <rounds> <size,...>"
    end
    local sizes = {}
    for n in list:gmatch("%d+") do
        sizes[#sizes + 1] = tonumber(n)
    end
    return "wrong: " .. echo_many(tonumber(threads), tonumber(rounds), sizes)
end

-- techo: resty.ffi.qrpc.testing's echo, whose built-in host path fills
-- one command table shared by every echo: a 0-byte body; an echo whose
-- light thread is killed while it waits; a refused argument; then 30
-- light threads at once, each echoing its own bodies of 1 byte to 1 MB
-- (echo_many).
function ops.techo()
    local echo = require("resty.ffi.qrpc.testing").echo
    local r, err = echo("")
    if r ~= "" then
        return "ERR empty: " .. tostring(r and #r) .. " " .. tostring(err)
    end
    -- spawn runs the thread up to its first yield: its echo is queued
    local th = ngx.thread.spawn(echo, string.rep("k", 1048576))
    local kok, kerr = ngx.thread.kill(th)
    if not kok then
        return "ERR kill: " .. tostring(kerr)
    end
    local _, berr = echo(1)
    r, err = echo("after")
    if r ~= "after" then
        return "ERR after a refused echo: " .. tostring(r) .. " " .. tostring(err)
    end
    local wrong = echo_many(30, 5, { 0, 1, 100, 4096, 65536, 1048576 })
    -- the killed echo's completion comes and finds nobody (lua-resty-ffi
    -- counts a killed call until its deadline: resty_ffi.lua)
    local idle = qrpc.stats().host ~= "builtin"
        or qtest.wait(10, function() return qrpc.stats().waiting == 0 end)
    return "OK wrong=" .. wrong .. " idle=" .. tostring(idle) .. " refused=" .. tostring(berr)
end

-- timer <body>: a unary call from a timer, its answer waited for here
function ops.timer(arg)
    local d = ngx.shared.qtest_stream or ngx.shared.qtest
    local key = "timer-" .. arg
    d:delete(key)
    local ok, err = ngx.timer.at(0, function()
        d:set(key, ops.unary("echo " .. arg))
    end)
    if not ok then
        return "ERR " .. err
    end
    return "OK " .. tostring(qtest.wait(15, function() return d:get(key) end))
end

-- lastlog: the answer of the last log-phase check (see log)
function ops.lastlog()
    local d = ngx.shared.qtest_stream or ngx.shared.qtest
    return "OK " .. tostring(d:get("lastlog"))
end

-- preread: what preread_by_lua got (see preread)
function ops.preread()
    return "OK " .. tostring(ngx.ctx.preread)
end

function _M.one(line)
    local op, arg = line:match("^(%S+)%s?(.*)$")
    local f = op and ops[op]
    if not f then
        return "ERR unknown op " .. tostring(op)
    end
    local ok, res = pcall(f, arg)
    if not ok then
        return "ERR raised " .. tostring(res)
    end
    return res
end

-- serve: the content handler of a stream server: lines until EOF.
function _M.serve()
    local sock = assert(ngx.req.socket())
    sock:settimeouts(10000, 10000, 30000)
    for _ = 1, 100000 do
        local line, err = sock:receive("*l")
        if not line then
            if err ~= "closed" then
                ngx.log(ngx.WARN, "qstream: receive: ", err)
            end
            return
        end
        local ok, serr = sock:send(_M.one(line) .. "\n")
        if not ok then
            ngx.log(ngx.WARN, "qstream: send: ", serr)
            return
        end
    end
end

-- preread: a unary call before content, kept in ngx.ctx.
function _M.preread()
    local res = ops.unary("echo preread-" .. ngx.var.remote_port)
    ngx.ctx.preread = res
end

-- log: in the log phase an event goes out; a unary is refused (it yields).
function _M.log()
    local c = conn() -- the cached connection: connect yields nowhere here
    local d = ngx.shared.qtest_stream or ngx.shared.qtest
    if not c then
        d:set("lastlog", "no connection")
        return
    end
    local ok, err = c:event("count", "log-" .. ngx.config.subsystem)
    local _, uerr = c:unary("echo", "x")
    -- a connection not dialled yet cannot be dialled here
    local _, cerr = qtest.connect({ conns = 3 })
    d:set("lastlog", "event=" .. tostring(ok or err) .. " unary=" .. tostring(uerr)
                     .. " connect=" .. tostring(cerr))
end

return _M
