-- qfuzz: calls every public function of resty.ffi.qrpc with random
-- arguments inside nginx (nginx/fuzz_test.go) and checks the contract:
-- nothing throws, a failure is nil (or false) and a string of the
-- documented vocabulary, never "bad command:", never nil, nil; connect,
-- unary and event give an info table with their failures.

local qrpc = require "resty.ffi.qrpc"
local qt = require "qtest"

local _M = {}

local random = math.random
local huge = math.huge

-- The fixed reasons after each word (docs/api.md, Errors).
local reasons = {
    connect = {
        "certificate signed by unknown authority", "certificate is for another host",
        "certificate expired or not yet valid", "certificate invalid",
        "certificate pin mismatch", "timeout",
        "no application protocol (ALPN qrpc refused)",
        "client certificate required by server", "client certificate rejected by server",
        "tls handshake failed", "cannot resolve host", "cannot resolve or reach address",
        "refused", "failed",
    },
    ["connection lost"] = {
        "idle timeout", "stateless reset", "closed by server", "closed locally",
        "transport error", "stream reset", "stream closed by server", "protocol error",
        "refused", "other",
    },
    ["too large"] = { "request exceeds max_frame_size" },
}
reasons.unavailable = { "reconnecting", "no server up", "no stream in service" }
for _, r in ipairs(reasons.connect) do
    reasons.unavailable[#reasons.unavailable + 1] = r
end
for _, r in ipairs(reasons["connection lost"]) do
    reasons.unavailable[#reasons.unavailable + 1] = r
end
local reason_set = {}
for w, list in pairs(reasons) do
    reason_set[w] = {}
    for _, r in ipairs(list) do
        reason_set[w][r] = true
    end
end

-- A failure's err: nil if it is in the vocabulary, else why not.
local function bad_vocab(err)
    if type(err) ~= "string" then
        return "err is a " .. type(err)
    end
    if err == "timeout" or err == "closed" or err == "queue full"
       or err == "internal error"
    then
        return nil
    end
    if err:find("bad command", 1, true) then
        return "bad command"
    end
    for _, free in ipairs({ "^bad argument #[1-4]: .", "^bad config: .", "^bad message: .",
                            "^bad response: .", "^bad proto: .", "^qrpc: ." }) do
        if err:find(free) then
            return nil
        end
    end
    local word, reason = err:match("^([%a ]+): (.+)$")
    if word and reason_set[word] then
        if reason_set[word][reason] then
            return nil
        end
        return "reason not in the list"
    end
    return "not in the vocabulary"
end

local function thrower(what)
    return function() error("fuzz " .. what .. " raised", 0) end
end

-- Tables whose metamethods raise.
local function evil()
    local mt = {}
    local k = random(6)
    if k == 1 then
        mt.__index = thrower("__index")
    elseif k == 2 then
        mt.__tostring = thrower("__tostring")
    elseif k == 3 then
        mt.__len = thrower("__len")
    elseif k == 4 then
        mt.__pairs = thrower("__pairs")
    elseif k == 5 then
        mt.__index = thrower("__index")
        mt.__tostring = thrower("__tostring")
        mt.__len = thrower("__len")
        mt.__pairs = thrower("__pairs")
        mt.__newindex = thrower("__newindex")
        mt.__eq = thrower("__eq")
        mt.__concat = thrower("__concat")
    else
        mt.__index = function() return setmetatable({}, mt) end
        mt.__tostring = thrower("__tostring")
    end
    return setmetatable({ random(10) }, mt)
end

local big = string.rep("x", 70 * 1024)
local names = {
    -- connect
    "server_name", "ca", "cert", "key", "pins", "insecure", "conns", "streams",
    "stream_batch", "timeout", "idle_timeout", "max_frame_size", "propagate",
    "methods", "balance", "health", "check", "retries", "try_timeout", "hedge",
    "budget", "resolve", "resolver",
    -- calls
    "headers", "hash_key", "request", "response", "json", "discard_unknown",
    "proto_names",
    -- configure
    "host", "lib", "socket_dir", "metrics_dict", "max_connections", "gomaxprocs",
    "metrics",
    -- nested
    "failures", "eject", "stall", "on", "method", "interval", "delay", "max",
    "ratio", "min_per_s",
    -- not options
    "tiemout", "", "x",
}

local strings = {
    "", "a", "echo", "greet", "nope", "127.0.0.1:1", "::1:8443", "[::1]:1",
    "host:0", ":1", "round_robin", "hash", "p2c", "p95", "connect", "reset",
    "timeout", "request", "response", "demo.HelloRequest", "demo.HelloReply",
    "builtin", "resty_ffi", "/tmp", "nope.Msg", "\0", "x\r\ny", "sha256//abc",
}

local closed_conns = {}
local foreign = {}
local value

local function scalar()
    local k = random(16)
    if k == 1 then return nil
    elseif k == 2 then return true
    elseif k == 3 then return false
    elseif k == 4 then return 0 / 0
    elseif k == 5 then return huge
    elseif k == 6 then return -huge
    elseif k == 7 then return random(-5, 70)
    elseif k == 8 then return random() * 100000
    elseif k == 9 then return 2 ^ random(0, 63)
    elseif k == 10 then return -2 ^ random(0, 63)
    elseif k == 11 then return big
    elseif k == 12 then return string.rep("y", random(0, 300))
    elseif k == 13 then return function() end
    elseif k == 14 then return coroutine.create(function() end)
    elseif k == 15 then return newproxy(true)
    end
    return strings[random(#strings)]
end

local function opts_table(depth)
    local t = {}
    for _ = 1, random(0, 4) do
        t[names[random(#names)]] = value(depth + 1)
    end
    if random(8) == 1 then
        t[random(3)] = value(depth + 1)
    end
    if random(10) == 1 then
        t.self = t     -- a cycle
    end
    if random(6) == 1 then
        return setmetatable({}, { __index = t })
    end
    return t
end

value = function(depth)
    depth = depth or 0
    local k = random(12)
    if depth > 3 or k <= 5 then
        return scalar()
    end
    if k == 6 then
        return evil()
    elseif k == 7 then
        local l = {}
        for i = 1, random(0, 4) do
            l[i] = scalar()
        end
        return l
    elseif k == 8 and #closed_conns > 0 then
        return closed_conns[random(#closed_conns)]
    elseif k == 9 then
        return foreign[random(#foreign)]
    end
    return opts_table(depth)
end

-- A method table the connection's options may take.
local function call_opts()
    local k = random(5)
    if k == 1 then return nil end
    if k == 2 then return { timeout = random(0, 2) == 0 and value() or random(1, 3000) } end
    if k == 3 then return { headers = value() } end
    return value()
end

local counts, fails, samples = {}, {}, {}

local spent = {}
local t_last = 0
local function record(name, ok, a, b, c, wants_info)
    ngx.update_time()
    local now = ngx.now()
    spent[name] = (spent[name] or 0) + (now - t_last)
    t_last = now
    counts[name] = (counts[name] or 0) + 1
    local why
    if not ok then
        why = "threw: " .. (type(a) == "string" and a:sub(1, 120) or type(a))
    elseif a == nil or a == false then
        if b == nil then
            why = "nil, nil"
        else
            why = bad_vocab(b)
            if not why and wants_info and type(c) ~= "table" then
                why = "no info table"
            end
        end
    end
    if why then
        local key = name .. ": " .. why
        fails[key] = (fails[key] or 0) + 1
        if #samples < 20 then
            samples[#samples + 1] = key .. " ("
                .. (type(b) == "string" and b:sub(1, 120) or type(b)) .. ")"
        end
    end
end

local function conn_from(v)
    if random(4) == 1 then
        return value()
    end
    return v
end

-- run(n, seed, total): n calls of each function; returns a report that
-- says "=n" for a function called total times so far in this worker (the
-- counts add up over requests: one request stays short).
function _M.run(n, seed, total)
    math.randomseed(seed)
    local conn = assert(qt.connect())
    -- connections to close: their own options, so conn is never one
    local spare = assert(qt.connect({ streams = 3 }))
    assert(spare:close())
    closed_conns[1] = spare
    foreign = {
        {}, { handle = 1 }, setmetatable({}, { __index = conn }),
        setmetatable({}, { __index = function() error("foreign") end }),
        qrpc, newproxy(true),
    }
    local gp = qrpc.stats().gomaxprocs
    local pools0 = qrpc.stats().pools
    for i = 1, n do
        -- connect: random addr and opts; the odd valid one dials
        ngx.update_time()
        t_last = ngx.now()
        local addr = random(3) == 1 and qt.addr or value()
        local copts = value()
        local ok, a, b, c = pcall(qrpc.connect, addr, copts)
        record("qrpc.connect", ok, a, b, c, true)
        if ok and a and random(2) == 1 and a ~= conn then
            local cok, ca, cb = pcall(a.close, a)
            record("conn:close", cok, ca, cb)
            closed_conns[#closed_conns % 16 + 1] = a
        end

        local self = conn_from(conn)
        -- (not "x and value() or y": value() may be nil or false)
        local m = random(2) == 1 and "echo" or "nope"
        if random(3) == 1 then
            m = value()
        end
        local body = "b" .. i
        if random(3) == 1 then
            body = value()
        end
        ok, a, b, c = pcall(conn.unary, self, m, body, call_opts())
        record("conn:unary", ok, a, b, c, true)

        ok, a, b, c = pcall(conn.event, conn_from(conn), m, body, call_opts())
        record("conn:event", ok, a, b, c, true)

        local victim = random(2) == 1 and closed_conns[random(#closed_conns)] or value()
        ok, a, b = pcall(conn.close, victim)
        record("conn:close", ok, a, b)

        ok, a, b = pcall(conn.stats, conn_from(conn))
        record("conn:stats", ok, a, b)

        ok, a, b = pcall(conn.peers, conn_from(conn))
        record("conn:peers", ok, a, b)

        ok, a, b = pcall(qrpc.configure, value())
        record("qrpc.configure", ok, a, b)
        if ok and a then
            -- a valid random setting: back to what the test runs with
            qrpc.configure({ max_connections = 256, metrics = true, gomaxprocs = gp })
        end

        ok, a, b = pcall(qrpc.stats, random(4) == 1 and value() or nil)
        record("qrpc.stats", ok, a, b)

        ok, a, b = pcall(qrpc.metrics, value())
        record("qrpc.metrics", ok, a, b)
    end
    local out = {}
    if ngx.var.arg_timing then
        for k, v in pairs(spent) do
            ngx.say("fuzz time ", k, " ", v)
        end
    end
    local fnames = {}
    for k in pairs(counts) do
        fnames[#fnames + 1] = k
    end
    table.sort(fnames)
    for _, k in ipairs(fnames) do
        out[#out + 1] = k .. "=" .. (counts[k] >= total and "n" or counts[k])
    end
    local nf = 0
    local fl = {}
    for k, v in pairs(fails) do
        nf = nf + v
        fl[#fl + 1] = k .. " x" .. v
    end
    table.sort(fl)
    -- the worker keeps its connection, and it answers
    local res, err = conn:unary("echo", "after")
    local st = qrpc.stats()
    return table.concat(out, " ") .. "\nfailures " .. nf .. "\n"
           .. table.concat(fl, "\n") .. (nf > 0 and "\n" or "")
           .. "after: " .. (res and res.body or tostring(err))
           .. " pools kept " .. tostring(st.pools >= pools0) .. "\n"
           .. (nf > 0 and ("samples:\n" .. table.concat(samples, "\n") .. "\n") or ""),
           counts
end

return _M
