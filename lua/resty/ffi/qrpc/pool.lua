-- resty.ffi.qrpc.pool: several servers behind one connect. The
-- checks of addrs and of the pool options, their normalised cache key, the
-- CONNECT "opts" lines Go reads, the per-call hash_key / retries, and
-- conn:peers(). Balancing, health, failover and re-resolution are Go's
-- (qrpc.Pool), one implementation for both hosts.

local abi = require "resty.ffi.qrpc.abi"

local bad = abi.bad

local type = type
local pairs = pairs
local tostring = tostring
local tonumber = tonumber
local math_floor = math.floor
local math_ceil = math.ceil
local str_find = string.find
local str_match = string.match
local str_gmatch = string.gmatch
local tab_concat = table.concat
local tab_sort = table.sort
local str_lower = string.lower
local pcall = pcall

local MAX_MS = 2147483647
local MAX_ADDRS = 256
-- Go refuses more (maxRetries in internal/bridge/command.go; the nginx
-- suite's TestRetriesBoundMatchesGo compares the two).
local MAX_RETRIES = 16


local _M = {
    -- The pool options of connect's opts table (the rest are the TLS and
    -- connection options qrpc.lua checks).
    keys = {
        balance = true, health = true, check = true, retries = true,
        resolve = true, resolver = true,
    },
}

local balances = { round_robin = true, least_inflight = true, hash = true }


local function is_ms(v)
    return type(v) == "number" and v == v and v >= 0 and v <= MAX_MS
end


local function is_count(v, least)
    return type(v) == "number" and v == v and v >= least and v <= MAX_MS
           and math_floor(v) == v
end


-- norm_addr(a, what) -> "host:port" with the host in lower case and the
-- port as a plain number ("Host:038411" is "host:38411"), so that two
-- spellings of one server are one server; or nil, "bad argument #1: ...".
local function norm_addr(a, what)
    if type(a) ~= "string" then
        return bad(1, what .. " must be a non-empty string host:port (got "
                      .. type(a) .. ")")
    end
    if a == "" then
        return bad(1, what .. " must be host:port, not an empty string")
    end
    local host, port = str_match(a, "^(.*):(%d+)$")
    if not host then
        return bad(1, what .. " must be host:port (got \"" .. a .. "\")")
    end
    if host == "" then
        return bad(1, what .. " must be host:port, the host is empty (got \""
                      .. a .. "\")")
    end
    local p = tonumber(port)
    if p < 1 or p > 65535 then
        return bad(1, what .. " must be host:port with a port 1..65535 (got \""
                      .. a .. "\")")
    end
    return str_lower(host) .. ":" .. p
end


-- A nested options table (health, check) read under pcall: its keys
-- (pairs, or __pairs) and the values of names, so that a metamethod that
-- raises gives "bad argument #2: opts.<what> raised an error" instead of
-- throwing. Returns a plain copy and its unknown key, or nil, err.
local function read_nested(t, names, what)
    local copy, unknown = {}, nil
    local ok, err = pcall(function()
        for k in pairs(t) do
            if not names[k] and unknown == nil then
                unknown = k
            end
        end
        for k in pairs(names) do
            copy[k] = t[k]
        end
    end)
    if not ok then
        return bad(2, "opts." .. what .. " raised an error: " .. tostring(err))
    end
    if unknown ~= nil then
        return bad(2, "unknown " .. what .. " option '" .. tostring(unknown)
                      .. "'")
    end
    return copy
end

local health_names = { failures = true, eject = true, stall = true }
local check_names = { method = true, interval = true, timeout = true }


-- The pool options, normalised: a default written out gives the same key
-- as an option left out.
local DEFAULT_KEY = "round_robin|3|10000|200||0|0|0|0|"

local function pool_spec(o, spec)
    local balance, health, check = o.balance, o.health, o.check
    local retries, resolve, resolver = o.retries, o.resolve, o.resolver
    if balance == nil and health == nil and check == nil and retries == nil
       and resolve == nil and resolver == nil
    then
        spec.key = DEFAULT_KEY
        spec.balance = "round_robin"
        spec.retries = 0
        spec.lines = ""
        return spec
    end

    if balance ~= nil and (type(balance) ~= "string" or not balances[balance])
    then
        return bad(2, "balance must be \"round_robin\", \"least_inflight\" "
                      .. "or \"hash\" (got " .. tostring(balance) .. ")")
    end
    balance = balance or "round_robin"

    local failures, eject, stall = 3, 10000, 200
    if health ~= nil then
        if type(health) ~= "table" then
            return bad(2, "health must be a table { failures = n, eject = ms, "
                          .. "stall = ms }")
        end
        local err
        health, err = read_nested(health, health_names, "health")
        if not health then
            return nil, err
        end
        if health.failures ~= nil then
            if not is_count(health.failures, 1) then
                return bad(2, "health.failures must be a positive integer")
            end
            failures = health.failures
        end
        if health.eject ~= nil then
            if not is_ms(health.eject) then
                return bad(2, "health.eject must be a number of milliseconds "
                              .. ">= 0")
            end
            eject = math_ceil(health.eject)
        end
        if health.stall ~= nil then
            if not is_ms(health.stall) then
                return bad(2, "health.stall must be a number of milliseconds "
                              .. ">= 0")
            end
            stall = math_ceil(health.stall)
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
                return bad(2, "check.interval must be a number of "
                              .. "milliseconds > 0")
            end
            cinterval = math_ceil(check.interval)
        end
        if check.timeout ~= nil then
            if not is_ms(check.timeout) or check.timeout == 0 then
                return bad(2, "check.timeout must be a number of "
                              .. "milliseconds > 0")
            end
            ctimeout = math_ceil(check.timeout)
        end
    end

    if retries ~= nil and (not is_count(retries, 0) or retries > MAX_RETRIES)
    then
        return bad(2, "retries must be an integer 0.." .. MAX_RETRIES
                      .. " (got " .. tostring(retries) .. ")")
    end
    retries = retries or 0

    if resolve ~= nil and not is_ms(resolve) then
        return bad(2, "resolve must be a number of milliseconds >= 0")
    end
    resolve = resolve and math_ceil(resolve) or 0

    if resolver ~= nil and (type(resolver) ~= "string"
                            or not str_find(resolver, "^[^\r\n]+:%d+$"))
    then
        return bad(2, "resolver must be a string host:port")
    end
    resolver = resolver or ""

    spec.key = tab_concat({ balance, failures, eject, stall, cmethod,
                            cinterval, ctimeout, retries, resolve, resolver },
                          "|")
    spec.balance = balance
    spec.retries = retries
    local lines = {
        "balance=" .. balance,
        "health_failures=" .. failures,
        "health_eject_ms=" .. eject,
        "health_stall_ms=" .. stall,
        "retries=" .. retries,
        "resolve_ms=" .. resolve,
    }
    if cmethod ~= "" then
        lines[#lines + 1] = "check_method=" .. cmethod
        lines[#lines + 1] = "check_interval_ms=" .. cinterval
        lines[#lines + 1] = "check_timeout_ms=" .. ctimeout
    end
    if resolver ~= "" then
        lines[#lines + 1] = "resolver=" .. resolver
    end
    spec.lines = tab_concat(lines, "\n") .. "\n"
    return spec
end


local function no_pool_opts(o)
    return o.balance == nil and o.health == nil and o.check == nil
           and o.retries == nil and o.resolve == nil and o.resolver == nil
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
-- by ","), key (the normalised pool options), lines (CONNECT's opts text,
-- "" for one address with defaults: today's behaviour), balance, retries
-- and naddrs.
-- A lone address's spec is shared by every connect to it: read-only.
function _M.check(addrs, opts)
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
    if spec.list and (spec.naddrs > 1 or spec.lines ~= "") then
        local l = {}
        for i = 1, spec.naddrs do
            l[i] = "addr=" .. spec.list[i]
        end
        spec.lines = tab_concat(l, "\n") .. "\n" .. spec.lines
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


-- Per-call options: hash_key and retries (default: the connection's).
-- Returns true, hash_key (or nil), retries; or nil, err.
function _M.call_opts(conn, opts, argn)
    local key, retries = nil, conn.retries or 0
    if opts ~= nil then
        key = opts.hash_key
        if key ~= nil then
            if type(key) == "number" then
                key = tostring(key)
            elseif type(key) ~= "string" then
                return bad(argn, "hash_key must be a string (got " .. type(key)
                                 .. ")")
            end
        end
        local r = opts.retries
        if r ~= nil then
            if not is_count(r, 0) or r > MAX_RETRIES then
                return bad(argn, "retries must be an integer 0.."
                                 .. MAX_RETRIES .. " (got " .. tostring(r)
                                 .. ")")
            end
            retries = r
        end
    end
    if key == nil and conn.balance == "hash" then
        return bad(argn, "hash_key is required: the connection balances by "
                         .. "\"hash\"")
    end
    return true, key, retries
end


-- Parses the PEERS answer into { { addr, state, inflight, calls, failures,
-- ejected_until, stalled (boolean) }, ... }.
function _M.parse_peers(text)
    local out = {}
    for line in str_gmatch(text, "[^\n]+") do
        local p = {}
        for k, v in str_gmatch(line, "(%S+)=(%S*)") do
            p[k] = tonumber(v) or v
        end
        if p.addr then
            p.addr = tostring(p.addr)
            p.stalled = p.stalled == 1
            out[#out + 1] = p
        end
    end
    return out
end


-- The "connections=N" answer of PEERS for handle 0.
function _M.parse_connections(text)
    return tonumber(str_match(text or "", "connections=(%d+)")) or 0
end


return _M
