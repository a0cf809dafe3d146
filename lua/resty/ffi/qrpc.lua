-- resty.ffi.qrpc: a qrpc (RPC over QUIC) client for OpenResty / nginx Lua.
--
-- The reference of every function, option and error is docs/api.md; how
-- the pieces fit is docs/design.md. This file is the public API: connect
-- and the connection object. Nothing here throws because of what a caller
-- passed in: misuse returns nil, "bad argument #N: ...", failures nil, a
-- short stable string and an info table. The rest is under
-- resty/ffi/qrpc/: args (argument checks), runtime (loading the library,
-- configure, stats, metrics, debug_profile), abi (the C ABI and the
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
local abi = require "resty.ffi.qrpc.abi"
local args = require "resty.ffi.qrpc.args"
local runtime = require "resty.ffi.qrpc.runtime"
local loader = require "resty.ffi.qrpc.loader"
local builtin = require "resty.ffi.qrpc.host_builtin"
local resty_ffi = require "resty.ffi.qrpc.resty_ffi"
local cache = require "resty.ffi.qrpc.cache"
local pool = require "resty.ffi.qrpc.pool"
local share = require "resty.ffi.qrpc.share"
local proto = require "resty.ffi.qrpc.proto"
local limits = require "resty.ffi.qrpc.limits"

local ffi_new = ffi.new

local ngx = ngx
local get_phase = ngx.get_phase
local ngx_now = ngx.now

local type = type
local getmetatable = getmetatable
local setmetatable = setmetatable

local OP_UNARY = abi.OP_UNARY
-- the command table of the built-in host's unary calls (see unary)
local ucmd = { op = OP_UNARY }
local QRPC_OK = abi.QRPC_OK
local QRPC_ERR_CLOSED = abi.QRPC_ERR_CLOSED
local QRPC_BAD_RESPONSE = abi.QRPC_BAD_RESPONSE
local proto_prepare = proto.prepare
local proto_finish = proto.finish
local cmd_t = abi.cmd_t
local bad = abi.bad
local fill_cmd = abi.fill_cmd
local builtin_call = builtin.call
local builtin_event = builtin.event
local rf_call = resty_ffi.call
local rf_decode = resty_ffi.decode
local mark_closed = cache.mark_closed
local touch = cache.touch
local pool_call_opts = pool.call_opts
local share_due = share.due
local plain = args.plain
local check_opts = args.check_opts
local check_call = args.check_call
local EXPIRED = args.EXPIRED

-- qrpc_client_deadline_expired_total{method}: unary calls not sent because
-- their deadline had passed (a source of qrpc.metrics()); at most
-- MAX_EXPIRED labels get a series of their own, the rest count as "other".
-- A label is the method name made valid UTF-8 and cut as Go makes it for
-- its own series (metrics.method_label): an unbounded or invalid label
-- would make the whole exposition invalid.
local expired = {}
local n_expired, MAX_EXPIRED = 0, 256
local EXPIRED_OTHER = 'qrpc_client_deadline_expired_total{method="other"}'
local metrics_mod = require("resty.ffi.qrpc.metrics")
local method_label = metrics_mod.method_label
metrics_mod.add_source(expired)
local expired_keys = {}
local str_gsub = string.gsub
local LABEL_ESCAPES = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }
local function expired_key(method)
    local key = expired_keys[method]
    if key then
        return key
    end
    local label = str_gsub(method_label(method), '[\\"\n]', LABEL_ESCAPES)
    key = 'qrpc_client_deadline_expired_total{method="' .. label .. '"}'
    if not expired[key] then
        if n_expired >= MAX_EXPIRED then
            return EXPIRED_OTHER
        end
        n_expired = n_expired + 1
        -- Only a label's first name is remembered: names that share a
        -- label (cut alike) cost no memory, however many they are.
        expired_keys[method] = key
    end
    return key
end

local function count_expired(method)
    local key = expired_key(method)
    expired[key] = (expired[key] or 0) + 1
end
local call_opts = args.call_opts
local S = runtime.S
local yieldable = runtime.yieldable
local phase_name = runtime.phase_name
local YIELD_WHERE = runtime.YIELD_WHERE
local ensure_loaded = runtime.ensure_loaded

local ERR_INIT = loader.ERR_INIT
-- How much longer than Go's deadline Lua waits before it gives up on its
-- own; Go enforces deadlines, this only guards against a lost completion.
local SAFETY_SLACK_S = builtin.SAFETY_SLACK_S


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
    configure = runtime.configure,
    metrics = runtime.metrics,
    debug_profile = runtime.debug_profile,
    init_worker = runtime.init_worker,
}


-------------------------------------------------------------------------
-- Connection objects
-------------------------------------------------------------------------

-- A connection object is an empty table: what it stands for (the cache
-- entry with the handle, the credentials and the semaphore; the methods
-- bound by connect) is in views, keyed by the object, where a caller
-- cannot reach or change it. Assigning a field of the object changes
-- nothing, and it answers only the five methods.
--
-- views[conn] = { e = <cache entry>, handle, timeout, max_frame, prop,
-- balance, retries, methods }: what a call reads, copied from the entry
-- when the object is made (e.closed is read from the entry: a close is
-- seen by every object of the connection).
local views = setmetatable({}, { __mode = "k" })
local methods = {}
local conn_mt = {
    __index = methods,
    __newindex = function() end,
    __metatable = "resty.ffi.qrpc connection",
}


local function new_conn(e, bound)
    local c = setmetatable({}, conn_mt)
    views[c] = {
        e = e,
        handle = e.handle,
        timeout = e.call_timeout,
        max_frame = e.max_frame,
        prop = e.prop,
        prop_deadline = e.prop_deadline,
        balance = e.balance,
        retries = e.retries,
        methods = bound,
    }
    return c
end
cache.init(new_conn)

-- for the library's own tests: what a connection object stands for
require("resty.ffi.qrpc.testing").view = function(c)
    return views[c]
end


-- The view of a connection object, or nil, err (err: "closed" when its
-- connection is closed).
local function view_of(self)
    local v = views[self]
    if v == nil then
        return bad(1, "a connection is expected (use conn:method(...), "
                      .. "not conn.method(...))")
    end
    if v.e.closed then
        return nil, "closed"
    end
    return v
end


-------------------------------------------------------------------------
-- connect
-------------------------------------------------------------------------

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
    if opts == nil then
        opts = EMPTY
    elseif type(opts) ~= "table" then
        return bad(2, "opts must be a table (got " .. type(opts) .. ")")
    else
        local err
        opts, err = args.plain_connect_opts(opts)
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
    if e and opts ~= EMPTY and not args.cached_ok(opts) then
        -- a mistake a cached connection's match does not see (an unknown
        -- name, a boolean of the wrong type): the full check names it
        local _, err = args.check_connect_opts(opts)
        return nil, err or "bad argument #2: opts"
    end
    if e then
        if e.state == "ready" then
            if not e.closed then
                return e.conn, nil, e, opts
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
        local pins, err = args.check_connect_opts(opts)
        if not pins then
            return nil, err
        end
        local ok
        ok, err = ensure_loaded()
        if not ok then
            return nil, err
        end
        ok, err = cache.make_room(spec.naddrs * (opts.conns or limits.DEFAULT_CONNS),
                                  S.max_connections, builtin.stats)
        if not ok then
            return nil, err
        end
        e = cache.start(addr, opts, pins, spec)
        if spec.shared then
            e.share_spec = spec
        end
    end
    local conn, err, info = cache.wait(e)
    if not conn then
        return nil, err, info
    end
    return conn, nil, e, opts
end


-- qrpc.connect(addr, opts?) -> conn | nil, err, info
function _M.connect(addr, opts)
    local conn, err, e, o = connect(addr, opts)
    if not conn then
        return nil, err, e or {}
    end
    -- not evicted before the caller's first call (cache.make_room)
    e.handed = ngx_now()
    local ss = e.share_spec
    if ss and not e.share then
        e.share = share.attach(e, ss.shared, ss.share_name)
    end
    local m = o.methods
    if m ~= nil then
        -- message types per method name (resty.ffi.qrpc.proto): an object
        -- of its own per methods table, over the shared connection
        local by = e.bound
        if not by then
            by = setmetatable({}, { __mode = "k" })
            if not e.closed then -- (closed: mark_closed let go of them)
                e.bound = by
            end
        end
        local c = by[m]
        if not c then
            local own, berr = proto.bind(m)
            if not own then
                return nil, berr, {}
            end
            c = new_conn(e, own)
            by[m] = c
        end
        return c
    end
    return conn
end


-------------------------------------------------------------------------
-- Calls
-------------------------------------------------------------------------

-- The options of a call as a plain table (or nil), checked for unknown
-- names; or nil, err.
local function call_options(opts, event)
    if opts == nil then
        return nil
    end
    if type(opts) ~= "table" then
        return nil, "bad argument #4: opts must be a table (got "
                    .. type(opts) .. ")"
    end
    if getmetatable(opts) ~= nil then
        local err
        opts, err = plain(opts, call_opts, 4, "opts")
        if not opts then
            return nil, err
        end
    end
    local ok, err = check_opts(opts, event)
    if not ok then
        return nil, err
    end
    return opts
end


-- conn:unary(method, body?, opts?) -> res | nil, err, info
-- opts: headers ({ name = value }), timeout (ms; default: the connection's
-- timeout option, else 5000), and the protobuf and pool options.
function methods.unary(self, method, body, opts)
    local v, err = view_of(self)
    if not v then
        return nil, err, {}
    end
    if opts ~= nil then
        opts, err = call_options(opts, false)
        if err then
            return nil, err, {}
        end
    end
    local req, resp, flags, as_json
    if type(method) == "string" then
        body, req, resp, flags, as_json = proto_prepare(v, method, body, opts)
        if body == false and req ~= nil then
            return nil, req, {}   -- (a false body without types: below)
        end
    end
    local nh, hlen, timeout, hbuf
    body, nh, hlen, timeout, hbuf = check_call(v.max_frame, v.prop, method,
                                               body, opts, v.timeout,
                                               v.prop_deadline)
    local late   -- the deadline passed: said after the phase's check
    if not body then
        if nh ~= EXPIRED then
            return nil, nh, hlen or {}
        end
        late = hlen
    end
    local ok, hash_key, retries, copts = pool_call_opts(v, opts, 4, method)
    if not ok then
        return nil, hash_key, {}
    end

    local phase = get_phase()
    if not yieldable[phase] then
        return nil, "qrpc: unary cannot be used in the " .. phase_name(phase)
                    .. " phase (it yields); use conn:event, or a timer", {}
    end
    if late then
        count_expired(method)
        if metrics_mod.exit_flushed then
            metrics_mod.after_exit_call()
        end
        return nil, "timeout", { attempts = 0, detail = late }
    end

    local e = v.e
    touch(e)
    local sh = e.share
    if sh then
        share_due(sh)
    end
    local status, val, info
    local secs = timeout / 1000 + SAFETY_SLACK_S
    if S.use_builtin then
        -- the built-in host copies the command into its queue before the
        -- call yields: one table serves every call, each field written
        local c = ucmd
        c.conn, c.method, c.body, c.nh, c.hdrs, c.hlen = v.handle, method, body, nh, hbuf, hlen
        c.timeout, c.req_type, c.resp_type, c.flags = timeout, req, resp, flags
        c.hash_key, c.retries, c.opts = hash_key, retries, copts
        status, val, info = builtin_call(c, secs)
        -- not kept until the next call: the body may be big
        c.body, c.hdrs, c.hash_key, c.opts = nil, nil, nil, nil
    else
        local c = { op = OP_UNARY, conn = v.handle, method = method, body = body,
                    nh = nh, hdrs = hbuf, hlen = hlen, timeout = timeout,
                    req_type = req, resp_type = resp, flags = flags,
                    hash_key = hash_key, retries = retries, opts = copts }
        -- Go reads the command after this coroutine yields, maybe after
        -- it was killed: c holds every string it points at, and the host
        -- pins c until then.
        local cmd = fill_cmd(ffi_new(cmd_t), c)
        status, val, info = rf_decode(rf_call(cmd, c, secs))
    end
    e.handed = nil   -- its first call is over: evictable when idle
    if metrics_mod.exit_flushed then
        metrics_mod.after_exit_call()
    end

    if status == QRPC_OK then
        if resp then
            local res, ferr, raw = proto_finish(val, resp, as_json)
            if not res then
                return nil, ferr, { res = raw, attempts = raw and raw.attempts }
            end
            return res
        end
        return val
    end
    if status == QRPC_BAD_RESPONSE then
        -- the answer came but is not a resp: the reason, and res as it came
        local raw = val.res
        return nil, val.err, { res = raw, attempts = raw and raw.attempts }
    end
    if status == QRPC_ERR_CLOSED then
        mark_closed(e)
    end
    return nil, val, info or {}
end


-- conn:event(method, body?, opts?) -> true | nil, err, info. Never yields:
-- usable in every phase that runs in a worker (log, header/body filters,
-- timers...). opts: headers, hash_key and the protobuf request options.
function methods.event(self, method, body, opts)
    local v, err = view_of(self)
    if not v then
        return nil, err, {}
    end
    if opts ~= nil then
        opts, err = call_options(opts, true)
        if err then
            return nil, err, {}
        end
    end
    local req, flags, _
    if type(method) == "string" then
        body, req, _, flags = proto_prepare(v, method, body, opts)
        if body == false and req ~= nil then
            return nil, req, {}
        end
    end
    local nh, hlen, hbuf
    body, nh, hlen, _, hbuf = check_call(v.max_frame, v.prop, method, body,
                                         opts)
    if not body then
        return nil, nh, hlen or {}
    end
    local ok, hash_key = pool_call_opts(v, opts, 4)
    if not ok then
        return nil, hash_key, {}
    end
    local e = v.e
    touch(e)
    local sh = e.share
    if sh then
        share_due(sh)
    end
    local rc, info
    rc, err, info = builtin_event(v.handle, method, body, nh, hbuf, hlen, req,
                                  flags, hash_key)
    e.handed = nil
    if metrics_mod.exit_flushed then
        metrics_mod.after_exit_call()
    end
    if rc == QRPC_OK then
        return true
    end
    if rc == QRPC_ERR_CLOSED then
        mark_closed(e)
    end
    return nil, err, info or {}
end


-- conn:close() -> true | nil, err. Pending calls on it fail with "closed";
-- the next qrpc.connect with the same addr + opts dials again. Closing a
-- closed connection returns true.
function methods.close(self)
    local v = views[self]
    if v == nil then
        return bad(1, "a connection is expected")
    end
    local e = v.e
    if e.closed then
        return true
    end
    mark_closed(e)
    return builtin.close_handle(v.handle)
end


-- conn:stats() -> { inflight, calls, events, dropped, reconnects, queued }
function methods.stats(self)
    local v, err = view_of(self)
    if not v then
        return nil, err
    end
    return builtin.stats(v.handle)
end


-- conn:peers() -> { { addr, state = "up"|"ejected"|"connecting"|"draining",
-- inflight, calls, failures, ejected_until (ms since the epoch, 0),
-- stalled = true|false }, ... }
function methods.peers(self)
    local v, err = view_of(self)
    if not v then
        return nil, err
    end
    local text
    text, err = builtin.query(abi.OP_PEERS, v.handle)
    if not text then
        if err == "closed" then
            mark_closed(v.e)
        end
        return nil, err
    end
    return pool.parse_peers(text)
end


-- qrpc.stats() -> the worker's counters. (Called as qrpc:stats() or
-- qrpc.stats(conn) it answers for the connection, as before.)
function _M.stats(self)
    if self == nil or self == _M then
        return runtime.stats()
    end
    return methods.stats(self)
end


return _M
