-- resty.ffi.qrpc.args: the argument checks of the public functions.
-- Nothing here calls a caller's metamethod or tostring outside pcall: a
-- table with a metatable is copied into a plain one under pcall first
-- (plain), and values in messages go through abi.show.

local abi = require "resty.ffi.qrpc.abi"
local base = require "resty.core.base"
local limits = require "resty.ffi.qrpc.limits"
local pool = require "resty.ffi.qrpc.pool"
local propagate = require "resty.ffi.qrpc.propagate"
local nkeys = require "table.nkeys"
local schema = require "resty.ffi.qrpc.schema"
local numbers = require "resty.ffi.qrpc.numbers"

local new_tab = base.new_tab
local decode_base64 = ngx.decode_base64

local type = type
local tostring = abi.show
local tonumber = tonumber
local pairs = pairs
local ipairs = ipairs
local next = next
local getmetatable = getmetatable
local pcall = pcall
local str_sub = string.sub
local str_lower = string.lower
local str_gsub = string.gsub
local str_find = string.find
local str_char = string.char
local math_floor = math.floor
local ngx_now = ngx.now
local math_ceil = math.ceil
local math_huge = math.huge
local tab_concat = table.concat

local bad = abi.bad
local odd_number = numbers.odd_number
local pack_headers = abi.pack_headers
local propagate_apply = propagate.apply
local pool_keys = pool.keys

local _M = {}


local check_ms = numbers.check_ms


-- Integer options of connect and their ranges (as Go's qrpc.Config checks
-- them: a Go error would reach the caller as "bad config: ...").
local counts = {
    { "conns", 1, limits.CONNS },
    { "streams", 1, limits.STREAMS },
    { "stream_batch", 1, limits.STREAM_BATCH },
    { "max_frame_size", limits.MIN_FRAME_SIZE, limits.MAX_FRAME_SIZE },
}
local ms_opts = { "timeout", "idle_timeout" }

local function check_count(v, argn, name, lo, hi)
    if type(v) ~= "number" then
        return bad(argn, name .. " must be a number (got " .. type(v) .. ")")
    end
    local odd = odd_number(v)
    if odd then
        return bad(argn, name .. " must be a number, not " .. odd)
    end
    if math_floor(v) ~= v then
        return bad(argn, name .. " must be an integer " .. lo .. ".." .. hi
                         .. " (got " .. tostring(v) .. ")")
    end
    if v < lo or v > hi then
        return bad(argn, name .. " must be " .. lo .. ".." .. hi .. " (got "
                         .. tostring(v) .. ")")
    end
    return v
end


-- What an error raised by a caller's metamethod says, without calling
-- anything of the caller's again (its __tostring could raise too).
local function raised(argn, what, e)
    return bad(argn, what .. " raised an error: "
                     .. (type(e) == "string" and str_sub(e, 1, 200)
                         or "(a " .. type(e) .. ")"))
end


-- A plain copy of a table with a metatable, read through its metamethods
-- (__pairs, and __index for the names in keys): run under pcall, so that
-- a metamethod that raises becomes "bad argument", and the checks below
-- only ever read plain tables.
local function copy_table(t, keys)
    local c = {}
    for k, v in pairs(t) do
        c[k] = v
    end
    if keys then
        for k in pairs(keys) do
            if c[k] == nil then
                c[k] = t[k]
            end
        end
    end
    return c
end


local function plain(t, keys, argn, what)
    if getmetatable(t) == nil then
        return t
    end
    local ok, c = pcall(copy_table, t, keys)
    if not ok then
        return raised(argn, what, c)
    end
    return c
end


-- The options, from resty.ffi.qrpc.schema (generated from internal/schema):
-- known_opts: connect's own options (the pool's are resty.ffi.qrpc.pool's
-- keys) and the Lua type each takes; call_opts: unary's options, "event"
-- for those event takes too; configure_opts: configure's.
local lua_type = { string = "string", boolean = "boolean", integer = "number",
                   number = "number", table = "table", list = "table" }
local known_opts, call_opts, configure_opts = {}, {}, {}
local call_names = {}
for _, o in ipairs(schema) do
    local name, w = o.name, o.where
    if not str_find(name, ".", 1, true) then
        if w.connect and not pool_keys[name] then
            known_opts[name] = lua_type[o.type]
        end
        if w.call or w.event then
            call_opts[name] = w.event and "event" or true
            call_names[#call_names + 1] = name
        end
        if w.configure then
            configure_opts[name] = true
        end
    end
end
_M.configure_opts = configure_opts

-- every connect option name, the pool's included (for plain copies)
local connect_keys = {}
for k in pairs(known_opts) do
    connect_keys[k] = true
end
for k in pairs(pool_keys) do
    connect_keys[k] = true
end
local connect_names = {}
for k in pairs(connect_keys) do
    connect_names[#connect_names + 1] = k
end
local NCONNECT = #connect_names

-- cached_ok(o) -> true when o (plain connect options that matched a
-- cached connection) holds only connect's option names and booleans
-- where connect takes them: lookups only, compiled. A false answer sends
-- the connect through the full check, which names the mistake.
function _M.cached_ok(o)
    local n = 0
    for i = 1, NCONNECT do
        if o[connect_names[i]] ~= nil then
            n = n + 1
        end
    end
    if n ~= nkeys(o) then
        return false
    end
    local v = o.insecure
    if v ~= nil and v ~= true and v ~= false then
        return false
    end
    v = o.propagate_deadline
    return v == nil or v == true or v == false
end


-- A pin is the SHA-256 of the server certificate's SubjectPublicKeyInfo,
-- as 64 hex digits or as base64 (44 characters, optionally "sha256//"
-- first, as curl's --pinnedpubkey prints it).
local function decode_pin(s)
    if type(s) ~= "string" then
        return nil
    end
    if #s == 64 and str_find(s, "^%x+$") then
        return (str_gsub(s, "%x%x", function(h)
            return str_char(tonumber(h, 16))
        end))
    end
    if str_sub(s, 1, 8) == "sha256//" then
        s = str_sub(s, 9)
    end
    local raw = decode_base64(s)
    if raw and #raw == 32 then
        return raw
    end
    return nil
end


-- connect's string options that "" cannot stand for (checked in this
-- order, so that one message answers for a table with several)
local NONEMPTY = { "ca", "server_name", "cert", "key" }


-- Full validation, run when no cached connection matched. o is plain (see
-- plain_connect_opts); returns the raw pins, concatenated.
local function check_connect_opts(o)
    for k, v in pairs(o) do
        if type(k) ~= "string" then
            return bad(2, "option names must be strings (got " .. type(k) .. ")")
        end
        local want = known_opts[k]
        if not want and not pool_keys[k] then
            return bad(2, "unknown option '" .. k .. "'")
        end
        if want and type(v) ~= want then
            return bad(2, k .. " must be a " .. want .. " (got " .. type(v) .. ")")
        end
    end
    -- "" has no meaning in these: refused rather than read as "not given"
    -- (the system roots, the host of addr, no client certificate), which
    -- an unset environment variable would otherwise turn into another
    -- trust than the caller's
    for i = 1, #NONEMPTY do
        local k = NONEMPTY[i]
        if o[k] == "" then
            return bad(2, k .. " must not be empty")
        end
    end
    if (o.cert == nil) ~= (o.key == nil) then
        return bad(2, "cert and key go together")
    end
    if o.propagate then
        local ok, err = propagate.check(o.propagate)
        if not ok then
            return bad(2, err)
        end
    end
    local pins = ""
    local list = o.pins
    if list then
        local n, count = #list, 0
        for _ in pairs(list) do
            count = count + 1
        end
        if count ~= n then
            return bad(2, "pins must be a list of strings")
        end
        local raw = new_tab(n, 0)
        for i = 1, n do
            local d = decode_pin(list[i])
            if not d then
                return bad(2, "pins[" .. i .. "] must be a SHA-256 digest in "
                              .. "hex (64 digits) or base64 (44 characters)")
            end
            raw[i] = d
        end
        pins = tab_concat(raw)
    end
    for _, k in ipairs(ms_opts) do
        if o[k] ~= nil then
            local _, err = check_ms(o[k], 2, k)
            if err then
                return nil, err
            end
        end
    end
    for _, c in ipairs(counts) do
        local k = c[1]
        if o[k] ~= nil then
            local _, err = check_count(o[k], 2, k, c[2], c[3])
            if err then
                return nil, err
            end
        end
    end
    return pins
end


local LISTS = { "pins", "propagate" }

-- connect's opts as a plain table (itself when it is one, with a plain
-- pins list or none), or nil, "bad argument #2: ...".
local function plain_connect_opts(opts)
    local o, err = plain(opts, connect_keys, 2, "opts")
    if not o then
        return nil, err
    end
    -- the lists connect reads with # and pairs: plain copies
    for _, k in ipairs(LISTS) do
        local p = o[k]
        if p ~= nil and getmetatable(p) ~= nil and type(p) == "table" then
            p, err = plain(p, nil, 2, k)
            if not p then
                return nil, err
            end
            if o == opts then
                o = copy_table(opts)
            end
            o[k] = p
        end
    end
    return o
end


local NCALL = #call_names

-- How many of a call's options opts holds: lookups only, compiled.
local function count_known(o)
    local n = 0
    for i = 1, NCALL do
        if o[call_names[i]] ~= nil then
            n = n + 1
        end
    end
    return n
end


-- check_opts(opts, event) -> true | nil, "bad argument #4: ...": opts (a
-- plain table) has only the options of unary (of event, if event). The
-- common case costs a count of keys and a few lookups.
local function check_opts(opts, event)
    local n = nkeys(opts)
    if n == 0 then
        return true
    end
    if not event and n == count_known(opts) then
        return true
    end
    for k in next, opts do
        local want = type(k) == "string" and call_opts[k]
        if not want then
            if type(k) ~= "string" then
                return bad(4, "option names must be strings (got " .. type(k)
                              .. ")")
            end
            return bad(4, "unknown option '" .. tostring(k) .. "'")
        end
        if event and want ~= "event" then
            return bad(4, "option '" .. k .. "' does not apply to events")
        end
    end
    if event and opts.json == "response" then
        -- an event has no answer: the one side it names is not there
        return bad(4, 'json = "response" does not apply to events')
    end
    return true
end
_M.check_opts = check_opts


-- check_call(max_frame, prop, method, body, opts) checks method, body and
-- opts (a plain table or nil) of unary/event, and packs headers. Returns
-- body, nhdrs, hdrs_len, timeout (0: none given), hdrs buffer, or nil,
-- err, info.
-- The nh of check_call's nil, EXPIRED, detail: a unary whose deadline had
-- passed (not sent).
local EXPIRED = {}
_M.EXPIRED = EXPIRED

-- grpc_timeout(ms) -> the header's value in gRPC's format: at most 8
-- digits and a unit, so whole ms below 10^8 and whole seconds (rounded
-- up) from there (a timeout is at most 2147483647 ms).
local function grpc_timeout(ms)
    ms = math_ceil(ms)
    if ms < 100000000 then
        return ms .. "m"
    end
    return math_ceil(ms / 1000) .. "S"
end
_M.grpc_timeout = grpc_timeout

local function check_call(max_frame, prop, method, body, opts, def_timeout, prop_deadline)
    if type(method) ~= "string" then
        return bad(2, "method must be a string (got " .. type(method) .. ")")
    end
    if method == "" then
        return bad(2, "method must not be empty")
    end
    if body == nil then
        body = ""
    elseif type(body) ~= "string" then
        return bad(3, "body must be a string (got " .. type(body) .. ")")
    end
    if #body > max_frame then
        return bad(3, "body too large (" .. #body .. " bytes; max_frame_size "
                      .. "is " .. max_frame .. ")")
    end
    local nh, hlen, timeout, hbuf = 0, 0, 0, nil
    local h, deadline, expired
    if opts ~= nil then
        local err
        local t = opts.timeout
        if t ~= nil then
            timeout, err = check_ms(t, 4, "timeout")
            if not timeout then
                return nil, err
            end
        end
        local d = opts.deadline
        if d ~= nil then
            if type(d) ~= "number" or d ~= d or d == math_huge or d == -math_huge then
                return bad(4, "deadline must be a number of seconds on ngx.now()'s clock (got "
                              .. (type(d) == "number" and tostring(d) or type(d)) .. ")")
            end
            deadline = d
        end
        local pd = opts.propagate_deadline
        if pd ~= nil then
            if type(pd) ~= "boolean" then
                return bad(4, "propagate_deadline must be a boolean (got " .. type(pd) .. ")")
            end
            prop_deadline = pd
        end
        h = opts.headers
        if h ~= nil then
            if type(h) ~= "table" then
                return bad(4, "headers must be a table (got " .. type(h) .. ")")
            end
            if getmetatable(h) ~= nil then
                h, err = plain(h, nil, 4, "headers")
                if not h then
                    return nil, err
                end
            end
        end
    end
    if prop then
        h = propagate_apply(prop, h)
    end
    if def_timeout then
        -- unary: the call's time is its timeout, else the connection's,
        -- cut to what is left before its deadline
        if timeout == 0 then
            timeout = def_timeout
        end
        if deadline then
            local left = (deadline - ngx_now()) * 1000
            if left <= 0 then
                -- said once the rest is checked: a bad argument comes first
                expired = "the deadline passed " .. math_ceil(-left)
                          .. " ms before the call"
            elseif left < timeout then
                timeout = math_ceil(left)
            end
        end
        if prop_deadline and not expired then
            -- the caller's table stays as it is; a grpc-timeout of its own
            -- (in any case) gives way, so that one goes out
            local h2 = {}
            if h then
                for k, v in pairs(h) do
                    if type(k) ~= "string" or str_lower(k) ~= "grpc-timeout" then
                        h2[k] = v
                    end
                end
            end
            h2["grpc-timeout"] = grpc_timeout(timeout)
            h = h2
        end
    end
    if h ~= nil then
        nh, hlen, hbuf = pack_headers(h, 4, max_frame)
        if not nh then
            return nil, hlen, hbuf
        end
    end
    if expired then
        return nil, EXPIRED, expired
    end
    return body, nh, hlen, timeout, hbuf
end


_M.odd_number = odd_number
_M.check_ms = check_ms
_M.check_count = check_count
_M.plain = plain
_M.copy_table = copy_table
_M.check_connect_opts = check_connect_opts
_M.plain_connect_opts = plain_connect_opts
_M.check_call = check_call
_M.call_opts = call_opts


return _M
