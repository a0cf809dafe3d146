-- resty.ffi.qrpc.pool: several servers behind one connect. The
-- checks of addrs and of the pool options, their normalised cache key, the
-- CONNECT opts record block Go reads, the per-call hash_key / retries, and
-- conn:peers(). Balancing, health, failover and re-resolution are Go's
-- (qrpc.Pool), one implementation for both hosts.

local abi = require "resty.ffi.qrpc.abi"
local numbers = require "resty.ffi.qrpc.numbers"
local wire = require "resty.ffi.qrpc.wire"
local limits = require "resty.ffi.qrpc.limits"
local addrs_mod = require "resty.ffi.qrpc.addr"
local guard = require "resty.ffi.qrpc.guard"
local share = require "resty.ffi.qrpc.share"

local bad = abi.bad
local num_str = abi.num_str
local ms_bad = numbers.ms_bad
local count_bad = numbers.count_bad
local odd_number = numbers.odd_number

local type = type
local pairs = pairs
local tonumber = tonumber
-- never a caller's __tostring (abi.show)
local tostring = abi.show
local math_floor = math.floor
local math_ceil = math.ceil
local str_find = string.find
local str_match = string.match
local tab_concat = table.concat
local wire_new = wire.new
local put = wire.put
local K = wire.keys
local tab_sort = table.sort
local getmetatable = getmetatable
local ipairs = ipairs

local MAX_MS = limits.MS
local MAX_ADDRS = limits.ADDRS
local MAX_RETRIES = limits.RETRIES
local MAX_HEDGE = limits.HEDGE
local MAX_MIN_PER_S = limits.BUDGET_MIN_PER_S
local MAX_HASH_KEY = limits.HASH_KEY


local _M = {
    -- The pool options of connect's opts table (the rest are the TLS and
    -- connection options qrpc.lua checks).
    keys = {
        balance = true, health = true, check = true, retries = true,
        resolve = true, resolver = true, try_timeout = true, hedge = true,
        budget = true, throttle = true, shared = true,
    },
}

local balances = {
    round_robin = true, least_inflight = true, hash = true, p2c = true,
}


local function is_ms(v)
    return type(v) == "number" and v == v and v >= 0 and v <= MAX_MS
end


local function is_count(v, least)
    return type(v) == "number" and v == v and v >= least and v <= MAX_MS
           and math_floor(v) == v
end


local host_ok = addrs_mod.host_ok
local norm_addr = addrs_mod.norm_addr
local is_srv = addrs_mod.is_srv

local read_nested = guard.read_nested
local read_list = guard.read_list
local check_throttle = guard.check_throttle

local health_names = { failures = true, eject = true, stall = true, on = true }
local check_names = { method = true, interval = true, timeout = true }
local hedge_names = { delay = true, max = true }
local budget_names = { ratio = true, min_per_s = true }
local failure_kinds = { connect = 1, reset = 2, timeout = 4 }
local failure_order = { "connect", "reset", "timeout" }


-- health.on -> "connect,reset,timeout" (in that order) and the bit set
-- (connect 1, reset 2, timeout 4), or nil, err.
local function check_on(on)
    if type(on) ~= "table" then
        return bad(2, "health.on must be a list of \"connect\", \"reset\", "
                      .. "\"timeout\"")
    end
    local list, n = read_list(on, "health.on")
    if not list then
        return nil, n
    end
    local mask = 0
    for i = 1, n do
        local k = failure_kinds[list[i]]
        if not k or list[n + 1] ~= nil then
            return bad(2, "health.on must be a list of \"connect\", "
                          .. "\"reset\", \"timeout\" (got "
                          .. tostring(list[i]) .. ")")
        end
        if mask % (2 * k) < k then
            mask = mask + k
        end
    end
    if mask == 0 then
        return bad(2, "health.on must not be empty (health.failures bounds "
                      .. "ejections)")
    end
    local out = {}
    for _, name in ipairs(failure_order) do
        local k = failure_kinds[name]
        if mask % (2 * k) >= k then
            out[#out + 1] = name
        end
    end
    return tab_concat(out, ","), mask
end


-- hedge = { delay = ms | "p95", max = n } -> delay text, max; false (per
-- call: none) -> "0", 0; or nil, err. argn names the argument.
-- put_hedge(buf, delay, max) writes them as records.
local function check_hedge(h, argn, what)
    if h == false then
        return "0", 0
    end
    if type(h) ~= "table" then
        return bad(argn, what .. " must be a table { delay = ms | \"p95\", "
                         .. "max = n } or false")
    end
    local err
    h, err = read_nested(h, hedge_names, what, argn)
    if not h then
        return nil, err
    end
    local delay, max = h.delay, h.max
    if delay == "p95" then
        delay = "p95"
    elseif is_ms(delay) then
        delay = tostring(math_ceil(delay))
    elseif type(delay) == "number" and odd_number(delay) then
        return ms_bad(argn, what .. ".delay", delay)
    else -- a string other than "p95" is shown: the likely typo
        return bad(argn, what .. ".delay must be a number of milliseconds "
                         .. ">= 0 or \"p95\" (got " .. tostring(delay) .. ")")
    end
    if max == nil then
        max = 1
    elseif not is_count(max, 1) or max > MAX_HEDGE then
        return count_bad(argn, what .. ".max", max, 1, MAX_HEDGE)
    end
    return delay, max
end


local function put_hedge(buf, delay, max)
    if delay == "p95" then
        put(buf, K.HEDGE_P95, 1)
    else
        put(buf, K.HEDGE_DELAY_MS, tonumber(delay))
    end
    put(buf, K.HEDGE_MAX, max)
end


-- The pool options, normalised: a default written out gives the same key
-- as an option left out.
local DEFAULT_KEY = "round_robin|3|10000|200|connect,reset,timeout||0|0|0|0|"
                    .. "|0||0|0.2|10|0|||"

local function no_pool_opts(o)
    return o.balance == nil and o.health == nil and o.check == nil
           and o.retries == nil and o.resolve == nil and o.resolver == nil
           and o.try_timeout == nil and o.hedge == nil and o.budget == nil
           and o.throttle == nil and o.shared == nil and not share.default
end


-- A connect methods entry's pool options (hedge, try_timeout; the rest of
-- the entry is resty.ffi.qrpc.proto's) -> UNARY opts record block (""
-- for none); or nil, err. what names the entry.
function _M.method_opts(mo, what)
    local buf = wire_new()
    if mo.try_timeout ~= nil then
        if not is_ms(mo.try_timeout) then
            return ms_bad(2, what .. ".try_timeout", mo.try_timeout)
        end
        put(buf, K.TRY_TIMEOUT_MS, math_ceil(mo.try_timeout))
    end
    if mo.hedge ~= nil then
        local delay, max = check_hedge(mo.hedge, 2, what .. ".hedge")
        if not delay then
            return nil, max
        end
        put_hedge(buf, delay, max)
    end
    return buf:tostring()
end


local function pool_spec(o, spec)
    local balance, health, check = o.balance, o.health, o.check
    local retries, resolve, resolver = o.retries, o.resolve, o.resolver
    if no_pool_opts(o) then
        spec.key = DEFAULT_KEY
        spec.balance = "round_robin"
        spec.retries = 0
        spec.opts = ""
        return spec
    end

    if balance ~= nil and (type(balance) ~= "string" or not balances[balance])
    then
        return bad(2, "balance must be \"round_robin\", \"least_inflight\", "
                      .. "\"hash\" or \"p2c\" (got " .. tostring(balance)
                      .. ")")
    end
    balance = balance or "round_robin"

    local failures, eject, stall, on = 3, 10000, 200, "connect,reset,timeout"
    local on_mask = 7
    if health ~= nil then
        if type(health) ~= "table" then
            return bad(2, "health must be a table { failures = n, eject = ms, "
                          .. "stall = ms, on = { ... } }")
        end
        local err
        health, err = read_nested(health, health_names, "health")
        if not health then
            return nil, err
        end
        if health.failures ~= nil then
            if not is_count(health.failures, 1) then
                return count_bad(2, "health.failures", health.failures, 1, MAX_MS)
            end
            failures = health.failures
        end
        if health.eject ~= nil then
            -- 0 is refused: Go reads 0 as "the default" (10 s), which is
            -- not what a caller writing 0 means
            if not is_ms(health.eject) or health.eject == 0 then
                return ms_bad(2, "health.eject", health.eject, "> 0")
            end
            eject = math_ceil(health.eject)
        end
        if health.stall ~= nil then
            if not is_ms(health.stall) then
                return ms_bad(2, "health.stall", health.stall)
            end
            stall = math_ceil(health.stall)
        end
        if health.on ~= nil then
            on, on_mask = check_on(health.on)
            err = on_mask
            if not on then
                return nil, err
            end
        end
    end

    local cmethod, cinterval, ctimeout = "", 0, 0
    if check ~= nil then
        if type(check) ~= "table" then
            return bad(2, "check must be a table { method = name, interval = "
                          .. "ms, timeout = ms }")
        end
        local err
        check, err = read_nested(check, check_names, "check")
        if not check then
            return nil, err
        end
        if type(check.method) ~= "string" or check.method == ""
           or str_find(check.method, "[\r\n]")
        then
            return bad(2, "check.method must be a method name")
        end
        cmethod, cinterval, ctimeout = check.method, 2000, 500
        if check.interval ~= nil then
            if not is_ms(check.interval) or check.interval == 0 then
                return ms_bad(2, "check.interval", check.interval, "> 0")
            end
            cinterval = math_ceil(check.interval)
        end
        if check.timeout ~= nil then
            if not is_ms(check.timeout) or check.timeout == 0 then
                return ms_bad(2, "check.timeout", check.timeout, "> 0")
            end
            ctimeout = math_ceil(check.timeout)
        end
    end

    if retries ~= nil and (not is_count(retries, 0) or retries > MAX_RETRIES)
    then
        return count_bad(2, "retries", retries, 0, MAX_RETRIES)
    end
    retries = retries or 0

    if resolve ~= nil and not is_ms(resolve) then
        return ms_bad(2, "resolve", resolve)
    end
    resolve = resolve and math_ceil(resolve) or 0

    if resolver ~= nil and (type(resolver) ~= "string"
                            or not str_find(resolver, "^[^\r\n]+:%d+$")
                            or not host_ok(str_match(resolver, "^(.*):")))
    then
        return bad(2, "resolver must be a string host:port")
    end
    resolver = resolver or ""

    local try = o.try_timeout
    if try ~= nil and not is_ms(try) then
        return ms_bad(2, "try_timeout", try)
    end
    try = try and math_ceil(try) or 0

    local hdelay, hmax = "", 0
    if o.hedge ~= nil and o.hedge ~= false then
        hdelay, hmax = check_hedge(o.hedge, 2, "hedge")
        if not hdelay then
            return nil, hmax
        end
    end

    local ratio, min_per_s = 0.2, 10
    local budget = o.budget
    if budget ~= nil then
        if type(budget) ~= "table" then
            return bad(2, "budget must be a table { ratio = 0..1, "
                          .. "min_per_s = n }")
        end
        local err
        budget, err = read_nested(budget, budget_names, "budget")
        if not budget then
            return nil, err
        end
        if budget.ratio ~= nil then
            local r = budget.ratio
            if type(r) ~= "number" then
                return bad(2, "budget.ratio must be a number 0..1 (got "
                              .. type(r) .. ")")
            end
            local odd = odd_number(r)
            if odd then
                return bad(2, "budget.ratio must be a number 0..1, not " .. odd)
            end
            if r < 0 or r > 1 then
                return bad(2, "budget.ratio must be a number 0..1 (got "
                              .. tostring(r) .. ")")
            end
            ratio = r
        end
        if budget.min_per_s ~= nil then
            local m = budget.min_per_s
            if not is_count(m, 0) or m > MAX_MIN_PER_S then
                return count_bad(2, "budget.min_per_s", m, 0, MAX_MIN_PER_S)
            end
            min_per_s = m
        end
    end

    local tk, tcodes, tlist = check_throttle(o.throttle)
    if not tk then
        return nil, tcodes
    end

    local shared, share_name, serr = share.option(o.shared)
    if serr then
        return nil, serr
    end
    spec.shared = shared
    spec.share_name = share_name
    spec.failures = failures
    spec.throttle = tk ~= 0
    spec.check_ms = cinterval
    spec.resolve_ms = resolve

    spec.key = tab_concat({ balance, failures, eject, stall, on, cmethod,
                            cinterval, ctimeout, retries, resolve, resolver,
                            try, hdelay, hmax, ratio, min_per_s, tk, tcodes,
                            shared or "", share_name or "" }, "|")
    spec.balance = balance
    spec.retries = retries
    local b = wire_new()
    put(b, K.BALANCE, balance)
    put(b, K.HEALTH_FAILURES, failures)
    put(b, K.HEALTH_EJECT_MS, eject)
    put(b, K.HEALTH_STALL_MS, stall)
    put(b, K.HEALTH_ON, on_mask)
    put(b, K.RETRIES, retries)
    put(b, K.RESOLVE_MS, resolve)
    put(b, K.TRY_TIMEOUT_MS, try)
    put(b, K.BUDGET_RATIO, ratio)
    put(b, K.BUDGET_MIN_PER_S, min_per_s)
    if hmax > 0 then
        put_hedge(b, hdelay, hmax)
    end
    if cmethod ~= "" then
        put(b, K.CHECK_METHOD, cmethod)
        put(b, K.CHECK_INTERVAL_MS, cinterval)
        put(b, K.CHECK_TIMEOUT_MS, ctimeout)
    end
    if resolver ~= "" then
        put(b, K.RESOLVER, resolver)
    end
    if tk ~= 0 then
        put(b, K.THROTTLE_K, tk)
        for i = 1, tlist and #tlist or 0 do
            put(b, K.THROTTLE_CODE, tlist[i])
        end
    end
    spec.opts = b:tostring()
    return spec
end


-- The spec of a lone address without pool options, by address. Checking
-- an address takes string patterns, which LuaJIT does not compile: about
-- 1 us of every connect, most of what a connect to a cached connection
-- costs. Read-only once made (no caller writes a spec); emptied past
-- MAX_LONE addresses, so that addresses made up per request cannot grow
-- it without bound.
local lone, nlone = {}, 0
local MAX_LONE = 1024


-- checked(addr): addr is a string already found to be host:port.
function _M.checked(addr)
    return lone[addr] ~= nil
end


function _M.lone_count()
    return nlone
end


-- check(addrs, opts) -> spec | nil, err. addrs is "host:port" or a list
-- of them; spec has addr (the cache's address key: the sorted list joined
-- by ","), key (the normalised pool options), opts (CONNECT's record block,
-- "" for one address with defaults: today's behaviour), balance, retries
-- and naddrs.
-- A lone address's spec is shared by every connect to it: read-only.
function _M.check(addrs, opts)
    if type(addrs) == "string" and is_srv(addrs) then
        -- an SRV name stands for its servers: always a pool
        addrs = { addrs }
    end
    if type(addrs) == "string" then
        local s = lone[addrs]
        if s and no_pool_opts(opts) then
            return s
        end
    end
    local spec = {}
    if type(addrs) == "string" then
        local a, err = norm_addr(addrs, "addr")
        if not a then
            return nil, err
        end
        spec.addr, spec.naddrs = a, 1
    elseif type(addrs) == "table" then
        if getmetatable(addrs) ~= nil then
            -- read through its metamethods once, under pcall
            local list, len = read_list(addrs, "addrs", 1)
            if not list then
                return nil, len
            end
            list[len + 1] = nil
            addrs = list
        end
        local n, count = #addrs, 0
        for _ in pairs(addrs) do
            count = count + 1
        end
        if n == 0 then
            return bad(1, "addrs must not be empty")
        end
        if count ~= n then
            return bad(1, "addrs must be a list of \"host:port\" strings")
        end
        if n > MAX_ADDRS then
            return bad(1, "addrs: at most " .. MAX_ADDRS .. " addresses")
        end
        local sorted, seen = {}, {}
        for i = 1, n do
            local a, err = norm_addr(addrs[i], "addrs[" .. i .. "]")
            if not a then
                return nil, err
            end
            if is_srv(a) then
                spec.srv = true
            end
            if seen[a] then
                return bad(1, "duplicate address \"" .. a .. "\"")
            end
            seen[a] = true
            sorted[i] = a
        end
        tab_sort(sorted)
        spec.addr, spec.naddrs, spec.list = tab_concat(sorted, ","), n, sorted
    else
        -- (a list is also accepted: see README, "Several servers")
        return bad(1, "addr must be a non-empty string host:port (got "
                      .. type(addrs) .. ")")
    end
    local ok, err = pool_spec(opts, spec)
    if not ok then
        return nil, err
    end
    if spec.list and (spec.naddrs > 1 or spec.opts ~= "" or spec.srv) then
        local b = wire_new()
        for i = 1, spec.naddrs do
            put(b, K.ADDR, spec.list[i])
        end
        spec.opts = b:put(spec.opts):tostring()
    end
    if type(addrs) == "string" and no_pool_opts(opts) then
        if nlone >= MAX_LONE then
            lone, nlone = {}, 0
        end
        lone[addrs] = spec
        nlone = nlone + 1
    end
    return spec
end


-- Per-call options: hash_key and retries (default: the connection's),
-- try_timeout and hedge (default: the method's entry in connect's methods
-- option, else the connection's). Returns true, hash_key (or nil),
-- retries, UNARY opts record block (or nil); or nil, err.
function _M.call_opts(conn, opts, argn, method)
    local key, retries = nil, conn.retries or 0
    local copts = nil
    local methods = conn.methods
    if methods and method then
        local m = methods[method]
        copts = m and m.copts
    end
    if opts ~= nil then
        key = opts.hash_key
        if key ~= nil then
            if type(key) == "number" then
                key = num_str(key)
            elseif type(key) ~= "string" then
                return bad(argn, "hash_key must be a string (got " .. type(key)
                                 .. ")")
            end
            if #key > MAX_HASH_KEY then
                return bad(argn, "hash_key must be at most " .. MAX_HASH_KEY
                                 .. " bytes (got " .. #key .. ")")
            end
        end
        local r = opts.retries
        if r ~= nil then
            if not is_count(r, 0) or r > MAX_RETRIES then
                return count_bad(argn, "retries", r, 0, MAX_RETRIES)
            end
            retries = r
        end
        local try, hedge = opts.try_timeout, opts.hedge
        if try ~= nil or hedge ~= nil then
            -- the method's defaults first: a record given again wins
            local b = wire_new():put(copts or "")
            if try ~= nil then
                if not is_ms(try) then
                    return ms_bad(argn, "try_timeout", try)
                end
                put(b, K.TRY_TIMEOUT_MS, math_ceil(try))
            end
            if hedge ~= nil then
                local delay, max = check_hedge(hedge, argn, "hedge")
                if not delay then
                    return nil, max
                end
                put_hedge(b, delay, max)
            end
            copts = b:tostring()
        end
    end
    if key == nil and conn.balance == "hash" then
        return bad(argn, "hash_key is required: the connection balances by "
                         .. "\"hash\"")
    end
    return true, key, retries, copts
end


_M.parse_peers = addrs_mod.parse_peers
_M.parse_connections = addrs_mod.parse_connections


return _M
