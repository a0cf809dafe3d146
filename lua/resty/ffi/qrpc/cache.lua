-- resty.ffi.qrpc.cache: the worker's connection cache. One entry per addr +
-- option values; it is "connecting" (callers wait on its semaphore, one of
-- them carries the dial), "ready" (holds the connection object) or
-- "failed". A closed connection leaves the cache, so the next connect with
-- the same addr + options dials again.

local semaphore = require "ngx.semaphore"
local abi = require "resty.ffi.qrpc.abi"
local wire = require "resty.ffi.qrpc.wire"
local limits = require "resty.ffi.qrpc.limits"
local builtin = require "resty.ffi.qrpc.host_builtin"
local propagate = require "resty.ffi.qrpc.propagate"
local addr_mod = require "resty.ffi.qrpc.addr"
local nkeys = require "table.nkeys"

local sema_new = semaphore.new

local ngx_now = ngx.now
local ngx_sleep = ngx.sleep

local type = type
local pairs = pairs
local math_ceil = math.ceil
local math_min = math.min
local tab_remove = table.remove
local tab_sort = table.sort
local tab_concat = table.concat
local tostring = tostring
local unpack = unpack

local QRPC_OK = abi.QRPC_OK
local OP_PEERS = abi.OP_PEERS
local query = builtin.query
local parse_peers = addr_mod.parse_peers
local str_find = string.find
local gmatch = string.gmatch
local connect_cmd = abi.connect_cmd
local set_opts = abi.set_opts
local close_handle = builtin.close_handle
local share_leave = require("resty.ffi.qrpc.share").leave
local drain = builtin.drain
local SAFETY_SLACK_S = builtin.SAFETY_SLACK_S

-- Go's defaults, generated from internal/limits (checked against
-- qrpc.Config's by make lint)
local DEFAULT_TIMEOUT_MS = limits.DEFAULT_TIMEOUT_MS  -- dial and call timeout
local DEFAULT_MAX_FRAME = limits.DEFAULT_MAX_FRAME_SIZE
local DEFAULT_IDLE_MS = limits.DEFAULT_IDLE_TIMEOUT_MS
local DEFAULT_STREAMS = limits.DEFAULT_STREAMS
local DEFAULT_STREAM_BATCH = limits.DEFAULT_STREAM_BATCH
local DEFAULT_CONNS = limits.DEFAULT_CONNS


local _M = {
    DEFAULT_TIMEOUT_MS = DEFAULT_TIMEOUT_MS,
}


local conn_cache = {}   -- addr -> list of connection entries
local new_conn          -- makes the public object of a ready entry


-- make(e) -> the public connection object of a ready entry e (the
-- facade's: what the object holds lives outside it).
function _M.init(make)
    new_conn = make
end

-- Use order: a call stamps its entry with the next number, and make_room
-- evicts the entries with the lowest (a counter: ngx.now() on every call
-- would cost more, and the order is all that counts).
local use_seq = 0
function _M.touch(e)
    use_seq = use_seq + 1
    e.used = use_seq
end
local touch = _M.touch


local function cache_remove(e)
    local list = conn_cache[e.addr]
    if not list then
        return
    end
    for i = #list, 1, -1 do
        if list[i] == e then
            tab_remove(list, i)
        end
    end
    if #list == 0 then
        conn_cache[e.addr] = nil
    end
end
_M.remove = cache_remove


-- Marks an entry's connection closed and forgets the entry. A shared
-- pool gives up its leases first, while its connection still answers.
function _M.mark_closed(e)
    if not e.closed then
        if e.share then
            share_leave(e.share)
        end
        e.closed = true
        -- The views of e's objects hold e, keyed weakly by the objects;
        -- LuaJIT's weak tables are not ephemerons, so e must let go of
        -- them for a dropped object (and e with it) to be collected.
        e.conn, e.bound = nil, nil
        cache_remove(e)
    end
end


local function finish_connect(e, status, val, info)
    if status == QRPC_OK then
        if e.stale then
            close_handle(val)
            e.state, e.err = "failed", "closed"
        else
            e.handle = val
            e.closed = false
            e.conn = new_conn(e)
            e.state = "ready"
        end
    else
        e.state, e.err, e.info = "failed", val, info
        cache_remove(e)
    end
    local n = e.nwait
    if n > 0 then
        -- The waiters get the connection when they resume: not evictable
        -- before (make_room), for as long as a connect that returned it.
        -- nwait itself is no guide: a waiter killed in its wait (its light
        -- thread, its request) never takes itself off.
        e.handed = ngx_now()
        e.sema:post(n)
    end
end


-- ident(e) -> the entry's identity: every field find compares, so that
-- two entries find tells apart never share a shared pool's keys
-- (resty.ffi.qrpc.share).
local function ident(e)
    local function list(t)
        return t and tab_concat(t, ",") or "-"
    end
    return tab_concat({
        e.addr, tostring(e.server_name), tostring(e.ca), tostring(e.cert),
        tostring(e.key), tostring(e.insecure), e.conns, e.streams,
        tostring(e.stream_batch), e.timeout, e.idle_timeout,
        e.max_frame_size, e.pool_key, list(e.pins), list(e.propagate),
        tostring(e.prop_deadline),
    }, "\n")
end

-- a: the entry's list (a plain copy); b: the caller's, which must be a
-- list and nothing more (a hole or another key sends the connect through
-- the full check, which names it, as it would without this entry).
local function same_pins(a, b)
    if a == b then
        return true
    end
    if type(a) ~= "table" or type(b) ~= "table" or #a ~= #b
       or nkeys(b) ~= #b
    then
        return false
    end
    for i = 1, #a do
        if a[i] ~= b[i] then
            return false
        end
    end
    return true
end


-- Options as compared in the cache: a default written out is the same as
-- the option left out.

-- Only nil and 0 mean the default: anything else (a bad value included,
-- which must then miss the cache and be reported) stays as it is.
local function norm_ms(v, default)
    if v == nil or v == 0 then
        return default
    end
    if type(v) == "number" and v > 0 then
        return math_ceil(v)
    end
    return v
end


-- A pool of names follows their re-resolution in Go, dialling the
-- servers a name gained: the connections held can grow with no connect
-- of a new pool to call make_room. So a connect that finds its pool in
-- the cache recounts every pool, at most once every RECHECK_S, and makes
-- room (closing idle pools, as for a new one) when the count went over
-- the cap. A busy worker corrects within RECHECK_S; the count costs one
-- OP_PEERS query per pool of names.
local RECHECK_S = 1
local last_recheck = 0
local any_names = false   -- a pool of names was started: else no recount
local last_max, last_stats -- the last cap and stats function make_room was given
local make_room

local function recheck(keep)
    if not any_names or not last_max then
        return
    end
    local now = ngx_now()
    if now - last_recheck < RECHECK_S then
        return
    end
    last_recheck = now
    make_room(0, last_max, last_stats, keep)
end


-- The entry of addr (spec.addr: the sorted addresses) whose options equal
-- o's and whose pool options are spec.key, or nil.
function _M.find(addr, o, spec)
    local list = conn_cache[addr]
    if not list then
        return nil
    end
    local timeout = norm_ms(o.timeout, DEFAULT_TIMEOUT_MS)
    local idle = norm_ms(o.idle_timeout, DEFAULT_IDLE_MS)
    for i = 1, #list do
        local e = list[i]
        if e.server_name == o.server_name and e.ca == o.ca
           and e.cert == o.cert and e.key == o.key
           and e.insecure == (o.insecure == true)
           and e.conns == (o.conns or DEFAULT_CONNS)
           and e.streams == (o.streams or DEFAULT_STREAMS)
           and e.stream_batch == (o.stream_batch or DEFAULT_STREAM_BATCH)
           and e.timeout == timeout and e.idle_timeout == idle
           and e.max_frame_size == (o.max_frame_size or DEFAULT_MAX_FRAME)
           and e.pool_key == spec.key
           and same_pins(e.pins, o.pins)
           and same_pins(e.propagate, o.propagate)
           and e.prop_deadline == (o.propagate_deadline == true)
        then
            touch(e)
            recheck(e)
            return e
        end
    end
end


-- Whether an entry's addresses (its key: "host:port" joined by ",")
-- name a host: a name (A/AAAA, SRV) may stand for several servers.
local function has_names(addr)
    for hp in gmatch(addr, "[^,]+") do
        local host = hp:match("^(.*):%d+$") or hp
        if not (str_find(host, "^%[") or str_find(host, "^%d+%.%d+%.%d+%.%d+$")) then
            return true
        end
    end
    return false
end


-- The QUIC connections entry e holds: its servers × conns. Until a pool
-- of names is up that is an estimate (a name counts as one server); then
-- it is the pool's own count, which follows re-resolution.
local function count(e)
    if e.names and e.state == "ready" and not e.closed and e.handle then
        local blob = query(OP_PEERS, e.handle)
        local n = blob and #parse_peers(blob) or 0
        if n > 0 then
            e.nconns = n * e.conns
        end
    end
    return e.nconns
end


local function held()
    local n = 0
    for _, list in pairs(conn_cache) do
        for i = 1, #list do
            n = n + count(list[i])
        end
    end
    return n
end




-- connect's error when closing idle pools cannot make the room.
local function busy(max)
    return nil, "qrpc: too many connections (" .. max .. "); every pool "
                .. "has calls in flight or was just handed out by connect: "
                .. "raise qrpc.configure{ max_connections = n } or connect "
                .. "to fewer distinct servers/options"
end


-- Makes room for need more QUIC connections under max: closes the least
-- recently used idle pools (ready, nothing in flight). A pool that connect
-- has handed out and whose caller has not finished a call on it yet
-- (conn.handed, cleared by unary and event) is not idle: its caller is
-- about to use it. That lasts at most the pool's timeout and a second, so
-- a caller killed in between does not pin it. Returns true, or nil and
-- the error connect reports. keep: an entry never closed here.
function make_room(need, max, stats, keep)
    last_max, last_stats = max, stats
    local total = held()
    if total + need <= max then
        return true
    end
    if need > max then
        -- no pool closed makes room for it: none is closed
        return nil, "qrpc: too many connections (" .. max .. "); this "
                    .. "connect needs " .. need .. " (its servers × conns): "
                    .. "raise qrpc.configure{ max_connections = n }"
    end
    local now = ngx_now()
    local idle = {}
    for _, list in pairs(conn_cache) do
        for i = 1, #list do
            local e = list[i]
            if e.state == "ready" and not e.closed and e ~= keep
               and not (e.handed and now - e.handed < e.timeout / 1000 + 1)
            then
                local st = stats(e.handle)
                if st and st.inflight == 0 then
                    idle[#idle + 1] = e
                end
            end
        end
    end
    -- Closing is only worth it when closing every idle pool makes the
    -- room: else none is closed (a pool over the cap by itself, busy
    -- pools beside this connect).
    local freed = 0
    for i = 1, #idle do
        freed = freed + idle[i].nconns
    end
    if total - freed + need > max then
        return busy(max)
    end
    tab_sort(idle, function(a, b) return a.used < b.used end)
    for i = 1, #idle do
        local e = idle[i]
        _M.mark_closed(e)
        close_handle(e.handle)
        total = total - e.nconns
        if total + need <= max then
            return true
        end
    end
    return busy(max)
end
_M.make_room = make_room


-- Number of cached entries (any state).
function _M.count()
    local n = 0
    for _, list in pairs(conn_cache) do
        n = n + #list
    end
    return n
end


-- Adds an entry for addr + checked options o (pins: raw digests) and
-- starts dialling.
function _M.start(addr, o, pins, spec)
    local e = {
        addr = addr,
        state = "connecting",
        sema = sema_new(0),
        nwait = 0,
        server_name = o.server_name, ca = o.ca, cert = o.cert, key = o.key,
        insecure = o.insecure == true, conns = o.conns or DEFAULT_CONNS,
        streams = o.streams or DEFAULT_STREAMS,
        stream_batch = o.stream_batch or DEFAULT_STREAM_BATCH,
        timeout = norm_ms(o.timeout, DEFAULT_TIMEOUT_MS),
        idle_timeout = norm_ms(o.idle_timeout, DEFAULT_IDLE_MS),
        max_frame_size = o.max_frame_size or DEFAULT_MAX_FRAME,
        pool_key = spec.key,
        balance = spec.balance,
        retries = spec.retries,
        nconns = spec.naddrs * (o.conns or DEFAULT_CONNS),
        names = has_names(addr),
        used = 0,
        -- the command points into these: e anchors them for the dial
        first_addr = spec.list and spec.list[1] or addr,
        -- stream_batch has no field in the command: Go reads it as a record
        opts = o.stream_batch
               and wire.put(wire.new():put(spec.opts), wire.keys.STREAM_BATCH,
                            o.stream_batch):tostring()
               or spec.opts,
        pins = o.pins and { unpack(o.pins) },
        propagate = o.propagate and { unpack(o.propagate) },
        prop = o.propagate and propagate.check(o.propagate),
        prop_deadline = o.propagate_deadline == true,
        call_timeout = (o.timeout and o.timeout > 0) and math_ceil(o.timeout)
                       or DEFAULT_TIMEOUT_MS,
        max_frame = o.max_frame_size or DEFAULT_MAX_FRAME,
    }
    e.ident = ident(e)
    local dial_ms = (o.timeout and o.timeout > 0) and o.timeout
                    or DEFAULT_TIMEOUT_MS
    any_names = any_names or e.names
    e.wait_s = dial_ms / 1000 * (o.conns or DEFAULT_CONNS) + SAFETY_SLACK_S
    e.deadline = ngx_now() + e.wait_s

    local list = conn_cache[addr]
    if not list then
        list = {}
        conn_cache[addr] = list
    end
    list[#list + 1] = e

    local cmd = set_opts(connect_cmd(e.first_addr, o, pins), e.opts)

    -- Both hosts dial through the built-in host's completion queue: its
    -- dispatcher closes the handle of a dial nobody waits for any more
    -- (a lua-resty-ffi task's answer to a killed light thread would be
    -- dropped with the handle in it, and the connection leaked).
    local id, inline_or_status, err, info = builtin.connect(cmd, e,
                                                            finish_connect)
    if not id then
        finish_connect(e, inline_or_status, err, info)
        return e
    end
    e.id = id
    if inline_or_status then
        e.inline = true
    end
    return e
end


-- Waits for entry e to leave "connecting"; returns its connection or nil,
-- err. Gives up at e.deadline: a later success is then closed.
function _M.wait(e)
    if e.state == "connecting" then
        e.nwait = e.nwait + 1
        local left = e.deadline - ngx_now()
        if e.inline then
            -- no dispatcher (worker exiting): poll like a call without one
            local pause = 0.001
            while e.state == "connecting" and ngx_now() < e.deadline do
                drain()
                if e.state ~= "connecting" then
                    break
                end
                ngx_sleep(pause)
                if pause < 0.05 then
                    pause = pause * 2
                end
            end
        elseif left > 0 then
            e.sema:wait(math_min(left, builtin.MAX_WAIT_S))
        end
        e.nwait = e.nwait - 1
    end
    if e.state == "ready" then
        touch(e)
        if e.names and not e.counted and last_max then
            -- Up: its names stand for this many servers now. A pool that
            -- came out bigger than counted makes room now (idle pools
            -- go, as for a connect) rather than stay over the cap.
            e.counted = true
            _M.make_room(0, last_max, last_stats, e)
        end
        -- closed by another thread before this one woke: an object of
        -- its own, which answers "closed" like the one let go of
        return e.conn or new_conn(e)
    end
    if e.state == "failed" then
        return nil, e.err, e.info
    end
    -- Go never answered: give up on this attempt; a late success is closed.
    e.stale = true
    e.state, e.err = "failed", "connect: timeout"
    cache_remove(e)
    if e.id then
        builtin.abandon_connect(e.id)
    end
    return nil, e.err
end


return _M
