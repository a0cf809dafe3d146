-- resty.ffi.qrpc: a qrpc (RPC over QUIC) client for OpenResty / nginx Lua.
--
-- The reference of every function, option and error is docs/api.md; how
-- the pieces fit is docs/design.md. This file is the public API and its
-- argument checks. Nothing here throws because of what a caller passed
-- in: misuse returns nil, "bad argument #N: ...", failures nil and a short
-- stable string. The rest is under resty/ffi/qrpc/: abi (the C ABI and the
-- command and result codec), loader (finding and loading the library),
-- host_builtin (the built-in host and its dispatcher), resty_ffi (the
-- lua-resty-ffi host), cache and pool (connections and pools), proto
-- (protobuf messages), metrics and propagate, gateway and json (the
-- REST/JSON gateway and its HTTP JSON), testing (the library's own test
-- hooks).
--
-- The library is never loaded in the nginx master (a Go runtime does not
-- survive fork()): requiring this module in init_by_lua loads nothing.

local ffi = require "ffi"
local base = require "resty.core.base"
local abi = require "resty.ffi.qrpc.abi"
local loader = require "resty.ffi.qrpc.loader"
local builtin = require "resty.ffi.qrpc.host_builtin"
local resty_ffi = require "resty.ffi.qrpc.resty_ffi"
local cache = require "resty.ffi.qrpc.cache"
local propagate = require "resty.ffi.qrpc.propagate"
local metrics = require "resty.ffi.qrpc.metrics"
local pool = require "resty.ffi.qrpc.pool"
local limits = require "resty.ffi.qrpc.limits"
local proto = require "resty.ffi.qrpc.proto"

local ffi_new = ffi.new
local ffi_string = ffi.string
local new_tab = base.new_tab

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local get_phase = ngx.get_phase
local ngx_now = ngx.now
local ngx_sleep = ngx.sleep
local decode_base64 = ngx.decode_base64

local type = type
local tostring = tostring
local tonumber = tonumber
local pairs = pairs
local ipairs = ipairs
local getmetatable = getmetatable
local pcall = pcall
local str_byte = string.byte
local str_sub = string.sub
local str_gsub = string.gsub
local str_find = string.find
local str_char = string.char
local math_floor = math.floor
local math_ceil = math.ceil
local math_huge = math.huge
local tab_concat = table.concat

local OP_UNARY = abi.OP_UNARY
local OP_ECHO = abi.OP_ECHO
local OP_PROFILE = abi.OP_PROFILE
local QRPC_OK = abi.QRPC_OK
local QRPC_ERR_CLOSED = abi.QRPC_ERR_CLOSED
local QRPC_BAD_RESPONSE = abi.QRPC_BAD_RESPONSE
local proto_prepare = proto.prepare
local proto_finish = proto.finish
local cmd_t = abi.cmd_t
local bad = abi.bad
local pack_headers = abi.pack_headers
local fill_cmd = abi.fill_cmd
local builtin_call = builtin.call
local builtin_event = builtin.event
local rf_call = resty_ffi.call
local rf_decode = resty_ffi.decode
local mark_closed = cache.mark_closed
local propagate_apply = propagate.apply
local pool_call_opts = pool.call_opts
local pool_keys = pool.keys
local pool_checked = pool.checked

local ERR_INIT = loader.ERR_INIT
local DEFAULT_TIMEOUT_MS = cache.DEFAULT_TIMEOUT_MS
local MAX_MS = limits.MS
-- How much longer than Go's deadline Lua waits before it gives up on its
-- own; Go enforces deadlines, this only guards against a lost completion.
local SAFETY_SLACK_S = builtin.SAFETY_SLACK_S

-- The nginx subsystem of this Lua VM: "http" (ngx_http_lua) or "stream"
-- (ngx_stream_lua). A worker runs one Lua VM per subsystem, and each VM
-- has its own connections, completion queue and dispatcher.
local subsystem = ngx.config and ngx.config.subsystem or "http"
local in_stream = subsystem == "stream"

-- Phases in which a light thread may yield (http's and stream's names:
-- ngx_stream_lua yields in preread, content and timers).
local yieldable = {
    rewrite = true, server_rewrite = true, access = true, content = true,
    timer = true, ssl_cert = true, ssl_client_hello = true,
    ssl_session_fetch = true, preread = true,
}

-- The phase as error messages name it: stream's are marked, since http
-- has phases of the same names.
local function phase_name(phase)
    if in_stream then
        return "stream " .. phase
    end
    return phase
end

-- Where a call that yields can be made, for error messages.
local YIELD_WHERE = in_stream and "preread, content or a timer"
                    or "rewrite, access, content or a timer"


-- qrpc.proto is what applications use of resty.ffi.qrpc.proto; the rest
-- of that module (the loader's hooks, the call plumbing, the test hooks)
-- is the library's own.
local _M = {
    _VERSION = "0.1.0",
    proto = {
        load = proto.load,
        load_descriptor_set = proto.load_descriptor_set,
        empty_array = proto.empty_array,
    },
}
local mt = { __index = _M }
cache.init(mt)


-- Configuration (read at load time) and the loaded state of this worker.
local cfg_host, cfg_lib, cfg_socket_dir = nil, nil, "/tmp"
-- QUIC connections a worker may hold (every pool's servers × conns);
-- beyond it connect closes the least recently used idle pools.
local max_connections = 256
-- configure{ metrics }: false = pools dialled from then on are not
-- recorded (Go gives them a no-op observer); applied when the library
-- loads, and at once when it is loaded.
local metrics_on = true
local loaded            -- true once the library is loaded
local load_err          -- loaded, but the built-in host cannot run (socket_dir)
local host              -- "builtin" or "resty_ffi", once loaded
local use_builtin       -- host == "builtin"
local lib_where         -- where the library was found


-- configure{ gomaxprocs }: held here until the library loads, then sent
-- to Go (bridge.Configure); nil leaves the library's default.
local gomaxprocs

-- apply_settings sends the Go-side settings of configure to the library:
-- whether to record the pools it dials next, and gomaxprocs when given.
local function apply_settings()
    local lines = metrics_on and "metrics=on\n" or "metrics=off\n"
    if gomaxprocs then
        lines = lines .. "gomaxprocs=" .. gomaxprocs .. "\n"
    end
    local _, err = builtin.query(abi.OP_CONFIGURE, 0, lines)
    if err then
        return nil, "qrpc: configure: " .. err
    end
    return true
end


local function ensure_loaded()
    if loaded then
        if load_err then
            return nil, load_err
        end
        return true
    end
    local st, err = loader.load(cfg_host, cfg_lib, subsystem)
    if not st then
        return nil, err
    end
    local wake_ok, wake_err = builtin.init(st.lib, cfg_socket_dir, subsystem)
    proto.attach(st.lib)
    if st.rt then
        resty_ffi.init(st.rt)
    end
    loaded, host, lib_where = true, st.host, st.where
    metrics.init(st.lib)
    use_builtin = host == "builtin"
    if gomaxprocs or not metrics_on then
        -- before any connection can be dialled
        local ok, serr = apply_settings()
        if not ok then
            ngx_log(ngx_ERR, serr)
        end
    end
    if not wake_ok then
        -- Logged once: every later call returns the same error at once.
        -- The lua-resty-ffi host only loses its prompt log lines (the
        -- dispatcher still polls for them).
        ngx_log(ngx_ERR, wake_err)
        if use_builtin then
            load_err = wake_err
            return nil, wake_err
        end
    end
    if not use_builtin then
        -- Go's log lines come through the completion queue with either host.
        builtin.ensure_dispatcher()
    end
    return true
end
proto.init(ensure_loaded)


-------------------------------------------------------------------------
-- Argument checks
-------------------------------------------------------------------------

-- Numbers that no option takes: the word for them, or nil.
local function odd_number(v)
    if v ~= v then
        return "NaN"
    end
    if v == math_huge then
        return "inf"
    end
    if v == -math_huge then
        return "-inf"
    end
end


-- Checks a time in ms (0..MAX_MS); returns it rounded up to an integer.
local function check_ms(v, argn, name)
    if type(v) ~= "number" then
        return bad(argn, name .. " must be a number of milliseconds (got "
                         .. type(v) .. ")")
    end
    local odd = odd_number(v)
    if odd then
        return bad(argn, name .. " must be a number of milliseconds, not " .. odd)
    end
    if v < 0 or v > MAX_MS then
        return bad(argn, name .. " must be 0.." .. MAX_MS .. " ms (got "
                         .. tostring(v) .. ")")
    end
    return math_ceil(v)
end


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
                     .. (type(e) == "string" and e or "(a " .. type(e) .. ")"))
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


local known_opts = {
    server_name = "string", ca = "string", cert = "string", key = "string",
    pins = "table", insecure = "boolean", conns = "number",
    streams = "number", stream_batch = "number", timeout = "number",
    idle_timeout = "number", max_frame_size = "number", propagate = "table",
    methods = "table",
}

-- every connect option name, the pool's included (for plain copies)
local connect_keys = {}
for k in pairs(known_opts) do
    connect_keys[k] = true
end
for k in pairs(pool_keys) do
    connect_keys[k] = true
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


-- connect's opts as a plain table (itself when it is one, with a plain
-- pins list or none), or nil, "bad argument #2: ...".
local function plain_connect_opts(opts)
    local o, err = plain(opts, connect_keys, 2, "opts")
    if not o then
        return nil, err
    end
    local p = o.pins
    if p ~= nil and getmetatable(p) ~= nil then
        if type(p) ~= "table" then
            return o    -- check_connect_opts says what is wrong
        end
        p, err = plain(p, nil, 2, "pins")
        if not p then
            return nil, err
        end
        if o == opts then
            o = copy_table(opts)
        end
        o.pins = p
    end
    return o
end


local EMPTY = {}

-- Returns the cached connection for addr + opts, dialling only when there is
-- none; concurrent callers share one dial. Yields (the dial completes
-- asynchronously), except that a ready cached connection is returned in any
-- phase, so log_by_lua and filters can reuse what content_by_lua connected.
local function connect(addr, opts)
    -- addr is "host:port" or a list of them (a pool: resty.ffi.qrpc.pool
    -- checks the list and the pool options)
    if type(addr) ~= "table" and type(addr) ~= "string" then
        return bad(1, "addr must be a non-empty string host:port (got "
                      .. type(addr) .. ")")
    end
    if addr == "" then
        return bad(1, "addr must be host:port, not an empty string")
    end
    if type(addr) == "string" and not pool_checked(addr) then
        if not str_find(addr, ":%d+$") then
            return bad(1, "addr must be host:port (got \"" .. addr .. "\")")
        end
        if str_byte(addr, 1) == 58 then -- ":"
            return bad(1, "addr must be host:port, the host is empty (got \""
                          .. addr .. "\")")
        end
    end
    if opts == nil then
        opts = EMPTY
    elseif type(opts) ~= "table" then
        return bad(2, "opts must be a table (got " .. type(opts) .. ")")
    else
        local err
        opts, err = plain_connect_opts(opts)
        if not opts then
            return nil, err
        end
    end
    -- addr: "host:port" or a list of them (a pool); pool options checked
    local spec, serr = pool.check(addr, opts)
    if not spec then
        return nil, serr
    end
    addr = spec.addr

    local phase = get_phase()
    if phase == "init" then
        return nil, ERR_INIT
    end

    local e = cache.find(addr, opts, spec)
    if e then
        if e.state == "ready" then
            if not e.conn.closed then
                return e.conn
            end
            cache.remove(e)
            e = nil
        elseif e.state == "connecting" and ngx_now() > e.deadline then
            e.stale = true
            cache.remove(e)
            e = nil
        end
    end

    if not yieldable[phase] then
        return nil, "qrpc: cannot connect in the " .. phase_name(phase)
                    .. " phase (connect yields); connect in " .. YIELD_WHERE
                    .. " first, later calls reuse that connection"
    end

    if not e then
        local pins, err = check_connect_opts(opts)
        if not pins then
            return nil, err
        end
        local ok
        ok, err = ensure_loaded()
        if not ok then
            return nil, err
        end
        ok, err = cache.make_room(spec.naddrs * (opts.conns or 1),
                                  max_connections, builtin.stats)
        if not ok then
            return nil, err
        end
        e = cache.start(addr, opts, pins, use_builtin, spec)
    end
    return cache.wait(e)
end


function _M.connect(addr, opts)
    local conn, err = connect(addr, opts)
    if conn then
        -- not evicted before the caller's first call (cache.make_room)
        conn.handed = true
    end
    if conn and opts ~= nil and opts.methods ~= nil then
        -- message types per method name (resty.ffi.qrpc.proto)
        local ok, berr = proto.bind(conn, opts.methods)
        if not ok then
            return nil, berr
        end
    end
    return conn, err
end


local function check_conn(self)
    if getmetatable(self) ~= mt or self.handle == nil then
        return bad(1, "a connection is expected (use conn:method(...), "
                      .. "not conn.method(...))")
    end
    if self.closed then
        return nil, "closed"
    end
    return true
end


local call_opts = {
    timeout = true, headers = true,
    -- resty.ffi.qrpc.proto
    request = true, response = true, json = true, discard_unknown = true,
    proto_names = true,
    -- resty.ffi.qrpc.pool
    hash_key = true, retries = true, try_timeout = true, hedge = true,
}

-- Checks method, body, opts of unary/event; packs headers.
-- Returns body, nhdrs, hdrs_len, timeout (0: none given), hdrs buffer, or
-- nil, err. Plain tables are read directly (no pcall, no copy: the hot
-- path); tables with a metatable are copied under pcall first.
local function check_call(self, method, body, opts)
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
    local max_frame = self.max_frame
    if #body > max_frame then
        return bad(3, "body too large (" .. #body .. " bytes; max_frame_size "
                      .. "is " .. max_frame .. ")")
    end
    local nh, hlen, timeout, hbuf = 0, 0, 0, nil
    local h
    if opts ~= nil then
        if type(opts) ~= "table" then
            return bad(4, "opts must be a table (got " .. type(opts) .. ")")
        end
        local err
        if getmetatable(opts) ~= nil then
            opts, err = plain(opts, call_opts, 4, "opts")
            if not opts then
                return nil, err
            end
        end
        local t = opts.timeout
        if t ~= nil then
            timeout, err = check_ms(t, 4, "timeout")
            if not timeout then
                return nil, err
            end
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
    if self.propagate then
        h = propagate_apply(self.propagate, h)
    end
    if h ~= nil then
        nh, hlen, hbuf = pack_headers(h, 4, max_frame)
        if not nh then
            return nil, hlen
        end
    end
    return body, nh, hlen, timeout, hbuf
end


-- conn:unary(method, body?, opts?) -> { code, body, headers } | nil, err
-- opts: headers ({ name = value }), timeout (ms; default: the connection's
-- timeout option, else 5000).
function _M.unary(self, method, body, opts)
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    local req, resp, flags, as_json
    if type(method) == "string" then
        if type(opts) == "table" and getmetatable(opts) ~= nil then
            opts, err = plain(opts, call_opts, 4, "opts")
            if not opts then
                return nil, err
            end
        end
        body, req, resp, flags, as_json = proto_prepare(self, method, body, opts)
        if body == false then
            return nil, req
        end
    end
    local nh, hlen, timeout, hbuf
    body, nh, hlen, timeout, hbuf = check_call(self, method, body, opts)
    if not body then
        return nil, nh
    end
    if timeout == 0 then
        timeout = self.timeout
    end
    local hash_key, retries, copts
    ok, hash_key, retries, copts = pool_call_opts(self, opts, 4, method)
    if not ok then
        return nil, hash_key
    end

    local phase = get_phase()
    if not yieldable[phase] then
        return nil, "qrpc: unary cannot be used in the " .. phase_name(phase)
                    .. " phase (it yields); use conn:event, or a timer"
    end

    local status, val
    local secs = timeout / 1000 + SAFETY_SLACK_S
    if use_builtin then
        status, val = builtin_call(OP_UNARY, self.handle, method, body, nh,
                                   hbuf, hlen, timeout, secs, req, resp, flags,
                                   hash_key, retries, copts)
    else
        -- the header buffer is shared: this call keeps its own copy across
        -- the yield
        local hstr = nh > 0 and ffi_string(hbuf, hlen) or nil
        local cmd = fill_cmd(ffi_new(cmd_t), OP_UNARY, self.handle, 0, method,
                             body, nh, hstr, hlen, timeout, req, resp, flags,
                             hash_key, retries, copts)
        -- Go reads the command after this coroutine yields, maybe after
        -- it was killed: every string it points at stays pinned until
        -- then (hash_key and copts may be fresh strings from
        -- pool.call_opts).
        local keep = hstr
        if req or hash_key or copts then
            keep = { hstr, req, resp, hash_key, copts }
        end
        status, val = rf_decode(rf_call(cmd, method, body, keep, secs))
    end
    if self.handed then
        self.handed = nil   -- its first call is over: evictable when idle
    end

    if status == QRPC_OK then
        if resp then
            return proto_finish(val, resp, as_json)
        end
        return val
    end
    if status == QRPC_BAD_RESPONSE then
        -- the answer came but is not a resp: the reason, and res as it came
        return nil, val.err, val.res
    end
    if status == QRPC_ERR_CLOSED then
        mark_closed(self)
    end
    return nil, val
end


-- conn:event(method, body?, opts?) -> true | nil, err. Never yields: usable
-- in every phase that runs in a worker (log, header/body filters, timers...).
-- opts: headers.
function _M.event(self, method, body, opts)
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    local req, flags, _
    if type(method) == "string" then
        if type(opts) == "table" and getmetatable(opts) ~= nil then
            opts, err = plain(opts, call_opts, 4, "opts")
            if not opts then
                return nil, err
            end
        end
        body, req, _, flags = proto_prepare(self, method, body, opts)
        if body == false then
            return nil, req
        end
    end
    local nh, hlen, hbuf
    body, nh, hlen, _, hbuf = check_call(self, method, body, opts)
    if not body then
        return nil, nh
    end
    local hash_key
    ok, hash_key = pool_call_opts(self, opts, 4)
    if not ok then
        return nil, hash_key
    end
    local rc
    rc, err = builtin_event(self.handle, method, body, nh, hbuf, hlen, req, flags,
                            hash_key)
    if self.handed then
        self.handed = nil
    end
    if rc == QRPC_OK then
        return true
    end
    if rc == QRPC_ERR_CLOSED then
        mark_closed(self)
    end
    return nil, err
end


-- conn:close() -> true | nil, err. Pending calls on it fail with "closed";
-- the next qrpc.connect with the same addr + opts dials again. Closing a
-- closed connection returns true.
function _M.close(self)
    if getmetatable(self) ~= mt or self.handle == nil then
        return bad(1, "a connection is expected")
    end
    if self.closed then
        return true
    end
    mark_closed(self)
    return builtin.close_handle(self.handle)
end


-- conn:stats() -> { inflight, calls, events, dropped, reconnects, queued }
function _M.stats(self)
    if self == nil or self == _M then
        -- qrpc.stats(): the whole runtime of this worker
        local s
        if loaded then
            local err
            s, err = builtin.stats(0)
            if not s then
                return nil, err
            end
        else
            s = { inflight = 0, calls = 0, events = 0, dropped = 0,
                  reconnects = 0, queued = 0 }
        end
        s.loaded = loaded == true
        s.host = host
        s.subsystem = subsystem
        s.lib = lib_where
        s.waiting, s.dispatcher = builtin.waiting()
        s.connections = 0
        if loaded then
            -- real QUIC connections, every pool's servers counted
            s.connections = pool.parse_connections(
                                builtin.query(abi.OP_PEERS, 0))
        end
        s.pools = cache.count()
        if loaded then
            -- the GOMAXPROCS of this worker's Go runtime
            local res = builtin.query(abi.OP_CONFIGURE, 0)
            s.gomaxprocs = res and tonumber(res:match("gomaxprocs=(%d+)"))
            -- "lazy" or "go": see loader.lua's set_godebug
            s.sysmon = res and res:match("sysmon=(%a+)")
        end
        return s
    end
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    return builtin.stats(self.handle)
end


-- conn:peers() -> { { addr, state = "up"|"ejected"|"connecting"|"draining",
-- inflight, calls, failures, ejected_until (ms since the epoch, 0),
-- stalled = true|false }, ... }
function _M.peers(self)
    local ok, err = check_conn(self)
    if not ok then
        return nil, err
    end
    local text
    text, err = builtin.query(abi.OP_PEERS, self.handle)
    if not text then
        if err == "closed" then
            mark_closed(self)
        end
        return nil, err
    end
    return pool.parse_peers(text)
end


local configure_opts = { host = true, lib = true, socket_dir = true,
                         metrics_dict = true, max_connections = true,
                         gomaxprocs = true, metrics = true }

-- qrpc.configure{ host = "builtin" | "resty_ffi", lib = path, socket_dir = dir }
-- Omitted fields take their defaults: host chosen at load (lua-resty-ffi
-- when ngx.load_ffi exists and loads the library, else built-in); lib
-- searched (see resty.ffi.qrpc.loader); socket_dir "/tmp". Usable in any
-- phase, including init_by_lua; it takes effect when the library loads, so
-- after that it only accepts the settings already in force.
function _M.configure(opts)
    if type(opts) ~= "table" then
        return bad(1, "opts must be a table (got " .. type(opts) .. ")")
    end
    local err
    opts, err = plain(opts, configure_opts, 1, "opts")
    if not opts then
        return nil, err
    end
    for k in pairs(opts) do
        if type(k) ~= "string" then
            return bad(1, "option names must be strings (got " .. type(k) .. ")")
        end
        if not configure_opts[k] then
            return bad(1, "unknown option '" .. k .. "'")
        end
    end
    -- metrics_dict, max_connections, gomaxprocs and metrics may change at any time,
    -- alone or with the library's settings.
    local md = opts.metrics_dict
    if md ~= nil then
        if type(md) ~= "string" or md == "" then
            return bad(1, "metrics_dict must be the name of a lua_shared_dict")
        end
        local ok
        ok, err = metrics.set_dict(md)
        if not ok then
            return bad(1, err)
        end
    end
    local mc = opts.max_connections
    if mc ~= nil then
        if type(mc) ~= "number" or mc < 1 or mc > 65536
           or math_floor(mc) ~= mc
        then
            return bad(1, "max_connections must be an integer 1..65536")
        end
        -- it applies to the next connect that dials
        max_connections = mc
    end
    local gp = opts.gomaxprocs
    if gp ~= nil then
        if type(gp) ~= "number" or gp < 1 or gp > limits.GOMAXPROCS
           or math_floor(gp) ~= gp
        then
            return bad(1, "gomaxprocs must be an integer 1.."
                          .. limits.GOMAXPROCS)
        end
    end
    local me = opts.metrics
    if me ~= nil and type(me) ~= "boolean" then
        return bad(1, "metrics must be true or false (got " .. type(me) .. ")")
    end
    if gp ~= nil or me ~= nil then
        gomaxprocs = gp or gomaxprocs
        -- metrics applies to the connections dialled from now on
        if me ~= nil then
            metrics_on = me
        end
        if loaded then
            local ok
            ok, err = apply_settings()
            if not ok then
                return nil, err
            end
        end
    end
    if md ~= nil or mc ~= nil or gp ~= nil or me ~= nil then
        if opts.host == nil and opts.lib == nil and opts.socket_dir == nil then
            return true
        end
    end
    local h, l, d = opts.host, opts.lib, opts.socket_dir
    if h ~= nil and h ~= "builtin" and h ~= "resty_ffi" then
        return bad(1, "host must be \"builtin\" or \"resty_ffi\"")
    end
    if h == "resty_ffi" and in_stream then
        -- lua-resty-ffi patches ngx_http_lua only
        return nil, "qrpc: host resty_ffi is not available in the stream "
                    .. "subsystem (lua-resty-ffi serves ngx_http_lua only); "
                    .. "stream uses the built-in host"
    end
    if l ~= nil and (type(l) ~= "string" or l == "") then
        return bad(1, "lib must be a path")
    end
    if d ~= nil and (type(d) ~= "string" or d == "") then
        return bad(1, "socket_dir must be a directory path")
    end
    d = d or "/tmp"
    if loaded then
        if (h and h ~= host) or (l and l ~= lib_where)
           or d ~= cfg_socket_dir
        then
            return nil, "qrpc: already loaded in this worker (" .. lib_where
                        .. ", host " .. host .. "); configure before the "
                        .. "first call"
        end
        return true
    end
    cfg_host, cfg_lib, cfg_socket_dir = h, l, d
    return true
end


-- worker_loaded() -> true | nil, err: the library loaded in this worker
-- (never in the master: Go does not survive nginx's fork).
local function worker_loaded()
    if get_phase() == "init" then
        return nil, ERR_INIT
    end
    return ensure_loaded()
end


-- qrpc.metrics() -> text | nil, err: the Prometheus text format: the sum
-- over all workers with configure{ metrics_dict }, else this worker's.
function _M.metrics()
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    return metrics.text()
end


-- Profiles qrpc.debug_profile answers at once; "cpu" takes seconds.
local instant_profiles = {
    heap = true, allocs = true, goroutine = true, threadcreate = true,
}
local MAX_PROFILE_S = limits.PROFILE_SECONDS


-- qrpc.debug_profile(kind [, seconds]) -> bytes | nil, err: a pprof profile
-- (gzipped protobuf, for go tool pprof) of this worker's Go runtime. "cpu"
-- profiles for seconds (default 10), sleeping meanwhile; the others answer
-- at once. Opt-in by design: nothing is exposed unless a location calls it.
function _M.debug_profile(kind, seconds)
    if type(kind) ~= "string" then
        return bad(1, "kind must be a string (got " .. type(kind) .. ")")
    end
    if kind ~= "cpu" and not instant_profiles[kind] then
        return bad(1, "kind must be cpu, heap, allocs, goroutine or"
                      .. " threadcreate (got '" .. str_sub(kind, 1, 64) .. "')")
    end
    if kind ~= "cpu" and seconds ~= nil then
        return bad(2, "seconds is only for kind cpu")
    end
    if kind == "cpu" then
        if seconds == nil then
            seconds = 10
        end
        local _, err = check_count(seconds, 2, "seconds", 1, MAX_PROFILE_S)
        if err then
            return nil, err
        end
        local phase = get_phase()
        if not yieldable[phase] then
            return nil, "qrpc: a cpu profile cannot be taken in the "
                        .. phase_name(phase) .. " phase (it sleeps)"
        end
    end
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    if kind ~= "cpu" then
        local out, qerr = builtin.query(OP_PROFILE, 0, "kind=" .. kind .. "\n")
        if not out then
            return nil, "qrpc: " .. qerr
        end
        return out
    end
    local _, qerr = builtin.query(OP_PROFILE, 0,
                                  "kind=cpu\nseconds=" .. seconds .. "\n")
    if qerr then
        return nil, "qrpc: " .. qerr
    end
    -- If this light thread is killed while it sleeps, Go stops the
    -- profile by itself 5 s after its seconds.
    ngx_sleep(seconds)
    local out
    out, qerr = builtin.query(OP_PROFILE, 0, "kind=cpu-stop\n")
    if not out then
        return nil, "qrpc: " .. qerr
    end
    return out
end


-- qrpc.init_worker() -> true | nil, err. Optional, from init_worker_by_lua:
-- loads the library and starts the dispatcher now rather than at the first
-- call, so that a missing library shows at start-up.
function _M.init_worker()
    local ok, err = worker_loaded()
    if not ok then
        return nil, err
    end
    return builtin.ensure_dispatcher()
end


-- echo(body) -> body | nil, err: resty.ffi.qrpc.testing's echo (see
-- there), a round trip through the library with no network.
local function echo(body)
    if type(body) ~= "string" then
        return bad(1, "body must be a string")
    end
    local phase = get_phase()
    if phase == "init" then
        return nil, ERR_INIT
    end
    if not yieldable[phase] then
        return nil, "qrpc: echo cannot be used in the " .. phase_name(phase)
                    .. " phase"
    end
    local ok, err = ensure_loaded()
    if not ok then
        return nil, err
    end
    local status, val
    if use_builtin then
        status, val = builtin_call(OP_ECHO, 0, "", body, 0, nil, 0,
                                   DEFAULT_TIMEOUT_MS,
                                   DEFAULT_TIMEOUT_MS / 1000 + SAFETY_SLACK_S,
                                   nil, nil, nil, nil, nil)
    else
        local cmd = fill_cmd(ffi_new(cmd_t), OP_ECHO, 0, 0, "", body, 0, nil, 0,
                             DEFAULT_TIMEOUT_MS)
        status, val = rf_decode(rf_call(cmd, body, nil, nil,
                                        DEFAULT_TIMEOUT_MS / 1000))
    end
    if status == QRPC_OK then
        return val.body
    end
    return nil, val
end
require("resty.ffi.qrpc.testing").echo = echo


return _M
